//! DH-HMAC-CHAP on live queues: a host that authenticated at Connect authenticates again on
//! its admin queue and an I/O queue (as the kernel does when its secret changes), after
//! `set_host_keys`, with the new key, while its I/O goes on; the queue pairs show the
//! transaction's hash and group; a host still using the replaced key is refused and its
//! queue closed.

use fp_crypto::dhchap::{self, DhKeyPair, DhchapSecret, Transaction};
use fp_nvme_spec::auth::{
    AuthCommand, AuthMessage, DhGroupId, FailureReason, HashId, Negotiate, ProtocolDescriptor, Reply,
    Success2, AUTHREQ_ATR, MAX_DHCHAP_MESSAGE_LEN,
};
use fp_nvme_spec::fabrics::CNTLID_DYNAMIC;
use fp_nvme_spec::tcp::Digests;
use fp_nvme_spec::*;

use super::host::*;
use super::io::{pattern, target, wait_for, NQN};
use crate::*;

pub(super) fn secret(seed: u8) -> DhchapSecret {
    DhchapSecret::new(Some(HashId::Sha256), &[seed; 32]).unwrap()
}

pub(super) fn keys(key: u8, ctrlr_key: u8) -> DhchapKeys {
    DhchapKeys {
        key: secret(key),
        ctrlr_key: Some(secret(ctrlr_key)),
        key_name: format!("key{key}"),
        ctrlr_key_name: Some(format!("key{ctrlr_key}")),
    }
}

/// AUTH_Send of `m` on `h`; the command's status.
fn send(h: &mut Host, m: AuthMessage) -> Status {
    let mut b = vec![0u8; MAX_DHCHAP_MESSAGE_LEN];
    let n = m.encode(&mut b).unwrap();
    let s = AuthCommand { send: true, length: n as u32 }.to_sqe(h.next_cid());
    h.run(s, &b[..n], 0).0.status
}

/// AUTH_Receive on `h`: the controller's message.
fn receive(h: &mut Host) -> AuthMessage {
    let len = MAX_DHCHAP_MESSAGE_LEN as u32;
    let s = AuthCommand { send: false, length: len }.to_sqe(h.next_cid());
    let (cqe, data) = h.run(s, &[], len as usize);
    assert!(cqe.status.is_success(), "AUTH_Receive: {cqe:?}");
    AuthMessage::parse(&data).unwrap()
}

/// The host's side of one transaction with `key`, bidirectional (the controller must answer
/// with `ctrlr_key`), in SHA-384 and ffdhe2048, running `between` on `h` after the Challenge.
/// Returns the controller's answer to the Reply (Success1 with a checked R2, or a failure).
fn authenticate_with(
    h: &mut Host,
    t_id: u16,
    key: &DhchapSecret,
    ctrlr_key: &DhchapSecret,
    between: impl FnOnce(&mut Host),
) -> AuthMessage {
    let protocols = vec![ProtocolDescriptor::dhchap(&[HashId::Sha384], &[DhGroupId::Ffdhe2048])];
    assert_eq!(send(h, AuthMessage::Negotiate(Negotiate { t_id, sc_c: 0, protocols })), Status::SUCCESS);
    let AuthMessage::Challenge(ch) = receive(h) else { panic!("no Challenge") };
    assert_eq!((ch.hash, ch.dh_group), (HashId::Sha384, DhGroupId::Ffdhe2048));
    between(h);
    let pair = DhKeyPair::generate(ch.dh_group);
    let session = pair.shared_secret(&ch.dh_value).unwrap();
    let session = session.as_deref().map(|k| k.as_slice());
    let t = Transaction { hash: ch.hash, t_id, sc_c: 0, hostnqn: HOSTNQN, subnqn: NQN };
    let ca1 = dhchap::augmented_challenge(ch.hash, &ch.challenge, session);
    let r1 = dhchap::host_response(&t, &key.transformed(HOSTNQN), &ca1, ch.seqnum);
    let c2 = dhchap::random_challenge(ch.hash);
    let ca2 = dhchap::augmented_challenge(ch.hash, &c2, session);
    let r2 = dhchap::controller_response(&t, &ctrlr_key.transformed(NQN), &ca2, 77);
    let reply =
        Reply { t_id, seqnum: 77, response: r1, challenge: Some(c2), dh_value: pair.public_value().to_vec() };
    assert_eq!(send(h, AuthMessage::Reply(reply)), Status::SUCCESS);
    let answer = receive(h);
    if let AuthMessage::Success1(s) = &answer {
        assert_eq!(s.response.as_ref(), Some(&r2), "R2 from the controller's key");
        assert_eq!(send(h, AuthMessage::Success2(Success2 { t_id })), Status::SUCCESS);
    }
    answer
}

