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
/// Asymmetric Namespace Access (Base 5.16.1.12).
pub const LID_ANA: u8 = 0x0C;
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

// Asymmetric Namespace Access log page (Base 5.16.1.12, Figures 229 and 230).
/// Get Log Page LSP bit 0 for the ANA page: RGO, Return Groups Only (no NSID lists).
pub const ANA_LSP_RGO: u8 = 1 << 0;
/// Bytes of the ANA log page header: Change Count (8), Number of ANA Group Descriptors (2),
/// reserved (6).
pub const ANA_HEADER_LEN: usize = 16;
/// Header: Change Count, 8 bytes.
pub const ANA_CHGCNT: usize = 0;
/// Header: Number of ANA Group Descriptors, 2 bytes.
pub const ANA_NGRPS: usize = 8;
/// Bytes of a group descriptor before its NSID list.
pub const ANA_DESC_LEN: usize = 32;
/// Descriptor: ANA Group ID, 4 bytes.
pub const ANAD_GRPID: usize = 0;
/// Descriptor: Number of NSID Values, 4 bytes.
pub const ANAD_NNSIDS: usize = 4;
/// Descriptor: Change Count, 8 bytes.
pub const ANAD_CHGCNT: usize = 8;
/// Descriptor: ANA State, bits 3:0.
pub const ANAD_STATE: usize = 16;

/// An ANA group's state as one controller sees it (Base 8.1.3; the codes of Figure 230).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum AnaState {
    /// ANA Optimized: I/O goes here first.
    Optimized = 0x1,
    /// ANA Non-Optimized: works, at a cost.
    NonOptimized = 0x2,
    /// ANA Inaccessible: I/O fails with Asymmetric Access Inaccessible, for now.
    Inaccessible = 0x3,
    /// ANA Persistent Loss: I/O fails with Asymmetric Access Persistent Loss, for good.
    PersistentLoss = 0x4,
    /// ANA Change: in transition (at most ANATT); I/O fails with Asymmetric Access Transition.
    Change = 0xF,
}

impl AnaState {
    /// The state of code `code` (bits 3:0 of the descriptor's byte 16), if it is one.
    pub fn from_code(code: u8) -> Option<AnaState> {
        Some(match code & 0xF {
            0x1 => AnaState::Optimized,
            0x2 => AnaState::NonOptimized,
            0x3 => AnaState::Inaccessible,
            0x4 => AnaState::PersistentLoss,
            0xF => AnaState::Change,
            _ => return None,
        })
    }

    /// The code on the wire.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The path status I/O through a controller in this state fails with (SCT 3h, Base
    /// 4.6.1.2.4), `None` when I/O is served.
    pub fn io_status(self) -> Option<crate::Status> {
        let sc = match self {
            AnaState::Optimized | AnaState::NonOptimized => return None,
            AnaState::Inaccessible => crate::SC_ANA_INACCESSIBLE,
            AnaState::PersistentLoss => crate::SC_ANA_PERSISTENT_LOSS,
            AnaState::Change => crate::SC_ANA_TRANSITION,
        };
        // Retryable: the host may send it down another path (Linux fails over only then).
        Some(crate::Status { sct: crate::SCT_PATH, sc, dnr: false })
    }

    /// SPDK's name (`nvmf_subsystem_listener_set_ana_state`, `nvmf_subsystem_get_listeners`).
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non_optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent_loss",
            AnaState::Change => "change",
        }
    }

    /// The state SPDK calls `name`.
    pub fn from_name(name: &str) -> Option<AnaState> {
        [
            AnaState::Optimized,
            AnaState::NonOptimized,
            AnaState::Inaccessible,
            AnaState::PersistentLoss,
            AnaState::Change,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }
}

/// One ANA group descriptor (Base Figure 230).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroupDescriptor {
    /// ANA Group ID, 1 or more.
    pub grpid: u32,
    /// The group's change count (0: not reported).
    pub change_count: u64,
    /// The group's state.
    pub state: AnaState,
    /// Its attached namespaces (empty when the page was read with RGO).
    pub nsids: Vec<u32>,
}

