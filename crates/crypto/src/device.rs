//! The crypto bdev (SPDK's `bdev_crypto`): a block device stacked on another that stores every
//! block encrypted with AES-XTS, readable by dm-crypt.
//!
//! Format: each block of the crypto bdev is one XTS data unit, encrypted with the tweak
//! dm-crypt's `aes-xts-plain64` uses: the number of the unit's first 512-byte sector, as a
//! 64-bit little-endian number zero-padded to 16 bytes. With 512-byte blocks that is the block
//! number; with 4096-byte blocks it is the block number times 8, which is what
//! `cryptsetup open --type plain --cipher aes-xts-plain64 --sector-size 4096` reads (without
//! `--iv-large-sectors`). Keys are 2×128 or 2×256 bits (`--key-size 256` or `512`).
//!
//! Writes are encrypted into the channel's own buffers (a fixed pool; a write longer than a
//! buffer goes down in pieces; `Busy` when the pool has no request slot left), so the caller's
//! buffer never changes. Reads go down into the caller's buffer and are decrypted there once
//! the base completes them. Write-zeroes writes encrypted zeroes; a discard is completed
//! without reaching the base (its blocks keep their data, which a discard allows), so the base
//! never learns which blocks are free.
//!
//! Layout ([`CryptoLayout`]): the encrypted data may start at a byte offset on the base (a LUKS
//! data segment: 16 MiB into a LUKS2 disk, 2 MiB into a LUKS1 one) and use a sector size larger
//! than the base's blocks (a 4096-byte-sector LUKS2 volume on a 512-byte base). The tweak counts
//! 512-byte sectors from the data offset (LUKS's `iv_tweak` 0, as dm-crypt and QEMU), so the
//! format of the data area is the same whatever its offset. The size is what lies after the
//! offset in whole sectors, and follows the base's.

use std::collections::VecDeque;
use std::sync::Arc;

use fp_bdev::iov::{for_each_unit, for_each_unit_mut};
use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, BlockExtent, BouncePool, Capacity, DoneList, IoChannel, IoOp,
    IoRequest, IoStatus, IoTypes, Iovecs, SubmitError,
};

use crate::{CryptoKey, XtsEngine};

/// Bytes of one write buffer; a longer write goes down in pieces of this size.
pub const CHUNK: usize = 64 << 10;
/// Write buffers per channel (4 MiB).
pub const CHUNKS: usize = 64;
/// Reads and flushes in flight per channel.
const OPS: usize = 256;
/// Writes (and write-zeroes) accepted per channel, in flight or waiting for buffers.
const WRITES: usize = 256;
/// Completions held for the next poll (discards, refused requests).
const READY: usize = 1024;

/// Where the encrypted data lies on the base and in what units: a LUKS data segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CryptoLayout {
    /// Bytes on the base before the data: a multiple of the base's block size and of
    /// `sector_size`. Block 0 of the crypto bdev is the base's byte `data_offset`.
    pub data_offset: u64,
    /// The crypto bdev's block size and XTS data unit: 512 to 4096 bytes, a power of two and a
    /// multiple of the base's block size.
    pub sector_size: u32,
}

/// A bdev that encrypts every block of its base with AES-XTS (SPDK's crypto bdev).
pub struct CryptoDevice {
    info: BdevInfo,
    base: Bdev,
    key: Arc<CryptoKey>,
    layout: CryptoLayout,
}

impl CryptoDevice {
    /// A crypto bdev `name` over all of `base` with `key`, one block per base block. The
    /// base's block size must be 512 to 4096 bytes (dm-crypt's sector sizes), and it must take
    /// reads and writes.
    pub fn new(name: &str, base: Bdev, key: Arc<CryptoKey>) -> Result<Self, BdevError> {
        let b = base.info();
        if b.block_size > 4096 {
            return Err(BdevError::InvalidParam {
                field: "base_bdev_name",
                reason: format!(
                    "'{}' has {}-byte blocks: a crypto bdev takes 512 to 4096 (dm-crypt's sector sizes)",
                    b.name, b.block_size
                ),
            });
        }
        let layout = CryptoLayout { data_offset: 0, sector_size: b.block_size };
        Self::with_layout(name, base, key, layout)
    }

