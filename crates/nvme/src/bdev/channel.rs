//! A namespace's channel: one I/O queue pair of its controller, generic over the transport
//! (no dynamic call per I/O), polled by one reactor.
//!
//! A request becomes one command, or several when it is larger than the controller's transfer
//! limit (MDTS) or a command's block count: children are cut in order, as command slots free
//! up, so any size goes through bounded, preallocated state. Commands are queued at submit and
//! sent by one [`IoQueue::flush`] per poll round (one doorbell write, one `sendmsg`).
//!
//! Resets and lost connections: a channel that sees the controller's state word move (or its
//! queue die) drains the queue and keeps the drained commands; once the controller is back it
//! gets a new queue and resubmits them (reads and writes are idempotent), unless the
//! controller is given up or `fast_io_fail_timeout_sec` passed, and then they fail. Timeouts
//! (`bdev_nvme_set_options`): commands in flight longer than `timeout_us` are aborted or the
//! controller reset, per `action_on_timeout`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Arc;

use fp_bdev::clock::ticks;
use fp_bdev::iov::BounceBuf;
use fp_bdev::{BdevError, IoChannel, IoOp, IoRequest, IoStatus, IovCursor, IovSlices, Iovecs, SubmitError};
use fp_nvme_spec::Status;

use crate::cmd;
use crate::ctrlr::ana::AnaWord;
use crate::ctrlr::shared::*;
use crate::ctrlr::{ControllerData, TimeoutAction};
use crate::transport::{IoQueue, QueueStats, Transport, TransportId};
use crate::NvmeError;

use super::paths::{NamespaceBackend, NsParams, PathSet};
use super::status::{io_status, is_ana, retryable, ANA_RETRY, MAX_RETRIES, TIMED_OUT};

/// Iovecs [`NvmeChannel::scratch`] has room for at first.
const SCRATCH_IOVECS: usize = 64;
/// Bytes of one deallocate range (Base 3, Figure 309).
const DSM_RANGE: usize = 16;
/// Blocks one Write Zeroes or deallocate command covers at most (NLB is 16 bits, 0-based).
const MAX_BLOCKS_NO_DATA: u64 = 1 << 16;
/// The longest pause between two timeout scans.
const MAX_SCAN_INTERVAL_NS: u64 = 5_000_000;

/// One request as the caller gave it, and how far it got.
#[derive(Clone, Copy)]
struct Req {
    req: IoRequest,
    /// Bytes already cut into commands.
    cut: u64,
    /// Every command of it is cut.
    all_cut: bool,
    /// Its commands not completed yet.
    outstanding: u32,
    /// The first failure of one of its commands.
    status: IoStatus,
}

impl Req {
    fn new(req: IoRequest) -> Req {
        Req { req, cut: 0, all_cut: false, outstanding: 0, status: IoStatus::Success }
    }
}

/// One command: a piece of a request.
#[derive(Clone, Copy, Default)]
struct Cmd {
    req: u32,
    /// Byte offset inside the request.
    off: u64,
    len: u64,
    /// Tick at which it was aborted after a timeout; 0: not aborted.
    aborted_at: u64,
    /// A timeout was logged for it (`action_on_timeout` none).
    warned: bool,
    /// Times it was sent again after a transient failure.
    retries: u8,
}

