//! Get Log Page (Base 5.16): the pages a controller serves, each built whole and then cut to the
//! command's offset (LPOL/LPOU) and length (NUMDL/NUMDU): Error Information, SMART / Health
//! Information, Changed Namespace List, and on discovery controllers the Discovery log page
//! (Fabrics 5.3). The layouts and codes are `fp_nvme_spec::log_page`'s.

use fp_nvme_spec::fabrics::CNTLID_DYNAMIC;
use fp_nvme_spec::log_page::*;

use crate::identify::ELPE;
use crate::model::SubsystemView;

/// The largest page a host may read past a log's end (zero-filled, Base 5.16): the rest of a
/// long NUMD is not answered, so a hostile NUMD cannot make the controller allocate gigabytes.
const PAD_MAX: usize = 1 << 20;

/// The part of `page` that `req` asks for: from the offset (dword aligned, inside the page,
/// else `None`: Invalid Field), NUMD dwords, zero-filled past the page's end up to
/// `max_transfer` (or the page's rest if that is longer).
pub fn cut(req: &LogRequest, page: &[u8], max_transfer: u32) -> Option<Vec<u8>> {
    if !req.offset.is_multiple_of(4) || req.offset > page.len() as u64 {
        return None;
    }
    let rest = &page[req.offset as usize..];
    let cap = rest.len().max((max_transfer as usize).min(PAD_MAX)) as u64;
    let want = req.numd.saturating_mul(4).min(cap) as usize;
    let mut data = vec![0u8; want];
    let n = want.min(rest.len());
    data[..n].copy_from_slice(&rest[..n]);
    Some(data)
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

/// The Asymmetric Namespace Access log page (Base 5.16.1.12) a controller on a listener with
/// `view.ana` reports: one descriptor per ANA group that has namespaces, ascending, each with
/// its NSIDs ascending (none with `groups_only`, LSP's RGO bit). The groups keep no change
/// count of their own (0); the page's is the listener's.
pub fn ana(view: &SubsystemView, groups_only: bool) -> Vec<u8> {
    let mut groups: Vec<AnaGroupDescriptor> = Vec::new();
    let mut by_group: Vec<(u32, u32)> = view.namespaces.iter().map(|n| (n.anagrpid, n.nsid)).collect();
    by_group.sort_unstable();
    for (grpid, nsid) in by_group {
        if groups.last().is_none_or(|g| g.grpid != grpid) {
            groups.push(AnaGroupDescriptor {
                grpid,
                change_count: 0,
                state: view.ana.get(grpid),
                nsids: Vec::new(),
            });
        }
        if !groups_only {
            groups.last_mut().expect("pushed").nsids.push(nsid);
        }
    }
    AnaLogPage { change_count: view.ana.change_count, groups }.encode()
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
    fn cut_honours_offset_and_length() {
        let page: Vec<u8> = (0..64u8).collect();
        assert_eq!(cut(&request(2, 8), &page, 4096).unwrap(), vec![8, 9, 10, 11, 12, 13, 14, 15]);
        let tail = cut(&request(4, 60), &page, 4096).unwrap();
        assert_eq!(tail, vec![60, 61, 62, 63, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "zero past the end");
        assert_eq!(cut(&request(1, 64), &page, 4096).unwrap(), vec![0, 0, 0, 0]);
        assert_eq!(cut(&request(1, 68), &page, 4096), None, "offset past the page");
        assert_eq!(cut(&request(1, 2), &page, 4096), None, "offset not dword aligned");
        assert_eq!(cut(&request(1 << 32, 0), &page, 4096).unwrap().len(), 4096, "NUMD capped");
    }

    #[test]
    fn ana_page_lists_groups_with_their_namespaces() {
        use crate::model::{AnaState, AnaStates};
        let mut view = crate::controller::tests::nvm_view();
        view.ana_reporting = true;
        view.ana = AnaStates::new(32, AnaState::Optimized);
        view.ana.states[0] = AnaState::NonOptimized;
        view.ana.change_count = 4;
        view.namespaces[1].anagrpid = 1;
        let page = AnaLogPage::parse(&ana(&view, false)).unwrap();
        assert_eq!(page.change_count, 4);
        assert_eq!(page.groups.len(), 1, "both namespaces in group 1; empty groups are not listed");
        assert_eq!((page.groups[0].grpid, page.groups[0].state), (1, AnaState::NonOptimized));
        assert_eq!(page.groups[0].nsids, vec![1, 3]);
        view.namespaces[1].anagrpid = 7;
        view.ana.states[6] = AnaState::Inaccessible;
        let page = AnaLogPage::parse(&ana(&view, true)).unwrap();
        let got: Vec<_> = page.groups.iter().map(|g| (g.grpid, g.state, g.nsids.len())).collect();
        assert_eq!(
            got,
            vec![(1, AnaState::NonOptimized, 0), (7, AnaState::Inaccessible, 0)],
            "RGO: no NSIDs"
        );
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
