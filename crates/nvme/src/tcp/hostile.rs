//! The TCP transport against a hostile target: a listener thread that answers the handshake
//! and Connect properly and then sends what each test scripts (malformed PDUs, wrong lengths,
//! data for commands not in flight, data past a command's end). Each must kill the queue with
//! an error, never panic, and never write outside the caller's buffer.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fp_bdev::Iovecs;
use fp_nvme_spec::fabrics::CONNECT_DATA_LEN;
use fp_nvme_spec::tcp::*;
use fp_nvme_spec::{Cqe, Status};

use super::tests::transport;
use super::*;
use crate::cmd;
use crate::transport::{IoQueue, Transport};
use crate::NvmeError;

const T: Duration = Duration::from_secs(5);
const NO: Digests = Digests { header: false, data: false };

/// The hostile end of one connection, past the handshake and Connect.
pub(super) struct Peer {
    pub(super) s: TcpStream,
    digests: Digests,
}

impl Peer {
    /// Reads one command capsule (no data) and returns its command ID.
    pub(super) fn command(&mut self) -> u16 {
        let hd = if self.digests.header { DIGEST_LEN } else { 0 };
        let mut b = vec![0u8; CAPSULE_CMD_HLEN + hd];
        self.s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], PDU_CAPSULE_CMD);
        u16::from_le_bytes([b[10], b[11]])
    }

    pub(super) fn send(&mut self, b: &[u8]) {
        // The host may have closed already (it found the input bad): not this side's concern.
        let _ = self.s.write_all(b);
    }

    pub(super) fn response(&mut self, cid: u16, status: Status) {
        let mut b = [0u8; HEADER_ROOM];
        let n = write_capsule_resp(&mut b, &Cqe::new(cid, status), self.digests);
        self.send(&b[..n]);
    }

    /// A C2HData header for `len` bytes at `offset` with `flags`, then `data`.
    pub(super) fn c2h(&mut self, cid: u16, offset: u32, len: u32, flags: u8, data: &[u8]) {
        let mut b = [0u8; HEADER_ROOM];
        let h = DataHeader { cccid: cid, ttag: 0, offset, length: len };
        let n = write_c2h_data(&mut b, &h, flags, self.digests, 0);
        let mut v = b[..n].to_vec();
        v.extend_from_slice(data);
        if self.digests.data {
            v.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        self.send(&v);
    }
}

/// A target on a free port that does ICReq/ICResp (with `icresp` changed by `ic`) and answers
/// the Connect, then runs `script`.
fn hostile(
    digests: Digests,
    ic: impl FnOnce(&mut [u8; IC_LEN]) + Send + 'static,
    script: impl FnOnce(&mut Peer) + Send + 'static,
) -> (u16, JoinHandle<()>) {
    scripted(digests, ic, 1, script)
}

/// [`hostile`], the Connect answered with `connect_dw0` (CNTLID and AUTHREQ).
pub(super) fn scripted(
    digests: Digests,
    ic: impl FnOnce(&mut [u8; IC_LEN]) + Send + 'static,
    connect_dw0: u32,
    script: impl FnOnce(&mut Peer) + Send + 'static,
) -> (u16, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut b = [0u8; IC_LEN];
        s.read_exact(&mut b).unwrap();
        IcResp { cpda: 0, digests, maxh2cdata: 8192 }.write(&mut b);
        ic(&mut b);
        s.write_all(&b).unwrap();
        let mut p = Peer { s, digests };
        // Connect: the capsule with its 1024 bytes in it.
        let hd = if digests.header { DIGEST_LEN } else { 0 };
        let dd = if digests.data { DIGEST_LEN } else { 0 };
        let mut c = vec![0u8; CAPSULE_CMD_HLEN + hd + CONNECT_DATA_LEN + dd];
        if p.s.read_exact(&mut c).is_err() {
            return;
        }
        let cid = u16::from_le_bytes([c[10], c[11]]);
        let mut r = [0u8; HEADER_ROOM];
        let cqe = Cqe { dw0: connect_dw0, ..Cqe::new(cid, Status::SUCCESS) };
        let n = write_capsule_resp(&mut r, &cqe, digests);
        p.send(&r[..n]);
        script(&mut p);
        // Hold the connection until the host closes it.
        let _ = p.s.read(&mut [0u8; 64]);
    });
    (port, h)
}

