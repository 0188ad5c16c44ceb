//! AES-XTS data keys (SPDK's accel crypto keys), the crypto module's own.
//!
//! Key material lives only in [`Zeroizing`] buffers and in the AES key schedules (the `aes`
//! crate's `zeroize` feature clears them on drop). Nothing here implements a `Debug` that shows
//! it, no error message quotes it, and the RPC results list names and attributes only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aes::cipher::KeyInit;
use aes::{Aes128, Aes256};
use zeroize::Zeroizing;

use fp_bdev::BdevError;

use crate::xts::Xts;

/// The cipher of an accel crypto key (SPDK's `cipher`); AES-XTS only.
pub const CIPHER: &str = "AES_XTS";
/// The one tweak mode: the 512-byte sector number (see the module docs).
pub const TWEAK_MODE: &str = "SIMPLE_LBA";

// One per key, behind an `Arc`: the size difference costs nothing, a box would cost an
// indirection per block.
#[allow(clippy::large_enum_variant)]
enum Cipher {
    Aes128(Xts<Aes128>),
    Aes256(Xts<Aes256>),
}

/// An AES-XTS key: two AES keys of 128 or 256 bits each (XTS-AES-256 or XTS-AES-512 in
/// dm-crypt's count of the whole key).
pub struct CryptoKey {
    name: String,
    xts: Cipher,
    /// Both halves, for the OpenSSL contexts each channel makes (`engine.rs`).
    material: Zeroizing<Vec<u8>>,
    bits: u32,
}

impl std::fmt::Debug for CryptoKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CryptoKey")
            .field("name", &self.name)
            .field("bits", &self.bits)
            .finish_non_exhaustive()
    }
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> BdevError {
    BdevError::InvalidParam { field, reason: reason.into() }
}

/// Decodes hex into a buffer zeroed on drop. The error never quotes the input.
pub fn decode_hex(field: &'static str, hex: &str) -> Result<Zeroizing<Vec<u8>>, BdevError> {
    let bytes = hex.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return Err(invalid(
            field,
            format!("{} hex digits: an odd number (the value is not shown)", bytes.len()),
        ));
    }
    let mut out = Zeroizing::new(Vec::with_capacity(bytes.len() / 2));
    let digit = |c: u8| (c as char).to_digit(16);
    for pair in bytes.chunks(2) {
        match (digit(pair[0]), digit(pair[1])) {
            (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
            _ => return Err(invalid(field, "not a hex string (the value is not shown)")),
        }
    }
    Ok(out)
}

impl CryptoKey {
    /// An AES-XTS key named `name` from its two halves, each 16 or 32 bytes (`key`, `key2` in
    /// the errors). Equal halves are refused, as XTS (IEEE 1619) requires.
    pub fn new(name: &str, key: &[u8], key2: &[u8]) -> Result<CryptoKey, BdevError> {
        if key.len() != 16 && key.len() != 32 {
            return Err(invalid(
                "key",
                format!("{} bytes: AES-XTS takes 16 or 32 (32 or 64 hex digits)", key.len()),
            ));
        }
        if key2.len() != key.len() {
            return Err(invalid(
                "key2",
                format!("{} bytes: must be as long as key ({} bytes)", key2.len(), key.len()),
            ));
        }
        if key == key2 {
            return Err(invalid("key2", "must differ from key (XTS refuses equal halves)"));
        }
        let xts = if key.len() == 16 {
            Cipher::Aes128(Xts::new(
                Aes128::new_from_slice(key).expect("16 bytes"),
                Aes128::new_from_slice(key2).expect("16 bytes"),
            ))
        } else {
            Cipher::Aes256(Xts::new(
                Aes256::new_from_slice(key).expect("32 bytes"),
                Aes256::new_from_slice(key2).expect("32 bytes"),
            ))
        };
        let mut material = Zeroizing::new(Vec::with_capacity(key.len() * 2));
        material.extend_from_slice(key);
        material.extend_from_slice(key2);
        Ok(CryptoKey { name: name.to_string(), xts, material, bits: key.len() as u32 * 16 })
    }

    /// From hex strings, as `accel_crypto_key_create` takes them.
    pub fn from_hex(name: &str, key: &str, key2: &str) -> Result<CryptoKey, BdevError> {
        let k1 = decode_hex("key", key)?;
        let k2 = decode_hex("key2", key2)?;
        CryptoKey::new(name, &k1, &k2)
    }

