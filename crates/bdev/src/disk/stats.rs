//! Per-channel counters and the snapshots readers merge them into.
//!
//! Each channel owns one [`ChannelSlot`], aligned to its own cache lines. Only that channel
//! writes it, with a relaxed load and a relaxed store (no locked instruction); readers on the
//! control plane load the same atomics, so a snapshot may be a few requests behind but never
//! torn within one counter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::histogram::ChannelHistogram;
use crate::IoOp;

/// The operation kinds counted, in the order of [`IoStats::ops`]: `IoOp`'s own, so
/// [`op_index`] compiles to nothing.
pub const OPS: [IoOp; 5] = [IoOp::Read, IoOp::Write, IoOp::Flush, IoOp::Discard, IoOp::WriteZeroes];

/// Index of `op` in [`IoStats::ops`].
#[inline]
pub fn op_index(op: IoOp) -> usize {
    match op {
        IoOp::Read => 0,
        IoOp::Write => 1,
        IoOp::Flush => 2,
        IoOp::Discard => 3,
        IoOp::WriteZeroes => 4,
    }
}

/// Errnos below this are counted one by one; the rest share the last slot.
pub const ERRNO_SLOTS: usize = 64;

/// What one operation kind did: successful operations carry bytes and latency, failed ones are
/// only counted in `errors` (as SPDK counts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpStats {
    /// Operations that succeeded.
    pub ops: u64,
    /// Bytes those operations moved.
    pub bytes: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Sum of the latencies of `ops`, in ticks.
    pub latency_ticks: u64,
    /// `u64::MAX` while nothing completed (SPDK's sentinel; the RPC prints 0).
    pub min_latency_ticks: u64,
    /// Longest latency of `ops`, in ticks.
    pub max_latency_ticks: u64,
}

impl Default for OpStats {
    fn default() -> OpStats {
        OpStats {
            ops: 0,
            bytes: 0,
            errors: 0,
            latency_ticks: 0,
            min_latency_ticks: u64::MAX,
            max_latency_ticks: 0,
        }
    }
}

impl OpStats {
    fn merge(&mut self, o: &OpStats, with_maxmin: bool) {
        self.ops += o.ops;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.latency_ticks += o.latency_ticks;
        if with_maxmin {
            self.min_latency_ticks = self.min_latency_ticks.min(o.min_latency_ticks);
            self.max_latency_ticks = self.max_latency_ticks.max(o.max_latency_ticks);
        }
    }

    fn reset_maxmin(&mut self) {
        self.min_latency_ticks = u64::MAX;
        self.max_latency_ticks = 0;
    }
}

/// A disk's (or one channel's) counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoStats {
    /// Indexed by [`op_index`]: read, write, flush, unmap (discard), write_zeroes.
    pub ops: [OpStats; 5],
    /// Failed requests by errno (index 0: refused as unsupported; the last slot: errno
    /// [`ERRNO_SLOTS`] - 1 and above).
    pub errno: [u64; ERRNO_SLOTS],
    /// Requests in flight when read (not reset by `bdev_reset_iostat`); those waiting for QoS
    /// are among them.
    pub queue_depth: u64,
    /// What the disk's QoS limits held back (docs/qos.md).
    pub qos: QosStats,
}

/// What QoS held back: requests that waited in a channel for a limit, and for how long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosStats {
    /// Requests waiting for a limit when read (a gauge, like `queue_depth`: not reset).
    pub queued: u64,
    /// Requests that had to wait for a limit, ever.
    pub queued_total: u64,
    /// Ticks those requests waited, summed at admission.
    pub wait_ticks: u64,
    /// Ticks during which a channel held a waiting request, summed over channels (so with two
    /// channels throttled at once it runs at twice the clock).
    pub throttled_ticks: u64,
}

impl Default for IoStats {
    fn default() -> IoStats {
        IoStats {
            ops: [OpStats::default(); 5],
            errno: [0; ERRNO_SLOTS],
            queue_depth: 0,
            qos: QosStats::default(),
        }
    }
}

impl IoStats {
    /// The counters of one operation kind.
    pub fn op(&self, op: IoOp) -> &OpStats {
        &self.ops[op_index(op)]
    }

