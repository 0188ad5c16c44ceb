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

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::disk::DiskIo;
use fp_bdev::{AlignedBuf, BdevError, IoOp, IoRequest, IoStatus, SubmitError};
use fp_reactor::{PollStatus, Poller, PollerId};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use crate::controller::{AdminResult, Controller, ControllerConfig};
use crate::model::SubsystemView;
use crate::pdu::*;
use crate::server::{ADMIN_ICD, MAX_H2C_DATA};
use crate::spec::*;
use crate::subsystem::{lock, CtrlShared, Namespace, NsCounters, QpairRef, Subsystem};
use crate::target::{ListenAddress, TransportOptions};

/// Socket reads per round, so one busy host cannot hold its reactor.
const READS_PER_ROUND: usize = 8;
/// PDU pieces gathered into one vectored write.
const IOV_PER_WRITE: usize = 64;
/// Slot buffers up to this size are kept for the next command.
const KEEP_BUF: usize = 1 << 20;
/// How long a host may leave our PDUs unread before the connection is dropped.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Free,
    /// An R2T is out (or queued); the host's H2CData fills the buffer.
    AwaitData,
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

struct Slot {
    sqe: Sqe,
    phase: Phase,
    buf: Option<AlignedBuf>,
    iov: libc::iovec,
    /// Bytes the command moves (to or from the host).
    len: usize,
    /// H2C bytes received so far.
    received: usize,
    /// Requests in flight (Dataset Management submits one per range).
    pending: u32,
    /// Dataset Management: the next range to submit.
    next_range: u32,
    /// The first error of its requests.
    status: Status,
    flushed: bool,
    /// Tx: a PDU header (R2T, C2HData) and the data after it, its digest, a response.
    hdr: [u8; HEADER_ROOM],
    hdr_len: usize,
    data_len: usize,
    ddgst: [u8; DIGEST_LEN],
    ddgst_len: usize,
    resp: [u8; HEADER_ROOM],
    resp_len: usize,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            sqe: Sqe([0; SQE_LEN]),
            phase: Phase::Free,
            buf: None,
            iov: libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 },
            len: 0,
            received: 0,
            pending: 0,
            next_range: 0,
            status: Status::SUCCESS,
            flushed: false,
            hdr: [0; HEADER_ROOM],
            hdr_len: 0,
            data_len: 0,
            ddgst: [0; DIGEST_LEN],
            ddgst_len: 0,
            resp: [0; HEADER_ROOM],
            resp_len: 0,
        }
    }

    /// A data buffer of at least `len` bytes, pointed at by the slot's iovec.
    fn buffer(&mut self, len: usize) -> &mut AlignedBuf {
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = Some(AlignedBuf::zeroed(len.max(512)));
        }
        let b = self.buf.as_mut().expect("just made");
        self.iov = libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: len };
        b
    }

    fn pieces(&self) -> [&[u8]; 4] {
        let data = match &self.buf {
            Some(b) => &b.as_slice()[..self.data_len],
            None => &[],
        };
        [&self.hdr[..self.hdr_len], data, &self.ddgst[..self.ddgst_len], &self.resp[..self.resp_len]]
    }

    fn tx_len(&self) -> usize {
        self.hdr_len + self.data_len + self.ddgst_len + self.resp_len
    }
}

/// A namespace as this queue uses it: its channel and counters.
struct NsChan {
    ns: Arc<Namespace>,
    chan: DiskIo,
    counters: Arc<NsCounters>,
    in_flight: u32,
    /// Detached: new commands get Invalid Namespace; dropped once `in_flight` is 0.
    removed: bool,
}

/// An H2CData PDU whose data is arriving.
#[derive(Clone, Copy)]
struct H2c {
    slot: u16,
    offset: usize,
    len: usize,
    digest: bool,
}

enum Recv {
    Data(usize),
    WouldBlock,
    Eof,
    Failed(String),
}

fn recv(fd: BorrowedFd<'_>, dst: &mut [u8]) -> Recv {
    match fp_sys::recv_nonblocking(fd, dst) {
        Ok(0) => Recv::Eof,
        Ok(n) => Recv::Data(n),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
            Recv::WouldBlock
        }
        Err(e) => Recv::Failed(e.to_string()),
    }
}

/// Sends what the socket takes now; `Ok(0)` when it is full.
fn send(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    match fp_sys::send_vectored_nonblocking(fd, bufs) {
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(0),
        r => r,
    }
}

fn epoll_err(e: io::Error) -> BdevError {
    BdevError::Unsupported(format!("epoll: {e}"))
}

/// A queue pair's poller.
pub(crate) struct QpairPoller {
    fd: OwnedFd,
    epoll: Epoll,
    interest: EventSet,
    timer: TimerFd,
    next_tick: Option<Instant>,
    peer: String,
    sub: Arc<Subsystem>,
    ctrl: Arc<CtrlShared>,
    qid: u16,
    id: Option<PollerId>,
    /// The admin queue's controller and the view it answers from.
    admin: Option<Box<Controller>>,
    view: Arc<SubsystemView>,
    view_generation: u64,
    ns_generation: u64,
    /// Indexed by NSID.
    ns: Vec<Option<NsChan>>,
    digests: Digests,
    hpda: u8,
    c2h_success: bool,
    icd: usize,
    max_io: usize,
    max_plen: u32,
    sq_entries: u16,
    sqhd: u16,
    sq_flow_disabled: bool,
    slots: Box<[Slot]>,
    free: Vec<u16>,
    ready: VecDeque<u16>,
    tx: VecDeque<u16>,
    tx_sent: usize,
    tx_blocked: bool,
    blocked_since: Option<Instant>,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    /// H2C data arriving straight into a slot's buffer.
    h2c: Option<H2c>,
    /// An H2CData's data is in; its digest is still to read.
    h2c_digest: Option<H2c>,
    rx_stalled: bool,
    rx_more: bool,
    completions: Vec<(u32, u32, IoStatus)>,
    /// A C2HTermReq to send before closing.
    term: Option<([u8; DATA_HLEN + TERM_REQ_MAX_DATA], usize)>,
    closing: Option<String>,
    broken: bool,
    misbehaved: bool,
    /// The admin queue answered a Disconnect or a shutdown: close once sent.
    teardown: bool,
}

