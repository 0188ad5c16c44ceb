//! Identify (Base 5.17): the controller data structure (CNS 01h), a namespace's (CNS 00h), the
//! active namespace ID list (CNS 02h) and a namespace's identification descriptors (CNS 03h),
//! each a 4096-byte structure built from the controller's configuration and the subsystem view.
//! The offsets and codes are `fp_nvme_spec::identify`'s; what this controller chooses to report
//! is here.

use fp_nvme_spec::identify::*;
use fp_nvme_spec::registers::{IOCQES, IOSQES};

use crate::model::ControllerConfig;
use crate::model::{AnaState, NamespaceInfo, SubsystemKind, SubsystemView};
use crate::properties::VERSION_1_3;

/// Recommended arbitration burst: 2^6 commands.
const RAB: u8 = 6;
/// Abort Command Limit, zero-based: 4 Aborts at once.
pub const ACL: u8 = 3;
/// Asynchronous Event Request Limit, zero-based: 4 parked AERs.
pub const AERL: u8 = 3;
/// FRMW: one firmware slot (bits 3:1), read only (bit 0); there is nothing to download.
const FRMW: u8 = 0b0000_0011;
/// ELPE, zero-based: one Error Information log entry.
pub const ELPE: u8 = 0;
/// KAS: the Keep Alive Timer granularity, in 100 ms units.
pub const KAS_100MS: u16 = 1;
/// SGLS: SGLs with no alignment requirement (which Linux's fabrics host checks), in-capsule
/// data at an offset (NVMe/TCP 3.3.3) and the transport data block (data moved by H2CData /
/// C2HData PDUs). Keyed SGLs (bit 2) are RDMA's.
pub const SGLS: u32 = SGLS_SUPPORTED | SGLS_OFFSET | SGLS_TRANSPORT_DATA_BLOCK;
/// IORCSZ: a response capsule is one 16-byte completion, no in-capsule data.
const IORCSZ: u32 = 1;
/// MSDBD: one SGL descriptor per command.
const MSDBD: u8 = 1;
/// ANATT: the longest a group may stay in ANA Change, in seconds (SPDK's figure). Only set
/// by hand (`nvmf_subsystem_listener_set_ana_state ... change`): the target never enters it.
pub const ANATT_SECONDS: u8 = 10;
/// ANACAP: every state can be reported; bit 6 (the group fixed while attached) as SPDK sets
/// it, although the operator may move a namespace (`nvmf_subsystem_set_ns_ana_group`).
const ANACAP: u8 = ANACAP_OPTIMIZED
    | ANACAP_NON_OPTIMIZED
    | ANACAP_INACCESSIBLE
    | ANACAP_PERSISTENT_LOSS
    | ANACAP_CHANGE
    | ANACAP_GRPID_FIXED;

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// An ASCII field padded with spaces (SN, MN, FR: Base 5.17.2.1); anything but printable ASCII
/// becomes a space, and a longer string is cut.
fn put_ascii(b: &mut [u8], at: usize, len: usize, s: &str) {
    let field = &mut b[at..at + len];
    field.fill(b' ');
    for (d, c) in field.iter_mut().zip(s.bytes()) {
        *d = if c.is_ascii_graphic() || c == b' ' { c } else { b' ' };
    }
}

/// MDTS: the largest transfer as a power of two of 4 KiB pages (CAP.MPSMIN). 0 would mean "no
/// limit", which is never true, so 8 KiB is the smallest limit reported.
pub fn mdts(max_transfer_bytes: u32) -> u8 {
    let pages = (max_transfer_bytes / 4096).max(1);
    (pages.ilog2() as u8).max(1)
}

/// FR: the crate's version, padded with spaces (also slot 1 of the Firmware Slot log).
pub fn firmware_revision() -> [u8; FR_LEN] {
    let mut fr = [0u8; FR_LEN];
    put_ascii(&mut fr, 0, FR_LEN, env!("CARGO_PKG_VERSION"));
    fr
}

