//! The keys of an encrypted backup, all derived from one keyring key with HKDF-SHA-256, so that
//! one secret serves three jobs without reusing a key for two of them.

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::error::{invalid, Result};

/// The shortest key material accepted: 128 bits.
pub const MIN_KEY_BYTES: usize = 16;

/// An encryption key for backups: the keyring key's name (recorded in manifests) and the keys
/// derived from its material. Never printed: `Debug` shows the name only.
pub struct BackupKey {
    name: String,
    /// HMAC-SHA-256 key naming chunks (so the store does not learn plaintext hashes).
    id_key: Zeroizing<[u8; 32]>,
    /// AES-256-GCM key of chunk payloads.
    aead_key: Zeroizing<[u8; 32]>,
    /// HMAC-SHA-256 key authenticating manifests.
    manifest_key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for BackupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupKey").field("name", &self.name).finish_non_exhaustive()
    }
}

impl BackupKey {
    /// Derives the backup keys from `material` (a keyring key's bytes, at least 16) named `name`
    /// (the keyring name recorded in manifests; 1 to 255 bytes).
    pub fn new(name: &str, material: &[u8]) -> Result<BackupKey> {
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(invalid("key name", "1 to 255 bytes, no control characters"));
        }
        if material.len() < MIN_KEY_BYTES {
            return Err(invalid("key", format!("at least {MIN_KEY_BYTES} bytes of key material")));
        }
        let hk = Hkdf::<Sha256>::new(Some(b"flashpath backup"), material);
        let derive = |info: &[u8]| {
            let mut out = Zeroizing::new([0u8; 32]);
            // 32 bytes is far below HKDF-SHA-256's limit of 255 * 32.
            hk.expand(info, out.as_mut()).expect("32 bytes is a valid HKDF output length");
            out
        };
        Ok(BackupKey {
            name: name.to_string(),
            id_key: derive(b"v1 chunk id"),
            aead_key: derive(b"v1 chunk aead"),
            manifest_key: derive(b"v1 manifest mac"),
        })
    }

    /// The keyring key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn aead_key(&self) -> &[u8; 32] {
        &self.aead_key
    }

    pub(crate) fn id_mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(self.id_key.as_ref()).expect("HMAC takes any key length")
    }

    pub(crate) fn manifest_mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(self.manifest_key.as_ref()).expect("HMAC takes any key length")
    }
}
