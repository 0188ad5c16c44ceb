//! Fair service between queues on one reactor: a queue whose driver keeps its ring full
//! (QD 256) and a queue at QD 1 on the same RAM disk, both polled by a reactor stepped with
//! `poll_once`. Counted in rounds and in requests the disk saw, never in time: every QD-1
//! request completes in the round after it was posted, behind at most one poll's budget of the
//! flooding queue's requests, and the flooding queue still gets its whole budget every round.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, IoChannel, IoRequest, IoStatus, RamDevice, SubmitError,
};
use fp_reactor::{Reactor, ReactorConfig, PARKED_CHECK_ROUNDS, PARK_AFTER_IDLE_POLLS};
use vm_memory::{Bytes, GuestAddress};

use super::test_guest::*;
use super::{QueuePoller, StopMode, REQUESTS_PER_POLL};
use crate::log::QueueLog;
use crate::QueueStats;

/// The flooding driver's depth: its whole ring, one indirect descriptor a request.
const FLOOD_DEPTH: u16 = 256;
/// Where the flooding driver's indirect tables go (one 64-byte table per ring descriptor).
const TABLES: u64 = 0x20000;
const DATA: u64 = 0x40000;
/// The QD-1 queue reads here; the flooding queue below. The disk tells them apart by offset.
const LIGHT_SECTOR: u64 = 1024;
/// Split ring: `VRING_AVAIL_F_NO_INTERRUPT`. The flooding driver polls its used ring, as a
/// Linux guest does while it reaps a full queue: nobody waits, so each part of a poll is large.
const AVAIL_F_NO_INTERRUPT: u16 = virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT as u16;
/// Rounds a QD-1 request may take, counted from the first round after it was posted: one. Every
/// queue is polled once a round and a poll takes at most `REQUESTS_PER_POLL` requests, so the
/// flooding queue cannot push a request of another queue into a later round.
const ROUNDS_BOUND: usize = 1;

/// The disk both queues share: a RAM disk that notes, for every submission, whether it came
/// from the QD-1 queue.
struct Recorder {
    inner: RamDevice,
    light: Arc<Mutex<Vec<bool>>>,
}

struct RecorderChannel {
    inner: Box<dyn IoChannel>,
    light: Arc<Mutex<Vec<bool>>>,
}

impl BlockDevice for Recorder {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(RecorderChannel { inner: self.inner.open_channel()?, light: self.light.clone() }))
    }
}

impl IoChannel for RecorderChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.light.lock().unwrap().push(req.offset >= LIGHT_SECTOR * 512);
        self.inner.submit(req)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

/// Posts reads until `FLOOD_DEPTH` are outstanding (completions free ring entries in order, the
/// RAM disk completes in order).
fn top_up(g: &mut Guest) {
    let outstanding = g.avail_idx.wrapping_sub(g.used_idx());
    for _ in outstanding..FLOOD_DEPTH {
        let desc = u64::from(g.next_desc);
        g.post_indirect(
            TABLES + 64 * desc,
            &[(HDR, 16, false), (DATA + 512 * desc, 512, true), (STATUS + desc, 1, true)],
        );
    }
}

fn post_light(g: &mut Guest) {
    g.post(&[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)]);
}

/// How many flooding requests each round's disk log shows before the QD-1 one, and after.
fn split_at_light(log: &[bool]) -> (usize, usize) {
    let light = log.iter().position(|&l| l).expect("the QD-1 request reached the disk");
    assert_eq!(log.iter().filter(|&&l| l).count(), 1, "one QD-1 request a round");
    (light, log.len() - light - 1)
}

