//! The mirror against RAM disks and a target that fails on cue: convergence under a racing
//! writer, blocking writes once ready, cancel, target failure, refusals.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::copy_share::CopyShare;
use crate::disk::{DiskChannel, DiskIo};
use crate::Iovecs;
use crate::{
    Bdev, BdevError, BdevInfo, BlockDevice, Disk, IoChannel, IoOp, IoRequest, IoStatus, RamDevice,
    SubmitError,
};

const BS: u32 = 512;

/// A RAM disk that fails writes once its budget is spent (a target that drops), or refuses
/// them all (read-only).
struct Flaky {
    info: BdevInfo,
    ram: RamDevice,
    budget: Arc<AtomicI64>,
    read_only: bool,
}

struct FlakyChannel {
    inner: Box<dyn IoChannel>,
    budget: Arc<AtomicI64>,
    failed: Vec<u32>,
}

impl Flaky {
    fn new(name: &str, blocks: u64, budget: i64) -> Arc<Flaky> {
        let ram = RamDevice::new(name, BS, blocks).unwrap();
        let info = ram.info().clone();
        Arc::new(Flaky { info, ram, budget: Arc::new(AtomicI64::new(budget)), read_only: false })
    }
}

impl BlockDevice for Flaky {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        let inner = self.ram.open_channel()?;
        Ok(Box::new(FlakyChannel { inner, budget: self.budget.clone(), failed: Vec::new() }))
    }

    fn read_only(&self) -> bool {
        self.read_only
    }
}

impl IoChannel for FlakyChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if req.op == IoOp::Write && self.budget.fetch_sub(1, Ordering::SeqCst) <= 0 {
            self.failed.push(req.tag);
            return Ok(());
        }
        self.inner.submit(req)
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let n = self.failed.len();
        for tag in self.failed.drain(..) {
            done(tag, IoStatus::Error(libc::EIO));
        }
        n + self.inner.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.failed.len() + self.inner.in_flight()
    }
}

fn ram(name: &str, blocks: u64) -> Bdev {
    Arc::new(RamDevice::new(name, BS, blocks).unwrap())
}

fn source(blocks: u64) -> Disk {
    Disk::new(ram("src", blocks), true)
}

fn opts(granularity: Option<u64>) -> MirrorOptions {
    MirrorOptions { job_id: "job0".into(), granularity, ..MirrorOptions::default() }
}

/// Runs one request to completion on `ch`, polling `also` meanwhile.
fn run_io(ch: &mut dyn IoChannel, op: IoOp, offset: u64, buf: &mut [u8], also: &mut dyn FnMut()) -> IoStatus {
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let iovs = unsafe { Iovecs::from_raw(&iov, 1) };
    let req = IoRequest { tag: 7, op, offset, len: buf.len() as u64, iov: iovs };
    loop {
        match ch.submit(&req) {
            Ok(()) => break,
            Err(SubmitError::Busy) => also(),
            Err(e) => panic!("submit: {e}"),
        }
    }
    let mut status = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while status.is_none() {
        ch.poll(&mut |_, s| status = Some(s));
        also();
        assert!(Instant::now() < deadline, "request never completed");
    }
    status.unwrap()
}

fn read_all(bdev: &dyn BlockDevice) -> Vec<u8> {
    let len = bdev.info().size_bytes() as usize;
    let mut ch = bdev.open_channel().unwrap();
    let mut out = vec![0u8; len];
    for (i, piece) in out.chunks_mut(1 << 20).enumerate() {
        assert_eq!(run_io(&mut *ch, IoOp::Read, (i << 20) as u64, piece, &mut || {}), IoStatus::Success);
    }
    out
}

/// Polls the copier until `until` holds or it finishes; `also` runs each round.
fn drive(copier: &mut MirrorCopier, also: &mut dyn FnMut(), until: &dyn Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if until() {
            return true;
        }
        if copier.poll() == CopierPoll::Finished {
            return until();
        }
        also();
        assert!(
            Instant::now() < deadline,
            "the job made no progress: {:?} phase {} in flight {}",
            MirrorJob(copier.job.clone()).status(),
            copier.job.phase.load(Ordering::SeqCst),
            copier.in_flight
        );
    }
}

/// A job from `src` to `tgt` driven to `ready`, with a channel of `src` that polled along (a
/// channel must poll to take up each change; the copier waits for it).
fn ready_job(src: &Disk, tgt: Bdev) -> (MirrorJob, MirrorCopier, DiskChannel) {
    let (job, start) = MirrorJob::start(src, tgt, opts(None)).unwrap();
    let mut copier = start.open(None);
    let DiskIo::Counted(mut ch) = src.open_typed().unwrap() else { panic!("accounting is on") };
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state() == MirrorState::Ready));
    (job, copier, ch)
}

