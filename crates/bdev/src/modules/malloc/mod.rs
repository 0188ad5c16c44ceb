//! The RAM backend (SPDK's "malloc" bdev): a disk held in anonymous memory.
//!
//! The device owns one private anonymous mapping of the whole disk, shared through an [`Arc`]
//! with every channel opened on it, so the data lives as long as the device or its last channel.
//! Pages are allocated by the kernel on first write: a fresh 1 GiB disk costs address space, not
//! 1 GiB of resident memory, and reads of never-written blocks see zeroes.
//!
//! Channels on different cores copy into and out of the mapping concurrently without locks.
//! As on a real disk, requests that overlap and run at the same time on different channels give
//! unspecified data for the overlapping blocks (any mix of old and new bytes); the block layer
//! above orders dependent requests. Non-overlapping requests never interfere.
//!
//! Every request is carried out inside [`IoChannel::submit`] (a `memcpy` is cheaper than any
//! queueing) and its completion is handed back by the next [`IoChannel::poll`], never from
//! `submit` itself, so callers see the same ordering as with an asynchronous device.
//!
//! * `Read`/`Write`: copy between the iovecs and the mapping.
//! * `Flush`: succeeds at once; there is nothing more durable to reach.
//! * `Discard` and `WriteZeroes`: the range reads back as zeroes afterwards. Whole pages inside
//!   the range are returned to the kernel (`MADV_DONTNEED`), so discarding memory frees it; the
//!   partial pages at either end are cleared in place.
//! * A `Read`/`Write` whose iovecs do not add up to `len` completes with `Error(EINVAL)` and
//!   moves no data.
//! * Block status keeps the trait's default, all data: which pages the kernel has handed out
//!   says nothing dependable about the disk (`mincore` would call a swapped-out page a hole).
//!
//! Resizing (`bdev_malloc_resize`): the mapping is made once at the largest size the disk may
//! grow to ([`RamDevice::with_reserve`]), inaccessible (`PROT_NONE`, no memory committed)
//! beyond the current size. Growing makes more of it accessible in place, so channels on other
//! cores never see the disk move; shrinking zeroes the tail (returning its pages) and leaves it
//! accessible, so a request checked just before the shrink still touches mapped memory.

use std::ptr::NonNull;
use std::sync::Arc;

mod rpc;

pub use rpc::MallocModule;

use crate::{
    validate_geometry, BdevError, BdevInfo, BlockDevice, Capacity, DoneList, IoChannel, IoOp, IoRequest,
    IoStatus, SubmitError, ALL_IO_TYPES,
};

/// A RAM disk (SPDK's malloc bdev): its blocks live in this process's memory.
pub struct RamDevice {
    info: BdevInfo,
    mem: Arc<RamMemory>,
}

impl RamDevice {
    /// A RAM disk of a fixed size.
    pub fn new(name: &str, block_size: u32, num_blocks: u64) -> Result<Self, BdevError> {
        RamDevice::with_reserve(name, block_size, num_blocks, 0)
    }

    /// A RAM disk that may later grow to `reserve` bytes (less or 0: it may not grow). The
    /// reserve costs address space only; if even that cannot be had, the disk may not grow.
    pub fn with_reserve(
        name: &str,
        block_size: u32,
        num_blocks: u64,
        reserve: u64,
    ) -> Result<Self, BdevError> {
        validate_geometry(name, block_size, num_blocks)?;
        let size = num_blocks * u64::from(block_size);
        let mem = RamMemory::new(size, reserve.max(size)).or_else(|_| RamMemory::new(size, size))?;
        Ok(RamDevice {
            info: BdevInfo {
                name: name.to_string(),
                product_name: "Malloc disk".into(),
                block_size,
                capacity: Capacity::new(num_blocks),
                io_types: ALL_IO_TYPES,
                driver: "malloc",
                driver_specific: None,
            },
            mem: Arc::new(mem),
        })
    }
}

