//! LUKS2 online re-encryption metadata, as cryptsetup 2.6 writes, checks and resumes it
//! (`cryptsetup reencrypt`), so that either tool can carry on the other's job. Only the case
//! flashpath runs: mode "reencrypt" (a new volume key; cipher, sector size and data offset
//! unchanged), direction "forward", resilience "checksum" with sha256.
//!
//! What the header holds during a job (docs/luks-format.md, "Online re-encryption metadata"):
//!
//! - `config.requirements.mandatory` has "online-reencrypt-v2", so tools that do not know the
//!   format refuse the volume;
//! - two backup segments, copies of the data segment as it was ("backup-previous", bound to
//!   the old key's digest) and as it will be ("backup-final", bound to the new key's digest);
//! - the live segments tiling the data area: the done part under the new digest, the rest
//!   under the old, and while a hotzone is rewritten the hotzone itself as a segment flagged
//!   "in-reencryption", bound to both digests;
//! - a keyslot of type "reencrypt" (no key; priority ignore) whose area holds the sha256 of each
//!   block (`sector_size`) of the hotzone's old ciphertext;
//! - a digest over the re-encryption parameters and both volume keys, bound to that keyslot:
//!   cryptsetup refuses to resume when it does not match.

mod job;

use job::*;

use crate::crypto::{secret, Hash};
use crate::error::unsupported;
use crate::luks2::{self, bad, strings, Digest, Meta, PREVIOUS, REQUIREMENT};
use crate::volume::{check_new_kdf, luks2_slot, write_slot_material, Header};
use crate::{Kdf, LuksError, MetaIo, Version, Volume, VolumeKey};
use rand::RngCore;
use serde_json::Value;

/// A re-encryption in progress, as the header records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reencryption {
    /// Bytes of the data area (from its start) under the new key. With a hotzone recorded it
    /// is the hotzone's start; when finished, the data size (`u64::MAX` when it runs to the
    /// device's end).
    pub boundary: u64,
    /// Every byte is under the new key: only [`Volume::finish_reencryption`] is left.
    pub finished: bool,
    /// The hotzone (offset, length in bytes from the data area's start) whose rewrite was
    /// interrupted: recover it ([`Volume::reencryption_recovery`]) before going on.
    pub hotzone: Option<(u64, u64)>,
    /// The data area's length, `None` when it runs to the device's end.
    pub data_size: Option<u64>,
    /// The largest hotzone the checksum area has room for (and at most 1 GiB, cryptsetup's
    /// limit).
    pub hotzone_max: u64,
    /// The unit of the hotzone's checksums in bytes (the area's `sector_size`).
    pub checksum_block: u32,
}

/// A hotzone recorded for recovery: (offset, length in bytes from the data area's start, the
/// sha256 of each checksum block of its old ciphertext).
pub type Hotzone = (u64, u64, Vec<[u8; 32]>);

impl Volume {
    /// The job the header records, parsed from its JSON (checked at load by
    /// [`Volume::check_reencryption`]).
    fn job(&self) -> Option<Job> {
        self.parse_job().ok().flatten()
    }

    fn parse_job(&self) -> Result<Option<Job>, LuksError> {
        match &self.header {
            Header::V2(c) => match &c.meta.reencrypt {
                Some(input) => {
                    Job::parse(&c.json, &c.meta, input.metadata_end, input.digests.clone()).map(Some)
                }
                None => Ok(None),
            },
            Header::V1(_) => Ok(None),
        }
    }

    /// Checks the re-encryption metadata of a header just read or changed: refused as a
    /// damaged or unsupported header, as the rest of its checks are.
    pub(crate) fn check_reencryption(&self) -> Result<(), LuksError> {
        self.parse_job().map(|_| ())
    }

    /// Is an online re-encryption in progress?
    pub(crate) fn reencrypting(&self) -> bool {
        self.job().is_some()
    }

    fn job_or_err(&self) -> Result<Job, LuksError> {
        self.job().ok_or_else(|| unsupported("reencryption", "none in progress"))
    }

