//! A [`Transport`] over memory: a scripted server for the unit tests and the fuzz target. It
//! hands out what the server "sent" and keeps what the client wrote, at most `chunk` bytes per
//! call either way, so replies and requests are cut at any byte.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};

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
    fn readv(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        if self.to_client.is_empty() {
            return if self.closed { Ok(0) } else { Err(io::ErrorKind::WouldBlock.into()) };
        }
        let chunk = self.chunk.max(1);
        let mut n = 0;
        for buf in bufs.iter_mut() {
            let take = buf.len().min(chunk - n).min(self.to_client.len());
            for (dst, b) in buf[..take].iter_mut().zip(self.to_client.drain(..take)) {
                *dst = b;
            }
            n += take;
            if n == chunk || self.to_client.is_empty() {
                break;
            }
        }
        Ok(n)
    }

    fn writev(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let chunk = self.chunk.max(1);
        let mut n = 0;
        for buf in bufs {
            let take = buf.len().min(chunk - n);
            self.from_client.extend_from_slice(&buf[..take]);
            n += take;
            if n == chunk {
                break;
            }
        }
        if n == 0 && !bufs.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }
}
