//! A secure listener (`secure_channel`): hosts listed with a PSK connect over TLS 1.3 and run
//! I/O through it (the test's host talks NVMe/TCP through a small TLS pump); a wrong PSK, an
//! identity without a PSK here, a host speaking in the clear and a Connect for another host
//! than the PSK identity's are refused, and other connections go on; OpenSSL's `s_client`
//! completes a handshake with the listener and gets an ICResp.

use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use fp_crypto::tls::{
    tls_available, ConfiguredPsk, HandshakeError, IdentityVersion, PskHash, TlsErrorKind, TlsPsk, TlsSession,
    TlsStream,
};
use fp_nvme_spec::fabrics::CNTLID_DYNAMIC;
use fp_nvme_spec::tcp::*;
use fp_nvme_spec::*;

use super::api::{free_port, listen, ram};
use super::host::*;
use super::io::{pattern, NQN};
use crate::model::AnaState;
use crate::testing::{namespace, LoopbackTarget};
use crate::*;

const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555";

/// A tool's absence: a skip with its reason, a failure under CI=true.
fn missing(tool: &str, why: impl std::fmt::Display) {
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true and {tool} does not run: {why}");
    println!("skipped: {tool} not runnable ({why})");
}

fn tls_or_skip() -> bool {
    if tls_available() {
        return true;
    }
    missing("libssl.so.3", "not loadable");
    false
}

fn psk(seed: u8) -> ConfiguredPsk {
    ConfiguredPsk::new(Some(PskHash::Sha256), &[seed; 32]).unwrap()
}

/// A target whose subsystem lists HOSTNQN and OTHER_HOST with PSKs 1 and 2, on a secure
/// listener (`port`) and a plain one (`plain`).
struct Secure {
    t: NvmfTarget,
    port: u16,
    plain: u16,
    _loopback: LoopbackTarget,
}

fn secure_target() -> Secure {
    secure_target_with(None, TransportOptions::default())
}

/// [`secure_target`], HOSTNQN also with DH-HMAC-CHAP `keys`, the transport with `opts`.
fn secure_target_with(keys: Option<DhchapKeys>, opts: TransportOptions) -> Secure {
    let loopback = LoopbackTarget::start(&[0, 1], opts).unwrap();
    let t = loopback.target().clone();
    // A TLS queue takes the posix path whatever the target's setting.
    t.set_sock_impl(SocketImpl::Uring);
    t.create_subsystem(SubsystemSpec { nqn: NQN.into(), allow_any_host: false, ..Default::default() })
        .unwrap();
    t.add_namespace(NQN, namespace(1, ram("ram0", 8192), "ram0")).unwrap();
    let host_psk = |host: &str, seed: u8| {
        Some(HostPsk::retained(&format!("key{seed}"), psk(seed).retained(host).unwrap()))
    };
    t.add_host_with(NQN, HOSTNQN, keys, host_psk(HOSTNQN, 1)).unwrap();
    t.add_host_with(NQN, OTHER_HOST, None, host_psk(OTHER_HOST, 2)).unwrap();
    let port = free_port();
    t.add_listener_secure(NQN, listen(port), None, AnaState::Optimized, true).unwrap();
    let plain = loopback.port();
    t.add_listener(NQN, listen(plain)).unwrap();
    Secure { t, port, plain, _loopback: loopback }
}

/// A TLS client of `port` offering `key`'s PSK as `hostnqn`'s for `subnqn` (a version 0
/// identity, as Linux offers), its handshake run.
fn tls_client(
    port: u16,
    key: &ConfiguredPsk,
    hostnqn: &str,
    subnqn: &str,
) -> (TcpStream, TlsStream, Result<(), HandshakeError>) {
    tls_client_with(port, key, hostnqn, subnqn, false)
}

