//! The rbd device against a real single-node Ceph cluster (tests/ceph/cluster.sh): the
//! conformance suite every device passes, completions through the eventfd, a missing image,
//! a resize. The daemon-level tests are in crates/flashpath/tests/blkio_rbd.rs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use fp_bdev::conformance::{self, Storage};
use fp_bdev::Iovecs;
use fp_bdev::{BlockDevice, IoOp, IoRequest, IoStatus};
use fp_rbd::{Cluster, ClusterConfig, RbdDetail, RbdDevice, RbdError};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/ceph/cluster.sh")
}

/// A cluster for this test binary; stopped on drop.
struct TestCluster {
    dir: tempfile::TempDir,
    conf: String,
}

impl TestCluster {
    fn start() -> TestCluster {
        let dir = tempfile::Builder::new().prefix("fp-rbd-").tempdir_in("/var/tmp").unwrap();
        // Below Linux's ephemeral ports (32768 and up) and above the range the daemon-level
        // tests use (crates/flashpath/tests/common/ceph.rs).
        let port = 31760 + (std::process::id() % 320) as u16 * 2;
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .arg(port.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cannot start a Ceph cluster (./run test installs ceph-mon ceph-osd ceph-common): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = String::from_utf8(out.stdout).unwrap().trim().to_string();
        TestCluster { dir, conf }
    }

    fn connect(&self) -> Arc<Cluster> {
        Cluster::connect(ClusterConfig {
            name: "test".into(),
            config_file: Some(self.conf.clone()),
            ..ClusterConfig::default()
        })
        .unwrap()
    }

    fn rbd(&self, args: &[&str]) -> String {
        let out = Command::new("rbd").arg("-c").arg(&self.conf).args(args).output().unwrap();
        assert!(out.status.success(), "rbd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(script()).arg("stop").arg(self.dir.path()).status();
    }
}

fn device(cluster: &Arc<Cluster>, image: &str, block_size: u32) -> Arc<RbdDevice> {
    let img = cluster.open_image("rbd", image, false).unwrap();
    let detail = RbdDetail {
        pool_name: "rbd".into(),
        rbd_name: image.into(),
        cluster_name: Some("test".into()),
        user_id: None,
        read_only: false,
    };
    Arc::new(RbdDevice::new(image, block_size, img, detail).unwrap())
}

/// One request, waited for by sleeping on the channel's completion fd (not by spinning).
fn run_sleeping(ch: &mut dyn fp_bdev::IoChannel, req: IoRequest) -> IoStatus {
    ch.submit(&req).unwrap();
    let fd = ch.completion_fd().expect("an rbd channel has a completion fd");
    let mut status = None;
    loop {
        ch.poll(&mut |tag, s| {
            assert_eq!(tag, req.tag);
            status = Some(s);
        });
        if let Some(s) = status {
            return s;
        }
        if ch.arm_completion_fd() {
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, 30_000) };
            assert_eq!(n, 1, "no completion signalled within 30 s");
        }
    }
}

