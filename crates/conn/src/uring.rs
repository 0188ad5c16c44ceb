//! The io_uring socket engine: one ring per reactor thread, shared by every connection on it.
//!
//! * **Receives** are one multishot `IORING_OP_RECV` per connection into a ring of provided
//!   buffers the engine owns: the kernel fills a buffer when data arrives and posts a
//!   completion naming it, so a connection learns of data by reading the completion queue (no
//!   system call, no empty `recv`). [`UringSocket::recv`] copies out of those buffers and hands
//!   each back to the kernel once it is taken whole.
//! * **Sends** are one `IORING_OP_SENDMSG` per connection at a time, queued by the connection
//!   during its poll and submitted, with every other connection's, by one `io_uring_enter` per
//!   round ([`flush`], made by the [`UringPoller`] the first connection adds to its reactor).
//! * Completions go to their connection by `user_data` (its index in the engine's table and the
//!   operation).
//!
//! The kernel finishes a receive (copies the data, posts the completion) when the reactor next
//! enters it (the ring is `COOP_TASKRUN` with `TASKRUN_FLAG`: see `build_ring`): [`flush`]
//! enters the kernel for sends and when the ring's flags say the kernel has work of ours to
//! finish, once per round at most. The ring's fd wakes a sleeping
//! reactor ([`UringPoller`]'s wake fd).
//!
//! **Running out of buffers**: a multishot receive ends with `ENOBUFS` when the ring has no
//! free buffer; it is armed again once buffers came back (a connection's taking them). A
//! connection holding more than [`EngineConfig::hold_limit`] buffers untaken has its receive
//! cancelled (so one slow connection cannot take every buffer of the reactor) and re-armed when
//! it took half of them. **Closing**: a socket's [`UringSocket::close`] (or drop) cancels its
//! operations and waits, bounded, for their completions, so the kernel is done with the
//! memory its send points at before the caller frees it; what it held goes back to the ring.
//!
//! This is the one module of fp-conn with `unsafe` code: the ring's submission entries point at
//! memory the kernel reads or writes after the call returns (the provided buffers, the send's
//! `msghdr` and iovecs), which only this module allocates and frees.

use std::alloc::{self, Layout};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fp_reactor::{PollStatus, Poller, Reactor};
use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::send::IOV_PER_WRITE;
use crate::Recv;

/// Which socket implementation a connection uses (SPDK's `impl_name`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SocketImpl {
    /// Non-blocking `recv` and `sendmsg` system calls, made by each connection.
    #[default]
    Posix,
    /// This engine: multishot receives into provided buffers, sends batched per round.
    Uring,
}

impl SocketImpl {
    /// Both, for tests that run on each.
    pub const ALL: [SocketImpl; 2] = [SocketImpl::Posix, SocketImpl::Uring];

    /// Its name (`posix`, `uring`).
    pub fn name(self) -> &'static str {
        match self {
            SocketImpl::Posix => "posix",
            SocketImpl::Uring => "uring",
        }
    }
}

impl std::fmt::Display for SocketImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Makes test `name` (a `fn name()` beside the call) two tests, `name::posix` and
/// `name::uring`, each running `run(implementation, name)` (which sets what the test's
/// connections use).
#[macro_export]
macro_rules! on_each_sock_impl {
    ($name:ident, $run:path) => {
        mod $name {
            #[test]
            fn posix() {
                $run($crate::uring::SocketImpl::Posix, super::$name);
            }
            #[test]
            fn uring() {
                $run($crate::uring::SocketImpl::Uring, super::$name);
            }
        }
    };
}

/// A socket implementation name that is neither `posix` nor `uring`.
#[derive(Debug, thiserror::Error)]
#[error("unknown socket implementation {0:?} (posix or uring)")]
pub struct UnknownSocketImpl(pub String);

impl FromStr for SocketImpl {
    type Err = UnknownSocketImpl;
    fn from_str(s: &str) -> Result<SocketImpl, UnknownSocketImpl> {
        match s {
            "posix" => Ok(SocketImpl::Posix),
            "uring" => Ok(SocketImpl::Uring),
            other => Err(UnknownSocketImpl(other.to_string())),
        }
    }
}