/// [`tls_client`]; with `small_window` its socket has a tiny receive buffer.
fn tls_client_with(
    port: u16,
    key: &ConfiguredPsk,
    hostnqn: &str,
    subnqn: &str,
    small_window: bool,
) -> (TcpStream, TlsStream, Result<(), HandshakeError>) {
    let retained = key.retained(hostnqn).unwrap();
    let id = retained.identity(IdentityVersion::V0, hostnqn, subnqn).unwrap();
    let tls_psk = TlsPsk { hash: id.hash(), key: retained.tls_psk(&id).unwrap() };
    let session = TlsSession::client(id.to_string().as_bytes(), tls_psk).unwrap();
    let mut s = if small_window {
        Host::small_window(port)
    } else {
        TcpStream::connect(("127.0.0.1", port)).unwrap()
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut t = TlsStream::new(session);
    let r = t.blocking(&mut s).handshake();
    (s, t, r)
}

/// ICReq and a Connect (admin queue, `hostnqn` for `subnqn`) through `io`; the Connect's
/// completion, `None` if the connection closed first.
fn connect_through(io: &mut (impl Read + Write), hostnqn: &str, subnqn: &str) -> Option<Cqe> {
    let mut b = [0u8; IC_LEN];
    IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.write(&mut b);
    io.write_all(&b).unwrap();
    io.read_exact(&mut b).ok()?;
    assert_eq!(b[0], PDU_IC_RESP);
    let (sqe, d) = connect_command(0, subnqn, hostnqn, CNTLID_DYNAMIC, 0);
    let mut h = [0u8; HEADER_ROOM];
    let n = write_capsule_cmd(&mut h, &sqe, d.len(), Digests::default(), 0);
    let mut pdu = h[..n].to_vec();
    pdu.extend_from_slice(&d);
    io.write_all(&pdu).unwrap();
    io.flush().unwrap();
    let mut resp = [0u8; 24];
    io.read_exact(&mut resp).ok()?;
    assert_eq!(resp[0], PDU_CAPSULE_RESP);
    Some(Cqe::from_bytes(resp[8..24].try_into().unwrap()))
}

/// Whether the target closed `io` (its next read ends the stream or fails).
fn closed(io: &mut impl Read) -> bool {
    let mut b = [0u8; 64];
    !matches!(io.read(&mut b), Ok(n) if n > 0)
}

/// A plain socket for the test's [`Host`], whose bytes a thread carries through `tls` (its
/// handshake done) on `outer` to the target, and back. The thread ends when either side
/// closes.
fn tls_pump(outer: TcpStream, mut tls: TlsStream) -> TcpStream {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut inner, _) = listener.accept().unwrap();
    outer.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 << 10];
        let fd = outer.as_fd();
        loop {
            let mut fds = [
                libc::pollfd { fd: inner.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd {
                    fd: outer.as_raw_fd(),
                    events: libc::POLLIN | if tls.has_unsent() { libc::POLLOUT } else { 0 },
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfd entries the call may write.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };
            if fds[0].revents != 0 {
                let n = match inner.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        tls.close(fd);
                        return;
                    }
                    Ok(n) => n,
                };
                let mut at = 0;
                while at < n {
                    match tls.send_vectored(fd, &[IoSlice::new(&buf[at..n])]) {
                        Ok(k) => at += k,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(1))
                        }
                        Err(_) => return,
                    }
                }
            }
            loop {
                match tls.recv(fd, &mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if inner.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => return,
                }
            }
            if tls.flush(fd).is_err() {
                return;
            }
        }
    });
    host.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    host.set_nodelay(true).unwrap();
    host
}

/// A [`Host`] through TLS as `hostnqn` with PSK `key`, ICReq exchanged.
fn tls_host(port: u16, key: &ConfiguredPsk, hostnqn: &str) -> Host {
    tls_host_with(port, key, hostnqn, false)
}

/// [`tls_host`]; with `small_window` its socket to the target has a tiny receive buffer, so
/// that when the host stops reading, the target's ciphertext soon waits for its socket.
fn tls_host_with(port: u16, key: &ConfiguredPsk, hostnqn: &str, small_window: bool) -> Host {
    let (outer, tls, r) = tls_client_with(port, key, hostnqn, NQN, small_window);
    r.unwrap();
    let mut h = Host::wrap(tls_pump(outer, tls), Digests::default());
    let mut b = [0u8; IC_LEN];
    IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.write(&mut b);
    h.s.write_all(&b).unwrap();
    h.s.read_exact(&mut b).unwrap();
    assert_eq!(b[0], PDU_IC_RESP);
    h.maxh2c = IcResp::parse(&b).maxh2cdata;
    h
}

/// An enabled admin queue of a new controller of HOSTNQN, over TLS.
fn tls_admin(port: u16) -> Host {
    let mut h = tls_host(port, &psk(1), HOSTNQN);
    assert!(h.connect(0, NQN, HOSTNQN, CNTLID_DYNAMIC, 0).status.is_success());
    h.enable();
    h
}

