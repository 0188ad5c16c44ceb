//! The job's dirty bitmap and per-chunk copy state: one bit per chunk of `granularity` bytes
//! (set: the target may differ from the source there), and one word per chunk whose high bit
//! says the copier is copying it and whose low bits count the blocking writes in flight on it.
//!
//! Writers set bits from any reactor; the copier clears them. A chunk's bit is cleared before
//! the copier reads the source, and writes mark their chunks when they complete, so a write
//! that lands after the read always leaves its chunk dirty again (docs/mirror.md).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The chunk word's flag: a copy of the chunk is in flight.
pub(crate) const COPYING: u32 = 1 << 31;

/// The largest bitmap a job keeps, in bytes: the default granularity grows with the disk so
/// that a bitmap never needs more.
pub const MAX_BITMAP_BYTES: u64 = 1 << 20;

/// The default granularity for disks small enough: QEMU's mirror uses the target's cluster
/// size, 64 KiB for a qcow2 image.
pub const DEFAULT_GRANULARITY: u64 = 64 << 10;

/// The largest granularity accepted (a copy buffer holds at least one chunk).
pub const MAX_GRANULARITY: u64 = 64 << 20;

pub(crate) struct DirtyMap {
    shift: u32,
    len: u64,
    chunks: u64,
    words: Box<[AtomicU64]>,
    state: Box<[AtomicU32]>,
    /// Chunks whose bit is set.
    dirty: AtomicU64,
}

impl DirtyMap {
    /// A map of `len` bytes in chunks of `granularity` (a power of two), every chunk dirty.
    pub(crate) fn new(len: u64, granularity: u64) -> DirtyMap {
        let shift = granularity.trailing_zeros();
        let chunks = len.div_ceil(granularity);
        let nwords = chunks.div_ceil(64) as usize;
        let words: Box<[AtomicU64]> = (0..nwords)
            .map(|w| {
                let left = chunks - w as u64 * 64;
                AtomicU64::new(if left >= 64 { u64::MAX } else { (1u64 << left) - 1 })
            })
            .collect();
        let state = (0..chunks).map(|_| AtomicU32::new(0)).collect();
        DirtyMap { shift, len, chunks, words, state, dirty: AtomicU64::new(chunks) }
    }

    pub(crate) fn granularity(&self) -> u64 {
        1 << self.shift
    }

    pub(crate) fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Dirty chunks now.
    pub(crate) fn dirty_chunks(&self) -> u64 {
        self.dirty.load(Ordering::SeqCst)
    }

    /// The bytes of chunk `c`: `(offset, len)`, the last one cut at the end of the disk.
    pub(crate) fn chunk_bytes(&self, c: u64) -> (u64, u64) {
        let off = c << self.shift;
        (off, (self.len - off).min(self.granularity()))
    }

    /// The chunks `[offset, offset + len)` touches, cut at the end of the map (a source that
    /// grew has blocks the job does not copy).
    pub(crate) fn chunk_range(&self, offset: u64, len: u64) -> Range<u64> {
        if len == 0 || offset >= self.len {
            return 0..0;
        }
        let end = offset.saturating_add(len).min(self.len);
        (offset >> self.shift)..((end - 1) >> self.shift) + 1
    }

