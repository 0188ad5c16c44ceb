//! Quality of service: rate limits that every channel of a disk shares across reactors without
//! a lock, QEMU-style burst groups, and weighted fair sharing inside a group.
//!
//! The pieces: [`SharedLimiter`] (one limit: a virtual-time bucket in one atomic word, taken
//! by channels a grant at a time through their [`ChannelTokens`]), [`DiskQos`] (SPDK's four
//! per-disk limits), [`ThrottleGroup`] (QEMU's six limits with bursts) and [`FairGroup`]
//! (weighted shares of one group limit, recomputed each slice). A request over a limit is never
//! refused: the caller learns the tick to retry from ([`Wait`]) and holds it in its channel.
//! docs/qos.md has the design, its error bounds and how the disk layer uses it.

pub mod clock;
mod fair;
mod group;
mod limiter;
mod limits;
mod throttle;

#[cfg(test)]
mod sim;

pub use clock::{Clock, FakeClock, TickClock};
pub use fair::{FairChannel, FairGroup, LimitSource, MemberId, MAX_MEMBERS, MAX_WEIGHT};
pub use group::{FairOn, GroupChannel, QosGroup};
pub use limiter::{ChannelTokens, SharedLimiter, Wait, MAX_RATE, QUANTUM_NS};
pub use limits::{ChannelQos, DiskQos, QosLimits, MIN_IOS_PER_SEC, MIN_MBYTES_PER_SEC};
pub use throttle::{BurstLimit, ChannelThrottle, ThrottleConfig, ThrottleGroup, THROTTLE_FIELDS};

/// Why a QoS setting was refused; `field` names the parameter (SPDK's or QEMU's name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    #[error("{field}: {value} is below the minimum of {min}")]
    BelowMinimum { field: &'static str, value: u64, min: u64 },
    #[error("{field}: {value} is above the maximum of {max}")]
    AboveMaximum { field: &'static str, value: u64, max: u64 },
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: &'static str },
    #[error("weight: {0} is not a weight (1 to 65535)")]
    BadWeight(u64),
    #[error("the group is full ({0} members)")]
    GroupFull(usize),
    #[error("no member {0} in this group")]
    NoMember(usize),
}

/// Takes `n` units from each limit in turn; if one refuses, gives back what the others gave,
/// so a request passes only when every limit allows it and costs nothing otherwise.
#[inline(always)]
fn take_all<const N: usize>(
    now: u64,
    items: [(&mut ChannelTokens, &SharedLimiter, u64); N],
) -> Result<(), Wait> {
    let mut items = items;
    for i in 0..N {
        let (tokens, lim, n) = &mut items[i];
        if let Err(w) = tokens.take(lim, now, *n) {
            for (tokens, _, n) in &mut items[..i] {
                tokens.give_back(*n);
            }
            return Err(w);
        }
    }
    Ok(())
}
