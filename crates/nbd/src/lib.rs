//! The NBD server frontend: any bdev exported to host tools and remote clients over the
//! Network Block Device protocol (fixed newstyle handshake, structured replies,
//! `base:allocation` block status, multi-conn, TLS), on the reactors. See docs/nbd.md.
//!
//! * [`proto`]: the wire format;
//! * [`handshake`]: option negotiation without I/O (what the fuzz target drives);
//! * [`address`]: `nbd_device` strings (socket paths and NBD URIs);
//! * [`tls`]: rustls configuration from PEM files;
//! * [`stats`]: what an export counts;
//! * [`client`]: the other way round, a remote export as a bdev (`nbd_client`);
//! * `server`: listeners, handshake threads, starting and stopping exports; `export`: an
//!   export's shared state; `conn`: a connection's poller.
//!
//! No unsafe code: a request's data reaches the device through fp-bdev's
//! [`BounceBuf`](fp_bdev::iov::BounceBuf) and the socket through fp-sys (the tests use raw
//! iovecs and poll(2) to drive the client).
#![cfg_attr(not(test), forbid(unsafe_code))]

pub mod address;
pub mod client;
mod conn;
mod export;
pub mod handshake;
pub mod proto;
mod server;
pub mod stats;
pub mod tls;

#[cfg(test)]
mod tests;

pub use address::{parse_device, Address, Device};
pub use conn::CLOSE_TIMEOUT;
pub use export::ExportBitmap;
pub use server::{ExportHandle, ExportSpec, NbdError, NbdServer, STOP_TIMEOUT};
pub use stats::NbdStats;
pub use tls::TlsFiles;