/// Makes `ee` fail or hold (`error_type`) its next `num` writes (the error bdev's op 1).
fn inject_writes(
    ee: &crate::modules::error::ErrorDevice,
    error_type: crate::modules::error::ErrorType,
    num: u64,
) {
    let injection = crate::modules::error::Injection {
        error_type,
        num,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    ee.inject(&[1], injection).unwrap();
}

fn poll_quiet(ch: &mut DiskChannel) {
    ch.poll_with(&mut |_, _| {});
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A writer on its own thread: random 4 KiB writes at QD 8 through a channel of the disk,
/// until told to stop; returns how many it wrote.
fn racing_writer(disk: Disk, stop: Arc<AtomicBool>, seed: u64) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let DiskIo::Counted(mut ch) = disk.open_typed().unwrap() else { panic!("accounting is on") };
        let blocks = disk.info().size_bytes() / 4096;
        let mut rng = Rng(seed);
        let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 4096]).collect();
        let mut iovs: Vec<libc::iovec> =
            bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: 4096 }).collect();
        let mut free: Vec<u32> = (0..8).collect();
        let mut written = 0;
        while !stop.load(Ordering::Relaxed) || free.len() < 8 {
            while !stop.load(Ordering::Relaxed) {
                let Some(&tag) = free.last() else { break };
                let fill = rng.next() as u8;
                bufs[tag as usize].fill(fill);
                let offset = (rng.next() % blocks) * 4096;
                let req = IoRequest {
                    tag,
                    op: IoOp::Write,
                    offset,
                    len: 4096,
                    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
                    iov: unsafe { Iovecs::from_raw(&iovs[tag as usize], 1) },
                };
                match ch.submit_request(&req) {
                    Ok(()) => {
                        free.pop();
                    }
                    Err(SubmitError::Busy) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            ch.poll_with(&mut |tag, status| {
                assert_eq!(status, IoStatus::Success, "the source never fails");
                free.push(tag);
                written += 1;
            });
            iovs.truncate(8);
        }
        written
    })
}

#[test]
fn converges_under_a_racing_writer_and_completes_with_equal_disks() {
    converge_under_a_racing_writer(ram("tgt", 16 << 11), whole_window());
}

#[test]
fn converges_to_a_file_target_through_io_uring() {
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().set_len(16 << 20).unwrap();
    converge_under_a_racing_writer(
        Arc::new(crate::UringDevice::new("tgt", f.path(), Some(BS), false).unwrap()),
        whole_window(),
    );
}

/// Writing blocking from the start, the default share converges beside the same writer: its
/// writes dirty nothing, so however fast it writes the dirty set only shrinks.
#[test]
fn converges_writing_blocking_at_the_default_share_under_a_racing_writer() {
    let options = MirrorOptions { copy_mode: CopyMode::WriteBlocking, ..opts(Some(4096)) };
    converge_under_a_racing_writer(ram("tgt", 16 << 11), options);
}

/// The copy's whole window (weight 100), in chunks of 4 KiB.
fn whole_window() -> MirrorOptions {
    MirrorOptions { share: CopyShare::new(100).unwrap(), ..opts(Some(4096)) }
}

/// A 16 MiB RAM disk, written at random by another thread from before the job starts until
/// after it is ready, mirrored to `tgt` with `options` and completed: the disks are then
/// equal. In the background mode the copy takes its whole window (weight 100): what is tested
/// is the bitmap under racing writes, and a writer thread on a RAM disk writes faster than any
/// share of it could copy (1.5 million writes a second into 4096 chunks, measured in a debug
/// build). Convergence at the default share is counted in rounds below.
fn converge_under_a_racing_writer(tgt: Bdev, options: MirrorOptions) {
    let src = source(16 << 11); // 16 MiB
                                // Something on the source before the job: the copier must carry it.
    let mut pre = vec![0xA5u8; 1 << 20];
    let DiskIo::Counted(mut ch) = src.open_typed().unwrap() else { panic!() };
    assert_eq!(run_io(&mut ch, IoOp::Write, 3 << 20, &mut pre, &mut || {}), IoStatus::Success);
    drop(ch);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = racing_writer(src.clone(), stop.clone(), 0x9E37_79B9_7F4A_7C15);
    let (job, start) = MirrorJob::start(&src, tgt.clone(), options).unwrap();
    let mut copier = start.open(None);
    assert!(drive(&mut copier, &mut || {}, &|| job.state() == MirrorState::Ready));
    // Ready: the writer's writes now go to both disks; the copier keeps running.
    let until = Instant::now() + Duration::from_millis(200);
    drive(&mut copier, &mut || {}, &|| Instant::now() >= until);
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 100, "the writer raced the copier ({written} writes)");
    job.complete().unwrap();
    assert!(drive(&mut copier, &mut || {}, &|| job.state() == MirrorState::Completed));
    let st = job.status();
    assert_eq!((st.dirty_bytes, st.in_flight, st.error), (0, 0, None));
    assert!(st.copied >= st.len, "copied {} of {}", st.copied, st.len);
    assert_eq!(src.mirror_job(), None, "detached");
    let (a, b) = (read_all(src.bdev().as_ref()), read_all(tgt.as_ref()));
    assert!(a == b, "target differs from source at byte {:?}", a.iter().zip(&b).position(|(x, y)| x != y));
}

