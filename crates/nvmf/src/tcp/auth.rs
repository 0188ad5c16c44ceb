//! The controller's side of DH-HMAC-CHAP (NVMe Base 2.0 §8.13, in-band authentication) on one
//! queue, driven by the queue's Authentication Send and Receive commands after a Connect whose
//! answer set AUTHREQ.ATR:
//!
//! ```text
//! host                                   controller
//! AUTH_Send    AUTH_Negotiate      ->    pick the first hash and group offered that are allowed
//! AUTH_Receive DH-HMAC-CHAP_Challenge <- (hash, group, C1, S1, g^y)
//! AUTH_Send    DH-HMAC-CHAP_Reply  ->    check R1 with the host's key
//! AUTH_Receive DH-HMAC-CHAP_Success1 <-  (R2 when the host sent C2) or AUTH_Failure1
//! AUTH_Send    DH-HMAC-CHAP_Success2 ->  (bidirectional only)
//! ```
//!
//! [`Authenticator`] is the transaction's state and knows nothing of the transport; a refusal
//! queues AUTH_Failure1 for the host's next Authentication Receive and leaves the queue
//! unauthenticated (the host disconnects or starts again with a new AUTH_Negotiate). The
//! computations and message formats are `fp_crypto::dhchap`'s and `fp_nvme_spec::auth`'s.

use fp_crypto::dhchap::{self, DhKeyPair, DhchapSecret, Transaction};
use fp_nvme_spec::auth::{
    AuthMessage, Challenge, DhGroupId, Failure, FailureReason, HashId, Success1, AUTHID_DHCHAP,
};

/// A host's DH-HMAC-CHAP keys on a subsystem (`nvmf_subsystem_add_host`'s `dhchap_key` and
/// `dhchap_ctrlr_key`, resolved from the keyring).
#[derive(Debug, Clone)]
pub struct DhchapKeys {
    /// The host's secret: a host with one must authenticate.
    pub key: DhchapSecret,
    /// The controller's secret: with it the controller answers a host's challenge
    /// (bidirectional authentication); without it a host asking for that is refused.
    pub ctrlr_key: Option<DhchapSecret>,
    /// The keyring names of `key` and `ctrlr_key`, which `nvmf_get_subsystems` shows (the
    /// secrets are never shown).
    pub key_name: String,
    pub ctrlr_key_name: Option<String>,
}

/// The hashes and DH groups the target allows (`nvmf_set_config`'s `dhchap_digests` and
/// `dhchap_dhgroups`); by default all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhchapConfig {
    /// Allowed hashes.
    pub digests: Vec<HashId>,
    /// Allowed DH groups.
    pub dhgroups: Vec<DhGroupId>,
}

impl Default for DhchapConfig {
    fn default() -> DhchapConfig {
        DhchapConfig { digests: HashId::ALL.to_vec(), dhgroups: DhGroupId::ALL.to_vec() }
    }
}

/// Where the transaction stands.
enum Step {
    /// Waiting for AUTH_Negotiate (first, or after a failure).
    Negotiate,
    /// The Challenge is queued or sent; waiting for the Reply.
    Reply { t_id: u16, hash: HashId, pair: Option<DhKeyPair>, c1: Vec<u8>, s1: u32 },
    /// Success1 is queued; the queue is authenticated once the host has it.
    Success1Queued,
    /// Success1 with R2 is queued or sent; waiting for Success2.
    Success2 { t_id: u16 },
    /// Authenticated.
    Done,
}

/// One queue's transaction, for the host `hostnqn` of subsystem `subnqn`. Pure logic (public
/// for the `nvmf_auth` fuzz target): no I/O, and no panic on any message sequence.
pub struct Authenticator {
    /// `None` when the host has no key (any more): every transaction is refused.
    keys: Option<DhchapKeys>,
    config: DhchapConfig,
    hostnqn: String,
    subnqn: String,
    step: Step,
    /// The message the host's next Authentication Receive gets.
    outgoing: Option<AuthMessage>,
    /// The hash and DH group of the last Challenge.
    negotiated: Option<(HashId, DhGroupId)>,
}

/// Why a host's message was refused (logged; the host gets AUTH_Failure1 with `reason`).
#[derive(Debug)]
pub struct Refused {
    /// The reason code AUTH_Failure1 carries.
    pub reason: FailureReason,
    /// What was wrong, for the log.
    pub why: String,
}

