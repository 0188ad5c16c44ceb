//! The bdev_nvme module: SPDK's `bdev_nvme_attach_controller`, `bdev_nvme_detach_controller`,
//! `bdev_nvme_get_controllers`, `bdev_nvme_reset_controller`, `bdev_nvme_set_options`,
//! `bdev_nvme_set_multipath_policy` and `bdev_nvme_get_io_paths`, with SPDK's parameters
//! (docs/nvme.md).
//!
//! Attaching, resetting and detaching block the control plane's RPC thread until the
//! controller answers (its admin timeouts bound that), never a reactor. The module keeps its
//! controllers by name in its registry state; each namespace is a bdev `<name>n<nsid>` added
//! through the [`ModuleHost`]. Namespace changes found later (asynchronous events, resets) come
//! from the controller's thread; they are handed to a thread of the module's own, which reaches
//! the registry through [`ModuleHost::weak_handle`]: adding a bdev runs every module's examine,
//! which reads the new namespace, and that read needs the controller thread free.
//!
//! * [`params`]: the methods' parameters, decoded and checked before anything is connected;
//! * `state`: the controllers by name (one path each, or several with multipath) and their
//!   bdevs;
//! * `multipath`: a second path under a taken name, detaching some paths, and
//!   `bdev_nvme_set_multipath_policy` and `bdev_nvme_get_io_paths`.

mod multipath;
pub mod params;
mod state;

use std::any::Any;
use std::sync::{mpsc, Arc, Weak};

use fp_bdev::metrics::{Family, MetricsCall};
use fp_bdev::module::{BdevModule, ConfigTable, ModuleError, ModuleHost, ModuleMethodFn, NewBdev};
use fp_bdev::{BdevInfo, ClaimType};
use fp_rpc::{ParamError, Params};
use serde_json::{json, Map, Value};

use crate::bdev::NvmeNamespace;
use crate::ctrlr::{attach, Controller, GlobalOptions, NamespaceEvent, TimeoutAction};
use crate::pcie::vfio::VfioFunction;
use crate::pcie::{PcieOptions, PcieTransport};
use crate::tcp::{Adrfam, DhchapHost, TcpTarget, TcpTls, TcpTransport};
use crate::NvmeError;
use fp_crypto::dhchap::{DhchapSecret, SecretError};
use fp_crypto::tls::{ConfiguredPsk, PskError};

use multipath::{
    add_path, check_new_path, detach_paths, get_io_paths, orphans, pick_paths, set_multipath_policy,
};
pub use state::MODULE;
use state::{lock, state, trid_fields, Attached, Path, Slot, State};

pub use params::{
    Address, AddressFamily, AttachParams, MultipathMode, OnTimeout, Options, OptionsParams, Reconnect, Trtype,
};

/// The bdev_nvme module.
pub struct NvmeModule;

