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
//!   [`properties`] and [`aer`] building what it answers.

pub mod aer;
pub mod controller;
pub mod features;
pub mod identify;
pub mod log_page;
pub mod model;
pub mod properties;
pub mod spec;

pub use controller::{AdminResult, Controller, ControllerConfig};