impl BlockDevice for RamDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(RamChannel {
            info: self.info.clone(),
            mem: Arc::clone(&self.mem),
            done: DoneList::new(),
        }))
    }

    /// Grows within the reserve made at creation, or shrinks (the dropped blocks read back as
    /// zeroes if the disk grows again).
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        let info = &self.info;
        validate_geometry(&info.name, info.block_size, num_blocks)?;
        let old = info.size_bytes() as usize;
        let new = num_blocks.saturating_mul(u64::from(info.block_size));
        if new > self.mem.len as u64 {
            return Err(BdevError::InvalidParam {
                field: "new_size",
                reason: format!(
                    "{new} bytes is more than this RAM disk can grow to ({} bytes, the limit when it \
                     was created: limits.max_malloc_bytes)",
                    self.mem.len
                ),
            });
        }
        let new = new as usize;
        if new > old {
            self.mem.make_accessible(new)?;
        } else {
            // SAFETY: `[new, old)` is inside the accessible part of the mapping.
            unsafe { self.mem.zero(new, old - new) };
        }
        info.capacity.set(num_blocks);
        Ok(())
    }
}

/// The disk's memory: one private anonymous mapping of the most the disk may grow to, unmapped
/// on drop. Only its first `accessible` bytes may be touched.
struct RamMemory {
    base: NonNull<u8>,
    /// The whole mapping (the reserve).
    len: usize,
    /// Bytes from `base` that are readable and writable; only grows (under the registry's
    /// serialisation of resizes), so a channel's range check against the capacity, which never
    /// exceeds it, keeps every access inside.
    accessible: std::sync::atomic::AtomicUsize,
    page_size: usize,
}

// SAFETY: `RamMemory` is a pointer to a mapping it owns exclusively (nothing else unmaps or
// remaps it) and which stays mapped until drop, so moving it to another thread is fine.
unsafe impl Send for RamMemory {}

// SAFETY: shared access only ever goes through raw-pointer copies into and out of the mapping
// (no references to its bytes are created), and the mapping itself is never changed while shared.
// Concurrent accesses to *overlapping* bytes race on plain memory the way two DMA engines do on
// a real disk: the device documents the content of such blocks as unspecified, and the bytes are
// only ever treated as opaque data (no Rust value with validity invariants lives there).
// Non-overlapping accesses touch disjoint bytes.
unsafe impl Sync for RamMemory {}

