//! The computations of DH-HMAC-CHAP (NVMe Base 2.0 §8.13.5, in-band authentication), shared by
//! the NVMe/TCP target and the host driver; the wire formats are `fp_nvme_spec::auth`'s.
//!
//! * [`DhchapSecret`]: the `DHHC-1:xx:...:` secret representation and the key transform
//!   (§8.13.5.8);
//! * [`host_response`] (R1, §8.13.5.4), [`controller_response`] (R2, §8.13.5.5) and
//!   [`augmented_challenge`] (Ca, §8.13.5.1);
//! * [`DhKeyPair`]: the FFDHE exchange (ffdhe2048 to ffdhe8192, RFC 7919) and the null group;
//! * [`random_challenge`] and [`random_sequence_number`]: what each side draws per transaction.
//!
//! What each side computes, H being the hash the Challenge's HASHID names:
//!
//! ```text
//! K'  = HMAC_xx(key, NQN || "NVMe-over-Fabrics")   (xx = 00: K' = key)
//! Ca  = HMAC_H(H(g^xy mod p), C)                   (null group: Ca = C)
//! R1  = HMAC_H(K'host, Ca1 || le32(S1) || le16(T_ID) || SC_C || "HostHost"   || hostnqn || 0 || subnqn)
//! R2  = HMAC_H(K'ctrl, Ca2 || le32(S2) || le16(T_ID) || 0    || "Controller" || subnqn  || 0 || hostnqn)
//! ```
//!
//! as Linux (`nvme_auth_transform_key`, `nvme_auth_augmented_challenge`, the host's and the
//! target's `dhchap_*_response`) and SPDK (`nvme_auth.c`) compute them. The hashes and HMACs are
//! RustCrypto's `sha2` and `hmac`, the big integers `crypto-bigint`'s (constant time, see
//! [`DhKeyPair`]): nothing cryptographic is written here. `crypto-bigint` rather than OpenSSL's
//! DH through the libcrypto loader (`openssl.rs`): no new unsafe code, and it works on a host
//! without libcrypto, where the crypto bdev falls back to the `aes` crate too.
//!
//! Cost of one exchange (a key pair and a shared secret: two exponentiations with the short
//! private exponent), release build, three runs on the 2-core development machine while other
//! builds kept its load average near 8: ffdhe2048 1.7–2.3 ms, ffdhe4096 9–13 ms, ffdhe8192
//! 42–54 ms (test `dhchap::tests::exchange_cost`, run with `--release --ignored
//! --nocapture`). The group's Montgomery parameters are computed once per process. The hashes
//! and HMACs cost microseconds.

mod dh;
mod secret;

#[cfg(test)]
mod tests;

use fp_nvme_spec::auth::HashId;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256, Sha384, Sha512};

pub use dh::{private_exponent_bits, DhError, DhKeyPair};
pub use secret::{DhchapSecret, SecretError, KEY_LENS};

fn mac<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

/// HMAC with `hash` keyed by `key` over the concatenation of `parts`.
pub fn hmac(hash: HashId, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match hash {
        HashId::Sha256 => mac::<Hmac<Sha256>>(key, parts),
        HashId::Sha384 => mac::<Hmac<Sha384>>(key, parts),
        HashId::Sha512 => mac::<Hmac<Sha512>>(key, parts),
    }
}

/// The `hash` of `data`.
pub fn digest(hash: HashId, data: &[u8]) -> Vec<u8> {
    match hash {
        HashId::Sha256 => Sha256::digest(data).to_vec(),
        HashId::Sha384 => Sha384::digest(data).to_vec(),
        HashId::Sha512 => Sha512::digest(data).to_vec(),
    }
}

/// The challenge a response covers (§8.13.5.1): with a DH exchange, `HMAC_H(H(Ks), C)` where
/// Ks is the shared secret ([`DhKeyPair::shared_secret`]); with the null group, `C` itself.
pub fn augmented_challenge(hash: HashId, challenge: &[u8], session_key: Option<&[u8]>) -> Vec<u8> {
    match session_key {
        None => challenge.to_vec(),
        Some(ks) => {
            let hashed = zeroize::Zeroizing::new(digest(hash, ks));
            hmac(hash, &hashed, &[challenge])
        }
    }
}

/// What both responses of one transaction cover besides the key, challenge and sequence
/// number.
#[derive(Debug, Clone, Copy)]
pub struct Transaction<'a> {
    /// The hash the Challenge's HASHID names.
    pub hash: HashId,
    /// The transaction identifier (T_ID).
    pub t_id: u16,
    /// SC_C of AUTH_Negotiate (0: no secure channel concatenation).
    pub sc_c: u8,
    /// The host's NQN.
    pub hostnqn: &'a str,
    /// The subsystem's NQN.
    pub subnqn: &'a str,
}

/// The HMAC both responses are: over the (augmented) challenge, the sequence number, the
/// transaction, a byte (SC_C in R1, 0 in R2), who answers, and the two NQNs, the answerer's
/// first.
fn response(
    t: &Transaction<'_>,
    key: &[u8],
    challenge: &[u8],
    seqnum: u32,
    byte: u8,
    who: &[u8],
    nqns: [&str; 2],
) -> Vec<u8> {
    let parts: [&[u8]; 8] = [
        challenge,
        &seqnum.to_le_bytes(),
        &t.t_id.to_le_bytes(),
        &[byte],
        who,
        nqns[0].as_bytes(),
        &[0],
        nqns[1].as_bytes(),
    ];
    hmac(t.hash, key, &parts)
}

/// R1, the host's response (§8.13.5.4): `key` is the host key transformed with the host NQN
/// ([`DhchapSecret::transformed`]), `challenge` C1 or its augmented form, `seqnum` S1.
pub fn host_response(t: &Transaction<'_>, key: &[u8], challenge: &[u8], seqnum: u32) -> Vec<u8> {
    response(t, key, challenge, seqnum, t.sc_c, b"HostHost", [t.hostnqn, t.subnqn])
}

/// R2, the controller's response (§8.13.5.5): `key` is the controller key transformed with
/// the subsystem NQN, `challenge` C2 or its augmented form, `seqnum` S2.
pub fn controller_response(t: &Transaction<'_>, key: &[u8], challenge: &[u8], seqnum: u32) -> Vec<u8> {
    response(t, key, challenge, seqnum, 0, b"Controller", [t.subnqn, t.hostnqn])
}

/// A fresh challenge (C1 or C2) for `hash`: its length in bytes from the operating system's
/// random source.
pub fn random_challenge(hash: HashId) -> Vec<u8> {
    let mut c = vec![0u8; hash.digest_len()];
    rand::rngs::OsRng.fill_bytes(&mut c);
    c
}

/// A fresh sequence number (S1 or S2, §8.13.5.3): random and never 0, which in a Reply means
/// "no controller authentication asked".
pub fn random_sequence_number() -> u32 {
    loop {
        let s = rand::rngs::OsRng.next_u32();
        if s != 0 {
            return s;
        }
    }
}

/// Compares two responses in constant time (a response is checked against the expected one
/// without telling, by its timing, how many bytes matched).
pub fn responses_match(a: &[u8], b: &[u8]) -> bool {
    use crypto_bigint::subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}
