//! Namespaces and their channels over the fake transport: the bdev conformance suite,
//! splitting, status mapping, timeouts (abort, reset), resubmission across resets and lost
//! connections, fast I/O failure, a controller given up.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fp_bdev::conformance::{self, cmd, read_range, rw, write_range, IoBuf};
use fp_bdev::{BlockDevice, IoChannel, IoOp, IoStatus, SubmitError};
use fp_nvme_spec::{self as spec, Status};

use super::core_fake::*;
use crate::ctrlr::{Controller, TimeoutAction};
use crate::NvmeError;

/// Controllers the conformance suite's devices belong to: kept attached until the test ends.
static KEEP: Mutex<Vec<Arc<dyn Controller>>> = Mutex::new(Vec::new());

#[test]
fn namespaces_pass_the_bdev_conformance_suite() {
    for (bs, mdts) in [(512, 5), (4096, 1)] {
        let make = move || -> Arc<dyn BlockDevice> {
            let dev = FakeDevice::new(&[(1, bs, 256)]);
            dev.lock().mdts = mdts;
            let (opts, global) = test_options("conf");
            let (c, _) = attach(&dev, "PCIe", opts, global);
            let ns = c.namespaces()[0].clone();
            KEEP.lock().unwrap().push(c);
            ns
        };
        conformance::run_suite(&make, conformance::Storage::Keeps);
    }
}

/// Polls until `n` completions came (5 s at most); returns them.
fn poll_n(ch: &mut dyn IoChannel, n: usize) -> Vec<(u32, IoStatus)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    while out.len() < n {
        ch.poll_batch(&mut out);
        assert!(Instant::now() < deadline, "{} of {n} completions: {out:?}", out.len());
        std::thread::yield_now();
    }
    assert_eq!(out.len(), n);
    out
}

