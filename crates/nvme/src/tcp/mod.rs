//! The NVMe/TCP transport, the host side of `fp_nvmf`'s protocol code: [`TcpTransport`] makes
//! an admin queue ([`TcpAdmin`]) and I/O queue pairs ([`TcpQueue`]), each its own connection.
//!
//! * `transport`: the target's address, connecting, ICReq/ICResp, Connect, enabling;
//! * `auth`: DH-HMAC-CHAP on a queue whose Connect asks for it, and on the admin queue again
//!   when the keys change;
//! * `reauth`: the I/O queues' in-band re-authentication when the keys change, a step per poll;
//! * `queue`: one connection's queue pair: capsules and the send list, synchronous commands;
//!   its `receive` side: R2T and H2CData, C2HData, digests, and the checks on
//!   everything the controller sends;
//! * `admin`, `io`: the queue as the controller's admin queue and as a reactor's I/O queue.
//!
//! A path attached with a PSK runs TLS 1.3 on every queue's connection: the handshake right
//! after the TCP connect (`transport`), then every byte of the queue through the TLS session
//! (`queue`).

mod admin;
mod auth;
#[doc(hidden)]
pub mod fuzz;
mod io;
mod queue;
mod reauth;
mod transport;

pub use admin::TcpAdmin;
pub use auth::{DhchapHost, DhchapOffer};
pub use queue::{DataStats, TcpQueue};
pub use transport::{Adrfam, TcpTarget, TcpTls, TcpTransport};

// The socket implementation a test's I/O queues use (`on_each_sock_impl` sets it; none: the
// process's default).
#[cfg(test)]
thread_local! {
    static TEST_SOCK_IMPL: std::cell::Cell<Option<fp_conn::uring::SocketImpl>> = const { std::cell::Cell::new(None) };
}

/// Runs `test` with its I/O queues on `imp`.
#[cfg(test)]
fn on_sock_impl(imp: fp_conn::uring::SocketImpl, test: fn()) {
    TEST_SOCK_IMPL.with(|s| s.set(Some(imp)));
    test();
}

/// Test `name` once per socket implementation (`name::posix`, `name::uring`).
#[cfg(test)]
macro_rules! on_each_sock_impl {
    ($name:ident) => {
        fp_conn::on_each_sock_impl!($name, crate::tcp::on_sock_impl);
    };
}

/// The socket implementation of the I/O queues connected from now on (on this thread, under
/// test): the process's default ([`fp_conn::uring::set_default_impl`], SPDK's
/// `sock_set_default_impl`).
fn io_sock_impl() -> fp_conn::uring::SocketImpl {
    #[cfg(test)]
    if let Some(imp) = TEST_SOCK_IMPL.with(|s| s.get()) {
        return imp;
    }
    fp_conn::uring::default_impl()
}

#[cfg(test)]
mod auth_tests;
#[cfg(test)]
mod ctrlr_tests;
#[cfg(test)]
mod hostile;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
