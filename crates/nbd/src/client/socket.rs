//! Connecting to a server: a Unix socket or TCP (the first address that answers), the
//! handshake with blocking I/O bounded by [`HANDSHAKE_TIMEOUT`], then the socket goes
//! non-blocking for the data path, where [`SocketIo`] moves bytes with fp-sys's vectored
//! `recvmsg` and `sendmsg`.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::address::Address;
use crate::client::handshake::{negotiate, HandshakeError, Negotiated};
use crate::client::wire::Transport;
use crate::proto::{Request, CMD_DISC};

/// How long connecting and each read or write of the handshake may take: a server that does
/// not answer fails the create (or the channel's opening) instead of hanging it.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The socket send buffer asked for.
const SEND_BUFFER: libc::c_int = 4 << 20;

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: io::Error },
    #[error("handshake with {address} failed: {source}")]
    Handshake { address: String, source: HandshakeError },
}

/// A connected socket in the transmission phase, and what the server told about the export.
pub struct Connected {
    pub fd: OwnedFd,
    pub export: Negotiated,
}

/// Connects to `address`, negotiates `export`, and leaves the socket non-blocking.
pub fn connect(address: &Address, export: &str) -> Result<Connected, ConnectError> {
    let failed = |source| ConnectError::Connect { address: address.to_string(), source };
    let (fd, result) = match address {
        Address::Unix(path) => {
            let mut s = UnixStream::connect(path).map_err(failed)?;
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(failed)?;
            s.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(failed)?;
            let result = negotiate(&mut s, export);
            s.set_nonblocking(true).map_err(failed)?;
            (OwnedFd::from(s), result)
        }
        Address::Tcp { .. } => {
            let addrs = address.resolve().map_err(|e| failed(io::Error::other(e)))?;
            let mut last = io::Error::other("no address");
            let mut stream = None;
            for a in addrs {
                match TcpStream::connect_timeout(&a, HANDSHAKE_TIMEOUT) {
                    Ok(s) => {
                        stream = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let mut s = stream.ok_or_else(|| failed(last))?;
            // Small requests (flushes, 4 KiB reads) go out at once.
            s.set_nodelay(true).map_err(failed)?;
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(failed)?;
            s.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(failed)?;
            let result = negotiate(&mut s, export);
            s.set_nonblocking(true).map_err(failed)?;
            (OwnedFd::from(s), result)
        }
    };
    let export = result.map_err(|source| ConnectError::Handshake { address: address.to_string(), source })?;
    // Room for several large writes at once, so a round's vectored write goes out whole more
    // often (a Unix socket's default is about 200 KiB, less than one 256 KiB write). The
    // kernel caps it at net.core.wmem_max.
    if let Err(e) = fp_sys::set_send_buffer(fd.as_fd(), SEND_BUFFER) {
        log::debug!("nbd_client: SO_SNDBUF: {e}");
    }
    Ok(Connected { fd, export })
}

/// A non-blocking socket as a [`Transport`].
pub struct SocketIo(pub OwnedFd);

impl SocketIo {
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Transport for SocketIo {
    fn readv(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        fp_sys::recv_vectored_nonblocking(self.0.as_fd(), bufs)
    }

    fn writev(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // MSG_NOSIGNAL inside: a server gone away is an error return, not a SIGPIPE for the
        // daemon.
        fp_sys::send_vectored_nonblocking(self.0.as_fd(), bufs)
    }
}

/// Whether a connection made earlier and idle since is still usable: nothing to read (a
/// closed one reads end-of-stream, a confused server may have sent bytes nobody asked for).
pub fn still_open(fd: BorrowedFd<'_>) -> bool {
    matches!(fp_sys::peek_nonblocking(fd, &mut [0u8]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// Sends NBD_CMD_DISC, best effort, so the server ends the connection cleanly instead of
/// logging a client that vanished.
pub fn say_goodbye(fd: BorrowedFd<'_>) {
    let disc = Request { flags: 0, command: CMD_DISC, cookie: 0, offset: 0, length: 0 }.encode();
    let _ = fp_sys::send_vectored_nonblocking(fd, &[IoSlice::new(&disc)]);
}
