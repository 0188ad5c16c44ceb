//! The data path: one virtqueue served by one reactor.
//!
//! A [`QueueSetup`] is built on the control plane from owned, `Send` parts (the configured
//! queue addresses, a guest-memory snapshot, the kick and call fds, the bdev) and sent to the
//! reactor that owns the queue, where [`QueuePoller::new`] builds its memory table, opens the
//! bdev channel and pre-allocates one request slot per ring entry. From then on everything
//! about the queue is core-local: no locks, no allocation per request.
//!
//! One poll round: take available chains while slots are free, `REQUESTS_PER_POLL` at most
//! (the queue's share of its reactor's round; split or packed ring,
//! `fp_virtq`), parse and validate each (`fp-virtio-blk`), submit to the bdev channel (zero
//! copy: the iovecs point into guest memory), poll the channel, write status bytes and used
//! elements for everything that completed, publish the used ring once and notify the guest at
//! most once. A queue idle for a while is parked by its reactor (`Poller::parks_when_idle`):
//! not polled, its notifications on, until the driver kicks.
//!
//! Stopping (GET_VRING_BASE, a memory-table change, disconnect) is a message that sets
//! `stop`; the poller stops taking requests, keeps retrying a request the bdev refused as Busy
//! (and resubmitting what a previous back-end left in flight), waits for in-flight ones,
//! replies with the ring position and removes itself. A stop has a bound (docs/architecture.md,
//! "Stopping a queue"): at the bound a request still refused as Busy is completed with
//! VIRTIO_BLK_S_IOERR, or left recorded in the in-flight area for the next back-end when the
//! front-end keeps one. So is a request a stacked bdev (crypto, lvol, raid) parked because its
//! own base refused it as busy: the channel gives it up (`IoChannel::abort_parked`), it
//! completes with `ECANCELED` and is failed or left recorded the same way. A request a device
//! holds cannot be completed by us, so the stop reports it ([`StopStuck`]) and the poller stays,
//! keeping guest memory mapped, until the bdev completes it.
//!
//! While a live migration logs dirty pages ([`crate::log`]), every completion also marks the
//! pages it wrote before the used ring publishes it; with logging off that is one branch on
//! an `Option` per completion.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::disk::{Completion, DiskIo, Successes};
use fp_bdev::{IoOp, IoRequest, IoStatus, Iovecs, SubmitError};
use fp_reactor::{PollStatus, Poller};
use fp_virtio_blk::{
    write_id, DiskParams, StatusPtr, MAX_IOVECS, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP,
};
use fp_virtq::{Chain, MemTable};

use crate::coalesce::{Clock, Coalescer};
use crate::depth::{DriverDepth, FIRST_SIGNAL_BATCH, MAX_FIRST_PART};
use crate::handoff::HandOffHold;
use crate::inflight::{Pending, Tracker};
use crate::log::{DataLog, QueueLog};
use crate::memory::GuestIovecs;
pub use crate::queue_setup::{QueueSetup, StartError};
pub use crate::queue_stop::{StopMode, StopReply, StopStuck, Stopped};
use crate::ring::{open, Head, Ring};
use crate::stats::{Counters, QueueStats};

/// How long a queue whose back-end signals its completions (RBD) keeps its reactor polling
/// after the last work: not at all. The cluster takes about a millisecond. Server CPU per QD1
/// read, one run each while other builds ran: 548 us polling while requests were in flight,
/// 268 us sleeping with them after a 20 us window, 225 us sleeping at once
/// (docs/benchmarks.md, "Ceph RBD").
const REMOTE_IDLE_WINDOW: Duration = Duration::from_micros(0);

/// Otherwise at most this many requests are taken between two publications of the used ring,
/// so that a driver consuming as we complete finds completions in a stream rather than a
/// queue's worth at once. Measured with the first part (docs/bench/history.md, issues 23
/// and 37).
pub(crate) const PUBLISH_EVERY: usize = 24;
/// The most requests one poll takes, whatever the ring holds: the queue's share of its
/// reactor's round. A queue whose driver keeps its ring full (QD 256) would otherwise take two
/// parts of `PUBLISH_EVERY` per poll, 48 requests, and every other queue on the reactor would
/// wait for all of them (about 9 µs at the null path's 186 ns per request) each round. 32 is
/// what the interrupt-driven measurement behind the parts' sizes took per round at QD 32 (8 +
/// 24, or 16 + 16 with the depth's first part), so a queue at that depth or below is never
/// cut; what a deeper queue leaves waits for the next round, which follows at once
/// (docs/architecture.md, "Many queues on one reactor").
pub(crate) const REQUESTS_PER_POLL: usize = 32;
const _: () =
    assert!(MAX_FIRST_PART < PUBLISH_EVERY && FIRST_SIGNAL_BATCH + PUBLISH_EVERY <= REQUESTS_PER_POLL);

