//! The cipher a channel runs: OpenSSL's AES-XTS when the host has libcrypto (`openssl.rs`),
//! else the batched mode over the `aes` crate (`xts.rs`). Both give the same bytes (checked
//! against each other, Python's `cryptography` and dm-crypt); they differ in speed only.

use std::sync::Arc;

use crate::keys::CryptoKey;
use crate::openssl::EvpXts;

/// One channel's cipher for one key.
pub struct XtsEngine {
    key: Arc<CryptoKey>,
    /// OpenSSL's contexts, encrypting and decrypting; `None` runs `xts.rs`.
    evp: Option<(EvpXts, EvpXts)>,
}

impl XtsEngine {
    /// The fastest engine this host has for `key`.
    pub fn new(key: Arc<CryptoKey>) -> XtsEngine {
        let evp = key.with_material(|m| Some((EvpXts::new(m, true)?, EvpXts::new(m, false)?)));
        XtsEngine { key, evp }
    }

    /// The `aes`-crate engine whatever the host has (for comparisons and tests).
    pub fn rust(key: Arc<CryptoKey>) -> XtsEngine {
        XtsEngine { key, evp: None }
    }

    /// `openssl` or `rust`.
    pub fn name(&self) -> &'static str {
        if self.evp.is_some() {
            "openssl"
        } else {
            "rust"
        }
    }

    /// Encrypts one data unit (whole 16-byte blocks) in place; `sector` is its first 512-byte
    /// sector's number.
    #[inline]
    pub fn encrypt(&mut self, unit: &mut [u8], sector: u64) {
        match &mut self.evp {
            Some((enc, _)) => enc.run_in_place(unit, sector),
            None => self.key.encrypt(unit, sector),
        }
    }

    /// Encrypts `src` into `dst` (the same length), leaving `src` alone.
    #[inline]
    pub fn encrypt_to(&mut self, src: &[u8], dst: &mut [u8], sector: u64) {
        assert_eq!(src.len(), dst.len(), "source and destination differ in length");
        match &mut self.evp {
            Some((enc, _)) => enc.run_to(src, dst, sector),
            None => self.key.encrypt_to(src, dst, sector),
        }
    }

    /// Decrypts one data unit in place.
    #[inline]
    pub fn decrypt(&mut self, unit: &mut [u8], sector: u64) {
        match &mut self.evp {
            Some((_, dec)) => dec.run_in_place(unit, sector),
            None => self.key.decrypt(unit, sector),
        }
    }
}
