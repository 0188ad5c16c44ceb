//! Shared harness for the end-to-end tests: a flashpath daemon in a temporary directory, a
//! minimal JSON-RPC client for its control socket, and a synchronous libblkio client for its
//! vhost-user-blk sockets.
//!
//! Everything here is independent of flashpath's own crates: the daemon is driven only through
//! its command line, its RPC socket and its vhost-user sockets, exactly as an operator, an
//! orchestrator and a VM would.
//!
//! * [`Daemon::start`] runs `flashpath serve` with its stderr in a file, waits until the RPC
//!   socket answers, and on drop stops it (SIGTERM, then SIGKILL after a timeout). If the test is
//!   failing when the daemon is dropped, the daemon's stderr is printed.
//! * [`BlkClient`] connects, starts the queues and maps one buffer arena; [`BlkClient::run`]
//!   submits a batch of requests spread over queues and waits for all of them, bounded in time;
//!   [`BlkClient::run_until`] gives up instead once the test has set its abort flag (a daemon
//!   about to be killed under the client).
//! * [`bounded`] runs a closure on a thread and fails the test if it does not return in time, so
//!   a hung daemon fails a test instead of hanging the suite.
//! * [`Daemon::start_with_config`] starts the daemon with a `--config` file instead;
//!   [`Daemon::kill9`] and [`Daemon::restart`] kill it with SIGKILL and start it again with the
//!   same command line, configuration and directory (crash-restart tests).
//! * [`guest`]: a QEMU guest booted against the daemon's sockets (tests/guest.rs).
//! * [`ceph`]: a real single-node Ceph cluster for the RBD tests, and its RADOS Gateway (S3).
//! * [`nvme_tcp`]: a minimal NVMe/TCP host (admin and one I/O queue, in-capsule writes, reads).

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod backup;
pub mod ceph;
pub mod fault;
pub mod guest;
pub mod load;
pub mod nbd;
pub mod nvme_tcp;
pub mod spdk;
pub mod xts;

/// Whether every one of `tools` is on the PATH. When one is missing the test must fail, unless
/// `skip_var`=1 outside CI: then this says why (`what`, the packages to install) and returns
/// false, and the test returns at once.
pub fn tools_or_skip(tools: &[&str], what: &str, skip_var: &str) -> bool {
    let installed = tools.iter().all(|tool| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !installed {
        let skip = std::env::var(skip_var).is_ok_and(|v| v == "1")
            && std::env::var("CI").map_or(true, |v| v != "true");
        assert!(skip, "{what} (./run test installs them; {skip_var}=1 skips these tests outside CI)");
        eprintln!("skipping: {what} and {skip_var}=1");
    }
    installed
}

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blkio::{Blkio, Blkioq, Completion, MemoryRegion, ReqFlags};
use serde_json::{json, Value};

/// How long the daemon gets to start answering RPCs.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the daemon gets to exit after SIGTERM before it is killed: its shutdown deadline
/// with the default bounds (the 5 s stop bound and 3 s for the stops to report, 8 s; see
/// docs/architecture.md) and room for a loaded machine. An upper limit, not a speed check.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Upper bound for one batch of requests to complete.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Where test directories go: not /tmp, which may be a tmpfs without O_DIRECT support.
fn scratch_base() -> PathBuf {
    for candidate in ["/var/tmp", env!("CARGO_TARGET_TMPDIR")] {
        let p = Path::new(candidate);
        if p.is_dir() {
            return p.to_path_buf();
        }
    }
    std::env::temp_dir()
}

/// A JSON-RPC error response.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

static NEXT_RPC_ID: AtomicU64 = AtomicU64::new(1);

/// Sends one JSON-RPC 2.0 request on a new connection to `sock` and reads one response.
pub fn rpc_call(
    sock: &Path,
    method: &str,
    params: Option<Value>,
) -> std::io::Result<Result<Value, RpcError>> {
    let mut stream = UnixStream::connect(sock)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_write_timeout(Some(Duration::from_secs(30)))?;
    let id = NEXT_RPC_ID.fetch_add(1, Ordering::Relaxed);
    let mut req = json!({"jsonrpc": "2.0", "id": id, "method": method});
    if let Some(p) = params {
        req["params"] = p;
    }
    let mut bytes = serde_json::to_vec(&req).expect("serialising a request");
    bytes.push(b'\n');
    stream.write_all(&bytes)?;
    let mut responses =
        serde_json::Deserializer::from_reader(BufReader::new(&mut stream)).into_iter::<Value>();
    let resp = match responses.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        None => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed without a response",
            ))
        }
    };
    assert_eq!(resp["jsonrpc"], "2.0", "response without jsonrpc 2.0: {resp}");
    assert_eq!(resp["id"], json!(id), "response id does not match request: {resp}");
    if let Some(err) = resp.get("error") {
        return Ok(Err(RpcError {
            code: err["code"].as_i64().unwrap_or(0),
            message: err["message"].as_str().unwrap_or("").to_string(),
        }));
    }
    Ok(Ok(resp.get("result").cloned().unwrap_or(Value::Null)))
}

