//! The buffers of a request: [`Iovecs`], the one place a caller vouches for them.
//!
//! Describing a buffer is the unsafe step ([`Iovecs::from_raw`], as
//! [`BorrowedFd::borrow_raw`](std::os::fd::BorrowedFd::borrow_raw) is for a descriptor): the
//! caller that builds a request from memory it manages (guest memory, a socket's receive
//! buffer, a benchmark's buffers) promises there that the buffers stay valid until the
//! request completes. Everything after that, submitting, splitting and stacking, is safe.

use std::fmt;

use crate::AlignedBuf;

/// The data buffers of a `Read` or `Write` request: a pointer to `count` iovecs.
///
/// Built only by [`Iovecs::from_raw`] (whose caller vouches for the buffers) or
/// [`Iovecs::NONE`]. The promise covers the request's life: a channel reads these iovecs, and
/// the bytes they describe, only for a request it holds, between `submit` and the completion
/// it reports. Copy, two words: a request carries it by value, with no allocation.
#[derive(Clone, Copy)]
pub struct Iovecs {
    ptr: *const libc::iovec,
    count: u32,
}

impl Iovecs {
    /// No buffers: for `Flush`, `Discard`, `WriteZeroes`, or a zero-length transfer.
    pub const NONE: Iovecs = Iovecs { ptr: std::ptr::null(), count: 0 };

    /// Describes `count` iovecs at `ptr` (`ptr` may be null when `count` is 0).
    ///
    /// # Safety
    /// Until every request carrying this value (or an [`Iovecs`] derived from it) has
    /// completed: `ptr` points to `count` initialised iovecs that nobody modifies; each
    /// describes memory valid for reads and writes of `iov_len` bytes; for a `Read`, nothing
    /// else reads or writes that memory, and for a `Write`, nothing else writes it.
    pub const unsafe fn from_raw(ptr: *const libc::iovec, count: u32) -> Iovecs {
        if count == 0 {
            Iovecs::NONE
        } else {
            Iovecs { ptr, count }
        }
    }

    /// Describes the iovecs of `iov`; as [`Iovecs::from_raw`] with its pointer and length.
    ///
    /// # Safety
    /// As for [`Iovecs::from_raw`]: the slice (and the memory it describes) outlives every
    /// request that carries the result.
    pub unsafe fn from_slice(iov: &[libc::iovec]) -> Iovecs {
        // SAFETY: passed on from our caller; the count of a slice fits u32 in every use (at
        // most IOV_MAX iovecs), and a longer one is cut, which only shortens the promise.
        unsafe { Iovecs::from_raw(iov.as_ptr(), u32::try_from(iov.len()).unwrap_or(u32::MAX)) }
    }

    /// The iovecs as a slice.
    pub fn as_slice(&self) -> &[libc::iovec] {
        if self.count == 0 {
            return &[];
        }
        // SAFETY: non-null (from_raw stores a null pointer only with count 0) and, by
        // from_raw's contract, `count` initialised iovecs not modified while a request
        // carrying them is in flight, which is when channels call this.
        unsafe { std::slice::from_raw_parts(self.ptr, self.count as usize) }
    }

    /// The pointer, for a system call that takes the array as it is (`preadv`, an io_uring
    /// `READV`): the memory stays valid as [`Iovecs::from_raw`]'s caller promised.
    pub fn as_ptr(&self) -> *const libc::iovec {
        self.ptr
    }

    /// Number of iovecs.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether there are no iovecs.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Total bytes the iovecs describe (saturating: a sum past `u64::MAX` cannot match any
    /// request length).
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().fold(0u64, |t, v| t.saturating_add(v.iov_len as u64))
    }
}

impl Default for Iovecs {
    fn default() -> Iovecs {
        Iovecs::NONE
    }
}

impl fmt::Debug for Iovecs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iovecs").field("ptr", &self.ptr).field("count", &self.count).finish()
    }
}

