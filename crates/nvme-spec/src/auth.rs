//! In-band authentication (Base 8.13, "In-band authentication", TP 8006): the Authentication
//! Send and Authentication Receive fabrics commands (Fabrics 3.1 and 3.2, here Base 6.1 and
//! 6.2 with the security protocol of Base 8.13.2), the AUTHREQ bits of the Connect response
//! (Base 6.3, Figure 546), the AUTH_REQUIRED status, and the messages of the DH-HMAC-CHAP
//! protocol (Base 8.13.5): AUTH_Negotiate (8.13.5.2), DH-HMAC-CHAP_Challenge (8.13.5.3),
//! DH-HMAC-CHAP_Reply (8.13.5.4), DH-HMAC-CHAP_Success1 (8.13.5.5), DH-HMAC-CHAP_Success2
//! (8.13.5.6) and AUTH_Failure1 / AUTH_Failure2 (8.13.5.7). The layouts agree with SPDK's
//! `nvmf_spec.h` and Linux's `nvme.h` (`nvmf_auth_dhchap_*_data`). All fields little-endian.
//!
//! Each message is a typed value with `encode` into the caller's buffer and `parse` from the
//! bytes a peer sent; [`AuthMessage::parse`] dispatches on the header. A decoder checks every
//! length field (HL, DHVLEN, NAPD, HALEN, DHLEN) against the bytes it has and names the field
//! it refuses; no input makes it panic. The computations (responses, DH) are not here: they
//! belong to the crypto crate. Pure.

use crate::opcode::*;
use crate::sqe::*;

/// The security protocol of in-band authentication (SECP, Base 8.13.2): DH-HMAC-CHAP and the
/// common messages are all carried under it.
pub const SECP_AUTHENTICATION: u8 = 0xE9;
/// SPSP0 and SPSP1 under [`SECP_AUTHENTICATION`]: both 0x01 (Base 8.13.2).
pub const SPSP_AUTHENTICATION: u8 = 0x01;
// Fields of Authentication Send / Receive (Fabrics Figures 11 and 13): CDW10 bytes 1..3 and
// CDW11.
/// SPSP0, 1 byte.
pub const CMD_SPSP0: usize = 41;
/// SPSP1, 1 byte.
pub const CMD_SPSP1: usize = 42;
/// SECP, 1 byte.
pub const CMD_SECP: usize = 43;
/// Transfer Length (Send) or Allocation Length (Receive), 4 bytes.
pub const CMD_LENGTH: usize = 44;

/// Connect response dword 0 bit 17, AUTHREQ.ATR: the queue must authenticate before any other
/// command (Base 6.3, Figure 546).
pub const AUTHREQ_ATR: u32 = 1 << 17;
/// Connect response dword 0 bit 18, AUTHREQ.ASCR: secure channel concatenation required.
pub const AUTHREQ_ASCR: u32 = 1 << 18;
/// Command-specific status 0x91, Authentication Required: a command on a queue that has not
/// authenticated yet (Base Figure 103).
pub const SC_AUTH_REQUIRED: u8 = 0x91;

/// AUTH_TYPE of the common messages (AUTH_Negotiate, AUTH_Failure1/2).
pub const AUTH_TYPE_COMMON: u8 = 0x00;
/// AUTH_TYPE of the DH-HMAC-CHAP messages.
pub const AUTH_TYPE_DHCHAP: u8 = 0x01;
/// AUTH_ID of AUTH_Negotiate.
pub const AUTH_ID_NEGOTIATE: u8 = 0x00;
/// AUTH_ID of DH-HMAC-CHAP_Challenge.
pub const AUTH_ID_CHALLENGE: u8 = 0x01;
/// AUTH_ID of DH-HMAC-CHAP_Reply.
pub const AUTH_ID_REPLY: u8 = 0x02;
/// AUTH_ID of DH-HMAC-CHAP_Success1.
pub const AUTH_ID_SUCCESS1: u8 = 0x03;
/// AUTH_ID of DH-HMAC-CHAP_Success2.
pub const AUTH_ID_SUCCESS2: u8 = 0x04;
/// AUTH_ID of AUTH_Failure2 (host to controller).
pub const AUTH_ID_FAILURE2: u8 = 0xF0;
/// AUTH_ID of AUTH_Failure1 (controller to host).
pub const AUTH_ID_FAILURE1: u8 = 0xF1;
/// AUTHID of the DH-HMAC-CHAP protocol in a protocol descriptor (Base 8.13.5.2).
pub const AUTHID_DHCHAP: u8 = 0x01;

/// Bytes of a protocol descriptor in AUTH_Negotiate.
pub const PROTOCOL_DESCRIPTOR_LEN: usize = 64;
/// At most 30 hash identifiers and 30 DH group identifiers in a descriptor.
pub const MAX_IDS: usize = 30;
/// Bytes of the header common to the DH-HMAC-CHAP Challenge, Reply, Success1 and Success2.
pub const DHCHAP_HEADER_LEN: usize = 16;
/// Bytes of AUTH_Negotiate before its descriptors.
pub const NEGOTIATE_HEADER_LEN: usize = 8;
/// Bytes of AUTH_Failure1 / AUTH_Failure2.
pub const FAILURE_LEN: usize = 8;
/// The longest DH-HMAC-CHAP message (a Reply at SHA-512 and ffdhe8192): a bound for the
/// transfer length a side accepts outside AUTH_Negotiate.
pub const MAX_DHCHAP_MESSAGE_LEN: usize = DHCHAP_HEADER_LEN + 2 * 64 + 1024;

