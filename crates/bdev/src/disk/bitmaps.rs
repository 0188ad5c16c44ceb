//! A disk's named dirty bitmaps (QEMU's block dirty bitmaps): one bit per chunk of
//! `granularity` bytes, set when a write, write-zeroes or discard that touches the chunk
//! completes (whatever its status), on any channel, before its completion goes up.
//!
//! * The set of bitmaps lives in the disk's book (`disk_bitmaps.rs`, the disk's methods); adding or removing one bumps the disk's
//!   bitmap epoch, and each channel picks the new set up (cold, under the lock) at its next
//!   poll, before it reaps anything. Writes that complete in a poll that began before the add
//!   returned may be missed, as in QEMU, where a bitmap records from its creation on.
//! * Marking is one `fetch_or` on a shared word per chunk touched (no lock, no allocation);
//!   a disabled bitmap costs one relaxed load per completed write.
//! * With no bitmap defined the layer pays one relaxed load and one branch per poll, none per
//!   request.
//! * A reader takes a bitmap's bits with [`DirtyBitmap::take`]: each word is swapped with zero,
//!   so every bit set before the swap is in the copy and every bit set after it stays in the
//!   bitmap: "take and clear atomically" for a backup, never a write lost between the two.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// QEMU's default granularity.
pub const DEFAULT_BITMAP_GRANULARITY: u64 = 64 << 10;
/// The smallest granularity accepted (one sector).
pub const MIN_BITMAP_GRANULARITY: u64 = 512;
/// The largest granularity accepted.
pub const MAX_BITMAP_GRANULARITY: u64 = 64 << 20;
/// The most extents one `get_extents` call returns; the caller continues from the last one's end.
pub const MAX_EXTENTS: usize = 4096;

/// Why a bitmap operation was refused. Each names what it refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BitmapError {
    /// No bitmap of that name on the bdev.
    #[error("bdev '{bdev}' has no dirty bitmap '{name}'")]
    NotFound {
        /// The bdev asked.
        bdev: String,
        /// The bitmap asked for.
        name: String,
    },
    /// A bitmap of that name exists already.
    #[error("bdev '{bdev}' already has a dirty bitmap '{name}'")]
    Exists {
        /// The bdev asked.
        bdev: String,
        /// The name taken.
        name: String,
    },
    /// A parameter is wrong.
    #[error("{field}: {reason}")]
    Invalid {
        /// The parameter.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The bitmap may have missed writes (a crash): only removal is allowed.
    #[error("dirty bitmap '{0}' is inconsistent (it may have missed writes in a crash): only removing it is allowed")]
    Inconsistent(String),
    /// An export or a backup job holds it ([`BitmapUse`]): it cannot be removed, cleared,
    /// enabled, disabled, merged into or merged from until the holder lets go (QEMU's rule for
    /// a busy bitmap).
    #[error("dirty bitmap '{name}' of bdev '{bdev}' is busy: {holder} holds it")]
    Busy {
        /// The bdev asked.
        bdev: String,
        /// The bitmap in use.
        name: String,
        /// Who holds it ("NBD export /run/x.sock", "backup job 'vm1'").
        holder: String,
    },
    /// The daemon counts no I/O, so its channels bypass the layer that marks.
    #[error("I/O statistics are switched off in this daemon (serve --no-iostat): channels bypass the layer that marks bitmaps")]
    AccountingOff,
}