#[test]
fn queue_pairs_run_io_over_tls() {
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target();
    let mut admin = tls_admin(tg.port);
    let cntlid = admin.cntlid;
    assert!(admin.set_features(0x07, 0x0003_0003).status.is_success());
    let mut q = tls_host(tg.port, &psk(1), HOSTNQN);
    assert!(q.connect(1, NQN, HOSTNQN, cntlid, 0).status.is_success());
    // In-capsule and R2T writes, and reads of many TLS records (128 KiB).
    for (slba, len) in [(0u64, 4096usize), (64, 128 << 10), (512, 512)] {
        let data = pattern(slba as u8, len);
        assert!(q.write(1, slba, &data, false).status.is_success());
        let (cqe, got) = q.read(1, slba, (len / 512) as u32);
        assert!(cqe.status.is_success());
        assert!(got == data, "read back what was written at {slba}");
    }
    // Many commands at once: the responses come back in a few TLS records.
    let data = pattern(9, 4096);
    for i in 0..16u64 {
        assert!(q.write(1, 1024 + i * 8, &data, false).status.is_success());
    }
    let (cqe, _) = admin.identify(1, 0);
    assert!(cqe.status.is_success());
    // The reports: the listener is secure, the hosts show their PSK names.
    let sub = tg.t.subsystems().into_iter().find(|s| s.nqn == NQN).unwrap();
    assert_eq!(sub.secure_listeners, vec![listen(tg.port).normalized()]);
    let psks: Vec<_> = sub.hosts.iter().map(|h| (h.nqn.as_str(), h.psk.as_deref())).collect();
    assert!(
        psks.contains(&(HOSTNQN, Some("key1"))) && psks.contains(&(OTHER_HOST, Some("key2"))),
        "{psks:?}"
    );
}

/// A host that does not read while 31 reads of 1 MiB are answered (more than the target's
/// socket buffers hold): the target's ciphertext waits for the socket (flushed when it is
/// writable again, with no PDU left to queue), and every byte arrives in order once the host
/// reads.
#[test]
fn ciphertext_waits_for_a_slow_host() {
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target_with(None, TransportOptions { max_io_size: 1 << 20, ..Default::default() });
    let mut admin = tls_admin(tg.port);
    assert!(admin.set_features(0x07, 0x0001_0001).status.is_success());
    let mut q = tls_host_with(tg.port, &psk(1), HOSTNQN, true);
    assert!(q.connect(1, NQN, HOSTNQN, admin.cntlid, 0).status.is_success());
    let data = pattern(5, 1 << 20);
    assert!(q.write(1, 0, &data, false).status.is_success());
    let mut cids = Vec::new();
    for _ in 0..31 {
        let mut sqe = q.rw_sqe(NVM_READ, 1, 0, 2048);
        set_sgl(&mut sqe, SGL_TRANSPORT, 1 << 20);
        cids.push(sqe.cid());
        q.send_capsule(&sqe, &[]);
    }
    // (Whether the target is blocked by now or not, the answers must all arrive whole.)
    std::thread::sleep(Duration::from_millis(200));
    let mut got: std::collections::BTreeMap<u16, Vec<u8>> = Default::default();
    let mut done = 0;
    while done < cids.len() {
        let p = q.read_pdu().unwrap();
        match p.ch.pdu_type {
            PDU_C2H_DATA => {
                let h = DataHeader::parse(&p.header).unwrap();
                let d = got.entry(h.cccid).or_default();
                assert_eq!(h.offset as usize, d.len());
                d.extend_from_slice(&p.data);
                done += usize::from(p.ch.flags & FLAG_SUCCESS != 0);
            }
            PDU_CAPSULE_RESP => {
                let cqe = Cqe::from_bytes(p.header[8..24].try_into().unwrap());
                assert!(cqe.status.is_success(), "{cqe:?}");
                done += 1;
            }
            t => panic!("unexpected PDU type {t:#x}"),
        }
    }
    for cid in cids {
        assert!(got[&cid] == data, "read {cid} came back whole");
    }
    // The other queue went on meanwhile, and this one still serves.
    assert!(admin.identify(1, 0).0.status.is_success());
    assert!(q.write(1, 512, &data[..4096], false).status.is_success());
}

