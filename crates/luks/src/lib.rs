//! The LUKS on-disk format (LUKS1 and LUKS2, as cryptsetup and QEMU's `luks` driver write and
//! open them): reading and checking the headers, unlocking a key slot with a passphrase,
//! adding and removing key slots, and formatting a new volume. No I/O of its own: the caller
//! hands it a [`MetaIo`] over the device.
//!
//! # The data area and its IVs
//!
//! The volume key encrypts the data area, which starts at [`Volume::data_offset`] bytes and
//! runs for [`Volume::data_size`] bytes, with aes-xts-plain64 in units of
//! [`Volume::sector_size`] bytes. The IV (XTS tweak) of a unit is the number of its first
//! **512-byte** sector counted from the data offset (not from the device start), 64-bit
//! little-endian, zero-padded to 16 bytes. That is dm-crypt's `plain64` with cryptsetup's
//! defaults (LUKS2 `"iv_tweak": "0"`, no `--iv-large-sectors`), and QEMU's `luks` driver's
//! for LUKS1: with 4096-byte sectors, unit `n` of the data area has IV `n × 8`. The key's
//! first half is XTS's data key, the second half its tweak key (fp-crypto's `key` and `key2`).
//!
//! Key slot areas are encrypted the same way with the slot's derived key, the area's first
//! sector having IV 0.
//!
//! Reference: docs/luks-format.md.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod af;
mod crypto;
mod error;
mod io;
mod kdf;
mod luks1;
mod luks2;
mod reencrypt;
#[cfg(test)]
mod tests;
mod volume;

pub use error::{ErrorKind, LuksError};
pub use io::{MemIo, MetaIo};
pub use kdf::Kdf;
pub use reencrypt::{Hotzone, Reencryption};
pub use volume::{derive_into, format, FormatOptions, KeyslotInfo, Version, Volume, VolumeKey};
