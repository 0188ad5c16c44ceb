//! The layer's clock: the TSC on x86_64 when the CPU says it is invariant (`constant_tsc` and
//! `nonstop_tsc`), CLOCK_MONOTONIC in nanoseconds otherwise.
//!
//! A TSC read costs ~20 cycles and no system call; two per request is what the layer can afford
//! on a path of a few hundred nanoseconds. Its rate is calibrated once against CLOCK_MONOTONIC
//! (20 ms, on the first [`tick_rate`] call, which `Disk::new` makes on the control plane).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[cfg(target_arch = "x86_64")]
use fp_sys::rdtsc;

/// Set once calibration has chosen the TSC; read by every [`now`].
static USE_TSC: AtomicBool = AtomicBool::new(false);
static RATE: OnceLock<u64> = OnceLock::new();

/// Ticks per second (SPDK's `tick_rate` / `tsc_rate`).
pub fn tick_rate() -> u64 {
    *RATE.get_or_init(calibrate)
}

/// The current tick count. Only differences between two calls mean anything.
#[inline]
pub fn now() -> u64 {
    #[cfg(test)]
    if let Some(t) = fake::NOW.with(|f| f.get()) {
        return t;
    }
    #[cfg(target_arch = "x86_64")]
    if USE_TSC.load(Ordering::Relaxed) {
        return rdtsc();
    }
    monotonic_ns()
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

/// Ticks to nanoseconds at `rate` ticks per second.
pub fn ticks_to_ns(ticks: u64, rate: u64) -> u64 {
    (u128::from(ticks) * 1_000_000_000 / u128::from(rate.max(1))) as u64
}

/// A clock this thread's tests set by hand: the disk layer's QoS is then exact and untimed.
#[cfg(test)]
pub(crate) mod fake {
    use std::cell::Cell;

    thread_local! {
        pub(super) static NOW: Cell<Option<u64>> = const { Cell::new(None) };
    }

    /// Makes [`super::now`] return `t` on this thread (`None`: the real clock again).
    pub(crate) fn set(t: Option<u64>) {
        NOW.with(|f| f.set(t));
    }
}
