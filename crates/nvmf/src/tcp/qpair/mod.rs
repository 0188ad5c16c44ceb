//! One NVMe/TCP queue pair, served by a poller on a reactor: the admin queue of a controller
//! or an I/O queue, its commands run by the transport-neutral [`Executor`] to which this
//! module is the [`Transport`] (R2Ts, C2HData, response capsules).
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
//! Here: the queue's state, its setup and timers, the NVMe/TCP side of a command ([`Slot`],
//! [`Tcp`]), the control plane's messages and the poller; `receive` and `send` are the
//! transport's stages of a round, the executor's `start_ready` and `reap` the others.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fp_bdev::BdevError;
use fp_conn::round::{connection_pending, read_round, PeerClosed, ReadRound, Reader};
use fp_conn::uring::{SocketImpl, UringSocket};
use fp_conn::{Interest, Life, Recv, RecvBuf, SendQueue, Sent};
use fp_crypto::tls::TlsStream;
use fp_nvme_spec::auth::{DhGroupId, HashId};
use fp_nvme_spec::tcp::*;
use fp_nvme_spec::*;
use fp_reactor::{PollStatus, Poller, PollerId};
use fp_sys::clock::TickScale;
use vmm_sys_util::epoll::{ControlOperation, EpollEvent, EventSet};

use crate::controller::{Controller, ControllerConfig};
use crate::exec::{Command, Executor, Phase, Transport};
use crate::options::{ListenAddress, TransportOptions};
use crate::subsystem::{lock, CtrlShared, QpairRef, Subsystem};
use crate::DhchapConfig;

mod receive;
mod send;

/// The most data one H2CData PDU may carry (MAXH2CDATA), as SPDK offers.
pub(crate) const MAX_H2C_DATA: u32 = 131072;
/// The admin queue's in-capsule data size (TCP 4.1: at least 8 KiB on the admin queue).
pub(crate) const ADMIN_ICD: u32 = 8192;

/// Socket reads per round, so one busy host cannot hold its reactor.
const READS_PER_ROUND: usize = 8;
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
/// Polls a send may stay in the kernel before the queue counts as blocked (see `send_polls`).
const SEND_STALL_POLLS: u32 = 64;
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
    /// Submission queue entries the handshake used (the Connect, and the authentication).
    pub sq_taken: u32,
    pub digests: Digests,
    pub hpda: u8,
    pub transport: TransportOptions,
    /// The target's close bound ([`crate::NvmfTarget::set_close_timeout`]).
    pub close_timeout: Duration,
    /// How the socket is read and written.
    pub sock_impl: SocketImpl,
    /// The hash and DH group the queue authenticated with, if it did.
    pub auth: Option<(HashId, DhGroupId)>,
    /// The hashes and DH groups allowed when the host authenticates again.
    pub dhchap: Arc<Mutex<DhchapConfig>>,
    /// The TLS session of a queue that came in through a secure listener (with whatever the
    /// handshake thread received past the Connect).
    pub tls: Option<TlsStream>,
}

/// A command and what NVMe/TCP sends for it.
pub(crate) struct Slot {
    pub(crate) cmd: Command,
    /// Its R2T went out whole: H2CData may answer it (not before, so a host guessing tags
    /// cannot complete a command whose R2T still sits in the send queue).
    r2t_out: bool,
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
            cmd: Command::new(),
            r2t_out: false,
            hdr: [0; HEADER_ROOM],
            hdr_len: 0,
            data_len: 0,
            ddgst: [0; DIGEST_LEN],
            ddgst_len: 0,
            resp: [0; HEADER_ROOM],
            resp_len: 0,
        }
    }

    /// A new command: nothing of the last one's PDUs is left.
    fn reset(&mut self) {
        self.r2t_out = false;
        self.hdr_len = 0;
        self.data_len = 0;
        self.ddgst_len = 0;
        self.resp_len = 0;
    }

    fn pieces(&self) -> [&[u8]; 4] {
        let data = match &self.cmd.buf {
            Some(b) => &b.bytes()[..self.data_len],
            None => &[],
        };
        [&self.hdr[..self.hdr_len], data, &self.ddgst[..self.ddgst_len], &self.resp[..self.resp_len]]
    }

    fn tx_len(&self) -> usize {
        self.hdr_len + self.data_len + self.ddgst_len + self.resp_len
    }
}

