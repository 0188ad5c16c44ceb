//! The driver side of a split virtqueue (virtio 1.2 §2.7): the descriptor table (§2.7.5), the
//! available ring the driver writes (§2.7.6) and the used ring it reads (§2.7.8), without
//! `VIRTIO_F_RING_EVENT_IDX`: notifications follow the flags (`VRING_USED_F_NO_NOTIFY`,
//! `VRING_AVAIL_F_NO_INTERRUPT`, §2.7.7, §2.7.10).

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring::{VRING_AVAIL_F_NO_INTERRUPT, VRING_USED_F_NO_NOTIFY};

use super::DriverMem;

/// Where one ring's three areas lie, as offsets from its start; each starts on its own page so
/// that logging the used ring (one page per 512 entries) never marks the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitLayout {
    /// Offset of the available ring (`struct virtq_avail`).
    pub avail: usize,
    /// Offset of the used ring (`struct virtq_used`).
    pub used: usize,
    /// Bytes the ring takes, a whole number of pages.
    pub len: usize,
}

impl SplitLayout {
    /// The layout of a ring of `size` entries.
    pub fn new(size: usize) -> SplitLayout {
        let page = |n: usize| n.div_ceil(4096) * 4096;
        let desc = page(16 * size);
        // flags, idx, ring[size], used_event.
        let avail = page(2 * (3 + size));
        // flags, idx, ring[size] of (id u32, len u32), avail_event.
        let used = page(6 + 8 * size);
        SplitLayout { avail: desc, used: desc + avail, len: desc + avail + used }
    }
}

/// The driver side of one split ring in a [`DriverMem`] window of `layout.len` bytes.
#[derive(Debug)]
pub struct SplitDriver {
    ring: DriverMem,
    layout: SplitLayout,
    size: u16,
    /// The next available index to publish.
    avail_idx: u16,
    /// Entries added since the last publish.
    unpublished: bool,
    /// Entries published since the last notification check.
    pending: bool,
    last_used: u16,
}

impl SplitDriver {
    /// The driver side of a ring of `size` entries laid out as [`SplitLayout::new`] lays it
    /// out, at the start of `ring`, which is zeroed (as a fresh ring is).
    ///
    /// # Panics
    /// If `size` is not a power of two up to 32768 (§2.7) or `ring` is too short.
    pub fn new(ring: DriverMem, size: u16) -> SplitDriver {
        assert!(size.is_power_of_two() && size <= 32768, "split ring size {size}");
        let layout = SplitLayout::new(usize::from(size));
        assert!(ring.len() >= layout.len, "a {}-byte window for a ring of {} bytes", ring.len(), layout.len);
        SplitDriver { ring, layout, size, avail_idx: 0, unpublished: false, pending: false, last_used: 0 }
    }

    /// Entries in the ring.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Where the areas lie.
    pub fn layout(&self) -> SplitLayout {
        self.layout
    }

    /// The window the ring lies in.
    pub fn memory(&self) -> &DriverMem {
        &self.ring
    }

    #[inline]
    fn desc_at(&self, i: u16) -> usize {
        assert!(i < self.size, "descriptor {i} of a ring of {}", self.size);
        16 * usize::from(i)
    }

    /// Writes descriptor `i` (`struct virtq_desc`, §2.7.5).
    #[inline]
    pub fn write_desc(&mut self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = self.desc_at(i);
        self.ring.write_u64(at, addr);
        self.ring.write_u32(at + 8, len);
        self.ring.write_u16(at + 12, flags);
        self.ring.write_u16(at + 14, next);
    }

    /// Descriptor `i`: address, length, flags, next.
    pub fn desc(&self, i: u16) -> (u64, u32, u16, u16) {
        let at = self.desc_at(i);
        (
            self.ring.read_u64(at),
            self.ring.read_u32(at + 8),
            self.ring.read_u16(at + 12),
            self.ring.read_u16(at + 14),
        )
    }

    /// Adds the chain at `head` to the available ring, unseen by the device until [`publish`].
    ///
    /// [`publish`]: SplitDriver::publish
    #[inline]
    pub fn push_avail(&mut self, head: u16) {
        let pos = usize::from(self.avail_idx % self.size);
        self.ring.write_u16(self.layout.avail + 4 + 2 * pos, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.unpublished = true;
    }

    /// Publishes the entries added since the last call: the entries and their descriptors
    /// before the index (§2.7.13).
    #[inline]
    pub fn publish(&mut self) {
        if !std::mem::take(&mut self.unpublished) {
            return;
        }
        fence(Ordering::Release);
        self.ring.write_u16(self.layout.avail + 2, self.avail_idx);
        self.pending = true;
    }

    /// Whether the device wants a notification for what was published since the last call.
    #[inline]
    pub fn notify_needed(&mut self) -> bool {
        if !std::mem::take(&mut self.pending) {
            return false;
        }
        // The index store before the flags load (§2.7.13.4).
        fence(Ordering::SeqCst);
        self.ring.read_u16(self.layout.used) & VRING_USED_F_NO_NOTIFY as u16 == 0
    }

    /// The next used element: the chain's head (`id`) and the bytes the device wrote (§2.7.8).
    #[inline]
    pub fn pop_used(&mut self) -> Option<(u32, u32)> {
        let idx = self.ring.read_u16(self.layout.used + 2);
        if idx == self.last_used {
            return None;
        }
        // The index before the element it publishes.
        fence(Ordering::Acquire);
        let at = self.layout.used + 4 + 8 * usize::from(self.last_used % self.size);
        self.last_used = self.last_used.wrapping_add(1);
        Some((self.ring.read_u32(at), self.ring.read_u32(at + 4)))
    }

    /// Asks the device for used-buffer notifications (`on`) or for none (a polling driver).
    pub fn set_used_notifications(&mut self, on: bool) {
        let flags = if on { 0 } else { VRING_AVAIL_F_NO_INTERRUPT as u16 };
        self.ring.write_u16(self.layout.avail, flags);
        fence(Ordering::SeqCst);
    }
}
