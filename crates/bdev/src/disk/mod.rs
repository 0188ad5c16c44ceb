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

pub mod bitmap_file;
mod bitmaps;
mod channel;
mod channel_state;
mod disk_bitmaps;
mod fleece;
mod histogram;
mod io;
mod load;
mod mirror;
mod qos;
mod shared;
mod stats;

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::ticks;

pub use histogram::{base64_decode, base64_encode, bucket_end, bucket_of, Histogram, Percentiles};
pub use histogram::{GRANULARITY as HISTOGRAM_GRANULARITY, MAX_RANGE as HISTOGRAM_MAX_RANGE};
pub use stats::{op_index, IoStats, OpStats, QosStats, Successes, ERRNO_SLOTS, OPS};

pub use bitmaps::{check_granularity, BitmapError, BitmapInfo, BitmapUse, DirtyBitmap, FrozenBitmap};
pub use bitmaps::{DEFAULT_BITMAP_GRANULARITY, MAX_BITMAP_GRANULARITY, MAX_EXTENTS, MIN_BITMAP_GRANULARITY};
use channel_state::{ChannelFleece, BATCH_START, EMPTY, SLAB_START};
pub use channel_state::{Completion, DiskChannel};
pub use fleece::FleeceAttachError;
pub use io::DiskIo;
pub use load::{GuestLoad, UNSEEN_REQUEST_BYTES};
pub use qos::DiskQosError;

use qos::{ChannelQosState, DiskQosState};
use shared::{Book, DiskShared, ALL_EPOCH};
pub use shared::{Disk, DiskEvent, EventCallback};
use stats::ChannelSlot;

use crate::qos::{QosGroup, QosLimits};
use crate::{Bdev, BdevError, BdevInfo, BlockDevice, BlockExtent, IoChannel};

/// The clock a request's arrival is read from for [`DiskIo::submit_arrived`]: read once for a
/// batch of requests, it stamps them all.
#[inline(always)]
pub fn arrival_clock() -> u64 {
    ticks::now()
}

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
            live_changes: AtomicU64::new(0),
            bitmap_epoch: AtomicU64::new(0),
            book: Mutex::new(Book {
                live: Vec::new(),
                retired: IoStats::default(),
                retired_hist: Histogram { buckets: Vec::new() },
                next_id: 0,
                subscribers: Vec::new(),
                next_subscriber: 0,
                mirror: None,
                fleece: None,
                bitmaps: Vec::new(),
                bitmap_set: None,
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
        self.0.book()
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
        let cpu = fp_sys::current_cpu();
        let (slot, mirror_epoch, bitmap_epoch, bitmaps, fleece) = {
            let mut book = self.book();
            let slot = Arc::new(ChannelSlot::new(book.next_id, cpu, self.0.epochs.load(Ordering::Relaxed)));
            // A new channel has nothing in flight and looks for a mirror before it reaps
            // anything: it counts as having applied the epoch now. With a job attached it
            // picks the job up at its first poll.
            let epoch = self.0.mirror_epoch.load(Ordering::SeqCst);
            slot.mirror_ack.store(epoch, Ordering::Release);
            book.next_id += 1;
            book.live.push(slot.clone());
            self.0.live_changes.fetch_add(1, Ordering::Release);
            let bitmap_epoch = self.0.bitmap_epoch.load(Ordering::SeqCst);
            // A mirror is picked up at the first poll; a fleece now (below), before the first
            // write: a channel opened after the point in time must copy before it writes.
            let mirror_epoch = if book.mirror.is_some() { epoch.wrapping_sub(1) } else { epoch };
            (slot, mirror_epoch, bitmap_epoch, book.bitmap_set.clone(), book.fleece.clone())
        };
        let fleece = fleece.and_then(|f| ChannelFleece::open(f, 0));
        // Limits set before the channel opened apply to its first request.
        let mut qos = ChannelQosState::new();
        qos.refresh(&self.0.qos);
        Ok(DiskIo::Counted(DiskChannel {
            inner,
            seen_epochs: slot.seen_epochs.load(Ordering::Relaxed),
            cleared: [Successes::default(); OPS.len()],
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
            hooked: fleece.is_some(),
            fleece,
            bitmap_epoch,
            bitmaps,
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

impl dyn BlockDevice {
    /// The [`Disk`] this device is, if it is one: a frontend then opens its channels by type
    /// ([`Disk::open_typed`]) and saves a dynamic call per request. Called when a channel
    /// opens, never per request.
    pub fn as_disk(&self) -> Option<&Disk> {
        self.as_any()?.downcast_ref()
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

    fn as_any(&self) -> Option<&dyn Any> {
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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fleece_tests;
