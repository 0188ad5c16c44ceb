//! The delay bdev (SPDK's `bdev_delay`): a block device stacked on another that holds every
//! request for a configured latency before passing it down.
//!
//! It exists for testing — making requests stay in flight long enough to crash the daemon under
//! them, or to see how a guest behaves on slow storage — and it is the smallest example of the
//! stacking the layer is built for: a `BlockDevice` over a `BlockDevice`, whose channel owns a
//! channel of the device below and completes from its own `poll`.
//!
//! Latency follows SPDK's parameters: every request waits the average latency, except one in a
//! hundred, which waits the p99 latency. Reads use the read latencies; writes, flushes, discards
//! and write-zeroes use the write latencies. Latencies may be changed while the bdev serves
//! (`bdev_delay_update_latency`); a change applies to requests submitted after it.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod rpc;

pub use rpc::DelayModule;

use crate::{
    Bdev, BdevError, BdevInfo, BlockDevice, BlockExtent, IoChannel, IoOp, IoRequest, IoStatus, SubmitError,
};

/// Latencies of a delay bdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayLatency {
    /// Average read latency.
    pub avg_read: Duration,
    /// 99th-percentile read latency.
    pub p99_read: Duration,
    /// Average write latency.
    pub avg_write: Duration,
    /// 99th-percentile write latency.
    pub p99_write: Duration,
}

/// One of the four latencies, as `bdev_delay_update_latency`'s `latency_type` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyKind {
    /// Average read latency.
    AvgRead,
    /// 99th-percentile read latency.
    P99Read,
    /// Average write latency.
    AvgWrite,
    /// 99th-percentile write latency.
    P99Write,
}

