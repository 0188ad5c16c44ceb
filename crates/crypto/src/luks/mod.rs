//! LUKS volumes on the crypto bdev: the header (crate `fp-luks`) read and written on a base
//! through [`BdevMetaIo`], the volume key kept in the daemon for the open disk's key-slot
//! changes, and the RPC methods that format, open, inspect and change them (docs/crypto.md,
//! "LUKS volumes").
//!
//! Header work runs on the RPC's control thread, never on a reactor: a key slot's KDF takes
//! as long as its parameters say (seconds, at cryptsetup's defaults), and the header I/O waits.

mod disk;
mod io;
mod kdf;
pub(crate) mod methods;
mod reencrypt;

pub(crate) use disk::disks;
pub(crate) use methods::{add_keyslot, format, get_header, open_luks, remove_keyslot, test_key};
pub(crate) use reencrypt::{
    cancel as reencrypt_cancel, get as reencrypt_get, pause as reencrypt_pause, resume as reencrypt_resume,
    set_speed as reencrypt_set_speed, start as reencrypt_start,
};
