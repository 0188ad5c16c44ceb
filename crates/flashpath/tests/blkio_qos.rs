//! QoS end to end: libblkio clients (through fp-load) against the daemon, with limits set by
//! RPC while the disks are exported and busy. A limit is an upper bound (+20 %). The floor is
//! only a quarter of the limit, or of what the same load got on this machine without the
//! limit (measured in the same test) if that is lower: on two cores at a load average of 9 a
//! debug daemon flooded at 250,000 IOPS unlimited but delivered 2,464 under a 4,000 limit, so
//! how close a limited disk comes to its limit depends on how often its reactor gets a core.
//! These tests catch gross errors (a limit that leaks, is not shared by a disk's queues,
//! stalls, drops or fails requests); the exact token and slice logic is tested against a fake
//! clock in fp-bdev, and the accuracy is measured by the benchmark.

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

/// What a disk must deliver, as a part of what it could: a stalled limiter fails this, a slow
/// or busy machine does not (see above).
const FLOOR: f64 = 0.25;

/// `got` (a rate under `limit`) is at most the limit (+20 %) and at least [`FLOOR`] of the lower
/// of the limit and `free`, what the same load did here without it.
fn held_to(what: &str, got: f64, limit: f64, free: f64) {
    assert!(got <= limit * 1.2, "{what}: {got:.0}, over the limit {limit}");
    let floor = limit.min(free) * FLOOR;
    assert!(got >= floor, "{what}: {got:.0}, under {floor:.0} (limit {limit}, {free:.0} without it)");
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
    // What this machine does with each load below before any limit.
    let free: Vec<f64> = [1, 2, 4].iter().map(|&q| run(spec(&sock, q, 8, 4096, 0.5)).iops).collect();
    let free_64k = run(spec(&sock, 2, 8, 65536, 0.5)).iops;
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 4000}));
    for (queues, free) in [1, 2, 4].into_iter().zip(&free) {
        let r = run(spec(&sock, queues, 8, 4096, 1.5));
        held_to(&format!("4 K IOPS, {queues} queues"), r.iops, 4000.0, *free);
    }
    // 16 MiB/s of 64 KiB reads is 256 a second; the IOPS limit does not bind.
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_mbytes_per_sec": 16}));
    let r = run(spec(&sock, 2, 8, 65536, 2.0));
    held_to("16 MiB/s in 64 KiB reads", r.iops, 256.0, free_64k);
    let s = iostat(&daemon, "d0");
    assert_eq!(s["queue_depth"], 0, "nothing left waiting: {s}");
    assert!(s["qos_queued_total"].as_u64().unwrap() > 0, "the limits held requests back: {s}");
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0}));
    let r = run(spec(&sock, 2, 8, 4096, 0.5));
    // Freed: no request waits for a limit, and the disk runs as it did before the limits.
    let after = iostat(&daemon, "d0");
    assert_eq!(after["qos_queued_total"], s["qos_queued_total"], "a request waited with no limit: {after}");
    assert!(r.iops >= free[1] * FLOOR, "no limit any more: {:.0}, {:.0} before the limits", r.iops, free[1]);
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
    // What the last load below does here without a limit.
    let free = run(spec(&sock, 2, 8, 4096, 0.5)).iops;
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
    let r = run(spec(&sock, 2, 8, 4096, 1.5));
    held_to("3 K IOPS after the changes", r.iops, 3000.0, free);
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
    // What this machine does with the same loads before the group.
    let [free_a, free_b] = run_both(both(0.7));
    let free_alone = run(spec(&sa, 1, 16, 4096, 0.5)).iops;
    daemon.call("bdev_qos_group_create", json!({"name": "g", "iops_total": 6000}));
    daemon.call("bdev_qos_group_add_bdev", json!({"name": "g", "bdev_name": "a", "weight": 3}));
    daemon.call("bdev_qos_group_add_bdev", json!({"name": "g", "bdev_name": "b", "weight": 1}));
    let [a, b] = run_both(both(2.0));
    assert!(a + b <= 6000.0 * 1.2, "the group's total: {a:.0} + {b:.0}");
    // Fair sharing gives a member more than its weight only what the other leaves, and the
    // other takes at least its floor of what it did without the group, up to its share.
    let a_max = 4500f64.max(6000.0 - 1500f64.min(free_b * FLOOR));
    let b_max = 1500f64.max(6000.0 - 4500f64.min(free_a * FLOOR));
    held_to("weight 3 of 6 K", a, a_max, free_a.min(4500.0));
    held_to("weight 1 of 6 K", b, b_max, free_b.min(1500.0));
    let r = run(spec(&sa, 1, 16, 4096, 1.5));
    held_to("alone in the group", r.iops, 6000.0, free_alone);
    daemon.assert_alive();
}
