//! The fault matrix's rig (tests/fault_matrix.rs, and the soak in tests/soak.rs): one export
//! over one stack of disks in a daemon of its own, a client of that export that can be held,
//! cut off or failed on purpose, a second disk with its own client on the same reactor (the
//! bystander), the faults and the events of docs/testing.md's "Fault matrix", and the daemon's
//! fd and thread counts.
//!
//! Every stack has an error bdev (docs/error.md) at its bottom, where the local faults are
//! injected; the remote stacks (NBD client, NVMe/TCP initiator) have it in a second daemon,
//! the remote, which also gets killed or stopped (SIGSTOP: a peer that stops reading). The
//! stacks that survive the daemon (everything but RAM) are built over files, and are built
//! again after a restart (auto-examine off, then `bdev_examine`, so a store or a raid
//! superblock is found through the error bdev and not on the file's bdev directly).

use std::net::Shutdown;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::nbd::{unix_uri, Endpoint, NbdConn, Sock};
use super::nvme_tcp::Host;
use super::{stamped_block, BlkClient, ClientOpts, Daemon, Op, OpKind};

/// Block size of every disk of the matrix.
pub const BS: usize = 4096;
/// Blocks of the exported disk (8 MiB); the stacks' bases are larger where they need room.
pub const DISK_BLOCKS: u64 = 2048;
/// Blocks of a LUKS2 header (16 MiB: the crypto stack's data starts after it).
pub const LUKS_HEADER_BLOCKS: u64 = (16 << 20) / BS as u64;
/// Upper bound of one event (an RPC, a stop, a client leaving): generous, not a speed check.
pub const EVENT_BOUND: Duration = Duration::from_secs(20);
/// Upper bound for the next client to be served after an event.
pub const SERVE_BOUND: Duration = Duration::from_secs(20);
/// Upper bound for the daemon's fds and threads to come back to their count.
pub const SETTLE_BOUND: Duration = Duration::from_secs(10);

const NQN: &str = "nqn.2016-06.io.flashpath:matrix";
const REMOTE_NQN: &str = "nqn.2016-06.io.flashpath:matrix-remote";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f8a5cfe-5a51-4b64-9f2c-6e3f0d1a2b3c";
/// Magic of the matrix's stamped blocks.
const MAGIC: u64 = 0x6d61_7472_6978_3035;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Export {
    /// vhost-user-blk, driven by libblkio.
    Vhost,
    /// NBD over a Unix socket, driven by the harness's NBD client.
    Nbd,
    /// NVMe/TCP, driven by the harness's NVMe/TCP host.
    Nvmf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    Ram,
    Lvol,
    Raid1,
    Crypto,
    NbdClient,
    NvmeInit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `nomem` on writes until cleared: the write is parked on Busy.
    Busy,
    /// `pending` on one write: held until resumed.
    Pending,
    /// `failure` on one write.
    Eio,
    /// `corrupt_data` on one read.
    Corrupt,
    /// The stack's base deleted: refused while claimed (local), or the remote export's base
    /// taken away (remote stacks).
    BaseRemoved,
    /// The remote daemon killed with SIGKILL, and started again afterwards.
    RemoteKilled,
    /// The remote daemon stopped (SIGSTOP): it reads nothing and answers nothing until SIGCONT.
    RemoteStalled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The client's connection closes with its request outstanding.
    Disconnect,
    /// The daemon stops the client's queues: vhost_delete_controller, nbd_stop_disk,
    /// nvmf_subsystem_remove_host.
    QueueStop,
    /// vhost-user migration on one daemon: a `migrate_from` controller takes the disk over.
    HandOff,
    /// The export removed and its disk released: vhost_delete_controller, nbd_stop_disk,
    /// nvmf_subsystem_remove_ns then nvmf_delete_subsystem.
    RemoveExport,
    /// bdev_raid_remove_base_bdev of the faulted replica.
    RaidRemoveBase,
    /// SIGTERM to the daemon, then a restart.
    Sigterm,
    /// SIGKILL to the daemon, then a restart.
    Kill9Restart,
}

impl Stack {
    pub fn remote(self) -> bool {
        matches!(self, Stack::NbdClient | Stack::NvmeInit)
    }
    /// Whether its data outlives the daemon (RAM does not).
    pub fn persistent(self) -> bool {
        self != Stack::Ram
    }
}