/// A namespace's channel over transport `T`.
pub(crate) struct NvmeChannel<T: Transport> {
    pub(super) shared: Arc<Shared<T>>,
    me: Arc<ChannelShared>,
    nsid: u32,
    block_shift: u32,
    capacity: fp_bdev::Capacity,
    /// Bytes of data one command moves at most (whole blocks).
    max_data: u64,
    volatile_cache: bool,
    dsm: bool,
    write_zeroes: bool,
    queue: Option<T::Io>,
    /// The state word `queue` belongs to (or last seen without a queue).
    state: u64,
    /// What new and held I/O fails with now (controller failed, fast I/O failure).
    fail: Option<i32>,
    /// A queue asked for and not received yet.
    pending: Option<Receiver<Result<IoGrant<T>, NvmeError>>>,
    /// After a refused queue request: not before this tick again.
    ask_after: u64,
    reqs: Box<[Req]>,
    free_reqs: Vec<u32>,
    cmds: Box<[Cmd]>,
    free_cmds: Vec<u32>,
    /// Requests with bytes not yet cut into commands, in order.
    split: VecDeque<u32>,
    /// Commands to (re)send: refused `Busy`, or drained at a reset.
    resend: VecDeque<u32>,
    /// Requests accepted and not yet returned by `poll`.
    in_flight: usize,
    /// Completions made outside a queue (failures, flushes with nothing to flush).
    done: Vec<(u32, IoStatus)>,
    cq: Vec<(u32, Status)>,
    /// `poll`'s completions, kept between calls.
    batch: Vec<(u32, IoStatus)>,
    /// The iovecs of a command that carries part of a request (sliced from the request's),
    /// or a deallocate's range: the queue copies them at submission, so one array serves every
    /// command. Replaced by a larger one only when a request has more iovecs than any before.
    scratch: IovSlices,
    drained: Vec<u32>,
    /// One deallocate range per command slot, in memory registered for DMA (so the
    /// controller can read it), and the iovec over all of them.
    dsm_ranges: BounceBuf,
    dsm_iov: Iovecs,
    timeout_ticks: u64,
    action: TimeoutAction,
    scan_every: u64,
    next_scan: u64,
    expired: Vec<(u16, u32)>,
    /// The generation a reset was asked for (once per generation).
    reset_asked: u64,
    polls: u32,
    /// Counters of the channel's earlier queues.
    stats_base: QueueStats,
    /// The namespace's ANA state through this controller (`ctrlr::ana`).
    ana: Arc<AtomicU8>,
    /// A path of a multipath channel: a command failing with an ANA status goes back to it
    /// at once (to be sent through another path) rather than being retried here.
    member: bool,
    /// The controller reports ANA (Identify Controller when the channel opened): only then is
    /// an ANA status news of a state to read. From one that does not, it is any path error.
    ana_reporting: bool,
}

impl<T: Transport> NvmeChannel<T> {
    fn new(
        shared: Arc<Shared<T>>,
        ns: &NsParams,
        commands: usize,
        requests: usize,
    ) -> Result<Self, BdevError> {
        let me = shared.add_channel();
        let ana_reporting = shared.snapshot().cdata.ana_reporting();
        let bs = u64::from(ns.block_size);
        let max_data = (u64::from(ns.max_transfer) / bs).clamp(1, MAX_BLOCKS_NO_DATA) * bs;
        let mut dsm_ranges = BounceBuf::zeroed(commands * DSM_RANGE);
        let dsm_iov = dsm_ranges.iovecs(commands * DSM_RANGE);
        let rate = ticks::tick_rate();
        let timeout_ticks = ticks_of(shared.global.timeout_us.saturating_mul(1000), rate);
        let scan_every = (timeout_ticks / 4).clamp(1, ticks_of(MAX_SCAN_INTERVAL_NS, rate).max(1));
        Ok(NvmeChannel {
            action: shared.global.action_on_timeout,
            me,
            nsid: ns.nsid,
            block_shift: ns.block_size.trailing_zeros(),
            capacity: ns.capacity.clone(),
            max_data,
            volatile_cache: ns.volatile_cache,
            dsm: ns.dsm,
            write_zeroes: ns.write_zeroes,
            queue: None,
            state: 0,
            fail: None,
            pending: None,
            ask_after: 0,
            reqs: vec![
                Req::new(IoRequest { tag: 0, op: IoOp::Read, offset: 0, len: 0, iov: Iovecs::NONE });
                requests
            ]
            .into_boxed_slice(),
            free_reqs: (0..requests as u32).rev().collect(),
            cmds: vec![Cmd::default(); commands].into_boxed_slice(),
            free_cmds: (0..commands as u32).rev().collect(),
            split: VecDeque::with_capacity(requests),
            resend: VecDeque::with_capacity(commands),
            in_flight: 0,
            done: Vec::with_capacity(requests),
            cq: Vec::with_capacity(commands),
            batch: Vec::with_capacity(requests),
            scratch: IovSlices::new(SCRATCH_IOVECS),
            drained: Vec::with_capacity(commands),
            dsm_ranges,
            dsm_iov,
            timeout_ticks,
            scan_every,
            next_scan: 0,
            expired: Vec::new(),
            reset_asked: 0,
            polls: 0,
            stats_base: QueueStats::default(),
            ana: shared.ana.word(ns.nsid),
            member: false,
            ana_reporting,
            shared,
        })
    }

