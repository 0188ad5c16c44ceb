//! The management methods: JSON parameters in, [`Registry`] calls, JSON results out.
//!
//! Names, parameters and result shapes follow SPDK's JSON-RPC, so SPDK's `rpc.py` and scripts
//! written for it work; flashpath's additions are extra result fields and a few extra
//! parameters (`direct`, `num_queues`). Unknown parameters are rejected, naming the field and
//! listing the accepted ones.
//!
//! The RPC server and the `--config` loader both come through [`Methods::call`], so a
//! configuration file is exactly a list of RPC calls and cannot drift from them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_registry::{BdevSummary, Registry, RegistryError, VhostBlkSpec};
use fp_rpc::{Neutral, ParamError, Params, RpcError};
use fp_vhost_blk::ControllerInfo;
use serde_json::{json, Value};

/// Why a method failed.
#[derive(Debug, thiserror::Error)]
pub enum MethodError {
    #[error("Method not found: '{0}'")]
    UnknownMethod(String),
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A failure with its own code (SPDK's negative errno) and message.
    #[error("{message}")]
    Failed { code: i32, message: String },
}

impl MethodError {
    /// The offending parameter and what is wrong with it, when the caller's parameters were
    /// wrong (whether the decoder or the target noticed).
    pub fn bad_param(&self) -> Option<(&str, &str)> {
        match self {
            MethodError::Param(p) | MethodError::Registry(RegistryError::Param(p)) => {
                Some((&p.field, &p.reason))
            }
            MethodError::Registry(RegistryError::Invalid { field, reason })
            | MethodError::Registry(RegistryError::NotAllowed { field, reason })
            | MethodError::Registry(RegistryError::Bdev(fp_bdev::BdevError::InvalidParam {
                field,
                reason,
            })) => Some((field, reason)),
            _ => None,
        }
    }

    /// The JSON-RPC error: -32601 / -32602 for the request's own faults, otherwise the negative
    /// errno SPDK would return, with the error's message.
    pub fn to_rpc(&self) -> RpcError {
        match self {
            MethodError::UnknownMethod(m) => RpcError::method_not_found(m),
            MethodError::Param(p) | MethodError::Registry(RegistryError::Param(p)) => p.clone().into(),
            MethodError::Registry(t) => match self.bad_param() {
                Some((field, reason)) if t.is_invalid_params() => {
                    RpcError::invalid_params(format!("{field}: {reason}"))
                }
                _ => RpcError::new(t.errno(), t.to_string()),
            },
            MethodError::Failed { code, message } => RpcError::new(*code, message.clone()),
        }
    }
}

type MethodFn = fn(&Methods, Params) -> Result<Value, MethodError>;

/// Every method that is not a bdev module's, by name; the modules' come from the registry
/// ([`Registry::call_module`]). `rpc_get_methods` lists both.
const METHODS: &[(&str, MethodFn)] = &[
    ("bdev_get_bdevs", Methods::bdev_get_bdevs),
    ("vhost_create_blk_controller", Methods::vhost_create_blk_controller),
    ("vhost_get_controllers", Methods::vhost_get_controllers),
    ("vhost_delete_controller", Methods::vhost_delete_controller),
    ("vhost_controller_set_coalescing", Methods::vhost_controller_set_coalescing),
    // NBD exports (methods/nbd.rs).
    ("nbd_start_disk", Methods::nbd_start_disk),
    ("nbd_stop_disk", Methods::nbd_stop_disk),
    ("nbd_get_disks", Methods::nbd_get_disks),
    ("framework_get_reactors", Methods::framework_get_reactors),
    ("rpc_get_methods", Methods::rpc_get_methods),
    ("spdk_get_version", Methods::spdk_get_version),
    ("flashpath_get_stats", Methods::flashpath_get_stats),
    // The disk layer (methods/iostat.rs).
    ("bdev_get_iostat", Methods::bdev_get_iostat),
    ("bdev_reset_iostat", Methods::bdev_reset_iostat),
    ("bdev_enable_histogram", Methods::bdev_enable_histogram),
    ("bdev_get_histogram", Methods::bdev_get_histogram),
    // QoS (methods/qos.rs).
    ("bdev_set_qos_limit", Methods::bdev_set_qos_limit),
    ("bdev_qos_group_create", Methods::bdev_qos_group_create),
    ("bdev_qos_group_set", Methods::bdev_qos_group_set),
    ("bdev_qos_group_delete", Methods::bdev_qos_group_delete),
    ("bdev_qos_group_add_bdev", Methods::bdev_qos_group_add_bdev),
    ("bdev_qos_group_remove_bdev", Methods::bdev_qos_group_remove_bdev),
    ("bdev_qos_group_set_weight", Methods::bdev_qos_group_set_weight),
    ("bdev_qos_get_groups", Methods::bdev_qos_get_groups),
];

/// The method implementations over one target.
pub struct Methods {
    registry: Arc<Registry>,
    started: Instant,
}

/// SPDK parameters of `vhost_create_blk_controller` that flashpath does not implement.
const VHOST_BLK_SPDK_ONLY: [(&str, Neutral); 3] = [
    ("transport", Neutral::Str("vhost_user_blk")),
    ("packed_ring", Neutral::Bool(false)),
    ("packed_ring_recovery", Neutral::Bool(false)),
];

/// The longest `bdev_get_bdevs` may be asked to wait for a bdev, in milliseconds.
const MAX_WAIT_MS: u64 = 60_000;

/// How long `bdev_get_bdevs` sleeps between looks while waiting for a bdev to appear.
const WAIT_STEP: Duration = Duration::from_millis(10);

impl Methods {
    pub fn new(registry: Arc<Registry>) -> Methods {
        Methods { registry, started: Instant::now() }
    }

