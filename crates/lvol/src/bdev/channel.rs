//! A volume's I/O channel: the data path.
//!
//! A request is cut at cluster boundaries into pieces. A read piece goes to the base at the
//! cluster the published [`View`] resolves (its own, else an ancestor's), or reads zeroes. A
//! write piece to a cluster the volume owns goes straight to the base; one to a cluster it does
//! not own yet goes to the store's metadata owner, which allocates it (copying the parent's data
//! or zeroing it), commits the metadata durably, and answers with the cluster; the piece then
//! goes to the base. Discards and write-zeroes go to the owner (they may free clusters).
//!
//! Hot path: per cluster, one lookup in the cached view (a pointer compare when nothing changed)
//! and one atomic load; no lock, no allocation once the slots have grown to the peak depth.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use arc_swap::{ArcSwap, Cache};
use fp_bdev::{BdevInfo, IoChannel, IoOp, IoRequest, IoStatus, IovCursor, IovSlices, SubmitError};

use super::owner::{Msg, ZeroPiece};
use super::shared::Geometry;
use super::shared::{ChannelShared, Piece, Reply, View, VolumeShared};
use crate::{ReadSource, Uuid, UNALLOCATED};

/// A base tag with this bit is a slot's (a request cut into pieces, or waiting for the owner);
/// without it, the caller's own tag of a request passed straight through.
const SLOT_TAG: u32 = 1 << 31;
/// On a passed-through request: it is a write (counted in [`ChannelShared::writes`]). Caller
/// tags from this bit up always take the slot path.
const WRITE_TAG: u32 = 1 << 30;

struct Slot {
    /// The caller's tag.
    tag: u32,
    /// Pieces not completed, plus one while the request is being cut.
    pending: u32,
    status: IoStatus,
    /// Counted in [`ChannelShared::writes`].
    write: bool,
    /// The pieces' iovecs when the request spans clusters (reused; replaced by a larger one
    /// when a request needs more than any before it in this slot).
    iovs: IovSlices,
}

/// Request slots, indexed by the tag the base sees.
struct Slots {
    slots: Vec<Slot>,
    free: Vec<u32>,
    in_use: usize,
    /// Requests passed straight through to the base, in flight.
    direct: usize,
    done: Vec<(u32, IoStatus)>,
}

impl Slots {
    fn take(&mut self, tag: u32, write: bool) -> u32 {
        self.in_use += 1;
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    tag: 0,
                    pending: 0,
                    status: IoStatus::Success,
                    write: false,
                    iovs: IovSlices::new(0),
                });
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[i as usize];
        s.tag = tag;
        s.pending = 1;
        s.status = IoStatus::Success;
        s.write = write;
        i
    }

    fn add_piece(&mut self, slot: u32) {
        self.slots[slot as usize].pending += 1;
    }

    /// One piece (or the cutting guard) of `slot` ended with `status`: the request's tag and
    /// status when that was its last.
    #[inline]
    fn finish_piece(&mut self, slot: u32, status: IoStatus, me: &ChannelShared) -> Option<(u32, IoStatus)> {
        let s = &mut self.slots[slot as usize];
        if s.status == IoStatus::Success {
            s.status = status;
        }
        s.pending -= 1;
        if s.pending != 0 {
            return None;
        }
        if s.write {
            me.writes.fetch_sub(1, Ordering::SeqCst);
        }
        let done = (s.tag, s.status);
        self.free.push(slot);
        self.in_use -= 1;
        Some(done)
    }

    /// [`Slots::finish_piece`] outside `poll`: a finished request waits in `done`.
    fn piece_done(&mut self, slot: u32, status: IoStatus, me: &ChannelShared) {
        if let Some(d) = self.finish_piece(slot, status, me) {
            self.done.push(d);
        }
    }

    /// The base completed the request tagged `tag`: the caller's tag and status when that
    /// finished one of the caller's requests.
    #[inline]
    fn base_done(&mut self, tag: u32, status: IoStatus, me: &ChannelShared) -> Option<(u32, IoStatus)> {
        if tag & SLOT_TAG != 0 {
            return self.finish_piece(tag & !SLOT_TAG, status, me);
        }
        self.direct -= 1;
        if tag & WRITE_TAG != 0 {
            me.writes.fetch_sub(1, Ordering::SeqCst);
        }
        Some((tag & !WRITE_TAG, status))
    }
}

pub(crate) struct LvolChannel {
    vol: Arc<VolumeShared>,
    view: Cache<Arc<ArcSwap<View>>, Arc<View>>,
    me: Arc<ChannelShared>,
    base: Box<dyn IoChannel>,
    geo: Geometry,
    info: BdevInfo,
    uuid: Uuid,
    owner: Sender<Msg>,
    slots: Slots,
    /// Writes submitted while the volume was frozen, in order.
    held: VecDeque<IoRequest>,
    /// Pieces the base refused as busy, for the next poll.
    retry: VecDeque<IoRequest>,
}

