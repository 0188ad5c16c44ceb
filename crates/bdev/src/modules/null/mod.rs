//! The null backend: every request completes at once without touching data.
//!
//! Reads leave the caller's buffers untouched (they are not zeroed), so the null device measures
//! the cost of the path above it and nothing else; for the same reason its block status is the
//! trait's default, all data (a hole would promise zeroes). Completions are delivered by the next
//! [`IoChannel::poll`], never from inside `submit`, so callers see the same ordering as with a
//! real device.

#![forbid(unsafe_code)]

mod rpc;

pub use rpc::NullModule;

use crate::{
    validate_geometry, BdevError, BdevInfo, BlockDevice, Capacity, DoneList, IoChannel, IoRequest, IoStatus,
    SubmitError, ALL_IO_TYPES,
};

/// A disk that stores nothing: every request succeeds at once without touching data (SPDK's
/// null bdev).
pub struct NullDevice {
    info: BdevInfo,
}

impl NullDevice {
    /// A null disk of `num_blocks` blocks of `block_size` bytes.
    pub fn new(name: &str, block_size: u32, num_blocks: u64) -> Result<Self, BdevError> {
        validate_geometry(name, block_size, num_blocks)?;
        Ok(NullDevice {
            info: BdevInfo {
                name: name.to_string(),
                product_name: "Null disk".into(),
                block_size,
                capacity: Capacity::new(num_blocks),
                io_types: ALL_IO_TYPES,
                driver: "null",
                driver_specific: None,
            },
        })
    }
}

impl BlockDevice for NullDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(NullChannel {
            capacity: self.info.capacity.clone(),
            block_mask: u64::from(self.info.block_size) - 1,
            block_shift: self.info.block_size.trailing_zeros(),
            done: DoneList::new(),
        }))
    }

    /// Any size the geometry allows: there is no data to keep.
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        validate_geometry(&self.info.name, self.info.block_size, num_blocks)?;
        self.info.capacity.set(num_blocks);
        Ok(())
    }
}

struct NullChannel {
    /// The device's size in blocks, shared with it (a resize is seen at once).
    capacity: Capacity,
    /// The block size less one: the block size is a power of two (`validate_geometry`).
    block_mask: u64,
    /// log2 of the block size.
    block_shift: u32,
    /// Tags completed by `submit`, handed back by the next `poll`.
    done: DoneList,
}

impl NullChannel {
    /// [`BdevInfo::check_range`] with the block size's mask and shift taken once at open: the
    /// general check tests the block size for a power of two and multiplies the capacity out
    /// per request, 8 instructions more under callgrind. `end` is a multiple of the block size
    /// once both parts are aligned, so comparing it in blocks is exact and cannot overflow.
    #[inline(always)]
    fn check_range(&self, offset: u64, len: u64) -> Result<(), SubmitError> {
        match offset.checked_add(len) {
            Some(end)
                if (offset | len) & self.block_mask == 0
                    && end >> self.block_shift <= self.capacity.blocks() =>
            {
                Ok(())
            }
            _ => Err(SubmitError::OutOfRange),
        }
    }
}

impl IoChannel for NullChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.check_range(req.offset, req.len)?;
        self.done.push(req.tag, IoStatus::Success);
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.done.deliver(done)
    }

    fn poll_batch(&mut self, out: &mut Vec<(u32, IoStatus)>) -> usize {
        self.done.deliver_batch(out)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoOp;
    use crate::Iovecs;

    fn submit(ch: &mut dyn IoChannel, tag: u32, offset: u64) -> Result<(), SubmitError> {
        let req = IoRequest { tag, op: IoOp::Read, offset, len: 512, iov: Iovecs::NONE };
        ch.submit(&req)
    }

    #[test]
    fn a_batch_poll_hands_over_every_completion_in_order_and_only_once() {
        let dev = NullDevice::new("n", 512, 8).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let mut out = Vec::new();
        assert_eq!(ch.poll_batch(&mut out), 0);
        for tag in [4, 1, 7] {
            submit(&mut *ch, tag, 0).unwrap();
        }
        assert_eq!(submit(&mut *ch, 9, 8 * 512), Err(SubmitError::OutOfRange));
        assert_eq!(ch.in_flight(), 3);
        // An empty batch trades places with the channel's list.
        assert_eq!(ch.poll_batch(&mut out), 3);
        assert_eq!(out, vec![(4, IoStatus::Success), (1, IoStatus::Success), (7, IoStatus::Success)]);
        assert_eq!(ch.in_flight(), 0);
        assert_eq!(ch.poll_batch(&mut out), 0, "nothing twice");
        // A batch that still holds completions is appended to.
        submit(&mut *ch, 2, 512).unwrap();
        assert_eq!(ch.poll_batch(&mut out), 1);
        assert_eq!(out.len(), 4);
        assert_eq!(out[3], (2, IoStatus::Success));
    }

    #[test]
    fn requests_must_be_block_aligned_and_inside_the_device() {
        let dev = NullDevice::new("n", 4096, 4).unwrap();
        let info = dev.info();
        assert_eq!(info.check_range(0, 4 * 4096), Ok(()));
        assert_eq!(info.check_range(3 * 4096, 4096), Ok(()));
        assert_eq!(info.check_range(512, 4096), Err(SubmitError::OutOfRange), "offset not aligned");
        assert_eq!(info.check_range(0, 4096 + 512), Err(SubmitError::OutOfRange), "length not aligned");
        assert_eq!(info.check_range(4 * 4096, 4096), Err(SubmitError::OutOfRange), "past the end");
        assert_eq!(info.check_range(u64::MAX - 4095, 8192), Err(SubmitError::OutOfRange), "wraps around");
        dev.resize(5).unwrap();
        assert_eq!(info.check_range(4 * 4096, 4096), Ok(()), "the size now, not at open");
    }

    /// The channel's own range check (mask and shift taken at open) answers as the device's
    /// description does, at every edge and after a resize.
    #[test]
    fn the_channel_refuses_what_the_device_refuses() {
        let dev = NullDevice::new("n", 4096, 4).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let cases = [
            (0, 4 * 4096),
            (3 * 4096, 4096),
            (512, 4096),
            (0, 4096 + 512),
            (4 * 4096, 4096),
            (3 * 4096, 2 * 4096),
            (u64::MAX - 4095, 8192),
            (!4095, 4096),
            (0, 0),
            (4 * 4096, 0),
            (5 * 4096, 0),
        ];
        for resize in [None, Some(5), Some(1)] {
            if let Some(blocks) = resize {
                dev.resize(blocks).unwrap();
            }
            for (tag, &(offset, len)) in cases.iter().enumerate() {
                let req = IoRequest { tag: tag as u32, op: IoOp::Read, offset, len, iov: Iovecs::NONE };
                assert_eq!(
                    ch.submit(&req),
                    dev.info().check_range(offset, len),
                    "offset {offset} len {len} at {resize:?}"
                );
            }
            ch.poll_batch(&mut Vec::new());
        }
    }
}
