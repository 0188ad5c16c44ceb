//! Time for the disk layer and QoS, below both: [`ticks`] is the tick counter itself (the TSC
//! where invariant), [`Clock`] what QoS reads it through, with a [`FakeClock`] that tests advance
//! by hand, so every token and slice computation is checked exactly, with no sleeps.
//!
//! The hot path never calls a clock itself: the disk layer already reads the time once per
//! submit (for its latency statistics) and passes that tick to the limiters. A [`Clock`] is what
//! the layer (and the tests) read it from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub mod ticks;

/// A source of ticks at a fixed rate.
pub trait Clock: Send + Sync {
    /// The current tick. Only differences between two calls mean anything.
    fn now(&self) -> u64;
    /// Ticks per second.
    fn rate(&self) -> u64;
}

/// The disk layer's clock ([`ticks`]: the invariant TSC, or CLOCK_MONOTONIC).
#[derive(Debug, Clone, Copy, Default)]
pub struct TickClock;

impl Clock for TickClock {
    #[inline]
    fn now(&self) -> u64 {
        ticks::now()
    }

    fn rate(&self) -> u64 {
        ticks::tick_rate()
    }
}

/// A clock that moves only when told to. Clones share the same time, so a test hands one to
/// every channel and advances them all at once.
#[derive(Debug, Clone)]
pub struct FakeClock {
    now: Arc<AtomicU64>,
    rate: u64,
}

impl FakeClock {
    /// A clock at tick `start` counting `rate` ticks per second.
    pub fn new(start: u64, rate: u64) -> FakeClock {
        FakeClock { now: Arc::new(AtomicU64::new(start)), rate: rate.max(1) }
    }

    /// A nanosecond clock (1 GHz) at tick `start`.
    pub fn ns(start: u64) -> FakeClock {
        FakeClock::new(start, 1_000_000_000)
    }

    /// Moves the clock `ticks` forward.
    pub fn advance(&self, ticks: u64) {
        self.now.fetch_add(ticks, Ordering::Relaxed);
    }

    /// Sets the clock to `tick` (never backwards: the limiters assume time does not go back).
    pub fn set(&self, tick: u64) {
        self.now.fetch_max(tick, Ordering::Relaxed);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    fn rate(&self) -> u64 {
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_moves_only_when_advanced_and_clones_share_it() {
        let c = FakeClock::ns(1_000);
        let d = c.clone();
        assert_eq!((c.now(), c.rate()), (1_000, 1_000_000_000));
        c.advance(250);
        assert_eq!(d.now(), 1_250);
        d.set(2_000);
        assert_eq!(c.now(), 2_000);
        // Never backwards.
        c.set(10);
        assert_eq!(c.now(), 2_000);
    }

    #[test]
    fn tick_clock_is_the_disk_layers_clock() {
        let c = TickClock;
        assert_eq!(c.rate(), ticks::tick_rate());
        let (a, b) = (c.now(), c.now());
        assert!(b >= a);
    }
}
