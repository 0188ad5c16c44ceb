//! The backup job methods: `bdev_backup_start`, `bdev_backup_get_jobs`, `bdev_backup_cancel`,
//! `bdev_backup_set_speed`. SPDK has no backups; the names follow the mirror jobs'
//! (`bdev_<what>_<verb>`), the model is QEMU's `blockdev-backup` (`sync: full|incremental`,
//! `bitmap`, `speed` in bytes per second) with `query-block-jobs`' state names where they mean
//! the same. docs/backup.md, "Backup jobs".

use fp_rpc::Params;
use serde_json::{json, Value};

use super::MethodError;
use crate::{BackupSpec, BackupStatus, Registry, BACKUP_WAIT};

/// The most uploads one job keeps in flight.
const MAX_PARALLEL: u64 = 64;

fn job_json(s: &BackupStatus) -> Value {
    let p = &s.progress;
    json!({
        "job_id": s.job_id,
        "bdev": s.bdev,
        "store": s.store,
        "sync": s.sync,
        "bitmap": s.bitmap,
        "state": s.state.name(),
        "backup_id": s.backup_id,
        "error": s.error,
        "progress": {
            "chunks_total": p.chunks_total,
            "chunks_read": p.chunks_read,
            "chunks_zero": p.chunks_zero,
            "chunks_skipped": p.chunks_skipped,
            "chunks_uploaded": p.chunks_uploaded,
            "bytes_read": p.bytes_read,
            "bytes_uploaded": p.bytes_uploaded,
        },
        "speed": s.speed,
        "read_rate": s.read_rate,
    })
}

/// `{bdev, store, sync, job_id?, bitmap?, granularity?, parent?, chunk_size?, key?, parallel?,
/// speed?}` -> the job's id, once the point in time is made.
pub(crate) fn bdev_backup_start(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let spec = BackupSpec {
        bdev: p.required_str("bdev")?,
        store: p.required_str("store")?,
        job_id: p.optional_str("job_id")?,
        sync: p.required_str("sync")?,
        bitmap: p.optional_str("bitmap")?,
        granularity: p.optional_uint("granularity", u64::MAX)?,
        parent: p.optional_str("parent")?,
        chunk_size: p.optional_uint("chunk_size", u64::MAX)?,
        key: p.optional_str("key")?,
        parallel: p.optional_uint("parallel", MAX_PARALLEL)?,
        speed: p.optional_uint("speed", u64::MAX)?.unwrap_or(0),
    };
    p.finish()?;
    Ok(json!(registry.backup_start(spec)?))
}

/// `{job_id?}` -> every job (or the one named), those that ended included until dismissed.
pub(crate) fn bdev_backup_get_jobs(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let job_id = p.optional_str("job_id")?;
    p.finish()?;
    Ok(registry.backup_jobs(job_id.as_deref())?.iter().map(job_json).collect())
}

/// `{job_id}`: cancels a running job (returns once it ended, its bitmap's bits merged back), or
/// dismisses one that ended.
pub(crate) fn bdev_backup_cancel(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let job_id = p.required_str("job_id")?;
    p.finish()?;
    registry.backup_cancel(&job_id, BACKUP_WAIT)?;
    Ok(json!(true))
}

/// `{job_id, speed}`: the job's new read speed limit in bytes per second (0: none).
pub(crate) fn bdev_backup_set_speed(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let job_id = p.required_str("job_id")?;
    let speed = p.required_uint("speed", u64::MAX)?;
    p.finish()?;
    registry.backup_set_speed(&job_id, speed)?;
    Ok(json!(true))
}
