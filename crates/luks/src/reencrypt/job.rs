//! The re-encryption metadata of a LUKS2 header, parsed and checked ([`Job`]), and the JSON
//! it writes (segments, digests): the format half of the re-encryption, below the steps in
//! `mod.rs`.

use crate::crypto::{same_bytes, secret, Hash};
use crate::error::unsupported;
use crate::luks2::{
    self, bad, dec, field, int, int_u32, object, string, strings, Check, Digest, Meta, PREVIOUS,
};
use crate::volume::{pick_slot, DIGEST_ITERATIONS};
use crate::LuksError;
use base64::Engine;
use rand::RngCore;
use serde_json::{Map, Value};
use zeroize::Zeroizing;

/// The requirement's version, the second byte of the metadata digest's input.
pub(crate) const REQUIREMENT_VERSION: u8 = 2;
/// cryptsetup's LUKS2_REENCRYPT_MAX_HOTZONE_LENGTH.
pub(crate) const MAX_HOTZONE: u64 = 1 << 30;
/// One checksum (sha256).
pub(crate) const CHECKSUM_LEN: u64 = 32;
pub(crate) const FINAL: &str = "backup-final";
pub(crate) const HOT: &str = "in-reencryption";

/// A data segment as the re-encryption's metadata lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seg {
    pub(crate) id: u32,
    pub(crate) offset: u64,
    pub(crate) size: Option<u64>,
    pub(crate) iv_tweak: u64,
    pub(crate) cipher: String,
    pub(crate) sector_size: u32,
    pub(crate) flags: Vec<String>,
}

pub(crate) fn parse_seg(id: u32, value: &Value) -> Check<Seg> {
    let what = format!("segment {id}");
    let what = what.as_str();
    let seg = object(value, what)?;
    let kind = string(seg, what, "type")?;
    if kind != "crypt" {
        return Err(unsupported("segment type", format_args!("{kind} (encryption or decryption jobs)")));
    }
    let size = match string(seg, what, "size")? {
        "dynamic" => None,
        s => Some(luks2::decimal(s).ok_or_else(|| bad(format!("{what}.size: not a decimal string")))?),
    };
    let cipher = string(seg, what, "encryption")?;
    if cipher != "aes-xts-plain64" {
        return Err(unsupported("cipher", cipher));
    }
    let sector_size = int_u32(seg, what, "sector_size")?;
    if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() {
        return Err(bad(format!("{what}.sector_size {sector_size}")));
    }
    if seg.contains_key("integrity") {
        return Err(unsupported("integrity", "dm-integrity segments"));
    }
    let offset = dec(seg, what, "offset")?;
    let ss = u64::from(sector_size);
    if offset % ss != 0 || size.is_some_and(|s| s == 0 || s % ss != 0) {
        return Err(bad(format!("{what}: offset or size not a multiple of sector_size")));
    }
    let flags = seg.get("flags").map(|f| strings(f, "segment.flags")).transpose()?.unwrap_or_default();
    Ok(Seg {
        id,
        offset,
        size,
        iv_tweak: dec(seg, what, "iv_tweak")?,
        cipher: cipher.to_owned(),
        sector_size,
        flags,
    })
}

/// Where the job stands, from the live segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// [0, boundary) under the new key, the rest under the old; no hotzone in flight.
    At(u64),
    /// A hotzone's checksums are recorded and its data may be half rewritten.
    Hot { offset: u64, len: u64 },
    /// All under the new key.
    Done,
}

/// The re-encryption metadata of a header, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Job {
    pub(crate) keyslot: u32,
    pub(crate) area_offset: u64,
    pub(crate) area_size: u64,
    pub(crate) block: u32,
    pub(crate) old: Digest,
    pub(crate) new: Digest,
    pub(crate) check: Digest,
    pub(crate) previous: Seg,
    pub(crate) fin: Seg,
    pub(crate) state: State,
}

