//! The TCP transport against flashpath's own NVMe/TCP target in process (`fp_nvmf`, a RAM
//! namespace on two reactors), and against a raw hostile target (a listener thread sending
//! crafted PDUs) for each kind of bad input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::{Bdev, Iovecs, RamDevice, SubmitError};
use fp_nvme_spec::{Status, SC_LBA_OUT_OF_RANGE};
use fp_nvmf::testing::LoopbackTarget;
use fp_nvmf::{ListenAddress, TransportOptions};

use super::*;
use crate::cmd;
use crate::transport::{AdminData, AdminQueue, IoQueue, Transport};
use crate::NvmeError;

pub(super) const NQN: &str = "nqn.2016-06.io.flashpath:tcp-host";
const BLOCKS: u64 = 8192;
const T: Duration = Duration::from_secs(5);

/// A target on two reactors with one subsystem (any host) of one 4 MiB RAM namespace of
/// 512-byte blocks.
pub(super) fn target(opts: TransportOptions) -> LoopbackTarget {
    let t = LoopbackTarget::start(&[0, 1], opts).unwrap();
    let bdev: Bdev = Arc::new(RamDevice::new("ram0", 512, BLOCKS).unwrap());
    t.add_subsystem(NQN, bdev, "ram0").unwrap();
    t
}

pub(super) fn transport(port: u16, digests: bool) -> TcpTransport {
    TcpTransport::new(TcpTarget {
        traddr: "127.0.0.1".into(),
        trsvcid: port,
        adrfam: Adrfam::IPv4,
        subnqn: NQN.into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100".into(),
        hostid: [7; 16],
        hdgst: digests,
        ddgst: digests,
        kato_ms: 0,
        dhchap: Default::default(),
        tls: None,
    })
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed).wrapping_add((i >> 9) as u8)).collect()
}

/// An iovec the controller's data may be written through (a read's).
fn iov_mut(b: &mut [u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }
}

/// An iovec of data to send (a write's).
fn iov(b: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }
}

/// Polls `q` until `n` completions came (or an error, or 5 s).
fn reap(q: &mut TcpQueue, n: usize) -> Result<Vec<(u32, Status)>, NvmeError> {
    let mut out = Vec::new();
    let end = Instant::now() + T;
    while out.len() < n {
        q.flush();
        q.poll(&mut out)?;
        assert!(Instant::now() < end, "no completion in time: {} of {n}", out.len());
    }
    Ok(out)
}

/// One read or write of `buf` at `slba` on namespace 1, run to its completion.
fn rw(q: &mut TcpQueue, write: bool, slba: u64, buf: &mut [u8]) -> Status {
    let sqe = cmd::read_write(write, 1, slba, (buf.len() / 512) as u32, false);
    // SAFETY: `buf` outlives the command: reaped below.
    q.submit(&sqe, unsafe { Iovecs::from_slice(&[iov_mut(buf)]) }, 9).unwrap();
    let c = reap(q, 1).unwrap();
    assert_eq!(c[0].0, 9);
    c[0].1
}

fn attach(port: u16, digests: bool) -> (TcpTransport, TcpAdmin, TcpQueue) {
    let tr = transport(port, digests);
    let mut admin = tr.connect_admin(32, T).unwrap();
    let q = tr.connect_io(&mut admin, 1, 64).unwrap();
    (tr, admin, q)
}

