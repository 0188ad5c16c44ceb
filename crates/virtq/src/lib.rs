//! Device-side virtqueue access for the data path, written for per-I/O cost.
//!
//! * [`MemTable`]: guest memory as a small table of regions built once per memory snapshot;
//!   an address range translates with one compare against the last region hit.
//! * [`SplitQueue`]: the split ring (virtio 1.2 §2.7): available-ring reader, used-ring writer
//!   with one index publish per batch, EVENT_IDX / NO_INTERRUPT notification rules.
//! * [`PackedQueue`]: the packed ring (§2.8) with the same interface.
//! * [`Chain`]: one request's descriptors, collected by either ring's walker with the same
//!   hostile-input rules: bounded length, loops, indirect tables (not nested, inside one memory
//!   region), `next` in range, at most 2^32 bytes. Every buffer's host address is resolved while
//!   walking; a buffer that is not inside one region is left for the caller's slow path.
//!
//! Everything here reads memory a guest writes concurrently: loads are volatile and each field
//! is read once, so a guest changing a descriptor under us can make us see a garbage chain but
//! never an out-of-bounds access. Why this is not virtio-queue: docs/architecture.md.

pub mod access;
mod chain;
mod mem;
mod packed;
mod split;

pub use chain::{Chain, Desc, WalkError, MAX_CHAIN_DESCRIPTORS};
pub use mem::{GuestMemory, MemTable};
pub use packed::{PackedHead, PackedQueue, PackedState, RawDesc};
pub use split::{RingError, SplitQueue};

/// Descriptor flag: the buffer continues in the next descriptor (§2.7.5, §2.8.6).
pub const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the buffer is device-writable.
pub const DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer holds an indirect descriptor table (§2.7.5.3, §2.8.7).
pub const DESC_F_INDIRECT: u16 = 4;
