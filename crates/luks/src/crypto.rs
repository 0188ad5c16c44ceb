//! The primitives a key slot is made of, over maintained crates: the hashes LUKS names, PBKDF2
//! and Argon2 (the slot's key derivation and the volume key digest), and the aes-xts-plain64
//! encryption of a key slot's area.

use crate::error::{unsupported, LuksError};
use aes::cipher::KeyInit;
use sha2::Digest;
use zeroize::Zeroizing;

/// A hash a LUKS header may name (PBKDF2's HMAC, the AF splitter's diffusion, the LUKS2
/// header checksum). cryptsetup accepts more (ripemd160, whirlpool, ...); these are the ones
/// it makes: sha256 by default, sha1 from old LUKS1 tools, sha512 by choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hash {
    Sha1,
    Sha256,
    Sha512,
}

impl Hash {
    pub(crate) fn parse(what: &'static str, name: &str) -> Result<Hash, LuksError> {
        match name {
            "sha1" => Ok(Hash::Sha1),
            "sha256" => Ok(Hash::Sha256),
            "sha512" => Ok(Hash::Sha512),
            other => Err(unsupported(what, other)),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Hash::Sha1 => "sha1",
            Hash::Sha256 => "sha256",
            Hash::Sha512 => "sha512",
        }
    }

    pub(crate) fn len(self) -> usize {
        match self {
            Hash::Sha1 => 20,
            Hash::Sha256 => 32,
            Hash::Sha512 => 64,
        }
    }

    /// The hash of the concatenation of `parts`.
    pub(crate) fn digest(self, parts: &[&[u8]]) -> Vec<u8> {
        fn run<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
            let mut hasher = D::new();
            for part in parts {
                hasher.update(part);
            }
            hasher.finalize().to_vec()
        }
        match self {
            Hash::Sha1 => run::<sha1::Sha1>(parts),
            Hash::Sha256 => run::<sha2::Sha256>(parts),
            Hash::Sha512 => run::<sha2::Sha512>(parts),
        }
    }

    /// PBKDF2-HMAC with this hash, filling `out`.
    pub(crate) fn pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        match self {
            Hash::Sha1 => pbkdf2::pbkdf2_hmac::<sha1::Sha1>(password, salt, iterations, out),
            Hash::Sha256 => pbkdf2::pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, out),
            Hash::Sha512 => pbkdf2::pbkdf2_hmac::<sha2::Sha512>(password, salt, iterations, out),
        }
    }
}

/// Argon2's parameters as a LUKS2 key slot stores them.
pub(crate) fn argon2(
    id: bool,
    time: u32,
    memory_kib: u32,
    parallel: u32,
    password: &[u8],
    salt: &[u8],
    out: &mut [u8],
) -> Result<(), LuksError> {
    let params = argon2::Params::new(memory_kib, time, parallel, Some(out.len()))
        .map_err(|e| unsupported("kdf", format_args!("argon2 parameters: {e}")))?;
    let algorithm = if id { argon2::Algorithm::Argon2id } else { argon2::Algorithm::Argon2i };
    // LUKS2 uses Argon2 version 1.3 (0x13), the only one cryptsetup makes.
    argon2::Argon2::new(algorithm, argon2::Version::V0x13, params)
        .hash_password_into(password, salt, out)
        .map_err(|e| unsupported("kdf", format_args!("argon2: {e}")))
}

/// Compares two byte strings in time independent of where they differ.
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Encrypts (or decrypts) `buf`, whole 512-byte sectors, with aes-xts-plain64 under `key`
/// (32 or 64 bytes: AES-128 or AES-256 halves), the first sector's IV being 0: a key slot's
/// area is encrypted as a little disk of its own (the LUKS1 specification's key material
/// encryption, the IV counted from the area's start; LUKS2 keeps the LUKS1 scheme for `"area": {"type": "raw"}`).
pub(crate) fn area_crypt(key: &[u8], buf: &mut [u8], encrypt: bool) -> Result<(), LuksError> {
    fn run<C>(key: &[u8], buf: &mut [u8], encrypt: bool) -> Result<(), LuksError>
    where
        C: KeyInit + aes::cipher::BlockEncrypt + aes::cipher::BlockDecrypt + aes::cipher::BlockCipher,
    {
        let (data_key, tweak_key) = key.split_at(key.len() / 2);
        let new = |k: &[u8]| C::new_from_slice(k).map_err(|_| unsupported("key_size", key.len()));
        let xts = xts_mode::Xts128::new(new(data_key)?, new(tweak_key)?);
        if encrypt {
            xts.encrypt_area(buf, 512, 0, xts_mode::get_tweak_default);
        } else {
            xts.decrypt_area(buf, 512, 0, xts_mode::get_tweak_default);
        }
        Ok(())
    }
    match key.len() {
        32 => run::<aes::Aes128>(key, buf, encrypt),
        64 => run::<aes::Aes256>(key, buf, encrypt),
        other => Err(unsupported("key_size", other)),
    }
}

/// A buffer that is wiped when dropped, for derived keys and split key material.
pub(crate) fn secret(len: usize) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(vec![0u8; len])
}
