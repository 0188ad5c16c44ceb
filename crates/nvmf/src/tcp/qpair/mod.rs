//! One queue pair, served by a poller on a reactor: the admin queue of a controller (its
//! commands go to the [`Controller`]) or an I/O queue (Read, Write, Flush, Write Zeroes,
//! Dataset Management on the subsystem's namespaces).
//!
//! Each round it reads what the socket holds (many capsules per read; H2CData payloads
//! straight into the command's buffer), starts the commands, reaps the bdev channels, and sends
//! every finished PDU in one vectored write: a read's data goes from the buffer the bdev filled
//! to the socket without a copy. Commands live in a table of slots (one per submission queue
//! entry) whose buffers are reused, so steady-state I/O allocates nothing. The socket, the
//! channels' completion fds and a timer sit in a private epoll set the reactor watches.
//! Messages from the control plane close the queue, report namespace changes (AER), and wait
//! for a namespace's I/O before it is detached.
//!
//! Here: the queue's state, its setup, namespaces and timers, the control plane's messages and
//! the poller; `receive`, `command` and `send` are the three stages of a round.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::disk::DiskIo;
use fp_bdev::iov::BounceBuf;
use fp_bdev::{BdevError, IoStatus};
use fp_conn::{Interest, Life, Recv, RecvBuf, SendQueue, Sent};
use fp_nvme_spec::tcp::*;
use fp_nvme_spec::*;
use fp_reactor::{PollStatus, Poller, PollerId};
use vmm_sys_util::epoll::{ControlOperation, EpollEvent, EventSet};

use crate::controller::{Controller, ControllerConfig};
use crate::exec::{NsChan, Phase};
use crate::model::SubsystemView;
use crate::options::{ListenAddress, TransportOptions};
use crate::subsystem::{lock, CtrlShared, Namespace, QpairRef, Subsystem};

mod receive;
mod send;

/// The most data one H2CData PDU may carry (MAXH2CDATA), as SPDK offers.
pub(crate) const MAX_H2C_DATA: u32 = 131072;
/// The admin queue's in-capsule data size (TCP 4.1: at least 8 KiB on the admin queue).
pub(crate) const ADMIN_ICD: u32 = 8192;

/// Socket reads per round, so one busy host cannot hold its reactor.
const READS_PER_ROUND: usize = 8;
/// Slot buffers up to this size are kept for the next command; larger transfers take one of
/// the queue's large buffers.
pub(crate) const KEEP_BUF: usize = 1 << 20;
/// The memory a queue may hold in large buffers (each `max_io_size` bytes, made on first use
/// and kept): at least one, so any transfer up to MDTS goes through; a command finding them
/// all in use waits for one, as a command the device refuses as busy.
const LARGE_BUDGET: usize = 32 << 20;
/// How long a host may leave our PDUs unread before the connection is dropped (shorter under
/// test, so the test of it runs in seconds).
const SEND_TIMEOUT: Duration = Duration::from_secs(if cfg!(test) { 3 } else { 30 });
/// How long a closing queue keeps retrying the commands its namespaces' devices refused as
/// busy (and waits for their flushes and further ranges) before it answers them Command
/// Aborted due to SQ Deletion, unless the target says otherwise
/// ([`crate::NvmfTarget::set_close_timeout`]; shorter under test).
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(if cfg!(test) { 1 } else { 5 });
/// The socket send buffer asked for (the kernel caps it at net.core.wmem_max).
const SEND_BUFFER: libc::c_int = 4 << 20;
/// The epoll token of the timer (the socket's is 0, channels' their nsid + 1 << 32).
const TIMER_TOKEN: u64 = 1;

/// What a queue is.
pub(crate) enum Role {
    /// The admin queue: the controller is made on the reactor from this.
    Admin(Box<ControllerConfig>),
    Io,
}

/// What the handshake hands over.
pub(crate) struct QpairSetup {
    pub fd: OwnedFd,
    pub peer: String,
    pub listen: ListenAddress,
    pub sub: Arc<Subsystem>,
    pub ctrl: Arc<CtrlShared>,
    pub role: Role,
    pub qid: u16,
    pub sq_entries: u32,
    /// Connect's CATTR bit 2: the host disabled SQ flow control (SQHD reads 0xFFFF).
    pub sq_flow_disabled: bool,
    pub digests: Digests,
    pub hpda: u8,
    pub transport: TransportOptions,
    /// The target's close bound ([`crate::NvmfTarget::set_close_timeout`]).
    pub close_timeout: Duration,
}

