//! Virtio-blk requests of three descriptors each (header, data, status) on the driver side of
//! one split virtqueue ([`SplitDriver`], virtio 1.2 §2.7), for the vhost-user frontend back end
//! (`frontend.rs`).
//!
//! Slot `s` owns descriptors `3s`, `3s + 1` and `3s + 2` for the whole run, chained once at
//! set-up, so a submission writes the header, the data descriptor's address, length and
//! direction, one available-ring entry and the available index. Descriptors hold guest-physical
//! addresses: offsets into the frontend's one memory region (`gpa_of`). Neither
//! `VIRTIO_F_RING_EVENT_IDX` nor indirect descriptors are negotiated: notifications follow the
//! flags (§2.7.7, §2.7.10).

use fp_virtq::driver::{DriverMem, SplitDriver};
use fp_virtq::{DESC_F_NEXT, DESC_F_WRITE};

use super::backend::{BlkRing, ReqHeaders, CHAIN};

/// The driver side of one split ring carrying virtio-blk requests.
pub(super) struct SplitRing {
    ring: SplitDriver,
    hdrs: ReqHeaders,
    /// Process address of the memory region's start: guest-physical address 0.
    base: u64,
}

impl SplitRing {
    /// A ring of `size` entries in `ring` (zeroed), for `depth` slots whose headers lie at the
    /// start of `hdrs`; both windows lie in the region `region`, guest-physical address 0.
    ///
    /// # Panics
    /// If `3 * depth > size` or a window is too short.
    pub(super) fn new(
        ring: DriverMem,
        size: u16,
        depth: usize,
        hdrs: &DriverMem,
        region: &DriverMem,
    ) -> SplitRing {
        assert!(usize::from(CHAIN) * depth <= usize::from(size), "{depth} slots in a ring of {size}");
        let mut r = SplitRing {
            ring: SplitDriver::new(ring, size),
            hdrs: ReqHeaders::new(hdrs, depth),
            base: region.addr_of(0),
        };
        for slot in 0..depth as u16 {
            let first = slot * CHAIN;
            let hdr = r.gpa_of(r.hdrs.addr(slot));
            r.ring.write_desc(first, hdr, 16, DESC_F_NEXT, first + 1);
            r.ring.write_desc(first + 1, 0, 0, DESC_F_NEXT, first + 2);
            r.ring.write_desc(first + 2, hdr + 16, 1, DESC_F_WRITE, 0);
        }
        r
    }

    /// The guest-physical address of process address `addr`, inside the region.
    #[inline]
    fn gpa_of(&self, addr: u64) -> u64 {
        addr - self.base
    }

    /// The used ring's guest-physical address, for `SET_VRING_ADDR`'s log address.
    pub(super) fn used_gpa(&self) -> u64 {
        self.gpa_of(self.ring.memory().addr_of(self.ring.layout().used))
    }
}

impl BlkRing for SplitRing {
    /// Makes request `slot` available: a read or write of `len` bytes at process address
    /// `buf`, at `sector`.
    #[inline]
    fn push(&mut self, slot: u16, write: bool, sector: u64, buf: u64, len: usize) {
        self.hdrs.prepare(slot, write, sector);
        let first = slot * CHAIN;
        let flags = if write { DESC_F_NEXT } else { DESC_F_NEXT | DESC_F_WRITE };
        self.ring.write_desc(first + 1, self.gpa_of(buf), len as u32, flags, first + 2);
        self.ring.push_avail(first);
        self.ring.publish();
    }

    /// Whether the device wants a notification for what was published since the last call.
    #[inline]
    fn notify_needed(&mut self) -> bool {
        self.ring.notify_needed()
    }

    /// The next completed request: its slot and virtio-blk status.
    #[inline]
    fn pop(&mut self) -> Option<(u16, u8)> {
        let (head, _) = self.ring.pop_used()?;
        let slot = (head / u32::from(CHAIN)) as u16;
        Some((slot, self.hdrs.status(slot)))
    }