impl LvolChannel {
    pub(crate) fn new(
        vol: Arc<VolumeShared>,
        base: Box<dyn IoChannel>,
        geo: Geometry,
        info: BdevInfo,
        uuid: Uuid,
        owner: Sender<Msg>,
    ) -> LvolChannel {
        let me = Arc::new(ChannelShared { writes: Default::default(), replies: Default::default() });
        vol.channels.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&me));
        LvolChannel {
            view: Cache::new(vol.view.clone()),
            vol,
            me,
            base,
            geo,
            info,
            uuid,
            owner,
            slots: Slots {
                slots: Vec::new(),
                free: Vec::new(),
                in_use: 0,
                direct: 0,
                done: Vec::with_capacity(256),
            },
            held: VecDeque::new(),
            retry: VecDeque::new(),
        }
    }

    /// Sends a piece to the base at byte `offset` of the base.
    fn send_base(&mut self, mut r: IoRequest, offset: u64) {
        r.offset = offset;
        match self.base.submit(&r) {
            Ok(()) => {}
            Err(SubmitError::Busy) => self.retry.push_back(r),
            Err(SubmitError::Unsupported) => self.refused(r.tag, IoStatus::Unsupported),
            Err(SubmitError::OutOfRange) => self.refused(r.tag, IoStatus::Error(libc::EIO)),
        }
    }

    /// The base refused a request outright.
    fn refused(&mut self, tag: u32, status: IoStatus) {
        if let Some(d) = self.slots.base_done(tag, status, &self.me) {
            self.slots.done.push(d);
        }
    }

    fn send_owner(&mut self, msg: Msg, slot: u32) {
        if self.owner.send(msg).is_err() {
            // The store is closed: its volumes fail.
            self.slots.piece_done(slot, IoStatus::Error(libc::EIO), &self.me);
        }
    }

    /// Cuts `req` (already counted and checked) into pieces and sends each on its way.
    fn start(&mut self, req: &IoRequest, slot: u32) {
        let shift = self.geo.cluster_shift;
        let mask = (1u64 << shift) - 1;
        // Each piece asks the cached view (a pointer compare when nothing changed) rather than
        // holding it: an Arc clone per request would bounce the view's reference count between
        // every core using the volume. A view published meanwhile is as valid as the one before:
        // a change that takes clusters from a volume (a snapshot) waits for its writes to drain.
        if req.op == IoOp::Flush {
            self.slots.add_piece(slot);
            let r = IoRequest { tag: slot | SLOT_TAG, ..*req };
            self.send_base(r, 0);
            self.slots.piece_done(slot, IoStatus::Success, &self.me);
            return;
        }
        let first = req.offset >> shift;
        let last = (req.offset + req.len - 1) >> shift;
        let data = matches!(req.op, IoOp::Read | IoOp::Write);
        // Each piece's slices follow the previous piece's in the slot's array, which the slot
        // keeps until its last piece completes; the pieces together need at most one slice per
        // iovec plus one per cut.
        let cut = data && first != last;
        if cut {
            let need = req.iov.count() as usize + (last - first) as usize;
            let iovs = &mut self.slots.slots[slot as usize].iovs;
            if iovs.capacity() < need {
                // The slot was just taken: no piece of an earlier request uses the old array.
                *iovs = IovSlices::new(need.next_power_of_two());
            }
        }
        let (mut cursor, mut used) = (IovCursor::START, 0);
        let mut at = req.offset;
        let end = req.offset + req.len;
        while at < end {
            let index = at >> shift;
            let within = at & mask;
            let len = ((index + 1) << shift).min(end) - at;
            let mut piece = IoRequest { tag: slot | SLOT_TAG, offset: within, len, ..*req };
            if cut {
                let iovs = &mut self.slots.slots[slot as usize].iovs;
                let Some(iov) = iovs.slice(used, &req.iov, &mut cursor, len) else {
                    // Not reached (the array was sized for every piece above); should it be,
                    // the request fails rather than the daemon.
                    self.slots.add_piece(slot);
                    self.slots.piece_done(slot, IoStatus::Error(libc::EINVAL), &self.me);
                    break;
                };
                piece.iov = iov;
                used += iov.count() as usize;
            }
            match req.op {
                IoOp::Read => match self.view.load().source(index) {
                    ReadSource::Cluster(c) => {
                        self.slots.add_piece(slot);
                        self.send_base(piece, self.geo.phys(c) + within);
                    }
                    ReadSource::External => {
                        self.slots.add_piece(slot);
                        let msg = Msg::ExternalRead {
                            vol: self.uuid,
                            piece: Piece { slot, req: piece, index },
                            chan: self.me.clone(),
                        };
                        self.send_owner(msg, slot);
                    }
                    ReadSource::Zeroes => zero_fill(&piece),
                },
                IoOp::Write => {
                    self.slots.add_piece(slot);
                    let c = self.view.load().own(index);
                    if c != UNALLOCATED {
                        self.send_base(piece, self.geo.phys(c) + within);
                    } else {
                        let msg = Msg::Write {
                            vol: self.uuid,
                            piece: Piece { slot, req: piece, index },
                            chan: self.me.clone(),
                        };
                        self.send_owner(msg, slot);
                    }
                }
                IoOp::Discard | IoOp::WriteZeroes => {
                    self.slots.add_piece(slot);
                    let discard = req.op == IoOp::Discard;
                    let piece = ZeroPiece { slot, index, within, len, discard, chan: self.me.clone() };
                    let msg = Msg::Zero { vol: self.uuid, piece };
                    self.send_owner(msg, slot);
                }
                IoOp::Flush => unreachable!("handled above"),
            }
            at += len;
        }
        self.slots.piece_done(slot, IoStatus::Success, &self.me);
    }

    fn submit_checked(&mut self, req: &IoRequest) {
        let mutates = req.op != IoOp::Read && req.op != IoOp::Flush;
        if mutates && self.vol.read_only.load(Ordering::Relaxed) {
            self.slots.done.push((req.tag, IoStatus::Error(libc::EROFS)));
            return;
        }
        // Only writes take part in the quiesce: discards and write-zeroes are carried out by the
        // owner itself, which serialises them with the changes a quiesce protects.
        let write = req.op == IoOp::Write;
        if write {
            // The quiesce handshake (see `shared`): count, then look.
            self.me.writes.fetch_add(1, Ordering::SeqCst);
            if self.vol.frozen.load(Ordering::SeqCst) {
                self.me.writes.fetch_sub(1, Ordering::SeqCst);
                self.held.push_back(*req);
                return;
            }
        }
        // The common case: a read or write of the caller's inside one cluster whose place is
        // published goes to the base under the caller's own tag, with no slot.
        if req.tag < WRITE_TAG && matches!(req.op, IoOp::Read | IoOp::Write) {
            let shift = self.geo.cluster_shift;
            let index = req.offset >> shift;
            if (req.offset + req.len - 1) >> shift == index {
                let view = self.view.load();
                let c = if write { view.own(index) } else { view.resolve(index).unwrap_or(UNALLOCATED) };
                if c != UNALLOCATED {
                    let tag = if write { req.tag | WRITE_TAG } else { req.tag };
                    let offset = self.geo.phys(c) + (req.offset & ((1u64 << shift) - 1));
                    self.slots.direct += 1;
                    self.send_base(IoRequest { tag, ..*req }, offset);
                    return;
                }
            }
        }
        let slot = self.slots.take(req.tag, write);
        self.start(req, slot);
    }
}