    /// `Some` while the header says a re-encryption is in progress.
    pub fn reencryption(&self) -> Option<Reencryption> {
        let job = self.job()?;
        let data_size = job.previous.size;
        let (boundary, finished, hotzone) = match job.state {
            State::At(b) => (b, false, None),
            State::Hot { offset, len } => (offset, false, Some((offset, len))),
            State::Done => (data_size.unwrap_or(u64::MAX), true, None),
        };
        Some(Reencryption {
            boundary,
            finished,
            hotzone,
            data_size,
            hotzone_max: job.hotzone_max(),
            checksum_block: job.block,
        })
    }

    /// The key behind `digest` that `passphrase` opens (the digest's slots in order, those
    /// `usable` allows).
    fn open_digest(
        &self,
        io: &mut dyn MetaIo,
        digest: &Digest,
        passphrase: &[u8],
        usable: &dyn Fn(u32) -> bool,
    ) -> Result<VolumeKey, LuksError> {
        for &n in digest.keyslots.iter().filter(|&&n| usable(n)) {
            if let Some(key) = self.slot_key(io, n, passphrase)? {
                if digest.matches(&key) {
                    return Ok(VolumeKey(key));
                }
            }
        }
        Err(LuksError::WrongPassphrase)
    }

    /// The old and the new volume key of a volume in re-encryption, from one passphrase
    /// (a slot bound to each digest), the metadata digest checked with them.
    pub fn unlock_reencryption(
        &self,
        io: &mut dyn MetaIo,
        passphrase: &[u8],
    ) -> Result<(VolumeKey, VolumeKey), LuksError> {
        self.unlock_reencryption_with(io, passphrase, &|_| true)
    }

    /// [`Volume::unlock_reencryption`] trying only the key slots `usable` allows (a caller
    /// that refuses to run some slots' KDF, e.g. one asking for more memory than the host
    /// has): a passphrase that opens only refused slots gives [`LuksError::WrongPassphrase`].
    pub fn unlock_reencryption_with(
        &self,
        io: &mut dyn MetaIo,
        passphrase: &[u8],
        usable: &dyn Fn(u32) -> bool,
    ) -> Result<(VolumeKey, VolumeKey), LuksError> {
        let job = self.job_or_err()?;
        let old = self.open_digest(io, &job.old, passphrase, usable)?;
        let new = self.open_digest(io, &job.new, passphrase, usable)?;
        job.check_metadata(old.as_bytes(), new.as_bytes())?;
        Ok((old, new))
    }

    /// Changes the checksum block (the reencrypt keyslot area's `sector_size`) between steps,
    /// and writes the metadata digest again, as cryptsetup does when it resumes a job with
    /// another alignment (LUKS2_keyslot_reencrypt_update): e.g. to hash a job cryptsetup began
    /// on a file (4096-byte blocks) in the data's 512-byte sectors. `block` is a power of two,
    /// a multiple of the data's sector size, at most 1 MiB. `keys` are the job's (old, new).
    pub fn reencryption_set_checksum_block(
        &mut self,
        io: &mut dyn MetaIo,
        keys: (&VolumeKey, &VolumeKey),
        block: u32,
    ) -> Result<(), LuksError> {
        let job = self.job_or_err()?;
        job.check_metadata(keys.0.as_bytes(), keys.1.as_bytes())?;
        if matches!(job.state, State::Hot { .. }) {
            return Err(unsupported("checksum block", "a hotzone is recorded: recover it and advance first"));
        }
        let sector = job.previous.sector_size;
        if !block.is_power_of_two() || block < sector || block > 1 << 20 {
            return Err(unsupported(
                "checksum block",
                format_args!("{block} (a power of two from the sector size {sector} to 1 MiB)"),
            ));
        }
        let data = verification_data(
            job.area_offset,
            job.area_size,
            block,
            &job.previous,
            &job.fin,
            keys.0.as_bytes(),
            keys.1.as_bytes(),
        );
        let mut next = self.clone();
        let Header::V2(c) = &mut next.header else { unreachable!("a job is LUKS2") };
        let slot = json_map(&mut c.json, "keyslots")?
            .get_mut(&job.keyslot.to_string())
            .and_then(|k| k.get_mut("area"))
            .and_then(Value::as_object_mut)
            .ok_or_else(|| bad("reencrypt keyslot: no area"))?;
        slot.insert("sector_size".into(), serde_json::json!(block));
        json_map(&mut c.json, "digests")?.insert(job.check.id.clone(), digest_json(&data, &[job.keyslot]));
        next.write_header(io)?;
        *self = next;
        Ok(())
    }

