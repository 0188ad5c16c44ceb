//! The finite-field Diffie-Hellman exchange of DH-HMAC-CHAP (Base 8.13.5.1): a key pair in one
//! of the RFC 7919 groups and the shared secret with the peer's public value, both padded to
//! the group's size. The null group exchanges nothing.
//!
//! The arithmetic is `crypto-bigint`'s constant-time Montgomery exponentiation with the
//! modulus chosen at run time (`BoxedMontyForm`); the primes are `rustls::ffdhe_groups`'
//! (RFC 7919 Appendix A), not typed here. The private exponent is short: RFC 7919 §5.2 allows
//! it, and Appendix A gives each group's minimum, 225 bits for ffdhe2048 up to 400 for
//! ffdhe8192. Each is at least twice the group's strength, the lower bound NIST SP 800-56A
//! rev. 3 §5.6.1.1.1 sets; Linux's `dh_safe_prime_gen_privkey` starts from the same bound and
//! rounds it up to a power of two (256 bits at ffdhe2048, 512 at ffdhe8192), a
//! slightly longer choice. That makes an exponentiation cost a few hundred bits, not the
//! prime's size.

use std::sync::OnceLock;

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use fp_nvme_spec::auth::DhGroupId;
use rand::RngCore;
use rustls::ffdhe_groups::{self, FfdheGroup};
use zeroize::{Zeroize, Zeroizing};

/// Why an exchange cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    /// The peer's value is not the group's size.
    #[error("{group} public value of {len} bytes, the group's are {want}")]
    ValueLength {
        /// The group's name.
        group: &'static str,
        /// Bytes received.
        len: usize,
        /// Bytes expected.
        want: usize,
    },
    /// The peer's value is 0, 1, p−1 or not below p (RFC 7919 §5.1).
    #[error("{group} public value outside 1 < y < p-1")]
    ValueRange {
        /// The group's name.
        group: &'static str,
    },
}

/// The RFC 7919 parameters of `group`, `None` for the null group.
fn params(group: DhGroupId) -> Option<(FfdheGroup<'static>, u32)> {
    match group {
        DhGroupId::Null => None,
        DhGroupId::Ffdhe2048 => Some((ffdhe_groups::FFDHE2048, 225)),
        DhGroupId::Ffdhe3072 => Some((ffdhe_groups::FFDHE3072, 275)),
        DhGroupId::Ffdhe4096 => Some((ffdhe_groups::FFDHE4096, 325)),
        DhGroupId::Ffdhe6144 => Some((ffdhe_groups::FFDHE6144, 375)),
        DhGroupId::Ffdhe8192 => Some((ffdhe_groups::FFDHE8192, 400)),
    }
}

/// Bits of the private exponent in `group` (RFC 7919 Appendix A's minimum); 0 for the null
/// group.
pub fn private_exponent_bits(group: DhGroupId) -> u32 {
    params(group).map_or(0, |(_, bits)| bits)
}

struct Group {
    monty: BoxedMontyParams,
    p_minus_1: BoxedUint,
    generator: BoxedUint,
    exponent_bits: u32,
}

impl Group {
    /// The group's parameters, computed once per process: the prime is public, so its
    /// Montgomery parameters are computed in variable time (`new_vartime`), which costs a few
    /// milliseconds less than the constant-time way.
    fn get(group: DhGroupId) -> Option<&'static Group> {
        static GROUPS: [OnceLock<Option<Group>>; 6] = [const { OnceLock::new() }; 6];
        GROUPS[group as usize].get_or_init(|| Group::new(group)).as_ref()
    }

    fn new(group: DhGroupId) -> Option<Group> {
        let (ffdhe, exponent_bits) = params(group)?;
        let bits = (group.value_len() * 8) as u32;
        let p = BoxedUint::from_be_slice(ffdhe.p, bits).expect("an RFC 7919 prime fits its size");
        let one = BoxedUint::one_with_precision(bits);
        let p_minus_1 = p.wrapping_sub(&one);
        let odd = Option::from(Odd::new(p)).expect("an RFC 7919 prime is odd");
        Some(Group {
            monty: BoxedMontyParams::new_vartime(odd),
            p_minus_1,
            generator: BoxedUint::from_be_slice(ffdhe.g, bits).expect("the generator fits"),
            exponent_bits,
        })
    }

    /// `base ^ exponent mod p`, big-endian, padded to the group's size.
    fn pow(&self, base: &BoxedUint, exponent: &BoxedUint, len: usize) -> Zeroizing<Vec<u8>> {
        let x = BoxedMontyForm::new(base.clone(), self.monty.clone());
        let mut r = x.pow_bounded_exp(exponent, self.exponent_bits).retrieve();
        let bytes = Zeroizing::new(r.to_be_bytes().into_vec());
        r.zeroize();
        let mut out = Zeroizing::new(vec![0u8; len]);
        let n = bytes.len().min(len);
        out[len - n..].copy_from_slice(&bytes[bytes.len() - n..]);
        out
    }
}

