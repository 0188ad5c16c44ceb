//! The disk layer's methods: `bdev_get_iostat`, `bdev_reset_iostat`, `bdev_enable_histogram`,
//! `bdev_get_histogram`, with SPDK's parameters and result shapes.
//!
//! flashpath additions, all extra result fields: `queue_depth` always (SPDK prints it only with
//! queue-depth sampling on); the flush and write-zeroes counters beside SPDK's read, write and
//! unmap ones; `io_error` keyed by errno name (`"EIO"`, and `"unsupported"`), since flashpath's
//! backends report errnos where SPDK's report a status; `core` per channel; and
//! `bdev_get_histogram`'s `percentiles_us` (p50/p90/p99/p99.9, each the upper edge of its
//! bucket) and `count`; and what QoS held back (SPDK reports none of it): `qos_queued`
//! (waiting now, not reset), `qos_queued_total`, `qos_wait_ticks` and `qos_throttled_ticks`
//! (time with a request waiting, summed over channels). Latencies and the QoS times are in
//! ticks of `tick_rate` (the TSC where invariant).

use fp_bdev::clock::ticks;
use fp_bdev::disk::{self, HistogramError, IoStats, OpStats, ResetMode};
use fp_bdev::{Disk, IoOp};
use fp_rpc::{ParamError, Params};
use serde_json::{json, Map, Value};

use super::MethodError;
use crate::Registry;

/// SPDK's `name` or, as SPDK 26's client sends it, `names` (those bdevs, else all);
/// `per_channel` (one bdev's channels: needs exactly one name); `reset_mode` (reset what was
/// read, as `bdev_reset_iostat`'s `mode` after the read).
pub(crate) fn bdev_get_iostat(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.optional_str("name")?;
    let names = p.optional_str_list("names")?;
    let per_channel = p.optional_bool("per_channel")?.unwrap_or(false);
    let reset = reset_mode(&mut p, "reset_mode", None)?;
    p.finish()?;
    let list = names.is_some();
    let names = match (name, names) {
        (Some(_), Some(_)) => return Err(ParamError::new("names", "give name or names, not both").into()),
        (Some(n), None) => Some(vec![n]),
        (None, names) => names,
    };
    let rate = ticks::tick_rate();
    let disks = match (&names, list) {
        (Some(names), false) => names
            .iter()
            .map(|n| Ok((n.clone(), registry.disk(n)?)))
            .collect::<Result<Vec<_>, MethodError>>()?,
        // An unknown bdev in `names` keeps SPDK's code (-ENODEV) and names the field.
        (Some(names), true) => names
            .iter()
            .map(|n| match registry.disk(n) {
                Ok(d) => Ok((n.clone(), d)),
                Err(e) => Err(MethodError::Failed { code: e.errno(), message: format!("names: {e}") }),
            })
            .collect::<Result<Vec<_>, MethodError>>()?,
        (None, _) => registry.disks(),
    };
    let result = if per_channel {
        let (Some([_]), [(name, disk)]) = (names.as_deref(), disks.as_slice()) else {
            return Err(ParamError::new(
                "per_channel",
                "needs one bdev (name, or names with one): one bdev's channels at a time",
            )
            .into());
        };
        let channels: Vec<Value> = disk
            .channel_stats()
            .iter()
            .map(|c| {
                let mut v = stats_json(&c.stats);
                v["thread_id"] = json!(c.id);
                v["core"] = json!(c.core);
                v
            })
            .collect();
        json!({ "tick_rate": rate, "ticks": ticks::now(), "name": name, "channels": channels })
    } else {
        let bdevs: Vec<Value> = disks
            .iter()
            .map(|(name, disk)| {
                let mut v = stats_json(&disk.stats());
                v["name"] = json!(name);
                v
            })
            .collect();
        json!({ "tick_rate": rate, "ticks": ticks::now(), "bdevs": bdevs })
    };
    if let Some(mode) = reset {
        disks.iter().for_each(|(_, d)| d.reset(mode));
    }
    Ok(result)
}

