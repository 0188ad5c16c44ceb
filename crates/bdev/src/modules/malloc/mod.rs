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

#![cfg_attr(not(test), forbid(unsafe_code))]

use std::sync::Arc;

mod rpc;

pub use rpc::MallocModule;

use crate::mapping::{OutsideMapping, ReservedMapping};
use crate::{
    validate_geometry, BdevError, BdevInfo, BlockDevice, Capacity, DoneList, IoChannel, IoOp, IoRequest,
    IoStatus, SubmitError, ALL_IO_TYPES,
};

/// A RAM disk (SPDK's malloc bdev): its blocks live in this process's memory.
pub struct RamDevice {
    info: BdevInfo,
    mem: Arc<ReservedMapping>,
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
        let mem = ram_mapping(size, reserve.max(size)).or_else(|_| ram_mapping(size, size))?;
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
        if new > self.mem.len() as u64 {
            return Err(BdevError::InvalidParam {
                field: "new_size",
                reason: format!(
                    "{new} bytes is more than this RAM disk can grow to ({} bytes, the limit when it \
                     was created: limits.max_malloc_bytes)",
                    self.mem.len()
                ),
            });
        }
        if new > old as u64 {
            self.mem.make_accessible(new as usize).map_err(|e| {
                log::warn!("malloc bdev {}: cannot grow to {new} bytes: {e}", info.name);
                BdevError::NoMemory(new)
            })?;
        } else {
            // `[new, old)` was accessible: the mapping's accessible part only grows.
            self.mem.zero(new, old as u64 - new).map_err(|e| BdevError::Io(format!("{}: {e}", info.name)))?;
        }
        info.capacity.set(num_blocks);
        Ok(())
    }
}

/// The disk's memory: `size` bytes, growable in place to `reserve`.
fn ram_mapping(size: u64, reserve: u64) -> Result<ReservedMapping, BdevError> {
    let too_big = |n: u64| usize::try_from(n).map_err(|_| BdevError::NoMemory(n));
    ReservedMapping::new(too_big(size)?, too_big(reserve)?).map_err(|e| {
        log::warn!("malloc bdev: mapping {reserve} bytes failed: {e}");
        BdevError::NoMemory(reserve)
    })
}

/// A copy's status: an access outside the mapping is a bug, reported rather than done.
fn outcome(copied: Result<(), OutsideMapping>) -> IoStatus {
    match copied {
        Ok(()) => IoStatus::Success,
        Err(e) => {
            log::error!("malloc bdev: {e}");
            IoStatus::Error(libc::EIO)
        }
    }
}

struct RamChannel {
    info: BdevInfo,
    mem: Arc<ReservedMapping>,
    /// Requests carried out by `submit`, handed back by the next `poll`.
    done: DoneList,
}

impl IoChannel for RamChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        let status = match req.op {
            IoOp::Read | IoOp::Write if req.iov.total_len() != req.len => IoStatus::Error(libc::EINVAL),
            // `check_range` keeps the range inside the device, which the mapping's accessible
            // part covers, so these copies only fail on a broken invariant.
            IoOp::Read => outcome(self.mem.read_into(req.offset, &req.iov)),
            IoOp::Write => outcome(self.mem.write_from(req.offset, &req.iov)),
            IoOp::Flush => IoStatus::Success,
            IoOp::Discard | IoOp::WriteZeroes => outcome(self.mem.zero(req.offset, req.len)),
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

    fn resident_pages(mem: &ReservedMapping) -> usize {
        mem.resident_pages()
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
