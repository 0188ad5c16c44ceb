//! The generic bdev layer: a [`Disk`] wraps a [`Bdev`] with what every frontend needs above any
//! backend — per-core I/O statistics, latency histograms and events (resize, remove).
//!
//! Frontends open their channels through the `Disk` ([`Disk`] is itself a [`BlockDevice`]);
//! one that knows it holds a `Disk` opens a [`DiskIo`] by type ([`Disk::open_typed`]).
//! Each [`DiskChannel`] wraps the device's channel, times requests in a slab indexed by the
//! caller's tag, and counts into its own cache-line-aligned slot; readers merge all live slots
//! with what closed channels left behind, so a queue restart loses nothing. The hot path takes
//! no lock, writes no shared cache line and allocates nothing once the slab covers the largest
//! tag. With accounting off (`Disk::new(bdev, false)`) channels are the device's own, untouched.

mod histogram;
mod mirror;
mod qos;
mod stats;

use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::ticks;

pub use histogram::{base64_decode, base64_encode, bucket_end, bucket_of, Histogram, Percentiles};
pub use histogram::{GRANULARITY as HISTOGRAM_GRANULARITY, MAX_RANGE as HISTOGRAM_MAX_RANGE};
pub use stats::{op_index, IoStats, OpStats, QosStats, ERRNO_SLOTS, OPS};

pub use qos::DiskQosError;

use histogram::ChannelHistogram;
use mirror::ChannelMirror;
use qos::{Admission, ChannelQosState, DiskQosState};
use stats::{errno_slot, ChannelSlot};

use crate::qos::{QosGroup, QosLimits};
use crate::{
    Bdev, BdevError, BdevInfo, BlockDevice, BlockExtent, IoChannel, IoRequest, IoStatus, SubmitError,
};

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
type SharedCallback = Arc<dyn Fn(&DiskEvent) + Send + Sync>;

/// What `bdev_reset_iostat` clears (SPDK's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetMode {
    /// Every counter.
    All,
    /// Only the minimum and maximum latencies.
    MaxMin,
}

/// Why a histogram request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HistogramError {
    #[error("histograms are not enabled on this bdev (bdev_enable_histogram)")]
    /// Histograms were never enabled (or were disabled) on this bdev.
    NotEnabled,
    #[error("I/O statistics are switched off in this daemon (serve --no-iostat / [stats] iostat = false)")]
    /// The daemon runs without I/O statistics.
    AccountingOff,
}

/// A channel's counters as `bdev_get_iostat` with `per_channel` reports them.
#[derive(Debug, Clone)]
pub struct ChannelStats {
    /// Channel number in open order (SPDK's `thread_id`).
    pub id: u64,
    /// The CPU the channel was opened on.
    pub core: Option<usize>,
    /// Its counters.
    pub stats: IoStats,
}

/// The reset epochs, packed in one word so a channel checks both with one load: "all" resets in
/// the high half, "maxmin" resets in the low half.
const ALL_EPOCH: u64 = 1 << 32;

/// Control-plane state: which slots are live, and what closed channels left.
struct Book {
    live: Vec<Arc<ChannelSlot>>,
    retired: IoStats,
    retired_hist: Histogram,
    next_id: u64,
    subscribers: Vec<(u64, SharedCallback)>,
    next_subscriber: u64,
    /// The mirror job attached to this disk (`disk/mirror.rs`).
    mirror: Option<Arc<crate::mirror::MirrorShared>>,
}

struct DiskShared {
    bdev: Bdev,
    accounting: bool,
    histogram_on: AtomicBool,
    /// Bumped under `book`'s lock by each reset; read by channels once per poll.
    epochs: AtomicU64,
    qos: DiskQosState,
    /// Bumped under `book`'s lock when a mirror job attaches, switches its channels to
    /// blocking writes or detaches; read by channels once per poll.
    mirror_epoch: AtomicU64,
    book: Mutex<Book>,
}

