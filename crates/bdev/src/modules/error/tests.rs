use super::*;
use crate::RamDevice;

fn setup() -> (Bdev, ErrorDevice) {
    let base: Bdev = Arc::new(RamDevice::new("ram", 512, 64).unwrap());
    let dev = ErrorDevice::new("EE_ram", base.clone()).unwrap();
    (base, dev)
}

fn inj(error_type: ErrorType, num: u64) -> Injection {
    Injection { error_type, num, queue_depth: 0, corrupt_offset: 0, corrupt_value: 0 }
}

/// One request on `ch` with a one-block buffer; returns its completion or the submit error.
fn io(ch: &mut dyn IoChannel, op: IoOp, buf: &mut [u8]) -> Result<IoStatus, SubmitError> {
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let len = if op == IoOp::Flush { 0 } else { buf.len() as u64 };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let req = IoRequest { tag: 5, op, offset: 0, len, iov: unsafe { Iovecs::from_raw(&iov, 1) } };
    ch.submit(&req)?;
    let mut got = None;
    ch.poll(&mut |t, s| {
        assert_eq!(t, 5);
        got = Some(s)
    });
    Ok(got.expect("completed in one poll"))
}

const OPS: [IoOp; 5] = [IoOp::Read, IoOp::Write, IoOp::Discard, IoOp::Flush, IoOp::WriteZeroes];

#[test]
fn failure_fails_num_requests_of_its_kind_only() {
    let (_base, dev) = setup();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = vec![0u8; 512];
    for (k, op) in OPS.into_iter().enumerate() {
        dev.inject(&[k], inj(ErrorType::Failure, 2)).unwrap();
        assert_eq!(dev.injections()[k].unwrap().num, 2);
        // Other kinds pass.
        for other in OPS.into_iter().filter(|o| *o != op) {
            assert_eq!(
                io(&mut *ch, other, &mut buf),
                Ok(IoStatus::Success),
                "{other:?} with {op:?} injected"
            );
        }
        assert_eq!(io(&mut *ch, op, &mut buf), Ok(IoStatus::Error(libc::EIO)));
        assert_eq!(dev.injections()[k].unwrap().num, 1);
        assert_eq!(io(&mut *ch, op, &mut buf), Ok(IoStatus::Error(libc::EIO)));
        assert_eq!(dev.injections()[k], None);
        assert_eq!(io(&mut *ch, op, &mut buf), Ok(IoStatus::Success), "{op:?} after the count ran out");
    }
}

#[test]
fn all_and_clear_and_num_zero() {
    let (_base, dev) = setup();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = vec![0u8; 512];
    dev.inject(&[0, 1, 2, 3, 4], inj(ErrorType::Failure, 10)).unwrap();
    for op in OPS {
        assert_eq!(io(&mut *ch, op, &mut buf), Ok(IoStatus::Error(libc::EIO)));
    }
    dev.clear();
    assert_eq!(dev.injections(), [None; 5]);
    for op in OPS {
        assert_eq!(io(&mut *ch, op, &mut buf), Ok(IoStatus::Success));
    }
    dev.inject(&[0], inj(ErrorType::Failure, 0)).unwrap();
    assert_eq!(io(&mut *ch, IoOp::Read, &mut buf), Ok(IoStatus::Success));
}

