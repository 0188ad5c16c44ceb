//! Fuzz the NVMe PCIe driver's I/O queue (`fp_nvme::pcie::PcieIoQueue`) against a hostile
//! device: an emulated controller (`fp_nvme::emu::EmulatedController`) is enabled and gives an
//! I/O queue pair, then stops answering I/O by itself (`Fault::Scripted`) and the input writes
//! its completion entries (command IDs, SQ heads, SQ IDs, statuses, phase tags, or 16 raw bytes)
//! and its registers (CSTS) while the driver submits, flushes, polls and scans for timeouts.
//!
//! Input encoding (missing bytes read as 0):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | setup `s`: queue entries `2 + (s & 31)`; `s & 32` shadow doorbells offered; `s & 64` SGLs offered |
//!
//! then records until the input ends, a control byte `c`, `c % 7`:
//!
//! | op | bytes after `c` | meaning |
//! |---|---|---|
//! | 0 | 1: `k` | submit: `k & 3` = 0 flush, 1 a 4 KiB write from registered memory, 2 a read into two pieces PRPs cannot describe (SGL or bounce), 3 a read into unregistered memory (bounce) |
//! | 1 | 0 | flush (the SQ doorbell) |
//! | 2 | 0 | poll |
//! | 3 | 4: `cid`, `sqhd`, `status`, `flags` | a completion: for `cid < 128` the command ID of the `cid % n`-th of the `n` commands in flight (slot order; raw `cid` when none is), else the raw ID `cid & 127` (with the table's generation bits, mostly stale); SQ head `sqhd % (entries + 1)`, status code `status`, `flags & 1` wrong phase, `flags & 2` wrong SQ ID |
//! | 4 | 16 | a completion of 16 raw bytes (phase tag included) |
//! | 5 | 1: `v` | CSTS := all ones (`v % 3 == 0`), RDY + CFS (1), RDY (2) |
//! | 6 | 0 | the timeout scan (`expired`) |
//!
//! Checked: no panic and no memory error; a poll returns only tags in flight, each once; a queue
//! that failed fails every later poll; at the end every submitted tag came back exactly once,
//! by a completion or by `drain`.
#![no_main]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::dma::memory_map;
use fp_bdev::{AlignedBuf, Iovecs};
use fp_nvme::cmd;
use fp_nvme::emu::{EmuConfig, EmulatedController, Fault};
use fp_nvme::pcie::{PcieOptions, PcieTransport};
use fp_nvme_spec::registers;
use fp_nvme::transport::{IoQueue, Transport};
use libfuzzer_sys::fuzz_target;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
}

/// Registered memory for the driver's buffers, unregistered when dropped.
struct Registered(AlignedBuf);

impl Drop for Registered {
    fn drop(&mut self) {
        let _ = memory_map().unregister(self.0.as_ptr() as usize, self.0.len());
    }
}