/// Identify Controller (CNS 01h). `oaes` is what the controller's kind can notify.
pub fn controller(cfg: &ControllerConfig, view: &SubsystemView) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let discovery = cfg.kind == SubsystemKind::Discovery;
    // VID and SSVID stay 0: there is no PCI vendor behind a fabrics target, and a borrowed one
    // would pull in a host's quirks for hardware this is not.
    put_u16(&mut b, IDC_VID, 0);
    put_u16(&mut b, IDC_SSVID, 0);
    put_ascii(&mut b, IDC_SN, SN_LEN, &view.serial);
    put_ascii(&mut b, IDC_MN, MN_LEN, &view.model);
    b[IDC_FR..IDC_FR + FR_LEN].copy_from_slice(&firmware_revision());
    b[IDC_RAB] = RAB;
    b[IDC_IEEE..IDC_IEEE + 3].fill(0);
    // Every host that connects gets its own controller; with NMIC bit 0 this lets Linux treat
    // the namespaces as shared (multipath).
    b[IDC_CMIC] = if discovery { 0 } else { CMIC_MULTI_CONTROLLER };
    let ana = view.ana_reporting && !discovery;
    b[IDC_MDTS] = mdts(cfg.max_transfer_bytes);
    put_u16(&mut b, IDC_CNTLID, cfg.cntlid);
    put_u32(&mut b, IDC_VER, VERSION_1_3);
    put_u32(&mut b, IDC_OAES, oaes(cfg.kind, view));
    put_u32(&mut b, IDC_CTRATT, CTRATT_HOST_ID_128);
    b[IDC_CNTRLTYPE] = if discovery { CNTRLTYPE_DISCOVERY } else { CNTRLTYPE_IO };
    put_u16(&mut b, IDC_OACS, 0);
    b[IDC_ACL] = ACL;
    b[IDC_AERL] = AERL;
    b[IDC_FRMW] = FRMW;
    b[IDC_LPA] = LPA_EXTENDED_DATA;
    b[IDC_ELPE] = ELPE;
    // NPSS 0: one power state, whose descriptor (PSD0 at 2048) is all zero (not reported).
    b[IDC_NPSS] = 0;
    put_u16(&mut b, IDC_KAS, KAS_100MS);
    b[IDC_SQES] = ((IOSQES as u8) << 4) | IOSQES as u8;
    b[IDC_CQES] = ((IOCQES as u8) << 4) | IOCQES as u8;
    put_u16(&mut b, IDC_MAXCMD, cfg.max_queue_entries.min(u32::from(u16::MAX)) as u16);
    if !discovery {
        put_u32(&mut b, IDC_NN, view.max_namespaces);
        put_u16(&mut b, IDC_ONCS, oncs(view));
        b[IDC_VWC] = if view.namespaces.iter().any(|n| n.volatile_cache) { VWC_PRESENT } else { 0 };
        // MNAN: as many namespaces as NSIDs (Linux's multipath refuses ANA when it is 0).
        put_u32(&mut b, IDC_MNAN, view.max_namespaces);
        if ana {
            b[IDC_CMIC] |= CMIC_ANA_REPORTING;
            b[IDC_ANATT] = ANATT_SECONDS;
            b[IDC_ANACAP] = ANACAP;
            // One possible group per NSID, as SPDK: every namespace may have its own.
            put_u32(&mut b, IDC_ANAGRPMAX, view.max_namespaces);
            put_u32(&mut b, IDC_NANAGRPID, view.max_namespaces);
        }
        // IOCCSZ counts 16-byte units of the 64-byte command plus its in-capsule data.
        put_u32(&mut b, IDC_IOCCSZ, (64 + cfg.in_capsule_data_size) / 16);
        put_u32(&mut b, IDC_IORCSZ, IORCSZ);
    }
    put_u16(&mut b, IDC_FUSES, 0);
    put_u32(&mut b, IDC_SGLS, SGLS);
    let nqn = view.nqn.as_bytes();
    // NUL-terminated: at most 255 bytes of the name (NQNs are at most 223).
    let n = nqn.len().min(SUBNQN_LEN - 1);
    b[IDC_SUBNQN..IDC_SUBNQN + n].copy_from_slice(&nqn[..n]);
    put_u16(&mut b, IDC_ICDOFF, 0);
    // FCATT bit 0 cleared: the dynamic controller model (Fabrics 4.1), every Connect to
    // CNTLID FFFFh gets a new controller.
    b[IDC_FCATT] = 0;
    b[IDC_MSDBD] = MSDBD;
    b
}

