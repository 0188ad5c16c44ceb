//! Why a store operation failed, and the name rule every store and volume name follows.

use crate::{DeviceError, NAME_MAX};

/// Why a store operation failed. Operations check everything before changing anything, so an
/// error leaves the store as it was.
#[derive(Debug, thiserror::Error)]
pub enum LvolError {
    /// Bad input: `field` names the parameter, as the RPC layer reports it.
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("{field}: no volume '{value}'")]
    NotFound { field: &'static str, value: String },
    #[error("{field}: '{value}' already exists")]
    Exists { field: &'static str, value: String },
    /// The operation is refused in the volume's state (a snapshot resized, a snapshot with clones
    /// deleted, a read-only volume written).
    #[error("{field}: {reason}")]
    State { field: &'static str, reason: String },
    #[error("not enough free clusters: {needed} needed, {free} free")]
    NoSpace { needed: u64, free: u64 },
    #[error("metadata area full: {needed} bytes needed, the area holds {capacity}")]
    MetadataFull { needed: u64, capacity: u64 },
    /// The device holds no store (no label).
    #[error("no lvstore on the device: {0}")]
    NotAStore(String),
    /// The device holds a store whose metadata cannot be trusted.
    #[error("corrupt lvstore metadata: {0}")]
    Corrupt(String),
    #[error("a metadata commit is already in flight")]
    CommitInFlight,
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Checks a store or volume name: 1 to [`NAME_MAX`] bytes, no control characters and no '/'
/// (a volume's bdev is named `lvs/lvol`, so a slash would make that ambiguous).
pub fn check_name(field: &'static str, name: &str) -> Result<(), LvolError> {
    let reason = if name.is_empty() {
        "must not be empty".to_string()
    } else if name.len() > NAME_MAX {
        format!("{} bytes long, at most {NAME_MAX}", name.len())
    } else if name.chars().any(|c| c.is_control() || c == '/') {
        "must not contain '/' or control characters".to_string()
    } else {
        return Ok(());
    };
    Err(LvolError::Invalid { field, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("lvol_name", "vol0").is_ok());
        let e = check_name("lvol_name", "").unwrap_err().to_string();
        assert!(e.starts_with("lvol_name: "), "{e}");
        assert!(check_name("lvol_name", &"x".repeat(64)).is_err());
        assert!(check_name("lvol_name", &"x".repeat(63)).is_ok());
        assert!(check_name("lvs_name", "a/b").is_err());
        assert!(check_name("lvs_name", "a\nb").is_err());
    }
}
