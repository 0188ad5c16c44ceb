//! The management methods: JSON parameters in, [`Registry`] calls, JSON results out.
//!
//! Names, parameters and result shapes follow SPDK's JSON-RPC, so SPDK's `rpc.py` and scripts
//! written for it work; flashpath's additions are extra result fields and a few extra
//! parameters (`direct`, `num_queues`). Unknown parameters are rejected, naming the field and
//! listing the accepted ones.
//!
//! Three tables answer a call: the daemon-wide methods here ([`METHODS`]: bdevs, reactors,
//! statistics, QoS), each export kind's (`exports/<kind>/rpc.rs`) and each bdev module's. The
//! RPC server and the `--config` loader both come through [`Registry::call`], so a
//! configuration file is exactly a list of RPC calls and cannot drift from them.

use fp_rpc::{ParamError, Params, RpcError};
use serde_json::Value;

use crate::exports::EXPORT_KINDS;
use crate::{Registry, RegistryError};

mod bdev;
mod examine;
mod framework;
mod iostat;
mod mirror;
mod qos;

pub use bdev::bdev_uuid;

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

/// A daemon-wide or export method: the registry it acts on and its parameters.
pub type MethodFn = fn(&Registry, Params) -> Result<Value, MethodError>;

/// The daemon-wide methods, by name; the export kinds' and the bdev modules' come from their
/// own tables. `rpc_get_methods` lists all three.
pub const METHODS: &[(&str, MethodFn)] = &[
    ("bdev_get_bdevs", bdev::bdev_get_bdevs),
    ("bdev_set_options", examine::bdev_set_options),
    ("bdev_examine", examine::bdev_examine),
    ("framework_get_reactors", framework::framework_get_reactors),
    ("rpc_get_methods", framework::rpc_get_methods),
    ("spdk_get_version", framework::spdk_get_version),
    ("flashpath_get_stats", framework::flashpath_get_stats),
    // The disk layer (iostat.rs).
    ("bdev_get_iostat", iostat::bdev_get_iostat),
    ("bdev_reset_iostat", iostat::bdev_reset_iostat),
    ("bdev_enable_histogram", iostat::bdev_enable_histogram),
    ("bdev_get_histogram", iostat::bdev_get_histogram),
    // QoS (qos.rs).
    ("bdev_set_qos_limit", qos::bdev_set_qos_limit),
    ("bdev_qos_group_create", qos::bdev_qos_group_create),
    ("bdev_qos_group_set", qos::bdev_qos_group_set),
    ("bdev_qos_group_delete", qos::bdev_qos_group_delete),
    ("bdev_qos_group_add_bdev", qos::bdev_qos_group_add_bdev),
    ("bdev_qos_group_remove_bdev", qos::bdev_qos_group_remove_bdev),
    ("bdev_qos_group_set_weight", qos::bdev_qos_group_set_weight),
    ("bdev_qos_get_groups", qos::bdev_qos_get_groups),
    // Mirror jobs (mirror.rs).
    ("bdev_mirror_start", mirror::bdev_mirror_start),
    ("bdev_mirror_get_jobs", mirror::bdev_mirror_get_jobs),
    ("bdev_mirror_set_speed", mirror::bdev_mirror_set_speed),
    ("bdev_mirror_complete", mirror::bdev_mirror_complete),
    ("bdev_mirror_cancel", mirror::bdev_mirror_cancel),
];

/// The daemon-wide methods and every export kind's: all but the bdev modules'.
fn registry_methods() -> impl Iterator<Item = &'static (&'static str, MethodFn)> {
    METHODS.iter().chain(EXPORT_KINDS.iter().flat_map(|k| k.methods()))
}

impl Registry {
    /// Runs `method` with `params`: a daemon-wide method, an export kind's or a bdev module's.
    pub fn call(&self, method: &str, params: Option<Value>) -> Result<Value, MethodError> {
        match registry_methods().find(|(name, _)| *name == method) {
            Some((_, f)) => f(self, Params::new(params)?),
            None => match self.call_module(method, params) {
                Some(result) => Ok(result?),
                None => Err(MethodError::UnknownMethod(method.to_string())),
            },
        }
    }

    /// Every method's name, sorted.
    pub fn method_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> =
            registry_methods().map(|(n, _)| *n).chain(self.module_methods()).collect();
        names.sort_unstable();
        names
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

#[cfg(test)]
mod tests;
