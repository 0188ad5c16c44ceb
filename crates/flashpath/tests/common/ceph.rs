//! A real single-node Ceph cluster for the RBD tests: one monitor and one memstore OSD on
//! 127.0.0.1 in a temporary directory, started by `tests/ceph/cluster.sh` (about 2 s) and stopped
//! when dropped. The packages (ceph-mon, ceph-osd, ceph-common, uuid-runtime) come from Debian;
//! `./run test` installs them. A test binary that needs a cluster fails when they are missing,
//! unless FLASHPATH_SKIP_CEPH=1 (outside CI), where it prints why and returns `None`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU16, Ordering};

/// The monitor ports handed out in this process (each cluster takes two: v2 and v1).
static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// A running cluster. The pool `rbd` exists and is initialised.
pub struct CephCluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
}

impl CephCluster {
    /// Starts a cluster, or `None` when Ceph is not installed and FLASHPATH_SKIP_CEPH=1 (not in
    /// CI). Panics when it cannot start.
    pub fn start() -> Option<CephCluster> {
        if !super::tools_or_skip(
            &["ceph-mon", "ceph-osd", "rbd"],
            "Ceph is not installed (Debian packages ceph-mon ceph-osd ceph-common uuid-runtime)",
            "FLASHPATH_SKIP_CEPH",
        ) {
            return None;
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/ceph/cluster.sh");
        // A port that another process takes between our check and the monitor's bind fails
        // the start ("Address already in use"): try the next one.
        let mut attempt = 0;
        let (dir, out) = loop {
            attempt += 1;
            let dir = tempfile::Builder::new().prefix("fp-ceph-").tempdir_in(super::scratch_base()).unwrap();
            let port = monitor_port();
            let out = Command::new("bash")
                .arg(&script)
                .arg("start")
                .arg(dir.path())
                .arg(port.to_string())
                .output()
                .unwrap();
            if out.status.success() {
                break (dir, out);
            }
            let _ = Command::new("bash").arg(&script).arg("stop").arg(dir.path()).status();
            let mon_stderr = std::fs::read_to_string(dir.path().join("mon.a.stderr")).unwrap_or_default();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let in_use =
                stderr.contains("Address already in use") || mon_stderr.contains("Address already in use");
            if !in_use || attempt == 5 {
                panic!("cannot start the Ceph test cluster (monitor port {port}): {stderr}\n{mon_stderr}");
            }
            eprintln!("the Ceph test cluster's monitor port {port} is taken; trying another");
        };
        let conf = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(conf.is_file(), "cluster.sh printed {conf:?}, not a file");
        Some(CephCluster { dir, conf })
    }

    /// The cluster's ceph.conf (monitor address, keyring, no authentication).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The pid of the OSD (for SIGSTOP / SIGCONT in the fault tests).
    pub fn osd_pid(&self) -> u32 {
        let pid = std::fs::read_to_string(self.dir.path().join("osd.0.pid")).expect("osd.0.pid");
        pid.trim().parse().expect("a pid in osd.0.pid")
    }

    /// Runs the `rbd` tool against this cluster; panics unless it succeeds.
    pub fn rbd(&self, args: &[&str]) -> Output {
        let out = Command::new("rbd").arg("-c").arg(&self.conf).args(args).output().unwrap();
        assert!(out.status.success(), "rbd {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        out
    }

    /// Creates image `name` of `size_mib` MiB in the pool `rbd`.
    pub fn create_image(&self, name: &str, size_mib: u64) {
        self.rbd(&["create", "--size", &size_mib.to_string(), &format!("rbd/{name}")]);
    }

    /// `bdev_rbd_register_cluster`'s parameters for this cluster under `name`, with extra
    /// `config_param`s (a JSON object of strings).
    pub fn register_params(&self, name: &str, config_param: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "name": name,
            "config_file": self.conf.to_str().unwrap(),
            "config_param": config_param,
        })
    }

    /// `rbd info`'s JSON for image `name` of the pool `rbd`.
    pub fn image_info(&self, name: &str) -> serde_json::Value {
        let out = self.rbd(&["info", "--format", "json", &format!("rbd/{name}")]);
        serde_json::from_slice(&out.stdout).expect("rbd info --format json prints JSON")
    }

    /// The `mon host` line's value in ceph.conf (for a bdev's own connection, whose `config`
    /// replaces the file).
    pub fn mon_host(&self) -> String {
        let conf = std::fs::read_to_string(&self.conf).expect("reading ceph.conf");
        let line = conf.lines().find_map(|l| l.trim().strip_prefix("mon host")).expect("a mon host line");
        line.trim_start().trim_start_matches('=').trim().to_string()
    }

    /// A copy of ceph.conf whose monitor address is a closed port on 127.0.0.1: connecting
    /// with it can only time out.
    pub fn dead_monitor_conf(&self) -> PathBuf {
        // A port just released by the kernel: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let conf = std::fs::read_to_string(&self.conf).expect("reading ceph.conf");
        let text: String = conf
            .lines()
            .map(|l| {
                if l.trim().starts_with("mon host") {
                    format!("mon host = [v2:127.0.0.1:{port}]")
                } else {
                    l.into()
                }
            })
            .map(|l| l + "\n")
            .collect();
        let path = self.dir.path().join("dead-monitor.conf");
        std::fs::write(&path, text).expect("writing dead-monitor.conf");
        path
    }
}

impl super::BlkClient {
    /// One vectored request (libblkio readv/writev) on `queue` at `offset`, its segments
    /// `(arena offset, length)` in order; returns libblkio's `ret`. The iovec array lives
    /// until the request completes.
    pub fn vectored(&mut self, queue: usize, write: bool, offset: u64, segments: &[(usize, usize)]) -> i32 {
        let base = self.arena.addr as *mut u8;
        let iov: Vec<blkio::iovec> = segments
            .iter()
            .map(|&(buf, len)| {
                assert!(buf + len <= self.arena.len, "segment outside the arena");
                blkio::iovec { iov_base: base.wrapping_add(buf).cast(), iov_len: len }
            })
            .collect();
        let q = &mut self.queues[queue];
        let flags = blkio::ReqFlags::empty();
        if write {
            q.writev(offset, iov.as_ptr(), iov.len() as u32, 0, flags);
        } else {
            q.readv(offset, iov.as_ptr(), iov.len() as u32, 0, flags);
        }
        let mut done = [std::mem::MaybeUninit::<blkio::Completion>::uninit()];
        let mut timeout = super::IO_TIMEOUT;
        let n = q.do_io(&mut done, 1, Some(&mut timeout), None).expect("do_io of a vectored request");
        assert_eq!(n, 1, "a vectored request did not complete within {:?}", super::IO_TIMEOUT);
        // SAFETY: do_io() initialised the one completion it returned.
        unsafe { done[0].assume_init_ref() }.ret
    }
}

/// A monitor port (v2; v1 is the next one) that nothing listens on now, below Linux's
/// ephemeral range (32768 and up: a connection's local port may take any of those at any time)
/// and apart per process and per cluster, so parallel test binaries and tests do not collide:
/// 2 per cluster, 128 per process.
fn monitor_port() -> u16 {
    loop {
        let n = NEXT_PORT.fetch_add(2, Ordering::Relaxed);
        let port = 10000 + (std::process::id() % 170) as u16 * 128 + n % 128;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 1) {
            return port;
        }
    }
}

impl Drop for CephCluster {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/ceph/cluster.sh");
        let _ = Command::new("bash").arg(&script).arg("stop").arg(self.dir.path()).status();
    }
}
