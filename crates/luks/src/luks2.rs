//! The LUKS2 header (the LUKS2 On-Disk Format Specification's binary header and JSON area):
//! two copies, each a 4096-byte binary header and a JSON area, the second copy
//! right after the first (at the copy's size). The JSON is kept as parsed (so fields this build
//! does not know, tokens for example, survive a rewrite) and checked here as strictly as
//! cryptsetup's validation: the types of every field, offsets and sizes as decimal strings,
//! salts and digests base64, key slot areas inside the key slots area.

use crate::af::{self, STRIPES};
use crate::crypto::Hash;
use crate::error::{unsupported, LuksError};
use crate::kdf::Kdf;
use crate::luks1::{c_string, put_c_string};
use base64::Engine;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub(crate) const MAGIC_PRIMARY: &[u8; 6] = b"LUKS\xba\xbe";
pub(crate) const MAGIC_SECONDARY: &[u8; 6] = b"SKUL\xba\xbe";
pub(crate) const BIN_LEN: usize = 4096;
/// The sizes a copy (binary header and JSON area) may have; also where a secondary copy is
/// looked for when the primary is unreadable (the LUKS2 specification's list; cryptsetup's
/// LUKS2_HDR2_OFFSETS).
pub(crate) const COPY_SIZES: [u64; 9] =
    [0x4000, 0x8000, 0x1_0000, 0x2_0000, 0x4_0000, 0x8_0000, 0x10_0000, 0x20_0000, 0x40_0000];
/// cryptsetup's LUKS2_MAX_KEYSLOTS_SIZE.
pub(crate) const MAX_KEYSLOTS_SIZE: u64 = 128 << 20;
/// cryptsetup's LUKS2_KEYSLOTS_MAX (and the limit on segments).
pub(crate) const MAX_KEYSLOTS: u32 = 32;
/// cryptsetup's LUKS2_DIGEST_MAX.
pub(crate) const MAX_DIGESTS: usize = 8;
/// Argon2's limits in cryptsetup (crypto_backend/pbkdf_check.c): memory 4 GiB, 4 threads.
pub(crate) const ARGON2_MAX_MEMORY_KIB: u32 = 4 * 1024 * 1024;
pub(crate) const ARGON2_MAX_PARALLEL: u32 = 4;
/// The salt length cryptsetup writes and reads (LUKS_SALTSIZE).
pub(crate) const SALT_LEN: usize = 32;

/// What a copy failed on: damage (the other copy may do) or a valid field this build refuses.
pub(crate) type Check<T> = Result<T, LuksError>;

pub(crate) fn bad(reason: impl Into<String>) -> LuksError {
    // The copy is named by the caller (`Damaged { copy }` is rewritten there).
    LuksError::Damaged { copy: "primary", reason: reason.into() }
}

/// The binary header's fields (the LUKS2 specification's binary header table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Binary {
    pub hdr_size: u64,
    pub seqid: u64,
    pub label: String,
    pub checksum_alg: Hash,
    pub salt: [u8; 64],
    pub uuid: String,
    pub subsystem: String,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(raw)
}

impl Binary {
    /// The binary header of the copy expected at `offset` (its magic, version and size); the
    /// checksum is checked by [`parse_copy`] once the whole copy is read.
    pub(crate) fn parse(bytes: &[u8], offset: u64) -> Check<Binary> {
        let magic = if offset == 0 { MAGIC_PRIMARY } else { MAGIC_SECONDARY };
        if &bytes[..6] != magic {
            return Err(bad("magic"));
        }
        let version = be16(bytes, 6);
        if version > 2 {
            return Err(LuksError::NewerVersion(version));
        }
        if version != 2 {
            return Err(bad(format!("version {version}")));
        }
        let hdr_size = be64(bytes, 8);
        if !COPY_SIZES.contains(&hdr_size) {
            return Err(bad(format!("hdr_size {hdr_size}")));
        }
        let hdr_offset = be64(bytes, 256);
        if hdr_offset != offset {
            return Err(bad(format!("hdr_offset {hdr_offset} for a copy at {offset}")));
        }
        let alg = c_string("checksum_alg", &bytes[72..104]).map_err(bad)?;
        let mut salt = [0u8; 64];
        salt.copy_from_slice(&bytes[104..168]);
        Ok(Binary {
            hdr_size,
            seqid: be64(bytes, 16),
            label: c_string("label", &bytes[24..72]).map_err(bad)?,
            checksum_alg: Hash::parse("checksum_alg", &alg)
                .map_err(|_| bad(format!("checksum_alg {alg}")))?,
            salt,
            uuid: c_string("uuid", &bytes[168..208]).map_err(bad)?,
            subsystem: c_string("subsystem", &bytes[208..256]).map_err(bad)?,
        })
    }
}

