//! The data path: one virtqueue served by one reactor.
//!
//! A [`QueueSetup`] is built on the control plane from owned, `Send` parts (the configured
//! queue addresses, a guest-memory snapshot, the kick and call fds, the bdev) and sent to the
//! reactor that owns the queue, where [`QueuePoller::new`] opens the bdev channel and
//! pre-allocates one request slot per ring entry. From then on everything about the queue is
//! core-local: no locks, no allocation per request.
//!
//! One poll round: pop available chains while slots are free, parse and validate each
//! (`fp-virtio-blk`), submit to the bdev channel (zero copy: the iovecs point into guest memory),
//! poll the channel, write status bytes and used elements for everything that completed, publish
//! the used index once and notify the guest at most once.
//!
//! Stopping (GET_VRING_BASE, a memory-table change, disconnect) is a message that sets
//! `stop`; the poller stops taking requests, waits for in-flight ones, replies with the ring
//! position and removes itself.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use fp_bdev::{Bdev, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};
use fp_reactor::{PollStatus, Poller};
use fp_virtio_blk::{
    parse_chain, validate, write_id, BlkRequest, DiskParams, GuestMemory, RequestType, StatusPtr, MAX_IOVECS,
    SECTOR_SIZE, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

use crate::inflight::InflightArea;
use crate::ring::UsedRing;

/// Per-queue counters, written by the queue's reactor only (relaxed stores), read by the control
/// plane.
#[derive(Debug, Default)]
pub struct QueueStats {
    pub read_ops: AtomicU64,
    pub write_ops: AtomicU64,
    pub flush_ops: AtomicU64,
    pub discard_ops: AtomicU64,
    pub write_zeroes_ops: AtomicU64,
    pub get_id_ops: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub io_errors: AtomicU64,
    pub unsupported: AtomicU64,
    pub failed: AtomicU64,
    pub notifications: AtomicU64,
    /// Requests taken from the ring and not yet completed (a gauge).
    pub in_flight: AtomicU64,
}

/// Local copies of the counters; published to [`QueueStats`] once per busy round.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    read_ops: u64,
    write_ops: u64,
    flush_ops: u64,
    discard_ops: u64,
    write_zeroes_ops: u64,
    get_id_ops: u64,
    bytes_read: u64,
    bytes_written: u64,
    io_errors: u64,
    unsupported: u64,
    failed: u64,
    notifications: u64,
}

impl Counters {
    fn publish(&self, s: &QueueStats) {
        s.read_ops.store(self.read_ops, Ordering::Relaxed);
        s.write_ops.store(self.write_ops, Ordering::Relaxed);
        s.flush_ops.store(self.flush_ops, Ordering::Relaxed);
        s.discard_ops.store(self.discard_ops, Ordering::Relaxed);
        s.write_zeroes_ops.store(self.write_zeroes_ops, Ordering::Relaxed);
        s.get_id_ops.store(self.get_id_ops, Ordering::Relaxed);
        s.bytes_read.store(self.bytes_read, Ordering::Relaxed);
        s.bytes_written.store(self.bytes_written, Ordering::Relaxed);
        s.io_errors.store(self.io_errors, Ordering::Relaxed);
        s.unsupported.store(self.unsupported, Ordering::Relaxed);
        s.failed.store(self.failed, Ordering::Relaxed);
        s.notifications.store(self.notifications, Ordering::Relaxed);
    }

    fn load(s: &QueueStats) -> Counters {
        Counters {
            read_ops: s.read_ops.load(Ordering::Relaxed),
            write_ops: s.write_ops.load(Ordering::Relaxed),
            flush_ops: s.flush_ops.load(Ordering::Relaxed),
            discard_ops: s.discard_ops.load(Ordering::Relaxed),
            write_zeroes_ops: s.write_zeroes_ops.load(Ordering::Relaxed),
            get_id_ops: s.get_id_ops.load(Ordering::Relaxed),
            bytes_read: s.bytes_read.load(Ordering::Relaxed),
            bytes_written: s.bytes_written.load(Ordering::Relaxed),
            io_errors: s.io_errors.load(Ordering::Relaxed),
            unsupported: s.unsupported.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            notifications: s.notifications.load(Ordering::Relaxed),
        }
    }
}

