//! One connection's transmission phase as a client (NBD's doc/proto.md, "Transmission phase",
//! simple replies only): a fixed table of request slots indexed by the cookie, fp-conn's
//! [`SendQueue`] written with gathered writes (a request's header and a write's data straight
//! from the caller's iovecs, a partial write counted against the request at the front), and
//! the receive side (`wire/receive.rs`): reply headers into fp-conn's [`RecvBuf`], a read's data
//! straight into the caller's iovecs. Nothing here allocates after [`Wire::new`], and nothing
//! here is unsafe: the caller's buffers are seen through [`fp_bdev::iov_io`].
//!
//! The byte stream comes through a [`Transport`], so the fuzz target can play the server.
//! Everything the server sends is checked: the magic, a cookie naming a request that was sent
//! and not yet answered. Anything else, a closed stream or an I/O error kills the connection:
//! every request in flight, and every later one, completes with `EIO`.

use std::io::{self, IoSlice, IoSliceMut};

use fp_bdev::iov_io::pieces;
use fp_bdev::{IoOp, IoRequest, IoStatus, Iovecs, SubmitError};
use fp_conn::{RecvBuf, SendQueue, Sent};

use crate::proto::*;

mod receive;

/// Requests one connection carries at once (the brief asks for at least 64; the server side
/// allows 128 per connection, and so does this).
pub const MAX_IN_FLIGHT: usize = 128;
/// Reply headers one read may take when no read's data can be in the stream.
const HDR_BATCH: usize = 64;
/// Rounds of reading per poll, so one busy connection cannot hold its reactor.
const READS_PER_POLL: usize = 16;

/// Moves bytes for a [`Wire`]: a non-blocking socket, or the fuzz target's script.
pub trait Transport {
    /// Reads into `bufs`, in order; `Ok(0)` is the end of the stream, `WouldBlock` nothing
    /// there yet.
    fn readv(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize>;

    /// Writes from `bufs`, in order; `WouldBlock` when nothing fits now.
    fn writev(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    /// In the send queue.
    Queued,
    /// Sent whole; its reply is due.
    Sent,
    /// The first part of a split request, answered; it completes the request when the other
    /// parts are answered too.
    Answered,
}

#[derive(Clone, Copy)]
struct Slot {
    state: State,
    tag: u32,
    command: u16,
    /// The caller's iovecs (a read's destination, a write's source), where this part's payload
    /// starts in them, and its length.
    iov: Iovecs,
    start: usize,
    payload: usize,
    /// The slot of the request's first part (itself, unless the request was split), which
    /// counts the parts not yet answered and keeps the first error.
    leader: u16,
    parts_left: u16,
    status: IoStatus,
    /// Bumped each time the slot is reused: a cookie carries it, so a late or repeated reply
    /// cannot complete the slot's next request.
    generation: u32,
    /// The tick the request was taken at (every part of it carries the same).
    since: u64,
    hdr: [u8; REQUEST_LEN],
}

impl Slot {
    const FREE: Slot = Slot {
        state: State::Free,
        tag: 0,
        command: 0,
        iov: Iovecs::NONE,
        start: 0,
        payload: 0,
        leader: 0,
        parts_left: 0,
        status: IoStatus::Success,
        generation: 0,
        since: 0,
        hdr: [0; REQUEST_LEN],
    };

    /// Bytes this request puts on the wire.
    fn wire_len(&self) -> usize {
        REQUEST_LEN + if self.command == CMD_WRITE { self.payload } else { 0 }
    }

    /// What this request puts on the wire: its header, and a write's data straight from the
    /// caller's buffers.
    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        let data = if self.command == CMD_WRITE { self.payload } else { 0 };
        std::iter::once(&self.hdr[..]).chain(pieces(&self.iov, self.start, data))
    }
}

/// Where the receive side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rx {
    /// Reading reply headers into the header buffer.
    Header,
    /// Reading the data of the read in `slot`; `done` bytes of `len` arrived.
    Data { slot: usize, done: usize, len: usize },
}