    /// Sends command `c` to the queue (not flushed); a full queue keeps it for later.
    #[inline(always)]
    fn send(&mut self, c: u32) {
        let Some(q) = self.queue.as_mut() else {
            self.resend.push_back(c);
            return;
        };
        let cmd = &self.cmds[c as usize];
        let req = &self.reqs[cmd.req as usize].req;
        let slba = (req.offset + cmd.off) >> self.block_shift;
        let nlb = (cmd.len >> self.block_shift) as u32;
        // The data buffers are the request's, valid until its completion is returned (what
        // its `Iovecs` vouch for), or this channel's range memory, which outlives its queue;
        // the queue returns or drains every command before either goes.
        let result = match req.op {
            // Reads and writes: the command built in place, whole requests on their own
            // iovecs.
            IoOp::Read | IoOp::Write => {
                let sqe = cmd::read_write(req.op == IoOp::Write, self.nsid, slba, nlb, false);
                if cmd.off == 0 && cmd.len == req.len {
                    q.submit(&sqe, req.iov, c)
                } else {
                    // The queue copies the iovecs at submission (`IoQueue::submit`), so the
                    // next command may reuse the entries.
                    let mut at = IovCursor::at(&req.iov, cmd.off);
                    let part = match self.scratch.slice(0, &req.iov, &mut at, cmd.len) {
                        Some(part) => part,
                        None => {
                            // A slice needs at most one entry per iovec of the request.
                            self.scratch = IovSlices::new(req.iov.count() as usize);
                            self.scratch.slice(0, &req.iov, &mut at, cmd.len).unwrap_or(Iovecs::NONE)
                        }
                    };
                    q.submit(&sqe, part, c)
                }
            }
            IoOp::Flush => q.submit(&cmd::flush(self.nsid), Iovecs::NONE, c),
            IoOp::WriteZeroes => q.submit(&cmd::write_zeroes(self.nsid, slba, nlb, false), Iovecs::NONE, c),
            IoOp::Discard => {
                let at = c as usize * DSM_RANGE;
                self.dsm_ranges.bytes_mut()[at..at + DSM_RANGE].copy_from_slice(&cmd::dsm_range(slba, nlb));
                let mut cursor = IovCursor::at(&self.dsm_iov, at as u64);
                let range = self
                    .scratch
                    .slice(0, &self.dsm_iov, &mut cursor, DSM_RANGE as u64)
                    .unwrap_or(Iovecs::NONE);
                q.submit(&cmd::deallocate(self.nsid, 1), range, c)
            }
        };
        match result {
            Ok(()) => {}
            Err(SubmitError::Busy) => self.resend.push_back(c),
            Err(e) => {
                let status = match e {
                    SubmitError::Unsupported => IoStatus::Unsupported,
                    _ => IoStatus::Error(libc::EINVAL),
                };
                let mut out = std::mem::take(&mut self.done);
                self.complete(c, status, &mut out);
                self.done = out;
            }
        }
    }

    /// Resends what waits, then cuts waiting requests into commands while slots are free.
    /// Called every poll round: with nothing waiting (the usual round) it is a check, inline.
    #[inline(always)]
    fn pump(&mut self) {
        if self.resend.is_empty() && self.split.is_empty() {
            return;
        }
        self.pump_waiting();
    }