/// An I/O queue to the hostile target on `port`.
fn queue(port: u16, digests: bool) -> Result<TcpQueue, NvmeError> {
    transport(port, digests).connect_queue(1, 16, 1, 4096, T).map(|(q, _)| q)
}

/// Polls until the queue dies; returns the error and the completions seen before.
fn until_dead(q: &mut TcpQueue) -> (NvmeError, Vec<(u32, Status)>) {
    let mut out = Vec::new();
    let end = Instant::now() + T;
    loop {
        q.flush();
        match q.poll(&mut out) {
            Err(e) => return (e, out),
            Ok(_) => assert!(Instant::now() < end, "the queue did not die; completions {out:?}"),
        }
    }
}

/// Runs `script` on a hostile target with one command queued by `submit` on an I/O queue to
/// it; returns how the queue died, the completions before, and the tags drained after.
fn case(
    digests: Digests,
    script: impl FnOnce(&mut Peer) + Send + 'static,
    submit: impl FnOnce(&mut TcpQueue),
) -> (NvmeError, Vec<(u32, Status)>, Vec<u32>) {
    let (port, h) = hostile(digests, |_| {}, script);
    let mut q = queue(port, digests.header).unwrap();
    submit(&mut q);
    let (e, done) = until_dead(&mut q);
    let mut tags = Vec::new();
    q.drain(&mut tags);
    drop(q);
    h.join().unwrap();
    (e, done, tags)
}

fn protocol_error(e: NvmeError) -> String {
    match e {
        NvmeError::Protocol(s) => s,
        other => panic!("expected a protocol error, got {other}"),
    }
}

/// Queues one command of `buf` (a read or a write by `opcode`) with `tag`.
fn submit(q: &mut TcpQueue, write: bool, buf: &mut [u8], tag: u32) {
    let v = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let sqe = cmd::read_write(write, 1, 0, (buf.len() / 512) as u32, false);
    // SAFETY: every caller's buffer outlives the queue (`case` drops it before returning).
    q.submit(&sqe, unsafe { Iovecs::from_slice(&[v]) }, tag).unwrap();
}

/// A 4 KiB read into the first 4 KiB of an 8 KiB buffer of 0xAA; runs `script` and expects the
/// queue to die with a protocol error without the buffer's second half touched.
fn read_case(script: impl FnOnce(&mut Peer) + Send + 'static) -> String {
    let mut buf = vec![0xAAu8; 8192];
    let (e, done, tags) = case(NO, script, |q| submit(q, false, &mut buf[..4096], 77));
    assert!(done.is_empty(), "{done:?}");
    assert!(buf[4096..].iter().all(|&b| b == 0xAA), "written past the command's buffer");
    assert_eq!(tags, [77]);
    protocol_error(e)
}

on_each_sock_impl!(c2h_for_a_command_not_in_flight);
fn c2h_for_a_command_not_in_flight() {
    let e = read_case(|p| {
        let cid = p.command();
        p.c2h(cid.wrapping_add(1), 0, 4096, FLAG_LAST_PDU, &[1; 4096]);
    });
    assert!(e.contains("not in flight"), "{e}");
}

on_each_sock_impl!(c2h_beyond_the_commands_length);
fn c2h_beyond_the_commands_length() {
    let e = read_case(|p| {
        let cid = p.command();
        p.c2h(cid, 0, 8192, FLAG_LAST_PDU, &[1; 8192]);
    });
    assert!(e.contains("beyond") || e.contains("where"), "{e}");
    let e = read_case(|p| {
        let cid = p.command();
        p.c2h(cid, 0, 2048, 0, &[1; 2048]);
        p.c2h(cid, 2048, 4096, FLAG_LAST_PDU, &[1; 4096]);
    });
    assert!(e.contains("beyond"), "{e}");
}

