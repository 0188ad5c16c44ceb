//! The rebuild's copies on a reactor: the owner claims chunks and sends them as orders over a
//! [`CopyLink`]; a [`CopyRunner`], a background job on a reactor, copies each with ordinary
//! channel I/O (read the source, write every target, piece by piece through its own buffers)
//! and sends back what it did, waking the owner. The owner keeps the claims (the intent map's
//! interlock), the checkpoint, the metadata and control. The runner keeps to the share: each
//! round the bytes the guest's requests took on the raid's channels since its last round earn
//! it credit (`fp_bdev::copy_share::CopyBudget`), and it takes orders only on credit.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use fp_bdev::copy_share::{CopyBudget, CopyShare};
use fp_bdev::iov::BounceBuf;
use fp_bdev::module::{BackgroundJob, BackgroundPoll};
use fp_bdev::{Bdev, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

use crate::shared::{GuestRequests, RaidShared};

/// One chunk to copy: `len` bytes at byte `offset` of every base (the data offset included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOrder {
    pub chunk: u64,
    pub offset: u64,
    pub len: u64,
}

/// A chunk's copy ended: copied, or failed on the base in `slot` with a positive errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyDone {
    pub chunk: u64,
    pub bytes: u64,
    pub failed: Option<(usize, i32)>,
    /// Not copied: a write held the chunk when the runner came to it.
    pub busy: bool,
}

/// Between the owner and its runner.
pub struct CopyLink {
    orders: ArrayQueue<CopyOrder>,
    done: ArrayQueue<CopyDone>,
    /// Set by the owner: the runner takes no more orders and ends once nothing is in flight.
    stop: AtomicBool,
    /// Set by the runner as it ends (nothing in flight, channels closed).
    finished: AtomicBool,
    /// The share's weight (`process_weight`), which the owner may change.
    weight: AtomicU8,
    /// Times the runner woke the owner (tests: fewer than the chunks it copied).
    owner_wakes: AtomicU64,
    shared: Arc<RaidShared>,
}

impl CopyLink {
    /// A link for at most `slots` orders in flight.
    pub fn new(slots: usize, share: CopyShare, shared: Arc<RaidShared>) -> Arc<CopyLink> {
        Arc::new(CopyLink {
            orders: ArrayQueue::new(slots.max(1)),
            done: ArrayQueue::new(slots.max(1)),
            stop: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            weight: AtomicU8::new(share.weight()),
            owner_wakes: AtomicU64::new(0),
            shared,
        })
    }

    /// Sends an order; `Err` when the queue is full (the owner sent more than its window).
    pub fn send(&self, order: CopyOrder) -> Result<(), CopyOrder> {
        self.orders.push(order)
    }

    /// A completed order, if any.
    pub fn reap(&self) -> Option<CopyDone> {
        self.done.pop()
    }

    /// Times the runner woke the owner.
    pub fn owner_wakes(&self) -> u64 {
        self.owner_wakes.load(Ordering::Relaxed)
    }

    /// Wakes the owner, counted.
    fn wake_owner(&self) {
        self.owner_wakes.fetch_add(1, Ordering::Relaxed);
        self.shared.wake_owner();
    }

    /// Orders sent and not taken by the runner yet, and orders it sent back and the owner
    /// has not reaped yet.
    pub fn queued(&self) -> (usize, usize) {
        (self.orders.len(), self.done.len())
    }

    /// The share the runner keeps to from its next round.
    pub fn set_share(&self, share: CopyShare) {
        self.weight.store(share.weight(), Ordering::Relaxed);
    }

    /// Asks the runner to end once what it has in flight is done.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Whether the runner has ended.
    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }
}

/// What a runner copies between.
pub struct RunnerSpec {
    pub source: (usize, Bdev),
    pub targets: Vec<(usize, Bdev)>,
    /// Buffers (orders in flight at most) and the bytes of each (the longest request).
    pub slots: usize,
    pub piece: u64,
    /// The longest order (a bitmap chunk).
    pub order_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wants {
    /// The read of the piece at `at`.
    Read,
    /// The writes of the piece read, to the targets whose bit is set.
    Write(u32),
}

struct Slot {
    buf: BounceBuf,
    order: CopyOrder,
    /// Offset of the piece being copied (from `order.offset`).
    at: u64,
    /// Writes of the piece in flight.
    writes: usize,
    failed: Option<(usize, i32)>,
}

/// The runner: a background job on a reactor (see the module's description).
pub struct CopyRunner {
    link: Arc<CopyLink>,
    // Channels before buffers: dropped first, they wait for what is in flight while the
    // buffers it reads and writes still exist.
    source: (usize, Option<Box<dyn IoChannel>>),
    targets: Vec<(usize, Option<Box<dyn IoChannel>>)>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Submissions a base refused as busy, retried at the next poll.
    busy: Vec<(u32, Wants)>,
    /// Completions reaped this round (made once).
    reaped: Vec<(u32, IoStatus)>,
    in_flight: usize,
    /// The guest's bytes on the raid's channels, and the copy's credit beside them.
    guest: GuestRequests,
    budget: CopyBudget,
    /// The longest order (a bitmap chunk).
    order_bytes: u64,
}

impl CopyRunner {
    /// Opens the channels on the calling thread (the reactor). A channel that cannot open
    /// fails every order with `ENODEV` on its slot.
    pub fn open(link: Arc<CopyLink>, spec: RunnerSpec) -> CopyRunner {
        let open = |(slot, bdev): (usize, Bdev)| match bdev.open_channel() {
            Ok(ch) => (slot, Some(ch)),
            Err(e) => {
                log::error!("raid rebuild: cannot open a channel of '{}': {e}", bdev.info().name);
                (slot, None)
            }
        };
        let slots = spec.slots.max(1);
        CopyRunner {
            source: open(spec.source),
            targets: spec.targets.into_iter().map(open).collect(),
            slots: (0..slots)
                .map(|_| Slot {
                    buf: BounceBuf::zeroed(spec.piece as usize),
                    order: CopyOrder { chunk: 0, offset: 0, len: 0 },
                    at: 0,
                    writes: 0,
                    failed: None,
                })
                .collect(),
            free: (0..slots as u32).rev().collect(),
            busy: Vec::with_capacity(slots * 2),
            reaped: Vec::with_capacity(slots),
            in_flight: 0,
            guest: link.shared.guest_requests(),
            budget: CopyBudget::default(),
            order_bytes: spec.order_bytes,
            link,
        }
    }