impl Job {
    /// Checks what a header in re-encryption says beyond the plain volume's fields (those
    /// `meta` has, the "backup-previous" segment standing for the data segment).
    pub(crate) fn parse(
        json: &Map<String, Value>,
        meta: &Meta,
        metadata_end: u64,
        digests: Vec<(Digest, Vec<u32>)>,
    ) -> Check<Job> {
        // The reencrypt keyslot.
        let slots = object(field(json, "JSON", "keyslots")?, "keyslots")?;
        let mut found = None;
        for (key, slot) in slots {
            let slot = object(slot, "keyslot")?;
            if string(slot, "keyslot", "type")? == "reencrypt" {
                if found.is_some() {
                    return Err(bad("two reencrypt keyslots"));
                }
                found = Some((luks2::id(key, "keyslot", luks2::MAX_KEYSLOTS)?, slot));
            }
        }
        let (keyslot, ks) = found.ok_or_else(|| bad("re-encryption without a reencrypt keyslot"))?;
        let what = "reencrypt keyslot";
        if int(ks, what, "key_size")? != 1 {
            return Err(bad("reencrypt keyslot: key_size not 1"));
        }
        let mode = string(ks, what, "mode")?;
        if mode != "reencrypt" {
            return Err(unsupported("reencryption mode", mode));
        }
        let direction = string(ks, what, "direction")?;
        if direction != "forward" {
            return Err(unsupported("reencryption direction", direction));
        }
        let area = object(field(ks, what, "area")?, "reencrypt keyslot area")?;
        let resilience = string(area, what, "type")?;
        if resilience != "checksum" {
            return Err(unsupported("reencryption resilience", resilience));
        }
        let hash = string(area, what, "hash")?;
        if hash != "sha256" {
            return Err(unsupported("reencryption checksum hash", hash));
        }
        let block = int_u32(area, what, "sector_size")?;
        if block < 512 || !block.is_power_of_two() {
            return Err(bad(format!("reencrypt keyslot: sector_size {block}")));
        }
        let area_offset = dec(area, what, "offset")?;
        let area_size = dec(area, what, "size")?;
        let area_end =
            area_offset.checked_add(area_size).ok_or_else(|| bad("reencrypt keyslot: area overflows"))?;
        if area_offset < metadata_end
            || area_end > metadata_end + meta.keyslots_size
            || area_size < CHECKSUM_LEN
        {
            return Err(bad(format!(
                "reencrypt keyslot: area {area_offset}+{area_size} outside the key slots area"
            )));
        }
        if meta
            .keyslots
            .values()
            .any(|k| k.area_offset < area_end && area_offset < k.area_offset + k.area_size)
        {
            return Err(bad("reencrypt keyslot: area overlaps a key slot's"));
        }

        // The segments: the two backups and the live ones.
        let segments = object(field(json, "JSON", "segments")?, "segments")?;
        let (mut live, mut previous, mut fin) = (Vec::new(), None, None);
        for (key, value) in segments {
            let seg = parse_seg(luks2::id(key, "segment", luks2::MAX_KEYSLOTS)?, value)?;
            let slot = match seg.flags.iter().find(|f| f.starts_with("backup-")).map(String::as_str) {
                Some(PREVIOUS) => &mut previous,
                Some(FINAL) => &mut fin,
                Some(other) => return Err(unsupported("segment flag", other)),
                None => {
                    if let Some(flag) = seg.flags.iter().find(|f| *f != HOT) {
                        return Err(unsupported("segment flag", flag));
                    }
                    live.push(seg);
                    continue;
                }
            };
            if slot.replace(seg).is_some() {
                return Err(bad("two backup segments of a kind"));
            }
        }
        let previous = previous.ok_or_else(|| bad("no \"backup-previous\" segment"))?;
        let fin = fin.ok_or_else(|| bad("no \"backup-final\" segment"))?;
        if fin.offset != previous.offset
            || fin.sector_size != previous.sector_size
            || fin.cipher != previous.cipher
            || previous.iv_tweak != 0
            || fin.iv_tweak != 0
        {
            return Err(unsupported("reencryption", "a new cipher, sector size, IV offset or data offset"));
        }

        // The digests: old (the data segment's), new, and the metadata's.
        let bound_to = |seg: u32| -> Vec<&Digest> {
            digests.iter().filter(|(_, segs)| segs.contains(&seg)).map(|(d, _)| d).collect()
        };
        let old = meta.digest.clone();
        let new = match bound_to(fin.id)[..] {
            [d] if d.id != old.id => d.clone(),
            _ => return Err(bad("\"backup-final\" segment: not bound to one new digest")),
        };
        let check = match digests.iter().filter(|(d, _)| d.keyslots.contains(&keyslot)).collect::<Vec<_>>()[..]
        {
            [(d, segs)] if segs.is_empty() && d.keyslots.len() == 1 => d.clone(),
            _ => return Err(bad("reencrypt keyslot: not bound to one metadata digest")),
        };

        // The live segments tile the data area from its start, ids 0, 1, ...
        live.sort_by_key(|s| s.id);
        let data_offset = previous.offset;
        let mut at = data_offset;
        for (i, s) in live.iter().enumerate() {
            let tiles = s.id == i as u32
                && s.offset == at
                && s.iv_tweak == (s.offset - data_offset) / 512
                && s.cipher == previous.cipher
                && s.sector_size == previous.sector_size
                && (s.size.is_some() || i + 1 == live.len());
            if !tiles {
                return Err(bad(format!("segment {}: does not continue the data area", s.id)));
            }
            at = at.checked_add(s.size.unwrap_or(0)).ok_or_else(|| bad("segment sizes overflow"))?;
        }
        if let (Some(total), Some(last)) = (previous.size, live.last()) {
            let end = data_offset.saturating_add(total);
            if last.size.is_some_and(|_| at != end) || at > end {
                return Err(bad("live segments do not cover the data segment"));
            }
        }
        let digest_ids = |s: &Seg| -> Vec<&str> {
            let mut ids: Vec<&str> = bound_to(s.id).iter().map(|d| d.id.as_str()).collect();
            ids.sort_unstable();
            ids
        };
        let (o, n) = (old.id.as_str(), new.id.as_str());
        let mut both = [o, n];
        both.sort_unstable();
        let under = |s: &Seg, id: &str| digest_ids(s) == [id];
        let state = match live.iter().position(|s| s.flags.iter().any(|f| f == HOT)) {
            Some(h) => {
                let hot = &live[h];
                let ok = (h == 0 || (h == 1 && under(&live[0], n)))
                    && digest_ids(hot) == both
                    && live[h + 1..].len() <= 1
                    && live[h + 1..].iter().all(|s| under(s, o));
                let Some(len) = hot.size.filter(|_| ok) else {
                    return Err(bad("in-reencryption segment: not between the new and the old part"));
                };
                // Recovery needs a checksum for each of its blocks (cryptsetup refuses the
                // same when it reads them).
                let blocks = len / u64::from(block);
                if !len.is_multiple_of(u64::from(block)) || blocks.saturating_mul(CHECKSUM_LEN) > area_size {
                    return Err(bad("in-reencryption segment: not whole checksum blocks the area covers"));
                }
                State::Hot { offset: hot.offset - data_offset, len }
            }
            None => match &live[..] {
                [only] if under(only, o) => State::At(0),
                [only] if under(only, n) => State::Done,
                [done, rest] if under(done, n) && under(rest, o) => State::At(done.size.unwrap_or(0)),
                _ => return Err(bad("live segments: not the new part then the old")),
            },
        };
        Ok(Job { keyslot, area_offset, area_size, block, old, new, check, previous, fin, state })
    }

