//! The 16-byte completion queue entry (Base 4.6), decoded: one type for a PCIe completion ring
//! and an NVMe/TCP response capsule.

use crate::status::Status;

/// Bytes in a completion queue entry.
pub const CQE_LEN: usize = 16;

/// A completion queue entry (Base 4.6, Figure 91), decoded from its four dwords. Fabrics have
/// no phase bit (it is zero) and the SQ head pointer is what the target reports; a PCIe ring
/// reads the phase tag itself before it decodes the rest ([`Cqe::from_dwords`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// Dword 0, command specific (Connect: the controller ID in bits 15:0; Get Features: the
    /// value; Property Get: the low 32 bits).
    pub dw0: u32,
    /// Dword 1 (Property Get of an 8-byte property: the high 32 bits).
    pub dw1: u32,
    /// SQ Head Pointer: how far the controller has fetched the submission queue.
    pub sqhd: u16,
    /// SQ Identifier.
    pub sqid: u16,
    /// Command Identifier of the command completed.
    pub cid: u16,
    /// Status without the phase tag.
    pub status: Status,
}

impl Cqe {
    /// A completion of `cid` with `status` and nothing command-specific.
    #[inline]
    pub fn new(cid: u16, status: Status) -> Cqe {
        Cqe { dw0: 0, dw1: 0, sqhd: 0, sqid: 0, cid, status }
    }

    /// The entry's 16 bytes, phase tag zero.
    #[inline]
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

    /// Decodes an entry's 16 bytes (the phase tag is dropped).
    #[inline]
    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Cqe {
        let dw = |i: usize| u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().expect("four bytes"));
        Cqe::from_dwords(dw(0), dw(1), dw(2), dw(3))
    }

    /// Decodes an entry from its dwords in host order (the phase tag, dword 3 bit 16, is
    /// dropped): what a PCIe completion ring reads with one volatile load per dword.
    #[inline]
    pub fn from_dwords(dw0: u32, dw1: u32, dw2: u32, dw3: u32) -> Cqe {
        Cqe {
            dw0,
            dw1,
            sqhd: dw2 as u16,
            sqid: (dw2 >> 16) as u16,
            cid: dw3 as u16,
            status: Status::from_field((dw3 >> 16) as u16),
        }
    }
}
