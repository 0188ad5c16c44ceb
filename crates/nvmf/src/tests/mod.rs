//! The target end to end inside the crate: a small NVMe/TCP host written here (`host`) against
//! a target with RAM disks on real reactors. The suites that exercise the transport run once
//! per socket implementation ([`on_each_sock_impl`]).

use std::cell::Cell;

use fp_conn::uring::SocketImpl;

thread_local! {
    static SOCK_IMPL: Cell<SocketImpl> = const { Cell::new(SocketImpl::Posix) };
}

/// The socket implementation the running test's targets use ([`on_each_sock_impl`] sets it).
pub(crate) fn sock_impl() -> SocketImpl {
    SOCK_IMPL.with(|s| s.get())
}

/// Runs `test` with its targets' queue pairs on `imp`.
pub(crate) fn on(imp: SocketImpl, test: fn()) {
    SOCK_IMPL.with(|s| s.set(imp));
    test();
}

/// Test `name` once per socket implementation (`name::posix`, `name::uring`).
macro_rules! on_each_sock_impl {
    ($name:ident) => {
        fp_conn::on_each_sock_impl!($name, crate::tests::on);
    };
}

mod ana;
mod api;
mod auth;
mod buffers;
mod busy;
mod host;
mod hostile;
mod io;
mod listener;
mod tls;