pub(crate) struct Slot {
    pub(crate) sqe: Sqe,
    pub(crate) phase: Phase,
    /// The data buffer in use: the slot's own, or while a large command runs one of the
    /// queue's large buffers (the slot's own then waits in `own`).
    pub(crate) buf: Option<BounceBuf>,
    pub(crate) own: Option<BounceBuf>,
    /// Bytes the command moves (to or from the host).
    pub(crate) len: usize,
    /// H2C bytes received so far.
    pub(crate) received: usize,
    /// Requests in flight (Dataset Management submits one per range).
    pub(crate) pending: u32,
    /// Dataset Management: the next range to submit.
    pub(crate) next_range: u32,
    /// The first error of its requests.
    pub(crate) status: Status,
    pub(crate) flushed: bool,
    /// Its R2T went out whole: H2CData may answer it (not before, so a host guessing tags
    /// cannot complete a command whose R2T still sits in the send queue).
    pub(crate) r2t_out: bool,
    /// Tx: a PDU header (R2T, C2HData) and the data after it, its digest, a response.
    pub(crate) hdr: [u8; HEADER_ROOM],
    pub(crate) hdr_len: usize,
    pub(crate) data_len: usize,
    pub(crate) ddgst: [u8; DIGEST_LEN],
    pub(crate) ddgst_len: usize,
    pub(crate) resp: [u8; HEADER_ROOM],
    pub(crate) resp_len: usize,
    /// Data buffers allocated for it (the tests' `QpairPoller::buffer_allocations`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) allocations: u32,
}

impl Slot {
    pub(crate) fn new() -> Slot {
        Slot {
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
            r2t_out: false,
            hdr: [0; HEADER_ROOM],
            hdr_len: 0,
            data_len: 0,
            ddgst: [0; DIGEST_LEN],
            ddgst_len: 0,
            resp: [0; HEADER_ROOM],
            resp_len: 0,
            allocations: 0,
        }
    }

    /// A data buffer of at least `len` bytes.
    pub(crate) fn buffer(&mut self, len: usize) -> &mut BounceBuf {
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = Some(BounceBuf::zeroed(len.max(512)));
            self.allocations += 1;
        }
        self.buf.as_mut().expect("just made")
    }

    pub(crate) fn pieces(&self) -> [&[u8]; 4] {
        let data = match &self.buf {
            Some(b) => &b.bytes()[..self.data_len],
            None => &[],
        };
        [&self.hdr[..self.hdr_len], data, &self.ddgst[..self.ddgst_len], &self.resp[..self.resp_len]]
    }

    pub(crate) fn tx_len(&self) -> usize {
        self.hdr_len + self.data_len + self.ddgst_len + self.resp_len
    }
}

/// An H2CData PDU whose data is arriving.
#[derive(Clone, Copy)]
struct H2c {
    slot: u16,
    offset: usize,
    len: usize,
    digest: bool,
}

fn epoll_err(e: io::Error) -> BdevError {
    BdevError::Unsupported(format!("epoll: {e}"))
}

