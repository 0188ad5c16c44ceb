//! Errors from creating devices, opening channels and asking for block status.

/// Errors from creating devices or opening channels (control plane), and from
/// [`BlockDevice::block_status`](crate::BlockDevice::block_status).
#[derive(Debug, thiserror::Error)]
pub enum BdevError {
    /// A parameter is out of range or inconsistent.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParam {
        /// The parameter's name, as the RPC method spells it.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The backing file or device cannot be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// Its path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The io_uring instance cannot be created.
    #[error("cannot set up io_uring: {0}")]
    Uring(#[source] std::io::Error),
    /// The device's memory cannot be allocated.
    #[error("out of memory allocating {0} bytes")]
    NoMemory(u64),
    /// The device cannot do what was asked (resize a device of a fixed size, say).
    #[error("{0}")]
    Unsupported(String),
    /// The change needed I/O on an underlying device, which failed (an lvol resize whose
    /// metadata write failed, say).
    #[error("{0}")]
    Io(String),
}
