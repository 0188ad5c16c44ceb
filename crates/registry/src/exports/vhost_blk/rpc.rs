//! vhost-user-blk controller methods, with SPDK's names, parameters and result shapes:
//! `vhost_create_blk_controller`, `vhost_get_controllers`, `vhost_delete_controller`,
//! `vhost_controller_set_coalescing`. flashpath adds `num_queues`, `migrate_from` (a migration
//! destination beside its source, docs/migration.md), `stop_timeout_ms` (the bound of a queue
//! stop, docs/architecture.md) and per-queue counters.

use fp_rpc::{Neutral, Params};
use fp_vhost_blk::{ControllerInfo, ControllerStats};
use serde_json::{json, Value};

use super::VhostBlkSpec;
use crate::methods::{cpumask_hex, parse_cpumask, MethodError, MethodFn};
use crate::Registry;

/// The kind's methods ([`crate::exports::ExportKind::methods`]).
pub(super) const METHODS: &[(&str, MethodFn)] = &[
    ("vhost_create_blk_controller", vhost_create_blk_controller),
    ("vhost_get_controllers", vhost_get_controllers),
    ("vhost_delete_controller", vhost_delete_controller),
    ("vhost_controller_set_coalescing", vhost_controller_set_coalescing),
];

/// SPDK parameters of `vhost_create_blk_controller` that flashpath does not implement.
const VHOST_BLK_SPDK_ONLY: [(&str, Neutral); 1] = [("transport", Neutral::Str("vhost_user_blk"))];

fn vhost_create_blk_controller(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let spec = VhostBlkSpec {
        ctrlr: p.required_str("ctrlr")?,
        dev_name: p.required_str("dev_name")?,
        cpus: p.optional_str("cpumask")?.map(|m| parse_cpumask(&m)).transpose()?,
        readonly: p.optional_bool("readonly")?.unwrap_or(false),
        num_queues: p.optional_uint("num_queues", u16::MAX as u64)?.map(|q| q as u16),
        migrate_from: p.optional_str("migrate_from")?,
        stop_timeout: p
            .optional_uint("stop_timeout_ms", super::MAX_STOP_TIMEOUT_MS)?
            .map(std::time::Duration::from_millis),
    };
    // SPDK offers packed rings (and recovers them after a crash) only when asked; flashpath
    // offers both ring layouts to every frontend and recovers either from the in-flight
    // region, so both flags are accepted either way: `false` (rpc.py's default) does not
    // withdraw packed rings, the VMM picks the layout.
    p.optional_bool("packed_ring")?;
    p.optional_bool("packed_ring_recovery")?;
    p.spdk_only(&VHOST_BLK_SPDK_ONLY)?;
    p.finish()?;
    registry.create_vhost_blk(spec)?;
    Ok(json!(true))
}

fn vhost_get_controllers(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.optional_str("name")?;
    p.finish()?;
    let ctrls = registry.controllers(name.as_deref())?;
    Ok(Value::Array(ctrls.iter().map(controller_json).collect()))
}

/// SPDK's shape: `ctrlr`, `delay_base_us`, `iops_threshold` (all required).
fn vhost_controller_set_coalescing(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let ctrlr = p.required_str("ctrlr")?;
    let delay = p.required_uint("delay_base_us", u64::from(u32::MAX))? as u32;
    let threshold = p.required_uint("iops_threshold", u64::from(u32::MAX))? as u32;
    p.finish()?;
    registry.set_coalescing(&ctrlr, delay, threshold)?;
    Ok(json!(true))
}

fn vhost_delete_controller(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let ctrlr = p.required_str("ctrlr")?;
    p.finish()?;
    registry.delete_vhost(&ctrlr)?;
    Ok(json!(true))
}

fn controller_json(c: &ControllerInfo) -> Value {
    json!({
        "ctrlr": c.name,
        "cpumask": cpumask_hex(&c.cores),
        "socket": c.socket_path,
        "delay_base_us": c.coalescing.0,
        "iops_threshold": c.coalescing.1,
        "backend_specific": { "block": { "readonly": c.read_only, "bdev": c.bdev_name } },
        "num_queues": c.num_queues,
        "stop_timeout_ms": c.stop_timeout.as_millis() as u64,
        "cores": c.cores,
        "connected": c.connected,
        "stats": stats_json(&c.stats),
        // flashpath's: each started queue's counters, `in_flight` among them.
        "queues": c.queues.iter().map(|(id, st)| {
            let mut q = stats_json(st);
            q["id"] = json!(id);
            q
        }).collect::<Vec<_>>(),
    })
}

/// A controller's or queue's counters, with the requests completed (whatever their status) and
/// the requests completed per guest notification (`null` before the first notification).
pub(crate) fn stats_json(st: &ControllerStats) -> Value {
    let mut v = json!(st);
    v["completed"] = json!(st.completed());
    v["requests_per_notification"] = json!(st.requests_per_notification());
    v
}
