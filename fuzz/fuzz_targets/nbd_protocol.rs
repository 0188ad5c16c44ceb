//! Fuzz the NBD server's sans-IO parsers as a connection drives them: the client flags, option
//! headers and data through `fp_nbd::handshake::Negotiation` (TLS listener or not, one to three
//! exports), then transmission-phase request headers through `fp_nbd::proto::Request::parse`;
//! or an `nbd_device` string through `fp_nbd::address::parse_device`.
//!
//! Input encoding (missing bytes read as 0; the input ending inside an option's data ends the
//! connection, as EOF would):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | setup: TLS listener if `b & 1`; `1 + (b >> 1 & 3) % 3` exports (`disk0`, `d1`, `x`); if `b & 8` the rest is an `nbd_device` string and nothing else runs |
//! | 4 | client flags (big endian), as sent |
//!
//! then option records, until the negotiation ends:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | control: `c & 1` the option magic is IHAVEOPT (else 8 more bytes are the magic); `c & 2` a 2-byte length follows instead of the header's 4 |
//! | 8, 4, 4 or 2 | magic (unless `c & 1`), option number, length |
//! | length | the option's data |
//!
//! `StartTls` counts as a successful TLS handshake. After `Go`, request records: a control byte
//! (`c & 1`: the magic is REQUEST_MAGIC, else 4 more bytes are it), the other 24 header bytes,
//! then a write's payload (skipped).
//!
//! Checked: no panic; the replies are well-formed option replies to the option asked (or
//! NBD_OPT_EXPORT_NAME's bare reply when it goes); a TLS listener serves nothing before TLS
//! (every other option gets NBD_REP_ERR_TLS_REQD or closes); `Go` names an export of the
//! listener and selects `base:allocation` and dirty bitmaps only with structured replies (only
//! bitmaps the export offers, each once, in order; export `i` offers `i` bitmaps); no more than
//! `MAX_OPTIONS` options and no option longer than `MAX_OPTION_LEN` are handled; a request header
//! parses exactly when its magic is right and its payload fits, and encodes back to itself.
#![no_main]

use fp_nbd::address::{parse_device, Address};
use fp_nbd::handshake::{ExportInfo, ExportLookup, Negotiation, Step, MAX_OPTIONS, MAX_OPTION_LEN};
use fp_nbd::proto::*;
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 3] = ["disk0", "d1", "x"];

struct Exports(usize);

impl ExportLookup for Exports {
    type Export = usize;
    fn find(&self, name: &str) -> Result<(String, usize), String> {
        if name.is_empty() && self.0 == 1 {
            return Ok((NAMES[0].into(), 0));
        }
        NAMES[..self.0]
            .iter()
            .position(|n| *n == name)
            .map(|i| (NAMES[i].to_string(), i))
            .ok_or_else(|| format!("no export '{name}'"))
    }
    fn names(&self) -> Vec<String> {
        NAMES[..self.0].iter().map(|n| n.to_string()).collect()
    }
    fn info(&self, i: &usize) -> ExportInfo {
        ExportInfo {
            size: (*i as u64 + 1) << 20,
            flags: TFLAG_HAS_FLAGS | if *i == 2 { TFLAG_READ_ONLY } else { TFLAG_SEND_FLUSH },
            min_block: 512 << *i,
            description: format!("export {i}"),
            // Some exports offer qemu:dirty-bitmap: contexts, so queries reach their parsing.
            bitmaps: (0..*i).map(|b| format!("b{b}")).collect(),
        }
    }
}

struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn left(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    /// `n` bytes, zero-padded past the end of the input.
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        for x in b.iter_mut() {
            *x = self.u8();
        }
        b
    }
    /// Exactly `n` bytes, or `None` if the input ends first.
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.left() < n {
            return None;
        }
        // `pos` may be past the end (zero padding was read): then `n` is 0.
        let start = self.pos.min(self.data.len());
        let s = &self.data[start..start + n];
        self.pos += n;
        Some(s)
    }
}

/// Checks that `out` is a run of option replies to `option`; returns their types.
fn replies(out: &[u8], option: u32) -> Vec<u32> {
    let mut types = Vec::new();
    let mut rest = out;
    while !rest.is_empty() {
        assert!(rest.len() >= 20, "a truncated option reply: {out:?}");
        assert_eq!(u64::from_be_bytes(rest[0..8].try_into().unwrap()), REPLY_MAGIC);
        assert_eq!(u32::from_be_bytes(rest[8..12].try_into().unwrap()), option, "a reply to another option");
        types.push(u32::from_be_bytes(rest[12..16].try_into().unwrap()));
        let len = u32::from_be_bytes(rest[16..20].try_into().unwrap()) as usize;
        assert!(rest.len() >= 20 + len, "an option reply longer than what was written");
        rest = &rest[20 + len..];
    }
    types
}

fn device(s: &[u8]) {
    let Ok(s) = std::str::from_utf8(s) else { return };
    if let Ok(d) = parse_device(s) {
        // Never resolved here (a lookup may take the network); only its shape is checked.
        match &d.address {
            Address::Unix(p) => assert!(p.is_absolute(), "{s:?} gave a relative socket path {p:?}"),
            Address::Tcp { host, .. } => assert!(!host.is_empty(), "{s:?} gave an empty host"),
        }
        let _ = d.address.to_string();
    }
}