/// A queue pair's poller.
pub(crate) struct QpairPoller {
    pub(crate) fd: OwnedFd,
    /// The socket's epoll set, which the timer and the channels' completion fds join.
    pub(crate) interest: Interest,
    pub(crate) timer: fp_sys::Timer,
    pub(crate) next_tick: Option<Instant>,
    pub(crate) peer: String,
    pub(crate) sub: Arc<Subsystem>,
    pub(crate) ctrl: Arc<CtrlShared>,
    pub(crate) qid: u16,
    pub(crate) id: Option<PollerId>,
    /// The admin queue's controller and the view it answers from.
    pub(crate) admin: Option<Box<Controller>>,
    pub(crate) view: Arc<SubsystemView>,
    pub(crate) view_generation: u64,
    pub(crate) ns_generation: u64,
    /// Indexed by NSID.
    pub(crate) ns: Vec<Option<NsChan>>,
    pub(crate) digests: Digests,
    pub(crate) hpda: u8,
    pub(crate) c2h_success: bool,
    pub(crate) icd: usize,
    pub(crate) max_io: usize,
    pub(crate) max_plen: u32,
    pub(crate) sq_entries: u16,
    pub(crate) sqhd: u16,
    pub(crate) sq_flow_disabled: bool,
    pub(crate) slots: Box<[Slot]>,
    pub(crate) free: Vec<u16>,
    pub(crate) ready: VecDeque<u16>,
    /// Writes whose R2T waits for a large buffer, in arrival order.
    pub(crate) await_buf: VecDeque<u16>,
    /// Large buffers not in use; `large_made` of at most `large_max` were made.
    pub(crate) large_free: Vec<BounceBuf>,
    pub(crate) large_made: usize,
    pub(crate) large_max: usize,
    pub(crate) tx: SendQueue<u16>,
    pub(crate) blocked_since: Option<Instant>,
    pub(crate) rx: RecvBuf,
    /// H2C data arriving straight into a slot's buffer.
    h2c: Option<H2c>,
    /// An H2CData's data is in; its digest is still to read.
    h2c_digest: Option<H2c>,
    pub(crate) rx_stalled: bool,
    pub(crate) rx_more: bool,
    pub(crate) completions: Vec<(u32, u32, IoStatus)>,
    /// A C2HTermReq to send before closing.
    pub(crate) term: Option<([u8; DATA_HLEN + TERM_REQ_MAX_DATA], usize)>,
    /// Closing (retrying commands refused as busy until `close_timeout` after it began),
    /// broken (the socket failed), misbehaved (the host broke the protocol).
    pub(crate) life: Life,
    pub(crate) close_timeout: Duration,
    /// The admin queue answered a Disconnect or a shutdown: close once sent.
    pub(crate) teardown: bool,
}

impl QpairPoller {
    pub(crate) fn new(s: QpairSetup, now: Instant) -> Result<QpairPoller, BdevError> {
        if let Err(e) = fp_sys::set_send_buffer(s.fd.as_fd(), SEND_BUFFER) {
            log::debug!("nvmf: SO_SNDBUF: {e}");
        }
        if s.transport.sock_priority > 0 {
            if let Err(e) = fp_sys::set_priority(s.fd.as_fd(), s.transport.sock_priority as libc::c_int) {
                log::warn!("nvmf: {}: SO_PRIORITY {}: {e}", s.peer, s.transport.sock_priority);
            }
        }
        let interest = Interest::new(s.fd.as_fd()).map_err(epoll_err)?;
        // Non-blocking: the tick drains it without ever waiting.
        let timer = fp_sys::Timer::new().map_err(epoll_err)?;
        interest
            .epoll()
            .ctl(ControlOperation::Add, timer.as_raw_fd(), EpollEvent::new(EventSet::IN, TIMER_TOKEN))
            .map_err(epoll_err)?;
        let (admin, icd) = match s.role {
            Role::Admin(cfg) => (
                Some(Box::new(Controller::new(*cfg, now))),
                ADMIN_ICD.max(s.transport.in_capsule_data_size) as usize,
            ),
            Role::Io => (None, s.transport.in_capsule_data_size as usize),
        };
        let max_io = s.transport.max_io_size as usize;
        // A capsule with any PDO (at most 255) and its digests; `parse` holds the data to `icd`.
        let capsule_max = 255 + icd + DIGEST_LEN;
        let max_plen = capsule_max.max(255 + MAX_H2C_DATA as usize + DIGEST_LEN) as u32;
        let n = s.sq_entries.clamp(1, 4096) as usize;
        let view = s.sub.view_for(&s.ctrl.hostnqn);
        let mut p = QpairPoller {
            fd: s.fd,
            interest,
            timer,
            next_tick: None,
            peer: s.peer,
            sub: s.sub.clone(),
            ctrl: s.ctrl,
            qid: s.qid,
            id: None,
            admin,
            view_generation: s.sub.view_generation.load(Ordering::Acquire),
            view,
            ns_generation: u64::MAX,
            ns: Vec::new(),
            digests: s.digests,
            hpda: s.hpda,
            c2h_success: s.transport.c2h_success,
            icd,
            max_io,
            max_plen,
            sq_entries: n as u16,
            // The Connect took the queue's first entry.
            sqhd: (1 % n) as u16,
            sq_flow_disabled: s.sq_flow_disabled,
            slots: (0..n).map(|_| Slot::new()).collect(),
            free: (0..n as u16).rev().collect(),
            ready: VecDeque::with_capacity(n),
            await_buf: VecDeque::with_capacity(n),
            large_free: Vec::new(),
            large_made: 0,
            large_max: if max_io > KEEP_BUF { (LARGE_BUDGET / max_io).clamp(1, n) } else { 0 },
            tx: SendQueue::with_capacity(n + 1),
            blocked_since: None,
            // Room for the largest capsule with any PDO (a byte: at most 255) and its digest.
            rx: RecvBuf::new((64 << 10).max(icd + 512)),
            h2c: None,
            h2c_digest: None,
            rx_stalled: false,
            rx_more: false,
            completions: Vec::with_capacity(n),
            term: None,
            life: Life::new(),
            close_timeout: s.close_timeout,
            teardown: false,
        };
        if p.admin.is_some() {
            p.publish_state();
        } else {
            p.reload_namespaces();
        }
        Ok(p)
    }

