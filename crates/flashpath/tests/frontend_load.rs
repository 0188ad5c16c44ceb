//! `fp-load --frontend` (fp-load's own vhost-user frontend with split rings, the path of
//! `--dirty-log`) against the real daemon: every pattern in both completion modes over a RAM
//! disk with no errors, and writes kept to their region (the sectors and directions its rings
//! carry are the ones asked for).

mod common;

use std::time::Duration;

use common::{assert_same, bounded, pattern, BlkClient, Daemon};
use fp_loadgen::{LoadSpec, Pattern, Region};

const DISK: u64 = 16 << 20;

fn spec(sock: &std::path::Path, pattern: Pattern, qd: usize, queues: usize, poll: bool) -> LoadSpec {
    let mut s = LoadSpec::new(sock);
    s.pattern = pattern;
    s.queue_depth = qd;
    s.num_queues = queues;
    s.poll_queues = poll;
    s.frontend = true;
    s.duration = Duration::from_millis(500);
    s
}

#[test]
fn the_frontend_carries_every_pattern_in_both_completion_modes() {
    let mut daemon = Daemon::start("0,1");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "m", Some(2), false);
    bounded(Duration::from_secs(120), "frontend load runs", move || {
        for poll in [false, true] {
            // qd 100 on one queue: 300 descriptors of a 512-entry ring whose positions wrap
            // many times (and the 16-bit indexes once 65,536 requests have gone through).
            for (pattern, qd, queues) in
                [(Pattern::RandRead, 1, 1), (Pattern::Write, 100, 1), (Pattern::RandRw, 32, 2)]
            {
                let s = spec(&sock, pattern, qd, queues, poll);
                let what = format!("frontend {pattern} qd{qd} x{queues} poll={poll}");
                let r = fp_loadgen::run(&s).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(r.errors, 0, "{what}: errors (first {:?})", r.first_error);
                assert!(r.ios > 0, "{what}: no I/O completed");
                assert_eq!(r.reads + r.writes, r.ios, "{what}");
                assert_eq!(r.capacity, DISK, "{what}: capacity");
                assert!(r.dirty_log.is_none(), "{what}: no log without --dirty-log");
                if pattern == Pattern::RandRw {
                    assert!(r.reads > 0 && r.writes > 0, "{what}: did not mix: {r:?}");
                }
            }
        }
    });
    daemon.assert_alive();
}

#[test]
fn frontend_writes_land_inside_the_region_only() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "m", Some(1), false);
    bounded(Duration::from_secs(60), "frontend region", move || {
        let marked = pattern(12, 0, DISK as usize);
        BlkClient::open(&sock, 1).write_all(0, &marked);
        let region = Region { offset: 4 << 20, len: 1 << 20 };
        let mut s = spec(&sock, Pattern::RandRw, 16, 1, true);
        s.region = Some(region);
        let r = fp_loadgen::run(&s).expect("frontend randrw in a region");
        assert_eq!(r.errors, 0, "{r:?}");
        assert!(r.writes > 0, "{r:?}");
        let all = BlkClient::open(&sock, 1).read_all(0, DISK as usize);
        let (a, b) = (region.offset as usize, (region.offset + region.len) as usize);
        assert_same("before the region", 0, &all[..a], &marked[..a]);
        assert_same("after the region", b as u64, &all[b..], &marked[b..]);
        assert_ne!(&all[a..b], &marked[a..b], "nothing was written inside the region");
    });
    daemon.assert_alive();
}

#[test]
fn the_frontend_refuses_packed_rings() {
    let mut s = LoadSpec::new("/nonexistent");
    s.frontend = true;
    s.packed = true;
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("packed"), "{e}");
}
