//! SPDK's four per-disk limits (`bdev_set_qos_limit`): a request passes when every limit that
//! applies to it allows it. Reads and writes are limited; flush, discard and write-zeroes pass
//! uncounted, as in SPDK (they move no data through the device's queues in the same way).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{take_all, ChannelTokens, QosError, SharedLimiter, Wait, MAX_RATE};
use crate::IoOp;

/// SPDK's smallest IOPS limit (`SPDK_BDEV_QOS_MIN_IOS_PER_SEC`).
pub const MIN_IOS_PER_SEC: u64 = 1000;
/// SPDK's smallest bandwidth limit, in MiB/s.
pub const MIN_MBYTES_PER_SEC: u64 = 1;

const MIB: u64 = 1024 * 1024;

/// The limits as `bdev_set_qos_limit` takes them and `assigned_rate_limits` shows them
/// (SPDK's names and units: MB means MiB). 0 means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosLimits {
    /// I/Os per second, reads and writes together.
    pub rw_ios_per_sec: u64,
    /// MiB per second, reads and writes together.
    pub rw_mbytes_per_sec: u64,
    /// MiB per second of reads.
    pub r_mbytes_per_sec: u64,
    /// MiB per second of writes.
    pub w_mbytes_per_sec: u64,
}

impl QosLimits {
    /// Checks each limit against SPDK's minimums and this layer's maximum, naming the field.
    pub fn validate(&self) -> Result<(), QosError> {
        let check = |field: &'static str, value: u64, min: u64, unit: u64| {
            if value == 0 {
                return Ok(());
            }
            if value < min {
                return Err(QosError::BelowMinimum { field, value, min });
            }
            if value > MAX_RATE / unit {
                return Err(QosError::AboveMaximum { field, value, max: MAX_RATE / unit });
            }
            Ok(())
        };
        check("rw_ios_per_sec", self.rw_ios_per_sec, MIN_IOS_PER_SEC, 1)?;
        check("rw_mbytes_per_sec", self.rw_mbytes_per_sec, MIN_MBYTES_PER_SEC, MIB)?;
        check("r_mbytes_per_sec", self.r_mbytes_per_sec, MIN_MBYTES_PER_SEC, MIB)?;
        check("w_mbytes_per_sec", self.w_mbytes_per_sec, MIN_MBYTES_PER_SEC, MIB)
    }

    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == QosLimits::default()
    }
}

/// One disk's limits, shared by all its channels.
#[derive(Debug)]
pub struct DiskQos {
    ios: SharedLimiter,
    rw_bytes: SharedLimiter,
    r_bytes: SharedLimiter,
    w_bytes: SharedLimiter,
    /// Bumped after each [`DiskQos::set`]: a channel that saw the same value on its last slow
    /// path may spend its caches without asking each limit.
    generation: AtomicU64,
    /// What was last set, for `assigned_rate_limits` (control plane only).
    assigned: std::sync::Mutex<QosLimits>,
}

impl DiskQos {
    /// No limits, on a clock of `tick_rate` ticks per second.
    pub fn new(tick_rate: u64) -> DiskQos {
        DiskQos {
            ios: SharedLimiter::new(tick_rate),
            rw_bytes: SharedLimiter::new(tick_rate),
            r_bytes: SharedLimiter::new(tick_rate),
            w_bytes: SharedLimiter::new(tick_rate),
            generation: AtomicU64::new(0),
            assigned: std::sync::Mutex::new(QosLimits::default()),
        }
    }

    /// Sets all four limits at tick `now` (any number of times, while channels run); invalid
    /// limits change nothing.
    pub fn set(&self, limits: QosLimits, now: u64) -> Result<(), QosError> {
        limits.validate()?;
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        for (lim, rate) in [
            (&self.ios, limits.rw_ios_per_sec),
            (&self.rw_bytes, limits.rw_mbytes_per_sec * MIB),
            (&self.r_bytes, limits.r_mbytes_per_sec * MIB),
            (&self.w_bytes, limits.w_mbytes_per_sec * MIB),
        ] {
            lim.set(rate, lim.default_tolerance(), now);
        }
        // After the limits: a channel whose fast path still sees the old value spends at most
        // what it had cached, which the limits converted anyway.
        self.generation.fetch_add(1, Ordering::Release);
        *assigned = limits;
        Ok(())
    }