fn uuid_text(id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The UUID at the end of a host NQN of the UUID form (`nqn.2014-08.org.nvmexpress:uuid:...`),
/// which the host identifier then matches, as Linux's host does.
fn uuid_of_nqn(nqn: &str) -> Option<[u8; 16]> {
    let text = nqn.strip_prefix("nqn.2014-08.org.nvmexpress:uuid:")?;
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || text.len() != 36 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// A driver error as the RPC reports it: a parameter's refusal names the field ("invalid
/// params"); the rest keep their errno ([`NvmeError::errno`]).
fn nvme_error(e: NvmeError) -> ModuleError {
    match e {
        NvmeError::InvalidParam { field, reason } => ParamError::new(field, reason).into(),
        other => ModuleError::module(other.errno(), other),
    }
}

fn no_controller(name: &str) -> ModuleError {
    ParamError::new("name", format!("no NVMe controller '{name}'")).into()
}

impl Options {
    /// The driver's options these stand for.
    fn global(&self) -> GlobalOptions {
        let mut g = GlobalOptions {
            timeout_us: self.timeout_us,
            timeout_admin_us: self.timeout_admin_us,
            action_on_timeout: match self.action_on_timeout {
                OnTimeout::None => TimeoutAction::None,
                OnTimeout::Abort => TimeoutAction::Abort,
                OnTimeout::Reset => TimeoutAction::Reset,
            },
            keep_alive_timeout_ms: self.keep_alive_timeout_ms,
            ctrlr_loss_timeout_sec: self.reconnect.ctrlr_loss_timeout_sec,
            reconnect_delay_sec: self.reconnect.reconnect_delay_sec,
            fast_io_fail_timeout_sec: self.reconnect.fast_io_fail_timeout_sec,
            nvme_adminq_poll_period_us: self.nvme_adminq_poll_period_us,
            enable_flush: self.enable_flush,
            ..GlobalOptions::default()
        };
        if self.io_queue_requests != 0 {
            g.io_queue_requests = self.io_queue_requests;
        }
        g
    }
}

/// The module's configuration file tables ([`BdevModule::config_tables`]).
const CONFIG_TABLES: &[ConfigTable] = &[
    ConfigTable::single("nvme_options", "bdev_nvme_set_options"),
    ConfigTable::array("nvme_controller", "bdev_nvme_attach_controller"),
];

impl BdevModule for NvmeModule {
    fn name(&self) -> &'static str {
        MODULE
    }

    /// `[nvme_options]` (`bdev_nvme_set_options`, which must come before any controller), then
    /// each `[[nvme_controller]]` (`bdev_nvme_attach_controller`).
    fn config_tables(&self) -> &'static [ConfigTable] {
        CONFIG_TABLES
    }

    /// From `bdev_nvme_get_controllers`: each controller path's state and counters.
    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family> {
        match call("bdev_nvme_get_controllers", None) {
            Some(c) => crate::metrics::nvme_controllers(&c).into(),
            None => Vec::new(),
        }
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_nvme_set_options", set_options),
            ("bdev_nvme_attach_controller", attach_controller),
            ("bdev_nvme_detach_controller", detach_controller),
            ("bdev_nvme_get_controllers", get_controllers),
            ("bdev_nvme_reset_controller", reset_controller),
            ("bdev_nvme_set_multipath_policy", set_multipath_policy),
            ("bdev_nvme_get_io_paths", get_io_paths),
            ("bdev_nvme_set_keys", set_keys),
        ]
    }

    /// Namespaces come from `[[nvme_controller]]` tables, not `[[bdev]]` ones.
    fn configurable(&self) -> bool {
        false
    }

    /// SPDK's `nvme` entry of the namespace (transport ID, controller and namespace data) as
    /// an object rather than SPDK's one-element array, with the controller's name and the
    /// queues' counters.
    fn driver_specific(&self, info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let Some(ns) = device.downcast_ref::<NvmeNamespace>() else {
            return Map::new();
        };
        let (mut m, all) = match ns.driver_specific().remove("nvme") {
            Some(Value::Array(paths)) if !paths.is_empty() => match &paths[0] {
                Value::Object(m) => (m.clone(), paths),
                _ => (Map::new(), paths),
            },
            _ => (Map::new(), Vec::new()),
        };
        // A multipath namespace: every path's entry too, SPDK's array (the first path's is
        // the object itself).
        if all.len() > 1 {
            m.insert("paths".into(), Value::Array(all));
        }
        let suffix = format!("n{}", ns.nsid());
        if let Some(ctrlr) = info.name.strip_suffix(&suffix) {
            m.insert("controller".into(), json!(ctrlr));
        }
        m
    }

    /// Deletes every controller's bdevs (the exports on them are gone by now) and detaches it:
    /// a clean shutdown (CC.SHN) tells a PCIe device to flush, a TCP target that the host is
    /// leaving. A detach still waiting for the controller at the daemon's shutdown deadline
    /// (a target that stopped answering) is logged and left to end alone.
    fn shutdown(&self, host: &dyn ModuleHost) {
        let st = state(host);
        let all = std::mem::take(&mut *lock(&st.controllers));
        for (name, slot) in all {
            let Slot::Attached(a) = slot else { continue };
            for bdev in st.bdevs_of(host, &name, &a.namespaces()) {
                if let Err(e) = host.delete_bdev(&bdev, MODULE) {
                    log::warn!("nvme {name}: bdev {bdev} not deleted at shutdown: {e}");
                }
                lock(&st.heads).remove(&bdev);
            }
            lock(&st.bdevs).remove(&name);
            for path in a.paths {
                detach_by(&name, path.ctrlr, host.shutdown_deadline());
            }
        }
    }
}

