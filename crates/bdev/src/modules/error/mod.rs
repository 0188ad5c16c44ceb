//! The error bdev (SPDK's `bdev_error`): a block device stacked on another that passes every
//! request down unless an error was injected for its kind of request, for tests of raid
//! degradation, retries and guest error handling.
//!
//! An injection, per request kind (read, write, unmap, flush, write-zeroes), is one of:
//! * `failure`: the request completes with `EIO` without reaching the base;
//! * `pending`: the request is held and completes only when the injections are cleared or
//!   the held requests resumed (it is then passed to the base), or when the bdev is deleted
//!   (it then fails with `ENXIO`);
//! * `corrupt_data`: a write's data is xored at `corrupt_offset` with `corrupt_value` before
//!   it goes down (in a copy, as in SPDK: the caller's buffer is never changed); a read's
//!   after it comes back.
//!   Requests without data (unmap, flush, write-zeroes) pass untouched and do not count;
//! * `nomem`: the submission is refused with [`SubmitError::Busy`], which callers retry after
//!   a poll (SPDK's `NOMEM` status, which its bdev layer retries, maps to this).
//!
//! Each injection applies to the next `num` requests of its kind (across all channels), then
//! ends; with `queue_depth` > 0 only to requests submitted while their channel has at least
//! that many requests in flight on the base (as SPDK counts). The state is atomics shared by the control plane
//! and every channel: a request loads one counter and, when it is not zero, takes one with a
//! compare-and-swap; no lock is taken on the I/O path.

// The tests build requests over their own buffers and open an eventfd: unsafe stays there.
#![cfg_attr(not(test), forbid(unsafe_code))]

use crate::iov::{self, BounceBuf};
use crate::Iovecs;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

mod rpc;

pub use rpc::ErrorModule;

use crate::{
    Bdev, BdevError, BdevInfo, BlockDevice, BlockExtent, IoChannel, IoOp, IoRequest, IoStatus, SubmitError,
};

/// What an injection does to the requests it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    /// Complete with `EIO`.
    Failure,
    /// Hold until the injection is cleared or the bdev deleted.
    Pending,
    /// Xor one byte of the data with a value.
    CorruptData,
    /// Refuse the submission with [`SubmitError::Busy`].
    Nomem,
}

impl ErrorType {
    /// SPDK's names, in declaration order.
    pub const NAMES: [&'static str; 4] = ["failure", "pending", "corrupt_data", "nomem"];

    /// The type SPDK calls `name`.
    pub fn from_name(name: &str) -> Option<ErrorType> {
        const ALL: [ErrorType; 4] =
            [ErrorType::Failure, ErrorType::Pending, ErrorType::CorruptData, ErrorType::Nomem];
        Self::NAMES.iter().position(|n| *n == name).map(|i| ALL[i])
    }

    /// SPDK's name for the type.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    fn code(self) -> u8 {
        self as u8 + 1
    }

    fn from_code(code: u8) -> Option<ErrorType> {
        const ALL: [ErrorType; 4] =
            [ErrorType::Failure, ErrorType::Pending, ErrorType::CorruptData, ErrorType::Nomem];
        ALL.get((code as usize).wrapping_sub(1)).copied()
    }
}

/// The request kinds an injection is set for, as `bdev_error_inject_error`'s `io_type` names
/// them (besides `all` and `clear`).
pub const IO_TYPES: [&str; 5] = ["read", "write", "unmap", "flush", "write_zeroes"];

fn kind_index(op: IoOp) -> usize {
    match op {
        IoOp::Read => 0,
        IoOp::Write => 1,
        IoOp::Discard => 2,
        IoOp::Flush => 3,
        IoOp::WriteZeroes => 4,
    }
}

/// One injection as set by `bdev_error_inject_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injection {
    /// What it does.
    pub error_type: ErrorType,
    /// How many requests it takes yet; 0 = none (no injection).
    pub num: u64,
    /// Only requests submitted while their channel has at least this many in flight on the
    /// base (0: any).
    pub queue_depth: u64,
    /// For `corrupt_data`: the byte offset in the request's data.
    pub corrupt_offset: u64,
    /// For `corrupt_data`: the value xored into that byte (1-255).
    pub corrupt_value: u8,
}

/// One kind's injection, read by every channel. `num` is written last (release) and read
/// first (acquire): a channel that sees a count sees the parameters that go with it.
#[derive(Default)]
struct Slot {
    /// Bumped by the control plane whenever it ends or replaces the injection: a count taken
    /// from one injection is never given back to another.
    generation: AtomicU64,
    error_type: AtomicU8,
    num: AtomicU64,
    queue_depth: AtomicU64,
    corrupt_offset: AtomicU64,
    corrupt_value: AtomicU8,
}

