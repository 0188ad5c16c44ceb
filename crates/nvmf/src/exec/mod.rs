//! The transport-neutral command executor: what a queue pair does with a submission queue
//! entry whatever carries it. Namespace I/O (Read, Write, Flush, Write Zeroes, Dataset
//! Management; a FUA write is followed by a flush) in `io`, the admin queue's commands through
//! the [`Controller`] in `admin`, and here the per-command state ([`Command`]), the queue's
//! data buffers, its namespaces' channels and the order commands start in.
//!
//! The executor talks to the transport that carries the queue (`tcp/`) through [`Transport`]:
//! the transport hands in a command ([`Executor::accept`]) and the host's data
//! ([`Executor::data_received`]), and the executor asks it for the host's data
//! ([`Transport::request_data`], an R2T in NVMe/TCP), to send data to the host
//! ([`Transport::send_data`], C2HData) and the completion ([`Transport::set_completion`],
//! [`Transport::send`]). Every method is generic over the transport, so the calls are
//! monomorphised and inlined: no dynamic dispatch, copy or allocation per I/O.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fp_bdev::disk::DiskIo;
use fp_bdev::iov::BounceBuf;
use fp_bdev::{IoOp, IoRequest, IoStatus, SubmitError};
use fp_nvme_spec::*;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use crate::controller::{AdminResult, Controller};
use crate::model::SubsystemView;
use crate::options::ListenAddress;
use crate::subsystem::{lock, CtrlShared, Namespace, NsCounters, Subsystem};
use crate::tcp::auth::Authenticator;
use crate::DhchapConfig;

mod admin;
mod auth;
mod io;

/// An Authentication Send or Receive (served by `auth`).
#[inline]
pub(crate) fn is_auth(sqe: &Sqe) -> bool {
    sqe.opcode() == OPC_FABRICS
        && matches!(sqe.fctype(), FCTYPE_AUTHENTICATION_SEND | FCTYPE_AUTHENTICATION_RECEIVE)
}

/// Command buffers up to this size are kept for the next command; larger transfers take one of
/// the queue's large buffers.
pub(crate) const KEEP_BUF: usize = 1 << 20;
/// The memory a queue may hold in large buffers (each `max_io_size` bytes, made on first use
/// and kept): at least one, so any transfer up to MDTS goes through; a command finding them
/// all in use waits for one, as a command the device refuses as busy.
const LARGE_BUDGET: usize = 32 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Free,
    /// An R2T is out (or queued); the host's H2CData fills the buffer.
    AwaitData,
    /// Its R2T waits for a large buffer to receive the data into.
    AwaitBuffer,
    /// Ready to start (its data, if any, is here).
    Ready,
    /// Requests in flight on a channel.
    Submitted,
    /// A FUA write completed; its flush is in flight.
    Flushing,
    /// An Asynchronous Event Request waiting for an event.
    Parked,
    /// Its PDUs are queued.
    Sending,
}

/// One command of the queue (one per submission queue entry), whatever transport carries it.
pub(crate) struct Command {
    pub(crate) sqe: Sqe,
    pub(crate) phase: Phase,
    /// The data buffer in use: the command's own, or while a large command runs one of the
    /// queue's large buffers (its own then waits in `own`).
    pub(crate) buf: Option<BounceBuf>,
    own: Option<BounceBuf>,
    /// Bytes the command moves (to or from the host).
    pub(crate) len: usize,
    /// Bytes of the host's data received so far.
    pub(crate) received: usize,
    /// Requests in flight (Dataset Management submits one per range).
    pending: u32,
    /// Dataset Management: the next range to submit.
    next_range: u32,
    /// The first error of its requests.
    status: Status,
    flushed: bool,
    /// Data buffers allocated for it (the tests' `QpairPoller::buffer_allocations`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) allocations: u32,
}

impl Command {
    pub(crate) fn new() -> Command {
        Command {
            sqe: Sqe([0; SQE_LEN]),
            phase: Phase::Free,
            buf: None,
            own: None,
            len: 0,
            received: 0,
            pending: 0,
            next_range: 0,
            status: Status::SUCCESS,
            flushed: false,
            allocations: 0,
        }
    }

    /// A data buffer of at least `len` bytes.
    fn buffer(&mut self, len: usize) -> &mut BounceBuf {
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = Some(BounceBuf::zeroed(len.max(512)));
            self.allocations += 1;
        }
        self.buf.as_mut().expect("just made")
    }
}