    /// Starts a re-encryption to a random new volume key (of the old one's size), as
    /// `cryptsetup reencrypt --resilience checksum` (sha256) starts one: for each passphrase
    /// (each must open a slot of the volume) a new slot with `kdf` bound to the new key's
    /// digest, the backup segments, the reencrypt keyslot over the largest free part of the
    /// key slots area (checksum blocks of the data's sector size), the metadata digest and
    /// the requirement, in one header write after the new slots' material is flushed.
    /// Returns the new key.
    pub fn begin_reencryption(
        &mut self,
        io: &mut dyn MetaIo,
        old: &VolumeKey,
        passphrases: &[&[u8]],
        kdf: &Kdf,
    ) -> Result<VolumeKey, LuksError> {
        if self.version() != Version::Luks2 {
            return Err(unsupported("reencryption", "LUKS1 (convert the volume to LUKS2 first)"));
        }
        if self.reencrypting() {
            return Err(LuksError::Reencrypting);
        }
        if passphrases.is_empty() {
            return Err(unsupported("reencryption", "no passphrase for the new key"));
        }
        check_new_kdf(Version::Luks2, kdf)?;
        if !self.key_matches(old.as_bytes()) {
            return Err(unsupported("volume key", "does not match the volume's digest"));
        }
        for passphrase in passphrases {
            self.unlock(io, passphrase, None)?;
        }
        let mut new = VolumeKey(secret(old.as_bytes().len()));
        rand::rngs::OsRng.fill_bytes(&mut new.0);
        let af_hash = match kdf {
            Kdf::Pbkdf2 { hash, .. } => Hash::parse("kdf hash", hash)?,
            Kdf::Argon2 { .. } => Hash::Sha256,
        };
        let mut next = self.clone();
        let Header::V2(c) = &mut next.header else { unreachable!("checked LUKS2 above") };
        let hdr_size = c.bin.hdr_size;

        // The new key's digest and slots.
        let new_digest = free_id(json_map(&mut c.json, "digests")?, luks2::MAX_DIGESTS as u32)?;
        let mut new_slots = Vec::new();
        for passphrase in passphrases {
            let mut salt = vec![0u8; luks2::SALT_LEN];
            rand::rngs::OsRng.fill_bytes(&mut salt);
            let n = free_id(json_map(&mut c.json, "keyslots")?, luks2::MAX_KEYSLOTS)?;
            let (offset, slot) = luks2_slot(&c.meta, hdr_size, new.as_bytes().len(), af_hash, kdf, &salt)?;
            write_slot_material(io, offset, &new, passphrase, &salt, kdf, af_hash)?;
            json_map(&mut c.json, "keyslots")?.insert(n.to_string(), slot);
            new_slots.push(n);
            json_map(&mut c.json, "digests")?
                .insert(new_digest.to_string(), digest_json(new.as_bytes(), &new_slots));
            // Parsed again so that the next slot's area avoids this one.
            c.meta = Meta::parse(&c.json, hdr_size)?;
        }

        // The reencrypt keyslot over the largest free part of the key slots area.
        let start = 2 * hdr_size;
        let (area_offset, area_size) = largest_gap(&c.meta, start, start + c.meta.keyslots_size)
            .filter(|&(_, size)| size >= 4096)
            .ok_or(LuksError::NoFreeSlot)?;
        let block = c.meta.segment.sector_size;
        let keyslot = free_id(json_map(&mut c.json, "keyslots")?, luks2::MAX_KEYSLOTS)?;
        json_map(&mut c.json, "keyslots")?.insert(
            keyslot.to_string(),
            serde_json::json!({
                "type": "reencrypt", "key_size": 1, "mode": "reencrypt", "direction": "forward",
                "priority": 0,
                "area": {
                    "type": "checksum", "offset": area_offset.to_string(), "size": area_size.to_string(),
                    "hash": "sha256", "sector_size": block,
                },
            }),
        );

        // The backup segments: the data segment as it is (flagged) and as it will be.
        let segment_id = c.meta.segment_id.clone();
        let segments = json_map(&mut c.json, "segments")?;
        let mut previous_json = segments.get(&segment_id).cloned().ok_or_else(|| bad("no data segment"))?;
        let prev_id = free_id(segments, luks2::MAX_KEYSLOTS)?;
        let fin_id = prev_id + 1;
        let s = &c.meta.segment;
        let previous = Seg {
            id: prev_id,
            offset: s.offset,
            size: s.size,
            iv_tweak: 0,
            cipher: s.cipher.clone(),
            sector_size: s.sector_size,
            flags: vec![PREVIOUS.into()],
        };
        let fin = Seg { id: fin_id, size: None, flags: vec![FINAL.into()], ..previous.clone() };
        if let Some(map) = previous_json.as_object_mut() {
            let mut flags =
                map.get("flags").map(|f| strings(f, "segment.flags")).transpose()?.unwrap_or_default();
            flags.push(PREVIOUS.into());
            map.insert("flags".into(), serde_json::json!(flags));
        }
        segments.insert(prev_id.to_string(), previous_json);
        segments.insert(fin_id.to_string(), segment_json(&fin, 0, None, Some(FINAL)));
        let old_digest = c.meta.digest.id.clone();
        for (id, digest) in json_map(&mut c.json, "digests")?.iter_mut() {
            let add = if *id == old_digest {
                prev_id
            } else if *id == new_digest.to_string() {
                fin_id
            } else {
                continue;
            };
            if let Some(list) = digest.get_mut("segments").and_then(Value::as_array_mut) {
                list.push(Value::String(add.to_string()));
            }
        }

        // The metadata digest, bound to the reencrypt keyslot.
        let data =
            verification_data(area_offset, area_size, block, &previous, &fin, old.as_bytes(), new.as_bytes());
        let check = free_id(json_map(&mut c.json, "digests")?, luks2::MAX_DIGESTS as u32)?;
        json_map(&mut c.json, "digests")?.insert(check.to_string(), digest_json(&data, &[keyslot]));

        // The requirement: from here on only tools that know the job open the volume.
        let config = json_map(&mut c.json, "config")?;
        let requirements = config
            .entry("requirements")
            .or_insert_with(|| serde_json::json!({}))
            .as_object_mut()
            .ok_or_else(|| unsupported("config.requirements", "not an object"))?;
        let mandatory = requirements
            .entry("mandatory")
            .or_insert_with(|| serde_json::json!([]))
            .as_array_mut()
            .ok_or_else(|| unsupported("config.requirements.mandatory", "not an array"))?;
        mandatory.push(Value::String(REQUIREMENT.into()));

        next.write_header(io)?;
        *self = next;
        Ok(new)
    }

