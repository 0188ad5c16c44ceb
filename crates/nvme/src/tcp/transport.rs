//! The TCP transport: where a controller is (SPDK's transport ID fields) and how its queues are
//! made. Each queue is its own connection (TCP 3.3): a TCP connection with Nagle off,
//! ICReq/ICResp (TCP 3.6.2.1-2), then a Fabrics Connect (NVMe-oF 1.1 3.3) of queue 0 for a new
//! controller (dynamic controller ID) or of an I/O queue with the admin queue's controller ID.
//! The admin queue then enables the controller through Property Set/Get (CC.EN, CSTS.RDY) and
//! reads Identify Controller for what the I/O queues need (IOCCSZ, MDTS). A queue whose Connect
//! answer asks for authentication (AUTHREQ.ATR) runs DH-HMAC-CHAP (`auth`) before any other
//! command.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fp_nvme_spec::auth::{AUTHREQ_ASCR, AUTHREQ_ATR};
use fp_nvme_spec::fabrics::CONNECT_DATA_LEN;
use fp_nvme_spec::fabrics::{Connect, CNTLID_DYNAMIC};
use fp_nvme_spec::identify::{IDC_IOCCSZ, IDC_MDTS};
use fp_nvme_spec::registers;
use fp_nvme_spec::tcp::{self as pdu, CommonHeader, Digests, IcReq, IcResp, IC_LEN};
use fp_nvme_spec::{Sqe, SQE_LEN};

use super::admin::TcpAdmin;
use fp_crypto::dhchap::DhchapSecret;
use fp_crypto::tls::{
    ConfiguredPsk, HandshakeError, IdentityVersion, PskError, TlsError, TlsErrorKind, TlsPsk, TlsSession,
    TlsStream,
};

use super::auth::{self, DhchapHost, QueueAuth};
use super::queue::{Params, TcpQueue};
use super::reauth::{AuthShared, QueueReauth};
use crate::transport::{ready_timeout, AdminData, AdminQueue, HostId, Transport, TransportId};
use crate::{cmd, NvmeError};

/// In-capsule data on the admin queue (TCP 3.3.1: 8 KiB).
const ADMIN_ICD: u32 = 8192;
/// How long connecting, the ICReq exchange and Connect may take for an I/O queue.
const IO_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long Identify Controller may take while connecting.
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// SPDK's `adrfam`: the address family of `traddr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Adrfam {
    /// An IPv4 address.
    #[default]
    IPv4,
    /// An IPv6 address.
    IPv6,
}

/// Where an NVMe/TCP controller is and how to connect to it: `bdev_nvme_attach_controller`'s
/// transport parameters.
#[derive(Debug, Clone)]
pub struct TcpTarget {
    /// The target's IP address.
    pub traddr: String,
    /// Its port (`trsvcid`; 4420 is NVMe/TCP's).
    pub trsvcid: u16,
    /// `traddr`'s family.
    pub adrfam: Adrfam,
    /// The subsystem to connect to.
    pub subnqn: String,
    /// The host's NQN (may be empty, as SPDK's host without one).
    pub hostnqn: String,
    /// The host identifier sent in Connect.
    pub hostid: [u8; 16],
    /// Ask for header digests (CRC32C).
    pub hdgst: bool,
    /// Ask for data digests (CRC32C).
    pub ddgst: bool,
    /// Keep Alive Timeout sent in the admin queue's Connect, in milliseconds (0: none).
    pub kato_ms: u32,
    /// DH-HMAC-CHAP: the keys and what is offered, for a controller that asks.
    pub dhchap: DhchapHost,
    /// TLS 1.3 with a PSK on every queue's connection (`psk`); none: plain TCP.
    pub tls: Option<TcpTls>,
}