    /// Its poller ID, once the reactor added it; the admin queue starts its keep-alive tick.
    pub(crate) fn registered(&mut self, id: PollerId) {
        self.id = Some(id);
        self.arm_keep_alive();
    }

    /// The controller's keep-alive timeout (Connect's KATO or Set Features), if any.
    pub(crate) fn kato(&self) -> Option<Duration> {
        self.admin.as_ref().and_then(|c| c.keep_alive_timeout())
    }

    /// Ticks at a quarter of KATO on the admin queue (they wake a sleeping reactor).
    pub(crate) fn arm_keep_alive(&mut self) {
        if self.next_tick.is_none() && self.kato().is_some() {
            self.set_tick(self.tick_interval());
        }
    }

    /// Arms the timer to fire every `every`.
    pub(crate) fn set_tick(&mut self, every: Duration) {
        if self.timer.every(every).is_ok() {
            self.next_tick = Some(Instant::now() + every);
        }
    }

    pub(crate) fn tick_interval(&self) -> Duration {
        match self.kato() {
            Some(kato) => (kato / 4).clamp(Duration::from_millis(20), Duration::from_secs(1)),
            None => Duration::from_secs(1),
        }
    }

    pub(crate) fn what(&self) -> String {
        format!("{} controller {} queue {} ({})", self.sub.nqn, self.ctrl.cntlid, self.qid, self.peer)
    }

    // ---- messages from the control plane ----

    /// The host is gone (or broke the protocol): closes the queue once its commands in
    /// flight are done. Commands not started are dropped (nobody is there to answer).
    pub(crate) fn close_after(&mut self, why: &str) {
        while let Some(i) = self.await_buf.pop_front() {
            self.release(i);
        }
        self.close_answering(why);
        while let Some(i) = self.ready.pop_front() {
            self.release(i);
        }
    }

    /// Closes the queue once every command it took is answered: those in flight finish,
    /// those waiting to start (a device that answered busy) are retried until
    /// the target's close bound ([`CLOSE_TIMEOUT`] by default), then answered Command Aborted due to SQ Deletion. No new command is
    /// read.
    pub(crate) fn close_answering(&mut self, why: &str) {
        self.life.close(why, self.close_timeout);
        self.h2c = None;
        self.h2c_digest = None;
        // A parked AER has nothing to wait for any more. (A command waiting for H2CData stays
        // as it is: its R2T may still be in the send queue, half sent.)
        for i in 0..self.slots.len() as u16 {
            if self.slots[i as usize].phase == Phase::Parked {
                self.release(i);
            }
        }
        // A write still waiting for a buffer to take its data in never gets it now (no data
        // is read any more).
        while let Some(i) = self.await_buf.pop_front() {
            self.complete(i, Status::generic(SC_ABORTED_SQ_DELETION));
        }
    }

