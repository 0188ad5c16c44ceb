//! [`GuestLoad`]: what the disk's channels have in flight, for a background copy on the same
//! device that yields to them (`copy_share`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::shared::DiskShared;
use super::stats::ChannelSlot;
use super::Disk;

/// The requests the disk's channels have in flight (and held by QoS), as each channel last
/// showed them in its slot (at its last poll). Made once by the copy; [`GuestLoad::in_flight`]
/// takes the disk's lock only when a channel opened or closed since its last call.
pub struct GuestLoad {
    disk: Arc<DiskShared>,
    slots: Vec<Arc<ChannelSlot>>,
    /// The disk's `live_changes` when `slots` was taken (`u64::MAX`: never).
    seen: u64,
}

impl Disk {
    /// A probe of the guest I/O in flight on this disk. Without accounting it always reads 0
    /// (the disk layer counts nothing): a copy then runs at its full window.
    pub fn guest_load(&self) -> GuestLoad {
        GuestLoad { disk: self.0.clone(), slots: Vec::new(), seen: u64::MAX }
    }
}

impl GuestLoad {
    /// Requests in flight on the disk's channels.
    pub fn in_flight(&mut self) -> u64 {
        let changes = self.disk.live_changes.load(Ordering::Acquire);
        if changes != self.seen {
            let book = self.disk.book();
            self.slots.clear();
            self.slots.extend(book.live.iter().cloned());
            self.seen = self.disk.live_changes.load(Ordering::Acquire);
        }
        self.slots.iter().map(|s| s.in_flight()).sum()
    }
}
