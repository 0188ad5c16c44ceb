//! Every built-in module's device through the shared conformance suite
//! (`fp_bdev::conformance::run_suite`), as a module from another crate would run it on its own.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::conformance::{run_suite, Storage};
use fp_bdev::{BlockDevice, DelayDevice, DelayLatency, ErrorDevice, NullDevice, RamDevice, UringDevice};

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
