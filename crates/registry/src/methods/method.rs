//! What a method is ([`MethodFn`]) and how it fails ([`MethodError`]), with the parameter
//! helpers the export kinds' methods share: below every table of methods, which all name them.

use fp_rpc::{ParamError, Params, RpcError};
use serde_json::Value;

use crate::{Registry, RegistryError};

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
