//! Fuzz the in-band authentication (DH-HMAC-CHAP) wire formats of `fp_nvme_spec::auth`: the
//! messages a controller takes from an Authentication Send and a host from an Authentication
//! Receive, and the commands' own fields.
//!
//! Input encoding: the whole input is one message as a peer would send it (AUTH_TYPE, AUTH_ID,
//! ...); when it is 64 bytes or more, its first 64 bytes are also decoded as an Authentication
//! Send / Receive command.
//!
//! Checked: no panic; a message that parses encodes into exactly `encoded_len` bytes, which
//! parse back to the same message and are no longer than the input's message (a decoder never
//! accepts fewer bytes than its length fields ask); a command that decodes encodes back to one
//! that decodes the same.
#![no_main]

use fp_nvme_spec::auth::{AuthCommand, AuthMessage};
use fp_nvme_spec::{Sqe, SQE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = AuthMessage::parse(data) {
        let len = m.encoded_len();
        let mut out = vec![0u8; len];
        let n = m.encode(&mut out).expect("a parsed message encodes");
        assert_eq!(n, len);
        assert!(n <= data.len(), "{m:?} took {} bytes and encodes to {n}", data.len());
        assert_eq!(AuthMessage::parse(&out).expect("an encoded message parses"), m);
    }
    if let Some(head) = data.first_chunk::<SQE_LEN>() {
        if let Ok(c) = AuthCommand::from_sqe(&Sqe::from_bytes(head)) {
            let again = AuthCommand::from_sqe(&c.to_sqe(1)).expect("an encoded command decodes");
            assert_eq!(again, c);
        }
    }
});
