//! The load generator (`fp-loadgen`) against a vhost controller on an error bdev (`EE_m`,
//! docs/error.md): injected failures come back to the client as `EIO` and are counted as
//! errors, exactly `num` of them, never as I/O or in the latency histogram; once the
//! injection is used up or cleared the next run has none; requests an injection holds complete
//! after `bdev_error_resume_pending`; `nomem` only delays requests. The daemon's
//! `bdev_get_iostat` counts the same failures under `io_error`.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{bounded, Daemon};
use fp_loadgen::{LoadResult, LoadSpec, Pattern};
use serde_json::{json, Value};

const DISK: u64 = 16 << 20;
const EE: &str = "EE_m";

/// A daemon with a RAM disk `m`, its error bdev `EE_m` and a controller on it.
fn error_disk() -> (Daemon, PathBuf) {
    let daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    assert_eq!(daemon.call("bdev_error_create", json!({"base_name": "m"})), true);
    let sock = daemon.controller("vhost.e", EE, Some(1), false);
    (daemon, sock)
}

fn inject(daemon: &Daemon, io_type: &str, error_type: &str, num: u64) {
    let p = json!({"name": EE, "io_type": io_type, "error_type": error_type, "num": num});
    assert_eq!(daemon.call("bdev_error_inject_error", p), true);
}

/// What is left of the injections, by io type (`{}` when none).
fn injections(daemon: &Daemon) -> Value {
    daemon.call("bdev_get_bdevs", json!({"name": EE}))[0]["driver_specific"]["error"]["injections"].clone()
}

/// Exactly `n` requests of `pattern` at queue depth 8, every one of them counted (the run ends
/// when the last completes; the long duration only bounds it).
fn spec_n(sock: &Path, pattern: Pattern, n: u64) -> LoadSpec {
    let mut s = LoadSpec::new(sock);
    s.pattern = pattern;
    s.queue_depth = 8;
    s.num_queues = 1;
    s.max_ios = Some(n);
    s.duration = Duration::from_secs(30);
    s
}

fn run_n(sock: &Path, pattern: Pattern, n: u64) -> LoadResult {
    let s = spec_n(sock, pattern, n);
    let r = fp_loadgen::run(&s).unwrap_or_else(|e| panic!("{pattern} x{n}: {e}"));
    assert_eq!(r.ios + r.errors, n, "{pattern}: a request was neither I/O nor an error: {r:?}");
    r
}

/// A run without any failure: every request counted as I/O, the shared checks hold.
fn assert_clean(what: &str, sock: &Path, pattern: Pattern, n: u64) {
    let s = spec_n(sock, pattern, n);
    let r = fp_loadgen::run(&s).unwrap_or_else(|e| panic!("{what}: {e}"));
    common::load::check_result(what, &s, &r, DISK);
    assert_eq!(r.ios, n, "{what}: {r:?}");
}

/// `bdev_get_iostat` of `name`: (reads, writes, EIO errors).
fn iostat(daemon: &Daemon, name: &str) -> (u64, u64, u64) {
    let s = &daemon.call("bdev_get_iostat", json!({"name": name}))["bdevs"][0];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    (n(&s["num_read_ops"]), n(&s["num_write_ops"]), n(&s["io_error"]["EIO"]))
}

#[test]
fn injected_failures_are_exactly_the_runs_errors_and_clear_afterwards() {
    let (mut daemon, sock) = error_disk();
    let d = &daemon;
    // The base's counts so far: the examine reads of page 0 when the bdevs were created.
    let base_before = iostat(d, "m");
    let mut want_stat = (0, 0, 0);
    for (pattern, io_type) in [(Pattern::RandRead, "read"), (Pattern::RandWrite, "write")] {
        inject(d, io_type, "failure", 25);
        let s = sock.clone();
        let r = bounded(Duration::from_secs(60), "failing run", move || run_n(&s, pattern, 400));
        assert_eq!((r.errors, r.first_error, r.ios), (25, Some(-libc::EIO), 375), "{pattern}: {r:?}");
        assert_eq!(r.histogram.count(), r.ios, "{pattern}: failures in the latency histogram");
        assert_eq!(r.bytes, r.ios * 4096, "{pattern}: failed requests counted as bytes");
        if io_type == "read" {
            assert_eq!((r.reads, r.writes), (375, 0), "{r:?}");
            want_stat.0 += 375;
        } else {
            assert_eq!((r.reads, r.writes), (0, 375), "{r:?}");
            want_stat.1 += 375;
        }
        want_stat.2 += 25;
        assert_eq!(injections(d), json!({}), "{pattern}: the injection was not used up");
        // What fp-load --json prints for the run (the binary adds the spec's fields).
        let v = r.to_json();
        assert_eq!(
            (v["errors"].as_u64(), v["first_error"].as_i64(), v["ios"].as_u64()),
            (Some(25), Some(-5), Some(375)),
            "{v}"
        );
        assert_eq!(iostat(d, EE), want_stat, "{pattern}: bdev_get_iostat of {EE}");
        let s = sock.clone();
        bounded(Duration::from_secs(60), "clean run", move || {
            assert_clean("after the num", &s, pattern, 200)
        });
        match pattern {
            Pattern::RandRead => want_stat.0 += 200,
            _ => want_stat.1 += 200,
        }
    }
    // The failures never reached the base, which saw only the requests that succeeded.
    let base = iostat(d, "m");
    let base_delta = (base.0 - base_before.0, base.1 - base_before.1, base.2 - base_before.2);
    assert_eq!(base_delta, (want_stat.0, want_stat.1, 0), "bdev_get_iostat of the base");

    // Both kinds at once in a mix, then everything failing until cleared.
    inject(d, "read", "failure", 10);
    inject(d, "write", "failure", 10);
    let s = sock.clone();
    let r = bounded(Duration::from_secs(60), "mixed run", move || run_n(&s, Pattern::RandRw, 300));
    assert_eq!((r.errors, r.ios, r.first_error), (20, 280, Some(-libc::EIO)), "{r:?}");
    inject(d, "all", "failure", 1_000_000);
    let s = sock.clone();
    let r = bounded(Duration::from_secs(60), "all failing", move || run_n(&s, Pattern::RandRw, 100));
    assert_eq!((r.errors, r.ios, r.histogram.count()), (100, 0, 0), "{r:?}");
    assert_eq!(
        injections(d)["write"]["num"].as_u64().unwrap() + injections(d)["read"]["num"].as_u64().unwrap(),
        2_000_000 - 100
    );
    inject(d, "clear", "failure", 0);
    assert_eq!(injections(d), json!({}));
    let s = sock.clone();
    bounded(Duration::from_secs(60), "after clear", move || {
        assert_clean("after clear", &s, Pattern::RandRw, 300)
    });
    daemon.assert_alive();
}

