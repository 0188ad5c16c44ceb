//! QoS end to end: libblkio clients (through fp-load) against the daemon, with limits set by
//! RPC while the disks are exported and busy. Nothing here depends on the machine's speed: a
//! limit is checked as an upper bound (+20 %), which a faster machine cannot break, and a
//! limited disk's progress as a fixed number of requests completing within a generous bound
//! (a limiter that leaks, stalls, drops or fails requests fails that; a slow or busy machine
//! only takes longer). Requests held back are seen in the limiter's own counters. How close a
//! disk comes to its limit is the benchmark's business; the exact token and slice logic is
//! tested against a fake clock in fp-bdev.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{bounded, Daemon};
use fp_loadgen::{LoadResult, LoadSpec, MultiSpec, Pattern};
use serde_json::{json, Value};

const DISK: u64 = 64 << 20;

/// One test at a time: each runs a busy-polling daemon and flooding clients, and two at once
/// on a two-core machine starve each other of CPU (they then deliver less than their limit).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn spec(sock: &std::path::Path, queues: usize, depth: usize, block_size: usize, secs: f64) -> LoadSpec {
    let mut s = LoadSpec::new(sock);
    s.pattern = Pattern::RandRead;
    s.block_size = block_size;
    s.queue_depth = depth;
    s.num_queues = queues;
    s.duration = Duration::from_secs_f64(secs);
    s
}

fn run(s: LoadSpec) -> LoadResult {
    let r = bounded(Duration::from_secs(60), "fp-load", move || fp_loadgen::run(&s)).expect("fp-load");
    assert_eq!(r.errors, 0, "a request over a limit waits, never fails: {:?}", r.first_error);
    r
}

/// What a limited run may take at most, in seconds: a stalled limiter is caught by this bound,
/// never by a rate (at the limit, every run below takes 1.5 s).
const RUN_BOUND: Duration = Duration::from_secs(60);

/// Seconds of requests at the limit each limited run asks for.
const AT_LIMIT_SECS: f64 = 1.5;

/// Runs `s` for `AT_LIMIT_SECS` worth of requests at `limit` (a fixed count, not a duration):
/// every one completes, none fails, and the rate over the run is at most the limit (+20 %).
fn held_to(what: &str, mut s: LoadSpec, limit: f64) -> LoadResult {
    let n = (limit * AT_LIMIT_SECS) as u64;
    s.max_ios = Some(n);
    s.duration = RUN_BOUND;
    let r = bounded(RUN_BOUND + Duration::from_secs(30), "fp-load", move || fp_loadgen::run(&s))
        .expect("fp-load");
    assert_eq!(r.errors, 0, "{what}: a request over a limit waits, never fails: {:?}", r.first_error);
    assert_eq!(r.ios, n, "{what}: {} of {n} requests completed within {RUN_BOUND:?}", r.ios);
    assert!(r.iops <= limit * 1.2, "{what}: {:.0}, over the limit {limit}", r.iops);
    r
}

fn ops(daemon: &Daemon, name: &str) -> u64 {
    let s = iostat(daemon, name);
    s["num_read_ops"].as_u64().unwrap() + s["num_write_ops"].as_u64().unwrap()
}

fn iostat(daemon: &Daemon, name: &str) -> Value {
    daemon.call("bdev_get_iostat", json!({"name": name}))["bdevs"][0].clone()
}

/// One disk, its queues on two reactors: an IOPS limit and then a bandwidth limit hold for
/// 1, 2 and 4 queues together, not per queue; removing the limit frees the disk.
#[test]
fn a_disk_limit_is_shared_by_its_queues_on_two_reactors() {
    let _serial = serial();
    let mut daemon = Daemon::start("0-1");
    daemon.malloc("d0", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "d0", Some(4), false);
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 4000}));
    for queues in [1, 2, 4] {
        held_to(&format!("4 K IOPS, {queues} queues"), spec(&sock, queues, 8, 4096, 0.0), 4000.0);
    }
    // 16 MiB/s of 64 KiB reads is 256 a second; the IOPS limit does not bind.
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_mbytes_per_sec": 16}));
    held_to("16 MiB/s in 64 KiB reads", spec(&sock, 2, 8, 65536, 0.0), 256.0);
    let s = iostat(&daemon, "d0");
    assert_eq!(s["queue_depth"], 0, "nothing left waiting: {s}");
    assert!(s["qos_queued_total"].as_u64().unwrap() > 0, "the limits held requests back: {s}");
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0}));
    let r = run(spec(&sock, 2, 8, 4096, 0.5));
    // Freed: no request waits for a limit any more.
    let after = iostat(&daemon, "d0");
    assert_eq!(after["qos_queued_total"], s["qos_queued_total"], "a request waited with no limit: {after}");
    assert!(r.ios > 0, "no limit any more: {r:?}");
    daemon.assert_alive();
}