/// What a transport gives the executor. Commands are named by their index in the queue's
/// command table, which the transport keeps (each [`Command`] beside the transport's own
/// per-command state, such as the PDUs NVMe/TCP builds for it).
pub(crate) trait Transport {
    /// Command `i`.
    fn command(&mut self, i: u16) -> &mut Command;
    /// The queue is closing: requests given up now were given up because of it.
    fn closing(&self) -> bool;
    /// Asks the host for command `i`'s data (`len` bytes into its buffer, which is set); the
    /// transport calls [`Executor::data_received`] as it arrives.
    fn request_data(&mut self, i: u16);
    /// Prepares the first `len` bytes of command `i`'s buffer to go to the host, ahead of
    /// anything else it sends for the command. With `completes` the command succeeded with
    /// nothing more to say (completion dword 0 is 0): true when the transport lets the data
    /// stand for the completion (NVMe/TCP's C2HData SUCCESS flag), so none is set.
    fn send_data(&mut self, i: u16, len: usize, completes: bool) -> bool;
    /// Prepares command `i`'s completion (the transport fills in the command identifier,
    /// the queue ID and the submission queue head).
    fn set_completion(&mut self, i: u16, cqe: Cqe);
    /// Sends what command `i` prepared; the transport hands the command back
    /// ([`Executor::release`]) once it is out, or answers false when it can send nothing any
    /// more (the command is over now).
    fn send(&mut self, i: u16) -> bool;
}

/// A queue pair's commands, namespaces and buffers, for any transport.
pub(crate) struct Executor {
    pub(crate) sub: Arc<Subsystem>,
    pub(crate) ctrl: Arc<CtrlShared>,
    pub(crate) peer: String,
    pub(crate) qid: u16,
    /// The listener the queue came in on: its ANA states are the ones this queue honours.
    pub(crate) listen: ListenAddress,
    /// The admin queue's controller and the view it answers from.
    pub(crate) admin: Option<Box<Controller>>,
    view: Arc<SubsystemView>,
    view_generation: u64,
    pub(crate) ns_generation: u64,
    /// Indexed by NSID.
    pub(crate) ns: Vec<Option<NsChan>>,
    pub(crate) max_io: usize,
    /// The size of the command table.
    commands: u16,
    /// Commands not in use.
    pub(crate) free: Vec<u16>,
    pub(crate) ready: VecDeque<u16>,
    /// Writes whose data request waits for a large buffer, in arrival order.
    pub(crate) await_buf: VecDeque<u16>,
    /// Large buffers not in use; `large_made` of at most `large_max` were made.
    large_free: Vec<BounceBuf>,
    pub(crate) large_made: usize,
    large_max: usize,
    completions: Vec<(u32, u32, IoStatus)>,
    /// The admin queue answered a Disconnect or a shutdown, or a re-authentication failed:
    /// close once sent, saying `teardown_why`.
    pub(crate) teardown: bool,
    pub(crate) teardown_why: &'static str,
    /// The hashes and DH groups a re-authentication may use (the target's, shared).
    pub(crate) dhchap: Arc<Mutex<DhchapConfig>>,
    /// A DH-HMAC-CHAP transaction on the live queue (the host authenticates again).
    reauth: Option<Box<Authenticator>>,
    /// The transaction failed: the queue closes once the host has its AUTH_Failure1.
    reauth_failed: bool,
}

/// A namespace as this queue uses it: its channel and counters.
pub(crate) struct NsChan {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) chan: DiskIo,
    pub(crate) counters: Arc<NsCounters>,
    pub(crate) in_flight: u32,
    /// Detached: new commands get Invalid Namespace; dropped once `in_flight` is 0.
    pub(crate) removed: bool,
    /// The path status new commands fail with while the namespace's ANA group is not
    /// accessible through this queue's listener (never without ANA reporting).
    pub(crate) ana_refusal: Option<Status>,
}