/// What a request must have done to it, once it has taken an injection.
#[derive(Debug, Clone, Copy)]
struct Taken {
    generation: u64,
    error_type: ErrorType,
    corrupt_offset: u64,
    corrupt_value: u8,
}

impl Slot {
    /// Takes one of the injection's requests for a request submitted while its channel has
    /// `depth` requests in flight on the base, or `None` when the request passes.
    fn take(&self, depth: u64, has_data: bool) -> Option<Taken> {
        let generation = self.generation.load(Ordering::Acquire);
        let mut n = self.num.load(Ordering::Acquire);
        if n == 0 {
            return None;
        }
        let error_type = ErrorType::from_code(self.error_type.load(Ordering::Relaxed))?;
        if error_type == ErrorType::CorruptData && !has_data {
            return None;
        }
        let qd = self.queue_depth.load(Ordering::Relaxed);
        if qd != 0 && depth < qd {
            return None;
        }
        let taken = Taken {
            generation,
            error_type,
            corrupt_offset: self.corrupt_offset.load(Ordering::Relaxed),
            corrupt_value: self.corrupt_value.load(Ordering::Relaxed),
        };
        loop {
            match self.num.compare_exchange_weak(n, n - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(taken),
                Err(0) => return None,
                Err(now) => n = now,
            }
        }
    }

    /// Gives back the count `taken` took, for a request the base refused as busy (its caller
    /// retries it, and the retry is the one the injection takes), unless the control plane
    /// ended or replaced the injection meanwhile. A clear racing with this can leave a count
    /// of one, but with no error type (see [`ErrorDevice::clear`]), which takes nothing.
    fn give_back(&self, taken: &Taken) {
        let mut n = self.num.load(Ordering::Acquire);
        loop {
            if self.generation.load(Ordering::Acquire) != taken.generation {
                return;
            }
            match self.num.compare_exchange_weak(n, n.saturating_add(1), Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => n = now,
            }
        }
    }

    /// Ends the injection (control plane, serialised).
    fn end(&self) {
        self.num.store(0, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        // A count given back across this (see `give_back`) takes nothing without a type.
        self.error_type.store(0, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Option<Injection> {
        let num = self.num.load(Ordering::Acquire);
        let error_type = ErrorType::from_code(self.error_type.load(Ordering::Relaxed))?;
        (num > 0).then(|| Injection {
            error_type,
            num,
            queue_depth: self.queue_depth.load(Ordering::Relaxed),
            corrupt_offset: self.corrupt_offset.load(Ordering::Relaxed),
            corrupt_value: self.corrupt_value.load(Ordering::Relaxed),
        })
    }
}

/// The state shared by the device and its channels.
#[derive(Default)]
struct Shared {
    slots: [Slot; 5],
    /// Bumped by a clear: channels pass their held requests to the base at their next poll.
    resume: AtomicU64,
    /// Set when the bdev is deleted: channels fail their held requests at their next poll.
    deleted: AtomicU64,
}

/// A bdev that passes requests to its base except where an error was injected (SPDK's error bdev).
pub struct ErrorDevice {
    info: BdevInfo,
    base: Bdev,
    shared: Arc<Shared>,
    /// Serialises injections (several stores each). Control plane only.
    setting: Mutex<()>,
}

impl ErrorDevice {
    /// An error bdev `name` (SPDK names it `EE_<base>`) over `base`, with no injection.
    pub fn new(name: &str, base: Bdev) -> Result<Self, BdevError> {
        crate::validate_geometry(name, base.info().block_size, base.info().num_blocks())?;
        let b = base.info();
        let info = BdevInfo {
            name: name.to_string(),
            product_name: "Error Injection Disk".into(),
            block_size: b.block_size,
            capacity: b.capacity.clone(),
            io_types: b.io_types,
            driver: "error",
            driver_specific: Some(("base_bdev_name".into(), b.name.clone())),
        };
        Ok(ErrorDevice { info, base, shared: Arc::default(), setting: Mutex::new(()) })
    }

    /// The device below.
    pub fn base(&self) -> &Bdev {
        &self.base
    }

    /// Sets `injection` for each kind `kinds` names (indexes into [`IO_TYPES`]), replacing
    /// what was set for it. A `num` of 0 leaves the kinds without an injection. A
    /// `corrupt_data` injection needs a `corrupt_value` of 1-255.
    pub fn inject(&self, kinds: &[usize], injection: Injection) -> Result<(), BdevError> {
        if injection.error_type == ErrorType::CorruptData && injection.corrupt_value == 0 {
            return Err(BdevError::InvalidParam {
                field: "corrupt_value",
                reason: "corrupt_data needs a value of 1-255 to xor with".into(),
            });
        }
        let _serialised = self.setting.lock().unwrap_or_else(|p| p.into_inner());
        for &k in kinds {
            let slot = &self.shared.slots[k];
            slot.end();
            slot.error_type.store(injection.error_type.code(), Ordering::Relaxed);
            slot.queue_depth.store(injection.queue_depth, Ordering::Relaxed);
            slot.corrupt_offset.store(injection.corrupt_offset, Ordering::Relaxed);
            slot.corrupt_value.store(injection.corrupt_value, Ordering::Relaxed);
            slot.num.store(injection.num, Ordering::Release);
        }
        Ok(())
    }

    /// Ends every injection (`io_type` `clear`); held requests go to the base at each
    /// channel's next poll.
    pub fn clear(&self) {
        let _serialised = self.setting.lock().unwrap_or_else(|p| p.into_inner());
        for slot in &self.shared.slots {
            slot.end();
        }
        self.shared.resume.fetch_add(1, Ordering::Release);
    }

    /// Ends the `pending` injections and passes held requests to the base at each channel's
    /// next poll (`bdev_error_resume_pending`, as SPDK does); other injections stay.
    pub fn resume_pending(&self) {
        let _serialised = self.setting.lock().unwrap_or_else(|p| p.into_inner());
        for slot in &self.shared.slots {
            if slot.error_type.load(Ordering::Relaxed) == ErrorType::Pending.code() {
                slot.end();
            }
        }
        self.shared.resume.fetch_add(1, Ordering::Release);
    }

    /// The bdev is being deleted: every injection ends and held requests fail with `ENXIO` at
    /// each channel's next poll, so that their callers can drain and close.
    pub fn fail_pending(&self) {
        self.clear();
        self.shared.deleted.store(1, Ordering::Release);
    }

    /// The injection set for each kind of [`IO_TYPES`] now, with its remaining count.
    pub fn injections(&self) -> [Option<Injection>; 5] {
        std::array::from_fn(|k| self.shared.slots[k].snapshot())
    }
}

impl BlockDevice for ErrorDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(ErrorChannel {
            base: self.base.open_channel()?,
            info: self.info.clone(),
            shared: self.shared.clone(),
            held: Vec::with_capacity(64),
            failed: Vec::with_capacity(64),
            corrupt_reads: Vec::with_capacity(64),
            bounce_writes: Vec::with_capacity(8),
            spare_bounces: Vec::new(),
        }))
    }