impl Fault {
    pub fn needs_remote(self) -> bool {
        matches!(self, Fault::RemoteKilled | Fault::RemoteStalled)
    }
    /// A fault that holds the request until it is cleared.
    pub fn holds(self) -> bool {
        matches!(self, Fault::Busy | Fault::Pending | Fault::RemoteStalled)
    }
}

impl Event {
    pub fn ends_daemon(self) -> bool {
        matches!(self, Event::Sigterm | Event::Kill9Restart)
    }
}

/// Why a combination is not a case, or `None` if it is one. A pair of values is covered by
/// the matrix unless every combination holding it is excluded here.
pub fn excluded(
    e: Option<Export>,
    s: Option<Stack>,
    f: Option<Fault>,
    v: Option<Event>,
) -> Option<&'static str> {
    if f.is_some_and(Fault::needs_remote) && s.is_some_and(|s| !s.remote()) {
        return Some("a remote fault needs a stack with a remote daemon");
    }
    if v == Some(Event::RaidRemoveBase) && s.is_some_and(|s| s != Stack::Raid1) {
        return Some("remove_base_bdev needs a raid1");
    }
    if v == Some(Event::RaidRemoveBase) && f.is_some_and(Fault::needs_remote) {
        return Some("the raid1 stack has no remote daemon");
    }
    if v == Some(Event::HandOff) && e.is_some_and(|e| e != Export::Vhost) {
        return Some("the migration hand-off is vhost-user's (docs/migration.md)");
    }
    None
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(Vec<u8>),
    /// The export answered with an error (negative errno, NBD error or NVMe status).
    Failed(String),
    /// No answer: the connection closed, or the client left.
    Gone(String),
}

/// A client of one of the exports.
pub enum Client {
    Vhost(BlkClient),
    Nbd(NbdConn),
    Nvmf(Host),
}

/// What cuts a client off from another thread.
pub enum Severer {
    Abort(Arc<AtomicBool>),
    Nbd(Sock),
    Nvmf(TcpStream),
}

