//! The io_uring backend. Being written; see the bdev helper.
use crate::{BdevError, BdevInfo, BlockDevice, IoChannel};

pub struct UringDevice {
    info: BdevInfo,
}

impl UringDevice {
    pub fn new(name: &str, path: &std::path::Path, block_size: Option<u32>, direct: bool) -> Result<Self, BdevError> {
        let _ = (name, path, block_size, direct);
        Err(BdevError::InvalidParam { field: "name", reason: "uring backend not built yet".into() })
    }
}

impl BlockDevice for UringDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Err(BdevError::InvalidParam { field: "name", reason: "uring backend not built yet".into() })
    }
}
