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
    /// else reads or writes that memory, and for a `Write`, nothing else writes it. The
    /// request may be carried out on another thread than the one that submitted it.
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

// SAFETY: what `from_raw`'s caller vouches for (valid, unaliased buffers until the request
// completes) holds whichever thread looks at them: a request may be carried out off the thread
// that submitted it (an lvstore's owner reads a piece of a volume's read into its buffers).
// Access to the bytes is through `unsafe` or this module's helpers, bound by the same contract.
unsafe impl Send for Iovecs {}
// SAFETY: as for `Send`; `Iovecs` gives only shared reads of the iovec array.
unsafe impl Sync for Iovecs {}

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

/// A channel's pool of equal buffers carved from one allocation (a stacked channel's write
/// buffers): like [`BounceBuf`]s, but one DMA registration for all of them. Each buffer has its
/// own iovec on the heap, so the [`Iovecs`] it hands out stay put when the owner moves.
///
/// Its owner keeps a buffer, and that buffer's iovec, unchanged until every request that
/// carries its [`Iovecs`] has completed (as for [`BounceBuf`]).
pub struct BouncePool {
    buf: AlignedBuf,
    size: usize,
    iov: Box<[libc::iovec]>,
}

impl BouncePool {
    /// `count` zeroed buffers of `size` bytes each.
    pub fn zeroed(count: usize, size: usize) -> BouncePool {
        let mut buf = AlignedBuf::zeroed(count * size);
        let base = buf.as_mut_ptr();
        // `c * size` is inside the allocation of `count * size` bytes (no dereference here).
        let iov = (0..count)
            .map(|c| libc::iovec { iov_base: base.wrapping_add(c * size).cast(), iov_len: size })
            .collect();
        BouncePool { buf, size, iov }
    }

    /// How many buffers it holds.
    pub fn count(&self) -> usize {
        self.iov.len()
    }

    /// The size of each buffer in bytes.
    pub fn buf_size(&self) -> usize {
        self.size
    }

    /// Buffer `c`'s bytes, to fill (panics when `c` is out of range).
    pub fn bytes_mut(&mut self, c: usize) -> &mut [u8] {
        assert!(c < self.iov.len(), "buffer {c} of a pool of {}", self.iov.len());
        &mut self.buf.as_mut_slice()[c * self.size..(c + 1) * self.size]
    }

    /// The first `len` bytes (at most the buffer's size) of buffer `c` as a request's buffers
    /// (panics when `c` is out of range).
    pub fn iovecs(&mut self, c: usize, len: usize) -> Iovecs {
        let start = self.buf.as_mut_ptr().wrapping_add(c * self.size);
        let v = &mut self.iov[c];
        *v = libc::iovec { iov_base: start.cast(), iov_len: len.min(self.size) };
        // SAFETY: the iovec and the bytes (inside the allocation: `c` is in range, checked by
        // the index above) are heap memory this value owns, valid for reads and writes of
        // `iov_len` bytes; its owner keeps them, and touches neither, until the request
        // completes (the type's contract).
        unsafe { Iovecs::from_raw(&*v, 1) }
    }
}

/// Calls `each(k, start, in_place)` for the `k`-th whole `unit`-byte block of the `len` bytes of
/// `iov` from byte `offset` (blocks the iovecs end inside of are left out): `start` is the
/// block's first byte and `in_place` says it lies in one iovec; otherwise the block spans
/// several and starts at byte `offset + k * unit` of the iovecs. Returns how many blocks.
fn walk_units(
    iov: &Iovecs,
    offset: u64,
    len: u64,
    unit: usize,
    mut each: impl FnMut(usize, *mut u8, bool),
) -> usize {
    assert!(unit > 0, "a block of 0 bytes");
    let src = iov.as_slice();
    let mut at = IovCursor::at(iov, offset);
    let blocks = (len / unit as u64) as usize;
    for k in 0..blocks {
        while at.idx < src.len() && at.off == src[at.idx].iov_len as u64 {
            at.idx += 1;
            at.off = 0;
        }
        let Some(v) = src.get(at.idx) else { return k };
        // `off < iov_len`: the pointer stays inside the buffer (no dereference here).
        let start = v.iov_base.cast::<u8>().wrapping_add(at.off as usize);
        if v.iov_len as u64 - at.off >= unit as u64 {
            at.off += unit as u64;
            each(k, start, true);
        } else {
            if held_from(src, at, unit as u64) < unit as u64 {
                return k;
            }
            at.skip(src, unit as u64);
            each(k, start, false);
        }
    }
    blocks
}