#[test]
fn a_queue_at_qd_256_cannot_hold_a_qd_1_queue_on_the_same_reactor_past_its_budget() {
    let light_log = Arc::new(Mutex::new(Vec::new()));
    let disk: Bdev =
        Arc::new(Recorder { inner: RamDevice::new("ram", 512, 2048).unwrap(), light: light_log.clone() });
    let mut flood = Guest::new(false);
    flood.size = FLOOD_DEPTH;
    flood.w(AVAIL_F_NO_INTERRUPT, AVAIL);
    flood.header(HDR, T_IN, 0);
    let mut light = Guest::new(false);
    light.header(HDR, T_IN, LIGHT_SECTOR);
    let mut reactor = Reactor::new(0, None, ReactorConfig::default()).unwrap();
    for g in [&flood, &light] {
        let stats = Arc::new(QueueStats::default());
        reactor.add_poller(Box::new(QueuePoller::new(g.setup(&disk, &stats, QueueLog::default())).unwrap()));
    }
    const REQUESTS: usize = 200;
    let (mut light_first, mut most_ahead) = (0, 0);
    for n in 1..=REQUESTS {
        top_up(&mut flood);
        post_light(&mut light);
        let mut rounds = 0;
        while light.used_idx() != n as u16 {
            assert!(rounds < ROUNDS_BOUND, "QD-1 request {n} waited more than {ROUNDS_BOUND} rounds");
            reactor.poll_once();
            rounds += 1;
        }
        let log = std::mem::take(&mut *light_log.lock().unwrap());
        let (ahead, behind) = split_at_light(&log);
        assert!(
            ahead <= REQUESTS_PER_POLL,
            "QD-1 request {n} waited behind {ahead} requests of the flooding queue (budget {REQUESTS_PER_POLL})"
        );
        assert_eq!(ahead + behind, REQUESTS_PER_POLL, "round {n}: the flooding queue takes its whole budget");
        most_ahead = most_ahead.max(ahead);
        light_first += usize::from(ahead == 0);
        assert_eq!(light.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(), 0);
    }
    assert_eq!(most_ahead, REQUESTS_PER_POLL, "the flooding queue did go first in some rounds");
    // The round's start rotates: each queue goes first in every other round, so neither
    // always waits for the other.
    assert_eq!(light_first, REQUESTS / 2, "the QD-1 queue went first in half the rounds");
}

/// What idle queues cost the queues that work: nanoseconds per round of a reactor serving one
/// QD-1 queue (a request posted and completed every round), with 0, then 64 idle queues beside
/// it, before they are parked (the first `PARK_AFTER_IDLE_POLLS` rounds) and once they are. A
/// measurement, not a check (it depends on the machine): run by hand, in release,
/// `cargo test --release -p fp-vhost-blk --lib idle_queues_cost -- --ignored --nocapture`.
/// For instructions rather than time, run the test binary under
/// `valgrind --tool=callgrind` with `FP_IDLE_QUEUES=64 FP_REPEATS=1` and divide the inclusive
/// cost of `polled_rounds` and `parked_rounds` by their rounds (printed).
#[test]
#[ignore = "a measurement, run by hand"]
fn idle_queues_cost_per_round() {
    let var = |name: &str| std::env::var(name).ok().map(|v| v.parse::<usize>().expect(name));
    let counts = var("FP_IDLE_QUEUES").map_or(vec![0, 64], |n| vec![n]);
    let repeats = var("FP_REPEATS").unwrap_or(20);
    let disk: Bdev = Arc::new(RamDevice::new("ram", 512, 2048).unwrap());
    // Windows of the same length in both phases, the fastest of each kept: on a shared
    // machine a longer window only catches more preemptions.
    const WINDOW: u32 = 900;
    const PARKED_WINDOWS: u32 = 100;
    let polled = 1..=WINDOW;
    let parked = 2 * PARK_AFTER_IDLE_POLLS + 1;
    println!("{WINDOW} rounds polled, {} parked", WINDOW * PARKED_WINDOWS);
    for idle in counts {
        let (mut polled_ns, mut parked_ns) = (f64::MAX, f64::MAX);
        for _ in 0..repeats {
            let mut reactor = Reactor::new(0, None, ReactorConfig::default()).unwrap();
            let mut busy = Guest::new(false);
            busy.header(HDR, T_IN, 0);
            let guests: Vec<Guest> = (0..idle).map(|_| Guest::new(false)).collect();
            for g in std::iter::once(&busy).chain(&guests) {
                let stats = Arc::new(QueueStats::default());
                reactor.add_poller(Box::new(
                    QueuePoller::new(g.setup(&disk, &stats, QueueLog::default())).unwrap(),
                ));
            }
            polled_ns = polled_ns.min(polled_rounds(&mut reactor, &mut busy, polled.clone()));
            run_rounds(&mut reactor, &mut busy, WINDOW + 1..=parked - 1);
            for w in 0..PARKED_WINDOWS {
                let first = parked + w * WINDOW;
                parked_ns =
                    parked_ns.min(parked_rounds(&mut reactor, &mut busy, first..=first + WINDOW - 1, idle));
            }
        }
        println!("{idle:3} idle queues beside one at QD 1: {polled_ns:.0} ns per round polled, {parked_ns:.0} parked");
    }
}

/// Rounds `n` in which each the busy queue gets one request: nanoseconds per round.
fn run_rounds(reactor: &mut Reactor, busy: &mut Guest, rounds: std::ops::RangeInclusive<u32>) -> f64 {
    let count = rounds.clone().count() as f64;
    let start = std::time::Instant::now();
    for n in rounds {
        post_light(busy);
        reactor.poll_once();
        assert_eq!(busy.used_idx(), n as u16);
    }
    start.elapsed().as_nanos() as f64 / count
}