/// Requests the bdev stack parked on Busy and gave up ([`IoChannel::abort_parked`]) at a
/// stop's bound: they complete with `ECANCELED`, counted here as they do.
///
/// [`IoChannel::abort_parked`]: fp_bdev::IoChannel::abort_parked
#[derive(Default)]
struct GivenUp {
    /// Set at the bound once the channel was told to give its parked requests up; from then
    /// on an `ECANCELED` completion is one of them.
    active: bool,
    /// Completed with VIRTIO_BLK_S_IOERR.
    failed: u32,
    /// Left recorded in the in-flight area (not completed to the guest).
    left: u32,
}

/// A stop in progress.
struct Stop {
    /// `None` once the bound has passed and the caller was told (the poller then only waits
    /// for the bdev to give back what it holds).
    reply: Option<SyncSender<StopReply>>,
    since_ns: u64,
    bound: Duration,
    failed_at_bound: u32,
    left_in_flight_area: u32,
}

struct Slot {
    head: Head,
    /// [`StatusPtr::DETACHED`] while the guest is not to hear of the slot's request (none in
    /// it, or left recorded in the in-flight area): one word, where an `Option` took two
    /// stores to fill and a test before the status write, which tests for detached anyway.
    status: StatusPtr,
    /// Bytes reported in the used element on success.
    used_len: u32,
    /// What went to the bdev (its `op` and `len` are what the completion counts).
    req: IoRequest,
    iov: GuestIovecs,
}

/// The reactor-side queue. See the module docs.
pub struct QueuePoller {
    controller: Arc<str>,
    index: u16,
    /// Translates guest addresses; keeps the memory snapshot mapped.
    table: MemTable,
    ring: Ring,
    /// The chain being started (allocated once).
    chain: Chain,
    /// Crash-safe in-flight record, when the front-end provided one. Boxed: `None` is then a
    /// null pointer, one test, where the enum's niche took two compares and a branch on
    /// overflow at each of the three checks a request passes (taken, completed, published).
    tracker: Option<Box<Tracker>>,
    kick: File,
    call: File,
    /// Held by type when the bdev is a `Disk` (what the registry exports): the layer's accounting
    /// is then inlined here, and the device's channel is the one dynamic call per request.
    channel: DiskIo,
    disk: DiskParams,
    /// `disk`'s effective block size, which a running queue's disk keeps (computed once).
    block_size: u32,
    /// Read into `disk` once per round: a resize reaches the queue at its next round.
    capacity_sectors: Arc<AtomicU64>,
    serial: [u8; VIRTIO_BLK_ID_BYTES],
    slots: Box<[Slot]>,
    free: Vec<u16>,
    /// A request the channel refused as busy, retried before anything new is taken (and
    /// while the queue stops).
    retry: Option<u16>,
    /// Requests a previous back-end left in flight, not yet resubmitted because the bdev
    /// refused one of them as busy (it waits in `retry`); they go before anything new.
    resubmits: VecDeque<Pending>,
    stop: Option<Stop>,
    /// What the bdev stack gave up at the stop's bound.
    given_up: GivenUp,
    /// The stop bound's time source (the coalescer's clock).
    clock: Clock,
    failed: bool,
    counters: Counters,
    stats: Arc<QueueStats>,
    /// Completions were published that the driver has not been told about yet.
    signal_pending: bool,
    /// The driver's field declined a notification for published completions when read without
    /// a fence, which may have been before our used-ring stores reached it: every round looks
    /// again (a load, no fence) until the field asks for one or a fenced decision settles it,
    /// as a sleep or a stop makes first ([`QueuePoller::settle_notification`]).
    unsettled: bool,
    /// The driver's depth, from what it has out (or the heads it uses): the size of a round's
    /// first part.
    depth: DriverDepth,
    coalescer: Coalescer,
    /// Live-migration logging of the data path's writes (`None` while not migrating).
    data_log: Option<DataLog>,
    /// Released ([`QueuePoller::release_disk`]) when the queue's stop ends, and with the poller
    /// in any case.
    hold: Option<HandOffHold>,
}

/// The queue's handling of a completion, borrowed from the poller for one `reap`. Inlined
/// into the disk layer's completion loop (see `fp_bdev::disk::Completion`): one call frame per
/// completion rather than two.
struct Reaper<'a> {
    table: &'a MemTable,
    given_up: &'a mut GivenUp,
    log: Option<&'a DataLog>,
    slots: &'a mut [Slot],
    free: &'a mut Vec<u16>,
    ring: &'a mut Ring,
    tracker: &'a mut Option<Box<Tracker>>,
    counters: &'a mut Counters,
}

