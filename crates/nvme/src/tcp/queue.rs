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

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use fp_bdev::SubmitError;
use fp_nvme_spec::tcp::{
    self as pdu, CommonHeader, DataHeader, Digests, Layout, CH_LEN, DIGEST_LEN, HEADER_ROOM,
};
use fp_nvme_spec::{Cqe, Sqe, Status, CQE_LEN, SGL_IN_CAPSULE, SGL_TRANSPORT};

use crate::cid::CidTable;
use crate::transport::{AdminData, QueueStats};
use crate::NvmeError;

/// Bytes of the staging buffer headers are received into (and small data with them).
const STAGING: usize = 64 << 10;
/// Pieces (headers, data ranges, digests) one `sendmsg` takes at most.
const SEND_BATCH: usize = 64;
/// Caller buffer ranges one direct receive takes at most (the staging buffer is one more).
const RECV_BATCH: usize = 32;
/// A tag no caller uses: the queue's own synchronous commands (Connect, admin commands).
pub(crate) const SYNC_TAG: u32 = u32::MAX;
/// The tag of Asynchronous Event Requests (they stay outstanding; see `admin`).
pub(crate) const AER_TAG: u32 = u32::MAX - 1;

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
    iov: Vec<libc::iovec>,
    /// FromDevice: bytes received so far (C2HData comes in order). ToDevice by R2T: the end of
    /// the last range asked for.
    done: u32,
    /// Send-list pieces that still point into `iov`: the command may not complete before they
    /// are sent (the caller's buffer would go while the queue still reads it).
    tx_pending: u32,
    /// Nobody waits any more (an admin command that timed out): its data goes nowhere, its
    /// completion is dropped.
    orphan: bool,
}

enum Piece {
    /// Bytes in the queue's own arena (headers, digests).
    Arena { at: usize, len: usize },
    /// A caller's bytes (in-capsule or H2C data) of the command in slot `slot`.
    Data { ptr: *const u8, len: usize, slot: u16 },
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
    p: Params,
    cids: CidTable,
    slots: Box<[Slot]>,
    arena: Vec<u8>,
    pieces: VecDeque<Piece>,
    /// Bytes of the first piece already sent.
    sent: usize,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    rx_state: Rx,
    dead: Option<NvmeError>,
    stats: QueueStats,
    data: DataStats,
    /// The common header of the last PDU received, echoed by a termination request.
    last_ch: [u8; CH_LEN],
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

// SAFETY: the raw pointers in `pieces` and `slots[].iov` point into buffers the submitter keeps
// valid until the completion (IoQueue::submit's contract), wherever the queue runs; the queue
// is moved whole to the reactor that polls it and never shared.
unsafe impl Send for TcpQueue {}

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

/// Calls `f` with each piece of `iov`'s bytes `[offset, offset + len)`.
fn for_range(iov: &[libc::iovec], mut offset: usize, mut len: usize, mut f: impl FnMut(*mut u8, usize)) {
    for v in iov {
        if len == 0 {
            break;
        }
        if offset >= v.iov_len {
            offset -= v.iov_len;
            continue;
        }
        let n = (v.iov_len - offset).min(len);
        // The pointer stays inside the iovec (offset < iov_len), so the add is in bounds.
        f(v.iov_base.cast::<u8>().wrapping_add(offset), n);
        offset = 0;
        len -= n;
    }
}

impl TcpQueue {
    /// A queue on `fd`, a connected stream socket past ICReq/ICResp.
    pub(crate) fn new(fd: OwnedFd, p: Params) -> TcpQueue {
        let n = p.slots.max(1);
        let slots = (0..n)
            .map(|_| Slot {
                dir: Dir::None,
                len: 0,
                iov: Vec::with_capacity(16),
                done: 0,
                tx_pending: 0,
                orphan: false,
            })
            .collect();
        TcpQueue {
            fd,
            p,
            cids: CidTable::new(n),
            slots,
            arena: Vec::with_capacity(usize::from(n) * 96),
            pieces: VecDeque::with_capacity(usize::from(n) * 4),
            sent: 0,
            rx: vec![0u8; STAGING].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            rx_state: Rx::Header,
            dead: None,
            stats: QueueStats::default(),
            data: DataStats::default(),
            last_ch: [0; CH_LEN],
        }
    }

