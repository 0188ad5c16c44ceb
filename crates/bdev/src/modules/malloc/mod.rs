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

use std::ptr::NonNull;
use std::sync::Arc;

use crate::{
    request_iovecs, validate_geometry, BdevError, BdevInfo, BlockDevice, DoneList, IoChannel, IoOp,
    IoRequest, IoStatus, SubmitError, ALL_IO_TYPES,
};

pub struct RamDevice {
    info: BdevInfo,
    mem: Arc<RamMemory>,
}

impl RamDevice {
    pub fn new(name: &str, block_size: u32, num_blocks: u64) -> Result<Self, BdevError> {
        validate_geometry(name, block_size, num_blocks)?;
        let size = num_blocks * u64::from(block_size);
        let mem = RamMemory::new(size)?;
        Ok(RamDevice {
            info: BdevInfo {
                name: name.to_string(),
                product_name: "Malloc disk".into(),
                block_size,
                num_blocks,
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
}

/// The disk's memory: one private anonymous mapping, unmapped on drop.
struct RamMemory {
    base: NonNull<u8>,
    len: usize,
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
    fn new(size: u64) -> Result<Self, BdevError> {
        let len = usize::try_from(size).map_err(|_| BdevError::NoMemory(size))?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing aliases no
        // existing memory; all arguments are plain values.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            log::warn!("malloc bdev: mmap of {size} bytes failed: {}", std::io::Error::last_os_error());
            return Err(BdevError::NoMemory(size));
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
        Ok(RamMemory {
            // mmap never returns null on success for a non-fixed mapping.
            base: NonNull::new(p.cast()).ok_or(BdevError::NoMemory(size))?,
            len,
            page_size,
        })
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
    unsafe fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        // `check_range` keeps the range inside the mapping, whose length fits `usize`.
        let offset = req.offset as usize;
        let status = match req.op {
            IoOp::Read | IoOp::Write => {
                // SAFETY: the caller's contract for `submit` covers the iovec array.
                let iov = unsafe { request_iovecs(req) };
                let total = iov.iter().try_fold(0u64, |t, v| t.checked_add(v.iov_len as u64));
                if total != Some(req.len) {
                    IoStatus::Error(libc::EINVAL)
                } else if req.op == IoOp::Read {
                    // SAFETY: the range is inside the disk (checked above, and the iovecs add up
                    // to `len`); the caller guarantees the buffers are writable and unshared.
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
        // SAFETY: the tests keep every buffer alive until the poll below returns it.
        unsafe { ch.submit(&req) }.unwrap();
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
            iov: &iov,
            iovcnt: 1,
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
    fn zeroing_clears_partial_pages_in_place() {
        let dev = RamDevice::new("partial", 512, 64).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let mut buf = vec![0x5au8; 64 * 512];
        let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let all =
            IoRequest { tag: 7, op: IoOp::Write, offset: 0, len: buf.len() as u64, iov: &iov, iovcnt: 1 };
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