/// A connection's transmission phase.
pub struct Wire<T> {
    io: T,
    slots: Box<[Slot]>,
    free: Vec<u16>,
    /// Request parts (slot indexes) to send, and how much of the front one went out.
    tx: SendQueue<u16>,
    rx: Rx,
    /// Reply headers received and not yet handled (and a read's data that came with them).
    hdr: RecvBuf,
    /// Requests taken (a split one once) and not yet completed.
    requests: usize,
    /// Parts sent whole and not yet answered.
    awaiting: usize,
    /// Reads sent and not yet answered: while there are any, a reply may carry data, so
    /// headers are read one at a time (the data then goes straight to its iovecs).
    reads_sent: usize,
    done: Vec<(u32, IoStatus)>,
    dead: Option<String>,
    /// The largest read or write payload the server takes.
    max_payload: u32,
    /// Operations the server takes (read and write are always there; write is off for a
    /// read-only export).
    write: bool,
    flush: bool,
    trim: bool,
    write_zeroes: bool,
    /// How long a request may wait for its reply, in ticks (0: for ever).
    timeout: u64,
    /// No request can have waited its timeout out before this tick; `u64::MAX` while nothing
    /// is in flight.
    next_check: u64,
}

/// Why the connection died, for the log line.
fn violation(msg: String) -> String {
    format!("protocol violation by the server: {msg}")
}

impl<T: Transport> Wire<T> {
    /// A connection in the transmission phase of an export with transmission flags `flags`.
    pub fn new(io: T, flags: u16, max_payload: u32) -> Wire<T> {
        let has = |f: u16| flags & TFLAG_HAS_FLAGS != 0 && flags & f != 0;
        Wire {
            io,
            slots: vec![Slot::FREE; MAX_IN_FLIGHT].into_boxed_slice(),
            free: (0..MAX_IN_FLIGHT as u16).rev().collect(),
            tx: SendQueue::with_capacity(MAX_IN_FLIGHT),
            rx: Rx::Header,
            hdr: RecvBuf::new(SIMPLE_REPLY_LEN * HDR_BATCH),
            requests: 0,
            awaiting: 0,
            reads_sent: 0,
            // Every slot may complete and every refused request wait here too.
            done: Vec::with_capacity(2 * MAX_IN_FLIGHT),
            dead: None,
            max_payload: max_payload.min(MAX_PAYLOAD),
            write: !has(TFLAG_READ_ONLY),
            flush: has(TFLAG_SEND_FLUSH),
            trim: has(TFLAG_SEND_TRIM),
            write_zeroes: has(TFLAG_SEND_WRITE_ZEROES),
            timeout: 0,
            next_check: u64::MAX,
        }
    }

    /// Bounds how long a request may wait for its reply: `ticks` after it was taken, a request
    /// not answered yet (unsent because the server stopped reading, or sent and unanswered)
    /// kills the connection in [`Wire::expire`]. 0 waits for ever.
    pub fn set_timeout(&mut self, ticks: u64) {
        self.timeout = ticks;
    }

    /// The tick at which [`Wire::expire`] has something to check: the earliest a request in
    /// flight can time out. `None` with nothing in flight, no timeout or a dead connection.
    pub fn deadline(&self) -> Option<u64> {
        (self.dead.is_none() && self.requests > 0 && self.timeout > 0).then_some(self.next_check)
    }

