//! DH-HMAC-CHAP on a queue against a scripted controller: a listener thread that answers the
//! Connect with AUTHREQ.ATR and then plays the controller's side of the transaction with
//! `fp_crypto::dhchap`, honestly or not.

use std::io::Read;
use std::sync::mpsc;
use std::time::Duration;

use fp_crypto::dhchap::{self, DhKeyPair, DhchapSecret, Transaction};
use fp_nvme_spec::auth::*;
use fp_nvme_spec::tcp::{
    write_r2t, DataHeader, Digests, CAPSULE_CMD_HLEN, DATA_HLEN, FLAG_LAST_PDU, HEADER_ROOM, PDU_CAPSULE_CMD,
    PDU_H2C_DATA,
};
use fp_nvme_spec::{Sqe, Status, SQE_LEN};

use super::hostile::{scripted, Peer};
use super::tests::{transport, NQN};
use super::*;
use crate::NvmeError;

const T: Duration = Duration::from_secs(10);
const NO: Digests = Digests { header: false, data: false };

/// How the scripted controller plays its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Play {
    Honest,
    /// R2 with one bit flipped.
    WrongControllerResponse,
    /// A Challenge whose HL is no hash length.
    MalformedChallenge,
    /// A Challenge of another transaction (a replayed one).
    OtherTransaction,
    /// A Challenge whose DH value is 1 (g^y = 1 would make the session key known).
    TrivialDhValue,
    /// A wrong host response closes the connection without AUTH_Failure1 (Linux's nvmet fails
    /// the controller at once, and may close before the message is sent).
    CloseOnRefusal,
}

struct Controller {
    hash: HashId,
    group: DhGroupId,
    /// The host key the subsystem has for the host.
    host_key: DhchapSecret,
    /// The controller's key.
    ctrlr_key: DhchapSecret,
    hostnqn: String,
    play: Play,
    /// In-capsule data it takes: longer messages come by R2T.
    icd: usize,
    /// A 512-byte read of the host's, held, completed once the host's Negotiate came (I/O
    /// in flight when a re-authentication starts).
    held_read: Option<u16>,
}

/// The in-capsule data the scripted controller takes (what [`connect`] tells the host).
const ICD: usize = 4096;

/// One command from the host: the SQE and its data, in the capsule (at most `icd` bytes) or,
/// when not there, asked for by R2T and taken from the host's H2CData.
fn command(p: &mut Peer, icd: usize) -> Option<(AuthCommand, u16, Vec<u8>)> {
    let mut h = [0u8; CAPSULE_CMD_HLEN];
    p.s.read_exact(&mut h).ok()?;
    assert_eq!(h[0], PDU_CAPSULE_CMD);
    let plen = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
    let mut data = vec![0u8; plen - CAPSULE_CMD_HLEN];
    p.s.read_exact(&mut data).ok()?;
    assert!(data.len() <= icd, "{} bytes in the capsule where the controller takes {icd}", data.len());
    let sqe = Sqe(h[CAPSULE_CMD_HLEN - SQE_LEN..].try_into().unwrap());
    let cmd = AuthCommand::from_sqe(&sqe).expect("an authentication command");
    let cid = u16::from_le_bytes([sqe.0[2], sqe.0[3]]);
    if cmd.send && data.is_empty() && cmd.length > 0 {
        let mut b = [0u8; HEADER_ROOM];
        let n = write_r2t(&mut b, &DataHeader { cccid: cid, ttag: 5, offset: 0, length: cmd.length }, NO);
        p.send(&b[..n]);
        let mut dh = [0u8; DATA_HLEN];
        p.s.read_exact(&mut dh).ok()?;
        assert_eq!(dh[0], PDU_H2C_DATA, "H2CData answers the R2T");
        let d = DataHeader::parse(&dh).expect("an H2CData header");
        assert_eq!((d.cccid, d.ttag, d.offset, d.length), (cid, 5, 0, cmd.length));
        data = vec![0u8; cmd.length as usize];
        p.s.read_exact(&mut data).ok()?;
    }
    if cmd.send {
        assert_eq!(cmd.length as usize, data.len(), "{cmd:?}: TL is the data's length");
    }
    Some((cmd, cid, data))
}