/// A bdev with statistics and events. Cheap to clone; every clone is the same disk.
#[derive(Clone)]
pub struct Disk(Arc<DiskShared>);

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("name", &self.0.bdev.info().name).finish_non_exhaustive()
    }
}

impl Disk {
    /// Wraps `bdev`. With `accounting` false the layer counts nothing and channels are the
    /// device's own (histograms cannot be enabled).
    pub fn new(bdev: Bdev, accounting: bool) -> Disk {
        // Calibrate the clock here, on the control plane, before any channel reads it.
        ticks::tick_rate();
        Disk(Arc::new(DiskShared {
            bdev,
            accounting,
            histogram_on: AtomicBool::new(false),
            epochs: AtomicU64::new(0),
            qos: DiskQosState::new(),
            mirror_epoch: AtomicU64::new(0),
            book: Mutex::new(Book {
                live: Vec::new(),
                retired: IoStats::default(),
                retired_hist: Histogram { buckets: Vec::new() },
                next_id: 0,
                subscribers: Vec::new(),
                next_subscriber: 0,
                mirror: None,
            }),
        }))
    }

    /// The device underneath.
    pub fn bdev(&self) -> &Bdev {
        &self.0.bdev
    }

    /// Whether the layer counts I/O on this disk (`Disk::new`'s `accounting`).
    pub fn accounting(&self) -> bool {
        self.0.accounting
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // The book holds plain numbers: a panic elsewhere leaves nothing half-updated to fear.
        self.0.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a channel for the calling thread (the reactor that will use it).
    pub fn open(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(match self.open_typed()? {
            DiskIo::Counted(ch) => Box::new(ch),
            DiskIo::Device(ch) => ch,
        })
    }

    /// Opens a channel as [`Disk::open`] does, keeping the layer's channel by type: a frontend
    /// that holds a [`DiskIo`] makes one dynamic call per submit and per poll (the device's)
    /// rather than two, and has its completion callback inlined into the layer's loop.
    pub fn open_typed(&self) -> Result<DiskIo, BdevError> {
        let inner = self.0.bdev.open_channel()?;
        if !self.0.accounting {
            return Ok(DiskIo::Device(inner));
        }
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        let (slot, mirror_epoch) = {
            let mut book = self.book();
            let slot = Arc::new(ChannelSlot::new(
                book.next_id,
                usize::try_from(cpu).ok(),
                self.0.epochs.load(Ordering::Relaxed),
            ));
            // A new channel has nothing in flight and looks for a mirror before it reaps
            // anything: it counts as having applied the epoch now. With a job attached it
            // picks the job up at its first poll.
            let epoch = self.0.mirror_epoch.load(Ordering::SeqCst);
            slot.mirror_ack.store(epoch, Ordering::Release);
            book.next_id += 1;
            book.live.push(slot.clone());
            (slot, if book.mirror.is_some() { epoch.wrapping_sub(1) } else { epoch })
        };
        // Limits set before the channel opened apply to its first request.
        let mut qos = ChannelQosState::new();
        qos.refresh(&self.0.qos);
        Ok(DiskIo::Counted(DiskChannel {
            inner,
            seen_epochs: slot.seen_epochs.load(Ordering::Relaxed),
            slot,
            disk: self.0.clone(),
            slab: vec![EMPTY; SLAB_START],
            sparse: Vec::new(),
            in_flight: 0,
            in_flight_reported: 0,
            qos,
            qos_reported: 0,
            mirror_epoch,
            mirror: None,
            next_gen: 0,
            batch: Vec::with_capacity(BATCH_START),
        }))
    }

    /// The merged counters of every channel, open or closed.
    pub fn stats(&self) -> IoStats {
        let book = self.book();
        let epochs = self.0.epochs.load(Ordering::Relaxed);
        let mut total = book.retired.clone();
        for slot in &book.live {
            merge_slot(&mut total, slot, epochs);
        }
        total
    }

    /// Each open channel's counters.
    pub fn channel_stats(&self) -> Vec<ChannelStats> {
        let book = self.book();
        let epochs = self.0.epochs.load(Ordering::Relaxed);
        book.live
            .iter()
            .map(|slot| {
                let mut stats = IoStats::default();
                merge_slot(&mut stats, slot, epochs);
                ChannelStats { id: slot.id, core: slot.core, stats }
            })
            .collect()
    }

    /// `bdev_reset_iostat`. Channels apply it at their next poll; until then readers leave out
    /// what it cleared.
    pub fn reset(&self, mode: ResetMode) {
        let mut book = self.book();
        let step = match mode {
            ResetMode::All => {
                let queue_depth = book.retired.queue_depth;
                book.retired = IoStats { queue_depth, ..IoStats::default() };
                ALL_EPOCH
            }
            ResetMode::MaxMin => {
                book.retired.reset_maxmin();
                1
            }
        };
        // Under the lock: a channel closing now folds its counters with the epoch it sees here.
        self.0.epochs.fetch_add(step, Ordering::Relaxed);
    }

    /// `bdev_enable_histogram`. Enabling starts from empty buckets (as SPDK, which allocates
    /// them anew); disabling stops recording and forgets them.
    pub fn enable_histogram(&self, enable: bool) -> Result<(), HistogramError> {
        if !self.0.accounting {
            return Err(HistogramError::AccountingOff);
        }
        let mut book = self.book();
        if enable == self.0.histogram_on.load(Ordering::Relaxed) {
            return Ok(());
        }
        if enable {
            // Nobody records while the flag is off, so the channels' buckets can be zeroed here.
            for slot in &book.live {
                if let Some(h) = slot.hist.get() {
                    h.clear();
                }
            }
            book.retired_hist = Histogram::default();
        } else {
            book.retired_hist = Histogram { buckets: Vec::new() };
        }
        self.0.histogram_on.store(enable, Ordering::Relaxed);
        Ok(())
    }

    /// Whether latency histograms are being recorded.
    pub fn histogram_enabled(&self) -> bool {
        self.0.histogram_on.load(Ordering::Relaxed)
    }

    /// The merged latency histogram, in ticks.
    pub fn histogram(&self) -> Result<Histogram, HistogramError> {
        if !self.0.accounting {
            return Err(HistogramError::AccountingOff);
        }
        let book = self.book();
        if !self.0.histogram_on.load(Ordering::Relaxed) {
            return Err(HistogramError::NotEnabled);
        }
        let mut h = book.retired_hist.clone();
        for slot in &book.live {
            if let Some(ch) = slot.hist.get() {
                ch.add_to(&mut h);
            }
        }
        Ok(h)
    }

    /// `bdev_set_qos_limit`: sets all four limits (0: none), any number of times while the
    /// disk is busy. Channels apply them at their next poll; requests already submitted are
    /// untouched.
    pub fn set_qos_limits(&self, limits: QosLimits) -> Result<(), DiskQosError> {
        self.qos_layer()?;
        self.0.qos.set_limits(limits)?;
        Ok(())
    }

    /// The limits in force (`assigned_rate_limits`).
    pub fn qos_limits(&self) -> QosLimits {
        self.0.qos.limits()
    }

    /// Makes the disk a member of `group` with `weight`; a disk is in one group at most.
    pub fn join_qos_group(&self, group: &Arc<QosGroup>, weight: u64) -> Result<(), DiskQosError> {
        self.qos_layer()?;
        self.0.qos.join(group, weight)
    }

    /// Takes the disk out of the group named `group`.
    pub fn leave_qos_group(&self, group: &str) -> Result<(), DiskQosError> {
        self.0.qos.leave(group)
    }

    /// Changes the disk's weight in the group named `group` (from the group's next slice).
    pub fn set_qos_weight(&self, group: &str, weight: u64) -> Result<(), DiskQosError> {
        self.0.qos.set_weight(group, weight)
    }

    /// The disk's group, its weight there and its fair rate in force.
    pub fn qos_group(&self) -> Option<(Arc<QosGroup>, u64, u64)> {
        self.0.qos.group()
    }

    /// Tells channels that the settings of a group of this disk changed (what fair sharing
    /// divides may have).
    pub fn qos_group_changed(&self) {
        self.0.qos.generation.fetch_add(1, Ordering::Release);
    }

    fn qos_layer(&self) -> Result<(), DiskQosError> {
        if self.0.accounting {
            Ok(())
        } else {
            Err(DiskQosError::AccountingOff)
        }
    }

    /// Registers `callback` for this disk's events; returns the id [`Disk::unsubscribe`] takes.
    pub fn subscribe(&self, callback: EventCallback) -> u64 {
        let mut book = self.book();
        let id = book.next_subscriber;
        book.next_subscriber += 1;
        book.subscribers.push((id, Arc::from(callback)));
        id
    }

    /// Removes a subscription; false when `id` was not subscribed.
    pub fn unsubscribe(&self, id: u64) -> bool {
        let mut book = self.book();
        let before = book.subscribers.len();
        book.subscribers.retain(|(i, _)| *i != id);
        book.subscribers.len() != before
    }

    /// Delivers `event` to every subscriber, outside the disk's lock (a callback may subscribe,
    /// unsubscribe or read statistics).
    pub fn notify(&self, event: &DiskEvent) {
        let subscribers: Vec<_> = self.book().subscribers.iter().map(|(_, f)| f.clone()).collect();
        for f in subscribers {
            f(event);
        }
    }
}

/// Adds what `slot` counted to `into`, leaving out what a reset the channel has not applied yet
/// cleared.
fn merge_slot(into: &mut IoStats, slot: &ChannelSlot, epochs: u64) {
    let seen = slot.seen_epochs.load(Ordering::Acquire);
    let mut s = slot.snapshot();
    if seen / ALL_EPOCH != epochs / ALL_EPOCH {
        let qos = QosStats { queued: s.qos.queued, ..QosStats::default() };
        s = IoStats { queue_depth: s.queue_depth, qos, ..IoStats::default() };
    } else if seen != epochs {
        s.reset_maxmin();
    }
    into.merge(&s, true);
}

impl BlockDevice for Disk {
    fn info(&self) -> &BdevInfo {
        self.0.bdev.info()
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        self.open()
    }