/// Defines an identifier enum of the DH-HMAC-CHAP protocol: its codes, the names SPDK's RPCs
/// and Linux's configfs use, and one length per value.
macro_rules! id_enum {
    ($(#[$doc:meta])* $name:ident, $len_fn:ident, $len_doc:literal {
        $($(#[$vdoc:meta])* $variant:ident = $id:literal, $text:literal, $len:literal;)+
    }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $($(#[$vdoc])* $variant = $id,)+
        }

        impl $name {
            /// Every value, in the order of its code.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value `id` names, if any.
            pub fn from_id(id: u8) -> Option<$name> {
                $name::ALL.iter().copied().find(|v| *v as u8 == id)
            }

            /// The name SPDK's RPCs and Linux's configfs use.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            #[doc = $len_doc]
            pub fn $len_fn(self) -> usize {
                match self {
                    $($name::$variant => $len,)+
                }
            }
        }
    };
}

id_enum! {
    /// A hash function identifier (Base 8.13.5.2, Figure 602).
    HashId, digest_len, "Bytes of the hash's output: the HL of a message using it." {
        /// SHA-256 (HMAC-SHA-256).
        Sha256 = 1, "sha256", 32;
        /// SHA-384.
        Sha384 = 2, "sha384", 48;
        /// SHA-512.
        Sha512 = 3, "sha512", 64;
    }
}

impl HashId {
    /// The hash whose output is `len` bytes.
    pub fn from_len(len: usize) -> Option<HashId> {
        HashId::ALL.iter().copied().find(|h| h.digest_len() == len)
    }
}

id_enum! {
    /// A Diffie-Hellman group identifier (Base 8.13.5.2, Figure 603): the RFC 7919 groups and
    /// the null group (no exchange).
    DhGroupId, value_len,
    "Bytes of a public value (DHVLEN) in this group: the prime's size, 0 for the null group." {
        /// No Diffie-Hellman exchange: the challenge is used as it is.
        Null = 0, "null", 0;
        /// ffdhe2048.
        Ffdhe2048 = 1, "ffdhe2048", 256;
        /// ffdhe3072.
        Ffdhe3072 = 2, "ffdhe3072", 384;
        /// ffdhe4096.
        Ffdhe4096 = 3, "ffdhe4096", 512;
        /// ffdhe6144.
        Ffdhe6144 = 4, "ffdhe6144", 768;
        /// ffdhe8192.
        Ffdhe8192 = 5, "ffdhe8192", 1024;
    }
}

/// Reason Code Explanation of an AUTH_Failure message (Base 8.13.5.7, Figure 612); the reason
/// code itself is always 1, "authentication failure".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FailureReason {
    /// The responses did not match (wrong key).
    Failed = 1,
    /// No protocol of AUTH_Negotiate is usable.
    ProtocolUnusable = 2,
    /// The secure channel concatenation asked (SC_C) does not match.
    ConcatenationMismatch = 3,
    /// No hash function offered is usable.
    HashUnusable = 4,
    /// No DH group offered is usable.
    DhGroupUnusable = 5,
    /// A message's payload is wrong (a field, a length, a transaction ID).
    IncorrectPayload = 6,
    /// A message came out of order.
    IncorrectProtocolMessage = 7,
}

/// The only reason code defined: authentication failure.
pub const FAILURE_REASON_CODE: u8 = 0x01;

impl FailureReason {
    /// The explanation `rce` names, if any.
    pub fn from_code(rce: u8) -> Option<FailureReason> {
        use FailureReason::*;
        [
            Failed,
            ProtocolUnusable,
            ConcatenationMismatch,
            HashUnusable,
            DhGroupUnusable,
            IncorrectPayload,
            IncorrectProtocolMessage,
        ]
        .into_iter()
        .find(|r| *r as u8 == rce)
    }
}

/// Why bytes are not an authentication message, or a message does not fit or is inconsistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The bytes end before what a field says follows.
    #[error("{message}: {len} bytes, but {field} needs {need}")]
    Short {
        /// The message being decoded.
        message: &'static str,
        /// The field whose value asks for more bytes (or "header").
        field: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes there.
        len: usize,
    },
    /// A field holds a value the message cannot have.
    #[error("{message}: {field} {value:#x} {why}")]
    Field {
        /// The message.
        message: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u32,
        /// What is wrong with it.
        why: &'static str,
    },
    /// AUTH_TYPE / AUTH_ID name no message of DH-HMAC-CHAP.
    #[error("AUTH_TYPE {auth_type:#x} AUTH_ID {auth_id:#x} names no authentication message")]
    UnknownMessage {
        /// AUTH_TYPE.
        auth_type: u8,
        /// AUTH_ID.
        auth_id: u8,
    },
    /// The caller's buffer is too small for the encoded message.
    #[error("{message}: {need} bytes to encode, the buffer has {len}")]
    Buffer {
        /// The message.
        message: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes in the buffer.
        len: usize,
    },
}

fn short(message: &'static str, field: &'static str, need: usize, len: usize) -> AuthError {
    AuthError::Short { message, field, need, len }
}

fn field(message: &'static str, field: &'static str, value: impl Into<u32>, why: &'static str) -> AuthError {
    AuthError::Field { message, field, value: value.into(), why }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Checks that `b` holds `need` bytes for `message`'s `field`.
fn need(b: &[u8], need: usize, message: &'static str, what: &'static str) -> Result<(), AuthError> {
    if b.len() < need {
        return Err(short(message, what, need, b.len()));
    }
    Ok(())
}

/// The first `len` bytes of `out`, zeroed, after checking they exist.
fn out_buffer<'a>(out: &'a mut [u8], len: usize, message: &'static str) -> Result<&'a mut [u8], AuthError> {
    if out.len() < len {
        return Err(AuthError::Buffer { message, need: len, len: out.len() });
    }
    let out = &mut out[..len];
    out.fill(0);
    Ok(out)
}

/// Writes the header every message starts with: AUTH_TYPE, AUTH_ID, 2 reserved, T_ID.
fn put_header(out: &mut [u8], auth_type: u8, auth_id: u8, t_id: u16) {
    out[0] = auth_type;
    out[1] = auth_id;
    out[4..6].copy_from_slice(&t_id.to_le_bytes());
}

/// Checks an HL against the hash lengths: every DH-HMAC-CHAP message's HL is one.
fn check_hl(hl: u8, message: &'static str) -> Result<(), AuthError> {
    match HashId::from_len(hl.into()) {
        Some(_) => Ok(()),
        None => Err(field(message, "HL", hl, "is no hash length (32, 48 or 64)")),
    }
}

// ---- The commands.

/// An Authentication Send (`send`) or Receive command's own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCommand {
    /// Authentication Send (host to controller) rather than Receive.
    pub send: bool,
    /// TL (Send): bytes the host sends; AL (Receive): bytes the host can take.
    pub length: u32,
}

impl AuthCommand {
    /// Decodes an Authentication Send or Receive, refusing a security protocol other than
    /// in-band authentication's (the controller answers Invalid Field).
    pub fn from_sqe(sqe: &Sqe) -> Result<AuthCommand, AuthError> {
        const MESSAGE: &str = "Authentication Send/Receive";
        let send = match (sqe.opcode(), sqe.fctype()) {
            (OPC_FABRICS, FCTYPE_AUTHENTICATION_SEND) => true,
            (OPC_FABRICS, FCTYPE_AUTHENTICATION_RECEIVE) => false,
            (_, fctype) => {
                return Err(field(MESSAGE, "FCTYPE", fctype, "is not Authentication Send or Receive"))
            }
        };
        let b = &sqe.0;
        if b[CMD_SECP] != SECP_AUTHENTICATION {
            return Err(field(MESSAGE, "SECP", b[CMD_SECP], "is not in-band authentication (0xE9)"));
        }
        if b[CMD_SPSP0] != SPSP_AUTHENTICATION {
            return Err(field(MESSAGE, "SPSP0", b[CMD_SPSP0], "is not 0x01"));
        }
        if b[CMD_SPSP1] != SPSP_AUTHENTICATION {
            return Err(field(MESSAGE, "SPSP1", b[CMD_SPSP1], "is not 0x01"));
        }
        Ok(AuthCommand { send, length: u32_at(b, CMD_LENGTH) })
    }

    /// The command, with its SGL left for the transport to fill in.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe([0; SQE_LEN]);
        s.0[0] = OPC_FABRICS;
        s.0[1] = 0x40; // PSDT: SGL
        s.0[2..4].copy_from_slice(&cid.to_le_bytes());
        s.0[4] = if self.send { FCTYPE_AUTHENTICATION_SEND } else { FCTYPE_AUTHENTICATION_RECEIVE };
        s.0[CMD_SPSP0] = SPSP_AUTHENTICATION;
        s.0[CMD_SPSP1] = SPSP_AUTHENTICATION;
        s.0[CMD_SECP] = SECP_AUTHENTICATION;
        s.0[CMD_LENGTH..CMD_LENGTH + 4].copy_from_slice(&self.length.to_le_bytes());
        s
    }
}

