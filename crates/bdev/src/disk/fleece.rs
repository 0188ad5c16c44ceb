//! The disk layer's side of a fleece (`crate::fleece`): the base's channels copy before they
//! write, where QEMU inserts a copy-before-write filter above the source.
//!
//! * Attach and detach bump the disk's mirror epoch (one epoch for every job that hooks the
//!   channels, so a channel still pays one load per poll) under the book's lock. A channel that
//!   sees the change attaches here and acknowledges once what it had in flight before has
//!   completed: a write submitted before the point in time never lands after it. The creating
//!   call returns once every live channel acknowledged (the registry wakes idle reactors).
//! * Attached: a write, write-zeroes or discard whose chunks are all copied (and read by no
//!   point-in-time read of the base) goes down at once. Otherwise it is held in the channel
//!   (in submission order, a copy of the request: its caller's guarantees hold until its
//!   completion), and this channel starts copies of the chunks nobody copies yet: read from
//!   the base's device (below its disk), write to the target, mark copied. Each poll looks at
//!   the held writes again and sends down those whose chunks all allow it.
//! * A copy failure, or a write held past [`HOLD_BOUND`], breaks the snapshot; held writes
//!   then go down (break-snapshot: the guest never pays for a backup).
//! * Detached: held writes go down; the channel keeps its copy channels until its copies are
//!   done (nothing writes the target after the delete returns), then acknowledges.
//!
//! With no fleece this file costs the layer nothing beyond the mirror's hook: the shared
//! epoch's load per poll, one branch on the channel's own `hooked` per submit (the branch that
//! tested for a mirror before), and two on its `fleece` per poll (6 instructions a poll under
//! callgrind, none a submit; docs/backup.md).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::channel_state::{ChannelFleece, Completion, DiskChannel, FleeceCopy, Held, InFlight, Phase};
use super::mirror::entry_mut;
use super::shared::Disk;
use super::stats::{errno_slot, op_index, ChannelSlot};
use crate::fleece::{FleeceShared, WriterStep, HOLD_BOUND};
use crate::iov::BounceBuf;
use crate::{BlockDevice, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

/// Copies one channel runs at once.
const MAX_COPIES: usize = 8;

/// `InFlight::gen` of a request submitted with a fleece attached.
pub(super) const WATCHED: u8 = 0xfe;

/// Why a fleece cannot attach.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleeceAttachError {
    /// The disk layer is off (its channels are the device's own).
    #[error("'{0}' counts no I/O (serve --no-iostat): the disk layer that copies before writes is off")]
    AccountingOff(String),
    /// The disk has a fleece already.
    #[error("'{bdev}' already has a fleece, '{fleece}' (one at a time per disk)")]
    HasFleece {
        /// The base.
        bdev: String,
        /// Its fleece.
        fleece: String,
    },
    /// The disk is a mirror job's source: both would hook its writes.
    #[error("'{bdev}' is the source of mirror job '{job}'")]
    Mirrored {
        /// The base.
        bdev: String,
        /// The job.
        job: String,
    },
}

