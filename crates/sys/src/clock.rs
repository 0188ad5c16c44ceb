//! The data path's clock: the TSC on x86_64 when the CPU says it is invariant (`constant_tsc`
//! and `nonstop_tsc`), CLOCK_MONOTONIC in nanoseconds otherwise. The disk layer stamps requests
//! with it and the reactors time their rounds with it.
//!
//! A TSC read costs ~20 cycles and no system call; `Instant::now` (a vDSO clock read) several
//! times that, which a round or a request of a few hundred nanoseconds notices. The rate is
//! calibrated once against CLOCK_MONOTONIC (20 ms, on the first [`tick_rate`] call, which the
//! control plane makes before any reactor or disk reads [`ticks`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[cfg(target_arch = "x86_64")]
use crate::rdtsc;

/// Set once calibration has chosen the TSC; read by every [`ticks`].
static USE_TSC: AtomicBool = AtomicBool::new(false);
static RATE: OnceLock<u64> = OnceLock::new();

/// Ticks per second (SPDK's `tick_rate` / `tsc_rate`).
pub fn tick_rate() -> u64 {
    *RATE.get_or_init(calibrate)
}

/// The current tick count. Only differences between two calls mean anything.
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if USE_TSC.load(Ordering::Relaxed) {
        return rdtsc();
    }
    monotonic_ns()
}

/// Ticks to nanoseconds at `rate` ticks per second (exact; a 128-bit division: for reports, not
/// for every round — see [`TickScale`]).
pub fn ticks_to_ns(ticks: u64, rate: u64) -> u64 {
    (u128::from(ticks) * 1_000_000_000 / u128::from(rate.max(1))) as u64
}

/// Ticks to nanoseconds with one multiplication: nanoseconds per tick in 32.32 fixed point,
/// for what converts every round (a reactor's busy and idle time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickScale {
    ns_per_tick_q32: u64,
}

impl TickScale {
    /// The scale of [`tick_rate`].
    pub fn of_clock() -> TickScale {
        TickScale::new(tick_rate())
    }

    /// The scale of `rate` ticks per second.
    pub fn new(rate: u64) -> TickScale {
        TickScale { ns_per_tick_q32: ((1_000_000_000u128 << 32) / u128::from(rate.max(1))) as u64 }
    }

    /// `ticks` in nanoseconds (rounded down; within one part in 2^32 of [`ticks_to_ns`]).
    #[inline]
    pub fn ns(self, ticks: u64) -> u64 {
        ((u128::from(ticks) * u128::from(self.ns_per_tick_q32)) >> 32) as u64
    }

    /// `d` in ticks (rounded down).
    pub fn ticks(self, d: Duration) -> u64 {
        ((d.as_nanos() << 32) / u128::from(self.ns_per_tick_q32.max(1))).min(u128::from(u64::MAX)) as u64
    }
}

/// Nanoseconds of CLOCK_MONOTONIC (which `Instant` reads on Linux) since the first call.
fn monotonic_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// True when /proc/cpuinfo lists both flags that make the TSC a clock: same rate whatever the
/// frequency (`constant_tsc`) and running in deep C-states (`nonstop_tsc`).
#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return false };
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    has("constant_tsc") && has("nonstop_tsc")
}

/// A monotonic instant and a TSC read taken together: the TSC read bracketed by two clock
/// reads, retried while the bracket is wide (the thread was preempted between them, which on a
/// loaded machine would skew the rate by the time it lost: once, a rate half the truth made
/// every duration read double).
#[cfg(target_arch = "x86_64")]
fn paired_read() -> (Instant, u64) {
    let mut best: Option<(Duration, Instant, u64)> = None;
    for _ in 0..50 {
        let before = Instant::now();
        let c = rdtsc();
        let after = Instant::now();
        let width = after.duration_since(before);
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, before + width / 2, c));
        }
        if width < Duration::from_micros(2) {
            break;
        }
    }
    let (_, t, c) = best.expect("at least one read");
    (t, c)
}

fn calibrate() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if invariant_tsc() {
        let (t0, c0) = paired_read();
        std::thread::sleep(Duration::from_millis(20));
        let (t1, c1) = paired_read();
        let elapsed = t1.duration_since(t0);
        let rate = (u128::from(c1.wrapping_sub(c0)) * 1_000_000_000 / elapsed.as_nanos().max(1)) as u64;
        // Rounded to 10 kHz: the calibration is not more precise than that.
        let rate = (rate + 5_000) / 10_000 * 10_000;
        if rate > 0 {
            USE_TSC.store(true, Ordering::Relaxed);
            return rate;
        }
    }
    1_000_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_agrees_with_the_exact_conversion() {
        for rate in [1_000_000_000, 2_593_910_000, 3_000_000_000, 1_000_000] {
            let s = TickScale::new(rate);
            for t in [0, 1, 999, 2_593_910_000, 1 << 40] {
                let exact = ticks_to_ns(t, rate);
                let fast = s.ns(t);
                assert!(exact - fast <= 1 + exact / (1 << 30), "rate {rate}, {t} ticks: {fast} vs {exact}");
            }
            let d = Duration::from_micros(200);
            let back = s.ns(s.ticks(d));
            assert!(d.as_nanos() as u64 - back <= 2, "rate {rate}: 200 µs came back as {back} ns");
        }
    }

    #[test]
    fn ticks_move_forward_at_the_rate() {
        let rate = tick_rate();
        let a = ticks();
        std::thread::sleep(Duration::from_millis(10));
        let ns = ticks_to_ns(ticks() - a, rate);
        // A lower bound only: the sleep may last longer on a loaded machine, never shorter.
        assert!(ns >= 9_000_000, "10 ms measured as {ns} ns");
    }
}
