//! `bdev_error_create`, `bdev_error_delete`, `bdev_error_inject_error` and
//! `bdev_error_resume_pending`, SPDK's parameters.

use std::any::Any;
use std::sync::Arc;

use fp_rpc::{Neutral, ParamError, Params};
use serde_json::{json, Map, Value};

use super::{ErrorDevice, ErrorType, Injection, IO_TYPES};
use crate::module::{BdevModule, ClaimType, ModuleError, ModuleHost, ModuleMethodFn, NewBdev};
use crate::BdevInfo;

/// The error module: a bdev that fails, holds, corrupts or refuses requests on demand.
pub struct ErrorModule;

impl BdevModule for ErrorModule {
    fn name(&self) -> &'static str {
        "error"
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_error_create", create),
            ("bdev_error_delete", delete),
            ("bdev_error_inject_error", inject_error),
            ("bdev_error_resume_pending", resume_pending),
        ]
    }

    /// The base and the injections now, by `io_type`.
    fn driver_specific(&self, info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let mut out: Map<String, Value> =
            info.driver_specific.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        if let Some(dev) = device.downcast_ref::<ErrorDevice>() {
            let mut inj = Map::new();
            for (name, i) in IO_TYPES.iter().zip(dev.injections()) {
                if let Some(i) = i {
                    inj.insert(
                        (*name).into(),
                        json!({
                            "error_type": i.error_type.name(),
                            "num": i.num,
                            "queue_depth": i.queue_depth,
                            "corrupt_offset": i.corrupt_offset,
                            "corrupt_value": i.corrupt_value,
                        }),
                    );
                }
            }
            out.insert("injections".into(), Value::Object(inj));
        }
        out
    }
}

/// SPDK's shape: `base_name`, `uuid` (not supported); makes `EE_<base_name>`, claiming the base
/// exclusively. Returns `true`, as SPDK does.
fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let base = p.required_str("base_name")?;
    p.spdk_only(&[("uuid", Neutral::Absent)])?;
    p.finish()?;
    let name = format!("EE_{base}");
    host.check_new_bdev(&name)?;
    let base_bdev = host.claimable(&base, ClaimType::ExclusiveWrite)?;
    let dev = Arc::new(ErrorDevice::new(&name, base_bdev)?);
    let name = host.add_bdev("error", NewBdev::new(dev).claiming(&base, ClaimType::ExclusiveWrite))?;
    log::info!("bdev '{name}' is an error bdev over '{base}'");
    Ok(Value::Bool(true))
}

fn device(host: &dyn ModuleHost, name: &str) -> Result<Arc<dyn Any + Send + Sync>, ModuleError> {
    host.module_device(name, "error", "error bdev")
}

fn as_error(dev: &Arc<dyn Any + Send + Sync>) -> &ErrorDevice {
    dev.downcast_ref::<ErrorDevice>().expect("the error module adds error devices only")
}

/// `name`. Held requests fail with `ENXIO` so that their users can drain; then the bdev goes.
fn delete(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let dev = device(host, &name)?;
    // After the delete: a refused one (the bdev is claimed) changes nothing. The channels
    // outlive the registry's entry until their users have drained them, which this lets end.
    host.delete_bdev(&name, "error")?;
    as_error(&dev).fail_pending();
    Ok(Value::Bool(true))
}

/// SPDK's shape: `name`, `io_type` (read, write, unmap, flush, write_zeroes, all, clear),
/// `error_type` (failure, pending, corrupt_data, nomem), `num` (default 1), `queue_depth`,
/// `corrupt_offset`, `corrupt_value`. `nvme_failure` and its `nvme_sct`/`nvme_sc` are SPDK's
/// only.
fn inject_error(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let io_type = p.required_str("io_type")?;
    let error_type = p.required_str("error_type")?;
    let num = p.optional_uint("num", u64::MAX)?.unwrap_or(1);
    let queue_depth = p.optional_uint("queue_depth", u64::MAX)?.unwrap_or(0);
    let corrupt_offset = p.optional_uint("corrupt_offset", u64::MAX)?.unwrap_or(0);
    let corrupt_value = p.optional_uint("corrupt_value", 255)?.unwrap_or(0) as u8;
    p.spdk_only(&[("nvme_sct", Neutral::Absent), ("nvme_sc", Neutral::Absent)])?;
    p.finish()?;
    let kinds: Vec<usize> = match io_type.as_str() {
        "clear" => Vec::new(),
        "all" => (0..IO_TYPES.len()).collect(),
        t => match IO_TYPES.iter().position(|n| *n == t) {
            Some(k) => vec![k],
            None => {
                let reason =
                    format!("'{}' is not one of {}, all, clear", t.escape_debug(), IO_TYPES.join(", "));
                return Err(ParamError::new("io_type", reason).into());
            }
        },
    };
    let error_type = ErrorType::from_name(&error_type).ok_or_else(|| {
        let reason = if error_type == "nvme_failure" {
            "nvme_failure is not supported: flashpath's bdevs carry no NVMe status".to_string()
        } else {
            format!("'{}' is not one of {}", error_type.escape_debug(), ErrorType::NAMES.join(", "))
        };
        ParamError::new("error_type", reason)
    })?;
    let dev = device(host, &name)?;
    let dev = as_error(&dev);
    if io_type == "clear" {
        dev.clear();
        log::info!("bdev '{name}': injections cleared");
    } else {
        let inj = Injection { error_type, num, queue_depth, corrupt_offset, corrupt_value };
        dev.inject(&kinds, inj)?;
        log::info!("bdev '{name}': {} {io_type} error(s) of type {} injected", num, error_type.name());
    }
    Ok(Value::Bool(true))
}

/// `name`: the `pending` injections end and held requests go to the base.
fn resume_pending(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    as_error(&device(host, &name)?).resume_pending();
    Ok(Value::Bool(true))
}
