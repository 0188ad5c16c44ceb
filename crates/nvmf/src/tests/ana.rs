//! Asymmetric Namespace Access end to end: a subsystem with ANA reporting on two listeners,
//! controllers on each reading their listener's states (Identify, the ANA log page), the ANA
//! change notice reaching only the controllers on the changed listener that enabled it, and
//! I/O through an inaccessible group failing with the path status while the other listener
//! and the other group serve it.

use fp_nvme_spec::aer::AEC_ANA_CHANGE;
use fp_nvme_spec::features::FID_ASYNC_EVENT_CONFIG;
use fp_nvme_spec::identify::*;
use fp_nvme_spec::log_page::{AnaLogPage, AnaState, LID_ANA};
use fp_nvme_spec::tcp::Digests;
use fp_nvme_spec::*;

use super::api::{free_port, listen, ns};
use super::host::*;
use crate::testing::LoopbackTarget;
use crate::*;

const NQN: &str = "nqn.2016-06.io.flashpath:ana";

struct Paths {
    t: NvmfTarget,
    ports: [u16; 2],
    _loopback: LoopbackTarget,
}

/// Subsystem `NQN` (ANA reporting as asked) on two listeners, namespace 1 in group 1 and
/// namespace 2 in group 5.
fn two_paths(ana_reporting: bool) -> Paths {
    let loopback = LoopbackTarget::start(&[0], TransportOptions::default()).unwrap();
    let t = loopback.target().clone();
    t.set_sock_impl(super::sock_impl());
    t.create_subsystem(SubsystemSpec {
        nqn: NQN.into(),
        allow_any_host: true,
        ana_reporting,
        ..Default::default()
    })
    .unwrap();
    let ports = [loopback.port(), free_port()];
    for p in ports {
        t.add_listener(NQN, listen(p)).unwrap();
    }
    t.add_namespace(NQN, ns(1, "ana0", 2048)).unwrap();
    t.add_namespace(NQN, NamespaceSpec { anagrpid: Some(5), ..ns(2, "ana1", 2048) }).unwrap();
    Paths { t, ports, _loopback: loopback }
}

fn ana_log(h: &mut Host) -> (Cqe, AnaLogPage) {
    let mut s = sqe(ADMIN_GET_LOG_PAGE, h.next_cid(), 0xFFFF_FFFF);
    set_cdw(&mut s, 10, u32::from(LID_ANA) | ((4096 / 4 - 1) << 16));
    let (cqe, data) = h.run(s, &[], 4096);
    let page =
        if cqe.status.is_success() { AnaLogPage::parse(&data).unwrap() } else { AnaLogPage::default() };
    (cqe, page)
}

fn states(page: &AnaLogPage) -> Vec<(u32, AnaState, Vec<u32>)> {
    page.groups.iter().map(|g| (g.grpid, g.state, g.nsids.clone())).collect()
}

fn park_aer(h: &mut Host) -> u16 {
    let cid = h.next_cid();
    h.send_capsule(&sqe(ADMIN_ASYNC_EVENT_REQUEST, cid, 0), &[]);
    cid
}