    fn as_disk(&self) -> Option<&Disk> {
        Some(self)
    }

    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        self.0.bdev.resize(num_blocks)
    }

    fn read_only(&self) -> bool {
        self.0.bdev.read_only()
    }

    /// The device's own answer: a status query is no I/O, so nothing is counted.
    fn block_status(&self, offset: u64, len: u64, out: &mut Vec<BlockExtent>) -> Result<(), BdevError> {
        self.0.bdev.block_status(offset, len, out)
    }
}

/// Slab entries made when a channel opens (tags below this need no growth).
const SLAB_START: usize = 256;

/// Room for completions in a channel's batch when it opens (a poll that returns more grows it
/// once; the device's own list may hand over a larger one).
const BATCH_START: usize = 256;

/// Tags below this index the dense slab directly (vhost-blk's tags are its slot indices,
/// bounded by the virtqueue size, at most 32768); larger tags, which the trait allows but no
/// frontend uses, are kept in a short list searched by tag, out of line.
const DENSE_TAGS: u32 = 1 << 16;

/// A request in flight through a [`DiskChannel`], indexed by the caller's tag.
#[derive(Clone, Copy)]
struct InFlight {
    start: u64,
    /// Where it goes: a mirror marks the chunks of writes when they complete.
    offset: u64,
    len: u64,
    op: u8,
    /// The mirror attachment it was submitted under (0: none; `disk/mirror.rs`).
    gen: u8,
    /// A mirrored request's progress (`disk/mirror.rs`).
    mflags: u8,
}