/// Polls for `d`, expecting no completion.
fn poll_nothing(ch: &mut dyn IoChannel, d: Duration) {
    let end = Instant::now() + d;
    let mut out = Vec::new();
    while Instant::now() < end {
        ch.poll_batch(&mut out);
        assert!(out.is_empty(), "{out:?}");
        std::thread::yield_now();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn large_requests_are_split_at_the_transfer_limit_across_uneven_iovecs() {
    let dev = FakeDevice::new(&[(1, 512, 4096)]);
    dev.lock().mdts = 1; // 8 KiB
    let (opts, global) = test_options("c0");
    let (c, _) = attach(&dev, "PCIe", opts, global);
    let ns = c.namespaces()[0].clone();
    let mut ch = ns.open_channel().unwrap();
    let data = pattern(64 * 1024, 3);
    let mut buf = IoBuf::new(data.len(), false);
    buf.bytes_mut().copy_from_slice(&data);
    // Iovecs cut at odd places: 1000 + 20000 + the rest.
    let base = buf.bytes_mut().as_mut_ptr();
    // SAFETY: all three lie inside `buf`.
    let iov = unsafe {
        [
            libc::iovec { iov_base: base.cast(), iov_len: 1000 },
            libc::iovec { iov_base: base.add(1000).cast(), iov_len: 20000 },
            libc::iovec { iov_base: base.add(21000).cast(), iov_len: data.len() - 21000 },
        ]
    };
    dev.lock().seen.clear();
    // SAFETY: `buf` and `iov` outlive the request (polled to completion).
    unsafe { ch.submit(&rw(9, IoOp::Write, 512 * 100, &iov)) }.unwrap();
    assert_eq!(poll_n(&mut *ch, 1), [(9, IoStatus::Success)]);
    let seen = dev.lock().seen.clone();
    assert_eq!(seen.len(), 8);
    for (i, s) in seen.iter().enumerate() {
        assert_eq!((s.opcode, s.slba, s.nlb), (spec::NVM_WRITE, 100 + 16 * i as u64, 16));
    }
    assert_eq!(dev.lock().max_seen_transfer, 8192);
    assert_eq!(&dev.lock().namespaces[&1].data[512 * 100..512 * 100 + data.len()], &data[..]);
    assert_eq!(read_range(&mut *ch, 512 * 100, data.len()), data);
}

#[test]
fn a_request_larger_than_the_queue_goes_through_in_pieces() {
    let dev = FakeDevice::new(&[(1, 4096, 1024)]);
    dev.lock().mdts = 0; // no limit: the driver's own 1 MiB bound
    let (mut opts, global) = test_options("c0");
    opts.io_queue_depth = 4; // 3 commands at once
    let (c, _) = attach(&dev, "TCP", opts, global);
    let ns = c.namespaces()[0].clone();
    assert_eq!(ns.max_transfer(), 1 << 20);
    // A controller with an 8 KiB limit and a 3-command queue takes a 2 MiB write as 256
    // commands, three at a time.
    let dev = FakeDevice::new(&[(1, 4096, 1024)]);
    dev.lock().mdts = 1;
    let (mut opts, global) = test_options("c1");
    opts.io_queue_depth = 4;
    let (c1, _) = attach(&dev, "TCP", opts, global);
    let ns = c1.namespaces()[0].clone();
    let mut ch = ns.open_channel().unwrap();
    let data = pattern(2 << 20, 5);
    write_range(&mut *ch, 0, &data);
    assert_eq!(read_range(&mut *ch, 0, data.len()), data);
    let writes: Vec<u64> =
        dev.lock().seen.iter().filter(|s| s.opcode == spec::NVM_WRITE).map(|s| s.slba).collect();
    assert_eq!(writes, (0..256).map(|i| 2 * i).collect::<Vec<u64>>());
    drop(c);
}

#[test]
fn flush_discard_and_write_zeroes_become_their_commands() {
    let dev = FakeDevice::new(&[(1, 512, 256)]);
    let (opts, global) = test_options("c0");
    let (c, _) = attach(&dev, "PCIe", opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    write_range(&mut *ch, 0, &[0xaa; 512 * 8]);
    dev.lock().seen.clear();
    ch.submit(&cmd(1, IoOp::Discard, 512, 1024)).unwrap();
    ch.submit(&cmd(2, IoOp::WriteZeroes, 512 * 4, 512)).unwrap();
    ch.submit(&cmd(3, IoOp::Flush, 0, 0)).unwrap();
    assert_eq!(poll_n(&mut *ch, 3).len(), 3);
    let ops: Vec<(u8, u64, u32)> = dev.lock().seen.iter().map(|s| (s.opcode, s.slba, s.nlb)).collect();
    // The deallocate's range travels in data, not in the command.
    assert_eq!(
        ops,
        [(spec::NVM_DATASET_MANAGEMENT, 0, 0), (spec::NVM_WRITE_ZEROES, 4, 1), (spec::NVM_FLUSH, 0, 0)]
    );
    let got = read_range(&mut *ch, 0, 512 * 8);
    assert!(got[..512].iter().all(|&b| b == 0xaa));
    assert!(got[512..512 * 3].iter().all(|&b| b == 0));
    assert!(got[512 * 4..512 * 5].iter().all(|&b| b == 0));
    assert!(got[512 * 5..].iter().all(|&b| b == 0xaa));

    // Without a volatile cache a flush has nothing to do and is not sent; without DSM and
    // Write Zeroes support those are refused.
    drop(c);
    let dev = FakeDevice::new(&[(1, 512, 256)]);
    {
        let mut d = dev.lock();
        d.vwc = 0;
        d.oncs = 0;
    }
    let (opts, global) = test_options("c1");
    let (c1, _) = attach(&dev, "PCIe", opts, global);
    let ns = c1.namespaces()[0].clone();
    assert!(!ns.info().io_types.unmap && !ns.info().io_types.write_zeroes);
    let mut ch = ns.open_channel().unwrap();
    dev.lock().seen.clear();
    ch.submit(&cmd(1, IoOp::Flush, 0, 0)).unwrap();
    assert_eq!(ch.submit(&cmd(2, IoOp::Discard, 0, 512)), Err(SubmitError::Unsupported));
    assert_eq!(ch.submit(&cmd(3, IoOp::WriteZeroes, 0, 512)), Err(SubmitError::Unsupported));
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Success)]);
    assert!(dev.lock().seen.is_empty());
}

