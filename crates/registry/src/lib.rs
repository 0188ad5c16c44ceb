//! The registry: the control plane's record of block devices and exports (vhost-user-blk controllers).
//!
//! Everything here runs on control-plane threads (RPC, config loading) and is serialised by one
//! mutex; the data path never touches it. Operations are named after SPDK's JSON-RPC methods that
//! call them (`bdev_malloc_create`, `vhost_create_blk_controller`, ...).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use fp_bdev::{
    Bdev, BdevError, BdevInfo, DelayDevice, DelayLatency, Disk, NullDevice, RamDevice, UringDevice,
};
use fp_reactor::ReactorHandle;
use fp_vhost_blk::{BlkController, ControllerConfig, ControllerInfo};

mod disks;
mod export;
mod limits;

pub use export::{ExportDirError, ExportDirs};
pub use limits::{total_ram, Limits, DEFAULT_MAX_BDEVS, DEFAULT_MAX_CONTROLLERS};

/// A stable error kind, for mapping to JSON-RPC codes and CLI exit messages.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{kind} '{name}' does not exist")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} '{name}' already exists")]
    AlreadyExists { kind: &'static str, name: String },
    #[error("bdev '{name}' is in use by '{by}'")]
    InUse { name: String, by: String },
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
    Bdev(#[from] BdevError),
    #[error("{0}")]
    Vhost(#[from] fp_vhost_blk::Error),
}

impl RegistryError {
    /// The negative errno SPDK would return for the same failure, used as the JSON-RPC error
    /// code (SPDK reports e.g. -17 for an existing name, -19 for a missing device).
    pub fn errno(&self) -> i32 {
        match self {
            RegistryError::NotFound { .. } => -libc_enodev(),
            RegistryError::AlreadyExists { .. } => -17,
            RegistryError::InUse { .. } => -16,
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
            RegistryError::Vhost(e) => -e.errno(),
        }
    }

    /// True when the caller's parameters were wrong (JSON-RPC "invalid params").
    pub fn is_invalid_params(&self) -> bool {
        matches!(self, RegistryError::Invalid { .. } | RegistryError::Bdev(BdevError::InvalidParam { .. }))
    }
}

const fn libc_enodev() -> i32 {
    19
}

/// A uring bdev on `filename`, which must lead inside `exports` (see the `export` module).
fn open_exported(
    exports: &ExportDirs,
    name: &str,
    filename: &Path,
    block_size: Option<u32>,
    direct: bool,
) -> Result<UringDevice, RegistryError> {
    let beneath = exports.locate(filename).map_err(|refusal| match refusal {
        export::Refusal::Outside => RegistryError::NotAllowed {
            field: "filename",
            reason: format!("'{}' is outside the allowed export directories", filename.display()),
        },
        export::Refusal::Unresolved(source) => {
            RegistryError::Bdev(BdevError::Open { path: filename.display().to_string(), source })
        }
    })?;
    // The device opens the file twice (buffered and O_DIRECT); both opens must reach the same
    // file, or a swap inside the export directory between them would split the disk in two.
    let first = std::cell::Cell::new(None);
    let open = |direct: bool| {
        let file = beneath.open(direct)?;
        let id = export::file_id(&file)?;
        match first.get() {
            None => first.set(Some(id)),
            Some(seen) if seen != id => {
                return Err(std::io::Error::other("it was replaced by another file while being opened"))
            }
            Some(_) => {}
        }
        Ok(file)
    };
    Ok(UringDevice::open_with(name, filename, block_size, direct, open)?)
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

/// What to build for `bdev_*_create`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BdevSpec {
    /// `bdev_null_create`.
    Null { name: String, num_blocks: u64, block_size: u32 },
    /// `bdev_malloc_create` (a RAM disk).
    Malloc { name: String, num_blocks: u64, block_size: u32 },
    /// `bdev_uring_create`: a file or block device. `block_size` defaults to the device's logical
    /// block size (512 for a regular file). `direct` (O_DIRECT) defaults to true.
    Uring { name: String, filename: PathBuf, block_size: Option<u32>, direct: bool },
    /// `bdev_delay_create`: holds each request of `base` for a latency. Claims `base`.
    Delay { name: String, base: String, latency: DelayLatency },
}

impl BdevSpec {
    pub fn name(&self) -> &str {
        match self {
            BdevSpec::Null { name, .. }
            | BdevSpec::Malloc { name, .. }
            | BdevSpec::Uring { name, .. }
            | BdevSpec::Delay { name, .. } => name,
        }
    }

    pub fn driver(&self) -> &'static str {
        match self {
            BdevSpec::Null { .. } => "null",
            BdevSpec::Malloc { .. } => "malloc",
            BdevSpec::Uring { .. } => "uring",
            BdevSpec::Delay { .. } => "delay",
        }
    }
}

/// A bdev as `bdev_get_bdevs` reports it.
#[derive(Debug, Clone)]
pub struct BdevSummary {
    pub info: BdevInfo,
    /// The controller exporting it, if any (SPDK's `claimed`).
    pub claimed_by: Option<String>,
}

/// What to build for `vhost_create_blk_controller`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostBlkSpec {
    /// Controller name; the socket is `<vhost_dir>/<ctrlr>`.
    pub ctrlr: String,
    /// The bdev to export.
    pub dev_name: String,
    /// Reactor cores its queues may run on (SPDK's cpumask); `None` means all reactors.
    pub cpus: Option<Vec<usize>>,
    pub readonly: bool,
    /// The most queues a frontend may start (GET_QUEUE_NUM, the config space's `num_queues`);
    /// `None` means [`fp_vhost_blk::MAX_QUEUES`], whatever the number of reactors in the mask.
    pub num_queues: Option<u16>,
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
    /// The bdev with its statistics and events; kept while the bdev exists, so statistics
    /// survive a controller's delete and re-create.
    disk: Disk,
    claimed_by: Option<String>,
    /// The same device, typed, when it is a delay bdev (its latencies can be changed).
    delay: Option<Arc<DelayDevice>>,
}