/// The engine's sizes, fixed when a thread's engine is made ([`configure`] before its first
/// socket).
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Provided receive buffers (a power of two, at most 32768).
    pub buffers: u16,
    /// Bytes in each.
    pub buffer_size: u32,
    /// Buffers one connection may hold untaken before its receive is cancelled.
    pub hold_limit: usize,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig { buffers: 256, buffer_size: 16 << 10, hold_limit: 64 }
    }
}

/// What the engine counted (for tests and for measuring).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// `io_uring_enter` calls.
    pub enters: u64,
    /// Receive completions with data.
    pub recv_completions: u64,
    /// Multishot receives that ended for lack of a buffer.
    pub no_buffers: u64,
    /// Multishot receives armed again (after `ENOBUFS` or a cancel).
    pub rearms: u64,
    /// Receives cancelled because their connection held too many buffers.
    pub hold_cancels: u64,
    /// Sends submitted.
    pub sends: u64,
}

/// The process's default for connections that are not told one (SPDK's
/// `sock_set_default_impl`; the NVMe/TCP host's I/O queues take it).
static DEFAULT_URING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets the process's default socket implementation ([`default_impl`]).
pub fn set_default_impl(imp: SocketImpl) {
    DEFAULT_URING.store(imp == SocketImpl::Uring, Ordering::Relaxed);
}

/// The process's default socket implementation: [`SocketImpl::Posix`] unless set.
pub fn default_impl() -> SocketImpl {
    if DEFAULT_URING.load(Ordering::Relaxed) {
        SocketImpl::Uring
    } else {
        SocketImpl::Posix
    }
}

/// The buffer group of the provided buffers (one group per ring).
const BUF_GROUP: u16 = 0;
/// Submission queue entries; the completion queue has [`CQ_ENTRIES`] (multishot receives post
/// many completions per submission).
const SQ_ENTRIES: u32 = 256;
const CQ_ENTRIES: u32 = 4096;
/// How long closing a socket waits for the kernel to finish its operations.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What a completion's `user_data` says besides its connection.
const OP_RECV: u64 = 1;
const OP_SEND: u64 = 2;
const OP_CANCEL: u64 = 3;

fn user_data(conn: u32, op: u64) -> u64 {
    (u64::from(conn) << 8) | op
}

/// The next engine's id.
static ENGINE_IDS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CONFIG: Cell<EngineConfig> = Cell::new(EngineConfig::default());
    static ENGINE: RefCell<Option<Rc<Engine>>> = const { RefCell::new(None) };
}

/// Sets the sizes of this thread's engine, if it is not made yet (true then).
pub fn configure(config: EngineConfig) -> bool {
    if ENGINE.with(|e| e.borrow().is_some()) {
        return false;
    }
    CONFIG.with(|c| c.set(config));
    true
}

fn engine() -> io::Result<Rc<Engine>> {
    ENGINE.with(|slot| {
        let mut slot = slot.borrow_mut();
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        let e = Rc::new(Engine::new(CONFIG.with(|c| c.get()))?);
        *slot = Some(e.clone());
        Ok(e)
    })
}

fn with_engine<R>(f: impl FnOnce(&Engine) -> R) -> Option<R> {
    ENGINE.with(|slot| slot.borrow().as_ref().map(|e| f(e)))
}

/// Submits what this thread's connections queued and takes the completions the kernel has
/// (entering the kernel only when there is something to submit or it flagged work to finish);
/// true when it did anything.
pub fn flush() -> bool {
    with_engine(|e| e.inner.borrow_mut().flush()).unwrap_or(false)
}

/// What this thread's engine counted, if it has one.
pub fn stats() -> Option<EngineStats> {
    with_engine(|e| e.inner.borrow().stats)
}

/// Adds the [`UringPoller`] to `reactor` (this thread's) unless it has it: call it after
/// adding a connection that uses a [`UringSocket`].
pub fn ensure_poller(reactor: &mut Reactor) -> io::Result<()> {
    let e = engine()?;
    if !e.poller_added.replace(true) {
        reactor.add_poller(Box::new(UringPoller { engine: e }));
    }
    Ok(())
}

/// The engine's part of a round: one `io_uring_enter` for every connection's sends (and for the
/// kernel's pending receive work), the completions to their connections; the ring's fd wakes
/// the reactor.
pub struct UringPoller {
    engine: Rc<Engine>,
}

