//! Fuzz the NBD client (the nbd_client bdev) against a hostile server: its handshake through
//! `fp_nbd::client::negotiate`, then its transmission phase through `fp_nbd::client::Wire`
//! with six requests in flight (reads into split buffers, a write, a flush, a trim), fed the
//! server's reply stream in pieces.
//!
//! Input encoding (missing bytes read as 0):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | setup: `b & 1` run the handshake; `b >> 1 & 7` + 1 is the most bytes one read delivers (×7); `b & 16` the server takes 1 KiB per request at most (the 4 KiB read goes in four parts) |
//! | 2 | with the handshake: the length H of the server's handshake bytes (big endian) |
//! | H | the server's handshake bytes (the client's own writes are dropped) |
//!
//! then reply records until the input ends (the end of the input closes the stream):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | control `c`: if `c & 0x80`, a well-formed reply to NBD request `c & 0x1f` (modulo those sent; its cookie), error value from the next byte (0 when `c & 0x40`), and for a read without error its data, cut short when `c & 0x20`; else `c & 0x3f` raw bytes follow |
//!
//! Checked: no panic; each request completes exactly once, and all of them once the stream
//! has ended; a read's data lands in its own buffer and nowhere else (guard bytes around each
//! buffer never change); a successful read holds exactly the data its reply carried.
#![no_main]

use std::io::{self, Cursor, Read, Write};

use fp_bdev::{IoOp, IoRequest, IoStatus, Iovecs};
use fp_nbd::client::{negotiate, MemoryTransport, Wire};
use fp_nbd::proto::*;
use libfuzzer_sys::fuzz_target;

/// The server's handshake side: reads from the input, writes dropped.
struct Handshake<'a>(Cursor<&'a [u8]>);

impl Read for Handshake<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Handshake<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

const GUARD: usize = 64;
/// (op, offset, length) of the six requests; reads are split over two iovecs.
const REQS: [(IoOp, u64, usize); 6] = [
    (IoOp::Read, 0, 512),
    (IoOp::Read, 4096, 4096),
    (IoOp::Write, 8192, 1024),
    (IoOp::Flush, 0, 0),
    (IoOp::Discard, 0, 512),
    (IoOp::Read, 65536, 96),
];

