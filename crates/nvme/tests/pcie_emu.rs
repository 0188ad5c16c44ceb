//! The PCIe transport against the emulated controller: enable, queues, PRP lists, SGLs, bounce
//! buffers, batched and shadow doorbells, asynchronous events, shutdown, and every hostile
//! controller mode failing the queue with an error while the process lives on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::dma::memory_map;
use fp_bdev::{AlignedBuf, Iovecs};
use fp_nvme::cmd;
use fp_nvme::emu::{EmuConfig, EmuNamespace, EmulatedController, Fault};
use fp_nvme::pcie::{PciFunction, PcieAdmin, PcieIoQueue, PcieOptions, PcieTransport};
use fp_nvme::transport::{AdminData, AdminQueue, IoQueue, Transport};
use fp_nvme::NvmeError;
use fp_nvme_spec::registers;
use fp_nvme_spec::Status;

const T: Duration = Duration::from_secs(5);

type Emu = PcieTransport<EmulatedController>;

fn setup(cfg: EmuConfig, opts: PcieOptions) -> (Arc<EmulatedController>, Emu, PcieAdmin<EmulatedController>) {
    let emu = EmulatedController::new(cfg);
    let t = PcieTransport::new(emu.clone(), opts);
    let admin = t.connect_admin(32, T).expect("enable");
    (emu, t, admin)
}

/// A buffer registered in the DMA map for as long as it lives.
struct Registered(AlignedBuf);

impl Registered {
    fn new(len: usize) -> Registered {
        let b = AlignedBuf::zeroed(len);
        memory_map().register(b.as_ptr() as usize, b.len()).unwrap();
        Registered(b)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        memory_map().unregister(self.0.as_ptr() as usize, self.0.len()).unwrap();
    }
}