    /// Runs `method` with `params`.
    pub fn call(&self, method: &str, params: Option<Value>) -> Result<Value, MethodError> {
        match METHODS.iter().find(|(name, _)| *name == method) {
            Some((_, f)) => f(self, Params::new(params)?),
            None => match self.registry.call_module(method, params) {
                Some(result) => Ok(result?),
                None => Err(MethodError::UnknownMethod(method.to_string())),
            },
        }
    }

    fn bdev_get_bdevs(&self, mut p: Params) -> Result<Value, MethodError> {
        let name = p.optional_str("name")?;
        // SPDK's `timeout` (ms): wait that long for the named bdev to appear. Bounded, because
        // a waiting call holds a connection thread and delays the server's stop.
        let timeout = Duration::from_millis(p.optional_uint("timeout", MAX_WAIT_MS)?.unwrap_or(0));
        p.finish()?;
        let deadline = Instant::now() + timeout;
        let bdevs = loop {
            match self.registry.bdevs(name.as_deref()) {
                Err(RegistryError::NotFound { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(WAIT_STEP)
                }
                other => break other?,
            }
        };
        Ok(Value::Array(bdevs.iter().map(bdev_json).collect()))
    }

    fn vhost_create_blk_controller(&self, mut p: Params) -> Result<Value, MethodError> {
        let spec = VhostBlkSpec {
            ctrlr: p.required_str("ctrlr")?,
            dev_name: p.required_str("dev_name")?,
            cpus: p.optional_str("cpumask")?.map(|m| parse_cpumask(&m)).transpose()?,
            readonly: p.optional_bool("readonly")?.unwrap_or(false),
            num_queues: p.optional_uint("num_queues", u16::MAX as u64)?.map(|q| q as u16),
        };
        p.spdk_only(&VHOST_BLK_SPDK_ONLY)?;
        p.finish()?;
        self.registry.create_vhost_blk(spec)?;
        Ok(json!(true))
    }

    fn vhost_get_controllers(&self, mut p: Params) -> Result<Value, MethodError> {
        let name = p.optional_str("name")?;
        p.finish()?;
        let ctrls = self.registry.controllers(name.as_deref())?;
        Ok(Value::Array(ctrls.iter().map(controller_json).collect()))
    }

    /// SPDK's shape: `ctrlr`, `delay_base_us`, `iops_threshold` (all required).
    fn vhost_controller_set_coalescing(&self, mut p: Params) -> Result<Value, MethodError> {
        let ctrlr = p.required_str("ctrlr")?;
        let delay = p.required_uint("delay_base_us", u64::from(u32::MAX))? as u32;
        let threshold = p.required_uint("iops_threshold", u64::from(u32::MAX))? as u32;
        p.finish()?;
        self.registry.set_coalescing(&ctrlr, delay, threshold)?;
        Ok(json!(true))
    }

    fn vhost_delete_controller(&self, mut p: Params) -> Result<Value, MethodError> {
        let ctrlr = p.required_str("ctrlr")?;
        p.finish()?;
        self.registry.delete_vhost(&ctrlr)?;
        Ok(json!(true))
    }

    fn framework_get_reactors(&self, p: Params) -> Result<Value, MethodError> {
        p.finish()?;
        let reactors: Vec<Value> = self
            .registry
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
                })
            })
            .collect();
        // Our ticks are nanoseconds.
        Ok(json!({ "tick_rate": 1_000_000_000u64, "pid": std::process::id(), "reactors": reactors }))
    }

    fn rpc_get_methods(&self, mut p: Params) -> Result<Value, MethodError> {
        // SPDK's flags: every method is callable at any time here and none has aliases, so
        // both only need to be well-formed.
        p.optional_bool("current")?;
        p.optional_bool("include_aliases")?;
        p.finish()?;
        let mut names: Vec<&str> =
            METHODS.iter().map(|(n, _)| *n).chain(self.registry.module_methods()).collect();
        names.sort_unstable();
        Ok(json!(names))
    }

    fn spdk_get_version(&self, p: Params) -> Result<Value, MethodError> {
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
    fn flashpath_get_stats(&self, p: Params) -> Result<Value, MethodError> {
        p.finish()?;
        let ctrls = self.registry.controllers(None)?;
        let reactors = self.registry.reactors();
        let sum = |f: fn(&fp_reactor::ReactorStatsSnapshot) -> u64| -> u64 {
            reactors.iter().map(|r| f(&r.stats)).sum()
        };
        Ok(json!({
            "uptime_ns": self.started.elapsed().as_nanos() as u64,
            "num_bdevs": self.registry.bdevs(None)?.len(),
            "num_controllers": ctrls.len(),
            "controllers": ctrls.iter().map(|c| json!({
                "ctrlr": c.name,
                "bdev": c.bdev_name,
                "connected": c.connected,
                "stats": c.stats,
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
}

/// Parses SPDK's `cpumask` ([`fp_reactor::parse_cpumask`]), naming the field in errors.
pub fn parse_cpumask(mask: &str) -> Result<Vec<usize>, ParamError> {
    fp_reactor::parse_cpumask(mask).map_err(|e| ParamError::new("cpumask", e))
}

/// Formats cores as SPDK's hex cpumask ("0x5" for cores 0 and 2).
pub fn cpumask_hex(cores: &[usize]) -> String {
    let Some(&max) = cores.iter().max() else { return "0x0".into() };
    let digits: String = (0..=max / 4)
        .rev()
        .map(|d| {
            let nibble = (0..4).filter(|b| cores.contains(&(d * 4 + b))).fold(0u32, |n, b| n | (1 << b));
            char::from_digit(nibble, 16).expect("a nibble is one hex digit")
        })
        .collect();
    format!("0x{digits}")
}

/// A stable identifier for a bdev, derived from its name so it survives a restart with the same
/// configuration. Two FNV-1a passes make 128 bits, stamped as an RFC 9562 version 8 (custom)
/// UUID since it is neither random nor one of the standard name-based kinds.
pub fn bdev_uuid(name: &str) -> String {
    let fnv =
        |basis: u64| name.bytes().fold(basis, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    let hi = fnv(0xcbf2_9ce4_8422_2325);
    let lo = fnv(0x6c62_272e_07bb_0142);
    let hi = (hi & !0xf000) | 0x8000; // version 8 in bits 48..52 of the first half
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62); // RFC variant
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// RFC 4122 text: 8-4-4-4-12 hexadecimal digits.
fn looks_like_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices()
            .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { c == '-' } else { c.is_ascii_hexdigit() })
}

fn bdev_json(b: &BdevSummary) -> Value {
    let info = &b.info;
    let io = info.io_types;
    let mut v = json!({
        "name": info.name,
        "aliases": b.aliases,
        "product_name": info.product_name,
        "block_size": info.block_size,
        "num_blocks": info.num_blocks(),
        // A bdev named by a UUID (a logical volume) is that UUID.
        "uuid": if looks_like_uuid(&info.name) { info.name.clone() } else { bdev_uuid(&info.name) },
        "claimed": !b.claims.is_empty(),
        "zoned": false,
        "supported_io_types": {
            "read": io.read,
            "write": io.write,
            "flush": io.flush,
            "unmap": io.unmap,
            "write_zeroes": io.write_zeroes,
            "reset": false,
            "nvme_admin": false,
            "nvme_io": false,
        },
        "driver_specific": { info.driver: b.driver_specific },
        "assigned_rate_limits": qos::limits_json(&b.qos_limits),
    });
    if let Some((group, weight)) = &b.qos_group {
        v["qos_group"] = json!({ "name": group, "weight": weight });
    }
    // SPDK reports the claim type only while there is one; all claims on a bdev share it, or
    // it would not have accepted the later ones.
    if let Some(c) = b.claims.first() {
        v["claim_type"] = json!(c.claim_type.name());
    }
    if let Some(by) = b.claimed_by() {
        v["claimed_by"] = json!(by);
    }
    v
}

fn controller_json(c: &ControllerInfo) -> Value {
    json!({
        "ctrlr": c.name,
        "cpumask": cpumask_hex(&c.cores),
        "socket": c.socket_path,
        "delay_base_us": c.coalescing.0,
        "iops_threshold": c.coalescing.1,
        "backend_specific": { "block": { "readonly": c.read_only, "bdev": c.bdev_name } },
        "num_queues": c.num_queues,
        "cores": c.cores,
        "connected": c.connected,
        "stats": c.stats,
        // flashpath's: each started queue's counters, `in_flight` among them.
        "queues": c.queues.iter().map(|(id, st)| {
            let mut q = json!(st);
            q["id"] = json!(id);
            q
        }).collect::<Vec<_>>(),
    })
}

mod iostat;
mod nbd;
mod qos;

#[cfg(test)]
mod tests;
