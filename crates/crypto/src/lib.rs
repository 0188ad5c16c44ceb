//! Encryption for flashpath: the crypto bdev module (SPDK's `bdev_crypto` and accel crypto
//! keys: AES-XTS over another bdev, readable by dm-crypt) and the daemon's keyring (SPDK's
//! `keyring_*`), which any bdev module or export asks for a key ([`keyring()`]).
//! [`dhchap`] holds the computations of NVMe's in-band authentication (DH-HMAC-CHAP) for the
//! NVMe/TCP target and host, [`tls`] NVMe/TCP's TLS 1.3 with pre-shared keys (the PSK rules, and
//! a session over memory on OpenSSL's libssl).
//!
//! The cipher runs on OpenSSL's libcrypto when the host has it (loaded at run time, so the
//! daemon does not link it) and on the `aes` crate otherwise. Kept out of fp-bdev, which every
//! crate builds on: only the crates that encrypt carry a cipher.

#![deny(missing_docs)]

mod device;
pub mod dhchap;
mod engine;
mod key_field;
pub mod keyring;
mod keys;
mod luks;
mod openssl;
mod reencrypt;
mod rpc;
pub mod tls;
mod xts;

pub use device::{CryptoDevice, CryptoLayout, CHUNK, CHUNKS};
pub use engine::XtsEngine;
pub use keyring::{keyring, FileKey, Keyring};
pub use keys::{decode_hex, AccelKeys, CryptoKey, CIPHER, TWEAK_MODE};
pub use openssl::available as openssl_available;
pub use reencrypt::{
    recover_hotzone, start_reencrypt, CheckpointRecord, Hotzone, MemoryCheckpoint, Recovered,
    ReencryptCheckpoint, ReencryptError, ReencryptJob, ReencryptOptions, ReencryptProgress, ReencryptState,
    DEFAULT_HOTZONE, MAX_HOTZONE,
};
pub use rpc::CryptoModule;