#[test]
fn admin_queue_connects_enables_and_identifies() {
    let tg = target(TransportOptions::default());
    let tr = transport(tg.port(), false);
    assert_eq!((tr.trtype(), tr.traddr()), ("TCP", "127.0.0.1".to_string()));
    let mut admin = tr.connect_admin(32, T).unwrap();
    let trid = tr.trid();
    assert_eq!(trid.adrfam.as_deref(), Some("IPv4"));
    assert_eq!(trid.trsvcid, Some(tg.port().to_string()));
    assert_eq!(trid.subnqn.as_deref(), Some(NQN));
    let host = tr.host();
    assert_eq!(host.addr, "127.0.0.1");
    assert_ne!(host.svcid, "");
    assert!(host.nqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:"));
    let csts = admin.get_property(fp_nvme_spec::registers::CSTS, false).unwrap();
    assert_eq!(csts & 1, 1, "enabled by connect_admin");
    let cap = admin.get_property(fp_nvme_spec::registers::CAP, true).unwrap();
    assert_eq!(fp_nvme_spec::registers::cap_mqes(cap), 127, "the target's max_queue_depth 128");
    let mut id = vec![0u8; 4096];
    let cqe = admin
        .execute(cmd::identify(fp_nvme_spec::identify::CNS_CONTROLLER, 0), AdminData::FromDevice(&mut id), T)
        .unwrap();
    assert!(cqe.status.is_success());
    assert_eq!(u16::from_le_bytes([id[78], id[79]]), admin.cntlid());
    assert_eq!(admin.io_in_capsule_data(), 4096);
    assert_eq!(admin.max_transfer(), 131072);
    let mut idns = vec![0u8; 4096];
    admin
        .execute(cmd::identify(fp_nvme_spec::identify::CNS_NAMESPACE, 1), AdminData::FromDevice(&mut idns), T)
        .unwrap();
    assert_eq!(u64::from_le_bytes(idns[0..8].try_into().unwrap()), BLOCKS);
    // Set Features with no data, and an error status returned as the completion.
    let cqe = admin
        .execute(
            cmd::set_features(fp_nvme_spec::features::FID_NUMBER_OF_QUEUES, 0x0003_0003),
            AdminData::None,
            T,
        )
        .unwrap();
    assert!(cqe.status.is_success(), "{cqe:?}");
    let cqe = admin
        .execute(
            cmd::identify(fp_nvme_spec::identify::CNS_NAMESPACE, 99),
            AdminData::FromDevice(&mut idns),
            T,
        )
        .unwrap();
    assert!(!cqe.status.is_success());
    // A wrong subsystem: Connect refused.
    let mut bad = transport(tg.port(), false);
    bad = TcpTransport::new(TcpTarget {
        subnqn: "nqn.2016-06.io.flashpath:nope".into(),
        ..bad.target().clone()
    });
    match bad.connect_admin(32, T) {
        Err(NvmeError::Command { what: "Fabrics Connect", .. }) => {}
        other => panic!("Connect to an unknown subsystem: {:?}", other.map(|_| ())),
    }
    tr.shutdown(&mut admin, T);
    let csts = admin.get_property(fp_nvme_spec::registers::CSTS, false).unwrap() as u32;
    assert_eq!(csts & fp_nvme_spec::registers::CSTS_SHST_MASK, fp_nvme_spec::registers::CSTS_SHST_COMPLETE);
}

fn io_paths(digests: bool) {
    let tg = target(TransportOptions::default());
    let (_tr, _admin, mut q) = attach(tg.port(), digests);
    assert_eq!(q.qid(), 1);
    // In capsule (4 KiB), by R2T (64 KiB: more than the 4 KiB in-capsule size), and the
    // largest transfer (128 KiB) in three iovecs.
    for (slba, len, seed) in [(0u64, 4096usize, 1u8), (8, 65536, 2), (200, 131072, 3), (1000, 512, 4)] {
        let mut w = pattern(seed, len);
        assert!(rw(&mut q, true, slba, &mut w).is_success());
        let mut r = vec![0u8; len];
        assert!(rw(&mut q, false, slba, &mut r).is_success());
        assert_eq!(r, w, "read back {len} bytes at {slba}");
    }
    let mut w = pattern(9, 131072);
    let (a, rest) = w.split_at_mut(512);
    let (b, c) = rest.split_at_mut(65536);
    let sqe = cmd::read_write(true, 1, 4000, 256, false);
    // SAFETY: the buffers outlive the command (reaped below).
    q.submit(&sqe, unsafe { Iovecs::from_slice(&[iov(a), iov(b), iov(c)]) }, 1).unwrap();
    assert!(reap(&mut q, 1).unwrap()[0].1.is_success());
    let mut r = vec![0u8; 131072];
    let (a, rest) = r.split_at_mut(4096);
    let (b, c) = rest.split_at_mut(1000 * 4);
    let sqe = cmd::read_write(false, 1, 4000, 256, false);
    // SAFETY: as above.
    q.submit(&sqe, unsafe { Iovecs::from_slice(&[iov_mut(a), iov_mut(b), iov_mut(c)]) }, 2).unwrap();
    assert!(reap(&mut q, 1).unwrap()[0].1.is_success());
    assert_eq!(r, w);
    let d = q.data_stats();
    assert!(d.direct > 0, "large reads go straight into the buffers: {d:?}");
    assert_eq!(d.direct + d.copied, (4096 + 65536 + 131072 + 512 + 131072) as u64);

    // Many in flight, one flush: writes of both kinds, then reads, then verify.
    let bufs: Vec<Vec<u8>> =
        (0..40).map(|i| pattern(i as u8, if i % 2 == 0 { 4096 } else { 16384 })).collect();
    let before = q.stats();
    for (i, b) in bufs.iter().enumerate() {
        let sqe = cmd::read_write(true, 1, i as u64 * 32, (b.len() / 512) as u32, false);
        // SAFETY: `bufs` outlives the commands.
        q.submit(&sqe, unsafe { Iovecs::from_slice(&[iov(b)]) }, i as u32).unwrap();
    }
    assert_eq!(q.in_flight(), 40);
    let mut c = reap(&mut q, 40).unwrap();
    c.sort_by_key(|x| x.0);
    assert!(c.iter().enumerate().all(|(i, x)| x.0 == i as u32 && x.1.is_success()));
    let mut reads: Vec<Vec<u8>> = bufs.iter().map(|b| vec![0u8; b.len()]).collect();
    for (i, b) in reads.iter_mut().enumerate() {
        let sqe = cmd::read_write(false, 1, i as u64 * 32, (b.len() / 512) as u32, false);
        // SAFETY: `reads` outlives the commands.
        q.submit(&sqe, unsafe { Iovecs::from_slice(&[iov_mut(b)]) }, i as u32).unwrap();
    }
    reap(&mut q, 40).unwrap();
    assert_eq!(reads, bufs);
    let s = q.stats();
    assert_eq!(s.submitted - before.submitted, 80);
    assert_eq!(s.completed - before.completed, 80);
    assert_eq!(s.bounced, 0);
    // An error status comes back as the completion's status.
    let mut r = vec![0u8; 4096];
    let st = rw(&mut q, false, BLOCKS - 4, &mut r);
    assert_eq!((st.sc, st.is_success()), (SC_LBA_OUT_OF_RANGE, false));
    assert_eq!(q.in_flight(), 0);
    // The queue ran on the socket implementation the test asked for.
    assert_eq!(q.uses_uring(), super::io_sock_impl() == fp_conn::uring::SocketImpl::Uring);
}

on_each_sock_impl!(writes_in_capsule_and_by_r2t_read_back);
fn writes_in_capsule_and_by_r2t_read_back() {
    io_paths(false);
}

on_each_sock_impl!(digests_on);
fn digests_on() {
    io_paths(true);
}

on_each_sock_impl!(full_queue_is_busy_and_flush_batches);
fn full_queue_is_busy_and_flush_batches() {
    let tg = target(TransportOptions::default());
    let tr = transport(tg.port(), false);
    let mut admin = tr.connect_admin(32, T).unwrap();
    let mut q = tr.connect_io(&mut admin, 1, 8).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 512]).collect();
    for (i, b) in bufs[..7].iter_mut().enumerate() {
        // SAFETY: `bufs` outlives the commands.
        q.submit(
            &cmd::read_write(false, 1, i as u64, 1, false),
            unsafe { Iovecs::from_slice(&[iov_mut(b)]) },
            i as u32,
        )
        .unwrap();
    }
    // SAFETY: refused, nothing kept.
    let r = q.submit(
        &cmd::read_write(false, 1, 0, 1, false),
        unsafe { Iovecs::from_slice(&[iov_mut(&mut bufs[7])]) },
        99,
    );
    assert_eq!(r, Err(SubmitError::Busy));
    let d = q.stats().doorbells;
    q.flush();
    assert_eq!(q.stats().doorbells - d, 1, "seven capsules in one sendmsg");
    reap(&mut q, 7).unwrap();
    // Two I/O queues of one controller.
    let mut q2 = tr.connect_io(&mut admin, 2, 8).unwrap();
    let mut w = pattern(5, 1024);
    assert!(rw(&mut q2, true, 50, &mut w).is_success());
    let mut r = vec![0u8; 1024];
    assert!(rw(&mut q, false, 50, &mut r).is_success());
    assert_eq!(r, w);
}