/// A running `flashpath serve`, stopped on drop.
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub rpc: PathBuf,
    pub stderr_path: PathBuf,
    /// `serve`'s arguments, for [`Daemon::restart`].
    args: Vec<OsString>,
}

impl Daemon {
    /// Starts the daemon with reactors on `cpus` (e.g. "0" or "0,1") and waits until its RPC
    /// socket answers.
    pub fn start(cpus: &str) -> Daemon {
        Daemon::launch(cpus, &[], |_| None)
    }

    /// Starts the daemon with more `serve` options after the usual ones.
    pub fn start_with_args(cpus: &str, extra: &[&str]) -> Daemon {
        Daemon::launch(cpus, extra, |_| None)
    }

    /// Starts the daemon with `serve --config <dir>/flashpath.toml`, where `config` receives
    /// the test directory (for backing files and the like, created before the daemon starts)
    /// and returns the file's TOML text. The vhost-user sockets are `<dir>/<ctrlr>`, as with
    /// [`Daemon::start`].
    pub fn start_with_config(cpus: &str, config: impl FnOnce(&Path) -> String) -> Daemon {
        Daemon::launch(cpus, &[], |dir| Some(config(dir)))
    }

    fn launch(cpus: &str, extra: &[&str], config: impl FnOnce(&Path) -> Option<String>) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("fp-e2e-")
            .tempdir_in(scratch_base())
            .expect("creating the test directory");
        let rpc = dir.path().join("rpc.sock");
        let stderr_path = dir.path().join("daemon.stderr");
        let mut args: Vec<OsString> = vec!["serve".into(), "--cpus".into(), cpus.into(), "--rpc".into()];
        args.push(rpc.clone().into());
        args.push("--vhost-dir".into());
        args.push(dir.path().into());
        if let Some(text) = config(dir.path()) {
            let path = dir.path().join("flashpath.toml");
            std::fs::write(&path, text).expect("writing the configuration file");
            args.push("--config".into());
            args.push(path.into());
        }
        args.extend(extra.iter().map(OsString::from));
        let mut d = Daemon { child: None, dir, rpc, stderr_path, args };
        d.spawn();
        d.wait_ready();
        d
    }

    /// Runs `flashpath serve` with the stored arguments, appending to the stderr file.
    fn spawn(&mut self) {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_path)
            .expect("opening the stderr file");
        let child = Command::new(env!("CARGO_BIN_EXE_flashpath"))
            .args(&self.args)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawning flashpath serve");
        self.child = Some(child);
    }

    /// Kills the daemon with SIGKILL (no clean-up of any kind) and reaps it. Its directory,
    /// configuration and backing files stay for [`Daemon::restart`].
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        child.kill().expect("SIGKILL to flashpath serve");
        child.wait().ok()
    }

    /// Starts the daemon again with the same command line (and configuration file) after
    /// [`Daemon::kill9`] or [`Daemon::stop`], and waits until its RPC socket answers. Its stderr
    /// goes on in the same file, after a line that marks the restart.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart() while the daemon is running");
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.stderr_path) {
            let _ = writeln!(f, "---- test harness: restarting flashpath serve ----");
        }
        self.spawn();
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("flashpath serve exited during start-up with {status}:\n{}", self.stderr());
            }
            if self.rpc.exists() {
                if let Ok(Ok(_)) = rpc_call(&self.rpc, "bdev_get_bdevs", None) {
                    return;
                }
            }
            if start.elapsed() > START_TIMEOUT {
                panic!("flashpath serve did not answer RPCs within {START_TIMEOUT:?}:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon already stopped").id()
    }

    /// What the daemon wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_else(|e| format!("(no stderr: {e})"))
    }

    /// Calls `method`; returns the RPC result or error. Panics if the socket does not work.
    pub fn try_call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let params = if params.is_null() { None } else { Some(params) };
        match rpc_call(&self.rpc, method, params) {
            Ok(r) => r,
            Err(e) => panic!("RPC {method} failed at the transport level: {e}\n{}", self.stderr()),
        }
    }

    /// Calls `method` and returns its result; panics on an RPC error.
    pub fn call(&self, method: &str, params: Value) -> Value {
        match self.try_call(method, params.clone()) {
            Ok(v) => v,
            Err(e) => panic!("RPC {method} {params} failed: {} {}", e.code, e.message),
        }
    }

    /// Asserts the process is running and its RPC socket still answers.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("flashpath serve exited with {status}:\n{}", self.stderr());
        }
        let bdevs = self.call("bdev_get_bdevs", Value::Null);
        assert!(bdevs.is_array(), "bdev_get_bdevs returned {bdevs}");
    }

    /// A RAM disk (`bdev_malloc_create`).
    pub fn malloc(&self, name: &str, num_blocks: u64, block_size: u32) {
        let r = self.call(
            "bdev_malloc_create",
            json!({"name": name, "num_blocks": num_blocks, "block_size": block_size}),
        );
        assert_eq!(r, json!(name), "bdev_malloc_create returns the bdev name");
    }

    /// A zero-filled file of `size` bytes in the test directory.
    pub fn backing_file(&self, file_name: &str, size: u64) -> PathBuf {
        let path = self.dir.path().join(file_name);
        let f = File::create(&path).expect("creating the backing file");
        f.set_len(size).expect("sizing the backing file");
        path
    }

    /// A file disk (`bdev_uring_create`).
    pub fn uring(&self, name: &str, file: &Path, block_size: Option<u32>) {
        let mut params = json!({"name": name, "filename": file});
        if let Some(bs) = block_size {
            params["block_size"] = json!(bs);
        }
        let r = self.call("bdev_uring_create", params);
        assert_eq!(r, json!(name), "bdev_uring_create returns the bdev name");
    }

    /// A vhost-user-blk controller; returns its socket path.
    pub fn controller(&self, ctrlr: &str, dev: &str, num_queues: Option<u16>, readonly: bool) -> PathBuf {
        let mut params = json!({"ctrlr": ctrlr, "dev_name": dev, "readonly": readonly});
        if let Some(n) = num_queues {
            params["num_queues"] = json!(n);
        }
        self.call("vhost_create_blk_controller", params);
        let sock = self.dir.path().join(ctrlr);
        assert!(sock.exists(), "vhost_create_blk_controller did not create {}", sock.display());
        sock
    }

    /// Sends SIGTERM and asserts the daemon exits within [`STOP_TIMEOUT`], with status 0 or by
    /// the signal.
    pub fn assert_stops_on_sigterm(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let started = Instant::now();
        let status = self.stop().expect("daemon status");
        assert!(started.elapsed() < STOP_TIMEOUT, "SIGTERM took {:?}", started.elapsed());
        assert!(
            status.success() || status.signal() == Some(libc::SIGTERM),
            "the daemon did not exit cleanly on SIGTERM: {status}\n{}",
            self.stderr()
        );
    }

    /// Sends SIGTERM and waits for the exit status (SIGKILL after [`STOP_TIMEOUT`]).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if start.elapsed() < STOP_TIMEOUT => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    eprintln!("flashpath serve ignored SIGTERM for {STOP_TIMEOUT:?}; killing it");
                    let _ = child.kill();
                    return child.wait().ok();
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let status = self.stop();
        if std::thread::panicking() {
            eprintln!(
                "---- flashpath serve stderr ({}; exit {status:?}) ----\n{}\n---- end of stderr ----",
                self.stderr_path.display(),
                self.stderr()
            );
        }
    }
}

