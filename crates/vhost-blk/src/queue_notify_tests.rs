//! Guest notifications on the data path: a queue polled by hand against rings this test writes
//! as the driver would (`queue_test_guest`), counting the call eventfd's writes against what
//! the driver asked for (virtio 1.2 §2.7.7, §2.7.10 for split rings, §2.8.10 for packed), the
//! early signal of a new batch and the parts a large one is published in, the kick counter,
//! and the coalescing bound under a stepped clock.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fp_bdev::disk::ResetMode;
use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, Disk, IoChannel, IoOp, IoRequest, IoStatus, RamDevice,
    SubmitError,
};
use fp_reactor::Poller;
use fp_virtio_blk::GuestMemory;
use vm_memory::{Bytes, GuestAddress};

use super::test_guest::*;
use super::{QueuePoller, FIRST_SIGNAL_BATCH, MAX_FIRST_PART, PUBLISH_EVERY, REQUESTS_PER_POLL};
use crate::coalesce::{Clock, CoalescingSettings};
use crate::log::QueueLog;
use crate::QueueStats;

/// Split: `VRING_AVAIL_F_NO_INTERRUPT` in the available ring's flags, `used_event` after its
/// ring.
const AVAIL_F_NO_INTERRUPT: u16 = virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT as u16;

fn used_event(g: &Guest) -> u64 {
    AVAIL + 4 + 2 * u64::from(g.size)
}
/// Packed: the driver event suppression area (at AVAIL in this layout): off_wrap, flags.
const EV_ENABLE: u16 = 0;
const EV_DISABLE: u16 = 1;
const EV_DESC: u16 = 2;

/// How many times the call eventfd was written since the last look (0 if never).
fn take(f: &File) -> u64 {
    let mut buf = [0u8; 8];
    match (&*f).read(&mut buf) {
        Ok(8) => u64::from_ne_bytes(buf),
        _ => 0,
    }
}

fn readable(f: &File) -> bool {
    let mut pfd = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
}

/// Posts `n` 512-byte reads, request `i` with its own status byte. Three descriptors each: at
/// most 5 at a time in the 16-entry ring.
fn post_reads(g: &mut Guest, n: u16) {
    for i in 0..n {
        g.header(HDR, T_IN, u64::from(i));
        g.post(&[
            (HDR, 16, false),
            (0x40000 + 512 * u64::from(i), 512, true),
            (STATUS + u64::from(i), 1, true),
        ]);
    }
}

fn start(g: &Guest, bdev: &Bdev) -> (QueuePoller, Arc<QueueStats>) {
    let stats = Arc::new(QueueStats::default());
    (QueuePoller::new(g.setup(bdev, &stats, QueueLog::default())).unwrap(), stats)
}

/// What the driver could have seen when a request reached the disk: whether it had been
/// signalled, and the used index published.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Seen {
    signalled: bool,
    used: u16,
}

/// A RAM disk whose channel notes what the driver could see at every submission, that is while
/// the rest of the batch was being taken.
struct Probe {
    inner: RamDevice,
    call: File,
    mem: Arc<GuestMemory>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

struct ProbeChannel {
    inner: Box<dyn IoChannel>,
    call: File,
    mem: Arc<GuestMemory>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl BlockDevice for Probe {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(ProbeChannel {
            inner: self.inner.open_channel()?,
            call: self.call.try_clone().unwrap(),
            mem: self.mem.clone(),
            seen: self.seen.clone(),
        }))
    }
}

impl IoChannel for ProbeChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        let used = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        self.seen.lock().unwrap().push(Seen { signalled: readable(&self.call), used });
        self.inner.submit(req)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

fn probe(g: &Guest) -> (Bdev, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let dev = Probe {
        inner: RamDevice::new("ram", 512, 2048).unwrap(),
        call: g.call.try_clone().unwrap(),
        mem: g.mem.clone(),
        seen: seen.clone(),
    };
    (Arc::new(dev), seen)
}

/// Whether the driver had been signalled at each submission.
fn signalled(seen: &Mutex<Vec<Seen>>) -> Vec<bool> {
    seen.lock().unwrap().drain(..).map(|s| s.signalled).collect()
}

