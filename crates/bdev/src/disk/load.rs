//! [`GuestLoad`]: the guest's I/O on the disk's channels, for a background copy on the same
//! device that yields to it (`copy_share`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::shared::DiskShared;
use super::stats::ChannelSlot;
use super::Disk;
use crate::copy_share::GuestBytes;

/// The guest's I/O on the disk's channels, as each channel last showed it (at its last
/// poll): [`GuestLoad::bytes`]. Made once by the copy; it takes the disk's lock only when a
/// channel opened or closed since its last call.
pub struct GuestLoad {
    disk: Arc<DiskShared>,
    /// The live channels' slots, with what each had completed (requests, bytes) at the last
    /// call.
    slots: Vec<(Arc<ChannelSlot>, (u64, u64))>,
    /// The disk's `live_changes` when `slots` was taken.
    seen: u64,
}

/// The bytes a request in flight is taken for before its channel completed any.
pub const UNSEEN_REQUEST_BYTES: u64 = 4096;

impl Disk {
    /// A probe of the guest I/O on this disk. Without accounting it always reads 0 (the disk
    /// layer counts nothing): a copy then runs at its full window.
    pub fn guest_load(&self) -> GuestLoad {
        let book = self.book();
        let slots = book.live.iter().map(|s| (s.clone(), s.completed())).collect();
        GuestLoad { disk: self.0.clone(), slots, seen: self.0.live_changes.load(Ordering::Acquire) }
    }
}

impl GuestLoad {
    /// The guest's bytes now: those completed since the last call, and those of its requests
    /// in flight on the disk's channels (each at the mean length of what its channel
    /// completed). A fast device completes a guest's requests within the round that submits
    /// them, so a busy guest may show nothing in flight at a poll's end; what it completed
    /// between two calls (a round apart, for a copier polled by a reactor) shows it.
    pub fn bytes(&mut self) -> GuestBytes {
        self.refresh();
        let mut in_flight = 0;
        let mut since = 0;
        for (slot, last) in self.slots.iter_mut() {
            let (n, b) = slot.completed();
            let mean = b.checked_div(n).unwrap_or(UNSEEN_REQUEST_BYTES);
            in_flight += slot.in_flight() * mean;
            // A reset (bdev_reset_iostat) may lower the count: then the new count is all there is.
            since += b.checked_sub(last.1).unwrap_or(b);
            *last = (n, b);
        }
        GuestBytes { completed: since, in_flight }
    }

    /// Takes the live channels again when one opened or closed since the last look; a channel
    /// new to the probe counts all it completed (it opened since).
    fn refresh(&mut self) {
        if self.disk.live_changes.load(Ordering::Acquire) == self.seen {
            return;
        }
        let book = self.disk.book();
        let known = std::mem::take(&mut self.slots);
        self.slots = book
            .live
            .iter()
            .map(|s| {
                let last = known.iter().find(|(k, _)| Arc::ptr_eq(k, s)).map_or((0, 0), |(_, l)| *l);
                (s.clone(), last)
            })
            .collect();
        self.seen = self.disk.live_changes.load(Ordering::Acquire);
    }
}
