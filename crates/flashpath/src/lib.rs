//! The daemon and its command line as a library: `serve` starts the reactors, the registry
//! (which answers every JSON-RPC method: crates/registry), the RPC server, the start-up config
//! file and the metrics endpoint; [`cli`] is the command line (its parser and the client
//! commands). It is a library so that the fuzz targets in `fuzz/` and the integration tests
//! drive the config parser and the command-line parser directly; the binary (`src/main.rs`)
//! only parses the command line, sets up logging and runs it.

#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod logger;
pub mod metrics;
pub mod serve;
pub mod size;

/// Where `serve` listens and the client connects unless told otherwise. `/var/tmp` is writable
/// by every user and survives reboots' tmp cleaning less aggressively than `/tmp`; SPDK uses it
/// for the same purpose.
pub const DEFAULT_RPC_SOCKET: &str = "/var/tmp/flashpath.sock";

/// Where `serve` puts the vhost-user sockets (one per controller, named after it).
pub const DEFAULT_VHOST_DIR: &str = "/var/tmp/flashpath";
