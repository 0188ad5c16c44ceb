//! The XTS mode (IEEE 1619, NIST SP 800-38E) over the `aes` crate's block ciphers, batched.
//!
//! The AES itself is the crate's (AES-NI when the CPU has it, detected at run time). The mode is
//! ours because the `xts-mode` crate encrypts one 16-byte block per call, which keeps AES-NI's
//! pipeline one block deep: about a quarter of `openssl speed -evp aes-256-xts` here. This one
//! computes the tweaks of [`BATCH`] blocks, xors them in, hands the whole batch to the cipher's
//! `encrypt_blocks` (eight blocks in flight with AES-NI), and xors them out again
//! (docs/crypto.md#performance). Data units are whole 16-byte blocks (512 to 4096 bytes here),
//! so ciphertext stealing is never needed and not implemented: a unit that is not a multiple of
//! 16 bytes is refused with a panic, since the bdev only ever passes whole blocks.
//!
//! Checked against the `xts-mode` crate (unit tests and the `crypto_xts` fuzz target), Python's
//! `cryptography` (crates/bdev/tests/xts_plain64.py) and the guest kernel's dm-crypt.

use aes::cipher::inout::InOutBuf;
use aes::cipher::{BlockDecrypt, BlockEncrypt, BlockSizeUser};
use aes::Block;

/// Blocks per pass: 512 bytes of data and of tweaks, well inside L1.
const BATCH: usize = 32;

/// The two AES keys of an XTS key: `data` encrypts the blocks, `tweak` the tweak.
pub(super) struct Xts<C> {
    data: C,
    tweak: C,
}

/// Multiplies a tweak by the primitive element α of GF(2^128), in IEEE 1619's byte order (the
/// tweak as a little-endian number; x^128 = x^7 + x^2 + x + 1).
#[inline(always)]
fn times_alpha(t: u128) -> u128 {
    // The carry out of bit 127 as an all-ones or all-zeroes mask: no multiply, no branch, so
    // the chain from one tweak to the next stays a few cycles long.
    let carry = (((t >> 64) as i64) >> 63) as u128 & 0x87;
    (t << 1) ^ carry
}

#[inline(always)]
fn load(b: &[u8]) -> u128 {
    u128::from_le_bytes(b.try_into().expect("a 16-byte block"))
}

impl<C> Xts<C>
where
    C: BlockEncrypt + BlockDecrypt + BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
{
    pub(super) fn new(data: C, tweak: C) -> Self {
        Xts { data, tweak }
    }

    /// The first block's tweak of the unit numbered `unit`.
    #[inline]
    fn first_tweak(&self, unit: u64) -> u128 {
        let mut t = Block::from(u128::from(unit).to_le_bytes());
        self.tweak.encrypt_block(&mut t);
        load(&t)
    }

    /// Encrypts `src` into `dst` (the same length, whole blocks) as the data unit `unit`.
    pub(super) fn encrypt_to(&self, src: &[u8], dst: &mut [u8], unit: u64) {
        self.run(Some(src), dst, unit, true);
    }

    /// Encrypts the data unit `unit` in place.
    pub(super) fn encrypt(&self, buf: &mut [u8], unit: u64) {
        self.run(None, buf, unit, true);
    }

    /// Decrypts the data unit `unit` in place.
    pub(super) fn decrypt(&self, buf: &mut [u8], unit: u64) {
        self.run(None, buf, unit, false);
    }

    /// One pass per [`BATCH`] blocks: `dst = src ^ T`, the cipher over the batch, `dst ^= T`.
    fn run(&self, src: Option<&[u8]>, dst: &mut [u8], unit: u64, encrypt: bool) {
        assert!(dst.len().is_multiple_of(16), "an XTS data unit here is whole 16-byte blocks");
        if let Some(s) = src {
            assert_eq!(s.len(), dst.len(), "source and destination differ in length");
        }
        let mut t = self.first_tweak(unit);
        let mut tweaks = [0u128; BATCH];
        let mut at = 0;
        while at < dst.len() {
            let n = ((dst.len() - at) / 16).min(BATCH);
            let out = &mut dst[at..at + n * 16];
            match src {
                Some(s) => {
                    let input = &s[at..at + n * 16];
                    for ((tw, block), plain) in
                        tweaks[..n].iter_mut().zip(out.chunks_exact_mut(16)).zip(input.chunks_exact(16))
                    {
                        *tw = t;
                        t = times_alpha(t);
                        block.copy_from_slice(&(load(plain) ^ *tw).to_le_bytes());
                    }
                }
                None => {
                    for (tw, block) in tweaks[..n].iter_mut().zip(out.chunks_exact_mut(16)) {
                        *tw = t;
                        t = times_alpha(t);
                        let v = load(block) ^ *tw;
                        block.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            let (blocks, rest) = InOutBuf::from(&mut *out).into_chunks();
            debug_assert!(rest.is_empty());
            if encrypt {
                self.data.encrypt_blocks_inout(blocks);
            } else {
                self.data.decrypt_blocks_inout(blocks);
            }
            for (tw, block) in tweaks[..n].iter().zip(out.chunks_exact_mut(16)) {
                let v = load(block) ^ tw;
                block.copy_from_slice(&v.to_le_bytes());
            }
            at += n * 16;
        }
    }
}
