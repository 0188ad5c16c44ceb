//! The daemon's library half: the JSON-RPC methods, the start-up config file and `serve`
//! itself. It is a library (rather than modules of the binary) so that the fuzz targets in
//! `fuzz/` and the integration tests can drive the config parser and the methods directly;
//! the binary (`src/main.rs`) adds only the command line and the client commands.

// Forbidden in the library as built. Its unit tests are exempt only because
// methods/iostat/tests.rs submits requests through fp-bdev's `unsafe fn submit` (a buffer
// contract, not a system call); once that test moves or gets a safe helper this becomes a plain
// `#![forbid(unsafe_code)]`.
#![cfg_attr(not(test), forbid(unsafe_code))]

pub mod config;
pub mod methods;
pub mod metrics;
pub mod serve;
pub mod size;

/// Where `serve` listens and the client connects unless told otherwise. `/var/tmp` is writable
/// by every user and survives reboots' tmp cleaning less aggressively than `/tmp`; SPDK uses it
/// for the same purpose.
pub const DEFAULT_RPC_SOCKET: &str = "/var/tmp/flashpath.sock";

/// Where `serve` puts the vhost-user sockets (one per controller, named after it).
pub const DEFAULT_VHOST_DIR: &str = "/var/tmp/flashpath";
