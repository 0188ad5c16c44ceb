//! One NVMe/TCP host connection: a queue pair over a stream socket (NVMe/TCP Transport
//! Specification 1.0, "TCP" below). Commands are capsules queued in a send list and sent with
//! one `sendmsg` per flush; a write's data goes in the capsule when the controller allows
//! in-capsule data of that size, else after the controller's R2T in H2CData PDUs; a read's
//! data comes in C2HData PDUs. Data never passes through a buffer of the queue's own unless it
//! arrived in the same receive as a header (then it is copied out of the staging buffer): the
//! send list points into the caller's buffers, and a receive with data pending goes straight
//! into them, with the staging buffer last to take what follows.
//!
//! Everything the controller sends is checked before it is used: a PDU's layout and digests, a
//! command ID in flight, data of a read within its length and in order, an R2T of a write
//! within its length and only when none is being answered. A violation kills the queue
//! ([`NvmeError::Protocol`]); nothing is written outside the caller's buffers.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use fp_bdev::iov::{self, BounceBuf, IovRun};
use fp_bdev::{IovSlices, Iovecs, SubmitError};
use fp_conn::uring::UringSocket;
use fp_conn::{Recv, RecvBuf, SendQueue, Sent};
use fp_crypto::tls::TlsStream;
use fp_nvme_spec::tcp::{self as pdu, Digests, CH_LEN, DIGEST_LEN, HEADER_ROOM};
use fp_nvme_spec::{Cqe, Sqe, SGL_IN_CAPSULE, SGL_TRANSPORT};

use crate::cid::CidTable;
use crate::transport::{AdminData, QueueStats};
use crate::NvmeError;

mod receive;

/// One receive into `dst`: out of the io_uring engine's buffers, through the TLS session, or
/// a `recv` system call.
#[inline]
fn recv(
    uring: &mut Option<UringSocket>,
    tls: &mut Option<TlsStream>,
    fd: BorrowedFd<'_>,
    dst: &mut [u8],
) -> Recv {
    match (uring, tls) {
        (Some(u), _) => u.recv(dst),
        (None, None) => Recv::from_socket(fd, dst),
        (None, Some(t)) => Recv::from_result(t.recv(fd, dst)),
    }
}

/// One send of `iov`: a `sendmsg` system call, or through the TLS session (which takes the
/// bytes; their ciphertext may wait for [`TlsStream::flush`]).
#[inline]
fn send_vectored(tls: &mut Option<TlsStream>, fd: BorrowedFd<'_>, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    match tls {
        None => fp_sys::send_vectored_nonblocking(fd, iov),
        Some(t) => t.send_vectored(fd, iov),
    }
}

/// How long a queue on io_uring waits for its send before its arena may grow.
const SEND_WAIT: Duration = Duration::from_secs(5);
/// Bytes of the staging buffer headers are received into (and small data with them).
const STAGING: usize = 64 << 10;
/// A tag no caller uses: the queue's own synchronous commands (Connect, admin commands).
pub(crate) const SYNC_TAG: u32 = u32::MAX;
/// The tag of Asynchronous Event Requests (they stay outstanding; see `admin`).
pub(crate) const AER_TAG: u32 = u32::MAX - 1;
/// The tag of an I/O queue's own re-authentication commands (`reauth`).
pub(crate) const AUTH_TAG: u32 = u32::MAX - 2;

/// What the connection was set up with: ICResp's answers and the controller's in-capsule
/// data size for this queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    pub qid: u16,
    pub digests: Digests,
    /// The controller's data alignment for PDUs the host sends (ICResp CPDA).
    pub cpda: u8,
    /// The most data one H2CData PDU may carry (ICResp MAXH2CDATA).
    pub maxh2cdata: u32,
    /// Writes up to this many bytes go in the capsule (admin queue: 8 KiB, TCP 3.3.1; I/O
    /// queues: Identify Controller's IOCCSZ less the command).
    pub icd: u32,
    /// Commands in flight at most.
    pub slots: u16,
    /// A successful read must have received all its data (I/O queues; an admin command's
    /// controller may send less than the buffer, as Get Log Page past the log's end).
    pub strict_reads: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    None,
    /// Host to controller (a write): in the capsule or by R2T.
    ToDevice,
    /// Controller to host (a read): C2HData.
    FromDevice,
}