#[test]
fn the_count_is_shared_by_every_channel() {
    let (_base, dev) = setup();
    let mut a = dev.open_channel().unwrap();
    let mut b = dev.open_channel().unwrap();
    let mut buf = vec![0u8; 512];
    dev.inject(&[1], inj(ErrorType::Failure, 3)).unwrap();
    let mut failed = 0;
    for i in 0..10 {
        let ch = if i % 2 == 0 { &mut a } else { &mut b };
        if io(&mut **ch, IoOp::Write, &mut buf) == Ok(IoStatus::Error(libc::EIO)) {
            failed += 1;
        }
    }
    assert_eq!(failed, 3);
    // And by threads: exactly `num` failures among many racing requests.
    dev.inject(&[1], inj(ErrorType::Failure, 100)).unwrap();
    let total = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let mut ch = dev.open_channel().unwrap();
                let mut buf = vec![0u8; 512];
                for _ in 0..200 {
                    if io(&mut *ch, IoOp::Write, &mut buf) == Ok(IoStatus::Error(libc::EIO)) {
                        total.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(total.load(Ordering::Relaxed), 100);
}

#[test]
fn nomem_refuses_submission_num_times() {
    let (_base, dev) = setup();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = vec![0u8; 512];
    dev.inject(&[0], inj(ErrorType::Nomem, 2)).unwrap();
    assert_eq!(io(&mut *ch, IoOp::Read, &mut buf), Err(SubmitError::Busy));
    assert_eq!(ch.in_flight(), 0);
    assert_eq!(io(&mut *ch, IoOp::Read, &mut buf), Err(SubmitError::Busy));
    assert_eq!(io(&mut *ch, IoOp::Read, &mut buf), Ok(IoStatus::Success));
}

#[test]
fn corrupt_data_xors_writes_before_and_reads_after() {
    let (base, dev) = setup();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = vec![0x11u8; 512];
    let corrupt =
        |off, val| Injection { corrupt_offset: off, corrupt_value: val, ..inj(ErrorType::CorruptData, 1) };
    let e = dev.inject(&[1], corrupt(0, 0)).unwrap_err();
    assert!(e.to_string().contains("corrupt_value"), "{e}");
    dev.inject(&[1], corrupt(7, 0xff)).unwrap();
    assert_eq!(io(&mut *ch, IoOp::Write, &mut buf), Ok(IoStatus::Success));
    // The caller's buffer is not changed: the write went down from a copy.
    assert_eq!(buf, vec![0x11u8; 512]);
    // On the base: byte 7 changed, the rest not.
    let mut below = base.open_channel().unwrap();
    let mut back = vec![0u8; 512];
    assert_eq!(io(&mut *below, IoOp::Read, &mut back), Ok(IoStatus::Success));
    let mut want = vec![0x11u8; 512];
    want[7] = 0xee;
    assert_eq!(back, want);
    // Only one: the next write is intact.
    let mut buf = vec![0x22u8; 512];
    assert_eq!(io(&mut *ch, IoOp::Write, &mut buf), Ok(IoStatus::Success));
    assert_eq!(io(&mut *below, IoOp::Read, &mut back), Ok(IoStatus::Success));
    assert_eq!(back, vec![0x22u8; 512]);
    // A read is changed after the base filled it; the base keeps its data.
    dev.inject(&[0], corrupt(511, 0x01)).unwrap();
    let mut got = vec![0u8; 512];
    assert_eq!(io(&mut *ch, IoOp::Read, &mut got), Ok(IoStatus::Success));
    want = vec![0x22u8; 512];
    want[511] = 0x23;
    assert_eq!(got, want);
    assert_eq!(io(&mut *ch, IoOp::Read, &mut got), Ok(IoStatus::Success));
    assert_eq!(got, vec![0x22u8; 512]);
    // Past the data: nothing changes. Requests without data do not take it.
    dev.inject(&[0, 2], corrupt(4096, 0x01)).unwrap();
    assert_eq!(io(&mut *ch, IoOp::Discard, &mut got), Ok(IoStatus::Success));
    assert_eq!(dev.injections()[2].unwrap().num, 1);
    assert_eq!(io(&mut *ch, IoOp::Read, &mut got), Ok(IoStatus::Success));
    assert_eq!(dev.injections()[0], None);
}

#[test]
fn pending_holds_until_cleared_then_completes_from_the_base() {
    let (_base, dev) = setup();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = vec![9u8; 512];
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 512 };
    dev.inject(&[1], inj(ErrorType::Pending, 1)).unwrap();
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let write = |tag| IoRequest {
        tag,
        op: IoOp::Write,
        offset: 0,
        len: 512,
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        iov: unsafe { Iovecs::from_raw(&iov, 1) },
    };
    ch.submit(&write(1)).unwrap();
    ch.submit(&write(2)).unwrap();
    let mut done = Vec::new();
    for _ in 0..10 {
        ch.poll(&mut |t, s| done.push((t, s)));
    }
    assert_eq!(done, vec![(2, IoStatus::Success)]);
    assert_eq!(ch.in_flight(), 1);
    dev.clear();
    ch.poll(&mut |t, s| done.push((t, s)));
    ch.poll(&mut |t, s| done.push((t, s)));
    assert_eq!(done, vec![(2, IoStatus::Success), (1, IoStatus::Success)]);
    assert_eq!(ch.in_flight(), 0);
    // A request held after a clear (this one with nothing held) stays held until the next.
    dev.clear();
    dev.inject(&[1], inj(ErrorType::Pending, 1)).unwrap();
    ch.submit(&write(3)).unwrap();
    for _ in 0..10 {
        ch.poll(&mut |t, s| done.push((t, s)));
    }
    assert_eq!((done.len(), ch.in_flight()), (2, 1));
    dev.resume_pending();
    ch.poll(&mut |t, s| done.push((t, s)));
    ch.poll(&mut |t, s| done.push((t, s)));
    assert_eq!(done[2..], [(3, IoStatus::Success)]);
}

#[test]
fn queue_depth_takes_only_requests_submitted_at_that_depth() {
    let (_base, dev) = setup();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = vec![0u8; 512];
    dev.inject(&[0], Injection { queue_depth: 2, ..inj(ErrorType::Failure, 5) }).unwrap();
    assert_eq!(io(&mut *ch, IoOp::Read, &mut buf), Ok(IoStatus::Success));
    // Two writes passed down and not yet polled: the read submitted now is at depth 2.
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 512 };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let req = |tag, op| IoRequest { tag, op, offset: 0, len: 512, iov: unsafe { Iovecs::from_raw(&iov, 1) } };
    let mut done = Vec::new();
    for (n, want) in [(1, IoStatus::Success), (2, IoStatus::Error(libc::EIO))] {
        done.clear();
        for tag in 0..n {
            ch.submit(&req(tag, IoOp::Write)).unwrap();
        }
        ch.submit(&req(9, IoOp::Read)).unwrap();
        while ch.in_flight() > 0 {
            ch.poll(&mut |t, s| done.push((t, s)));
        }
        assert_eq!(done.iter().find(|d| d.0 == 9), Some(&(9, want)), "{n} in flight: {done:?}");
    }
    assert_eq!(dev.injections()[0].unwrap().num, 4);
}

