//! The vhost-user-blk frontend.
//!
//! Being written. Public API (stable): [`BlkController`], [`ControllerConfig`],
//! [`ControllerInfo`], [`Error`], [`MAX_QUEUES`], [`validate_name`].

use std::path::PathBuf;

use fp_bdev::Bdev;
use fp_reactor::ReactorHandle;

/// Most queues one controller offers.
pub const MAX_QUEUES: u16 = 64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// A positive errno for the JSON-RPC error code.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Listen { source, .. } => source.raw_os_error().unwrap_or(5),
            Error::Other(_) => 5,
        }
    }
}

/// Controller names become socket file names.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!("'{name}' must be 1-100 characters of A-Z a-z 0-9 . _ -"))
    }
}

pub struct ControllerConfig {
    pub name: String,
    pub socket_path: PathBuf,
    pub bdev: Bdev,
    pub reactors: Vec<ReactorHandle>,
    pub read_only: bool,
    pub num_queues: u16,
}

/// Counters for one controller, summed over its queues.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ControllerStats {
    pub read_ops: u64,
    pub write_ops: u64,
    pub flush_ops: u64,
    pub discard_ops: u64,
    pub write_zeroes_ops: u64,
    pub get_id_ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Requests completed with VIRTIO_BLK_S_IOERR.
    pub io_errors: u64,
    /// Requests completed with VIRTIO_BLK_S_UNSUPP.
    pub unsupported: u64,
    /// Queues stopped because a chain could not be completed at all.
    pub failed_queues: u64,
    /// Guest notifications sent (call eventfd writes).
    pub notifications: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ControllerInfo {
    pub name: String,
    pub socket_path: PathBuf,
    pub bdev_name: String,
    pub read_only: bool,
    pub num_queues: u16,
    pub cores: Vec<usize>,
    pub connected: bool,
    pub stats: ControllerStats,
}

pub struct BlkController {
    info: ControllerInfo,
}

impl BlkController {
    pub fn start(config: ControllerConfig) -> Result<BlkController, Error> {
        let _ = config;
        Err(Error::Other("vhost-blk not built yet".into()))
    }

    pub fn info(&self) -> ControllerInfo {
        self.info.clone()
    }

    pub fn stop(self) {}
}