/// OAES: the notices a controller of this kind sends (ANA changes with ANA reporting).
pub fn oaes(kind: SubsystemKind, view: &SubsystemView) -> u32 {
    match kind {
        SubsystemKind::Discovery => OAES_DISCOVERY_CHANGE,
        SubsystemKind::Nvme if view.ana_reporting => OAES_NS_ATTRIBUTE | OAES_ANA_CHANGE,
        SubsystemKind::Nvme => OAES_NS_ATTRIBUTE,
    }
}

/// ONCS: what the namespaces can do, ORed (a command a namespace cannot do fails on it).
fn oncs(view: &SubsystemView) -> u16 {
    view.namespaces.iter().fold(0, |acc, n| {
        acc | if n.deallocate { ONCS_DSM } else { 0 } | if n.write_zeroes { ONCS_WRITE_ZEROES } else { 0 }
    })
}

/// The NVM command set's Identify Controller (CNS 06h, CSI 0; NVM Command Set Specification
/// 4.1.5.2): VSL, WZSL, WUSL, DMRL, DMRSL and DMSL all 0, no limits beyond MDTS reported (the
/// bdevs split what they must).
pub fn nvm_controller() -> Vec<u8> {
    vec![0u8; IDENTIFY_LEN]
}

/// Identify Namespace (CNS 00h) of an active namespace; an inactive one's is all zero (Base
/// 5.17.2.1: a zero-filled structure for an allocated but inactive NSID). With ANA reporting,
/// its ANA group, and NUSE 0 while the group is inaccessible here (as SPDK).
pub fn namespace(ns: Option<&NamespaceInfo>, view: &SubsystemView) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let Some(ns) = ns else { return b };
    // No thin provisioning: NSZE = NCAP = NUSE (NSFEAT bit 0 cleared). NSFEAT's other bits
    // (atomic write units, deallocated block errors, optimal I/O fields) are not reported either.
    put_u64(&mut b, IDN_NSZE, ns.num_blocks);
    put_u64(&mut b, IDN_NCAP, ns.num_blocks);
    put_u64(&mut b, IDN_NUSE, ns.num_blocks);
    b[IDN_NSFEAT] = 0;
    // One LBA format (NLBAF is zero-based), in use (FLBAS 0), without metadata.
    b[IDN_NLBAF] = 0;
    b[IDN_FLBAS] = 0;
    b[IDN_NMIC] = NMIC_SHARED;
    // DLFEAT 0: what a deallocated block reads as is not reported (the view does not say).
    b[IDN_DLFEAT] = 0;
    b[IDN_NSATTR] = if ns.read_only { NSATTR_WRITE_PROTECTED } else { 0 };
    b[IDN_NGUID..IDN_NGUID + 16].copy_from_slice(&ns.nguid);
    b[IDN_EUI64..IDN_EUI64 + 8].copy_from_slice(&ns.eui64);
    let lbads = ns.block_size.max(512).ilog2();
    put_u32(&mut b, IDN_LBAF0, lbads << LBAF_LBADS_SHIFT);
    if view.ana_reporting {
        put_u32(&mut b, IDN_ANAGRPID, ns.anagrpid);
        if matches!(view.ana.get(ns.anagrpid), AnaState::Inaccessible | AnaState::PersistentLoss) {
            put_u64(&mut b, IDN_NUSE, 0);
        }
    }
    b
}

/// The Active Namespace ID list (CNS 02h): active NSIDs greater than `after`, ascending, at
/// most 1024, the rest zero.
pub fn active_namespaces(view: &SubsystemView, after: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let ids = view.namespaces.iter().map(|n| n.nsid).filter(|&id| id > after).take(ACTIVE_LIST_MAX);
    for (i, id) in ids.enumerate() {
        put_u32(&mut b, i * 4, id);
    }
    b
}