impl Authenticator {
    /// A transaction for a host with `keys` (`None`: a host without keys, always refused).
    pub fn new(keys: Option<DhchapKeys>, config: DhchapConfig, hostnqn: &str, subnqn: &str) -> Authenticator {
        Authenticator {
            keys,
            config,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            step: Step::Negotiate,
            outgoing: None,
            negotiated: None,
        }
    }

    /// The hash and DH group the transaction runs with, once negotiated.
    pub fn negotiated(&self) -> Option<(HashId, DhGroupId)> {
        self.negotiated
    }

    /// A message (a Challenge, Success1 or AUTH_Failure1) waits for the host's Authentication
    /// Receive.
    pub fn has_outgoing(&self) -> bool {
        self.outgoing.is_some()
    }

    /// The transaction succeeded: the queue may run other commands.
    pub fn authenticated(&self) -> bool {
        matches!(self.step, Step::Done)
    }

    /// Takes the host's Authentication Send data. A refusal queues AUTH_Failure1 and returns
    /// why; the command itself still succeeds (the failure is the next Receive's message). The
    /// host's own AUTH_Failure2 ends the transaction with nothing queued.
    pub fn on_send(&mut self, data: &[u8]) -> Result<(), Refused> {
        let result = match AuthMessage::parse(data) {
            Ok(m) => self.step_with(m),
            Err(e) => Err(refused(FailureReason::IncorrectPayload, e)),
        };
        match (&result, AuthMessage::parse(data)) {
            // The host ended the transaction itself (AUTH_Failure2): nothing to answer.
            (Err(_), Ok(AuthMessage::Failure(_))) => {}
            (Err(r), m) => self.fail(m.map_or(0, |m| m.t_id()), r.reason),
            (Ok(()), _) => {}
        }
        result
    }

    /// The message for the host's Authentication Receive, if one is due.
    pub fn on_receive(&mut self) -> Option<AuthMessage> {
        let m = self.outgoing.take()?;
        if matches!(self.step, Step::Success1Queued) {
            self.step = Step::Done;
        }
        Some(m)
    }

    fn fail(&mut self, t_id: u16, reason: FailureReason) {
        self.step = Step::Negotiate;
        self.outgoing = Some(AuthMessage::Failure(Failure { t_id, from_controller: true, reason }));
    }

    fn step_with(&mut self, m: AuthMessage) -> Result<(), Refused> {
        match (std::mem::replace(&mut self.step, Step::Negotiate), m) {
            (Step::Negotiate | Step::Done, AuthMessage::Negotiate(n)) => self.negotiate(n),
            (Step::Reply { t_id, hash, pair, c1, s1 }, AuthMessage::Reply(r)) => {
                self.reply(t_id, hash, pair.as_ref(), &c1, s1, r)
            }
            (Step::Success2 { t_id }, AuthMessage::Success2(s)) => {
                if s.t_id != t_id {
                    return Err(wrong_t_id(s.t_id, t_id));
                }
                self.step = Step::Done;
                Ok(())
            }
            (_, AuthMessage::Failure(f)) => {
                self.outgoing = None;
                Err(Refused {
                    reason: f.reason,
                    why: format!("the host gave up: AUTH_Failure2 {:?}", f.reason),
                })
            }
            (_, other) => Err(refused(
                FailureReason::IncorrectProtocolMessage,
                format!("{} out of order", message_name(&other)),
            )),
        }
    }

    fn negotiate(&mut self, n: fp_nvme_spec::auth::Negotiate) -> Result<(), Refused> {
        if self.keys.is_none() {
            return Err(refused(FailureReason::Failed, "the host has no dhchap_key on this subsystem"));
        }
        if n.sc_c != 0 {
            return Err(refused(FailureReason::ConcatenationMismatch, "secure channel concatenation asked"));
        }
        let Some(p) = n.protocols.iter().find(|p| p.auth_id == AUTHID_DHCHAP) else {
            return Err(refused(FailureReason::ProtocolUnusable, "DH-HMAC-CHAP not offered"));
        };
        let Some(hash) = p.hashes().find(|h| self.config.digests.contains(h)) else {
            return Err(refused(FailureReason::HashUnusable, "no hash offered is allowed (dhchap_digests)"));
        };
        let Some(group) = p.dh_groups().find(|g| self.config.dhgroups.contains(g)) else {
            return Err(refused(
                FailureReason::DhGroupUnusable,
                "no DH group offered is allowed (dhchap_dhgroups)",
            ));
        };
        let pair = (group != DhGroupId::Null).then(|| DhKeyPair::generate(group));
        let c1 = dhchap::random_challenge(hash);
        let s1 = dhchap::random_sequence_number();
        self.negotiated = Some((hash, group));
        self.outgoing = Some(AuthMessage::Challenge(Challenge {
            t_id: n.t_id,
            hash,
            dh_group: group,
            seqnum: s1,
            challenge: c1.clone(),
            dh_value: pair.as_ref().map_or_else(Vec::new, |p| p.public_value().to_vec()),
        }));
        self.step = Step::Reply { t_id: n.t_id, hash, pair, c1, s1 };
        Ok(())
    }

