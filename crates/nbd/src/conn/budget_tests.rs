//! A connection's share of its reactor's round: one poll starts at most `STARTS_PER_POLL`
//! requests, however many a client pipelined. Counted in polls and submissions, never in time.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, IoChannel, IoRequest, IoStatus, RamDevice, SubmitError,
};
use fp_reactor::Poller;

use super::{ConnPoller, ConnSetup, MAX_IN_FLIGHT, STARTS_PER_POLL};
use crate::export::ExportShared;
use crate::proto::{Request, CMD_READ};
use crate::stats::ConnStats;

/// A RAM disk that counts what was submitted to it.
struct Counting {
    inner: RamDevice,
    submitted: Arc<AtomicUsize>,
}

struct CountingChannel {
    inner: Box<dyn IoChannel>,
    submitted: Arc<AtomicUsize>,
}

impl BlockDevice for Counting {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(CountingChannel { inner: self.inner.open_channel()?, submitted: self.submitted.clone() }))
    }
}

impl IoChannel for CountingChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.submitted.fetch_add(1, Ordering::Relaxed);
        self.inner.submit(req)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

#[test]
fn a_poll_starts_at_most_its_budget_of_a_full_pipeline() {
    let submitted = Arc::new(AtomicUsize::new(0));
    let bdev: Bdev =
        Arc::new(Counting { inner: RamDevice::new("ram", 512, 8192).unwrap(), submitted: submitted.clone() });
    let (mut client, server) = UnixStream::pair().unwrap();
    server.set_nonblocking(true).unwrap();
    let export = Arc::new(ExportShared::new("ram".into(), bdev, false, Vec::new(), Duration::from_secs(1)));
    let setup = ConnSetup {
        fd: OwnedFd::from(server),
        tls: None,
        export,
        structured: false,
        allocation: false,
        peer: "test".into(),
    };
    let mut conn = ConnPoller::new(setup, Arc::new(ConnStats::new())).unwrap();
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
        let before = submitted.load(Ordering::Relaxed);
        conn.poll();
        let started = submitted.load(Ordering::Relaxed) - before;
        assert_eq!(started, STARTS_PER_POLL, "poll {poll} starts its budget, no more");
    }
    assert_eq!(submitted.load(Ordering::Relaxed), MAX_IN_FLIGHT, "the whole pipeline started");
}