impl Completion for Reaper<'_> {
    /// A completion the disk layer counted: its reads and writes are read from the channel at
    /// publication ([`QueuePoller::publish_counters`]), not counted here again.
    #[inline(always)]
    fn complete(&mut self, tag: u32, status: IoStatus) {
        self.finish(tag, status, false)
    }

    #[inline(always)]
    fn complete_uncounted(&mut self, tag: u32, status: IoStatus) {
        self.finish(tag, status, true)
    }
}

/// Counts a successful flush, discard or write-zeroes (reads and writes are counted inline).
#[cold]
#[inline(never)]
fn count_other_success(counters: &mut Counters, op: IoOp) {
    match op {
        IoOp::Flush => counters.rare().flush_ops += 1,
        IoOp::Discard => counters.rare().discard_ops += 1,
        IoOp::WriteZeroes => counters.rare().write_zeroes_ops += 1,
        IoOp::Read | IoOp::Write => {}
    }
}

impl Reaper<'_> {
    /// Completes the request of `tag`; `count_reads_writes` when the disk layer did not count a
    /// successful read or write (see [`Completion::complete_uncounted`]).
    #[inline(always)]
    fn finish(&mut self, tag: u32, status: IoStatus, count_reads_writes: bool) {
        let slot = &mut self.slots[tag as usize];
        let code = match status {
            IoStatus::Success => {
                // A read or write is one compare when the disk layer counted it; the other
                // operations are counted out of line (a five-way match here cost a jump
                // through a table per request).
                if matches!(slot.req.op, IoOp::Read | IoOp::Write) {
                    if count_reads_writes {
                        if slot.req.op == IoOp::Read {
                            self.counters.read_ops += 1;
                            self.counters.bytes_read += slot.req.len;
                        } else {
                            self.counters.write_ops += 1;
                            self.counters.bytes_written += slot.req.len;
                        }
                    }
                } else {
                    count_other_success(self.counters, slot.req.op);
                }
                VIRTIO_BLK_S_OK
            }
            IoStatus::Error(libc::ECANCELED) if self.given_up.active => {
                // Given up at the stop's bound while parked in the bdev stack: as a request
                // parked here (`give_up_parked`), left recorded in the in-flight area when
                // there is one, else failed.
                if self.tracker.is_some() {
                    self.given_up.left += 1;
                    slot.status = StatusPtr::DETACHED;
                    self.free.push(tag as u16);
                    return;
                }
                self.given_up.failed += 1;
                self.counters.rare().io_errors += 1;
                VIRTIO_BLK_S_IOERR
            }
            IoStatus::Error(errno) => {
                log::debug!("bdev error {errno} on {:?} at {}", slot.req.op, slot.req.offset);
                self.counters.rare().io_errors += 1;
                VIRTIO_BLK_S_IOERR
            }
            IoStatus::Unsupported => {
                self.counters.rare().unsupported += 1;
                VIRTIO_BLK_S_UNSUPP
            }
        };
        // Inside guest memory kept mapped by our table (the parser translated it there).
        slot.status.write(code);
        // After the status write: a page is marked once what is written to it is there (a
        // log sync between a mark and its write would clear the bit and copy the old page).
        if let Some(log) = self.log {
            log_completion(log, self.table, slot, self.counters);
        }
        slot.status = StatusPtr::DETACHED;
        let len = if code == VIRTIO_BLK_S_OK { slot.used_len } else { 1 };
        push_used(self.ring, self.tracker, slot.head, len);
        self.free.push(tag as u16);
    }
}

/// Marks what a completing request wrote: a read's data buffers, whether it succeeded or not
/// (a failed read may have written part of them), and the status byte.
#[inline]
fn log_completion(log: &DataLog, table: &MemTable, slot: &Slot, counters: &mut Counters) {
    if slot.req.op == IoOp::Read {
        let pages = log.iovecs(table, slot.req.iov.as_slice(), u64::MAX);
        counters.rare().logged_data_pages += pages;
        counters.rare().logged_pages += pages;
    }
    if !slot.status.is_detached() {
        counters.rare().logged_pages += log.status(table, slot.status);
    }
}

/// Writes a used element, keeping the in-flight record in step. Always inlined: with the
/// ring's log branch it grew past what LLVM inlines into the completion loop by itself, and the
/// call cost 30 instructions per I/O under callgrind.
#[inline(always)]
fn push_used(ring: &mut Ring, tracker: &mut Option<Box<Tracker>>, head: Head, len: u32) {
    if let Some(t) = tracker {
        t.completing(head.id, head.slots);
    }
    ring.push_used(head, len);
}

