//! raid1's channel: writes (and discards, write-zeroes, flushes) go to every slot that takes
//! writes, with the same iovecs; a read goes to the Active slot with the fewest reads in
//! flight, and is retried on another when it fails.
//!
//! Write order (docs/raid.md, "Write-intent bitmap"): the write registers in the intent map
//! first, then loads the layout; if its chunks' bits are not durable yet it waits in a list
//! until the owner has written them. A base that fails a write is reported to the owner, and
//! the write's completion is held until the published layout no longer has that base taking
//! writes: the owner publishes that only once the superblocks say so, so a write acknowledged
//! is on every base a restart would trust.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fp_bdev::{BdevInfo, IoChannel, IoOp, IoRequest, IoStatus, Iovecs, SubmitError};

use super::bases::Bases;
use super::slab::Slab;
use super::{admit, Admit, MAX_PARENTS};
use crate::format::MAX_SLOTS;
use crate::intent::WriteTicket;
use crate::shared::{Failure, RaidShared};

/// Where a parent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its bits are not durable yet: in `waiting`.
    Waiting,
    /// Submitted (some bases may still be busy: then in `pending`).
    Running,
    /// Every base answered, one failed, and the layout still has it taking writes: in `held`.
    Held,
}

struct Parent {
    tag: u32,
    op: IoOp,
    offset: u64,
    len: u64,
    iov: Iovecs,
    ticket: Option<WriteTicket>,
    phase: Phase,
    /// Slots still to submit to (a base was busy), in flight, answered well, failed, and
    /// failed and told to the owner.
    to_submit: u32,
    outstanding: u32,
    ok: u32,
    failed: u32,
    reported: u32,
    /// A base does not support the operation.
    unsupported: bool,
    /// On the `pending` list.
    queued: bool,
}

impl Default for Parent {
    fn default() -> Parent {
        Parent {
            tag: 0,
            op: IoOp::Read,
            offset: 0,
            len: 0,
            iov: Iovecs::NONE,
            ticket: None,
            phase: Phase::Running,
            to_submit: 0,
            outstanding: 0,
            ok: 0,
            failed: 0,
            reported: 0,
            unsupported: false,
            queued: false,
        }
    }
}

/// A raid1 bdev's channel.
pub struct Raid1Channel {
    info: BdevInfo,
    bases: Bases,
    parents: Slab<Parent>,
    waiting: Vec<u32>,
    pending: Vec<u32>,
    held: Vec<u32>,
    /// The list `pending` or `held` is swapped with while it is walked.
    spare: Vec<u32>,
    done: Vec<(u32, IoStatus)>,
    reaped: Vec<(u32, IoStatus)>,
    /// Reads in flight per slot: a read goes to the Active slot with the fewest (SPDK's
    /// raid1 does the same), the lowest on a tie, so a lightly loaded raid reads from one
    /// replica (warm caches) and a busy one spreads over all.
    reads_out: [u32; MAX_SLOTS],
}

fn bit(slot: usize) -> u32 {
    1 << slot
}

/// The slots of a mask, lowest first (one step per slot in it, not per possible slot).
fn slots_of(mut m: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let s = m.trailing_zeros() as usize;
            m &= m - 1;
            s
        })
    })
}

impl Raid1Channel {
    /// A channel of the raid1 `shared`.
    pub fn new(shared: Arc<RaidShared>) -> Raid1Channel {
        Raid1Channel {
            info: shared.info.clone(),
            bases: Bases::new(shared),
            parents: Slab::new(MAX_PARENTS),
            waiting: Vec::with_capacity(MAX_PARENTS),
            pending: Vec::with_capacity(MAX_PARENTS),
            held: Vec::with_capacity(MAX_PARENTS),
            spare: Vec::with_capacity(MAX_PARENTS),
            done: Vec::with_capacity(2 * MAX_PARENTS),
            reaped: Vec::with_capacity(MAX_PARENTS),
            reads_out: [0; MAX_SLOTS],
        }
    }

