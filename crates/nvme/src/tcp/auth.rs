//! The host's side of DH-HMAC-CHAP (NVMe Base 2.0 §8.13, in-band authentication) on one queue,
//! run right after the queue's Fabrics Connect when the controller's answer sets AUTHREQ.ATR:
//!
//! ```text
//! host                                   controller
//! AUTH_Send    AUTH_Negotiate      ->    (hashes and DH groups offered)
//! AUTH_Receive DH-HMAC-CHAP_Challenge <- (hash, group, C1, S1, g^y)
//! AUTH_Send    DH-HMAC-CHAP_Reply  ->    (R1, g^x, and C2 + S2 to authenticate the controller)
//! AUTH_Receive DH-HMAC-CHAP_Success1 <-  (R2 when asked) or AUTH_Failure1
//! AUTH_Send    DH-HMAC-CHAP_Success2 ->  (only when C2 was sent and R2 matched)
//! ```
//!
//! A failure on the host's side (a malformed or unexpected message, a hash or group not offered,
//! a wrong R2) sends AUTH_Failure2 before the error is returned; every command is bounded by
//! the caller's timeout. The computations and message formats are `fp_crypto::dhchap`'s and
//! `fp_nvme_spec::auth`'s.

use std::time::Duration;

use fp_crypto::dhchap::{self, DhKeyPair, DhchapSecret, Transaction};
use fp_nvme_spec::auth::{
    AuthCommand, AuthMessage, Challenge, DhGroupId, Failure, FailureReason, HashId, Negotiate,
    ProtocolDescriptor, Reply, Success2, MAX_DHCHAP_MESSAGE_LEN,
};
use fp_nvme_spec::Cqe;

use super::queue::TcpQueue;
use crate::transport::AdminData;
use crate::NvmeError;

/// The hashes and DH groups a host offers (`bdev_nvme_set_options`' `dhchap_digests` and
/// `dhchap_dhgroups`): sets, offered in identifier order as SPDK's host offers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DhchapOffer {
    /// Bit `id` set: the hash of identifier `id` is offered.
    digests: u8,
    /// Bit `id` set: the DH group of identifier `id` is offered.
    dhgroups: u8,
}

impl Default for DhchapOffer {
    /// Everything: SHA-256/384/512, the null group and ffdhe2048 to ffdhe8192.
    fn default() -> DhchapOffer {
        DhchapOffer::new(HashId::ALL, DhGroupId::ALL)
    }
}

impl DhchapOffer {
    /// An offer of `digests` and `dhgroups` (their order does not matter).
    pub fn new(digests: &[HashId], dhgroups: &[DhGroupId]) -> DhchapOffer {
        DhchapOffer {
            digests: digests.iter().fold(0, |m, h| m | 1 << *h as u8),
            dhgroups: dhgroups.iter().fold(0, |m, g| m | 1 << *g as u8),
        }
    }

    /// The hashes offered, in identifier order.
    pub fn digests(&self) -> Vec<HashId> {
        HashId::ALL.iter().copied().filter(|h| self.digests & (1 << *h as u8) != 0).collect()
    }

    /// The DH groups offered, in identifier order.
    pub fn dhgroups(&self) -> Vec<DhGroupId> {
        DhGroupId::ALL.iter().copied().filter(|g| self.dhgroups & (1 << *g as u8) != 0).collect()
    }
}

/// What a host authenticates with: its key, the controller's key when the controller is to
/// be authenticated too (bidirectional), and what it offers.
#[derive(Debug, Clone, Default)]
pub struct DhchapHost {
    /// The host's secret (`dhchap_key`); `None`: a controller asking for authentication is
    /// refused.
    pub key: Option<DhchapSecret>,
    /// The controller's secret (`dhchap_ctrlr_key`): the controller must prove it has it.
    pub ctrlr_key: Option<DhchapSecret>,
    /// The hashes and groups offered.
    pub offer: DhchapOffer,
}