#[test]
fn enable_flush_off_leaves_a_volatile_cache_unflushed_and_unreported() {
    // The fake controller has a volatile write cache (VWC 1).
    let dev = FakeDevice::new(&[(1, 512, 256)]);
    let (opts, mut global) = test_options("c0");
    global.enable_flush = false;
    let (c, _) = attach(&dev, "PCIe", opts, global);
    let ns = c.namespaces()[0].clone();
    assert!(!ns.info().io_types.flush, "enable_flush false: flush is not reported");
    let mut ch = ns.open_channel().unwrap();
    dev.lock().seen.clear();
    ch.submit(&cmd(1, IoOp::Flush, 0, 0)).unwrap();
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Success)]);
    assert!(dev.lock().seen.is_empty(), "enable_flush false: no Flush command is sent");
    drop(ch);
    drop(c);

    let (opts, mut global) = test_options("c1");
    global.enable_flush = true;
    let (c, _) = attach(&dev, "PCIe", opts, global);
    let ns = c.namespaces()[0].clone();
    assert!(ns.info().io_types.flush);
    let mut ch = ns.open_channel().unwrap();
    dev.lock().seen.clear();
    ch.submit(&cmd(1, IoOp::Flush, 0, 0)).unwrap();
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Success)]);
    let ops: Vec<u8> = dev.lock().seen.iter().map(|s| s.opcode).collect();
    assert_eq!(ops, [spec::NVM_FLUSH]);
}

#[test]
fn nvme_statuses_become_errnos() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let (opts, global) = test_options("c0");
    let (c, _) = attach(&dev, "PCIe", opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    let mut buf = IoBuf::new(512, true);
    let iov = [buf.iovec()];
    for (status, want) in [
        (Status::generic(spec::SC_CAPACITY_EXCEEDED), IoStatus::Error(libc::ENOSPC)),
        (Status::generic(spec::SC_NAMESPACE_WRITE_PROTECTED), IoStatus::Error(libc::EROFS)),
        (Status::generic(spec::SC_INVALID_OPCODE), IoStatus::Unsupported),
        (Status::media(spec::SC_UNRECOVERED_READ_ERROR), IoStatus::Error(libc::EIO)),
    ] {
        dev.lock().io_status = Some(status);
        // SAFETY: `buf` outlives the request.
        unsafe { ch.submit(&rw(4, IoOp::Write, 0, &iov)) }.unwrap();
        assert_eq!(poll_n(&mut *ch, 1), [(4, want)], "{status:?}");
    }
    // Transient failures are retried (three times), and then stand.
    for (times, want) in [(3, IoStatus::Success), (4, IoStatus::Error(libc::EBUSY))] {
        {
            let mut d = dev.lock();
            d.io_status = Some(Status::generic(spec::SC_NAMESPACE_NOT_READY).retryable());
            d.io_status_times = times;
            d.seen.clear();
        }
        // SAFETY: as above.
        unsafe { ch.submit(&rw(7, IoOp::Write, 0, &iov)) }.unwrap();
        assert_eq!(poll_n(&mut *ch, 1), [(7, want)], "{times} failures");
        assert_eq!(dev.lock().seen.len(), 4);
    }
    dev.lock().io_status = None;
    ch.submit(&cmd(5, IoOp::Read, 0, 512)).unwrap();
    assert_eq!(poll_n(&mut *ch, 1), [(5, IoStatus::Error(libc::EINVAL))], "iovecs short of the length");
    // Outside the namespace: refused at submit.
    // SAFETY: as above.
    assert_eq!(unsafe { ch.submit(&rw(6, IoOp::Read, 512 * 64, &iov)) }, Err(SubmitError::OutOfRange));
}

#[test]
fn a_full_channel_answers_busy() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    dev.lock().stall = true;
    let (opts, mut global) = test_options("c0");
    global.io_queue_requests = 4;
    let (mut opts, _) = (opts, ());
    opts.io_queue_depth = 5;
    let (c, _) = attach(&dev, "PCIe", opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    for t in 0..4 {
        ch.submit(&cmd(t, IoOp::WriteZeroes, 0, 512)).unwrap();
    }
    assert_eq!(ch.submit(&cmd(9, IoOp::WriteZeroes, 0, 512)), Err(SubmitError::Busy));
    assert_eq!(ch.in_flight(), 4);
    poll_nothing(&mut *ch, Duration::from_millis(5));
    dev.lock().stall = false;
    assert_eq!(poll_n(&mut *ch, 4).len(), 4);
    // One doorbell carried the four (and polls with nothing new rang none).
    for _ in 0..64 {
        ch.poll_batch(&mut Vec::new());
    }
    assert_eq!(c.stats().doorbells, 1);
    assert_eq!(c.stats().submitted, 4);
}

