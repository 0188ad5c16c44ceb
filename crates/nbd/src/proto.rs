//! The NBD wire format: magics, option and command numbers, flags, and the fixed-size headers,
//! as the protocol document (NBD's doc/proto.md, "Protocol phases" and "Transmission phase")
//! defines them. Every value is big-endian on the wire.

/// "NBDMAGIC": the first eight bytes a server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation; also each option's magic.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Option reply magic.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Simple reply magic.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Structured reply chunk magic.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Request magic (compact headers; extended headers are not offered).
pub const REQUEST_MAGIC: u32 = 0x2560_9513;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

/// NBD_OPT_INFO / NBD_OPT_GO information types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_SEND_DF: u16 = 1 << 7;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// Error values (the protocol's own numbering, which happens to be Linux's).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// `base:allocation` states.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The metadata contexts served, and the ids they get: `base:allocation` 1, the export's
/// bitmaps (`qemu:dirty-bitmap:NAME`, QEMU's) 2, 3, ... in the order the export lists them.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;
pub const DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";
pub const FIRST_BITMAP_ID: u32 = 2;
/// A `qemu:dirty-bitmap:` state: the extent changed since the bitmap was cleared.
pub const STATE_DIRTY: u32 = 1 << 0;

/// The largest READ or WRITE payload accepted (and advertised as the maximum block size): 32
/// MiB, as QEMU's server. A bigger one closes the connection, since its payload cannot be
/// skipped safely.
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// Sizes of the fixed parts.
pub const REQUEST_LEN: usize = 28;
pub const SIMPLE_REPLY_LEN: usize = 16;
pub const CHUNK_HEADER_LEN: usize = 20;
pub const OPTION_HEADER_LEN: usize = 16;

/// The server's first message: magics and handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut b = [0u8; 18];
    b[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    b
}

/// A transmission-phase request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Why a request header cannot be served at all (the connection closes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("bad request magic {0:#010x}")]
    BadMagic(u32),
    #[error("{command} request of {length} bytes is over the {MAX_PAYLOAD}-byte limit")]
    TooLong { command: &'static str, length: u32 },
}

impl Request {
    /// Parses a 28-byte header; checks what makes the byte stream unusable (the magic, a payload
    /// length the connection cannot carry). Everything else is the command's to check.
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Result<Request, RequestError> {
        let magic = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if magic != REQUEST_MAGIC {
            return Err(RequestError::BadMagic(magic));
        }
        let r = Request {
            flags: u16::from_be_bytes([b[4], b[5]]),
            command: u16::from_be_bytes([b[6], b[7]]),
            cookie: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
            length: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
        };
        if matches!(r.command, CMD_READ | CMD_WRITE) && r.length > MAX_PAYLOAD {
            let command = if r.command == CMD_READ { "read" } else { "write" };
            return Err(RequestError::TooLong { command, length: r.length });
        }
        Ok(r)
    }

    /// Bytes of payload that follow the header.
    pub fn payload_len(&self) -> usize {
        if self.command == CMD_WRITE {
            self.length as usize
        } else {
            0
        }
    }

    /// The encoded header (for tests and clients).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply header.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header; `length` counts the payload after it.
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, length: u32) -> [u8; CHUNK_HEADER_LEN] {
    let mut b = [0u8; CHUNK_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// Appends an option reply (header and payload) to `out`.
pub fn option_reply(out: &mut Vec<u8>, option: u32, kind: u32, payload: &[u8]) {
    out.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// An option's header: its number and the length of the data that follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

impl OptionHeader {
    /// `None` when the magic is wrong.
    pub fn parse(b: &[u8; OPTION_HEADER_LEN]) -> Option<OptionHeader> {
        if u64::from_be_bytes(b[0..8].try_into().expect("8 bytes")) != IHAVEOPT {
            return None;
        }
        Some(OptionHeader {
            option: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            length: u32::from_be_bytes(b[12..16].try_into().expect("4 bytes")),
        })
    }
}

/// The name of a command, for logs.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "read",
        CMD_WRITE => "write",
        CMD_DISC => "disconnect",
        CMD_FLUSH => "flush",
        CMD_TRIM => "trim",
        CMD_CACHE => "cache",
        CMD_WRITE_ZEROES => "write-zeroes",
        CMD_BLOCK_STATUS => "block-status",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_bad_ones_are_refused() {
        let r = Request { flags: CMD_FLAG_FUA, command: CMD_WRITE, cookie: 7, offset: 4096, length: 512 };
        assert_eq!(Request::parse(&r.encode()), Ok(r));
        assert_eq!(r.payload_len(), 512);
        let mut bad = r.encode();
        bad[0] = 0;
        assert_eq!(Request::parse(&bad), Err(RequestError::BadMagic(0x0060_9513)));
        let huge = Request { length: u32::MAX, ..r };
        assert!(matches!(
            Request::parse(&huge.encode()),
            Err(RequestError::TooLong { command: "write", .. })
        ));
        // A trim may cover 4 GiB - 1 bytes: it carries no payload.
        let trim = Request { command: CMD_TRIM, length: u32::MAX, ..r };
        assert_eq!(Request::parse(&trim.encode()).map(|r| r.payload_len()), Ok(0));
    }

    #[test]
    fn headers_have_the_documented_layout() {
        assert_eq!(&greeting()[..8], b"NBDMAGIC");
        assert_eq!(&greeting()[8..16], b"IHAVEOPT");
        assert_eq!(simple_reply(EIO, 1)[..8], [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5]);
        assert_eq!(chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 2, 0)[4..6], [0, 1]);
        let mut out = Vec::new();
        option_reply(&mut out, OPT_GO, REP_ACK, &[]);
        assert_eq!(out.len(), 20);
        let mut opt = [0u8; OPTION_HEADER_LEN];
        opt[..8].copy_from_slice(b"IHAVEOPT");
        opt[11] = 7;
        assert_eq!(OptionHeader::parse(&opt), Some(OptionHeader { option: OPT_GO, length: 0 }));
        opt[0] = b'X';
        assert_eq!(OptionHeader::parse(&opt), None);
    }
}