/// The message of the host's next Authentication Send (completed successfully).
fn received(p: &mut Peer, icd: usize) -> Option<AuthMessage> {
    let (cmd, cid, data) = command(p, icd)?;
    assert!(cmd.send, "an Authentication Send");
    p.response(cid, Status::SUCCESS);
    Some(AuthMessage::parse(&data).expect("the host's message parses"))
}

/// `msg` as the data of the host's next Authentication Receive.
fn answer(p: &mut Peer, msg: &[u8]) {
    let Some((cmd, cid, _)) = command(p, ICD) else { return };
    assert!(!cmd.send, "an Authentication Receive");
    assert!(cmd.length as usize >= msg.len(), "AL {} is below the message's {}", cmd.length, msg.len());
    p.c2h(cid, 0, msg.len() as u32, FLAG_LAST_PDU, msg);
    p.response(cid, Status::SUCCESS);
}

fn bytes(m: AuthMessage) -> Vec<u8> {
    let mut b = vec![0u8; m.encoded_len()];
    m.encode(&mut b).unwrap();
    b
}

impl Controller {
    fn new(hash: HashId, group: DhGroupId, host_key: &DhchapSecret, play: Play) -> Controller {
        Controller {
            hash,
            group,
            host_key: host_key.clone(),
            ctrlr_key: secret(9),
            hostnqn: transport(1, false).target().hostnqn.clone(),
            play,
            icd: ICD,
            held_read: None,
        }
    }

    /// Plays the transaction; returns the messages the host sent.
    fn play(self, p: &mut Peer) -> Vec<AuthMessage> {
        let mut seen = Vec::new();
        let Some(m) = received(p, self.icd) else { return seen };
        seen.push(m.clone());
        let AuthMessage::Negotiate(n) = m else { return seen };
        let t_id = n.t_id;
        if let Some(cid) = self.held_read {
            p.c2h(cid, 0, 512, FLAG_LAST_PDU, &[0x5a; 512]);
            p.response(cid, Status::SUCCESS);
        }
        let pair = DhKeyPair::generate(self.group);
        let c1 = dhchap::random_challenge(self.hash);
        let s1 = dhchap::random_sequence_number();
        let mut dh_value = pair.public_value().to_vec();
        if self.play == Play::TrivialDhValue {
            dh_value.fill(0);
            *dh_value.last_mut().expect("a DH group") = 1;
        }
        let mut challenge = bytes(AuthMessage::Challenge(Challenge {
            t_id: if self.play == Play::OtherTransaction { t_id.wrapping_add(1) } else { t_id },
            hash: self.hash,
            dh_group: self.group,
            seqnum: s1,
            challenge: c1.clone(),
            dh_value,
        }));
        if self.play == Play::MalformedChallenge {
            challenge[6] = 7;
        }
        answer(p, &challenge);
        let Some(m) = received(p, self.icd) else { return seen };
        seen.push(m.clone());
        let AuthMessage::Reply(r) = m else { return seen };
        let ks = pair.shared_secret(&r.dh_value).expect("the host's public value");
        let ks = ks.as_deref().map(|k| k.as_slice());
        let t = Transaction { hash: self.hash, t_id, sc_c: 0, hostnqn: &self.hostnqn, subnqn: NQN };
        let ca1 = dhchap::augmented_challenge(self.hash, &c1, ks);
        let r1 = dhchap::host_response(&t, &self.host_key.transformed(&self.hostnqn), &ca1, s1);
        if !dhchap::responses_match(&r.response, &r1) {
            if self.play == Play::CloseOnRefusal {
                // The Authentication Receive that would carry Failure1 is read, not answered.
                let _ = command(p, self.icd);
                return seen;
            }
            let f = Failure { t_id, from_controller: true, reason: FailureReason::Failed };
            answer(p, &bytes(AuthMessage::Failure(f)));
            return seen;
        }
        let r2 = r.challenge.as_ref().map(|c2| {
            let ca2 = dhchap::augmented_challenge(self.hash, c2, ks);
            let mut r2 = dhchap::controller_response(&t, &self.ctrlr_key.transformed(NQN), &ca2, r.seqnum);
            if self.play == Play::WrongControllerResponse {
                r2[0] ^= 1;
            }
            r2
        });
        let hl = self.hash.digest_len() as u8;
        answer(p, &bytes(AuthMessage::Success1(Success1 { t_id, hl, response: r2 })));
        if r.seqnum != 0 {
            if let Some(m) = received(p, self.icd) {
                seen.push(m);
            }
        }
        seen
    }
}