    pub(crate) fn params(&self) -> &Params {
        &self.p
    }

    /// Sets the in-capsule data limit (after Connect, whose data always goes in the capsule).
    pub(crate) fn set_icd(&mut self, icd: u32) {
        self.p.icd = icd;
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
        if self.dead.is_none() && self.sent == 0 {
            self.drop_send_list();
            let mut b = [0u8; pdu::DATA_HLEN + pdu::TERM_REQ_MAX_DATA];
            let n = pdu::write_h2c_term_req(&mut b, &pdu::PduError { fes, fei, what: "" }, &self.last_ch);
            let _ = fp_sys::send_vectored_nonblocking(self.fd.as_fd(), &[IoSlice::new(&b[..n])]);
        }
        self.die(protocol(what))
    }

    /// A PDU out of sequence (a command not in flight, data or an R2T it cannot have).
    fn sequence(&mut self, what: String) -> NvmeError {
        self.violation(pdu::FES_PDU_SEQUENCE_ERROR, 0, what)
    }

    fn drop_send_list(&mut self) {
        for p in self.pieces.drain(..) {
            if let Piece::Data { slot, .. } = p {
                self.slots[usize::from(slot)].tx_pending -= 1;
            }
        }
        self.sent = 0;
        self.arena.clear();
    }

    fn push_arena(&mut self, bytes: &[u8]) {
        let at = self.arena.len();
        self.arena.extend_from_slice(bytes);
        self.pieces.push_back(Piece::Arena { at, len: bytes.len() });
    }

    /// Queues the data `[offset, offset + len)` of the command in slot `slot` (its digest too
    /// when data digests are on).
    fn push_data(&mut self, slot: u16, offset: usize, len: usize) {
        let s = &mut self.slots[usize::from(slot)];
        let mut crc = 0u32;
        let digest = self.p.digests.data;
        let pieces = &mut self.pieces;
        for_range(&s.iov, offset, len, |ptr, n| {
            if digest {
                // SAFETY: the range lies in a buffer the submitter keeps readable until the
                // completion (submit's contract).
                crc = pdu::crc32c_append(crc, unsafe { std::slice::from_raw_parts(ptr, n) });
            }
            pieces.push_back(Piece::Data { ptr: ptr.cast_const(), len: n, slot });
            s.tx_pending += 1;
        });
        if digest {
            self.push_arena(&crc.to_le_bytes());
        }
    }

    /// Queues a command; `iov` describes its data (if any), `dir` the direction.
    ///
    /// # Safety
    /// As [`crate::transport::IoQueue::submit`]: the buffers stay valid until the completion
    /// or until the queue is drained.
    pub(crate) unsafe fn submit_dir(
        &mut self,
        sqe: &Sqe,
        iov: &[libc::iovec],
        dir: Dir,
        tag: u32,
    ) -> Result<u16, SubmitError> {
        if self.dead.is_some() {
            // Refused for now: the owner's next poll reports the queue dead, and it drains it
            // and retries on the controller's next queue.
            return Err(SubmitError::Busy);
        }
        let len: usize = iov.iter().map(|v| v.iov_len).sum();
        let Ok(len32) = u32::try_from(len) else { return Err(SubmitError::OutOfRange) };
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
        s.iov.clear();
        s.iov.extend_from_slice(iov);
        s.done = 0;
        s.orphan = false;
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

    /// Sends what the send list holds, as far as the socket takes it.
    pub(crate) fn send(&mut self) -> Result<(), NvmeError> {
        self.check_alive()?;
        while !self.pieces.is_empty() {
            let r = {
                let mut iov = [IoSlice::new(&[]); SEND_BATCH];
                let mut n = 0;
                for (i, p) in self.pieces.iter().take(SEND_BATCH).enumerate() {
                    let skip = if i == 0 { self.sent } else { 0 };
                    let bytes: &[u8] = match *p {
                        Piece::Arena { at, len } => &self.arena[at..at + len],
                        // SAFETY: a caller's buffer, readable until its command completes
                        // (submit's contract); a command with pieces unsent does not complete.
                        Piece::Data { ptr, len, .. } => unsafe { std::slice::from_raw_parts(ptr, len) },
                    };
                    iov[n] = IoSlice::new(&bytes[skip..]);
                    n += 1;
                }
                fp_sys::send_vectored_nonblocking(self.fd.as_fd(), &iov[..n])
            };
            self.stats.doorbells += 1;
            match r {
                Ok(n) => self.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.die(NvmeError::Gone(format!("send: {e}")))),
            }
        }
        if self.pieces.is_empty() {
            self.arena.clear();
        }
        Ok(())
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(p) = self.pieces.front() else { break };
            let len = match *p {
                Piece::Arena { len, .. } | Piece::Data { len, .. } => len,
            };
            let left = len - self.sent;
            if n < left {
                self.sent += n;
                return;
            }
            n -= left;
            self.sent = 0;
            if let Some(Piece::Data { slot, .. }) = self.pieces.pop_front() {
                self.slots[usize::from(slot)].tx_pending -= 1;
            }
        }
    }

