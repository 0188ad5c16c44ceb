//! The wire against a scripted server: replies in any order and cut anywhere, writes that the
//! socket takes a few bytes at a time, and every way a server can break the protocol.

use fp_bdev::{IoOp, IoRequest, IoStatus, SubmitError};

use super::memory::MemoryTransport as Script;
use super::wire::{Wire, MAX_IN_FLIGHT};
use crate::proto::*;
use fp_bdev::Iovecs;

const ALL: u16 = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES;

fn wire(chunk: usize, flags: u16) -> Wire<Script> {
    Wire::new(Script::new(chunk), flags, MAX_PAYLOAD)
}

fn req(tag: u32, op: IoOp, offset: u64, iov: &[libc::iovec]) -> IoRequest {
    let len = iov.iter().map(|v| v.iov_len as u64).sum();
    // SAFETY: every test keeps its buffers and their iovecs until its requests complete.
    IoRequest { tag, op, offset, len, iov: unsafe { Iovecs::from_slice(iov) } }
}

fn iov_of(buf: &mut [u8]) -> libc::iovec {
    libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }
}

/// Every request header (and write payload) the client sent.
fn sent_requests(bytes: &[u8]) -> Vec<(Request, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let r = Request::parse(bytes[at..at + REQUEST_LEN].try_into().unwrap()).unwrap();
        at += REQUEST_LEN;
        let payload = bytes[at..at + r.payload_len()].to_vec();
        at += r.payload_len();
        out.push((r, payload));
    }
    out
}

fn poll_all(w: &mut Wire<Script>) -> Vec<(u32, IoStatus)> {
    let mut got = Vec::new();
    for _ in 0..10_000 {
        w.poll(&mut |t, s| got.push((t, s)));
        if w.in_flight() == 0 {
            break;
        }
    }
    got.sort_by_key(|g| g.0);
    got
}

#[test]
fn reads_land_in_their_iovecs_whatever_the_order_and_the_cuts() {
    for chunk in [1, 7, 16, 17, 1000, 1 << 20] {
        let mut w = wire(chunk, ALL);
        // Two reads split across odd iovecs, a write, a flush.
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 1024];
        let (a1, a2) = a.split_at_mut(1000);
        let iov_a = [iov_of(a1), iov_of(a2)];
        let iov_b = [iov_of(&mut b)];
        let mut wdata: Vec<u8> = (0..2048).map(|i| (i * 7) as u8).collect();
        let iov_w = [iov_of(&mut wdata)];
        w.submit(&req(1, IoOp::Read, 8192, &iov_a)).unwrap();
        w.submit(&req(2, IoOp::Read, 0, &iov_b)).unwrap();
        w.submit(&req(3, IoOp::Write, 512, &iov_w)).unwrap();
        w.submit(&IoRequest { tag: 4, op: IoOp::Flush, offset: 0, len: 0, iov: Iovecs::NONE }).unwrap();
        for _ in 0..10_000 {
            w.poll(&mut |_, _| panic!("nothing answered yet"));
        }
        let reqs = sent_requests(&w.transport().from_client);
        assert_eq!(reqs.len(), 4, "chunk {chunk}");
        assert_eq!((reqs[0].0.command, reqs[0].0.offset, reqs[0].0.length), (CMD_READ, 8192, 4096));
        assert_eq!((reqs[2].0.command, reqs[2].0.length), (CMD_WRITE, 2048));
        assert_eq!(reqs[2].1, wdata);
        assert_eq!(reqs[3].0.command, CMD_FLUSH);
        // Replies in reverse order; the reads carry data.
        let mut stream = Vec::new();
        for (r, _) in reqs.iter().rev() {
            stream.extend_from_slice(&simple_reply(0, r.cookie));
            if r.command == CMD_READ {
                stream.extend((0..r.length).map(|i| (i as u64 + r.offset) as u8 ^ 0x5a));
            }
        }
        // The reactor's polls see the stream arrive bit by bit.
        let mut got = Vec::new();
        for piece in stream.chunks(chunk.max(3)) {
            w.transport_mut().to_client.extend(piece);
            w.poll(&mut |t, s| got.push((t, s)));
        }
        got.extend(poll_all(&mut w));
        got.sort_by_key(|g| g.0);
        let want: Vec<_> = (1..=4).map(|t| (t, IoStatus::Success)).collect();
        assert_eq!(got, want, "chunk {chunk}");
        assert!(a.iter().enumerate().all(|(i, &x)| x == (i as u64 + 8192) as u8 ^ 0x5a), "chunk {chunk}");
        assert!(b.iter().enumerate().all(|(i, &x)| x == i as u8 ^ 0x5a), "chunk {chunk}");
        assert!(w.dead().is_none());
    }
}

