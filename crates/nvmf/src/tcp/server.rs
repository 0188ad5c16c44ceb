//! Listeners and the connection handshake, on the control plane. A listener
//! ([`fp_conn::Listener`]) per address accepts; each new connection gets a short-lived thread (at most [`MAX_HANDSHAKES`] per
//! listener, every read bounded by [`HANDSHAKE_TIMEOUT`]) that answers the ICReq and reads the
//! first capsule, which must be a Connect (TCP 3.3; Fabrics 3.3). It checks the subsystem, the
//! host and the queue, answers the Connect, and hands the socket by message to a reactor:
//! an admin queue to reactor `cntlid mod n`, I/O queue `qid` to reactor `qid mod n`, where a
//! [`QpairPoller`] serves it. The discovery subsystem is reachable on every listener.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use fp_conn::uring::SocketImpl;
use fp_conn::{Bound, ListenerOptions, Stream};

use fp_crypto::tls::{HandshakeError, TlsErrorKind, TlsStream};
use fp_nvme_spec::auth::{AuthCommand, DhGroupId, HashId, AUTHREQ_ATR, SC_AUTH_REQUIRED};
use fp_nvme_spec::fabrics::{Connect, ConnectRefusal, CNTLID_DYNAMIC, CONNECT_DATA_LEN};
use fp_nvme_spec::tcp::*;
use fp_nvme_spec::*;

use crate::controller::ControllerConfig;
use crate::model::SubsystemKind;
use crate::options::{ListenAddress, TransportOptions};
use crate::state::TargetInner;
use crate::subsystem::{lock, CtrlEntry, CtrlShared, QpairRef, Subsystem};
use crate::tcp::auth::{Authenticator, DhchapKeys};
use crate::tcp::qpair::{QpairPoller, QpairSetup, Role, ADMIN_ICD, MAX_H2C_DATA};
use crate::tcp::tls;

/// Handshakes one listener runs at once; one more closes the oldest (logged), so a flood of
/// silent connections pins this many threads at most and cannot lock out a real host.
pub(crate) const MAX_HANDSHAKES: usize = 64;
/// How long a host may take over one step of the handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// One listening address.
pub(crate) struct Listener {
    addr: ListenAddress,
    listener: fp_conn::Listener,
    /// TLS only (`secure_channel`).
    secure: bool,
}

impl Listener {
    pub(crate) fn open(
        t: &Arc<TargetInner>,
        addr: ListenAddress,
        sock: SocketAddr,
        sock_impl: Option<SocketImpl>,
        secure: bool,
    ) -> io::Result<Listener> {
        let what = format!("{}:{}", addr.traddr, addr.trsvcid);
        let bound = Bound::tcp(&[sock])?;
        let opts = ListenerOptions {
            label: format!("nvmf listener {what}"),
            thread_name: "nvmf-listen",
            handshake_thread_name: "nvmf-handshake",
            max_handshakes: MAX_HANDSHAKES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        };
        let (target, listen) = (Arc::downgrade(t), addr.clone());
        let listener = fp_conn::Listener::start(bound, opts, move |s, peer| {
            handshake(&target, &listen, secure, sock_impl, s, peer)
        })?;
        log::info!("nvmf: listening on {what}{}", if secure { " (TLS only)" } else { "" });
        Ok(Listener { addr, listener, secure })
    }

    /// Whether it takes TLS only.
    pub(crate) fn secure(&self) -> bool {
        self.secure
    }

    pub(crate) fn close(self) {
        self.listener.close();
        log::info!("nvmf: listener {}:{} closed", self.addr.traddr, self.addr.trsvcid);
    }
}

/// What a handshake reads and writes through: the socket itself, or the TLS session on it.
pub(crate) trait HandshakeIo: Read + Write {}
impl<T: Read + Write> HandshakeIo for T {}

