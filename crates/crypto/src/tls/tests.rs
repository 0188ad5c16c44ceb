//! Checked against implementations nobody here wrote: libnvme's published vectors (its
//! `test/psk.c`: the interchange format and version 1 identities, whose digest covers the
//! retained PSK), nvme-cli (`gen-tls-key`, `check-tls-key`; from 2.7 on the identities it prints
//! and the TLS PSKs it inserts into a keyring), the `openssl kdf` command (HKDF and
//! TLS 1.3's HKDF-Expand-Label, for the retained and TLS PSKs) and the `openssl s_server` /
//! `s_client` commands (TLS 1.3 with an external PSK, both ways). A missing tool skips its
//! comparison with a printed reason, and fails the test under CI=true.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;

/// libnvme's test/psk.c configured PSK (32 bytes; its 48-byte one repeats bytes 16..32).
const CONFIGURED: [u8; 32] = [
    0x55, 0x12, 0xDB, 0xB6, 0x73, 0x7D, 0x01, 0x06, 0xF6, 0x59, 0x75, 0xB7, 0x73, 0xDF, 0xB0, 0x11, 0xFF,
    0xC3, 0x44, 0xBC, 0xF4, 0x42, 0xE2, 0xDD, 0x6D, 0x8B, 0xC4, 0x87, 0x0B, 0x5D, 0x5B, 0x03,
];
const HOST: &str = "nqn.psk-test-host";
const SUBSYS: &str = "nqn.psk-test-subsys";

fn configured_48() -> Vec<u8> {
    let mut k = CONFIGURED.to_vec();
    k.extend_from_slice(&CONFIGURED[16..]);
    k
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(char::is_ascii_hexdigit).collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A tool's absence: a skip with its reason, a failure under CI=true.
fn missing(tool: &str, why: impl std::fmt::Display) {
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true and {tool} does not run: {why}");
    println!("skipped: {tool} not runnable ({why})");
}

/// Runs a command; `None` (skip reported) if it cannot start.
fn run(tool: &str, args: &[&str]) -> Option<(bool, String, String)> {
    match Command::new(tool).args(args).output() {
        Ok(o) => Some((
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            String::from_utf8_lossy(&o.stderr).trim().to_owned(),
        )),
        Err(e) => {
            missing(tool, e);
            None
        }
    }
}

// ---- The interchange format.

#[test]
fn interchange_matches_libnvme_vectors() {
    for (text, hash, key) in [
        ("NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:", None, CONFIGURED.to_vec()),
        (
            "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
            Some(PskHash::Sha256),
            CONFIGURED.to_vec(),
        ),
        (
            "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:",
            Some(PskHash::Sha384),
            configured_48(),
        ),
    ] {
        let psk = ConfiguredPsk::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(psk, ConfiguredPsk::new(hash, &key).unwrap());
        assert_eq!(psk.transform(), hash);
        assert_eq!(*psk.to_interchange(), text);
        // A key file's newline is fine.
        assert_eq!(ConfiguredPsk::parse(&format!("{text}\n")).unwrap(), psk);
    }
    assert_eq!(ConfiguredPsk::new(None, &configured_48()).unwrap().hash(), PskHash::Sha384);
}

#[test]
fn interchange_refusals_name_what_is_wrong() {
    let good = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    let err = |t: &str| ConfiguredPsk::parse(t).unwrap_err();
    assert_eq!(err("NVMeTLSkey-2:01:AAAA:"), PskError::Prefix);
    assert_eq!(err("DHHC-1:01:AAAA:"), PskError::Prefix);
    assert_eq!(err("NVMeTLSkey-1:03:AAAA:"), PskError::Hash("03:".into()));
    assert_eq!(err("NVMeTLSkey-1:1:AAAA:"), PskError::Hash("1:A".into()));
    assert_eq!(err(good.trim_end_matches(':')), PskError::Terminator);
    assert!(matches!(err("NVMeTLSkey-1:01:A*AA:"), PskError::Base64(_)));
    let b64 = |n: usize| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, vec![7u8; n]);
    assert_eq!(err(&format!("NVMeTLSkey-1:00:{}:", b64(64 + 4))), PskError::KeyLength(64));
    assert_eq!(err("NVMeTLSkey-1:00:AA==:"), PskError::KeyLength(0));
    // A 48-byte key cannot be SHA-256's; the CRC is checked first, so make it right.
    let k48 = ConfiguredPsk::new(Some(PskHash::Sha384), &configured_48()).unwrap().to_interchange();
    assert_eq!(err(&k48.replace(":02:", ":01:")), PskError::HashLength { hash: 1, len: 48 });
    let mut bad = good.to_owned();
    bad.replace_range(16..17, "W");
    assert!(matches!(err(&bad), PskError::Crc { .. }));
    // No message or Debug output shows the key.
    let psk = ConfiguredPsk::parse(good).unwrap();
    for shown in [format!("{psk:?}"), format!("{:?}", psk.retained(HOST).unwrap()), err(&bad).to_string()] {
        assert!(!shown.contains("VRLb") && !shown.contains("85, 18") && !shown.contains("5512"), "{shown}");
    }
}