/// A host with a PSK and DH-HMAC-CHAP keys: it authenticates through the TLS session on
/// the handshake thread at Connect, and again on its live queue on the reactor.
#[test]
fn dhchap_runs_inside_tls() {
    use super::auth::{authenticate, keys, secret};
    use fp_nvme_spec::auth::{AuthMessage, AUTHREQ_ATR};
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target_with(Some(keys(1, 2)), TransportOptions::default());
    let mut admin = tls_host(tg.port, &psk(1), HOSTNQN);
    let cqe = admin.connect(0, NQN, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert_eq!(cqe.dw0 & AUTHREQ_ATR, AUTHREQ_ATR, "{cqe:?}");
    assert!(matches!(authenticate(&mut admin, 1, &secret(1), &secret(2)), AuthMessage::Success1(_)));
    admin.enable();
    assert!(matches!(authenticate(&mut admin, 2, &secret(1), &secret(2)), AuthMessage::Success1(_)));
    let (cqe, _) = admin.identify(1, 0);
    assert!(cqe.status.is_success(), "{cqe:?}");
}

#[test]
fn wrong_psk_and_unknown_identities_are_refused_and_others_go_on() {
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target();
    let mut admin = tls_admin(tg.port);
    // The host's identity with another key: its binder does not verify.
    let (_s, _t, r) = tls_client(tg.port, &psk(7), HOSTNQN, NQN);
    assert!(matches!(&r, Err(HandshakeError::Tls(e)) if e.kind == TlsErrorKind::WrongPsk), "{r:?}");
    // A host not listed, a subsystem that does not exist: no PSK for the identity.
    let stranger = "nqn.2014-08.org.example:stranger";
    let (_s, _t, r) = tls_client(tg.port, &psk(1), stranger, NQN);
    assert!(matches!(&r, Err(HandshakeError::Tls(e)) if e.kind == TlsErrorKind::UnknownIdentity), "{r:?}");
    let (_s, _t, r) = tls_client(tg.port, &psk(1), HOSTNQN, "nqn.2016-06.io.flashpath:none");
    assert!(matches!(&r, Err(HandshakeError::Tls(e)) if e.kind == TlsErrorKind::UnknownIdentity), "{r:?}");
    // The connected host is unaffected.
    let (cqe, _) = admin.identify(1, 0);
    assert!(cqe.status.is_success());
    // Removing a host takes its PSK: its handshake is refused from then on.
    tg.t.remove_host(NQN, OTHER_HOST).unwrap();
    let (_s, _t, r) = tls_client(tg.port, &psk(2), OTHER_HOST, NQN);
    assert!(matches!(&r, Err(HandshakeError::Tls(e)) if e.kind == TlsErrorKind::UnknownIdentity), "{r:?}");
    let sub = tg.t.subsystems().into_iter().find(|s| s.nqn == NQN).unwrap();
    assert!(sub.hosts.iter().all(|h| h.nqn != OTHER_HOST));
}

/// What the listener logs for a refused handshake: the host NQN the identity named, and the
/// kind (the handshake run here on a socket of the test's, as a listener's thread runs it).
#[test]
fn refused_handshakes_say_who_and_why() {
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target();
    let refusal = |key: ConfiguredPsk, host: &'static str| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::thread::spawn(move || tls_client(port, &key, host, NQN).2.is_err());
        let (sock, _) = listener.accept().unwrap();
        let mut s = fp_conn::Stream::Tcp(sock);
        s.set_timeouts(Some(Duration::from_secs(10))).unwrap();
        let target = std::sync::Arc::downgrade(&tg.t.inner);
        let r = crate::tcp::server::tls_handshake(&target, &listen(tg.port).normalized(), &mut s);
        drop(s);
        assert!(client.join().unwrap(), "the client's handshake failed too");
        r.expect_err("a refusal")
    };
    let why = refusal(psk(9), HOSTNQN);
    assert!(why.starts_with(&format!("host {HOSTNQN}: ")) && why.contains("wrong PSK"), "{why}");
    let why = refusal(psk(1), "nqn.2014-08.org.example:stranger");
    assert!(
        why.starts_with("host nqn.2014-08.org.example:stranger: ") && why.contains("unknown PSK identity"),
        "{why}"
    );
}

