//! Where a re-encryption's progress is kept durably ([`ReencryptCheckpoint`]; the LUKS2
//! header in the daemon, [`MemoryCheckpoint`] in tests), the synchronous base I/O of the job
//! and of recovery, and [`recover_hotzone`], which repairs a hotzone a crash interrupted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fp_bdev::iov::BounceBuf;
use fp_bdev::{sync_io, Bdev, IoChannel, IoOp, IoRequest, Iovecs};
use sha2::{Digest, Sha256};

use super::error::ReencryptError;
use crate::{CryptoKey, CryptoLayout, XtsEngine};

/// The default hotzone: 1 MiB, as cryptsetup's default for an online re-encryption.
pub const DEFAULT_HOTZONE: u64 = 1 << 20;
/// The largest hotzone taken (the job holds two buffers of it).
pub const MAX_HOTZONE: u64 = 64 << 20;

/// Durable progress of a re-encryption (cryptsetup's "checksum" resilience). The job calls it
/// on its own thread, never on a reactor, so an implementation may block on its I/O.
pub trait ReencryptCheckpoint: Send {
    /// Durable before it returns: the hotzone about to be rewritten (bytes of the data area)
    /// and the SHA-256 of each of its sectors' old ciphertext, in order.
    fn begin_hotzone(&mut self, offset: u64, len: u64, old_sector_sha256: &[[u8; 32]])
        -> std::io::Result<()>;
    /// Durable before it returns: everything below `boundary` is under the new key (and the
    /// hotzone recorded last is done).
    fn advance(&mut self, boundary: u64) -> std::io::Result<()>;
    /// The job finished: every sector is under the new key.
    fn finish(&mut self) -> std::io::Result<()>;
}

/// A hotzone recorded by [`ReencryptCheckpoint::begin_hotzone`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hotzone {
    /// Its first byte in the data area.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The SHA-256 of each sector's old ciphertext.
    pub old_sector_sha256: Vec<[u8; 32]>,
}

/// What a [`MemoryCheckpoint`] holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointRecord {
    /// Bytes below are under the new key.
    pub boundary: u64,
    /// The hotzone begun and not yet advanced past.
    pub hotzone: Option<Hotzone>,
    /// [`ReencryptCheckpoint::finish`] was called.
    pub finished: bool,
    /// Calls of `begin_hotzone`, `advance` and `finish`, in order (for tests).
    pub calls: u64,
}

/// A checkpoint in memory (tests, and a job that needs no durability): clones share the
/// record, so a test keeps one and hands the job another.
#[derive(Clone, Default)]
pub struct MemoryCheckpoint(Arc<Mutex<CheckpointRecord>>);

impl MemoryCheckpoint {
    /// A checkpoint at `boundary` with no hotzone.
    pub fn at(boundary: u64) -> MemoryCheckpoint {
        MemoryCheckpoint(Arc::new(Mutex::new(CheckpointRecord { boundary, ..CheckpointRecord::default() })))
    }

    /// The record now.
    pub fn record(&self) -> CheckpointRecord {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut CheckpointRecord)) {
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        r.calls += 1;
        f(&mut r);
    }
}

impl ReencryptCheckpoint for MemoryCheckpoint {
    fn begin_hotzone(
        &mut self,
        offset: u64,
        len: u64,
        old_sector_sha256: &[[u8; 32]],
    ) -> std::io::Result<()> {
        let old_sector_sha256 = old_sector_sha256.to_vec();
        self.update(|r| r.hotzone = Some(Hotzone { offset, len, old_sector_sha256 }));
        Ok(())
    }

    fn advance(&mut self, boundary: u64) -> std::io::Result<()> {
        self.update(|r| {
            r.boundary = boundary;
            r.hotzone = None;
        });
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.update(|r| r.finished = true);
        Ok(())
    }
}

/// The base of a crypto bdev as the job and recovery use it: one request at a time on a
/// channel of the calling thread (never a reactor), offsets in the data area, through a bounce
/// buffer (callers' slices need not suit the device).
pub(crate) struct BaseIo {
    chan: Box<dyn IoChannel>,
    data_offset: u64,
    bounce: BounceBuf,
    /// The base has a volatile cache to flush.
    flushes: bool,
    /// How long a Busy base is retried before the request fails.
    busy_limit: Duration,
}

impl BaseIo {
    /// A channel of `base` for requests of up to `max_len` bytes.
    pub(crate) fn open(
        base: &Bdev,
        layout: CryptoLayout,
        max_len: usize,
        busy_limit: Duration,
    ) -> Result<BaseIo, ReencryptError> {
        let chan = base.open_channel().map_err(|e| ReencryptError::Base(e.to_string()))?;
        Ok(BaseIo {
            chan,
            data_offset: layout.data_offset,
            bounce: BounceBuf::zeroed(max_len),
            flushes: base.info().io_types.flush,
            busy_limit,
        })
    }

    /// Reads `buf.len()` bytes at `offset` of the data area.
    pub(crate) fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ReencryptError> {
        self.run(IoOp::Read, offset, buf.len())?;
        buf.copy_from_slice(&self.bounce.bytes()[..buf.len()]);
        Ok(())
    }