/// A wire with a read (tag 1) into `iov` and a write (tag 2) from it sent, and what was sent.
/// The caller keeps `iov`'s buffer until the wire is done.
fn read_then_write(iov: &[libc::iovec]) -> (Wire<Script>, Vec<(Request, Vec<u8>)>) {
    let mut w = wire(1 << 20, ALL);
    w.submit(&req(1, IoOp::Read, 0, iov)).unwrap();
    w.submit(&req(2, IoOp::Write, 0, iov)).unwrap();
    w.poll(&mut |_, _| {});
    let reqs = sent_requests(&w.transport().from_client);
    (w, reqs)
}

#[test]
fn server_errors_become_errnos_and_reads_in_error_carry_no_data() {
    let mut buf = vec![0u8; 512];
    let iov = [iov_of(&mut buf)];
    let (mut w, reqs) = read_then_write(&iov);
    let s = w.transport_mut();
    s.to_client.extend(simple_reply(ENOSPC, reqs[1].0.cookie));
    s.to_client.extend(simple_reply(999, reqs[0].0.cookie));
    let got = poll_all(&mut w);
    assert_eq!(got, [(1, IoStatus::Error(libc::EIO)), (2, IoStatus::Error(libc::ENOSPC))]);
    assert!(w.dead().is_none(), "errors are answers, not violations");
}

#[test]
fn a_broken_server_fails_everything_with_eio_and_later_requests_too() {
    type Breach = fn(&[(Request, Vec<u8>)]) -> Vec<u8>;
    let breaches: [(&str, Breach); 5] = [
        ("unknown cookie", |_| simple_reply(0, 0xdead).to_vec()),
        ("stale generation", |r| simple_reply(0, r[0].0.cookie ^ (1 << 32)).to_vec()),
        ("bad magic", |_| vec![0xff; 16]),
        ("structured", |r| chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, r[0].0.cookie, 0).to_vec()),
        ("answered twice", |r| [simple_reply(0, r[1].0.cookie), simple_reply(0, r[1].0.cookie)].concat()),
    ];
    for (what, breach) in breaches {
        let mut buf = vec![0u8; 512];
        let iov = [iov_of(&mut buf)];
        let (mut w, reqs) = read_then_write(&iov);
        let bytes = breach(&reqs);
        w.transport_mut().to_client.extend(bytes);
        let got = poll_all(&mut w);
        assert!(w.dead().unwrap().contains("protocol violation"), "{what}: {:?}", w.dead());
        assert_eq!(w.in_flight(), 0, "{what}");
        // The write may have been answered before the breach; the rest fail with EIO.
        assert!(got.iter().any(|g| g.1 == IoStatus::Error(libc::EIO)), "{what}: {got:?}");
        assert_eq!(got.len(), 2, "{what}");
        w.submit(&req(3, IoOp::Read, 0, &iov)).unwrap();
        assert_eq!(poll_all(&mut w), [(3, IoStatus::Error(libc::EIO))], "{what}");
    }
}

#[test]
fn a_closed_stream_fails_requests_and_an_idle_probe_notices_it() {
    let mut w = wire(1 << 20, ALL);
    let mut buf = vec![0u8; 4096];
    let iov = [iov_of(&mut buf)];
    w.submit(&req(1, IoOp::Read, 0, &iov)).unwrap();
    w.poll(&mut |_, _| {});
    let cookie = sent_requests(&w.transport().from_client)[0].0.cookie;
    // Half the data, then the server goes away.
    let s = w.transport_mut();
    s.to_client.extend(simple_reply(0, cookie));
    s.to_client.extend([1u8; 2048]);
    s.closed = true;
    assert_eq!(poll_all(&mut w), [(1, IoStatus::Error(libc::EIO))]);
    assert_eq!(w.dead(), Some("the server closed the connection"));

    let mut w = wire(1 << 20, ALL);
    w.probe();
    assert!(w.dead().is_none(), "nothing there: the probe changes nothing");
    w.transport_mut().closed = true;
    w.probe();
    assert!(w.dead().is_some());
    let mut w = wire(1 << 20, ALL);
    w.transport_mut().to_client.extend([0u8; 3]);
    w.probe();
    assert!(w.dead().unwrap().contains("nobody asked for"), "{:?}", w.dead());
}

