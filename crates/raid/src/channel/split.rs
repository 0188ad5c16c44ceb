//! The channel of raid0 and concat: a request is cut at strip (raid0) or base (concat)
//! boundaries into children, one per piece, each carrying a slice of the parent's iovecs
//! (zero copy: the slices point into the caller's buffers). The slices live in a per-parent
//! region of one pool made with the channel; a parent whose pieces need more room than its
//! region submits what fits and the rest once those children are back. Errors of the bases
//! pass up as they are: these levels have no redundancy.

use std::sync::Arc;

use fp_bdev::{BdevInfo, IoChannel, IoOp, IoRequest, IoStatus, IovCursor, IovSlices, Iovecs, SubmitError};

use super::bases::Bases;
use super::slab::Slab;
use super::{admit, Admit, MAX_PARENTS};
use crate::shared::RaidShared;

/// iovec slices one parent may have in flight at once.
pub const IOV_PER_PARENT: usize = 64;

/// Where a byte of the raid lives: which base, where in the base's data region, and how many
/// bytes from there on stay on that base contiguously.
pub trait SplitMap {
    /// `(slot, offset in the slot's data region, bytes before the next boundary)` for the
    /// raid offset `offset` (inside the raid).
    fn map(&self, offset: u64) -> (usize, u64, u64);
}

struct Parent {
    tag: u32,
    op: IoOp,
    /// The next byte (or, for a flush, base) to submit, and the end.
    next: u64,
    end: u64,
    iov: Iovecs,
    /// Where `next` is in the parent's iovecs.
    cursor: IovCursor,
    /// Slices of this parent's pool region in use by children in flight.
    scratch_used: u32,
    /// Children in flight.
    remaining: u32,
    status: IoStatus,
    /// On the pending list (something left to submit).
    queued: bool,
    /// Its last child was refused as busy by a base (not merely waiting for pool room).
    refused: bool,
}

impl Default for Parent {
    fn default() -> Parent {
        Parent {
            tag: 0,
            op: IoOp::Read,
            next: 0,
            end: 0,
            iov: Iovecs::NONE,
            cursor: IovCursor::START,
            scratch_used: 0,
            remaining: 0,
            status: IoStatus::Success,
            queued: false,
            refused: false,
        }
    }
}

/// The channel of a raid0 or concat bdev over `M`'s mapping.
pub struct SplitChannel<M> {
    info: BdevInfo,
    map: M,
    bases: Bases,
    parents: Slab<Parent>,
    /// Each parent's region: the slices its children carry.
    pool: Box<[IovSlices]>,
    /// Parents with children still to submit (a base was busy, or their pool region full).
    pending: Vec<u32>,
    /// Completions for the next poll.
    done: Vec<(u32, IoStatus)>,
    /// The bases' completions, reused every poll.
    reaped: Vec<(u32, IoStatus)>,
}

/// What submitting a parent's children came to.
enum Advance {
    /// Everything is submitted (or the parent failed and stops).
    Submitted,
    /// Something is left; try again after the next completions.
    Blocked,
}

impl<M: SplitMap> SplitChannel<M> {
    /// A channel of the raid `shared`, cutting requests with `map`.
    pub fn new(shared: Arc<RaidShared>, map: M) -> SplitChannel<M> {
        SplitChannel {
            info: shared.info.clone(),
            map,
            bases: Bases::new(shared),
            parents: Slab::new(MAX_PARENTS),
            pool: (0..MAX_PARENTS).map(|_| IovSlices::new(IOV_PER_PARENT)).collect(),
            pending: Vec::with_capacity(MAX_PARENTS),
            done: Vec::with_capacity(2 * MAX_PARENTS),
            reaped: Vec::with_capacity(MAX_PARENTS),
        }
    }

    /// Submits what it can of parent `p`'s children.
    fn advance(&mut self, p: u32) -> Advance {
        let data_offset = self.bases.layout.data_offset;
        loop {
            let parent = self.parents.get_mut(p);
            if parent.next >= parent.end {
                return Advance::Submitted;
            }
            let op = parent.op;
            // Where the child's slices start: a child a base refuses is made again from here.
            let cursor_before = parent.cursor;
            let (slot, child) = if op == IoOp::Flush {
                // A base without a volatile cache has nothing to flush.
                if self.bases.masks.flushable & (1 << parent.next) == 0 {
                    parent.next += 1;
                    continue;
                }
                let slot = parent.next as usize;
                (slot, IoRequest { tag: p, op, offset: 0, len: 0, iov: Iovecs::NONE })
            } else {
                let (slot, base_off, avail) = self.map.map(parent.next);
                let len = avail.min(parent.end - parent.next);
                let mut req =
                    IoRequest { tag: p, op, offset: data_offset + base_off, len, iov: Iovecs::NONE };
                if matches!(op, IoOp::Read | IoOp::Write) {
                    let start = parent.scratch_used as usize;
                    let mut cursor = parent.cursor;
                    let Some(iov) = self.pool[p as usize].slice(start, &parent.iov, &mut cursor, len) else {
                        if parent.remaining == 0 && start == 0 {
                            // One piece needs more slices than a whole region: never fits.
                            parent.status = IoStatus::Error(libc::EINVAL);
                            parent.next = parent.end;
                            return Advance::Submitted;
                        }
                        return Advance::Blocked;
                    };
                    req.iov = iov;
                    parent.cursor = cursor;
                    parent.scratch_used += iov.count();
                }
                (slot, req)
            };
            let Some(ch) = self.bases.channel(slot) else {
                return self.stop(p, IoStatus::Error(libc::EIO));
            };
            match ch.submit(&child) {
                Ok(()) => {
                    let parent = self.parents.get_mut(p);
                    parent.refused = false;
                    parent.remaining += 1;
                    parent.next += if op == IoOp::Flush { 1 } else { child.len };
                }
                Err(SubmitError::Busy) => {
                    // Give the slices back: the same child is made again next time.
                    let parent = self.parents.get_mut(p);
                    parent.refused = true;
                    if matches!(op, IoOp::Read | IoOp::Write) {
                        parent.scratch_used -= child.iov.count();
                        parent.cursor = cursor_before;
                    }
                    return Advance::Blocked;
                }
                Err(SubmitError::Unsupported) => return self.stop(p, IoStatus::Unsupported),
                Err(SubmitError::OutOfRange) => return self.stop(p, IoStatus::Error(libc::EIO)),
            }
        }
    }

