//! The PCIe driver's path length: I/Os at queue depth 32 through `PcieTransport` over the
//! emulated controller, the driver's part (submit of 32 commands, one flush, one poll that
//! reaps all 32) in two functions callgrind can count alone; the wait for the device thread
//! lies outside them. docs/nvme.md, "Path length".
//!
//! ```text
//! cargo build --release -p fp-nvme --example nvme_pathlen
//! valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect='nvme_pathlen::submit_batch' --toggle-collect='nvme_pathlen::reap_batch' \
//!     target/release/examples/nvme_pathlen [IOS] [--no-shadow] [--unaligned]
//! callgrind_annotate callgrind.out.<pid> | head   # total Ir / IOS = instructions per I/O
//! ```
//!
//! `--unaligned` makes every request two iovecs that break the PRP rules, so they go as SGLs.

use std::time::Instant;

use fp_bdev::dma::memory_map;
use fp_bdev::{AlignedBuf, Iovecs};
use fp_nvme::cmd;
use fp_nvme::emu::{EmuConfig, EmulatedController};
use fp_nvme::pcie::{PcieIoQueue, PcieOptions, PcieTransport};
use fp_nvme::transport::{IoQueue, Transport};
use fp_nvme_spec::{Sqe, Status};

const QD: usize = 32;

#[inline(never)]
fn submit_batch(
    q: &mut PcieIoQueue<EmulatedController>,
    cmds: &[Sqe],
    iovs: &[[libc::iovec; 2]],
    n_iov: usize,
) {
    for (i, (c, v)) in cmds.iter().zip(iovs).enumerate() {
        // SAFETY: the buffers live until the end of main, past every completion.
        q.submit(c, unsafe { Iovecs::from_slice(&v[..n_iov]) }, i as u32).expect("a free slot");
    }
    q.flush();
}

#[inline(never)]
fn reap_batch(q: &mut PcieIoQueue<EmulatedController>, out: &mut Vec<(u32, Status)>) -> usize {
    q.poll(out).expect("a healthy queue")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ios: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(320_000);
    let shadow = !args.iter().any(|a| a == "--no-shadow");
    let unaligned = args.iter().any(|a| a == "--unaligned");
    let emu = EmulatedController::new(EmuConfig { shadow_doorbells: shadow, ..EmuConfig::default() });
    let t = PcieTransport::new(emu.clone(), PcieOptions::default());
    let mut admin = t.connect_admin(32, std::time::Duration::from_secs(5)).expect("enable");
    let mut q = t.connect_io(&mut admin, 1, 64).expect("an I/O queue");

    let buf = AlignedBuf::zeroed(QD * 4096);
    memory_map().register(buf.as_ptr() as usize, buf.len()).expect("registering");
    let base = buf.as_ptr() as *mut libc::c_void;
    let iovs: Vec<[libc::iovec; 2]> = (0..QD)
        .map(|i| {
            let p = base.wrapping_byte_add(i * 4096);
            if unaligned {
                [
                    libc::iovec { iov_base: p, iov_len: 1536 },
                    libc::iovec { iov_base: p.wrapping_byte_add(1536), iov_len: 2560 },
                ]
            } else {
                [libc::iovec { iov_base: p, iov_len: 4096 }, libc::iovec { iov_base: p, iov_len: 0 }]
            }
        })
        .collect();
    let cmds: Vec<Sqe> = (0..QD).map(|i| cmd::read_write(i % 2 == 0, 1, i as u64 * 8, 8, false)).collect();
    let n_iov = if unaligned { 2 } else { 1 };

    let rounds = ios / QD;
    let mut out = Vec::with_capacity(2 * QD);
    let start = Instant::now();
    let mut posted = emu.completions();
    for _ in 0..rounds {
        submit_batch(&mut q, &cmds, &iovs, n_iov);
        posted += QD as u64;
        // Not counted: waiting for the device thread to post all 32.
        while emu.completions() < posted {
            std::thread::yield_now();
        }
        out.clear();
        let n = reap_batch(&mut q, &mut out);
        assert_eq!(n, QD, "every command completes in one poll");
        assert!(out.iter().all(|c| c.1.is_success()));
    }
    let s = q.stats();
    let c = emu.counters();
    println!(
        "{} I/Os at QD{QD} in {:.2?} (shadow doorbells {shadow}, {}); doorbell writes {} ({:.3} per I/O: SQ {}, CQ {}), bounced {}",
        rounds * QD,
        start.elapsed(),
        if unaligned { "SGLs" } else { "PRPs" },
        s.doorbells,
        s.doorbells as f64 / (rounds * QD).max(1) as f64,
        c.sq_doorbells[1],
        c.cq_doorbells[1],
        s.bounced
    );
}
