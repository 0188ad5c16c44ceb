//! The layer's accounting against a scripted device: counts, extremes, resets, closed
//! channels, Busy, histograms, events.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::channel_state::DENSE_TAGS;
use super::*;
use crate::{IoOp, IoRequest, IoStatus, Iovecs, NullDevice, SubmitError};

/// How the scripted device treats requests.
#[derive(Default)]
struct Script {
    /// Refuse submissions as Busy.
    busy: bool,
    /// Complete with this status instead of success.
    fail: Option<IoStatus>,
    /// Hold completions until cleared.
    hold: bool,
    /// Report that completions signal the completion fd (a remote backend's, RBD's).
    remote: bool,
}

struct ScriptDevice {
    info: BdevInfo,
    script: Arc<Mutex<Script>>,
}

struct ScriptChannel {
    script: Arc<Mutex<Script>>,
    pending: Vec<u32>,
}

impl BlockDevice for ScriptDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(ScriptChannel { script: self.script.clone(), pending: Vec::new() }))
    }
}

impl IoChannel for ScriptChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if self.script.lock().unwrap().busy {
            return Err(SubmitError::Busy);
        }
        self.pending.push(req.tag);
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let s = self.script.lock().unwrap();
        if s.hold {
            return 0;
        }
        let n = self.pending.len();
        for tag in self.pending.drain(..) {
            done(tag, s.fail.unwrap_or(IoStatus::Success));
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn sleeps_in_flight(&self) -> bool {
        self.script.lock().unwrap().remote
    }
}

fn scripted() -> (Disk, Arc<Mutex<Script>>) {
    let script = Arc::new(Mutex::new(Script::default()));
    let info = NullDevice::new("s0", 512, 1 << 20).unwrap().info().clone();
    let dev = ScriptDevice { info, script: script.clone() };
    (Disk::new(Arc::new(dev), true), script)
}

fn req(tag: u32, op: IoOp, len: u64) -> IoRequest {
    IoRequest { tag, op, offset: 0, len, iov: Iovecs::NONE }
}

fn submit(ch: &mut Box<dyn IoChannel>, r: IoRequest) -> Result<(), SubmitError> {
    ch.submit(&r)
}

/// Polls once, returning the caller tags completed.
fn reap(ch: &mut Box<dyn IoChannel>) -> Vec<(u32, IoStatus)> {
    let mut got = Vec::new();
    ch.poll(&mut |t, s| got.push((t, s)));
    got
}

#[test]
fn counts_ops_bytes_and_returns_caller_tags() {
    let disk = Disk::new(Arc::new(NullDevice::new("n", 512, 1024).unwrap()), true);
    let mut ch = disk.open().unwrap();
    submit(&mut ch, req(70, IoOp::Read, 4096)).unwrap();
    submit(&mut ch, req(71, IoOp::Read, 512)).unwrap();
    submit(&mut ch, req(72, IoOp::Write, 1024)).unwrap();
    submit(&mut ch, req(73, IoOp::Discard, 2048)).unwrap();
    submit(&mut ch, req(74, IoOp::Flush, 0)).unwrap();
    submit(&mut ch, req(75, IoOp::WriteZeroes, 512)).unwrap();
    let mut tags: Vec<u32> = reap(&mut ch).iter().map(|c| c.0).collect();
    tags.sort_unstable();
    assert_eq!(tags, [70, 71, 72, 73, 74, 75]);
    let s = disk.stats();
    assert_eq!((s.op(IoOp::Read).ops, s.op(IoOp::Read).bytes), (2, 4608));
    assert_eq!((s.op(IoOp::Write).ops, s.op(IoOp::Write).bytes), (1, 1024));
    assert_eq!((s.op(IoOp::Discard).ops, s.op(IoOp::Discard).bytes), (1, 2048));
    assert_eq!(s.op(IoOp::Flush).ops, 1);
    assert_eq!((s.op(IoOp::WriteZeroes).ops, s.op(IoOp::WriteZeroes).bytes), (1, 512));
    assert_eq!(s.queue_depth, 0);
    let r = s.op(IoOp::Read);
    assert!(r.min_latency_ticks <= r.max_latency_ticks && r.latency_ticks >= r.max_latency_ticks);
    // Out of range: refused, counted as EINVAL, no slab entry left behind.
    assert_eq!(
        submit(&mut ch, IoRequest { offset: 1 << 30, ..req(9, IoOp::Read, 512) }),
        Err(SubmitError::OutOfRange)
    );
    let s = disk.stats();
    assert_eq!((s.op(IoOp::Read).errors, s.errno[libc::EINVAL as usize]), (1, 1));
}

