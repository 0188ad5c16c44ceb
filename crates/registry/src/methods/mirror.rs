//! The mirror methods: `bdev_mirror_start`, `bdev_mirror_get_jobs`, `bdev_mirror_set_speed`,
//! `bdev_mirror_complete`, `bdev_mirror_cancel`. SPDK has no back-end mirror; the names follow its `bdev_<what>_<verb>`
//! pattern, and the job model is QEMU's (`blockdev-mirror`, `query-block-jobs`,
//! `block-job-set-speed`, `block-job-complete`, `block-job-cancel`; `speed` in bytes per
//! second as QEMU's) with its state names where they mean the same.
//! Complete and cancel wait until the job has let go of both disks, so a caller may use the
//! target (or delete it) as soon as they return.

use fp_bdev::copy_share::MAX_COPY_WEIGHT;
use fp_bdev::mirror::{MirrorStatus, MAX_GRANULARITY};
use fp_rpc::Params;
use serde_json::{json, Value};

use super::MethodError;
use crate::{MirrorSpec, Registry, MIRROR_WAIT};

fn job_json(s: &MirrorStatus) -> Value {
    let mut v = json!({
        "job_id": s.job_id,
        "source": s.source,
        "target": s.target,
        "state": s.state.name(),
        "len": s.len,
        "copied": s.copied,
        "dirty_bytes": s.dirty_bytes,
        "in_flight": s.in_flight,
        "granularity": s.granularity,
        "speed": s.speed,
        "weight": s.weight,
        "copy_mode": s.copy_mode.name(),
    });
    if let Some(e) = &s.error {
        v["error"] = json!(e);
    }
    v
}

/// `{source, target, job_id?, granularity?, speed?, weight?, copy_mode?}` -> the job's id.
pub(crate) fn bdev_mirror_start(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let source = p.required_str("source")?;
    let target = p.required_str("target")?;
    let job_id = p.optional_str("job_id")?;
    let granularity = p.optional_uint("granularity", MAX_GRANULARITY)?;
    let speed = p.optional_uint("speed", u64::MAX)?.unwrap_or(0);
    let weight = p.optional_uint("weight", u64::from(MAX_COPY_WEIGHT))?;
    let copy_mode = p.optional_str("copy_mode")?;
    p.finish()?;
    let id = registry.mirror_start(MirrorSpec {
        source,
        target,
        job_id,
        granularity,
        speed,
        weight,
        copy_mode,
    })?;
    Ok(json!(id))
}

/// `{job_id?}` -> every job (or the one named), those that ended included until dismissed.
pub(crate) fn bdev_mirror_get_jobs(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let job_id = p.optional_str("job_id")?;
    p.finish()?;
    let jobs = registry.mirror_jobs(job_id.as_deref())?;
    Ok(jobs.iter().map(job_json).collect())
}

/// `{job_id, speed}`: the copy's new speed limit in bytes per second (0: none).
pub(crate) fn bdev_mirror_set_speed(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let job_id = p.required_str("job_id")?;
    let speed = p.required_uint("speed", u64::MAX)?;
    p.finish()?;
    registry.mirror_set_speed(&job_id, speed)?;
    Ok(json!(true))
}

/// `{job_id}`: a ready job completes; returns once it has.
pub(crate) fn bdev_mirror_complete(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let job_id = p.required_str("job_id")?;
    p.finish()?;
    registry.mirror_complete(&job_id, MIRROR_WAIT)?;
    Ok(json!(true))
}

/// `{job_id}`: cancels a job (returns once it let go), or dismisses one that ended.
pub(crate) fn bdev_mirror_cancel(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let job_id = p.required_str("job_id")?;
    p.finish()?;
    registry.mirror_cancel(&job_id, MIRROR_WAIT)?;
    Ok(json!(true))
}
