//! [`NvmfTarget`]: the control API the registry's nvmf export drives with SPDK's nvmf_* methods
//! (the transport, subsystems, their listeners, hosts and namespaces) and the SPDK-shaped
//! objects it reports. One per daemon; the discovery subsystem exists from the start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fp_conn::uring::SocketImpl;
use fp_nvme_spec::fabrics::{DISCOVERY_NQN, NQN_MAX_LEN};
use fp_nvme_spec::log_page::{ADRFAM_IPV4, ADRFAM_IPV6, SUBTYPE_NVME};
use fp_reactor::ReactorHandle;

use crate::error::{invalid, NvmfError};
use crate::info::*;
use crate::model::{AnaState, AnaStates, DiscoveryEntry, SubsystemKind};
use crate::options::*;
use crate::state::TargetInner;
use crate::subsystem::{lock, Namespace, SubState, Subsystem};
use crate::tcp::auth::{DhchapConfig, DhchapKeys};
use crate::tcp::server::Listener;

fn not_found(what: &'static str, name: &str) -> NvmfError {
    NvmfError::NotFound { what, name: name.to_string() }
}

/// How long `remove_namespace` waits for the namespace's I/O in flight before it answers
/// [`NvmfError::Draining`] (changed with [`NvmfTarget::set_drain_timeout`]).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why `require_dhchap` and `allow_any_host` do not go together.
const REQUIRE_DHCHAP_ANY_HOST: &str =
    "require_dhchap and allow_any_host together: a host that is not listed has no dhchap_key";
/// Why a host of a `require_dhchap` subsystem needs a key.
const REQUIRE_DHCHAP_KEY: &str = "required: the subsystem has require_dhchap (every host must authenticate)";

/// A listener, the subsystems on it and its port ID (in the discovery log).
pub(crate) type OpenListener = (Listener, BTreeSet<String>, u16);

/// The NVMe-oF target of a daemon (cheap to clone).
#[derive(Clone)]
pub struct NvmfTarget {
    pub(crate) inner: Arc<TargetInner>,
    /// Open listeners, each with the subsystems on it and its port ID (the control plane's
    /// alone: the handshake threads see only [`TargetInner`]).
    listeners: Arc<Mutex<BTreeMap<ListenAddress, OpenListener>>>,
}

fn check_nqn(nqn: &str) -> Result<(), NvmfError> {
    if nqn.is_empty() || nqn.len() > NQN_MAX_LEN || !nqn.starts_with("nqn.") {
        return Err(invalid(
            "nqn",
            format!("'{nqn}' is not an NQN (nqn.yyyy-mm.<domain>..., at most 223 bytes)"),
        ));
    }
    Ok(())
}

/// A stable identifier derived from names: what SPDK makes random, kept the same across
/// restarts so a host sees the same namespace.
fn derived_id<const N: usize>(salt: &str, parts: &[&str]) -> [u8; N] {
    let mut out = [0u8; N];
    for (i, chunk) in out.chunks_mut(4).enumerate() {
        let mut crc = fp_nvme_spec::tcp::crc32c(salt.as_bytes());
        crc = fp_nvme_spec::tcp::crc32c_append(crc, &(i as u32).to_le_bytes());
        for p in parts {
            crc = fp_nvme_spec::tcp::crc32c_append(crc, p.as_bytes());
            crc = fp_nvme_spec::tcp::crc32c_append(crc, &[0]);
        }
        chunk.copy_from_slice(&crc.to_le_bytes()[..chunk.len()]);
    }
    out
}

