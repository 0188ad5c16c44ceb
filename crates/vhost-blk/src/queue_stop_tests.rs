//! Back-pressure on the stop and start paths: a request the bdev refused as Busy is retried
//! while the queue stops and after it starts with requests to resubmit, it keeps the reactor
//! polling, and a stop ends at its bound whatever the bdev does. A queue polled by hand against
//! rings written as the driver would (`queue_test_guest`), over a RAM disk whose channel can be
//! made to refuse (Busy) or hold requests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, IoChannel, IoRequest, IoStatus, RamDevice, SubmitError,
};
use fp_reactor::{PollStatus, Poller};
use fp_virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};
use vm_memory::{Bytes, GuestAddress};

use super::test_guest::*;
use super::{QueuePoller, StopMode, StopReply};
use crate::coalesce::Clock;
use crate::inflight::InflightArea;
use crate::log::QueueLog;
use crate::{HandOff, QueueStats};

/// What the test makes the disk do with the next submissions.
#[derive(Default)]
struct GateState {
    /// Refuse every submission as Busy (the error bdev's `nomem`).
    busy: AtomicBool,
    /// Take submissions but complete none (a request the bdev holds) until cleared.
    hold: AtomicBool,
    /// Take submissions and park them, as a stacked bdev does whose base refuses them as busy
    /// (crypto or lvol over a busy disk): `parked` counts them, `abort_parked` gives them up.
    park: AtomicBool,
}

struct Gate {
    inner: RamDevice,
    state: Arc<GateState>,
    /// What the channel says of `sleeps_in_flight` (a back-end that signals its completions).
    sleeps: bool,
}

struct GateChannel {
    inner: Box<dyn IoChannel>,
    state: Arc<GateState>,
    sleeps: bool,
    held: Vec<IoRequest>,
    parked: Vec<IoRequest>,
    cancelled: Vec<u32>,
}

impl BlockDevice for Gate {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(GateChannel {
            inner: self.inner.open_channel()?,
            state: self.state.clone(),
            sleeps: self.sleeps,
            held: Vec::new(),
            parked: Vec::new(),
            cancelled: Vec::new(),
        }))
    }
}

impl IoChannel for GateChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if self.state.busy.load(Ordering::Relaxed) {
            return Err(SubmitError::Busy);
        }
        if self.state.hold.load(Ordering::Relaxed) {
            self.held.push(*req);
            return Ok(());
        }
        if self.state.park.load(Ordering::Relaxed) {
            self.parked.push(*req);
            return Ok(());
        }
        self.inner.submit(req)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        if !self.state.hold.load(Ordering::Relaxed) {
            for req in std::mem::take(&mut self.held) {
                self.inner.submit(&req).expect("the RAM disk takes a held request");
            }
        }
        if !self.state.park.load(Ordering::Relaxed) {
            for req in std::mem::take(&mut self.parked) {
                self.inner.submit(&req).expect("the RAM disk takes a parked request");
            }
        }
        let cancelled = self.cancelled.len();
        for tag in self.cancelled.drain(..) {
            done(tag, IoStatus::Error(libc::ECANCELED));
        }
        cancelled + self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.held.len() + self.parked.len() + self.cancelled.len() + self.inner.in_flight()
    }
    fn parked(&self) -> usize {
        self.parked.len()
    }
    fn abort_parked(&mut self) -> usize {
        let n = self.parked.len();
        self.cancelled.extend(self.parked.drain(..).map(|r| r.tag));
        n
    }
    fn sleeps_in_flight(&self) -> bool {
        self.sleeps
    }
}

fn gate(sleeps: bool) -> (Bdev, Arc<GateState>) {
    let state = Arc::new(GateState::default());
    let dev = Gate { inner: RamDevice::new("ram", 512, 2048).unwrap(), state: state.clone(), sleeps };
    (Arc::new(dev), state)
}

/// A status byte no completion writes.
const UNTOUCHED: u8 = 0xab;

/// Posts read `i` (512 bytes of sector `i`) with its own header and status byte (set to
/// [`UNTOUCHED`]).
fn post_read(g: &mut Guest, i: u16) {
    let hdr = HDR + 0x100 * u64::from(i);
    g.w(UNTOUCHED, STATUS + u64::from(i));
    g.header(hdr, T_IN, u64::from(i));
    g.post(&[(hdr, 16, false), (0x40000 + 512 * u64::from(i), 512, true), (STATUS + u64::from(i), 1, true)]);
}

fn status(g: &Guest, i: u16) -> u8 {
    g.mem.read_obj(GuestAddress(STATUS + u64::from(i))).unwrap()
}

fn start(g: &Guest, bdev: &Bdev) -> QueuePoller {
    let stats = Arc::new(QueueStats::default());
    QueuePoller::new(g.setup(bdev, &stats, QueueLog::default())).unwrap()
}