/// A guest whose ring holds `size` entries (three descriptors a request).
fn guest(size: u16, event_idx: bool) -> Guest {
    let mut g = Guest::new(false);
    g.size = size;
    g.event_idx = event_idx;
    g
}

#[test]
fn split_event_idx_signals_exactly_when_used_event_is_crossed() {
    let mut g = Guest::new(false);
    g.event_idx = true;
    let (mut q, stats) = start(&g, &ram());
    // The driver wants to hear of the first completion.
    g.w(0u16, used_event(&g));
    post_reads(&mut g, 3);
    q.poll();
    assert_eq!(g.used_idx(), 3);
    assert_eq!(take(&g.call), 1, "used_event 0 lies in [0, 3)");
    // The driver has not consumed anything since: however much completes, no new signal.
    post_reads(&mut g, 2);
    q.poll();
    assert_eq!((g.used_idx(), take(&g.call)), (5, 0));
    // It consumed all five and asks for the eighth: nothing until the used index passes 7.
    g.w(7u16, used_event(&g));
    post_reads(&mut g, 2);
    q.poll();
    assert_eq!((g.used_idx(), take(&g.call)), (7, 0));
    post_reads(&mut g, 1);
    q.poll();
    assert_eq!((g.used_idx(), take(&g.call)), (8, 1));
    q.poll();
    assert_eq!(stats.notifications.load(Ordering::Relaxed), 2, "the counter is the eventfd's count");
    assert_eq!(stats.read_ops.load(Ordering::Relaxed), 8);
}

#[test]
fn split_without_event_idx_follows_no_interrupt() {
    let mut g = Guest::new(false);
    let (mut q, stats) = start(&g, &ram());
    g.w(AVAIL_F_NO_INTERRUPT, AVAIL);
    for _ in 0..3 {
        post_reads(&mut g, 2);
        q.poll();
    }
    assert_eq!((g.used_idx(), take(&g.call)), (6, 0), "a polling driver is never signalled");
    g.w(0u16, AVAIL);
    // The queue read the flags without a fence while the driver polled, so it cannot tell
    // whether the driver enabled notifications before or after it saw the six completions:
    // the next round signals them, though it takes nothing.
    q.poll();
    assert_eq!(take(&g.call), 1, "the round after the driver enabled notifications");
    for round in 1..=3 {
        post_reads(&mut g, 4);
        q.poll();
        assert_eq!(take(&g.call), 1, "round {round}: one signal per round, whatever it completed");
    }
    q.poll();
    assert_eq!(stats.notifications.load(Ordering::Relaxed), 4);
}

#[test]
fn a_driver_that_stops_polling_is_signalled_before_the_queue_sleeps() {
    let mut g = Guest::new(false);
    let (mut q, stats) = start(&g, &ram());
    g.w(AVAIL_F_NO_INTERRUPT, AVAIL);
    post_reads(&mut g, 2);
    q.poll();
    assert_eq!((g.used_idx(), take(&g.call)), (2, 0));
    // Nothing was in flight or pending: the queue may sleep, and nobody would look at the
    // flags during the sleep. The driver enables notifications now.
    g.w(0u16, AVAIL);
    assert!(!q.has_pending());
    assert!(q.prepare_sleep(), "nothing new: the queue may sleep");
    assert_eq!(take(&g.call), 1, "the decision the sleep could not wait for");
    q.after_wake();
    // Settled: a later round does not signal the same completions again.
    q.poll();
    assert_eq!(take(&g.call), 0);
    assert_eq!(stats.notifications.load(Ordering::Relaxed), 1);
}

#[test]
fn with_event_idx_a_late_decision_still_follows_used_event() {
    for (event, want) in [(3u16, 0), (1, 1)] {
        let mut g = Guest::new(false);
        g.event_idx = true;
        let (mut q, _) = start(&g, &ram());
        // The driver asks for nothing in the first lap's range the queue will use.
        g.w(100u16, used_event(&g));
        post_reads(&mut g, 3);
        q.poll();
        assert_eq!((g.used_idx(), take(&g.call)), (3, 0));
        // It moves used_event: to 3 after consuming all three (no signal due), or to 1 (it
        // consumed one before asking, so completions 1 and 2 are news to it).
        g.w(event, used_event(&g));
        q.poll();
        assert_eq!(take(&g.call), want, "used_event {event}");
    }
}