#[test]
fn in_ready_each_acknowledged_write_is_on_the_target() {
    let src = source(2048);
    let tgt = ram("tgt", 4096);
    let (job, mut copier, mut ch) = ready_job(&src, tgt.clone());
    for i in 0..32u64 {
        let mut data = vec![i as u8 + 1; 8192];
        // No copier poll from here to the check: only the blocking write can put it there.
        assert_eq!(run_io(&mut ch, IoOp::Write, i * 24576, &mut data, &mut || {}), IoStatus::Success);
        let mut got = vec![0u8; 8192];
        let mut tch = tgt.open_channel().unwrap();
        assert_eq!(run_io(&mut *tch, IoOp::Read, i * 24576, &mut got, &mut || {}), IoStatus::Success);
        assert_eq!(got, data, "write {i} acknowledged but not on the target");
    }
    assert_eq!(job.status().dirty_bytes, 0, "blocking writes leave nothing dirty");
    job.complete().unwrap();
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state().is_final()));
    assert_eq!(job.state(), MirrorState::Completed);
    assert!(read_all(src.bdev().as_ref()) == read_all(tgt.as_ref())[..2048 * 512], "target differs");
}

#[test]
fn cancel_mid_copy_detaches_and_leaves_the_target_partly_copied() {
    let src = source(64 << 11);
    let tgt = ram("tgt", 64 << 11);
    let (job, start) = MirrorJob::start(&src, tgt.clone(), opts(None)).unwrap();
    let mut copier = start.open(None);
    assert!(drive(&mut copier, &mut || {}, &|| job.status().copied > 0));
    assert_eq!(job.state(), MirrorState::Running);
    assert!(job.complete().unwrap_err().to_string().contains("once ready"));
    job.cancel().unwrap();
    assert!(drive(&mut copier, &mut || {}, &|| job.state().is_final()));
    let st = job.status();
    assert_eq!(st.state, MirrorState::Cancelled);
    assert!(st.copied < st.len, "cancelled before the end");
    assert_eq!(st.in_flight, 0);
    assert_eq!(src.mirror_job(), None);
    assert!(job.cancel().is_err(), "over");
    // The source serves on, and a new job may start on it.
    let DiskIo::Counted(mut ch) = src.open_typed().unwrap() else { panic!() };
    let mut data = vec![9u8; 4096];
    assert_eq!(run_io(&mut ch, IoOp::Write, 0, &mut data, &mut || {}), IoStatus::Success);
    let (again, _start) = MirrorJob::start(&src, tgt, opts(None)).unwrap();
    assert_eq!(again.state(), MirrorState::Running);
}

#[test]
fn a_failing_target_fails_the_job_never_the_source() {
    // While copying: the copier's own write fails.
    let src = source(4096);
    let tgt = Flaky::new("tgt", 4096, 1); // the second 1 MiB copy fails
    let (job, start) = MirrorJob::start(&src, tgt.clone(), opts(Some(4096))).unwrap();
    let mut copier = start.open(None);
    assert!(drive(&mut copier, &mut || {}, &|| job.state().is_final()));
    let st = job.status();
    assert_eq!(st.state, MirrorState::Failed);
    assert!(st.error.as_deref().unwrap().contains("target 'tgt'"), "{:?}", st.error);
    assert_eq!(src.mirror_job(), None);

    // In ready: a blocking write's target half fails; the guest's write succeeds.
    let tgt = Flaky::new("tgt2", 4096, i64::MAX);
    let (job, mut copier, mut ch) = ready_job(&src, tgt.clone());
    tgt.budget.store(0, Ordering::SeqCst);
    let mut data = vec![0x3Cu8; 4096];
    assert_eq!(run_io(&mut ch, IoOp::Write, 8192, &mut data, &mut || {}), IoStatus::Success);
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state().is_final()));
    assert_eq!(job.state(), MirrorState::Failed);
    // The source has the write and keeps serving.
    let mut got = vec![0u8; 4096];
    assert_eq!(run_io(&mut ch, IoOp::Read, 8192, &mut got, &mut || {}), IoStatus::Success);
    assert_eq!(got, data);
    assert_eq!(run_io(&mut ch, IoOp::Write, 0, &mut data, &mut || {}), IoStatus::Success);
}