    /// A crypto bdev `name` over `base` with `key` whose data starts `layout.data_offset` bytes
    /// into the base, in sectors of `layout.sector_size` bytes (a LUKS data segment). The tweak
    /// of a sector is its 512-byte sector number counted from the data offset. Refused naming
    /// `sector_size` or `data_offset` when the layout does not fit the base's blocks, and
    /// `base_bdev_name` when the base holds less than the offset and one sector or does not
    /// take reads and writes.
    pub fn with_layout(
        name: &str,
        base: Bdev,
        key: Arc<CryptoKey>,
        layout: CryptoLayout,
    ) -> Result<Self, BdevError> {
        let b = base.info();
        let CryptoLayout { data_offset, sector_size } = layout;
        fp_bdev::validate_geometry(name, b.block_size, b.num_blocks())?;
        let invalid = |field, reason| Err(BdevError::InvalidParam { field, reason });
        if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() {
            return invalid(
                "sector_size",
                format!("{sector_size} is not a power of two from 512 to 4096 (dm-crypt's sector sizes)"),
            );
        }
        if !sector_size.is_multiple_of(b.block_size) {
            return invalid(
                "sector_size",
                format!("{sector_size} is not a multiple of '{}''s {}-byte blocks", b.name, b.block_size),
            );
        }
        // Both are powers of two, so a multiple of the larger is a multiple of both.
        if !data_offset.is_multiple_of(u64::from(sector_size.max(b.block_size))) {
            return invalid(
                "data_offset",
                format!(
                    "{data_offset} is not a multiple of the {sector_size}-byte sector and of '{}''s {}-byte blocks",
                    b.name, b.block_size
                ),
            );
        }
        let needed = data_offset.saturating_add(u64::from(sector_size));
        if b.size_bytes() < needed {
            return invalid(
                "base_bdev_name",
                format!(
                    "'{}' holds {} bytes: the data offset {data_offset} and one {sector_size}-byte sector need {needed}",
                    b.name,
                    b.size_bytes()
                ),
            );
        }
        if !b.io_types.read || !b.io_types.write {
            return Err(BdevError::InvalidParam {
                field: "base_bdev_name",
                reason: format!("'{}' does not take both reads and writes", b.name),
            });
        }
        // A resized base resizes the crypto bdev with it (the tweak counts from the data
        // offset, so sectors that exist keep their encryption). Over all of the base in its
        // own blocks, the base's own capacity: one load per request, as every stacked bdev.
        let capacity = if data_offset == 0 && sector_size == b.block_size {
            b.capacity.clone()
        } else {
            Capacity::derived(&b.capacity, b.block_size, data_offset, sector_size)
        };
        let info = BdevInfo {
            name: name.to_string(),
            product_name: "crypto".into(),
            block_size: sector_size,
            capacity,
            io_types: IoTypes {
                read: true,
                write: true,
                flush: b.io_types.flush,
                unmap: true,
                write_zeroes: true,
            },
            driver: "crypto",
            driver_specific: Some(("base_bdev_name".into(), b.name.clone())),
        };
        Ok(CryptoDevice { info, base, key, layout })
    }

    /// Where the data lies on the base.
    pub fn layout(&self) -> CryptoLayout {
        self.layout
    }

    /// The device below.
    pub fn base(&self) -> &Bdev {
        &self.base
    }

    /// The key's name.
    pub fn key_name(&self) -> &str {
        self.key.name()
    }
}

impl BlockDevice for CryptoDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(CryptoChannel {
            base: self.base.open_channel()?,
            info: self.info.clone(),
            data_offset: self.layout.data_offset,
            xts: XtsEngine::new(self.key.clone()),
            chunks: BouncePool::zeroed(CHUNKS, CHUNK),
            chunk_job: vec![0; CHUNKS],
            free_chunks: (0..CHUNKS as u16).rev().collect(),
            ops: vec![Op::EMPTY; OPS],
            free_ops: (0..OPS as u16).rev().collect(),
            jobs: vec![WriteJob::EMPTY; WRITES],
            free_jobs: (0..WRITES as u16).rev().collect(),
            queue: VecDeque::with_capacity(WRITES),
            refused: false,
            ready: DoneList::new(),
            scratch: vec![0; 4096],
        }))
    }

    /// The base's: a hole there reads back as ciphertext of nothing, so it is reported as
    /// data, never as zeroes.
    fn block_status(&self, offset: u64, len: u64, out: &mut Vec<BlockExtent>) -> Result<(), BdevError> {
        self.info.check_status_range(offset, len)?;
        out.push(BlockExtent::data(len));
        Ok(())
    }
}

/// A read or flush passed down.
#[derive(Clone, Copy)]
struct Op {
    tag: u32,
    offset: u64,
    iov: Iovecs,
    read: bool,
}

impl Op {
    const EMPTY: Op = Op { tag: 0, offset: 0, iov: Iovecs::NONE, read: false };
}

/// A write (or write-zeroes, `iov` empty) going down in pieces.
#[derive(Clone, Copy)]
struct WriteJob {
    tag: u32,
    offset: u64,
    len: u64,
    iov: Iovecs,
    /// Bytes handed to the base so far.
    next: u64,
    /// Pieces at the base.
    outstanding: u32,
    status: IoStatus,
}