/// Polls until the queue finishes, at most `rounds` times; returns whether it did.
fn poll_until_finished(q: &mut QueuePoller, rounds: usize) -> bool {
    (0..rounds).any(|_| q.poll() == PollStatus::Finished)
}

#[test]
fn a_stop_retries_the_request_parked_on_busy_and_ends_once_it_completes() {
    let mut g = Guest::new(false);
    let (bdev, state) = gate(false);
    let mut q = start(&g, &bdev);
    state.busy.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    assert_eq!(g.used_idx(), 0, "refused as busy: parked");
    // The client goes away with the request parked: the queue is stopped, then the disk
    // takes requests again.
    let (tx, rx) = sync_channel::<StopReply>(1);
    q.request_stop(StopMode::Drain, Duration::from_secs(5), tx);
    q.poll();
    assert!(rx.try_recv().is_err(), "the parked request is still in flight");
    state.busy.store(false, Ordering::Relaxed);
    assert!(poll_until_finished(&mut q, 10), "the stop never ended: the parked request was not retried");
    let stopped = rx.try_recv().expect("the stop replied").expect("a clean stop");
    assert_eq!(stopped.base, 1);
    assert_eq!((stopped.failed_at_bound, stopped.left_in_flight_area), (0, 0));
    assert_eq!((g.used_idx(), status(&g, 0)), (1, VIRTIO_BLK_S_OK), "the parked read completed");
}

#[test]
fn a_parked_request_keeps_the_reactor_polling() {
    // A back-end that signals its completions lets the reactor sleep with requests in flight;
    // a request it refused as busy has no completion to signal, so it must not.
    let mut g = Guest::new(false);
    let (bdev, state) = gate(true);
    let mut q = start(&g, &bdev);
    state.busy.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    q.poll();
    assert_eq!(g.used_idx(), 0);
    assert!(q.has_pending(), "the reactor may sleep while a request waits to be retried");
    assert!(!q.prepare_sleep() || q.has_pending());
    state.busy.store(false, Ordering::Relaxed);
    q.poll();
    q.poll();
    assert_eq!(g.used_idx(), 1);
    assert!(!q.has_pending(), "nothing waits: the reactor may sleep");
}

/// A first back-end takes `n` reads and dies with them held; the next one starts while the
/// disk refuses everything as busy.
fn resubmission_refused_as_busy(packed: bool) {
    let mut g = Guest::new(packed);
    let (area, _file, _) = InflightArea::create(1, SIZE).unwrap();
    let stats = Arc::new(QueueStats::default());
    let n = 3;
    {
        let (held, state) = gate(false);
        state.hold.store(true, Ordering::Relaxed);
        let mut q =
            QueuePoller::new(g.setup_with(&held, &stats, QueueLog::default(), Some(area.clone()))).unwrap();
        for i in 0..n {
            post_read(&mut g, i);
        }
        q.poll();
        assert!((0..n).all(|i| status(&g, i) == UNTOUCHED), "held in flight");
    }
    let (bdev, state) = gate(false);
    state.busy.store(true, Ordering::Relaxed);
    let mut q = QueuePoller::new(g.setup_with(&bdev, &stats, QueueLog::default(), Some(area)))
        .expect("a busy disk does not fail the queue start");
    q.poll();
    assert!((0..n).all(|i| status(&g, i) == UNTOUCHED), "refused as busy");
    assert!(q.has_pending(), "resubmissions wait: the reactor keeps polling");
    state.busy.store(false, Ordering::Relaxed);
    q.poll();
    q.poll();
    // Packed: the first read's slot shows it used; split: the used index counts all three.
    assert!(g.completed() || !packed, "the resubmitted reads completed once the disk took them");
    if !packed {
        assert_eq!(g.used_idx(), n, "the resubmitted reads completed once the disk took them");
    }
    for i in 0..n {
        assert_eq!(status(&g, i), VIRTIO_BLK_S_OK, "read {i}");
    }
}

#[test]
fn a_split_resubmission_refused_as_busy_is_retried_after_the_start() {
    resubmission_refused_as_busy(false);
}

#[test]
fn a_packed_resubmission_refused_as_busy_is_retried_after_the_start() {
    resubmission_refused_as_busy(true);
}

const BOUND: Duration = Duration::from_secs(5);

/// A guest whose queue reads the time from `now` (nanoseconds), stepped by the test.
fn guest_on_manual_clock(packed: bool) -> (Guest, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(1_000_000_000));
    let mut g = Guest::new(packed);
    g.clock = Clock::Manual(now.clone());
    (g, now)
}

fn step(now: &AtomicU64, by: Duration) {
    now.fetch_add(by.as_nanos() as u64, Ordering::Relaxed);
}

