//! The client's side of the fixed newstyle handshake (NBD's doc/proto.md, "Fixed newstyle
//! negotiation" and "Option haggling"): NBD_OPT_GO asking for NBD_INFO_BLOCK_SIZE, and
//! NBD_OPT_EXPORT_NAME when the server does not know NBD_OPT_GO. Simple replies only: no
//! NBD_OPT_STRUCTURED_REPLY is sent, so every transmission reply is a 16-byte header.
//!
//! Written over any `Read + Write`, so the fuzz target can play a hostile server with plain
//! bytes. Everything the server says is bounded before it is used: option replies of at most
//! [`MAX_REPLY_LEN`] bytes, at most [`MAX_REPLIES`] of them, block sizes the protocol allows.

use std::io::{self, Read, Write};

use crate::proto::*;

/// The longest option reply accepted (an error's message, an informational reply); the
/// longest legitimate one is a 4 KiB name or description plus a few bytes.
pub const MAX_REPLY_LEN: u32 = 64 << 10;
/// Option replies read for one NBD_OPT_GO before giving up on a server that never ends it.
pub const MAX_REPLIES: usize = 64;
/// Export names are at most 4096 bytes (proto.md, "Export name").
pub const MAX_NAME_LEN: usize = 4096;
/// The first bytes of an oldstyle server after NBDMAGIC ("cliserv_magic").
const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;

/// What the server told about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The export's size in bytes.
    pub size: u64,
    /// Transmission flags (`TFLAG_*`).
    pub flags: u16,
    /// NBD_INFO_BLOCK_SIZE, when the server sent it: minimum, preferred, maximum.
    pub block_size: Option<BlockSize>,
    /// Whether the server answered NBD_OPT_GO (false: NBD_OPT_EXPORT_NAME was used).
    pub used_go: bool,
}

/// NBD_INFO_BLOCK_SIZE's three sizes, checked against the protocol's rules ("Block size
/// constraints").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSize {
    pub min: u32,
    pub preferred: u32,
    pub max: u32,
}

impl Negotiated {
    /// Whether the export refuses writes.
    pub fn read_only(&self) -> bool {
        self.flags & TFLAG_READ_ONLY != 0
    }

    /// Whether the server takes a command whose flag is `tflag` (`TFLAG_SEND_FLUSH`, ...).
    pub fn has(&self, tflag: u16) -> bool {
        self.flags & TFLAG_HAS_FLAGS != 0 && self.flags & tflag != 0
    }

    /// The largest read or write payload to send: the server's maximum block size, at most
    /// the protocol's customary 32 MiB ([`MAX_PAYLOAD`]).
    pub fn max_payload(&self) -> u32 {
        self.block_size.map_or(MAX_PAYLOAD, |b| b.max.min(MAX_PAYLOAD))
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not an NBD server: the greeting starts {0:#018x}, not NBDMAGIC")]
    NotNbd(u64),
    #[error("the server speaks the oldstyle protocol, which is not supported (only fixed newstyle)")]
    Oldstyle,
    #[error("the server speaks neither fixed newstyle nor oldstyle (magic {0:#018x})")]
    BadMagic(u64),
    #[error("the server does not offer fixed newstyle negotiation")]
    NotFixedNewstyle,
    #[error("export name of {0} bytes is longer than the protocol's 4096")]
    NameTooLong(usize),
    #[error("the server refused the export: {0}")]
    Refused(String),
    #[error("protocol violation by the server: {0}")]
    Protocol(String),
}

fn protocol(msg: impl Into<String>) -> HandshakeError {
    HandshakeError::Protocol(msg.into())
}

/// Negotiates `name` on a fresh connection. On success the stream is in the transmission
/// phase.
pub fn negotiate<S: Read + Write>(s: &mut S, name: &str) -> Result<Negotiated, HandshakeError> {
    if name.len() > MAX_NAME_LEN {
        return Err(HandshakeError::NameTooLong(name.len()));
    }
    let mut greeting = [0u8; 18];
    read_exact(s, &mut greeting[..16])?;
    let magic = u64::from_be_bytes(greeting[0..8].try_into().expect("8 bytes"));
    if magic != NBD_MAGIC {
        return Err(HandshakeError::NotNbd(magic));
    }
    match u64::from_be_bytes(greeting[8..16].try_into().expect("8 bytes")) {
        IHAVEOPT => {}
        OLDSTYLE_MAGIC => return Err(HandshakeError::Oldstyle),
        other => return Err(HandshakeError::BadMagic(other)),
    }
    read_exact(s, &mut greeting[16..18])?;
    let server_flags = u16::from_be_bytes([greeting[16], greeting[17]]);
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(HandshakeError::NotFixedNewstyle);
    }
    let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
    let mut client_flags = CLIENT_FLAG_FIXED_NEWSTYLE;
    if no_zeroes {
        client_flags |= CLIENT_FLAG_NO_ZEROES;
    }
    s.write_all(&client_flags.to_be_bytes())?;

    // NBD_OPT_GO: name length, name, one information request (NBD_INFO_BLOCK_SIZE).
    let mut data = Vec::with_capacity(8 + name.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &data)?;
    match go_replies(s) {
        Ok(Some(n)) => Ok(n),
        Ok(None) => export_name(s, name, no_zeroes),
        Err(e @ HandshakeError::Refused(_)) => {
            // Tell the server we are leaving rather than vanish mid-negotiation; best effort.
            let _ = send_option(s, OPT_ABORT, &[]);
            Err(e)
        }
        Err(e) => Err(e),
    }
}

fn send_option<S: Write>(s: &mut S, option: u32, data: &[u8]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(OPTION_HEADER_LEN + data.len());
    msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
    msg.extend_from_slice(&option.to_be_bytes());
    msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
    msg.extend_from_slice(data);
    s.write_all(&msg)?;
    s.flush()
}

/// A server that closes mid-handshake is an error naming that, not a bare "unexpected EOF".
fn read_exact<S: Read>(s: &mut S, buf: &mut [u8]) -> Result<(), HandshakeError> {
    s.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => protocol("the server closed the connection during the handshake"),
        _ => HandshakeError::Io(e),
    })
}

