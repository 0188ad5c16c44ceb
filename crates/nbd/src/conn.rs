//! One connection in the transmission phase, served by a poller on a reactor.
//!
//! Each round it reads what the socket holds (many request headers per read; a large write's
//! payload straight into the request's buffer), submits the requests to its channel of the
//! export's bdev, reaps completions, and sends every finished reply in one vectored write: a
//! read's data goes from the buffer the bdev filled to the socket without a copy (over TLS,
//! rustls encrypts it into its own buffer). Requests live in a fixed table of slots whose
//! buffers are reused, so steady-state I/O allocates nothing. The socket sits in a private
//! epoll set, which the reactor watches: the set's interest follows what the connection waits
//! for (requests, or room to write replies). The receive buffer, the send queue, the epoll set
//! and the life cycle are [`fp_conn`]'s; `command` runs requests, `socket` is TLS or not.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::disk::DiskIo;
use fp_bdev::iov::BounceBuf;
use fp_bdev::{BdevError, BlockExtent, IoStatus};
use fp_conn::round::{connection_pending, read_round, PeerClosed, ReadRound, Reader};
use fp_conn::{Interest, Life, Recv, RecvBuf, SendQueue, Sent};
use fp_reactor::{PollStatus, Poller};
use rustls::ServerConnection;
use vmm_sys_util::epoll::EventSet;

use crate::export::ExportShared;
use crate::proto::*;
use crate::stats::{ConnStats, NbdStats};

mod command;
mod socket;

#[cfg(test)]
mod budget_tests;

use socket::Socket;

/// Requests one connection may have in its table at once.
const MAX_IN_FLIGHT: usize = 128;
/// The receive buffer for request headers (and small write payloads).
const RX_SIZE: usize = 64 << 10;
/// Data buffers a connection may hold for requests in flight before it stops reading new
/// ones: a client pipelining 32 MiB writes cannot make the daemon buffer gigabytes.
const MEM_BUDGET: usize = 64 << 20;
/// Slot buffers up to this size are kept for the next request; bigger ones are freed after
/// use (their allocation is small next to the transfer).
const KEEP_BUF: usize = 1 << 20;
/// Socket reads per round, so one busy client cannot hold its reactor.
const READS_PER_ROUND: usize = 8;
/// Requests one poll starts at most: the connection's share of its reactor's round, as a vhost
/// queue's (32 requests, about 6 µs on the null path). A client pipelining a full table would
/// otherwise have all 128 started in one poll while every other connection and queue on the
/// reactor waits; the rest start in the next round, which follows at once.
const STARTS_PER_POLL: usize = 32;
/// Extents one block status reply describes at most.
const MAX_EXTENTS: usize = 1024;
/// How long a closing connection keeps retrying the requests its device refused as busy (and
/// FUA flushes it refused) before it answers them `EIO`, unless the server says otherwise
/// ([`crate::NbdServer::set_close_timeout`]; shorter under test).
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(if cfg!(test) { 1 } else { 5 });

/// What the handshake hands over.
pub(crate) struct ConnSetup {
    pub(crate) fd: OwnedFd,
    pub(crate) tls: Option<Box<ServerConnection>>,
    pub(crate) export: Arc<ExportShared>,
    pub(crate) structured: bool,
    pub(crate) allocation: bool,
    /// The export's bitmaps selected ([`crate::handshake::Transmission::bitmaps`]).
    pub(crate) bitmaps: Vec<u32>,
    pub(crate) peer: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Free,
    /// A write's payload is arriving.
    Receiving,
    /// Parsed, waiting to be started (or, after a FUA write, its flush).
    Ready,
    Submitted,
    /// A FUA write completed; its flush is in flight.
    Flushing,
    /// Its reply is queued.
    Replying,
}

