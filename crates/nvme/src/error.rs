//! The driver's error: what failed, with a small stable kind for RPC errors.

use fp_nvme_spec::Status;

/// Why a driver operation failed (control plane, or a queue that died).
#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    /// A parameter is wrong; `field` names it as the RPC method spells it.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParam {
        /// The parameter.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A system call failed (VFIO, mmap, a socket); `what` says which step.
    #[error("{what}: {source}")]
    Io {
        /// The step that failed.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The controller completed a command with an error status.
    #[error("{what} failed with NVMe status sct {:#x} sc {:#x}", status.sct, status.sc)]
    Command {
        /// The command.
        what: &'static str,
        /// Its status.
        status: Status,
    },
    /// The controller did not answer in time.
    #[error("{0} timed out")]
    Timeout(String),
    /// The controller (or the target) broke the protocol: a completion for an unknown or
    /// finished command id, a phase or queue head out of order, a malformed PDU. The queue (or
    /// the connection) is not used again.
    #[error("controller protocol violation: {0}")]
    Protocol(String),
    /// The controller is gone: the device was removed, the connection was lost, or it failed
    /// fatally (CSTS.CFS).
    #[error("controller unreachable: {0}")]
    Gone(String),
    /// The controller lacks something the driver needs.
    #[error("{0}")]
    Unsupported(String),
    /// DH-HMAC-CHAP authentication of a queue failed; the text names the queue and the step.
    #[error("DH-HMAC-CHAP authentication failed: {0}")]
    Auth(String),
    /// A queue's TLS handshake was refused; `kind` says why (wrong PSK, unknown identity, a
    /// protocol error), the text names the target and the identity offered, never key bytes.
    #[error("{what}")]
    Tls {
        /// Why.
        kind: fp_crypto::tls::TlsErrorKind,
        /// What happened, for the log and the RPC error.
        what: String,
    },
}

impl NvmeError {
    /// The negative errno a JSON-RPC error carries (SPDK's convention).
    pub fn errno(&self) -> i32 {
        match self {
            NvmeError::InvalidParam { .. } => -libc::EINVAL,
            NvmeError::Io { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
            NvmeError::Command { .. } => -libc::EIO,
            NvmeError::Timeout(_) => -libc::ETIMEDOUT,
            NvmeError::Protocol(_) => -libc::EPROTO,
            NvmeError::Gone(_) => -libc::ENODEV,
            NvmeError::Unsupported(_) => -libc::ENOTSUP,
            NvmeError::Auth(_) => -libc::EACCES,
            NvmeError::Tls { kind, .. } => match kind {
                fp_crypto::tls::TlsErrorKind::WrongPsk | fp_crypto::tls::TlsErrorKind::UnknownIdentity => {
                    -libc::EACCES
                }
                fp_crypto::tls::TlsErrorKind::Protocol => -libc::EPROTO,
                fp_crypto::tls::TlsErrorKind::Unavailable => -libc::ENOTSUP,
            },
        }
    }

    /// An [`NvmeError::Io`] for step `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> NvmeError {
        NvmeError::Io { what: what.into(), source }
    }
}