/// A read of clusters nobody mapped: zeroes.
fn zero_fill(piece: &IoRequest) {
    fp_bdev::iov::zero(&piece.iov, 0, piece.len);
}

impl IoChannel for LvolChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if req.op != IoOp::Flush {
            self.info.check_range(req.offset, req.len)?;
            if req.len == 0 {
                self.slots.done.push((req.tag, IoStatus::Success));
                return Ok(());
            }
        }
        self.submit_checked(req);
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        while let Some(reply) = self.me.replies.pop() {
            match reply {
                Reply::Mapped { piece, cluster } => {
                    let offset = self.geo.phys(cluster) + piece.req.offset;
                    self.send_base(piece.req, offset);
                }
                Reply::Done { slot, status } => self.slots.piece_done(slot, status, &self.me),
            }
        }
        if !self.held.is_empty() && !self.vol.frozen.load(Ordering::SeqCst) {
            for _ in 0..self.held.len() {
                let Some(req) = self.held.pop_front() else { break };
                self.submit_checked(&req);
            }
        }
        for _ in 0..self.retry.len() {
            let Some(r) = self.retry.pop_front() else { break };
            let offset = r.offset;
            self.send_base(r, offset);
        }
        let mut n = self.slots.done.len();
        for (tag, status) in self.slots.done.drain(..) {
            done(tag, status);
        }
        let (slots, me) = (&mut self.slots, &self.me);
        self.base.poll(&mut |slot, status| {
            if let Some((tag, status)) = slots.base_done(slot, status, me) {
                done(tag, status);
                n += 1;
            }
        });
        n
    }

    fn in_flight(&self) -> usize {
        self.slots.in_use + self.slots.direct + self.held.len() + self.slots.done.len()
    }

    /// The pieces the base refused as busy, and what the base parked.
    fn parked(&self) -> usize {
        self.retry.len() + self.base.parked()
    }

    fn abort_parked(&mut self) -> usize {
        let mut n = self.base.abort_parked();
        while let Some(r) = self.retry.pop_front() {
            self.refused(r.tag, IoStatus::Error(libc::ECANCELED));
            n += 1;
        }
        n
    }
}