impl WriteJob {
    const EMPTY: WriteJob = WriteJob {
        tag: 0,
        offset: 0,
        len: 0,
        iov: Iovecs::NONE,
        next: 0,
        outstanding: 0,
        status: IoStatus::Success,
    };
}

struct CryptoChannel {
    base: Box<dyn IoChannel>,
    info: BdevInfo,
    /// Added to every offset sent to the base.
    data_offset: u64,
    xts: XtsEngine,
    /// The write buffers, `CHUNKS` of `CHUNK` bytes.
    chunks: BouncePool,
    chunk_job: Vec<u16>,
    free_chunks: Vec<u16>,
    ops: Vec<Op>,
    free_ops: Vec<u16>,
    jobs: Vec<WriteJob>,
    free_jobs: Vec<u16>,
    /// Jobs with pieces not yet handed down, oldest first.
    queue: VecDeque<u16>,
    /// The base refused the front job's next piece as busy: only a `poll` hands it down (no
    /// base completion will signal for it), so the caller must not sleep.
    refused: bool,
    ready: DoneList,
    /// One block, for a block split across iovecs.
    scratch: Vec<u8>,
}

/// Encrypts the `buf.len()` bytes at byte `pos` of `iov` into `buf`, block by block, the first
/// block being sector `first`: straight from the caller's memory when a block lies in one iovec
/// (the usual case), through `scratch` when it spans two. Returns how many bytes (the iovecs
/// hold them all: checked at submit).
fn encrypt_from_iov(
    xts: &mut XtsEngine,
    iov: &Iovecs,
    pos: u64,
    buf: &mut [u8],
    bs: usize,
    first: u64,
    scratch: &mut [u8],
) -> usize {
    let per_block = (bs / 512) as u64;
    let len = buf.len() as u64;
    let mut units = buf.chunks_exact_mut(bs);
    let blocks = for_each_unit(iov, pos, len, bs, scratch, |k, src| {
        let unit = units.next().expect("one output block per input block");
        xts.encrypt_to(src, unit, first + k as u64 * per_block);
    });
    blocks * bs
}

/// Decrypts a completed read in place, block by block; a block split across iovecs goes
/// through `scratch`.
fn decrypt_read(xts: &mut XtsEngine, bs: usize, op: &Op, scratch: &mut [u8]) {
    let first = op.offset / 512;
    let per_block = (bs / 512) as u64;
    for_each_unit_mut(&op.iov, 0, op.iov.total_len(), bs, scratch, |k, unit| {
        xts.decrypt(unit, first + k as u64 * per_block);
    });
}

impl CryptoChannel {
    /// Hands queued write pieces to the base while buffers are free and the base takes them.
    fn pump(&mut self) {
        self.refused = false;
        let bs = self.info.block_size as usize;
        while let Some(&j) = self.queue.front() {
            let Some(c) = self.free_chunks.pop() else { return };
            let job = &mut self.jobs[j as usize];
            let n = (job.len - job.next).min(CHUNK as u64) as usize;
            let buf = &mut self.chunks.bytes_mut(usize::from(c))[..n];
            let first = (job.offset + job.next) / 512;
            if job.iov.is_empty() {
                buf.fill(0);
                for (k, unit) in buf.chunks_exact_mut(bs).enumerate() {
                    self.xts.encrypt(unit, first + (k * bs / 512) as u64);
                }
            } else {
                let done =
                    encrypt_from_iov(&mut self.xts, &job.iov, job.next, buf, bs, first, &mut self.scratch);
                debug_assert_eq!(done, n, "the write's iovecs were checked to hold its length");
            }
            let req = IoRequest {
                tag: (OPS + c as usize) as u32,
                op: IoOp::Write,
                offset: self.data_offset + job.offset + job.next,
                len: n as u64,
                iov: self.chunks.iovecs(usize::from(c), n),
            };
            match self.base.submit(&req) {
                Ok(()) => {
                    self.chunk_job[c as usize] = j;
                    job.outstanding += 1;
                    job.next += n as u64;
                }
                Err(SubmitError::Busy) => {
                    self.free_chunks.push(c);
                    self.refused = true;
                    return;
                }
                Err(e) => {
                    self.free_chunks.push(c);
                    job.status = if e == SubmitError::Unsupported {
                        IoStatus::Unsupported
                    } else {
                        IoStatus::Error(libc::EINVAL)
                    };
                    job.next = job.len;
                    if job.outstanding == 0 {
                        self.ready.push(job.tag, job.status);
                        self.free_jobs.push(j);
                    }
                }
            }
            if self.jobs[j as usize].next == self.jobs[j as usize].len {
                self.queue.pop_front();
            }
        }
    }

    fn in_use(&self) -> usize {
        (OPS - self.free_ops.len()) + (WRITES - self.free_jobs.len())
    }
}

