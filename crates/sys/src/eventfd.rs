//! Event counters (`eventfd(2)`) used as wake-ups: a completion source signals one, the
//! reactor sleeping on it clears it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A new non-blocking, close-on-exec eventfd with a zero count.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes plain values and returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: eventfd just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to the eventfd's count, making it readable. A full counter (`EAGAIN` on a
/// non-blocking eventfd) is already readable, which is all a signal needs: not an error.
pub fn eventfd_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to a borrowed, open descriptor.
    let n = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    match n {
        8 => Ok(()),
        _ => match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            e => Err(e),
        },
    }
}

/// Reads and so resets the count of a non-blocking eventfd; returns it (0 if it was already
/// clear).
pub fn eventfd_clear(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a live u64 from a borrowed, open descriptor.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    match n {
        8 => Ok(count),
        _ => match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            e => Err(e),
        },
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
