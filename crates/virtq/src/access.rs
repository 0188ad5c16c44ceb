//! Loads from guest memory, which the guest may write at any time.
//!
//! Every load here is a single machine access that the compiler cannot repeat or split
//! differently (so a value checked once is the value used: no double fetch). Aligned loads use
//! `read_volatile`; unaligned 8-byte loads (request headers packed at odd offsets, as libblkio
//! lays them out) use one `mov` on x86-64, and bytewise volatile loads elsewhere and under Miri.

/// Loads a little-endian u64 from `p`, whatever its alignment.
///
/// # Safety
/// `p .. p + 8` must be mapped for reading.
#[inline(always)]
pub unsafe fn load_u64_le(p: *const u8) -> u64 {
    // On x86-64 one `mov` serves every alignment (an aligned one is the access `read_volatile`
    // would make): no test of the address, which cost 2 instructions per load, 14 per request
    // on the split ring's fast path under callgrind.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let v: u64;
        // SAFETY: x86-64 allows unaligned 8-byte loads; the 8 bytes are mapped (caller). The
        // asm block only reads that memory and touches no flags or stack.
        unsafe {
            std::arch::asm!("mov {v}, qword ptr [{p}]", p = in(reg) p, v = out(reg) v,
                options(nostack, preserves_flags, readonly));
        }
        u64::from_le(v)
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        if (p as usize) & 7 == 0 {
            // SAFETY: 8-aligned and mapped (caller).
            return u64::from_le(unsafe { std::ptr::read_volatile(p.cast::<u64>()) });
        }
        let mut b = [0u8; 8];
        for (i, byte) in b.iter_mut().enumerate() {
            // SAFETY: inside the 8 mapped bytes (caller).
            *byte = unsafe { std::ptr::read_volatile(p.add(i)) };
        }
        u64::from_le_bytes(b)
    }
}
