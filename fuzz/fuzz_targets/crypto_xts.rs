//! Differential fuzzing of the crypto bdev's AES-XTS (`fp_crypto`): the batched
//! mode over the `aes` crate (`xts.rs`, written for this project), OpenSSL's XTS as the channels
//! run it (`XtsEngine`), and the `xts-mode` crate (one block per call, no shared code) must give
//! the same ciphertext for any key, data unit and sector, and decrypt it back.
//!
//! Input layout: byte 0 bit 0 picks 2×128- or 2×256-bit keys; then the two key halves (16 or 32
//! bytes each), 8 bytes of sector number (little-endian), then the data, cut to whole 16-byte
//! blocks (at most 4 KiB, the largest data unit). Inputs too short, or with equal halves (which
//! XTS refuses), are skipped.
#![no_main]

use std::sync::Arc;

use aes::cipher::KeyInit;
use fp_crypto::{CryptoKey, XtsEngine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let half = if flags & 1 == 0 { 16 } else { 32 };
    if rest.len() < 2 * half + 8 + 16 {
        return;
    }
    let (k1, rest) = rest.split_at(half);
    let (k2, rest) = rest.split_at(half);
    let (sector, plain) = rest.split_at(8);
    let sector = u64::from_le_bytes(sector.try_into().unwrap());
    let len = (plain.len() / 16 * 16).min(4096);
    let plain = &plain[..len];
    let Ok(key) = CryptoKey::new("fuzz", k1, k2) else {
        assert_eq!(k1, k2, "only equal halves are refused here");
        return;
    };
    let tweak = u128::from(sector).to_le_bytes();
    let mut want = plain.to_vec();
    if half == 16 {
        xts_mode::Xts128::new(aes::Aes128::new_from_slice(k1).unwrap(), aes::Aes128::new_from_slice(k2).unwrap())
            .encrypt_sector(&mut want, tweak);
    } else {
        xts_mode::Xts128::new(aes::Aes256::new_from_slice(k1).unwrap(), aes::Aes256::new_from_slice(k2).unwrap())
            .encrypt_sector(&mut want, tweak);
    }
    let mut got = plain.to_vec();
    key.encrypt(&mut got, sector);
    assert_eq!(got, want, "the batched mode");
    key.decrypt(&mut got, sector);
    assert_eq!(got, plain, "the batched mode, decrypted");
    let mut evp = XtsEngine::new(Arc::new(key));
    let mut out = vec![0u8; len];
    evp.encrypt_to(plain, &mut out, sector);
    assert_eq!(out, want, "OpenSSL ({})", evp.name());
    evp.decrypt(&mut out, sector);
    assert_eq!(out, plain, "OpenSSL, decrypted");
});