// ---- The messages.

/// One protocol descriptor of AUTH_Negotiate (Base 8.13.5.2, Figure 601). The identifiers are
/// kept as sent: a host may offer hashes or groups this side does not know, which the
/// controller skips rather than refuses ([`ProtocolDescriptor::hashes`] and
/// [`ProtocolDescriptor::dh_groups`] give the known ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolDescriptor {
    /// AUTHID: [`AUTHID_DHCHAP`].
    pub auth_id: u8,
    /// HALEN identifiers: hash functions, in the host's order of preference.
    pub hash_ids: Vec<u8>,
    /// DHLEN identifiers: DH groups, in the host's order of preference.
    pub dh_group_ids: Vec<u8>,
}

impl ProtocolDescriptor {
    /// A DH-HMAC-CHAP descriptor offering `hashes` and `groups`.
    pub fn dhchap(hashes: &[HashId], groups: &[DhGroupId]) -> ProtocolDescriptor {
        ProtocolDescriptor {
            auth_id: AUTHID_DHCHAP,
            hash_ids: hashes.iter().map(|h| *h as u8).collect(),
            dh_group_ids: groups.iter().map(|g| *g as u8).collect(),
        }
    }

    /// The hashes offered that have an identifier here, in the order offered.
    pub fn hashes(&self) -> impl Iterator<Item = HashId> + '_ {
        self.hash_ids.iter().filter_map(|id| HashId::from_id(*id))
    }

    /// The DH groups offered that have an identifier here, in the order offered.
    pub fn dh_groups(&self) -> impl Iterator<Item = DhGroupId> + '_ {
        self.dh_group_ids.iter().filter_map(|id| DhGroupId::from_id(*id))
    }
}

/// AUTH_Negotiate (Base 8.13.5.2, Figure 600), host to controller: the transaction, the secure
/// channel concatenation asked, and the protocols offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    /// Transaction identifier, echoed by every later message of the transaction.
    pub t_id: u16,
    /// SC_C: 0 none, 1 new TLS, 2 replace TLS.
    pub sc_c: u8,
    /// At least one descriptor (NAPD).
    pub protocols: Vec<ProtocolDescriptor>,
}

impl Negotiate {
    const NAME: &'static str = "AUTH_Negotiate";

    /// Bytes of the encoded message.
    pub fn encoded_len(&self) -> usize {
        NEGOTIATE_HEADER_LEN + PROTOCOL_DESCRIPTOR_LEN * self.protocols.len()
    }