struct Slot {
    req: Request,
    phase: Phase,
    /// Set when a FUA request's data part completed and its flush is due.
    flush_due: bool,
    /// The request's data, and the iovec that shows it to the device: both stay put while the
    /// request is in flight (the slot keeps the buffer until the reply is sent).
    buf: Option<BounceBuf>,
    /// Reply header: a simple reply, or a chunk header plus a data chunk's offset.
    hdr: [u8; CHUNK_HEADER_LEN + 8],
    hdr_len: usize,
    /// Reply payload built here: an error chunk's, a block status chunk's.
    extra: Vec<u8>,
    /// Bytes of `buf` sent after the header (a read's data).
    data_len: usize,
    /// Bytes counted against [`MEM_BUDGET`].
    mem: usize,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            req: Request { flags: 0, command: 0, cookie: 0, offset: 0, length: 0 },
            phase: Phase::Free,
            flush_due: false,
            buf: None,
            hdr: [0; CHUNK_HEADER_LEN + 8],
            hdr_len: 0,
            extra: Vec::new(),
            data_len: 0,
            mem: 0,
        }
    }

    /// A data buffer of at least `len` bytes.
    fn buffer(&mut self, len: usize) -> &mut BounceBuf {
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = Some(BounceBuf::zeroed(len));
        }
        self.buf.as_mut().expect("just made")
    }

    /// The reply's pieces, in order.
    fn pieces(&self) -> [&[u8]; 3] {
        let data = match &self.buf {
            Some(b) => &b.bytes()[..self.data_len],
            None => &[],
        };
        [&self.hdr[..self.hdr_len], &self.extra, data]
    }

    /// Sets the header to a final structured chunk of `kind` whose payload is `len` bytes.
    fn set_chunk(&mut self, kind: u16, len: u32) {
        let h = chunk_header(REPLY_FLAG_DONE, kind, self.req.cookie, len);
        self.hdr[..CHUNK_HEADER_LEN].copy_from_slice(&h);
        self.hdr_len = CHUNK_HEADER_LEN;
    }

    fn reply_len(&self) -> usize {
        self.hdr_len + self.extra.len() + self.data_len
    }
}

/// A connection's poller.
pub(crate) struct ConnPoller {
    sock: Socket,
    interest: Interest,
    export: Arc<ExportShared>,
    channel: DiskIo,
    structured: bool,
    allocation: bool,
    bitmaps: Vec<u32>,
    peer: String,
    /// Its counts, published to `stats` once per busy round (`counted` says there is news).
    counters: NbdStats,
    counted: bool,
    stats: Arc<ConnStats>,
    slots: Box<[Slot]>,
    free: Vec<u16>,
    /// Slots to start, in arrival order.
    ready: VecDeque<u16>,
    /// Slots whose replies go out, in order.
    tx: SendQueue<u16>,
    rx: RecvBuf,
    /// The write whose payload is arriving, and how much of it has.
    receiving: Option<(u16, usize)>,
    /// What the last read round left: stopped for lack of slots or memory (resume when they
    /// free up), or at the round's limit with more perhaps waiting (in rustls's buffer, which
    /// the socket's readiness does not show).
    read: ReadRound,
    mem: usize,
    completions: Vec<(u32, IoStatus)>,
    extents: Vec<BlockExtent>,
    /// Closing: no new requests; it finishes those it has (retrying those refused as busy
    /// until the export's close bound, [`CLOSE_TIMEOUT`] by default), then closes. Broken: the
    /// socket failed, replies are dropped. Misbehaved: logged as a warning.
    life: Life,
}

fn event_set_err(e: std::io::Error) -> BdevError {
    BdevError::Unsupported(format!("epoll: {e}"))
}

