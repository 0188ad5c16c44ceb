//! Why a raid operation failed.

use fp_bdev::BdevError;

/// A raid refusal or failure. `InvalidParam` names the RPC field at fault.
#[derive(Debug, thiserror::Error)]
pub enum RaidError {
    /// A parameter was refused; `field` is the RPC field.
    #[error("{field}: {reason}")]
    InvalidParam { field: &'static str, reason: String },
    /// The raid or base is in a state that does not allow this now (-16, EBUSY).
    #[error("{0}")]
    Busy(String),
    /// No such raid or base (-19, ENODEV).
    #[error("{0}")]
    NotFound(String),
    /// Metadata on a base is not usable: a bad superblock, a corrupted bitmap page.
    #[error("{0}")]
    Metadata(String),
    /// `bdev_raid_delete` with `clear_sb`: the raid is gone, but these bases keep their
    /// superblock (examine may assemble them again).
    #[error("{0}")]
    NotErased(String),
    /// A base's I/O failed.
    #[error(transparent)]
    Bdev(#[from] BdevError),
}

impl RaidError {
    /// The negative errno a JSON-RPC error reports, as SPDK's raid methods do.
    pub fn errno(&self) -> i32 {
        match self {
            RaidError::InvalidParam { .. } | RaidError::Metadata(_) => -libc::EINVAL,
            RaidError::Busy(_) => -libc::EBUSY,
            RaidError::NotFound(_) => -libc::ENODEV,
            RaidError::Bdev(_) | RaidError::NotErased(_) => -libc::EIO,
        }
    }
}