    pub(crate) fn merge(&mut self, o: &IoStats, with_maxmin: bool) {
        for (a, b) in self.ops.iter_mut().zip(o.ops.iter()) {
            a.merge(b, with_maxmin);
        }
        for (a, b) in self.errno.iter_mut().zip(o.errno.iter()) {
            *a += b;
        }
        self.queue_depth += o.queue_depth;
        self.qos.queued += o.qos.queued;
        self.qos.queued_total += o.qos.queued_total;
        self.qos.wait_ticks += o.qos.wait_ticks;
        self.qos.throttled_ticks += o.qos.throttled_ticks;
    }

    pub(crate) fn reset_maxmin(&mut self) {
        self.ops.iter_mut().for_each(OpStats::reset_maxmin);
    }
}

/// The requests of one operation kind that succeeded through a channel, and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Successes {
    /// Requests that succeeded.
    pub ops: u64,
    /// Bytes they moved.
    pub bytes: u64,
}

impl std::ops::Add for Successes {
    type Output = Successes;
    fn add(self, o: Successes) -> Successes {
        Successes { ops: self.ops.wrapping_add(o.ops), bytes: self.bytes.wrapping_add(o.bytes) }
    }
}

/// The errno slot of a failed request.
#[inline]
pub(crate) fn errno_slot(errno: i32) -> usize {
    (errno.max(1) as usize).min(ERRNO_SLOTS - 1)
}

/// One operation kind's counters, on a cache line of their own: a completion touches one line.
#[derive(Default)]
#[repr(align(64))]
struct OpCounters {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency: AtomicU64,
    /// Stored as `!min` so that zero (the initial value) means "none yet".
    not_min: AtomicU64,
    max: AtomicU64,
}

/// Adds `v` to a counter only this thread writes: no locked instruction.
#[inline]
fn bump(c: &AtomicU64, v: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
}

/// A channel's QoS counters, on their own line (written only while the channel waits).
#[derive(Default)]
#[repr(align(64))]
struct QosCounters {
    queued: AtomicU64,
    queued_total: AtomicU64,
    wait_ticks: AtomicU64,
    throttled_ticks: AtomicU64,
}

/// [`OPS`] rounded up to a power of two.
const OP_SLOTS: usize = OPS.len().next_power_of_two();

/// One channel's counters. Two cache lines of alignment keep the adjacent-line prefetcher from
/// pairing it with a neighbour's.
#[repr(align(128))]
pub(crate) struct ChannelSlot {
    /// Indexed by `op & (OP_SLOTS - 1)`: the three slots past the five kinds stay unused, and
    /// the masked index needs no bounds check on the completion path.
    ops: [OpCounters; OP_SLOTS],
    errno: [AtomicU64; ERRNO_SLOTS],
    in_flight: AtomicU64,
    qos: QosCounters,
    /// The reset epochs this channel has applied (see `Disk::reset`): readers ignore counters of a
    /// channel that has not applied the latest.
    pub(crate) seen_epochs: AtomicU64,
    /// The mirror epoch this channel has applied (`disk/mirror.rs`): a job waits until every
    /// live channel shows the epoch of its last change.
    pub(crate) mirror_ack: AtomicU64,
    pub(crate) hist: OnceLock<ChannelHistogram>,
    /// Numbered in open order, for `per_channel` (SPDK's `thread_id`).
    pub(crate) id: u64,
    /// The CPU the channel was opened on.
    pub(crate) core: Option<usize>,
}

impl ChannelSlot {
    pub(crate) fn new(id: u64, core: Option<usize>, seen_epochs: u64) -> ChannelSlot {
        ChannelSlot {
            ops: Default::default(),
            errno: [const { AtomicU64::new(0) }; ERRNO_SLOTS],
            in_flight: AtomicU64::new(0),
            qos: QosCounters::default(),
            seen_epochs: AtomicU64::new(seen_epochs),
            mirror_ack: AtomicU64::new(0),
            hist: OnceLock::new(),
            id,
            core,
        }
    }

