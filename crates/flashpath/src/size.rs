//! Human byte sizes for the CLI: `4096`, `512K`, `64MiB`, `1G`, `2TB`.
//!
//! Every suffix is a power of 1024, whether written `K`, `KB` or `KiB`: disk sizes are block
//! multiples, and a "1GB" RAM disk that is not a whole number of 4 KiB blocks would only be an
//! error waiting to happen.

/// The message tail every size error carries, so the user sees what is accepted.
const EXAMPLES: &str = "examples: 512MiB, 1G, 4096";

/// Parses a size in bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("'{text}' is not a size ({EXAMPLES})");
    let s = text.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits_end);
    if num.is_empty() {
        return Err(bad());
    }
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    let n: u64 = num.parse().map_err(|_| format!("'{text}' is too large"))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("'{text}' is too large"))
}

/// Formats a byte count with the largest binary unit that keeps it readable ("1 GiB",
/// "1.5 MiB", "512 B").
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let value = bytes as f64 / (1u64 << (10 * unit)) as f64;
    if bytes % (1u64 << (10 * unit)) == 0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("1kb"), Ok(1024));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GB"), Ok(1 << 30));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size(" 8M "), Ok(8 << 20));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_size("12XB").unwrap_err(), "'12XB' is not a size (examples: 512MiB, 1G, 4096)");
        for s in ["", "G", "1.5G", "-1", "1 G", "1GiBs", "0x10"] {
            assert!(parse_size(s).is_err(), "{s}");
        }
        assert!(parse_size("20000000T").unwrap_err().contains("too large"));
        assert!(parse_size("99999999999999999999").unwrap_err().contains("too large"));
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(3 << 19), "1.5 MiB");
        assert_eq!(format_size(4 << 40), "4 TiB");
        assert_eq!(format_size(0), "0 B");
    }
}
