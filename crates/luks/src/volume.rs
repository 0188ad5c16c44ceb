//! A volume's headers, key slots and formatting: [`Volume`] opens and changes an existing
//! volume, [`format`] writes a new one.

use crate::af::{self, STRIPES};

use crate::crypto::{self, secret, Hash};
use crate::error::unsupported;
use crate::{luks1, luks2, Kdf, LuksError, MetaIo};
use rand::RngCore;
use serde_json::Value;
use zeroize::Zeroizing;

/// The iterations of the volume key's digest (cryptsetup's minimum, LUKS_MKD_ITERATIONS_MIN):
/// the digest only checks a random key, so its cost guards nothing.
pub(crate) const DIGEST_ITERATIONS: u32 = 1000;
/// A new LUKS2 volume's copy size (16 KiB: a 12 KiB JSON area) and data offset (16 MiB), as
/// cryptsetup 2.6's defaults; the key slots area fills the space between.
pub(crate) const LUKS2_COPY_SIZE: u64 = 0x4000;
pub(crate) const LUKS2_DATA_OFFSET: u64 = 16 << 20;
/// cryptsetup's minimum PBKDF2 iterations and Argon2 time and memory for a new key slot.
pub(crate) const MIN_PBKDF2_ITERATIONS: u32 = 1000;
pub(crate) const MIN_ARGON2_TIME: u32 = 4;
pub(crate) const MIN_ARGON2_MEMORY_KIB: u32 = 32;

/// The LUKS version of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// LUKS1 (also QEMU's `luks` driver format).
    Luks1,
    /// LUKS2 (cryptsetup's default since 2.1).
    Luks2,
}

/// What [`format()`] makes.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// LUKS1 or LUKS2.
    pub version: Version,
    /// "aes-xts-plain64" only for now.
    pub cipher: String,
    /// 256 or 512 (AES-128 or AES-256 XTS).
    pub key_bits: u32,
    /// The data's encryption unit: 512, 1024, 2048 or 4096 (LUKS1: 512 only).
    pub sector_size: u32,
    /// Key slot 0's key derivation.
    pub kdf: Kdf,
    /// The LUKS2 label (at most 47 bytes); LUKS1 has none.
    pub label: Option<String>,
    /// The volume's UUID; a random one when `None`.
    pub uuid: Option<String>,
}

/// The volume (master) key. Wiped when dropped; its bytes are never printed.
#[derive(Clone)]
pub struct VolumeKey(pub(crate) Zeroizing<Vec<u8>>);

impl VolumeKey {
    /// The key's bytes: XTS's data key then its tweak key.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// A key given by the caller (32 or 64 bytes), e.g. to add a slot to a volume whose key
    /// is known.
    pub fn from_bytes(bytes: &[u8]) -> Result<VolumeKey, LuksError> {
        if bytes.len() != 32 && bytes.len() != 64 {
            return Err(unsupported("key_size", format_args!("{} bytes", bytes.len())));
        }
        Ok(VolumeKey(Zeroizing::new(bytes.to_vec())))
    }
}

impl std::fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VolumeKey({} bits)", self.0.len() * 8)
    }
}

/// One active key slot, as [`Volume::keyslots`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyslotInfo {
    /// The slot's number.
    pub slot: u32,
    /// Its key derivation.
    pub kdf: Kdf,
    /// The volume key's size it holds, in bits.
    pub key_bits: u32,
    /// LUKS2's priority: "ignore" (tried only when named), "normal", "prefer" (tried first);
    /// `None` when the header has none (LUKS1, or LUKS2 without the field: normal).
    pub priority: Option<String>,
    /// Where its key material lies on the device, in bytes.
    pub area_offset: u64,
    /// The key material area's length in bytes.
    pub area_size: u64,
}

#[derive(Clone, Debug)]
pub(crate) enum Header {
    V1(Box<luks1::Header>),
    V2(Box<luks2::Copy>),
}

/// An opened (loaded and checked) LUKS volume header.
#[derive(Clone, Debug)]
pub struct Volume {
    pub(crate) header: Header,
    /// The composed cipher name ("aes-xts-plain64").
    cipher: String,
}

/// A slot's key material as this crate handles it, for both versions.
struct SlotArea {
    kdf: Kdf,
    salt: Vec<u8>,
    key_len: usize,
    af_hash: Hash,
    offset: u64,
    area_key_len: usize,
}