    /// Encodes the message into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AuthError> {
        let napd = self.protocols.len();
        if napd == 0 || napd > usize::from(u8::MAX) {
            return Err(field(Self::NAME, "NAPD", napd as u32, "is not 1 to 255"));
        }
        for p in &self.protocols {
            if p.hash_ids.len() > MAX_IDS {
                return Err(field(Self::NAME, "HALEN", p.hash_ids.len() as u32, "is above 30"));
            }
            if p.dh_group_ids.len() > MAX_IDS {
                return Err(field(Self::NAME, "DHLEN", p.dh_group_ids.len() as u32, "is above 30"));
            }
        }
        let len = self.encoded_len();
        let out = out_buffer(out, len, Self::NAME)?;
        put_header(out, AUTH_TYPE_COMMON, AUTH_ID_NEGOTIATE, self.t_id);
        out[6] = self.sc_c;
        out[7] = napd as u8;
        for (p, d) in
            self.protocols.iter().zip(out[NEGOTIATE_HEADER_LEN..].chunks_exact_mut(PROTOCOL_DESCRIPTOR_LEN))
        {
            d[0] = p.auth_id;
            d[2] = p.hash_ids.len() as u8;
            d[3] = p.dh_group_ids.len() as u8;
            d[4..4 + p.hash_ids.len()].copy_from_slice(&p.hash_ids);
            d[4 + MAX_IDS..4 + MAX_IDS + p.dh_group_ids.len()].copy_from_slice(&p.dh_group_ids);
        }
        Ok(len)
    }

    /// Decodes the message (its header already says AUTH_Negotiate).
    pub fn parse(b: &[u8]) -> Result<Negotiate, AuthError> {
        need(b, NEGOTIATE_HEADER_LEN, Self::NAME, "the header")?;
        let napd = usize::from(b[7]);
        if napd == 0 {
            return Err(field(Self::NAME, "NAPD", 0u32, "offers no protocol"));
        }
        need(b, NEGOTIATE_HEADER_LEN + PROTOCOL_DESCRIPTOR_LEN * napd, Self::NAME, "NAPD")?;
        let protocols = b[NEGOTIATE_HEADER_LEN..]
            .chunks_exact(PROTOCOL_DESCRIPTOR_LEN)
            .take(napd)
            .map(|d| {
                let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
                if halen > MAX_IDS {
                    return Err(field(Self::NAME, "HALEN", d[2], "is above 30"));
                }
                if dhlen > MAX_IDS {
                    return Err(field(Self::NAME, "DHLEN", d[3], "is above 30"));
                }
                Ok(ProtocolDescriptor {
                    auth_id: d[0],
                    hash_ids: d[4..4 + halen].to_vec(),
                    dh_group_ids: d[4 + MAX_IDS..4 + MAX_IDS + dhlen].to_vec(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Negotiate { t_id: u16_at(b, 4), sc_c: b[6], protocols })
    }
}

/// Checks a DH value's length against its group: none with the null group, the group's size
/// otherwise (a public value is sent padded to the prime's size).
fn check_dhvlen(message: &'static str, group: DhGroupId, dhvlen: u16) -> Result<(), AuthError> {
    if usize::from(dhvlen) != group.value_len() {
        let why = if group == DhGroupId::Null {
            "is not 0 with the null DH group"
        } else {
            "is not the DH group's size"
        };
        return Err(field(message, "DHVLEN", dhvlen, why));
    }
    Ok(())
}

/// DH-HMAC-CHAP_Challenge (Base 8.13.5.3, Figure 604), controller to host: the hash and group
/// chosen, the sequence number S1, the challenge C1 and the controller's public value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Transaction identifier.
    pub t_id: u16,
    /// HASHID: the hash of the responses.
    pub hash: HashId,
    /// DHGID: the DH group.
    pub dh_group: DhGroupId,
    /// SEQNUM: S1.
    pub seqnum: u32,
    /// C1, HL (= the hash's length) bytes.
    pub challenge: Vec<u8>,
    /// DHV: the controller's public value g^y mod p, padded to the group's size; empty with
    /// the null group.
    pub dh_value: Vec<u8>,
}

impl Challenge {
    const NAME: &'static str = "DH-HMAC-CHAP_Challenge";

    /// Bytes of the encoded message.
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + self.challenge.len() + self.dh_value.len()
    }

    /// Encodes the message into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AuthError> {
        if self.challenge.len() != self.hash.digest_len() {
            return Err(field(Self::NAME, "HL", self.challenge.len() as u32, "is not the hash's length"));
        }
        let dhvlen = u16::try_from(self.dh_value.len()).unwrap_or(u16::MAX);
        check_dhvlen(Self::NAME, self.dh_group, dhvlen)?;
        let len = self.encoded_len();
        let out = out_buffer(out, len, Self::NAME)?;
        put_header(out, AUTH_TYPE_DHCHAP, AUTH_ID_CHALLENGE, self.t_id);
        out[6] = self.challenge.len() as u8;
        out[8] = self.hash as u8;
        out[9] = self.dh_group as u8;
        out[10..12].copy_from_slice(&dhvlen.to_le_bytes());
        out[12..16].copy_from_slice(&self.seqnum.to_le_bytes());
        let (c, dhv) = out[DHCHAP_HEADER_LEN..].split_at_mut(self.challenge.len());
        c.copy_from_slice(&self.challenge);
        dhv.copy_from_slice(&self.dh_value);
        Ok(len)
    }

    /// Decodes the message (its header already says DH-HMAC-CHAP_Challenge).
    pub fn parse(b: &[u8]) -> Result<Challenge, AuthError> {
        need(b, DHCHAP_HEADER_LEN, Self::NAME, "the header")?;
        let hash =
            HashId::from_id(b[8]).ok_or(field(Self::NAME, "HASHID", b[8], "names no hash function"))?;
        let dh_group =
            DhGroupId::from_id(b[9]).ok_or(field(Self::NAME, "DHGID", b[9], "names no DH group"))?;
        let hl = usize::from(b[6]);
        if hl != hash.digest_len() {
            return Err(field(Self::NAME, "HL", b[6], "is not HASHID's length"));
        }
        let dhvlen = u16_at(b, 10);
        check_dhvlen(Self::NAME, dh_group, dhvlen)?;
        let end = DHCHAP_HEADER_LEN + hl + usize::from(dhvlen);
        need(b, end, Self::NAME, "HL and DHVLEN")?;
        Ok(Challenge {
            t_id: u16_at(b, 4),
            hash,
            dh_group,
            seqnum: u32_at(b, 12),
            challenge: b[DHCHAP_HEADER_LEN..DHCHAP_HEADER_LEN + hl].to_vec(),
            dh_value: b[DHCHAP_HEADER_LEN + hl..end].to_vec(),
        })
    }
}

/// DH-HMAC-CHAP_Reply (Base 8.13.5.4, Figure 605), host to controller: the response R1, the
/// host's own challenge C2 when it authenticates the controller too (bidirectional), and the
/// host's public value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Transaction identifier.
    pub t_id: u16,
    /// SEQNUM: S2, the host's sequence number for the controller's response; 0 when the host
    /// does not ask for one.
    pub seqnum: u32,
    /// R1, HL bytes.
    pub response: Vec<u8>,
    /// C2 when CVALID (bidirectional), HL bytes; `None` sends HL zero bytes with CVALID clear.
    pub challenge: Option<Vec<u8>>,
    /// DHV: the host's public value g^x mod p, padded to the group's size; empty with the
    /// null group. Its length is checked against the group by whoever knows the group.
    pub dh_value: Vec<u8>,
}

impl Reply {
    const NAME: &'static str = "DH-HMAC-CHAP_Reply";

