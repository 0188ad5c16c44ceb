//! [`fp_luks::MetaIo`] over a bdev: the LUKS header's reads and writes, on the calling control
//! thread (an RPC's), one request at a time through a channel opened there.
//!
//! The header library reads and writes at any byte offset and length (a LUKS1 header is 592
//! bytes); a bdev takes whole blocks, so unaligned pieces go through a read-modify-write of
//! the blocks they touch, in a bounce buffer made once per handle.

use std::io;

use fp_bdev::iov::BounceBuf;
use fp_bdev::{sync_io, Bdev, IoChannel, IoOp, IoRequest, Iovecs};

/// The largest request sent down (a key slot's area is 256 KiB; a LUKS2 header copy 16 KiB).
const BOUNCE: usize = 1 << 20;

/// A bdev driven synchronously for its LUKS metadata.
pub struct BdevMetaIo {
    bdev: Bdev,
    chan: Box<dyn IoChannel>,
    bounce: BounceBuf,
    block: u64,
}

impl BdevMetaIo {
    /// Opens a channel of `bdev` on this thread (a control thread: every call blocks).
    pub fn open(bdev: &Bdev) -> Result<BdevMetaIo, fp_bdev::BdevError> {
        let chan = bdev.open_channel()?;
        let block = u64::from(bdev.info().block_size);
        Ok(BdevMetaIo { bdev: bdev.clone(), chan, bounce: BounceBuf::zeroed(BOUNCE), block })
    }

    /// One request on the bounce buffer's first `len` bytes, waited for.
    fn run(&mut self, op: IoOp, offset: u64, len: usize) -> io::Result<()> {
        let iov = if matches!(op, IoOp::Read | IoOp::Write) { self.bounce.iovecs(len) } else { Iovecs::NONE };
        let req = IoRequest { tag: 0, op, offset, len: len as u64, iov };
        sync_io::run(self.chan.as_mut(), &req, &mut || false).map_err(io::Error::from_raw_os_error)
    }

    /// The whole blocks covering `[offset, offset + len)`, at most one bounce buffer's worth
    /// of them starting at `offset`: (first byte, length) of the aligned run.
    fn span(&self, offset: u64, len: usize) -> (u64, usize) {
        let start = offset - offset % self.block;
        let end = (offset + len as u64).div_ceil(self.block) * self.block;
        let max = BOUNCE as u64 - BOUNCE as u64 % self.block;
        (start, (end - start).min(max) as usize)
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.bdev.info().size_bytes() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{len} bytes at {offset} lie beyond the end of '{}'", self.bdev.info().name),
            )),
        }
    }
}

impl fp_luks::MetaIo for BdevMetaIo {
    fn size(&self) -> u64 {
        self.bdev.info().size_bytes()
    }

    fn read_at(&mut self, mut offset: u64, mut buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        while !buf.is_empty() {
            let (start, len) = self.span(offset, buf.len());
            self.run(IoOp::Read, start, len)?;
            let skip = (offset - start) as usize;
            let n = (len - skip).min(buf.len());
            buf[..n].copy_from_slice(&self.bounce.bytes()[skip..skip + n]);
            buf = &mut buf[n..];
            offset += n as u64;
        }
        Ok(())
    }

    fn write_at(&mut self, mut offset: u64, mut buf: &[u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        while !buf.is_empty() {
            let (start, len) = self.span(offset, buf.len());
            let skip = (offset - start) as usize;
            let n = (len - skip).min(buf.len());
            if skip != 0 || n != len {
                // A partial block at either end: keep the bytes around the piece.
                self.run(IoOp::Read, start, len)?;
            }
            self.bounce.bytes_mut()[skip..skip + n].copy_from_slice(&buf[..n]);
            self.run(IoOp::Write, start, len)?;
            buf = &buf[n..];
            offset += n as u64;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.bdev.info().io_types.flush {
            return Ok(());
        }
        match self.run(IoOp::Flush, 0, 0) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            r => r,
        }
    }
}