on_each_sock_impl!(target_gone_fails_the_queues);
fn target_gone_fails_the_queues() {
    let tg = target(TransportOptions::default());
    let (tr, mut admin, mut q) = attach(tg.port(), false);
    let mut r = vec![0u8; 4096];
    let sqe = cmd::read_write(false, 1, 0, 8, false);
    let port = tg.port();
    // The target closes every connection (its reactors still running to do so).
    tg.target().stop();
    // SAFETY: `r` outlives the command (drained below).
    let _ = q.submit(&sqe, unsafe { Iovecs::from_slice(&[iov_mut(&mut r)]) }, 5);
    let end = Instant::now() + T;
    let err = loop {
        q.flush();
        match q.poll(&mut Vec::new()) {
            Err(e) => break e,
            Ok(_) => assert!(Instant::now() < end, "no error after the target went"),
        }
    };
    assert!(matches!(err, NvmeError::Gone(_)), "{err}");
    let mut tags = Vec::new();
    q.drain(&mut tags);
    assert!(tags.is_empty() || tags == [5]);
    assert_eq!(q.in_flight(), 0);
    assert!(admin.get_property(fp_nvme_spec::registers::CSTS, false).is_err());
    drop(tg);
    // Reconnecting to nothing is refused.
    assert!(matches!(transport(port, false).connect_admin(32, T), Err(NvmeError::Gone(_))));
    drop(tr);
}

