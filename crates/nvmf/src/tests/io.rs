//! Queue pairs end to end: I/O on several queues over two reactors, with in-capsule and R2T
//! data and digests; keep-alive expiry; a subsystem deleted under a connected host; a resized
//! namespace reaching a parked AER.

use std::time::{Duration, Instant};

use fp_nvme_spec::fabrics::DISCOVERY_NQN;
use fp_nvme_spec::tcp::Digests;
use fp_nvme_spec::*;

use super::api::{free_port, listen, ns, ram};
use super::host::*;
use crate::testing::LoopbackTarget;
use crate::*;

pub(crate) const NQN: &str = "nqn.2016-06.io.flashpath:test";

pub(crate) struct Target {
    pub t: NvmfTarget,
    pub port: u16,
    /// Stops the target and its reactors when the test drops it.
    _loopback: LoopbackTarget,
}

/// A target on two reactors with one subsystem (any host) of one 4 MiB RAM namespace.
pub(crate) fn target() -> Target {
    // A socket priority any user may set, so the option is exercised.
    let loopback =
        LoopbackTarget::start(&[0, 1], TransportOptions { sock_priority: 2, ..Default::default() }).unwrap();
    loopback.target().set_sock_impl(super::sock_impl());
    loopback.add_subsystem(NQN, ram("ram0", 8192), "ram0").unwrap();
    Target { t: loopback.target().clone(), port: loopback.port(), _loopback: loopback }
}

pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Waits for `cond`, at most 5 s.
pub(crate) fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

on_each_sock_impl!(io_on_several_queues_and_reactors);
fn io_on_several_queues_and_reactors() {
    let tg = target();
    let mut admin = Host::admin(tg.port, NQN, 0);
    let (cqe, id) = admin.identify(1, 0);
    assert!(cqe.status.is_success());
    assert_eq!(id.len(), 4096);
    assert_eq!(u16::from_le_bytes([id[78], id[79]]), admin.cntlid);
    let (cqe, idns) = admin.identify(0, 1);
    assert!(cqe.status.is_success());
    assert_eq!(u64::from_le_bytes(idns[0..8].try_into().unwrap()), 8192);

    let both = Digests { header: true, data: true };
    let mut queues: Vec<Host> = (1..=3)
        .map(|q| Host::io(tg.port, NQN, admin.cntlid, q, if q == 2 { both } else { Digests::default() }))
        .collect();
    // The same queue ID twice is refused.
    let (_, cqe) = Host::connect_raw(tg.port, Digests::default(), 1, NQN, HOSTNQN, admin.cntlid, 0);
    assert_eq!(cqe.status, Status::command_specific(SC_CONNECT_INVALID_PARAMETERS));
    // Queues register on their reactor just after their Connect is answered.
    assert!(wait_for(|| tg.t.qpairs(NQN).unwrap().len() == 4));
    let qp = tg.t.qpairs(NQN).unwrap();
    let threads: std::collections::BTreeSet<_> = qp.iter().map(|q| q.thread.clone()).collect();
    assert_eq!(threads.len(), 2, "queues on both reactors: {qp:?}");

    for (k, q) in queues.iter_mut().enumerate() {
        let base = k as u64 * 1024;
        // In the capsule (4 KiB), by one R2T (64 KiB), by R2T in several H2CData (128 KiB).
        let small = pattern(k as u8, 4096);
        assert!(q.write(1, base, &small, false).status.is_success());
        let mid = pattern(k as u8 + 10, 64 << 10);
        assert!(q.write(1, base + 8, &mid, true).status.is_success());
        q.h2c_chunk = 32 << 10;
        let big = pattern(k as u8 + 20, 128 << 10);
        assert!(q.write(1, base + 256, &big, false).status.is_success());
        let (cqe, got) = q.read(1, base, 8);
        assert!(cqe.status.is_success());
        assert_eq!(got, small);
        let (_, got) = q.read(1, base + 8, 128);
        assert_eq!(got, mid);
        let (_, got) = q.read(1, base + 256, 256);
        assert_eq!(got, big);
    }
    let q = &mut queues[0];
    // Flush, Write Zeroes, Dataset Management (deallocate).
    let s = q.rw_sqe(NVM_FLUSH, 1, 0, 1);
    assert!(q.run(s, &[], 0).0.status.is_success());
    let s = q.rw_sqe(NVM_WRITE_ZEROES, 1, 8, 4);
    assert!(q.run(s, &[], 0).0.status.is_success());
    let (_, got) = q.read(1, 8, 4);
    assert!(got.iter().all(|&b| b == 0));
    let mut s = q.rw_sqe(NVM_DATASET_MANAGEMENT, 1, 0, 1);
    set_cdw(&mut s, 10, 1);
    set_cdw(&mut s, 11, 1 << 2);
    let mut ranges = vec![0u8; 32];
    ranges[4..8].copy_from_slice(&16u32.to_le_bytes());
    ranges[8..16].copy_from_slice(&100u64.to_le_bytes());
    ranges[20..24].copy_from_slice(&8u32.to_le_bytes());
    ranges[24..32].copy_from_slice(&200u64.to_le_bytes());
    assert!(q.run(s, &ranges, 0).0.status.is_success());
    // Errors: past the end, an unknown namespace, an unknown opcode.
    let (cqe, _) = q.read(1, 8190, 4);
    assert_eq!(cqe.status, Status::generic(SC_LBA_OUT_OF_RANGE));
    let (cqe, _) = q.read(7, 0, 1);
    assert_eq!(cqe.status, Status::generic(SC_INVALID_NAMESPACE));
    let s = q.rw_sqe(0x7E, 1, 0, 1);
    assert_eq!(q.run(s, &[], 0).0.status, Status::generic(SC_INVALID_OPCODE));

    let st = &tg.t.stats()[0];
    assert_eq!((st.controllers, st.qpairs), (1, 4));
    let n = &st.namespaces[0];
    assert_eq!(n.write_ops, 9);
    assert_eq!(n.bytes_written, 3 * (4096 + (64 << 10) + (128 << 10)));
    assert_eq!(n.read_ops, 10);
    assert_eq!(n.other_ops, 3);
    // The two on namespace 1 (an unknown namespace has no counters).
    assert_eq!(n.errors, 2);
    let c = tg.t.controllers(NQN).unwrap();
    assert_eq!((c[0].cntlid, c[0].num_io_qpairs), (admin.cntlid, 3));
    assert_eq!(c[0].hostnqn, HOSTNQN);
}

