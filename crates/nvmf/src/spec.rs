//! What the NVMe specifications fix and every part of the target shares: the 64-byte submission
//! queue entry, the 16-byte completion queue entry, the status field, opcodes and status codes.
//! Section numbers are the NVMe Base Specification 2.0's ("Base") and the NVMe over Fabrics
//! 1.1's ("Fabrics"); the TCP transport's PDUs are in `pdu`.

/// A submission queue entry (Base 4.2, Figure 88): a command as the host sent it, kept as bytes
/// and read through accessors, so a command is never copied field by field and any 64 bytes are
/// a valid value (a hostile capsule is decoded by what it asks, not by whether it parses).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct Sqe(pub [u8; SQE_LEN]);

/// Bytes in a submission queue entry.
pub const SQE_LEN: usize = 64;
/// Bytes in a completion queue entry.
pub const CQE_LEN: usize = 16;

impl Sqe {
    pub fn from_bytes(b: &[u8; SQE_LEN]) -> Sqe {
        Sqe(*b)
    }

    fn u16_at(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.0[at], self.0[at + 1]])
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.0[at..at + 4].try_into().expect("four bytes"))
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().expect("eight bytes"))
    }

    /// Command dword 0, byte 0: the opcode.
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// Command dword 0, bits 15:14: PSDT, how the data pointer is described (2 = SGLs, which
    /// fabrics require, Fabrics 2.1).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    /// Command dword 0, bits 9:8: fused operation.
    pub fn fuse(&self) -> u8 {
        self.0[1] & 0x3
    }

    /// Command identifier, echoed in the completion.
    pub fn cid(&self) -> u16 {
        self.u16_at(2)
    }

    /// Namespace identifier (bytes 4..8). For a fabrics command (opcode
    /// [`OPC_FABRICS`]) byte 4 is the command type instead ([`Sqe::fctype`]).
    pub fn nsid(&self) -> u32 {
        self.u32_at(4)
    }

    /// A fabrics command's type (Fabrics 6, Figure 16).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// The data pointer's SGL descriptor, bytes 24..40 (Base 4.1.2).
    pub fn sgl(&self) -> SglDescriptor {
        SglDescriptor(self.0[24..40].try_into().expect("sixteen bytes"))
    }

    /// Command dword `n` (10..=15), the command-specific dwords.
    pub fn cdw(&self, n: usize) -> u32 {
        assert!((10..=15).contains(&n), "command dword {n} is not command-specific");
        self.u32_at(40 + (n - 10) * 4)
    }

    /// Read, Write, Write Zeroes: the starting LBA (dwords 10 and 11).
    pub fn slba(&self) -> u64 {
        self.u64_at(40)
    }

    /// Read, Write, Write Zeroes: blocks in the command (dword 12 bits 15:0 are zero-based).
    pub fn nlb(&self) -> u32 {
        u32::from(self.u16_at(48)) + 1
    }

    /// Write: Force Unit Access (dword 12 bit 30).
    pub fn fua(&self) -> bool {
        self.cdw(12) & (1 << 30) != 0
    }
}

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("sgl", &self.sgl())
            .finish()
    }
}

/// An SGL descriptor (Base 4.1.2, Figure 114): on NVMe/TCP either in-capsule data (a data block
/// with an offset) or data the host sends or receives in its own PDUs (a transport data block).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SglDescriptor(pub [u8; 16]);

/// SGL descriptor type 0 (data block), subtype 1 (offset): data in the command capsule.
pub const SGL_IN_CAPSULE: u8 = 0x01;
/// SGL descriptor type 5 (transport data block), subtype 0xA (transport specific): data moved
/// by H2CData / C2HData PDUs (NVMe/TCP 3.3.2).
pub const SGL_TRANSPORT: u8 = 0x5A;

impl SglDescriptor {
    /// Bytes 0..8: the address, or for in-capsule data the offset into it.
    pub fn address(&self) -> u64 {
        u64::from_le_bytes(self.0[0..8].try_into().expect("eight bytes"))
    }

    /// Bytes 8..12: the data's length.
    pub fn length(&self) -> u32 {
        u32::from_le_bytes(self.0[8..12].try_into().expect("four bytes"))
    }

