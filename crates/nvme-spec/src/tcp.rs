//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, "TCP" below): the 8-byte common header
//! checked against each type's fixed layout, the fields of each PDU a host or a target reads or
//! writes, and the CRC32C header and data digests. Pure: no I/O, no allocation, and no input
//! makes it panic; encoders write into buffers the caller owns (a connection's slot table).

use crate::cqe::{Cqe, CQE_LEN};
use crate::sqe::{Sqe, SQE_LEN};

// PDU types (TCP 3.6.1, Figure 11).
/// ICReq: the host opens the connection.
pub const PDU_IC_REQ: u8 = 0x00;
/// ICResp: the controller answers it.
pub const PDU_IC_RESP: u8 = 0x01;
/// H2CTermReq: the host ends the connection on a fatal error.
pub const PDU_H2C_TERM_REQ: u8 = 0x02;
/// C2HTermReq: the controller ends the connection on a fatal error.
pub const PDU_C2H_TERM_REQ: u8 = 0x03;
/// CapsuleCmd: a command, with in-capsule data if any.
pub const PDU_CAPSULE_CMD: u8 = 0x04;
/// CapsuleResp: a completion.
pub const PDU_CAPSULE_RESP: u8 = 0x05;
/// H2CData: data from host to controller.
pub const PDU_H2C_DATA: u8 = 0x06;
/// C2HData: data from controller to host.
pub const PDU_C2H_DATA: u8 = 0x07;
/// R2T: the controller is ready for data.
pub const PDU_R2T: u8 = 0x09;

// Common header flags (TCP 3.6.1).
/// A header digest follows the PDU header.
pub const FLAG_HDGSTF: u8 = 0x01;
/// A data digest follows the PDU data.
pub const FLAG_DDGSTF: u8 = 0x02;
/// H2CData / C2HData: the last data PDU of the command's transfer.
pub const FLAG_LAST_PDU: u8 = 0x04;
/// C2HData: the command succeeded and no response capsule follows (TCP 3.6.2.8).
pub const FLAG_SUCCESS: u8 = 0x08;

/// Bytes in the common header.
pub const CH_LEN: usize = 8;
/// Bytes in a digest.
pub const DIGEST_LEN: usize = 4;
/// ICReq and ICResp header length.
pub const IC_LEN: usize = 128;
/// CapsuleCmd header length: the common header and the SQE.
pub const CAPSULE_CMD_HLEN: usize = CH_LEN + SQE_LEN;
/// CapsuleResp header length: the common header and the CQE.
pub const CAPSULE_RESP_HLEN: usize = CH_LEN + CQE_LEN;
/// H2CData, C2HData, R2T, H2CTermReq and C2HTermReq header length.
pub const DATA_HLEN: usize = 24;
/// The largest header any PDU has (ICReq), plus its digest room: what a term request echoes.
pub const MAX_HLEN: usize = IC_LEN;
/// A termination request's data (the offending PDU header) is at most this long (TCP 3.6.2.3).
pub const TERM_REQ_MAX_DATA: usize = 128;

/// The PDU format version the target speaks (TCP 3.6.2.2: PFV 0).
pub const PFV: u16 = 0;

// Fatal error status of a termination request (TCP 3.6.2.3 and 3.6.2.4, Figure 21).
/// Invalid PDU Header Field (FEI: the field's byte offset).
pub const FES_INVALID_HEADER_FIELD: u16 = 0x01;
/// PDU Sequence Error.
pub const FES_PDU_SEQUENCE_ERROR: u16 = 0x02;
/// Header Digest Error.
pub const FES_HEADER_DIGEST_ERROR: u16 = 0x03;
/// Data Transfer Out of Range.
pub const FES_DATA_OUT_OF_RANGE: u16 = 0x04;
/// R2T limit exceeded (H2CTermReq) or data transfer limit exceeded (C2HTermReq).
pub const FES_DATA_LIMIT_EXCEEDED: u16 = 0x05;
/// Unsupported Parameter.
pub const FES_UNSUPPORTED_PARAMETER: u16 = 0x06;

