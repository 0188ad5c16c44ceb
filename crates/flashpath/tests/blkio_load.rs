//! The load generator (`fp-loadgen`) against the real daemon: its counts add up, its latency
//! percentiles are ordered, both completion modes work over several queues, it keeps to its
//! region, failed requests are counted as errors rather than as I/O, and a verified run finds
//! no mismatch on a RAM disk and many on a null disk (whose reads return no data).

mod common;

use std::time::Duration;

use common::{assert_same, bounded, pattern, BlkClient, Daemon};
use fp_loadgen::{LoadResult, LoadSpec, Pattern, Region};

const DISK: u64 = 16 << 20;

fn spec(sock: &std::path::Path, pattern: Pattern, qd: usize, queues: usize, poll: bool) -> LoadSpec {
    let mut s = LoadSpec::new(sock);
    s.pattern = pattern;
    s.queue_depth = qd;
    s.num_queues = queues;
    s.poll_queues = poll;
    s.duration = Duration::from_millis(700);
    s
}

/// Checks what must hold for any successful run: the shared checks, then the run's length.
fn check_consistent(what: &str, s: &LoadSpec, r: &LoadResult) {
    common::load::check_result(what, s, r, DISK);
    let secs = r.elapsed.as_secs_f64();
    assert!(
        secs >= s.duration.as_secs_f64() * 0.99 && secs < s.duration.as_secs_f64() + 5.0,
        "{what}: elapsed {secs}"
    );
    assert!((r.iops - r.ios as f64 / secs).abs() < 1e-6 * r.iops.max(1.0), "{what}: iops");
    assert!(r.lat_mean_ns >= r.lat_min_ns as f64 && r.lat_mean_ns <= r.lat_max_ns as f64, "{what}: mean");
}

#[test]
fn every_pattern_in_both_completion_modes() {
    let mut daemon = Daemon::start("0,1");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "m", Some(2), false);
    bounded(Duration::from_secs(120), "load runs", move || {
        for poll in [false, true] {
            for (pattern, qd, queues) in [
                (Pattern::RandRead, 1, 1),
                (Pattern::RandWrite, 8, 2),
                (Pattern::Read, 4, 1),
                (Pattern::Write, 16, 2),
                (Pattern::RandRw, 32, 2),
            ] {
                let s = spec(&sock, pattern, qd, queues, poll);
                let what = format!("{pattern} qd{qd} x{queues} poll={poll}");
                let r = fp_loadgen::run(&s).unwrap_or_else(|e| panic!("{what}: {e}"));
                check_consistent(&what, &s, &r);
            }
        }
    });
    daemon.assert_alive();
}

#[test]
fn writes_stay_inside_the_region() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "m", Some(1), false);
    bounded(Duration::from_secs(60), "region", move || {
        // Mark the whole disk, let random and sequential writes loose on 1 MiB in the middle,
        // then check everything outside it is untouched and something inside changed.
        let marked = pattern(9, 0, DISK as usize);
        {
            let mut c = BlkClient::open(&sock, 1);
            c.write_all(0, &marked);
        }
        let region = Region { offset: 4 << 20, len: 1 << 20 };
        for p in [Pattern::RandWrite, Pattern::Write] {
            let mut s = spec(&sock, p, 8, 1, false);
            s.region = Some(region);
            let r = fp_loadgen::run(&s).unwrap_or_else(|e| panic!("{p}: {e}"));
            check_consistent(&format!("{p} in region"), &s, &r);
        }
        let mut c = BlkClient::open(&sock, 1);
        let all = c.read_all(0, DISK as usize);
        let (a, b) = (region.offset as usize, (region.offset + region.len) as usize);
        assert_same("before the region", 0, &all[..a], &marked[..a]);
        assert_same("after the region", b as u64, &all[b..], &marked[b..]);
        assert_ne!(&all[a..b], &marked[a..b], "nothing was written inside the region");
    });
    daemon.assert_alive();
}

#[test]
fn failed_requests_are_errors_not_io() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("ro", "m", Some(1), true);
    bounded(Duration::from_secs(60), "read-only load", move || {
        // A writer cannot even start on a read-only device.
        let s = spec(&sock, Pattern::RandWrite, 4, 1, false);
        match fp_loadgen::run(&s) {
            Err(fp_loadgen::LoadError::Blkio { op: "start", errno, .. }) => assert_eq!(errno, libc::EROFS),
            other => panic!("a load run on a read-only device gave {other:?}"),
        }
        // Reads work (the read patterns open the device read-only).
        let s = spec(&sock, Pattern::RandRead, 4, 1, false);
        let r = fp_loadgen::run(&s).expect("reads on a read-only device");
        check_consistent("randread on read-only", &s, &r);
        // A mix opened read-only: every write fails (libblkio: EBADF) and is an error, not I/O.
        let mut s = spec(&sock, Pattern::RandRw, 8, 1, false);
        s.read_only = true;
        let r = fp_loadgen::run(&s).expect("randrw on a read-only device");
        assert!(r.errors > 0, "no write failed: {r:?}");
        assert_eq!(r.first_error, Some(-libc::EBADF), "{r:?}");
        assert_eq!(r.writes, 0, "a write was counted as I/O: {r:?}");
        assert!(r.reads > 0 && r.ios == r.reads, "{r:?}");
        assert_eq!(r.histogram.count(), r.ios, "failed requests went into the latency histogram");
        // About half the requests are writes (read_percent 50).
        let share = r.errors as f64 / (r.errors + r.ios) as f64;
        assert!((0.4..0.6).contains(&share), "error share {share}: {r:?}");
    });
    daemon.assert_alive();
}