impl Volume {
    /// Reads and checks the header: LUKS1, or LUKS2 from the newer of its two valid copies
    /// (the secondary when the primary is damaged, looked for at every offset the spec allows
    /// when the primary is unreadable).
    pub fn load(io: &mut dyn MetaIo) -> Result<Volume, LuksError> {
        let size = io.size();
        if size < luks1::HEADER_LEN as u64 {
            return Err(LuksError::NotLuks);
        }
        let mut first = vec![0u8; luks2::BIN_LEN.min(size as usize)];
        io.read_at(0, &mut first)?;
        // Version 1 is LUKS1; any other version under the LUKS magic is read as a LUKS2
        // primary, so that a damaged version field falls back to the secondary copy (a newer
        // version with no readable LUKS2 secondary is NewerVersion).
        if &first[..6] == luks1::MAGIC && u16::from_be_bytes([first[6], first[7]]) == 1 {
            return Volume::from_header(Header::V1(Box::new(luks1::Header::parse(&first)?)));
        }
        Volume::load_luks2(io, &first)
    }

    fn load_luks2(io: &mut dyn MetaIo, first: &[u8]) -> Result<Volume, LuksError> {
        let size = io.size();
        let primary_magic = &first[..6] == luks2::MAGIC_PRIMARY;
        let primary = if primary_magic {
            read_copy(io, 0, first)
        } else {
            Err(LuksError::Damaged { copy: "primary", reason: "magic".into() })
        };
        // The secondary sits at the primary's size; with no readable primary, at any of the
        // sizes a copy may have.
        let offsets: Vec<u64> = match &primary {
            Ok(copy) => vec![copy.bin.hdr_size],
            Err(_) => luks2::COPY_SIZES.to_vec(),
        };
        let mut secondary = Err(LuksError::Damaged { copy: "secondary", reason: "not found".into() });
        let mut saw_secondary_magic = false;
        for offset in offsets {
            if offset + luks2::BIN_LEN as u64 > size {
                break;
            }
            let mut bin = vec![0u8; luks2::BIN_LEN];
            io.read_at(offset, &mut bin)?;
            if &bin[..6] != luks2::MAGIC_SECONDARY {
                continue;
            }
            saw_secondary_magic = true;
            secondary = read_copy(io, offset, &bin);
            if secondary.is_ok() {
                break;
            }
        }
        if !primary_magic && !saw_secondary_magic {
            return Err(LuksError::NotLuks);
        }
        // A copy that is intact (its checksum holds) but asks for what this build lacks is
        // authoritative: the other copy is not used in its place.
        let refused = |r: &Result<luks2::Copy, LuksError>| matches!(r, Err(LuksError::Unsupported { .. }));
        if refused(&primary) || refused(&secondary) {
            let e = if refused(&primary) { primary } else { secondary };
            return Err(e.err().unwrap_or(LuksError::NotLuks));
        }
        let chosen = match (primary, secondary) {
            // Updates write the primary first: the higher seqid is the newer header.
            (Ok(p), Ok(s)) => {
                if s.bin.seqid > p.bin.seqid {
                    s
                } else {
                    p
                }
            }
            (Ok(p), Err(_)) => p,
            (Err(_), Ok(s)) => s,
            (Err(p @ LuksError::NewerVersion(_)), Err(_)) => return Err(p),
            (Err(p), Err(s)) => {
                return Err(LuksError::Damaged {
                    copy: "both",
                    reason: format!("primary: {}; secondary: {}", reason(&p), reason(&s)),
                })
            }
        };
        Volume::from_header(Header::V2(Box::new(chosen)))
    }

    fn from_header(header: Header) -> Result<Volume, LuksError> {
        let cipher = match &header {
            Header::V1(h) => format!("{}-{}", h.cipher_name, h.cipher_mode),
            Header::V2(c) => c.meta.segment.cipher.clone(),
        };
        let volume = Volume { header, cipher };
        volume.check_reencryption()?;
        Ok(volume)
    }

    /// LUKS1 or LUKS2.
    pub fn version(&self) -> Version {
        match self.header {
            Header::V1(_) => Version::Luks1,
            Header::V2(_) => Version::Luks2,
        }
    }

    /// The volume's UUID.
    pub fn uuid(&self) -> &str {
        match &self.header {
            Header::V1(h) => &h.uuid,
            Header::V2(c) => &c.bin.uuid,
        }
    }