/// Everything needed to start a queue on a reactor. `Send`; built on the control plane.
pub struct QueueSetup {
    pub controller: Arc<str>,
    pub index: u16,
    pub size: u16,
    pub desc: GuestAddress,
    pub avail: GuestAddress,
    pub used: GuestAddress,
    /// Ring position to continue from (the vring base).
    pub base: u16,
    pub event_idx: bool,
    pub mem: Arc<GuestMemory>,
    pub kick: File,
    pub call: File,
    pub bdev: Bdev,
    pub disk: DiskParams,
    pub serial: [u8; VIRTIO_BLK_ID_BYTES],
    pub stats: Arc<QueueStats>,
    /// The connection's in-flight area, when the front-end negotiated INFLIGHT_SHMFD.
    pub inflight: Option<Arc<InflightArea>>,
}

/// Why a queue could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("queue {index}: {source}")]
    Ring {
        index: u16,
        #[source]
        source: crate::ring::RingError,
    },
    #[error("queue {index}: descriptor table is not inside guest memory")]
    DescTable { index: u16 },
    #[error("queue {index}: {source}")]
    Inflight {
        index: u16,
        #[source]
        source: crate::inflight::InflightError,
    },
    #[error("queue {index}: cannot resubmit in-flight requests: {reason}")]
    Resubmit { index: u16, reason: String },
    #[error("queue {index}: cannot open a channel to the bdev: {source}")]
    Channel {
        index: u16,
        #[source]
        source: fp_bdev::BdevError,
    },
}

/// What a stopped queue reports back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// The next available-ring index to process: the vring base to resume from.
    pub next_avail: u16,
}

struct Slot {
    head: u16,
    status: Option<StatusPtr>,
    /// Bytes reported in the used element on success.
    used_len: u32,
    op: IoOp,
    bytes: u64,
    req: IoRequest,
    iov: Box<[libc::iovec]>,
}

/// The reactor-side queue. See the module docs.
pub struct QueuePoller {
    controller: Arc<str>,
    index: u16,
    queue: Queue,
    mem: Arc<GuestMemory>,
    used: UsedRing,
    kick: File,
    call: File,
    channel: Box<dyn IoChannel>,
    disk: DiskParams,
    serial: [u8; VIRTIO_BLK_ID_BYTES],
    slots: Box<[Slot]>,
    free: Vec<u16>,
    /// A request the channel refused as busy, retried before anything new is popped.
    retry: Option<u16>,
    stop: Option<SyncSender<Stopped>>,
    failed: bool,
    counters: Counters,
    stats: Arc<QueueStats>,
    /// Guest memory plus the private page used to resubmit in-flight requests (kept while the
    /// queue lives; see `resubmit`).
    replay_mem: Option<Arc<GuestMemory>>,
}

fn empty_iov() -> libc::iovec {
    libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }
}

/// What to do after starting one chain.
enum Flow {
    Next,
    /// The backend is full: stop taking requests this round (the request waits in `retry`).
    Busy,
    /// The chain cannot be completed at all: fail the queue.
    Fail(String),
}

/// The parts of a poller that starting a request touches (split off so the available-ring
/// iterator can borrow the queue at the same time).
struct Starter<'a> {
    used: &'a mut UsedRing,
    channel: &'a mut Box<dyn IoChannel>,
    disk: &'a DiskParams,
    serial: &'a [u8; VIRTIO_BLK_ID_BYTES],
    slots: &'a mut [Slot],
    free: &'a mut Vec<u16>,
    retry: &'a mut Option<u16>,
    counters: &'a mut Counters,
}