#[test]
fn plain_host_on_a_secure_listener_is_refused() {
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target();
    let mut s = TcpStream::connect(("127.0.0.1", tg.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; IC_LEN];
    IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.write(&mut b);
    s.write_all(&b).unwrap();
    // No ICResp: at most a TLS alert record, then the end of the stream.
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.first() != Some(&PDU_IC_RESP), "an ICResp in the clear: {got:?}");
    assert!(got.len() < IC_LEN, "{} bytes", got.len());
    // The plain listener of the same subsystem serves the host (its PSK matters on secure
    // listeners only, as SPDK).
    let (mut h, cqe) = Host::connect_raw(tg.plain, Digests::default(), 0, NQN, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert!(cqe.status.is_success(), "{cqe:?}");
    h.enable();
}

#[test]
fn connect_for_another_host_than_the_identity_is_refused() {
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target();
    // OTHER_HOST's identity and PSK, then a Connect as HOSTNQN (who is listed too).
    let (mut s, mut t, r) = tls_client(tg.port, &psk(2), OTHER_HOST, NQN);
    r.unwrap();
    let mut io = t.blocking(&mut s);
    let cqe = connect_through(&mut io, HOSTNQN, NQN).expect("an answer to the Connect");
    assert_eq!(cqe.status, Status::command_specific(SC_CONNECT_INVALID_HOST), "{cqe:?}");
    assert!(closed(&mut io));
    // The identity's own host connects through the same handshake path.
    let (mut s, mut t, r) = tls_client(tg.port, &psk(2), OTHER_HOST, NQN);
    r.unwrap();
    let mut io = t.blocking(&mut s);
    let cqe = connect_through(&mut io, OTHER_HOST, NQN).expect("an answer to the Connect");
    assert!(cqe.status.is_success(), "{cqe:?}");
}

#[test]
fn secure_channel_settings_are_checked() {
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target();
    let e = |r: Result<(), NvmfError>| r.unwrap_err().to_string();
    // The secure address for another subsystem in the clear, the plain one secure.
    let other = "nqn.2016-06.io.flashpath:other";
    tg.t.create_subsystem(SubsystemSpec { nqn: other.into(), allow_any_host: false, ..Default::default() })
        .unwrap();
    let r = e(tg.t.add_listener(other, listen(tg.port)));
    assert!(r.contains("secure_channel"), "{r}");
    let r = e(tg.t.add_listener_secure(other, listen(tg.plain), None, AnaState::Optimized, true));
    assert!(r.contains("secure_channel"), "{r}");
    // As SPDK: no secure channel for a subsystem any host may connect to.
    let open = "nqn.2016-06.io.flashpath:open";
    tg.t.create_subsystem(SubsystemSpec { nqn: open.into(), allow_any_host: true, ..Default::default() })
        .unwrap();
    let r = e(tg.t.add_listener_secure(open, listen(free_port()), None, AnaState::Optimized, true));
    assert!(r.contains("secure_channel") && r.contains("allows any host"), "{r}");
    // Another subsystem with its own hosts shares the secure listener.
    tg.t.add_listener_secure(other, listen(tg.port), None, AnaState::Optimized, true).unwrap();
    // Removing the listener forgets it is secure.
    tg.t.remove_listener(NQN, &listen(tg.port)).unwrap();
    let sub = tg.t.subsystems().into_iter().find(|s| s.nqn == NQN).unwrap();
    assert!(sub.secure_listeners.is_empty());
}

/// OpenSSL's client with the TLS PSK and the identity completes the handshake with the
/// target's secure listener, and the target answers an ICReq through it.
#[test]
fn openssl_s_client_reaches_the_secure_listener() {
    if !tls_or_skip() {
        return;
    }
    let tg = secure_target();
    let retained = psk(1).retained(HOSTNQN).unwrap();
    let id = retained.identity(IdentityVersion::V0, HOSTNQN, NQN).unwrap();
    let key = retained.tls_psk(&id).unwrap();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let spawned = Command::new("openssl")
        .args(["s_client", "-tls1_3", "-quiet", "-ign_eof", "-connect", &format!("127.0.0.1:{}", tg.port)])
        .args(["-psk", &hex, "-psk_identity", &id.to_string(), "-ciphersuites", "TLS_AES_128_GCM_SHA256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut client = match spawned {
        Ok(c) => c,
        Err(e) => return missing("openssl", e),
    };
    let mut b = [0u8; IC_LEN];
    IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.write(&mut b);
    client.stdin.as_mut().unwrap().write_all(&b).unwrap();
    client.stdin.as_mut().unwrap().flush().unwrap();
    let mut out = client.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = [0u8; IC_LEN];
        let _ = tx.send(out.read_exact(&mut r).map(|()| r));
    });
    let got = rx.recv_timeout(Duration::from_secs(20));
    let _ = client.kill();
    let _ = client.wait();
    let r = got.expect("s_client printed an ICResp within 20 s").expect("s_client's output");
    assert_eq!(r[0], PDU_IC_RESP);
}
