//! The independent AES-XTS the crypto tests check flashpath against: Python's `cryptography`
//! (crates/crypto/tests/xts_plain64.py), dm-crypt's aes-xts-plain64.

use std::process::Command;

/// The script, shared with the crypto crate's own tests.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../crypto/tests/xts_plain64.py");

/// aes-xts-plain64 over `data` with the XTS key `key_hex` (both halves, in hex), in units of
/// `unit` bytes, the first unit's tweak being 512-byte sector `first`; `mode` is `enc` or `dec`.
pub fn python_xts(mode: &str, key_hex: &str, unit: usize, first: u64, data: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (inp, out) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, data).unwrap();
    let ok = Command::new("python3")
        .arg(SCRIPT)
        .args([mode, key_hex, &unit.to_string(), &first.to_string()])
        .arg(&inp)
        .arg(&out)
        .status()
        .expect("python3 with the cryptography package")
        .success();
    assert!(ok, "python3 failed");
    std::fs::read(out).unwrap()
}