/// What was negotiated by ICReq/ICResp: digests on or off, the host's data alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    /// Header digests (HDGST).
    pub header: bool,
    /// Data digests (DDGST).
    pub data: bool,
}

/// The 8-byte common header (TCP 3.6.1, Figure 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    /// PDU type ([`PDU_IC_REQ`], ...).
    pub pdu_type: u8,
    /// Flags ([`FLAG_HDGSTF`], ...).
    pub flags: u8,
    /// Header length (without the header digest).
    pub hlen: u8,
    /// PDU data offset: where the data starts, from the PDU's first byte; 0 when none.
    pub pdo: u8,
    /// The whole PDU's length: header, header digest, padding, data, data digest.
    pub plen: u32,
}

impl CommonHeader {
    /// Decodes the first 8 bytes of a PDU.
    #[inline]
    pub fn parse(b: &[u8; CH_LEN]) -> CommonHeader {
        CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// Writes the header into the first 8 bytes of `b`.
    #[inline]
    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.pdu_type;
        b[1] = self.flags;
        b[2] = self.hlen;
        b[3] = self.pdo;
        b[4..8].copy_from_slice(&self.plen.to_le_bytes());
    }
}

/// Why a PDU is refused: the termination request's FES and FEI (the offending field's byte
/// offset for a bad header field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} (FES {fes:#x}, FEI {fei})")]
pub struct PduError {
    /// Fatal Error Status ([`FES_INVALID_HEADER_FIELD`], ...).
    pub fes: u16,
    /// Fatal Error Information.
    pub fei: u32,
    /// What was wrong, for the log.
    pub what: &'static str,
}

fn bad_field(fei: u32, what: &'static str) -> PduError {
    PduError { fes: FES_INVALID_HEADER_FIELD, fei, what }
}

/// A PDU's shape once its common header checked out: where its parts are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The common header it was checked from.
    pub ch: CommonHeader,
    /// Bytes of header plus header digest.
    pub header_len: usize,
    /// Where the data starts (== header_len plus padding); meaningless when `data_len` is 0.
    pub data_offset: usize,
    /// Bytes of data (without padding or digest).
    pub data_len: usize,
    /// A data digest follows the data.
    pub data_digest: bool,
}

impl Layout {
    /// The whole PDU's length.
    #[inline]
    pub fn plen(&self) -> usize {
        self.ch.plen as usize
    }
}

/// The fixed header length of a PDU type, and whether it may carry a header digest and data.
#[inline]
fn shape(pdu_type: u8) -> Option<(usize, bool, bool)> {
    Some(match pdu_type {
        PDU_IC_REQ | PDU_IC_RESP => (IC_LEN, false, false),
        PDU_H2C_TERM_REQ | PDU_C2H_TERM_REQ => (DATA_HLEN, false, true),
        PDU_CAPSULE_CMD => (CAPSULE_CMD_HLEN, true, true),
        PDU_CAPSULE_RESP => (CAPSULE_RESP_HLEN, true, false),
        PDU_H2C_DATA | PDU_C2H_DATA => (DATA_HLEN, true, true),
        PDU_R2T => (DATA_HLEN, true, false),
        _ => return None,
    })
}

