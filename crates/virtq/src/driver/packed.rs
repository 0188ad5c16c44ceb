//! The driver side of a packed virtqueue (virtio 1.2 §2.8): the descriptor ring (§2.8.13,
//! `struct pvirtq_desc`), whose AVAIL/USED flags carry the wrap counters (§2.8.1), and the two
//! event suppression areas (§2.8.10, §2.8.14, `struct pvirtq_event_suppress`).
//!
//! The driver uses buffer ids in order of its own choosing and every chain it makes available
//! has the same number of descriptors, so a used descriptor tells it how far to skip (§2.8.9:
//! the device writes one used descriptor per chain, at the position of the chain's first).

use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring as vr;

use super::DriverMem;
use crate::{PackedState, DESC_F_AVAIL, DESC_F_USED};

/// `RING_EVENT_FLAGS_ENABLE` (§2.8.10).
const EV_ENABLE: u16 = vr::VRING_PACKED_EVENT_FLAG_ENABLE as u16;
/// `RING_EVENT_FLAGS_DISABLE`.
const EV_DISABLE: u16 = vr::VRING_PACKED_EVENT_FLAG_DISABLE as u16;
/// `RING_EVENT_FLAGS_DESC`: notify at the descriptor in `off_wrap` (`VIRTIO_F_RING_EVENT_IDX`).
const EV_DESC: u16 = vr::VRING_PACKED_EVENT_FLAG_DESC as u16;
/// Offsets inside `struct pvirtq_desc` and `struct pvirtq_event_suppress`.
const DESC_LEN: usize = 8;
const DESC_ID: usize = 12;
const DESC_FLAGS: usize = 14;
const EVENT_FLAGS: usize = 2;

/// The driver side of one packed ring.
#[derive(Debug)]
pub struct PackedDriver {
    ring: DriverMem,
    driver: DriverMem,
    device: DriverMem,
    size: u16,
    /// Descriptors per chain.
    chain: u16,
    next_avail: u16,
    avail_wrap: bool,
    /// Descriptors made available since the last notification check.
    pending: u16,
    next_used: u16,
    used_wrap: bool,
    event_idx: bool,
}

impl PackedDriver {
    /// The driver side of a ring of `size` descriptors at the start of `ring`, with its driver
    /// and device event areas (4 bytes each), carrying chains of `chain` descriptors, that
    /// starts where the device is told it starts (`state`, as `SET_VRING_BASE` says it): empty,
    /// every descriptor marked used in the lap before (AVAIL = USED = the opposite of the wrap
    /// counter), so that the device sees none available.
    ///
    /// # Panics
    /// If `size` is 0 or over 32768, `chain` is 0 or longer than the ring, `state`'s positions
    /// differ, or a window is too short. A chain may straddle the ring's end.
    pub fn new(
        ring: DriverMem,
        driver: DriverMem,
        device: DriverMem,
        size: u16,
        chain: u16,
        event_idx: bool,
        state: PackedState,
    ) -> PackedDriver {
        assert!(size > 0 && size <= 32768, "packed ring size {size}");
        assert!(chain > 0 && chain <= size, "chains of {chain} in a ring of {size}");
        assert!(
            state.next_avail == state.next_used && state.avail_wrap == state.used_wrap,
            "an empty ring: {state:?}"
        );
        assert!(
            ring.len() >= 16 * usize::from(size) && driver.len() >= 4 && device.len() >= 4,
            "ring windows too short"
        );
        let stale = if state.avail_wrap { 0 } else { DESC_F_AVAIL | DESC_F_USED };
        for i in 0..usize::from(size) {
            ring.write_u16(16 * i + DESC_FLAGS, stale);
        }
        PackedDriver {
            ring,
            driver,
            device,
            size,
            chain,
            next_avail: state.next_avail,
            avail_wrap: state.avail_wrap,
            pending: 0,
            next_used: state.next_used,
            used_wrap: state.used_wrap,
            event_idx,
        }
    }

    /// Descriptors in the ring.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The AVAIL/USED flags that make a descriptor available in the current lap.
    #[inline]
    fn avail_flags(&self) -> u16 {
        if self.avail_wrap {
            DESC_F_AVAIL
        } else {
            DESC_F_USED
        }
    }