#[test]
fn what_the_export_cannot_take_is_refused() {
    let mut buf = vec![0u8; 1024];
    let iov = [iov_of(&mut buf)];
    let cmd = |tag, op, len| IoRequest { tag, op, offset: 0, len, iov: Iovecs::NONE };
    // A read-only export with no trim, flush or zeroes.
    let mut w = wire(1 << 20, TFLAG_HAS_FLAGS | TFLAG_READ_ONLY);
    assert_eq!(w.submit(&cmd(1, IoOp::Flush, 0)), Err(SubmitError::Unsupported));
    assert_eq!(w.submit(&cmd(1, IoOp::Discard, 512)), Err(SubmitError::Unsupported));
    assert_eq!(w.submit(&cmd(1, IoOp::WriteZeroes, 512)), Err(SubmitError::Unsupported));
    w.submit(&req(2, IoOp::Write, 0, &iov)).unwrap();
    // iovecs that do not add up to the length, and a read over the maximum.
    w.submit(&IoRequest { len: 512, ..req(3, IoOp::Read, 0, &iov) }).unwrap();
    let mut small = Wire::new(Script::new(64), ALL, 512);
    let huge = IoRequest { len: 129 * 512, ..req(4, IoOp::Read, 0, &iov) };
    small.submit(&huge).unwrap();
    small.submit(&cmd(5, IoOp::WriteZeroes, 0)).unwrap();
    // More parts than the table holds: 129 trims of 2 GiB.
    small.submit(&cmd(6, IoOp::Discard, 129 << 31)).unwrap();
    assert_eq!(poll_all(&mut w), [(2, IoStatus::Error(libc::EROFS)), (3, IoStatus::Error(libc::EINVAL))]);
    assert_eq!(
        poll_all(&mut small),
        [(4, IoStatus::Error(libc::EINVAL)), (5, IoStatus::Success), (6, IoStatus::Error(libc::EINVAL))]
    );
    assert!(w.transport().from_client.is_empty() && small.transport().from_client.is_empty());
}

#[test]
fn requests_over_the_servers_maximum_go_out_in_parts() {
    // A server taking 512 bytes at most; a read and a write of 1280 bytes over odd iovecs, a
    // trim of 5 GiB.
    let mut w = Wire::new(Script::new(100), ALL, 512);
    let mut rbuf = vec![0u8; 1280];
    let (r1, r2) = rbuf.split_at_mut(300);
    let riov = [iov_of(r1), iov_of(r2)];
    let mut wbuf: Vec<u8> = (0..1280u32).map(|i| (i * 7) as u8).collect();
    let (w1, w2) = wbuf.split_at_mut(700);
    let wiov = [iov_of(w1), iov_of(w2)];
    let trim = IoRequest { tag: 3, op: IoOp::Discard, offset: 4096, len: 5 << 30, iov: Iovecs::NONE };
    w.submit(&req(1, IoOp::Read, 8192, &riov)).unwrap();
    w.submit(&req(2, IoOp::Write, 1024, &wiov)).unwrap();
    w.submit(&trim).unwrap();
    assert_eq!(w.in_flight(), 3, "three requests, whatever their parts");
    for _ in 0..1000 {
        w.poll(&mut |_, _| panic!("nothing answered yet"));
    }
    let reqs = sent_requests(&w.transport().from_client);
    let shape: Vec<(u16, u64, u32)> = reqs.iter().map(|(r, _)| (r.command, r.offset, r.length)).collect();
    assert_eq!(
        shape,
        [
            (CMD_READ, 8192, 512),
            (CMD_READ, 8704, 512),
            (CMD_READ, 9216, 256),
            (CMD_WRITE, 1024, 512),
            (CMD_WRITE, 1536, 512),
            (CMD_WRITE, 2048, 256),
            (CMD_TRIM, 4096, 1 << 31),
            (CMD_TRIM, 4096 + (1 << 31), 1 << 31),
            (CMD_TRIM, 4096 + (2 << 31), 1 << 30),
        ]
    );
    let written: Vec<u8> = reqs[3..6].iter().flat_map(|(_, p)| p.clone()).collect();
    assert_eq!(written, (0..1280u32).map(|i| (i * 7) as u8).collect::<Vec<_>>());
    // Replies last part first; one trim part fails.
    let mut stream = Vec::new();
    for (i, (r, _)) in reqs.iter().enumerate().rev() {
        let error = if i == 7 { ENOSPC } else { 0 };
        stream.extend_from_slice(&simple_reply(error, r.cookie));
        if r.command == CMD_READ {
            stream.extend((0..r.length).map(|k| ((r.offset + u64::from(k)) % 251) as u8));
        }
    }
    let mut got = Vec::new();
    for piece in stream.chunks(37) {
        w.transport_mut().to_client.extend(piece);
        w.poll(&mut |t, s| got.push((t, s)));
    }
    got.extend(poll_all(&mut w));
    got.sort_by_key(|g| g.0);
    assert_eq!(got, [(1, IoStatus::Success), (2, IoStatus::Success), (3, IoStatus::Error(libc::ENOSPC))]);
    assert!(rbuf.iter().enumerate().all(|(i, &x)| x == ((8192 + i) % 251) as u8));
    assert_eq!(w.in_flight(), 0);

    // Not enough free slots for all parts: busy, nothing taken.
    let mut w = Wire::new(Script::new(1 << 20), ALL, 512);
    let flush = |tag| IoRequest { tag, op: IoOp::Flush, offset: 0, len: 0, iov: Iovecs::NONE };
    for t in 0..MAX_IN_FLIGHT as u32 - 2 {
        w.submit(&flush(t)).unwrap();
    }
    assert_eq!(w.submit(&req(999, IoOp::Read, 0, &riov)), Err(SubmitError::Busy));
    assert_eq!(w.in_flight(), MAX_IN_FLIGHT - 2);
}