/// The Namespace Identification Descriptor list (CNS 03h): EUI-64, NGUID and UUID, each only
/// if it is set (an all-zero identifier is no identifier), ended by a zero NIDT.
pub fn descriptors(ns: &NamespaceInfo) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut at = 0;
    let ids: [(u8, &[u8]); 3] = [(NIDT_EUI64, &ns.eui64), (NIDT_NGUID, &ns.nguid), (NIDT_UUID, &ns.uuid)];
    for (nidt, nid) in ids {
        if nid.iter().all(|&x| x == 0) {
            continue;
        }
        b[at] = nidt;
        b[at + 1] = nid.len() as u8;
        b[at + NID_HEADER..at + NID_HEADER + nid.len()].copy_from_slice(nid);
        at += NID_HEADER + nid.len();
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::tests::{config, nvm_view};

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn controller_fields_at_figure_275_offsets() {
        let cfg = config(SubsystemKind::Nvme);
        let view = nvm_view();
        let b = controller(&cfg, &view);
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[IDC_SN..IDC_SN + 20], b"SN0001              ");
        assert_eq!(&b[IDC_MN..IDC_MN + 7], b"fp test");
        assert!(b[IDC_MN + 7..IDC_MN + 40].iter().all(|&c| c == b' '), "MN padded with spaces");
        assert!(b[IDC_FR..IDC_FR + 8].iter().all(|c| c.is_ascii_graphic() || *c == b' '));
        assert_eq!(b[IDC_CMIC], 0b10);
        assert_eq!(b[IDC_MDTS], 5, "128 KiB = 2^5 4 KiB pages");
        assert_eq!(u16_at(&b, IDC_CNTLID), 7);
        assert_eq!(u32_at(&b, IDC_VER), 0x0001_0300);
        assert_eq!(u32_at(&b, IDC_OAES), 1 << 8);
        assert_eq!(u32_at(&b, IDC_CTRATT) & 1, 1);
        assert_eq!(b[IDC_CNTRLTYPE], 1);
        assert_eq!(b[IDC_AERL], 3);
        assert_eq!(b[IDC_LPA] & 0b100, 0b100);
        assert_eq!(u16_at(&b, IDC_KAS), 1);
        assert_eq!(b[IDC_SQES], 0x66);
        assert_eq!(b[IDC_CQES], 0x44);
        assert_eq!(u16_at(&b, IDC_MAXCMD), 128);
        assert_eq!(u32_at(&b, IDC_NN), 32);
        assert_eq!(u16_at(&b, IDC_ONCS), (1 << 2) | (1 << 3), "one namespace deallocates, one writes zeroes");
        assert_eq!(b[IDC_VWC], 1, "one namespace has a volatile cache");
        assert_eq!(u32_at(&b, IDC_SGLS) & 0b11, 0b01);
        assert_eq!(&b[IDC_SUBNQN..IDC_SUBNQN + view.nqn.len()], view.nqn.as_bytes());
        assert_eq!(b[IDC_SUBNQN + view.nqn.len()], 0, "NUL-terminated");
        assert_eq!(u32_at(&b, IDC_IOCCSZ), (64 + 4096) / 16);
        assert_eq!(u32_at(&b, IDC_IORCSZ), 1);
        assert_eq!(u16_at(&b, IDC_ICDOFF), 0);
        assert_eq!(b[IDC_FCATT], 0);
        assert_eq!(b[IDC_MSDBD], 1);
    }

    #[test]
    fn discovery_controller_reports_no_namespaces() {
        let cfg = config(SubsystemKind::Discovery);
        let mut view = nvm_view();
        view.kind = SubsystemKind::Discovery;
        let b = controller(&cfg, &view);
        assert_eq!(b[IDC_CNTRLTYPE], 2);
        assert_eq!(u32_at(&b, IDC_NN), 0);
        assert_eq!(u16_at(&b, IDC_ONCS), 0);
        assert_eq!(u32_at(&b, IDC_OAES), 1 << 31);
        assert_eq!(b[IDC_CMIC], 0);
    }

    #[test]
    fn mdts_never_claims_no_limit() {
        assert_eq!(mdts(131072), 5);
        assert_eq!(mdts(1 << 20), 8);
        assert_eq!(mdts(4096), 1);
        assert_eq!(mdts(0), 1);
        assert_eq!(mdts(100_000), 4, "rounds down to a power of two of pages");
    }

    #[test]
    fn namespace_fields_at_figure_97_offsets() {
        let view = nvm_view();
        let ns = &view.namespaces[1];
        let b = namespace(Some(ns), &view);
        assert_eq!(u64_at(&b, IDN_NSZE), ns.num_blocks);
        assert_eq!(u64_at(&b, IDN_NCAP), ns.num_blocks);
        assert_eq!(u64_at(&b, IDN_NUSE), ns.num_blocks);
        assert_eq!(b[IDN_NLBAF], 0);
        assert_eq!(b[IDN_FLBAS], 0);
        assert_eq!(b[IDN_NMIC], 1);
        assert_eq!(b[IDN_NSATTR], 1, "read-only namespace is write protected");
        assert_eq!(&b[IDN_NGUID..IDN_NGUID + 16], &ns.nguid);
        assert_eq!(&b[IDN_EUI64..IDN_EUI64 + 8], &ns.eui64);
        assert_eq!(u32_at(&b, IDN_LBAF0), 12 << 16, "4096-byte blocks, no metadata");
        assert_eq!(u32_at(&namespace(Some(&view.namespaces[0]), &view), IDN_LBAF0), 9 << 16);
        assert!(namespace(None, &view).iter().all(|&x| x == 0));
        assert_eq!(u32_at(&b, IDN_ANAGRPID), 0, "no ANA group without ANA reporting");
    }

    #[test]
    fn ana_reporting_fields() {
        let cfg = config(SubsystemKind::Nvme);
        let mut view = nvm_view();
        let plain = controller(&cfg, &view);
        assert_eq!((plain[IDC_ANACAP], u32_at(&plain, IDC_ANAGRPMAX)), (0, 0));
        assert_eq!(u32_at(&plain, IDC_MNAN), 32);
        view.ana_reporting = true;
        view.ana = crate::model::AnaStates::new(32, AnaState::Optimized);
        view.ana.states[2] = AnaState::Inaccessible;
        let b = controller(&cfg, &view);
        assert_eq!(b[IDC_CMIC], 0b1010, "multi-controller and ANA reporting");
        assert_eq!(u32_at(&b, IDC_OAES), (1 << 8) | (1 << 11));
        assert_eq!(b[IDC_ANATT], 10);
        assert_eq!(b[IDC_ANACAP], 0b0101_1111);
        assert_eq!(
            (u32_at(&b, IDC_ANAGRPMAX), u32_at(&b, IDC_NANAGRPID), u32_at(&b, IDC_MNAN)),
            (32, 32, 32)
        );
        // namespaces[1] is NSID 3 in group 3, inaccessible here.
        let ns = namespace(Some(&view.namespaces[1]), &view);
        assert_eq!(u32_at(&ns, IDN_ANAGRPID), 3);
        assert_eq!(u64_at(&ns, IDN_NUSE), 0, "NUSE 0 while inaccessible");
        let ns = namespace(Some(&view.namespaces[0]), &view);
        assert_eq!((u32_at(&ns, IDN_ANAGRPID), u64_at(&ns, IDN_NUSE)), (1, 2048));
    }

    #[test]
    fn active_list_ascending_after_the_given_nsid() {
        let view = nvm_view();
        let b = active_namespaces(&view, 0);
        assert_eq!((u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8)), (1, 3, 0));
        let b = active_namespaces(&view, 1);
        assert_eq!((u32_at(&b, 0), u32_at(&b, 4)), (3, 0));
        assert!(active_namespaces(&view, 3).iter().all(|&x| x == 0));
    }

    #[test]
    fn descriptors_skip_zero_identifiers() {
        let view = nvm_view();
        let ns = &view.namespaces[0];
        let b = descriptors(ns);
        // namespaces[0] has a UUID and an NGUID but no EUI-64.
        assert_eq!((b[0], b[1]), (NIDT_NGUID, 16));
        assert_eq!(&b[4..20], &ns.nguid);
        assert_eq!((b[20], b[21]), (NIDT_UUID, 16));
        assert_eq!(&b[24..40], &ns.uuid);
        assert_eq!(b[40], 0, "list ends");
        let b = descriptors(&view.namespaces[1]);
        assert_eq!((b[0], b[1]), (NIDT_EUI64, 8));
        assert_eq!(&b[4..12], &view.namespaces[1].eui64);
    }
}
