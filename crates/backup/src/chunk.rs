//! The chunk object: a 32-byte versioned header, then the payload (zstd-compressed unless that
//! does not help, then AES-256-GCM-sealed when the backup is encrypted, the header as AAD).
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `FPBKCHNK` |
//! | 8 | 2 | version: 1 |
//! | 10 | 2 | flags: 1 compressed, 2 encrypted (others refused) |
//! | 12 | 4 | plaintext length (1 to 16 MiB) |
//! | 16 | 4 | stored length: the payload's bytes, the GCM tag included |
//! | 20 | 12 | GCM nonce (zero when not encrypted) |
//! | 32 | | payload |

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

use crate::chunk_id::ChunkId;
use crate::error::{corrupt, key_error, truncated, BackupError, Result};
use crate::key::BackupKey;
use crate::MAX_CHUNK_SIZE;

/// The chunk object's magic.
pub const CHUNK_MAGIC: [u8; 8] = *b"FPBKCHNK";
/// The chunk format version this build writes and reads.
pub const CHUNK_VERSION: u16 = 1;
/// The header's length.
pub const CHUNK_HEADER_LEN: usize = 32;
const FLAG_COMPRESSED: u16 = 1;
const FLAG_ENCRYPTED: u16 = 2;
const TAG_LEN: usize = 16;
/// zstd level 3 (zstd's default): most of the ratio at a few hundred MB/s per core.
const ZSTD_LEVEL: i32 = 3;

/// Encodes `plain` as a chunk object (compressed when that makes it smaller, sealed when
/// `key` is given). `plain` is 1 byte to 16 MiB.
pub fn encode_chunk(plain: &[u8], key: Option<&BackupKey>) -> Vec<u8> {
    assert!(!plain.is_empty() && plain.len() <= MAX_CHUNK_SIZE as usize, "chunk of {} bytes", plain.len());
    let compressed = zstd::bulk::compress(plain, ZSTD_LEVEL).ok().filter(|c| c.len() < plain.len());
    let mut flags = 0;
    let body: &[u8] = match &compressed {
        Some(c) => {
            flags |= FLAG_COMPRESSED;
            c
        }
        None => plain,
    };
    let mut header = [0u8; CHUNK_HEADER_LEN];
    header[..8].copy_from_slice(&CHUNK_MAGIC);
    header[8..10].copy_from_slice(&CHUNK_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&(plain.len() as u32).to_le_bytes());
    let stored_len = body.len() + if key.is_some() { TAG_LEN } else { 0 };
    header[16..20].copy_from_slice(&(stored_len as u32).to_le_bytes());
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + stored_len);
    match key {
        None => {
            header[10..12].copy_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&header);
            out.extend_from_slice(body);
        }
        Some(key) => {
            flags |= FLAG_ENCRYPTED;
            header[10..12].copy_from_slice(&flags.to_le_bytes());
            // A random 96-bit nonce per object: with at most 2^32 objects per key the chance
            // of a repeat stays below 2^-32 (NIST SP 800-38D, 8.3).
            let nonce: [u8; 12] = rand::random();
            header[20..32].copy_from_slice(&nonce);
            let cipher = Aes256Gcm::new(key.aead_key().into());
            let sealed = cipher
                .encrypt(Nonce::from_slice(&nonce), Payload { msg: body, aad: &header })
                .expect("AES-GCM seals any payload below 64 GiB");
            out.extend_from_slice(&header);
            out.extend_from_slice(&sealed);
        }
    }
    out
}

/// Decodes the chunk object `bytes` stored as `id` and returns its plaintext, after checking
/// everything: magic, version, flags, lengths, the GCM tag (with `key`), the decompressed
/// length, and that the plaintext's content address is `id`. `object` names it in errors.
pub fn decode_chunk(object: &str, bytes: &[u8], id: &ChunkId, key: Option<&BackupKey>) -> Result<Vec<u8>> {
    let plain = decode_chunk_unchecked(object, bytes, key)?;
    if ChunkId::of(&plain, key) != *id {
        return Err(corrupt(object, "content does not match its id"));
    }
    Ok(plain)
}

