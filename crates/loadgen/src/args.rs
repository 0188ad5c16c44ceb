//! The command line's value parsers: sizes and durations.

use std::time::Duration;

/// Parses a byte size such as `4096`, `4k`, `4K`, `1m`, `2G`, `4KiB` (binary multiples).
///
/// The daemon's command line has its own (`flashpath`'s `size` module): the two crates share
/// only fp-sys and fp-virtq, neither a home for command-line parsing, and the daemon may not
/// depend on this crate.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1u64 << 10),
        Some('m') => (&body[..body.len() - 1], 1 << 20),
        Some('g') => (&body[..body.len() - 1], 1 << 30),
        Some('t') => (&body[..body.len() - 1], 1 << 40),
        _ => (body, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("'{s}' is not a size like 4096, 4k or 1M"))?;
    n.checked_mul(mult).ok_or_else(|| format!("'{s}' is too large"))
}

/// Parses a duration such as `5`, `5s`, `500ms`, `2m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let err = || format!("'{s}' is not a duration like 5, 5s, 500ms or 2m");
    let (num, unit_ms) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        (t, 1000.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v < 0.0 {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(v * unit_ms / 1000.0))
}