fn stop(q: &mut QueuePoller) -> Receiver<StopReply> {
    let (tx, rx) = sync_channel::<StopReply>(1);
    q.request_stop(StopMode::Drain, BOUND, tx);
    rx
}

#[test]
fn at_its_bound_a_stop_fails_the_request_still_refused_as_busy() {
    let (mut g, now) = guest_on_manual_clock(false);
    let (bdev, state) = gate(false);
    let mut q = start(&g, &bdev);
    state.busy.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    let rx = stop(&mut q);
    step(&now, BOUND - Duration::from_millis(1));
    assert_eq!(q.poll(), PollStatus::Idle);
    assert!(rx.try_recv().is_err(), "within the bound the stop waits");
    assert_eq!(status(&g, 0), UNTOUCHED);
    step(&now, Duration::from_millis(1));
    assert_eq!(q.poll(), PollStatus::Finished, "the stop ends at its bound");
    let stopped = rx.try_recv().expect("the stop replied").expect("nothing is held by the bdev");
    assert_eq!((stopped.base, stopped.failed_at_bound, stopped.left_in_flight_area), (1, 1, 0));
    assert_eq!(stopped.took, BOUND);
    assert_eq!((g.used_idx(), status(&g, 0)), (1, VIRTIO_BLK_S_IOERR), "the guest got IOERR");
}

#[test]
fn at_its_bound_a_stop_leaves_the_refused_request_in_the_inflight_area_for_the_next_back_end() {
    let (mut g, now) = guest_on_manual_clock(false);
    let (area, _file, _) = InflightArea::create(1, SIZE).unwrap();
    let stats = Arc::new(QueueStats::default());
    let (bdev, state) = gate(false);
    let mut q =
        QueuePoller::new(g.setup_with(&bdev, &stats, QueueLog::default(), Some(area.clone()))).unwrap();
    state.busy.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    let rx = stop(&mut q);
    step(&now, BOUND);
    assert_eq!(q.poll(), PollStatus::Finished);
    let stopped = rx.try_recv().unwrap().unwrap();
    assert_eq!((stopped.failed_at_bound, stopped.left_in_flight_area), (0, 1));
    assert_eq!((g.used_idx(), status(&g, 0)), (0, UNTOUCHED), "not completed: still recorded");
    drop(q);
    // The next back-end on the same area resubmits it once the disk takes requests again.
    state.busy.store(false, Ordering::Relaxed);
    let mut q = QueuePoller::new(g.setup_with(&bdev, &stats, QueueLog::default(), Some(area))).unwrap();
    q.poll();
    assert_eq!((g.used_idx(), status(&g, 0)), (1, VIRTIO_BLK_S_OK), "resubmitted and completed");
}

#[test]
fn a_request_the_bdev_holds_at_the_bound_is_reported_and_waited_for() {
    let (mut g, now) = guest_on_manual_clock(false);
    let (bdev, state) = gate(false);
    let mut q = start(&g, &bdev);
    state.hold.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    let rx = stop(&mut q);
    step(&now, BOUND + Duration::from_millis(3));
    assert_ne!(q.poll(), PollStatus::Finished, "the bdev still owns the request's buffers");
    let stuck = rx.try_recv().expect("the stop answered at its bound").expect_err("not stopped");
    assert_eq!((stuck.in_bdev, stuck.waited, stuck.bound), (1, BOUND + Duration::from_millis(3), BOUND));
    assert!(stuck.to_string().contains("1 requests still held by the bdev"), "{stuck}");
    assert!(q.has_pending(), "the reactor polls for the held request");
    assert_eq!(status(&g, 0), UNTOUCHED);
    // The bdev gives the request back: it completes and the queue goes, releasing the memory.
    state.hold.store(false, Ordering::Relaxed);
    assert!(poll_until_finished(&mut q, 5));
    assert_eq!((g.used_idx(), status(&g, 0)), (1, VIRTIO_BLK_S_OK));
}

#[test]
fn a_queue_stuck_past_its_bound_releases_the_disk_hand_off_when_the_bdev_completes() {
    let (mut g, now) = guest_on_manual_clock(false);
    let (bdev, state) = gate(false);
    let handoff = HandOff::new();
    let (src, dst): (Arc<str>, Arc<str>) = ("src".into(), "dst".into());
    let stats = Arc::new(QueueStats::default());
    let mut setup = g.setup(&bdev, &stats, QueueLog::default());
    setup.hold = Some(HandOff::hold(&handoff, &src).unwrap());
    let mut q = QueuePoller::new(setup).unwrap();
    state.hold.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    let rx = stop(&mut q);
    step(&now, BOUND);
    assert_ne!(q.poll(), PollStatus::Finished);
    rx.try_recv().unwrap().expect_err("the bdev holds the read at the bound");
    assert_eq!(
        HandOff::hold(&handoff, &dst).unwrap_err(),
        src,
        "the other controller must not write beside a request the bdev still holds"
    );
    state.hold.store(false, Ordering::Relaxed);
    let mut finished = false;
    for _ in 0..5 {
        if q.poll() == PollStatus::Finished {
            finished = true;
            break;
        }
    }
    assert!(finished);
    // Still on its reactor (not dropped yet), the queue has already let go of the disk.
    let _dst = HandOff::hold(&handoff, &dst).expect("the last held request completed: the disk is free");
    drop(q);
}