#[test]
fn refuses_what_cannot_work() {
    let src = source(2048);
    let err = |r: Result<(MirrorJob, MirrorStart), MirrorError>| r.map(|_| ()).unwrap_err().to_string();
    assert!(err(MirrorJob::start(&src, ram("small", 2047), opts(None))).contains("fewer than the source's"));
    let mut ro = Flaky::new("ro", 2048, 0);
    Arc::get_mut(&mut ro).unwrap().read_only = true;
    assert!(err(MirrorJob::start(&src, ro, opts(None))).contains("does not accept writes"));
    assert!(err(MirrorJob::start(&src, ram("src", 4096), opts(None))).contains("the source itself"));
    let big_blocks: Bdev = Arc::new(RamDevice::new("bb", 4096, 1024).unwrap());
    assert!(err(MirrorJob::start(&src, big_blocks, opts(None))).contains("4096-byte blocks"));
    assert!(err(MirrorJob::start(&src, ram("t", 2048), opts(Some(1000)))).contains("granularity"));
    let off = Disk::new(ram("off", 2048), false);
    assert!(err(MirrorJob::start(&off, ram("t", 2048), opts(None))).contains("statistics are switched off"));
    let (_job, _start) = MirrorJob::start(&src, ram("t1", 2048), opts(None)).unwrap();
    let e = err(MirrorJob::start(
        &src,
        ram("t2", 2048),
        MirrorOptions { job_id: "other".into(), ..MirrorOptions::default() },
    ));
    assert!(e.contains("already mirrored by job 'job0'"), "{e}");
}

/// A RAM disk whose writes land (and complete) only when released: a write submitted before a
/// job attaches can then reach the disk after the copier read its chunk.
struct Held {
    ram: RamDevice,
    hold: Arc<AtomicBool>,
}

struct HeldChannel {
    inner: Box<dyn IoChannel>,
    hold: Arc<AtomicBool>,
    held: Vec<IoRequest>,
}

impl BlockDevice for Held {
    fn info(&self) -> &BdevInfo {
        self.ram.info()
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(HeldChannel {
            inner: self.ram.open_channel()?,
            hold: self.hold.clone(),
            held: Vec::new(),
        }))
    }
}

impl IoChannel for HeldChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if req.op == IoOp::Write && self.hold.load(Ordering::SeqCst) {
            self.held.push(*req);
            return Ok(());
        }
        self.inner.submit(req)
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        if !self.hold.load(Ordering::SeqCst) {
            for req in self.held.drain(..) {
                self.inner.submit(&req).unwrap();
            }
        }
        self.inner.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.held.len() + self.inner.in_flight()
    }
}

#[test]
fn a_write_submitted_before_the_job_and_landing_after_its_copy_is_carried_over() {
    let hold = Arc::new(AtomicBool::new(true));
    let src =
        Disk::new(Arc::new(Held { ram: RamDevice::new("src", BS, 2048).unwrap(), hold: hold.clone() }), true);
    let tgt = ram("tgt", 2048);
    let DiskIo::Counted(mut ch) = src.open_typed().unwrap() else { panic!() };
    let mut data = vec![0xC3u8; 4096];
    let iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: 4096 };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let w = IoRequest {
        tag: 3,
        op: IoOp::Write,
        offset: 65536,
        len: 4096,
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        iov: unsafe { Iovecs::from_raw(&iov, 1) },
    };
    ch.submit_request(&w).unwrap();

    let (job, start) = MirrorJob::start(&src, tgt.clone(), opts(Some(4096))).unwrap();
    let mut copier = start.open(None);
    let mut acked = Vec::new();
    // The copier copies everything, the held write's chunk included (old data), and converges.
    assert!(drive(
        &mut copier,
        &mut || {
            ch.poll_with(&mut |t, _| acked.push(t));
        },
        &|| job.state() == MirrorState::Ready
    ));
    assert!(acked.is_empty(), "the write is still held");
    assert_eq!(job.status().dirty_bytes, 0);
    // Complete waits for it: it is in flight on the source alone.
    job.complete().unwrap();
    for _ in 0..100 {
        copier.poll();
        ch.poll_with(&mut |t, _| acked.push(t));
    }
    assert_eq!(job.state(), MirrorState::Ready, "not completed with a write on the source alone");
    // It lands, completes, marks its chunk; the copier carries it over; the job completes.
    hold.store(false, Ordering::SeqCst);
    assert!(drive(
        &mut copier,
        &mut || {
            ch.poll_with(&mut |t, _| acked.push(t));
        },
        &|| job.state().is_final()
    ));
    assert_eq!((job.state(), acked.as_slice()), (MirrorState::Completed, &[3][..]));
    let mut got = vec![0u8; 4096];
    let mut tch = tgt.open_channel().unwrap();
    assert_eq!(run_io(&mut *tch, IoOp::Read, 65536, &mut got, &mut || {}), IoStatus::Success);
    assert_eq!(got, data, "the late write reached the target");
}

