//! Namespaces over the TCP transport to flashpath's own NVMe/TCP target in process: the bdev
//! conformance suite, namespace events from the target's asynchronous events, and resets
//! under verified I/O.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fp_bdev::conformance::{self, read_range, write_range};
use fp_bdev::{BlockDevice, RamDevice};
use fp_nvmf::testing::{self, LoopbackTarget};
use fp_nvmf::{NamespaceSpec, TransportOptions};

use super::core_fake::{test_options, wait_for, EventLog};
use crate::ctrlr::{self, Controller, NamespaceEvent};
use crate::tcp::{Adrfam, TcpTarget, TcpTransport};

/// One target (one reactor) for the whole file, with a subsystem per test device.
fn target() -> &'static LoopbackTarget {
    static T: std::sync::OnceLock<LoopbackTarget> = std::sync::OnceLock::new();
    T.get_or_init(|| LoopbackTarget::start(&[0], TransportOptions::default()).unwrap())
}

fn ram_namespace(nsid: u32, name: &str, block_size: u32, blocks: u64) -> (NamespaceSpec, Arc<RamDevice>) {
    let dev = Arc::new(RamDevice::new(name, block_size, blocks).unwrap());
    (testing::namespace(nsid, dev.clone(), name), dev)
}

/// A new subsystem with one RAM namespace of `blocks` blocks, listening on the target's port;
/// returns its NQN and the RAM device.
fn subsystem(block_size: u32, blocks: u64) -> (String, Arc<RamDevice>) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nqn = format!("nqn.2016-06.io.flashpath:core-{n}");
    let name = format!("core-ram{n}");
    let dev = Arc::new(RamDevice::new(&name, block_size, blocks).unwrap());
    target().add_subsystem(&nqn, dev.clone(), &name).unwrap();
    (nqn, dev)
}

fn attach_tcp(nqn: &str, name: &str) -> (Arc<dyn Controller>, EventLog) {
    let transport = TcpTransport::new(TcpTarget {
        traddr: "127.0.0.1".into(),
        trsvcid: target().port(),
        adrfam: Adrfam::IPv4,
        subnqn: nqn.into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000c0".into(),
        hostid: [0xc0; 16],
        hdgst: false,
        ddgst: true,
        kato_ms: 10_000,
        dhchap: Default::default(),
        tls: None,
    });
    let (opts, mut global) = test_options(name);
    global.keep_alive_timeout_ms = 10_000;
    let log: EventLog = Arc::default();
    let l = log.clone();
    let c =
        ctrlr::attach(transport, opts, global, Box::new(move |e| l.lock().unwrap().push(e))).expect("attach");
    (c, log)
}

/// Controllers the conformance suite's devices belong to: kept attached until the test ends.
static KEEP: Mutex<Vec<Arc<dyn Controller>>> = Mutex::new(Vec::new());

#[test]
fn tcp_namespaces_pass_the_bdev_conformance_suite() {
    let make = || -> Arc<dyn BlockDevice> {
        let (nqn, _) = subsystem(512, 256);
        let (c, _) = attach_tcp(&nqn, "tcp");
        let ns = c.namespaces()[0].clone();
        KEEP.lock().unwrap().push(c);
        ns
    };
    conformance::run_suite(&make, conformance::Storage::Keeps);
}

#[test]
fn the_targets_namespace_changes_reach_the_callback() {
    let (nqn, ram) = subsystem(512, 64);
    let (c, log) = attach_tcp(&nqn, "ev");
    let info = serde_json::to_value(c.info()).unwrap();
    assert_eq!(info["ctrlrs"][0]["trid"]["subnqn"], nqn.as_str());
    assert_eq!(info["ctrlrs"][0]["trid"]["trsvcid"], target().port().to_string());
    // Shrink namespace 1, add namespace 2, remove it again.
    ram.resize(32).unwrap();
    target().target().namespace_resized(&nqn, 1);
    wait_for("the resize", || !log.lock().unwrap().is_empty());
    assert!(matches!(log.lock().unwrap()[0], NamespaceEvent::Resized { nsid: 1, num_blocks: 32 }));
    let (spec, _) = ram_namespace(2, &format!("{nqn}-2"), 4096, 16);
    target().target().add_namespace(&nqn, spec).unwrap();
    wait_for("the addition", || log.lock().unwrap().len() == 2);
    match &log.lock().unwrap()[1] {
        NamespaceEvent::Added(ns) => assert_eq!((ns.name(), ns.info().block_size), ("evn2", 4096)),
        e => panic!("{e:?}"),
    }
    target().target().remove_namespace(&nqn, 2).unwrap();
    wait_for("the removal", || log.lock().unwrap().len() == 3);
    assert!(matches!(log.lock().unwrap()[2], NamespaceEvent::Removed { nsid: 2 }));
}

#[test]
fn resets_under_verified_io_over_tcp_lose_nothing() {
    let (nqn, _) = subsystem(4096, 256);
    let (c, _) = attach_tcp(&nqn, "rs");
    let ns = c.namespaces()[0].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let resetter = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 5 {
                c.reset().unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        })
    };
    let mut ch = ns.open_channel().unwrap();
    for round in 0..40u32 {
        let offset = u64::from(round % 32) * 8 * 4096;
        let data: Vec<u8> =
            (0..8 * 4096).map(|i| (i as u32 ^ round.wrapping_mul(2654435761)) as u8).collect();
        write_range(&mut *ch, offset, &data);
        assert!(read_range(&mut *ch, offset, data.len()) == data, "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    let resets = resetter.join().unwrap();
    assert!(resets >= 1);
    assert_eq!(c.info().ctrlrs[0].resets, resets);
    c.detach();
}