/// The transport's state of a command in flight, beside its [`CidTable`] slot.
struct Slot {
    dir: Dir,
    len: u32,
    /// The command's buffers, over `entries` (the queue's copy of the caller's iovecs).
    iov: Iovecs,
    entries: IovSlices,
    /// The queue's own buffer for a synchronous command's data ([`TcpQueue::run`]): kept
    /// until the slot is reused, so an orphaned command's late data has somewhere to go.
    bounce: Option<BounceBuf>,
    /// FromDevice: bytes received so far (C2HData comes in order). ToDevice by R2T: the end of
    /// the last range asked for.
    done: u32,
    /// Send-list pieces that still point into `iov`: the command may not complete before they
    /// are sent (the caller's buffer would go while the queue still reads it).
    tx_pending: u32,
    /// Nobody waits any more (an admin command that timed out): its data goes nowhere, its
    /// completion is dropped.
    orphan: bool,
    /// A read that may complete with less data than its buffer (an authentication message:
    /// the buffer is the longest one's size).
    short_ok: bool,
}

#[derive(Clone, Copy)]
enum Piece {
    /// Bytes in the queue's own arena (headers, digests).
    Arena { at: usize, len: usize },
    /// A caller's bytes (in-capsule or H2C data) of the command in slot `slot`: a run of its
    /// iovecs.
    Data { run: IovRun, slot: u16 },
}

impl Piece {
    fn len(self) -> usize {
        match self {
            Piece::Arena { len, .. } => len,
            Piece::Data { run, .. } => run.len(),
        }
    }
}

/// What an I/O queue's poll drives when the keys change (see `reauth`).
pub(super) trait Reauthenticate: Send {
    /// Whether there is anything to do: the keys changed, or a run is under way.
    fn due(&self) -> bool;
    /// Advances the run given its command's completion, if one came; an error kills the queue.
    fn step(&mut self, q: &mut TcpQueue, cqe: Option<Cqe>) -> Result<(), NvmeError>;
    /// Queue `qid` died with `e`: a run under way fails with it (reported to the waiter), as
    /// the error it returns.
    fn lost(&mut self, qid: u16, e: NvmeError) -> NvmeError;
}

/// Where the receive side is within the stream.
#[derive(Debug, Clone, Copy)]
enum Rx {
    /// At a PDU's first byte.
    Header,
    /// Inside a C2HData's data: `left` bytes still to come for command `cid` (in slot
    /// `slot`), at `offset`.
    Data { cid: u16, slot: u16, offset: u32, left: u32, crc: u32, digest: bool, success: bool },
    /// After a C2HData's data: its 4-byte data digest.
    Digest { cid: u16, crc: u32, success: bool },
}

/// One NVMe/TCP queue pair on a connected stream socket.
pub struct TcpQueue {
    fd: OwnedFd,
    /// The socket on its reactor's io_uring engine (an I/O queue when the process's default
    /// socket implementation is `uring`), registered at the queue's first use there. Before the
    /// arena and the slots: dropping it waits until the kernel is done with the send's memory.
    uring: Option<UringSocket>,
    /// To be registered with the engine of the thread that first uses the queue.
    want_uring: bool,
    /// The connection's TLS session (a path attached with a PSK): every byte is received and
    /// sent through it. Never with `uring`.
    tls: Option<TlsStream>,
    p: Params,
    cids: CidTable,
    slots: Box<[Slot]>,
    arena: Vec<u8>,
    pieces: SendQueue<Piece>,
    rx: RecvBuf,
    rx_state: Rx,
    /// This call's last receive on the plain socket filled less than it offered: the socket
    /// had no more, and asking again now would be a system call for nothing (the next poll
    /// round asks).
    rx_drained: bool,
    dead: Option<NvmeError>,
    stats: QueueStats,
    data: DataStats,
    /// The common header of the last PDU received, echoed by a termination request.
    last_ch: [u8; CH_LEN],
    /// An I/O queue's in-band re-authentication when the keys change (`reauth`'s; behind a
    /// trait so that this file does not depend on the authentication code, which depends on
    /// it).
    pub(super) reauth: Option<Box<dyn Reauthenticate>>,
    /// A re-authentication runs: new I/O is refused with `Busy` until it is done.
    holding: bool,
}

