//! The crate's error type.

use std::path::PathBuf;

/// Why a controller cannot start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket cannot be bound.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Anything else (no reactor, no eventfd, no thread).
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// A positive errno for the JSON-RPC error code.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Listen { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Other(_) => libc::EIO,
        }
    }
}
