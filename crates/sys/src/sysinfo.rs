//! What the kernel says about the machine: `sysinfo(2)`.

use std::io;

/// Total RAM as `sysinfo(2)` reports it, in bytes (the host's, also inside a memory-limited
/// cgroup).
pub fn total_ram() -> io::Result<u64> {
    // SAFETY: sysinfo is plain data; all zeroes is a valid value for it to overwrite.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable sysinfo struct that outlives the call.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // c_ulong: 32 bits on some targets, hence the widening cast.
    #[allow(clippy::useless_conversion)]
    let total = u64::from(info.totalram);
    total
        .checked_mul(u64::from(info.mem_unit.max(1)))
        .ok_or_else(|| io::Error::other("total RAM overflows u64"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_ram_is_plausible() {
        let ram = total_ram().unwrap();
        assert!(ram >= 64 << 20, "{ram} bytes");
    }
}
