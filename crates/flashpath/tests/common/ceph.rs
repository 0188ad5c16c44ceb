//! A real single-node Ceph cluster for the RBD tests: one monitor and one memstore OSD on
//! 127.0.0.1 in a temporary directory, started by `tests/ceph/cluster.sh` (about 2 s) and stopped
//! when dropped. The packages (ceph-mon, ceph-osd, ceph-common, uuid-runtime) come from Debian;
//! `./run test` installs them. A test binary that needs a cluster fails when they are missing,
//! unless FLASHPATH_SKIP_CEPH=1 (outside CI), where it prints why and returns `None`.
//!
//! [`CephCluster::start_with_rgw`] adds a RADOS Gateway (`radosgw`, Debian package radosgw, and
//! curl): a real S3 endpoint on 127.0.0.1, about 1.2 s more. [`CephCluster::rgw`] hands out an
//! [`S3Endpoint`] with a bucket of its own, and [`S3Endpoint::request`] sends a signed request
//! with curl's `--aws-sigv4`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::time::Instant;

/// The monitor ports handed out in this process (each cluster takes two: v2 and v1).
static NEXT_PORT: AtomicU16 = AtomicU16::new(0);
/// The buckets created in this process, for their names.
static NEXT_BUCKET: AtomicU32 = AtomicU32::new(0);

/// A running cluster. The pool `rbd` exists and is initialised.
pub struct CephCluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    rgw: Option<Gateway>,
}

/// The cluster's RADOS Gateway as `cluster.sh rgw` printed it.
struct Gateway {
    url: String,
    access_key: String,
    secret_key: String,
}

/// An S3 endpoint with a bucket of its own (created empty by [`CephCluster::rgw`]).
#[derive(Clone, Debug)]
pub struct S3Endpoint {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub url: String,
    pub access_key: String,
    pub secret_key: String,
    /// The region to sign with: the gateway's default zonegroup takes any, S3 clients want one.
    pub region: String,
    pub bucket: String,
}

/// An S3 response: HTTP status and body.
#[derive(Debug)]
pub struct S3Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl S3Response {
    /// The body as text (S3's errors and listings are XML).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl S3Endpoint {
    /// Sends `method` to `path` (`/bucket`, `/bucket/key`, with a query if any) with `body`,
    /// signed with AWS signature v4 by curl. The payload's SHA-256 goes in
    /// `x-amz-content-sha256` (computed with sha256sum): the gateway wants that header, and
    /// curl 7.88 signs it when given but does not add it.
    pub fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> S3Response {
        self.request_with_secret(method, path, body, &self.secret_key)
    }

    /// [`S3Endpoint::request`] signed with another secret key (a wrong one, for the refusals).
    pub fn request_with_secret(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        secret: &str,
    ) -> S3Response {
        let dir = tempfile::Builder::new().prefix("fp-s3-").tempdir_in(super::scratch_base()).unwrap();
        let out_file = dir.path().join("response");
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-m", "60", "-X", method, "--aws-sigv4"])
            .arg(format!("aws:amz:{}:s3", self.region))
            .arg("--user")
            .arg(format!("{}:{secret}", self.access_key))
            .arg("-o")
            .arg(&out_file)
            .args(["-w", "%{http_code}"]);
        let payload_sha256 = match body {
            Some(bytes) => {
                let in_file = dir.path().join("payload");
                std::fs::write(&in_file, bytes).unwrap();
                cmd.arg("--data-binary").arg(format!("@{}", in_file.display()));
                // curl would send a form's content type; S3 stores whatever it is given.
                cmd.args(["-H", "Content-Type: application/octet-stream"]);
                sha256_hex(&in_file)
            }
            None => EMPTY_SHA256.to_string(),
        };
        cmd.arg("-H").arg(format!("x-amz-content-sha256: {payload_sha256}"));
        cmd.arg(format!("{}{path}", self.url));
        let out = cmd.output().expect("running curl");
        assert!(out.status.success(), "curl {method} {path}: {}", String::from_utf8_lossy(&out.stderr));
        let code = String::from_utf8_lossy(&out.stdout);
        let status =
            code.trim().parse().unwrap_or_else(|_| panic!("curl printed {code:?}, not an HTTP status"));
        let body = std::fs::read(&out_file).unwrap_or_default();
        S3Response { status, body }
    }
}