    #[inline]
    fn advance_avail(&mut self) -> usize {
        let i = self.next_avail;
        self.next_avail += 1;
        if self.next_avail == self.size {
            self.next_avail = 0;
            self.avail_wrap = !self.avail_wrap;
        }
        16 * usize::from(i)
    }

    /// Makes one chain available under buffer id `id`: `bufs` are its descriptors' address,
    /// length and flags (`VRING_DESC_F_NEXT`/`WRITE`; the AVAIL/USED pair is set here). The
    /// first descriptor's flags are written last, after a release fence, which makes the whole
    /// chain visible at once (§2.8.21.1). The caller keeps at most `size / chain` chains in
    /// flight, so the positions are free.
    ///
    /// # Panics
    /// If `bufs` is not one chain long.
    #[inline]
    pub fn push(&mut self, id: u16, bufs: &[(u64, u32, u16)]) {
        assert_eq!(bufs.len(), usize::from(self.chain), "a chain of {} descriptors", self.chain);
        let first_flags = self.avail_flags() | bufs[0].2;
        let first = self.advance_avail();
        self.write_desc(first, bufs[0].0, bufs[0].1, id);
        for &(addr, len, flags) in &bufs[1..] {
            let f = self.avail_flags() | flags;
            let at = self.advance_avail();
            self.write_desc(at, addr, len, id);
            self.ring.write_u16(at + DESC_FLAGS, f);
        }
        fence(Ordering::Release);
        self.ring.write_u16(first + DESC_FLAGS, first_flags);
        self.pending += self.chain;
    }

    #[inline]
    fn write_desc(&self, at: usize, addr: u64, len: u32, id: u16) {
        self.ring.write_u64(at, addr);
        self.ring.write_u32(at + DESC_LEN, len);
        self.ring.write_u16(at + DESC_ID, id);
    }

    /// Whether the device wants a notification for what was made available since the last
    /// call (§2.8.10; with `VIRTIO_F_RING_EVENT_IDX`, whether its event descriptor was passed).
    #[inline]
    pub fn notify_needed(&mut self) -> bool {
        // The flags stores before the event area's load (§2.8.21.3.1).
        fence(Ordering::SeqCst);
        let flags = self.device.read_u16(EVENT_FLAGS);
        let off_wrap = self.device.read_u16(0);
        let pending = std::mem::take(&mut self.pending);
        if flags == EV_DISABLE {
            return false;
        }
        if !self.event_idx || flags != EV_DESC {
            return true;
        }
        let new = Wrapping(self.next_avail);
        let old = new - Wrapping(pending);
        let mut event = Wrapping(off_wrap & 0x7fff);
        if (off_wrap >> 15 == 1) != self.avail_wrap {
            event -= Wrapping(self.size);
        }
        new - event - Wrapping(1) < new - old
    }

    /// The next used chain: its buffer id and the bytes the device wrote (§2.8.9).
    #[inline]
    pub fn pop_used(&mut self) -> Option<(u16, u32)> {
        let at = 16 * usize::from(self.next_used);
        let flags = self.ring.read_u16(at + DESC_FLAGS);
        let (avail, used) = (flags & DESC_F_AVAIL != 0, flags & DESC_F_USED != 0);
        if avail != used || used != self.used_wrap {
            return None;
        }
        // The flags before the descriptor they hand back.
        fence(Ordering::Acquire);
        let id = self.ring.read_u16(at + DESC_ID);
        let len = self.ring.read_u32(at + DESC_LEN);
        self.next_used += self.chain;
        if self.next_used >= self.size {
            self.next_used -= self.size;
            self.used_wrap = !self.used_wrap;
        }
        Some((id, len))
    }

    /// Asks the device for used-buffer notifications (`on`) or for none (a polling driver),
    /// in the driver event area.
    pub fn set_used_notifications(&mut self, on: bool) {
        self.driver.write_u16(EVENT_FLAGS, if on { EV_ENABLE } else { EV_DISABLE });
        fence(Ordering::SeqCst);
    }
}