impl Starter<'_> {
    /// Parses, validates and submits one chain, or completes it at once. The caller ensures a
    /// slot is free.
    fn start<M>(&mut self, chain: DescriptorChain<M>) -> Flow
    where
        M: std::ops::Deref,
        M::Target: vm_memory::GuestMemory,
    {
        let Some(&slot_idx) = self.free.last() else { return Flow::Busy };
        let head = chain.head_index();
        self.used.taken(head);
        let slot = &mut self.slots[usize::from(slot_idx)];
        let req: BlkRequest = match parse_chain(chain, &mut slot.iov) {
            Ok(r) => r,
            Err(e) => {
                return match e.status {
                    Some(st) => {
                        log::debug!("queue request {head}: {}", e.kind);
                        QueuePoller::complete_now(self.used, self.counters, head, st, e.status_code());
                        Flow::Next
                    }
                    None => Flow::Fail(format!("request {head} cannot be completed: {}", e.kind)),
                };
            }
        };
        if let Err(code) = validate(&req, self.disk) {
            QueuePoller::complete_now(self.used, self.counters, head, req.status, code);
            return Flow::Next;
        }
        let op = match req.kind {
            RequestType::In => IoOp::Read,
            RequestType::Out => IoOp::Write,
            RequestType::Flush => IoOp::Flush,
            RequestType::Discard => IoOp::Discard,
            RequestType::WriteZeroes => IoOp::WriteZeroes,
            RequestType::GetId => {
                let iov = &slot.iov[..req.iovcnt as usize];
                // SAFETY: the iovecs were built by the parser from device-writable
                // descriptors inside our live memory snapshot.
                let n = unsafe { write_id(iov, self.serial) };
                // SAFETY: as above, for the status byte.
                unsafe { req.status.write(VIRTIO_BLK_S_OK) };
                self.counters.get_id_ops += 1;
                self.used.push(head, n + 1);
                return Flow::Next;
            }
            RequestType::Unsupported(_) => {
                QueuePoller::complete_now(self.used, self.counters, head, req.status, VIRTIO_BLK_S_UNSUPP);
                return Flow::Next;
            }
        };
        let (offset, len) = match req.segment {
            Some(seg) => (seg.sector * SECTOR_SIZE, u64::from(seg.num_sectors) * SECTOR_SIZE),
            None if op == IoOp::Flush => (0, 0),
            None => (req.sector * SECTOR_SIZE, req.data_len),
        };
        slot.head = head;
        slot.status = Some(req.status);
        slot.used_len = if op == IoOp::Read { req.writable_len } else { 1 };
        slot.op = op;
        slot.bytes = len;
        slot.req = IoRequest {
            tag: u32::from(slot_idx),
            op,
            offset,
            len,
            iov: slot.iov.as_ptr(),
            iovcnt: req.iovcnt,
        };
        self.free.pop();
        // SAFETY: the iovecs point into guest memory kept mapped by the poller's snapshot,
        // which it holds until every in-flight request has completed (stop waits for them), and
        // the iovec array lives in the slot, which is not reused before completion.
        match unsafe { self.channel.submit(&slot.req) } {
            Ok(()) => Flow::Next,
            Err(SubmitError::Busy) => {
                *self.retry = Some(slot_idx);
                Flow::Busy
            }
            Err(e) => {
                self.free.push(slot_idx);
                let code =
                    if e == SubmitError::Unsupported { VIRTIO_BLK_S_UNSUPP } else { VIRTIO_BLK_S_IOERR };
                QueuePoller::complete_now(self.used, self.counters, head, req.status, code);
                Flow::Next
            }
        }
    }
}

