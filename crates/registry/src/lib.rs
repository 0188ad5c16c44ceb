//! The registry: the control plane's record of block devices, their claims and exports
//! (vhost-user-blk controllers).
//!
//! Everything here runs on control-plane threads (RPC, config loading) and is serialised by one
//! mutex; the data path never touches it. Bdevs are made by the bdev modules listed in
//! [`modules`], whose methods act through the registry's [`fp_bdev::ModuleHost`] (`host.rs`);
//! exports are [`Export`]s (`exports/`). Operations are named after SPDK's JSON-RPC methods that
//! call them (`bdev_malloc_create`, `vhost_create_blk_controller`, ...).

use std::any::Any;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use fp_bdev::{Bdev, BdevError, BdevInfo, ClaimType, Disk};
use fp_reactor::ReactorHandle;
use fp_rpc::ParamError;

mod disks;
mod export_dirs;
pub mod exports;
mod host;
mod limits;
pub mod modules;
mod qos;

pub use export_dirs::{ExportDirError, ExportDirs};
pub use exports::nbd::{NbdDiskInfo, NbdSpec};
pub use exports::vhost_blk::VhostBlkSpec;
pub use exports::Export;
pub use fp_bdev::qos::THROTTLE_FIELDS;
pub use limits::{total_ram, Limits, DEFAULT_MAX_BDEVS, DEFAULT_MAX_CONTROLLERS};
pub use qos::{QosGroupSummary, QosMember};

