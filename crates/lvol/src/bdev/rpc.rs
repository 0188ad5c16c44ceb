//! SPDK's `bdev_lvol_*` methods, and examine: a bdev that appears carrying an lvstore has it
//! loaded, its volumes added as bdevs named by UUID with the alias `lvs/lvol`.
//!
//! Where SPDK rounds `size_in_mib` up to whole clusters, flashpath refuses it naming the field
//! (a volume is never silently larger than asked). `clear_method` is accepted and checked, but
//! clusters are zeroed (or copied) when allocated, so no method ever exposes old data.

use std::any::Any;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use fp_bdev::module::{BdevModule, ModuleError, ModuleHost, ModuleMethodFn, NewBdev};
use fp_bdev::{BdevInfo, BlockDevice, ClaimType};
use fp_rpc::{Neutral, ParamError, Params};
use serde_json::{json, Map, Value};

use super::copy::{self, CopyState, ShallowCopy};
use super::{new_uuid, LvStore, LvolDevice};
use crate::{check_name, LvolError, StoreOptions, Uuid};

const MODULE: &str = "lvol";
/// The claim holder kind an lvstore takes its base with.
const HOLDER: &str = "lvstore";
const MIB: u64 = 1 << 20;
const DEFAULT_CLUSTER: u64 = 4 * MIB;
/// The claim holder kind a store takes its external parents with (one claim per store and
/// bdev, the store's UUID the holder).
const ESNAP_HOLDER: &str = "lvol_esnap";
const CLEAR_METHODS: [&str; 3] = ["none", "unmap", "write_zeroes"];

/// A volume's clear methods: the store's, and SPDK's `default` (the store's method).
const VOLUME_CLEAR_METHODS: [&str; 4] = ["none", "unmap", "write_zeroes", "default"];

/// The lvol module.
pub struct LvolModule;

/// The open stores of one registry, and its shallow copies (kept for their status, as SPDK
/// keeps them; each is a few words).
#[derive(Default)]
struct Stores(Mutex<Vec<Arc<LvStore>>>, Mutex<Vec<Arc<ShallowCopy>>>, AtomicU32);

fn stores(host: &dyn ModuleHost) -> Arc<dyn Any + Send + Sync> {
    host.module_state(MODULE, &|| Arc::new(Stores::default()))
}

fn with_stores<R>(host: &dyn ModuleHost, f: impl FnOnce(&mut Vec<Arc<LvStore>>) -> R) -> R {
    let state = stores(host);
    let s = state.downcast_ref::<Stores>().expect("the lvol module's state");
    let mut list = s.0.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut list)
}

/// The next shallow copy's id.
fn next_copy_id(host: &dyn ModuleHost) -> u32 {
    let state = stores(host);
    state.downcast_ref::<Stores>().expect("the lvol module's state").2.fetch_add(1, Ordering::Relaxed)
}

fn with_copies<R>(host: &dyn ModuleHost, f: impl FnOnce(&mut Vec<Arc<ShallowCopy>>) -> R) -> R {
    let state = stores(host);
    let s = state.downcast_ref::<Stores>().expect("the lvol module's state");
    let mut list = s.1.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut list)
}

fn lvol_error(e: LvolError) -> ModuleError {
    match e {
        LvolError::Invalid { field, reason } | LvolError::State { field, reason } => {
            ParamError::new(field, reason).into()
        }
        LvolError::NotFound { field, value } => ParamError::new(field, format!("no volume '{value}'")).into(),
        LvolError::Exists { field, value } => {
            ParamError::new(field, format!("'{value}' already exists")).into()
        }
        // Store and volume I/O failures.
        other => ModuleError::module(-libc::EIO, other),
    }
}

fn alias(lvs: &str, lvol: &str) -> String {
    format!("{lvs}/{lvol}")
}

