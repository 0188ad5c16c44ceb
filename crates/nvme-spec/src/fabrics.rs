//! The fabrics commands (Fabrics 3 and 6): Connect, its command fields (Figure 19) and its 1024
//! bytes of data (Figure 20), decoded and checked, and the completion a refused Connect gets
//! (Figure 21: IATTR and IPO name the offending field); Property Get and Property Set; the
//! NVMe Qualified Names both sides check. Pure.

use crate::cqe::Cqe;
use crate::opcode::*;
use crate::sqe::*;
use crate::status::*;

/// Bytes of the Connect command's data (Fabrics 3.3, Figure 20): host identifier, controller
/// ID, subsystem NQN and host NQN.
pub const CONNECT_DATA_LEN: usize = 1024;
/// An NQN is at most 223 bytes (Base 4.5).
pub const NQN_MAX_LEN: usize = 223;
/// The well-known discovery subsystem's NQN (Base 4.5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

// Offsets into the Connect data (Fabrics Figure 20).
/// Host Identifier, 16 bytes.
pub const DATA_HOSTID: usize = 0;
/// Controller ID, 2 bytes.
pub const DATA_CNTLID: usize = 16;
/// Subsystem NQN, 256 bytes, NUL-terminated.
pub const DATA_SUBNQN: usize = 256;
/// Host NQN, 256 bytes, NUL-terminated.
pub const DATA_HOSTNQN: usize = 512;
// Offsets into the Connect command (Fabrics Figure 19).
/// Record Format, 2 bytes.
pub const CMD_RECFMT: usize = 40;
/// Queue ID, 2 bytes.
pub const CMD_QID: usize = 42;
/// Submission Queue Size, zero-based, 2 bytes.
pub const CMD_SQSIZE: usize = 44;
/// Connect Attributes.
pub const CMD_CATTR: usize = 46;
/// Keep Alive Timeout in milliseconds, 4 bytes.
pub const CMD_KATO: usize = 48;

/// The dynamic controller ID: "allocate one for me" (Fabrics 3.3).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// A decoded Connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// The command's identifier.
    pub cid: u16,
    /// 0: the admin queue (a new controller); otherwise an I/O queue of `cntlid`.
    pub qid: u16,
    /// Entries in the submission queue (SQSIZE is zero-based; this is one more).
    pub sq_entries: u32,
    /// Connect Attributes.
    pub cattr: u8,
    /// Keep-alive timeout in milliseconds (admin queue only); 0 = none.
    pub kato_ms: u32,
    /// The host's 128-bit identifier.
    pub hostid: [u8; 16],
    /// The controller an I/O queue joins; [`CNTLID_DYNAMIC`] on the admin queue.
    pub cntlid: u16,
    /// The subsystem the host connects to.
    pub subnqn: String,
    /// The host's NQN (may be empty: SPDK's host sends none unless told one).
    pub hostnqn: String,
}

/// Why a Connect is refused: the completion to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectRefusal {
    /// The completion's status.
    pub status: Status,
    /// IATTR and IPO (dword 0) for Connect Invalid Parameters.
    pub dw0: u32,
    /// What was wrong, for the log.
    pub why: &'static str,
}

impl ConnectRefusal {
    /// Connect Invalid Parameters pointing at byte `offset` of the data (`in_data`) or of the
    /// command.
    pub fn invalid_parameter(in_data: bool, offset: usize, why: &'static str) -> ConnectRefusal {
        ConnectRefusal {
            status: Status::command_specific(SC_CONNECT_INVALID_PARAMETERS),
            dw0: (offset as u32 & 0xFFFF) | (u32::from(in_data) << 16),
            why,
        }
    }

    /// A refusal with `status` alone.
    pub fn status(status: Status, why: &'static str) -> ConnectRefusal {
        ConnectRefusal { status, dw0: 0, why }
    }

    /// The completion of Connect `cid` that says so.
    pub fn cqe(&self, cid: u16) -> Cqe {
        Cqe { dw0: self.dw0, ..Cqe::new(cid, self.status) }
    }
}

/// Reads a NUL-terminated NQN out of its 256-byte field: at most 223 bytes, UTF-8, empty only
/// if `may_be_empty`.
fn nqn(field: &[u8], may_be_empty: bool) -> Option<String> {
    let len = field.iter().position(|&b| b == 0)?;
    if (len == 0 && !may_be_empty) || len > NQN_MAX_LEN {
        return None;
    }
    std::str::from_utf8(&field[..len]).ok().map(str::to_owned)
}

