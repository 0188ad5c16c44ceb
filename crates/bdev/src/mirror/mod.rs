//! The back-end mirror: a job that copies a live [`Disk`](crate::Disk) to any bdev, in the
//! manner of QEMU's `blockdev-mirror` with `copy-mode=write-blocking`.
//!
//! A dirty bitmap starts all set; the source disk's channels mark the chunks of every write
//! that completes (`disk/mirror.rs`), the copier ([`MirrorCopier`], one reactor) copies dirty
//! chunks until none is left, then every channel writes both disks ("ready") until the job is
//! completed or cancelled; with [`CopyMode::WriteBlocking`] channels write both disks from the
//! start. docs/mirror.md has the design and why it is correct.

mod bitmap;
mod copier;
mod error;
mod job;
mod shared;

pub use bitmap::{DEFAULT_GRANULARITY, MAX_BITMAP_BYTES, MAX_GRANULARITY};
pub use copier::{CopierPoll, MirrorCopier, MirrorStart};
pub use error::MirrorError;
pub use job::{MirrorJob, MirrorOptions, MirrorStatus};
pub use shared::{CopyMode, MirrorState};

pub(crate) use shared::MirrorShared;

#[cfg(test)]
mod tests;
