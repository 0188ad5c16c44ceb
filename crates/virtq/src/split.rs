//! The split virtqueue, device side (virtio 1.2 §2.7).
//!
//! Ring addresses are resolved to host pointers once, when the queue starts; they stay valid as
//! long as the [`MemTable`] they came from (the caller keeps both together).
//!
//! * Available ring: `avail.idx` is read (acquire) only when every entry up to the last value
//!   read has been taken, so a burst of requests costs one shared-cache-line read.
//! * Used ring: elements are written as requests complete and `used.idx` is stored once per
//!   batch ([`SplitQueue::publish`]), one release store for many completions.
//! * Notifications: EVENT_IDX (§2.7.10) or the NO_INTERRUPT / NO_NOTIFY flags (§2.7.7).

use std::cell::Cell;
use std::num::Wrapping;
use std::sync::atomic::{fence, AtomicU16, Ordering};

use crate::chain::{read_desc, Chain, Desc, WalkError};
use crate::log::RingLog;
use crate::mem::MemTable;
use crate::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE};

/// VRING_AVAIL_F_NO_INTERRUPT (§2.7.7).
const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// VRING_USED_F_NO_NOTIFY (§2.7.7).
const USED_F_NO_NOTIFY: u16 = 1;
/// Largest queue size of either format (§2.7: 32768).
pub(crate) const MAX_QUEUE_SIZE: u16 = 32768;

/// Why a ring cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    /// A ring part is not mapped contiguously in one region.
    #[error("{what} at {addr:#x} (+{len} bytes) is not inside one guest memory region")]
    OutsideMemory {
        /// Which part of the ring.
        what: &'static str,
        /// Its guest address.
        addr: u64,
        /// Its size in bytes.
        len: u64,
    },
    /// A ring part is not at the alignment virtio requires (§2.7, §2.8.10).
    #[error("{what} at {addr:#x} is not aligned to {align}")]
    Misaligned {
        /// Which part of the ring.
        what: &'static str,
        /// Its guest address.
        addr: u64,
        /// The alignment required.
        align: u64,
    },
    /// The queue size is not a power of two in 1..=32768.
    #[error("queue size {0} is not a power of two up to 32768")]
    BadSize(u16),
    /// The driver published an available index that would hand over more than a ring's worth.
    #[error("available index {idx} is more than the queue size ahead of {next_avail}")]
    AvailIndex {
        /// The index the driver published.
        idx: u16,
        /// Where the device was reading.
        next_avail: u16,
    },
    /// A packed ring's starting position is not a slot of the ring.
    #[error("ring position {avail}/{used} (available/used) is outside a ring of {size}")]
    BadPosition {
        /// The available position given.
        avail: u16,
        /// The used position given.
        used: u16,
        /// The ring's size.
        size: u16,
    },
}

/// Host address of a ring part, checked for alignment and for lying inside one region.
pub(crate) fn ring_part(
    mem: &MemTable,
    what: &'static str,
    addr: u64,
    len: u64,
    align: u64,
) -> Result<*mut u8, RingError> {
    if addr % align != 0 {
        return Err(RingError::Misaligned { what, addr, align });
    }
    mem.translate(addr, len).ok_or(RingError::OutsideMemory { what, addr, len })
}

/// Walks a split-format chain from `index` of the ring's table at `table` (`size` entries).
///
/// The bounds are virtio-queue's, so behaviour did not change when this replaced it: at most
/// `size` descriptors per table (a longer chain has a loop), `next` below the table's size, one
/// indirect table at most (it ends the main chain; its own entries may not be indirect), plus
/// the [`Chain`]'s own limits.
#[inline]
fn walk_table(
    mem: &MemTable,
    mut table: *const u8,
    mut size: u32,
    mut index: u32,
    chain: &mut Chain,
) -> Result<(), WalkError> {
    let mut ttl = size;
    let mut in_indirect = false;
    loop {
        if index >= size {
            return Err(WalkError::Broken);
        }
        // SAFETY: `index < size` and the table's `16 * size` bytes were checked to lie inside
        // one region of `mem` (ring start, or the indirect branch below).
        let (addr, w1) = unsafe { read_desc(table, index) };
        let (len, flags, next) = (w1 as u32, (w1 >> 32) as u16, (w1 >> 48) as u16);
        if flags & DESC_F_INDIRECT != 0 {
            // §2.7.5.3.1: no nested tables; the length is a whole number of descriptors.
            if in_indirect || len == 0 || len % 16 != 0 {
                return Err(WalkError::Broken);
            }
            table = mem.translate(addr, u64::from(len)).ok_or(WalkError::Broken)?;
            (size, ttl, index, in_indirect) = (len / 16, len / 16, 0, true);
            continue;
        }
        chain.add(mem, addr, len, flags & DESC_F_WRITE != 0)?;
        if flags & DESC_F_NEXT == 0 {
            return Ok(());
        }
        ttl -= 1;
        if ttl == 0 {
            return Err(WalkError::Broken);
        }
        index = u32::from(next);
    }
}