impl QueuePoller {
    /// Builds the core-local queue. Runs on the owning reactor.
    pub fn new(s: QueueSetup) -> Result<QueuePoller, StartError> {
        let mut queue = Queue::new(s.size).map_err(|_| StartError::DescTable { index: s.index })?;
        queue.set_size(s.size);
        queue.set_desc_table_address(Some(s.desc.0 as u32), Some((s.desc.0 >> 32) as u32));
        queue.set_avail_ring_address(Some(s.avail.0 as u32), Some((s.avail.0 >> 32) as u32));
        queue.set_used_ring_address(Some(s.used.0 as u32), Some((s.used.0 >> 32) as u32));
        queue.set_event_idx(s.event_idx);
        queue.set_ready(true);
        if !queue.is_valid(&*s.mem) {
            return Err(StartError::DescTable { index: s.index });
        }
        // With in-flight tracking the ring position comes from the region, not the base: after
        // a back-end crash the front-end resets the base to the used index, and everything it
        // had taken beyond that is either completed (in the used ring) or recorded in flight.
        let (mut next_avail, mut next_used, mut tracker, mut resubmit) = (s.base, s.base, None, Vec::new());
        if let Some(area) = &s.inflight {
            let mut t = area
                .queue(s.index, s.size)
                .map_err(|source| StartError::Inflight { index: s.index, source })?;
            let ring_used: u16 = s
                .mem
                .read_obj(s.used.unchecked_add(2))
                .map_err(|_| StartError::DescTable { index: s.index })?;
            let recovered = t.recover(ring_used);
            if recovered.reused {
                next_used = ring_used;
                next_avail = ring_used.wrapping_add(recovered.resubmit.len() as u16);
                if !recovered.resubmit.is_empty() {
                    log::info!(
                        "{} queue {}: resubmitting {} in-flight requests from before the restart",
                        s.controller,
                        s.index,
                        recovered.resubmit.len()
                    );
                }
                resubmit = recovered.resubmit;
            }
            tracker = Some(t);
        }
        queue.set_next_avail(next_avail);
        queue.set_next_used(next_used);
        let mut used = UsedRing::new(&s.mem, s.avail, s.used, s.size, s.event_idx, next_used)
            .map_err(|source| StartError::Ring { index: s.index, source })?;
        if let Some(t) = tracker.take() {
            used.track(t);
        }
        let channel =
            s.bdev.open_channel().map_err(|source| StartError::Channel { index: s.index, source })?;
        let slots: Box<[Slot]> = (0..s.size)
            .map(|_| Slot {
                head: 0,
                status: None,
                used_len: 0,
                op: IoOp::Read,
                bytes: 0,
                req: IoRequest {
                    tag: 0,
                    op: IoOp::Read,
                    offset: 0,
                    len: 0,
                    iov: std::ptr::null(),
                    iovcnt: 0,
                },
                iov: vec![empty_iov(); MAX_IOVECS].into_boxed_slice(),
            })
            .collect();
        let free = (0..s.size).rev().collect();
        let counters = Counters::load(&s.stats);
        let mut poller = QueuePoller {
            controller: s.controller,
            index: s.index,
            queue,
            mem: s.mem,
            used,
            kick: s.kick,
            call: s.call,
            channel,
            disk: s.disk,
            serial: s.serial,
            slots,
            free,
            retry: None,
            stop: None,
            failed: false,
            counters,
            stats: s.stats,
            replay_mem: None,
        };
        if !resubmit.is_empty() {
            poller
                .resubmit(&resubmit, s.desc)
                .map_err(|reason| StartError::Resubmit { index: poller.index, reason })?;
        }
        // Start in polling mode: the driver need not kick while we poll.
        let _ = poller.queue.disable_notification(&*poller.mem);
        Ok(poller)
    }

    /// Asks the queue to stop; `reply` receives the ring position once in-flight I/O is done.
    pub fn request_stop(&mut self, reply: SyncSender<Stopped>) {
        self.stop = Some(reply);
    }