impl ConnPoller {
    pub(crate) fn new(s: ConnSetup, stats: Arc<ConnStats>) -> Result<ConnPoller, BdevError> {
        let channel = match s.export.bdev.as_disk() {
            Some(disk) => disk.open_typed()?,
            None => DiskIo::Device(s.export.bdev.open_channel()?),
        };
        set_send_buffer(s.fd.as_fd());
        let interest = Interest::new(s.fd.as_fd()).map_err(event_set_err)?;
        s.export.connections.fetch_add(1, Ordering::Relaxed);
        Ok(ConnPoller {
            sock: Socket { fd: s.fd, tls: s.tls },
            interest,
            export: s.export,
            channel,
            structured: s.structured,
            allocation: s.allocation,
            bitmaps: s.bitmaps,
            peer: s.peer,
            counters: NbdStats::default(),
            counted: false,
            stats,
            slots: (0..MAX_IN_FLIGHT).map(|_| Slot::new()).collect(),
            free: (0..MAX_IN_FLIGHT as u16).rev().collect(),
            ready: VecDeque::with_capacity(MAX_IN_FLIGHT),
            tx: SendQueue::with_capacity(MAX_IN_FLIGHT),
            rx: RecvBuf::new(RX_SIZE),
            receiving: None,
            read: ReadRound::default(),
            mem: 0,
            completions: Vec::with_capacity(MAX_IN_FLIGHT),
            extents: Vec::with_capacity(MAX_EXTENTS),
            life: Life::new(),
        })
    }

    /// The export is stopping: finish what was asked, then close (the export sees it by
    /// the connection's `alive` flag).
    /// The stop's `deadline` is also the connection's bound for requests refused as busy (one
    /// deadline, so the two never race).
    pub(crate) fn request_stop(&mut self, deadline: Instant) {
        self.close_after("the export was stopped".into());
        self.life.limit_deadline(deadline);
    }

    /// The stop's bound passed: gives up every request parked on Busy (answered `EIO`) now,
    /// and says how many requests the device still holds.
    pub(crate) fn give_up_at_stop(&mut self) -> usize {
        self.life.limit_deadline(Instant::now());
        self.abort_waiting(Instant::now());
        self.reap();
        self.channel.in_flight()
    }

    fn close_after(&mut self, why: String) {
        self.life.close(why, self.export.close_timeout);
        if let Some((i, _)) = self.receiving.take() {
            self.release(i);
        }
    }

    /// At the close deadline, answers `EIO` to the requests the device still refuses as busy:
    /// those waiting here, and those the bdev stack took and keeps retrying (they complete
    /// `ECANCELED`, answered `EIO`, at the next reap).
    fn abort_waiting(&mut self, now: Instant) {
        if !self.life.past_deadline(now) {
            return;
        }
        let parked = if self.channel.parked() > 0 { self.channel.abort_parked() } else { 0 };
        if self.ready.is_empty() && parked == 0 {
            return;
        }
        log::warn!(
            "nbd export '{}': {}: {} requests the device kept refusing as busy answered EIO at close",
            self.export.name,
            self.peer,
            self.ready.len() + parked
        );
        while let Some(i) = self.ready.pop_front() {
            self.reply(i, EIO, "the device stayed busy while the connection closed");
        }
    }

    /// The stream is unusable (a bad header, a socket error): stop reading, drop replies.
    fn fail(&mut self, why: String) {
        self.close_after(why);
        self.life.set_broken();
        while let Some(i) = self.tx.drop_front() {
            self.release(i);
        }
        while let Some(i) = self.ready.pop_front() {
            self.release(i);
        }
    }

    fn can_accept(&self) -> bool {
        !self.life.is_closing() && !self.free.is_empty() && self.mem < MEM_BUDGET
    }

    fn release(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        self.mem -= s.mem;
        s.mem = 0;
        s.phase = Phase::Free;
        s.flush_due = false;
        s.data_len = 0;
        s.extra.clear();
        if s.buf.as_ref().is_some_and(|b| b.len() > KEEP_BUF) {
            s.buf = None;
        }
        self.free.push(i);
    }

    /// Reads requests; true when it moved anything.
    fn receive(&mut self) -> bool {
        self.read = read_round(self, READS_PER_ROUND);
        self.read.moved
    }