/// `bdev_nvme_set_options`: refused once a controller is attached, as in SPDK (they apply
/// at attach).
fn set_options(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    let given = OptionsParams::decode(p)?;
    let st = state(host);
    let controllers = lock(&st.controllers);
    if let Some(name) = controllers.keys().next() {
        return Err(ParamError::new(
            given.first_field.unwrap_or(""),
            format!(
                "bdev_nvme_set_options is refused once a controller is attached (as in SPDK); \
                 detach '{name}' first, or set the options before attaching"
            ),
        )
        .into());
    }
    let mut options = lock(&st.options);
    *options = given.over(*options)?;
    Ok(Value::Bool(true))
}

/// `bdev_nvme_attach_controller`: returns the namespaces' bdev names.
fn attach_controller(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    let a = AttachParams::decode(p)?;
    let st = state(host);
    let options = *lock(&st.options);
    let reconnect = a.reconnect.over(options.reconnect)?;
    {
        let mut map = lock(&st.controllers);
        match map.get(&a.name) {
            Some(Slot::Attached(existing)) => {
                check_new_path(existing, &a)?;
                let Some(Slot::Attached(existing)) = map.insert(a.name.clone(), Slot::Busy) else {
                    unreachable!("checked above")
                };
                drop(map);
                return add_path(host, &st, existing, &a, || {
                    connect_path(host, &st, &a, &options, reconnect)
                });
            }
            Some(Slot::Busy) => {
                return Err(ParamError::new(
                    "name",
                    format!("NVMe controller '{}' is being attached or detached; try again", a.name),
                )
                .into())
            }
            None => {}
        }
        map.insert(a.name.clone(), Slot::Busy);
    }
    let r = attach_reserved(host, &st, &a, &options, reconnect);
    let mut map = lock(&st.controllers);
    match r {
        Ok((attached, names)) => {
            for n in &names {
                st.note_bdev(&a.name, n, true);
            }
            map.insert(a.name.clone(), Slot::Attached(Attached { paths: vec![attached] }));
            Ok(json!(names))
        }
        Err(e) => {
            map.remove(&a.name);
            Err(e)
        }
    }
}

/// Attaches the controller whose name `a.name` is reserved, and adds its bdevs (all or none).
fn attach_reserved(
    host: &dyn ModuleHost,
    st: &State,
    a: &AttachParams,
    options: &Options,
    reconnect: Reconnect,
) -> Result<(Path, Vec<String>), ModuleError> {
    let path = connect_path(host, st, a, options, reconnect)?;
    let ctrlr = path.ctrlr.clone();
    let multipath = matches!(a.multipath, Some(MultipathMode::Multipath | MultipathMode::Failover));
    let mut names = Vec::new();
    for ns in ctrlr.namespaces() {
        if multipath {
            ns.paths().set_multipath();
        }
        if let Some(policy) = a.policy {
            ns.paths().set_policy(policy);
        }
        // An asynchronous event may have added it already.
        if host.bdev(ns.name()).is_some_and(|(_, driver)| driver == MODULE) {
            names.push(ns.name().to_string());
            continue;
        }
        match host.add_bdev(MODULE, NewBdev::new(ns.clone())) {
            Ok(name) => {
                lock(&st.heads).insert(name.clone(), ns);
                names.push(name)
            }
            Err(e) => {
                for n in &names {
                    let _ = host.delete_bdev(n, MODULE);
                    lock(&st.heads).remove(n);
                }
                ctrlr.detach();
                return Err(e);
            }
        }
    }
    Ok((path, names))
}