#[test]
fn the_table_bounds_requests_in_flight_and_slots_are_reused() {
    let mut w = wire(1 << 20, ALL);
    let flush = |tag| IoRequest { tag, op: IoOp::Flush, offset: 0, len: 0, iov: Iovecs::NONE };
    for round in 0..3u32 {
        for t in 0..MAX_IN_FLIGHT as u32 {
            w.submit(&flush(t)).unwrap();
        }
        assert_eq!(w.submit(&flush(999)), Err(SubmitError::Busy));
        w.poll(&mut |_, _| {});
        let reqs = sent_requests(&std::mem::take(&mut w.transport_mut().from_client));
        assert_eq!(reqs.len(), MAX_IN_FLIGHT, "round {round}");
        for (r, _) in &reqs {
            w.transport_mut().to_client.extend(simple_reply(0, r.cookie));
        }
        assert_eq!(poll_all(&mut w).len(), MAX_IN_FLIGHT);
        assert_eq!(w.in_flight(), 0);
    }
}

/// A read and a write spread over more iovecs than one gathered write (64 pieces) or one view
/// of a read's buffers holds: the write goes out whole over several sends, the read's data
/// over several receives, and the next reply's header is not taken for data.
#[test]
fn requests_over_many_iovecs_go_out_and_come_in_whole() {
    const PIECES: usize = 150;
    for chunk in [1, 13, 1 << 20] {
        let mut w = wire(chunk, ALL);
        let mut rbuf = vec![0u8; PIECES * 7];
        let mut wdata: Vec<u8> = (0..PIECES * 7).map(|i| (i * 3) as u8).collect();
        let riov: Vec<_> = rbuf.chunks_mut(7).map(iov_of).collect();
        let wiov: Vec<_> = wdata.chunks_mut(7).map(iov_of).collect();
        w.submit(&req(1, IoOp::Read, 0, &riov)).unwrap();
        w.submit(&req(2, IoOp::Write, 4096, &wiov)).unwrap();
        for _ in 0..10_000 {
            w.poll(&mut |_, _| panic!("nothing answered yet"));
        }
        let reqs = sent_requests(&w.transport().from_client);
        assert_eq!(reqs.len(), 2, "chunk {chunk}");
        assert_eq!((reqs[1].0.command, reqs[1].0.length as usize), (CMD_WRITE, PIECES * 7));
        assert!(reqs[1].1 == wdata, "chunk {chunk}: the write's data, in order");
        let s = w.transport_mut();
        s.to_client.extend(simple_reply(0, reqs[0].0.cookie));
        s.to_client.extend((0..PIECES * 7).map(|i| i as u8 ^ 0x3c));
        s.to_client.extend(simple_reply(0, reqs[1].0.cookie));
        assert_eq!(poll_all(&mut w), [(1, IoStatus::Success), (2, IoStatus::Success)], "chunk {chunk}");
        assert!(rbuf.iter().enumerate().all(|(i, &x)| x == i as u8 ^ 0x3c), "chunk {chunk}: the read's data");
        assert!(w.dead().is_none(), "chunk {chunk}: {:?}", w.dead());
    }
}
