//! `bdev_delay_create`, `bdev_delay_delete` and `bdev_delay_update_latency`, SPDK's parameters
//! (latencies in microseconds).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use fp_rpc::{Neutral, ParamError, Params};
use serde_json::{Map, Value};

use super::{DelayDevice, DelayLatency, LatencyKind, LATENCY_FIELDS, MAX_DELAY};
use crate::module::{delete_method, BdevModule, ClaimType, ModuleError, ModuleHost, ModuleMethodFn, NewBdev};
use crate::BdevInfo;

/// The delay module: a bdev holding each request of the one below for a latency.
pub struct DelayModule;

impl BdevModule for DelayModule {
    fn name(&self) -> &'static str {
        "delay"
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_delay_create", create),
            ("bdev_delay_delete", |h, p| delete_method(h, p, "delay")),
            ("bdev_delay_update_latency", update_latency),
        ]
    }

    /// The base and the latencies now, under the create method's names.
    fn driver_specific(&self, info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let mut out: Map<String, Value> =
            info.driver_specific.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        if let Some(dev) = device.downcast_ref::<DelayDevice>() {
            let l = dev.latency();
            let us = [l.avg_read, l.p99_read, l.avg_write, l.p99_write];
            for (field, d) in LATENCY_FIELDS.iter().zip(us) {
                out.insert((*field).into(), Value::from(d.as_micros() as u64));
            }
        }
        out
    }
}

/// Claims the base exclusively: the delay bdev is its only user.
fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let max = MAX_DELAY.as_micros() as u64;
    let base = p.required_str("base_bdev_name")?;
    let name = p.required_str("name")?;
    let mut us = |field| p.required_uint(field, max).map(Duration::from_micros);
    let latency = DelayLatency {
        avg_read: us(LATENCY_FIELDS[0])?,
        p99_read: us(LATENCY_FIELDS[1])?,
        avg_write: us(LATENCY_FIELDS[2])?,
        p99_write: us(LATENCY_FIELDS[3])?,
    };
    p.spdk_only(&[("uuid", Neutral::Absent)])?;
    p.finish()?;
    host.check_new_bdev(&name)?;
    let base_bdev = host.claimable(&base, ClaimType::ExclusiveWrite)?;
    let dev = Arc::new(DelayDevice::new(&name, base_bdev, latency)?);
    let name = host.add_bdev("delay", NewBdev::new(dev).claiming(&base, ClaimType::ExclusiveWrite))?;
    log::info!("bdev '{name}' is a delay over '{base}'");
    Ok(Value::from(name))
}

/// SPDK's shape: `delay_bdev_name`, `latency_type` (avg_read, p99_read, avg_write, p99_write),
/// `latency_us`. Applies to requests submitted after it.
fn update_latency(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("delay_bdev_name")?;
    let kind = p.required_str("latency_type")?;
    let kind = LatencyKind::from_name(&kind).ok_or_else(|| {
        ParamError::new(
            "latency_type",
            format!("'{}' is not one of {}", kind.escape_debug(), LatencyKind::NAMES.join(", ")),
        )
    })?;
    let us = p.required_uint("latency_us", u64::MAX)?;
    p.finish()?;
    let dev = host.module_device(&name, "delay", "delay bdev")?;
    let dev = dev.downcast_ref::<DelayDevice>().expect("the delay module adds delay devices only");
    dev.set_latency(kind, Duration::from_micros(us))?;
    log::info!("bdev '{name}': {} latency now {us} us", kind.name());
    Ok(Value::Bool(true))
}