impl BdevModule for LvolModule {
    fn name(&self) -> &'static str {
        MODULE
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_lvol_create_lvstore", create_lvstore),
            ("bdev_lvol_delete_lvstore", delete_lvstore),
            ("bdev_lvol_rename_lvstore", rename_lvstore),
            ("bdev_lvol_get_lvstores", get_lvstores),
            ("bdev_lvol_create", create),
            ("bdev_lvol_delete", delete),
            ("bdev_lvol_resize", resize),
            ("bdev_lvol_set_read_only", set_read_only),
            ("bdev_lvol_rename", rename),
            ("bdev_lvol_snapshot", snapshot),
            ("bdev_lvol_clone", clone),
            ("bdev_lvol_get_lvols", get_lvols),
            ("bdev_lvol_inflate", inflate),
            ("bdev_lvol_decouple_parent", decouple_parent),
            ("bdev_lvol_grow_lvstore", grow_lvstore),
            ("bdev_lvol_set_parent", set_parent),
            ("bdev_lvol_get_fragmap", get_fragmap),
            ("bdev_lvol_set_parent_bdev", set_parent_bdev),
            ("bdev_lvol_clone_bdev", clone_bdev),
            ("bdev_lvol_start_shallow_copy", start_shallow_copy),
            ("bdev_lvol_check_shallow_copy", check_shallow_copy),
        ]
    }

    /// Stores and volumes live on their base bdev and load with it (examine); they are made
    /// by RPC, once.
    fn configurable(&self) -> bool {
        false
    }

    fn driver_specific(&self, _info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let mut out = Map::new();
        if let Some(dev) = device.downcast_ref::<LvolDevice>() {
            out.insert("lvol_store_uuid".into(), Value::from(dev.lvs_uuid().to_string()));
        }
        out
    }

    fn examine(&self, host: &dyn ModuleHost, name: &str, driver: &'static str) {
        // Any bdev may be an external parent a store waits for.
        for lvs in with_stores(host, |l| l.clone()) {
            sync_externals(host, &lvs);
        }
        // A volume is never a base here, and a null bdev holds nothing.
        if driver == MODULE || driver == "null" {
            return;
        }
        let Some((bdev, _)) = host.bdev(name) else { return };
        let lvs = match LvStore::load(bdev, name) {
            Ok(Some(lvs)) => lvs,
            Ok(None) => return,
            Err(e) => {
                log::warn!("bdev '{name}': its lvstore cannot be loaded: {e}");
                return;
            }
        };
        let lvs_name = lvs.name();
        if with_stores(host, |l| l.iter().any(|s| s.name() == lvs_name || s.uuid() == lvs.uuid())) {
            log::warn!("bdev '{name}': lvstore '{lvs_name}' ({}) is already open; not loaded", lvs.uuid());
            return;
        }
        if let Err(e) = host.claim(name, HOLDER, &lvs.uuid().to_string(), ClaimType::ExclusiveWrite) {
            log::warn!("bdev '{name}': lvstore '{lvs_name}' not loaded: {e}");
            return;
        }
        let volumes = lvs.volumes().unwrap_or_default();
        for v in volumes {
            let Some(dev) = lvs.device(&v.uuid) else { continue };
            if let Err(e) = host.add_bdev(MODULE, NewBdev::new(dev).alias(alias(&lvs_name, &v.name))) {
                log::warn!("lvstore '{lvs_name}': volume '{}' not added: {e}", v.name);
            }
        }
        log::info!("bdev '{name}': lvstore '{lvs_name}' ({}) loaded", lvs.uuid());
        sync_externals(host, &lvs);
        with_stores(host, |l| l.push(lvs));
    }

    fn shutdown(&self, host: &dyn ModuleHost) {
        for lvs in with_stores(host, std::mem::take) {
            lvs.close();
        }
    }
}

/// The store named by exactly one of `uuid_field` (a UUID) or `name_field`.
fn find_store(
    host: &dyn ModuleHost,
    p: &mut Params,
    uuid_field: &'static str,
    name_field: &'static str,
    required: bool,
) -> Result<Option<Arc<LvStore>>, ModuleError> {
    let uuid = p.optional_str(uuid_field)?;
    let name = p.optional_str(name_field)?;
    let found = match (uuid, name) {
        (Some(_), Some(_)) => {
            return Err(ParamError::new(
                name_field,
                format!("give either {uuid_field} or {name_field}, not both"),
            )
            .into())
        }
        (None, None) if required => {
            return Err(ParamError::new(name_field, format!("required (or {uuid_field})")).into())
        }
        (None, None) => return Ok(None),
        (Some(u), None) => {
            let parsed =
                Uuid::parse(&u).ok_or_else(|| ParamError::new(uuid_field, format!("'{u}' is not a UUID")))?;
            with_stores(host, |l| l.iter().find(|s| s.uuid() == parsed).cloned())
                .ok_or_else(|| ParamError::new(uuid_field, format!("no lvstore with UUID {u}")))?
        }
        (None, Some(n)) => with_stores(host, |l| l.iter().find(|s| s.name() == n).cloned())
            .ok_or_else(|| ParamError::new(name_field, format!("no lvstore named '{n}'")))?,
    };
    Ok(Some(found))
}