#[test]
fn a_blocking_write_under_a_running_copy_marks_its_chunk_again() {
    let src = source(2048);
    let tgt = ram("tgt", 2048);
    let (job, mut copier, mut ch) = ready_job(&src, tgt.clone());
    let at = 5 * 65536;
    // A discard goes to the source alone and marks its chunk when it completes.
    let d = IoRequest { tag: 1, op: IoOp::Discard, offset: at, len: 4096, iov: Iovecs::NONE };
    ch.submit_request(&d).unwrap();
    poll_quiet(&mut ch);
    assert_eq!(job.status().dirty_bytes, 65536);
    // The copier reads the chunk (a RAM disk copies at submission: the old data).
    assert_eq!(copier.poll(), CopierPoll::Busy);
    assert_eq!(copier.in_flight, 1);
    // A blocking write lands on both disks while that copy is out...
    let mut data = vec![0x77u8; 4096];
    let iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: 4096 };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let w = IoRequest {
        tag: 2,
        op: IoOp::Write,
        offset: at,
        len: 4096,
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        iov: unsafe { Iovecs::from_raw(&iov, 1) },
    };
    ch.submit_request(&w).unwrap();
    // ... and the copy then writes the old data over it on the target.
    copier.poll();
    let mut acked = Vec::new();
    while acked.is_empty() {
        ch.poll_with(&mut |t, s| acked.push((t, s)));
    }
    assert_eq!(acked, [(2, IoStatus::Success)]);
    // The write saw the copy: its chunk is dirty again, and copied again.
    job.complete().unwrap();
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state().is_final()));
    assert_eq!(job.state(), MirrorState::Completed);
    let mut got = vec![0u8; 4096];
    let mut tch = tgt.open_channel().unwrap();
    assert_eq!(run_io(&mut *tch, IoOp::Read, at, &mut got, &mut || {}), IoStatus::Success);
    assert_eq!(got, data, "the target has the write, not the copy's older data");
}

#[test]
fn a_speed_limit_paces_the_copy_and_can_be_lifted() {
    // 8 MiB at 16 MiB/s: the first tenth of a second's worth (1.6 MiB) goes at once, the rest
    // at the limit, so about 0.4 s; unlimited it takes milliseconds.
    let src = source(8 << 20 >> 9);
    let tgt = ram("tgt", 8 << 20 >> 9);
    let options = MirrorOptions { speed: 16 << 20, ..opts(None) };
    let (job, start) = MirrorJob::start(&src, tgt, options).unwrap();
    assert_eq!(job.status().speed, 16 << 20);
    let mut copier = start.open(None);
    let DiskIo::Counted(mut ch) = src.open_typed().unwrap() else { panic!("accounting is on") };
    let t0 = Instant::now();
    // After 0.15 s at most a tenth of a second saved up plus 0.15 s earned can be copied.
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| t0.elapsed() >= Duration::from_millis(150)));
    let copied = job.status().copied;
    assert!(copied > 0, "the copy started");
    assert!(copied <= (16 << 20) / 10 + (16 << 20) * 25 / 100, "{copied} bytes copied in 0.15 s at 16 MiB/s");
    assert_eq!(job.state(), MirrorState::Running);
    // Lifted: the rest goes at once.
    job.set_speed(0);
    assert_eq!(job.status().speed, 0);
    let t1 = Instant::now();
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state() == MirrorState::Ready));
    assert!(t1.elapsed() < Duration::from_secs(5));
    job.cancel().unwrap();
    drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state().is_final());
}

