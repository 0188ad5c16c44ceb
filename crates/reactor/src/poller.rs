//! What a reactor runs: the [`Poller`] trait, and what a poller reports (busy, idle, finished).

use std::any::Any;
use std::os::unix::io::RawFd;
use std::time::Duration;

/// What a poller did in one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollStatus {
    /// It did some work (moved a request, reaped a completion, ...).
    Busy,
    /// It found nothing to do.
    Idle,
    /// It is done for good: the reactor drops it.
    Finished,
}

/// A unit of work a reactor calls every round.
///
/// Pollers are core-local: they are built elsewhere from `Send` parts and constructed on their
/// reactor by a message, so they need not be `Send` themselves.
pub trait Poller: Any {
    /// Does whatever work is ready, without blocking.
    fn poll(&mut self) -> PollStatus;

    /// Work outstanding that will complete without a wake-up (I/O in flight on a polled backend):
    /// the reactor never sleeps while a poller says so.
    fn has_pending(&self) -> bool {
        false
    }

    /// Requests this poller handed to a backend that has not given them back yet, when the
    /// poller owns memory the backend may still write (a guest's buffers): at shutdown the
    /// reactor keeps polling, within its shutdown bound, until none is left before it drops its
    /// pollers ([`crate::ReactorSet::shutdown_within`]).
    fn held_by_backend(&self) -> usize {
        0
    }

    /// Re-arms notifications before the reactor sleeps. Returns `false` when work turned up while
    /// re-arming, in which case the reactor does not sleep.
    fn prepare_sleep(&mut self) -> bool {
        true
    }

    /// Called after the reactor wakes (or gives up on sleeping): drain wake-up fds, turn
    /// notifications off again.
    fn after_wake(&mut self) {}

    /// File descriptors whose readability should wake the reactor while it sleeps. Asked once,
    /// when the poller is added.
    fn wake_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    /// Whether the reactor may park this poller after [`crate::PARK_AFTER_IDLE_POLLS`] polls in a
    /// row without work: it re-arms the poller's notifications ([`Poller::prepare_sleep`]) and
    /// stops polling it until one of its [`Poller::wake_fds`] fires (checked every few rounds, see
    /// docs/architecture.md, "Many queues on one reactor"), or until
    /// [`crate::Reactor::poller_mut`] reaches it. That is the promise sleeping relies on, made per
    /// poller: once `prepare_sleep` returned `true` and nothing is pending, every piece of new
    /// work arrives through those fds or a message that reaches the poller through `poller_mut`.
    /// A poller without wake fds is never parked.
    fn parks_when_idle(&self) -> bool {
        false
    }

    /// How long this poller wants the reactor to keep polling after the last work before it
    /// sleeps; `None` for the reactor's configured window. A poller whose work comes back from
    /// far away (a Ceph cluster answers in milliseconds, through an fd) asks for less: spinning
    /// through such waits would burn a core per disk for nothing. The reactor keeps the longest
    /// window any of its pollers wants, never longer than its configured one.
    fn idle_window(&self) -> Option<Duration> {
        None
    }
}

/// Identifies a poller on its reactor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PollerId(pub(crate) u64);