/// Connects the controller `a` names (its namespaces not registered yet).
fn connect_path(
    host: &dyn ModuleHost,
    st: &State,
    a: &AttachParams,
    options: &Options,
    reconnect: Reconnect,
) -> Result<Path, ModuleError> {
    let global = options.global();
    let mut opts = global.controller_options(&a.name);
    opts.ctrlr_loss_timeout_sec = reconnect.ctrlr_loss_timeout_sec;
    opts.reconnect_delay_sec = reconnect.reconnect_delay_sec;
    opts.fast_io_fail_timeout_sec = reconnect.fast_io_fail_timeout_sec;
    let path_id = Arc::new(std::sync::OnceLock::new());
    let events = event_sink(host.weak_handle(), a.name.clone(), path_id.clone());
    let (ctrlr, hostnqn) = match &a.address {
        Address::Pcie { traddr } => {
            let function = VfioFunction::open(traddr).map_err(nvme_error)?;
            let transport = PcieTransport::new(function, PcieOptions::default());
            (attach(transport, opts, global, events), None)
        }
        Address::Tcp { traddr, trsvcid, subnqn, hostnqn, hdgst, ddgst } => {
            let hostnqn = hostnqn
                .clone()
                .unwrap_or_else(|| format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid_text(&st.hostid)));
            let target = TcpTarget {
                traddr: traddr.to_string(),
                trsvcid: *trsvcid,
                adrfam: match params::family_of(traddr) {
                    AddressFamily::IPv4 => Adrfam::IPv4,
                    AddressFamily::IPv6 => Adrfam::IPv6,
                },
                subnqn: subnqn.clone(),
                hostid: uuid_of_nqn(&hostnqn).unwrap_or(st.hostid),
                hostnqn: hostnqn.clone(),
                hdgst: *hdgst,
                ddgst: *ddgst,
                kato_ms: global.keep_alive_timeout_ms,
                dhchap: DhchapHost {
                    key: dhchap_secret(host, "dhchap_key", a.dhchap_key.as_deref())?,
                    ctrlr_key: dhchap_secret(host, "dhchap_ctrlr_key", a.dhchap_ctrlr_key.as_deref())?,
                    offer: options.dhchap,
                },
                tls: tls_psk(host, a.psk.as_deref(), &hostnqn, subnqn)?,
            };
            (attach(TcpTransport::new(target), opts, global, events), Some(hostnqn))
        }
    };
    let ctrlr = ctrlr.map_err(nvme_error)?;
    let _ = path_id.set(ctrlr.path_id());
    Ok(Path { ctrlr, address: a.address.clone(), hostnqn, psk: a.psk.clone() })
}

/// The TLS identity and PSK of a path attached with `psk`, keyring key `name` (the
/// interchange format, `NVMeTLSkey-1:hh:...:`), for `hostnqn` on `subnqn`; errors name `psk`
/// and the key, never its content.
fn tls_psk(
    host: &dyn ModuleHost,
    name: Option<&str>,
    hostnqn: &str,
    subnqn: &str,
) -> Result<Option<TcpTls>, ModuleError> {
    let Some(name) = name else { return Ok(None) };
    let key = fp_crypto::keyring(host).key(name).map_err(|e| ParamError::new("psk", e.to_string()))?;
    if !fp_crypto::tls::tls_available() {
        return Err(ParamError::new("psk", "TLS needs libssl (OpenSSL 3), which could not be loaded").into());
    }
    let configured = key.with_material(|m| {
        let text = std::str::from_utf8(m)
            .map_err(|_| ParamError::new("psk", format!("key '{name}' is not a TLS PSK (not text)")))?;
        ConfiguredPsk::parse(text.trim()).map_err(|e| {
            // A base64 error quotes a byte of the text: say only that it is not base64.
            let why = match e {
                PskError::Base64(_) => "its key is not base64".to_string(),
                e => e.to_string(),
            };
            ParamError::new("psk", format!("key '{name}' is not a TLS PSK in the interchange format: {why}"))
        })
    })?;
    let tls = TcpTls::derive(name, &configured, hostnqn, subnqn).map_err(nvme_error)?;
    log::info!("nvme: TLS with PSK '{name}' as '{}'", tls.identity);
    Ok(Some(tls))
}

/// The DH-HMAC-CHAP secret (`DHHC-1:...`) the daemon's keyring holds as `name`; errors name
/// `field` and the key, never its content.
pub fn dhchap_secret(
    host: &dyn ModuleHost,
    field: &'static str,
    name: Option<&str>,
) -> Result<Option<DhchapSecret>, ModuleError> {
    let Some(name) = name else { return Ok(None) };
    let key = fp_crypto::keyring(host).key(name).map_err(|e| ParamError::new(field, e.to_string()))?;
    let secret = key.with_material(|m| {
        let text = std::str::from_utf8(m)
            .map_err(|_| ParamError::new(field, format!("key '{name}' is not a DHHC-1 secret (not text)")))?;
        DhchapSecret::parse(text.trim()).map_err(|e| {
            // A base64 error quotes a byte of the text: say only that it is not base64.
            let why = match e {
                SecretError::Base64(_) => "its key is not base64".to_string(),
                e => e.to_string(),
            };
            ParamError::new(field, format!("key '{name}' is not a DHHC-1 secret: {why}"))
        })
    })?;
    Ok(Some(secret))
}