/// How many of `want` bytes the iovecs hold from `at` on.
fn held_from(src: &[libc::iovec], at: IovCursor, want: u64) -> u64 {
    let mut held = 0;
    let mut off = at.off;
    for v in src.iter().skip(at.idx) {
        held += v.iov_len as u64 - off;
        off = 0;
        if held >= want {
            return want;
        }
    }
    held
}

/// Calls `f(k, bytes)` for the `k`-th whole `unit`-byte block of the `len` bytes of `iov`
/// from byte `offset`: the request's own memory when the block lies in one iovec (the usual
/// case), a copy in `scratch` (at least `unit` bytes) when it spans several. Returns how many
/// blocks (fewer when the iovecs end first). For a stacked channel that transforms a `Write`'s
/// data block by block into its own buffer (encryption) without copying it first.
///
/// `f` must not write the request's bytes through another helper while it holds them.
pub fn for_each_unit(
    iov: &Iovecs,
    offset: u64,
    len: u64,
    unit: usize,
    scratch: &mut [u8],
    mut f: impl FnMut(usize, &[u8]),
) -> usize {
    walk_units(iov, offset, len, unit, |k, start, in_place| {
        if in_place {
            // SAFETY: `[start, start + unit)` lies inside one iovec, readable by `Iovecs`'
            // contract and written by no one while the request is with us; the borrow ends
            // when `f` returns.
            f(k, unsafe { std::slice::from_raw_parts(start, unit) });
        } else {
            let buf = &mut scratch[..unit];
            copy_to_slice(iov, offset + (k * unit) as u64, buf);
            f(k, buf);
        }
    })
}

/// As [`for_each_unit`], but `f` may change each block: in place when it lies in one iovec, in
/// `scratch` and copied back when it spans several. For a stacked channel that transforms a
/// `Read`'s data in the caller's buffers once the base completes it (decryption).
///
/// `f` must not reach the request's bytes through another helper while it holds them.
pub fn for_each_unit_mut(
    iov: &Iovecs,
    offset: u64,
    len: u64,
    unit: usize,
    scratch: &mut [u8],
    mut f: impl FnMut(usize, &mut [u8]),
) -> usize {
    walk_units(iov, offset, len, unit, |k, start, in_place| {
        if in_place {
            // SAFETY: `[start, start + unit)` lies inside one iovec, writable and accessed by
            // no one else while the request is with us (`Iovecs`' contract); the borrow ends
            // when `f` returns.
            f(k, unsafe { std::slice::from_raw_parts_mut(start, unit) });
        } else {
            let at = offset + (k * unit) as u64;
            let buf = &mut scratch[..unit];
            copy_to_slice(iov, at, buf);
            f(k, buf);
            copy_from_slice(iov, at, buf);
        }
    })
}

/// Calls `each(buffer start, bytes)` for the pieces of `iov` that hold `len` bytes from byte
/// `offset` (fewer when the iovecs end first); returns how many bytes it covered.
pub(crate) fn walk(iov: &Iovecs, offset: u64, len: u64, mut each: impl FnMut(*mut u8, usize)) -> u64 {
    let all = iov.as_slice();
    runs(iov, offset, len, |r| {
        // `off < iov_len`: the pointer stays inside the buffer (no dereference here).
        each(all[r.idx].iov_base.cast::<u8>().wrapping_add(r.off), r.len);
    })
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

/// A place in a request's iovecs: which iovec, and how far into it. A stacked channel that cuts
/// a request into pieces keeps one per request and moves it along piece by piece, so cutting
/// costs one step per iovec, not a walk from the start for every piece; a copy kept before a
/// piece puts the cursor back when the piece is refused (`Busy`) and made again later.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IovCursor {
    idx: usize,
    off: u64,
}

impl IovCursor {
    /// The first byte.
    pub const START: IovCursor = IovCursor { idx: 0, off: 0 };

    /// The cursor at byte `offset` of `iov` (at their end when they hold fewer bytes).
    pub fn at(iov: &Iovecs, offset: u64) -> IovCursor {
        let mut c = IovCursor::START;
        c.skip(iov.as_slice(), offset);
        c
    }

