//! The driver side of one split virtqueue (virtio 1.2 §2.7) carrying virtio-blk requests of
//! three descriptors each (header, data, status), for the vhost-user frontend back end
//! (`frontend.rs`).
//!
//! Slot `s` owns descriptors `3s`, `3s + 1` and `3s + 2` for the whole run, chained once at
//! set-up, so a submission writes the header, the data descriptor's address, length and
//! direction, one available-ring entry and the available index. Descriptors hold guest-physical
//! addresses: offsets into the frontend's one memory region (`gpa_of`). Neither
//! `VIRTIO_F_RING_EVENT_IDX` nor indirect descriptors are negotiated: notifications follow the
//! flags (`VRING_USED_F_NO_NOTIFY`, `VRING_AVAIL_F_NO_INTERRUPT`, §2.7.7, §2.7.10).

use std::ptr::addr_of_mut;
use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring::{
    VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};

/// Descriptors per request: header, data, status.
pub(super) const CHAIN: usize = 3;
/// Bytes of shared memory per request slot for its header (16 bytes) and status byte.
pub(super) const HDR_STRIDE: usize = 32;

/// `struct virtq_desc` (§2.7.5).
#[repr(C)]
pub(super) struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

/// Where one ring's three areas lie, as offsets from its start; each starts on its own page so
/// that logging the used ring (one page per 512 entries) never marks the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SplitLayout {
    pub(super) avail: usize,
    pub(super) used: usize,
    /// Bytes the ring takes, a whole number of pages.
    pub(super) len: usize,
}

impl SplitLayout {
    pub(super) fn new(size: usize) -> SplitLayout {
        let page = |n: usize| n.div_ceil(4096) * 4096;
        let desc = page(16 * size);
        // flags, idx, ring[size], used_event.
        let avail = page(2 * (3 + size));
        // flags, idx, ring[size] of (id u32, len u32), avail_event.
        let used = page(6 + 8 * size);
        SplitLayout { avail: desc, used: desc + avail, len: desc + avail + used }
    }
}

/// The driver side of one split ring.
pub(super) struct SplitRing {
    desc: *mut Desc,
    /// `struct virtq_avail`: flags, idx, ring.
    avail: *mut u16,
    /// `struct virtq_used`: flags, idx, then 8-byte elements from byte 4.
    used: *const u8,
    size: u16,
    /// The next available index to publish.
    avail_idx: u16,
    /// Available entries published since the last notification check.
    pending: bool,
    last_used: u16,
    /// Per-slot header (16 bytes) and status byte, `HDR_STRIDE` apart.
    hdrs: *mut u8,
    /// Start of the memory region: guest-physical address 0.
    base: *mut u8,
}

impl SplitRing {
    /// A ring of `size` entries laid out by `layout` at `ring` (zeroed, `layout.len` bytes), for
    /// `depth` slots whose headers lie at `hdrs`, both inside the region that starts at `base`.
    ///
    /// # Safety
    /// `ring` and `hdrs` point at memory of the stated sizes inside the region at `base`, which
    /// stays mapped for the ring's lifetime; `3 * depth <= size`.
    pub(super) unsafe fn new(
        ring: *mut u8,
        layout: SplitLayout,
        size: u16,
        depth: usize,
        hdrs: *mut u8,
        base: *mut u8,
    ) -> SplitRing {
        debug_assert!(CHAIN * depth <= usize::from(size));
        let r = SplitRing {
            desc: ring.cast(),
            // SAFETY: the areas lie inside the ring's `layout.len` bytes (caller).
            avail: unsafe { ring.add(layout.avail) }.cast(),
            // SAFETY: as above.
            used: unsafe { ring.add(layout.used) },
            size,
            avail_idx: 0,
            pending: false,
            last_used: 0,
            hdrs,
            base,
        };
        for slot in 0..depth {
            let first = slot * CHAIN;
            let hdr = r.slot_hdr(slot as u16);
            // SAFETY: descriptors `first..first + 3` lie in the table (3 * depth <= size).
            unsafe {
                r.write_desc(first, r.gpa_of(hdr), 16, VRING_DESC_F_NEXT as u16, first as u16 + 1);
                r.write_desc(first + 1, 0, 0, VRING_DESC_F_NEXT as u16, first as u16 + 2);
                r.write_desc(first + 2, r.gpa_of(hdr) + 16, 1, VRING_DESC_F_WRITE as u16, 0);
            }
        }
        r
    }

    /// The guest-physical address of `p`, a pointer into the region.
    #[inline]
    fn gpa_of(&self, p: *const u8) -> u64 {
        p as u64 - self.base as u64
    }

