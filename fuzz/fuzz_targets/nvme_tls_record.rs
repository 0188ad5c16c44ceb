//! Fuzz the NVMe/TCP TLS server (`fp_crypto::tls::TlsSession` with `tls::nvme_lookup`) fed a
//! peer's ciphertext: before a handshake (ClientHellos, records of any kind) and after one made
//! in-process with a real client (forged or damaged records on an established session).
//!
//! Input encoding: byte 0 is the setup: bit 0 runs the in-process handshake first; bits 1-3
//! choose the piece size the rest is fed in (1, 2, 5, 64, 512, 4096, 16 KiB + 5, all at once).
//! The rest is the ciphertext. The server knows one host (SHA-256 PSK, identity version 0).
//!
//! Checked: no panic and no memory error in OpenSSL's parsing through the BIO pair; no
//! plaintext comes out of records the client did not write (nobody but it has the keys); a
//! fresh server never completes a handshake from the input alone; a failure sticks (every
//! later call returns the same error).
#![no_main]

use fp_crypto::tls::{nvme_lookup, ConfiguredPsk, IdentityVersion, PskHash, TlsPsk, TlsSession};
use libfuzzer_sys::fuzz_target;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz-host";
const SUBSYS: &str = "nqn.2016-06.io.spdk:cnode1";
const PIECES: [usize; 8] = [1, 2, 5, 64, 512, 4096, 16_389, usize::MAX];

fn server() -> TlsSession {
    let retained = ConfiguredPsk::new(Some(PskHash::Sha256), &[0x42; 32]).unwrap().retained(HOST).unwrap();
    TlsSession::server(nvme_lookup(move |h, s| (h == HOST && s == SUBSYS).then(|| retained.clone()))).unwrap()
}

/// A client of the server's host, handshaken with `server` in memory.
fn handshake(server: &mut TlsSession) -> TlsSession {
    let retained = ConfiguredPsk::new(Some(PskHash::Sha256), &[0x42; 32]).unwrap().retained(HOST).unwrap();
    let id = retained.identity(IdentityVersion::V0, HOST, SUBSYS).unwrap();
    let key = retained.tls_psk(&id).unwrap();
    let mut client =
        TlsSession::client(id.to_string().as_bytes(), TlsPsk { hash: PskHash::Sha256, key }).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    for _ in 0..16 {
        client.handshake().unwrap();
        let n = client.take(&mut buf);
        assert_eq!(server.feed(&buf[..n]).unwrap(), n);
        let n = server.take(&mut buf);
        assert_eq!(client.feed(&buf[..n]).unwrap(), n);
        if client.is_established() && server.is_established() {
            return client;
        }
    }
    panic!("the in-process handshake did not finish");
}

fuzz_target!(|data: &[u8]| {
    if !fp_crypto::tls::tls_available() {
        return;
    }
    let Some((&setup, ciphertext)) = data.split_first() else { return };
    let mut s = server();
    let _client = (setup & 1 != 0).then(|| handshake(&mut s));
    let piece = PIECES[usize::from(setup >> 1 & 7)];
    let mut plain = [0u8; 4096];
    let mut failed = None;
    let mut rest = ciphertext;
    while !rest.is_empty() {
        let len = piece.min(rest.len());
        match s.feed(&rest[..len]) {
            Ok(n) => rest = &rest[n..],
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        // Whatever the server answers (alerts) goes nowhere.
        while s.take(&mut plain) > 0 {}
        match s.read(&mut plain) {
            Ok(n) => assert_eq!(n, 0, "plaintext from records nobody with the keys wrote"),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        if setup & 1 == 0 {
            assert!(!s.is_established(), "a handshake completed from the input alone");
        }
    }
    if let Some(e) = failed {
        assert_eq!(s.read(&mut plain).unwrap_err(), e);
        assert_eq!(s.write(b"x").unwrap_err(), e);
        assert_eq!(s.feed(b"x").unwrap_err(), e);
    }
});