/// The store named by `uuid_field` or `lvs_name`, or every store when neither is given (the
/// listing methods' parameters).
fn listed(
    host: &dyn ModuleHost,
    mut p: Params,
    uuid_field: &'static str,
) -> Result<Vec<Arc<LvStore>>, ModuleError> {
    let one = find_store(host, &mut p, uuid_field, "lvs_name", false)?;
    p.finish()?;
    Ok(match one {
        Some(s) => vec![s],
        None => with_stores(host, |l| l.clone()),
    })
}

/// The volume a bdev name or alias names, with its store.
fn find_volume(
    host: &dyn ModuleHost,
    field: &'static str,
    name: &str,
) -> Result<(Arc<LvStore>, Arc<LvolDevice>), ModuleError> {
    let missing = || ParamError::new(field, format!("no logical volume '{name}'"));
    let canonical = host.bdev_name(name).ok_or_else(missing)?;
    let uuid = Uuid::parse(&canonical).ok_or_else(missing)?;
    let lvs =
        with_stores(host, |l| l.iter().find(|s| s.device(&uuid).is_some()).cloned()).ok_or_else(missing)?;
    let dev = lvs.device(&uuid).ok_or_else(missing)?;
    Ok((lvs, dev))
}

/// The volume size: `size_in_mib`, a non-zero whole number of the store's clusters, or the
/// byte-sized `size` clients before SPDK 23.05 send, rounded up to whole clusters as SPDK did
/// then. Both at once is refused naming `size`. Returns the bytes and the field they came from.
fn size_of(p: &mut Params, lvs: &LvStore) -> Result<(u64, &'static str), ModuleError> {
    let mib = p.optional_uint("size_in_mib", u64::MAX / MIB)?;
    let bytes = p.optional_uint("size", u64::MAX)?;
    let cs = lvs.cluster_size();
    let (bytes, field) = match (mib, bytes) {
        (Some(_), Some(_)) => {
            return Err(ParamError::new(
                "size",
                "give size_in_mib, or size in bytes (clients before SPDK 23.05), not both",
            )
            .into())
        }
        (None, None) => {
            return Err(ParamError::new("size_in_mib", "required (or size, in bytes)").into());
        }
        (Some(mib), None) => {
            let bytes = mib * MIB;
            if bytes == 0 || bytes % cs != 0 {
                return Err(ParamError::new(
                    "size_in_mib",
                    format!(
                        "{mib} MiB is not a non-zero multiple of the cluster size ({} MiB)",
                        cs as f64 / MIB as f64
                    ),
                )
                .into());
            }
            (bytes, "size_in_mib")
        }
        (None, Some(b)) => {
            let clusters = b.div_ceil(cs);
            if clusters == 0 {
                return Err(ParamError::new("size", "must not be 0").into());
            }
            let rounded = clusters
                .checked_mul(cs)
                .ok_or_else(|| ParamError::new("size", format!("{b} bytes is too large")))?;
            (rounded, "size")
        }
    };
    let info = lvs.info().map_err(lvol_error)?;
    let total = info.total_data_clusters * cs;
    if bytes > total {
        return Err(ParamError::new(
            field,
            format!("{bytes} bytes is larger than the lvstore's {total} bytes of data clusters"),
        )
        .into());
    }
    Ok((bytes, field))
}

/// Checks `clear_method` against `methods` (SPDK's names for the call).
fn clear_method(p: &mut Params, methods: &[&str]) -> Result<(), ModuleError> {
    if let Some(m) = p.optional_str("clear_method")? {
        if !methods.contains(&m.as_str()) {
            return Err(ParamError::new(
                "clear_method",
                format!("'{m}' is not one of {}", methods.join(", ")),
            )
            .into());
        }
    }
    Ok(())
}