#[test]
fn latency_sum_min_max_follow_the_requests() {
    let (disk, script) = scripted();
    let mut ch = disk.open().unwrap();
    script.lock().unwrap().hold = true;
    submit(&mut ch, req(1, IoOp::Write, 512)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    submit(&mut ch, req(2, IoOp::Write, 512)).unwrap();
    assert_eq!(reap(&mut ch), []);
    assert_eq!(disk.stats().queue_depth, 2, "both in flight");
    script.lock().unwrap().hold = false;
    assert_eq!(reap(&mut ch).len(), 2);
    let w = *disk.stats().op(IoOp::Write);
    let ms = |t: u64| ticks::ticks_to_ns(t, ticks::tick_rate()) as f64 / 1e6;
    assert!(ms(w.max_latency_ticks) >= 20.0, "the first waited 20 ms: {}", ms(w.max_latency_ticks));
    assert!(ms(w.min_latency_ticks) < 15.0, "the second did not: {}", ms(w.min_latency_ticks));
    assert_eq!(w.latency_ticks, w.max_latency_ticks + w.min_latency_ticks);
    assert_eq!(disk.stats().queue_depth, 0);
}

#[test]
fn errors_are_counted_by_op_and_errno_without_bytes() {
    let (disk, script) = scripted();
    let mut ch = disk.open().unwrap();
    script.lock().unwrap().fail = Some(IoStatus::Error(libc::EIO));
    submit(&mut ch, req(1, IoOp::Read, 4096)).unwrap();
    submit(&mut ch, req(2, IoOp::Write, 4096)).unwrap();
    assert_eq!(reap(&mut ch), [(1, IoStatus::Error(libc::EIO)), (2, IoStatus::Error(libc::EIO))]);
    script.lock().unwrap().fail = Some(IoStatus::Unsupported);
    submit(&mut ch, req(3, IoOp::Flush, 0)).unwrap();
    reap(&mut ch);
    let s = disk.stats();
    assert_eq!((s.op(IoOp::Read).errors, s.op(IoOp::Read).ops, s.op(IoOp::Read).bytes), (1, 0, 0));
    assert_eq!(s.op(IoOp::Write).errors, 1);
    assert_eq!(s.op(IoOp::Flush).errors, 1);
    assert_eq!((s.errno[libc::EIO as usize], s.errno[0]), (2, 1));
    assert_eq!(s.op(IoOp::Read).min_latency_ticks, u64::MAX, "no successful read");
}

#[test]
fn busy_leaves_no_slab_entry_and_the_retry_is_counted_once() {
    let (disk, script) = scripted();
    let mut ch = disk.open().unwrap();
    script.lock().unwrap().busy = true;
    for _ in 0..1000 {
        assert_eq!(submit(&mut ch, req(5, IoOp::Read, 512)), Err(SubmitError::Busy));
    }
    assert_eq!(reap(&mut ch), []);
    script.lock().unwrap().busy = false;
    submit(&mut ch, req(5, IoOp::Read, 512)).unwrap();
    assert_eq!(reap(&mut ch), [(5, IoStatus::Success)]);
    let s = disk.stats();
    assert_eq!((s.op(IoOp::Read).ops, s.op(IoOp::Read).errors), (1, 0));
    assert_eq!(s.errno.iter().sum::<u64>(), 0, "Busy is not an error");
}

#[test]
fn slab_grows_to_the_peak_only() {
    let (disk, script) = scripted();
    let mut ch = disk.open().unwrap();
    script.lock().unwrap().hold = true;
    for t in 0..600 {
        submit(&mut ch, req(t, IoOp::Read, 512)).unwrap();
    }
    script.lock().unwrap().hold = false;
    let mut tags: Vec<u32> = reap(&mut ch).iter().map(|c| c.0).collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..600).collect::<Vec<_>>());
    assert_eq!(disk.stats().op(IoOp::Read).ops, 600);
}