on_each_sock_impl!(keep_alive_expiry_tears_the_controller_down);
fn keep_alive_expiry_tears_the_controller_down() {
    let tg = target();
    let mut admin = Host::admin(tg.port, NQN, 300);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    assert!(q.write(1, 0, &pattern(1, 512), false).status.is_success());
    // No Keep Alive: the controller goes, with its I/O queue.
    admin.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    q.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    assert!(admin.closed().0);
    assert!(q.closed().0);
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(wait_for(|| tg.t.controllers(NQN).unwrap().is_empty()));
    // A controller that sends Keep Alive stays.
    let mut admin = Host::admin(tg.port, NQN, 300);
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(100));
        let s = sqe(ADMIN_KEEP_ALIVE, admin.next_cid(), 0);
        assert!(admin.run(s, &[], 0).0.status.is_success());
    }
    assert_eq!(tg.t.controllers(NQN).unwrap().len(), 1);
}

on_each_sock_impl!(subsystem_deleted_under_a_connected_host);
fn subsystem_deleted_under_a_connected_host() {
    let tg = target();
    let mut admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    assert!(q.write(1, 0, &pattern(3, 4096), false).status.is_success());
    tg.t.remove_namespace(NQN, 1).unwrap();
    // Commands to the namespace gone: Invalid Namespace.
    let (cqe, _) = q.read(1, 0, 1);
    assert_eq!(cqe.status, Status::generic(SC_INVALID_NAMESPACE));
    tg.t.delete_subsystem(NQN).unwrap();
    admin.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(admin.closed().0);
    assert!(q.closed().0);
    // Gone for new hosts too (the listener closed with it).
    assert!(std::net::TcpStream::connect(("127.0.0.1", tg.port)).is_err());
}