fn iov(p: *const u8, len: usize) -> libc::iovec {
    libc::iovec { iov_base: p as *mut libc::c_void, iov_len: len }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Polls until `n` completions came (or the deadline), returning them.
fn reap(q: &mut PcieIoQueue<EmulatedController>, n: usize) -> Result<Vec<(u32, Status)>, NvmeError> {
    let mut out = Vec::new();
    let deadline = Instant::now() + T;
    while out.len() < n {
        q.poll(&mut out)?;
        assert!(Instant::now() < deadline, "only {} of {n} completions", out.len());
        std::thread::yield_now();
    }
    Ok(out)
}

/// Submits one command and waits for it.
fn run(q: &mut PcieIoQueue<EmulatedController>, sqe: &fp_nvme_spec::Sqe, iov: &[libc::iovec]) -> Status {
    // SAFETY: the buffers outlive the completion awaited below.
    q.submit(sqe, unsafe { Iovecs::from_slice(iov) }, 7).unwrap();
    q.flush();
    let c = reap(q, 1).unwrap();
    assert_eq!(c[0].0, 7);
    c[0].1
}

#[test]
fn enable_identify_and_queue_lifecycle() {
    let (emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    assert_eq!(t.trtype(), "PCIe");
    assert!(t.traddr().starts_with("emu:"));
    assert_eq!(admin.cntlid(), 1);
    let mut id = vec![0u8; 4096];
    let c = admin
        .execute(cmd::identify(fp_nvme_spec::identify::CNS_NAMESPACE, 1), AdminData::FromDevice(&mut id), T)
        .unwrap();
    assert!(c.status.is_success());
    assert_eq!(u64::from_le_bytes(id[0..8].try_into().unwrap()), 2048);
    assert_eq!(id[130], 9, "512-byte blocks");
    let c = admin
        .execute(
            cmd::set_features(fp_nvme_spec::features::FID_NUMBER_OF_QUEUES, 0x000f_000f),
            AdminData::None,
            T,
        )
        .unwrap();
    assert_eq!(c.dw0, 15 | (15 << 16));
    assert_eq!(admin.get_property(registers::VS, false).unwrap(), 0x0002_0000);
    let q = t.connect_io(&mut admin, 1, 64).unwrap();
    assert_eq!(q.qid(), 1);
    // A queue ID the controller does not have is refused with its status.
    match t.connect_io(&mut admin, 200, 64) {
        Err(NvmeError::Command { status, .. }) => {
            assert_eq!(status.sc, fp_nvme_spec::SC_INVALID_QUEUE_IDENTIFIER)
        }
        other => panic!("{:?}", other.err()),
    }
    drop(q);
    t.disconnect_io(&mut admin, 1).unwrap();
    assert!(t.disconnect_io(&mut admin, 1).is_err(), "already deleted");
    // Enable again (a reset): works, counted.
    let mut admin = t.connect_admin(32, T).unwrap();
    assert_eq!(emu.counters().enables, 2);
    assert!(emu.counters().doorbell_buffer_configs >= 2);
    t.shutdown(&mut admin, T);
    let csts = admin.get_property(registers::CSTS, false).unwrap() as u32;
    assert_eq!(csts & registers::CSTS_SHST_MASK, registers::CSTS_SHST_COMPLETE);
}

#[test]
fn prp_lists_carry_data_both_ways() {
    let (emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    let mut q = t.connect_io(&mut admin, 1, 64).unwrap();
    let buf = Registered::new(64 * 1024);
    let data = pattern(40 * 1024, 3);
    let p = buf.0.as_ptr() as *mut u8;
    // SAFETY: inside the buffer.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(512), data.len()) };
    // 40 KiB from an offset of 512: PRP1 mid-page and a PRP list of 10 entries.
    assert!(run(&mut q, &cmd::read_write(true, 1, 16, 80, false), &[iov(p.wrapping_add(512), data.len())])
        .is_success());
    assert_eq!(emu.read_namespace(1, 16 * 512, data.len()).unwrap(), data);
    // Read back through three page-aligned pieces out of order.
    let back = Registered::new(64 * 1024);
    let b = back.0.as_ptr() as *mut u8;
    let pieces =
        [iov(b.wrapping_add(8192 + 3584), 512), iov(b, 16384), iov(b.wrapping_add(32768), 40 * 1024 - 16896)];
    assert!(run(&mut q, &cmd::read_write(false, 1, 16, 80, false), &pieces).is_success());
    let mut got = Vec::new();
    for v in &pieces {
        // SAFETY: the piece is inside `back`.
        got.extend_from_slice(unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) });
    }
    assert_eq!(got, data);
    assert_eq!(q.stats().bounced, 0);
    // Errors come back as statuses: past the end, a namespace that is not there.
    assert_eq!(
        run(&mut q, &cmd::read_write(false, 1, 2047, 2, false), &[iov(b, 1024)]).sc,
        fp_nvme_spec::SC_LBA_OUT_OF_RANGE
    );
    assert_eq!(run(&mut q, &cmd::flush(9), &[]).sc, fp_nvme_spec::SC_INVALID_NAMESPACE);
    // Write Zeroes and Deallocate clear blocks.
    assert!(run(&mut q, &cmd::write_zeroes(1, 16, 8, false), &[]).is_success());
    assert_eq!(emu.read_namespace(1, 16 * 512, 4096).unwrap(), vec![0; 4096]);
    // SAFETY: inside `back`.
    unsafe { std::ptr::copy_nonoverlapping(cmd::dsm_range(24, 8).as_ptr(), b, 16) };
    assert!(run(&mut q, &cmd::deallocate(1, 1), &[iov(b, 16)]).is_success());
    assert_eq!(emu.read_namespace(1, 24 * 512, 4096).unwrap(), vec![0; 4096]);
    assert_eq!(emu.read_namespace(1, 32 * 512, 512).unwrap(), data[16 * 512..17 * 512]);
}

#[test]
fn unaligned_pieces_go_as_sgls_or_bounce() {
    for sgl in [true, false] {
        let (emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions { sgl, ..PcieOptions::default() });
        let mut q = t.connect_io(&mut admin, 1, 64).unwrap();
        let buf = Registered::new(16 * 1024);
        let p = buf.0.as_ptr() as *mut u8;
        let data = pattern(2048, 9);
        // SAFETY: inside the buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(100), 2048) };
        // Two pieces, the second not on a page boundary: PRPs cannot say it.
        let pieces = [iov(p.wrapping_add(100), 1000), iov(p.wrapping_add(1100), 1048)];
        assert!(run(&mut q, &cmd::read_write(true, 1, 0, 4, false), &pieces).is_success());
        assert_eq!(emu.read_namespace(1, 0, 2048).unwrap(), data);
        let out = Registered::new(16 * 1024);
        let o = out.0.as_ptr() as *mut u8;
        let back = [iov(o.wrapping_add(7), 1500), iov(o.wrapping_add(5000), 548)];
        assert!(run(&mut q, &cmd::read_write(false, 1, 0, 4, false), &back).is_success());
        // SAFETY: inside `out`.
        let (a, b) = unsafe {
            (std::slice::from_raw_parts(o.add(7), 1500), std::slice::from_raw_parts(o.add(5000), 548))
        };
        assert_eq!([a, b].concat(), data);
        assert_eq!(q.stats().bounced, if sgl { 0 } else { 2 }, "sgl {sgl}");
    }
}

#[test]
fn unregistered_memory_is_bounced_and_unreachable_to_the_device() {
    let (emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    let mut q = t.connect_io(&mut admin, 1, 64).unwrap();
    let mut plain = vec![0u8; 8192];
    plain[..4096].copy_from_slice(&pattern(4096, 1));
    assert!(run(&mut q, &cmd::read_write(true, 1, 100, 8, false), &[iov(plain.as_ptr(), 4096)]).is_success());
    assert_eq!(emu.read_namespace(1, 100 * 512, 4096).unwrap(), plain[..4096]);
    assert!(run(&mut q, &cmd::read_write(false, 1, 100, 8, false), &[iov(plain[4096..].as_ptr(), 4096)])
        .is_success());
    assert_eq!(plain[4096..], plain[..4096]);
    assert_eq!(q.stats().bounced, 2);
    // The device itself cannot reach memory outside the map: a command pointing there by
    // hand (PRPs set, as a buggy driver might) fails with Data Transfer Error. Sent through
    // the admin queue's Identify with a raw PRP.
    let mut sqe = cmd::identify(fp_nvme_spec::identify::CNS_CONTROLLER, 0);
    sqe.set_prp(0x7fff_0000_0000, 0);
    let c = admin.execute(sqe, AdminData::None, T).unwrap();
    assert_eq!(c.status.sc, fp_nvme_spec::SC_DATA_TRANSFER_ERROR);
}

#[test]
fn a_batch_rings_one_doorbell() {
    let cfg = EmuConfig { shadow_doorbells: false, ..EmuConfig::default() };
    let (emu, t, mut admin) = setup(cfg, PcieOptions::default());
    let mut q = t.connect_io(&mut admin, 1, 64).unwrap();
    let buf = Registered::new(32 * 4096);
    for i in 0..32u32 {
        let p = buf.0.as_ptr().wrapping_add(i as usize * 4096);
        // SAFETY: the buffer outlives the completions.
        let v = unsafe { Iovecs::from_slice(&[iov(p, 4096)]) };
        q.submit(&cmd::read_write(true, 1, u64::from(i) * 8, 8, false), v, i).unwrap();
    }
    q.flush();
    q.flush();
    let mut done = reap(&mut q, 32).unwrap();
    done.sort_by_key(|d| d.0);
    assert!(done.iter().enumerate().all(|(i, d)| d.0 == i as u32 && d.1.is_success()));
    let c = emu.counters();
    assert_eq!(c.sq_doorbells[1], 1, "one SQ doorbell for 32 commands");
    assert!(c.cq_doorbells[1] >= 1 && c.cq_doorbells[1] <= 32);
    assert_eq!(q.stats().doorbells, c.sq_doorbells[1] + c.cq_doorbells[1]);
}

#[test]
fn shadow_doorbells_skip_register_writes_the_controller_does_not_need() {
    let (emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    assert_eq!(emu.counters().doorbell_buffer_configs, 1);
    let mut q = t.connect_io(&mut admin, 1, 64).unwrap();
    let buf = Registered::new(4096);
    let rounds = 2000u32;
    for i in 0..rounds {
        // SAFETY: the buffer outlives the completion.
        let v = unsafe { Iovecs::from_slice(&[iov(buf.0.as_ptr(), 4096)]) };
        q.submit(&cmd::read_write(i % 2 == 0, 1, 0, 8, false), v, i).unwrap();
        q.flush();
        reap(&mut q, 1).unwrap();
    }
    let c = emu.counters();
    // The controller polls the shadow page while busy and asks for a register write only
    // before it sleeps; the completion queue's head almost never needs one. The emulator sets
    // the CQ's event index from the shadow head it last read, so when the host's head update
    // races its post, the next update crosses the index and the host rightly writes the
    // register (seen once in 2,000 rounds on a loaded 2-core CI run). How many rounds found
    // the controller asleep depends on the scheduler, so only the bounds are certain.
    assert!(c.sq_doorbells[1] <= u64::from(rounds));
    assert!(c.cq_doorbells[1] <= u64::from(rounds / 100), "CQ heads go to the shadow: {c:?}");
    assert_eq!(q.stats().doorbells, c.sq_doorbells[1]);
    assert_eq!(c.io_commands, u64::from(rounds));
    // Without shadows every round writes both registers.
    let (emu2, t2, mut admin2) =
        setup(EmuConfig::default(), PcieOptions { shadow_doorbells: false, ..PcieOptions::default() });
    assert_eq!(emu2.counters().doorbell_buffer_configs, 0);
    let mut q2 = t2.connect_io(&mut admin2, 1, 64).unwrap();
    for i in 0..10 {
        q2.submit(&cmd::flush(1), Iovecs::NONE, i).unwrap();
        q2.flush();
        reap(&mut q2, 1).unwrap();
    }
    assert_eq!(emu2.counters().sq_doorbells[1], 10);
    assert_eq!(emu2.counters().cq_doorbells[1], 10);
}

#[test]
fn a_queue_made_again_with_a_used_id_does_not_inherit_its_shadow_doorbells() {
    // The old queue leaves its tail and the controller's event index at 37 in the shadow
    // pages; the new queue's tail starts at 0 again, and its first commands must still reach
    // the controller (QEMU's never looked at them in the guest before the entries were cleared).
    let (_emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    let buf = Registered::new(4096);
    let io = [iov(buf.0.as_ptr(), 4096)];
    let mut q = t.connect_io(&mut admin, 1, 64).unwrap();
    for _ in 0..37 {
        assert!(run(&mut q, &cmd::read_write(false, 1, 0, 8, false), &io).is_success());
    }
    drop(q);
    t.disconnect_io(&mut admin, 1).unwrap();
    let mut q = t.connect_io(&mut admin, 1, 64).unwrap();
    for _ in 0..3 {
        assert!(run(&mut q, &cmd::read_write(false, 1, 0, 8, false), &io).is_success());
    }
}

#[test]
fn namespace_changes_raise_an_async_event() {
    let (emu, _t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    admin.submit_async_event_request().unwrap();
    let mut ev = Vec::new();
    admin.poll_async_events(&mut ev).unwrap();
    assert!(ev.is_empty());
    assert!(emu.resize_namespace(1, 4096));
    let deadline = Instant::now() + T;
    while ev.is_empty() {
        admin.poll_async_events(&mut ev).unwrap();
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
    // Notice (2), Namespace Attribute Changed (0), log page 04h.
    assert_eq!(ev[0].dw0, 0x0004_0002);
    let mut log = vec![0u8; 4096];
    let c = admin
        .execute(
            cmd::get_log_page(fp_nvme_spec::log_page::LID_CHANGED_NS, 0xffff_ffff, 4096, 0),
            AdminData::FromDevice(&mut log),
            T,
        )
        .unwrap();
    assert!(c.status.is_success());
    assert_eq!(u32::from_le_bytes(log[0..4].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(log[4..8].try_into().unwrap()), 0);
    let mut id = vec![0u8; 4096];
    admin
        .execute(cmd::identify(fp_nvme_spec::identify::CNS_NAMESPACE, 1), AdminData::FromDevice(&mut id), T)
        .unwrap();
    assert_eq!(u64::from_le_bytes(id[0..8].try_into().unwrap()), 4096);
    // A commands' completion in between does not disturb the outstanding request count.
    let c = admin.execute(cmd::keep_alive(), AdminData::None, T).unwrap();
    assert!(c.status.is_success());
    assert_eq!(emu.counters().keep_alives, 1);
}

/// Submits two writes under `fault` and returns the poll result and what drain gives back.
fn under_fault(
    fault: Fault,
) -> (Arc<EmulatedController>, PcieIoQueue<EmulatedController>, PcieAdmin<EmulatedController>) {
    let (emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    let mut q = t.connect_io(&mut admin, 1, 16).unwrap();
    // One good command first.
    assert!(run(&mut q, &cmd::flush(1), &[]).is_success());
    emu.set_fault(fault);
    for i in 0..2 {
        q.submit(&cmd::flush(1), Iovecs::NONE, 100 + i).unwrap();
    }
    q.flush();
    (emu, q, admin)
}

/// Polls until the queue fails; the error and the tags that completed before it.
fn poll_until_err(q: &mut PcieIoQueue<EmulatedController>) -> (NvmeError, Vec<u32>) {
    let deadline = Instant::now() + T;
    let mut out = Vec::new();
    loop {
        if let Err(e) = q.poll(&mut out) {
            return (e, out.iter().map(|c| c.0).collect());
        }
        assert!(Instant::now() < deadline, "the queue never failed; completions {out:?}");
        std::thread::yield_now();
    }
}

#[test]
fn hostile_completions_kill_the_queue_and_every_tag_comes_back() {
    for fault in [Fault::UnknownCid, Fault::DuplicateCid, Fault::SqHeadBeyondTail] {
        let (_emu, mut q, _admin) = under_fault(fault);
        let (e, completed) = poll_until_err(&mut q);
        assert!(matches!(e, NvmeError::Protocol(_)), "{fault:?}: {e}");
        assert_eq!(e.errno(), -libc::EPROTO);
        // Dead from now on: polls fail, submits are refused.
        assert!(q.poll(&mut Vec::new()).is_err());
        assert!(q.submit(&cmd::flush(1), Iovecs::NONE, 1).is_err());
        // Every tag comes back once: completed before the failure, or drained.
        let mut tags = completed;
        q.drain(&mut tags);
        tags.sort_unstable();
        assert_eq!(tags, vec![100, 101], "{fault:?}");
        assert_eq!(q.in_flight(), 0);
    }
}

#[test]
fn a_silent_or_phase_confused_controller_leaves_commands_to_the_timeout_path() {
    for fault in [Fault::StopAnswering, Fault::WrongPhase] {
        let (emu, mut q, mut admin) = under_fault(fault);
        let deadline = Instant::now() + T;
        while emu.counters().io_commands < 3 {
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        let mut out = Vec::new();
        for _ in 0..100 {
            q.poll(&mut out).unwrap();
        }
        assert!(out.is_empty(), "{fault:?}");
        assert_eq!(q.in_flight(), 2);
        let mut expired = Vec::new();
        q.expired(fp_bdev::clock::ticks::now(), &mut expired);
        expired.sort_unstable_by_key(|e| e.1);
        assert_eq!(expired.iter().map(|e| e.1).collect::<Vec<_>>(), vec![100, 101]);
        if fault == Fault::StopAnswering {
            // Abort finds a held command: it completes with Command Abort Requested.
            let c = admin.execute(cmd::abort(1, expired[0].0), AdminData::None, T).unwrap();
            assert_eq!(c.dw0 & 1, 0, "aborted");
            let done = reap(&mut q, 1).unwrap();
            assert_eq!(done[0], (100, Status::generic(fp_nvme_spec::SC_ABORT_REQUESTED)));
            assert_eq!(emu.counters().aborts, 1);
        }
        let mut tags = Vec::new();
        q.drain(&mut tags);
        assert!(tags.contains(&101));
    }
}

#[test]
fn a_removed_or_failed_device_fails_the_queue_as_gone() {
    for fault in [Fault::Disappear, Fault::FatalStatus] {
        let (emu, mut q, mut admin) = under_fault(fault);
        let (e, completed) = poll_until_err(&mut q);
        assert!(completed.is_empty());
        assert!(matches!(e, NvmeError::Gone(_)), "{fault:?}: {e}");
        assert_eq!(e.errno(), -libc::ENODEV);
        let mut tags = Vec::new();
        q.drain(&mut tags);
        assert_eq!(tags.len(), 2);
        // The admin side and a new enable say so too.
        let t = PcieTransport::new(emu.clone(), PcieOptions::default());
        let r = admin.execute(cmd::keep_alive(), AdminData::None, Duration::from_millis(50));
        assert!(matches!(r, Err(NvmeError::Gone(_))), "{fault:?}: {:?}", r.err());
        assert!(matches!(t.connect_admin(32, T), Err(NvmeError::Gone(_))));
        if fault == Fault::Disappear {
            assert!(matches!(admin.get_property(registers::CSTS, false), Err(NvmeError::Gone(_))));
        }
    }
}

#[test]
fn a_controller_back_from_a_fault_works_after_a_reset() {
    let (emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    let q = t.connect_io(&mut admin, 1, 16).unwrap();
    emu.set_fault(Fault::FatalStatus);
    let deadline = Instant::now() + T;
    while admin.get_property(registers::CSTS, false).unwrap() as u32 & registers::CSTS_CFS == 0 {
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
    drop(q);
    emu.set_fault(Fault::None);
    assert!(emu.reset_function().unwrap());
    let mut admin = t.connect_admin(32, T).unwrap();
    let mut q = t.connect_io(&mut admin, 1, 16).unwrap();
    assert!(run(&mut q, &cmd::flush(1), &[]).is_success());
}

#[test]
fn namespaces_of_other_block_sizes() {
    let cfg = EmuConfig {
        namespaces: vec![
            EmuNamespace { nsid: 1, block_size: 4096, num_blocks: 64 },
            EmuNamespace { nsid: 3, block_size: 512, num_blocks: 8 },
        ],
        ..EmuConfig::default()
    };
    let (emu, t, mut admin) = setup(cfg, PcieOptions::default());
    let mut list = vec![0u8; 4096];
    admin
        .execute(
            cmd::identify(fp_nvme_spec::identify::CNS_ACTIVE_NS_LIST, 0),
            AdminData::FromDevice(&mut list),
            T,
        )
        .unwrap();
    assert_eq!(&list[..12], &[1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
    let mut q = t.connect_io(&mut admin, 2, 8).unwrap();
    let buf = Registered::new(8192);
    let data = pattern(8192, 5);
    // SAFETY: inside the buffer.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.0.as_ptr() as *mut u8, 8192) };
    assert!(run(&mut q, &cmd::read_write(true, 1, 10, 2, true), &[iov(buf.0.as_ptr(), 8192)]).is_success());
    assert_eq!(emu.read_namespace(1, 40960, 8192).unwrap(), data);
}

#[test]
fn a_stale_completion_is_refused_after_its_slot_was_reused() {
    let (emu, t, mut admin) = setup(EmuConfig::default(), PcieOptions::default());
    let mut q = t.connect_io(&mut admin, 1, 8).unwrap();
    emu.set_fault(Fault::Scripted);
    // A completion as the device writes it, first lap (phase tag 1).
    let cqe = |cid: u16, sqhd: u16| {
        let mut b = [0u8; 16];
        b[8..10].copy_from_slice(&sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&1u16.to_le_bytes());
        b[12..14].copy_from_slice(&cid.to_le_bytes());
        b[14..16].copy_from_slice(&1u16.to_le_bytes());
        b
    };
    let submit = |q: &mut PcieIoQueue<EmulatedController>, tag: u32| {
        q.submit(&cmd::flush(1), Iovecs::NONE, tag).unwrap();
        q.flush();
        let mut e = Vec::new();
        q.expired(u64::MAX, &mut e);
        e.iter().find(|c| c.1 == tag).unwrap().0
    };
    let first = submit(&mut q, 1);
    emu.inject_completion(1, cqe(first, 1));
    assert!(emu.wait_injected(T));
    assert_eq!(reap(&mut q, 1).unwrap(), vec![(1, Status::SUCCESS)]);
    // The slot is used again, under another command id; the old id completing again is a
    // duplicate, not the new command's completion.
    let second = submit(&mut q, 2);
    assert_ne!(first, second);
    emu.inject_completion(1, cqe(first, 2));
    assert!(emu.wait_injected(T));
    let (e, completed) = poll_until_err(&mut q);
    assert!(matches!(e, NvmeError::Protocol(_)), "{e}");
    assert!(completed.is_empty());
    let mut tags = Vec::new();
    q.drain(&mut tags);
    assert_eq!(tags, vec![2]);
}