    /// Byte 15: descriptor type (bits 7:4) and subtype (bits 3:0).
    pub fn type_byte(&self) -> u8 {
        self.0[15]
    }
}

impl std::fmt::Debug for SglDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sgl({:#04x}, addr {:#x}, len {})", self.type_byte(), self.address(), self.length())
    }
}

/// A completion's status field without its phase bit (Base 4.6.1, Figure 93): status code
/// type, status code, and Do Not Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
}

impl Status {
    /// Success, with Do Not Retry cleared: a host reads any nonzero status field of an admin
    /// command as a failure (Linux's `__nvme_submit_sync_cmd` returns it as the error).
    pub const SUCCESS: Status = Status { sct: SCT_GENERIC, sc: 0x00, dnr: false };

    /// A generic command status (SCT 0) that the host should not retry.
    pub const fn generic(sc: u8) -> Status {
        Status { sct: SCT_GENERIC, sc, dnr: true }
    }

    /// A command-specific status (SCT 1) that the host should not retry.
    pub const fn command_specific(sc: u8) -> Status {
        Status { sct: SCT_COMMAND_SPECIFIC, sc, dnr: true }
    }

    /// A media or data integrity error (SCT 2).
    pub const fn media(sc: u8) -> Status {
        Status { sct: SCT_MEDIA, sc, dnr: false }
    }

    /// The same status with Do Not Retry cleared: the host may try again.
    pub const fn retryable(self) -> Status {
        Status { dnr: false, ..self }
    }

    pub fn is_success(&self) -> bool {
        self.sct == SCT_GENERIC && self.sc == 0
    }

    /// The 15 bits above the phase bit.
    pub fn field(&self) -> u16 {
        (u16::from(self.sc) << 1) | (u16::from(self.sct & 0x7) << 9) | (u16::from(self.dnr) << 15)
    }
}

/// A completion queue entry (Base 4.6, Figure 91), as a response capsule carries it. Fabrics
/// have no phase bit (it is zero) and the SQ head pointer is what the target reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// Dword 0, command specific (Connect: the controller ID in bits 15:0; Get Features: the
    /// value; Property Get: the low 32 bits).
    pub dw0: u32,
    /// Dword 1 (Property Get of an 8-byte property: the high 32 bits).
    pub dw1: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    /// A completion of `cid` with `status` and nothing command-specific.
    pub fn new(cid: u16, status: Status) -> Cqe {
        Cqe { dw0: 0, dw1: 0, sqhd: 0, sqid: 0, cid, status }
    }

    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        b[0..4].copy_from_slice(&self.dw0.to_le_bytes());
        b[4..8].copy_from_slice(&self.dw1.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status.field().to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Cqe {
        let field = u16::from_le_bytes([b[14], b[15]]);
        Cqe {
            dw0: u32::from_le_bytes(b[0..4].try_into().expect("four bytes")),
            dw1: u32::from_le_bytes(b[4..8].try_into().expect("four bytes")),
            sqhd: u16::from_le_bytes([b[8], b[9]]),
            sqid: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            status: Status {
                sc: (field >> 1) as u8,
                sct: ((field >> 9) & 0x7) as u8,
                dnr: field & (1 << 15) != 0,
            },
        }
    }
}

// Status code types (Base 4.6.1.2, Figure 94).
pub const SCT_GENERIC: u8 = 0x0;
pub const SCT_COMMAND_SPECIFIC: u8 = 0x1;
pub const SCT_MEDIA: u8 = 0x2;
pub const SCT_PATH: u8 = 0x3;