impl QpairPoller {
    pub(crate) fn new(s: QpairSetup, now: Instant) -> Result<QpairPoller, BdevError> {
        if let Err(e) = fp_sys::set_send_buffer(s.fd.as_fd(), SEND_BUFFER) {
            log::debug!("nvmf: SO_SNDBUF: {e}");
        }
        let epoll = Epoll::new().map_err(epoll_err)?;
        epoll
            .ctl(ControlOperation::Add, s.fd.as_raw_fd(), EpollEvent::new(EventSet::IN, 0))
            .map_err(epoll_err)?;
        let timer = TimerFd::new().map_err(|e| epoll_err(io::Error::from_raw_os_error(e.errno())))?;
        // SAFETY: the timer's fd is open for the duration of the call (`timer` owns it).
        let timer_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(timer.as_raw_fd()) };
        // Non-blocking: the tick drains it without ever waiting.
        fp_sys::set_nonblocking(timer_fd).map_err(epoll_err)?;
        epoll
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
        let view = s.sub.view();
        let mut p = QpairPoller {
            fd: s.fd,
            epoll,
            interest: EventSet::IN,
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
            tx: VecDeque::with_capacity(n + 1),
            tx_sent: 0,
            tx_blocked: false,
            blocked_since: None,
            // Room for the largest capsule with any PDO (a byte: at most 255) and its digest.
            rx: vec![0u8; (64 << 10).max(icd + 512)].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            h2c: None,
            h2c_digest: None,
            rx_stalled: false,
            rx_more: false,
            completions: Vec::with_capacity(n),
            term: None,
            closing: None,
            broken: false,
            misbehaved: false,
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
    fn kato(&self) -> Option<Duration> {
        self.admin.as_ref().and_then(|c| c.keep_alive_timeout())
    }

    /// Ticks at a quarter of KATO on the admin queue (they wake a sleeping reactor).
    fn arm_keep_alive(&mut self) {
        if self.next_tick.is_none() && self.kato().is_some() {
            self.set_tick(self.tick_interval());
        }
    }

    /// Arms the timer to fire every `every`.
    fn set_tick(&mut self, every: Duration) {
        if self.timer.reset(every, Some(every)).is_ok() {
            self.next_tick = Some(Instant::now() + every);
        }
    }

    fn tick_interval(&self) -> Duration {
        match self.kato() {
            Some(kato) => (kato / 4).clamp(Duration::from_millis(20), Duration::from_secs(1)),
            None => Duration::from_secs(1),
        }
    }

    fn what(&self) -> String {
        format!("{} controller {} queue {} ({})", self.sub.nqn, self.ctrl.cntlid, self.qid, self.peer)
    }

    // ---- messages from the control plane ----

    /// Closes the queue once its commands in flight are done.
    pub(crate) fn close_after(&mut self, why: &str) {
        if self.closing.is_none() {
            self.closing = Some(why.to_string());
        }
        self.h2c = None;
        self.h2c_digest = None;
        // Commands not started are dropped; those in flight finish first.
        for i in 0..self.slots.len() as u16 {
            if matches!(self.slots[i as usize].phase, Phase::AwaitData | Phase::Parked) {
                self.release(i);
            }
        }
        while let Some(i) = self.ready.pop_front() {
            self.release(i);
        }
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

    fn complete_parked(&mut self, cqe: Cqe) {
        let found = (0..self.slots.len())
            .find(|&i| self.slots[i].phase == Phase::Parked && self.slots[i].sqe.cid() == cqe.cid);
        match found {
            Some(i) => self.respond(i as u16, cqe),
            None => log::debug!("{}: an event completion for no parked request", self.what()),
        }
    }

    /// Reloads the namespaces now and says how many commands of `nsid` are in flight.
    pub(crate) fn namespace_in_flight(&mut self, nsid: u32) -> u32 {
        self.reload_namespaces();
        self.ns.get(nsid as usize).and_then(|n| n.as_ref()).map_or(0, |n| n.in_flight)
    }

    fn refresh_view(&mut self) {
        let g = self.sub.view_generation.load(Ordering::Acquire);
        if g != self.view_generation {
            self.view_generation = g;
            self.view = self.sub.view();
        }
    }

    /// Brings the namespace table up to the subsystem's: opens channels of new namespaces,
    /// marks detached ones (dropped once their I/O is done).
    fn reload_namespaces(&mut self) {
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
                    let _ = self.epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
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
                let _ = self.epoll.ctl(ControlOperation::Add, fd, ev);
            }
            if self.ns.len() <= i {
                self.ns.resize_with(i + 1, || None);
            }
            let counters = ns.counters();
            self.ns[i] = Some(NsChan { ns, chan, counters, in_flight: 0, removed: false });
        }
    }

    /// Tells the handshakes what the controller allows now.
    fn publish_state(&self) {
        if let Some(c) = &self.admin {
            self.ctrl.ready.store(c.ready(), Ordering::Release);
            self.ctrl.io_queues_allowed.store(c.io_queues_allowed(), Ordering::Release);
        }
    }

    // ---- slots ----