    /// Makes sure `need` bytes are staged from `rx_start`; `Ok(false)` when the socket has no
    /// more now.
    fn stage(&mut self, need: usize) -> Result<bool, NvmeError> {
        while self.rx_end - self.rx_start < need {
            if self.rx_start == self.rx_end {
                // Empty: the whole buffer for the next receive.
                self.rx_start = 0;
                self.rx_end = 0;
            } else if self.rx.len() - self.rx_start < need {
                self.rx.copy_within(self.rx_start..self.rx_end, 0);
                self.rx_end -= self.rx_start;
                self.rx_start = 0;
            }
            let end = self.rx_end;
            match fp_sys::recv_nonblocking(self.fd.as_fd(), &mut self.rx[end..]) {
                Ok(0) => return Err(self.die(NvmeError::Gone("the controller closed the connection".into()))),
                Ok(n) => self.rx_end += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.die(NvmeError::Gone(format!("receive: {e}")))),
            }
        }
        Ok(true)
    }

    /// Receives and handles what the controller sent, calling `done` with each completion
    /// (its tag and CQE); returns how many. Completions that came before the queue died are
    /// returned first: the error comes at the next call.
    pub(crate) fn receive(&mut self, done: &mut dyn FnMut(u32, &Cqe)) -> Result<usize, NvmeError> {
        self.check_alive()?;
        let mut count = 0;
        match self.receive_some(done, &mut count) {
            Err(e) if count == 0 => Err(e),
            _ => Ok(count),
        }
    }

    fn receive_some(&mut self, done: &mut dyn FnMut(u32, &Cqe), count: &mut usize) -> Result<(), NvmeError> {
        loop {
            let progressed = match self.rx_state {
                Rx::Header => self.rx_header(done, count)?,
                Rx::Data { .. } => self.rx_data(done, count)?,
                Rx::Digest { cid, crc, success } => {
                    if !self.stage(DIGEST_LEN)? {
                        false
                    } else {
                        let d = &self.rx[self.rx_start..self.rx_start + DIGEST_LEN];
                        if d != crc.to_le_bytes() {
                            return Err(self.die(protocol("C2HData data digest mismatch")));
                        }
                        self.rx_start += DIGEST_LEN;
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

    fn rx_header(&mut self, done: &mut dyn FnMut(u32, &Cqe), count: &mut usize) -> Result<bool, NvmeError> {
        if !self.stage(CH_LEN)? {
            return Ok(false);
        }
        self.last_ch.copy_from_slice(&self.rx[self.rx_start..self.rx_start + CH_LEN]);
        let ch = CommonHeader::parse(&self.last_ch);
        // HPDA 0 was asked: data at any multiple of 4.
        let l = match pdu::check_header(&ch, self.p.digests, 0, u32::MAX) {
            Ok(l) => l,
            Err(e) => {
                return Err(self.violation(e.fes, e.fei, format!("bad PDU header from the controller: {e}")))
            }
        };
        // Header, its digest, and the padding up to the data: all staged (at most 255 + 4).
        let head = if l.data_len > 0 { l.data_offset } else { l.header_len };
        if !self.stage(head)? {
            return Ok(false);
        }
        let hlen = usize::from(ch.hlen);
        let hb = &self.rx[self.rx_start..self.rx_start + head];
        if l.header_len > hlen && !pdu::header_digest_ok(&hb[..l.header_len], hlen) {
            return Err(self.violation(pdu::FES_HEADER_DIGEST_ERROR, 0, "header digest mismatch"));
        }
        let mut h = [0u8; HEADER_ROOM];
        h[..hlen].copy_from_slice(&hb[..hlen]);
        self.rx_start += head;
        match ch.pdu_type {
            pdu::PDU_CAPSULE_RESP => {
                let cqe = Cqe::from_bytes(h[CH_LEN..CH_LEN + CQE_LEN].try_into().expect("sixteen bytes"));
                self.complete(cqe, done, count)?;
            }
            pdu::PDU_C2H_DATA => self.c2h_header(&l, &h)?,
            pdu::PDU_R2T => self.r2t(&h)?,
            pdu::PDU_C2H_TERM_REQ => {
                let t = pdu::TermReq::parse(&h);
                return Err(self.die(protocol(format!("the controller ended the connection: {t:?}"))));
            }
            t => {
                let what = format!("unexpected PDU type {t:#x} from the controller");
                return Err(self.violation(pdu::FES_INVALID_HEADER_FIELD, 0, what));
            }
        }
        Ok(true)
    }

    /// The slot of command `cid`, which the controller named in a PDU: in flight, or the
    /// queue dies.
    fn busy_slot(&mut self, cid: u16, what: &str) -> Result<usize, NvmeError> {
        match self.cids.lookup(cid) {
            Ok((i, _)) => Ok(i),
            Err(e) => Err(self.sequence(format!("{what} names a command not in flight ({e})"))),
        }
    }

    fn c2h_header(&mut self, l: &Layout, h: &[u8]) -> Result<(), NvmeError> {
        let d = DataHeader::parse(h).expect("a data header is 24 bytes");
        let i = self.busy_slot(d.cccid, "C2HData")?;
        let s = &self.slots[i];
        if s.dir != Dir::FromDevice {
            return Err(self.sequence(format!("C2HData for command {}, which reads no data", d.cccid)));
        }
        if d.offset != s.done || d.length as usize != l.data_len {
            let what = format!(
                "C2HData at {} of {} bytes (PDU data {}) where {} were received",
                d.offset, d.length, l.data_len, s.done
            );
            return Err(self.violation(pdu::FES_DATA_OUT_OF_RANGE, 0, what));
        }
        if u64::from(d.offset) + u64::from(d.length) > u64::from(s.len) {
            let what = format!(
                "C2HData to {} beyond the command's {} bytes",
                u64::from(d.offset) + u64::from(d.length),
                s.len
            );
            return Err(self.violation(pdu::FES_DATA_OUT_OF_RANGE, 0, what));
        }
        let last = l.ch.flags & pdu::FLAG_LAST_PDU != 0;
        let success = l.ch.flags & pdu::FLAG_SUCCESS != 0;
        if success && !last {
            return Err(self.violation(
                pdu::FES_INVALID_HEADER_FIELD,
                1,
                "C2HData with SUCCESS but not LAST_PDU",
            ));
        }
        self.rx_state = Rx::Data {
            cid: d.cccid,
            slot: i as u16,
            offset: d.offset,
            left: d.length,
            crc: 0,
            digest: l.data_digest,
            success,
        };
        Ok(())
    }

    /// Moves C2HData's data into the command's buffers: what is staged by copy, the rest by a
    /// receive straight into them.
    fn rx_data(&mut self, done: &mut dyn FnMut(u32, &Cqe), count: &mut usize) -> Result<bool, NvmeError> {
        let Rx::Data { cid, slot: si, mut offset, mut left, mut crc, digest, success } = self.rx_state else {
            unreachable!("rx_data outside data")
        };
        let slot = &self.slots[usize::from(si)];
        let orphan = slot.orphan;
        let staged = (self.rx_end - self.rx_start).min(left as usize);
        let mut progressed = false;
        if staged > 0 {
            let src = &self.rx[self.rx_start..self.rx_start + staged];
            if digest {
                crc = pdu::crc32c_append(crc, src);
            }
            if !orphan {
                let mut at = 0;
                for_range(&slot.iov, offset as usize, staged, |ptr, n| {
                    // SAFETY: `ptr..ptr + n` lies in the command's buffer (the range was checked
                    // against its length), writable until the completion (submit's contract);
                    // the staging buffer is the queue's own, so they do not overlap.
                    unsafe { std::ptr::copy_nonoverlapping(src[at..].as_ptr(), ptr, n) };
                    at += n;
                });
            }
            self.rx_start += staged;
            if !orphan {
                self.data.copied += staged as u64;
            }
            offset += staged as u32;
            left -= staged as u32;
            progressed = true;
        } else if !orphan && left > 0 {
            // Nothing staged: receive the rest into the buffers, and what follows into staging.
            self.rx_start = 0;
            self.rx_end = 0;
            let r = {
                let mut bufs: [IoSliceMut<'_>; RECV_BATCH + 1] =
                    std::array::from_fn(|_| IoSliceMut::new(&mut []));
                let mut n = 0;
                for_range(&slot.iov, offset as usize, left as usize, |ptr, len| {
                    if n < RECV_BATCH {
                        // SAFETY: as above: inside the command's writable buffer, for the
                        // receive's duration only.
                        bufs[n] = IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(ptr, len) });
                        n += 1;
                    }
                });
                bufs[n] = IoSliceMut::new(&mut self.rx[..]);
                fp_sys::recv_vectored_nonblocking(self.fd.as_fd(), &mut bufs[..=n])
            };
            match r {
                Ok(0) => return Err(self.die(NvmeError::Gone("the controller closed the connection".into()))),
                Ok(got) => {
                    let into_buf = got.min(left as usize);
                    if digest {
                        for_range(&slot.iov, offset as usize, into_buf, |ptr, n| {
                            // SAFETY: bytes of the command's buffer the receive just wrote.
                            crc = pdu::crc32c_append(crc, unsafe { std::slice::from_raw_parts(ptr, n) });
                        });
                    }
                    self.rx_end = got - into_buf;
                    self.data.direct += into_buf as u64;
                    offset += into_buf as u32;
                    left -= into_buf as u32;
                    progressed = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => progressed = true,
                Err(e) => return Err(self.die(NvmeError::Gone(format!("receive: {e}")))),
            }
        } else if left > 0 {
            // An orphan's data: through staging, then dropped.
            progressed = self.stage(1)?;
        }
        if left == 0 {
            self.slots[usize::from(si)].done = offset;
            if digest {
                self.rx_state = Rx::Digest { cid, crc, success };
            } else {
                self.rx_state = Rx::Header;
                self.c2h_done(cid, success, done, count)?;
            }
            return Ok(true);
        }
        self.rx_state = Rx::Data { cid, slot: si, offset, left, crc, digest, success };
        Ok(progressed)
    }

    /// A C2HData's data is in: with SUCCESS it stands for a successful completion (TCP
    /// 3.6.2.8).
    fn c2h_done(
        &mut self,
        cid: u16,
        success: bool,
        done: &mut dyn FnMut(u32, &Cqe),
        count: &mut usize,
    ) -> Result<(), NvmeError> {
        if success {
            self.complete(Cqe::new(cid, Status::SUCCESS), done, count)?;
        }
        Ok(())
    }

    /// A completion (a response capsule, or a C2HData with SUCCESS).
    fn complete(
        &mut self,
        cqe: Cqe,
        done: &mut dyn FnMut(u32, &Cqe),
        count: &mut usize,
    ) -> Result<(), NvmeError> {
        let i = self.busy_slot(cqe.cid, "a completion")?;
        let s = &self.slots[i];
        if s.tx_pending > 0 {
            return Err(self.sequence(format!("completion of command {} before its data was sent", cqe.cid)));
        }
        if self.p.strict_reads && s.dir == Dir::FromDevice && cqe.status.is_success() && s.done != s.len {
            return Err(self.die(protocol(format!(
                "read {} completed with {} of its {} bytes",
                cqe.cid, s.done, s.len
            ))));
        }
        let orphan = s.orphan;
        let tag = self.cids.complete(cqe.cid).expect("looked up above");
        self.release(i);
        self.stats.completed += 1;
        if !orphan {
            *count += 1;
            done(tag, &cqe);
        }
        Ok(())
    }

    fn release(&mut self, i: usize) {
        let s = &mut self.slots[i];
        s.orphan = false;
        s.iov.clear();
    }

    /// An R2T: queue H2CData PDUs for the range it asks, from the caller's buffers.
    fn r2t(&mut self, h: &[u8]) -> Result<(), NvmeError> {
        let d = DataHeader::parse(h).expect("an R2T header is 24 bytes");
        let i = self.busy_slot(d.cccid, "R2T")?;
        let s = &self.slots[i];
        if s.dir != Dir::ToDevice || s.len <= self.p.icd {
            return Err(self.sequence(format!("R2T for command {}, which sends no data by R2T", d.cccid)));
        }
        // One R2T outstanding per command (MAXR2T 0): the next one comes after the data of the
        // last, in order, and within the command.
        let end = u64::from(d.offset) + u64::from(d.length);
        if s.tx_pending > 0 || d.offset != s.done || d.length == 0 || end > u64::from(s.len) {
            let what = format!(
                "R2T for {} bytes at {} of command {} ({} bytes, {} asked before)",
                d.length, d.offset, d.cccid, s.len, s.done
            );
            return Err(self.violation(pdu::FES_DATA_OUT_OF_RANGE, 0, what));
        }
        self.slots[i].done = end as u32;
        let mut off = d.offset;
        let chunk = self.p.maxh2cdata;
        while u64::from(off) < end {
            let n = chunk.min((end - u64::from(off)) as u32);
            let last = u64::from(off + n) == end;
            let dh = DataHeader { cccid: d.cccid, ttag: d.ttag, offset: off, length: n };
            let mut b = [0u8; HEADER_ROOM];
            let hl = pdu::write_h2c_data(&mut b, &dh, last, self.p.digests, self.p.cpda);
            self.push_arena(&b[..hl]);
            self.push_data(i as u16, off as usize, n as usize);
            off += n;
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
            if tag == AER_TAG || self.slots[self.cids.slot(cid)].orphan {
                out.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Forgets every command in flight (their tags into `out`); the queue is dead after.
    pub(crate) fn drain(&mut self, out: &mut Vec<u32>) {
        if self.dead.is_none() {
            self.die(NvmeError::Gone("the queue was drained".into()));
        }
        self.drop_send_list();
        let first = out.len();
        self.cids.drain(out);
        for i in 0..self.slots.len() {
            self.release(i);
        }
        // The queue's own synchronous commands have no owner to give back to.
        let mut i = first;
        while i < out.len() {
            if out[i] == SYNC_TAG {
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
        // The pointers come from the unique borrows `data` holds, which live to the end of
        // this call.
        let mut data = data;
        let (iov, dir) = match &mut data {
            AdminData::None => (None, Dir::None),
            AdminData::FromDevice(b) => {
                (Some(libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }), Dir::FromDevice)
            }
            AdminData::ToDevice(b) => (
                Some(libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }),
                Dir::ToDevice,
            ),
        };
        self.check_alive()?;
        // SAFETY: `data` outlives every use the queue makes of it: this call waits for the
        // completion, and on a timeout orphans the command (no more writes into it) and kills
        // the queue if data to send is still listed.
        let cid = unsafe { self.submit_dir(sqe, iov.as_slice(), dir, SYNC_TAG) }
            .map_err(|e| NvmeError::Gone(format!("no command slot free: {e}")))?;
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
            let wait = if self.pieces.is_empty() {
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
        s.iov.clear();
        if s.tx_pending > 0 {
            // Its data is still listed to send from a buffer about to go.
            self.die(NvmeError::Gone(format!("command {cid} timed out with its data unsent")));
        }
    }
}
