//! A RAM disk's memory: one private anonymous mapping, reserved at the most the disk may grow
//! to and accessible only up to its current size, that requests copy into and out of.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::iov::{walk, Iovecs};

/// A private anonymous mapping reserved at the most a RAM disk may grow to, unmapped on drop.
/// Only its first [`accessible`](ReservedMapping::accessible) bytes are readable and writable
/// (the rest is `PROT_NONE`, costing address space only); that part only grows, so an access
/// checked against it stays inside mapped memory even while another thread grows it.
///
/// The bytes are never lent out as Rust references: every access copies between the mapping
/// and a request's iovecs, and each one is checked against the accessible part, so the type's
/// whole API is safe.
pub(crate) struct ReservedMapping {
    base: NonNull<u8>,
    /// The whole mapping (the reserve).
    len: usize,
    /// Bytes from `base` that are readable and writable; only grows.
    accessible: AtomicUsize,
    page_size: usize,
}

// SAFETY: a pointer to a mapping it owns exclusively (nothing else unmaps or remaps it) and
// which stays mapped until drop, so moving it to another thread is fine.
unsafe impl Send for ReservedMapping {}

// SAFETY: shared access only ever goes through raw-pointer copies into and out of the mapping
// (no references to its bytes are created), and the mapping itself is never changed while shared
// but for more of it becoming accessible. Concurrent accesses to *overlapping* bytes race on
// plain memory the way two DMA engines do on a real disk: a RAM disk documents the content of
// such blocks as unspecified, and the bytes are only ever treated as opaque data (no Rust value
// with validity invariants lives there). Non-overlapping accesses touch disjoint bytes.
unsafe impl Sync for ReservedMapping {}

/// Which way [`ReservedMapping::copy`] moves bytes.
#[derive(Clone, Copy)]
enum Direction {
    IntoIovecs,
    FromIovecs,
}

/// An access outside the accessible part of a [`ReservedMapping`].
#[derive(Debug, thiserror::Error)]
#[error("bytes {offset}..{end} are outside the {accessible} accessible bytes of the mapping")]
pub(crate) struct OutsideMapping {
    offset: u64,
    end: u64,
    accessible: usize,
}

