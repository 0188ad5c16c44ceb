//! Taking requests from the ring and starting them: the queue's submission path (see the
//! `queue` module docs for the round it is part of).

use std::sync::atomic::Ordering;

use fp_bdev::disk::arrival_clock;
use fp_bdev::{IoOp, SubmitError};
use fp_virtio_blk::{
    validate_sized, BlkRequest, ParseError, ParseErrorKind, RequestType, SECTOR_SIZE, VIRTIO_BLK_S_UNSUPP,
};
use fp_virtq::Chain;

use super::{submit_error_status, QueuePoller};
use crate::inflight::Pending;
use crate::ring::{Head, Ring};

/// What to do after starting one chain.
enum Flow {
    Next,
    /// The backend is full: stop taking requests this round (the request waits in `retry`).
    Busy,
    /// The chain cannot be completed at all: fail the queue ([`unusable_chain`] says why).
    /// What, not the message: with a `String` the enum took 24 bytes, returned through memory
    /// and decoded from its niche after every request's `start`; now it is a register.
    Fail {
        head: u16,
        kind: ParseErrorKind,
    },
}

/// What [`QueuePoller::take`] did. Three cases without data: its caller's test of them is a
/// compare, where an enum holding `Flow` and its failure cost 9 instructions per request under
/// callgrind.
enum Taken {
    /// A request was taken and started (or completed at once); take the next.
    Next,
    /// A request was taken and the batch ends: the back-end is busy (the request waits in
    /// `retry`), or the queue failed.
    Last,
    /// The ring holds no request.
    Empty,
}

/// Why a chain that cannot be completed at all fails the queue.
fn unusable_chain(head: u16, kind: ParseErrorKind) -> String {
    format!("request {head} cannot be completed: {kind}")
}

impl From<Flow> for Taken {
    /// A started request's flow, as `take` reports it (a failure is handled before).
    #[inline(always)]
    fn from(flow: Flow) -> Taken {
        match flow {
            Flow::Next => Taken::Next,
            Flow::Busy | Flow::Fail { .. } => Taken::Last,
        }
    }
}

impl QueuePoller {
    /// Takes the next available request and starts it. A split ring's common request, three
    /// descriptors that make a plain read or write, goes from the descriptor table to the bdev
    /// in this one inlined piece of code: the walker's three descriptors are parsed as they
    /// were read, in registers, where storing them in `self.chain` for `start` to load again
    /// (and `start`'s own frame) cost about 40 instructions per request under callgrind.
    /// Anything else is walked into `self.chain` and goes through [`QueuePoller::start`].
    #[inline(always)]
    fn take(&mut self, slot_idx: u16, arrival: u64) -> Taken {
        let head = match &mut self.ring {
            Ring::Split(q) => {
                let id = match q.pop() {
                    Ok(Some(id)) => id,
                    Ok(None) => return Taken::Empty,
                    Err(e) => {
                        self.fail(&format!("bad available ring: {e}"));
                        return Taken::Last;
                    }
                };
                let head = Head { id, slots: 1 };
                match q.read_three(&self.table, id) {
                    Some((descs, total)) => {
                        if let Some(t) = &mut self.tracker {
                            t.taken(id);
                        }
                        let slot = &mut self.slots[usize::from(slot_idx)];
                        if let Some(req) = slot.iov.parse_three(&descs, id) {
                            return self.start_parsed(head, slot_idx, req, arrival).into();
                        }
                        self.chain.set_three(descs, total);
                    }
                    None => {
                        if let Err(e) = q.walk_general(&self.table, id, &mut self.chain) {
                            self.fail(&format!("request {id} cannot be completed: {e}"));
                            return Taken::Last;
                        }
                        if let Some(t) = &mut self.tracker {
                            t.taken(id);
                        }
                    }
                }
                head
            }
            Ring::Packed(_) => {
                let head = match self.ring.pop(&self.table, &mut self.chain, &mut self.tracker) {
                    Ok(Some(h)) => h,
                    Ok(None) => return Taken::Empty,
                    Err(why) => {
                        self.fail(&why);
                        return Taken::Last;
                    }
                };
                if let Some(t) = &mut self.tracker {
                    t.taken(head.id);
                }
                self.depth.saw(head.id);
                head
            }
        };
        match self.start(head, slot_idx, arrival) {
            Flow::Fail { head, kind } => {
                self.fail(&unusable_chain(head, kind));
                Taken::Last
            }
            flow => flow.into(),
        }
    }

