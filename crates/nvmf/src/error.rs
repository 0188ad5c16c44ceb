//! Why a control call failed.

use std::time::Duration;

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum NvmfError {
    #[error("{what} '{name}' not found")]
    NotFound { what: &'static str, name: String },
    #[error("{what} '{name}' already exists")]
    AlreadyExists { what: &'static str, name: String },
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// A removed namespace's commands did not all finish within the drain bound: it is
    /// detached (hosts no longer reach it) but its bdev is still in use.
    #[error(
        "namespace {nsid} of {nqn} is detached, but {in_flight} command(s) are still in flight on \
         bdev '{bdev}' after {}.{:03} s; the bdev stays claimed until they finish \
         (remove the namespace again to wait for them)",
        waited.as_secs(),
        waited.subsec_millis()
    )]
    Draining { nqn: String, nsid: u32, bdev: String, in_flight: u32, waited: Duration },
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> NvmfError {
    NvmfError::Invalid { field, reason: reason.into() }
}