const EMPTY: InFlight = InFlight { start: 0, offset: 0, len: 0, op: 0, gen: 0, mflags: 0 };

/// A channel of a [`Disk`]: the device's channel plus accounting. See the module docs.
///
/// Requests keep the caller's tag on their way down: the entry of tag `t` is `slab[t]`, written
/// at each submit, so there is no free list and no tag to translate. A caller's tags must be
/// unique among its requests in flight (as they must be for it to tell completions apart).
/// A refused request leaves nothing in flight: its dense entry is stale until the tag's next
/// submit, and no completion reads it.
pub struct DiskChannel {
    inner: Box<dyn IoChannel>,
    slot: Arc<ChannelSlot>,
    disk: Arc<DiskShared>,
    slab: Vec<InFlight>,
    /// Entries of tags of [`DENSE_TAGS`] and above.
    sparse: Vec<(u32, InFlight)>,
    /// The reset epochs applied to `slot`.
    seen_epochs: u64,
    /// Accepted by the device and not yet completed.
    in_flight: u64,
    /// What `slot` last showed of `in_flight` plus the held requests.
    in_flight_reported: u64,
    qos: ChannelQosState,
    /// What `slot` last showed of the held requests.
    qos_reported: u64,
    /// The disk's mirror epoch this channel applied.
    mirror_epoch: u64,
    /// The mirror job this channel feeds, if any (boxed: cold, and the channel stays small).
    mirror: Option<Box<ChannelMirror>>,
    /// The last attachment number handed out (requests carry it in `InFlight::gen`).
    next_gen: u8,
    /// The device's completions of one poll ([`IoChannel::poll_batch`]), empty between polls.
    batch: Vec<(u32, IoStatus)>,
}

