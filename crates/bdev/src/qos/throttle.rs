//! QEMU-style throttle groups: six limits (IOPS and bytes per second; total, read, write), each
//! an average rate with an optional burst ceiling and burst length.
//!
//! A limit with a burst is two [`SharedLimiter`]s a request must both pass: the ceiling (rate
//! `max`, the usual small tolerance) and the average (rate `avg`, tolerance
//! `length * (max - avg) / avg` seconds). Flooding from idle, the average's debt grows by
//! `max / avg - 1` seconds per second, so it reaches its tolerance after exactly `length`
//! seconds at the ceiling: `max * length` units, then the average. Idle, the debt drains at one
//! second per second: the whole burst is back after `length * (max - avg) / avg` seconds idle.
//! (QEMU's bucket holds `max * length` and drains at `avg` while filling at `max`, so its burst
//! runs `max * length / (max - avg)` seconds, a little longer than asked.)

use std::sync::atomic::{AtomicU64, Ordering};

use super::{ChannelTokens, QosError, SharedLimiter, Wait, MAX_RATE};
use crate::IoOp;

/// One QEMU limit: `avg` units per second (0: none), bursts at up to `max` (0: no burst) for
/// `max_length` seconds (QEMU's `iops-total`, `iops-total-max`, `iops-total-max-length`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BurstLimit {
    /// Units per second (0: no limit).
    pub avg: u64,
    /// Burst ceiling, units per second (0: no burst).
    pub max: u64,
    /// How long a burst may last, in seconds.
    pub max_length: u64,
}

/// The parameter names of the six limits (QEMU's, with underscores): the average, its burst
/// ceiling and the burst's length, in [`ThrottleConfig::named`]'s order.
pub const THROTTLE_FIELDS: [[&str; 3]; 6] = [
    ["iops_total", "iops_total_max", "iops_total_max_length"],
    ["iops_read", "iops_read_max", "iops_read_max_length"],
    ["iops_write", "iops_write_max", "iops_write_max_length"],
    ["bps_total", "bps_total_max", "bps_total_max_length"],
    ["bps_read", "bps_read_max", "bps_read_max_length"],
    ["bps_write", "bps_write_max", "bps_write_max_length"],
];

/// A group's six limits, with QEMU's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThrottleConfig {
    /// I/Os per second, reads and writes together.
    pub iops_total: BurstLimit,
    /// Read I/Os per second.
    pub iops_read: BurstLimit,
    /// Write I/Os per second.
    pub iops_write: BurstLimit,
    /// Bytes per second, reads and writes together.
    pub bps_total: BurstLimit,
    /// Read bytes per second.
    pub bps_read: BurstLimit,
    /// Write bytes per second.
    pub bps_write: BurstLimit,
}

