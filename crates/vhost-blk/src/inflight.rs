//! Crash-safe in-flight tracking (vhost-user.rst, "Inflight I/O tracking"), split and packed
//! virtqueues.
//!
//! The back-end keeps, in a shared memory file it hands to the front-end
//! (`GET_INFLIGHT_FD`), a record of every request it has taken from the available ring and not
//! yet returned. The front-end keeps the file across a back-end crash and hands it to the new
//! back-end (`SET_INFLIGHT_FD`), which resubmits what was in flight, in the order it was taken.
//! Requests completed out of order before the crash are not in the record, so they are not
//! replayed.
//!
//! Split layout, per queue (all fields native-endian, as the spec's C structs):
//! a 16-byte header `{ features: u64, version: u16, desc_num: u16, last_batch_head: u16,
//! used_idx: u16 }` then `desc_num` entries of 16 bytes
//! `{ inflight: u8, padding: [u8; 5], next: u16, counter: u64 }`. The packed layout
//! ([`PackedInflight`]) has 32-byte headers and entries. The front-end asks for the area
//! (GET_INFLIGHT_FD) before it sets the features, so the ring format is not known yet: every
//! queue's region is sized for the packed layout, rounded up to 64 bytes, and read in the
//! negotiated format when the queue starts. The whole file is `num_queues` such regions.
//!
//! Write ordering is what makes this crash-safe: a head is marked in flight before its request
//! is submitted; on completion the batch is linked through `next`, the used index is published,
//! and only then are the marks cleared and `used_idx` updated. A crash between the publish and
//! the clearing is detected on recovery (`used_idx` differs from the ring's index) and the
//! last batch is cleared then.

use std::fs::File;
use std::sync::atomic::{compiler_fence, Ordering};
use std::sync::Arc;

use fp_virtq::{PackedState, RawDesc, DESC_F_AVAIL, DESC_F_USED};
use vm_memory::{FileOffset, MmapRegion};