/// Runs `f` on its own thread; fails the test if it takes longer than `limit`, and re-raises its
/// panic if it panics.
pub fn bounded<T: Send + 'static>(limit: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(what.chars().take(15).collect())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawning a test thread");
    match rx.recv_timeout(limit) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(payload) => std::panic::resume_unwind(payload),
            Ok(()) => unreachable!("the thread ended without sending a result"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not finish within {limit:?} (hung daemon or client?)")
        }
    }
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Discard,
    /// Write zeroes; `unmap` lets the device deallocate (libblkio's flag NO_UNMAP when false).
    WriteZeroes {
        unmap: bool,
    },
}

/// One request of a batch. `buf` is an offset into the client's arena (reads and writes).
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub queue: usize,
    pub kind: OpKind,
    pub offset: u64,
    pub len: usize,
    pub buf: usize,
}

/// How to connect.
#[derive(Debug, Clone, Copy)]
pub struct ClientOpts {
    pub num_queues: usize,
    pub read_only: bool,
    /// Bytes of buffer arena to allocate and map.
    pub arena: usize,
}

impl Default for ClientOpts {
    fn default() -> Self {
        ClientOpts { num_queues: 1, read_only: false, arena: 4 << 20 }
    }
}

/// A started libblkio virtio-blk-vhost-user client with one mapped buffer arena.
///
/// Field order matters for drop: the queues go before the instance.
pub struct BlkClient {
    queues: Vec<Blkioq>,
    blkio: Blkio,
    arena: MemoryRegion,
    pub capacity: u64,
    /// `request-alignment`: the device's logical block size.
    pub block_size: usize,
    /// The largest single request this client issues (libblkio's `max-transfer`, capped).
    pub max_io: usize,
    pub max_queues: usize,
}

