//! An NVMe driver in user space, polled per reactor: SPDK's `bdev_nvme`. One queue-pair core
//! shared by two transports, and each namespace a bdev. See docs/nvme.md.
//!
//! * [`transport`]: what a transport gives the controller (an admin queue, I/O queues) and
//!   [`cmd`] the commands built for them (the layouts, codes and registers are `fp_nvme_spec`'s,
//!   which the NVMe/TCP target shares), [`cid`] the command-id table every queue keeps
//!   (timeouts, hostile completions);
//! * [`pcie`]: the PCIe transport: submission and completion rings in DMA memory, PRP lists,
//!   batched and shadow doorbells, over a [`pcie::PciFunction`]: a VFIO-bound device
//!   ([`pcie::vfio`]) or the emulated controller (`emu`, feature `emu`) the tests and fuzz
//!   targets use;
//! * [`tcp`]: the NVMe/TCP transport (the host side of `fp_nvme_spec::tcp`'s PDUs);
//! * [`ctrlr`]: a controller's life (attach, Identify, namespaces, asynchronous events,
//!   keep-alive, timeouts, abort, reset, reconnect, detach) on its own control-plane thread;
//! * [`bdev`]: namespaces as block devices, one I/O queue pair per channel;
//! * [`rpc`]: the module and its methods, SPDK's `bdev_nvme_*` names and parameters.

pub mod bdev;
pub mod cid;
pub mod cmd;
pub mod ctrlr;
#[cfg(any(test, feature = "emu"))]
pub mod emu;
mod error;
mod metrics;
pub mod pcie;
pub mod rpc;
pub mod tcp;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod transport;

#[cfg(test)]
mod tests;

pub use error::NvmeError;