/// The Asymmetric Namespace Access log page (Base 5.16.1.12).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AnaLogPage {
    /// Change Count: bumped whenever the page's content changes.
    pub change_count: u64,
    /// The group descriptors, in the order on the wire.
    pub groups: Vec<AnaGroupDescriptor>,
}

/// Why bytes are not an ANA log page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnaLogError {
    /// Fewer bytes than the header, a descriptor or its NSID list needs.
    #[error("the ANA log page is cut short: {need} bytes needed at offset {at}, {have} read")]
    Truncated {
        /// Where the missing piece starts.
        at: usize,
        /// Bytes the piece needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// A descriptor with ANA Group ID 0 (not a group).
    #[error("ANA group descriptor {index} has ANA group ID 0")]
    ZeroGroup {
        /// The descriptor's position.
        index: usize,
    },
    /// A state code the specification does not define.
    #[error("ANA group {grpid} has the undefined ANA state {code:#x}")]
    BadState {
        /// The group.
        grpid: u32,
        /// Its code.
        code: u8,
    },
}

impl AnaLogPage {
    /// Bytes of the page as [`AnaLogPage::encode`] writes it.
    pub fn len(&self) -> usize {
        ANA_HEADER_LEN + self.groups.iter().map(|g| ANA_DESC_LEN + 4 * g.nsids.len()).sum::<usize>()
    }

    /// No group descriptors.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The page on the wire. At most 65535 descriptors fit the header's count; more are cut.
    pub fn encode(&self) -> Vec<u8> {
        let groups = &self.groups[..self.groups.len().min(usize::from(u16::MAX))];
        let mut b = Vec::with_capacity(self.len());
        b.extend_from_slice(&self.change_count.to_le_bytes());
        b.extend_from_slice(&(groups.len() as u16).to_le_bytes());
        b.extend_from_slice(&[0; 6]);
        for g in groups {
            b.extend_from_slice(&g.grpid.to_le_bytes());
            b.extend_from_slice(&(g.nsids.len() as u32).to_le_bytes());
            b.extend_from_slice(&g.change_count.to_le_bytes());
            b.push(g.state.code());
            b.extend_from_slice(&[0; 15]);
            for id in &g.nsids {
                b.extend_from_slice(&id.to_le_bytes());
            }
        }
        b
    }