/// SHA-256 of nothing, the payload hash of a request without a body.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn sha256_hex(file: &Path) -> String {
    let out = Command::new("sha256sum").arg(file).output().expect("running sha256sum");
    assert!(out.status.success(), "sha256sum: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().expect("sha256sum prints a hash").to_string()
}

/// Whether every tool is on PATH; when not, fails the test unless FLASHPATH_SKIP_CEPH=1 outside
/// CI (then false: the caller skips).
fn tools_installed(tools: &[&str], packages: &str) -> bool {
    super::tools_or_skip(
        tools,
        &format!("{} not installed (Debian packages {packages})", tools.join(", ")),
        "FLASHPATH_SKIP_CEPH",
    )
}

impl CephCluster {
    /// Starts a cluster, or `None` when Ceph is not installed and FLASHPATH_SKIP_CEPH=1 (not in
    /// CI). Panics when it cannot start.
    pub fn start() -> Option<CephCluster> {
        if !tools_installed(&["ceph-mon", "ceph-osd", "rbd"], "ceph-mon ceph-osd ceph-common uuid-runtime") {
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
        Some(CephCluster { dir, conf, rgw: None })
    }

    /// [`CephCluster::start`] with a RADOS Gateway (S3) on 127.0.0.1; `None` as there, or when
    /// radosgw or curl is missing under the same rule. [`CephCluster::rgw`] gives its buckets.
    pub fn start_with_rgw() -> Option<CephCluster> {
        if !tools_installed(
            &["radosgw", "radosgw-admin", "curl", "sha256sum"],
            "radosgw ceph-common curl coreutils",
        ) {
            return None;
        }
        let mut cluster = CephCluster::start()?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/ceph/cluster.sh");
        let started = Instant::now();
        let mut attempt = 0;
        let out = loop {
            attempt += 1;
            // From this process's block of ports, like the monitor's (the pair's second unused).
            let port = monitor_port();
            let out = Command::new("bash")
                .arg(&script)
                .arg("rgw")
                .arg(cluster.dir.path())
                .arg(port.to_string())
                .output()
                .unwrap();
            if out.status.success() {
                break out;
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            if !stderr.contains("in use") || attempt == 5 {
                panic!("cannot start the test cluster's RADOS Gateway (port {port}): {stderr}");
            }
            eprintln!("the RADOS Gateway's port {port} is taken; trying another");
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut lines = stdout.lines();
        let mut next = |what: &str| {
            lines.next().unwrap_or_else(|| panic!("cluster.sh rgw printed no {what}")).to_string()
        };
        let (url, access_key, secret_key) = (next("URL"), next("access key"), next("secret key"));
        eprintln!("RADOS Gateway on {url} in {:.1} s", started.elapsed().as_secs_f64());
        cluster.rgw = Some(Gateway { url, access_key, secret_key });
        Some(cluster)
    }

    /// The gateway's endpoint with a new, empty bucket (created with an S3 PUT), a different
    /// one on each call, so tests sharing a cluster do not see each other's objects. Panics
    /// unless the cluster was started with [`CephCluster::start_with_rgw`].
    pub fn rgw(&self) -> S3Endpoint {
        let gw = self.rgw.as_ref().expect("the cluster was started without a RADOS Gateway (start_with_rgw)");
        let bucket = format!("fp-{}-{}", std::process::id(), NEXT_BUCKET.fetch_add(1, Ordering::Relaxed));
        let endpoint = S3Endpoint {
            url: gw.url.clone(),
            access_key: gw.access_key.clone(),
            secret_key: gw.secret_key.clone(),
            region: "us-east-1".into(),
            bucket,
        };
        let created = endpoint.request("PUT", &format!("/{}", endpoint.bucket), None);
        assert_eq!(created.status, 200, "creating bucket {}: {}", endpoint.bucket, created.text());
        endpoint
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