    fn reply(
        &mut self,
        t_id: u16,
        hash: HashId,
        pair: Option<&DhKeyPair>,
        c1: &[u8],
        s1: u32,
        r: fp_nvme_spec::auth::Reply,
    ) -> Result<(), Refused> {
        if r.t_id != t_id {
            return Err(wrong_t_id(r.t_id, t_id));
        }
        if r.response.len() != hash.digest_len() {
            return Err(refused(
                FailureReason::IncorrectPayload,
                format!("HL {} is not {}'s length", r.response.len(), hash.name()),
            ));
        }
        let session_key = match pair {
            Some(p) => {
                p.shared_secret(&r.dh_value).map_err(|e| refused(FailureReason::IncorrectPayload, e))?
            }
            None if r.dh_value.is_empty() => None,
            None => return Err(refused(FailureReason::IncorrectPayload, "a DH value with the null group")),
        };
        let session_key = session_key.as_deref().map(|k| k.as_slice());
        let Some(keys) = &self.keys else {
            return Err(refused(FailureReason::Failed, "the host has no dhchap_key on this subsystem"));
        };
        let t = Transaction { hash, t_id, sc_c: 0, hostnqn: &self.hostnqn, subnqn: &self.subnqn };
        let ca1 = dhchap::augmented_challenge(hash, c1, session_key);
        let expected = dhchap::host_response(&t, &keys.key.transformed(&self.hostnqn), &ca1, s1);
        if !dhchap::responses_match(&r.response, &expected) {
            return Err(refused(FailureReason::Failed, "the host's response does not match its dhchap_key"));
        }
        let hl = hash.digest_len() as u8;
        let Some(c2) = r.challenge else {
            self.outgoing = Some(AuthMessage::Success1(Success1 { t_id, hl, response: None }));
            self.step = Step::Success1Queued;
            return Ok(());
        };
        let Some(ctrlr_key) = &keys.ctrlr_key else {
            return Err(refused(
                FailureReason::Failed,
                "the host asks the controller to authenticate and no dhchap_ctrlr_key is set for it",
            ));
        };
        let ca2 = dhchap::augmented_challenge(hash, &c2, session_key);
        let r2 = dhchap::controller_response(&t, &ctrlr_key.transformed(&self.subnqn), &ca2, r.seqnum);
        self.outgoing = Some(AuthMessage::Success1(Success1 { t_id, hl, response: Some(r2) }));
        self.step = Step::Success2 { t_id };
        Ok(())
    }
}

fn wrong_t_id(got: u16, t_id: u16) -> Refused {
    refused(FailureReason::IncorrectPayload, format!("T_ID {got} is not this transaction's ({t_id})"))
}

fn refused(reason: FailureReason, why: impl std::fmt::Display) -> Refused {
    Refused { reason, why: why.to_string() }
}

/// What a host may send, named for the logs (a controller's message from a host is named so).
fn message_name(m: &AuthMessage) -> &'static str {
    match m {
        AuthMessage::Negotiate(_) => "AUTH_Negotiate",
        AuthMessage::Reply(_) => "DH-HMAC-CHAP_Reply",
        AuthMessage::Success2(_) => "DH-HMAC-CHAP_Success2",
        _ => "a controller's message",
    }
}

#[cfg(test)]
mod tests {
    use fp_nvme_spec::auth::{Negotiate, ProtocolDescriptor, Reply, Success2, MAX_DHCHAP_MESSAGE_LEN};

    use super::*;

    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
    const SUBNQN: &str = "nqn.2016-06.io.spdk:auth";

