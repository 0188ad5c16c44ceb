//! flashpath's management transport: JSON-RPC 2.0 over a Unix stream socket.
//!
//! The wire format is the one SPDK's `rpc.py` speaks: request objects written back to back on a
//! stream, with or without whitespace (newlines) between them, each answered by one response
//! object. Batches (arrays) and notifications (requests without an `id`) follow the JSON-RPC 2.0
//! specification.
//!
//! * [`RpcServer`] listens on a socket (mode 0600) and hands each call to a [`Handler`] on its own
//!   threads, never on a reactor: handlers may block (creating a RAM disk, draining a controller).
//! * [`RpcClient`] is the blocking client the CLI and the tests use.
//! * [`Params`] decodes a method's `params` object field by field, so every error names the
//!   field and what it accepts, and unknown fields are rejected.

#![forbid(unsafe_code)]

mod client;
mod error;
mod params;
mod server;

pub use client::{RpcClient, RpcClientError};
pub use error::{codes, RpcError};
pub use params::{Neutral, ParamError, Params};
pub use server::{Handler, RpcServer, ServerConfig};

/// Default bound on one request (or one batch), in bytes.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;