/// What every queue's TLS handshake offers: the PSK identity and the TLS PSK derived for it,
/// made once when the path is attached (SPDK's host derives them with the controller too),
/// and used by the admin and I/O queues and every reconnect.
#[derive(Debug, Clone)]
pub struct TcpTls {
    /// The keyring key the PSK came from (`psk`): messages name it, never its content.
    pub key_name: String,
    /// The PSK identity offered (version 0: `NVMe0R0<hh> <hostnqn> <subnqn>`).
    pub identity: String,
    /// The TLS PSK for that identity and its cipher suite's hash.
    pub psk: TlsPsk,
}

impl TcpTls {
    /// The identity and TLS PSK for `hostnqn` on `subnqn` from `configured` (the interchange
    /// format's PSK of keyring key `key_name`): the retained PSK (libnvme's current
    /// derivation), the version 0 identity, and the TLS PSK derived from both.
    pub fn derive(
        key_name: &str,
        configured: &ConfiguredPsk,
        hostnqn: &str,
        subnqn: &str,
    ) -> Result<TcpTls, NvmeError> {
        let refused =
            |e: PskError| NvmeError::InvalidParam { field: "psk", reason: format!("key '{key_name}': {e}") };
        let retained = configured.retained(hostnqn).map_err(refused)?;
        let identity = retained.identity(IdentityVersion::V0, hostnqn, subnqn).map_err(refused)?;
        let key = retained.tls_psk(&identity).map_err(refused)?;
        Ok(TcpTls {
            key_name: key_name.to_owned(),
            identity: identity.to_string(),
            psk: TlsPsk { hash: identity.hash(), key },
        })
    }
}

/// The NVMe/TCP transport to one controller.
#[derive(Debug)]
pub struct TcpTransport {
    target: TcpTarget,
    /// The local address of the last admin connection (`bdev_nvme_get_controllers`' host).
    local: Mutex<Option<SocketAddr>>,
    /// The DH-HMAC-CHAP keys queues authenticate with now (the target's at first, then those
    /// `bdev_nvme_set_keys` gave), the transaction IDs, and the I/O queues' re-authentication.
    auth: Arc<AuthShared>,
}

impl TcpTransport {
    /// A transport to `target`; nothing is connected until the controller code asks.
    pub fn new(target: TcpTarget) -> TcpTransport {
        let auth = Arc::new(AuthShared::new(target.dhchap.clone(), &target.hostnqn, &target.subnqn));
        TcpTransport { target, local: Mutex::new(None), auth }
    }

    /// Where it connects (its `dhchap` as attached; [`TcpTransport::dhchap`] has the keys now).
    pub fn target(&self) -> &TcpTarget {
        &self.target
    }

    /// The DH-HMAC-CHAP keys and offer queues authenticate with now.
    pub fn dhchap(&self) -> DhchapHost {
        self.auth.host()
    }

    /// Replaces the DH-HMAC-CHAP keys (`bdev_nvme_set_keys`; the offer stays): every later
    /// authentication uses them. As SPDK's host: none clears a key, and a controller key needs
    /// a host key.
    pub fn set_dhchap_keys(
        &self,
        key: Option<DhchapSecret>,
        ctrlr_key: Option<DhchapSecret>,
    ) -> Result<(), NvmeError> {
        if key.is_none() && ctrlr_key.is_some() {
            return Err(NvmeError::InvalidParam {
                field: "dhchap_ctrlr_key",
                reason: "authenticating the controller needs a host key (dhchap_key) too".into(),
            });
        }
        self.auth.set_keys(key, ctrlr_key);
        Ok(())
    }

