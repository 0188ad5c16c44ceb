//! Namespaces over the PCIe transport to the emulated controller (a thread as the device,
//! reaching memory through the DMA map): the bdev conformance suite, batching, a reset under
//! I/O, timeouts, hostile completions, a device that disappears, namespace events.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fp_bdev::conformance::{self, cmd, read_range, rw, write_range, IoBuf};
use fp_bdev::{AlignedBuf, BlockDevice, IoChannel, IoOp, IoStatus};

use super::core_fake::{test_options, wait_for, EventLog};
use crate::ctrlr::{self, Controller, ControllerOptions, GlobalOptions, NamespaceEvent, TimeoutAction};
use crate::emu::{EmuConfig, EmuNamespace, EmulatedController, Fault};
use crate::pcie::{PcieOptions, PcieTransport};

/// Controllers the conformance suite's devices belong to: kept attached until the test ends.
static KEEP: Mutex<Vec<Arc<dyn Controller>>> = Mutex::new(Vec::new());

fn emu(cfg: EmuConfig) -> Arc<EmulatedController> {
    EmulatedController::new(cfg)
}

fn attach_emu(
    e: &Arc<EmulatedController>,
    pcie: PcieOptions,
    opts: ControllerOptions,
    global: GlobalOptions,
) -> (Arc<dyn Controller>, EventLog) {
    let log: EventLog = Arc::default();
    let l = log.clone();
    let t = PcieTransport::new(e.clone(), pcie);
    let c = ctrlr::attach(t, opts, global, Box::new(move |ev| l.lock().unwrap().push(ev))).expect("attach");
    (c, log)
}

fn poll_n(ch: &mut dyn IoChannel, n: usize) -> Vec<(u32, IoStatus)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        ch.poll_batch(&mut out);
        assert!(std::time::Instant::now() < deadline, "{} of {n} completions: {out:?}", out.len());
    }
    out
}

#[test]
fn namespaces_over_the_emulated_controller_pass_the_bdev_conformance_suite() {
    for (block_size, shadow, sgl) in [(512, true, true), (4096, false, false)] {
        let make = move || -> Arc<dyn BlockDevice> {
            let cfg = EmuConfig {
                namespaces: vec![EmuNamespace { nsid: 1, block_size, num_blocks: 256 }],
                mdts: 2,
                ..EmuConfig::default()
            };
            let e = emu(cfg);
            let (opts, global) = test_options("emu");
            let (c, _) = attach_emu(
                &e,
                PcieOptions { shadow_doorbells: shadow, sgl, ..Default::default() },
                opts,
                global,
            );
            let ns = c.namespaces()[0].clone();
            KEEP.lock().unwrap().push(c);
            ns
        };
        conformance::run_suite(&make, conformance::Storage::Keeps);
    }
}

#[test]
fn a_round_of_commands_rings_one_doorbell() {
    let e = emu(EmuConfig::default());
    let (opts, global) = test_options("emu");
    let pcie = PcieOptions { shadow_doorbells: false, ..Default::default() };
    let (c, _) = attach_emu(&e, pcie, opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    // Registered memory: no bouncing.
    let mut buf = AlignedBuf::zeroed(32 * 4096);
    let registered = fp_bdev::dma::memory_map().register(buf.as_ptr() as usize, buf.len());
    assert!(registered.is_ok());
    let iovs: Vec<[libc::iovec; 1]> = buf
        .as_mut_slice()
        .chunks_mut(4096)
        .map(|c| [libc::iovec { iov_base: c.as_mut_ptr().cast(), iov_len: 4096 }])
        .collect();
    let before = e.counters().sq_doorbells[1];
    for (i, iov) in iovs.iter().enumerate() {
        // SAFETY: `buf` outlives the requests.
        unsafe { ch.submit(&rw(i as u32, IoOp::Read, 4096 * i as u64, iov)) }.unwrap();
    }
    assert_eq!(poll_n(&mut *ch, 32).len(), 32);
    assert_eq!(e.counters().sq_doorbells[1] - before, 1, "32 reads in one round, one SQ doorbell");
    // The counters are out as soon as the channel ran dry.
    let s = c.stats();
    assert_eq!((s.submitted, s.completed, s.bounced), (32, 32, 0));
    drop(ch);
    fp_bdev::dma::memory_map().unregister(buf.as_ptr() as usize, buf.len()).unwrap();
}

#[test]
fn a_reset_under_io_resubmits_everything_over_pcie() {
    let e = emu(EmuConfig::default());
    let (opts, global) = test_options("emu");
    let (c, _) = attach_emu(&e, PcieOptions::default(), opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    let mut bufs: Vec<IoBuf> = (0..16)
        .map(|i| {
            let mut b = IoBuf::new(4096, true);
            b.bytes_mut().fill(i as u8 + 1);
            b
        })
        .collect();
    let iovs: Vec<[libc::iovec; 1]> = bufs.iter_mut().map(|b| [b.iovec()]).collect();
    e.set_fault(Fault::StopAnswering);
    for (i, iov) in iovs.iter().enumerate() {
        // SAFETY: `bufs` outlive the requests.
        unsafe { ch.submit(&rw(i as u32, IoOp::Write, 4096 * i as u64, iov)) }.unwrap();
    }
    let mut out = Vec::new();
    for _ in 0..100 {
        ch.poll_batch(&mut out);
    }
    assert!(out.is_empty());
    let enables = e.counters().enables;
    e.set_fault(Fault::None);
    c.reset().unwrap();
    assert_eq!(e.counters().enables, enables + 1);
    let mut done = poll_n(&mut *ch, 16);
    done.sort_by_key(|d| d.0);
    assert_eq!(done, (0..16).map(|t| (t, IoStatus::Success)).collect::<Vec<_>>());
    for i in 0..16 {
        assert_eq!(e.read_namespace(1, 4096 * i, 4096).unwrap(), vec![i as u8 + 1; 4096], "{i}");
    }
}

#[test]
fn a_command_the_device_sits_on_is_aborted() {
    let e = emu(EmuConfig::default());
    let (opts, mut global) = test_options("emu");
    global.timeout_us = 20_000;
    global.action_on_timeout = TimeoutAction::Abort;
    let (c, _) = attach_emu(&e, PcieOptions::default(), opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    e.set_fault(Fault::StopAnswering);
    ch.submit(&cmd(1, IoOp::WriteZeroes, 0, 512)).unwrap();
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Error(libc::ETIMEDOUT))]);
    assert_eq!(e.counters().aborts, 1);
    e.set_fault(Fault::None);
    let data = vec![0x5a; 512];
    write_range(&mut *ch, 0, &data);
    assert_eq!(read_range(&mut *ch, 0, 512), data);
}

