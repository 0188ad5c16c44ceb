//! Multipath over the TCP transport: two controllers of one flashpath target subsystem, each
//! reached through a [`Relay`] (a path is cut by closing its relay's
//! connections and refusing new ones, restored by accepting again). The namespace sits on
//! an error bdev, so a write can be held at the target while its path is cut.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fp_bdev::conformance::{read_range, write_range, IoBuf};
use fp_bdev::{Bdev, BlockDevice, ErrorDevice, ErrorType, Injection, IoChannel, IoOp, IoStatus, RamDevice};
use fp_nvme_spec::log_page::AnaState;
use fp_nvmf::testing::{self, LoopbackTarget};
use fp_nvmf::{ListenAddress, SubsystemSpec, TransportOptions};

use super::core_fake::{test_options, wait_for};
use crate::bdev::multipath::UNREPORTED_CQT_MS;
use crate::bdev::paths::{Policy, Selector};
use crate::ctrlr::{self, Controller};
use crate::tcp::{Adrfam, TcpTarget, TcpTransport};
use crate::testing::Relay;

/// The keep-alive timeout the controllers ask for: with CQT unreported, a lost path's
/// requests move after this plus [`UNREPORTED_CQT_MS`].
const KATO_MS: u32 = 1000;

fn target() -> &'static LoopbackTarget {
    static T: OnceLock<LoopbackTarget> = OnceLock::new();
    T.get_or_init(|| LoopbackTarget::start(&[0], TransportOptions::default()).unwrap())
}

/// A subsystem whose namespace 1 is an error bdev over RAM, on the target's port.
fn subsystem(blocks: u64) -> (String, Arc<ErrorDevice>) {
    let (nqn, err) = bare_subsystem(blocks, false);
    target().target().add_listener(&nqn, target().listen_address()).unwrap();
    (nqn, err)
}

/// A subsystem (with ANA reporting when `ana`) whose namespace 1 is an error bdev over RAM,
/// on no listener yet.
fn bare_subsystem(blocks: u64, ana: bool) -> (String, Arc<ErrorDevice>) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nqn = format!("nqn.2016-06.io.flashpath:mpath-{n}");
    let ram: Bdev = Arc::new(RamDevice::new(&format!("mp-ram{n}"), 4096, blocks).unwrap());
    let err = Arc::new(ErrorDevice::new(&format!("EE_mp-ram{n}"), ram).unwrap());
    let t = target().target();
    let spec =
        SubsystemSpec { nqn: nqn.clone(), allow_any_host: true, ana_reporting: ana, ..Default::default() };
    t.create_subsystem(spec).unwrap();
    t.add_namespace(&nqn, testing::namespace(1, err.clone(), &format!("EE_mp-ram{n}"))).unwrap();
    (nqn, err)
}

/// A controller of `nqn` through `relay`, reconnecting every second for ever.
fn attach(nqn: &str, relay: &Relay, name: &str) -> Arc<dyn Controller> {
    let transport = TcpTransport::new(TcpTarget {
        traddr: "127.0.0.1".into(),
        trsvcid: relay.port(),
        adrfam: Adrfam::IPv4,
        subnqn: nqn.into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000d0".into(),
        hostid: [0xd0; 16],
        hdgst: false,
        ddgst: false,
        kato_ms: KATO_MS,
        dhchap: Default::default(),
        tls: None,
    });
    let (mut opts, mut global) = test_options(name);
    global.keep_alive_timeout_ms = KATO_MS;
    opts.ctrlr_loss_timeout_sec = -1;
    opts.reconnect_delay_sec = 1;
    ctrlr::attach(transport, opts, global, Box::new(|_| {})).expect("attach")
}

/// Two paths to one namespace: the first controller's namespace with the second's as its
/// second path (what `bdev_nvme_attach_controller -x multipath` builds).
struct TwoPaths {
    relays: [Relay; 2],
    ctrlrs: [Arc<dyn Controller>; 2],
    ns: Arc<crate::bdev::NvmeNamespace>,
    err: Arc<ErrorDevice>,
}