fn create_lvstore(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let bdev_name = p.required_str("bdev_name")?;
    let lvs_name = p.required_str("lvs_name")?;
    let cluster_size = p.optional_uint("cluster_sz", 1 << 30)?.unwrap_or(DEFAULT_CLUSTER);
    clear_method(&mut p, &CLEAR_METHODS)?;
    p.spdk_only(&[("num_md_pages_per_cluster_ratio", Neutral::Absent), ("md_page_size", Neutral::Absent)])?;
    p.finish()?;
    check_name("lvs_name", &lvs_name).map_err(lvol_error)?;
    crate::format::check_geometry(cluster_size, 4096).map_err(|e| ParamError::new("cluster_sz", e))?;
    if with_stores(host, |l| l.iter().any(|s| s.name() == lvs_name)) {
        return Err(
            ParamError::new("lvs_name", format!("an lvstore named '{lvs_name}' already exists")).into()
        );
    }
    let (_, driver) = host
        .bdev(&bdev_name)
        .ok_or_else(|| ParamError::new("bdev_name", format!("no bdev '{bdev_name}'")))?;
    if driver == "null" || driver == MODULE {
        return Err(ParamError::new("bdev_name", format!("a {driver} bdev cannot hold an lvstore")).into());
    }
    let base_name = host.bdev_name(&bdev_name).unwrap_or(bdev_name.clone());
    let uuid = new_uuid();
    let holder = uuid.to_string();
    let base = host.claim(&base_name, HOLDER, &holder, ClaimType::ExclusiveWrite)?;
    let block_size = base.info().block_size;
    let opts = StoreOptions { name: lvs_name.clone(), uuid, cluster_size, block_size, area_pages: None };
    let lvs = match LvStore::create(base, &base_name, &opts) {
        Ok(l) => l,
        Err(e) => {
            host.release_claim(&base_name, HOLDER, &holder);
            return Err(match e {
                LvolError::Invalid { reason, .. } => ParamError::new("bdev_name", reason).into(),
                e => lvol_error(e),
            });
        }
    };
    log::info!("lvstore '{lvs_name}' ({uuid}) created on '{base_name}'");
    with_stores(host, |l| l.push(lvs));
    Ok(Value::from(holder))
}

fn delete_lvstore(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let lvs = find_store(host, &mut p, "uuid", "lvs_name", true)?.expect("required");
    p.finish()?;
    // All or nothing: every volume must be free before any goes.
    for dev in lvs.devices() {
        host.claimable(&dev.uuid().to_string(), ClaimType::ExclusiveWrite)?;
        if dev.shared.busy.load(Ordering::SeqCst) > 0 {
            let reason = format!("a shallow copy of volume {} is in progress", dev.uuid());
            return Err(ParamError::new("lvs_name", reason).into());
        }
    }
    for dev in lvs.devices() {
        host.delete_bdev(&dev.uuid().to_string(), MODULE)?;
    }
    let (_, attached) = lvs.externals().map_err(lvol_error)?;
    lvs.destroy().map_err(lvol_error)?;
    for name in attached {
        host.release_claim(&name, ESNAP_HOLDER, &lvs.uuid().to_string());
    }
    host.release_claim(lvs.base_name(), HOLDER, &lvs.uuid().to_string());
    with_stores(host, |l| l.retain(|s| !Arc::ptr_eq(s, &lvs)));
    log::info!("lvstore '{}' deleted", lvs.name());
    Ok(Value::Bool(true))
}

fn rename_lvstore(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let old = p.required_str("old_name")?;
    let new = p.required_str("new_name")?;
    p.finish()?;
    check_name("new_name", &new).map_err(lvol_error)?;
    let lvs = with_stores(host, |l| l.iter().find(|s| s.name() == old).cloned())
        .ok_or_else(|| ParamError::new("old_name", format!("no lvstore named '{old}'")))?;
    if old != new && with_stores(host, |l| l.iter().any(|s| s.name() == new)) {
        return Err(ParamError::new("new_name", format!("an lvstore named '{new}' already exists")).into());
    }
    let volumes = lvs.volumes().map_err(lvol_error)?;
    for v in &volumes {
        if host.bdev_name(&alias(&new, &v.name)).is_some_and(|owner| owner != v.uuid.to_string()) {
            return Err(ParamError::new("new_name", format!("bdev '{}' exists", alias(&new, &v.name))).into());
        }
    }
    lvs.rename(&new).map_err(lvol_error)?;
    for v in volumes {
        host.set_aliases(&v.uuid.to_string(), vec![alias(&new, &v.name)])?;
    }
    Ok(Value::Bool(true))
}

fn get_lvstores(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    let list = listed(host, p, "uuid")?;
    let mut out = Vec::new();
    for s in list {
        let i = s.info().map_err(lvol_error)?;
        out.push(json!({
            "uuid": i.uuid.to_string(),
            "name": i.name,
            "base_bdev": i.base_bdev,
            "total_data_clusters": i.total_data_clusters,
            "free_clusters": i.free_clusters,
            "block_size": i.block_size,
            "cluster_size": i.cluster_size,
        }));
    }
    Ok(Value::Array(out))
}

fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let lvs = find_store(host, &mut p, "uuid", "lvs_name", true)?.expect("required");
    let name = p.required_str("lvol_name")?;
    let (size, size_field) = size_of(&mut p, &lvs)?;
    let thin = p.optional_bool("thin_provision")?.unwrap_or(false);
    clear_method(&mut p, &VOLUME_CLEAR_METHODS)?;
    p.finish()?;
    let free = lvs.info().map_err(lvol_error)?.free_clusters * lvs.cluster_size();
    if !thin && size > free {
        return Err(ParamError::new(
            size_field,
            format!("a thick volume of {} MiB needs more than the {} MiB free", size / MIB, free / MIB),
        )
        .into());
    }
    check_name("lvol_name", &name).map_err(lvol_error)?;
    let a = alias(&lvs.name(), &name);
    if host.bdev_exists(&a) {
        return Err(ParamError::new("lvol_name", format!("bdev '{a}' already exists")).into());
    }
    host.check_new_bdev(&a)?;
    let dev = lvs.create_volume(&name, size, thin).map_err(lvol_error)?;
    let uuid = dev.uuid();
    if let Err(e) = host.add_bdev(MODULE, NewBdev::new(dev).alias(a)) {
        let _ = lvs.delete_volume(&uuid);
        return Err(e);
    }
    Ok(Value::from(uuid.to_string()))
}

fn delete(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "name", &name)?;
    lvs.check_delete(&dev.uuid()).map_err(as_name_field)?;
    host.delete_bdev(&dev.uuid().to_string(), MODULE)?;
    lvs.delete_volume(&dev.uuid()).map_err(lvol_error)?;
    sync_externals(host, &lvs);
    Ok(Value::Bool(true))
}

fn volume_info(lvs: &LvStore, uuid: &Uuid) -> Result<super::VolumeInfo, ModuleError> {
    lvs.volumes()
        .map_err(lvol_error)?
        .into_iter()
        .find(|v| v.uuid == *uuid)
        .ok_or_else(|| ParamError::new("name", format!("no logical volume {uuid}")).into())
}

fn resize(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let (lvs, dev) = find_volume(host, "name", &name)?;
    let (size, _) = size_of(&mut p, &lvs)?;
    p.finish()?;
    if volume_info(&lvs, &dev.uuid())?.snapshot {
        return Err(
            ParamError::new("name", format!("'{name}' is a snapshot, which cannot be resized")).into()
        );
    }
    let bs = u64::from(dev.info().block_size);
    host.resize_bdev(&dev.uuid().to_string(), MODULE, size / bs)?;
    Ok(Value::Bool(true))
}

fn set_read_only(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "name", &name)?;
    lvs.set_read_only(&dev.uuid()).map_err(lvol_error)?;
    Ok(Value::Bool(true))
}

