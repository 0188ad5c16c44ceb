//! A minimal NVMe/TCP target for measuring the data path without the daemon around it: one
//! reactor on core 0 serving a null (or RAM, with `ram`) bdev as namespace 1 of
//! `nqn.2016-06.io.spdk:cnode1` (any host) on 127.0.0.1 at the port given. Runs until stdin
//! closes. Usage: `nvmf_null_target PORT [ram]`.

use std::io::Read;
use std::sync::Arc;

use fp_bdev::{Bdev, NullDevice, RamDevice};
use fp_nvmf::*;
use fp_reactor::{ReactorConfig, ReactorSet};

/// Log lines to stderr (FP_LOG=debug for more).
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        eprintln!("{} {}", r.level(), r.args());
    }
    fn flush(&self) {}
}

fn main() {
    let _ = log::set_logger(&Stderr);
    let debug = std::env::var("FP_LOG").is_ok_and(|v| v == "debug");
    log::set_max_level(if debug { log::LevelFilter::Debug } else { log::LevelFilter::Info });
    let args: Vec<String> = std::env::args().collect();
    let port = args.get(1).expect("usage: nvmf_null_target PORT [ram]").clone();
    let (bdev, name): (Bdev, &str) = if args.get(2).map(String::as_str) == Some("ram") {
        (Arc::new(RamDevice::new("ram0", 512, 1 << 21).unwrap()), "ram0")
    } else {
        (Arc::new(NullDevice::new("null0", 512, 1 << 21).unwrap()), "null0")
    };
    let reactors = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let t = NvmfTarget::new(reactors.handles().to_vec(), TargetOptions::default());
    t.create_transport(TransportOptions::default()).unwrap();
    let nqn = "nqn.2016-06.io.spdk:cnode1";
    t.create_subsystem(SubsystemSpec { nqn: nqn.into(), allow_any_host: true, ..Default::default() })
        .unwrap();
    let addr = ListenAddress {
        trtype: "TCP".into(),
        adrfam: "IPv4".into(),
        traddr: "127.0.0.1".into(),
        trsvcid: port,
    };
    t.add_listener(nqn, addr).unwrap();
    let ns = NamespaceSpec {
        nsid: 1,
        bdev,
        bdev_name: name.into(),
        uuid: None,
        nguid: None,
        eui64: None,
        read_only: false,
        anagrpid: None,
    };
    t.add_namespace(nqn, ns).unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let snap = reactors.handles()[0].stats().snapshot();
    eprintln!("{}", serde_json::to_string(&t.stats()).unwrap());
    eprintln!("reactor: {snap:?}");
    t.stop();
    reactors.shutdown();
}
