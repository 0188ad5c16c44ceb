//! The hostile-guest suite: a vhost-user frontend written for this test (on the `vhost` crate's
//! frontend API) maps its own "guest memory", sets up a ring on a real `flashpath serve`, and
//! then does what a malicious or broken guest driver can do: descriptor loops, nested and
//! out-of-memory indirect tables, absurd lengths, overlapping buffers, a read-only status byte,
//! an available index far ahead, the same head twice, memory it cannot share writably, a
//! memory table that changes under in-flight I/O, notification fds that are not eventfds or
//! that can no longer be written.
//!
//! Throughout, a second client (libblkio) runs verified writes and reads against another disk
//! served by the same reactor. For every case the suite checks that
//! * the bad request gets an error status in the used ring, or its queue fails cleanly (the
//!   controller's `failed_queues` counter), or the connection is refused — whichever the case
//!   pins, never "anything goes";
//! * the daemon is still running and answering RPC, and never logged a panic;
//! * the victim disk's I/O kept going and every byte read back was what was written;
//! * the hostile controller serves a well-behaved frontend afterwards.
//!
//! Ring layout and descriptor format: virtio 1.2 §2.7 (split virtqueues); block requests:
//! §5.2.6.

mod common;

use std::fs::File;
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{pattern, BlkClient, Daemon};
use serde_json::json;
use vhost::vhost_user::message::{VhostUserInflight, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

// ---- Guest memory ------------------------------------------------------------------------------

/// Guest-physical base of the test guest's memory. Not zero, so that a confusion between
/// offsets, guest addresses and VMM addresses cannot go unnoticed.
const GPA: u64 = 0x1000_0000;
const MEM_SIZE: usize = 4 << 20;
const QUEUE_SIZE: u16 = 128;

// Offsets in guest memory.
const DESC: usize = 0x0000;
const AVAIL: usize = 0x1000;
const USED: usize = 0x2000;
/// Indirect descriptor tables, 0x2000 bytes apiece (up to 512 entries).
const INDIRECT: usize = 0x8000;
/// Request buffers: one 0x4000-byte area per head: header at +0, data at +0x1000 (4 KiB),
/// status at +0x3000.
const BUFFERS: usize = 0x10_0000;

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
/// Written into status bytes before posting, so that "never written" is visible.
const S_UNTOUCHED: u8 = 0xee;

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const PROTOCOL_FEATURES: u64 = 1 << 30;

/// A shared mapping of (the start of) a file.
struct MappedFile {
    ptr: *mut u8,
    len: usize,
}

impl MappedFile {
    fn new(file: &File, len: usize) -> MappedFile {
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        MappedFile { ptr: ptr.cast(), len }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`, which nothing else uses now.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A shared-memory file mapped into this process: the guest's RAM.
struct GuestMem {
    file: File,
    ptr: *mut u8,
    len: usize,
    _map: MappedFile,
}

impl GuestMem {
    fn new(len: usize) -> GuestMem {
        // SAFETY: a NUL-terminated name and valid flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"hostile-guest".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64).unwrap();
        let map = MappedFile::new(&file, len);
        GuestMem { ptr: map.ptr, len, file, _map: map }
    }

    /// The VMM virtual address of `off` (what SET_VRING_ADDR carries).
    fn user_addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    fn check(&self, off: usize, n: usize) {
        assert!(off + n <= self.len, "test bug: offset {off:#x}+{n} outside guest memory");
    }

    fn write(&self, off: usize, bytes: &[u8]) {
        self.check(off, bytes.len());
        // SAFETY: inside our own live mapping (checked above); the daemon may access the same
        // bytes concurrently, which for plain bytes is only a data race on the guest's side.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) };
    }

    fn read(&self, off: usize, n: usize) -> Vec<u8> {
        self.check(off, n);
        let mut v = vec![0u8; n];
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), n) };
        v
    }

    fn write_u16(&self, off: usize, v: u16) {
        self.check(off, 2);
        // SAFETY: inside our mapping; ring fields are naturally aligned, and volatile because
        // the daemon reads them concurrently.
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u16>(), v.to_le()) };
    }

    fn read_u16(&self, off: usize) -> u16 {
        self.check(off, 2);
        // SAFETY: as in `write_u16`.
        u16::from_le(unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u16>()) })
    }

    fn read_u32(&self, off: usize) -> u32 {
        self.check(off, 4);
        // SAFETY: as in `write_u16`.
        u32::from_le(unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u32>()) })
    }

    /// Writes descriptor `i` of a table at `table` (16 bytes: addr, len, flags, next).
    fn desc(&self, table: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.write(table + 16 * usize::from(i), &d);
    }
}

fn gpa(off: usize) -> u64 {
    GPA + off as u64
}

fn header(kind: u32, sector: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    h
}

/// The buffer area of request slot `slot`.
fn area(slot: u16) -> usize {
    BUFFERS + 0x4000 * usize::from(slot)
}

// ---- The test frontend --------------------------------------------------------------------------

/// What happened to a posted request.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// A used element came back for the head; `status` is the request's status byte.
    Completed { head: u16, len: u32, status: u8 },
    /// The queue was failed (the controller's `failed_queues` counter went up).
    QueueFailed,
    /// The daemon closed the vhost-user connection.
    Disconnected,
}

/// How a frontend sets up its memory and notification fds.
#[derive(Default)]
struct Setup {
    /// The fd sent for the memory region (default: the memfd itself).
    region_fd: Option<RawFd>,
    /// Region size claimed in the memory table (default: the mapping's size).
    region_size: Option<u64>,
    /// The call fd (default: a fresh eventfd).
    call: Option<EventFd>,
    /// Negotiate in-flight tracking, and let this write into the in-flight area (and guest
    /// memory) before handing the area back with SET_INFLIGHT_FD.
    inflight: Option<fn(&mut [u8], &GuestMem)>,
}

/// Connects and negotiates features the way QEMU does: VERSION_1 and PROTOCOL_FEATURES, then
/// the protocol features MQ, CONFIG and `extra` (as far as the daemon offers them).
fn negotiate(sock: &Path, extra: VhostUserProtocolFeatures) -> Result<Frontend, String> {
    let stream = UnixStream::connect(sock).map_err(|e| format!("connect: {e}"))?;
    // A daemon that never answers fails the case instead of hanging the suite.
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut frontend = Frontend::from_stream(stream, 1);
    frontend.set_owner().map_err(|e| format!("SET_OWNER: {e}"))?;
    let features = frontend.get_features().map_err(|e| format!("GET_FEATURES: {e}"))?;
    assert_ne!(features & PROTOCOL_FEATURES, 0, "the daemon offers PROTOCOL_FEATURES");
    frontend
        .set_features(VIRTIO_F_VERSION_1 | PROTOCOL_FEATURES)
        .map_err(|e| format!("SET_FEATURES: {e}"))?;
    let offered = frontend.get_protocol_features().map_err(|e| format!("GET_PROTOCOL_FEATURES: {e}"))?;
    let wanted = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG | extra;
    frontend.set_protocol_features(offered & wanted).map_err(|e| format!("SET_PROTOCOL_FEATURES: {e}"))?;
    Ok(frontend)
}

/// One vhost-user frontend with one queue of [`QUEUE_SIZE`] at [`DESC`]/[`AVAIL`]/[`USED`].
struct Guest {
    frontend: Frontend,
    mem: GuestMem,
    kick: EventFd,
    /// Kept open for the daemon's sake; this frontend polls the used ring instead.
    _call: EventFd,
    avail_idx: u16,
    used_seen: u16,
    ctrlr: String,
}

impl Guest {
    fn connect(sock: &Path, ctrlr: &str) -> Guest {
        Guest::try_connect(sock, ctrlr, Setup::default()).expect("well-behaved handshake refused")
    }

    /// The handshake QEMU does, with `setup`'s variations. Fails when the daemon refuses it.
    fn try_connect(sock: &Path, ctrlr: &str, setup: Setup) -> Result<Guest, String> {
        let mem = GuestMem::new(MEM_SIZE);
        let extra = if setup.inflight.is_some() {
            VhostUserProtocolFeatures::INFLIGHT_SHMFD
        } else {
            VhostUserProtocolFeatures::empty()
        };
        let mut frontend = negotiate(sock, extra)?;
        let step = |what: &str, r: Result<(), vhost::Error>| r.map_err(|e| format!("{what}: {e}"));
        if let Some(scribble) = setup.inflight {
            let ask = VhostUserInflight::new(0, 0, 1, QUEUE_SIZE);
            let (info, file) = frontend.get_inflight_fd(&ask).map_err(|e| format!("GET_INFLIGHT_FD: {e}"))?;
            let area = MappedFile::new(&file, info.mmap_size as usize);
            // SAFETY: `area` maps `mmap_size` bytes of the file, alive until the end of scope.
            scribble(unsafe { std::slice::from_raw_parts_mut(area.ptr, area.len) }, &mem);
            step("SET_INFLIGHT_FD", frontend.set_inflight_fd(&info, file.as_raw_fd()))?;
        }
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: GPA,
            memory_size: setup.region_size.unwrap_or(MEM_SIZE as u64),
            userspace_addr: mem.user_addr(0),
            mmap_offset: 0,
            mmap_handle: setup.region_fd.unwrap_or(mem.file.as_raw_fd()),
        };
        step("SET_MEM_TABLE", frontend.set_mem_table(&[region]).map(|_| ()))?;
        step("SET_VRING_NUM", frontend.set_vring_num(0, QUEUE_SIZE))?;
        let ring = VringConfigData {
            queue_max_size: QUEUE_SIZE,
            queue_size: QUEUE_SIZE,
            flags: 0,
            desc_table_addr: mem.user_addr(DESC),
            used_ring_addr: mem.user_addr(USED),
            avail_ring_addr: mem.user_addr(AVAIL),
            log_addr: None,
        };
        step("SET_VRING_ADDR", frontend.set_vring_addr(0, &ring))?;
        step("SET_VRING_BASE", frontend.set_vring_base(0, 0))?;
        let call = setup.call.unwrap_or_else(|| EventFd::new(libc::EFD_NONBLOCK).unwrap());
        step("SET_VRING_CALL", frontend.set_vring_call(0, &call))?;
        let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        step("SET_VRING_KICK", frontend.set_vring_kick(0, &kick))?;
        step("SET_VRING_ENABLE", frontend.set_vring_enable(0, true))?;
        // Replies are not acknowledged (no REPLY_ACK), so a refused message only shows as a
        // closed connection: ask something that needs an answer.
        frontend.get_features().map_err(|e| format!("connection closed during setup: {e}"))?;
        Ok(Guest { frontend, mem, kick, _call: call, avail_idx: 0, used_seen: 0, ctrlr: ctrlr.to_string() })
    }

    /// Puts `head` in the available ring (without kicking).
    fn post(&mut self, head: u16) {
        let slot = AVAIL + 4 + 2 * usize::from(self.avail_idx % QUEUE_SIZE);
        self.mem.write_u16(slot, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // The ring entry must be visible before the index that publishes it (§2.7.13).
        fence(Ordering::Release);
        self.mem.write_u16(AVAIL + 2, self.avail_idx);
    }

    /// Posts `head`, kicks, and waits for its [`Outcome`] (status byte at `status_off`).
    fn submit(&mut self, head: u16, daemon: &Daemon, failed_before: u64, status_off: usize) -> Outcome {
        self.post(head);
        self.kick();
        self.outcome(daemon, failed_before, status_off)
    }

    fn kick(&self) {
        fence(Ordering::SeqCst);
        self.kick.write(1).unwrap();
    }

    fn connected(&self) -> bool {
        self.frontend.get_features().is_ok()
    }

    /// The next used element, if one is there.
    fn next_used(&mut self) -> Option<(u16, u32)> {
        let idx = self.mem.read_u16(USED + 2);
        if idx == self.used_seen {
            return None;
        }
        fence(Ordering::Acquire);
        let e = USED + 4 + 8 * usize::from(self.used_seen % QUEUE_SIZE);
        let (id, len) = (self.mem.read_u32(e), self.mem.read_u32(e + 4));
        self.used_seen = self.used_seen.wrapping_add(1);
        Some((id as u16, len))
    }

    /// Waits for the next used element (status at `status_off`), a failed queue or a closed
    /// connection, whichever comes first.
    fn outcome(&mut self, daemon: &Daemon, failed_before: u64, status_off: usize) -> Outcome {
        let start = Instant::now();
        loop {
            if let Some((head, len)) = self.next_used() {
                return Outcome::Completed { head, len, status: self.mem.read(status_off, 1)[0] };
            }
            if failed_queues(daemon, &self.ctrlr) > failed_before {
                return Outcome::QueueFailed;
            }
            if !self.connected() {
                return Outcome::Disconnected;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no outcome within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A well-formed request in slot `slot`'s buffers using descriptors `first..first + 3`:
    /// header, 4 KiB of data, status. Returns the status offset.
    fn request(&self, slot: u16, first: u16, kind: u32, sector: u64) -> usize {
        let a = area(slot);
        self.mem.write(a, &header(kind, sector));
        self.mem.write(a + 0x3000, &[S_UNTOUCHED]);
        let data_flags = if kind == T_IN { F_WRITE } else { 0 };
        self.mem.desc(DESC, first, gpa(a), 16, F_NEXT, first + 1);
        self.mem.desc(DESC, first + 1, gpa(a + 0x1000), 4096, data_flags | F_NEXT, first + 2);
        self.mem.desc(DESC, first + 2, gpa(a + 0x3000), 1, F_WRITE, 0);
        a + 0x3000
    }

    /// Writes then reads back 4 KiB at `sector` with well-formed requests.
    fn write_read_verify(&mut self, daemon: &Daemon, sector: u64, seed: u64) {
        let data = pattern(seed, sector * 512, 4096);
        let failed = failed_queues(daemon, &self.ctrlr);
        let st = self.request(0, 0, T_OUT, sector);
        self.mem.write(area(0) + 0x1000, &data);
        assert_eq!(self.submit(0, daemon, failed, st), Outcome::Completed { head: 0, len: 1, status: S_OK });
        let st = self.request(1, 3, T_IN, sector);
        self.mem.write(area(1) + 0x1000, &[0u8; 4096]);
        assert_eq!(
            self.submit(3, daemon, failed, st),
            Outcome::Completed { head: 3, len: 4097, status: S_OK }
        );
        common::assert_same("read back", sector * 512, &self.mem.read(area(1) + 0x1000, 4096), &data);
    }
}

fn failed_queues(daemon: &Daemon, ctrlr: &str) -> u64 {
    let v = daemon.call("vhost_get_controllers", json!({ "name": ctrlr }));
    v[0]["stats"]["failed_queues"].as_u64().expect("failed_queues in vhost_get_controllers")
}

// ---- The victim: verified I/O on another disk, all along --------------------------------------

struct Victim {
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Victim {
    /// Writes a pattern to a random 4 KiB block, reads it back and compares, in a loop.
    fn start(sock: PathBuf, blocks: u64) -> Victim {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let (s, o, e) = (stop.clone(), ops.clone(), errors.clone());
        let thread = std::thread::spawn(move || {
            let mut c = BlkClient::open(&sock, 1);
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                let off = (n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20) % blocks * 4096;
                let data = pattern(n, off, 4096);
                let r = c.write(0, off, &data);
                let outcome = if r != 0 {
                    Err(format!("write at {off} failed: {r}"))
                } else {
                    match c.read(0, off, 4096) {
                        Ok(got) if got == data => Ok(()),
                        Ok(_) => Err(format!("read at {off} returned other data than written")),
                        Err(r) => Err(format!("read at {off} failed: {r}")),
                    }
                };
                if let Err(msg) = outcome {
                    e.lock().unwrap().push(msg);
                    return;
                }
                n += 1;
                o.store(n, Ordering::Relaxed);
            }
        });
        Victim { stop, ops, errors, thread: Some(thread) }
    }

    fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    /// Asserts the victim made progress since `before` and saw no error.
    fn assert_progress(&self, case: &str, before: u64) {
        let start = Instant::now();
        while self.ops() < before + 20 {
            let errors = self.errors.lock().unwrap();
            assert!(errors.is_empty(), "{case}: the other disk's I/O failed: {errors:?}");
            drop(errors);
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{case}: the other disk made no progress ({} ops since the case began)",
                self.ops() - before
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("victim thread panicked");
        }
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "the other disk's I/O failed: {errors:?}");
        self.ops()
    }
}

// ---- The cases -----------------------------------------------------------------------------------

struct Env {
    daemon: Daemon,
    sock: PathBuf,
    ctrlr: &'static str,
}

impl Env {
    fn guest(&self) -> Guest {
        Guest::connect(&self.sock, self.ctrlr)
    }

    fn failed(&self) -> u64 {
        failed_queues(&self.daemon, self.ctrlr)
    }
}

/// A hostile case: it sets up its own frontend, does its worst and asserts the outcome it pins.
type Case = fn(&Env);

/// d0 (header) -> d1 (data) -> d0 -> ...: the chain never ends.
fn descriptor_loop(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let a = area(0);
    g.mem.write(a, &header(T_IN, 0));
    g.mem.desc(DESC, 0, gpa(a), 16, F_NEXT, 1);
    g.mem.desc(DESC, 1, gpa(a + 0x1000), 4096, F_WRITE | F_NEXT, 0);
    assert_eq!(g.submit(0, &env.daemon, failed, a + 0x3000), Outcome::QueueFailed);
}

/// An indirect table whose two entries point at each other.
fn indirect_loop(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let a = area(0);
    g.mem.write(a, &header(T_IN, 0));
    g.mem.desc(INDIRECT, 0, gpa(a), 16, F_NEXT, 1);
    g.mem.desc(INDIRECT, 1, gpa(a + 0x1000), 4096, F_WRITE | F_NEXT, 0);
    g.mem.desc(DESC, 0, gpa(INDIRECT), 32, F_INDIRECT, 0);
    assert_eq!(g.submit(0, &env.daemon, failed, a + 0x3000), Outcome::QueueFailed);
}

/// An indirect descriptor inside an indirect table (forbidden, §2.7.5.3.1).
fn nested_indirect(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let a = area(0);
    g.mem.write(a, &header(T_IN, 0));
    g.mem.desc(INDIRECT + 0x2000, 0, gpa(a), 16, F_NEXT, 1);
    g.mem.desc(INDIRECT + 0x2000, 1, gpa(a + 0x3000), 1, F_WRITE, 0);
    g.mem.desc(INDIRECT, 0, gpa(INDIRECT + 0x2000), 32, F_INDIRECT, 0);
    g.mem.desc(DESC, 0, gpa(INDIRECT), 16, F_INDIRECT, 0);
    assert_eq!(g.submit(0, &env.daemon, failed, a + 0x3000), Outcome::QueueFailed);
}

/// Indirect tables beyond the end of guest memory, and straddling it.
fn indirect_outside_memory(env: &Env) {
    for (table, len) in [(GPA + MEM_SIZE as u64 + 0x10000, 48), (GPA + MEM_SIZE as u64 - 16, 48)] {
        let mut g = env.guest();
        let failed = env.failed();
        g.mem.desc(DESC, 0, table, len, F_INDIRECT, 0);
        g.post(0);
        g.kick();
        assert_eq!(
            g.outcome(&env.daemon, failed, area(0) + 0x3000),
            Outcome::QueueFailed,
            "table {table:#x}"
        );
    }
}

/// An indirect table of 300 descriptors on a 128-entry queue: header, 298 data buffers of 512
/// bytes, status. More data segments than the device takes in one request (seg_max), so the
/// request is refused with an error status; the queue goes on.
fn chain_longer_than_queue(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let a = area(0);
    g.mem.write(a, &header(T_IN, 0));
    g.mem.write(a + 0x3000, &[S_UNTOUCHED]);
    let n: u16 = 300;
    g.mem.desc(INDIRECT, 0, gpa(a), 16, F_NEXT, 1);
    for i in 1..n - 1 {
        g.mem.desc(
            INDIRECT,
            i,
            gpa(BUFFERS + 0x10_0000 + 512 * usize::from(i)),
            512,
            F_WRITE | F_NEXT,
            i + 1,
        );
    }
    g.mem.desc(INDIRECT, n - 1, gpa(a + 0x3000), 1, F_WRITE, 0);
    g.mem.desc(DESC, 0, gpa(INDIRECT), 16 * u32::from(n), F_INDIRECT, 0);
    assert_eq!(
        g.submit(0, &env.daemon, failed, a + 0x3000),
        Outcome::Completed { head: 0, len: 1, status: S_IOERR }
    );
    g.write_read_verify(&env.daemon, 8, 1);
}

/// Zero-length descriptors in the middle of a chain carry nothing and are skipped; a chain of
/// nothing but zero-length descriptors has no status byte and fails the queue.
fn zero_lengths(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let a = area(0);
    let data = pattern(7, 0, 4096);
    g.mem.write(a, &header(T_OUT, 16));
    g.mem.write(a + 0x1000, &data);
    g.mem.write(a + 0x3000, &[S_UNTOUCHED]);
    g.mem.desc(DESC, 0, gpa(a), 16, F_NEXT, 1);
    g.mem.desc(DESC, 1, gpa(a + 0x800), 0, F_NEXT, 2);
    g.mem.desc(DESC, 2, gpa(a + 0x1000), 4096, F_NEXT, 3);
    g.mem.desc(DESC, 3, gpa(a + 0x2000), 0, F_WRITE | F_NEXT, 4);
    g.mem.desc(DESC, 4, gpa(a + 0x3000), 1, F_WRITE, 0);
    assert_eq!(
        g.submit(0, &env.daemon, failed, a + 0x3000),
        Outcome::Completed { head: 0, len: 1, status: S_OK }
    );
    // The data went where the header said.
    let st = g.request(1, 8, T_IN, 16);
    assert_eq!(g.submit(8, &env.daemon, failed, st), Outcome::Completed { head: 8, len: 4097, status: S_OK });
    common::assert_same("zero-length chain data", 16 * 512, &g.mem.read(area(1) + 0x1000, 4096), &data);

    g.mem.desc(DESC, 16, gpa(a), 0, F_NEXT, 17);
    g.mem.desc(DESC, 17, gpa(a + 0x3000), 0, F_WRITE, 0);
    assert_eq!(g.submit(16, &env.daemon, failed, a + 0x3000), Outcome::QueueFailed);
}

/// Huge lengths. A data buffer of almost 4 GiB (the chain's total just fits the 2^32 bytes a
/// chain may carry, §2.7.5) that starts inside memory and ends far outside: refused with an
/// error status, nothing outside the guest's memory touched. Chains over 2^32 bytes in total
/// (one 4 GiB - 1 buffer plus header and status; two 2 GiB buffers) are malformed rings: the
/// queue fails.
fn huge_lengths(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let a = area(0);
    let huge_chain = |g: &Guest, first: u16, lens: &[u32]| {
        g.mem.write(a, &header(T_IN, 0));
        g.mem.write(a + 0x3000, &[S_UNTOUCHED]);
        g.mem.desc(DESC, first, gpa(a), 16, F_NEXT, first + 1);
        let mut i = first + 1;
        for &len in lens {
            g.mem.desc(DESC, i, gpa(a + 0x1000), len, F_WRITE | F_NEXT, i + 1);
            i += 1;
        }
        g.mem.desc(DESC, i, gpa(a + 0x3000), 1, F_WRITE, 0);
    };
    huge_chain(&g, 0, &[u32::MAX - 17]);
    assert_eq!(
        g.submit(0, &env.daemon, failed, a + 0x3000),
        Outcome::Completed { head: 0, len: 1, status: S_IOERR }
    );
    g.write_read_verify(&env.daemon, 24, 2);
    // One connection at a time per controller.
    drop(g);
    for lens in [&[u32::MAX][..], &[1 << 31, 1 << 31]] {
        let mut g = env.guest();
        let failed = env.failed();
        huge_chain(&g, 4, lens);
        assert_eq!(g.submit(4, &env.daemon, failed, a + 0x3000), Outcome::QueueFailed, "lengths {lens:?}");
    }
}

/// Buffers that overlap each other and the request header: the guest's own memory, served as
/// a device would (the later write wins); the daemon is unaffected.
fn overlapping_buffers(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let a = area(0);
    let data = pattern(3, 0, 4096);
    // Put known data on the disk first.
    let st = g.request(0, 0, T_OUT, 40);
    g.mem.write(a + 0x1000, &data);
    assert_eq!(g.submit(0, &env.daemon, failed, st), Outcome::Completed { head: 0, len: 1, status: S_OK });
    // A read whose two 2 KiB data descriptors both cover the header's bytes, followed by the
    // status byte.
    g.mem.write(a, &header(T_IN, 40));
    g.mem.write(a + 0x3000, &[S_UNTOUCHED]);
    g.mem.desc(DESC, 4, gpa(a), 16, F_NEXT, 5);
    g.mem.desc(DESC, 5, gpa(a), 2048, F_WRITE | F_NEXT, 6);
    g.mem.desc(DESC, 6, gpa(a), 2048, F_WRITE | F_NEXT, 7);
    g.mem.desc(DESC, 7, gpa(a + 0x3000), 1, F_WRITE, 0);
    assert_eq!(
        g.submit(4, &env.daemon, failed, a + 0x3000),
        Outcome::Completed { head: 4, len: 4097, status: S_OK }
    );
    // Both descriptors point at the same 2 KiB: what is there is one of the two halves.
    let got = g.mem.read(a, 2048);
    assert!(got == data[..2048] || got == data[2048..], "overlapping read left neither half");
    // A read whose status byte is the last byte of its own data buffer.
    g.mem.write(a + 0x2000, &header(T_IN, 40));
    g.mem.desc(DESC, 8, gpa(a + 0x2000), 16, F_NEXT, 9);
    g.mem.desc(DESC, 9, gpa(a + 0x1000), 4096, F_WRITE | F_NEXT, 10);
    g.mem.desc(DESC, 10, gpa(a + 0x1fff), 1, F_WRITE, 0);
    assert_eq!(
        g.submit(8, &env.daemon, failed, a + 0x1fff),
        Outcome::Completed { head: 8, len: 4097, status: S_OK }
    );
    g.write_read_verify(&env.daemon, 48, 3);
}

/// The status byte in a device-readable descriptor: there is nowhere to report an error, so
/// the queue fails.
fn status_read_only(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let a = area(0);
    g.mem.write(a, &header(T_IN, 0));
    g.mem.desc(DESC, 0, gpa(a), 16, F_NEXT, 1);
    g.mem.desc(DESC, 1, gpa(a + 0x1000), 4096, F_WRITE | F_NEXT, 2);
    g.mem.desc(DESC, 2, gpa(a + 0x3000), 1, 0, 0);
    assert_eq!(g.submit(0, &env.daemon, failed, a + 0x3000), Outcome::QueueFailed);
}

/// The available index 1000 entries ahead of what the device has seen (more than the ring
/// holds): the ring is corrupt, the queue fails.
fn avail_index_jump(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    g.request(0, 0, T_IN, 0);
    g.post(0);
    g.avail_idx = 1000;
    g.mem.write_u16(AVAIL + 2, 1000);
    g.kick();
    assert_eq!(g.outcome(&env.daemon, failed, area(0) + 0x3000), Outcome::QueueFailed);
}

/// A head index beyond the queue size in the available ring.
fn head_out_of_range(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    g.post(QUEUE_SIZE + 5);
    g.kick();
    assert_eq!(g.outcome(&env.daemon, failed, area(0) + 0x3000), Outcome::QueueFailed);
}

/// The same head posted twice before it completes: both are served, both come back.
fn same_head_twice(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let st = g.request(0, 0, T_OUT, 64);
    g.mem.write(area(0) + 0x1000, &pattern(9, 64 * 512, 4096));
    g.post(0);
    g.post(0);
    g.kick();
    for _ in 0..2 {
        assert_eq!(g.outcome(&env.daemon, failed, st), Outcome::Completed { head: 0, len: 1, status: S_OK });
    }
    g.write_read_verify(&env.daemon, 72, 4);
}

/// A request past the end of the disk: an error status, nothing else.
fn beyond_capacity(env: &Env) {
    let mut g = env.guest();
    let failed = env.failed();
    let st = g.request(0, 0, T_OUT, u64::MAX / 512);
    assert_eq!(g.submit(0, &env.daemon, failed, st), Outcome::Completed { head: 0, len: 1, status: S_IOERR });
    g.write_read_verify(&env.daemon, 80, 5);
}

/// Memory the daemon cannot map writably (the fd is read-only, so the used ring would be
/// read-only to the device): the memory table is refused and the connection closed.
fn used_ring_read_only(env: &Env) {
    let mem = GuestMem::new(4096);
    let ro = File::open(format!("/proc/self/fd/{}", mem.file.as_raw_fd())).unwrap();
    let r = Guest::try_connect(
        &env.sock,
        env.ctrlr,
        Setup { region_fd: Some(ro.as_raw_fd()), ..Setup::default() },
    );
    let err = r.err().expect("a read-only memory region was accepted");
    assert!(err.contains("closed") || err.contains("SET_"), "unexpected failure: {err}");
}

/// A memory region larger than the file behind it: touching the part past the end of the file
/// would kill the daemon with SIGBUS, so the table is refused.
fn region_larger_than_file(env: &Env) {
    let small = GuestMem::new(64 << 10);
    let r = Guest::try_connect(
        &env.sock,
        env.ctrlr,
        Setup {
            region_fd: Some(small.file.as_raw_fd()),
            region_size: Some(MEM_SIZE as u64),
            ..Setup::default()
        },
    );
    assert!(r.is_err(), "a region larger than its file was accepted");
}

/// A call "eventfd" that is a pipe: after 8 K notifications a write to it would block the
/// reactor (and every other disk on it). It is refused when it is handed over.
fn call_fd_not_an_eventfd(env: &Env) {
    let mut fds = [0; 2];
    // SAFETY: a valid two-int array; the result is checked.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the read end is ours alone; EventFd only wraps it so the frontend API takes it.
    let pipe_write = unsafe { EventFd::from_raw_fd(fds[1]) };
    // SAFETY: as above, for the read end; closed on drop.
    let _pipe_read = unsafe { File::from_raw_fd(fds[0]) };
    let r = Guest::try_connect(&env.sock, env.ctrlr, Setup { call: Some(pipe_write), ..Setup::default() });
    assert!(r.is_err(), "a pipe was accepted as the call fd");
}

/// A frontend that never reads its call eventfd, and primes it so that one more write would
/// overflow the counter (a blocking eventfd write then waits forever). Requests still complete
/// and the reactor never blocks.
fn call_fd_never_read(env: &Env) {
    let call = EventFd::new(0).unwrap();
    // The largest value an eventfd holds is 2^64 - 2.
    call.write(u64::MAX - 1).unwrap();
    let mut g = Guest::try_connect(&env.sock, env.ctrlr, Setup { call: Some(call), ..Setup::default() })
        .expect("handshake with a full call eventfd");
    for i in 0..50 {
        g.write_read_verify(&env.daemon, 96 + 8 * (i % 4), 100 + i);
    }
}

/// SET_MEM_TABLE while writes are in flight on a slow disk: the daemon waits for them on the
/// old mapping, then resumes on the new one (the same memory at another guest address).
fn memory_table_change_mid_io(env: &Env) {
    let mut g = Guest::connect(&env.sock, "slow");
    let failed = failed_queues(&env.daemon, "slow");
    let n = 8u16;
    let mut wanted = Vec::new();
    for i in 0..n {
        let st = g.request(i, 3 * i, T_OUT, 8 * u64::from(i));
        let data = pattern(200 + u64::from(i), 0, 4096);
        g.mem.write(area(i) + 0x1000, &data);
        wanted.push((st, data));
        g.post(3 * i);
    }
    g.kick();
    // Let the daemon take them (the disk delays each by 100 ms).
    std::thread::sleep(Duration::from_millis(20));
    let moved = GPA + (64 << 20);
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: moved,
        memory_size: MEM_SIZE as u64,
        userspace_addr: g.mem.user_addr(0),
        mmap_offset: 0,
        mmap_handle: g.mem.file.as_raw_fd(),
    };
    g.frontend.set_mem_table(&[region]).unwrap();
    assert!(g.connected(), "SET_MEM_TABLE mid-I/O closed the connection");
    let mut done = 0;
    let start = Instant::now();
    while done < n {
        if let Some((head, len)) = g.next_used() {
            assert_eq!((head % 3, len), (0, 1), "unexpected used element");
            let (st, _) = &wanted[usize::from(head / 3)];
            assert_eq!(g.mem.read(*st, 1)[0], S_OK, "write {head} failed across the memory change");
            done += 1;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "in-flight writes lost in the memory change");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(failed_queues(&env.daemon, "slow"), failed);
    // The queue now works on the new addresses: read everything back through them.
    for i in 0..n {
        let a = area(i);
        let st = a + 0x3000;
        g.mem.write(a, &header(T_IN, 8 * u64::from(i)));
        g.mem.write(st, &[S_UNTOUCHED]);
        g.mem.desc(DESC, 3 * i, moved + a as u64, 16, F_NEXT, 3 * i + 1);
        g.mem.desc(DESC, 3 * i + 1, moved + a as u64 + 0x1000, 4096, F_WRITE | F_NEXT, 3 * i + 2);
        g.mem.desc(DESC, 3 * i + 2, moved + st as u64, 1, F_WRITE, 0);
        g.mem.write(a + 0x1000, &[0u8; 4096]);
        assert_eq!(
            g.submit(3 * i, &env.daemon, failed, st),
            Outcome::Completed { head: 3 * i, len: 4097, status: S_OK }
        );
        common::assert_same(
            "after the memory change",
            0,
            &g.mem.read(a + 0x1000, 4096),
            &wanted[usize::from(i)].1,
        );
    }
    // Old guest addresses are gone now: a request using them is refused with an error.
    let st = g.request(0, 0, T_IN, 0);
    g.mem.desc(DESC, 2, moved + st as u64, 1, F_WRITE, 0);
    assert_eq!(g.submit(0, &env.daemon, failed, st), Outcome::Completed { head: 0, len: 1, status: S_IOERR });
}

/// A new memory table that no longer holds the rings, while I/O is in flight: the queue
/// cannot restart, the connection is closed, the in-flight writes still finish.
fn memory_table_drops_the_rings(env: &Env) {
    let mut g = Guest::connect(&env.sock, "slow");
    for i in 0..4u16 {
        g.request(i, 3 * i, T_OUT, 200 + 8 * u64::from(i));
        g.post(3 * i);
    }
    g.kick();
    std::thread::sleep(Duration::from_millis(20));
    let other = GuestMem::new(1 << 20);
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: GPA,
        memory_size: 1 << 20,
        userspace_addr: other.user_addr(0) + (64 << 20),
        mmap_offset: 0,
        mmap_handle: other.file.as_raw_fd(),
    };
    let _ = g.frontend.set_mem_table(&[region]);
    let start = Instant::now();
    while g.connected() {
        assert!(start.elapsed() < Duration::from_secs(10), "a ring-less memory table was accepted");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The queue was stopped, which waits for in-flight requests, before the table was looked at.
    let mut used: Vec<_> = std::iter::from_fn(|| g.next_used()).collect();
    used.sort_unstable();
    assert_eq!(used, [(0, 1), (3, 1), (6, 1), (9, 1)], "the in-flight writes were not all completed");
    for i in 0..4u16 {
        assert_eq!(g.mem.read(area(i) + 0x3000, 1)[0], S_OK, "in-flight write {i}");
    }
}

/// A frontend that negotiates in-flight tracking and hands back an area claiming every one of
/// the 128 heads in flight, with absurd counters (u64::MAX among them: the next counter would
/// overflow) and junk in the padding. The device resubmits them all (each head is a valid read
/// through an indirect table) in counter order and carries on.
fn hostile_inflight_area(env: &Env) {
    fn scribble(region: &mut [u8], mem: &GuestMem) {
        region[..16].copy_from_slice(&[0xa5; 16]);
        region[8..10].copy_from_slice(&1u16.to_ne_bytes()); // version
        region[10..12].copy_from_slice(&QUEUE_SIZE.to_ne_bytes()); // desc_num
        region[12..14].copy_from_slice(&0xffffu16.to_ne_bytes()); // last_batch_head
        region[14..16].copy_from_slice(&0u16.to_ne_bytes()); // used_idx: matches the ring
        for h in 0..QUEUE_SIZE {
            let e = 16 + 16 * usize::from(h);
            let counter = if h % 3 == 0 { u64::MAX - u64::from(h) } else { u64::from(h) << 40 };
            region[e..e + 8].copy_from_slice(&[1, 0xde, 0xad, 0xbe, 0xef, 0x99, 0xff, 0xff]);
            region[e + 8..e + 16].copy_from_slice(&counter.to_ne_bytes());
            // Head h: one indirect descriptor -> header, 512 bytes of data, status.
            let table = INDIRECT + 48 * usize::from(h);
            let a = area(h);
            mem.write(a, &header(T_IN, 8 * u64::from(h)));
            mem.write(a + 0x3000, &[S_UNTOUCHED]);
            mem.desc(table, 0, gpa(a), 16, F_NEXT, 1);
            mem.desc(table, 1, gpa(a + 0x1000), 512, F_WRITE | F_NEXT, 2);
            mem.desc(table, 2, gpa(a + 0x3000), 1, F_WRITE, 0);
            mem.desc(DESC, h, gpa(table), 48, F_INDIRECT, 0);
            mem.write_u16(AVAIL + 4 + 2 * usize::from(h), h);
        }
        // The driver had made all 128 available before the "crash".
        mem.write_u16(AVAIL + 2, QUEUE_SIZE);
    }
    let failed = env.failed();
    let mut g =
        Guest::try_connect(&env.sock, env.ctrlr, Setup { inflight: Some(scribble), ..Setup::default() })
            .expect("handshake with a hostile in-flight area");
    g.avail_idx = QUEUE_SIZE;
    let mut seen = vec![false; usize::from(QUEUE_SIZE)];
    let start = Instant::now();
    let mut n = 0;
    while n < QUEUE_SIZE {
        if let Some((head, len)) = g.next_used() {
            assert!(
                head < QUEUE_SIZE && !seen[usize::from(head)],
                "head {head} completed twice or out of range"
            );
            seen[usize::from(head)] = true;
            assert_eq!((len, g.mem.read(area(head) + 0x3000, 1)[0]), (513, S_OK), "resubmitted head {head}");
            n += 1;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{n} of 128 resubmitted requests completed");
        assert_eq!(env.failed(), failed, "the queue failed");
    }
    g.write_read_verify(&env.daemon, 2000, 6);
}

/// ADD_MEM_REG beyond the advertised slot count: the 64 slots fill, the 65th is refused and
/// the connection closed.
fn too_many_memory_regions(env: &Env) {
    let mut f = negotiate(&env.sock, VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS).unwrap();
    let slots = f.get_max_mem_slots().unwrap();
    assert_eq!(slots, 64);
    let regions: Vec<GuestMem> = (0..=slots).map(|_| GuestMem::new(4096)).collect();
    for (i, m) in regions.iter().enumerate() {
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: GPA + 0x10000 * i as u64,
            memory_size: 4096,
            userspace_addr: m.user_addr(0),
            mmap_offset: 0,
            mmap_handle: m.file.as_raw_fd(),
        };
        let sent = f.add_mem_region(&region);
        if (i as u64) < slots {
            sent.unwrap();
            assert!(f.get_features().is_ok(), "region {i} of {slots} refused");
        } else {
            let start = Instant::now();
            while f.get_features().is_ok() {
                assert!(start.elapsed() < Duration::from_secs(10), "region {} accepted", i + 1);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// The daemon's resident memory while frontends come and go: 200 full connections (memory
/// table, ring, I/O, in-flight area) must not leave their memory behind.
fn connection_churn(env: &Env) {
    let rss = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", env.daemon.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    fn keep(_: &mut [u8], _: &GuestMem) {}
    let mut before = 0;
    for i in 0..200 {
        if i == 20 {
            // Allocator pools and the log's buffers have grown by now.
            before = rss();
        }
        let mut g =
            Guest::try_connect(&env.sock, env.ctrlr, Setup { inflight: Some(keep), ..Setup::default() })
                .unwrap();
        g.write_read_verify(&env.daemon, 3000 + 8 * (i % 16), 300 + i);
    }
    let after = rss();
    let growth = after.saturating_sub(before);
    eprintln!("daemon RSS {} KiB after 20 connections, {} KiB after 200", before / 1024, after / 1024);
    assert!(growth < 4 << 20, "180 connections grew the daemon by {} KiB", growth / 1024);
}

#[test]
fn hostile_guests_never_harm_the_daemon_or_another_disk() {
    // One reactor: the hostile controller, the slow one and the victim's share it, so a stall
    // anywhere would show in the victim's progress.
    let daemon = Daemon::start("0");
    daemon.malloc("victim", 16384, 4096);
    daemon.malloc("target", 16384, 512);
    daemon.malloc("slow-base", 16384, 512);
    daemon.call(
        "bdev_delay_create",
        json!({"base_bdev_name": "slow-base", "name": "slow", "avg_read_latency": 100000,
               "p99_read_latency": 100000, "avg_write_latency": 100000, "p99_write_latency": 100000}),
    );
    let victim_sock = daemon.controller("victim", "victim", None, false);
    let sock = daemon.controller("hostile", "target", None, false);
    daemon.controller("slow", "slow", None, false);
    // A small working set: the RAM disk behind it stops growing the daemon's RSS early.
    let victim = Victim::start(victim_sock, 256);
    let mut env = Env { daemon, sock, ctrlr: "hostile" };

    let cases: &[(&str, Case)] = &[
        ("descriptor loop", descriptor_loop),
        ("indirect table loop", indirect_loop),
        ("nested indirect table", nested_indirect),
        ("indirect table outside memory", indirect_outside_memory),
        ("chain longer than the queue", chain_longer_than_queue),
        ("zero-length descriptors", zero_lengths),
        ("4 GiB lengths", huge_lengths),
        ("overlapping buffers", overlapping_buffers),
        ("status in a read-only descriptor", status_read_only),
        ("available index far ahead", avail_index_jump),
        ("head index out of range", head_out_of_range),
        ("same head twice", same_head_twice),
        ("request beyond capacity", beyond_capacity),
        ("used ring in read-only memory", used_ring_read_only),
        ("region larger than its file", region_larger_than_file),
        ("call fd is not an eventfd", call_fd_not_an_eventfd),
        ("call fd never read", call_fd_never_read),
        ("memory table change mid-I/O", memory_table_change_mid_io),
        ("memory table without the rings mid-I/O", memory_table_drops_the_rings),
        ("hostile in-flight area", hostile_inflight_area),
        ("too many memory regions", too_many_memory_regions),
        ("connection churn", connection_churn),
    ];
    for (name, case) in cases {
        eprintln!("hostile case: {name}");
        let before = victim.ops();
        case(&env);
        victim.assert_progress(name, before);
        env.daemon.assert_alive();
        // The controller serves a well-behaved frontend after whatever the case left behind.
        let mut g = env.guest();
        g.write_read_verify(&env.daemon, 1000, 42);
        drop(g);
    }
    let ops = victim.finish();
    eprintln!("the other disk completed {ops} verified write+read pairs during the suite");
    let log = env.daemon.stderr();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
}
