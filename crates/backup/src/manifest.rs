//! The manifest of one backup: everything a restore needs (the disk's size, the chunk size, the
//! id of every chunk or "zero"), written last so that a backup in the store is complete.
//!
//! The object is a 16-byte header, a zstd frame of JSON, then a SHA-256 of everything before
//! it and, for an encrypted backup, an HMAC-SHA-256 of the same bytes under a key derived from
//! the backup key:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `FPBKMANI` |
//! | 8 | 4 | format version: 1 |
//! | 12 | 4 | flags: 1 authenticated (an HMAC follows the checksum; others refused) |
//! | 16 | | zstd-compressed JSON (the fields of [`Manifest`], chunk ids in hex, `null` for zero) |
//! | end − 32 (− 32) | 32 | SHA-256 of the bytes before it |
//! | end − 32 | 32 | HMAC-SHA-256 of the same bytes (authenticated manifests only) |

use hmac::Mac;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;

use crate::chunk_id::ChunkId;
use crate::error::{corrupt, invalid, key_error, truncated, BackupError, Result};
use crate::key::BackupKey;
use crate::{check_chunk_size, chunk_count};

/// The manifest object's magic.
pub const MANIFEST_MAGIC: [u8; 8] = *b"FPBKMANI";
/// The manifest format version this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
const FLAG_AUTHENTICATED: u32 = 1;
const HEADER_LEN: usize = 16;
const DIGEST_LEN: usize = 32;
/// The largest decompressed manifest read: 1 GiB of JSON, about 15 million chunks (15 TiB at
/// 1 MiB chunks, 240 TiB at 16 MiB), so a hostile object cannot exhaust memory.
pub const MAX_MANIFEST_JSON: u64 = 1 << 30;
const ZSTD_LEVEL: i32 = 3;

/// Full or incremental.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupKind {
    /// Every chunk was read.
    Full,
    /// Only changed chunks were read; the others' ids come from the parent.
    Incremental,
}

/// One backup: what the manifest records. A restore needs this and the chunks only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The backup's id: `YYYYMMDDTHHMMSSZ-xxxxxxxx` (UTC, then 32 random bits), sorting by time.
    pub id: String,
    /// The disk's name.
    pub disk: String,
    /// The disk's size in bytes.
    pub disk_size: u64,
    /// The chunk size (a power of two, 64 KiB to 16 MiB).
    pub chunk_size: u64,
    /// When the backup started, RFC 3339 UTC.
    pub created: String,
    /// Full or incremental.
    pub kind: BackupKind,
    /// The parent backup an incremental one was made from (informational: a restore needs
    /// this manifest only).
    pub parent: Option<String>,
    /// The keyring name of the key an encrypted backup was made with (never the key).
    pub key_id: Option<String>,
    /// Chunk `i`'s id, or `None` for a chunk of zeroes (not stored).
    pub chunks: Vec<Option<ChunkId>>,
}

/// The JSON inside a manifest object (the wire form of [`Manifest`]).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestBody {
    id: String,
    disk: String,
    disk_size: u64,
    chunk_size: u64,
    created: String,
    kind: BackupKind,
    #[serde(default)]
    parent: Option<String>,
    #[serde(default)]
    key_id: Option<String>,
    /// 64 hex digits per chunk, `null` for a zero chunk.
    chunks: Vec<Option<String>>,
}

impl Manifest {
    /// The object key of this backup's manifest: `backups/<disk>/<id>`.
    pub fn object_key(&self) -> String {
        manifest_key(&self.disk, &self.id)
    }

    /// How many chunks are stored (not zero).
    pub fn stored_chunks(&self) -> usize {
        self.chunks.iter().filter(|c| c.is_some()).count()
    }

    /// How many chunks are zero.
    pub fn zero_chunks(&self) -> usize {
        self.chunks.len() - self.stored_chunks()
    }

    /// The length of chunk `index` (the last one may be short).
    pub fn chunk_len(&self, index: u64) -> u64 {
        let start = index * self.chunk_size;
        self.chunk_size.min(self.disk_size.saturating_sub(start))
    }