#[test]
fn packed_event_suppression_disable_enable_and_descriptor_event() {
    let mut g = Guest::new(true);
    g.event_idx = true;
    let (mut q, stats) = start(&g, &ram());
    g.w(EV_DISABLE, AVAIL + 2);
    post_reads(&mut g, 2);
    q.poll();
    assert_eq!(take(&g.call), 0, "disabled");
    g.w(EV_ENABLE, AVAIL + 2);
    q.poll();
    assert_eq!(take(&g.call), 1, "enabled: the two completed while disabled, decided late");
    post_reads(&mut g, 2);
    q.poll();
    assert_eq!(take(&g.call), 1, "enabled: a signal for the round");
    // Descriptor event (EVENT_IDX): four requests of three slots each were written back, at
    // slots 0..11 of the first lap (wrap counter 1). The driver asks to hear when slot 0 of
    // the next lap (wrap counter 0) is used.
    g.w(0u16, AVAIL);
    g.w(EV_DESC, AVAIL + 2);
    post_reads(&mut g, 1);
    q.poll();
    assert_eq!(take(&g.call), 0, "slots 12..14: not there yet");
    post_reads(&mut g, 1);
    q.poll();
    assert_eq!(take(&g.call), 1, "slots 15, 0, 1: slot 0 of the next lap was used");
    post_reads(&mut g, 1);
    q.poll();
    assert_eq!(take(&g.call), 0, "past the event: nothing until the driver moves it");
    q.poll();
    assert_eq!(stats.notifications.load(Ordering::Relaxed), 3);
}

#[test]
fn a_new_batch_is_announced_after_its_first_requests_when_the_driver_waits() {
    let mut g = guest(64, true);
    let (bdev, seen) = probe(&g);
    let (mut q, stats) = start(&g, &bdev);
    let first = FIRST_SIGNAL_BATCH;
    g.w(0u16, used_event(&g));
    post_reads(&mut g, 12);
    q.poll();
    let want: Vec<bool> = (0..12).map(|i| i >= first).collect();
    assert_eq!(signalled(&seen), want, "signalled once the first {first} had completed");
    assert_eq!((g.used_idx(), take(&g.call)), (12, 1), "one signal: the driver had not consumed");
    // It consumed all twelve: a batch no larger than the first part is taken whole and
    // signalled once, at the end.
    g.w(12u16, used_event(&g));
    post_reads(&mut g, 6);
    q.poll();
    assert_eq!(signalled(&seen), [false; 6]);
    assert_eq!((g.used_idx(), take(&g.call)), (18, 1));
    // It has not consumed the last six: nobody waits, the next batch is not split.
    post_reads(&mut g, 12);
    q.poll();
    assert_eq!(signalled(&seen), [false; 12]);
    assert_eq!((g.used_idx(), take(&g.call)), (30, 0));
    q.poll();
    assert_eq!(stats.notifications.load(Ordering::Relaxed), 2);
}

#[test]
fn without_event_idx_the_first_requests_are_announced_early_too() {
    let mut g = guest(64, false);
    let (bdev, seen) = probe(&g);
    let (mut q, stats) = start(&g, &bdev);
    post_reads(&mut g, 12);
    q.poll();
    // The driver cannot say what it consumed: the rest of the batch is signalled as well,
    // one signal more than with EVENT_IDX, at most two per round.
    let want: Vec<bool> = (0..12).map(|i| i >= FIRST_SIGNAL_BATCH).collect();
    assert_eq!(signalled(&seen), want);
    assert_eq!(take(&g.call), 2);
    // A polling driver (NO_INTERRUPT) does not wait: no early part, no signal.
    g.w(AVAIL_F_NO_INTERRUPT, AVAIL);
    post_reads(&mut g, 12);
    q.poll();
    q.poll();
    assert_eq!(signalled(&seen), [false; 12]);
    assert_eq!((g.used_idx(), take(&g.call)), (24, 0));
    assert_eq!(stats.notifications.load(Ordering::Relaxed), 2);
}