/// One split virtqueue, device side. See the module docs.
pub struct SplitQueue {
    desc: *const u8,
    /// `struct virtq_avail` (flags, idx, ring[size], used_event).
    avail: *const u8,
    /// `struct virtq_used` (flags, idx, ring[size], avail_event).
    used: *mut u8,
    size: u16,
    event_idx: bool,
    next_avail: Wrapping<u16>,
    /// `avail.idx` as last read.
    avail_idx: Wrapping<u16>,
    next_used: Wrapping<u16>,
    /// `next_used` when the driver was last notified (or the ring started).
    signalled: Wrapping<u16>,
    /// Elements written but not yet published.
    unpublished: u16,
    /// The last chain taken, as the guess at the next one: its head, and the host address of
    /// its first buffer (the request header; null when unknown). A driver at low depth takes the
    /// same descriptors and header again for its next request, so when new requests show, both
    /// lines are prefetched ([`SplitQueue::has_available`]): their misses then overlap the
    /// available ring's instead of following it, one after the other, through the loads that
    /// need their addresses. A wrong guess costs two prefetches. The head is kept as the driver
    /// wrote it, in range or not (a compare per request is dearer than a mask per prefetch).
    last_head: u16,
    last_first: Cell<*mut u8>,
    /// While migrating: where the used ring's writes are logged. `None` costs one predictable
    /// branch per element and per publish.
    log: Option<RingLog>,
}

