//! Get Log Page (Base 5.16): the pages a controller serves, each built whole and then cut to the
//! command's offset (LPOL/LPOU) and length (NUMDL/NUMDU): Error Information, SMART / Health
//! Information, Changed Namespace List, and on discovery controllers the Discovery log page
//! (Fabrics 5.3).

use crate::identify::ELPE;
use crate::model::SubsystemView;
use crate::spec::Sqe;

// Log page identifiers (Base 5.16, Figure 202; Fabrics 5.3).
pub const LID_ERROR: u8 = 0x01;
pub const LID_SMART: u8 = 0x02;
pub const LID_FIRMWARE_SLOT: u8 = 0x03;
pub const LID_CHANGED_NS: u8 = 0x04;
pub const LID_DISCOVERY: u8 = 0x70;

/// Bytes of one Error Information log entry (Base 5.16.1.2, Figure 205).
pub const ERROR_ENTRY_LEN: usize = 64;
/// Bytes of the SMART / Health Information log page (Base 5.16.1.3, Figure 207).
pub const SMART_LEN: usize = 512;
// SMART / Health Information fields (Base 5.16.1.3, Figure 207).
pub const SMART_AVAILABLE_SPARE: usize = 3;
pub const SMART_SPARE_THRESHOLD: usize = 4;
/// Bytes of the Firmware Slot Information log page (Base 5.16.1.4, Figure 210).
pub const FIRMWARE_SLOT_LEN: usize = 512;
// Firmware Slot Information fields: AFI (bits 2:0, the active slot) and FRS1, slot 1's
// revision.
pub const FW_AFI: usize = 0;
pub const FW_FRS1: usize = 8;
/// Bytes of the Changed Namespace List log page: 1024 NSIDs (Base 5.16.1.5, Figure 211).
pub const CHANGED_NS_LEN: usize = 4096;
/// More than 1024 namespaces changed: the list's first entry is FFFFFFFFh, the rest zero.
const CHANGED_NS_OVERFLOW: u32 = 0xFFFF_FFFF;

// Discovery log page header (Fabrics 5.3, Figure 37) and entry (Figure 38).
pub const DISC_GENCTR: usize = 0;
pub const DISC_NUMREC: usize = 8;
pub const DISC_RECFMT: usize = 16;
/// Bytes of the header; entries follow it.
pub const DISC_HEADER_LEN: usize = 1024;
/// Bytes of one entry.
pub const DISC_ENTRY_LEN: usize = 1024;
pub const DE_TRTYPE: usize = 0;
pub const DE_ADRFAM: usize = 1;
pub const DE_SUBTYPE: usize = 2;
pub const DE_TREQ: usize = 3;
pub const DE_PORTID: usize = 4;
pub const DE_CNTLID: usize = 6;
pub const DE_ASQSZ: usize = 8;
pub const DE_TRSVCID: usize = 32;
pub const DE_SUBNQN: usize = 256;
pub const DE_TRADDR: usize = 512;
pub const DE_TSAS: usize = 768;
const TRSVCID_LEN: usize = 32;
const SUBNQN_LEN: usize = 256;
const TRADDR_LEN: usize = 256;
/// TRTYPE 3: TCP (Fabrics 5.3 Figure 38; NVMe/TCP 8.1).
pub const TRTYPE_TCP: u8 = 3;
/// TREQ bits 1:0 = 10b: a secure channel is not required.
pub const TREQ_SECURE_CHANNEL_NOT_REQUIRED: u8 = 0b10;
/// CNTLID FFFFh: the dynamic controller model, any controller ID (Fabrics 5.3).
const CNTLID_DYNAMIC: u16 = 0xFFFF;
/// TSAS for TCP, byte 0: SECTYPE 0, no security (NVMe/TCP 8.1.2).
pub const TSAS_SECTYPE_NONE: u8 = 0;

/// The largest page a host may read past a log's end (zero-filled, Base 5.16): the rest of a
/// long NUMD is not answered, so a hostile NUMD cannot make the controller allocate gigabytes.
const PAD_MAX: usize = 1 << 20;

/// A Get Log Page command's fields (Base 5.16, Figures 197-200).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRequest {
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

    /// The part of `page` this request asks for: from the offset (dword aligned, inside the
    /// page, else `None`: Invalid Field), NUMD dwords, zero-filled past the page's end up to
    /// `max_transfer` (or the page's rest if that is longer).
    pub fn cut(&self, page: &[u8], max_transfer: u32) -> Option<Vec<u8>> {
        if !self.offset.is_multiple_of(4) || self.offset > page.len() as u64 {
            return None;
        }
        let rest = &page[self.offset as usize..];
        let cap = rest.len().max((max_transfer as usize).min(PAD_MAX)) as u64;
        let want = self.numd.saturating_mul(4).min(cap) as usize;
        let mut data = vec![0u8; want];
        let n = want.min(rest.len());
        data[..n].copy_from_slice(&rest[..n]);
        Some(data)
    }
}