impl Poller for UringPoller {
    fn poll(&mut self) -> PollStatus {
        if self.engine.inner.borrow_mut().flush() {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    fn has_pending(&self) -> bool {
        self.engine.inner.borrow_mut().has_work()
    }

    fn prepare_sleep(&mut self) -> bool {
        let mut inner = self.engine.inner.borrow_mut();
        !inner.flush() && !inner.has_work()
    }

    fn wake_fds(&self) -> Vec<RawFd> {
        vec![self.engine.inner.borrow().ring.as_raw_fd()]
    }
}

struct Engine {
    /// Names it for its sockets ([`UringSocket`]).
    id: u64,
    inner: RefCell<Inner>,
    poller_added: Cell<bool>,
}

impl Engine {
    fn new(config: EngineConfig) -> io::Result<Engine> {
        let ring = build_ring()?;
        let bufs = BufRing::new(config.buffers, config.buffer_size)?;
        // SAFETY: the ring entries' memory is page-aligned, `buffers` entries long and stays
        // allocated until the group is unregistered (`Inner`'s drop).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.entries.as_ptr() as u64,
                bufs.count,
                BUF_GROUP,
                0,
            )?
        };
        let mut inner = Inner {
            ring,
            bufs,
            conns: Vec::new(),
            free: Vec::new(),
            rearm: Vec::new(),
            config,
            stats: EngineStats::default(),
        };
        for bid in 0..inner.bufs.count {
            inner.bufs.give(bid);
        }
        inner.bufs.publish();
        Ok(Engine {
            id: ENGINE_IDS.fetch_add(1, Ordering::Relaxed),
            inner: RefCell::new(inner),
            poller_added: Cell::new(false),
        })
    }
}

/// The ring: SINGLE_ISSUER (only its thread uses it), COOP_TASKRUN and TASKRUN_FLAG: when a
/// receive's data arrives the kernel flags the ring and finishes the receive at the reactor's
/// next `io_uring_enter` (which the flag asks for), instead of interrupting the reactor with an
/// inter-processor interrupt, which on a virtual machine costs an exit: measured at QD 1 (null
/// disk, SPDK's perf, alternated runs) the interrupt added ~10 µs to the p50 (21.6–28.2 µs
/// against posix's 11.3–16.9), the flag ~1 µs (12.7–18.1 against 11.4–17.1), at two enters per
/// I/O instead of one. A sleeping reactor is still woken (the task is, without an interrupt). A
/// kernel that refuses the flags (before 6.0) gets a plain ring.
fn build_ring() -> io::Result<IoUring> {
    let mut b = IoUring::builder();
    b.setup_cqsize(CQ_ENTRIES).setup_single_issuer().setup_coop_taskrun().setup_taskrun_flag();
    match b.build(SQ_ENTRIES) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            log::warn!("uring sockets: io_uring_setup refused SINGLE_ISSUER or COOP_TASKRUN; plain ring");
            IoUring::builder().setup_cqsize(CQ_ENTRIES).build(SQ_ENTRIES)
        }
        r => r,
    }
}

/// The provided buffers: a ring of entries the kernel takes buffers from, and their memory.
struct BufRing {
    entries: NonNull<types::BufRingEntry>,
    data: NonNull<u8>,
    count: u16,
    size: u32,
    /// Our copy of the tail: entries given since the last [`BufRing::publish`] are not seen.
    tail: u16,
    /// Buffers the kernel may fill now (given and not taken by a completion).
    available: usize,
}

impl BufRing {
    fn entries_layout(count: u16) -> Layout {
        Layout::from_size_align(usize::from(count) * std::mem::size_of::<types::BufRingEntry>(), 4096)
            .expect("a page-aligned layout")
    }

    fn data_layout(count: u16, size: u32) -> Layout {
        Layout::from_size_align(usize::from(count) * size as usize, 4096).expect("a page-aligned layout")
    }