const HEADER: usize = 16;
const ENTRY: usize = 16;
const PACKED_HEADER: usize = 32;
const PACKED_ENTRY: usize = 32;
const ALIGN: usize = 64;
const VERSION: u16 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InflightError {
    #[error("in-flight area of {size} bytes is too small for {queues} queues of {queue_size} entries")]
    TooSmall { size: u64, queues: u16, queue_size: u16 },
    #[error("in-flight area of {size} bytes at offset {offset} does not fit its file ({file_len} bytes)")]
    BeyondFile { offset: u64, size: u64, file_len: u64 },
    #[error("invalid in-flight description: {0}")]
    Invalid(&'static str),
    #[error("cannot create or map the in-flight area: {0}")]
    Map(String),
    #[error("queue {index} has {ring} entries but its in-flight region was made for {region}")]
    SizeMismatch { index: u16, ring: u16, region: u16 },
    #[error("the packed in-flight record is inconsistent: {0}")]
    Corrupt(&'static str),
}

/// Bytes one queue's region takes: room for either layout (the larger, packed one).
pub fn queue_region_size(queue_size: u16) -> usize {
    let split = HEADER + ENTRY * usize::from(queue_size);
    let packed = PACKED_HEADER + PACKED_ENTRY * usize::from(queue_size);
    split.max(packed).div_ceil(ALIGN) * ALIGN
}

/// The mapped in-flight file of one connection.
pub struct InflightArea {
    map: MmapRegion<()>,
    num_queues: u16,
    queue_size: u16,
}

impl InflightArea {
    /// Creates a zeroed area (`GET_INFLIGHT_FD`). Returns it and the file to send.
    pub fn create(num_queues: u16, queue_size: u16) -> Result<(Arc<InflightArea>, File, u64), InflightError> {
        if num_queues == 0 || queue_size == 0 || !queue_size.is_power_of_two() {
            return Err(InflightError::Invalid("queue count and size must be non-zero, size a power of two"));
        }
        let size = queue_region_size(queue_size) * usize::from(num_queues);
        let file = fp_sys::memfd(c"flashpath-inflight").map_err(|e| InflightError::Map(e.to_string()))?;
        file.set_len(size as u64).map_err(|e| InflightError::Map(e.to_string()))?;
        let area = Self::map(&file, size as u64, 0, num_queues, queue_size)?;
        Ok((area, file, size as u64))
    }

    /// Maps an area the front-end hands back (`SET_INFLIGHT_FD`).
    pub fn map(
        file: &File,
        mmap_size: u64,
        mmap_offset: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Arc<InflightArea>, InflightError> {
        if num_queues == 0 || queue_size == 0 {
            return Err(InflightError::Invalid("zero queues or queue size"));
        }
        let need = queue_region_size(queue_size) as u64 * u64::from(num_queues);
        if mmap_size < need || mmap_size > (1 << 30) {
            return Err(InflightError::TooSmall { size: mmap_size, queues: num_queues, queue_size });
        }
        // The file is the front-end's: a page mapped past its end would raise SIGBUS on the
        // reactor at the first access.
        let file_len = file.metadata().map_err(|e| InflightError::Map(e.to_string()))?.len();
        if mmap_offset.checked_add(need).is_none_or(|end| end > file_len) {
            return Err(InflightError::BeyondFile { offset: mmap_offset, size: need, file_len });
        }
        let dup = file.try_clone().map_err(|e| InflightError::Map(e.to_string()))?;
        let map = MmapRegion::<()>::build(
            Some(FileOffset::new(dup, mmap_offset)),
            need as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .map_err(|e| InflightError::Map(e.to_string()))?;
        Ok(Arc::new(InflightArea { map, num_queues, queue_size }))
    }

    pub fn num_queues(&self) -> u16 {
        self.num_queues
    }

    pub fn queue_size(&self) -> u16 {
        self.queue_size
    }

    /// The tracker for queue `index` with a ring of `ring_size` entries.
    pub fn queue(self: &Arc<Self>, index: u16, ring_size: u16) -> Result<InflightQueue, InflightError> {
        if index >= self.num_queues {
            return Err(InflightError::Invalid("queue index beyond the in-flight area"));
        }
        if ring_size != self.queue_size {
            return Err(InflightError::SizeMismatch { index, ring: ring_size, region: self.queue_size });
        }
        let offset = queue_region_size(self.queue_size) * usize::from(index);
        // In bounds: `offset` + the region size is within the mapping (checked in `map`), so
        // this is the plain offset `add` would compute, without its unsafe precondition.
        let base = self.map.as_ptr().wrapping_add(offset);
        let region = Region { _area: self.clone(), base, size: ring_size };
        Ok(InflightQueue { region, counter: 0, batch_len: 0 })
    }

    /// The packed-layout tracker for queue `index` with a ring of `ring_size` entries.
    pub fn packed_queue(
        self: &Arc<Self>,
        index: u16,
        ring_size: u16,
    ) -> Result<PackedInflight, InflightError> {
        // Same checks and region as the split layout's.
        let region = self.queue(index, ring_size)?.region;
        let n = usize::from(ring_size);
        Ok(PackedInflight {
            region,
            counter: 0,
            free_head: 0,
            old_free_head: 0,
            used: (0, true),
            heads: vec![None; n].into_boxed_slice(),
            by_id: vec![NONE; n].into_boxed_slice(),
            batch: Vec::with_capacity(n),
            batch_tail: NONE,
            rec_head: NONE,
            rec_cur: NONE,
            rec_last: NONE,
            rec_n: 0,
            rec_ok: false,
        })
    }
}

/// One queue's region of the area, in either layout. Both layouts start with the same
/// `features: u64, version: u16, desc_num: u16` header, which says whether the region holds a
/// record of this queue.
struct Region {
    _area: Arc<InflightArea>,
    base: *mut u8,
    size: u16,
}

/// The integer types the region's fields have: any bits are a valid value, which is what makes
/// [`Region::read`] of memory the front-end may have written sound. Only integers implement it.
trait Field: Copy {}
impl Field for u8 {}
impl Field for u16 {}
impl Field for u32 {}
impl Field for u64 {}

/// Header fields both layouts share.
const H_VERSION: usize = 8;
const H_DESC_NUM: usize = 10;

impl Region {
    /// Reads the field of type `T` at `off` in the region.
    #[inline]
    fn read<T: Field>(&self, off: usize) -> T {
        debug_assert!(off + std::mem::size_of::<T>() <= queue_region_size(self.size));
        // SAFETY: `base` points to this queue's region inside the mapping held alive by `_area`
        // (checked at construction); callers pass a header field or an entry field of an entry
        // below `size`, inside the region and naturally aligned (16- or 32-byte headers and
        // entries in a page-aligned mapping); `T` is an integer, valid for any bits the
        // front-end left there.
        unsafe { std::ptr::read_volatile(self.base.add(off).cast::<T>()) }
    }

    /// Writes `v` to the field of type `T` at `off` in the region. Volatile: every store stays
    /// in program order relative to the used-ring publish, which recovery after a crash relies
    /// on.
    #[inline]
    fn write<T: Field>(&mut self, off: usize, v: T) {
        debug_assert!(off + std::mem::size_of::<T>() <= queue_region_size(self.size));
        // SAFETY: as in `read`, for writes: the front-end only stores the file, so this thread
        // is the only writer.
        unsafe { std::ptr::write_volatile(self.base.add(off).cast::<T>(), v) }
    }

    /// Whether the region holds a record of this queue from a previous back-end. If it does
    /// not (fresh, or foreign: another version or ring size), it is wiped and stamped with
    /// this queue's header, for the layout to initialise the rest.
    fn claim(&mut self) -> bool {
        if self.read::<u16>(H_VERSION) == VERSION && self.read::<u16>(H_DESC_NUM) == self.size {
            return true;
        }
        for off in (0..queue_region_size(self.size)).step_by(8) {
            self.write::<u64>(off, 0);
        }
        self.write::<u16>(H_VERSION, VERSION);
        self.write::<u16>(H_DESC_NUM, self.size);
        false
    }
}

/// Requests found in flight, as `(counter, head, request)`, put in the order they were taken
/// (the head breaks ties between equal counters, which only a hostile front-end writes).
fn oldest_first<T>(mut found: Vec<(u64, u16, T)>) -> Vec<T> {
    found.sort_unstable_by_key(|&(counter, head, _)| (counter, head));
    found.into_iter().map(|(_, _, r)| r).collect()
}

/// The counter to give the next request taken: after every counter in `seen`. The counters are
/// the front-end's memory: a hostile one may have left u64::MAX there, hence the wrap.
fn next_counter(seen: impl Iterator<Item = u64>) -> u64 {
    seen.max().map_or(0, |c| c.wrapping_add(1))
}

/// What recovery found in a queue's region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Heads to resubmit, oldest first.
    pub resubmit: Vec<u16>,
    /// Whether the region held state from a previous back-end (false: freshly initialised).
    pub reused: bool,
}

/// One queue's region. Lives on the queue's reactor.
pub struct InflightQueue {
    region: Region,
    counter: u64,
    /// Entries linked into the current completion batch.
    batch_len: u16,
}

impl InflightQueue {
    fn read_u16(&self, off: usize) -> u16 {
        self.region.read::<u16>(off)
    }

    fn write_u16(&mut self, off: usize, v: u16) {
        self.region.write::<u16>(off, v)
    }

    fn entry(&self, head: u16) -> usize {
        HEADER + ENTRY * usize::from(head)
    }

    fn inflight(&self, head: u16) -> bool {
        self.region.read::<u8>(self.entry(head)) != 0
    }

    fn set_inflight(&mut self, head: u16, v: bool) {
        let off = self.entry(head);
        self.region.write::<u8>(off, u8::from(v))
    }

    fn counter_of(&self, head: u16) -> u64 {
        // 8-aligned: 16-byte entries after a 16-byte header.
        self.region.read::<u64>(self.entry(head) + 8)
    }

    fn set_counter(&mut self, head: u16, v: u64) {
        let off = self.entry(head) + 8;
        self.region.write::<u64>(off, v)
    }

    /// Prepares the region when the queue starts. `ring_used_idx` is the used ring's `idx` as
    /// the guest sees it now.
    pub fn recover(&mut self, ring_used_idx: u16) -> Recovered {
        if !self.region.claim() {
            self.write_u16(14, ring_used_idx);
            self.counter = 0;
            return Recovered { resubmit: Vec::new(), reused: false };
        }
        let used_idx = self.read_u16(14);
        if used_idx != ring_used_idx {
            // The previous back-end published a batch but died before clearing its marks.
            let batch = ring_used_idx.wrapping_sub(used_idx);
            let mut head = self.read_u16(12);
            for _ in 0..batch.min(self.region.size) {
                if head >= self.region.size {
                    break;
                }
                self.set_inflight(head, false);
                head = self.read_u16(self.entry(head) + 6);
            }
            self.write_u16(14, ring_used_idx);
        }
        let pending: Vec<(u64, u16, u16)> =
            (0..self.region.size).filter(|&h| self.inflight(h)).map(|h| (self.counter_of(h), h, h)).collect();
        self.counter = next_counter((0..self.region.size).map(|h| self.counter_of(h)));
        Recovered { resubmit: oldest_first(pending), reused: true }
    }

    /// Records that `head` was taken from the available ring.
    pub fn taken(&mut self, head: u16) {
        if head >= self.region.size {
            return;
        }
        let c = self.counter;
        self.counter = self.counter.wrapping_add(1);
        self.set_counter(head, c);
        compiler_fence(Ordering::SeqCst);
        self.set_inflight(head, true);
    }

    /// Links `head` into the batch about to be published.
    pub fn completing(&mut self, head: u16) {
        if head >= self.region.size {
            return;
        }
        let last = self.read_u16(12);
        let off = self.entry(head) + 6;
        self.write_u16(off, last);
        self.write_u16(12, head);
        self.batch_len += 1;
    }

    /// After the used index `used_idx` was published: clears the batch's marks.
    pub fn published(&mut self, used_idx: u16) {
        compiler_fence(Ordering::SeqCst);
        let mut head = self.read_u16(12);
        for _ in 0..self.batch_len {
            if head >= self.region.size {
                break;
            }
            self.set_inflight(head, false);
            head = self.read_u16(self.entry(head) + 6);
        }
        self.batch_len = 0;
        compiler_fence(Ordering::SeqCst);
        self.write_u16(14, used_idx);
    }

    /// Heads currently marked in flight (for tests and diagnostics).
    pub fn marked(&self) -> Vec<u16> {
        (0..self.region.size).filter(|&h| self.inflight(h)).collect()
    }
}

/// "No entry": ends the free list and marks empty lookups (never a valid index: queue sizes
/// are at most 32768).
const NONE: u16 = u16::MAX;

// Packed header fields.
const P_FREE_HEAD: usize = 12;
const P_OLD_FREE_HEAD: usize = 14;
const P_USED_IDX: usize = 16;
const P_OLD_USED_IDX: usize = 18;
const P_USED_WRAP: usize = 20;
const P_OLD_USED_WRAP: usize = 21;
// Packed entry fields.
const E_INFLIGHT: usize = 0;
const E_NEXT: usize = 2;
const E_LAST: usize = 4;
const E_NUM: usize = 6;
const E_COUNTER: usize = 8;
const E_ID: usize = 16;
const E_FLAGS: usize = 18;
const E_LEN: usize = 20;
const E_ADDR: usize = 24;

/// A packed-ring request a previous back-end left in flight, as it was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InflightRequest {
    /// Buffer id (the list's last descriptor's).
    pub id: u16,
    /// Ring slots the list took (one per recorded descriptor).
    pub slots: u16,
    /// Copies of the list's ring descriptors: the driver may have reused the slots since.
    pub descs: Vec<RawDesc>,
}

/// What recovery found in a packed queue's region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRecovered {
    /// Requests to resubmit, oldest first.
    pub resubmit: Vec<InflightRequest>,
    /// Where the ring continues: the recorded used position, and the available position after
    /// every list still in flight. The front-end's base when the region is fresh.
    pub state: PackedState,
    /// Whether the region held state from a previous back-end.
    pub reused: bool,
}

/// One queue's region in the packed layout (vhost-user.rst `QueueRegionPacked`). Lives on the
/// queue's reactor.
///
/// Entries hold copies of the ring descriptors of every list taken and not yet returned, one
/// entry per ring slot, allocated from a free list threaded through `next`. Two copies of the
/// position fields make updates transactional: `free_head` / `used_idx` / `used_wrap_counter`
/// move as a completion batch is prepared, and the `old_` copies are the committed state, set
/// once the batch is published and its marks cleared. Recovery commits an unfinished batch if
/// the guest can already see it (the ring's descriptor at `old_used_idx` is no longer
/// available) and rolls it back otherwise.
///
/// Lists are taken from the committed free list (`old_free_head`), never from entries of an
/// unpublished batch, so taking may interleave with completing (a request failed at once is
/// completed while the ring is still being read): the batch's tail is relinked to the new
/// committed head. A list is in flight once its head is marked and `old_free_head` has moved
/// past it; a crash before that returns its entries to the free list and, since the available
/// position is recomputed from what is in flight, the list is taken from the ring again.
pub struct PackedInflight {
    region: Region,
    counter: u64,
    // Mirrors of the header's positions (the region is written through, never read back
    // while running: the front-end's memory is not trusted for our own bookkeeping).
    free_head: u16,
    old_free_head: u16,
    used: (u16, bool),
    /// Per head entry of a list taken and not yet completing: its buffer id and last entry.
    heads: Box<[Option<(u16, u16)>]>,
    /// Buffer id → head entry, for ids below the queue size (what Linux uses).
    by_id: Box<[u16]>,
    /// Heads completing in the unpublished batch, and the entry linking the batch to the
    /// committed free list.
    batch: Vec<u16>,
    batch_tail: u16,
    // The list being recorded by `record`.
    rec_head: u16,
    rec_cur: u16,
    rec_last: u16,
    rec_n: u16,
    rec_ok: bool,
}

impl PackedInflight {
    fn entry(e: u16) -> usize {
        PACKED_HEADER + PACKED_ENTRY * usize::from(e)
    }

    /// `pos` moved `by` slots on, flipping the wrap counter past the end (as the ring does).
    fn advance(&self, (pos, wrap): (u16, bool), by: u16) -> (u16, bool) {
        let next = u32::from(pos) + u32::from(by.min(self.region.size));
        if next >= u32::from(self.region.size) {
            ((next - u32::from(self.region.size)) as u16, !wrap)
        } else {
            (next as u16, wrap)
        }
    }

    fn write_free_heads(&mut self) {
        self.region.write::<u16>(P_FREE_HEAD, self.free_head);
        self.region.write::<u16>(P_OLD_FREE_HEAD, self.old_free_head);
    }

    fn write_used(&mut self, used: (u16, bool), old: (u16, bool)) {
        self.region.write::<u16>(P_USED_IDX, used.0);
        self.region.write::<u8>(P_USED_WRAP, u8::from(used.1));
        self.region.write::<u16>(P_OLD_USED_IDX, old.0);
        self.region.write::<u8>(P_OLD_USED_WRAP, u8::from(old.1));
    }

    /// Prepares the region when the queue starts. `ring` is the position the front-end gave
    /// (SET_VRING_BASE), used when the region is fresh; `flags_at(slot)` reads the flags of the
    /// ring's descriptor at `slot` (None: unreadable).
    pub fn recover(
        &mut self,
        ring: PackedState,
        flags_at: impl FnOnce(u16) -> Option<u16>,
    ) -> Result<PackedRecovered, InflightError> {
        let n = usize::from(self.region.size);
        if !self.region.claim() {
            // Every entry free.
            for e in 0..self.region.size {
                let next = if e + 1 < self.region.size { e + 1 } else { NONE };
                self.region.write::<u16>(Self::entry(e) + E_NEXT, next);
            }
            (self.free_head, self.old_free_head) = (0, 0);
            self.write_free_heads();
            self.used = (ring.next_used, ring.used_wrap);
            self.write_used(self.used, self.used);
            return Ok(PackedRecovered { resubmit: Vec::new(), state: ring, reused: false });
        }
        let mut free_head = self.region.read::<u16>(P_FREE_HEAD);
        let mut old_free_head = self.region.read::<u16>(P_OLD_FREE_HEAD);
        let mut used = (self.region.read::<u16>(P_USED_IDX), self.region.read::<u8>(P_USED_WRAP) != 0);
        let mut old_used =
            (self.region.read::<u16>(P_OLD_USED_IDX), self.region.read::<u8>(P_OLD_USED_WRAP) != 0);
        if used.0 >= self.region.size || old_used.0 >= self.region.size {
            return Err(InflightError::Corrupt("used index beyond the ring"));
        }
        if used != old_used {
            // A batch was being returned. If its first used descriptor reached the ring (the
            // slot no longer holds an available descriptor of that lap), the guest may have
            // seen it: commit the batch; otherwise it is rolled back below and resubmitted.
            let avail = if old_used.1 { DESC_F_AVAIL } else { DESC_F_USED };
            let flags = flags_at(old_used.0).ok_or(InflightError::Corrupt("descriptor ring unreadable"))?;
            if flags & (DESC_F_AVAIL | DESC_F_USED) != avail {
                old_free_head = free_head;
                old_used = used;
            }
        }
        // Roll back whatever was not committed.
        free_head = old_free_head;
        used = old_used;
        // Entries on the free list are not in flight, whatever their marks say (a list whose
        // taking was cut short, a batch whose clearing was).
        let mut free = vec![false; n];
        let mut e = free_head;
        while e < self.region.size && !free[usize::from(e)] {
            free[usize::from(e)] = true;
            self.region.write::<u8>(Self::entry(e) + E_INFLIGHT, 0);
            e = self.region.read::<u16>(Self::entry(e) + E_NEXT);
        }
        let mut owned = vec![false; n];
        let mut found: Vec<(u64, u16, InflightRequest)> = Vec::new();
        for head in 0..self.region.size {
            if free[usize::from(head)] || self.region.read::<u8>(Self::entry(head) + E_INFLIGHT) == 0 {
                continue;
            }
            let at = Self::entry(head);
            let (num, last, counter) = (
                self.region.read::<u16>(at + E_NUM),
                self.region.read::<u16>(at + E_LAST),
                self.region.read::<u64>(at + E_COUNTER),
            );
            if num == 0 || num > self.region.size {
                return Err(InflightError::Corrupt("list length"));
            }
            let mut descs = Vec::with_capacity(usize::from(num));
            let mut e = head;
            for i in 0..num {
                if e >= self.region.size || owned[usize::from(e)] || free[usize::from(e)] {
                    return Err(InflightError::Corrupt("list links"));
                }
                owned[usize::from(e)] = true;
                let at = Self::entry(e);
                descs.push(RawDesc {
                    addr: self.region.read::<u64>(at + E_ADDR),
                    len: self.region.read::<u32>(at + E_LEN),
                    id: self.region.read::<u16>(at + E_ID),
                    flags: self.region.read::<u16>(at + E_FLAGS),
                });
                if i + 1 < num {
                    e = self.region.read::<u16>(at + E_NEXT);
                }
            }
            if e != last {
                return Err(InflightError::Corrupt("list end"));
            }
            let id = descs[descs.len() - 1].id;
            found.push((counter, head, InflightRequest { id, slots: num, descs }));
        }
        let in_flight: u32 = found.iter().map(|(_, _, r)| u32::from(r.slots)).sum();
        if in_flight > u32::from(self.region.size) {
            return Err(InflightError::Corrupt("more slots in flight than the ring has"));
        }
        // A fresh free list of every entry no list holds: whatever the interrupted update left
        // behind is clean from here on.
        let mut first = NONE;
        for e in (0..self.region.size).rev().filter(|&e| !owned[usize::from(e)]) {
            self.region.write::<u8>(Self::entry(e) + E_INFLIGHT, 0);
            self.region.write::<u16>(Self::entry(e) + E_NEXT, first);
            first = e;
        }
        compiler_fence(Ordering::SeqCst);
        (self.free_head, self.old_free_head) = (first, first);
        self.write_free_heads();
        self.used = used;
        self.write_used(used, used);
        self.counter = next_counter(found.iter().map(|&(c, _, _)| c));
        for (_, head, r) in &found {
            let last = self.region.read::<u16>(Self::entry(*head) + E_LAST);
            self.heads[usize::from(*head)] = Some((r.id, last));
            if r.id < self.region.size {
                self.by_id[usize::from(r.id)] = *head;
            }
        }
        // Everything taken is either returned (up to the used position) or still in flight.
        let resubmit = oldest_first(found);
        let mut avail = used;
        for r in &resubmit {
            avail = self.advance(avail, r.slots);
        }
        let state =
            PackedState { next_avail: avail.0, avail_wrap: avail.1, next_used: used.0, used_wrap: used.1 };
        Ok(PackedRecovered { resubmit, state, reused: true })
    }

    /// Starts recording the next list taken from the ring (before `PackedQueue::pop_with`).
    #[inline]
    pub fn begin(&mut self) {
        self.rec_head = self.old_free_head;
        self.rec_cur = self.old_free_head;
        self.rec_n = 0;
        self.rec_ok = true;
    }

    /// Records one ring descriptor of the list being taken, into the next free entry. Nothing
    /// is in flight until [`Self::taken`].
    #[inline]
    pub fn record(&mut self, d: RawDesc) {
        let e = self.rec_cur;
        if e >= self.region.size {
            // Out of entries: only a driver making more slots available than the ring has can
            // get here. That list goes untracked.
            self.rec_ok = false;
            return;
        }
        let at = Self::entry(e);
        self.region.write::<u64>(at + E_ADDR, d.addr);
        self.region.write::<u32>(at + E_LEN, d.len);
        self.region.write::<u16>(at + E_ID, d.id);
        self.region.write::<u16>(at + E_FLAGS, d.flags);
        self.rec_last = e;
        self.rec_n += 1;
        self.rec_cur = self.region.read::<u16>(at + E_NEXT);
    }

    /// The recorded list, buffer `id`, was taken: marks it in flight.
    #[inline]
    pub fn taken(&mut self, id: u16) {
        let n = std::mem::take(&mut self.rec_n);
        if n == 0 || !self.rec_ok {
            return;
        }
        let (head, last) = (self.rec_head, self.rec_last);
        let at = Self::entry(head);
        let c = self.counter;
        self.counter = self.counter.wrapping_add(1);
        self.region.write::<u16>(at + E_NUM, n);
        self.region.write::<u16>(at + E_LAST, last);
        self.region.write::<u64>(at + E_COUNTER, c);
        compiler_fence(Ordering::SeqCst);
        self.region.write::<u8>(at + E_INFLIGHT, 1);
        compiler_fence(Ordering::SeqCst);
        // Commit: the committed free list now starts after the list (and an unpublished
        // batch, linked in front of it, keeps pointing at that start).
        let next_free = self.rec_cur;
        if !self.batch.is_empty() && self.batch_tail < self.region.size {
            self.region.write::<u16>(Self::entry(self.batch_tail) + E_NEXT, next_free);
        } else if self.batch.is_empty() {
            self.free_head = next_free;
        }
        self.old_free_head = next_free;
        self.write_free_heads();
        self.heads[usize::from(head)] = Some((id, last));
        if id < self.region.size {
            self.by_id[usize::from(id)] = head;
        }
    }

    /// The head entry of the taken list with buffer `id`.
    #[inline]
    fn find(&self, id: u16) -> Option<u16> {
        let matches = |e: u16| self.heads[usize::from(e)].is_some_and(|(i, _)| i == id);
        if id < self.region.size {
            let e = self.by_id[usize::from(id)];
            if e < self.region.size && matches(e) {
                return Some(e);
            }
        }
        // Ids at or beyond the queue size, or reused while in flight: a driver's choice, rare.
        (0..self.region.size).find(|&e| matches(e))
    }

    /// Links the list with buffer `id`, which took `slots` ring slots, into the batch about to
    /// be published, and moves the used position as the ring's does.
    #[inline]
    pub fn completing(&mut self, id: u16, slots: u16) {
        if let Some(e) = self.find(id) {
            let (_, last) = self.heads[usize::from(e)].take().unwrap_or((id, e));
            if id < self.region.size && self.by_id[usize::from(id)] == e {
                self.by_id[usize::from(id)] = NONE;
            }
            self.region.write::<u16>(Self::entry(last) + E_NEXT, self.free_head);
            if self.batch.is_empty() {
                self.batch_tail = last;
            }
            self.free_head = e;
            self.region.write::<u16>(P_FREE_HEAD, e);
            self.batch.push(e);
        }
        self.used = self.advance(self.used, slots);
        self.region.write::<u16>(P_USED_IDX, self.used.0);
        self.region.write::<u8>(P_USED_WRAP, u8::from(self.used.1));
    }

    /// After the batch was published: clears its marks, then commits the new state.
    pub fn published(&mut self) {
        compiler_fence(Ordering::SeqCst);
        for i in 0..self.batch.len() {
            let e = self.batch[i];
            self.region.write::<u8>(Self::entry(e) + E_INFLIGHT, 0);
        }
        self.batch.clear();
        compiler_fence(Ordering::SeqCst);
        self.old_free_head = self.free_head;
        self.region.write::<u16>(P_OLD_FREE_HEAD, self.free_head);
        self.region.write::<u16>(P_OLD_USED_IDX, self.used.0);
        self.region.write::<u8>(P_OLD_USED_WRAP, u8::from(self.used.1));
    }

    /// Head entries currently marked in flight (for tests and diagnostics).
    pub fn marked(&self) -> Vec<u16> {
        (0..self.region.size).filter(|&e| self.region.read::<u8>(Self::entry(e) + E_INFLIGHT) != 0).collect()
    }
}

/// A queue's tracker in the negotiated ring format: what the data path calls.
pub enum Tracker {
    Split(InflightQueue),
    Packed(PackedInflight),
}

impl Tracker {
    /// Request `id` (split: head index; packed: buffer id, after its list was recorded) was
    /// taken from the ring.
    #[inline]
    pub fn taken(&mut self, id: u16) {
        match self {
            Tracker::Split(t) => t.taken(id),
            Tracker::Packed(t) => t.taken(id),
        }
    }

    /// Request `id`, which took `slots` ring slots, is being returned.
    #[inline]
    pub fn completing(&mut self, id: u16, slots: u16) {
        match self {
            Tracker::Split(t) => t.completing(id),
            Tracker::Packed(t) => t.completing(id, slots),
        }
    }

    /// The batch was published; `used_idx` is the split ring's used index (the packed tracker
    /// follows the used position itself).
    #[inline]
    pub fn published(&mut self, used_idx: u16) {
        match self {
            Tracker::Split(t) => t.published(used_idx),
            Tracker::Packed(t) => t.published(),
        }
    }
}

/// Where a queue's ring continues, in its layout's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// Split ring: the next available index to read and the next used index to write.
    Split {
        /// Next available-ring index.
        next_avail: u16,
        /// Next used-ring index.
        next_used: u16,
    },
    /// Packed ring: both positions and wrap counters.
    Packed(PackedState),
}

