//! The server end to end inside the crate: a RAM disk exported on one reactor, a small blocking
//! client speaking the protocol by hand. The binary's tests (crates/flashpath/tests/nbd_*.rs)
//! use the real tools; these check what they cannot see: pipelining past the slot table,
//! payloads split across reads, FUA, and a stop with requests in flight.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use fp_bdev::{Bdev, RamDevice};
use fp_reactor::{ReactorConfig, ReactorSet};

use crate::proto::*;
use crate::{parse_device, ExportSpec, NbdServer};

struct Setup {
    _dir: tempfile::TempDir,
    sock: std::path::PathBuf,
    server: NbdServer,
    reactors: Option<ReactorSet>,
}

fn export(readonly: bool) -> (Setup, crate::ExportHandle) {
    export_of(readonly, Arc::new(RamDevice::new("ram", 512, 8192).unwrap()))
}

fn export_of(readonly: bool, bdev: Bdev) -> (Setup, crate::ExportHandle) {
    export_with(readonly, bdev, |_| ())
}

/// [`export_of`] from a server `configure` set up first.
fn export_with(
    readonly: bool,
    bdev: Bdev,
    configure: impl FnOnce(&NbdServer),
) -> (Setup, crate::ExportHandle) {
    export_full(readonly, bdev, Vec::new(), configure)
}

fn export_full(
    readonly: bool,
    bdev: Bdev,
    bitmaps: Vec<crate::ExportBitmap>,
    configure: impl FnOnce(&NbdServer),
) -> (Setup, crate::ExportHandle) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let reactors = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let server = NbdServer::new();
    configure(&server);
    let spec = ExportSpec {
        name: "ram".into(),
        bdev,
        readonly,
        reactors: reactors.handles().to_vec(),
        address: parse_device(sock.to_str().unwrap()).unwrap().address,
        tls: None,
        socket_mode: 0o600,
        bitmaps,
    };
    let handle = server.start(spec).unwrap();
    (Setup { _dir: dir, sock, server, reactors: Some(reactors) }, handle)
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(r) = self.reactors.take() {
            r.shutdown();
        }
    }
}

/// A client after NBD_OPT_GO with structured replies and base:allocation.
struct Client(UnixStream);