on_each_sock_impl!(c2h_out_of_order_or_lying_about_its_length);
fn c2h_out_of_order_or_lying_about_its_length() {
    let e = read_case(|p| {
        let cid = p.command();
        p.c2h(cid, 1024, 1024, 0, &[1; 1024]);
    });
    assert!(e.contains("where 0 were received"), "{e}");
    // DATAL says 4096, the PDU carries 1024.
    let e = read_case(|p| {
        let cid = p.command();
        let mut b = [0u8; HEADER_ROOM];
        let n =
            write_c2h_data(&mut b, &DataHeader { cccid: cid, ttag: 0, offset: 0, length: 1024 }, 0, NO, 0);
        b[16..20].copy_from_slice(&4096u32.to_le_bytes());
        let mut v = b[..n].to_vec();
        v.extend_from_slice(&[3; 1024]);
        p.send(&v);
    });
    assert!(e.contains("PDU data 1024"), "{e}");
}

on_each_sock_impl!(malformed_headers);
fn malformed_headers() {
    for (what, at, value) in
        [("type", 0usize, 0x04u8), ("hlen", 2, 23), ("pdo", 3, 2), ("flags", 1, FLAG_HDGSTF)]
    {
        let e = read_case(move |p| {
            let cid = p.command();
            let mut b = [0u8; HEADER_ROOM];
            let h = DataHeader { cccid: cid, ttag: 0, offset: 0, length: 4096 };
            let n = write_c2h_data(&mut b, &h, FLAG_LAST_PDU, NO, 0);
            b[at] = value;
            let mut v = b[..n].to_vec();
            v.extend_from_slice(&[5; 4096]);
            p.send(&v);
        });
        assert!(e.contains("bad PDU header") || e.contains("unexpected PDU"), "{what}: {e}");
    }
    // A termination request from the controller.
    let e = read_case(|p| {
        p.command();
        let mut b = [0u8; DATA_HLEN + TERM_REQ_MAX_DATA];
        let err = PduError { fes: FES_INVALID_HEADER_FIELD, fei: 2, what: "x" };
        let n = write_c2h_term_req(&mut b, &err, &[0; 8]);
        p.send(&b[..n]);
    });
    assert!(e.contains("ended the connection"), "{e}");
}

on_each_sock_impl!(completions_wrong);
fn completions_wrong() {
    // A completion for a command ID never used, then a duplicate.
    let e = read_case(|p| {
        let cid = p.command();
        p.response(cid ^ 0x8, Status::SUCCESS);
    });
    assert!(e.contains("not in flight"), "{e}");
    // A read that completes successfully with half its data.
    let e = read_case(|p| {
        let cid = p.command();
        p.c2h(cid, 0, 2048, 0, &[1; 2048]);
        p.response(cid, Status::SUCCESS);
    });
    assert!(e.contains("2048 of its 4096"), "{e}");
    // SUCCESS without LAST_PDU.
    let e = read_case(|p| {
        let cid = p.command();
        p.c2h(cid, 0, 4096, FLAG_SUCCESS, &[1; 4096]);
    });
    assert!(e.contains("SUCCESS"), "{e}");
    // An R2T for a read.
    let e = read_case(|p| {
        let cid = p.command();
        let mut b = [0u8; HEADER_ROOM];
        let n = write_r2t(&mut b, &DataHeader { cccid: cid, ttag: 1, offset: 0, length: 4096 }, NO);
        p.send(&b[..n]);
    });
    assert!(e.contains("R2T"), "{e}");
}

on_each_sock_impl!(duplicate_completion);
fn duplicate_completion() {
    let script = |p: &mut Peer| {
        let cid = p.command();
        p.response(cid, Status::SUCCESS);
        p.response(cid, Status::SUCCESS);
    };
    // SAFETY: no data.
    let (e, done, _) = case(NO, script, |q| q.submit(&cmd::flush(1), Iovecs::NONE, 3).unwrap());
    assert_eq!(done, [(3, Status::SUCCESS)]);
    assert!(protocol_error(e).contains("not in flight"));
}

