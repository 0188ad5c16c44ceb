//! `fp-loadgen`: a block I/O load generator that drives a vhost-user-blk device through
//! libblkio (the pure-Rust `blkio` crate), independently of flashpath's own code.
//!
//! One client thread owns the libblkio instance and all of its queues. It keeps every queue at
//! the requested depth: each completion is accounted for and immediately replaced by a new
//! request in the same slot, so the per-I/O work is a clock read shared by a batch of
//! completions, a few arithmetic operations to pick the next offset, one histogram increment and
//! libblkio's own enqueue. Buffers live in one libblkio memory region, allocated and mapped once;
//! latencies go to a preallocated log-bucket [`Histogram`]. Nothing is allocated per I/O.
//!
//! Two completion modes, as libblkio offers them:
//! * **completion-fd queues** (`poll_queues = false`): the thread sleeps in `epoll_wait` on the
//!   queues' completion eventfds when no completion is ready, like an interrupt-driven guest;
//! * **poll queues** (`poll_queues = true`): the thread busy-polls the used rings and never
//!   sleeps, like a polled-mode guest driver.
//!
//! With [`LoadSpec::packed`] the same loop drives **packed virtqueues** instead: libblkio 0.5.1
//! never negotiates `VIRTIO_F_RING_PACKED`, so that mode uses the `virtio-driver` crate
//! (libblkio's own virtio layer) directly, with the same buffers, accounting and output.
//!
//! Use [`run`] with a [`LoadSpec`] to get a [`LoadResult`]; the `fp-load` binary wraps it.
//!
//! **Several disks** ([`run_multi`] with a [`MultiSpec`]; `fp-load --disk ...`): each disk has
//! its own socket, pattern, block size, depth, queues and request count, and its own
//! accounting; all run for the same time. By default one client thread drives them all in one
//! loop (one pass over every disk's queues, one epoll set for all their completion fds), as
//! one vCPU driving many virtual disks would; with [`MultiSpec::thread_per_disk`] each disk
//! has its own pinned thread, and the threads start together once every disk is connected.
//! The [`MultiResult`] has each disk's [`LoadResult`] and their total.
//!
//! With [`LoadSpec::timeline`] each disk also counts its completions per interval from the
//! start ([`Timeline`]): the delivered rate second by second, to check a rate limit over short
//! windows or watch a burst fall back to its average.

mod client;
mod engine;
pub mod hist;
mod multi;
pub mod rng;
pub mod timeline;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub use client::{hold, run};
pub use hist::Histogram;
pub use multi::{parse_disk, run_multi, DiskArg, MultiResult, MultiSpec};
pub use timeline::Timeline;

/// Deepest queue accepted. A libblkio virtio-blk request takes three descriptors and the
/// largest virtqueue is 32768 entries.
pub(crate) const MAX_QUEUE_DEPTH: usize = 4096;

/// What kind of requests to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Reads at uniformly random block-aligned offsets.
    RandRead,
    /// Writes at uniformly random block-aligned offsets.
    RandWrite,
    /// Reads at consecutive offsets, wrapping at the end of the region.
    Read,
    /// Writes at consecutive offsets, wrapping at the end of the region.
    Write,
    /// Random offsets; each request is a read with probability [`LoadSpec::read_percent`] %.
    RandRw,
}

impl Pattern {
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::RandRw => "randrw",
        }
    }

    /// Whether the pattern only reads.
    pub fn is_read_only(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::Read)
    }

    /// Whether offsets are random (as opposed to sequential).
    pub fn is_random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite | Pattern::RandRw)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "randread" => Ok(Pattern::RandRead),
            "randwrite" => Ok(Pattern::RandWrite),
            "read" => Ok(Pattern::Read),
            "write" => Ok(Pattern::Write),
            "randrw" => Ok(Pattern::RandRw),
            _ => Err(format!("unknown pattern '{s}' (expected randread, randwrite, read, write or randrw)")),
        }
    }
}