impl DiskChannel {
    /// Applies resets the control plane asked for since the last look.
    #[inline]
    fn apply_resets(&mut self) {
        let epochs = self.disk.epochs.load(Ordering::Relaxed);
        if epochs != self.seen_epochs {
            self.apply_resets_slow(epochs);
        }
    }

    #[cold]
    fn apply_resets_slow(&mut self, epochs: u64) {
        if epochs / ALL_EPOCH != self.seen_epochs / ALL_EPOCH {
            self.slot.clear();
        } else {
            self.slot.clear_maxmin();
        }
        self.seen_epochs = epochs;
        // Release: a reader that sees the new epoch sees the cleared counters.
        self.slot.seen_epochs.store(epochs, Ordering::Release);
    }

    /// Records the entry of a tag beyond the slab: grows the slab up to [`DENSE_TAGS`], or
    /// keeps the entry in `sparse`.
    #[cold]
    fn record_beyond(&mut self, tag: u32, e: InFlight) {
        if tag < DENSE_TAGS {
            let want = (tag as usize + 1).max(self.slab.len() * 2).min(DENSE_TAGS as usize);
            self.slab.resize(want, EMPTY);
            self.slab[tag as usize] = e;
        } else if let Some(s) = self.sparse.iter_mut().find(|s| s.0 == tag) {
            s.1 = e;
        } else {
            self.sparse.push((tag, e));
        }
    }

    /// A request the device refused: nothing of it stays in flight; all but Busy count as
    /// errors. (A dense entry needs no undoing: it is only read for a tag the device returns.)
    #[cold]
    fn refused(&mut self, req: &IoRequest, e: SubmitError) -> SubmitError {
        if req.tag >= DENSE_TAGS {
            self.sparse.retain(|s| s.0 != req.tag);
        }
        let op = op_index(req.op);
        match e {
            SubmitError::Busy => {}
            SubmitError::OutOfRange => self.slot.failure(op, errno_slot(libc::EINVAL)),
            SubmitError::Unsupported => self.slot.failure(op, 0),
        }
        e
    }