impl Connect {
    /// Decodes a Connect from its command and its data (the capsule's in-capsule data).
    pub fn parse(sqe: &Sqe, data: &[u8]) -> Result<Connect, ConnectRefusal> {
        let b = &sqe.0;
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        if sqe.opcode() != OPC_FABRICS || sqe.fctype() != FCTYPE_CONNECT {
            return Err(ConnectRefusal::status(
                Status::generic(SC_COMMAND_SEQUENCE_ERROR),
                "the first command on a queue must be a Connect",
            ));
        }
        if u16_at(CMD_RECFMT) != 0 {
            return Err(ConnectRefusal::status(
                Status::command_specific(SC_CONNECT_INCOMPATIBLE_FORMAT),
                "record format other than 0",
            ));
        }
        let sgl = sqe.sgl();
        if data.len() != CONNECT_DATA_LEN || sgl.length() as usize != CONNECT_DATA_LEN {
            return Err(ConnectRefusal::status(
                Status::generic(SC_SGL_DATA_LENGTH_INVALID),
                "Connect data is not 1024 bytes in the capsule",
            ));
        }
        let sqsize = u16_at(CMD_SQSIZE);
        if sqsize == 0 {
            return Err(ConnectRefusal::invalid_parameter(false, CMD_SQSIZE, "SQSIZE of 0 (one entry)"));
        }
        let subnqn = nqn(&data[DATA_SUBNQN..DATA_SUBNQN + 256], false)
            .ok_or(ConnectRefusal::invalid_parameter(true, DATA_SUBNQN, "SUBNQN is not a valid NQN"))?;
        // SPDK's host sends an empty HOSTNQN unless told one (and SPDK's target takes it): such
        // a host reaches only subsystems that allow any host.
        let hostnqn = nqn(&data[DATA_HOSTNQN..DATA_HOSTNQN + 256], true)
            .ok_or(ConnectRefusal::invalid_parameter(true, DATA_HOSTNQN, "HOSTNQN is not a valid NQN"))?;
        Ok(Connect {
            cid: sqe.cid(),
            qid: u16_at(CMD_QID),
            sq_entries: u32::from(sqsize) + 1,
            cattr: b[CMD_CATTR],
            kato_ms: sqe.cdw(12),
            hostid: data[DATA_HOSTID..DATA_HOSTID + 16].try_into().expect("sixteen bytes"),
            cntlid: u16::from_le_bytes([data[DATA_CNTLID], data[DATA_CNTLID + 1]]),
            subnqn,
            hostnqn,
        })
    }

    /// Encodes a Connect (a host's: the tests' and the fuzzers'), its command and data.
    pub fn write(&self, sqe: &mut Sqe, data: &mut [u8; CONNECT_DATA_LEN]) {
        sqe.0.fill(0);
        sqe.0[0] = OPC_FABRICS;
        sqe.0[1] = 0x40; // PSDT: SGL
        sqe.0[2..4].copy_from_slice(&self.cid.to_le_bytes());
        sqe.0[4] = FCTYPE_CONNECT;
        // In-capsule data: offset 0, 1024 bytes.
        sqe.0[32..36].copy_from_slice(&(CONNECT_DATA_LEN as u32).to_le_bytes());
        sqe.0[39] = SGL_IN_CAPSULE;
        sqe.0[CMD_QID..CMD_QID + 2].copy_from_slice(&self.qid.to_le_bytes());
        let sqsize = (self.sq_entries.saturating_sub(1)).min(0xFFFF) as u16;
        sqe.0[CMD_SQSIZE..CMD_SQSIZE + 2].copy_from_slice(&sqsize.to_le_bytes());
        sqe.0[CMD_CATTR] = self.cattr;
        sqe.0[CMD_KATO..CMD_KATO + 4].copy_from_slice(&self.kato_ms.to_le_bytes());
        data.fill(0);
        data[DATA_HOSTID..DATA_HOSTID + 16].copy_from_slice(&self.hostid);
        data[DATA_CNTLID..DATA_CNTLID + 2].copy_from_slice(&self.cntlid.to_le_bytes());
        let put = |d: &mut [u8], s: &str| {
            let n = s.len().min(255);
            d[..n].copy_from_slice(&s.as_bytes()[..n]);
        };
        put(&mut data[DATA_SUBNQN..DATA_SUBNQN + 256], &self.subnqn);
        put(&mut data[DATA_HOSTNQN..DATA_HOSTNQN + 256], &self.hostnqn);
    }
}

// ---- Property Get and Property Set (Fabrics 3.5 and 3.6), the other fabrics commands a host
// sends on its admin queue: the controller's properties are the registers of
// `crate::registers`.

// Property Get / Set fields (Fabrics 6.5.1 Figure 41, 6.5.2 Figure 43).
const ATTRIB_AT: usize = 40;
const OFST_AT: usize = 44;
const VALUE_AT: usize = 48;

/// A Property Get or Set command's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyAccess {
    /// ATTRIB bits 2:0 = 1: an 8-byte property, else 4 bytes.
    pub eight_bytes: bool,
    /// The property's offset ([`crate::registers`]).
    pub offset: u32,
    /// Property Set's value (the low 4 bytes for a 4-byte property).
    pub value: u64,
}

impl PropertyAccess {
    /// Decodes a Property Get or Set.
    pub fn from_sqe(sqe: &Sqe) -> PropertyAccess {
        let b = &sqe.0;
        PropertyAccess {
            eight_bytes: b[ATTRIB_AT] & 0x7 == 1,
            offset: u32::from_le_bytes(b[OFST_AT..OFST_AT + 4].try_into().expect("four bytes")),
            value: u64::from_le_bytes(b[VALUE_AT..VALUE_AT + 8].try_into().expect("eight bytes")),
        }
    }
}

