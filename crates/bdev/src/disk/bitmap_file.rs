//! The on-disk form of a persistent dirty bitmap (docs/backup.md, "File format"): a versioned
//! header, the two names, then the bit array. Little-endian throughout.
//!
//! ```text
//!  0  magic        8  "FPDBMAP\0"
//!  8  version      4  1
//! 12  flags        4  IN_USE | RECORDING | INCONSISTENT
//! 16  granularity  8  bytes per bit, a power of two from 512 to 64 MiB
//! 24  size         8  the bdev's size in bytes
//! 32  uuid        16  the bdev's UUID (nil: none)
//! 48  bdev_len     2
//! 50  name_len     2
//! 52  reserved     4  zero
//! 56  bdev name, bitmap name (UTF-8), then ceil(ceil(size / granularity) / 64) words
//! ```
//!
//! Written whole to a temporary file, synced and renamed over the old one, so a reader finds
//! the old file or the new one, never a mix: the format carries no checksum of its own.

use super::bitmaps::{check_granularity, FrozenBitmap};

/// The file's first bytes.
pub const BITMAP_FILE_MAGIC: [u8; 8] = *b"FPDBMAP\0";
/// The version this build writes and reads.
pub const BITMAP_FILE_VERSION: u32 = 1;
/// The daemon had the bitmap loaded and marking: a file still carrying it after a start-up was
/// not closed cleanly, and the bitmap may have missed writes.
pub const FLAG_IN_USE: u32 = 1;
/// The bitmap was enabled (recording).
pub const FLAG_RECORDING: u32 = 2;
/// The bitmap was found inconsistent once: it stays so until removed.
pub const FLAG_INCONSISTENT: u32 = 4;
const KNOWN_FLAGS: u32 = FLAG_IN_USE | FLAG_RECORDING | FLAG_INCONSISTENT;
const HEADER: usize = 56;
/// QEMU's longest bitmap name; bdev names are held to the same.
const MAX_NAME: usize = 1023;

/// A bitmap file, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapFile {
    /// The bdev it belongs to.
    pub bdev: String,
    /// The bitmap's name.
    pub name: String,
    /// The bdev's size in bytes when it was written.
    pub size: u64,
    /// The bdev's UUID (all zeroes: none).
    pub uuid: [u8; 16],
    /// Bytes per bit.
    pub granularity: u64,
    /// `FLAG_*`.
    pub flags: u32,
    /// The bits, 64 chunks a word.
    pub words: Vec<u64>,
}

