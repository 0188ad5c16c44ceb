//! One connection in the transmission phase, served by a poller on a reactor.
//!
//! Each round it reads what the socket holds (many request headers per read; a large write's
//! payload straight into the request's buffer), submits the requests to its channel of the
//! export's bdev, reaps completions, and sends every finished reply in one vectored write: a
//! read's data goes from the buffer the bdev filled to the socket without a copy (over TLS,
//! rustls encrypts it into its own buffer). Requests live in a fixed table of slots whose
//! buffers are reused, so steady-state I/O allocates nothing. The socket sits in a private
//! epoll set, which the reactor watches: the set's interest follows what the connection waits
//! for (requests, or room to write replies).

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::disk::DiskIo;
use fp_bdev::{AlignedBuf, BdevError, BlockExtent, IoOp, IoRequest, IoStatus, SubmitError};
use fp_reactor::{PollStatus, Poller};
use rustls::ServerConnection;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use crate::export::ExportShared;
use crate::proto::*;
use crate::stats::{ConnStats, NbdStats};

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
/// Replies gathered into one vectored write.
const IOV_PER_WRITE: usize = 64;
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
    buf: Option<AlignedBuf>,
    iov: libc::iovec,
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
            iov: libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 },
            hdr: [0; CHUNK_HEADER_LEN + 8],
            hdr_len: 0,
            extra: Vec::new(),
            data_len: 0,
            mem: 0,
        }
    }

    /// A data buffer of at least `len` bytes.
    fn buffer(&mut self, len: usize) -> &mut AlignedBuf {
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = Some(AlignedBuf::zeroed(len));
        }
        self.buf.as_mut().expect("just made")
    }

    /// The reply's pieces, in order.
    fn pieces(&self) -> [&[u8]; 3] {
        let data = match &self.buf {
            Some(b) => &b.as_slice()[..self.data_len],
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

/// Outcome of a socket read.
enum Recv {
    Data(usize),
    WouldBlock,
    Eof,
    Failed(String),
}

/// The socket, plain or under TLS.
struct Socket {
    fd: OwnedFd,
    tls: Option<Box<ServerConnection>>,
}

/// `Read`/`Write` on a raw non-blocking socket, for rustls.
struct FdIo(RawFd);

impl Read for FdIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl Write for FdIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: a zeroed msghdr is valid; it points at `bufs` (IoSlice is an iovec on Unix).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        // SAFETY: `msg` describes valid, readable buffers for the call's duration. MSG_NOSIGNAL:
        // a client gone away is an error return, not a SIGPIPE.
        let n = unsafe { libc::sendmsg(self.0, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Socket {
    fn recv(&mut self, dst: &mut [u8]) -> Recv {
        let mut io = FdIo(self.fd.as_raw_fd());
        let Some(tls) = &mut self.tls else {
            return match io.read(dst) {
                Ok(0) => Recv::Eof,
                Ok(n) => Recv::Data(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Recv::WouldBlock,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Recv::WouldBlock,
                Err(e) => Recv::Failed(e.to_string()),
            };
        };
        loop {
            match tls.reader().read(dst) {
                Ok(0) => return Recv::Eof,
                Ok(n) => return Recv::Data(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Recv::Failed(format!("TLS: {e}")),
            }
            match tls.read_tls(&mut io) {
                Ok(0) => return Recv::Eof,
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        // Tell the client why, best effort.
                        let _ = tls.write_tls(&mut io);
                        return Recv::Failed(format!("TLS: {e}"));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Recv::WouldBlock,
                Err(e) => return Recv::Failed(e.to_string()),
            }
        }
    }

    /// Writes some of `bufs`; `Ok(0)` when the socket (or rustls's buffer) takes nothing now.
    fn send(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.tls.is_none() {
            return match FdIo(self.fd.as_raw_fd()).write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                other => other,
            };
        }
        if !self.flush_tls()? {
            return Ok(0);
        }
        let tls = self.tls.as_mut().expect("checked");
        let n = tls.writer().write_vectored(bufs)?;
        self.flush_tls()?;
        Ok(n)
    }

    /// Sends the ciphertext rustls holds; `Ok(false)` when the socket is full.
    fn flush_tls(&mut self) -> io::Result<bool> {
        let mut io = FdIo(self.fd.as_raw_fd());
        let Some(tls) = &mut self.tls else { return Ok(true) };
        while tls.wants_write() {
            match tls.write_tls(&mut io) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn tls_wants_write(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.wants_write())
    }
}

/// A connection's poller.
pub(crate) struct ConnPoller {
    sock: Socket,
    epoll: Epoll,
    /// The private epoll set's interest now.
    interest: EventSet,
    export: Arc<ExportShared>,
    channel: DiskIo,
    structured: bool,
    allocation: bool,
    peer: String,
    /// Its counts, published to `stats` once per busy round (`counted` says there is news).
    counters: NbdStats,
    counted: bool,
    stats: Arc<ConnStats>,
    slots: Box<[Slot]>,
    free: Vec<u16>,
    /// Slots to start, in arrival order.
    ready: VecDeque<u16>,
    /// Slots whose replies go out, in order; `tx_sent` bytes of the first are out already.
    tx: VecDeque<u16>,
    tx_sent: usize,
    /// The socket took nothing on the last try: wait until it is writable.
    tx_blocked: bool,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    /// The write whose payload is arriving, and how much of it has.
    receiving: Option<(u16, usize)>,
    /// Reading stopped for lack of slots or memory: resume when they free up.
    rx_stalled: bool,
    /// Reading stopped at the round's limit with more perhaps waiting (in rustls's buffer,
    /// which the socket's readiness does not show).
    rx_more: bool,
    mem: usize,
    completions: Vec<(u32, IoStatus)>,
    extents: Vec<BlockExtent>,
    /// Why the connection is ending: no new requests; it finishes those it has, then closes.
    closing: Option<String>,
    /// When a closing connection stops retrying requests refused as busy (the export's close
    /// bound, [`CLOSE_TIMEOUT`] by default, after it began closing).
    close_deadline: Option<Instant>,
    /// The socket failed: replies are dropped; it waits for the device and closes.
    broken: bool,
    /// The client broke the protocol (or vanished mid-request): logged as a warning.
    misbehaved: bool,
}

fn event_set_err(e: io::Error) -> BdevError {
    BdevError::Unsupported(format!("epoll: {e}"))
}

impl ConnPoller {
    pub(crate) fn new(s: ConnSetup, stats: Arc<ConnStats>) -> Result<ConnPoller, BdevError> {
        let channel = match s.export.bdev.as_disk() {
            Some(disk) => disk.open_typed()?,
            None => DiskIo::Device(s.export.bdev.open_channel()?),
        };
        set_send_buffer(s.fd.as_fd());
        let epoll = Epoll::new().map_err(event_set_err)?;
        let interest = EventSet::IN;
        epoll
            .ctl(ControlOperation::Add, s.fd.as_raw_fd(), EpollEvent::new(interest, 0))
            .map_err(event_set_err)?;
        s.export.connections.fetch_add(1, Ordering::Relaxed);
        Ok(ConnPoller {
            sock: Socket { fd: s.fd, tls: s.tls },
            epoll,
            interest,
            export: s.export,
            channel,
            structured: s.structured,
            allocation: s.allocation,
            peer: s.peer,
            counters: NbdStats::default(),
            counted: false,
            stats,
            slots: (0..MAX_IN_FLIGHT).map(|_| Slot::new()).collect(),
            free: (0..MAX_IN_FLIGHT as u16).rev().collect(),
            ready: VecDeque::with_capacity(MAX_IN_FLIGHT),
            tx: VecDeque::with_capacity(MAX_IN_FLIGHT),
            tx_sent: 0,
            tx_blocked: false,
            rx: vec![0u8; RX_SIZE].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            receiving: None,
            rx_stalled: false,
            rx_more: false,
            mem: 0,
            completions: Vec::with_capacity(MAX_IN_FLIGHT),
            extents: Vec::with_capacity(MAX_EXTENTS),
            closing: None,
            close_deadline: None,
            broken: false,
            misbehaved: false,
        })
    }

    /// The export is stopping: finish what was asked, then close (the export sees it by
    /// the connection's `alive` flag).
    /// The stop's `deadline` is also the connection's bound for requests refused as busy (one
    /// deadline, so the two never race).
    pub(crate) fn request_stop(&mut self, deadline: Instant) {
        self.close_after("the export was stopped".into());
        self.close_deadline = self.close_deadline.map(|d| d.min(deadline));
    }

    /// The stop's bound passed: gives up every request parked on Busy (answered `EIO`) now,
    /// and says how many requests the device still holds.
    pub(crate) fn give_up_at_stop(&mut self) -> usize {
        self.close_deadline = Some(Instant::now());
        self.abort_waiting(Instant::now());
        self.reap();
        self.channel.in_flight()
    }

    fn close_after(&mut self, why: String) {
        if self.closing.is_none() {
            self.closing = Some(why);
            self.close_deadline = Some(Instant::now() + self.export.close_timeout);
        }
        if let Some((i, _)) = self.receiving.take() {
            self.release(i);
        }
    }

    /// At the close deadline, answers `EIO` to the requests the device still refuses as busy:
    /// those waiting here, and those the bdev stack took and keeps retrying (they complete
    /// `ECANCELED`, answered `EIO`, at the next reap).
    fn abort_waiting(&mut self, now: Instant) {
        if self.close_deadline.is_none_or(|d| now < d) {
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
        self.broken = true;
        while let Some(i) = self.tx.pop_front() {
            self.release(i);
        }
        while let Some(i) = self.ready.pop_front() {
            self.release(i);
        }
    }

    fn can_accept(&self) -> bool {
        self.closing.is_none() && !self.free.is_empty() && self.mem < MEM_BUDGET
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
        let mut moved = false;
        self.rx_stalled = false;
        self.rx_more = false;
        for _ in 0..READS_PER_ROUND {
            if self.closing.is_some() {
                return moved;
            }
            if let Some((i, filled)) = self.receiving {
                let len = self.slots[i as usize].req.length as usize;
                let buf = self.slots[i as usize].buf.as_mut().expect("a receiving write has a buffer");
                match self.sock.recv(&mut buf.as_mut_slice()[filled..len]) {
                    Recv::Data(n) => {
                        moved = true;
                        if filled + n == len {
                            self.receiving = None;
                            self.slots[i as usize].phase = Phase::Ready;
                            self.ready.push_back(i);
                        } else {
                            self.receiving = Some((i, filled + n));
                        }
                        continue;
                    }
                    Recv::WouldBlock => return moved,
                    Recv::Eof => {
                        let why =
                            format!("client disconnected in the middle of a write ({filled} of {len} bytes)");
                        self.close_after(why);
                        self.misbehaved = true;
                        return true;
                    }
                    Recv::Failed(e) => {
                        self.fail(e);
                        return true;
                    }
                }
            }
            if !self.parse() {
                self.rx_stalled = true;
                return moved;
            }
            if self.receiving.is_some() || self.closing.is_some() {
                moved = true;
                continue;
            }
            // Room for more: move the partial header to the front and read.
            if self.rx_start > 0 {
                self.rx.copy_within(self.rx_start..self.rx_end, 0);
                self.rx_end -= self.rx_start;
                self.rx_start = 0;
            }
            let end = self.rx_end;
            match self.sock.recv(&mut self.rx[end..]) {
                Recv::Data(n) => {
                    self.rx_end += n;
                    moved = true;
                }
                Recv::WouldBlock => return moved,
                Recv::Eof => {
                    self.misbehaved = self.rx_end > self.rx_start;
                    let why = if self.misbehaved {
                        "client disconnected in the middle of a request header"
                    } else {
                        "client closed the connection"
                    };
                    self.close_after(why.into());
                    return true;
                }
                Recv::Failed(e) => {
                    self.fail(e);
                    return true;
                }
            }
        }
        self.rx_more = true;
        moved
    }

    /// Takes the complete headers (and the payload bytes that came with them) out of the
    /// receive buffer. False when it stopped for lack of a slot or memory.
    fn parse(&mut self) -> bool {
        while self.rx_end - self.rx_start >= REQUEST_LEN {
            if !self.can_accept() {
                return self.closing.is_some();
            }
            let head: &[u8; REQUEST_LEN] =
                self.rx[self.rx_start..self.rx_start + REQUEST_LEN].try_into().expect("length checked");
            let req = match Request::parse(head) {
                Ok(r) => r,
                Err(e) => {
                    // Nothing after this can be framed; requests before it are still answered.
                    self.close_after(e.to_string());
                    self.misbehaved = true;
                    return true;
                }
            };
            self.rx_start += REQUEST_LEN;
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
            let have = (self.rx_end - self.rx_start).min(payload);
            let buf = slot.buffer(payload);
            buf.as_mut_slice()[..have].copy_from_slice(&self.rx[self.rx_start..self.rx_start + have]);
            self.rx_start += have;
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

    /// Starts the ready requests; true when it started or answered any.
    fn start_ready(&mut self) -> bool {
        let mut moved = false;
        while let Some(&i) = self.ready.front() {
            match self.start(i) {
                Ok(()) => {
                    self.ready.pop_front();
                    moved = true;
                }
                Err(SubmitError::Busy) => break,
                Err(e) => {
                    self.ready.pop_front();
                    let err = if e == SubmitError::Unsupported { ENOTSUP } else { EINVAL };
                    self.reply(i, err, "the device refused the request");
                    moved = true;
                }
            }
        }
        moved
    }

    /// Checks a request and submits it, or answers it at once. `Err` only for what the channel
    /// refused.
    fn start(&mut self, i: u16) -> Result<(), SubmitError> {
        let info = self.export.bdev.info();
        let (io, readonly) = (info.io_types, self.export.readonly);
        let slot = &mut self.slots[i as usize];
        let r = slot.req;
        if slot.flush_due {
            return self.submit(i, IoOp::Flush, 0, 0);
        }
        let (offset, len) = (r.offset, u64::from(r.length));
        let in_range = info.check_range(offset, len).is_ok();
        let writes = matches!(r.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        let allowed_flags = match r.command {
            CMD_READ => CMD_FLAG_DF,
            CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
            CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
            _ => 0,
        };
        let refuse = |this: &mut Self, err, why: &str| {
            this.reply(i, err, why);
            Ok(())
        };
        if r.flags & !allowed_flags != 0 {
            return refuse(self, EINVAL, "flags not valid for this command");
        }
        if writes && readonly {
            return refuse(self, EPERM, "the export is read-only");
        }
        if !matches!(r.command, CMD_FLUSH) && r.command <= CMD_BLOCK_STATUS && !in_range {
            // As QEMU's server: a write past the end is out of space, anything else invalid.
            let past_end = offset.checked_add(len).is_none_or(|end| end > info.size_bytes());
            if past_end && matches!(r.command, CMD_WRITE | CMD_WRITE_ZEROES) {
                return refuse(self, ENOSPC, "write past the end of the export");
            }
            return refuse(self, EINVAL, "request outside the export or not aligned to its block size");
        }
        match r.command {
            CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES if len == 0 => refuse(self, 0, ""),
            CMD_READ => {
                let slot = &mut self.slots[i as usize];
                let ptr = slot.buffer(len as usize).as_mut_ptr();
                slot.iov = libc::iovec { iov_base: ptr.cast(), iov_len: len as usize };
                self.submit(i, IoOp::Read, offset, len)
            }
            CMD_WRITE => {
                let slot = &mut self.slots[i as usize];
                let ptr = slot.buf.as_mut().expect("a write has its payload").as_mut_ptr();
                slot.iov = libc::iovec { iov_base: ptr.cast(), iov_len: len as usize };
                self.submit(i, IoOp::Write, offset, len)
            }
            CMD_FLUSH if !io.flush => refuse(self, 0, ""),
            CMD_FLUSH => self.submit(i, IoOp::Flush, 0, 0),
            CMD_TRIM if !io.unmap => refuse(self, EINVAL, "the device cannot trim"),
            CMD_TRIM => self.submit(i, IoOp::Discard, offset, len),
            CMD_WRITE_ZEROES if !io.write_zeroes => {
                let err = if r.flags & CMD_FLAG_FAST_ZERO != 0 { ENOTSUP } else { EINVAL };
                refuse(self, err, "the device cannot write zeroes")
            }
            CMD_WRITE_ZEROES => self.submit(i, IoOp::WriteZeroes, offset, len),
            // Nothing to warm: no backend keeps a cache of its own (files are opened O_DIRECT,
            // librbd's cache is off), so the range check above is all a CACHE needs.
            CMD_CACHE => refuse(self, 0, ""),
            CMD_BLOCK_STATUS if len == 0 => refuse(self, EINVAL, "block status of zero bytes"),
            CMD_BLOCK_STATUS => {
                self.block_status(i);
                Ok(())
            }
            _ => refuse(self, EINVAL, "unknown command"),
        }
    }

    fn submit(&mut self, i: u16, op: IoOp, offset: u64, len: u64) -> Result<(), SubmitError> {
        let slot = &mut self.slots[i as usize];
        let data = matches!(op, IoOp::Read | IoOp::Write);
        let req = IoRequest {
            tag: u32::from(i),
            op,
            offset,
            len,
            iov: if data {
                // SAFETY: the slot's iovec and the buffer it points at belong to the slot, which
                // is neither moved nor reused until this request's completion comes back.
                unsafe { fp_bdev::Iovecs::from_raw(&slot.iov, 1) }
            } else {
                fp_bdev::Iovecs::NONE
            },
        };
        self.channel.submit(&req)?;
        slot.phase = if slot.flush_due { Phase::Flushing } else { Phase::Submitted };
        Ok(())
    }

    /// Answers a BLOCK_STATUS from the device's allocation map.
    fn block_status(&mut self, i: u16) {
        let r = self.slots[i as usize].req;
        if !self.allocation {
            return self.reply(i, EINVAL, "base:allocation was not negotiated");
        }
        let info = self.export.bdev.info();
        self.extents.clear();
        if let Err(e) = self.export.bdev.block_status(r.offset, u64::from(r.length), &mut self.extents) {
            return self.reply(i, EIO, &format!("block status: {e}"));
        }
        let bs = u64::from(info.block_size);
        let slot = &mut self.slots[i as usize];
        slot.extra.clear();
        slot.extra.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
        let mut covered = 0u64;
        let want = if r.flags & CMD_FLAG_REQ_ONE != 0 { 1 } else { MAX_EXTENTS };
        for e in self.extents.iter().take(want) {
            // An extent's length is 32 bits on the wire; a longer one is cut at a block.
            let len = e.len.min(u64::from(u32::MAX) / bs * bs).min(u64::from(r.length) - covered);
            if len == 0 {
                break;
            }
            let flags = if e.hole { STATE_HOLE } else { 0 } | if e.zero { STATE_ZERO } else { 0 };
            slot.extra.extend_from_slice(&(len as u32).to_be_bytes());
            slot.extra.extend_from_slice(&flags.to_be_bytes());
            covered += len;
            if len < e.len {
                break;
            }
        }
        if covered == 0 {
            return self.reply(i, EIO, "the device described no extent");
        }
        slot.set_chunk(REPLY_TYPE_BLOCK_STATUS, slot.extra.len() as u32);
        slot.data_len = 0;
        self.queue_reply(i);
    }

    /// Builds the reply to a finished request (`err` 0 for success) and queues it.
    fn reply(&mut self, i: u16, err: u32, why: &str) {
        let slot = &mut self.slots[i as usize];
        let r = slot.req;
        let data = if err == 0 && r.command == CMD_READ { r.length as usize } else { 0 };
        self.counters.count(r.command, r.length, err);
        self.counted = true;
        slot.extra.clear();
        if !self.structured {
            slot.hdr[..SIMPLE_REPLY_LEN].copy_from_slice(&simple_reply(err, r.cookie));
            slot.hdr_len = SIMPLE_REPLY_LEN;
        } else if err != 0 {
            slot.extra.extend_from_slice(&err.to_be_bytes());
            slot.extra.extend_from_slice(&(why.len() as u16).to_be_bytes());
            slot.extra.extend_from_slice(why.as_bytes());
            slot.set_chunk(REPLY_TYPE_ERROR, slot.extra.len() as u32);
        } else if data > 0 {
            slot.set_chunk(REPLY_TYPE_OFFSET_DATA, 8 + r.length);
            slot.hdr[CHUNK_HEADER_LEN..].copy_from_slice(&r.offset.to_be_bytes());
            slot.hdr_len = CHUNK_HEADER_LEN + 8;
        } else {
            slot.set_chunk(REPLY_TYPE_NONE, 0);
        }
        slot.data_len = data;
        if err != 0 && err != EINVAL && err != EPERM {
            log::debug!(
                "nbd export '{}': {}: {} failed: {why}",
                self.export.name,
                self.peer,
                command_name(r.command)
            );
        }
        self.queue_reply(i);
    }

    fn queue_reply(&mut self, i: u16) {
        if self.broken {
            return self.release(i);
        }
        self.slots[i as usize].phase = Phase::Replying;
        self.tx.push_back(i);
    }

    /// Reaps completions; FUA requests go on to their flush.
    fn reap(&mut self) -> usize {
        let mut done = std::mem::take(&mut self.completions);
        let n = self.channel.poll(&mut |tag: u32, status: IoStatus| done.push((tag, status)));
        for &(tag, status) in &done {
            let i = tag as u16;
            let slot = &mut self.slots[i as usize];
            // A device without a flush has no volatile cache: its writes are durable already.
            let fua = slot.req.flags & CMD_FLAG_FUA != 0
                && slot.phase == Phase::Submitted
                && self.export.bdev.info().io_types.flush;
            if status == IoStatus::Success && fua {
                slot.flush_due = true;
                slot.phase = Phase::Ready;
                self.ready.push_back(i);
                continue;
            }
            let (err, why) = match status {
                IoStatus::Success => (0, ""),
                IoStatus::Unsupported => (ENOTSUP, "the device does not support this operation"),
                IoStatus::Error(e) => (nbd_errno(e), "the device failed the request"),
            };
            self.reply(i, err, why);
        }
        done.clear();
        self.completions = done;
        n
    }

    /// Sends queued replies; true when it sent anything.
    fn send(&mut self) -> bool {
        let mut moved = false;
        self.tx_blocked = false;
        while !self.tx.is_empty() && !self.broken {
            let mut iov = [IoSlice::new(&[]); IOV_PER_WRITE];
            let pieces = self.tx.iter().flat_map(|&i| self.slots[i as usize].pieces());
            let n_iov = fp_sys::gather(pieces, self.tx_sent, &mut iov);
            let sent = match self.sock.send(&iov[..n_iov]) {
                Ok(0) => {
                    self.tx_blocked = true;
                    break;
                }
                Ok(n) => n,
                Err(e) => {
                    self.fail(format!("sending replies: {e}"));
                    return true;
                }
            };
            moved = true;
            let mut left = self.tx_sent + sent;
            while let Some(&i) = self.tx.front() {
                let len = self.slots[i as usize].reply_len();
                if left < len {
                    break;
                }
                left -= len;
                self.tx.pop_front();
                self.release(i);
            }
            self.tx_sent = left;
        }
        if !self.broken && self.sock.tls_wants_write() {
            match self.sock.flush_tls() {
                Ok(flushed) => self.tx_blocked |= !flushed,
                Err(e) => self.fail(format!("sending replies: {e}")),
            }
        }
        moved
    }

    /// Whether every request is answered (or dropped) and the connection may close.
    fn drained(&self) -> bool {
        self.free.len() == MAX_IN_FLIGHT && (self.broken || !self.sock.tls_wants_write())
    }

    fn finish(&mut self) {
        let why = self.closing.take().unwrap_or_default();
        if let Some(tls) = &mut self.sock.tls {
            if !self.broken {
                tls.send_close_notify();
                let _ = self.sock.flush_tls();
            }
        }
        let (export, peer) = (&self.export.name, &self.peer);
        if self.broken || self.misbehaved {
            log::warn!("nbd export '{export}': {peer}: {why}; connection closed");
        } else {
            log::info!("nbd export '{export}': {peer}: {why}; connection closed");
        }
        // The fd itself closes when the poller is dropped.
        let _ = fp_sys::shutdown(self.sock.fd.as_fd());
    }

    fn set_interest(&mut self, want: EventSet) {
        if want != self.interest {
            let ev = EpollEvent::new(want, 0);
            if self.epoll.ctl(ControlOperation::Modify, self.sock.fd.as_raw_fd(), ev).is_ok() {
                self.interest = want;
            }
        }
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

/// Maps a device's errno to the protocol's few values.
fn nbd_errno(e: i32) -> u32 {
    match e {
        libc::EPERM | libc::EROFS | libc::EACCES => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::ENOTSUP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

impl Drop for ConnPoller {
    fn drop(&mut self) {
        self.export.conns().close(&self.stats, &self.counters);
        self.export.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Poller for ConnPoller {
    fn poll(&mut self) -> PollStatus {
        let mut busy = self.receive();
        busy |= self.start_ready();
        busy |= self.reap() > 0;
        // Requests that finished at once (errors, block status, FUA flushes) go out this round.
        busy |= self.start_ready();
        if self.closing.is_some() {
            self.abort_waiting(Instant::now());
        }
        busy |= self.send();
        if self.counted {
            self.stats.publish(&self.counters);
            self.counted = false;
        }
        if self.closing.is_some() && self.drained() {
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
            || (!self.tx.is_empty() && !self.tx_blocked && !self.broken)
            || ((self.rx_stalled || self.rx_more) && self.can_accept())
            || (self.closing.is_some() && self.drained())
    }

    fn idle_window(&self) -> Option<Duration> {
        // As the vhost queue: a backend that signals its completions is slept on.
        self.channel.sleeps_in_flight().then_some(Duration::ZERO)
    }

    fn prepare_sleep(&mut self) -> bool {
        let mut want = EventSet::empty();
        if self.closing.is_none() && self.can_accept() {
            want |= EventSet::IN;
        }
        if self.tx_blocked || (self.sock.tls_wants_write() && !self.broken) {
            want |= EventSet::OUT;
        }
        self.set_interest(want);
        self.channel.arm_completion_fd()
    }

    fn after_wake(&mut self) {
        self.channel.disarm_completion_fd();
    }

    fn wake_fds(&self) -> Vec<RawFd> {
        let mut fds = vec![self.epoll.as_raw_fd()];
        if let Some(fd) = self.channel.completion_fd() {
            fds.push(fd);
        }
        fds
    }
}
