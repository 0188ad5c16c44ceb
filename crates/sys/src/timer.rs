//! Periodic timers as descriptors (`timerfd(2)`), for pollers that sleep in an epoll set: the
//! timer wakes the reactor, the poller drains it without ever waiting.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::eventfd::read_count;
use crate::fs::{cvt, owned_fd};

/// A non-blocking, close-on-exec `CLOCK_MONOTONIC` timerfd, disarmed until [`Timer::every`].
#[derive(Debug)]
pub struct Timer {
    fd: OwnedFd,
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long }
}

impl Timer {
    /// A new disarmed timer.
    pub fn new() -> io::Result<Timer> {
        let flags = libc::TFD_NONBLOCK | libc::TFD_CLOEXEC;
        // SAFETY: timerfd_create takes plain values and returns a new descriptor or -1.
        let fd = unsafe { owned_fd(libc::timerfd_create(libc::CLOCK_MONOTONIC, flags)) }?;
        Ok(Timer { fd })
    }

    /// Arms the timer to expire every `period` from now (a zero period is taken as 1 ns, as
    /// zero would disarm it).
    pub fn every(&self, period: Duration) -> io::Result<()> {
        let period = period.max(Duration::from_nanos(1));
        let spec = libc::itimerspec { it_interval: timespec(period), it_value: timespec(period) };
        // SAFETY: reads a live itimerspec; the old value is not asked for (null).
        cvt(unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) }).map(drop)
    }

    /// Reads and so resets the count of expirations since the last drain; 0 when none (it
    /// never waits).
    pub fn drain(&self) -> io::Result<u64> {
        read_count(self.fd.as_fd())
    }
}

impl AsFd for Timer {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_expires_on_its_period_and_drains_without_waiting() {
        let t = Timer::new().expect("a timer");
        assert_eq!(t.drain().expect("drain a disarmed timer"), 0, "a disarmed timer never expired");
        t.every(Duration::from_millis(1)).expect("armed");
        // Generous: the first expiration is due after 1 ms.
        let woke = crate::wait_readable(&[t.as_raw_fd()], Some(Duration::from_secs(10))).expect("poll");
        assert_eq!(woke, [true]);
        assert!(t.drain().expect("drain") >= 1);
    }
}