fn secret(fill: u8) -> DhchapSecret {
    DhchapSecret::new(Some(HashId::Sha256), &[fill; 32]).unwrap()
}

/// Connects I/O queue 1 as `host` to `ctrl`; returns the outcome and what the host sent.
fn connect(ctrl: Controller, host: DhchapHost) -> (Result<(), NvmeError>, Vec<AuthMessage>) {
    let ctrl_icd = ctrl.icd as u32;
    let (tx, rx) = mpsc::channel();
    let (port, h) = scripted(NO, |_| {}, 1 | AUTHREQ_ATR, move |p| tx.send(ctrl.play(p)).unwrap());
    let tr = TcpTransport::new(TcpTarget { dhchap: host, ..transport(port, false).target().clone() });
    let r = tr.connect_queue(1, 16, 1, ctrl_icd, T).map(drop);
    h.join().unwrap();
    (r, rx.recv().unwrap())
}

fn host(key: u8, ctrlr_key: Option<u8>) -> DhchapHost {
    DhchapHost { key: Some(secret(key)), ctrlr_key: ctrlr_key.map(secret), offer: DhchapOffer::default() }
}

/// Connects as [`connect`] does, expecting an authentication error; returns its text and what
/// the host sent.
fn refused(ctrl: Controller, host: DhchapHost) -> (String, Vec<AuthMessage>) {
    match connect(ctrl, host) {
        (Err(e @ NvmeError::Auth(_)), seen) => (e.to_string(), seen),
        (other, _) => panic!("expected an authentication error, got {other:?}"),
    }
}

/// The reason of the AUTH_Failure2 the host ended with.
fn failure2(seen: &[AuthMessage]) -> FailureReason {
    match seen.last() {
        Some(AuthMessage::Failure(f)) if !f.from_controller => f.reason,
        other => panic!("expected AUTH_Failure2 last, got {other:?}"),
    }
}

#[test]
fn unidirectional_authentication_offers_everything_and_succeeds() {
    let ctrl = Controller::new(HashId::Sha256, DhGroupId::Null, &secret(1), Play::Honest);
    let (r, seen) = connect(ctrl, host(1, None));
    r.unwrap();
    let [AuthMessage::Negotiate(n), AuthMessage::Reply(reply)] = &seen[..] else { panic!("{seen:?}") };
    // SPDK's default offer, in identifier order.
    assert_eq!(n.protocols, vec![ProtocolDescriptor::dhchap(HashId::ALL, DhGroupId::ALL)]);
    assert_eq!(n.sc_c, 0);
    assert_eq!(reply.seqnum, 0, "no controller authentication asked");
    assert_eq!(reply.challenge, None);
    assert!(reply.dh_value.is_empty(), "the null group has no public value");
}

#[test]
fn bidirectional_authentication_with_a_dh_group_succeeds() {
    let ctrl = Controller::new(HashId::Sha384, DhGroupId::Ffdhe2048, &secret(1), Play::Honest);
    let (r, seen) = connect(ctrl, host(1, Some(9)));
    r.unwrap();
    let [AuthMessage::Negotiate(n), AuthMessage::Reply(reply), AuthMessage::Success2(s2)] = &seen[..] else {
        panic!("{seen:?}")
    };
    assert_ne!(reply.seqnum, 0);
    assert_eq!(reply.dh_value.len(), DhGroupId::Ffdhe2048.value_len());
    assert_eq!((s2.t_id, reply.t_id), (n.t_id, n.t_id));
}

#[test]
fn a_message_longer_than_the_in_capsule_data_goes_by_r2t() {
    // ffdhe4096 with SHA-512: the Reply is 16 + 2 x 64 + 512 bytes, over the 512 the
    // controller takes in the capsule (the Negotiate, 72 bytes, fits).
    let ctrl = Controller {
        icd: 512,
        ..Controller::new(HashId::Sha512, DhGroupId::Ffdhe4096, &secret(1), Play::Honest)
    };
    let (r, seen) = connect(ctrl, host(1, Some(9)));
    r.unwrap();
    let [AuthMessage::Negotiate(_), AuthMessage::Reply(reply), AuthMessage::Success2(_)] = &seen[..] else {
        panic!("{seen:?}")
    };
    assert_eq!(AuthMessage::Reply(reply.clone()).encoded_len(), 16 + 128 + 512);
}

