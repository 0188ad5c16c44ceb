//! A connection's share of its reactor's round: one poll starts at most `STARTS_PER_POLL`
//! requests, however many a client pipelined. Counted in polls and answered requests (the RAM
//! disk completes what a poll started at that poll's reap), never in time.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::{Bdev, RamDevice};
use fp_reactor::Poller;

use super::{ConnPoller, ConnSetup, MAX_IN_FLIGHT, STARTS_PER_POLL};
use crate::export::ExportShared;
use crate::proto::{Request, CMD_READ};
use crate::stats::ConnStats;

#[test]
fn a_poll_starts_at_most_its_budget_of_a_full_pipeline() {
    let bdev: Bdev = Arc::new(RamDevice::new("ram", 512, 8192).unwrap());
    let (mut client, server) = UnixStream::pair().unwrap();
    server.set_nonblocking(true).unwrap();
    let export = Arc::new(ExportShared::new(
        "ram".into(),
        bdev,
        false,
        Vec::new(),
        Vec::new(),
        Duration::from_secs(1),
    ));
    let setup = ConnSetup {
        fd: OwnedFd::from(server),
        tls: None,
        export,
        structured: false,
        allocation: false,
        bitmaps: Vec::new(),
        peer: "test".into(),
    };
    let stats = Arc::new(ConnStats::new());
    let mut conn = ConnPoller::new(setup, stats.clone()).unwrap();
    // `read_ops`, the first of `COUNTER_NAMES`.
    let reads = || stats.load().0[0] as usize;
    // A whole table of 512-byte reads, written before the first poll: one socket read takes
    // them all.
    let mut pipeline = Vec::new();
    for cookie in 0..MAX_IN_FLIGHT as u64 {
        pipeline.extend_from_slice(
            &Request { flags: 0, command: CMD_READ, cookie, offset: cookie * 512, length: 512 }.encode(),
        );
    }
    client.write_all(&pipeline).unwrap();
    for poll in 1..=MAX_IN_FLIGHT / STARTS_PER_POLL {
        let before = reads();
        conn.poll();
        assert_eq!(reads() - before, STARTS_PER_POLL, "poll {poll} starts its budget, no more");
    }
    assert_eq!(reads(), MAX_IN_FLIGHT, "the whole pipeline was served");
}
