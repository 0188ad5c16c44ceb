//! The NBD client: a remote export (flashpath's own, qemu-nbd, qemu-storage-daemon, nbdkit)
//! as a bdev of driver `nbd_client`. See docs/nbd.md, "Attaching a remote export".
//!
//! * [`handshake`]: fixed newstyle negotiation (NBD_OPT_GO, NBD_OPT_EXPORT_NAME fallback);
//! * [`wire`]: the transmission phase without a socket: request slots, vectored sends,
//!   replies read straight into the caller's buffers (what the fuzz target drives);
//! * [`memory`]: an in-memory transport (the tests' and the fuzz target's server);
//! * [`socket`]: connecting, and the non-blocking socket the wire runs on;
//! * [`device`]: the bdev and its channels (one connection each);
//! * [`rpc`]: the module and its methods.
//!
//! No unsafe code: a request's buffers reach the socket through fp-bdev's views of its
//! [`Iovecs`](fp_bdev::Iovecs) ([`fp_bdev::iov_io`]) and fp-sys's vectored calls.

#![cfg_attr(not(test), forbid(unsafe_code))]

pub mod device;
pub mod handshake;
pub mod memory;
pub mod rpc;
pub mod socket;
pub mod wire;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod timeout_tests;

pub use device::{ClientStats, NbdClientChannel, NbdClientDetail, NbdClientDevice, DEFAULT_IO_TIMEOUT};
pub use handshake::{negotiate, BlockSize, HandshakeError, Negotiated};
pub use memory::MemoryTransport;
pub use rpc::NbdClientModule;
pub use socket::{connect, ConnectError, Connected, HANDSHAKE_TIMEOUT};
pub use wire::{Transport, Wire, MAX_IN_FLIGHT};
