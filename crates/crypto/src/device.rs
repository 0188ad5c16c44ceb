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
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use fp_bdev::iov::{for_each_unit, for_each_unit_mut};
use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, BlockExtent, BouncePool, Capacity, DoneList, IoChannel, IoOp,
    IoRequest, IoStatus, IoTypes, Iovecs, SubmitError,
};

use crate::reencrypt::shared::{ChannelSlot, ReencShared, Slots, Window, MAX_BOUNDARY};
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
    /// Every open channel's slot, for a re-encryption job's quiesce.
    pub(crate) slots: Arc<Slots>,
    /// The re-encryption state once attached (at creation, or by the first job); the channels
    /// look it up when it appears.
    pub(crate) reenc: Arc<OnceLock<Arc<ReencShared>>>,
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
        Ok(CryptoDevice { info, base, key, layout, slots: Arc::default(), reenc: Arc::default() })
    }

    /// A crypto bdev over a disk part way through re-encryption (a resumed job): sectors below
    /// byte `boundary` of the data are under `new_key`, the others under `old_key`. Serves the
    /// mixed disk; [`crate::start_reencrypt`] with the same new key continues the job from
    /// `boundary`. A hotzone left by a crash must be repaired first ([`crate::recover_hotzone`]).
    /// `boundary` is refused naming `boundary` unless it is a whole number of sectors inside the
    /// disk.
    pub fn with_reencryption(
        name: &str,
        base: Bdev,
        old_key: Arc<CryptoKey>,
        new_key: Arc<CryptoKey>,
        layout: CryptoLayout,
        boundary: u64,
    ) -> Result<Self, BdevError> {
        let dev = Self::with_layout(name, base, old_key, layout)?;
        let size = dev.info.size_bytes();
        if !boundary.is_multiple_of(u64::from(layout.sector_size)) || boundary > size.min(MAX_BOUNDARY) {
            return Err(BdevError::InvalidParam {
                field: "boundary",
                reason: format!(
                    "{boundary} is not a multiple of {} bytes inside the {size}-byte disk",
                    layout.sector_size
                ),
            });
        }
        if new_key.same_material(&dev.key) {
            return Err(BdevError::InvalidParam {
                field: "new_key",
                reason: format!("'{}' is the key the disk is encrypted with", new_key.name()),
            });
        }
        let _ = dev.reenc.set(Arc::new(ReencShared::new(new_key, boundary)));
        Ok(dev)
    }

    /// The key of the sectors not yet re-encrypted (all of them without a re-encryption).
    pub fn key(&self) -> &Arc<CryptoKey> {
        &self.key
    }

    /// The re-encryption's boundary and its new key's name, once one is attached: bytes of the
    /// data below the boundary are under the new key.
    pub fn reencryption(&self) -> Option<(u64, &str)> {
        self.reenc.get().map(|r| (r.window().boundary, r.new_key.name()))
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
            keys: Keys { old: XtsEngine::new(self.key.clone()), new: None },
            slot: self.slots.register(),
            active: false,
            reenc_cell: self.reenc.clone(),
            reenc: None,
            acked: 0,
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
    len: u64,
    iov: Iovecs,
    read: bool,
    /// The re-encryption boundary when it was submitted: units below are under the new key.
    boundary: u64,
    /// At the base (the slot is taken).
    live: bool,
}

impl Op {
    const EMPTY: Op =
        Op { tag: 0, offset: 0, len: 0, iov: Iovecs::NONE, read: false, boundary: 0, live: false };
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
    /// The re-encryption boundary when it was submitted: units below are under the new key.
    boundary: u64,
    /// Accepted and not yet completed (the slot is taken).
    live: bool,
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
        boundary: 0,
        live: false,
    };
}

