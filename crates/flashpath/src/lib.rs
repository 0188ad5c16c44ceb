//! The daemon's library half: its wiring. `serve` starts the reactors, the registry (which
//! answers every JSON-RPC method: crates/registry), the RPC server, the start-up config file
//! and the metrics endpoint. It is a library (rather than modules of the binary) so that the
//! fuzz targets in `fuzz/` and the integration tests can drive the config parser directly; the
//! binary (`src/main.rs`) adds only the command line and the client commands.

#![forbid(unsafe_code)]

pub mod config;
pub mod metrics;
pub mod serve;
pub mod size;

/// Where `serve` listens and the client connects unless told otherwise. `/var/tmp` is writable
/// by every user and survives reboots' tmp cleaning less aggressively than `/tmp`; SPDK uses it
/// for the same purpose.
pub const DEFAULT_RPC_SOCKET: &str = "/var/tmp/flashpath.sock";

/// Where `serve` puts the vhost-user sockets (one per controller, named after it).
pub const DEFAULT_VHOST_DIR: &str = "/var/tmp/flashpath";
