//! Synchronous I/O on a raid base, for the metadata (superblock and bitmap pages) and the
//! rebuild's copies: [`BaseIo`] is what the owner and the copier drive, [`ChannelIo`] runs it
//! over a bdev channel on the calling thread (examine and assembly on the RPC thread, the owner
//! on its own), [`MemBase`] is a base in memory for tests and the crash simulator.
//!
//! Control path only: one request at a time, waited for; the owner's thread is not a reactor.

use std::sync::Arc;

use fp_bdev::iov::BounceBuf;
use fp_bdev::{sync_io, Bdev, IoChannel, IoOp, IoRequest, Iovecs};

use crate::format::{newest, BitmapPage, FormatError, PageBuf, Superblock, PAGE_SIZE};
use crate::intent::IntentMap;
use crate::shared::RaidShared;
use crate::RaidError;

/// The errno of a request [`ChannelIo`] gave up while its base answered Busy, because the
/// base is leaving its raid or the raid is stopping (see [`ChannelIo::give_up_when_leaving`]).
/// Nothing was sent.
pub const GIVEN_UP: i32 = sync_io::GIVEN_UP;

/// A base as the owner drives it. Errors are positive errnos.
pub trait BaseIo {
    /// The base's size in bytes.
    fn size_bytes(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset` (block aligned).
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), i32>;
    /// Writes `buf` at `offset` (block aligned).
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), i32>;
    /// Makes completed writes durable (nothing for a base without a volatile cache).
    fn flush(&mut self) -> Result<(), i32>;
}

/// [`BaseIo`] over a channel of a bdev, opened on (and used only by) the calling thread.
pub struct ChannelIo {
    bdev: Bdev,
    chan: Box<dyn IoChannel>,
    /// Bounce buffer: callers' slices need not be aligned for the device.
    bounce: BounceBuf,
    /// The raid this base is a member of, and its name there: a Busy is given up once a
    /// removal marks it leaving or the raid stops.
    leaving: Option<(Arc<RaidShared>, String)>,
}

/// The bounce buffer's size: the largest single request.
const BOUNCE: usize = 1 << 20;

impl ChannelIo {
    /// Opens a channel of `bdev` on this thread.
    pub fn open(bdev: Bdev) -> Result<ChannelIo, RaidError> {
        let chan = bdev.open_channel()?;
        Ok(ChannelIo { bdev, chan, bounce: BounceBuf::zeroed(BOUNCE), leaving: None })
    }

    /// A Busy answer is retried until `shared` marks the base `name` leaving
    /// ([`RaidShared::set_leaving`]) or the raid stopping ([`RaidShared::set_stopping`], after
    /// its grace); then the request fails with [`GIVEN_UP`] instead. The owner's metadata I/O:
    /// a base that stays busy must not keep the owner from taking up the removal that ends
    /// it, nor the raid from stopping.
    pub fn give_up_when_leaving(mut self, shared: Arc<RaidShared>, name: String) -> ChannelIo {
        self.leaving = Some((shared, name));
        self
    }

    /// The bdev.
    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    /// One request on the bounce buffer's first `len` bytes, waited for.
    fn run(&mut self, op: IoOp, offset: u64, len: usize) -> Result<(), i32> {
        let data = matches!(op, IoOp::Read | IoOp::Write);
        let iov = if data { self.bounce.iovecs(len) } else { Iovecs::NONE };
        let req = IoRequest { tag: 0, op, offset, len: len as u64, iov };
        let leaving = &self.leaving;
        sync_io::run(self.chan.as_mut(), &req, &mut || {
            leaving.as_ref().is_some_and(|(shared, name)| shared.gives_up_busy(name))
        })
    }
}

impl BaseIo for ChannelIo {
    fn size_bytes(&self) -> u64 {
        self.bdev.info().size_bytes()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        for (i, piece) in buf.chunks_mut(BOUNCE).enumerate() {
            self.run(IoOp::Read, offset + (i * BOUNCE) as u64, piece.len())?;
            piece.copy_from_slice(&self.bounce.bytes()[..piece.len()]);
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), i32> {
        for (i, piece) in buf.chunks(BOUNCE).enumerate() {
            self.bounce.bytes_mut()[..piece.len()].copy_from_slice(piece);
            self.run(IoOp::Write, offset + (i * BOUNCE) as u64, piece.len())?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), i32> {
        if !self.bdev.info().io_types.flush {
            return Ok(());
        }
        match self.run(IoOp::Flush, 0, 0) {
            Err(libc::EOPNOTSUPP) => Ok(()),
            r => r,
        }
    }
}

/// A base in memory: writes land at once; `fail` makes every later request fail with EIO
/// (a base that went away). Clones share nothing.
#[derive(Debug, Clone)]
pub struct MemBase {
    pub image: Vec<u8>,
    pub fail: bool,
    /// Flushes seen.
    pub flushes: u64,
}

impl MemBase {
    /// A zeroed base of `bytes` bytes.
    pub fn new(bytes: u64) -> MemBase {
        MemBase { image: vec![0; bytes as usize], fail: false, flushes: 0 }
    }

    fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>, i32> {
        if self.fail {
            return Err(libc::EIO);
        }
        let start = offset as usize;
        match start.checked_add(len) {
            Some(end) if end <= self.image.len() => Ok(start..end),
            _ => Err(libc::EINVAL),
        }
    }
}

impl BaseIo for MemBase {
    fn size_bytes(&self) -> u64 {
        self.image.len() as u64
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        let r = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.image[r]);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), i32> {
        let r = self.range(offset, buf.len())?;
        self.image[r].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), i32> {
        self.range(0, 0)?;
        self.flushes += 1;
        Ok(())
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

fn read_page(io: &mut dyn BaseIo, page: u64) -> Result<Box<PageBuf>, i32> {
    let mut buf = Box::new([0u8; PAGE_SIZE]);
    io.read_at(page * PAGE_SIZE as u64, &mut buf[..])?;
    Ok(buf)
}

/// Both superblock copies of a base, decoded (each may be refused).
pub fn read_superblock_copies(
    io: &mut dyn BaseIo,
) -> Result<[Result<Superblock, FormatError>; 2], RaidError> {
    let mut read = |page| {
        read_page(io, page)
            .map(|p| Superblock::decode(&p[..]))
            .map_err(|e| RaidError::Metadata(format!("reading superblock page {page}: {}", errno_text(e))))
    };
    Ok([read(0)?, read(1)?])
}

/// The base's superblock: the valid copy with the higher sequence. `Ok(None)`: neither copy
/// is valid (a base never part of a raid, or both copies destroyed); the reasons are in the
/// `Err` of [`read_superblock_copies`].
pub fn read_superblock(io: &mut dyn BaseIo) -> Result<Option<Superblock>, RaidError> {
    let [a, b] = read_superblock_copies(io)?;
    Ok(newest(a, b))
}

/// Writes `sb` to its copy's page (A or B by its sequence). Not flushed.
pub fn write_superblock(io: &mut dyn BaseIo, sb: &Superblock) -> Result<(), i32> {
    io.write_at(sb.page() * PAGE_SIZE as u64, &sb.encode()[..])
}

/// Writes bitmap page `index` with `words`, stamped with `sb`'s raid and sequence. Not flushed.
pub fn write_bitmap_page(io: &mut dyn BaseIo, sb: &Superblock, index: u64, words: &[u64]) -> Result<(), i32> {
    let page = BitmapPage { raid_uuid: sb.raid_uuid, seq: sb.seq, index, words: words.to_vec() };
    io.write_at((sb.bitmap_first_page + index) * PAGE_SIZE as u64, &page.encode()[..])
}

/// Loads a base's bitmap pages into `map` (a union: call it for each base to trust). A page
/// that is not valid for `sb` marks its whole range dirty (it is rewritten at the next pass)
/// instead of being trusted. Returns the number of such pages.
pub fn load_bitmap(io: &mut dyn BaseIo, sb: &Superblock, map: &IntentMap) -> Result<u64, RaidError> {
    let mut corrupt = 0;
    for index in 0..sb.bitmap_pages {
        let page = read_page(io, sb.bitmap_first_page + index)
            .map_err(|e| RaidError::Metadata(format!("reading bitmap page {index}: {}", errno_text(e))))?;
        match BitmapPage::decode_for(&page[..], sb, index) {
            Ok(bp) => map.load_page(index, &bp.words),
            Err(e) => {
                log::warn!("raid {}: {e} (page {index}): its chunks are treated as dirty", sb.name);
                let per = crate::format::BITMAP_BITS_PER_PAGE;
                map.mark_chunks(index * per, per);
                corrupt += 1;
            }
        }
    }
    Ok(corrupt)
}

/// Makes a base a member: every bitmap page from `map` (empty for a new raid), a flush, then
/// the superblock and a flush: the superblock never names bitmap pages not yet written.
pub fn format_base(io: &mut dyn BaseIo, sb: &Superblock, map: Option<&IntentMap>) -> Result<(), i32> {
    for index in 0..sb.bitmap_pages {
        let words = map.map(|m| m.page_words(index)).unwrap_or_default();
        write_bitmap_page(io, sb, index, &words)?;
    }
    io.flush()?;
    write_superblock(io, sb)?;
    io.flush()
}

/// Erases both superblock copies (a deleted raid must not be assembled again), flushed.
pub fn wipe_superblock(io: &mut dyn BaseIo) -> Result<(), i32> {
    io.write_at(0, &[0u8; 2 * PAGE_SIZE])?;
    io.flush()
}

#[cfg(test)]
mod tests {
    use fp_bdev::RamDevice;
    use std::sync::Arc;

    use super::*;
    use crate::format::tests::sample;

    #[test]
    fn superblocks_and_bitmaps_round_trip_over_a_bdev_channel() {
        let bdev: Bdev = Arc::new(RamDevice::new("m0", 512, (8 << 20) / 512).unwrap());
        let mut io = ChannelIo::open(bdev).unwrap();
        let mut sb = sample();
        sb.raid_blocks = (4 << 20) / 512;
        sb.bitmap_pages = 1;
        assert!(read_superblock(&mut io).unwrap().is_none());
        let map = IntentMap::new(sb.raid_bytes(), sb.bitmap_chunk_bytes, true);
        map.mark_chunks(5, 2);
        format_base(&mut io, &sb, Some(&map)).unwrap();
        assert_eq!(read_superblock(&mut io).unwrap().unwrap(), sb);
        sb.seq += 1;
        write_superblock(&mut io, &sb).unwrap();
        assert_eq!(read_superblock(&mut io).unwrap().unwrap().seq, sb.seq);
        let loaded = IntentMap::new(sb.raid_bytes(), sb.bitmap_chunk_bytes, true);
        assert_eq!(load_bitmap(&mut io, &sb, &loaded).unwrap(), 0);
        assert!(loaded.is_set(5) && loaded.is_set(6) && !loaded.is_set(7));
        // A corrupted bitmap page is not trusted: all its chunks count as dirty.
        io.write_at(2 * PAGE_SIZE as u64 + 512, &[0xff; 512]).unwrap();
        let again = IntentMap::new(sb.raid_bytes(), sb.bitmap_chunk_bytes, true);
        assert_eq!(load_bitmap(&mut io, &sb, &again).unwrap(), 1);
        assert_eq!(again.set_count(), again.chunks());
        wipe_superblock(&mut io).unwrap();
        assert!(read_superblock(&mut io).unwrap().is_none());
    }

    #[test]
    fn a_failed_mem_base_returns_eio() {
        let mut m = MemBase::new(1 << 16);
        m.write_at(512, &[1; 512]).unwrap();
        m.fail = true;
        assert_eq!(m.read_at(0, &mut [0; 512]), Err(libc::EIO));
        assert_eq!(m.flush(), Err(libc::EIO));
    }
}
