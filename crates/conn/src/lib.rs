//! The pieces every stream connection of flashpath is made of, server and client side, NBD
//! and NVMe/TCP alike:
//!
//! * [`listener`]: a bound Unix or TCP socket, an accept thread that stops on request, and a
//!   short-lived thread per connection for its handshake, at most so many at once, each read
//!   and write bounded;
//! * [`RecvBuf`]: the receive buffer headers arrive in, compacted only when what is left
//!   does not fit, and [`Recv`], what one non-blocking receive gave;
//! * [`SendQueue`]: entries (a reply, a PDU) whose pieces go out in one gathered write,
//!   with the bytes a partial write took counted against the entry at the front;
//! * [`Life`]: a connection's way to its end (closing with a reason, a broken socket, a peer
//!   that broke the protocol) and [`Interest`], the readiness its poller sleeps on.
//!
//! * [`uring`]: the io_uring socket engine (one ring per reactor thread): multishot receives
//!   into provided buffers and sends batched into one submission per round, the
//!   [`uring::SocketImpl`] a connection picks.
//!
//! Nothing here allocates per I/O: buffers and queues are made with the connection.
//!
//! `unsafe` is denied everywhere but in [`uring`], whose ring entries point at memory the
//! kernel uses after the call returns (the layering test lists it among the io_uring edges).

#![deny(unsafe_code)]
#![deny(missing_docs)]

mod life;
pub mod listener;
mod recv;
pub mod round;
mod send;
#[allow(unsafe_code)]
pub mod uring;

pub use life::{Interest, Life};
pub use listener::{Bound, Listener, ListenerOptions, Stream};
pub use recv::{Recv, RecvBuf};
pub use send::{SendQueue, Sent, IOV_PER_WRITE};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod uring_tests;