on_each_sock_impl!(r2t_out_of_range_and_twice);
fn r2t_out_of_range_and_twice() {
    for (offset, length) in [(0u32, 65536u32), (4096, 4096), (0, 0)] {
        let script = move |p: &mut Peer| {
            let cid = p.command();
            let mut b = [0u8; HEADER_ROOM];
            let n = write_r2t(&mut b, &DataHeader { cccid: cid, ttag: 1, offset, length }, NO);
            p.send(&b[..n]);
        };
        let mut w = vec![1u8; 16384];
        let (e, _, tags) = case(NO, script, |q| submit(q, true, &mut w, 4));
        assert!(protocol_error(e).contains("R2T"), "{offset} {length}");
        assert_eq!(tags, [4]);
    }
}

on_each_sock_impl!(bad_digests);
fn bad_digests() {
    let both = Digests { header: true, data: true };
    // A header digest that does not match.
    let script = |p: &mut Peer| {
        let cid = p.command();
        let mut b = [0u8; HEADER_ROOM];
        let n = write_capsule_resp(&mut b, &Cqe::new(cid, Status::SUCCESS), p.digests);
        b[n - 1] ^= 1;
        p.send(&b[..n]);
    };
    // SAFETY: no data.
    let (e, _, _) = case(both, script, |q| q.submit(&cmd::flush(1), Iovecs::NONE, 3).unwrap());
    assert!(protocol_error(e).contains("header digest"));
    // A data digest that does not match.
    let script = |p: &mut Peer| {
        let cid = p.command();
        let mut b = [0u8; HEADER_ROOM];
        let hd = DataHeader { cccid: cid, ttag: 0, offset: 0, length: 512 };
        let n = write_c2h_data(&mut b, &hd, FLAG_LAST_PDU | FLAG_SUCCESS, p.digests, 0);
        let mut v = b[..n].to_vec();
        v.extend_from_slice(&[9; 512]);
        v.extend_from_slice(&0u32.to_le_bytes());
        p.send(&v);
    };
    let mut r = vec![0u8; 512];
    let (e, done, _) = case(both, script, |q| submit(q, false, &mut r, 1));
    assert!(done.is_empty());
    assert!(protocol_error(e).contains("data digest"));
}

on_each_sock_impl!(closed_mid_pdu_is_gone_and_a_stall_is_left_to_the_timeout);
fn closed_mid_pdu_is_gone_and_a_stall_is_left_to_the_timeout() {
    let script = |p: &mut Peer| {
        let cid = p.command();
        let mut b = [0u8; HEADER_ROOM];
        let n =
            write_c2h_data(&mut b, &DataHeader { cccid: cid, ttag: 0, offset: 0, length: 4096 }, 0, NO, 0);
        p.send(&b[..n]);
        p.send(&[1; 100]);
        let _ = p.s.shutdown(std::net::Shutdown::Both);
    };
    let mut r = vec![0u8; 4096];
    let (e, _, tags) = case(NO, script, |q| submit(q, false, &mut r, 1));
    assert!(matches!(e, NvmeError::Gone(_)), "{e}");
    assert_eq!(&r[..100], &[1; 100][..]);
    assert_eq!(tags, [1]);

    // A target that takes the command and never answers: the queue lives, the command shows
    // as expired to the timeout path.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (port, h) = hostile(
        NO,
        |_| {},
        move |p| {
            p.command();
            let _ = rx.recv();
        },
    );
    let mut q = queue(port, false).unwrap();
    // SAFETY: no data.
    q.submit(&cmd::flush(1), Iovecs::NONE, 42).unwrap();
    q.flush();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(q.poll(&mut Vec::new()).unwrap(), 0);
    let mut exp = Vec::new();
    q.expired(fp_bdev::clock::ticks::now(), &mut exp);
    assert_eq!(exp.len(), 1);
    assert_eq!(exp[0].1, 42);
    exp.clear();
    q.expired(0, &mut exp);
    assert!(exp.is_empty());
    tx.send(()).unwrap();
    drop(q);
    h.join().unwrap();
}

