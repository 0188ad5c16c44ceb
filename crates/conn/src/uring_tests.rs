//! The io_uring socket engine against real TCP sockets: receives and sends, running out of
//! provided buffers, a connection that holds too many, closing with a send in the kernel.
//! Each test runs on its own thread, so it has an engine of its own.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::uring::{self, EngineConfig, EngineStats, UringSocket};
use crate::Recv;

/// A connected pair: (ours, non-blocking as the daemon's are; the peer's, blocking).
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (ours, _) = l.accept().unwrap();
    ours.set_nonblocking(true).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (ours, peer)
}

/// Receives until `want` bytes arrived (flushing between tries), within a generous bound.
fn recv_all(s: &mut UringSocket, want: usize) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [0u8; 7];
    while got.len() < want {
        assert!(Instant::now() < deadline, "received {} of {want} bytes", got.len());
        uring::flush();
        match s.recv(&mut buf) {
            Recv::Data(n) => got.extend_from_slice(&buf[..n]),
            Recv::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
            other => panic!("receive: {other:?}"),
        }
    }
    got
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn receives_and_sends_through_the_ring() {
    let (ours, mut peer) = pair();
    let mut s = UringSocket::register(ours.as_fd()).unwrap();
    assert!(matches!(s.recv(&mut [0u8; 8]), Recv::WouldBlock));
    let msg = pattern(3000);
    peer.write_all(&msg).unwrap();
    assert_eq!(recv_all(&mut s, msg.len()), msg);

    let (a, b) = (b"hello ".to_vec(), b"world".to_vec());
    assert!(s.queue_send(&[IoSlice::new(&a), IoSlice::new(&b)]));
    assert!(!s.queue_send(&[IoSlice::new(&a)]), "one send at a time");
    let before = uring::stats().unwrap().enters;
    uring::flush();
    assert_eq!(uring::stats().unwrap().enters, before + 1, "one enter submits the send");
    let deadline = Instant::now() + Duration::from_secs(10);
    let sent = loop {
        if let Some(r) = s.take_sent() {
            break r.unwrap();
        }
        assert!(Instant::now() < deadline);
        uring::flush();
    };
    assert_eq!(sent, 11);
    let mut back = [0u8; 11];
    peer.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"hello world");

    drop(peer);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        uring::flush();
        match s.recv(&mut [0u8; 8]) {
            Recv::Eof => break,
            Recv::WouldBlock => assert!(Instant::now() < deadline),
            other => panic!("after the peer closed: {other:?}"),
        }
    }
}