    #[inline]
    fn slot_hdr(&self, slot: u16) -> *mut u8 {
        self.hdrs.wrapping_add(usize::from(slot) * HDR_STRIDE)
    }

    /// # Safety
    /// `i < size`.
    #[inline]
    unsafe fn write_desc(&self, i: usize, addr: u64, len: u32, flags: u16, next: u16) {
        // SAFETY: `i` is inside the descriptor table (caller).
        unsafe {
            let d = self.desc.add(i);
            addr_of_mut!((*d).addr).write_volatile(addr.to_le());
            addr_of_mut!((*d).len).write_volatile(len.to_le());
            addr_of_mut!((*d).flags).write_volatile(flags.to_le());
            addr_of_mut!((*d).next).write_volatile(next.to_le());
        }
    }

    /// Makes request `slot` available: a read or write of `len` bytes at `buf`, at `sector`.
    #[inline]
    pub(super) fn push(&mut self, slot: u16, write: bool, sector: u64, buf: *mut u8, len: usize) {
        let hdr = self.slot_hdr(slot);
        // SAFETY: 16 bytes of header and one status byte inside the slot's entry.
        unsafe {
            hdr.cast::<u32>().write_volatile(u32::from(write).to_le());
            hdr.add(4).cast::<u32>().write_volatile(0);
            hdr.add(8).cast::<u64>().write_unaligned(sector.to_le());
            hdr.add(16).write_volatile(0xff);
        }
        let first = usize::from(slot) * CHAIN;
        let flags = if write { VRING_DESC_F_NEXT } else { VRING_DESC_F_NEXT | VRING_DESC_F_WRITE } as u16;
        // SAFETY: the slot's data descriptor lies in the table (see `new`).
        unsafe { self.write_desc(first + 1, self.gpa_of(buf), len as u32, flags, first as u16 + 2) };
        let pos = usize::from(self.avail_idx % self.size);
        // SAFETY: ring entry `pos < size` after the flags and idx words.
        unsafe { self.avail.add(2 + pos).write_volatile((first as u16).to_le()) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // The entry and its descriptors before the index that publishes them (§2.7.13).
        fence(Ordering::Release);
        // SAFETY: the idx word of the available ring.
        unsafe { self.avail.add(1).write_volatile(self.avail_idx.to_le()) };
        self.pending = true;
    }

    /// Whether the device wants a notification for what was published since the last call.
    #[inline]
    pub(super) fn notify_needed(&mut self) -> bool {
        if !std::mem::take(&mut self.pending) {
            return false;
        }
        // The index store before the flags load (§2.7.13.4).
        fence(Ordering::SeqCst);
        // SAFETY: the flags word of the used ring.
        let flags = u16::from_le(unsafe { self.used.cast::<u16>().read_volatile() });
        flags & VRING_USED_F_NO_NOTIFY as u16 == 0
    }

    /// The next completed request: its slot and virtio-blk status.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<(u16, u8)> {
        // SAFETY: the idx word of the used ring.
        let idx = u16::from_le(unsafe { self.used.add(2).cast::<u16>().read_volatile() });
        if idx == self.last_used {
            return None;
        }
        fence(Ordering::Acquire);
        let pos = usize::from(self.last_used % self.size);
        // SAFETY: element `pos < size`, 8 bytes each from byte 4.
        let id = u32::from_le(unsafe { self.used.add(4 + 8 * pos).cast::<u32>().read_volatile() });
        self.last_used = self.last_used.wrapping_add(1);
        let slot = (id as usize / CHAIN) as u16;
        // SAFETY: the device returned a head we submitted: a slot below the queue depth.
        let status = unsafe { self.slot_hdr(slot).add(16).read_volatile() };
        Some((slot, status))
    }

    /// Asks the device for completion notifications (`on`) or for none (a polling driver).
    pub(super) fn set_used_notifications(&mut self, on: bool) {
        let flags = if on { 0 } else { VRING_AVAIL_F_NO_INTERRUPT as u16 };
        // SAFETY: the flags word of the available ring.
        unsafe { addr_of_mut!(*self.avail).write_volatile(flags.to_le()) };
        fence(Ordering::SeqCst);
    }

    /// Guest-physical addresses of the three areas, for `SET_VRING_ADDR`'s log address.
    pub(super) fn used_gpa(&self) -> u64 {
        self.gpa_of(self.used)
    }