// Generic command status (Base 4.6.1.2.1, Figure 95).
pub const SC_INVALID_OPCODE: u8 = 0x01;
pub const SC_INVALID_FIELD: u8 = 0x02;
pub const SC_DATA_TRANSFER_ERROR: u8 = 0x04;
pub const SC_INTERNAL_ERROR: u8 = 0x06;
pub const SC_ABORT_REQUESTED: u8 = 0x07;
pub const SC_ABORTED_SQ_DELETION: u8 = 0x08;
pub const SC_INVALID_NAMESPACE: u8 = 0x0B;
pub const SC_COMMAND_SEQUENCE_ERROR: u8 = 0x0C;
pub const SC_SGL_DATA_LENGTH_INVALID: u8 = 0x0F;
pub const SC_SGL_DESCRIPTOR_TYPE_INVALID: u8 = 0x11;
pub const SC_SGL_OFFSET_INVALID: u8 = 0x16;
pub const SC_NAMESPACE_WRITE_PROTECTED: u8 = 0x20;
pub const SC_COMMAND_INTERRUPTED: u8 = 0x21;
pub const SC_TRANSIENT_TRANSPORT_ERROR: u8 = 0x22;
// Generic command status, NVM command set (Base 4.6.1.2.1, Figure 96).
pub const SC_LBA_OUT_OF_RANGE: u8 = 0x80;
pub const SC_CAPACITY_EXCEEDED: u8 = 0x81;
pub const SC_NAMESPACE_NOT_READY: u8 = 0x82;

// Command specific status (Base 4.6.1.2.2, Figure 97; Fabrics 3.4 Figure 8 for Connect).
pub const SC_INVALID_QUEUE_IDENTIFIER: u8 = 0x01;
pub const SC_INVALID_QUEUE_SIZE: u8 = 0x02;
pub const SC_ASYNC_EVENT_LIMIT_EXCEEDED: u8 = 0x05;
pub const SC_INVALID_LOG_PAGE: u8 = 0x09;
pub const SC_FEATURE_NOT_SAVEABLE: u8 = 0x0D;
pub const SC_FEATURE_NOT_CHANGEABLE: u8 = 0x0E;
pub const SC_CONNECT_INCOMPATIBLE_FORMAT: u8 = 0x80;
pub const SC_CONNECT_CONTROLLER_BUSY: u8 = 0x81;
pub const SC_CONNECT_INVALID_PARAMETERS: u8 = 0x82;
pub const SC_CONNECT_RESTART_DISCOVERY: u8 = 0x83;
pub const SC_CONNECT_INVALID_HOST: u8 = 0x84;

// Media and data integrity errors (Base 4.6.1.2.3, Figure 100).
pub const SC_WRITE_FAULT: u8 = 0x80;
pub const SC_UNRECOVERED_READ_ERROR: u8 = 0x81;
pub const SC_ACCESS_DENIED: u8 = 0x86;

// Admin command opcodes (Base 5, Figure 138).
pub const ADMIN_GET_LOG_PAGE: u8 = 0x02;
pub const ADMIN_IDENTIFY: u8 = 0x06;
pub const ADMIN_ABORT: u8 = 0x08;
pub const ADMIN_SET_FEATURES: u8 = 0x09;
pub const ADMIN_GET_FEATURES: u8 = 0x0A;
pub const ADMIN_ASYNC_EVENT_REQUEST: u8 = 0x0C;
pub const ADMIN_KEEP_ALIVE: u8 = 0x18;

/// The fabrics command opcode (Fabrics 6.1); [`Sqe::fctype`] says which one.
pub const OPC_FABRICS: u8 = 0x7F;
// Fabrics command types (Fabrics 6, Figure 16).
pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
pub const FCTYPE_CONNECT: u8 = 0x01;
pub const FCTYPE_PROPERTY_GET: u8 = 0x04;
pub const FCTYPE_AUTHENTICATION_SEND: u8 = 0x05;
pub const FCTYPE_AUTHENTICATION_RECEIVE: u8 = 0x06;
pub const FCTYPE_DISCONNECT: u8 = 0x08;

// NVM command set I/O opcodes (NVM Command Set Specification 3, Figure 18).
pub const NVM_FLUSH: u8 = 0x00;
pub const NVM_WRITE: u8 = 0x01;
pub const NVM_READ: u8 = 0x02;
pub const NVM_WRITE_ZEROES: u8 = 0x08;
pub const NVM_DATASET_MANAGEMENT: u8 = 0x09;

/// Bytes of the Connect command's data (Fabrics 3.3, Figure 20): host identifier, controller
/// ID, subsystem NQN and host NQN.
pub const CONNECT_DATA_LEN: usize = 1024;
/// An NQN is at most 223 bytes (Base 4.5).
pub const NQN_MAX_LEN: usize = 223;
/// The well-known discovery subsystem's NQN (Base 4.5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