impl ThrottleConfig {
    /// The six limits with their QEMU names (`iops_total`, ... `bps_write`).
    pub fn named(&self) -> [(&'static str, BurstLimit); 6] {
        let l =
            [self.iops_total, self.iops_read, self.iops_write, self.bps_total, self.bps_read, self.bps_write];
        std::array::from_fn(|i| (THROTTLE_FIELDS[i][0], l[i]))
    }

    /// The six limits by name, to change (in [`ThrottleConfig::named`]'s order).
    pub fn named_mut(&mut self) -> [(&'static str, &mut BurstLimit); 6] {
        let [a, b, c, d, e, f] = THROTTLE_FIELDS;
        [
            (a[0], &mut self.iops_total),
            (b[0], &mut self.iops_read),
            (c[0], &mut self.iops_write),
            (d[0], &mut self.bps_total),
            (e[0], &mut self.bps_read),
            (f[0], &mut self.bps_write),
        ]
    }

    /// QEMU's rules: a ceiling needs an average and is not below it; a length needs a ceiling;
    /// a total excludes the read and write limits of the same kind.
    pub fn validate(&self) -> Result<(), QosError> {
        for (field, l) in self.named() {
            if l.avg > MAX_RATE || l.max > MAX_RATE {
                return Err(QosError::AboveMaximum { field, value: l.avg.max(l.max), max: MAX_RATE });
            }
            if l.max != 0 && l.avg == 0 {
                return Err(QosError::Invalid { field, reason: "a burst ceiling (max) needs an average" });
            }
            if l.max != 0 && l.max < l.avg {
                return Err(QosError::Invalid {
                    field,
                    reason: "the burst ceiling (max) is below the average",
                });
            }
            if l.max_length != 0 && l.max == 0 {
                return Err(QosError::Invalid {
                    field,
                    reason: "a burst length needs a burst ceiling (max)",
                });
            }
            if l.max_length > 86_400 {
                return Err(QosError::AboveMaximum { field, value: l.max_length, max: 86_400 });
            }
        }
        let both = |t: BurstLimit, r: BurstLimit, w: BurstLimit| t.avg != 0 && (r.avg != 0 || w.avg != 0);
        if both(self.iops_total, self.iops_read, self.iops_write) {
            return Err(QosError::Invalid {
                field: "iops_total",
                reason: "excludes iops_read and iops_write",
            });
        }
        if both(self.bps_total, self.bps_read, self.bps_write) {
            return Err(QosError::Invalid { field: "bps_total", reason: "excludes bps_read and bps_write" });
        }
        Ok(())
    }
}

/// One limit with its burst: the average and the ceiling.
#[derive(Debug)]
struct Burst {
    avg: SharedLimiter,
    ceiling: SharedLimiter,
}

impl Burst {
    fn new(tick_rate: u64) -> Burst {
        Burst { avg: SharedLimiter::new(tick_rate), ceiling: SharedLimiter::new(tick_rate) }
    }

    fn set(&self, l: BurstLimit, now: u64) {
        if l.max == 0 {
            self.avg.set(l.avg, self.avg.default_tolerance(), now);
            self.ceiling.set(0, self.ceiling.default_tolerance(), now);
            return;
        }
        // One second when the length is left out, as QEMU.
        let length = l.max_length.max(1);
        let tick_rate = self.avg.tick_rate();
        let burst =
            u128::from(length) * u128::from(l.max - l.avg) * u128::from(tick_rate) / u128::from(l.avg);
        let burst = (burst.min(u128::from(u64::MAX / 8)) as u64).max(self.avg.default_tolerance());
        self.avg.set(l.avg, burst, now);
        self.ceiling.set(l.max, self.ceiling.default_tolerance(), now);
    }
}

/// A throttle group: the limits its members share (every channel of every member disk).
#[derive(Debug)]
pub struct ThrottleGroup {
    /// In [`ThrottleConfig::named`]'s order.
    limits: [Burst; 6],
    /// Bumped after each [`ThrottleGroup::set`] (see `DiskQos`'s generation).
    generation: AtomicU64,
    config: std::sync::Mutex<ThrottleConfig>,
}

impl ThrottleGroup {
    /// A group with no limits, on a clock of `tick_rate` ticks per second.
    pub fn new(tick_rate: u64) -> ThrottleGroup {
        ThrottleGroup {
            limits: std::array::from_fn(|_| Burst::new(tick_rate)),
            generation: AtomicU64::new(0),
            config: std::sync::Mutex::new(ThrottleConfig::default()),
        }
    }

    /// Changes the group's limits at tick `now`; invalid ones change nothing.
    pub fn set(&self, config: ThrottleConfig, now: u64) -> Result<(), QosError> {
        config.validate()?;
        let mut held = self.config.lock().unwrap_or_else(|p| p.into_inner());
        for (b, (_, l)) in self.limits.iter().zip(config.named()) {
            b.set(l, now);
        }
        self.generation.fetch_add(1, Ordering::Release);
        *held = config;
        Ok(())
    }

    /// The limits in force.
    pub fn config(&self) -> ThrottleConfig {
        *self.config.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The rate the group's total limit (`iops_total`, else `bps_total`) allows over the next
    /// `slice` ticks from `now`: its ceiling while the average has burst budget left for a
    /// whole slice at the ceiling, else its average; 0 when neither total is set. What fair
    /// sharing divides ([`super::QosGroup`]).
    pub fn phase_limit(&self, now: u64, slice: u64) -> u64 {
        let b = if self.limits[0].avg.rate() != 0 { &self.limits[0] } else { &self.limits[3] };
        let (avg, max) = (b.avg.rate(), b.ceiling.rate());
        if avg == 0 || max <= avg {
            return avg;
        }
        // At the ceiling the average's debt grows by (max - avg) / avg ticks per tick.
        let needed = u128::from(slice) * u128::from(max - avg) / u128::from(avg);
        if u128::from(b.avg.headroom(now)) >= needed {
            max
        } else {
            avg
        }
    }
}

/// A channel's side of a [`ThrottleGroup`].
#[derive(Debug, Clone)]
pub struct ChannelThrottle {
    /// Average then ceiling, per limit in [`ThrottleConfig::named`]'s order.
    tokens: [[ChannelTokens; 2]; 6],
    /// The group's generation at the last slow path (`u64::MAX`: none yet), and per direction
    /// (read, write) the earliest expiry of the caches it spends.
    generation: u64,
    expires: [u64; 2],
}

impl Default for ChannelThrottle {
    fn default() -> ChannelThrottle {
        ChannelThrottle { tokens: Default::default(), generation: u64::MAX, expires: [0; 2] }
    }
}

impl ChannelThrottle {
    /// A channel that has read no limits yet.
    pub fn new() -> ChannelThrottle {
        ChannelThrottle::default()
    }

    /// Whether a request of `op` and `len` bytes may go at `now` (every limit of the group
    /// that applies allows it); if not, the tick to retry from, and nothing consumed.
    ///
    /// The common case is one load of the group's generation, one comparison of the expiry
    /// and eight of tokens (total and direction, IOPS and bytes, average and ceiling).
    #[inline]
    pub fn admit(&mut self, g: &ThrottleGroup, now: u64, op: IoOp, len: u64) -> Result<(), Wait> {
        // Total, then the direction's limit, for IOPS (0..3) and bytes (3..6).
        let dir = match op {
            IoOp::Read => 1,
            IoOp::Write => 2,
            IoOp::Flush | IoOp::Discard | IoOp::WriteZeroes => return Ok(()),
        };
        let order = [(0, 1), (dir, 1), (3, len), (3 + dir, len)];
        if g.generation.load(Ordering::Relaxed) == self.generation
            && now < self.expires[dir - 1]
            && order.iter().all(|&(i, n)| self.tokens[i][0].tokens >= n && self.tokens[i][1].tokens >= n)
        {
            for (i, n) in order {
                self.tokens[i][0].tokens -= n;
                self.tokens[i][1].tokens -= n;
            }
            return Ok(());
        }
        self.admit_slow(g, now, order, dir)
    }

    /// Asks each limit (refilling caches from the shared state as needed).
    #[cold]
    #[inline(never)]
    fn admit_slow(
        &mut self,
        g: &ThrottleGroup,
        now: u64,
        order: [(usize, u64); 4],
        dir: usize,
    ) -> Result<(), Wait> {
        // Read before the limits: a change during this call is seen by the next fast path.
        self.generation = g.generation.load(Ordering::Acquire);
        let mut result = Ok(());
        for (k, &(i, n)) in order.iter().enumerate() {
            let [avg, ceiling] = &mut self.tokens[i];
            let b = &g.limits[i];
            if let Err(w) = super::take_all(now, [(avg, &b.avg, n), (ceiling, &b.ceiling, n)]) {
                for &(j, m) in &order[..k] {
                    self.tokens[j][0].give_back(m);
                    self.tokens[j][1].give_back(m);
                }
                result = Err(w);
                break;
            }
        }
        self.expires[dir - 1] =
            order.iter().flat_map(|&(i, _)| self.tokens[i].iter().map(|t| t.expires)).min().unwrap_or(0);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::sim::{flood, Channel};

    const NS: u64 = 1_000_000_000;

    fn iops(avg: u64, max: u64, max_length: u64) -> ThrottleConfig {
        ThrottleConfig { iops_total: BurstLimit { avg, max, max_length }, ..Default::default() }
    }

    fn within(got: u64, want: u64, pct: u64) -> bool {
        got * 100 >= want * (100 - pct) && got * 100 <= want * (100 + pct)
    }

    #[test]
    fn qemu_rules_name_the_field() {
        let g = ThrottleGroup::new(NS);
        let bad = |c: ThrottleConfig| g.set(c, 0).unwrap_err();
        assert!(matches!(bad(iops(0, 10, 0)), QosError::Invalid { field: "iops_total", .. }));
        assert!(matches!(bad(iops(100, 10, 0)), QosError::Invalid { field: "iops_total", .. }));
        assert!(matches!(bad(iops(100, 0, 5)), QosError::Invalid { field: "iops_total", .. }));
        let mixed = ThrottleConfig {
            bps_total: BurstLimit { avg: 1 << 20, ..Default::default() },
            bps_write: BurstLimit { avg: 1 << 20, ..Default::default() },
            ..Default::default()
        };
        assert_eq!(
            bad(mixed),
            QosError::Invalid { field: "bps_total", reason: "excludes bps_read and bps_write" }
        );
        assert_eq!(g.config(), ThrottleConfig::default());
    }

    #[test]
    fn a_burst_delivers_its_ceiling_for_its_length_then_the_average_and_recovers_idle() {
        let g = ThrottleGroup::new(NS);
        g.set(iops(1_000, 5_000, 2), 0).unwrap();
        let mut ch = ChannelThrottle::new();
        let mut c = [Channel::new(|now| ch.admit(&g, now, IoOp::Read, 4096))];
        // The ceiling for 2 s (10,000), then the average.
        for (from, to, want) in [(0, 1, 5_000), (1, 2, 5_000), (2, 3, 1_000), (3, 4, 1_000)] {
            let n = flood(&mut c, from * NS, to * NS)[0];
            assert!(within(n, want, 1), "{from}..{to} s: {n}, want {want}");
        }
        // Full recovery takes length * (max - avg) / avg = 8 s idle; half of it, half a burst:
        // 1 s at the ceiling then the average.
        let n = flood(&mut c, 8 * NS, 9 * NS)[0];
        assert!(within(n, 5_000, 1), "after 4 s idle: {n}");
        let n = flood(&mut c, 9 * NS, 10 * NS)[0];
        assert!(within(n, 1_000, 2), "{n}");
        let n = flood(&mut c, 18 * NS, 20 * NS)[0];
        assert!(within(n, 10_000, 1), "after 8 s idle: {n}");
    }

    #[test]
    fn read_write_and_byte_limits_apply_by_direction() {
        let g = ThrottleGroup::new(NS);
        let mib = 1 << 20;
        g.set(
            ThrottleConfig {
                iops_read: BurstLimit { avg: 3_000, ..Default::default() },
                bps_write: BurstLimit { avg: 8 * mib, max: 16 * mib, max_length: 1 },
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let (mut r, mut w) = (ChannelThrottle::new(), ChannelThrottle::new());
        let mut c = [
            Channel::new(|now| r.admit(&g, now, IoOp::Read, 4096)),
            Channel::new(|now| w.admit(&g, now, IoOp::Write, 65536)),
        ];
        // Writes: 16 MiB/s for 1 s (256 of 64 KiB), then 8 MiB/s (128); reads 3,000/s.
        let n = flood(&mut c, 0, NS);
        assert!(within(n[0], 3_000, 1) && within(n[1], 256, 2), "{n:?}");
        let n = flood(&mut c, NS, 2 * NS);
        assert!(within(n[0], 3_000, 1) && within(n[1], 128, 2), "{n:?}");
    }
}