#[test]
fn interchange_interoperates_with_nvme_cli() {
    // nvme-cli's keys parse here, both hashes.
    for (m, len) in [("1", 32), ("2", 48)] {
        let Some((ok, key, err)) = run("nvme", &["gen-tls-key", "--hmac", m]) else { return };
        assert!(ok, "nvme gen-tls-key --hmac {m}: {err}");
        let psk = ConfiguredPsk::parse(&key).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!((psk.transform().map(|h| h as u8), psk.key_len()), (Some(m.parse().unwrap()), len));
    }
    // nvme-cli accepts the keys written here: `--key` (nvme-cli 2.3) or `--keydata` (2.4 on).
    // From 2.7 on, given the NQNs and `--identity`, it prints the identity it derives (2.4 to
    // 2.6 would insert the key into the keyring instead, so they are only asked to check it);
    // libnvme before 1.16 (nvme-cli before 2.16, which added `--compat`) derives by the compat
    // form, which a version 1 identity's digest shows.
    let help = run("nvme", &["check-tls-key", "--help"]).map(|(_, out, err)| out + &err).unwrap_or_default();
    let opt = if help.contains("keydata") { "--keydata" } else { "--key" };
    let derives = help.contains("--identity");
    let derivation = if help.contains("--compat") { Derivation::Rfc8446 } else { Derivation::LibnvmeCompat };
    for (hash, key) in [(PskHash::Sha256, CONFIGURED.to_vec()), (PskHash::Sha384, configured_48())] {
        let configured = ConfiguredPsk::new(Some(hash), &key).unwrap();
        let text = configured.to_interchange();
        if !derives {
            let (ok, out, err) = run("nvme", &["check-tls-key", opt, &text]).unwrap();
            assert!(
                ok && out.starts_with("Key is valid"),
                "nvme check-tls-key refused {hash:?}: {out} {err}"
            );
            continue;
        }
        let retained = configured.retained_with(derivation, HOST).unwrap();
        for (version, v) in [(IdentityVersion::V0, "0"), (IdentityVersion::V1, "1")] {
            let args =
                ["check-tls-key", opt, &text, "--hostnqn", HOST, "--subsysnqn", SUBSYS, "--identity", v];
            let (ok, out, err) = run("nvme", &args).unwrap();
            assert!(ok, "nvme check-tls-key refused {hash:?}: {out} {err}");
            assert_eq!(out, retained.identity(version, HOST, SUBSYS).unwrap().to_string());
        }
        if help.contains("--compat") {
            let compat = configured.retained_with(Derivation::LibnvmeCompat, HOST).unwrap();
            let args = [
                "check-tls-key",
                opt,
                &text,
                "--hostnqn",
                HOST,
                "--subsysnqn",
                SUBSYS,
                "--identity",
                "1",
                "--compat",
            ];
            let (ok, out, err) = run("nvme", &args).unwrap();
            assert!(ok, "nvme check-tls-key --compat refused {hash:?}: {out} {err}");
            assert_eq!(out, compat.identity(IdentityVersion::V1, HOST, SUBSYS).unwrap().to_string());
        }
    }
    // A corrupted one nvme-cli refuses too, as this does.
    let mut bad =
        ConfiguredPsk::new(Some(PskHash::Sha256), &CONFIGURED).unwrap().to_interchange().to_string();
    bad.replace_range(16..17, "W");
    let (ok, _, _) = run("nvme", &["check-tls-key", opt, &bad]).unwrap();
    assert!(!ok && ConfiguredPsk::parse(&bad).is_err());
}

// ---- Derivations.

