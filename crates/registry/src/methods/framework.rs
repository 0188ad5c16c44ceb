//! The daemon's own methods: `framework_get_reactors`, `rpc_get_methods`, `spdk_get_version`
//! (SPDK's shapes) and `flashpath_get_stats`.

use fp_rpc::Params;
use serde_json::{json, Value};

use super::MethodError;
use crate::Registry;

pub(crate) fn framework_get_reactors(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    p.finish()?;
    let reactors: Vec<Value> = registry
        .reactors()
        .iter()
        .map(|r| {
            let s = &r.stats;
            json!({
                "lcore": r.core.unwrap_or(r.id),
                "busy": s.busy_ns,
                // Everything that was not busy, asleep included, so busy / (busy + idle) is
                // the reactor's utilisation as SPDK tools compute it.
                "idle": s.idle_ns + s.sleep_ns,
                "irq": 0,
                "sys": 0,
                "usr": 0,
                "in_interrupt": s.sleeping,
                "lw_threads": [],
                "id": r.id,
                "poll_idle_ns": s.idle_ns,
                "sleep_ns": s.sleep_ns,
                "sleeps": s.sleeps,
                "rounds": s.rounds,
                "messages": s.messages,
                "pollers": s.pollers,
                // Idle pollers not polled until their fds fire (docs/architecture.md, "Many
                // queues on one reactor"), and how many times one was parked.
                "pollers_parked": s.parked,
                "parks": s.parks,
            })
        })
        .collect();
    // Our ticks are nanoseconds.
    Ok(json!({ "tick_rate": 1_000_000_000u64, "pid": std::process::id(), "reactors": reactors }))
}

pub(crate) fn rpc_get_methods(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    // SPDK's flags: every method is callable at any time here and none has aliases, so
    // both only need to be well-formed.
    p.optional_bool("current")?;
    p.optional_bool("include_aliases")?;
    p.finish()?;
    Ok(json!(registry.method_names()))
}

pub(crate) fn spdk_get_version(_: &Registry, p: Params) -> Result<Value, MethodError> {
    p.finish()?;
    let num = |s: &str| s.parse::<u64>().unwrap_or(0);
    let pre = env!("CARGO_PKG_VERSION_PRE");
    Ok(json!({
        "version": concat!("flashpath v", env!("CARGO_PKG_VERSION")),
        "fields": {
            "major": num(env!("CARGO_PKG_VERSION_MAJOR")),
            "minor": num(env!("CARGO_PKG_VERSION_MINOR")),
            "patch": num(env!("CARGO_PKG_VERSION_PATCH")),
            "suffix": if pre.is_empty() { String::new() } else { format!("-{pre}") },
        },
    }))
}

/// flashpath's own summary: uptime, counts, per-controller I/O counters and reactor totals.
pub(crate) fn flashpath_get_stats(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    p.finish()?;
    let ctrls = registry.controllers(None)?;
    let reactors = registry.reactors();
    let sum = |f: fn(&fp_reactor::ReactorStatsSnapshot) -> u64| -> u64 {
        reactors.iter().map(|r| f(&r.stats)).sum()
    };
    Ok(json!({
        "uptime_ns": registry.uptime().as_nanos() as u64,
        "num_bdevs": registry.bdevs(None)?.len(),
        "num_controllers": ctrls.len(),
        "controllers": ctrls.iter().map(|c| json!({
            "ctrlr": c.name,
            "bdev": c.bdev_name,
            "connected": c.connected,
            "stats": crate::exports::vhost_blk::rpc::stats_json(&c.stats),
        })).collect::<Vec<_>>(),
        "reactors": {
            "count": reactors.len(),
            "busy_ns": sum(|s| s.busy_ns),
            "poll_idle_ns": sum(|s| s.idle_ns),
            "sleep_ns": sum(|s| s.sleep_ns),
            "sleeps": sum(|s| s.sleeps),
            "rounds": sum(|s| s.rounds),
        },
    }))
}