    /// Parses, validates and submits the chain in `self.chain`, or completes it at once.
    /// `slot_idx` is a free slot; `arrival` the time its batch was taken
    /// ([`fp_bdev::disk::arrival_clock`]). Out of line: [`QueuePoller::take`] starts the common
    /// request itself; this is for every other chain and for resubmissions.
    #[inline(never)]
    fn start(&mut self, head: Head, slot_idx: u16, arrival: u64) -> Flow {
        let slot = &mut self.slots[usize::from(slot_idx)];
        let req = match slot.iov.parse(&self.table, &self.chain, head.id) {
            Ok(r) => r,
            Err(e) => {
                return match e.status {
                    Some(st) => {
                        log::debug!("queue request {}: {}", head.id, e.kind);
                        let code = e.status_code();
                        self.complete_now(head, st, code);
                        Flow::Next
                    }
                    None => Flow::Fail { head: head.id, kind: e.kind },
                };
            }
        };
        self.start_parsed(head, slot_idx, req, arrival)
    }

    /// Validates and submits a parsed request (its data iovecs in slot `slot_idx`), or
    /// completes it at once.
    #[inline(always)]
    fn start_parsed(&mut self, head: Head, slot_idx: u16, req: BlkRequest, arrival: u64) -> Flow {
        let slot = &mut self.slots[usize::from(slot_idx)];
        if let Err(code) = validate_sized(&req, &self.disk, self.block_size) {
            self.complete_now(head, req.status, code);
            return Flow::Next;
        }
        let op = match req.kind {
            RequestType::In => IoOp::Read,
            RequestType::Out => IoOp::Write,
            RequestType::Flush => IoOp::Flush,
            RequestType::Discard => IoOp::Discard,
            RequestType::WriteZeroes => IoOp::WriteZeroes,
            RequestType::GetId => {
                self.complete_get_id(head, slot_idx, req.iovcnt as usize, req.status);
                return Flow::Next;
            }
            RequestType::Unsupported(_) => {
                let st = req.status;
                self.complete_now(head, st, VIRTIO_BLK_S_UNSUPP);
                return Flow::Next;
            }
        };
        let (offset, len) = match req.segment {
            Some(seg) => (seg.sector * SECTOR_SIZE, u64::from(seg.num_sectors) * SECTOR_SIZE),
            None if op == IoOp::Flush => (0, 0),
            None => (req.sector * SECTOR_SIZE, req.data_len),
        };
        // The parser built the iovecs from descriptors inside our memory table, which outlives
        // every request (the queue drains before the table goes); the slot is not reused
        // before completion.
        let iov = slot.iov.iovecs(req.iovcnt);
        slot.head = head;
        debug_assert!(!req.status.is_detached(), "the parser's status byte is guest memory");
        debug_assert_eq!(slot.req.tag, u32::from(slot_idx));
        slot.status = req.status;
        slot.used_len = if op == IoOp::Read { req.writable_len } else { 1 };
        (slot.req.op, slot.req.offset, slot.req.len, slot.req.iov) = (op, offset, len, iov);
        self.free.pop();
        match self.channel.submit_arrived(&slot.req, arrival) {
            Ok(()) => Flow::Next,
            Err(SubmitError::Busy) => {
                self.retry = Some(slot_idx);
                Flow::Busy
            }
            Err(e) => {
                self.free.push(slot_idx);
                let st = req.status;
                self.complete_now(head, st, submit_error_status(e));
                Flow::Next
            }
        }
    }