    fn block_status(&self, offset: u64, len: u64, out: &mut Vec<BlockExtent>) -> Result<(), BdevError> {
        self.base.block_status(offset, len, out)
    }

    fn read_only(&self) -> bool {
        self.base.read_only()
    }
}

/// A read that takes a `corrupt_data` injection once the base has filled it.
struct CorruptRead {
    tag: u32,
    iov: Iovecs,
    offset: u64,
    value: u8,
}

/// The copy a corrupted write goes down from.
struct Bounce {
    tag: u32,
    data: BounceBuf,
}

struct ErrorChannel {
    base: Box<dyn IoChannel>,
    info: BdevInfo,
    shared: Arc<Shared>,
    /// Requests held by a `pending` injection, each with the value of `shared.resume` when it
    /// was held: a clear or resume releases the requests held before it, not those after.
    held: Vec<(u64, IoRequest)>,
    /// Completions of our own (`failure`, or a submission the base refused) for the next poll.
    failed: Vec<(u32, IoStatus)>,
    /// Reads in flight below whose data is corrupted when they complete.
    corrupt_reads: Vec<CorruptRead>,
    /// Corrupted writes in flight below, from copies of their data: the caller's buffer is
    /// never changed (as in SPDK). Returned to `spare_bounces` at completion and reused, so
    /// a run of corrupted writes allocates only while the runs grow (or a write is longer).
    bounce_writes: Vec<Bounce>,
    spare_bounces: Vec<Bounce>,
}

/// Xors the byte at `offset` of the data `iov` describes with `value`; nothing when the data
/// is shorter.
fn corrupt(iov: &Iovecs, offset: u64, value: u8) {
    let mut byte = [0u8];
    if iov::copy_to_slice(iov, offset, &mut byte) == 1 {
        iov::copy_from_slice(iov, offset, &[byte[0] ^ value]);
    }
}

fn submit_error_status(e: SubmitError) -> IoStatus {
    if e == SubmitError::Unsupported {
        IoStatus::Unsupported
    } else {
        IoStatus::Error(libc::EINVAL)
    }
}

