//! Every built-in module's device through the shared conformance suite
//! (`fp_bdev::conformance::run_suite`), as a module from another crate would run it on its own.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::conformance::{run_suite, Storage};
use fp_bdev::{
    BlockDevice, DelayDevice, DelayLatency, ErrorDevice, IoOp, IoStatus, NullDevice, RamDevice, UringDevice,
};

fn ram() -> Arc<dyn BlockDevice> {
    Arc::new(RamDevice::new("malloc0", 512, 2048).unwrap())
}

#[test]
fn null() {
    run_suite(&|| Arc::new(NullDevice::new("null0", 512, 64).unwrap()), Storage::Discards);
}

#[test]
fn malloc() {
    run_suite(&ram, Storage::Keeps);
    run_suite(&|| Arc::new(RamDevice::new("malloc4k", 4096, 256).unwrap()), Storage::Keeps);
}

#[test]
fn uring() {
    let dir = tempfile::tempdir().unwrap();
    let n = Cell::new(0);
    for direct in [false, true] {
        let make = || -> Arc<dyn BlockDevice> {
            n.set(n.get() + 1);
            let path = dir.path().join(format!("disk{}.img", n.get()));
            std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
            match UringDevice::new("u", &path, None, direct) {
                Ok(dev) => Arc::new(dev),
                // tmpfs has no O_DIRECT: fall back to a buffered device rather than skip.
                Err(_) if direct => Arc::new(UringDevice::new("u", &path, None, false).unwrap()),
                Err(e) => panic!("{e}"),
            }
        };
        run_suite(&make, Storage::Keeps);
    }
}

#[test]
fn delay_over_malloc() {
    for us in [0, 200] {
        let d = Duration::from_micros(us);
        let latency = DelayLatency { avg_read: d, p99_read: d * 2, avg_write: d, p99_write: d * 2 };
        run_suite(&|| Arc::new(DelayDevice::new("delay0", ram(), latency).unwrap()), Storage::Keeps);
    }
}

/// An error bdev with no injection is its base, request for request.
#[test]
fn error_over_malloc() {
    run_suite(&|| Arc::new(ErrorDevice::new("EE_malloc0", ram()).unwrap()), Storage::Keeps);
}

/// The disk layer keeps every guarantee of the channel it wraps, accounting on and off.
#[test]
fn disk_layer_over_malloc_and_uring() {
    for accounting in [true, false] {
        run_suite(&|| Arc::new(fp_bdev::Disk::new(ram(), accounting)), Storage::Keeps);
    }
    let dir = tempfile::tempdir().unwrap();
    let n = Cell::new(0);
    let uring = || -> Arc<dyn BlockDevice> {
        n.set(n.get() + 1);
        let path = dir.path().join(format!("disk{}.img", n.get()));
        std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
        Arc::new(fp_bdev::Disk::new(Arc::new(UringDevice::new("u", &path, None, false).unwrap()), true))
    };
    run_suite(&uring, Storage::Keeps);
}

/// The crypto bdev over RAM disks of both block sizes, with 256- and 512-bit XTS keys. A zeroed
/// base reads back as noise through the cipher (as under dm-crypt), so each disk is zeroed
/// through the crypto bdev first, as the suite wants it.
#[test]
fn crypto_over_malloc() {
    use fp_bdev::modules::crypto::{CryptoDevice, CryptoKey};
    let k1 = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let k2 = "ffeeddccbbaa99887766554433221100f0e1d2c3b4a5968778695a4b3c2d1e0f";
    for (bs, blocks, hex) in [(512, 2048, 32), (4096, 256, 64)] {
        let key = Arc::new(CryptoKey::from_hex("k", &k1[..hex], &k2[..hex]).unwrap());
        let make = || -> Arc<dyn BlockDevice> {
            let base = Arc::new(RamDevice::new("malloc0", bs, blocks).unwrap());
            let dev: Arc<dyn BlockDevice> =
                Arc::new(CryptoDevice::new("crypto0", base, key.clone()).unwrap());
            let mut ch = dev.open_channel().unwrap();
            let size = dev.info().size_bytes();
            let zeroed =
                fp_bdev::conformance::run(&mut *ch, fp_bdev::conformance::cmd(0, IoOp::WriteZeroes, 0, size));
            assert_eq!(zeroed, IoStatus::Success);
            dev
        };
        run_suite(&make, Storage::Keeps);
    }
}