impl NvmfTarget {
    /// A target serving on `reactors`; the discovery subsystem exists from the start.
    pub fn new(reactors: Vec<ReactorHandle>, options: TargetOptions) -> NvmfTarget {
        let discovery = Subsystem::new(
            DISCOVERY_NQN.into(),
            SubsystemKind::Discovery,
            SubState {
                serial: String::new(),
                model: String::new(),
                allow_any_host: true,
                hosts: BTreeSet::new(),
                host_keys: BTreeMap::new(),
                host_psks: BTreeMap::new(),
                require_dhchap: false,
                max_namespaces: 0,
                min_cntlid: 1,
                max_cntlid: 0xFFEF,
                listeners: Vec::new(),
                secure_listeners: BTreeSet::new(),
                ana_reporting: false,
                ana: BTreeMap::new(),
                namespaces: BTreeMap::new(),
                controllers: BTreeMap::new(),
                next_cntlid: 1,
                deleted: false,
                orphans: Vec::new(),
            },
        );
        NvmfTarget {
            inner: Arc::new(TargetInner {
                reactors,
                options,
                transport: Mutex::new(None),
                subsystems: Mutex::new(BTreeMap::new()),
                discovery: Arc::new(discovery),
                drain_timeout_ms: AtomicU64::new(DRAIN_TIMEOUT.as_millis() as u64),
                close_timeout_ms: AtomicU64::new(crate::CLOSE_TIMEOUT.as_millis() as u64),
                stop_deadline: Mutex::new(None),
                sock_impl: Mutex::new(SocketImpl::default()),
                dhchap: Arc::new(Mutex::new(DhchapConfig::default())),
            }),
            listeners: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// Rebuilds the discovery log: every NVM subsystem at every one of its listeners.
    fn refresh_discovery(&self) {
        let ports: BTreeMap<ListenAddress, u16> =
            lock(&self.listeners).iter().map(|(a, (_, _, port))| (a.clone(), *port)).collect();
        let mut log = Vec::new();
        let mut hosts = Vec::new();
        for s in lock(&self.inner.subsystems).values() {
            let st = lock(&s.state);
            for a in &st.listeners {
                hosts.push((!st.allow_any_host).then(|| st.hosts.clone()));
                log.push(DiscoveryEntry {
                    adrfam: if a.adrfam == "IPv6" { ADRFAM_IPV6 } else { ADRFAM_IPV4 },
                    subtype: SUBTYPE_NVME,
                    port_id: ports.get(a).copied().unwrap_or(0),
                    traddr: a.traddr.clone(),
                    trsvcid: a.trsvcid.clone(),
                    subnqn: s.nqn.clone(),
                });
            }
        }
        *lock(&self.inner.discovery.discovery_hosts) = hosts;
        self.inner.discovery.refresh_view(Some(log));
        crate::tcp::qpair::notify_discovery(&self.inner.discovery);
    }

    /// How long removing a namespace waits for its commands in flight (default
    /// [`DRAIN_TIMEOUT`]).
    pub fn set_drain_timeout(&self, t: Duration) {
        self.inner.drain_timeout_ms.store(t.as_millis() as u64, Ordering::Relaxed);
    }

    /// How long a closing queue pair keeps retrying the commands its devices refuse as busy
    /// before it answers them aborted (default [`crate::CLOSE_TIMEOUT`]); for queue pairs
    /// connecting from now on.
    pub fn set_close_timeout(&self, t: Duration) {
        self.inner.close_timeout_ms.store(t.as_millis() as u64, Ordering::Relaxed);
    }

    /// The socket implementation of the queue pairs that connect from now on through
    /// listeners that name none (SPDK's `sock_set_default_impl`; `posix` by default).
    /// Choosing `uring` sets each reactor's engine up now rather than at its first queue pair,
    /// so its ring (a file descriptor) is there from the start.
    pub fn set_sock_impl(&self, sock_impl: SocketImpl) {
        *lock(&self.inner.sock_impl) = sock_impl;
        if sock_impl == SocketImpl::Uring {
            for r in &self.inner.reactors {
                r.send(|r| {
                    if let Err(e) = fp_conn::uring::ensure_poller(r) {
                        log::warn!("nvmf: reactor {}: the io_uring socket engine: {e}", r.id());
                    }
                });
            }
        }
    }

    /// The socket implementation of listeners that name none.
    pub fn sock_impl(&self) -> SocketImpl {
        *lock(&self.inner.sock_impl)
    }

    /// How long removing a namespace waits for its commands in flight; [`NvmfTarget::stop`]
    /// ends every drain by this long after it.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.drain_timeout_ms.load(Ordering::Relaxed))
    }

    /// Creates the TCP transport; a second one: AlreadyExists.
    pub fn create_transport(&self, mut opts: TransportOptions) -> Result<(), NvmfError> {
        opts.check()?;
        if self.inner.reactors.is_empty() {
            return Err(invalid("trtype", "the daemon has no reactor to serve queue pairs"));
        }
        let mut t = lock(&self.inner.transport);
        if t.is_some() {
            return Err(NvmfError::AlreadyExists { what: "transport", name: "TCP".into() });
        }
        *t = Some(opts);
        Ok(())
    }

    pub fn transports(&self) -> Vec<TransportOptions> {
        lock(&self.inner.transport).iter().cloned().collect()
    }

    pub fn create_subsystem(&self, spec: SubsystemSpec) -> Result<(), NvmfError> {
        check_nqn(&spec.nqn)?;
        if spec.nqn == DISCOVERY_NQN {
            return Err(NvmfError::AlreadyExists { what: "subsystem", name: spec.nqn });
        }
        let serial = spec.serial_number.unwrap_or_else(|| "00000000000000000000".into());
        if serial.len() > 20 || !serial.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(invalid("serial_number", "at most 20 printable ASCII characters"));
        }
        let model = spec.model_number.unwrap_or_else(|| "flashpath NVMe-oF controller".into());
        if model.len() > 40 || !model.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(invalid("model_number", "at most 40 printable ASCII characters"));
        }
        let (min, max) =
            (spec.min_cntlid.max(1), if spec.max_cntlid == 0 { 0xFFEF } else { spec.max_cntlid });
        if min > max || max > 0xFFEF {
            return Err(invalid("min_cntlid", "need 1 <= min_cntlid <= max_cntlid <= 65519"));
        }
        let max_namespaces = if spec.max_namespaces == 0 { 32 } else { spec.max_namespaces };
        if spec.require_dhchap && spec.allow_any_host {
            return Err(invalid("require_dhchap", REQUIRE_DHCHAP_ANY_HOST));
        }
        let state = SubState {
            serial,
            model,
            allow_any_host: spec.allow_any_host,
            hosts: BTreeSet::new(),
            host_keys: BTreeMap::new(),
            host_psks: BTreeMap::new(),
            require_dhchap: spec.require_dhchap,
            max_namespaces,
            min_cntlid: min,
            max_cntlid: max,
            listeners: Vec::new(),
            secure_listeners: BTreeSet::new(),
            ana_reporting: spec.ana_reporting,
            ana: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            controllers: BTreeMap::new(),
            next_cntlid: min,
            deleted: false,
            orphans: Vec::new(),
        };
        let sub = Arc::new(Subsystem::new(spec.nqn.clone(), SubsystemKind::Nvme, state));
        sub.refresh_view(None);
        let mut subs = lock(&self.inner.subsystems);
        if subs.contains_key(&spec.nqn) {
            return Err(NvmfError::AlreadyExists { what: "subsystem", name: spec.nqn });
        }
        subs.insert(spec.nqn, sub);
        Ok(())
    }

    fn nvm_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, NvmfError> {
        lock(&self.inner.subsystems).get(nqn).cloned().ok_or_else(|| not_found("subsystem", nqn))
    }

    /// Deletes a subsystem and disconnects its hosts; its namespaces must be removed first.
    pub fn delete_subsystem(&self, nqn: &str) -> Result<(), NvmfError> {
        let sub = self.nvm_subsystem(nqn)?;
        let (qpairs, listeners) = {
            let mut st = lock(&sub.state);
            if !st.namespaces.is_empty() {
                return Err(invalid("nqn", format!("{nqn} still has {} namespaces", st.namespaces.len())));
            }
            st.deleted = true;
            (st.qpairs(), std::mem::take(&mut st.listeners))
        };
        lock(&self.inner.subsystems).remove(nqn);
        for a in &listeners {
            self.release_listener(nqn, a);
        }
        crate::tcp::qpair::close_qpairs(&qpairs, "the subsystem was deleted");
        self.refresh_discovery();
        log::info!("nvmf: subsystem {nqn} deleted ({} queue pairs disconnected)", qpairs.len());
        Ok(())
    }

    /// Takes `nqn` off the listener at `addr`; the last one closes it.
    fn release_listener(&self, nqn: &str, addr: &ListenAddress) {
        let closed = {
            let mut ls = lock(&self.listeners);
            let empty = ls.get_mut(addr).map(|l| {
                l.1.remove(nqn);
                l.1.is_empty()
            });
            if empty == Some(true) {
                ls.remove(addr)
            } else {
                None
            }
        };
        if let Some((l, _, _)) = closed {
            l.close();
        }
    }

    /// Makes the subsystem reachable at `addr` (opening the listener if it is new).
    pub fn add_listener(&self, nqn: &str, addr: ListenAddress) -> Result<(), NvmfError> {
        self.add_listener_with(nqn, addr, None)
    }

    /// [`NvmfTarget::add_listener`], its queue pairs on `sock_impl` (none: the target's
    /// [`NvmfTarget::sock_impl`] when they connect). A listener already open for another
    /// subsystem keeps the implementation it has.
    pub fn add_listener_with(
        &self,
        nqn: &str,
        addr: ListenAddress,
        sock_impl: Option<SocketImpl>,
    ) -> Result<(), NvmfError> {
        self.add_listener_ana(nqn, addr, sock_impl, AnaState::Optimized)
    }

    /// [`NvmfTarget::add_listener_with`], every ANA group at `ana_state` on it from the start
    /// (SPDK's `nvmf_subsystem_add_listener` `ana_state`; reported only with ANA reporting).
    pub fn add_listener_ana(
        &self,
        nqn: &str,
        addr: ListenAddress,
        sock_impl: Option<SocketImpl>,
        ana_state: AnaState,
    ) -> Result<(), NvmfError> {
        self.add_listener_secure(nqn, addr, sock_impl, ana_state, false)
    }

    /// [`NvmfTarget::add_listener_ana`]; with `secure` (SPDK's `secure_channel`) the listener
    /// takes TLS 1.3 only, and the hosts listed with a PSK are the ones that get through its
    /// handshake. As SPDK, refused on a subsystem that allows any host. One address is secure
    /// or not for every subsystem on it: adding a subsystem to an open listener with the other
    /// setting is refused.
    pub fn add_listener_secure(
        &self,
        nqn: &str,
        addr: ListenAddress,
        sock_impl: Option<SocketImpl>,
        ana_state: AnaState,
        secure: bool,
    ) -> Result<(), NvmfError> {
        if secure && !fp_crypto::tls::tls_available() {
            return Err(invalid(
                "secure_channel",
                "TLS needs OpenSSL's libssl (3.x), which cannot be loaded here",
            ));
        }
        if lock(&self.inner.transport).is_none() {
            return Err(invalid("trtype", "no TCP transport: nvmf_create_transport first"));
        }
        let sock = addr.socket_addr()?;
        let addr = addr.normalized();
        if !self.inner.options.allow_remote_listeners && !sock.ip().is_loopback() {
            return Err(invalid(
                "traddr",
                format!("{} is not a loopback address and remote listeners are not allowed", addr.traddr),
            ));
        }
        // The discovery subsystem may listen alone too (SPDK's `nvmf_subsystem_add_listener
        // discovery ...`, on port 8009 say): only discovery controllers connect there.
        let sub = self.any_subsystem(nqn)?;
        {
            let st = lock(&sub.state);
            if secure && (sub.kind == SubsystemKind::Discovery || st.allow_any_host) {
                return Err(invalid(
                    "secure_channel",
                    "a secure channel needs listed hosts with PSKs, and this subsystem allows any host",
                ));
            }
            if st.listeners.contains(&addr) {
                return Err(NvmfError::AlreadyExists {
                    what: "listener",
                    name: format!("{}:{}", addr.traddr, addr.trsvcid),
                });
            }
        }
        {
            let mut ls = lock(&self.listeners);
            match ls.get_mut(&addr) {
                Some(l) => {
                    if l.0.secure() != secure {
                        return Err(invalid(
                            "secure_channel",
                            format!(
                                "the listener at {}:{} is open with secure_channel {} for another subsystem",
                                addr.traddr,
                                addr.trsvcid,
                                l.0.secure()
                            ),
                        ));
                    }
                    l.1.insert(nqn.to_string());
                }
                None => {
                    let port = (0u16..).find(|p| ls.values().all(|l| l.2 != *p)).unwrap_or(0);
                    let l = Listener::open(&self.inner, addr.clone(), sock, sock_impl, secure)
                        .map_err(|e| invalid("traddr", format!("cannot listen on {sock}: {e}")))?;
                    ls.insert(addr.clone(), (l, BTreeSet::from([nqn.to_string()]), port));
                }
            }
        }
        {
            let mut st = lock(&sub.state);
            let groups = st.max_namespaces;
            st.ana.insert(addr.clone(), AnaStates::new(groups, ana_state));
            if secure {
                st.secure_listeners.insert(addr.clone());
            }
            st.listeners.push(addr);
        }
        self.refresh_discovery();
        Ok(())
    }

    /// Takes the subsystem off the listener at `addr` (the last one closes its socket) and
    /// disconnects what came in through it for this subsystem, as SPDK's
    /// `nvmf_subsystem_remove_listener`: each controller whose admin queue connected there
    /// (with all its I/O queues), and any other I/O queue that did. Other subsystems'
    /// connections on the same address and this subsystem's on other listeners stay. When
    /// it returns, each of those queue pairs has stopped reading commands (it answers the
    /// ones it took, then closes), unless its reactor did not answer within
    /// [`fp_reactor::CALL_BOUND`] (logged).
    pub fn remove_listener(&self, nqn: &str, addr: &ListenAddress) -> Result<(), NvmfError> {
        let sub = self.any_subsystem(nqn)?;
        let addr = addr.normalized();
        let qpairs = {
            let mut st = lock(&sub.state);
            let before = st.listeners.len();
            st.listeners.retain(|a| a != &addr);
            st.secure_listeners.remove(&addr);
            if st.listeners.len() == before {
                return Err(not_found("listener", &format!("{}:{}", addr.traddr, addr.trsvcid)));
            }
            st.ana.remove(&addr);
            listener_qpairs(&st, &addr)
        };
        self.release_listener(nqn, &addr);
        let unanswered = crate::tcp::qpair::close_qpairs_now(&qpairs, "its listener was removed");
        self.refresh_discovery();
        log::info!(
            "nvmf: {nqn}: listener {}:{} removed ({} queue pairs disconnected{})",
            addr.traddr,
            addr.trsvcid,
            qpairs.len(),
            if unanswered > 0 { format!("; {unanswered} reactors did not answer") } else { String::new() }
        );
        Ok(())
    }

    pub fn add_host(&self, nqn: &str, host_nqn: &str) -> Result<(), NvmfError> {
        self.add_host_with_keys(nqn, host_nqn, None)
    }

    /// Lists a host; with `keys` each of its queues must authenticate (DH-HMAC-CHAP).
    pub fn add_host_with_keys(
        &self,
        nqn: &str,
        host_nqn: &str,
        keys: Option<DhchapKeys>,
    ) -> Result<(), NvmfError> {
        self.add_host_with(nqn, host_nqn, keys, None)
    }

    /// Lists a host: with `keys` each of its queues must authenticate (DH-HMAC-CHAP), with
    /// `psk` it may connect through the subsystem's secure listeners (TLS).
    pub fn add_host_with(
        &self,
        nqn: &str,
        host_nqn: &str,
        keys: Option<DhchapKeys>,
        psk: Option<crate::HostPsk>,
    ) -> Result<(), NvmfError> {
        check_nqn(host_nqn).map_err(|_| invalid("host", format!("'{host_nqn}' is not an NQN")))?;
        let sub = self.nvm_subsystem(nqn)?;
        {
            let mut st = lock(&sub.state);
            if st.require_dhchap && keys.is_none() {
                return Err(invalid("dhchap_key", REQUIRE_DHCHAP_KEY));
            }
            if !st.hosts.insert(host_nqn.to_string()) {
                return Err(NvmfError::AlreadyExists { what: "host", name: host_nqn.to_string() });
            }
            if let Some(keys) = keys {
                st.host_keys.insert(host_nqn.to_string(), keys);
            }
            if let Some(psk) = psk {
                st.host_psks.insert(host_nqn.to_string(), psk);
            }
        }
        self.refresh_discovery();
        Ok(())
    }

    /// Replaces a listed host's DH-HMAC-CHAP keys (`None`: it no longer authenticates). The
    /// queues connected keep running; each new connection, and each transaction a connected
    /// queue starts to authenticate again, uses the new keys.
    pub fn set_host_keys(
        &self,
        nqn: &str,
        host_nqn: &str,
        keys: Option<DhchapKeys>,
    ) -> Result<(), NvmfError> {
        let sub = self.nvm_subsystem(nqn)?;
        let mut st = lock(&sub.state);
        if !st.hosts.contains(host_nqn) {
            return Err(not_found("host", host_nqn));
        }
        if st.require_dhchap && keys.is_none() {
            return Err(invalid("dhchap_key", REQUIRE_DHCHAP_KEY));
        }
        match keys {
            Some(k) => st.host_keys.insert(host_nqn.to_string(), k),
            None => st.host_keys.remove(host_nqn),
        };
        Ok(())
    }

    /// The host's DH-HMAC-CHAP keys, if it must authenticate.
    pub fn host_keys(&self, nqn: &str, host_nqn: &str) -> Result<Option<DhchapKeys>, NvmfError> {
        let sub = self.nvm_subsystem(nqn)?;
        let st = lock(&sub.state);
        Ok(st.host_keys.get(host_nqn).cloned())
    }

    /// The hashes and DH groups DH-HMAC-CHAP may use from now on.
    pub fn set_dhchap_config(&self, config: DhchapConfig) {
        *lock(&self.inner.dhchap) = config;
    }

    /// The hashes and DH groups DH-HMAC-CHAP may use.
    pub fn dhchap_config(&self) -> DhchapConfig {
        lock(&self.inner.dhchap).clone()
    }

    /// Takes a host off the allowed list; its controllers are disconnected (as SPDK does, even
    /// when any host may connect again).
    pub fn remove_host(&self, nqn: &str, host_nqn: &str) -> Result<(), NvmfError> {
        let sub = self.nvm_subsystem(nqn)?;
        let qpairs = {
            let mut st = lock(&sub.state);
            if !st.hosts.remove(host_nqn) {
                return Err(not_found("host", host_nqn));
            }
            st.host_keys.remove(host_nqn);
            st.host_psks.remove(host_nqn);
            host_qpairs(&st, |h| h == host_nqn)
        };
        crate::tcp::qpair::close_qpairs(&qpairs, "the host was removed from the subsystem");
        self.refresh_discovery();
        Ok(())
    }

    /// Lets any host connect, or only the listed ones (those connected and not listed are
    /// disconnected).
    pub fn set_allow_any_host(&self, nqn: &str, allow: bool) -> Result<(), NvmfError> {
        let sub = self.nvm_subsystem(nqn)?;
        let qpairs = {
            let mut st = lock(&sub.state);
            if allow && st.require_dhchap {
                return Err(invalid("allow_any_host", REQUIRE_DHCHAP_ANY_HOST));
            }
            st.allow_any_host = allow;
            if allow {
                Vec::new()
            } else {
                let hosts = st.hosts.clone();
                host_qpairs(&st, |h| !hosts.contains(h))
            }
        };
        crate::tcp::qpair::close_qpairs(&qpairs, "the host is no longer allowed");
        self.refresh_discovery();
        Ok(())
    }

    /// The lowest namespace ID not in use.
    pub fn free_nsid(&self, nqn: &str) -> Result<u32, NvmfError> {
        let sub = self.nvm_subsystem(nqn)?;
        let st = lock(&sub.state);
        (1..=st.max_namespaces)
            .find(|n| !st.namespaces.contains_key(n))
            .ok_or_else(|| invalid("nsid", format!("{nqn} has its {} namespaces", st.max_namespaces)))
    }

    /// Attaches a namespace; connected hosts hear of it (AER).
    pub fn add_namespace(&self, nqn: &str, ns: NamespaceSpec) -> Result<u32, NvmfError> {
        let sub = self.nvm_subsystem(nqn)?;
        let admins = {
            let mut st = lock(&sub.state);
            if ns.nsid == 0 || ns.nsid > st.max_namespaces {
                return Err(invalid("nsid", format!("must be 1 to {}", st.max_namespaces)));
            }
            if st.namespaces.contains_key(&ns.nsid) {
                return Err(NvmfError::AlreadyExists { what: "namespace", name: ns.nsid.to_string() });
            }
            let anagrpid = ns.anagrpid.unwrap_or(ns.nsid);
            if anagrpid == 0 || anagrpid > st.max_namespaces {
                return Err(invalid(
                    "anagrpid",
                    format!("must be 1 to {} (max_namespaces)", st.max_namespaces),
                ));
            }
            let uuid = ns.uuid.unwrap_or_else(|| {
                let mut u: [u8; 16] = derived_id("uuid", &[nqn, &ns.bdev_name]);
                // RFC 9562 version 8 (custom), variant 10.
                u[6] = (u[6] & 0x0f) | 0x80;
                u[8] = (u[8] & 0x3f) | 0x80;
                u
            });
            let nguid = ns.nguid.unwrap_or_else(|| derived_id("nguid", &[nqn, &ns.bdev_name]));
            let n = Namespace::new(
                ns.nsid,
                ns.bdev,
                ns.bdev_name,
                (uuid, nguid, ns.eui64.unwrap_or([0; 8])),
                ns.read_only,
                anagrpid,
            );
            st.namespaces.insert(ns.nsid, Arc::new(n));
            admin_qpairs(&st)
        };
        sub.ns_generation.fetch_add(1, Ordering::Release);
        sub.refresh_view(None);
        crate::tcp::qpair::notify_namespace(&admins, ns.nsid);
        Ok(ns.nsid)
    }

    /// Detaches a namespace, then waits (at most the drain timeout) for its commands in flight;
    /// later commands to it get Invalid Namespace. Connected hosts hear of it (AER) at once.
    /// [`NvmfError::Draining`] when commands are still in flight at the bound: the namespace
    /// stays detached and its bdev in use; [`NvmfTarget::drain_namespace`] waits again.
    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> Result<(), NvmfError> {
        let sub = self.nvm_subsystem(nqn)?;
        let (admins, bdev) = {
            let mut st = lock(&sub.state);
            let Some(ns) = st.namespaces.remove(&nsid) else {
                return Err(not_found("namespace", &nsid.to_string()));
            };
            (admin_qpairs(&st), ns.bdev_name.clone())
        };
        sub.ns_generation.fetch_add(1, Ordering::Release);
        sub.refresh_view(None);
        crate::tcp::qpair::notify_namespace(&admins, nsid);
        self.drain_namespace(nqn, nsid, &bdev)
    }

    /// Waits (at most the drain timeout) until no queue pair of `nqn` has commands in flight
    /// to the detached namespace `nsid` (whose bdev is `bdev`, to name in the error).
    pub fn drain_namespace(&self, nqn: &str, nsid: u32, bdev: &str) -> Result<(), NvmfError> {
        // A subsystem deleted since has no queue pairs left to wait for.
        let Ok(sub) = self.nvm_subsystem(nqn) else { return Ok(()) };
        let qpairs = lock(&sub.state).qpairs();
        let start = Instant::now();
        let stop_deadline = *lock(&self.inner.stop_deadline);
        let deadline = match stop_deadline {
            Some(d) => d.min(start + self.drain_timeout()),
            None => start + self.drain_timeout(),
        };
        let in_flight = crate::tcp::qpair::drain_namespace(&qpairs, nsid, deadline);
        if in_flight == 0 {
            return Ok(());
        }
        // Said as the bound it waited (the stop's share of it when the target is stopping).
        let waited = if stop_deadline.is_some() { start.elapsed() } else { self.drain_timeout() };
        if stop_deadline.is_some() {
            log::warn!(
                "nvmf: {nqn}: namespace {nsid} (bdev '{bdev}'): {in_flight} command(s) still outstanding on the \
                 device as the target stops (waited {waited:?}); they are abandoned"
            );
        } else {
            log::warn!(
                "nvmf: {nqn}: namespace {nsid}: {in_flight} commands still in flight after {waited:?}"
            );
        }
        Err(NvmfError::Draining { nqn: nqn.into(), nsid, bdev: bdev.into(), in_flight, waited })
    }

    /// The namespace's bdev changed size: hosts hear of it (AER).
    pub fn namespace_resized(&self, nqn: &str, nsid: u32) {
        let Ok(sub) = self.nvm_subsystem(nqn) else { return };
        let admins = {
            let st = lock(&sub.state);
            if !st.namespaces.contains_key(&nsid) {
                return;
            }
            admin_qpairs(&st)
        };
        sub.refresh_view(None);
        crate::tcp::qpair::notify_namespace(&admins, nsid);
    }

    /// Every subsystem, the discovery one first, as SPDK's `nvmf_get_subsystems`.
    pub fn subsystems(&self) -> Vec<SubsystemInfo> {
        let mut v = vec![subsystem_info(&self.inner.discovery, &self.discovery_listeners())];
        let subs: Vec<Arc<Subsystem>> = lock(&self.inner.subsystems).values().cloned().collect();
        for s in subs {
            v.push(subsystem_info(&s, &[]));
        }
        v
    }

    /// The discovery subsystem listens wherever any subsystem does, and on its own listeners.
    fn discovery_listeners(&self) -> Vec<ListenAddress> {
        lock(&self.listeners).keys().cloned().collect()
    }

    fn any_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, NvmfError> {
        self.inner.subsystem(nqn).ok_or_else(|| not_found("subsystem", nqn))
    }

    /// As SPDK's `nvmf_subsystem_get_controllers`.
    pub fn controllers(&self, nqn: &str) -> Result<Vec<ControllerInfo>, NvmfError> {
        let sub = self.any_subsystem(nqn)?;
        let st = lock(&sub.state);
        Ok(st
            .controllers
            .values()
            .map(|c| ControllerInfo {
                cntlid: c.shared.cntlid,
                hostnqn: c.shared.hostnqn.clone(),
                hostid: uuid_string(&c.shared.hostid),
                num_io_qpairs: c.io.len() as u32,
            })
            .collect())
    }

    /// As SPDK's `nvmf_subsystem_get_qpairs`.
    pub fn qpairs(&self, nqn: &str) -> Result<Vec<QpairInfo>, NvmfError> {
        let sub = self.any_subsystem(nqn)?;
        let st = lock(&sub.state);
        let mut v = Vec::new();
        for c in st.controllers.values() {
            let all = c.admin.iter().map(|q| (0, q)).chain(c.io.iter().map(|(qid, q)| (*qid, q)));
            for (qid, q) in all {
                v.push(QpairInfo {
                    cntlid: c.shared.cntlid,
                    qid,
                    state: "active".into(),
                    thread: format!("nvmf_tgt_poll_group_{}", q.reactor.id()),
                    listen_address: q.listen.clone(),
                    auth: q.auth.map(|(hash, group)| QpairAuth {
                        state: "completed".into(),
                        digest: hash.name().into(),
                        dhgroup: group.name().into(),
                    }),
                });
            }
        }
        Ok(v)
    }

    /// Per subsystem: controllers, queue pairs, and per namespace its I/O counters.
    pub fn stats(&self) -> Vec<SubsystemStats> {
        let subs: Vec<Arc<Subsystem>> = lock(&self.inner.subsystems).values().cloned().collect();
        subs.iter()
            .map(|s| {
                let st = lock(&s.state);
                let qpairs = st
                    .controllers
                    .values()
                    .map(|c| usize::from(c.admin.is_some()) + c.io.len())
                    .sum::<usize>();
                SubsystemStats {
                    nqn: s.nqn.clone(),
                    controllers: st.controllers.len() as u32,
                    qpairs: qpairs as u32,
                    namespaces: st
                        .namespaces
                        .values()
                        .map(|n| {
                            let [read_ops, write_ops, bytes_read, bytes_written, other_ops, errors] =
                                n.totals();
                            NamespaceStats {
                                nsid: n.nsid,
                                bdev_name: n.bdev_name.clone(),
                                read_ops,
                                write_ops,
                                bytes_read,
                                bytes_written,
                                other_ops,
                                errors,
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Daemon shutdown: closes the listeners and disconnects every host. Every namespace
    /// drain from now on ends at one deadline, the drain timeout from now.
    pub fn stop(&self) {
        *lock(&self.inner.stop_deadline) = Some(Instant::now() + self.drain_timeout());
        let listeners = std::mem::take(&mut *lock(&self.listeners));
        for (_, (l, _, _)) in listeners {
            l.close();
        }
        let mut all = Vec::new();
        let subs: Vec<Arc<Subsystem>> = lock(&self.inner.subsystems).values().cloned().collect();
        for s in subs.iter().chain(std::iter::once(&self.inner.discovery)) {
            all.extend(lock(&s.state).qpairs());
        }
        crate::tcp::qpair::close_qpairs(&all, "the target is stopping");
    }
}

fn admin_qpairs(st: &SubState) -> Vec<crate::subsystem::QpairRef> {
    st.controllers.values().filter_map(|c| c.admin.clone()).collect()
}

fn host_qpairs(st: &SubState, pick: impl Fn(&str) -> bool) -> Vec<crate::subsystem::QpairRef> {
    let mut v = Vec::new();
    for c in st.controllers.values().filter(|c| pick(&c.shared.hostnqn)) {
        c.shared.gone.store(true, Ordering::Release);
        v.extend(c.admin.iter().cloned());
        v.extend(c.io.values().cloned());
    }
    v
}

/// The queue pairs that came in through `addr`: every queue of a controller whose admin queue
/// did (marked gone, so no I/O queue joins it from now on), and the I/O queues that did
/// themselves. Queues still on their way to a reactor see the listener gone when they arrive
/// (`hand_over`); orphans are closing already.
fn listener_qpairs(st: &SubState, addr: &ListenAddress) -> Vec<crate::subsystem::QpairRef> {
    let mut v = Vec::new();
    for c in st.controllers.values() {
        if c.admin.as_ref().is_some_and(|q| &q.listen == addr) {
            c.shared.gone.store(true, Ordering::Release);
            v.extend(c.admin.iter().cloned());
            v.extend(c.io.values().cloned());
        } else {
            v.extend(c.io.values().filter(|q| &q.listen == addr).cloned());
        }
    }
    v
}

fn subsystem_info(s: &Subsystem, discovery_listeners: &[ListenAddress]) -> SubsystemInfo {
    let st = lock(&s.state);
    let discovery = s.kind == SubsystemKind::Discovery;
    SubsystemInfo {
        nqn: s.nqn.clone(),
        subtype: if discovery { "Discovery" } else { "NVMe" }.into(),
        listen_addresses: if discovery { discovery_listeners.to_vec() } else { st.listeners.clone() },
        secure_listeners: st.secure_listeners.iter().cloned().collect(),
        allow_any_host: st.allow_any_host,
        hosts: st
            .hosts
            .iter()
            .map(|h| {
                let keys = st.host_keys.get(h);
                HostInfo {
                    nqn: h.clone(),
                    dhchap_key: keys.map(|k| k.key_name.clone()),
                    dhchap_ctrlr_key: keys.and_then(|k| k.ctrlr_key_name.clone()),
                    psk: st.host_psks.get(h).map(|p| p.key_name.clone()),
                }
            })
            .collect(),
        require_dhchap: st.require_dhchap,
        serial_number: (!discovery).then(|| st.serial.clone()),
        model_number: (!discovery).then(|| st.model.clone()),
        max_namespaces: (!discovery).then_some(st.max_namespaces),
        min_cntlid: (!discovery).then_some(st.min_cntlid),
        max_cntlid: (!discovery).then_some(st.max_cntlid),
        namespaces: (!discovery).then(|| {
            st.namespaces
                .values()
                .map(|n| NamespaceEntry {
                    nsid: n.nsid,
                    bdev_name: n.bdev_name.clone(),
                    name: n.bdev_name.clone(),
                    nguid: n.nguid.iter().map(|b| format!("{b:02X}")).collect(),
                    uuid: uuid_string(&n.uuid),
                    anagrpid: st.ana_reporting.then_some(n.anagrpid()),
                })
                .collect()
        }),
    }
}
