//! Quality of service: rate limits that every channel of a disk shares across reactors without
//! a lock, QEMU-style burst groups, and weighted fair sharing inside a group.
//!
//! The pieces: [`SharedLimiter`] (one limit: a virtual-time bucket in one atomic word, taken
//! by channels a grant at a time through their [`ChannelTokens`]), [`DiskQos`] (SPDK's four
//! per-disk limits), [`ThrottleGroup`] (QEMU's six limits with bursts) and [`FairGroup`]
//! (weighted shares of one group limit, recomputed each slice). A request over a limit is never
//! refused: the caller learns the tick to retry from ([`Wait`]) and holds it in its channel.
//! docs/qos.md has the design, its error bounds and how the disk layer uses it.

mod fair;
mod group;
mod limiter;
mod limits;
mod throttle;

#[cfg(test)]
mod sim;

pub use crate::clock::{Clock, FakeClock, TickClock};
pub use fair::{FairChannel, FairGroup, LimitSource, MemberId, MAX_MEMBERS, MAX_WEIGHT};
pub use group::{FairOn, GroupChannel, QosGroup};
pub use limiter::{ChannelTokens, SharedLimiter, Wait, MAX_RATE, QUANTUM_NS};
pub use limits::{ChannelQos, DiskQos, QosLimits, MIN_IOS_PER_SEC, MIN_MBYTES_PER_SEC};
pub use throttle::{BurstLimit, ChannelThrottle, ThrottleConfig, ThrottleGroup, THROTTLE_FIELDS};

/// Why a QoS setting was refused; `field` names the parameter (SPDK's or QEMU's name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    /// A limit below what the limiter can enforce.
    #[error("{field}: {value} is below the minimum of {min}")]
    BelowMinimum {
        /// The parameter.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The smallest accepted.
        min: u64,
    },
    /// A limit above what the limiter can represent.
    #[error("{field}: {value} is above the maximum of {max}")]
    AboveMaximum {
        /// The parameter.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A combination of values that makes no sense (a burst below its average, say).
    #[error("{field}: {reason}")]
    Invalid {
        /// The parameter.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A fair-share weight outside 1 to 65535.
    #[error("weight: {0} is not a weight (1 to 65535)")]
    BadWeight(u64),
    /// The group has [`MAX_MEMBERS`] members already.
    #[error("the group is full ({0} members)")]
    GroupFull(usize),
    /// No member with this id.
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