/// Why a bitmap file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BitmapFileError {
    /// Shorter than its header or than what the header announces.
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    /// Not a bitmap file.
    #[error("not a flashpath dirty bitmap file (bad magic)")]
    Magic,
    /// Written by another version.
    #[error("version {0} (this build reads {BITMAP_FILE_VERSION})")]
    Version(u32),
    /// A field that is out of bounds.
    #[error("{field}: {reason}")]
    Field {
        /// The header field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

fn field(field: &'static str, reason: impl Into<String>) -> BitmapFileError {
    BitmapFileError::Field { field, reason: reason.into() }
}

/// The words a bitmap of `size` bytes in chunks of `granularity` has.
pub fn words_for(size: u64, granularity: u64) -> u64 {
    size.div_ceil(granularity).div_ceil(64)
}

impl BitmapFile {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.bdev.len() + self.name.len() + self.words.len() * 8);
        out.extend_from_slice(&BITMAP_FILE_MAGIC);
        out.extend_from_slice(&BITMAP_FILE_VERSION.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.granularity.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&(self.bdev.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(self.bdev.as_bytes());
        out.extend_from_slice(self.name.as_bytes());
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Parses `bytes`, checking every field; never allocates more than `bytes` holds.
    pub fn parse(bytes: &[u8]) -> Result<BitmapFile, BitmapFileError> {
        if bytes.len() < HEADER {
            return Err(BitmapFileError::Truncated(bytes.len()));
        }
        let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        if bytes[..8] != BITMAP_FILE_MAGIC {
            return Err(BitmapFileError::Magic);
        }
        let version = u32_at(8);
        if version != BITMAP_FILE_VERSION {
            return Err(BitmapFileError::Version(version));
        }
        let flags = u32_at(12);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(field("flags", format!("unknown flags {:#x}", flags & !KNOWN_FLAGS)));
        }
        let granularity = u64_at(16);
        check_granularity("granularity", granularity).map_err(|e| field("granularity", e.to_string()))?;
        let size = u64_at(24);
        let uuid: [u8; 16] = bytes[32..48].try_into().expect("16 bytes");
        let (bdev_len, name_len) = (usize::from(u16_at(48)), usize::from(u16_at(50)));
        if u32_at(52) != 0 {
            return Err(field("reserved", "not zero"));
        }
        let text = |at: usize, len: usize, what: &'static str| -> Result<String, BitmapFileError> {
            if len == 0 || len > MAX_NAME {
                return Err(field(what, format!("length {len}, not 1 to {MAX_NAME}")));
            }
            let raw = bytes.get(at..at + len).ok_or(BitmapFileError::Truncated(bytes.len()))?;
            std::str::from_utf8(raw).map(String::from).map_err(|_| field(what, "not UTF-8"))
        };
        let bdev = text(HEADER, bdev_len, "bdev")?;
        let name = text(HEADER + bdev_len, name_len, "name")?;
        let body = &bytes[HEADER + bdev_len + name_len..];
        let nwords = words_for(size, granularity);
        if body.len() as u64 != nwords.saturating_mul(8) {
            return Err(field(
                "size",
                format!("{size} bytes in chunks of {granularity} need {nwords} words; the file has {} bytes of them", body.len()),
            ));
        }
        let words: Vec<u64> =
            body.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect();
        let chunks = size.div_ceil(granularity);
        if chunks % 64 != 0 {
            if let Some(last) = words.last() {
                if last >> (chunks % 64) != 0 {
                    return Err(field("bits", "bits set beyond the end of the bdev"));
                }
            }
        }
        Ok(BitmapFile { bdev, name, size, uuid, granularity, flags, words })
    }

    /// The bits as a frozen bitmap, to merge into a live one.
    pub fn bits(&self) -> FrozenBitmap {
        FrozenBitmap::from_words(self.granularity, self.size, self.words.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BitmapFile {
        BitmapFile {
            bdev: "disk0".into(),
            name: "daily".into(),
            size: 130 * 4096,
            uuid: [7; 16],
            granularity: 4096,
            flags: FLAG_IN_USE | FLAG_RECORDING,
            words: vec![u64::MAX, 5, 0b10],
        }
    }

    #[test]
    fn round_trips() {
        let f = sample();
        assert_eq!(BitmapFile::parse(&f.encode()), Ok(f));
    }

    #[test]
    fn refuses_what_is_wrong_naming_it() {
        let good = sample().encode();
        assert_eq!(BitmapFile::parse(&good[..40]), Err(BitmapFileError::Truncated(40)));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(BitmapFile::parse(&bad), Err(BitmapFileError::Magic));
        let mut bad = good.clone();
        bad[8] = 2;
        assert_eq!(BitmapFile::parse(&bad), Err(BitmapFileError::Version(2)));
        let field_of = |b: &[u8]| match BitmapFile::parse(b) {
            Err(BitmapFileError::Field { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let mut bad = good.clone();
        bad[12] = 8;
        assert_eq!(field_of(&bad), "flags");
        let mut bad = good.clone();
        bad[16..24].copy_from_slice(&3000u64.to_le_bytes());
        assert_eq!(field_of(&bad), "granularity");
        let mut bad = good.clone();
        bad[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert_eq!(field_of(&bad), "size");
        let mut bad = good.clone();
        bad.push(0);
        assert_eq!(field_of(&bad), "size");
        // 130 chunks: the last word has 2 bits in use.
        let mut f = sample();
        f.words[2] = 0b100;
        assert_eq!(field_of(&f.encode()), "bits");
        let mut f = sample();
        f.name = String::new();
        assert_eq!(field_of(&f.encode()), "name");
    }
}
