//! fp-backup: the backup store library. Backups of flashpath disks go to an object store (S3,
//! Ceph's RADOS Gateway, or a local directory) as content-addressed chunks and one manifest
//! per backup; see docs/backup.md, "On-store format" and "Backup store".
//!
//! * [`Store::open`] opens a store from a [`StoreConfig`] (a URL and S3 options).
//! * [`backup`] takes a full or incremental backup of a disk read through a [`ChunkSource`],
//!   with a [`Job`] the caller polls (progress), throttles (speed limit) and cancels.
//! * [`Store::manifest`] loads a backup; [`ChunkReader`] fetches and checks its chunks (a
//!   restore, the live-restore bdev).
//! * [`Store::list`], [`Store::verify`], [`Store::delete`], [`Store::gc`]: the catalogue.
//!
//! Everything here runs on control-plane threads and blocks; never call it from a reactor or
//! from inside an async runtime.
//!
//! The store (all of the above but the format) is the default feature `store`; without it the
//! crate is the on-store format only: [`encode_chunk`] / [`decode_chunk`], [`Manifest`],
//! [`ChunkId`] and [`BackupKey`], without object_store's async runtime and HTTPS stack (what
//! the fuzz targets build).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// The crate documentation above names the store's items, which exist only with `store`.
#![cfg_attr(not(feature = "store"), allow(rustdoc::broken_intra_doc_links))]

#[cfg(feature = "store")]
mod backup;
#[cfg(feature = "store")]
mod catalogue;
mod chunk;
mod chunk_id;
#[cfg(feature = "store")]
mod config;
mod error;
mod key;
mod manifest;
#[cfg(feature = "store")]
mod reader;
#[cfg(feature = "store")]
mod store;

#[cfg(all(test, feature = "store"))]
mod tests;

#[cfg(feature = "store")]
pub use backup::{backup, BackupOptions, ChunkSource, Job, Plan, Progress, ProgressSnapshot};
#[cfg(feature = "store")]
pub use catalogue::{BackupInfo, GcReport, VerifyReport, GC_GRACE};
pub use chunk::{
    decode_chunk, decode_chunk_unchecked, encode_chunk, CHUNK_HEADER_LEN, CHUNK_MAGIC, CHUNK_VERSION,
};
pub use chunk_id::ChunkId;
#[cfg(feature = "store")]
pub use config::{StoreConfig, CONNECT_TIMEOUT, REQUEST_TIMEOUT};
pub use error::{BackupError, ErrorKind, Result};
pub use key::{BackupKey, MIN_KEY_BYTES};
pub use manifest::{
    check_backup_id, check_name, manifest_key, new_backup_id, BackupKind, Manifest, MANIFEST_MAGIC,
    MANIFEST_VERSION, MAX_MANIFEST_JSON,
};
#[cfg(feature = "store")]
pub use reader::{ChunkReader, RawChunk};
#[cfg(feature = "store")]
pub use store::{RetryPolicy, Store};

/// The smallest chunk size: 64 KiB.
pub const MIN_CHUNK_SIZE: u64 = 64 << 10;
/// The largest chunk size: 16 MiB.
pub const MAX_CHUNK_SIZE: u64 = 16 << 20;
/// The default chunk size: 1 MiB.
pub const DEFAULT_CHUNK_SIZE: u64 = 1 << 20;

/// Checks a chunk size: a power of two from 64 KiB to 16 MiB.
pub fn check_chunk_size(chunk_size: u64) -> Result<()> {
    if chunk_size.is_power_of_two() && (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk_size) {
        Ok(())
    } else {
        Err(error::invalid("chunk_size", format!("{chunk_size}: a power of two from 64 KiB to 16 MiB")))
    }
}

/// The number of chunks of a disk of `disk_size` bytes (the last one may be short).
pub fn chunk_count(disk_size: u64, chunk_size: u64) -> u64 {
    disk_size.div_ceil(chunk_size)
}

/// The chunks that byte extents `(offset, length)` touch, sorted and without repeats, cut to a
/// disk of `disk_size` bytes: what an incremental backup re-reads for a dirty bitmap's extents
/// (`bdev_dirty_bitmap_get_extents`). A bitmap whose granularity is bigger than the chunk
/// marks every chunk its bit covers; one whose granularity is smaller marks the chunk its
/// extent falls in.
pub fn chunks_of_extents(
    extents: impl IntoIterator<Item = (u64, u64)>,
    chunk_size: u64,
    disk_size: u64,
) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for (offset, length) in extents {
        if length == 0 || offset >= disk_size {
            continue;
        }
        let end = offset.saturating_add(length).min(disk_size);
        let (first, last) = (offset / chunk_size, (end - 1) / chunk_size);
        out.extend(first..=last);
    }
    out.sort_unstable();
    out.dedup();
    out
}