    /// Writes `buf` at `offset` of the data area.
    pub(crate) fn write(&mut self, offset: u64, buf: &[u8]) -> Result<(), ReencryptError> {
        self.bounce.bytes_mut()[..buf.len()].copy_from_slice(buf);
        self.run(IoOp::Write, offset, buf.len())
    }

    /// Makes the writes durable (nothing to do on a base without a volatile cache).
    pub(crate) fn flush(&mut self) -> Result<(), ReencryptError> {
        if !self.flushes {
            return Ok(());
        }
        self.run(IoOp::Flush, 0, 0)
    }

    fn run(&mut self, op: IoOp, offset: u64, len: usize) -> Result<(), ReencryptError> {
        let (offset, iov) = match op {
            IoOp::Flush => (0, Iovecs::NONE),
            _ => (self.data_offset + offset, self.bounce.iovecs(len)),
        };
        let req = IoRequest { tag: 0, op, offset, len: len as u64, iov };
        let deadline = Instant::now() + self.busy_limit;
        sync_io::run(self.chan.as_mut(), &req, &mut || Instant::now() >= deadline)
            .map_err(|errno| ReencryptError::Io { op: format!("{op:?}").to_lowercase(), offset, errno })
    }
}

/// What [`recover_hotzone`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Sectors still under the old key (their checksum matched), now rewritten.
    pub rewritten: u64,
    /// Sectors already under the new key, left alone.
    pub already_new: u64,
}

/// Finishes a hotzone a crash interrupted, before the disk serves I/O: each sector of
/// `[offset, offset + len)` (bytes of the data area) whose ciphertext still has its stored
/// SHA-256 is under the old key and is rewritten under the new one; any other was written by
/// the job already and is left. Flushes the base. The caller then records the hotzone done
/// ([`ReencryptCheckpoint::advance`] to `offset + len`) and builds the device with that
/// boundary ([`crate::CryptoDevice::with_reencryption`]). Runs on the calling (control)
/// thread. Relies, as cryptsetup's checksum mode does, on a sector write being atomic: a torn
/// sector is neither old nor new.
pub fn recover_hotzone(
    base: &Bdev,
    layout: CryptoLayout,
    old_key: &Arc<CryptoKey>,
    new_key: &Arc<CryptoKey>,
    hotzone: &Hotzone,
) -> Result<Recovered, ReencryptError> {
    let ss = layout.sector_size as usize;
    let len = usize::try_from(hotzone.len).unwrap_or(usize::MAX);
    if !len.is_multiple_of(ss) || len > MAX_HOTZONE as usize || hotzone.len == 0 {
        return Err(ReencryptError::InvalidParam {
            field: "hotzone",
            reason: format!(
                "{} bytes is not a whole number of {ss}-byte sectors up to {}",
                hotzone.len, MAX_HOTZONE
            ),
        });
    }
    if hotzone.old_sector_sha256.len() != len / ss || !hotzone.offset.is_multiple_of(ss as u64) {
        return Err(ReencryptError::InvalidParam {
            field: "hotzone",
            reason: format!(
                "{} checksums for {} sectors at {}: one per whole sector wanted",
                hotzone.old_sector_sha256.len(),
                len / ss,
                hotzone.offset
            ),
        });
    }
    let data_len = base.info().size_bytes().saturating_sub(layout.data_offset);
    if hotzone.offset.checked_add(hotzone.len).is_none_or(|end| end > data_len) {
        return Err(ReencryptError::InvalidParam {
            field: "hotzone",
            reason: format!(
                "{} bytes at {} do not lie inside the {data_len}-byte data area",
                hotzone.len, hotzone.offset
            ),
        });
    }
    let mut io = BaseIo::open(base, layout, len, Duration::from_secs(30))?;
    let mut buf = vec![0u8; len];
    io.read(hotzone.offset, &mut buf)?;
    let mut old = XtsEngine::new(old_key.clone());
    let mut new = XtsEngine::new(new_key.clone());
    let mut found = Recovered { rewritten: 0, already_new: 0 };
    for (k, (sector, sum)) in buf.chunks_exact_mut(ss).zip(&hotzone.old_sector_sha256).enumerate() {
        if Sha256::digest(&*sector).as_slice() == sum {
            let tweak = (hotzone.offset + (k * ss) as u64) / 512;
            old.decrypt(sector, tweak);
            new.encrypt(sector, tweak);
            found.rewritten += 1;
        } else {
            found.already_new += 1;
        }
    }
    // The whole hotzone in one write: a sector already new is written with the bytes it holds,
    // so a crash during this write leaves every sector old (its checksum matches: done again)
    // or new, as before.
    if found.rewritten > 0 {
        io.write(hotzone.offset, &buf)?;
        io.flush()?;
    }
    Ok(found)
}

/// The SHA-256 of each `sector_size`-byte sector of `data`.
pub(crate) fn sector_sums(data: &[u8], sector_size: usize, out: &mut Vec<[u8; 32]>) {
    out.clear();
    out.extend(data.chunks_exact(sector_size).map(|s| <[u8; 32]>::from(Sha256::digest(s))));
}