#[test]
fn hostile_completions_kill_the_queue_and_the_io_is_resubmitted_after_a_reset() {
    for fault in [Fault::UnknownCid, Fault::DuplicateCid, Fault::SqHeadBeyondTail] {
        let e = emu(EmuConfig::default());
        let (opts, global) = test_options("emu");
        let (c, _) = attach_emu(&e, PcieOptions::default(), opts, global);
        let mut ch = c.namespaces()[0].open_channel().unwrap();
        write_range(&mut *ch, 0, &[7; 512]);
        e.set_fault(fault);
        let mut buf = IoBuf::new(512, true);
        let iov = [buf.iovec()];
        // SAFETY: `buf` outlives the request.
        unsafe { ch.submit(&rw(1, IoOp::Read, 0, &iov)) }.unwrap();
        // The queue dies; the controller resets; the device behaves again after it.
        let mut out = Vec::new();
        wait_for("the reset", || {
            ch.poll_batch(&mut out);
            c.info().ctrlrs[0].resets >= 1
        });
        e.set_fault(Fault::None);
        // A duplicate completion may have completed the read before the queue died.
        if out.is_empty() {
            out = poll_n(&mut *ch, 1);
        }
        assert_eq!(out, [(1, IoStatus::Success)], "{fault:?}");
        assert_eq!(buf.bytes(), &[7; 512], "{fault:?}");
        assert_eq!(read_range(&mut *ch, 0, 512), vec![7; 512], "{fault:?}");
    }
}

#[test]
fn a_device_that_disappears_fails_io_with_enodev() {
    let e = emu(EmuConfig::default());
    let (opts, mut global) = test_options("emu");
    global.timeout_us = 20_000;
    global.action_on_timeout = TimeoutAction::Reset;
    let (c, log) = attach_emu(&e, PcieOptions::default(), opts, global);
    let mut ch = c.namespaces()[0].open_channel().unwrap();
    e.set_fault(Fault::Disappear);
    ch.submit(&cmd(1, IoOp::WriteZeroes, 0, 512)).unwrap();
    assert_eq!(poll_n(&mut *ch, 1), [(1, IoStatus::Error(libc::ENODEV))]);
    assert_eq!(c.info().ctrlrs[0].state, "failed");
    wait_for("the removal", || !log.lock().unwrap().is_empty());
    assert!(matches!(log.lock().unwrap()[0], NamespaceEvent::Removed { nsid: 1 }));
    c.detach();
}

#[test]
fn namespace_changes_on_the_device_reach_the_callback() {
    let e = emu(EmuConfig::default());
    let (opts, global) = test_options("emu");
    let (c, log) = attach_emu(&e, PcieOptions::default(), opts, global);
    assert!(e.resize_namespace(1, 4096));
    wait_for("the resize", || !log.lock().unwrap().is_empty());
    assert!(matches!(log.lock().unwrap()[0], NamespaceEvent::Resized { nsid: 1, num_blocks: 4096 }));
    e.add_namespace(EmuNamespace { nsid: 2, block_size: 4096, num_blocks: 16 });
    wait_for("the addition", || log.lock().unwrap().len() == 2);
    let ns2 = c.namespaces()[1].clone();
    assert_eq!(ns2.name(), "emun2");
    let mut ch = ns2.open_channel().unwrap();
    write_range(&mut *ch, 4096, &[3; 4096]);
    assert_eq!(e.read_namespace(2, 4096, 4096).unwrap(), vec![3; 4096]);
}