    /// Stops submitting parent `p`'s children: it ends with `status` once those in flight are
    /// back.
    fn stop(&mut self, p: u32, status: IoStatus) -> Advance {
        let parent = self.parents.get_mut(p);
        if parent.status == IoStatus::Success {
            parent.status = status;
        }
        parent.next = parent.end;
        Advance::Submitted
    }

    /// Completes parent `p` upward when nothing of it is in flight or left.
    fn maybe_finish(&mut self, p: u32) {
        let parent = self.parents.get_mut(p);
        if parent.remaining == 0 && parent.next >= parent.end && !parent.queued {
            self.done.push((parent.tag, parent.status));
            self.parents.remove(p);
        }
    }

    fn queue(&mut self, p: u32) {
        let parent = self.parents.get_mut(p);
        if !parent.queued {
            parent.queued = true;
            self.pending.push(p);
        }
    }

    fn retry_pending(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = self.pending[i];
            if let Advance::Submitted = self.advance(p) {
                self.pending.swap_remove(i);
                self.parents.get_mut(p).queued = false;
                self.maybe_finish(p);
            } else {
                i += 1;
            }
        }
    }
}

impl<M: SplitMap> IoChannel for SplitChannel<M> {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        let admit = admit(&self.info, req)?;
        // Before anything looks at the layout; a request refused above leaves the channel
        // as it was (idle, when it had nothing in flight).
        self.bases.enter();
        self.bases.count_bytes(req.len);
        // One load: the layout of these levels changes only when the owner first publishes.
        self.bases.refresh();
        if self.done.len() == self.done.capacity() {
            return Err(SubmitError::Busy);
        }
        if let Admit::Done(status) = admit {
            self.done.push((req.tag, status));
            return Ok(());
        }
        let rw = matches!(req.op, IoOp::Read | IoOp::Write);
        let end =
            if req.op == IoOp::Flush { self.bases.layout.slots.len() as u64 } else { req.offset + req.len };
        let parent = Parent {
            tag: req.tag,
            op: req.op,
            next: if req.op == IoOp::Flush { 0 } else { req.offset },
            end,
            iov: if rw { req.iov } else { Iovecs::NONE },
            ..Parent::default()
        };
        let p = self.parents.insert(parent).ok_or(SubmitError::Busy)?;
        match self.advance(p) {
            Advance::Submitted => self.maybe_finish(p),
            Advance::Blocked => self.queue(p),
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let mut reaped = std::mem::take(&mut self.reaped);
        for slot in 0..self.bases.slots() {
            reaped.clear();
            self.bases.poll_slot(slot, &mut reaped);
            for &(p, status) in reaped.iter() {
                let parent = self.parents.get_mut(p);
                parent.remaining -= 1;
                if status != IoStatus::Success && parent.status == IoStatus::Success {
                    parent.status = status;
                }
                if parent.remaining == 0 {
                    // Every slice of its region is back: the rest may use all of it.
                    parent.scratch_used = 0;
                }
                self.maybe_finish(p);
            }
        }
        reaped.clear();
        self.reaped = reaped;
        if !self.pending.is_empty() {
            self.retry_pending();
        }
        self.bases.hand_up(&mut self.done, done, self.parents.used())
    }

    fn in_flight(&self) -> usize {
        self.parents.used() + self.done.len()
    }

    /// Parents waiting for a base that refused their next child as busy, none of whose
    /// children is at a base.
    fn parked(&self) -> usize {
        let own = self
            .pending
            .iter()
            .filter(|&&p| {
                let parent = self.parents.get(p);
                parent.refused && parent.remaining == 0
            })
            .count();
        own + self.bases.parked()
    }

    /// Every parent waiting on a base's Busy stops there: it completes with `ECANCELED` at the
    /// next poll, or once its children already at a base are back (these levels keep no
    /// copies, so a write cut short is as any failed one).
    fn abort_parked(&mut self) -> usize {
        let mut n = self.bases.abort_parked();
        let mut i = 0;
        while i < self.pending.len() {
            let p = self.pending[i];
            if !self.parents.get_mut(p).refused {
                i += 1;
                continue;
            }
            self.pending.swap_remove(i);
            self.stop(p, IoStatus::Error(libc::ECANCELED));
            self.parents.get_mut(p).queued = false;
            self.maybe_finish(p);
            n += 1;
        }
        n
    }
}
