//! [`TlsStream`] on a socket pair: the blocking handshake and reads of a handshake thread,
//! then non-blocking receives and sends in pieces of many sizes against a socket that fills,
//! the end of the stream, and a refused PSK.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::tests::{pair, tls_or_skip};
use super::{HandshakeError, PskHash, TlsErrorKind, TlsStream};

const KEY: [u8; 48] = [7; 48];

type Side = Result<(TlsStream, UnixStream), HandshakeError>;

/// Both blocking handshakes over a socket pair, the server's on a thread of its own (it drops
/// its socket when it fails); the client's and the server's results.
fn handshakes(hash: PskHash, client_key: &[u8]) -> (Side, Side) {
    let (c, s) = pair(hash, client_key, &KEY[..hash.digest_len()]);
    let (mut cs, mut ss) = UnixStream::pair().unwrap();
    for x in [&cs, &ss] {
        x.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    let server = std::thread::spawn(move || {
        let mut t = TlsStream::new(s);
        let r = t.blocking(&mut ss).handshake();
        r.map(|()| (t, ss))
    });
    let mut client = TlsStream::new(c);
    let rc = client.blocking(&mut cs).handshake().map(|()| (client, cs));
    (rc, server.join().unwrap())
}

/// Two connected streams past their blocking handshakes, and their sockets.
fn connected(
    hash: PskHash,
    client_key: &[u8],
) -> Result<(TlsStream, UnixStream, TlsStream, UnixStream), HandshakeError> {
    let (rc, rs) = handshakes(hash, client_key);
    let (server, ss) = rs?;
    let (client, cs) = rc?;
    Ok((client, cs, server, ss))
}

/// [`connected`] with a SHA-256 PSK, both sockets non-blocking from then on (as on a reactor).
fn connected_non_blocking() -> (TlsStream, UnixStream, TlsStream, UnixStream) {
    let (c, cs, s, ss) = connected(PskHash::Sha256, &KEY[..32]).unwrap();
    for x in [&cs, &ss] {
        x.set_nonblocking(true).unwrap();
    }
    (c, cs, s, ss)
}

#[test]
fn blocking_streams_handshake_and_carry_messages() {
    if !tls_or_skip() {
        return;
    }
    for hash in [PskHash::Sha256, PskHash::Sha384] {
        let (mut c, mut cs, mut s, mut ss) = connected(hash, &KEY[..hash.digest_len()]).unwrap();
        assert!(c.session().is_established() && s.session().is_established());
        // An ICReq-sized message one way, a larger answer the other, read in pieces.
        let icreq = [0x11u8; 128];
        c.blocking(&mut cs).write_all(&icreq).unwrap();
        let mut got = [0u8; 128];
        let mut srv = s.blocking(&mut ss);
        srv.read_exact(&mut got[..8]).unwrap();
        srv.read_exact(&mut got[8..]).unwrap();
        assert_eq!(got, icreq);
        let answer: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        srv.write_all(&answer).unwrap();
        let mut back = vec![0u8; answer.len()];
        c.blocking(&mut cs).read_exact(&mut back).unwrap();
        assert_eq!(back, answer);
    }
}

#[test]
fn a_wrong_psk_fails_both_blocking_handshakes_with_its_kind() {
    if !tls_or_skip() {
        return;
    }
    // Both sides' results: the server's alert reaches the client before the server closes,
    // so the client too learns why, not only that the connection closed.
    let (rc, rs) = handshakes(PskHash::Sha256, &[8; 32]);
    for (side, r) in [("server", rs), ("client", rc)] {
        match r {
            Err(HandshakeError::Tls(t)) => assert_eq!(t.kind, TlsErrorKind::WrongPsk, "{side}: {t}"),
            Err(HandshakeError::Io(e)) => panic!("{side}: not a TLS refusal: {e}"),
            Ok(_) => panic!("{side}: a wrong PSK was accepted"),
        }
    }
}

/// Sends `data` from `a` to `b` through non-blocking calls on one thread, writing pieces of
/// `wpieces` sizes and reading into buffers of `rpieces` sizes in turn; returns what `b` got.
fn pump(
    a: &mut TlsStream,
    asock: &UnixStream,
    b: &mut TlsStream,
    bsock: &UnixStream,
    data: &[u8],
    wpieces: &[usize],
    rpieces: &[usize],
) -> Vec<u8> {
    let mut got = Vec::with_capacity(data.len());
    let (mut sent, mut wi, mut ri) = (0usize, 0usize, 0usize);
    let mut blocked = 0u32;
    for _ in 0..1_000_000 {
        // Sends until the socket is full (or 16 times), then one receive: the socket fills.
        for _ in 0..16 {
            if sent >= data.len() {
                break;
            }
            // Three pieces gathered, as a send queue gathers PDUs.
            let mut iov = Vec::new();
            let mut at = sent;
            for _ in 0..3 {
                let len = wpieces[wi % wpieces.len()].min(data.len() - at);
                wi += 1;
                if len == 0 {
                    break;
                }
                iov.push(IoSlice::new(&data[at..at + len]));
                at += len;
            }
            match a.send_vectored(asock.as_fd(), &iov) {
                Ok(n) => {
                    assert!(n > 0);
                    sent += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    blocked += 1;
                    break;
                }
                Err(e) => panic!("send: {e}"),
            }
        }
        if sent >= data.len() && a.has_unsent() {
            a.flush(asock.as_fd()).unwrap();
        }
        let l1 = rpieces[ri % rpieces.len()];
        let l2 = rpieces[(ri + 1) % rpieces.len()];
        ri += 1;
        let (mut x, mut y) = (vec![0u8; l1], vec![0u8; l2]);
        match b.recv_vectored(bsock.as_fd(), &mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]) {
            Ok(0) => panic!("end of stream before the data"),
            Ok(n) => {
                got.extend_from_slice(&x[..n.min(l1)]);
                if n > l1 {
                    got.extend_from_slice(&y[..n - l1]);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("recv: {e}"),
        }
        if got.len() == data.len() && !a.has_unsent() {
            assert!(blocked > 0 || data.len() < 100_000, "the socket never filled: the test proves less");
            return got;
        }
    }
    panic!("stalled: sent {sent} of {}, received {}", data.len(), got.len());
}

#[test]
fn non_blocking_streams_carry_data_in_pieces_of_every_size_through_a_full_socket() {
    if !tls_or_skip() {
        return;
    }
    let (mut c, cs, mut s, ss) = connected_non_blocking();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let got = pump(
        &mut c,
        &cs,
        &mut s,
        &ss,
        &data,
        &[1, 72, 4096, 8192 + 24, 65_536, 131_072],
        &[8, 1, 4096, 24, 70_000],
    );
    assert!(got == data, "the server read other bytes than the client sent");
    let got = pump(&mut s, &ss, &mut c, &cs, &data[..1_000_000], &[24, 4096, 16_384], &[65_536, 7]);
    assert!(got == data[..1_000_000], "the client read other bytes than the server sent");
    // Nothing more: WouldBlock, then the peer's close is the end of the stream.
    let mut b = [0u8; 16];
    let e = s.recv(ss.as_fd(), &mut b).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    c.close(cs.as_fd());
    drop(cs);
    assert_eq!(s.recv(ss.as_fd(), &mut b).unwrap(), 0);
}

#[test]
fn what_a_handshake_thread_read_past_the_handshake_moves_with_the_stream() {
    if !tls_or_skip() {
        return;
    }
    let (mut c, mut cs, mut s, mut ss) = connected(PskHash::Sha384, &KEY[..48]).unwrap();
    // Two messages in one write: the handshake thread reads the first (blocking), the
    // reactor the second (non-blocking), out of ciphertext the thread already received.
    let mut two = vec![1u8; 72];
    two.extend_from_slice(&[2u8; 1000]);
    c.blocking(&mut cs).write_all(&two).unwrap();
    let mut first = [0u8; 72];
    s.blocking(&mut ss).read_exact(&mut first).unwrap();
    assert_eq!(first, [1u8; 72]);
    ss.set_nonblocking(true).unwrap();
    let mut second = [0u8; 1000];
    let mut at = 0;
    for _ in 0..1000 {
        match s.recv(ss.as_fd(), &mut second[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
        if at == second.len() {
            break;
        }
    }
    assert_eq!(second, [2u8; 1000]);
}

#[test]
fn the_small_pieces_of_a_send_share_one_record() {
    if !tls_or_skip() {
        return;
    }
    let (mut c, cs, mut s, ss) = connected_non_blocking();
    // Fifty 24-byte pieces (response capsules) in one send: one record on the wire, not fifty.
    let pieces: Vec<[u8; 24]> = (0..50u8).map(|i| [i; 24]).collect();
    let iov: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
    assert_eq!(c.send_vectored(cs.as_fd(), &iov).unwrap(), 50 * 24);
    assert!(!c.has_unsent());
    let mut wire = vec![0u8; 8192];
    let n = fp_sys::peek_nonblocking(ss.as_fd(), &mut wire).unwrap();
    // TLS 1.3 with AES-GCM: 5 bytes of header, 1 of content type and 16 of tag per record.
    assert_eq!(n, 50 * 24 + 22, "the pieces went out as {n} bytes");
    let mut got = vec![0u8; 50 * 24];
    assert_eq!(s.recv(ss.as_fd(), &mut got).unwrap(), got.len());
    assert_eq!(got, pieces.concat());
    // A piece of a whole record or more goes without gathering; what follows it is gathered.
    let big = vec![0x77u8; 40_000];
    let tail = [0x66u8; 100];
    assert_eq!(c.send_vectored(cs.as_fd(), &[IoSlice::new(&big), IoSlice::new(&tail)]).unwrap(), 40_100);
    let mut back = vec![0u8; 40_100];
    let mut at = 0;
    for _ in 0..10_000 {
        if c.has_unsent() {
            c.flush(cs.as_fd()).unwrap();
        }
        match s.recv(ss.as_fd(), &mut back[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        if at == back.len() {
            break;
        }
    }
    assert_eq!(at, back.len());
    assert!(back[..40_000].iter().all(|&b| b == 0x77) && back[40_000..].iter().all(|&b| b == 0x66));
}
