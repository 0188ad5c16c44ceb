//! Socket options and shutdown on descriptors `std`'s socket types do not own.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Shuts down both directions of the socket `fd`: a thread blocked reading or writing any
/// duplicate of it returns at once.
pub fn shutdown(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a plain call on a borrowed, open descriptor.
    if unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks for a send buffer of `bytes` on the socket `fd` (`SO_SNDBUF`; the kernel doubles it for
/// its bookkeeping and caps it at `net.core.wmem_max`).
pub fn set_send_buffer(fd: BorrowedFd<'_>, bytes: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid option value of the size given, on a borrowed, open descriptor.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn shutdown_ends_the_peer_and_a_duplicate() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut dup = a.try_clone().unwrap();
        shutdown(a.as_fd()).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(b.read(&mut buf).unwrap(), 0);
        assert_eq!(dup.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn send_buffer_grows() {
        let (a, _b) = UnixStream::pair().unwrap();
        set_send_buffer(a.as_fd(), 1 << 20).unwrap();
        let e = set_send_buffer(std::io::stdin().as_fd(), 1 << 20);
        // stdin is not a socket in most test runs; when it is, the call simply works.
        if let Err(e) = e {
            assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK));
        }
    }
}
