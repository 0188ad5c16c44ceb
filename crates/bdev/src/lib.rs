//! The block device layer.
//!
//! A block device ("bdev", after SPDK) is two objects:
//!
//! * a [`BlockDevice`]: `Send + Sync`, created and deleted on the control plane, describing the
//!   device (name, geometry, which operations it supports) and able to open channels;
//! * an [`IoChannel`]: core-local (not `Send`), opened by the reactor that will submit I/O through
//!   it. All hot-path state (rings, completion lists, counters) lives here, so a channel never
//!   takes a lock.
//!
//! Callers submit [`IoRequest`]s tagged with a `u32` of their choice and later call
//! [`IoChannel::poll`] to reap completions, which come back by tag. Buffers are described by
//! `iovec`s that point into memory the caller keeps valid until the completion is reaped
//! (for the vhost-user frontend, guest memory): backends read and write them in place.
//!
//! Each backend is a bdev module (`modules/<name>/`): the device, and in `rpc.rs` its JSON-RPC
//! methods, which work through a [`ModuleHost`] (see [`module`]). `conformance` (feature
//! `conformance`) holds the checks every device must pass.
//!
//! Stacking: a volume, QoS or partition layer is itself a `BlockDevice` whose channel holds a
//! channel of the device below. A backend that completes on its own threads (Ceph RBD, say)
//! pushes completions into a lock-free queue owned by the channel and signals the fd returned by
//! [`IoChannel::completion_fd`], so a sleeping reactor wakes up.

#![deny(missing_docs)]

pub mod buf;
pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod copy_share;
mod device;
pub mod disk;
pub mod dma;
mod error;
pub mod fleece;
pub mod iov;
pub mod iov_io;
mod mapping;
pub mod metrics;
pub mod mirror;
pub mod module;
pub mod modules;
pub mod qos;
mod request;
pub mod sync_io;
mod uuid;

pub use buf::AlignedBuf;
pub(crate) use device::ALL_IO_TYPES;
pub use device::{validate_geometry, Bdev, BdevInfo, BlockDevice, BlockExtent, Capacity, IoChannel, IoTypes};
pub use disk::{Disk, DiskEvent};
pub use error::BdevError;
pub use iov::{BouncePool, IovCursor, IovSlices, Iovecs};
pub use module::{BdevModule, ClaimType, ConfigTable, ModuleError, ModuleHost, NewBdev};
pub use modules::delay::{DelayDevice, DelayLatency, LatencyKind};
pub use modules::error::{ErrorDevice, ErrorType, Injection};
pub use modules::malloc::RamDevice;
pub use modules::null::NullDevice;
pub use modules::uring::UringDevice;
pub use modules::{delay, malloc, null, uring};
pub use request::{DoneList, IoOp, IoRequest, IoStatus, SubmitError};
pub use uuid::Uuid;