/// What the executor reaches of a queue pair's NVMe/TCP side, borrowed from the
/// [`QpairPoller`]'s fields for one call (see [`tcp!`]).
pub(crate) struct Tcp<'a> {
    slots: &'a mut [Slot],
    tx: &'a mut SendQueue<u16>,
    life: &'a Life,
    wire: Wire,
    sqhd: u16,
}

/// How this queue's PDUs are framed and its completions filled in.
#[derive(Clone, Copy)]
struct Wire {
    digests: Digests,
    hpda: u8,
    qid: u16,
    /// Connect's CATTR bit 2: SQHD reads 0xFFFF.
    sq_flow_disabled: bool,
    /// A read's last C2HData may stand for its completion.
    c2h_success: bool,
}

/// The NVMe/TCP side of a queue pair as the executor sees it: a macro, so the borrows are of
/// fields (the executor and the receive buffer stay usable beside it).
macro_rules! tcp {
    ($q:expr) => {
        Tcp { slots: &mut $q.slots, tx: &mut $q.tx, life: &$q.life, wire: $q.wire, sqhd: $q.sqhd }
    };
}
pub(crate) use tcp;

impl Transport for Tcp<'_> {
    #[inline]
    fn command(&mut self, i: u16) -> &mut Command {
        &mut self.slots[i as usize].cmd
    }

    #[inline]
    fn closing(&self) -> bool {
        self.life.is_closing()
    }

    /// An R2T for the whole transfer (the host splits its data into H2CData PDUs of at most
    /// MAXH2CDATA).
    #[inline]
    fn request_data(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        s.cmd.phase = Phase::AwaitData;
        let r2t = DataHeader { cccid: s.cmd.sqe.cid(), ttag: i, offset: 0, length: s.cmd.len as u32 };
        s.hdr_len = write_r2t(&mut s.hdr, &r2t, self.wire.digests);
        self.tx.push(i);
    }

    /// One C2HData PDU; with `completes` and c2h_success, flagged SUCCESS (no response
    /// capsule follows).
    #[inline]
    fn send_data(&mut self, i: u16, len: usize, completes: bool) -> bool {
        let success = completes && self.wire.c2h_success;
        let s = &mut self.slots[i as usize];
        let mut flags = FLAG_LAST_PDU;
        if success {
            flags |= FLAG_SUCCESS;
        }
        let h = DataHeader { cccid: s.cmd.sqe.cid(), ttag: 0, offset: 0, length: len as u32 };
        s.hdr_len = write_c2h_data(&mut s.hdr, &h, flags, self.wire.digests, self.wire.hpda);
        s.data_len = len;
        s.ddgst_len = 0;
        if self.wire.digests.data && len > 0 {
            let b = s.cmd.buf.as_ref().expect("data to send has its buffer");
            s.ddgst = crc32c(&b.bytes()[..len]).to_le_bytes();
            s.ddgst_len = DIGEST_LEN;
        }
        success
    }

    /// A response capsule.
    #[inline]
    fn set_completion(&mut self, i: u16, mut cqe: Cqe) {
        let s = &mut self.slots[i as usize];
        cqe.cid = s.cmd.sqe.cid();
        cqe.sqid = self.wire.qid;
        cqe.sqhd = if self.wire.sq_flow_disabled { 0xFFFF } else { self.sqhd };
        s.resp_len = write_capsule_resp(&mut s.resp, &cqe, self.wire.digests);
    }

    #[inline]
    fn send(&mut self, i: u16) -> bool {
        if self.life.is_broken() {
            return false;
        }
        self.slots[i as usize].cmd.phase = Phase::Sending;
        self.tx.push(i);
        true
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
    fd: OwnedFd,
    /// The socket on the reactor's io_uring engine (`uring`), else plain system calls. Before
    /// the slots: dropping it waits until the kernel is done with the memory its send names.
    uring: Option<UringSocket>,
    /// The queue's TLS session: every receive and send goes through it (never with `uring`).
    tls: Option<TlsStream>,
    /// The socket took no more of the TLS ciphertext waiting for it: writability is awaited
    /// rather than polled for.
    tls_stalled: bool,
    /// Polls since the send in the kernel was submitted: past [`SEND_STALL_POLLS`] the host is
    /// taken to be slow to read (the send timeout's clock runs).
    send_polls: u32,
    /// The socket's epoll set, which the timer and the channels' completion fds join.
    interest: Interest,
    timer: fp_sys::Timer,
    next_tick: Option<Instant>,
    /// `next_tick` on the data path's clock ([`fp_sys::clock::ticks`], a TSC read): a poll
    /// looks at `Instant` (a vDSO clock read, several times dearer, once a round on an admin
    /// queue with keep-alive) only once this is reached.
    tick_due: u64,
    scale: TickScale,
    id: Option<PollerId>,
    /// The queue's commands, namespaces and buffers (the transport-neutral part).
    exec: Executor,
    wire: Wire,
    icd: usize,
    max_plen: u32,
    sq_entries: u16,
    sqhd: u16,
    slots: Box<[Slot]>,
    tx: SendQueue<u16>,
    blocked_since: Option<Instant>,
    rx: RecvBuf,
    /// H2C data arriving straight into a slot's buffer.
    h2c: Option<H2c>,
    /// An H2CData's data is in; its digest is still to read.
    h2c_digest: Option<H2c>,
    /// What the last read round left.
    read: ReadRound,
    /// A C2HTermReq to send before closing.
    term: Option<([u8; DATA_HLEN + TERM_REQ_MAX_DATA], usize)>,
    /// Closing (retrying commands refused as busy until `close_timeout` after it began),
    /// broken (the socket failed), misbehaved (the host broke the protocol).
    life: Life,
    close_timeout: Duration,
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
        let uring = match s.sock_impl {
            _ if s.tls.is_some() => None,
            SocketImpl::Posix => None,
            SocketImpl::Uring => match UringSocket::register(s.fd.as_fd()) {
                Ok(u) => Some(u),
                Err(e) => {
                    log::warn!("nvmf: {}: io_uring socket engine: {e}; this queue uses posix", s.peer);
                    None
                }
            },
        };
        let mut exec = Executor::new(s.sub, s.ctrl, s.peer, (s.qid, s.listen), admin, max_io, n as u16);
        exec.dhchap = s.dhchap;
        let mut p = QpairPoller {
            fd: s.fd,
            uring,
            tls: s.tls,
            tls_stalled: false,
            send_polls: 0,
            interest,
            timer,
            next_tick: None,
            tick_due: 0,
            scale: TickScale::of_clock(),
            id: None,
            exec,
            wire: Wire {
                digests: s.digests,
                hpda: s.hpda,
                qid: s.qid,
                sq_flow_disabled: s.sq_flow_disabled,
                c2h_success: s.transport.c2h_success,
            },
            icd,
            max_plen,
            sq_entries: n as u16,
            // The Connect (and the authentication) took the queue's first entries.
            sqhd: (s.sq_taken as usize % n) as u16,
            slots: (0..n).map(|_| Slot::new()).collect(),
            tx: SendQueue::with_capacity(n + 1),
            blocked_since: None,
            // Room for the largest capsule with any PDO (a byte: at most 255) and its digest.
            rx: RecvBuf::new((64 << 10).max(icd + 512)),
            h2c: None,
            h2c_digest: None,
            read: ReadRound::default(),
            term: None,
            life: Life::new(),
            close_timeout: s.close_timeout,
        };
        if p.exec.admin.is_some() {
            p.exec.publish_state();
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
        self.exec.admin.as_ref().and_then(|c| c.keep_alive_timeout())
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
            self.tick_due_in(every);
        }
    }

    /// The next tick is `d` from now on the data path's clock (a tick late rather than early).
    pub(super) fn tick_due_in(&mut self, d: Duration) {
        self.tick_due = fp_sys::clock::ticks() + self.scale.ticks(d) + 1;
    }

    pub(crate) fn tick_interval(&self) -> Duration {
        match self.kato() {
            Some(kato) => (kato / 4).clamp(Duration::from_millis(20), Duration::from_secs(1)),
            None => Duration::from_secs(1),
        }
    }

    fn what(&self) -> String {
        self.exec.what()
    }

    /// Whether the socket is on the reactor's io_uring engine.
    pub(crate) fn uses_uring(&self) -> bool {
        self.uring.is_some()
    }

    // ---- messages from the control plane ----

    /// The host is gone (or broke the protocol): closes the queue once its commands in
    /// flight are done. Commands not started are dropped (nobody is there to answer).
    pub(crate) fn close_after(&mut self, why: &str) {
        self.exec.drop_waiting(&mut tcp!(self));
        self.close_answering(why);
        self.exec.drop_ready(&mut tcp!(self));
    }

    /// Closes the queue once every command it took is answered: those in flight finish,
    /// those waiting to start (a device that answered busy) are retried until the target's
    /// close bound ([`CLOSE_TIMEOUT`] by default), then answered Command Aborted due to SQ
    /// Deletion. No new command is read.
    pub(crate) fn close_answering(&mut self, why: &str) {
        self.life.close(why, self.close_timeout);
        self.h2c = None;
        self.h2c_digest = None;
        // (A command waiting for H2CData stays as it is: its R2T may still be in the send
        // queue, half sent.)
        self.exec.close(&mut tcp!(self));
    }

    /// At the close deadline, answers the commands still waiting to start, and gives up the
    /// ones the bdev stack took but keeps refused as busy (they complete Command Abort
    /// Requested at the next reap, as every command parked on Busy at a bound).
    fn abort_waiting(&mut self, now: Instant) {
        if !self.life.past_deadline(now) {
            return;
        }
        let aborted = self.exec.abort_ready(&mut tcp!(self));
        if aborted > 0 {
            log::warn!(
                "nvmf: {}: {aborted} commands the device kept refusing as busy answered aborted at close",
                self.what(),
            );
        }
        let nsids: Vec<u32> = self
            .exec
            .ns
            .iter()
            .flatten()
            .filter(|n| n.in_flight > 0 && n.chan.parked() > 0)
            .map(|n| n.ns.nsid)
            .collect();
        for nsid in nsids {
            self.exec.give_up_parked(nsid, "its queue closed");
        }
    }

    /// A namespace was attached, detached or resized: the parked AER (if any) completes.
    pub(crate) fn namespace_changed(&mut self, nsid: u32) {
        self.exec.refresh_view();
        let cqe = self.exec.admin.as_mut().and_then(|c| c.namespace_changed(nsid));
        if let Some(cqe) = cqe {
            self.exec.complete_parked(&mut tcp!(self), cqe);
        }
    }

    /// The ANA states of the queue's listener changed: the controller's parked AER (if any)
    /// completes with the ANA change notice.
    pub(crate) fn ana_changed(&mut self) {
        self.exec.refresh_view();
        let cqe = self.exec.admin.as_mut().and_then(|c| c.ana_changed());
        if let Some(cqe) = cqe {
            self.exec.complete_parked(&mut tcp!(self), cqe);
        }
    }

    /// The discovery log changed.
    pub(crate) fn discovery_changed(&mut self) {
        self.exec.refresh_view();
        let cqe = self.exec.admin.as_mut().and_then(|c| c.discovery_changed());
        if let Some(cqe) = cqe {
            self.exec.complete_parked(&mut tcp!(self), cqe);
        }
    }

    /// Data buffers the queue allocated since it started: a few when it starts, then none
    /// per command.
    #[cfg(test)]
    pub(crate) fn buffer_allocations(&self) -> u64 {
        self.slots.iter().map(|s| u64::from(s.cmd.allocations)).sum::<u64>() + self.exec.large_made as u64
    }

    /// Reloads the namespaces now and says how many commands to `nsid` are in flight:
    /// `(on the device, parked on Busy in its bdev stack)`. With `give_up`, the parked ones are
    /// given up first and reaped at once (answered Command Abort Requested), so what is left
    /// is on the device.
    pub(crate) fn namespace_in_flight(&mut self, nsid: u32, give_up: bool) -> (u32, u32) {
        self.reload_namespaces();
        if give_up && self.exec.give_up_parked(nsid, "the namespace was removed") > 0 {
            self.exec.reap(&mut tcp!(self));
        }
        let Some(n) = self.exec.ns.get(nsid as usize).and_then(|n| n.as_ref()) else { return (0, 0) };
        let parked = (n.chan.parked() as u32).min(n.in_flight);
        (n.in_flight - parked, parked)
    }

    fn reload_namespaces(&mut self) {
        self.exec.reload_namespaces(self.interest.epoll());
    }

    /// Starts the ready commands; true when it started or answered any.
    fn start_ready(&mut self) -> bool {
        let moved = self.exec.start_ready(&mut tcp!(self));
        if moved && self.exec.admin.is_some() {
            // An admin command may have set the keep-alive timeout.
            self.arm_keep_alive();
        }
        moved
    }

    /// Command `i` is done.
    fn release(&mut self, i: u16) {
        self.exec.release(&mut tcp!(self), i);
    }
}