/// The transaction's identity on the wire and in the responses.
pub(super) struct QueueAuth<'a> {
    /// The queue (for the errors).
    pub qid: u16,
    /// The transaction identifier (T_ID), unique per queue of the controller.
    pub t_id: u16,
    /// The host's NQN.
    pub hostnqn: &'a str,
    /// The subsystem's NQN.
    pub subnqn: &'a str,
    /// Each command's bound.
    pub timeout: Duration,
}

/// A failure of the transaction: the error to return, and whether the host tells the
/// controller with AUTH_Failure2 (not after the controller's own AUTH_Failure1).
pub(super) struct Refusal {
    pub(super) error: NvmeError,
    pub(super) failure2: Option<FailureReason>,
}

fn auth_error(q: &QueueAuth<'_>, step: &str, why: impl std::fmt::Display) -> NvmeError {
    step_error(q.qid, step, why)
}

/// A refusal the host reports to the controller with `reason`.
fn refuse(q: &QueueAuth<'_>, step: &str, reason: FailureReason, why: impl std::fmt::Display) -> Refusal {
    Refusal { error: auth_error(q, step, why), failure2: Some(reason) }
}

/// Completions of other commands that come during the transaction (an admin queue's
/// Asynchronous Event Requests when it re-authenticates), handed on with their tags.
pub(super) type Others<'a> = &'a mut dyn FnMut(u32, &Cqe);

/// Authenticates the queue `tq` as `host`: just connected, its Connect answer asking for it,
/// or live (a re-authentication: the admin queue after `bdev_nvme_set_keys`), other commands'
/// completions going to `other`.
pub(super) fn authenticate(
    tq: &mut TcpQueue,
    host: &DhchapHost,
    q: &QueueAuth<'_>,
    other: Others<'_>,
) -> Result<(), NvmeError> {
    let Some(key) = &host.key else {
        return Err(auth_error(
            q,
            "Connect",
            "the controller requires DH-HMAC-CHAP authentication and no dhchap_key was given",
        ));
    };
    match transaction(tq, key, host, q, other) {
        Ok(()) => Ok(()),
        Err(r) => {
            if let Some(reason) = r.failure2 {
                // The error reported is the transaction's; the controller may be gone.
                if let Err(e) = send(tq, q, "AUTH_Failure2", &failure2(q.t_id, reason), other) {
                    log::info!("nvme tcp queue {}: AUTH_Failure2 not delivered: {e}", q.qid);
                }
            }
            Err(r.error)
        }
    }
}

/// The host's AUTH_Failure2 with `reason`.
pub(super) fn failure2(t_id: u16, reason: FailureReason) -> Vec<u8> {
    encoded(AuthMessage::Failure(Failure { t_id, from_controller: false, reason }))
}

/// The error of a queue whose re-authentication `step` failed.
pub(super) fn step_error(qid: u16, step: &str, why: impl std::fmt::Display) -> NvmeError {
    NvmeError::Auth(format!("queue {qid}: {step}: {why}"))
}

/// Sends `msg` with Authentication Send.
fn send(
    tq: &mut TcpQueue,
    q: &QueueAuth<'_>,
    step: &str,
    msg: &[u8],
    other: Others<'_>,
) -> Result<(), NvmeError> {
    let sqe = AuthCommand { send: true, length: msg.len() as u32 }.to_sqe(0);
    let cqe = tq.run(&sqe, AdminData::ToDevice(msg), q.timeout, other)?;
    if !cqe.status.is_success() {
        return Err(auth_error(
            q,
            step,
            format!("Authentication Send failed with sct {:#x} sc {:#x}", cqe.status.sct, cqe.status.sc),
        ));
    }
    Ok(())
}