#[test]
fn closed_channels_leave_their_counts() {
    let (disk, _) = scripted();
    let mut a = disk.open().unwrap();
    let mut b = disk.open().unwrap();
    submit(&mut a, req(1, IoOp::Read, 512)).unwrap();
    submit(&mut b, req(1, IoOp::Read, 1024)).unwrap();
    submit(&mut b, req(2, IoOp::Write, 512)).unwrap();
    reap(&mut a);
    reap(&mut b);
    assert_eq!(disk.channel_stats().len(), 2);
    drop(a);
    assert_eq!(disk.channel_stats().len(), 1);
    let s = disk.stats();
    assert_eq!((s.op(IoOp::Read).ops, s.op(IoOp::Read).bytes, s.op(IoOp::Write).ops), (2, 1536, 1));
    drop(b);
    let mut c = disk.open().unwrap();
    submit(&mut c, req(1, IoOp::Read, 512)).unwrap();
    reap(&mut c);
    assert_eq!(disk.stats().op(IoOp::Read).ops, 3, "a restarted queue adds to what was there");
}

#[test]
fn reset_all_and_maxmin() {
    let (disk, _) = scripted();
    let mut live = disk.open().unwrap();
    let mut gone = disk.open().unwrap();
    submit(&mut live, req(1, IoOp::Read, 512)).unwrap();
    submit(&mut gone, req(1, IoOp::Read, 512)).unwrap();
    reap(&mut live);
    reap(&mut gone);
    drop(gone);
    disk.reset(ResetMode::MaxMin);
    let r = *disk.stats().op(IoOp::Read);
    assert_eq!(
        (r.ops, r.min_latency_ticks, r.max_latency_ticks),
        (2, u64::MAX, 0),
        "before the channel polls"
    );
    reap(&mut live); // applies the reset
    let r = *disk.stats().op(IoOp::Read);
    assert_eq!((r.ops, r.min_latency_ticks, r.max_latency_ticks), (2, u64::MAX, 0));
    submit(&mut live, req(1, IoOp::Read, 512)).unwrap();
    reap(&mut live);
    let r = *disk.stats().op(IoOp::Read);
    assert_eq!(r.ops, 3);
    assert!(r.max_latency_ticks <= r.latency_ticks && r.min_latency_ticks == r.max_latency_ticks);

    disk.reset(ResetMode::All);
    assert_eq!(disk.stats(), IoStats::default(), "the live channel has not polled: left out");
    submit(&mut live, req(1, IoOp::Write, 512)).unwrap();
    reap(&mut live);
    let s = disk.stats();
    assert_eq!((s.op(IoOp::Read).ops, s.op(IoOp::Write).ops), (0, 1));
    // A reset the channel never polled for is applied when it closes.
    disk.reset(ResetMode::All);
    drop(live);
    assert_eq!(disk.stats(), IoStats::default());
}

#[test]
fn accounting_off_hands_out_the_devices_channel() {
    let disk = Disk::new(Arc::new(NullDevice::new("n", 512, 1024).unwrap()), false);
    let mut ch = disk.open().unwrap();
    submit(&mut ch, req(1, IoOp::Read, 512)).unwrap();
    assert_eq!(reap(&mut ch), [(1, IoStatus::Success)]);
    assert_eq!(disk.stats(), IoStats::default());
    assert_eq!(disk.enable_histogram(true), Err(HistogramError::AccountingOff));
}

#[test]
fn histogram_buckets_match_spdk() {
    // Range 0: one value per bucket.
    for v in 0..128 {
        assert_eq!(bucket_of(v), v as usize);
        assert_eq!(bucket_end(v as usize), v + 1);
    }
    // Range 1: 128..256, still exact; range 2: 256..512 in steps of 2.
    assert_eq!(bucket_of(128), 128);
    assert_eq!(bucket_of(255), 255);
    assert_eq!(bucket_of(256), 256);
    assert_eq!(bucket_of(257), 256);
    assert_eq!(bucket_of(258), 257);
    assert_eq!(bucket_end(256), 258);
    // Every value lies below its bucket's end and at or above the previous bucket's end.
    for v in [1u64, 300, 4095, 4096, 123_456_789, 1 << 40, u64::MAX / 3, u64::MAX] {
        let b = bucket_of(v);
        assert!(v < bucket_end(b) || bucket_end(b) == u64::MAX, "{v}");
        assert!(b == 0 || v >= bucket_end(b - 1), "{v}");
        assert!(b < histogram::NUM_BUCKETS);
    }
    assert_eq!(histogram::NUM_BUCKETS, 58 * 128, "SPDK's full span at granularity 7");
}