    /// The largest hotzone the checksum area holds.
    pub(crate) fn hotzone_max(&self) -> u64 {
        ((self.area_size / CHECKSUM_LEN) * u64::from(self.block)).min(MAX_HOTZONE)
    }

    /// Does the metadata digest hold with these keys? cryptsetup checks the same before it
    /// resumes a job ("Reencryption metadata is invalid").
    pub(crate) fn check_metadata(&self, old: &[u8], new: &[u8]) -> Result<(), LuksError> {
        let data = verification_data(
            self.area_offset,
            self.area_size,
            self.block,
            &self.previous,
            &self.fin,
            old,
            new,
        );
        if !self.check.matches(&data) {
            return Err(LuksError::Damaged {
                copy: "header",
                reason: "the re-encryption metadata digest does not match (cryptsetup: \"Reencryption metadata is invalid\")"
                    .into(),
            });
        }
        Ok(())
    }
}

impl Digest {
    /// Does `key` hash to this digest?
    pub(crate) fn matches(&self, key: &[u8]) -> bool {
        let mut out = secret(self.digest.len());
        self.hash.pbkdf2(key, &self.salt, self.iterations, &mut out);
        same_bytes(&out, &self.digest)
    }
}

/// What the metadata digest covers, laid out as cryptsetup's
/// reencrypt_assembly_verification_data: 'v', '0' + the requirement's version, the old then
/// the new volume key, the reencrypt keyslot (mode, direction, area type, offset, size, hash,
/// sector_size) and the backup segments, previous then final (type, offset, size or
/// "dynamic", iv_tweak, encryption, sector_size); strings without terminator, numbers
/// big-endian (64 bits, sector sizes 32).
pub(crate) fn verification_data(
    area_offset: u64,
    area_size: u64,
    block: u32,
    previous: &Seg,
    fin: &Seg,
    old: &[u8],
    new: &[u8],
) -> Zeroizing<Vec<u8>> {
    let mut d = Zeroizing::new(Vec::with_capacity(256));
    d.extend_from_slice(&[b'v', b'0' + REQUIREMENT_VERSION]);
    d.extend_from_slice(old);
    d.extend_from_slice(new);
    for s in ["reencrypt", "forward", "checksum"] {
        d.extend_from_slice(s.as_bytes());
    }
    d.extend_from_slice(&area_offset.to_be_bytes());
    d.extend_from_slice(&area_size.to_be_bytes());
    d.extend_from_slice(b"sha256");
    d.extend_from_slice(&block.to_be_bytes());
    for seg in [previous, fin] {
        d.extend_from_slice(b"crypt");
        d.extend_from_slice(&seg.offset.to_be_bytes());
        match seg.size {
            None => d.extend_from_slice(b"dynamic"),
            Some(size) => d.extend_from_slice(&size.to_be_bytes()),
        }
        d.extend_from_slice(&seg.iv_tweak.to_be_bytes());
        d.extend_from_slice(seg.cipher.as_bytes());
        d.extend_from_slice(&seg.sector_size.to_be_bytes());
    }
    d
}

