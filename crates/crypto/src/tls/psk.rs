//! The NVMe/TCP PSK rules (NVMe/TCP Transport 1.1 §3.6.1): the PSK interchange format, the
//! retained PSK, the PSK identity and the TLS PSK derived from both.
//!
//! ```text
//! interchange   NVMeTLSkey-1:<hh>:<base64(configured PSK || le32 CRC-32(configured PSK))>:
//!               hh = 00: the configured PSK is the retained PSK; 01: SHA-256; 02: SHA-384
//! retained      HKDF-Expand-Label_hh(HKDF-Extract_hh(0, configured), "HostNQN", hostnqn, len)
//! identity      NVMe0R<cc> <hostnqn> <subnqn>                     (version 0)
//!               NVMe1R<cc> <hostnqn> <subnqn> <digest>            (version 1, TP8018)
//!               digest = base64(HMAC_cc(retained, hostnqn || " " || subnqn || " NVMe-over-Fabrics"))
//! TLS PSK       HKDF-Expand-Label_cc(HKDF-Extract_cc(0, retained), "nvme-tls-psk", context, L)
//!               context = the identity (version 0) or "<cc> <digest>" (version 1)
//! ```
//!
//! `cc` is the hash of the cipher suite (01: TLS_AES_128_GCM_SHA256, 02:
//! TLS_AES_256_GCM_SHA384): the retained PSK's transform hash, or, for 00, the one its length
//! names (32 bytes: SHA-256, 48: SHA-384). HKDF-Expand-Label is TLS 1.3's (RFC 8446 §7.1: the
//! label prefixed "tls13 ", each of label and context preceded by its length byte). This is
//! libnvme's derivation (`nvme check-tls-key --insert`, which puts the TLS PSK in the kernel's
//! `.nvme` keyring under the identity for tlshd) and the kernel's lookup names
//! (`nvme_tls_psk_default`); the form libnvme used before 1.16 (no length bytes, see
//! [`Derivation`]) is offered on request. Generated PSKs (`NVMe0G`, from a DH-HMAC-CHAP secure channel
//! concatenation) are refused by name.
//!
//! The hashes are RustCrypto's `hkdf`, `hmac` and `sha2`: nothing cryptographic is written
//! here. No error or `Debug` output shows key bytes.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Sha256, Sha384};
use zeroize::Zeroizing;

use crate::key_field::{self, KeyFieldError};

/// The interchange format's prefix and version.
const PREFIX: &str = "NVMeTLSkey-1:";
/// What the PSK digest appends after the NQNs.
const DIGEST_SUFFIX: &[u8] = b"NVMe-over-Fabrics";
/// The longest context (and label) HKDF-Expand-Label can carry: its length is one byte.
const MAX_CONTEXT: usize = 255;
/// The longest NQN (NVMe Base 2.0 §4.5, 223 bytes of UTF-8).
pub const MAX_NQN: usize = 223;

/// How the HKDF-Expand-Label steps lay out their input.
///
/// libnvme (nvme-cli's library) derived the retained and TLS PSKs without HkdfLabel's length
/// bytes and with the length little-endian until 1.16 (nvme-cli 2.16), and keeps that form as
/// its "compat" one; keys a host inserted with an older nvme-cli are of that form. A version 1
/// identity tells them apart (its digest is keyed by the retained PSK); a version 0 identity
/// does not, so a target is told per host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Derivation {
    /// TLS 1.3's HKDF-Expand-Label (RFC 8446 §7.1), as the NVMe/TCP specification asks.
    #[default]
    Rfc8446,
    /// libnvme's form before 1.16.
    LibnvmeCompat,
}

/// The hash of a PSK's cipher suite (and of its retained-PSK transform).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PskHash {
    /// SHA-256: TLS_AES_128_GCM_SHA256, 32-byte PSKs ("01").
    Sha256 = 1,
    /// SHA-384: TLS_AES_256_GCM_SHA384, 48-byte PSKs ("02").
    Sha384 = 2,
}

impl PskHash {
    /// The hash of identifier `id` (1 or 2).
    pub fn from_id(id: u8) -> Option<PskHash> {
        match id {
            1 => Some(PskHash::Sha256),
            2 => Some(PskHash::Sha384),
            _ => None,
        }
    }