/// A controller with I/O timeouts of 20 ms and `action`.
fn with_timeouts(dev: &FakeDevice, action: TimeoutAction) -> Arc<dyn Controller> {
    let (opts, mut global) = test_options("c0");
    global.timeout_us = 20_000;
    global.action_on_timeout = action;
    attach(dev, "PCIe", opts, global).0
}

#[test]
fn a_timed_out_command_is_aborted_and_fails_with_etimedout() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let c = with_timeouts(&dev, TimeoutAction::Abort);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    dev.lock().stall = true;
    let start = Instant::now();
    ch.submit(&cmd(1, IoOp::WriteZeroes, 0, 512)).unwrap();
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Error(libc::ETIMEDOUT))]);
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert_eq!(dev.lock().aborts.len(), 1);
    assert_eq!(c.info().ctrlrs[0].aborts, 1);
    assert_eq!(c.info().ctrlrs[0].resets, 0);
}

#[test]
fn a_command_still_there_after_its_abort_resets_the_controller_and_is_resubmitted() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let c = with_timeouts(&dev, TimeoutAction::Abort);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    {
        let mut d = dev.lock();
        d.stall = true;
        d.abort_works = false;
    }
    let data = pattern(512, 1);
    let mut buf = IoBuf::new(512, true);
    buf.bytes_mut().copy_from_slice(&data);
    let iov = [buf.iovec()];
    // SAFETY: `buf` outlives the request.
    unsafe { ch.submit(&rw(1, IoOp::Write, 512 * 3, &iov)) }.unwrap();
    // Abort after one timeout, reset after the next: then the device is fine again.
    let mut out = Vec::new();
    wait_for("the reset", || {
        ch.poll_batch(&mut out);
        c.info().ctrlrs[0].resets == 1
    });
    assert_eq!(dev.lock().aborts.len(), 1);
    dev.lock().stall = false;
    out.extend(poll_n(&mut *ch, 1 - out.len()));
    assert_eq!(out, [(1, IoStatus::Success)]);
    assert_eq!(&dev.lock().namespaces[&1].data[512 * 3..512 * 4], &data[..]);
    // The command went twice: before the reset and after it.
    assert_eq!(dev.lock().seen.iter().filter(|s| s.opcode == spec::NVM_WRITE).count(), 2);
}

#[test]
fn timeout_action_reset_resets_at_once() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let c = with_timeouts(&dev, TimeoutAction::Reset);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    dev.lock().stall = true;
    ch.submit(&cmd(1, IoOp::WriteZeroes, 0, 512)).unwrap();
    wait_for("the reset", || {
        ch.poll_batch(&mut Vec::new());
        c.info().ctrlrs[0].resets == 1
    });
    assert!(dev.lock().aborts.is_empty());
    dev.lock().stall = false;
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Success)]);
}

/// Buffers and iovecs of requests in flight, kept until they complete.
type Held = (Vec<IoBuf>, Vec<[libc::iovec; 1]>);