    /// The authentication identity of queue `qid`'s next transaction.
    fn queue_auth(&self, qid: u16, timeout: Duration) -> QueueAuth<'_> {
        QueueAuth {
            qid,
            t_id: self.auth.t_id(),
            hostnqn: self.auth.hostnqn(),
            subnqn: self.auth.subnqn(),
            timeout,
        }
    }

    /// Authenticates the live admin queue again with the keys now (in band: Authentication
    /// Send and Receive between its other commands, whose completions it keeps).
    pub fn reauthenticate_admin(&self, admin: &mut TcpAdmin, timeout: Duration) -> Result<(), NvmeError> {
        let host = self.dhchap();
        let a = self.queue_auth(0, timeout);
        admin.authenticate(&host, &a)?;
        log::info!(
            "nvme tcp {} admin queue: authenticated again (DH-HMAC-CHAP) as {}",
            self.target.traddr,
            self.target.hostnqn
        );
        Ok(())
    }

    fn socket_addr(&self) -> Result<SocketAddr, NvmeError> {
        let t = &self.target;
        let ip: IpAddr = t.traddr.parse().map_err(|_| NvmeError::InvalidParam {
            field: "traddr",
            reason: format!("'{}' is not an IP address", t.traddr),
        })?;
        if ip.is_ipv4() != (t.adrfam == Adrfam::IPv4) {
            return Err(NvmeError::InvalidParam {
                field: "adrfam",
                reason: format!("{} is not an {:?} address", t.traddr, t.adrfam),
            });
        }
        if t.trsvcid == 0 {
            return Err(NvmeError::InvalidParam { field: "trsvcid", reason: "port 0".into() });
        }
        Ok(SocketAddr::new(ip, t.trsvcid))
    }

    /// A connection past ICReq/ICResp (and first the TLS handshake, with `tls`), in `timeout`:
    /// the socket, ICResp, the local address, and the TLS stream the queue goes on with.
    fn open(&self, timeout: Duration) -> Result<Opened, NvmeError> {
        let addr = self.socket_addr()?;
        let what = |step: &str| format!("NVMe/TCP {step} {addr}");
        let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => NvmeError::Gone(format!("{}: {e}", what("connect to"))),
            _ => NvmeError::io(what("connect to"), e),
        })?;
        s.set_nodelay(true).map_err(|e| NvmeError::io(what("TCP_NODELAY on"), e))?;
        // Every wait of the handshake and the ICReq exchange is bounded by these.
        s.set_read_timeout(Some(timeout)).map_err(|e| NvmeError::io(what("timeout on"), e))?;
        s.set_write_timeout(Some(timeout)).map_err(|e| NvmeError::io(what("timeout on"), e))?;
        let local = s.local_addr().ok();
        let mut tls = match &self.target.tls {
            None => None,
            Some(t) => Some(self.handshake(&mut s, t, addr)?),
        };
        let asked = Digests { header: self.target.hdgst, data: self.target.ddgst };
        let mut b = [0u8; IC_LEN];
        // HPDA 0: C2HData at any 4-byte offset; MAXR2T 0: one R2T outstanding per command.
        IcReq { pfv: pdu::PFV, hpda: 0, digests: asked, maxr2t: 0 }.write(&mut b);
        let exchanged = match tls.as_mut() {
            None => ic_exchange(&mut s, &mut b),
            Some(t) => ic_exchange(&mut t.blocking(&mut s), &mut b),
        };
        exchanged.map_err(|(sent, e)| match (sent, e.kind()) {
            (false, _) => NvmeError::Gone(format!("{}: {e}", what("ICReq to"))),
            (true, std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                NvmeError::Timeout(what("ICResp from"))
            }
            (true, _) => NvmeError::Gone(format!("{}: {e}", what("ICResp from"))),
        })?;
        let ch = CommonHeader::parse(b[..pdu::CH_LEN].try_into().expect("eight bytes"));
        let ic = pdu::check_header(&ch, Digests::default(), 0, IC_LEN as u32)
            .and_then(|_| IcResp::parse_checked(&b, asked))
            .map_err(|e| NvmeError::Protocol(format!("{}: {e}", what("ICResp from"))))?;
        Ok(Opened { fd: OwnedFd::from(s), ic, local, tls })
    }

    /// The TLS handshake on `s` as `t`'s identity; its socket's timeouts bound every wait.
    pub(super) fn handshake(
        &self,
        s: &mut TcpStream,
        t: &TcpTls,
        addr: SocketAddr,
    ) -> Result<TlsStream, NvmeError> {
        let refused = |e: TlsError| tls_refused(e, &t.identity, addr);
        let mut tls =
            TlsStream::new(TlsSession::client(t.identity.as_bytes(), t.psk.clone()).map_err(refused)?);
        match tls.blocking(s).handshake() {
            Ok(()) => Ok(tls),
            Err(HandshakeError::Tls(e)) => {
                let e = refused(e);
                log::warn!("{e}");
                Err(e)
            }
            Err(HandshakeError::Io(e)) => Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    NvmeError::Timeout(format!("NVMe/TCP TLS handshake with {addr} (as {})", t.identity))
                }
                _ => NvmeError::Gone(format!("NVMe/TCP TLS handshake with {addr} (as {}): {e}", t.identity)),
            }),
        }
    }

    /// A connected queue: ICReq/ICResp, then Connect of `qid` (`cntlid` for an I/O queue).
    pub(super) fn connect_queue(
        &self,
        qid: u16,
        depth: u16,
        cntlid: u16,
        icd: u32,
        timeout: Duration,
    ) -> Result<(TcpQueue, u16), NvmeError> {
        if depth < 2 {
            return Err(NvmeError::InvalidParam { field: "io_queue_depth", reason: "at least 2".into() });
        }
        let Opened { fd, ic, local, tls } = self.open(timeout)?;
        if qid == 0 {
            *self.local.lock().unwrap_or_else(|e| e.into_inner()) = local;
        }
        let on_tls = tls.is_some();
        let p = Params {
            qid,
            digests: ic.digests,
            cpda: ic.cpda,
            maxh2cdata: ic.maxh2cdata,
            // Connect's 1024 bytes go in the capsule on every queue (NVMe-oF 1.1 3.3).
            icd: icd.max(CONNECT_DATA_LEN as u32),
            // A queue of `depth` entries holds `depth - 1` commands (the SQ's full condition).
            slots: depth - 1,
            // Strict once authenticated: a controller sends less than an authentication
            // message's buffer.
            strict_reads: false,
        };
        let mut q = TcpQueue::new(fd, p, tls);
        let t = &self.target;
        let c = Connect {
            cid: 0,
            qid,
            sq_entries: u32::from(depth),
            cattr: 0,
            kato_ms: if qid == 0 { t.kato_ms } else { 0 },
            hostid: t.hostid,
            cntlid,
            subnqn: t.subnqn.clone(),
            hostnqn: t.hostnqn.clone(),
        };
        let mut sqe = Sqe([0; SQE_LEN]);
        let mut data = [0u8; CONNECT_DATA_LEN];
        c.write(&mut sqe, &mut data);
        let cqe = q.run(&sqe, AdminData::ToDevice(&data), timeout, &mut |_, _| {})?;
        if !cqe.status.is_success() {
            return Err(NvmeError::Command { what: "Fabrics Connect", status: cqe.status });
        }
        q.set_icd(icd);
        let authreq = cqe.dw0 & (AUTHREQ_ATR | AUTHREQ_ASCR);
        if authreq & AUTHREQ_ASCR != 0 {
            // A secure channel is asked for after authentication (NVMe-oF 1.1 6.3.2): TLS set up
            // by the authentication transaction itself is not supported (a PSK given at attach
            // gives the channel before Connect).
            return Err(NvmeError::Unsupported(format!(
                "queue {qid}: the controller requires a secure channel set up by authentication (AUTHREQ.ASCR): not supported; attach with psk"
            )));
        }
        // The keys' epoch before authenticating: a change meanwhile re-authenticates the queue.
        let epoch = self.auth.epoch();
        if authreq & AUTHREQ_ATR != 0 {
            let a = self.queue_auth(qid, timeout);
            auth::authenticate(&mut q, &self.dhchap(), &a, &mut |_, _| {})?;
            log::info!("nvme tcp {} queue {qid}: authenticated (DH-HMAC-CHAP) as {}", t.traddr, t.hostnqn);
        }
        q.set_strict_reads(qid != 0);
        if qid != 0 {
            q.reauth = Some(Box::new(QueueReauth::new(self.auth.clone(), epoch)));
        }
        if qid != 0 && !on_tls && super::io_sock_impl() == fp_conn::uring::SocketImpl::Uring {
            // An I/O queue: on the io_uring engine of the reactor that takes it (a TLS queue
            // stays on plain system calls: the engine has no TLS).
            q.use_uring();
        }
        Ok((q, cqe.dw0 as u16))
    }
}

