//! Why a run failed.

use std::time::Duration;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid load spec: {0}")]
    InvalidSpec(String),
    #[error("libblkio {op}: {message} (errno {errno})")]
    Blkio { op: &'static str, errno: i32, message: String },
    #[error("virtio-driver {op}: {source}")]
    Virtio {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("vhost-user {op}: {message}")]
    Vhost { op: &'static str, message: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("{op}: {source}")]
    Os {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} requests still in flight {1:?} after the run ended; the device stopped completing")]
    DrainTimeout(usize, Duration),
    #[error("the client thread panicked")]
    Panicked,
    /// A run with one thread per disk: this disk's thread stopped because another disk's
    /// failed to connect.
    #[error("cancelled: another disk failed to start")]
    Cancelled,
    /// A multi-disk run: what went wrong with disk `index` (counting from 0, as given).
    #[error("disk {index} ({socket}): {source}")]
    Disk {
        index: usize,
        socket: String,
        #[source]
        source: Box<LoadError>,
    },
}

impl LoadError {
    pub(crate) fn blkio(op: &'static str, e: blkio::Error) -> Self {
        LoadError::Blkio { op, errno: e.errno().raw_os_error(), message: e.message().to_string() }
    }
}