#[test]
fn async_events_stay_outstanding_and_complete_when_a_namespace_changes() {
    let tg = target(TransportOptions::default());
    let tr = transport(tg.port(), false);
    let mut admin = tr.connect_admin(32, T).unwrap();
    let cqe = admin
        .execute(
            cmd::set_features(fp_nvme_spec::features::FID_ASYNC_EVENT_CONFIG, 1 << 8),
            AdminData::None,
            T,
        )
        .unwrap();
    assert!(cqe.status.is_success());
    admin.submit_async_event_request().unwrap();
    let mut events = Vec::new();
    admin.poll_async_events(&mut events).unwrap();
    assert!(events.is_empty());
    // Other commands run while it is outstanding; an event that comes during one is kept.
    let mut id = vec![0u8; 4096];
    admin
        .execute(cmd::identify(fp_nvme_spec::identify::CNS_CONTROLLER, 0), AdminData::FromDevice(&mut id), T)
        .unwrap();
    tg.target().namespace_resized(NQN, 1);
    let end = Instant::now() + T;
    while events.is_empty() {
        assert!(Instant::now() < end, "no AER completion");
        admin
            .execute(cmd::get_features(fp_nvme_spec::features::FID_NUMBER_OF_QUEUES), AdminData::None, T)
            .unwrap();
        admin.poll_async_events(&mut events).unwrap();
    }
    // Notice, namespace attribute changed, Changed Namespace List.
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].dw0, 0x0004_0002);
    let mut log = vec![0u8; 4096];
    let cqe = admin
        .execute(
            cmd::get_log_page(fp_nvme_spec::log_page::LID_CHANGED_NS, 0xFFFF_FFFF, 4096, 0),
            AdminData::FromDevice(&mut log),
            T,
        )
        .unwrap();
    assert!(cqe.status.is_success());
    assert_eq!(u32::from_le_bytes(log[0..4].try_into().unwrap()), 1);
}

on_each_sock_impl!(addresses_checked_and_ipv6_connects);
fn addresses_checked_and_ipv6_connects() {
    let bad = |traddr: &str, adrfam, trsvcid| {
        let t = TcpTarget { traddr: traddr.into(), adrfam, trsvcid, ..transport(1, false).target().clone() };
        match TcpTransport::new(t).connect_admin(8, T) {
            Err(NvmeError::InvalidParam { field, .. }) => field,
            other => panic!("{traddr}: {:?}", other.map(|_| ())),
        }
    };
    assert_eq!(bad("localhost", Adrfam::IPv4, 4420), "traddr");
    assert_eq!(bad("::1", Adrfam::IPv4, 4420), "adrfam");
    assert_eq!(bad("127.0.0.1", Adrfam::IPv6, 4420), "adrfam");
    assert_eq!(bad("127.0.0.1", Adrfam::IPv4, 0), "trsvcid");

    // The same subsystem reached over IPv6 loopback, when the machine has it.
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        return;
    }
    let tg = target(TransportOptions::default());
    let port = std::net::TcpListener::bind("[::1]:0").unwrap().local_addr().unwrap().port();
    let addr = ListenAddress {
        trtype: "TCP".into(),
        adrfam: "IPv6".into(),
        traddr: "::1".into(),
        trsvcid: port.to_string(),
    };
    tg.target().add_listener(NQN, addr).unwrap();
    let t = TcpTarget {
        traddr: "::1".into(),
        adrfam: Adrfam::IPv6,
        trsvcid: port,
        ..transport(1, false).target().clone()
    };
    let tr = TcpTransport::new(t);
    let mut admin = tr.connect_admin(8, T).unwrap();
    let mut q = tr.connect_io(&mut admin, 1, 8).unwrap();
    let mut w = pattern(3, 4096);
    assert!(rw(&mut q, true, 7, &mut w).is_success());
    assert_eq!(tr.trid().adrfam.as_deref(), Some("IPv6"));
    assert_eq!(tr.host().addr, "::1");
}
