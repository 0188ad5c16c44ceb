//! The device a volume lives on, as this crate sees it: synchronous positioned reads and
//! writes. The integrator implements [`MetaIo`] over a bdev channel; here it is implemented
//! for a file (or block device) and for memory.

use std::io::{Error, ErrorKind, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

/// Synchronous access to the device holding the volume.
pub trait MetaIo {
    /// The device's size in bytes.
    fn size(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> std::io::Result<()>;
    /// Makes the writes so far durable.
    fn flush(&mut self) -> std::io::Result<()>;
}

impl MetaIo for std::fs::File {
    fn size(&self) -> u64 {
        // Seeking to the end works for block devices too, whose metadata length is 0; the
        // reads and writes are positioned, so the file position does not matter.
        let mut file = self;
        file.seek(SeekFrom::End(0)).unwrap_or(0)
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.read_exact_at(buf, offset)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.write_all_at(buf, offset)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.sync_data()
    }
}

/// A device in memory, of a fixed size (the vector's length): for tests and the fuzz target.
#[derive(Clone, Default)]
pub struct MemIo(pub Vec<u8>);

impl MemIo {
    fn range(&self, offset: u64, len: usize) -> std::io::Result<std::ops::Range<usize>> {
        let start = usize::try_from(offset).map_err(|_| Error::from(ErrorKind::UnexpectedEof))?;
        match start.checked_add(len) {
            Some(end) if end <= self.0.len() => Ok(start..end),
            _ => Err(Error::new(ErrorKind::UnexpectedEof, "past the end of the in-memory device")),
        }
    }
}

impl MetaIo for MemIo {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let range = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.0[range]);
        Ok(())
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let range = self.range(offset, buf.len())?;
        self.0[range].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