/// The Error Information log: ELPE + 1 entries. The controller keeps no error history (every
/// failed command is answered in its own completion), so every entry's Error Count is 0, which
/// marks it empty (Base 5.16.1.2).
pub fn error_information() -> Vec<u8> {
    vec![0u8; ERROR_ENTRY_LEN * (usize::from(ELPE) + 1)]
}

/// SMART / Health Information: no critical warning, the spare at 100% against a 10% threshold,
/// nothing used up. A fabrics target has no media or temperature of its own: the temperature,
/// the counters and the power-on hours stay 0 (not reported); per-namespace traffic is in the
/// target's statistics instead.
pub fn smart_health() -> Vec<u8> {
    let mut b = vec![0u8; SMART_LEN];
    b[SMART_AVAILABLE_SPARE] = 100;
    b[SMART_SPARE_THRESHOLD] = 10;
    b
}

/// Firmware Slot Information, mandatory for I/O controllers (Base 5.16.1.4): slot 1 (the only
/// one, read only: FRMW in Identify) is active and holds `revision`, the FR field of Identify
/// Controller.
pub fn firmware_slot(revision: &[u8; 8]) -> Vec<u8> {
    let mut b = vec![0u8; FIRMWARE_SLOT_LEN];
    b[FW_AFI] = 1;
    b[FW_FRS1..FW_FRS1 + 8].copy_from_slice(revision);
    b
}

/// The namespaces that changed since the host last read the Changed Namespace List.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangedNamespaces {
    /// Ascending, no duplicates, at most 1024.
    nsids: Vec<u32>,
    /// More than 1024 changed.
    overflow: bool,
}

impl ChangedNamespaces {
    pub fn add(&mut self, nsid: u32) {
        if self.overflow {
            return;
        }
        if let Err(at) = self.nsids.binary_search(&nsid) {
            if self.nsids.len() == CHANGED_NS_LEN / 4 {
                self.nsids.clear();
                self.overflow = true;
            } else {
                self.nsids.insert(at, nsid);
            }
        }
    }

    pub fn clear(&mut self) {
        self.nsids.clear();
        self.overflow = false;
    }

    pub fn is_empty(&self) -> bool {
        self.nsids.is_empty() && !self.overflow
    }

    /// The log page (Base 5.16.1.5).
    pub fn page(&self) -> Vec<u8> {
        let mut b = vec![0u8; CHANGED_NS_LEN];
        if self.overflow {
            b[0..4].copy_from_slice(&CHANGED_NS_OVERFLOW.to_le_bytes());
        } else {
            for (i, id) in self.nsids.iter().enumerate() {
                b[i * 4..i * 4 + 4].copy_from_slice(&id.to_le_bytes());
            }
        }
        b
    }
}

