//! A disk's shared state: what its handle ([`Disk`]), its channels and its mirror half all
//! read, below each of them (each file that acts on it imports this one, never another).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};

use super::bitmaps::DirtyBitmap;
use super::histogram::Histogram;
use super::qos::DiskQosState;
use super::stats::{ChannelSlot, IoStats};
use crate::fleece::FleeceShared;
use crate::mirror::MirrorShared;
use crate::Bdev;

/// Something that happened to a disk, delivered to its subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskEvent {
    /// The device now has `num_blocks` blocks.
    Resized {
        /// The new size, in blocks.
        num_blocks: u64,
    },
    /// The device is being deleted: stop using it.
    Removed,
}

/// A subscriber's callback. Runs on the thread that calls [`Disk::notify`] (control plane).
pub type EventCallback = Box<dyn Fn(&DiskEvent) + Send + Sync>;

/// A subscription as the disk keeps it: shared, so `notify` can call it outside the lock.
pub(super) type SharedCallback = Arc<dyn Fn(&DiskEvent) + Send + Sync>;

/// The reset epochs, packed in one word so a channel checks both with one load: "all" resets in
/// the high half, "maxmin" resets in the low half.
pub(super) const ALL_EPOCH: u64 = 1 << 32;

/// Control-plane state: which slots are live, and what closed channels left.
pub(super) struct Book {
    pub(super) live: Vec<Arc<ChannelSlot>>,
    pub(super) retired: IoStats,
    pub(super) retired_hist: Histogram,
    pub(super) next_id: u64,
    pub(super) subscribers: Vec<(u64, SharedCallback)>,
    pub(super) next_subscriber: u64,
    /// The mirror job attached to this disk (`disk/mirror.rs`).
    pub(super) mirror: Option<Arc<MirrorShared>>,
    /// The fleece whose copy-before-write this disk's channels do (`disk/fleece.rs`).
    pub(super) fleece: Option<Arc<FleeceShared>>,
    /// The disk's dirty bitmaps (`disk/bitmaps.rs`), and the set channels mark (none: empty).
    pub(super) bitmaps: Vec<Arc<DirtyBitmap>>,
    pub(super) bitmap_set: Option<BitmapSet>,
}

/// The bitmaps a channel marks, shared by all of them.
pub(super) type BitmapSet = Arc<[Arc<DirtyBitmap>]>;

pub(super) struct DiskShared {
    pub(super) bdev: Bdev,
    pub(super) accounting: bool,
    pub(super) histogram_on: AtomicBool,
    /// Bumped under `book`'s lock by each reset; read by channels once per poll.
    pub(super) epochs: AtomicU64,
    pub(super) qos: DiskQosState,
    /// Bumped under `book`'s lock when a mirror job attaches, switches its channels to
    /// blocking writes or detaches, and when a fleece attaches or detaches; read by channels
    /// once per poll.
    pub(super) mirror_epoch: AtomicU64,
    /// Bumped under `book`'s lock whenever a channel opens or closes (a [`super::GuestLoad`]
    /// takes the live slots again then).
    pub(super) live_changes: AtomicU64,
    /// Bumped under `book`'s lock when a bitmap is added or removed; read by channels once per
    /// poll.
    pub(super) bitmap_epoch: AtomicU64,
    pub(super) book: Mutex<Book>,
}

/// A bdev with statistics and events. Cheap to clone; every clone is the same disk.
#[derive(Clone)]
pub struct Disk(pub(super) Arc<DiskShared>);

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("name", &self.0.bdev.info().name).finish_non_exhaustive()
    }
}

impl DiskShared {
    pub(super) fn book(&self) -> MutexGuard<'_, Book> {
        // The book holds plain numbers: a panic elsewhere leaves nothing half-updated to fear.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }
}
