//! The counters a reactor publishes for the control plane, and the clock they are stamped with.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Counters a reactor publishes for the control plane (single writer, relaxed atomics).
#[derive(Debug, Default)]
pub struct ReactorStats {
    /// Nanoseconds spent in rounds where some poller did work.
    pub busy_ns: AtomicU64,
    /// Nanoseconds spent polling without finding work.
    pub idle_ns: AtomicU64,
    /// Nanoseconds spent asleep in epoll.
    pub sleep_ns: AtomicU64,
    /// Rounds run.
    pub rounds: AtomicU64,
    /// Times the reactor went to sleep.
    pub sleeps: AtomicU64,
    /// Messages processed.
    pub messages: AtomicU64,
    /// Pollers currently registered.
    pub pollers: AtomicU64,
    /// Pollers parked now (idle, polled only once their fds fire).
    pub parked: AtomicU64,
    /// Times a poller was parked.
    pub parks: AtomicU64,
    /// True while asleep.
    pub sleeping: AtomicBool,
    /// When the current sleep began ([`mono_ns`]), or 0 while awake; lets a snapshot count a
    /// sleep that is still going on.
    pub sleep_since_ns: AtomicU64,
}

/// Adds `by` to a counter only its reactor writes: a load and a store. A `fetch_add` is a locked
/// read-modify-write, a full barrier on x86-64 that waits for the round's stores to drain; a
/// round took three of them. Readers on other threads still see each counter only grow.
#[inline(always)]
pub(crate) fn add_own(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
}

/// Nanoseconds on a process-wide monotonic clock (for timestamps shared between threads).
pub fn mono_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    // Never 0, so 0 can mean "no timestamp".
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

impl ReactorStats {
    /// Reads every counter once; a sleep still going on counts up to now.
    pub fn snapshot(&self) -> ReactorStatsSnapshot {
        ReactorStatsSnapshot {
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            idle_ns: self.idle_ns.load(Ordering::Relaxed),
            sleep_ns: self.sleep_ns.load(Ordering::Relaxed) + {
                // A sleep in progress counts up to now; it is added for good when it ends.
                let since = self.sleep_since_ns.load(Ordering::Relaxed);
                if since == 0 {
                    0
                } else {
                    mono_ns().saturating_sub(since)
                }
            },
            rounds: self.rounds.load(Ordering::Relaxed),
            sleeps: self.sleeps.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
            pollers: self.pollers.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            parks: self.parks.load(Ordering::Relaxed),
            sleeping: self.sleeping.load(Ordering::Relaxed),
        }
    }
}

/// A plain copy of [`ReactorStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReactorStatsSnapshot {
    /// See [`ReactorStats::busy_ns`].
    pub busy_ns: u64,
    /// See [`ReactorStats::idle_ns`].
    pub idle_ns: u64,
    /// See [`ReactorStats::sleep_ns`], including a sleep still going on.
    pub sleep_ns: u64,
    /// See [`ReactorStats::rounds`].
    pub rounds: u64,
    /// See [`ReactorStats::sleeps`].
    pub sleeps: u64,
    /// See [`ReactorStats::messages`].
    pub messages: u64,
    /// See [`ReactorStats::pollers`].
    pub pollers: u64,
    /// See [`ReactorStats::parked`].
    pub parked: u64,
    /// See [`ReactorStats::parks`].
    pub parks: u64,
    /// See [`ReactorStats::sleeping`].
    pub sleeping: bool,
}