impl BlkClient {
    /// Connects to `socket` and starts `opts.num_queues` completion-fd queues.
    pub fn connect(socket: &Path, opts: ClientOpts) -> Result<BlkClient, blkio::Error> {
        let mut b = Blkio::new("virtio-blk-vhost-user")?;
        b.set_str("path", socket.to_str().expect("UTF-8 socket path"))?;
        if opts.read_only {
            b.set_bool("read-only", true)?;
        }
        b.connect()?;
        let capacity = b.get_u64("capacity")?;
        let block_size = b.get_i32("request-alignment")? as usize;
        let max_queues = b.get_i32("max-queues")? as usize;
        let max_transfer = b.get_i32("max-transfer")?;
        b.set_i32("num-queues", opts.num_queues as i32)?;
        let started = b.start()?;
        let arena = b.alloc_mem_region(opts.arena)?;
        b.map_mem_region(&arena)?;
        let max_io = if max_transfer > 0 { (max_transfer as usize).min(1 << 20) } else { 1 << 20 };
        Ok(BlkClient { queues: started.queues, blkio: b, arena, capacity, block_size, max_io, max_queues })
    }

    /// Connects with `num_queues` queues, panicking on failure.
    pub fn open(socket: &Path, num_queues: usize) -> BlkClient {
        BlkClient::connect(socket, ClientOpts { num_queues, ..ClientOpts::default() }).unwrap_or_else(|e| {
            panic!("libblkio connect/start on {}: {e} ({:?})", socket.display(), e.errno())
        })
    }

    pub fn num_queues(&self) -> usize {
        self.queues.len()
    }

    pub fn blkio(&self) -> &Blkio {
        &self.blkio
    }

    /// The buffer arena. No request is in flight while this borrow lives ([`BlkClient::run`]
    /// takes `&mut self` and waits for every request it submits).
    pub fn arena(&mut self) -> &mut [u8] {
        // SAFETY: the region was allocated by libblkio for this client (`len` bytes, mapped
        // read-write); the device only touches it during `run`, which cannot overlap this borrow.
        unsafe { std::slice::from_raw_parts_mut(self.arena.addr as *mut u8, self.arena.len) }
    }

    /// Replaces the buffer arena by a new region of `len` bytes: the new one is mapped (a
    /// vhost-user ADD_MEM_REG) before the old one is unmapped (REM_MEM_REG) and freed.
    pub fn replace_arena(&mut self, len: usize) {
        let new = self.blkio.alloc_mem_region(len).expect("alloc_mem_region");
        self.blkio.map_mem_region(&new).expect("map_mem_region (ADD_MEM_REG)");
        let old = std::mem::replace(&mut self.arena, new);
        self.blkio.unmap_mem_region(&old);
        self.blkio.free_mem_region(&old);
    }

    /// Submits every op (spread over their queues, all in flight together), waits for all of
    /// them and returns their `ret` values in order (0 or a negative errno).
    pub fn run(&mut self, ops: &[Op]) -> Vec<i32> {
        self.run_inner(ops, None).expect("run without an abort flag is never interrupted")
    }

