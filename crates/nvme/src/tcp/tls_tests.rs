//! The TCP transport over TLS: a terminator ([`TlsTerminator`]) in front of the in-process
//! target (plain NVMe/TCP) accepts the host's connections, runs a TLS server with a PSK lookup
//! on each, and relays the plaintext to the target over a second socket; a server that stalls
//! in the handshake; and a handshake with `openssl s_server` (skipped without openssl, failed
//! under CI=true).

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fp_bdev::Iovecs;
use fp_crypto::tls::{tls_available, ConfiguredPsk, PskHash, TlsErrorKind};
use fp_nvme_spec::Status;
use fp_nvmf::testing::LoopbackTarget;
use fp_nvmf::TransportOptions;

use super::tests::{target, transport, NQN};
use super::*;
use crate::cmd;
use crate::testing::TlsTerminator;
use crate::transport::{AdminQueue, IoQueue, Transport};
use crate::NvmeError;

const T: Duration = Duration::from_secs(5);
/// The host's configured PSK (SHA-256: 32 bytes) and another the target may hold instead.
const KEY: [u8; 32] = [0x5a; 32];
const OTHER_KEY: [u8; 32] = [0xa5; 32];

fn tls_or_skip() -> bool {
    if tls_available() {
        return true;
    }
    missing("libssl.so.3", "not loadable");
    false
}

/// A tool's absence: a skip with its reason, a failure under CI=true.
fn missing(tool: &str, why: impl std::fmt::Display) {
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true and {tool} does not run: {why}");
    println!("skipped: {tool} not runnable ({why})");
}

fn configured(key: &[u8; 32]) -> ConfiguredPsk {
    ConfiguredPsk::new(Some(PskHash::Sha256), key).unwrap()
}

/// The plain test transport to `port`, with TLS from `key` (as the attach derives it).
fn tls_transport(port: u16, key: &[u8; 32]) -> TcpTransport {
    let plain = transport(port, false);
    let t = plain.target();
    let tls = TcpTls::derive("key0", &configured(key), &t.hostnqn, &t.subnqn).unwrap();
    TcpTransport::new(TcpTarget { tls: Some(tls), ..t.clone() })
}

/// A terminator in front of `backend` holding the configured PSK of `key`, if any.
fn terminator(backend: u16, key: Option<[u8; 32]>) -> TlsTerminator {
    TlsTerminator::start(backend, key.map(|k| configured(&k))).unwrap()
}

/// The in-process target behind a terminator holding [`KEY`]; `None` (skip reported) without
/// libssl.
fn through_tls() -> Option<(LoopbackTarget, TlsTerminator)> {
    if !tls_or_skip() {
        return None;
    }
    let tg = target(TransportOptions::default());
    let term = terminator(tg.port(), Some(KEY));
    Some((tg, term))
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 9) as u8)).collect()
}

/// Polls `q` until `n` completions came.
fn reap(q: &mut TcpQueue, n: usize) -> Vec<(u32, Status)> {
    let mut out = Vec::new();
    let end = Instant::now() + T;
    while out.len() < n {
        q.flush();
        q.poll(&mut out).unwrap();
        assert!(Instant::now() < end, "no completion in time: {} of {n}", out.len());
    }
    out
}

fn rw(q: &mut TcpQueue, write: bool, slba: u64, buf: &mut [u8], tag: u32) {
    let sqe = cmd::read_write(write, 1, slba, (buf.len() / 512) as u32, false);
    let v = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: `buf` outlives the command: reaped below.
    q.submit(&sqe, unsafe { Iovecs::from_slice(&[v]) }, tag).unwrap();
    let c = reap(q, 1);
    assert_eq!(c[0].0, tag);
    assert!(c[0].1.is_success(), "{:?}", c[0].1);
}

