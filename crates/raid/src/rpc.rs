//! The raid module (`RaidModule`, driver "raid") and SPDK's methods: `bdev_raid_create`,
//! `bdev_raid_delete`, `bdev_raid_get_bdevs`, `bdev_raid_add_base_bdev`,
//! `bdev_raid_remove_base_bdev`, `bdev_raid_set_options`, with SPDK's parameters and result
//! shapes, and `driver_specific.raid` in `bdev_get_bdevs`.
//!
//! The module's state (one per registry) lists every raid it knows, assembled or still
//! configuring (found by examine, waiting for bases). Bases are claimed `exclusive_write` by
//! holder kind "raid" for as long as they sit in a slot, a failed one included, until
//! `bdev_raid_remove_base_bdev` or the raid's deletion.

mod create;
mod info;
mod slots;

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fp_bdev::metrics::{Family, MetricsCall};
use fp_bdev::module::{BdevModule, ConfigTable, ModuleError, ModuleHost, ModuleMethodFn};
use fp_bdev::BdevInfo;
use fp_rpc::{ParamError, Params};
use serde_json::{Map, Value};

use crate::device::RaidDevice;
use crate::examine::Configuring;
use crate::owner::{OwnerHandle, OwnerOptions, StopWait};
use crate::RaidError;

pub use create::RaidConfig;
pub use slots::REMOVE_DRAIN_WAIT;
pub(crate) use slots::{add_to_owner, Added};

/// The module's name: its bdevs' driver, its claims' holder kind.
pub const MODULE: &str = "raid";

/// SPDK's default rebuild window (`process_window_size_kb`).
pub const DEFAULT_WINDOW_KB: u64 = 1024;

/// `bdev_raid_set_options`: the background process's window and speed limit, for every raid.
pub struct ProcessOptions {
    pub window_kb: AtomicU64,
    /// MiB/s; 0: no limit.
    pub max_bandwidth_mb_sec: AtomicU64,
}

/// One raid the module knows.
pub struct RaidEntry {
    pub name: String,
    /// The bdev, once assembled.
    pub device: Option<Arc<RaidDevice>>,
    /// Its owner thread, once assembled (shared with control calls in progress).
    pub owner: Option<Arc<OwnerHandle>>,
    /// A raid found by examine and not assembled yet.
    pub configuring: Option<Configuring>,
}

/// The module's state in a registry.
pub struct RaidState {
    pub raids: Mutex<Vec<RaidEntry>>,
    pub options: Arc<ProcessOptions>,
}

impl ProcessOptions {
    /// The owner's options now.
    pub fn owner_options(&self) -> OwnerOptions {
        OwnerOptions {
            process_window_bytes: self.window_kb.load(Ordering::Relaxed) << 10,
            process_max_bandwidth_mb_sec: self.max_bandwidth_mb_sec.load(Ordering::Relaxed),
            ..OwnerOptions::default()
        }
    }
}

/// Stops an owner: an orderly stop (clean superblocks), `clear_sb` also erasing them, within
/// `bound` in all ([`crate::owner::OWNER_WAIT`], or less at the daemon's shutdown). The raid is marked stopping first, so its owner gives a busy base's
/// metadata writes up (after a short grace) and control calls in progress end. A handle
/// still shared by a call in progress is dropped instead (a stop without the clean mark: the
/// next assembly resyncs, which is safe); with `clear_sb` it is first waited for, since
/// erasing needs the owner. The error of a `clear_sb` names the bases whose superblock was not
/// erased; without `clear_sb` nothing fails. [`StopWait::UnderWay`]: the owner was still
/// waiting for a base to answer a request at the bound; it ends alone.
pub(crate) fn stop_owner(raid: &str, owner: Arc<OwnerHandle>, clear_sb: bool, bound: Duration) -> StopWait {
    owner.shared().set_stopping();
    let deadline = Instant::now() + bound;
    let mut owner = owner;
    let handle = loop {
        match Arc::try_unwrap(owner) {
            Ok(h) => break Some(h),
            Err(shared) if clear_sb && Instant::now() < deadline => {
                owner = shared;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => break None,
        }
    };
    let Some(h) = handle else {
        log::warn!("raid '{raid}': its owner is busy; stopped without marking it clean");
        if clear_sb {
            return StopWait::Stopped(Err(RaidError::NotErased(format!(
                "raid '{raid}': its owner stayed busy with another call for {:?}; no superblock was erased",
                bound
            ))));
        }
        return StopWait::Stopped(Ok(()));
    };
    let wait = deadline.saturating_duration_since(Instant::now());
    let stopped = if clear_sb { h.delete(wait) } else { h.shutdown(wait) };
    match stopped {
        Ok(StopWait::Stopped(Err(e))) if !clear_sb => {
            log::warn!("raid '{raid}': its owner did not stop cleanly: {e}");
            StopWait::Stopped(Ok(()))
        }
        Ok(w) => w,
        Err(e) if clear_sb => StopWait::Stopped(Err(e)),
        Err(e) => {
            log::warn!("raid '{raid}': {e}");
            StopWait::Stopped(Ok(()))
        }
    }
}

impl RaidState {
    fn new() -> RaidState {
        RaidState {
            raids: Mutex::new(Vec::new()),
            options: Arc::new(ProcessOptions {
                window_kb: AtomicU64::new(DEFAULT_WINDOW_KB),
                max_bandwidth_mb_sec: AtomicU64::new(0),
            }),
        }
    }
}

/// The raid module.
pub struct RaidModule;

impl RaidModule {
    /// The module's state in `host`, made on first use.
    pub fn state(host: &dyn ModuleHost) -> Arc<RaidState> {
        let any = host.module_state(MODULE, &|| Arc::new(RaidState::new()) as Arc<dyn Any + Send + Sync>);
        any.downcast::<RaidState>().unwrap_or_else(|_| unreachable!("the raid module's state is a RaidState"))
    }
}

/// Runs `f` on the module's list of raids (a control-plane lock, never taken by I/O).
pub(crate) fn with_raids<R>(host: &dyn ModuleHost, f: impl FnOnce(&mut Vec<RaidEntry>) -> R) -> R {
    let state = RaidModule::state(host);
    let mut list = state.raids.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut list)
}

