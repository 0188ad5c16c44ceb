//! The vhost-user-blk frontend: exports one bdev per Unix socket to a VMM (QEMU,
//! cloud-hypervisor) or a libblkio client.
//!
//! Layers, top to bottom:
//! * [`BlkController`] (`controller.rs`): one export, its start, stop, resize and report, over
//!   the [`state::ControllerState`] its threads share;
//! * `socket.rs`: the listening socket and its control-plane thread, which accepts one
//!   frontend at a time and feeds its messages to `vhost`'s request parser;
//! * [`connection::Connection`]: protocol state of one connection (control plane);
//! * [`memory`]: the guest memory map, snapshotted for the data path;
//! * [`queue::QueuePoller`]: one virtqueue on one reactor (data plane), with `fp_virtq` for the
//!   rings (`ring.rs` picks the split or packed layout and recovers [`inflight`] state);
//!   [`stats`] declares its counters;
//! * [`HandOff`] (`handoff.rs`): which of two controllers on one disk may run queues during a
//!   migration;
//! * [`log`]: the live-migration dirty log the queues mark.
//!
//! A controller outlives its connections: a VMM may disconnect and reconnect (guest reboot,
//! VMM restart) and the disk keeps serving.

pub mod coalesce;
mod config;
pub mod connection;
mod controller;
mod depth;
mod error;
mod handoff;
pub mod inflight;
pub mod log;
pub mod memory;
pub mod queue;
mod queue_setup;
mod queue_stop;
mod ring;
mod socket;
pub mod state;
pub mod stats;

pub use crate::coalesce::CoalescingSettings;
pub use crate::config::ControllerConfig;
#[doc(hidden)]
pub use crate::controller::connection_for_fuzzing;
pub use crate::controller::{BlkController, ControllerInfo};
pub use crate::error::Error;
pub use crate::handoff::{HandOff, HandOffHold};
#[doc(hidden)]
pub use crate::socket::serve_message_for_fuzzing;
pub use crate::socket::validate_name;
pub use crate::stats::{ControllerStats, QueueStats};

/// Most queues one controller offers, and what it offers unless the operator sets fewer.
///
/// A frontend starts only the queues it wants (QEMU: one per vCPU by default), and only a
/// started queue has a poller, ring mappings or an in-flight region; an offered but unused
/// queue costs its counters and its slot in the connection's table. 64 covers the vCPU count
/// of any VM that one disk on one daemon serves in practice, while what a frontend can make the
/// daemon allocate stays bounded (docs/architecture.md, "Queues").
pub const MAX_QUEUES: u16 = 64;

/// How long stopping a queue may take unless the operator sets another bound
/// (docs/architecture.md, "Stopping a queue"): long enough for any healthy disk to complete
/// what a queue holds (a ring's worth of requests) and for a Busy refusal to clear, short
/// enough that a front-end waiting on GET_VRING_BASE (QEMU stopping a VM, the end of a
/// migration) is answered before it gives up.
pub const DEFAULT_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
