//! Why a backup store operation failed: a message naming the object and what is wrong, and a
//! small stable [`ErrorKind`] for RPC errors and for callers that branch on the cause.

use std::fmt;

/// The cause of a [`BackupError`], stable across releases (RPC error codes map from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A parameter or configuration value is wrong (the message names the field).
    Invalid,
    /// The store has no such object (a backup id, a chunk).
    NotFound,
    /// The store refused the request (permission, missing or wrong credentials).
    Refused,
    /// The store did not answer in time, or the connection failed, after every retry.
    Unavailable,
    /// An object's bytes are damaged: a bad checksum, tag, length or field.
    Corrupt,
    /// An object is shorter than its header says.
    Truncated,
    /// An object was written by a newer format version than this build reads.
    NewerFormat,
    /// The key does not open the object (wrong key), or a key is missing or not wanted.
    Key,
    /// Another operation on the same store is in the way (a GC while backups run, or backups
    /// while a GC runs); retry later.
    Busy,
    /// The job was cancelled; no manifest was written.
    Cancelled,
    /// Anything else the store reported (unsupported operation, a local I/O error).
    Other,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ErrorKind::Invalid => "invalid",
            ErrorKind::NotFound => "not found",
            ErrorKind::Refused => "refused",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Truncated => "truncated",
            ErrorKind::NewerFormat => "newer format",
            ErrorKind::Key => "key",
            ErrorKind::Busy => "busy",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Other => "other",
        };
        f.write_str(name)
    }
}

/// Why a backup store operation failed. Messages name the object (its key in the store) and
/// never carry credentials or key bytes.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A parameter is wrong; `field` names it.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The parameter.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The object is not in the store.
    #[error("{object}: not found in the store")]
    NotFound {
        /// The object's key.
        object: String,
    },
    /// The store failed the request after the retries; `kind` is Refused or Unavailable or Other.
    #[error("{object}: {what} failed after {attempts} attempt(s): {reason}")]
    Store {
        /// Refused, Unavailable or Other.
        kind: ErrorKind,
        /// The object's key (or the listing's prefix).
        object: String,
        /// The operation: get, put, head, list, delete.
        what: &'static str,
        /// How many times it was tried.
        attempts: u32,
        /// The store's error.
        reason: String,
    },
    /// The object's bytes do not check out.
    #[error("{object}: corrupt: {reason}")]
    Corrupt {
        /// The object's key.
        object: String,
        /// What is wrong.
        reason: String,
    },
    /// The object ends before its header says it does.
    #[error("{object}: truncated: {reason}")]
    Truncated {
        /// The object's key.
        object: String,
        /// What is missing.
        reason: String,
    },
    /// A newer format version than this build reads.
    #[error(
        "{object}: format version {version} is newer than this build reads ({supported}); upgrade flashpath"
    )]
    NewerFormat {
        /// The object's key.
        object: String,
        /// The version found.
        version: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The key does not open the object, or is missing, or is given for a plain object.
    #[error("{object}: {reason}")]
    Key {
        /// The object's key.
        object: String,
        /// What is wrong (wrong key, encrypted without a key, ...).
        reason: String,
    },
    /// Another operation on the store is in the way.
    #[error("store {store}: {reason}")]
    Busy {
        /// The store (its URL, without credentials).
        store: String,
        /// What is in the way.
        reason: String,
    },
    /// The job was cancelled; no manifest was written.
    #[error("backup of {disk} cancelled; no manifest written")]
    Cancelled {
        /// The disk.
        disk: String,
    },
    /// Reading the source disk failed.
    #[error("reading {disk} at offset {offset}: {source}")]
    Source {
        /// The disk.
        disk: String,
        /// Where.
        offset: u64,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl BackupError {
    /// The stable cause.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BackupError::Invalid { .. } => ErrorKind::Invalid,
            BackupError::NotFound { .. } => ErrorKind::NotFound,
            BackupError::Store { kind, .. } => *kind,
            BackupError::Corrupt { .. } => ErrorKind::Corrupt,
            BackupError::Truncated { .. } => ErrorKind::Truncated,
            BackupError::NewerFormat { .. } => ErrorKind::NewerFormat,
            BackupError::Key { .. } => ErrorKind::Key,
            BackupError::Busy { .. } => ErrorKind::Busy,
            BackupError::Cancelled { .. } => ErrorKind::Cancelled,
            BackupError::Source { .. } => ErrorKind::Other,
        }
    }
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> BackupError {
    BackupError::Invalid { field, reason: reason.into() }
}

pub(crate) fn corrupt(object: &str, reason: impl Into<String>) -> BackupError {
    BackupError::Corrupt { object: object.to_string(), reason: reason.into() }
}

pub(crate) fn truncated(object: &str, reason: impl Into<String>) -> BackupError {
    BackupError::Truncated { object: object.to_string(), reason: reason.into() }
}

pub(crate) fn key_error(object: &str, reason: impl Into<String>) -> BackupError {
    BackupError::Key { object: object.to_string(), reason: reason.into() }
}

/// The result of a backup store operation.
pub type Result<T, E = BackupError> = std::result::Result<T, E>;
