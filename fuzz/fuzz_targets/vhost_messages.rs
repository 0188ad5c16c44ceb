//! Fuzz the vhost-user-blk backend's protocol handling: a sequence of vhost-user messages,
//! file descriptors attached, into `fp_vhost_blk::connection::Connection` through the same
//! dispatch as `run_connection` (`serve_message_for_fuzzing`: `vhost`'s `BackendReqHandler`,
//! and SET_LOG_BASE, which flashpath serves itself), over a socketpair. Single-threaded on
//! the protocol side: each message is written whole, then `handle_request` runs once, then the
//! reply (if any) is drained, so the socket never fills and no read ever waits for bytes that
//! will not come. Queues that the sequence starts run on real reactors (one `ReactorSet` per
//! process), which is the only concurrency; they are stopped (`stop_all`) before the
//! connection and its guest memory are dropped, as on a real disconnect.
//!
//! Input encoding (little endian; missing bytes read as 0):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | setup: queues `1 + (b & 3)`; read-only if `b & 4`; null bdev if `b & 8`, else a 1 MiB RAM bdev |
//!
//! then records, at most [`MAX_MESSAGES`], until the input ends:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | request code, sent as is (`0` is not a vhost-user request: see "harness operations") |
//! | 1 | flags: `b >= 0xf0` sends `b` as is (bad versions, reserved bits); otherwise version 1, plus NEED_REPLY if `b & 8` |
//! | 1 | attached fds: count `b & 7`; kind `(b >> 3) & 3`: 0 memfds, 1 eventfds, 2 one memfd then eventfds, 3 pipe read ends |
//! | 1 | memfd size: `(b + 1) * 4 KiB` (4 KiB..1 MiB), zero-filled |
//! | 2 | body size `s & 0x1fff` (the header says this; above 4096 is invalid) |
//! | s | the body, taken from the input and zero-padded when the input ends |
//!
//! Harness operations (request code 0, nothing is sent): if the flags byte is even, the body is
//! written into the most recent memfd at offset `16 * (fd byte | memfd-size byte << 8)`, so
//! the input can lay out rings and requests in guest memory; if odd, every eventfd sent so far
//! is signalled, which kicks whichever queue uses it.
//!
//! Live migration's messages are records like any other: SET_LOG_BASE (6) with a memfd of the
//! fuzzed size as the log and its size and offset in the body (a log too small for the memory
//! table, or beyond its memfd, is refused), SET_FEATURES with VHOST_F_LOG_ALL (bit 26) and
//! SET_VRING_ADDR with VHOST_VRING_F_LOG (flags bit 0, `log` field), on stopped and running
//! queues; `gen_seeds.py`'s `seed-migration` walks through one migration's sequence.
//!
//! Checked: no panic (including on the reactors, where the queues run), no hang (libFuzzer's
//! `-timeout`); any protocol error ends the sequence, as it closes a real connection.
#![no_main]

mod common;

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};

use fp_bdev::{Bdev, NullDevice, RamDevice};
use fp_vhost_blk::{connection_for_fuzzing, serve_message_for_fuzzing, ControllerConfig};
use libfuzzer_sys::fuzz_target;
use vhost::vhost_user::BackendReqHandler;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Longer sequences add time per input but little: every state is a few messages away.
const MAX_MESSAGES: usize = 64;
const HEADER: usize = 12;
const PAGE: u64 = 4096;

/// One RAM and one null bdev for the process; a connection only reads and writes them.
fn bdevs() -> &'static (Bdev, Bdev) {
    static BDEVS: OnceLock<(Bdev, Bdev)> = OnceLock::new();
    BDEVS.get_or_init(|| {
        let ram: Bdev = Arc::new(RamDevice::new("ram", 512, 2048).expect("RAM bdev"));
        let null: Bdev = Arc::new(NullDevice::new("null", 512, 1 << 20).expect("null bdev"));
        (ram, null)
    })
}

struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    /// `n` bytes, zero-padded past the end of the input.
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let start = self.pos.min(self.data.len());
        let end = (self.pos + n).min(self.data.len());
        let mut v = self.data[start..end].to_vec();
        v.resize(n, 0);
        self.pos += n;
        v
    }
}