    /// Moves past `len` bytes of `src` (to its end when it holds fewer).
    fn skip(&mut self, src: &[libc::iovec], mut len: u64) {
        while len > 0 && self.idx < src.len() {
            let left = src[self.idx].iov_len as u64 - self.off;
            if len < left {
                self.off += len;
                return;
            }
            len -= left;
            self.idx += 1;
            self.off = 0;
        }
    }

    /// Writes to the front of `out` the iovecs that describe the next `len` bytes of `iov`
    /// (fewer when the iovecs end first: callers check a request's length against its iovecs
    /// before cutting it) and moves past them; returns how many iovecs it wrote. `None`, with
    /// the cursor where it was, when `out` has too little room: the slicer never grows
    /// anything, so a hot path that cuts requests allocates nothing.
    pub fn slice_into(&mut self, iov: &Iovecs, len: u64, out: &mut [libc::iovec]) -> Option<usize> {
        let src = iov.as_slice();
        let (mut idx, mut off, mut left, mut n) = (self.idx, self.off, len, 0);
        while left > 0 && idx < src.len() {
            let v = src[idx];
            let avail = v.iov_len as u64 - off;
            if avail == 0 {
                // A zero-length iovec (or the end of one) describes nothing.
                idx += 1;
                off = 0;
                continue;
            }
            let slot = out.get_mut(n)?;
            let take = avail.min(left);
            // `off < iov_len`: the pointer stays inside the buffer (no dereference here).
            *slot = libc::iovec {
                iov_base: v.iov_base.cast::<u8>().wrapping_add(off as usize).cast(),
                iov_len: take as usize,
            };
            n += 1;
            left -= take;
            off += take;
            if off == v.iov_len as u64 {
                idx += 1;
                off = 0;
            }
        }
        self.idx = idx;
        self.off = off;
        Some(n)
    }
}

/// A fixed array of iovecs that a stacked channel cuts its requests' iovecs into: each piece it
/// sends down carries [`Iovecs`] over a few of its entries, which point into the request's own
/// buffers (zero copy). Made once with the channel (or the request slot) and never grown, on
/// the heap so the [`Iovecs`] it hands out stay put when the owner moves.
///
/// Its owner leaves the entries a piece carries unchanged, and keeps the array, until that piece
/// has completed (as for [`BounceBuf`]); the request the pieces were cut from completes after
/// them, so what its [`Iovecs`] vouch for covers the pieces too.
pub struct IovSlices {
    iov: Box<[libc::iovec]>,
}

impl IovSlices {
    /// Room for `capacity` iovecs.
    pub fn new(capacity: usize) -> IovSlices {
        let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        IovSlices { iov: vec![empty; capacity].into_boxed_slice() }
    }

    /// How many iovecs it holds.
    pub fn capacity(&self) -> usize {
        self.iov.len()
    }

    /// Cuts the next `len` bytes of `src` at `cursor` into entries `at..` (see
    /// [`IovCursor::slice_into`]) and returns them as a piece's buffers, moving the cursor
    /// past them. `None`, with the cursor where it was, when they need more entries than
    /// remain from `at` on.
    pub fn slice(&mut self, at: usize, src: &Iovecs, cursor: &mut IovCursor, len: u64) -> Option<Iovecs> {
        let room = self.iov.get_mut(at..)?;
        let n = cursor.slice_into(src, len, room)?;
        Some(self.describe(at, n))
    }

    /// A copy of all of `src`'s iovecs, entry for entry, in entries `0..`, as a piece's
    /// buffers: for a queue that keeps its own copy of each command's iovecs. One copy of
    /// the array, where [`IovSlices::slice`] walks it iovec by iovec checking each (on the
    /// NVMe/TCP host's path that walk cost about 4 % of the instructions per I/O). `None`
    /// when `src` has more iovecs than it holds.
    #[inline]
    pub fn copy(&mut self, src: &Iovecs) -> Option<Iovecs> {
        let from = src.as_slice();
        self.iov.get_mut(..from.len())?.copy_from_slice(from);
        Some(self.describe(0, from.len()))
    }