/// The controller's namespace events, applied to the registry on a thread of their own (in
/// order; see the module docs), which ends when the controller drops the sink.
fn event_sink(
    host: Option<Weak<dyn ModuleHost + Send + Sync>>,
    ctrlr: String,
    path_id: Arc<std::sync::OnceLock<u64>>,
) -> Box<dyn Fn(NamespaceEvent) + Send + Sync> {
    let (tx, rx) = mpsc::channel::<NamespaceEvent>();
    let thread_name = format!("nvme-{ctrlr}-ns");
    let spawned = std::thread::Builder::new().name(thread_name).spawn(move || {
        for event in rx {
            let Some(host) = host.as_ref().and_then(Weak::upgrade) else {
                log::warn!("nvme {ctrlr}: namespace event {event:?} with no registry to apply it to");
                continue;
            };
            let path = path_id.get().copied().unwrap_or(0);
            apply_event(host.as_ref(), &state(host.as_ref()), &ctrlr, path, event);
        }
    });
    if let Err(e) = spawned {
        log::error!("nvme: no thread for namespace events ({e}); they will only be logged");
    }
    Box::new(move |event| {
        if let Err(mpsc::SendError(event)) = tx.send(event) {
            log::warn!("nvme: namespace event {event:?} dropped (no thread to apply it)");
        }
    })
}

/// One namespace change, as registry calls: a bdev added, resized (its users are told) or
/// deleted. A namespace that went away while its bdev is in use keeps the bdev, whose I/O
/// fails, until its users let it go and the controller is detached.
///
/// Multipath: a namespace another path of the same name already serves gains (or, gone,
/// loses) this path; its bdev goes only with its last path.
fn apply_event(
    host: &(dyn ModuleHost + Send + Sync),
    st: &State,
    ctrlr: &str,
    path: u64,
    event: NamespaceEvent,
) {
    match event {
        NamespaceEvent::Added(ns) => {
            let name = ns.name().to_string();
            if host.bdev_exists(&name) {
                let head = lock(&st.heads).get(&name).cloned();
                if let (Some(head), Some(own)) = (head, ns.own_path()) {
                    if head.paths().is_multipath() && !head.paths().ids().contains(&own.id) {
                        match head.paths().add(own) {
                            Ok(()) => log::info!("nvme {ctrlr}: namespace {name} has path {path} again"),
                            Err(why) => log::warn!("nvme {ctrlr}: {name}: path {path} not added: {why}"),
                        }
                    }
                }
                return;
            }
            let multipath = lock(&st.controllers).get(ctrlr).is_some_and(|slot| match slot {
                Slot::Attached(a) => {
                    a.paths.len() > 1 || a.namespaces().iter().any(|n| n.paths().is_multipath())
                }
                Slot::Busy => false,
            });
            if multipath {
                ns.paths().set_multipath();
            }
            match host.add_bdev(MODULE, NewBdev::new(ns.clone())) {
                Ok(_) => {
                    lock(&st.heads).insert(name.clone(), ns);
                    st.note_bdev(ctrlr, &name, true);
                    log::info!("nvme {ctrlr}: namespace bdev {name} added");
                }
                Err(e) => log::warn!("nvme {ctrlr}: namespace bdev {name} not added: {e}"),
            }
        }
        NamespaceEvent::Resized { nsid, num_blocks } => {
            let name = format!("{ctrlr}n{nsid}");
            if let Err(e) = host.resize_bdev(&name, MODULE, num_blocks) {
                log::warn!("nvme {ctrlr}: bdev {name} not resized to {num_blocks} blocks: {e}");
            }
        }
        NamespaceEvent::Removed { nsid } => {
            let name = format!("{ctrlr}n{nsid}");
            if !host.bdev_exists(&name) {
                return;
            }
            if let Some(head) = lock(&st.heads).get(&name).cloned() {
                let ids = head.paths().ids();
                if ids.contains(&path) && ids.len() > 1 {
                    let left = head.paths().remove(path);
                    log::warn!("nvme {ctrlr}: namespace {nsid} gone from path {path}; bdev {name} keeps {left} paths");
                    return;
                }
            }
            match host.delete_bdev(&name, MODULE) {
                Ok(()) => {
                    st.note_bdev(ctrlr, &name, false);
                    log::info!("nvme {ctrlr}: namespace {nsid} gone, bdev {name} deleted");
                }
                Err(e) => log::warn!(
                    "nvme {ctrlr}: namespace {nsid} gone; bdev {name} stays while in use (its I/O fails): {e}"
                ),
            }
        }
    }
}

