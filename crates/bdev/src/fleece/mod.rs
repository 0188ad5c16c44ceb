//! A point-in-time view of a live disk (QEMU's fleecing: a copy-before-write filter above the
//! source and a `snapshot-access` node), for backups that read a consistent image while the
//! guest writes.
//!
//! Before a guest write, write-zeroes or discard changes a chunk for the first time since the
//! point in time, the chunk's old content is read from the base and written to the *target*
//! (a bdev at least as large, holding old contents at the same offsets). The point-in-time
//! bdev ([`FleeceDevice`]) reads copied chunks from the target and the others from the base.
//! The base's own channels do the filter's part (`disk/fleece.rs`), as they do a mirror job's.
//!
//! ## One word per chunk, shared by every channel
//!
//! Each chunk has an atomic word (`ChunkMap`): `COPIED`, `COPYING` and, in its low bits, the
//! number of point-in-time reads of that chunk in flight *on the base*.
//!
//! * A guest write that touches a chunk goes down only when the chunk is `COPIED` and no
//!   point-in-time read of the base is in flight on it. Otherwise the write is held in its
//!   channel. A chunk neither copied nor copying is claimed for copying by one compare-and-swap
//!   (`COPYING`): exactly one channel wins and copies it; writes of the others wait for
//!   `COPIED`. So two channels never both copy a chunk, and none lets a write through early.
//! * A point-in-time read of a chunk that is not `COPIED` adds one to the chunk's readers
//!   (compare-and-swap, refused once `COPIED` is set) and reads the base; a chunk `COPIED`
//!   is read from the target. A copy may run under such readers (it only reads the base too);
//!   the write waits for the count to drop to zero. This is the simplest correct rule: a
//!   backup's reads never copy anything (the target only grows with the guest's writes), and
//!   a guest write never reaches the base under a read that still expects the old data.
//! * A copy that fails (the base's read or the target's write, other than Busy, which is
//!   retried) breaks the snapshot, QEMU's `on-cbw-error=break-snapshot`: the guest's write
//!   goes down, and every read of the point-in-time bdev fails with EIO from then on (reads
//!   in flight included). The guest is never harmed by a backup. A write held longer than
//!   [`HOLD_BOUND`] breaks the snapshot too: every wait is bounded.

mod device;
mod shared;

use std::time::Duration;

pub use device::FleeceDevice;
#[cfg(test)]
use shared::ChunkMap;
pub use shared::FleeceShared;
pub(crate) use shared::WriterStep;

/// The granularity when none is asked for: QEMU's CBW default cluster size.
pub const DEFAULT_FLEECE_GRANULARITY: u64 = 64 << 10;
/// The smallest granularity (a 4 KiB sector-sized copy per chunk at least).
pub const MIN_FLEECE_GRANULARITY: u64 = 4 << 10;
/// The largest granularity (each copy holds a buffer of this size).
pub const MAX_FLEECE_GRANULARITY: u64 = 16 << 20;

/// The longest a guest write waits for its chunks' copies (and point-in-time reads) before the
/// snapshot is broken and the write goes down: the guest comes first.
pub const HOLD_BOUND: Duration = Duration::from_secs(10);

/// Checks a granularity: a power of two from [`MIN_FLEECE_GRANULARITY`] to
/// [`MAX_FLEECE_GRANULARITY`], and a multiple of `block_size`.
pub fn check_granularity(granularity: u64, block_size: u32) -> Result<(), String> {
    if !granularity.is_power_of_two()
        || !(MIN_FLEECE_GRANULARITY..=MAX_FLEECE_GRANULARITY).contains(&granularity)
    {
        return Err(format!(
            "{granularity} is not a power of two from {MIN_FLEECE_GRANULARITY} to {MAX_FLEECE_GRANULARITY}"
        ));
    }
    if !granularity.is_multiple_of(u64::from(block_size)) {
        return Err(format!("{granularity} is not a multiple of the block size {block_size}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// The fleece bdevs' module: `bdev_get_bdevs` reports each as `driver_specific.fleece`. Its
/// methods are the registry's (`bdev_fleece_create`, `bdev_fleece_delete`), which wait for
/// the base's channels and so need the reactors.
pub struct FleeceModule;

impl crate::BdevModule for FleeceModule {
    fn name(&self) -> &'static str {
        "fleece"
    }

    fn methods(&self) -> &'static [(&'static str, crate::module::ModuleMethodFn)] {
        &[]
    }

    /// No `[[bdev]] type = "fleece"`: a fleece is made for one backup, at its start.
    fn configurable(&self) -> bool {
        false
    }

    /// The base, the target, the chunks copied and whether the snapshot broke (and why).
    fn driver_specific(
        &self,
        _info: &crate::BdevInfo,
        device: &(dyn std::any::Any + Send + Sync),
    ) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        if let Some(dev) = device.downcast_ref::<FleeceDevice>() {
            let f = dev.shared();
            out.insert("base_bdev".into(), f.base_name.clone().into());
            out.insert("target_bdev".into(), f.target_name.clone().into());
            out.insert("granularity".into(), f.granularity.into());
            out.insert("chunks".into(), f.chunk_count().into());
            out.insert("copied_chunks".into(), f.copied_chunks().into());
            out.insert("broken".into(), f.broken().into());
            if let Some(e) = f.error() {
                out.insert("error".into(), e.into());
            }
        }
        out
    }
}