    fn secret(seed: u8) -> DhchapSecret {
        DhchapSecret::new(Some(HashId::Sha256), &[seed; 32]).unwrap()
    }

    fn encoded(m: AuthMessage) -> Vec<u8> {
        let mut b = vec![0u8; MAX_DHCHAP_MESSAGE_LEN];
        let n = m.encode(&mut b).unwrap();
        b.truncate(n);
        b
    }

    fn negotiate(t_id: u16, hashes: &[HashId], groups: &[DhGroupId]) -> Vec<u8> {
        let protocols = vec![ProtocolDescriptor::dhchap(hashes, groups)];
        encoded(AuthMessage::Negotiate(Negotiate { t_id, sc_c: 0, protocols }))
    }

    fn controller(ctrlr_key: Option<DhchapSecret>, config: DhchapConfig) -> Authenticator {
        let keys = DhchapKeys { key: secret(1), ctrlr_key, key_name: "k".into(), ctrlr_key_name: None };
        Authenticator::new(Some(keys), config, HOSTNQN, SUBNQN)
    }

    fn failure(a: &mut Authenticator) -> FailureReason {
        match a.on_receive() {
            Some(AuthMessage::Failure(f)) if f.from_controller => f.reason,
            other => panic!("expected AUTH_Failure1, got {other:?}"),
        }
    }

    /// Plays the host with `key` (and C2 when `bidirectional`) up to the Reply; returns the
    /// host's half of the exchange and what the controller answered.
    fn host_reply(
        a: &mut Authenticator,
        key: &DhchapSecret,
        group: DhGroupId,
        c2: Option<Vec<u8>>,
    ) -> (Challenge, Option<Vec<u8>>) {
        a.on_send(&negotiate(7, &[HashId::Sha384, HashId::Sha256], &[group])).ok().unwrap();
        let Some(AuthMessage::Challenge(ch)) = a.on_receive() else { panic!("no Challenge") };
        assert_eq!((ch.t_id, ch.hash, ch.dh_group), (7, HashId::Sha384, group));
        let pair = DhKeyPair::generate(group);
        let session = pair.shared_secret(&ch.dh_value).unwrap();
        let session = session.as_deref().map(|k| k.as_slice());
        let t = Transaction { hash: ch.hash, t_id: 7, sc_c: 0, hostnqn: HOSTNQN, subnqn: SUBNQN };
        let ca1 = dhchap::augmented_challenge(ch.hash, &ch.challenge, session);
        let r1 = dhchap::host_response(&t, &key.transformed(HOSTNQN), &ca1, ch.seqnum);
        let dh_value = if group == DhGroupId::Null { Vec::new() } else { pair.public_value().to_vec() };
        let expected_r2 = c2.as_ref().map(|c2| {
            let ca2 = dhchap::augmented_challenge(ch.hash, c2, session);
            dhchap::controller_response(&t, &secret(2).transformed(SUBNQN), &ca2, 99)
        });
        let reply = Reply { t_id: 7, seqnum: 99, response: r1, challenge: c2, dh_value };
        let _ = a.on_send(&encoded(AuthMessage::Reply(reply)));
        (ch, expected_r2)
    }

    #[test]
    fn a_right_key_authenticates_with_and_without_a_group() {
        for group in [DhGroupId::Null, DhGroupId::Ffdhe2048] {
            let mut a = controller(None, DhchapConfig::default());
            host_reply(&mut a, &secret(1), group, None);
            assert!(!a.authenticated());
            let Some(AuthMessage::Success1(s)) = a.on_receive() else { panic!("no Success1") };
            assert_eq!((s.hl, s.response), (48, None));
            assert!(a.authenticated(), "{group:?}");
        }
    }

    #[test]
    fn bidirectional_answers_r2_and_waits_for_success2() {
        for (success2_t_id, authenticated) in [(7, true), (8, false)] {
            let mut a = controller(Some(secret(2)), DhchapConfig::default());
            let c2 = dhchap::random_challenge(HashId::Sha384);
            let (_, expected_r2) = host_reply(&mut a, &secret(1), DhGroupId::Ffdhe2048, Some(c2));
            let Some(AuthMessage::Success1(s)) = a.on_receive() else { panic!("no Success1") };
            assert_eq!(s.response, expected_r2);
            assert!(!a.authenticated());
            let r = a.on_send(&encoded(AuthMessage::Success2(Success2 { t_id: success2_t_id })));
            assert_eq!(a.authenticated(), authenticated, "Success2 with T_ID {success2_t_id}");
            if !authenticated {
                assert_eq!(r.err().unwrap().reason, FailureReason::IncorrectPayload);
            }
        }
    }