/// Sends a C2HTermReq for `err` echoing `header`, best effort, and says why.
fn terminate(s: &mut dyn HandshakeIo, err: &PduError, header: &[u8]) -> String {
    let mut b = [0u8; DATA_HLEN + TERM_REQ_MAX_DATA];
    let n = write_c2h_term_req(&mut b, err, header);
    let _ = s.write_all(&b[..n]);
    let _ = s.flush();
    format!("{err}: terminated")
}

fn handshake(
    target: &Weak<TargetInner>,
    listen: &ListenAddress,
    secure: bool,
    sock_impl: Option<SocketImpl>,
    mut s: Stream,
    peer: &str,
) -> Result<(), String> {
    let mut tls = None;
    let queue = if secure {
        let mut t = tls_handshake(target, listen, &mut s)?;
        let identity = tls::identity_pair(t.session());
        let q = connect_queue(target, listen, &mut t.blocking(&mut s), identity.as_ref(), peer);
        tls = Some(t);
        q?
    } else {
        connect_queue(target, listen, &mut s, None, peer)?
    };
    let Connected { target, accepted, connect, transport, digests, hpda, sq_taken, negotiated } = queue;
    let fd = match s.into_nonblocking_fd() {
        Ok(fd) => fd,
        Err(e) => {
            unreserve(&accepted.sub, accepted.cntlid, connect.qid);
            return Err(format!("socket setup: {e}"));
        }
    };
    let n = target.reactors.len();
    let reactor = if connect.qid == 0 {
        target.reactors[usize::from(accepted.cntlid) % n].clone()
    } else {
        target.reactors[usize::from(connect.qid) % n].clone()
    };
    let suite = tls.as_ref().and_then(|t| t.session().cipher_suite());
    log::info!(
        "nvmf: {peer}: {} connected {} of controller {} (reactor {}{}{})",
        connect.hostnqn,
        if connect.qid == 0 { "the admin queue".to_string() } else { format!("I/O queue {}", connect.qid) },
        accepted.cntlid,
        reactor.id(),
        if digests.header || digests.data { ", digests" } else { "" },
        suite.map(|s| format!(", TLS {s}")).unwrap_or_default(),
    );
    let setup = QpairSetup {
        fd,
        peer: peer.to_string(),
        listen: listen.clone(),
        sub: accepted.sub,
        ctrl: accepted.ctrl,
        role: accepted.role,
        qid: connect.qid,
        sq_entries: connect.sq_entries,
        sq_flow_disabled: connect.cattr & 0x4 != 0,
        sq_taken,
        digests,
        hpda,
        transport,
        close_timeout: Duration::from_millis(target.close_timeout_ms.load(Ordering::Relaxed)),
        // A TLS queue reads and writes through its session: the posix path.
        sock_impl: if tls.is_some() {
            SocketImpl::Posix
        } else {
            sock_impl.unwrap_or_else(|| *lock(&target.sock_impl))
        },
        auth: negotiated,
        dhchap: target.dhchap.clone(),
        tls,
    };
    hand_over(reactor, setup);
    Ok(())
}

/// The TLS handshake of a connection on a secure listener, before its ICReq: the host's PSK
/// identity must name a host with a PSK on a subsystem reachable here. A failure is logged
/// with the host NQN the identity named, if any, and its kind (wrong PSK, unknown identity,
/// anything else: a protocol error, such as a host speaking NVMe/TCP in the clear).
pub(crate) fn tls_handshake(
    target: &Weak<TargetInner>,
    listen: &ListenAddress,
    s: &mut Stream,
) -> Result<TlsStream, String> {
    let (session, offered) = tls::server_session(target, listen).map_err(|e| format!("TLS session: {e}"))?;
    let mut t = TlsStream::new(session);
    let done = t.blocking(s).handshake();
    match done {
        Ok(()) => Ok(t),
        Err(e) => {
            // The alert the session wrote tells the host why (best effort).
            let _ = t.blocking(s).flush();
            let host = lock(&offered).take().map(|h| format!("host {h}: ")).unwrap_or_default();
            let kind = match &e {
                HandshakeError::Tls(t) => match t.kind {
                    TlsErrorKind::WrongPsk => "wrong PSK",
                    TlsErrorKind::UnknownIdentity => "unknown PSK identity",
                    TlsErrorKind::Protocol => "TLS protocol error (a host not speaking TLS?)",
                    TlsErrorKind::Unavailable => "TLS unavailable",
                },
                HandshakeError::Io(_) => "connection",
            };
            // The listener logs it (with the peer) as the connection's end.
            Err(format!("{host}TLS handshake refused on a secure listener: {kind}: {e}"))
        }
    }
}