    /// Submits `req` to the device, timing it ([`IoChannel::submit`] without the dynamic call,
    /// for a frontend that holds the channel by type).
    ///
    /// # Safety
    /// As for [`IoChannel::submit`].
    #[inline]
    pub unsafe fn submit_request(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        // The entry is filled before the call, so nothing of `req` need survive it. Its start
        // is the arrival: a wait for QoS counts in the request's latency, as the guest sees it.
        let now = ticks::now();
        let e = InFlight {
            start: now,
            offset: req.offset,
            len: req.len,
            op: op_index(req.op) as u8,
            gen: 0,
            mflags: 0,
        };
        match self.slab.get_mut(req.tag as usize) {
            Some(slot) => *slot = e,
            None => self.record_beyond(req.tag, e),
        }
        if self.qos.on {
            if let Admission::Held = self.qos.admit_new(&self.disk.qos, req, now) {
                // The caller's guarantees for `req` hold until its completion, which `poll`
                // returns after submitting it: holding the copy is within them.
                return Ok(());
            }
        }
        let submitted = if self.mirror.is_none() {
            self.inner.submit(req)
        } else {
            // SAFETY: as above.
            unsafe { self.submit_mirrored(req) }
        };
        match submitted {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(SubmitError::Busy) if self.qos.on => {
                // Its limits are paid: it goes first at the next poll rather than back to the
                // caller, who would pay them again.
                self.qos.hold_admitted(req, now);
                Ok(())
            }
            Err(e) => Err(self.refused(req, e)),
        }
    }

    /// Submits the held requests whose limits now allow them; one that the device refuses
    /// for good completes through `done` with its error. Returns how many completed so.
    #[cold]
    #[inline(never)]
    fn release_held(&mut self, done: &mut impl Completion) -> usize {
        let now = ticks::now();
        let Self { inner, qos, disk, slot, in_flight, sparse, slab, mirror, .. } = self;
        let mut failed = 0;
        qos.release(&disk.qos, now, slot, |req| {
            let submitted = match mirror {
                None => inner.submit(req),
                // SAFETY: as above.
                Some(m) => unsafe { mirror::submit_down(&mut **inner, m, slab, sparse, req) },
            };
            match submitted {
                Ok(()) => {
                    *in_flight += 1;
                    true
                }
                Err(SubmitError::Busy) => false,
                Err(e) => {
                    if req.tag >= DENSE_TAGS {
                        sparse.retain(|s| s.0 != req.tag);
                    }
                    let op = op_index(req.op);
                    let status = match e {
                        SubmitError::OutOfRange | SubmitError::Busy => {
                            slot.failure(op, errno_slot(libc::EINVAL));
                            IoStatus::Error(libc::EINVAL)
                        }
                        SubmitError::Unsupported => {
                            slot.failure(op, 0);
                            IoStatus::Unsupported
                        }
                    };
                    done.complete(req.tag, status);
                    failed += 1;
                    true
                }
            }
        });
        failed
    }

    /// Polls the device, counting each completion before `done` sees it
    /// ([`IoChannel::poll`] with `done` inlined, for a frontend that holds the channel by type).
    #[inline]
    pub fn poll_with(&mut self, done: &mut impl Completion) -> usize {
        self.apply_resets();
        // A mirror job attached, switched or detached: cold, once per change.
        if self.disk.mirror_epoch.load(Ordering::Relaxed) != self.mirror_epoch {
            self.refresh_mirror();
        }
        self.qos.refresh(&self.disk.qos);
        let failed = if self.qos.held() > 0 { self.release_held(done) } else { 0 };
        // Whether to record latencies in a histogram is decided once per poll, not per request.
        let histogram_on = self.disk.histogram_on.load(Ordering::Relaxed);
        if self.mirror.is_some() {
            let (reaped, upward) = self.reap_mirrored(done, histogram_on);
            self.in_flight = self.in_flight.saturating_sub(reaped as u64);
            self.report_in_flight();
            return upward + failed;
        }
        let Self { inner, slot, slab, sparse, batch, .. } = &mut *self;
        let slot: &ChannelSlot = slot;
        inner.poll_batch(batch);
        let n = if histogram_on {
            // Allocated once per channel, the first time histograms are on.
            let h = slot.hist.get_or_init(ChannelHistogram::new);
            reap(batch, slab, sparse, slot, done, |ticks| h.record(ticks))
        } else {
            reap(batch, slab, sparse, slot, done, |_| {})
        };
        batch.clear();
        self.in_flight = self.in_flight.saturating_sub(n as u64);
        self.report_in_flight();
        n + failed
    }

