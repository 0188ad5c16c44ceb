//! NVMe over TCP (`nvmf_*` methods with SPDK's names, in `rpc.rs`): the daemon's one
//! [`fp_nvmf::NvmfTarget`] holds the transport, the subsystems, their listeners and allowed
//! hosts; the registry holds the namespaces, because each one claims its bdev. A namespace is
//! an [`Export`] of kind `"nvmf"` named `<nqn>/<nsid>` (what `bdev_get_bdevs` shows as the
//! bdev's holder). docs/nvmf.md.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fp_bdev::ClaimType;
use fp_nvmf::{NamespaceSpec, NvmfError, NvmfTarget};

use super::{ConfigTable, Export, ExportKind, KindInit, KindOption, NewExport, OptionType};
use crate::methods::MethodFn;
use crate::metrics::{array, str_at, u64_at, Family, MetricsCall};
use crate::{Registry, RegistryError};

mod rpc;
mod spec;
#[cfg(test)]
mod tests;

pub use spec::NvmfNamespaceSpec;
pub(crate) use spec::{parse_hex, parse_uuid};

/// The kind ([`ExportKind::name`]) of an NVMe-oF namespace.
pub const KIND: &str = "nvmf";

/// What errors call one.
const LABEL: &str = "NVMe-oF namespace";

/// The registry's name of namespace `nsid` of subsystem `nqn`.
pub fn namespace_name(nqn: &str, nsid: u32) -> String {
    format!("{nqn}/{nsid}")
}

impl From<NvmfError> for RegistryError {
    fn from(e: NvmfError) -> RegistryError {
        match e {
            NvmfError::NotFound { what, name } => RegistryError::NotFound { kind: what, name },
            NvmfError::AlreadyExists { what, name } => RegistryError::AlreadyExists { kind: what, name },
            NvmfError::Invalid { field, reason } => RegistryError::Invalid { field, reason },
            e @ NvmfError::Draining { .. } => RegistryError::NotNow(e.to_string()),
        }
    }
}

/// The claim a namespace takes.
fn claim_type(read_only: bool) -> ClaimType {
    if read_only {
        ClaimType::ReadManyWriteNone
    } else {
        ClaimType::ExclusiveWrite
    }
}

struct NvmfNamespace {
    target: NvmfTarget,
    /// [`namespace_name`].
    name: String,
    nqn: String,
    nsid: u32,
    bdev_name: String,
    /// Taken out of its subsystem by a removal whose drain ran out of time: the export (and
    /// its claim on the bdev) stays until a later removal sees its commands finished.
    detached: Arc<AtomicBool>,
}

impl Export for NvmfNamespace {
    /// The namespace's size is read from the bdev's shared capacity; the target sends the
    /// subsystem's hosts a Namespace Attribute Changed event so they read Identify Namespace
    /// again (Linux then updates the disk's size).
    fn resized(&self, size_bytes: u64) {
        log::info!("nvmf namespace '{}': size now {size_bytes} bytes, hosts notified", self.name);
        self.target.namespace_resized(&self.nqn, self.nsid);
    }