// Both socket implementations: with `uring` the default, a TLS queue stays on system calls.
on_each_sock_impl!(attach_and_io_through_tls);
fn attach_and_io_through_tls() {
    let Some((_tg, term)) = through_tls() else { return };
    let port = term.port();
    let tr = tls_transport(port, &KEY);
    let mut admin = tr.connect_admin(32, T).unwrap();
    // Enabled and identified over TLS (connect_admin read Identify Controller).
    let csts = admin.get_property(fp_nvme_spec::registers::CSTS, false).unwrap();
    assert_eq!(csts & 1, 1);
    assert_eq!((admin.io_in_capsule_data(), admin.max_transfer()), (4096, 131072));
    let mut q = tr.connect_io(&mut admin, 1, 64).unwrap();
    assert!(q.uses_tls() && !q.uses_uring(), "a TLS queue stays on system calls");
    // In capsule (4 KiB), by R2T (64 KiB), and transfers beyond 64 KiB (a TLS record is 16
    // KiB: each spans records, and the session's buffers).
    for (slba, len, seed) in [(0u64, 4096usize, 1u8), (8, 65536, 2), (200, 131072, 3), (1000, 512, 4)] {
        let mut w = pattern(seed, len);
        rw(&mut q, true, slba, &mut w, 1);
        let mut r = vec![0u8; len];
        rw(&mut q, false, slba, &mut r, 2);
        assert_eq!(r, w, "read back {len} bytes at {slba} through TLS");
    }
    // Many in flight: 32 writes of 16 KiB queued before one flush, then read back.
    let bufs: Vec<Vec<u8>> = (0..32).map(|i| pattern(40 + i as u8, 16384)).collect();
    for (i, b) in bufs.iter().enumerate() {
        let sqe = cmd::read_write(true, 1, 2000 + i as u64 * 32, 32, false);
        let v = libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() };
        // SAFETY: `bufs` outlives the commands (reaped below).
        q.submit(&sqe, unsafe { Iovecs::from_slice(&[v]) }, i as u32).unwrap();
    }
    let c = reap(&mut q, 32);
    assert!(c.iter().all(|x| x.1.is_success()), "{c:?}");
    let mut reads: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; 16384]).collect();
    for (i, b) in reads.iter_mut().enumerate() {
        let sqe = cmd::read_write(false, 1, 2000 + i as u64 * 32, 32, false);
        let v = libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() };
        // SAFETY: `reads` outlives the commands (reaped below).
        q.submit(&sqe, unsafe { Iovecs::from_slice(&[v]) }, i as u32).unwrap();
    }
    reap(&mut q, 32);
    assert!(reads == bufs, "32 reads in flight read back what was written");
    // Both queues shook hands, as this host for this subsystem (identity version 0).
    let ids = term.identities();
    let want = format!("NVMe0R01 {} {NQN}", tr.target().hostnqn);
    assert_eq!(ids, vec![want.clone(), want], "admin and I/O queue each did a handshake");
    assert_eq!(tr.target().tls.as_ref().unwrap().identity, ids[0]);
    tr.shutdown(&mut admin, T);
}

#[test]
fn a_wrong_psk_or_an_unknown_identity_is_refused_by_kind() {
    if !tls_or_skip() {
        return;
    }
    let tg = target(TransportOptions::default());
    for (key, kind) in [(Some(OTHER_KEY), TlsErrorKind::WrongPsk), (None, TlsErrorKind::UnknownIdentity)] {
        let term = terminator(tg.port(), key);
        let port = term.port();
        let tr = tls_transport(port, &KEY);
        match tr.connect_admin(32, T) {
            Err(NvmeError::Tls { kind: k, what }) => {
                assert_eq!(k, kind, "{what}");
                assert!(what.contains(&format!("127.0.0.1:{port}")), "names the target: {what}");
                assert!(what.contains(&tr.target().hostnqn), "names the identity: {what}");
            }
            other => panic!("{kind:?}: {:?}", other.map(|_| ())),
        }
        let end = Instant::now() + T;
        while term.refused() == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(term.refused(), 1, "{kind:?}: the server refused too");
        assert!(term.identities().is_empty());
    }
}

#[test]
fn a_server_stalling_in_the_handshake_times_out() {
    if !tls_or_skip() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel::<()>();
    // Takes the ClientHello and never answers, holding the connection until the test ends.
    let held = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut b = [0u8; 512];
        let _ = c.read(&mut b);
        let _ = rx.recv();
    });
    let tr = tls_transport(port, &KEY);
    let wait = Duration::from_millis(300);
    let start = Instant::now();
    match tr.connect_admin(32, wait) {
        Err(NvmeError::Timeout(what)) => assert!(what.contains("TLS handshake"), "{what}"),
        other => panic!("a stalled handshake: {:?}", other.map(|_| ())),
    }
    assert!(start.elapsed() >= wait, "waited the connect timeout: {:?}", start.elapsed());
    tx.send(()).unwrap();
    held.join().unwrap();
}