/// A byte range of the device to confine I/O to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Start, in bytes; a multiple of the device's request alignment.
    pub offset: u64,
    /// Length in bytes; at least one block. I/O never crosses `offset + len`.
    pub len: u64,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The vhost-user-blk Unix socket.
    pub socket: PathBuf,
    pub pattern: Pattern,
    /// Bytes per request; a multiple of the device's request alignment (its block size).
    pub block_size: usize,
    /// Requests kept in flight on each queue.
    pub queue_depth: usize,
    /// Virtqueues to use (each kept at `queue_depth`).
    pub num_queues: usize,
    /// How long to issue I/O. Requests still in flight at the end are waited for, not counted.
    pub duration: Duration,
    /// Busy-poll libblkio poll queues instead of sleeping on completion fds.
    pub poll_queues: bool,
    /// Confine I/O to this range; `None` is the whole device.
    pub region: Option<Region>,
    /// For the sequential patterns: bytes from one request's start to the next (fio's
    /// `rw=write:<skip>`), e.g. a cluster size to touch each cluster once; `None` is the block
    /// size (back to back).
    pub stride: Option<u64>,
    /// Stop after this many requests (fio's `number_ios`); the duration still bounds the run.
    pub max_ios: Option<u64>,
    /// Submit at most this many requests per second (fio's `rate_iops`): request `n` is due
    /// `n / rate` seconds after the start, and a slot whose request completed early waits for
    /// the next one's turn. Latency still runs from submission, not from the due time.
    pub rate_iops: Option<u64>,
    /// Pin the client thread to this CPU.
    pub cpu: Option<usize>,
    /// For [`Pattern::RandRw`]: percentage of requests that are reads (0..=100).
    pub read_percent: u8,
    /// Seed for the offset generator (and the write payload), for repeatable runs.
    pub seed: u64,
    /// Open the device read-only (libblkio's `read-only`), as a read-only device requires.
    /// Implied by the read patterns; with a write pattern every write then fails (and is
    /// counted in [`LoadResult::errors`]).
    pub read_only: bool,
    /// Also measure the client's own busy time ([`LoadResult::client_busy_ns`]): one more
    /// clock read per pass over the queues, so leave it off where latency is measured.
    pub measure_busy: bool,
    /// Negotiate packed virtqueues (`VIRTIO_F_RING_PACKED`) through `virtio-driver` instead of
    /// split ones through libblkio; fails with [`LoadError::Unsupported`] if the device does
    /// not offer them.
    pub packed: bool,
    /// Also count completions per interval of this length from the start
    /// ([`LoadResult::timeline`]), e.g. 1 s to see a rate limit per second; `None`: no
    /// timeline.
    pub timeline: Option<Duration>,
}

impl LoadSpec {
    /// A 4 KiB random-read, QD1, one completion-fd queue, 5 s spec for `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        LoadSpec {
            socket: socket.into(),
            pattern: Pattern::RandRead,
            block_size: 4096,
            queue_depth: 1,
            num_queues: 1,
            duration: Duration::from_secs(5),
            poll_queues: false,
            region: None,
            stride: None,
            max_ios: None,
            rate_iops: None,
            cpu: None,
            read_percent: 50,
            seed: 0x5eed_f1a5_4a70_0001,
            read_only: false,
            measure_busy: false,
            packed: false,
            timeline: None,
        }
    }

    /// Checks what can be checked without the device.
    pub fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: String| Err(LoadError::InvalidSpec(m));
        if self.block_size == 0 || self.block_size % 512 != 0 {
            return bad(format!("block size {} is not a positive multiple of 512", self.block_size));
        }
        if self.block_size > (64 << 20) {
            return bad(format!("block size {} exceeds 64 MiB", self.block_size));
        }
        if !(1..=MAX_QUEUE_DEPTH).contains(&self.queue_depth) {
            return bad(format!("queue depth {} is not between 1 and {}", self.queue_depth, MAX_QUEUE_DEPTH));
        }
        if !(1..=256).contains(&self.num_queues) {
            return bad(format!("{} queues is not between 1 and 256", self.num_queues));
        }
        if self.duration.is_zero() {
            return bad("duration must be positive".into());
        }
        if self.read_percent > 100 {
            return bad(format!("read percentage {} exceeds 100", self.read_percent));
        }
        if let Some(r) = self.region {
            if r.len < self.block_size as u64 {
                return bad(format!("region length {} is smaller than one block", r.len));
            }
        }
        if let Some(stride) = self.stride {
            if self.pattern.is_random() {
                return bad(format!("a stride applies to the sequential patterns, not {}", self.pattern));
            }
            if stride < self.block_size as u64 || stride % 512 != 0 {
                return bad(format!(
                    "stride {stride} is not a multiple of 512 of at least the block size {}",
                    self.block_size
                ));
            }
        }
        if self.rate_iops == Some(0) {
            return bad("the rate must be positive".into());
        }
        if let Some(step) = self.timeline {
            match timeline::buckets(step, self.duration) {
                None => return bad("the timeline interval must be positive".into()),
                Some(n) if n > timeline::MAX_BUCKETS => {
                    return bad(format!(
                        "a timeline of {n} intervals exceeds {}; use a longer interval",
                        timeline::MAX_BUCKETS
                    ))
                }
                Some(_) => {}
            }
        }
        if self.max_ios == Some(0) {
            return bad("the request count must be positive".into());
        }
        Ok(())
    }
}

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
    pub client_busy_ns: Option<u64>,
    /// With [`LoadSpec::timeline`]: the requests that completed without error in each
    /// interval (they add up to `ios`).
    pub timeline: Option<Timeline>,
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

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid load spec: {0}")]
    InvalidSpec(String),
    #[error("libblkio {op}: {message} (errno {errno})")]
    Blkio { op: &'static str, errno: i32, message: String },
    #[error("virtio-driver {op}: {source}")]
    Virtio {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("{op}: {source}")]
    Os {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} requests still in flight {1:?} after the run ended; the device stopped completing")]
    DrainTimeout(usize, Duration),
    #[error("the client thread panicked")]
    Panicked,
    /// A run with one thread per disk: this disk's thread stopped because another disk's
    /// failed to connect.
    #[error("cancelled: another disk failed to start")]
    Cancelled,
    /// A multi-disk run: what went wrong with disk `index` (counting from 0, as given).
    #[error("disk {index} ({socket}): {source}")]
    Disk {
        index: usize,
        socket: String,
        #[source]
        source: Box<LoadError>,
    },
}