    #[inline(always)]
    pub(crate) fn success(&self, op: usize, bytes: u64, ticks: u64) {
        let c = &self.ops[op & (OP_SLOTS - 1)];
        bump(&c.ops, 1);
        bump(&c.bytes, bytes);
        bump(&c.latency, ticks);
        if ticks > c.max.load(Ordering::Relaxed) {
            c.max.store(ticks, Ordering::Relaxed);
        }
        if !ticks > c.not_min.load(Ordering::Relaxed) {
            c.not_min.store(!ticks, Ordering::Relaxed);
        }
    }

    /// What succeeded of the kind at `op` since the channel opened or its last reset.
    #[inline(always)]
    pub(crate) fn successes(&self, op: usize) -> Successes {
        let c = &self.ops[op & (OP_SLOTS - 1)];
        Successes { ops: c.ops.load(Ordering::Relaxed), bytes: c.bytes.load(Ordering::Relaxed) }
    }

    #[inline]
    pub(crate) fn failure(&self, op: usize, errno_slot: usize) {
        bump(&self.ops[op & (OP_SLOTS - 1)].errors, 1);
        bump(&self.errno[errno_slot], 1);
    }

    #[inline]
    pub(crate) fn set_in_flight(&self, n: u64) {
        self.in_flight.store(n, Ordering::Relaxed);
    }

    /// What the channel last showed in flight.
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests the channel has completed (succeeded or failed) since it opened or its last
    /// reset, and the bytes of those that succeeded.
    pub(crate) fn completed(&self) -> (u64, u64) {
        self.ops.iter().fold((0, 0), |(n, b), c| {
            (
                n + c.ops.load(Ordering::Relaxed) + c.errors.load(Ordering::Relaxed),
                b + c.bytes.load(Ordering::Relaxed),
            )
        })
    }

    /// A request that waited `ticks` for QoS was admitted.
    #[inline]
    pub(crate) fn qos_admitted(&self, ticks: u64) {
        bump(&self.qos.queued_total, 1);
        bump(&self.qos.wait_ticks, ticks);
    }

    /// The channel's QoS queue held requests for another `ticks`.
    #[inline]
    pub(crate) fn qos_throttled(&self, ticks: u64) {
        bump(&self.qos.throttled_ticks, ticks);
    }

    #[inline]
    pub(crate) fn set_qos_queued(&self, n: u64) {
        self.qos.queued.store(n, Ordering::Relaxed);
    }

    /// Zeroes everything (a reset of mode "all"); by the owning channel only.
    pub(crate) fn clear(&self) {
        for c in &self.ops {
            for a in [&c.ops, &c.bytes, &c.errors, &c.latency, &c.not_min, &c.max] {
                a.store(0, Ordering::Relaxed);
            }
        }
        self.errno.iter().for_each(|a| a.store(0, Ordering::Relaxed));
        for a in [&self.qos.queued_total, &self.qos.wait_ticks, &self.qos.throttled_ticks] {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// Forgets the extremes (a reset of mode "maxmin"); by the owning channel only.
    pub(crate) fn clear_maxmin(&self) {
        for c in &self.ops {
            c.not_min.store(0, Ordering::Relaxed);
            c.max.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> IoStats {
        let mut s = IoStats::default();
        for (o, c) in s.ops.iter_mut().zip(self.ops.iter()) {
            *o = OpStats {
                ops: c.ops.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
                errors: c.errors.load(Ordering::Relaxed),
                latency_ticks: c.latency.load(Ordering::Relaxed),
                min_latency_ticks: !c.not_min.load(Ordering::Relaxed),
                max_latency_ticks: c.max.load(Ordering::Relaxed),
            };
        }
        for (e, c) in s.errno.iter_mut().zip(self.errno.iter()) {
            *e = c.load(Ordering::Relaxed);
        }
        s.queue_depth = self.in_flight.load(Ordering::Relaxed);
        s.qos = QosStats {
            queued: self.qos.queued.load(Ordering::Relaxed),
            queued_total: self.qos.queued_total.load(Ordering::Relaxed),
            wait_ticks: self.qos.wait_ticks.load(Ordering::Relaxed),
            throttled_ticks: self.qos.throttled_ticks.load(Ordering::Relaxed),
        };
        s
    }
}