    /// The bytes of `src` from byte `offset` cut into consecutive pieces of `lens` bytes, in
    /// entries `0..`, as one piece's buffers: one buffer described as several iovecs (a test's
    /// scattered request). `None` when they need more entries than it holds.
    pub fn cut(&mut self, src: &Iovecs, offset: u64, lens: impl IntoIterator<Item = u64>) -> Option<Iovecs> {
        let mut cursor = IovCursor::at(src, offset);
        let mut n = 0;
        for len in lens {
            n += cursor.slice_into(src, len, self.iov.get_mut(n..)?)?;
        }
        Some(self.describe(0, n))
    }

    /// Entries `at..at + n`, just written from a source's iovecs, as a piece's buffers.
    fn describe(&self, at: usize, n: usize) -> Iovecs {
        // SAFETY: entries `at..at + n` are this value's heap memory, left unchanged by its owner
        // until the piece completes (the type's contract); each describes part of one of the
        // source's buffers, which the source vouches for until the request they belong to
        // completes, after its pieces.
        unsafe { Iovecs::from_slice(&self.iov[at..at + n]) }
    }

    /// The buffers of `parts`, one after another, as one request's: copied into entries
    /// `at..` and returned as one [`Iovecs`]. `None` when they need more entries than remain
    /// from `at` on.
    pub fn joined(&mut self, at: usize, parts: &[Iovecs]) -> Option<Iovecs> {
        let mut end = at;
        for part in parts {
            let room = self.iov.get_mut(end..)?;
            let mut from_start = IovCursor::START;
            end += from_start.slice_into(part, part.total_len(), room)?;
        }
        // SAFETY: as in `slice`: entries `at..end` are this value's own, each a piece of a
        // buffer one of `parts` vouches for; the caller keeps them as the type's contract says.
        Some(unsafe { Iovecs::from_slice(&self.iov[at..end]) })
    }
}

// SAFETY: the entries describe buffers some `Iovecs` vouches for, which may be used from any
// thread (`Iovecs` is `Send`); the array itself is this value's own heap memory.
unsafe impl Send for IovSlices {}

// SAFETY: the bytes and the iovec are this value's own heap memory, reached only through it.
unsafe impl Send for BounceBuf {}

/// A run of bytes inside one buffer of an [`Iovecs`]: which iovec, from where in it, and how
/// many. Found by [`runs`]; a queue that sends a request's data in pieces keeps these (plain
/// numbers, no pointers) and reads the bytes with [`IovRun::bytes`] when the socket takes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IovRun {
    idx: usize,
    off: usize,
    len: usize,
}

impl IovRun {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The run's bytes in `iov`, the iovecs [`runs`] found it in (empty when `iov` holds no
    /// such run: the bounds are checked here).
    pub fn bytes(self, iov: &Iovecs) -> &[u8] {
        match iov.as_slice().get(self.idx) {
            Some(v) if self.off <= v.iov_len && self.len <= v.iov_len - self.off => {
                if self.len == 0 {
                    return &[];
                }
                // SAFETY: inside one iovec (checked above), readable by `Iovecs`' contract and
                // written by no one else while the request is in flight, which is when its
                // holder reads it.
                unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>().add(self.off), self.len) }
            }
            _ => &[],
        }
    }
}

/// Calls `each` with the runs of `iov` that hold `len` bytes from byte `offset` (fewer when the
/// iovecs end first; empty iovecs give none); returns how many bytes they cover.
pub fn runs(iov: &Iovecs, mut offset: u64, len: u64, mut each: impl FnMut(IovRun)) -> u64 {
    let mut left = len;
    for (idx, v) in iov.as_slice().iter().enumerate() {
        if left == 0 {
            break;
        }
        let vlen = v.iov_len as u64;
        if offset >= vlen {
            offset -= vlen;
            continue;
        }
        let take = (vlen - offset).min(left);
        each(IovRun { idx, off: offset as usize, len: take as usize });
        left -= take;
        offset = 0;
    }
    len - left
}