#[test]
fn a_wrong_host_key_gets_failure1_and_a_clear_error() {
    let ctrl = Controller::new(HashId::Sha512, DhGroupId::Null, &secret(2), Play::Honest);
    let (e, seen) = refused(ctrl, host(1, None));
    assert!(e.contains("queue 1: DH-HMAC-CHAP_Success1") && e.contains("refused the host's response"), "{e}");
    assert!(e.contains("dhchap_key"), "{e}");
    assert_eq!(seen.len(), 2, "no Failure2 after the controller's Failure1: {seen:?}");
}

#[test]
fn a_connection_closed_instead_of_failure1_is_a_refused_response() {
    let ctrl = Controller::new(HashId::Sha256, DhGroupId::Null, &secret(2), Play::CloseOnRefusal);
    let (e, seen) = refused(ctrl, host(1, None));
    assert!(e.contains("queue 1: DH-HMAC-CHAP_Success1"), "{e}");
    assert!(e.contains("closed the connection after the host's response") && e.contains("dhchap_key"), "{e}");
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn a_wrong_controller_response_is_refused_with_failure2() {
    let ctrl =
        Controller::new(HashId::Sha256, DhGroupId::Ffdhe2048, &secret(1), Play::WrongControllerResponse);
    let (e, seen) = refused(ctrl, host(1, Some(9)));
    assert!(e.contains("does not match dhchap_ctrlr_key"), "{e}");
    assert_eq!(failure2(&seen), FailureReason::Failed);
}

#[test]
fn a_controller_asking_for_authentication_without_a_key_is_refused_by_name() {
    let ctrl = Controller::new(HashId::Sha256, DhGroupId::Null, &secret(1), Play::Honest);
    let (e, seen) = refused(ctrl, DhchapHost::default());
    assert!(e.contains("requires DH-HMAC-CHAP authentication and no dhchap_key was given"), "{e}");
    assert!(seen.is_empty(), "{seen:?}");
}

#[test]
fn a_malformed_challenge_is_refused_with_failure2() {
    let ctrl = Controller::new(HashId::Sha256, DhGroupId::Null, &secret(1), Play::MalformedChallenge);
    let (e, seen) = refused(ctrl, host(1, None));
    assert!(e.contains("DH-HMAC-CHAP_Challenge") && e.contains("HL"), "{e}");
    assert_eq!(failure2(&seen), FailureReason::IncorrectPayload);
}

#[test]
fn a_hash_not_offered_is_refused_with_failure2() {
    let ctrl = Controller::new(HashId::Sha512, DhGroupId::Null, &secret(1), Play::Honest);
    let offer = DhchapOffer::new(&[HashId::Sha256], &[DhGroupId::Null]);
    let (e, seen) = refused(ctrl, DhchapHost { offer, ..host(1, None) });
    assert!(e.contains("hash sha512 was not offered"), "{e}");
    let AuthMessage::Negotiate(n) = &seen[0] else { panic!("{seen:?}") };
    assert_eq!(n.protocols, vec![ProtocolDescriptor::dhchap(&[HashId::Sha256], &[DhGroupId::Null])]);
    assert_eq!(failure2(&seen), FailureReason::HashUnusable);
}

#[test]
fn a_challenge_of_another_transaction_or_a_trivial_dh_value_is_refused_with_failure2() {
    for (play, want) in [(Play::OtherTransaction, "T_ID"), (Play::TrivialDhValue, "ffdhe2048")] {
        let ctrl = Controller::new(HashId::Sha256, DhGroupId::Ffdhe2048, &secret(1), play);
        let (e, seen) = refused(ctrl, host(1, None));
        assert!(e.contains("DH-HMAC-CHAP_Challenge") && e.contains(want), "{play:?}: {e}");
        assert_eq!(failure2(&seen), FailureReason::IncorrectPayload, "{play:?}");
    }
}

/// Reads the host's AER capsule and completes it with event `dw0`.
fn complete_aer(p: &mut Peer, dw0: u32) {
    let cid = p.command();
    let mut b = [0u8; HEADER_ROOM];
    let cqe = fp_nvme_spec::Cqe { dw0, ..fp_nvme_spec::Cqe::new(cid, Status::SUCCESS) };
    let n = fp_nvme_spec::tcp::write_capsule_resp(&mut b, &cqe, NO);
    p.send(&b[..n]);
}

/// A scripted controller (queue ID 1, controller 1) for a key change: it plays a transaction
/// with host key 1, then `between` (what else comes before the next transaction) gives the
/// controller of the second (host key 2), and a third with host key 2 follows. Returns the
/// port, the thread and the host's messages of each transaction; the host starts with key 1.
fn rekeyed_controller(
    between: impl FnOnce(&mut Peer) -> Controller + Send + 'static,
) -> (TcpTransport, std::thread::JoinHandle<()>, mpsc::Receiver<[Vec<AuthMessage>; 3]>) {
    let (tx, rx) = mpsc::channel();
    let (port, h) = scripted(
        NO,
        |_| {},
        1 | AUTHREQ_ATR,
        move |p| {
            let first = Controller::new(HashId::Sha256, DhGroupId::Null, &secret(1), Play::Honest).play(p);
            let second = between(p).play(p);
            let third = Controller::new(HashId::Sha256, DhGroupId::Null, &secret(2), Play::Honest).play(p);
            tx.send([first, second, third]).unwrap();
        },
    );
    let tr =
        TcpTransport::new(TcpTarget { dhchap: host(1, None), ..transport(port, false).target().clone() });
    (tr, h, rx)
}

/// What [`rekeyed_controller`] saw when the host changed to key 2 with controller key 9, then
/// to a key the controller lacks.
fn check_rekeyed(h: std::thread::JoinHandle<()>, rx: mpsc::Receiver<[Vec<AuthMessage>; 3]>) {
    h.join().unwrap();
    let [first, second, third] = rx.recv().unwrap();
    assert_eq!(first.len(), 2);
    let [AuthMessage::Negotiate(n1), AuthMessage::Reply(r2), AuthMessage::Success2(_)] = &second[..] else {
        panic!("{second:?}")
    };
    assert!(r2.challenge.is_some(), "the new controller key is asked for");
    let AuthMessage::Negotiate(n0) = &first[0] else { panic!("{first:?}") };
    assert_ne!(n1.t_id, n0.t_id, "each transaction has its own T_ID");
    assert_eq!(third.len(), 2, "no Failure2 after the controller's Failure1: {third:?}");
}

#[test]
fn the_admin_queue_authenticates_again_in_band_with_new_keys_keeping_an_aer() {
    use crate::transport::AdminQueue;
    let (tr, h, rx) = rekeyed_controller(|p| {
        // An event completes the AER while the host starts its second transaction.
        complete_aer(p, 0x0002_0104);
        Controller::new(HashId::Sha384, DhGroupId::Ffdhe2048, &secret(2), Play::Honest)
    });
    let (q, cntlid) = tr.connect_queue(0, 16, 0xffff, 8192, T).unwrap();
    let mut admin = TcpAdmin::new(q, cntlid);
    admin.submit_async_event_request().unwrap();
    // A controller key alone is refused (SPDK's rule); the keys stay.
    let e = tr.set_dhchap_keys(None, Some(secret(9))).unwrap_err();
    assert!(matches!(e, NvmeError::InvalidParam { field: "dhchap_ctrlr_key", .. }), "{e}");
    assert_eq!(tr.dhchap().key, Some(secret(1)));
    tr.set_dhchap_keys(Some(secret(2)), Some(secret(9))).unwrap();
    tr.reauthenticate_admin(&mut admin, T).unwrap();
    let mut events = Vec::new();
    admin.poll_async_events(&mut events).unwrap();
    assert_eq!(events.iter().map(|c| c.dw0).collect::<Vec<_>>(), [0x0002_0104], "the AER is kept");
    // A key the controller does not have: refused, saying why.
    tr.set_dhchap_keys(Some(secret(3)), None).unwrap();
    let e = tr.reauthenticate_admin(&mut admin, T).unwrap_err().to_string();
    assert!(e.contains("queue 0: DH-HMAC-CHAP_Success1") && e.contains("refused the host's response"), "{e}");
    drop(admin);
    check_rekeyed(h, rx);
}

#[test]
fn an_io_queue_authenticates_again_in_band_between_its_io() {
    use crate::transport::{IoQueue, Transport};
    use fp_bdev::{iov::BounceBuf, Iovecs, SubmitError};
    let (tr, h, rx) = rekeyed_controller(|p| {
        let read = p.command();
        Controller {
            held_read: Some(read),
            ..Controller::new(HashId::Sha384, DhGroupId::Ffdhe2048, &secret(2), Play::Honest)
        }
    });
    let (mut q, _) = tr.connect_queue(1, 16, 1, ICD as u32, T).unwrap();
    let mut buf = BounceBuf::zeroed(512);
    q.submit(&crate::cmd::read_write(false, 1, 0, 1, false), buf.iovecs(512), 1).unwrap();
    q.flush();
    let mut out = Vec::new();
    // Polls the queue (as its reactor does) until the re-authentication's outcome is in.
    let rekey = |q: &mut TcpQueue, out: &mut Vec<(u32, Status)>| {
        let mut held = false;
        let mut died = None;
        let r = std::thread::scope(|s| {
            let waiter = s.spawn(|| tr.reauthenticate_io(1, T));
            while !waiter.is_finished() {
                if let Err(e) = q.poll(out) {
                    died.get_or_insert(e);
                }
                if q.holding() {
                    held |= q.submit(&crate::cmd::flush(1), Iovecs::NONE, 2) == Err(SubmitError::Busy);
                }
                q.flush();
            }
            waiter.join().unwrap()
        });
        (r, held, died)
    };
    tr.set_dhchap_keys(Some(secret(2)), Some(secret(9))).unwrap();
    let (r, held, died) = rekey(&mut q, &mut out);
    r.unwrap();
    assert!(held, "new I/O waits (Busy) while the queue authenticates again");
    assert!(died.is_none() && !q.holding(), "{died:?}");
    assert_eq!(out, [(1, Status::SUCCESS)], "the read in flight completed meanwhile");
    assert!(buf.bytes().iter().all(|&b| b == 0x5a));
    // A key the controller does not have: the queue fails (as SPDK's), saying why.
    tr.set_dhchap_keys(Some(secret(3)), None).unwrap();
    let (r, _, died) = rekey(&mut q, &mut out);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("queue 1: DH-HMAC-CHAP_Success1") && e.contains("refused the host's response"), "{e}");
    assert!(died.is_some_and(|d| d.to_string().contains("refused")));
    drop(q);
    check_rekeyed(h, rx);
}