/// Checks a common header against its type's layout (TCP 3.6.1): the fixed HLEN, the digest
/// flags against what was negotiated, PDO aligned to `(pda + 1) * 4` (the receiver's CPDA or
/// HPDA) and past the header, and PLEN between the header and `max_plen`.
#[inline]
pub fn check_header(ch: &CommonHeader, digests: Digests, pda: u8, max_plen: u32) -> Result<Layout, PduError> {
    let Some((hlen, may_hdgst, may_data)) = shape(ch.pdu_type) else {
        return Err(bad_field(0, "unknown PDU type"));
    };
    if usize::from(ch.hlen) != hlen {
        return Err(bad_field(2, "header length does not match the PDU type"));
    }
    let hdgst = may_hdgst && digests.header;
    if (ch.flags & FLAG_HDGSTF != 0) != hdgst {
        return Err(bad_field(1, "header digest flag does not match what was negotiated"));
    }
    let header_len = hlen + if hdgst { DIGEST_LEN } else { 0 };
    let plen = ch.plen as usize;
    if ch.plen > max_plen {
        return Err(PduError { fes: FES_DATA_LIMIT_EXCEEDED, fei: 4, what: "PDU longer than allowed" });
    }
    if plen < header_len {
        return Err(bad_field(4, "PDU length shorter than its header"));
    }
    if plen == header_len {
        if ch.flags & FLAG_DDGSTF != 0 {
            return Err(bad_field(1, "data digest flag on a PDU without data"));
        }
        return Ok(Layout { ch: *ch, header_len, data_offset: header_len, data_len: 0, data_digest: false });
    }
    if !may_data {
        return Err(bad_field(4, "PDU length longer than its header on a PDU without data"));
    }
    // Term requests carry no digests; data PDUs and capsules with data carry one if negotiated.
    let is_term = matches!(ch.pdu_type, PDU_H2C_TERM_REQ | PDU_C2H_TERM_REQ);
    let ddgst = !is_term && digests.data;
    if (ch.flags & FLAG_DDGSTF != 0) != ddgst {
        return Err(bad_field(1, "data digest flag does not match what was negotiated"));
    }
    let data_offset = if is_term { header_len } else { usize::from(ch.pdo) };
    let align = (usize::from(pda) + 1) * 4;
    if !is_term && (data_offset < header_len || data_offset % align != 0) {
        return Err(bad_field(3, "data offset inside the header or not aligned"));
    }
    let tail = if ddgst { DIGEST_LEN } else { 0 };
    let Some(data_len) = plen.checked_sub(data_offset + tail).filter(|&n| n > 0) else {
        return Err(bad_field(4, "PDU length leaves no data"));
    };
    Ok(Layout { ch: *ch, header_len, data_offset, data_len, data_digest: ddgst })
}

/// CRC32C of `bytes`, the digest both kinds use (TCP 3.6.3.2).
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    ::crc32c::crc32c(bytes)
}

/// Continues a CRC32C over more bytes (a data digest over a buffer filled in pieces).
#[inline]
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    ::crc32c::crc32c_append(crc, bytes)
}

/// Checks a PDU's header digest: `header` is the header followed by its digest.
#[inline]
pub fn header_digest_ok(header_and_digest: &[u8], hlen: usize) -> bool {
    let Some(d) = header_and_digest.get(hlen..hlen + DIGEST_LEN) else { return false };
    crc32c(&header_and_digest[..hlen]).to_le_bytes() == d
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// An initialize connection request (TCP 3.6.2.1, Figure 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PDU Format Version.
    pub pfv: u16,
    /// Host PDU data alignment: C2HData data starts at a multiple of `(hpda + 1) * 4`.
    pub hpda: u8,
    /// The digests the host asks for.
    pub digests: Digests,
    /// Outstanding R2Ts per command the host accepts, zero-based.
    pub maxr2t: u32,
}

impl IcReq {
    /// Decodes an ICReq's header (after [`check_header`]). Refuses what the target cannot do:
    /// another PDU format version, an HPDA above 31.
    #[inline]
    pub fn parse(h: &[u8; IC_LEN]) -> Result<IcReq, PduError> {
        let pfv = u16_at(h, 8);
        if pfv != PFV {
            return Err(PduError {
                fes: FES_UNSUPPORTED_PARAMETER,
                fei: 8,
                what: "unsupported PDU format version",
            });
        }
        let hpda = h[10];
        if hpda > 31 {
            return Err(PduError { fes: FES_INVALID_HEADER_FIELD, fei: 10, what: "HPDA above 31" });
        }
        let dgst = h[11];
        Ok(IcReq {
            pfv,
            hpda,
            digests: Digests { header: dgst & 1 != 0, data: dgst & 2 != 0 },
            maxr2t: u32_at(h, 12),
        })
    }