impl Executor {
    /// An executor for `commands` commands; an admin queue's runs `admin`.
    pub(crate) fn new(
        sub: Arc<Subsystem>,
        ctrl: Arc<CtrlShared>,
        peer: String,
        (qid, listen): (u16, ListenAddress),
        admin: Option<Box<Controller>>,
        max_io: usize,
        commands: u16,
    ) -> Executor {
        let n = usize::from(commands);
        Executor {
            view_generation: sub.view_generation.load(Ordering::Acquire),
            view: sub.view_for(&ctrl.hostnqn, &listen),
            sub,
            ctrl,
            peer,
            qid,
            listen,
            admin,
            ns_generation: u64::MAX,
            ns: Vec::new(),
            max_io,
            commands,
            free: (0..commands).rev().collect(),
            ready: VecDeque::with_capacity(n),
            await_buf: VecDeque::with_capacity(n),
            large_free: Vec::new(),
            large_made: 0,
            large_max: if max_io > KEEP_BUF { (LARGE_BUDGET / max_io).clamp(1, n) } else { 0 },
            completions: Vec::with_capacity(n),
            teardown: false,
            teardown_why: "the host disconnected the controller",
            dhchap: Arc::default(),
            reauth: None,
            reauth_failed: false,
        }
    }

    pub(crate) fn what(&self) -> String {
        format!("{} controller {} queue {} ({})", self.sub.nqn, self.ctrl.cntlid, self.qid, self.peer)
    }

    /// A command arrived in `i` (taken from `free`) with `data` the capsule's in-capsule data:
    /// answered at once if malformed, else ready, or waiting for the host's data.
    pub(crate) fn accept<T: Transport>(&mut self, t: &mut T, i: u16, sqe: Sqe, data: &[u8]) {
        let c = t.command(i);
        c.sqe = sqe;
        c.phase = Phase::Ready;
        c.len = 0;
        c.received = 0;
        c.pending = 0;
        c.next_range = 0;
        c.status = Status::SUCCESS;
        c.flushed = false;
        // Fabrics commands use SGLs (PSDT 01b or 10b, Fabrics 2.1); PRPs mean nothing here.
        if sqe.psdt() == 0 && sqe.opcode() != OPC_FABRICS {
            return self.complete(t, i, Status::generic(SC_INVALID_FIELD));
        }
        // The transfer's direction: the opcode's (or fabrics command type's) low bits (Base
        // 4.2: 01b host to controller, 10b controller to host).
        let dir = if sqe.opcode() == OPC_FABRICS { sqe.fctype() & 3 } else { sqe.opcode() & 3 };
        let sgl = sqe.sgl();
        let len = sgl.length() as usize;
        if dir == 1 && len > 0 {
            match sgl.type_byte() {
                SGL_IN_CAPSULE => {
                    let off = sgl.address();
                    if off.checked_add(len as u64).is_none_or(|end| end > data.len() as u64) {
                        return self.complete(t, i, Status::generic(SC_SGL_DATA_LENGTH_INVALID));
                    }
                    let off = off as usize;
                    let c = t.command(i);
                    c.buffer(len).bytes_mut()[..len].copy_from_slice(&data[off..off + len]);
                    c.len = len;
                    c.received = len;
                }
                SGL_TRANSPORT => {
                    if len > self.max_io {
                        return self.complete(t, i, Status::generic(SC_SGL_DATA_LENGTH_INVALID));
                    }
                    if self.admin.is_none() {
                        if let Err(st) = self.check_io(&sqe) {
                            if !is_auth(&sqe) {
                                return self.complete(t, i, st);
                            }
                        }
                    }
                    t.command(i).len = len;
                    if self.await_buf.is_empty() && self.take_buffer(t, i, len) {
                        t.request_data(i);
                    } else {
                        // Every large buffer is in use: the request goes once one is free.
                        t.command(i).phase = Phase::AwaitBuffer;
                        self.await_buf.push_back(i);
                    }
                    return;
                }
                _ => return self.complete(t, i, Status::generic(SC_SGL_DESCRIPTOR_TYPE_INVALID)),
            }
        }
        self.ready.push_back(i);
    }

    /// The host's data for command `i` is in up to `received`: ready once all of it is.
    #[inline]
    pub(crate) fn data_received<T: Transport>(&mut self, t: &mut T, i: u16) {
        let c = t.command(i);
        if c.received == c.len {
            c.phase = Phase::Ready;
            self.ready.push_back(i);
        }
    }

