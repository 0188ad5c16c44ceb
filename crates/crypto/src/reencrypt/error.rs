//! Why a re-encryption job could not start, or stopped.

/// Why a re-encryption could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReencryptError {
    /// A parameter is out of its range; names it.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParam {
        /// The parameter.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A job already runs on the disk.
    #[error("a re-encryption job already runs on '{0}'")]
    Running(String),
    /// The base could not be opened.
    #[error("the base: {0}")]
    Base(String),
    /// A request to the base failed.
    #[error("{op} at byte {offset} of the base failed (errno {errno})")]
    Io {
        /// read, write or flush.
        op: String,
        /// Its offset on the base.
        offset: u64,
        /// The positive errno.
        errno: i32,
    },
    /// The checkpoint could not record progress.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] std::io::Error),
    /// A guest request overlapping the hotzone stayed in flight past the bound.
    #[error("a request overlapping the hotzone at byte {offset} was still in flight after {secs} s")]
    QuiesceTimeout {
        /// The hotzone's first byte.
        offset: u64,
        /// The bound.
        secs: u64,
    },
}