impl LatencyKind {
    /// SPDK's names, in declaration order (avg_read, p99_read, avg_write, p99_write).
    pub const NAMES: [&'static str; 4] = ["avg_read", "p99_read", "avg_write", "p99_write"];

    /// The kind SPDK calls `name`.
    pub fn from_name(name: &str) -> Option<LatencyKind> {
        const ALL: [LatencyKind; 4] =
            [LatencyKind::AvgRead, LatencyKind::P99Read, LatencyKind::AvgWrite, LatencyKind::P99Write];
        Self::NAMES.iter().position(|n| *n == name).map(|i| ALL[i])
    }

    /// SPDK's name for the kind.
    pub fn name(self) -> &'static str {
        Self::NAMES[self.index()]
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The latencies every channel of one device reads at submission, in microseconds; written by
/// the control plane. One relaxed load per request: a change needs no ordering with anything.
struct SharedLatency([AtomicU64; 4]);

impl SharedLatency {
    fn new(l: &DelayLatency) -> SharedLatency {
        let us = |d: Duration| AtomicU64::new(d.as_micros() as u64);
        SharedLatency([us(l.avg_read), us(l.p99_read), us(l.avg_write), us(l.p99_write)])
    }

    fn get(&self, kind: LatencyKind) -> Duration {
        Duration::from_micros(self.0[kind.index()].load(Ordering::Relaxed))
    }

    fn snapshot(&self) -> DelayLatency {
        DelayLatency {
            avg_read: self.get(LatencyKind::AvgRead),
            p99_read: self.get(LatencyKind::P99Read),
            avg_write: self.get(LatencyKind::AvgWrite),
            p99_write: self.get(LatencyKind::P99Write),
        }
    }
}

/// The longest latency accepted (SPDK takes microseconds in a u64; ten seconds is already far
/// past any guest's patience).
pub const MAX_DELAY: Duration = Duration::from_secs(10);

/// A bdev that holds each request back for a configured latency before passing it to its base bdev (SPDK's delay bdev).
pub struct DelayDevice {
    info: BdevInfo,
    base: Bdev,
    latency: Arc<SharedLatency>,
    /// Serialises [`DelayDevice::set_latency`] calls, whose check spans two latencies (a p99
    /// and its average). Control plane only: channels read the latencies without it.
    updating: Mutex<()>,
}

/// Checks a set of latencies; `field` names what the caller calls the one at fault.
fn validate(latency: &DelayLatency, field: impl Fn(LatencyKind) -> &'static str) -> Result<(), BdevError> {
    let all = [
        (LatencyKind::AvgRead, latency.avg_read),
        (LatencyKind::P99Read, latency.p99_read),
        (LatencyKind::AvgWrite, latency.avg_write),
        (LatencyKind::P99Write, latency.p99_write),
    ];
    for (kind, v) in all {
        if v > MAX_DELAY {
            return Err(BdevError::InvalidParam {
                field: field(kind),
                reason: format!("{v:?} is longer than {MAX_DELAY:?}"),
            });
        }
    }
    if latency.p99_read < latency.avg_read {
        let reason = "the p99 read latency must not be below the average".into();
        return Err(BdevError::InvalidParam { field: field(LatencyKind::P99Read), reason });
    }
    if latency.p99_write < latency.avg_write {
        let reason = "the p99 write latency must not be below the average".into();
        return Err(BdevError::InvalidParam { field: field(LatencyKind::P99Write), reason });
    }
    Ok(())
}

/// `bdev_delay_create`'s latency parameters, in [`LatencyKind`] order.
pub(crate) const LATENCY_FIELDS: [&str; 4] =
    ["avg_read_latency", "p99_read_latency", "avg_write_latency", "p99_write_latency"];

impl DelayDevice {
    /// A delay bdev `name` over `base`, adding `latency` to every request.
    pub fn new(name: &str, base: Bdev, latency: DelayLatency) -> Result<Self, BdevError> {
        crate::validate_geometry(name, base.info().block_size, base.info().num_blocks())?;
        validate(&latency, |k| LATENCY_FIELDS[k.index()])?;
        let b = base.info();
        let info = BdevInfo {
            name: name.to_string(),
            product_name: "delay".into(),
            block_size: b.block_size,
            // The base's own: a resized base resizes the delay bdev with it.
            capacity: b.capacity.clone(),
            io_types: b.io_types,
            driver: "delay",
            driver_specific: Some(("base_bdev_name".into(), b.name.clone())),
        };
        Ok(DelayDevice {
            info,
            base,
            latency: Arc::new(SharedLatency::new(&latency)),
            updating: Mutex::new(()),
        })
    }

    /// The latencies now.
    pub fn latency(&self) -> DelayLatency {
        self.latency.snapshot()
    }

    /// Changes one latency for requests submitted from now on (`bdev_delay_update_latency`).
    /// Refused, naming `latency_us`, when it would exceed [`MAX_DELAY`] or put a p99 latency
    /// below its average.
    pub fn set_latency(&self, kind: LatencyKind, value: Duration) -> Result<(), BdevError> {
        let _serialised = self.updating.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = self.latency.snapshot();
        match kind {
            LatencyKind::AvgRead => next.avg_read = value,
            LatencyKind::P99Read => next.p99_read = value,
            LatencyKind::AvgWrite => next.avg_write = value,
            LatencyKind::P99Write => next.p99_write = value,
        }
        validate(&next, |_| "latency_us")?;
        self.latency.0[kind.index()].store(value.as_micros() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The device below.
    pub fn base(&self) -> &Bdev {
        &self.base
    }
}

impl BlockDevice for DelayDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(DelayChannel {
            base: self.base.open_channel()?,
            info: self.info.clone(),
            latency: self.latency.clone(),
            waiting: VecDeque::with_capacity(256),
            count: 0,
        }))
    }

    /// The base's, undelayed: only I/O is held.
    fn block_status(&self, offset: u64, len: u64, out: &mut Vec<BlockExtent>) -> Result<(), BdevError> {
        self.base.block_status(offset, len, out)
    }
}

struct DelayChannel {
    base: Box<dyn IoChannel>,
    /// For range checks at submit, as every device makes them, rather than a late error once
    /// the request is passed down.
    info: BdevInfo,
    latency: Arc<SharedLatency>,
    /// Requests not yet passed down, with the time they may go. Mostly in deadline order; `poll`
    /// scans it all, so the rare p99 request does not hold back the ones behind it.
    waiting: VecDeque<(Instant, IoRequest)>,
    count: u64,
}

impl IoChannel for DelayChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        self.count += 1;
        let slow = self.count.is_multiple_of(100);
        let delay = self.latency.get(match (req.op, slow) {
            (IoOp::Read, false) => LatencyKind::AvgRead,
            (IoOp::Read, true) => LatencyKind::P99Read,
            (_, false) => LatencyKind::AvgWrite,
            (_, true) => LatencyKind::P99Write,
        });
        self.waiting.push_back((Instant::now() + delay, *req));
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        if !self.waiting.is_empty() {
            let now = Instant::now();
            let mut i = 0;
            while i < self.waiting.len() {
                if self.waiting[i].0 > now {
                    i += 1;
                    continue;
                }
                let req = self.waiting[i].1;
                match self.base.submit(&req) {
                    Ok(()) => {
                        self.waiting.remove(i);
                    }
                    Err(SubmitError::Busy) => break,
                    Err(e) => {
                        self.waiting.remove(i);
                        done(
                            req.tag,
                            if e == SubmitError::Unsupported {
                                IoStatus::Unsupported
                            } else {
                                IoStatus::Error(libc::EINVAL)
                            },
                        );
                    }
                }
            }
        }
        self.base.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.waiting.len() + self.base.in_flight()
    }

    fn parked(&self) -> usize {
        self.base.parked()
    }

    fn abort_parked(&mut self) -> usize {
        self.base.abort_parked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iov::BounceBuf;
    use crate::RamDevice;
    use std::sync::Arc;

    fn lat(read_ms: u64, write_ms: u64) -> DelayLatency {
        let (r, w) = (Duration::from_millis(read_ms), Duration::from_millis(write_ms));
        DelayLatency { avg_read: r, p99_read: r, avg_write: w, p99_write: w }
    }

    #[test]
    fn requests_wait_their_latency_then_reach_the_device_below() {
        let base: Bdev = Arc::new(RamDevice::new("ram", 512, 64).unwrap());
        let dev = DelayDevice::new("slow", base.clone(), lat(1, 30)).unwrap();
        assert_eq!(dev.info().num_blocks(), 64);
        assert_eq!(dev.info().driver, "delay");
        let mut ch = dev.open_channel().unwrap();
        let mut buf = BounceBuf::zeroed(512);
        buf.bytes_mut().fill(7);
        let req = IoRequest { tag: 9, op: IoOp::Write, offset: 512, len: 512, iov: buf.iovecs(512) };
        let start = Instant::now();
        ch.submit(&req).unwrap();
        let mut got = Vec::new();
        while got.is_empty() {
            assert!(start.elapsed() < Duration::from_secs(5));
            assert_eq!(ch.in_flight(), 1);
            ch.poll(&mut |t, s| got.push((t, s)));
        }
        assert!(start.elapsed() >= Duration::from_millis(30), "completed after {:?}", start.elapsed());
        assert_eq!(got, vec![(9, IoStatus::Success)]);
        assert_eq!(ch.in_flight(), 0);
        // The write reached the RAM disk below.
        let mut below = base.open_channel().unwrap();
        let mut back = BounceBuf::zeroed(512);
        let read = IoRequest { tag: 1, op: IoOp::Read, offset: 512, len: 512, iov: back.iovecs(512) };
        below.submit(&read).unwrap();
        below.poll(&mut |_, s| assert_eq!(s, IoStatus::Success));
        assert_eq!(back.bytes(), vec![7u8; 512]);
    }

    #[test]
    fn bad_latencies_name_the_field() {
        let base: Bdev = Arc::new(RamDevice::new("ram", 512, 64).unwrap());
        let mut l = lat(1, 1);
        l.p99_write = Duration::from_micros(10);
        let e = DelayDevice::new("d", base.clone(), l).err().unwrap();
        assert!(e.to_string().contains("p99"), "{e}");
        let e = DelayDevice::new("d", base, lat(20_000, 1)).err().unwrap();
        assert!(e.to_string().contains("avg_read_latency"), "{e}");
    }

    #[test]
    fn an_updated_latency_holds_requests_submitted_after_it() {
        let base: Bdev = Arc::new(RamDevice::new("ram", 512, 64).unwrap());
        let dev = DelayDevice::new("slow", base, lat(0, 0)).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let mut buf = BounceBuf::zeroed(512);
        buf.bytes_mut().fill(1);
        let iov = buf.iovecs(512);
        let write = |tag| IoRequest { tag, op: IoOp::Write, offset: 0, len: 512, iov };
        ch.submit(&write(1)).unwrap();
        // Raising the average above the p99 is refused, naming the field; nothing changes.
        let e = dev.set_latency(LatencyKind::AvgWrite, Duration::from_millis(40)).unwrap_err();
        assert!(e.to_string().contains("latency_us") && e.to_string().contains("p99"), "{e}");
        assert_eq!(dev.latency(), lat(0, 0));
        dev.set_latency(LatencyKind::P99Write, Duration::from_millis(40)).unwrap();
        dev.set_latency(LatencyKind::AvgWrite, Duration::from_millis(40)).unwrap();
        assert_eq!(dev.latency().avg_write, Duration::from_millis(40));
        let start = Instant::now();
        ch.submit(&write(2)).unwrap();
        let mut done = Vec::new();
        // The first request, submitted before the change, goes at once; the second waits.
        ch.poll(&mut |t, _| done.push((t, start.elapsed())));
        while done.len() < 2 {
            assert!(start.elapsed() < Duration::from_secs(5));
            ch.poll(&mut |t, _| done.push((t, start.elapsed())));
        }
        assert_eq!(done[0].0, 1);
        assert!(done[0].1 < Duration::from_millis(40), "{done:?}");
        assert_eq!(done[1].0, 2);
        assert!(done[1].1 >= Duration::from_millis(40), "{done:?}");
        let e = dev.set_latency(LatencyKind::P99Read, MAX_DELAY + Duration::from_micros(1)).unwrap_err();
        assert!(e.to_string().contains("latency_us"), "{e}");
        assert_eq!(LatencyKind::from_name("p99_write"), Some(LatencyKind::P99Write));
        assert_eq!(LatencyKind::from_name("p99"), None);
    }
}