/// The TLS PSK nvme-cli (2.7 on) derives, read back from the keyring it inserts it into: a
/// keyring of a fresh session keyring of its own (`keyctl session`), the key of type "user" so
/// that no kernel module is needed; `None` (reason printed) if nvme-cli cannot or keyctl is
/// missing.
fn nvme_cli_tls_psk(interchange: &str, version: &str, compat: bool) -> Option<Vec<u8>> {
    let script = format!(
        "keyctl newring fptest @s >/dev/null && nvme check-tls-key --keydata '{interchange}' --hostnqn {HOST} \
         --subsysnqn {SUBSYS} --identity {version} {} --insert --keyring fptest --keytype user >/dev/null && \
         keyctl pipe \"$(keyctl search @s user \"$(keyctl rdescribe \"$(keyctl rlist %:fptest)\" | sed 's/.*;//')\")\" | od -An -tx1",
        if compat { "--compat" } else { "" }
    );
    match Command::new("keyctl").args(["session", "-", "sh", "-c", &script]).output() {
        Ok(o) if o.status.success() => Some(unhex(&String::from_utf8_lossy(&o.stdout))),
        Ok(o) => panic!("nvme check-tls-key --insert: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            println!("skipped: keyctl not runnable ({e})");
            None
        }
    }
}

#[test]
fn tls_psks_match_what_nvme_cli_inserts() {
    let Some((_, out, err)) = run("nvme", &["check-tls-key", "--help"]) else { return };
    let help = out + &err;
    if !help.contains("--insert") {
        println!("skipped: this nvme-cli derives no TLS PSK (2.7 on does); openssl kdf still checks them");
        return;
    }
    let compat_too = help.contains("--compat");
    for (hash, key) in [(PskHash::Sha256, CONFIGURED.to_vec()), (PskHash::Sha384, configured_48())] {
        let configured = ConfiguredPsk::new(Some(hash), &key).unwrap();
        let text = configured.to_interchange();
        let (default, other) = if compat_too {
            (Derivation::Rfc8446, Some(Derivation::LibnvmeCompat))
        } else {
            (Derivation::LibnvmeCompat, None)
        };
        for derivation in std::iter::once(default).chain(other) {
            let retained = configured.retained_with(derivation, HOST).unwrap();
            for (version, v) in [(IdentityVersion::V0, "0"), (IdentityVersion::V1, "1")] {
                let compat = derivation == Derivation::LibnvmeCompat && compat_too;
                let Some(theirs) = nvme_cli_tls_psk(&text, v, compat) else { return };
                let id = retained.identity(version, HOST, SUBSYS).unwrap();
                assert_eq!(
                    hex(&retained.tls_psk(&id).unwrap()),
                    hex(&theirs),
                    "{hash:?} {derivation:?} {version:?}"
                );
            }
        }
    }
}

#[test]
fn version_1_identities_match_libnvme_vectors() {
    // The digest is an HMAC keyed by the retained PSK: these vectors check its derivation too.
    for (hash, key, identity) in [
        (
            PskHash::Sha256,
            CONFIGURED.to_vec(),
            "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU=",
        ),
        (
            PskHash::Sha384,
            configured_48(),
            "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys QhW2+Rp6RzHlNtCslyRxMnwJ11tKKhz8JCAQpQ+XUD8f9td1VeH5h53yz2wKJG1a",
        ),
    ] {
        let retained = ConfiguredPsk::new(Some(hash), &key).unwrap().retained(HOST).unwrap();
        let id = retained.identity(IdentityVersion::V1, HOST, SUBSYS).unwrap();
        assert_eq!(id.to_string(), identity);
        let parsed = PskIdentity::parse(identity.as_bytes()).unwrap();
        assert_eq!(parsed, id);
        assert!(retained.matches(&parsed));
        let v0 = retained.identity(IdentityVersion::V0, HOST, SUBSYS).unwrap();
        assert_eq!(v0.to_string(), format!("NVMe0R0{} {HOST} {SUBSYS}", hash as u8));
        assert_eq!(PskIdentity::parse(v0.to_string().as_bytes()).unwrap(), v0);
    }
}