/// A blocking write that fails on the source but lands on the target leaves the two
/// different: its chunk is marked, so the copier brings the source's content over again, and
/// the job completes with equal disks. The source is an error bdev failing one write.
#[test]
fn a_blocking_write_the_source_fails_is_copied_again_from_the_source() {
    use crate::modules::error::{ErrorDevice, ErrorType};
    let ee = Arc::new(ErrorDevice::new("EE_src", ram("src", 2048)).unwrap());
    let src = Disk::new(ee.clone(), true);
    let tgt = ram("tgt", 2048);
    let (job, mut copier, mut ch) = ready_job(&src, tgt.clone());
    inject_writes(&ee, ErrorType::Failure, 1);
    let mut data = vec![0x3Cu8; 8192];
    assert_eq!(run_io(&mut ch, IoOp::Write, 64 << 10, &mut data, &mut || {}), IoStatus::Error(libc::EIO));
    assert!(ee.injections()[1].is_none(), "the source failed it");
    let mut got = vec![0u8; 8192];
    let mut tch = tgt.open_channel().unwrap();
    assert_eq!(run_io(&mut *tch, IoOp::Read, 64 << 10, &mut got, &mut || {}), IoStatus::Success);
    assert_eq!(got, data, "the target's half landed (the error bdev fails only the source)");
    assert!(job.status().dirty_bytes > 0, "the failed write's chunk is dirty");
    job.complete().unwrap();
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state().is_final()));
    assert_eq!(job.state(), MirrorState::Completed);
    assert!(read_all(src.bdev().as_ref()) == read_all(tgt.as_ref()), "target differs from source");
}

/// With guest writes held in flight on the source (an error bdev's `pending`), the guest is
/// busy but completes nothing, so the copier earns only the floor (one chunk every
/// `FLOOR_ROUNDS` rounds: none in these 50) and copies nothing; requests waiting on their
/// device are not bytes the guest moves. Once the guest's I/O is done and it stays quiet, the
/// copier takes all its buffers again. Counted in polls, not time.
#[test]
fn the_copier_keeps_its_share_beside_guest_io_and_all_its_buffers_without() {
    use crate::copy_share::DEFAULT_COPY_WEIGHT;
    use crate::modules::error::{ErrorDevice, ErrorType};
    const GUEST: usize = 32;
    const ROUNDS: u64 = 50;
    let blocks = (64u64 << 20) / u64::from(BS);
    let ee = Arc::new(ErrorDevice::new("EE_src", ram("src", blocks)).unwrap());
    let src = Disk::new(ee.clone(), true);
    let tgt = ram("tgt", blocks);
    inject_writes(&ee, ErrorType::Pending, GUEST as u64);
    let DiskIo::Counted(mut guest) = src.open_typed().unwrap() else { panic!("accounting is on") };
    let mut bufs: Vec<Vec<u8>> = (0..GUEST).map(|_| vec![0x5Au8; 4096]).collect();
    let iovs: Vec<libc::iovec> =
        bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: 4096 }).collect();
    for (i, iov) in iovs.iter().enumerate() {
        // SAFETY: the test keeps the buffers and their iovecs until the requests complete.
        let iov = unsafe { Iovecs::from_raw(iov, 1) };
        let req = IoRequest { tag: i as u32, op: IoOp::Write, offset: i as u64 * 4096, len: 4096, iov };
        guest.submit_request(&req).unwrap();
    }
    let mut completed = 0;
    guest.poll_with(&mut |_, _| completed += 1);
    assert_eq!(completed, 0, "the error bdev holds the guest's writes");

    // Chunks of 4 KiB: the copy beside the guest moves little, leaving most to copy after.
    let (job, start) = MirrorJob::start(&src, tgt, opts(Some(4096))).unwrap();
    assert_eq!(job.status().weight, DEFAULT_COPY_WEIGHT);
    let mut copier = start.open(None);
    for _ in 0..ROUNDS {
        copier.poll();
        guest.poll_with(&mut |_, _| completed += 1);
        assert_eq!(copier.in_flight, 0, "a copy beside a guest that completes nothing");
    }
    assert_eq!(completed, 0, "the guest's writes are still held");
    assert_eq!(job.status().copied, 0, "copied beside a guest that completes nothing");
    assert_eq!(job.state(), MirrorState::Running);

    // The guest's writes complete: once the guest stays quiet, the copier takes every buffer.
    ee.resume_pending();
    while completed < GUEST {
        guest.poll_with(&mut |_, _| completed += 1);
    }
    let mut most = 0;
    let mut longest = 0;
    for _ in 0..crate::copy_share::QUIET_ROUNDS + 4 {
        copier.poll();
        guest.poll_with(&mut |_, _| completed += 1);
        most = most.max(copier.in_flight);
        longest = longest.max(copier.longest_in_flight());
    }
    assert_eq!(most, 16, "an idle guest leaves the copier all its buffers");
    // Of one chunk each until the guest has been idle for LONG_QUIET_ROUNDS: a guest back from
    // a pause waits behind 16 chunks, not 16 runs of 1 MiB.
    assert_eq!(longest, 4096, "a guest idle for a short while: runs of one chunk");
    job.cancel().unwrap();
    assert!(drive(&mut copier, &mut || poll_quiet(&mut guest), &|| job.state().is_final()));
    drop(bufs);
}