    /// The limits in force (`assigned_rate_limits`).
    pub fn limits(&self) -> QosLimits {
        *self.assigned.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A channel's side of a [`DiskQos`]: its cached tokens of each limit.
#[derive(Debug, Clone)]
pub struct ChannelQos {
    ios: ChannelTokens,
    rw_bytes: ChannelTokens,
    r_bytes: ChannelTokens,
    w_bytes: ChannelTokens,
    /// The disk's generation at the last slow path (`u64::MAX`: none yet), and per direction
    /// (read, write) the earliest expiry of the caches it spends.
    generation: u64,
    expires: [u64; 2],
}

impl Default for ChannelQos {
    fn default() -> ChannelQos {
        ChannelQos {
            ios: ChannelTokens::new(),
            rw_bytes: ChannelTokens::new(),
            r_bytes: ChannelTokens::new(),
            w_bytes: ChannelTokens::new(),
            generation: u64::MAX,
            expires: [0; 2],
        }
    }
}

impl ChannelQos {
    /// A channel that has read no limits yet.
    pub fn new() -> ChannelQos {
        ChannelQos::default()
    }

    /// Whether a request of `op` and `len` bytes may go at `now`; if not, the tick to retry
    /// from. Nothing is consumed when it may not.
    ///
    /// The common case, every cache holding enough, is one load of the disk's generation, one
    /// comparison of the expiry and three of tokens (no limit: a cache that never empties).
    #[inline]
    pub fn admit(&mut self, qos: &DiskQos, now: u64, op: IoOp, len: u64) -> Result<(), Wait> {
        let (dir, d) = match op {
            IoOp::Read => (&mut self.r_bytes, 0),
            IoOp::Write => (&mut self.w_bytes, 1),
            IoOp::Flush | IoOp::Discard | IoOp::WriteZeroes => return Ok(()),
        };
        if qos.generation.load(Ordering::Relaxed) == self.generation
            && now < self.expires[d]
            && self.ios.tokens >= 1
            && self.rw_bytes.tokens >= len
            && dir.tokens >= len
        {
            self.ios.tokens -= 1;
            self.rw_bytes.tokens -= len;
            dir.tokens -= len;
            return Ok(());
        }
        self.admit_slow(qos, now, op, len)
    }

    /// Asks each limit (refilling caches from the shared state as needed).
    #[cold]
    #[inline(never)]
    fn admit_slow(&mut self, qos: &DiskQos, now: u64, op: IoOp, len: u64) -> Result<(), Wait> {
        // Read before the limits: a change during this call is seen by the next fast path.
        self.generation = qos.generation.load(Ordering::Acquire);
        let (dir, dir_lim, d) = match op {
            IoOp::Write => (&mut self.w_bytes, &qos.w_bytes, 1),
            _ => (&mut self.r_bytes, &qos.r_bytes, 0),
        };
        let r = take_all(
            now,
            [(&mut self.ios, &qos.ios, 1), (&mut self.rw_bytes, &qos.rw_bytes, len), (dir, dir_lim, len)],
        );
        let dir = if d == 0 { &self.r_bytes } else { &self.w_bytes };
        self.expires[d] = self.ios.expires.min(self.rw_bytes.expires).min(dir.expires);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::sim::{flood, Channel};

    const NS: u64 = 1_000_000_000;

    #[test]
    fn validation_names_the_field_and_changes_nothing() {
        let q = DiskQos::new(NS);
        let ok = QosLimits { rw_ios_per_sec: 20_000, ..QosLimits::default() };
        q.set(ok, 0).unwrap();
        let low = QosLimits { rw_ios_per_sec: 999, ..QosLimits::default() };
        let e = q.set(low, 0).unwrap_err();
        assert_eq!(e, QosError::BelowMinimum { field: "rw_ios_per_sec", value: 999, min: 1000 });
        assert!(e.to_string().starts_with("rw_ios_per_sec: 999"));
        let huge = QosLimits { w_mbytes_per_sec: u64::MAX / 2, ..QosLimits::default() };
        assert!(matches!(q.set(huge, 0), Err(QosError::AboveMaximum { field: "w_mbytes_per_sec", .. })));
        assert_eq!(q.limits(), ok);
    }

    /// Counts what `admit` lets through from second `from` to `to` of flooding with requests
    /// of `op`/`len`, one channel.
    fn run(q: &DiskQos, op: IoOp, len: u64, from: u64, to: u64) -> u64 {
        let mut ch = ChannelQos::new();
        let mut c = Channel::new(|now| ch.admit(q, now, op, len));
        flood(std::slice::from_mut(&mut c), from * NS, to * NS)[0]
    }

    #[test]
    fn every_applicable_limit_must_allow_and_the_tightest_wins() {
        // 4 KiB reads: 10 K IOPS would be 40 MiB/s, so 20 MiB/s (5120 reads/s) binds.
        let q = DiskQos::new(NS);
        q.set(QosLimits { rw_ios_per_sec: 10_000, rw_mbytes_per_sec: 20, ..Default::default() }, 0).unwrap();
        let reads = run(&q, IoOp::Read, 4096, 0, 1);
        // The bound: r·W + r·(2 ms tolerance) + one channel's quantum (5,120/s × 3 ms).
        assert!((5120..=5120 + 16).contains(&reads), "{reads}");
        // A read limit does not slow writes.
        let q = DiskQos::new(NS);
        q.set(QosLimits { rw_ios_per_sec: 2_000, r_mbytes_per_sec: 1, ..Default::default() }, 0).unwrap();
        let writes = run(&q, IoOp::Write, 4096, 0, 1);
        assert!((2000..=2000 + 5).contains(&writes), "{writes}");
        let reads = run(&q, IoOp::Read, 4096, 1, 2);
        assert!((256..=256 + 3).contains(&reads), "{reads}");
        // Flush, discard and write-zeroes are not limited (as in SPDK).
        let mut ch = ChannelQos::new();
        for _ in 0..100_000 {
            ch.admit(&q, 0, IoOp::Flush, 0).unwrap();
            ch.admit(&q, 0, IoOp::Discard, 1 << 30).unwrap();
        }
    }

    #[test]
    fn a_refused_request_costs_no_tokens_of_the_limits_that_allowed_it() {
        // IOPS is loose, bytes tight: every refusal by the byte limit gives its IOPS token back,
        // so after the byte limit is removed the IOPS limit delivers its full rate.
        let q = DiskQos::new(NS);
        q.set(QosLimits { rw_ios_per_sec: 1_000, w_mbytes_per_sec: 1, ..Default::default() }, 0).unwrap();
        let mut ch = ChannelQos::new();
        let (mut ok, mut refused) = (0, 0);
        for t in 0..1000u64 {
            // 64 KiB writes at 1 MiB/s: 16 per second pass, the rest are refused.
            match ch.admit(&q, t * NS / 1000, IoOp::Write, 65536) {
                Ok(()) => ok += 1,
                Err(Wait(at)) => {
                    assert!(at > t * NS / 1000);
                    refused += 1
                }
            }
        }
        assert!((16..=17).contains(&ok), "{ok}");
        assert_eq!(ok + refused, 1000);
        q.set(QosLimits { rw_ios_per_sec: 1_000, ..Default::default() }, NS).unwrap();
        let mut c = Channel::new(|now| ch.admit(&q, now, IoOp::Write, 65536));
        let n = flood(std::slice::from_mut(&mut c), NS, 2 * NS)[0];
        assert!((1000..=1003).contains(&n), "{n}");
    }
}