    /// Writes an ICReq (a host's; the tests' and fuzzers' host uses it).
    #[inline]
    pub fn write(&self, b: &mut [u8; IC_LEN]) {
        b.fill(0);
        CommonHeader { pdu_type: PDU_IC_REQ, flags: 0, hlen: IC_LEN as u8, pdo: 0, plen: IC_LEN as u32 }
            .write(b);
        b[8..10].copy_from_slice(&self.pfv.to_le_bytes());
        b[10] = self.hpda;
        b[11] = u8::from(self.digests.header) | (u8::from(self.digests.data) << 1);
        b[12..16].copy_from_slice(&self.maxr2t.to_le_bytes());
    }
}

/// An initialize connection response (TCP 3.6.2.2, Figure 14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// Controller PDU data alignment: H2C data starts at a multiple of `(cpda + 1) * 4`.
    pub cpda: u8,
    /// The digests the connection uses.
    pub digests: Digests,
    /// The most data one H2CData PDU may carry.
    pub maxh2cdata: u32,
}

impl IcResp {
    /// Writes an ICResp (PDU format version 0).
    #[inline]
    pub fn write(&self, b: &mut [u8; IC_LEN]) {
        b.fill(0);
        CommonHeader { pdu_type: PDU_IC_RESP, flags: 0, hlen: IC_LEN as u8, pdo: 0, plen: IC_LEN as u32 }
            .write(b);
        b[8..10].copy_from_slice(&PFV.to_le_bytes());
        b[10] = self.cpda;
        b[11] = u8::from(self.digests.header) | (u8::from(self.digests.data) << 1);
        b[12..16].copy_from_slice(&self.maxh2cdata.to_le_bytes());
    }

    /// Decodes an ICResp's fields, unchecked ([`IcResp::parse_checked`] checks them).
    #[inline]
    pub fn parse(h: &[u8; IC_LEN]) -> IcResp {
        IcResp {
            cpda: h[10],
            digests: Digests { header: h[11] & 1 != 0, data: h[11] & 2 != 0 },
            maxh2cdata: u32_at(h, 12),
        }
    }
}

/// The command of a CapsuleCmd header (TCP 3.6.2.5): bytes 8..72.
#[inline]
pub fn capsule_sqe(h: &[u8]) -> Option<Sqe> {
    let b: &[u8; SQE_LEN] = h.get(CH_LEN..CAPSULE_CMD_HLEN)?.try_into().ok()?;
    Some(Sqe::from_bytes(b))
}

/// The fields of an H2CData, C2HData or R2T header (TCP 3.6.2.6 to 3.6.2.8): the command,
/// the transfer tag (H2CData, R2T), the offset and length of the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// Command Capsule CID: the command the data belongs to.
    pub cccid: u16,
    /// Transfer Tag: the R2T an H2CData answers.
    pub ttag: u16,
    /// Where the data goes in the command's transfer.
    pub offset: u32,
    /// Bytes of data.
    pub length: u32,
}

impl DataHeader {
    /// Decodes a data PDU's or R2T's fields (`None` if `h` is shorter than the header).
    #[inline]
    pub fn parse(h: &[u8]) -> Option<DataHeader> {
        let h = h.get(..DATA_HLEN)?;
        Some(DataHeader {
            cccid: u16_at(h, 8),
            ttag: u16_at(h, 10),
            offset: u32_at(h, 12),
            length: u32_at(h, 16),
        })
    }

    #[inline]
    fn write_fields(&self, b: &mut [u8]) {
        b[8..10].copy_from_slice(&self.cccid.to_le_bytes());
        b[10..12].copy_from_slice(&self.ttag.to_le_bytes());
        b[12..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.length.to_le_bytes());
        b[20..24].fill(0);
    }
}

/// The data offset a PDU gets for a receiver asking `pda` alignment, after `header_len` bytes.
#[inline]
pub fn data_offset(header_len: usize, pda: u8) -> usize {
    header_len.next_multiple_of((usize::from(pda) + 1) * 4)
}