on_each_sock_impl!(listener_states_reach_identify_log_page_event_and_io);
fn listener_states_reach_identify_log_page_event_and_io() {
    let p = two_paths(true);
    let mut a = Host::admin(p.ports[0], NQN, 0);
    let mut b = Host::admin(p.ports[1], NQN, 0);
    // A second controller on the first listener that did not enable ANA change notices.
    let mut quiet = Host::admin(p.ports[0], NQN, 0);
    for h in [&mut a, &mut b] {
        assert!(h.set_features(FID_ASYNC_EVENT_CONFIG, AEC_ANA_CHANGE).status.is_success());
    }
    let (cqe, id) = a.identify(1, 0);
    assert!(cqe.status.is_success());
    assert_eq!(id[IDC_CMIC] & CMIC_ANA_REPORTING, CMIC_ANA_REPORTING);
    assert_eq!(
        u32::from_le_bytes(id[IDC_OAES..IDC_OAES + 4].try_into().unwrap()) & OAES_ANA_CHANGE,
        OAES_ANA_CHANGE
    );
    let (_, page) = ana_log(&mut a);
    assert_eq!(page.change_count, 0);
    assert_eq!(states(&page), vec![(1, AnaState::Optimized, vec![1]), (5, AnaState::Optimized, vec![2])]);

    let mut io = Host::io(p.ports[0], NQN, a.cntlid, 1, Digests::default());
    let mut io_b = Host::io(p.ports[1], NQN, b.cntlid, 1, Digests::default());
    assert!(io.write(1, 0, &[7u8; 512], false).status.is_success());
    let (aer_a, aer_b, aer_quiet) = (park_aer(&mut a), park_aer(&mut b), park_aer(&mut quiet));

    p.t.set_ana_state(NQN, &listen(p.ports[0]), AnaState::Inaccessible, Some(1)).unwrap();
    let cqe = a.response();
    assert_eq!((cqe.cid, cqe.dw0), (aer_a, 0x000C_0302), "ANA change notice, log page 0Ch");
    // The others' AERs stay parked: their next answer is the command sent now.
    for h in [&mut b, &mut quiet] {
        let (cqe, _) = h.identify(1, 0);
        assert!(cqe.status.is_success());
    }
    let (_, page) = ana_log(&mut a);
    assert_eq!(page.change_count, 1);
    assert_eq!(states(&page), vec![(1, AnaState::Inaccessible, vec![1]), (5, AnaState::Optimized, vec![2])]);
    let (_, page) = ana_log(&mut b);
    assert_eq!((page.change_count, page.groups[0].state), (0, AnaState::Optimized), "the other listener's");
    let (_, idns) = a.identify(0, 1);
    assert_eq!(u32::from_le_bytes(idns[IDN_ANAGRPID..IDN_ANAGRPID + 4].try_into().unwrap()), 1);
    assert_eq!(u64::from_le_bytes(idns[IDN_NUSE..IDN_NUSE + 8].try_into().unwrap()), 0);

    // I/O to group 1 through the first listener fails with the path status, retryable
    // elsewhere; group 5 there, and group 1 through the second listener, are served.
    let (cqe, _) = io.read(1, 0, 1);
    assert_eq!(cqe.status, Status { sct: SCT_PATH, sc: SC_ANA_INACCESSIBLE, dnr: false });
    assert_eq!(io.write(1, 0, &[8u8; 512], false).status, cqe.status);
    assert!(io.read(2, 0, 1).0.status.is_success());
    let (cqe, data) = io_b.read(1, 0, 1);
    assert!(cqe.status.is_success());
    assert_eq!(data, vec![7u8; 512], "the failed write did not land");

    // Back to optimized: served again, and the notice fires again once the log was read
    // (it was, with RAE cleared).
    let aer_a = park_aer(&mut a);
    p.t.set_ana_state(NQN, &listen(p.ports[0]), AnaState::Optimized, None).unwrap();
    let cqe = a.response();
    assert_eq!((cqe.cid, cqe.dw0), (aer_a, 0x000C_0302));
    assert!(io.read(1, 0, 1).0.status.is_success());
    for (state, sc) in
        [(AnaState::PersistentLoss, SC_ANA_PERSISTENT_LOSS), (AnaState::Change, SC_ANA_TRANSITION)]
    {
        p.t.set_ana_state(NQN, &listen(p.ports[0]), state, Some(5)).unwrap();
        assert_eq!(io.read(2, 0, 1).0.status, Status { sct: SCT_PATH, sc, dnr: false });
    }
    let _ = (aer_b, aer_quiet);
}

on_each_sock_impl!(without_ana_reporting_nothing_changes);
fn without_ana_reporting_nothing_changes() {
    let p = two_paths(false);
    let mut a = Host::admin(p.ports[0], NQN, 0);
    let (_, id) = a.identify(1, 0);
    assert_eq!(id[IDC_CMIC] & CMIC_ANA_REPORTING, 0);
    assert_eq!(id[IDC_ANACAP], 0);
    let (cqe, _) = ana_log(&mut a);
    assert_eq!(cqe.status, Status::command_specific(SC_INVALID_LOG_PAGE));
    assert_eq!(a.set_features(FID_ASYNC_EVENT_CONFIG, AEC_ANA_CHANGE).status, Status::SUCCESS);
    let e = p.t.set_ana_state(NQN, &listen(p.ports[0]), AnaState::Inaccessible, None).unwrap_err();
    assert!(e.to_string().contains("ana_reporting"), "{e}");
    assert_eq!(p.t.listener_ana_states(NQN).unwrap(), None);
}

