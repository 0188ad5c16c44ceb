//! Removing a listener from a subsystem: the controllers that came in through it for that
//! subsystem are disconnected (their hosts see the connection end, and a new Connect there is
//! refused), while the subsystem's other listener and another subsystem on the same address
//! keep serving; the last subsystem to leave an address closes its socket.

use fp_nvme_spec::fabrics::CNTLID_DYNAMIC;
use fp_nvme_spec::tcp::Digests;

use super::api::{free_port, listen, ns};
use super::host::*;
use super::io::{pattern, wait_for};
use crate::testing::LoopbackTarget;
use crate::*;

const NQN: &str = "nqn.2016-06.io.flashpath:paths";
const OTHER: &str = "nqn.2016-06.io.flashpath:neighbour";

/// An enabled controller with I/O queue 1, through `port`.
struct Path {
    admin: Host,
    io: Host,
}

fn path(port: u16, nqn: &str) -> Path {
    let admin = Host::admin(port, nqn, 0);
    let io = Host::io(port, nqn, admin.cntlid, 1, Digests::default());
    Path { admin, io }
}

/// The target's queue pairs of `nqn`, by port of the listener they came in on (sorted).
fn qpair_ports(t: &NvmfTarget, nqn: &str) -> Vec<String> {
    sorted(t.qpairs(nqn).unwrap().into_iter().map(|q| q.listen_address.trsvcid).collect())
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// A target on `cpus` with subsystem `NQN` (any host; ANA reporting as asked) and its
/// namespace 1 over a RAM disk `bdev`, on two listeners: the loopback target's port and
/// another.
fn two_listeners(cpus: &[usize], ana_reporting: bool, bdev: &str) -> (LoopbackTarget, NvmfTarget, u16, u16) {
    let loopback = LoopbackTarget::start(cpus, TransportOptions::default()).unwrap();
    let t = loopback.target().clone();
    t.set_sock_impl(super::sock_impl());
    let (a, b) = (loopback.port(), free_port());
    let spec = SubsystemSpec { nqn: NQN.into(), allow_any_host: true, ana_reporting, ..Default::default() };
    t.create_subsystem(spec).unwrap();
    t.add_namespace(NQN, ns(1, bdev, 2048)).unwrap();
    t.add_listener(NQN, listen(a)).unwrap();
    t.add_listener(NQN, listen(b)).unwrap();
    (loopback, t, a, b)
}

on_each_sock_impl!(removing_a_listener_disconnects_only_what_came_in_through_it);
fn removing_a_listener_disconnects_only_what_came_in_through_it() {
    // Two reactors, so the closes travel to more than one.
    let (_loopback, t, a, b) = two_listeners(&[0, 1], false, "paths0");
    t.create_subsystem(SubsystemSpec { nqn: OTHER.into(), allow_any_host: true, ..Default::default() })
        .unwrap();
    t.add_namespace(OTHER, ns(1, "neighbour0", 2048)).unwrap();
    // The neighbour shares the second address.
    t.add_listener(OTHER, listen(b)).unwrap();

    let mut via_a = path(a, NQN);
    let mut via_b = path(b, NQN);
    let mut neighbour = path(b, OTHER);
    let data = pattern(3, 4096);
    assert!(via_a.io.write(1, 0, &data, false).status.is_success());
    assert!(neighbour.io.write(1, 8, &data, false).status.is_success());
    let (pa, pb) = (a.to_string(), b.to_string());
    assert_eq!(qpair_ports(&t, NQN), sorted(vec![pa.clone(), pa.clone(), pb.clone(), pb.clone()]));

    t.remove_listener(NQN, &listen(b)).unwrap();

    // Both queues of the controller that came in through it end (the reads are bounded by
    // the host's 10 s timeout; a timeout reads as still open).
    assert!(via_b.io.closed().0, "the I/O queue through the removed listener closes");
    assert!(via_b.admin.closed().0, "its admin queue closes");
    assert!(wait_for(|| qpair_ports(&t, NQN) == [pa.clone(), pa.clone()]), "{:?}", qpair_ports(&t, NQN));
    assert_eq!(t.controllers(NQN).unwrap().len(), 1);
    // Reconnecting there is refused: the address still listens (for the neighbour), but not
    // for this subsystem.
    let (_, cqe) = Host::connect_raw(b, Digests::default(), 0, NQN, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert!(!cqe.status.is_success(), "a Connect through the removed listener: {cqe:?}");

    // The other listener's controller serves verified I/O, on both queues.
    let (cqe, got) = via_a.io.read(1, 0, 8);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(got, data);
    assert!(via_a.admin.identify(1, 0).0.status.is_success());
    // So does the neighbour on the same address.
    let (cqe, got) = neighbour.io.read(1, 8, 8);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(got, data);
    assert!(neighbour.admin.identify(1, 0).0.status.is_success());
    assert_eq!(qpair_ports(&t, OTHER), [pb.clone(), pb.clone()]);

    // The last subsystem leaving the address closes it, and its connections.
    t.remove_listener(OTHER, &listen(b)).unwrap();
    assert!(neighbour.io.closed().0);
    assert!(neighbour.admin.closed().0);
    assert!(std::net::TcpStream::connect(("127.0.0.1", b)).is_err(), "the port still listens");

    // Added back, the listener takes Connects again.
    t.add_listener(NQN, listen(b)).unwrap();
    let mut again = path(b, NQN);
    let (cqe, got) = again.io.read(1, 0, 8);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(got, data);
    assert_eq!(qpair_ports(&t, NQN), sorted(vec![pa.clone(), pa, pb.clone(), pb]));
}

on_each_sock_impl!(an_io_queue_through_the_removed_listener_goes_alone);
fn an_io_queue_through_the_removed_listener_goes_alone() {
    // Without ANA reporting a controller's I/O queue may come in on another listener than
    // its admin queue: removing that listener takes the I/O queue only.
    let (_loopback, t, a, b) = two_listeners(&[0], false, "split0");
    let mut admin = Host::admin(a, NQN, 0);
    let mut io_a = Host::io(a, NQN, admin.cntlid, 1, Digests::default());
    let mut io_b = Host::io(b, NQN, admin.cntlid, 2, Digests::default());
    assert!(io_b.write(1, 0, &pattern(9, 512), false).status.is_success());

    t.remove_listener(NQN, &listen(b)).unwrap();
    assert!(io_b.closed().0);
    let (cqe, got) = io_a.read(1, 0, 1);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(got, pattern(9, 512));
    assert!(admin.identify(1, 0).0.status.is_success());
    assert_eq!(qpair_ports(&t, NQN), [a.to_string(), a.to_string()]);
}

on_each_sock_impl!(with_ana_reporting_io_queues_join_their_admin_queues_listener);
fn with_ana_reporting_io_queues_join_their_admin_queues_listener() {
    let (_loopback, _, a, b) = two_listeners(&[0], true, "ana-split0");
    let admin = Host::admin(a, NQN, 0);
    let (_, cqe) = Host::connect_raw(b, Digests::default(), 1, NQN, HOSTNQN, admin.cntlid, 0);
    assert!(!cqe.status.is_success(), "an I/O queue on the other listener: {cqe:?}");
    let _io = Host::io(a, NQN, admin.cntlid, 1, Digests::default());
}

on_each_sock_impl!(a_queue_on_its_way_when_its_listener_goes_closes_on_arrival);
fn a_queue_on_its_way_when_its_listener_goes_closes_on_arrival() {
    let (_loopback, t, a, b) = two_listeners(&[0], false, "arrival0");
    // Hold the one reactor, so a queue accepted now waits in its inbox to be set up.
    let (release, held) = std::sync::mpsc::channel::<()>();
    t.inner.reactors[0].send(move |_| {
        let _ = held.recv_timeout(std::time::Duration::from_secs(10));
    });
    let (mut late, cqe) = Host::connect_raw(b, Digests::default(), 0, NQN, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert!(cqe.status.is_success(), "{cqe:?}");
    // Its controller is registered, its queue not yet: the removal finds nothing to close.
    t.remove_listener(NQN, &listen(b)).unwrap();
    release.send(()).unwrap();
    assert!(late.closed().0, "the queue that arrived after its listener went is closed");
    assert!(wait_for(|| t.controllers(NQN).unwrap().is_empty()), "{:?}", t.controllers(NQN).unwrap().len());
    // The other listener serves.
    let mut via_a = path(a, NQN);
    assert!(via_a.io.read(1, 0, 1).0.status.is_success());
}