/// Receives one message's bytes with Authentication Receive into `b`.
fn receive(
    tq: &mut TcpQueue,
    q: &QueueAuth<'_>,
    step: &str,
    b: &mut [u8],
    other: Others<'_>,
) -> Result<(), Refusal> {
    let sqe = AuthCommand { send: false, length: b.len() as u32 }.to_sqe(0);
    let cqe = tq
        .run(&sqe, AdminData::FromDevice(b), q.timeout, other)
        .map_err(|error| Refusal { error, failure2: None })?;
    if !cqe.status.is_success() {
        return Err(Refusal {
            error: auth_error(
                q,
                step,
                format!(
                    "Authentication Receive failed with sct {:#x} sc {:#x}",
                    cqe.status.sct, cqe.status.sc
                ),
            ),
            failure2: None,
        });
    }
    Ok(())
}

/// A connection lost while Success1 is awaited is a refused response: Linux's nvmet fails the
/// controller once it has refused the host's response, and the connection may close before its
/// AUTH_Failure1 is sent.
pub(super) fn closed_after_reply(q: &QueueAuth<'_>, r: Refusal) -> Refusal {
    match r.error {
        NvmeError::Gone(why) => Refusal {
            error: auth_error(
                q,
                SUCCESS1,
                format!(
                    "the controller closed the connection after the host's response ({why}), as a target \
                     that refused it may do before sending AUTH_Failure1: is dhchap_key the one the \
                     subsystem has for {}?",
                    q.hostnqn
                ),
            ),
            failure2: None,
        },
        _ => r,
    }
}

/// The controller's AUTH_Failure1 (or an out-of-order message) where `step` was expected.
fn unexpected(q: &QueueAuth<'_>, step: &str, m: &AuthMessage) -> Refusal {
    match m {
        AuthMessage::Failure(f) if f.from_controller => Refusal {
            error: auth_error(q, step, format!("the controller refused: AUTH_Failure1 {:?}", f.reason)),
            failure2: None,
        },
        other => refuse(
            q,
            step,
            FailureReason::IncorrectProtocolMessage,
            format!("{} received instead", message_name(other)),
        ),
    }
}

fn message_name(m: &AuthMessage) -> &'static str {
    match m {
        AuthMessage::Negotiate(_) => "AUTH_Negotiate",
        AuthMessage::Challenge(_) => "DH-HMAC-CHAP_Challenge",
        AuthMessage::Reply(_) => "DH-HMAC-CHAP_Reply",
        AuthMessage::Success1(_) => "DH-HMAC-CHAP_Success1",
        AuthMessage::Success2(_) => "DH-HMAC-CHAP_Success2",
        AuthMessage::Failure(_) => "AUTH_Failure2",
    }
}

fn encoded(m: AuthMessage) -> Vec<u8> {
    let mut b = vec![0u8; m.encoded_len()];
    // The buffer is the message's length and the host builds only valid messages.
    let n = m.encode(&mut b).expect("a host message fits its own length");
    b.truncate(n);
    b
}

pub(super) const NEGOTIATE: &str = "AUTH_Negotiate";
pub(super) const CHALLENGE: &str = "DH-HMAC-CHAP_Challenge";
pub(super) const REPLY: &str = "DH-HMAC-CHAP_Reply";
pub(super) const SUCCESS1: &str = "DH-HMAC-CHAP_Success1";
pub(super) const SUCCESS2: &str = "DH-HMAC-CHAP_Success2";

/// What the host keeps between the Challenge and Success1 when it asked the controller to
/// authenticate itself: the controller's key, the host's challenge C2 as augmented with the
/// session key (so the session key itself is not kept) and the sequence number S2.
pub(super) struct Asked {
    ctrlr_key: DhchapSecret,
    ca2: Vec<u8>,
    s2: u32,
}

/// The host's side of one transaction, without I/O: it makes the messages the host sends and
/// judges those the controller answers, in order ([`HostTransaction::negotiate`],
/// [`HostTransaction::challenge`], [`HostTransaction::success1`]). A refusal ends it.
pub(super) struct HostTransaction<'a> {
    key: &'a DhchapSecret,
    host: &'a DhchapHost,
    q: &'a QueueAuth<'a>,
    /// After the Challenge: its hash and what was asked.
    after_challenge: AuthState,
}

