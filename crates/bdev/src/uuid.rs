//! Identities of what the stacked modules keep on disk (an lvstore and its volumes, a raid and
//! its members).

/// An identity as 16 raw bytes (RFC 4122 layout; the caller makes them, so the formats stay
/// deterministic for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// All zeroes: no identity.
    pub const NIL: Uuid = Uuid([0; 16]);

    /// Whether it is [`Uuid::NIL`].
    pub fn is_nil(&self) -> bool {
        *self == Uuid::NIL
    }

    /// Parses RFC 4122 text (8-4-4-4-12 hexadecimal digits, either case).
    pub fn parse(s: &str) -> Option<Uuid> {
        let b = s.as_bytes();
        if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
            return None;
        }
        let hex: Vec<u8> = b.iter().copied().filter(|&c| c != b'-').collect();
        if hex.len() != 32 || !hex.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).ok()?;
            out[i] = u8::from_str_radix(text, 16).ok()?;
        }
        Some(Uuid(out))
    }
}

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_display_is_rfc4122_text() {
        let u = Uuid([0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(u.to_string(), "12345678-9abc-def0-0102-030405060708");
        assert_eq!(Uuid::parse("12345678-9ABC-def0-0102-030405060708"), Some(u));
        for bad in [
            "",
            "12345678-9abc-def0-0102-03040506070",
            "12345678-9abc-def0-0102+030405060708",
            "1234567g-9abc-def0-0102-030405060708",
            "+2345678-9abc-def0-0102-030405060708",
        ] {
            assert_eq!(Uuid::parse(bad), None, "{bad}");
        }
    }
}
