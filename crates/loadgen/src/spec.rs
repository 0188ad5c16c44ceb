//! What to run: the pattern, the region, and the whole [`LoadSpec`] with its checks.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::{timeline, LoadError};

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
    ///
    /// [`LoadResult::errors`]: crate::LoadResult::errors
    pub read_only: bool,
    /// Also measure the client's own busy time ([`LoadResult::client_busy_ns`]): one more
    /// clock read per pass over the queues, so leave it off where latency is measured.
    ///
    /// [`LoadResult::client_busy_ns`]: crate::LoadResult::client_busy_ns
    pub measure_busy: bool,
    /// Negotiate packed virtqueues (`VIRTIO_F_RING_PACKED`) through `virtio-driver` instead of
    /// split ones through libblkio; fails with [`LoadError::Unsupported`] if the device does
    /// not offer them.
    pub packed: bool,
    /// Drive split rings through fp-load's own vhost-user frontend (the `vhost` crate for the
    /// messages) instead of libblkio: the path [`LoadSpec::dirty_log`] needs, and its
    /// logging-off baseline. Not with `packed`.
    pub frontend: bool,
    /// Run with dirty logging on, as QEMU does while it migrates (implies `frontend`):
    /// `VHOST_F_LOG_ALL`, a memfd log (`SET_LOG_BASE`), used rings logged, and a thread that
    /// scans and clears the log every 100 ms ([`LoadResult::dirty_log`]). Fails with
    /// [`LoadError::Unsupported`] if the device offers no `VHOST_USER_PROTOCOL_F_LOG_SHMFD`.
    ///
    /// [`LoadResult::dirty_log`]: crate::LoadResult::dirty_log
    pub dirty_log: bool,
    /// With `frontend`: put the memory shared with the device (rings, headers, buffers) in a
    /// memfd of 2 MiB huge pages (`MFD_HUGETLB`), as SPDK's vhost target needs; also chosen
    /// when the device offers no `VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS` (SPDK's
    /// rte_vhost). Needs free huge pages (`vm.nr_hugepages`).
    pub hugetlb: bool,
    /// Also count completions per interval of this length from the start
    /// ([`LoadResult::timeline`]), e.g. 1 s to see a rate limit per second; `None`: no
    /// timeline.
    ///
    /// [`LoadResult::timeline`]: crate::LoadResult::timeline
    pub timeline: Option<Duration>,
    /// Stamp every write's data (each 512-byte sector with its offset and the write's
    /// sequence number) and check every read of a block written earlier in the run against
    /// its last completed write ([`LoadResult::verify`]); a mismatch counts as an error. Each
    /// request slot gets its own blocks (block `b` only for slot `b % slots`), so the region
    /// needs at least `queue_depth * num_queues` blocks. libblkio split queues only.
    ///
    /// [`LoadResult::verify`]: crate::LoadResult::verify
    pub verify: bool,
    /// Print `fp-load: measuring` on stderr when the measured interval starts (every disk
    /// connected and filled) and `fp-load: measured` when it ends (before the drain), so that
    /// a caller can sample something else, a server's CPU time say, over that interval and not
    /// over the connects and disconnects around it. Each client thread prints its own pair.
    pub mark_phases: bool,
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
            frontend: false,
            dirty_log: false,
            hugetlb: false,
            timeline: None,
            verify: false,
            mark_phases: false,
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
        if self.packed && (self.frontend || self.dirty_log) {
            return bad(
                "packed rings and fp-load's own frontend (--frontend, --dirty-log) do not combine".into()
            );
        }
        if self.hugetlb && !(self.frontend || self.dirty_log) {
            return bad(
                "huge-page memory (--hugetlb) is a choice of fp-load's own frontend (--frontend)".into()
            );
        }
        if self.verify && (self.packed || self.frontend || self.dirty_log) {
            return bad(
                "--verify runs on the libblkio client only, not with --packed, --frontend or --dirty-log"
                    .into(),
            );
        }
        if self.max_ios == Some(0) {
            return bad("the request count must be positive".into());
        }
        Ok(())
    }
}
