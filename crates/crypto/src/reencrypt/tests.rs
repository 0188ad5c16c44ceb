//! The re-encryption engine over RAM disks: a verified writer before, during and after a job;
//! requests held on the hotzone (the job stopped there by a hook, no timing); a request in
//! flight holding the job; straddling requests; cancel and resume on a new device; a crash at
//! each step of a hotzone, recovered; the refusals.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc;

use fp_bdev::conformance::{read_range, write_range, IoBuf};
use fp_bdev::{IoChannel, IoOp, IoStatus, RamDevice, SubmitError};
use rand::{Rng, SeedableRng};

use super::*;

const OLD1: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const OLD2: &str = "ffeeddccbbaa99887766554433221100f0e1d2c3b4a5968778695a4b3c2d1e0f";
const NEW1: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const NEW2: &str = "a0b1c2d3e4f5061728394a5b6c7d8e9fa0b1c2d3e4f5061728394a5b6c7d8e9f";

fn old_key() -> Arc<CryptoKey> {
    Arc::new(CryptoKey::from_hex("old", OLD1, OLD2).unwrap())
}

fn new_key() -> Arc<CryptoKey> {
    Arc::new(CryptoKey::from_hex("new", NEW1, NEW2).unwrap())
}

/// 64 KiB of header, then `data` bytes; 512-byte base blocks.
fn base(data: u64) -> Bdev {
    Arc::new(RamDevice::new("ram", 512, (64 * 1024 + data) / 512).unwrap())
}

const LAYOUT: CryptoLayout = CryptoLayout { data_offset: 64 * 1024, sector_size: 4096 };

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

/// The data area of `base` decrypted with `key` alone.
fn decrypt_all(base: &Bdev, layout: CryptoLayout, key: &CryptoKey, len: usize) -> Vec<u8> {
    let mut ch = base.open_channel().unwrap();
    let mut data = read_range(&mut *ch, layout.data_offset, len);
    let ss = layout.sector_size as usize;
    for (k, s) in data.chunks_exact_mut(ss).enumerate() {
        key.decrypt(s, (k * ss / 512) as u64);
    }
    data
}

/// A hook that stops the job at `step` of the hotzone at `offset`, as a crash.
fn crash_at(step: Step, offset: u64) -> Option<Hook> {
    Some(Arc::new(move |s, at| s == step && at == offset))
}

/// A hook that blocks the job at `Quiesced` of the hotzone at `offset` until the test sends
/// on the returned channel, and tells the test it got there.
fn hold_at(offset: u64) -> (Option<Hook>, mpsc::Receiver<()>, mpsc::Sender<()>) {
    hold_at_step(Step::Quiesced, offset)
}

