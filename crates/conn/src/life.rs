//! A connection's way to its end, and the readiness its poller sleeps on.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// Where a connection is in its life: serving; closing (no new requests: it answers those it
/// has, then ends), with a bound for requests its device keeps refusing as busy; broken (the
/// socket failed: nothing more is sent); and whether the peer misbehaved (then its end is
/// logged as a warning).
#[derive(Debug, Default)]
pub struct Life {
    closing: Option<String>,
    deadline: Option<Instant>,
    broken: bool,
    misbehaved: bool,
}

impl Life {
    /// A connection serving.
    pub fn new() -> Life {
        Life::default()
    }

    /// Whether it is closing (or broken).
    #[inline]
    pub fn is_closing(&self) -> bool {
        self.closing.is_some()
    }

    /// Starts closing for `why`, with requests refused as busy retried for `bound`; the first
    /// reason (and bound) stays. True the first time.
    pub fn close(&mut self, why: impl Into<String>, bound: Duration) -> bool {
        if self.closing.is_some() {
            return false;
        }
        self.closing = Some(why.into());
        self.deadline = Some(Instant::now() + bound);
        true
    }

    /// Whether the socket failed.
    #[inline]
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// The socket failed (call [`Life::close`] too).
    pub fn set_broken(&mut self) {
        self.broken = true;
    }

    /// Whether the peer broke the protocol.
    #[inline]
    pub fn misbehaved(&self) -> bool {
        self.misbehaved
    }

    /// Sets whether the peer broke the protocol.
    pub fn set_misbehaved(&mut self, yes: bool) {
        self.misbehaved = yes;
    }

    /// When a closing connection stops retrying requests refused as busy.
    #[inline]
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Brings the deadline forward to `at` (never later than it is).
    pub fn limit_deadline(&mut self, at: Instant) {
        self.deadline = Some(self.deadline.map_or(at, |d| d.min(at)));
    }

    /// Whether it is closing and its deadline passed at `now`.
    #[inline]
    pub fn past_deadline(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// The connection ends: logs `what` (the connection, named) with the reason it closed,
    /// as a warning when it broke or the peer misbehaved.
    pub fn end(&mut self, what: &str) {
        let why = self.closing.take().unwrap_or_default();
        if self.broken || self.misbehaved {
            log::warn!("{what}: {why}; connection closed");
        } else {
            log::info!("{what}: {why}; connection closed");
        }
    }
}

/// A connection's socket in a private epoll set, which its reactor watches: the set's
/// interest follows what the connection waits for (requests, or room to send). Other
/// descriptors (timers, completion fds) may join the set.
pub struct Interest {
    epoll: Epoll,
    fd: RawFd,
    now: EventSet,
}

impl Interest {
    /// `fd` in a new set, waiting to read (token 0).
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<Interest> {
        let epoll = Epoll::new()?;
        epoll.ctl(ControlOperation::Add, fd.as_raw_fd(), EpollEvent::new(EventSet::IN, 0))?;
        Ok(Interest { epoll, fd: fd.as_raw_fd(), now: EventSet::IN })
    }

    /// Waits for `want` on the socket from now.
    #[inline]
    pub fn set(&mut self, want: EventSet) {
        if want != self.now {
            let ev = EpollEvent::new(want, 0);
            if self.epoll.ctl(ControlOperation::Modify, self.fd, ev).is_ok() {
                self.now = want;
            }
        }
    }

    /// The set, for the reactor to watch and other descriptors to join.
    pub fn epoll(&self) -> &Epoll {
        &self.epoll
    }
}

impl AsRawFd for Interest {
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}