    /// Checks the fields against each other (sizes, counts, names); `object` names it.
    pub fn check(&self, object: &str) -> Result<()> {
        check_name("disk", &self.disk).map_err(|e| corrupt(object, e.to_string()))?;
        check_backup_id(&self.id).map_err(|e| corrupt(object, e.to_string()))?;
        if let Some(parent) = &self.parent {
            check_backup_id(parent).map_err(|e| corrupt(object, format!("parent: {e}")))?;
        }
        check_chunk_size(self.chunk_size).map_err(|e| corrupt(object, e.to_string()))?;
        if self.disk_size == 0 {
            return Err(corrupt(object, "disk size 0"));
        }
        if self.chunks.len() as u64 != chunk_count(self.disk_size, self.chunk_size) {
            return Err(corrupt(
                object,
                format!(
                    "{} chunk ids for a disk of {} bytes in chunks of {}",
                    self.chunks.len(),
                    self.disk_size,
                    self.chunk_size
                ),
            ));
        }
        if self.kind == BackupKind::Full && self.parent.is_some() {
            return Err(corrupt(object, "a full backup with a parent"));
        }
        Ok(())
    }

    /// Encodes the manifest object, authenticated with `key` (which must be the one named by
    /// `key_id`; both or neither).
    pub fn encode(&self, key: Option<&BackupKey>) -> Result<Vec<u8>> {
        if key.map(BackupKey::name) != self.key_id.as_deref() {
            return Err(invalid("key", "the manifest's key_id and the key given differ"));
        }
        let body = ManifestBody {
            id: self.id.clone(),
            disk: self.disk.clone(),
            disk_size: self.disk_size,
            chunk_size: self.chunk_size,
            created: self.created.clone(),
            kind: self.kind,
            parent: self.parent.clone(),
            key_id: self.key_id.clone(),
            chunks: self.chunks.iter().map(|c| c.map(|id| id.to_hex())).collect(),
        };
        let json = serde_json::to_vec(&body).map_err(|e| invalid("manifest", e.to_string()))?;
        let compressed =
            zstd::bulk::compress(&json, ZSTD_LEVEL).map_err(|e| invalid("manifest", e.to_string()))?;
        let flags = if key.is_some() { FLAG_AUTHENTICATED } else { 0 };
        let mut out = Vec::with_capacity(HEADER_LEN + compressed.len() + 2 * DIGEST_LEN);
        out.extend_from_slice(&MANIFEST_MAGIC);
        out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&compressed);
        let signed_len = out.len();
        let digest = Sha256::digest(&out[..signed_len]);
        out.extend_from_slice(&digest);
        if let Some(key) = key {
            let mut mac = key.manifest_mac();
            mac.update(&out[..signed_len]);
            out.extend_from_slice(&mac.finalize().into_bytes());
        }
        Ok(out)
    }

    /// Decodes and checks a manifest object. With `key`, an authenticated manifest's HMAC is
    /// checked (and a manifest that is not authenticated, or names another key, refused);
    /// without, the checksum only (listing, GC and a quick verify need no key).
    pub fn decode(object: &str, bytes: &[u8], key: Option<&BackupKey>) -> Result<Manifest> {
        if bytes.len() < HEADER_LEN {
            if bytes.len() >= 8 && bytes[..8] != MANIFEST_MAGIC {
                return Err(corrupt(object, "not a manifest (bad magic)"));
            }
            return Err(truncated(object, format!("{} bytes, shorter than the header", bytes.len())));
        }
        if bytes[..8] != MANIFEST_MAGIC {
            return Err(corrupt(object, "not a manifest (bad magic)"));
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version > MANIFEST_VERSION {
            return Err(BackupError::NewerFormat {
                object: object.to_string(),
                version,
                supported: MANIFEST_VERSION,
            });
        }
        if version == 0 {
            return Err(corrupt(object, "format version 0"));
        }
        let flags = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        if flags & !FLAG_AUTHENTICATED != 0 {
            return Err(corrupt(object, format!("unknown flags {flags:#x}")));
        }
        let authenticated = flags & FLAG_AUTHENTICATED != 0;
        let trailer = DIGEST_LEN * if authenticated { 2 } else { 1 };
        if bytes.len() < HEADER_LEN + trailer {
            return Err(truncated(object, format!("{} bytes, no room for the checksum", bytes.len())));
        }
        let signed_len = bytes.len() - trailer;
        let signed = &bytes[..signed_len];
        if Sha256::digest(signed).as_slice() != &bytes[signed_len..signed_len + DIGEST_LEN] {
            return Err(corrupt(object, "checksum mismatch (damaged or truncated)"));
        }
        match (authenticated, key) {
            (true, Some(key)) => {
                let mut mac = key.manifest_mac();
                mac.update(signed);
                mac.verify_slice(&bytes[signed_len + DIGEST_LEN..]).map_err(|_| {
                    key_error(object, format!("authentication failed: wrong key (not {})", key.name()))
                })?;
            }
            (false, Some(_)) => {
                return Err(key_error(object, "the backup is not encrypted but a key was given"))
            }
            (_, None) => {}
        }
        let mut json = Vec::new();
        let decoder = zstd::stream::read::Decoder::new(&bytes[HEADER_LEN..signed_len])
            .map_err(|e| corrupt(object, format!("zstd: {e}")))?;
        decoder
            .take(MAX_MANIFEST_JSON + 1)
            .read_to_end(&mut json)
            .map_err(|e| corrupt(object, format!("decompression failed: {e}")))?;
        if json.len() as u64 > MAX_MANIFEST_JSON {
            return Err(corrupt(object, format!("more than {MAX_MANIFEST_JSON} bytes of JSON")));
        }
        let body: ManifestBody =
            serde_json::from_slice(&json).map_err(|e| corrupt(object, format!("JSON: {e}")))?;
        let mut chunks = Vec::with_capacity(body.chunks.len());
        for (i, c) in body.chunks.iter().enumerate() {
            chunks.push(match c {
                None => None,
                Some(hex) => Some(
                    ChunkId::from_hex(hex)
                        .ok_or_else(|| corrupt(object, format!("chunk {i}: not a chunk id")))?,
                ),
            });
        }
        let manifest = Manifest {
            id: body.id,
            disk: body.disk,
            disk_size: body.disk_size,
            chunk_size: body.chunk_size,
            created: body.created,
            kind: body.kind,
            parent: body.parent,
            key_id: body.key_id,
            chunks,
        };
        if manifest.key_id.is_some() != authenticated {
            return Err(corrupt(object, "key_id and the authentication flag disagree"));
        }
        if let (Some(key), Some(key_id)) = (key, &manifest.key_id) {
            if key.name() != key_id {
                return Err(key_error(object, format!("made with key {key_id}, not {}", key.name())));
            }
        }
        manifest.check(object)?;
        Ok(manifest)
    }
}