/// The controllers (paths) attached as `name`.
fn attached(st: &State, name: &str) -> Result<Vec<Arc<dyn Controller>>, ModuleError> {
    match lock(&st.controllers).get(name) {
        Some(Slot::Attached(a)) => Ok(a.paths.iter().map(|p| p.ctrlr.clone()).collect()),
        Some(Slot::Busy) => Err(ParamError::new(
            "name",
            format!("NVMe controller '{name}' is being attached or detached; try again"),
        )
        .into()),
        None => Err(no_controller(name)),
    }
}

/// `bdev_nvme_detach_controller`: deletes the bdevs, then detaches. Refused while a bdev is
/// claimed. SPDK's path selectors (`trtype`, `traddr`, ...) pick the paths to detach: the
/// namespaces lose those paths and keep their bdevs while another path serves them; without
/// selectors, or when every path is picked, the whole controller goes.
fn detach_controller(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let mut selectors = Vec::new();
    for field in ["trtype", "traddr", "adrfam", "trsvcid", "subnqn", "hostaddr", "hostsvcid"] {
        if let Some(v) = p.optional_str(field)? {
            selectors.push((field, v));
        }
    }
    p.finish()?;
    let st = state(host);
    let (mut taken, picked) = {
        let mut map = lock(&st.controllers);
        match map.get(&name) {
            Some(Slot::Attached(a)) => {
                let picked = pick_paths(a, &name, &selectors)?;
                let whole = picked.len() == a.paths.len();
                // Check before taking: a claimed bdev leaves everything as it was.
                let doomed =
                    if whole { st.bdevs_of(host, &name, &a.namespaces()) } else { orphans(&st, a, &picked) };
                for bdev in &doomed {
                    host.claimable(bdev, ClaimType::ExclusiveWrite)?;
                }
                match map.insert(name.clone(), Slot::Busy) {
                    Some(Slot::Attached(a)) => (a, picked),
                    _ => unreachable!("checked above"),
                }
            }
            Some(Slot::Busy) => {
                return Err(ParamError::new(
                    "name",
                    format!("NVMe controller '{name}' is being attached or detached; try again"),
                )
                .into())
            }
            None => return Err(no_controller(&name)),
        }
    };
    if picked.len() < taken.paths.len() {
        return detach_paths(host, &st, &name, taken, &picked);
    }
    for bdev in st.bdevs_of(host, &name, &taken.namespaces()) {
        if let Err(e) = host.delete_bdev(&bdev, MODULE) {
            // Claimed since the check: put the controller back as it was (less the bdevs
            // already deleted, which a reset or a detach does not bring back).
            lock(&st.controllers).insert(name, Slot::Attached(taken));
            return Err(e);
        }
        lock(&st.heads).remove(&bdev);
    }
    for path in taken.paths.drain(..) {
        path.ctrlr.detach();
    }
    lock(&st.bdevs).remove(&name);
    lock(&st.controllers).remove(&name);
    log::info!("nvme {name}: detached");
    Ok(Value::Bool(true))
}

/// One controller's entry: the driver's (state, controller ID, counters) for each path, with
/// the transport ID and host as the attach gave them.
fn controller_info(a: &Attached) -> Value {
    let mut ctrlrs = Vec::new();
    let mut name = Value::Null;
    for p in &a.paths {
        let mut v = serde_json::to_value(p.ctrlr.info()).unwrap_or_else(|_| json!({}));
        name = v["name"].clone();
        let trid: Map<String, Value> =
            trid_fields(&p.address).into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        if let Some(Value::Array(paths)) = v.get_mut("ctrlrs").map(Value::take) {
            for mut path in paths {
                path["trid"] = Value::Object(trid.clone());
                if let Some(nqn) = &p.hostnqn {
                    path["host"]["nqn"] = json!(nqn);
                }
                if let Some(psk) = &p.psk {
                    // SPDK's field (its saved configuration's): the path runs TLS with this key.
                    path["psk"] = json!(psk);
                }
                ctrlrs.push(path);
            }
        }
    }
    json!({"name": name, "ctrlrs": ctrlrs})
}