impl Poller for QpairPoller {
    fn poll(&mut self) -> PollStatus {
        if self.exec.admin.is_none()
            && self.exec.sub.ns_generation.load(Ordering::Relaxed) != self.exec.ns_generation
        {
            self.reload_namespaces();
        }
        let mut busy = self.receive();
        busy |= self.start_ready();
        busy |= self.exec.reap(&mut tcp!(self)) > 0;
        busy |= self.start_ready();
        busy |= self.send();
        if self.tx.is_blocked() && self.next_tick.is_none() {
            // The host stopped taking our PDUs: tick, so the send timeout is checked even when
            // other queues keep the reactor from sleeping.
            self.set_tick(Duration::from_secs(1));
        }
        if self.next_tick.is_some() && fp_sys::clock::ticks() >= self.tick_due {
            self.tick(Instant::now());
        }
        if self.exec.teardown && self.tx.is_empty() && !self.life.is_closing() {
            self.close_answering(self.exec.teardown_why);
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
        (self.exec.in_flight() && !self.exec.ns.iter().flatten().any(|n| n.chan.sleeps_in_flight()))
            || !self.exec.ready.is_empty()
            || (!self.exec.await_buf.is_empty() && self.exec.large_buffer_available())
            || connection_pending(&self.tx, &self.life, self.read, || self.can_accept(), || self.drained())
            || (self.can_accept() && self.uring.as_ref().is_some_and(|u| u.readable()))
            || (self.exec.teardown && !self.life.is_closing())
            // TLS: ciphertext for a socket that still takes it, or received ciphertext the
            // session has not taken (its buffer was full) while commands can be read.
            || self.tls.as_ref().is_some_and(|t| {
                !self.life.is_broken()
                    && ((t.has_unsent() && !self.tls_stalled) || (t.has_received() && self.can_accept()))
            })
    }

    fn prepare_sleep(&mut self) -> bool {
        let mut want = EventSet::empty();
        let mut ok = true;
        if let Some((in_flight, readable)) = self.uring.as_ref().map(|u| (u.send_in_flight(), u.readable())) {
            // The ring's fd wakes the reactor for data and for the send's end; a send still in
            // the kernel keeps the send timeout's tick running.
            if in_flight && self.next_tick.is_none() && !self.life.is_broken() {
                self.set_tick(Duration::from_secs(1));
            }
            ok &= !(self.can_accept() && readable);
        } else {
            if !self.life.is_closing() && self.can_accept() {
                want |= EventSet::IN;
            }
            let tls_unsent = self.tls.as_ref().is_some_and(|t| t.has_unsent());
            if (self.tx.is_blocked() || tls_unsent) && !self.life.is_broken() {
                want |= EventSet::OUT;
            }
        }
        self.interest.set(want);
        for n in self.exec.ns.iter_mut().flatten() {
            ok &= n.chan.arm_completion_fd();
        }
        ok
    }

    fn after_wake(&mut self) {
        for n in self.exec.ns.iter_mut().flatten() {
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

/// Closes queue pairs as [`close_qpairs`] does and returns once each has begun to (it reads no
/// new command) or has gone; says how many reactors did not answer within
/// [`fp_reactor::CALL_BOUND`] (their queue pairs close when the messages run).
pub(crate) fn close_qpairs_now(qpairs: &[QpairRef], why: &'static str) -> usize {
    close_qpairs(qpairs, why);
    // A reactor runs its messages in order: once it answers this one, it has run the closes.
    let mut reactors: Vec<&fp_reactor::ReactorHandle> = Vec::new();
    for q in qpairs {
        if !reactors.iter().any(|r| r.id() == q.reactor.id()) {
            reactors.push(&q.reactor);
        }
    }
    reactors.iter().filter(|r| r.call(|_| ()).is_none()).count()
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

/// Runs `f` on each queue pair on its reactor and returns once each has (or has gone).
fn call_each(qpairs: &[QpairRef], f: fn(&mut QpairPoller)) {
    for q in qpairs {
        let id = q.id;
        let _ = q.reactor.call(move |r| r.poller_mut::<QpairPoller>(id).map(f));
    }
}

/// Has I/O queues take their listener's new ANA states now (they reload their namespace
/// table).
pub(crate) fn reload_ana(ios: &[QpairRef]) {
    call_each(ios, QpairPoller::reload_namespaces);
}

/// Tells admin queues their listener's ANA states changed (their controllers send the ANA
/// change notice); once it returns, the notice goes out ahead of any answer to a command the
/// host sends after the change.
pub(crate) fn notify_ana(admins: &[QpairRef]) {
    call_each(admins, QpairPoller::ana_changed);
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