/// Where a [`HostTransaction`] is between the controller's messages (kept by a queue that runs
/// the transaction a step per poll): after the Challenge, its hash and what the host asked.
pub(super) type AuthState = Option<(HashId, Option<Asked>)>;

impl<'a> HostTransaction<'a> {
    pub(super) fn new(key: &'a DhchapSecret, host: &'a DhchapHost, q: &'a QueueAuth<'a>) -> Self {
        HostTransaction { key, host, q, after_challenge: None }
    }

    /// The transaction again at `state` (from [`HostTransaction::into_state`]).
    pub(super) fn resume(
        key: &'a DhchapSecret,
        host: &'a DhchapHost,
        q: &'a QueueAuth<'a>,
        state: AuthState,
    ) -> Self {
        HostTransaction { key, host, q, after_challenge: state }
    }

    /// Where the transaction is, to [`HostTransaction::resume`] it at the next message.
    pub(super) fn into_state(self) -> AuthState {
        self.after_challenge
    }

    /// The AUTH_Negotiate that starts the transaction.
    pub(super) fn negotiate(&self) -> Vec<u8> {
        let protocols =
            vec![ProtocolDescriptor::dhchap(&self.host.offer.digests(), &self.host.offer.dhgroups())];
        encoded(AuthMessage::Negotiate(Negotiate { t_id: self.q.t_id, sc_c: 0, protocols }))
    }

    /// The controller's message where `step` is expected, parsed and of this transaction.
    fn parse(&self, step: &str, b: &[u8]) -> Result<AuthMessage, Refusal> {
        let q = self.q;
        let m = AuthMessage::parse(b).map_err(|e| refuse(q, step, FailureReason::IncorrectPayload, e))?;
        if m.t_id() != q.t_id {
            return Err(refuse(
                q,
                step,
                FailureReason::IncorrectPayload,
                format!("T_ID {} is not this transaction's ({})", m.t_id(), q.t_id),
            ));
        }
        Ok(m)
    }

    /// The DH-HMAC-CHAP_Challenge received: the host's Reply to send.
    pub(super) fn challenge(&mut self, b: &[u8]) -> Result<Vec<u8>, Refusal> {
        let q = self.q;
        if self.after_challenge.is_some() {
            return Err(refuse(q, CHALLENGE, FailureReason::IncorrectProtocolMessage, "a second Challenge"));
        }
        let ch: Challenge = match self.parse(CHALLENGE, b)? {
            AuthMessage::Challenge(c) => c,
            other => return Err(unexpected(q, CHALLENGE, &other)),
        };
        if !self.host.offer.digests().contains(&ch.hash) {
            return Err(refuse(
                q,
                CHALLENGE,
                FailureReason::HashUnusable,
                format!("hash {} was not offered", ch.hash.name()),
            ));
        }
        if !self.host.offer.dhgroups().contains(&ch.dh_group) {
            return Err(refuse(
                q,
                CHALLENGE,
                FailureReason::DhGroupUnusable,
                format!("DH group {} was not offered", ch.dh_group.name()),
            ));
        }
        let pair = DhKeyPair::generate(ch.dh_group);
        let session_key = pair
            .shared_secret(&ch.dh_value)
            .map_err(|e| refuse(q, CHALLENGE, FailureReason::IncorrectPayload, e))?;
        let session_key = session_key.as_deref().map(|k| k.as_slice());
        let t = self.transaction(ch.hash);
        let ca1 = dhchap::augmented_challenge(ch.hash, &ch.challenge, session_key);
        let r1 = dhchap::host_response(&t, &self.key.transformed(q.hostnqn), &ca1, ch.seqnum);
        // Bidirectional: the controller answers the host's own challenge with its key.
        let c2 = self.host.ctrlr_key.as_ref().map(|_| dhchap::random_challenge(ch.hash));
        let asked = self.host.ctrlr_key.as_ref().zip(c2.as_ref()).map(|(ctrlr_key, c2)| Asked {
            ctrlr_key: ctrlr_key.clone(),
            ca2: dhchap::augmented_challenge(ch.hash, c2, session_key),
            s2: dhchap::random_sequence_number(),
        });
        let reply = Reply {
            t_id: q.t_id,
            seqnum: asked.as_ref().map_or(0, |a| a.s2),
            response: r1,
            challenge: c2,
            dh_value: pair.public_value().to_vec(),
        };
        self.after_challenge = Some((ch.hash, asked));
        Ok(encoded(AuthMessage::Reply(reply)))
    }

