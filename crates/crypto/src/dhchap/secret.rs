//! The DH-HMAC-CHAP secret representation (Base 8.13.5.8): `DHHC-1:xx:<base64(key ||
//! CRC-32(key))>:`, as nvme-cli's `gen-dhchap-key` writes it and Linux's
//! `nvme_auth_extract_key` and SPDK's `nvme_auth_get_key` read it, and the key transform
//! applied before use.

use fp_nvme_spec::auth::HashId;
use zeroize::Zeroizing;

use super::hmac;
use crate::key_field::{self, KeyFieldError};

/// The representation's prefix and version.
const PREFIX: &str = "DHHC-1:";
/// What the transform appends to the NQN (Base 8.13.5.8).
const TRANSFORM_SUFFIX: &[u8] = b"NVMe-over-Fabrics";
/// The key lengths the representation allows.
pub const KEY_LENS: [usize; 3] = [32, 48, 64];

/// Why a string is not a DH-HMAC-CHAP secret. No variant quotes the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The string does not start with `DHHC-1:`.
    #[error("a DH-HMAC-CHAP secret starts with \"DHHC-1:\"")]
    Prefix,
    /// The transform field is not 00, 01, 02 or 03.
    #[error("transform {0:?} after \"DHHC-1:\" is not 00 (none), 01, 02 or 03 followed by ':'")]
    Transform(String),
    /// The key's base64 does not end with ':'.
    #[error("the key's base64 does not end with ':'")]
    Terminator,
    /// The key's base64 does not decode.
    #[error("the key is not base64: {0}")]
    Base64(String),
    /// The decoded key is not 32, 48 or 64 bytes (plus 4 of CRC).
    #[error("key of {0} bytes: a DH-HMAC-CHAP key is 32, 48 or 64 bytes")]
    KeyLength(usize),
    /// The CRC-32 after the key does not match it.
    #[error("the key's CRC-32 does not match (stored {stored:#010x}, computed {computed:#010x})")]
    Crc {
        /// The CRC the representation carries.
        stored: u32,
        /// The key's.
        computed: u32,
    },
}

impl From<KeyFieldError> for SecretError {
    fn from(e: KeyFieldError) -> SecretError {
        match e {
            KeyFieldError::Terminator => SecretError::Terminator,
            KeyFieldError::Base64(m) => SecretError::Base64(m),
            KeyFieldError::KeyLength(n) => SecretError::KeyLength(n),
            KeyFieldError::Crc { stored, computed } => SecretError::Crc { stored, computed },
        }
    }
}

/// A DH-HMAC-CHAP secret: the key and the hash of its transform. The key is cleared on drop
/// and never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapSecret {
    transform: Option<HashId>,
    key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhchapSecret")
            .field("transform", &self.transform)
            .field("key_len", &self.key.len())
            .finish_non_exhaustive()
    }
}

impl DhchapSecret {
    /// A secret of `key` (32, 48 or 64 bytes), transformed with `transform` before use
    /// (`None`: used as it is, "00").
    pub fn new(transform: Option<HashId>, key: &[u8]) -> Result<DhchapSecret, SecretError> {
        if !KEY_LENS.contains(&key.len()) {
            return Err(SecretError::KeyLength(key.len()));
        }
        Ok(DhchapSecret { transform, key: Zeroizing::new(key.to_vec()) })
    }

    /// Reads the representation; whitespace after the final ':' (a key file's newline) is
    /// allowed. Like Linux's host, any transform goes with any key length.
    pub fn parse(text: &str) -> Result<DhchapSecret, SecretError> {
        let rest = text.strip_prefix(PREFIX).ok_or(SecretError::Prefix)?;
        let transform = match rest.get(..3) {
            Some("00:") => None,
            Some("01:") => Some(HashId::Sha256),
            Some("02:") => Some(HashId::Sha384),
            Some("03:") => Some(HashId::Sha512),
            _ => return Err(SecretError::Transform(rest.chars().take(3).collect())),
        };
        let key = key_field::decode(&rest[3..], &KEY_LENS)?;
        DhchapSecret::new(transform, &key)
    }

    /// The representation: `DHHC-1:xx:<base64(key || CRC-32 little-endian)>:`.
    pub fn to_representation(&self) -> Zeroizing<String> {
        let xx = self.transform.map_or(0, |h| h as u8);
        Zeroizing::new(format!("{PREFIX}{xx:02}:{}", *key_field::encode(&self.key)))
    }

    /// The hash of the transform (`None`: "00", none).
    pub fn transform(&self) -> Option<HashId> {
        self.transform
    }

    /// Bytes of the key.
    pub fn key_len(&self) -> usize {
        self.key.len()
    }

    /// The key the responses use (Base 8.13.5.8): `HMAC_xx(key, nqn || "NVMe-over-Fabrics")`
    /// with the host's NQN for the host's key and the subsystem's for the controller's; the
    /// key itself with transform 00.
    pub fn transformed(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(hash) => Zeroizing::new(hmac(hash, &self.key, &[nqn.as_bytes(), TRANSFORM_SUFFIX])),
        }
    }
}