fn transmission(input: &mut Input<'_>) {
    while !input.done() {
        let c = input.u8();
        let mut h = [0u8; REQUEST_LEN];
        if c & 1 != 0 {
            h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        } else {
            h[0..4].copy_from_slice(&input.bytes::<4>());
        }
        h[4..].copy_from_slice(&input.bytes::<24>());
        let magic_ok = h[0..4] == REQUEST_MAGIC.to_be_bytes();
        let command = u16::from_be_bytes([h[6], h[7]]);
        let length = u32::from_be_bytes(h[24..28].try_into().unwrap());
        match Request::parse(&h) {
            Ok(r) => {
                assert!(magic_ok);
                assert!(!(matches!(command, CMD_READ | CMD_WRITE) && length > MAX_PAYLOAD));
                assert_eq!(r.encode(), h, "a request header does not encode back to itself");
                assert!(r.payload_len() <= MAX_PAYLOAD as usize);
                assert_eq!(r.payload_len() > 0, command == CMD_WRITE && length > 0);
                if input.take(r.payload_len()).is_none() {
                    return;
                }
            }
            Err(RequestError::BadMagic(m)) => {
                assert!(!magic_ok && m.to_be_bytes() == h[0..4]);
                return;
            }
            Err(RequestError::TooLong { length: l, .. }) => {
                assert!(magic_ok && l == length && l > MAX_PAYLOAD && matches!(command, CMD_READ | CMD_WRITE));
                return;
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input { data, pos: 0 };
    let setup = input.u8();
    if setup & 8 != 0 {
        device(&data[1..]);
        return;
    }
    let tls = setup & 1 != 0;
    let exports = Exports(1 + usize::from(setup >> 1 & 3) % 3);
    let mut n = Negotiation::new(tls);
    if n.client_flags(u32::from_be_bytes(input.bytes::<4>())).is_err() {
        return;
    }
    let mut tls_active = false;
    let mut handled = 0u32;
    let mut out = Vec::new();
    loop {
        if input.done() {
            return;
        }
        let c = input.u8();
        let mut hb = [0u8; OPTION_HEADER_LEN];
        if c & 1 != 0 {
            hb[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        } else {
            hb[0..8].copy_from_slice(&input.bytes::<8>());
        }
        hb[8..12].copy_from_slice(&input.bytes::<4>());
        if c & 2 != 0 {
            let short = u16::from_be_bytes(input.bytes::<2>());
            hb[12..16].copy_from_slice(&u32::from(short).to_be_bytes());
        } else {
            hb[12..16].copy_from_slice(&input.bytes::<4>());
        }
        let Some(header) = OptionHeader::parse(&hb) else {
            assert_ne!(hb[0..8], IHAVEOPT.to_be_bytes());
            return;
        };
        if n.check_header(&header).is_err() {
            assert!(handled >= MAX_OPTIONS || header.length > MAX_OPTION_LEN);
            return;
        }
        handled += 1;
        assert!(handled <= MAX_OPTIONS && header.length <= MAX_OPTION_LEN);
        let Some(option_data) = input.take(header.length as usize) else { return };
        out.clear();
        let step = n.option(&exports, header, option_data, &mut out);
        let before_tls = tls && !tls_active;
        match step {
            Step::Go(t) => {
                assert!(!before_tls, "a TLS listener went to transmission without TLS");
                assert!(NAMES[..exports.0].contains(&t.name.as_str()), "went to export {:?}", t.name);
                assert!(!t.allocation || t.structured, "base:allocation without structured replies");
                assert!(t.bitmaps.is_empty() || t.structured, "a dirty bitmap without structured replies");
                let offered = exports.info(&t.export).bitmaps.len() as u32;
                assert!(t.bitmaps.iter().all(|&b| b < offered), "a bitmap the export does not offer");
                assert!(t.bitmaps.windows(2).all(|w| w[0] < w[1]), "bitmaps selected twice or out of order");
                if header.option == OPT_EXPORT_NAME {
                    assert!(out.len() == 10 || out.len() == 134, "NBD_OPT_EXPORT_NAME's reply of {} bytes", out.len());
                } else {
                    assert_eq!(header.option, OPT_GO);
                    assert_eq!(replies(&out, OPT_GO).last(), Some(&REP_ACK));
                }
                transmission(&mut input);
                return;
            }
            Step::StartTls => {
                assert!(tls && !tls_active && header.option == OPT_STARTTLS);
                assert_eq!(replies(&out, OPT_STARTTLS), [REP_ACK]);
                n.tls_started();
                tls_active = true;
            }
            Step::Abort => {
                assert_eq!(header.option, OPT_ABORT);
                return;
            }
            Step::Close(why) => {
                assert!(!why.is_empty());
                return;
            }
            Step::Continue => {
                let types = replies(&out, header.option);
                assert!(!types.is_empty(), "option {} got no reply", header.option);
                if before_tls && header.option != OPT_STARTTLS {
                    assert_eq!(types, [REP_ERR_TLS_REQD], "option {} served before TLS", header.option);
                }
                // One final reply: an ACK or an error, after any informational ones.
                for t in &types[..types.len() - 1] {
                    assert!(matches!(*t, REP_SERVER | REP_INFO | REP_META_CONTEXT), "reply {t:#x} before the last");
                }
            }
        }
    }
});