    /// The data area's length on this device.
    fn reencryption_end(&self, io: &dyn MetaIo) -> u64 {
        self.data_size(io.size())
    }

    /// Records the next hotzone, [offset, offset + len) of the data area, before its data is
    /// rewritten, as cryptsetup's step does: the sha256 of each checksum block of its old
    /// ciphertext into the reencrypt keyslot's area (flushed), then the header with the
    /// hotzone as an "in-reencryption" segment. `offset` must be the boundary.
    ///
    /// No key is needed: the metadata digest covers only what [`Volume::begin_reencryption`]
    /// fixed (the checksum area and the backup segments), never the moving segments, so it is
    /// written once and checked by [`Volume::unlock_reencryption`].
    pub fn reencryption_hotzone(
        &mut self,
        io: &mut dyn MetaIo,
        offset: u64,
        len: u64,
        sha256: &[[u8; 32]],
    ) -> Result<(), LuksError> {
        let job = self.job_or_err()?;
        let boundary = match job.state {
            State::At(b) => b,
            State::Hot { .. } => {
                return Err(unsupported("hotzone", "one is recorded already: recover it and advance first"))
            }
            State::Done => return Err(unsupported("hotzone", "the re-encryption is complete")),
        };
        let end = self.reencryption_end(io);
        let block = u64::from(job.block);
        if offset != boundary
            || len == 0
            || !len.is_multiple_of(block)
            || len > job.hotzone_max()
            || offset + len > end
        {
            return Err(unsupported(
                "hotzone",
                format_args!(
                    "{offset}+{len}: must start at the boundary {boundary}, be whole {block}-byte blocks, \
                     at most {} bytes and end by {end}",
                    job.hotzone_max()
                ),
            ));
        }
        if sha256.len() as u64 != len / block {
            return Err(unsupported(
                "hotzone",
                format_args!("{} checksums for {} blocks", sha256.len(), len / block),
            ));
        }
        io.write_at(job.area_offset, sha256.concat().as_slice())?;
        io.flush()?;
        let (o, n) = (job.old.id.as_str(), job.new.id.as_str());
        let size = |at: u64| job.previous.size.map(|total| total - at);
        let mut live = Vec::new();
        if offset > 0 {
            live.push((segment_json(&job.previous, 0, Some(offset), None), vec![n]));
        }
        live.push((segment_json(&job.previous, offset, Some(len), Some(HOT)), vec![n, o]));
        if offset + len < end {
            live.push((segment_json(&job.previous, offset + len, size(offset + len), None), vec![o]));
        }
        self.commit_segments(io, &job, live)
    }