impl LoadError {
    pub(crate) fn blkio(op: &'static str, e: blkio::Error) -> Self {
        LoadError::Blkio { op, errno: e.errno().raw_os_error(), message: e.message().to_string() }
    }
}

/// Restricts the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> Result<(), LoadError> {
    let max = fp_sys::CPU_SETSIZE;
    if cpu >= max {
        return Err(LoadError::InvalidSpec(format!("cpu {cpu} is beyond the {max} a cpu set holds")));
    }
    fp_sys::pin_thread(&[cpu]).map_err(|source| LoadError::Os { op: "pinning the client thread", source })
}

/// Parses a byte size such as `4096`, `4k`, `4K`, `1m`, `2G`, `4KiB` (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1u64 << 10),
        Some('m') => (&body[..body.len() - 1], 1 << 20),
        Some('g') => (&body[..body.len() - 1], 1 << 30),
        Some('t') => (&body[..body.len() - 1], 1 << 40),
        _ => (body, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("'{s}' is not a size like 4096, 4k or 1M"))?;
    n.checked_mul(mult).ok_or_else(|| format!("'{s}' is too large"))
}

/// Parses a duration such as `5`, `5s`, `500ms`, `2m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let err = || format!("'{s}' is not a duration like 5, 5s, 500ms or 2m");
    let (num, unit_ms) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        (t, 1000.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v < 0.0 {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(v * unit_ms / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("four").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn patterns_round_trip() {
        for p in [Pattern::RandRead, Pattern::RandWrite, Pattern::Read, Pattern::Write, Pattern::RandRw] {
            assert_eq!(p.as_str().parse::<Pattern>(), Ok(p));
        }
        assert!("randomread".parse::<Pattern>().is_err());
        assert!(Pattern::RandRw.is_random());
        assert!(!Pattern::Write.is_random());
    }

    #[test]
    fn spec_validation_rejects_nonsense() {
        let ok = LoadSpec::new("/nonexistent");
        assert!(ok.validate().is_ok());
        let mut s = ok.clone();
        s.block_size = 1000;
        assert!(matches!(s.validate(), Err(LoadError::InvalidSpec(_))));
        let mut s = ok.clone();
        s.queue_depth = 0;
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.num_queues = 0;
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.duration = Duration::ZERO;
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.read_percent = 101;
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.region = Some(Region { offset: 0, len: 512 });
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.pattern = Pattern::Write;
        s.stride = Some(1 << 20);
        assert!(s.validate().is_ok());
        s.stride = Some(2048);
        assert!(s.validate().is_err());
        s.stride = Some(4096 + 100);
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.stride = Some(1 << 20);
        assert!(s.validate().is_err(), "randread takes no stride");
        let mut s = ok.clone();
        s.max_ios = Some(0);
        assert!(s.validate().is_err());
        let mut s = ok;
        s.rate_iops = Some(0);
        assert!(s.validate().is_err());
    }

    #[test]
    fn connecting_to_a_missing_socket_fails_cleanly() {
        let mut spec = LoadSpec::new("/nonexistent/fp-load-test.sock");
        spec.duration = Duration::from_millis(10);
        match run(&spec) {
            Err(LoadError::Blkio { op, errno, .. }) => {
                assert_eq!(op, "connect");
                assert!(errno > 0);
            }
            other => panic!("expected a connect error, got {other:?}"),
        }
    }

    #[test]
    fn pinning_to_an_absurd_cpu_is_an_error() {
        assert!(matches!(pin_current_thread(1 << 20), Err(LoadError::InvalidSpec(_))));
    }
}