    /// Detaches the namespace (hosts get the event) once its in-flight I/O is answered (the
    /// removal methods drained it already; this is the daemon's shutdown).
    fn stop(self: Box<Self>) {
        if self.detached.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = self.target.remove_namespace(&self.nqn, self.nsid) {
            // Its subsystem went first (daemon shutdown stops the target before the exports).
            log::debug!("nvmf namespace '{}': {e}", self.name);
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Registry {
    /// The daemon's NVMe-oF target (the kind's state, [`NvmfKind`]).
    pub fn nvmf(&self) -> &NvmfTarget {
        self.kind_state(KIND)
    }

    /// Adds a namespace backed by a bdev to a subsystem, claiming the bdev; returns its nsid.
    pub fn nvmf_add_namespace(&self, spec: NvmfNamespaceSpec) -> Result<u32, RegistryError> {
        let nsid = match spec.nsid {
            Some(n) => n,
            None => self.nvmf().free_nsid(&spec.nqn)?,
        };
        let name = namespace_name(&spec.nqn, nsid);
        let new = NewExport {
            name: &name,
            kind: KIND,
            label: LABEL,
            bdev_name: &spec.bdev_name,
            claim_type: claim_type(spec.read_only),
            migrate_from: None,
        };
        self.add_export(new, |bdev| {
            let uuid = spec.uuid.unwrap_or_else(|| bdev_uuid_bytes(&bdev.info().name));
            let ns = NamespaceSpec {
                nsid,
                bdev,
                bdev_name: spec.bdev_name.clone(),
                uuid: Some(uuid),
                nguid: spec.nguid,
                eui64: spec.eui64,
                read_only: spec.read_only,
                anagrpid: spec.anagrpid,
            };
            let nsid = self.nvmf().add_namespace(&spec.nqn, ns)?;
            Ok(Box::new(NvmfNamespace {
                target: self.nvmf().clone(),
                name: namespace_name(&spec.nqn, nsid),
                nqn: spec.nqn.clone(),
                nsid,
                bdev_name: spec.bdev_name.clone(),
                detached: Arc::default(),
            }))
        })?;
        Ok(nsid)
    }

    /// Removes a namespace: it leaves its subsystem (its hosts are told), its commands in
    /// flight are waited for, then the bdev is released. When they do not finish within the
    /// target's drain timeout the namespace stays detached, its export keeps the bdev claimed
    /// and the error says how many commands are left; calling again waits for them again.
    pub fn nvmf_remove_namespace(&self, nqn: &str, nsid: u32) -> Result<(), RegistryError> {
        // An unknown subsystem is reported as such rather than as a missing namespace.
        self.nvmf().controllers(nqn)?;
        let name = namespace_name(nqn, nsid);
        let (target, bdev, detached) = self.with_export(&name, LABEL, |ns: &NvmfNamespace| {
            (ns.target.clone(), ns.bdev_name.clone(), ns.detached.clone())
        })?;
        if detached.swap(true, Ordering::AcqRel) {
            target.drain_namespace(nqn, nsid, &bdev)?;
        } else {
            target.remove_namespace(nqn, nsid)?;
        }
        self.delete_export(&name, Some((KIND, LABEL)))
    }

    /// Deletes a subsystem: its namespaces first (each as [`Registry::nvmf_remove_namespace`]:
    /// a namespace whose commands do not drain in time fails the call and leaves the subsystem
    /// in place), then the subsystem with its listeners, disconnecting its hosts.
    pub fn nvmf_delete_subsystem(&self, nqn: &str) -> Result<(), RegistryError> {
        self.nvmf().controllers(nqn)?;
        let nsids = self.map_exports(|ns: &NvmfNamespace| (ns.nqn == nqn).then_some(ns.nsid));
        for nsid in nsids.into_iter().flatten() {
            self.nvmf_remove_namespace(nqn, nsid)?;
        }
        Ok(self.nvmf().delete_subsystem(nqn)?)
    }
}

/// The UUID `bdev_get_bdevs` reports for the bdev `name`, as bytes.
fn bdev_uuid_bytes(name: &str) -> [u8; 16] {
    // A bdev named by a UUID (a logical volume) is that UUID.
    parse_uuid(name)
        .or_else(|| parse_uuid(&crate::methods::bdev_uuid(name)))
        .expect("bdev_uuid makes well-formed UUIDs")
}

/// The NVMe-oF export kind ([`super::EXPORT_KINDS`]).
pub struct NvmfKind;

/// Its configuration tables, applied in this order: the target's DH-HMAC-CHAP settings and
/// the transport before the subsystems, a subsystem before its listeners, hosts and
/// namespaces.
const CONFIG_TABLES: &[ConfigTable] = &[
    ConfigTable::single("nvmf_config", "nvmf_set_config"),
    ConfigTable::array("nvmf_transport", "nvmf_create_transport"),
    ConfigTable::array("nvmf_subsystem", "nvmf_create_subsystem"),
    ConfigTable::array("nvmf_listener", "nvmf_subsystem_add_listener"),
    ConfigTable::array("nvmf_host", "nvmf_subsystem_add_host"),
    ConfigTable::array("nvmf_ns", "nvmf_subsystem_add_ns"),
];

/// Its options: the target's bounds (flashpath's own; SPDK has none), and whether listeners
/// may leave loopback, a key of the daemon's `[security]` table since exposing disks to the
/// network is the operator's deliberate setting (no flag).
const OPTIONS: &[KindOption] = &[
    KindOption {
        table: "nvmf",
        key: "drain_timeout_ms",
        flag: Some("nvmf-drain-timeout-ms"),
        value: OptionType::Millis {
            default: fp_nvmf::DRAIN_TIMEOUT.as_millis() as u64,
            min: 1,
            max: super::vhost_blk::MAX_STOP_TIMEOUT_MS,
        },
        help: "How long nvmf_subsystem_remove_ns waits for the namespace's commands on the device before \
               answering EBUSY, 1 to 600000 (replaces the config file's nvmf.drain_timeout_ms)",
    },
    KindOption {
        table: "nvmf",
        key: "close_timeout_ms",
        flag: Some("nvmf-close-timeout-ms"),
        value: OptionType::Millis {
            default: fp_nvmf::CLOSE_TIMEOUT.as_millis() as u64,
            min: 1,
            max: super::vhost_blk::MAX_STOP_TIMEOUT_MS,
        },
        help: "How long a closing NVMe/TCP queue pair retries commands its disk refuses as busy before \
               answering them aborted, 1 to 600000 (replaces nvmf.close_timeout_ms)",
    },
    KindOption {
        table: "nvmf",
        key: "io_uring",
        flag: Some("nvmf-io-uring"),
        value: OptionType::Bool { default: false },
        help: "NVMe/TCP queue pairs, the target's and the host's I/O queues, on the io_uring socket \
               engine (sock_set_default_impl uring), else posix; a listener's sock_impl wins (docs/nvmf.md)",
    },
    KindOption {
        table: "security",
        key: "nvmf_allow_remote",
        flag: None,
        value: OptionType::Bool { default: false },
        help: "NVMe/TCP listeners may bind addresses other than loopback (docs/nvmf.md)",
    },
];

impl ExportKind for NvmfKind {
    fn name(&self) -> &'static str {
        KIND
    }

    /// The target: its transport, subsystems and listeners, with the daemon's bounds and
    /// whether listeners may leave loopback.
    fn init(&self, init: &KindInit<'_>) -> Option<Arc<dyn Any + Send + Sync>> {
        let options = &init.options;
        let target = NvmfTarget::new(
            init.reactors.to_vec(),
            fp_nvmf::TargetOptions { allow_remote_listeners: options.flag("nvmf_allow_remote") },
        );
        target.set_drain_timeout(options.millis("drain_timeout_ms"));
        target.set_close_timeout(options.millis("close_timeout_ms"));
        if options.flag("io_uring") {
            target.set_sock_impl(fp_nvmf::SocketImpl::Uring);
            fp_conn::uring::set_default_impl(fp_nvmf::SocketImpl::Uring);
        }
        Some(Arc::new(target))
    }

    fn options(&self) -> &'static [KindOption] {
        OPTIONS
    }

    /// Its listeners close and its hosts are disconnected, so that no new connection races
    /// the namespaces' removal.
    fn shutdown(&self, registry: &Registry) {
        registry.nvmf().stop();
    }

    /// Each namespace's stop drains it, up to the target's drain timeout.
    fn stop_bound(&self, registry: &Registry) -> Option<std::time::Duration> {
        Some(registry.nvmf().drain_timeout())
    }

    fn methods(&self) -> &'static [(&'static str, MethodFn)] {
        rpc::METHODS
    }

    fn config_tables(&self) -> &'static [ConfigTable] {
        CONFIG_TABLES
    }

    /// From `nvmf_get_stats`: each namespace's commands, bytes and errors, and each
    /// subsystem's connected controllers and queue pairs.
    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family> {
        let Some(stats) = call("nvmf_get_stats", None) else { return Vec::new() };
        let mut requests = Family::counter(
            "flashpath_nvmf_requests_total",
            "Commands an NVMe-oF namespace answered, by operation",
        );
        let mut bytes =
            Family::counter("flashpath_nvmf_bytes_total", "Bytes an NVMe-oF namespace moved, by direction");
        let mut errors = Family::counter(
            "flashpath_nvmf_errors_total",
            "Commands an NVMe-oF namespace answered with an error status",
        );
        let mut controllers =
            Family::gauge("flashpath_nvmf_controllers", "Controllers connected to an NVMe-oF subsystem now");
        let mut qpairs = Family::gauge(
            "flashpath_nvmf_qpairs",
            "Queue pairs (admin and I/O) connected to an NVMe-oF subsystem now",
        );
        for s in array(&stats["subsystems"]) {
            let nqn = str_at(s, "nqn");
            controllers.push(vec![("nqn", nqn.clone())], u64_at(s, "controllers"));
            qpairs.push(vec![("nqn", nqn.clone())], u64_at(s, "qpairs"));
            for ns in array(&s["namespaces"]) {
                let base = vec![("nqn", nqn.clone()), ("nsid", u64_at(ns, "nsid").to_string())];
                let with = |k: &'static str, v: &str| {
                    let mut l = base.clone();
                    l.push((k, v.to_string()));
                    l
                };
                for (op, key) in [("read", "read_ops"), ("write", "write_ops"), ("other", "other_ops")] {
                    requests.push(with("op", op), u64_at(ns, key));
                }
                bytes.push(with("direction", "read"), u64_at(ns, "bytes_read"));
                bytes.push(with("direction", "write"), u64_at(ns, "bytes_written"));
                errors.push(base, u64_at(ns, "errors"));
            }
        }
        vec![requests, bytes, errors, controllers, qpairs]
    }
}
