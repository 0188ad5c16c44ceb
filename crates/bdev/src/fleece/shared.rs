//! A fleece's shared state: the per-chunk words ([`ChunkMap`], the rules in the module docs
//! of `fleece`) and [`FleeceShared`], below the view bdev and the disk layer's hook.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::Bdev;

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