#[test]
fn bad_ana_requests_name_what_is_wrong() {
    let p = two_paths(true);
    let at = listen(p.ports[0]);
    for g in [0, 33] {
        let e = p.t.set_ana_state(NQN, &at, AnaState::Inaccessible, Some(g)).unwrap_err();
        assert!(e.to_string().contains("anagrpid"), "{e}");
    }
    let e = p.t.set_ana_state(NQN, &listen(free_port()), AnaState::Inaccessible, None).unwrap_err();
    assert!(matches!(e, NvmfError::NotFound { what: "listener", .. }), "{e}");
    let e =
        p.t.set_ana_state("nqn.2016-06.io.flashpath:none", &at, AnaState::Inaccessible, None).unwrap_err();
    assert!(matches!(e, NvmfError::NotFound { what: "subsystem", .. }), "{e}");
    let e = p.t.add_namespace(NQN, NamespaceSpec { anagrpid: Some(33), ..ns(3, "ana2", 64) }).unwrap_err();
    assert!(e.to_string().contains("anagrpid"), "{e}");
    p.t.set_ana_state(NQN, &at, AnaState::NonOptimized, Some(5)).unwrap();
    let listed = p.t.listener_ana_states(NQN).unwrap().unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        (listed[0].1.get(5), listed[0].1.get(1), listed[0].1.change_count),
        (AnaState::NonOptimized, AnaState::Optimized, 1)
    );
    assert_eq!((listed[1].1.get(5), listed[1].1.change_count), (AnaState::Optimized, 0));
    // The same state again is no change.
    p.t.set_ana_state(NQN, &at, AnaState::NonOptimized, Some(5)).unwrap();
    assert_eq!(p.t.listener_ana_states(NQN).unwrap().unwrap()[0].1.change_count, 1);
}

on_each_sock_impl!(a_namespace_moved_to_another_group_takes_its_state);
fn a_namespace_moved_to_another_group_takes_its_state() {
    use fp_nvme_spec::aer::AEC_NS_ATTRIBUTE;
    let p = two_paths(true);
    let at = listen(p.ports[0]);
    p.t.set_ana_state(NQN, &at, AnaState::Inaccessible, Some(5)).unwrap();
    let mut a = Host::admin(p.ports[0], NQN, 0);
    assert!(a.set_features(FID_ASYNC_EVENT_CONFIG, AEC_ANA_CHANGE | AEC_NS_ATTRIBUTE).status.is_success());
    let mut io = Host::io(p.ports[0], NQN, a.cntlid, 1, Digests::default());
    assert!(io.read(1, 0, 1).0.status.is_success(), "namespace 1 is in group 1, optimized here");
    let aer = park_aer(&mut a);

    // Namespace 1 joins group 5, inaccessible on this listener.
    p.t.set_ns_ana_group(NQN, 1, 5).unwrap();
    // I/O meets the new group's state at once.
    let (cqe, _) = io.read(1, 0, 1);
    assert_eq!(cqe.status, Status { sct: SCT_PATH, sc: SC_ANA_INACCESSIBLE, dnr: false });
    // The namespace attribute notice (as SPDK sends), then the ANA change notice.
    let cqe = a.response();
    assert_eq!((cqe.cid, cqe.dw0), (aer, 0x0004_0002), "Namespace Attribute Changed, log page 04h");
    let aer = park_aer(&mut a);
    let cqe = a.response();
    assert_eq!((cqe.cid, cqe.dw0), (aer, 0x000C_0302), "ANA change notice, log page 0Ch");
    let (_, idns) = a.identify(0, 1);
    assert_eq!(u32::from_le_bytes(idns[IDN_ANAGRPID..IDN_ANAGRPID + 4].try_into().unwrap()), 5);
    let (_, page) = ana_log(&mut a);
    assert_eq!(page.change_count, 2, "the state change and the move");
    assert!(states(&page).contains(&(5, AnaState::Inaccessible, vec![1, 2])), "{:?}", states(&page));
    // The other listener's change count moves too: its log lists the namespace elsewhere.
    assert_eq!(p.t.listener_ana_states(NQN).unwrap().unwrap()[1].1.change_count, 1);

    // Back in its own group; the same group again is no change.
    p.t.set_ns_ana_group(NQN, 1, 1).unwrap();
    assert!(io.read(1, 0, 1).0.status.is_success());
    p.t.set_ns_ana_group(NQN, 1, 1).unwrap();
    assert_eq!(p.t.listener_ana_states(NQN).unwrap().unwrap()[1].1.change_count, 2);
    for (nsid, g, what) in [(1, 0, "anagrpid"), (1, 33, "anagrpid"), (9, 1, "namespace")] {
        let e = p.t.set_ns_ana_group(NQN, nsid, g).unwrap_err();
        assert!(e.to_string().contains(what), "{e}");
    }
}