    /// The descriptor table's status-free view for tests: (addr, len, flags, next) of `i`.
    #[cfg(test)]
    fn desc_at(&self, i: usize) -> (u64, u32, u16, u16) {
        // SAFETY: tests pass `i < size`.
        unsafe {
            let d = self.desc.add(i);
            (
                std::ptr::addr_of!((*d).addr).read_volatile(),
                std::ptr::addr_of!((*d).len).read_volatile(),
                std::ptr::addr_of!((*d).flags).read_volatile(),
                std::ptr::addr_of!((*d).next).read_volatile(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring of 16 entries for 4 slots in a plain buffer: headers at 64 KiB, data at 128 KiB.
    struct Fixture {
        mem: Vec<u64>,
        layout: SplitLayout,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture { mem: vec![0u64; 192 * 1024 / 8], layout: SplitLayout::new(16) }
        }
        fn base(&mut self) -> *mut u8 {
            self.mem.as_mut_ptr().cast()
        }
        fn ring(&mut self) -> SplitRing {
            let base = self.base();
            let layout = self.layout;
            // SAFETY: the ring (3 pages) and the headers (4 x 32 bytes at 64 KiB) lie inside
            // the 192 KiB buffer, which outlives the ring in each test.
            unsafe { SplitRing::new(base, layout, 16, 4, base.add(64 * 1024), base) }
        }
        fn used_complete(&mut self, pos: usize, head: u32, new_idx: u16, status_slot: usize) {
            let base = self.base();
            let used = self.layout.used;
            // SAFETY: inside the buffer (see `ring`).
            unsafe {
                base.add(used + 4 + 8 * pos).cast::<u32>().write(head);
                base.add(64 * 1024 + status_slot * HDR_STRIDE + 16).write(0);
                base.add(used + 2).cast::<u16>().write(new_idx);
            }
        }
    }

    #[test]
    fn the_layout_puts_each_area_on_its_own_page() {
        let l = SplitLayout::new(256);
        assert_eq!(l, SplitLayout { avail: 4096, used: 8192, len: 12288 });
        let l = SplitLayout::new(1024);
        assert_eq!(l, SplitLayout { avail: 16384, used: 20480, len: 20480 + 12288 });
    }

    #[test]
    fn a_request_is_published_as_its_chain_and_completes_by_its_head() {
        let mut f = Fixture::new();
        let mut r = f.ring();
        let base = f.base();
        // SAFETY: 128 KiB into the 192 KiB buffer.
        let data = unsafe { base.add(128 * 1024) };
        r.push(2, false, 7, data, 4096);
        // Slot 2's chain: descriptors 6 (header), 7 (data, device-writable), 8 (status).
        assert_eq!(r.desc_at(6), (64 * 1024 + 64, 16, VRING_DESC_F_NEXT as u16, 7));
        assert_eq!(r.desc_at(7), (128 * 1024, 4096, (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16, 8));
        assert_eq!(r.desc_at(8), (64 * 1024 + 64 + 16, 1, VRING_DESC_F_WRITE as u16, 0));
        // SAFETY: the available ring's idx and entry 0; the slot's header.
        unsafe {
            assert_eq!(base.add(f.layout.avail + 2).cast::<u16>().read(), 1);
            assert_eq!(base.add(f.layout.avail + 4).cast::<u16>().read(), 6);
            assert_eq!(base.add(64 * 1024 + 64).cast::<u32>().read(), 0);
            assert_eq!(base.add(64 * 1024 + 64 + 8).cast::<u64>().read(), 7);
        }
        assert!(r.notify_needed());
        assert!(!r.notify_needed(), "nothing new since the last check");
        assert_eq!(r.pop(), None);
        f.used_complete(0, 6, 1, 2);
        assert_eq!(r.pop(), Some((2, 0)));
        assert_eq!(r.pop(), None);
    }

    #[test]
    fn a_write_leaves_the_data_read_only_for_the_device_and_no_notify_is_honoured() {
        let mut f = Fixture::new();
        let mut r = f.ring();
        let base = f.base();
        // SAFETY: the used ring's flags word.
        unsafe { base.add(f.layout.used).cast::<u16>().write(VRING_USED_F_NO_NOTIFY as u16) };
        // SAFETY: 128 KiB into the buffer.
        r.push(0, true, 0, unsafe { base.add(128 * 1024) }, 512);
        assert_eq!(r.desc_at(1).2, VRING_DESC_F_NEXT as u16);
        assert!(!r.notify_needed());
        r.set_used_notifications(false);
        // SAFETY: the available ring's flags word.
        let flags = unsafe { base.add(f.layout.avail).cast::<u16>().read() };
        assert_eq!(flags, VRING_AVAIL_F_NO_INTERRUPT as u16);
        assert_eq!(r.used_gpa(), f.layout.used as u64);
    }
}