    /// The LUKS2 label, if not empty.
    pub fn label(&self) -> Option<&str> {
        match &self.header {
            Header::V1(_) => None,
            Header::V2(c) => Some(c.bin.label.as_str()).filter(|l| !l.is_empty()),
        }
    }

    /// The data segment's cipher ("aes-xts-plain64").
    pub fn cipher(&self) -> &str {
        &self.cipher
    }

    /// The volume key's size in bits (LUKS2: of the key slots bound to the data segment; 0
    /// when it has none).
    pub fn key_bits(&self) -> u32 {
        match &self.header {
            Header::V1(h) => h.key_bytes * 8,
            Header::V2(c) => {
                let meta = &c.meta;
                meta.digest.keyslots.iter().find_map(|n| meta.keyslots.get(n)).map_or(0, |k| k.key_size * 8)
            }
        }
    }

    /// The data's encryption unit in bytes (LUKS1: 512).
    pub fn sector_size(&self) -> u32 {
        match &self.header {
            Header::V1(_) => 512,
            Header::V2(c) => c.meta.segment.sector_size,
        }
    }

    /// Where the data starts, in bytes from the device's start.
    pub fn data_offset(&self) -> u64 {
        match &self.header {
            Header::V1(h) => u64::from(h.payload_offset) * 512,
            Header::V2(c) => c.meta.segment.offset,
        }
    }

    /// The data's length on a device of `device_size` bytes: to the end of the device (LUKS1,
    /// LUKS2 "dynamic"), or the segment's size (never past the device's end), rounded down to
    /// whole sectors.
    pub fn data_size(&self, device_size: u64) -> u64 {
        let to_end = device_size.saturating_sub(self.data_offset());
        let size = match &self.header {
            Header::V2(c) => c.meta.segment.size.map_or(to_end, |s| s.min(to_end)),
            Header::V1(_) => to_end,
        };
        size - size % u64::from(self.sector_size())
    }