    /// [`BlkClient::run`] for a device that may die under it (a daemon killed by the test):
    /// waits in short steps and returns `None`, with requests possibly still outstanding, as
    /// soon as `abort` is set and either a wait times out or libblkio reports an error. Set
    /// `abort` *before* killing the daemon, so an error seen without it is a real failure.
    /// After `None` the client is only fit to be dropped.
    pub fn run_until(&mut self, ops: &[Op], abort: &AtomicBool) -> Option<Vec<i32>> {
        self.run_inner(ops, Some(abort))
    }

    fn run_inner(&mut self, ops: &[Op], abort: Option<&AtomicBool>) -> Option<Vec<i32>> {
        let aborted = || abort.is_some_and(|a| a.load(Ordering::Acquire));
        let mut per_queue = vec![0usize; self.queues.len()];
        let arena_base = self.arena.addr as *mut u8;
        for (i, op) in ops.iter().enumerate() {
            assert!(op.queue < self.queues.len(), "op on queue {} of {}", op.queue, self.queues.len());
            if matches!(op.kind, OpKind::Read | OpKind::Write) {
                assert!(op.buf + op.len <= self.arena.len, "op buffer outside the arena");
            }
            // In bounds of the arena, checked above.
            let buf = arena_base.wrapping_add(op.buf);
            let q = &mut self.queues[op.queue];
            match op.kind {
                OpKind::Read => q.read(op.offset, buf, op.len, i, ReqFlags::empty()),
                OpKind::Write => q.write(op.offset, buf, op.len, i, ReqFlags::empty()),
                OpKind::Flush => q.flush(i, ReqFlags::empty()),
                OpKind::Discard => q.discard(op.offset, op.len as u64, i, ReqFlags::empty()),
                OpKind::WriteZeroes { unmap } => {
                    let flags = if unmap { ReqFlags::empty() } else { ReqFlags::NO_UNMAP };
                    q.write_zeroes(op.offset, op.len as u64, i, flags)
                }
            }
            per_queue[op.queue] += 1;
        }
        let mut rets = vec![i32::MIN; ops.len()];
        let mut completions: Vec<MaybeUninit<Completion>> =
            (0..ops.len().max(1)).map(|_| MaybeUninit::uninit()).collect();
        // Kick every queue first so all of them run concurrently, then wait queue by queue.
        for (qi, q) in self.queues.iter_mut().enumerate() {
            match q.do_io(&mut completions, 0, None, None) {
                Ok(n) => record(&completions, n, &mut rets, &mut per_queue[qi]),
                Err(_) if aborted() => return None,
                Err(e) => panic!("queue {qi}: do_io: {e}"),
            }
        }
        // With an abort flag, wait in steps short enough to notice it soon.
        let step = Duration::from_millis(20);
        let deadline = Instant::now() + IO_TIMEOUT;
        for (qi, q) in self.queues.iter_mut().enumerate() {
            while per_queue[qi] > 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                let mut timeout = if abort.is_some() { left.min(step) } else { left };
                match q.do_io(&mut completions, per_queue[qi], Some(&mut timeout), None) {
                    Ok(n) => record(&completions, n, &mut rets, &mut per_queue[qi]),
                    Err(_) if aborted() => return None,
                    Err(e) if e.errno() == blkio::Errno::TIME && !left.is_zero() && abort.is_some() => {
                        // A short step ended; record() keeps what did complete in `rets`.
                    }
                    Err(e) => panic!(
                        "queue {qi}: {} requests did not complete within {IO_TIMEOUT:?}: {e}",
                        per_queue[qi]
                    ),
                }
            }
        }
        assert!(rets.iter().all(|&r| r != i32::MIN), "a request completed twice or never");
        Some(rets)
    }

    /// Writes `data` at `offset` through `queue`; returns libblkio's `ret`.
    pub fn write(&mut self, queue: usize, offset: u64, data: &[u8]) -> i32 {
        self.arena()[..data.len()].copy_from_slice(data);
        self.run(&[Op { queue, kind: OpKind::Write, offset, len: data.len(), buf: 0 }])[0]
    }

    /// Reads `len` bytes at `offset` through `queue`.
    pub fn read(&mut self, queue: usize, offset: u64, len: usize) -> Result<Vec<u8>, i32> {
        let ret = self.run(&[Op { queue, kind: OpKind::Read, offset, len, buf: 0 }])[0];
        if ret < 0 {
            return Err(ret);
        }
        Ok(self.arena()[..len].to_vec())
    }

    pub fn flush(&mut self, queue: usize) -> i32 {
        self.run(&[Op { queue, kind: OpKind::Flush, offset: 0, len: 0, buf: 0 }])[0]
    }

    pub fn discard(&mut self, queue: usize, offset: u64, len: usize) -> i32 {
        self.run(&[Op { queue, kind: OpKind::Discard, offset, len, buf: 0 }])[0]
    }

    pub fn write_zeroes(&mut self, queue: usize, offset: u64, len: usize, unmap: bool) -> i32 {
        self.run(&[Op { queue, kind: OpKind::WriteZeroes { unmap }, offset, len, buf: 0 }])[0]
    }

    /// Writes `data` at `offset` in `max_io` pieces over queue 0, asserting success.
    pub fn write_all(&mut self, offset: u64, data: &[u8]) {
        let step = self.max_io.min(self.arena.len);
        for (i, chunk) in data.chunks(step).enumerate() {
            let off = offset + (i * step) as u64;
            let ret = self.write(0, off, chunk);
            assert_eq!(ret, 0, "write of {} bytes at {off} failed", chunk.len());
        }
    }

    /// Reads `len` bytes at `offset` in `max_io` pieces over queue 0, asserting success.
    pub fn read_all(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let step = self.max_io.min(self.arena.len);
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let n = step.min(len - out.len());
            let off = offset + out.len() as u64;
            let chunk =
                self.read(0, off, n).unwrap_or_else(|r| panic!("read of {n} bytes at {off}: ret {r}"));
            out.extend_from_slice(&chunk);
        }
        out
    }
}