/// A raid error as a module error: refusals name their field (invalid params), the rest keep
/// their errno ([`RaidError::errno`]).
pub fn module_error(e: RaidError) -> ModuleError {
    match e {
        RaidError::InvalidParam { field, reason } => ParamError::new(field, reason).into(),
        RaidError::Bdev(b) => ModuleError::Bdev(b),
        other => ModuleError::module(other.errno(), other),
    }
}

/// The module's configuration file tables ([`BdevModule::config_tables`]).
const CONFIG_TABLES: &[ConfigTable] = &[ConfigTable::single("raid_options", "bdev_raid_set_options")];

impl BdevModule for RaidModule {
    fn name(&self) -> &'static str {
        MODULE
    }

    /// `[raid_options]`: `bdev_raid_set_options`, before any bdev, so that a rebuild that
    /// starts when examine assembles a raid already runs at the configured speed.
    fn config_tables(&self) -> &'static [ConfigTable] {
        CONFIG_TABLES
    }

    /// From `bdev_raid_get_bdevs` (every category): each raid's state, slots, rebuild and counters.
    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family> {
        match call("bdev_raid_get_bdevs", Some(serde_json::json!({ "category": "all" }))) {
            Some(r) => crate::metrics::raids(&r).into(),
            None => Vec::new(),
        }
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_raid_create", create::create),
            ("bdev_raid_delete", create::delete),
            ("bdev_raid_get_bdevs", info::get_bdevs),
            ("bdev_raid_add_base_bdev", slots::add_base_bdev),
            ("bdev_raid_remove_base_bdev", slots::remove_base_bdev),
            ("bdev_raid_set_options", set_options),
        ]
    }

    /// SPDK's `driver_specific.raid` object (the raid's `bdev_raid_get_bdevs` entry without
    /// its name).
    fn driver_specific(&self, _info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        match device.downcast_ref::<RaidDevice>() {
            Some(dev) => {
                let mut m = info::raid_json(dev);
                m.remove("name");
                m
            }
            None => Map::new(),
        }
    }

    fn examine(&self, host: &dyn ModuleHost, name: &str, driver: &'static str) {
        crate::examine::examine(host, name, driver);
    }

    fn shutdown(&self, host: &dyn ModuleHost) {
        create::shutdown(host);
    }
}

/// `bdev_raid_set_options`: SPDK's `process_window_size_kb` (at least 4) and
/// `process_max_bandwidth_mb_sec` (0: no limit), for every raid from its next window on.
fn set_options(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let window = p.optional_uint("process_window_size_kb", u64::from(u32::MAX))?;
    let bw = p.optional_uint("process_max_bandwidth_mb_sec", u64::from(u32::MAX))?;
    p.finish()?;
    if window == Some(0) {
        return Err(ParamError::new("process_window_size_kb", "must be at least 1").into());
    }
    let state = RaidModule::state(host);
    if let Some(w) = window {
        state.options.window_kb.store(w, Ordering::Relaxed);
    }
    if let Some(b) = bw {
        state.options.max_bandwidth_mb_sec.store(b, Ordering::Relaxed);
    }
    // Running raids follow at their next window.
    let owners: Vec<Arc<OwnerHandle>> =
        with_raids(host, |l| l.iter().filter_map(|r| r.owner.clone()).collect());
    let (w, b) = (
        state.options.window_kb.load(Ordering::Relaxed),
        state.options.max_bandwidth_mb_sec.load(Ordering::Relaxed),
    );
    for o in owners {
        o.set_process_options(w, b).map_err(module_error)?;
    }
    Ok(Value::Bool(true))
}