/// A buffer a channel owns and sends down as a request's data (a copy job's chunk, a corrupted
/// write's bounce copy): page-aligned bytes and the iovec that describes them, both on the heap,
/// so the [`Iovecs`] it hands out stay put when the owner moves.
///
/// Its owner keeps it, unchanged, until every request that carries its [`Iovecs`] has
/// completed: a stacked channel holds it next to the channels below, which it owns, and
/// reuses it only for the next request once the last one completed.
pub struct BounceBuf {
    buf: AlignedBuf,
    iov: Box<libc::iovec>,
}

impl BounceBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> BounceBuf {
        let mut buf = AlignedBuf::zeroed(len);
        let iov = Box::new(libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len });
        BounceBuf { buf, iov }
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// The bytes, to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    /// The first `len` bytes (at most the buffer's size) as a request's buffers.
    pub fn iovecs(&mut self, len: usize) -> Iovecs {
        *self.iov = libc::iovec { iov_base: self.buf.as_mut_ptr().cast(), iov_len: len.min(self.buf.len()) };
        // SAFETY: the iovec and the bytes are heap memory this value owns, valid for reads and
        // writes of `iov_len` bytes; its owner keeps it, and touches neither, until the
        // request completes (the type's contract).
        unsafe { Iovecs::from_raw(&*self.iov, 1) }
    }
}

/// Calls `each(buffer start, bytes)` for the pieces of `iov` that hold `len` bytes from byte
/// `offset` (fewer when the iovecs end first); returns how many bytes it covered.
fn walk(iov: &Iovecs, mut offset: u64, len: u64, mut each: impl FnMut(*mut u8, usize)) -> u64 {
    let mut left = len;
    for v in iov.as_slice() {
        if left == 0 {
            break;
        }
        let vlen = v.iov_len as u64;
        if offset >= vlen {
            offset -= vlen;
            continue;
        }
        let take = (vlen - offset).min(left);
        // `offset < iov_len`: the pointer stays inside the buffer (no dereference here).
        each(v.iov_base.cast::<u8>().wrapping_add(offset as usize), take as usize);
        left -= take;
        offset = 0;
    }
    len - left
}

/// Copies the bytes of `iov` from byte `offset` into `dst` (as many as both hold); returns how
/// many.
pub fn copy_to_slice(iov: &Iovecs, offset: u64, dst: &mut [u8]) -> usize {
    let mut done = 0;
    walk(iov, offset, dst.len() as u64, |p, n| {
        // SAFETY: `[p, p + n)` lies inside one iovec, readable by `Iovecs`' contract and not
        // written by anyone while the request is with us; `dst` is ours, so they don't overlap.
        unsafe { std::ptr::copy_nonoverlapping(p, dst[done..].as_mut_ptr(), n) };
        done += n;
    }) as usize
}

/// Copies `src` into the bytes of `iov` from byte `offset` (as many as both hold); returns how
/// many. For a request whose buffers the channel fills (a `Read`).
pub fn copy_from_slice(iov: &Iovecs, offset: u64, src: &[u8]) -> usize {
    let mut done = 0;
    walk(iov, offset, src.len() as u64, |p, n| {
        // SAFETY: `[p, p + n)` lies inside one iovec, writable and accessed by no one else
        // while the request is with us (`Iovecs`' contract); `src` is ours, so no overlap.
        unsafe { std::ptr::copy_nonoverlapping(src[done..].as_ptr(), p, n) };
        done += n;
    }) as usize
}

/// Zeroes `len` bytes of `iov` from byte `offset` (fewer when the iovecs end first); returns
/// how many.
pub fn zero(iov: &Iovecs, offset: u64, len: u64) -> u64 {
    walk(iov, offset, len, |p, n| {
        // SAFETY: as in `copy_from_slice`: inside one iovec, writable and ours for now.
        unsafe { std::ptr::write_bytes(p, 0, n) };
    })
}

/// Appends to `out` the iovecs that describe `len` bytes of `iov` from byte `offset` (cut to
/// what the iovecs hold); returns how many it appended. The pieces point into the same
/// buffers, so what `iov` vouches for covers them.
pub fn push_slice(iov: &Iovecs, offset: u64, len: u64, out: &mut Vec<libc::iovec>) -> usize {
    let start = out.len();
    walk(iov, offset, len, |p, n| out.push(libc::iovec { iov_base: p.cast(), iov_len: n }));
    out.len() - start
}