    /// The hotzone is rewritten and its data flushed: [0, boundary) is under the new key
    /// (the header's segments moved, as after cryptsetup's step).
    pub fn reencryption_advance(&mut self, io: &mut dyn MetaIo, boundary: u64) -> Result<(), LuksError> {
        let job = self.job_or_err()?;
        match job.state {
            State::Hot { offset, len } if offset + len == boundary => {}
            State::Hot { offset, len } => {
                return Err(unsupported(
                    "boundary",
                    format_args!("{boundary}: the recorded hotzone ends at {}", offset + len),
                ))
            }
            _ => return Err(unsupported("boundary", "no hotzone recorded")),
        }
        let end = self.reencryption_end(io);
        let (o, n) = (job.old.id.as_str(), job.new.id.as_str());
        let live = if boundary < end {
            vec![
                (segment_json(&job.previous, 0, Some(boundary), None), vec![n]),
                (
                    segment_json(&job.previous, boundary, job.previous.size.map(|t| t - boundary), None),
                    vec![o],
                ),
            ]
        } else {
            vec![(segment_json(&job.previous, 0, job.previous.size, None), vec![n])]
        };
        self.commit_segments(io, &job, live)
    }

    fn commit_segments(
        &mut self,
        io: &mut dyn MetaIo,
        job: &Job,
        live: Vec<(Value, Vec<&str>)>,
    ) -> Result<(), LuksError> {
        let mut next = self.clone();
        let Header::V2(c) = &mut next.header else { unreachable!("a job is LUKS2") };
        set_segments(&mut c.json, job, live)?;
        next.write_header(io)?;
        *self = next;
        Ok(())
    }

    /// The hotzone recorded for recovery, if one is: (offset, length, the sha256 of each
    /// checksum block of its old ciphertext). A block whose data still hashes to its
    /// checksum holds old ciphertext; any other was rewritten under the new key.
    pub fn reencryption_recovery(&self, io: &mut dyn MetaIo) -> Result<Option<Hotzone>, LuksError> {
        let job = self.job_or_err()?;
        let State::Hot { offset, len } = job.state else { return Ok(None) };
        let count = len / u64::from(job.block);
        if count.checked_mul(CHECKSUM_LEN).is_none_or(|n| n > job.area_size) {
            return Err(bad("in-reencryption segment: longer than the checksum area covers"));
        }
        let mut raw = vec![0u8; (count * CHECKSUM_LEN) as usize];
        io.read_at(job.area_offset, &mut raw)?;
        let sums = raw
            .chunks_exact(CHECKSUM_LEN as usize)
            .map(|c| {
                let mut sum = [0u8; 32];
                sum.copy_from_slice(c);
                sum
            })
            .collect();
        Ok(Some((offset, len, sums)))
    }

