//! Device-side helpers for the split virtqueue's used ring and notification suppression.
//!
//! `virtio-queue` publishes `used.idx` on every `add_used`; the data path wants one publish per
//! batch (one release store and one cache-line transfer to the driver for many completions), so
//! this module writes used elements itself (virtio 1.2 §2.7.8) and decides on notifications with
//! the EVENT_IDX rule (§2.7.10) or, without it, the avail ring's NO_INTERRUPT flag (§2.7.7).
//!
//! Ring addresses are resolved to host pointers once, when the queue starts, and are valid for
//! as long as the guest-memory snapshot the poller holds.

use std::num::Wrapping;
use std::sync::atomic::{fence, AtomicU16, Ordering};

use fp_virtio_blk::GuestMemory;

use crate::inflight::InflightQueue;
use vm_memory::{GuestAddress, GuestMemoryBackend};

/// VRING_AVAIL_F_NO_INTERRUPT (§2.7.7).
const AVAIL_F_NO_INTERRUPT: u16 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    #[error("{what} ring at {addr:#x} (+{len} bytes) is not inside one guest memory region")]
    OutsideMemory { what: &'static str, addr: u64, len: u64 },
    #[error("{what} ring at {addr:#x} is not aligned to {align}")]
    Misaligned { what: &'static str, addr: u64, align: u64 },
}

/// Host pointers to the parts of the rings the device writes or polls besides descriptors.
pub struct UsedRing {
    /// `struct virtq_used` (flags, idx, ring[size], avail_event).
    used: *mut u8,
    /// `struct virtq_avail` (flags, idx, ring[size], used_event).
    avail: *const u8,
    size: u16,
    event_idx: bool,
    next_used: Wrapping<u16>,
    /// `next_used` when the driver was last notified (or the ring started).
    signalled: Wrapping<u16>,
    /// Elements written but not yet published.
    unpublished: u16,
    /// Crash-safe in-flight record, when the front-end provided one.
    tracker: Option<InflightQueue>,
}

fn host_range(
    mem: &GuestMemory,
    what: &'static str,
    addr: GuestAddress,
    len: u64,
    align: u64,
) -> Result<*mut u8, RingError> {
    if !addr.0.is_multiple_of(align) {
        return Err(RingError::Misaligned { what, addr: addr.0, align });
    }
    let outside = RingError::OutsideMemory { what, addr: addr.0, len };
    let region = mem.find_region(addr).ok_or(outside)?;
    let end = addr.0.checked_add(len - 1).ok_or(RingError::OutsideMemory { what, addr: addr.0, len })?;
    if end > vm_memory::GuestMemoryRegion::last_addr(region).0 {
        return Err(RingError::OutsideMemory { what, addr: addr.0, len });
    }
    mem.get_host_address(addr).map_err(|_| RingError::OutsideMemory { what, addr: addr.0, len })
}

impl UsedRing {
    /// Resolves the rings. `next_used` is where the device continues (the vring base).
    pub fn new(
        mem: &GuestMemory,
        avail: GuestAddress,
        used: GuestAddress,
        size: u16,
        event_idx: bool,
        next_used: u16,
    ) -> Result<UsedRing, RingError> {
        let n = u64::from(size);
        // §2.7: avail ring is 2-aligned, used ring 4-aligned; both carry a trailing u16 event
        // field that exists whether or not EVENT_IDX was negotiated.
        let avail_ptr = host_range(mem, "available", avail, 6 + 2 * n, 2)?;
        let used_ptr = host_range(mem, "used", used, 6 + 8 * n, 4)?;
        Ok(UsedRing {
            used: used_ptr,
            avail: avail_ptr,
            size,
            event_idx,
            next_used: Wrapping(next_used),
            signalled: Wrapping(next_used),
            unpublished: 0,
            tracker: None,
        })
    }

    pub fn next_used(&self) -> u16 {
        self.next_used.0
    }

    /// Records completions in `tracker` from now on (see [`crate::inflight`]).
    pub fn track(&mut self, tracker: InflightQueue) {
        self.tracker = Some(tracker);
    }

    /// Notes that `head` was taken from the available ring (before its request starts).
    pub fn taken(&mut self, head: u16) {
        if let Some(t) = &mut self.tracker {
            t.taken(head);
        }
    }

    /// Writes one used element (not yet visible to the driver).
    pub fn push(&mut self, head: u16, len: u32) {
        if let Some(t) = &mut self.tracker {
            t.completing(head);
        }
        let slot = u64::from(self.next_used.0 % self.size);
        // SAFETY: `used` points to a mapped, 4-aligned used ring of `size` elements (checked in
        // `new`), and the mapping lives as long as the memory snapshot our owner holds. The
        // guest may write the same memory concurrently; volatile writes make no assumption about
        // its contents.
        unsafe {
            let elem = self.used.add(4 + 8 * slot as usize) as *mut u32;
            std::ptr::write_volatile(elem, u32::from(head).to_le());
            std::ptr::write_volatile(elem.add(1), len.to_le());
        }
        self.next_used += Wrapping(1);
        self.unpublished += 1;
    }

    /// Makes every pushed element visible to the driver with one store of `used.idx`.
    /// Returns how many elements were published.
    pub fn publish(&mut self) -> u16 {
        let n = self.unpublished;
        if n > 0 {
            // SAFETY: `used + 2` is the 2-aligned `idx` field of the mapped used ring (see
            // `push`); AtomicU16 has the same layout as u16.
            let idx = unsafe { AtomicU16::from_ptr(self.used.add(2) as *mut u16) };
            // Release: the elements written above are visible before the new index.
            idx.store(self.next_used.0.to_le(), Ordering::Release);
            self.unpublished = 0;
            if let Some(t) = &mut self.tracker {
                t.published(self.next_used.0);
            }
        }
        n
    }

    /// Whether the driver wants a notification for what was published since the last one.
    pub fn needs_notification(&mut self) -> bool {
        let new = self.next_used;
        let old = self.signalled;
        if new == old {
            return false;
        }
        // Order our used.idx store before reading the driver's suppression fields (§2.7.10).
        fence(Ordering::SeqCst);
        let notify = if self.event_idx {
            // SAFETY: the used_event field follows ring[size] in the mapped avail ring (checked
            // in `new`); it is 2-aligned.
            let used_event = unsafe {
                AtomicU16::from_ptr(self.avail.add(4 + 2 * usize::from(self.size)) as *mut u16)
                    .load(Ordering::Relaxed)
            };
            let used_event = Wrapping(u16::from_le(used_event));
            // vring_need_event: notify if used_event lies in (old, new].
            new - used_event - Wrapping(1) < new - old
        } else {
            // SAFETY: `avail` points to the mapped, 2-aligned avail ring's flags field.
            let flags = unsafe { AtomicU16::from_ptr(self.avail as *mut u16).load(Ordering::Relaxed) };
            u16::from_le(flags) & AVAIL_F_NO_INTERRUPT == 0
        };
        if notify {
            self.signalled = new;
        }
        notify
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Address, Bytes, GuestAddress};

    fn mem() -> GuestMemory {
        GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    #[test]
    fn publishes_once_per_batch_and_follows_used_event() {
        let m = mem();
        let (avail, used) = (GuestAddress(0x1000), GuestAddress(0x2000));
        let mut ring = UsedRing::new(&m, avail, used, 8, true, 0).unwrap();
        ring.push(3, 512);
        ring.push(5, 1);
        assert_eq!(m.read_obj::<u16>(used.unchecked_add(2)).unwrap(), 0, "not yet published");
        assert_eq!(ring.publish(), 2);
        assert_eq!(m.read_obj::<u16>(used.unchecked_add(2)).unwrap(), 2);
        assert_eq!(m.read_obj::<u32>(used.unchecked_add(4)).unwrap(), 3);
        assert_eq!(m.read_obj::<u32>(used.unchecked_add(8)).unwrap(), 512);
        assert_eq!(m.read_obj::<u32>(used.unchecked_add(12)).unwrap(), 5);
        // used_event = 0: the driver wants to hear once used idx passes 0.
        m.write_obj::<u16>(0, avail.unchecked_add(4 + 16)).unwrap();
        assert!(ring.needs_notification());
        assert!(!ring.needs_notification(), "nothing new since");
        // Driver asks to be told after entry 5 only.
        m.write_obj::<u16>(5, avail.unchecked_add(4 + 16)).unwrap();
        for h in 0..3 {
            ring.push(h, 1);
        }
        ring.publish();
        assert!(!ring.needs_notification(), "used idx 5 < used_event + 1");
        ring.push(0, 1);
        ring.publish();
        assert!(ring.needs_notification(), "used idx 6 passes used_event 5");
    }

    #[test]
    fn without_event_idx_the_no_interrupt_flag_rules() {
        let m = mem();
        let (avail, used) = (GuestAddress(0x1000), GuestAddress(0x2000));
        let mut ring = UsedRing::new(&m, avail, used, 4, false, 65535).unwrap();
        ring.push(1, 1);
        ring.publish();
        assert_eq!(m.read_obj::<u16>(used.unchecked_add(2)).unwrap(), 0, "index wraps");
        m.write_obj::<u16>(1, avail).unwrap();
        assert!(!ring.needs_notification());
        m.write_obj::<u16>(0, avail).unwrap();
        ring.push(2, 1);
        ring.publish();
        assert!(ring.needs_notification());
    }

    #[test]
    fn rings_outside_memory_or_misaligned_are_refused() {
        let m = mem();
        assert!(matches!(
            UsedRing::new(&m, GuestAddress(0x1000), GuestAddress(0xfff0), 8, true, 0),
            Err(RingError::OutsideMemory { what: "used", .. })
        ));
        assert!(matches!(
            UsedRing::new(&m, GuestAddress(0x1001), GuestAddress(0x2000), 8, true, 0),
            Err(RingError::Misaligned { what: "available", .. })
        ));
    }
}