/// The rounds before any idle queue is parked (a name of its own for callgrind).
#[inline(never)]
fn polled_rounds(reactor: &mut Reactor, busy: &mut Guest, rounds: std::ops::RangeInclusive<u32>) -> f64 {
    let ns = run_rounds(reactor, busy, rounds);
    assert_eq!(reactor.parked_count(), 0);
    ns
}

/// The rounds once every idle queue is parked.
#[inline(never)]
fn parked_rounds(
    reactor: &mut Reactor,
    busy: &mut Guest,
    rounds: std::ops::RangeInclusive<u32>,
    idle: usize,
) -> f64 {
    assert_eq!(reactor.parked_count(), idle);
    run_rounds(reactor, busy, rounds)
}

/// The used ring's flags: `VRING_USED_F_NO_NOTIFY` while the queue polls, 0 once it asks for
/// kicks.
fn used_flags(g: &Guest) -> u16 {
    g.mem.read_obj(GuestAddress(USED)).unwrap()
}

/// A reactor with a busy queue (a request every round) and an idle one, run until the idle one
/// is parked. Returns the reactor, the busy guest and the idle queue's guest and poller id.
fn parked_beside_a_busy_queue(disk: &Bdev) -> (Reactor, Guest, Guest, fp_reactor::PollerId, Arc<QueueStats>) {
    let mut reactor = Reactor::new(0, None, ReactorConfig::default()).unwrap();
    let mut busy = Guest::new(false);
    busy.header(HDR, T_IN, 0);
    let stats = Arc::new(QueueStats::default());
    reactor.add_poller(Box::new(QueuePoller::new(busy.setup(disk, &stats, QueueLog::default())).unwrap()));
    let idle = Guest::new(false);
    idle.header(HDR, T_IN, LIGHT_SECTOR);
    let stats = Arc::new(QueueStats::default());
    let id = reactor
        .add_poller(Box::new(QueuePoller::new(idle.setup(disk, &stats, QueueLog::default())).unwrap()));
    assert_eq!(used_flags(&idle), 1, "polled: the driver need not kick");
    run_rounds(&mut reactor, &mut busy, 1..=PARK_AFTER_IDLE_POLLS);
    assert_eq!(reactor.is_parked(id), Some(true), "idle for {PARK_AFTER_IDLE_POLLS} polls");
    assert_eq!(used_flags(&idle), 0, "parked: the driver is asked to kick");
    (reactor, busy, idle, id, stats)
}

#[test]
fn a_parked_queue_is_not_polled_and_its_first_request_is_served_within_the_check_bound() {
    let disk: Bdev = Arc::new(RamDevice::new("ram", 512, 2048).unwrap());
    let (mut reactor, mut busy, mut idle, id, stats) = parked_beside_a_busy_queue(&disk);
    let mut round = PARK_AFTER_IDLE_POLLS;
    // A request without its kick is not seen: the queue is not polled (a driver that was asked
    // to kick always does).
    post_light(&mut idle);
    run_rounds(&mut reactor, &mut busy, round + 1..=round + 4 * PARKED_CHECK_ROUNDS);
    round += 4 * PARKED_CHECK_ROUNDS;
    assert_eq!(idle.used_idx(), 0, "a parked queue is not polled");
    (&idle.kick).write_all(&1u64.to_ne_bytes()).unwrap();
    let mut waited = 0;
    while idle.used_idx() == 0 {
        assert!(waited < PARKED_CHECK_ROUNDS, "the parked queue's request waited {waited} rounds");
        round += 1;
        run_rounds(&mut reactor, &mut busy, round..=round);
        waited += 1;
    }
    assert_eq!(reactor.is_parked(id), Some(false));
    assert_eq!(used_flags(&idle), 1, "polled again: kicks off");
    assert_eq!(idle.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(), 0);
    assert_eq!(stats.read_ops.load(Ordering::Relaxed), 1);
}

#[test]
fn a_parked_queue_stops_when_asked() {
    let disk: Bdev = Arc::new(RamDevice::new("ram", 512, 2048).unwrap());
    let (mut reactor, mut busy, _idle, id, _stats) = parked_beside_a_busy_queue(&disk);
    let (tx, rx) = sync_channel(1);
    reactor.poller_mut::<QueuePoller>(id).unwrap().request_stop(StopMode::Drain, Duration::from_secs(5), tx);
    let round = PARK_AFTER_IDLE_POLLS + 1;
    run_rounds(&mut reactor, &mut busy, round..=round);
    let stopped = rx.try_recv().expect("stopped in the next round").expect("nothing outstanding");
    assert_eq!(stopped.base, 0);
    assert_eq!(reactor.poller_count(), 1, "the stopped queue left the reactor");
}
