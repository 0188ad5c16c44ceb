//! Fuzz the NVMe-oF controller's side of DH-HMAC-CHAP (`fp_nvmf::Authenticator`): any sequence
//! of a host's Authentication Send data and Authentication Receives into one transaction, raw
//! bytes or well-formed messages built from the input, including Replies a real host computes
//! (right or wrong key, with or without the controller's challenge, other T_IDs, a flipped
//! byte), so the sequence reaches every step.
//!
//! Input encoding (missing bytes read as 0):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | setup `s`: bit 0 the host has keys; bit 1 a controller key too; bits 2-4 the hashes allowed (SHA-256, -384, -512; none set: all); bit 5 ffdhe2048 allowed besides the null group (larger groups are never allowed: each exchange would cost tens of milliseconds) |
//!
//! then records until the input ends, by `op % 5` of their first byte `op`:
//!
//! | op | then | what the host does |
//! |---|---|---|
//! | 0 | 1 byte L, L bytes | sends the bytes |
//! | 1 | — | receives (a Challenge received is the one later Replies answer) |
//! | 2 | 2 bytes T_ID, 1 byte hashes (bits 0-2), 1 byte groups (bits 0-5: null, ffdhe2048 ... ffdhe8192), 1 byte SC_C | sends an AUTH_Negotiate |
//! | 3 | 1 byte flags: bit 0 the right key, bit 1 with C2, bit 2 another T_ID, bit 3 a byte of R1 flipped; 1 byte S2 | sends the Reply a host computes for the last Challenge received |
//! | 4 | 2 bytes T_ID | sends a Success2 |
//!
//! Checked: no panic; the queue is authenticated only after a Reply that proves the host's key
//! (the right key, its own T_ID, nothing flipped, for a Challenge the controller sent) and, when
//! it carried C2, with a controller key set; never for a host without keys; a Success1 to a
//! Reply with C2 carries R2 computed with the controller key; the controller only ever sends
//! Challenge, Success1 and AUTH_Failure1, each encoding to bytes that parse back to it; a refused
//! Send leaves AUTH_Failure1 for the next Receive unless the host itself gave up.
#![no_main]

use fp_crypto::dhchap::{self, DhKeyPair, DhchapSecret, Transaction};
use fp_nvme_spec::auth::{
    AuthMessage, Challenge, DhGroupId, HashId, Negotiate, ProtocolDescriptor, Reply, Success2,
    MAX_DHCHAP_MESSAGE_LEN,
};
use fp_nvmf::{Authenticator, DhchapConfig, DhchapKeys};
use libfuzzer_sys::fuzz_target;

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";
const SUBNQN: &str = "nqn.2024-01.io.flashpath:fuzz";

fn secret(seed: u8) -> DhchapSecret {
    DhchapSecret::new(Some(HashId::Sha256), &[seed; 32]).expect("a valid key")
}

/// Reads the input; missing bytes are 0.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

fn encoded(m: AuthMessage) -> Vec<u8> {
    let mut b = vec![0u8; MAX_DHCHAP_MESSAGE_LEN];
    let n = m.encode(&mut b).expect("a host's message encodes");
    b.truncate(n);
    b
}

/// What the host's side knows of the transaction.
#[derive(Default)]
struct Host {
    /// The last Challenge received.
    challenge: Option<Challenge>,
    /// A Reply proved the key (and the controller may answer C2): authentication may succeed.
    proved: bool,
    /// R2 the controller must send for the last Reply with C2.
    expected_r2: Option<Vec<u8>>,
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let s = input.byte();
    let has_keys = s & 1 != 0;
    let has_ctrlr_key = s & 2 != 0;
    let keys = has_keys.then(|| DhchapKeys {
        key: secret(1),
        ctrlr_key: has_ctrlr_key.then(|| secret(2)),
        key_name: "host".into(),
        ctrlr_key_name: has_ctrlr_key.then(|| "ctrl".into()),
    });
    let mut digests: Vec<HashId> =
        HashId::ALL.iter().enumerate().filter(|(i, _)| s >> (2 + i) & 1 != 0).map(|(_, h)| *h).collect();
    if digests.is_empty() {
        digests = HashId::ALL.to_vec();
    }
    let mut dhgroups = vec![DhGroupId::Null];
    if s & 0x20 != 0 {
        dhgroups.push(DhGroupId::Ffdhe2048);
    }
    let mut a = Authenticator::new(keys, DhchapConfig { digests, dhgroups }, HOSTNQN, SUBNQN);
    let mut host = Host::default();