    /// Bytes of the encoded message.
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + 2 * self.response.len() + self.dh_value.len()
    }

    /// Encodes the message into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AuthError> {
        let hl = self.response.len();
        check_hl(u8::try_from(hl).unwrap_or(0), Self::NAME)?;
        if let Some(c) = &self.challenge {
            if c.len() != hl {
                return Err(field(Self::NAME, "C2", c.len() as u32, "is not HL bytes long"));
            }
        }
        let dhvlen = u16::try_from(self.dh_value.len())
            .map_err(|_| field(Self::NAME, "DHVLEN", self.dh_value.len() as u32, "is above 65535"))?;
        let len = self.encoded_len();
        let out = out_buffer(out, len, Self::NAME)?;
        put_header(out, AUTH_TYPE_DHCHAP, AUTH_ID_REPLY, self.t_id);
        out[6] = hl as u8;
        out[8] = u8::from(self.challenge.is_some());
        out[10..12].copy_from_slice(&dhvlen.to_le_bytes());
        out[12..16].copy_from_slice(&self.seqnum.to_le_bytes());
        let rest = &mut out[DHCHAP_HEADER_LEN..];
        rest[..hl].copy_from_slice(&self.response);
        if let Some(c) = &self.challenge {
            rest[hl..2 * hl].copy_from_slice(c);
        }
        rest[2 * hl..].copy_from_slice(&self.dh_value);
        Ok(len)
    }

    /// Decodes the message (its header already says DH-HMAC-CHAP_Reply).
    pub fn parse(b: &[u8]) -> Result<Reply, AuthError> {
        need(b, DHCHAP_HEADER_LEN, Self::NAME, "the header")?;
        check_hl(b[6], Self::NAME)?;
        let hl = usize::from(b[6]);
        let cvalid = match b[8] {
            0 => false,
            1 => true,
            v => return Err(field(Self::NAME, "CVALID", v, "is neither 0 nor 1")),
        };
        let dhvlen = usize::from(u16_at(b, 10));
        let end = DHCHAP_HEADER_LEN + 2 * hl + dhvlen;
        need(b, end, Self::NAME, "HL and DHVLEN")?;
        let rest = &b[DHCHAP_HEADER_LEN..end];
        Ok(Reply {
            t_id: u16_at(b, 4),
            seqnum: u32_at(b, 12),
            response: rest[..hl].to_vec(),
            challenge: cvalid.then(|| rest[hl..2 * hl].to_vec()),
            dh_value: rest[2 * hl..].to_vec(),
        })
    }
}

/// DH-HMAC-CHAP_Success1 (Base 8.13.5.5, Figure 606), controller to host: the host's response
/// was right; with the controller's response R2 if the host asked for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success1 {
    /// Transaction identifier.
    pub t_id: u16,
    /// HL: the hash's length (also when no response follows).
    pub hl: u8,
    /// R2 when RVALID, HL bytes.
    pub response: Option<Vec<u8>>,
}

impl Success1 {
    const NAME: &'static str = "DH-HMAC-CHAP_Success1";

    /// Bytes of the encoded message: the response field is always there (zero without
    /// RVALID), so HL is the length of what follows the header either way.
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + usize::from(self.hl)
    }

    /// Encodes the message into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AuthError> {
        check_hl(self.hl, Self::NAME)?;
        if let Some(r) = &self.response {
            if r.len() != usize::from(self.hl) {
                return Err(field(Self::NAME, "R2", r.len() as u32, "is not HL bytes long"));
            }
        }
        let len = self.encoded_len();
        let out = out_buffer(out, len, Self::NAME)?;
        put_header(out, AUTH_TYPE_DHCHAP, AUTH_ID_SUCCESS1, self.t_id);
        out[6] = self.hl;
        if let Some(r) = &self.response {
            out[8] = 1;
            out[DHCHAP_HEADER_LEN..].copy_from_slice(r);
        }
        Ok(len)
    }

    /// Decodes the message (its header already says DH-HMAC-CHAP_Success1).
    pub fn parse(b: &[u8]) -> Result<Success1, AuthError> {
        need(b, DHCHAP_HEADER_LEN, Self::NAME, "the header")?;
        check_hl(b[6], Self::NAME)?;
        let hl = usize::from(b[6]);
        // The response field is there whether or not RVALID says it holds R2.
        need(b, DHCHAP_HEADER_LEN + hl, Self::NAME, "HL")?;
        let response = match b[8] {
            0 => None,
            1 => Some(b[DHCHAP_HEADER_LEN..DHCHAP_HEADER_LEN + hl].to_vec()),
            v => return Err(field(Self::NAME, "RVALID", v, "is neither 0 nor 1")),
        };
        Ok(Success1 { t_id: u16_at(b, 4), hl: b[6], response })
    }
}

/// DH-HMAC-CHAP_Success2 (Base 8.13.5.6, Figure 607), host to controller: the controller's
/// response was right (sent only in a bidirectional transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Success2 {
    /// Transaction identifier.
    pub t_id: u16,
}

impl Success2 {
    const NAME: &'static str = "DH-HMAC-CHAP_Success2";

    /// Bytes of the encoded message.
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN
    }

    /// Encodes the message into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AuthError> {
        let out = out_buffer(out, DHCHAP_HEADER_LEN, Self::NAME)?;
        put_header(out, AUTH_TYPE_DHCHAP, AUTH_ID_SUCCESS2, self.t_id);
        Ok(DHCHAP_HEADER_LEN)
    }

    /// Decodes the message (its header already says DH-HMAC-CHAP_Success2).
    pub fn parse(b: &[u8]) -> Result<Success2, AuthError> {
        need(b, DHCHAP_HEADER_LEN, Self::NAME, "the header")?;
        Ok(Success2 { t_id: u16_at(b, 4) })
    }
}

/// AUTH_Failure1 (controller to host, in place of Success1) or AUTH_Failure2 (host to
/// controller) (Base 8.13.5.7, Figure 611).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// Transaction identifier.
    pub t_id: u16,
    /// AUTH_Failure1 (the controller's) rather than AUTH_Failure2 (the host's).
    pub from_controller: bool,
    /// RCE: what failed (RC is always [`FAILURE_REASON_CODE`]).
    pub reason: FailureReason,
}

impl Failure {
    const NAME: &'static str = "AUTH_Failure";

    /// Bytes of the encoded message.
    pub fn encoded_len(&self) -> usize {
        FAILURE_LEN
    }

