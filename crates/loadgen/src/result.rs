//! What a run measured: counts, rates, latency percentiles.

use std::time::Duration;

use crate::{DirtyLogReport, Histogram, Timeline, VerifyReport};

/// What a run measured.
#[derive(Debug, Clone)]
pub struct LoadResult {
    /// Requests completed successfully within the measured interval.
    pub ios: u64,
    /// Bytes moved by those requests.
    pub bytes: u64,
    /// Of `ios`, how many were reads and writes.
    pub reads: u64,
    pub writes: u64,
    /// The measured interval: from the first submission to the moment the duration elapsed.
    pub elapsed: Duration,
    /// `ios / elapsed`.
    pub iops: f64,
    /// `bytes / elapsed` in megabytes (10^6 bytes) per second.
    pub mbps: f64,
    /// Completion latency (submission to reaped completion) of successful requests, ns.
    pub lat_mean_ns: f64,
    pub lat_min_ns: u64,
    pub lat_max_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    /// Requests that completed with an error (`ret < 0`) within the measured interval.
    pub errors: u64,
    /// The first such error, as libblkio's negative errno.
    pub first_error: Option<i32>,
    /// Device capacity in bytes, as libblkio reported it.
    pub capacity: u64,
    /// The device's request alignment (logical block size) in bytes.
    pub request_alignment: u32,
    /// The full latency histogram.
    pub histogram: Histogram,
    /// With [`LoadSpec::measure_busy`]: time the client thread spent in passes over its queues
    /// that completed at least one request (reaping, accounting and resubmitting), in ns; the
    /// rest of the interval it spun or slept with nothing to do. `elapsed / client_busy_ns`
    /// bounds how much faster a device could make this client go.
    ///
    /// [`LoadSpec::measure_busy`]: crate::LoadSpec::measure_busy
    pub client_busy_ns: Option<u64>,
    /// With [`LoadSpec::timeline`]: the requests that completed without error in each
    /// interval (they add up to `ios`).
    ///
    /// [`LoadSpec::timeline`]: crate::LoadSpec::timeline
    pub timeline: Option<Timeline>,
    /// With [`LoadSpec::dirty_log`]: what the log's sync thread saw.
    ///
    /// [`LoadSpec::dirty_log`]: crate::LoadSpec::dirty_log
    pub dirty_log: Option<DirtyLogReport>,
    /// Whether the memory shared with the device was of huge pages ([`LoadSpec::hugetlb`]).
    ///
    /// [`LoadSpec::hugetlb`]: crate::LoadSpec::hugetlb
    pub hugetlb: bool,
    /// With [`LoadSpec::frontend`]: the kicks (available-buffer notifications) the client sent
    /// over the whole run (the start probe and the drain included: at most two per queue);
    /// it kicks only when the device's used ring does not say `VRING_USED_F_NO_NOTIFY`.
    ///
    /// [`LoadSpec::frontend`]: crate::LoadSpec::frontend
    pub kicks: Option<u64>,
    /// With completion fds: how often the client slept and was woken, counted up to the end of
    /// the measured interval; in a run of several disks, a disk's own only with a thread per
    /// disk (one thread's sleeps serve all its disks: they are in the total).
    pub wakeups: Option<Wakeups>,
    /// With [`LoadSpec::verify`]: the reads compared and the mismatches found (each also
    /// counted in `errors`, as `-EILSEQ`).
    ///
    /// [`LoadSpec::verify`]: crate::LoadSpec::verify
    pub verify: Option<VerifyReport>,
}

/// What a client sleeping on completion fds counted: a measure of how a server batches its
/// notifications that does not depend on the server's own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wakeups {
    /// Sleeps (`poll`) that ended with at least one completion fd ready.
    pub wakeups: u64,
    /// The sum of the completion eventfds' counters read on those wake-ups: the server's
    /// notifications (each a write of 1), those that came while the client was not asleep
    /// included.
    pub notifications: u64,
}

/// Both counts added: the sleeps of several client threads.
impl std::ops::Add for Wakeups {
    type Output = Wakeups;

