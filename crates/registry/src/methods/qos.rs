//! QoS methods: SPDK's `bdev_set_qos_limit` (its parameters, names and units), and flashpath's
//! groups, which SPDK lacks: `bdev_qos_group_create`, `_set`, `_delete`, `_add_bdev`,
//! `_remove_bdev`, `_set_weight` and `bdev_qos_get_groups`, whose limits take QEMU's
//! throttle-group names with underscores (`iops_total`, `iops_total_max`,
//! `iops_total_max_length`, ... `bps_write_max_length`; bytes per second, seconds).
//!
//! In both, a limit left out keeps its value and 0 removes it, as in SPDK's
//! `bdev_set_qos_limit`. SPDK refuses IOPS limits that are not a multiple of 1,000 (its 1 ms
//! timeslice); flashpath has no timeslice and takes any value from the minimum of 1,000 up.

use fp_bdev::qos::{QosLimits, ThrottleConfig, MAX_RATE, MAX_WEIGHT, THROTTLE_FIELDS};
use fp_rpc::{ParamError, Params};
use serde_json::{json, Value};

use super::MethodError;
use crate::{QosGroupSummary, Registry};

/// The longest burst, in seconds (QEMU's bound is far larger; a day is plenty).
const MAX_BURST_SECONDS: u64 = 86_400;

/// Where one of `bdev_set_qos_limit`'s limits goes.
type LimitSlot = fn(&mut QosLimits) -> &mut u64;

/// `bdev_set_qos_limit`'s limits: field name and where it goes.
const DISK_LIMITS: [(&str, LimitSlot); 4] = [
    ("rw_ios_per_sec", |l| &mut l.rw_ios_per_sec),
    ("rw_mbytes_per_sec", |l| &mut l.rw_mbytes_per_sec),
    ("r_mbytes_per_sec", |l| &mut l.r_mbytes_per_sec),
    ("w_mbytes_per_sec", |l| &mut l.w_mbytes_per_sec),
];

/// A group limit given: which of the six, which part (average, ceiling, length), the value.
type GroupChange = (usize, usize, u64);

/// The group limits given in `p`.
fn take_group_limits(p: &mut Params) -> Result<Vec<GroupChange>, ParamError> {
    let mut given = Vec::new();
    for (i, fields) in THROTTLE_FIELDS.iter().enumerate() {
        for (k, field) in fields.iter().enumerate() {
            let bound = if k == 2 { MAX_BURST_SECONDS } else { MAX_RATE };
            if let Some(v) = p.optional_uint(field, bound)? {
                given.push((i, k, v));
            }
        }
    }
    Ok(given)
}

/// `config` with `changes` applied.
fn apply_group_limits(mut config: ThrottleConfig, changes: &[GroupChange]) -> ThrottleConfig {
    let limits = config.named_mut();
    for &(i, k, v) in changes {
        let l = &mut *limits[i].1;
        *[&mut l.avg, &mut l.max, &mut l.max_length][k] = v;
    }
    config
}

fn group_json(g: &QosGroupSummary) -> Value {
    let mut v = json!({ "name": g.name });
    for ((_, limit), [avg, max, length]) in g.config.named().into_iter().zip(THROTTLE_FIELDS) {
        v[avg] = json!(limit.avg);
        v[max] = json!(limit.max);
        v[length] = json!(limit.max_length);
    }
    v["fair_on"] = json!(g.fair_on.map(|f| f.name()));
    v["members"] = g
        .members
        .iter()
        .map(|m| json!({ "bdev_name": m.bdev_name, "weight": m.weight, "rate": m.rate }))
        .collect();
    v
}

/// A member's weight: 1 to [`MAX_WEIGHT`] (the decoder bounds it above).
fn weight(w: u64) -> Result<u64, ParamError> {
    if w == 0 {
        return Err(ParamError::new("weight", format!("0 is not a weight (1 to {MAX_WEIGHT})")));
    }
    Ok(w)
}

/// `assigned_rate_limits` of `bdev_get_bdevs`, SPDK's shape.
pub(crate) fn limits_json(l: &QosLimits) -> Value {
    let mut l = *l;
    let mut v = json!({});
    for (field, slot) in DISK_LIMITS {
        v[field] = json!(*slot(&mut l));
    }
    v
}

/// SPDK's `name` and four limits; at least one limit.
pub(crate) fn bdev_set_qos_limit(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    let mut given = Vec::new();
    for (field, slot) in DISK_LIMITS {
        if let Some(v) = p.optional_uint(field, u64::MAX)? {
            given.push((slot, v));
        }
    }
    p.finish()?;
    if given.is_empty() {
        return Err(ParamError::new(
            "rw_ios_per_sec",
            "no limit given: set at least one of rw_ios_per_sec, rw_mbytes_per_sec, r_mbytes_per_sec, w_mbytes_per_sec (0 removes a limit)",
        )
        .into());
    }
    registry.set_qos_limits(&name, |mut l| {
        for (slot, v) in given {
            *slot(&mut l) = v;
        }
        l
    })?;
    Ok(json!(true))
}

pub(crate) fn bdev_qos_group_create(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    let changes = take_group_limits(&mut p)?;
    p.finish()?;
    registry.qos_group_create(&name, apply_group_limits(ThrottleConfig::default(), &changes))?;
    Ok(json!(true))
}

pub(crate) fn bdev_qos_group_set(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    let changes = take_group_limits(&mut p)?;
    p.finish()?;
    if changes.is_empty() {
        let reason = "no limit given: set at least one group limit (0 removes it)";
        return Err(ParamError::new("iops_total", reason).into());
    }
    registry.qos_group_set(&name, |config| apply_group_limits(config, &changes))?;
    Ok(json!(true))
}

pub(crate) fn bdev_qos_group_delete(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    p.finish()?;
    registry.qos_group_delete(&name)?;
    Ok(json!(true))
}

pub(crate) fn bdev_qos_group_add_bdev(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    let bdev = p.required_str("bdev_name")?;
    let weight = weight(p.optional_uint("weight", MAX_WEIGHT)?.unwrap_or(1))?;
    p.finish()?;
    registry.qos_group_add(&name, &bdev, weight)?;
    Ok(json!(true))
}

pub(crate) fn bdev_qos_group_remove_bdev(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    let bdev = p.required_str("bdev_name")?;
    p.finish()?;
    registry.qos_group_remove(&name, &bdev)?;
    Ok(json!(true))
}

pub(crate) fn bdev_qos_group_set_weight(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    let bdev = p.required_str("bdev_name")?;
    let weight = weight(p.required_uint("weight", MAX_WEIGHT)?)?;
    p.finish()?;
    registry.qos_group_set_weight(&name, &bdev, weight)?;
    Ok(json!(true))
}

pub(crate) fn bdev_qos_get_groups(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.optional_str("name")?;
    p.finish()?;
    let groups = registry.qos_groups(name.as_deref())?;
    Ok(Value::Array(groups.iter().map(group_json).collect()))
}