    /// Encodes the message into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AuthError> {
        let out = out_buffer(out, FAILURE_LEN, Self::NAME)?;
        let id = if self.from_controller { AUTH_ID_FAILURE1 } else { AUTH_ID_FAILURE2 };
        put_header(out, AUTH_TYPE_COMMON, id, self.t_id);
        out[6] = FAILURE_REASON_CODE;
        out[7] = self.reason as u8;
        Ok(FAILURE_LEN)
    }

    /// Decodes an AUTH_Failure1 or AUTH_Failure2 (its header already says which).
    pub fn parse(b: &[u8]) -> Result<Failure, AuthError> {
        need(b, FAILURE_LEN, Self::NAME, "the header")?;
        if b[6] != FAILURE_REASON_CODE {
            return Err(field(Self::NAME, "RC", b[6], "is not 1 (authentication failure)"));
        }
        let reason =
            FailureReason::from_code(b[7]).ok_or(field(Self::NAME, "RCE", b[7], "names no failure"))?;
        Ok(Failure { t_id: u16_at(b, 4), from_controller: b[1] == AUTH_ID_FAILURE1, reason })
    }
}

/// Any authentication message, as [`AuthMessage::parse`] finds it in an Authentication Send's
/// data or an Authentication Receive's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMessage {
    /// AUTH_Negotiate.
    Negotiate(Negotiate),
    /// DH-HMAC-CHAP_Challenge.
    Challenge(Challenge),
    /// DH-HMAC-CHAP_Reply.
    Reply(Reply),
    /// DH-HMAC-CHAP_Success1.
    Success1(Success1),
    /// DH-HMAC-CHAP_Success2.
    Success2(Success2),
    /// AUTH_Failure1 or AUTH_Failure2.
    Failure(Failure),
}

impl AuthMessage {
    /// Decodes the message in `b` from its AUTH_TYPE and AUTH_ID. Bytes past the message's
    /// end are ignored (a transfer may be longer than its message).
    pub fn parse(b: &[u8]) -> Result<AuthMessage, AuthError> {
        need(b, 2, "authentication message", "AUTH_TYPE and AUTH_ID")?;
        Ok(match (b[0], b[1]) {
            (AUTH_TYPE_COMMON, AUTH_ID_NEGOTIATE) => AuthMessage::Negotiate(Negotiate::parse(b)?),
            (AUTH_TYPE_COMMON, AUTH_ID_FAILURE1 | AUTH_ID_FAILURE2) => {
                AuthMessage::Failure(Failure::parse(b)?)
            }
            (AUTH_TYPE_DHCHAP, AUTH_ID_CHALLENGE) => AuthMessage::Challenge(Challenge::parse(b)?),
            (AUTH_TYPE_DHCHAP, AUTH_ID_REPLY) => AuthMessage::Reply(Reply::parse(b)?),
            (AUTH_TYPE_DHCHAP, AUTH_ID_SUCCESS1) => AuthMessage::Success1(Success1::parse(b)?),
            (AUTH_TYPE_DHCHAP, AUTH_ID_SUCCESS2) => AuthMessage::Success2(Success2::parse(b)?),
            (auth_type, auth_id) => return Err(AuthError::UnknownMessage { auth_type, auth_id }),
        })
    }

    /// The transaction identifier every message carries.
    pub fn t_id(&self) -> u16 {
        match self {
            AuthMessage::Negotiate(m) => m.t_id,
            AuthMessage::Challenge(m) => m.t_id,
            AuthMessage::Reply(m) => m.t_id,
            AuthMessage::Success1(m) => m.t_id,
            AuthMessage::Success2(m) => m.t_id,
            AuthMessage::Failure(m) => m.t_id,
        }
    }

    /// Bytes of the encoded message.
    pub fn encoded_len(&self) -> usize {
        match self {
            AuthMessage::Negotiate(m) => m.encoded_len(),
            AuthMessage::Challenge(m) => m.encoded_len(),
            AuthMessage::Reply(m) => m.encoded_len(),
            AuthMessage::Success1(m) => m.encoded_len(),
            AuthMessage::Success2(m) => m.encoded_len(),
            AuthMessage::Failure(m) => m.encoded_len(),
        }
    }

