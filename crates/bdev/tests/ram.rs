//! The RAM ("malloc") backend.

use std::sync::Arc;

use fp_bdev::conformance::*;
use fp_bdev::{BdevError, BlockDevice, IoOp, IoStatus, RamDevice};

fn ram(block_size: u32, num_blocks: u64) -> RamDevice {
    RamDevice::new("malloc0", block_size, num_blocks).unwrap()
}

#[test]
fn describes_itself() {
    let dev = ram(4096, 1024);
    let info = dev.info();
    assert_eq!((info.name.as_str(), info.product_name.as_str()), ("malloc0", "Malloc disk"));
    assert_eq!(info.driver, "malloc");
    assert_eq!((info.block_size, info.num_blocks(), info.size_bytes()), (4096, 1024, 4 << 20));
    let t = info.io_types;
    assert!(t.read && t.write && t.flush && t.unmap && t.write_zeroes);
    assert_eq!(info.driver_specific, None);
}

#[test]
fn invalid_params_name_the_field() {
    assert_invalid(RamDevice::new("m", 1000, 8), "block_size");
    assert_invalid(RamDevice::new("m", 512, 0), "num_blocks");
    assert_invalid(RamDevice::new("", 512, 8), "name");
}

#[test]
fn impossible_size_is_no_memory() {
    // 2^62 bytes: a valid geometry no machine can map.
    match RamDevice::new("huge", 65536, 1 << 46) {
        Err(BdevError::NoMemory(n)) => assert_eq!(n, 1 << 62),
        Err(e) => panic!("expected NoMemory, got {e}"),
        Ok(_) => panic!("mapped 4 EiB"),
    }
}

#[test]
fn fresh_disk_reads_zeroes() {
    let dev = ram(512, 2048);
    let mut ch = dev.open_channel().unwrap();
    assert!(read_range(&mut *ch, 0, 1 << 20).iter().all(|&b| b == 0));
}

#[test]
fn random_write_read_verify_512() {
    random_write_read_verify(&ram(512, 8192), 0x5eed_0001, 40, Layout::Unaligned);
}

#[test]
fn random_write_read_verify_4k() {
    random_write_read_verify(&ram(4096, 1024), 0x5eed_0002, 40, Layout::Mixed);
}

#[test]
fn out_of_range_requests_are_rejected() {
    check_range_rejected(&ram(512, 64));
    check_range_rejected(&ram(4096, 16));
}

#[test]
fn completions_come_only_from_poll() {
    check_completion_via_poll(&ram(512, 64));
}

#[test]
fn flush_discard_and_write_zeroes() {
    check_flush_discard_write_zeroes(&ram(512, 128));
    check_flush_discard_write_zeroes(&ram(4096, 64));
}

#[test]
fn iovecs_must_add_up_to_len() {
    check_iov_len_mismatch(&ram(512, 16));
}

#[test]
fn channel_per_thread() {
    check_channel_per_thread(Arc::new(ram(512, 8192)));
}

#[test]
fn data_outlives_the_device_handle_while_a_channel_is_open() {
    let dev = ram(512, 16);
    let mut ch = dev.open_channel().unwrap();
    write_range(&mut *ch, 512, &[0x77; 512]);
    drop(dev);
    assert_eq!(read_range(&mut *ch, 512, 512), vec![0x77; 512]);
}

#[test]
fn has_no_completion_fd() {
    let ch = ram(512, 16).open_channel().unwrap();
    assert_eq!(ch.completion_fd(), None);
    // A data-less request still completes through poll.
    let mut ch = ch;
    assert_eq!(run(&mut *ch, cmd(0, IoOp::Flush, 0, 0)), IoStatus::Success);
}