/// The checksum of a copy: its hash over the whole copy with the checksum field zeroed.
fn checksum(alg: Hash, copy: &[u8]) -> Vec<u8> {
    alg.digest(&[&copy[..448], &[0u8; 64], &copy[512..]])
}

/// A checked copy: the binary header, the JSON and what it says.
#[derive(Clone, Debug)]
pub(crate) struct Copy {
    pub bin: Binary,
    pub json: Map<String, Value>,
    pub meta: Meta,
}

/// Checks a whole copy read at `offset` (`bytes.len()` is its `hdr_size`).
pub(crate) fn parse_copy(bin: Binary, bytes: &[u8]) -> Check<Copy> {
    let stored = &bytes[448..448 + bin.checksum_alg.len()];
    if !crate::crypto::same_bytes(stored, &checksum(bin.checksum_alg, bytes)) {
        return Err(bad("checksum mismatch"));
    }
    let area = &bytes[BIN_LEN..];
    let end = area.iter().position(|&b| b == 0).ok_or_else(|| bad("JSON area not NUL-terminated"))?;
    let json: Value = serde_json::from_slice(&area[..end]).map_err(|e| bad(format!("JSON: {e}")))?;
    let Value::Object(json) = json else { return Err(bad("JSON: not an object")) };
    let meta = Meta::parse(&json, bin.hdr_size)?;
    Ok(Copy { bin, json, meta })
}

/// A copy as it is on disk, `bin.hdr_size` bytes, for `offset` (0 or `hdr_size`).
pub(crate) fn encode_copy(bin: &Binary, json: &Map<String, Value>, offset: u64) -> Check<Vec<u8>> {
    let size = bin.hdr_size as usize;
    let text = serde_json::to_string(json).map_err(|e| bad(format!("JSON: {e}")))?;
    // The JSON must leave room for its terminating NUL.
    if text.len() >= size - BIN_LEN {
        return Err(unsupported(
            "json_size",
            format_args!("{} bytes of JSON for a {}-byte area", text.len(), size - BIN_LEN),
        ));
    }
    let mut out = vec![0u8; size];
    out[..6].copy_from_slice(if offset == 0 { MAGIC_PRIMARY } else { MAGIC_SECONDARY });
    out[6..8].copy_from_slice(&2u16.to_be_bytes());
    out[8..16].copy_from_slice(&bin.hdr_size.to_be_bytes());
    out[16..24].copy_from_slice(&bin.seqid.to_be_bytes());
    put_c_string(&mut out[24..72], &bin.label);
    put_c_string(&mut out[72..104], bin.checksum_alg.name());
    out[104..168].copy_from_slice(&bin.salt);
    put_c_string(&mut out[168..208], &bin.uuid);
    put_c_string(&mut out[208..256], &bin.subsystem);
    out[256..264].copy_from_slice(&offset.to_be_bytes());
    out[BIN_LEN..BIN_LEN + text.len()].copy_from_slice(text.as_bytes());
    let sum = checksum(bin.checksum_alg, &out);
    out[448..448 + sum.len()].copy_from_slice(&sum);
    Ok(out)
}

/// A LUKS2 key slot (the LUKS2 specification's "keyslots" object): type luks2, af luks1, area raw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Keyslot {
    pub key_size: u32,
    pub af_hash: Hash,
    pub area_offset: u64,
    pub area_size: u64,
    pub area_key_size: u32,
    pub kdf: Kdf,
    pub salt: Vec<u8>,
    /// 0 ignore, 1 normal, 2 prefer (absent: normal).
    pub priority: Option<u8>,
}

/// The data segment (the "segments" object): type crypt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub offset: u64,
    /// `None`: "dynamic", to the device's end.
    pub size: Option<u64>,
    pub cipher: String,
    pub sector_size: u32,
}

/// The digest of the volume key (the "digests" object): type pbkdf2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Digest {
    pub id: String,
    pub keyslots: Vec<u32>,
    pub hash: Hash,
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub digest: Vec<u8>,
}