/// What [`TcpTransport::open`] made.
struct Opened {
    fd: OwnedFd,
    ic: IcResp,
    local: Option<SocketAddr>,
    tls: Option<TlsStream>,
}

/// Sends ICReq (`b`) and reads ICResp into `b`; an error says whether ICReq had gone.
fn ic_exchange(s: &mut (impl Read + Write), b: &mut [u8; IC_LEN]) -> Result<(), (bool, std::io::Error)> {
    s.write_all(b).and_then(|_| s.flush()).map_err(|e| (false, e))?;
    s.read_exact(b).map_err(|e| (true, e))
}

/// A refused TLS handshake as the driver's error: its kind, the target and the identity
/// offered (never key bytes: OpenSSL's words hold none).
fn tls_refused(e: TlsError, identity: &str, addr: SocketAddr) -> NvmeError {
    let why = match e.kind {
        TlsErrorKind::WrongPsk => "wrong PSK (the target's PSK for this identity differs)",
        TlsErrorKind::UnknownIdentity => "unknown PSK identity (the target has no PSK for this host)",
        TlsErrorKind::Protocol => "TLS protocol error",
        TlsErrorKind::Unavailable => "TLS unavailable (libssl, OpenSSL 3, could not be loaded)",
    };
    NvmeError::Tls {
        kind: e.kind,
        what: format!("NVMe/TCP TLS handshake with {addr} as '{identity}' refused: {why}: {}", e.detail),
    }
}