#[test]
fn percentiles_of_known_inputs() {
    let mut h = Histogram::default();
    assert_eq!(h.percentiles(), None);
    for v in 1..=1000u64 {
        h.record(v);
    }
    let p = h.percentiles().unwrap();
    // Values 1..=1000: p50 is 500, p90 900, p99 990, p99.9 999; buckets at this size are 4 wide.
    for (got, want) in [(p.p50, 500), (p.p90, 900), (p.p99, 990), (p.p999, 999)] {
        assert!(got >= want && got <= want + 4, "{got} for {want}");
    }
    let mut one = Histogram::default();
    one.record(42);
    assert_eq!(one.quantile(0.999), Some(43));
}

#[test]
fn base64_round_trip() {
    assert_eq!(base64_encode(b""), "");
    assert_eq!(base64_encode(b"f"), "Zg==");
    assert_eq!(base64_encode(b"fo"), "Zm8=");
    assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    for n in 0..20 {
        let data: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
        assert_eq!(base64_decode(&base64_encode(&data)).unwrap(), data);
    }
    assert_eq!(base64_decode("Zg="), None);
    assert_eq!(base64_decode("Z=g="), None);
    let mut h = Histogram::default();
    h.record(5);
    h.record(1 << 33);
    assert_eq!(Histogram::from_base64(&h.to_base64()), Some(h));
}

#[test]
fn histograms_merge_channels_and_restart_empty() {
    let (disk, script) = scripted();
    let mut a = disk.open().unwrap();
    let mut b = disk.open().unwrap();
    assert_eq!(disk.histogram(), Err(HistogramError::NotEnabled));
    submit(&mut a, req(1, IoOp::Read, 512)).unwrap();
    reap(&mut a);
    disk.enable_histogram(true).unwrap();
    for t in 0..3 {
        submit(&mut a, req(t, IoOp::Read, 512)).unwrap();
        submit(&mut b, req(t, IoOp::Write, 512)).unwrap();
    }
    reap(&mut a);
    reap(&mut b);
    script.lock().unwrap().fail = Some(IoStatus::Error(libc::EIO));
    submit(&mut b, req(9, IoOp::Write, 512)).unwrap();
    reap(&mut b);
    script.lock().unwrap().fail = None;
    assert_eq!(disk.histogram().unwrap().total(), 6, "successes since enabling, both channels");
    drop(a);
    assert_eq!(disk.histogram().unwrap().total(), 6, "a closed channel's buckets stay");
    disk.enable_histogram(false).unwrap();
    assert_eq!(disk.histogram(), Err(HistogramError::NotEnabled));
    disk.enable_histogram(true).unwrap();
    assert_eq!(disk.histogram().unwrap().total(), 0);
    submit(&mut b, req(1, IoOp::Read, 512)).unwrap();
    reap(&mut b);
    assert_eq!(disk.histogram().unwrap().total(), 1);
}

#[test]
fn events_reach_subscribers_until_they_unsubscribe() {
    let (disk, _) = scripted();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let a = disk.subscribe(Box::new(move |e| s.lock().unwrap().push(*e)));
    let c = count.clone();
    let clone = disk.clone();
    // A callback may use the disk itself (no lock is held while it runs).
    let b = disk.subscribe(Box::new(move |_| {
        c.fetch_add(1, Ordering::Relaxed);
        let _ = clone.stats();
    }));
    disk.notify(&DiskEvent::Resized { num_blocks: 4096 });
    assert!(disk.unsubscribe(a));
    assert!(!disk.unsubscribe(a));
    disk.notify(&DiskEvent::Removed);
    assert_eq!(*seen.lock().unwrap(), [DiskEvent::Resized { num_blocks: 4096 }]);
    assert_eq!(count.load(Ordering::Relaxed), 2);
    assert!(disk.unsubscribe(b));
}

