//! The anti-forensic information splitter (the LUKS1 specification's "AF-Splitter"; LUKS2 keeps
//! it as `"af": {"type": "luks1"}`): the key is stored as `stripes` blocks, all but the last
//! random, so wiping any part of the area destroys the key. Written here: it is format logic,
//! a few lines over the hash.

use crate::crypto::{secret, Hash};
use rand::RngCore;
use zeroize::Zeroizing;

/// The anti-forensic stripes of every key slot (cryptsetup writes and accepts only 4000).
pub(crate) const STRIPES: u32 = 4000;

/// The diffusion function H: the block is cut into hash-sized pieces, piece `i` replaced by
/// hash(be32(i) || piece) (the last, shorter piece by the same hash's prefix).
fn diffuse(hash: Hash, block: &mut [u8]) {
    let len = hash.len();
    for (i, piece) in block.chunks_mut(len).enumerate() {
        let index = (i as u32).to_be_bytes();
        let digest = Zeroizing::new(hash.digest(&[&index, piece]));
        let n = piece.len();
        piece.copy_from_slice(&digest[..n]);
    }
}

/// Splits `key` into `stripes` blocks of its length (stripes × key.len() bytes).
pub(crate) fn split(key: &[u8], stripes: u32, hash: Hash) -> Zeroizing<Vec<u8>> {
    let n = key.len();
    let stripes = stripes as usize;
    let mut out = secret(n * stripes);
    rand::rngs::OsRng.fill_bytes(&mut out[..n * (stripes - 1)]);
    let mut d = secret(n);
    for stripe in out[..n * (stripes - 1)].chunks(n) {
        d.iter_mut().zip(stripe).for_each(|(a, b)| *a ^= b);
        diffuse(hash, &mut d);
    }
    let last = &mut out[n * (stripes - 1)..];
    last.iter_mut().zip(d.iter().zip(key)).for_each(|(o, (a, b))| *o = a ^ b);
    out
}

/// Merges `stripes` blocks of `key_len` bytes (the start of `material`) back into the key.
pub(crate) fn merge(material: &[u8], key_len: usize, stripes: u32, hash: Hash) -> Zeroizing<Vec<u8>> {
    let stripes = stripes as usize;
    let mut d = secret(key_len);
    for stripe in material[..key_len * (stripes - 1)].chunks(key_len) {
        d.iter_mut().zip(stripe).for_each(|(a, b)| *a ^= b);
        diffuse(hash, &mut d);
    }
    let last = &material[key_len * (stripes - 1)..key_len * stripes];
    d.iter_mut().zip(last).for_each(|(a, b)| *a ^= b);
    d
}

/// The bytes a split key occupies on disk: whole 512-byte sectors (cryptsetup's
/// AF_split_sectors).
pub(crate) fn split_bytes(key_len: usize, stripes: u32) -> u64 {
    (key_len as u64 * stripes as u64).div_ceil(512) * 512
}
