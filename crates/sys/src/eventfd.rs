//! Event counters (`eventfd(2)`) used as wake-ups: a completion source signals one, the
//! reactor sleeping on it clears it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::fs::{cvt, owned_fd};

/// A new non-blocking, close-on-exec eventfd with a zero count.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes plain values and returns a new descriptor or -1.
    unsafe { owned_fd(libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)) }
}

/// Adds one to the eventfd's count, making it readable. A full counter (`EAGAIN` on a
/// non-blocking eventfd) is already readable, which is all a signal needs: not an error.
pub fn eventfd_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to a borrowed, open descriptor.
    match cvt(unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) }) {
        Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
        _ => Ok(()),
    }
}

/// Reads and so resets the count of a non-blocking eventfd; returns it (0 if it was already
/// clear).
pub fn eventfd_clear(fd: BorrowedFd<'_>) -> io::Result<u64> {
    read_count(fd)
}

/// Reads the 8-byte count of an eventfd or timerfd (which resets it); 0 when there is none
/// (`EAGAIN`: the descriptor is non-blocking).
pub(crate) fn read_count(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut count = 0u64;
    // SAFETY: reads at most 8 bytes into a live u64 from a borrowed, open descriptor.
    match cvt(unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) }) {
        Ok(_) => Ok(count),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};
    use std::time::Duration;

    use super::*;

    #[test]
    fn signal_makes_it_readable_and_clear_resets_it() {
        let fd = eventfd().unwrap();
        let readable = || crate::wait_readable(&[fd.as_raw_fd()], Some(Duration::ZERO)).unwrap()[0];
        assert!(!readable());
        assert_eq!(eventfd_clear(fd.as_fd()).unwrap(), 0);
        eventfd_signal(fd.as_fd()).unwrap();
        eventfd_signal(fd.as_fd()).unwrap();
        assert!(readable());
        assert_eq!(eventfd_clear(fd.as_fd()).unwrap(), 2);
        assert!(!readable());
    }
}
