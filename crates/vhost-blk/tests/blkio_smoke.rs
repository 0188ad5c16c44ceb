//! The controller driven directly (no daemon, no RPC) by libblkio: protocol handshake, I/O,
//! reconnect. The full end-to-end suite lives in crates/flashpath/tests.

use std::sync::Arc;

use blkio::{Blkio, Blkioq, ReqFlags};
use fp_bdev::{Bdev, RamDevice};
use fp_reactor::{ReactorConfig, ReactorSet};
use fp_vhost_blk::{BlkController, ControllerConfig};

fn controller(dir: &std::path::Path, reactors: &ReactorSet, bdev: Bdev, num_queues: u16) -> BlkController {
    BlkController::start(ControllerConfig {
        name: "smoke".into(),
        socket_path: dir.join("smoke.sock"),
        bdev,
        reactors: reactors.handles().to_vec(),
        read_only: false,
        num_queues,
        handoff: fp_vhost_blk::HandOff::new(),
        stop_timeout: fp_vhost_blk::DEFAULT_STOP_TIMEOUT,
    })
    .unwrap()
}

fn connect(path: &std::path::Path, queues: i32) -> (Blkio, Vec<Blkioq>) {
    let mut b = Blkio::new("virtio-blk-vhost-user").unwrap();
    b.set_str("path", path.to_str().unwrap()).unwrap();
    b.connect().unwrap();
    b.set_i32("num-queues", queues).unwrap();
    let mut outcome = b.start().unwrap();
    let qs = outcome.queues.drain(..).collect();
    (b, qs)
}

fn wait_one(q: &mut Blkioq) -> i32 {
    let mut c = [std::mem::MaybeUninit::<blkio::Completion>::uninit()];
    let n = q.do_io(&mut c, 1, None, None).unwrap();
    assert_eq!(n, 1);
    // SAFETY: do_io initialised the first `n` completions.
    unsafe { c[0].assume_init_ref() }.ret
}

#[test]
fn write_read_and_reconnect_through_libblkio() {
    let dir = tempfile::tempdir().unwrap();
    let reactors = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let bdev: Bdev = Arc::new(RamDevice::new("ram0", 512, 2048).unwrap());
    let ctrl = controller(dir.path(), &reactors, bdev, 2);
    let sock = dir.path().join("smoke.sock");

    let (mut b, mut qs) = connect(&sock, 2);
    assert_eq!(b.get_u64("capacity").unwrap(), 2048 * 512);
    let region = b.alloc_mem_region(8192).unwrap();
    b.map_mem_region(&region).unwrap();
    // SAFETY: the region is 8192 bytes of mapped memory owned by `region`.
    let buf = unsafe { std::slice::from_raw_parts_mut(region.addr as *mut u8, 8192) };
    for (i, byte) in buf[..4096].iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let q = &mut qs[1];
    q.write(4096, buf.as_ptr(), 4096, 1, ReqFlags::empty());
    assert_eq!(wait_one(q), 0);
    q.read(4096, buf[4096..].as_mut_ptr(), 4096, 2, ReqFlags::empty());
    assert_eq!(wait_one(q), 0);
    assert_eq!(buf[..4096], buf[4096..]);
    q.flush(3, ReqFlags::empty());
    assert_eq!(wait_one(q), 0);
    // Out of range: past the end of the disk.
    q.read(2048 * 512, buf.as_mut_ptr(), 512, 4, ReqFlags::empty());
    assert!(wait_one(q) < 0);
    drop(qs);
    drop(b);

    // A new client sees the data the first one wrote.
    let (mut b2, mut qs2) = connect(&sock, 1);
    let region2 = b2.alloc_mem_region(4096).unwrap();
    b2.map_mem_region(&region2).unwrap();
    // SAFETY: as above.
    let buf2 = unsafe { std::slice::from_raw_parts_mut(region2.addr as *mut u8, 4096) };
    qs2[0].read(4096, buf2.as_mut_ptr(), 4096, 1, ReqFlags::empty());
    assert_eq!(wait_one(&mut qs2[0]), 0);
    for (i, byte) in buf2.iter().enumerate() {
        assert_eq!(*byte, (i % 251) as u8);
    }
    let info = ctrl.info();
    assert!(info.connected);
    assert_eq!(info.stats.write_ops, 1);
    assert_eq!(info.stats.read_ops, 2);
    assert_eq!(info.stats.io_errors, 1);
    drop(qs2);
    drop(b2);
    ctrl.stop();
    reactors.shutdown();
}
