//! The write-intent map of a raid1: one state word per chunk of the data region, shared by the
//! channels (every write) and the owner (persisting bits, clearing them, rebuilding).
//!
//! Semantics (docs/raid-format.md, "Write-intent bitmap"; Linux md's bitmap is the anchor):
//! * a chunk's bit is durable on every in-sync base *before* any write to the chunk is
//!   submitted; a channel whose write finds the bit not yet durable parks the write until
//!   [`IntentMap::is_durable`] says so (the owner writes the bitmap pages, flushes, then
//!   advances the durable sequence);
//! * bits are cleared only by the owner, lazily (a chunk with no write in flight and none for
//!   a whole clearing period), and never while any slot is not Active: so after an outage the
//!   bits cover every write the returning replica missed;
//! * the same word carries the rebuild's interlock, as the mirror's does: writers in flight
//!   (count) and `COPYING`. A copy starts on a chunk only with no writer in it; a write that
//!   starts while a copy is in flight marks the chunk to be copied again.
//!
//! Memory order: a channel calls [`IntentMap::begin_write`] *before* it loads the layout for
//! that write (SeqCst), and the owner publishes a new rebuild target *before* its first
//! [`IntentMap::try_start_copy`]; so a write that did not see the target either holds the
//! chunk (the copy waits) or marks it again.
//!
//! Sequences: a writer that sets a bit (or finds one set but not yet durable) first sets the
//! bit in the bitmap words and its page's dirty bit, *then* takes a ticket from `wanted`
//! (SeqCst). The owner reads `wanted` *before* it takes the dirty pages, so the pages it writes
//! hold every bit whose ticket is at most the sequence it then declares durable.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::format::BITMAP_BITS_PER_PAGE;

/// Writers in flight in the chunk (low bits of the state word).
const WRITERS: u32 = 0xFFFF;
/// The chunk's bit is set (in memory; on disk once not `PENDING`).
const BIT: u32 = 1 << 16;
/// The bit was set and is not yet known durable.
const PENDING: u32 = 1 << 17;
/// Written since the last clearing pass (md's two-pass clearing).
const RECENT: u32 = 1 << 18;
/// The rebuild is copying the chunk.
const COPYING: u32 = 1 << 19;
/// A write overlapped a copy of the chunk: copy it again before the rebuild completes.
const RECOPY: u32 = 1 << 20;

/// A write's registration in the map, from `begin_write` to `end_write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTicket {
    /// First and last chunk the write touches.
    pub first: u64,
    pub last: u64,
    /// The durable sequence the write must wait for before it is submitted; 0: none.
    pub wait_seq: u64,
    /// A copy was in flight on one of its chunks when it started: mark them again at the end.
    pub remark: bool,
}

/// The pages one persistence pass writes: taken by [`IntentMap::take_dirty`], then either
/// [`IntentMap::mark_durable`] once written and flushed everywhere, or
/// [`IntentMap::requeue`] when the pass could not finish.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PersistBatch {
    /// The sequence that becomes durable with these pages.
    pub seq: u64,
    /// Bitmap page index (0 = the first bitmap page) and its bits as words, as snapshotted.
    pub pages: Vec<(u64, Vec<u64>)>,
}

/// The shared map. `Send + Sync`; every operation is lock free.
pub struct IntentMap {
    chunk_bytes: u64,
    chunk_shift: u32,
    chunks: u64,
    persistent: bool,
    state: Box<[AtomicU32]>,
    /// The bitmap as it should be on disk: one bit per chunk.
    words: Box<[AtomicU64]>,
    /// One bit per bitmap page that differs from what was last written.
    dirty: Box<[AtomicU64]>,
    wanted: AtomicU64,
    durable: AtomicU64,
    /// At least the number of chunks marked `RECOPY`: raised before a mark is set and lowered
    /// after one is taken, so 0 means none is marked and the copier's look for one
    /// ([`IntentMap::next_recopy`], every step of the rebuild) needs no scan of the chunks.
    recopies: AtomicU64,
}

/// Words of bitmap bits per bitmap page.
const WORDS_PER_PAGE: u64 = BITMAP_BITS_PER_PAGE / 64;

