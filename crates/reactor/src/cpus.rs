//! CPU lists and masks as operators write them, and pinning threads to cores.

use std::io;

/// Parses a CPU list: `0`, `0,2`, `0-3`, `0-1,4`, or an SPDK-style hex mask `0x3`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        let mask = u128::from_str_radix(hex, 16).map_err(|_| format!("'{s}' is not a hex cpu mask"))?;
        let cpus: Vec<usize> = (0..128).filter(|i| mask & (1u128 << i) != 0).collect();
        if cpus.is_empty() {
            return Err("cpu mask selects no cpu".into());
        }
        return Ok(cpus);
    }
    let mut cpus = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let bad = || format!("'{part}' is not a cpu number or range (e.g. 0, 0-3, 0,2, 0x3)");
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.trim().parse().map_err(|_| bad())?;
            let b: usize = b.trim().parse().map_err(|_| bad())?;
            if a > b || b >= 1024 {
                return Err(bad());
            }
            cpus.extend(a..=b);
        } else {
            let c: usize = part.parse().map_err(|_| bad())?;
            if c >= 1024 {
                return Err(bad());
            }
            cpus.push(c);
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    if cpus.is_empty() {
        return Err("empty cpu list".into());
    }
    Ok(cpus)
}

/// The longest SPDK cpumask text accepted, in bytes: every range in a list expands to up to
/// 1024 cores before duplicates go, so the text is bounded; a list naming all 1024 cores one
/// by one still fits.
pub const MAX_CPUMASK_LEN: usize = 5000;

/// Parses SPDK's cpumask text: a hex mask (`"0x3"`), or a CPU list, bracketed as SPDK writes
/// it (`"[0,1]"`) or bare (`"0-3"`, `"0,2"`).
pub fn parse_cpumask(mask: &str) -> Result<Vec<usize>, String> {
    if mask.len() > MAX_CPUMASK_LEN {
        return Err(format!("{} characters, longer than {MAX_CPUMASK_LEN}", mask.len()));
    }
    let s = mask.trim();
    let inner = s.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(s);
    parse_cpu_list(inner)
        .map_err(|e| format!("{e}; accepted: a hex mask like \"0x3\" or a list like \"[0,1]\" or \"0-3\""))
}

/// Restricts the calling thread to `core` (below 1024, as [`parse_cpu_list`] checks); the one
/// affinity implementation is fp-sys's.
pub(crate) fn pin_to_core(core: usize) -> io::Result<()> {
    fp_sys::pin_thread(&[core])
}