/// A controller of `trtype` over a 512 KiB namespace, its channel, and `n` 4 KiB writes of
/// patterns (`seed` on) through it (tags 0..n) that the device holds.
fn held_writes(
    trtype: &'static str,
    n: usize,
    seed: u8,
) -> (FakeDevice, Arc<dyn Controller>, Box<dyn IoChannel>, Held) {
    let dev = FakeDevice::new(&[(1, 512, 1024)]);
    let (opts, global) = test_options("c0");
    let (c, _) = attach(&dev, trtype, opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    let mut bufs: Vec<IoBuf> = (0..n)
        .map(|i| {
            let mut b = IoBuf::new(4096, i % 2 == 0);
            b.bytes_mut().copy_from_slice(&pattern(4096, seed.wrapping_add(i as u8)));
            b
        })
        .collect();
    let iovs: Vec<[libc::iovec; 1]> = bufs.iter_mut().map(|b| [b.iovec()]).collect();
    dev.lock().stall = true;
    for (i, iov) in iovs.iter().enumerate() {
        // SAFETY: the caller keeps `bufs` until the requests complete.
        unsafe { ch.submit(&rw(i as u32, IoOp::Write, 4096 * i as u64, iov)) }.unwrap();
    }
    poll_nothing(&mut *ch, Duration::from_millis(2));
    (dev, c, ch, (bufs, iovs))
}

/// Lets the device answer [`held_writes`]' `n` writes; checks each succeeded and landed.
fn release_held_writes(dev: &FakeDevice, ch: &mut dyn IoChannel, n: usize, seed: u8) {
    dev.lock().stall = false;
    let mut done = poll_n(ch, n);
    done.sort_by_key(|d| d.0);
    assert_eq!(done, (0..n as u32).map(|t| (t, IoStatus::Success)).collect::<Vec<_>>(), "no I/O failed");
    for i in 0..n {
        assert_eq!(
            &dev.lock().namespaces[&1].data[4096 * i..4096 * (i + 1)],
            &pattern(4096, seed.wrapping_add(i as u8))[..],
            "{i}"
        );
    }
}

#[test]
fn a_reset_under_io_loses_and_fails_nothing() {
    let (dev, c, mut ch, _held) = held_writes("PCIe", 32, 0);
    let queues = dev.lock().queues_made;
    c.reset().unwrap();
    release_held_writes(&dev, &mut *ch, 32, 0);
    // A new queue.
    assert_eq!(dev.lock().queues_made, queues + 1);
}

fn dhchap_key(fill: u8) -> fp_crypto::dhchap::DhchapSecret {
    fp_crypto::dhchap::DhchapSecret::new(None, &[fill; 32]).unwrap()
}

#[test]
fn new_keys_authenticate_the_admin_queue_and_then_the_io_queues_again_under_io() {
    let (dev, c, mut ch, _held) = held_writes("TCP", 8, 40);
    let queues = dev.lock().queues_made;
    // The subsystem changes the host's key; the host is given the same.
    dev.lock().auth_key = Some(dhchap_key(2));
    c.set_keys(Some(dhchap_key(2)), None).unwrap();
    assert_eq!(dev.lock().reauths, 1, "the admin queue authenticated again, in band");
    assert_eq!(dev.lock().io_reauths, [1], "then the channel's I/O queue");
    release_held_writes(&dev, &mut *ch, 8, 40);
    // The same queue (none connected anew), the controller not reset.
    assert_eq!(dev.lock().queues_made, queues);
    let info = c.info().ctrlrs[0].clone();
    assert_eq!((info.io_queues, info.resets, info.state), (1, 0, "enabled"));
    // Later reconnects use the new key.
    c.reset().unwrap();
    assert_eq!(c.info().ctrlrs[0].state, "enabled");
    // A controller key needs a host key; no key clears them and authenticates nothing.
    let e = c.set_keys(None, Some(dhchap_key(9))).unwrap_err();
    assert!(matches!(e, NvmeError::InvalidParam { field: "dhchap_ctrlr_key", .. }), "{e}");
    c.set_keys(None, None).unwrap();
    let d = dev.lock();
    assert_eq!((d.reauths, d.io_reauths.len()), (1, 1), "nothing authenticated");
    drop(d);
    // A key the subsystem does not have: the error says why, and the admin queue fails as
    // SPDK's does (a reset, with the new key; ctrlr_loss_timeout_sec 0 here: given up).
    let e = c.set_keys(Some(dhchap_key(3)), None).unwrap_err();
    assert!(matches!(e, NvmeError::Auth(_)) && e.to_string().contains("refused the host's key"), "{e}");
    assert_eq!(c.info().ctrlrs[0].state, "failed");
}

/// A controller of `trtype` with reconnect options (`loss` and `fast_fail` in test seconds,
/// attempts every test second), its namespace's channel, and one Write Zeroes (tag 1) the
/// device holds without answering; the device answers again once reachable.
fn one_stuck_command(
    trtype: &'static str,
    loss: i64,
    fast_fail: u32,
) -> (FakeDevice, Arc<dyn Controller>, Box<dyn IoChannel>) {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let (mut opts, global) = test_options("c0");
    opts.ctrlr_loss_timeout_sec = loss;
    opts.reconnect_delay_sec = u32::from(loss != 0);
    opts.fast_io_fail_timeout_sec = fast_fail;
    let (c, _) = attach(&dev, trtype, opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    dev.lock().stall = true;
    ch.submit(&cmd(1, IoOp::WriteZeroes, 0, 512)).unwrap();
    poll_nothing(&mut *ch, Duration::from_millis(2));
    dev.lock().stall = false;
    (dev, c, ch)
}

#[test]
fn io_waits_through_a_lost_connection_and_is_resubmitted_after_the_reconnect() {
    let (dev, c, mut ch) = one_stuck_command("TCP", -1, 0);
    dev.drop_connections(true);
    // New I/O while the target is away waits too.
    ch.submit(&cmd(2, IoOp::Flush, 0, 0)).unwrap();
    poll_nothing(&mut *ch, Duration::from_millis(50));
    assert_ne!(c.info().ctrlrs[0].state, "enabled");
    dev.up();
    let mut done = poll_n(&mut *ch, 2);
    done.sort_by_key(|d| d.0);
    assert_eq!(done, [(1, IoStatus::Success), (2, IoStatus::Success)]);
}

#[test]
fn a_queue_that_dies_alone_is_replaced_and_its_io_resubmitted() {
    let (dev, c, mut ch) = one_stuck_command("TCP", -1, 0);
    // The connections drop; the target stays reachable: the next poll sees its queue dead.
    dev.drop_connections(false);
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Success)]);
    assert!(c.info().ctrlrs[0].resets >= 1);
}