impl RamMemory {
    /// `size` bytes accessible in a mapping of `reserve` bytes (at least `size`).
    fn new(size: u64, reserve: u64) -> Result<Self, BdevError> {
        let len = usize::try_from(reserve.max(size)).map_err(|_| BdevError::NoMemory(reserve))?;
        let size = size as usize;
        // Beyond `size`, nothing is accessible and nothing committed until the disk grows.
        let (prot, flags) = if len > size {
            (libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE)
        } else {
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
        };
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing aliases no
        // existing memory; all arguments are plain values.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            log::warn!("malloc bdev: mmap of {len} bytes failed: {}", std::io::Error::last_os_error());
            return Err(BdevError::NoMemory(len as u64));
        }
        // A fork (a helper process, say) would otherwise make every later write to the disk
        // copy its page while the child lives. Purely an optimisation, so failure is ignored.
        // SAFETY: the range is exactly the mapping just created.
        unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
        // SAFETY: sysconf has no preconditions.
        let page_size = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            n if n > 0 => n as usize,
            _ => 4096,
        };
        let mem = RamMemory {
            // mmap never returns null on success for a non-fixed mapping.
            base: NonNull::new(p.cast()).ok_or(BdevError::NoMemory(len as u64))?,
            len,
            accessible: std::sync::atomic::AtomicUsize::new(if len > size { 0 } else { len }),
            page_size,
        };
        mem.make_accessible(size)?;
        Ok(mem)
    }

    /// Makes the first `size` bytes readable and writable (more of the reserve, never less).
    fn make_accessible(&self, size: usize) -> Result<(), BdevError> {
        use std::sync::atomic::Ordering::Relaxed;
        let want = size.next_multiple_of(self.page_size).min(self.len);
        let have = self.accessible.load(Relaxed);
        if want <= have {
            return Ok(());
        }
        // SAFETY: `[have, want)` is inside our mapping and not accessed by anyone (it is beyond
        // every capacity so far); changing its protection affects nothing else.
        let rc = unsafe {
            libc::mprotect(
                self.base.as_ptr().add(have).cast(),
                want - have,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            log::warn!("malloc bdev: cannot grow to {size} bytes: {}", std::io::Error::last_os_error());
            return Err(BdevError::NoMemory(size as u64));
        }
        self.accessible.store(want, Relaxed);
        Ok(())
    }

    /// Copies `[offset, offset + total length of iov)` of the disk into the iovecs.
    ///
    /// # Safety
    /// The range must be inside the mapping and every iovec must describe writable memory that
    /// nothing else accesses during the call.
    unsafe fn read_into(&self, mut offset: usize, iov: &[libc::iovec]) {
        for v in iov {
            // SAFETY: the caller guarantees the source range is inside the mapping and the
            // destination is valid for `iov_len` bytes; guest buffers never alias the disk's
            // private mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.as_ptr().add(offset),
                    v.iov_base.cast::<u8>(),
                    v.iov_len,
                );
            }
            offset += v.iov_len;
        }
    }

    /// Copies the iovecs to the disk starting at `offset`.
    ///
    /// # Safety
    /// The range must be inside the mapping and every iovec must describe readable memory.
    unsafe fn write_from(&self, mut offset: usize, iov: &[libc::iovec]) {
        for v in iov {
            // SAFETY: as in `read_into`, with source and destination swapped.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    v.iov_base.cast::<u8>().cast_const(),
                    self.base.as_ptr().add(offset),
                    v.iov_len,
                );
            }
            offset += v.iov_len;
        }
    }

    /// Makes `[offset, offset + len)` read back as zeroes, giving whole pages back to the kernel.
    ///
    /// # Safety
    /// The range must be inside the mapping.
    unsafe fn zero(&self, offset: usize, len: usize) {
        let end = offset + len;
        let page_start = offset.next_multiple_of(self.page_size).min(end);
        let page_end = (end / self.page_size * self.page_size).max(page_start);
        let clear = |from: usize, to: usize| {
            if to > from {
                // SAFETY: `[from, to)` lies inside `[offset, end)`, inside the mapping by the
                // caller's contract.
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
    }
}

impl Drop for RamMemory {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping created in `new`, and nothing can use it
        // any more: every channel holds the `Arc` this value lives in.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

struct RamChannel {
    info: BdevInfo,
    mem: Arc<RamMemory>,
    /// Requests carried out by `submit`, handed back by the next `poll`.
    done: DoneList,
}

impl IoChannel for RamChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        // `check_range` keeps the range inside the mapping, whose length fits `usize`.
        let offset = req.offset as usize;
        let status = match req.op {
            IoOp::Read | IoOp::Write => {
                let iov = req.iov.as_slice();
                let total = iov.iter().try_fold(0u64, |t, v| t.checked_add(v.iov_len as u64));
                if total != Some(req.len) {
                    IoStatus::Error(libc::EINVAL)
                } else if req.op == IoOp::Read {
                    // SAFETY: the range is inside the disk (checked above, and the iovecs add up
                    // to `len`); the request's `Iovecs` vouch for writable, unshared buffers.
                    unsafe { self.mem.read_into(offset, iov) };
                    IoStatus::Success
                } else {
                    // SAFETY: as above, with readable buffers.
                    unsafe { self.mem.write_from(offset, iov) };
                    IoStatus::Success
                }
            }
            IoOp::Flush => IoStatus::Success,
            IoOp::Discard | IoOp::WriteZeroes => {
                // SAFETY: the range was checked against the device size, the mapping's length.
                unsafe { self.mem.zero(offset, req.len as usize) };
                IoStatus::Success
            }
        };
        self.done.push(req.tag, status);
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.done.deliver(done)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Iovecs;

    /// Pages of the mapping the kernel currently backs with memory.
    fn resident_pages(mem: &RamMemory) -> usize {
        let pages = mem.len.div_ceil(mem.page_size);
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is our mapping; `vec` has one byte per page as mincore requires.
        let rc = unsafe { libc::mincore(mem.base.as_ptr().cast(), mem.len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    fn run(ch: &mut dyn IoChannel, req: IoRequest) -> IoStatus {
        ch.submit(&req).unwrap();
        let mut status = None;
        assert_eq!(ch.poll(&mut |_, s| status = Some(s)), 1);
        status.unwrap()
    }

    #[test]
    fn large_disk_costs_no_memory_until_written_and_discard_frees_it() {
        let dev = RamDevice::new("big", 4096, 1 << 18).unwrap(); // 1 GiB
        assert_eq!(dev.info().size_bytes(), 1 << 30);
        assert!(resident_pages(&dev.mem) < 16, "fresh disk is resident");

        let mut ch = dev.open_channel().unwrap();
        let mut buf = vec![0xabu8; 1 << 20];
        let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let write = IoRequest {
            tag: 1,
            op: IoOp::Write,
            offset: 512 << 20,
            len: buf.len() as u64,
            // SAFETY: the test keeps the buffers and their iovecs until the request completes.
            iov: unsafe { Iovecs::from_raw(&iov, 1) },
        };
        assert_eq!(run(&mut *ch, write), IoStatus::Success);
        // 256 pages of 4 KiB, or up to one 2 MiB huge page with transparent huge pages "always".
        let after_write = resident_pages(&dev.mem);
        assert!((256..=528).contains(&after_write), "{after_write} pages after a 1 MiB write");

        let discard = IoRequest { op: IoOp::Discard, ..write };
        assert_eq!(run(&mut *ch, discard), IoStatus::Success);
        let after_discard = resident_pages(&dev.mem);
        assert!(after_discard + 256 <= after_write, "discard kept the pages: {after_discard}");

        buf.fill(0xff);
        let read = IoRequest { op: IoOp::Read, ..write };
        assert_eq!(run(&mut *ch, read), IoStatus::Success);
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn a_disk_grows_within_its_reserve_and_shrinking_drops_the_tail() {
        let dev = RamDevice::with_reserve("grow", 512, 8, 64 << 10).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let mut buf = vec![0x77u8; 4096];
        let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        let at = |offset| IoRequest {
            tag: 1,
            op: IoOp::Write,
            offset,
            len: 4096,
            // SAFETY: the test keeps the buffers and their iovecs until the request completes.
            iov: unsafe { Iovecs::from_raw(&iov, 1) },
        };
        assert_eq!(ch.submit(&at(8192)), Err(SubmitError::OutOfRange));
        dev.resize(32).unwrap();
        // The channel opened before the resize sees the new size at once.
        assert_eq!(run(&mut *ch, at(8192)), IoStatus::Success);
        assert_eq!(dev.info().num_blocks(), 32);
        // Beyond the reserve: refused, naming the field; nothing changes.
        let e = dev.resize(129).unwrap_err();
        assert!(e.to_string().contains("new_size"), "{e}");
        assert_eq!(dev.info().num_blocks(), 32);
        // Shrink, grow again: the dropped blocks come back as zeroes.
        dev.resize(16).unwrap();
        assert_eq!(ch.submit(&at(8192)), Err(SubmitError::OutOfRange));
        dev.resize(128).unwrap();
        buf.fill(0xee);
        assert_eq!(run(&mut *ch, IoRequest { op: IoOp::Read, ..at(8192) }), IoStatus::Success);
        assert!(buf.iter().all(|&b| b == 0));
        // A disk made without a reserve cannot grow, but can shrink.
        let fixed = RamDevice::new("fixed", 512, 8).unwrap();
        assert!(fixed.resize(9).is_err());
        fixed.resize(4).unwrap();
    }

    #[test]
    fn zeroing_clears_partial_pages_in_place() {
        let dev = RamDevice::new("partial", 512, 64).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let mut buf = vec![0x5au8; 64 * 512];
        let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        let all = IoRequest {
            tag: 7,
            op: IoOp::Write,
            offset: 0,
            len: buf.len() as u64,
            // SAFETY: the test keeps the buffers and their iovecs until the request completes.
            iov: unsafe { Iovecs::from_raw(&iov, 1) },
        };
        assert_eq!(run(&mut *ch, all), IoStatus::Success);
        // Blocks 3..=20: a partial page at each end and a whole page in the middle.
        let zeroes = IoRequest { op: IoOp::WriteZeroes, offset: 3 * 512, len: 18 * 512, ..all };
        assert_eq!(run(&mut *ch, zeroes), IoStatus::Success);
        buf.fill(0);
        assert_eq!(run(&mut *ch, IoRequest { op: IoOp::Read, ..all }), IoStatus::Success);
        for (i, &b) in buf.iter().enumerate() {
            let zeroed = (3 * 512..21 * 512).contains(&i);
            assert_eq!(b, if zeroed { 0 } else { 0x5a }, "byte {i}");
        }
    }
}
