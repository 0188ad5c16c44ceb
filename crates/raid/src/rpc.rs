//! The raid module (`RaidModule`, driver "raid") and SPDK's methods: `bdev_raid_create`,
//! `bdev_raid_delete`, `bdev_raid_get_bdevs`, `bdev_raid_add_base_bdev`,
//! `bdev_raid_remove_base_bdev`, `bdev_raid_set_options`, with SPDK's parameters and result
//! shapes, and `driver_specific.raid` in `bdev_get_bdevs`.
//!
//! The module's state (one per registry, in `table`) lists every raid it knows, assembled or
//! still configuring (found by examine, waiting for bases). Bases are claimed `exclusive_write` by
//! holder kind "raid" for as long as they sit in a slot, a failed one included, until
//! `bdev_raid_remove_base_bdev` or the raid's deletion.

mod create;
mod info;
mod slots;

use fp_bdev::copy_share::CopyShare;
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fp_bdev::metrics::{Family, MetricsCall};
use fp_bdev::module::{BdevModule, ConfigTable, ModuleError, ModuleHost, ModuleMethodFn};
use fp_bdev::BdevInfo;
use fp_rpc::{ParamError, Params};
use serde_json::{Map, Value};

use crate::device::RaidDevice;
use crate::owner::OwnerHandle;
use crate::table::with_raids;
pub use crate::table::{
    module_error, ProcessOptions, RaidEntry, RaidModule, RaidState, DEFAULT_WINDOW_KB, MODULE,
};

pub use create::RaidConfig;
pub use slots::REMOVE_DRAIN_WAIT;
pub(crate) use slots::{add_to_owner, Added};

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
/// `process_max_bandwidth_mb_sec` (0: no limit), and flashpath's `process_weight` (1 to 100,
/// the copy's share beside guest I/O), for every raid from its next window on.
fn set_options(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let window = p.optional_uint("process_window_size_kb", u64::from(u32::MAX))?;
    let bw = p.optional_uint("process_max_bandwidth_mb_sec", u64::from(u32::MAX))?;
    let weight = p.optional_uint("process_weight", u64::from(u32::MAX))?;
    p.finish()?;
    if window == Some(0) {
        return Err(ParamError::new("process_window_size_kb", "must be at least 1").into());
    }
    if let Some(w) = weight {
        CopyShare::new(w).map_err(|e| ParamError::new("process_weight", e.to_string()))?;
    }
    let state = RaidModule::state(host);
    if let Some(w) = window {
        state.options.window_kb.store(w, Ordering::Relaxed);
    }
    if let Some(b) = bw {
        state.options.max_bandwidth_mb_sec.store(b, Ordering::Relaxed);
    }
    if let Some(w) = weight {
        state.options.weight.store(w, Ordering::Relaxed);
    }
    // Running raids follow at their next window.
    let owners: Vec<Arc<OwnerHandle>> =
        with_raids(host, |l| l.iter().filter_map(|r| r.owner.clone()).collect());
    let (w, b) = (
        state.options.window_kb.load(Ordering::Relaxed),
        state.options.max_bandwidth_mb_sec.load(Ordering::Relaxed),
    );
    let share = state.options.share();
    for o in owners {
        o.set_process_options(w, b, share).map_err(module_error)?;
    }
    Ok(Value::Bool(true))
}
