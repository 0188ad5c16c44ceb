//! What a raid's channels (one per reactor) and its owner thread share.
//!
//! The owner alone changes the layout: it builds a new [`Layout`] (slot states, the bases'
//! devices), makes it durable in the superblocks when the raid has them, then publishes it and
//! bumps `epoch`. A channel compares `epoch` with its own at every submit (one load), and on a
//! change reloads the layout and opens channels of bases it has none for (cold path).
//!
//! Each channel also acknowledges the epoch it works with in a [`ChannelAck`] the raid lists,
//! and says there how many requests it still has in flight to bases that left their slot;
//! `bdev_raid_remove_base_bdev` reads them ([`RaidShared::drain_state`]) to release a base only
//! once no channel can send it anything more (docs/raid.md, "Removing a base").
//!
//! Channels tell the owner about a failed base through `failures` and [`RaidShared::wake_owner`];
//! the owner takes the base out, persists, publishes. A write that failed on a base completes
//! upward only once the published layout no longer counts that base as in sync (see
//! docs/raid.md, "Failures"), so an acknowledged write is never missing from a base a restart
//! could trust.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam_queue::ArrayQueue;
use fp_bdev::copy_share::GuestBytes;
use fp_bdev::Uuid;
use fp_bdev::{Bdev, BdevInfo};

use crate::format::MAX_SLOTS;
use crate::intent::IntentMap;
use crate::{RaidLevel, SlotState};

/// One slot of the published layout.
#[derive(Clone)]
pub struct SlotView {
    pub state: SlotState,
    /// The base's bdev name (as configured), if a base is in the slot.
    pub name: Option<String>,
    /// The base's device, when the slot has one (any state but `Empty`).
    pub bdev: Option<Bdev>,
    /// The base's identity in the superblock (nil without one).
    pub uuid: Uuid,
}

/// The raid's layout as the channels see it. Immutable once published.
#[derive(Clone)]
pub struct Layout {
    pub slots: Vec<SlotView>,
    /// Where the data starts on every base, in bytes (0 without a superblock).
    pub data_offset: u64,
}

/// A channel's report that `slot`'s base failed a request.
#[derive(Debug, Clone, Copy)]
pub struct Failure {
    pub slot: usize,
    /// The positive errno the base returned.
    pub errno: i32,
}

/// Progress of the background process (rebuild or resync), for `bdev_raid_get_bdevs`
/// (`process`) and metrics. Written by the owner, read by anyone.
#[derive(Default)]
pub struct ProcessStats {
    /// The slot being rebuilt, plus one; 0 when no process runs.
    pub target_slot: AtomicU64,
    /// 1 partial (bitmap), 2 full, 3 resync after an unclean stop; 0 none.
    pub kind: AtomicU64,
    /// Blocks of the data region the process has walked past.
    pub blocks_done: AtomicU64,
    /// Blocks it has to walk in all (the data region's size).
    pub blocks_total: AtomicU64,
}

/// Counters since the raid was assembled (metrics, `driver_specific.raid`).
#[derive(Default)]
pub struct RaidCounters {
    /// Bytes the rebuild or resync copied to a base.
    pub rebuild_bytes_copied: AtomicU64,
    /// Of those, the bytes copied on a reactor (the rest on the owner's thread).
    pub rebuild_bytes_on_reactor: AtomicU64,
    /// Of those, the bytes of the orders the reactor's runner started with no limit: the guest
    /// idle (`fp_bdev::copy_share::QUIET_ROUNDS` rounds without its I/O) or a weight of 100.
    /// Against the rest, started on the share's credit, it tells what a rebuild beside a guest
    /// took in the guest's pauses.
    pub rebuild_bytes_unshared: AtomicU64,
    /// Bytes of guest writes acknowledged while the raid was degraded (a slot not Active).
    pub degraded_bytes_written: AtomicU64,
    /// Rebuilds completed.
    pub rebuilds_completed: AtomicU64,
    /// Bases taken out after an error.
    pub base_failures: AtomicU64,
    /// Bitmap pages written, and bitmap pages found corrupt at assembly (treated as all dirty).
    pub bitmap_writes: AtomicU64,
    pub bitmap_pages_corrupt: AtomicU64,
    /// Superblock writes.
    pub superblock_writes: AtomicU64,
}