/// Writes the header of a PDU and returns the bytes written (header, digest, zero padding up to
/// the data); `data_len` bytes of data (and a data digest if `ddgst`) are the caller's to send.
#[inline]
fn write_pdu_header(
    b: &mut [u8],
    pdu_type: u8,
    mut flags: u8,
    hlen: usize,
    digests: Digests,
    pda: u8,
    data_len: usize,
) -> usize {
    let hd = if digests.header { DIGEST_LEN } else { 0 };
    let (pdo, plen) = if data_len == 0 {
        (0, hlen + hd)
    } else {
        let pdo = data_offset(hlen + hd, pda);
        let dd = if digests.data { DIGEST_LEN } else { 0 };
        (pdo, pdo + data_len + dd)
    };
    if digests.header {
        flags |= FLAG_HDGSTF;
    }
    if digests.data && data_len > 0 {
        flags |= FLAG_DDGSTF;
    }
    CommonHeader { pdu_type, flags, hlen: hlen as u8, pdo: pdo as u8, plen: plen as u32 }.write(b);
    if digests.header {
        let d = crc32c(&b[..hlen]);
        b[hlen..hlen + DIGEST_LEN].copy_from_slice(&d.to_le_bytes());
    }
    let end = if data_len == 0 { hlen + hd } else { pdo };
    b[hlen + hd..end].fill(0);
    end
}

/// Room for the largest header the target writes before data: header, digest and padding to
/// an HPDA of 31 (128 bytes).
pub const HEADER_ROOM: usize = 128;

/// Writes a CapsuleResp carrying `cqe`; returns its length.
#[inline]
pub fn write_capsule_resp(b: &mut [u8; HEADER_ROOM], cqe: &Cqe, digests: Digests) -> usize {
    b[CH_LEN..CAPSULE_RESP_HLEN].copy_from_slice(&cqe.to_bytes());
    write_pdu_header(b, PDU_CAPSULE_RESP, 0, CAPSULE_RESP_HLEN, digests, 0, 0)
}

/// Writes a C2HData header for `h.length` bytes of data at `h.offset` of command `h.cccid`;
/// returns the bytes up to the data.
#[inline]
pub fn write_c2h_data(
    b: &mut [u8; HEADER_ROOM],
    h: &DataHeader,
    flags: u8,
    digests: Digests,
    hpda: u8,
) -> usize {
    DataHeader { ttag: 0, ..*h }.write_fields(b);
    write_pdu_header(b, PDU_C2H_DATA, flags, DATA_HLEN, digests, hpda, h.length as usize)
}

/// Writes an R2T asking for `h.length` bytes at `h.offset`; returns its length.
#[inline]
pub fn write_r2t(b: &mut [u8; HEADER_ROOM], h: &DataHeader, digests: Digests) -> usize {
    h.write_fields(b);
    write_pdu_header(b, PDU_R2T, 0, DATA_HLEN, digests, 0, 0)
}

/// Writes an H2CData header (a host's); returns the bytes up to the data.
#[inline]
pub fn write_h2c_data(
    b: &mut [u8; HEADER_ROOM],
    h: &DataHeader,
    last: bool,
    digests: Digests,
    cpda: u8,
) -> usize {
    h.write_fields(b);
    let flags = if last { FLAG_LAST_PDU } else { 0 };
    write_pdu_header(b, PDU_H2C_DATA, flags, DATA_HLEN, digests, cpda, h.length as usize)
}

/// Writes a CapsuleCmd header (a host's) for `sqe` with `data_len` bytes of in-capsule data to
/// follow; returns the bytes up to the data.
#[inline]
pub fn write_capsule_cmd(
    b: &mut [u8; HEADER_ROOM],
    sqe: &Sqe,
    data_len: usize,
    digests: Digests,
    cpda: u8,
) -> usize {
    b[CH_LEN..CAPSULE_CMD_HLEN].copy_from_slice(&sqe.0);
    write_pdu_header(b, PDU_CAPSULE_CMD, 0, CAPSULE_CMD_HLEN, digests, cpda, data_len)
}

/// A termination request's fields (TCP 3.6.2.3, Figure 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq {
    /// Fatal Error Status.
    pub fes: u16,
    /// Fatal Error Information.
    pub fei: u32,
}

impl TermReq {
    /// Decodes a termination request's fields (`None` if `h` is shorter than the header).
    #[inline]
    pub fn parse(h: &[u8]) -> Option<TermReq> {
        let h = h.get(..DATA_HLEN)?;
        Some(TermReq { fes: u16_at(h, 8), fei: u32_at(h, 10) })
    }
}

