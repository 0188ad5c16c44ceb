//! The ublk export: a bdev as a kernel block device (/dev/ublkbN) through Linux's ublk driver.
//!
//! * `uapi.rs`: the kernel interface (commands, features, structures), no I/O;
//! * `sys/`: the only `unsafe` of the crate: the control device's ring and a queue's ring,
//!   descriptors and buffers;
//! * `poller.rs`: a queue on its reactor (requests to the bdev channel and back);
//! * `target.rs`: devices' lives on the control plane (add, parameters, queues on reactors,
//!   start, stop, delete, user recovery, resize).
//!
//! The io-uring crate is used directly rather than libublk-rs, which runs each queue on a
//! thread and executor of its own; here a queue is a poller on a reactor, like every other
//! export's (docs/ublk.md).

pub mod poller;
pub mod sys;
pub mod target;
pub mod uapi;

pub use poller::{QueuePoller, QueueShared, QueueStats};
pub use sys::{Control, CtrlError};
pub use target::{DiskInfo, StartSpec, Target, TargetError, UblkDisk};
