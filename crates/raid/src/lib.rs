//! Raid bdevs (SPDK's bdev_raid): raid0 (striping), concat and raid1 (mirroring) over any
//! bdevs: local disks, Ceph RBD images, or other daemons' disks through the NBD client or the
//! NVMe/TCP initiator.
//!
//! raid1 keeps a superblock and a write-intent bitmap on every base (after Linux md's), so a
//! replica that comes back after an outage is rebuilt from the regions written meanwhile, not
//! in full, and a daemon that crashed mid-rebuild resumes it. docs/raid.md is the reference.
//!
//! * [`format`](mod@format): the superblock and bitmap pages as bytes (pure, fuzzed);
//! * [`sim`]: the crash simulator for superblock and bitmap updates;
//! * [`intent`]: the in-memory write-intent map the channels and the owner share;
//! * [`shared`]: what a raid's channels and its owner share (layout, slots, counters);
//! * [`owner`]: the thread per raid that persists metadata, handles failures and rebuilds;
//! * [`device`], [`channel`]: the bdev and its per-core channels;
//! * [`rpc`], [`examine`]: SPDK's `bdev_raid_*` methods and assembly from superblocks.

// Requests arrive with buffers vouched for where they were described (`Iovecs::from_raw`);
// the tests describe buffers of their own.
#![cfg_attr(not(test), forbid(unsafe_code))]

pub mod channel;
pub mod device;
mod error;
pub mod examine;
pub mod format;
pub mod intent;
mod level;
pub mod meta_io;
mod metrics;
pub mod owner;
pub mod rebuild;
pub mod rebuild_io;
pub mod rpc;
pub mod shared;
pub mod sim;
mod table;

pub use error::RaidError;
pub use format::{SlotRecord, Superblock};
pub use intent::{IntentMap, WriteTicket};
pub use level::{RaidLevel, SlotState};
pub use owner::{BaseSpec, OwnerHandle, OwnerOptions, Reactors};
pub use table::RaidModule;