    /// Runs `f` on both halves of the key, one after the other (never copied out).
    pub(crate) fn with_material<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.material)
    }

    /// Whether `other` is the same key material (whatever the names), compared in place.
    pub(crate) fn same_material(&self, other: &CryptoKey) -> bool {
        self.material == other.material
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The whole XTS key's size in bits: 256 or 512.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Encrypts one data unit (whole 16-byte blocks) in place; `sector` is its first 512-byte
    /// sector's number, the tweak of `aes-xts-plain64`.
    #[inline]
    pub fn encrypt(&self, unit: &mut [u8], sector: u64) {
        match &self.xts {
            Cipher::Aes128(x) => x.encrypt(unit, sector),
            Cipher::Aes256(x) => x.encrypt(unit, sector),
        }
    }

    /// Encrypts one data unit from `src` into `dst` (the same length), leaving `src` alone;
    /// `sector` as for [`CryptoKey::encrypt`].
    #[inline]
    pub fn encrypt_to(&self, src: &[u8], dst: &mut [u8], sector: u64) {
        match &self.xts {
            Cipher::Aes128(x) => x.encrypt_to(src, dst, sector),
            Cipher::Aes256(x) => x.encrypt_to(src, dst, sector),
        }
    }

    /// Decrypts one data unit in place; `sector` as for [`CryptoKey::encrypt`].
    #[inline]
    pub fn decrypt(&self, unit: &mut [u8], sector: u64) {
        match &self.xts {
            Cipher::Aes128(x) => x.decrypt(unit, sector),
            Cipher::Aes256(x) => x.decrypt(unit, sector),
        }
    }
}

/// One daemon's accel crypto keys: the crypto module's state.
#[derive(Default)]
pub struct AccelKeys {
    /// Accel crypto keys by name.
    pub accel: Mutex<BTreeMap<String, Arc<CryptoKey>>>,
    /// The key each crypto bdev was created with, by bdev name, to name the users of a key in
    /// an error. Entries of deleted bdevs stay until the name is reused; callers filter them.
    users: Mutex<BTreeMap<String, String>>,
}

impl AccelKeys {
    /// Adds an accel key; refuses a name taken (naming `name`).
    pub fn add_accel(&self, key: CryptoKey) -> Result<(), BdevError> {
        let mut keys = self.accel.lock().unwrap_or_else(|p| p.into_inner());
        if keys.contains_key(key.name()) {
            return Err(invalid("name", format!("a crypto key named '{}' exists", key.name())));
        }
        keys.insert(key.name().to_string(), Arc::new(key));
        Ok(())
    }

    /// The accel key `name`, for a crypto bdev (field `key_name`).
    pub fn accel_key(&self, name: &str) -> Result<Arc<CryptoKey>, BdevError> {
        let keys = self.accel.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(name).cloned().ok_or_else(|| invalid("key_name", format!("no crypto key named '{name}'")))
    }

    /// Destroys the accel key `name`; refused while a crypto bdev holds it.
    pub fn destroy_accel(&self, name: &str, is_crypto_bdev: &dyn Fn(&str) -> bool) -> Result<(), BdevError> {
        let mut keys = self.accel.lock().unwrap_or_else(|p| p.into_inner());
        let key =
            keys.get(name).ok_or_else(|| invalid("key_name", format!("no crypto key named '{name}'")))?;
        if Arc::strong_count(key) > 1 {
            let users = self.users.lock().unwrap_or_else(|p| p.into_inner());
            let named: Vec<&str> = users
                .iter()
                .filter(|(bdev, k)| k.as_str() == name && is_crypto_bdev(bdev))
                .map(|(bdev, _)| bdev.as_str())
                .collect();
            let by = if named.is_empty() {
                "a crypto bdev".to_string()
            } else {
                format!("'{}'", named.join("', '"))
            };
            return Err(invalid(
                "key_name",
                format!("crypto key '{name}' is in use by {by}: delete the crypto bdev first"),
            ));
        }
        keys.remove(name);
        Ok(())
    }

    /// Records that crypto bdev `bdev` uses the key `key`.
    pub fn note_user(&self, bdev: &str, key: &str) {
        self.users.lock().unwrap_or_else(|p| p.into_inner()).insert(bdev.to_string(), key.to_string());
    }
}