/// A guest whose requests complete within the round that submits them (a RAM disk) shows
/// nothing in flight at its poll's end; the bytes it completed between two of the copier's
/// polls still keep the copier to its share.
#[test]
fn a_guest_completing_within_each_round_still_keeps_the_copier_to_its_share() {
    const GUEST: usize = 32;
    const ROUNDS: u64 = 50;
    let blocks = (64u64 << 20) / u64::from(BS);
    let src = source(blocks);
    let (job, start) = MirrorJob::start(&src, ram("tgt", blocks), opts(Some(4096))).unwrap();
    let mut copier = start.open(None);
    let DiskIo::Counted(mut guest) = src.open_typed().unwrap() else { panic!("accounting is on") };
    let mut bufs: Vec<Vec<u8>> = (0..GUEST).map(|_| vec![0x33u8; 4096]).collect();
    let iovs: Vec<libc::iovec> =
        bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: 4096 }).collect();
    let per_round = (GUEST as u64 * 4096) * 10 / 90;
    for round in 0..ROUNDS {
        for (i, iov) in iovs.iter().enumerate() {
            // SAFETY: the test keeps the buffers and their iovecs until the requests complete.
            let iov = unsafe { Iovecs::from_raw(iov, 1) };
            let offset = (round * GUEST as u64 + i as u64) * 4096 % (32 << 20);
            guest
                .submit_request(&IoRequest { tag: i as u32, op: IoOp::Write, offset, len: 4096, iov })
                .unwrap();
        }
        let mut completed = 0;
        while completed < GUEST {
            guest.poll_with(&mut |_, _| completed += 1);
        }
        assert_eq!(guest.in_flight(), 0, "nothing in flight at the poll's end");
        copier.poll();
    }
    let copied = job.status().copied;
    assert!(copied > 0, "the copy progressed");
    assert!(copied <= ROUNDS * per_round + 4096, "more than its share beside a busy guest: {copied}");
    job.cancel().unwrap();
    assert!(drive(&mut copier, &mut || poll_quiet(&mut guest), &|| job.state().is_final()));
    drop(bufs);
}

/// A guest on `ch` writing `BURST` random 4 KiB blocks of a disk of `chunks` 4 KiB chunks,
/// waiting for them: its buffers and random stream.
struct BurstGuest {
    bufs: Vec<Vec<u8>>,
    rng: Rng,
    chunks: u64,
    writes: u64,
}

impl BurstGuest {
    const BURST: usize = 8;

    fn new(disk_bytes: u64, seed: u64) -> BurstGuest {
        let bufs = (0..Self::BURST).map(|_| vec![0u8; 4096]).collect();
        BurstGuest { bufs, rng: Rng(seed), chunks: disk_bytes / 4096, writes: 0 }
    }

    fn burst(&mut self, ch: &mut DiskChannel) {
        for (i, buf) in self.bufs.iter_mut().enumerate() {
            buf.fill(self.rng.next() as u8);
            let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 4096 };
            // SAFETY: the request completes below, before the buffer is written again.
            let iov = unsafe { Iovecs::from_raw(&iov, 1) };
            let offset = self.rng.next() % self.chunks * 4096;
            let req = IoRequest { tag: i as u32, op: IoOp::Write, offset, len: 4096, iov };
            ch.submit_request(&req).unwrap();
        }
        let mut completed = 0;
        while completed < Self::BURST {
            ch.poll_with(&mut |_, status| {
                assert_eq!(status, IoStatus::Success);
                completed += 1;
            });
        }
        self.writes += Self::BURST as u64;
    }
}

/// Completes a ready job while polling `ch` and checks the target equals the source.
fn complete_and_compare(
    job: &MirrorJob,
    copier: &mut MirrorCopier,
    ch: &mut DiskChannel,
    src: &Disk,
    tgt: &Bdev,
) {
    job.complete().unwrap();
    assert!(drive(copier, &mut || poll_quiet(ch), &|| job.state().is_final()));
    assert_eq!(job.state(), MirrorState::Completed);
    assert!(read_all(src.bdev().as_ref()) == read_all(tgt.as_ref()), "target differs from source");
}