on_each_sock_impl!(resized_namespace_reaches_a_parked_aer);
fn resized_namespace_reaches_a_parked_aer() {
    let tg = target();
    let mut admin = Host::admin(tg.port, NQN, 0);
    assert!(admin.set_features(0x0B, 1 << 8).status.is_success());
    let aer_cid = admin.next_cid();
    admin.send_capsule(&sqe(ADMIN_ASYNC_EVENT_REQUEST, aer_cid, 0), &[]);
    // Parked: other commands still answer.
    let (cqe, _) = admin.identify(1, 0);
    assert!(cqe.status.is_success());
    tg.t.namespace_resized(NQN, 1);
    let cqe = admin.response();
    assert_eq!(cqe.cid, aer_cid);
    // Notice (2), namespace attribute changed (0), changed namespace list log (4).
    assert_eq!(cqe.dw0, 0x0004_0002);
    // A namespace added later: the host's next AER hears of it too (after reading the log).
    let mut s = sqe(ADMIN_GET_LOG_PAGE, admin.next_cid(), 0xFFFF_FFFF);
    set_cdw(&mut s, 10, 4 | (((4096 / 4) - 1) << 16));
    let (cqe, log) = admin.run(s, &[], 4096);
    assert!(cqe.status.is_success());
    assert_eq!(u32::from_le_bytes(log[0..4].try_into().unwrap()), 1);
    let aer_cid = admin.next_cid();
    admin.send_capsule(&sqe(ADMIN_ASYNC_EVENT_REQUEST, aer_cid, 0), &[]);
    tg.t.add_namespace(NQN, ns(2, "ram1", 1024)).unwrap();
    let cqe = admin.response();
    assert_eq!((cqe.cid, cqe.dw0), (aer_cid, 0x0004_0002));
}

on_each_sock_impl!(remove_namespace_waits_for_its_io_in_flight);
fn remove_namespace_waits_for_its_io_in_flight() {
    use fp_bdev::{Bdev, DelayDevice, DelayLatency, Disk, RamDevice};
    let tg = target();
    let slow = Duration::from_millis(300);
    let base: Bdev = std::sync::Arc::new(RamDevice::new("ram2", 512, 1024).unwrap());
    let latency = DelayLatency { avg_read: slow, p99_read: slow, avg_write: slow, p99_write: slow };
    // Counted, so the test sees when the write is in flight and when it completed.
    let disk = Disk::new(std::sync::Arc::new(DelayDevice::new("slow", base, latency).unwrap()), true);
    let bdev: Bdev = std::sync::Arc::new(disk.clone());
    let spec = NamespaceSpec {
        nsid: 2,
        bdev,
        bdev_name: "slow".into(),
        uuid: None,
        nguid: None,
        eui64: None,
        read_only: false,
        anagrpid: None,
    };
    tg.t.add_namespace(NQN, spec).unwrap();
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    // A write in flight (300 ms) when the namespace is removed.
    let mut s = q.rw_sqe(NVM_WRITE, 2, 0, 8);
    set_sgl(&mut s, SGL_IN_CAPSULE, 4096);
    q.send_capsule(&s, &pattern(9, 4096));
    assert!(
        wait_for(|| disk.stats().queue_depth == 1),
        "the write never reached the bdev: {:?}",
        disk.stats()
    );
    let start = Instant::now();
    tg.t.remove_namespace(NQN, 2).unwrap();
    let waited = start.elapsed();
    // Had it not waited, the write (300 ms at the bdev) would still be in flight here.
    let after = disk.stats();
    let write = after.ops[fp_bdev::disk::op_index(fp_bdev::IoOp::Write)].ops;
    assert_eq!((after.queue_depth, write), (0, 1), "returned after {waited:?}, with the write in flight");
    // The write finished (successfully) before the namespace went; later commands: Invalid Namespace.
    let cqe = q.response();
    assert_eq!((cqe.cid, cqe.status), (s.cid(), Status::SUCCESS));
    let (cqe, _) = q.read(2, 0, 1);
    assert_eq!(cqe.status, Status::generic(SC_INVALID_NAMESPACE));
    // Namespace 1 is untouched.
    assert!(q.write(1, 0, &pattern(1, 512), false).status.is_success());
}