/// Posts a batch of `n` reads as a driver at depth `n` does: its requests in the same
/// descriptors every time (a fixed slot each), so the same `n` heads come back batch after batch.
fn post_batch_in_slots(g: &mut Guest, n: u16) {
    g.next_desc = 0;
    post_reads(g, n);
}

#[test]
fn the_first_part_is_half_the_drivers_depth_once_a_window_has_shown_it() {
    for (depth, first) in
        [(24u16, 12usize), (32, MAX_FIRST_PART), (8, FIRST_SIGNAL_BATCH), (3, FIRST_SIGNAL_BATCH)]
    {
        let mut g = guest(256, false);
        let (bdev, seen) = probe(&g);
        let (mut q, _stats) = start(&g, &bdev);
        // Until a window of rounds has shown the depth, the first part is the default.
        post_batch_in_slots(&mut g, depth);
        q.poll();
        let want: Vec<bool> = (0..depth).map(|i| usize::from(i) >= FIRST_SIGNAL_BATCH).collect();
        assert_eq!(signalled(&seen), want, "depth {depth}, first batch");
        take(&g.call);
        for _ in 1..64 {
            post_batch_in_slots(&mut g, depth);
            q.poll();
        }
        take(&g.call);
        seen.lock().unwrap().clear();
        // Signalled after half the batch (at least the default first part: a batch no larger
        // is taken whole), and at its end: two signals without EVENT_IDX, one for a whole batch.
        post_batch_in_slots(&mut g, depth);
        q.poll();
        let want: Vec<bool> = (0..depth).map(|i| usize::from(i) >= first).collect();
        assert_eq!(signalled(&seen), want, "depth {depth}: first part {first}");
        assert_eq!(take(&g.call), if first < usize::from(depth) { 2 } else { 1 }, "depth {depth}");
        assert_eq!(g.used_idx(), 65 * depth, "every batch completed within its round");
    }
}

#[test]
fn a_packed_driver_waits_when_its_event_descriptor_is_the_next_one_used() {
    let mut g = Guest::new(true);
    g.size = 64;
    g.event_idx = true;
    let (bdev, seen) = probe(&g);
    let (mut q, stats) = start(&g, &bdev);
    // The event at slot 0 of the first lap (wrap counter 1): the very next descriptor used.
    g.w(1u16 << 15, AVAIL);
    g.w(EV_DESC, AVAIL + 2);
    post_reads(&mut g, 12);
    q.poll();
    let want: Vec<bool> = (0..12).map(|i| i >= FIRST_SIGNAL_BATCH).collect();
    assert_eq!(signalled(&seen), want);
    assert_eq!(take(&g.call), 1);
    // Disabled: nobody waits, no early part.
    g.w(EV_DISABLE, AVAIL + 2);
    post_reads(&mut g, 12);
    q.poll();
    assert_eq!(signalled(&seen), [false; 12]);
    assert_eq!(take(&g.call), 0);
    q.poll();
    assert_eq!(stats.notifications.load(Ordering::Relaxed), 1);
}

#[test]
fn a_large_batch_is_published_in_parts_and_a_round_takes_its_budget_at_most() {
    let mut g = guest(256, false);
    g.w(AVAIL_F_NO_INTERRUPT, AVAIL);
    let (bdev, seen) = probe(&g);
    let (mut q, _stats) = start(&g, &bdev);
    let n = 2 * PUBLISH_EVERY + 2;
    post_reads(&mut g, n as u16);
    q.poll();
    let used: Vec<u16> = seen.lock().unwrap().drain(..).map(|s| s.used).collect();
    let want: Vec<u16> =
        (0..REQUESTS_PER_POLL).map(|i| if i < PUBLISH_EVERY { 0 } else { PUBLISH_EVERY as u16 }).collect();
    assert_eq!(used, want, "the second part taken after the first was published, up to the budget");
    assert_eq!(usize::from(g.used_idx()), REQUESTS_PER_POLL, "the rest waits for the next round");
    q.poll();
    assert_eq!(usize::from(g.used_idx()), n);
    assert_eq!(take(&g.call), 0, "a polling driver hears nothing of it");
}