    /// Asks the device for completion notifications (`on`) or for none (a polling driver).
    fn set_used_notifications(&mut self, on: bool) {
        self.ring.set_used_notifications(on);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fp_virtq::driver::{SharedMem, SplitLayout};
    use virtio_bindings::virtio_ring::{VRING_AVAIL_F_NO_INTERRUPT, VRING_USED_F_NO_NOTIFY};

    use super::super::backend::HDR_STRIDE;
    use super::*;

    /// A ring of 16 entries for 4 slots in a 192 KiB region: ring at 0, headers at 64 KiB,
    /// data at 128 KiB.
    struct Fixture {
        mem: DriverMem,
        layout: SplitLayout,
    }

    impl Fixture {
        fn new() -> Fixture {
            let mem = Arc::new(SharedMem::new(192 * 1024, false).unwrap()).view();
            Fixture { mem, layout: SplitLayout::new(16) }
        }
        fn ring(&self) -> SplitRing {
            SplitRing::new(self.mem.sub(0, self.layout.len), 16, 4, &self.mem.sub(64 * 1024, 4096), &self.mem)
        }
        fn used_complete(&self, pos: usize, head: u32, new_idx: u16, status_slot: usize) {
            let used = self.layout.used;
            self.mem.write_u32(used + 4 + 8 * pos, head);
            self.mem.write_u8(64 * 1024 + status_slot * HDR_STRIDE + 16, 0);
            self.mem.write_u16(used + 2, new_idx);
        }
        fn desc(&self, i: usize) -> (u64, u32, u16, u16) {
            let m = &self.mem;
            (m.read_u64(16 * i), m.read_u32(16 * i + 8), m.read_u16(16 * i + 12), m.read_u16(16 * i + 14))
        }
    }

    #[test]
    fn a_request_is_published_as_its_chain_and_completes_by_its_head() {
        let f = Fixture::new();
        let mut r = f.ring();
        r.push(2, false, 7, f.mem.addr_of(128 * 1024), 4096);
        // Slot 2's chain: descriptors 6 (header), 7 (data, device-writable), 8 (status).
        assert_eq!(f.desc(6), (64 * 1024 + 64, 16, DESC_F_NEXT, 7));
        assert_eq!(f.desc(7), (128 * 1024, 4096, DESC_F_NEXT | DESC_F_WRITE, 8));
        assert_eq!(f.desc(8), (64 * 1024 + 64 + 16, 1, DESC_F_WRITE, 0));
        // The available ring's idx and entry 0; the slot's header.
        assert_eq!(f.mem.read_u16(f.layout.avail + 2), 1);
        assert_eq!(f.mem.read_u16(f.layout.avail + 4), 6);
        assert_eq!(f.mem.read_u32(64 * 1024 + 64), 0);
        assert_eq!(f.mem.read_u64(64 * 1024 + 64 + 8), 7);
        assert!(r.notify_needed());
        assert!(!r.notify_needed(), "nothing new since the last check");
        assert_eq!(r.pop(), None);
        f.used_complete(0, 6, 1, 2);
        assert_eq!(r.pop(), Some((2, 0)));
        assert_eq!(r.pop(), None);
    }

    #[test]
    fn a_write_leaves_the_data_read_only_for_the_device_and_no_notify_is_honoured() {
        let f = Fixture::new();
        let mut r = f.ring();
        f.mem.write_u16(f.layout.used, VRING_USED_F_NO_NOTIFY as u16);
        r.push(0, true, 0, f.mem.addr_of(128 * 1024), 512);
        assert_eq!(f.desc(1).2, DESC_F_NEXT);
        assert!(!r.notify_needed());
        r.set_used_notifications(false);
        assert_eq!(f.mem.read_u16(f.layout.avail), VRING_AVAIL_F_NO_INTERRUPT as u16);
        assert_eq!(r.used_gpa(), f.layout.used as u64);
    }
}