/// A queue connected on the handshake thread, to be handed to a reactor.
struct Connected {
    target: Arc<TargetInner>,
    accepted: Accepted,
    connect: Connect,
    transport: TransportOptions,
    digests: Digests,
    hpda: u8,
    sq_taken: u32,
    negotiated: Option<(HashId, DhGroupId)>,
}

/// The ICReq, the Connect and (when the host must) DH-HMAC-CHAP, through `s`. `identity`: the
/// host and subsystem the TLS PSK identity named, which the Connect must name too.
fn connect_queue(
    target: &Weak<TargetInner>,
    listen: &ListenAddress,
    s: &mut dyn HandshakeIo,
    identity: Option<&(String, String)>,
    peer: &str,
) -> Result<Connected, String> {
    let io = |what: &str, e: io::Error| format!("{what}: {e}");
    // ICReq (TCP 3.6.2.1).
    let mut ic = [0u8; IC_LEN];
    s.read_exact(&mut ic[..CH_LEN]).map_err(|e| io("reading the ICReq", e))?;
    let ch = CommonHeader::parse(ic[..CH_LEN].try_into().expect("eight bytes"));
    if ch.pdu_type != PDU_IC_REQ {
        let err = PduError { fes: FES_PDU_SEQUENCE_ERROR, fei: 0, what: "the first PDU is not an ICReq" };
        return Err(terminate(s, &err, &ic[..CH_LEN]));
    }
    if let Err(err) = check_header(&ch, Digests::default(), 0, IC_LEN as u32) {
        return Err(terminate(s, &err, &ic[..CH_LEN]));
    }
    s.read_exact(&mut ic[CH_LEN..]).map_err(|e| io("reading the ICReq", e))?;
    let req = IcReq::parse(&ic).map_err(|err| terminate(s, &err, &ic))?;
    let Some(target) = target.upgrade() else { return Err("the target is gone".into()) };
    let Some(transport) = lock(&target.transport).clone() else { return Err("no transport".into()) };
    let resp = IcResp { cpda: 0, digests: req.digests, maxh2cdata: MAX_H2C_DATA };
    resp.write(&mut ic);
    s.write_all(&ic).and_then(|()| s.flush()).map_err(|e| io("sending the ICResp", e))?;
    let digests = req.digests;

    // The first capsule: a Connect with its 1024 bytes in the capsule.
    let max = (CAPSULE_CMD_HLEN + DIGEST_LEN + CONNECT_DATA_LEN + ADMIN_ICD as usize + DIGEST_LEN) as u32;
    let (pdu, layout) = read_capsule(s, digests, max, "a Connect")?;
    let data = &pdu[layout.data_offset..layout.data_offset + layout.data_len];
    let sqe = capsule_sqe(&pdu).expect("a capsule header");
    let respond = |s: &mut dyn HandshakeIo, cqe: Cqe| -> Result<(), String> {
        send_cqe(s, &cqe, digests).map_err(|e| io("sending the Connect response", e))
    };
    let refuse = |s: &mut dyn HandshakeIo, r: ConnectRefusal| -> String {
        let _ = respond(s, r.cqe(sqe.cid()));
        format!("Connect refused: {}", r.why)
    };
    let connect = Connect::parse(&sqe, data).map_err(|r| {
        if data.len() == CONNECT_DATA_LEN {
            let nqn =
                |at: usize| String::from_utf8_lossy(&data[at..at + 256]).trim_end_matches('\0').to_string();
            log::debug!("nvmf: {peer}: refused Connect: SUBNQN {:?}, HOSTNQN {:?}", nqn(256), nqn(512));
        }
        refuse(s, r)
    })?;
    // The SGL must describe the data where it is: in the capsule, at offset 0.
    if sqe.sgl().type_byte() != SGL_IN_CAPSULE || sqe.sgl().address() != 0 {
        let r = ConnectRefusal::status(
            Status::generic(SC_SGL_DESCRIPTOR_TYPE_INVALID),
            "Connect data not in the capsule",
        );
        return Err(refuse(s, r));
    }
    // Over TLS the host is who its PSK says: a Connect for another host or subsystem is
    // refused (as a host not allowed there).
    if let Some((host, sub)) = identity {
        if *host != connect.hostnqn || *sub != connect.subnqn {
            let r = ConnectRefusal {
                status: Status::command_specific(SC_CONNECT_INVALID_HOST),
                dw0: fp_nvme_spec::fabrics::DATA_HOSTNQN as u32 | (1 << 16),
                why: "the Connect names another host or subsystem than the TLS PSK identity",
            };
            let refused = refuse(s, r);
            // The listener logs it (with the peer) as the connection's end.
            return Err(format!(
                "host {host} (TLS PSK identity for {sub}) sent a Connect for host {} on {}: {refused}",
                connect.hostnqn, connect.subnqn
            ));
        }
    }
    let accepted = accept(&target, listen, &transport, &connect).map_err(|r| refuse(s, r))?;
    let flow_disabled = connect.cattr & 0x4 != 0;
    // SQHD: the Connect took the first entry (0xFFFF when the host disabled SQ flow control).
    let sqhd = if flow_disabled { 0xFFFF } else { 1 };
    let success = Cqe::new(connect.cid, Status::SUCCESS);
    let atr = if accepted.auth.is_some() { AUTHREQ_ATR } else { 0 };
    let cqe = Cqe { dw0: u32::from(accepted.cntlid) | atr, sqid: connect.qid, sqhd, ..success };
    let mut sq_taken = 1;
    let mut negotiated = None;
    let answered = respond(s, cqe).and_then(|()| match accepted.auth.clone() {
        None => Ok(()),
        Some(keys) => {
            let config = lock(&target.dhchap).clone();
            let mut auth = Authenticator::new(Some(keys), config, &connect.hostnqn, &connect.subnqn);
            let q = UnauthenticatedQueue {
                digests,
                hpda: req.hpda,
                icd: if connect.qid == 0 { ADMIN_ICD } else { transport.in_capsule_data_size },
                sq_entries: connect.sq_entries,
                flow_disabled,
                qid: connect.qid,
                hostnqn: &connect.hostnqn,
                peer,
            };
            authenticate(s, &q, &mut auth, &mut sq_taken)?;
            negotiated = auth.negotiated();
            Ok(())
        }
    });
    if let Err(e) = answered {
        unreserve(&accepted.sub, accepted.cntlid, connect.qid);
        return Err(e);
    }
    Ok(Connected { target, accepted, connect, transport, digests, hpda: req.hpda, sq_taken, negotiated })
}