/// Reads NBD_OPT_GO's replies up to the final one. `Ok(None)`: the server does not know
/// NBD_OPT_GO (NBD_REP_ERR_UNSUP), so the caller falls back to NBD_OPT_EXPORT_NAME.
fn go_replies<S: Read>(s: &mut S) -> Result<Option<Negotiated>, HandshakeError> {
    let mut export: Option<(u64, u16)> = None;
    let mut block_size = None;
    for _ in 0..MAX_REPLIES {
        let mut hdr = [0u8; 20];
        read_exact(s, &mut hdr)?;
        let magic = u64::from_be_bytes(hdr[0..8].try_into().expect("8 bytes"));
        if magic != REPLY_MAGIC {
            return Err(protocol(format!("option reply magic {magic:#018x}")));
        }
        let option = u32::from_be_bytes(hdr[8..12].try_into().expect("4 bytes"));
        let kind = u32::from_be_bytes(hdr[12..16].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(hdr[16..20].try_into().expect("4 bytes"));
        if option != OPT_GO {
            return Err(protocol(format!("a reply to option {option} when NBD_OPT_GO was asked")));
        }
        if len > MAX_REPLY_LEN {
            return Err(protocol(format!("an option reply of {len} bytes (at most {MAX_REPLY_LEN})")));
        }
        let mut payload = vec![0u8; len as usize];
        read_exact(s, &mut payload)?;
        match kind {
            REP_INFO => parse_info(&payload, &mut export, &mut block_size)?,
            REP_ACK => {
                if len != 0 {
                    return Err(protocol("NBD_REP_ACK with a payload"));
                }
                let (size, flags) =
                    export.ok_or_else(|| protocol("NBD_OPT_GO acknowledged without NBD_INFO_EXPORT"))?;
                return Ok(Some(Negotiated { size, flags, block_size, used_go: true }));
            }
            REP_ERR_UNSUP => return Ok(None),
            k if k & (1 << 31) != 0 => return Err(HandshakeError::Refused(error_text(k, &payload))),
            k => return Err(protocol(format!("unexpected option reply type {k:#x} to NBD_OPT_GO"))),
        }
    }
    Err(protocol(format!("more than {MAX_REPLIES} replies to NBD_OPT_GO")))
}

/// One NBD_REP_INFO: the export's size and flags, or its block sizes; other kinds are skipped
/// (the protocol lets a server send information it was not asked for).
fn parse_info(
    p: &[u8],
    export: &mut Option<(u64, u16)>,
    block_size: &mut Option<BlockSize>,
) -> Result<(), HandshakeError> {
    if p.len() < 2 {
        return Err(protocol("NBD_REP_INFO shorter than its type"));
    }
    let be32 = |at: usize| u32::from_be_bytes(p[at..at + 4].try_into().expect("4 bytes"));
    match u16::from_be_bytes([p[0], p[1]]) {
        INFO_EXPORT => {
            if p.len() != 12 {
                return Err(protocol(format!("NBD_INFO_EXPORT of {} bytes, not 12", p.len())));
            }
            let size = u64::from_be_bytes(p[2..10].try_into().expect("8 bytes"));
            *export = Some((size, u16::from_be_bytes([p[10], p[11]])));
        }
        INFO_BLOCK_SIZE => {
            if p.len() != 14 {
                return Err(protocol(format!("NBD_INFO_BLOCK_SIZE of {} bytes, not 14", p.len())));
            }
            *block_size = Some(check_block_size(be32(2), be32(6), be32(10))?);
        }
        _ => {}
    }
    Ok(())
}

/// The protocol's rules: the minimum a power of two up to 64 KiB, the preferred a power of
/// two at least the minimum, the maximum a multiple of the minimum (or 0xffffffff) and at least
/// the preferred.
fn check_block_size(min: u32, preferred: u32, max: u32) -> Result<BlockSize, HandshakeError> {
    let bad = |what: &str| protocol(format!("NBD_INFO_BLOCK_SIZE {min}/{preferred}/{max}: {what}"));
    if !min.is_power_of_two() || min > 64 << 10 {
        return Err(bad("the minimum is not a power of two up to 64 KiB"));
    }
    if !preferred.is_power_of_two() || preferred < min {
        return Err(bad("the preferred size is not a power of two at least the minimum"));
    }
    if max < preferred.max(min) || (max != u32::MAX && !max.is_multiple_of(min)) {
        return Err(bad("the maximum is below the preferred size or not a multiple of the minimum"));
    }
    Ok(BlockSize { min, preferred, max })
}

/// An option error's text: its kind and the server's message (printable characters only,
/// bounded, since it goes to logs and RPC errors).
fn error_text(kind: u32, payload: &[u8]) -> String {
    let what = match kind {
        REP_ERR_UNKNOWN => "no such export",
        REP_ERR_POLICY => "forbidden by the server's policy",
        REP_ERR_TLS_REQD => "the server requires TLS (not supported by this client)",
        REP_ERR_INVALID => "invalid request",
        REP_ERR_SHUTDOWN => "the server is shutting down",
        REP_ERR_TOO_BIG => "request too big",
        _ => "error",
    };
    let msg: String = String::from_utf8_lossy(&payload[..payload.len().min(256)])
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    if msg.is_empty() {
        what.to_string()
    } else {
        format!("{what} ({msg})")
    }
}

/// NBD_OPT_EXPORT_NAME: no reply header; the export's size and flags, then 124 zero bytes
/// unless NO_ZEROES was agreed. A server without the export closes the connection.
fn export_name<S: Read + Write>(
    s: &mut S,
    name: &str,
    no_zeroes: bool,
) -> Result<Negotiated, HandshakeError> {
    send_option(s, OPT_EXPORT_NAME, name.as_bytes())?;
    let mut b = [0u8; 10 + 124];
    let want = if no_zeroes { 10 } else { b.len() };
    s.read_exact(&mut b[..want]).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => HandshakeError::Refused(format!(
            "the server closed the connection after NBD_OPT_EXPORT_NAME '{name}' (no such export?)"
        )),
        _ => HandshakeError::Io(e),
    })?;
    Ok(Negotiated {
        size: u64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
        flags: u16::from_be_bytes([b[8], b[9]]),
        block_size: None,
        used_go: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted server: what it says, and what the client wrote.
    struct Script {
        rx: io::Cursor<Vec<u8>>,
        tx: Vec<u8>,
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.rx.read(buf)
        }
    }

    impl Write for Script {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.tx.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn greeting(flags: u16) -> Vec<u8> {
        let mut v = b"NBDMAGICIHAVEOPT".to_vec();
        v.extend_from_slice(&flags.to_be_bytes());
        v
    }

    fn reply(v: &mut Vec<u8>, option: u32, kind: u32, payload: &[u8]) {
        option_reply(v, option, kind, payload);
    }

    fn info_export(size: u64, flags: u16) -> Vec<u8> {
        let mut p = INFO_EXPORT.to_be_bytes().to_vec();
        p.extend_from_slice(&size.to_be_bytes());
        p.extend_from_slice(&flags.to_be_bytes());
        p
    }

    fn info_block(min: u32, pref: u32, max: u32) -> Vec<u8> {
        let mut p = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [min, pref, max] {
            p.extend_from_slice(&v.to_be_bytes());
        }
        p
    }

    fn run(server: Vec<u8>, name: &str) -> (Result<Negotiated, HandshakeError>, Vec<u8>) {
        let mut s = Script { rx: io::Cursor::new(server), tx: Vec::new() };
        let r = negotiate(&mut s, name);
        (r, s.tx)
    }

    #[test]
    fn go_with_block_sizes() {
        let mut srv = greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        reply(&mut srv, OPT_GO, REP_INFO, &info_block(512, 4096, 32 << 20));
        reply(&mut srv, OPT_GO, REP_INFO, &[0, 1, b'x']); // NBD_INFO_NAME: skipped
        reply(&mut srv, OPT_GO, REP_INFO, &info_export(1 << 30, TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH));
        reply(&mut srv, OPT_GO, REP_ACK, &[]);
        let (r, tx) = run(srv, "disk");
        let n = r.unwrap();
        assert_eq!(n.size, 1 << 30);
        assert!(n.has(TFLAG_SEND_FLUSH) && !n.has(TFLAG_SEND_TRIM) && !n.read_only());
        assert_eq!(n.block_size, Some(BlockSize { min: 512, preferred: 4096, max: 32 << 20 }));
        assert!(n.used_go);
        // Client flags, then NBD_OPT_GO with the name and one info request.
        assert_eq!(&tx[..4], &(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes());
        assert_eq!(&tx[4..12], b"IHAVEOPT");
        assert_eq!(&tx[12..16], &OPT_GO.to_be_bytes());
        assert_eq!(&tx[16..20], &12u32.to_be_bytes());
        assert_eq!(&tx[20..24], &4u32.to_be_bytes());
        assert_eq!(&tx[24..28], b"disk");
        assert_eq!(&tx[28..32], &[0, 1, 0, 3]);
    }

    #[test]
    fn falls_back_to_export_name_with_and_without_zeroes() {
        for no_zeroes in [true, false] {
            let flags = if no_zeroes { FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES } else { FLAG_FIXED_NEWSTYLE };
            let mut srv = greeting(flags);
            reply(&mut srv, OPT_GO, REP_ERR_UNSUP, &[]);
            srv.extend_from_slice(&(8u64 << 20).to_be_bytes());
            srv.extend_from_slice(&(TFLAG_HAS_FLAGS | TFLAG_READ_ONLY).to_be_bytes());
            if !no_zeroes {
                srv.extend_from_slice(&[0; 124]);
            }
            let (r, tx) = run(srv, "e");
            let n = r.unwrap();
            assert_eq!((n.size, n.read_only(), n.used_go), (8 << 20, true, false));
            // The EXPORT_NAME option follows GO's 29 bytes.
            let opt = &tx[4 + 16 + 4 + 1 + 4..];
            assert_eq!(&opt[8..12], &OPT_EXPORT_NAME.to_be_bytes());
            assert_eq!(&opt[16..], b"e");
        }
    }

    #[test]
    fn refusals_and_violations_say_why() {
        let mut srv = greeting(FLAG_FIXED_NEWSTYLE);
        reply(&mut srv, OPT_GO, REP_ERR_UNKNOWN, b"no export 'x'\n");
        let e = run(srv, "x").0.unwrap_err().to_string();
        assert!(e.contains("no such export") && e.contains("no export 'x'"), "{e}");

        let e = run(greeting(0), "x").0.unwrap_err();
        assert!(matches!(e, HandshakeError::NotFixedNewstyle), "{e}");

        let mut old = b"NBDMAGIC".to_vec();
        old.extend_from_slice(&OLDSTYLE_MAGIC.to_be_bytes());
        assert!(matches!(run(old, "").0, Err(HandshakeError::Oldstyle)));

        let mut srv = greeting(FLAG_FIXED_NEWSTYLE);
        reply(&mut srv, OPT_GO, REP_ACK, &[]);
        let e = run(srv, "").0.unwrap_err().to_string();
        assert!(e.contains("without NBD_INFO_EXPORT"), "{e}");

        let mut srv = greeting(FLAG_FIXED_NEWSTYLE);
        reply(&mut srv, OPT_GO, REP_INFO, &info_block(3, 4096, 1 << 20));
        assert!(run(srv, "").0.unwrap_err().to_string().contains("minimum"));

        let mut srv = greeting(FLAG_FIXED_NEWSTYLE);
        srv.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
        srv.extend_from_slice(&OPT_GO.to_be_bytes());
        srv.extend_from_slice(&REP_INFO.to_be_bytes());
        srv.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(run(srv, "").0.unwrap_err().to_string().contains("option reply of"));

        let mut srv = greeting(FLAG_FIXED_NEWSTYLE);
        for _ in 0..=MAX_REPLIES {
            reply(&mut srv, OPT_GO, REP_INFO, &[0, 9]);
        }
        assert!(run(srv, "").0.unwrap_err().to_string().contains("more than"));

        let e = run(greeting(FLAG_FIXED_NEWSTYLE), "").0.unwrap_err().to_string();
        assert!(e.contains("closed the connection"), "{e}");
        assert!(matches!(run(Vec::new(), &"n".repeat(5000)).0, Err(HandshakeError::NameTooLong(5000))));
    }
}