    /// The hash a PSK of `len` bytes goes with (interchange hash 00).
    pub fn for_key_len(len: usize) -> Option<PskHash> {
        match len {
            32 => Some(PskHash::Sha256),
            48 => Some(PskHash::Sha384),
            _ => None,
        }
    }

    /// Bytes of its digest, and of its PSKs.
    pub fn digest_len(self) -> usize {
        match self {
            PskHash::Sha256 => 32,
            PskHash::Sha384 => 48,
        }
    }

    /// The TLS 1.3 cipher suite it goes with, as OpenSSL names it.
    pub fn cipher_suite(self) -> &'static str {
        match self {
            PskHash::Sha256 => "TLS_AES_128_GCM_SHA256",
            PskHash::Sha384 => "TLS_AES_256_GCM_SHA384",
        }
    }

    /// HKDF-Extract with no salt, then HKDF-Expand into `len` bytes with the label and context
    /// laid out as `derivation` lays them.
    fn extract_expand_label(
        self,
        derivation: Derivation,
        ikm: &[u8],
        label: &str,
        context: &[u8],
        len: usize,
    ) -> Zeroizing<Vec<u8>> {
        let full_label = format!("tls13 {label}");
        let mut info = Vec::with_capacity(4 + full_label.len() + context.len());
        match derivation {
            // RFC 8446 §7.1's HkdfLabel: length (big-endian), then label and context, each
            // after its length byte.
            Derivation::Rfc8446 => {
                info.extend_from_slice(&(len as u16).to_be_bytes());
                info.push(full_label.len() as u8);
                info.extend_from_slice(full_label.as_bytes());
                info.push(context.len() as u8);
            }
            // libnvme before 1.16: the length little-endian, no length bytes.
            Derivation::LibnvmeCompat => {
                info.extend_from_slice(&(len as u16).to_le_bytes());
                info.extend_from_slice(full_label.as_bytes());
            }
        }
        info.extend_from_slice(context);
        let mut out = Zeroizing::new(vec![0u8; len]);
        let ok = match self {
            PskHash::Sha256 => hkdf::Hkdf::<Sha256>::new(None, ikm).expand(&info, &mut out),
            PskHash::Sha384 => hkdf::Hkdf::<Sha384>::new(None, ikm).expand(&info, &mut out),
        };
        ok.expect("a PSK's length is far below HKDF's limit of 255 hashes");
        out
    }

    /// HMAC with this hash keyed by `key` over the concatenation of `parts` (DH-HMAC-CHAP's,
    /// whose hash identifiers 1 and 2 are the same hashes).
    fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        let hash = match self {
            PskHash::Sha256 => fp_nvme_spec::auth::HashId::Sha256,
            PskHash::Sha384 => fp_nvme_spec::auth::HashId::Sha384,
        };
        crate::dhchap::hmac(hash, key, parts)
    }
}

/// Why a string is not a PSK in the interchange format. No variant quotes the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PskError {
    /// The string does not start with `NVMeTLSkey-1:`.
    #[error("a PSK in the interchange format starts with \"NVMeTLSkey-1:\"")]
    Prefix,
    /// The hash field is not 00, 01 or 02.
    #[error(
        "hash {0:?} after \"NVMeTLSkey-1:\" is not 00 (none), 01 (SHA-256) or 02 (SHA-384) followed by ':'"
    )]
    Hash(String),
    /// The key's base64 does not end with ':'.
    #[error("the PSK's base64 does not end with ':'")]
    Terminator,
    /// The key's base64 does not decode.
    #[error("the PSK is not base64: {0}")]
    Base64(String),
    /// The decoded key is not 32 or 48 bytes (plus 4 of CRC).
    #[error("PSK of {0} bytes: an NVMe/TCP PSK is 32 or 48 bytes")]
    KeyLength(usize),
    /// The hash field names a hash whose length is not the key's.
    #[error("PSK of {len} bytes with hash {hash:02}: hash 01 takes 32 bytes, 02 takes 48")]
    HashLength {
        /// The hash field.
        hash: u8,
        /// The key's bytes.
        len: usize,
    },
    /// The CRC-32 after the key does not match it.
    #[error("the PSK's CRC-32 does not match (stored {stored:#010x}, computed {computed:#010x})")]
    Crc {
        /// The CRC the representation carries.
        stored: u32,
        /// The key's.
        computed: u32,
    },
    /// An NQN the derivation covers is empty, too long or holds a space or NUL.
    #[error("NQN of {0} bytes: a PSK identity takes an NQN of 1 to 223 bytes without spaces or NULs")]
    Nqn(usize),
    /// The identity the TLS PSK is derived for is longer than HKDF-Expand-Label's context.
    #[error("PSK identity of {0} bytes: the TLS PSK derivation takes at most 255")]
    IdentityLength(usize),
}

