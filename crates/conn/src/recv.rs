//! The receive side of a connection: what one non-blocking receive gave, and the buffer
//! headers (and the small payloads that come with them) arrive in.

use std::io;
use std::os::fd::BorrowedFd;

/// What one non-blocking receive gave.
#[derive(Debug)]
pub enum Recv {
    /// This many bytes.
    Data(usize),
    /// Nothing now (or a signal interrupted the call): try again when the socket is readable.
    WouldBlock,
    /// The peer closed its side.
    Eof,
    /// The socket failed; why.
    Failed(String),
}

impl Recv {
    /// A receive call's result as a [`Recv`].
    #[inline]
    pub fn from_result(r: io::Result<usize>) -> Recv {
        match r {
            Ok(0) => Recv::Eof,
            Ok(n) => Recv::Data(n),
            // The common error of a polled socket, told by its number: `kind()` decodes
            // every errno through a long match.
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Recv::WouldBlock,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                Recv::WouldBlock
            }
            Err(e) => Recv::Failed(e.to_string()),
        }
    }

    /// Receives into `dst` from the non-blocking socket `fd`.
    #[inline]
    pub fn from_socket(fd: BorrowedFd<'_>, dst: &mut [u8]) -> Recv {
        Recv::from_result(fp_sys::recv_nonblocking(fd, dst))
    }
}

/// A connection's receive buffer: bytes received and not yet taken are `data()`; they move
/// to the front only when the room after them is needed, so a receive that ends on a
/// header's boundary (the usual case) costs no copy.
pub struct RecvBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The last [`RecvBuf::fill`] brought less than the room it had.
    short: bool,
}

impl RecvBuf {
    /// A buffer of `size` bytes (made once, with the connection).
    pub fn new(size: usize) -> RecvBuf {
        RecvBuf { buf: vec![0u8; size].into_boxed_slice(), start: 0, end: 0, short: false }
    }

    /// Bytes received and not yet taken.
    #[inline]
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether every byte received was taken.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The bytes received and not yet taken.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Takes `n` bytes off the front of [`RecvBuf::data`].
    #[inline]
    pub fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len());
        self.start += n;
    }

    /// Forgets what it holds.
    #[inline]
    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Moves what it holds to the front, so the whole rest of the buffer takes the next
    /// receive.
    #[inline]
    pub fn compact(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Makes room for `need` bytes from the front of what it holds, moving them only when
    /// they would not fit where they are.
    #[inline]
    pub fn reserve(&mut self, need: usize) {
        if self.is_empty() {
            self.clear();
        } else if self.buf.len() - self.start < need {
            self.compact();
        }
    }

    /// The room after what it holds, for a receive; [`RecvBuf::filled`] counts what came.
    #[inline]
    pub fn spare_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.end..]
    }

    /// `n` bytes were received into [`RecvBuf::spare_mut`].
    #[inline]
    pub fn filled(&mut self, n: usize) {
        debug_assert!(self.end + n <= self.buf.len());
        self.end += n;
    }

    /// Receives into the room after what it holds with `recv` (no compaction: see
    /// [`RecvBuf::compact`], [`RecvBuf::reserve`]).
    #[inline]
    pub fn fill(&mut self, recv: impl FnOnce(&mut [u8]) -> Recv) -> Recv {
        let room = self.buf.len() - self.end;
        let r = recv(self.spare_mut());
        self.short = false;
        if let Recv::Data(n) = r {
            self.filled(n);
            self.short = n < room;
        }
        r
    }

    /// Whether the last [`RecvBuf::fill`] brought data but less than the room it had: a
    /// non-blocking stream receive returns short only when the socket holds nothing more
    /// (what the read round's [`crate::round::Reader::drained`] asks).
    #[inline]
    pub fn last_fill_short(&self) -> bool {
        self.short
    }
}
