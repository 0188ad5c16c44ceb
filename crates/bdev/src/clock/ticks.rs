//! The layer's clock: fp-sys's data-path clock ([`fp_sys::clock`]: the invariant TSC, or
//! CLOCK_MONOTONIC), two reads per request, with a fake time for the crate's tests. Its rate is
//! calibrated on the first [`tick_rate`] call, which `Disk::new` makes on the control plane.

pub use fp_sys::clock::{tick_rate, ticks_to_ns};

/// The current tick count ([`fp_sys::clock::ticks`], or this thread's fake time in the crate's
/// tests). Only differences between two calls mean anything.
#[inline]
pub fn now() -> u64 {
    #[cfg(test)]
    if let Some(t) = fake::NOW.with(|f| f.get()) {
        return t;
    }
    fp_sys::clock::ticks()
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