impl From<KeyFieldError> for PskError {
    fn from(e: KeyFieldError) -> PskError {
        match e {
            KeyFieldError::Terminator => PskError::Terminator,
            KeyFieldError::Base64(m) => PskError::Base64(m),
            KeyFieldError::KeyLength(n) => PskError::KeyLength(n),
            KeyFieldError::Crc { stored, computed } => PskError::Crc { stored, computed },
        }
    }
}

/// A configured PSK, as the interchange format carries it: the key and the hash of its
/// transform into the retained PSK. Cleared on drop; `Debug` shows no key bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    transform: Option<PskHash>,
    key: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfiguredPsk")
            .field("transform", &self.transform)
            .field("key_len", &self.key.len())
            .finish_non_exhaustive()
    }
}

impl ConfiguredPsk {
    /// A configured PSK of `key`, transformed with `transform` into the retained PSK (`None`:
    /// used as the retained PSK, "00"). A transform takes a key of its hash's length; none
    /// takes 32 or 48 bytes.
    pub fn new(transform: Option<PskHash>, key: &[u8]) -> Result<ConfiguredPsk, PskError> {
        match transform {
            None if PskHash::for_key_len(key.len()).is_none() => return Err(PskError::KeyLength(key.len())),
            Some(h) if h.digest_len() != key.len() => {
                return Err(PskError::HashLength { hash: h as u8, len: key.len() })
            }
            _ => {}
        }
        Ok(ConfiguredPsk { transform, key: Zeroizing::new(key.to_vec()) })
    }

    /// Reads the interchange format; whitespace after the final ':' (a key file's newline) is
    /// allowed.
    pub fn parse(text: &str) -> Result<ConfiguredPsk, PskError> {
        let rest = text.strip_prefix(PREFIX).ok_or(PskError::Prefix)?;
        let transform = match rest.get(..3) {
            Some("00:") => None,
            Some("01:") => Some(PskHash::Sha256),
            Some("02:") => Some(PskHash::Sha384),
            _ => return Err(PskError::Hash(rest.chars().take(3).collect())),
        };
        let key = key_field::decode(&rest[3..], &[32, 48])?;
        ConfiguredPsk::new(transform, &key)
    }

    /// The interchange format: `NVMeTLSkey-1:hh:<base64(key || CRC-32 little-endian)>:`.
    pub fn to_interchange(&self) -> Zeroizing<String> {
        let hh = self.transform.map_or(0, |h| h as u8);
        Zeroizing::new(format!("{PREFIX}{hh:02}:{}", *key_field::encode(&self.key)))
    }

    /// The transform's hash (`None`: "00").
    pub fn transform(&self) -> Option<PskHash> {
        self.transform
    }

    /// The hash of the cipher suite the PSK is used with.
    pub fn hash(&self) -> PskHash {
        self.transform
            .or_else(|| PskHash::for_key_len(self.key.len()))
            .expect("a configured PSK is 32 or 48 bytes")
    }

    /// Bytes of the key.
    pub fn key_len(&self) -> usize {
        self.key.len()
    }

    /// The retained PSK for the host `hostnqn`: `HKDF-Expand-Label(HKDF-Extract(0, key),
    /// "HostNQN", hostnqn, len)` with the transform's hash; the key itself for "00".
    pub fn retained(&self, hostnqn: &str) -> Result<RetainedPsk, PskError> {
        self.retained_with(Derivation::Rfc8446, hostnqn)
    }

