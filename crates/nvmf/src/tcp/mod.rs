//! The NVMe/TCP transport: `server` listens and runs each connection's handshake (ICReq, the
//! Connect capsule), `qpair` serves a connected queue pair on a reactor (the PDUs in and out,
//! the queue's commands).
//!
//! Everything above this folder (the control API, subsystems, controllers) is transport
//! neutral; another transport (RDMA) would be a folder beside this one.

pub(crate) mod auth;
pub(crate) mod qpair;
pub(crate) mod server;
pub(crate) mod tls;