    fn pump_waiting(&mut self) {
        if self.queue.is_none() {
            return;
        }
        while let Some(c) = self.resend.pop_front() {
            let before = self.resend.len();
            self.send(c);
            if self.resend.len() > before {
                // Refused again (full): it went to the back; put it first again and stop.
                let c = self.resend.pop_back().expect("just pushed");
                self.resend.push_front(c);
                return;
            }
        }
        while let Some(&r) = self.split.front() {
            let Some(c) = self.free_cmds.pop() else { return };
            let req = &mut self.reqs[r as usize];
            let left = req.req.len - req.cut;
            let len = match req.req.op {
                IoOp::Flush => left,
                IoOp::Read | IoOp::Write => left.min(self.max_data),
                IoOp::WriteZeroes | IoOp::Discard => left.min(MAX_BLOCKS_NO_DATA << self.block_shift),
            };
            self.cmds[c as usize] =
                Cmd { req: r, off: req.cut, len, aborted_at: 0, warned: false, retries: 0 };
            req.cut += len;
            req.outstanding += 1;
            if req.cut >= req.req.len {
                req.all_cut = true;
                self.split.pop_front();
            }
            self.send(c);
            if !self.resend.is_empty() {
                return;
            }
        }
    }

    /// Command `c` ended with `status`: when it was its request's last, the request completes.
    #[inline(always)]
    fn complete(&mut self, c: u32, status: IoStatus, out: &mut Vec<(u32, IoStatus)>) {
        let r = self.cmds[c as usize].req;
        self.free_cmds.push(c);
        let req = &mut self.reqs[r as usize];
        req.outstanding -= 1;
        if status != IoStatus::Success && req.status == IoStatus::Success {
            req.status = status;
        }
        if req.outstanding == 0 && req.all_cut {
            out.push((req.req.tag, req.status));
            self.free_reqs.push(r);
        }
    }

    /// Fails every command and request held for resubmission with `errno`.
    fn fail_held(&mut self, errno: i32) {
        let mut out = std::mem::take(&mut self.done);
        while let Some(c) = self.resend.pop_front() {
            self.complete(c, IoStatus::Error(errno), &mut out);
        }
        while let Some(r) = self.split.pop_front() {
            let req = &mut self.reqs[r as usize];
            req.all_cut = true;
            req.status = IoStatus::Error(errno);
            if req.outstanding == 0 {
                out.push((req.req.tag, req.status));
                self.free_reqs.push(r);
            }
        }
        self.done = out;
    }

    /// Whether the channel holds a queue now.
    #[inline]
    pub(super) fn has_queue(&self) -> bool {
        self.queue.is_some()
    }

    /// The namespace's ANA state through this path, as the controller thread last published it.
    #[inline]
    pub(super) fn ana(&self) -> AnaWord {
        AnaWord(self.ana.load(Ordering::Relaxed))
    }

    /// Makes the channel a path of a multipath channel (ANA failures handed back at once).
    pub(super) fn set_member(&mut self) {
        self.member = true;
    }

    /// Gives back, failed with `errno`, every request held for resubmission (multipath: to
    /// send them through another path). Requests whose commands are on a queue stay.
    pub(super) fn release_held(&mut self, errno: i32) {
        self.fail_held(errno);
    }

    /// Takes the queue out of use: its commands go back to be resent; the queue itself to the
    /// controller thread (`retire`) or the caller.
    fn take_queue(&mut self) -> Option<T::Io> {
        let mut q = self.queue.take()?;
        self.stats_base = add_stats(self.stats_base, q.stats());
        self.drained.clear();
        q.drain(&mut self.drained);
        for &c in self.drained.iter().rev() {
            self.cmds[c as usize].aborted_at = 0;
            self.cmds[c as usize].warned = false;
            self.resend.push_front(c);
        }
        Some(q)
    }