    /// Replaces the call (interrupt) fd, as SET_VRING_CALL on a running queue does.
    pub fn set_call(&mut self, call: File) {
        self.call = call;
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn fail(&mut self, why: &str) {
        if !self.failed {
            log::error!("{} queue {}: failing the queue: {why}", self.controller, self.index);
            self.failed = true;
            self.counters.failed += 1;
        }
    }

    /// Completes a request that never reached the bdev.
    fn complete_now(used: &mut UsedRing, counters: &mut Counters, head: u16, status: StatusPtr, code: u8) {
        // SAFETY: the status pointer came from the parser over our live memory snapshot.
        unsafe { status.write(code) };
        match code {
            VIRTIO_BLK_S_IOERR => counters.io_errors += 1,
            VIRTIO_BLK_S_UNSUPP => counters.unsupported += 1,
            _ => {}
        }
        used.push(head, 1);
    }

    /// Pops and starts new requests. Returns whether it popped anything.
    fn pop_and_submit(&mut self) -> bool {
        let Self { queue, mem, used, channel, disk, serial, slots, free, retry, counters, .. } = self;
        let mut iter = match queue.iter(&**mem) {
            Ok(it) => it,
            Err(e) => {
                let why = format!("bad available ring: {e}");
                self.fail(&why);
                return true;
            }
        };
        let mut popped = false;
        let mut failure = None;
        let mut starter = Starter { used, channel, disk, serial, slots, free, retry, counters };
        while !starter.free.is_empty() {
            let Some(chain) = iter.next() else { break };
            popped = true;
            match starter.start(chain) {
                Flow::Next => {}
                Flow::Busy => break,
                Flow::Fail(why) => {
                    failure = Some(why);
                    break;
                }
            }
        }
        if let Some(why) = failure {
            self.fail(&why);
        }
        popped
    }

    /// Resubmits requests a previous back-end left in flight (see [`crate::inflight`]), oldest
    /// first, before anything new is taken from the available ring.
    ///
    /// `virtio-queue` only builds descriptor chains from an available ring, so the heads are
    /// listed in a one-off available ring in a private page mapped above guest memory; walking
    /// it with a temporary queue over the guest's descriptor table yields ordinary chains for
    /// the one request parser. The combined map is kept for the poller's lifetime, so even a
    /// descriptor that (hostilely) points into the private page stays valid while in flight.
    fn resubmit(&mut self, heads: &[u16], desc_table: GuestAddress) -> Result<(), String> {
        let size = self.queue.size();
        let top = self.mem.iter().map(|r| r.last_addr().raw_value()).max().unwrap_or(0);
        let private =
            top.checked_add(1).map(|a| a.next_multiple_of(4096)).ok_or("no room above guest memory")?;
        let ring_bytes = (6 + 2 * usize::from(size)).next_multiple_of(4096);
        let region = MmapRegion::<()>::new(ring_bytes).map_err(|e| format!("private ring: {e}"))?;
        let region = GuestRegionMmap::new(region, GuestAddress(private)).ok_or("private ring address")?;
        let combined =
            Arc::new(self.mem.insert_region(Arc::new(region)).map_err(|e| format!("private ring: {e}"))?);
        for (i, &h) in heads.iter().enumerate() {
            combined.write_obj(h, GuestAddress(private + 4 + 2 * i as u64)).map_err(|e| e.to_string())?;
        }
        combined.write_obj(heads.len() as u16, GuestAddress(private + 2)).map_err(|e| e.to_string())?;
        let mut replay = Queue::new(size).map_err(|e| e.to_string())?;
        replay.set_size(size);
        replay.set_desc_table_address(Some(desc_table.0 as u32), Some((desc_table.0 >> 32) as u32));
        replay.set_avail_ring_address(Some(private as u32), Some((private >> 32) as u32));
        replay.set_used_ring_address(Some(private as u32), Some((private >> 32) as u32));
        replay.set_ready(true);
        let Self { used, channel, disk, serial, slots, free, retry, counters, .. } = self;
        let mut starter = Starter { used, channel, disk, serial, slots, free, retry, counters };
        let mut iter = replay.iter(&*combined).map_err(|e| e.to_string())?;
        for chain in iter.by_ref() {
            match starter.start(chain) {
                Flow::Next => {}
                // At queue start every slot is free and nothing is queued: a busy channel here
                // would have to hold more than a ring's worth of requests.
                Flow::Busy => return Err("backend refused a resubmitted request".into()),
                Flow::Fail(why) => return Err(why),
            }
        }
        self.replay_mem = Some(combined);
        Ok(())
    }

    fn retry_busy(&mut self) -> bool {
        let Some(slot_idx) = self.retry else { return true };
        let slot = &self.slots[usize::from(slot_idx)];
        // SAFETY: see `pop_and_submit`; the slot still holds the request and its iovecs.
        match unsafe { self.channel.submit(&slot.req) } {
            Ok(()) => {
                self.retry = None;
                true
            }
            Err(SubmitError::Busy) => false,
            Err(e) => {
                let (head, status) = (slot.head, slot.status);
                self.retry = None;
                self.free.push(slot_idx);
                let code =
                    if e == SubmitError::Unsupported { VIRTIO_BLK_S_UNSUPP } else { VIRTIO_BLK_S_IOERR };
                if let Some(st) = status {
                    Self::complete_now(&mut self.used, &mut self.counters, head, st, code);
                }
                true
            }
        }
    }

    fn reap(&mut self) -> usize {
        let Self { channel, slots, free, used, counters, .. } = self;
        channel.poll(&mut |tag, status| {
            let slot = &mut slots[tag as usize];
            let code = match status {
                IoStatus::Success => {
                    match slot.op {
                        IoOp::Read => {
                            counters.read_ops += 1;
                            counters.bytes_read += slot.bytes;
                        }
                        IoOp::Write => {
                            counters.write_ops += 1;
                            counters.bytes_written += slot.bytes;
                        }
                        IoOp::Flush => counters.flush_ops += 1,
                        IoOp::Discard => counters.discard_ops += 1,
                        IoOp::WriteZeroes => counters.write_zeroes_ops += 1,
                    }
                    VIRTIO_BLK_S_OK
                }
                IoStatus::Error(errno) => {
                    log::debug!("bdev error {errno} on {:?} at {}", slot.op, slot.req.offset);
                    counters.io_errors += 1;
                    VIRTIO_BLK_S_IOERR
                }
                IoStatus::Unsupported => {
                    counters.unsupported += 1;
                    VIRTIO_BLK_S_UNSUPP
                }
            };
            if let Some(st) = slot.status.take() {
                // SAFETY: the status pointer is inside guest memory kept mapped by our snapshot.
                unsafe { st.write(code) };
            }
            let len = if code == VIRTIO_BLK_S_OK { slot.used_len } else { 1 };
            used.push(slot.head, len);
            free.push(tag as u16);
        })
    }

    fn notify(&mut self) {
        if self.used.publish() > 0 && self.used.needs_notification() {
            // An eventfd write only fails if the counter would overflow, which means the guest
            // already has a pending notification.
            let _ = (&self.call).write(&1u64.to_ne_bytes());
            self.counters.notifications += 1;
        }
    }
}

/// Reads an eventfd's counter if it is readable, without blocking on an fd we do not own the
/// flags of (the VMM shares the file description).
fn drain_eventfd(f: &File) {
    let mut pfd = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    if ready == 1 && pfd.revents & libc::POLLIN != 0 {
        let mut buf = [0u8; 8];
        let _ = (&*f).read(&mut buf);
    }
}

impl Poller for QueuePoller {
    fn poll(&mut self) -> PollStatus {
        let mut busy = false;
        if !self.failed && self.stop.is_none() && self.retry_busy() {
            busy |= self.pop_and_submit();
        }
        let reaped = self.reap();
        busy |= reaped > 0;
        if busy {
            // Counters first: whoever sees a completion also sees it counted.
            self.counters.publish(&self.stats);
            self.stats.in_flight.store(self.in_flight() as u64, Ordering::Relaxed);
            self.notify();
        }
        if self.stop.is_some() && self.in_flight() == 0 {
            self.counters.publish(&self.stats);
            self.stats.in_flight.store(0, Ordering::Relaxed);
            self.notify();
            let next_avail = self.queue.next_avail();
            if let Some(reply) = self.stop.take() {
                let _ = reply.send(Stopped { next_avail });
            }
            return PollStatus::Finished;
        }
        if busy {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    fn has_pending(&self) -> bool {
        self.in_flight() > 0 || self.stop.is_some()
    }

    fn prepare_sleep(&mut self) -> bool {
        if self.failed {
            return true;
        }
        drain_eventfd(&self.kick);
        // Re-arm (EVENT_IDX: avail_event = next_avail) and re-check for a race with the driver.
        match self.queue.enable_notification(&*self.mem) {
            Ok(more) => !more,
            Err(_) => true,
        }
    }

    fn after_wake(&mut self) {
        drain_eventfd(&self.kick);
        if !self.failed {
            let _ = self.queue.disable_notification(&*self.mem);
        }
    }

    fn wake_fds(&self) -> Vec<RawFd> {
        let mut fds = vec![self.kick.as_raw_fd()];
        if let Some(fd) = self.channel.completion_fd() {
            fds.push(fd);
        }
        fds
    }
}