/// A new pbkdf2 digest of `key` (as cryptsetup's, at its minimum iterations: it only
/// identifies a random key), bound to nothing yet.
pub(crate) fn digest_json(key: &[u8], keyslots: &[u32]) -> Value {
    let mut salt = [0u8; luks2::SALT_LEN];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    let mut digest = [0u8; 32];
    Hash::Sha256.pbkdf2(key, &salt, DIGEST_ITERATIONS, &mut digest);
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let keyslots: Vec<String> = keyslots.iter().map(u32::to_string).collect();
    serde_json::json!({
        "type": "pbkdf2", "keyslots": keyslots, "segments": [], "hash": "sha256",
        "iterations": DIGEST_ITERATIONS, "salt": b64(&salt), "digest": b64(&digest),
    })
}

/// A crypt segment's JSON: `at` bytes into the data area, `size` bytes (`None`: to the end).
pub(crate) fn segment_json(like: &Seg, at: u64, size: Option<u64>, flag: Option<&str>) -> Value {
    let mut seg = serde_json::json!({
        "type": "crypt",
        "offset": (like.offset + at).to_string(),
        "size": size.map_or_else(|| "dynamic".to_owned(), |s| s.to_string()),
        "iv_tweak": (at / 512).to_string(),
        "encryption": like.cipher,
        "sector_size": like.sector_size,
    });
    if let (Some(flag), Some(map)) = (flag, seg.as_object_mut()) {
        map.insert("flags".into(), serde_json::json!([flag]));
    }
    seg
}

pub(crate) fn json_map<'a>(
    json: &'a mut Map<String, Value>,
    key: &'static str,
) -> Result<&'a mut Map<String, Value>, LuksError> {
    json.get_mut(key).and_then(Value::as_object_mut).ok_or_else(|| unsupported(key, "not an object"))
}

/// The lowest id from 0 that `map` does not use.
pub(crate) fn free_id(map: &Map<String, Value>, max: u32) -> Result<u32, LuksError> {
    pick_slot(None, max, |n| !map.contains_key(&n.to_string()))
}

/// The largest 4096-aligned gap (offset, size) between the key slots' areas in [start, end).
pub(crate) fn largest_gap(meta: &Meta, start: u64, end: u64) -> Option<(u64, u64)> {
    let mut used: Vec<(u64, u64)> =
        meta.keyslots.values().map(|k| (k.area_offset, k.area_offset + k.area_size)).collect();
    used.push((end, end));
    used.sort();
    let mut best: Option<(u64, u64)> = None;
    let mut at = start;
    for (s, e) in used {
        if s > at && best.is_none_or(|(_, size)| s - at > size) {
            best = Some((at, s - at));
        }
        at = at.max(e.div_ceil(4096) * 4096);
    }
    best
}

/// Replaces the segments with `live` (in order, each with the digests bound to it) followed
/// by the two backup segments, and rebinds every digest to exactly those, as cryptsetup's
/// reencrypt_assign_segments does.
pub(crate) fn set_segments(
    json: &mut Map<String, Value>,
    job: &Job,
    live: Vec<(Value, Vec<&str>)>,
) -> Result<(), LuksError> {
    // The backups are kept as they are: the metadata digest covers them.
    let current = json_map(json, "segments")?;
    let backup =
        |seg: &Seg| current.get(&seg.id.to_string()).cloned().ok_or_else(|| bad("a backup segment lost"));
    let (previous, fin) = (backup(&job.previous)?, backup(&job.fin)?);
    let mut segments = Map::new();
    let mut bindings: Vec<(String, Vec<String>)> = Vec::new();
    let backups = [(previous, vec![job.old.id.as_str()]), (fin, vec![job.new.id.as_str()])];
    for (i, (seg, digests)) in live.into_iter().chain(backups).enumerate() {
        segments.insert(i.to_string(), seg);
        for d in digests {
            match bindings.iter_mut().find(|(id, _)| id == d) {
                Some((_, segs)) => segs.push(i.to_string()),
                None => bindings.push((d.to_owned(), vec![i.to_string()])),
            }
        }
    }
    json.insert("segments".into(), Value::Object(segments));
    for (id, digest) in json_map(json, "digests")?.iter_mut() {
        let segs = bindings.iter().find(|(d, _)| d == id).map(|(_, s)| s.clone()).unwrap_or_default();
        if let Some(d) = digest.as_object_mut() {
            d.insert("segments".into(), serde_json::json!(segs));
        }
    }
    Ok(())
}