impl Drop for TcpQueue {
    fn drop(&mut self) {
        if let Some(t) = &mut self.tls {
            // TLS's close_notify, as far as the socket takes it now (never waited for): the
            // target sees the session end rather than a truncation.
            t.close(self.fd.as_fd());
        }
    }
}

/// Where a queue's C2HData bytes went: straight into the caller's buffers, or copied out of the
/// staging buffer (they came in the same receive as a header).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataStats {
    /// Bytes received straight into the caller's buffers.
    pub direct: u64,
    /// Bytes copied from the staging buffer.
    pub copied: u64,
}

fn protocol(what: impl Into<String>) -> NvmeError {
    NvmeError::Protocol(what.into())
}

fn dead_copy(e: &NvmeError) -> NvmeError {
    match e {
        NvmeError::Protocol(s) => NvmeError::Protocol(s.clone()),
        NvmeError::Gone(s) => NvmeError::Gone(s.clone()),
        other => NvmeError::Gone(other.to_string()),
    }
}

/// The data direction of an opcode (Base 3, Figure 83: bit 0 host to controller, bit 1
/// controller to host).
pub(crate) fn direction(opcode: u8) -> Dir {
    match opcode & 3 {
        1 => Dir::ToDevice,
        2 => Dir::FromDevice,
        _ => Dir::None,
    }
}

impl TcpQueue {
    /// A queue on `fd`, a connected stream socket past ICReq/ICResp (through `tls` when the
    /// connection has a TLS session).
    pub(crate) fn new(fd: OwnedFd, p: Params, tls: Option<TlsStream>) -> TcpQueue {
        let n = p.slots.max(1);
        let slots = (0..n)
            .map(|_| Slot {
                dir: Dir::None,
                len: 0,
                iov: Iovecs::NONE,
                entries: IovSlices::new(16),
                bounce: None,
                done: 0,
                tx_pending: 0,
                orphan: false,
                short_ok: false,
            })
            .collect();
        TcpQueue {
            fd,
            uring: None,
            want_uring: false,
            tls,
            p,
            cids: CidTable::new(n),
            slots,
            arena: Vec::with_capacity(usize::from(n) * 96),
            pieces: SendQueue::with_capacity(usize::from(n) * 4),
            rx: RecvBuf::new(STAGING),
            rx_state: Rx::Header,
            rx_drained: false,
            dead: None,
            stats: QueueStats::default(),
            data: DataStats::default(),
            last_ch: [0; CH_LEN],
            reauth: None,
            holding: false,
        }
    }

    /// Whether new I/O waits (a re-authentication runs).
    #[inline]
    pub(crate) fn holding(&self) -> bool {
        self.holding
    }

    pub(super) fn set_holding(&mut self, holding: bool) {
        self.holding = holding;
    }

    /// Kills the queue with `e` (a failed re-authentication); returns its copy.
    pub(super) fn fail(&mut self, e: NvmeError) -> NvmeError {
        self.die(e)
    }

    /// Reads and writes the socket through the io_uring engine of the thread that uses it
    /// next (an I/O queue, which the controller's thread connects and hands to a reactor).
    pub(crate) fn use_uring(&mut self) {
        // The engine moves plain bytes only: a TLS queue stays on system calls.
        self.want_uring = self.tls.is_none();
    }