/// A handshake of the transport's with `openssl s_server` holding the same TLS PSK for the
/// identity (and refused by one holding another).
#[test]
fn handshake_with_openssl_s_server() {
    if !tls_or_skip() {
        return;
    }
    let tr = tls_transport(1, &KEY);
    let t = tr.target().tls.clone().unwrap();
    let other = TcpTls::derive("key1", &configured(&OTHER_KEY), &tr.target().hostnqn, NQN).unwrap();
    for (server_key, refused) in [(&t.psk.key, false), (&other.psk.key, true)] {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let hex: String = server_key.iter().map(|b| format!("{b:02x}")).collect();
        let spawned = Command::new("openssl")
            .args(["s_server", "-tls1_3", "-nocert", "-naccept", "1", "-accept", &port.to_string()])
            .args(["-psk", &hex, "-psk_identity", &t.identity, "-ciphersuites", "TLS_AES_128_GCM_SHA256"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let mut server = match spawned {
            Ok(c) => Reaped(c),
            Err(e) => return missing("openssl", e),
        };
        let mut out = server.0.stdout.take().unwrap();
        // s_server says ACCEPT once it listens.
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while !line.ends_with(b"ACCEPT") {
            assert_eq!(out.read(&mut b).unwrap(), 1, "openssl s_server ended before listening");
            line.push(b[0]);
        }
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        match tr.handshake(&mut s, &t, addr) {
            Ok(tls) => {
                assert!(!refused, "a server with another PSK accepted");
                assert_eq!(tls.session().cipher_suite().as_deref(), Some("TLS_AES_128_GCM_SHA256"));
            }
            Err(NvmeError::Tls { kind, what }) => {
                assert!(refused, "refused: {what}");
                assert_eq!(kind, TlsErrorKind::WrongPsk, "{what}");
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A child process killed and reaped when the test ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A controller attached through TLS: verified I/O through its namespace, a reset (new
/// handshakes for the admin and I/O queues), then a reset the target refuses at the handshake
/// (its PSK changed): retried every reconnect_delay_sec like a refused Connect, with the TLS
/// refusal as the last error, until the PSK is right again.
#[test]
fn a_controller_over_tls_resets_and_retries_a_refused_handshake() {
    use fp_bdev::conformance::{read_range, write_range};
    use fp_bdev::BlockDevice;

    use crate::ctrlr;
    use crate::tests::core_fake::{test_options, wait_for};

    let Some((_tg, term)) = through_tls() else { return };
    let port = term.port();
    let (mut opts, global) = test_options("tls0");
    opts.ctrlr_loss_timeout_sec = -1;
    opts.reconnect_delay_sec = 2; // 20 ms
    let c = ctrlr::attach(tls_transport(port, &KEY), opts, global, Box::new(|_| {})).expect("attach");
    let ns = c.namespaces()[0].clone();
    let mut ch = ns.open_channel().unwrap();
    let data: Vec<u8> = pattern(7, 96 << 10);
    write_range(&mut *ch, 0, &data);
    assert!(read_range(&mut *ch, 0, data.len()) == data);
    let handshakes = || term.identities().len();
    let before = handshakes();
    assert!(before >= 2, "the admin queue and the channel's I/O queue: {before}");
    c.reset().unwrap();
    assert!(read_range(&mut *ch, 0, data.len()) == data, "read back after a reset");
    assert!(handshakes() >= before + 2, "the reset shook hands again on each queue");

    term.set_key(Some(configured(&OTHER_KEY)));
    let e = c.reset().unwrap_err();
    assert!(e.to_string().contains("wrong PSK"), "{e}");
    let refused = term.refused();
    wait_for("two more refused attempts", || term.refused() >= refused + 2);
    // Between attempts (one may be under way when asked).
    wait_for("a delayed reconnect", || c.info().ctrlrs[0].state == "reconnect_is_delayed");
    let last = c.info().ctrlrs[0].last_error.clone().unwrap_or_default();
    assert!(last.contains("wrong PSK") && last.contains(&format!("127.0.0.1:{port}")), "{last}");
    term.set_key(Some(configured(&KEY)));
    wait_for("the controller back", || c.info().ctrlrs[0].state == "enabled");
    assert!(read_range(&mut *ch, 0, data.len()) == data, "read back after the reconnect");
    drop(ch);
    c.detach();
}