    fn add(self, other: Wakeups) -> Wakeups {
        Wakeups {
            wakeups: self.wakeups + other.wakeups,
            notifications: self.notifications + other.notifications,
        }
    }
}

impl Wakeups {
    /// The result as a JSON object, with completions per wake-up and per notification for a
    /// run of `ios` completions.
    pub fn to_json(&self, ios: u64) -> serde_json::Value {
        let per = |n: u64| (n > 0).then(|| ios as f64 / n as f64);
        serde_json::json!({
            "wakeups": self.wakeups,
            "notifications": self.notifications,
            "completions_per_wakeup": per(self.wakeups),
            "completions_per_notification": per(self.notifications),
        })
    }
}

/// What a client counted for one disk or several, before the rates and percentiles.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub(crate) ios: u64,
    pub(crate) bytes: u64,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<i32>,
    pub(crate) elapsed: Duration,
}

impl LoadResult {
    /// The result of counting `c` and the latencies in `histogram` on a device of
    /// `capacity` bytes and `request_alignment`-byte blocks.
    pub(crate) fn from_counts(
        c: Counts,
        histogram: Histogram,
        capacity: u64,
        request_alignment: u32,
    ) -> Self {
        let secs = c.elapsed.as_secs_f64().max(1e-9);
        let h = &histogram;
        LoadResult {
            ios: c.ios,
            bytes: c.bytes,
            reads: c.reads,
            writes: c.writes,
            elapsed: c.elapsed,
            iops: c.ios as f64 / secs,
            mbps: c.bytes as f64 / secs / 1e6,
            lat_mean_ns: h.mean(),
            lat_min_ns: h.min(),
            lat_max_ns: h.max(),
            p50_ns: h.percentile(50.0),
            p99_ns: h.percentile(99.0),
            p999_ns: h.percentile(99.9),
            errors: c.errors,
            first_error: c.first_error,
            capacity,
            request_alignment,
            histogram,
            client_busy_ns: None,
            timeline: None,
            dirty_log: None,
            hugetlb: false,
            kicks: None,
            wakeups: None,
            verify: None,
        }
    }

    /// The result as a JSON object (latencies in ns, elapsed in seconds).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ios": self.ios,
            "bytes": self.bytes,
            "reads": self.reads,
            "writes": self.writes,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "iops": self.iops,
            "mbps": self.mbps,
            "lat_mean_ns": self.lat_mean_ns,
            "lat_min_ns": self.lat_min_ns,
            "lat_max_ns": self.lat_max_ns,
            "p50_ns": self.p50_ns,
            "p99_ns": self.p99_ns,
            "p999_ns": self.p999_ns,
            "errors": self.errors,
            "first_error": self.first_error,
            "capacity": self.capacity,
            "request_alignment": self.request_alignment,
            "client_busy_ns": self.client_busy_ns,
            "timeline": self.timeline.as_ref().map(Timeline::to_json),
            "dirty_log": self.dirty_log.as_ref().map(DirtyLogReport::to_json),
            "hugetlb": self.hugetlb,
            "kicks": self.kicks,
            "wakeups": self.wakeups.map(|w| w.to_json(self.ios)),
            "verified": self.verify.map(|v| v.verified),
            "mismatches": self.verify.map(|v| v.mismatches),
            "first_mismatch": self.verify.and_then(|v| v.first_mismatch),
        })
    }

    /// The latency histogram as JSON: the non-empty buckets as `[low_ns, high_ns, count]`
    /// (inclusive bounds), ascending, with the exact count, minimum, maximum and mean.
    pub fn histogram_json(&self) -> serde_json::Value {
        let h = &self.histogram;
        let buckets: Vec<serde_json::Value> =
            h.nonzero_buckets().map(|(low, high, c)| serde_json::json!([low, high, c])).collect();
        serde_json::json!({
            "unit": "ns",
            "count": h.count(),
            "min": h.min(),
            "max": h.max(),
            "mean": h.mean(),
            "buckets": buckets,
        })
    }
}