/// Property Get (Fabrics 3.6, Figure 27) of the property at `offset`, 8 bytes if `eight`.
/// The completion carries the value in dwords 0 and 1.
pub fn property_get(offset: u32, eight: bool) -> Sqe {
    let mut s = Sqe([0; SQE_LEN]);
    s.0[0] = OPC_FABRICS;
    s.0[1] = 0x40; // PSDT: SGL
    s.0[4] = FCTYPE_PROPERTY_GET;
    s.0[ATTRIB_AT] = u8::from(eight); // ATTRIB: size
    s.0[OFST_AT..OFST_AT + 4].copy_from_slice(&offset.to_le_bytes());
    s
}

/// Property Set (Fabrics 3.5, Figure 25) of `value` into the property at `offset`.
pub fn property_set(offset: u32, value: u64, eight: bool) -> Sqe {
    let mut s = property_get(offset, eight);
    s.0[4] = FCTYPE_PROPERTY_SET;
    s.0[VALUE_AT..VALUE_AT + 8].copy_from_slice(&value.to_le_bytes());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Connect {
        Connect {
            cid: 3,
            qid: 2,
            sq_entries: 128,
            cattr: 0,
            kato_ms: 0,
            hostid: [7; 16],
            cntlid: 5,
            subnqn: "nqn.2016-06.io.spdk:cnode1".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        }
    }

    fn encode(c: &Connect) -> (Sqe, [u8; CONNECT_DATA_LEN]) {
        let mut sqe = Sqe([0; SQE_LEN]);
        let mut data = [0u8; CONNECT_DATA_LEN];
        c.write(&mut sqe, &mut data);
        (sqe, data)
    }

    #[test]
    fn round_trip() {
        let c = Connect { kato_ms: 15000, qid: 0, cntlid: CNTLID_DYNAMIC, ..sample() };
        let (sqe, data) = encode(&c);
        assert_eq!(sqe.sgl().type_byte(), SGL_IN_CAPSULE);
        assert_eq!(Connect::parse(&sqe, &data).unwrap(), c);
    }

    #[test]
    fn refusals_name_the_field() {
        let (mut sqe, mut data) = encode(&sample());
        // An NQN without its terminating NUL.
        data[DATA_SUBNQN..DATA_SUBNQN + 256].fill(b'a');
        let r = Connect::parse(&sqe, &data).unwrap_err();
        assert_eq!(r.status, Status::command_specific(SC_CONNECT_INVALID_PARAMETERS));
        assert_eq!(r.cqe(3).dw0, 0x1_0100);
        // Too long (224 bytes) and not UTF-8.
        data[DATA_SUBNQN + 224] = 0;
        assert!(Connect::parse(&sqe, &data).is_err());
        let (_, good) = encode(&sample());
        data = good;
        data[DATA_HOSTNQN] = 0xFF;
        assert_eq!(Connect::parse(&sqe, &data).unwrap_err().dw0, 0x1_0200);
        // An empty HOSTNQN is taken (SPDK's host sends one), an empty SUBNQN is not.
        data[DATA_HOSTNQN] = 0;
        assert_eq!(Connect::parse(&sqe, &data).unwrap().hostnqn, "");
        data[DATA_SUBNQN] = 0;
        assert_eq!(Connect::parse(&sqe, &data).unwrap_err().dw0, 0x1_0100);
        data = good;
        // Short data, wrong RECFMT, SQSIZE 0, not a Connect.
        assert_eq!(Connect::parse(&sqe, &data[..512]).unwrap_err().status.sc, SC_SGL_DATA_LENGTH_INVALID);
        sqe.0[CMD_RECFMT] = 1;
        assert_eq!(Connect::parse(&sqe, &data).unwrap_err().status.sc, SC_CONNECT_INCOMPATIBLE_FORMAT);
        sqe.0[CMD_RECFMT] = 0;
        sqe.0[CMD_SQSIZE] = 0;
        sqe.0[CMD_SQSIZE + 1] = 0;
        assert_eq!(Connect::parse(&sqe, &data).unwrap_err().dw0, CMD_SQSIZE as u32);
        sqe.0[4] = FCTYPE_PROPERTY_GET;
        assert_eq!(Connect::parse(&sqe, &data).unwrap_err().status.sc, SC_COMMAND_SEQUENCE_ERROR);
    }

    #[test]
    fn host_property_commands_read_back() {
        let s = property_set(0x14, 0x46_0001, false);
        assert_eq!((s.opcode(), s.fctype()), (OPC_FABRICS, FCTYPE_PROPERTY_SET));
        let a = PropertyAccess::from_sqe(&s);
        assert_eq!((a.eight_bytes, a.offset, a.value), (false, 0x14, 0x46_0001));
        let g = property_get(0, true);
        assert_eq!(g.fctype(), FCTYPE_PROPERTY_GET);
        assert!(PropertyAccess::from_sqe(&g).eight_bytes);
    }
}