fn iov(p: *const u8, len: usize) -> libc::iovec {
    libc::iovec { iov_base: p as *mut libc::c_void, iov_len: len }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let s = input.byte();
    let entries = 2 + u16::from(s & 31);
    let cfg =
        EmuConfig { shadow_doorbells: s & 32 != 0, sgl: s & 64 != 0, io_queues: 1, ..EmuConfig::default() };
    let emu: Arc<EmulatedController> = EmulatedController::new(cfg);
    let t = PcieTransport::new(
        emu.clone(),
        PcieOptions { bounce_buffers: 2, bounce_size: 16384, ..PcieOptions::default() },
    );
    let mut admin = t.connect_admin(8, Duration::from_secs(5)).expect("the emulated controller enables");
    let mut q = t.connect_io(&mut admin, 1, entries).expect("an I/O queue");
    emu.set_fault(Fault::Scripted);

    let reg = Registered(AlignedBuf::zeroed(16 * 4096));
    memory_map().register(reg.0.as_ptr() as usize, reg.0.len()).expect("registering");
    let plain = AlignedBuf::zeroed(16 * 4096);

    let mut next_tag = 0u32;
    let mut in_flight = BTreeSet::new();
    let mut done = BTreeSet::new();
    let mut injected = 0u64;
    let mut failed = false;
    let mut out = Vec::new();
    let mut expired = Vec::new();
    while !input.0.is_empty() {
        match input.byte() % 7 {
            0 => {
                let k = input.byte();
                let slot = (next_tag % 16) as usize * 4096;
                // SAFETY: inside the buffers, which outlive the queue (dropped after it).
                let (r, p) = unsafe { (reg.0.as_ptr().add(slot), plain.as_ptr().add(slot)) };
                let (sqe, iovs) = match k & 3 {
                    0 => (cmd::flush(1), vec![]),
                    1 => (cmd::read_write(true, 1, 0, 8, false), vec![iov(r, 4096)]),
                    2 => (
                        cmd::read_write(false, 1, 0, 8, false),
                        vec![iov(r, 1000), iov(r.wrapping_add(1000), 3096)],
                    ),
                    _ => (cmd::read_write(false, 1, 0, 8, false), vec![iov(p, 4096)]),
                };
                // SAFETY: the buffers live until after `drain` below.
                if q.submit(&sqe, unsafe { Iovecs::from_slice(&iovs) }, next_tag).is_ok() {
                    assert!(!failed, "a failed queue took a command");
                    in_flight.insert(next_tag);
                }
                next_tag += 1;
            }
            1 => q.flush(),
            2 => {
                out.clear();
                match q.poll(&mut out) {
                    Ok(n) => {
                        assert!(!failed, "a failed queue polled fine");
                        assert_eq!(n, out.len());
                        for (tag, _) in &out {
                            assert!(in_flight.remove(tag), "tag {tag} completed but was not in flight");
                            assert!(done.insert(*tag));
                        }
                    }
                    Err(_) => failed = true,
                }
            }
            3 => {
                let b = input.byte();
                expired.clear();
                q.expired(u64::MAX, &mut expired);
                let cid = match expired.len() {
                    n if b < 128 && n > 0 => expired[usize::from(b) % n].0,
                    _ => u16::from(b & 127),
                };
                let sqhd = u16::from(input.byte()) % (entries + 1);
                let sc = input.byte();
                let flags = input.byte();
                // The phase tag of the device's current lap (it starts at 1, flips at each wrap).
                let lap_phase = (injected / u64::from(entries)) % 2 == 0;
                let phase = lap_phase != (flags & 1 != 0);
                let sqid: u16 = if flags & 2 != 0 { 7 } else { 1 };
                let mut b = [0u8; 16];
                b[8..10].copy_from_slice(&sqhd.to_le_bytes());
                b[10..12].copy_from_slice(&sqid.to_le_bytes());
                b[12..14].copy_from_slice(&cid.to_le_bytes());
                b[14..16].copy_from_slice(&((u16::from(sc) << 1) | u16::from(phase)).to_le_bytes());
                emu.inject_completion(1, b);
                injected += 1;
                assert!(emu.wait_injected(Duration::from_secs(5)));
            }
            4 => {
                let mut b = [0u8; 16];
                b.iter_mut().for_each(|x| *x = input.byte());
                emu.inject_completion(1, b);
                injected += 1;
                assert!(emu.wait_injected(Duration::from_secs(5)));
            }
            5 => {
                let v = match input.byte() % 3 {
                    0 => u32::MAX,
                    1 => registers::CSTS_RDY | registers::CSTS_CFS,
                    _ => registers::CSTS_RDY,
                };
                emu.write_register(registers::CSTS, v);
            }
            _ => {
                expired.clear();
                q.expired(u64::MAX, &mut expired);
                let tags: BTreeSet<u32> = expired.iter().map(|e| e.1).collect();
                assert_eq!(tags.len(), expired.len(), "a tag listed twice");
                if !failed {
                    assert_eq!(tags, in_flight, "expired lists what is in flight");
                }
            }
        }
    }
    let mut drained = Vec::new();
    q.drain(&mut drained);
    for tag in &drained {
        assert!(!done.contains(tag), "tag {tag} both completed and drained");
        assert!(in_flight.remove(tag), "tag {tag} drained but not in flight");
    }
    assert!(in_flight.is_empty(), "tags never returned: {in_flight:?}");
    assert_eq!(q.in_flight(), 0);
    drop(q);
    drop(admin);
});