pub(super) fn authenticate(
    h: &mut Host,
    t_id: u16,
    key: &DhchapSecret,
    ctrlr_key: &DhchapSecret,
) -> AuthMessage {
    authenticate_with(h, t_id, key, ctrlr_key, |_| {})
}

fn qpair_auth(t: &NvmfTarget) -> Vec<(u16, Option<QpairAuth>)> {
    let mut v: Vec<_> = t.qpairs(NQN).unwrap().into_iter().map(|q| (q.qid, q.auth)).collect();
    v.sort_by_key(|q| q.0);
    v
}

#[test]
fn a_live_queue_authenticates_again_with_the_new_keys() {
    let tg = target();
    tg.t.set_allow_any_host(NQN, false).unwrap();
    tg.t.add_host_with_keys(NQN, HOSTNQN, Some(keys(1, 2))).unwrap();
    let (mut admin, cqe) = Host::connect_raw(tg.port, Digests::default(), 0, NQN, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert_eq!(cqe.dw0 & AUTHREQ_ATR, AUTHREQ_ATR, "{cqe:?}");
    assert!(matches!(authenticate(&mut admin, 1, &secret(1), &secret(2)), AuthMessage::Success1(_)));
    admin.enable();
    let (mut io, cqe) = Host::connect_raw(tg.port, Digests::default(), 1, NQN, HOSTNQN, admin.cntlid, 0);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert!(matches!(authenticate(&mut io, 2, &secret(1), &secret(2)), AuthMessage::Success1(_)));
    assert!(io.write(1, 0, &pattern(1, 4096), false).status.is_success());
    let completed =
        Some(QpairAuth { state: "completed".into(), digest: "sha384".into(), dhgroup: "ffdhe2048".into() });
    assert!(wait_for(|| qpair_auth(&tg.t).len() == 2));
    assert_eq!(qpair_auth(&tg.t), [(0, completed.clone()), (1, completed.clone())]);

    // New keys; each queue authenticates again with them, its commands served in between.
    tg.t.set_host_keys(NQN, HOSTNQN, Some(keys(3, 4))).unwrap();
    let identify = |h: &mut Host| assert!(h.identify(1, 0).0.status.is_success(), "Identify mid-transaction");
    let answer = authenticate_with(&mut admin, 3, &secret(3), &secret(4), identify);
    assert!(matches!(answer, AuthMessage::Success1(_)), "{answer:?}");
    let write = |h: &mut Host| assert!(h.write(1, 8, &pattern(2, 4096), false).status.is_success());
    let answer = authenticate_with(&mut io, 4, &secret(3), &secret(4), write);
    assert!(matches!(answer, AuthMessage::Success1(_)), "{answer:?}");
    let (cqe, data) = io.read(1, 0, 16);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(data, [pattern(1, 4096), pattern(2, 4096)].concat());

    // The replaced key: AUTH_Failure1, then the queue closes.
    let answer = authenticate(&mut io, 5, &secret(1), &secret(4));
    let AuthMessage::Failure(f) = answer else { panic!("the old key authenticated: {answer:?}") };
    assert_eq!(f.reason, FailureReason::Failed);
    io.s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    assert!(io.closed().0, "the queue stays open after a failed re-authentication");
    assert!(wait_for(|| qpair_auth(&tg.t).len() == 1), "{:?}", qpair_auth(&tg.t));
    let (cqe, _) = admin.identify(1, 0);
    assert!(cqe.status.is_success(), "the admin queue after the I/O queue's failure: {cqe:?}");
}