fn option(s: &mut UnixStream, opt: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
    let mut replies = Vec::new();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut p = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut p).unwrap();
        replies.push((kind, p));
        if kind != REP_INFO && kind != REP_META_CONTEXT && kind != REP_SERVER {
            return replies;
        }
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl Client {
    fn connect(path: &std::path::Path) -> Client {
        let mut s = UnixStream::connect(path).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        assert_eq!(g, greeting());
        s.write_all(&(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes()).unwrap();
        assert_eq!(option(&mut s, OPT_STRUCTURED_REPLY, &[])[0].0, REP_ACK);
        let mut q = Vec::new();
        string(&mut q, "ram");
        q.extend_from_slice(&1u32.to_be_bytes());
        string(&mut q, BASE_ALLOCATION);
        let r = option(&mut s, OPT_SET_META_CONTEXT, &q);
        assert_eq!(r.iter().map(|r| r.0).collect::<Vec<_>>(), [REP_META_CONTEXT, REP_ACK]);
        let mut go = Vec::new();
        string(&mut go, "ram");
        go.extend_from_slice(&0u16.to_be_bytes());
        assert_eq!(option(&mut s, OPT_GO, &go).last().unwrap().0, REP_ACK);
        Client(s)
    }

    fn send(&mut self, command: u16, flags: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) {
        let r = Request { flags, command, cookie, offset, length };
        self.0.write_all(&r.encode()).unwrap();
        self.0.write_all(payload).unwrap();
    }

    /// One reply: cookie, error, and the payload after the chunk header (a read's data
    /// without its offset).
    fn reply(&mut self) -> (u64, u32, Vec<u8>) {
        let mut h = [0u8; CHUNK_HEADER_LEN];
        self.0.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[0..4].try_into().unwrap()), STRUCTURED_REPLY_MAGIC);
        assert_eq!(u16::from_be_bytes([h[4], h[5]]), REPLY_FLAG_DONE);
        let kind = u16::from_be_bytes([h[6], h[7]]);
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut p = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        self.0.read_exact(&mut p).unwrap();
        match kind {
            REPLY_TYPE_ERROR => (cookie, u32::from_be_bytes(p[..4].try_into().unwrap()), p),
            REPLY_TYPE_OFFSET_DATA => (cookie, 0, p[8..].to_vec()),
            _ => (cookie, 0, p),
        }
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn pipelined_requests_past_the_slot_table_all_get_their_replies() {
    let (s, handle) = export(false);
    let mut c = Client::connect(&s.sock);
    // 600 writes of 4 KiB sent before reading a reply: more than the 128 slots.
    let mut sender = Client(c.0.try_clone().unwrap());
    let writer = std::thread::spawn(move || {
        for i in 0..600u64 {
            let off = (i % 1000) * 4096;
            sender.send(CMD_WRITE, 0, i, off % (4 << 20), 4096, &pattern(i as u8, 4096));
        }
    });
    let mut seen = vec![false; 600];
    for _ in 0..600 {
        let (cookie, err, _) = c.reply();
        assert_eq!(err, 0);
        assert!(!std::mem::replace(&mut seen[cookie as usize], true), "cookie {cookie} answered twice");
    }
    writer.join().unwrap();
    // The last write to each place wins: read a few back.
    for i in [0u64, 599, 300] {
        c.send(CMD_READ, 0, 1000 + i, (i % 1000) * 4096 % (4 << 20), 4096, &[]);
        let (cookie, err, data) = c.reply();
        assert_eq!((cookie, err), (1000 + i, 0));
        assert_eq!(data, pattern(i as u8, 4096));
    }
    assert_eq!(handle.connections(), 1);
    drop(c);
    handle.stop();
    assert!(s.server.listeners_now().is_empty());
}

#[test]
fn a_large_write_split_across_reads_fua_flush_trim_and_zeroes() {
    let (s, handle) = export(false);
    let mut c = Client::connect(&s.sock);
    let data = pattern(7, 3 << 20);
    // The header and the first bytes in one write, the rest in slow pieces.
    let r = Request {
        flags: CMD_FLAG_FUA,
        command: CMD_WRITE,
        cookie: 1,
        offset: 512,
        length: data.len() as u32,
    };
    let mut first = r.encode().to_vec();
    first.extend_from_slice(&data[..1000]);
    c.0.write_all(&first).unwrap();
    for piece in data[1000..].chunks(700_000) {
        c.0.write_all(piece).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(c.reply(), (1, 0, vec![]));
    c.send(CMD_READ, 0, 2, 512, data.len() as u32, &[]);
    let (_, err, back) = c.reply();
    assert_eq!(err, 0);
    assert!(back == data, "read back differs");
    c.send(CMD_FLUSH, 0, 3, 0, 0, &[]);
    assert_eq!(c.reply(), (3, 0, vec![]));
    c.send(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 4, 4096, 8192, &[]);
    assert_eq!(c.reply().1, 0);
    c.send(CMD_READ, 0, 5, 4096, 8192, &[]);
    assert_eq!(c.reply().2, vec![0u8; 8192]);
    c.send(CMD_TRIM, CMD_FLAG_FUA, 6, 0, 4096, &[]);
    assert_eq!(c.reply().1, 0);
    // A RAM disk is all data: one extent of the whole range.
    c.send(CMD_BLOCK_STATUS, 0, 7, 0, 1 << 20, &[]);
    let (_, err, p) = c.reply();
    assert_eq!(err, 0);
    assert_eq!(p[..4], BASE_ALLOCATION_ID.to_be_bytes());
    assert_eq!(u32::from_be_bytes(p[4..8].try_into().unwrap()), 1 << 20);
    // Past the end, unaligned, unknown flags, unknown commands: EINVAL, and the connection goes on.
    c.send(CMD_READ, 0, 8, 8192 * 512 - 512, 1024, &[]);
    c.send(CMD_READ, 0, 9, 100, 512, &[]);
    c.send(CMD_READ, CMD_FLAG_FUA, 10, 0, 512, &[]);
    c.send(42, 0, 11, 0, 0, &[]);
    for cookie in 8..12 {
        assert_eq!(c.reply().1, EINVAL, "cookie {cookie}");
    }
    c.send(CMD_READ, 0, 12, 0, 512, &[]);
    assert_eq!(c.reply().1, 0);
    // A write past the end is out of space (QEMU's answer), its payload consumed.
    c.send(CMD_WRITE, 0, 13, 8192 * 512, 512, &[0u8; 512]);
    c.send(CMD_WRITE_ZEROES, 0, 14, 8192 * 512 - 512, 1024, &[]);
    assert_eq!(c.reply(), (13, ENOSPC, c_err(ENOSPC, "write past the end of the export")));
    assert_eq!(c.reply().1, ENOSPC);
    c.send(CMD_READ, 0, 15, 0, 512, &[]);
    assert_eq!(c.reply().1, 0);
    drop(c);
    handle.stop();
}

#[test]
fn a_read_only_export_refuses_writes_with_eperm() {
    let (s, handle) = export(true);
    let mut c = Client::connect(&s.sock);
    c.send(CMD_WRITE, 0, 1, 0, 512, &[1u8; 512]);
    c.send(CMD_TRIM, 0, 2, 0, 512, &[]);
    c.send(CMD_WRITE_ZEROES, 0, 3, 0, 512, &[]);
    for cookie in 1..4 {
        assert_eq!(c.reply().1, EPERM, "cookie {cookie}");
    }
    c.send(CMD_READ, 0, 4, 0, 512, &[]);
    assert_eq!(c.reply(), (4, 0, vec![0u8; 512]));
    drop(c);
    handle.stop();
}

#[test]
fn stopping_answers_what_was_asked_then_closes_and_removes_the_socket() {
    let (s, handle) = export(false);
    let mut c = Client::connect(&s.sock);
    // One write, so the server takes all 32 in one read.
    let burst: Vec<u8> = (0..32)
        .flat_map(|i| {
            Request { flags: 0, command: CMD_READ, cookie: i, offset: i * 4096, length: 4096 }.encode()
        })
        .collect();
    c.0.write_all(&burst).unwrap();
    // Wait until the server has them (the first reply is out), then stop.
    let first = c.reply();
    assert_eq!(first.1, 0);
    handle.stop();
    let mut answered = 1;
    let mut buf = [0u8; CHUNK_HEADER_LEN];
    while c.0.read_exact(&mut buf).is_ok() {
        let len = u32::from_be_bytes(buf[16..20].try_into().unwrap()) as usize;
        let mut p = vec![0u8; len];
        c.0.read_exact(&mut p).unwrap();
        answered += 1;
    }
    assert_eq!(answered, 32, "every request read before the stop is answered");
    assert!(!s.sock.exists(), "the last export's stop removes the socket");
}

/// An error chunk's payload: the error, the message's length, the message.
fn c_err(err: u32, msg: &str) -> Vec<u8> {
    let mut p = err.to_be_bytes().to_vec();
    p.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    p.extend_from_slice(msg.as_bytes());
    p
}

/// An injection count no test uses up: a reactor retries a busy request millions of times a
/// second.
const NOMEM_FOREVER: u64 = 1 << 60;

#[test]
fn a_request_the_device_keeps_refusing_as_busy_is_answered_eio_at_the_close_bound() {
    use fp_bdev::{ErrorDevice, ErrorType, Injection};
    let ram: Bdev = Arc::new(RamDevice::new("ram", 512, 8192).unwrap());
    let ee = Arc::new(ErrorDevice::new("ee", ram).unwrap());
    let nomem = Injection {
        error_type: ErrorType::Nomem,
        num: NOMEM_FOREVER,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    ee.inject(&[1], nomem).unwrap();
    let (s, handle) = export_of(false, ee.clone());
    let mut c = Client::connect(&s.sock);
    c.0.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    c.send(CMD_WRITE, 0, 7, 0, 4096, &pattern(1, 4096));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while ee.injections()[1].is_some_and(|i| i.num == NOMEM_FOREVER) {
        assert!(std::time::Instant::now() < deadline, "the write never reached the device");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let start = std::time::Instant::now();
    let stopper = std::thread::spawn(move || handle.stop());
    let (cookie, err, _) = c.reply();
    assert_eq!((cookie, err), (7, EIO), "the parked write is answered EIO");
    assert!(start.elapsed() >= crate::conn::CLOSE_TIMEOUT, "answered before the bound");
    stopper.join().unwrap();
    let mut rest = Vec::new();
    assert_eq!(c.0.read_to_end(&mut rest).unwrap(), 0, "then the connection closes");
}

#[test]
fn closing_with_a_request_held_by_the_disk_says_so_and_can_be_waited_for_again() {
    use fp_bdev::{ErrorDevice, ErrorType, Injection};
    let ram: Bdev = Arc::new(RamDevice::new("ram", 512, 8192).unwrap());
    let ee = Arc::new(ErrorDevice::new("ee", ram).unwrap());
    let pending = Injection {
        error_type: ErrorType::Pending,
        num: 1,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    ee.inject(&[1], pending).unwrap();
    let (s, handle) = export_of(false, ee.clone());
    let mut c = Client::connect(&s.sock);
    c.0.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    c.send(CMD_WRITE, 0, 7, 0, 4096, &pattern(1, 4096));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while ee.injections()[1].is_some() {
        assert!(std::time::Instant::now() < deadline, "the write never reached the disk");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // The disk holds the write: the close ends at its bound and says one connection is left.
    assert_eq!(handle.close(std::time::Duration::from_millis(200)), Err(1));
    ee.resume_pending();
    assert_eq!(c.reply().1, 0, "the held write completes and is answered");
    assert_eq!(handle.close(std::time::Duration::from_secs(5)), Ok(()));
    let mut rest = Vec::new();
    assert_eq!(c.0.read_to_end(&mut rest).unwrap(), 0, "the connection closed");
}

/// A crypto bdev over an error bdev refusing every write as busy: the crypto bdev takes the
/// write and retries its refused piece itself (parked on Busy inside the bdev stack).
fn crypto_over_busy() -> (Bdev, Arc<fp_bdev::ErrorDevice>) {
    use fp_bdev::{ErrorDevice, ErrorType, Injection};
    use fp_crypto::{CryptoDevice, CryptoKey};
    let ram: Bdev = Arc::new(RamDevice::new("ram", 512, 8192).unwrap());
    let ee = Arc::new(ErrorDevice::new("ee", ram).unwrap());
    let nomem = Injection {
        error_type: ErrorType::Nomem,
        num: NOMEM_FOREVER,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    ee.inject(&[1], nomem).unwrap();
    let key = CryptoKey::new("k", &[1; 32], &[2; 32]).unwrap();
    let c: Bdev = Arc::new(CryptoDevice::new("c", ee.clone(), Arc::new(key)).unwrap());
    (c, ee)
}

/// Sends a 4 KiB write and waits until the device under `ee` refused it at least once.
fn send_refused_write(c: &mut Client, ee: &fp_bdev::ErrorDevice) {
    c.0.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    c.send(CMD_WRITE, 0, 7, 0, 4096, &pattern(1, 4096));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while ee.injections()[1].is_some_and(|i| i.num == NOMEM_FOREVER) {
        assert!(std::time::Instant::now() < deadline, "the write never reached the device");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_stop_gives_up_a_request_parked_on_busy_below_at_its_bound_and_succeeds() {
    let (bdev, ee) = crypto_over_busy();
    let (s, handle) = export_of(false, bdev);
    let mut c = Client::connect(&s.sock);
    send_refused_write(&mut c, &ee);
    let bound = std::time::Duration::from_millis(300);
    let start = std::time::Instant::now();
    // Nothing is on the device: the write is not waited for past the bound, and the stop
    // succeeds (the bdev may be released).
    assert_eq!(handle.close(bound), Ok(()));
    assert!(start.elapsed() >= bound, "given up before the bound: {:?}", start.elapsed());
    let (cookie, err, _) = c.reply();
    assert_eq!((cookie, err), (7, EIO), "the parked write is answered EIO");
    let mut rest = Vec::new();
    assert_eq!(c.0.read_to_end(&mut rest).unwrap(), 0, "then the connection closes");
    assert!(ee.injections()[1].is_some_and(|i| i.num < NOMEM_FOREVER), "it never reached the device");
}

#[test]
fn a_stop_as_long_as_the_connection_close_bound_succeeds_with_a_request_parked_on_busy() {
    // The stop's bound and the connection's are one deadline: the stop never sees the
    // request still waiting because the connection had not given it up yet.
    use fp_bdev::{ErrorDevice, ErrorType, Injection};
    let ram: Bdev = Arc::new(RamDevice::new("ram", 512, 8192).unwrap());
    let ee = Arc::new(ErrorDevice::new("ee", ram).unwrap());
    let nomem = Injection {
        error_type: ErrorType::Nomem,
        num: NOMEM_FOREVER,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    ee.inject(&[1], nomem).unwrap();
    let (s, handle) = export_of(false, ee.clone());
    let mut c = Client::connect(&s.sock);
    send_refused_write(&mut c, &ee);
    assert_eq!(handle.close(crate::conn::CLOSE_TIMEOUT), Ok(()));
    assert_eq!(c.reply().1, EIO);
}

#[test]
fn a_closing_connection_retries_for_the_close_bound_the_server_was_given() {
    use fp_bdev::{ErrorDevice, ErrorType, Injection};
    let ram: Bdev = Arc::new(RamDevice::new("ram", 512, 8192).unwrap());
    let ee = Arc::new(ErrorDevice::new("ee", ram).unwrap());
    let nomem = Injection {
        error_type: ErrorType::Nomem,
        num: NOMEM_FOREVER,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    ee.inject(&[1], nomem).unwrap();
    let bound = crate::conn::CLOSE_TIMEOUT * 2;
    let (s, handle) = export_with(false, ee.clone(), |server| server.set_close_timeout(bound));
    let mut c = Client::connect(&s.sock);
    send_refused_write(&mut c, &ee);
    let start = std::time::Instant::now();
    // The client's NBD_CMD_DISC closes the connection: its own bound applies.
    c.send(CMD_DISC, 0, 8, 0, 0, &[]);
    let (cookie, err, _) = c.reply();
    assert_eq!((cookie, err), (7, EIO));
    assert!(start.elapsed() >= bound, "answered at the default bound: {:?}", start.elapsed());
    assert_eq!(handle.close(std::time::Duration::from_secs(5)), Ok(()));
}

#[path = "bitmap_tests.rs"]
mod bitmap_tests;