    /// Orders taken and not yet sent back.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn piece(&self, s: u32) -> (u64, u64) {
        let slot = &self.slots[s as usize];
        let at = slot.order.offset + slot.at;
        (at, (slot.order.len - slot.at).min(slot.buf.len() as u64))
    }

    /// Submits what slot `s` wants; a busy base keeps it for the next poll.
    fn submit(&mut self, s: u32, wants: Wants) {
        let (offset, len) = self.piece(s);
        let iov = self.slots[s as usize].buf.iovecs(len as usize);
        match wants {
            Wants::Read => {
                let slot = self.source.0;
                let req = IoRequest { tag: s, op: IoOp::Read, offset, len, iov };
                let submitted = match self.source.1.as_mut() {
                    Some(ch) => ch.submit(&req).map_err(|e| (e, submit_errno(e))),
                    None => Err((SubmitError::Unsupported, libc::ENODEV)),
                };
                match submitted {
                    Ok(()) => {}
                    Err((SubmitError::Busy, _)) => self.busy.push((s, Wants::Read)),
                    Err((_, errno)) => self.fail(s, slot, errno),
                }
            }
            Wants::Write(mask) => {
                let mut refused = 0;
                for (i, (slot, ch)) in self.targets.iter_mut().enumerate() {
                    if mask & (1 << i) == 0 {
                        continue;
                    }
                    let Some(ch) = ch.as_mut() else {
                        self.slots[s as usize].failed.get_or_insert((*slot, libc::ENODEV));
                        continue;
                    };
                    let req = IoRequest { tag: s, op: IoOp::Write, offset, len, iov };
                    match ch.submit(&req) {
                        Ok(()) => self.slots[s as usize].writes += 1,
                        Err(SubmitError::Busy) => refused |= 1 << i,
                        Err(e) => {
                            self.slots[s as usize].failed.get_or_insert((*slot, submit_errno(e)));
                        }
                    }
                }
                if refused != 0 {
                    self.busy.push((s, Wants::Write(refused)));
                } else if self.slots[s as usize].writes == 0 {
                    self.piece_written(s);
                }
            }
        }
    }

    /// Slot `s`'s order failed on the base in `slot`: sent back as such.
    fn fail(&mut self, s: u32, slot: usize, errno: i32) {
        self.slots[s as usize].failed.get_or_insert((slot, errno));
        self.end(s);
    }

    /// Every write of the piece ended: the next piece, or the order's end.
    fn piece_written(&mut self, s: u32) {
        let (_, len) = self.piece(s);
        let slot = &mut self.slots[s as usize];
        slot.at += len;
        if slot.failed.is_some() || slot.at >= slot.order.len {
            self.end(s);
        } else {
            self.submit(s, Wants::Read);
        }
    }

    /// Sends slot `s`'s order back and frees the slot.
    fn end(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        let done = CopyDone {
            chunk: slot.order.chunk,
            bytes: if slot.failed.is_some() { 0 } else { slot.order.len },
            failed: slot.failed.take(),
            busy: false,
        };
        if let Some(intent) = self.link.shared.intent.as_ref() {
            // A write that overlapped the copy marks the chunk for another.
            intent.end_copy(done.chunk);
        }
        // The queue has room for every slot: the owner sends no more orders than that.
        if self.link.done.push(done).is_err() {
            log::error!(
                "raid rebuild: the completion queue is full (an owner bug); chunk {} lost",
                done.chunk
            );
        }
        self.free.push(s);
        self.in_flight -= 1;
        // The owner is woken as half the window comes back (it orders that much again while
        // the other half still copies) or when the runner runs dry. Woken for every chunk, the
        // owner took a fifth of the core from the reactor it shares it with, and the rebuild
        // alone ran at half its speed. The queue grows by one a push, here only, so it cannot
        // pass the half unseen (only the runner pushes, one at a time); an owner that reaps meanwhile
        // is awake anyway.
        let dry = self.in_flight == 0 && self.link.orders.is_empty();
        if dry || self.link.done.len() == self.slots.len().div_ceil(2) {
            self.link.wake_owner();
        }
    }