/// [`decode_chunk`] without the content-address check (for a reader that checks it elsewhere,
/// and the fuzz target).
pub fn decode_chunk_unchecked(object: &str, bytes: &[u8], key: Option<&BackupKey>) -> Result<Vec<u8>> {
    if bytes.len() < CHUNK_HEADER_LEN {
        if bytes.len() >= 8 && bytes[..8] != CHUNK_MAGIC {
            return Err(corrupt(object, "not a chunk object (bad magic)"));
        }
        return Err(truncated(object, format!("{} bytes, shorter than the header", bytes.len())));
    }
    let (header, payload) = bytes.split_at(CHUNK_HEADER_LEN);
    if header[..8] != CHUNK_MAGIC {
        return Err(corrupt(object, "not a chunk object (bad magic)"));
    }
    let field_u16 = |at: usize| u16::from_le_bytes([header[at], header[at + 1]]);
    let field_u32 =
        |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    let version = field_u16(8);
    if version > CHUNK_VERSION {
        return Err(BackupError::NewerFormat {
            object: object.to_string(),
            version: version.into(),
            supported: CHUNK_VERSION.into(),
        });
    }
    if version == 0 {
        return Err(corrupt(object, "version 0"));
    }
    let flags = field_u16(10);
    if flags & !(FLAG_COMPRESSED | FLAG_ENCRYPTED) != 0 {
        return Err(corrupt(object, format!("unknown flags {flags:#x}")));
    }
    let plain_len = field_u32(12) as usize;
    if plain_len == 0 || plain_len > MAX_CHUNK_SIZE as usize {
        return Err(corrupt(object, format!("plaintext length {plain_len} out of range")));
    }
    let stored_len = field_u32(16) as usize;
    let encrypted = flags & FLAG_ENCRYPTED != 0;
    let overhead = if encrypted { TAG_LEN } else { 0 };
    // Stored raw when compression does not help: never more than the plaintext and the tag.
    if stored_len > plain_len + overhead || stored_len < overhead {
        return Err(corrupt(object, format!("stored length {stored_len} for {plain_len} plaintext bytes")));
    }
    if payload.len() < stored_len {
        return Err(truncated(object, format!("{} payload bytes of {stored_len}", payload.len())));
    }
    if payload.len() > stored_len {
        return Err(corrupt(object, format!("{} payload bytes, header says {stored_len}", payload.len())));
    }
    let opened;
    let body: &[u8] = match (encrypted, key) {
        (false, None) => {
            if header[20..32] != [0u8; 12] {
                return Err(corrupt(object, "nonce set on a plain chunk"));
            }
            payload
        }
        (true, Some(key)) => {
            let cipher = Aes256Gcm::new(key.aead_key().into());
            opened = cipher
                .decrypt(Nonce::from_slice(&header[20..32]), Payload { msg: payload, aad: header })
                .map_err(|_| {
                    key_error(
                        object,
                        format!("authentication failed: wrong key (not {}) or damaged", key.name()),
                    )
                })?;
            &opened
        }
        (true, None) => return Err(key_error(object, "chunk is encrypted and no key was given")),
        (false, Some(_)) => return Err(key_error(object, "chunk is not encrypted but the backup is")),
    };
    if flags & FLAG_COMPRESSED == 0 {
        if body.len() != plain_len {
            return Err(corrupt(object, format!("{} raw bytes, header says {plain_len}", body.len())));
        }
        return Ok(body.to_vec());
    }
    let mut plain = Vec::with_capacity(plain_len);
    let mut decoder = zstd::bulk::Decompressor::new().map_err(|e| corrupt(object, format!("zstd: {e}")))?;
    decoder
        .decompress_to_buffer(body, &mut plain)
        .map_err(|e| corrupt(object, format!("decompression failed: {e}")))?;
    if plain.len() != plain_len {
        return Err(corrupt(
            object,
            format!("decompressed to {} bytes, header says {plain_len}", plain.len()),
        ));
    }
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, byte: u8) -> BackupKey {
        BackupKey::new(name, &[byte; 32]).unwrap()
    }

    #[test]
    fn round_trips_plain_compressed_and_sealed() {
        let compressible = vec![7u8; 4096];
        let random: Vec<u8> = (0..4096).map(|_| rand::random::<u8>()).collect();
        let k = key("k", 1);
        for plain in [&compressible, &random] {
            for key in [None, Some(&k)] {
                let id = ChunkId::of(plain, key);
                let obj = encode_chunk(plain, key);
                assert_eq!(&decode_chunk("c", &obj, &id, key).unwrap(), plain);
            }
        }
        // Compressible data is stored compressed, random data raw.
        assert!(encode_chunk(&compressible, None).len() < 200);
        assert_eq!(encode_chunk(&random, None).len(), CHUNK_HEADER_LEN + 4096);
        assert_eq!(encode_chunk(&random, Some(&k)).len(), CHUNK_HEADER_LEN + 4096 + TAG_LEN);
    }

    #[test]
    fn every_damage_is_detected() {
        let plain = vec![3u8; 10_000];
        let k = key("k", 1);
        for key in [None, Some(&k)] {
            let id = ChunkId::of(&plain, key);
            let obj = encode_chunk(&plain, key);
            for cut in [0, 8, CHUNK_HEADER_LEN - 1, CHUNK_HEADER_LEN, obj.len() - 1] {
                let err = decode_chunk("c", &obj[..cut], &id, key).unwrap_err();
                assert_eq!(err.kind(), crate::ErrorKind::Truncated, "cut at {cut}: {err}");
            }
            for at in 0..obj.len() {
                let mut bad = obj.clone();
                bad[at] ^= 0x10;
                // A flip zstd does not notice (a header bit that changes nothing) may decode to
                // the same plaintext: wrong data is never returned.
                if let Ok(out) = decode_chunk("c", &bad, &id, key) {
                    assert!(key.is_none() && out == plain, "flip at {at} went unnoticed");
                }
            }
        }
    }

    #[test]
    fn newer_version_wrong_key_and_missing_key_are_named() {
        let plain = vec![9u8; 1000];
        let mut obj = encode_chunk(&plain, None);
        obj[8] = 2;
        let err = decode_chunk("chunks/ab/x", &obj, &ChunkId::of(&plain, None), None).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::NewerFormat);
        assert!(err.to_string().contains("version 2"), "{err}");

        let right = key("daily", 1);
        let wrong = key("daily", 2);
        let obj = encode_chunk(&plain, Some(&right));
        let id = ChunkId::of(&plain, Some(&right));
        let err = decode_chunk("c", &obj, &id, Some(&wrong)).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Key, "{err}");
        assert!(err.to_string().contains("wrong key"), "{err}");
        assert_eq!(decode_chunk("c", &obj, &id, None).unwrap_err().kind(), crate::ErrorKind::Key);
    }

    #[test]
    fn keyed_ids_differ_from_plain_hashes() {
        let plain = b"same bytes";
        assert_ne!(ChunkId::of(plain, None), ChunkId::of(plain, Some(&key("k", 1))));
        assert_ne!(ChunkId::of(plain, Some(&key("k", 1))), ChunkId::of(plain, Some(&key("k", 2))));
        let id = ChunkId::of(plain, None);
        assert_eq!(ChunkId::from_hex(&id.to_hex()), Some(id));
        assert!(id.object_key().starts_with(&format!("chunks/{}/", &id.to_hex()[..2])));
    }
}