fn record(completions: &[MaybeUninit<Completion>], n: usize, rets: &mut [i32], outstanding: &mut usize) {
    for c in &completions[..n] {
        // SAFETY: do_io() initialised the first `n` completions.
        let c = unsafe { c.assume_init_ref() };
        assert_eq!(rets[c.user_data], i32::MIN, "request {} completed twice", c.user_data);
        rets[c.user_data] = c.ret;
        *outstanding -= 1;
    }
}

impl Drop for BlkClient {
    fn drop(&mut self) {
        self.queues.clear();
        self.blkio.unmap_mem_region(&self.arena);
    }
}

/// Deterministic bytes for offset `offset` of a disk written with `seed`: every 8-byte word
/// encodes the seed and its own position, so a misplaced block is recognisable.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    assert_eq!(offset % 8, 0);
    let mut out = Vec::with_capacity(len + 8);
    let mut pos = offset;
    while out.len() < len {
        let word =
            (pos / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed.rotate_left(17) ^ 0xa5a5_0000_0000_5a5a;
        out.extend_from_slice(&word.to_le_bytes());
        pos += 8;
    }
    out.truncate(len);
    out
}

/// A block of `size` bytes stamped for the kill tests' models: `magic`, the block's index
/// `slot` and `generation` in its first three words, then `pattern(generation, offset)`; all
/// zeroes for generation 0 (never written). A block read back from the wrong place or from
/// another write does not compare equal.
pub fn stamped_block(magic: u64, slot: usize, generation: u64, size: usize) -> Vec<u8> {
    if generation == 0 {
        return vec![0; size];
    }
    let mut b = pattern(generation, (slot * size) as u64, size);
    b[..8].copy_from_slice(&magic.to_le_bytes());
    b[8..16].copy_from_slice(&(slot as u64).to_le_bytes());
    b[16..24].copy_from_slice(&generation.to_le_bytes());
    b
}

