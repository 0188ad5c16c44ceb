//! Get Log Page (Base 5.16): the log identifiers, the command's fields and the layouts of the
//! pages both sides read or write, the Discovery log page (Fabrics 5.3) among them.

use crate::sqe::Sqe;

// Log page identifiers (Base 5.16, Figure 202; Fabrics 5.3).
/// Error Information.
pub const LID_ERROR: u8 = 0x01;
/// SMART / Health Information.
pub const LID_SMART: u8 = 0x02;
/// Firmware Slot Information.
pub const LID_FIRMWARE_SLOT: u8 = 0x03;
/// Changed Namespace List.
pub const LID_CHANGED_NS: u8 = 0x04;
/// Discovery (Fabrics 5.3).
pub const LID_DISCOVERY: u8 = 0x70;

/// Bytes of one Error Information log entry (Base 5.16.1.2, Figure 205).
pub const ERROR_ENTRY_LEN: usize = 64;
/// Bytes of the SMART / Health Information log page (Base 5.16.1.3, Figure 207).
pub const SMART_LEN: usize = 512;
// SMART / Health Information fields (Base 5.16.1.3, Figure 207).
/// Available Spare, a percentage.
pub const SMART_AVAILABLE_SPARE: usize = 3;
/// Available Spare Threshold, a percentage.
pub const SMART_SPARE_THRESHOLD: usize = 4;
/// Bytes of the Firmware Slot Information log page (Base 5.16.1.4, Figure 210).
pub const FIRMWARE_SLOT_LEN: usize = 512;
/// Firmware Slot Information: AFI, the active slot in bits 2:0.
pub const FW_AFI: usize = 0;
/// Firmware Slot Information: FRS1, slot 1's revision (8 bytes).
pub const FW_FRS1: usize = 8;
/// Bytes of the Changed Namespace List log page: 1024 NSIDs (Base 5.16.1.5, Figure 211).
pub const CHANGED_NS_LEN: usize = 4096;
/// More than 1024 namespaces changed: the list's first entry is FFFFFFFFh, the rest zero.
pub const CHANGED_NS_OVERFLOW: u32 = 0xFFFF_FFFF;

// Discovery log page header (Fabrics 5.3, Figure 37) and entry (Figure 38).
/// Generation Counter, 8 bytes.
pub const DISC_GENCTR: usize = 0;
/// Number of Records, 8 bytes.
pub const DISC_NUMREC: usize = 8;
/// Record Format, 2 bytes.
pub const DISC_RECFMT: usize = 16;
/// Bytes of the header; entries follow it.
pub const DISC_HEADER_LEN: usize = 1024;
/// Bytes of one entry.
pub const DISC_ENTRY_LEN: usize = 1024;
/// Entry: Transport Type.
pub const DE_TRTYPE: usize = 0;
/// Entry: Address Family.
pub const DE_ADRFAM: usize = 1;
/// Entry: Subsystem Type.
pub const DE_SUBTYPE: usize = 2;
/// Entry: Transport Requirements.
pub const DE_TREQ: usize = 3;
/// Entry: Port ID, 2 bytes.
pub const DE_PORTID: usize = 4;
/// Entry: Controller ID, 2 bytes.
pub const DE_CNTLID: usize = 6;
/// Entry: Admin Max SQ Size, 2 bytes.
pub const DE_ASQSZ: usize = 8;
/// Entry: Transport Service Identifier, [`TRSVCID_LEN`] ASCII bytes.
pub const DE_TRSVCID: usize = 32;
/// Entry: NVM Subsystem Qualified Name, [`SUBNQN_LEN`] bytes, NUL-terminated.
pub const DE_SUBNQN: usize = 256;
/// Entry: Transport Address, [`TRADDR_LEN`] ASCII bytes.
pub const DE_TRADDR: usize = 512;
/// Entry: Transport Specific Address Subtype, 256 bytes.
pub const DE_TSAS: usize = 768;
/// Width of TRSVCID.
pub const TRSVCID_LEN: usize = 32;
/// Width of SUBNQN.
pub const SUBNQN_LEN: usize = 256;
/// Width of TRADDR.
pub const TRADDR_LEN: usize = 256;
/// TRTYPE 3: TCP (Fabrics 5.3 Figure 38; TCP 8.1).
pub const TRTYPE_TCP: u8 = 3;
/// ADRFAM 1: IPv4.
pub const ADRFAM_IPV4: u8 = 1;
/// ADRFAM 2: IPv6.
pub const ADRFAM_IPV6: u8 = 2;
/// SUBTYPE 1: a referral to another discovery service.
pub const SUBTYPE_REFERRAL: u8 = 1;
/// SUBTYPE 2: an NVM subsystem.
pub const SUBTYPE_NVME: u8 = 2;
/// SUBTYPE 3: the current discovery subsystem.
pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
/// TREQ bits 1:0 = 10b: a secure channel is not required.
pub const TREQ_SECURE_CHANNEL_NOT_REQUIRED: u8 = 0b10;
/// TSAS for TCP, byte 0: SECTYPE 0, no security (TCP 8.1.2).
pub const TSAS_SECTYPE_NONE: u8 = 0;

/// A Get Log Page command's fields (Base 5.16, Figures 197-200).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRequest {
    /// Log Page Identifier.
    pub lid: u8,
    /// Log Specific Field (dword 10 bits 14:8).
    pub lsp: u8,
    /// Retain Asynchronous Event (dword 10 bit 15): a read with RAE cleared re-arms the
    /// page's event.
    pub rae: bool,
    /// Dwords to return (NUMDU:NUMDL is zero-based; this is one-based).
    pub numd: u64,
    /// Byte offset into the page (LPOU:LPOL).
    pub offset: u64,
}

impl LogRequest {
    /// Decodes a Get Log Page's dwords 10 to 13.
    pub fn from_sqe(sqe: &Sqe) -> LogRequest {
        let cdw10 = sqe.cdw(10);
        let numdl = u64::from(cdw10 >> 16);
        let numdu = u64::from(sqe.cdw(11) & 0xFFFF);
        LogRequest {
            lid: cdw10 as u8,
            lsp: ((cdw10 >> 8) & 0x7F) as u8,
            rae: cdw10 & (1 << 15) != 0,
            numd: ((numdu << 16) | numdl) + 1,
            offset: (u64::from(sqe.cdw(13)) << 32) | u64::from(sqe.cdw(12)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_fields_from_dwords_10_to_13() {
        let mut sqe = Sqe([0; 64]);
        // LID 70h, RAE, NUMDL 0x00FF; NUMDU 1; LPOL 0x400; LPOU 1.
        sqe.0[40..44].copy_from_slice(&(0x70 | (1 << 15) | (0x00FF << 16) as u32).to_le_bytes());
        sqe.0[44..48].copy_from_slice(&1u32.to_le_bytes());
        sqe.0[48..52].copy_from_slice(&0x400u32.to_le_bytes());
        sqe.0[52..56].copy_from_slice(&1u32.to_le_bytes());
        let r = LogRequest::from_sqe(&sqe);
        assert_eq!(r, LogRequest { lid: 0x70, lsp: 0, rae: true, numd: 0x1_0100, offset: (1 << 32) | 0x400 });
    }
}
