//! The crash simulator's device: it records every write and flush in order, so a test can
//! build the image a crash at any point could leave (docs/lvol-format.md, "Crash model"):
//! every write before the last completed flush, plus any subset of the later ones landed in
//! any order.
//!
//! Public so that the bdev module's tests (data and metadata over a real channel) can use the
//! same replay.

use crate::{DeviceError, MemDevice, MetaDevice, Page, PAGE_SIZE};

/// One recorded device operation.
#[derive(Debug, Clone)]
pub enum Op {
    Write { page: u64, data: Box<Page> },
    Flush,
}

/// A device that applies writes at once (reads see them) and records them and the flushes.
#[derive(Debug, Clone)]
pub struct RecordingDevice {
    base: Vec<u8>,
    current: MemDevice,
    log: Vec<Op>,
}

impl RecordingDevice {
    /// A zeroed device of `pages` pages.
    pub fn new(pages: u64) -> RecordingDevice {
        let current = MemDevice::new(pages);
        RecordingDevice { base: current.image().to_vec(), current, log: Vec::new() }
    }

    /// Everything recorded so far, oldest first.
    pub fn log(&self) -> &[Op] {
        &self.log
    }

    /// For a crash after the first `completed` operations: the length of the prefix that is
    /// durable, i.e. up to and including the last flush among them (0 when there is none).
    pub fn durable_prefix(&self, completed: usize) -> usize {
        self.log[..completed].iter().rposition(|op| matches!(op, Op::Flush)).map_or(0, |i| i + 1)
    }

    /// The image a crash leaves: the device as created, every write of `log[..durable]` in
    /// order, then the writes `log[i]` for `i` in `landed`, in that order (flushes in `landed`
    /// are skipped).
    pub fn crash_image(&self, durable: usize, landed: &[usize]) -> MemDevice {
        let whole: Vec<(usize, usize)> = landed.iter().map(|&i| (i, PAGE_SIZE)).collect();
        self.crash_image_torn(durable, &whole)
    }

    /// The same, where each landed write `(i, n)` landed only its first `n` bytes (a torn
    /// page: the device wrote some of its sectors).
    pub fn crash_image_torn(&self, durable: usize, landed: &[(usize, usize)]) -> MemDevice {
        let mut dev = MemDevice::from_image(self.base.clone());
        let durable_writes = self.log[..durable].iter().map(|op| (op, PAGE_SIZE));
        let landed_writes = landed.iter().map(|&(i, n)| (&self.log[i], n.min(PAGE_SIZE)));
        for (op, n) in durable_writes.chain(landed_writes) {
            if let Op::Write { page, data } = op {
                let at = *page as usize * PAGE_SIZE;
                dev.image_mut()[at..at + n].copy_from_slice(&data[..n]);
            }
        }
        dev
    }
}

impl MetaDevice for RecordingDevice {
    fn size_pages(&self) -> u64 {
        self.current.size_pages()
    }

    fn read_page(&mut self, page: u64, buf: &mut Page) -> Result<(), DeviceError> {
        self.current.read_page(page, buf)
    }

    fn write_page(&mut self, page: u64, buf: &Page) -> Result<(), DeviceError> {
        self.current.write_page(page, buf)?;
        self.log.push(Op::Write { page, data: Box::new(*buf) });
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        self.log.push(Op::Flush);
        Ok(())
    }
}
