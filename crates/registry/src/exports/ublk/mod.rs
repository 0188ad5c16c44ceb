//! ublk exports (`ublk_start_disk` and friends, in `rpc.rs`): a bdev as a kernel block device,
//! /dev/ublkbN, through Linux's ublk driver (crates/ublk). The target (`ublk_create_target`)
//! opens the control device and picks the reactors the queues run on; the registry knows a
//! disk by its block device's path, `/dev/ublkbN`, and the RPCs by its `ublk_id`, N.

use std::any::Any;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fp_bdev::ClaimType;
use fp_reactor::ReactorHandle;
use fp_ublk::{DiskInfo, StartSpec, Target, TargetError, UblkDisk};

use super::{ConfigTable, Export, ExportKind, KindInit, KindOption, NewExport, OptionType};
use crate::methods::MethodFn;
use crate::metrics::{array, str_at, u64_at, Family, MetricsCall};
use crate::{Registry, RegistryError};

mod rpc;
mod spec;
#[cfg(test)]
mod tests;

pub use spec::UblkStartSpec;

/// The kind ([`ExportKind::name`]) of a ublk export.
pub const KIND: &str = "ublk";

/// What errors call one.
const LABEL: &str = "ublk disk";

/// The default bound of a disk's stop: the kernel answers the requests in flight first.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// What `ublk_get_disks` reports of the target beside its disks.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UblkTargetInfo {
    pub cpumask: String,
    pub command_encoding: fp_ublk::uapi::Encoding,
    /// The features GET_FEATURES offered; `None` on a kernel without it (before 6.5).
    pub kernel_features: Option<Vec<String>>,
}

/// The kind's state: the target once created, and the daemon's bound for stops.
pub struct UblkState {
    target: Mutex<Option<(Arc<Target>, UblkTargetInfo)>>,
    stop_timeout: Duration,
    /// All the daemon's reactors: a target without a cpumask uses them all.
    reactors: Vec<ReactorHandle>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct UblkExport {
    disk: Arc<UblkDisk>,
    target: Arc<Target>,
    stop_timeout: Duration,
    /// Stopped by `ublk_stop_disk` already: the registry's stop has nothing left to do.
    stopped: Arc<AtomicBool>,
}

impl Export for UblkExport {
    /// Pushed to the device where the kernel has UPDATE_SIZE (Linux 6.16); otherwise the
    /// device keeps its size until it is stopped and started again (docs/ublk.md).
    fn resized(&self, size_bytes: u64) {
        match self.target.resize(&self.disk, size_bytes) {
            Ok(true) => log::info!("ublk device {}: size now {size_bytes} bytes", self.disk.id),
            Ok(false) => log::warn!(
                "ublk device {}: bdev '{}' now has {size_bytes} bytes, but the kernel has no \
                 UPDATE_SIZE (Linux 6.16): the device keeps its size until it is stopped and started",
                self.disk.id,
                self.disk.bdev_name
            ),
            Err(e) => log::warn!("ublk device {}: pushing the new size: {e}", self.disk.id),
        }
    }

    fn stop(self: Box<Self>) {
        let bound = self.stop_timeout;
        self.stop_at_shutdown(bound);
    }

