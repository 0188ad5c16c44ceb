//! A point-in-time view of a live disk (QEMU's fleecing: a copy-before-write filter above the
//! source and a `snapshot-access` node), for backups that read a consistent image while the
//! guest writes.
//!
//! Before a guest write, write-zeroes or discard changes a chunk for the first time since the
//! point in time, the chunk's old content is read from the base and written to the *target*
//! (a bdev at least as large, holding old contents at the same offsets). The point-in-time
//! bdev ([`FleeceDevice`]) reads copied chunks from the target and the others from the base.
//! The base's own channels do the filter's part (`disk/fleece.rs`), as they do a mirror job's.
//!
//! ## One word per chunk, shared by every channel
//!
//! Each chunk has an atomic word ([`ChunkMap`]): `COPIED`, `COPYING` and, in its low bits, the
//! number of point-in-time reads of that chunk in flight *on the base*.
//!
//! * A guest write that touches a chunk goes down only when the chunk is `COPIED` and no
//!   point-in-time read of the base is in flight on it. Otherwise the write is held in its
//!   channel. A chunk neither copied nor copying is claimed for copying by one compare-and-swap
//!   (`COPYING`): exactly one channel wins and copies it; writes of the others wait for
//!   `COPIED`. So two channels never both copy a chunk, and none lets a write through early.
//! * A point-in-time read of a chunk that is not `COPIED` adds one to the chunk's readers
//!   (compare-and-swap, refused once `COPIED` is set) and reads the base; a chunk `COPIED`
//!   is read from the target. A copy may run under such readers (it only reads the base too);
//!   the write waits for the count to drop to zero. This is the simplest correct rule: a
//!   backup's reads never copy anything (the target only grows with the guest's writes), and
//!   a guest write never reaches the base under a read that still expects the old data.
//! * A copy that fails (the base's read or the target's write, other than Busy, which is
//!   retried) breaks the snapshot, QEMU's `on-cbw-error=break-snapshot`: the guest's write
//!   goes down, and every read of the point-in-time bdev fails with EIO from then on (reads
//!   in flight included). The guest is never harmed by a backup. A write held longer than
//!   [`HOLD_BOUND`] breaks the snapshot too: every wait is bounded.

mod device;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub use device::FleeceDevice;

use crate::Bdev;

/// The granularity when none is asked for: QEMU's CBW default cluster size.
pub const DEFAULT_FLEECE_GRANULARITY: u64 = 64 << 10;
/// The smallest granularity (a 4 KiB sector-sized copy per chunk at least).
pub const MIN_FLEECE_GRANULARITY: u64 = 4 << 10;
/// The largest granularity (each copy holds a buffer of this size).
pub const MAX_FLEECE_GRANULARITY: u64 = 16 << 20;

/// The longest a guest write waits for its chunks' copies (and point-in-time reads) before the
/// snapshot is broken and the write goes down: the guest comes first.
pub const HOLD_BOUND: Duration = Duration::from_secs(10);

/// The chunk's old content is on the target.
const COPIED: u32 = 1 << 31;
/// A channel copies it now.
const COPYING: u32 = 1 << 30;
/// Point-in-time reads in flight on the base.
const READERS: u32 = COPYING - 1;

/// What a guest write may do about one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriterStep {
    /// The chunk is copied and nobody reads its old content from the base.
    Go,
    /// A copy or a point-in-time read of the base is under way.
    Wait,
    /// Nobody copies it: claim it ([`ChunkMap::try_start_copy`]) and copy it.
    Copy,
}

/// The per-chunk words (see the module docs).
pub(crate) struct ChunkMap {
    words: Box<[AtomicU32]>,
    shift: u32,
}

impl ChunkMap {
    pub(crate) fn new(len: u64, granularity: u64) -> ChunkMap {
        let shift = granularity.trailing_zeros();
        let n = len.div_ceil(granularity) as usize;
        ChunkMap { words: (0..n).map(|_| AtomicU32::new(0)).collect(), shift }
    }

    pub(crate) fn count(&self) -> u64 {
        self.words.len() as u64
    }

    /// The chunks `[offset, offset + len)` touches (empty for an empty range).
    pub(crate) fn chunks(&self, offset: u64, len: u64) -> Range<u64> {
        if len == 0 {
            return 0..0;
        }
        let last = ((offset + len - 1) >> self.shift).min(self.count().saturating_sub(1));
        (offset >> self.shift)..last + 1
    }

    fn word(&self, chunk: u64) -> &AtomicU32 {
        &self.words[chunk as usize]
    }

    /// See [`WriterStep`].
    pub(crate) fn writer_step(&self, chunk: u64) -> WriterStep {
        let s = self.word(chunk).load(Ordering::Acquire);
        if s & COPIED != 0 {
            if s & READERS == 0 {
                WriterStep::Go
            } else {
                WriterStep::Wait
            }
        } else if s & COPYING != 0 {
            WriterStep::Wait
        } else {
            WriterStep::Copy
        }
    }