/// The controllers are detached at the end of the test (after its channel, declared later,
/// is dropped).
impl Drop for TwoPaths {
    fn drop(&mut self) {
        for c in &self.ctrlrs {
            c.detach();
        }
    }
}

fn two_paths(name: &str) -> TwoPaths {
    let (nqn, err) = subsystem(256);
    let relays = [Relay::start(target().port()).unwrap(), Relay::start(target().port()).unwrap()];
    join_paths(name, &nqn, relays, err)
}

/// A subsystem with ANA reporting whose namespace 1 (ANA group 1) is an error bdev over RAM,
/// on two listeners of its own (ANA states are per listener); returns them with it.
fn ana_subsystem(blocks: u64) -> (String, Arc<ErrorDevice>, [ListenAddress; 2]) {
    let (nqn, err) = bare_subsystem(blocks, true);
    let listeners = [(); 2].map(|_| {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        ListenAddress { trsvcid: port.to_string(), ..target().listen_address() }
    });
    for l in &listeners {
        target().target().add_listener(&nqn, l.clone()).unwrap();
    }
    (nqn, err, listeners)
}

/// Two paths through the two listeners of an [`ana_subsystem`].
fn ana_paths(name: &str) -> (TwoPaths, String, [ListenAddress; 2]) {
    let (nqn, err, listeners) = ana_subsystem(256);
    let relays = listeners.clone().map(|l| Relay::start(l.trsvcid.parse().unwrap()).unwrap());
    (join_paths(name, &nqn, relays, err), nqn, listeners)
}

fn join_paths(name: &str, nqn: &str, relays: [Relay; 2], err: Arc<ErrorDevice>) -> TwoPaths {
    let nqn = nqn.to_string();
    let ctrlrs =
        [attach(&nqn, &relays[0], &format!("{name}a")), attach(&nqn, &relays[1], &format!("{name}b"))];
    let ns = ctrlrs[0].namespaces()[0].clone();
    let second = ctrlrs[1].namespaces()[0].own_path().unwrap();
    ns.paths().set_multipath();
    ns.paths().add(second).unwrap();
    TwoPaths { relays, ctrlrs, ns, err }
}

fn submitted(c: &Arc<dyn Controller>) -> u64 {
    c.stats().submitted
}

/// Polls until `ch` runs dry, returning the completions; bounded generously.
fn drain(ch: &mut dyn IoChannel, done: &mut Vec<(u32, IoStatus, Instant)>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while ch.in_flight() > 0 {
        assert!(Instant::now() < deadline, "requests still in flight after 60 s");
        ch.poll(&mut |tag, status| done.push((tag, status, Instant::now())));
    }
}

