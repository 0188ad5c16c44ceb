//! The control API's bookkeeping and the SPDK shapes it reports.

use std::sync::Arc;

use fp_bdev::{Bdev, RamDevice};
use fp_reactor::{ReactorConfig, ReactorSet};

use crate::*;

pub(crate) fn listen(port: u16) -> ListenAddress {
    ListenAddress {
        trtype: "TCP".into(),
        adrfam: "IPv4".into(),
        traddr: "127.0.0.1".into(),
        trsvcid: port.to_string(),
    }
}

/// A free TCP port on loopback now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A RAM disk `name` of `blocks` 512-byte blocks.
pub(crate) fn ram(name: &str, blocks: u64) -> Bdev {
    Arc::new(RamDevice::new(name, 512, blocks).unwrap())
}

/// Namespace `nsid` over a RAM disk `name` of `blocks` 512-byte blocks.
pub(crate) fn ns(nsid: u32, name: &str, blocks: u64) -> NamespaceSpec {
    crate::testing::namespace(nsid, ram(name, blocks), name)
}

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

#[test]
fn bookkeeping_and_spdk_shapes() {
    let reactors = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let t = NvmfTarget::new(reactors.handles().to_vec(), TargetOptions::default());
    let sub = SubsystemSpec { nqn: NQN.into(), allow_any_host: false, ..Default::default() };
    t.create_subsystem(sub.clone()).unwrap();
    assert!(matches!(t.create_subsystem(sub), Err(NvmfError::AlreadyExists { .. })));
    let bad = SubsystemSpec { nqn: "cnode1".into(), ..Default::default() };
    assert!(matches!(t.create_subsystem(bad), Err(NvmfError::Invalid { field: "nqn", .. })));
    let port = free_port();
    // No transport yet.
    assert!(t.add_listener(NQN, listen(port)).is_err());
    let bad = TransportOptions { sock_priority: 17, ..Default::default() };
    assert!(matches!(t.create_transport(bad), Err(NvmfError::Invalid { field: "sock_priority", .. })));
    let bad = TransportOptions { trtype: "RDMA".into(), ..Default::default() };
    assert!(matches!(t.create_transport(bad), Err(NvmfError::Invalid { field: "trtype", .. })));
    t.create_transport(TransportOptions::default()).unwrap();
    assert!(matches!(t.create_transport(TransportOptions::default()), Err(NvmfError::AlreadyExists { .. })));
    assert_eq!(t.transports()[0].max_queue_depth, 128);
    let remote = ListenAddress { traddr: "0.0.0.0".into(), ..listen(port) };
    assert!(matches!(t.add_listener(NQN, remote), Err(NvmfError::Invalid { field: "traddr", .. })));
    t.add_listener(NQN, listen(port)).unwrap();
    assert!(t.add_listener(NQN, listen(port)).is_err());
    t.add_host(NQN, "nqn.2014-08.org.nvmexpress:uuid:h1").unwrap();
    assert_eq!(t.free_nsid(NQN).unwrap(), 1);
    assert_eq!(t.add_namespace(NQN, ns(1, "ram0", 2048)).unwrap(), 1);
    assert_eq!(t.free_nsid(NQN).unwrap(), 2);
    assert!(t.add_namespace(NQN, ns(1, "ram1", 2048)).is_err());

    let v = serde_json::to_value(t.subsystems()).unwrap();
    assert_eq!(v[0]["nqn"], fp_nvme_spec::fabrics::DISCOVERY_NQN);
    assert_eq!(v[0]["subtype"], "Discovery");
    assert!(v[0].get("namespaces").is_none());
    assert_eq!(v[0]["listen_addresses"][0]["trsvcid"], port.to_string());
    let s = &v[1];
    assert_eq!(s["subtype"], "NVMe");
    assert_eq!(s["allow_any_host"], false);
    assert_eq!(s["hosts"][0]["nqn"], "nqn.2014-08.org.nvmexpress:uuid:h1");
    assert_eq!(s["max_namespaces"], 32);
    assert_eq!(
        s["listen_addresses"][0],
        serde_json::json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()})
    );
    let n = &s["namespaces"][0];
    assert_eq!(n["bdev_name"], "ram0");
    assert_eq!(n["nguid"].as_str().unwrap().len(), 32);
    assert!(n["nguid"].as_str().unwrap().chars().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
    assert_eq!(n["uuid"].as_str().unwrap().split('-').map(str::len).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
    // The discovery log lists the subsystem at its listener.
    let dv = t.inner.discovery.view();
    assert_eq!(dv.discovery_log.len(), 1);
    assert_eq!(dv.discovery_log[0].subnqn, NQN);
    // ... to the hosts it admits only.
    let h1 = "nqn.2014-08.org.nvmexpress:uuid:h1";
    assert_eq!(t.inner.discovery.view_for(h1, &listen(1)).discovery_log.len(), 1);
    assert!(t
        .inner
        .discovery
        .view_for("nqn.2014-08.org.nvmexpress:uuid:h2", &listen(1))
        .discovery_log
        .is_empty());
    t.set_allow_any_host(NQN, true).unwrap();
    assert_eq!(
        t.inner.discovery.view_for("nqn.2014-08.org.nvmexpress:uuid:h2", &listen(1)).discovery_log.len(),
        1
    );
    t.set_allow_any_host(NQN, false).unwrap();

    // Namespaces first, then the subsystem.
    assert!(matches!(t.delete_subsystem(NQN), Err(NvmfError::Invalid { .. })));
    t.remove_namespace(NQN, 1).unwrap();
    assert!(matches!(t.remove_namespace(NQN, 1), Err(NvmfError::NotFound { .. })));
    t.remove_listener(NQN, &listen(port)).unwrap();
    t.delete_subsystem(NQN).unwrap();
    assert_eq!(t.subsystems().len(), 1);
    assert!(t.inner.discovery.view().discovery_log.is_empty());
    // The listener closed with its last subsystem: the port is free again.
    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    t.stop();
    reactors.shutdown();
}