/// A guest writing 4 KiB at random every round, without a pause: in the background mode a
/// copy or a fresh dirty chunk is always outstanding at the round's end, so the job cannot
/// become ready; writing blocking from the start, the guest's writes go to both disks and
/// dirty nothing, and the job becomes ready at the share's pace. Counted in rounds.
#[test]
fn writing_blocking_from_the_start_converges_beside_a_guest_that_never_pauses() {
    let blocks = (1u64 << 20) / u64::from(BS);
    for mode in [CopyMode::Background, CopyMode::WriteBlocking] {
        let src = source(blocks);
        let tgt = ram("tgt", blocks);
        let options = MirrorOptions { copy_mode: mode, ..opts(Some(4096)) };
        let (job, start) = MirrorJob::start(&src, tgt.clone(), options).unwrap();
        assert_eq!(job.status().copy_mode, mode);
        let mut copier = start.open(None);
        let DiskIo::Counted(mut ch) = src.open_typed().unwrap() else { panic!("accounting is on") };
        let mut guest = BurstGuest::new(1 << 20, 0x9E37_79B9_7F4A_7C15);
        // 256 chunks at 0.9 chunk a round: about 300 rounds writing blocking.
        let mut rounds = 0u64;
        while job.state() != MirrorState::Ready && rounds < 5_000 {
            guest.burst(&mut ch);
            copier.poll();
            rounds += 1;
        }
        match mode {
            CopyMode::Background => {
                assert_eq!(job.state(), MirrorState::Running, "background: ready with writes outstanding");
                job.cancel().unwrap();
                assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state().is_final()));
            }
            CopyMode::WriteBlocking => {
                assert_eq!(
                    job.state(),
                    MirrorState::Ready,
                    "not ready after {rounds} rounds: {:?}",
                    job.status()
                );
                assert!(rounds > 100, "ready after {rounds} rounds: the copier ignored its share");
                // The guest goes on writing while ready; each write lands on both disks.
                for _ in 0..50 {
                    guest.burst(&mut ch);
                    copier.poll();
                }
                complete_and_compare(&job, &mut copier, &mut ch, &src, &tgt);
            }
        }
    }
}

/// A job cancelled while a blocking write waits on the target: the channel keeps the job until
/// the write's target half completes, then lets go and acknowledges the detach at a later poll
/// of its own, with nothing else changed on the disk in between.
#[test]
fn a_cancel_waits_for_a_blocking_write_in_flight_then_the_channel_lets_go_unprompted() {
    use crate::modules::error::{ErrorDevice, ErrorType};
    let src = source(2048);
    let ee = Arc::new(ErrorDevice::new("EE_tgt", ram("tgt", 2048)).unwrap());
    let (job, mut copier, mut ch) = ready_job(&src, ee.clone());
    inject_writes(&ee, ErrorType::Pending, 1);
    let mut data = vec![0x6Bu8; 4096];
    let iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // SAFETY: `data` outlives the request, which completes below before the test ends.
    let iovs = unsafe { Iovecs::from_raw(&iov, 1) };
    ch.submit_request(&IoRequest { tag: 3, op: IoOp::Write, offset: 0, len: 4096, iov: iovs }).unwrap();
    let mut completed = 0;
    poll_quiet(&mut ch);
    job.cancel().unwrap();
    // The copier detaches; the channel drains: its write's target half is held.
    for _ in 0..100 {
        copier.poll();
        ch.poll_with(&mut |_, _| completed += 1);
    }
    assert_eq!(completed, 0, "the target holds the write's half");
    assert!(!job.state().is_final(), "detached while a write to both disks was in flight");
    ee.resume_pending();
    assert!(drive(
        &mut copier,
        &mut || {
            ch.poll_with(&mut |_, _| completed += 1);
        },
        &|| job.state().is_final()
    ));
    assert_eq!(completed, 1);
    assert_eq!(job.state(), MirrorState::Cancelled);
    assert_eq!(src.mirror_job(), None);
}

#[test]
fn a_disks_dirty_bitmaps_are_marked_through_a_mirror_copying_and_ready() {
    let src = source(2048);
    let len = src.info().size_bytes();
    let bitmap = src.add_dirty_bitmap(crate::disk::DirtyBitmap::new("b0", len, 4096, false, true)).unwrap();
    let (job, start) = MirrorJob::start(&src, ram("tgt", 2048), opts(None)).unwrap();
    let mut copier = start.open(None);
    let DiskIo::Counted(mut ch) = src.open_typed().unwrap() else { panic!("accounting is on") };
    // Copying: the write goes to the source alone and marks the job's map and the bitmap.
    let mut data = vec![1u8; 4096];
    assert_eq!(run_io(&mut ch, IoOp::Write, 0, &mut data, &mut || {}), IoStatus::Success);
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state() == MirrorState::Ready));
    // Ready: the write goes to both disks and marks the bitmap when both are done.
    assert_eq!(run_io(&mut ch, IoOp::Write, 65536, &mut data, &mut || {}), IoStatus::Success);
    assert_eq!(bitmap.snapshot().extents(0, len, 16), [(0, 4096), (65536, 4096)]);
    job.cancel().unwrap();
    assert!(drive(&mut copier, &mut || poll_quiet(&mut ch), &|| job.state().is_final()));
}