    /// Encodes the message into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AuthError> {
        match self {
            AuthMessage::Negotiate(m) => m.encode(out),
            AuthMessage::Challenge(m) => m.encode(out),
            AuthMessage::Reply(m) => m.encode(out),
            AuthMessage::Success1(m) => m.encode(out),
            AuthMessage::Success2(m) => m.encode(out),
            AuthMessage::Failure(m) => m.encode(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(m: &AuthMessage) -> Vec<u8> {
        let mut out = vec![0xAA; m.encoded_len() + 7];
        let n = m.encode(&mut out).unwrap();
        assert_eq!(n, m.encoded_len());
        out.truncate(n);
        out
    }

    fn round_trip(m: AuthMessage) -> Vec<u8> {
        let b = encoded(&m);
        assert_eq!(AuthMessage::parse(&b).unwrap(), m);
        // Every shorter prefix is refused by name, never a panic.
        for n in 0..b.len() {
            let err = AuthMessage::parse(&b[..n]).expect_err("a prefix is refused");
            assert!(matches!(err, AuthError::Short { .. }), "{m:?} from {n} bytes: {err}");
        }
        // A buffer one byte short is refused.
        let mut small = vec![0; b.len() - 1];
        assert!(matches!(m.encode(&mut small), Err(AuthError::Buffer { .. })));
        b
    }

    /// The negotiation Linux's host sends (`nvme_auth_set_dhchap_negotiate_data`): one
    /// DH-HMAC-CHAP descriptor with its three hashes and six groups. The layout is the kernel's
    /// `struct nvmf_auth_dhchap_negotiate_data` (8 bytes) followed by `struct
    /// nvmf_auth_dhchap_protocol_descriptor` (authid, rsvd, halen, dhlen, idlist[60]), whose
    /// DH group ids start at idlist[30]: descriptor byte 34, message byte 42.
    #[test]
    fn negotiate_byte_image() {
        let m = Negotiate {
            t_id: 1,
            sc_c: 0,
            protocols: vec![ProtocolDescriptor::dhchap(HashId::ALL, DhGroupId::ALL)],
        };
        let mut want = vec![0u8; 72];
        want[..8].copy_from_slice(&[0x00, 0x00, 0, 0, 0x01, 0x00, 0x00, 0x01]);
        want[8..15].copy_from_slice(&[0x01, 0x00, 0x03, 0x06, 0x01, 0x02, 0x03]);
        want[42..48].copy_from_slice(&[0, 1, 2, 3, 4, 5]);
        assert_eq!(round_trip(AuthMessage::Negotiate(m.clone())), want);
        let parsed = Negotiate::parse(&want).unwrap();
        assert_eq!(parsed.protocols[0].hashes().collect::<Vec<_>>(), HashId::ALL);
        assert_eq!(parsed.protocols[0].dh_groups().collect::<Vec<_>>(), DhGroupId::ALL);
    }

    #[test]
    fn negotiate_skips_unknown_ids_and_checks_counts() {
        let mut b = encoded(&AuthMessage::Negotiate(Negotiate {
            t_id: 9,
            sc_c: 0,
            protocols: vec![ProtocolDescriptor {
                auth_id: 1,
                hash_ids: vec![7, 2],
                dh_group_ids: vec![9, 1],
            }],
        }));
        let n = Negotiate::parse(&b).unwrap();
        assert_eq!(n.protocols[0].hashes().collect::<Vec<_>>(), [HashId::Sha384]);
        assert_eq!(n.protocols[0].dh_groups().collect::<Vec<_>>(), [DhGroupId::Ffdhe2048]);
        b[10] = 31;
        assert_eq!(Negotiate::parse(&b).unwrap_err(), field("AUTH_Negotiate", "HALEN", 31u8, "is above 30"));
        b[10] = 2;
        b[11] = 31;
        assert!(matches!(Negotiate::parse(&b), Err(AuthError::Field { field: "DHLEN", .. })));
        b[11] = 2;
        b[7] = 2; // NAPD 2, one descriptor there
        assert_eq!(Negotiate::parse(&b).unwrap_err(), short("AUTH_Negotiate", "NAPD", 136, 72));
        b[7] = 0;
        assert!(matches!(Negotiate::parse(&b), Err(AuthError::Field { field: "NAPD", .. })));
        let none = Negotiate { t_id: 0, sc_c: 0, protocols: vec![] };
        assert!(matches!(none.encode(&mut [0; 64]), Err(AuthError::Field { field: "NAPD", .. })));
        let many = ProtocolDescriptor { auth_id: 1, hash_ids: vec![1; 31], dh_group_ids: vec![] };
        let m = Negotiate { t_id: 0, sc_c: 0, protocols: vec![many] };
        assert!(matches!(m.encode(&mut [0; 128]), Err(AuthError::Field { field: "HALEN", .. })));
    }

    #[test]
    fn challenge_byte_image() {
        let c1: Vec<u8> = (0..32).collect();
        let m = Challenge {
            t_id: 0x1234,
            hash: HashId::Sha256,
            dh_group: DhGroupId::Null,
            seqnum: 0x1234_5678,
            challenge: c1.clone(),
            dh_value: vec![],
        };
        let mut want = vec![0x01, 0x01, 0, 0, 0x34, 0x12, 32, 0, 0x01, 0x00, 0, 0, 0x78, 0x56, 0x34, 0x12];
        want.extend(&c1);
        assert_eq!(round_trip(AuthMessage::Challenge(m)), want);
        // With ffdhe2048: DHVLEN 256 after C1.
        let dhv = vec![0x5A; 256];
        let m = Challenge {
            t_id: 2,
            hash: HashId::Sha512,
            dh_group: DhGroupId::Ffdhe2048,
            seqnum: 1,
            challenge: vec![7; 64],
            dh_value: dhv,
        };
        let b = round_trip(AuthMessage::Challenge(m));
        assert_eq!((b[6], b[8], b[9], u16_at(&b, 10)), (64, 3, 1, 256));
        assert_eq!(b[16 + 64], 0x5A);
    }

    #[test]
    fn challenge_refusals_name_the_field() {
        let m = Challenge {
            t_id: 1,
            hash: HashId::Sha384,
            dh_group: DhGroupId::Ffdhe3072,
            seqnum: 1,
            challenge: vec![1; 48],
            dh_value: vec![2; 384],
        };
        let good = encoded(&AuthMessage::Challenge(m.clone()));
        let refusal = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            match Challenge::parse(&b).unwrap_err() {
                AuthError::Field { field, .. } => field,
                e => panic!("{e}"),
            }
        };
        assert_eq!(refusal(8, 4), "HASHID");
        assert_eq!(refusal(9, 6), "DHGID");
        assert_eq!(refusal(6, 32), "HL");
        // The null group with a DH value, a DH value shorter than the group.
        assert_eq!(refusal(9, 0), "DHVLEN");
        assert_eq!(refusal(10, 0x7F), "DHVLEN");
        assert_eq!(
            Challenge::parse(&good[..good.len() - 1]).unwrap_err(),
            short("DH-HMAC-CHAP_Challenge", "HL and DHVLEN", 448, 447)
        );
        let bad = Challenge { challenge: vec![1; 32], ..m.clone() };
        assert!(matches!(bad.encode(&mut [0; 1024]), Err(AuthError::Field { field: "HL", .. })));
        let bad = Challenge { dh_value: vec![], ..m };
        assert!(matches!(bad.encode(&mut [0; 1024]), Err(AuthError::Field { field: "DHVLEN", .. })));
    }

    #[test]
    fn reply_byte_image() {
        let m = Reply {
            t_id: 5,
            seqnum: 0xA0B0C0D0,
            response: vec![0x11; 32],
            challenge: Some(vec![0x22; 32]),
            dh_value: vec![0x33; 3],
        };
        let mut want = vec![0x01, 0x02, 0, 0, 5, 0, 32, 0, 1, 0, 3, 0, 0xD0, 0xC0, 0xB0, 0xA0];
        want.extend([0x11; 32]);
        want.extend([0x22; 32]);
        want.extend([0x33; 3]);
        assert_eq!(round_trip(AuthMessage::Reply(m)), want);
        // Unidirectional: CVALID 0 and C2's bytes zero, still there.
        let m = Reply { t_id: 5, seqnum: 0, response: vec![0x11; 48], challenge: None, dh_value: vec![] };
        let b = round_trip(AuthMessage::Reply(m));
        assert_eq!((b.len(), b[8]), (16 + 96, 0));
        assert!(b[16 + 48..].iter().all(|&x| x == 0));
    }

    #[test]
    fn reply_refusals_name_the_field() {
        let m = Reply {
            t_id: 5,
            seqnum: 1,
            response: vec![1; 64],
            challenge: Some(vec![2; 64]),
            dh_value: vec![3; 1024],
        };
        let good = encoded(&AuthMessage::Reply(m.clone()));
        let mut b = good.clone();
        b[6] = 33;
        assert!(matches!(Reply::parse(&b), Err(AuthError::Field { field: "HL", .. })));
        let mut b = good.clone();
        b[8] = 2;
        assert!(matches!(Reply::parse(&b), Err(AuthError::Field { field: "CVALID", .. })));
        let mut b = good.clone();
        b[10..12].copy_from_slice(&0xFFFFu16.to_le_bytes());
        assert!(matches!(Reply::parse(&b), Err(AuthError::Short { field: "HL and DHVLEN", .. })));
        let bad = Reply { challenge: Some(vec![2; 32]), ..m.clone() };
        assert!(matches!(bad.encode(&mut [0; 2048]), Err(AuthError::Field { field: "C2", .. })));
        let bad = Reply { response: vec![1; 20], challenge: None, ..m };
        assert!(matches!(bad.encode(&mut [0; 2048]), Err(AuthError::Field { field: "HL", .. })));
    }

    #[test]
    fn success_and_failure_byte_images() {
        let m = Success1 { t_id: 7, hl: 32, response: Some(vec![0x44; 32]) };
        let mut want = vec![0x01, 0x03, 0, 0, 7, 0, 32, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        want.extend([0x44; 32]);
        assert_eq!(round_trip(AuthMessage::Success1(m)), want);
        let m = Success1 { t_id: 7, hl: 64, response: None };
        let b = round_trip(AuthMessage::Success1(m.clone()));
        assert_eq!(b.len(), 80);
        // Without RVALID the response field is still there: HL says how long it is (a decoder
        // that took the header alone encoded back to more bytes than it had read).
        assert_eq!(Success1::parse(&b[..79]).unwrap_err(), short("DH-HMAC-CHAP_Success1", "HL", 80, 79));
        let mut bad = b.clone();
        bad[8] = 3;
        assert!(matches!(Success1::parse(&bad), Err(AuthError::Field { field: "RVALID", .. })));
        bad[8] = 1;
        assert_eq!(Success1::parse(&bad[..40]).unwrap_err(), short("DH-HMAC-CHAP_Success1", "HL", 80, 40));

        let b = round_trip(AuthMessage::Success2(Success2 { t_id: 0xBEEF }));
        assert_eq!(b, [0x01, 0x04, 0, 0, 0xEF, 0xBE, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);

        let f1 = Failure { t_id: 5, from_controller: true, reason: FailureReason::DhGroupUnusable };
        assert_eq!(round_trip(AuthMessage::Failure(f1)), [0x00, 0xF1, 0, 0, 5, 0, 1, 5]);
        let f2 = Failure { t_id: 5, from_controller: false, reason: FailureReason::Failed };
        assert_eq!(round_trip(AuthMessage::Failure(f2)), [0x00, 0xF0, 0, 0, 5, 0, 1, 1]);
        assert!(matches!(
            Failure::parse(&[0, 0xF1, 0, 0, 5, 0, 2, 1]),
            Err(AuthError::Field { field: "RC", .. })
        ));
        assert!(matches!(
            Failure::parse(&[0, 0xF1, 0, 0, 5, 0, 1, 8]),
            Err(AuthError::Field { field: "RCE", .. })
        ));
        assert_eq!(
            AuthMessage::parse(&[1, 0x05, 0, 0]).unwrap_err(),
            AuthError::UnknownMessage { auth_type: 1, auth_id: 5 }
        );
        assert!(matches!(AuthMessage::parse(&[1]), Err(AuthError::Short { .. })));
    }

    #[test]
    fn commands_carry_the_security_protocol() {
        let s = AuthCommand { send: true, length: 72 }.to_sqe(9);
        assert_eq!((s.opcode(), s.fctype(), s.cid()), (OPC_FABRICS, FCTYPE_AUTHENTICATION_SEND, 9));
        // CDW10 = SECP << 24 | SPSP1 << 16 | SPSP0 << 8, as Linux's `nvmf_auth_send_command`.
        assert_eq!((s.cdw(10), s.cdw(11)), (0xE901_0100, 72));
        assert_eq!(AuthCommand::from_sqe(&s).unwrap(), AuthCommand { send: true, length: 72 });
        let r = AuthCommand { send: false, length: 4096 }.to_sqe(1);
        assert_eq!(AuthCommand::from_sqe(&r).unwrap(), AuthCommand { send: false, length: 4096 });
        let mut bad = r;
        bad.0[CMD_SECP] = 0xEA;
        assert!(matches!(AuthCommand::from_sqe(&bad), Err(AuthError::Field { field: "SECP", .. })));
        let mut bad = r;
        bad.0[CMD_SPSP1] = 0;
        assert!(matches!(AuthCommand::from_sqe(&bad), Err(AuthError::Field { field: "SPSP1", .. })));
        let mut bad = r;
        bad.0[4] = FCTYPE_CONNECT;
        assert!(matches!(AuthCommand::from_sqe(&bad), Err(AuthError::Field { field: "FCTYPE", .. })));
        assert_eq!(AUTHREQ_ATR | AUTHREQ_ASCR, 0x6_0000);
    }

    #[test]
    fn ids_know_their_lengths_and_names() {
        assert_eq!(HashId::from_id(2).map(HashId::digest_len), Some(48));
        assert_eq!(HashId::from_len(64), Some(HashId::Sha512));
        assert_eq!(HashId::from_id(0), None);
        assert_eq!(DhGroupId::from_id(5).map(DhGroupId::value_len), Some(1024));
        assert_eq!(DhGroupId::Ffdhe6144.name(), "ffdhe6144");
        assert_eq!(DhGroupId::from_id(6), None);
        assert_eq!(FailureReason::from_code(7), Some(FailureReason::IncorrectProtocolMessage));
        assert_eq!(MAX_DHCHAP_MESSAGE_LEN, 1168);
    }
}