    fn transaction(&self, hash: HashId) -> Transaction<'a> {
        Transaction { hash, t_id: self.q.t_id, sc_c: 0, hostnqn: self.q.hostnqn, subnqn: self.q.subnqn }
    }

    /// The DH-HMAC-CHAP_Success1 received: done, or the Success2 to send when the host asked
    /// the controller to authenticate itself and it did.
    pub(super) fn success1(&mut self, b: &[u8]) -> Result<Option<Vec<u8>>, Refusal> {
        let q = self.q;
        let Some((hash, asked)) = self.after_challenge.take() else {
            return Err(refuse(q, SUCCESS1, FailureReason::IncorrectProtocolMessage, "no Challenge before"));
        };
        let s1 = match self.parse(SUCCESS1, b)? {
            AuthMessage::Success1(s) => s,
            AuthMessage::Failure(f) if f.from_controller => {
                return Err(Refusal {
                    error: auth_error(
                        q,
                        SUCCESS1,
                        format!(
                            "the controller refused the host's response (AUTH_Failure1 {:?}): is dhchap_key \
                             the one the subsystem has for {}?",
                            f.reason, q.hostnqn
                        ),
                    ),
                    failure2: None,
                })
            }
            other => return Err(unexpected(q, SUCCESS1, &other)),
        };
        let Some(asked) = asked else { return Ok(None) };
        if usize::from(s1.hl) != hash.digest_len() {
            return Err(refuse(
                q,
                SUCCESS1,
                FailureReason::IncorrectPayload,
                format!("HL {} is not {}'s length", s1.hl, hash.name()),
            ));
        }
        let Some(r2) = s1.response else {
            return Err(refuse(
                q,
                SUCCESS1,
                FailureReason::IncorrectPayload,
                "no controller response (RVALID 0) though the host asked for one",
            ));
        };
        let ctrlr_key = asked.ctrlr_key.transformed(q.subnqn);
        let expected = dhchap::controller_response(&self.transaction(hash), &ctrlr_key, &asked.ca2, asked.s2);
        if !dhchap::responses_match(&r2, &expected) {
            return Err(refuse(
                q,
                SUCCESS1,
                FailureReason::Failed,
                "the controller's response does not match dhchap_ctrlr_key: the controller is not the one \
                 the key names",
            ));
        }
        Ok(Some(encoded(AuthMessage::Success2(Success2 { t_id: q.t_id }))))
    }
}

/// Runs the transaction on `tq`: [`HostTransaction`]'s messages by Authentication Send, the
/// controller's by Authentication Receive.
fn transaction(
    tq: &mut TcpQueue,
    key: &DhchapSecret,
    host: &DhchapHost,
    q: &QueueAuth<'_>,
    other: Others<'_>,
) -> Result<(), Refusal> {
    let no_failure2 = |error| Refusal { error, failure2: None };
    let mut t = HostTransaction::new(key, host, q);
    send(tq, q, NEGOTIATE, &t.negotiate(), other).map_err(no_failure2)?;
    let mut b = vec![0u8; MAX_DHCHAP_MESSAGE_LEN];
    receive(tq, q, CHALLENGE, &mut b, other)?;
    let reply = t.challenge(&b)?;
    send(tq, q, REPLY, &reply, other).map_err(no_failure2)?;
    b.fill(0);
    receive(tq, q, SUCCESS1, &mut b, other).map_err(|r| closed_after_reply(q, r))?;
    match t.success1(&b)? {
        Some(success2) => send(tq, q, SUCCESS2, &success2, other).map_err(no_failure2),
        None => Ok(()),
    }
}