impl IoChannel for CryptoChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        if self.ready.len() >= READY {
            return Err(SubmitError::Busy);
        }
        match req.op {
            IoOp::Read | IoOp::Write => {
                if req.iov.total_len() != req.len {
                    self.ready.push(req.tag, IoStatus::Error(libc::EINVAL));
                    return Ok(());
                }
            }
            IoOp::Discard => {
                self.ready.push(req.tag, IoStatus::Success);
                return Ok(());
            }
            IoOp::Flush | IoOp::WriteZeroes => {}
        }
        match req.op {
            IoOp::Read | IoOp::Flush => {
                let Some(o) = self.free_ops.pop() else { return Err(SubmitError::Busy) };
                let down = IoRequest { tag: u32::from(o), offset: self.data_offset + req.offset, ..*req };
                match self.base.submit(&down) {
                    Ok(()) => {
                        self.ops[o as usize] =
                            Op { tag: req.tag, offset: req.offset, iov: req.iov, read: req.op == IoOp::Read };
                        Ok(())
                    }
                    Err(e) => {
                        self.free_ops.push(o);
                        Err(e)
                    }
                }
            }
            IoOp::Write | IoOp::WriteZeroes => {
                if req.len == 0 {
                    self.ready.push(req.tag, IoStatus::Success);
                    return Ok(());
                }
                let Some(j) = self.free_jobs.pop() else { return Err(SubmitError::Busy) };
                let iov = if req.op == IoOp::Write { req.iov } else { Iovecs::NONE };
                self.jobs[j as usize] = WriteJob {
                    tag: req.tag,
                    offset: req.offset,
                    len: req.len,
                    iov,
                    next: 0,
                    outstanding: 0,
                    status: IoStatus::Success,
                };
                self.queue.push_back(j);
                self.pump();
                Ok(())
            }
            IoOp::Discard => unreachable!("completed above"),
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.pump();
        let mut n = self.ready.deliver(done);
        let CryptoChannel {
            base,
            info,
            xts,
            chunk_job,
            free_chunks,
            ops,
            free_ops,
            jobs,
            free_jobs,
            scratch,
            ..
        } = self;
        let bs = info.block_size as usize;
        base.poll(&mut |tag, status| {
            let tag = tag as usize;
            if tag < OPS {
                let op = ops[tag];
                free_ops.push(tag as u16);
                if op.read && status == IoStatus::Success {
                    decrypt_read(xts, bs, &op, scratch);
                }
                done(op.tag, status);
                n += 1;
            } else {
                let c = tag - OPS;
                free_chunks.push(c as u16);
                let j = chunk_job[c] as usize;
                let job = &mut jobs[j];
                job.outstanding -= 1;
                if status != IoStatus::Success && job.status == IoStatus::Success {
                    job.status = status;
                }
                if job.outstanding == 0 && job.next == job.len {
                    done(job.tag, job.status);
                    free_jobs.push(j as u16);
                    n += 1;
                }
            }
        });
        self.pump();
        n + self.ready.deliver(done)
    }

    fn in_flight(&self) -> usize {
        self.ready.len() + self.in_use()
    }

    /// While the base refuses writes as busy: the queued writes none of whose pieces is at
    /// the base yet (a write behind the refused one waits on the same refusal), and what the
    /// base parked.
    fn parked(&self) -> usize {
        let own = if self.refused {
            self.queue.iter().filter(|&&j| self.jobs[j as usize].outstanding == 0).count()
        } else {
            0
        };
        own + self.base.parked()
    }

    fn abort_parked(&mut self) -> usize {
        let mut n = self.base.abort_parked();
        if !self.refused {
            return n;
        }
        while let Some(j) = self.queue.pop_front() {
            let job = &mut self.jobs[j as usize];
            job.next = job.len;
            job.status = IoStatus::Error(libc::ECANCELED);
            if job.outstanding == 0 {
                self.ready.push(job.tag, job.status);
                self.free_jobs.push(j);
            }
            n += 1;
        }
        self.refused = false;
        n
    }

    /// The base's: every request here is at the base, waits for a buffer that only a base
    /// completion frees, or sits in `ready` (which `arm_completion_fd` reports).
    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        self.base.completion_fd()
    }

    fn disarm_completion_fd(&mut self) {
        self.base.disarm_completion_fd()
    }

    fn arm_completion_fd(&mut self) -> bool {
        self.ready.is_empty() && self.base.arm_completion_fd()
    }

    /// As the base: a write waiting for a buffer moves on when a base completion frees one.
    /// Not while the base refused a piece as busy: nothing at the base may complete to wake
    /// the caller, whose polls retry it.
    fn sleeps_in_flight(&self) -> bool {
        !self.refused && self.base.sleeps_in_flight()
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