#[test]
fn held_requests_complete_after_resume_pending() {
    let (mut daemon, sock) = error_disk();
    inject(&daemon, "read", "pending", 3);
    let hold = Duration::from_millis(400);
    let run = std::thread::spawn(move || run_n(&sock, Pattern::RandRead, 200));
    // The first three reads are held, the other slots go on until only those three are left.
    let deadline = Instant::now() + Duration::from_secs(20);
    while injections(&daemon).get("read").is_some() {
        assert!(Instant::now() < deadline, "the reads were not held: {}", injections(&daemon));
        std::thread::sleep(Duration::from_millis(10));
    }
    // Counted from when all three are known to be held, so each waits at least `hold`
    // however late the run started.
    std::thread::sleep(hold);
    assert!(!run.is_finished(), "the run ended with requests held");
    let s = &daemon.call("bdev_get_iostat", json!({"name": EE}))["bdevs"][0];
    assert_eq!(s["queue_depth"], 3, "held requests in flight: {s}");
    assert_eq!(daemon.call("bdev_error_resume_pending", json!({"name": EE})), true);
    let r = bounded(Duration::from_secs(60), "resumed run", move || run.join().unwrap());
    assert_eq!((r.ios, r.errors), (200, 0), "{r:?}");
    assert!(r.lat_max_ns >= hold.as_nanos() as u64, "no request waited for the resume: {r:?}");
    daemon.assert_alive();
}

#[test]
fn nomem_only_delays_requests() {
    let (mut daemon, sock) = error_disk();
    inject(&daemon, "write", "nomem", 150);
    inject(&daemon, "read", "nomem", 150);
    let s = sock.clone();
    bounded(Duration::from_secs(60), "nomem run", move || assert_clean("nomem", &s, Pattern::RandRw, 400));
    // Every refusal was taken (and retried): none is left.
    assert_eq!(injections(&daemon), json!({}));
    let (reads, writes, eio) = iostat(&daemon, EE);
    assert_eq!((reads + writes, eio), (400, 0));
    daemon.assert_alive();
}

/// The same through a logical volume: a thick volume of an lvstore on `EE_m` (its data writes
/// go straight to the base, with no metadata change), exported and loaded by fp-load. The
/// failures injected on the base are the run's errors, the store still takes changes after
/// them, and the next run is clean.
#[test]
fn failures_under_an_lvol_reach_fp_load_as_errors() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    daemon.call("bdev_error_create", json!({"base_name": "m"}));
    daemon
        .call("bdev_lvol_create_lvstore", json!({"bdev_name": EE, "lvs_name": "lvs", "cluster_sz": 1 << 20}));
    daemon.call("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "v", "size_in_mib": 8}));
    let sock = daemon.controller("vhost.v", "lvs/v", Some(1), false);
    for (pattern, io_type) in [(Pattern::RandWrite, "write"), (Pattern::RandRead, "read")] {
        inject(&daemon, io_type, "failure", 10);
        let s = sock.clone();
        let r = bounded(Duration::from_secs(60), "lvol run", move || run_n(&s, pattern, 200));
        assert_eq!((r.errors, r.first_error, r.ios), (10, Some(-libc::EIO), 190), "{pattern}: {r:?}");
        assert_eq!(injections(&daemon), json!({}), "{pattern}");
        let s = sock.clone();
        let r = bounded(Duration::from_secs(60), "clean lvol run", move || run_n(&s, pattern, 200));
        assert_eq!((r.errors, r.ios), (0, 200), "{pattern}: {r:?}");
    }
    daemon.call("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "w", "size_in_mib": 1}));
    daemon.assert_alive();
}