#[test]
fn bad_icresp_refused() {
    for (at, value, what) in
        [(8usize, 1u8, "format version"), (10, 40, "CPDA"), (13, 0, "MAXH2CDATA"), (0, 5, "")]
    {
        let (port, h) = hostile(NO, move |b| b[at] = value, |_| {});
        let r = transport(port, false).connect_admin(8, T);
        match r {
            Err(NvmeError::Protocol(s)) => assert!(s.contains(what), "{s}"),
            other => panic!("ICResp with byte {at} = {value}: {:?}", other.map(|_| ())),
        }
        h.join().unwrap();
    }
    // Digests the host did not ask for.
    let (port, h) = hostile(Digests { header: true, data: false }, |_| {}, |_| {});
    assert!(matches!(transport(port, false).connect_admin(8, T), Err(NvmeError::Protocol(_))));
    h.join().unwrap();
}

#[test]
fn a_command_waited_for_too_long_is_orphaned() {
    // The controller answers the first command after its waiter gave up: its data must go
    // nowhere (the waiter's buffer is not touched), and the queue goes on.
    let (port, h) = hostile(
        NO,
        |_| {},
        |p| {
            let first = p.command();
            std::thread::sleep(Duration::from_millis(100));
            p.c2h(first, 0, 4096, FLAG_LAST_PDU, &[0x55; 4096]);
            p.response(first, Status::SUCCESS);
            let second = p.command();
            p.c2h(second, 0, 512, FLAG_LAST_PDU | FLAG_SUCCESS, &[0x66; 512]);
        },
    );
    let mut q = queue(port, false).unwrap();
    let mut first = vec![0u8; 4096];
    let sqe = cmd::read_write(false, 1, 0, 8, false);
    let mut other = |_: u32, _: &Cqe| panic!("no other completion");
    let r = q.run(
        &sqe,
        crate::transport::AdminData::FromDevice(&mut first),
        Duration::from_millis(20),
        &mut other,
    );
    assert!(matches!(r, Err(NvmeError::Timeout(_))), "{r:?}");
    let mut second = vec![0u8; 512];
    let sqe = cmd::read_write(false, 1, 0, 1, false);
    let cqe = q.run(&sqe, crate::transport::AdminData::FromDevice(&mut second), T, &mut other).unwrap();
    assert!(cqe.status.is_success());
    assert_eq!(second, [0x66; 512]);
    assert!(first.iter().all(|&b| b == 0), "an orphaned command's data reached its old buffer");
    assert_eq!(q.in_flight(), 0);
    drop(q);
    h.join().unwrap();
}

on_each_sock_impl!(the_host_says_why_it_ends_the_connection);
fn the_host_says_why_it_ends_the_connection() {
    // A C2HData past the read's end: the host answers with an H2CTermReq (Data Transfer Out of
    // Range, echoing the offending header) before it closes.
    let e = read_case(|p| {
        let cid = p.command();
        let mut b = [0u8; HEADER_ROOM];
        let n =
            write_c2h_data(&mut b, &DataHeader { cccid: cid, ttag: 0, offset: 0, length: 8192 }, 0, NO, 0);
        let sent = b[..CH_LEN].to_vec();
        let mut v = b[..n].to_vec();
        v.extend_from_slice(&[1; 8192]);
        p.send(&v);
        let mut t = [0u8; DATA_HLEN + CH_LEN];
        p.s.read_exact(&mut t).unwrap();
        assert_eq!(t[0], PDU_H2C_TERM_REQ);
        assert_eq!(TermReq::parse(&t).unwrap().fes, FES_DATA_OUT_OF_RANGE);
        assert_eq!(&t[DATA_HLEN..], &sent[..]);
    });
    assert!(e.contains("beyond"), "{e}");
}
