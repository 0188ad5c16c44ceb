//! The io timeout against a fake server on a Unix socket: it negotiates, then stops answering
//! (reading and dropping every request) or stops reading altogether (the client's send buffer
//! fills). Every request must end with `EIO` at the timeout, a reactor asleep on the channel's
//! completion fd must be woken for it, and a request refused as busy (all slots taken) must be
//! taken again once they ended.

use fp_bdev::Iovecs;
use std::io::{Read, Write};
use std::os::fd::RawFd;
use std::os::unix::net::UnixListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fp_bdev::{BlockDevice, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

use crate::address::Address;
use crate::client::{NbdClientDetail, NbdClientDevice, MAX_IN_FLIGHT};
use crate::proto::*;

/// How the fake server behaves once negotiated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// Reads (and drops) every request, answers none.
    Mute,
    /// Reads nothing more.
    Deaf,
}

const SIZE: u64 = 64 << 20;

/// A server that negotiates one export with NBD_OPT_GO, then behaves as `peer`. The channel
/// reports what it read in total once the client closes its end.
fn fake_server(dir: &std::path::Path, peer: Peer) -> (std::path::PathBuf, mpsc::Receiver<u64>) {
    let path = dir.join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut hello = b"NBDMAGICIHAVEOPT".to_vec();
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        let mut info = INFO_EXPORT.to_be_bytes().to_vec();
        info.extend_from_slice(&SIZE.to_be_bytes());
        info.extend_from_slice(&(TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH).to_be_bytes());
        option_reply(&mut hello, OPT_GO, REP_INFO, &info);
        option_reply(&mut hello, OPT_GO, REP_ACK, &[]);
        c.write_all(&hello).unwrap();
        // The client's flags and its NBD_OPT_GO: 4 + 16 bytes of option header, then the
        // option's data (name length, name, info request count and the one it asks for).
        let mut head = [0u8; 4 + 16];
        c.read_exact(&mut head).unwrap();
        let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
        let mut data = vec![0u8; len];
        c.read_exact(&mut data).unwrap();
        let mut total = 0u64;
        if peer == Peer::Mute {
            let mut buf = vec![0u8; 1 << 20];
            while let Ok(n @ 1..) = c.read(&mut buf) {
                total += n as u64;
            }
        } else {
            // Holds the socket open, reading nothing, until the client's end goes away.
            let mut pfd = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&c), events: 0, revents: 0 };
            // SAFETY: one pollfd on our own socket; POLLHUP comes without asking for it.
            while unsafe { libc::poll(&mut pfd, 1, 60_000) } == 0 {}
        }
        let _ = tx.send(total);
    });
    (path, rx)
}

fn device(path: &std::path::Path, timeout: Duration) -> NbdClientDevice {
    let detail =
        NbdClientDetail { address: path.display().to_string(), export_name: String::new(), read_only: false };
    NbdClientDevice::connect("fake", Address::Unix(path.to_path_buf()), detail, None)
        .unwrap()
        .with_io_timeout(timeout)
}

/// Sleeps on the completion fd as a reactor would (bounded generously), then polls.
fn sleep_and_poll(ch: &mut dyn IoChannel, got: &mut Vec<(u32, IoStatus)>, bound: Duration) {
    let end = Instant::now() + bound;
    while ch.in_flight() > 0 {
        assert!(Instant::now() < end, "{} request(s) still in flight after {bound:?}", ch.in_flight());
        if ch.arm_completion_fd() {
            let fd: RawFd = ch.completion_fd().unwrap();
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            let left = end.saturating_duration_since(Instant::now()).as_millis() as i32;
            // SAFETY: one pollfd on the channel's epoll fd.
            let n = unsafe { libc::poll(&mut pfd, 1, left.max(1)) };
            assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
        }
        ch.poll(&mut |t, s| got.push((t, s)));
    }
}

fn read_req(tag: u32, iov: &libc::iovec) -> IoRequest {
    // SAFETY: every test keeps its buffers and their iovecs until its requests complete.
    let iovs = unsafe { Iovecs::from_raw(iov, 1) };
    IoRequest { tag, op: IoOp::Read, offset: u64::from(tag) * 4096, len: iov.iov_len as u64, iov: iovs }
}

const TIMEOUT: Duration = Duration::from_millis(300);
/// Far above the timeout: only a hang reaches it.
const BOUND: Duration = Duration::from_secs(20);

#[test]
fn a_server_that_stops_answering_fails_every_request_at_the_timeout_and_busy_ones_are_taken_again() {
    let dir = tempfile::tempdir().unwrap();
    let (path, read) = fake_server(dir.path(), Peer::Mute);
    let dev = device(&path, TIMEOUT);
    let mut ch = dev.open_channel().unwrap();
    let mut bufs = vec![[0u8; 4096]; MAX_IN_FLIGHT + 1];
    let iovs: Vec<libc::iovec> =
        bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
    let start = Instant::now();
    for (tag, iov) in iovs.iter().enumerate().take(MAX_IN_FLIGHT) {
        ch.submit(&read_req(tag as u32, iov)).unwrap();
    }
    let extra = read_req(MAX_IN_FLIGHT as u32, &iovs[MAX_IN_FLIGHT]);
    assert_eq!(ch.submit(&extra), Err(SubmitError::Busy), "every slot is taken");
    let mut got = Vec::new();
    sleep_and_poll(ch.as_mut(), &mut got, BOUND);
    assert!(start.elapsed() >= TIMEOUT, "failed before the timeout: {:?}", start.elapsed());
    assert_eq!(got.len(), MAX_IN_FLIGHT);
    assert!(got.iter().all(|&(_, s)| s == IoStatus::Error(libc::EIO)), "{got:?}");
    assert_eq!(dev.stats.connections_lost.load(std::sync::atomic::Ordering::Relaxed), 1);
    // The request refused as busy is taken now, and fails at once: the connection is dead.
    ch.submit(&extra).unwrap();
    got.clear();
    sleep_and_poll(ch.as_mut(), &mut got, BOUND);
    assert_eq!(got, vec![(MAX_IN_FLIGHT as u32, IoStatus::Error(libc::EIO))]);
    // The server is told: its end reads end-of-stream, having received every request.
    let total = read.recv_timeout(BOUND).expect("the client shut the connection down");
    assert_eq!(total, (MAX_IN_FLIGHT * REQUEST_LEN) as u64);
}

#[test]
fn a_server_that_stops_reading_fails_the_writes_stuck_in_a_full_send_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let (path, hung_up) = fake_server(dir.path(), Peer::Deaf);
    let dev = device(&path, TIMEOUT);
    let mut ch = dev.open_channel().unwrap();
    // 64 MiB of writes: more than any socket buffer holds, so some never leave.
    let mut data = vec![0x5au8; 1 << 20];
    let iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let n = 64u32;
    for tag in 0..n {
        let req = IoRequest {
            tag,
            op: IoOp::Write,
            offset: u64::from(tag) << 20,
            len: 1 << 20,
            // SAFETY: the test keeps the buffers and their iovecs until the request completes.
            iov: unsafe { Iovecs::from_raw(&iov, 1) },
        };
        ch.submit(&req).unwrap();
    }
    let mut got = Vec::new();
    sleep_and_poll(ch.as_mut(), &mut got, BOUND);
    assert_eq!(got.len(), n as usize);
    assert!(got.iter().all(|&(_, s)| s == IoStatus::Error(libc::EIO)), "{got:?}");
    drop(ch);
    drop(dev);
    hung_up.recv_timeout(BOUND).expect("the server saw the connection end");
}