    /// [`ConfiguredPsk::retained`] by `derivation`; the TLS PSKs of the result follow it too.
    pub fn retained_with(&self, derivation: Derivation, hostnqn: &str) -> Result<RetainedPsk, PskError> {
        check_nqn(hostnqn)?;
        let key = match self.transform {
            None => self.key.clone(),
            Some(h) => {
                h.extract_expand_label(derivation, &self.key, "HostNQN", hostnqn.as_bytes(), self.key.len())
            }
        };
        Ok(RetainedPsk { hash: self.hash(), key, derivation })
    }
}

/// A retained PSK: what a host and a subsystem keep for each other, the input of every TLS PSK
/// between them. Cleared on drop; `Debug` shows no key bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct RetainedPsk {
    hash: PskHash,
    key: Zeroizing<Vec<u8>>,
    /// How its TLS PSKs are derived (as it was).
    derivation: Derivation,
}

impl fmt::Debug for RetainedPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetainedPsk")
            .field("hash", &self.hash)
            .field("derivation", &self.derivation)
            .finish_non_exhaustive()
    }
}

impl RetainedPsk {
    /// The hash of the cipher suite it is used with.
    pub fn hash(&self) -> PskHash {
        self.hash
    }

    /// How it and its TLS PSKs are derived.
    pub fn derivation(&self) -> Derivation {
        self.derivation
    }

    /// The key's bytes (for a caller that stores them; never log them).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The PSK digest of identity version 1: `base64(HMAC(retained, hostnqn || " " || subnqn
    /// || " NVMe-over-Fabrics"))`.
    pub fn digest(&self, hostnqn: &str, subnqn: &str) -> String {
        let mac =
            self.hash.hmac(&self.key, &[hostnqn.as_bytes(), b" ", subnqn.as_bytes(), b" ", DIGEST_SUFFIX]);
        STANDARD.encode(mac)
    }

    /// The PSK identity a host presents to subsystem `subnqn` with this PSK.
    pub fn identity(
        &self,
        version: IdentityVersion,
        hostnqn: &str,
        subnqn: &str,
    ) -> Result<PskIdentity, PskError> {
        check_nqn(hostnqn)?;
        check_nqn(subnqn)?;
        let digest = match version {
            IdentityVersion::V0 => None,
            IdentityVersion::V1 => Some(self.digest(hostnqn, subnqn)),
        };
        Ok(PskIdentity { hash: self.hash, hostnqn: hostnqn.to_owned(), subnqn: subnqn.to_owned(), digest })
    }

    /// Whether `identity` is one this PSK makes: its hash, and for version 1 its digest. (The
    /// NQNs are the caller's to check: they chose this PSK by them.)
    pub fn matches(&self, identity: &PskIdentity) -> bool {
        identity.hash == self.hash
            && identity.digest.as_ref().is_none_or(|d| {
                crate::dhchap::responses_match(
                    d.as_bytes(),
                    self.digest(&identity.hostnqn, &identity.subnqn).as_bytes(),
                )
            })
    }

    /// The TLS PSK for `identity`: `HKDF-Expand-Label(HKDF-Extract(0, retained),
    /// "nvme-tls-psk", context, L)` with the identity's hash.
    pub fn tls_psk(&self, identity: &PskIdentity) -> Result<Zeroizing<Vec<u8>>, PskError> {
        let hash = identity.hash;
        let context = match &identity.digest {
            None => identity.to_string(),
            Some(d) => format!("{:02} {d}", hash as u8),
        };
        if context.len() > MAX_CONTEXT {
            return Err(PskError::IdentityLength(context.len()));
        }
        Ok(hash.extract_expand_label(
            self.derivation,
            &self.key,
            "nvme-tls-psk",
            context.as_bytes(),
            self.key.len(),
        ))
    }
}

/// The version of a PSK identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityVersion {
    /// `NVMe0R<cc> <hostnqn> <subnqn>` (NVMe/TCP 1.0).
    V0,
    /// `NVMe1R<cc> <hostnqn> <subnqn> <digest>` (TP8018, NVMe/TCP 1.1).
    V1,
}