    /// Starts a write-like parent whose bits are durable: every slot taking writes.
    fn start_write(&mut self, p: u32) {
        self.bases.refresh();
        let op = self.parents.get_mut(p).op;
        let masks = &self.bases.masks;
        let targets = if op == IoOp::Flush { masks.flushable } else { masks.writing };
        let parent = self.parents.get_mut(p);
        parent.phase = Phase::Running;
        // No target at all (no slot takes writes) ends in finish_write with EIO, or, for a
        // flush with no base that has a cache to flush, success.
        parent.to_submit = targets;
        self.submit_targets(p);
    }

    /// Submits parent `p` to the slots left in `to_submit`. A slot that stopped taking writes
    /// since (its base removed, or taken out, while this waited for it to be less busy) is
    /// dropped: the write does not need it, and it is no failure of the base.
    fn submit_targets(&mut self, p: u32) {
        let data_offset = self.bases.layout.data_offset;
        let masks = self.bases.masks;
        let parent = self.parents.get_mut(p);
        parent.to_submit &= if parent.op == IoOp::Flush { masks.flushable } else { masks.writing };
        let req = IoRequest {
            tag: p,
            op: parent.op,
            offset: data_offset + parent.offset,
            len: parent.len,
            iov: parent.iov,
        };
        let req = if req.op == IoOp::Flush { IoRequest { offset: 0, ..req } } else { req };
        for slot in slots_of(parent.to_submit) {
            let r = self.bases.submit(slot, &req);
            let parent = self.parents.get_mut(p);
            match r {
                Ok(()) => {
                    parent.to_submit &= !bit(slot);
                    parent.outstanding |= bit(slot);
                }
                Err(SubmitError::Busy) => {}
                Err(SubmitError::Unsupported) => {
                    parent.to_submit &= !bit(slot);
                    parent.unsupported = true;
                }
                Err(SubmitError::OutOfRange) => {
                    parent.to_submit &= !bit(slot);
                    self.base_failed(p, slot, libc::EIO);
                }
            }
        }
        let parent = self.parents.get_mut(p);
        if parent.to_submit != 0 {
            if !parent.queued {
                parent.queued = true;
                self.pending.push(p);
            }
        } else if parent.outstanding == 0 {
            self.finish_write(p);
        }
    }

    /// Slot `slot` failed parent `p` with `errno`: tell the owner (again later if its queue is
    /// full).
    fn base_failed(&mut self, p: u32, slot: usize, errno: i32) {
        let parent = self.parents.get_mut(p);
        parent.failed |= bit(slot);
        if self.bases.shared.failures.push(Failure { slot, errno }).is_ok() {
            self.parents.get_mut(p).reported |= bit(slot);
        }
        self.bases.shared.wake_owner();
    }

    /// Every base answered parent `p` (a write, flush, discard or write-zeroes): completes it,
    /// or holds it while a failed base still takes writes in the published layout.
    fn finish_write(&mut self, p: u32) {
        let parent = self.parents.get_mut(p);
        let unreported = parent.failed & !parent.reported;
        for slot in slots_of(unreported) {
            if self.bases.shared.failures.push(Failure { slot, errno: libc::EIO }).is_ok() {
                self.parents.get_mut(p).reported |= bit(slot);
            }
        }
        if unreported != 0 {
            self.bases.shared.wake_owner();
        }
        let masks = self.bases.masks;
        let parent = self.parents.get_mut(p);
        if parent.failed & masks.writing != 0 || parent.failed & !parent.reported != 0 {
            if parent.phase != Phase::Held {
                parent.phase = Phase::Held;
                self.held.push(p);
            }
            return;
        }
        let active = masks.active;
        let status = if parent.op == IoOp::Flush && parent.failed == 0 {
            IoStatus::Success
        } else if parent.unsupported && parent.failed == 0 && parent.ok == 0 {
            IoStatus::Unsupported
        } else if parent.ok & active != 0 {
            IoStatus::Success
        } else {
            IoStatus::Error(libc::EIO)
        };
        let degraded = masks.degraded;
        let (tag, len, ticket, op) = (parent.tag, parent.len, parent.ticket, parent.op);
        if let (Some(t), Some(intent)) = (ticket, self.bases.shared.intent.as_ref()) {
            intent.end_write(&t);
        }
        if degraded && status == IoStatus::Success && op != IoOp::Flush {
            self.bases.shared.counters.degraded_bytes_written.fetch_add(len, Ordering::Relaxed);
        }
        self.done.push((tag, status));
        self.parents.remove(p);
    }