/// Writes a C2HTermReq whose data is (up to 128 bytes of) the offending PDU header; returns
/// its length. `b` must hold `DATA_HLEN + TERM_REQ_MAX_DATA` bytes.
pub fn write_c2h_term_req(
    b: &mut [u8; DATA_HLEN + TERM_REQ_MAX_DATA],
    err: &PduError,
    offending: &[u8],
) -> usize {
    let data = &offending[..offending.len().min(TERM_REQ_MAX_DATA)];
    b[8..10].copy_from_slice(&err.fes.to_le_bytes());
    b[10..14].copy_from_slice(&err.fei.to_le_bytes());
    b[14..DATA_HLEN].fill(0);
    let plen = DATA_HLEN + data.len();
    CommonHeader {
        pdu_type: PDU_C2H_TERM_REQ,
        flags: 0,
        hlen: DATA_HLEN as u8,
        pdo: if data.is_empty() { 0 } else { DATA_HLEN as u8 },
        plen: plen as u32,
    }
    .write(b);
    b[DATA_HLEN..plen].copy_from_slice(data);
    plen
}

// ---- host side: what an NVMe/TCP host needs beyond the target's encoders above: the ICResp
// checked, and its own termination request (a capsule's data pointer is `crate::sgl_descriptor`).

/// The smallest MAXH2CDATA a controller may offer (TCP 3.6.2.2: at least 4096).
pub const MIN_MAXH2CDATA: u32 = 4096;

impl IcResp {
    /// Checks an ICResp as a host reads it (after [`check_header`] with no digests): PDU format
    /// version 0, CPDA at most 31, MAXH2CDATA at least 4096 and a multiple of 4, and digests
    /// only among those the host asked for (`asked`).
    pub fn parse_checked(h: &[u8; IC_LEN], asked: Digests) -> Result<IcResp, PduError> {
        if h[0] != PDU_IC_RESP {
            return Err(bad_field(0, "not an ICResp"));
        }
        if u16_at(h, 8) != PFV {
            return Err(PduError {
                fes: FES_UNSUPPORTED_PARAMETER,
                fei: 8,
                what: "unsupported PDU format version",
            });
        }
        let r = IcResp::parse(h);
        if r.cpda > 31 {
            return Err(bad_field(10, "CPDA above 31"));
        }
        if (r.digests.header && !asked.header) || (r.digests.data && !asked.data) {
            return Err(bad_field(11, "a digest the host did not ask for"));
        }
        if r.maxh2cdata < MIN_MAXH2CDATA || r.maxh2cdata % 4 != 0 {
            return Err(bad_field(12, "MAXH2CDATA below 4096 or not a multiple of 4"));
        }
        Ok(r)
    }
}