on_each_sock_impl!(dataset_management_range_errors_answer_once);
fn dataset_management_range_errors_answer_once() {
    let tg = target();
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    for _ in 0..40 {
        // A good range, then one past the end: LBA Out of Range, answered exactly once.
        let mut s = q.rw_sqe(NVM_DATASET_MANAGEMENT, 1, 0, 1);
        set_cdw(&mut s, 10, 1);
        set_cdw(&mut s, 11, 1 << 2);
        let mut ranges = vec![0u8; 32];
        ranges[4..8].copy_from_slice(&8u32.to_le_bytes());
        ranges[20..24].copy_from_slice(&16u32.to_le_bytes());
        ranges[24..32].copy_from_slice(&8190u64.to_le_bytes());
        assert_eq!(q.run(s, &ranges, 0).0.status, Status::generic(SC_LBA_OUT_OF_RANGE));
        // The queue (32 slots) keeps working: no slot answered twice or lost.
        let data = pattern(7, 512);
        assert!(q.write(1, 100, &data, false).status.is_success());
        assert_eq!(q.read(1, 100, 1).1, data);
    }
}

on_each_sock_impl!(stop_closes_listeners_and_hosts);
fn stop_closes_listeners_and_hosts() {
    let tg = target();
    let mut admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    assert!(q.write(1, 0, &pattern(5, 512), false).status.is_success());
    tg.t.stop();
    assert!(admin.closed().0);
    assert!(q.closed().0);
    assert!(std::net::TcpStream::connect(("127.0.0.1", tg.port)).is_err());
    assert!(wait_for(|| tg.t.controllers(NQN).unwrap().is_empty()));
}

on_each_sock_impl!(discovery_listens_alone);
/// The discovery subsystem on a listener of its own (SPDK's `nvmf_subsystem_add_listener
/// discovery ...`): a discovery controller connects there and reads the log, which names the
/// NVM subsystem at its own port; an NVM Connect there is refused; removing the listener closes
/// the port.
fn discovery_listens_alone() {
    use fp_nvme_spec::log_page::*;
    let tg = target();
    let dport = free_port();
    tg.t.add_listener(DISCOVERY_NQN, listen(dport)).unwrap();
    let subs = serde_json::to_value(tg.t.subsystems()).unwrap();
    let ports: Vec<&str> = subs[0]["listen_addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["trsvcid"].as_str().unwrap())
        .collect();
    assert!(
        ports.contains(&dport.to_string().as_str()) && ports.contains(&tg.port.to_string().as_str()),
        "{subs}"
    );

    let mut d = Host::admin(dport, DISCOVERY_NQN, 0);
    let len = DISC_HEADER_LEN + DISC_ENTRY_LEN;
    let mut s = sqe(ADMIN_GET_LOG_PAGE, d.next_cid(), 0);
    set_cdw(&mut s, 10, u32::from(LID_DISCOVERY) | (((len / 4 - 1) as u32) << 16));
    let (cqe, log) = d.run(s, &[], len);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(u64::from_le_bytes(log[DISC_NUMREC..DISC_NUMREC + 8].try_into().unwrap()), 1);
    let entry = &log[DISC_HEADER_LEN..];
    let field = |at: usize, n: usize| {
        String::from_utf8_lossy(&entry[at..at + n]).trim_end_matches([' ', '\0']).to_string()
    };
    assert_eq!(field(DE_SUBNQN, 256), NQN);
    assert_eq!(field(DE_TRSVCID, 32), tg.port.to_string());

    // Only discovery controllers connect on the discovery subsystem's own listener.
    let (_, cqe) = Host::connect_raw(
        dport,
        Digests::default(),
        0,
        NQN,
        HOSTNQN,
        fp_nvme_spec::fabrics::CNTLID_DYNAMIC,
        0,
    );
    assert!(!cqe.status.is_success(), "{cqe:?}");

    drop(d);
    tg.t.remove_listener(DISCOVERY_NQN, &listen(dport)).unwrap();
    assert!(wait_for(|| std::net::TcpStream::connect(("127.0.0.1", dport)).is_err()));
    // The NVM subsystem's listener still serves.
    let mut admin = Host::admin(tg.port, NQN, 0);
    assert!(admin.identify(1, 0).0.status.is_success());
}