#[test]
fn resume_ends_pending_injections_only() {
    let (_base, dev) = setup();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = vec![0u8; 512];
    dev.inject(&[1], inj(ErrorType::Pending, 5)).unwrap();
    dev.inject(&[0], inj(ErrorType::Failure, 5)).unwrap();
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 512 };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let iovs = unsafe { Iovecs::from_raw(&iov, 1) };
    let w = IoRequest { tag: 1, op: IoOp::Write, offset: 0, len: 512, iov: iovs };
    ch.submit(&w).unwrap();
    dev.resume_pending();
    let mut done = Vec::new();
    ch.poll(&mut |t, s| done.push((t, s)));
    ch.poll(&mut |t, s| done.push((t, s)));
    assert_eq!(done, vec![(1, IoStatus::Success)]);
    assert_eq!(dev.injections()[1], None);
    assert_eq!(dev.injections()[0].unwrap().num, 5);
}

#[test]
fn delete_fails_held_requests_so_that_none_leaks() {
    let (_base, dev) = setup();
    let mut a = dev.open_channel().unwrap();
    let mut b = dev.open_channel().unwrap();
    let mut buf = vec![0u8; 512];
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 512 };
    dev.inject(&[0, 1, 2, 3, 4], inj(ErrorType::Pending, 100)).unwrap();
    for (on_a, op) in [(true, IoOp::Read), (false, IoOp::Write), (true, IoOp::Flush)] {
        let ch = if on_a { &mut a } else { &mut b };
        let len = if op == IoOp::Flush { 0 } else { 512 };
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        let req = IoRequest { tag: op as u32, op, offset: 0, len, iov: unsafe { Iovecs::from_raw(&iov, 1) } };
        ch.submit(&req).unwrap();
    }
    assert_eq!((a.in_flight(), b.in_flight()), (2, 1));
    dev.fail_pending();
    let mut done = Vec::new();
    a.poll(&mut |t, s| done.push((t, s)));
    b.poll(&mut |t, s| done.push((t, s)));
    done.sort_by_key(|d| d.0);
    let enxio = IoStatus::Error(libc::ENXIO);
    assert_eq!(
        done,
        vec![(IoOp::Read as u32, enxio), (IoOp::Write as u32, enxio), (IoOp::Flush as u32, enxio)]
    );
    assert_eq!((a.in_flight(), b.in_flight()), (0, 0));
    assert_eq!(dev.injections(), [None; 5]);
}

#[test]
fn the_error_bdev_reports_its_base() {
    let (_base, dev) = setup();
    assert_eq!(dev.info().name, "EE_ram");
    assert_eq!(dev.info().driver, "error");
    assert_eq!(dev.info().num_blocks(), 64);
    assert_eq!(ErrorType::from_name("corrupt_data"), Some(ErrorType::CorruptData));
    assert_eq!(ErrorType::from_name("nvme_failure"), None);
}

/// A RAM disk whose channels say they complete on other threads and signal an fd (as Ceph
/// RBD's do), so a caller may sleep with requests in flight: the base the error channel must
/// pass those properties up from, except while it holds requests itself.
struct SleepyRam {
    ram: RamDevice,
}

struct SleepyChannel {
    inner: Box<dyn IoChannel>,
    fd: std::os::fd::OwnedFd,
}

impl BlockDevice for SleepyRam {
    fn info(&self) -> &BdevInfo {
        self.ram.info()
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        // SAFETY: a plain eventfd; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a descriptor we just opened and own.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Box::new(SleepyChannel { inner: self.ram.open_channel()?, fd }))
    }
}