impl Position {
    /// The position SET_VRING_BASE gave (`base`'s encoding depends on the layout).
    pub fn from_vring_base(base: u32, packed: bool) -> Position {
        if packed {
            Position::Packed(PackedState::from_vring_base(base))
        } else {
            let base = base as u16;
            Position::Split { next_avail: base, next_used: base }
        }
    }
}

/// What recovery reads of the guest's ring, in the negotiated layout.
pub enum RingNow<'a> {
    /// Split: the used ring's `idx` as the guest sees it now.
    Split {
        /// The guest-visible used index.
        used_idx: u16,
    },
    /// Packed: the flags of the ring's descriptor at a slot (None: unreadable).
    Packed {
        /// Reads one slot's flags.
        flags_at: &'a dyn Fn(u16) -> Option<u16>,
    },
}

/// A request a previous back-end left in flight, to resubmit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    /// Split: a head index, walked through the ring again (its descriptors are still the
    /// driver's).
    Head(u16),
    /// Packed: the list's recorded descriptors (the driver may have reused its slots).
    List(InflightRequest),
}

/// What recovery found in a queue's region, whichever the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Requests to resubmit, oldest first.
    pub resubmit: Vec<Pending>,
    /// Where the ring continues: after everything returned or still in flight when the region
    /// held a record, the front-end's position otherwise.
    pub position: Position,
    /// Whether the region held state from a previous back-end.
    pub reused: bool,
}

