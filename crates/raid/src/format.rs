//! The raid's metadata on each base, as bytes (docs/raid.md, "On-disk format"): two superblock
//! copies (pages 0 and 1, written alternately, the higher valid sequence wins, so a torn write
//! never loses the last good one), then the write-intent bitmap pages, then the data from
//! `data_offset`. Every page carries a CRC32C. Pure code: parsing refuses anything malformed
//! with a reason, and is fuzzed (`raid_superblock`).
//!
//! Byte layouts are in docs/raid-format.md; every integer is little endian.

use fp_bdev::Uuid;

use crate::{RaidLevel, SlotState};

/// Bytes per metadata page.
pub const PAGE_SIZE: usize = 4096;

/// Bytes at the start of a bitmap page before its bits (magic, CRC, raid uuid, seq, index).
pub const BITMAP_HEADER: usize = 64;

/// Chunks one bitmap page covers (a multiple of 64: pages hold whole words).
pub const BITMAP_BITS_PER_PAGE: u64 = ((PAGE_SIZE - BITMAP_HEADER) * 8) as u64;

/// Most slots a raid has (SPDK allows 255; the superblock page bounds it).
pub const MAX_SLOTS: usize = 32;

/// One slot as the superblock records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRecord {
    pub state: SlotState,
    /// The identity of the base in the slot (nil for an empty slot).
    pub uuid: Uuid,
    /// Bytes of the base's data region (concat bases differ; raid1/raid0 all equal).
    pub data_bytes: u64,
    /// For a `Rebuilding` slot: how far the rebuild got (bytes of the data region), and
    /// whether it copies only the bitmap's chunks.
    pub rebuild_offset: u64,
    pub rebuild_partial: bool,
}

/// A superblock: the same on every base of a raid except `slot` (whose page it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Bumped by every superblock write; the highest across a raid's bases is the truth.
    pub seq: u64,
    pub raid_uuid: Uuid,
    /// The raid bdev's name.
    pub name: String,
    pub level: RaidLevel,
    pub strip_size_kb: u32,
    pub block_size: u32,
    /// The raid's size in blocks.
    pub raid_blocks: u64,
    /// Where data starts on each base, in bytes.
    pub data_offset: u64,
    /// The write-intent bitmap: bytes per chunk (0: none), and its first page and page count.
    pub bitmap_chunk_bytes: u64,
    pub bitmap_first_page: u64,
    pub bitmap_pages: u64,
    /// False from the first write after assembly until an orderly stop: an unclean stop makes
    /// the next assembly resync the bitmap's chunks across the in-sync bases.
    pub clean: bool,
    /// Which slot this copy belongs to.
    pub slot: u8,
    pub slots: Vec<SlotRecord>,
}

/// Longest raid name a superblock holds.
pub const NAME_MAX: usize = 63;

/// Granularity of `data_offset`: metadata is rounded up to it so data stays aligned.
pub const DATA_ALIGN: u64 = 1 << 20;

/// The first bitmap page (pages 0 and 1 are the superblock copies).
pub const BITMAP_FIRST_PAGE: u64 = 2;

/// Smallest bitmap chunk, and the most chunks a bitmap tracks before the chunk doubles.
pub const MIN_CHUNK_BYTES: u64 = 64 << 10;
pub const MAX_CHUNKS: u64 = 8 << 20;

const SB_MAGIC: &[u8; 8] = b"FPRAIDSB";
const BM_MAGIC: &[u8; 8] = b"FPRAIDBM";
const VERSION: u32 = 1;
/// Where the slot records start, and each one's size.
const SLOTS_AT: usize = 256;
const SLOT_BYTES: usize = 64;

/// A page that is not a valid superblock or bitmap page, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct FormatError {
    /// "superblock" or "bitmap page".
    pub what: &'static str,
    pub reason: String,
}

fn bad<T>(what: &'static str, reason: impl Into<String>) -> Result<T, FormatError> {
    Err(FormatError { what, reason: reason.into() })
}