#[test]
fn compat_derivation_matches_libnvme_vectors_and_openssl_kdf() {
    // libnvme's vectors for its form before 1.16: the digest is keyed by the compat retained PSK.
    for (hash, key, identity) in [
        (
            PskHash::Sha256,
            CONFIGURED.to_vec(),
            "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys 66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM=",
        ),
        (
            PskHash::Sha384,
            configured_48(),
            "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz",
        ),
    ] {
        let configured = ConfiguredPsk::new(Some(hash), &key).unwrap();
        let compat = configured.retained_with(Derivation::LibnvmeCompat, HOST).unwrap();
        let id = compat.identity(IdentityVersion::V1, HOST, SUBSYS).unwrap();
        assert_eq!(id.to_string(), identity);
        // The two forms differ, and a version 1 identity tells which one a host used.
        let rfc = configured.retained(HOST).unwrap();
        assert_ne!(rfc.key(), compat.key());
        assert!(compat.matches(&id) && !rfc.matches(&id));
        // The TLS PSK: HKDF-Expand over le16(L) || "tls13 nvme-tls-psk" || context.
        let len = hash.digest_len();
        let mut info = (len as u16).to_le_bytes().to_vec();
        info.extend_from_slice(b"tls13 nvme-tls-psk");
        info.extend_from_slice(format!("0{} {}", hash as u8, compat.digest(HOST, SUBSYS)).as_bytes());
        let Some(want) = openssl_hkdf(hash, compat.key(), &info) else { return };
        assert_eq!(hex(&compat.tls_psk(&id).unwrap()), hex(&want), "{hash:?}");
    }
}

/// HKDF (extract and expand) by `openssl kdf` with raw `info`; `None` if openssl is missing.
fn openssl_hkdf(hash: PskHash, ikm: &[u8], info: &[u8]) -> Option<Vec<u8>> {
    let (digest, len) = match hash {
        PskHash::Sha256 => ("digest:SHA256", "32"),
        PskHash::Sha384 => ("digest:SHA384", "48"),
    };
    let (key, info) = (format!("hexkey:{}", hex(ikm)), format!("hexinfo:{}", hex(info)));
    let (ok, out, err) = run(
        "openssl",
        &["kdf", "-keylen", len, "-kdfopt", digest, "-kdfopt", &key, "-kdfopt", &info, "HKDF"],
    )?;
    assert!(ok, "openssl kdf: {err}");
    Some(unhex(&out))
}

/// HKDF-Extract then TLS 1.3's HKDF-Expand-Label by `openssl kdf`; `None` if openssl is missing.
fn openssl_expand_label(hash: PskHash, ikm: &[u8], label: &str, context: &str) -> Option<Vec<u8>> {
    let (digest, len) = match hash {
        PskHash::Sha256 => ("digest:SHA256", "32"),
        PskHash::Sha384 => ("digest:SHA384", "48"),
    };
    let key = format!("hexkey:{}", hex(ikm));
    let (ok, prk, err) = run(
        "openssl",
        &["kdf", "-keylen", len, "-kdfopt", digest, "-kdfopt", "mode:EXTRACT_ONLY", "-kdfopt", &key, "HKDF"],
    )?;
    assert!(ok, "openssl kdf: {err}");
    let prk = format!("hexkey:{}", hex(&unhex(&prk)));
    let (label, data) = (format!("label:{label}"), format!("data:{context}"));
    let (ok, out, err) = run(
        "openssl",
        &[
            "kdf",
            "-keylen",
            len,
            "-kdfopt",
            digest,
            "-kdfopt",
            "mode:EXPAND_ONLY",
            "-kdfopt",
            &prk,
            "-kdfopt",
            "prefix:tls13 ",
            "-kdfopt",
            &label,
            "-kdfopt",
            &data,
            "TLS13-KDF",
        ],
    )?;
    assert!(ok, "openssl kdf: {err}");
    Some(unhex(&out))
}

#[test]
fn retained_and_tls_psks_match_openssl_kdf() {
    for (hash, key) in [(PskHash::Sha256, CONFIGURED.to_vec()), (PskHash::Sha384, configured_48())] {
        let configured = ConfiguredPsk::new(Some(hash), &key).unwrap();
        let retained = configured.retained(HOST).unwrap();
        let Some(want) = openssl_expand_label(hash, &key, "HostNQN", HOST) else { return };
        assert_eq!(hex(retained.key()), hex(&want), "retained {hash:?}");
        for version in [IdentityVersion::V0, IdentityVersion::V1] {
            let id = retained.identity(version, HOST, SUBSYS).unwrap();
            let context = match version {
                IdentityVersion::V0 => id.to_string(),
                IdentityVersion::V1 => format!("0{} {}", hash as u8, retained.digest(HOST, SUBSYS)),
            };
            let want = openssl_expand_label(hash, retained.key(), "nvme-tls-psk", &context).unwrap();
            assert_eq!(hex(&retained.tls_psk(&id).unwrap()), hex(&want), "TLS PSK {hash:?} {version:?}");
        }
        // "00": the configured PSK is the retained one; the hash follows the length.
        let plain = ConfiguredPsk::new(None, &key).unwrap().retained(HOST).unwrap();
        assert_eq!((plain.key(), plain.hash()), (&key[..], hash));
    }
}