/// A RAM disk that refuses a submission as busy while `cap` requests wait for its poll.
struct Small {
    inner: RamDevice,
    cap: usize,
}

struct SmallChannel {
    inner: Box<dyn IoChannel>,
    cap: usize,
}

impl BlockDevice for Small {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(SmallChannel { inner: self.inner.open_channel()?, cap: self.cap }))
    }
}

impl IoChannel for SmallChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if self.inner.in_flight() >= self.cap {
            return Err(SubmitError::Busy);
        }
        self.inner.submit(req)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

#[test]
fn a_request_refused_as_busy_goes_first_whatever_part_of_the_batch_it_ends() {
    // The disk takes 7 at a time: the 8th request of the first part is refused and waits in
    // `retry` while the first part is announced; nothing else may be taken before it (a second
    // part would be refused at its 8th too, and one waiting request would replace the other).
    let mut g = guest(64, false);
    let dev = Small { inner: RamDevice::new("ram", 512, 2048).unwrap(), cap: 7 };
    let (mut q, stats) = start(&g, &(Arc::new(dev) as Bdev));
    let n = 20u16;
    post_reads(&mut g, n);
    for _ in 0..8 {
        q.poll();
    }
    assert_eq!(g.used_idx(), n);
    let mut ids: Vec<u32> =
        (0..n).map(|i| g.mem.read_obj(GuestAddress(USED + 4 + 8 * u64::from(i))).unwrap()).collect();
    ids.sort_unstable();
    let heads: Vec<u32> = (0..u32::from(n)).map(|i| 3 * i).collect();
    assert_eq!(ids, heads, "every request completed once");
    for i in 0..n {
        assert_eq!(g.mem.read_obj::<u8>(GuestAddress(STATUS + u64::from(i))).unwrap(), 0, "request {i}");
    }
    assert_eq!(stats.read_ops.load(Ordering::Relaxed), u64::from(n));
}

#[test]
fn kicks_are_counted_when_the_queue_goes_to_sleep() {
    let mut g = Guest::new(false);
    let (mut q, stats) = start(&g, &ram());
    for _ in 0..3 {
        (&g.kick).write_all(&1u64.to_ne_bytes()).unwrap();
    }
    assert!(q.prepare_sleep(), "nothing available: the queue may sleep");
    assert_eq!(stats.kicks.load(Ordering::Relaxed), 3);
    assert!(!readable(&g.kick), "the kick fd was drained");
    q.after_wake();
    (&g.kick).write_all(&1u64.to_ne_bytes()).unwrap();
    post_reads(&mut g, 1);
    q.poll();
    assert!(q.prepare_sleep(), "the request is done and the ring empty: the queue may sleep");
    assert_eq!(stats.kicks.load(Ordering::Relaxed), 4);
}

/// Coalescing on, a clock stepped by hand: signals are spaced by the delay, and no completion
/// waits longer than the delay for its signal.
#[test]
fn no_completion_waits_past_the_coalescing_bound() {
    const DELAY_US: u64 = 100;
    const STEP_NS: u64 = 10_000;
    let now = Arc::new(AtomicU64::new(1_000_000_000));
    let mut g = Guest::new(false);
    g.coalescing = Arc::new(CoalescingSettings::new(DELAY_US as u32, 1_000));
    g.clock = Clock::Manual(now.clone());
    let (mut q, stats) = start(&g, &ram());
    // 4 requests every 10 us: 400 K/s, far above the threshold.
    let mut unsignalled_since: Option<u64> = None;
    let mut longest = 0;
    let mut signals = 0;
    for _ in 0..5_000 {
        let t = now.fetch_add(STEP_NS, Ordering::Relaxed) + STEP_NS;
        post_reads(&mut g, 4);
        q.poll();
        if take(&g.call) > 0 {
            signals += 1;
            if let Some(since) = unsignalled_since.take() {
                longest = longest.max(t - since);
            }
        } else {
            unsignalled_since.get_or_insert(t);
        }
    }
    assert!(longest <= DELAY_US * 1000, "a completion waited {longest} ns for its signal");
    assert!(longest >= DELAY_US * 1000 - STEP_NS, "coalescing held signals ({longest} ns at most)");
    // 50 ms: the first 10 ms window signals every round (1,000), then one per 100 us (400).
    assert!((1_390..=1_410).contains(&signals), "{signals} signals");
    q.poll();
    assert_eq!(stats.notifications.load(Ordering::Relaxed), signals);
    assert_eq!(stats.read_ops.load(Ordering::Relaxed), 20_000);
}

