//! ublk methods, with SPDK's names and parameters: `ublk_create_target {cpumask?}`,
//! `ublk_destroy_target`, `ublk_start_disk {bdev_name, ublk_id, num_queues?, queue_depth?}`,
//! `ublk_stop_disk {ublk_id}`, `ublk_recover_disk {bdev_name, ublk_id}`, `ublk_get_disks
//! {ublk_id?}`. flashpath adds `user_recovery` to `ublk_start_disk` (require or refuse the
//! kernel's user recovery), and to each of `ublk_get_disks`' disks the copy mode, the kernel
//! features in use and the disk's counters.

use fp_rpc::Params;
use serde_json::{json, Value};

use super::spec::UblkStartSpec;
use crate::methods::{parse_cpumask, MethodError, MethodFn};
use crate::Registry;

/// The kind's methods ([`crate::exports::ExportKind::methods`]).
pub(super) const METHODS: &[(&str, MethodFn)] = &[
    ("ublk_create_target", ublk_create_target),
    ("ublk_destroy_target", ublk_destroy_target),
    ("ublk_start_disk", ublk_start_disk),
    ("ublk_stop_disk", ublk_stop_disk),
    ("ublk_recover_disk", ublk_recover_disk),
    ("ublk_get_disks", ublk_get_disks),
];

fn ublk_create_target(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let cpus = p.optional_str("cpumask")?.map(|m| parse_cpumask(&m)).transpose()?;
    // SPDK's switch between user copy and the kernel's copy: flashpath always has the kernel
    // copy into the tag's buffer (docs/ublk.md), so either value is accepted.
    let _ = p.optional_bool("disable_user_copy")?;
    p.finish()?;
    registry.create_ublk_target(cpus)?;
    Ok(json!(true))
}

fn ublk_destroy_target(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    p.finish()?;
    registry.destroy_ublk_target()?;
    Ok(json!(true))
}

fn ublk_id(p: &mut Params) -> Result<u32, MethodError> {
    Ok(p.required_uint("ublk_id", u64::from(u32::MAX - 1))? as u32)
}

fn ublk_start_disk(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let bdev_name = p.required_str("bdev_name")?;
    let ublk_id = ublk_id(&mut p)?;
    let num_queues = p.optional_uint("num_queues", u64::from(u16::MAX))?.map(|n| n as u16);
    let queue_depth = p.optional_uint("queue_depth", u64::from(u16::MAX))?.map(|n| n as u16);
    let user_recovery = p.optional_bool("user_recovery")?;
    p.finish()?;
    registry.start_ublk_disk(UblkStartSpec { bdev_name, ublk_id, num_queues, queue_depth, user_recovery })?;
    Ok(json!(ublk_id))
}

fn ublk_stop_disk(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let ublk_id = ublk_id(&mut p)?;
    p.finish()?;
    registry.stop_ublk_disk(ublk_id)?;
    Ok(json!(true))
}

fn ublk_recover_disk(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let bdev_name = p.required_str("bdev_name")?;
    let ublk_id = ublk_id(&mut p)?;
    p.finish()?;
    registry.recover_ublk_disk(&bdev_name, ublk_id)?;
    Ok(json!(ublk_id))
}

fn ublk_get_disks(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let ublk_id = p.optional_uint("ublk_id", u64::from(u32::MAX - 1))?.map(|n| n as u32);
    p.finish()?;
    let disks = registry.ublk_disks(ublk_id)?;
    let target = registry.ublk_target_info();
    let disks: Vec<Value> = disks
        .into_iter()
        .map(|d| {
            let mut v = serde_json::to_value(d).expect("plain data serialises");
            if let (Some(t), Some(o)) = (&target, v.as_object_mut()) {
                o.insert("kernel_features".into(), json!(t.kernel_features));
                o.insert("command_encoding".into(), json!(t.command_encoding));
            }
            v
        })
        .collect();
    Ok(Value::Array(disks))
}
