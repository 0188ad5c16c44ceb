//! Logical volumes (SPDK's lvol): thin and thick volumes, snapshots and clones carved out of
//! one base device in clusters, with crash-consistent metadata.
//!
//! This crate is the synchronous core the bdev module will stand on: the on-disk format
//! ([`mod@format`], documented in docs/lvol-format.md), the in-memory [`Store`] (volumes, cluster
//! maps, allocation, copy-on-write bookkeeping, free-cluster accounting) and its
//! `commit`/`load` against a page device ([`MetaDevice`]), plus a crash simulator ([`sim`]).
//! The bdev module built on it ([`bdev`]: lvstores on base bdevs, volumes as bdevs, SPDK's
//! `bdev_lvol_*` methods) is the only part that knows of bdevs and RPC.

pub mod bdev;
pub mod crc;
mod device;
pub mod format;
pub mod sim;
mod store;

pub use device::{DeviceError, MemDevice, MetaDevice, Page};
pub use store::{CommitPlan, NewCluster, Store, StoreOptions, Volume, WriteTarget};

/// Size of a metadata page: the unit of every metadata read and write (the atomic write unit
/// of NVMe drives, and what SPDK's blobstore uses).
pub const PAGE_SIZE: usize = 4096;

/// Longest store or volume name, in bytes (SPDK's `SPDK_LVS_NAME_MAX` / `SPDK_LVOL_NAME_MAX`
/// less the terminating NUL).
pub const NAME_MAX: usize = 63;

/// A cluster map entry that maps nothing (read zeroes, or the parent's data).
pub const UNALLOCATED: u32 = u32::MAX;

/// A store's or volume's identity, as 16 raw bytes (RFC 4122 layout; the caller makes them,
/// so the store stays deterministic for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    pub const NIL: Uuid = Uuid([0; 16]);

    pub fn is_nil(&self) -> bool {
        *self == Uuid::NIL
    }

    /// Parses RFC 4122 text (8-4-4-4-12 hexadecimal digits, either case).
    pub fn parse(s: &str) -> Option<Uuid> {
        let b = s.as_bytes();
        if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
            return None;
        }
        let hex: Vec<u8> = b.iter().copied().filter(|&c| c != b'-').collect();
        if hex.len() != 32 || !hex.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).ok()?;
            out[i] = u8::from_str_radix(text, 16).ok()?;
        }
        Some(Uuid(out))
    }
}

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

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
    fn uuid_display_is_rfc4122_text() {
        let u = Uuid([0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(u.to_string(), "12345678-9abc-def0-0102-030405060708");
        assert_eq!(Uuid::parse("12345678-9ABC-def0-0102-030405060708"), Some(u));
        for bad in [
            "",
            "12345678-9abc-def0-0102-03040506070",
            "12345678-9abc-def0-0102+030405060708",
            "1234567g-9abc-def0-0102-030405060708",
            "+2345678-9abc-def0-0102-030405060708",
        ] {
            assert_eq!(Uuid::parse(bad), None, "{bad}");
        }
    }

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