    /// The active key slots, in slot order.
    pub fn keyslots(&self) -> Vec<KeyslotInfo> {
        match &self.header {
            Header::V1(h) => h
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.active)
                .map(|(i, s)| KeyslotInfo {
                    slot: i as u32,
                    kdf: Kdf::Pbkdf2 { hash: h.hash.name().to_owned(), iterations: s.iterations },
                    key_bits: h.key_bytes * 8,
                    priority: None,
                    area_offset: u64::from(s.offset) * 512,
                    area_size: u64::from(luks1::material_sectors(h.key_bytes)) * 512,
                })
                .collect(),
            Header::V2(c) => c
                .meta
                .keyslots
                .iter()
                .map(|(n, k)| KeyslotInfo {
                    slot: *n,
                    kdf: k.kdf.clone(),
                    key_bits: k.key_size * 8,
                    priority: k.priority.map(|p| ["ignore", "normal", "prefer"][p as usize].to_owned()),
                    area_offset: k.area_offset,
                    area_size: k.area_size,
                })
                .collect(),
        }
    }

    /// A slot's key material parameters, if the slot is active.
    fn slot_area(&self, slot: u32) -> Option<SlotArea> {
        match &self.header {
            Header::V1(h) => {
                let s = h.slots.get(slot as usize).filter(|s| s.active)?;
                Some(SlotArea {
                    kdf: Kdf::Pbkdf2 { hash: h.hash.name().to_owned(), iterations: s.iterations },
                    salt: s.salt.to_vec(),
                    key_len: h.key_bytes as usize,
                    af_hash: h.hash,
                    offset: u64::from(s.offset) * 512,
                    area_key_len: h.key_bytes as usize,
                })
            }
            Header::V2(c) => {
                let k = c.meta.keyslots.get(&slot)?;
                Some(SlotArea {
                    kdf: k.kdf.clone(),
                    salt: k.salt.clone(),
                    key_len: k.key_size as usize,
                    af_hash: k.af_hash,
                    offset: k.area_offset,
                    area_key_len: k.area_key_size as usize,
                })
            }
        }
    }

    /// The slots tried when none is named: LUKS1 in order; LUKS2 as cryptsetup, the slots of
    /// priority "prefer" first, then "normal" ones, never "ignore" ones, and only those bound
    /// to the data segment's digest.
    pub(crate) fn unlock_order(&self) -> Vec<u32> {
        match &self.header {
            Header::V1(h) => (0..luks1::SLOTS as u32).filter(|&i| h.slots[i as usize].active).collect(),
            Header::V2(c) => {
                let meta = &c.meta;
                let bound = |n: &u32| meta.digest.keyslots.contains(n);
                let with = |p: u8| {
                    meta.keyslots
                        .iter()
                        .filter(move |(n, k)| bound(n) && k.priority.unwrap_or(1) == p)
                        .map(|(n, _)| *n)
                };
                with(2).chain(with(1)).collect()
            }
        }
    }

    /// Does `key` match the volume key's digest?
    pub(crate) fn key_matches(&self, key: &[u8]) -> bool {
        match &self.header {
            Header::V1(h) => {
                if key.len() != h.key_bytes as usize {
                    return false;
                }
                let mut out = [0u8; 20];
                h.hash.pbkdf2(key, &h.mk_salt, h.mk_iterations, &mut out);
                crypto::same_bytes(&out, &h.mk_digest)
            }
            Header::V2(c) => {
                let d = &c.meta.digest;
                let mut out = secret(d.digest.len());
                d.hash.pbkdf2(key, &d.salt, d.iterations, &mut out);
                crypto::same_bytes(&out, &d.digest)
            }
        }
    }

    /// Tries `slot`, or every active slot (priority order as cryptsetup). Err(WrongPassphrase)
    /// when none opens; the volume key is checked against the digest.
    pub fn unlock(
        &self,
        io: &mut dyn MetaIo,
        passphrase: &[u8],
        slot: Option<u32>,
    ) -> Result<(VolumeKey, u32), LuksError> {
        let slots = match slot {
            Some(n) => {
                let bound = match &self.header {
                    Header::V1(_) => true,
                    Header::V2(c) => c.meta.digest.keyslots.contains(&n),
                };
                if self.slot_area(n).is_none() || !bound {
                    return Err(LuksError::NoSuchSlot(n));
                }
                vec![n]
            }
            None => self.unlock_order(),
        };
        if self.reencrypting() {
            return Err(LuksError::Reencrypting);
        }
        for n in slots {
            let Some(key) = self.slot_key(io, n, passphrase)? else { continue };
            if self.key_matches(&key) {
                return Ok((VolumeKey(key), n));
            }
        }
        Err(LuksError::WrongPassphrase)
    }

    /// What slot `n` yields for `passphrase` (a key only if the passphrase is right, which
    /// the caller checks against a digest); `None` when the slot is not active.
    pub(crate) fn slot_key(
        &self,
        io: &mut dyn MetaIo,
        n: u32,
        passphrase: &[u8],
    ) -> Result<Option<Zeroizing<Vec<u8>>>, LuksError> {
        let Some(area) = self.slot_area(n) else { return Ok(None) };
        let derived = derive(&area.kdf, passphrase, &area.salt, area.area_key_len)?;
        let len = af::split_bytes(area.key_len, STRIPES);
        let mut material = secret(len as usize);
        io.read_at(area.offset, &mut material)?;
        crypto::area_crypt(&derived, &mut material, false)?;
        Ok(Some(af::merge(&material, area.key_len, STRIPES, area.af_hash)))
    }

    /// Writes key material into the slot's area first, flushes, then the header (LUKS2: both
    /// copies, seqid + 1, primary then secondary, flush between): a crash leaves the old or the
    /// new header, never a slot pointing at garbage.
    pub fn add_keyslot(
        &mut self,
        io: &mut dyn MetaIo,
        key: &VolumeKey,
        passphrase: &[u8],
        slot: Option<u32>,
        kdf: &Kdf,
    ) -> Result<u32, LuksError> {
        check_new_kdf(self.version(), kdf)?;
        if self.reencrypting() {
            return Err(LuksError::Reencrypting);
        }
        if !self.key_matches(key.as_bytes()) {
            return Err(unsupported("volume key", "does not match the volume's digest"));
        }
        let mut salt = vec![0u8; luks2::SALT_LEN];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        let key_len = key.as_bytes().len();
        let af_hash = match kdf {
            Kdf::Pbkdf2 { hash, .. } => Hash::parse("kdf hash", hash)?,
            Kdf::Argon2 { .. } => Hash::Sha256,
        };
        let mut next = self.clone();
        let (n, offset) = match &mut next.header {
            Header::V1(h) => {
                let n = pick_slot(slot, luks1::SLOTS as u32, |i| !h.slots[i as usize].active)?;
                let s = &mut h.slots[n as usize];
                s.active = true;
                s.salt.copy_from_slice(&salt);
                s.iterations = match kdf {
                    Kdf::Pbkdf2 { iterations, .. } => *iterations,
                    Kdf::Argon2 { .. } => return Err(unsupported("kdf", "argon2 in LUKS1")),
                };
                if h.hash != af_hash {
                    return Err(unsupported(
                        "kdf hash",
                        format_args!("LUKS1 slots use the header's {}", h.hash.name()),
                    ));
                }
                (n, u64::from(s.offset) * 512)
            }
            Header::V2(c) => {
                let meta = &c.meta;
                let n = pick_slot(slot, luks2::MAX_KEYSLOTS, |i| !meta.keyslots.contains_key(&i))?;
                let (offset, slot_json) = luks2_slot(meta, c.bin.hdr_size, key_len, af_hash, kdf, &salt)?;
                let digest_id = meta.digest.id.clone();
                json_object(&mut c.json, "keyslots")?.insert(n.to_string(), slot_json);
                let digest = json_object(&mut c.json, "digests")?
                    .get_mut(&digest_id)
                    .and_then(Value::as_object_mut)
                    .and_then(|d| d.get_mut("keyslots"))
                    .and_then(Value::as_array_mut)
                    .ok_or_else(|| unsupported("digests", "no keyslots list"))?;
                digest.push(Value::String(n.to_string()));
                (n, offset)
            }
        };
        if let Header::V2(c) = &mut next.header {
            // The slot must fit the JSON area (cryptsetup: "not enough space in header json
            // area") before its material is written; the whole check follows in write_header.
            c.meta = luks2::Meta::parse(&c.json, c.bin.hdr_size)?;
            luks2::encode_copy(&c.bin, &c.json, 0).map_err(|_| LuksError::NoFreeSlot)?;
        }
        write_slot_material(io, offset, key, passphrase, &salt, kdf, af_hash)?;
        next.write_header(io)?;
        *self = next;
        Ok(n)
    }

    /// Header first (the slot gone), then the area wiped. Refuses the last active slot (LastSlot).
    pub fn remove_keyslot(&mut self, io: &mut dyn MetaIo, slot: u32) -> Result<(), LuksError> {
        if self.reencrypting() {
            return Err(LuksError::Reencrypting);
        }
        let area = self.keyslots().into_iter().find(|k| k.slot == slot).ok_or(LuksError::NoSuchSlot(slot))?;
        if self.keyslots().len() == 1 {
            return Err(LuksError::LastSlot);
        }
        let mut next = self.clone();
        match &mut next.header {
            Header::V1(h) => {
                let s = &mut h.slots[slot as usize];
                s.active = false;
                s.iterations = 0;
                s.salt = [0; 32];
            }
            Header::V2(c) => {
                let id = Value::String(slot.to_string());
                json_object(&mut c.json, "keyslots")?.remove(&slot.to_string());
                // Unbind the slot from digests and tokens, as cryptsetup's keyslot wipe does.
                for section in ["digests", "tokens"] {
                    for (_, entry) in json_object(&mut c.json, section)?.iter_mut() {
                        if let Some(list) = entry.get_mut("keyslots").and_then(Value::as_array_mut) {
                            list.retain(|v| *v != id);
                        }
                    }
                }
            }
        }
        next.write_header(io)?;
        *self = next;
        let zeroes = vec![0u8; area.area_size as usize];
        io.write_at(area.area_offset, &zeroes)?;
        io.flush()?;
        Ok(())
    }

    /// The header as it goes on disk: (offset, bytes) of each copy, with the current seqid.
    /// The fuzz target and the tests use it for a serialise / parse round trip.
    pub fn encode_header(&self) -> Result<Vec<(u64, Vec<u8>)>, LuksError> {
        match &self.header {
            Header::V1(h) => Ok(vec![(0, h.encode())]),
            Header::V2(c) => {
                let size = c.bin.hdr_size;
                let mut secondary_bin = c.bin.clone();
                // Each copy keeps its own salt; a copy read alone has only its own, so the
                // other is derived from it (any value will do: it only makes the copies differ).
                secondary_bin.salt.iter_mut().zip(c.bin.salt.iter()).for_each(|(s, p)| *s = p ^ 0xff);
                Ok(vec![
                    (0, luks2::encode_copy(&c.bin, &c.json, 0)?),
                    (size, luks2::encode_copy(&secondary_bin, &c.json, size)?),
                ])
            }
        }
    }

    /// Checks the modified header and writes it: LUKS1's one copy, or LUKS2's two with the
    /// seqid raised, primary then secondary, flushing after each.
    pub(crate) fn write_header(&mut self, io: &mut dyn MetaIo) -> Result<(), LuksError> {
        if let Header::V2(c) = &mut self.header {
            c.bin.seqid = c.bin.seqid.wrapping_add(1);
            // Re-check what was changed, as a load would.
            c.meta = luks2::Meta::parse(&c.json, c.bin.hdr_size)?;
        }
        self.check_reencryption()?;
        for (offset, bytes) in self.encode_header()? {
            io.write_at(offset, &bytes)?;
            io.flush()?;
        }
        Ok(())
    }
}

