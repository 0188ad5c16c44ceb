//! The dirty bitmap methods: `bdev_dirty_bitmap_add`, `_remove`, `_clear`, `_enable`,
//! `_disable`, `_merge`, `_list`, `_get_extents`. SPDK has none; the operations and their
//! parameters are QEMU's (`block-dirty-bitmap-add {node, name, granularity, persistent,
//! disabled}`, `block-dirty-bitmap-merge {node, target, bitmaps}`, `query-block`'s
//! `dirty-bitmaps` fields) under flashpath's `bdev_` naming, with `bdev` for QEMU's `node`.
//! Every refusal names its field and changes nothing.

use fp_bdev::disk::{
    check_granularity, BitmapError, DirtyBitmap, DEFAULT_BITMAP_GRANULARITY, MAX_BITMAP_GRANULARITY,
    MAX_EXTENTS,
};
use fp_bdev::{BlockDevice, Disk};
use fp_rpc::Params;
use serde_json::{json, Value};

use super::MethodError;
use crate::bitmaps::refused;
use crate::{Registry, RegistryError};

/// QEMU's longest bitmap name.
pub const MAX_BITMAP_NAME: usize = 1023;

fn bitmap_name(p: &mut Params, field: &'static str) -> Result<String, MethodError> {
    let name = p.required_str(field)?;
    check_name(field, &name)?;
    Ok(name)
}

/// A bitmap name: 1 to 1023 bytes of printable characters, no `/` (persistent bitmaps are
/// files named after it).
fn check_name(field: &'static str, name: &str) -> Result<(), MethodError> {
    if name.is_empty() || name.len() > MAX_BITMAP_NAME || name.chars().any(|c| c.is_control() || c == '/') {
        let reason = format!("a bitmap name is 1 to {MAX_BITMAP_NAME} bytes, no '/' or control characters");
        return Err(RegistryError::Invalid { field, reason }.into());
    }
    Ok(())
}

/// `{bdev, name, granularity?, persistent?, disabled?}` -> true.
pub(crate) fn bdev_dirty_bitmap_add(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let bdev = p.required_str("bdev")?;
    let name = bitmap_name(&mut p, "name")?;
    let granularity = p.optional_uint("granularity", MAX_BITMAP_GRANULARITY)?;
    let persistent = p.optional_bool("persistent")?.unwrap_or(false);
    let disabled = p.optional_bool("disabled")?.unwrap_or(false);
    p.finish()?;
    let granularity = check_granularity("granularity", granularity.unwrap_or(DEFAULT_BITMAP_GRANULARITY))
        .map_err(|e| refused("granularity", e))?;
    let disk = registry.disk(&bdev)?;
    let len = disk.info().size_bytes();
    let bitmap = DirtyBitmap::new(&name, len, granularity, persistent, !disabled);
    registry.add_dirty_bitmap(&bdev, &disk, bitmap)?;
    log::info!(
        "bdev '{bdev}': dirty bitmap '{name}' added (granularity {granularity}{}{})",
        if persistent { ", persistent" } else { "" },
        if disabled { ", disabled" } else { "" }
    );
    Ok(json!(true))
}

/// `{bdev, name}` -> true. Works on an inconsistent bitmap too (the only thing that does).
pub(crate) fn bdev_dirty_bitmap_remove(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    let (bdev, disk, name) = bdev_and_name(registry, p)?;
    registry.remove_dirty_bitmap(&bdev, &disk, &name)?;
    log::info!("bdev '{bdev}': dirty bitmap '{name}' removed");
    Ok(json!(true))
}

/// `{bdev, name}` -> true: every bit cleared.
pub(crate) fn bdev_dirty_bitmap_clear(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    let (bdev, disk, name) = bdev_and_name(registry, p)?;
    disk.clear_dirty_bitmap(&name).map_err(|e| refused("name", e))?;
    // The bits since the last backup are gone: an incremental from it would miss them.
    registry.forget_backup_parent(&bdev, &name);
    Ok(json!(true))
}

/// `{bdev, name}` -> true: completed writes mark it from now on.
pub(crate) fn bdev_dirty_bitmap_enable(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    set_recording(registry, p, true)
}

/// `{bdev, name}` -> true: completed writes no longer mark it.
pub(crate) fn bdev_dirty_bitmap_disable(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    set_recording(registry, p, false)
}