/// Fills the front of `out` with slices over the `len` bytes of `iov` from byte `offset` (as
/// many runs as `out` has room for; fewer bytes when the iovecs end first), for a receive
/// straight into a read's buffers; returns how many slices it wrote.
///
/// The holder of a request (a `Read`, whose buffers nobody else touches while it is in flight:
/// `Iovecs`' contract) makes no other view of these bytes while the slices live.
pub fn io_slices_mut<'a>(
    iov: &'a Iovecs,
    offset: u64,
    len: u64,
    out: &mut [std::io::IoSliceMut<'a>],
) -> usize {
    let mut n = 0;
    walk(iov, offset, len, |p, take| {
        if let Some(slot) = out.get_mut(n) {
            // SAFETY: `[p, p + take)` lies inside one iovec, writable and accessed by no one
            // else while the request is in flight (`Iovecs`' contract); the slices live no
            // longer than the borrow of `iov`, during which its holder makes no other view.
            *slot = std::io::IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(p, take) });
            n += 1;
        }
    });
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three buffers of 4, 0 and 6 bytes over one array holding 0..10.
    fn setup(data: &mut [u8; 10]) -> [libc::iovec; 3] {
        let p = data.as_mut_ptr();
        [
            libc::iovec { iov_base: p.cast(), iov_len: 4 },
            libc::iovec { iov_base: p.wrapping_add(4).cast(), iov_len: 0 },
            libc::iovec { iov_base: p.wrapping_add(4).cast(), iov_len: 6 },
        ]
    }

    /// The bytes `out` describes, in order, and how many entries.
    fn bytes(out: &[libc::iovec]) -> Vec<u8> {
        // SAFETY: slices of the test's own live array.
        let iov = unsafe { Iovecs::from_slice(out) };
        let mut b = vec![0; iov.total_len() as usize];
        copy_to_slice(&iov, 0, &mut b);
        b
    }

    fn slice(iov: &Iovecs, offset: u64, len: u64, room: usize) -> Option<Vec<Vec<u8>>> {
        let mut out = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; room];
        let n = IovCursor::at(iov, offset).slice_into(iov, len, &mut out)?;
        Some(out[..n].iter().map(|v| bytes(std::slice::from_ref(v))).collect())
    }

    #[test]
    fn a_slice_spans_iovecs_and_stops_at_exact_ends() {
        let mut data: [u8; 10] = std::array::from_fn(|i| i as u8);
        let v = setup(&mut data);
        // SAFETY: the test's own array, alive until the end.
        let iov = unsafe { Iovecs::from_slice(&v) };
        assert_eq!(slice(&iov, 2, 5, 4).unwrap(), vec![vec![2, 3], vec![4, 5, 6]]);
        // Ends exactly at an iovec's end, and starts exactly at one's start (skipping the
        // empty one between).
        assert_eq!(slice(&iov, 0, 4, 4).unwrap(), vec![vec![0, 1, 2, 3]]);
        assert_eq!(slice(&iov, 4, 6, 4).unwrap(), vec![vec![4, 5, 6, 7, 8, 9]]);
        assert_eq!(slice(&iov, 0, 10, 2).unwrap(), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7, 8, 9]]);
    }

    #[test]
    fn zero_length_and_past_the_end_slices_describe_nothing() {
        let mut data = [0u8; 10];
        let v = setup(&mut data);
        // SAFETY: as above.
        let iov = unsafe { Iovecs::from_slice(&v) };
        assert_eq!(slice(&iov, 3, 0, 0).unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(slice(&iov, 10, 4, 0).unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(slice(&Iovecs::NONE, 0, 4, 1).unwrap(), Vec::<Vec<u8>>::new());
        // Iovecs that end first: the slice is cut to what they hold.
        assert_eq!(slice(&iov, 8, 4, 4).unwrap().concat().len(), 2);
    }

    #[test]
    fn too_little_room_leaves_the_cursor_where_it_was() {
        let mut data: [u8; 10] = std::array::from_fn(|i| i as u8);
        let v = setup(&mut data);
        // SAFETY: as above.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let mut c = IovCursor::at(&iov, 3);
        let mut one = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 1];
        assert_eq!(c.slice_into(&iov, 2, &mut one), None);
        assert_eq!(c, IovCursor::at(&iov, 3));
        // Piece by piece, the cursor walks on.
        assert_eq!(c.slice_into(&iov, 1, &mut one), Some(1));
        assert_eq!(bytes(&one), vec![3]);
        assert_eq!(c.slice_into(&iov, 3, &mut one), Some(1));
        assert_eq!(bytes(&one), vec![4, 5, 6]);
        assert_eq!(c, IovCursor::at(&iov, 7));
    }

    #[test]
    fn a_copy_keeps_every_entry_and_refuses_too_many() {
        let mut buf = BounceBuf::zeroed(10);
        buf.bytes_mut().copy_from_slice(&std::array::from_fn::<u8, 10, _>(|i| i as u8));
        let whole = buf.iovecs(10);
        let mut cuts = IovSlices::new(3);
        let src = cuts.cut(&whole, 0, [4, 3, 3]).unwrap();
        let mut copies = IovSlices::new(4);
        let copy = copies.copy(&src).unwrap();
        assert_eq!(copy.as_slice().iter().map(|v| v.iov_len).collect::<Vec<_>>(), vec![4, 3, 3]);
        assert_eq!(bytes(copy.as_slice()), (0..10).collect::<Vec<u8>>());
        // The copy is its own: the source's entries may be cut again for the next command.
        let again = cuts.cut(&whole, 5, [5]).unwrap();
        assert_eq!(bytes(again.as_slice()), vec![5, 6, 7, 8, 9]);
        assert_eq!(bytes(copy.as_slice()), (0..10).collect::<Vec<u8>>());
        assert_eq!(copies.copy(&Iovecs::NONE).map(|c| c.count()), Some(0));
        assert!(IovSlices::new(2).copy(&src).is_none());
    }

    #[test]
    fn slices_fill_a_fixed_array_from_a_given_entry() {
        let mut data: [u8; 10] = std::array::from_fn(|i| i as u8);
        let v = setup(&mut data);
        // SAFETY: as above.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let mut slices = IovSlices::new(3);
        let mut c = IovCursor::START;
        let a = slices.slice(0, &iov, &mut c, 3).unwrap();
        assert_eq!((a.count(), a.total_len()), (1, 3));
        // One entry left from entry 2: bytes 3..7 span two iovecs, so they don't fit there,
        // and the cursor stays; past the end there is no room at all.
        assert!(slices.slice(2, &iov, &mut c, 4).is_none());
        assert!(slices.slice(4, &iov, &mut c, 1).is_none());
        assert_eq!(c, IovCursor::at(&iov, 3));
        let b = slices.slice(1, &iov, &mut c, 7).unwrap();
        assert_eq!((b.count(), b.total_len()), (2, 7));
        let mut got = [0u8; 7];
        copy_to_slice(&b, 0, &mut got);
        assert_eq!(got, [3, 4, 5, 6, 7, 8, 9]);
        // The first piece is untouched by the second.
        let mut first = [0u8; 3];
        copy_to_slice(&a, 0, &mut first);
        assert_eq!(first, [0, 1, 2]);
        // A cut describes consecutive pieces in one request, from entry 0: from byte 1, 2
        // bytes, then 3 that span the first two buffers; more pieces than entries don't fit.
        let cut = slices.cut(&iov, 1, [2, 3]).unwrap();
        assert_eq!((cut.count(), cut.total_len()), (3, 5));
        assert_eq!(bytes(cut.as_slice()), vec![1, 2, 3, 4, 5]);
        assert_eq!(cut.as_slice().iter().map(|v| v.iov_len).collect::<Vec<_>>(), vec![2, 1, 2]);
        assert!(slices.cut(&iov, 0, [1, 1, 1, 1]).is_none());
    }

    #[test]
    fn units_are_given_and_changed_in_place_or_through_scratch() {
        let mut data: [u8; 10] = std::array::from_fn(|i| i as u8);
        let v = setup(&mut data);
        // SAFETY: as above.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let mut scratch = [0u8; 3];
        let mut seen = Vec::new();
        // Blocks of 3 from byte 1: [1,2,3] in the first iovec, [4,5,6] in the third (past the
        // empty one), [7,8,9]; with 2-byte blocks from byte 3, [3,4] spans two.
        assert_eq!(for_each_unit(&iov, 1, 9, 3, &mut scratch, |k, b| seen.push((k, b.to_vec()))), 3);
        assert_eq!(seen, vec![(0, vec![1, 2, 3]), (1, vec![4, 5, 6]), (2, vec![7, 8, 9])]);
        seen.clear();
        assert_eq!(for_each_unit(&iov, 3, 4, 2, &mut scratch, |k, b| seen.push((k, b.to_vec()))), 2);
        assert_eq!(seen, vec![(0, vec![3, 4]), (1, vec![5, 6])]);
        // The iovecs end inside the second block: only the whole one.
        assert_eq!(for_each_unit(&iov, 5, 6, 3, &mut scratch, |_, _| {}), 1);
        assert_eq!(for_each_unit(&Iovecs::NONE, 0, 6, 3, &mut scratch, |_, _| {}), 0);
        // Changed blocks land in the iovecs wherever they lie: blocks [2,3,4] (spanning) and
        // [5,6,7] (in place) get 100 + k added.
        let n = for_each_unit_mut(&iov, 2, 6, 3, &mut scratch, |k, b| {
            b.iter_mut().for_each(|x| *x += 100 + k as u8)
        });
        assert_eq!(n, 2);
        assert_eq!(data, [0, 1, 102, 103, 104, 106, 107, 108, 8, 9]);
    }

    #[test]
    fn pool_buffers_are_separate_and_described_by_their_iovecs() {
        let mut pool = BouncePool::zeroed(3, 8);
        assert_eq!((pool.count(), pool.buf_size()), (3, 8));
        pool.bytes_mut(1).copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let a = pool.iovecs(1, 5);
        let b = pool.iovecs(2, 100);
        assert_eq!((a.total_len(), b.total_len()), (5, 8));
        let mut got = [0u8; 5];
        copy_to_slice(&a, 0, &mut got);
        assert_eq!(got, [1, 2, 3, 4, 5]);
        copy_from_slice(&b, 0, &[9; 8]);
        assert_eq!(pool.bytes_mut(2), &[9; 8]);
        assert_eq!(pool.bytes_mut(1), &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(pool.bytes_mut(0).iter().all(|&x| x == 0));
    }

    #[test]
    fn runs_name_bytes_that_read_back_and_skip_empty_iovecs() {
        let mut data: [u8; 10] = std::array::from_fn(|i| i as u8);
        let v = setup(&mut data);
        // SAFETY: as above.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let mut got = Vec::new();
        assert_eq!(runs(&iov, 2, 5, |r| got.push(r.bytes(&iov).to_vec())), 5);
        assert_eq!(got, vec![vec![2, 3], vec![4, 5, 6]]);
        // Past the end: what there is.
        got.clear();
        assert_eq!(runs(&iov, 8, 5, |r| got.push(r.bytes(&iov).to_vec())), 2);
        assert_eq!(got, vec![vec![8, 9]]);
        // A run read against iovecs that do not hold it gives nothing, never bytes past them.
        let mut first = IovRun::default();
        runs(&iov, 4, 6, |r| first = r);
        assert_eq!(first.len(), 6);
        // SAFETY: as above.
        let short = unsafe { Iovecs::from_slice(&v[..1]) };
        assert!(first.bytes(&short).is_empty());
        assert!(first.bytes(&Iovecs::NONE).is_empty());
    }

    #[test]
    fn mutable_slices_receive_into_the_range_only() {
        let mut data = [0u8; 10];
        let v = setup(&mut data);
        // SAFETY: as above.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let mut out: [std::io::IoSliceMut<'_>; 1] =
            std::array::from_fn(|_| std::io::IoSliceMut::new(&mut []));
        // Room for one slice: the first run of the range.
        assert_eq!(io_slices_mut(&iov, 2, 5, &mut out), 1);
        out[0].fill(7);
        let mut back = [0u8; 10];
        copy_to_slice(&iov, 0, &mut back);
        assert_eq!(back, [0, 0, 7, 7, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn joined_parts_read_as_one_request() {
        let mut data: [u8; 10] = std::array::from_fn(|i| i as u8);
        let v = setup(&mut data);
        // SAFETY: as above.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let mut slices = IovSlices::new(4);
        let (mut a, mut b) = (IovCursor::at(&iov, 7), IovCursor::at(&iov, 0));
        let tail = slices.slice(0, &iov, &mut a, 3).unwrap();
        let head = slices.slice(1, &iov, &mut b, 2).unwrap();
        let both = slices.joined(2, &[tail, head]).unwrap();
        assert_eq!((both.count(), both.total_len()), (2, 5));
        let mut got = [0u8; 5];
        copy_to_slice(&both, 0, &mut got);
        assert_eq!(got, [7, 8, 9, 0, 1]);
        // No room for a third entry from entry 3 on.
        assert!(slices.joined(3, &[tail, head]).is_none());
    }
}