#[test]
fn a_stopped_queue_releases_the_disk_hand_off_before_it_answers() {
    let g = Guest::new(false);
    let (bdev, _state) = gate(false);
    let handoff = HandOff::new();
    let (src, dst): (Arc<str>, Arc<str>) = ("src".into(), "dst".into());
    let stats = Arc::new(QueueStats::default());
    let mut setup = g.setup(&bdev, &stats, QueueLog::default());
    setup.hold = Some(HandOff::hold(&handoff, &src).unwrap());
    let mut q = QueuePoller::new(setup).unwrap();
    let rx = stop(&mut q);
    assert_eq!(q.poll(), PollStatus::Finished);
    rx.try_recv().unwrap().expect("nothing outstanding");
    let _dst = HandOff::hold(&handoff, &dst).expect("the stopped queue holds the disk no more");
    drop(q);
}

#[test]
fn shutdown_waits_for_a_request_the_bdev_holds_not_for_one_refused_as_busy() {
    let mut g = Guest::new(false);
    let (bdev, state) = gate(false);
    let mut q = start(&g, &bdev);
    state.busy.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    assert_eq!(q.held_by_backend(), 0, "a request refused as busy is not the bdev's");
    state.busy.store(false, Ordering::Relaxed);
    state.hold.store(true, Ordering::Relaxed);
    q.poll();
    assert_eq!(q.held_by_backend(), 1, "the bdev took it and holds it");
    state.hold.store(false, Ordering::Relaxed);
    for _ in 0..5 {
        q.poll();
    }
    assert_eq!((q.held_by_backend(), status(&g, 0)), (0, VIRTIO_BLK_S_OK));
}

#[test]
fn at_its_bound_a_stop_gives_up_a_request_parked_in_the_bdev_stack_with_ioerr() {
    let (mut g, now) = guest_on_manual_clock(false);
    let (bdev, state) = gate(false);
    let mut q = start(&g, &bdev);
    state.park.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    assert_eq!(q.held_by_backend(), 0, "parked below: no device has it");
    let rx = stop(&mut q);
    step(&now, BOUND - Duration::from_millis(1));
    q.poll();
    assert!(rx.try_recv().is_err(), "within the bound the stop waits");
    step(&now, Duration::from_millis(1));
    assert_eq!(q.poll(), PollStatus::Finished, "the stop ends at its bound");
    let stopped = rx.try_recv().expect("the stop replied").expect("nothing is on a device");
    assert_eq!((stopped.failed_at_bound, stopped.left_in_flight_area), (1, 0));
    assert_eq!((g.used_idx(), status(&g, 0)), (1, VIRTIO_BLK_S_IOERR), "the guest got IOERR");
}

#[test]
fn at_its_bound_a_stop_leaves_a_request_parked_in_the_bdev_stack_in_the_inflight_area() {
    let (mut g, now) = guest_on_manual_clock(false);
    let (area, _file, _) = InflightArea::create(1, SIZE).unwrap();
    let stats = Arc::new(QueueStats::default());
    let (bdev, state) = gate(false);
    let mut q =
        QueuePoller::new(g.setup_with(&bdev, &stats, QueueLog::default(), Some(area.clone()))).unwrap();
    state.park.store(true, Ordering::Relaxed);
    post_read(&mut g, 0);
    q.poll();
    let rx = stop(&mut q);
    step(&now, BOUND);
    assert_eq!(q.poll(), PollStatus::Finished);
    let stopped = rx.try_recv().unwrap().expect("nothing is on a device");
    assert_eq!((stopped.failed_at_bound, stopped.left_in_flight_area), (0, 1));
    assert_eq!((g.used_idx(), status(&g, 0)), (0, UNTOUCHED), "not completed: still recorded");
    drop(q);
    state.park.store(false, Ordering::Relaxed);
    let mut q = QueuePoller::new(g.setup_with(&bdev, &stats, QueueLog::default(), Some(area))).unwrap();
    q.poll();
    assert_eq!((g.used_idx(), status(&g, 0)), (1, VIRTIO_BLK_S_OK), "resubmitted and completed");
}
