//! Weighted fair sharing of one group limit: when the members' demand exceeds the limit, each
//! active member gets a share proportional to its weight; what a member does not use goes to
//! the others at the next slice (work-conserving).
//!
//! Each member has its own [`SharedLimiter`], which its channels use as any limit (grants
//! cached per channel, no lock). Time is cut in slices (10 ms by default). The first channel
//! that sees a slice end wins a compare-and-swap on the slice's start and recomputes every
//! member's rate from their demand in the slice: weighted max-min fairness ("water-filling")
//! over each member's demand: unbounded if any of its requests waited in the slice (or still
//! waits), else its arrivals per second. A member that wants less than its share gets what it
//! wants plus an eighth; the rest is split by weight among the others; what is
//! left when every member is satisfied is split by weight among all. The rates always add up
//! to the group limit (plus one unit per second per member with no share, which keeps its
//! first request from waiting for a slice end). Channels count arrivals and admissions
//! locally and add them to their member's counters at most once per millisecond or when they
//! wait, so the shared lines are written rarely.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{ChannelTokens, QosError, SharedLimiter, Wait, MAX_RATE, QUANTUM_NS};

/// The most members a group holds (the recomputation works on fixed arrays on the stack).
pub const MAX_MEMBERS: usize = 64;
/// The largest weight.
pub const MAX_WEIGHT: u64 = 65_535;

/// A member's place in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberId(pub usize);

#[repr(align(128))]
#[derive(Debug)]
struct Member {
    /// 0: a free place.
    weight: AtomicU64,
    limiter: SharedLimiter,
    /// Units of requests that arrived and that were admitted, ever (as flushed by channels).
    arrived: AtomicU64,
    served: AtomicU64,
    /// `arrived` at the last recomputation (written only by the recomputing channel).
    arrived_mark: AtomicU64,
    /// Set when one of the member's requests had to wait during the slice.
    waited: AtomicBool,
}

#[repr(align(128))]
#[derive(Debug)]
struct SliceStart(AtomicU64);

/// A group whose limit its members share by weight.
pub struct FairGroup {
    /// Units per second for the whole group; 0: no limit.
    limit: AtomicU64,
    slice: u64,
    quantum: u64,
    tick_rate: u64,
    slice_start: SliceStart,
    members: Box<[Member]>,
    /// Where a slice end reads the limit to divide, when it varies (a burst); else `limit`.
    limit_source: std::sync::OnceLock<LimitSource>,
    /// The tolerance of a member that got what it asked for (a light one), in ticks (0: the
    /// limiter's default, two quanta, as every backlogged member has).
    member_tolerance: AtomicU64,
}

/// The limit to divide at a slice ending at the given tick.
pub type LimitSource = Box<dyn Fn(u64) -> u64 + Send + Sync>;

impl std::fmt::Debug for FairGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairGroup").field("limit", &self.limit()).finish_non_exhaustive()
    }
}

impl FairGroup {
    /// A group without a limit, on a clock of `tick_rate` ticks per second, recomputing shares
    /// every `slice` ticks, for up to [`MAX_MEMBERS`] members.
    pub fn new(tick_rate: u64, slice: u64) -> FairGroup {
        let tick_rate = tick_rate.max(1);
        FairGroup {
            limit: AtomicU64::new(0),
            slice: slice.max(1),
            quantum: (u128::from(tick_rate) * u128::from(QUANTUM_NS) / 1_000_000_000).max(1) as u64,
            tick_rate,
            slice_start: SliceStart(AtomicU64::new(0)),
            members: (0..MAX_MEMBERS)
                .map(|_| Member {
                    weight: AtomicU64::new(0),
                    limiter: SharedLimiter::new(tick_rate),
                    arrived: AtomicU64::new(0),
                    served: AtomicU64::new(0),
                    arrived_mark: AtomicU64::new(0),
                    waited: AtomicBool::new(false),
                })
                .collect(),
            limit_source: std::sync::OnceLock::new(),
            member_tolerance: AtomicU64::new(0),
        }
    }

    /// How far ahead of its share a light member (one whose demand was met) may run, in
    /// ticks, from the next slice on. A group whose total another limit enforces can let a
    /// light member bunch its requests after a pause without waiting (docs/qos.md);
    /// backlogged members keep the default, so that their shares, which add up to the limit,
    /// stay exact.
    pub fn set_member_tolerance(&self, ticks: u64) {
        self.member_tolerance.store(ticks, Ordering::Relaxed);
    }

    /// Makes each slice end divide what `source` returns for its tick rather than the set
    /// limit (which still says whether there is a limit at all). Once per group.
    pub fn set_limit_source(&self, source: LimitSource) {
        let _ = self.limit_source.set(source);
    }

    /// The default slice: 10 ms of a clock of `tick_rate`.
    pub fn default_slice(tick_rate: u64) -> u64 {
        tick_rate / 100
    }

