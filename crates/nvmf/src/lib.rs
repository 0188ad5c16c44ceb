//! The NVMe over TCP target: any bdev served as a namespace of an NVMe-oF subsystem to NVMe/TCP
//! hosts (the Linux kernel's initiator, SPDK's), its queue pairs polled on the reactors. See
//! docs/nvmf.md.
//!
//! The NVMe facts (command and completion layouts, codes, registers, the fabrics commands and the
//! NVMe/TCP PDUs) are `fp_nvme_spec`'s, which the host driver shares.
//!
//! * [`model`]: plain descriptions of subsystems and namespaces that the control plane hands to
//!   controllers;
//! * [`controller`]: one controller's admin queue (properties, Identify, log pages, features,
//!   asynchronous events, keep-alive), with [`identify`], [`log_page`], [`features`],
//!   [`properties`] and [`aer`] building what it answers;
//! * [`NvmfTarget`] (`target`, `info`): the control API and what it reports, with `options`
//!   and `error` what it is asked and answers; `subsystem` and `state` the state it shares,
//!   `tcp` the NVMe/TCP transport (`server` the listeners and handshakes, `qpair` the queue
//!   pairs on the reactors).

// The tests' hostile host sets its socket up by hand (a tiny receive window before connect).
#![cfg_attr(not(test), forbid(unsafe_code))]

pub mod aer;
mod ana;
pub mod controller;
mod error;
mod exec;
pub mod features;
pub mod identify;
mod info;
pub mod log_page;
pub mod model;
mod options;
pub mod properties;
mod state;
mod subsystem;
mod target;
mod tcp;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use controller::{AdminResult, Controller, ControllerConfig};
pub use error::NvmfError;
pub use fp_conn::uring::{SocketImpl, UnknownSocketImpl};
pub use info::{
    ControllerInfo, HostInfo, NamespaceEntry, NamespaceStats, QpairAuth, QpairInfo, SubsystemInfo,
    SubsystemStats,
};
pub use options::{ListenAddress, NamespaceSpec, SubsystemSpec, TargetOptions, TransportOptions};
pub use target::{NvmfTarget, DRAIN_TIMEOUT};
pub use tcp::auth::{Authenticator, DhchapConfig, DhchapKeys, Refused};
pub use tcp::qpair::CLOSE_TIMEOUT;
pub use tcp::tls::HostPsk;

#[cfg(test)]
mod tests;
