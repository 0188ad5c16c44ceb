//! The RAM backend (SPDK's "malloc" bdev). Being written; see the bdev helper.
use crate::{BdevError, BdevInfo, BlockDevice, IoChannel};

pub struct RamDevice {
    info: BdevInfo,
}

impl RamDevice {
    pub fn new(name: &str, block_size: u32, num_blocks: u64) -> Result<Self, BdevError> {
        let _ = (name, block_size, num_blocks);
        Err(BdevError::InvalidParam { field: "name", reason: "ram backend not built yet".into() })
    }
}

impl BlockDevice for RamDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Err(BdevError::InvalidParam { field: "name", reason: "ram backend not built yet".into() })
    }
}