    /// Sets the group limit at `now` (0 removes it). Each member's rate becomes its weighted
    /// share at once, dropping what channels cached at the old rates (no burst); the next
    /// slice redistributes by demand.
    pub fn set_limit(&self, rate: u64, now: u64) -> Result<(), QosError> {
        if rate > MAX_RATE {
            return Err(QosError::AboveMaximum { field: "limit", value: rate, max: MAX_RATE });
        }
        self.limit.store(rate, Ordering::Relaxed);
        let total: u64 = self.members.iter().map(|m| m.weight.load(Ordering::Relaxed)).sum();
        for m in self.members.iter() {
            let w = m.weight.load(Ordering::Relaxed);
            if w == 0 {
                continue;
            }
            let share = if rate == 0 {
                0
            } else {
                (u128::from(rate) * u128::from(w) / u128::from(total)).max(1) as u64
            };
            m.limiter.set(share, m.limiter.default_tolerance(), now);
        }
        Ok(())
    }

    /// The group limit being divided, in units per second (0: none).
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    fn check_weight(weight: u64) -> Result<(), QosError> {
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(QosError::BadWeight(weight));
        }
        Ok(())
    }

    /// Adds a member of `weight` (1 to [`MAX_WEIGHT`]). It starts with one unit per second:
    /// its first request goes at once, and the next slice gives it its share of the demand.
    pub fn join(&self, weight: u64, now: u64) -> Result<MemberId, QosError> {
        Self::check_weight(weight)?;
        for (i, m) in self.members.iter().enumerate() {
            if m.weight.compare_exchange(0, weight, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                for c in [&m.arrived, &m.served, &m.arrived_mark] {
                    c.store(0, Ordering::Relaxed);
                }
                m.waited.store(false, Ordering::Relaxed);
                let rate = if self.limit() == 0 { 0 } else { 1 };
                m.limiter.set(rate, m.limiter.default_tolerance(), now);
                return Ok(MemberId(i));
            }
        }
        Err(QosError::GroupFull(MAX_MEMBERS))
    }

    /// Changes a member's weight; it counts from the next slice.
    pub fn set_weight(&self, id: MemberId, weight: u64) -> Result<(), QosError> {
        Self::check_weight(weight)?;
        let m = self.members.get(id.0).ok_or(QosError::NoMember(id.0))?;
        m.weight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| (w != 0).then_some(weight))
            .map(|_| ())
            .map_err(|_| QosError::NoMember(id.0))
    }

    /// Removes a member (its channels must be closed or moved first); its share goes to the
    /// others at the next slice.
    pub fn leave(&self, id: MemberId) -> Result<(), QosError> {
        let m = self.members.get(id.0).ok_or(QosError::NoMember(id.0))?;
        if m.weight.swap(0, Ordering::AcqRel) == 0 {
            return Err(QosError::NoMember(id.0));
        }
        Ok(())
    }

    /// A member's rate in force (units per second; 0 when the group has no limit).
    pub fn member_rate(&self, id: MemberId) -> u64 {
        self.members.get(id.0).map_or(0, |m| m.limiter.rate())
    }

    /// Ends the slice that began at `start` if this caller is first, and recomputes the rates.
    #[cold]
    #[inline(never)]
    fn end_slice(&self, start: u64, now: u64) {
        if self.slice_start.0.compare_exchange(start, now, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        let mut limit = self.limit();
        if limit == 0 {
            return;
        }
        if let Some(source) = self.limit_source.get() {
            limit = source(now).max(1);
        }
        let elapsed = u128::from(now.saturating_sub(start).max(1));
        let tick_rate = u128::from(self.tick_rate);
        let mut weight = [0u64; MAX_MEMBERS];
        let mut want = [0u64; MAX_MEMBERS];
        for (i, m) in self.members.iter().enumerate() {
            weight[i] = m.weight.load(Ordering::Acquire);
            let arrived = m.arrived.load(Ordering::Relaxed);
            let served = m.served.load(Ordering::Relaxed);
            let arrivals = arrived.saturating_sub(m.arrived_mark.swap(arrived, Ordering::Relaxed));
            let waited = m.waited.swap(false, Ordering::Relaxed);
            if waited || arrived > served {
                // Requests waited: it wants more than it got, how much more is unknown.
                want[i] = MAX_RATE;
                continue;
            }
            let demand = u128::from(arrivals) * tick_rate / elapsed;
            let demand = demand.min(u128::from(MAX_RATE)) as u64;
            want[i] = demand + demand / 8;
        }
        let rate = water_fill(limit, &weight, &want);
        let light = self.member_tolerance.load(Ordering::Relaxed);
        for (i, m) in self.members.iter().enumerate() {
            if weight[i] != 0 {
                if light != 0 {
                    let satisfied = want[i] != MAX_RATE && rate[i] >= want[i];
                    m.limiter.set_tolerance(if satisfied { light } else { m.limiter.default_tolerance() });
                }
                m.limiter.retune(rate[i].max(1), now);
            }
        }
    }
}