    /// Starts the ready commands; true when it started or answered any.
    pub(crate) fn start_ready<T: Transport>(&mut self, t: &mut T) -> bool {
        let mut moved = false;
        while let Some(&i) = self.await_buf.front() {
            let len = t.command(i).len;
            if !self.take_buffer(t, i, len) {
                break;
            }
            self.await_buf.pop_front();
            t.request_data(i);
            moved = true;
        }
        while let Some(&i) = self.ready.front() {
            let r = if self.admin.is_some() { self.admin_command(t, i) } else { self.io_command(t, i) };
            match r {
                Err(SubmitError::Busy) => break,
                _ => {
                    self.ready.pop_front();
                    moved = true;
                }
            }
        }
        moved
    }

    /// Command `i` is done (its answer is out, or nobody is there to take it).
    pub(crate) fn release<T: Transport>(&mut self, t: &mut T, i: u16) {
        let c = t.command(i);
        if c.phase == Phase::Free {
            return;
        }
        c.phase = Phase::Free;
        if c.buf.as_ref().is_some_and(|b| b.len() > KEEP_BUF) {
            let large = std::mem::replace(&mut c.buf, c.own.take());
            self.large_free.extend(large);
        }
        self.free.push(i);
    }

    /// Sends command `i`'s completion (after whatever it prepared).
    #[inline]
    pub(crate) fn respond<T: Transport>(&mut self, t: &mut T, i: u16, cqe: Cqe) {
        t.set_completion(i, cqe);
        self.send(t, i);
    }

    #[inline]
    pub(crate) fn complete<T: Transport>(&mut self, t: &mut T, i: u16, status: Status) {
        self.respond(t, i, Cqe::new(0, status));
    }

    #[inline]
    fn send<T: Transport>(&mut self, t: &mut T, i: u16) {
        if !t.send(i) {
            self.release(t, i);
        }
    }

    /// Gives command `i` a data buffer of `len` bytes: its own (kept between commands) up to
    /// [`KEEP_BUF`], else one of the queue's large buffers. False when every large buffer is in
    /// use (the command waits for one).
    pub(crate) fn take_buffer<T: Transport>(&mut self, t: &mut T, i: u16, len: usize) -> bool {
        let c = t.command(i);
        if len <= KEEP_BUF {
            c.buffer(len);
            return true;
        }
        if c.buf.as_ref().is_none_or(|b| b.len() <= KEEP_BUF) {
            let b = match self.large_free.pop() {
                Some(b) => b,
                None if self.large_made < self.large_max => {
                    self.large_made += 1;
                    // Zeroed once, when made; each command then overwrites what it uses.
                    BounceBuf::zeroed(self.max_io)
                }
                None => return false,
            };
            c.own = c.buf.replace(b);
        }
        true
    }

    /// Whether a write waiting for a large buffer can have one now.
    pub(crate) fn large_buffer_available(&self) -> bool {
        !self.large_free.is_empty() || self.large_made < self.large_max
    }

    /// Commands on a channel.
    pub(crate) fn in_flight(&self) -> bool {
        self.ns.iter().flatten().any(|n| n.in_flight > 0)
    }

    /// The queue closes: a parked Asynchronous Event Request has nothing to wait for any
    /// more, and a write still waiting for a buffer to take its data in never gets it (no
    /// data is read any more).
    pub(crate) fn close<T: Transport>(&mut self, t: &mut T) {
        for i in 0..self.commands {
            if t.command(i).phase == Phase::Parked {
                self.release(t, i);
            }
        }
        while let Some(i) = self.await_buf.pop_front() {
            self.complete(t, i, Status::generic(SC_ABORTED_SQ_DELETION));
        }
    }

    /// Drops the commands waiting for a buffer (nobody is there to answer them).
    pub(crate) fn drop_waiting<T: Transport>(&mut self, t: &mut T) {
        while let Some(i) = self.await_buf.pop_front() {
            self.release(t, i);
        }
    }

    /// Drops the commands ready to start (nobody is there to answer them).
    pub(crate) fn drop_ready<T: Transport>(&mut self, t: &mut T) {
        while let Some(i) = self.ready.pop_front() {
            self.release(t, i);
        }
    }

    /// Answers the commands still waiting to start Command Aborted due to SQ Deletion; how
    /// many there were.
    pub(crate) fn abort_ready<T: Transport>(&mut self, t: &mut T) -> usize {
        let n = self.ready.len();
        while let Some(i) = self.ready.pop_front() {
            self.count_error(t.command(i).sqe.nsid());
            self.complete(t, i, Status::generic(SC_ABORTED_SQ_DELETION));
        }
        n
    }