    fn stop_at_shutdown(self: Box<Self>, bound: Duration) {
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = self.target.stop_disk(&self.disk, bound) {
            log::warn!("ublk device {} (bdev '{}'): {e}", self.disk.id, self.disk.bdev_name);
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A target error as the registry reports it (SPDK's errnos where it has one).
fn registry_error(e: TargetError) -> RegistryError {
    // The JSON-RPC code is the negative errno, as SPDK's.
    let module = |errno: i32, e: TargetError| RegistryError::Module { errno: -errno, source: Box::new(e) };
    match e {
        TargetError::Invalid { field, reason } => RegistryError::Invalid { field, reason },
        TargetError::InUse(_) => module(libc::EEXIST, e),
        TargetError::MissingFeature { .. } => module(libc::EOPNOTSUPP, e),
        TargetError::Control(ref c) => match c {
            fp_ublk::CtrlError::NoDevice { .. } => module(libc::ENODEV, e),
            fp_ublk::CtrlError::Kernel { errno, .. } => module(*errno, e),
            fp_ublk::CtrlError::TimedOut { .. } => module(libc::ETIMEDOUT, e),
            fp_ublk::CtrlError::Ring(_) => module(libc::EIO, e),
        },
        TargetError::Setup(_) => module(libc::EIO, e),
    }
}

/// The export's name for device `id`.
fn export_name(id: u32) -> String {
    format!("/dev/ublkb{id}")
}

impl Registry {
    fn ublk_state(&self) -> &UblkState {
        self.kind_state(KIND)
    }

    /// The target, or the error every disk method gives without one.
    fn ublk_target(&self) -> Result<Arc<Target>, RegistryError> {
        lock(&self.ublk_state().target).as_ref().map(|(t, _)| t.clone()).ok_or_else(|| {
            RegistryError::NotNow("no ublk target: create it first (ublk_create_target)".into())
        })
    }

    /// `ublk_create_target`: opens /dev/ublk-control on the reactors of `cpus` (all by default).
    pub fn create_ublk_target(&self, cpus: Option<Vec<usize>>) -> Result<(), RegistryError> {
        self.create_ublk_target_at(Path::new(fp_ublk::sys::CONTROL_PATH), cpus)
    }

    /// [`Registry::create_ublk_target`] with another control device (tests).
    pub fn create_ublk_target_at(
        &self,
        control: &Path,
        cpus: Option<Vec<usize>>,
    ) -> Result<(), RegistryError> {
        let state = self.ublk_state();
        let mut t = lock(&state.target);
        if t.is_some() {
            return Err(RegistryError::AlreadyExists { kind: "ublk target", name: "ublk".into() });
        }
        let reactors: Vec<ReactorHandle> = match &cpus {
            None => state.reactors.clone(),
            Some(cpus) => state
                .reactors
                .iter()
                .filter(|h| h.core().is_some_and(|c| cpus.contains(&c)))
                .cloned()
                .collect(),
        };
        if reactors.is_empty() {
            let have: Vec<String> =
                state.reactors.iter().filter_map(|h| h.core()).map(|c| c.to_string()).collect();
            return Err(RegistryError::Invalid {
                field: "cpumask",
                reason: format!("selects no reactor core; reactors run on cores {}", have.join(",")),
            });
        }
        let cores: Vec<usize> = reactors.iter().filter_map(|h| h.core()).collect();
        let target =
            Target::create(control, reactors, fp_ublk::target::CTRL_BOUND).map_err(registry_error)?;
        let info = UblkTargetInfo {
            cpumask: crate::methods::cpumask_hex(&cores),
            command_encoding: target.encoding(),
            kernel_features: target.features().map(fp_ublk::uapi::feature::names),
        };
        *t = Some((Arc::new(target), info));
        Ok(())
    }

    /// `ublk_destroy_target`: stops every ublk disk, then closes the control device.
    pub fn destroy_ublk_target(&self) -> Result<(), RegistryError> {
        self.ublk_target()?;
        for id in self.map_exports(|e: &UblkExport| e.disk.id) {
            self.stop_ublk_disk(id)?;
        }
        lock(&self.ublk_state().target).take();
        log::info!("ublk target destroyed");
        Ok(())
    }

    /// `ublk_start_disk`.
    pub fn start_ublk_disk(&self, spec: UblkStartSpec) -> Result<(), RegistryError> {
        let target = self.ublk_target()?;
        let num_queues = spec.num_queues.unwrap_or(fp_ublk::target::DEFAULT_NUM_QUEUES);
        let queue_depth = spec.queue_depth.unwrap_or(fp_ublk::target::DEFAULT_QUEUE_DEPTH);
        fp_ublk::target::check_geometry(num_queues, queue_depth).map_err(registry_error)?;
        let name = export_name(spec.ublk_id);
        let new = NewExport {
            name: &name,
            kind: KIND,
            label: LABEL,
            bdev_name: &spec.bdev_name,
            claim_type: ClaimType::ExclusiveWrite,
            migrate_from: None,
        };
        let stop_timeout = self.ublk_state().stop_timeout;
        self.add_export(new, |bdev| {
            let disk = target
                .start_disk(StartSpec {
                    id: Some(spec.ublk_id),
                    bdev,
                    num_queues,
                    queue_depth,
                    user_recovery: spec.user_recovery,
                })
                .map_err(registry_error)?;
            // The registry's name for it (an lvol's alias, not its UUID).
            let mut disk = disk;
            disk.bdev_name = spec.bdev_name.clone();
            Ok(Box::new(UblkExport {
                disk: Arc::new(disk),
                target: target.clone(),
                stop_timeout,
                stopped: Arc::default(),
            }))
        })
    }

    /// `ublk_recover_disk`: takes over device `ublk_id`, left by a daemon that died, for
    /// `bdev_name`.
    pub fn recover_ublk_disk(&self, bdev_name: &str, ublk_id: u32) -> Result<(), RegistryError> {
        let target = self.ublk_target()?;
        let name = export_name(ublk_id);
        let new = NewExport {
            name: &name,
            kind: KIND,
            label: LABEL,
            bdev_name,
            claim_type: ClaimType::ExclusiveWrite,
            migrate_from: None,
        };
        let stop_timeout = self.ublk_state().stop_timeout;
        self.add_export(new, |bdev| {
            let disk = target.recover_disk(ublk_id, bdev).map_err(registry_error)?;
            let mut disk = disk;
            disk.bdev_name = bdev_name.to_string();
            Ok(Box::new(UblkExport {
                disk: Arc::new(disk),
                target: target.clone(),
                stop_timeout,
                stopped: Arc::default(),
            }))
        })
    }

    /// `ublk_stop_disk`: the kernel answers the requests in flight, removes /dev/ublkbN, and
    /// the device is deleted; then the bdev is released. Past the stop bound
    /// (`[ublk] stop_timeout_ms`) the disk stays (its bdev claimed) and the error says why.
    pub fn stop_ublk_disk(&self, ublk_id: u32) -> Result<(), RegistryError> {
        let name = export_name(ublk_id);
        // The stop waits for the kernel and the queues: without holding the registry's lock.
        let (disk, target, stopped, bound) = self.with_export(&name, LABEL, |e: &UblkExport| {
            (e.disk.clone(), e.target.clone(), e.stopped.clone(), e.stop_timeout)
        })?;
        let stop = if stopped.load(Ordering::Acquire) { Ok(()) } else { target.stop_disk(&disk, bound) };
        if stop.is_ok() {
            stopped.store(true, Ordering::Release);
        }
        stop.map_err(|e| match e {
            TargetError::Setup(m) => RegistryError::NotNow(m),
            e => registry_error(e),
        })?;
        self.delete_export(&name, Some((KIND, LABEL)))
    }

    /// All ublk disks, or the one with `ublk_id` (`ublk_get_disks`).
    pub fn ublk_disks(&self, ublk_id: Option<u32>) -> Result<Vec<DiskInfo>, RegistryError> {
        match ublk_id {
            Some(id) => Ok(vec![self.with_export(&export_name(id), LABEL, |e: &UblkExport| e.disk.info())?]),
            None => Ok(self.map_exports(|e: &UblkExport| e.disk.info())),
        }
    }

    /// The target's cpumask and the kernel's features, if there is a target.
    pub fn ublk_target_info(&self) -> Option<UblkTargetInfo> {
        lock(&self.ublk_state().target).as_ref().map(|(_, i)| i.clone())
    }
}

/// The ublk export kind ([`super::EXPORT_KINDS`]).
pub struct UblkKind;

const OPTIONS: &[KindOption] = &[KindOption {
    table: "ublk",
    key: "stop_timeout_ms",
    flag: Some("ublk-stop-timeout-ms"),
    value: OptionType::Millis {
        default: STOP_TIMEOUT.as_millis() as u64,
        min: 1,
        max: super::vhost_blk::MAX_STOP_TIMEOUT_MS,
    },
    help: "How long ublk_stop_disk (and shutdown, per disk) waits for the kernel to answer the \
           requests in flight and the queues to leave their reactors, 1 to 600000",
}];

impl ExportKind for UblkKind {
    fn name(&self) -> &'static str {
        KIND
    }

    fn init(&self, init: &KindInit<'_>) -> Option<Arc<dyn Any + Send + Sync>> {
        Some(Arc::new(UblkState {
            target: Mutex::new(None),
            stop_timeout: init.options.millis("stop_timeout_ms"),
            reactors: init.reactors.to_vec(),
        }))
    }

    fn options(&self) -> &'static [KindOption] {
        OPTIONS
    }

    fn methods(&self) -> &'static [(&'static str, MethodFn)] {
        rpc::METHODS
    }