/// Set in [`ChannelAck`]'s word while the channel has nothing in flight and is not inside a
/// call: it looks at the epoch again before it next touches a base, so it cannot use a layout
/// older than one published before it left the mark (its submit clears the mark, SeqCst, and
/// only then loads the epoch, SeqCst; a reader that loads the mark after a publish thus sees
/// it cleared whenever that submit could still see the old epoch).
const IDLE: u64 = 1 << 63;

/// One channel's acknowledgement, written by that channel only (its reactor), read by
/// removals. Allocated when the channel opens; the channel's hot path stores to it only when
/// it goes idle or leaves idle, and in its cold paths (a new layout, retired base channels).
pub struct ChannelAck {
    /// The epoch of the layout the channel works with, or'ed with [`IDLE`].
    word: AtomicU64,
    /// Requests in flight, by slot, on the channel's channels of bases that left the slot.
    retired: [AtomicU32; MAX_SLOTS],
    /// The guest's requests the channel had in flight at the end of its last poll, and those
    /// it has completed (read by the rebuild, which yields to them).
    in_flight: AtomicU32,
    completed: AtomicU64,
    /// The bytes of the requests it has taken.
    bytes: AtomicU64,
}

impl ChannelAck {
    fn new() -> ChannelAck {
        // Idle until its first submit: it has nothing in flight, and that submit loads the
        // epoch after clearing the mark.
        ChannelAck {
            word: AtomicU64::new(IDLE),
            retired: std::array::from_fn(|_| AtomicU32::new(0)),
            in_flight: AtomicU32::new(0),
            completed: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// The channel works with the layout of `epoch`; `idle`: it has nothing in flight.
    #[inline]
    pub fn store(&self, epoch: u64, idle: bool) {
        if idle {
            // Going idle needs no fence: the channel's next submit clears the mark (SeqCst)
            // before it looks at anything.
            self.word.store(epoch | IDLE, Ordering::Release);
        } else {
            self.word.store(epoch, Ordering::SeqCst);
        }
    }

    /// The guest's requests the channel has in flight (stored by its poll when it changed).
    #[inline]
    pub fn set_in_flight(&self, n: usize) {
        self.in_flight.store(u32::try_from(n).unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    /// The channel handed `n` more completions up (its poll; only it writes the count).
    #[inline]
    pub fn count_completed(&self, n: usize) {
        let c = self.completed.load(Ordering::Relaxed);
        self.completed.store(c + n as u64, Ordering::Relaxed);
    }

    /// The bytes of the requests the channel has taken (its poll; only it writes them).
    #[inline]
    pub fn set_bytes(&self, bytes: u64) {
        self.bytes.store(bytes, Ordering::Relaxed);
    }

    /// Requests the channel has in flight to the base that left `slot` (cold path).
    pub fn set_retired(&self, slot: usize, n: u32) {
        if let Some(c) = self.retired.get(slot) {
            c.store(n, Ordering::Release);
        }
    }

    /// Whether the channel can send nothing more under a layout older than `epoch`.
    fn acknowledged(&self, epoch: u64) -> bool {
        let w = self.word.load(Ordering::SeqCst);
        w & IDLE != 0 || w >= epoch
    }
}

/// The guest's requests on a raid's channels, for the rebuild that yields to them: made once,
/// it takes the channels' lock only when a channel opened or closed since its last call.
pub struct GuestRequests {
    /// The channels, with the bytes each had taken at the last call.
    acks: Vec<(Arc<ChannelAck>, u64)>,
    seen: u64,
}

impl GuestRequests {
    /// The guest's bytes now: those taken since the last call, and those of its requests in
    /// flight on the channels at their last poll's end (each at the mean length of what its
    /// channel took); a fast base completes a guest's requests within the round that submits
    /// them (see `fp_bdev::disk::GuestLoad`).
    pub fn bytes(&mut self, shared: &RaidShared) -> GuestBytes {
        if shared.channels_changed.load(Ordering::Acquire) != self.seen {
            let list = shared.channels.lock().unwrap_or_else(|p| p.into_inner());
            let known = std::mem::take(&mut self.acks);
            self.acks = list
                .iter()
                .map(|a| {
                    let last = known.iter().find(|(k, _)| Arc::ptr_eq(k, a)).map_or(0, |(_, l)| *l);
                    (a.clone(), last)
                })
                .collect();
            self.seen = shared.channels_changed.load(Ordering::Acquire);
        }
        let mut in_flight = 0;
        let mut since = 0;
        for (ack, last) in self.acks.iter_mut() {
            let (n, bytes) = (ack.completed.load(Ordering::Relaxed), ack.bytes.load(Ordering::Relaxed));
            let mean = bytes.checked_div(n).unwrap_or(fp_bdev::disk::UNSEEN_REQUEST_BYTES);
            in_flight += u64::from(ack.in_flight.load(Ordering::Relaxed)) * mean;
            since += bytes - *last;
            *last = bytes;
        }
        GuestBytes { completed: since, in_flight }
    }
}

/// What keeps a removed base from being released: see [`RaidShared::drain_state`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainState {
    /// Channels that have not taken up the layout without the base yet (they are busy and
    /// have not polled since it was published).
    pub unacknowledged: usize,
    /// Requests to the base that acknowledging channels still have in flight.
    pub in_flight: u64,
}

impl DrainState {
    /// Nothing can reach the base any more.
    pub fn drained(&self) -> bool {
        self.unacknowledged == 0 && self.in_flight == 0
    }
}

/// Everything a raid's channels and owner share.
pub struct RaidShared {
    /// The raid bdev's description (name, block size, the data size as capacity).
    pub info: BdevInfo,
    pub level: RaidLevel,
    /// Strip size in bytes (raid0; 0 for the others).
    pub strip_bytes: u64,
    /// Bytes of each base a concat or raid0 uses (the data region, all bases the same for
    /// raid0; per slot for concat). raid1: the data size.
    pub base_data_bytes: Vec<u64>,
    /// The published layout; replaced only by the owner.
    pub layout: ArcSwap<Layout>,
    /// Bumped (SeqCst) after each new layout is stored.
    pub epoch: AtomicU64,
    /// The write-intent map: raid1 only (`None` for raid0 and concat).
    pub intent: Option<IntentMap>,
    /// Channels' failure reports (bounded; a channel that finds it full retries next poll).
    pub failures: ArrayQueue<Failure>,
    /// The owner thread, for [`RaidShared::wake_owner`]; stored once it runs.
    pub owner_waker: arc_swap::ArcSwapOption<Thread>,
    pub process: ProcessStats,
    pub counters: RaidCounters,
    /// Every open channel's acknowledgement (a control-plane lock: taken when a channel opens
    /// or closes and by removals, never by I/O).
    pub channels: Mutex<Vec<Arc<ChannelAck>>>,
    /// Bumped under `channels`' lock when a channel opens or closes ([`GuestRequests`] takes
    /// the list again then).
    pub channels_changed: AtomicU64,
    /// Bases (by name) that `bdev_raid_remove_base_bdev` is taking out: the owner's metadata
    /// I/O to them gives a Busy up instead of retrying it, so a base that stays busy cannot
    /// keep the owner from taking the removal up (a control-plane lock: taken by removals and
    /// when a base answers the owner's own I/O Busy, never by guest I/O).
    pub leaving: Mutex<Vec<String>>,
    /// When the raid began to stop (deleted, the daemon stopping, or its handle dropped):
    /// from [`STOP_BUSY_GRACE`] after it, the owner's metadata I/O gives every base's Busy up,
    /// so a base that stays busy cannot keep the stop from ending (a control-plane lock:
    /// taken by the stop and when a base answers the owner's own I/O Busy).
    pub stopping: Mutex<Option<Instant>>,
}

/// How long a stopping raid's owner still retries a base's Busy (ordinary back-pressure that
/// passes) before it gives the request up.
pub const STOP_BUSY_GRACE: Duration = Duration::from_millis(500);

impl RaidShared {
    /// The layout now (one atomic load; cache it with `epoch` on the hot path).
    #[inline]
    pub fn layout(&self) -> Arc<Layout> {
        self.layout.load_full()
    }

    /// The epoch now.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Publishes `layout` (the owner only) and bumps the epoch.
    pub fn publish(&self, layout: Layout) {
        self.layout.store(Arc::new(layout));
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Lists a new channel's acknowledgement. The channel loads the epoch only after this, so
    /// a removal that does not find it published its layout before the channel looked.
    pub fn register_channel(&self) -> Arc<ChannelAck> {
        let ack = Arc::new(ChannelAck::new());
        let mut list = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        list.push(ack.clone());
        self.channels_changed.fetch_add(1, Ordering::Release);
        ack
    }

    /// A probe of the guest's I/O on the raid's channels ([`GuestRequests::bytes`]).
    pub fn guest_requests(&self) -> GuestRequests {
        let list = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        GuestRequests {
            acks: list.iter().map(|a| (a.clone(), a.bytes.load(Ordering::Relaxed))).collect(),
            seen: self.channels_changed.load(Ordering::Acquire),
        }
    }

    /// A channel closes: its acknowledgement no longer counts.
    pub fn unregister_channel(&self, ack: &Arc<ChannelAck>) {
        let mut list = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|a| !Arc::ptr_eq(a, ack));
        self.channels_changed.fetch_add(1, Ordering::Release);
    }

    /// How far the channels are from being done with the base that left `slot` in the layout
    /// of `epoch` (published, the base no longer in it): each channel must have acknowledged
    /// `epoch` (or be idle), and have nothing left in flight to that base.
    pub fn drain_state(&self, slot: usize, epoch: u64) -> DrainState {
        let list = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = DrainState::default();
        for ack in list.iter() {
            if ack.acknowledged(epoch) {
                st.in_flight += ack.retired.get(slot).map_or(0, |c| u64::from(c.load(Ordering::Acquire)));
            } else {
                st.unacknowledged += 1;
            }
        }
        st
    }

    /// Marks the base `name` as leaving (or no longer: the removal was answered).
    pub fn set_leaving(&self, name: &str, leaving: bool) {
        let mut list = self.leaving.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|n| n != name);
        if leaving {
            list.push(name.to_string());
        }
    }

    /// Whether a removal is taking the base `name` out (see [`RaidShared::leaving`]).
    pub fn is_leaving(&self, name: &str) -> bool {
        self.leaving.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|n| n == name)
    }

    /// The raid begins to stop (see [`RaidShared::stopping`]); a later call keeps the first
    /// time.
    pub fn set_stopping(&self) {
        self.stopping.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
    }

    /// Whether the owner's metadata I/O to the base `name` gives a Busy up: the base is
    /// leaving, or the raid has been stopping for [`STOP_BUSY_GRACE`].
    pub fn gives_up_busy(&self, name: &str) -> bool {
        let stopping = *self.stopping.lock().unwrap_or_else(|p| p.into_inner());
        stopping.is_some_and(|t| t.elapsed() >= STOP_BUSY_GRACE) || self.is_leaving(name)
    }

    /// Wakes the owner (a failure reported, a bitmap bit to persist). Cheap and lock free:
    /// `Thread::unpark`.
    #[inline]
    pub fn wake_owner(&self) {
        if let Some(t) = self.owner_waker.load().as_ref() {
            t.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fp_bdev::conformance::{poll_until, rw, IoBuf};
    use fp_bdev::Uuid;
    use fp_bdev::{Bdev, ErrorDevice, ErrorType, Injection, IoOp, IoStatus, RamDevice};

    use super::{DrainState, SlotView};
    use crate::device::{RaidDevice, RaidSpec};
    use crate::{RaidLevel, SlotState};

    fn active(b: Bdev) -> SlotView {
        SlotView {
            state: SlotState::Active,
            name: Some(b.info().name.clone()),
            bdev: Some(b),
            uuid: Uuid::NIL,
        }
    }

    /// What a removal reads, step by step on one thread: an idle channel counts as done with
    /// any layout; a busy one is not until it takes the new layout up (at its next poll), and
    /// then counts its requests to the base that left until they end.
    #[test]
    fn channels_acknowledge_a_layout_and_count_their_requests_to_a_base_that_left() {
        let ram = |name: &str| -> Bdev { Arc::new(RamDevice::new(name, 512, 2048).unwrap()) };
        let holder = Arc::new(ErrorDevice::new("e1", ram("m1")).unwrap());
        let bases: Vec<Bdev> = vec![ram("m0"), holder.clone()];
        let dev = RaidDevice::new(RaidSpec {
            name: "r".into(),
            uuid: crate::device::new_uuid(),
            level: RaidLevel::Raid1,
            strip_bytes: 0,
            superblock: false,
            block_size: 512,
            data_offset: 0,
            slots: bases.into_iter().map(active).collect(),
            base_data_bytes: vec![1 << 20; 2],
            chunk_bytes: 4096,
        })
        .unwrap();
        let shared = dev.shared().clone();
        let idle = fp_bdev::BlockDevice::open_channel(&dev).unwrap();
        let mut ch = fp_bdev::BlockDevice::open_channel(&dev).unwrap();
        assert_eq!(shared.channels.lock().unwrap().len(), 2);
        let pending = Injection {
            error_type: ErrorType::Pending,
            num: 1,
            queue_depth: 0,
            corrupt_offset: 0,
            corrupt_value: 0,
        };
        holder.inject(&[1], pending).unwrap();
        let mut buf = IoBuf::new(4096, true);
        let iov = [buf.iovec()];
        // SAFETY: `buf` and `iov` outlive the request, polled to its end below.
        unsafe { ch.submit(&rw(3, IoOp::Write, 0, &iov)) }.unwrap();
        for _ in 0..10 {
            ch.poll(&mut |t, s| panic!("the write is held on e1, yet completed: {t} {s:?}"));
        }

        // Slot 1's base leaves.
        let mut layout = (*shared.layout()).clone();
        layout.slots[1] = SlotView { state: SlotState::Failed, name: None, bdev: None, uuid: Uuid::NIL };
        shared.publish(layout);
        let epoch = shared.epoch();
        assert_eq!(shared.drain_state(1, epoch), DrainState { unacknowledged: 1, in_flight: 0 });
        ch.poll(&mut |t, s| panic!("the write is held on e1, yet completed: {t} {s:?}"));
        assert_eq!(shared.drain_state(1, epoch), DrainState { unacknowledged: 0, in_flight: 1 });
        assert_eq!(shared.drain_state(0, epoch), DrainState::default(), "nothing left slot 0");

        let mut guest = shared.guest_requests();
        assert_eq!(guest.bytes(&shared).in_flight, 4096, "the held write, shown at the channel's poll");
        holder.resume_pending();
        assert_eq!(poll_until(&mut *ch, 1), [(3, IoStatus::Success)]);
        assert!(!guest.bytes(&shared).active(), "taken before the last look; nothing in flight");
        assert!(shared.drain_state(1, epoch).drained());
        // A later layout finds the channel idle: done with it before its reactor wakes.
        shared.publish((*shared.layout()).clone());
        assert!(shared.drain_state(1, shared.epoch()).drained());
        drop((ch, idle));
        assert!(shared.channels.lock().unwrap().is_empty());
    }
}