    /// Takes the complete headers (and the payload bytes that came with them) out of the
    /// receive buffer. False when it stopped for lack of a slot or memory.
    fn take_requests(&mut self) -> bool {
        while self.rx.len() >= REQUEST_LEN {
            if !self.can_accept() {
                return self.life.is_closing();
            }
            let head: &[u8; REQUEST_LEN] = self.rx.data()[..REQUEST_LEN].try_into().expect("length checked");
            let req = match Request::parse(head) {
                Ok(r) => r,
                Err(e) => {
                    // Nothing after this can be framed; requests before it are still answered.
                    self.close_after(e.to_string());
                    self.life.set_misbehaved(true);
                    return true;
                }
            };
            self.rx.consume(REQUEST_LEN);
            if req.command == CMD_DISC {
                self.close_after("client sent NBD_CMD_DISC".into());
                return true;
            }
            let i = self.free.pop().expect("can_accept checked");
            let payload = req.payload_len();
            let slot = &mut self.slots[i as usize];
            slot.req = req;
            // A read's buffer counts from now, as a write's: a client that never takes its
            // replies stops being read once its requests hold the budget.
            if req.command == CMD_READ {
                slot.mem = req.length as usize;
                self.mem += slot.mem;
            }
            if payload == 0 {
                slot.phase = Phase::Ready;
                self.ready.push_back(i);
                continue;
            }
            slot.mem = payload;
            self.mem += payload;
            let have = self.rx.len().min(payload);
            let buf = slot.buffer(payload);
            buf.bytes_mut()[..have].copy_from_slice(&self.rx.data()[..have]);
            self.rx.consume(have);
            if have == payload {
                slot.phase = Phase::Ready;
                self.ready.push_back(i);
            } else {
                slot.phase = Phase::Receiving;
                self.receiving = Some((i, have));
                return true;
            }
        }
        true
    }

    /// Sends queued replies; true when it sent anything.
    fn send(&mut self) -> bool {
        let mut moved = false;
        self.tx.set_blocked(false);
        while !self.tx.is_empty() && !self.life.is_broken() {
            let (slots, sock) = (&self.slots, &mut self.sock);
            match self.tx.write(|i| slots[i as usize].pieces(), |iov| sock.send(iov)) {
                Sent::Bytes(_) => moved = true,
                Sent::Blocked => break,
                Sent::Failed(e) => {
                    self.fail(format!("sending replies: {e}"));
                    return true;
                }
            }
            while let Some(i) = self.tx.pop_sent(|i| self.slots[i as usize].reply_len()) {
                self.release(i);
            }
        }
        if !self.life.is_broken() && self.sock.tls_wants_write() {
            match self.sock.flush_tls() {
                Ok(flushed) => {
                    if !flushed {
                        self.tx.set_blocked(true);
                    }
                }
                Err(e) => self.fail(format!("sending replies: {e}")),
            }
        }
        moved
    }

    /// Whether every request is answered (or dropped) and the connection may close.
    fn drained(&self) -> bool {
        self.free.len() == MAX_IN_FLIGHT && (self.life.is_broken() || !self.sock.tls_wants_write())
    }

    fn finish(&mut self) {
        if let Some(tls) = &mut self.sock.tls {
            if !self.life.is_broken() {
                tls.send_close_notify();
                let _ = self.sock.flush_tls();
            }
        }
        self.life.end(&format!("nbd export '{}': {}", self.export.name, self.peer));
        // The fd itself closes when the poller is dropped.
        let _ = fp_sys::shutdown(self.sock.fd.as_fd());
    }
}

/// The socket send buffer asked for: room for a few large replies at once, so a round's
/// vectored write goes out whole more often and fewer rounds find the socket full. The kernel
/// caps it at `net.core.wmem_max`.
const SEND_BUFFER: libc::c_int = 4 << 20;

fn set_send_buffer(fd: BorrowedFd<'_>) {
    if let Err(e) = fp_sys::set_send_buffer(fd, SEND_BUFFER) {
        log::debug!("nbd: SO_SNDBUF: {e}");
    }
}