/// The input, consumed from the front.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let setup = input.take(1).first().copied().unwrap_or(0);
    if setup & 1 != 0 {
        let h = input.take(2);
        let len = u16::from_be_bytes([h.first().copied().unwrap_or(0), h.get(1).copied().unwrap_or(0)]);
        let bytes = input.take(len as usize);
        if let Ok(n) = negotiate(&mut Handshake(Cursor::new(bytes)), "export") {
            // What a server may claim, the wire must take.
            let _ = (n.read_only(), n.max_payload());
        }
    }
    let chunk = 7 * (1 + (setup as usize >> 1 & 7));
    let flags = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES;
    let server = MemoryTransport::new(chunk);
    // Setup bit 16: a server taking 1 KiB at most, so the 4 KiB read goes out in four parts.
    let max = if setup & 16 != 0 { 1024 } else { MAX_PAYLOAD };
    let mut wire = Wire::new(server, flags, max);

    // Each request's buffer with guard bytes either side.
    let mut bufs: Vec<Vec<u8>> = REQS.iter().map(|r| vec![0xa5; r.2 + 2 * GUARD]).collect();
    let iovs: Vec<[libc::iovec; 2]> = bufs
        .iter_mut()
        .zip(REQS)
        .map(|(b, (_, _, len))| {
            let p = b[GUARD..].as_mut_ptr();
            let half = len / 2;
            // SAFETY: both halves lie inside `b`, between the guards.
            let second = unsafe { p.add(half) };
            [
                libc::iovec { iov_base: p.cast(), iov_len: half },
                libc::iovec { iov_base: second.cast(), iov_len: len - half },
            ]
        })
        .collect();
    for (tag, (op, offset, len)) in REQS.iter().enumerate() {
        let data = matches!(op, IoOp::Read | IoOp::Write);
        let req = IoRequest {
            tag: tag as u32,
            op: *op,
            offset: *offset,
            len: *len as u64,
            // SAFETY: `bufs` and `iovs` outlive every request (all answered below).
            iov: if data { unsafe { Iovecs::from_slice(&iovs[tag]) } } else { Iovecs::NONE },
        };
        wire.submit(&req).expect("six requests fit");
    }
    let mut status: [Option<IoStatus>; 6] = [None; 6];
    let mut record = |tag: u32, s: IoStatus| {
        assert!(status[tag as usize].replace(s).is_none(), "request {tag} completed twice");
    };
    wire.poll(&mut record);
    // The cookies the client chose, in submission order.
    let sent = std::mem::take(&mut wire.transport_mut().from_client);
    // Each NBD request sent (a split request's parts in order), with the request it serves.
    let mut parts: Vec<(usize, Request)> = Vec::new();
    let mut at = 0;
    while at + REQUEST_LEN <= sent.len() {
        let r = Request::parse(sent[at..at + REQUEST_LEN].try_into().unwrap()).expect("the client's own header");
        let owner = parts.last().map_or(0, |&(i, last): &(usize, Request)| {
            let end = REQS[i].1 + REQS[i].2 as u64;
            let more = last.command == r.command && last.offset + u64::from(last.length) == r.offset;
            if more && r.offset < end && REQS[i].0 != IoOp::Flush {
                i
            } else {
                i + 1
            }
        });
        parts.push((owner, r));
        at += REQUEST_LEN + r.payload_len();
    }
    assert_eq!(parts.last().map(|p| p.0 + 1), Some(REQS.len()), "every request went out");

    // While the stream is only whole, well-formed records, the data of each read's first
    // reply is what a successful read must hold (a second reply kills the connection).
    let mut clean = true;
    let mut first: Vec<Option<Option<Vec<u8>>>> = vec![None; parts.len()];
    while !input.0.is_empty() {
        let c = input.take(1)[0];
        let srv = wire.transport_mut();
        if c & 0x80 != 0 {
            let i = (c & 0x1f) as usize % parts.len();
            let (owner, part) = parts[i];
            let error = if c & 0x40 != 0 { 0 } else { input.take(1).first().copied().unwrap_or(0) as u32 };
            srv.to_client.extend(simple_reply(error, part.cookie));
            let mut payload = None;
            if REQS[owner].0 == IoOp::Read && error == 0 {
                let full = part.length as usize;
                let len = if c & 0x20 != 0 { full / 3 } else { full };
                clean &= len == full;
                let p: Vec<u8> = (0..len).map(|k| (k as u8) ^ c).collect();
                srv.to_client.extend(&p);
                payload = Some(p);
            }
            first[i].get_or_insert(payload);
        } else {
            clean = false;
            srv.to_client.extend(input.take((c & 0x3f) as usize));
        }
        wire.poll(&mut record);
    }
    wire.transport_mut().closed = true;
    for _ in 0..1000 {
        wire.poll(&mut record);
        if wire.in_flight() == 0 {
            break;
        }
    }
    assert_eq!(wire.in_flight(), 0, "every request ends once the stream has");
    let mut record_none = |tag: u32, _| panic!("request {tag} completed after all ended");
    wire.poll(&mut record_none);
    drop(wire);
    for (i, b) in bufs.iter().enumerate() {
        let len = REQS[i].2;
        assert!(b[..GUARD].iter().all(|&x| x == 0xa5), "request {i}: written before its buffer");
        assert!(b[GUARD + len..].iter().all(|&x| x == 0xa5), "request {i}: written past its buffer");
        let done = status[i].expect("completed");
        if clean && REQS[i].0 == IoOp::Read && done == IoStatus::Success {
            let want: Vec<u8> = parts
                .iter()
                .zip(&first)
                .filter(|((owner, _), _)| *owner == i)
                .flat_map(|(_, f)| f.clone().flatten().expect("each part of a successful read had data"))
                .collect();
            assert!(b[GUARD..GUARD + len] == want[..], "request {i}: its data");
        }
    }
});
