//! The fleece methods: `bdev_fleece_create`, `bdev_fleece_delete`. SPDK has no point-in-time
//! view; the names follow its `bdev_<module>_create` / `_delete` pattern, the model is QEMU's
//! fleecing (a `copy-before-write` filter and a `snapshot-access` node), with SPDK's stacked
//! bdevs' parameter names (`name`, `base_bdev`).

use fp_bdev::fleece::MAX_FLEECE_GRANULARITY;
use fp_rpc::Params;
use serde_json::{json, Value};

use super::MethodError;
use crate::{FleeceSpec, Registry};

/// `{name, base_bdev, target_bdev, granularity?}` -> the new bdev's name.
pub(crate) fn bdev_fleece_create(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    let base_bdev = p.required_str("base_bdev")?;
    let target_bdev = p.required_str("target_bdev")?;
    let granularity = p.optional_uint("granularity", MAX_FLEECE_GRANULARITY)?;
    p.finish()?;
    let name = registry.fleece_create(FleeceSpec { name, base_bdev, target_bdev, granularity })?;
    Ok(json!(name))
}

/// `{name}`: the base's writes stop copying, the bdev goes, the target is released.
pub(crate) fn bdev_fleece_delete(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    p.finish()?;
    registry.fleece_delete(&name)?;
    Ok(json!(true))
}
