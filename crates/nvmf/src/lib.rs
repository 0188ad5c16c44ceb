//! The NVMe over TCP target: any bdev served as a namespace of an NVMe-oF subsystem to NVMe/TCP
//! hosts (the Linux kernel's initiator, SPDK's), its queue pairs polled on the reactors. See
//! docs/nvmf.md.
//!
//! * [`spec`]: the NVMe base specification's command and completion layouts, opcodes and status
//!   codes that every other part uses;
//! * [`model`]: plain descriptions of subsystems and namespaces that the control plane hands to
//!   controllers;
//! * [`controller`]: one controller's admin queue (properties, Identify, log pages, features,
//!   asynchronous events, keep-alive), with [`identify`], [`log_page`], [`features`],
//!   [`properties`] and [`aer`] building what it answers;
//! * [`pdu`]: the NVMe/TCP transport's PDUs and digests;
//! * [`connect`]: the Fabrics Connect command and its data;
//! * [`NvmfTarget`] (`target`, `info`): the control API and what it reports; `subsystem` its
//!   shared state, `server` the listeners and handshakes, `qpair` the queue pairs on the
//!   reactors.

pub mod aer;
pub mod connect;
pub mod controller;
pub mod features;
pub mod identify;
mod info;
pub mod log_page;
pub mod model;
pub mod pdu;
pub mod properties;
mod qpair;
mod server;
pub mod spec;
mod subsystem;
mod target;

pub use controller::{AdminResult, Controller, ControllerConfig};
pub use info::{
    ControllerInfo, HostInfo, NamespaceEntry, NamespaceStats, QpairInfo, SubsystemInfo, SubsystemStats,
};
pub use qpair::CLOSE_TIMEOUT;
pub use target::{
    ListenAddress, NamespaceSpec, NvmfError, NvmfTarget, SubsystemSpec, TargetOptions, TransportOptions,
    DRAIN_TIMEOUT,
};

#[cfg(test)]
mod tests;