#[test]
fn fast_io_fail_fails_held_and_new_io_while_reconnecting_goes_on() {
    let (dev, c, mut ch) = one_stuck_command("TCP", -1, 4); // fast fail after 40 ms
    let start = Instant::now();
    dev.drop_connections(true);
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Error(libc::EIO))]);
    assert!(start.elapsed() >= Duration::from_millis(40), "{:?}", start.elapsed());
    // New I/O fails at once.
    ch.submit(&cmd(2, IoOp::Flush, 0, 0)).unwrap();
    assert_eq!(poll_n(&mut *ch, 1), [(2, IoStatus::Error(libc::EIO))]);
    // Back: I/O works again.
    dev.up();
    wait_for("the controller back", || c.info().ctrlrs[0].state == "enabled");
    let got = conformance::read_range(&mut *ch, 0, 512);
    assert_eq!(got.len(), 512);
}

#[test]
fn a_controller_given_up_fails_held_io_and_a_gone_device_says_enodev() {
    for (trtype, gone, errno) in [("TCP", false, libc::EIO), ("PCIe", true, libc::ENODEV)] {
        let (dev, c, mut ch) = one_stuck_command(trtype, 3, 0);
        dev.lock().down_gone = gone;
        dev.drop_connections(true);
        assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Error(errno))], "{trtype}");
        assert_eq!(c.info().ctrlrs[0].state, "failed");
        ch.submit(&cmd(2, IoOp::Flush, 0, 0)).unwrap();
        assert_eq!(poll_n(&mut *ch, 1), [(2, IoStatus::Error(errno))]);
    }
}

#[test]
fn detach_fails_the_io_of_channels_still_open() {
    let (_dev, c, mut ch) = one_stuck_command("PCIe", 0, 0);
    c.detach();
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Error(libc::EIO))]);
    drop(ch);
}

#[test]
fn closing_a_channel_deletes_its_queue() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let (opts, global) = test_options("c0");
    let (c, _) = attach(&dev, "PCIe", opts, global);
    let ns = c.namespaces()[0].clone();
    let chans: Vec<_> = (0..3).map(|_| ns.open_channel().unwrap()).collect();
    assert_eq!(c.info().ctrlrs[0].io_queues, 3);
    drop(chans);
    wait_for("three deletions", || dev.lock().queues_deleted.len() == 3);
    wait_for("the count", || c.info().ctrlrs[0].io_queues == 0);
    // The qids are reused.
    let _ch = ns.open_channel().unwrap();
    assert_eq!(c.info().ctrlrs[0].io_queues, 1);
}
