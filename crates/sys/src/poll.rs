//! Waiting for descriptors with `poll(2)`: the accept loops of the RPC server, the NBD listeners
//! and the vhost-user controllers, and synchronous waits on a completion eventfd.

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
    loop {
        match poll(&mut pfds, timeout) {
            Ok(_) => return Ok(pfds.iter().map(|p| p.revents != 0).collect()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// One `poll(2)` call on `fds` (each with its `events`; the kernel fills in `revents`), waiting
/// at most `timeout` (never, with `None`; rounded up to a millisecond, so a short timeout still
/// sleeps rather than spinning). Returns how many have events. A signal ends the wait with an
/// `Interrupted` error, so a caller with a deadline can work out what is left of it.
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = timeout.map_or(-1, |t| t.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int);
    // SAFETY: `fds` is a valid, writable array of `fds.len()` pollfd structs that lives across
    // the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
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

    #[test]
    fn poll_reports_the_events_asked_for() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut pfds = [
            libc::pollfd { fd: b.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: a.as_raw_fd(), events: libc::POLLOUT, revents: 0 },
        ];
        assert_eq!(poll(&mut pfds, Some(Duration::ZERO)).unwrap(), 1);
        assert_eq!((pfds[0].revents, pfds[1].revents), (0, libc::POLLOUT));
        a.write_all(b"x").unwrap();
        assert_eq!(poll(&mut pfds[..1], Some(Duration::from_millis(1))).unwrap(), 1);
        assert_eq!(pfds[0].revents, libc::POLLIN);
    }
}
