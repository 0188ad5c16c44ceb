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

/// The controller's counter `name` from vhost_get_controllers.
fn counter(daemon: &Daemon, ctrlr: &str, name: &str) -> u64 {
    let v = daemon.call("vhost_get_controllers", serde_json::json!({ "name": ctrlr }));
    v[0]["stats"][name].as_u64().unwrap_or_else(|| panic!("{name} in vhost_get_controllers: {v}"))
}

#[test]
fn dirty_logging_as_qemu_drives_it_marks_exactly_the_pages_reads_write() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "m", Some(1), false);
    for (pattern, bs, qd) in
        [(Pattern::RandRead, 4096, 8), (Pattern::RandRead, 8192, 4), (Pattern::RandWrite, 4096, 8)]
    {
        let before = counter(&daemon, "vhost.0", "logged_data_pages");
        let all_before = counter(&daemon, "vhost.0", "logged_pages");
        let sock = sock.clone();
        let r = bounded(Duration::from_secs(60), "dirty log run", move || {
            let mut s = spec(&sock, pattern, qd, 1, true);
            s.block_size = bs;
            s.dirty_log = true;
            s.duration = Duration::from_millis(400);
            fp_loadgen::run(&s).expect("a run with the dirty log on")
        });
        let what = format!("{pattern} bs={bs} qd{qd}");
        assert_eq!(r.errors, 0, "{what}: {r:?}");
        let log = r.dirty_log.as_ref().unwrap_or_else(|| panic!("{what}: no log report"));
        assert!(log.syncs >= 2, "{what}: the sync thread scanned {} times", log.syncs);
        // Reads write every slot's buffer pages and nothing else of the data; writes none.
        let expected = if pattern == Pattern::RandRead { qd as u64 * (bs as u64 / 4096) } else { 0 };
        assert_eq!(log.data_pages_expected, expected, "{what}");
        assert_eq!(log.data_pages, expected, "{what}: data pages in the log");
        assert_eq!(log.header_pages, 1, "{what}: the status bytes' page");
        assert_eq!(log.ring_pages, 1, "{what}: the used ring's page");
        assert_eq!(log.other_pages, 0, "{what}: pages outside fp-load's memory");
        // The back end's own count: one data page per 4 KiB a read returned, counting the
        // requests still in flight when fp-load stopped counting (at most the depth).
        let data = counter(&daemon, "vhost.0", "logged_data_pages") - before;
        let per_req = bs as u64 / 4096;
        if pattern == Pattern::RandRead {
            assert!(
                data >= r.ios * per_req && data <= (r.ios + qd as u64) * per_req,
                "{what}: {data} data pages logged for {} reads",
                r.ios
            );
        } else {
            assert_eq!(data, 0, "{what}: a write's data is only read by the device");
        }
        // Every request also marks its status byte and the used ring.
        assert!(counter(&daemon, "vhost.0", "logged_pages") - all_before >= r.ios * 2, "{what}");
    }
    daemon.assert_alive();
}

/// With completion fds the client counts its wake-ups and the notifications it read: at QD1
/// every wake-up has a completion behind it (at most one spare, were the daemon to signal the
/// start probe), each wake-up read at least one notification, and nothing is counted polled.
/// Its kicks are counted in both modes.
#[test]
fn the_frontend_counts_its_wakeups_and_the_notifications_behind_them() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "m", Some(1), false);
    bounded(Duration::from_secs(60), "frontend wake-ups", move || {
        let r = fp_loadgen::run(&spec(&sock, Pattern::RandRead, 1, 1, false)).expect("fd run");
        let w = r.wakeups.expect("an fd run counts its wake-ups");
        assert!(r.ios > 0 && w.wakeups > 0, "{r:?}");
        assert!(w.wakeups <= r.ios + 1, "{} wake-ups for {} completions", w.wakeups, r.ios);
        assert!(w.notifications >= w.wakeups, "{w:?}");
        // At most one kick per request, plus the start probe's and the drain's.
        let kicks = r.kicks.expect("the frontend counts its kicks");
        assert!(kicks <= r.ios + 2, "{kicks} kicks for {} completions", r.ios);
        let r = fp_loadgen::run(&spec(&sock, Pattern::RandRead, 1, 1, true)).expect("polled run");
        assert!(r.ios > 0 && r.wakeups.is_none() && r.kicks.is_some(), "{r:?}");
    });
    daemon.assert_alive();
}