    /// Sends read `p` to an Active slot it has not tried; EIO when none is left.
    fn submit_read(&mut self, p: u32) {
        self.bases.refresh();
        loop {
            let mut candidates = self.bases.masks.active;
            if self.bases.shared.process.kind.load(Ordering::Relaxed) == 3 {
                // Resync after an unclean stop: only the lowest Active slot is the truth.
                candidates &= candidates.wrapping_neg();
            }
            let parent = self.parents.get_mut(p);
            candidates &= !parent.failed;
            if candidates == 0 {
                let tag = parent.tag;
                self.done.push((tag, IoStatus::Error(libc::EIO)));
                self.parents.remove(p);
                return;
            }
            let slot = slots_of(candidates).min_by_key(|&s| self.reads_out[s]).unwrap_or(0);
            let req = IoRequest {
                tag: p,
                op: IoOp::Read,
                offset: self.bases.layout.data_offset + parent.offset,
                len: parent.len,
                iov: parent.iov,
            };
            let r = self.bases.submit(slot, &req);
            let parent = self.parents.get_mut(p);
            match r {
                Ok(()) => {
                    parent.outstanding = bit(slot);
                    self.reads_out[slot] += 1;
                    return;
                }
                Err(SubmitError::Busy) => {
                    if !parent.queued {
                        parent.queued = true;
                        self.pending.push(p);
                    }
                    return;
                }
                Err(SubmitError::Unsupported) => {
                    let tag = parent.tag;
                    self.done.push((tag, IoStatus::Unsupported));
                    self.parents.remove(p);
                    return;
                }
                Err(SubmitError::OutOfRange) => self.base_failed(p, slot, libc::EIO),
            }
        }
    }

    /// A base's answer for parent `p` from `slot`.
    fn complete(&mut self, slot: usize, p: u32, status: IoStatus) {
        let parent = self.parents.get_mut(p);
        parent.outstanding &= !bit(slot);
        if parent.op == IoOp::Read {
            self.reads_out[slot] -= 1;
            match status {
                IoStatus::Success | IoStatus::Unsupported => {
                    let tag = parent.tag;
                    self.done.push((tag, status));
                    self.parents.remove(p);
                }
                IoStatus::Error(e) => {
                    self.base_failed(p, slot, e);
                    self.submit_read(p);
                }
            }
            return;
        }
        match status {
            IoStatus::Success => parent.ok |= bit(slot),
            IoStatus::Unsupported => parent.unsupported = true,
            IoStatus::Error(e) => self.base_failed(p, slot, e),
        }
        let parent = self.parents.get_mut(p);
        if parent.outstanding == 0 && parent.to_submit == 0 {
            self.finish_write(p);
        }
    }
}

