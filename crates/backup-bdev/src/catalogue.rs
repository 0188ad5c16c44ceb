//! The catalogue methods over a named store: `backup_list`, `backup_get`, `backup_verify`,
//! `backup_delete`, `backup_gc`. They block on the store (a control thread's wait, bounded by
//! fp-backup's request timeouts and retries), never on a reactor.

use std::time::Duration;

use fp_backup::{BackupKind, Manifest, GC_GRACE};
use fp_bdev::module::{ModuleError, ModuleHost};
use fp_rpc::Params;
use serde_json::{json, Value};

use crate::error::backup_error;
use crate::stores::{backup_key, stores};

/// The longest GC grace period accepted: 30 days.
const MAX_GRACE_SEC: u64 = 30 * 24 * 3600;

fn kind_name(kind: BackupKind) -> &'static str {
    match kind {
        BackupKind::Full => "full",
        BackupKind::Incremental => "incremental",
    }
}

/// One backup as the catalogue methods show it: what the manifest says, never key material
/// (`key` is the keyring name an encrypted backup was made with).
pub(crate) fn describe(m: &Manifest) -> Value {
    let zero = m.chunks.iter().filter(|c| c.is_none()).count();
    json!({
        "bdev": m.disk,
        "backup_id": m.id,
        "kind": kind_name(m.kind),
        "created": m.created,
        "size": m.disk_size,
        "chunk_size": m.chunk_size,
        "chunks": m.chunks.len(),
        "zero_chunks": zero,
        "parent": m.parent,
        "key": m.key_id,
    })
}

/// `backup_list {store, bdev?}`: every backup (of `bdev`), oldest first per disk. A backup
/// whose manifest cannot be read is listed with its `error`, not skipped.
pub(crate) fn list(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let store = p.required_str("store")?;
    let bdev = p.optional_str("bdev")?;
    p.finish()?;
    let store = stores(host).get(&store)?;
    let found = store.list(bdev.as_deref()).map_err(backup_error)?;
    let list = found
        .into_iter()
        .map(|b| match &b.manifest {
            Ok(m) => describe(m),
            Err(e) => json!({"bdev": b.disk, "backup_id": b.id, "error": e}),
        })
        .collect();
    Ok(Value::Array(list))
}

/// `backup_get {store, bdev, backup_id}`: one backup's description.
pub(crate) fn get(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let store = p.required_str("store")?;
    let bdev = p.required_str("bdev")?;
    let id = p.required_str("backup_id")?;
    p.finish()?;
    let store = stores(host).get(&store)?;
    let m = store.manifest(&bdev, &id, None).map_err(backup_error)?;
    Ok(describe(&m))
}

/// `backup_verify {store, bdev, backup_id, quick?, key?}` -> `{ok, chunks_checked, missing,
/// corrupt}`: `quick` asks whether each chunk is there; otherwise each is fetched and checked
/// (an encrypted backup's with `key`, a keyring name).
pub(crate) fn verify(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let store = p.required_str("store")?;
    let bdev = p.required_str("bdev")?;
    let id = p.required_str("backup_id")?;
    let quick = p.optional_bool("quick")?.unwrap_or(false);
    let key = p.optional_str("key")?;
    p.finish()?;
    let store = stores(host).get(&store)?;
    let key = key.map(|k| backup_key(host, &k)).transpose()?;
    let m = store.manifest(&bdev, &id, key.as_deref()).map_err(backup_error)?;
    let report = store.verify(&m, key.as_deref(), quick).map_err(backup_error)?;
    let missing: Vec<Value> =
        report.missing.iter().map(|(index, id)| json!({"chunk": index, "id": id.to_hex()})).collect();
    let corrupt: Vec<Value> = report
        .corrupt
        .iter()
        .map(|(index, id, why)| json!({"chunk": index, "id": id.to_hex(), "error": why}))
        .collect();
    Ok(json!({
        "ok": report.is_ok(),
        "chunks_checked": report.chunks_checked,
        "missing": missing,
        "corrupt": corrupt,
    }))
}

/// `backup_delete {store, bdev, backup_id}`: the manifest only; a GC collects the chunks no
/// other backup refers to.
pub(crate) fn delete(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let store_name = p.required_str("store")?;
    let bdev = p.required_str("bdev")?;
    let id = p.required_str("backup_id")?;
    p.finish()?;
    let store = stores(host).get(&store_name)?;
    store.delete(&bdev, &id).map_err(backup_error)?;
    log::info!("backup {id} of {bdev} deleted from store '{store_name}'");
    Ok(Value::Bool(true))
}

/// `backup_gc {store, grace_sec?}` -> what it did. `grace_sec` (default 3600): chunks younger
/// than this are kept, since a backup in another process uploads chunks before its manifest.
pub(crate) fn gc(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let store_name = p.required_str("store")?;
    let grace = p.optional_uint("grace_sec", MAX_GRACE_SEC)?.map(Duration::from_secs).unwrap_or(GC_GRACE);
    p.finish()?;
    let store = stores(host).get(&store_name)?;
    let r = store.gc(grace).map_err(backup_error)?;
    Ok(json!({
        "manifests": r.manifests,
        "chunks_seen": r.chunks_seen,
        "chunks_referenced": r.chunks_referenced,
        "chunks_young": r.chunks_young,
        "chunks_deleted": r.chunks_deleted,
        "bytes_deleted": r.bytes_deleted,
        "foreign_objects": r.foreign_objects,
    }))
}
