//! Content addresses of chunks.

use std::fmt;

use hmac::Mac;
use sha2::{Digest, Sha256};

use crate::key::BackupKey;

/// A chunk's content address: SHA-256 of its plaintext, or for an encrypted backup
/// HMAC-SHA-256 of it under a key derived from the backup key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

impl ChunkId {
    /// The id of `plain` (keyed when `key` is given).
    pub fn of(plain: &[u8], key: Option<&BackupKey>) -> ChunkId {
        match key {
            None => ChunkId(Sha256::digest(plain).into()),
            Some(key) => {
                let mut mac = key.id_mac();
                mac.update(plain);
                ChunkId(mac.finalize().into_bytes().into())
            }
        }
    }

    /// 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex digits (either case).
    pub fn from_hex(text: &str) -> Option<ChunkId> {
        if text.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(ChunkId(out))
    }

    /// The chunk's object key below the store's prefix: `chunks/<first 2 hex>/<64 hex>`.
    pub fn object_key(&self) -> String {
        let hex = self.to_hex();
        format!("chunks/{}/{hex}", &hex[..2])
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({})", self.to_hex())
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
