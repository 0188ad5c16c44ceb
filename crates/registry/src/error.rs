//! The registry's errors: one enum with a stable kind, mapped to SPDK's negative errnos for
//! JSON-RPC and to one-line messages for the CLI and the configuration file.

use std::path::PathBuf;

use fp_bdev::BdevError;
use fp_rpc::ParamError;

/// A stable error kind, for mapping to JSON-RPC codes and CLI exit messages.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{kind} '{name}' does not exist")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} '{name}' already exists")]
    AlreadyExists { kind: &'static str, name: String },
    #[error("bdev '{name}' is in use by '{by}'")]
    InUse { name: String, by: String },
    /// A group that still has members cannot be deleted.
    #[error("{kind} '{name}' still has members: {members} (remove them first)")]
    HasMembers { kind: &'static str, name: String, members: String },
    /// A bdev in use may grow, not shrink: its users' data beyond the new end would be lost.
    #[error("cannot shrink bdev '{name}' from {from} to {to} blocks: it is in use by '{by}' (it may only grow while in use)")]
    ShrinkInUse { name: String, by: String, from: u64, to: u64 },
    #[error("invalid parameter {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// A configured limit would be exceeded; `setting` is the configuration key that sets it.
    #[error("cannot create {kind} '{name}': {limit} {kind}s already exist, the limit set by {setting}")]
    LimitReached { kind: &'static str, name: String, limit: usize, setting: &'static str },
    /// The request is well-formed but the configuration forbids it (a path outside the export
    /// directories).
    #[error("{field}: {reason}")]
    NotAllowed { field: &'static str, reason: String },
    #[error("cannot set the mode of {}: {source}", path.display())]
    SocketMode {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The object is not in a state where the request can be done now (a mirror job asked to
    /// complete before it is ready, or still copying when the wait ended).
    #[error("{0}")]
    NotNow(String),
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(transparent)]
    Bdev(#[from] BdevError),
    #[error("{0}")]
    Vhost(#[from] fp_vhost_blk::Error),
    /// A module's own failure ([`fp_bdev::module::ModuleError::Module`]), with the errno the
    /// module gave it.
    #[error("{source}")]
    Module { errno: i32, source: Box<dyn std::error::Error + Send + Sync> },
}

impl RegistryError {
    /// The negative errno SPDK would return for the same failure, used as the JSON-RPC error
    /// code (SPDK reports e.g. -17 for an existing name, -19 for a missing device).
    pub fn errno(&self) -> i32 {
        match self {
            RegistryError::NotFound { .. } => -libc::ENODEV,
            RegistryError::AlreadyExists { .. } => -libc::EEXIST,
            RegistryError::InUse { .. }
            | RegistryError::ShrinkInUse { .. }
            | RegistryError::HasMembers { .. }
            | RegistryError::NotNow(_) => -libc::EBUSY,
            RegistryError::Invalid { .. } => -libc::EINVAL,
            // As the kernel does when a count limit is reached (inotify watches, epoll
            // instances): "no room for another".
            RegistryError::LimitReached { .. } => -libc::ENOSPC,
            RegistryError::NotAllowed { .. } => -libc::EACCES,
            RegistryError::SocketMode { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
            RegistryError::Bdev(BdevError::InvalidParam { .. }) => -libc::EINVAL,
            RegistryError::Bdev(BdevError::Open { source, .. }) => {
                -source.raw_os_error().unwrap_or(libc::EIO)
            }
            RegistryError::Bdev(BdevError::NoMemory(_)) => -libc::ENOMEM,
            RegistryError::Bdev(BdevError::Uring(_)) => -libc::EIO,
            RegistryError::Bdev(BdevError::Unsupported(_)) => -libc::EOPNOTSUPP,
            RegistryError::Bdev(BdevError::Io(_)) => -libc::EIO,
            RegistryError::Param(_) => -libc::EINVAL,
            RegistryError::Vhost(e) => -e.errno(),
            // A module's errors carry their own (ETIMEDOUT, ENODEV for a controller gone).
            RegistryError::Module { errno, .. } => *errno,
        }
    }

    /// True when the caller's parameters were wrong (JSON-RPC "invalid params").
    pub fn is_invalid_params(&self) -> bool {
        matches!(
            self,
            RegistryError::Invalid { .. }
                | RegistryError::Param(_)
                | RegistryError::Bdev(BdevError::InvalidParam { .. })
        )
    }
}
