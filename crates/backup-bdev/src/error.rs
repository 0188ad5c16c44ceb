//! fp-backup's errors as a method's: a parameter's error names the parameter, the rest keep a
//! negative errno chosen by their cause.

use fp_backup::{BackupError, ErrorKind};
use fp_bdev::module::ModuleError;
use fp_rpc::ParamError;

/// The negative errno a store error is reported with (the JSON-RPC error code).
pub fn errno(kind: ErrorKind) -> i32 {
    -match kind {
        ErrorKind::Invalid => libc::EINVAL,
        ErrorKind::NotFound => libc::ENOENT,
        ErrorKind::Refused => libc::EACCES,
        ErrorKind::Unavailable => libc::EHOSTUNREACH,
        ErrorKind::Corrupt | ErrorKind::Truncated => libc::EBADMSG,
        ErrorKind::NewerFormat => libc::EPROTONOSUPPORT,
        ErrorKind::Key => libc::EKEYREJECTED,
        ErrorKind::Busy => libc::EBUSY,
        ErrorKind::Cancelled => libc::ECANCELED,
        ErrorKind::Other => libc::EIO,
    }
}

/// `e` as a method's error. fp-backup's field names are its own ("disk", "backup id"); the
/// methods' parameters are `bdev` and `backup_id`, so those are renamed.
pub fn backup_error(e: BackupError) -> ModuleError {
    match e {
        BackupError::Invalid { field, reason } => {
            let field = match field {
                "disk" => "bdev",
                "backup id" => "backup_id",
                "key name" => "key",
                other => other,
            };
            ParamError::new(field, reason).into()
        }
        other => ModuleError::module(errno(other.kind()), other),
    }
}
