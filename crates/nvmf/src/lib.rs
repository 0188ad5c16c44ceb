//! The NVMe over TCP target: any bdev served as a namespace of an NVMe-oF subsystem to NVMe/TCP
//! hosts (the Linux kernel's initiator, SPDK's), its queue pairs polled on the reactors. See
//! docs/nvmf.md.
//!
//! * [`spec`]: the NVMe base specification's command and completion layouts, opcodes and status
//!   codes that every other part uses;
//! * [`model`]: plain descriptions of subsystems and namespaces that the control plane hands to
//!   controllers;
//! * [`pdu`]: the NVMe/TCP transport's PDUs and digests;
//! * [`connect`]: the Fabrics Connect command and its data.

pub mod connect;
pub mod model;
pub mod pdu;
pub mod spec;