fn set_recording(registry: &Registry, p: Params, on: bool) -> Result<Value, MethodError> {
    let (bdev, disk, name) = bdev_and_name(registry, p)?;
    disk.set_dirty_bitmap_recording(&name, on).map_err(|e| refused("name", e))?;
    if !on {
        // Writes from now on are missed: an incremental from it would miss them.
        registry.forget_backup_parent(&bdev, &name);
    }
    Ok(json!(true))
}

/// `{bdev, name}`, checked, with the disk.
fn bdev_and_name(registry: &Registry, mut p: Params) -> Result<(String, Disk, String), MethodError> {
    let bdev = p.required_str("bdev")?;
    let name = bitmap_name(&mut p, "name")?;
    p.finish()?;
    let disk = registry.disk(&bdev)?;
    Ok((bdev, disk, name))
}

/// `{bdev, target, bitmaps: [names]}` -> true: `target` gets every bit of each of `bitmaps`,
/// which must have its granularity and size.
pub(crate) fn bdev_dirty_bitmap_merge(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let bdev = p.required_str("bdev")?;
    let target = bitmap_name(&mut p, "target")?;
    let bitmaps = p.optional_str_list("bitmaps")?.unwrap_or_default();
    p.finish()?;
    if bitmaps.is_empty() {
        return Err(RegistryError::Invalid {
            field: "bitmaps",
            reason: "required: at least one name".into(),
        }
        .into());
    }
    for b in &bitmaps {
        check_name("bitmaps", b)?;
    }
    let disk = registry.disk(&bdev)?;
    disk.merge_dirty_bitmaps(&target, &bitmaps).map_err(|e| {
        let field = match &e {
            BitmapError::NotFound { name, .. } | BitmapError::Inconsistent(name) if *name == target => {
                "target"
            }
            _ => "bitmaps",
        };
        refused(field, e)
    })?;
    Ok(json!(true))
}

/// `{bdev?}` -> each bitmap of the bdev (or of every bdev): QEMU's `query-block` fields plus
/// `bdev`.
pub(crate) fn bdev_dirty_bitmap_list(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let bdev = p.optional_str("bdev")?;
    p.finish()?;
    let disks = match bdev {
        Some(name) => vec![(name.clone(), registry.disk(&name)?)],
        None => registry.disks(),
    };
    let list: Vec<Value> = disks
        .iter()
        .flat_map(|(bdev, disk)| {
            disk.dirty_bitmaps().into_iter().map(move |b| {
                let i = b.info();
                json!({
                    "bdev": bdev,
                    "name": i.name,
                    "granularity": i.granularity,
                    "recording": i.recording,
                    "persistent": i.persistent,
                    "inconsistent": i.inconsistent,
                    "count": i.count,
                    "busy": i.busy,
                })
            })
        })
        .collect();
    Ok(Value::Array(list))
}

/// `{bdev, name, offset?, length?}` -> `{extents: [{offset, length}], next}`: the dirty runs
/// of the range (default: the whole disk) from a copy of the bits taken at the call, at most
/// [`MAX_EXTENTS`]; `next` is where to continue when the reply was cut, else null.
pub(crate) fn bdev_dirty_bitmap_get_extents(
    registry: &Registry,
    mut p: Params,
) -> Result<Value, MethodError> {
    let bdev = p.required_str("bdev")?;
    let name = bitmap_name(&mut p, "name")?;
    let offset = p.optional_uint("offset", u64::MAX)?.unwrap_or(0);
    let length = p.optional_uint("length", u64::MAX)?;
    p.finish()?;
    let disk = registry.disk(&bdev)?;
    let b = disk.dirty_bitmap(&name).map_err(|e| refused("name", e))?;
    if offset > b.len() {
        let reason = format!("{offset} is beyond the end of the bitmap ({} bytes)", b.len());
        return Err(RegistryError::Invalid { field: "offset", reason }.into());
    }
    let end = length.map_or(b.len(), |l| offset.saturating_add(l).min(b.len()));
    let extents = b.snapshot().extents(offset, end - offset, MAX_EXTENTS + 1);
    let next = (extents.len() > MAX_EXTENTS).then(|| extents[MAX_EXTENTS].0);
    let list: Vec<Value> =
        extents.iter().take(MAX_EXTENTS).map(|(o, l)| json!({ "offset": o, "length": l })).collect();
    Ok(json!({ "extents": list, "next": next }))
}