#[test]
fn tags_beyond_the_dense_slab_are_counted_and_busy_leaves_none() {
    let (disk, script) = scripted();
    let mut ch = disk.open_typed().unwrap();
    let DiskIo::Counted(inner) = &ch else { panic!("accounting is on: the layer's channel") };
    assert!(inner.sparse.is_empty());
    let big = [DENSE_TAGS, u32::MAX, DENSE_TAGS - 1];
    script.lock().unwrap().busy = true;
    for t in big {
        assert_eq!(ch.submit(&req(t, IoOp::Read, 512)), Err(SubmitError::Busy));
    }
    let DiskIo::Counted(inner) = &ch else { unreachable!() };
    assert!(inner.sparse.is_empty(), "a refused request leaves no entry");
    script.lock().unwrap().busy = false;
    script.lock().unwrap().hold = true;
    for t in big {
        ch.submit(&req(t, IoOp::Write, 1024)).unwrap();
    }
    assert_eq!(ch.poll(&mut |t, _| panic!("{t} is held")), 0);
    assert_eq!(disk.stats().queue_depth, 3, "reported at each poll");
    script.lock().unwrap().hold = false;
    let mut got = Vec::new();
    assert_eq!(ch.poll(&mut |t, s| got.push((t, s))), 3);
    assert_eq!(got, big.map(|t| (t, IoStatus::Success)));
    let s = disk.stats();
    assert_eq!((s.op(IoOp::Write).ops, s.op(IoOp::Write).bytes, s.op(IoOp::Read).ops), (3, 3072, 0));
    assert_eq!(s.queue_depth, 0);
    let DiskIo::Counted(inner) = &ch else { unreachable!() };
    assert!(inner.sparse.is_empty(), "completed entries are gone");
    assert_eq!(inner.slab.len(), DENSE_TAGS as usize, "the dense slab stops at its bound");
}

#[test]
fn a_tag_reused_after_completion_is_timed_afresh() {
    let (disk, script) = scripted();
    let mut ch = disk.open_typed().unwrap();
    script.lock().unwrap().hold = true;
    ch.submit(&req(3, IoOp::Read, 512)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    script.lock().unwrap().hold = false;
    assert_eq!(ch.poll(&mut |_, _| {}), 1);
    ch.submit(&req(3, IoOp::Read, 512)).unwrap();
    assert_eq!(ch.poll(&mut |_, _| {}), 1);
    let r = *disk.stats().op(IoOp::Read);
    let ms = |t: u64| ticks::ticks_to_ns(t, ticks::tick_rate()) as f64 / 1e6;
    assert_eq!(r.ops, 2);
    assert!(ms(r.max_latency_ticks) >= 20.0 && ms(r.min_latency_ticks) < 15.0, "{r:?}");
}

#[test]
fn typed_channel_without_accounting_is_the_devices() {
    let disk = Disk::new(Arc::new(NullDevice::new("n", 512, 1024).unwrap()), false);
    let mut ch = disk.open_typed().unwrap();
    assert!(matches!(ch, DiskIo::Device(_)));
    ch.submit(&req(7, IoOp::Flush, 0)).unwrap();
    let mut got = Vec::new();
    ch.poll(&mut |t, s| got.push((t, s)));
    assert_eq!(got, [(7, IoStatus::Success)]);
    assert_eq!(disk.stats().op(IoOp::Flush).ops, 0, "nothing counted");
    let bdev: Bdev = Arc::new(disk.clone());
    assert!(bdev.as_disk().is_some(), "a Disk behind a Bdev is found by frontends");
}

#[path = "qos_tests.rs"]
mod qos;

#[test]
fn a_channel_sleeps_in_flight_as_its_device_does_but_not_while_qos_holds_requests() {
    let (disk, script) = scripted();
    let mut ch = disk.open().unwrap();
    assert!(!ch.sleeps_in_flight(), "the default: keep polling");
    script.lock().unwrap().remote = true;
    assert!(ch.sleeps_in_flight());
    // A request held by QoS is released only by poll: the caller must keep polling.
    disk.set_qos_limits(QosLimits { rw_ios_per_sec: 1_000, ..QosLimits::default() }).unwrap();
    script.lock().unwrap().hold = true;
    reap(&mut ch); // a channel takes up a limit at its next poll
    for tag in 0..64 {
        submit(&mut ch, req(tag, IoOp::Read, 512)).unwrap();
    }
    assert!(reap(&mut ch).is_empty(), "the device holds what it has");
    assert!(disk.stats().qos.queued > 0, "some requests are held: {:?}", disk.stats().qos);
    assert!(!ch.sleeps_in_flight());
    disk.set_qos_limits(QosLimits::default()).unwrap();
    reap(&mut ch);
    assert_eq!(disk.stats().qos.queued, 0);
    assert!(ch.sleeps_in_flight(), "nothing held: the device's answer again");
}

/// A device whose first `holes` bytes are a hole: what a stacked device must pass on.
struct HoleyDevice {
    info: BdevInfo,
    holes: u64,
}

impl BlockDevice for HoleyDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Err(BdevError::Unsupported("no I/O".into()))
    }

    fn block_status(&self, offset: u64, len: u64, out: &mut Vec<BlockExtent>) -> Result<(), BdevError> {
        self.info.check_status_range(offset, len)?;
        let first = out.len();
        let split = self.holes.clamp(offset, offset + len);
        BlockExtent::hole(split - offset).append_to(out, first);
        BlockExtent::data(offset + len - split).append_to(out, first);
        Ok(())
    }
}