/// What a copy's JSON says, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub keyslots: BTreeMap<u32, Keyslot>,
    pub segment_id: String,
    pub segment: Segment,
    /// The digest bound to the data segment.
    pub digest: Digest,
    pub keyslots_size: u64,
    /// The online re-encryption in progress (cryptsetup's "online-reencrypt-v2").
    pub reencrypt: Option<JobInput>,
}

pub(crate) fn object<'a>(v: &'a Value, what: &str) -> Check<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| bad(format!("{what}: not an object")))
}
pub(crate) fn field<'a>(m: &'a Map<String, Value>, what: &str, key: &str) -> Check<&'a Value> {
    m.get(key).ok_or_else(|| bad(format!("{what}: no \"{key}\"")))
}
pub(crate) fn string<'a>(m: &'a Map<String, Value>, what: &str, key: &str) -> Check<&'a str> {
    field(m, what, key)?.as_str().ok_or_else(|| bad(format!("{what}.{key}: not a string")))
}
/// A JSON integer (cryptsetup's json_type_int: a 64-bit signed integer), non-negative.
pub(crate) fn int(m: &Map<String, Value>, what: &str, key: &str) -> Check<u64> {
    let v = field(m, what, key)?;
    match v.as_u64() {
        Some(n) if n <= i64::MAX as u64 => Ok(n),
        _ => Err(bad(format!("{what}.{key}: not a non-negative integer"))),
    }
}
pub(crate) fn int_u32(m: &Map<String, Value>, what: &str, key: &str) -> Check<u32> {
    u32::try_from(int(m, what, key)?).map_err(|_| bad(format!("{what}.{key}: too large")))
}
/// A decimal string, as offsets and sizes are stored (JSON numbers cannot carry 64 bits).
pub(crate) fn decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
pub(crate) fn dec(m: &Map<String, Value>, what: &str, key: &str) -> Check<u64> {
    let s = string(m, what, key)?;
    decimal(s).ok_or_else(|| bad(format!("{what}.{key}: not a decimal string")))
}
pub(crate) fn b64(m: &Map<String, Value>, what: &str, key: &str) -> Check<Vec<u8>> {
    let s = string(m, what, key)?;
    base64::engine::general_purpose::STANDARD.decode(s).map_err(|_| bad(format!("{what}.{key}: not base64")))
}
/// An object id: a decimal number without leading zeros, below `max`.
pub(crate) fn id(s: &str, what: &str, max: u32) -> Check<u32> {
    match decimal(s) {
        Some(n) if n < u64::from(max) && n.to_string() == s => Ok(n as u32),
        _ => Err(bad(format!("{what} id \"{s}\""))),
    }
}
pub(crate) fn id_list(m: &Map<String, Value>, what: &str, key: &str, max: u32) -> Check<Vec<u32>> {
    let arr = field(m, what, key)?.as_array().ok_or_else(|| bad(format!("{what}.{key}: not an array")))?;
    arr.iter()
        .map(|v| {
            v.as_str().ok_or_else(|| bad(format!("{what}.{key}: not strings"))).and_then(|s| id(s, what, max))
        })
        .collect()
}
pub(crate) fn strings(v: &Value, what: &str) -> Check<Vec<String>> {
    let arr = v.as_array().ok_or_else(|| bad(format!("{what}: not an array")))?;
    arr.iter()
        .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| bad(format!("{what}: not strings"))))
        .collect()
}

/// Parses a key slot's `kdf` object.
pub(crate) fn parse_kdf(m: &Map<String, Value>, what: &str) -> Check<(Kdf, Vec<u8>)> {
    let kind = string(m, what, "type")?;
    let kdf = match kind {
        "pbkdf2" => {
            let hash = string(m, what, "hash")?;
            Hash::parse("kdf hash", hash)?;
            let iterations = int_u32(m, what, "iterations")?;
            if iterations == 0 {
                return Err(bad(format!("{what}.iterations: 0")));
            }
            Kdf::Pbkdf2 { hash: hash.to_owned(), iterations }
        }
        "argon2i" | "argon2id" => {
            let time = int_u32(m, what, "time")?;
            let memory_kib = int_u32(m, what, "memory")?;
            let parallel = int_u32(m, what, "cpus")?;
            check_argon2(time, memory_kib, parallel)?;
            Kdf::Argon2 { id: kind == "argon2id", time, memory_kib, parallel }
        }
        other => return Err(unsupported("kdf type", other)),
    };
    let salt = b64(m, what, "salt")?;
    if salt.len() != SALT_LEN {
        return Err(bad(format!("{what}.salt: {} bytes, not {SALT_LEN}", salt.len())));
    }
    Ok((kdf, salt))
}