    /// Reads a page a controller sent: every count checked against the bytes there are, so
    /// no input makes it panic or allocate more than the input's size.
    pub fn parse(b: &[u8]) -> Result<AnaLogPage, AnaLogError> {
        let need = |at: usize, n: usize| {
            if b.len() < at.saturating_add(n) {
                Err(AnaLogError::Truncated { at, need: n, have: b.len().saturating_sub(at) })
            } else {
                Ok(&b[at..at + n])
            }
        };
        let h = need(0, ANA_HEADER_LEN)?;
        let change_count = u64::from_le_bytes(h[ANA_CHGCNT..ANA_CHGCNT + 8].try_into().expect("8 bytes"));
        let count = usize::from(u16::from_le_bytes([h[ANA_NGRPS], h[ANA_NGRPS + 1]]));
        let mut groups = Vec::with_capacity(count.min(b.len() / ANA_DESC_LEN));
        let mut at = ANA_HEADER_LEN;
        for index in 0..count {
            let d = need(at, ANA_DESC_LEN)?;
            let u32_at = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().expect("4 bytes"));
            let grpid = u32_at(ANAD_GRPID);
            if grpid == 0 {
                return Err(AnaLogError::ZeroGroup { index });
            }
            let n = u32_at(ANAD_NNSIDS) as usize;
            let change_count =
                u64::from_le_bytes(d[ANAD_CHGCNT..ANAD_CHGCNT + 8].try_into().expect("8 bytes"));
            let code = d[ANAD_STATE] & 0xF;
            let state = AnaState::from_code(code).ok_or(AnaLogError::BadState { grpid, code })?;
            at += ANA_DESC_LEN;
            let list = need(at, n.saturating_mul(4))?;
            let nsids =
                list.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
            at += 4 * n;
            groups.push(AnaGroupDescriptor { grpid, change_count, state, nsids });
        }
        Ok(AnaLogPage { change_count, groups })
    }
}

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

    fn two_groups() -> AnaLogPage {
        AnaLogPage {
            change_count: 7,
            groups: vec![
                AnaGroupDescriptor {
                    grpid: 1,
                    change_count: 0,
                    state: AnaState::Optimized,
                    nsids: vec![1, 4],
                },
                AnaGroupDescriptor {
                    grpid: 2,
                    change_count: 3,
                    state: AnaState::Inaccessible,
                    nsids: vec![],
                },
            ],
        }
    }

    #[test]
    fn ana_page_at_figure_229_and_230_offsets() {
        let b = two_groups().encode();
        assert_eq!(b.len(), 16 + 32 + 8 + 32);
        assert_eq!(b.len(), two_groups().len());
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 7, "CHGCNT");
        assert_eq!(u16::from_le_bytes([b[8], b[9]]), 2, "NGRPS");
        let d = &b[16..];
        assert_eq!(u32::from_le_bytes(d[0..4].try_into().unwrap()), 1, "ANAGRPID");
        assert_eq!(u32::from_le_bytes(d[4..8].try_into().unwrap()), 2, "NNSIDS");
        assert_eq!(d[16], 0x1, "optimized");
        assert_eq!(&d[32..40], &[1, 0, 0, 0, 4, 0, 0, 0], "the NSID list after the descriptor");
        let d2 = &b[16 + 40..];
        assert_eq!(u32::from_le_bytes(d2[0..4].try_into().unwrap()), 2);
        assert_eq!(u64::from_le_bytes(d2[8..16].try_into().unwrap()), 3, "the group's CHGCNT");
        assert_eq!(d2[16], 0x3, "inaccessible");
    }

    #[test]
    fn ana_page_parses_what_it_encodes_and_refuses_the_rest() {
        let page = two_groups();
        let b = page.encode();
        assert_eq!(AnaLogPage::parse(&b), Ok(page));
        for cut in [0, 15, 16 + 31, 16 + 32 + 7] {
            assert!(
                matches!(AnaLogPage::parse(&b[..cut]), Err(AnaLogError::Truncated { .. })),
                "cut at {cut}"
            );
        }
        let mut zero = b.clone();
        zero[16..20].fill(0);
        assert_eq!(AnaLogPage::parse(&zero), Err(AnaLogError::ZeroGroup { index: 0 }));
        let mut bad = b.clone();
        bad[16 + 16] = 0x5;
        assert_eq!(AnaLogPage::parse(&bad), Err(AnaLogError::BadState { grpid: 1, code: 5 }));
        // A huge NSID count with nothing behind it: refused, not allocated.
        let mut huge = b;
        huge[16 + 4..16 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(AnaLogPage::parse(&huge), Err(AnaLogError::Truncated { .. })));
    }

    #[test]
    fn ana_states_codes_names_and_statuses() {
        for s in [
            AnaState::Optimized,
            AnaState::NonOptimized,
            AnaState::Inaccessible,
            AnaState::PersistentLoss,
            AnaState::Change,
        ] {
            assert_eq!(AnaState::from_code(s.code()), Some(s));
            assert_eq!(AnaState::from_name(s.name()), Some(s));
        }
        assert_eq!(AnaState::from_code(0), None);
        assert_eq!(AnaState::Optimized.io_status(), None);
        assert_eq!(AnaState::NonOptimized.io_status(), None);
        let st = AnaState::Inaccessible.io_status().unwrap();
        assert_eq!((st.sct, st.sc, st.dnr), (3, 0x02, false));
        assert_eq!(AnaState::PersistentLoss.io_status().unwrap().sc, 0x01);
        assert_eq!(AnaState::Change.io_status().unwrap().sc, 0x03);
        // Linux's nvme_is_path_error: (status & 0x700) == 0x300, and no DNR.
        assert_eq!(st.field() & 0x700 << 1, 0x300 << 1);
    }

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
