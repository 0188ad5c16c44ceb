//! A namespace of a VFIO-bound NVMe function as a block device: attaches the controller
//! (`ctrlr::attach` over the PCIe transport over [`VfioFunction`]), runs the bdev conformance
//! suite on its first namespace (zeroed before each check with Write Zeroes), then reads and
//! writes from daemon buffers ([`AlignedBuf`], registered in the DMA map) and checks that none
//! of that was bounced. For checking the whole driver inside the test guest (docs/nvme.md).
//!
//! Usage: `vfio_bdev 0000:00:04.0` (as root, the function bound to vfio-pci; its namespace 1
//! is overwritten). Prints `VFIO-BDEV: ...` lines and ends with `VFIO-BDEV: PASS`, or panics.

use std::sync::Arc;

use fp_bdev::conformance::{self, cmd, run, rw, Storage};
use fp_bdev::dma::memory_map;
use fp_bdev::{AlignedBuf, BlockDevice, IoOp, IoStatus};
use fp_nvme::ctrlr::{self, GlobalOptions};
use fp_nvme::pcie::vfio::VfioFunction;
use fp_nvme::pcie::{PcieOptions, PcieTransport};

/// Write Zeroes over the whole device through a channel of its own.
fn zero(dev: &dyn BlockDevice) {
    let len = dev.info().num_blocks() * u64::from(dev.info().block_size);
    let mut ch = dev.open_channel().expect("channel");
    let st = run(&mut *ch, cmd(0, IoOp::WriteZeroes, 0, len));
    assert_eq!(st, IoStatus::Success, "Write Zeroes over {len} bytes");
}

fn main() {
    let addr = std::env::args().nth(1).expect("usage: vfio_bdev ADDRESS");
    let f = VfioFunction::open(&addr).unwrap_or_else(|e| panic!("VFIO-BDEV: FAIL {e}"));
    let t = PcieTransport::new(f, PcieOptions::default());
    let global = GlobalOptions::default();
    let opts = global.controller_options("nvme0");
    let c = ctrlr::attach(t, opts, global, Box::new(|ev| println!("VFIO-BDEV: event {ev:?}")))
        .unwrap_or_else(|e| panic!("VFIO-BDEV: FAIL attach: {e}"));
    let ns = c.namespaces().first().cloned().expect("a namespace");
    let info = ns.info();
    println!(
        "VFIO-BDEV: attached {}: {} blocks of {} bytes; {}",
        info.name,
        info.num_blocks(),
        info.block_size,
        serde_json::to_string(&c.info()).unwrap_or_default()
    );

    let dev: Arc<dyn BlockDevice> = ns.clone();
    let make = || {
        zero(&*dev);
        dev.clone()
    };
    conformance::run_suite(&make, Storage::Keeps);
    let after_suite = c.stats();
    println!("VFIO-BDEV: conformance suite passed; {after_suite:?}");

    // Daemon buffers: zero copy.
    let mut ch = dev.open_channel().expect("channel");
    let mut src = AlignedBuf::zeroed(128 * 1024);
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13).wrapping_add(5);
    }
    let dst = AlignedBuf::zeroed(128 * 1024);
    let wv = [libc::iovec { iov_base: src.as_mut_ptr().cast(), iov_len: src.len() }];
    let rv = [libc::iovec { iov_base: dst.as_ptr() as *mut libc::c_void, iov_len: dst.len() }];
    // SAFETY: the buffers outlive the calls, which wait for the completions.
    unsafe {
        assert_eq!(run(&mut *ch, rw(0, IoOp::Write, 4096, &wv)), IoStatus::Success);
        assert_eq!(run(&mut *ch, rw(0, IoOp::Read, 4096, &rv)), IoStatus::Success);
    }
    assert_eq!(dst.as_slice(), src.as_slice(), "read back differs");
    drop(ch);
    let end = c.stats();
    println!(
        "VFIO-BDEV: 128 KiB written and read from AlignedBufs; {end:?}; DMA map {:?}",
        memory_map().stats()
    );
    assert_eq!(end.bounced, after_suite.bounced, "registered memory was bounced");
    c.reset().unwrap_or_else(|e| panic!("VFIO-BDEV: FAIL reset: {e}"));
    let mut ch = dev.open_channel().expect("channel after reset");
    let back = conformance::read_range(&mut *ch, 4096, 4096);
    assert_eq!(back, src.as_slice()[..4096], "data after a controller reset");
    println!("VFIO-BDEV: reset, data still there");
    drop(ch);
    drop(ns);
    drop(dev);
    c.detach();
    println!("VFIO-BDEV: detached; DMA map {:?}", memory_map().stats());
    println!("VFIO-BDEV: PASS");
}
