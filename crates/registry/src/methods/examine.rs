//! `bdev_set_options` (its `bdev_auto_examine`) and `bdev_examine`: whether the bdev modules
//! look at new bdevs for their metadata (`crate::examine`).

use fp_rpc::{Neutral, Params};
use serde_json::Value;

use super::MethodError;
use crate::{modules, Registry, RegistryError};

/// `bdev_set_options {bdev_auto_examine}`. SPDK's bdev_io pool and iobuf cache sizes have no
/// counterpart here (requests live in each frontend's fixed slots): refused unless absent.
pub(super) fn bdev_set_options(r: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let auto = p.optional_bool("bdev_auto_examine")?;
    p.spdk_only(&[
        ("bdev_io_pool_size", Neutral::Absent),
        ("bdev_io_cache_size", Neutral::Absent),
        ("iobuf_small_cache_size", Neutral::Absent),
        ("iobuf_large_cache_size", Neutral::Absent),
    ])?;
    p.finish()?;
    if let Some(auto) = auto {
        r.examine_gate().set_auto(auto);
        log::info!("bdev auto-examine {}", if auto { "on" } else { "off" });
    }
    Ok(Value::Bool(true))
}

/// `bdev_examine {name}`: with auto-examine off, examines bdev `name` now if it exists, and
/// whenever a bdev of that name appears later (SPDK's semantics). Refused while auto-examine
/// is on, as SPDK does: every bdev is examined anyway.
pub(super) fn bdev_examine(r: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let mut gate = r.examine_gate();
    if gate.auto() {
        return Err(RegistryError::Invalid {
            field: "name",
            reason:
                "bdev_auto_examine is on: every bdev is examined (bdev_set_options --no-auto-examine first)"
                    .into(),
        }
        .into());
    }
    gate.allow(&name);
    drop(gate);
    let found = r.lock().entry(&name).map(|e| (e.bdev.info().name.clone(), e.module));
    if let Some((canonical, module)) = found {
        for m in modules::MODULES {
            m.examine(r, &canonical, module);
        }
    }
    Ok(Value::Bool(true))
}
