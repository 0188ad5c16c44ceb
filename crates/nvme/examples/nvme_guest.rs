//! The driver on a real (emulated) PCIe function through VFIO, for the TCG test guest
//! (tests/guest/init, scenario `nvme`; crates/flashpath/tests/guest_nvme.rs), which runs it
//! after `vfio_bdev` (the bdev conformance suite, zero copy from registered buffers):
//!
//! 1. attaches the function (VfioFunction, PcieTransport, the controller thread) and reads back
//!    the pattern another driver (the guest kernel's) wrote there;
//! 2. resets the controller under I/O: a thread writes and reads back patterns through its own
//!    channel while the controller is reset twice; every request must succeed;
//! 3. writes a pattern region, detaches, attaches again and reads it back.
//!
//! Usage (as root, the function on vfio-pci): `nvme_guest ADDRESS find OFFSET LENGTH SEED`
//! does 1; `nvme_guest ADDRESS write OFFSET LENGTH SEED` does 2 and 3 with that region. Prints
//! `NVME-GUEST: ...` lines (the pattern region as `op write OFFSET LENGTH SEED`, which the host
//! finds in the raw image) and ends with `NVME-GUEST: PASS`; a failure panics (status 101).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fp_bdev::conformance;
use fp_bdev::BlockDevice;
use fp_nvme::ctrlr::{attach, Controller, GlobalOptions};
use fp_nvme::pcie::vfio::VfioFunction;
use fp_nvme::pcie::{PcieOptions, PcieTransport};

/// The test harness's pattern (crates/flashpath/tests/common/mod.rs `pattern`, and the guest's
/// fpio): every 8-byte word depends on its byte offset and the seed, so misplaced data shows.
fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .step_by(8)
        .flat_map(|i| {
            let pos = offset + i;
            ((pos / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed.rotate_left(17) ^ 0xa5a5_0000_0000_5a5a)
                .to_le_bytes()
        })
        .collect()
}

fn say(what: std::fmt::Arguments) {
    println!("NVME-GUEST: {what}");
}

fn attach_function(address: &str) -> Arc<dyn Controller> {
    let function = VfioFunction::open(address).unwrap_or_else(|e| panic!("opening {address}: {e}"));
    let global = GlobalOptions::default();
    let opts = global.controller_options("nvme0");
    let ctrl = attach(PcieTransport::new(function, PcieOptions::default()), opts, global, Box::new(|_| {}))
        .unwrap_or_else(|e| panic!("attaching {address}: {e}"));
    let cd = ctrl.controller_data();
    say(format_args!(
        "attached {address} namespaces={} sgl={} dbbuf={} max_transfer={:?}",
        ctrl.namespaces().len(),
        cd.sgl(),
        cd.doorbell_buffer_config(),
        cd.max_transfer(4096)
    ));
    ctrl
}

fn namespace1(ctrl: &dyn Controller) -> Arc<dyn BlockDevice> {
    ctrl.namespaces().into_iter().find(|n| n.nsid() == 1).expect("namespace 1")
}

/// Patterned writes and read-backs of 64 KiB, each checked, until `stop`; returns the number
/// of rounds.
fn verified_io(dev: &dyn BlockDevice, stop: &AtomicBool) -> u64 {
    let mut ch = dev.open_channel().expect("a channel");
    let size = dev.info().num_blocks() * u64::from(dev.info().block_size);
    let chunk = 64 * 1024u64;
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) || round < 4 {
        let offset = (round * 7919 * chunk) % (size - chunk);
        let offset = offset - offset % chunk;
        let data = pattern(1000 + round, offset, chunk as usize);
        conformance::write_range(&mut *ch, offset, &data);
        let back = conformance::read_range(&mut *ch, offset, chunk as usize);
        assert!(back == data, "round {round}: 64 KiB at {offset} read back wrong");
        round += 1;
    }
    round
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |s: &str| -> u64 { s.parse().unwrap_or_else(|_| panic!("not a number: {s}")) };
    let (address, mode, offset, len, seed) = match &args[..] {
        [a, m, o, l, s] if m == "find" || m == "write" => (a, m.as_str(), num(o), num(l) as usize, num(s)),
        _ => {
            println!("usage: nvme_guest ADDRESS find|write OFFSET LENGTH SEED");
            std::process::exit(2);
        }
    };
    let ctrl = attach_function(address);
    let ns = namespace1(&*ctrl);
    say(format_args!(
        "namespace 1 block_size={} num_blocks={}",
        ns.info().block_size,
        ns.info().num_blocks()
    ));
    if mode == "find" {
        // 1. What the other driver wrote.
        check_pattern(&*ns, offset, len, seed);
        say(format_args!("found {offset} {len} {seed}"));
        finish(ctrl, ns);
        return;
    }

    // 2. Resets under I/O.
    let stop = Arc::new(AtomicBool::new(false));
    let io = {
        let (ns, stop) = (ns.clone(), stop.clone());
        std::thread::spawn(move || verified_io(&*ns, &stop))
    };
    for i in 0..2 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        ctrl.reset().unwrap_or_else(|e| panic!("reset {i}: {e}"));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = io.join().expect("the I/O thread failed");
    say(format_args!("reset twice under I/O: {rounds} verified rounds"));

    // 3. A pattern region across a detach and a second attach.
    {
        let mut ch = ns.open_channel().expect("a channel");
        conformance::write_range(&mut *ch, offset, &pattern(seed, offset, len));
    }
    let stats = ctrl.stats();
    say(format_args!(
        "stats submitted={} completed={} doorbells={} bounced={}",
        stats.submitted, stats.completed, stats.doorbells, stats.bounced
    ));
    drop(ns);
    ctrl.detach();
    drop(ctrl);
    let ctrl = attach_function(address);
    let ns = namespace1(&*ctrl);
    check_pattern(&*ns, offset, len, seed);
    say(format_args!("op write {offset} {len} {seed}"));
    finish(ctrl, ns);
}

/// Reads `[offset, offset + len)` through a channel of its own: it must hold pattern `seed`.
fn check_pattern(ns: &dyn BlockDevice, offset: u64, len: usize, seed: u64) {
    let mut ch = ns.open_channel().expect("a channel");
    let back = conformance::read_range(&mut *ch, offset, len);
    assert!(back == pattern(seed, offset, len), "[{offset}, +{len}) does not hold pattern {seed}");
}

/// Detaches (the namespace's last user gone first) and says PASS.
fn finish(ctrl: Arc<dyn Controller>, ns: Arc<dyn BlockDevice>) {
    drop(ns);
    ctrl.detach();
    say(format_args!("PASS"));
}
