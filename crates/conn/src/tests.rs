use std::io::{IoSlice, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::*;

#[test]
fn the_receive_buffer_moves_bytes_only_when_the_room_is_needed() {
    let mut b = RecvBuf::new(8);
    assert!(matches!(
        b.fill(|d| {
            d[..6].copy_from_slice(b"abcdef");
            Recv::Data(6)
        }),
        Recv::Data(6)
    ));
    b.consume(4);
    assert_eq!(b.data(), b"ef");
    b.reserve(4);
    assert_eq!(b.spare_mut().len(), 2, "four bytes fit where they are: nothing moved");
    b.reserve(5);
    assert_eq!(b.data(), b"ef");
    assert_eq!(b.spare_mut().len(), 6, "moved to the front for five");
    b.consume(2);
    b.reserve(8);
    assert_eq!(b.spare_mut().len(), 8, "empty: the whole buffer");
}

#[test]
fn the_receive_buffer_tells_a_short_fill_from_a_full_one() {
    let (mut peer, ours) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let mut b = RecvBuf::new(8);
    peer.write_all(b"abc").unwrap();
    assert!(matches!(b.fill(|d| Recv::from_socket(ours.as_fd(), d)), Recv::Data(3)));
    assert!(b.last_fill_short(), "three bytes for eight of room: the socket was empty");
    peer.write_all(b"defghijk").unwrap();
    assert!(matches!(b.fill(|d| Recv::from_socket(ours.as_fd(), d)), Recv::Data(5)));
    assert!(!b.last_fill_short(), "the room filled: more may wait");
    b.consume(8);
    b.reserve(8);
    assert!(matches!(b.fill(|d| Recv::from_socket(ours.as_fd(), d)), Recv::Data(3)));
    assert!(b.last_fill_short());
    assert!(matches!(b.fill(|d| Recv::from_socket(ours.as_fd(), d)), Recv::WouldBlock));
    assert!(!b.last_fill_short(), "nothing came: not a short fill");
}

#[test]
fn the_send_queue_counts_partial_writes_against_its_front() {
    let pieces: [&[u8]; 3] = [b"aaaa", b"bb", b"cccccc"];
    let mut q = SendQueue::with_capacity(4);
    for i in 0..3 {
        q.push(i);
    }
    let mut out = Vec::new();
    // Five bytes at a time: the first write ends inside the second entry.
    let mut popped = Vec::new();
    while !q.is_empty() {
        let sent = q.write(
            |i| [pieces[i]],
            |iov: &[IoSlice<'_>]| {
                let all: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
                let n = all.len().min(5);
                out.extend_from_slice(&all[..n]);
                Ok(n)
            },
        );
        assert!(matches!(sent, Sent::Bytes(n) if n > 0));
        while let Some(i) = q.pop_sent(|i| pieces[i].len()) {
            popped.push(i);
        }
        assert_eq!(q.mid_entry(), !q.is_empty() && out.len() != 4 && out.len() != 6);
    }
    assert_eq!(out, b"aaaabbcccccc");
    assert_eq!(popped, [0, 1, 2]);
    q.push(0);
    assert!(matches!(q.write(|i| [pieces[i]], |_| Ok(0)), Sent::Blocked));
    assert!(q.is_blocked());
    assert_eq!(q.drop_front(), Some(0));
    assert!(!q.is_blocked());
}

#[test]
fn recv_tells_data_nothing_yet_and_the_end_apart() {
    let (mut a, b) = UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4];
    assert!(matches!(Recv::from_socket(b.as_fd(), &mut buf), Recv::WouldBlock));
    a.write_all(b"hi").unwrap();
    assert!(matches!(Recv::from_socket(b.as_fd(), &mut buf), Recv::Data(2)));
    drop(a);
    assert!(matches!(Recv::from_socket(b.as_fd(), &mut buf), Recv::Eof));
}

#[test]
fn a_listener_bounds_its_handshakes_and_closes_its_socket_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let bound = Bound::unix(&path, 0o600).unwrap();
    let opts = ListenerOptions {
        label: "test listener".into(),
        thread_name: "test-listen",
        handshake_thread_name: "test-handshake",
        max_handshakes: 1,
        handshake_timeout: Duration::from_secs(30),
    };
    // Each handshake echoes one byte, or ends when its socket is shut down.
    let l = Listener::start(bound, opts, |mut s, _peer| {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).map_err(|e| e.to_string())?;
        s.write_all(&b).map_err(|e| e.to_string())
    })
    .unwrap();
    assert!(matches!(Bound::unix(&path, 0o600), Err(listener::BindError::InUse(_))));
    let mut silent = UnixStream::connect(&path).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Connections are accepted in order: the silent one holds the one handshake allowed
    // when the real one comes.
    let mut real = UnixStream::connect(&path).unwrap();
    real.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    real.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    real.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"x", "the real client's handshake ran");
    // The silent one was shut down to make room: it reads the end of the stream.
    assert_eq!(silent.read(&mut b).unwrap(), 0);
    l.close();
    assert!(!path.exists(), "the socket file is removed at close");
}