/// One side's half of an exchange: a private exponent and its public value. The exponent is
/// cleared on drop.
pub struct DhKeyPair {
    group: DhGroupId,
    params: Option<&'static Group>,
    private: BoxedUint,
    public: Vec<u8>,
}

impl std::fmt::Debug for DhKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhKeyPair").field("group", &self.group).finish_non_exhaustive()
    }
}

impl Drop for DhKeyPair {
    fn drop(&mut self) {
        self.private.zeroize();
    }
}

impl DhKeyPair {
    /// A fresh key pair in `group`, its exponent from the operating system's random source;
    /// the null group's has no exponent and an empty public value.
    pub fn generate(group: DhGroupId) -> DhKeyPair {
        let bits = private_exponent_bits(group);
        let mut x = Zeroizing::new(vec![0u8; bits.div_ceil(8) as usize]);
        loop {
            rand::rngs::OsRng.fill_bytes(&mut x);
            if let Some(first) = x.first_mut() {
                // Exactly `bits` bits: the top one set, those above it clear.
                let top = (bits - 1) % 8;
                *first &= (1u16 << (top + 1)).wrapping_sub(1) as u8;
                *first |= 1 << top;
            }
            if let Some(pair) = DhKeyPair::with_private(group, &x) {
                return pair;
            }
        }
    }

    /// The key pair of the private exponent `x` (big-endian, at most the group's exponent
    /// bits); `None` if `x` is below 2 or too long.
    fn with_private(group: DhGroupId, x: &[u8]) -> Option<DhKeyPair> {
        let Some(params) = Group::get(group) else {
            return Some(DhKeyPair { group, params: None, private: BoxedUint::zero(), public: Vec::new() });
        };
        let bits = (group.value_len() * 8) as u32;
        let private = BoxedUint::from_be_slice(x, bits).ok()?;
        if private.bits() > params.exponent_bits || private.bits() < 2 {
            return None;
        }
        let public = params.pow(&params.generator, &private, group.value_len()).to_vec();
        Some(DhKeyPair { group, params: Some(params), private, public })
    }

    /// The group.
    pub fn group(&self) -> DhGroupId {
        self.group
    }

    /// The public value g^x mod p to send (DHV), padded to the group's size; empty for the
    /// null group.
    pub fn public_value(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret with the peer's public value (g^xy mod p, padded to the group's size:
    /// the session key Ks the augmented challenge hashes), after checking the peer's value is
    /// the group's size and 1 < y < p−1. `None` for the null group, whose peer value must be
    /// empty.
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Option<Zeroizing<Vec<u8>>>, DhError> {
        let group = self.group.name();
        let want = self.group.value_len();
        if peer.len() != want {
            return Err(DhError::ValueLength { group, len: peer.len(), want });
        }
        let Some(params) = self.params else { return Ok(None) };
        let bits = (want * 8) as u32;
        let y = BoxedUint::from_be_slice(peer, bits).map_err(|_| DhError::ValueRange { group })?;
        let one = BoxedUint::one_with_precision(bits);
        if y <= one || y >= params.p_minus_1 {
            return Err(DhError::ValueRange { group });
        }
        Ok(Some(params.pow(&y, &self.private, want)))
    }
}

#[cfg(test)]
pub(super) fn key_pair_with_private(group: DhGroupId, x: &[u8]) -> Option<DhKeyPair> {
    DhKeyPair::with_private(group, x)
}