    while !input.0.is_empty() {
        let op = input.byte();
        let send = match op % 5 {
            0 => {
                let n = usize::from(input.byte());
                Some(input.bytes(n).to_vec())
            }
            1 => {
                receive(&mut a, &mut host);
                None
            }
            2 => {
                let t_id = input.u16();
                let (hashes, groups, sc_c) = (input.byte(), input.byte(), input.byte() & 1);
                let hashes: Vec<HashId> =
                    HashId::ALL.iter().enumerate().filter(|(i, _)| hashes >> i & 1 != 0).map(|(_, h)| *h).collect();
                let groups: Vec<DhGroupId> =
                    DhGroupId::ALL.iter().enumerate().filter(|(i, _)| groups >> i & 1 != 0).map(|(_, g)| *g).collect();
                let protocols = vec![ProtocolDescriptor::dhchap(&hashes, &groups)];
                Some(encoded(AuthMessage::Negotiate(Negotiate { t_id, sc_c, protocols })))
            }
            3 => {
                let (flags, s2) = (input.byte(), input.byte());
                Some(reply(&mut host, flags, u32::from(s2), has_keys && (flags & 2 == 0 || has_ctrlr_key)))
            }
            _ => {
                let t_id = input.u16();
                Some(encoded(AuthMessage::Success2(Success2 { t_id })))
            }
        };
        if let Some(bytes) = send {
            let host_gave_up = matches!(AuthMessage::parse(&bytes), Ok(AuthMessage::Failure(_)));
            if a.on_send(&bytes).is_err() && !host_gave_up {
                assert!(a.has_outgoing(), "a refusal without AUTH_Failure1 for the host");
            }
        }
        assert!(!a.authenticated() || host.proved, "authenticated without a Reply proving the key");
        assert!(!a.authenticated() || has_keys, "a host without keys authenticated");
    }
});

/// An Authentication Receive: only the controller's messages, each encoding faithfully.
fn receive(a: &mut Authenticator, host: &mut Host) {
    let Some(m) = a.on_receive() else { return };
    let mut b = vec![0u8; m.encoded_len()];
    let n = m.encode(&mut b).expect("the controller's message encodes");
    assert_eq!(AuthMessage::parse(&b[..n]).expect("the controller's message parses"), m);
    match m {
        AuthMessage::Challenge(c) => {
            host.challenge = Some(c);
            host.proved = false;
            host.expected_r2 = None;
        }
        AuthMessage::Success1(s) => {
            if let Some(r2) = host.expected_r2.take() {
                assert_eq!(s.response, Some(r2), "R2 not from the controller key");
            }
        }
        AuthMessage::Failure(f) => assert!(f.from_controller, "AUTH_Failure2 from the controller"),
        other => panic!("the controller sent a host's message: {other:?}"),
    }
}

/// The Reply a host computes for the last Challenge (a made-up SHA-256 one when none came).
fn reply(host: &mut Host, flags: u8, s2: u32, may_succeed: bool) -> Vec<u8> {
    let real = host.challenge.is_some();
    let ch = host.challenge.clone().unwrap_or(Challenge {
        t_id: 0,
        hash: HashId::Sha256,
        dh_group: DhGroupId::Null,
        seqnum: 0,
        challenge: vec![0; 32],
        dh_value: Vec::new(),
    });
    let (right_key, with_c2, other_t_id, flipped) = (flags & 1 != 0, flags & 2 != 0, flags & 4 != 0, flags & 8 != 0);
    let t_id = if other_t_id { ch.t_id.wrapping_add(1) } else { ch.t_id };
    let (session, dh_value) = if ch.dh_group == DhGroupId::Null {
        (None, Vec::new())
    } else {
        let pair = DhKeyPair::generate(ch.dh_group);
        match pair.shared_secret(&ch.dh_value) {
            Ok(s) => (s, pair.public_value().to_vec()),
            Err(_) => (None, pair.public_value().to_vec()),
        }
    };
    let session = session.as_deref().map(|k| k.as_slice());
    let t = Transaction { hash: ch.hash, t_id, sc_c: 0, hostnqn: HOSTNQN, subnqn: SUBNQN };
    let ca1 = dhchap::augmented_challenge(ch.hash, &ch.challenge, session);
    let key = secret(if right_key { 1 } else { 3 });
    let mut r1 = dhchap::host_response(&t, &key.transformed(HOSTNQN), &ca1, ch.seqnum);
    if flipped {
        r1[0] ^= 1;
    }
    let c2 = with_c2.then(|| dhchap::random_challenge(ch.hash));
    host.expected_r2 = c2.as_ref().map(|c2| {
        let ca2 = dhchap::augmented_challenge(ch.hash, c2, session);
        dhchap::controller_response(&t, &secret(2).transformed(SUBNQN), &ca2, s2)
    });
    host.proved = real && right_key && !other_t_id && !flipped && may_succeed;
    encoded(AuthMessage::Reply(Reply { t_id, seqnum: s2, response: r1, challenge: c2, dh_value }))
}
