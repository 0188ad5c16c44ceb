//! A connection's socket, plain or under TLS (rustls over the non-blocking socket).

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use fp_conn::Recv;
use rustls::ServerConnection;

/// The socket, plain or under TLS.
pub(super) struct Socket {
    pub(super) fd: OwnedFd,
    pub(super) tls: Option<Box<ServerConnection>>,
}

/// `Read`/`Write` on a raw non-blocking socket, for rustls.
struct FdIo<'a>(BorrowedFd<'a>);

impl Read for FdIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        fp_sys::recv_nonblocking(self.0, buf)
    }
}

impl Write for FdIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // MSG_NOSIGNAL: a client gone away is an error return, not a SIGPIPE.
        fp_sys::send_vectored_nonblocking(self.0, bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Socket {
    #[inline]
    pub(super) fn recv(&mut self, dst: &mut [u8]) -> Recv {
        let Some(tls) = &mut self.tls else { return Recv::from_socket(self.fd.as_fd(), dst) };
        let mut io = FdIo(self.fd.as_fd());
        loop {
            match tls.reader().read(dst) {
                Ok(0) => return Recv::Eof,
                Ok(n) => return Recv::Data(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Recv::Failed(format!("TLS: {e}")),
            }
            match tls.read_tls(&mut io) {
                Ok(0) => return Recv::Eof,
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        // Tell the client why, best effort.
                        let _ = tls.write_tls(&mut io);
                        return Recv::Failed(format!("TLS: {e}"));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Recv::WouldBlock,
                Err(e) => return Recv::Failed(e.to_string()),
            }
        }
    }

    /// Writes some of `bufs`; `Ok(0)` when the socket (or rustls's buffer) takes nothing now.
    #[inline]
    pub(super) fn send(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.tls.is_none() {
            return match FdIo(self.fd.as_fd()).write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                other => other,
            };
        }
        if !self.flush_tls()? {
            return Ok(0);
        }
        let tls = self.tls.as_mut().expect("checked");
        let n = tls.writer().write_vectored(bufs)?;
        self.flush_tls()?;
        Ok(n)
    }

    /// Sends the ciphertext rustls holds; `Ok(false)` when the socket is full.
    pub(super) fn flush_tls(&mut self) -> io::Result<bool> {
        let mut io = FdIo(self.fd.as_fd());
        let Some(tls) = &mut self.tls else { return Ok(true) };
        while tls.wants_write() {
            match tls.write_tls(&mut io) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    pub(super) fn tls_wants_write(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.wants_write())
    }
}
