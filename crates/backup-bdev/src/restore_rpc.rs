//! `bdev_backup_restore_create` and its `driver_specific`.

use std::any::Any;
use std::sync::Arc;

use fp_backup::ChunkReader;
use fp_bdev::module::{ClaimType, ModuleError, ModuleHost, NewBdev};
use fp_rpc::{ParamError, Params};
use serde_json::{json, Map, Value};

use crate::error::backup_error;
use crate::restore::state_file::{Identity, StateFile};
use crate::restore::{Options, RestoreDevice};
use crate::stores::{backup_key, stores};

/// The module's name: its bdevs' module.
pub(crate) const MODULE: &str = "backup";

/// The most copier fetches in flight.
const MAX_PARALLEL: u64 = 64;
/// The most chunks read ahead.
const MAX_READ_AHEAD: u64 = 64;

/// `bdev_backup_restore_create {name, base_bdev, store, bdev, backup_id, key?, speed?,
/// parallel?, read_ahead?}` -> the name.
pub(crate) fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let base_name = p.required_str("base_bdev")?;
    let store_name = p.required_str("store")?;
    let disk = p.required_str("bdev")?;
    let backup_id = p.required_str("backup_id")?;
    let key = p.optional_str("key")?;
    let speed = p.optional_uint("speed", u64::MAX)?.unwrap_or(0);
    let parallel = p.optional_uint("parallel", MAX_PARALLEL)?.unwrap_or(4);
    let read_ahead = p.optional_uint("read_ahead", MAX_READ_AHEAD)?.unwrap_or(4);
    p.finish()?;
    if parallel == 0 {
        return Err(ParamError::new("parallel", format!("1 to {MAX_PARALLEL}")).into());
    }
    let Some(state_dir) = host.state_dir() else {
        return Err(ParamError::new(
            "name",
            "a live restore keeps which chunks are on its base in the daemon's state directory: \
             start the daemon with --state-dir (or state_dir in its configuration file)",
        )
        .into());
    };
    let store = stores(host).get(&store_name)?;
    let key = key.map(|k| backup_key(host, &k)).transpose()?;
    host.check_new_bdev(&name)?;
    let manifest = store.manifest(&disk, &backup_id, key.as_deref()).map_err(backup_error)?;
    let reader = ChunkReader::new(&store, Arc::new(manifest), key).map_err(backup_error)?;
    let m = reader.manifest();
    let base = host.claimable(&base_name, ClaimType::ExclusiveWrite)?;
    let b = base.info();
    if !m.disk_size.is_multiple_of(u64::from(b.block_size)) {
        return Err(ParamError::new(
            "base_bdev",
            format!("its block size {} does not divide the backup's size {}", b.block_size, m.disk_size),
        )
        .into());
    }
    if b.size_bytes() < m.disk_size {
        return Err(ParamError::new(
            "base_bdev",
            format!("'{base_name}' holds {} bytes; the backup's disk is {}", b.size_bytes(), m.disk_size),
        )
        .into());
    }
    // The name is also the state file's: no '/' (checked with the geometry, as every device's).
    fp_bdev::validate_geometry(&name, b.block_size, m.disk_size / u64::from(b.block_size))?;
    let identity = Identity {
        name: name.clone(),
        store: store_name.clone(),
        disk: disk.clone(),
        backup_id: backup_id.clone(),
        size: m.disk_size,
    };
    let file = StateFile::new(&state_dir, identity).map_err(|e| {
        ParamError::new("name", format!("cannot make its state folder in {}: {e}", state_dir.display()))
    })?;
    let options = Options { speed, parallel: parallel as usize, read_ahead };
    let dev = Arc::new(RestoreDevice::start(&name, base, &store_name, reader, file, options)?);
    let name = host.add_bdev(MODULE, NewBdev::new(dev).claiming(&base_name, ClaimType::ExclusiveWrite))?;
    log::info!(
        "bdev '{name}' restores backup {backup_id} of {disk} from store '{store_name}' onto '{base_name}'"
    );
    Ok(Value::from(name))
}

/// `bdev_backup_restore_delete {name}` -> true: deletes the restore bdev (refused while it is
/// open or exported, as any stacked bdev's delete) and abandons an incomplete restore: its
/// state file goes ([`RestoreDevice::abandon`]).
pub(crate) fn delete(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let device = host.module_device(&name, MODULE, "backup restore bdev")?;
    host.delete_bdev(&name, MODULE)?;
    let Ok(dev) = device.downcast::<RestoreDevice>() else { return Ok(Value::Bool(true)) };
    match dev.abandon() {
        Ok(true) => log::info!(
            "restore '{name}' deleted before it was complete: its state file {} removed (a new create \
             starts over)",
            dev.state_path().display()
        ),
        Ok(false) => log::info!("restore '{name}' deleted; it was complete"),
        Err(e) => {
            let path = dev.state_path().display().to_string();
            return Err(ModuleError::module(
                -e.raw_os_error().unwrap_or(libc::EIO),
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "bdev '{name}' deleted, but its state file {path} could not be removed: {e}; remove \
                         it before creating the restore again"
                    ),
                ),
            ));
        }
    }
    Ok(Value::Bool(true))
}

/// `driver_specific.backup_restore`.
pub(crate) fn driver_specific(device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
    let Some(dev) = device.downcast_ref::<RestoreDevice>() else { return Map::new() };
    let s = dev.status();
    let v = json!({
        "base_bdev": dev.base_name(),
        "store": s.store,
        "bdev": s.disk,
        "backup_id": s.backup_id,
        "chunks": s.chunks,
        "restored": s.restored,
        "state": s.phase.name(),
        "error": s.error,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}
