//! A controller over a 1 MiB RAM disk on one reactor, for the protocol-level tests.

use std::path::PathBuf;
use std::sync::Arc;

use fp_bdev::{Bdev, RamDevice};
use fp_reactor::{ReactorConfig, ReactorSet};
use fp_vhost_blk::{BlkController, ControllerConfig};

pub struct Fixture {
    pub _dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub ctrl: Option<BlkController>,
    pub reactors: Option<ReactorSet>,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctrl.sock");
        let reactors = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
        let bdev: Bdev = Arc::new(RamDevice::new("ram0", 512, 2048).unwrap());
        let ctrl = BlkController::start(ControllerConfig {
            name: "ctrl".into(),
            socket_path: sock.clone(),
            bdev,
            reactors: reactors.handles().to_vec(),
            read_only: false,
            num_queues: 1,
            handoff: fp_vhost_blk::HandOff::new(),
            stop_timeout: fp_vhost_blk::DEFAULT_STOP_TIMEOUT,
        })
        .unwrap();
        Fixture { _dir: dir, sock, ctrl: Some(ctrl), reactors: Some(reactors) }
    }

    #[allow(dead_code)] // not every test file uses it
    pub fn ctrl(&self) -> &BlkController {
        self.ctrl.as_ref().unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(c) = self.ctrl.take() {
            c.stop();
        }
        if let Some(r) = self.reactors.take() {
            r.shutdown();
        }
    }
}

/// `len` bytes of anonymous shared memory as a file: guest memory for a memory table.
#[allow(dead_code)] // not every test file uses it
pub fn memfd(len: u64) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: a valid NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"vhost-blk-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh fd nobody else owns.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}