/// An ASCII field padded with spaces (TRSVCID, TRADDR: Fabrics 5.3 Figure 38).
fn put_padded(b: &mut [u8], at: usize, len: usize, s: &str) {
    let field = &mut b[at..at + len];
    field.fill(b' ');
    let n = s.len().min(len);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// The Discovery log page (Fabrics 5.3): a header with GENCTR and NUMREC, then one 1024-byte
/// entry per subsystem and listener. `asqsz` is the admin queue size a host may ask for.
pub fn discovery(view: &SubsystemView, asqsz: u16) -> Vec<u8> {
    let n = view.discovery_log.len();
    let mut b = vec![0u8; DISC_HEADER_LEN + n * DISC_ENTRY_LEN];
    b[DISC_GENCTR..DISC_GENCTR + 8].copy_from_slice(&view.generation.to_le_bytes());
    b[DISC_NUMREC..DISC_NUMREC + 8].copy_from_slice(&(n as u64).to_le_bytes());
    // RECFMT 0: the format of Figure 38.
    b[DISC_RECFMT..DISC_RECFMT + 2].copy_from_slice(&0u16.to_le_bytes());
    for (i, e) in view.discovery_log.iter().enumerate() {
        let d = &mut b[DISC_HEADER_LEN + i * DISC_ENTRY_LEN..][..DISC_ENTRY_LEN];
        d[DE_TRTYPE] = TRTYPE_TCP;
        d[DE_ADRFAM] = e.adrfam;
        d[DE_SUBTYPE] = e.subtype;
        d[DE_TREQ] = TREQ_SECURE_CHANNEL_NOT_REQUIRED;
        d[DE_PORTID..DE_PORTID + 2].copy_from_slice(&e.port_id.to_le_bytes());
        d[DE_CNTLID..DE_CNTLID + 2].copy_from_slice(&CNTLID_DYNAMIC.to_le_bytes());
        d[DE_ASQSZ..DE_ASQSZ + 2].copy_from_slice(&asqsz.to_le_bytes());
        put_padded(d, DE_TRSVCID, TRSVCID_LEN, &e.trsvcid);
        // NUL-terminated (at most 255 bytes; NQNs are at most 223).
        let nqn = &e.subnqn.as_bytes()[..e.subnqn.len().min(SUBNQN_LEN - 1)];
        d[DE_SUBNQN..DE_SUBNQN + nqn.len()].copy_from_slice(nqn);
        put_padded(d, DE_TRADDR, TRADDR_LEN, &e.traddr);
        d[DE_TSAS] = TSAS_SECTYPE_NONE;
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::tests::discovery_view;

    fn request(numd: u64, offset: u64) -> LogRequest {
        LogRequest { lid: LID_DISCOVERY, lsp: 0, rae: false, numd, offset }
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

    #[test]
    fn cut_honours_offset_and_length() {
        let page: Vec<u8> = (0..64u8).collect();
        assert_eq!(request(2, 8).cut(&page, 4096).unwrap(), vec![8, 9, 10, 11, 12, 13, 14, 15]);
        let tail = request(4, 60).cut(&page, 4096).unwrap();
        assert_eq!(tail, vec![60, 61, 62, 63, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "zero past the end");
        assert_eq!(request(1, 64).cut(&page, 4096).unwrap(), vec![0, 0, 0, 0]);
        assert_eq!(request(1, 68).cut(&page, 4096), None, "offset past the page");
        assert_eq!(request(1, 2).cut(&page, 4096), None, "offset not dword aligned");
        assert_eq!(request(1 << 32, 0).cut(&page, 4096).unwrap().len(), 4096, "NUMD capped");
    }

    #[test]
    fn firmware_slot_one_active() {
        let b = firmware_slot(b"0.1.0   ");
        assert_eq!((b.len(), b[FW_AFI]), (512, 1));
        assert_eq!(&b[FW_FRS1..FW_FRS1 + 8], b"0.1.0   ");
        assert!(b[FW_FRS1 + 8..].iter().all(|&x| x == 0), "slots 2-7 empty");
    }

    #[test]
    fn changed_list_sorted_then_overflows() {
        let mut c = ChangedNamespaces::default();
        c.add(5);
        c.add(2);
        c.add(5);
        let p = c.page();
        assert_eq!(&p[0..12], &[2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
        for id in 1..=1025 {
            c.add(id);
        }
        let p = c.page();
        assert_eq!(&p[0..8], &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
        c.clear();
        assert!(c.is_empty());
    }

    #[test]
    fn discovery_entries_at_figure_38_offsets() {
        let view = discovery_view();
        let b = discovery(&view, 128);
        assert_eq!(b.len(), 1024 + 2 * 1024);
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), view.generation);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 2);
        let e = &b[1024..2048];
        let want = &view.discovery_log[0];
        assert_eq!(e[DE_TRTYPE], 3);
        assert_eq!(e[DE_ADRFAM], 1);
        assert_eq!(e[DE_SUBTYPE], 2);
        assert_eq!(e[DE_TREQ], 0b10);
        assert_eq!(u16::from_le_bytes([e[DE_PORTID], e[DE_PORTID + 1]]), want.port_id);
        assert_eq!(u16::from_le_bytes([e[DE_CNTLID], e[DE_CNTLID + 1]]), 0xFFFF);
        assert_eq!(u16::from_le_bytes([e[DE_ASQSZ], e[DE_ASQSZ + 1]]), 128);
        assert_eq!(&e[DE_TRSVCID..DE_TRSVCID + 4], b"4420");
        assert!(e[DE_TRSVCID + 4..DE_TRSVCID + 32].iter().all(|&c| c == b' '));
        assert_eq!(&e[DE_SUBNQN..DE_SUBNQN + want.subnqn.len()], want.subnqn.as_bytes());
        assert_eq!(e[DE_SUBNQN + want.subnqn.len()], 0);
        assert_eq!(&e[DE_TRADDR..DE_TRADDR + 9], b"127.0.0.1");
        assert_eq!(e[DE_TRADDR + 9], b' ');
        assert_eq!(e[DE_TSAS], 0);
        assert_eq!(b[2048 + DE_SUBTYPE], 3, "the second entry is the discovery subsystem itself");
    }
}