    /// Claims `chunk` for copying; false when it is copied or another channel copies it.
    pub(crate) fn try_start_copy(&self, chunk: u64) -> bool {
        let w = self.word(chunk);
        let mut s = w.load(Ordering::Acquire);
        loop {
            if s & (COPIED | COPYING) != 0 {
                return false;
            }
            match w.compare_exchange_weak(s, s | COPYING, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// Ends the copy of `chunk` (claimed by [`ChunkMap::try_start_copy`]). Marked copied even
    /// when it failed: the snapshot is broken then, and nobody waits for it any more.
    pub(crate) fn finish_copy(&self, chunk: u64) {
        // Release: whoever sees COPIED sees the target's write done.
        self.word(chunk).fetch_xor(COPYING | COPIED, Ordering::AcqRel);
    }

    /// A point-in-time read of `chunk`: true (a reader is counted) when it is to read the base,
    /// false when the chunk is copied (read the target).
    pub(crate) fn start_base_read(&self, chunk: u64) -> bool {
        let w = self.word(chunk);
        let mut s = w.load(Ordering::Acquire);
        loop {
            if s & COPIED != 0 {
                return false;
            }
            // At most 2^30 - 1 readers: far more than every channel together holds in flight.
            debug_assert!(s & READERS != READERS);
            match w.compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// A point-in-time read of the base on `chunk` completed.
    pub(crate) fn end_base_read(&self, chunk: u64) {
        self.word(chunk).fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether `chunk` is copied.
    #[cfg(test)]
    pub(crate) fn copied(&self, chunk: u64) -> bool {
        self.word(chunk).load(Ordering::Acquire) & COPIED != 0
    }
}

/// A fleece's state shared by the base's channels, the point-in-time bdev and the control plane.
pub struct FleeceShared {
    /// The point-in-time bdev's name.
    pub name: String,
    /// The base bdev's name.
    pub base_name: String,
    /// The target bdev's name.
    pub target_name: String,
    /// The base's device itself, below its disk: copies and point-in-time reads of the base
    /// are no guest I/O and must not pass through the base's own copy-before-write.
    pub(crate) base: Bdev,
    /// The target (its disk: what is written there counts in its statistics).
    pub(crate) target: Bdev,
    /// The base's size at creation, in bytes: what the view presents.
    pub len: u64,
    /// Bytes per chunk.
    pub granularity: u64,
    pub(crate) map: ChunkMap,
    pub(crate) copied: AtomicU64,
    broken: AtomicBool,
    /// Deleted: the view reads nothing any more.
    ended: AtomicBool,
    error: Mutex<Option<String>>,
}

impl FleeceShared {
    /// A fleece of `base` (the base disk's device) onto `target`; checks are the caller's.
    pub fn new(
        name: &str,
        base_name: &str,
        base: Bdev,
        target_name: &str,
        target: Bdev,
        granularity: u64,
    ) -> FleeceShared {
        let len = base.info().size_bytes();
        FleeceShared {
            name: name.into(),
            base_name: base_name.into(),
            target_name: target_name.into(),
            base,
            target,
            len,
            granularity,
            map: ChunkMap::new(len, granularity),
            copied: AtomicU64::new(0),
            broken: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    /// Breaks the snapshot (first reason wins): reads fail from now on, writes go down.
    pub fn break_snapshot(&self, why: String) {
        let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_none() {
            log::warn!("fleece '{}' of '{}' broken: {why}", self.name, self.base_name);
            *e = Some(why);
        }
        self.broken.store(true, Ordering::SeqCst);
    }

    /// Whether the snapshot is broken.
    pub fn broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Why it broke.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Chunks copied to the target so far.
    pub fn copied_chunks(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    /// Chunks of the view.
    pub fn chunk_count(&self) -> u64 {
        self.map.count()
    }

    /// Marks it deleted: its bdev fails every read from now on.
    pub fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The byte range of `chunk`, cut at the end of the view.
    pub(crate) fn chunk_range(&self, chunk: u64) -> (u64, u64) {
        let start = chunk * self.granularity;
        (start, self.granularity.min(self.len - start))
    }
}

/// Checks a granularity: a power of two from [`MIN_FLEECE_GRANULARITY`] to
/// [`MAX_FLEECE_GRANULARITY`], and a multiple of `block_size`.
pub fn check_granularity(granularity: u64, block_size: u32) -> Result<(), String> {
    if !granularity.is_power_of_two()
        || !(MIN_FLEECE_GRANULARITY..=MAX_FLEECE_GRANULARITY).contains(&granularity)
    {
        return Err(format!(
            "{granularity} is not a power of two from {MIN_FLEECE_GRANULARITY} to {MAX_FLEECE_GRANULARITY}"
        ));
    }
    if !granularity.is_multiple_of(u64::from(block_size)) {
        return Err(format!("{granularity} is not a multiple of the block size {block_size}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