/// A PSK identity, the name a host gives its PSK in the ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PskIdentity {
    hash: PskHash,
    hostnqn: String,
    subnqn: String,
    /// The PSK digest, version 1 only.
    digest: Option<String>,
}

/// Why a PSK identity a host offered is not one this target takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not `NVMe<v><R|G><cc> `.
    #[error("a PSK identity starts with \"NVMe0R\" or \"NVMe1R\", a hash (01 or 02) and a space")]
    Form,
    /// A generated PSK (`NVMe0G`, `NVMe1G`): secure channel concatenation, not offered.
    #[error("generated PSKs (DH-HMAC-CHAP secure channel concatenation) are not supported")]
    Generated,
    /// Not valid UTF-8.
    #[error("the PSK identity is not UTF-8")]
    Utf8,
    /// Not the fields of its version (two NQNs, and a digest in version 1).
    #[error("a version {0} PSK identity holds {1} fields after its prefix")]
    Fields(u8, usize),
    /// An NQN is empty or longer than 223 bytes.
    #[error("an NQN of {0} bytes in the PSK identity")]
    Nqn(usize),
    /// The digest is not the base64 of a digest of its hash.
    #[error("the PSK identity's digest is not the base64 of a {0}-byte hash")]
    Digest(usize),
}

impl PskIdentity {
    /// Reads an identity a host offered (bytes from the ClientHello).
    pub fn parse(bytes: &[u8]) -> Result<PskIdentity, IdentityError> {
        let head = bytes.get(..9).ok_or(IdentityError::Form)?;
        let version = match &head[..6] {
            b"NVMe0R" => IdentityVersion::V0,
            b"NVMe1R" => IdentityVersion::V1,
            b"NVMe0G" | b"NVMe1G" => return Err(IdentityError::Generated),
            _ => return Err(IdentityError::Form),
        };
        let hash = match &head[6..] {
            b"01 " => PskHash::Sha256,
            b"02 " => PskHash::Sha384,
            _ => return Err(IdentityError::Form),
        };
        let text = std::str::from_utf8(&bytes[9..]).map_err(|_| IdentityError::Utf8)?;
        let fields: Vec<&str> = text.split(' ').collect();
        let (want, v) = match version {
            IdentityVersion::V0 => (2, 0),
            IdentityVersion::V1 => (3, 1),
        };
        if fields.len() != want {
            return Err(IdentityError::Fields(v, fields.len()));
        }
        for nqn in &fields[..2] {
            if nqn.is_empty() || nqn.len() > MAX_NQN || nqn.contains('\0') {
                return Err(IdentityError::Nqn(nqn.len()));
            }
        }
        let digest = match fields.get(2) {
            None => None,
            Some(d) => {
                let raw = STANDARD.decode(d).map_err(|_| IdentityError::Digest(hash.digest_len()))?;
                if raw.len() != hash.digest_len() {
                    return Err(IdentityError::Digest(hash.digest_len()));
                }
                Some((*d).to_owned())
            }
        };
        Ok(PskIdentity { hash, hostnqn: fields[0].to_owned(), subnqn: fields[1].to_owned(), digest })
    }

    /// Its version.
    pub fn version(&self) -> IdentityVersion {
        if self.digest.is_some() {
            IdentityVersion::V1
        } else {
            IdentityVersion::V0
        }
    }

    /// The hash of its cipher suite.
    pub fn hash(&self) -> PskHash {
        self.hash
    }

    /// The host's NQN.
    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }

    /// The subsystem's NQN.
    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }
}

impl fmt::Display for PskIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = u8::from(self.digest.is_some());
        write!(f, "NVMe{v}R{:02} {} {}", self.hash as u8, self.hostnqn, self.subnqn)?;
        if let Some(d) = &self.digest {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

/// An NQN an identity can name: 1 to 223 bytes, no space (the identity's separator) or NUL.
fn check_nqn(nqn: &str) -> Result<(), PskError> {
    if nqn.is_empty() || nqn.len() > MAX_NQN || nqn.contains([' ', '\0']) {
        return Err(PskError::Nqn(nqn.len()));
    }
    Ok(())
}