/// `bdev_nvme_get_controllers`: all, or the one named.
fn get_controllers(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.optional_str("name")?;
    p.finish()?;
    let st = state(host);
    let map = lock(&st.controllers);
    let attached = map.iter().filter_map(|(n, slot)| match slot {
        Slot::Attached(a) => Some((n, a)),
        Slot::Busy => None,
    });
    match name {
        Some(name) => {
            let (_, a) =
                attached.into_iter().find(|(n, _)| **n == name).ok_or_else(|| no_controller(&name))?;
            Ok(json!([controller_info(a)]))
        }
        None => Ok(Value::Array(attached.map(|(_, a)| controller_info(a)).collect())),
    }
}

/// `bdev_nvme_reset_controller`: waits for the outcome.
fn reset_controller(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let cntlid = p.optional_uint("cntlid", u64::from(u16::MAX))?;
    p.finish()?;
    let mut paths = attached(&state(host), &name)?;
    if let Some(c) = cntlid {
        paths.retain(|ctrlr| ctrlr.info().ctrlrs.first().map(|p| u64::from(p.cntlid)) == Some(c));
        if paths.is_empty() {
            return Err(ParamError::new(
                "cntlid",
                format!("{c} is not a controller ID of NVMe controller '{name}'"),
            )
            .into());
        }
    }
    for ctrlr in paths {
        ctrlr.reset().map_err(nvme_error)?;
    }
    Ok(Value::Bool(true))
}

/// `bdev_nvme_set_keys`: the controller's DH-HMAC-CHAP keys become the keyring's `dhchap_key`
/// and `dhchap_ctrlr_key` (one left out is cleared, as SPDK's) on every path, and with a host key
/// their queues authenticate again in band; answers once every queue has.
fn set_keys(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let key = p.optional_str("dhchap_key")?;
    let ctrlr_key = p.optional_str("dhchap_ctrlr_key")?;
    p.finish()?;
    let key = dhchap_secret(host, "dhchap_key", key.as_deref())?;
    let ctrlr_key = dhchap_secret(host, "dhchap_ctrlr_key", ctrlr_key.as_deref())?;
    // Every path of a multipath controller takes the keys, one after the other.
    for ctrlr in attached(&state(host), &name)? {
        ctrlr.set_keys(key.clone(), ctrlr_key.clone()).map_err(|e| match e {
            NvmeError::Auth(why) => nvme_error(NvmeError::Auth(format!("NVMe controller '{name}': {why}"))),
            e => nvme_error(e),
        })?;
    }
    Ok(Value::Bool(true))
}

/// Detaches `ctrlr` at the daemon's shutdown, waiting for it until `deadline` at most (at least
/// [`SHUTDOWN_DETACH_FLOOR`]); without a deadline, until it ends.
fn detach_by(name: &str, ctrlr: Arc<dyn Controller>, deadline: Option<std::time::Instant>) {
    let Some(deadline) = deadline else {
        ctrlr.detach();
        log::info!("nvme {name}: detached at shutdown");
        return;
    };
    let (done, detached) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name(format!("nvme-detach-{name}")).spawn(move || {
        ctrlr.detach();
        let _ = done.send(());
    });
    if spawned.is_err() {
        log::warn!("nvme {name}: no thread for its detach at shutdown; not waited for");
        return;
    }
    let bound = deadline.saturating_duration_since(std::time::Instant::now()).max(SHUTDOWN_DETACH_FLOOR);
    match detached.recv_timeout(bound) {
        Ok(()) => log::info!("nvme {name}: detached at shutdown"),
        Err(_) => log::warn!(
            "nvme {name}: its detach still waited for the controller after {bound:?}, at the shutdown's deadline; left to end alone"
        ),
    }
}

/// The least a controller's detach is waited for at the daemon's shutdown, when the shutdown's
/// deadline has passed: a target that answers gets its clean shutdown (CC.SHN).
const SHUTDOWN_DETACH_FLOOR: std::time::Duration = std::time::Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::state::random_uuid;
    use super::*;

    #[test]
    fn host_ids_are_version_4_uuids_and_follow_a_uuid_host_nqn() {
        let id = random_uuid();
        assert_eq!((id[6] >> 4, id[8] >> 6), (4, 2));
        assert_ne!(id, random_uuid());
        let text = uuid_text(&id);
        assert_eq!(text.len(), 36);
        assert_eq!(uuid_of_nqn(&format!("nqn.2014-08.org.nvmexpress:uuid:{text}")), Some(id));
        assert_eq!(uuid_of_nqn("nqn.2014-08.org.nvmexpress:uuid:12"), None);
        assert_eq!(uuid_of_nqn("nqn.2016-06.io.spdk:host1"), None);
    }
}