impl IntentMap {
    /// A map of `data_bytes` bytes in chunks of `chunk_bytes` (a power of two).
    /// `persistent`: bits must be durable before writes go (a raid with a superblock); without
    /// it bits are kept in memory only (still used for the rebuild interlock).
    pub fn new(data_bytes: u64, chunk_bytes: u64, persistent: bool) -> IntentMap {
        assert!(chunk_bytes.is_power_of_two(), "chunk size must be a power of two");
        let chunks = data_bytes.div_ceil(chunk_bytes).max(1);
        let pages = chunks.div_ceil(BITMAP_BITS_PER_PAGE);
        IntentMap {
            chunk_bytes,
            chunk_shift: chunk_bytes.trailing_zeros(),
            chunks,
            persistent,
            state: (0..chunks).map(|_| AtomicU32::new(0)).collect(),
            words: (0..pages * WORDS_PER_PAGE).map(|_| AtomicU64::new(0)).collect(),
            dirty: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            wanted: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            recopies: AtomicU64::new(0),
        }
    }

    /// Bytes per chunk.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Number of bitmap pages the map needs on disk.
    pub fn pages(&self) -> u64 {
        self.words.len() as u64 / WORDS_PER_PAGE
    }

    /// Whether bits must be durable before writes (a raid with a superblock).
    pub fn persistent(&self) -> bool {
        self.persistent
    }

    fn range(&self, offset: u64, len: u64) -> (u64, u64) {
        let first = (offset >> self.chunk_shift).min(self.chunks - 1);
        let end = offset.saturating_add(len.max(1)) - 1;
        (first, (end >> self.chunk_shift).min(self.chunks - 1))
    }