struct CryptoChannel {
    base: Box<dyn IoChannel>,
    info: BdevInfo,
    /// Added to every offset sent to the base.
    data_offset: u64,
    keys: Keys,
    /// This channel's slot for a re-encryption job's quiesce.
    slot: Arc<ChannelSlot>,
    /// What `slot.active` says: set before a request is looked at, cleared once none is in
    /// flight.
    active: bool,
    /// The device's re-encryption state, looked up until it appears.
    reenc_cell: Arc<OnceLock<Arc<ReencShared>>>,
    reenc: Option<Arc<ReencShared>>,
    /// The last epoch acknowledged in `slot`.
    acked: u64,
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

/// A channel's ciphers: the key of its sectors, and during a re-encryption the new key of
/// those below the boundary.
struct Keys {
    old: XtsEngine,
    new: Option<XtsEngine>,
}

impl Keys {
    /// The cipher of the unit at byte `offset` for a request submitted under `boundary`.
    #[inline]
    fn at(&mut self, offset: u64, boundary: u64) -> &mut XtsEngine {
        match &mut self.new {
            Some(new) if offset < boundary => new,
            _ => &mut self.old,
        }
    }
}

/// Encrypts the `buf.len()` bytes at byte `pos` of `iov` into `buf`, block by block, the first
/// block being at byte `offset` of the disk, each with the key `boundary` says: straight from
/// the caller's memory when a block lies in one iovec (the usual case), through `scratch` when
/// it spans two. Returns how many bytes (the iovecs hold them all: checked at submit).
#[allow(clippy::too_many_arguments)]
fn encrypt_from_iov(
    keys: &mut Keys,
    iov: &Iovecs,
    pos: u64,
    buf: &mut [u8],
    bs: usize,
    offset: u64,
    boundary: u64,
    scratch: &mut [u8],
) -> usize {
    let len = buf.len() as u64;
    let mut units = buf.chunks_exact_mut(bs);
    let blocks = for_each_unit(iov, pos, len, bs, scratch, |k, src| {
        let unit = units.next().expect("one output block per input block");
        let at = offset + (k * bs) as u64;
        keys.at(at, boundary).encrypt_to(src, unit, at / 512);
    });
    blocks * bs
}

/// Decrypts a completed read in place, block by block, each with the key its position says;
/// a block split across iovecs goes through `scratch`.
fn decrypt_read(keys: &mut Keys, bs: usize, op: &Op, scratch: &mut [u8]) {
    for_each_unit_mut(&op.iov, 0, op.iov.total_len(), bs, scratch, |k, unit| {
        let at = op.offset + (k * bs) as u64;
        keys.at(at, op.boundary).decrypt(unit, at / 512);
    });
}

/// Why a request was not let through to the base during a re-encryption.
enum Held {
    /// It overlaps the hotzone the job is rewriting: the caller retries.
    Busy,
    /// It overlaps a hotzone the job left part rewritten: it fails (EIO).
    Failed,
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
            let at = job.offset + job.next;
            if job.iov.is_empty() {
                buf.fill(0);
                for (k, unit) in buf.chunks_exact_mut(bs).enumerate() {
                    let unit_at = at + (k * bs) as u64;
                    self.keys.at(unit_at, job.boundary).encrypt(unit, unit_at / 512);
                }
            } else {
                let done = encrypt_from_iov(
                    &mut self.keys,
                    &job.iov,
                    job.next,
                    buf,
                    bs,
                    at,
                    job.boundary,
                    &mut self.scratch,
                );
                debug_assert_eq!(done, n, "the write's iovecs were checked to hold its length");
            }
            let req = IoRequest {
                tag: (OPS + c as usize) as u32,
                op: IoOp::Write,
                offset: self.data_offset + at,
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
                        job.live = false;
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

    /// The re-encryption state, looked up (cold, once) when the device has one.
    #[inline]
    fn attached(&mut self) -> Option<&ReencShared> {
        if self.reenc.is_none() {
            let r = self.reenc_cell.get()?.clone();
            self.keys.new = Some(XtsEngine::new(r.new_key.clone()));
            self.reenc = Some(r);
        }
        self.reenc.as_deref()
    }

    /// Lets a request through to the base, or holds it while a re-encryption rewrites its
    /// sectors. Returns the boundary it goes under (0 without a re-encryption). Marks the
    /// channel active first, so a job that holds a hotzone after this looked sees it busy.
    #[inline]
    fn gate(&mut self, req: &IoRequest) -> Result<u64, Held> {
        if !self.active {
            self.slot.active.store(true, Ordering::SeqCst);
            // Orders the mark before the loads of the state below (the job's side stores the
            // hotzone, then loads the mark).
            std::sync::atomic::fence(Ordering::SeqCst);
            self.active = true;
        }
        let Some(r) = self.attached() else { return Ok(0) };
        let w = r.window();
        if req.op != IoOp::Flush && w.hot(req.offset, req.len) {
            return Err(if r.hot_failed() { Held::Failed } else { Held::Busy });
        }
        Ok(w.boundary)
    }

    /// Clears the channel's active mark once nothing of it is at (or bound for) the base.
    #[inline]
    fn settle(&mut self) {
        if self.active && self.in_use() == 0 {
            self.slot.active.store(false, Ordering::SeqCst);
            self.active = false;
        }
    }

    /// Acknowledges a new re-encryption epoch once no request in flight here overlaps its
    /// hotzone (cold: one load per poll while the epoch does not move).
    fn acknowledge(&mut self) {
        let Some(r) = self.reenc.as_deref() else { return };
        let epoch = r.epoch();
        if epoch == self.acked {
            return;
        }
        let w: Window = r.window();
        let overlaps = self.ops.iter().any(|o| o.live && o.read && w.hot(o.offset, o.len))
            || self.jobs.iter().any(|j| j.live && w.hot(j.offset, j.len));
        if !overlaps {
            self.slot.ack.store(epoch, Ordering::Release);
            self.acked = epoch;
        }
    }

    fn submit_inner(&mut self, req: &IoRequest, boundary: u64) -> Result<(), SubmitError> {
        match req.op {
            IoOp::Read | IoOp::Flush => {
                let Some(o) = self.free_ops.pop() else { return Err(SubmitError::Busy) };
                let down = IoRequest { tag: u32::from(o), offset: self.data_offset + req.offset, ..*req };
                match self.base.submit(&down) {
                    Ok(()) => {
                        self.ops[o as usize] = Op {
                            tag: req.tag,
                            offset: req.offset,
                            len: req.len,
                            iov: req.iov,
                            read: req.op == IoOp::Read,
                            boundary,
                            live: true,
                        };
                        Ok(())
                    }
                    Err(e) => {
                        self.free_ops.push(o);
                        Err(e)
                    }
                }
            }
            IoOp::Write | IoOp::WriteZeroes => {
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
                    boundary,
                    live: true,
                };
                self.queue.push_back(j);
                self.pump();
                Ok(())
            }
            IoOp::Discard => unreachable!("completed before"),
        }
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
        if req.len == 0 && matches!(req.op, IoOp::Write | IoOp::WriteZeroes) {
            self.ready.push(req.tag, IoStatus::Success);
            return Ok(());
        }
        let result = match self.gate(req) {
            Ok(boundary) => self.submit_inner(req, boundary),
            Err(Held::Busy) => Err(SubmitError::Busy),
            Err(Held::Failed) => {
                self.ready.push(req.tag, IoStatus::Error(libc::EIO));
                Ok(())
            }
        };
        self.settle();
        result
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.pump();
        let mut n = self.ready.deliver(done);
        let CryptoChannel {
            base,
            info,
            keys,
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
                ops[tag].live = false;
                free_ops.push(tag as u16);
                if op.read && status == IoStatus::Success {
                    decrypt_read(keys, bs, &op, scratch);
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
                    job.live = false;
                    free_jobs.push(j as u16);
                    n += 1;
                }
            }
        });
        self.pump();
        n += self.ready.deliver(done);
        if self.reenc.is_some() || self.active {
            self.attached();
            self.acknowledge();
        }
        self.settle();
        n
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
                job.live = false;
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