struct Accepted {
    /// The host's keys when it must authenticate (taken at Connect: a key change applies to
    /// the connections after it).
    auth: Option<DhchapKeys>,
    cntlid: u16,
    sub: Arc<Subsystem>,
    ctrl: Arc<CtrlShared>,
    role: Role,
}

/// Checks a Connect against the subsystem and registers the controller (admin queue) or
/// checks the controller it joins (I/O queue).
fn accept(
    t: &TargetInner,
    listen: &ListenAddress,
    transport: &TransportOptions,
    c: &Connect,
) -> Result<Accepted, ConnectRefusal> {
    use fp_nvme_spec::fabrics::{CMD_QID, CMD_SQSIZE, DATA_CNTLID, DATA_HOSTNQN, DATA_SUBNQN};
    let no_subsystem = ConnectRefusal::invalid_parameter(true, DATA_SUBNQN, "no such subsystem here");
    let sub = t.subsystem(&c.subnqn).ok_or(no_subsystem)?;
    let mut st = lock(&sub.state);
    if st.deleted || (sub.kind == SubsystemKind::Nvme && !st.listeners.contains(listen)) {
        return Err(no_subsystem);
    }
    if !st.host_allowed(&c.hostnqn) {
        return Err(ConnectRefusal {
            status: Status::command_specific(SC_CONNECT_INVALID_HOST),
            dw0: DATA_HOSTNQN as u32 | (1 << 16),
            why: if st.require_dhchap {
                "host without a dhchap_key on a subsystem with require_dhchap"
            } else {
                "host not allowed"
            },
        });
    }
    if c.qid == 0 {
        if c.sq_entries > transport.max_aq_depth {
            return Err(ConnectRefusal::invalid_parameter(
                false,
                CMD_SQSIZE,
                "admin queue larger than max_aq_depth",
            ));
        }
        if c.cntlid != CNTLID_DYNAMIC && c.cntlid != 0xFFFE {
            return Err(ConnectRefusal::invalid_parameter(true, DATA_CNTLID, "only dynamic controllers"));
        }
        let cntlid = st.allocate_cntlid().ok_or(ConnectRefusal::status(
            Status::command_specific(SC_CONNECT_CONTROLLER_BUSY),
            "no controller ID left",
        ))?;
        let ctrl = Arc::new(CtrlShared {
            cntlid,
            hostnqn: c.hostnqn.clone(),
            hostid: c.hostid,
            ready: Default::default(),
            io_queues_allowed: Default::default(),
            gone: Default::default(),
        });
        let entry = CtrlEntry {
            shared: ctrl.clone(),
            admin: None,
            io: Default::default(),
            reserved: Default::default(),
        };
        st.controllers.insert(cntlid, entry);
        let cfg = ControllerConfig {
            cntlid,
            kind: sub.kind,
            subnqn: c.subnqn.clone(),
            hostnqn: c.hostnqn.clone(),
            hostid: c.hostid,
            max_queue_entries: transport.max_queue_depth,
            max_admin_queue_entries: transport.max_aq_depth,
            max_io_queues: transport.max_io_qpairs_per_ctrlr.min(u32::from(u16::MAX)) as u16,
            in_capsule_data_size: transport.in_capsule_data_size,
            max_transfer_bytes: transport.max_io_size,
            kato_ms: c.kato_ms,
        };
        let auth = st.host_keys.get(&c.hostnqn).cloned();
        drop(st);
        return Ok(Accepted { auth, cntlid, sub, ctrl, role: Role::Admin(Box::new(cfg)) });
    }
    let bad_ctrl = ConnectRefusal::invalid_parameter(true, DATA_CNTLID, "no such controller of this host");
    let entry = st.controllers.get(&c.cntlid).ok_or(bad_ctrl)?;
    let ctrl = entry.shared.clone();
    if ctrl.hostnqn != c.hostnqn || ctrl.hostid != c.hostid || ctrl.gone.load(Ordering::Acquire) {
        return Err(bad_ctrl);
    }
    if !ctrl.ready.load(Ordering::Acquire) {
        return Err(ConnectRefusal::status(
            Status::generic(SC_COMMAND_SEQUENCE_ERROR),
            "I/O queue before the controller is enabled",
        ));
    }
    // With ANA reporting a controller has its listener's states: its I/O queues come in
    // where its admin queue did (as SPDK checks), and go with it when that listener goes.
    if st.ana_reporting && entry.admin.as_ref().is_some_and(|a| &a.listen != listen) {
        return Err(ConnectRefusal::invalid_parameter(
            false,
            CMD_QID,
            "I/O queue on a listener other than its admin queue's",
        ));
    }
    let in_use = entry.io.contains_key(&c.qid) || entry.reserved.contains(&c.qid);
    if c.qid > ctrl.io_queues_allowed.load(Ordering::Acquire) || in_use {
        return Err(ConnectRefusal::invalid_parameter(false, CMD_QID, "queue ID not allowed or in use"));
    }
    if c.sq_entries > transport.max_queue_depth {
        return Err(ConnectRefusal::invalid_parameter(
            false,
            CMD_SQSIZE,
            "queue larger than max_queue_depth",
        ));
    }
    st.controllers.get_mut(&c.cntlid).expect("found above").reserved.insert(c.qid);
    let auth = st.host_keys.get(&c.hostnqn).cloned();
    drop(st);
    Ok(Accepted { auth, cntlid: c.cntlid, sub, ctrl, role: Role::Io })
}