impl Drop for ConnPoller {
    fn drop(&mut self) {
        self.export.conns().close(&self.stats, &self.counters);
        self.export.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The read round's view of the connection: a write's payload straight into its buffer,
/// request headers through the receive buffer.
impl Reader for ConnPoller {
    fn closing(&self) -> bool {
        self.life.is_closing()
    }

    fn recv_payload(&mut self) -> Option<Recv> {
        let (i, filled) = self.receiving?;
        let len = self.slots[i as usize].req.length as usize;
        let buf = self.slots[i as usize].buf.as_mut().expect("a receiving write has a buffer");
        let r = self.sock.recv(&mut buf.bytes_mut()[filled..len]);
        if let Recv::Data(n) = r {
            if filled + n == len {
                self.receiving = None;
                self.slots[i as usize].phase = Phase::Ready;
                self.ready.push_back(i);
            } else {
                self.receiving = Some((i, filled + n));
            }
        }
        Some(r)
    }

    fn parse(&mut self) -> bool {
        self.take_requests()
    }

    fn receiving(&self) -> bool {
        self.receiving.is_some()
    }

    fn recv_more(&mut self) -> Recv {
        // Room for more: move the partial header to the front and read.
        self.rx.compact();
        let sock = &mut self.sock;
        self.rx.fill(|dst| sock.recv(dst))
    }

    fn buffered(&self) -> bool {
        !self.rx.is_empty()
    }

    fn peer_closed(&mut self, at: PeerClosed) {
        let why = match (at, self.receiving) {
            (PeerClosed::MidPayload, Some((i, filled))) => {
                let len = self.slots[i as usize].req.length;
                format!("client disconnected in the middle of a write ({filled} of {len} bytes)")
            }
            (PeerClosed::Clean, _) => "client closed the connection".into(),
            _ => "client disconnected in the middle of a request header".into(),
        };
        self.close_after(why);
        self.life.set_misbehaved(at.misbehaved());
    }

    fn failed(&mut self, why: String) {
        self.fail(why);
    }
}

impl Poller for ConnPoller {
    fn poll(&mut self) -> PollStatus {
        let mut budget = STARTS_PER_POLL;
        let mut busy = self.receive();
        busy |= self.start_ready(&mut budget);
        busy |= self.reap() > 0;
        // Requests that finished at once (errors, block status, FUA flushes) go out this round.
        busy |= self.start_ready(&mut budget);
        if self.life.is_closing() {
            self.abort_waiting(Instant::now());
        }
        busy |= self.send();
        if self.counted {
            self.stats.publish(&self.counters);
            self.counted = false;
        }
        if self.life.is_closing() && self.drained() {
            self.finish();
            return PollStatus::Finished;
        }
        if busy {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    fn has_pending(&self) -> bool {
        (self.channel.in_flight() > 0 && !self.channel.sleeps_in_flight())
            || !self.ready.is_empty()
            || connection_pending(&self.tx, &self.life, self.read, || self.can_accept(), || self.drained())
    }

    fn idle_window(&self) -> Option<Duration> {
        // As the vhost queue: a backend that signals its completions is slept on.
        self.channel.sleeps_in_flight().then_some(Duration::ZERO)
    }

    fn prepare_sleep(&mut self) -> bool {
        let mut want = EventSet::empty();
        if !self.life.is_closing() && self.can_accept() {
            want |= EventSet::IN;
        }
        if self.tx.is_blocked() || (self.sock.tls_wants_write() && !self.life.is_broken()) {
            want |= EventSet::OUT;
        }
        self.interest.set(want);
        self.channel.arm_completion_fd()
    }

    fn after_wake(&mut self) {
        self.channel.disarm_completion_fd();
    }

    fn wake_fds(&self) -> Vec<RawFd> {
        let mut fds = vec![self.interest.as_raw_fd()];
        if let Some(fd) = self.channel.completion_fd() {
            fds.push(fd);
        }
        fds
    }
}
