//! Device-side virtqueue access for the data path, written for per-I/O cost.
//!
//! * [`MemTable`]: guest memory as a small table of regions built once per memory snapshot;
//!   an address range translates with one compare against the last region hit.
//! * [`SplitQueue`]: the split ring (virtio 1.2 §2.7): available-ring reader, used-ring writer
//!   with one index publish per batch, EVENT_IDX / NO_INTERRUPT notification rules.
//! * [`PackedQueue`]: the packed ring (§2.8) with the same interface.
//! * [`DirtyLog`] / [`RingLog`]: the live-migration dirty log the rings and the data path mark.
//! * [`Chain`]: one request's descriptors, collected by either ring's walker with the same
//!   hostile-input rules: bounded length, loops, indirect tables (not nested, inside one memory
//!   region), `next` in range, at most 2^32 bytes. Every buffer's host address is resolved while
//!   walking; a buffer that is not inside one region is left for the caller's slow path.
//!   The split walker reads the common three-descriptor chain in one step and walks anything
//!   else with the general loop ([`SplitQueue::walk_general`]); both store the same chain.
//!
//! * [`driver`]: the other side, for a client that plays the guest: memory shared with the
//!   device and the driver's split and packed rings.
//!
//! Everything here reads memory a guest writes concurrently: loads are volatile and each field
//! is read once, so a guest changing a descriptor under us can make us see a garbage chain but
//! never an out-of-bounds access. Why this is not virtio-queue: docs/architecture.md.

#![deny(missing_docs)]

pub mod access;
mod chain;
pub mod driver;
mod log;
mod mem;
mod packed;
mod split;

use virtio_bindings::virtio_ring as vr;

pub use chain::{Chain, Desc, WalkError, MAX_CHAIN_DESCRIPTORS};
pub use log::{DirtyLog, RingLog, LOG_PAGE};
pub use mem::{GuestByte, GuestMemory, MemTable};
pub use packed::{PackedHead, PackedQueue, PackedState, RawDesc};
pub use split::{RingError, SplitQueue};

// The descriptor flags, declared once for both ring layouts and every crate above this one.
// virtio-bindings gives the packed-ring AVAIL/USED flags as bit numbers, the others as masks.

/// Descriptor flag: the buffer continues in the next descriptor (§2.7.5, §2.8.6).
pub const DESC_F_NEXT: u16 = vr::VRING_DESC_F_NEXT as u16;
/// Descriptor flag: the buffer is device-writable.
pub const DESC_F_WRITE: u16 = vr::VRING_DESC_F_WRITE as u16;
/// Descriptor flag: the buffer holds an indirect descriptor table (§2.7.5.3, §2.8.7).
pub const DESC_F_INDIRECT: u16 = vr::VRING_DESC_F_INDIRECT as u16;
/// Packed-ring descriptor flag VIRTQ_DESC_F_AVAIL (§2.8.1): equal to the driver's wrap counter
/// when the driver makes the descriptor available.
pub const DESC_F_AVAIL: u16 = 1 << vr::VRING_PACKED_DESC_F_AVAIL;
/// Packed-ring descriptor flag VIRTQ_DESC_F_USED (§2.8.1): set to the device's wrap counter
/// (with AVAIL) when the device marks the descriptor used.
pub const DESC_F_USED: u16 = 1 << vr::VRING_PACKED_DESC_F_USED;