/// Reads one command capsule (`what`, for the errors) of at most `max` bytes, its digests
/// checked; returns the PDU and where its data is.
fn read_capsule(
    s: &mut dyn HandshakeIo,
    digests: Digests,
    max: u32,
    what: &str,
) -> Result<(Vec<u8>, Layout), String> {
    let mut head = [0u8; CH_LEN];
    s.read_exact(&mut head).map_err(|e| format!("reading {what}: {e}"))?;
    let ch = CommonHeader::parse(&head);
    let layout = match check_header(&ch, digests, 0, max) {
        Ok(l) if ch.pdu_type == PDU_CAPSULE_CMD => l,
        Ok(_) => {
            let err =
                PduError { fes: FES_PDU_SEQUENCE_ERROR, fei: 0, what: "a PDU other than a command capsule" };
            return Err(terminate(s, &err, &head));
        }
        Err(err) => return Err(terminate(s, &err, &head)),
    };
    let mut pdu = vec![0u8; layout.plen()];
    pdu[..CH_LEN].copy_from_slice(&head);
    s.read_exact(&mut pdu[CH_LEN..]).map_err(|e| format!("reading {what}: {e}"))?;
    if layout.header_len > CAPSULE_CMD_HLEN && !header_digest_ok(&pdu, CAPSULE_CMD_HLEN) {
        let err = PduError { fes: FES_HEADER_DIGEST_ERROR, fei: 0, what: "header digest mismatch" };
        return Err(terminate(s, &err, &pdu[..layout.header_len]));
    }
    if layout.data_digest {
        let data = &pdu[layout.data_offset..layout.data_offset + layout.data_len];
        if crc32c(data).to_le_bytes() != pdu[layout.data_offset + layout.data_len..] {
            return Err(format!("data digest mismatch on {what}"));
        }
    }
    Ok((pdu, layout))
}