/// A hundred changes while the disk is flooded: every request completes, none fails, the
/// disk's queue drains, and the last limit is what `bdev_get_bdevs` shows and what holds.
#[test]
fn a_limit_changed_a_hundred_times_under_load_loses_nothing() {
    let _serial = serial();
    let mut daemon = Daemon::start("0-1");
    daemon.malloc("d0", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "d0", Some(2), false);
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 2000}));
    // Meant to outlast the changes (100 × 20 ms plus the calls); the test checks that the disk
    // did I/O while they ran, not how long they took.
    let mut s = spec(&sock, 2, 16, 4096, 5.0);
    s.pattern = Pattern::RandRw;
    let before_load = ops(&daemon, "d0");
    let load = std::thread::spawn(move || fp_loadgen::run(&s));
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while ops(&daemon, "d0") == before_load {
        assert!(std::time::Instant::now() < until, "the load did no I/O in 60 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = std::time::Instant::now();
    let at_first_change = ops(&daemon, "d0");
    for i in 0..100u64 {
        let limit = if i % 2 == 0 { 20_000 } else { 2_000 + i * 10 };
        daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": limit}));
        std::thread::sleep(Duration::from_millis(20));
    }
    let at_last_change = ops(&daemon, "d0");
    assert!(at_last_change > at_first_change, "the changes ran while the load did: {at_first_change} ops");
    assert!(started.elapsed() < Duration::from_secs(60), "100 changes took {:?}", started.elapsed());
    let last = daemon.call("bdev_get_bdevs", json!({"name": "d0"}))[0]["assigned_rate_limits"]
        ["rw_ios_per_sec"]
        .as_u64();
    assert_eq!(last, Some(2_990));
    let r = bounded(Duration::from_secs(90), "the load", move || load.join().unwrap()).expect("fp-load");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    let s = iostat(&daemon, "d0");
    assert_eq!(s["queue_depth"], 0, "{s}");
    let done = s["num_read_ops"].as_u64().unwrap() + s["num_write_ops"].as_u64().unwrap();
    assert!(done >= r.ios, "the daemon completed what the client counted: {done} < {}", r.ios);
    // The last limit holds.
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 3000}));
    held_to("3 K IOPS after the changes", spec(&sock, 2, 8, 4096, 0.0), 3000.0);
    daemon.assert_alive();
}

/// Two disks in a group of 6,000 IOPS, weights 3 and 1, both flooding from their own client
/// threads: about 4,500 and 1,500; alone, the first gets the whole group.
#[test]
fn a_group_shares_its_limit_by_weight() {
    let _serial = serial();
    let mut daemon = Daemon::start("0");
    daemon.malloc("a", DISK / 512, 512);
    daemon.malloc("b", DISK / 512, 512);
    let sa = daemon.controller("vhost.a", "a", Some(1), false);
    let sb = daemon.controller("vhost.b", "b", Some(1), false);
    let both = |secs: f64| MultiSpec {
        disks: vec![spec(&sa, 1, 16, 4096, secs), spec(&sb, 1, 16, 4096, secs)],
        duration: Duration::from_secs_f64(secs),
        poll_queues: false,
        packed: false,
        measure_busy: false,
        cpu: None,
        thread_per_disk: true,
    };
    let run_both = |m: MultiSpec| {
        let r = bounded(Duration::from_secs(60), "two disks", move || fp_loadgen::run_multi(&m))
            .expect("fp-load");
        assert!(r.disks.iter().all(|d| d.errors == 0));
        [r.disks[0].iops, r.disks[1].iops]
    };
    daemon.call("bdev_qos_group_create", json!({"name": "g", "iops_total": 6000}));
    daemon.call("bdev_qos_group_add_bdev", json!({"name": "g", "bdev_name": "a", "weight": 3}));
    daemon.call("bdev_qos_group_add_bdev", json!({"name": "g", "bdev_name": "b", "weight": 1}));
    let queued = |name: &str| iostat(&daemon, name)["qos_queued_total"].as_u64().unwrap();
    let before = [queued("a"), queued("b")];
    let [a, b] = run_both(both(2.0));
    // Upper bounds only (a member may take what the other leaves, so each alone is bounded by
    // the group): the group's total, and each member's.
    assert!(a + b <= 6000.0 * 1.2, "the group's total: {a:.0} + {b:.0}");
    assert!(a <= 6000.0 * 1.2 && b <= 6000.0 * 1.2, "{a:.0}, {b:.0}");
    assert!(a > 0.0 && b > 0.0, "both members did I/O: {a:.0}, {b:.0}");
    // When the group held both back, the weights decide: 3 to 1 (checked loosely: the heavier
    // member gets at least as much).
    let held = queued("a") > before[0] && queued("b") > before[1];
    eprintln!("group of 6 K IOPS: weight 3 got {a:.0}, weight 1 got {b:.0}; both held back: {held}");
    if held {
        assert!(a >= b, "weight 3 got {a:.0}, weight 1 got {b:.0}");
    }
    held_to("alone in the group", spec(&sa, 1, 16, 4096, 0.0), 6000.0);
    daemon.assert_alive();
}
