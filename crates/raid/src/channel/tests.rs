//! The data path of every level over RAM bases: the conformance suite, raid1's copies, a base
//! failing under writes (held until the layout says so) and under reads (retried elsewhere).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fp_bdev::conformance::{self, poll_until, read_range, write_range, IoBuf, Storage};
use fp_bdev::Uuid;
use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, IoChannel, IoOp, IoRequest, IoStatus, RamDevice, SubmitError,
};

use crate::device::{RaidDevice, RaidSpec};
use crate::shared::{Layout, SlotView};
use crate::{RaidLevel, SlotState};
use fp_bdev::Iovecs;

fn ram(name: &str, bytes: u64) -> Bdev {
    Arc::new(RamDevice::new(name, 512, bytes / 512).unwrap())
}

/// A RAM disk whose reads or writes fail (EIO) while a switch is on.
pub(crate) struct Flaky {
    inner: Bdev,
    info: BdevInfo,
    pub fail_writes: Arc<AtomicBool>,
    pub fail_reads: Arc<AtomicBool>,
    /// Submits still to refuse as busy.
    pub busy: Arc<std::sync::atomic::AtomicU32>,
}

impl Flaky {
    pub(crate) fn new(name: &str, bytes: u64) -> Arc<Flaky> {
        Flaky::with_info(name, bytes, |_| {})
    }

    /// The same with its description changed by `f` (fewer operations supported, say).
    pub(crate) fn with_info(name: &str, bytes: u64, f: impl FnOnce(&mut BdevInfo)) -> Arc<Flaky> {
        let inner = ram(name, bytes);
        let mut info = inner.info().clone();
        f(&mut info);
        Arc::new(Flaky {
            inner,
            info,
            fail_writes: Arc::default(),
            fail_reads: Arc::default(),
            busy: Arc::default(),
        })
    }
}

struct FlakyChannel {
    inner: Box<dyn IoChannel>,
    fail_writes: Arc<AtomicBool>,
    fail_reads: Arc<AtomicBool>,
    busy: Arc<std::sync::atomic::AtomicU32>,
    failed: Vec<(u32, IoStatus)>,
}

impl BlockDevice for Flaky {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(FlakyChannel {
            inner: self.inner.open_channel()?,
            fail_writes: self.fail_writes.clone(),
            fail_reads: self.fail_reads.clone(),
            busy: self.busy.clone(),
            failed: Vec::new(),
        }))
    }
}

impl IoChannel for FlakyChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if self.busy.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1)).is_ok() {
            return Err(SubmitError::Busy);
        }
        let fail = if req.op == IoOp::Read { &self.fail_reads } else { &self.fail_writes };
        if fail.load(Ordering::Relaxed) {
            self.failed.push((req.tag, IoStatus::Error(libc::EIO)));
            return Ok(());
        }
        self.inner.submit(req)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let n = self.failed.len();
        for (t, s) in self.failed.drain(..) {
            done(t, s);
        }
        n + self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.failed.len() + self.inner.in_flight()
    }
}

fn slot(b: Bdev) -> SlotView {
    SlotView { state: SlotState::Active, name: Some(b.info().name.clone()), bdev: Some(b), uuid: Uuid::NIL }
}

fn raid(level: RaidLevel, bases: Vec<Bdev>, strip_bytes: u64) -> Arc<RaidDevice> {
    let sizes = bases.iter().map(|b| b.info().size_bytes()).collect();
    let spec = RaidSpec {
        name: "r".into(),
        uuid: crate::device::new_uuid(),
        level,
        strip_bytes,
        superblock: false,
        block_size: 512,
        data_offset: 0,
        slots: bases.into_iter().map(slot).collect(),
        base_data_bytes: sizes,
        chunk_bytes: 4096,
    };
    Arc::new(RaidDevice::new(spec).unwrap())
}

fn suite(make: &dyn Fn() -> Arc<RaidDevice>) {
    conformance::run_suite(&|| -> Arc<dyn BlockDevice> { make() }, Storage::Keeps);
}

