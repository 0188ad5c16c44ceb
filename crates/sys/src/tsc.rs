//! The CPU's time-stamp counter: the disk layer's clock where the TSC is invariant.

/// The time-stamp counter (RDTSC): about 20 cycles, no system call. Only differences between
/// two reads on a CPU whose TSC is invariant (`constant_tsc`, `nonstop_tsc`) measure time.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86_64; it only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    #[test]
    fn the_counter_moves_forward() {
        let a = super::rdtsc();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(super::rdtsc() > a);
    }
}