    /// Shows the requests in flight and held in the channel's slot, when they changed.
    #[inline]
    fn report_in_flight(&mut self) {
        let held = self.qos.held() as u64;
        if self.in_flight + held != self.in_flight_reported {
            self.in_flight_reported = self.in_flight + held;
            self.slot.set_in_flight(self.in_flight_reported);
        }
        if held != self.qos_reported {
            self.qos_reported = held;
            self.slot.set_qos_queued(held);
        }
    }
}

/// The completion loop of [`DiskChannel::poll_with`] over one poll's batch: counts each
/// completion in `slot`, passes its latency to `record`, then hands it to `done` with the
/// caller's tag. One loop with everything inlined, no call per completion.
#[inline(always)]
fn reap(
    batch: &[(u32, IoStatus)],
    slab: &[InFlight],
    sparse: &mut Vec<(u32, InFlight)>,
    slot: &ChannelSlot,
    done: &mut impl Completion,
    record: impl Fn(u64),
) -> usize {
    // One clock read per poll round, at its first success: the requests reaped in one round
    // had all completed by then (those that completed earlier waited for this poll, which is
    // when the frontend learns of them).
    let mut now = 0;
    for &(tag, status) in batch {
        let e = match slab.get(tag as usize) {
            Some(e) => *e,
            None => match take_sparse(sparse, tag) {
                Some(e) => e,
                // Not a tag of ours: the device broke its contract; pass it on unchanged.
                None => {
                    done.complete(tag, status);
                    continue;
                }
            },
        };
        account(slot, &e, status, &mut now, &record);
        done.complete(tag, status);
    }
    batch.len()
}

/// Counts one completion in `slot`, passing its latency to `record`. `now` is read once per
/// poll round, at its first success (see [`reap`]).
#[inline(always)]
fn account(slot: &ChannelSlot, e: &InFlight, status: IoStatus, now: &mut u64, record: &impl Fn(u64)) {
    let op = usize::from(e.op);
    match status {
        IoStatus::Success => {
            if *now == 0 {
                *now = ticks::now();
            }
            let ticks = now.saturating_sub(e.start);
            slot.success(op, e.len, ticks);
            record(ticks);
        }
        IoStatus::Error(errno) => slot.failure(op, errno_slot(errno)),
        IoStatus::Unsupported => slot.failure(op, 0),
    }
}

/// What a frontend holding a [`DiskIo`] does with each completion. Any
/// `FnMut(tag, status)` is one; a frontend may implement it on its own type with
/// `#[inline(always)]` so that its handling is compiled into the layer's completion loop (a
/// closure there is inlined only when the compiler's cost model agrees).
pub trait Completion {
    /// Called once per completed request with its tag and status.
    fn complete(&mut self, tag: u32, status: IoStatus);
}

impl<F: FnMut(u32, IoStatus)> Completion for F {
    #[inline(always)]
    fn complete(&mut self, tag: u32, status: IoStatus) {
        self(tag, status)
    }
}

/// A channel from [`Disk::open_typed`]: the layer's own when the disk counts, the device's
/// otherwise. Its methods are [`IoChannel`]'s, dispatched by a match rather than a vtable.
// Unboxed on purpose: a channel is made once and lives in its poller, and a box would cost an
// indirection per request.
#[allow(clippy::large_enum_variant)]
pub enum DiskIo {
    /// The layer's own channel: counted, timed, QoS applied.
    Counted(DiskChannel),
    /// The device's channel, untouched (accounting off).
    Device(Box<dyn IoChannel>),
}

