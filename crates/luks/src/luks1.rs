//! The LUKS1 header (the LUKS1 specification's partition header table and its key slot table):
//! 592 bytes at offset 0, big-endian integers, NUL-padded strings, eight key slots of 48
//! bytes. Key material sits at 4096-byte (8-sector) aligned offsets after it, the data after
//! the last slot's material.

use crate::af::{self, STRIPES};
use crate::crypto::Hash;
use crate::error::{unsupported, LuksError};

pub(crate) const MAGIC: &[u8; 6] = b"LUKS\xba\xbe";
/// The header's length on disk.
pub(crate) const HEADER_LEN: usize = 592;
pub(crate) const SLOTS: usize = 8;
const SLOT_ACTIVE: u32 = 0x00AC_71F3;
const SLOT_INACTIVE: u32 = 0x0000_DEAD;
/// Key material starts at this alignment (cryptsetup's LUKS_ALIGN_KEYSLOTS), in sectors.
const KEYSLOT_ALIGN_SECTORS: u32 = 4096 / 512;
/// The data offset is aligned to 1 MiB (cryptsetup's default alignment), in sectors; with
/// either key size the eight slots end below 2 MiB, so the data starts at sector 4096.
const DATA_ALIGN_SECTORS: u32 = (1 << 20) / 512;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub active: bool,
    pub iterations: u32,
    pub salt: [u8; 32],
    /// In 512-byte sectors from the device start.
    pub offset: u32,
    pub stripes: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub cipher_name: String,
    pub cipher_mode: String,
    pub hash: Hash,
    /// The data's start in 512-byte sectors.
    pub payload_offset: u32,
    pub key_bytes: u32,
    pub mk_digest: [u8; 20],
    pub mk_salt: [u8; 32],
    pub mk_iterations: u32,
    pub uuid: String,
    pub slots: [Slot; SLOTS],
}

fn damaged(reason: impl Into<String>) -> LuksError {
    LuksError::Damaged { copy: "header", reason: reason.into() }
}

/// A NUL-padded string field: the bytes before the first NUL, which must be UTF-8.
pub(crate) fn c_string(field: &'static str, bytes: &[u8]) -> Result<String, String> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    std::str::from_utf8(&bytes[..end]).map(str::to_owned).map_err(|_| format!("{field}: not UTF-8"))
}

/// Writes `value` NUL-padded into `field` (which must leave room for the NUL).
pub(crate) fn put_c_string(field: &mut [u8], value: &str) {
    field.fill(0);
    field[..value.len()].copy_from_slice(value.as_bytes());
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The sectors one slot's key material takes (cryptsetup's AF_split_sectors).
pub(crate) fn material_sectors(key_bytes: u32) -> u32 {
    (af::split_bytes(key_bytes as usize, STRIPES) / 512) as u32
}