#[test]
fn a_strided_run_of_n_requests_writes_exactly_those_blocks() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "m", Some(1), false);
    bounded(Duration::from_secs(60), "strided run", move || {
        const STRIDE: u64 = 1 << 20;
        const N: u64 = 10; // fewer than the 16 positions: no wrap
        let mut s = spec(&sock, Pattern::Write, 1, 1, true);
        s.stride = Some(STRIDE);
        s.max_ios = Some(N);
        s.duration = Duration::from_secs(30);
        let r = fp_loadgen::run(&s).expect("strided run");
        assert_eq!((r.ios, r.writes, r.errors), (N, N, 0), "{r:?}");
        assert!(r.elapsed < Duration::from_secs(10), "the run did not end at N requests: {r:?}");
        let mut c = BlkClient::open(&sock, 1);
        let all = c.read_all(0, DISK as usize);
        for (i, block) in all.chunks(4096).enumerate() {
            let at = i as u64 * 4096;
            let written = at % STRIDE == 0 && at / STRIDE < N;
            assert_eq!(block.iter().any(|&b| b != 0), written, "block at {at}");
        }
    });
    daemon.assert_alive();
}

/// A verified `randrw` run: 4,096 requests of 4 KiB in 1 MiB (256 blocks) at `qd` x 2 queues.
/// A count, not a duration: how many reads find a block written before must not depend on how
/// fast the machine is.
fn verified(sock: &std::path::Path, qd: usize, poll: bool) -> LoadSpec {
    let mut s = spec(sock, Pattern::RandRw, qd, 2, poll);
    s.verify = true;
    s.block_size = 4096;
    s.region = Some(Region { offset: 1 << 20, len: 1 << 20 });
    s.max_ios = Some(4096);
    s.duration = Duration::from_secs(40);
    s
}

#[test]
fn a_verified_run_on_a_ram_disk_finds_no_mismatch() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "m", Some(2), false);
    bounded(Duration::from_secs(60), "verified load", move || {
        for (qd, poll) in [(16, false), (1, true)] {
            let s = verified(&sock, qd, poll);
            let r = fp_loadgen::run(&s).expect("verified randrw");
            let v = r.verify.unwrap_or_else(|| panic!("no verify report: {r:?}"));
            assert_eq!((v.mismatches, v.first_mismatch, r.errors), (0, None, 0), "qd{qd}: {r:?}");
            // Most reads land on a block written earlier: 8 blocks per slot at qd 16.
            assert!(v.verified > r.reads / 2 && v.verified <= r.reads, "qd{qd}: {v:?} of {} reads", r.reads);
        }
        // Too few blocks for every slot to have its own.
        let mut s = verified(&sock, 128, false);
        s.region = Some(Region { offset: 0, len: 64 * 4096 });
        match fp_loadgen::run(&s) {
            Err(fp_loadgen::LoadError::InvalidSpec(m)) => assert!(m.contains("256 request slots"), "{m}"),
            other => panic!("verify with 256 slots on 64 blocks gave {other:?}"),
        }
    });
    daemon.assert_alive();
}

#[test]
fn a_verified_run_on_a_null_disk_reports_mismatches() {
    let mut daemon = Daemon::start("0");
    daemon.call("bdev_null_create", serde_json::json!({"name": "n0", "num_blocks": 8192, "block_size": 512}));
    let sock = daemon.controller("vhost.0", "n0", Some(2), false);
    bounded(Duration::from_secs(60), "verified load on null", move || {
        let s = verified(&sock, 16, false);
        let r = fp_loadgen::run(&s).expect("verified randrw on null");
        let v = r.verify.unwrap_or_else(|| panic!("no verify report: {r:?}"));
        // A null read leaves the buffer as the slot's last request left it: it passes only when
        // that was a write of the very block read (about 1 in 8 here).
        assert!(v.verified > 0 && v.mismatches * 2 > v.verified, "{v:?}");
        assert_eq!(r.errors, v.mismatches, "a mismatch is an error: {r:?}");
        assert_eq!(r.first_error, Some(-libc::EILSEQ), "{r:?}");
        let first = v.first_mismatch.expect("a first mismatch");
        assert!((1 << 20..2 << 20).contains(&first) && first % 512 == 0, "{first}");
    });
    daemon.assert_alive();
}