/// Polls CSTS until `done` says so, CSTS.CFS, or `timeout`.
fn wait_csts(
    admin: &mut TcpAdmin,
    timeout: Duration,
    what: &str,
    done: impl Fn(u32) -> bool,
) -> Result<(), NvmeError> {
    let end = Instant::now() + timeout;
    loop {
        let csts = admin.get_property(registers::CSTS, false)? as u32;
        if csts & registers::CSTS_CFS != 0 {
            return Err(NvmeError::Gone(format!("controller fatal status while waiting for {what}")));
        }
        if done(csts) {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(NvmeError::Timeout(what.into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Transport for TcpTransport {
    type Admin = TcpAdmin;
    type Io = TcpQueue;

    fn trtype(&self) -> &'static str {
        "TCP"
    }

    fn traddr(&self) -> String {
        self.target.traddr.clone()
    }

    fn trid(&self) -> TransportId {
        let t = &self.target;
        TransportId {
            trtype: "TCP".into(),
            adrfam: Some(match t.adrfam {
                Adrfam::IPv4 => "IPv4".into(),
                Adrfam::IPv6 => "IPv6".into(),
            }),
            traddr: t.traddr.clone(),
            trsvcid: Some(t.trsvcid.to_string()),
            subnqn: Some(t.subnqn.clone()),
        }
    }

    fn host(&self) -> HostId {
        let local = *self.local.lock().unwrap_or_else(|e| e.into_inner());
        HostId {
            nqn: self.target.hostnqn.clone(),
            addr: local.map(|a| a.ip().to_string()).unwrap_or_default(),
            svcid: local.map(|a| a.port().to_string()).unwrap_or_default(),
        }
    }

    fn connect_admin(&self, depth: u16, timeout: Duration) -> Result<TcpAdmin, NvmeError> {
        let (q, cntlid) = self.connect_queue(0, depth, CNTLID_DYNAMIC, ADMIN_ICD, timeout)?;
        let mut admin = TcpAdmin::new(q, cntlid);
        // Enable (Base 3.5.1, through properties on fabrics: NVMe-oF 1.1 3.5, 3.6).
        let cap = admin.get_property(registers::CAP, true)?;
        let cc = registers::CC_EN | registers::CC_CSS_NVM | registers::CC_IOQES;
        admin.set_property(registers::CC, u64::from(cc), false)?;
        wait_csts(&mut admin, ready_timeout(cap), "CSTS.RDY", |c| c & registers::CSTS_RDY != 0)?;
        let mut id = vec![0u8; 4096];
        let cqe = admin.execute(
            cmd::identify(fp_nvme_spec::identify::CNS_CONTROLLER, 0),
            AdminData::FromDevice(&mut id),
            IDENTIFY_TIMEOUT,
        )?;
        if !cqe.status.is_success() {
            return Err(NvmeError::Command { what: "Identify Controller", status: cqe.status });
        }
        // IOCCSZ counts 16-byte units of the command and its in-capsule data (NVMe-oF 1.1 4.1).
        let ioccsz = u32::from_le_bytes(id[IDC_IOCCSZ..IDC_IOCCSZ + 4].try_into().expect("four bytes"));
        admin.io_icd = (ioccsz.saturating_mul(16)).saturating_sub(SQE_LEN as u32);
        let mdts = id[IDC_MDTS];
        let page = 4096u64 << registers::cap_mpsmin(cap);
        admin.max_transfer =
            if mdts == 0 { u32::MAX } else { (page << mdts).min(u64::from(u32::MAX)) as u32 };
        Ok(admin)
    }

    fn connect_io(&self, admin: &mut TcpAdmin, qid: u16, depth: u16) -> Result<TcpQueue, NvmeError> {
        let (q, cntlid) = self.connect_queue(qid, depth, admin.cntlid, admin.io_icd, IO_CONNECT_TIMEOUT)?;
        if cntlid != admin.cntlid {
            return Err(NvmeError::Protocol(format!(
                "I/O queue {qid} connected to controller {cntlid}, not {}",
                admin.cntlid
            )));
        }
        Ok(q)
    }

    fn disconnect_io(&self, _admin: &mut TcpAdmin, _qid: u16) -> Result<(), NvmeError> {
        // Closing the queue's connection (dropping it) is all NVMe/TCP asks.
        Ok(())
    }

    fn set_dhchap_keys(
        &self,
        key: Option<DhchapSecret>,
        ctrlr_key: Option<DhchapSecret>,
    ) -> Result<(), NvmeError> {
        TcpTransport::set_dhchap_keys(self, key, ctrlr_key)
    }

    fn reauthenticate_admin(&self, admin: &mut TcpAdmin, timeout: Duration) -> Result<(), NvmeError> {
        TcpTransport::reauthenticate_admin(self, admin, timeout)
    }

    fn reauthenticate_io(&self, queues: usize, timeout: Duration) -> Result<(), NvmeError> {
        self.auth.reauthenticate(queues, timeout)
    }

    fn shutdown(&self, admin: &mut TcpAdmin, timeout: Duration) {
        let r = admin.get_property(registers::CC, false).and_then(|cc| {
            let cc = (cc as u32 & !registers::CC_SHN_MASK) | registers::CC_SHN_NORMAL;
            admin.set_property(registers::CC, u64::from(cc), false)?;
            wait_csts(admin, timeout, "shutdown", |c| {
                c & registers::CSTS_SHST_MASK == registers::CSTS_SHST_COMPLETE
            })
        });
        if let Err(e) = r {
            log::info!("nvme tcp {}: shutdown: {e}", self.target.traddr);
        }
    }
}