impl IoChannel for SleepyChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.inner.submit(req)
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.inner.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(&self.fd))
    }

    fn sleeps_in_flight(&self) -> bool {
        true
    }
}

/// The error channel offers its base's completion fd and its base's leave to sleep with
/// requests in flight, but not while a completion of its own is queued (`arm` says "poll
/// first") nor while it holds a request (a clear signals no fd).
#[test]
fn the_bases_completion_fd_passes_up_except_for_what_the_error_bdev_holds() {
    let base: Bdev = Arc::new(SleepyRam { ram: RamDevice::new("ram", 512, 64).unwrap() });
    let dev = ErrorDevice::new("EE_ram", base).unwrap();
    let mut ch = dev.open_channel().unwrap();
    assert!(ch.completion_fd().is_some(), "the base's fd, passed up");
    assert!(ch.sleeps_in_flight() && ch.arm_completion_fd());

    let mut buf = vec![1u8; 512];
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 512 };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let write = |tag| IoRequest {
        tag,
        op: IoOp::Write,
        offset: 0,
        len: 512,
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        iov: unsafe { Iovecs::from_raw(&iov, 1) },
    };
    // A failure completes from the channel's own list at the next poll.
    dev.inject(&[1], inj(ErrorType::Failure, 1)).unwrap();
    ch.submit(&write(1)).unwrap();
    assert!(!ch.arm_completion_fd(), "a failure is queued: poll, do not sleep");
    let mut done = Vec::new();
    ch.poll(&mut |t, s| done.push((t, s)));
    assert_eq!(done, [(1, IoStatus::Error(libc::EIO))]);
    assert!(ch.arm_completion_fd());

    // A held request: the caller must keep polling to see the clear.
    dev.inject(&[1], inj(ErrorType::Pending, 1)).unwrap();
    ch.submit(&write(2)).unwrap();
    ch.poll(&mut |t, s| done.push((t, s)));
    assert_eq!((done.len(), ch.in_flight()), (1, 1));
    assert!(!ch.sleeps_in_flight(), "a held request is released by polling, never by the fd");
    dev.clear();
    ch.poll(&mut |t, s| done.push((t, s)));
    ch.poll(&mut |t, s| done.push((t, s)));
    assert_eq!(done[1..], [(2, IoStatus::Success)]);
    assert!(ch.sleeps_in_flight(), "nothing held: the base's leave again");
}

/// A `corrupt_data` request the base refuses as busy keeps its count: the retried request is
/// the one corrupted (an error bdev over another with `nomem` stands for a busy base).
#[test]
fn corrupt_data_is_counted_only_once_the_base_accepts_the_request() {
    let (base, inner) = setup();
    let inner = Arc::new(inner);
    let outer = ErrorDevice::new("EE_EE_ram", inner.clone()).unwrap();
    let mut ch = outer.open_channel().unwrap();
    let corrupt =
        |num| Injection { corrupt_offset: 3, corrupt_value: 0x5a, ..inj(ErrorType::CorruptData, num) };
    for (k, op) in [(1, IoOp::Write), (0, IoOp::Read)] {
        outer.inject(&[k], corrupt(1)).unwrap();
        inner.inject(&[k], inj(ErrorType::Nomem, 1)).unwrap();
        let mut buf = vec![0x11u8; 512];
        assert_eq!(io(&mut *ch, op, &mut buf), Err(SubmitError::Busy), "{op:?}");
        assert_eq!(outer.injections()[k].map(|i| i.num), Some(1), "{op:?}: the count is kept");
        assert_eq!(io(&mut *ch, op, &mut buf), Ok(IoStatus::Success), "{op:?} retried");
        assert_eq!(outer.injections()[k], None, "{op:?}: taken by the retry");
        let mut stored = vec![0u8; 512];
        let mut raw = base.open_channel().unwrap();
        assert_eq!(io(&mut *raw, IoOp::Read, &mut stored), Ok(IoStatus::Success));
        match op {
            // The write went down corrupted; the caller's buffer is untouched.
            IoOp::Write => {
                assert_eq!(stored[3], 0x11 ^ 0x5a);
                assert!(buf.iter().all(|&b| b == 0x11));
            }
            // The read came back corrupted from the base's (corrupted) data.
            _ => assert_eq!(buf[3], stored[3] ^ 0x5a),
        }
    }
    // A clear while nothing is taken leaves no count behind.
    outer.inject(&[1], corrupt(1)).unwrap();
    outer.clear();
    assert_eq!(outer.injections(), [None; 5]);
}