impl Severer {
    pub fn sever(&self) {
        match self {
            Severer::Abort(a) => a.store(true, Ordering::Release),
            Severer::Nbd(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Severer::Nvmf(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Client {
    /// A handle that cuts this client off, and the flag a vhost client watches.
    pub fn severer(&mut self) -> (Severer, Arc<AtomicBool>) {
        let abort = Arc::new(AtomicBool::new(false));
        let s = match self {
            Client::Vhost(_) => Severer::Abort(abort.clone()),
            Client::Nbd(c) => Severer::Nbd(c.sock.try_clone().expect("cloning the NBD socket")),
            Client::Nvmf(h) => Severer::Nvmf(h.io.stream().try_clone().expect("cloning the NVMe/TCP socket")),
        };
        (s, abort)
    }

    /// Writes one block.
    pub fn write(&mut self, block: u64, data: &[u8], abort: &AtomicBool) -> Outcome {
        assert_eq!(data.len(), BS);
        let off = block * BS as u64;
        match self {
            Client::Vhost(c) => {
                c.arena()[..BS].copy_from_slice(data);
                let op = Op { queue: 0, kind: OpKind::Write, offset: off, len: BS, buf: 0 };
                match c.run_until(&[op], abort) {
                    None => Outcome::Gone("the client left".into()),
                    Some(r) if r[0] == 0 => Outcome::Done(Vec::new()),
                    Some(r) => Outcome::Failed(format!("ret {}", r[0])),
                }
            }
            Client::Nbd(c) => match c.write(off, data, 0) {
                Ok(0) => Outcome::Done(Vec::new()),
                Ok(e) => Outcome::Failed(format!("NBD error {e}")),
                Err(e) => Outcome::Gone(e.to_string()),
            },
            Client::Nvmf(h) => match h.io.write(1, block, BS, data) {
                Ok(c) if c.status == 0 => Outcome::Done(Vec::new()),
                Ok(c) => Outcome::Failed(format!("NVMe status {:#x}", c.status)),
                Err(e) => Outcome::Gone(e.to_string()),
            },
        }
    }

    /// Reads one block.
    pub fn read(&mut self, block: u64, abort: &AtomicBool) -> Outcome {
        let off = block * BS as u64;
        match self {
            Client::Vhost(c) => {
                let op = Op { queue: 0, kind: OpKind::Read, offset: off, len: BS, buf: 0 };
                match c.run_until(&[op], abort) {
                    None => Outcome::Gone("the client left".into()),
                    Some(r) if r[0] == 0 => Outcome::Done(c.arena()[..BS].to_vec()),
                    Some(r) => Outcome::Failed(format!("ret {}", r[0])),
                }
            }
            Client::Nbd(c) => match c.read(off, BS as u32) {
                Ok(Ok(d)) => Outcome::Done(d),
                Ok(Err(e)) => Outcome::Failed(format!("NBD error {e}")),
                Err(e) => Outcome::Gone(e.to_string()),
            },
            Client::Nvmf(h) => match h.io.read(1, block, BS, 1) {
                Ok((c, d)) if c.status == 0 => Outcome::Done(d),
                Ok((c, _)) => Outcome::Failed(format!("NVMe status {:#x}", c.status)),
                Err(e) => Outcome::Gone(e.to_string()),
            },
        }
    }
}

/// The seeded content of `block` at `generation`.
pub fn block_data(block: u64, generation: u64) -> Vec<u8> {
    stamped_block(MAGIC, block as usize, generation, BS)
}

/// The model of acknowledged writes: the last acknowledged generation of each block.
#[derive(Default, Clone)]
pub struct Model {
    pub acked: std::collections::BTreeMap<u64, u64>,
}

/// Counts of a process's open fds and threads.
pub fn fds_and_threads(pid: u32) -> (usize, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(usize::MAX);
    // An io_uring's kernel workers (`iou-wrk-*`, made when an operation must block) are the
    // kernel's: the last one of a ring stays as long as the ring, which is the reactor's, so
    // it is no thread a case leaked.
    let threads = thread_names(pid).iter().filter(|n| !n.starts_with("iou-")).count();
    (fds, threads)
}

/// The names of `pid`'s threads, sorted (to say which one a case left behind).
pub fn thread_names(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `pid`'s open fds: number and what each one is.
pub fn fd_list(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| {
                    let to =
                        std::fs::read_link(e.path()).map(|p| p.display().to_string()).unwrap_or_default();
                    format!("{}={to}", e.file_name().to_string_lossy())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// What is at the other end of each socket among `fds` (entries of [`fd_list`]): the `ss`
/// lines of the socket and of its peer, with the processes holding them. A socket that stays
/// open names the connection that was not closed, and whose side let it linger.
pub fn socket_peers(fds: &[&String]) -> Vec<String> {
    let ss = |args: &[&str]| {
        std::process::Command::new("ss")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let unix = ss(&["-xanp"]);
    let tcp = ss(&["-tanpe"]);
    let mut out = Vec::new();
    for f in fds {
        let Some(inode) = f.split("socket:[").nth(1).and_then(|s| s.strip_suffix(']')) else { continue };
        // Unix: "u_str STATE rq sq PATH INODE PEERPATH PEERINODE users:(...)".
        let by_local =
            |ino: &str| unix.lines().find(|l| l.split_whitespace().nth(5) == Some(ino)).map(str::to_string);
        if let Some(line) = by_local(inode) {
            let peer = line.split_whitespace().nth(7).unwrap_or("").to_string();
            let peer_line = by_local(&peer).unwrap_or_else(|| format!("(peer {peer} not found)"));
            out.push(format!("{f}: unix {line} <-> {peer_line}"));
            continue;
        }
        let tag = format!("ino:{inode} ");
        if let Some(line) = tcp.lines().find(|l| l.contains(&tag)) {
            let w: Vec<&str> = line.split_whitespace().collect();
            let (local, remote) = (w.get(3).copied().unwrap_or(""), w.get(4).copied().unwrap_or(""));
            let peer_line = tcp
                .lines()
                .find(|l| {
                    let v: Vec<&str> = l.split_whitespace().collect();
                    v.get(3) == Some(&remote) && v.get(4) == Some(&local)
                })
                .unwrap_or("(peer not found)");
            out.push(format!("{f}: tcp {line} <-> {peer_line}"));
            continue;
        }
        out.push(format!("{f}: not in ss's lists"));
    }
    out
}

/// `pid`'s fds and threads once they hold still for a moment (an RPC's connection and its
/// thread end shortly after the answer).
pub fn settled_counts(pid: u32) -> (usize, usize) {
    let deadline = Instant::now() + SETTLE_BOUND;
    let mut last = fds_and_threads(pid);
    let mut same = 0;
    while same < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(40));
        let now = fds_and_threads(pid);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// Waits (bounded) until `pid`'s fds and threads are back to `baseline` (or fewer: nothing
/// leaked); panics with both.
pub fn assert_settles(pid: u32, baseline: (usize, usize), what: &str) {
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        let now = fds_and_threads(pid);
        if now.0 <= baseline.0 && now.1 <= baseline.1 {
            return;
        }
        if Instant::now() > deadline {
            let fds = fd_list(pid);
            let threads = thread_names(pid);
            panic!(
                "{what}: the daemon's (fds, threads) are {now:?}, were {baseline:?} before the case; fds now: {fds:?}; \
                 threads now: {threads:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `f` on a thread; `Err` if it did not return within `limit` (the thread is left).
pub fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => Ok(v),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(format!("not done within {limit:?}")),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err("panicked".into()),
    }
}

/// An RPC on a daemon's socket from any thread (the `Daemon` stays where it is).
pub fn rpc(sock: &std::path::Path, method: &str, params: Value) -> Result<Value, String> {
    match super::rpc_call(sock, method, Some(params)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{method}: {} {}", e.code, e.message)),
        Err(e) => Err(format!("{method}: transport: {e}")),
    }
}

/// The second disk on the daemon's reactor, with its own libblkio client writing and reading
/// back stamped blocks until stopped.
pub struct Bystander {
    pub done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    abort: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<u64, String>>>,
}

impl Bystander {
    /// Creates the bystander's disk and its controller.
    pub fn prepare(d: &Daemon) {
        d.malloc("by", 256, BS as u32);
        d.controller("by", "by", Some(1), false);
    }

    /// Starts the bystander's client (after [`Bystander::prepare`]).
    pub fn start(d: &Daemon) -> Bystander {
        let sock = d.dir.path().join("by");
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let abort = Arc::new(AtomicBool::new(false));
        let (done2, stop2, abort2) = (done.clone(), stop.clone(), abort.clone());
        let mut client =
            BlkClient::connect(&sock, ClientOpts { num_queues: 1, read_only: false, arena: 1 << 20 })
                .unwrap_or_else(|e| panic!("the bystander's client: {e}"));
        let thread = std::thread::spawn(move || {
            let mut generation = 0u64;
            while !stop2.load(Ordering::Acquire) {
                generation += 1;
                let slot = generation % 64;
                let data = stamped_block(MAGIC ^ 1, slot as usize, generation, BS);
                client.arena()[..BS].copy_from_slice(&data);
                let off = slot * BS as u64;
                let w = Op { queue: 0, kind: OpKind::Write, offset: off, len: BS, buf: 0 };
                let r = Op { queue: 0, kind: OpKind::Read, offset: off, len: BS, buf: BS };
                match client.run_until(&[w], &abort2) {
                    None => return Ok(done2.load(Ordering::Acquire)),
                    Some(r) if r[0] != 0 => return Err(format!("bystander write: ret {}", r[0])),
                    Some(_) => {}
                }
                match client.run_until(&[r], &abort2) {
                    None => return Ok(done2.load(Ordering::Acquire)),
                    Some(r) if r[0] != 0 => return Err(format!("bystander read: ret {}", r[0])),
                    Some(_) => {}
                }
                if client.arena()[BS..2 * BS] != data[..] {
                    return Err(format!("bystander block {slot} read back wrong"));
                }
                done2.fetch_add(1, Ordering::AcqRel);
            }
            Ok(done2.load(Ordering::Acquire))
        });
        Bystander { done, stop, abort, thread: Some(thread) }
    }

    pub fn count(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }

    /// Waits (bounded) until the bystander has completed `n` more verified writes from now.
    pub fn assert_progress(&self, n: u64, what: &str) {
        let from = self.count();
        let deadline = Instant::now() + EVENT_BOUND;
        while self.count() < from + n {
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                break;
            }
            assert!(Instant::now() < deadline, "{what}: the bystander disk made no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(self.count() >= from + n, "{what}: the bystander's client stopped");
    }

    /// Lets the client leave without waiting for the daemon (which is about to go).
    pub fn abandon(mut self) {
        self.abort.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let r = within(EVENT_BOUND, move || t.join()).expect("the bystander's client leaves");
            r.expect("the bystander's thread").expect("the bystander's I/O before the daemon went");
        }
    }

    /// Stops the client and returns how many verified writes it made; panics on its error.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Release);
        let t = self.thread.take().expect("running");
        within(EVENT_BOUND, move || t.join())
            .expect("the bystander's client stops")
            .expect("the bystander's thread")
            .expect("the bystander's I/O")
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        self.abort.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
    }
}

/// One case's daemons, stack and export.
pub struct Rig {
    pub export: Export,
    pub stack: Stack,
    pub local: Daemon,
    pub remote: Option<Daemon>,
    remote_port: u16,
    nvmf_port: u16,
    nvmf_transport: bool,
    /// The socket implementation the NVMe/TCP export's queue pairs use.
    nvmf_sock_impl: &'static str,
    /// The exported bdev.
    pub top: String,
    /// The vhost controller serving `top` now ("v", or "v2" after a hand-off).
    pub ctrlr: String,
}

fn free_port() -> u16 {
    super::nbd::free_port()
}

impl Rig {
    /// A rig whose NVMe/TCP export's queue pairs use `nvmf_sock_impl` (`posix`, `uring`).
    pub fn new(export: Export, stack: Stack, nvmf_sock_impl: &'static str) -> Rig {
        let remote = stack.remote().then(|| Daemon::start("0"));
        let local = Daemon::start("0");
        let mut rig = Rig {
            export,
            stack,
            local,
            remote,
            remote_port: free_port(),
            nvmf_port: free_port(),
            nvmf_transport: false,
            nvmf_sock_impl,
            top: String::new(),
            ctrlr: "v".into(),
        };
        rig.build_remote(true);
        rig.build_local(true);
        rig.export_top();
        rig
    }

    /// The daemon and error bdev where the local faults go.
    pub fn fault_point(&self) -> (&Daemon, &'static str) {
        match self.stack {
            Stack::Ram => (&self.local, "EE_m"),
            Stack::NbdClient | Stack::NvmeInit => (self.remote.as_ref().expect("remote"), "EE_u0"),
            _ => (&self.local, "EE_u0"),
        }
    }

    fn remote_nbd_sock(&self) -> PathBuf {
        self.remote.as_ref().expect("remote").dir.path().join("r.nbd")
    }

    /// The remote's export of its base, over a file that survives it.
    pub fn build_remote(&mut self, first: bool) {
        let Some(r) = self.remote.as_ref() else { return };
        let file = r.dir.path().join("r0.img");
        if first {
            std::fs::File::create(&file).unwrap().set_len(DISK_BLOCKS * BS as u64).unwrap();
        }
        r.uring("u0", &file, Some(BS as u32));
        r.call("bdev_error_create", json!({"base_name": "u0"}));
        self.remote_export();
    }

    /// The remote's export of EE_u0 (again, after BaseRemoved took it away).
    pub fn remote_export(&self) {
        let r = self.remote.as_ref().expect("remote");
        match self.stack {
            Stack::NbdClient => {
                let sock = self.remote_nbd_sock();
                super::nbd::start_export(r, "EE_u0", sock.to_str().unwrap(), false);
            }
            Stack::NvmeInit => {
                if r.try_call("nvmf_get_subsystems", json!({"nqn": REMOTE_NQN})).is_err() {
                    let _ = r.try_call("nvmf_create_transport", json!({"trtype": "TCP"}));
                    r.call("nvmf_create_subsystem", json!({"nqn": REMOTE_NQN, "allow_any_host": true}));
                    let listen = json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                                        "trsvcid": self.remote_port.to_string()});
                    r.call(
                        "nvmf_subsystem_add_listener",
                        json!({"nqn": REMOTE_NQN, "listen_address": listen}),
                    );
                }
                r.call(
                    "nvmf_subsystem_add_ns",
                    json!({"nqn": REMOTE_NQN, "namespace": {"bdev_name": "EE_u0", "nsid": 1}}),
                );
            }
            _ => unreachable!(),
        }
    }

    /// Takes the remote's base away from its export (BaseRemoved on a remote stack).
    pub fn remote_unexport(&self) {
        let r = self.remote.as_ref().expect("remote");
        match self.stack {
            Stack::NbdClient => {
                r.call("nbd_stop_disk", json!({"nbd_device": self.remote_nbd_sock()}));
            }
            Stack::NvmeInit => {
                r.call("nvmf_subsystem_remove_ns", json!({"nqn": REMOTE_NQN, "nsid": 1}));
            }
            _ => unreachable!(),
        }
    }

    fn file(&self, name: &str, first: bool, blocks: u64) -> PathBuf {
        let path = self.local.dir.path().join(name);
        if first {
            std::fs::File::create(&path).unwrap().set_len(blocks * BS as u64).unwrap();
        }
        path
    }

    /// Starts an online re-encryption of LUKS disk `name` and pauses it after its first
    /// hotzones: the case's I/O meets both keys, the new one below the boundary and the old
    /// one above it (64 KiB hotzones at 1 MiB/s: the 8 MiB disk would take 8 s, the pause
    /// lands within a few hotzones).
    fn pause_reencryption_midway(&self, name: &str) {
        let d = &self.local;
        d.call(
            "bdev_luks_reencrypt_start",
            json!({"name": name, "key_name": "pass", "hotzone_size": 65536, "speed_limit": 1,
                   "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000}),
        );
        let job = || {
            let jobs = d.call("bdev_luks_reencrypt_get", json!({"name": name}));
            jobs.as_array().and_then(|a| a.first()).cloned().expect("the job")
        };
        let deadline = Instant::now() + EVENT_BOUND;
        while job()["done_bytes"].as_u64() == Some(0) {
            assert!(Instant::now() < deadline, "re-encryption of {name} made no progress: {}", job());
            std::thread::sleep(Duration::from_millis(10));
        }
        d.call("bdev_luks_reencrypt_pause", json!({"name": name}));
        let j = loop {
            let j = job();
            if j["state"] == "paused" {
                break j;
            }
            assert!(Instant::now() < deadline && j["state"] == "running", "pausing {name}: {j}");
            std::thread::sleep(Duration::from_millis(10));
        };
        let (done, total) = (j["done_bytes"].as_u64().unwrap(), j["total_bytes"].as_u64().unwrap());
        assert!(0 < done && done < total, "{name} paused midway: {j}");
    }

    fn wait_bdev(&self, name: &str) {
        let deadline = Instant::now() + EVENT_BOUND;
        while self.local.try_call("bdev_get_bdevs", json!({"name": name})).is_err() {
            assert!(Instant::now() < deadline, "bdev {name} did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The local stack (and the bystander's disk), on a new daemon or again after a restart.
    pub fn build_local(&mut self, first: bool) {
        let d = &self.local;
        if matches!(self.stack, Stack::Lvol | Stack::Raid1) {
            d.call("bdev_set_options", json!({"bdev_auto_examine": false}));
        }
        self.top = match self.stack {
            Stack::Ram => {
                d.malloc("m", DISK_BLOCKS, BS as u32);
                d.call("bdev_error_create", json!({"base_name": "m"}));
                "EE_m".into()
            }
            Stack::Lvol => {
                let f = self.file("u0.img", first, DISK_BLOCKS * 2);
                d.uring("u0", &f, Some(BS as u32));
                d.call("bdev_error_create", json!({"base_name": "u0"}));
                if first {
                    d.call(
                        "bdev_lvol_create_lvstore",
                        json!({"bdev_name": "EE_u0", "lvs_name": "lvs", "cluster_sz": 1 << 20}),
                    );
                    d.call(
                        "bdev_lvol_create",
                        json!({"lvs_name": "lvs", "lvol_name": "v", "size_in_mib": (DISK_BLOCKS * BS as u64) >> 20}),
                    );
                } else {
                    d.call("bdev_examine", json!({"name": "EE_u0"}));
                    self.wait_bdev("lvs/v");
                }
                "lvs/v".into()
            }
            Stack::Raid1 => {
                for i in 0..2 {
                    let f = self.file(&format!("u{i}.img"), first, DISK_BLOCKS + 256);
                    self.local.uring(&format!("u{i}"), &f, Some(BS as u32));
                    self.local.call("bdev_error_create", json!({"base_name": format!("u{i}")}));
                }
                let d = &self.local;
                if first {
                    d.call(
                        "bdev_raid_create",
                        json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["EE_u0", "EE_u1"], "superblock": true}),
                    );
                } else {
                    d.call("bdev_examine", json!({"name": "EE_u0"}));
                    d.call("bdev_examine", json!({"name": "EE_u1"}));
                    self.wait_bdev("r");
                }
                "r".into()
            }
            Stack::Crypto => {
                // A LUKS2 volume: its 16 MiB of header before the disk, opened with a keyring
                // passphrase (again after a restart, from the header the first start wrote).
                let f = self.file("u0.img", first, DISK_BLOCKS + LUKS_HEADER_BLOCKS);
                d.uring("u0", &f, Some(BS as u32));
                d.call("bdev_error_create", json!({"base_name": "u0"}));
                let pass = d.dir.path().join("luks.pass");
                if first {
                    use std::os::unix::fs::OpenOptionsExt;
                    let mut file = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&pass)
                        .expect("the passphrase file");
                    std::io::Write::write_all(&mut file, b"fault matrix").expect("writing the passphrase");
                }
                d.call("keyring_file_add_key", json!({"name": "pass", "path": pass}));
                if first {
                    d.call(
                        "bdev_luks_format",
                        json!({"base_bdev_name": "EE_u0", "key_name": "pass", "sector_size": BS,
                               "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000}),
                    );
                }
                d.call(
                    "bdev_crypto_create",
                    json!({"base_bdev_name": "EE_u0", "name": "c", "luks_key_name": "pass"}),
                );
                // The volume is mid re-encryption in every case. After a restart the open finds
                // the job in the header and resumes it: the case's I/O then runs beside it.
                if first {
                    self.pause_reencryption_midway("c");
                }
                "c".into()
            }
            Stack::NbdClient => {
                let uri = unix_uri("EE_u0", &self.remote_nbd_sock());
                d.call("bdev_nbd_client_create", json!({"name": "rn", "address": uri}));
                "rn".into()
            }
            Stack::NvmeInit => {
                let names = d.call(
                    "bdev_nvme_attach_controller",
                    json!({"name": "Nv", "trtype": "tcp", "traddr": "127.0.0.1", "adrfam": "ipv4",
                           "trsvcid": self.remote_port.to_string(), "subnqn": REMOTE_NQN,
                           "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1, "fast_io_fail_timeout_sec": 1}),
                );
                assert_eq!(names, json!(["Nvn1"]));
                "Nvn1".into()
            }
        };
        self.nvmf_transport = false;
        self.ctrlr = "v".into();
    }

    /// The NBD export's socket.
    fn nbd_sock(&self) -> PathBuf {
        self.local.dir.path().join("x.nbd")
    }

    /// The NBD export's URI.
    pub fn nbd_uri(&self) -> String {
        unix_uri(&self.top, &self.nbd_sock())
    }

    /// Exports `top` (again).
    pub fn export_top(&mut self) {
        let d = &self.local;
        match self.export {
            Export::Vhost => {
                d.controller(&self.ctrlr, &self.top, Some(1), false);
            }
            Export::Nbd => {
                super::nbd::start_export(d, &self.top, self.nbd_sock().to_str().unwrap(), false);
            }
            Export::Nvmf => {
                if !self.nvmf_transport {
                    d.call("nvmf_create_transport", json!({"trtype": "TCP"}));
                    d.call("sock_set_default_impl", json!({"impl_name": self.nvmf_sock_impl}));
                    self.nvmf_transport = true;
                }
                d.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": false}));
                d.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOSTNQN}));
                d.call(
                    "nvmf_subsystem_add_ns",
                    json!({"nqn": NQN, "namespace": {"bdev_name": self.top, "nsid": 1}}),
                );
                let listen = json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                                    "trsvcid": self.nvmf_port.to_string()});
                d.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": listen}));
            }
        }
    }

    /// The RPC that stops serving the client's queues (Event::QueueStop), and what undoes it.
    pub fn queue_stop_rpc(&self) -> (&'static str, Value) {
        match self.export {
            Export::Vhost => ("vhost_delete_controller", json!({"ctrlr": self.ctrlr})),
            Export::Nbd => ("nbd_stop_disk", json!({"nbd_device": self.nbd_sock()})),
            Export::Nvmf => ("nvmf_subsystem_remove_host", json!({"nqn": NQN, "host": HOSTNQN})),
        }
    }

    /// After [`Rig::queue_stop_rpc`]: serve again.
    pub fn undo_queue_stop(&mut self) {
        match self.export {
            Export::Nvmf => {
                self.local.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOSTNQN}));
            }
            _ => self.export_top(),
        }
    }

    /// The RPCs that remove the export (Event::RemoveExport).
    pub fn remove_export_rpcs(&self) -> Vec<(&'static str, Value)> {
        match self.export {
            Export::Vhost => vec![("vhost_delete_controller", json!({"ctrlr": self.ctrlr}))],
            Export::Nbd => vec![("nbd_stop_disk", json!({"nbd_device": self.nbd_sock()}))],
            Export::Nvmf => vec![
                ("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 1})),
                ("nvmf_delete_subsystem", json!({"nqn": NQN})),
            ],
        }
    }

    /// Whether `top` is claimed by anything (an export).
    pub fn top_claimed(&self) -> bool {
        let b = self.local.call("bdev_get_bdevs", json!({"name": self.top}));
        b[0]["claimed"].as_bool().unwrap_or(true)
    }

    /// Connects a client to the export once.
    pub fn try_connect(&self) -> Result<Client, String> {
        let export = self.export;
        let vsock = self.local.dir.path().join(&self.ctrlr);
        let nsock = self.nbd_sock();
        let name = self.top.clone();
        let addr = format!("127.0.0.1:{}", self.nvmf_port);
        let r = std::panic::catch_unwind(move || match export {
            Export::Vhost => {
                BlkClient::connect(&vsock, ClientOpts { num_queues: 1, read_only: false, arena: 1 << 20 })
                    .map(Client::Vhost)
                    .map_err(|e| format!("libblkio: {e}"))
            }
            Export::Nbd => {
                NbdConn::connect(&Endpoint::Unix(nsock), &name).map(Client::Nbd).map_err(|e| e.to_string())
            }
            Export::Nvmf => Host::connect(&addr, NQN, HOSTNQN).map(Client::Nvmf).map_err(|e| e.to_string()),
        });
        r.unwrap_or_else(|p| {
            Err(p
                .downcast_ref::<String>()
                .cloned()
                .or(p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default())
        })
    }

    /// Connects a client, retrying until [`SERVE_BOUND`].
    pub fn connect(&self, what: &str) -> Client {
        let deadline = Instant::now() + SERVE_BOUND;
        loop {
            match self.try_connect() {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => {
                    panic!("{what}: no client served within {SERVE_BOUND:?}: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Rebuilds the local bdev over the remote after its connection broke (the NBD client
    /// does not reconnect; the NVMe/TCP initiator does, and its namespace comes back), and
    /// exports it again.
    pub fn reattach_remote(&mut self) {
        let mut removals = self.remove_export_rpcs();
        if self.export == Export::Vhost {
            removals = vec![
                ("vhost_delete_controller", json!({"ctrlr": "v"})),
                ("vhost_delete_controller", json!({"ctrlr": "v2"})),
            ];
            self.ctrlr = "v".into();
        }
        for (m, p) in removals {
            let _ = self.local.try_call(m, p);
        }
        let deadline = Instant::now() + EVENT_BOUND;
        match self.stack {
            Stack::NbdClient => {
                while let Err(e) = self.local.try_call("bdev_nbd_client_delete", json!({"name": "rn"})) {
                    assert!(Instant::now() < deadline, "bdev_nbd_client_delete rn: {}", e.message);
                    std::thread::sleep(Duration::from_millis(20));
                }
                let uri = unix_uri("EE_u0", &self.remote_nbd_sock());
                self.local.call("bdev_nbd_client_create", json!({"name": "rn", "address": uri}));
            }
            Stack::NvmeInit => loop {
                let c = self.local.call("bdev_nvme_get_controllers", json!({"name": "Nv"}));
                let enabled = c[0]["ctrlrs"][0]["state"] == "enabled";
                if enabled && self.local.try_call("bdev_get_bdevs", json!({"name": "Nvn1"})).is_ok() {
                    break;
                }
                assert!(Instant::now() < deadline, "the NVMe/TCP initiator did not come back: {c}");
                std::thread::sleep(Duration::from_millis(50));
            },
            _ => unreachable!(),
        }
        self.export_top();
    }

    /// `bdev_get_iostat`'s queue depth of `top`: requests in flight below the export.
    pub fn top_in_flight(&self) -> u64 {
        let s = self.local.call("bdev_get_iostat", json!({"name": self.top}));
        s["bdevs"][0]["queue_depth"].as_u64().unwrap_or(0)
    }
}