#[test]
fn identities_refused_by_name() {
    let e = |b: &[u8]| PskIdentity::parse(b).unwrap_err();
    assert_eq!(e(b""), IdentityError::Form);
    assert_eq!(e(b"NVMe2R01 a b"), IdentityError::Form);
    assert_eq!(e(b"NVMe0R03 a b"), IdentityError::Form);
    assert_eq!(e(b"NVMe0G01 a b"), IdentityError::Generated);
    assert_eq!(e(b"NVMe0R01 a"), IdentityError::Fields(0, 1));
    assert_eq!(e(b"NVMe0R01 a b c"), IdentityError::Fields(0, 3));
    assert_eq!(e(b"NVMe1R01 a b"), IdentityError::Fields(1, 2));
    assert_eq!(e(b"NVMe0R01 a  b"), IdentityError::Fields(0, 3));
    assert_eq!(e(b"NVMe0R01  b"), IdentityError::Nqn(0));
    assert_eq!(e(b"NVMe0R01 \xff b"), IdentityError::Utf8);
    assert_eq!(e(format!("NVMe0R01 {} b", "n".repeat(224)).as_bytes()), IdentityError::Nqn(224));
    assert_eq!(e(b"NVMe1R01 a b AAAA"), IdentityError::Digest(32));
    // A version 1 identity with another PSK's digest is not this PSK's.
    let r = ConfiguredPsk::new(Some(PskHash::Sha256), &CONFIGURED).unwrap().retained(HOST).unwrap();
    let other = ConfiguredPsk::new(Some(PskHash::Sha256), &[9; 32]).unwrap().retained(HOST).unwrap();
    let theirs = other.identity(IdentityVersion::V1, HOST, SUBSYS).unwrap();
    assert!(!r.matches(&theirs) && other.matches(&theirs));
    // A derivation refuses NQNs an identity cannot carry, and contexts over 255 bytes.
    assert_eq!(r.identity(IdentityVersion::V0, "a b", SUBSYS).unwrap_err(), PskError::Nqn(3));
    let long = "n".repeat(200);
    let id = r.identity(IdentityVersion::V0, &long, &long).unwrap();
    assert_eq!(r.tls_psk(&id).unwrap_err(), PskError::IdentityLength(id.to_string().len()));
}

// ---- Sessions.

pub(super) fn tls_or_skip() -> bool {
    if tls_available() {
        return true;
    }
    missing("libssl.so.3", "not loadable");
    false
}

/// Ciphertext on its way from one session to the other, fed in pieces of `piece` bytes.
#[derive(Default)]
struct Wire {
    bytes: Vec<u8>,
}

impl Wire {
    /// Moves what `from` has into the wire, then feeds `to` at most `piece` bytes at a time
    /// until it takes no more; returns whether anything moved.
    fn carry(&mut self, from: &mut TlsSession, to: &mut TlsSession, piece: usize) -> Result<bool, TlsError> {
        let mut moved = false;
        let mut buf = [0u8; 4096];
        loop {
            let n = from.take(&mut buf);
            if n == 0 {
                break;
            }
            self.bytes.extend_from_slice(&buf[..n]);
            moved = true;
        }
        while !self.bytes.is_empty() {
            let len = piece.min(self.bytes.len());
            let n = to.feed(&self.bytes[..len])?;
            if n == 0 {
                break;
            }
            self.bytes.drain(..n);
            moved = true;
        }
        Ok(moved)
    }
}

/// Runs both handshakes to the end (or the first failure), carrying `piece` bytes at a time.
fn handshake(
    c: &mut TlsSession,
    s: &mut TlsSession,
    piece: usize,
) -> (Result<(), TlsError>, Result<(), TlsError>) {
    let (mut up, mut down) = (Wire::default(), Wire::default());
    let (mut rc, mut rs) = (Ok(()), Ok(()));
    for _ in 0..100_000 {
        rc = c.handshake().map(|_| ());
        let mut moved = up.carry(c, s, piece).unwrap_or_else(|e| {
            rs = Err(e);
            false
        });
        if rs.is_ok() {
            rs = s.handshake().map(|_| ());
        }
        moved |= down.carry(s, c, piece).unwrap_or_else(|e| {
            rc = Err(e);
            false
        });
        if c.is_established() && s.is_established() {
            return (Ok(()), Ok(()));
        }
        if !moved && (rc.is_err() || rs.is_err()) {
            return (rc, rs);
        }
    }
    panic!("the handshake neither finished nor failed: {rc:?} {rs:?}");
}