    /// Kills the connection when a request taken by tick `now - timeout` is still unanswered:
    /// a server that stops reading or answering would otherwise hold its requests, and
    /// whatever waits for them, for ever. Returns whether it did. Cheap until the deadline:
    /// the slots are walked only then.
    pub fn expire(&mut self, now: u64) -> bool {
        if self.timeout == 0 || now < self.next_check || self.dead.is_some() {
            return false;
        }
        let oldest = self.slots.iter().filter(|s| s.state != State::Free).map(|s| s.since).min();
        match oldest {
            Some(since) if now.saturating_sub(since) >= self.timeout => {
                let waiting = self.requests;
                let unsent = self.tx.len();
                self.die(format!(
                    "no reply to a request within its timeout; {waiting} request(s) waited, \
                     {unsent} part(s) of them not sent because the server stopped reading"
                ));
                true
            }
            Some(since) => {
                self.next_check = since.saturating_add(self.timeout);
                false
            }
            None => {
                self.next_check = u64::MAX;
                false
            }
        }
    }

    /// The transport (the channel watches its fd).
    pub fn transport(&self) -> &T {
        &self.io
    }

    /// The transport, to feed it (the fuzz target, tests).
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.io
    }

    /// Why the connection died, once it has.
    pub fn dead(&self) -> Option<&str> {
        self.dead.as_deref()
    }

    /// Requests taken and not yet returned by [`Wire::poll`].
    pub fn in_flight(&self) -> usize {
        self.requests + self.done.len()
    }

    /// Whether requests wait to be written (the socket was full).
    pub fn wants_write(&self) -> bool {
        !self.tx.is_empty() && self.dead.is_none()
    }

    /// Completions held for the next [`Wire::poll`].
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Takes a request whose range the caller has checked against the device. One longer than
    /// an NBD request may be goes out in parts (reads and writes of the server's maximum
    /// payload, trims and zeroes of 2 GiB), each in a slot of its own; it completes when the
    /// last part is answered, failed if any part failed. Requests the connection cannot carry
    /// complete with an error at the next poll: `EROFS` for a write to a read-only export,
    /// `EINVAL` for iovecs that do not add up to the length or more parts than the table
    /// holds, `EIO` once the connection is dead. A read's or write's buffers are the ones its
    /// [`Iovecs`] vouch for until it completes (then the wire lets go of them).
    pub fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        let (command, supported, writes) = match req.op {
            IoOp::Read => (CMD_READ, true, false),
            IoOp::Write => (CMD_WRITE, true, true),
            IoOp::Flush => (CMD_FLUSH, self.flush, false),
            IoOp::Discard => (CMD_TRIM, self.trim, true),
            IoOp::WriteZeroes => (CMD_WRITE_ZEROES, self.write_zeroes, true),
        };
        if !supported {
            return Err(SubmitError::Unsupported);
        }
        if self.in_flight() >= MAX_IN_FLIGHT {
            return Err(SubmitError::Busy);
        }
        let fail = |w: &mut Self, errno| {
            w.done.push((req.tag, IoStatus::Error(errno)));
            Ok(())
        };
        if self.dead.is_some() {
            return fail(self, libc::EIO);
        }
        if writes && !self.write {
            return fail(self, libc::EROFS);
        }
        let data = matches!(req.op, IoOp::Read | IoOp::Write);
        if data {
            let total = req.iov.total_len();
            if total != req.len {
                return fail(self, libc::EINVAL);
            }
        }
        let len = if req.op == IoOp::Flush { 0 } else { req.len };
        if len == 0 && req.op != IoOp::Flush {
            // Nothing to move; not every server takes an empty request.
            self.done.push((req.tag, IoStatus::Success));
            return Ok(());
        }
        // A request longer than one NBD request may be goes out in parts: reads and writes of
        // the server's maximum payload, trims and zeroes of 2 GiB (a multiple of any block
        // size the protocol allows, below the 32-bit length).
        let part = if data { u64::from(self.max_payload) } else { 1 << 31 };
        let parts = len.div_ceil(part).max(1);
        if parts > MAX_IN_FLIGHT as u64 {
            return fail(self, libc::EINVAL);
        }
        if (self.free.len() as u64) < parts {
            return Err(SubmitError::Busy);
        }
        let mut leader = 0;
        let since = if self.timeout > 0 { fp_bdev::clock::ticks::now() } else { 0 };
        if self.timeout > 0 && self.next_check == u64::MAX {
            self.next_check = since.saturating_add(self.timeout);
        }
        for i in 0..parts {
            let index = self.free.pop().expect("counted") as usize;
            if i == 0 {
                leader = index as u16;
            }
            let slot = &mut self.slots[index];
            let generation = slot.generation.wrapping_add(1);
            let cookie = (u64::from(generation) << 32) | index as u64;
            let at = i * part;
            let length = (len - at).min(part);
            let offset = if req.op == IoOp::Flush { 0 } else { req.offset + at };
            let r = Request { flags: 0, command, cookie, offset, length: length as u32 };
            *slot = Slot {
                state: State::Queued,
                tag: req.tag,
                command,
                iov: if data { req.iov } else { Iovecs::NONE },
                start: if data { at as usize } else { 0 },
                payload: if data { length as usize } else { 0 },
                leader,
                parts_left: parts as u16,
                status: IoStatus::Success,
                generation,
                since,
                hdr: r.encode(),
            };
            self.tx.push(index as u16);
        }
        self.requests += 1;
        Ok(())
    }

    /// Writes queued requests, reads replies, and hands every completion to `done`. Returns
    /// how many completed.
    pub fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        if self.dead.is_none() {
            if let Err(why) = self.send().and_then(|()| self.receive()) {
                self.die(why);
            }
        }
        let n = self.done.len();
        for (tag, status) in self.done.drain(..) {
            done(tag, status);
        }
        n
    }

    /// Kills the connection: every request in flight completes with `EIO` at the next poll.
    pub fn die(&mut self, why: String) {
        if self.dead.is_some() {
            return;
        }
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.state != State::Free {
                // One completion per request: its first part's.
                if usize::from(slot.leader) == index {
                    self.done.push((slot.tag, IoStatus::Error(libc::EIO)));
                }
                slot.state = State::Free;
                slot.iov = Iovecs::NONE;
                self.free.push(index as u16);
            }
        }
        self.requests = 0;
        self.awaiting = 0;
        while self.tx.drop_front().is_some() {}
        self.rx = Rx::Header;
        self.hdr.clear();
        self.reads_sent = 0;
        self.dead = Some(why);
    }

    /// Writes as much of the send queue as the socket takes.
    fn send(&mut self) -> Result<(), String> {
        while !self.tx.is_empty() {
            let (slots, io) = (&self.slots, &mut self.io);
            match self.tx.write(|index| slots[usize::from(index)].pieces(), |bufs| io.writev(bufs)) {
                Sent::Bytes(_) => {
                    while let Some(index) = self.tx.pop_sent(|i| self.slots[usize::from(i)].wire_len()) {
                        let slot = &mut self.slots[usize::from(index)];
                        slot.state = State::Sent;
                        self.awaiting += 1;
                        if slot.command == CMD_READ {
                            self.reads_sent += 1;
                        }
                    }
                }
                Sent::Blocked => return Ok(()),
                Sent::Failed(e) => return Err(format!("write to the server failed: {e}")),
            }
        }
        Ok(())
    }

    /// A part was answered: the request completes with its last part, failed if any part
    /// failed.
    fn complete(&mut self, index: usize, status: IoStatus) {
        self.awaiting -= 1;
        let slot = &mut self.slots[index];
        if slot.command == CMD_READ {
            self.reads_sent -= 1;
        }
        let lead = usize::from(slot.leader);
        if lead == index {
            slot.state = State::Answered;
        } else {
            slot.state = State::Free;
            slot.iov = Iovecs::NONE;
            self.free.push(index as u16);
        }
        let leader = &mut self.slots[lead];
        if leader.status == IoStatus::Success {
            leader.status = status;
        }
        leader.parts_left -= 1;
        if leader.parts_left == 0 {
            leader.state = State::Free;
            leader.iov = Iovecs::NONE;
            self.done.push((leader.tag, leader.status));
            self.free.push(lead as u16);
            self.requests -= 1;
        }
    }
}