    /// Marks `[offset, offset + len)` dirty. Release: the copier that clears a bit this set
    /// sees the data of the write that set it.
    pub(crate) fn mark(&self, offset: u64, len: u64) {
        for c in self.chunk_range(offset, len) {
            let bit = 1u64 << (c % 64);
            let old = self.words[(c / 64) as usize].fetch_or(bit, Ordering::SeqCst);
            if old & bit == 0 {
                self.dirty.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    pub(crate) fn is_dirty(&self, c: u64) -> bool {
        self.words[(c / 64) as usize].load(Ordering::SeqCst) & (1 << (c % 64)) != 0
    }

    /// Clears chunk `c`'s bit (the copier, before it reads the source).
    pub(crate) fn clear(&self, c: u64) {
        let bit = 1u64 << (c % 64);
        let old = self.words[(c / 64) as usize].fetch_and(!bit, Ordering::SeqCst);
        if old & bit != 0 {
            self.dirty.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The first dirty chunk at `from` or after, wrapping around once.
    pub(crate) fn next_dirty(&self, from: u64) -> Option<u64> {
        if self.chunks == 0 || self.dirty_chunks() == 0 {
            return None;
        }
        let from = from % self.chunks;
        let nwords = self.words.len();
        let first = (from / 64) as usize;
        for i in 0..=nwords {
            let w = (first + i) % nwords;
            let mut bits = self.words[w].load(Ordering::SeqCst);
            if i == 0 {
                bits &= u64::MAX << (from % 64);
            }
            if bits != 0 {
                return Some(w as u64 * 64 + u64::from(bits.trailing_zeros()));
            }
        }
        // The first word's low bits, before `from`.
        let bits = self.words[first].load(Ordering::SeqCst) & !(u64::MAX << (from % 64));
        (bits != 0).then(|| first as u64 * 64 + u64::from(bits.trailing_zeros()))
    }

    /// The copier takes chunk `c`: only when no copy and no blocking write is on it.
    pub(crate) fn try_begin_copy(&self, c: u64) -> bool {
        self.state[c as usize].compare_exchange(0, COPYING, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    pub(crate) fn end_copy(&self, c: u64) {
        self.state[c as usize].fetch_and(!COPYING, Ordering::SeqCst);
    }

    /// A blocking write enters its chunks; true when a copy was running on one of them (the
    /// write then marks its chunks dirty when it completes: the copy may have read the source
    /// before the write and write the target after it).
    pub(crate) fn writer_enter(&self, chunks: Range<u64>) -> bool {
        let mut saw_copy = false;
        for c in chunks {
            saw_copy |= self.state[c as usize].fetch_add(1, Ordering::SeqCst) & COPYING != 0;
        }
        saw_copy
    }

    pub(crate) fn writer_leave(&self, chunks: Range<u64>) {
        for c in chunks {
            self.state[c as usize].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// The granularity for a disk of `len` bytes: `asked` if given (checked), else the default
/// or the smallest power of two that keeps the bitmap within [`MAX_BITMAP_BYTES`].
pub(crate) fn granularity_for(len: u64, block_size: u32, asked: Option<u64>) -> Result<u64, String> {
    let max_chunks = MAX_BITMAP_BYTES * 8;
    let least = len.div_ceil(max_chunks).next_power_of_two().max(u64::from(block_size));
    match asked {
        None => Ok(least.max(DEFAULT_GRANULARITY)),
        Some(g) if !g.is_power_of_two() => Err(format!("{g} is not a power of two")),
        Some(g) if g < u64::from(block_size) => {
            Err(format!("{g} is smaller than the block size, {block_size} bytes"))
        }
        Some(g) if g > MAX_GRANULARITY => Err(format!("{g} is more than {MAX_GRANULARITY} bytes")),
        Some(g) if g < least => Err(format!(
            "{g} would need a bitmap over {MAX_BITMAP_BYTES} bytes for {len} bytes: use {least} or more"
        )),
        Some(g) => Ok(g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_all_dirty_and_finds_each_chunk_once() {
        let m = DirtyMap::new(130 * 4096 + 512, 4096);
        assert_eq!(m.chunks(), 131);
        assert_eq!(m.dirty_chunks(), 131);
        assert_eq!(m.chunk_bytes(130), (130 * 4096, 512));
        let mut seen = 0;
        let mut at = 0;
        while let Some(c) = m.next_dirty(at) {
            assert!(m.is_dirty(c));
            m.clear(c);
            seen += 1;
            at = c + 1;
        }
        assert_eq!(seen, 131);
        assert_eq!(m.dirty_chunks(), 0);
    }

    #[test]
    fn marks_wrap_and_count_once() {
        let m = DirtyMap::new(1 << 20, 4096);
        for c in 0..m.chunks() {
            m.clear(c);
        }
        m.mark(4095, 2); // chunks 0 and 1
        m.mark(4096, 4096); // chunk 1 again
        m.mark(u64::MAX - 10, 5); // beyond the map: ignored
        assert_eq!(m.dirty_chunks(), 2);
        assert_eq!(m.next_dirty(100), Some(0), "wraps to the start");
        assert_eq!(m.next_dirty(1), Some(1));
        assert_eq!(m.chunk_range(0, 0), 0..0);
        assert_eq!(m.chunk_range((1 << 20) - 512, 4096), 255..256);
    }

    #[test]
    fn copies_and_writers_exclude_each_other() {
        let m = DirtyMap::new(1 << 16, 4096);
        assert!(!m.writer_enter(2..4));
        assert!(!m.try_begin_copy(3), "a writer is on it");
        assert!(m.try_begin_copy(4));
        assert!(m.writer_enter(4..5), "the writer sees the copy");
        m.writer_leave(2..5);
        m.end_copy(4);
        assert!(m.try_begin_copy(3));
    }

    #[test]
    fn granularity_keeps_the_bitmap_small() {
        assert_eq!(granularity_for(1 << 30, 512, None), Ok(64 << 10));
        // 4 TiB in at most 2^23 chunks: 512 KiB each.
        assert_eq!(granularity_for(1 << 42, 512, None), Ok(1 << 19));
        assert!(granularity_for(1 << 30, 512, Some(3000)).unwrap_err().contains("power of two"));
        assert!(granularity_for(1 << 30, 4096, Some(512)).unwrap_err().contains("block size"));
        assert!(granularity_for(1 << 42, 512, Some(4096)).unwrap_err().contains("bitmap"));
        assert_eq!(granularity_for(1 << 30, 512, Some(4096)), Ok(4096));
    }
}
