//! The NVMe/TCP transport, the host side of `fp_nvmf`'s protocol code: [`TcpTransport`] makes
//! an admin queue ([`TcpAdmin`]) and I/O queue pairs ([`TcpQueue`]), each its own connection.
//!
//! * `transport`: the target's address, connecting, ICReq/ICResp, Connect, enabling;
//! * `queue`: one connection's queue pair: capsules and the send list, synchronous commands;
//!   its `receive` side: R2T and H2CData, C2HData, digests, and the checks on
//!   everything the controller sends;
//! * `admin`, `io`: the queue as the controller's admin queue and as a reactor's I/O queue.

mod admin;
#[doc(hidden)]
pub mod fuzz;
mod io;
mod queue;
mod transport;

pub use admin::TcpAdmin;
pub use queue::{DataStats, TcpQueue};
pub use transport::{Adrfam, TcpTarget, TcpTransport};

#[cfg(test)]
mod ctrlr_tests;
#[cfg(test)]
mod hostile;
#[cfg(test)]
mod tests;