/// cryptsetup's Argon2 limits (and the argon2 crate's memory floor, 8 KiB per lane).
pub(crate) fn check_argon2(time: u32, memory_kib: u32, parallel: u32) -> Check<()> {
    if time == 0 {
        return Err(unsupported("kdf time", 0));
    }
    if parallel == 0 || parallel > ARGON2_MAX_PARALLEL {
        return Err(unsupported("kdf cpus", format_args!("{parallel} (1 to {ARGON2_MAX_PARALLEL})")));
    }
    if memory_kib > ARGON2_MAX_MEMORY_KIB || memory_kib < 8 * parallel {
        return Err(unsupported(
            "kdf memory",
            format_args!("{memory_kib} KiB (at most {ARGON2_MAX_MEMORY_KIB})"),
        ));
    }
    Ok(())
}

/// The JSON form of a key slot's kdf.
pub(crate) fn kdf_json(kdf: &Kdf, salt: &[u8]) -> Value {
    let salt = base64::engine::general_purpose::STANDARD.encode(salt);
    match kdf {
        Kdf::Pbkdf2 { hash, iterations } => serde_json::json!({
            "type": "pbkdf2", "hash": hash, "iterations": iterations, "salt": salt,
        }),
        Kdf::Argon2 { id, time, memory_kib, parallel } => serde_json::json!({
            "type": if *id { "argon2id" } else { "argon2i" },
            "time": time, "memory": memory_kib, "cpus": parallel, "salt": salt,
        }),
    }
}