/// Commands a queue may send before it is authenticated: a transaction and a few retries.
/// Past it the connection closes, so a host cannot hold a handshake thread forever.
const MAX_UNAUTHENTICATED_COMMANDS: u32 = 32;

/// A connected queue that must authenticate, served on the handshake thread (so the
/// reactor's data path never sees an unauthenticated queue).
struct UnauthenticatedQueue<'a> {
    digests: Digests,
    hpda: u8,
    icd: u32,
    sq_entries: u32,
    flow_disabled: bool,
    qid: u16,
    hostnqn: &'a str,
    peer: &'a str,
}

/// Serves the queue's commands until its DH-HMAC-CHAP transaction succeeds: Authentication
/// Send and Receive drive `auth`, any other command fails with Authentication Required,
/// a Disconnect or a closed connection ends it. `sq_taken` counts the entries used.
fn authenticate(
    s: &mut dyn HandshakeIo,
    q: &UnauthenticatedQueue<'_>,
    auth: &mut Authenticator,
    sq_taken: &mut u32,
) -> Result<(), String> {
    let queue = if q.qid == 0 { "admin queue".to_string() } else { format!("I/O queue {}", q.qid) };
    let max = (CAPSULE_CMD_HLEN + DIGEST_LEN + q.icd as usize + DIGEST_LEN) as u32;
    for _ in 0..MAX_UNAUTHENTICATED_COMMANDS {
        let (pdu, layout) = read_capsule(s, q.digests, max, "a command before authentication")?;
        let sqe = capsule_sqe(&pdu).expect("a capsule header");
        *sq_taken += 1;
        let sqhd = if q.flow_disabled { 0xFFFF } else { (*sq_taken % q.sq_entries.max(1)) as u16 };
        let answer = |status: Status| Cqe { sqid: q.qid, sqhd, ..Cqe::new(sqe.cid(), status) };
        if sqe.opcode() == OPC_FABRICS && sqe.fctype() == FCTYPE_DISCONNECT {
            // Answered (best effort: the host may close first), then the connection ends.
            let _ = send_cqe(s, &answer(Status::SUCCESS), q.digests);
            return Err(format!("{}: {queue} disconnected before authenticating", q.hostnqn));
        }
        let cqe = match AuthCommand::from_sqe(&sqe) {
            Err(_)
                if sqe.opcode() != OPC_FABRICS
                    || !matches!(
                        sqe.fctype(),
                        FCTYPE_AUTHENTICATION_SEND | FCTYPE_AUTHENTICATION_RECEIVE
                    ) =>
            {
                answer(Status::command_specific(SC_AUTH_REQUIRED))
            }
            Err(e) => {
                log::info!("nvmf: {}: {}: {queue}: {e}", q.peer, q.hostnqn);
                answer(Status::generic(SC_INVALID_FIELD))
            }
            Ok(cmd) if cmd.send => {
                let data = &pdu[layout.data_offset..layout.data_offset + layout.data_len];
                if sqe.sgl().type_byte() != SGL_IN_CAPSULE || data.len() < cmd.length as usize {
                    // Messages are far smaller than the in-capsule data size every queue takes.
                    answer(Status::generic(SC_SGL_DESCRIPTOR_TYPE_INVALID))
                } else {
                    if let Err(r) = auth.on_send(&data[..cmd.length as usize]) {
                        log::warn!(
                            "nvmf: {}: host {} failed DH-HMAC-CHAP on its {queue}: {} ({:?})",
                            q.peer,
                            q.hostnqn,
                            r.why,
                            r.reason
                        );
                    }
                    answer(Status::SUCCESS)
                }
            }
            Ok(cmd) => match auth.on_receive() {
                None => answer(Status::generic(SC_COMMAND_SEQUENCE_ERROR)),
                Some(m) => {
                    let mut msg = vec![0u8; m.encoded_len()];
                    let n = m.encode(&mut msg).expect("a message fits its own length");
                    msg.truncate(n.min(cmd.length as usize));
                    send_c2h(s, q, sqe.cid(), &msg)?;
                    answer(Status::SUCCESS)
                }
            },
        };
        send_cqe(s, &cqe, q.digests)
            .map_err(|e| format!("answering a command before authentication: {e}"))?;
        if auth.authenticated() {
            log::info!("nvmf: {}: host {} authenticated its {queue}", q.peer, q.hostnqn);
            return Ok(());
        }
    }
    Err(format!(
        "{}: {queue} sent {MAX_UNAUTHENTICATED_COMMANDS} commands without authenticating: closed",
        q.hostnqn
    ))
}