/// As [`hold_at`], at `step`.
fn hold_at_step(step: Step, offset: u64) -> (Option<Hook>, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (reached_tx, reached_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (reached_tx, go_rx) = (Mutex::new(reached_tx), Mutex::new(go_rx));
    let hook: Hook = Arc::new(move |s, at| {
        if s == step && at == offset {
            reached_tx.lock().unwrap().send(()).unwrap();
            go_rx.lock().unwrap().recv_timeout(Duration::from_secs(30)).expect("the test lets the job go");
        }
        false
    });
    (Some(hook), reached_rx, go_tx)
}

fn opts(hotzone: u64, hook: Option<Hook>) -> ReencryptOptions {
    ReencryptOptions { hotzone, hook, ..ReencryptOptions::default() }
}

fn finish(job: &mut ReencryptJob) -> ReencryptProgress {
    job.wait(Duration::from_secs(60)).expect("the job ends within 60 s")
}

/// Submits `req` once: `Busy`, or its status after polling it home.
fn try_once(ch: &mut dyn IoChannel, req: &fp_bdev::IoRequest) -> Result<IoStatus, SubmitError> {
    ch.submit(req)?;
    Ok(fp_bdev::conformance::poll_until(ch, 1)[0].1)
}

#[test]
fn a_verified_writer_reads_what_it_wrote_before_during_and_after_and_the_end_is_all_new_key() {
    const SIZE: usize = 2 << 20;
    const HZ: u64 = 64 << 10;
    for layout in [LAYOUT, CryptoLayout { data_offset: 0, sector_size: 512 }] {
        let ss = layout.sector_size as usize;
        let base: Bdev =
            Arc::new(RamDevice::new("ram", 512, (layout.data_offset + SIZE as u64) / 512).unwrap());
        let dev = Arc::new(CryptoDevice::with_layout("c", base.clone(), old_key(), layout).unwrap());
        let model = Arc::new(Mutex::new(pattern(SIZE, 1)));
        write_range(&mut *dev.open_channel().unwrap(), 0, &model.lock().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        // Two writers, each on a channel of its own and a half of the disk: random runs of 1 to
        // 24 sectors (many straddle a hotzone edge or the boundary), written then read back,
        // and a read of another run of its half checked against the model. Busy is retried by
        // the helpers.
        const HALF: usize = SIZE / 2;
        let writers: Vec<_> = (0..2usize)
            .map(|w| {
                let (dev, model, stop, rounds) = (dev.clone(), model.clone(), stop.clone(), rounds.clone());
                std::thread::spawn(move || {
                    let mut ch = dev.open_channel().unwrap();
                    let mut rng = rand::rngs::StdRng::seed_from_u64(7 + w as u64);
                    let mut after_stop = 0;
                    while after_stop < 20 {
                        if stop.load(Ordering::SeqCst) {
                            after_stop += 1;
                        }
                        let round = rounds.load(Ordering::SeqCst);
                        let sectors = rng.gen_range(1..=24usize);
                        let at = w * HALF + rng.gen_range(0..=HALF / ss - sectors) * ss;
                        let data = pattern(sectors * ss, 100 + 2 * round + w as u64);
                        write_range(&mut *ch, at as u64, &data);
                        model.lock().unwrap()[at..at + data.len()].copy_from_slice(&data);
                        assert_eq!(
                            read_range(&mut *ch, at as u64, data.len()),
                            data,
                            "round {round} at {at}"
                        );
                        let at = w * HALF + rng.gen_range(0..=HALF / ss - 16) * ss;
                        let want = model.lock().unwrap()[at..at + 16 * ss].to_vec();
                        assert_eq!(
                            read_range(&mut *ch, at as u64, want.len()),
                            want,
                            "round {round}: a read at {at}"
                        );
                        rounds.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        // Before: the writers work on the disk under the old key alone.
        let wait_rounds = |n: u64| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while rounds.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < deadline, "the writer is stuck");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        wait_rounds(20);
        // During: the job waits between hotzones (nothing held) until the writers have done ten
        // more rounds on the mixed disk, at a quarter, half and three quarters.
        let hook: Hook = {
            let rounds = rounds.clone();
            Arc::new(move |step, at| {
                if step == Step::Advanced && [8, 16, 24].contains(&(at / HZ)) {
                    let want = rounds.load(Ordering::SeqCst) + 10;
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while rounds.load(Ordering::SeqCst) < want {
                        assert!(Instant::now() < deadline, "the writer is stuck");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                false
            })
        };
        let checkpoint = MemoryCheckpoint::at(0);
        let mut job =
            start_reencrypt(&dev, new_key(), Box::new(checkpoint.clone()), opts(HZ, Some(hook))).unwrap();
        let end = finish(&mut job);
        assert_eq!(end.state, ReencryptState::Done, "{ss}: {end:?}");
        assert_eq!((end.done, end.total), (SIZE as u64, SIZE as u64));
        // After: twenty more rounds with every sector under the new key.
        stop.store(true, Ordering::SeqCst);
        for w in writers {
            w.join().expect("each writer saw what it wrote");
        }
        assert!(rounds.load(Ordering::SeqCst) >= 20 + 30 + 2 * 20);
        let record = checkpoint.record();
        assert!(record.finished && record.boundary == SIZE as u64 && record.hotzone.is_none(), "{record:?}");
        assert_eq!(record.calls, 2 * (SIZE as u64 / HZ) + 1, "begin and advance per hotzone, one finish");
        let model = model.lock().unwrap().clone();
        assert_eq!(read_range(&mut *dev.open_channel().unwrap(), 0, SIZE), model, "{ss}");
        assert_eq!(
            decrypt_all(&base, layout, &new_key(), SIZE),
            model,
            "{ss}: the new key alone decrypts it all"
        );
        assert_eq!(dev.reencryption(), Some((SIZE as u64, "new")));
    }
}

#[test]
fn requests_on_the_hotzone_are_held_while_the_job_is_there_and_others_pass() {
    const SIZE: usize = 512 << 10;
    let base = base(SIZE as u64);
    let dev = CryptoDevice::with_layout("c", base.clone(), old_key(), LAYOUT).unwrap();
    let data = pattern(SIZE, 2);
    let mut ch = dev.open_channel().unwrap();
    write_range(&mut *ch, 0, &data);
    // The job stops at its second hotzone [64 KiB, 128 KiB) once quiesced.
    let (hook, reached, go) = hold_at(64 << 10);
    let mut job =
        start_reencrypt(&dev, new_key(), Box::new(MemoryCheckpoint::at(0)), opts(64 << 10, hook)).unwrap();
    reached.recv_timeout(Duration::from_secs(30)).expect("the job reaches the second hotzone");
    let mut buf = IoBuf::new(8192, true);
    for (at, what) in
        [(64 << 10, "its first sectors"), (120 << 10, "its last sectors"), (60 << 10, "straddling its start")]
    {
        let req = buf.request(1, IoOp::Read, at);
        assert_eq!(try_once(&mut *ch, &req).err(), Some(SubmitError::Busy), "a read of {what}");
        let req = buf.request(1, IoOp::Write, at);
        assert_eq!(try_once(&mut *ch, &req).err(), Some(SubmitError::Busy), "a write of {what}");
    }
    assert_eq!(ch.in_flight(), 0, "nothing was taken");
    // Below it (new key) and above it (old key) requests pass.
    assert_eq!(read_range(&mut *ch, 0, 64 << 10), data[..64 << 10], "the rewritten hotzone");
    assert_eq!(read_range(&mut *ch, 128 << 10, 8192), data[128 << 10..(128 << 10) + 8192], "above");
    go.send(()).unwrap();
    assert_eq!(finish(&mut job).state, ReencryptState::Done);
    assert_eq!(read_range(&mut *ch, 0, SIZE), data);
    assert_eq!(decrypt_all(&base, LAYOUT, &new_key(), SIZE), data);
}

#[test]
fn a_request_in_flight_on_the_hotzone_holds_the_job_until_it_completes() {
    const SIZE: usize = 256 << 10;
    let base = base(SIZE as u64);
    let dev = CryptoDevice::with_layout("c", base.clone(), old_key(), LAYOUT).unwrap();
    let mut ch = dev.open_channel().unwrap();
    // Another channel that stays idle throughout: the job must not wait for it.
    let _idle = dev.open_channel().unwrap();
    // A write to the first hotzone, taken and not yet polled home.
    let data = pattern(8192, 3);
    let mut buf = IoBuf::new(8192, true);
    buf.bytes_mut().copy_from_slice(&data);
    ch.submit(&buf.request(1, IoOp::Write, 4096)).unwrap();
    let (hook, reached, go) = hold_at(0);
    let mut job =
        start_reencrypt(&dev, new_key(), Box::new(MemoryCheckpoint::at(0)), opts(64 << 10, hook)).unwrap();
    assert!(
        reached.recv_timeout(Duration::from_millis(300)).is_err(),
        "the job went into the hotzone with a write in flight there"
    );
    assert_eq!(fp_bdev::conformance::poll_until(&mut *ch, 1), vec![(1, IoStatus::Success)]);
    reached.recv_timeout(Duration::from_secs(30)).expect("the job goes on once the write completed");
    go.send(()).unwrap();
    assert_eq!(finish(&mut job).state, ReencryptState::Done);
    assert_eq!(
        read_range(&mut *ch, 4096, 8192),
        data,
        "the write landed under the old key and was rewritten"
    );
}

#[test]
fn straddling_requests_use_each_sectors_key() {
    for layout in [LAYOUT, CryptoLayout { data_offset: 0, sector_size: 512 }] {
        let ss = layout.sector_size as u64;
        let base: Bdev = Arc::new(RamDevice::new("ram", 512, (layout.data_offset + 64 * ss) / 512).unwrap());
        let boundary = 8 * ss;
        let dev = CryptoDevice::with_reencryption("c", base.clone(), old_key(), new_key(), layout, boundary)
            .unwrap();
        let mut ch = dev.open_channel().unwrap();
        // Sectors 4..12: 4 below the boundary, 4 above.
        let data = pattern(8 * ss as usize, 4);
        write_range(&mut *ch, 4 * ss, &data);
        let mut below = base.open_channel().unwrap();
        let stored = read_range(&mut *below, layout.data_offset + 4 * ss, data.len());
        for (k, (s, plain)) in
            stored.chunks_exact(ss as usize).zip(data.chunks_exact(ss as usize)).enumerate()
        {
            let sector = 4 + k as u64;
            let key = if sector < 8 { new_key() } else { old_key() };
            let mut want = plain.to_vec();
            key.encrypt(&mut want, sector * ss / 512);
            assert_eq!(s, &want[..], "{ss}-byte sector {sector} under the {} key", key.name());
        }
        assert_eq!(read_range(&mut *ch, 4 * ss, data.len()), data, "{ss}: read back across the boundary");
        // Write-zeroes across it too.
        let z = fp_bdev::conformance::run(
            &mut *ch,
            fp_bdev::conformance::cmd(0, IoOp::WriteZeroes, 6 * ss, 4 * ss),
        );
        assert_eq!(z, IoStatus::Success);
        assert_eq!(read_range(&mut *ch, 6 * ss, 4 * ss as usize), vec![0; 4 * ss as usize]);
    }
}

#[test]
fn a_cancelled_job_resumes_on_a_new_device_from_its_checkpoint() {
    const SIZE: usize = 512 << 10;
    let base = base(SIZE as u64);
    let data = pattern(SIZE, 5);
    let checkpoint = MemoryCheckpoint::at(0);
    {
        let dev = CryptoDevice::with_layout("c", base.clone(), old_key(), LAYOUT).unwrap();
        write_range(&mut *dev.open_channel().unwrap(), 0, &data);
        // Held at the fourth hotzone; cancelled there: that hotzone is finished, no more.
        let (hook, reached, go) = hold_at(3 * (64 << 10));
        let mut job =
            start_reencrypt(&dev, new_key(), Box::new(checkpoint.clone()), opts(64 << 10, hook)).unwrap();
        reached.recv_timeout(Duration::from_secs(30)).unwrap();
        job.cancel();
        go.send(()).unwrap();
        let end = finish(&mut job);
        assert_eq!((end.state, end.done), (ReencryptState::Cancelled, 4 * (64 << 10)), "{end:?}");
        // The cancelled disk still serves its mixed state.
        assert_eq!(read_range(&mut *dev.open_channel().unwrap(), 0, SIZE), data);
    }
    let record = checkpoint.record();
    assert_eq!((record.boundary, record.hotzone.clone(), record.finished), (4 * (64 << 10), None, false));
    let dev =
        CryptoDevice::with_reencryption("c", base.clone(), old_key(), new_key(), LAYOUT, record.boundary)
            .unwrap();
    assert_eq!(
        read_range(&mut *dev.open_channel().unwrap(), 0, SIZE),
        data,
        "the new device reads the mixed disk"
    );
    let mut job =
        start_reencrypt(&dev, new_key(), Box::new(checkpoint.clone()), opts(64 << 10, None)).unwrap();
    assert_eq!(finish(&mut job).state, ReencryptState::Done);
    assert!(checkpoint.record().finished);
    assert_eq!(decrypt_all(&base, LAYOUT, &new_key(), SIZE), data);
}

#[test]
fn a_crash_at_each_step_of_a_hotzone_is_recovered_to_the_right_data() {
    const SIZE: usize = 256 << 10;
    const HZ: u64 = 64 << 10;
    for (step, rewritten) in [
        (Step::Quiesced, None),
        (Step::Begun, Some(16)),
        (Step::HalfWritten, Some(8)),
        (Step::Written, Some(0)),
    ] {
        let base = base(SIZE as u64);
        let data = pattern(SIZE, 6);
        let checkpoint = MemoryCheckpoint::at(0);
        {
            let dev = CryptoDevice::with_layout("c", base.clone(), old_key(), LAYOUT).unwrap();
            write_range(&mut *dev.open_channel().unwrap(), 0, &data);
            let mut job =
                start_reencrypt(&dev, new_key(), Box::new(checkpoint.clone()), opts(HZ, crash_at(step, HZ)))
                    .unwrap();
            assert_eq!(finish(&mut job).state, ReencryptState::Failed, "{step:?}");
            // The "process" dies here: the device is dropped with its hotzone held.
        }
        let record = checkpoint.record();
        assert_eq!(record.boundary, HZ, "{step:?}: the first hotzone was recorded");
        let boundary = match (&record.hotzone, rewritten) {
            (None, None) => record.boundary,
            (Some(hz), Some(n)) => {
                assert_eq!((hz.offset, hz.len, hz.old_sector_sha256.len()), (HZ, HZ, 16), "{step:?}");
                let got = recover_hotzone(&base, LAYOUT, &old_key(), &new_key(), hz).unwrap();
                assert_eq!(got, Recovered { rewritten: n, already_new: 16 - n }, "{step:?}");
                // Recovering again finds it all new.
                let again = recover_hotzone(&base, LAYOUT, &old_key(), &new_key(), hz).unwrap();
                assert_eq!(again, Recovered { rewritten: 0, already_new: 16 }, "{step:?}");
                hz.offset + hz.len
            }
            other => panic!("{step:?}: {other:?}"),
        };
        let mut resumed = checkpoint.clone();
        resumed.advance(boundary).unwrap();
        let dev = CryptoDevice::with_reencryption("c", base.clone(), old_key(), new_key(), LAYOUT, boundary)
            .unwrap();
        assert_eq!(read_range(&mut *dev.open_channel().unwrap(), 0, SIZE), data, "{step:?}: after recovery");
        let mut job = start_reencrypt(&dev, new_key(), Box::new(checkpoint.clone()), opts(HZ, None)).unwrap();
        assert_eq!(finish(&mut job).state, ReencryptState::Done, "{step:?}");
        assert_eq!(decrypt_all(&base, LAYOUT, &new_key(), SIZE), data, "{step:?}: all under the new key");
    }
}

#[test]
fn pause_speed_limit_and_progress() {
    const SIZE: usize = 512 << 10;
    let base = base(SIZE as u64);
    let dev = CryptoDevice::with_layout("c", base, old_key(), LAYOUT).unwrap();
    let (hook, reached, go) = hold_at(64 << 10);
    let mut o = opts(64 << 10, hook);
    o.speed_limit_mib_s = 1;
    let started = Instant::now();
    let mut job = start_reencrypt(&dev, new_key(), Box::new(MemoryCheckpoint::at(0)), o).unwrap();
    reached.recv_timeout(Duration::from_secs(30)).unwrap();
    let p = job.progress();
    assert_eq!((p.state, p.done, p.total, p.error), (ReencryptState::Running, 64 << 10, SIZE as u64, None));
    job.pause();
    go.send(()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while job.progress().state != ReencryptState::Paused {
        assert!(Instant::now() < deadline, "never paused");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(job.progress().done, 2 * (64 << 10), "paused after the hotzone it was in");
    // A second paused is not credit: the limit holds from the resume on.
    std::thread::sleep(Duration::from_secs(1));
    job.resume();
    let resumed = Instant::now();
    assert_eq!(finish(&mut job).state, ReencryptState::Done);
    // 1 MiB/s: the hotzones after the first take at least 7 × 64 KiB / 1 MiB/s, and the six
    // after the resume at least the pauses between them (5 × 64 KiB / 1 MiB/s).
    assert!(started.elapsed() >= Duration::from_millis(7 * 1000 / 16), "{:?}", started.elapsed());
    assert!(resumed.elapsed() >= Duration::from_millis(5 * 1000 / 16), "{:?}", resumed.elapsed());
}

#[test]
fn starts_that_cannot_work_are_refused_naming_the_field() {
    let base = base(256 << 10);
    let dev = CryptoDevice::with_layout("c", base.clone(), old_key(), LAYOUT).unwrap();
    let start = |key: Arc<CryptoKey>, hotzone: u64| {
        start_reencrypt(&dev, key, Box::new(MemoryCheckpoint::at(0)), opts(hotzone, None))
    };
    for bad in [0, 2048, 4096 + 512, MAX_HOTZONE + 4096] {
        let e = start(new_key(), bad).err().unwrap().to_string();
        assert!(e.contains("hotzone") && e.contains(&bad.to_string()), "{e}");
    }
    let same = Arc::new(CryptoKey::from_hex("again", OLD1, OLD2).unwrap());
    let e = start(same, 64 << 10).err().unwrap().to_string();
    assert!(e.contains("new_key") && e.contains("again"), "{e}");
    // A job held in its first hotzone: a second start is refused, as is another new key.
    let (hook, reached, go) = hold_at(0);
    let mut job =
        start_reencrypt(&dev, new_key(), Box::new(MemoryCheckpoint::at(0)), opts(64 << 10, hook)).unwrap();
    reached.recv_timeout(Duration::from_secs(30)).unwrap();
    let e = start(new_key(), 64 << 10).err().unwrap();
    assert!(matches!(e, ReencryptError::Running(ref n) if n == "c"), "{e}");
    let other = Arc::new(CryptoKey::from_hex("other", NEW2, NEW1).unwrap());
    let e = start(other, 64 << 10).err().unwrap().to_string();
    assert!(e.contains("new_key") && e.contains("'new'"), "{e}");
    go.send(()).unwrap();
    assert_eq!(finish(&mut job).state, ReencryptState::Done);
    // A boundary that is not a whole number of sectors inside the disk.
    for bad in [512, (256 << 10) + 4096] {
        let e = CryptoDevice::with_reencryption("c", base.clone(), old_key(), new_key(), LAYOUT, bad)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("boundary") && e.contains(&bad.to_string()), "{e}");
    }
    let e =
        CryptoDevice::with_reencryption("c", base.clone(), old_key(), old_key(), LAYOUT, 0).err().unwrap();
    assert!(e.to_string().contains("new_key"), "{e}");
    // A hotzone record that does not fit the disk.
    let hz = Hotzone { offset: 4096, len: 8192, old_sector_sha256: vec![[0; 32]; 3] };
    let e = recover_hotzone(&base, LAYOUT, &old_key(), &new_key(), &hz).err().unwrap().to_string();
    assert!(e.contains("hotzone"), "{e}");
    let hz = Hotzone { offset: 252 << 10, len: 8192, old_sector_sha256: vec![[0; 32]; 2] };
    let e = recover_hotzone(&base, LAYOUT, &old_key(), &new_key(), &hz).err().unwrap().to_string();
    assert!(e.contains("hotzone") && e.contains("inside"), "{e}");
}

#[test]
fn a_base_that_fails_inside_a_hotzone_fails_the_job_and_its_requests_until_recovered() {
    use fp_bdev::{ErrorDevice, ErrorType, Injection};
    const SIZE: usize = 256 << 10;
    const HZ: u64 = 64 << 10;
    let ram = base(SIZE as u64);
    let errors = Arc::new(ErrorDevice::new("err", ram.clone()).unwrap());
    let faulty: Bdev = errors.clone();
    let data = pattern(SIZE, 8);
    let checkpoint = MemoryCheckpoint::at(0);
    let dev = CryptoDevice::with_layout("c", faulty, old_key(), LAYOUT).unwrap();
    let mut ch = dev.open_channel().unwrap();
    write_range(&mut *ch, 0, &data);
    // Two Busy answers to the job's writes are retried; then, in the second hotzone, a write
    // fails.
    let busy = Injection {
        error_type: ErrorType::Nomem,
        num: 2,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    errors.inject(&[1], busy).unwrap();
    let (hook, reached, go) = hold_at_step(Step::Begun, HZ);
    let mut job = start_reencrypt(&dev, new_key(), Box::new(checkpoint.clone()), opts(HZ, hook)).unwrap();
    reached.recv_timeout(Duration::from_secs(30)).unwrap();
    let fail = Injection { error_type: ErrorType::Failure, num: 1, ..busy };
    errors.inject(&[1], fail).unwrap();
    go.send(()).unwrap();
    let end = finish(&mut job);
    assert_eq!((end.state, end.done), (ReencryptState::Failed, HZ), "{end:?}");
    assert!(end.error.as_deref().is_some_and(|e| e.contains("write")), "{end:?}");
    // The hotzone fails with EIO (never Busy: no job will come back for it); the rest serves.
    let mut buf = IoBuf::new(8192, true);
    assert_eq!(try_once(&mut *ch, &buf.request(1, IoOp::Read, HZ + 4096)), Ok(IoStatus::Error(libc::EIO)));
    assert_eq!(try_once(&mut *ch, &buf.request(1, IoOp::Write, HZ - 4096)), Ok(IoStatus::Error(libc::EIO)));
    assert_eq!(read_range(&mut *ch, 0, HZ as usize), data[..HZ as usize]);
    assert_eq!(read_range(&mut *ch, 2 * HZ, HZ as usize), data[2 * HZ as usize..3 * HZ as usize]);
    let e = start_reencrypt(&dev, new_key(), Box::new(checkpoint.clone()), opts(HZ, None)).err().unwrap();
    assert!(e.to_string().contains("recover"), "{e}");
    drop((ch, dev));
    // Recovery on the next start: the write failed, so every sector is still old.
    let hz = checkpoint.record().hotzone.expect("the hotzone was recorded");
    let got = recover_hotzone(&ram, LAYOUT, &old_key(), &new_key(), &hz).unwrap();
    assert_eq!(got, Recovered { rewritten: 16, already_new: 0 });
    checkpoint.clone().advance(hz.offset + hz.len).unwrap();
    let dev =
        CryptoDevice::with_reencryption("c", ram.clone(), old_key(), new_key(), LAYOUT, hz.offset + hz.len)
            .unwrap();
    assert_eq!(read_range(&mut *dev.open_channel().unwrap(), 0, SIZE), data);
}

/// A checkpoint that panics in `begin_hotzone`.
struct Panicking;

impl ReencryptCheckpoint for Panicking {
    fn begin_hotzone(&mut self, _: u64, _: u64, _: &[[u8; 32]]) -> std::io::Result<()> {
        panic!("a checkpoint that panics (expected in this test)");
    }
    fn advance(&mut self, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_job_whose_checkpoint_panics_ends_failed() {
    let dev = CryptoDevice::with_layout("c", base(256 << 10), old_key(), LAYOUT).unwrap();
    let mut job = start_reencrypt(&dev, new_key(), Box::new(Panicking), opts(64 << 10, None)).unwrap();
    let end = finish(&mut job);
    assert_eq!((end.state, end.error.as_deref()), (ReencryptState::Failed, Some("the job panicked")));
}