fn memfd(size: u64) -> File {
    // SAFETY: the name is a valid NUL-terminated string; the result is checked.
    let fd = unsafe { libc::memfd_create(c"fp-fuzz-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh memfd that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size).expect("size memfd");
    file
}

fn pipe_read_end() -> File {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are fresh and owned by nobody else; the write end is closed at
    // once, the read end is owned by the returned File.
    unsafe {
        libc::close(fds[1]);
        File::from_raw_fd(fds[0])
    }
}

/// What the frontend side keeps: its copies of every fd it sent, for the harness operations.
#[derive(Default)]
struct Frontend {
    memfds: Vec<File>,
    eventfds: Vec<EventFd>,
    others: Vec<File>,
}

impl Frontend {
    /// Creates the fds a record asks for; returns their numbers (which stay open in `self`).
    fn make_fds(&mut self, spec: u8, memfd_pages: u8) -> Vec<RawFd> {
        let count = usize::from(spec & 7);
        let kind = (spec >> 3) & 3;
        (0..count)
            .map(|i| match (kind, i) {
                (0, _) | (2, 0) => {
                    self.memfds.push(memfd((u64::from(memfd_pages) + 1) * PAGE));
                    self.memfds.last().expect("just pushed").as_raw_fd()
                }
                (1, _) | (2, _) => {
                    self.eventfds.push(EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"));
                    self.eventfds.last().expect("just pushed").as_raw_fd()
                }
                _ => {
                    self.others.push(pipe_read_end());
                    self.others.last().expect("just pushed").as_raw_fd()
                }
            })
            .collect()
    }

    fn harness_op(&self, flags: u8, offset: u64, body: &[u8]) {
        if flags & 1 == 0 {
            if let Some(mem) = self.memfds.last() {
                // Writing past the end grows the memfd, which is fine: it is only a fuzz input.
                let _ = mem.write_all_at(body, offset);
            }
        } else {
            for e in &self.eventfds {
                let _ = e.write(1);
            }
        }
    }
}

/// Reads whatever the backend replied, without waiting. Attached fds (GET_INFLIGHT_FD's) are
/// closed by the kernel, since a plain read takes no ancillary data.
fn drain(sock: &mut UnixStream) {
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input { data, pos: 0 };
    let setup = input.u8();
    let (ram, null) = bdevs();
    let config = ControllerConfig {
        name: "fuzz".into(),
        socket_path: "/nonexistent".into(),
        bdev: if setup & 8 != 0 { null.clone() } else { ram.clone() },
        reactors: common::reactors().to_vec(),
        read_only: setup & 4 != 0,
        num_queues: 1 + u16::from(setup & 3),
        handoff: fp_vhost_blk::HandOff::new(),
        stop_timeout: fp_vhost_blk::DEFAULT_STOP_TIMEOUT,
    };
    let conn = Arc::new(Mutex::new(connection_for_fuzzing(config).expect("connection")));
    let (mut frontend_sock, backend_sock) = UnixStream::pair().expect("socketpair");
    frontend_sock.set_nonblocking(true).expect("nonblocking");
    // The handler takes the socket; the connection serves its own messages on a copy.
    let backend = backend_sock.try_clone().expect("clone the backend socket");
    let mut handler = BackendReqHandler::from_stream(backend_sock, conn.clone());
    let mut frontend = Frontend::default();

    for _ in 0..MAX_MESSAGES {
        if input.done() {
            break;
        }
        let code = input.u8();
        let flags = input.u8();
        let fd_spec = input.u8();
        let memfd_pages = input.u8();
        let size = u16::from_le_bytes([input.u8(), input.u8()]) & 0x1fff;
        let body = input.bytes(usize::from(size));
        if code == 0 {
            let offset = 16 * u64::from(u16::from_le_bytes([fd_spec, memfd_pages]));
            frontend.harness_op(flags, offset, &body);
            continue;
        }
        let flags = if flags >= 0xf0 { u32::from(flags) } else { 1 | u32::from(flags & 8) };
        let mut msg = Vec::with_capacity(HEADER + body.len());
        msg.extend_from_slice(&u32::from(code).to_le_bytes());
        msg.extend_from_slice(&flags.to_le_bytes());
        msg.extend_from_slice(&u32::from(size).to_le_bytes());
        msg.extend_from_slice(&body);
        let fds = frontend.make_fds(fd_spec, memfd_pages);
        let sent = frontend_sock.send_with_fds(&[&msg[..]], &fds).expect("send message");
        assert_eq!(sent, msg.len(), "short send of a {}-byte message", msg.len());
        let result = serve_message_for_fuzzing(&backend, &mut handler, &conn);
        drain(&mut frontend_sock);
        if common::trace() {
            eprintln!("request {code} flags {flags:#x} size {size} fds {}: {result:?}", fds.len());
        }
        if result.is_err() {
            break;
        }
    }
    conn.lock().unwrap_or_else(|p| p.into_inner()).stop_all();
    drop(handler);
    drop(conn);
});