/// Writes an H2CTermReq (a host's answer to a fatal transport error, TCP 3.6.2.3): as
/// [`write_c2h_term_req`], of the host's type.
pub fn write_h2c_term_req(
    b: &mut [u8; DATA_HLEN + TERM_REQ_MAX_DATA],
    err: &PduError,
    offending: &[u8],
) -> usize {
    let n = write_c2h_term_req(b, err, offending);
    b[0] = PDU_H2C_TERM_REQ;
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO: Digests = Digests { header: false, data: false };
    const BOTH: Digests = Digests { header: true, data: true };

    fn ch(b: &[u8]) -> CommonHeader {
        CommonHeader::parse(b[..CH_LEN].try_into().unwrap())
    }

    #[test]
    fn crc32c_known_answer() {
        // RFC 3720 B.4: 32 bytes of zeroes.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c_append(crc32c(&[0u8; 16]), &[0u8; 16]), 0x8a91_36aa);
    }

    #[test]
    fn icreq_round_trip_and_checks() {
        let mut b = [0u8; IC_LEN];
        let req = IcReq { pfv: 0, hpda: 3, digests: BOTH, maxr2t: 0 };
        req.write(&mut b);
        let l = check_header(&ch(&b), BOTH, 0, 4096).unwrap();
        assert_eq!((l.header_len, l.data_len), (IC_LEN, 0));
        assert_eq!(IcReq::parse(&b).unwrap(), req);
        b[8] = 1;
        assert_eq!(IcReq::parse(&b).unwrap_err().fes, FES_UNSUPPORTED_PARAMETER);
        b[8] = 0;
        b[10] = 32;
        assert_eq!(IcReq::parse(&b).unwrap_err().fei, 10);
        // An ICReq with a wrong HLEN.
        b[2] = 127;
        assert_eq!(check_header(&ch(&b), NO, 0, 4096).unwrap_err().fei, 2);
    }

    #[test]
    fn capsule_with_data_and_digests() {
        let mut sqe = Sqe([0; SQE_LEN]);
        sqe.0[0] = 0x01;
        sqe.0[2] = 7;
        let mut b = [0u8; HEADER_ROOM];
        let n = write_capsule_cmd(&mut b, &sqe, 512, BOTH, 0);
        assert_eq!(n, CAPSULE_CMD_HLEN + DIGEST_LEN);
        let l = check_header(&ch(&b), BOTH, 0, 8192).unwrap();
        assert_eq!((l.header_len, l.data_offset, l.data_len, l.data_digest), (76, 76, 512, true));
        assert_eq!(l.plen(), 76 + 512 + 4);
        assert!(header_digest_ok(&b[..n], CAPSULE_CMD_HLEN));
        assert_eq!(capsule_sqe(&b).unwrap(), sqe);
        b[9] ^= 1;
        assert!(!header_digest_ok(&b[..n], CAPSULE_CMD_HLEN));
        // Digests negotiated off but flagged on.
        assert_eq!(check_header(&ch(&b), NO, 0, 8192).unwrap_err().fei, 1);
        // Over the size limit.
        assert_eq!(check_header(&ch(&b), BOTH, 0, 512).unwrap_err().fes, FES_DATA_LIMIT_EXCEEDED);
    }

    #[test]
    fn alignment_and_lengths() {
        let sqe = Sqe([0; SQE_LEN]);
        let mut b = [0u8; HEADER_ROOM];
        // CPDA 3: data at a multiple of 16 bytes.
        let n = write_capsule_cmd(&mut b, &sqe, 8, NO, 3);
        assert_eq!(n, 80);
        assert!(check_header(&ch(&b), NO, 3, 4096).is_ok());
        assert!(check_header(&ch(&b), NO, 0, 4096).is_ok());
        // PDO inside the header.
        b[3] = 8;
        assert_eq!(check_header(&ch(&b), NO, 0, 4096).unwrap_err().fei, 3);
        // PDO past PLEN.
        b[3] = 80;
        b[4..8].copy_from_slice(&80u32.to_le_bytes());
        assert_eq!(check_header(&ch(&b), NO, 0, 4096).unwrap_err().fei, 4);
        // PLEN shorter than the header.
        b[4..8].copy_from_slice(&10u32.to_le_bytes());
        assert_eq!(check_header(&ch(&b), NO, 0, 4096).unwrap_err().fei, 4);
        // An R2T (no data) with a longer PLEN.
        let mut r = [0u8; HEADER_ROOM];
        let n = write_r2t(&mut r, &DataHeader { cccid: 1, ttag: 2, offset: 0, length: 4096 }, NO);
        assert_eq!(n, DATA_HLEN);
        r[4] = 30;
        assert!(check_header(&ch(&r), NO, 0, 4096).is_err());
        // Unknown type.
        r[0] = 0x08;
        assert_eq!(check_header(&ch(&r), NO, 0, 4096).unwrap_err().fei, 0);
    }

    #[test]
    fn c2h_data_and_response() {
        let mut b = [0u8; HEADER_ROOM];
        let h = DataHeader { cccid: 9, ttag: 0, offset: 4096, length: 8192 };
        let n = write_c2h_data(&mut b, &h, FLAG_LAST_PDU | FLAG_SUCCESS, BOTH, 7);
        assert_eq!(n, 32);
        let l = check_header(&ch(&b), BOTH, 7, 1 << 20).unwrap();
        assert_eq!((l.data_offset, l.data_len), (32, 8192));
        assert_eq!(DataHeader::parse(&b).unwrap(), h);
        assert_eq!(b[1], FLAG_LAST_PDU | FLAG_SUCCESS | FLAG_HDGSTF | FLAG_DDGSTF);
        let cqe = Cqe { dw0: 5, dw1: 6, sqhd: 1, sqid: 2, cid: 3, status: crate::Status::SUCCESS };
        let n = write_capsule_resp(&mut b, &cqe, NO);
        assert_eq!(n, CAPSULE_RESP_HLEN);
        assert_eq!(Cqe::from_bytes(b[8..24].try_into().unwrap()), cqe);
    }

    #[test]
    fn term_req_echoes_the_header() {
        let mut b = [0u8; DATA_HLEN + TERM_REQ_MAX_DATA];
        let err = bad_field(2, "x");
        let n = write_c2h_term_req(&mut b, &err, &[0xAB; 200]);
        assert_eq!(n, DATA_HLEN + 128);
        let l = check_header(&ch(&b), BOTH, 0, 4096).unwrap();
        assert_eq!(l.data_len, 128);
        assert_eq!(TermReq::parse(&b).unwrap(), TermReq { fes: FES_INVALID_HEADER_FIELD, fei: 2 });
    }

    #[test]
    fn any_header_bytes_never_panic() {
        let mut s = 0x1234_5678u32;
        for _ in 0..20000 {
            let mut b = [0u8; CH_LEN];
            for x in &mut b {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                *x = s as u8;
            }
            b[0] &= 0x0f;
            let c = ch(&b);
            for d in [NO, BOTH] {
                if let Ok(l) = check_header(&c, d, (s % 32) as u8, u32::MAX) {
                    assert!(l.data_offset + l.data_len <= l.plen());
                    assert!(l.header_len <= l.plen());
                }
            }
        }
    }

    #[test]
    fn host_checks_icresp() {
        let mut b = [0u8; IC_LEN];
        IcResp { cpda: 1, digests: BOTH, maxh2cdata: 131072 }.write(&mut b);
        assert_eq!(IcResp::parse_checked(&b, BOTH).unwrap().cpda, 1);
        // A digest not asked for.
        assert_eq!(IcResp::parse_checked(&b, NO).unwrap_err().fei, 11);
        IcResp { cpda: 32, digests: NO, maxh2cdata: 131072 }.write(&mut b);
        assert_eq!(IcResp::parse_checked(&b, NO).unwrap_err().fei, 10);
        IcResp { cpda: 0, digests: NO, maxh2cdata: 4095 }.write(&mut b);
        assert_eq!(IcResp::parse_checked(&b, NO).unwrap_err().fei, 12);
        IcResp { cpda: 0, digests: NO, maxh2cdata: 4096 }.write(&mut b);
        b[8] = 1;
        assert_eq!(IcResp::parse_checked(&b, NO).unwrap_err().fes, FES_UNSUPPORTED_PARAMETER);
        b[0] = PDU_IC_REQ;
        assert_eq!(IcResp::parse_checked(&b, NO).unwrap_err().fei, 0);
        let mut t = [0u8; DATA_HLEN + TERM_REQ_MAX_DATA];
        let n = write_h2c_term_req(&mut t, &bad_field(3, "x"), &[1; 8]);
        assert_eq!((t[0], n), (PDU_H2C_TERM_REQ, DATA_HLEN + 8));
        assert!(check_header(&ch(&t), NO, 0, 4096).is_ok());
        assert_eq!(TermReq::parse(&t).unwrap(), TermReq { fes: FES_INVALID_HEADER_FIELD, fei: 3 });
        let d = crate::sgl_descriptor(crate::SGL_TRANSPORT, 8192);
        let mut sqe = Sqe([0; SQE_LEN]);
        sqe.0[24..40].copy_from_slice(&d);
        assert_eq!((sqe.sgl().type_byte(), sqe.sgl().length(), sqe.sgl().address()), (0x5A, 8192, 0));
    }
}