/// A reset mode parameter (`field`): "all", "maxmin" or "none" (`None`); `absent` when not
/// given.
fn reset_mode(
    p: &mut Params,
    field: &'static str,
    absent: Option<ResetMode>,
) -> Result<Option<ResetMode>, ParamError> {
    match p.optional_str(field)?.as_deref() {
        None => Ok(absent),
        Some("all") => Ok(Some(ResetMode::All)),
        Some("maxmin") => Ok(Some(ResetMode::MaxMin)),
        Some("none") => Ok(None),
        Some(other) => {
            let reason = format!("'{}' is not one of all, maxmin, none", other.escape_debug());
            Err(ParamError::new(field, reason))
        }
    }
}

/// SPDK's `name` (else every bdev) and `mode`: "all" (the default), "maxmin" or "none".
pub(crate) fn bdev_reset_iostat(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.optional_str("name")?;
    let mode = reset_mode(&mut p, "mode", Some(ResetMode::All))?;
    p.finish()?;
    let disks = match name {
        Some(n) => vec![registry.disk(&n)?],
        None => registry.disks().into_iter().map(|(_, d)| d).collect(),
    };
    if let Some(mode) = mode {
        disks.iter().for_each(|d| d.reset(mode));
    }
    Ok(json!(true))
}

/// SPDK's `name` and `enable`. SPDK's `granularity`, `min_nsec`, `max_nsec` and `opc` are
/// accepted at what flashpath does: granularity 7 over the full range, every operation.
pub(crate) fn bdev_enable_histogram(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    let enable = p
        .optional_bool("enable")?
        .ok_or_else(|| ParamError::new("enable", "required parameter missing (true or false)"))?;
    p.unsupported("granularity", Some(json!(disk::HISTOGRAM_GRANULARITY)))?;
    for field in ["min_nsec", "max_nsec", "opc"] {
        p.unsupported(field, None)?;
    }
    p.finish()?;
    let disk = registry.disk(&name)?;
    disk.enable_histogram(enable).map_err(|e| histogram_error(&name, e))?;
    log::info!("bdev '{name}': latency histogram {}", if enable { "enabled" } else { "disabled" });
    Ok(json!(true))
}

/// SPDK's shape: `histogram` (base64 of the buckets), `granularity` (`bucket_shift` in older
/// SPDK, sent under both names), `min_range`, `max_range`, `tsc_rate`.
pub(crate) fn bdev_get_histogram(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let disk: Disk = registry.disk(&name)?;
    let h = disk.histogram().map_err(|e| histogram_error(&name, e))?;
    let rate = ticks::tick_rate();
    let us = |t: u64| ticks::ticks_to_ns(t, rate) as f64 / 1000.0;
    let percentiles = h
        .percentiles()
        .map(|p| json!({ "p50": us(p.p50), "p90": us(p.p90), "p99": us(p.p99), "p99_9": us(p.p999) }));
    Ok(json!({
        "histogram": h.to_base64(),
        "granularity": disk::HISTOGRAM_GRANULARITY,
        "bucket_shift": disk::HISTOGRAM_GRANULARITY,
        "min_range": 0,
        "max_range": disk::HISTOGRAM_MAX_RANGE,
        "tsc_rate": rate,
        "count": h.total(),
        "percentiles_us": percentiles,
    }))
}

fn histogram_error(name: &str, e: HistogramError) -> MethodError {
    // SPDK answers a histogram request on a bdev without one with EFAULT.
    let code = match e {
        HistogramError::NotEnabled => -libc::EFAULT,
        HistogramError::AccountingOff => -libc::EOPNOTSUPP,
    };
    MethodError::Failed { code, message: format!("bdev '{name}': {e}") }
}

