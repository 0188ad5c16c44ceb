//! The null backend: every request completes at once without touching data.
//!
//! Reads leave the caller's buffers untouched (they are not zeroed), so the null device measures
//! the cost of the path above it and nothing else; for the same reason its block status is the
//! trait's default, all data (a hole would promise zeroes). Completions are delivered by the next
//! [`IoChannel::poll`], never from inside `submit`, so callers see the same ordering as with a
//! real device.

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
    unsafe fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        self.done.push(req.tag, IoStatus::Success);
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.done.deliver(done)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}