    /// At the close deadline, answers the commands still waiting to start, and gives up the
    /// ones the bdev stack took but keeps refused as busy (they complete Command Abort
    /// Requested at the next reap, as every command parked on Busy at a bound).
    pub(crate) fn abort_waiting(&mut self, now: Instant) {
        if !self.life.past_deadline(now) {
            return;
        }
        if !self.ready.is_empty() {
            log::warn!(
                "nvmf: {}: {} commands the device kept refusing as busy answered aborted at close",
                self.what(),
                self.ready.len()
            );
            while let Some(i) = self.ready.pop_front() {
                self.count_error(i);
                self.complete(i, Status::generic(SC_ABORTED_SQ_DELETION));
            }
        }
        let nsids: Vec<u32> = self
            .ns
            .iter()
            .flatten()
            .filter(|n| n.in_flight > 0 && n.chan.parked() > 0)
            .map(|n| n.ns.nsid)
            .collect();
        for nsid in nsids {
            self.give_up_parked(nsid, "its queue closed");
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

    /// A namespace was attached, detached or resized: the parked AER (if any) completes.
    pub(crate) fn namespace_changed(&mut self, nsid: u32) {
        self.refresh_view();
        let cqe = self.admin.as_mut().and_then(|c| c.namespace_changed(nsid));
        if let Some(cqe) = cqe {
            self.complete_parked(cqe);
        }
    }

    /// The discovery log changed.
    pub(crate) fn discovery_changed(&mut self) {
        self.refresh_view();
        let cqe = self.admin.as_mut().and_then(|c| c.discovery_changed());
        if let Some(cqe) = cqe {
            self.complete_parked(cqe);
        }
    }

    pub(crate) fn complete_parked(&mut self, cqe: Cqe) {
        let found = (0..self.slots.len())
            .find(|&i| self.slots[i].phase == Phase::Parked && self.slots[i].sqe.cid() == cqe.cid);
        match found {
            Some(i) => self.respond(i as u16, cqe),
            None => log::debug!("{}: an event completion for no parked request", self.what()),
        }
    }

    /// Data buffers the queue allocated since it started: a few when it starts, then none
    /// per command.
    #[cfg(test)]
    pub(crate) fn buffer_allocations(&self) -> u64 {
        self.slots.iter().map(|s| u64::from(s.allocations)).sum::<u64>() + self.large_made as u64
    }

    /// Gives slot `i` a data buffer of `len` bytes: its own (kept between commands)
    /// up to [`KEEP_BUF`], else one of the queue's large buffers. False when every large buffer
    /// is in use (the command waits for one).
    pub(crate) fn take_buffer(&mut self, i: u16, len: usize) -> bool {
        if len <= KEEP_BUF {
            self.slots[i as usize].buffer(len);
            return true;
        }
        let s = &mut self.slots[i as usize];
        if s.buf.as_ref().is_none_or(|b| b.len() <= KEEP_BUF) {
            let b = match self.large_free.pop() {
                Some(b) => b,
                None if self.large_made < self.large_max => {
                    self.large_made += 1;
                    // Zeroed once, when made; each command then overwrites what it uses.
                    BounceBuf::zeroed(self.max_io)
                }
                None => return false,
            };
            s.own = s.buf.replace(b);
        }
        true
    }

    /// Whether a write waiting for a large buffer can have one now.
    pub(crate) fn large_buffer_available(&self) -> bool {
        !self.large_free.is_empty() || self.large_made < self.large_max
    }

    /// Reloads the namespaces now and says how many commands to `nsid` are in flight:
    /// `(on the device, parked on Busy in its bdev stack)`. With `give_up`, the parked ones are
    /// given up first and reaped at once (answered Command Abort Requested), so what is left
    /// is on the device.
    pub(crate) fn namespace_in_flight(&mut self, nsid: u32, give_up: bool) -> (u32, u32) {
        self.reload_namespaces();
        if give_up && self.give_up_parked(nsid, "the namespace was removed") > 0 {
            self.reap();
        }
        let Some(n) = self.ns.get(nsid as usize).and_then(|n| n.as_ref()) else { return (0, 0) };
        let parked = (n.chan.parked() as u32).min(n.in_flight);
        (n.in_flight - parked, parked)
    }

    pub(crate) fn refresh_view(&mut self) {
        let g = self.sub.view_generation.load(Ordering::Acquire);
        if g != self.view_generation {
            self.view_generation = g;
            self.view = self.sub.view_for(&self.ctrl.hostnqn);
        }
    }

    /// Brings the namespace table up to the subsystem's: opens channels of new namespaces,
    /// marks detached ones (dropped once their I/O is done).
    pub(crate) fn reload_namespaces(&mut self) {
        let g = self.sub.ns_generation.load(Ordering::Acquire);
        if g == self.ns_generation {
            return;
        }
        self.ns_generation = g;
        let now: Vec<Arc<Namespace>> = lock(&self.sub.state).namespaces.values().cloned().collect();
        for (nsid, slot) in self.ns.iter_mut().enumerate() {
            if let Some(n) = slot {
                if !now.iter().any(|x| Arc::ptr_eq(x, &n.ns)) {
                    n.removed = true;
                }
            }
            let gone = slot.as_ref().is_some_and(|n| n.removed && n.in_flight == 0);
            if gone {
                if let Some(fd) = slot.as_ref().and_then(|n| n.chan.completion_fd()) {
                    let _ = self.interest.epoll().ctl(ControlOperation::Delete, fd, EpollEvent::default());
                }
                *slot = None;
                log::debug!("nvmf: queue {} let namespace {nsid} go", self.qid);
            }
        }
        for ns in now {
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
                let _ = self.interest.epoll().ctl(ControlOperation::Add, fd, ev);
            }
            if self.ns.len() <= i {
                self.ns.resize_with(i + 1, || None);
            }
            let counters = ns.counters();
            self.ns[i] = Some(NsChan { ns, chan, counters, in_flight: 0, removed: false });
        }
    }

    /// Tells the handshakes what the controller allows now.
    pub(crate) fn publish_state(&self) {
        if let Some(c) = &self.admin {
            self.ctrl.ready.store(c.ready(), Ordering::Release);
            self.ctrl.io_queues_allowed.store(c.io_queues_allowed(), Ordering::Release);
        }
    }

    // ---- slots ----

    pub(crate) fn release(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        if s.phase == Phase::Free {
            return;
        }
        s.phase = Phase::Free;
        s.hdr_len = 0;
        s.data_len = 0;
        s.ddgst_len = 0;
        s.resp_len = 0;
        if s.buf.as_ref().is_some_and(|b| b.len() > KEEP_BUF) {
            let large = std::mem::replace(&mut s.buf, s.own.take());
            self.large_free.extend(large);
        }
        self.free.push(i);
    }

    /// Queues the response capsule `cqe` (after whatever the slot already queued).
    pub(crate) fn respond(&mut self, i: u16, mut cqe: Cqe) {
        let s = &mut self.slots[i as usize];
        cqe.cid = s.sqe.cid();
        cqe.sqid = self.qid;
        cqe.sqhd = if self.sq_flow_disabled { 0xFFFF } else { self.sqhd };
        s.resp_len = write_capsule_resp(&mut s.resp, &cqe, self.digests);
        self.queue_tx(i);
    }

    pub(crate) fn complete(&mut self, i: u16, status: Status) {
        self.respond(i, Cqe::new(0, status));
    }

    pub(crate) fn queue_tx(&mut self, i: u16) {
        if self.life.is_broken() {
            return self.release(i);
        }
        self.slots[i as usize].phase = Phase::Sending;
        self.tx.push(i);
    }

    /// Queues `len` bytes of the slot's buffer as one C2HData PDU; `last_success` when the
    /// command succeeded and no response follows (c2h_success).
    pub(crate) fn queue_c2h(&mut self, i: u16, len: usize, success: bool) {
        let s = &mut self.slots[i as usize];
        let mut flags = FLAG_LAST_PDU;
        if success {
            flags |= FLAG_SUCCESS;
        }
        let h = DataHeader { cccid: s.sqe.cid(), ttag: 0, offset: 0, length: len as u32 };
        s.hdr_len = write_c2h_data(&mut s.hdr, &h, flags, self.digests, self.hpda);
        s.data_len = len;
        s.ddgst_len = 0;
        if self.digests.data && len > 0 {
            let b = s.buf.as_ref().expect("a read has its buffer");
            s.ddgst = crc32c(&b.bytes()[..len]).to_le_bytes();
            s.ddgst_len = DIGEST_LEN;
        }
    }
}

impl Poller for QpairPoller {
    fn poll(&mut self) -> PollStatus {
        if self.admin.is_none() && self.sub.ns_generation.load(Ordering::Relaxed) != self.ns_generation {
            self.reload_namespaces();
        }
        let mut busy = self.receive();
        busy |= self.start_ready();
        busy |= self.reap() > 0;
        busy |= self.start_ready();
        busy |= self.send();
        if self.tx.is_blocked() && self.next_tick.is_none() {
            // The host stopped taking our PDUs: tick, so the send timeout is checked even when
            // other queues keep the reactor from sleeping.
            self.set_tick(Duration::from_secs(1));
        }
        if self.next_tick.is_some() {
            self.tick(Instant::now());
        }
        if self.teardown && self.tx.is_empty() && !self.life.is_closing() {
            self.close_answering("the host disconnected the controller");
        }
        if self.life.is_closing() {
            self.abort_waiting(Instant::now());
            busy |= self.send();
        }
        if self.life.is_closing() && self.drained() {
            self.finish_queue();
            return PollStatus::Finished;
        }
        if busy {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    fn has_pending(&self) -> bool {
        (self.in_flight() && !self.ns.iter().flatten().any(|n| n.chan.sleeps_in_flight()))
            || !self.ready.is_empty()
            || (!self.await_buf.is_empty() && self.large_buffer_available())
            || (!self.tx.is_empty() && !self.tx.is_blocked() && !self.life.is_broken())
            || ((self.rx_stalled || self.rx_more) && self.can_accept())
            || (self.life.is_closing() && self.drained())
            || (self.teardown && !self.life.is_closing())
    }

    fn prepare_sleep(&mut self) -> bool {
        let mut want = EventSet::empty();
        if !self.life.is_closing() && self.can_accept() {
            want |= EventSet::IN;
        }
        if self.tx.is_blocked() && !self.life.is_broken() {
            want |= EventSet::OUT;
        }
        self.interest.set(want);
        let mut ok = true;
        for n in self.ns.iter_mut().flatten() {
            ok &= n.chan.arm_completion_fd();
        }
        ok
    }

    fn after_wake(&mut self) {
        for n in self.ns.iter_mut().flatten() {
            n.chan.disarm_completion_fd();
        }
    }

    fn wake_fds(&self) -> Vec<RawFd> {
        vec![self.interest.as_raw_fd()]
    }
}

// ---- messages from the control plane, to queue pairs on their reactors ----

/// Closes queue pairs (once their commands in flight are done).
pub(crate) fn close_qpairs(qpairs: &[QpairRef], why: &'static str) {
    for q in qpairs {
        let id = q.id;
        q.reactor.send(move |r| {
            if let Some(p) = r.poller_mut::<QpairPoller>(id) {
                p.close_answering(why);
            }
        });
    }
}

/// Tells admin queues a namespace changed (their controllers send the AER completion).
pub(crate) fn notify_namespace(admins: &[QpairRef], nsid: u32) {
    for q in admins {
        let id = q.id;
        q.reactor.send(move |r| {
            if let Some(p) = r.poller_mut::<QpairPoller>(id) {
                p.namespace_changed(nsid);
            }
        });
    }
}

/// Tells the discovery subsystem's admin queues that the log changed.
pub(crate) fn notify_discovery(discovery: &Subsystem) {
    let admins: Vec<QpairRef> =
        lock(&discovery.state).controllers.values().filter_map(|c| c.admin.clone()).collect();
    for q in admins {
        let id = q.id;
        q.reactor.send(move |r| {
            if let Some(p) = r.poller_mut::<QpairPoller>(id) {
                p.discovery_changed();
            }
        });
    }
}

/// Waits until no queue pair has I/O in flight to `nsid` (they stopped taking new commands
/// for it when it was detached). Commands parked on Busy in the bdev stack are retried until
/// the deadline and then given up (answered Command Abort Requested); at the deadline, how
/// many commands are still on the device (0: drained).
pub(crate) fn drain_namespace(qpairs: &[QpairRef], nsid: u32, deadline: Instant) -> u32 {
    loop {
        // One deadline for both: the parked commands are given up by this very call, on the
        // queues' reactors, before what is left is counted.
        let give_up = Instant::now() >= deadline;
        let (mut on_device, mut parked) = (0, 0);
        for q in qpairs {
            let id = q.id;
            let (d, p) = q
                .reactor
                .call(move |r| {
                    r.poller_mut::<QpairPoller>(id).map_or((0, 0), |p| p.namespace_in_flight(nsid, give_up))
                })
                .unwrap_or((0, 0));
            on_device += d;
            parked += p;
        }
        if on_device + parked == 0 || give_up {
            return on_device + parked;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
