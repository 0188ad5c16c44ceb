//! Logical volumes (SPDK's lvol): thin and thick volumes, snapshots and clones carved out of
//! one base device in clusters, with crash-consistent metadata.
//!
//! This crate is the synchronous core the bdev module stands on: the on-disk format
//! ([`mod@format`], documented in docs/lvol-format.md), the in-memory [`Store`] (volumes, cluster
//! maps, allocation, copy-on-write bookkeeping, free-cluster accounting) and its
//! `commit`/`load` against a page device ([`MetaDevice`]), plus a crash simulator ([`sim`]).
//! The bdev module built on it ([`bdev`]: lvstores on base bdevs, volumes as bdevs, SPDK's
//! `bdev_lvol_*` methods) is the only part that knows of bdevs and RPC.

// Requests arrive with buffers vouched for where they were described (`Iovecs::from_raw`);
// the tests describe buffers of their own.
#![cfg_attr(not(test), forbid(unsafe_code))]

pub mod bdev;
pub mod crc;
mod device;
mod error;
pub mod format;
pub mod sim;
mod store;
mod volume;

pub use device::{DeviceError, MemDevice, MetaDevice, Page};
pub use error::{check_name, LvolError};
pub use fp_bdev::Uuid;
pub use store::{CommitPlan, Store, StoreOptions};
pub use volume::{ExternalParent, NewCluster, ReadSource, Volume, WriteTarget};

/// Size of a metadata page: the unit of every metadata read and write (the atomic write unit
/// of NVMe drives, and what SPDK's blobstore uses).
pub const PAGE_SIZE: usize = 4096;

/// Longest store or volume name, in bytes (SPDK's `SPDK_LVS_NAME_MAX` / `SPDK_LVOL_NAME_MAX`
/// less the terminating NUL).
pub const NAME_MAX: usize = 63;

/// A cluster map entry that maps nothing (read zeroes, or the parent's data).
pub const UNALLOCATED: u32 = u32::MAX;
