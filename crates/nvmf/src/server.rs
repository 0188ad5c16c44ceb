//! Listeners: a thread per address accepts connections.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::target::{ListenAddress, TargetInner};

pub(crate) struct Listener {
    _addr: ListenAddress,
    _sock: std::net::TcpListener,
}

impl Listener {
    pub(crate) fn open(
        _t: &Arc<TargetInner>,
        addr: ListenAddress,
        sock: SocketAddr,
    ) -> std::io::Result<Listener> {
        Ok(Listener { _addr: addr, _sock: std::net::TcpListener::bind(sock)? })
    }

    pub(crate) fn close(self) {}
}
