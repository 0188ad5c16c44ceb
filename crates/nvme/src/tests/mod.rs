//! The controller and channel tests (core): over a fake in-memory transport, and over the
//! PCIe transport to the emulated controller.

mod core_ana;
mod core_bdev;
mod core_ctrlr;
pub(crate) mod core_fake;
mod core_mpath;
mod core_pcie;
mod core_tcp;