/// Polls `ch` for a while (enough rounds for a sweep: idle paths seen, views published).
pub(super) fn spin(ch: &mut dyn IoChannel, rounds: usize) {
    for _ in 0..rounds {
        ch.poll(&mut |_, _| {});
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[test]
fn active_active_round_robin_spreads_io_and_active_passive_keeps_to_the_first_path() {
    let t = two_paths("mprr");
    let mut ch = t.ns.open_channel().unwrap();
    spin(&mut *ch, 130);
    let before = [submitted(&t.ctrlrs[0]), submitted(&t.ctrlrs[1])];
    t.ns.paths().set_policy(Policy::ActiveActive { selector: Selector::RoundRobin, rr_min_io: 1 });
    for round in 0..32u32 {
        let data: Vec<u8> = (0..4096).map(|i| (i as u32 ^ round.wrapping_mul(2654435761)) as u8).collect();
        write_range(&mut *ch, u64::from(round) * 4096, &data);
        assert!(read_range(&mut *ch, u64::from(round) * 4096, 4096) == data, "round {round}");
    }
    spin(&mut *ch, 200);
    let rr = [submitted(&t.ctrlrs[0]) - before[0], submitted(&t.ctrlrs[1]) - before[1]];
    // One request each in turn: 64 requests, 32 per path.
    assert_eq!(rr, [32, 32], "round robin over two paths");

    t.ns.paths().set_policy(Policy::ActivePassive);
    for round in 0..16u32 {
        write_range(&mut *ch, u64::from(round) * 4096, &[round as u8; 4096]);
    }
    spin(&mut *ch, 200);
    let ap = [submitted(&t.ctrlrs[0]) - before[0] - rr[0], submitted(&t.ctrlrs[1]) - before[1] - rr[1]];
    assert_eq!(ap, [16, 0], "active_passive: the first path only");

    t.ns.paths().set_policy(Policy::ActiveActive { selector: Selector::QueueDepth, rr_min_io: 1 });
    for round in 0..8u32 {
        assert!(read_range(&mut *ch, u64::from(round) * 4096, 4096) == [round as u8; 4096]);
    }
    let views = t.ns.paths().channel_views();
    assert_eq!(views.len(), 1);
    let connected: Vec<u64> = views[0].connected.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    assert!(
        t.ns.paths().ids().iter().all(|id| connected.contains(id)),
        "both paths connected: {connected:?}"
    );
}

#[test]
fn a_path_cut_under_held_writes_fails_over_after_the_quiesce_bound_and_fails_back() {
    const WRITES: u32 = 8;
    let t = two_paths("mpfo");
    let mut ch = t.ns.open_channel().unwrap();
    let ids = t.ns.paths().ids();
    spin(&mut *ch, 130);
    let view = t.ns.paths().channel_views().pop().unwrap();
    assert_eq!(view.current.load(Ordering::Relaxed), ids[0], "active_passive starts on the first path");

    // The writes reach the target through the first path and are held there.
    let pending = Injection {
        error_type: ErrorType::Pending,
        num: u64::from(WRITES),
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    t.err.inject(&[1], pending).unwrap();
    let mut bufs: Vec<IoBuf> = (0..WRITES).map(|_| IoBuf::new(4096, true)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        b.bytes_mut().fill(0xa0 + i as u8);
        ch.submit(&b.request(i as u32, IoOp::Write, i as u64 * 4096)).unwrap();
    }
    let mut done = Vec::new();
    wait_for("the target to hold every write", || {
        ch.poll(&mut |tag, status| done.push((tag, status, Instant::now())));
        t.err.injections()[1].is_none_or(|inj| inj.num == 0)
    });
    assert!(done.is_empty(), "held writes completed: {done:?}");
    let second_before = submitted(&t.ctrlrs[1]);

    // The first path goes; the target lets the held writes land (on the old, dead
    // association) before the quiesce bound passes; only then may they be sent again.
    let cut_at = Instant::now();
    t.relays[0].cut();
    let bound = Duration::from_millis(u64::from(KATO_MS) + UNREPORTED_CQT_MS);
    let resume_by = cut_at + bound / 4;
    while Instant::now() < resume_by {
        ch.poll(&mut |tag, status| done.push((tag, status, Instant::now())));
    }
    assert!(done.is_empty(), "writes completed before the quiesce bound: {done:?}");
    t.err.resume_pending();
    drain(&mut *ch, &mut done);
    assert_eq!(done.len(), WRITES as usize);
    for &(tag, status, at) in &done {
        assert_eq!(status, IoStatus::Success, "write {tag}");
        assert!(
            at >= cut_at + bound,
            "write {tag} retried {:?} after the cut, before the bound {bound:?}",
            at - cut_at
        );
    }
    assert_eq!(view.failovers.load(Ordering::Relaxed), u64::from(WRITES));
    spin(&mut *ch, 130);
    assert!(
        submitted(&t.ctrlrs[1]) >= second_before + u64::from(WRITES),
        "the retries went through the second path"
    );
    assert_eq!(view.current.load(Ordering::Relaxed), ids[1], "the second path is current");
    for i in 0..WRITES {
        assert!(read_range(&mut *ch, u64::from(i) * 4096, 4096) == [0xa0 + i as u8; 4096], "block {i}");
    }

    // Failback: the first path reconnects and takes the I/O again.
    t.relays[0].restore();
    wait_for("the first path to reconnect", || {
        spin(&mut *ch, 1);
        t.ctrlrs[0].info().ctrlrs[0].state == "enabled"
    });
    wait_for("the first path to be current again", || {
        spin(&mut *ch, 70);
        view.current.load(Ordering::Relaxed) == ids[0]
    });
    spin(&mut *ch, 130);
    let first_before = submitted(&t.ctrlrs[0]);
    for i in 0..4u64 {
        write_range(&mut *ch, i * 4096, &[0x5a; 4096]);
    }
    spin(&mut *ch, 130);
    assert_eq!(submitted(&t.ctrlrs[0]), first_before + 4, "failback to the first path");
}

#[test]
fn with_every_path_down_the_paths_own_rules_decide() {
    let t = two_paths("mpall");
    let mut ch = t.ns.open_channel().unwrap();
    spin(&mut *ch, 130);
    t.relays[0].cut();
    t.relays[1].cut();
    // No path comes back within the wait: the write is held (reconnecting for ever, no fast
    // failure), not failed.
    let mut b = IoBuf::new(4096, true);
    ch.submit(&b.request(7, IoOp::Write, 0)).unwrap();
    let mut done = Vec::new();
    let until = Instant::now() + Duration::from_millis(u64::from(KATO_MS) + UNREPORTED_CQT_MS + 500);
    while Instant::now() < until {
        ch.poll(&mut |tag, status| done.push((tag, status, Instant::now())));
    }
    assert!(done.is_empty(), "a write failed or completed with every path down: {done:?}");
    // The second path returns: the write goes through it.
    t.relays[1].restore();
    drain(&mut *ch, &mut done);
    assert_eq!(done.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(), vec![(7, IoStatus::Success)]);
}

#[test]
fn an_open_channel_follows_paths_added_and_removed() {
    let t = two_paths("mpadd");
    // Start with the first path only; the second joins while the channel is open.
    let second = t.ns.paths().ids()[1];
    t.ns.paths().remove(second);
    let mut ch = t.ns.open_channel().unwrap();
    t.ns.paths().set_policy(Policy::ActiveActive { selector: Selector::RoundRobin, rr_min_io: 1 });
    spin(&mut *ch, 130);
    let before = [submitted(&t.ctrlrs[0]), submitted(&t.ctrlrs[1])];
    for i in 0..8u64 {
        write_range(&mut *ch, i * 4096, &[1; 4096]);
    }
    spin(&mut *ch, 130);
    assert_eq!(submitted(&t.ctrlrs[1]), before[1], "a path not in the set took I/O");
    t.ns.paths().add(t.ctrlrs[1].namespaces()[0].own_path().unwrap()).unwrap();
    // The channel asks for the new path's queue pair at a sweep and takes it at a later one.
    let view = t.ns.paths().channel_views().pop().unwrap();
    wait_for("the added path to be connected on the channel", || {
        spin(&mut *ch, 70);
        view.connected.iter().any(|c| c.load(Ordering::Relaxed) == second)
    });
    spin(&mut *ch, 130);
    let mid = [submitted(&t.ctrlrs[0]), submitted(&t.ctrlrs[1])];
    for i in 0..8u64 {
        write_range(&mut *ch, i * 4096, &[2; 4096]);
    }
    spin(&mut *ch, 130);
    assert_eq!(
        [submitted(&t.ctrlrs[0]) - mid[0], submitted(&t.ctrlrs[1]) - mid[1]],
        [4, 4],
        "round robin over the path added"
    );
    // The first path leaves the set: everything goes through the second.
    t.ns.paths().remove(t.ns.paths().ids()[0]);
    spin(&mut *ch, 130);
    let last = [submitted(&t.ctrlrs[0]), submitted(&t.ctrlrs[1])];
    for i in 0..8u64 {
        assert!(read_range(&mut *ch, i * 4096, 4096) == [2; 4096]);
    }
    spin(&mut *ch, 130);
    assert_eq!([submitted(&t.ctrlrs[0]) - last[0], submitted(&t.ctrlrs[1]) - last[1]], [0, 8]);
}

/// Writes `n` blocks of `byte` (verified by reading back) and returns the commands each path
/// submitted meanwhile (reads included).
fn writes_per_path(t: &TwoPaths, ch: &mut dyn IoChannel, n: u64, byte: u8) -> [u64; 2] {
    spin(ch, 130);
    let before = [submitted(&t.ctrlrs[0]), submitted(&t.ctrlrs[1])];
    for i in 0..n {
        write_range(ch, i * 4096, &[byte; 4096]);
        assert!(read_range(ch, i * 4096, 4096) == [byte; 4096], "block {i}");
    }
    spin(ch, 130);
    [submitted(&t.ctrlrs[0]) - before[0], submitted(&t.ctrlrs[1]) - before[1]]
}

/// Path `i`'s ANA state as `bdev_nvme_get_io_paths` shows it.
fn shown(t: &TwoPaths, i: usize) -> AnaState {
    t.ns.path_info(&t.ns.paths().list()[i]).ana_state
}

#[test]
fn ana_states_of_flashpath_listeners_steer_io_and_fail_back() {
    let (t, nqn, listeners) = ana_paths("mpana");
    let target = target().target();
    let mut ch = t.ns.open_channel().unwrap();
    spin(&mut *ch, 130);
    let ids = t.ns.paths().ids();
    assert_eq!((shown(&t, 0), shown(&t, 1)), (AnaState::Optimized, AnaState::Optimized));
    let view = t.ns.paths().channel_views().pop().unwrap();
    assert_eq!(view.current.load(Ordering::Relaxed), ids[0]);

    // Writes held at the target through the first path, then its listener turns
    // inaccessible: the held writes were accepted before the change and complete there; the
    // writes after it go through the second path, none failing.
    let pending = Injection {
        error_type: ErrorType::Pending,
        num: 4,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    t.err.inject(&[1], pending).unwrap();
    let mut bufs: Vec<IoBuf> = (0..4).map(|_| IoBuf::new(4096, true)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        b.bytes_mut().fill(0xb0 + i as u8);
        ch.submit(&b.request(i as u32, IoOp::Write, i as u64 * 4096)).unwrap();
    }
    let mut done = Vec::new();
    wait_for("the target to hold every write", || {
        ch.poll(&mut |tag, status| done.push((tag, status, Instant::now())));
        t.err.injections()[1].is_none_or(|inj| inj.num == 0)
    });
    target.set_ana_state(&nqn, &listeners[0], AnaState::Inaccessible, None).unwrap();
    wait_for("the first path shown inaccessible", || {
        spin(&mut *ch, 1);
        shown(&t, 0) == AnaState::Inaccessible
    });
    t.err.resume_pending();
    drain(&mut *ch, &mut done);
    assert!(done.iter().all(|d| d.1 == IoStatus::Success), "{done:?}");
    spin(&mut *ch, 130);
    assert_eq!(view.current.load(Ordering::Relaxed), ids[1], "the second path is current");
    assert_eq!(writes_per_path(&t, &mut *ch, 8, 0xc0), [0, 16], "nothing to the inaccessible path");

    // Optimized again: failback.
    target.set_ana_state(&nqn, &listeners[0], AnaState::Optimized, None).unwrap();
    wait_for("the first path current again", || {
        spin(&mut *ch, 70);
        view.current.load(Ordering::Relaxed) == ids[0]
    });
    assert_eq!(writes_per_path(&t, &mut *ch, 4, 0xd0), [8, 0], "failback");

    // Active-active with the first path non-optimized: everything to the second.
    t.ns.paths().set_policy(Policy::ActiveActive { selector: Selector::RoundRobin, rr_min_io: 1 });
    target.set_ana_state(&nqn, &listeners[0], AnaState::NonOptimized, None).unwrap();
    wait_for("the first path shown non-optimized", || {
        spin(&mut *ch, 1);
        shown(&t, 0) == AnaState::NonOptimized
    });
    assert_eq!(writes_per_path(&t, &mut *ch, 8, 0xe0), [0, 16], "the optimized path only");
}