struct State {
    bdevs: BTreeMap<String, BdevEntry>,
    controllers: BTreeMap<String, BlkController>,
}

impl State {
    /// Refuses a new bdev when the registry already holds the most it may.
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
    /// frontends the backends' channels directly.
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
            state: Mutex::new(State { bdevs: BTreeMap::new(), controllers: BTreeMap::new() }),
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

    /// Creates a bdev; returns its name.
    pub fn create_bdev(&self, spec: BdevSpec) -> Result<String, RegistryError> {
        let name = spec.name().to_string();
        let limits = &self.options.limits;
        {
            let st = self.lock();
            if st.bdevs.contains_key(&name) {
                return Err(RegistryError::AlreadyExists { kind: "bdev", name });
            }
            // Checked again on insertion; refusing here spares building a bdev for nothing.
            st.room_for_bdev(&name, limits)?;
        }
        // Build outside the lock: a RAM disk allocation or a file open may take a while.
        let bdev: Bdev = match &spec {
            BdevSpec::Null { name, num_blocks, block_size } => {
                Arc::new(NullDevice::new(name, *block_size, *num_blocks)?)
            }
            BdevSpec::Malloc { name, num_blocks, block_size } => {
                check_malloc_size(name, *block_size, *num_blocks, limits)?;
                Arc::new(RamDevice::new(name, *block_size, *num_blocks)?)
            }
            BdevSpec::Uring { name, filename, block_size, direct } => match &self.options.export_dirs {
                None => Arc::new(UringDevice::new(name, filename, *block_size, *direct)?),
                Some(exports) => Arc::new(open_exported(exports, name, filename, *block_size, *direct)?),
            },
            BdevSpec::Delay { name: delay_name, base, latency } => {
                let mut st = self.lock();
                if st.bdevs.contains_key(&name) {
                    return Err(RegistryError::AlreadyExists { kind: "bdev", name });
                }
                st.room_for_bdev(&name, limits)?;
                let entry = st
                    .bdevs
                    .get_mut(base)
                    .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: base.clone() })?;
                if let Some(by) = &entry.claimed_by {
                    return Err(RegistryError::InUse { name: base.clone(), by: by.clone() });
                }
                // Through the base's disk, so the base's statistics count the delay's traffic.
                let dev = Arc::new(DelayDevice::new(delay_name, Arc::new(entry.disk.clone()), *latency)?);
                entry.claimed_by = Some(delay_name.clone());
                log::info!("bdev '{name}' created (delay over '{base}')");
                let disk = Disk::new(dev.clone(), self.options.iostat);
                st.bdevs.insert(
                    name.clone(),
                    BdevEntry { bdev: dev.clone(), disk, claimed_by: None, delay: Some(dev) },
                );
                return Ok(name);
            }
        };
        let mut st = self.lock();
        if st.bdevs.contains_key(&name) {
            return Err(RegistryError::AlreadyExists { kind: "bdev", name });
        }
        st.room_for_bdev(&name, limits)?;
        log::info!("bdev '{name}' created ({}, {} bytes)", spec.driver(), bdev.info().size_bytes());
        let disk = Disk::new(bdev.clone(), self.options.iostat);
        st.bdevs.insert(name.clone(), BdevEntry { bdev, disk, claimed_by: None, delay: None });
        Ok(name)
    }

    /// `bdev_delay_update_latency`: one latency of a delay bdev, for requests from now on.
    pub fn update_delay_latency(
        &self,
        name: &str,
        kind: fp_bdev::LatencyKind,
        value: std::time::Duration,
    ) -> Result<(), RegistryError> {
        let st = self.lock();
        let dev = st
            .bdevs
            .get(name)
            .and_then(|e| e.delay.as_ref())
            .ok_or_else(|| RegistryError::NotFound { kind: "delay bdev", name: name.into() })?;
        dev.set_latency(kind, value)?;
        log::info!("bdev '{name}': {} latency now {} us", kind.name(), value.as_micros());
        Ok(())
    }

    /// Deletes a bdev. `driver`, when given, must match (SPDK's `bdev_null_delete` does not delete
    /// a malloc bdev).
    pub fn delete_bdev(&self, name: &str, driver: Option<&str>) -> Result<(), RegistryError> {
        let mut st = self.lock();
        let entry =
            st.bdevs.get(name).ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: name.into() })?;
        if let Some(d) = driver {
            if entry.bdev.info().driver != d {
                return Err(RegistryError::NotFound { kind: "bdev", name: format!("{name}' of type '{d}") });
            }
        }
        if let Some(by) = &entry.claimed_by {
            return Err(RegistryError::InUse { name: name.into(), by: by.clone() });
        }
        if let Some(removed) = st.bdevs.remove(name) {
            removed.disk.notify(&fp_bdev::DiskEvent::Removed);
            // A stacked bdev releases the one below it.
            if let Some((key, base)) = &removed.bdev.info().driver_specific {
                if key == "base_bdev_name" {
                    if let Some(b) = st.bdevs.get_mut(base) {
                        b.claimed_by = None;
                    }
                }
            }
        }
        log::info!("bdev '{name}' deleted");
        Ok(())
    }

    /// All bdevs, or the one named.
    pub fn bdevs(&self, name: Option<&str>) -> Result<Vec<BdevSummary>, RegistryError> {
        let st = self.lock();
        let summary =
            |e: &BdevEntry| BdevSummary { info: e.bdev.info().clone(), claimed_by: e.claimed_by.clone() };
        match name {
            Some(n) => st
                .bdevs
                .get(n)
                .map(|e| vec![summary(e)])
                .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: n.into() }),
            None => Ok(st.bdevs.values().map(summary).collect()),
        }
    }

    /// Creates a vhost-user-blk controller: a listening socket in the vhost directory.
    pub fn create_vhost_blk(&self, spec: VhostBlkSpec) -> Result<(), RegistryError> {
        fp_vhost_blk::validate_name(&spec.ctrlr)
            .map_err(|reason| RegistryError::Invalid { field: "ctrlr", reason })?;
        let reactors: Vec<ReactorHandle> = match &spec.cpus {
            None => self.reactors.clone(),
            Some(cpus) => {
                let picked: Vec<ReactorHandle> = self
                    .reactors
                    .iter()
                    .filter(|h| h.core().is_some_and(|c| cpus.contains(&c)))
                    .cloned()
                    .collect();
                if picked.is_empty() {
                    let have: Vec<String> =
                        self.reactors.iter().filter_map(|h| h.core()).map(|c| c.to_string()).collect();
                    return Err(RegistryError::Invalid {
                        field: "cpumask",
                        reason: format!("selects no reactor core; reactors run on cores {}", have.join(",")),
                    });
                }
                picked
            }
        };
        // By default the controller offers every queue a frontend may ask for: QEMU asks for one
        // per vCPU unless its device line says otherwise, and refuses to start when offered
        // fewer. Queue i runs on reactor i % n, so any count is spread over the mask; a queue
        // the frontend never starts costs a few hundred bytes (docs/architecture.md, "Queues").
        let num_queues = spec.num_queues.unwrap_or(fp_vhost_blk::MAX_QUEUES);
        if num_queues == 0 || num_queues > fp_vhost_blk::MAX_QUEUES {
            return Err(RegistryError::Invalid {
                field: "num_queues",
                reason: format!("{num_queues} is not between 1 and {}", fp_vhost_blk::MAX_QUEUES),
            });
        }
        let mut st = self.lock();
        if st.controllers.contains_key(&spec.ctrlr) {
            return Err(RegistryError::AlreadyExists { kind: "controller", name: spec.ctrlr });
        }
        let max = self.options.limits.max_controllers;
        if st.controllers.len() >= max {
            return Err(RegistryError::LimitReached {
                kind: "controller",
                name: spec.ctrlr,
                limit: max,
                setting: "limits.max_controllers",
            });
        }
        let entry = st
            .bdevs
            .get_mut(&spec.dev_name)
            .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: spec.dev_name.clone() })?;
        if let Some(by) = &entry.claimed_by {
            return Err(RegistryError::InUse { name: spec.dev_name.clone(), by: by.clone() });
        }
        let config = ControllerConfig {
            name: spec.ctrlr.clone(),
            socket_path: self.vhost_dir.join(&spec.ctrlr),
            disk: entry.disk.clone(),
            reactors,
            read_only: spec.readonly,
            num_queues,
        };
        let socket_path = config.socket_path.clone();
        let ctrl = BlkController::start(config)?;
        // The socket is bound with the umask's mode (`serve` sets 077, so nobody else can reach
        // it meanwhile); now it gets the configured one.
        let mode = std::fs::Permissions::from_mode(self.options.vhost_socket_mode);
        if let Err(source) = std::fs::set_permissions(&socket_path, mode) {
            ctrl.stop();
            return Err(RegistryError::SocketMode { path: socket_path, source });
        }
        entry.claimed_by = Some(spec.ctrlr.clone());
        log::info!("vhost-blk controller '{}' serving bdev '{}'", spec.ctrlr, spec.dev_name);
        st.controllers.insert(spec.ctrlr, ctrl);
        Ok(())
    }

    /// Stops a controller: disconnects its client, removes its socket, releases its bdev.
    pub fn delete_vhost(&self, ctrlr: &str) -> Result<(), RegistryError> {
        let ctrl = {
            let mut st = self.lock();
            let ctrl = st
                .controllers
                .remove(ctrlr)
                .ok_or_else(|| RegistryError::NotFound { kind: "controller", name: ctrlr.into() })?;
            let bdev_name = ctrl.info().bdev_name.clone();
            if let Some(e) = st.bdevs.get_mut(&bdev_name) {
                e.claimed_by = None;
            }
            ctrl
        };
        // Stopping waits for the queues to drain: do it without holding the registry lock.
        ctrl.stop();
        log::info!("vhost-blk controller '{ctrlr}' deleted");
        Ok(())
    }

    /// All controllers, or the one named.
    /// `vhost_controller_set_coalescing`: guest notification coalescing for one controller's
    /// queues, running ones included (fp_vhost_blk::coalesce). `delay_base_us` 0 turns it off.
    pub fn set_coalescing(
        &self,
        ctrlr: &str,
        delay_base_us: u32,
        iops_threshold: u32,
    ) -> Result<(), RegistryError> {
        let max = fp_vhost_blk::coalesce::MAX_DELAY_BASE_US;
        if delay_base_us > max {
            return Err(RegistryError::Invalid {
                field: "delay_base_us",
                reason: format!("{delay_base_us} is above the limit of {max} us"),
            });
        }
        let st = self.lock();
        let c = st
            .controllers
            .get(ctrlr)
            .ok_or_else(|| RegistryError::NotFound { kind: "controller", name: ctrlr.into() })?;
        c.set_coalescing(delay_base_us, iops_threshold);
        log::info!(
            "vhost-blk controller '{ctrlr}': coalescing delay {delay_base_us} us above {iops_threshold} IOPS"
        );
        Ok(())
    }

    pub fn controllers(&self, name: Option<&str>) -> Result<Vec<ControllerInfo>, RegistryError> {
        let st = self.lock();
        match name {
            Some(n) => st
                .controllers
                .get(n)
                .map(|c| vec![c.info()])
                .ok_or_else(|| RegistryError::NotFound { kind: "controller", name: n.into() }),
            None => Ok(st.controllers.values().map(|c| c.info()).collect()),
        }
    }

    pub fn reactors(&self) -> Vec<ReactorSummary> {
        self.reactors
            .iter()
            .map(|h| ReactorSummary { id: h.id(), core: h.core(), stats: h.stats().snapshot() })
            .collect()
    }

    /// Stops every controller (on shutdown). Bdevs are dropped with the registry.
    pub fn shutdown(&self) {
        let names: Vec<String> = self.lock().controllers.keys().cloned().collect();
        for n in names {
            let _ = self.delete_vhost(&n);
        }
    }
}

#[cfg(test)]
mod tests;