    /// The state word moved or there is no queue: drain, fail, or get a queue.
    #[cold]
    fn slow(&mut self, st: u64) {
        if generation(st) != generation(self.state) {
            if let Some(q) = self.take_queue() {
                self.shared.hand_back(Msg::Retire { queue: q });
            }
            self.pending = None;
        }
        if self.queue.is_none() {
            self.state = st;
        }
        self.fail = if st & ST_FAILED != 0 {
            Some(if st & ST_GONE != 0 { libc::ENODEV } else { libc::EIO })
        } else if st & ST_FAST_FAIL != 0 {
            Some(libc::EIO)
        } else {
            None
        };
        if let Some(errno) = self.fail {
            self.fail_held(errno);
        }
        if st & ST_FAILED != 0 || self.queue.is_some() {
            return;
        }
        if self.pending.is_none() && st & ST_ENABLED != 0 && ticks::now() >= self.ask_after {
            let (tx, rx) = mpsc::sync_channel(1);
            if self.shared.send(Msg::ConnectIo { reply: tx }) {
                self.pending = Some(rx);
            }
        }
        let Some(rx) = self.pending.as_ref() else { return };
        match rx.try_recv() {
            Ok(Ok(grant)) => {
                self.pending = None;
                if generation(grant.state) == generation(st) {
                    self.queue = Some(grant.queue);
                    self.state = grant.state;
                } else {
                    self.shared.hand_back(Msg::Retire { queue: grant.queue });
                }
            }
            Ok(Err(e)) => {
                self.pending = None;
                log::warn!("nvme {}n{}: no I/O queue: {e}", self.shared.opts.name, self.nsid);
                self.fail_held(libc::EIO);
                self.ask_after = ticks::now() + ticks::tick_rate() / 10;
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => self.pending = None,
        }
    }

    /// The timeout path: commands in flight longer than `timeout_us`.
    #[cold]
    fn scan_timeouts(&mut self, now: u64) {
        let Some(q) = self.queue.as_ref() else { return };
        let sqid = q.qid();
        self.expired.clear();
        q.expired(now.saturating_sub(self.timeout_ticks), &mut self.expired);
        let mut reset = false;
        for &(cid, c) in &self.expired {
            let cmd = &mut self.cmds[c as usize];
            match self.action {
                TimeoutAction::None => {
                    if !cmd.warned {
                        cmd.warned = true;
                        log::warn!(
                            "nvme {}n{}: command {cid:#x} timed out",
                            self.shared.opts.name,
                            self.nsid
                        );
                    }
                }
                TimeoutAction::Abort if cmd.aborted_at == 0 => {
                    cmd.aborted_at = now.max(1);
                    self.shared.send(Msg::Abort { state: self.state, sqid, cid });
                }
                TimeoutAction::Abort => reset |= now.saturating_sub(cmd.aborted_at) >= self.timeout_ticks,
                TimeoutAction::Reset => reset = true,
            }
        }
        if reset && self.reset_asked != generation(self.state) {
            self.reset_asked = generation(self.state);
            log::warn!(
                "nvme {}n{}: commands timed out: resetting the controller",
                self.shared.opts.name,
                self.nsid
            );
            self.shared.send(Msg::Reset { state: Some(self.state), reply: None });
        }
    }

    pub(super) fn publish_stats(&self) {
        let s = self.queue.as_ref().map_or(QueueStats::default(), |q| q.stats());
        self.me.publish(add_stats(self.stats_base, s));
    }
}

/// [`IoChannel::poll`] through the channel's `poll_batch`, into the list `batch` finds in it
/// (kept between calls: no allocation per poll).
pub(super) fn poll_kept<C: IoChannel>(
    ch: &mut C,
    batch: fn(&mut C) -> &mut Vec<(u32, IoStatus)>,
    done: &mut dyn FnMut(u32, IoStatus),
) -> usize {
    let mut out = std::mem::take(batch(ch));
    out.clear();
    let n = ch.poll_batch(&mut out);
    for &(tag, status) in &out {
        done(tag, status);
    }
    *batch(ch) = out;
    n
}

/// `ns` nanoseconds in ticks of `rate` per second.
fn ticks_of(ns: u64, rate: u64) -> u64 {
    ((u128::from(ns) * u128::from(rate)) / 1_000_000_000).min(u128::from(u64::MAX)) as u64
}

impl<T: Transport> IoChannel for NvmeChannel<T> {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        let mask = (1u64 << self.block_shift) - 1;
        if (req.offset | req.len) & mask != 0 {
            return Err(SubmitError::OutOfRange);
        }
        match req.offset.checked_add(req.len) {
            Some(end) if end <= self.capacity.blocks() << self.block_shift => {}
            _ => return Err(SubmitError::OutOfRange),
        }
        // What completes without a command: a flush with no cache to flush, an empty range,
        // iovecs that do not add up to the length.
        let immediate = match req.op {
            IoOp::Discard if !self.dsm => return Err(SubmitError::Unsupported),
            IoOp::WriteZeroes if !self.write_zeroes => return Err(SubmitError::Unsupported),
            IoOp::Flush => (!self.volatile_cache).then_some(IoStatus::Success),
            IoOp::Read | IoOp::Write => {
                // One iovec, the common case, read without a loop.
                let total = match req.iov.as_slice() {
                    [v] => v.iov_len as u64,
                    _ => req.iov.total_len(),
                };
                if total != req.len {
                    Some(IoStatus::Error(libc::EINVAL))
                } else {
                    (req.len == 0).then_some(IoStatus::Success)
                }
            }
            _ => (req.len == 0).then_some(IoStatus::Success),
        };
        let r = self.free_reqs.pop().ok_or(SubmitError::Busy)?;
        self.in_flight += 1;
        // Failing: unless the controller moved on since the last poll (back from a reconnect),
        // which the next poll sees; the request then waits for it.
        let fail = self.fail.filter(|_| self.shared.state() == self.state);
        if immediate.is_some() || fail.is_some() {
            let status = fail.map_or(immediate.unwrap_or(IoStatus::Success), IoStatus::Error);
            self.done.push((req.tag, status));
            self.free_reqs.push(r);
            return Ok(());
        }
        // The common case: one command, nothing waiting before it.
        if self.split.is_empty() && self.resend.is_empty() && self.queue.is_some() && req.len <= self.max_data
        {
            if let Some(c) = self.free_cmds.pop() {
                self.reqs[r as usize] =
                    Req { req: *req, cut: req.len, all_cut: true, outstanding: 1, status: IoStatus::Success };
                self.cmds[c as usize] =
                    Cmd { req: r, off: 0, len: req.len, aborted_at: 0, warned: false, retries: 0 };
                self.send(c);
                return Ok(());
            }
        }
        self.reqs[r as usize] = Req::new(*req);
        self.split.push_back(r);
        self.pump();
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        poll_kept(self, |c| &mut c.batch, done)
    }