    /// Ends a complete re-encryption as cryptsetup does: one data segment under the new key,
    /// the old key's slots and digest, the reencrypt keyslot, its digest, the backup
    /// segments and the requirement gone (one header write), then the removed slots' areas
    /// wiped. A plain LUKS2 volume again.
    pub fn finish_reencryption(&mut self, io: &mut dyn MetaIo, new: &VolumeKey) -> Result<(), LuksError> {
        let job = self.job_or_err()?;
        if !job.new.matches(new.as_bytes()) {
            return Err(unsupported("volume key", "does not match the re-encryption's new digest"));
        }
        if job.state != State::Done {
            return Err(unsupported("reencryption", "not complete"));
        }
        let mut next = self.clone();
        let Header::V2(c) = &mut next.header else { unreachable!("a job is LUKS2") };
        let mut wipe: Vec<(u64, u64)> = vec![(job.area_offset, job.area_size)];
        let gone: Vec<u32> = job.old.keyslots.iter().copied().chain([job.keyslot]).collect();
        for n in &gone {
            if let Some(k) = c.meta.keyslots.get(n) {
                wipe.push((k.area_offset, k.area_size));
            }
            json_map(&mut c.json, "keyslots")?.remove(&n.to_string());
        }
        let digests = json_map(&mut c.json, "digests")?;
        digests.remove(&job.old.id);
        digests.remove(&job.check.id);
        if let Some(d) = digests.get_mut(&job.new.id).and_then(Value::as_object_mut) {
            d.insert("segments".into(), serde_json::json!(["0"]));
        }
        let mut segment = segment_json(&job.previous, 0, job.previous.size, None);
        if let Some(map) = segment.as_object_mut() {
            // Flags of the data segment other than the job's own stay.
            let kept: Vec<&String> = job.previous.flags.iter().filter(|f| *f != PREVIOUS).collect();
            if !kept.is_empty() {
                map.insert("flags".into(), serde_json::json!(kept));
            }
        }
        c.json.insert("segments".into(), serde_json::json!({ "0": segment }));
        // Tokens bound to removed slots lose them, as when cryptsetup destroys a slot.
        for (_, token) in json_map(&mut c.json, "tokens")?.iter_mut() {
            if let Some(slots) = token.get_mut("keyslots").and_then(Value::as_array_mut) {
                slots.retain(|v| !gone.iter().any(|n| v.as_str() == Some(n.to_string().as_str())));
            }
        }
        let config = json_map(&mut c.json, "config")?;
        if let Some(req) = config.get_mut("requirements").and_then(Value::as_object_mut) {
            if let Some(list) = req.get_mut("mandatory").and_then(Value::as_array_mut) {
                list.retain(|v| v.as_str() != Some(REQUIREMENT));
                if list.is_empty() {
                    req.remove("mandatory");
                }
            }
            if req.is_empty() {
                config.remove("requirements");
            }
        }
        next.write_header(io)?;
        *self = next;
        let zeroes = vec![0u8; 1 << 20];
        for (offset, size) in wipe {
            let mut at = 0;
            while at < size {
                let n = (size - at).min(zeroes.len() as u64);
                io.write_at(offset + at, &zeroes[..n as usize])?;
                at += n;
            }
        }
        io.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{format, FormatOptions, MemIo};

    const PASS: &[u8] = b"hunter2";

    fn volume(sector_size: u32) -> (MemIo, Volume, VolumeKey) {
        let mut io = MemIo(vec![0u8; 20 << 20]);
        let opts = FormatOptions {
            version: Version::Luks2,
            cipher: "aes-xts-plain64".into(),
            key_bits: 512,
            sector_size,
            kdf: kdf(),
            label: None,
            uuid: None,
        };
        let (v, key) = format(&mut io, &opts, PASS).expect("format");
        (io, v, key)
    }

    fn kdf() -> Kdf {
        Kdf::Pbkdf2 { hash: "sha256".into(), iterations: 1000 }
    }

    #[test]
    fn a_job_goes_through_its_states_and_reloads_at_each() {
        let (mut io, mut v, old) = volume(4096);
        let new = v.begin_reencryption(&mut io, &old, &[PASS], &kdf()).expect("begin");
        let end = v.data_size(io.size());
        let r = v.reencryption().expect("in re-encryption");
        assert_eq!(
            (r.boundary, r.finished, r.hotzone, r.data_size, r.checksum_block),
            (0, false, None, None, 4096)
        );
        assert!(matches!(v.unlock(&mut io, PASS, None), Err(LuksError::Reencrypting)));
        let (o, n) = v.unlock_reencryption(&mut io, PASS).expect("both keys");
        assert_eq!((o.as_bytes(), n.as_bytes()), (old.as_bytes(), new.as_bytes()));
        // Slot 0 holds the old key, slot 1 the new one: refusing either leaves one digest unopened.
        for refused in [0, 1] {
            assert!(matches!(
                v.unlock_reencryption_with(&mut io, PASS, &|n| n != refused),
                Err(LuksError::WrongPassphrase)
            ));
        }

        let zone = 1 << 20;
        let sums = vec![[7u8; 32]; (zone / 4096) as usize];
        v.reencryption_hotzone(&mut io, 0, zone, &sums).expect("hotzone");
        let loaded = Volume::load(&mut io).expect("load hot");
        assert_eq!(loaded.reencryption().and_then(|r| r.hotzone), Some((0, zone)));
        assert_eq!(loaded.reencryption_recovery(&mut io).expect("recovery"), Some((0, zone, sums.clone())));
        v.reencryption_advance(&mut io, zone).expect("advance");
        assert_eq!(Volume::load(&mut io).expect("load").reencryption().map(|r| r.boundary), Some(zone));

        // The rest in one hotzone, ending at the data's end.
        let rest = end - zone;
        let sums = vec![[1u8; 32]; (rest / 4096) as usize];
        v.reencryption_hotzone(&mut io, zone, rest, &sums).expect("last hotzone");
        assert_eq!(
            Volume::load(&mut io).expect("load").reencryption().and_then(|r| r.hotzone),
            Some((zone, rest))
        );
        v.reencryption_advance(&mut io, end).expect("advance to the end");
        assert!(Volume::load(&mut io).expect("load").reencryption().is_some_and(|r| r.finished));

        v.finish_reencryption(&mut io, &new).expect("finish");
        let v = Volume::load(&mut io).expect("load plain");
        assert!(v.reencryption().is_none());
        let (key, slot) = v.unlock(&mut io, PASS, None).expect("unlock");
        assert_eq!((key.as_bytes(), slot), (new.as_bytes(), 1));
        assert_eq!(v.keyslots().len(), 1);
    }

    #[test]
    fn out_of_order_steps_are_refused() {
        let (mut io, mut v, old) = volume(512);
        let new = v.begin_reencryption(&mut io, &old, &[PASS], &kdf()).expect("begin");
        let sums = vec![[0u8; 32]; 8];
        // Not at the boundary; checksums not matching the blocks; no hotzone to advance past.
        assert!(v.reencryption_hotzone(&mut io, 4096, 4096, &sums).is_err());
        assert!(v.reencryption_hotzone(&mut io, 0, 4096, &sums[..7]).is_err());
        assert!(v.reencryption_advance(&mut io, 4096).is_err());
        assert!(v.finish_reencryption(&mut io, &new).is_err());
        v.reencryption_hotzone(&mut io, 0, 4096, &sums).expect("hotzone");
        assert!(v.reencryption_hotzone(&mut io, 4096, 4096, &sums).is_err());
        assert!(v.reencryption_advance(&mut io, 8192).is_err());
        assert!(v.add_keyslot(&mut io, &new, b"x", None, &kdf()).is_err());
    }

    #[test]
    fn a_hotzone_the_checksum_area_cannot_cover_is_damage() {
        let (mut io, mut v, old) = volume(4096);
        v.begin_reencryption(&mut io, &old, &[PASS], &kdf()).expect("begin");
        v.reencryption_hotzone(&mut io, 0, 8192, &[[0u8; 32]; 2]).expect("hotzone");
        // The area shrunk below the hotzone's two checksums.
        let Header::V2(c) = &mut v.header else { unreachable!() };
        let slot =
            c.json["keyslots"].as_object_mut().and_then(|k| k.get_mut("2")).expect("reencrypt keyslot");
        slot["area"]["size"] = serde_json::json!("32");
        let err = v.write_header(&mut io).expect_err("refused before it is written");
        assert!(err.to_string().contains("checksum blocks"), "{err}");
    }

    #[test]
    fn a_changed_job_fails_the_metadata_digest() {
        let (mut io, mut v, old) = volume(4096);
        let new = v.begin_reencryption(&mut io, &old, &[PASS], &kdf()).expect("begin");
        // Another tool's edit of the checksum block size (a parameter the digest covers).
        let Header::V2(c) = &mut v.header else { unreachable!() };
        let slot =
            c.json["keyslots"].as_object_mut().and_then(|k| k.get_mut("2")).expect("reencrypt keyslot");
        slot["area"]["sector_size"] = serde_json::json!(512);
        v.write_header(&mut io).expect("write");
        let v = Volume::load(&mut io).expect("load");
        let err = v.unlock_reencryption(&mut io, PASS).expect_err("digest must not match");
        assert!(err.to_string().contains("metadata digest"), "{err}");
        let _ = new;
    }
}
