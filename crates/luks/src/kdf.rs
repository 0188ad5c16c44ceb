//! How a key slot derives its key from the passphrase (the public description of it).

/// How a key slot derives its key from the passphrase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kdf {
    /// PBKDF2-HMAC with `hash` ("sha1", "sha256", "sha512").
    Pbkdf2 {
        /// The HMAC's hash.
        hash: String,
        /// The iteration count.
        iterations: u32,
    },
    /// Argon2 version 1.3 (LUKS2 only).
    Argon2 {
        /// Argon2id, else Argon2i.
        id: bool,
        /// Passes.
        time: u32,
        /// Memory in KiB.
        memory_kib: u32,
        /// Lanes (cryptsetup's `cpus`).
        parallel: u32,
    },
}