impl BitmapError {
    /// The parameter at fault, when the caller's parameters were wrong.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            BitmapError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// One named bitmap.
pub struct DirtyBitmap {
    pub(super) name: String,
    shift: u32,
    /// The disk's size when the bitmap was made: writes beyond it are not tracked.
    pub(super) len: u64,
    words: Box<[AtomicU64]>,
    /// Chunks whose bit is set.
    dirty: AtomicU64,
    pub(super) recording: AtomicBool,
    persistent: bool,
    inconsistent: AtomicBool,
    /// Who holds a [`BitmapUse`] (exports reading it, a backup job): the disk's methods refuse
    /// to change it while any remain. A lock, not a count: a method checks and changes under
    /// it, so no holder can come between the two (control plane only; marking never takes it).
    holders: Mutex<Vec<Arc<str>>>,
}

/// What `bdev_dirty_bitmap_list` shows of a bitmap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapInfo {
    /// Its name, unique on its disk.
    pub name: String,
    /// Bytes per bit.
    pub granularity: u64,
    /// Whether completed writes mark it (QEMU's `recording`).
    pub recording: bool,
    /// Whether it is kept across a clean restart.
    pub persistent: bool,
    /// Whether it may have missed writes: refused for any use but removal.
    pub inconsistent: bool,
    /// Dirty bytes (the last chunk counted to the end of the disk only).
    pub count: u64,
    /// Held by an export that reads it or a backup job ([`BitmapUse`]): the methods that
    /// change it refuse it.
    pub busy: bool,
}

/// The bits of a bitmap at one point, apart from it (see [`DirtyBitmap::take`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenBitmap {
    shift: u32,
    len: u64,
    words: Vec<u64>,
}

/// Checks a requested granularity (`field` names it in the refusal).
pub fn check_granularity(field: &'static str, g: u64) -> Result<u64, BitmapError> {
    if !g.is_power_of_two() || !(MIN_BITMAP_GRANULARITY..=MAX_BITMAP_GRANULARITY).contains(&g) {
        return Err(BitmapError::Invalid {
            field,
            reason: format!("{g} is not a power of two from 512 to 64 MiB"),
        });
    }
    Ok(g)
}

impl std::fmt::Debug for DirtyBitmap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyBitmap").field("name", &self.name).finish_non_exhaustive()
    }
}

