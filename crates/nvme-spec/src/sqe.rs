//! The 64-byte submission queue entry (Base 4.2) and its data pointer's SGL descriptor (Base
//! 4.1.2): read through accessors by whoever executes a command, written through setters by
//! whoever builds one.

/// A submission queue entry (Base 4.2, Figure 88): a command as the host sent it, kept as bytes
/// and read through accessors, so a command is never copied field by field and any 64 bytes are
/// a valid value (a hostile capsule is decoded by what it asks, not by whether it parses).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct Sqe(pub [u8; SQE_LEN]);

/// Bytes in a submission queue entry.
pub const SQE_LEN: usize = 64;

impl Sqe {
    /// The command in `b`.
    #[inline]
    pub fn from_bytes(b: &[u8; SQE_LEN]) -> Sqe {
        Sqe(*b)
    }

    #[inline]
    fn u16_at(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.0[at], self.0[at + 1]])
    }

    #[inline]
    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.0[at..at + 4].try_into().expect("four bytes"))
    }

    #[inline]
    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().expect("eight bytes"))
    }

    /// Command dword 0, byte 0: the opcode.
    #[inline]
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// Command dword 0, bits 15:14: PSDT, how the data pointer is described (2 = SGLs, which
    /// fabrics require, Fabrics 2.1).
    #[inline]
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    /// Command dword 0, bits 9:8: fused operation.
    #[inline]
    pub fn fuse(&self) -> u8 {
        self.0[1] & 0x3
    }

    /// Command identifier, echoed in the completion.
    #[inline]
    pub fn cid(&self) -> u16 {
        self.u16_at(2)
    }

    /// Namespace identifier (bytes 4..8). For a fabrics command (opcode
    /// [`OPC_FABRICS`](crate::OPC_FABRICS)) byte 4 is the command type instead ([`Sqe::fctype`]).
    #[inline]
    pub fn nsid(&self) -> u32 {
        self.u32_at(4)
    }

    /// A fabrics command's type (Fabrics 6, Figure 16).
    #[inline]
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// The data pointer's SGL descriptor, bytes 24..40 (Base 4.1.2).
    #[inline]
    pub fn sgl(&self) -> SglDescriptor {
        SglDescriptor(self.0[24..40].try_into().expect("sixteen bytes"))
    }

    /// Command dword `n` (10..=15), the command-specific dwords.
    #[inline]
    pub fn cdw(&self, n: usize) -> u32 {
        assert!((10..=15).contains(&n), "command dword {n} is not command-specific");
        self.u32_at(40 + (n - 10) * 4)
    }

    /// Read, Write, Write Zeroes: the starting LBA (dwords 10 and 11).
    #[inline]
    pub fn slba(&self) -> u64 {
        self.u64_at(40)
    }

    /// Read, Write, Write Zeroes: blocks in the command (dword 12 bits 15:0 are zero-based).
    #[inline]
    pub fn nlb(&self) -> u32 {
        u32::from(self.u16_at(48)) + 1
    }

    /// Write: Force Unit Access (dword 12 bit 30).
    #[inline]
    pub fn fua(&self) -> bool {
        self.cdw(12) & (1 << 30) != 0
    }

    /// A command with `opcode` and everything else zero.
    #[inline]
    pub fn command(opcode: u8) -> Sqe {
        let mut s = Sqe([0; SQE_LEN]);
        s.0[0] = opcode;
        s
    }

    /// Sets the command ID (dword 0, bits 31:16).
    #[inline]
    pub fn set_cid(&mut self, cid: u16) {
        self.0[2..4].copy_from_slice(&cid.to_le_bytes());
    }

    /// Sets PSDT (dword 0, bits 15:14): 0 for PRPs, 1 for SGLs (PCIe), 2 on fabrics.
    #[inline]
    pub fn set_psdt(&mut self, psdt: u8) {
        self.0[1] = (self.0[1] & 0x3f) | (psdt << 6);
    }

    /// Sets the namespace ID.
    #[inline]
    pub fn set_nsid(&mut self, nsid: u32) {
        self.0[4..8].copy_from_slice(&nsid.to_le_bytes());
    }

    /// Sets command dword `n` (10..=15).
    #[inline]
    pub fn set_cdw(&mut self, n: usize, value: u32) {
        assert!((10..=15).contains(&n), "command dword {n} is not command-specific");
        let at = 40 + (n - 10) * 4;
        self.0[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// Sets the data pointer as PRP entries 1 and 2 (Base 4.1.1).
    #[inline]
    pub fn set_prp(&mut self, prp1: u64, prp2: u64) {
        self.0[24..32].copy_from_slice(&prp1.to_le_bytes());
        self.0[32..40].copy_from_slice(&prp2.to_le_bytes());
    }

    /// Sets the data pointer's 16 bytes as an SGL descriptor (Base 4.1.2).
    #[inline]
    pub fn set_sgl(&mut self, descriptor: [u8; 16]) {
        self.0[24..40].copy_from_slice(&descriptor);
    }
}

impl std::fmt::Debug for Sqe {
    #[inline]
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
    #[inline]
    pub fn address(&self) -> u64 {
        u64::from_le_bytes(self.0[0..8].try_into().expect("eight bytes"))
    }

    /// Bytes 8..12: the data's length.
    #[inline]
    pub fn length(&self) -> u32 {
        u32::from_le_bytes(self.0[8..12].try_into().expect("four bytes"))
    }

    /// Byte 15: descriptor type (bits 7:4) and subtype (bits 3:0).
    #[inline]
    pub fn type_byte(&self) -> u8 {
        self.0[15]
    }
}

impl std::fmt::Debug for SglDescriptor {
    #[inline]
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sgl({:#04x}, addr {:#x}, len {})", self.type_byte(), self.address(), self.length())
    }
}

/// An SGL descriptor of type `kind` ([`SGL_IN_CAPSULE`] at offset 0 into the capsule's data, or
/// [`SGL_TRANSPORT`]: data in the transport's own PDUs, NVMe/TCP 3.3.2) for `len` bytes.
#[inline]
pub fn sgl_descriptor(kind: u8, len: u32) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[15] = kind;
    d
}