/// Asserts two byte strings are equal, reporting the first difference by disk offset.
pub fn assert_same(what: &str, base: u64, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at disk offset {} (byte {i} of {}): got {:#04x}, want {:#04x}",
            base + i as u64,
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// utime + stime of process `pid`, in clock ticks (all its threads).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading /proc/<pid>/stat");
    // The command name (field 2) is in parentheses and may contain spaces: parse after it.
    let rest = &stat[stat.rfind(')').expect("malformed stat") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields[14 - 3].parse().expect("utime");
    let stime: u64 = fields[15 - 3].parse().expect("stime");
    utime + stime
}

/// Clock ticks per second for [`cpu_ticks`].
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Reads lines from `r` until one ends with `marker` (libtest may print the test's name before
/// it on the same line); panics at end of stream.
pub fn wait_for_line(r: &mut BufReader<impl Read>, marker: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).expect("reading the child's stdout");
        assert!(n > 0, "the child exited before printing {marker}");
        if line.trim_end().ends_with(marker) {
            return;
        }
    }
}

/// Random writes and read-backs over `[base, base + len)`, checked against a shadow copy.
///
/// Each round puts `8 * num_queues` writes in flight at once (eight per queue, at random
/// non-overlapping offsets and random lengths up to 64 blocks), then as many reads of random
/// (possibly overlapping) ranges, and compares every byte whose content is known. At the end the
/// whole range is read back and compared. `initial` is the known starting content, if any (a
/// fresh file or RAM disk reads as zeroes). Returns the number of bytes compared.
pub fn random_write_verify(
    c: &mut BlkClient,
    seed: u64,
    rounds: usize,
    base: u64,
    len: u64,
    initial: Option<u8>,
) -> u64 {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let bs = c.block_size;
    let nq = c.num_queues();
    let k = 8 * nq;
    let max_blocks = (c.max_io / bs).clamp(1, 64).min((128 << 10) / bs).max(1);
    let stripe_blocks = (len as usize / bs) / k;
    assert!(stripe_blocks >= 1, "region too small for {k} stripes");
    assert!(k * max_blocks * bs <= c.arena().len(), "arena too small");
    let mut shadow = vec![initial.unwrap_or(0); len as usize];
    let mut known = vec![initial.is_some(); len as usize / bs];
    let mut compared = 0u64;

    let check = |what: &str, shadow: &[u8], known: &[bool], off: usize, got: &[u8]| -> u64 {
        let mut n = 0;
        for (bi, chunk) in got.chunks(bs).enumerate() {
            let block = off / bs + bi;
            if known[block] {
                let start = block * bs;
                assert_same(what, base + start as u64, chunk, &shadow[start..start + bs]);
                n += bs as u64;
            }
        }
        n
    };

    for round in 0..rounds {
        // Writes: one random extent per stripe, stripe i on queue i % nq.
        let mut ops = Vec::with_capacity(k);
        for i in 0..k {
            let blocks = rng.gen_range(1..=max_blocks.min(stripe_blocks));
            let first = i * stripe_blocks + rng.gen_range(0..=stripe_blocks - blocks);
            let off = first * bs;
            let n = blocks * bs;
            let buf = i * max_blocks * bs;
            let data = pattern(seed ^ ((round as u64) << 32) ^ i as u64, off as u64, n);
            c.arena()[buf..buf + n].copy_from_slice(&data);
            shadow[off..off + n].copy_from_slice(&data);
            known[first..first + blocks].iter_mut().for_each(|b| *b = true);
            ops.push(Op { queue: i % nq, kind: OpKind::Write, offset: base + off as u64, len: n, buf });
        }
        let rets = c.run(&ops);
        for (op, r) in ops.iter().zip(&rets) {
            assert_eq!(*r, 0, "round {round}: write of {} bytes at {} failed", op.len, op.offset);
        }

        // Reads: random extents anywhere in the region.
        let total_blocks = len as usize / bs;
        let mut ops = Vec::with_capacity(k);
        for i in 0..k {
            let blocks = rng.gen_range(1..=max_blocks.min(total_blocks));
            let first = rng.gen_range(0..=total_blocks - blocks);
            let buf = i * max_blocks * bs;
            c.arena()[buf..buf + blocks * bs].fill(0xee);
            ops.push(Op {
                queue: (i + round) % nq,
                kind: OpKind::Read,
                offset: base + (first * bs) as u64,
                len: blocks * bs,
                buf,
            });
        }
        let rets = c.run(&ops);
        for (op, r) in ops.iter().zip(&rets) {
            assert_eq!(*r, 0, "round {round}: read of {} bytes at {} failed", op.len, op.offset);
            let got = c.arena()[op.buf..op.buf + op.len].to_vec();
            let what = format!("round {round} read on queue {}", op.queue);
            compared += check(&what, &shadow, &known, (op.offset - base) as usize, &got);
        }
    }

    let all = c.read_all(base, len as usize);
    compared += check("final full read-back", &shadow, &known, 0, &all);
    compared
}