/// One metadata page.
pub type PageBuf = [u8; PAGE_SIZE];

fn get_u32(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(p[at..at + 4].try_into().unwrap())
}

fn get_u64(p: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(p[at..at + 8].try_into().unwrap())
}

fn put_u32(p: &mut [u8], at: usize, v: u32) {
    p[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(p: &mut [u8], at: usize, v: u64) {
    p[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The CRC32C of a page with its CRC field (at `crc_at`) taken as zero.
fn page_crc(p: &[u8], crc_at: usize) -> u32 {
    let c = crc32c::crc32c(&p[..crc_at]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &p[crc_at + 4..])
}

/// Writes the checksum of page `p` at `crc_at`, last: what [`check_page`] verifies.
fn seal_page(p: &mut [u8], crc_at: usize) {
    let crc = page_crc(p, crc_at);
    put_u32(p, crc_at, crc);
}

fn check_page<'a>(
    what: &'static str,
    page: &'a [u8],
    magic: &[u8; 8],
    crc_at: usize,
    version_at: usize,
) -> Result<&'a [u8], FormatError> {
    if page.len() != PAGE_SIZE {
        return bad(what, format!("{} bytes, not {PAGE_SIZE}", page.len()));
    }
    if &page[..8] != magic {
        return bad(what, "no magic (not written, or not a flashpath raid page)");
    }
    if get_u32(page, crc_at) != page_crc(page, crc_at) {
        return bad(what, "checksum mismatch (torn or corrupted)");
    }
    if get_u32(page, version_at) != VERSION {
        return bad(what, format!("version {} (this build reads {VERSION})", get_u32(page, version_at)));
    }
    Ok(page)
}

fn level_code(level: RaidLevel) -> u8 {
    match level {
        RaidLevel::Raid0 => 0,
        RaidLevel::Concat => 1,
        RaidLevel::Raid1 => 2,
    }
}

fn state_code(state: SlotState) -> u8 {
    match state {
        SlotState::Empty => 0,
        SlotState::Active => 1,
        SlotState::Failed => 2,
        SlotState::Rebuilding => 3,
    }
}

/// The bitmap chunk for a data region of `data_bytes`: 64 KiB, doubled until the bitmap
/// tracks at most [`MAX_CHUNKS`] chunks.
pub fn bitmap_chunk_bytes(data_bytes: u64) -> u64 {
    let mut chunk = MIN_CHUNK_BYTES;
    while data_bytes.div_ceil(chunk) > MAX_CHUNKS {
        chunk *= 2;
    }
    chunk
}

/// Bitmap pages for `data_bytes` in chunks of `chunk_bytes`.
pub fn bitmap_pages(data_bytes: u64, chunk_bytes: u64) -> u64 {
    data_bytes.div_ceil(chunk_bytes).max(1).div_ceil(BITMAP_BITS_PER_PAGE)
}

/// Where data starts on a base of `base_bytes` carrying a superblock and a bitmap sized for
/// the whole base (the raid's data region is never larger): the two superblock copies and the
/// bitmap pages, rounded up to [`DATA_ALIGN`].
pub fn data_offset(base_bytes: u64) -> u64 {
    let pages = bitmap_pages(base_bytes, bitmap_chunk_bytes(base_bytes));
    ((BITMAP_FIRST_PAGE + pages) * PAGE_SIZE as u64).next_multiple_of(DATA_ALIGN)
}

/// The raid's size in bytes from its bases' data regions (design: raid1 the smallest, raid0
/// `n` times the smallest in whole strips, concat the sum), rounded down to whole blocks.
pub fn raid_bytes(level: RaidLevel, base_data_bytes: &[u64], block_size: u32, strip_bytes: u64) -> u64 {
    let min = base_data_bytes.iter().copied().min().unwrap_or(0);
    let bytes = match level {
        RaidLevel::Raid1 => min,
        RaidLevel::Raid0 if strip_bytes > 0 => {
            (min / strip_bytes) * strip_bytes * base_data_bytes.len() as u64
        }
        RaidLevel::Raid0 => 0,
        RaidLevel::Concat => base_data_bytes.iter().sum(),
    };
    bytes - bytes % u64::from(block_size.max(1))
}

impl Superblock {
    /// A new raid's superblock, not yet written (`seq` 0: the owner formats the bases), with
    /// every present base Active under `base_uuids` (nil: an Empty slot). `base_bytes`: each
    /// slot's base size (0 for an empty slot). `with_metadata`: false for a raid without a
    /// superblock (the record is then kept in memory only and data starts at 0).
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        name: &str,
        level: RaidLevel,
        strip_size_kb: u32,
        block_size: u32,
        raid_uuid: Uuid,
        base_uuids: &[Uuid],
        base_bytes: &[u64],
        with_metadata: bool,
    ) -> Result<Superblock, crate::RaidError> {
        let invalid = |field, reason: String| Err(crate::RaidError::InvalidParam { field, reason });
        if name.len() > NAME_MAX {
            return invalid("name", format!("longer than {NAME_MAX} bytes"));
        }
        if base_bytes.is_empty() || base_bytes.len() > MAX_SLOTS || base_uuids.len() != base_bytes.len() {
            return invalid("base_bdevs", format!("{} bases (1 to {MAX_SLOTS})", base_bytes.len()));
        }
        let largest = base_bytes.iter().copied().max().unwrap_or(0);
        let offset = if with_metadata { data_offset(largest) } else { 0 };
        let data: Vec<u64> = base_bytes
            .iter()
            .zip(base_uuids)
            .filter(|(_, u)| !u.is_nil())
            .map(|(&b, _)| b.saturating_sub(offset))
            .collect();
        let strip = u64::from(strip_size_kb) << 10;
        let bytes = raid_bytes(level, &data, block_size, strip);
        if bytes == 0 {
            return invalid("base_bdevs", format!("no room for data after {offset} bytes of metadata"));
        }
        let chunk = bitmap_chunk_bytes(bytes);
        let per_base = if level == RaidLevel::Raid1 { bytes } else { 0 };
        Ok(Superblock {
            seq: 0,
            raid_uuid,
            name: name.to_string(),
            level,
            strip_size_kb,
            block_size,
            raid_blocks: bytes / u64::from(block_size),
            data_offset: offset,
            bitmap_chunk_bytes: if with_metadata && level == RaidLevel::Raid1 { chunk } else { 0 },
            bitmap_first_page: if with_metadata && level == RaidLevel::Raid1 { BITMAP_FIRST_PAGE } else { 0 },
            bitmap_pages: if with_metadata && level == RaidLevel::Raid1 {
                bitmap_pages(bytes, chunk)
            } else {
                0
            },
            clean: true,
            slot: 0,
            slots: base_uuids
                .iter()
                .zip(base_bytes)
                .map(|(u, &b)| SlotRecord {
                    state: if u.is_nil() { SlotState::Empty } else { SlotState::Active },
                    uuid: *u,
                    data_bytes: if per_base > 0 { per_base } else { b.saturating_sub(offset) },
                    rebuild_offset: 0,
                    rebuild_partial: false,
                })
                .collect(),
        })
    }

    /// The data region's size in bytes.
    pub fn raid_bytes(&self) -> u64 {
        self.raid_blocks * u64::from(self.block_size)
    }

    /// Whether slot `slot`'s data region (from `data_offset`, `data_bytes` long, as this
    /// superblock records it) lies inside a base of `base_bytes`: a base shrunk since, or a
    /// crafted superblock, must not send the raid's I/O past the base's end (or, wrapping,
    /// over its own superblock). The arithmetic is checked.
    pub fn check_base_size(&self, slot: usize, base_bytes: u64) -> Result<(), FormatError> {
        const W: &str = "superblock";
        let Some(rec) = self.slots.get(slot) else {
            return bad(W, format!("no slot {slot} (it has {})", self.slots.len()));
        };
        match self.data_offset.checked_add(rec.data_bytes) {
            Some(end) if end <= base_bytes => Ok(()),
            Some(end) => bad(
                W,
                format!(
                    "slot {slot}'s data ends at byte {end} (offset {} + {} bytes), past the base's {base_bytes} bytes",
                    self.data_offset, rec.data_bytes
                ),
            ),
            None => bad(
                W,
                format!("slot {slot}: data offset {} + {} data bytes overflows", self.data_offset, rec.data_bytes),
            ),
        }
    }

    /// The page holding this superblock (copy A or B): copies alternate with the sequence,
    /// so the write of `seq` never overwrites the copy of `seq - 1`.
    pub fn page(&self) -> u64 {
        self.seq % 2
    }

    /// The slot's record, if the slot exists.
    pub fn slot_record(&self, slot: usize) -> Option<&SlotRecord> {
        self.slots.get(slot)
    }

    /// The page's bytes. Panics on a superblock `decode` would refuse (a bug, not input).
    pub fn encode(&self) -> Box<PageBuf> {
        assert!(self.name.len() <= NAME_MAX && !self.slots.is_empty() && self.slots.len() <= MAX_SLOTS);
        let mut p = Box::new([0u8; PAGE_SIZE]);
        p[..8].copy_from_slice(SB_MAGIC);
        put_u32(&mut p[..], 8, VERSION);
        put_u64(&mut p[..], 16, self.seq);
        p[24..40].copy_from_slice(&self.raid_uuid.0);
        p[40] = self.name.len() as u8;
        p[41..41 + self.name.len()].copy_from_slice(self.name.as_bytes());
        p[104] = level_code(self.level);
        p[105] = self.slot;
        p[106] = u8::from(self.clean);
        p[107] = self.slots.len() as u8;
        put_u32(&mut p[..], 108, self.strip_size_kb);
        put_u32(&mut p[..], 112, self.block_size);
        put_u64(&mut p[..], 120, self.raid_blocks);
        put_u64(&mut p[..], 128, self.data_offset);
        put_u64(&mut p[..], 136, self.bitmap_chunk_bytes);
        put_u64(&mut p[..], 144, self.bitmap_first_page);
        put_u64(&mut p[..], 152, self.bitmap_pages);
        for (i, s) in self.slots.iter().enumerate() {
            let at = SLOTS_AT + i * SLOT_BYTES;
            p[at] = state_code(s.state);
            p[at + 1] = u8::from(s.rebuild_partial);
            p[at + 8..at + 24].copy_from_slice(&s.uuid.0);
            put_u64(&mut p[..], at + 24, s.data_bytes);
            put_u64(&mut p[..], at + 32, s.rebuild_offset);
        }
        seal_page(&mut p[..], 12);
        p
    }

    /// Parses a superblock page, refusing anything malformed or inconsistent with a reason.
    pub fn decode(page: &[u8]) -> Result<Superblock, FormatError> {
        const W: &str = "superblock";
        let p = check_page(W, page, SB_MAGIC, 12, 8)?;
        let name_len = p[40] as usize;
        if name_len > NAME_MAX {
            return bad(W, format!("name length {name_len} over {NAME_MAX}"));
        }
        let name = std::str::from_utf8(&p[41..41 + name_len]).or_else(|_| bad(W, "name is not UTF-8"))?;
        let level = match p[104] {
            0 => RaidLevel::Raid0,
            1 => RaidLevel::Concat,
            2 => RaidLevel::Raid1,
            l => return bad(W, format!("unknown raid level {l}")),
        };
        let (slot, clean, count) = (p[105], p[106], p[107] as usize);
        if count == 0 || count > MAX_SLOTS {
            return bad(W, format!("{count} slots (1 to {MAX_SLOTS})"));
        }
        if slot as usize >= count {
            return bad(W, format!("slot {slot} of {count}"));
        }
        if clean > 1 {
            return bad(W, format!("clean flag {clean}"));
        }
        let sb = Superblock {
            seq: get_u64(p, 16),
            raid_uuid: Uuid(p[24..40].try_into().unwrap()),
            name: name.to_string(),
            level,
            strip_size_kb: get_u32(p, 108),
            block_size: get_u32(p, 112),
            raid_blocks: get_u64(p, 120),
            data_offset: get_u64(p, 128),
            bitmap_chunk_bytes: get_u64(p, 136),
            bitmap_first_page: get_u64(p, 144),
            bitmap_pages: get_u64(p, 152),
            clean: clean == 1,
            slot,
            slots: (0..count)
                .map(|i| decode_slot(&p[SLOTS_AT + i * SLOT_BYTES..]))
                .collect::<Result<_, _>>()?,
        };
        if p[116..120]
            .iter()
            .chain(&p[160..SLOTS_AT])
            .chain(&p[SLOTS_AT + count * SLOT_BYTES..])
            .any(|&b| b != 0)
            || p[41 + name_len..104].iter().any(|&b| b != 0)
        {
            return bad(W, "reserved bytes are not zero");
        }
        sb.check()?;
        Ok(sb)
    }

    /// The checks `decode` makes beyond the bytes: the geometry is consistent.
    fn check(&self) -> Result<(), FormatError> {
        const W: &str = "superblock";
        if self.seq == 0 {
            return bad(W, "sequence 0 (never written)");
        }
        if self.raid_uuid.is_nil() {
            return bad(W, "nil raid uuid");
        }
        if !self.block_size.is_power_of_two()
            || self.block_size < 512
            || self.block_size as usize > PAGE_SIZE * 16
        {
            return bad(W, format!("block size {}", self.block_size));
        }
        let bytes = self.raid_blocks.checked_mul(u64::from(self.block_size)).ok_or(());
        let bytes = bytes.or_else(|_| bad(W, "raid size overflows"))?;
        if self.data_offset % DATA_ALIGN != 0 {
            return bad(W, format!("data offset {} not a multiple of {DATA_ALIGN}", self.data_offset));
        }
        match self.level {
            RaidLevel::Raid0 if !self.strip_size_kb.is_power_of_two() => {
                return bad(W, format!("strip size {} KiB not a power of two", self.strip_size_kb))
            }
            RaidLevel::Raid1 if self.strip_size_kb != 0 => return bad(W, "raid1 with a strip size"),
            _ => {}
        }
        if self.bitmap_chunk_bytes == 0 {
            if self.bitmap_pages != 0 || self.bitmap_first_page != 0 {
                return bad(W, "bitmap pages without a chunk size");
            }
        } else {
            if !self.bitmap_chunk_bytes.is_power_of_two() || self.bitmap_chunk_bytes < MIN_CHUNK_BYTES {
                return bad(W, format!("bitmap chunk {} bytes", self.bitmap_chunk_bytes));
            }
            if self.bitmap_first_page != BITMAP_FIRST_PAGE {
                return bad(W, format!("bitmap starts at page {}", self.bitmap_first_page));
            }
            if self.bitmap_pages != bitmap_pages(bytes, self.bitmap_chunk_bytes) {
                return bad(W, format!("{} bitmap pages for {bytes} bytes", self.bitmap_pages));
            }
            let end = (BITMAP_FIRST_PAGE + self.bitmap_pages) * PAGE_SIZE as u64;
            if end > self.data_offset {
                return bad(W, "bitmap runs into the data");
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            if self.data_offset.checked_add(s.data_bytes).is_none() {
                return bad(
                    W,
                    format!(
                        "slot {i}: data offset {} + {} data bytes overflows",
                        self.data_offset, s.data_bytes
                    ),
                );
            }
            if s.rebuild_offset > s.data_bytes.max(bytes) {
                return bad(W, format!("slot {i}: rebuild offset past the data"));
            }
            if s.state != SlotState::Empty && s.uuid.is_nil() {
                return bad(W, format!("slot {i}: a base without a uuid"));
            }
        }
        if self.slots[self.slot as usize].state == SlotState::Empty {
            return bad(W, format!("the page's own slot {} is empty", self.slot));
        }
        Ok(())
    }
}

fn decode_slot(p: &[u8]) -> Result<SlotRecord, FormatError> {
    const W: &str = "superblock";
    let state = match p[0] {
        0 => SlotState::Empty,
        1 => SlotState::Active,
        2 => SlotState::Failed,
        3 => SlotState::Rebuilding,
        s => return bad(W, format!("unknown slot state {s}")),
    };
    if p[1] > 1 || (p[1] == 1 && state != SlotState::Rebuilding) {
        return bad(W, format!("partial flag {} on a {state:?} slot", p[1]));
    }
    if p[2..8].iter().chain(&p[40..SLOT_BYTES]).any(|&b| b != 0) {
        return bad(W, "reserved slot bytes are not zero");
    }
    Ok(SlotRecord {
        state,
        uuid: Uuid(p[8..24].try_into().unwrap()),
        data_bytes: get_u64(p, 24),
        rebuild_offset: get_u64(p, 32),
        rebuild_partial: p[1] == 1,
    })
}

/// The superblock to trust from a base's two copies: the valid one with the higher sequence
/// (a torn write of one copy leaves the other). `None` when neither is valid.
pub fn newest(a: Result<Superblock, FormatError>, b: Result<Superblock, FormatError>) -> Option<Superblock> {
    match (a.ok(), b.ok()) {
        (Some(a), Some(b)) => Some(if b.seq > a.seq { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// A bitmap page: its bits and which raid and superblock sequence it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapPage {
    pub raid_uuid: Uuid,
    /// The superblock sequence current when it was written (never above the base's own).
    pub seq: u64,
    /// Its index among the bitmap pages (0 = page [`BITMAP_FIRST_PAGE`] of the base).
    pub index: u64,
    /// The bits, [`BITMAP_BITS_PER_PAGE`] / 64 words; bit `i` of word `w` is chunk
    /// `index * BITMAP_BITS_PER_PAGE + w * 64 + i`.
    pub words: Vec<u64>,
}

impl BitmapPage {
    /// The page's bytes. `words` may be shorter than a page's worth (the rest is zero).
    pub fn encode(&self) -> Box<PageBuf> {
        let mut p = Box::new([0u8; PAGE_SIZE]);
        p[..8].copy_from_slice(BM_MAGIC);
        put_u32(&mut p[..], 12, VERSION);
        p[16..32].copy_from_slice(&self.raid_uuid.0);
        put_u64(&mut p[..], 32, self.seq);
        put_u64(&mut p[..], 40, self.index);
        for (i, w) in self.words.iter().take(BITMAP_BITS_PER_PAGE as usize / 64).enumerate() {
            put_u64(&mut p[..], BITMAP_HEADER + i * 8, *w);
        }
        seal_page(&mut p[..], 8);
        p
    }

    /// Parses a bitmap page, refusing anything malformed with a reason.
    pub fn decode(page: &[u8]) -> Result<BitmapPage, FormatError> {
        const W: &str = "bitmap page";
        let p = check_page(W, page, BM_MAGIC, 8, 12)?;
        if p[48..BITMAP_HEADER].iter().any(|&b| b != 0) {
            return bad(W, "reserved bytes are not zero");
        }
        Ok(BitmapPage {
            raid_uuid: Uuid(p[16..32].try_into().unwrap()),
            seq: get_u64(p, 32),
            index: get_u64(p, 40),
            words: (BITMAP_HEADER..PAGE_SIZE).step_by(8).map(|at| get_u64(p, at)).collect(),
        })
    }

    /// Decodes and checks the page belongs where it was read: raid `sb.raid_uuid`, index
    /// `index`, a sequence not above the base's superblock.
    pub fn decode_for(page: &[u8], sb: &Superblock, index: u64) -> Result<BitmapPage, FormatError> {
        const W: &str = "bitmap page";
        let bp = BitmapPage::decode(page)?;
        if bp.raid_uuid != sb.raid_uuid {
            return bad(W, format!("from another raid ({})", bp.raid_uuid));
        }
        if bp.index != index {
            return bad(W, format!("index {} read at index {index}", bp.index));
        }
        if bp.seq > sb.seq {
            return bad(W, format!("sequence {} above the superblock's {}", bp.seq, sb.seq));
        }
        Ok(bp)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        let bytes = 1u64 << 30;
        let chunk = bitmap_chunk_bytes(bytes);
        Superblock {
            seq: 7,
            raid_uuid: Uuid([9; 16]),
            name: "r1".into(),
            level: RaidLevel::Raid1,
            strip_size_kb: 0,
            block_size: 512,
            raid_blocks: bytes / 512,
            data_offset: data_offset(bytes + DATA_ALIGN),
            bitmap_chunk_bytes: chunk,
            bitmap_first_page: BITMAP_FIRST_PAGE,
            bitmap_pages: bitmap_pages(bytes, chunk),
            clean: false,
            slot: 1,
            slots: vec![
                SlotRecord {
                    state: SlotState::Active,
                    uuid: Uuid([1; 16]),
                    data_bytes: bytes,
                    rebuild_offset: 0,
                    rebuild_partial: false,
                },
                SlotRecord {
                    state: SlotState::Rebuilding,
                    uuid: Uuid([2; 16]),
                    data_bytes: bytes,
                    rebuild_offset: 1 << 20,
                    rebuild_partial: true,
                },
            ],
        }
    }

    #[test]
    fn superblocks_round_trip_and_refuse_every_flipped_byte() {
        let sb = sample();
        let page = sb.encode();
        assert_eq!(Superblock::decode(&page[..]).unwrap(), sb);
        for at in [0, 9, 16, 30, 41, 104, 107, 130, 256, 300, 4095] {
            let mut p = page.clone();
            p[at] ^= 0x10;
            assert!(Superblock::decode(&p[..]).is_err(), "byte {at}");
        }
        assert!(Superblock::decode(&page[..100]).is_err());
        assert!(Superblock::decode(&[0u8; PAGE_SIZE]).unwrap_err().reason.contains("magic"));
    }

    #[test]
    fn inconsistent_superblocks_are_refused_with_a_reason() {
        type Change = Box<dyn Fn(&mut Superblock)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|s| s.block_size = 1000), "block size"),
            (Box::new(|s| s.bitmap_pages += 1), "bitmap pages"),
            (Box::new(|s| s.data_offset = 4096), "data offset"),
            (Box::new(|s| s.data_offset = 0), "bitmap runs"),
            (Box::new(|s| s.level = RaidLevel::Raid0), "strip size"),
            (
                Box::new(|s| {
                    s.slots[1].state = SlotState::Empty;
                    s.slots[1].rebuild_partial = false;
                }),
                "own slot",
            ),
            (Box::new(|s| s.slots[0].uuid = Uuid::NIL), "without a uuid"),
            (Box::new(|s| s.seq = 0), "sequence 0"),
            // A crafted offset whose data end wraps (a multiple of the alignment, past the bitmap).
            (Box::new(|s| s.data_offset = u64::MAX - DATA_ALIGN + 1), "overflows"),
        ];
        for (change, reason) in cases {
            let mut sb = sample();
            change(&mut sb);
            let err = Superblock::decode(&sb.encode()[..]).unwrap_err();
            assert!(err.reason.contains(reason), "{err} (wanted {reason})");
        }
    }

    #[test]
    fn a_slots_data_must_lie_inside_its_base() {
        let sb = sample();
        let end = sb.data_offset + sb.slots[1].data_bytes;
        sb.check_base_size(1, end).unwrap();
        let err = sb.check_base_size(1, end - 512).unwrap_err();
        assert!(err.reason.contains("past the base's"), "{err}");
        assert!(sb.check_base_size(2, u64::MAX).unwrap_err().reason.contains("no slot 2"));
        // Decoded superblocks cannot carry it, but the check stands alone.
        let wrapped = Superblock { data_offset: u64::MAX - DATA_ALIGN + 1, ..sample() };
        assert!(wrapped.check_base_size(0, u64::MAX).unwrap_err().reason.contains("overflows"));
    }

    #[test]
    fn newest_takes_the_valid_copy_with_the_higher_sequence() {
        let a = sample();
        let mut b = sample();
        b.seq = 8;
        let dec = |s: &Superblock| Superblock::decode(&s.encode()[..]);
        assert_eq!(newest(dec(&a), dec(&b)).unwrap().seq, 8);
        let mut torn = b.encode();
        torn[256..].fill(0);
        assert_eq!(newest(dec(&a), Superblock::decode(&torn[..])).unwrap().seq, 7);
        assert!(newest(Superblock::decode(&torn[..]), Superblock::decode(&[0; PAGE_SIZE])).is_none());
    }

    /// A page another build wrote (another version, its checksum intact) is refused naming the
    /// version, whichever kind of page it is.
    #[test]
    fn pages_of_another_version_are_refused_naming_it() {
        let sb = sample();
        let bp = BitmapPage { raid_uuid: sb.raid_uuid, seq: sb.seq, index: 0, words: vec![1] };
        for (kind, mut page, version_at, crc_at) in
            [("superblock", sb.encode(), 8, 12), ("bitmap", bp.encode(), 12, 8)]
        {
            put_u32(&mut page[..], version_at, VERSION + 1);
            seal_page(&mut page[..], crc_at);
            let err = match kind {
                "superblock" => Superblock::decode(&page[..]).unwrap_err(),
                _ => BitmapPage::decode(&page[..]).unwrap_err(),
            };
            let want = format!("version {} (this build reads {VERSION})", VERSION + 1);
            assert!(err.reason.contains(&want), "{kind}: {err}");
        }
    }

    #[test]
    fn bitmap_pages_round_trip_and_belong_to_their_raid() {
        let sb = sample();
        let mut words = vec![0u64; BITMAP_BITS_PER_PAGE as usize / 64];
        words[0] = 0b1011;
        words[503] = 1 << 63;
        let bp = BitmapPage { raid_uuid: sb.raid_uuid, seq: sb.seq, index: 0, words };
        let page = bp.encode();
        assert_eq!(BitmapPage::decode_for(&page[..], &sb, 0).unwrap(), bp);
        assert!(BitmapPage::decode_for(&page[..], &sb, 1).unwrap_err().reason.contains("index"));
        let other = BitmapPage { raid_uuid: Uuid([5; 16]), ..bp.clone() };
        assert!(BitmapPage::decode_for(&other.encode()[..], &sb, 0)
            .unwrap_err()
            .reason
            .contains("another raid"));
        let mut flipped = page.clone();
        flipped[100] ^= 1;
        assert!(BitmapPage::decode(&flipped[..]).unwrap_err().reason.contains("checksum"));
    }

    #[test]
    fn geometry_follows_the_design() {
        assert_eq!(bitmap_chunk_bytes(1 << 30), MIN_CHUNK_BYTES);
        // 1 TiB: 64 KiB chunks would be 16 Mi chunks; 128 KiB makes 8 Mi.
        assert_eq!(bitmap_chunk_bytes(1 << 40), 128 << 10);
        assert_eq!(data_offset(1 << 30), DATA_ALIGN);
        assert_eq!(bitmap_pages(1 << 40, 128 << 10), (8u64 << 20).div_ceil(BITMAP_BITS_PER_PAGE));
        assert!(data_offset(1 << 40) >= (2 + 261) * PAGE_SIZE as u64);
        assert_eq!(raid_bytes(RaidLevel::Raid1, &[10_000, 9_000], 512, 0), 8704);
        assert_eq!(raid_bytes(RaidLevel::Raid0, &[3 << 20, 5 << 20], 512, 1 << 20), 6 << 20);
        assert_eq!(raid_bytes(RaidLevel::Concat, &[1024, 2048], 512, 0), 3072);
    }
}