impl Meta {
    pub(crate) fn parse(json: &Map<String, Value>, hdr_size: u64) -> Check<Meta> {
        let metadata_end = 2 * hdr_size;
        // config
        let config = object(field(json, "JSON", "config")?, "config")?;
        let json_size = dec(config, "config", "json_size")?;
        if json_size != hdr_size - BIN_LEN as u64 {
            return Err(bad(format!("config.json_size {json_size} for a {hdr_size}-byte header")));
        }
        let keyslots_size = dec(config, "config", "keyslots_size")?;
        if keyslots_size % 4096 != 0 || keyslots_size > MAX_KEYSLOTS_SIZE {
            return Err(bad(format!("config.keyslots_size {keyslots_size}")));
        }
        if let Some(flags) = config.get("flags") {
            strings(flags, "config.flags")?;
        }
        let mut reencrypting = false;
        if let Some(req) = config.get("requirements") {
            let req = object(req, "config.requirements")?;
            if let Some(mandatory) = req.get("mandatory") {
                // LUKS2 with OPAL, older or other re-encryption formats, ...: a volume only a
                // tool that knows the requirement may open.
                for name in strings(mandatory, "config.requirements.mandatory")? {
                    if name != REQUIREMENT {
                        return Err(unsupported("requirement", name));
                    }
                    reencrypting = true;
                }
            }
        }
        // tokens: kept as they are; each must be an object (cryptsetup's rule).
        let tokens = object(field(json, "JSON", "tokens")?, "tokens")?;
        for (key, token) in tokens {
            id(key, "token", MAX_KEYSLOTS)?;
            object(token, "token")?;
        }
        // segments
        let segments = object(field(json, "JSON", "segments")?, "segments")?;
        // In a re-encryption the volume is described by its segment as before the job (the
        // "backup-previous" one); reencrypt.rs checks the others.
        let (segment_id, seg) = if reencrypting {
            previous_segment(segments)?
        } else {
            if segments.len() != 1 {
                return Err(unsupported(
                    "segments",
                    format_args!("{} segments (one is implemented)", segments.len()),
                ));
            }
            segments.iter().next().ok_or_else(|| bad("segments: empty"))?
        };
        id(segment_id, "segment", MAX_KEYSLOTS)?;
        let what = "segment";
        let seg = object(seg, what)?;
        let kind = string(seg, what, "type")?;
        if kind != "crypt" {
            return Err(unsupported("segment type", kind));
        }
        let offset = dec(seg, what, "offset")?;
        let size = match string(seg, what, "size")? {
            "dynamic" => None,
            s => Some(decimal(s).ok_or_else(|| bad("segment.size: not a decimal string or \"dynamic\""))?),
        };
        let iv_tweak = dec(seg, what, "iv_tweak")?;
        if iv_tweak != 0 {
            return Err(unsupported("iv_tweak", iv_tweak));
        }
        let cipher = string(seg, what, "encryption")?;
        if cipher != "aes-xts-plain64" {
            return Err(unsupported("cipher", cipher));
        }
        let sector_size = int_u32(seg, what, "sector_size")?;
        if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() {
            return Err(bad(format!("segment.sector_size {sector_size}")));
        }
        if seg.contains_key("integrity") {
            return Err(unsupported("integrity", "dm-integrity segments"));
        }
        if let Some(flags) = seg.get("flags") {
            strings(flags, "segment.flags")?;
        }
        if offset == 0 {
            return Err(unsupported("segment offset", "0 (a detached header)"));
        }
        if offset % u64::from(sector_size) != 0 || size.is_some_and(|s| s % u64::from(sector_size) != 0) {
            return Err(bad("segment: offset or size not a multiple of sector_size"));
        }
        // cryptsetup: the key slots area lies between the two copies and the data.
        if offset < metadata_end.saturating_add(keyslots_size) {
            return Err(bad(format!("segment.offset {offset} inside the metadata and key slots area")));
        }
        // keyslots
        let slots = object(field(json, "JSON", "keyslots")?, "keyslots")?;
        let mut keyslots = BTreeMap::new();
        let mut reencrypt_slots = Vec::new();
        for (key, slot) in slots {
            let n = id(key, "keyslot", MAX_KEYSLOTS)?;
            let what = format!("keyslot {n}");
            let what = what.as_str();
            let slot = object(slot, what)?;
            let kind = string(slot, what, "type")?;
            if reencrypting && kind == "reencrypt" {
                reencrypt_slots.push(n);
                continue;
            }
            if kind != "luks2" {
                return Err(unsupported("keyslot type", kind));
            }
            let key_size = int_u32(slot, what, "key_size")?;
            if key_size != 32 && key_size != 64 {
                return Err(unsupported("key_size", format_args!("{} bits", u64::from(key_size) * 8)));
            }
            let afm = object(field(slot, what, "af")?, "af")?;
            if string(afm, what, "type")? != "luks1" {
                return Err(unsupported("af type", string(afm, what, "type")?));
            }
            let af_hash = Hash::parse("af hash", string(afm, what, "hash")?)?;
            let stripes = int(afm, what, "stripes")?;
            if stripes != u64::from(STRIPES) {
                return Err(unsupported("af stripes", stripes));
            }
            let area = object(field(slot, what, "area")?, "area")?;
            if string(area, what, "type")? != "raw" {
                return Err(unsupported("area type", string(area, what, "type")?));
            }
            let area_cipher = string(area, what, "encryption")?;
            if area_cipher != "aes-xts-plain64" {
                return Err(unsupported("area encryption", area_cipher));
            }
            let area_key_size = int_u32(area, what, "key_size")?;
            if area_key_size != 32 && area_key_size != 64 {
                return Err(unsupported("area key_size", area_key_size));
            }
            let area_offset = dec(area, what, "offset")?;
            let area_size = dec(area, what, "size")?;
            let area_end =
                area_offset.checked_add(area_size).ok_or_else(|| bad(format!("{what}: area overflows")))?;
            if area_offset < metadata_end || area_end > metadata_end + keyslots_size || area_offset % 512 != 0
            {
                return Err(bad(format!(
                    "{what}: area {area_offset}+{area_size} outside the key slots area"
                )));
            }
            if area_size < af::split_bytes(key_size as usize, STRIPES) {
                return Err(bad(format!("{what}: area size {area_size} smaller than the key material")));
            }
            let (kdf, salt) = parse_kdf(object(field(slot, what, "kdf")?, "kdf")?, what)?;
            let priority = match slot.get("priority") {
                None => None,
                Some(_) => match int(slot, what, "priority")? {
                    p @ 0..=2 => Some(p as u8),
                    p => return Err(bad(format!("{what}.priority {p}"))),
                },
            };
            keyslots.insert(
                n,
                Keyslot { key_size, af_hash, area_offset, area_size, area_key_size, kdf, salt, priority },
            );
        }
        let mut areas: Vec<(u64, u64, u32)> =
            keyslots.iter().map(|(n, k)| (k.area_offset, k.area_offset + k.area_size, *n)).collect();
        areas.sort();
        for pair in areas.windows(2) {
            if pair[0].1 > pair[1].0 {
                return Err(bad(format!("keyslots {} and {}: areas overlap", pair[0].2, pair[1].2)));
            }
        }
        // digests
        let digests = object(field(json, "JSON", "digests")?, "digests")?;
        if digests.len() > MAX_DIGESTS {
            return Err(bad(format!("{} digests", digests.len())));
        }
        let mut bound = None;
        let mut all_digests = Vec::new();
        for (key, d) in digests {
            id(key, "digest", MAX_DIGESTS as u32)?;
            let what = format!("digest {key}");
            let what = what.as_str();
            let d = object(d, what)?;
            let kind = string(d, what, "type")?;
            if kind != "pbkdf2" {
                return Err(unsupported("digest type", kind));
            }
            let slots = id_list(d, what, "keyslots", MAX_KEYSLOTS)?;
            let segs = id_list(d, what, "segments", MAX_KEYSLOTS)?;
            if let Some(s) = slots.iter().find(|s| !keyslots.contains_key(s) && !reencrypt_slots.contains(s))
            {
                return Err(bad(format!("{what}: keyslot {s} does not exist")));
            }
            let hash = Hash::parse("digest hash", string(d, what, "hash")?)?;
            let iterations = int_u32(d, what, "iterations")?;
            if iterations == 0 {
                return Err(bad(format!("{what}.iterations: 0")));
            }
            let salt = b64(d, what, "salt")?;
            let digest = b64(d, what, "digest")?;
            if salt.len() != SALT_LEN {
                return Err(bad(format!("{what}.salt: {} bytes", salt.len())));
            }
            if digest.len() != 20 && digest.len() != hash.len() {
                return Err(bad(format!("{what}.digest: {} bytes", digest.len())));
            }
            let parsed = Digest { id: key.clone(), keyslots: slots, hash, iterations, salt, digest };
            if segs.iter().any(|s| s.to_string() == *segment_id) {
                if bound.is_some() {
                    return Err(bad("two digests for the data segment"));
                }
                bound = Some(parsed.clone());
            }
            all_digests.push((parsed, segs));
        }
        let digest = bound.ok_or_else(|| bad("no digest for the data segment"))?;
        let mut meta = Meta {
            keyslots,
            segment_id: segment_id.clone(),
            segment: Segment { offset, size, cipher: cipher.to_owned(), sector_size },
            digest,
            keyslots_size,
            reencrypt: None,
        };
        if reencrypting {
            meta.reencrypt = Some(JobInput { metadata_end, digests: all_digests });
        }
        Ok(meta)
    }
}

