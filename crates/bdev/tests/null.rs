//! The null backend: geometry checks, range checks and completion delivery (it keeps no data).

use std::sync::Arc;

use fp_bdev::conformance::*;
use fp_bdev::{BlockDevice, IoChannel, IoOp, IoStatus, NullDevice};

#[test]
fn describes_itself() {
    let dev = NullDevice::new("null0", 4096, 256).unwrap();
    let info = dev.info();
    assert_eq!((info.product_name.as_str(), info.driver), ("Null disk", "null"));
    assert_eq!(info.size_bytes(), 1 << 20);
    assert!(info.io_types.read && info.io_types.unmap && info.io_types.write_zeroes);
}

#[test]
fn invalid_params_name_the_field() {
    assert_invalid(NullDevice::new("n", 1000, 8), "block_size");
    assert_invalid(NullDevice::new("n", 256, 8), "block_size");
    assert_invalid(NullDevice::new("n", 512, 0), "num_blocks");
    assert_invalid(NullDevice::new("n", 4096, u64::MAX / 1024), "num_blocks");
    assert_invalid(NullDevice::new("", 512, 8), "name");
    assert_invalid(NullDevice::new("a/b", 512, 8), "name");
}

#[test]
fn out_of_range_requests_are_rejected() {
    check_range_rejected(&NullDevice::new("null0", 512, 64).unwrap());
}

#[test]
fn completions_come_only_from_poll() {
    check_completion_via_poll(&NullDevice::new("null0", 512, 64).unwrap());
}

#[test]
fn reads_leave_buffers_untouched() {
    let dev = NullDevice::new("null0", 512, 64).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = IoBuf::new(1024, false);
    buf.bytes_mut().fill(0x42);
    let iov = [buf.iovec()];
    // SAFETY: `buf` outlives the call.
    assert_eq!(unsafe { run(&mut *ch, rw(0, IoOp::Read, 512, &iov)) }, IoStatus::Success);
    assert!(buf.bytes().iter().all(|&b| b == 0x42));
}

#[test]
fn channel_per_thread() {
    let dev: Arc<dyn BlockDevice> = Arc::new(NullDevice::new("null0", 512, 1024).unwrap());
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                let mut ch = dev.open_channel().unwrap();
                let reqs: Vec<_> = (0..64).map(|i| cmd(i, IoOp::Flush, 0, 0)).collect();
                let status = run_batch(&mut *ch, &reqs);
                assert!(status.iter().all(|s| *s == IoStatus::Success));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn has_no_completion_fd() {
    let dev = NullDevice::new("null0", 512, 64).unwrap();
    let ch: Box<dyn IoChannel> = dev.open_channel().unwrap();
    assert_eq!(ch.completion_fd(), None);
}