fn reason(e: &LuksError) -> String {
    match e {
        LuksError::Damaged { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// Reads and checks the LUKS2 copy at `offset`, whose binary header is `bin`; the error names
/// the copy.
fn read_copy(io: &mut dyn MetaIo, offset: u64, bin: &[u8]) -> Result<luks2::Copy, LuksError> {
    let copy = if offset == 0 { "primary" } else { "secondary" };
    let name = |e: LuksError| match e {
        LuksError::Damaged { reason, .. } => LuksError::Damaged { copy, reason },
        other => other,
    };
    let parsed = luks2::Binary::parse(bin, offset).map_err(name)?;
    if offset + parsed.hdr_size > io.size() {
        return Err(LuksError::Damaged { copy, reason: "past the device's end".into() });
    }
    let mut bytes = vec![0u8; parsed.hdr_size as usize];
    io.read_at(offset, &mut bytes)?;
    luks2::parse_copy(parsed, &bytes).map_err(name)
}

/// The slot `wanted`, if free, or the lowest free one.
pub(crate) fn pick_slot(wanted: Option<u32>, max: u32, free: impl Fn(u32) -> bool) -> Result<u32, LuksError> {
    match wanted {
        Some(n) if n < max && free(n) => Ok(n),
        Some(n) => Err(LuksError::NoSuchSlot(n)),
        None => (0..max).find(|&n| free(n)).ok_or(LuksError::NoFreeSlot),
    }
}

/// The lowest 4096-aligned offset in [start, end) where `size` bytes overlap no key slot.
fn free_area(meta: &luks2::Meta, start: u64, end: u64, size: u64) -> Option<u64> {
    let mut used: Vec<(u64, u64)> =
        meta.keyslots.values().map(|k| (k.area_offset, k.area_offset + k.area_size)).collect();
    used.sort();
    let mut at = start;
    for (s, e) in used {
        if at + size <= s {
            break;
        }
        at = at.max(e.div_ceil(4096) * 4096);
    }
    (at + size <= end).then_some(at)
}

fn json_object<'a>(
    json: &'a mut serde_json::Map<String, Value>,
    key: &'static str,
) -> Result<&'a mut serde_json::Map<String, Value>, LuksError> {
    json.get_mut(key).and_then(Value::as_object_mut).ok_or_else(|| unsupported(key, "not an object"))
}

/// Runs `kdf` over `passphrase` and `salt` into `out`: what unlocking a slot with these
/// parameters costs (callers time it to choose parameters, as cryptsetup's benchmark does).
pub fn derive_into(kdf: &Kdf, passphrase: &[u8], salt: &[u8], out: &mut [u8]) -> Result<(), LuksError> {
    out.copy_from_slice(&derive(kdf, passphrase, salt, out.len())?);
    Ok(())
}

/// A new LUKS2 key slot's place (the lowest free area) and JSON.
pub(crate) fn luks2_slot(
    meta: &luks2::Meta,
    hdr_size: u64,
    key_len: usize,
    af_hash: Hash,
    kdf: &Kdf,
    salt: &[u8],
) -> Result<(u64, Value), LuksError> {
    let area_size = af::split_bytes(key_len, STRIPES).div_ceil(4096) * 4096;
    let start = 2 * hdr_size;
    let offset =
        free_area(meta, start, start + meta.keyslots_size, area_size).ok_or(LuksError::NoFreeSlot)?;
    let slot_json = serde_json::json!({
        "type": "luks2",
        "key_size": key_len,
        "af": { "type": "luks1", "stripes": STRIPES, "hash": af_hash.name() },
        "area": {
            "type": "raw", "offset": offset.to_string(), "size": area_size.to_string(),
            "encryption": "aes-xts-plain64", "key_size": key_len,
        },
        "kdf": luks2::kdf_json(kdf, salt),
    });
    Ok((offset, slot_json))
}

/// Writes `key`'s key material for a slot at `offset`: split, encrypted with the key derived
/// from `passphrase`, then flushed (before any header names the slot).
pub(crate) fn write_slot_material(
    io: &mut dyn MetaIo,
    offset: u64,
    key: &VolumeKey,
    passphrase: &[u8],
    salt: &[u8],
    kdf: &Kdf,
    af_hash: Hash,
) -> Result<(), LuksError> {
    let key_len = key.as_bytes().len();
    let derived = derive(kdf, passphrase, salt, key_len)?;
    let split = af::split(key.as_bytes(), STRIPES, af_hash);
    let mut material = secret(af::split_bytes(key_len, STRIPES) as usize);
    material[..split.len()].copy_from_slice(&split);
    crypto::area_crypt(&derived, &mut material, true)?;
    io.write_at(offset, &material)?;
    io.flush()?;
    Ok(())
}

/// The key derived from `passphrase` for a key slot's area.
fn derive(kdf: &Kdf, passphrase: &[u8], salt: &[u8], len: usize) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let mut out = secret(len);
    match kdf {
        Kdf::Pbkdf2 { hash, iterations } => {
            Hash::parse("kdf hash", hash)?.pbkdf2(passphrase, salt, *iterations, &mut out)
        }
        Kdf::Argon2 { id, time, memory_kib, parallel } => {
            crypto::argon2(*id, *time, *memory_kib, *parallel, passphrase, salt, &mut out)?
        }
    }
    Ok(out)
}