fn submit_error_status(e: SubmitError) -> u8 {
    if e == SubmitError::Unsupported {
        VIRTIO_BLK_S_UNSUPP
    } else {
        VIRTIO_BLK_S_IOERR
    }
}

impl QueuePoller {
    /// Builds the core-local queue. Runs on the owning reactor.
    pub fn new(s: QueueSetup) -> Result<QueuePoller, StartError> {
        let index = s.index;
        let table = MemTable::new(s.mem.clone()).ok_or(StartError::NoMemory { index })?;
        let (ring, tracker, resubmit) = open(&s, &table)?;
        let mut channel = match s.bdev.as_disk() {
            Some(disk) => disk.open_typed(),
            None => s.bdev.open_channel().map(DiskIo::Device),
        }
        .map_err(|source| StartError::Channel { index, source })?;
        let slots: Box<[Slot]> = (0..s.size)
            .map(|tag| Slot {
                head: Head::default(),
                status: StatusPtr::DETACHED,
                used_len: 0,
                // The tag is the slot's index for good: `start` fills the rest.
                req: IoRequest { tag: u32::from(tag), op: IoOp::Read, offset: 0, len: 0, iov: Iovecs::NONE },
                iov: GuestIovecs::new(MAX_IOVECS),
            })
            .collect();
        let free = (0..s.size).rev().collect();
        let counters = Counters::load(&s.stats);
        // What the stats held when the queue started goes on from the channel's counts (a
        // channel that does not count leaves the queue to count every completion).
        channel.count_successes_from(
            IoOp::Read,
            Successes { ops: counters.read_ops, bytes: counters.bytes_read },
        );
        channel.count_successes_from(
            IoOp::Write,
            Successes { ops: counters.write_ops, bytes: counters.bytes_written },
        );
        let mut poller = QueuePoller {
            controller: s.controller,
            index,
            table,
            ring,
            chain: Chain::new(),
            tracker,
            kick: s.kick,
            call: s.call,
            channel,
            disk: s.disk,
            block_size: s.disk.effective_block_size(),
            capacity_sectors: s.capacity_sectors,
            serial: s.serial,
            slots,
            free,
            retry: None,
            resubmits: VecDeque::from(resubmit),
            stop: None,
            given_up: GivenUp::default(),
            clock: s.clock.clone(),
            failed: false,
            counters,
            stats: s.stats,
            signal_pending: false,
            unsettled: false,
            depth: DriverDepth::default(),
            coalescer: Coalescer::new(s.coalescing, s.clock),
            data_log: None,
            hold: s.hold,
        };
        // Before resubmitting: a request taken over from the in-flight area is logged too.
        poller.set_log(s.log);
        poller.resubmit().map_err(|reason| StartError::Resubmit { index, reason })?;
        // Start in polling mode: the driver need not kick while we poll, nor the back-end
        // signal its completions.
        poller.ring.disable_notification();
        poller.channel.disarm_completion_fd();
        Ok(poller)
    }

    /// Asks the queue to stop; `reply` receives the ring position once in-flight I/O is done
    /// (the only [`StopMode`] today), or at `bound` what is still outstanding (see the
    /// module docs).
    pub fn request_stop(&mut self, mode: StopMode, bound: Duration, reply: SyncSender<StopReply>) {
        match mode {
            StopMode::Drain => {
                if self.outstanding() > 0 {
                    log::info!(
                        "{} queue {}: stopping with {} requests outstanding ({} not accepted by the bdev \
                         yet), within {bound:?}",
                        self.controller,
                        self.index,
                        self.outstanding(),
                        usize::from(self.retry.is_some()) + self.resubmits.len()
                    );
                }
                self.stop = Some(Stop {
                    reply: Some(reply),
                    since_ns: self.clock.now_ns(),
                    bound,
                    failed_at_bound: 0,
                    left_in_flight_area: 0,
                })
            }
        }
    }

    /// Starts, changes or stops live-migration logging. Every write the queue makes after this
    /// call is logged as `log` says (the control plane replies to the front-end only after the
    /// queue's reactor has run it).
    pub fn set_log(&mut self, log: QueueLog) {
        self.data_log = log.data.map(DataLog::new);
        self.ring.set_log(log.ring);
    }