fn status(dev: &dyn BlockDevice, offset: u64, len: u64) -> Result<Vec<BlockExtent>, BdevError> {
    let mut out = Vec::new();
    dev.block_status(offset, len, &mut out).map(|()| out)
}

#[test]
fn block_status_defaults_to_data_and_refuses_bad_ranges() {
    let null = NullDevice::new("n", 512, 1024).unwrap();
    assert_eq!(status(&null, 0, 512 * 1024).unwrap(), [BlockExtent::data(512 * 1024)]);
    assert_eq!(status(&null, 4096, 512).unwrap(), [BlockExtent::data(512)]);
    // Appended after what the caller holds already, never merged into it.
    let mut out = vec![BlockExtent::data(512)];
    null.block_status(512, 1024, &mut out).unwrap();
    assert_eq!(out, [BlockExtent::data(512), BlockExtent::data(1024)]);
    let field = |offset, len| match status(&null, offset, len) {
        Err(BdevError::InvalidParam { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(100, 512), "offset");
    assert_eq!(field(512 * 1024, 512), "offset");
    assert_eq!(field(0, 0), "len");
    assert_eq!(field(0, 1000), "len");
    assert_eq!(field(512, 512 * 1024), "len");
    assert_eq!(field(512, u64::MAX - 511), "len");
}

#[test]
fn disks_and_delay_bdevs_report_the_status_of_the_device_below() {
    let info = NullDevice::new("h", 512, 1024).unwrap().info().clone();
    let dev: Bdev = Arc::new(HoleyDevice { info, holes: 64 * 1024 });
    let disk: Bdev = Arc::new(Disk::new(dev.clone(), true));
    let latency = crate::DelayLatency {
        avg_read: Duration::ZERO,
        p99_read: Duration::ZERO,
        avg_write: Duration::ZERO,
        p99_write: Duration::ZERO,
    };
    let delay = crate::DelayDevice::new("d", disk.clone(), latency).unwrap();
    for top in [&*disk, &delay as &dyn BlockDevice] {
        let expect = [BlockExtent::hole(64 * 1024), BlockExtent::data(64 * 1024)];
        assert_eq!(status(top, 0, 128 * 1024).unwrap(), expect);
        assert_eq!(status(top, 4096, 4096).unwrap(), [BlockExtent::hole(4096)]);
        assert_eq!(status(top, 64 * 1024, 512).unwrap(), [BlockExtent::data(512)]);
        assert!(status(top, 0, 513).is_err());
    }
    // A status query is no I/O: nothing counted.
    let Some(d) = disk.as_disk() else { panic!("a disk") };
    assert_eq!(d.stats().op(IoOp::Read).ops, 0);
}

#[path = "bitmaps_tests.rs"]
mod bitmaps;