impl DiskIo {
    /// As [`IoChannel::submit`].
    #[inline]
    pub fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        match self {
            // SAFETY: the caller's guarantees, passed on.
            DiskIo::Counted(ch) => unsafe { ch.submit_request(req) },
            DiskIo::Device(ch) => ch.submit(req),
        }
    }

    #[inline]
    /// Reaps completions, handing each to `done`; returns how many.
    pub fn poll(&mut self, done: &mut impl Completion) -> usize {
        match self {
            DiskIo::Counted(ch) => ch.poll_with(done),
            DiskIo::Device(ch) => ch.poll(&mut |tag, status| done.complete(tag, status)),
        }
    }

    /// Requests submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.channel().in_flight()
    }

    /// See [`IoChannel::parked`].
    pub fn parked(&self) -> usize {
        self.channel().parked()
    }

    /// See [`IoChannel::abort_parked`].
    pub fn abort_parked(&mut self) -> usize {
        self.channel_mut().abort_parked()
    }

    /// See [`IoChannel::completion_fd`].
    pub fn completion_fd(&self) -> Option<RawFd> {
        self.channel().completion_fd()
    }

    /// See [`IoChannel::disarm_completion_fd`].
    pub fn disarm_completion_fd(&mut self) {
        self.channel_mut().disarm_completion_fd()
    }

    /// See [`IoChannel::arm_completion_fd`].
    pub fn arm_completion_fd(&mut self) -> bool {
        self.channel_mut().arm_completion_fd()
    }

    /// See [`IoChannel::sleeps_in_flight`].
    pub fn sleeps_in_flight(&self) -> bool {
        self.channel().sleeps_in_flight()
    }

    fn channel(&self) -> &dyn IoChannel {
        match self {
            DiskIo::Counted(ch) => ch,
            DiskIo::Device(ch) => &**ch,
        }
    }

    fn channel_mut(&mut self) -> &mut dyn IoChannel {
        match self {
            DiskIo::Counted(ch) => ch,
            DiskIo::Device(ch) => &mut **ch,
        }
    }
}

/// Removes and returns the entry of a tag beyond the dense slab.
#[cold]
fn take_sparse(sparse: &mut Vec<(u32, InFlight)>, tag: u32) -> Option<InFlight> {
    let i = sparse.iter().position(|s| s.0 == tag)?;
    Some(sparse.swap_remove(i).1)
}

impl IoChannel for DiskChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        // SAFETY: the caller's guarantees, passed on.
        unsafe { self.submit_request(req) }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.poll_with(&mut |tag, status| done(tag, status))
    }

    fn in_flight(&self) -> usize {
        // A mirrored write whose target half is out is still in flight for the caller.
        let mirrored = self.mirror.as_ref().map_or(0, |m| m.waiting());
        self.inner.in_flight() + self.qos.held() + mirrored
    }

    /// What the device channel parked (requests QoS holds are not refused, only paced).
    fn parked(&self) -> usize {
        self.inner.parked()
    }

    fn abort_parked(&mut self) -> usize {
        self.inner.abort_parked()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        self.inner.completion_fd()
    }

    fn disarm_completion_fd(&mut self) {
        self.inner.disarm_completion_fd()
    }

    fn arm_completion_fd(&mut self) -> bool {
        self.inner.arm_completion_fd()
    }

    /// Requests held by QoS are released only by `poll`, so not while any is held.
    fn sleeps_in_flight(&self) -> bool {
        // The mirror's target may not signal the completion fd: keep polling while attached.
        self.qos.held() == 0 && self.mirror.is_none() && self.inner.sleeps_in_flight()
    }
}

impl Drop for DiskChannel {
    /// Folds this channel's counters into the disk's retired totals, so closing a queue loses
    /// nothing.
    fn drop(&mut self) {
        if let Some(m) = self.mirror.take() {
            m.release();
        }
        let disk = Disk(self.disk.clone());
        let mut book = disk.book();
        // Under the lock no reset can slip between applying and folding.
        self.apply_resets();
        let mut s = self.slot.snapshot();
        s.queue_depth = 0;
        s.qos.queued = 0;
        book.retired.merge(&s, true);
        if self.disk.histogram_on.load(Ordering::Relaxed) {
            if let Some(h) = self.slot.hist.get() {
                h.add_to(&mut book.retired_hist);
            }
        }
        book.live.retain(|s| !Arc::ptr_eq(s, &self.slot));
    }
}

#[cfg(test)]
mod tests;
