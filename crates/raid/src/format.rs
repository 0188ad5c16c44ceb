//! The raid's metadata on each base, as bytes (docs/raid.md, "On-disk format"): two superblock
//! copies (pages 0 and 1, written alternately, the higher valid sequence wins, so a torn write
//! never loses the last good one), then the write-intent bitmap pages, then the data from
//! `data_offset`. Every page carries a CRC32C. Pure code: parsing refuses anything malformed
//! with a reason, and is fuzzed (`raid_superblock`).
//!
//! (placeholder API: the meta helper fills in the bodies and may add fields/functions; the
//! types and signatures below are the contract the io helper builds on.)

use fp_lvol::Uuid;

use crate::{RaidLevel, SlotState};

/// Bytes per metadata page.
pub const PAGE_SIZE: usize = 4096;

/// Bytes at the start of a bitmap page before its bits (magic, CRC, raid uuid, seq, index).
pub const BITMAP_HEADER: usize = 64;

/// Chunks one bitmap page covers.
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
