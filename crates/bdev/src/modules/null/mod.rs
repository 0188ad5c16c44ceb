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
        Ok(Box::new(NullChannel { info: self.info.clone(), done: DoneList::new() }))
    }

    /// Any size the geometry allows: there is no data to keep.
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        validate_geometry(&self.info.name, self.info.block_size, num_blocks)?;
        self.info.capacity.set(num_blocks);
        Ok(())
    }
}

struct NullChannel {
    info: BdevInfo,
    /// Tags completed by `submit`, handed back by the next `poll`.
    done: DoneList,
}

impl IoChannel for NullChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
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
}
