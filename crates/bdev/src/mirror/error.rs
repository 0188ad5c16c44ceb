//! Why a mirror job could not start, or refused a request.

/// Why a mirror job could not start, or refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    /// A parameter is wrong; `field` is its RPC name.
    #[error("invalid parameter {field}: {reason}")]
    Invalid {
        /// The parameter's name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The source disk runs without the generic layer (statistics off): writes do not pass
    /// through anything the mirror could watch.
    #[error("bdev '{0}': a mirror needs the disk layer, and I/O statistics are switched off in this daemon (serve --no-iostat / [stats] iostat = false)")]
    AccountingOff(String),
    /// Another job mirrors this source already.
    #[error("bdev '{bdev}' is already mirrored by job '{job}'")]
    SourceBusy {
        /// The source's name.
        bdev: String,
        /// The job in the way.
        job: String,
    },
    /// The request does not fit the job's state (complete before ready, say).
    #[error("mirror job '{job}' is {state}: {reason}")]
    WrongState {
        /// The job.
        job: String,
        /// Its state now.
        state: &'static str,
        /// What was refused.
        reason: String,
    },
}