impl DirtyBitmap {
    /// An empty bitmap of `len` bytes in chunks of `granularity` (checked by the caller).
    pub fn new(name: &str, len: u64, granularity: u64, persistent: bool, recording: bool) -> DirtyBitmap {
        let chunks = len.div_ceil(granularity);
        DirtyBitmap {
            name: name.to_string(),
            shift: granularity.trailing_zeros(),
            len,
            words: (0..chunks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            dirty: AtomicU64::new(0),
            recording: AtomicBool::new(recording),
            persistent,
            inconsistent: AtomicBool::new(false),
            holders: Mutex::new(Vec::new()),
        }
    }

    fn holders(&self) -> MutexGuard<'_, Vec<Arc<str>>> {
        self.holders.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`BitmapError::Busy`] naming the first of `holders` (its own, locked), if any.
    fn refuse_held(&self, bdev: &str, holders: &[Arc<str>]) -> Result<(), BitmapError> {
        match holders.first() {
            Some(holder) => Err(BitmapError::Busy {
                bdev: bdev.to_string(),
                name: self.name.clone(),
                holder: holder.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Whether a [`BitmapUse`] holds it.
    pub fn busy(&self) -> bool {
        !self.holders().is_empty()
    }

    /// Runs `change` unless a [`BitmapUse`] holds the bitmap (then [`BitmapError::Busy`], naming
    /// the first holder, and nothing runs). The check and the change are under the holders'
    /// lock: no hold is taken between them. `bdev` names the bitmap's disk in the refusal.
    pub fn change_unless_held<R>(
        &self,
        bdev: &str,
        change: impl FnOnce(&Self) -> R,
    ) -> Result<R, BitmapError> {
        let holders = self.holders();
        self.refuse_held(bdev, &holders)?;
        let r = change(self);
        drop(holders);
        Ok(r)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes per bit.
    pub fn granularity(&self) -> u64 {
        1 << self.shift
    }

    /// The size it covers, in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no bit is set.
    pub fn is_empty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed) == 0
    }

    /// Whether it is kept across a clean restart.
    pub fn persistent(&self) -> bool {
        self.persistent
    }

    /// Whether completed writes mark it.
    pub fn recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// Whether it may have missed writes.
    pub fn inconsistent(&self) -> bool {
        self.inconsistent.load(Ordering::Relaxed)
    }

    /// Marks it as one that may have missed writes (a crash): it refuses every use but removal.
    pub fn set_inconsistent(&self) {
        self.inconsistent.store(true, Ordering::SeqCst);
    }

    /// Dirty bytes now.
    pub fn count(&self) -> u64 {
        let chunks = self.dirty.load(Ordering::SeqCst);
        let mut bytes = chunks << self.shift;
        let last = self.len.div_ceil(self.granularity());
        if last > 0 && self.bit(last - 1) {
            // The last chunk stops at the end of the disk.
            bytes -= (last << self.shift) - self.len;
        }
        bytes
    }

    fn bit(&self, c: u64) -> bool {
        self.words[(c / 64) as usize].load(Ordering::SeqCst) & (1 << (c % 64)) != 0
    }

    /// Marks the chunks `[offset, offset + len)` touches (cut at the end of the bitmap) if it
    /// is recording. Called for every completed write, from any channel.
    #[inline]
    pub fn mark(&self, offset: u64, len: u64) {
        if self.recording.load(Ordering::Relaxed) {
            self.mark_recording(offset, len);
        }
    }

    /// [`DirtyBitmap::mark`] once recording is known to be on. A write inside one chunk (the
    /// common case: 4 KiB under a 64 KiB granularity) tests one bit and sets it only if clear.
    #[inline(always)]
    fn mark_recording(&self, offset: u64, len: u64) {
        if len == 0 || offset >= self.len {
            return;
        }
        let first = offset >> self.shift;
        let last = (offset.saturating_add(len).min(self.len) - 1) >> self.shift;
        if first == last {
            self.set_chunk(first);
        } else {
            self.set_chunks(first, last);
        }
    }

    #[cold]
    #[inline(never)]
    fn set_chunks(&self, first: u64, last: u64) {
        for c in first..last + 1 {
            self.set_chunk(c);
        }
    }

    #[inline(always)]
    fn set_chunk(&self, c: u64) {
        let bit = 1u64 << (c % 64);
        let word = &self.words[(c / 64) as usize];
        // A bit already set needs no locked instruction (the common case: a hot chunk written
        // again). Skipping is safe against a concurrent `take`: a load that still sees the bit
        // came before the take's swap in this word's order, so the write being marked completed
        // before the swap and is in the copy the take returns (and, for a backup, in its
        // point-in-time image: the fleece is attached after the take, and a channel
        // acknowledges it only in a later poll, whose loads see the swap).
        if word.load(Ordering::Relaxed) & bit == 0 && word.fetch_or(bit, Ordering::SeqCst) & bit == 0 {
            self.dirty.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Takes the bits and clears them, word by word with a swap: a bit set at any time is in
    /// the copy or still in the bitmap, never in neither.
    pub fn take(&self) -> FrozenBitmap {
        let words = self
            .words
            .iter()
            .map(|w| {
                let bits = w.swap(0, Ordering::SeqCst);
                self.dirty.fetch_sub(u64::from(bits.count_ones()), Ordering::SeqCst);
                bits
            })
            .collect();
        FrozenBitmap { shift: self.shift, len: self.len, words }
    }

    /// A copy of the bits now, leaving them set (each word read once).
    pub fn snapshot(&self) -> FrozenBitmap {
        let words = self.words.iter().map(|w| w.load(Ordering::SeqCst)).collect();
        FrozenBitmap { shift: self.shift, len: self.len, words }
    }

    /// Sets every bit `other` has (a merge, or a frozen copy given back after a failed backup).
    /// Checks no hold: the disk's `merge_dirty_bitmaps` refuses a busy target, and a holder
    /// gives its bits back through [`BitmapUse::merge_back`].
    pub fn merge_from(&self, other: &FrozenBitmap) {
        debug_assert_eq!((other.shift, other.len), (self.shift, self.len), "checked by the callers");
        for (i, &bits) in other.words.iter().enumerate().take(self.words.len()) {
            if bits != 0 {
                let old = self.words[i].fetch_or(bits, Ordering::SeqCst);
                self.dirty.fetch_add(u64::from((bits & !old).count_ones()), Ordering::SeqCst);
            }
        }
    }

    /// What `bdev_dirty_bitmap_list` shows of it.
    pub fn info(&self) -> BitmapInfo {
        BitmapInfo {
            name: self.name.clone(),
            granularity: self.granularity(),
            recording: self.recording(),
            persistent: self.persistent,
            inconsistent: self.inconsistent(),
            count: self.count(),
            busy: self.busy(),
        }
    }
}

impl DirtyBitmap {
    /// The first chunk in `[from, to)` whose bit is `set`, or `to`: a word at a time.
    fn next_chunk(&self, from: u64, to: u64, set: bool) -> u64 {
        let mut c = from;
        while c < to {
            let w = self.words[(c / 64) as usize].load(Ordering::Relaxed);
            let w = if set { w } else { !w } >> (c % 64);
            if w != 0 {
                return (c + u64::from(w.trailing_zeros())).min(to);
            }
            c = (c / 64 + 1) * 64;
        }
        to
    }

    /// Whether any chunk touching `[offset, end)` (`offset < end <= len`) is dirty.
    fn any_dirty(&self, offset: u64, end: u64) -> bool {
        let (first, stop) = (offset >> self.shift, ((end - 1) >> self.shift) + 1);
        self.next_chunk(first, stop, true) < stop
    }

    /// The run of one state that starts at `offset`, read from the live bits (no copy): whether
    /// it is dirty, and where it ends (at most `end`). The state is decided per window of `unit`
    /// bytes (a multiple of the granularity, counted from 0): a window is dirty when any of its
    /// chunks is. Runs end on window boundaries or at `end`. Bytes past the bitmap's own size (a
    /// disk grown since it was made) are dirty: nothing recorded their writes.
    pub fn run_at(&self, offset: u64, end: u64, unit: u64) -> (bool, u64) {
        debug_assert!(unit.is_multiple_of(self.granularity()) && offset < end);
        if offset >= self.len {
            return (true, end);
        }
        let window_end = |at: u64| (at / unit + 1).saturating_mul(unit).min(end);
        let limit = end.min(self.len);
        let dirty = self.any_dirty(offset, window_end(offset).min(self.len));
        if !dirty {
            // Clean up to the window holding the next dirty chunk.
            let stop = ((limit - 1) >> self.shift) + 1;
            let next = self.next_chunk(offset >> self.shift, stop, true);
            if next == stop {
                return (false, limit);
            }
            return (false, ((next << self.shift) / unit * unit).max(offset));
        }
        let mut at = window_end(offset);
        if unit == self.granularity() {
            let stop = ((limit - 1) >> self.shift) + 1;
            at = at.min(limit);
            if at < limit {
                at = (self.next_chunk(at >> self.shift, stop, false) << self.shift).min(limit);
            }
        } else {
            while at < limit && self.any_dirty(at, window_end(at).min(self.len)) {
                at = window_end(at);
            }
        }
        // The last chunk may stop at the end of the bitmap, and the bytes after it are dirty.
        if at >= self.len && end > self.len {
            at = end;
        }
        (true, at.min(end))
    }
}

/// A hold on a bitmap by an export that reads it or a backup job that took it: the bitmap
/// shows `busy`, and the disk's methods refuse to remove, clear, enable, disable or merge it
/// (into or from) until every hold is dropped. The holder itself still changes it through the
/// hold ([`BitmapUse::merge_back`]).
#[derive(Debug)]
pub struct BitmapUse {
    bitmap: Arc<DirtyBitmap>,
    holder: Arc<str>,
    released: AtomicBool,
}

impl BitmapUse {
    /// Holds `bitmap` for `holder`, named in the refusals ("NBD export /run/x.sock").
    pub fn new(bitmap: Arc<DirtyBitmap>, holder: &str) -> BitmapUse {
        let holder: Arc<str> = Arc::from(holder);
        bitmap.holders().push(holder.clone());
        BitmapUse { bitmap, holder, released: AtomicBool::new(false) }
    }

    /// Holds `bitmap` for `holder` unless someone holds it already (a backup job, which
    /// takes and clears it, wants it alone); the refusal names that one. `bdev` names its disk.
    pub fn exclusive(bitmap: Arc<DirtyBitmap>, bdev: &str, holder: &str) -> Result<BitmapUse, BitmapError> {
        let holder: Arc<str> = Arc::from(holder);
        {
            let mut holders = bitmap.holders();
            bitmap.refuse_held(bdev, &holders)?;
            holders.push(holder.clone());
        }
        Ok(BitmapUse { bitmap, holder, released: AtomicBool::new(false) })
    }

    /// Ends the hold now (once; dropping it later does nothing more), the bitmap still
    /// readable through it: for a holder whose last reference drops later than its end (an
    /// NBD export's connections let go of it on their reactors after its stop answered), so
    /// that the bitmap is free when the stop returns.
    pub fn release(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut holders = self.bitmap.holders();
        if let Some(i) = holders.iter().position(|h| Arc::ptr_eq(h, &self.holder)) {
            holders.remove(i);
        }
    }

    /// The holder's own way to give bits back (a backup job that failed or was cancelled
    /// merges its frozen copy back): the refusals are for everyone else.
    pub fn merge_back(&self, frozen: &FrozenBitmap) {
        self.bitmap.merge_from(frozen);
    }
}

impl std::ops::Deref for BitmapUse {
    type Target = DirtyBitmap;
    fn deref(&self) -> &DirtyBitmap {
        &self.bitmap
    }
}

impl Drop for BitmapUse {
    fn drop(&mut self) {
        self.release();
    }
}

impl FrozenBitmap {
    /// Bits read back from a file (`words` has the count [`super::bitmap_file::words_for`] gives).
    pub fn from_words(granularity: u64, len: u64, words: Vec<u64>) -> FrozenBitmap {
        FrozenBitmap { shift: granularity.trailing_zeros(), len, words }
    }

    /// The bits, 64 chunks a word.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// The dirty runs within `[offset, offset + len)`, as `(offset, len)` in bytes, cut to the
    /// range, at most `max` of them; merged when adjacent.
    pub fn extents(&self, offset: u64, len: u64, max: usize) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let end = offset.saturating_add(len).min(self.len);
        if offset >= end {
            return out;
        }
        let g = 1u64 << self.shift;
        for c in (offset >> self.shift)..=((end - 1) >> self.shift) {
            if self.words[(c / 64) as usize] & (1 << (c % 64)) == 0 {
                continue;
            }
            let start = (c << self.shift).max(offset);
            let stop = ((c << self.shift) + g).min(end);
            let full = out.len() == max;
            match out.last_mut() {
                Some(last) if last.0 + last.1 == start => last.1 = stop - last.0,
                _ if full => break,
                _ => out.push((start, stop - start)),
            }
        }
        out
    }
}

/// Marks every bitmap of `set` for a request of operation `op` (an `op_index`) over
/// `[offset, offset + len)` that completed, whatever its status: a write that failed on the
/// device may still have changed part of its range (a torn write), and a backup that reads a
/// chunk too many costs less than one that misses a change (QEMU marks failed writes too).
#[inline]
pub(super) fn mark_all(set: &[Arc<DirtyBitmap>], op: u8, offset: u64, len: u64) {
    if changes_data(op) {
        for b in set {
            b.mark(offset, len);
        }
    }
}

/// Write, discard, write-zeroes (the mirror's `changes_data`): the operations a bitmap marks.
#[inline(always)]
fn changes_data(op: u8) -> bool {
    matches!(op, 1 | 3 | 4)
}

/// [`mark_all`] for a batch of requests, given as `(op, offset, len)`: bitmap by bitmap, so that
/// each one's recording flag, size and words are read once per batch, not once per request.
#[inline(always)]
pub(super) fn mark_each(set: &[Arc<DirtyBitmap>], requests: impl Iterator<Item = (u8, u64, u64)> + Clone) {
    for b in set {
        if !b.recording.load(Ordering::Relaxed) {
            continue;
        }
        for (op, offset, len) in requests.clone() {
            if changes_data(op) {
                b.mark_recording(offset, len);
            }
        }
    }
}
