//! A request as a channel takes it: the operation, its buffers, how it ended, why it was not
//! taken; and the helpers backends share to read its iovecs and hold completions.

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
/// `iov`/`iovcnt` describe the data buffers for `Read` and `Write` (their total length equals
/// `len`); they are ignored for the other operations.
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
    /// The data buffers (`Read`, `Write`).
    pub iov: *const libc::iovec,
    /// Number of iovecs at `iov`.
    pub iovcnt: u32,
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

/// Total bytes described by an iovec array.
///
/// # Safety
/// `iov` must point to `iovcnt` readable iovecs.
pub unsafe fn iov_total_len(iov: *const libc::iovec, iovcnt: u32) -> u64 {
    let mut total = 0u64;
    for i in 0..iovcnt as usize {
        // SAFETY: the caller guarantees `iovcnt` readable elements.
        total += unsafe { (*iov.add(i)).iov_len } as u64;
    }
    total
}

/// The iovecs of a `Read` or `Write` request as a slice (empty when `iovcnt` is 0, whatever
/// `iov` holds, so a null pointer is fine then).
///
/// # Safety
/// As for [`IoChannel::submit`](crate::IoChannel::submit): when `req.iovcnt` is non-zero, `req.iov` points to that many
/// readable iovecs that stay valid and unmodified for `'a`.
pub unsafe fn request_iovecs<'a>(req: &IoRequest) -> &'a [libc::iovec] {
    if req.iovcnt == 0 || req.iov.is_null() {
        return &[];
    }
    // SAFETY: non-null and, by the caller's contract, `iovcnt` initialised iovecs valid for 'a;
    // iovec's alignment is guaranteed by the pointer's type.
    unsafe { std::slice::from_raw_parts(req.iov, req.iovcnt as usize) }
}

/// Completions of requests a backend carried out inside `submit`, held for the next `poll`
/// (callers never get a completion from `submit` itself). Grows only to the peak queue depth,
/// then is reused.
pub(crate) struct DoneList(Vec<(u32, IoStatus)>);

impl DoneList {
    pub(crate) fn new() -> Self {
        DoneList(Vec::with_capacity(1024))
    }

    pub(crate) fn push(&mut self, tag: u32, status: IoStatus) {
        self.0.push((tag, status));
    }

    /// Hands every held completion to `done`; returns how many.
    pub(crate) fn deliver(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let n = self.0.len();
        for (tag, status) in self.0.drain(..) {
            done(tag, status);
        }
        n
    }

    /// Hands every held completion over by appending it to `out`; returns how many. When `out`
    /// is empty the two lists trade places: no completion is copied, and both keep their
    /// capacity for the next round.
    pub(crate) fn deliver_batch(&mut self, out: &mut Vec<(u32, IoStatus)>) -> usize {
        let n = self.0.len();
        if out.is_empty() {
            std::mem::swap(out, &mut self.0);
        } else {
            out.append(&mut self.0);
        }
        n
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}