    fn poll_batch(&mut self, out: &mut Vec<(u32, IoStatus)>) -> usize {
        let first = out.len();
        // Presence, then the state word: see `ctrlr::shared`.
        self.me.active.swap(true, Ordering::SeqCst);
        let st = self.shared.state();
        if st != self.state || self.queue.is_none() {
            self.slow(st);
        }
        if let Some(q) = self.queue.as_mut() {
            self.cq.clear();
            let result = q.poll(&mut self.cq);
            // Completions reaped before a queue fails are real: their IDs are no longer in
            // flight, and a drain would not return them.
            let cq = std::mem::take(&mut self.cq);
            for &(c, status) in &cq {
                if !status.is_success() && self.ana_reporting && is_ana(status) {
                    // The controller's ANA state moved: it reads the page again; a multipath
                    // channel sends the request through another path meanwhile.
                    self.shared.ana.ask(&self.ana, || self.shared.send(Msg::ReadAna));
                    if self.member {
                        self.complete(c, IoStatus::Error(ANA_RETRY), out);
                        continue;
                    }
                }
                if !status.is_success() && retryable(status) {
                    let cmd = &mut self.cmds[c as usize];
                    if cmd.retries < MAX_RETRIES && cmd.aborted_at == 0 {
                        cmd.retries += 1;
                        self.resend.push_back(c);
                        continue;
                    }
                }
                let s = if !status.is_success() && self.cmds[c as usize].aborted_at != 0 {
                    TIMED_OUT
                } else {
                    io_status(status)
                };
                self.complete(c, s, out);
            }
            self.cq = cq;
            if let Err(error) = result {
                log::warn!("nvme {}n{}: I/O queue failed: {error}", self.shared.opts.name, self.nsid);
                let state = self.state;
                if let Some(queue) = self.take_queue() {
                    self.shared.hand_back(Msg::QueueFailed { state, queue, error });
                }
            }
        }
        self.pump();
        if let Some(q) = self.queue.as_mut() {
            q.flush();
        }
        self.me.active.store(false, Ordering::Release);
        if self.timeout_ticks != 0 {
            let now = ticks::now();
            if now >= self.next_scan {
                self.next_scan = now + self.scan_every;
                self.scan_timeouts(now);
            }
        }
        out.append(&mut self.done);
        let n = out.len() - first;
        self.in_flight -= n;
        // Counters go out every 64 rounds, and when the channel runs dry (its reactor may
        // sleep next, and the last rounds would not be seen until the next I/O).
        self.polls = self.polls.wrapping_add(1);
        if self.polls & 63 == 0 || (n != 0 && self.in_flight == 0) {
            self.publish_stats();
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl<T: Transport> Drop for NvmeChannel<T> {
    fn drop(&mut self) {
        let state = self.state;
        if let Some(queue) = self.take_queue() {
            self.shared.send(Msg::DisconnectIo { queue, state });
        }
        self.shared.channel_closed(self.stats_base);
    }
}

impl<T: Transport> Shared<T> {
    /// A channel on namespace `ns` with a queue pair of its own: waited for when `wait` (at
    /// most the admin timeout; a controller resetting hands it over later), otherwise asked
    /// for and taken at a later poll round.
    pub(crate) fn path_channel(
        self: &Arc<Self>,
        ns: &NsParams,
        wait: bool,
    ) -> Result<NvmeChannel<T>, BdevError> {
        let (depth, requests) = (self.snapshot().io_queue_depth, self.global.io_queue_requests);
        let commands = usize::from(depth.max(2) - 1);
        let mut ch = NvmeChannel::new(self.clone(), ns, commands, (requests as usize).max(commands))?;
        let (tx, rx) = mpsc::sync_channel(1);
        if !self.send(Msg::ConnectIo { reply: tx }) {
            return Err(BdevError::Unsupported(format!("controller {} is detached", self.opts.name)));
        }
        if !wait {
            ch.pending = Some(rx);
            return Ok(ch);
        }
        match rx.recv_timeout(self.global.admin_timeout()) {
            Ok(Ok(grant)) => {
                ch.state = grant.state;
                ch.queue = Some(grant.queue);
            }
            Ok(Err(e)) => {
                return Err(BdevError::Unsupported(format!("no I/O queue on {}: {e}", self.opts.name)))
            }
            // The controller is resetting: the channel takes the queue when it comes.
            Err(_) => ch.pending = Some(rx),
        }
        Ok(ch)
    }
}

impl<T: Transport> NamespaceBackend for Shared<T> {
    fn open_channel(self: Arc<Self>, ns: &NsParams) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(self.path_channel(ns, true)?))
    }

    fn open_multipath(
        self: Arc<Self>,
        set: Arc<PathSet>,
        ns: &NsParams,
    ) -> Result<Box<dyn IoChannel>, BdevError> {
        self.open_multipath_channel(set, ns)
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self.any()
    }

    fn path_id(&self) -> u64 {
        self.path_id
    }

    fn state_word(&self) -> u64 {
        self.state()
    }

    fn ana(&self, nsid: u32) -> Option<AnaWord> {
        self.snapshot().cdata.ana_reporting().then(|| self.ana.get(nsid))
    }

    fn controller_name(&self) -> &str {
        &self.opts.name
    }

    fn trid(&self) -> TransportId {
        self.transport.trid()
    }

    fn controller_data(&self) -> (ControllerData, u32) {
        let s = self.snapshot();
        (s.cdata.clone(), s.vs)
    }

    fn stats(&self) -> QueueStats {
        Shared::stats(self)
    }
}
