//! NVMe completion status -> the block layer's [`IoStatus`] (a positive errno), and the
//! errnos the channel itself gives.

use fp_bdev::IoStatus;
use fp_nvme_spec::{self as spec, Status};

/// The status of a command the channel aborted after a timeout, or that the controller
/// aborted (Abort Requested): ETIMEDOUT.
pub(crate) const TIMED_OUT: IoStatus = IoStatus::Error(libc::ETIMEDOUT);

/// Maps a completion's status (NVMe Base 2.0 Figures 100-102, NVM Command Set 1.0 Figure 25):
/// what a caller can act on gets its own errno, the rest EIO.
#[inline]
pub(crate) fn io_status(s: Status) -> IoStatus {
    if s.is_success() {
        return IoStatus::Success;
    }
    let errno = match (s.sct, s.sc) {
        (spec::SCT_GENERIC, spec::SC_INVALID_OPCODE) => return IoStatus::Unsupported,
        (spec::SCT_GENERIC, spec::SC_INVALID_FIELD) => libc::EINVAL,
        (spec::SCT_GENERIC, spec::SC_ABORT_REQUESTED) => libc::ETIMEDOUT,
        (spec::SCT_GENERIC, spec::SC_INVALID_NAMESPACE) => libc::ENODEV,
        (spec::SCT_GENERIC, spec::SC_NAMESPACE_WRITE_PROTECTED) => libc::EROFS,
        (spec::SCT_GENERIC, spec::SC_LBA_OUT_OF_RANGE) => libc::EINVAL,
        (spec::SCT_GENERIC, spec::SC_CAPACITY_EXCEEDED) => libc::ENOSPC,
        (spec::SCT_GENERIC, spec::SC_NAMESPACE_NOT_READY) => libc::EBUSY,
        (spec::SCT_MEDIA, spec::SC_ACCESS_DENIED) => libc::EACCES,
        (spec::SCT_PATH, spec::SC_ANA_PERSISTENT_LOSS) => ANA_LOST,
        _ => libc::EIO,
    };
    IoStatus::Error(errno)
}

/// The errno a multipath path's channel gives a request back with when its command failed
/// with an ANA path status: the multipath channel sends it through another path (never seen
/// above it).
pub(crate) const ANA_RETRY: i32 = libc::EREMCHG;

/// What a request fails with when its namespace is in ANA Persistent Loss on every path.
pub(crate) const ANA_LOST: i32 = libc::ENOLINK;

/// Whether a failure is an Asymmetric Access status (SCT 3h, SC 01h persistent loss, 02h
/// inaccessible, 03h transition; Base 4.6.1.2.4): the namespace's ANA state through this
/// controller is not what the host last read.
#[inline]
pub(crate) fn is_ana(s: Status) -> bool {
    s.sct == spec::SCT_PATH
        && matches!(s.sc, spec::SC_ANA_PERSISTENT_LOSS | spec::SC_ANA_INACCESSIBLE | spec::SC_ANA_TRANSITION)
}

/// Times a command failing with a transient status is sent again before its failure stands
/// (SPDK's `bdev_retry_count` default).
pub(crate) const MAX_RETRIES: u8 = 3;

/// Whether a failure is worth sending the command again: the controller did not set Do Not
/// Retry and the status says the condition passes (a path error, an interrupted command, a
/// namespace not ready yet, a transient transport error; Base 2.0 4.6.1.2).
#[inline]
pub(crate) fn retryable(s: Status) -> bool {
    !s.dnr
        && matches!(
            (s.sct, s.sc),
            (spec::SCT_PATH, _)
                | (spec::SCT_GENERIC, spec::SC_COMMAND_INTERRUPTED)
                | (spec::SCT_GENERIC, spec::SC_TRANSIENT_TRANSPORT_ERROR)
                | (spec::SCT_GENERIC, spec::SC_NAMESPACE_NOT_READY)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_errnos() {
        assert_eq!(io_status(Status::SUCCESS), IoStatus::Success);
        assert_eq!(io_status(Status::generic(spec::SC_INVALID_OPCODE)), IoStatus::Unsupported);
        assert_eq!(io_status(Status::generic(spec::SC_CAPACITY_EXCEEDED)), IoStatus::Error(libc::ENOSPC));
        assert_eq!(
            io_status(Status::generic(spec::SC_NAMESPACE_WRITE_PROTECTED)),
            IoStatus::Error(libc::EROFS)
        );
        assert_eq!(io_status(Status::generic(spec::SC_INVALID_NAMESPACE)), IoStatus::Error(libc::ENODEV));
        assert_eq!(io_status(Status::media(spec::SC_UNRECOVERED_READ_ERROR)), IoStatus::Error(libc::EIO));
        assert_eq!(io_status(Status::command_specific(0x80)), IoStatus::Error(libc::EIO));
        assert!(retryable(Status::generic(spec::SC_NAMESPACE_NOT_READY).retryable()));
        assert!(!retryable(Status::generic(spec::SC_NAMESPACE_NOT_READY)), "DNR set");
        assert!(!retryable(Status::generic(spec::SC_CAPACITY_EXCEEDED).retryable()));
        let ana = |sc| Status { sct: spec::SCT_PATH, sc, dnr: false };
        assert!(is_ana(ana(spec::SC_ANA_INACCESSIBLE)) && is_ana(ana(spec::SC_ANA_TRANSITION)));
        assert!(is_ana(ana(spec::SC_ANA_PERSISTENT_LOSS)) && !is_ana(ana(0x00)) && !is_ana(ana(0x60)));
        assert_eq!(io_status(ana(spec::SC_ANA_PERSISTENT_LOSS)), IoStatus::Error(ANA_LOST));
        assert_eq!(io_status(ana(spec::SC_ANA_INACCESSIBLE)), IoStatus::Error(libc::EIO));
    }
}