/// With the engine's sizes `config`, `n` bytes from the peer make the engine reach `state`
/// before anything is taken; then every byte arrives, in order, and the receive was armed again.
fn held_back_then_received(config: EngineConfig, n: usize, state: fn(&EngineStats) -> bool, what: &str) {
    assert!(uring::configure(config));
    let (ours, mut peer) = pair();
    let mut s = UringSocket::register(ours.as_fd()).unwrap();
    let msg = pattern(n);
    peer.write_all(&msg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !state(&uring::stats().unwrap()) {
        assert!(Instant::now() < deadline, "{what} never happened");
        uring::flush();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(recv_all(&mut s, msg.len()), msg, "every byte, in order, across re-arms");
    let st = uring::stats().unwrap();
    assert!(st.rearms >= 1, "{st:?}");
}

#[test]
fn a_receive_out_of_buffers_is_armed_again() {
    // Four buffers of 16 bytes: the multishot receive ends with ENOBUFS.
    let config = EngineConfig { buffers: 4, buffer_size: 16, hold_limit: 1000 };
    held_back_then_received(config, 1000, |s| s.no_buffers > 0, "running out of buffers");
}

#[test]
fn a_connection_holding_too_many_buffers_has_its_receive_cancelled() {
    let config = EngineConfig { buffers: 64, buffer_size: 16, hold_limit: 4 };
    held_back_then_received(config, 2000, |s| s.hold_cancels > 0, "the cancel");
}

#[test]
fn closing_with_a_send_in_the_kernel_waits_for_it() {
    let (ours, _peer) = pair();
    fp_sys::set_send_buffer(ours.as_fd(), 4096).unwrap();
    let mut s = UringSocket::register(ours.as_fd()).unwrap();
    // The peer reads nothing: sends go out until the socket is full, then one stays in the
    // kernel.
    let data = vec![0x5a_u8; 1 << 20];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no send stayed in the kernel");
        if let Some(r) = s.take_sent() {
            assert!(r.unwrap() > 0, "a full socket makes the send wait, not fail");
        }
        if !s.send_in_flight() {
            assert!(s.queue_send(&[IoSlice::new(&data)]));
        }
        uring::flush();
        std::thread::sleep(Duration::from_millis(20));
        uring::flush();
        if s.send_in_flight() {
            break;
        }
    }
    let start = Instant::now();
    s.close();
    assert!(start.elapsed() < Duration::from_secs(1), "the cancel ended the send at once");
    assert!(!s.send_in_flight(), "the send's completion came before close returned");
    // The slot is reused by the next socket; the closed one sees nothing of it.
    let (ours2, mut peer2) = pair();
    let mut s2 = UringSocket::register(ours2.as_fd()).unwrap();
    peer2.write_all(b"again").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s2.readable() {
        assert!(Instant::now() < deadline, "nothing arrived");
        uring::flush();
    }
    assert!(!s.readable() && !s.send_in_flight(), "a closed socket answers for its slot's next owner");
    assert!(matches!(s.recv(&mut [0u8; 8]), Recv::Failed(_)));
    assert_eq!(recv_all(&mut s2, 5), b"again");
    drop(data);
}

#[test]
fn socket_impl_names() {
    use crate::uring::SocketImpl;
    assert_eq!("uring".parse::<SocketImpl>().unwrap(), SocketImpl::Uring);
    assert_eq!("posix".parse::<SocketImpl>().unwrap(), SocketImpl::Posix);
    let e = "epoll".parse::<SocketImpl>().unwrap_err().to_string();
    assert!(e.contains("\"epoll\"") && e.contains("posix or uring"), "{e}");
    assert_eq!(SocketImpl::default(), SocketImpl::Posix);
}

#[test]
fn vectored_receives_and_a_socket_off_its_thread() {
    let (ours, mut peer) = pair();
    let mut s = UringSocket::register(ours.as_fd()).unwrap();
    peer.write_all(b"0123456789").unwrap();
    let (mut a, mut b, mut c) = ([0u8; 3], [0u8; 4], [0u8; 8]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.readable() {
        assert!(Instant::now() < deadline, "nothing arrived");
        uring::flush();
        std::thread::sleep(Duration::from_millis(1));
    }
    // Everything arrived in one receive (ten bytes in one segment over loopback).
    let r = s.recv_vectored(&mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b), IoSliceMut::new(&mut c)]);
    assert!(matches!(r, Recv::Data(10)), "{r:?}");
    assert_eq!((&a, &b, &c[..3]), (b"012", b"3456", &b"789"[..]));

    // Moved to another thread (a connection handed over before it reaches its reactor), it
    // fails rather than touching an engine that is not its own; back home, it works.
    let mut s = std::thread::spawn(move || {
        assert!(matches!(s.recv(&mut [0u8; 4]), Recv::Failed(_)));
        assert!(!s.queue_send(&[IoSlice::new(b"x")]));
        assert!(s.take_sent().is_some_and(|r| r.is_err()));
        s
    })
    .join()
    .unwrap();
    assert!(s.queue_send(&[IoSlice::new(b"y")]));
    uring::flush();
    let mut one = [0u8; 1];
    peer.read_exact(&mut one).unwrap();
    assert_eq!(&one, b"y");
}

/// A reactor asleep in epoll (its engine's ring fd among its wake fds) is woken by data that
/// arrives for a receive in flight, and the data is there after its next rounds. With
/// `COOP_TASKRUN` the kernel finishes the receive only when the thread enters it: the wake-up
/// must still come (the bound is generous; the peer writes at once, from another thread).
#[test]
fn data_wakes_a_sleeping_reactor() {
    use fp_reactor::{Reactor, ReactorConfig};
    let mut reactor = Reactor::new(0, None, ReactorConfig::default()).unwrap();
    let (ours, mut peer) = pair();
    let mut s = UringSocket::register(ours.as_fd()).unwrap();
    uring::ensure_poller(&mut reactor).unwrap();
    reactor.poll_once();
    assert!(matches!(s.recv(&mut [0u8; 8]), Recv::WouldBlock));
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        peer.write_all(b"wake").unwrap();
        peer
    });
    let bound = Duration::from_secs(30);
    let start = Instant::now();
    assert!(reactor.sleep(Some(bound)), "nothing was pending: the reactor sleeps");
    let slept = start.elapsed();
    assert!(slept < bound, "the data did not wake the reactor");
    // The peer writes only after 20 ms: a shorter sleep was woken by something else.
    assert!(slept >= Duration::from_millis(20), "woken after {slept:?}, before the data came");
    let _peer = writer.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 8];
    loop {
        reactor.poll_once();
        match s.recv(&mut buf) {
            Recv::Data(n) => {
                assert_eq!(&buf[..n], b"wake");
                break;
            }
            Recv::WouldBlock => assert!(Instant::now() < deadline, "woken, but the data never came"),
            other => panic!("receive: {other:?}"),
        }
    }
}
