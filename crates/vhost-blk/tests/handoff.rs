//! Two controllers on one disk, as a live migration within one daemon has them: only one runs
//! queues at a time (fp_vhost_blk::HandOff), and the disk passes to the other once the first
//! stops.

use std::sync::Arc;

use blkio::{Blkio, Blkioq, ReqFlags};
use fp_bdev::{Bdev, RamDevice};
use fp_reactor::{ReactorConfig, ReactorSet};
use fp_vhost_blk::{BlkController, ControllerConfig, HandOff};

fn controller(
    name: &str,
    dir: &std::path::Path,
    reactors: &ReactorSet,
    bdev: Bdev,
    gate: &Arc<HandOff>,
) -> BlkController {
    BlkController::start(ControllerConfig {
        name: name.into(),
        socket_path: dir.join(name),
        bdev,
        reactors: reactors.handles().to_vec(),
        read_only: false,
        num_queues: 1,
        handoff: gate.clone(),
        stop_timeout: fp_vhost_blk::DEFAULT_STOP_TIMEOUT,
    })
    .unwrap()
}

/// Connects and starts one queue; `None` when the back end refused to start it.
fn start(path: &std::path::Path) -> Option<(Blkio, Vec<Blkioq>)> {
    let mut b = Blkio::new("virtio-blk-vhost-user").unwrap();
    b.set_str("path", path.to_str().unwrap()).unwrap();
    b.connect().ok()?;
    b.set_i32("num-queues", 1).unwrap();
    let mut outcome = b.start().ok()?;
    let qs = outcome.queues.drain(..).collect();
    Some((b, qs))
}

/// Writes then reads back one block stamped `stamp`; false if any step fails.
fn round_trip(b: &mut Blkio, q: &mut Blkioq, stamp: u8) -> bool {
    let Ok(region) = b.alloc_mem_region(8192) else { return false };
    if b.map_mem_region(&region).is_err() {
        return false;
    }
    // SAFETY: the region is 8192 bytes of mapped memory owned by `region`.
    let buf = unsafe { std::slice::from_raw_parts_mut(region.addr as *mut u8, 8192) };
    buf[..4096].fill(stamp);
    q.write(0, buf.as_ptr(), 4096, 1, ReqFlags::empty());
    if wait_one(q) != Some(0) {
        return false;
    }
    q.read(0, buf[4096..].as_mut_ptr(), 4096, 2, ReqFlags::empty());
    wait_one(q) == Some(0) && buf[4096..].iter().all(|&x| x == stamp)
}

fn wait_one(q: &mut Blkioq) -> Option<i32> {
    let mut c = [std::mem::MaybeUninit::<blkio::Completion>::uninit()];
    let mut timeout = std::time::Duration::from_secs(5);
    let n = q.do_io(&mut c, 1, Some(&mut timeout), None).ok()?;
    // SAFETY: do_io initialised the first `n` completions.
    (n == 1).then(|| unsafe { c[0].assume_init_ref() }.ret)
}

#[test]
fn the_destination_runs_only_after_the_source_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let reactors = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let bdev: Bdev = Arc::new(RamDevice::new("ram0", 512, 2048).unwrap());
    let gate = HandOff::new();
    let src = controller("src", dir.path(), &reactors, bdev.clone(), &gate);
    let dst = controller("dst", dir.path(), &reactors, bdev, &gate);

    let (mut b, mut qs) = start(&dir.path().join("src")).expect("the source starts");
    assert!(round_trip(&mut b, &mut qs[0], 1));
    // The source's queue runs: the destination's may not start, and writes nothing.
    let refused = start(&dir.path().join("dst"));
    if let Some((mut b2, mut qs2)) = refused {
        assert!(!round_trip(&mut b2, &mut qs2[0], 2), "the destination wrote beside the source");
    }
    assert!(dst.info().queues.is_empty(), "no destination queue started");
    // The source is still serving, its data intact.
    assert!(round_trip(&mut b, &mut qs[0], 3));
    // The source stops (QEMU: GET_VRING_BASE, then the VM moves); the destination takes over.
    drop(qs);
    drop(b);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut b2, mut qs2) = loop {
        if let Some(s) = start(&dir.path().join("dst")) {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the destination never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(round_trip(&mut b2, &mut qs2[0], 4));
    // Now the source is the one refused.
    if let Some((mut b3, mut qs3)) = start(&dir.path().join("src")) {
        assert!(!round_trip(&mut b3, &mut qs3[0], 5), "the source wrote beside the destination");
    }
    drop(qs2);
    drop(b2);
    src.stop();
    dst.stop();
    reactors.shutdown();
}