    /// Takes and starts at most `limit` new requests. Returns how many it took. Takes nothing
    /// from a failed queue, or while a request the back-end refused as busy waits in `retry`
    /// (it goes first, and holds its slot there): a round may call this more than once. Out
    /// of line, with [`QueuePoller::take`] inlined into its loop: one call frame for a batch
    /// of requests, not one for each. A round's first part calls it only when the ring shows
    /// a request ([`QueuePoller::pop_and_submit_first`]).
    #[inline(never)]
    pub(super) fn pop_and_submit(&mut self, limit: usize) -> usize {
        if self.failed || self.retry.is_some() {
            return 0;
        }
        self.disk.capacity_sectors = self.capacity_sectors.load(Ordering::Relaxed);
        // One clock read for the batch: the disk layer's latency of each request starts here
        // (docs/architecture.md, "The disk layer"), 7 instructions per request less under
        // callgrind at QD32.
        let arrival = arrival_clock();
        let mut popped = 0;
        while let Some(&slot_idx) = self.free.last() {
            if popped == limit {
                break;
            }
            match self.take(slot_idx, arrival) {
                Taken::Next => popped += 1,
                Taken::Last => return popped + 1,
                Taken::Empty => break,
            }
        }
        popped
    }

    /// [`QueuePoller::pop_and_submit`] for a round's first part: its call only when the ring
    /// shows a request (or an error, which the call reports), so that an idle round makes no
    /// call. Without its checks: `poll` made them just before.
    #[inline(always)]
    pub(super) fn pop_and_submit_first(&mut self, limit: usize) -> usize {
        debug_assert!(!self.failed && self.retry.is_none());
        if self.ring.shows_none() {
            return 0;
        }
        self.pop_and_submit(limit)
    }

    /// Resubmits requests a previous back-end left in flight (see [`crate::inflight`]), oldest
    /// first, before anything new is taken from the ring: split heads are walked through the
    /// same ring code as a fresh request; packed lists from their recorded descriptors, since
    /// the driver may have reused their ring slots. A request the bdev refuses as busy waits in
    /// `retry` and the rest in `resubmits`, retried every round (`poll`): a busy bdev delays
    /// them, it does not fail the queue start. Returns whether all were submitted.
    pub(super) fn resubmit(&mut self) -> Result<bool, String> {
        while self.retry.is_none() {
            let Some(p) = self.resubmits.pop_front() else { return Ok(true) };
            let Some(&slot_idx) = self.free.last() else {
                return Err("more requests in flight than ring entries".into());
            };
            let head = match p {
                Pending::Head(head) => {
                    let Ring::Split(q) = &self.ring else {
                        return Err("split heads recorded for a packed ring".into());
                    };
                    q.walk(&self.table, head, &mut self.chain)
                        .map_err(|e| ParseError::from_walk(head, e).to_string())?;
                    Head { id: head, slots: 1 }
                }
                Pending::List(r) => {
                    self.chain = Chain::from_packed(&self.table, &r.descs)
                        .map_err(|e| ParseError::from_walk(r.id, e).to_string())?;
                    Head { id: r.id, slots: r.slots }
                }
            };
            match self.start(head, slot_idx, arrival_clock()) {
                Flow::Next => {}
                Flow::Busy => return Ok(false),
                Flow::Fail { head, kind } => return Err(unusable_chain(head, kind)),
            }
        }
        Ok(false)
    }

    /// Goes on with resubmissions a busy bdev held up; true once none is left and the queue
    /// may take new requests (false when a resubmission failed the queue). Out of line: only
    /// after a restart with requests in flight.
    #[cold]
    #[inline(never)]
    pub(super) fn resubmit_rest(&mut self) -> bool {
        match self.resubmit() {
            Ok(done) => done,
            Err(why) => {
                self.fail(&format!("cannot resubmit in-flight requests: {why}"));
                self.resubmits.clear();
                false
            }
        }
    }
}
