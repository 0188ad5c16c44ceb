//! Guest notification coalescing, in SPDK's model (`vhost_controller_set_coalescing`): while a
//! queue completes more than `iops_threshold` requests per second, its call-eventfd writes are
//! spaced at least `delay_base_us` apart; below the threshold every batch is signalled at once,
//! so low-rate latency does not move. A held signal goes out at the latest `delay_base_us` after
//! it became due (the queue keeps its reactor polling meanwhile), and at once when the queue
//! stops.
//!
//! One difference from SPDK, which scales the delay with the measured rate: here the delay is
//! `delay_base_us` itself whenever the rate is above the threshold, so the bound on how long a
//! completion waits is exactly the configured value.
//!
//! Cost: with coalescing off (`delay_base_us` 0) a relaxed load per batch; on, below the
//! threshold, one clock read per [`SAMPLE_EVERY`] completions; above it, one clock read per
//! poll round while a signal is held.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The rate is measured over windows of this length.
pub const RATE_WINDOW_NS: u64 = 10_000_000;
/// Below the threshold the clock is read once per this many completions.
pub const SAMPLE_EVERY: u64 = 64;
/// Defaults: off, measured (docs/benchmarks.md, "Notification coalescing": with a closed-loop
/// client a held signal idles every request in flight).
pub const DEFAULT_DELAY_BASE_US: u32 = 0;
pub const DEFAULT_IOPS_THRESHOLD: u32 = 60_000;
/// Largest accepted delay: a guest waits at most this long for a completion's interrupt.
pub const MAX_DELAY_BASE_US: u32 = 10_000;

/// A controller's settings; the control plane writes them, its queues read them per batch.
#[derive(Debug)]
pub struct CoalescingSettings {
    delay_base_us: AtomicU32,
    iops_threshold: AtomicU32,
}

impl Default for CoalescingSettings {
    fn default() -> Self {
        CoalescingSettings::new(DEFAULT_DELAY_BASE_US, DEFAULT_IOPS_THRESHOLD)
    }
}

impl CoalescingSettings {
    pub fn new(delay_base_us: u32, iops_threshold: u32) -> CoalescingSettings {
        CoalescingSettings {
            delay_base_us: AtomicU32::new(delay_base_us),
            iops_threshold: AtomicU32::new(iops_threshold),
        }
    }

    /// Applies to running queues from their next batch on.
    pub fn set(&self, delay_base_us: u32, iops_threshold: u32) {
        self.iops_threshold.store(iops_threshold, Ordering::Relaxed);
        self.delay_base_us.store(delay_base_us, Ordering::Relaxed);
    }

    /// `(delay_base_us, iops_threshold)`.
    pub fn get(&self) -> (u32, u32) {
        (self.delay_base_us.load(Ordering::Relaxed), self.iops_threshold.load(Ordering::Relaxed))
    }
}

/// Where a queue reads the time: the monotonic clock, or a value a test advances by hand.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    #[default]
    Monotonic,
    Manual(Arc<AtomicU64>),
}

impl Clock {
    pub(crate) fn now_ns(&self) -> u64 {
        match self {
            Clock::Monotonic => {
                // One process-wide origin, so values from different queues compare.
                static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
                ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
            }
            Clock::Manual(t) => t.load(Ordering::Relaxed),
        }
    }
}

/// One queue's coalescing state (lives on the queue's reactor).
pub(crate) struct Coalescer {
    settings: Arc<CoalescingSettings>,
    clock: Clock,
    window_start: u64,
    window_count: u64,
    since_sample: u64,
    /// Minimum spacing of signals now: 0 below the threshold.
    delay_ns: u64,
    next_signal_at: u64,
}

impl Coalescer {
    pub(crate) fn new(settings: Arc<CoalescingSettings>, clock: Clock) -> Coalescer {
        let now = clock.now_ns();
        Coalescer {
            settings,
            clock,
            window_start: now,
            window_count: 0,
            since_sample: 0,
            delay_ns: 0,
            next_signal_at: 0,
        }
    }

    /// A signal is due and `completions` more requests were published: whether to send it now
    /// (`false`: hold it and ask again on the next round).
    #[inline]
    pub(crate) fn ready(&mut self, completions: u64) -> bool {
        let (base_us, threshold) = self.settings.get();
        if base_us == 0 {
            self.delay_ns = 0;
            return true;
        }
        self.window_count += completions;
        self.since_sample += completions;
        if self.delay_ns == 0 && self.since_sample < SAMPLE_EVERY {
            return true;
        }
        self.since_sample = 0;
        let now = self.clock.now_ns();
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed >= RATE_WINDOW_NS {
            let rate = self.window_count.saturating_mul(1_000_000_000) / elapsed;
            self.delay_ns = if rate > u64::from(threshold) {
                u64::from(base_us.min(MAX_DELAY_BASE_US)) * 1000
            } else {
                0
            };
            self.window_start = now;
            self.window_count = 0;
        }
        if self.delay_ns == 0 || now >= self.next_signal_at {
            self.next_signal_at = now + self.delay_ns;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manual() -> (Arc<AtomicU64>, Clock) {
        let t = Arc::new(AtomicU64::new(1_000_000_000));
        (t.clone(), Clock::Manual(t))
    }

    #[test]
    fn off_or_below_the_threshold_every_batch_is_signalled() {
        let (t, clock) = manual();
        let s = Arc::new(CoalescingSettings::new(0, 1000));
        let mut c = Coalescer::new(s.clone(), clock);
        assert!((0..1000).all(|_| c.ready(32)), "off");
        s.set(50, 1_000_000);
        // 10,000 completions per 10 ms window = 1 M/s: not above the threshold.
        for _ in 0..5 {
            for _ in 0..100 {
                assert!(c.ready(100));
                t.fetch_add(RATE_WINDOW_NS / 100, Ordering::Relaxed);
            }
        }
    }

    #[test]
    fn above_the_threshold_signals_are_spaced_by_the_delay_and_never_held_longer() {
        let (t, clock) = manual();
        let s = Arc::new(CoalescingSettings::new(100, 10_000));
        let mut c = Coalescer::new(s, clock);
        // 1 M completions per second, a batch of 10 every 10 µs.
        let step = 10_000u64;
        let mut held_since: Option<u64> = None;
        let mut signals = 0;
        for _ in 0..5_000 {
            t.fetch_add(step, Ordering::Relaxed);
            let now = t.load(Ordering::Relaxed);
            if c.ready(10) {
                if let Some(since) = held_since.take() {
                    assert!(now - since <= 100_000, "held {} ns > 100 us", now - since);
                }
                signals += 1;
            } else {
                held_since.get_or_insert(now);
            }
        }
        // 50 ms: the first 10 ms window signals every batch, then one per 100 us.
        assert!((1_000 + 390..=1_000 + 410).contains(&signals), "{signals} signals");
        // The rate drops: within two windows (the one running may still mix in the burst),
        // coalescing ends.
        for _ in 0..2 {
            t.fetch_add(RATE_WINDOW_NS, Ordering::Relaxed);
            c.ready(1);
        }
        t.fetch_add(step, Ordering::Relaxed);
        assert!(c.ready(1), "below the threshold again: at once");
    }
}
