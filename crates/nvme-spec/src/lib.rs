//! What the NVMe specifications fix, below both NVMe crates: the host driver (`fp-nvme`, PCIe
//! and TCP) and the NVMe/TCP target (`fp-nvmf`) read and write the same bytes through these
//! layouts and codes, each under one name (SPDK's `nvme_spec.h`, `nvmf_spec.h` and
//! `nvme_tcp.h`; Linux's `nvme.h` and `nvme-tcp.h`). Pure: no I/O, no unsafe code, and no input
//! makes a decoder panic.
//!
//! Section and figure numbers are the NVM Express Base Specification 2.0's ("Base"), the NVM
//! Command Set Specification 1.0's ("NVM"), the NVMe over Fabrics 1.1's ("Fabrics") and the
//! NVMe/TCP Transport Specification 1.0's ("TCP").
//!
//! * [`sqe`], [`cqe`], [`status`], [`opcode`]: commands, completions, status codes and opcodes,
//!   re-exported at the crate's root;
//! * [`registers`]: the controller registers (PCIe BAR0) and properties (fabrics);
//! * [`identify`], [`features`], [`log_page`]: the admin data structures and their codes (the
//!   Asymmetric Namespace Access log page among them), [`aer`] the asynchronous events;
//! * [`fabrics`]: Connect, Property Get and Property Set, NQNs;
//! * [`auth`]: in-band authentication (DH-HMAC-CHAP): its commands and messages;
//! * [`tcp`]: the NVMe/TCP PDUs and digests.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod aer;
pub mod auth;
pub mod cqe;
pub mod fabrics;
pub mod features;
pub mod identify;
pub mod log_page;
pub mod opcode;
pub mod registers;
pub mod sqe;
pub mod status;
pub mod tcp;

pub use cqe::*;
pub use opcode::*;
pub use sqe::*;
pub use status::*;