    /// Completes the parked Asynchronous Event Request `cqe` answers.
    pub(crate) fn complete_parked<T: Transport>(&mut self, t: &mut T, cqe: Cqe) {
        let found = (0..self.commands).find(|&i| {
            let c = t.command(i);
            c.phase == Phase::Parked && c.sqe.cid() == cqe.cid
        });
        match found {
            Some(i) => self.respond(t, i, cqe),
            None => log::debug!("{}: an event completion for no parked request", self.what()),
        }
    }

    pub(crate) fn refresh_view(&mut self) {
        let g = self.sub.view_generation.load(Ordering::Acquire);
        if g != self.view_generation {
            self.view_generation = g;
            self.view = self.sub.view_for(&self.ctrl.hostnqn, &self.listen);
        }
    }

    /// Tells the handshakes what the controller allows now.
    pub(crate) fn publish_state(&self) {
        if let Some(c) = &self.admin {
            self.ctrl.ready.store(c.ready(), Ordering::Release);
            self.ctrl.io_queues_allowed.store(c.io_queues_allowed(), Ordering::Release);
        }
    }

    /// Brings the namespace table up to the subsystem's: opens channels of new namespaces,
    /// marks detached ones (dropped once their I/O is done); their completion fds join or leave
    /// `epoll`, the set the queue's poller sleeps on.
    pub(crate) fn reload_namespaces(&mut self, epoll: &Epoll) {
        let g = self.sub.ns_generation.load(Ordering::Acquire);
        if g == self.ns_generation {
            return;
        }
        self.ns_generation = g;
        let now: Vec<(Arc<Namespace>, Option<Status>)> = {
            let st = lock(&self.sub.state);
            st.namespaces.values().map(|n| (n.clone(), st.ana_status(&self.listen, n))).collect()
        };
        for (nsid, slot) in self.ns.iter_mut().enumerate() {
            if let Some(n) = slot {
                match now.iter().find(|(x, _)| Arc::ptr_eq(x, &n.ns)) {
                    Some((_, ana)) => n.ana_refusal = *ana,
                    None => n.removed = true,
                }
            }
            let gone = slot.as_ref().is_some_and(|n| n.removed && n.in_flight == 0);
            if gone {
                if let Some(fd) = slot.as_ref().and_then(|n| n.chan.completion_fd()) {
                    let _ = epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
                }
                *slot = None;
                log::debug!("nvmf: queue {} let namespace {nsid} go", self.qid);
            }
        }
        for (ns, ana_refusal) in now {
            let i = ns.nsid as usize;
            if self.ns.get(i).is_some_and(|n| n.as_ref().is_some_and(|n| Arc::ptr_eq(&n.ns, &ns))) {
                continue;
            }
            if self.ns.get(i).is_some_and(|n| n.is_some()) {
                // The same NSID reattached while the old one drains: keep the old until done.
                self.ns_generation = u64::MAX;
                continue;
            }
            let chan = match ns.bdev.as_disk() {
                Some(d) => d.open_typed(),
                None => ns.bdev.open_channel().map(DiskIo::Device),
            };
            let chan = match chan {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("{}: cannot open a channel to namespace {}: {e}", self.what(), ns.nsid);
                    continue;
                }
            };
            if let Some(fd) = chan.completion_fd() {
                let ev = EpollEvent::new(EventSet::IN, (u64::from(ns.nsid) << 32) | 2);
                let _ = epoll.ctl(ControlOperation::Add, fd, ev);
            }
            if self.ns.len() <= i {
                self.ns.resize_with(i + 1, || None);
            }
            let counters = ns.counters();
            self.ns[i] = Some(NsChan { ns, chan, counters, in_flight: 0, removed: false, ana_refusal });
        }
    }

    /// Gives up the commands to `nsid` that its bdev stack holds parked on Busy: each is
    /// answered Command Abort Requested at the next reap.
    pub(crate) fn give_up_parked(&mut self, nsid: u32, why: &str) -> usize {
        let what = self.what();
        let Some(n) = self.ns.get_mut(nsid as usize).and_then(|n| n.as_mut()) else { return 0 };
        let given_up = n.chan.abort_parked();
        if given_up > 0 {
            log::warn!(
                "nvmf: {what}: namespace {nsid} (bdev '{}'): {given_up} request(s) the device kept refusing \
                 as busy answered aborted as {why}",
                n.ns.bdev_name
            );
        }
        given_up
    }
}