    /// Sets the chunk's bit in the words and its page's dirty bit.
    fn mark_word(&self, chunk: u64) {
        self.words[(chunk / 64) as usize].fetch_or(1 << (chunk % 64), Ordering::SeqCst);
        let page = chunk / BITMAP_BITS_PER_PAGE;
        self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::SeqCst);
    }

    /// Registers a write (or discard, write-zeroes) of `[offset, offset + len)` of the data
    /// region: counts it in its chunks, sets bits that are not set (asking the owner to persist
    /// them: the caller then calls [`crate::shared::RaidShared::wake_owner`] once per poll
    /// round when any ticket has `wait_seq != 0`).
    pub fn begin_write(&self, offset: u64, len: u64) -> WriteTicket {
        let (first, last) = self.range(offset, len);
        let mut remark = false;
        let mut must_wait = false;
        for c in first..=last {
            let s = &self.state[c as usize];
            let old = s.fetch_add(1, Ordering::SeqCst);
            debug_assert!(old & WRITERS < WRITERS, "too many writers in one chunk");
            if old & COPYING != 0 {
                // Recorded now, not at the end: the copier checks it when the copy ends.
                self.mark_recopy(s);
                remark = true;
            }
            if old & (BIT | RECENT) != BIT | RECENT || old & PENDING != 0 {
                let prev =
                    s.fetch_or(BIT | RECENT | if old & BIT == 0 { PENDING } else { 0 }, Ordering::SeqCst);
                if self.persistent && (prev & BIT == 0 || prev & PENDING != 0) {
                    // Set the word ourselves even when another writer set the bit: it may not
                    // have reached its word yet, and our ticket must cover it.
                    self.mark_word(c);
                    must_wait = true;
                } else if prev & BIT == 0 {
                    self.mark_word(c);
                }
            }
        }
        let wait_seq = if must_wait { self.wanted.fetch_add(1, Ordering::SeqCst) + 1 } else { 0 };
        WriteTicket { first, last, wait_seq, remark }
    }

    /// Whether a ticket's bits are durable, so its write may be submitted. One load.
    #[inline]
    pub fn is_durable(&self, ticket: &WriteTicket) -> bool {
        ticket.wait_seq == 0 || self.durable.load(Ordering::Acquire) >= ticket.wait_seq
    }

    /// Ends a write registered by `begin_write` (after every base answered).
    pub fn end_write(&self, ticket: &WriteTicket) {
        for c in ticket.first..=ticket.last {
            let s = &self.state[c as usize];
            if ticket.remark {
                self.mark_recopy(s);
            }
            s.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Whether any bit waits to be written (the owner's cue to run a persistence pass).
    pub fn needs_persist(&self) -> bool {
        self.wanted.load(Ordering::SeqCst) > self.durable.load(Ordering::SeqCst)
            || self.dirty.iter().any(|d| d.load(Ordering::SeqCst) != 0)
    }

    /// The sequence durable now.
    pub fn durable_seq(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }

    /// The owner: takes the dirty pages and snapshots their bits, with the sequence they make
    /// durable. `None` when nothing is to be written and nobody waits.
    pub fn take_dirty(&self) -> Option<PersistBatch> {
        // Before the pages: every ticket up to `seq` has its bits in the words already.
        let seq = self.wanted.load(Ordering::SeqCst);
        let mut pages = Vec::new();
        for (i, d) in self.dirty.iter().enumerate() {
            let mut bits = d.swap(0, Ordering::SeqCst);
            while bits != 0 {
                let page = i as u64 * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                pages.push((page, self.page_words(page)));
            }
        }
        if pages.is_empty() && seq <= self.durable.load(Ordering::SeqCst) {
            return None;
        }
        Some(PersistBatch { seq, pages })
    }

    /// The bits of bitmap page `page`, as words (what a fresh write of the page holds).
    pub fn page_words(&self, page: u64) -> Vec<u64> {
        let at = (page * WORDS_PER_PAGE) as usize;
        self.words[at..at + WORDS_PER_PAGE as usize].iter().map(|w| w.load(Ordering::SeqCst)).collect()
    }

    /// The owner: `batch` is written and flushed on every base that takes writes. Waiting
    /// writes up to its sequence may go; its chunks' bits are no longer pending.
    pub fn mark_durable(&self, batch: &PersistBatch) {
        for (page, words) in &batch.pages {
            for (w, &bits) in words.iter().enumerate() {
                let mut bits = bits;
                while bits != 0 {
                    let c = (page * WORDS_PER_PAGE + w as u64) * 64 + u64::from(bits.trailing_zeros());
                    bits &= bits - 1;
                    if c < self.chunks {
                        self.state[c as usize].fetch_and(!PENDING, Ordering::SeqCst);
                    }
                }
            }
        }
        self.durable.fetch_max(batch.seq, Ordering::SeqCst);
    }

    /// The owner: the pass failed; its pages are dirty again.
    pub fn requeue(&self, batch: &PersistBatch) {
        for (page, _) in &batch.pages {
            self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::SeqCst);
        }
    }

    /// Assembly: sets the bits of bitmap page `page` read from a base (union over bases:
    /// call once per base). The bits are on disk already, so not pending.
    pub fn load_page(&self, page: u64, words: &[u64]) {
        for (w, &bits) in words.iter().enumerate().take(WORDS_PER_PAGE as usize) {
            let mut bits = bits;
            let word = page * WORDS_PER_PAGE + w as u64;
            while bits != 0 {
                let c = word * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                if c < self.chunks {
                    self.state[c as usize].fetch_or(BIT, Ordering::SeqCst);
                    self.words[word as usize].fetch_or(1 << (c % 64), Ordering::SeqCst);
                }
            }
        }
    }

    /// Sets the bits of `count` chunks from `first` and makes their pages dirty (a corrupt
    /// bitmap page is treated as all dirty and rewritten). Not pending: nobody waits on them.
    pub fn mark_chunks(&self, first: u64, count: u64) {
        for c in first..(first + count).min(self.chunks) {
            self.state[c as usize].fetch_or(BIT, Ordering::SeqCst);
            self.mark_word(c);
        }
    }

    /// Whether chunk `chunk`'s bit is set.
    pub fn is_set(&self, chunk: u64) -> bool {
        self.state[chunk as usize].load(Ordering::SeqCst) & BIT != 0
    }

    /// Number of chunks whose bit is set.
    pub fn set_count(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.load(Ordering::SeqCst).count_ones())).sum()
    }

    /// The owner's clearing pass (call it once per period, only while every slot is Active and
    /// no process runs): a chunk written since the last pass is kept for one more; a chunk
    /// neither written since nor in flight loses its bit and its page becomes dirty. Returns
    /// how many bits were cleared.
    pub fn clear_pass(&self) -> u64 {
        let mut cleared = 0;
        for (c, s) in self.state.iter().enumerate() {
            let old = s.load(Ordering::SeqCst);
            if old & BIT == 0 || old & WRITERS != 0 || old & PENDING != 0 {
                continue;
            }
            if old & RECENT != 0 {
                s.fetch_and(!RECENT, Ordering::SeqCst);
                continue;
            }
            // Only from exactly "set, idle": a writer arriving meanwhile keeps the bit.
            if s.compare_exchange(old, old & !BIT, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                let c = c as u64;
                self.words[(c / 64) as usize].fetch_and(!(1 << (c % 64)), Ordering::SeqCst);
                let page = c / BITMAP_BITS_PER_PAGE;
                self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::SeqCst);
                cleared += 1;
            }
        }
        cleared
    }

    /// The copier: claims chunk `chunk` for a copy when no write is in flight in it. A claim
    /// also takes the chunk's pending re-copy. `false`: busy, try again later.
    pub fn try_start_copy(&self, chunk: u64) -> bool {
        let s = &self.state[chunk as usize];
        match s.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            (v & WRITERS == 0 && v & COPYING == 0).then_some((v | COPYING) & !RECOPY)
        }) {
            Ok(old) => {
                if old & RECOPY != 0 {
                    self.recopies.fetch_sub(1, Ordering::SeqCst);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// The copier: the copy of `chunk` ended. `true` when a write overlapped it, so the chunk
    /// must be copied again (it stays marked for [`IntentMap::next_recopy`]).
    pub fn end_copy(&self, chunk: u64) -> bool {
        let s = &self.state[chunk as usize];
        // Counted before the mark may appear (the bound's rule); given back if none is new.
        self.recopies.fetch_add(1, Ordering::SeqCst);
        let old = s
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                let again = v & WRITERS != 0 || v & RECOPY != 0;
                Some((v & !COPYING) | if again { RECOPY } else { 0 })
            })
            .unwrap_or_else(|v| v);
        let again = old & WRITERS != 0 || old & RECOPY != 0;
        if !again || old & RECOPY != 0 {
            self.recopies.fetch_sub(1, Ordering::SeqCst);
        }
        again
    }

    /// Marks a chunk's state word `RECOPY`, counting the mark before it can be seen.
    fn mark_recopy(&self, s: &AtomicU32) {
        self.recopies.fetch_add(1, Ordering::SeqCst);
        if s.fetch_or(RECOPY, Ordering::SeqCst) & RECOPY != 0 {
            self.recopies.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The first chunk at or after `from` marked to be copied again, if any. With no chunk
    /// marked (the rule of a rebuild beside a guest that does not write to the chunks being
    /// copied) it is one load; else a scan from `from`.
    pub fn next_recopy(&self, from: u64) -> Option<u64> {
        if self.recopies.load(Ordering::SeqCst) == 0 {
            return None;
        }
        (from..self.chunks).find(|&c| self.state[c as usize].load(Ordering::SeqCst) & RECOPY != 0)
    }

    /// Writers in flight in `chunk` (tests, diagnostics).
    pub fn writers(&self, chunk: u64) -> u32 {
        self.state[chunk as usize].load(Ordering::SeqCst) & WRITERS
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use super::*;

    const K64: u64 = 64 << 10;

    #[test]
    fn a_write_sets_its_chunks_bits_and_waits_for_durability() {
        let m = IntentMap::new(1 << 30, K64, true);
        assert_eq!(m.chunks(), (1 << 30) / K64);
        let t = m.begin_write(K64 - 512, 1024);
        assert_eq!((t.first, t.last), (0, 1));
        assert!(t.wait_seq != 0 && !m.is_durable(&t));
        assert!(m.needs_persist());
        let b = m.take_dirty().unwrap();
        assert_eq!(b.pages.len(), 1);
        assert_eq!(b.pages[0].1[0], 0b11);
        assert!(b.seq >= t.wait_seq);
        m.mark_durable(&b);
        assert!(m.is_durable(&t));
        m.end_write(&t);
        // The bit is durable now: the next write to the chunk does not wait.
        let t2 = m.begin_write(100, 4096);
        assert_eq!(t2.wait_seq, 0);
        m.end_write(&t2);
        assert!(m.take_dirty().is_none());
        assert_eq!(m.set_count(), 2);
    }

    #[test]
    fn a_second_writer_of_a_pending_bit_waits_too() {
        let m = IntentMap::new(1 << 20, K64, true);
        let a = m.begin_write(0, 4096);
        let b = m.begin_write(4096, 4096);
        assert!(a.wait_seq != 0 && b.wait_seq > a.wait_seq);
        let batch = m.take_dirty().unwrap();
        m.mark_durable(&batch);
        assert!(m.is_durable(&a) && m.is_durable(&b));
    }

    #[test]
    fn a_failed_pass_requeues_its_pages() {
        let m = IntentMap::new(1 << 20, K64, true);
        let t = m.begin_write(0, 1);
        let b = m.take_dirty().unwrap();
        m.requeue(&b);
        assert!(!m.is_durable(&t));
        let b2 = m.take_dirty().unwrap();
        assert_eq!(b2.pages, b.pages);
        m.mark_durable(&b2);
        assert!(m.is_durable(&t));
    }

    #[test]
    fn without_persistence_nothing_waits_but_bits_are_kept() {
        let m = IntentMap::new(1 << 20, K64, false);
        let t = m.begin_write(3 * K64, 10);
        assert_eq!(t.wait_seq, 0);
        assert!(m.is_durable(&t));
        assert!(m.is_set(3));
        m.end_write(&t);
    }

    #[test]
    fn clearing_takes_two_idle_passes_and_never_an_inflight_chunk() {
        let m = IntentMap::new(1 << 20, K64, true);
        let a = m.begin_write(0, 1);
        let b = m.begin_write(K64, 1);
        let batch = m.take_dirty().unwrap();
        m.mark_durable(&batch);
        m.end_write(&a);
        assert_eq!(m.clear_pass(), 0, "recent writes keep their bits one pass");
        assert_eq!(m.clear_pass(), 1, "chunk 0 idle for a whole pass");
        assert!(!m.is_set(0) && m.is_set(1), "chunk 1 has a write in flight");
        let p = m.take_dirty().unwrap();
        assert_eq!(p.pages[0].1[0], 0b10);
        m.mark_durable(&p);
        m.end_write(&b);
        m.clear_pass();
        assert_eq!(m.clear_pass(), 1);
        assert_eq!(m.set_count(), 0);
        // A write after clearing sets the bit again and waits.
        let c = m.begin_write(0, 1);
        assert!(!m.is_durable(&c));
    }

    #[test]
    fn loading_and_marking_set_bits_without_waiters() {
        let m = IntentMap::new(1 << 32, K64, true);
        let mut words = vec![0u64; WORDS_PER_PAGE as usize];
        words[1] = 1 << 3;
        m.load_page(0, &words);
        assert!(m.is_set(67));
        assert!(m.take_dirty().is_none(), "loaded bits are on disk already");
        m.mark_chunks(BITMAP_BITS_PER_PAGE, 3);
        assert_eq!(m.set_count(), 4);
        let b = m.take_dirty().unwrap();
        assert_eq!(b.pages.len(), 1);
        assert_eq!(b.pages[0].0, 1);
        let t = m.begin_write(67 * K64, 1);
        assert_eq!(t.wait_seq, 0);
    }

    #[test]
    fn the_copy_interlock_excludes_writers_and_remarks() {
        let m = IntentMap::new(1 << 20, K64, false);
        let t = m.begin_write(0, 1);
        assert!(!m.try_start_copy(0), "a writer is in the chunk");
        m.end_write(&t);
        assert!(m.try_start_copy(0));
        assert!(!m.try_start_copy(0), "already copying");
        let w = m.begin_write(0, 1);
        assert!(w.remark);
        assert!(m.end_copy(0), "a write overlapped the copy");
        m.end_write(&w);
        assert_eq!(m.next_recopy(0), Some(0));
        assert!(m.try_start_copy(0));
        assert_eq!(m.next_recopy(0), None, "the claim takes the re-copy");
        assert!(!m.end_copy(0));
        // A writer that ends before the copy ends still forces a re-copy.
        assert!(m.try_start_copy(1));
        let w = m.begin_write(K64, 1);
        m.end_write(&w);
        assert!(m.end_copy(1));
        assert_eq!(m.next_recopy(0), Some(1));
        assert_eq!(marked(&m), 1);
        assert_eq!(m.recopies.load(Ordering::SeqCst), 1, "the bound is exact when nothing moves");
        // A writer marking a chunk the copy end marks as well counts once.
        assert!(m.try_start_copy(1));
        assert_eq!(m.recopies.load(Ordering::SeqCst), 0);
        let w = m.begin_write(K64, 1);
        assert!(m.end_copy(1), "a writer is in the chunk");
        m.end_write(&w);
        assert_eq!((marked(&m), m.recopies.load(Ordering::SeqCst)), (1, 1));
    }

    /// Chunks marked to be copied again, by a scan.
    fn marked(m: &IntentMap) -> u64 {
        (0..m.chunks()).filter(|&c| m.state[c as usize].load(Ordering::SeqCst) & RECOPY != 0).count() as u64
    }

    #[test]
    fn with_no_chunk_marked_the_look_for_a_recopy_reads_one_word() {
        let m = IntentMap::new(1 << 30, K64, false);
        assert_eq!(m.next_recopy(0), None);
        // A mark only the state word holds (not counted) is not looked for: the count is what
        // the look trusts.
        m.state[9].fetch_or(RECOPY, Ordering::SeqCst);
        assert_eq!(m.next_recopy(0), None);
        m.recopies.fetch_add(1, Ordering::SeqCst);
        assert_eq!(m.next_recopy(0), Some(9));
    }

    /// Writers on several threads stamp a version into a "source" and a "target" cell per
    /// chunk (the mirror's write goes to both); the copier copies source to target with the
    /// interlock and re-copies marked chunks. At the end every target equals its source.
    #[test]
    fn copy_interlock_stress_converges() {
        const CHUNKS: u64 = 64;
        let m = Arc::new(IntentMap::new(CHUNKS * K64, K64, false));
        let src: Arc<Vec<AtomicU64>> = Arc::new((0..CHUNKS).map(|_| AtomicU64::new(0)).collect());
        let dst: Arc<Vec<AtomicU64>> = Arc::new((0..CHUNKS).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let (m, src, dst, stop) = (m.clone(), src.clone(), dst.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut v = t << 40;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        v += 1;
                        n = n.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407 + t);
                        // Each thread its own chunks: overlapping writes from two threads are
                        // unordered on a real mirror too.
                        let c = ((n >> 33) % (CHUNKS / 3)) * 3 + t;
                        let tk = m.begin_write(c * K64, 4096);
                        // Two bases written "concurrently", in either order.
                        if n & 1 == 0 {
                            src[c as usize].store(v, Ordering::SeqCst);
                            std::hint::spin_loop();
                            dst[c as usize].store(v, Ordering::SeqCst);
                        } else {
                            dst[c as usize].store(v, Ordering::SeqCst);
                            std::hint::spin_loop();
                            src[c as usize].store(v, Ordering::SeqCst);
                        }
                        m.end_write(&tk);
                    }
                })
            })
            .collect();
        // The copier: every chunk once, then the re-copies, while the writers keep going.
        let copy = |c: u64| loop {
            if m.try_start_copy(c) {
                let v = src[c as usize].load(Ordering::SeqCst);
                std::thread::yield_now();
                dst[c as usize].store(v, Ordering::SeqCst);
                m.end_copy(c);
                return;
            }
            std::thread::yield_now();
        };
        for _ in 0..4 {
            for c in 0..CHUNKS {
                copy(c);
            }
        }
        stop.store(true, Ordering::SeqCst);
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(m.recopies.load(Ordering::SeqCst), marked(&m), "the bound, exact at rest");
        let mut from = 0;
        while let Some(c) = m.next_recopy(from) {
            copy(c);
            from = c;
        }
        assert_eq!((m.recopies.load(Ordering::SeqCst), marked(&m)), (0, 0));
        for c in 0..CHUNKS as usize {
            assert_eq!(src[c].load(Ordering::SeqCst), dst[c].load(Ordering::SeqCst), "chunk {c}");
            assert_eq!(m.writers(c as u64), 0);
        }
    }
}
