//! QoS end to end: libblkio clients (through fp-load) against the daemon, with limits set by
//! RPC while the disks are exported and busy. Tolerances are generous (±20 %) so that a loaded
//! CI machine cannot make them flaky: these tests catch gross errors (a limit that leaks, is
//! not shared by a disk's queues, drops or fails requests); the exact token and slice logic is
//! tested against a fake clock in fp-bdev, and the accuracy is measured by the benchmark.

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

fn within(what: &str, got: f64, want: f64) {
    assert!((want * 0.8..=want * 1.2).contains(&got), "{what}: {got:.0}, limit {want}");
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
        let r = run(spec(&sock, queues, 8, 4096, 1.5));
        within(&format!("4 K IOPS, {queues} queues"), r.iops, 4000.0);
    }
    // 16 MiB/s of 64 KiB reads is 256 a second; the IOPS limit does not bind.
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_mbytes_per_sec": 16}));
    let r = run(spec(&sock, 2, 8, 65536, 2.0));
    within("16 MiB/s in 64 KiB reads", r.iops, 256.0);
    let s = iostat(&daemon, "d0");
    assert_eq!(s["queue_depth"], 0, "nothing left waiting: {s}");
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0}));
    let r = run(spec(&sock, 2, 8, 4096, 0.5));
    assert!(r.iops > 8000.0, "no limit any more: {:.0}", r.iops);
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
    // Long enough to outlast the changes (100 × 20 ms plus the calls).
    let mut s = spec(&sock, 2, 16, 4096, 5.0);
    s.pattern = Pattern::RandRw;
    let load = std::thread::spawn(move || fp_loadgen::run(&s));
    let started = std::time::Instant::now();
    for i in 0..100u64 {
        let limit = if i % 2 == 0 { 20_000 } else { 2_000 + i * 10 };
        daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": limit}));
        std::thread::sleep(Duration::from_millis(20));
    }
    let last = daemon.call("bdev_get_bdevs", json!({"name": "d0"}))[0]["assigned_rate_limits"]
        ["rw_ios_per_sec"]
        .as_u64();
    assert_eq!(last, Some(2_990));
    assert!(started.elapsed() < Duration::from_secs(5), "the changes ran while the load did");
    let r = bounded(Duration::from_secs(90), "the load", move || load.join().unwrap()).expect("fp-load");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    let s = iostat(&daemon, "d0");
    assert_eq!(s["queue_depth"], 0, "{s}");
    let done = s["num_read_ops"].as_u64().unwrap() + s["num_write_ops"].as_u64().unwrap();
    assert!(done >= r.ios, "the daemon completed what the client counted: {done} < {}", r.ios);
    // The last limit holds.
    daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 3000}));
    let r = run(spec(&sock, 2, 8, 4096, 1.5));
    within("3 K IOPS after the changes", r.iops, 3000.0);
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
    daemon.call("bdev_qos_group_create", json!({"name": "g", "iops_total": 6000}));
    daemon.call("bdev_qos_group_add_bdev", json!({"name": "g", "bdev_name": "a", "weight": 3}));
    daemon.call("bdev_qos_group_add_bdev", json!({"name": "g", "bdev_name": "b", "weight": 1}));
    let m = MultiSpec {
        disks: vec![spec(&sa, 1, 16, 4096, 2.0), spec(&sb, 1, 16, 4096, 2.0)],
        duration: Duration::from_secs(2),
        poll_queues: false,
        packed: false,
        measure_busy: false,
        cpu: None,
        thread_per_disk: true,
    };
    let r =
        bounded(Duration::from_secs(60), "two disks", move || fp_loadgen::run_multi(&m)).expect("fp-load");
    assert!(r.disks.iter().all(|d| d.errors == 0));
    within("weight 3 of 6 K", r.disks[0].iops, 4500.0);
    within("weight 1 of 6 K", r.disks[1].iops, 1500.0);
    let r = run(spec(&sa, 1, 16, 4096, 1.5));
    within("alone in the group", r.iops, 6000.0);
    daemon.assert_alive();
}
