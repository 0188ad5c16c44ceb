//! A [`Transport`] over memory: a scripted server for the unit tests and the fuzz target. It
//! hands out what the server "sent" and keeps what the client wrote, at most `chunk` bytes per
//! call either way, so replies and requests are cut at any byte.

use std::collections::VecDeque;
use std::io;

use crate::client::wire::Transport;

/// The server's side of an in-memory stream.
#[derive(Debug, Default)]
pub struct MemoryTransport {
    /// What the server sends, not yet read by the client.
    pub to_client: VecDeque<u8>,
    /// What the client wrote.
    pub from_client: Vec<u8>,
    /// The most bytes one read or write moves (0 is taken as 1).
    pub chunk: usize,
    /// The server closed: reads end with end-of-stream once `to_client` is empty, writes fail.
    pub closed: bool,
}

impl MemoryTransport {
    /// An open stream moving at most `chunk` bytes per call.
    pub fn new(chunk: usize) -> MemoryTransport {
        MemoryTransport { chunk: chunk.max(1), ..MemoryTransport::default() }
    }
}

impl Transport for MemoryTransport {
    unsafe fn readv(&mut self, iov: &[libc::iovec]) -> io::Result<usize> {
        if self.to_client.is_empty() {
            return if self.closed { Ok(0) } else { Err(io::ErrorKind::WouldBlock.into()) };
        }
        let mut n = 0;
        for v in iov {
            let take = v.iov_len.min(self.chunk.max(1) - n).min(self.to_client.len());
            for i in 0..take {
                let b = self.to_client.pop_front().expect("counted");
                // SAFETY: the caller's iovecs are writable; `i < iov_len`.
                unsafe { *v.iov_base.cast::<u8>().add(i) = b };
            }
            n += take;
            if n == self.chunk.max(1) || self.to_client.is_empty() {
                break;
            }
        }
        Ok(n)
    }

    unsafe fn writev(&mut self, iov: &[libc::iovec]) -> io::Result<usize> {
        if self.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut n = 0;
        for v in iov {
            let take = v.iov_len.min(self.chunk.max(1) - n);
            // SAFETY: the caller's iovecs are readable; `take <= iov_len`.
            let s = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), take) };
            self.from_client.extend_from_slice(s);
            n += take;
            if n == self.chunk.max(1) {
                break;
            }
        }
        if n == 0 && !iov.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }
}
