//! The device the store's metadata lives on, seen as whole 4 KiB pages: read, write, flush.
//!
//! The store is synchronous and knows nothing of reactors: the bdev module implements
//! [`MetaDevice`] over a channel of the base bdev (or replays a [`crate::CommitPlan`] itself,
//! asynchronously), tests implement it over memory ([`MemDevice`]) or a recorder
//! ([`crate::sim::RecordingDevice`]).

use crate::PAGE_SIZE;

/// One metadata page.
pub type Page = [u8; PAGE_SIZE];

/// A device operation that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata {op} of page {page} failed: {reason}")]
pub struct DeviceError {
    pub op: &'static str,
    pub page: u64,
    pub reason: String,
}

/// Whole-page access to the device under a store. A write is durable once a later `flush` has
/// returned `Ok`; until then it may be lost, or land in any order with the other unflushed
/// writes (the crash model of docs/lvol-format.md).
pub trait MetaDevice {
    /// The device's size in pages (a partial page at the end is not used).
    fn size_pages(&self) -> u64;
    fn read_page(&mut self, page: u64, buf: &mut Page) -> Result<(), DeviceError>;
    fn write_page(&mut self, page: u64, buf: &Page) -> Result<(), DeviceError>;
    fn flush(&mut self) -> Result<(), DeviceError>;
}

/// A device in memory: an image that writes change at once (flush does nothing).
#[derive(Debug, Clone)]
pub struct MemDevice {
    image: Vec<u8>,
}

impl MemDevice {
    /// A zeroed device of `pages` pages.
    pub fn new(pages: u64) -> MemDevice {
        MemDevice { image: vec![0; pages as usize * PAGE_SIZE] }
    }

    /// A device holding `image`; a partial page at its end is ignored, as a real device's is.
    pub fn from_image(image: Vec<u8>) -> MemDevice {
        MemDevice { image }
    }

    pub fn image(&self) -> &[u8] {
        &self.image
    }

    pub fn image_mut(&mut self) -> &mut [u8] {
        &mut self.image
    }

    fn range(&self, op: &'static str, page: u64) -> Result<std::ops::Range<usize>, DeviceError> {
        if page >= self.size_pages() {
            return Err(DeviceError {
                op,
                page,
                reason: format!("past the end ({} pages)", self.size_pages()),
            });
        }
        let start = page as usize * PAGE_SIZE;
        Ok(start..start + PAGE_SIZE)
    }
}

impl MetaDevice for MemDevice {
    fn size_pages(&self) -> u64 {
        (self.image.len() / PAGE_SIZE) as u64
    }

    fn read_page(&mut self, page: u64, buf: &mut Page) -> Result<(), DeviceError> {
        let r = self.range("read", page)?;
        buf.copy_from_slice(&self.image[r]);
        Ok(())
    }

    fn write_page(&mut self, page: u64, buf: &Page) -> Result<(), DeviceError> {
        let r = self.range("write", page)?;
        self.image[r].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
}