/// Sends a CapsuleResp carrying `cqe`.
fn send_cqe(s: &mut dyn HandshakeIo, cqe: &Cqe, digests: Digests) -> io::Result<()> {
    let mut b = [0u8; HEADER_ROOM];
    let n = write_capsule_resp(&mut b, cqe, digests);
    s.write_all(&b[..n])?;
    s.flush()
}

/// Sends `data` for command `cid` in one C2HData PDU.
fn send_c2h(
    s: &mut dyn HandshakeIo,
    q: &UnauthenticatedQueue<'_>,
    cid: u16,
    data: &[u8],
) -> Result<(), String> {
    let mut b = [0u8; HEADER_ROOM];
    let h = DataHeader { cccid: cid, ttag: 0, offset: 0, length: data.len() as u32 };
    let n = write_c2h_data(&mut b, &h, FLAG_LAST_PDU, q.digests, q.hpda);
    let mut pdu = b[..n].to_vec();
    pdu.extend_from_slice(data);
    if q.digests.data {
        pdu.extend_from_slice(&crc32c(data).to_le_bytes());
    }
    s.write_all(&pdu).and_then(|()| s.flush()).map_err(|e| format!("sending an authentication message: {e}"))
}

/// Moves a connected queue to its reactor, where it is registered with its controller.
fn hand_over(reactor: fp_reactor::ReactorHandle, setup: QpairSetup) {
    let handle = reactor.clone();
    reactor.send(move |r| {
        let sub = setup.sub.clone();
        let ctrl = setup.ctrl.clone();
        let (qid, listen, peer, auth) = (setup.qid, setup.listen.clone(), setup.peer.clone(), setup.auth);
        // A listener removed meanwhile takes the queues that came in through it (the
        // discovery subsystem is reachable on every listener).
        let listening = |st: &crate::subsystem::SubState| {
            sub.kind == SubsystemKind::Discovery || st.listeners.contains(&listen)
        };
        let alive = |st: &crate::subsystem::SubState| {
            !st.deleted
                && !ctrl.gone.load(Ordering::Acquire)
                && st.controllers.contains_key(&ctrl.cntlid)
                && listening(st)
        };
        if !alive(&lock(&sub.state)) {
            unreserve(&sub, ctrl.cntlid, qid);
            return log::info!("nvmf: {peer}: controller {} went away during the handshake", ctrl.cntlid);
        }
        let p = match QpairPoller::new(setup, Instant::now()) {
            Ok(p) => p,
            Err(e) => {
                unreserve(&sub, ctrl.cntlid, qid);
                return log::warn!("nvmf: {peer}: cannot set the queue up: {e}; connection closed");
            }
        };
        let uring = p.uses_uring();
        let id = r.add_poller(Box::new(p));
        if uring {
            // After the queue pair: the engine's round ends with its sends.
            if let Err(e) = fp_conn::uring::ensure_poller(r) {
                log::warn!("nvmf: {peer}: the io_uring socket engine's poller: {e}");
            }
        }
        let mut st = lock(&sub.state);
        if let Some(e) = st.controllers.get_mut(&ctrl.cntlid) {
            e.reserved.remove(&qid);
        }
        let still = alive(&st);
        if let Some(p) = r.poller_mut::<QpairPoller>(id) {
            p.registered(id);
            if !still {
                p.close_after("its controller went away during the handshake");
            }
        }
        if still {
            let q = QpairRef { reactor: handle, id, listen, auth };
            let entry = st.controllers.get_mut(&ctrl.cntlid).expect("checked above");
            if qid == 0 {
                entry.admin = Some(q);
            } else {
                entry.io.insert(qid, q);
            }
        }
    });
}

/// A queue that will not run after all: an admin queue's controller goes, an I/O queue's ID
/// is free again.
fn unreserve(sub: &Subsystem, cntlid: u16, qid: u16) {
    let mut st = lock(&sub.state);
    if qid == 0 {
        st.controllers.remove(&cntlid);
    } else if let Some(e) = st.controllers.get_mut(&cntlid) {
        e.reserved.remove(&qid);
    }
}
