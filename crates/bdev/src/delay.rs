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
//! and write-zeroes use the write latencies.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::{Bdev, BdevError, BdevInfo, BlockDevice, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

/// Latencies of a delay bdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayLatency {
    pub avg_read: Duration,
    pub p99_read: Duration,
    pub avg_write: Duration,
    pub p99_write: Duration,
}

/// The longest latency accepted (SPDK takes microseconds in a u64; ten seconds is already far
/// past any guest's patience).
pub const MAX_DELAY: Duration = Duration::from_secs(10);

pub struct DelayDevice {
    info: BdevInfo,
    base: Bdev,
    latency: DelayLatency,
}

impl DelayDevice {
    pub fn new(name: &str, base: Bdev, latency: DelayLatency) -> Result<Self, BdevError> {
        crate::validate_geometry(name, base.info().block_size, base.info().num_blocks)?;
        let check = |field: &'static str, v: Duration| {
            if v > MAX_DELAY {
                Err(BdevError::InvalidParam { field, reason: format!("{v:?} is longer than {MAX_DELAY:?}") })
            } else {
                Ok(())
            }
        };
        check("avg_read_latency", latency.avg_read)?;
        check("p99_read_latency", latency.p99_read)?;
        check("avg_write_latency", latency.avg_write)?;
        check("p99_write_latency", latency.p99_write)?;
        if latency.p99_read < latency.avg_read || latency.p99_write < latency.avg_write {
            return Err(BdevError::InvalidParam {
                field: "p99_read_latency",
                reason: "p99 latencies must not be below the averages".into(),
            });
        }
        let b = base.info();
        let info = BdevInfo {
            name: name.to_string(),
            product_name: "delay".into(),
            block_size: b.block_size,
            num_blocks: b.num_blocks,
            io_types: b.io_types,
            driver: "delay",
            driver_specific: Some(("base_bdev_name".into(), b.name.clone())),
        };
        Ok(DelayDevice { info, base, latency })
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
            latency: self.latency,
            waiting: VecDeque::with_capacity(256),
            count: 0,
        }))
    }
}

struct DelayChannel {
    base: Box<dyn IoChannel>,
    latency: DelayLatency,
    /// Requests not yet passed down, with the time they may go. Mostly in deadline order; `poll`
    /// scans it all, so the rare p99 request does not hold back the ones behind it.
    waiting: VecDeque<(Instant, IoRequest)>,
    count: u64,
}

impl IoChannel for DelayChannel {
    unsafe fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.count += 1;
        let slow = self.count.is_multiple_of(100);
        let l = &self.latency;
        let delay = match (req.op, slow) {
            (IoOp::Read, false) => l.avg_read,
            (IoOp::Read, true) => l.p99_read,
            (_, false) => l.avg_write,
            (_, true) => l.p99_write,
        };
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
                // SAFETY: our caller gave the same guarantee for `req` when submitting it to
                // us, and it holds until the completion we forward from the device below.
                match unsafe { self.base.submit(&req) } {
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
                                IoStatus::Error(22)
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
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(dev.info().num_blocks, 64);
        assert_eq!(dev.info().driver, "delay");
        let mut ch = dev.open_channel().unwrap();
        let mut buf = vec![7u8; 512];
        let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 512 };
        let req = IoRequest { tag: 9, op: IoOp::Write, offset: 512, len: 512, iov: &iov, iovcnt: 1 };
        let start = Instant::now();
        // SAFETY: `buf` and `iov` outlive the request, which completes in the loop below.
        unsafe { ch.submit(&req) }.unwrap();
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
        let mut back = vec![0u8; 512];
        let iov = libc::iovec { iov_base: back.as_mut_ptr().cast(), iov_len: 512 };
        let read = IoRequest { tag: 1, op: IoOp::Read, offset: 512, len: 512, iov: &iov, iovcnt: 1 };
        // SAFETY: as above.
        unsafe { below.submit(&read) }.unwrap();
        below.poll(&mut |_, s| assert_eq!(s, IoStatus::Success));
        assert_eq!(back, vec![7u8; 512]);
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
}