    /// The target first (a single table), then the disks to start and those to recover.
    fn config_tables(&self) -> &'static [ConfigTable] {
        const TABLES: &[ConfigTable] = &[
            ConfigTable::single("ublk_target", "ublk_create_target"),
            ConfigTable::array("ublk_disk", "ublk_start_disk"),
            ConfigTable::array("ublk_recover_disk", "ublk_recover_disk"),
        ];
        TABLES
    }

    /// The daemon is stopping: its disks are stopped and deleted (SPDK's behaviour); a daemon
    /// that is killed leaves them for `ublk_recover_disk` instead.
    fn stop_bound(&self, registry: &Registry) -> Option<Duration> {
        Some(registry.ublk_state().stop_timeout)
    }

    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family> {
        let Some(disks) = call("ublk_get_disks", None) else { return Vec::new() };
        let mut requests =
            Family::counter("flashpath_ublk_requests_total", "Requests a ublk disk answered, by operation");
        let mut bytes =
            Family::counter("flashpath_ublk_bytes_total", "Bytes a ublk disk moved, by direction");
        let mut errors =
            Family::counter("flashpath_ublk_errors_total", "Requests a ublk disk answered with an error");
        for d in array(&disks) {
            let base = vec![("ublk_id", u64_at(d, "ublk_id").to_string()), ("bdev", str_at(d, "bdev_name"))];
            let with = |k: &'static str, v: &str| {
                let mut l = base.clone();
                l.push((k, v.to_string()));
                l
            };
            let st = &d["stats"];
            for (op, key) in [
                ("read", "read_ops"),
                ("write", "write_ops"),
                ("flush", "flush_ops"),
                ("discard", "discard_ops"),
                ("write_zeroes", "write_zeroes_ops"),
            ] {
                requests.push(with("operation", op), u64_at(st, key));
            }
            bytes.push(with("direction", "read"), u64_at(st, "bytes_read"));
            bytes.push(with("direction", "write"), u64_at(st, "bytes_written"));
            errors.push(base, u64_at(st, "errors") + u64_at(st, "invalid"));
        }
        vec![requests, bytes, errors]
    }
}