#[test]
fn rbd_device_against_a_real_cluster() {
    let tc = TestCluster::start();
    let cluster = tc.connect();

    // The conformance suite, each check on a fresh 1 MiB image.
    let n = AtomicU32::new(0);
    conformance::run_suite(
        &|| {
            let name = format!("conf{}", n.fetch_add(1, Ordering::Relaxed));
            tc.rbd(&["create", "--size", "1", &format!("rbd/{name}")]);
            let dev: Arc<dyn BlockDevice> = device(&cluster, &name, 512);
            dev
        },
        Storage::Keeps,
    );
    assert!(n.load(Ordering::Relaxed) >= 5, "the suite made its devices");

    // Completions wake a sleeping caller through the eventfd.
    tc.rbd(&["create", "--size", "4", "rbd/wake"]);
    let dev = device(&cluster, "wake", 4096);
    assert_eq!(dev.info().num_blocks(), 1024);
    let mut ch = dev.open_channel().unwrap();
    ch.disarm_completion_fd();
    let data = vec![0x5au8; 8192];
    let iov = [libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() }];
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let write = IoRequest {
        tag: 7,
        op: IoOp::Write,
        offset: 4096,
        len: 8192,
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        iov: unsafe { Iovecs::from_raw(iov.as_ptr(), 1) },
    };
    assert_eq!(run_sleeping(&mut *ch, write), IoStatus::Success);
    let mut back = vec![0u8; 8192];
    let riov = [libc::iovec { iov_base: back.as_mut_ptr().cast(), iov_len: back.len() }];
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let read = IoRequest {
        tag: 8,
        op: IoOp::Read,
        offset: 4096,
        len: 8192,
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        iov: unsafe { Iovecs::from_raw(riov.as_ptr(), 1) },
    };
    assert_eq!(run_sleeping(&mut *ch, read), IoStatus::Success);
    assert_eq!(back, data);
    let flush = IoRequest { tag: 9, op: IoOp::Flush, offset: 0, len: 0, iov: Iovecs::NONE };
    assert_eq!(run_sleeping(&mut *ch, flush), IoStatus::Success);
    drop(ch);

    // Another client sees what was written (it reached the OSD, not a cache).
    let export = tc.dir.path().join("wake.img");
    tc.rbd(&["export", "rbd/wake", export.to_str().unwrap()]);
    let image = std::fs::read(&export).unwrap();
    assert_eq!(&image[4096..4096 + 8192], &data[..]);
    assert!(image[..4096].iter().all(|&b| b == 0));

    // A resize reaches the image.
    dev.resize(2048).unwrap();
    assert_eq!(dev.info().num_blocks(), 2048);
    assert_eq!(dev.image_size().unwrap(), 8 << 20);
    assert!(tc.rbd(&["info", "rbd/wake"]).contains("8 MiB"), "rbd info sees the new size");

    // A missing image and a missing pool name the field.
    match cluster.open_image("rbd", "nope", false) {
        Err(RbdError::NotFound { field: "rbd_name", reason }) => assert!(reason.contains("nope"), "{reason}"),
        other => panic!("expected rbd_name not found, got {:?}", other.err()),
    }
    match cluster.open_image("nopool", "wake", false) {
        Err(RbdError::NotFound { field: "pool_name", .. }) => {}
        other => panic!("expected pool_name not found, got {:?}", other.err()),
    }

    // A read-only open refuses writes at submit.
    let img = cluster.open_image("rbd", "wake", true).unwrap();
    let detail = RbdDetail {
        pool_name: "rbd".into(),
        rbd_name: "wake".into(),
        cluster_name: None,
        user_id: None,
        read_only: true,
    };
    let ro = RbdDevice::new("ro", 4096, img, detail).unwrap();
    assert!(!ro.info().io_types.write);
    let mut ch = ro.open_channel().unwrap();
    assert_eq!(ch.submit(&write), Err(fp_bdev::SubmitError::Unsupported));
    assert_eq!(run_sleeping(&mut *ch, read), IoStatus::Success);
    drop(ch);

    // core_mask: librados' and librbd's threads of that connection run on the given cores.
    let before = ceph_threads();
    let pinned = Cluster::connect(ClusterConfig {
        name: "pinned".into(),
        config_file: Some(tc.conf.clone()),
        core_mask: Some(("0x1".into(), vec![0])),
        ..ClusterConfig::default()
    })
    .unwrap();
    let _img = pinned.open_image("rbd", "wake", true).unwrap();
    let new: Vec<_> = ceph_threads().into_iter().filter(|t| !before.contains(t)).collect();
    assert!(new.iter().any(|(_, name, _)| name.starts_with("msgr-worker")), "{new:?}");
    assert!(new.iter().any(|(_, name, _)| name.starts_with("io_context")), "{new:?}");
    for (_, name, cpus) in &new {
        assert_eq!(cpus, "0", "thread {name} of the pinned connection may run on {cpus}");
    }
}

/// This process's threads as (tid, name, Cpus_allowed_list).
fn ceph_threads() -> Vec<(String, String, String)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|t| {
            let t = t.unwrap().path();
            let name = std::fs::read_to_string(t.join("comm")).unwrap().trim().to_string();
            let status = std::fs::read_to_string(t.join("status")).unwrap();
            let cpus =
                status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
            (t.file_name().unwrap().to_string_lossy().into_owned(), name, cpus)
        })
        .collect()
}

#[test]
fn an_unreachable_monitor_is_a_clear_error_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ceph.conf");
    // Nothing listens on port 9 of localhost (discard is not run here).
    std::fs::write(&conf, "[global]\nmon host = 127.0.0.1:9\nauth client required = none\n").unwrap();
    let start = std::time::Instant::now();
    let err = Cluster::connect(ClusterConfig {
        name: "gone".into(),
        config_file: Some(conf.to_str().unwrap().into()),
        config_param: vec![("client_mount_timeout".into(), "2".into())],
        ..ClusterConfig::default()
    })
    .err()
    .expect("no monitor answers");
    let took = start.elapsed();
    assert!(matches!(err, RbdError::Ceph { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("cannot connect to cluster 'gone'"), "{text}");
    assert!(took < std::time::Duration::from_secs(15), "took {took:?}");
}