/// One disk's counters under SPDK's names (`spdk_bdev_dump_io_stat_json`), plus flashpath's.
fn stats_json(s: &IoStats) -> Value {
    let mut v = Map::new();
    let mut put = |k: &str, x: u64| {
        v.insert(k.to_string(), json!(x));
    };
    let op = |o: IoOp| -> &OpStats { s.op(o) };
    // SPDK prints a minimum of "nothing yet" (its UINT64_MAX sentinel) as 0.
    let min = |o: &OpStats| if o.min_latency_ticks == u64::MAX { 0 } else { o.min_latency_ticks };
    put("bytes_read", op(IoOp::Read).bytes);
    put("num_read_ops", op(IoOp::Read).ops);
    put("bytes_written", op(IoOp::Write).bytes);
    put("num_write_ops", op(IoOp::Write).ops);
    put("bytes_unmapped", op(IoOp::Discard).bytes);
    put("num_unmap_ops", op(IoOp::Discard).ops);
    put("bytes_copied", 0);
    put("num_copy_ops", 0);
    for (prefix, o) in [
        ("read", op(IoOp::Read)),
        ("write", op(IoOp::Write)),
        ("unmap", op(IoOp::Discard)),
        ("flush", op(IoOp::Flush)),
        ("write_zeroes", op(IoOp::WriteZeroes)),
    ] {
        put(&format!("{prefix}_latency_ticks"), o.latency_ticks);
        put(&format!("max_{prefix}_latency_ticks"), o.max_latency_ticks);
        put(&format!("min_{prefix}_latency_ticks"), min(o));
    }
    put("copy_latency_ticks", 0);
    put("max_copy_latency_ticks", 0);
    put("min_copy_latency_ticks", 0);
    put("num_flush_ops", op(IoOp::Flush).ops);
    put("bytes_zeroed", op(IoOp::WriteZeroes).bytes);
    put("num_write_zeroes_ops", op(IoOp::WriteZeroes).ops);
    put("queue_depth", s.queue_depth);
    put("qos_queued", s.qos.queued);
    put("qos_queued_total", s.qos.queued_total);
    put("qos_wait_ticks", s.qos.wait_ticks);
    put("qos_throttled_ticks", s.qos.throttled_ticks);
    let mut errors = Map::new();
    for (errno, &n) in s.errno.iter().enumerate().filter(|(_, n)| **n > 0) {
        errors.insert(errno_name(errno), json!(n));
    }
    v.insert("io_error".into(), Value::Object(errors));
    Value::Object(v)
}

/// The name `io_error` counts an errno slot under.
fn errno_name(slot: usize) -> String {
    const NAMES: [(usize, &str); 10] = [
        (libc::EPERM as usize, "EPERM"),
        (libc::EIO as usize, "EIO"),
        (libc::ENXIO as usize, "ENXIO"),
        (libc::EBADF as usize, "EBADF"),
        (libc::ENOMEM as usize, "ENOMEM"),
        (libc::EAGAIN as usize, "EAGAIN"),
        (libc::EINVAL as usize, "EINVAL"),
        (libc::ENOSPC as usize, "ENOSPC"),
        (libc::EROFS as usize, "EROFS"),
        (libc::EOPNOTSUPP as usize, "EOPNOTSUPP"),
    ];
    match slot {
        0 => "unsupported".into(),
        s if s == disk::ERRNO_SLOTS - 1 => format!("errno_{s}_or_above"),
        s => NAMES.iter().find(|(n, _)| *n == s).map_or_else(|| format!("errno_{s}"), |(_, n)| n.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use fp_bdev::disk::{IoStats, QosStats};

    /// The QoS counters go out under their own names, each from its own field (a swap would pass
    /// a test of zeroes).
    #[test]
    fn qos_counters_are_reported_field_by_field() {
        let s = IoStats {
            queue_depth: 9,
            qos: QosStats { queued: 3, queued_total: 41, wait_ticks: 123_456, throttled_ticks: 7_890 },
            ..IoStats::default()
        };
        let v = super::stats_json(&s);
        assert_eq!(v["queue_depth"], 9);
        assert_eq!(v["qos_queued"], 3);
        assert_eq!(v["qos_queued_total"], 41);
        assert_eq!(v["qos_wait_ticks"], 123_456);
        assert_eq!(v["qos_throttled_ticks"], 7_890);
    }
}