impl ErrorChannel {
    /// Passes held requests down (a clear or resume), or fails them (a delete).
    fn release_held(&mut self) {
        if self.shared.deleted.load(Ordering::Acquire) != 0 {
            for (_, req) in self.held.drain(..) {
                self.failed.push((req.tag, IoStatus::Error(libc::ENXIO)));
            }
            return;
        }
        let resume = self.shared.resume.load(Ordering::Acquire);
        while let Some(&(held_at, req)) = self.held.first() {
            if held_at >= resume {
                return;
            }
            match self.base.submit(&req) {
                Ok(()) => {}
                Err(SubmitError::Busy) => return, // the rest at the next poll
                Err(e) => self.failed.push((req.tag, submit_error_status(e))),
            }
            self.held.remove(0);
        }
    }
}

impl IoChannel for ErrorChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        let has_data = matches!(req.op, IoOp::Read | IoOp::Write);
        // As SPDK counts: the requests this channel has passed down and not seen complete.
        let depth = self.base.in_flight() as u64;
        let slot = &self.shared.slots[kind_index(req.op)];
        let Some(t) = slot.take(depth, has_data) else {
            return self.base.submit(req);
        };
        match t.error_type {
            ErrorType::Failure => {
                self.failed.push((req.tag, IoStatus::Error(libc::EIO)));
                Ok(())
            }
            ErrorType::Pending => {
                self.held.push((self.shared.resume.load(Ordering::Acquire), *req));
                Ok(())
            }
            ErrorType::Nomem => Err(SubmitError::Busy),
            ErrorType::CorruptData if req.op == IoOp::Write => {
                let len = req.iov.total_len() as usize;
                let mut b = match self.spare_bounces.pop() {
                    Some(b) if b.data.len() >= len => b,
                    _ => Bounce { tag: 0, data: BounceBuf::zeroed(len) },
                };
                b.tag = req.tag;
                iov::copy_to_slice(&req.iov, 0, &mut b.data.bytes_mut()[..len]);
                let copy_iov = b.data.iovecs(len);
                corrupt(&copy_iov, t.corrupt_offset, t.corrupt_value);
                let copy = IoRequest { iov: copy_iov, ..*req };
                match self.base.submit(&copy) {
                    Ok(()) => {
                        self.bounce_writes.push(b);
                        Ok(())
                    }
                    Err(e) => {
                        self.spare_bounces.push(b);
                        if e == SubmitError::Busy {
                            slot.give_back(&t);
                        }
                        Err(e)
                    }
                }
            }
            ErrorType::CorruptData => {
                if let Err(e) = self.base.submit(req) {
                    // Not taken: the retry is the request to corrupt.
                    if e == SubmitError::Busy {
                        slot.give_back(&t);
                    }
                    return Err(e);
                }
                self.corrupt_reads.push(CorruptRead {
                    tag: req.tag,
                    iov: req.iov,
                    offset: t.corrupt_offset,
                    value: t.corrupt_value,
                });
                Ok(())
            }
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        if !self.held.is_empty() {
            self.release_held();
        }
        let mut n = self.failed.len();
        for (tag, status) in self.failed.drain(..) {
            done(tag, status);
        }
        if self.corrupt_reads.is_empty() && self.bounce_writes.is_empty() {
            return n + self.base.poll(done);
        }
        let reads = &mut self.corrupt_reads;
        let (bounces, spare) = (&mut self.bounce_writes, &mut self.spare_bounces);
        n += self.base.poll(&mut |tag, status| {
            if let Some(i) = bounces.iter().position(|b| b.tag == tag) {
                spare.push(bounces.swap_remove(i));
            }
            if let Some(i) = reads.iter().position(|r| r.tag == tag) {
                let r = reads.swap_remove(i);
                if status == IoStatus::Success {
                    // The read is still ours: its completion goes up only below.
                    corrupt(&r.iov, r.offset, r.value);
                }
            }
            done(tag, status)
        });
        n
    }

    fn in_flight(&self) -> usize {
        self.held.len() + self.failed.len() + self.base.in_flight()
    }

    fn parked(&self) -> usize {
        self.base.parked()
    }

    fn abort_parked(&mut self) -> usize {
        self.base.abort_parked()
    }

    /// The base's. Held requests are released by a clear or resume on the control plane,
    /// which signals nothing: a caller sleeping on the fd wakes only for the base, so
    /// `sleeps_in_flight` is false while any is held and the caller keeps polling.
    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        self.base.completion_fd()
    }

    fn disarm_completion_fd(&mut self) {
        self.base.disarm_completion_fd()
    }

    fn arm_completion_fd(&mut self) -> bool {
        self.failed.is_empty() && self.base.arm_completion_fd()
    }

    fn sleeps_in_flight(&self) -> bool {
        self.held.is_empty() && self.base.sleeps_in_flight()
    }
}

#[cfg(test)]
mod tests;
