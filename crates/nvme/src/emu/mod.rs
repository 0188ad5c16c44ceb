//! The emulated NVMe controller: a [`crate::pcie::PciFunction`] whose BAR0 is memory and
//! whose device is a thread, reaching host memory only through the DMA map as an IOMMU would
//! let it. It carries the PCIe transport's tests, the path-length measurement and the
//! `nvme_device` fuzz target, and commits [`Fault`]s on request.
//!
//! * [`config`]: [`EmuConfig`], [`EmuNamespace`], [`Fault`], [`EmuCounters`];
//! * [`controller`]: [`EmulatedController`], the handle and its `PciFunction`;
//! * `device`: the thread (registers, doorbells, queues, completions);
//! * `admin` and `io`: the admin and NVM commands, and the PRP/SGL walk.

mod admin;
pub mod config;
pub mod controller;
mod device;
mod io;
mod shared;

pub use config::{EmuConfig, EmuCounters, EmuNamespace, Fault};
pub use controller::EmulatedController;