impl SplitQueue {
    /// Resolves the rings at guest addresses `desc`, `avail`, `used`. The device continues at
    /// `next_avail` / `next_used` (the vring base, or in-flight recovery).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mem: &MemTable,
        desc: u64,
        avail: u64,
        used: u64,
        size: u16,
        event_idx: bool,
        next_avail: u16,
        next_used: u16,
    ) -> Result<SplitQueue, RingError> {
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(RingError::BadSize(size));
        }
        let n = u64::from(size);
        // §2.7: alignments 16, 2, 4; both rings carry a trailing u16 event field whether or not
        // EVENT_IDX was negotiated.
        let desc = ring_part(mem, "descriptor table", desc, 16 * n, 16)?;
        let avail = ring_part(mem, "available ring", avail, 6 + 2 * n, 2)?;
        let used = ring_part(mem, "used ring", used, 6 + 8 * n, 4)?;
        let next_avail = Wrapping(next_avail);
        Ok(SplitQueue {
            desc,
            avail,
            used,
            size,
            event_idx,
            next_avail,
            avail_idx: next_avail,
            next_used: Wrapping(next_used),
            signalled: Wrapping(next_used),
            unpublished: 0,
            last_head: 0,
            last_first: Cell::new(std::ptr::null_mut()),
            log: None,
        })
    }

    /// Starts (`Some`) or stops (`None`) logging the used ring's writes (vhost-user's
    /// VHOST_VRING_F_LOG); takes effect with the next write.
    pub fn set_log(&mut self, log: Option<RingLog>) {
        self.log = log;
    }

    /// Pages the used ring's writes marked in the log since the last call.
    pub fn take_logged_pages(&mut self) -> u64 {
        self.log.as_mut().map_or(0, RingLog::take_pages)
    }

    /// Number of entries in the ring.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The next available-ring position the device will take.
    pub fn next_avail(&self) -> u16 {
        self.next_avail.0
    }

    /// The next used-ring position the device will write.
    pub fn next_used(&self) -> u16 {
        self.next_used.0
    }

    /// Requests the driver has made available and not yet seen come back: the available
    /// index as last read less the used index as last published. Never more than the driver
    /// has out, and all of it when the index was read with every request out and nothing
    /// published since: the largest value over many rounds is the driver's queue depth.
    #[inline(always)]
    pub fn outstanding(&self) -> u16 {
        (self.avail_idx - (self.next_used - Wrapping(self.unpublished))).0
    }

    fn avail_idx_field(&self) -> &AtomicU16 {
        // SAFETY: `avail + 2` is the 2-aligned `idx` field inside the mapped ring (checked in
        // `new`, kept alive by the caller's memory table); AtomicU16 has u16's layout.
        unsafe { AtomicU16::from_ptr(self.avail.add(2) as *mut u16) }
    }

    /// The guest's current `used.idx` (crash recovery compares it with its own record).
    pub fn used_idx_in_memory(&self) -> u16 {
        // SAFETY: as `avail_idx_field`, for the used ring's `idx`.
        u16::from_le(unsafe { AtomicU16::from_ptr(self.used.add(2) as *mut u16) }.load(Ordering::Acquire))
    }

    /// Whether a head is available ([`SplitQueue::pop`] then takes it), reading the driver's
    /// index only once the heads it showed last are taken: a caller that takes each head in a
    /// call of its own tests this first, inlined, and makes no call for an empty ring. An
    /// available index more than a ring ahead is a driver error: the queue must fail.
    #[inline(always)]
    pub fn has_available(&mut self) -> Result<bool, RingError> {
        if self.next_avail == self.avail_idx {
            // Acquire: the ring entries and descriptors the driver wrote before the index.
            let idx = Wrapping(u16::from_le(self.avail_idx_field().load(Ordering::Acquire)));
            if (idx - self.next_avail).0 > self.size {
                return Err(RingError::AvailIndex { idx: idx.0, next_avail: self.next_avail.0 });
            }
            if idx == self.next_avail {
                return Ok(false);
            }
            self.avail_idx = idx;
            self.prefetch_guess();
        }
        Ok(true)
    }

    /// Prefetches the last chain's head descriptor and first buffer (see `last_head`).
    #[inline(always)]
    fn prefetch_guess(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: a prefetch is a hint: it neither faults nor changes memory, whatever the
            // address. The descriptor lies inside the mapped table (the head masked to the
            // ring's size, a power of two); the buffer's address may be stale (a new memory
            // table), which a prefetch tolerates.
            unsafe {
                let head = usize::from(self.last_head & (self.size - 1));
                _mm_prefetch::<_MM_HINT_T0>(self.desc.add(16 * head).cast());
                let first = self.last_first.get();
                if !first.is_null() {
                    _mm_prefetch::<_MM_HINT_T0>(first.cast_const().cast());
                }
            }
        }
    }

    /// Takes the next available head, if any. An available index more than a ring ahead is a
    /// driver error: the queue must fail.
    #[inline]
    pub fn pop(&mut self) -> Result<Option<u16>, RingError> {
        if !self.has_available()? {
            return Ok(None);
        }
        let slot = usize::from(self.next_avail.0 & (self.size - 1));
        // SAFETY: `slot < size`; ring[slot] is inside the mapped avail ring (checked in `new`).
        let head =
            u16::from_le(unsafe { std::ptr::read_volatile(self.avail.add(4 + 2 * slot).cast::<u16>()) });
        self.next_avail += Wrapping(1);
        self.last_head = head;
        Ok(Some(head))
    }

    /// Collects the chain headed by descriptor `head` into `chain`.
    ///
    /// The common virtio-blk request (header, one data buffer, status: three direct, non-empty
    /// descriptors) takes a fast path that reads the three descriptors once and stores them
    /// at once; anything else, and anything the fast path is unsure of, is walked again by
    /// [`SplitQueue::walk_general`]. Both give the same chain or the same error on any input
    /// (the `chain_parser` fuzz target compares them).
    #[inline]
    pub fn walk(&self, mem: &MemTable, head: u16, chain: &mut Chain) -> Result<(), WalkError> {
        if self.walk_three(mem, head, chain) {
            return Ok(());
        }
        self.walk_general(mem, head, chain)
    }

    /// The general walker [`SplitQueue::walk`] falls back to: any chain, every rule of the
    /// module docs. Public so tests and fuzzing can compare the fast path with it.
    #[inline(never)]
    pub fn walk_general(&self, mem: &MemTable, head: u16, chain: &mut Chain) -> Result<(), WalkError> {
        chain.clear();
        walk_table(mem, self.desc, u32::from(self.size), u32::from(head), chain)
    }

    /// The fast path of [`SplitQueue::walk`]: true when the chain at `head` is exactly three
    /// direct, non-empty descriptors, now stored in `chain` as the general walker would store
    /// them. False leaves `chain` as it was (the general walker starts over, reading the
    /// descriptors again; a guest that changed them meanwhile gets what that walk sees).
    #[inline(always)]
    fn walk_three(&self, mem: &MemTable, head: u16, chain: &mut Chain) -> bool {
        match self.read_three(mem, head) {
            Some((descs, total)) => {
                chain.set_three(descs, total);
                true
            }
            None => false,
        }
    }

    /// The chain at `head` when it is exactly three direct, non-empty descriptors (the common
    /// virtio-blk request), as the general walker would store them, with their byte total:
    /// returned by value, not stored, so that a caller that inlines this and consumes the
    /// three at once (the request's parse) keeps them in registers. `None` decides nothing:
    /// the caller walks the chain with [`SplitQueue::walk`], which reads the descriptors again
    /// (a guest that changed them meanwhile gets what that walk sees).
    ///
    /// Why the general walker's remaining checks cannot fail here: with a table of at least
    /// three entries its loop bound (`size` descriptors) is not reached by three; the indices
    /// are checked below; the byte total is checked without overflow; three is far below
    /// [`crate::MAX_CHAIN_DESCRIPTORS`].
    #[inline(always)]
    pub fn read_three(&self, mem: &MemTable, head: u16) -> Option<([Desc; 3], u32)> {
        const KIND: u16 = DESC_F_NEXT | DESC_F_WRITE | DESC_F_INDIRECT;
        let size = u32::from(self.size);
        let i0 = u32::from(head);
        if size < 3 || i0 >= size {
            return None;
        }
        // SAFETY: `i0 < size` and the table's `16 * size` bytes lie inside one region
        // (checked in `new`).
        let (a0, w0) = unsafe { read_desc(self.desc, i0) };
        let i1 = u32::from((w0 >> 48) as u16);
        // First: readable, continues. Nothing else can head a three-descriptor request.
        if (w0 >> 32) as u16 & KIND != DESC_F_NEXT || i1 >= size {
            return None;
        }
        // SAFETY: as above, `i1 < size`.
        let (a1, w1) = unsafe { read_desc(self.desc, i1) };
        let i2 = u32::from((w1 >> 48) as u16);
        // Second: either direction, continues.
        if (w1 >> 32) as u16 & (DESC_F_NEXT | DESC_F_INDIRECT) != DESC_F_NEXT || i2 >= size {
            return None;
        }
        // SAFETY: as above, `i2 < size`.
        let (a2, w2) = unsafe { read_desc(self.desc, i2) };
        // Third: ends the chain, not indirect.
        let f2 = (w2 >> 32) as u16;
        if f2 & (DESC_F_NEXT | DESC_F_INDIRECT) != 0 {
            return None;
        }
        let (l0, l1, l2) = (w0 as u32, w1 as u32, w2 as u32);
        let total = u64::from(l0) + u64::from(l1) + u64::from(l2);
        if l0 == 0 || l1 == 0 || l2 == 0 || total > u64::from(u32::MAX) {
            return None;
        }
        let desc = |addr: u64, len: u32, flags: u16| Desc {
            addr,
            len,
            write: flags & DESC_F_WRITE != 0,
            host: mem.host_or_null(addr, u64::from(len)),
        };
        let f1 = (w1 >> 32) as u16;
        let first = desc(a0, l0, DESC_F_NEXT);
        self.last_first.set(first.host);
        Some(([first, desc(a1, l1, f1), desc(a2, l2, f2)], total as u32))
    }

    /// Writes one used element (not yet visible to the driver).
    #[inline]
    pub fn push_used(&mut self, head: u16, len: u32) {
        let slot = usize::from(self.next_used.0 & (self.size - 1));
        // SAFETY: `slot < size`, so the 8-byte element is inside the mapped, 4-aligned used ring
        // (checked in `new`). The guest may read it concurrently; volatile writes.
        unsafe {
            let elem = self.used.add(4 + 8 * slot).cast::<u32>();
            std::ptr::write_volatile(elem, u32::from(head).to_le());
            std::ptr::write_volatile(elem.add(1), len.to_le());
        }
        if let Some(log) = &mut self.log {
            log.used(4 + 8 * slot as u64, 8);
        }
        self.next_used += Wrapping(1);
        self.unpublished += 1;
    }

    /// Makes every pushed element visible with one store of `used.idx`. Returns how many.
    #[inline]
    pub fn publish(&mut self) -> u16 {
        let n = self.unpublished;
        if n > 0 {
            // SAFETY: `used + 2` is the 2-aligned `idx` field of the mapped used ring.
            let idx = unsafe { AtomicU16::from_ptr(self.used.add(2) as *mut u16) };
            // Release: the elements written above, and the log bits set for them and for the
            // data they complete, are visible before the new index.
            idx.store(self.next_used.0.to_le(), Ordering::Release);
            // Marked after the store, as every write is: a log sync between a mark and its
            // write would clear the bit and copy the page without the write.
            if let Some(log) = &mut self.log {
                log.used(2, 2);
            }
            self.unpublished = 0;
        }
        n
    }

    /// Whether the driver waits to be notified of the next used element: with EVENT_IDX, it
    /// consumed everything published and set `used_event` to the next index; without, it has
    /// not set NO_INTERRUPT (whether it consumed is unknown then). Reads the driver's field,
    /// changes nothing.
    #[inline]
    pub fn driver_waits(&self) -> bool {
        if self.event_idx {
            // SAFETY: used_event follows ring[size] in the mapped avail ring; 2-aligned.
            let used_event = unsafe {
                AtomicU16::from_ptr(self.avail.add(4 + 2 * usize::from(self.size)) as *mut u16)
                    .load(Ordering::Relaxed)
            };
            u16::from_le(used_event) == self.next_used.0
        } else {
            // SAFETY: `avail` points to the mapped, 2-aligned avail ring's flags field.
            let flags = unsafe { AtomicU16::from_ptr(self.avail as *mut u16).load(Ordering::Relaxed) };
            u16::from_le(flags) & AVAIL_F_NO_INTERRUPT == 0
        }
    }

    /// Whether the driver wants a notification for what was published since the last one.
    #[inline]
    pub fn needs_notification(&mut self) -> bool {
        let (new, old) = (self.next_used, self.signalled);
        if new == old {
            return false;
        }
        // Order our used.idx store before reading the driver's suppression fields (§2.7.10).
        fence(Ordering::SeqCst);
        let notify = self.wants(new, old);
        if notify {
            self.signalled = new;
        }
        notify
    }

    /// Whether the driver's suppression field, read now and without a fence, declines a
    /// notification for what was published since the last one (true when there is nothing to
    /// notify). Changes nothing. Cheaper than [`SplitQueue::needs_notification`] by the fence,
    /// which waits for the used ring's stores to reach the driver's CPU; but a `true` is only
    /// provisional: the read may be older than those stores, and a driver that enabled
    /// notifications in between expects one (§2.7.10). A caller that takes it must ask again,
    /// until `needs_notification` decides, before it stops looking at the queue.
    #[inline]
    pub fn declines_for_now(&self) -> bool {
        let (new, old) = (self.next_used, self.signalled);
        new == old || !self.wants(new, old)
    }

    /// The driver's suppression field, read relaxed, against the used positions `[old, new)`.
    #[inline(always)]
    fn wants(&self, new: Wrapping<u16>, old: Wrapping<u16>) -> bool {
        if self.event_idx {
            // SAFETY: used_event follows ring[size] in the mapped avail ring; 2-aligned.
            let used_event = unsafe {
                AtomicU16::from_ptr(self.avail.add(4 + 2 * usize::from(self.size)) as *mut u16)
                    .load(Ordering::Relaxed)
            };
            // vring_need_event (§2.7.10): notify if used_event lies in [old, new).
            new - Wrapping(u16::from_le(used_event)) - Wrapping(1) < new - old
        } else {
            // SAFETY: `avail` points to the mapped, 2-aligned avail ring's flags field.
            let flags = unsafe { AtomicU16::from_ptr(self.avail as *mut u16).load(Ordering::Relaxed) };
            u16::from_le(flags) & AVAIL_F_NO_INTERRUPT == 0
        }
    }

    fn used_flags(&self) -> &AtomicU16 {
        // SAFETY: `used` is the 4-aligned start (flags) of the mapped used ring.
        unsafe { AtomicU16::from_ptr(self.used as *mut u16) }
    }

    /// Asks the driver not to kick while the device polls (without EVENT_IDX: NO_NOTIFY; with
    /// it, the stale avail_event already limits kicks to one per lap).
    pub fn disable_notification(&mut self) {
        if !self.event_idx {
            self.used_flags().store(USED_F_NO_NOTIFY.to_le(), Ordering::Relaxed);
            if let Some(log) = &mut self.log {
                log.used(0, 2);
            }
        }
    }

    /// Asks the driver to kick for the next request before the device sleeps. Returns whether
    /// requests arrived meanwhile (then the device must not sleep).
    pub fn enable_notification(&mut self) -> bool {
        if self.event_idx {
            // SAFETY: avail_event follows ring[size] in the mapped used ring; 2-aligned.
            let ev =
                unsafe { AtomicU16::from_ptr(self.used.add(4 + 8 * usize::from(self.size)) as *mut u16) };
            ev.store(self.next_avail.0.to_le(), Ordering::Relaxed);
            if let Some(log) = &mut self.log {
                log.used(4 + 8 * u64::from(self.size), 2);
            }
        } else {
            self.used_flags().store(0, Ordering::Relaxed);
            if let Some(log) = &mut self.log {
                log.used(0, 2);
            }
        }
        // The driver writes avail.idx then reads our field; we write our field then read
        // avail.idx: a full fence on both sides means one of us sees the other (§2.7.10).
        fence(Ordering::SeqCst);
        Wrapping(u16::from_le(self.avail_idx_field().load(Ordering::Acquire))) != self.next_avail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::GuestMemory;
    use std::sync::Arc;
    use vm_memory::{Bytes, GuestAddress};

    const DESC: u64 = 0x0;
    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;

    fn setup() -> (GuestMemory, MemTable) {
        let m = GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let t = MemTable::new(Arc::new(m.clone())).unwrap();
        (m, t)
    }

    fn u16_at(m: &GuestMemory, a: u64) -> u16 {
        m.read_obj(GuestAddress(a)).unwrap()
    }

    #[test]
    fn publishes_once_per_batch_and_follows_used_event() {
        let (m, t) = setup();
        let mut ring = SplitQueue::new(&t, DESC, AVAIL, USED, 8, true, 0, 0).unwrap();
        ring.push_used(3, 512);
        ring.push_used(5, 1);
        assert_eq!(u16_at(&m, USED + 2), 0, "not yet published");
        assert_eq!(ring.publish(), 2);
        assert_eq!(u16_at(&m, USED + 2), 2);
        assert_eq!(m.read_obj::<u32>(GuestAddress(USED + 4)).unwrap(), 3);
        assert_eq!(m.read_obj::<u32>(GuestAddress(USED + 8)).unwrap(), 512);
        assert_eq!(m.read_obj::<u32>(GuestAddress(USED + 12)).unwrap(), 5);
        // used_event = 0: the driver wants to hear once used idx passes 0.
        m.write_obj::<u16>(0, GuestAddress(AVAIL + 4 + 16)).unwrap();
        assert!(ring.needs_notification());
        assert!(!ring.needs_notification(), "nothing new since");
        // The driver asks to be told after entry 5 only.
        m.write_obj::<u16>(5, GuestAddress(AVAIL + 4 + 16)).unwrap();
        for h in 0..3 {
            ring.push_used(h, 1);
        }
        ring.publish();
        assert!(!ring.needs_notification(), "used idx 5 < used_event + 1");
        ring.push_used(0, 1);
        ring.publish();
        assert!(ring.needs_notification(), "used idx 6 passes used_event 5");
    }

    #[test]
    fn declining_for_now_answers_as_the_fenced_decision_and_changes_nothing() {
        let (m, t) = setup();
        for event_idx in [false, true] {
            let mut ring = SplitQueue::new(&t, DESC, AVAIL, USED, 8, event_idx, 0, 0).unwrap();
            assert!(ring.declines_for_now(), "nothing published: nothing to notify");
            // Declined: NO_INTERRUPT, or used_event 4 outside [0, 2).
            m.write_obj::<u16>(1, GuestAddress(AVAIL)).unwrap();
            m.write_obj::<u16>(4, GuestAddress(AVAIL + 4 + 16)).unwrap();
            ring.push_used(0, 1);
            ring.push_used(1, 1);
            ring.publish();
            assert!(ring.declines_for_now(), "event_idx {event_idx}");
            assert!(ring.declines_for_now(), "event_idx {event_idx}: asking again changes nothing");
            // The driver asks: flags 0, or used_event 1 inside [0, 2) (it consumed one).
            m.write_obj::<u16>(0, GuestAddress(AVAIL)).unwrap();
            m.write_obj::<u16>(1, GuestAddress(AVAIL + 4 + 16)).unwrap();
            assert!(!ring.declines_for_now(), "event_idx {event_idx}");
            assert!(ring.needs_notification(), "event_idx {event_idx}: the range was kept");
            assert!(ring.declines_for_now(), "event_idx {event_idx}: decided, nothing new");
            m.write_obj::<u16>(0, GuestAddress(AVAIL + 2)).unwrap();
            m.write_obj::<u16>(0, GuestAddress(USED + 2)).unwrap();
        }
    }

    #[test]
    fn without_event_idx_the_no_interrupt_flag_rules() {
        let (m, t) = setup();
        let mut ring = SplitQueue::new(&t, DESC, AVAIL, USED, 4, false, 65535, 65535).unwrap();
        ring.push_used(1, 1);
        ring.publish();
        assert_eq!(u16_at(&m, USED + 2), 0, "index wraps");
        m.write_obj::<u16>(1, GuestAddress(AVAIL)).unwrap();
        assert!(!ring.needs_notification());
        m.write_obj::<u16>(0, GuestAddress(AVAIL)).unwrap();
        ring.push_used(2, 1);
        ring.publish();
        assert!(ring.needs_notification());
        // Polling sets NO_NOTIFY; re-arming clears it and sees what arrived meanwhile.
        ring.disable_notification();
        assert_eq!(u16_at(&m, USED), USED_F_NO_NOTIFY);
        m.write_obj::<u16>(65535, GuestAddress(AVAIL + 2)).unwrap();
        assert!(!ring.enable_notification());
        assert_eq!(u16_at(&m, USED), 0);
        m.write_obj::<u16>(0, GuestAddress(AVAIL + 2)).unwrap();
        assert!(ring.enable_notification(), "avail idx 0 != next_avail 65535");
    }

    #[test]
    fn pop_reads_the_index_once_per_burst_and_refuses_a_runaway_index() {
        let (m, t) = setup();
        let mut ring = SplitQueue::new(&t, DESC, AVAIL, USED, 4, true, 0, 0).unwrap();
        assert_eq!(ring.pop(), Ok(None));
        for (i, h) in [2u16, 0, 3].iter().enumerate() {
            m.write_obj(*h, GuestAddress(AVAIL + 4 + 2 * i as u64)).unwrap();
        }
        m.write_obj::<u16>(3, GuestAddress(AVAIL + 2)).unwrap();
        assert_eq!(ring.pop(), Ok(Some(2)));
        // Index moved backwards by a hostile driver: the cached value still bounds the burst.
        m.write_obj::<u16>(1, GuestAddress(AVAIL + 2)).unwrap();
        assert_eq!(ring.pop(), Ok(Some(0)));
        assert_eq!(ring.pop(), Ok(Some(3)));
        assert_eq!(ring.next_avail(), 3);
        m.write_obj::<u16>(3 + 5, GuestAddress(AVAIL + 2)).unwrap();
        assert_eq!(ring.pop(), Err(RingError::AvailIndex { idx: 8, next_avail: 3 }));
        // EVENT_IDX re-arm writes avail_event = next_avail.
        m.write_obj::<u16>(3, GuestAddress(AVAIL + 2)).unwrap();
        assert!(!ring.enable_notification());
        assert_eq!(u16_at(&m, USED + 4 + 8 * 4), 3);
    }

    #[test]
    fn outstanding_counts_what_the_driver_has_out_until_it_is_published() {
        let (m, t) = setup();
        // Restarted with 2 requests in flight (next_avail 65534 past next_used 65532, wrapping).
        let mut ring = SplitQueue::new(&t, DESC, AVAIL, USED, 8, true, 65534, 65532).unwrap();
        assert_eq!(ring.outstanding(), 2);
        // Three more made available: counted once the index is read.
        m.write_obj::<u16>(1, GuestAddress(AVAIL + 2)).unwrap();
        assert_eq!(ring.outstanding(), 2, "the index as last read");
        assert!(ring.has_available().unwrap());
        assert_eq!(ring.outstanding(), 5);
        // Completed but not published: still out, as the driver sees it.
        ring.pop().unwrap();
        ring.push_used(0, 1);
        ring.push_used(1, 1);
        assert_eq!(ring.outstanding(), 5);
        ring.publish();
        assert_eq!(ring.outstanding(), 3);
    }

    #[test]
    fn a_logged_ring_marks_its_used_side_before_publishing() {
        use crate::log::{DirtyLog, RingLog};
        let (_m, t) = setup();
        // 256 entries at 0x2800: elements 0..=254 lie in the page at 0x2000, element 255
        // (0x2ffc..0x3004) crosses into the next one, where avail_event (0x3004) also lies.
        let used = 0x2800;
        let mut ring = SplitQueue::new(&t, DESC, AVAIL, used, 256, true, 0, 0).unwrap();
        ring.push_used(0, 1);
        ring.publish();
        assert_eq!(ring.take_logged_pages(), 0, "no log: nothing counted");
        let log = Arc::new(DirtyLog::in_memory(2));
        ring.set_log(Some(RingLog::new(log.clone(), used, DESC)));
        for h in 1..255 {
            ring.push_used(h, 1);
        }
        assert_eq!(log.marked_pages(), vec![2], "elements 1..=254");
        ring.publish();
        assert_eq!(log.marked_pages(), vec![2], "used.idx");
        ring.push_used(0, 1);
        assert_eq!(log.marked_pages(), vec![2, 3], "element 255, crossing the page");
        log.clear();
        assert!(!ring.enable_notification());
        assert_eq!(log.marked_pages(), vec![3], "avail_event");
        assert_eq!(ring.take_logged_pages(), 254 + 1 + 2 + 1);
        log.clear();
        ring.set_log(None);
        ring.push_used(0, 1);
        ring.publish();
        assert!(log.marked_pages().is_empty(), "logging stopped");
    }

    /// Writes descriptor `i` of the table at DESC.
    fn put_desc(m: &GuestMemory, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = DESC + 16 * u64::from(i);
        m.write_obj(addr, GuestAddress(at)).unwrap();
        m.write_obj(len, GuestAddress(at + 8)).unwrap();
        m.write_obj(flags, GuestAddress(at + 12)).unwrap();
        m.write_obj(next, GuestAddress(at + 14)).unwrap();
    }

    fn fields(c: &Chain) -> Vec<(u64, u32, bool, usize)> {
        c.descs().iter().map(|d| (d.addr, d.len, d.write, d.host as usize)).collect()
    }

    /// Walks `head` both ways and checks they agree; returns the fast path's answer.
    fn walk_both(
        ring: &SplitQueue,
        t: &MemTable,
        head: u16,
    ) -> Result<Vec<(u64, u32, bool, usize)>, WalkError> {
        let (mut fast, mut general) = (Chain::new(), Chain::new());
        let a = ring.walk(t, head, &mut fast).map(|_| fields(&fast));
        let b = ring.walk_general(t, head, &mut general).map(|_| fields(&general));
        assert_eq!(a, b, "fast path and general walk differ at head {head}");
        a
    }

    #[test]
    fn the_guess_at_the_next_request_is_the_last_one_taken() {
        let (m, t) = setup();
        let mut ring = SplitQueue::new(&t, DESC, AVAIL, USED, 8, true, 0, 0).unwrap();
        assert_eq!((ring.last_head, ring.last_first.get()), (0, std::ptr::null_mut()), "no guess yet");
        let (n, w) = (DESC_F_NEXT, DESC_F_WRITE);
        put_desc(&m, 5, 0x4000, 16, n, 2);
        put_desc(&m, 2, 0x5000, 4096, n | w, 7);
        put_desc(&m, 7, 0x4010, 1, w, 0);
        m.write_obj::<u16>(5, GuestAddress(AVAIL + 4)).unwrap();
        m.write_obj::<u16>(1, GuestAddress(AVAIL + 2)).unwrap();
        let head = ring.pop().unwrap().unwrap();
        ring.walk(&t, head, &mut Chain::new()).unwrap();
        assert_eq!(ring.last_head, 5);
        assert_eq!(ring.last_first.get() as usize, t.translate(0x4000, 16).unwrap() as usize, "the header");
        // A head out of range (the walk refuses it) is kept as written: the prefetch masks it
        // into the table (9 & 7), and a wrong guess costs only the prefetch.
        m.write_obj::<u16>(9, GuestAddress(AVAIL + 6)).unwrap();
        m.write_obj::<u16>(2, GuestAddress(AVAIL + 2)).unwrap();
        assert_eq!(ring.pop(), Ok(Some(9)));
        assert_eq!(ring.last_head, 9);
        m.write_obj::<u16>(3, GuestAddress(AVAIL + 2)).unwrap();
        assert!(ring.has_available().unwrap(), "the prefetch of descriptor 1 stays inside the table");
    }

    #[test]
    fn the_three_descriptor_fast_path_walks_as_the_general_walker() {
        let (m, t) = setup();
        let ring = SplitQueue::new(&t, DESC, AVAIL, USED, 8, true, 0, 0).unwrap();
        let (n, w) = (DESC_F_NEXT, DESC_F_WRITE);
        // A read: header, data, status, out of order in the table.
        put_desc(&m, 5, 0x4000, 16, n, 2);
        put_desc(&m, 2, 0x5000, 4096, n | w, 7);
        put_desc(&m, 7, 0x4010, 1, w, 0);
        let c = walk_both(&ring, &t, 5).unwrap();
        let host = t.translate(0x4000, 16).unwrap() as usize;
        assert_eq!(c[0], (0x4000, 16, false, host));
        assert_eq!(
            c.iter().map(|d| (d.1, d.2)).collect::<Vec<_>>(),
            vec![(16, false), (4096, true), (1, true)]
        );
        // Data outside memory: stored untranslated, as the general walker stores it.
        put_desc(&m, 2, 0xf_0000, 4096, n | w, 7);
        assert_eq!(walk_both(&ring, &t, 5).unwrap()[1].3, 0);
        // An empty middle descriptor, a fourth descriptor, an indirect one, a loop back to the
        // head, `next` out of range, more than 4 GiB: all left to the general walker.
        put_desc(&m, 2, 0x5000, 0, n | w, 7);
        assert_eq!(walk_both(&ring, &t, 5).unwrap().len(), 2);
        put_desc(&m, 2, 0x5000, 4096, n | w, 7);
        put_desc(&m, 7, 0x4010, 1, n | w, 1);
        put_desc(&m, 1, 0x4020, 1, w, 0);
        assert_eq!(walk_both(&ring, &t, 5).unwrap().len(), 4);
        put_desc(&m, 7, 0x4010, 1, n | w, 5);
        assert_eq!(walk_both(&ring, &t, 5), Err(WalkError::Broken));
        put_desc(&m, 7, 0x4010, 1, n | w, 8);
        assert_eq!(walk_both(&ring, &t, 5), Err(WalkError::Broken));
        put_desc(&m, 7, 0x4010, 1, w, 0);
        put_desc(&m, 2, 0x6000, 32, n | crate::DESC_F_INDIRECT, 7);
        // The indirect table (two empty entries) ends the main chain: only the header is kept.
        assert_eq!(walk_both(&ring, &t, 5).unwrap().len(), 1);
        put_desc(&m, 2, 0x5000, u32::MAX - 16, n | w, 7);
        assert_eq!(walk_both(&ring, &t, 5), Err(WalkError::Broken), "more than 4 GiB");
        assert_eq!(walk_both(&ring, &t, 8), Err(WalkError::Broken), "head out of range");
        // A ring of two entries cannot hold a chain of three.
        let small = SplitQueue::new(&t, DESC, AVAIL, USED, 2, true, 0, 0).unwrap();
        put_desc(&m, 0, 0x4000, 16, n, 1);
        put_desc(&m, 1, 0x5000, 512, n | w, 0);
        assert_eq!(walk_both(&small, &t, 0), Err(WalkError::Broken));
    }

    #[test]
    fn rings_outside_memory_or_misaligned_are_refused() {
        let (_m, t) = setup();
        assert!(matches!(
            SplitQueue::new(&t, DESC, AVAIL, 0xfff0, 8, true, 0, 0),
            Err(RingError::OutsideMemory { what: "used ring", .. })
        ));
        assert!(matches!(
            SplitQueue::new(&t, DESC, AVAIL + 1, USED, 8, true, 0, 0),
            Err(RingError::Misaligned { what: "available ring", .. })
        ));
        assert!(matches!(
            SplitQueue::new(&t, 0x8, AVAIL, USED, 8, true, 0, 0),
            Err(RingError::Misaligned { what: "descriptor table", .. })
        ));
        assert_eq!(SplitQueue::new(&t, DESC, AVAIL, USED, 6, true, 0, 0).err(), Some(RingError::BadSize(6)));
    }
}
