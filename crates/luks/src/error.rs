//! Why a LUKS operation failed: a message naming the field or copy that is wrong (never key
//! material or a passphrase), and a small stable [`ErrorKind`] for RPC errors.

use std::fmt;

/// The cause of a [`LuksError`], stable across releases (RPC error codes map from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The device holds no LUKS header.
    NotLuks,
    /// A LUKS version newer than this build reads.
    NewerVersion,
    /// A header (copy) does not check out.
    Damaged,
    /// A valid header uses something this build does not implement, or a field is beyond the
    /// limits this build accepts.
    Unsupported,
    /// No key slot opens with the passphrase.
    WrongPassphrase,
    /// Every key slot is in use.
    NoFreeSlot,
    /// The key slot named is not there (or not active).
    NoSuchSlot,
    /// Removing the key slot would leave the volume with none.
    LastSlot,
    /// The device is too small for the volume's metadata.
    TooSmall,
    /// The volume is being re-encrypted: it has two volume keys, and only the re-encryption
    /// calls handle it.
    Reencrypting,
    /// The device failed a read, write or flush.
    Io,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ErrorKind::NotLuks => "not luks",
            ErrorKind::NewerVersion => "newer version",
            ErrorKind::Damaged => "damaged",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::WrongPassphrase => "wrong passphrase",
            ErrorKind::NoFreeSlot => "no free slot",
            ErrorKind::NoSuchSlot => "no such slot",
            ErrorKind::LastSlot => "last slot",
            ErrorKind::TooSmall => "too small",
            ErrorKind::Reencrypting => "reencrypting",
            ErrorKind::Io => "io",
        };
        f.write_str(name)
    }
}

/// Why a LUKS operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LuksError {
    /// No LUKS magic at the start of the device (nor a LUKS2 secondary copy where one may be).
    #[error("not a LUKS volume (no LUKS magic)")]
    NotLuks,
    /// The header's version is newer than 2.
    #[error("LUKS version {0} is newer than this build reads (1 and 2)")]
    NewerVersion(u16),
    /// A header copy does not check out: `copy` is "primary", "secondary", "both" (LUKS2) or
    /// "header" (LUKS1).
    #[error("LUKS {copy} header damaged: {reason}")]
    Damaged {
        /// Which copy.
        copy: &'static str,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// A field names something not implemented here, or lies beyond the accepted limits.
    #[error("unsupported LUKS {what}: {value}")]
    Unsupported {
        /// The field (or requirement) name.
        what: &'static str,
        /// Its value, or why it is refused.
        value: String,
    },
    /// No key slot opens with the passphrase.
    #[error("no key slot opens with this passphrase")]
    WrongPassphrase,
    /// Every key slot is in use.
    #[error("no free key slot")]
    NoFreeSlot,
    /// No such (active, or free when adding) key slot.
    #[error("key slot {0}: no such slot")]
    NoSuchSlot(u32),
    /// The slot is the volume's last active one.
    #[error("refusing to remove the last active key slot")]
    LastSlot,
    /// The device cannot hold the volume.
    #[error("device too small for a LUKS volume: {need} bytes needed, {have} present")]
    TooSmall {
        /// Bytes needed.
        need: u64,
        /// Bytes the device has.
        have: u64,
    },
    /// The volume is in an online re-encryption: `unlock` cannot give its (two) keys.
    #[error(
        "the LUKS2 volume is being re-encrypted: unlock it with unlock_reencryption (both volume keys), \
         or let the re-encryption finish"
    )]
    Reencrypting,
    /// The device failed.
    #[error("LUKS device I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl LuksError {
    /// The stable cause.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LuksError::NotLuks => ErrorKind::NotLuks,
            LuksError::NewerVersion(_) => ErrorKind::NewerVersion,
            LuksError::Damaged { .. } => ErrorKind::Damaged,
            LuksError::Unsupported { .. } => ErrorKind::Unsupported,
            LuksError::WrongPassphrase => ErrorKind::WrongPassphrase,
            LuksError::NoFreeSlot => ErrorKind::NoFreeSlot,
            LuksError::NoSuchSlot(_) => ErrorKind::NoSuchSlot,
            LuksError::LastSlot => ErrorKind::LastSlot,
            LuksError::TooSmall { .. } => ErrorKind::TooSmall,
            LuksError::Reencrypting => ErrorKind::Reencrypting,
            LuksError::Io(_) => ErrorKind::Io,
        }
    }
}

/// `Unsupported { what, value }` for a value that can be displayed.
pub(crate) fn unsupported(what: &'static str, value: impl fmt::Display) -> LuksError {
    LuksError::Unsupported { what, value: value.to_string() }
}
