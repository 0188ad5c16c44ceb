//! A request as a channel takes it: the operation, its buffers, how it ended, why it was not
//! taken; and the list backends hold completions in.

use crate::Iovecs;

/// What a request asks the device to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Read `len` bytes at `offset` into the iovecs.
    Read,
    /// Write `len` bytes at `offset` from the iovecs.
    Write,
    /// Make all completed writes durable.
    Flush,
    /// Deallocate `len` bytes at `offset`; later reads return unspecified data.
    Discard,
    /// Make `len` bytes at `offset` read back as zeroes.
    WriteZeroes,
}

/// One I/O request as handed to a channel.
///
/// `iov` describes the data buffers for `Read` and `Write` (their total length equals `len`);
/// it is ignored for the other operations.
#[derive(Debug, Clone, Copy)]
pub struct IoRequest {
    /// The caller's tag, handed back with the completion.
    pub tag: u32,
    /// What to do.
    pub op: IoOp,
    /// Byte offset on the device; a multiple of the block size.
    pub offset: u64,
    /// Length in bytes; a multiple of the block size.
    pub len: u64,
    /// The data buffers (`Read`, `Write`); [`Iovecs::NONE`] otherwise.
    pub iov: Iovecs,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// Done.
    Success,
    /// The device failed the request; the value is a positive errno for diagnostics.
    Error(i32),
    /// The device does not support this operation.
    Unsupported,
}

/// Why a request was not accepted. The caller keeps ownership of it and may retry later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The channel's queue is full right now; poll and retry.
    #[error("channel queue is full")]
    Busy,
    /// Offset or length is not block-aligned or runs past the end of the device.
    #[error("request is outside the device or not block aligned")]
    OutOfRange,
    /// The device does not support this operation.
    #[error("operation not supported by this device")]
    Unsupported,
}

/// Completions of requests a backend carried out inside `submit`, held for the next `poll`
/// (callers never get a completion from `submit` itself). Grows only to the peak queue depth,
/// then is reused. Public for modules in other crates (the crypto bdev's).
#[derive(Debug)]
pub struct DoneList(Vec<(u32, IoStatus)>);

impl Default for DoneList {
    fn default() -> Self {
        DoneList::new()
    }
}

impl DoneList {
    /// An empty list with room for 1024 completions.
    pub fn new() -> Self {
        DoneList(Vec::with_capacity(1024))
    }

    /// Holds the completion of request `tag` for the next poll. The list is made with room
    /// for a queue's worth; growing it is out of line, so that a caller's fast path saves no
    /// registers for the call (6 instructions per request under callgrind).
    #[inline(always)]
    pub fn push(&mut self, tag: u32, status: IoStatus) {
        if self.0.len() == self.0.capacity() {
            self.push_grown(tag, status);
            return;
        }
        self.0.push((tag, status));
    }

    #[cold]
    #[inline(never)]
    fn push_grown(&mut self, tag: u32, status: IoStatus) {
        self.0.push((tag, status));
    }

    /// Hands every held completion to `done`; returns how many.
    pub fn deliver(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let n = self.0.len();
        for (tag, status) in self.0.drain(..) {
            done(tag, status);
        }
        n
    }

    /// Hands every held completion over by appending it to `out`; returns how many. When `out`
    /// is empty the two lists trade places: no completion is copied, and both keep their
    /// capacity for the next round.
    pub fn deliver_batch(&mut self, out: &mut Vec<(u32, IoStatus)>) -> usize {
        let n = self.0.len();
        if out.is_empty() {
            std::mem::swap(out, &mut self.0);
        } else {
            self.append_to(out);
        }
        n
    }

    /// `deliver_batch` into a list that holds completions already (a caller that polls more
    /// than one channel into one list). Out of line: the append's growth path made every
    /// poll save and restore the registers it needs.
    #[cold]
    #[inline(never)]
    fn append_to(&mut self, out: &mut Vec<(u32, IoStatus)>) {
        out.append(&mut self.0);
    }

    /// How many completions are held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no completion is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request as it was with a raw pointer and a count: wrapping the buffers costs
    /// nothing per request.
    #[allow(dead_code)]
    struct RawRequest {
        tag: u32,
        op: IoOp,
        offset: u64,
        len: u64,
        iov: *const libc::iovec,
        iovcnt: u32,
    }

    #[test]
    fn describing_the_buffers_keeps_the_request_size() {
        assert_eq!(std::mem::size_of::<IoRequest>(), std::mem::size_of::<RawRequest>());
        assert_eq!(std::mem::size_of::<Iovecs>(), 16);
    }
}
