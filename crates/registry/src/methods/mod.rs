//! The management methods: JSON parameters in, [`Registry`] calls, JSON results out.
//!
//! Names, parameters and result shapes follow SPDK's JSON-RPC, so SPDK's `rpc.py` and scripts
//! written for it work; flashpath's additions are extra result fields and a few extra
//! parameters (`direct`, `num_queues`). Unknown parameters are rejected, naming the field and
//! listing the accepted ones.
//!
//! Three tables answer a call: the daemon-wide methods here ([`METHODS`]: bdevs, reactors,
//! statistics, QoS), each export kind's (`exports/<kind>/rpc.rs`) and each bdev module's. The
//! RPC server and the `--config` loader both come through [`Registry::call`], so a
//! configuration file is exactly a list of RPC calls and cannot drift from them.

use fp_rpc::Params;
use serde_json::Value;

use crate::exports::EXPORT_KINDS;
use crate::Registry;

mod backup;
mod bdev;
mod bitmap;
mod examine;
mod fleece;
mod framework;
mod iostat;
mod method;
mod mirror;
mod qos;

pub use bdev::bdev_uuid;
pub use method::{cpumask_hex, parse_cpumask, MethodError, MethodFn};

/// The daemon-wide methods, by name; the export kinds' and the bdev modules' come from their
/// own tables. `rpc_get_methods` lists all three.
pub const METHODS: &[(&str, MethodFn)] = &[
    ("bdev_get_bdevs", bdev::bdev_get_bdevs),
    ("bdev_set_options", examine::bdev_set_options),
    ("bdev_examine", examine::bdev_examine),
    ("framework_get_reactors", framework::framework_get_reactors),
    ("rpc_get_methods", framework::rpc_get_methods),
    ("spdk_get_version", framework::spdk_get_version),
    ("flashpath_get_stats", framework::flashpath_get_stats),
    // The disk layer (iostat.rs).
    ("bdev_get_iostat", iostat::bdev_get_iostat),
    ("bdev_reset_iostat", iostat::bdev_reset_iostat),
    ("bdev_enable_histogram", iostat::bdev_enable_histogram),
    ("bdev_get_histogram", iostat::bdev_get_histogram),
    // QoS (qos.rs).
    ("bdev_set_qos_limit", qos::bdev_set_qos_limit),
    ("bdev_qos_group_create", qos::bdev_qos_group_create),
    ("bdev_qos_group_set", qos::bdev_qos_group_set),
    ("bdev_qos_group_delete", qos::bdev_qos_group_delete),
    ("bdev_qos_group_add_bdev", qos::bdev_qos_group_add_bdev),
    ("bdev_qos_group_remove_bdev", qos::bdev_qos_group_remove_bdev),
    ("bdev_qos_group_set_weight", qos::bdev_qos_group_set_weight),
    ("bdev_qos_get_groups", qos::bdev_qos_get_groups),
    // Dirty bitmaps (bitmap.rs).
    ("bdev_dirty_bitmap_add", bitmap::bdev_dirty_bitmap_add),
    ("bdev_dirty_bitmap_remove", bitmap::bdev_dirty_bitmap_remove),
    ("bdev_dirty_bitmap_clear", bitmap::bdev_dirty_bitmap_clear),
    ("bdev_dirty_bitmap_enable", bitmap::bdev_dirty_bitmap_enable),
    ("bdev_dirty_bitmap_disable", bitmap::bdev_dirty_bitmap_disable),
    ("bdev_dirty_bitmap_merge", bitmap::bdev_dirty_bitmap_merge),
    ("bdev_dirty_bitmap_list", bitmap::bdev_dirty_bitmap_list),
    ("bdev_dirty_bitmap_get_extents", bitmap::bdev_dirty_bitmap_get_extents),
    // Mirror jobs (mirror.rs).
    ("bdev_mirror_start", mirror::bdev_mirror_start),
    ("bdev_mirror_get_jobs", mirror::bdev_mirror_get_jobs),
    ("bdev_mirror_set_speed", mirror::bdev_mirror_set_speed),
    ("bdev_mirror_complete", mirror::bdev_mirror_complete),
    ("bdev_mirror_cancel", mirror::bdev_mirror_cancel),
    // Point-in-time views (fleece.rs).
    ("bdev_fleece_create", fleece::bdev_fleece_create),
    ("bdev_fleece_delete", fleece::bdev_fleece_delete),
    // Backup jobs (backup.rs).
    ("bdev_backup_start", backup::bdev_backup_start),
    ("bdev_backup_get_jobs", backup::bdev_backup_get_jobs),
    ("bdev_backup_cancel", backup::bdev_backup_cancel),
    ("bdev_backup_set_speed", backup::bdev_backup_set_speed),
];

/// The daemon-wide methods and every export kind's: all but the bdev modules'.
fn registry_methods() -> impl Iterator<Item = &'static (&'static str, MethodFn)> {
    METHODS.iter().chain(EXPORT_KINDS.iter().flat_map(|k| k.methods()))
}

impl Registry {
    /// Runs `method` with `params`: a daemon-wide method, an export kind's or a bdev module's.
    pub fn call(&self, method: &str, params: Option<Value>) -> Result<Value, MethodError> {
        match registry_methods().find(|(name, _)| *name == method) {
            Some((_, f)) => f(self, Params::new(params)?),
            None => match self.call_module(method, params) {
                Some(result) => Ok(result?),
                None => Err(MethodError::UnknownMethod(method.to_string())),
            },
        }
    }

    /// Every method's name, sorted.
    pub fn method_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> =
            registry_methods().map(|(n, _)| *n).chain(self.module_methods()).collect();
        names.sort_unstable();
        names
    }
}

#[cfg(test)]
mod tests;