#[test]
fn raid0_passes_the_conformance_suite() {
    suite(&|| raid(RaidLevel::Raid0, vec![ram("a", 64 << 10), ram("b", 64 << 10)], 4096));
    // Strips of one block over three bases: every multi-block request is cut.
    suite(&|| raid(RaidLevel::Raid0, vec![ram("a", 32 << 10), ram("b", 32 << 10), ram("c", 40 << 10)], 512));
}

#[test]
fn concat_passes_the_conformance_suite() {
    suite(&|| raid(RaidLevel::Concat, vec![ram("a", 8 << 10), ram("b", 20 << 10), ram("c", 64 << 10)], 0));
}

#[test]
fn raid1_passes_the_conformance_suite() {
    suite(&|| raid(RaidLevel::Raid1, vec![ram("a", 64 << 10), ram("b", 64 << 10)], 0));
    suite(&|| raid(RaidLevel::Raid1, vec![ram("a", 64 << 10), ram("b", 64 << 10), ram("c", 96 << 10)], 0));
}

#[test]
fn sizes_follow_the_level() {
    let r = raid(RaidLevel::Raid0, vec![ram("a", 64 << 10), ram("b", 70 << 10)], 8192);
    assert_eq!(r.info().size_bytes(), 2 * (64 << 10));
    let r = raid(RaidLevel::Concat, vec![ram("a", 64 << 10), ram("b", 70 << 10)], 0);
    assert_eq!(r.info().size_bytes(), 134 << 10);
    let r = raid(RaidLevel::Raid1, vec![ram("a", 64 << 10), ram("b", 70 << 10)], 0);
    assert_eq!(r.info().size_bytes(), 64 << 10);
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

#[test]
fn raid0_and_concat_put_each_byte_where_the_level_says() {
    let (a, b) = (ram("a", 32 << 10), ram("b", 32 << 10));
    let r = raid(RaidLevel::Raid0, vec![a.clone(), b.clone()], 4096);
    let data = pattern(3, 16 << 10);
    write_range(&mut *r.open_channel().unwrap(), 0, &data);
    let (mut ca, mut cb) = (a.open_channel().unwrap(), b.open_channel().unwrap());
    assert!(read_range(&mut *ca, 0, 4096) == data[..4096]);
    assert!(read_range(&mut *cb, 0, 4096) == data[4096..8192]);
    assert!(read_range(&mut *ca, 4096, 4096) == data[8192..12288]);
    assert!(read_range(&mut *cb, 4096, 4096) == data[12288..]);

    let (a, b) = (ram("a", 8 << 10), ram("b", 32 << 10));
    let r = raid(RaidLevel::Concat, vec![a.clone(), b.clone()], 0);
    write_range(&mut *r.open_channel().unwrap(), 4096, &data);
    assert!(read_range(&mut *a.open_channel().unwrap(), 4096, 4096) == data[..4096]);
    assert!(read_range(&mut *b.open_channel().unwrap(), 0, 12288) == data[4096..]);
}

/// A request of more iovec pieces than a parent's region holds goes in several rounds.
#[test]
fn raid0_takes_requests_of_many_small_iovecs() {
    let r = raid(RaidLevel::Raid0, vec![ram("a", 256 << 10), ram("b", 256 << 10)], 4096);
    let mut ch = r.open_channel().unwrap();
    let data = pattern(9, 200 * 512);
    let mut buf = IoBuf::new(data.len(), true);
    buf.bytes_mut().copy_from_slice(&data);
    let whole = buf.iovec();
    let iov: Vec<libc::iovec> = (0..200)
        .map(|i| libc::iovec {
            // SAFETY: inside the buffer.
            iov_base: unsafe { (whole.iov_base as *mut u8).add(i * 512) }.cast(),
            iov_len: 512,
        })
        .collect();
    // SAFETY: the iovecs describe `buf`, alive until the request is polled back.
    unsafe { ch.submit(&conformance::rw(1, IoOp::Write, 1024, &iov)).unwrap() };
    assert_eq!(poll_until(&mut *ch, 1), vec![(1, IoStatus::Success)]);
    assert!(read_range(&mut *ch, 1024, data.len()) == data);
}

#[test]
fn raid1_writes_every_base_and_reads_from_each() {
    let (a, b) = (ram("a", 64 << 10), ram("b", 64 << 10));
    let r = raid(RaidLevel::Raid1, vec![a.clone(), b.clone()], 0);
    let mut ch = r.open_channel().unwrap();
    let data = pattern(5, 32 << 10);
    write_range(&mut *ch, 8192, &data);
    for base in [&a, &b] {
        assert!(read_range(&mut *base.open_channel().unwrap(), 8192, data.len()) == data);
    }
    // Reads come back right, from whichever base they go to.
    for _ in 0..4 {
        assert!(read_range(&mut *ch, 8192, 4096) == data[..4096]);
    }
    assert_eq!(r.shared().counters.degraded_bytes_written.load(Ordering::Relaxed), 0);
}

#[test]
fn a_read_goes_to_the_replica_with_the_fewest_reads_in_flight() {
    let (a, b) = (Flaky::new("a", 64 << 10), Flaky::new("b", 64 << 10));
    // Replica b fails reads, which makes every read sent to it visible as a failure report.
    b.fail_reads.store(true, Ordering::Relaxed);
    let r = raid(RaidLevel::Raid1, vec![a.clone() as Bdev, b.clone() as Bdev], 0);
    let mut ch = r.open_channel().unwrap();
    for _ in 0..8 {
        read_range(&mut *ch, 0, 4096);
    }
    assert!(r.shared().failures.is_empty(), "one at a time, every read went to the first replica");
    // Two in flight at once: the second goes to the other replica.
    let mut bufs = [vec![0u8; 4096], vec![0u8; 4096]];
    let iovs: Vec<libc::iovec> =
        bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
    for (tag, iov) in iovs.iter().enumerate() {
        // SAFETY: the buffers and their iovecs outlive the requests, all reaped below.
        let iov = unsafe { Iovecs::from_raw(iov, 1) };
        let req = IoRequest { tag: tag as u32, op: IoOp::Read, offset: 0, len: 4096, iov };
        ch.submit(&req).unwrap();
    }
    let done = poll_until(&mut *ch, 2);
    assert!(done.iter().all(|&(_, s)| s == IoStatus::Success), "{done:?}");
    assert_eq!(r.shared().failures.pop().map(|f| f.slot), Some(1), "the second read went to replica b");
}

/// Plays the owner: takes the reported failures, publishes the slots Failed.
fn owner_takes_out(r: &RaidDevice) -> Vec<usize> {
    let shared = r.shared();
    let mut slots = Vec::new();
    while let Some(f) = shared.failures.pop() {
        slots.push(f.slot);
    }
    let mut layout: Layout = (*shared.layout()).clone();
    for &s in &slots {
        layout.slots[s].state = SlotState::Failed;
    }
    shared.publish(layout);
    slots
}

#[test]
fn a_failed_write_is_held_until_the_layout_takes_the_base_out() {
    let flaky = Flaky::new("b", 64 << 10);
    let a = ram("a", 64 << 10);
    let r = raid(RaidLevel::Raid1, vec![a.clone(), flaky.clone()], 0);
    let mut ch = r.open_channel().unwrap();
    flaky.fail_writes.store(true, Ordering::Relaxed);
    let data = pattern(7, 4096);
    let mut buf = IoBuf::new(data.len(), true);
    buf.bytes_mut().copy_from_slice(&data);
    let iov = [buf.iovec()];
    // SAFETY: `buf` outlives the request.
    unsafe { ch.submit(&conformance::rw(4, IoOp::Write, 0, &iov)).unwrap() };
    for _ in 0..100 {
        assert_eq!(ch.poll(&mut |t, s| panic!("completed before the layout changed: {t} {s:?}")), 0);
    }
    assert_eq!(ch.in_flight(), 1);
    assert_eq!(owner_takes_out(&r), vec![1]);
    assert_eq!(poll_until(&mut *ch, 1), vec![(4, IoStatus::Success)]);
    assert!(read_range(&mut *a.open_channel().unwrap(), 0, 4096) == data);
    // Degraded now: I/O continues on the survivor and is counted.
    write_range(&mut *ch, 4096, &data);
    assert!(read_range(&mut *ch, 4096, 4096) == data);
    assert_eq!(r.shared().counters.degraded_bytes_written.load(Ordering::Relaxed), 8192);
    assert!(r.shared().failures.is_empty(), "a base out of the layout gets no more requests");
}

#[test]
fn a_write_failing_on_every_base_is_an_error() {
    let (x, y) = (Flaky::new("x", 64 << 10), Flaky::new("y", 64 << 10));
    let r = raid(RaidLevel::Raid1, vec![x.clone(), y.clone()], 0);
    let mut ch = r.open_channel().unwrap();
    x.fail_writes.store(true, Ordering::Relaxed);
    y.fail_writes.store(true, Ordering::Relaxed);
    ch.submit(&conformance::cmd(2, IoOp::WriteZeroes, 0, 512)).unwrap();
    for _ in 0..10 {
        assert_eq!(ch.poll(&mut |_, _| panic!("completed while held")), 0);
    }
    let mut out = owner_takes_out(&r);
    out.sort();
    assert_eq!(out, vec![0, 1]);
    assert_eq!(poll_until(&mut *ch, 1), vec![(2, IoStatus::Error(libc::EIO))]);
}

#[test]
fn a_failed_read_is_retried_on_another_base() {
    let flaky = Flaky::new("a", 64 << 10);
    let b = ram("b", 64 << 10);
    let r = raid(RaidLevel::Raid1, vec![flaky.clone(), b], 0);
    let mut ch = r.open_channel().unwrap();
    let data = pattern(1, 8192);
    write_range(&mut *ch, 0, &data);
    flaky.fail_reads.store(true, Ordering::Relaxed);
    for _ in 0..4 {
        assert!(read_range(&mut *ch, 0, 8192) == data);
    }
    let f = r.shared().failures.pop().expect("the failed read is reported");
    assert_eq!((f.slot, f.errno), (0, libc::EIO));
    // With the other base out too, a read has nowhere left to go.
    let mut layout: Layout = (*r.shared().layout()).clone();
    layout.slots[1].state = SlotState::Failed;
    r.shared().publish(layout);
    let mut buf = IoBuf::new(512, true);
    let iov = [buf.iovec()];
    // SAFETY: `buf` outlives the request.
    unsafe { ch.submit(&conformance::rw(3, IoOp::Read, 0, &iov)).unwrap() };
    assert_eq!(poll_until(&mut *ch, 1), vec![(3, IoStatus::Error(libc::EIO))]);
}

/// A slot that becomes Rebuilding gets writes (its channel opened at the new epoch) but no
/// reads.
#[test]
fn a_rebuilding_slot_gets_writes_but_no_reads() {
    let (a, b) = (ram("a", 64 << 10), ram("b", 64 << 10));
    let r = raid(RaidLevel::Raid1, vec![a.clone(), b.clone()], 0);
    let mut layout: Layout = (*r.shared().layout()).clone();
    layout.slots[1].state = SlotState::Empty;
    layout.slots[1].bdev = None;
    r.shared().publish(layout.clone());
    let mut ch = r.open_channel().unwrap();
    let data = pattern(2, 4096);
    write_range(&mut *ch, 0, &data);
    assert!(read_range(&mut *b.open_channel().unwrap(), 0, 4096) == vec![0; 4096]);
    layout.slots[1].state = SlotState::Rebuilding;
    layout.slots[1].bdev = Some(b.clone());
    r.shared().publish(layout);
    write_range(&mut *ch, 4096, &data);
    assert!(read_range(&mut *b.open_channel().unwrap(), 4096, 4096) == data);
    // Every read from `a`: `b` never served the unwritten block 0 (zeroes there).
    for _ in 0..4 {
        assert!(read_range(&mut *ch, 0, 4096) == data);
    }
}

/// With the real owner: a replica that fails writes is taken out durably (the survivor's
/// superblock says so before the write completes), and I/O goes on degraded.
#[test]
fn the_owner_takes_a_failing_replica_out_and_io_continues() {
    use crate::format::{self, SlotRecord, Superblock};
    use crate::meta_io::{self, ChannelIo};
    use crate::owner::{BaseSpec, OwnerHandle, OwnerOptions};

    let size = 4u64 << 20;
    let flaky = Flaky::new("b", size);
    let a = ram("a", size);
    let bases: Vec<Bdev> = vec![a.clone(), flaky.clone()];
    let data_offset = format::data_offset(size);
    let uuids = [crate::device::new_uuid(), crate::device::new_uuid()];
    let spec = RaidSpec {
        name: "r".into(),
        uuid: crate::device::new_uuid(),
        level: RaidLevel::Raid1,
        strip_bytes: 0,
        superblock: true,
        block_size: 512,
        data_offset,
        slots: bases.iter().zip(uuids).map(|(b, uuid)| SlotView { uuid, ..slot(b.clone()) }).collect(),
        base_data_bytes: vec![size - data_offset; 2],
        chunk_bytes: 0,
    };
    let dev = Arc::new(RaidDevice::new(spec).unwrap());
    let shared = dev.shared().clone();
    let chunk = shared.intent.as_ref().unwrap().chunk_bytes();
    let sb = Superblock {
        seq: 0,
        raid_uuid: dev.uuid(),
        name: "r".into(),
        level: RaidLevel::Raid1,
        strip_size_kb: 0,
        block_size: 512,
        raid_blocks: shared.info.num_blocks(),
        data_offset,
        bitmap_chunk_bytes: chunk,
        bitmap_first_page: format::BITMAP_FIRST_PAGE,
        bitmap_pages: format::bitmap_pages(shared.info.size_bytes(), chunk),
        clean: true,
        slot: 0,
        slots: uuids
            .iter()
            .map(|&uuid| SlotRecord {
                state: SlotState::Active,
                uuid,
                data_bytes: size - data_offset,
                rebuild_offset: 0,
                rebuild_partial: false,
            })
            .collect(),
    };
    let specs = vec![
        Some(BaseSpec { name: "a".into(), bdev: a.clone() }),
        Some(BaseSpec { name: "b".into(), bdev: flaky.clone() }),
    ];
    let owner = OwnerHandle::spawn(shared.clone(), specs, Some(sb), OwnerOptions::default()).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let data = pattern(6, 8192);
    write_range(&mut *ch, 0, &data);
    flaky.fail_writes.store(true, Ordering::Relaxed);
    write_range(&mut *ch, 1 << 20, &data);
    let layout = shared.layout();
    assert_eq!(layout.slots[1].state, SlotState::Failed);
    assert_eq!(shared.counters.base_failures.load(Ordering::Relaxed), 1);
    let on_a = meta_io::read_superblock(&mut ChannelIo::open(a.clone()).unwrap()).unwrap().unwrap();
    assert_eq!(on_a.slots[1].state, SlotState::Failed, "durable before the write completed");
    // Degraded: writes and reads go on, counted.
    write_range(&mut *ch, 2 << 20, &data);
    assert!(read_range(&mut *ch, 1 << 20, data.len()) == data);
    assert!(read_range(&mut *ch, 2 << 20, data.len()) == data);
    assert_eq!(shared.counters.degraded_bytes_written.load(Ordering::Relaxed), 2 * 8192);
    drop(ch);
    owner.shutdown(crate::owner::OWNER_WAIT).unwrap().stopped().unwrap().unwrap();
}

/// An operation one replica lacks is refused at submit, never done on the other alone.
#[test]
fn raid1_refuses_what_a_replica_cannot_do() {
    let lacking = Flaky::with_info("b", 64 << 10, |i| i.io_types.write_zeroes = false);
    let r = raid(RaidLevel::Raid1, vec![ram("a", 64 << 10), lacking], 0);
    assert!(!r.info().io_types.write_zeroes && r.info().io_types.unmap);
    let mut ch = r.open_channel().unwrap();
    let refused = ch.submit(&conformance::cmd(1, IoOp::WriteZeroes, 0, 512));
    assert_eq!(refused, Err(SubmitError::Unsupported));
    assert_eq!(ch.in_flight(), 0);
    ch.submit(&conformance::cmd(2, IoOp::Discard, 0, 512)).unwrap();
    assert_eq!(poll_until(&mut *ch, 1), vec![(2, IoStatus::Success)]);
}

/// A flush skips the bases that have no cache to flush (here: one that would fail it).
#[test]
fn flush_skips_bases_without_a_cache() {
    for level in [RaidLevel::Raid0, RaidLevel::Raid1] {
        let nocache = Flaky::with_info("b", 64 << 10, |i| i.io_types.flush = false);
        nocache.fail_writes.store(true, Ordering::Relaxed);
        let strip = if level == RaidLevel::Raid0 { 4096 } else { 0 };
        let r = raid(level, vec![ram("a", 64 << 10), nocache], strip);
        let mut ch = r.open_channel().unwrap();
        ch.submit(&conformance::cmd(3, IoOp::Flush, 0, 0)).unwrap();
        assert_eq!(poll_until(&mut *ch, 1), vec![(3, IoStatus::Success)], "{level:?}");
        assert!(r.shared().failures.is_empty());
    }
}

/// A base that is busy for a while gets its part of a request later; reads move on too.
#[test]
fn busy_bases_get_their_requests_later() {
    for level in [RaidLevel::Raid1, RaidLevel::Raid0] {
        let busy = Flaky::new("b", 64 << 10);
        let strip = if level == RaidLevel::Raid0 { 4096 } else { 0 };
        let r = raid(level, vec![ram("a", 64 << 10), busy.clone()], strip);
        let mut ch = r.open_channel().unwrap();
        let data = pattern(4, 16 << 10);
        busy.busy.store(3, Ordering::Relaxed);
        write_range(&mut *ch, 0, &data);
        assert_eq!(busy.busy.load(Ordering::Relaxed), 0, "{level:?}: the busy base was asked again");
        if level == RaidLevel::Raid1 {
            assert!(read_range(&mut *busy.open_channel().unwrap(), 0, data.len()) == data);
        }
        busy.busy.store(3, Ordering::Relaxed);
        for _ in 0..4 {
            assert!(read_range(&mut *ch, 0, data.len()) == data, "{level:?}");
        }
    }
}

/// A write waiting for a busy base that is then removed from the raid (its slot published
/// without a base) completes on the others: the removed base is not asked again, nor
/// reported failed to the owner.
#[test]
fn a_write_waiting_for_a_busy_base_that_is_removed_completes_without_it() {
    let busy = Flaky::new("b", 64 << 10);
    let a = ram("a", 64 << 10);
    let r = raid(RaidLevel::Raid1, vec![a.clone(), busy.clone()], 0);
    let mut ch = r.open_channel().unwrap();
    busy.busy.store(u32::MAX, Ordering::Relaxed);
    let data = pattern(9, 4096);
    let mut buf = IoBuf::new(data.len(), true);
    buf.bytes_mut().copy_from_slice(&data);
    let iov = [buf.iovec()];
    // SAFETY: `buf` outlives the request, polled to its end below.
    unsafe { ch.submit(&conformance::rw(6, IoOp::Write, 0, &iov)).unwrap() };
    for _ in 0..10 {
        assert_eq!(ch.poll(&mut |t, s| panic!("completed while a base is busy: {t} {s:?}")), 0);
    }
    // `bdev_raid_remove_base_bdev`: the owner publishes the slot without its base.
    let mut layout: Layout = (*r.shared().layout()).clone();
    layout.slots[1] = SlotView { state: SlotState::Failed, name: None, bdev: None, uuid: Uuid::NIL };
    r.shared().publish(layout);
    let asked = busy.busy.load(Ordering::Relaxed);
    assert_eq!(poll_until(&mut *ch, 1), vec![(6, IoStatus::Success)]);
    assert_eq!(busy.busy.load(Ordering::Relaxed), asked, "the removed base was asked again");
    assert!(r.shared().failures.is_empty(), "the removed base was reported failed");
    assert!(read_range(&mut *a.open_channel().unwrap(), 0, 4096) == data);
}

/// Submits a request of `op` at 0 over `iov` and polls once: nothing completes while the
/// bases refuse it as busy.
fn submit_refused(ch: &mut dyn IoChannel, tag: u32, op: IoOp, iov: &[libc::iovec]) {
    // SAFETY: the caller keeps `iov` and its buffers until the request ends, polled to it.
    unsafe { ch.submit(&conformance::rw(tag, op, 0, iov)).unwrap() };
    assert_eq!(ch.poll(&mut |t, s| panic!("completed while the bases are busy: {t} {s:?}")), 0);
}

/// Requests every base refused as busy are parked in the raid's channel: counted, and given
/// up with ECANCELED when asked, without counting as a base's failure.
#[test]
fn requests_refused_by_every_base_are_parked_and_given_up_when_asked() {
    for level in [RaidLevel::Raid1, RaidLevel::Raid0, RaidLevel::Concat] {
        let (a, b) = (Flaky::new("a", 64 << 10), Flaky::new("b", 64 << 10));
        let strip = if level == RaidLevel::Raid0 { 4096 } else { 0 };
        let r = raid(level, vec![a.clone(), b.clone()], strip);
        let mut ch = r.open_channel().unwrap();
        a.busy.store(u32::MAX, Ordering::Relaxed);
        b.busy.store(u32::MAX, Ordering::Relaxed);
        let (mut rbuf, mut wbuf) = (IoBuf::new(4096, true), IoBuf::new(4096, true));
        let (riov, wiov) = ([rbuf.iovec()], [wbuf.iovec()]);
        submit_refused(&mut *ch, 1, IoOp::Read, &riov);
        submit_refused(&mut *ch, 2, IoOp::Write, &wiov);
        assert_eq!((ch.parked(), ch.in_flight()), (2, 2), "{level:?}");
        assert_eq!(ch.abort_parked(), 2, "{level:?}");
        let mut done = poll_until(&mut *ch, 2);
        done.sort_by_key(|&(t, _)| t);
        let cancelled = IoStatus::Error(libc::ECANCELED);
        assert_eq!(done, vec![(1, cancelled), (2, cancelled)], "{level:?}");
        assert_eq!((ch.parked(), ch.in_flight()), (0, 0), "{level:?}");
        assert!(r.shared().failures.is_empty(), "{level:?}: a given-up request is no base's failure");
    }
}

/// A raid1 write one base took and another refuses as busy is not parked: giving it up would
/// leave the copies different, so it waits for the busy base.
#[test]
fn a_raid1_write_on_one_base_waiting_for_a_busy_other_is_not_parked() {
    let busy = Flaky::new("b", 64 << 10);
    let r = raid(RaidLevel::Raid1, vec![ram("a", 64 << 10), busy.clone()], 0);
    let mut ch = r.open_channel().unwrap();
    busy.busy.store(u32::MAX, Ordering::Relaxed);
    let mut buf = IoBuf::new(4096, true);
    let iov = [buf.iovec()];
    submit_refused(&mut *ch, 3, IoOp::Write, &iov);
    assert_eq!((ch.parked(), ch.abort_parked()), (0, 0));
    busy.busy.store(0, Ordering::Relaxed);
    assert_eq!(poll_until(&mut *ch, 1), vec![(3, IoStatus::Success)]);
}
