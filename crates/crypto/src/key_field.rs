//! The key field both NVMe key representations end with, DH-HMAC-CHAP's `DHHC-1:xx:` and
//! NVMe/TCP's PSK interchange format `NVMeTLSkey-1:hh:`: the base64 of the key followed by its
//! CRC-32 (little-endian), then ':'.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use zeroize::Zeroizing;

/// Why a key field does not decode. No variant quotes the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyFieldError {
    /// The base64 does not end with ':'.
    Terminator,
    /// The base64 does not decode.
    Base64(String),
    /// The key (what precedes the CRC) is not of an allowed length.
    KeyLength(usize),
    /// The CRC-32 after the key does not match it.
    Crc { stored: u32, computed: u32 },
}

/// The key of `field` (everything after the hash field's ':'; whitespace after the final ':',
/// a key file's newline, is allowed), if it is one of `lens` bytes and its CRC matches.
pub(crate) fn decode(field: &str, lens: &[usize]) -> Result<Zeroizing<Vec<u8>>, KeyFieldError> {
    let encoded = field.trim_end().strip_suffix(':').ok_or(KeyFieldError::Terminator)?;
    let mut decoded =
        Zeroizing::new(STANDARD.decode(encoded).map_err(|e| KeyFieldError::Base64(e.to_string()))?);
    let key_len = decoded.len().saturating_sub(4);
    if decoded.len() < 4 || !lens.contains(&key_len) {
        return Err(KeyFieldError::KeyLength(key_len));
    }
    let stored = u32::from_le_bytes(decoded[key_len..].try_into().expect("four bytes"));
    let computed = crc32fast::hash(&decoded[..key_len]);
    if stored != computed {
        return Err(KeyFieldError::Crc { stored, computed });
    }
    decoded.truncate(key_len);
    Ok(decoded)
}

/// The field of `key`: `<base64(key || CRC-32 little-endian)>:`.
pub(crate) fn encode(key: &[u8]) -> Zeroizing<String> {
    let mut raw = Zeroizing::new(Vec::with_capacity(key.len() + 4));
    raw.extend_from_slice(key);
    raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
    Zeroizing::new(format!("{}:", STANDARD.encode(&raw[..])))
}