/// Weighted max-min fair division of `limit` among the members with a weight: members that
/// want less than their weighted share of what is left get what they want, the others split
/// the rest by weight; what is left when all are satisfied is split by weight among all.
/// Rounding remainders go to the first members, so the result adds up to `limit` exactly.
fn water_fill(limit: u64, weight: &[u64; MAX_MEMBERS], want: &[u64; MAX_MEMBERS]) -> [u64; MAX_MEMBERS] {
    let mut rate = [0u64; MAX_MEMBERS];
    let mut open = [false; MAX_MEMBERS];
    for i in 0..MAX_MEMBERS {
        open[i] = weight[i] != 0;
    }
    let mut left = limit;
    loop {
        let total: u64 = (0..MAX_MEMBERS).filter(|&i| open[i]).map(|i| weight[i]).sum();
        if total == 0 {
            break;
        }
        let (mut satisfied, mut progress) = (0, false);
        for i in 0..MAX_MEMBERS {
            if open[i] && u128::from(want[i]) * u128::from(total) <= u128::from(left) * u128::from(weight[i])
            {
                rate[i] = want[i];
                open[i] = false;
                satisfied += want[i];
                progress = true;
            }
        }
        if progress {
            // Each satisfied member took at most its share of `left`, so this cannot underflow.
            left -= satisfied;
            if (0..MAX_MEMBERS).any(|i| open[i]) {
                continue;
            }
            break;
        }
        split(left, weight, &open, &mut rate);
        return rate;
    }
    // Everyone is satisfied: the rest by weight among all.
    let all: [bool; MAX_MEMBERS] = std::array::from_fn(|i| weight[i] != 0);
    split(left, weight, &all, &mut rate);
    rate
}

/// Adds `amount` to the members in `among`, by weight, the rounding remainder one unit each to
/// the first of them.
fn split(
    amount: u64,
    weight: &[u64; MAX_MEMBERS],
    among: &[bool; MAX_MEMBERS],
    rate: &mut [u64; MAX_MEMBERS],
) {
    let total: u64 = (0..MAX_MEMBERS).filter(|&i| among[i]).map(|i| weight[i]).sum();
    if total == 0 {
        return;
    }
    let mut given = 0;
    for i in 0..MAX_MEMBERS {
        if among[i] {
            let r = (u128::from(amount) * u128::from(weight[i]) / u128::from(total)) as u64;
            rate[i] += r;
            given += r;
        }
    }
    for i in (0..MAX_MEMBERS).filter(|&i| among[i]).take((amount - given) as usize) {
        rate[i] += 1;
    }
}

/// A channel of one member: its cached tokens and its uncounted arrivals and admissions.
#[derive(Debug, Clone)]
pub struct FairChannel {
    member: usize,
    tokens: ChannelTokens,
    arrived: u64,
    served: u64,
    flushed_at: u64,
}

impl FairChannel {
    /// The channel-side state of member `id`.
    pub fn new(id: MemberId) -> FairChannel {
        FairChannel { member: id.0, tokens: ChannelTokens::new(), arrived: 0, served: 0, flushed_at: 0 }
    }

    /// Whether a request of cost `n` may go at `now`; if not, the tick to retry from (at the
    /// latest the slice's end, when the shares may change). `retry` says the request was
    /// refused before (it is counted as demand once).
    #[inline]
    pub fn admit(&mut self, g: &FairGroup, now: u64, n: u64, retry: bool) -> Result<(), Wait> {
        let start = g.slice_start.0.load(Ordering::Acquire);
        if now >= start.saturating_add(g.slice) {
            // Counted before this request arrives, so the member's counts show only requests
            // that were served or are waiting.
            self.flush(g, now);
            g.end_slice(start, now);
        }
        if !retry {
            self.arrived += n;
        }
        let m = &g.members[self.member];
        match self.tokens.take(&m.limiter, now, n) {
            Ok(()) => {
                self.served += n;
                // After a wait, at once: the member must not look backlogged any longer.
                if retry || now >= self.flushed_at.saturating_add(g.quantum) {
                    self.flush(g, now);
                }
                Ok(())
            }
            Err(Wait(at)) => {
                self.flush(g, now);
                m.waited.store(true, Ordering::Relaxed);
                let end = g.slice_start.0.load(Ordering::Acquire).saturating_add(g.slice);
                Err(Wait(at.min(end).max(now + 1)))
            }
        }
    }

    /// Adds the local counts to the member's.
    #[cold]
    fn flush(&mut self, g: &FairGroup, now: u64) {
        let m = &g.members[self.member];
        if self.arrived != 0 {
            m.arrived.fetch_add(self.arrived, Ordering::Relaxed);
        }
        if self.served != 0 {
            m.served.fetch_add(self.served, Ordering::Relaxed);
        }
        (self.arrived, self.served, self.flushed_at) = (0, 0, now);
    }
}

#[cfg(test)]
mod tests;