/// A stable error kind, for mapping to JSON-RPC codes and CLI exit messages.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{kind} '{name}' does not exist")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} '{name}' already exists")]
    AlreadyExists { kind: &'static str, name: String },
    #[error("bdev '{name}' is in use by '{by}'")]
    InUse { name: String, by: String },
    /// A group that still has members cannot be deleted.
    #[error("{kind} '{name}' still has members: {members} (remove them first)")]
    HasMembers { kind: &'static str, name: String, members: String },
    /// A bdev in use may grow, not shrink: its users' data beyond the new end would be lost.
    #[error("cannot shrink bdev '{name}' from {from} to {to} blocks: it is in use by '{by}' (it may only grow while in use)")]
    ShrinkInUse { name: String, by: String, from: u64, to: u64 },
    #[error("invalid parameter {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// A configured limit would be exceeded; `setting` is the configuration key that sets it.
    #[error("cannot create {kind} '{name}': {limit} {kind}s already exist, the limit set by {setting}")]
    LimitReached { kind: &'static str, name: String, limit: usize, setting: &'static str },
    /// The request is well-formed but the configuration forbids it (a path outside the export
    /// directories).
    #[error("{field}: {reason}")]
    NotAllowed { field: &'static str, reason: String },
    #[error("cannot set the mode of {}: {source}", path.display())]
    SocketMode {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(transparent)]
    Bdev(#[from] BdevError),
    #[error("{0}")]
    Vhost(#[from] fp_vhost_blk::Error),
    /// A module's failure that is none of the above (a module's own host error type).
    #[error("{0}")]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl RegistryError {
    /// The negative errno SPDK would return for the same failure, used as the JSON-RPC error
    /// code (SPDK reports e.g. -17 for an existing name, -19 for a missing device).
    pub fn errno(&self) -> i32 {
        match self {
            RegistryError::NotFound { .. } => -libc_enodev(),
            RegistryError::AlreadyExists { .. } => -17,
            RegistryError::InUse { .. }
            | RegistryError::ShrinkInUse { .. }
            | RegistryError::HasMembers { .. } => -16,
            RegistryError::Invalid { .. } => -22,
            // As the kernel does when a count limit is reached (inotify watches, epoll
            // instances): "no room for another".
            RegistryError::LimitReached { .. } => -28,
            RegistryError::NotAllowed { .. } => -13,
            RegistryError::SocketMode { source, .. } => -source.raw_os_error().unwrap_or(5),
            RegistryError::Bdev(BdevError::InvalidParam { .. }) => -22,
            RegistryError::Bdev(BdevError::Open { source, .. }) => -source.raw_os_error().unwrap_or(5),
            RegistryError::Bdev(BdevError::NoMemory(_)) => -12,
            RegistryError::Bdev(BdevError::Uring(_)) => -5,
            RegistryError::Bdev(BdevError::Unsupported(_)) => -95,
            RegistryError::Param(_) => -22,
            RegistryError::Vhost(e) => -e.errno(),
            RegistryError::Other(_) => -5,
        }
    }

    /// True when the caller's parameters were wrong (JSON-RPC "invalid params").
    pub fn is_invalid_params(&self) -> bool {
        matches!(
            self,
            RegistryError::Invalid { .. }
                | RegistryError::Param(_)
                | RegistryError::Bdev(BdevError::InvalidParam { .. })
        )
    }
}

const fn libc_enodev() -> i32 {
    19
}

/// Refuses a RAM bdev larger than [`Limits::max_malloc_bytes`]. The geometry is validated first
/// so that a size that does not even fit 64 bits gets the usual geometry error.
fn check_malloc_size(
    name: &str,
    block_size: u32,
    num_blocks: u64,
    limits: &Limits,
) -> Result<(), RegistryError> {
    fp_bdev::validate_geometry(name, block_size, num_blocks)?;
    let size = num_blocks.saturating_mul(u64::from(block_size));
    if size > limits.max_malloc_bytes {
        return Err(RegistryError::Invalid {
            field: "num_blocks",
            reason: format!(
                "{num_blocks} blocks of {block_size} bytes are {size} bytes, more than the {} allowed \
                 for a RAM bdev (limits.max_malloc_bytes, by default the machine's RAM)",
                limits.max_malloc_bytes
            ),
        });
    }
    Ok(())
}

/// A bdev as `bdev_get_bdevs` reports it.
#[derive(Debug, Clone)]
pub struct BdevSummary {
    pub info: BdevInfo,
    /// Other names it answers to (a logical volume's `lvs/lvol`).
    pub aliases: Vec<String>,
    /// Who builds on it (SPDK's `claimed`, `claim_type`): exports and stacked bdevs.
    pub claims: Vec<Claim>,
    /// `driver_specific.<driver>`, as its module reports it.
    pub driver_specific: serde_json::Map<String, serde_json::Value>,
    /// `assigned_rate_limits`.
    pub qos_limits: fp_bdev::qos::QosLimits,
    /// The QoS group it is in and its weight there.
    pub qos_group: Option<(String, u64)>,
}

impl BdevSummary {
    /// The holders' names, for messages and `claimed_by`; `None` when unclaimed.
    pub fn claimed_by(&self) -> Option<String> {
        holders(&self.claims)
    }
}

/// A claim on a bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The export or bdev holding it.
    pub holder: String,
    /// "bdev", or the export's kind ("vhost-blk"): a bdev and an export may share a name.
    pub holder_kind: &'static str,
    pub claim_type: ClaimType,
}

/// The holders of `claims`, comma-separated; `None` when there are none.
pub(crate) fn holders(claims: &[Claim]) -> Option<String> {
    (!claims.is_empty()).then(|| claims.iter().map(|c| c.holder.as_str()).collect::<Vec<_>>().join(","))
}

/// A reactor as `framework_get_reactors` reports it.
#[derive(Debug, Clone)]
pub struct ReactorSummary {
    pub id: usize,
    pub core: Option<usize>,
    pub stats: fp_reactor::ReactorStatsSnapshot,
}

struct BdevEntry {
    bdev: Bdev,
    /// The bdev with its statistics and events (`fp_bdev::disk`): what exports and stacked
    /// bdevs open channels through. Kept while the bdev exists, so statistics survive an
    /// export's delete and re-create.
    disk: Disk,
    /// The module that built it (its `driver`).
    module: &'static str,
    /// The same device, for its module's methods and `driver_specific`.
    device: Arc<dyn Any + Send + Sync>,
    claims: Vec<Claim>,
    /// The bdevs it claims, released when it is deleted.
    bases: Vec<String>,
    /// Other names it answers to (SPDK's aliases: a logical volume's `lvs/lvol`).
    aliases: Vec<String>,
}

impl BdevEntry {
    /// Refuses a `claim_type` claim that the claims held exclude.
    fn check_claim(&self, name: &str, claim_type: ClaimType) -> Result<(), RegistryError> {
        let held: Vec<ClaimType> = self.claims.iter().map(|c| c.claim_type).collect();
        match holders(&self.claims) {
            Some(by) if !claim_type.compatible_with(&held) => {
                Err(RegistryError::InUse { name: name.into(), by })
            }
            _ => Ok(()),
        }
    }
}

struct State {
    bdevs: BTreeMap<String, BdevEntry>,
    /// Alias to bdev name.
    aliases: BTreeMap<String, String>,
    exports: BTreeMap<String, Box<dyn Export>>,
    /// QoS groups by name (their members are the bdevs whose disks joined them).
    qos_groups: BTreeMap<String, Arc<fp_bdev::qos::QosGroup>>,
}

impl State {
    /// The name of the bdev called `name` (its name or one of its aliases).
    fn canonical<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        if self.bdevs.contains_key(name) {
            return Some(name);
        }
        self.aliases.get(name).map(String::as_str)
    }

    fn entry(&self, name: &str) -> Option<&BdevEntry> {
        self.canonical(name).and_then(|n| self.bdevs.get(n))
    }

    fn entry_mut(&mut self, name: &str) -> Option<&mut BdevEntry> {
        let n = self.canonical(name)?.to_string();
        self.bdevs.get_mut(&n)
    }

    /// Whether `name` is taken, as a bdev's name or an alias.
    fn name_taken(&self, name: &str) -> bool {
        self.canonical(name).is_some()
    }

    /// Releases the claim `holder` has on `bdev`.
    fn release(&mut self, bdev: &str, holder_kind: &str, holder: &str) {
        if let Some(b) = self.entry_mut(bdev) {
            b.claims.retain(|c| !(c.holder == holder && c.holder_kind == holder_kind));
        }
    }

    fn room_for_bdev(&self, name: &str, limits: &Limits) -> Result<(), RegistryError> {
        if self.bdevs.len() >= limits.max_bdevs {
            return Err(RegistryError::LimitReached {
                kind: "bdev",
                name: name.into(),
                limit: limits.max_bdevs,
                setting: "limits.max_bdevs",
            });
        }
        Ok(())
    }
}

/// How a [`Registry`] is bounded. The default is what `serve` uses without `[limits]` and
/// `[security]` tables.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    pub limits: Limits,
    /// The permission bits of each vhost-user socket, set as soon as it is bound.
    pub vhost_socket_mode: u32,
    /// When set, file-backed bdevs may only open files inside these directories.
    pub export_dirs: Option<ExportDirs>,
    /// Count I/O statistics (`bdev_get_iostat`, histograms) in the disk layer; off hands the
    /// exports the backends' channels directly.
    pub iostat: bool,
}

/// Default for [`RegistryOptions::vhost_socket_mode`]: only the daemon's user may connect.
///
/// Whoever can connect to a vhost-user socket is the disk's guest: it reads and writes the disk
/// and shares memory with the daemon. QEMU usually runs as the same user as the storage daemon;
/// a deployment that runs it as another user of a shared group widens this to 0o660.
pub const DEFAULT_VHOST_SOCKET_MODE: u32 = 0o600;

impl Default for RegistryOptions {
    fn default() -> RegistryOptions {
        RegistryOptions {
            limits: Limits::default(),
            vhost_socket_mode: DEFAULT_VHOST_SOCKET_MODE,
            export_dirs: None,
            iostat: true,
        }
    }
}

/// The registry. Cheap to share: wrap it in an `Arc`.
pub struct Registry {
    reactors: Vec<ReactorHandle>,
    vhost_dir: PathBuf,
    options: RegistryOptions,
    state: Mutex<State>,
    /// Each module's own state ([`fp_bdev::ModuleHost::module_state`]: the lvstores, ...).
    module_states: Mutex<BTreeMap<&'static str, Arc<dyn Any + Send + Sync>>>,
    /// The NBD listeners (exports/nbd.rs).
    nbd: fp_nbd::NbdServer,
}

impl Registry {
    /// A registry with the default [`RegistryOptions`].
    pub fn new(reactors: Vec<ReactorHandle>, vhost_dir: &Path) -> Arc<Registry> {
        Registry::with_options(reactors, vhost_dir, RegistryOptions::default())
    }

    pub fn with_options(
        reactors: Vec<ReactorHandle>,
        vhost_dir: &Path,
        options: RegistryOptions,
    ) -> Arc<Registry> {
        Arc::new(Registry {
            reactors,
            vhost_dir: vhost_dir.to_path_buf(),
            options,
            state: Mutex::new(State {
                bdevs: BTreeMap::new(),
                aliases: BTreeMap::new(),
                exports: BTreeMap::new(),
                qos_groups: BTreeMap::new(),
            }),
            module_states: Mutex::new(BTreeMap::new()),
            nbd: fp_nbd::NbdServer::new(),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.options.limits
    }

    pub fn vhost_dir(&self) -> &Path {
        &self.vhost_dir
    }

    pub fn reactor_handles(&self) -> &[ReactorHandle] {
        &self.reactors
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain maps behind; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes a bdev. `driver`, when given, must match (SPDK's `bdev_null_delete` does not delete
    /// a malloc bdev). Refused while it is claimed; releases the bdevs it claims.
    pub fn delete_bdev(&self, name: &str, driver: Option<&str>) -> Result<(), RegistryError> {
        let mut st = self.lock();
        let name = &st
            .canonical(name)
            .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: name.into() })?
            .to_string();
        let entry = &st.bdevs[name];
        if let Some(d) = driver {
            if entry.module != d {
                return Err(RegistryError::NotFound { kind: "bdev", name: format!("{name}' of type '{d}") });
            }
        }
        if let Some(by) = holders(&entry.claims) {
            return Err(RegistryError::InUse { name: name.into(), by });
        }
        if let Some(removed) = st.bdevs.remove(name) {
            for alias in &removed.aliases {
                st.aliases.remove(alias);
            }
            removed.disk.notify(&fp_bdev::DiskEvent::Removed);
            for base in &removed.bases {
                st.release(base, "bdev", name);
            }
        }
        log::info!("bdev '{name}' deleted");
        Ok(())
    }

    /// All bdevs, or the one named.
    pub fn bdevs(&self, name: Option<&str>) -> Result<Vec<BdevSummary>, RegistryError> {
        let st = self.lock();
        let summary = |e: &BdevEntry| {
            let info = e.bdev.info().clone();
            let driver_specific = match modules::find(e.module) {
                Some(m) => m.driver_specific(&info, e.device.as_ref()),
                None => serde_json::Map::new(),
            };
            BdevSummary {
                info,
                aliases: e.aliases.clone(),
                claims: e.claims.clone(),
                driver_specific,
                qos_limits: e.disk.qos_limits(),
                qos_group: e.disk.qos_group().map(|(g, weight, _)| (g.name().to_string(), weight)),
            }
        };
        match name {
            Some(n) => st
                .entry(n)
                .map(|e| vec![summary(e)])
                .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: n.into() }),
            None => Ok(st.bdevs.values().map(summary).collect()),
        }
    }

    pub fn reactors(&self) -> Vec<ReactorSummary> {
        self.reactors
            .iter()
            .map(|h| ReactorSummary { id: h.id(), core: h.core(), stats: h.stats().snapshot() })
            .collect()
    }

    /// Stops every export, then lets every module close what it holds open (an lvstore's
    /// metadata owner commits and stops). Bdevs are dropped with the registry.
    pub fn shutdown(&self) {
        let names: Vec<String> = self.lock().exports.keys().cloned().collect();
        for n in names {
            let _ = self.delete_export(&n, None);
        }
        for m in modules::MODULES {
            m.shutdown(self);
        }
    }
}

#[cfg(test)]
mod tests;