impl Header {
    /// Parses and checks a header: `bytes` holds at least [`HEADER_LEN`] bytes.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Header, LuksError> {
        let text = |field, range: std::ops::Range<usize>| c_string(field, &bytes[range]).map_err(damaged);
        let cipher_name = text("cipherName", 8..40)?;
        let cipher_mode = text("cipherMode", 40..72)?;
        let hash_name = text("hashSpec", 72..104)?;
        let payload_offset = be32(bytes, 104);
        let key_bytes = be32(bytes, 108);
        let mut mk_digest = [0u8; 20];
        mk_digest.copy_from_slice(&bytes[112..132]);
        let mut mk_salt = [0u8; 32];
        mk_salt.copy_from_slice(&bytes[132..164]);
        let mk_iterations = be32(bytes, 164);
        let uuid = text("uuid", 168..208)?;
        let mut slots = Vec::with_capacity(SLOTS);
        for i in 0..SLOTS {
            let at = 208 + 48 * i;
            let active = match be32(bytes, at) {
                SLOT_ACTIVE => true,
                SLOT_INACTIVE => false,
                other => return Err(damaged(format!("key slot {i}: active field {other:#x}"))),
            };
            let mut salt = [0u8; 32];
            salt.copy_from_slice(&bytes[at + 8..at + 40]);
            slots.push(Slot {
                active,
                iterations: be32(bytes, at + 4),
                salt,
                offset: be32(bytes, at + 40),
                stripes: be32(bytes, at + 44),
            });
        }
        let slots: [Slot; SLOTS] = slots.try_into().map_err(|_| damaged("key slots"))?;
        let header = Header {
            cipher_name,
            cipher_mode,
            hash: Hash::parse("hashSpec", &hash_name)?,
            payload_offset,
            key_bytes,
            mk_digest,
            mk_salt,
            mk_iterations,
            uuid,
            slots,
        };
        header.check()?;
        Ok(header)
    }

    /// The rules cryptsetup's LUKS_check_keyslots and header read apply, plus what this build
    /// implements (aes-xts-plain64 only).
    fn check(&self) -> Result<(), LuksError> {
        if self.cipher_name != "aes" || self.cipher_mode != "xts-plain64" {
            return Err(unsupported("cipher", format_args!("{}-{}", self.cipher_name, self.cipher_mode)));
        }
        if self.key_bytes != 32 && self.key_bytes != 64 {
            return Err(unsupported("key_size", format_args!("{} bits", u64::from(self.key_bytes) * 8)));
        }
        if self.mk_iterations == 0 {
            return Err(damaged("mkDigestIterations: 0"));
        }
        if self.payload_offset == 0 {
            return Err(unsupported("payloadOffset", "0 (a detached header)"));
        }
        let sectors = material_sectors(self.key_bytes);
        let mut areas = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.stripes != STRIPES {
                return Err(damaged(format!(
                    "key slot {i}: stripes {} (cryptsetup writes {STRIPES})",
                    slot.stripes
                )));
            }
            if slot.active && slot.iterations == 0 {
                return Err(damaged(format!("key slot {i}: iterations 0")));
            }
            if slot.offset < KEYSLOT_ALIGN_SECTORS {
                return Err(damaged(format!(
                    "key slot {i}: key material offset {} inside the header",
                    slot.offset
                )));
            }
            let end = u64::from(slot.offset) + u64::from(sectors);
            if end > u64::from(self.payload_offset) {
                return Err(damaged(format!("key slot {i}: key material past the data offset")));
            }
            areas.push((u64::from(slot.offset), end, i));
        }
        areas.sort();
        for pair in areas.windows(2) {
            if pair[0].1 > pair[1].0 {
                return Err(damaged(format!(
                    "key slots {} and {}: key material overlaps",
                    pair[0].2, pair[1].2
                )));
            }
        }
        Ok(())
    }

    /// The header as it is on disk, [`HEADER_LEN`] bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_LEN];
        out[..6].copy_from_slice(MAGIC);
        out[6..8].copy_from_slice(&1u16.to_be_bytes());
        put_c_string(&mut out[8..40], &self.cipher_name);
        put_c_string(&mut out[40..72], &self.cipher_mode);
        put_c_string(&mut out[72..104], self.hash.name());
        out[104..108].copy_from_slice(&self.payload_offset.to_be_bytes());
        out[108..112].copy_from_slice(&self.key_bytes.to_be_bytes());
        out[112..132].copy_from_slice(&self.mk_digest);
        out[132..164].copy_from_slice(&self.mk_salt);
        out[164..168].copy_from_slice(&self.mk_iterations.to_be_bytes());
        put_c_string(&mut out[168..208], &self.uuid);
        for (i, slot) in self.slots.iter().enumerate() {
            let at = 208 + 48 * i;
            let state = if slot.active { SLOT_ACTIVE } else { SLOT_INACTIVE };
            out[at..at + 4].copy_from_slice(&state.to_be_bytes());
            out[at + 4..at + 8].copy_from_slice(&slot.iterations.to_be_bytes());
            out[at + 8..at + 40].copy_from_slice(&slot.salt);
            out[at + 40..at + 44].copy_from_slice(&slot.offset.to_be_bytes());
            out[at + 44..at + 48].copy_from_slice(&slot.stripes.to_be_bytes());
        }
        out
    }

    /// A new header's layout for `key_bytes`: every slot inactive at its fixed offset (slot i
    /// at 8 + i × its material rounded up to 8 sectors) and the data at the next MiB boundary.
    pub(crate) fn layout(key_bytes: u32) -> ([Slot; SLOTS], u32) {
        let stride = material_sectors(key_bytes).div_ceil(KEYSLOT_ALIGN_SECTORS) * KEYSLOT_ALIGN_SECTORS;
        let slots = std::array::from_fn(|i| Slot {
            active: false,
            iterations: 0,
            salt: [0; 32],
            offset: KEYSLOT_ALIGN_SECTORS + i as u32 * stride,
            stripes: STRIPES,
        });
        let end = KEYSLOT_ALIGN_SECTORS + SLOTS as u32 * stride;
        (slots, end.div_ceil(DATA_ALIGN_SECTORS) * DATA_ALIGN_SECTORS)
    }
}