/// The object key of a manifest: `backups/<disk>/<id>`.
pub fn manifest_key(disk: &str, id: &str) -> String {
    format!("backups/{disk}/{id}")
}

/// Disk names (and the key names a store records) are object key segments: 1 to 255 bytes of
/// ASCII letters, digits and `.-_:+@`, not starting with a dot.
pub fn check_name(field: &'static str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_:+@".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(invalid(field, format!("{name:?}: 1 to 255 of A-Z a-z 0-9 . - _ : + @, not starting with a dot")))
    }
}

/// A backup id: `YYYYMMDDTHHMMSSZ-` then 8 lower-case hex digits.
pub fn check_backup_id(id: &str) -> Result<()> {
    let b = id.as_bytes();
    let ok = b.len() == 25
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && b[15] == b'Z'
        && b[16] == b'-'
        && b[17..].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
    if ok {
        Ok(())
    } else {
        Err(invalid("backup id", format!("{id:?} is not YYYYMMDDTHHMMSSZ-xxxxxxxx")))
    }
}

/// A new backup id for now: UTC time to the second, then eight hex digits, the microsecond
/// within the second (five digits: below 0x100000) and 12 random bits. Ids sort by time to
/// the microsecond, so two backups of a disk in one second list in the order they started,
/// and two in one microsecond still differ but for one chance in 4096. Ids made by earlier
/// versions have 32 random bits there: the same shape, sorted by the second.
pub fn new_backup_id(now: chrono::DateTime<chrono::Utc>) -> String {
    // Below 10^6 except in a leap second (chrono counts it from 10^6), still below 0x100000.
    let micros = now.timestamp_subsec_micros().min(0xf_ffff);
    format!("{}-{:05x}{:03x}", now.format("%Y%m%dT%H%M%SZ"), micros, rand::random::<u16>() & 0xfff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(key_id: Option<&str>) -> Manifest {
        Manifest {
            id: "20261130T093512Z-0badcafe".into(),
            disk: "vol0".into(),
            disk_size: 3 * 65536 + 100,
            chunk_size: 65536,
            created: "2026-11-30T09:35:12Z".into(),
            kind: BackupKind::Incremental,
            parent: Some("20261129T093512Z-00000001".into()),
            key_id: key_id.map(str::to_string),
            chunks: vec![Some(ChunkId([1; 32])), None, Some(ChunkId([2; 32])), Some(ChunkId([1; 32]))],
        }
    }

    #[test]
    fn round_trips_plain_and_authenticated() {
        let m = sample(None);
        assert_eq!(Manifest::decode("m", &m.encode(None).unwrap(), None).unwrap(), m);
        let key = BackupKey::new("daily", &[5; 32]).unwrap();
        let m = sample(Some("daily"));
        let bytes = m.encode(Some(&key)).unwrap();
        assert_eq!(Manifest::decode("m", &bytes, Some(&key)).unwrap(), m);
        // Listing and GC read it without the key.
        assert_eq!(Manifest::decode("m", &bytes, None).unwrap(), m);
        let wrong = BackupKey::new("daily", &[6; 32]).unwrap();
        assert_eq!(Manifest::decode("m", &bytes, Some(&wrong)).unwrap_err().kind(), crate::ErrorKind::Key);
    }

    #[test]
    fn damage_truncation_and_newer_versions_are_refused() {
        let bytes = sample(None).encode(None).unwrap();
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(Manifest::decode("m", &bad, None).is_err(), "flip at {at}");
        }
        for cut in 0..bytes.len() {
            assert!(Manifest::decode("m", &bytes[..cut], None).is_err(), "cut at {cut}");
        }
        let mut newer = bytes.clone();
        newer[8] = 2;
        let err = Manifest::decode("backups/vol0/x", &newer, None).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::NewerFormat);
        assert!(err.to_string().contains("backups/vol0/x") && err.to_string().contains("version 2"), "{err}");
    }

    #[test]
    fn ids_sort_by_time_and_check() {
        let a = new_backup_id("2026-01-02T03:04:05Z".parse().unwrap());
        let b = new_backup_id("2026-01-02T03:04:06Z".parse().unwrap());
        assert!(a < b);
        check_backup_id(&a).unwrap();
        // Within one second, by the microsecond, whatever the random bits.
        for _ in 0..64 {
            let early = new_backup_id("2026-01-02T03:04:05.000999Z".parse().unwrap());
            let late = new_backup_id("2026-01-02T03:04:05.001000Z".parse().unwrap());
            assert!(early < late, "{early} {late}");
            assert!(late < b, "{late} {b}");
            check_backup_id(&late).unwrap();
        }
        let last = new_backup_id("2026-01-02T03:04:05.999999Z".parse().unwrap());
        assert!(last.starts_with("20260102T030405Z-f423f"), "{last}");
        assert!(check_backup_id("../../etc").is_err());
        assert!(check_name("disk", "a/b").is_err());
        check_name("disk", "lvs0_vol-1.img").unwrap();
    }
}