pub(super) fn pair(hash: PskHash, client_key: &[u8], server_key: &[u8]) -> (TlsSession, TlsSession) {
    let key = Zeroizing::new(server_key.to_vec());
    let lookup: PskLookup =
        Box::new(move |id: &[u8]| (id == b"flashpath test").then(|| TlsPsk { hash, key: key.clone() }));
    let client =
        TlsSession::client(b"flashpath test", TlsPsk { hash, key: Zeroizing::new(client_key.to_vec()) });
    (client.unwrap(), TlsSession::server(lookup).unwrap())
}

use zeroize::Zeroizing;

/// Sends `data` from `a` to `b` writing `wpiece` bytes at a time and carrying `piece` bytes of
/// ciphertext at a time; returns what `b` read.
fn send(a: &mut TlsSession, b: &mut TlsSession, data: &[u8], wpiece: usize, piece: usize) -> Vec<u8> {
    let mut wire = Wire::default();
    let (mut sent, mut got) = (0, Vec::new());
    let mut buf = vec![0u8; 3000];
    for _ in 0..10_000_000 {
        if sent < data.len() {
            sent += a.write(&data[sent..(sent + wpiece).min(data.len())]).unwrap();
        }
        wire.carry(a, b, piece).unwrap();
        loop {
            let n = b.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        if got.len() == data.len() {
            return got;
        }
    }
    panic!("sent {sent} of {}, received {}", data.len(), got.len());
}

#[test]
fn sessions_exchange_data_both_ways_in_pieces_of_every_size() {
    if !tls_or_skip() {
        return;
    }
    let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    for (hash, key) in [(PskHash::Sha256, CONFIGURED.to_vec()), (PskHash::Sha384, configured_48())] {
        for piece in [1, 2, 3, 5, 17, 100, 1000, 5000, 16_405, 40_000, BUF] {
            let (mut c, mut s) = pair(hash, &key, &key);
            let (rc, rs) = handshake(&mut c, &mut s, piece);
            rc.unwrap();
            rs.unwrap();
            assert_eq!(c.cipher_suite().as_deref(), Some(hash.cipher_suite()));
            assert_eq!(s.accepted_identity(), Some(&b"flashpath test"[..]));
            // Small payloads for the byte-at-a-time runs, the whole for the rest.
            let len = if piece < 100 { 3000 } else { data.len() };
            for wpiece in [1, 999, 16_384, 70_000] {
                if piece < 100 && wpiece != 999 {
                    continue;
                }
                assert!(send(&mut c, &mut s, &data[..len], wpiece, piece) == data[..len], "{hash:?} {piece}");
                assert!(send(&mut s, &mut c, &data[..len], wpiece, piece) == data[..len], "{hash:?} {piece}");
            }
            c.close();
            Wire::default().carry(&mut c, &mut s, piece).unwrap();
            assert_eq!(s.read(&mut [0; 16]).unwrap(), 0);
            assert!(s.peer_closed());
        }
    }
}

#[test]
fn offered_identities_are_read_in_order_and_stop_at_the_first_malformed_one() {
    use super::session::offered_identities;
    // identities: "ab" (age 1), "xyz" (age 2); then binders, which are not read.
    let mut ext = vec![0, 2 + 2 + 4 + 2 + 3 + 4];
    ext.extend_from_slice(&[0, 2, b'a', b'b', 0, 0, 0, 1, 0, 3, b'x', b'y', b'z', 0, 0, 0, 2]);
    ext.extend_from_slice(&[0, 33, 32]);
    let got: Vec<&[u8]> = offered_identities(&ext).collect();
    assert_eq!(got, [&b"ab"[..], &b"xyz"[..]]);
    // A list longer than the extension, an identity past the list, a missing ticket age.
    assert_eq!(offered_identities(&[0, 9, 0, 1, b'a']).count(), 0);
    assert_eq!(offered_identities(&[0, 4, 0, 9, b'a', b'b']).count(), 0);
    assert_eq!(offered_identities(&[0, 5, 0, 1, b'a', 0, 0]).count(), 0);
    assert_eq!(offered_identities(&[]).count(), 0);
}

#[test]
fn the_server_takes_the_suite_of_the_psk_whatever_the_clients_order() {
    if !tls_or_skip() {
        return;
    }
    // A client that lists both suites, SHA-256's first, with a PSK of each hash in turn.
    for (hash, key) in [(PskHash::Sha384, configured_48()), (PskHash::Sha256, CONFIGURED.to_vec())] {
        let psk = TlsPsk { hash, key: Zeroizing::new(key) };
        let both = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";
        let mut c = TlsSession::client_offering(b"flashpath test", psk.clone(), both).unwrap();
        let mut s =
            TlsSession::server(Box::new(move |id: &[u8]| (id == b"flashpath test").then(|| psk.clone())))
                .unwrap();
        let (rc, rs) = handshake(&mut c, &mut s, 4096);
        rc.unwrap();
        rs.unwrap();
        assert_eq!(s.cipher_suite().as_deref(), Some(hash.cipher_suite()));
    }
}

#[test]
fn a_wrong_psk_fails_as_wrong_psk_on_both_sides() {
    if !tls_or_skip() {
        return;
    }
    let mut other = CONFIGURED;
    other[0] ^= 1;
    let (mut c, mut s) = pair(PskHash::Sha256, &other, &CONFIGURED);
    let (rc, rs) = handshake(&mut c, &mut s, 1000);
    assert_eq!(rs.unwrap_err().kind, TlsErrorKind::WrongPsk);
    assert_eq!(rc.unwrap_err().kind, TlsErrorKind::WrongPsk);
    // Failures stick.
    assert_eq!(s.read(&mut [0; 4]).unwrap_err().kind, TlsErrorKind::WrongPsk);
    assert_eq!(s.accepted_identity(), None);
}

#[test]
fn an_unknown_identity_fails_as_unknown_on_both_sides() {
    if !tls_or_skip() {
        return;
    }
    let key = Zeroizing::new(CONFIGURED.to_vec());
    let mut c = TlsSession::client(b"someone else", TlsPsk { hash: PskHash::Sha256, key }).unwrap();
    let mut s = TlsSession::server(Box::new(|_: &[u8]| None)).unwrap();
    let (rc, rs) = handshake(&mut c, &mut s, 1000);
    assert_eq!(rs.unwrap_err().kind, TlsErrorKind::UnknownIdentity);
    assert_eq!(rc.unwrap_err().kind, TlsErrorKind::UnknownIdentity);
}

#[test]
fn nvme_lookup_takes_both_identity_versions_and_refuses_others() {
    if !tls_or_skip() {
        return;
    }
    for (hash, key) in [(PskHash::Sha256, CONFIGURED.to_vec()), (PskHash::Sha384, configured_48())] {
        let configured = ConfiguredPsk::new(Some(hash), &key).unwrap();
        let retained = configured.retained(HOST).unwrap();
        for version in [IdentityVersion::V0, IdentityVersion::V1] {
            let id = retained.identity(version, HOST, SUBSYS).unwrap();
            let psk = TlsPsk { hash, key: retained.tls_psk(&id).unwrap() };
            let table = retained.clone();
            let lookup = nvme_lookup(move |h, s| (h == HOST && s == SUBSYS).then(|| table.clone()));
            let mut c = TlsSession::client(id.to_string().as_bytes(), psk.clone()).unwrap();
            let mut s = TlsSession::server(lookup).unwrap();
            let (rc, rs) = handshake(&mut c, &mut s, 4096);
            rc.unwrap();
            rs.unwrap();
            assert_eq!(s.accepted_identity(), Some(id.to_string().as_bytes()));
            // Another subsystem's identity is unknown.
            let elsewhere = retained.identity(version, HOST, "nqn.other").unwrap();
            let table = retained.clone();
            let lookup = nvme_lookup(move |h, s| (h == HOST && s == SUBSYS).then(|| table.clone()));
            let mut c = TlsSession::client(elsewhere.to_string().as_bytes(), psk).unwrap();
            let mut s = TlsSession::server(lookup).unwrap();
            let (_, rs) = handshake(&mut c, &mut s, 4096);
            assert_eq!(rs.unwrap_err().kind, TlsErrorKind::UnknownIdentity);
        }
    }
}

// ---- Interop with the openssl command.

/// A process of ours, killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines a process prints, gathered by a thread.
fn lines(out: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits (at most 30 s: a bound, not a measurement) for a line containing `want`.
fn wait_line(rx: &mpsc::Receiver<String>, want: &str) -> bool {
    let end = Instant::now() + Duration::from_secs(30);
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(want) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Runs `session` over `sock` until `done` says so (at most 30 s): ciphertext both ways,
/// plaintext read into `got`.
fn drive(
    session: &mut TlsSession,
    sock: &mut TcpStream,
    got: &mut Vec<u8>,
    done: impl Fn(&TlsSession, &[u8]) -> bool,
) {
    sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let mut buf = vec![0u8; 8192];
    let mut held: Vec<u8> = Vec::new();
    while Instant::now() < end {
        let n = session.take(&mut buf);
        if n > 0 {
            sock.write_all(&buf[..n]).unwrap();
            continue;
        }
        if done(session, got) {
            return;
        }
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => held.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("{e}"),
        }
        let n = session.feed(&held).unwrap();
        held.drain(..n);
        let n = session.read(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        done(session, got),
        "the peer went away or 30 s passed; received {:?}",
        String::from_utf8_lossy(got)
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn client_interoperates_with_openssl_s_server() {
    if !tls_or_skip() {
        return;
    }
    // openssl's own PSK callbacks use TLS_AES_128_GCM_SHA256 for an external PSK.
    let key = ConfiguredPsk::new(Some(PskHash::Sha256), &CONFIGURED).unwrap().retained(HOST).unwrap();
    let id = key.identity(IdentityVersion::V0, HOST, SUBSYS).unwrap().to_string();
    let tls_key = key.tls_psk(&PskIdentity::parse(id.as_bytes()).unwrap()).unwrap();
    let port = free_port().to_string();
    let spawned = Command::new("openssl")
        .args(["s_server", "-tls1_3", "-nocert", "-naccept", "1", "-accept", &port, "-psk", &hex(&tls_key)])
        .args(["-psk_identity", &id, "-ciphersuites", "TLS_AES_128_GCM_SHA256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut server = match spawned {
        Ok(c) => Proc(c),
        Err(e) => return missing("openssl", e),
    };
    let out = lines(server.0.stdout.take().unwrap());
    assert!(wait_line(&out, "ACCEPT"), "openssl s_server did not start");
    let mut sock = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    let mut c = TlsSession::client(id.as_bytes(), TlsPsk { hash: PskHash::Sha256, key: tls_key }).unwrap();
    let mut got = Vec::new();
    drive(&mut c, &mut sock, &mut got, |s, _| s.is_established());
    assert_eq!(c.cipher_suite().as_deref(), Some("TLS_AES_128_GCM_SHA256"));
    // flashpath to openssl: s_server prints what it receives.
    assert_eq!(c.write(b"hello from flashpath\n").unwrap(), 21);
    // openssl to flashpath: s_server sends its standard input.
    server.0.stdin.as_mut().unwrap().write_all(b"hello from openssl\n").unwrap();
    drive(&mut c, &mut sock, &mut got, |_, got| got.ends_with(b"hello from openssl\n"));
    assert!(wait_line(&out, "hello from flashpath"), "s_server did not print the client's line");
}

#[test]
fn server_interoperates_with_openssl_s_client() {
    if !tls_or_skip() {
        return;
    }
    let retained = ConfiguredPsk::new(Some(PskHash::Sha256), &CONFIGURED).unwrap().retained(HOST).unwrap();
    let id = retained.identity(IdentityVersion::V1, HOST, SUBSYS).unwrap().to_string();
    let tls_key = retained.tls_psk(&PskIdentity::parse(id.as_bytes()).unwrap()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let spawned = Command::new("openssl")
        .args(["s_client", "-tls1_3", "-quiet", "-ign_eof", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-psk", &hex(&tls_key), "-psk_identity", &id, "-ciphersuites", "TLS_AES_128_GCM_SHA256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut client = match spawned {
        Ok(c) => Proc(c),
        Err(e) => return missing("openssl", e),
    };
    let out = lines(client.0.stdout.take().unwrap());
    client.0.stdin.as_mut().unwrap().write_all(b"hello from openssl\n").unwrap();
    let (mut sock, _) = listener.accept().unwrap();
    let table = retained.clone();
    let mut s =
        TlsSession::server(nvme_lookup(move |h, n| (h == HOST && n == SUBSYS).then(|| table.clone())))
            .unwrap();
    let mut got = Vec::new();
    drive(&mut s, &mut sock, &mut got, |_, got| got.ends_with(b"hello from openssl\n"));
    assert_eq!(s.accepted_identity(), Some(id.as_bytes()));
    assert_eq!(s.write(b"hello from flashpath\n").unwrap(), 21);
    drive(&mut s, &mut sock, &mut got, |s, _| s.pending() == 0);
    assert!(wait_line(&out, "hello from flashpath"), "s_client did not print the server's line");
}
