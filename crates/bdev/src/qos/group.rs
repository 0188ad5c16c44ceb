//! A QoS group as the disk layer uses it: QEMU's six limits with bursts ([`ThrottleGroup`])
//! that all member disks share, and weighted fair sharing ([`FairGroup`]) of the group's total
//! limit among the members.
//!
//! Fair sharing divides one resource: the group's `iops_total` when it has one, else its
//! `bps_total`; a group with neither (only read or write limits) shares first come, first
//! served, as QEMU's groups do. With a burst on that limit, the fair share follows the burst:
//! at each slice end the divided limit is the ceiling while the average still has burst budget
//! for another slice at the ceiling, else the average, so weights hold during and after a burst.

use std::sync::Arc;

use super::{
    ChannelThrottle, FairChannel, FairGroup, MemberId, QosError, ThrottleConfig, ThrottleGroup, Wait,
};
use crate::IoOp;

/// The resource a group's fair sharing divides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FairOn {
    /// `iops_total`: each request costs 1.
    Iops,
    /// `bps_total`: each request costs its length.
    Bytes,
}

impl FairOn {
    /// The QEMU name of the limit divided.
    pub fn name(self) -> &'static str {
        match self {
            FairOn::Iops => "iops_total",
            FairOn::Bytes => "bps_total",
        }
    }

    fn of(c: &ThrottleConfig) -> Option<FairOn> {
        if c.iops_total.avg != 0 {
            Some(FairOn::Iops)
        } else if c.bps_total.avg != 0 {
            Some(FairOn::Bytes)
        } else {
            None
        }
    }
}

/// A group of disks: shared limits with bursts, and weighted shares of the total.
#[derive(Debug)]
pub struct QosGroup {
    name: String,
    throttle: Arc<ThrottleGroup>,
    fair: FairGroup,
    /// What fair sharing divides (control plane writes it with the config; channels read it
    /// at their refresh).
    fair_on: std::sync::Mutex<Option<FairOn>>,
}

impl QosGroup {
    /// A group without limits, on a clock of `tick_rate` ticks per second.
    pub fn new(name: &str, tick_rate: u64) -> QosGroup {
        let throttle = Arc::new(ThrottleGroup::new(tick_rate));
        let fair = FairGroup::new(tick_rate, FairGroup::default_slice(tick_rate));
        let t = throttle.clone();
        let slice = FairGroup::default_slice(tick_rate);
        // The divided limit at a slice end: the burst phase of the throttle's own limit.
        fair.set_limit_source(Box::new(move |now| t.phase_limit(now, slice)));
        // The throttle holds the group's total to its limits, so a member may run a slice
        // ahead of its share: a light member's requests that bunch up after a pause (a paced
        // guest at QD1) go at once instead of waiting and being taken for a backlog.
        fair.set_member_tolerance(slice);
        QosGroup { name: name.to_string(), throttle, fair, fair_on: std::sync::Mutex::new(None) }
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Changes the group's limits at `now`; invalid ones change nothing.
    pub fn set(&self, config: ThrottleConfig, now: u64) -> Result<(), QosError> {
        let mut fair_on = self.fair_on.lock().unwrap_or_else(|p| p.into_inner());
        self.throttle.set(config, now)?;
        *fair_on = FairOn::of(&config);
        let limit = match *fair_on {
            Some(FairOn::Iops) => config.iops_total,
            Some(FairOn::Bytes) => config.bps_total,
            None => Default::default(),
        };
        // The ceiling first if there is one: a new config starts with its burst budget whole.
        let start = if limit.max != 0 { limit.max } else { limit.avg };
        self.fair.set_limit(start, now)
    }

    /// The limits in force.
    pub fn config(&self) -> ThrottleConfig {
        self.throttle.config()
    }

    /// What fair sharing divides, if anything.
    pub fn fair_on(&self) -> Option<FairOn> {
        *self.fair_on.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a member of `weight` (1 to 65535). Every member's rate becomes its weighted share
    /// of the limit at once (the next slice redistributes by demand), so a group reads as
    /// configured before any I/O.
    pub fn join(&self, weight: u64, now: u64) -> Result<MemberId, QosError> {
        let id = self.fair.join(weight, now)?;
        self.fair.set_limit(self.fair.limit(), now)?;
        Ok(id)
    }

    /// Removes member `id` from the group.
    pub fn leave(&self, id: MemberId) -> Result<(), QosError> {
        self.fair.leave(id)
    }

    /// Changes a member's weight; every member's rate becomes its weighted share at once, as
    /// on a join.
    pub fn set_weight(&self, id: MemberId, weight: u64, now: u64) -> Result<(), QosError> {
        self.fair.set_weight(id, weight)?;
        self.fair.set_limit(self.fair.limit(), now)
    }

    /// A member's fair rate in force (units of [`QosGroup::fair_on`] per second; 0 without
    /// fair sharing).
    pub fn member_rate(&self, id: MemberId) -> u64 {
        match self.fair_on() {
            Some(_) => self.fair.member_rate(id),
            None => 0,
        }
    }
}

/// A channel's side of a [`QosGroup`]: its share's tokens and the group limits' tokens. The
/// two are asked in turn (share, then limits), so a request refused by the limits keeps its
/// share and asks only the limits again ([`GroupChannel::admit`]'s `stage`).
#[derive(Debug)]
pub struct GroupChannel {
    fair_on: Option<FairOn>,
    fair: FairChannel,
    throttle: ChannelThrottle,
}

impl GroupChannel {
    /// A channel of member `id` of `group`.
    pub fn new(group: &QosGroup, id: MemberId) -> GroupChannel {
        GroupChannel {
            fair_on: group.fair_on(),
            fair: FairChannel::new(id),
            throttle: ChannelThrottle::new(),
        }
    }

    /// Follows a change of the group's config (what fair sharing divides), keeping the
    /// tokens the channel holds.
    pub fn refresh(&mut self, group: &QosGroup) {
        self.fair_on = group.fair_on();
    }

    /// Whether a request may go at `now`. `stage` is how far it got before (0: new; 1: its
    /// share was refused; 2: it has its share) and is advanced on success of each part, so
    /// a retry asks only what refused it.
    #[inline]
    pub fn admit(&mut self, g: &QosGroup, now: u64, op: IoOp, len: u64, stage: &mut u8) -> Result<(), Wait> {
        if *stage < 2 {
            let data = matches!(op, IoOp::Read | IoOp::Write);
            match self.fair_on {
                Some(on) if data => {
                    let n = if on == FairOn::Iops { 1 } else { len };
                    let retry = *stage == 1;
                    if let Err(w) = self.fair.admit(&g.fair, now, n, retry) {
                        *stage = 1;
                        return Err(w);
                    }
                }
                _ => {}
            }
            *stage = 2;
        }
        self.throttle.admit(&g.throttle, now, op, len)
    }
}