/// The requirement cryptsetup 2.6 writes for a re-encryption and accepts to resume
/// (LUKS2_REENCRYPT_REQ_VERSION 2; "-v3" is for decryption with a data shift, plain
/// "online-reencrypt" is the 2.2 format without the metadata digest).
pub(crate) const REQUIREMENT: &str = "online-reencrypt-v2";
/// The flag of the segment describing the volume as before a re-encryption.
pub(crate) const PREVIOUS: &str = "backup-previous";

/// What the re-encryption metadata's check (`reencrypt/job.rs`) needs beyond the JSON and the
/// plain volume's fields: where the metadata ends, and every digest with its segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JobInput {
    pub metadata_end: u64,
    pub digests: Vec<(Digest, Vec<u32>)>,
}

/// The segment describing the volume as before the job ("backup-previous"): the data
/// segment the rest of the header checks go by.
pub(crate) fn previous_segment(segments: &Map<String, Value>) -> Check<(&String, &Value)> {
    let mut found = segments.iter().filter(|(_, v)| {
        v.get("flags")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|x| x.as_str() == Some(PREVIOUS)))
    });
    match (found.next(), found.next()) {
        (Some(s), None) => Ok(s),
        (None, _) => Err(bad("re-encryption without a \"backup-previous\" segment")),
        (Some(_), Some(_)) => Err(bad("two \"backup-previous\" segments")),
    }
}
