//! Fuzz the NVMe/TCP PSK parsers (`fp_crypto::tls`): the PSK interchange format
//! (`ConfiguredPsk::parse`, what a key file or an RPC holds) and the PSK identity a host names
//! in its ClientHello (`PskIdentity::parse`).
//!
//! Input encoding: the whole input is both an identity and (as UTF-8, lossily) an interchange
//! string.
//!
//! Checked: no panic; an identity that parses prints as the input's bytes exactly and parses
//! back to itself; an interchange string that parses writes a string that parses to the same
//! key; a parsed PSK derives a retained PSK and, for the identity (when that parsed), a TLS
//! PSK of its hash's length or a named refusal.
#![no_main]

use fp_crypto::tls::{ConfiguredPsk, PskIdentity};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let identity = PskIdentity::parse(data).ok();
    if let Some(id) = &identity {
        let text = id.to_string();
        assert_eq!(text.as_bytes(), data, "an identity prints as it came");
        assert_eq!(&PskIdentity::parse(text.as_bytes()).unwrap(), id);
    }
    let text = String::from_utf8_lossy(data);
    if let Ok(psk) = ConfiguredPsk::parse(&text) {
        let again = ConfiguredPsk::parse(&psk.to_interchange()).expect("a written PSK parses");
        assert_eq!(again, psk);
        if let Some(id) = &identity {
            if let Ok(retained) = psk.retained(id.hostnqn()) {
                if let Ok(key) = retained.tls_psk(id) {
                    assert_eq!(key.len(), psk.key_len());
                }
            }
        }
    }
});