    /// Replaces the call (interrupt) fd, as SET_VRING_CALL on a running queue does.
    pub fn set_call(&mut self, call: File) {
        self.call = call;
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Answers GET_ID from the iovecs the parser put in slot `slot_idx`. Out of line: rare,
    /// and kept out of `start`'s hot code.
    #[cold]
    #[inline(never)]
    fn complete_get_id(&mut self, head: Head, slot_idx: u16, iovcnt: usize, status: StatusPtr) {
        let iov = &self.slots[usize::from(slot_idx)].iov.entries()[..iovcnt];
        // The parser built the iovecs and the status byte from device-writable descriptors
        // inside our memory table.
        let n = write_id(&self.table, iov, &self.serial);
        status.write(VIRTIO_BLK_S_OK);
        if let Some(log) = &self.data_log {
            // Exactly the `n` bytes of the string, not the whole buffer.
            let pages = log.iovecs(&self.table, iov, u64::from(n));
            let status_pages = log.status(&self.table, status);
            let rare = self.counters.rare();
            rare.logged_data_pages += pages;
            rare.logged_pages += pages + status_pages;
        }
        self.counters.rare().get_id_ops += 1;
        push_used(&mut self.ring, &mut self.tracker, head, n + 1);
    }

    /// Completes a request that never reached the bdev. Out of line: error paths only, kept
    /// out of `start`'s hot code.
    #[cold]
    #[inline(never)]
    fn complete_now(&mut self, head: Head, status: StatusPtr, code: u8) {
        // The status byte came from the parser over our memory table.
        status.write(code);
        if let Some(log) = &self.data_log {
            self.counters.rare().logged_pages += log.status(&self.table, status);
        }
        match code {
            VIRTIO_BLK_S_IOERR => self.counters.rare().io_errors += 1,
            VIRTIO_BLK_S_UNSUPP => self.counters.rare().unsupported += 1,
            _ => {}
        }
        push_used(&mut self.ring, &mut self.tracker, head, 1);
    }

    fn fail(&mut self, why: &str) {
        if !self.failed {
            log::error!("{} queue {}: failing the queue: {why}", self.controller, self.index);
            self.failed = true;
            self.counters.rare().failed_queues += 1;
        }
    }

    /// Requests the queue answers for: taken and not completed, or still to be resubmitted.
    fn outstanding(&self) -> usize {
        self.in_flight() + self.resubmits.len()
    }

    /// Retries the request the back-end refused as busy, if one waits; true once none does.
    /// The check is inlined into every round, the retry out of line: as a call the whole of it
    /// cost every round 19 instructions under callgrind when nothing waited.
    #[inline(always)]
    fn retry_busy(&mut self) -> bool {
        match self.retry {
            None => true,
            Some(slot_idx) => self.retry_refused(slot_idx),
        }
    }

    #[inline(never)]
    fn retry_refused(&mut self, slot_idx: u16) -> bool {
        let slot = &self.slots[usize::from(slot_idx)];
        match self.channel.submit(&slot.req) {
            Ok(()) => {
                self.retry = None;
                true
            }
            Err(SubmitError::Busy) => false,
            Err(e) => {
                let (head, status) = (slot.head, slot.status);
                self.retry = None;
                self.free.push(slot_idx);
                if !status.is_detached() {
                    let code = submit_error_status(e);
                    self.complete_now(head, status, code);
                }
                true
            }
        }
    }

    #[inline(never)]
    fn reap(&mut self) -> usize {
        self.reap_inline()
    }

    /// [`QueuePoller::reap`] inlined, for the reap that ends every round.
    #[inline(always)]
    fn reap_inline(&mut self) -> usize {
        let Self { channel, table, given_up, data_log, slots, free, ring, tracker, counters, .. } = self;
        channel.poll(&mut Reaper {
            table,
            given_up,
            log: data_log.as_ref(),
            slots,
            free,
            ring,
            tracker,
            counters,
        })
    }

    /// Stores the counters for the control plane, with the pages the ring logged. The reads
    /// and writes are the disk layer's, when it counts: it counts every completion of the
    /// queue's channel anyway (bdev_get_iostat), and counting them again here cost each
    /// completion ~12 instructions under callgrind where this costs a round a few loads.
    fn publish_counters(&mut self) {
        if let (Some(read), Some(write)) =
            (self.channel.successes(IoOp::Read), self.channel.successes(IoOp::Write))
        {
            let c = &mut self.counters;
            (c.read_ops, c.bytes_read, c.write_ops, c.bytes_written) =
                (read.ops, read.bytes, write.ops, write.bytes);
        }
        let ring_logged = self.ring.take_logged_pages();
        if ring_logged > 0 {
            self.counters.rare().logged_pages += ring_logged;
        }
        self.counters.publish(&self.stats);
    }

    /// Publishes what completed and signals the driver if it wants to hear and coalescing
    /// allows it now; `force` signals whatever coalescing says (the queue is stopping).
    /// Always inlined: a busy round calls it once, and its frame was most of its cost.
    #[inline(always)]
    fn notify(&mut self, force: bool) {
        let published = self.ring.publish();
        if published > 0 {
            if let Some(t) = &mut self.tracker {
                t.published(self.ring.next_used());
            }
            self.signal_pending = true;
        }
        if !self.signal_pending || !(self.coalescer.ready(u64::from(published)) || force) {
            return;
        }
        self.signal_pending = false;
        // A polling driver declines: the fenced decision would wait for the used ring's line
        // to reach the driver's CPU, a cache-line transfer per round that is nobody's work. Its
        // race with a driver that is enabling notifications meanwhile (§2.7.10) is settled by
        // the next rounds' looks (`unsettled`), each a load of the driver's field. A stopping
        // queue decides at once.
        if !force && self.stop.is_none() && self.ring.declines_for_now() {
            self.unsettled = true;
            return;
        }
        self.settle_notification();
    }

    /// Decides with the fence whether the driver wants a notification for what was published
    /// since the last one, and sends it. Settles an `unsettled` look: after the fence our
    /// used-ring stores are visible, so a driver that enables notifications later sees them.
    #[inline]
    fn settle_notification(&mut self) {
        self.unsettled = false;
        if self.ring.needs_notification() {
            // An eventfd write only fails if the counter would overflow, which means the guest
            // already has a pending notification.
            let _ = (&self.call).write(&1u64.to_ne_bytes());
            // Published at once: the round's counters went out before the signal.
            let notifications = self.counters.count_notification();
            self.stats.notifications.store(notifications, Ordering::Relaxed);
        }
    }
}

impl QueuePoller {
    /// [`QueuePoller::settle_notification`] out of line, for the round's first look: a driver
    /// that switches from polling to notifications, rarely.
    #[cold]
    #[inline(never)]
    fn settle_unsettled(&mut self) {
        self.settle_notification();
    }

