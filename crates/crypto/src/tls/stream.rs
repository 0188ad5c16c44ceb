//! A [`TlsSession`] on a socket: what a connection's receive and send paths call in place of
//! the socket's own `recv` and `send`, with the same answers (bytes moved, `Ok(0)` at the end
//! of the stream, `WouldBlock` when nothing moves now), so that a queue pair runs over TLS by
//! swapping one call on each side; and the blocking form a handshake thread reads and writes
//! through (its socket's timeouts bound every wait).
//!
//! Buffers made with the stream hold ciphertext between the socket and the session: what a
//! receive brought that the session has not taken yet ([`BUF`] bytes), and what the session
//! wrote that the socket has not taken yet (four times that: the records of a whole round's
//! PDUs go out in one system call). Nothing is allocated per record. Plaintext a send hands
//! over is the stream's from then on: the caller may reuse its buffers at once, while
//! the ciphertext may still wait for the socket ([`TlsStream::has_unsent`]; a poller keeps
//! calling [`TlsStream::flush`] while it is true).
//!
//! **Records as full as a send allows.** A send's small pieces (a PDU header, a response
//! capsule, the next command) are gathered into one plaintext buffer of a record's size and
//! encrypted together rather than a record each: libssl spends a fixed amount of work on every
//! record whatever its size (measured: a target sending a header and a 4 KiB payload as two
//! records per read spent more time in libssl's per-record code than in AES-GCM). A piece of a
//! whole record or more, met with nothing gathered, goes to the session without the copy.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::BorrowedFd;

use super::session::{HandshakeState, TlsError, TlsSession, BUF, MAX_FRAGMENT};

/// The outbound buffer: records of many PDUs (the session's own buffer holds two) go to the
/// socket in one system call, as a plain queue pair's gathered write sends its PDUs.
const OUTBOUND: usize = 4 * BUF;

/// A TLS session with its ciphertext buffers, moved with its connection (handshake thread,
/// then reactor).
pub struct TlsStream {
    session: TlsSession,
    /// Ciphertext received, `inbound[in_start..in_end]` not yet taken by the session.
    inbound: Box<[u8]>,
    in_start: usize,
    in_end: usize,
    /// Ciphertext for the peer, `outbound[out_start..out_end]` not yet taken by the socket.
    outbound: Box<[u8]>,
    out_start: usize,
    out_end: usize,
    /// Plaintext taken from sends, `plain[..plain_len]`, not yet given to the session: the
    /// next record.
    plain: Box<[u8]>,
    plain_len: usize,
    /// The socket's end of the stream came.
    eof: bool,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("session", &self.session)
            .field("inbound", &(self.in_end - self.in_start))
            .field("unsent", &(self.out_end - self.out_start))
            .field("eof", &self.eof)
            .finish()
    }
}