    /// Whether a receive shorter than it offered says the socket is empty for now: on a plain
    /// socket; not on io_uring (it hands out one of its buffers at a time), nor while the TLS
    /// session has ciphertext it has not taken yet.
    #[inline]
    fn socket_drained(&self) -> bool {
        self.uring.is_none() && self.tls.as_ref().is_none_or(|t| !t.has_received())
    }

    /// Whether the connection runs TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether the TLS session holds work for the socket: ciphertext not yet sent, or received
    /// and not yet decrypted (a wait for the socket would not see it).
    fn tls_pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.has_unsent() || t.has_received())
    }

    /// Registers with this thread's engine if the queue is to use one and has not yet (a
    /// queue whose engine cannot be set up stays on plain system calls). Called on every
    /// submit and poll: the check is inline, the registration (once) is not.
    #[inline(always)]
    pub(crate) fn attach(&mut self) {
        if self.want_uring {
            self.register_uring();
        }
    }

    #[cold]
    #[inline(never)]
    fn register_uring(&mut self) {
        self.want_uring = false;
        if self.uring.is_some() {
            return;
        }
        match UringSocket::register(self.fd.as_fd()) {
            Ok(u) => self.uring = Some(u),
            Err(e) => log::warn!("nvme tcp queue {}: io_uring socket engine: {e}; plain sockets", self.p.qid),
        }
    }

    /// Whether the queue is on an io_uring engine.
    pub fn uses_uring(&self) -> bool {
        self.uring.is_some()
    }

    pub(crate) fn params(&self) -> &Params {
        &self.p
    }

    /// Sets the in-capsule data limit (after Connect, whose data always goes in the capsule).
    pub(crate) fn set_icd(&mut self, icd: u32) {
        self.p.icd = icd;
    }

    /// Requires every later read to receive all its data (an I/O queue, once authentication,
    /// whose messages are shorter than the buffer they are read into, is done).
    pub(crate) fn set_strict_reads(&mut self, strict: bool) {
        self.p.strict_reads = strict;
    }

    pub(crate) fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Where received read data went (zero copy, or copied from staging).
    pub fn data_stats(&self) -> DataStats {
        self.data
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.cids.in_flight()
    }

    /// The queue's error if it died.
    pub(crate) fn check_alive(&self) -> Result<(), NvmeError> {
        match &self.dead {
            Some(e) => Err(dead_copy(e)),
            None => Ok(()),
        }
    }

    fn die(&mut self, e: NvmeError) -> NvmeError {
        let copy = dead_copy(&e);
        if self.dead.is_none() {
            log::warn!("nvme tcp queue {}: {e}", self.p.qid);
            // Nothing more is sent: the send list may point into buffers whose commands the
            // owner is about to take back.
            self.drop_send_list();
            self.dead = Some(e);
        }
        copy
    }

    /// A fatal transport error the controller made (TCP 3.6.2.3): an H2CTermReq saying which
    /// (FES, FEI, the offending PDU's common header), best effort, then the queue dies.
    fn violation(&mut self, fes: u16, fei: u32, what: impl Into<String>) -> NvmeError {
        // Not in the middle of a PDU of ours: the request would not be read as one.
        let in_flight = self.uring.as_ref().is_some_and(|u| u.send_in_flight());
        if self.dead.is_none() && !self.pieces.mid_entry() && !in_flight {
            self.drop_send_list();
            let mut b = [0u8; pdu::DATA_HLEN + pdu::TERM_REQ_MAX_DATA];
            let n = pdu::write_h2c_term_req(&mut b, &pdu::PduError { fes, fei, what: "" }, &self.last_ch);
            let _ = send_vectored(&mut self.tls, self.fd.as_fd(), &[IoSlice::new(&b[..n])]);
        }
        self.die(protocol(what))
    }

    /// A PDU out of sequence (a command not in flight, data or an R2T it cannot have).
    fn sequence(&mut self, what: String) -> NvmeError {
        self.violation(pdu::FES_PDU_SEQUENCE_ERROR, 0, what)
    }

    fn drop_send_list(&mut self) {
        if let Some(u) = &mut self.uring {
            // The kernel lets go of the send's memory (the arena, callers' buffers) first.
            u.close();
        }
        while let Some(p) = self.pieces.drop_front() {
            if let Piece::Data { slot, .. } = p {
                self.slots[usize::from(slot)].tx_pending -= 1;
            }
        }
        self.arena.clear();
    }

    fn push_arena(&mut self, bytes: &[u8]) {
        if self.arena.len() + bytes.len() > self.arena.capacity() {
            // Growing moves the arena: not while a send in the kernel points into it.
            self.wait_send();
        }
        let at = self.arena.len();
        self.arena.extend_from_slice(bytes);
        self.pieces.push(Piece::Arena { at, len: bytes.len() });
    }

    /// Queues the data `[offset, offset + len)` of the command in slot `slot` (its digest too
    /// when data digests are on).
    fn push_data(&mut self, slot: u16, offset: usize, len: usize) {
        let s = &mut self.slots[usize::from(slot)];
        let mut crc = 0u32;
        let digest = self.p.digests.data;
        let pieces = &mut self.pieces;
        let data = s.iov;
        iov::runs(&data, offset as u64, len as u64, |run| {
            if digest {
                crc = pdu::crc32c_append(crc, run.bytes(&data));
            }
            pieces.push(Piece::Data { run, slot });
            s.tx_pending += 1;
        });
        if digest {
            self.push_arena(&crc.to_le_bytes());
        }
    }

    /// Queues a command; `iov` describes its data (if any), `dir` the direction. The iovec
    /// array is copied (as [`crate::transport::IoQueue::submit`] says); the buffers are used
    /// until the completion or the drain.
    pub(crate) fn submit_dir(
        &mut self,
        sqe: &Sqe,
        iov: Iovecs,
        dir: Dir,
        tag: u32,
    ) -> Result<u16, SubmitError> {
        if self.dead.is_some() {
            // Refused for now: the owner's next poll reports the queue dead, and it drains it
            // and retries on the controller's next queue.
            return Err(SubmitError::Busy);
        }
        let Ok(len32) = u32::try_from(iov.total_len()) else { return Err(SubmitError::OutOfRange) };
        let len = len32 as usize;
        let dir = if len == 0 { Dir::None } else { dir };
        if len > 0 && dir == Dir::None {
            return Err(SubmitError::Unsupported);
        }
        let Some(cid) = self.cids.alloc(tag, fp_bdev::clock::ticks::now()) else {
            return Err(SubmitError::Busy);
        };
        let slot = self.cids.slot(cid) as u16;
        let s = &mut self.slots[usize::from(slot)];
        s.dir = dir;
        s.len = len32;
        if s.entries.capacity() < iov.count() as usize {
            // More iovecs than any command before: room for them, once.
            s.entries = IovSlices::new(iov.count() as usize);
        }
        s.iov = s.entries.copy(&iov).unwrap_or(Iovecs::NONE);
        s.bounce = None;
        s.done = 0;
        s.orphan = false;
        s.short_ok = tag == AUTH_TAG;
        self.stats.submitted += 1;

        let mut cmd = *sqe;
        cmd.set_cid(cid);
        cmd.set_psdt(1);
        let in_capsule = dir == Dir::ToDevice && len32 <= self.p.icd;
        let kind = if in_capsule { SGL_IN_CAPSULE } else { SGL_TRANSPORT };
        cmd.set_sgl(fp_nvme_spec::sgl_descriptor(kind, len32));
        let mut h = [0u8; HEADER_ROOM];
        let data = if in_capsule { len } else { 0 };
        let n = pdu::write_capsule_cmd(&mut h, &cmd, data, self.p.digests, self.p.cpda);
        self.push_arena(&h[..n]);
        if in_capsule {
            self.slots[usize::from(slot)].done = len32;
            self.push_data(slot, 0, len);
        }
        Ok(cid)
    }

    /// Sends what the send list holds, as far as the socket takes it. Called every poll round:
    /// a round with nothing to send (and no send of io_uring's to reap, no TLS session whose
    /// ciphertext may wait for the socket) costs a check.
    #[inline]
    pub(crate) fn send(&mut self) -> Result<(), NvmeError> {
        if self.pieces.is_empty() && self.dead.is_none() && self.uring.is_none() && self.tls.is_none() {
            return Ok(());
        }
        self.send_list()
    }

    fn send_list(&mut self) -> Result<(), NvmeError> {
        self.check_alive()?;
        if self.uring.is_some() {
            return self.send_uring();
        }
        while !self.pieces.is_empty() {
            let (arena, slots, tls, fd) = (&self.arena, &self.slots, &mut self.tls, self.fd.as_fd());
            let bytes = |p: Piece| -> [&[u8]; 1] {
                [match p {
                    Piece::Arena { at, len } => &arena[at..at + len],
                    // A caller's buffer, readable until its command completes; a command with
                    // pieces unsent does not complete.
                    Piece::Data { run, slot } => run.bytes(&slots[usize::from(slot)].iov),
                }]
            };
            let r = self.pieces.write(bytes, |iov: &[IoSlice<'_>]| send_vectored(tls, fd, iov));
            self.stats.doorbells += 1;
            match r {
                Sent::Bytes(_) => {}
                Sent::Blocked => break,
                Sent::Failed(e) => return Err(self.die(NvmeError::Gone(format!("send: {e}")))),
            }
            self.pop_sent();
        }
        if self.pieces.is_empty() {
            self.arena.clear();
        }
        if let Some(t) = &mut self.tls {
            // Ciphertext the socket did not take before goes now, even with nothing queued.
            if let Err(e) = t.flush(self.fd.as_fd()) {
                return Err(self.die(NvmeError::Gone(format!("send: {e}"))));
            }
        }
        Ok(())
    }

    /// The pieces the writes took whole leave the send list (their commands may complete).
    fn pop_sent(&mut self) {
        while let Some(p) = self.pieces.pop_sent(Piece::len) {
            if let Piece::Data { slot, .. } = p {
                self.slots[usize::from(slot)].tx_pending -= 1;
            }
        }
    }

    /// The io_uring path of [`TcpQueue::send`]: takes the finished send's result, and queues
    /// the send list's bytes as the next, submitted at once (a queue has no round of its
    /// reactor's to wait for).
    fn send_uring(&mut self) -> Result<(), NvmeError> {
        self.reap_sent()?;
        let Some(u) = self.uring.as_mut() else { return Ok(()) };
        if !u.send_in_flight() && !self.pieces.is_empty() {
            let (arena, slots) = (&self.arena, &self.slots);
            let bytes = |p: Piece| -> [&[u8]; 1] {
                [match p {
                    Piece::Arena { at, len } => &arena[at..at + len],
                    Piece::Data { run, slot } => run.bytes(&slots[usize::from(slot)].iov),
                }]
            };
            let mut iov = [IoSlice::new(&[]); fp_conn::IOV_PER_WRITE];
            let n = self.pieces.gather(bytes, &mut iov);
            if u.queue_send(&iov[..n]) {
                self.stats.doorbells += 1;
                fp_conn::uring::flush();
            }
        }
        Ok(())
    }

    /// Takes the result of the send the kernel finished, if any: the pieces it took whole
    /// leave the send list.
    /// Called after every receive: on a plain socket (no send of the kernel's to reap) it is
    /// a check.
    #[inline]
    fn reap_sent(&mut self) -> Result<(), NvmeError> {
        if self.uring.is_none() {
            return Ok(());
        }
        self.reap_uring_sent()
    }

    fn reap_uring_sent(&mut self) -> Result<(), NvmeError> {
        let Some(r) = self.uring.as_mut().and_then(|u| u.take_sent()) else { return Ok(()) };
        match r {
            Ok(n) => self.pieces.took(n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(self.die(NvmeError::Gone(format!("send: {e}")))),
        }
        self.pop_sent();
        if self.pieces.is_empty() {
            self.arena.clear();
        }
        Ok(())
    }

    /// Waits (bounded) until the send in the kernel, if any, is done.
    fn wait_send(&mut self) {
        let deadline = Instant::now() + SEND_WAIT;
        while self.uring.as_ref().is_some_and(|u| u.send_in_flight()) {
            if Instant::now() >= deadline {
                self.die(NvmeError::Gone(format!("a send took over {SEND_WAIT:?}")));
                return;
            }
            fp_conn::uring::flush();
            std::hint::spin_loop();
        }
        let _ = self.reap_sent();
    }

    /// Makes sure `need` bytes are staged; `Ok(false)` when the socket has no more now.
    fn stage(&mut self, need: usize) -> Result<bool, NvmeError> {
        while self.rx.len() < need {
            if self.rx_drained {
                return Ok(false);
            }
            self.rx.reserve(need);
            let (fd, uring, tls) = (self.fd.as_fd(), &mut self.uring, &mut self.tls);
            let offered = self.rx.spare_mut().len();
            match self.rx.fill(|dst| recv(uring, tls, fd, dst)) {
                // What the controller sent after our send completes after that send's result:
                // take it first, so a completion never finds its command's data unsent.
                Recv::Data(n) => {
                    // Fewer bytes than offered: the plain socket is empty for now. (An
                    // io_uring receive hands out one of the engine's buffers at a time: a short
                    // one says nothing about the next.)
                    self.rx_drained = n < offered && self.socket_drained();
                    self.reap_sent()?
                }
                Recv::WouldBlock => return Ok(false),
                Recv::Eof => {
                    return Err(self.die(NvmeError::Gone("the controller closed the connection".into())))
                }
                Recv::Failed(e) => return Err(self.die(NvmeError::Gone(format!("receive: {e}")))),
            }
        }
        Ok(true)
    }

    /// Receives and handles what the controller sent, calling `done` with each completion
    /// (its tag and CQE); returns how many. Completions that came before the queue died are
    /// returned first: the error comes at the next call. Generic over `done`: the I/O queue's
    /// callback is called per completion, inline.
    pub(crate) fn receive(&mut self, done: &mut impl FnMut(u32, &Cqe)) -> Result<usize, NvmeError> {
        self.check_alive()?;
        self.rx_drained = false;
        let mut count = 0;
        match self.receive_some(done, &mut count) {
            Err(e) if count == 0 => Err(e),
            _ => Ok(count),
        }
    }

    fn receive_some(&mut self, done: &mut impl FnMut(u32, &Cqe), count: &mut usize) -> Result<(), NvmeError> {
        loop {
            let progressed = match self.rx_state {
                Rx::Header => self.rx_header(done, count)?,
                Rx::Data { .. } => self.rx_data(done, count)?,
                Rx::Digest { cid, crc, success } => {
                    if !self.stage(DIGEST_LEN)? {
                        false
                    } else {
                        let d = &self.rx.data()[..DIGEST_LEN];
                        if d != crc.to_le_bytes() {
                            return Err(self.die(protocol("C2HData data digest mismatch")));
                        }
                        self.rx.consume(DIGEST_LEN);
                        self.rx_state = Rx::Header;
                        self.c2h_done(cid, success, done, count)?;
                        true
                    }
                }
            };
            if !progressed {
                break;
            }
        }
        if !self.pieces.is_empty() {
            // H2CData queued by R2Ts goes now rather than a poll round later.
            self.send()?;
        }
        Ok(())
    }

    /// Commands in flight submitted before tick `before`: their IDs and tags.
    pub(crate) fn expired(&self, before: u64, out: &mut Vec<(u16, u32)>) {
        let first = out.len();
        self.cids.expired(before, out);
        // Not the queue's own waits: outstanding AERs, commands nobody waits for.
        let mut i = first;
        while i < out.len() {
            let (cid, tag) = out[i];
            if tag == AER_TAG || tag == AUTH_TAG || self.slots[self.cids.slot(cid)].orphan {
                out.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Forgets every command in flight (their tags into `out`); the queue is dead after.
    pub(crate) fn drain(&mut self, out: &mut Vec<u32>) {
        if self.dead.is_none() {
            // Its owner closes it (a channel going away, a reset): no failure, so not logged
            // as one (a failure was logged when it happened).
            log::debug!("nvme tcp queue {}: drained by its owner", self.p.qid);
            self.drop_send_list();
            self.dead = Some(NvmeError::Gone("the queue was drained".into()));
        }
        self.drop_send_list();
        let first = out.len();
        self.cids.drain(out);
        for i in 0..self.slots.len() {
            self.release(i);
        }
        // The queue's own synchronous and re-authentication commands have no owner to give
        // back to.
        let mut i = first;
        while i < out.len() {
            if out[i] == SYNC_TAG || out[i] == AUTH_TAG {
                out.remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Runs one command to its completion on the calling thread (the control plane: Connect,
    /// admin commands), waiting up to `timeout`. Completions of other commands (AERs) go to
    /// `other`. On a timeout the command is orphaned: its data and completion, if they come,
    /// are dropped, so `data` may go.
    pub(crate) fn run(
        &mut self,
        sqe: &Sqe,
        data: AdminData<'_>,
        timeout: Duration,
        other: &mut dyn FnMut(u32, &Cqe),
    ) -> Result<Cqe, NvmeError> {
        // The data goes through a buffer of the queue's own: a command that times out is
        // orphaned, and its late data must not reach `data`, which the caller takes back.
        let (mut bounce, dir) = match &data {
            AdminData::None => (None, Dir::None),
            AdminData::FromDevice(b) => (Some(BounceBuf::zeroed(b.len())), Dir::FromDevice),
            AdminData::ToDevice(b) => {
                let mut buf = BounceBuf::zeroed(b.len());
                buf.bytes_mut().copy_from_slice(b);
                (Some(buf), Dir::ToDevice)
            }
        };
        self.check_alive()?;
        let iov = bounce.as_mut().map_or(Iovecs::NONE, |b| b.iovecs(b.len()));
        let cid = self
            .submit_dir(sqe, iov, dir, SYNC_TAG)
            .map_err(|e| NvmeError::Gone(format!("no command slot free: {e}")))?;
        self.slots[self.cids.slot(cid)].bounce = bounce;
        let deadline = Instant::now() + timeout;
        let mut got = None;
        loop {
            self.send()?;
            let mut f = |tag: u32, cqe: &Cqe| {
                if tag == SYNC_TAG && cqe.cid == cid {
                    got = Some(*cqe);
                } else {
                    other(tag, cqe);
                }
            };
            self.receive(&mut f)?;
            if let Some(c) = got {
                if let AdminData::FromDevice(b) = data {
                    let s = &self.slots[self.cids.slot(cid)];
                    if let Some(bounce) = &s.bounce {
                        let n = (s.done as usize).min(b.len());
                        b[..n].copy_from_slice(&bounce.bytes()[..n]);
                    }
                }
                return Ok(c);
            }
            let now = Instant::now();
            if now >= deadline {
                self.orphan(cid);
                return Err(NvmeError::Timeout(format!(
                    "command {:#x} on queue {}",
                    sqe.opcode(),
                    self.p.qid
                )));
            }
            let wait = if self.pieces.is_empty() && !self.tls_pending() {
                deadline - now
            } else {
                Duration::from_millis(1).min(deadline - now)
            };
            fp_sys::wait_readable(&[self.fd.as_raw_fd()], Some(wait))
                .map_err(|e| NvmeError::io("waiting for the controller", e))?;
        }
    }

    /// Stops waiting for command `cid`: its data, if it comes, is dropped, and its buffer is
    /// never touched again.
    fn orphan(&mut self, cid: u16) {
        let s = &mut self.slots[self.cids.slot(cid)];
        s.orphan = true;
        s.iov = Iovecs::NONE;
        if s.tx_pending > 0 {
            // Its data is still listed to send from a buffer about to go.
            self.die(NvmeError::Gone(format!("command {cid} timed out with its data unsent")));
        }
    }
}