    fn release(&mut self, i: u16) {
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
            s.buf = None;
        }
        self.free.push(i);
    }

    /// Queues the response capsule `cqe` (after whatever the slot already queued).
    fn respond(&mut self, i: u16, mut cqe: Cqe) {
        let s = &mut self.slots[i as usize];
        cqe.cid = s.sqe.cid();
        cqe.sqid = self.qid;
        cqe.sqhd = if self.sq_flow_disabled { 0xFFFF } else { self.sqhd };
        s.resp_len = write_capsule_resp(&mut s.resp, &cqe, self.digests);
        self.queue_tx(i);
    }

    fn complete(&mut self, i: u16, status: Status) {
        self.respond(i, Cqe::new(0, status));
    }

    fn queue_tx(&mut self, i: u16) {
        if self.broken {
            return self.release(i);
        }
        self.slots[i as usize].phase = Phase::Sending;
        self.tx.push_back(i);
    }

    /// Queues `len` bytes of the slot's buffer as one C2HData PDU; `last_success` when the
    /// command succeeded and no response follows (c2h_success).
    fn queue_c2h(&mut self, i: u16, len: usize, success: bool) {
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
            s.ddgst = crc32c(&b.as_slice()[..len]).to_le_bytes();
            s.ddgst_len = DIGEST_LEN;
        }
    }

    // ---- receiving ----

    fn can_accept(&self) -> bool {
        self.closing.is_none() && !self.free.is_empty()
    }

    /// A fatal transport error: a C2HTermReq echoing the offending header, then close.
    fn terminate(&mut self, err: PduError, header_len: usize) {
        let mut b = [0u8; DATA_HLEN + TERM_REQ_MAX_DATA];
        let hdr = &self.rx[self.rx_start..self.rx_start + header_len.min(self.rx_end - self.rx_start)];
        let n = write_c2h_term_req(&mut b, &err, hdr);
        self.term = Some((b, n));
        self.misbehaved = true;
        self.close_after(&format!("{err}: terminated"));
    }

    fn receive(&mut self) -> bool {
        let mut moved = false;
        self.rx_stalled = false;
        self.rx_more = false;
        for _ in 0..READS_PER_ROUND {
            if self.closing.is_some() {
                return moved;
            }
            if let Some(h) = self.h2c {
                let s = &mut self.slots[h.slot as usize];
                // The offset was checked to continue what arrived: `received` is where we are.
                let (start, end) = (s.received, h.offset + h.len);
                let dst = &mut s.buf.as_mut().expect("a write awaiting data has a buffer").as_mut_slice()
                    [start..end];
                match recv(self.fd.as_fd(), dst) {
                    Recv::Data(n) => {
                        moved = true;
                        self.slots[h.slot as usize].received += n;
                        if start + n == end {
                            self.h2c = None;
                            self.h2c_done(h);
                        }
                        continue;
                    }
                    Recv::WouldBlock => return moved,
                    Recv::Eof => {
                        self.misbehaved = true;
                        self.close_after("host disconnected in the middle of a data PDU");
                        return true;
                    }
                    Recv::Failed(e) => {
                        self.fail(&e);
                        return true;
                    }
                }
            }
            if !self.parse() {
                self.rx_stalled = true;
                return moved;
            }
            if self.h2c.is_some() || self.closing.is_some() {
                moved = true;
                continue;
            }
            if self.rx_start > 0 {
                self.rx.copy_within(self.rx_start..self.rx_end, 0);
                self.rx_end -= self.rx_start;
                self.rx_start = 0;
            }
            let end = self.rx_end;
            match recv(self.fd.as_fd(), &mut self.rx[end..]) {
                Recv::Data(n) => {
                    self.rx_end += n;
                    moved = true;
                }
                Recv::WouldBlock => return moved,
                Recv::Eof => {
                    self.misbehaved = self.rx_end > self.rx_start;
                    let why = if self.misbehaved {
                        "host disconnected in the middle of a PDU"
                    } else {
                        "host disconnected"
                    };
                    self.close_after(why);
                    return true;
                }
                Recv::Failed(e) => {
                    self.fail(&e);
                    return true;
                }
            }
        }
        self.rx_more = true;
        moved
    }

    /// The socket failed: nothing more is sent; wait for the channels, then close.
    fn fail(&mut self, why: &str) {
        self.close_after(why);
        self.broken = true;
        self.term = None;
        while let Some(i) = self.tx.pop_front() {
            self.release(i);
        }
        self.tx_sent = 0;
    }

    /// Takes the complete PDUs out of the receive buffer. False when it stopped for lack of a
    /// slot (the host sent more commands than its queue holds, or we are slow).
    fn parse(&mut self) -> bool {
        loop {
            if self.closing.is_some() {
                return true;
            }
            let avail = self.rx_end - self.rx_start;
            if let Some(h) = self.h2c_digest {
                if avail < DIGEST_LEN {
                    return true;
                }
                let d = &self.rx[self.rx_start..self.rx_start + DIGEST_LEN];
                let b = self.slots[h.slot as usize].buf.as_ref().expect("has a buffer");
                let ok = crc32c(&b.as_slice()[h.offset..h.offset + h.len]).to_le_bytes() == d;
                self.rx_start += DIGEST_LEN;
                self.h2c_digest = None;
                if !ok {
                    self.misbehaved = true;
                    self.close_after("H2CData data digest mismatch");
                    return true;
                }
                self.h2c_finished(h);
                continue;
            }
            if avail < CH_LEN {
                return true;
            }
            let ch = CommonHeader::parse(
                self.rx[self.rx_start..self.rx_start + CH_LEN].try_into().expect("eight"),
            );
            let l = match check_header(&ch, self.digests, 0, self.max_plen) {
                Ok(l) => l,
                Err(e) => {
                    self.terminate(e, usize::from(ch.hlen).clamp(CH_LEN, MAX_HLEN));
                    return true;
                }
            };
            match ch.pdu_type {
                PDU_CAPSULE_CMD => {
                    if l.data_len > self.icd {
                        let e = PduError {
                            fes: FES_DATA_LIMIT_EXCEEDED,
                            fei: 4,
                            what: "in-capsule data over IOCCSZ",
                        };
                        self.terminate(e, l.header_len);
                        return true;
                    }
                    if avail < l.plen() {
                        return true;
                    }
                    if !self.can_accept() {
                        return false;
                    }
                    if !self.header_ok(&l) {
                        return true;
                    }
                    let p = self.rx_start;
                    if l.data_digest {
                        let data = &self.rx[p + l.data_offset..p + l.data_offset + l.data_len];
                        let d = &self.rx[p + l.data_offset + l.data_len..p + l.plen()];
                        if crc32c(data).to_le_bytes() != d {
                            self.misbehaved = true;
                            self.close_after("capsule data digest mismatch");
                            return true;
                        }
                    }
                    let sqe = capsule_sqe(&self.rx[p..p + CAPSULE_CMD_HLEN]).expect("a capsule header");
                    let i = self.free.pop().expect("can_accept checked");
                    self.capsule(i, sqe, p + l.data_offset, l.data_len);
                    self.rx_start += l.plen();
                }
                PDU_H2C_DATA => {
                    if avail < l.data_offset {
                        return true;
                    }
                    if !self.header_ok(&l) {
                        return true;
                    }
                    let h = DataHeader::parse(&self.rx[self.rx_start..]).expect("a data header");
                    let Some(h2c) = self.check_h2c(&h, &l) else { return true };
                    self.rx_start += l.data_offset;
                    let have = (self.rx_end - self.rx_start).min(h2c.len);
                    let s = &mut self.slots[h2c.slot as usize];
                    let b = s.buf.as_mut().expect("a write awaiting data has a buffer");
                    b.as_mut_slice()[h2c.offset..h2c.offset + have]
                        .copy_from_slice(&self.rx[self.rx_start..self.rx_start + have]);
                    s.received += have;
                    self.rx_start += have;
                    if have == h2c.len {
                        self.h2c_done(h2c);
                    } else {
                        self.h2c = Some(h2c);
                        return true;
                    }
                }
                PDU_H2C_TERM_REQ => {
                    if avail < l.plen() {
                        return true;
                    }
                    let t = TermReq::parse(&self.rx[self.rx_start..]).expect("a term header");
                    self.misbehaved = true;
                    self.close_after(&format!(
                        "host terminated the connection (FES {:#x}, FEI {})",
                        t.fes, t.fei
                    ));
                    return true;
                }
                _ => {
                    let e = PduError {
                        fes: FES_PDU_SEQUENCE_ERROR,
                        fei: 0,
                        what: "a PDU a host may not send now",
                    };
                    self.terminate(e, l.header_len.min(MAX_HLEN));
                    return true;
                }
            }
        }
    }

    /// Checks the header digest of the PDU at the front of the receive buffer.
    fn header_ok(&mut self, l: &Layout) -> bool {
        let hlen = usize::from(l.ch.hlen);
        if l.header_len == hlen
            || header_digest_ok(&self.rx[self.rx_start..self.rx_start + l.header_len], hlen)
        {
            return true;
        }
        let e = PduError { fes: FES_HEADER_DIGEST_ERROR, fei: 0, what: "header digest mismatch" };
        self.terminate(e, l.header_len);
        false
    }

    /// Checks an H2CData against the R2T it answers (TCP 3.6.2.7): the tag names a command
    /// waiting for data, the offset continues what arrived, the length fits MAXH2CDATA and
    /// the command's transfer.
    fn check_h2c(&mut self, h: &DataHeader, l: &Layout) -> Option<H2c> {
        let bad = |fes, fei, what| PduError { fes, fei, what };
        let slot = self.slots.get(h.ttag as usize);
        let err = match slot {
            None => Some(bad(FES_INVALID_HEADER_FIELD, 10, "H2CData with an unknown transfer tag")),
            Some(s) if s.phase != Phase::AwaitData || s.sqe.cid() != h.cccid => {
                Some(bad(FES_INVALID_HEADER_FIELD, 8, "H2CData for no R2T outstanding"))
            }
            Some(_) if h.length as usize != l.data_len || h.length == 0 => {
                Some(bad(FES_INVALID_HEADER_FIELD, 16, "H2CData DATAL does not match its PDU"))
            }
            Some(_) if h.length > MAX_H2C_DATA => {
                Some(bad(FES_DATA_LIMIT_EXCEEDED, 16, "H2CData over MAXH2CDATA"))
            }
            Some(s) if h.offset as usize != s.received => {
                Some(bad(FES_DATA_OUT_OF_RANGE, 12, "H2CData offset out of order"))
            }
            Some(s) if h.offset as usize + h.length as usize > s.len => {
                Some(bad(FES_DATA_OUT_OF_RANGE, 16, "H2CData past the R2T's length"))
            }
            Some(_) => None,
        };
        if let Some(e) = err {
            self.terminate(e, l.header_len);
            return None;
        }
        Some(H2c { slot: h.ttag, offset: h.offset as usize, len: h.length as usize, digest: l.data_digest })
    }

    /// An H2CData's data is in: its digest next, or done.
    fn h2c_done(&mut self, h: H2c) {
        if h.digest {
            self.h2c_digest = Some(h);
        } else {
            self.h2c_finished(h);
        }
    }

    fn h2c_finished(&mut self, h: H2c) {
        let s = &mut self.slots[h.slot as usize];
        if s.received == s.len {
            s.phase = Phase::Ready;
            self.ready.push_back(h.slot);
        }
    }

    /// A command capsule arrived in slot `i`; its in-capsule data is `rx[data..data + len]`.
    fn capsule(&mut self, i: u16, sqe: Sqe, data: usize, data_len: usize) {
        self.sqhd = (self.sqhd + 1) % self.sq_entries;
        let s = &mut self.slots[i as usize];
        s.sqe = sqe;
        s.phase = Phase::Ready;
        s.len = 0;
        s.received = 0;
        s.pending = 0;
        s.next_range = 0;
        s.status = Status::SUCCESS;
        s.flushed = false;
        s.hdr_len = 0;
        s.data_len = 0;
        s.ddgst_len = 0;
        s.resp_len = 0;
        // Fabrics commands use SGLs (PSDT 01b or 10b, Fabrics 2.1); PRPs mean nothing here.
        if sqe.psdt() == 0 && sqe.opcode() != OPC_FABRICS {
            return self.complete(i, Status::generic(SC_INVALID_FIELD));
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
                    if off.checked_add(len as u64).is_none_or(|end| end > data_len as u64) {
                        return self.complete(i, Status::generic(SC_SGL_DATA_LENGTH_INVALID));
                    }
                    let off = off as usize;
                    let b = s.buffer(len);
                    b.as_mut_slice()[..len].copy_from_slice(&self.rx[data + off..data + off + len]);
                    s.len = len;
                    s.received = len;
                }
                SGL_TRANSPORT => {
                    if len > self.max_io {
                        return self.complete(i, Status::generic(SC_SGL_DATA_LENGTH_INVALID));
                    }
                    if self.admin.is_none() {
                        if let Err(st) = self.check_io(i) {
                            return self.complete(i, st);
                        }
                    }
                    let s = &mut self.slots[i as usize];
                    s.buffer(len);
                    s.len = len;
                    s.phase = Phase::AwaitData;
                    let r2t = DataHeader { cccid: sqe.cid(), ttag: i, offset: 0, length: len as u32 };
                    s.hdr_len = write_r2t(&mut s.hdr, &r2t, self.digests);
                    self.tx.push_back(i);
                    return;
                }
                _ => return self.complete(i, Status::generic(SC_SGL_DESCRIPTOR_TYPE_INVALID)),
            }
        }
        self.ready.push_back(i);
    }

    // ---- commands ----

    /// Starts the ready commands; true when it started or answered any.
    fn start_ready(&mut self) -> bool {
        let mut moved = false;
        while let Some(&i) = self.ready.front() {
            let r = if self.admin.is_some() { self.admin_command(i) } else { self.io_command(i) };
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

    fn admin_command(&mut self, i: u16) -> Result<(), SubmitError> {
        let sqe = self.slots[i as usize].sqe;
        if sqe.opcode() == OPC_FABRICS && sqe.fctype() == FCTYPE_CONNECT {
            self.complete(i, Status::generic(SC_COMMAND_SEQUENCE_ERROR));
            return Ok(());
        }
        self.refresh_view();
        let s = &self.slots[i as usize];
        let data_in: &[u8] = match (&s.buf, s.len) {
            (Some(b), n) if n > 0 && s.received == n => &b.as_slice()[..n],
            _ => &[],
        };
        let ctrl = self.admin.as_mut().expect("an admin queue");
        let r = ctrl.admin(&sqe, data_in, &self.view, Instant::now());
        self.publish_state();
        self.arm_keep_alive();
        match r {
            AdminResult::Parked => {
                self.slots[i as usize].phase = Phase::Parked;
            }
            AdminResult::Complete { cqe, data } => self.admin_reply(i, cqe, &data),
            AdminResult::Complete2 { cqe, teardown } => {
                self.respond(i, cqe);
                if teardown {
                    self.teardown = true;
                }
            }
        }
        Ok(())
    }

    /// Sends an admin command's data (at most what its SGL asks) and its completion.
    fn admin_reply(&mut self, i: u16, cqe: Cqe, data: &[u8]) {
        let sgl = self.slots[i as usize].sqe.sgl();
        let n = data.len().min(sgl.length() as usize);
        if n > 0 && cqe.status.is_success() && sgl.type_byte() == SGL_TRANSPORT {
            let s = &mut self.slots[i as usize];
            s.buffer(n).as_mut_slice()[..n].copy_from_slice(&data[..n]);
            self.queue_c2h(i, n, false);
        }
        self.respond(i, cqe);
    }

    /// The namespace a command names, if attached.
    fn namespace(&self, nsid: u32) -> Option<&NsChan> {
        self.ns.get(nsid as usize).and_then(|n| n.as_ref()).filter(|n| !n.removed)
    }

    /// Checks an I/O command before its data is asked for: namespace, range, size, access.
    fn check_io(&mut self, i: u16) -> Result<(), Status> {
        let sqe = self.slots[i as usize].sqe;
        let op = sqe.opcode();
        if op == OPC_FABRICS {
            return Err(Status::generic(if sqe.fctype() == FCTYPE_CONNECT {
                SC_COMMAND_SEQUENCE_ERROR
            } else {
                SC_INVALID_OPCODE
            }));
        }
        if !matches!(op, NVM_READ | NVM_WRITE | NVM_FLUSH | NVM_WRITE_ZEROES | NVM_DATASET_MANAGEMENT) {
            return Err(Status::generic(SC_INVALID_OPCODE));
        }
        let ns = self.namespace(sqe.nsid()).ok_or(Status::generic(SC_INVALID_NAMESPACE))?;
        let info = ns.ns.bdev.info();
        let writes = matches!(op, NVM_WRITE | NVM_WRITE_ZEROES | NVM_DATASET_MANAGEMENT);
        if writes && (ns.ns.read_only || ns.ns.bdev.read_only() || !info.io_types.write) {
            return Err(Status::generic(SC_NAMESPACE_WRITE_PROTECTED));
        }
        if matches!(op, NVM_READ | NVM_WRITE | NVM_WRITE_ZEROES) {
            let nlb = u64::from(sqe.nlb());
            if sqe.slba().checked_add(nlb).is_none_or(|end| end > info.num_blocks()) {
                return Err(Status::generic(SC_LBA_OUT_OF_RANGE));
            }
            if op != NVM_WRITE_ZEROES {
                let len = nlb * u64::from(info.block_size);
                if len > self.max_io as u64 {
                    return Err(Status::generic(SC_INVALID_FIELD));
                }
                if u64::from(sqe.sgl().length()) != len {
                    return Err(Status::generic(SC_SGL_DATA_LENGTH_INVALID));
                }
            }
        }
        if op == NVM_DATASET_MANAGEMENT {
            let ranges = (sqe.cdw(10) & 0xFF) as usize + 1;
            if (sqe.sgl().length() as usize) < ranges * 16 {
                return Err(Status::generic(SC_SGL_DATA_LENGTH_INVALID));
            }
        }
        Ok(())
    }

    fn io_command(&mut self, i: u16) -> Result<(), SubmitError> {
        // Checked again (a write's before its R2T too): the namespace may have gone since.
        if let Err(st) = self.check_io(i) {
            self.count_error(i);
            self.complete(i, st);
            return Ok(());
        }
        let sqe = self.slots[i as usize].sqe;
        let nsid = sqe.nsid();
        let ns = self.ns[nsid as usize].as_ref().expect("checked");
        let info = ns.ns.bdev.info();
        let bs = u64::from(info.block_size);
        let (offset, len) = (sqe.slba() * bs, u64::from(sqe.nlb()) * bs);
        match sqe.opcode() {
            NVM_READ => {
                self.slots[i as usize].buffer(len as usize);
                self.slots[i as usize].len = len as usize;
                self.submit(i, nsid, IoOp::Read, offset, len)
            }
            NVM_WRITE if self.slots[i as usize].flushed => {
                // A FUA write's flush the channel was too busy for.
                self.slots[i as usize].phase = Phase::Flushing;
                self.submit(i, nsid, IoOp::Flush, 0, 0)
            }
            NVM_WRITE => {
                let s = &mut self.slots[i as usize];
                s.iov.iov_len = len as usize;
                self.submit(i, nsid, IoOp::Write, offset, len)
            }
            NVM_FLUSH if !info.io_types.flush => {
                self.finish(i, Status::SUCCESS);
                Ok(())
            }
            NVM_FLUSH => self.submit(i, nsid, IoOp::Flush, 0, 0),
            NVM_WRITE_ZEROES if !info.io_types.write_zeroes => {
                self.complete(i, Status::generic(SC_INVALID_OPCODE));
                Ok(())
            }
            NVM_WRITE_ZEROES => self.submit(i, nsid, IoOp::WriteZeroes, offset, len),
            NVM_DATASET_MANAGEMENT => self.deallocate(i, nsid),
            _ => unreachable!("check_io accepts only these"),
        }
    }

    /// Dataset Management: with the Deallocate attribute, one unmap per range (Base 7.2,
    /// NVM Command Set 3.2.3); without, nothing to do.
    fn deallocate(&mut self, i: u16, nsid: u32) -> Result<(), SubmitError> {
        let sqe = self.slots[i as usize].sqe;
        let ns = self.ns[nsid as usize].as_ref().expect("checked");
        let info = ns.ns.bdev.info();
        let ranges = (sqe.cdw(10) & 0xFF) + 1;
        if sqe.cdw(11) & (1 << 2) == 0 || !info.io_types.unmap {
            self.finish(i, Status::SUCCESS);
            return Ok(());
        }
        let bs = u64::from(info.block_size);
        let blocks = info.num_blocks();
        while self.slots[i as usize].next_range < ranges {
            let r = self.slots[i as usize].next_range as usize;
            let b = &self.slots[i as usize].buf.as_ref().expect("DSM data").as_slice()[r * 16..r * 16 + 16];
            let nlb = u64::from(u32::from_le_bytes(b[4..8].try_into().expect("four")));
            let slba = u64::from_le_bytes(b[8..16].try_into().expect("eight"));
            self.slots[i as usize].next_range += 1;
            if nlb == 0 {
                continue;
            }
            if slba.checked_add(nlb).is_none_or(|e| e > blocks) {
                self.slots[i as usize].status = Status::generic(SC_LBA_OUT_OF_RANGE);
                break;
            }
            if let Err(e) = self.submit(i, nsid, IoOp::Discard, slba * bs, nlb * bs) {
                if e == SubmitError::Busy {
                    self.slots[i as usize].next_range -= 1;
                    if self.slots[i as usize].pending == 0 {
                        return Err(e);
                    }
                }
                // Requests already in flight finish the command; the rest is not retried.
                break;
            }
        }
        if self.slots[i as usize].pending == 0 {
            let st = self.slots[i as usize].status;
            self.finish(i, st);
        }
        Ok(())
    }

    fn submit(&mut self, i: u16, nsid: u32, op: IoOp, offset: u64, len: u64) -> Result<(), SubmitError> {
        let data = matches!(op, IoOp::Read | IoOp::Write);
        let s = &mut self.slots[i as usize];
        let req = IoRequest {
            tag: u32::from(i),
            op,
            offset,
            len,
            iov: if data { &s.iov } else { std::ptr::null() },
            iovcnt: u32::from(data),
        };
        let ns = self.ns[nsid as usize].as_mut().expect("checked");
        // SAFETY: the iovec lives in the slot table (a boxed slice that never moves) and points
        // at the slot's buffer; neither changes until the slot's completions are reaped.
        match unsafe { ns.chan.submit(&req) } {
            Ok(()) => {
                ns.in_flight += 1;
                s.pending += 1;
                if s.phase != Phase::Flushing {
                    s.phase = Phase::Submitted;
                }
                Ok(())
            }
            Err(SubmitError::Busy) => Err(SubmitError::Busy),
            Err(e) => {
                let st = match e {
                    SubmitError::OutOfRange => Status::generic(SC_LBA_OUT_OF_RANGE),
                    _ => Status::generic(SC_INVALID_OPCODE),
                };
                if s.pending == 0 {
                    self.count_error(i);
                    self.complete(i, st);
                } else {
                    s.status = st;
                }
                Err(e)
            }
        }
    }

    fn count_error(&mut self, i: u16) {
        let nsid = self.slots[i as usize].sqe.nsid();
        if let Some(Some(n)) = self.ns.get(nsid as usize) {
            NsCounters::bump(&n.counters.errors, 1);
        }
    }

    /// Reaps every channel's completions.
    fn reap(&mut self) -> usize {
        let mut done = std::mem::take(&mut self.completions);
        let mut n = 0;
        for (nsid, slot) in self.ns.iter_mut().enumerate() {
            let Some(ns) = slot else { continue };
            if ns.in_flight == 0 {
                continue;
            }
            let got = ns.chan.poll(&mut |tag: u32, st: IoStatus| done.push((nsid as u32, tag, st)));
            ns.in_flight -= got as u32;
            n += got;
        }
        for &(_, tag, st) in &done {
            self.completed(tag as u16, st);
        }
        done.clear();
        self.completions = done;
        if n > 0 && self.ns.iter().flatten().any(|n| n.removed && n.in_flight == 0) {
            self.ns_generation = u64::MAX;
        }
        n
    }

    fn completed(&mut self, i: u16, st: IoStatus) {
        let s = &mut self.slots[i as usize];
        s.pending -= 1;
        let op = s.sqe.opcode();
        if st != IoStatus::Success && s.status.is_success() {
            s.status = match st {
                IoStatus::Unsupported => Status::generic(SC_INVALID_OPCODE),
                IoStatus::Error(e) => status_of_errno(e, op),
                IoStatus::Success => Status::SUCCESS,
            };
        }
        if s.pending > 0 {
            return;
        }
        if op == NVM_DATASET_MANAGEMENT && s.status.is_success() {
            let ranges = (s.sqe.cdw(10) & 0xFF) + 1;
            if s.next_range < ranges {
                s.phase = Phase::Ready;
                self.ready.push_back(i);
                return;
            }
        }
        // FUA: the write is durable once the device's cache is flushed.
        let nsid = s.sqe.nsid();
        let flush = self.ns[nsid as usize].as_ref().is_some_and(|n| n.ns.bdev.info().io_types.flush);
        if op == NVM_WRITE && s.status.is_success() && s.sqe.fua() && flush && !s.flushed {
            s.flushed = true;
            s.phase = Phase::Flushing;
            if self.submit(i, nsid, IoOp::Flush, 0, 0).is_err() {
                // Busy: the flush is tried again from the ready queue.
                let s = &mut self.slots[i as usize];
                if s.pending == 0 && s.phase == Phase::Flushing {
                    s.phase = Phase::Ready;
                    self.ready.push_back(i);
                }
            }
            return;
        }
        let st = self.slots[i as usize].status;
        self.finish(i, st);
    }

    /// Counts a finished I/O command and queues what answers it.
    fn finish(&mut self, i: u16, st: Status) {
        let s = &self.slots[i as usize];
        let (op, len) = (s.sqe.opcode(), s.len as u64);
        if let Some(Some(n)) = self.ns.get(s.sqe.nsid() as usize) {
            let c = &n.counters;
            if !st.is_success() {
                NsCounters::bump(&c.errors, 1);
            } else if op == NVM_READ {
                NsCounters::bump(&c.read_ops, 1);
                NsCounters::bump(&c.bytes_read, len);
            } else if op == NVM_WRITE {
                NsCounters::bump(&c.write_ops, 1);
                NsCounters::bump(&c.bytes_written, len);
            } else {
                NsCounters::bump(&c.other_ops, 1);
            }
        }
        if op == NVM_READ && st.is_success() {
            let len = self.slots[i as usize].len;
            self.queue_c2h(i, len, self.c2h_success);
            if self.c2h_success {
                self.queue_tx(i);
                return;
            }
        }
        self.complete(i, st);
    }

    // ---- sending ----

    /// Sends queued PDUs; true when it sent anything.
    fn send(&mut self) -> bool {
        let mut moved = false;
        self.tx_blocked = false;
        while !self.tx.is_empty() && !self.broken {
            let mut iov = [IoSlice::new(&[]); IOV_PER_WRITE];
            let pieces = self.tx.iter().flat_map(|&i| self.slots[i as usize].pieces());
            let n_iov = fp_sys::gather(pieces, self.tx_sent, &mut iov);
            let sent = match send(self.fd.as_fd(), &iov[..n_iov]) {
                Ok(0) => {
                    self.tx_blocked = true;
                    break;
                }
                Ok(n) => n,
                Err(e) => {
                    self.fail(&format!("sending: {e}"));
                    return true;
                }
            };
            moved = true;
            let mut left = self.tx_sent + sent;
            while let Some(&i) = self.tx.front() {
                let len = self.slots[i as usize].tx_len();
                if left < len {
                    break;
                }
                left -= len;
                self.tx.pop_front();
                self.sent(i);
            }
            self.tx_sent = left;
        }
        if self.tx.is_empty() && !self.broken {
            if let Some((b, n)) = self.term.take() {
                let _ = send(self.fd.as_fd(), &[IoSlice::new(&b[..n])]);
            }
        }
        if self.tx_blocked {
            if moved || self.blocked_since.is_none() {
                self.blocked_since = Some(Instant::now());
            }
        } else {
            self.blocked_since = None;
        }
        moved
    }

    /// A slot's PDUs are out: an R2T's slot waits for its data, the others are done.
    fn sent(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        if s.phase == Phase::AwaitData {
            s.hdr_len = 0;
            return;
        }
        self.release(i);
    }

    fn in_flight(&self) -> bool {
        self.ns.iter().flatten().any(|n| n.in_flight > 0)
    }

    fn drained(&self) -> bool {
        !self.in_flight() && (self.broken || self.tx.is_empty())
    }

    /// Timers: keep-alive on the admin queue, a host that stopped reading.
    fn tick(&mut self, now: Instant) {
        let Some(due) = self.next_tick else { return };
        if now < due {
            return;
        }
        let _ = self.timer.wait();
        // On the timer's own schedule, so the next check finds it expired.
        let every = self.tick_interval();
        self.next_tick = Some(if due + every > now { due + every } else { now + every });
        if let Some(c) = &self.admin {
            if self.closing.is_none() && c.keep_alive_expired(now) {
                log::warn!("{}: keep-alive timeout expired", self.what());
                self.teardown = true;
                self.close_after("keep-alive timeout");
            }
        }
        if self.blocked_since.is_some_and(|t| now.duration_since(t) > SEND_TIMEOUT) {
            self.fail("the host stopped reading for 30 s");
        }
    }

    /// The queue is done: unregister; an admin queue takes its controller down (every I/O
    /// queue, on whatever reactor).
    fn finish_queue(&mut self) {
        let why = self.closing.take().unwrap_or_default();
        if self.misbehaved || self.broken {
            log::warn!("nvmf: {}: {why}; connection closed", self.what());
        } else {
            log::info!("nvmf: {}: {why}; connection closed", self.what());
        }
        let _ = fp_sys::shutdown(self.fd.as_fd());
        let io = {
            let mut st = lock(&self.sub.state);
            let cntlid = self.ctrl.cntlid;
            if self.admin.is_some() {
                self.ctrl.gone.store(true, Ordering::Release);
                st.controllers
                    .remove(&cntlid)
                    .map(|e| e.io.into_values().collect::<Vec<_>>())
                    .unwrap_or_default()
            } else {
                if let Some(e) = st.controllers.get_mut(&cntlid) {
                    if e.io.get(&self.qid).is_some_and(|q| Some(q.id) == self.id) {
                        e.io.remove(&self.qid);
                    }
                }
                Vec::new()
            }
        };
        if let Some(c) = &mut self.admin {
            let _ = c.take_parked();
        }
        close_qpairs(&io, "its controller went away");
        for n in self.ns.iter().flatten() {
            if let Some(fd) = n.chan.completion_fd() {
                let _ = self.epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
            }
        }
    }

    fn set_interest(&mut self, want: EventSet) {
        if want != self.interest {
            let ev = EpollEvent::new(want, 0);
            if self.epoll.ctl(ControlOperation::Modify, self.fd.as_raw_fd(), ev).is_ok() {
                self.interest = want;
            }
        }
    }
}

/// An errno from a bdev as an NVMe status (Base 4.6.1.2).
fn status_of_errno(e: i32, op: u8) -> Status {
    match e {
        libc::EROFS | libc::EPERM | libc::EACCES => Status::generic(SC_NAMESPACE_WRITE_PROTECTED),
        libc::ENOSPC | libc::EDQUOT => Status::generic(SC_CAPACITY_EXCEEDED),
        libc::EINVAL | libc::EOVERFLOW => Status::generic(SC_LBA_OUT_OF_RANGE),
        libc::ENOTSUP => Status::generic(SC_INVALID_OPCODE),
        libc::EIO | libc::EILSEQ | libc::ENODATA if op == NVM_READ => {
            Status::media(SC_UNRECOVERED_READ_ERROR)
        }
        libc::EIO if op == NVM_WRITE || op == NVM_WRITE_ZEROES => Status::media(SC_WRITE_FAULT),
        libc::EAGAIN | libc::EBUSY | libc::ENOMEM | libc::ETIMEDOUT => {
            Status::generic(SC_TRANSIENT_TRANSPORT_ERROR).retryable()
        }
        _ => Status::generic(SC_INTERNAL_ERROR),
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
        if self.next_tick.is_some() {
            self.tick(Instant::now());
        }
        if self.teardown && self.tx.is_empty() && self.closing.is_none() {
            self.close_after("the host disconnected the controller");
        }
        if self.closing.is_some() && self.drained() {
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
            || (!self.tx.is_empty() && !self.tx_blocked && !self.broken)
            || ((self.rx_stalled || self.rx_more) && self.can_accept())
            || (self.closing.is_some() && self.drained())
            || (self.teardown && self.closing.is_none())
    }

    fn prepare_sleep(&mut self) -> bool {
        let mut want = EventSet::empty();
        if self.closing.is_none() && self.can_accept() {
            want |= EventSet::IN;
        }
        if self.tx_blocked && !self.broken {
            want |= EventSet::OUT;
            if self.next_tick.is_none() {
                self.set_tick(Duration::from_secs(1));
            }
        }
        self.set_interest(want);
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
        vec![self.epoll.as_raw_fd()]
    }
}

// ---- messages from the control plane, to queue pairs on their reactors ----

/// Closes queue pairs (once their commands in flight are done).
pub(crate) fn close_qpairs(qpairs: &[QpairRef], why: &'static str) {
    for q in qpairs {
        let id = q.id;
        q.reactor.send(move |r| {
            if let Some(p) = r.poller_mut::<QpairPoller>(id) {
                p.close_after(why);
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
/// for it when it was detached). False at the deadline.
pub(crate) fn drain_namespace(qpairs: &[QpairRef], nsid: u32, deadline: Instant) -> bool {
    loop {
        let mut busy = 0;
        for q in qpairs {
            let id = q.id;
            busy += q
                .reactor
                .call(move |r| r.poller_mut::<QpairPoller>(id).map_or(0, |p| p.namespace_in_flight(nsid)))
                .unwrap_or(0);
        }
        if busy == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