impl InflightArea {
    /// Queue `index`'s tracker, with a ring of `ring_size` entries, in the negotiated layout.
    pub fn tracker(
        self: &Arc<Self>,
        index: u16,
        ring_size: u16,
        packed: bool,
    ) -> Result<Tracker, InflightError> {
        Ok(if packed {
            Tracker::Packed(self.packed_queue(index, ring_size)?)
        } else {
            Tracker::Split(self.queue(index, ring_size)?)
        })
    }
}

impl Tracker {
    /// Prepares the queue's region when the queue starts, for either layout: a region without
    /// a record of this queue is initialised and the ring continues at `from` (the front-end's
    /// position); a region with one gives back what was in flight, oldest first, and the
    /// position after it. `ring` and `from` must be in the tracker's layout.
    pub fn recover(&mut self, from: Position, ring: RingNow<'_>) -> Result<Recovery, InflightError> {
        let (resubmit, position, reused) = match (self, from, ring) {
            (Tracker::Split(t), Position::Split { .. }, RingNow::Split { used_idx }) => {
                let r = t.recover(used_idx);
                // Everything taken beyond the used index is still in flight, one slot each.
                let next_avail = used_idx.wrapping_add(r.resubmit.len() as u16);
                let position = Position::Split { next_avail, next_used: used_idx };
                (r.resubmit.into_iter().map(Pending::Head).collect(), position, r.reused)
            }
            (Tracker::Packed(t), Position::Packed(state), RingNow::Packed { flags_at }) => {
                let r = t.recover(state, flags_at)?;
                (r.resubmit.into_iter().map(Pending::List).collect(), Position::Packed(r.state), r.reused)
            }
            _ => return Err(InflightError::Invalid("the ring's layout is not the tracker's")),
        };
        let position = if reused { position } else { from };
        Ok(Recovery { resubmit, position, reused })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area() -> Arc<InflightArea> {
        InflightArea::create(2, 8).unwrap().0
    }

    #[test]
    fn region_sizes_are_aligned_and_checked() {
        // Sized for the packed layout (32-byte header and entries), the larger of the two.
        assert_eq!(queue_region_size(8), 320);
        assert_eq!(queue_region_size(256), 8256);
        let (_, file, size) = InflightArea::create(2, 8).unwrap();
        assert_eq!(size, 640);
        assert!(matches!(InflightArea::map(&file, 100, 0, 2, 8), Err(InflightError::TooSmall { .. })));
        let a = InflightArea::map(&file, size, 0, 2, 8).unwrap();
        assert!(matches!(a.queue(0, 16), Err(InflightError::SizeMismatch { .. })));
        assert!(a.queue(2, 8).is_err());
        // An area that claims more of the file than the file holds (a front-end's lie that would
        // end in SIGBUS), including through the offset.
        assert!(matches!(InflightArea::map(&file, 16512, 0, 2, 256), Err(InflightError::BeyondFile { .. })));
        assert!(matches!(InflightArea::map(&file, size, 64, 2, 8), Err(InflightError::BeyondFile { .. })));
        assert!(matches!(
            InflightArea::map(&file, size, u64::MAX, 2, 8),
            Err(InflightError::BeyondFile { .. })
        ));
    }

    #[test]
    fn a_clean_region_recovers_nothing_and_resubmits_in_taken_order() {
        let a = area();
        let mut q = a.queue(1, 8).unwrap();
        assert_eq!(q.recover(0), Recovered { resubmit: vec![], reused: false });
        for h in [5, 2, 7] {
            q.taken(h);
        }
        // Head 2 completes (out of order) and is published.
        q.completing(2);
        q.published(1);
        // "Crash": a new tracker over the same region, ring used idx 1.
        let mut again = a.queue(1, 8).unwrap();
        let r = again.recover(1);
        assert!(r.reused);
        assert_eq!(r.resubmit, vec![5, 7], "in the order they were taken; 2 is not replayed");
        // Queue 0 is untouched.
        let mut q0 = a.queue(0, 8).unwrap();
        assert!(!q0.recover(0).reused);
    }

    #[test]
    fn a_crash_between_publish_and_clearing_clears_the_last_batch() {
        let a = area();
        let mut q = a.queue(0, 8).unwrap();
        q.recover(0);
        for h in [1, 3, 4] {
            q.taken(h);
        }
        q.completing(4);
        q.completing(1);
        // The used index (2) reaches the guest, then the back-end dies before `published`.
        let mut again = a.queue(0, 8).unwrap();
        let r = again.recover(2);
        assert_eq!(r.resubmit, vec![3]);
        assert_eq!(again.marked(), vec![3]);
        // Counting continues after the largest counter seen.
        again.taken(6);
        let mut third = a.queue(0, 8).unwrap();
        assert_eq!(third.recover(2).resubmit, vec![3, 6]);
    }

    #[test]
    fn a_crash_before_publish_resubmits_the_whole_batch() {
        let a = area();
        let mut q = a.queue(0, 8).unwrap();
        q.recover(0);
        q.taken(0);
        q.taken(1);
        q.completing(1);
        let mut again = a.queue(0, 8).unwrap();
        assert_eq!(again.recover(0).resubmit, vec![0, 1], "the guest never saw 1 complete");
    }

    #[test]
    fn one_recovery_for_both_layouts() {
        let a = area();
        // Split, fresh: the front-end's position, nothing to resubmit.
        let from = Position::from_vring_base(3, false);
        let mut t = a.tracker(0, 8, false).unwrap();
        let r = t.recover(from, RingNow::Split { used_idx: 3 }).unwrap();
        assert_eq!(r, Recovery { resubmit: vec![], position: from, reused: false });
        t.taken(4);
        t.taken(6);
        // Again: what was taken comes back oldest first, and the ring continues after it.
        let mut again = a.tracker(0, 8, false).unwrap();
        let r = again.recover(from, RingNow::Split { used_idx: 3 }).unwrap();
        assert_eq!(r.resubmit, vec![Pending::Head(4), Pending::Head(6)]);
        assert_eq!(r.position, Position::Split { next_avail: 5, next_used: 3 });
        // Packed, fresh, on the other queue.
        let from = Position::Packed(PackedState::START);
        let mut p = a.tracker(1, 8, true).unwrap();
        let r = p.recover(from, RingNow::Packed { flags_at: &|_| Some(0) }).unwrap();
        assert_eq!((r.position, r.reused), (from, false));
        // A ring in another layout than the tracker's is refused.
        assert!(again.recover(from, RingNow::Packed { flags_at: &|_| None }).is_err());
    }

    // Packed layout. A "ring" here is the descriptor flags the recovery reads: `avail_at(lap)`
    // is what a slot holds while still available in that lap.

    use fp_virtq::DESC_F_NEXT as F_NEXT;

    fn avail_at(wrap: bool) -> u16 {
        if wrap {
            DESC_F_AVAIL
        } else {
            DESC_F_USED
        }
    }

    fn used_at(wrap: bool) -> u16 {
        if wrap {
            DESC_F_AVAIL | DESC_F_USED
        } else {
            0
        }
    }

    /// Takes a list of `n` descriptors with buffer `id` (addresses `id * 0x1000 + i`).
    fn take(t: &mut PackedInflight, id: u16, n: u16) {
        t.begin();
        for i in 0..n {
            let flags = if i + 1 < n { F_NEXT } else { 0 };
            t.record(RawDesc { addr: u64::from(id) * 0x1000 + u64::from(i), len: 16, id, flags });
        }
        t.taken(id);
    }

    fn ids(r: &PackedRecovered) -> Vec<(u16, u16)> {
        r.resubmit.iter().map(|q| (q.id, q.slots)).collect()
    }

    const START: PackedState = PackedState::START;

    #[test]
    fn packed_a_clean_region_recovers_nothing_and_resubmits_in_taken_order() {
        let a = area();
        let mut q = a.packed_queue(1, 8).unwrap();
        let fresh = q.recover(START, |_| None).unwrap();
        assert_eq!(fresh, PackedRecovered { resubmit: vec![], state: START, reused: false });
        take(&mut q, 5, 2);
        take(&mut q, 2, 1);
        take(&mut q, 7, 3);
        // Buffer 2 completes out of order and is published (its used descriptor goes to slot 0).
        q.completing(2, 1);
        q.published();
        let mut again = a.packed_queue(1, 8).unwrap();
        let r = again.recover(START, |_| panic!("nothing was being returned")).unwrap();
        assert!(r.reused);
        assert_eq!(ids(&r), vec![(5, 2), (7, 3)], "in the order taken; 2 is not replayed");
        // The copies are what was taken, NEXT links included.
        let d = &r.resubmit[1].descs;
        assert_eq!(
            d.iter().map(|d| (d.addr, d.flags)).collect::<Vec<_>>(),
            vec![(0x7000, F_NEXT), (0x7001, F_NEXT), (0x7002, 0)]
        );
        // Used position after the one returned slot; available after the 2 + 3 still out.
        assert_eq!(r.state, PackedState { next_avail: 6, avail_wrap: true, next_used: 1, used_wrap: true });
        // Queue 0 is untouched.
        assert!(!a.packed_queue(0, 8).unwrap().recover(START, |_| None).unwrap().reused);
        // The recovered lists complete by id, and the entries go back to the free list.
        again.completing(7, 3);
        again.completing(5, 2);
        again.published();
        assert!(again.marked().is_empty());
        let r = a.packed_queue(1, 8).unwrap().recover(START, |_| None).unwrap();
        assert_eq!(r.state, PackedState { next_avail: 6, avail_wrap: true, next_used: 6, used_wrap: true });
        assert!(r.resubmit.is_empty());
    }

    #[test]
    fn packed_a_crash_before_publish_resubmits_the_whole_batch() {
        let a = area();
        let mut q = a.packed_queue(0, 8).unwrap();
        q.recover(START, |_| None).unwrap();
        take(&mut q, 0, 1);
        take(&mut q, 1, 2);
        q.completing(1, 2);
        // Slot 0 still holds the driver's available descriptor: the batch never reached the guest.
        let mut again = a.packed_queue(0, 8).unwrap();
        let r = again.recover(START, |slot| Some(if slot == 0 { avail_at(true) } else { 0xffff })).unwrap();
        assert_eq!(ids(&r), vec![(0, 1), (1, 2)], "the guest never saw 1 complete");
        assert_eq!(r.state, PackedState { next_avail: 3, avail_wrap: true, next_used: 0, used_wrap: true });
    }

    #[test]
    fn packed_a_crash_between_publish_and_clearing_commits_the_batch() {
        let a = area();
        let mut q = a.packed_queue(0, 8).unwrap();
        // Continue from a position near the end of the ring: the batch wraps it.
        let base = PackedState { next_avail: 6, avail_wrap: true, next_used: 6, used_wrap: true };
        q.recover(base, |_| None).unwrap();
        take(&mut q, 3, 1);
        take(&mut q, 4, 2);
        take(&mut q, 1, 1);
        q.completing(4, 2);
        q.completing(3, 1);
        // The used descriptor at slot 6 reached the ring, then the back-end died.
        let mut again = a.packed_queue(0, 8).unwrap();
        let r =
            again.recover(base, |slot| Some(if slot == 6 { used_at(true) } else { avail_at(true) })).unwrap();
        assert_eq!(ids(&r), vec![(1, 1)]);
        assert_eq!(again.marked().len(), 1);
        assert_eq!(r.state, PackedState { next_avail: 2, avail_wrap: false, next_used: 1, used_wrap: false });
        // Counting continues after the largest counter seen.
        take(&mut again, 6, 1);
        let r = a.packed_queue(0, 8).unwrap().recover(base, |_| None).unwrap();
        assert_eq!(ids(&r), vec![(1, 1), (6, 1)]);
        // Also committed when the driver has already made the slot available for the next lap.
        let mut q = a.packed_queue(1, 8).unwrap();
        q.recover(START, |_| None).unwrap();
        take(&mut q, 0, 1);
        q.completing(0, 1);
        let r = a.packed_queue(1, 8).unwrap().recover(START, |_| Some(avail_at(false))).unwrap();
        assert!(r.resubmit.is_empty());
        assert_eq!(r.state.next_used, 1);
    }

    #[test]
    fn packed_taking_while_a_batch_is_pending_and_crashes_inside_a_take() {
        let a = area();
        let mut q = a.packed_queue(0, 8).unwrap();
        q.recover(START, |_| None).unwrap();
        // A request failed at once: completed while the ring is still being read.
        take(&mut q, 0, 2);
        q.completing(0, 2);
        take(&mut q, 1, 3);
        // Published: the batch is committed and only 1 is in flight.
        let used = |slot: u16| Some(if slot == 0 { used_at(true) } else { avail_at(true) });
        let r = a.packed_queue(0, 8).unwrap().recover(START, used).unwrap();
        assert_eq!(ids(&r), vec![(1, 3)]);
        assert_eq!(r.state, PackedState { next_avail: 5, avail_wrap: true, next_used: 2, used_wrap: true });
        // Not published: both are.
        let mut q = a.packed_queue(1, 8).unwrap();
        q.recover(START, |_| None).unwrap();
        take(&mut q, 0, 2);
        q.completing(0, 2);
        take(&mut q, 1, 3);
        let r = a.packed_queue(1, 8).unwrap().recover(START, |_| Some(avail_at(true))).unwrap();
        assert_eq!(ids(&r), vec![(0, 2), (1, 3)]);
        assert_eq!(r.state.next_avail, 5);
        // A take cut short (recorded, never marked taken) is not in flight: the ring position
        // stays before it, so it is taken from the ring again.
        let mut q = a.packed_queue(0, 8).unwrap();
        q.recover(START, |_| None).unwrap();
        q.begin();
        q.record(RawDesc { addr: 1, len: 1, id: 9, flags: 0 });
        let r = a.packed_queue(0, 8).unwrap().recover(START, |_| None).unwrap();
        assert_eq!(ids(&r), vec![(1, 3)]);
        assert_eq!(r.state.next_avail, 5);
    }

    #[test]
    fn packed_a_corrupt_region_is_refused() {
        let a = area();
        let mut q = a.packed_queue(0, 8).unwrap();
        q.recover(START, |_| None).unwrap();
        take(&mut q, 0, 2);
        // The front-end scribbles over the head's list length.
        q.region.write::<u16>(PackedInflight::entry(0) + E_NUM, 200);
        assert!(matches!(
            a.packed_queue(0, 8).unwrap().recover(START, |_| None),
            Err(InflightError::Corrupt(_))
        ));
        q.region.write::<u16>(PackedInflight::entry(0) + E_NUM, 2);
        q.region.write::<u16>(P_OLD_USED_IDX, 8);
        assert!(matches!(
            a.packed_queue(0, 8).unwrap().recover(START, |_| None),
            Err(InflightError::Corrupt(_))
        ));
    }
}