/// The limits cryptsetup puts on a new key slot's KDF.
pub(crate) fn check_new_kdf(version: Version, kdf: &Kdf) -> Result<(), LuksError> {
    match kdf {
        Kdf::Pbkdf2 { hash, iterations } => {
            Hash::parse("kdf hash", hash)?;
            if *iterations < MIN_PBKDF2_ITERATIONS {
                return Err(unsupported(
                    "kdf iterations",
                    format_args!("{iterations} (at least {MIN_PBKDF2_ITERATIONS})"),
                ));
            }
        }
        Kdf::Argon2 { time, memory_kib, parallel, .. } => {
            if version == Version::Luks1 {
                return Err(unsupported("kdf", "argon2 in LUKS1"));
            }
            if *time < MIN_ARGON2_TIME || *memory_kib < MIN_ARGON2_MEMORY_KIB {
                return Err(unsupported(
                    "kdf",
                    format_args!(
                        "argon2 time {time} / memory {memory_kib} KiB below cryptsetup's minimum (4 / 32)"
                    ),
                ));
            }
            luks2::check_argon2(*time, *memory_kib, *parallel)?;
        }
    }
    Ok(())
}

/// A random version 4 UUID, formatted as cryptsetup prints one.
fn random_uuid() -> String {
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// Writes a new volume with one key slot (slot 0) opened by `passphrase`; the key is random
/// (rand's OsRng). Refuses a device too small (TooSmall{need, have}). Returns the volume and key.
///
/// The metadata region (headers and key slots area, up to the data offset) is zeroed first,
/// so no older header's copy or key material survives in it.
pub fn format(
    io: &mut dyn MetaIo,
    opts: &FormatOptions,
    passphrase: &[u8],
) -> Result<(Volume, VolumeKey), LuksError> {
    if opts.cipher != "aes-xts-plain64" {
        return Err(unsupported("cipher", &opts.cipher));
    }
    if opts.key_bits != 256 && opts.key_bits != 512 {
        return Err(unsupported("key_size", format_args!("{} bits", opts.key_bits)));
    }
    let sector_ok = match opts.version {
        Version::Luks1 => opts.sector_size == 512,
        Version::Luks2 => (512..=4096).contains(&opts.sector_size) && opts.sector_size.is_power_of_two(),
    };
    if !sector_ok {
        return Err(unsupported("sector_size", opts.sector_size));
    }
    check_new_kdf(opts.version, &opts.kdf)?;
    let uuid = opts.uuid.clone().unwrap_or_else(random_uuid);
    if uuid.len() >= 40 || uuid.contains('\0') {
        return Err(unsupported("uuid", "longer than 39 bytes or with a NUL"));
    }
    let label = opts.label.clone().unwrap_or_default();
    if opts.version == Version::Luks1 && !label.is_empty() {
        return Err(unsupported("label", "LUKS1 has no label"));
    }
    if label.len() >= 48 || label.contains('\0') {
        return Err(unsupported("label", "longer than 47 bytes or with a NUL"));
    }
    let key_len = (opts.key_bits / 8) as usize;
    let mut key = VolumeKey(secret(key_len));
    rand::rngs::OsRng.fill_bytes(&mut key.0);
    let mut digest_salt = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut digest_salt);
    let hash = match &opts.kdf {
        Kdf::Pbkdf2 { hash, .. } => Hash::parse("kdf hash", hash)?,
        Kdf::Argon2 { .. } => Hash::Sha256,
    };
    let (header, data_offset) = match opts.version {
        Version::Luks1 => {
            let (slots, payload) = luks1::Header::layout(key_len as u32);
            let mut mk_digest = [0u8; 20];
            hash.pbkdf2(key.as_bytes(), &digest_salt, DIGEST_ITERATIONS, &mut mk_digest);
            let h = luks1::Header {
                cipher_name: "aes".into(),
                cipher_mode: "xts-plain64".into(),
                hash,
                payload_offset: payload,
                key_bytes: key_len as u32,
                mk_digest,
                mk_salt: digest_salt,
                mk_iterations: DIGEST_ITERATIONS,
                uuid,
                slots,
            };
            (Header::V1(Box::new(h)), u64::from(payload) * 512)
        }
        Version::Luks2 => {
            let mut digest = vec![0u8; hash.len()];
            hash.pbkdf2(key.as_bytes(), &digest_salt, DIGEST_ITERATIONS, &mut digest);
            let b64 = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b);
            let json = serde_json::json!({
                "keyslots": {},
                "tokens": {},
                "segments": { "0": {
                    "type": "crypt", "offset": LUKS2_DATA_OFFSET.to_string(), "size": "dynamic",
                    "iv_tweak": "0", "encryption": opts.cipher, "sector_size": opts.sector_size,
                }},
                "digests": { "0": {
                    "type": "pbkdf2", "keyslots": [], "segments": ["0"], "hash": hash.name(),
                    "iterations": DIGEST_ITERATIONS, "salt": b64(&digest_salt), "digest": b64(&digest),
                }},
                "config": {
                    "json_size": (LUKS2_COPY_SIZE - luks2::BIN_LEN as u64).to_string(),
                    "keyslots_size": (LUKS2_DATA_OFFSET - 2 * LUKS2_COPY_SIZE).to_string(),
                },
            });
            let Value::Object(json) = json else { unreachable!("a JSON object literal") };
            let mut salt = [0u8; 64];
            rand::rngs::OsRng.fill_bytes(&mut salt);
            let bin = luks2::Binary {
                hdr_size: LUKS2_COPY_SIZE,
                // The first write below raises it to 1, as cryptsetup's first header has.
                seqid: 0,
                label,
                checksum_alg: Hash::Sha256,
                salt,
                uuid,
                subsystem: String::new(),
            };
            let meta = luks2::Meta::parse(&json, LUKS2_COPY_SIZE)?;
            (Header::V2(Box::new(luks2::Copy { bin, json, meta })), LUKS2_DATA_OFFSET)
        }
    };
    let need = data_offset + u64::from(opts.sector_size);
    let have = io.size();
    if have < need {
        return Err(LuksError::TooSmall { need, have });
    }
    let zeroes = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < data_offset {
        let n = (data_offset - at).min(zeroes.len() as u64);
        io.write_at(at, &zeroes[..n as usize])?;
        at += n;
    }
    io.flush()?;
    let mut volume = Volume::from_header(header)?;
    if let Header::V2(_) = volume.header {
        // A header with no key slot yet, so that the slot's write below has one to update.
        volume.write_header(io)?;
    }
    volume.add_keyslot(io, &key, passphrase, Some(0), &opts.kdf)?;
    Ok((volume, key))
}