#[test]
fn an_io_queue_whose_connection_closes_after_its_new_response_reports_the_refusal() {
    use crate::transport::{IoQueue, Transport};
    let (tx, rx) = mpsc::channel();
    let (port, h) = scripted(
        NO,
        |_| {},
        1 | AUTHREQ_ATR,
        move |p| {
            let first = Controller::new(HashId::Sha256, DhGroupId::Null, &secret(1), Play::Honest).play(p);
            let second =
                Controller::new(HashId::Sha256, DhGroupId::Null, &secret(1), Play::CloseOnRefusal).play(p);
            tx.send([first, second]).unwrap();
        },
    );
    let tr =
        TcpTransport::new(TcpTarget { dhchap: host(1, None), ..transport(port, false).target().clone() });
    let (mut q, _) = tr.connect_queue(1, 16, 1, ICD as u32, T).unwrap();
    tr.set_dhchap_keys(Some(secret(3)), None).unwrap();
    let mut out = Vec::new();
    let (r, died) = std::thread::scope(|s| {
        let waiter = s.spawn(|| tr.reauthenticate_io(1, T));
        let mut died = None;
        while !waiter.is_finished() {
            if let Err(e) = q.poll(&mut out) {
                died.get_or_insert(e);
            }
            q.flush();
        }
        (waiter.join().unwrap(), died)
    });
    // The waiter has the refusal at once (not the bound's timeout), and the queue died of it.
    let e = r.unwrap_err().to_string();
    assert!(e.contains("queue 1: DH-HMAC-CHAP_Success1"), "{e}");
    assert!(e.contains("closed the connection after the host's response"), "{e}");
    assert!(died.is_some_and(|d| d.to_string().contains("closed the connection after")));
    drop(q);
    h.join().unwrap();
    let [_, second] = rx.recv().unwrap();
    assert!(matches!(&second[..], [AuthMessage::Negotiate(_), AuthMessage::Reply(_)]), "{second:?}");
}