/// Every counter a round moves is stored with the round's completions, the ones a read or a
/// write does not move (stored only in rounds that changed one) included, and a later round of
/// reads keeps them.
#[test]
fn counters_other_than_reads_and_writes_are_published_with_their_round() {
    const T_FLUSH: u32 = 4;
    const T_UNKNOWN: u32 = 99;
    let mut g = Guest::new(false);
    let (mut q, stats) = start(&g, &ram());
    // 2048 sectors: a read at the last one runs past the end.
    let requests = [(T_FLUSH, 0), (T_GET_ID, 0), (T_UNKNOWN, 0), (T_IN, 2047)];
    for (i, &(kind, sector)) in requests.iter().enumerate() {
        let hdr = HDR + 16 * i as u64;
        g.header(hdr, kind, sector);
        let data = (0x40000 + 1024 * i as u64, 1024, true);
        let status = (STATUS + i as u64, 1, true);
        if kind == T_FLUSH {
            g.post(&[(hdr, 16, false), status]);
        } else {
            g.post(&[(hdr, 16, false), data, status]);
        }
    }
    q.poll();
    assert_eq!(g.used_idx(), 4);
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let rare =
        |s: &QueueStats| (load(&s.flush_ops), load(&s.get_id_ops), load(&s.unsupported), load(&s.io_errors));
    assert_eq!(rare(&stats), (1, 1, 1, 1), "flush, GET_ID, unsupported, error");
    assert_eq!(load(&stats.read_ops), 0);
    post_reads(&mut g, 2);
    q.poll();
    assert_eq!(load(&stats.read_ops), 2);
    assert_eq!(rare(&stats), (1, 1, 1, 1), "a round of reads leaves them");
}

/// A queue over a disk that counts (what the registry exports) publishes the reads and writes
/// the disk layer counted in its channel, on top of what its stats held when it started (a
/// queue restarted on the same stats); a reset of the disk's statistics (bdev_reset_iostat)
/// clears the disk's counters and leaves the queue's as they were.
#[test]
fn reads_and_writes_on_a_counting_disk_go_on_from_the_stats_through_its_resets() {
    let counted: Bdev = Arc::new(Disk::new(ram(), true));
    let disk = counted.as_disk().unwrap();
    let mut g = Guest::new(false);
    let stats = Arc::new(QueueStats::default());
    // What a previous queue on these stats published.
    stats.read_ops.store(100, Ordering::Relaxed);
    stats.bytes_read.store(100 * 512, Ordering::Relaxed);
    let mut q = QueuePoller::new(g.setup(&counted, &stats, QueueLog::default())).unwrap();
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let queue =
        |s: &QueueStats| (load(&s.read_ops), load(&s.bytes_read), load(&s.write_ops), load(&s.bytes_written));
    let on_disk = |op| (disk.stats().op(op).ops, disk.stats().op(op).bytes);
    post_reads(&mut g, 2);
    q.poll();
    assert_eq!(g.used_idx(), 2);
    assert_eq!(queue(&stats), (102, 102 * 512, 0, 0));
    assert_eq!(on_disk(IoOp::Read), (2, 1024));
    disk.reset(ResetMode::All);
    g.header(HDR, T_OUT, 0);
    g.post(&[(HDR, 16, false), (0x40000, 512, false), (STATUS, 1, true)]);
    q.poll();
    assert_eq!(g.used_idx(), 3);
    assert_eq!(queue(&stats), (102, 102 * 512, 1, 512), "the reset leaves the queue's counters");
    assert_eq!((on_disk(IoOp::Read), on_disk(IoOp::Write)), ((0, 0), (1, 512)), "and clears the disk's");
    post_reads(&mut g, 3);
    q.poll();
    assert_eq!(queue(&stats), (105, 105 * 512, 1, 512));
    assert_eq!(on_disk(IoOp::Read), (3, 3 * 512));
}