impl ReservedMapping {
    /// `size` bytes accessible in a mapping of `reserve` bytes (at least `size`).
    pub(crate) fn new(size: usize, reserve: usize) -> std::io::Result<ReservedMapping> {
        let len = reserve.max(size);
        // Beyond `size`, nothing is accessible and nothing committed until it grows.
        let (prot, flags) = if len > size {
            (libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE)
        } else {
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
        };
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing aliases no
        // existing memory; all arguments are plain values. The advice is on exactly the mapping
        // just created: a fork (a helper process, say) would otherwise make every later write
        // to the disk copy its page while the child lives (an optimisation: failure ignored).
        let p = unsafe {
            let p = libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0);
            if p != libc::MAP_FAILED {
                libc::madvise(p, len, libc::MADV_DONTFORK);
            }
            p
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: sysconf has no preconditions.
        let page_size = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            n if n > 0 => n as usize,
            _ => 4096,
        };
        let mem = ReservedMapping {
            // mmap never returns null on success for a non-fixed mapping.
            base: NonNull::new(p.cast())
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?,
            len,
            accessible: AtomicUsize::new(if len > size { 0 } else { len }),
            page_size,
        };
        mem.make_accessible(size)?;
        Ok(mem)
    }

    /// The whole mapping's length: the most [`make_accessible`](Self::make_accessible) reaches.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes from the start that are readable and writable.
    pub(crate) fn accessible(&self) -> usize {
        self.accessible.load(Ordering::Acquire)
    }

    /// Makes the first `size` bytes readable and writable (more of the reserve, never less).
    /// Callers serialise growth (a device's resizes); accesses may run meanwhile.
    pub(crate) fn make_accessible(&self, size: usize) -> std::io::Result<()> {
        let want = size.next_multiple_of(self.page_size).min(self.len);
        let have = self.accessible.load(Ordering::Acquire);
        if want <= have {
            return Ok(());
        }
        // SAFETY: `[have, want)` is inside our mapping and not accessed by anyone (every access
        // is checked against `accessible`, which is still `have`); changing its protection
        // affects nothing else.
        let rc = unsafe {
            libc::mprotect(
                self.base.as_ptr().add(have).cast(),
                want - have,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.accessible.store(want, Ordering::Release);
        Ok(())
    }

    /// `[offset, offset + len)` if it lies inside the accessible part.
    fn check(&self, offset: u64, len: u64) -> Result<usize, OutsideMapping> {
        let accessible = self.accessible();
        let end = offset.saturating_add(len);
        if end > accessible as u64 {
            return Err(OutsideMapping { offset, end, accessible });
        }
        Ok(offset as usize)
    }

    /// Copies `[offset, offset + total length of iov)` of the mapping into the iovecs.
    pub(crate) fn read_into(&self, offset: u64, iov: &Iovecs) -> Result<(), OutsideMapping> {
        self.copy(offset, iov, Direction::IntoIovecs)
    }

    /// Copies the iovecs into the mapping from `offset`.
    pub(crate) fn write_from(&self, offset: u64, iov: &Iovecs) -> Result<(), OutsideMapping> {
        self.copy(offset, iov, Direction::FromIovecs)
    }

    /// The one copy between the mapping, from `offset`, and a request's iovecs.
    #[inline]
    fn copy(&self, offset: u64, iov: &Iovecs, direction: Direction) -> Result<(), OutsideMapping> {
        let mut at = self.check(offset, iov.total_len())?;
        walk(iov, 0, iov.total_len(), |p, n| {
            let here = self.base.as_ptr().wrapping_add(at);
            let (from, to) = match direction {
                Direction::IntoIovecs => (here.cast_const(), p),
                Direction::FromIovecs => (p.cast_const(), here),
            };
            // SAFETY: `[at, at + n)` is inside the accessible part (checked above, it only
            // grows); `[p, p + n)` lies inside one iovec, ours while the request is with us and
            // writable for a read, readable for a write (`Iovecs`' contract); request buffers
            // never alias our private mapping.
            unsafe { std::ptr::copy_nonoverlapping(from, to, n) };
            at += n;
        });
        Ok(())
    }

    /// Makes `[offset, offset + len)` read back as zeroes, giving whole pages back to the kernel.
    pub(crate) fn zero(&self, offset: u64, len: u64) -> Result<(), OutsideMapping> {
        let offset = self.check(offset, len)?;
        let end = offset + len as usize;
        let page_start = offset.next_multiple_of(self.page_size).min(end);
        let page_end = (end / self.page_size * self.page_size).max(page_start);
        let clear = |from: usize, to: usize| {
            if to > from {
                // SAFETY: `[from, to)` lies inside `[offset, end)`, inside the accessible part.
                unsafe { std::ptr::write_bytes(self.base.as_ptr().add(from), 0, to - from) };
            }
        };
        clear(offset, page_start);
        clear(page_end, end);
        if page_end > page_start {
            // SAFETY: the range is page aligned and inside our private anonymous mapping; after
            // MADV_DONTNEED such pages read back as zeroes, which is exactly what is asked for.
            let rc = unsafe {
                libc::madvise(
                    self.base.as_ptr().add(page_start).cast(),
                    page_end - page_start,
                    libc::MADV_DONTNEED,
                )
            };
            if rc != 0 {
                // Cannot fail for a valid private anonymous range; stay correct regardless.
                clear(page_start, page_end);
            }
        }
        Ok(())
    }

    /// Pages of the mapping the kernel currently backs with memory.
    #[cfg(test)]
    pub(crate) fn resident_pages(&self) -> usize {
        let pages = self.len.div_ceil(self.page_size);
        let mut vec = vec![0u8; pages];
        // SAFETY: `base`/`len` are our mapping; `vec` has one byte per page.
        let rc = unsafe { libc::mincore(self.base.as_ptr().cast(), self.len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| *b & 1 != 0).count()
    }
}

impl Drop for ReservedMapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping created in `new`, and nothing can use it
        // any more: we are being dropped, so no access is running.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