fn rename(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let old = p.required_str("old_name")?;
    let new = p.required_str("new_name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "old_name", &old)?;
    check_name("new_name", &new).map_err(lvol_error)?;
    let a = alias(&lvs.name(), &new);
    if host.bdev_name(&a).is_some_and(|owner| owner != dev.uuid().to_string()) {
        return Err(ParamError::new("new_name", format!("bdev '{a}' exists")).into());
    }
    lvs.rename_volume(&dev.uuid(), &new).map_err(|e| match e {
        LvolError::Exists { value, .. } => {
            ParamError::new("new_name", format!("'{value}' already exists")).into()
        }
        e => lvol_error(e),
    })?;
    host.set_aliases(&dev.uuid().to_string(), vec![a])?;
    Ok(Value::Bool(true))
}

fn snapshot(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let lvol = p.required_str("lvol_name")?;
    let snap = p.required_str("snapshot_name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "lvol_name", &lvol)?;
    check_name("snapshot_name", &snap).map_err(lvol_error)?;
    if volume_info(&lvs, &dev.uuid())?.snapshot {
        return Err(ParamError::new(
            "lvol_name",
            format!("'{lvol}' is a snapshot; a snapshot of a snapshot is refused"),
        )
        .into());
    }
    let a = alias(&lvs.name(), &snap);
    host.check_new_bdev(&a).map_err(|_| ParamError::new("snapshot_name", format!("bdev '{a}' exists")))?;
    let s = lvs.snapshot(&dev.uuid(), &snap).map_err(|e| match e {
        LvolError::Exists { value, .. } => {
            ParamError::new("snapshot_name", format!("'{value}' already exists")).into()
        }
        e => lvol_error(e),
    })?;
    let uuid = s.uuid();
    if let Err(e) = host.add_bdev(MODULE, NewBdev::new(s).alias(a)) {
        // The snapshot is durable and the volume now reads through it; it stays in the store
        // and is listed by bdev_lvol_get_lvols, and comes back as a bdev on the next load.
        log::error!("snapshot '{snap}' ({uuid}) was taken but its bdev could not be added: {e}");
        return Err(e);
    }
    Ok(Value::from(uuid.to_string()))
}

fn clone(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let snap = p.required_str("snapshot_name")?;
    let name = p.required_str("clone_name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "snapshot_name", &snap)?;
    check_name("clone_name", &name).map_err(lvol_error)?;
    if !volume_info(&lvs, &dev.uuid())?.snapshot {
        return Err(ParamError::new(
            "snapshot_name",
            format!("'{snap}' is not a snapshot; only snapshots can be cloned"),
        )
        .into());
    }
    let a = alias(&lvs.name(), &name);
    host.check_new_bdev(&a).map_err(|_| ParamError::new("clone_name", format!("bdev '{a}' exists")))?;
    let c = lvs.clone_snapshot(&dev.uuid(), &name).map_err(lvol_error)?;
    let uuid = c.uuid();
    if let Err(e) = host.add_bdev(MODULE, NewBdev::new(c).alias(a)) {
        let _ = lvs.delete_volume(&uuid);
        return Err(e);
    }
    Ok(Value::from(uuid.to_string()))
}

fn get_lvols(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    let list = listed(host, p, "lvs_uuid")?;
    let mut out = Vec::new();
    for s in list {
        let lvs_name = s.name();
        for v in s.volumes().map_err(lvol_error)? {
            out.push(json!({
                "alias": alias(&lvs_name, &v.name),
                "uuid": v.uuid.to_string(),
                "name": v.name,
                "is_thin_provisioned": v.thin,
                "is_snapshot": v.snapshot,
                "is_clone": v.parent.is_some(),
                "is_esnap_clone": v.external.is_some(),
                "is_degraded": v.degraded,
                "num_allocated_clusters": v.allocated_clusters,
                "lvs": { "name": lvs_name, "uuid": s.uuid().to_string() },
            }));
            if let (Some(e), Some(last)) = (&v.external, out.last_mut()) {
                last["external_snapshot_name"] = Value::from(e.clone());
            }
        }
    }
    Ok(Value::Array(out))
}

/// The store's own field names are its own ("lvol"); the methods' parameter is `name`.
fn as_name_field(e: LvolError) -> ModuleError {
    match e {
        LvolError::State { field: "lvol", reason } | LvolError::Invalid { field: "lvol", reason } => {
            ParamError::new("name", reason).into()
        }
        e => lvol_error(e),
    }
}

fn inflate(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "name", &name)?;
    lvs.inflate(&dev.uuid()).map_err(as_name_field)?;
    sync_externals(host, &lvs);
    Ok(Value::Bool(true))
}

fn decouple_parent(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "name", &name)?;
    lvs.decouple_parent(&dev.uuid()).map_err(as_name_field)?;
    sync_externals(host, &lvs);
    Ok(Value::Bool(true))
}

fn grow_lvstore(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let lvs = find_store(host, &mut p, "uuid", "lvs_name", true)?.expect("required");
    p.finish()?;
    let grew = lvs.grow().map_err(lvol_error)?;
    log::info!("lvstore '{}': {}", lvs.name(), if grew { "grown" } else { "already fills its base" });
    Ok(Value::Bool(true))
}

/// SPDK's `bdev_lvol_set_parent`: `lvol_name` (a thin volume) becomes a clone of the snapshot
/// `parent_name` of the same store and size.
fn set_parent(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let lvol = p.required_str("lvol_name")?;
    let parent = p.required_str("parent_name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "lvol_name", &lvol)?;
    let (plvs, snap) = find_volume(host, "parent_name", &parent)?;
    if !Arc::ptr_eq(&lvs, &plvs) {
        return Err(ParamError::new(
            "parent_name",
            format!("'{parent}' is in lvstore '{}', '{lvol}' in '{}'", plvs.name(), lvs.name()),
        )
        .into());
    }
    lvs.set_parent(&dev.uuid(), &snap.uuid()).map_err(lvol_error)?;
    sync_externals(host, &lvs);
    Ok(Value::Bool(true))
}

/// Longhorn's `bdev_lvol_get_fragmap` (its SPDK fork, module/bdev/lvol/vbdev_lvol_rpc.c): which
/// clusters of `[offset, offset + size)` the volume `name` owns itself (not through a parent),
/// a bit each, least significant first, base64. `offset` and `size` are bytes, whole clusters;
/// `size` 0 or absent means to the end of the volume.
fn get_fragmap(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let offset = p.optional_uint("offset", u64::MAX)?.unwrap_or(0);
    let size = p.optional_uint("size", u64::MAX)?.unwrap_or(0);
    p.finish()?;
    let (lvs, dev) = find_volume(host, "name", &name)?;
    let cs = lvs.cluster_size();
    let vol_size = dev.info().size_bytes();
    if offset % cs != 0 || offset > vol_size {
        return Err(ParamError::new(
            "offset",
            format!(
                "{offset} is not a multiple of the cluster size {cs} inside the volume's {vol_size} bytes"
            ),
        )
        .into());
    }
    let size = if size == 0 { vol_size - offset } else { size };
    if size % cs != 0 || size > vol_size - offset {
        return Err(ParamError::new(
            "size",
            format!(
                "{size} bytes from {offset} is not a multiple of the cluster size {cs} inside the \
                 volume's {vol_size} bytes"
            ),
        )
        .into());
    }
    let (bits, allocated) = lvs.owned_bitmap(&dev.uuid(), offset, size).map_err(lvol_error)?;
    Ok(json!({
        "cluster_size": cs,
        "num_clusters": size / cs,
        "num_allocated_clusters": allocated,
        "fragmap": fp_bdev::disk::base64_encode(&bits),
    }))
}

/// SPDK's `bdev_lvol_start_shallow_copy`: the clusters the read-only volume `src_lvol_name`
/// owns, copied to the same offsets of `dst_bdev_name` (claimed for the copy's duration) in the
/// background. Returns the `operation_id` for `bdev_lvol_check_shallow_copy`.
fn start_shallow_copy(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let src = p.required_str("src_lvol_name")?;
    let dst = p.required_str("dst_bdev_name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "src_lvol_name", &src)?;
    let dst_name =
        host.bdev_name(&dst).ok_or_else(|| ParamError::new("dst_bdev_name", format!("no bdev '{dst}'")))?;
    if dst_name == dev.uuid().to_string() {
        return Err(ParamError::new("dst_bdev_name", "the volume itself").into());
    }
    let (vol_bs, dst_bs) = (dev.info().block_size, host.block_size(&dst_name)?);
    if vol_bs % dst_bs != 0 {
        return Err(ParamError::new(
            "dst_bdev_name",
            format!("block size {dst_bs} does not divide the volume's {vol_bs}"),
        )
        .into());
    }
    let id = next_copy_id(host);
    let holder = format!("{}#{id}", dev.uuid());
    let bdev = host.claim(&dst_name, copy::HOLDER, &holder, ClaimType::ExclusiveWrite)?;
    let release = copy::releaser(host, dst_name.clone(), holder.clone());
    match lvs.start_shallow_copy(id, &dev.uuid(), bdev, release) {
        Ok(op) => {
            with_copies(host, |l| l.push(op));
            Ok(json!({ "operation_id": id }))
        }
        Err(e) => {
            host.release_claim(&dst_name, copy::HOLDER, &holder);
            Err(lvol_error(e))
        }
    }
}

/// SPDK's `bdev_lvol_check_shallow_copy`: `state` ("in progress", "complete", "error"),
/// `copied_clusters`, `total_clusters`, and `error` when it failed.
fn check_shallow_copy(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let id = p.required_uint("operation_id", u64::from(u32::MAX))?;
    p.finish()?;
    let op = with_copies(host, |l| l.iter().find(|o| u64::from(o.id) == id).cloned())
        .ok_or_else(|| ParamError::new("operation_id", format!("no shallow copy {id}")))?;
    let mut out = json!({
        "copied_clusters": op.copied_clusters(),
        "total_clusters": op.total_clusters(),
    });
    let state = match op.state() {
        CopyState::InProgress => "in progress",
        CopyState::Complete => "complete",
        CopyState::Error(e) => {
            out["error"] = Value::from(e);
            "error"
        }
    };
    out["state"] = Value::from(state);
    Ok(out)
}

/// Claims and attaches the external parents the store's volumes name and that are present,
/// and lets go of those no volume names any more. A missing one is left for later: examine
/// calls this again whenever a bdev appears (SPDK's "missing esnap" until then).
fn sync_externals(host: &dyn ModuleHost, lvs: &LvStore) {
    let Ok((wanted, attached)) = lvs.externals() else { return };
    let holder = lvs.uuid().to_string();
    for name in wanted.iter().filter(|n| !attached.contains(n)) {
        if !host.bdev_exists(name) {
            continue;
        }
        match host.claim(name, ESNAP_HOLDER, &holder, ClaimType::ReadManyWriteNone) {
            Ok(bdev) => {
                if let Err(e) = lvs.attach_external(name, bdev) {
                    host.release_claim(name, ESNAP_HOLDER, &holder);
                    log::warn!("lvstore '{}': external snapshot '{name}' not attached: {e}", lvs.name());
                } else {
                    log::info!("lvstore '{}': external snapshot '{name}' attached", lvs.name());
                }
            }
            Err(e) => {
                log::warn!("lvstore '{}': external snapshot '{name}' cannot be claimed: {e}", lvs.name())
            }
        }
    }
    for name in attached.iter().filter(|n| !wanted.contains(n)) {
        let _ = lvs.detach_external(name);
        host.release_claim(name, ESNAP_HOLDER, &holder);
    }
}

/// The bdev `name` (`field`) as an external parent for `lvs`: its canonical name and size. Not
/// one of the store's own volumes (the store's owner would wait on itself), and claimable
/// read-many-write-none (nobody writes it) unless the store holds it already.
fn external_bdev(
    host: &dyn ModuleHost,
    lvs: &LvStore,
    field: &'static str,
    name: &str,
) -> Result<(String, u64), ModuleError> {
    let canonical =
        host.bdev_name(name).ok_or_else(|| ParamError::new(field, format!("no bdev '{name}'")))?;
    if Uuid::parse(&canonical).is_some_and(|u| lvs.device(&u).is_some()) {
        return Err(ParamError::new(field, format!("'{name}' is a volume of the same lvstore")).into());
    }
    let (bdev, _) =
        host.bdev(&canonical).ok_or_else(|| ParamError::new(field, format!("no bdev '{name}'")))?;
    // The owner reads it in the volumes' blocks.
    let (ext_bs, bs) = (bdev.info().block_size, lvs.info().map_err(lvol_error)?.block_size);
    if ext_bs > bs {
        return Err(
            ParamError::new(field, format!("block size {ext_bs} is larger than the lvstore's {bs}")).into()
        );
    }
    let (_, attached) = lvs.externals().map_err(lvol_error)?;
    if !attached.contains(&canonical) {
        host.claimable(&canonical, ClaimType::ReadManyWriteNone)
            .map_err(|e| ParamError::new(field, format!("'{name}' cannot be claimed read-only: {e}")))?;
    }
    Ok((canonical, bdev.info().size_bytes()))
}

/// SPDK's `bdev_lvol_set_parent_bdev`: the thin volume `lvol_name` reads its unallocated
/// clusters from the bdev `parent_name` (an external snapshot, claimed read-many-write-none).
fn set_parent_bdev(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let lvol = p.required_str("lvol_name")?;
    let parent = p.required_str("parent_name")?;
    p.finish()?;
    let (lvs, dev) = find_volume(host, "lvol_name", &lvol)?;
    let (canonical, bytes) = external_bdev(host, &lvs, "parent_name", &parent)?;
    lvs.set_external_parent(&dev.uuid(), &canonical, bytes).map_err(lvol_error)?;
    sync_externals(host, &lvs);
    Ok(Value::Bool(true))
}

/// SPDK's `bdev_lvol_clone_bdev`: a thin clone `clone_name` in `lvs_name` of the bdev `bdev`
/// (an external snapshot, claimed read-many-write-none as SPDK does). Returns its UUID.
fn clone_bdev(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let bdev = p.required_str("bdev")?;
    let lvs_name = p.required_str("lvs_name")?;
    let name = p.required_str("clone_name")?;
    p.finish()?;
    let lvs = with_stores(host, |l| l.iter().find(|s| s.name() == lvs_name).cloned())
        .ok_or_else(|| ParamError::new("lvs_name", format!("no lvstore named '{lvs_name}'")))?;
    check_name("clone_name", &name).map_err(lvol_error)?;
    let (canonical, bytes) = external_bdev(host, &lvs, "bdev", &bdev)?;
    let a = alias(&lvs.name(), &name);
    host.check_new_bdev(&a).map_err(|_| ParamError::new("clone_name", format!("bdev '{a}' exists")))?;
    let c = lvs.clone_external(&name, &canonical, bytes).map_err(lvol_error)?;
    let uuid = c.uuid();
    sync_externals(host, &lvs);
    if let Err(e) = host.add_bdev(MODULE, NewBdev::new(c).alias(a)) {
        let _ = lvs.delete_volume(&uuid);
        sync_externals(host, &lvs);
        return Err(e);
    }
    Ok(Value::from(uuid.to_string()))
}