    /// Stopped with nothing in flight: closes the channels and tells the owner.
    fn end_run(&mut self) {
        self.source.1 = None;
        self.targets.clear();
        self.link.finished.store(true, Ordering::SeqCst);
        self.link.wake_owner();
    }

    fn all_targets(&self) -> u32 {
        (1u32 << self.targets.len()) - 1
    }
}

impl Drop for CopyRunner {
    /// Dropped with its reactor (the daemon stopping): the channels close first (waiting for
    /// what is in flight), then the owner learns that nothing more comes back.
    fn drop(&mut self) {
        if !self.link.finished() {
            self.end_run();
            // The channels are closed (their requests waited for): the chunks still claimed
            // for copies in flight are released; the owner looks at them again.
            if let Some(intent) = self.link.shared.intent.as_ref() {
                for (i, slot) in self.slots.iter().enumerate() {
                    if !self.free.contains(&(i as u32)) {
                        intent.end_copy(slot.order.chunk);
                    }
                }
            }
        }
    }
}

fn submit_errno(e: SubmitError) -> i32 {
    match e {
        SubmitError::Busy => libc::EBUSY,
        SubmitError::OutOfRange => libc::EINVAL,
        SubmitError::Unsupported => libc::EOPNOTSUPP,
    }
}

fn status_errno(status: IoStatus) -> Option<i32> {
    match status {
        IoStatus::Success => None,
        IoStatus::Error(e) => Some(e),
        IoStatus::Unsupported => Some(libc::EOPNOTSUPP),
    }
}

impl BackgroundJob for CopyRunner {
    fn poll(&mut self) -> BackgroundPoll {
        let mut busy = false;
        let mut reaped = std::mem::take(&mut self.reaped);
        if let Some(ch) = self.source.1.as_mut() {
            ch.poll(&mut |tag, status| reaped.push((tag, status)));
        }
        for (s, status) in reaped.drain(..) {
            busy = true;
            match status_errno(status) {
                None => self.submit(s, Wants::Write(self.all_targets())),
                Some(errno) => self.fail(s, self.source.0, errno),
            }
        }
        for i in 0..self.targets.len() {
            let slot = self.targets[i].0;
            if let Some(ch) = self.targets[i].1.as_mut() {
                ch.poll(&mut |tag, status| reaped.push((tag, status)));
            }
            for (s, status) in reaped.drain(..) {
                busy = true;
                let sl = &mut self.slots[s as usize];
                sl.writes -= 1;
                if let Some(errno) = status_errno(status) {
                    sl.failed.get_or_insert((slot, errno));
                }
                let waiting = self.busy.iter().any(|&(b, _)| b == s);
                if sl.writes == 0 && !waiting {
                    self.piece_written(s);
                }
            }
        }
        self.reaped = reaped;
        for (s, wants) in std::mem::take(&mut self.busy) {
            self.submit(s, wants);
        }
        if !self.link.stop.load(Ordering::SeqCst) {
            let share =
                CopyShare::new(u64::from(self.link.weight.load(Ordering::Relaxed))).unwrap_or_default();
            let guest = self.guest.bytes(&self.link.shared);
            let mut credit = self.budget.round(share, guest, self.order_bytes);
            while let Some(&s) = self.free.last() {
                if credit.is_some_and(|c| c < self.order_bytes) {
                    break;
                }
                let Some(order) = self.link.orders.pop() else { break };
                // The interlock: the copy starts only with no write in flight on the chunk.
                if self.link.shared.intent.as_ref().is_some_and(|i| !i.try_start_copy(order.chunk)) {
                    let busy = CopyDone { chunk: order.chunk, bytes: 0, failed: None, busy: true };
                    if self.link.done.push(busy).is_err() {
                        log::error!("raid rebuild: the completion queue is full (an owner bug)");
                    }
                    self.link.wake_owner();
                    continue;
                }
                self.free.pop();
                self.in_flight += 1;
                match credit.as_mut() {
                    Some(c) => {
                        *c = c.saturating_sub(order.len);
                        self.budget.spend(order.len);
                    }
                    None => {
                        self.link
                            .shared
                            .counters
                            .rebuild_bytes_unshared
                            .fetch_add(order.len, Ordering::Relaxed);
                    }
                }
                let slot = &mut self.slots[s as usize];
                slot.order = order;
                slot.at = 0;
                slot.writes = 0;
                slot.failed = None;
                busy = true;
                self.submit(s, Wants::Read);
            }
        } else if self.in_flight == 0 {
            self.end_run();
            return BackgroundPoll::Finished;
        }
        [BackgroundPoll::Idle, BackgroundPoll::Busy][usize::from(busy)]
    }

    /// The owner queues orders without waking the reactor: keep polling while the link is
    /// open.
    fn has_pending(&self) -> bool {
        true
    }
}