    #[test]
    fn a_wrong_key_or_a_missing_controller_key_is_refused() {
        let mut a = controller(None, DhchapConfig::default());
        host_reply(&mut a, &secret(3), DhGroupId::Null, None);
        assert_eq!(failure(&mut a), FailureReason::Failed);
        assert!(!a.authenticated());
        // Asked for R2 without a controller key.
        let mut a = controller(None, DhchapConfig::default());
        host_reply(&mut a, &secret(1), DhGroupId::Null, Some(vec![5; 48]));
        assert_eq!(failure(&mut a), FailureReason::Failed);
        assert!(!a.authenticated());
    }

    #[test]
    fn the_hosts_failure2_ends_the_transaction_with_nothing_queued() {
        let mut a = controller(None, DhchapConfig::default());
        a.on_send(&negotiate(3, &[HashId::Sha256], &[DhGroupId::Null])).ok().unwrap();
        assert!(matches!(a.on_receive(), Some(AuthMessage::Challenge(_))));
        let f = Failure { t_id: 3, from_controller: false, reason: FailureReason::Failed };
        let r = a.on_send(&encoded(AuthMessage::Failure(f))).err().unwrap();
        assert_eq!(r.reason, FailureReason::Failed, "{}", r.why);
        assert!(!a.has_outgoing() && a.on_receive().is_none(), "an answer to the host's AUTH_Failure2");
        // A new transaction may start.
        a.on_send(&negotiate(4, &[HashId::Sha256], &[DhGroupId::Null])).ok().unwrap();
        assert!(matches!(a.on_receive(), Some(AuthMessage::Challenge(c)) if c.t_id == 4));
    }

    #[test]
    fn negotiation_takes_only_what_the_config_allows() {
        let config = DhchapConfig { digests: vec![HashId::Sha512], dhgroups: vec![DhGroupId::Ffdhe3072] };
        let mut a = controller(None, config.clone());
        a.on_send(&negotiate(1, &[HashId::Sha256], &[DhGroupId::Ffdhe3072])).err().unwrap();
        assert_eq!(failure(&mut a), FailureReason::HashUnusable);
        a.on_send(&negotiate(1, &[HashId::Sha512], &[DhGroupId::Null])).err().unwrap();
        assert_eq!(failure(&mut a), FailureReason::DhGroupUnusable);
    }

    #[test]
    fn out_of_order_replayed_or_malformed_messages_are_refused() {
        let mut a = controller(None, DhchapConfig::default());
        // A Reply before any Negotiate; a Success2 out of turn; bytes that are no message.
        let reply = Reply { t_id: 1, seqnum: 0, response: vec![0; 32], challenge: None, dh_value: vec![] };
        let r = a.on_send(&encoded(AuthMessage::Reply(reply))).err().unwrap();
        assert_eq!(r.reason, FailureReason::IncorrectProtocolMessage, "{}", r.why);
        assert_eq!(failure(&mut a), FailureReason::IncorrectProtocolMessage);
        let r = a.on_send(&[0x01, 0x02, 0, 0]).err().unwrap();
        assert_eq!(r.reason, FailureReason::IncorrectPayload, "{}", r.why);
        assert_eq!(failure(&mut a), FailureReason::IncorrectPayload);
        // A Reply of another transaction (T_ID) after a Challenge.
        a.on_send(&negotiate(4, &[HashId::Sha256], &[DhGroupId::Null])).ok().unwrap();
        assert!(matches!(a.on_receive(), Some(AuthMessage::Challenge(_))));
        let reply = Reply { t_id: 5, seqnum: 0, response: vec![0; 32], challenge: None, dh_value: vec![] };
        let r = a.on_send(&encoded(AuthMessage::Reply(reply))).err().unwrap();
        assert_eq!(r.reason, FailureReason::IncorrectPayload, "{}", r.why);
        assert_eq!(failure(&mut a), FailureReason::IncorrectPayload);
        // Nothing queued: a Receive gets nothing.
        assert!(a.on_receive().is_none());
        assert!(!a.authenticated());
    }
}