    fn new(count: u16, size: u32) -> io::Result<BufRing> {
        if !count.is_power_of_two() || count > 32768 || size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("provided buffers: {count} of {size} bytes (a power of two up to 32768)"),
            ));
        }
        // SAFETY: both layouts have a non-zero size; a null result is handled.
        let (entries, data) = unsafe {
            (
                alloc::alloc_zeroed(Self::entries_layout(count)) as *mut types::BufRingEntry,
                alloc::alloc(Self::data_layout(count, size)),
            )
        };
        let (Some(entries), Some(data)) = (NonNull::new(entries), NonNull::new(data)) else {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        };
        Ok(BufRing { entries, data, count, size, tail: 0, available: 0 })
    }

    /// Hands buffer `bid` to the kernel (seen at the next [`BufRing::publish`]).
    fn give(&mut self, bid: u16) {
        let i = usize::from(self.tail & (self.count - 1));
        // SAFETY: `i` is below `count`, the number of entries allocated; the kernel reads an
        // entry only once the tail is published past it, which happens after this write.
        let e = unsafe { &mut *self.entries.as_ptr().add(i) };
        e.set_addr(self.data.as_ptr() as u64 + u64::from(bid) * u64::from(self.size));
        e.set_len(self.size);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        self.available += 1;
    }

    /// Makes the buffers given visible to the kernel.
    fn publish(&mut self) {
        // SAFETY: the tail field sits in the first entry's reserved bytes, which the kernel and
        // we share; it is a naturally aligned u16, written with release ordering so the
        // entries' contents are visible before it.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries.as_ptr()) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    /// The `len` bytes buffer `bid` holds from `from`.
    fn bytes(&self, bid: u16, from: usize, len: usize) -> &[u8] {
        debug_assert!(bid < self.count && from + len <= self.size as usize);
        // SAFETY: the range lies inside buffer `bid`, which a completion handed to us (the
        // kernel wrote it before posting the completion and does not touch it until it is
        // given back).
        unsafe {
            std::slice::from_raw_parts(
                self.data.as_ptr().add(usize::from(bid) * self.size as usize + from),
                len,
            )
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        if self.count == 0 {
            return;
        }
        // SAFETY: allocated in `new` with these layouts; the group was unregistered (or the
        // ring closed) before.
        unsafe {
            alloc::dealloc(self.entries.as_ptr() as *mut u8, Self::entries_layout(self.count));
            alloc::dealloc(self.data.as_ptr(), Self::data_layout(self.count, self.size));
        }
    }
}

/// One connection's state in the engine.
struct Conn {
    fd: RawFd,
    /// A [`UringSocket`] owns it; false while a closed one's operations finish.
    live: bool,
    /// Operations in the kernel (a receive, a send, cancels).
    ops: u32,
    recv_armed: bool,
    recv_cancelling: bool,
    /// Received buffers not taken yet, and how much of the first was taken.
    ready: VecDeque<(u16, u32)>,
    taken: usize,
    /// The end of the stream (`Eof` or `Failed`), after what `ready` holds.
    end: Option<Recv>,
    send: Box<SendSlot>,
    send_in_flight: bool,
    send_result: Option<i32>,
}

/// A send's `msghdr` and iovecs, boxed: the kernel reads them after the submission returns.
struct SendSlot {
    msg: libc::msghdr,
    iov: [libc::iovec; IOV_PER_WRITE],
}

struct Inner {
    ring: IoUring,
    bufs: BufRing,
    conns: Vec<Conn>,
    free: Vec<u32>,
    /// Connections whose multishot receive ended and is to be armed again.
    rearm: Vec<u32>,
    config: EngineConfig,
    stats: EngineStats,
}

impl Inner {
    /// Queues `sqe`, submitting what is queued first if the queue is full.
    fn push(&mut self, sqe: squeue::Entry) {
        loop {
            // SAFETY: every entry built here points only at memory this engine keeps until
            // the entry's completion (a connection's `SendSlot`, the provided buffers) or at
            // nothing.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            self.enter();
        }
    }

    fn enter(&mut self) {
        self.stats.enters += 1;
        if let Err(e) = self.ring.submit() {
            if e.raw_os_error() != Some(libc::EBUSY) && e.kind() != io::ErrorKind::Interrupted {
                log::warn!("uring sockets: io_uring_enter: {e}");
            }
        }
    }

    /// Work waiting for [`Inner::flush`]: entries to submit, kernel work flagged, completions.
    fn has_work(&mut self) -> bool {
        let submit = {
            let sq = self.ring.submission();
            !sq.is_empty() || sq.taskrun()
        };
        submit || !self.ring.completion().is_empty() || self.rearm_ready()
    }

    fn rearm_ready(&self) -> bool {
        !self.rearm.is_empty() && self.bufs.available >= self.min_available()
    }

    /// Free buffers needed before a receive is armed again (an eighth of the ring).
    fn min_available(&self) -> usize {
        (usize::from(self.bufs.count) / 8).max(1)
    }

    fn flush(&mut self) -> bool {
        let mut did = self.reap();
        if self.rearm_ready() {
            self.rearm_receives();
        }
        let (queued, taskrun) = {
            let sq = self.ring.submission();
            (!sq.is_empty(), sq.taskrun())
        };
        if queued || taskrun {
            self.enter();
            did = true;
            self.reap();
        }
        did
    }

    fn rearm_receives(&mut self) {
        let limit = self.config.hold_limit / 2;
        let mut i = 0;
        while i < self.rearm.len() {
            let idx = self.rearm[i];
            let c = &self.conns[idx as usize];
            if !c.live || c.end.is_some() || c.recv_armed {
                self.rearm.swap_remove(i);
            } else if c.ready.len() <= limit {
                self.rearm.swap_remove(i);
                self.stats.rearms += 1;
                self.arm_recv(idx);
            } else {
                i += 1;
            }
        }
    }

    fn arm_recv(&mut self, idx: u32) {
        let c = &mut self.conns[idx as usize];
        c.recv_armed = true;
        c.recv_cancelling = false;
        c.ops += 1;
        let sqe =
            opcode::RecvMulti::new(types::Fd(c.fd), BUF_GROUP).build().user_data(user_data(idx, OP_RECV));
        self.push(sqe);
    }

    fn cancel(&mut self, idx: u32, op: u64) {
        self.conns[idx as usize].ops += 1;
        let sqe = opcode::AsyncCancel::new(user_data(idx, op)).build().user_data(user_data(idx, OP_CANCEL));
        self.push(sqe);
    }

    /// Takes every completion the queue holds to its connection; true if there was any.
    fn reap(&mut self) -> bool {
        let mut any = false;
        let mut returned = false;
        loop {
            let Some(cqe) = self.ring.completion().next() else { break };
            any = true;
            let (idx, op) = ((cqe.user_data() >> 8) as u32, cqe.user_data() & 0xff);
            let (res, flags) = (cqe.result(), cqe.flags());
            let Some(c) = self.conns.get_mut(idx as usize) else { continue };
            match op {
                OP_RECV => {
                    let more = cqueue::more(flags);
                    if !more {
                        c.ops -= 1;
                        c.recv_armed = false;
                    }
                    if let Some(bid) = cqueue::buffer_select(flags) {
                        self.bufs.available -= 1;
                        if res > 0 && c.live {
                            c.ready.push_back((bid, res as u32));
                            self.stats.recv_completions += 1;
                        } else {
                            self.bufs.give(bid);
                            returned = true;
                        }
                    }
                    match res {
                        0 => c.end = Some(Recv::Eof),
                        r if r == -libc::ENOBUFS => {
                            self.stats.no_buffers += 1;
                            if !more {
                                self.rearm.push(idx);
                            }
                        }
                        r if r == -libc::ECANCELED => {
                            if c.live && !more {
                                self.rearm.push(idx);
                            }
                        }
                        r if r < 0 => {
                            c.end = Some(Recv::Failed(io::Error::from_raw_os_error(-r).to_string()))
                        }
                        _ => {
                            if !more && c.live && c.end.is_none() {
                                // The kernel ended the multishot (as it may at any time).
                                self.rearm.push(idx);
                            }
                        }
                    }
                    let c = &mut self.conns[idx as usize];
                    if c.live && c.recv_armed && !c.recv_cancelling && c.ready.len() >= self.config.hold_limit
                    {
                        c.recv_cancelling = true;
                        self.stats.hold_cancels += 1;
                        self.cancel(idx, OP_RECV);
                    }
                }
                OP_SEND => {
                    c.ops -= 1;
                    c.send_in_flight = false;
                    c.send_result = Some(res);
                }
                _ => c.ops -= 1,
            }
            let c = &self.conns[idx as usize];
            if !c.live && c.ops == 0 && !self.free.contains(&idx) {
                self.free.push(idx);
            }
        }
        if returned {
            self.bufs.publish();
        }
        any
    }

    fn register(&mut self, fd: RawFd) -> u32 {
        let conn = Conn {
            fd,
            live: true,
            ops: 0,
            recv_armed: false,
            recv_cancelling: false,
            ready: VecDeque::with_capacity(self.config.hold_limit + 8),
            taken: 0,
            end: None,
            send: Box::new(SendSlot {
                // SAFETY: msghdr is plain data; all-zero is its empty value.
                msg: unsafe { std::mem::zeroed() },
                iov: [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; IOV_PER_WRITE],
            }),
            send_in_flight: false,
            send_result: None,
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.conns[i as usize] = conn;
                i
            }
            None => {
                self.conns.push(conn);
                (self.conns.len() - 1) as u32
            }
        };
        self.arm_recv(idx);
        idx
    }

    fn recv(&mut self, idx: u32, bufs: &mut [IoSliceMut<'_>]) -> Recv {
        self.reap();
        let mut n = 0;
        let mut returned = false;
        let c = &mut self.conns[idx as usize];
        'bufs: for dst in bufs.iter_mut() {
            let mut at = 0;
            while at < dst.len() {
                let Some(&(bid, len)) = c.ready.front() else {
                    n += at;
                    break 'bufs;
                };
                let take = (len as usize - c.taken).min(dst.len() - at);
                dst[at..at + take].copy_from_slice(self.bufs.bytes(bid, c.taken, take));
                at += take;
                c.taken += take;
                if c.taken == len as usize {
                    c.ready.pop_front();
                    c.taken = 0;
                    self.bufs.give(bid);
                    returned = true;
                }
            }
            n += at;
        }
        if returned {
            self.bufs.publish();
        }
        if n > 0 {
            return Recv::Data(n);
        }
        match &c.end {
            Some(Recv::Eof) => Recv::Eof,
            Some(Recv::Failed(why)) => Recv::Failed(why.clone()),
            _ => Recv::WouldBlock,
        }
    }

    fn queue_send(&mut self, idx: u32, iov: &[IoSlice<'_>]) -> bool {
        let c = &mut self.conns[idx as usize];
        if c.send_in_flight || c.send_result.is_some() || iov.is_empty() {
            return false;
        }
        let n = iov.len().min(IOV_PER_WRITE);
        let slot = &mut *c.send;
        for (dst, src) in slot.iov.iter_mut().zip(iov) {
            *dst = libc::iovec { iov_base: src.as_ptr() as *mut libc::c_void, iov_len: src.len() };
        }
        slot.msg.msg_iov = slot.iov.as_mut_ptr();
        slot.msg.msg_iovlen = n as _;
        c.send_in_flight = true;
        c.ops += 1;
        self.stats.sends += 1;
        let sqe = opcode::SendMsg::new(types::Fd(c.fd), &slot.msg as *const libc::msghdr)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(user_data(idx, OP_SEND));
        self.push(sqe);
        true
    }

    /// Cancels what `idx` has in the kernel and waits (at most [`CLOSE_WAIT`]) for it to end;
    /// its buffers go back to the ring.
    fn close(&mut self, idx: u32) {
        let c = &mut self.conns[idx as usize];
        if !c.live {
            return;
        }
        c.live = false;
        let (recv, send) = (c.recv_armed && !c.recv_cancelling, c.send_in_flight);
        let held: Vec<u16> = c.ready.drain(..).map(|(bid, _)| bid).collect();
        c.taken = 0;
        for bid in held {
            self.bufs.give(bid);
        }
        self.bufs.publish();
        if recv {
            self.cancel(idx, OP_RECV);
        }
        if send {
            self.cancel(idx, OP_SEND);
        }
        let deadline = Instant::now() + CLOSE_WAIT;
        while self.conns[idx as usize].ops > 0 && Instant::now() < deadline {
            let ts = types::Timespec::new().nsec(10_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            self.stats.enters += 1;
            let _ = self.ring.submitter().submit_with_args(1, &args);
            self.reap();
        }
        let c = &self.conns[idx as usize];
        if c.ops > 0 {
            // Kept out of the free list: its slot (and the send memory the kernel may still
            // read) stays until its completions arrive.
            log::warn!("uring sockets: fd {}: {} operations still in the kernel after closing", c.fd, c.ops);
        } else if !self.free.contains(&idx) {
            self.free.push(idx);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every socket is closed (they hold the engine): nothing of ours is in the kernel but
        // maybe a connection that did not finish closing, whose buffers are then leaked.
        if self.conns.iter().any(|c| c.ops > 0) {
            log::warn!("uring sockets: the ring ends with operations in the kernel; its buffers are leaked");
            std::mem::forget(std::mem::replace(&mut self.bufs, BufRing::empty()));
            return;
        }
        let _ = self.ring.submitter().unregister_buf_ring(BUF_GROUP);
    }
}

impl BufRing {
    /// A ring that owns nothing (what is left after the real one is leaked).
    fn empty() -> BufRing {
        BufRing {
            entries: NonNull::dangling(),
            data: NonNull::dangling(),
            count: 0,
            size: 0,
            tail: 0,
            available: 0,
        }
    }
}

/// A connection's socket on its thread's engine: receives arrive into the engine's buffers,
/// one send at a time is queued for the round's submission. It names its engine rather than
/// holding it, so a connection made on one thread and moved to its reactor can carry one
/// (registered there); used on another thread it fails (receives and sends fail, nothing is
/// queued).
pub struct UringSocket {
    engine: u64,
    idx: u32,
    closed: bool,
}

impl UringSocket {
    /// Registers `fd` (a connected, non-blocking stream socket the caller keeps open) with
    /// this thread's engine, made on first use; its receive starts at the next [`flush`].
    pub fn register(fd: BorrowedFd<'_>) -> io::Result<UringSocket> {
        let engine = engine()?;
        let idx = engine.inner.borrow_mut().register(fd.as_raw_fd());
        Ok(UringSocket { engine: engine.id, idx, closed: false })
    }

    /// `f` on its engine's state, when called on the engine's thread and not closed (its slot
    /// in the engine may be another socket's by then).
    #[inline]
    fn on_engine<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> Option<R> {
        if self.closed {
            return None;
        }
        ENGINE.with(|slot| {
            let slot = slot.borrow();
            let e = slot.as_ref().filter(|e| e.id == self.engine)?;
            let mut inner = e.inner.borrow_mut();
            Some(f(&mut inner))
        })
    }

    /// Copies received bytes into `dst`: [`Recv::WouldBlock`] when none arrived yet.
    pub fn recv(&mut self, dst: &mut [u8]) -> Recv {
        self.recv_vectored(&mut [IoSliceMut::new(dst)])
    }

    /// Copies received bytes into `bufs`, in order.
    pub fn recv_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> Recv {
        let idx = self.idx;
        self.on_engine(|inner| inner.recv(idx, bufs)).unwrap_or_else(|| Recv::Failed(OFF_THREAD.into()))
    }

    /// Queues a send of `iov` (its first 64 pieces) for the next [`flush`];
    /// false when a send is in flight or its result not taken ([`UringSocket::take_sent`]).
    /// The memory `iov` points at must stay as it is until its result is taken (or the socket
    /// is closed: closing waits for the kernel to be done with it).
    pub fn queue_send(&mut self, iov: &[IoSlice<'_>]) -> bool {
        let idx = self.idx;
        self.on_engine(|inner| inner.queue_send(idx, iov)).unwrap_or(false)
    }

    /// Whether a send is in the kernel.
    pub fn send_in_flight(&self) -> bool {
        let idx = self.idx as usize;
        self.on_engine(|inner| inner.conns[idx].send_in_flight).unwrap_or(false)
    }

    /// The finished send's result (bytes sent, or why it failed), once.
    pub fn take_sent(&mut self) -> Option<io::Result<usize>> {
        let idx = self.idx as usize;
        let r = self.on_engine(|inner| {
            inner.reap();
            inner.conns[idx].send_result.take()
        });
        match r {
            None => Some(Err(io::Error::other(OFF_THREAD))),
            Some(r) => Some(if r? >= 0 { Ok(r? as usize) } else { Err(io::Error::from_raw_os_error(-r?)) }),
        }
    }

    /// Received bytes waiting in the engine's buffers, or the stream's end (work for the
    /// connection without a wake-up).
    pub fn readable(&self) -> bool {
        let idx = self.idx as usize;
        self.on_engine(|inner| {
            inner.reap();
            let c = &inner.conns[idx];
            !c.ready.is_empty() || c.end.is_some()
        })
        .unwrap_or(false)
    }

    /// Cancels the socket's operations and waits (bounded) until the kernel is done with them;
    /// the socket does nothing after.
    pub fn close(&mut self) {
        let idx = self.idx;
        if !self.closed {
            let closed = self.on_engine(|inner| inner.close(idx));
            self.closed = true;
            if closed.is_none() {
                log::warn!("uring sockets: a socket closed off its engine's thread; its operations stay");
            }
        }
    }
}

/// Why a socket closed, or used off its engine's thread, fails.
const OFF_THREAD: &str = "an io_uring socket closed or used off its engine's thread";

impl Drop for UringSocket {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for UringSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringSocket").field("idx", &self.idx).finish()
    }
}