impl IoChannel for Raid1Channel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        let admit = admit(&self.info, req)?;
        // Before anything looks at the layout; a request refused above leaves the channel
        // as it was (idle, when it had nothing in flight).
        self.bases.enter();
        self.bases.count_bytes(req.len);
        if self.done.len() == self.done.capacity() {
            return Err(SubmitError::Busy);
        }
        if let Admit::Done(status) = admit {
            self.done.push((req.tag, status));
            return Ok(());
        }
        let rw = matches!(req.op, IoOp::Read | IoOp::Write);
        let parent = Parent {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            len: req.len,
            iov: if rw { req.iov } else { Iovecs::NONE },
            ..Parent::default()
        };
        let p = self.parents.insert(parent).ok_or(SubmitError::Busy)?;
        match req.op {
            IoOp::Read => self.submit_read(p),
            IoOp::Flush => self.start_write(p),
            IoOp::Write | IoOp::Discard | IoOp::WriteZeroes => {
                // Register first, then (in start_write) load the layout: see intent.rs.
                let ticket = self.bases.shared.intent.as_ref().map(|i| i.begin_write(req.offset, req.len));
                let parent = self.parents.get_mut(p);
                parent.ticket = ticket;
                let wait = match (ticket, self.bases.shared.intent.as_ref()) {
                    (Some(t), Some(i)) => t.wait_seq != 0 && !i.is_durable(&t),
                    _ => false,
                };
                if wait {
                    parent.phase = Phase::Waiting;
                    if self.waiting.is_empty() {
                        self.bases.shared.wake_owner();
                    }
                    self.waiting.push(p);
                } else {
                    self.start_write(p);
                }
            }
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.bases.refresh();
        let mut reaped = std::mem::take(&mut self.reaped);
        for slot in 0..self.bases.slots() {
            reaped.clear();
            self.bases.poll_slot(slot, &mut reaped);
            for &(p, status) in reaped.iter() {
                self.complete(slot, p, status);
            }
        }
        let mut retired = Vec::new();
        self.bases.poll_retired(&mut reaped, &mut |slot, p, status| retired.push((slot, p, status)));
        for (slot, p, status) in retired {
            self.complete(slot, p, status);
        }
        reaped.clear();
        self.reaped = reaped;
        if !self.waiting.is_empty() {
            let shared = self.bases.shared.clone();
            let intent = shared.intent.as_ref();
            let mut i = 0;
            let mut woke = false;
            while i < self.waiting.len() {
                let p = self.waiting[i];
                let durable = match (self.parents.get_mut(p).ticket, intent) {
                    (Some(t), Some(m)) => m.is_durable(&t),
                    _ => true,
                };
                if durable {
                    self.waiting.swap_remove(i);
                    self.start_write(p);
                } else {
                    if !woke {
                        shared.wake_owner();
                        woke = true;
                    }
                    i += 1;
                }
            }
        }
        // Each list is walked from the spare one it is swapped with (both sized for every
        // parent): parents queued again meanwhile go to the fresh list, with no allocation.
        if !self.pending.is_empty() {
            std::mem::swap(&mut self.pending, &mut self.spare);
            for i in 0..self.spare.len() {
                let p = self.spare[i];
                let parent = self.parents.get_mut(p);
                parent.queued = false;
                if parent.op == IoOp::Read {
                    self.submit_read(p);
                } else {
                    self.submit_targets(p);
                }
            }
            self.spare.clear();
        }
        if !self.held.is_empty() {
            std::mem::swap(&mut self.held, &mut self.spare);
            for i in 0..self.spare.len() {
                let p = self.spare[i];
                self.parents.get_mut(p).phase = Phase::Running;
                self.finish_write(p);
            }
            self.spare.clear();
        }
        self.bases.hand_up(&mut self.done, done, self.parents.used())
    }

    fn in_flight(&self) -> usize {
        self.parents.used() + self.done.len()
    }

    /// Parents waiting for a busy base that no base has taken yet: a read, or a write none
    /// of whose copies was submitted. A write already on some base and waiting for a busy
    /// other is not counted: given up, it would leave the copies different under a clean
    /// intent bit, so it waits for the base (or for its removal). Requests the bases park
    /// below themselves are not counted either: given up, they would come back as a base's
    /// error, which takes the base out of the raid.
    fn parked(&self) -> usize {
        self.pending.iter().filter(|&&p| untouched(self.parents.get(p))).count()
    }

    /// Completes what [`Raid1Channel::parked`] counts with `ECANCELED` at the next poll; a
    /// write gives its intent registration back (nothing of it was written).
    fn abort_parked(&mut self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.pending.len() {
            let p = self.pending[i];
            let parent = self.parents.get(p);
            if !untouched(parent) {
                i += 1;
                continue;
            }
            self.pending.swap_remove(i);
            let (tag, ticket) = (parent.tag, parent.ticket);
            if let (Some(t), Some(intent)) = (ticket, self.bases.shared.intent.as_ref()) {
                intent.end_write(&t);
            }
            self.done.push((tag, IoStatus::Error(libc::ECANCELED)));
            self.parents.remove(p);
            n += 1;
        }
        n
    }
}

/// A parent on the pending list that no base holds and none wrote: a read (at most failed
/// elsewhere before), or a write with every target still to submit.
fn untouched(parent: &Parent) -> bool {
    parent.outstanding == 0
        && (parent.op == IoOp::Read || (parent.ok == 0 && parent.failed == 0 && !parent.unsupported))
}