    /// A round of a stopping queue: nothing new is taken; within the bound a request refused
    /// as busy is retried and resubmissions go on (they count as in flight, so the stop waits
    /// for them); completions are reaped and published. See the module docs for the bound.
    #[cold]
    #[inline(never)]
    fn poll_stopping(&mut self) -> PollStatus {
        if self.unsettled {
            self.settle_notification();
        }
        let before_bound = self.stop.as_ref().is_some_and(|s| s.reply.is_some());
        let mut busy = false;
        if before_bound {
            let parked = (self.retry.is_some(), self.resubmits.len());
            if self.retry_busy() && !self.resubmits.is_empty() {
                self.resubmit_rest();
            }
            busy |= parked != (self.retry.is_some(), self.resubmits.len());
        }
        busy |= self.reap() > 0;
        if busy {
            self.publish_counters();
            self.stats.in_flight.store(self.in_flight() as u64, Ordering::Relaxed);
            self.notify(false);
        }
        let Some(stop) = self.stop.as_ref() else { return PollStatus::Idle };
        let waited = Duration::from_nanos(self.clock.now_ns().saturating_sub(stop.since_ns));
        let past_bound = waited >= stop.bound;
        if before_bound && past_bound && (self.retry.is_some() || !self.resubmits.is_empty()) {
            self.give_up_parked(waited);
        }
        if before_bound && past_bound && self.channel.parked() > 0 {
            self.give_up_parked_below(waited);
        }
        if self.outstanding() == 0 {
            self.publish_counters();
            self.stats.in_flight.store(0, Ordering::Relaxed);
            self.notify(true);
            // Before the reply: whoever learns the queue stopped may start the other
            // controller's queues on the disk at once. Past the bound nobody is told, and only
            // this lets the other controller go on.
            self.release_disk();
            if let Some(stop) = self.stop.take() {
                match stop.reply {
                    Some(reply) => {
                        let _ = reply.send(Ok(Stopped {
                            base: self.ring.base(),
                            took: waited,
                            failed_at_bound: stop.failed_at_bound,
                            left_in_flight_area: stop.left_in_flight_area,
                        }));
                    }
                    None => log::warn!(
                        "{} queue {}: the bdev completed the last request it held {waited:?} after the \
                         stop began; the queue's guest memory and its hold on the disk are released",
                        self.controller,
                        self.index
                    ),
                }
            }
            return PollStatus::Finished;
        }
        if before_bound && past_bound {
            let in_bdev = self.in_flight();
            if let Some(stop) = self.stop.as_mut() {
                let stuck = StopStuck {
                    index: self.index,
                    bound: stop.bound,
                    waited,
                    in_bdev,
                    failed_at_bound: stop.failed_at_bound,
                    left_in_flight_area: stop.left_in_flight_area,
                };
                log::error!(
                    "{} {stuck}; the queue takes nothing more and keeps the guest memory mapped until \
                     the bdev completes them",
                    self.controller
                );
                if let Some(reply) = stop.reply.take() {
                    let _ = reply.send(Err(stuck));
                }
            }
        }
        if busy {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    /// Gives up the queue's share of the migration gate: nothing of it touches the disk now.
    fn release_disk(&mut self) {
        self.hold = None;
    }

    /// The stop's bound passed with requests the bdev never accepted (refused as busy, or not
    /// yet resubmitted): with an in-flight area they stay recorded there, taken and not
    /// completed, for the next back-end to resubmit; without one the guest gets
    /// VIRTIO_BLK_S_IOERR for them.
    fn give_up_parked(&mut self, waited: Duration) {
        let (mut failed, mut left) = (0u32, 0u32);
        if let Some(slot_idx) = self.retry.take() {
            let slot = &mut self.slots[usize::from(slot_idx)];
            let (head, status) = (slot.head, std::mem::replace(&mut slot.status, StatusPtr::DETACHED));
            self.free.push(slot_idx);
            if self.tracker.is_some() {
                left += 1;
            } else if !status.is_detached() {
                self.complete_now(head, status, VIRTIO_BLK_S_IOERR);
                failed += 1;
            }
        }
        // Still recorded as taken: resubmitted by whoever starts the queue next.
        left += self.resubmits.len() as u32;
        self.resubmits.clear();
        let Some(stop) = self.stop.as_mut() else { return };
        stop.failed_at_bound += failed;
        stop.left_in_flight_area += left;
        log::warn!(
            "{} queue {}: stop reached its bound of {:?} after {waited:?} with requests the bdev still \
             refused as busy: {failed} completed with IOERR, {left} left in the in-flight area for the \
             next back-end",
            self.controller,
            self.index,
            stop.bound
        );
    }
}

impl QueuePoller {
    /// The stop's bound passed with requests a bdev under the channel parked because its own
    /// base refused them as busy (crypto or lvol over a busy disk): nothing of them is on a
    /// device, so they are given up as the queue's own parked request is. They complete with
    /// `ECANCELED` at once (a piece already on a device first finishes); `Reaper` then leaves
    /// them in the in-flight area or fails them.
    #[cold]
    #[inline(never)]
    fn give_up_parked_below(&mut self, waited: Duration) {
        self.given_up.active = true;
        let aborted = self.channel.abort_parked();
        let (failed, left) = (self.given_up.failed, self.given_up.left);
        self.reap();
        self.publish_counters();
        self.stats.in_flight.store(self.in_flight() as u64, Ordering::Relaxed);
        self.notify(false);
        let (failed, left) = (self.given_up.failed - failed, self.given_up.left - left);
        let Some(stop) = self.stop.as_mut() else { return };
        stop.failed_at_bound += failed;
        stop.left_in_flight_area += left;
        log::warn!(
            "{} queue {}: stop reached its bound of {:?} after {waited:?} with {aborted} requests the bdev              stack kept retrying against a busy device: given up, {failed} completed with IOERR and {left}              left in the in-flight area for the next back-end so far",
            self.controller,
            self.index,
            stop.bound
        );
    }
}

/// Reads an eventfd's counter if it is readable, without blocking on an fd we do not own the
/// flags of (the VMM shares the file description). Returns the count read (the writes since
/// the last read), 0 when there was none.
fn drain_eventfd(f: &File) -> u64 {
    let mut pfd = [libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
    let ready = fp_sys::poll(&mut pfd, Some(Duration::ZERO));
    if matches!(ready, Ok(1)) && pfd[0].revents & libc::POLLIN != 0 {
        let mut buf = [0u8; 8];
        if matches!((&*f).read(&mut buf), Ok(8)) {
            return u64::from_ne_bytes(buf);
        }
    }
    0
}

impl Poller for QueuePoller {
    fn poll(&mut self) -> PollStatus {
        if self.stop.is_some() {
            return self.poll_stopping();
        }
        // The driver enabled notifications since a look declined them: the decision is due.
        if self.unsettled && !self.ring.declines_for_now() {
            self.settle_unsettled();
        }
        let mut busy = false;
        // The checks `pop_and_submit_first` relies on.
        if !self.failed && self.retry_busy() && (self.resubmits.is_empty() || self.resubmit_rest()) {
            // A round takes at most two parts, `REQUESTS_PER_POLL` in all, and publishes after
            // each (docs/architecture.md, "Guest notifications"). The first is half the
            // driver's depth when it waits for its next completion (everything before was
            // completed and announced, and it asked to hear), so that its wake-up overlaps our
            // work on the rest; what a second part leaves waits for the next round, which
            // follows at once. The driver's field is read only once a batch is that large: at
            // low depth, and in idle rounds, not at all.
            let waits = self.in_flight() == 0 && !self.signal_pending;
            let mut limit = if waits { self.depth.first_part() } else { PUBLISH_EVERY };
            let mut took = self.pop_and_submit_first(limit);
            if waits && took == limit && !self.ring.driver_waits() {
                limit = PUBLISH_EVERY;
                took += self.pop_and_submit(PUBLISH_EVERY - took);
            }
            busy |= took > 0;
            // Before anything of this round is published: what the driver has out shows whole.
            self.depth.end_round(took, || self.ring.outstanding());
            if took == limit {
                if self.reap() > 0 {
                    self.publish_counters();
                    self.notify(false);
                }
                self.pop_and_submit(PUBLISH_EVERY.min(REQUESTS_PER_POLL - took));
            }
        }
        let reaped = self.reap_inline();
        busy |= reaped > 0;
        if busy {
            // Counters first: whoever sees a completion also sees it counted.
            self.publish_counters();
            self.stats.in_flight.store(self.in_flight() as u64, Ordering::Relaxed);
            self.notify(false);
        } else if self.signal_pending {
            // A coalesced signal waits for its time.
            self.notify(false);
        }
        if busy {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    fn has_pending(&self) -> bool {
        // A held (coalesced) signal keeps the reactor polling until it goes out. Requests in
        // flight do too, unless the back-end signals their completions (RBD); a request it
        // refused as busy, or one still to be resubmitted, has no completion to signal and is
        // only retried by polling. A stop polls until its bound; past it, only what the bdev
        // still holds keeps the reactor up, as any request in flight.
        (self.in_flight() > 0 && !self.channel.sleeps_in_flight())
            || self.retry.is_some()
            || !self.resubmits.is_empty()
            || self.stop.as_ref().is_some_and(|s| s.reply.is_some())
            || self.signal_pending
    }

    fn idle_window(&self) -> Option<Duration> {
        self.channel.sleeps_in_flight().then_some(REMOTE_IDLE_WINDOW)
    }

    fn parks_when_idle(&self) -> bool {
        // Once `prepare_sleep` re-armed it, new work arrives as a kick or a completion fd's
        // signal, and stops, memory tables and call fds come through `poller_mut`: an idle
        // controller's queue costs its reactor nothing while parked.
        true
    }

    fn held_by_backend(&self) -> usize {
        // Their buffers are the guest's memory, which the queue keeps mapped; one refused as
        // busy is not the bdev's, nor one a stacked bdev parked on its base's Busy (no device
        // has it: it is retried only by our polls).
        (self.in_flight() - usize::from(self.retry.is_some())).saturating_sub(self.channel.parked())
    }

    fn prepare_sleep(&mut self) -> bool {
        if self.failed {
            return true;
        }
        // Nobody looks at the driver's field during the sleep: decide now.
        if self.unsettled {
            self.settle_notification();
        }
        let kicks = drain_eventfd(&self.kick);
        if kicks > 0 {
            self.counters.rare().kicks += kicks;
            self.publish_counters();
        }
        // The back-end's completion fd is silenced while we busy-poll; it must signal (and
        // hold nothing stale, or a level-triggered epoll would wake us at once) during a sleep.
        if !self.channel.arm_completion_fd() {
            return false;
        }
        // Re-arm and re-check for a race with the driver.
        !self.ring.enable_notification()
    }

    fn after_wake(&mut self) {
        // The kick fd is not drained here: nobody waits on it while we poll, and
        // `prepare_sleep` drains it before the next sleep (two system calls saved per wake,
        // which a backend that sleeps with requests in flight pays twice per request).
        self.channel.disarm_completion_fd();
        if !self.failed {
            self.ring.disable_notification();
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

impl Drop for QueuePoller {
    fn drop(&mut self) {
        let held = self.held_by_backend();
        if held > 0 {
            // Only at daemon shutdown, after its reactor waited its bound for them.
            log::error!(
                "{} queue {}: dropped with {held} requests still held by the bdev; their guest memory \
                 is unmapped",
                self.controller,
                self.index
            );
        }
    }
}

#[path = "queue_take.rs"]
mod take;

#[cfg(test)]
#[path = "queue_log_tests.rs"]
mod log_tests;

#[cfg(test)]
#[path = "queue_test_guest.rs"]
mod test_guest;

#[cfg(test)]
#[path = "queue_notify_tests.rs"]
mod notify_tests;

#[cfg(test)]
#[path = "queue_stop_tests.rs"]
mod stop_tests;

#[cfg(test)]
#[path = "queue_fair_tests.rs"]
mod fair_tests;
