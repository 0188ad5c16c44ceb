//! Waiting for readable descriptors with `poll(2)`: the accept loops of the RPC server and the
//! NBD listeners, and synchronous waits on a completion eventfd.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Waits until one of `fds` is readable (or hung up, or in error), or `timeout` passes (never,
/// with `None`). Returns which of `fds` are ready, in their order: none of them after a timeout.
///
/// A signal that interrupts the wait restarts it (with the full timeout). A descriptor that is
/// not open is reported ready (`POLLNVAL`) rather than failing the call.
pub fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // Rounded up, so a short timeout still sleeps rather than spinning.
    let ms = timeout.map_or(-1, |t| t.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int);
    loop {
        // SAFETY: `pfds` is a valid, writable array of `pfds.len()` pollfd structs that lives
        // across the call.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if rc >= 0 {
            return Ok(pfds.iter().map(|p| p.revents != 0).collect());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn poll_sees_which_socket_is_readable() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (c, d) = UnixStream::pair().unwrap();
        let fds = [b.as_raw_fd(), c.as_raw_fd()];
        assert_eq!(wait_readable(&fds, Some(Duration::ZERO)).unwrap(), [false, false]);
        assert_eq!(wait_readable(&fds, Some(Duration::from_millis(1))).unwrap(), [false, false]);
        a.write_all(b"x").unwrap();
        assert_eq!(wait_readable(&fds, None).unwrap(), [true, false]);
        drop(d);
        assert_eq!(wait_readable(&fds, None).unwrap(), [true, true], "a hang-up counts as readable");
    }
}
