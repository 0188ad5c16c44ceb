//! The raid bdev's per-core channels, one file per level, and the pieces they share: the
//! parent slab ([`slab`]), the bases' channels opened lazily per layout epoch ([`bases`]) and
//! the splitting of a request by strip or base boundaries ([`split`], for raid0 and concat).
//!
//! Nothing here allocates per request: every table is sized when the channel is opened, and a
//! request that finds no room is refused with `SubmitError::Busy`.

pub mod bases;
pub mod concat;
pub mod raid0;
pub mod raid1;
pub mod slab;
pub mod split;

pub use concat::ConcatMap;
pub use raid0::Raid0Map;
pub use raid1::Raid1Channel;
pub use split::{SplitChannel, SplitMap};

/// Requests one channel keeps in flight upward (the parent slab's size).
pub const MAX_PARENTS: usize = 256;

#[cfg(test)]
mod tests;