fn tls_io(e: TlsError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn would_block() -> io::Error {
    io::Error::from(io::ErrorKind::WouldBlock)
}

fn is_retry(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

impl TlsStream {
    /// `session` (client or server, its handshake not begun) with empty buffers.
    pub fn new(session: TlsSession) -> TlsStream {
        TlsStream {
            session,
            inbound: vec![0u8; BUF].into_boxed_slice(),
            in_start: 0,
            in_end: 0,
            outbound: vec![0u8; OUTBOUND].into_boxed_slice(),
            out_start: 0,
            out_end: 0,
            plain: vec![0u8; MAX_FRAGMENT].into_boxed_slice(),
            plain_len: 0,
            eof: false,
        }
    }

    /// The session (its identity, cipher suite, state).
    pub fn session(&self) -> &TlsSession {
        &self.session
    }

    /// Whether ciphertext waits for the socket: the connection is not idle, and wants to
    /// know when its socket is writable.
    #[inline]
    pub fn has_unsent(&self) -> bool {
        self.plain_len > 0 || self.out_start < self.out_end || self.session.pending() > 0
    }

    /// Whether ciphertext received waits for the session (a receive needs no socket read).
    #[inline]
    pub fn has_received(&self) -> bool {
        self.in_start < self.in_end
    }

    /// Hands the session what the inbound buffer holds, as much as it takes.
    fn feed(&mut self) -> io::Result<()> {
        if self.in_start < self.in_end {
            let n = self.session.feed(&self.inbound[self.in_start..self.in_end]).map_err(tls_io)?;
            self.in_start += n;
            if self.in_start == self.in_end {
                self.in_start = 0;
                self.in_end = 0;
            }
        }
        Ok(())
    }

    /// Plaintext the session has (feeding it what is buffered) into `bufs`, from `skip` bytes
    /// in; returns how many bytes it wrote.
    fn read_plain(&mut self, bufs: &mut [IoSliceMut<'_>], mut skip: usize) -> io::Result<usize> {
        let mut got = 0;
        for b in bufs.iter_mut() {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            let mut at = skip;
            skip = 0;
            while at < b.len() {
                let waiting = self.in_end - self.in_start;
                self.feed()?;
                let fed = waiting - (self.in_end - self.in_start);
                let n = self.session.read(&mut b[at..]).map_err(tls_io)?;
                if n == 0 {
                    if self.in_start < self.in_end && fed > 0 {
                        // The session's buffer was full: it has taken more since.
                        continue;
                    }
                    return Ok(got);
                }
                at += n;
                got += n;
            }
        }
        Ok(got)
    }

    /// Receives plaintext into `dst` without waiting: as [`fp_sys::recv_nonblocking`] answers
    /// (`Ok(0)`: the peer closed; `WouldBlock`: nothing now). An answer shorter than `dst`
    /// means the socket held nothing more when it was read.
    pub fn recv(&mut self, fd: BorrowedFd<'_>, dst: &mut [u8]) -> io::Result<usize> {
        self.recv_vectored(fd, &mut [IoSliceMut::new(dst)])
    }

    /// Receives plaintext into `bufs`, in order, without waiting: as
    /// [`fp_sys::recv_vectored_nonblocking`] answers.
    pub fn recv_vectored(&mut self, fd: BorrowedFd<'_>, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let mut got = self.read_plain(bufs, 0)?;
        while got < want && !self.eof {
            // Room at the end of the inbound buffer (what the session left is kept).
            if self.in_start > 0 {
                self.inbound.copy_within(self.in_start..self.in_end, 0);
                self.in_end -= self.in_start;
                self.in_start = 0;
            }
            let room = self.inbound.len() - self.in_end;
            if room == 0 {
                // The session takes nothing more until its plaintext is read: the caller
                // reads again once it has room.
                break;
            }
            match fp_sys::recv_nonblocking(fd, &mut self.inbound[self.in_end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.in_end += n;
                    got += self.read_plain(bufs, got)?;
                    // Answers the session wrote (an alert, a key update) go out now.
                    if self.session.pending() > 0 {
                        self.flush(fd)?;
                    }
                    if n < room {
                        break;
                    }
                }
                Err(e) if is_retry(&e) => break,
                Err(e) => return Err(e),
            }
        }
        if got > 0 {
            Ok(got)
        } else if self.eof || self.session.peer_closed() {
            Ok(0)
        } else {
            Err(would_block())
        }
    }

    /// Moves ciphertext from the session into the outbound buffer.
    fn take_ciphertext(&mut self) -> usize {
        if self.out_start == self.out_end {
            self.out_start = 0;
            self.out_end = 0;
        } else if self.out_start > 0 && self.outbound.len() - self.out_end < self.session.pending() {
            self.outbound.copy_within(self.out_start..self.out_end, 0);
            self.out_end -= self.out_start;
            self.out_start = 0;
        }
        let n = self.session.take(&mut self.outbound[self.out_end..]);
        self.out_end += n;
        n
    }

    /// Moves everything the session can encrypt now into the outbound buffer, as far as it has
    /// room: the gathered plaintext sealed, its records taken, again while records come.
    fn drain_session(&mut self) -> io::Result<()> {
        loop {
            self.seal()?;
            if self.take_ciphertext() == 0 {
                return Ok(());
            }
        }
    }

    /// Sends ciphertext waiting for the socket, as much as it takes now; true when nothing is
    /// left.
    pub fn flush(&mut self, fd: BorrowedFd<'_>) -> io::Result<bool> {
        loop {
            self.drain_session()?;
            if self.out_start == self.out_end {
                return Ok(self.plain_len == 0 && self.session.pending() == 0);
            }
            // Every record there is in one system call.
            match fp_sys::send_vectored_nonblocking(
                fd,
                &[IoSlice::new(&self.outbound[self.out_start..self.out_end])],
            ) {
                Ok(n) => self.out_start += n,
                Err(e) if is_retry(&e) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }

    /// Gives the gathered plaintext to the session (one record), as much as it has room for;
    /// true when nothing is left gathered.
    fn seal(&mut self) -> io::Result<bool> {
        if self.plain_len == 0 {
            return Ok(true);
        }
        let n = self.session.write(&self.plain[..self.plain_len]).map_err(tls_io)?;
        if n > 0 {
            // What the session had no room for starts the next write (libssl wants a write
            // it could not finish repeated with the same bytes).
            self.plain.copy_within(n..self.plain_len, 0);
            self.plain_len -= n;
        }
        Ok(self.plain_len == 0)
    }

    /// Encrypts what of `bufs` the stream takes and sends what the socket takes: as
    /// [`fp_sys::send_vectored_nonblocking`] answers (the bytes of `bufs` taken, `WouldBlock`
    /// when none). Taken bytes are the stream's: their ciphertext may remain for
    /// [`TlsStream::flush`].
    pub fn send_vectored(&mut self, fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut taken = 0;
        'pieces: for b in bufs {
            let mut at = 0;
            while at < b.len() {
                let left = b.len() - at;
                if self.plain_len == 0 && left >= MAX_FRAGMENT {
                    // A whole record or more, nothing gathered: straight to the session.
                    let n = self.session.write(&b[at..]).map_err(tls_io)?;
                    at += n;
                    taken += n;
                    if n == 0 && !self.make_room(fd)? {
                        break 'pieces;
                    }
                    continue;
                }
                let n = left.min(self.plain.len() - self.plain_len);
                self.plain[self.plain_len..self.plain_len + n].copy_from_slice(&b[at..at + n]);
                self.plain_len += n;
                at += n;
                taken += n;
                if self.plain_len == self.plain.len() && !self.seal()? && !self.make_room(fd)? {
                    break 'pieces;
                }
            }
        }
        self.flush(fd)?;
        if taken == 0 && !bufs.iter().all(|b| b.is_empty()) {
            return Err(would_block());
        }
        Ok(taken)
    }

    /// The session's outgoing buffer is full: makes room through the socket; false when the
    /// socket takes nothing either.
    fn make_room(&mut self, fd: BorrowedFd<'_>) -> io::Result<bool> {
        // Into the outbound buffer first: the socket gets the records of many PDUs at once.
        if self.take_ciphertext() > 0 {
            return Ok(true);
        }
        let waiting = self.unsent_len();
        self.flush(fd)?;
        Ok(self.unsent_len() < waiting)
    }

    /// Ciphertext not yet taken by the socket, in the outbound buffer and the session.
    fn unsent_len(&self) -> usize {
        self.plain_len + self.out_end - self.out_start + self.session.pending()
    }

    /// Sends close_notify, as far as the socket takes it now.
    pub fn close(&mut self, fd: BorrowedFd<'_>) {
        self.session.close();
        let _ = self.flush(fd);
    }

    /// The blocking form over `socket` (its read and write timeouts bound every wait): for a
    /// handshake thread, before the connection goes to a reactor.
    pub fn blocking<'a, S: Read + Write>(&'a mut self, socket: &'a mut S) -> Blocking<'a, S> {
        Blocking { tls: self, socket }
    }
}

/// A [`TlsStream`] read and written through a blocking socket.
pub struct Blocking<'a, S> {
    tls: &'a mut TlsStream,
    socket: &'a mut S,
}

impl<S: Read + Write> Blocking<'_, S> {
    /// Writes out every byte of ciphertext the session has.
    fn write_out(&mut self) -> io::Result<()> {
        loop {
            self.tls.drain_session()?;
            let t = &mut *self.tls;
            if t.out_start == t.out_end {
                return Ok(());
            }
            self.socket.write_all(&t.outbound[t.out_start..t.out_end])?;
            t.out_start = t.out_end;
        }
    }

    /// Reads ciphertext from the socket into the session; an error at the end of the stream.
    fn read_in(&mut self) -> io::Result<()> {
        let t = &mut *self.tls;
        if t.in_start == t.in_end {
            let n = self.socket.read(&mut t.inbound)?;
            if n == 0 {
                t.eof = true;
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection"));
            }
            t.in_start = 0;
            t.in_end = n;
        }
        t.feed()
    }

    /// Runs the handshake to its end. The socket's timeouts bound each wait for the peer.
    pub fn handshake(&mut self) -> Result<(), HandshakeError> {
        loop {
            let state = match self.tls.session.handshake() {
                Ok(s) => s,
                Err(e) => {
                    // The alert that says why (decrypt_error, unknown_psk_identity) goes to
                    // the peer before the caller closes: best effort.
                    let _ = self.write_out();
                    return Err(HandshakeError::Tls(e));
                }
            };
            self.write_out().map_err(HandshakeError::Io)?;
            if state == HandshakeState::Established {
                return Ok(());
            }
            match self.read_in() {
                Ok(()) => {}
                // A failure the session saw in what arrived is the better reason.
                Err(e) => {
                    return Err(match self.tls.session.handshake() {
                        Err(t) => {
                            let _ = self.write_out();
                            HandshakeError::Tls(t)
                        }
                        Ok(_) => HandshakeError::Io(e),
                    })
                }
            }
        }
    }
}

/// Why a blocking handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The session refused the peer (its kind says why).
    #[error("{0}")]
    Tls(TlsError),
    /// The socket failed or timed out, or the peer closed it.
    #[error("{0}")]
    Io(io::Error),
}

impl<S: Read + Write> Read for Blocking<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let n = self.tls.read_plain(&mut [IoSliceMut::new(buf)], 0)?;
            if n > 0 {
                return Ok(n);
            }
            if self.tls.session.peer_closed() {
                return Ok(0);
            }
            match self.read_in() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            // Answers the session wrote while reading (a key update) go out.
            self.write_out()?;
        }
    }
}

impl<S: Read + Write> Write for Blocking<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut at = 0;
        while at < buf.len() {
            let n = self.tls.session.write(&buf[at..]).map_err(tls_io)?;
            at += n;
            self.write_out()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_out()?;
        self.socket.flush()
    }
}
