//! Ceph RBD images as flashpath bdevs (SPDK's `bdev_rbd`), on librbd loaded at run time.
//!
//! * [`sys`]: the librados/librbd functions, opened with dlopen on first use;
//! * [`image`]: cluster connections (one shared per registered cluster) and open images,
//!   on the control plane;
//! * [`channel`]: the data path: zero-copy `rbd_aio_readv`/`writev` on the caller's iovecs,
//!   completions from librbd's threads through a lock-free queue and an eventfd;
//! * [`rpc`]: the module and its methods, SPDK's names and parameters.
//!
//! docs/rbd.md has the long story: options, faults and timeouts, measured figures.

pub mod channel;
pub mod image;
pub mod rpc;
pub mod sys;

mod device;

pub use device::{RbdDetail, RbdDevice};
pub use image::{Cluster, ClusterConfig, Image, DEFAULT_OPTIONS};
pub use rpc::RbdModule;

/// Why an rbd operation failed (control plane).
#[derive(Debug, thiserror::Error)]
pub enum RbdError {
    /// librbd/librados cannot be loaded.
    #[error("{0}")]
    Library(String),
    /// A parameter Ceph refuses.
    #[error("invalid parameter {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// A pool or image that cannot be opened.
    #[error("invalid parameter {field}: {reason}")]
    NotFound { field: &'static str, reason: String },
    /// The cluster failed an operation: `ret` is librados' negative errno.
    #[error("{what}: {}", sys::errno_text(*ret))]
    Ceph { what: String, ret: i64 },
}

impl RbdError {
    /// The errno a JSON-RPC error carries (negative, as SPDK's).
    pub fn errno(&self) -> i32 {
        match self {
            RbdError::Library(_) => -libc::ENOSYS,
            RbdError::Invalid { .. } => -libc::EINVAL,
            RbdError::NotFound { .. } => -libc::ENOENT,
            RbdError::Ceph { ret, .. } => (*ret).clamp(-4095, -1) as i32,
        }
    }
}