impl Disk {
    /// Attaches `fleece`; returns the epoch channels must acknowledge (`Disk::mirror_acked`).
    pub fn attach_fleece(&self, fleece: &Arc<FleeceShared>) -> Result<u64, FleeceAttachError> {
        let mut book = self.book();
        let bdev = self.info().name.clone();
        if !self.0.accounting {
            return Err(FleeceAttachError::AccountingOff(bdev));
        }
        if let Some(f) = &book.fleece {
            return Err(FleeceAttachError::HasFleece { bdev, fleece: f.name.clone() });
        }
        if let Some(m) = &book.mirror {
            return Err(FleeceAttachError::Mirrored { bdev, job: m.job_id.clone() });
        }
        book.fleece = Some(fleece.clone());
        Ok(self.0.mirror_epoch.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Detaches `fleece` (if it is the one attached); returns the epoch to acknowledge.
    pub fn detach_fleece(&self, fleece: &Arc<FleeceShared>) -> u64 {
        let mut book = self.book();
        if book.fleece.as_ref().is_some_and(|f| Arc::ptr_eq(f, fleece)) {
            book.fleece = None;
        }
        self.0.mirror_epoch.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether every live channel took up the fleece change of `epoch` (attach: it copies
    /// before it writes and what it had in flight from before is done; detach: its copies are
    /// done and it no longer holds writes).
    pub fn fleece_acked(&self, epoch: u64) -> bool {
        self.mirror_acked(epoch)
    }

    /// The name of the fleece of this disk, if any.
    pub fn fleece_name(&self) -> Option<String> {
        self.book().fleece.as_ref().map(|f| f.name.clone())
    }
}

/// Whether the operation changes data (write, write-zeroes, discard).
fn changes_data(op: IoOp) -> bool {
    matches!(op, IoOp::Write | IoOp::WriteZeroes | IoOp::Discard)
}

impl ChannelFleece {
    /// Attaches to `fleece` with `unwatched` requests in flight from before.
    pub(super) fn new(fleece: Arc<FleeceShared>, unwatched: u64) -> Result<ChannelFleece, String> {
        let base = fleece.base.open_channel().map_err(|e| format!("cannot open the base: {e}"))?;
        let target = fleece
            .target
            .open_channel()
            .map_err(|e| format!("cannot open target '{}': {e}", fleece.target_name))?;
        Ok(ChannelFleece {
            fleece,
            base,
            target,
            held: VecDeque::new(),
            copies: (0..MAX_COPIES)
                .map(|_| FleeceCopy { chunk: u64::MAX, phase: Phase::Free, buf: None })
                .collect(),
            active: 0,
            draining: false,
            unwatched,
        })
    }

    /// [`ChannelFleece::new`], boxed; a channel that cannot be opened breaks the snapshot (the
    /// guest's channel goes on without it).
    pub(super) fn open(fleece: Arc<FleeceShared>, unwatched: u64) -> Option<Box<ChannelFleece>> {
        match ChannelFleece::new(fleece.clone(), unwatched) {
            Ok(f) => Some(Box::new(f)),
            Err(why) => {
                fleece.break_snapshot(why);
                None
            }
        }
    }

    /// Nothing held, nothing copying.
    pub(super) fn idle(&self) -> bool {
        self.held.is_empty() && self.active == 0
    }

    pub(super) fn held(&self) -> usize {
        self.held.len()
    }

    /// Whether `req` may go down now (not a write, or every chunk copied and unread).
    fn passes(&self, req: &IoRequest) -> bool {
        if !changes_data(req.op) || self.draining || self.fleece.broken() {
            return true;
        }
        let f = &self.fleece;
        let end = req.offset.saturating_add(req.len).min(f.len);
        if req.offset >= end {
            // Past the point in time's end (a grown base): nothing of the view is changed.
            return true;
        }
        f.map.chunks(req.offset, end - req.offset).all(|c| f.map.writer_step(c) == WriterStep::Go)
    }

    /// Starts copies of the chunks of held write `i` that nobody copies; true when every chunk
    /// allows the write now.
    fn ready(&mut self, req: &IoRequest) -> bool {
        if self.draining || self.fleece.broken() {
            return true;
        }
        let f = self.fleece.clone();
        let end = req.offset.saturating_add(req.len).min(f.len);
        if req.offset >= end {
            return true;
        }
        let mut all = true;
        for c in f.map.chunks(req.offset, end - req.offset) {
            match f.map.writer_step(c) {
                WriterStep::Go => {}
                WriterStep::Wait => all = false,
                WriterStep::Copy => {
                    all = false;
                    if let Some(slot) = self.copies.iter().position(|s| s.phase == Phase::Free) {
                        if f.map.try_start_copy(c) {
                            let (_, len) = f.chunk_range(c);
                            let copy = &mut self.copies[slot];
                            copy.chunk = c;
                            copy.phase = Phase::ReadQueued;
                            // One buffer per slot, made at its first copy and reused.
                            if copy.buf.as_ref().is_none_or(|b| b.len() < len as usize) {
                                copy.buf = Some(BounceBuf::zeroed(f.granularity as usize));
                            }
                            self.active += 1;
                        }
                    }
                }
            }
        }
        all
    }

    /// Reaps and sends the copies' I/O.
    fn step_copies(&mut self) {
        let Self { base, target, copies, fleece, active, .. } = self;
        base.poll(&mut |tag, status| {
            let Some(c) = copies.get_mut(tag as usize) else { return };
            if c.phase != Phase::Reading {
                return;
            }
            if status == IoStatus::Success {
                c.phase = Phase::WriteQueued;
            } else {
                let why = format!("reading chunk {} of '{}': {status:?}", c.chunk, fleece.base_name);
                end_copy(fleece, c, active, Some(why));
            }
        });
        target.poll(&mut |tag, status| {
            let Some(c) = copies.get_mut(tag as usize) else { return };
            if c.phase != Phase::Writing {
                return;
            }
            let failed = (status != IoStatus::Success)
                .then(|| format!("writing chunk {} to target '{}': {status:?}", c.chunk, fleece.target_name));
            end_copy(fleece, c, active, failed);
        });
        for (i, c) in copies.iter_mut().enumerate() {
            let (dev, next, op) = match c.phase {
                Phase::ReadQueued => (&mut *base, Phase::Reading, IoOp::Read),
                Phase::WriteQueued => (&mut *target, Phase::Writing, IoOp::Write),
                _ => continue,
            };
            let (offset, len) = fleece.chunk_range(c.chunk);
            let Some(buf) = c.buf.as_mut() else { continue };
            let req = IoRequest { tag: i as u32, op, offset, len, iov: buf.iovecs(len as usize) };
            match dev.submit(&req) {
                Ok(()) => c.phase = next,
                Err(SubmitError::Busy) => {}
                Err(e) => {
                    let why = format!("copying chunk {}: {e}", c.chunk);
                    end_copy(fleece, c, active, Some(why));
                }
            }
        }
    }
}

/// Ends copy `c`: done, or failed (`failed` says why: the snapshot breaks). Its chunk is marked
/// copied either way, so that no write waits for it any more.
fn end_copy(fleece: &FleeceShared, c: &mut FleeceCopy, active: &mut usize, failed: Option<String>) {
    match failed {
        None => {
            fleece.copied.fetch_add(1, Ordering::Relaxed);
        }
        Some(why) => fleece.break_snapshot(why),
    }
    fleece.map.finish_copy(c.chunk);
    c.phase = Phase::Free;
    *active -= 1;
}

impl DiskChannel {
    /// Submits with a fleece or a mirror attached. `Ok(false)`: the fleece holds the write
    /// (it goes down, and counts as in flight, at a poll).
    #[cold]
    #[inline(never)]
    pub(super) fn submit_hooked(&mut self, req: &IoRequest) -> Result<bool, SubmitError> {
        if let Some(f) = self.fleece.as_mut() {
            if let Some(e) = entry_mut(&mut self.slab, &mut self.sparse, req.tag) {
                e.gen = WATCHED;
            }
            if !f.passes(req) {
                f.held.push_back(Held { req: *req, since: Instant::now() });
                // Its copies start now; the write goes down at a poll once they are done.
                let req = *req;
                f.ready(&req);
                f.step_copies();
                return Ok(false);
            }
            return self.inner.submit(req).map(|()| true);
        }
        self.submit_mirrored(req).map(|()| true)
    }

    /// A request QoS released, with a fleece attached: held (`Ok(false)`) or sent down as at
    /// submit.
    pub(super) fn fleece_submit(
        inner: &mut dyn IoChannel,
        f: &mut ChannelFleece,
        req: &IoRequest,
    ) -> Result<bool, SubmitError> {
        if f.passes(req) {
            return inner.submit(req).map(|()| true);
        }
        f.held.push_back(Held { req: *req, since: Instant::now() });
        Ok(false)
    }

    /// The fleece's part of a poll: copies, then the held writes whose chunks allow them.
    /// Returns how many completed here (refused by the device).
    #[cold]
    #[inline(never)]
    pub(super) fn poll_fleece(&mut self, done: &mut impl Completion) -> usize {
        let Self { fleece, inner, in_flight, slot, .. } = self;
        let Some(f) = fleece.as_mut() else { return 0 };
        f.step_copies();
        let mut failed = 0;
        let now = Instant::now();
        let mut i = 0;
        while i < f.held.len() {
            let Held { req, since } = f.held[i];
            if !f.ready(&req) {
                if now.duration_since(since) < HOLD_BOUND {
                    i += 1;
                    continue;
                }
                f.fleece.break_snapshot(format!(
                    "a write at {} waited {} s for its chunks' copies",
                    req.offset,
                    HOLD_BOUND.as_secs()
                ));
            }
            match inner.submit(&req) {
                Ok(()) => {
                    *in_flight += 1;
                    f.held.remove(i);
                }
                Err(SubmitError::Busy) => i += 1,
                Err(e) => {
                    f.held.remove(i);
                    let status = match e {
                        SubmitError::Unsupported => {
                            slot.failure(op_index(req.op), 0);
                            IoStatus::Unsupported
                        }
                        _ => {
                            slot.failure(op_index(req.op), errno_slot(libc::EINVAL));
                            IoStatus::Error(libc::EINVAL)
                        }
                    };
                    done.complete(req.tag, status);
                    failed += 1;
                }
            }
        }
        // Copies whose reads just finished go to the target now rather than at the next poll.
        f.step_copies();
        let over = f.draining && f.idle();
        if over {
            self.fleece = None;
            self.hooked = self.mirror.is_some();
            self.slot.mirror_ack.store(self.mirror_epoch, Ordering::Release);
        }
        failed
    }

    /// Applies the disk's fleece: attach, or start letting go. Returns whether the channel may
    /// acknowledge the epoch now.
    pub(super) fn refresh_fleece(&mut self, want: Option<Arc<FleeceShared>>) -> bool {
        if let Some(f) = self.fleece.as_mut() {
            if !want.as_ref().is_some_and(|w| Arc::ptr_eq(w, &f.fleece)) {
                f.draining = true;
                if !f.idle() {
                    // Let go at a poll once its copies and held writes are done.
                    return false;
                }
                self.fleece = None;
            } else {
                return f.unwatched == 0;
            }
        }
        let Some(want) = want else { return true };
        // A channel that cannot keep the snapshot breaks it: the guest goes on unharmed.
        self.fleece = ChannelFleece::open(want, self.in_flight);
        self.fleece.as_ref().is_none_or(|f| f.unwatched == 0)
    }
}

/// Counts the completions of `batch` submitted before fleece `f` attached; acknowledges the
/// attachment (`epoch`) in `slot` when the last is done (out of line: only while some are left).
#[cold]
#[inline(never)]
pub(super) fn count_unwatched(
    f: &mut ChannelFleece,
    batch: &[(u32, IoStatus)],
    slab: &[InFlight],
    sparse: &[(u32, InFlight)],
    slot: &ChannelSlot,
    epoch: u64,
) {
    for &(tag, _) in batch {
        let gen = match slab.get(tag as usize) {
            Some(e) => e.gen,
            None => sparse.iter().find(|s| s.0 == tag).map_or(WATCHED, |s| s.1.gen),
        };
        if gen != WATCHED {
            f.unwatched = f.unwatched.saturating_sub(1);
        }
    }
    if f.unwatched == 0 {
        slot.mirror_ack.store(epoch, Ordering::Release);
    }
}
