//! The NVMe over TCP target: any bdev served as a namespace of an NVMe-oF subsystem to NVMe/TCP
//! hosts (the Linux kernel's initiator, SPDK's), its queue pairs polled on the reactors. See
//! docs/nvmf.md.
//!
//! * [`spec`]: the NVMe base specification's command and completion layouts, opcodes and status
//!   codes that every other part uses;
//! * [`model`]: plain descriptions of subsystems and namespaces that the control plane hands to
//!   controllers;
//! * [`pdu`]: the NVMe/TCP transport's PDUs and digests;
//! * [`connect`]: the Fabrics Connect command and its data;
//! * [`NvmfTarget`] (`target`, `info`): the control API and what it reports; `subsystem` its
//!   shared state, `server` the listeners and handshakes, `qpair` the queue pairs on the
//!   reactors.

pub mod connect;
mod info;
pub mod model;
pub mod pdu;
mod qpair;
mod server;
pub mod spec;
mod subsystem;
mod target;

pub use info::{
    ControllerInfo, HostInfo, NamespaceEntry, NamespaceStats, QpairInfo, SubsystemInfo, SubsystemStats,
};
pub use target::{
    ListenAddress, NamespaceSpec, NvmfError, NvmfTarget, SubsystemSpec, TargetOptions, TransportOptions,
};

#[cfg(test)]
mod tests;
