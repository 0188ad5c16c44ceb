//! The nvmf methods through [`Registry::call`], as the RPC server and the configuration file run
//! them: SPDK's parameters and result shapes, the namespaces' claims on their bdevs, listeners
//! that really listen (a TCP connect), and errors that name the parameter.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

use fp_nvme_spec::fabrics::DISCOVERY_NQN;
use fp_reactor::{Reactor, ReactorConfig};
use serde_json::{json, Value};

use crate::exports::{ExportKind, KindOptions, OptionValue};
use crate::metrics::array;
use crate::{MethodError, Registry, RegistryOptions};

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

struct Fixture {
    registry: Arc<Registry>,
    _dir: tempfile::TempDir,
    _reactor: Reactor,
}

fn fixture(options: RegistryOptions) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let reactor = Reactor::new(0, None, ReactorConfig::default()).unwrap();
    let registry = Registry::with_options(vec![reactor.handle()], dir.path(), options);
    Fixture { registry, _dir: dir, _reactor: reactor }
}

impl Fixture {
    fn call(&self, method: &str, params: Value) -> Value {
        self.registry.call(method, Some(params.clone())).unwrap_or_else(|e| panic!("{method} {params}: {e}"))
    }

    fn fails(&self, method: &str, params: Value) -> MethodError {
        match self.registry.call(method, Some(params.clone())) {
            Ok(v) => panic!("{method} {params} succeeded: {v}"),
            Err(e) => e,
        }
    }

    fn malloc(&self, name: &str) {
        self.call("bdev_malloc_create", json!({ "name": name, "num_blocks": 256, "block_size": 512 }));
    }

    fn bdev(&self, name: &str) -> Value {
        self.call("bdev_get_bdevs", json!({ "name": name }))[0].clone()
    }

    /// The transport as SPDK's rpc.py creates it (`nvmf_create_transport -t tcp`: every flag of
    /// the other transports at its default) and a subsystem that any host may use.
    fn transport_and_subsystem(&self) {
        self.call(
            "nvmf_create_transport",
            json!({ "trtype": "tcp", "zcopy": false, "no_srq": false, "c2h_success": true,
                    "dif_insert_or_strip": false, "no_wr_batching": false,
                    "disable_mappable_bar0": false, "disable_adaptive_irq": false,
                    "disable_shadow_doorbells": false, "disable_command_passthru": false }),
        );
        self.call(
            "nvmf_create_subsystem",
            json!({ "nqn": NQN, "serial_number": "SPDK001", "allow_any_host": true,
                    "ana_reporting": false, "min_cntlid": 1, "max_cntlid": 65519 }),
        );
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn listen_address(port: u16) -> Value {
    json!({ "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port.to_string() })
}

#[test]
fn a_subsystem_from_transport_to_deletion() {
    let f = fixture(RegistryOptions::default());
    f.transport_and_subsystem();
    let transports = f.call("nvmf_get_transports", json!({}));
    assert_eq!(transports[0]["trtype"], "TCP", "{transports}");
    assert_eq!(transports[0]["max_queue_depth"], 128, "{transports}");
    assert_eq!(f.call("nvmf_get_transports", json!({ "trtype": "TCP" })), transports);
    // One transport per target, as SPDK.
    let e = f.fails("nvmf_create_transport", json!({ "trtype": "TCP" }));
    assert_eq!(e.to_rpc().code, -libc::EEXIST, "{e}");

    let port = free_port();
    f.call("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": listen_address(port) }));
    TcpStream::connect(("127.0.0.1", port)).expect("the listener accepts connections");
    let listeners = f.call("nvmf_subsystem_get_listeners", json!({ "nqn": NQN }));
    assert_eq!(
        listeners,
        json!([{ "address": { "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                              "trsvcid": port.to_string() }, "ana_state": "optimized" }])
    );

    f.malloc("m0");
    f.malloc("m1");
    assert_eq!(f.call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "m0" } })), 1);
    let nguid = "0123456789ABCDEF0123456789ABCDEF";
    // What SPDK's newest rpc.py sends with no options besides these: its flags' defaults too.
    let ns = json!({ "bdev_name": "m1", "nsid": 5, "nguid": nguid, "uuid": "ceccf520-691e-4b46-9546-34af789907c5",
                     "no_auto_visible": false, "hide_metadata": false });
    assert_eq!(f.call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": ns })), 5);
    let m0 = f.bdev("m0");
    assert_eq!((m0["claimed"].as_bool(), m0["claim_type"].as_str()), (Some(true), Some("exclusive_write")));
    assert_eq!(m0["claimed_by"], format!("{NQN}/1"), "{m0}");

    let subs = f.call("nvmf_get_subsystems", json!({ "nqn": NQN }));
    assert_eq!(subs.as_array().unwrap().len(), 1, "{subs}");
    let s = &subs[0];
    assert_eq!((s["subtype"].as_str(), s["serial_number"].as_str()), (Some("NVMe"), Some("SPDK001")));
    assert_eq!(s["allow_any_host"], true);
    assert_eq!(s["namespaces"][0]["bdev_name"], "m0");
    // Without a UUID the namespace has its bdev's, as in SPDK.
    assert_eq!(s["namespaces"][0]["uuid"], m0["uuid"], "{s}");
    assert_eq!(
        (s["namespaces"][1]["nsid"].as_u64(), s["namespaces"][1]["nguid"].as_str()),
        (Some(5), Some(nguid))
    );
    assert_eq!(s["namespaces"][1]["uuid"], "ceccf520-691e-4b46-9546-34af789907c5");
    // The discovery subsystem is listed too, listening wherever a subsystem does.
    let all = f.call("nvmf_get_subsystems", json!({}));
    let discovery = all.as_array().unwrap().iter().find(|s| s["subtype"] == "Discovery").expect("discovery");
    assert_eq!(discovery["listen_addresses"][0]["trsvcid"], port.to_string(), "{all}");

    // It may listen alone too, as SPDK's `nvmf_subsystem_add_listener discovery ...`.
    let dport = free_port();
    let discovery = json!({ "nqn": DISCOVERY_NQN, "listen_address": listen_address(dport) });
    f.call("nvmf_subsystem_add_listener", discovery.clone());
    TcpStream::connect(("127.0.0.1", dport)).expect("the discovery listener accepts connections");
    let listeners = f.call("nvmf_subsystem_get_listeners", json!({ "nqn": DISCOVERY_NQN }));
    let ports: Vec<&str> =
        array(&listeners).iter().map(|l| l["address"]["trsvcid"].as_str().unwrap()).collect();
    assert!(ports.contains(&dport.to_string().as_str()), "{listeners}");
    f.call("nvmf_subsystem_remove_listener", discovery);
    let listeners = f.call("nvmf_subsystem_get_listeners", json!({ "nqn": DISCOVERY_NQN }));
    assert_eq!(array(&listeners).len(), 1, "{listeners}");

    // A namespace's bdev is taken: no second namespace, no deletion, no shrinking.
    let e = f.fails("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "m0" } }));
    assert!(e.to_string().contains("m0"), "{e}");
    let e = f.fails("bdev_malloc_delete", json!({ "name": "m0" }));
    assert_eq!(e.to_rpc().code, -libc::EBUSY, "{e}");
    // The same nsid twice.
    f.malloc("m2");
    let e = f
        .fails("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "m2", "nsid": 5 } }));
    assert_eq!(e.to_rpc().code, -libc::EEXIST, "{e}");
    assert_eq!(f.bdev("m2")["claimed"], false, "a refused namespace leaves no claim");

    f.call("nvmf_subsystem_remove_ns", json!({ "nqn": NQN, "nsid": 1 }));
    assert_eq!(f.bdev("m0")["claimed"], false);
    let e = f.fails("nvmf_subsystem_remove_ns", json!({ "nqn": NQN, "nsid": 1 }));
    assert_eq!(e.to_rpc().code, -libc::ENODEV, "{e}");

    // Deleting the subsystem removes its namespaces (releasing m1) and closes its listener.
    f.call("nvmf_delete_subsystem", json!({ "nqn": NQN }));
    assert_eq!(f.bdev("m1")["claimed"], false);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "the listener closed with its subsystem");
    let e = f.fails("nvmf_get_subsystems", json!({ "nqn": NQN }));
    assert_eq!(e.to_rpc().code, -libc::ENODEV, "{e}");
    f.call("bdev_malloc_delete", json!({ "name": "m0" }));
}

#[test]
fn read_only_namespaces_share_their_bdev() {
    let f = fixture(RegistryOptions::default());
    f.transport_and_subsystem();
    f.call("nvmf_create_subsystem", json!({ "nqn": "nqn.2016-06.io.spdk:cnode2" }));
    f.malloc("gold");
    let ro = json!({ "bdev_name": "gold", "read_only": true });
    f.call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": ro }));
    f.call("nvmf_subsystem_add_ns", json!({ "nqn": "nqn.2016-06.io.spdk:cnode2", "namespace": ro }));
    let b = f.bdev("gold");
    assert_eq!(b["claim_type"], "read_many_write_none", "{b}");
    // A writer cannot join readers.
    let e = f.fails("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "gold" } }));
    assert!(e.to_string().contains("gold"), "{e}");
}

#[test]
fn hosts_and_allow_any_host() {
    let f = fixture(RegistryOptions::default());
    f.transport_and_subsystem();
    let host = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100";
    f.call("nvmf_subsystem_allow_any_host", json!({ "nqn": NQN, "allow_any_host": false }));
    f.call("nvmf_subsystem_add_host", json!({ "nqn": NQN, "host": host }));
    let s = &f.call("nvmf_get_subsystems", json!({ "nqn": NQN }))[0];
    assert_eq!((s["allow_any_host"].clone(), s["hosts"].clone()), (json!(false), json!([{ "nqn": host }])));
    let e = f.fails("nvmf_subsystem_add_host", json!({ "nqn": NQN, "host": host }));
    assert_eq!(e.to_rpc().code, -libc::EEXIST, "{e}");
    f.call("nvmf_subsystem_remove_host", json!({ "nqn": NQN, "host": host }));
    assert_eq!(f.call("nvmf_get_subsystems", json!({ "nqn": NQN }))[0]["hosts"], json!([]));
    // Nobody is connected: no controllers, no queue pairs.
    assert_eq!(f.call("nvmf_subsystem_get_controllers", json!({ "nqn": NQN })), json!([]));
    assert_eq!(f.call("nvmf_subsystem_get_qpairs", json!({ "nqn": NQN })), json!([]));
    let e = f.fails("nvmf_subsystem_get_controllers", json!({ "nqn": "nqn.2016-06.io.spdk:none" }));
    assert_eq!(e.to_rpc().code, -libc::ENODEV, "{e}");
}

/// Each refusal is the parameter's name and why, nested ones as `outer.field`; SPDK-only
/// parameters pass at their neutral value and are refused by name otherwise.
#[test]
fn parameter_errors_name_the_field() {
    let f = fixture(RegistryOptions::default());
    let reason = |method: &str, params: Value| {
        let e = f.fails(method, params);
        let (field, why) = e.bad_param().unwrap_or_else(|| panic!("{method}: not a parameter error: {e}"));
        format!("{field}: {why}")
    };
    let r = reason("nvmf_create_transport", json!({ "trtype": "RDMA" }));
    assert!(r.starts_with("trtype: 'RDMA' is not supported"), "{r}");
    assert_eq!(
        reason("nvmf_create_transport", json!({ "trtype": "TCP", "zcopy": true })),
        "zcopy: not supported by flashpath (only false)"
    );
    let r = reason("nvmf_create_transport", json!({ "trtype": "TCP", "tgt_name": "other" }));
    assert!(r.starts_with("tgt_name: not supported by flashpath"), "{r}");
    let r = reason("nvmf_create_transport", json!({ "trtype": "TCP", "sock_priority": 17 }));
    assert!(r.starts_with("sock_priority: must be 0 to 16"), "{r}");
    let r = reason("nvmf_create_transport", json!({ "trtype": "TCP", "bogus": 1 }));
    assert!(r.starts_with("bogus: unknown parameter; accepted: trtype"), "{r}");
    // SPDK's default target name is accepted.
    f.call(
        "nvmf_create_transport",
        json!({ "trtype": "TCP", "tgt_name": "nvmf_tgt", "num_shared_buffers": 8191 }),
    );
    f.call("nvmf_create_subsystem", json!({ "nqn": NQN }));

    let r = reason(
        "nvmf_subsystem_add_listener",
        json!({ "nqn": NQN, "listen_address": listen_address(free_port()), "ana_state": "gone" }),
    );
    assert!(r.starts_with("ana_state: 'gone' is not an ANA state: optimized, non_optimized"), "{r}");
    let r = reason(
        "nvmf_create_subsystem",
        json!({ "nqn": "nqn.2016-06.io.spdk:x", "min_cntlid": 9, "max_cntlid": 3 }),
    );
    assert_eq!(r, "max_cntlid: 3 is below min_cntlid 9");
    let r = reason("nvmf_create_subsystem", json!({ "nqn": "not-an-nqn" }));
    assert!(r.starts_with("nqn: "), "{r}");

    let ns = |namespace: Value| json!({ "nqn": NQN, "namespace": namespace });
    assert_eq!(
        reason("nvmf_subsystem_add_ns", ns(json!({ "bdev_name": "m", "nguid": "12" }))),
        "namespace.nguid: '12' is not 32 hexadecimal digits"
    );
    assert_eq!(
        reason("nvmf_subsystem_add_ns", ns(json!({ "bdev_name": "m", "uuid": "x" }))),
        "namespace.uuid: 'x' is not a UUID (8-4-4-4-12 hexadecimal digits)"
    );
    let r = reason("nvmf_subsystem_add_ns", ns(json!({ "bdev_name": "m", "ptpl_file": "/tmp/p" })));
    assert_eq!(r, "namespace.ptpl_file: not supported by flashpath");
    let r = reason("nvmf_subsystem_add_ns", ns(json!({ "bdev_name": "m", "hide_metadata": true })));
    assert!(r.starts_with("namespace.hide_metadata: "), "{r}");
    let r = reason("nvmf_subsystem_add_ns", ns(json!({ "nsid": 1 })));
    assert!(r.starts_with("namespace.bdev_name: required parameter missing"), "{r}");
    let r = reason("nvmf_subsystem_add_ns", json!({ "nqn": NQN }));
    assert!(r.starts_with("namespace: required parameter missing"), "{r}");

    let listener = |a: Value| json!({ "nqn": NQN, "listen_address": a });
    let r =
        reason("nvmf_subsystem_add_listener", listener(json!({ "trtype": "tcp", "traddr": "127.0.0.1" })));
    assert!(r.starts_with("listen_address.trsvcid: required parameter missing"), "{r}");
    let r = reason(
        "nvmf_subsystem_add_listener",
        listener(json!({ "trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420", "adrfam": "ib" })),
    );
    assert!(r.starts_with("listen_address.adrfam: 'ib' is not supported"), "{r}");
    let r = reason(
        "nvmf_subsystem_add_listener",
        json!({ "nqn": NQN, "listen_address": listen_address(free_port()), "secure_channel": "yes" }),
    );
    assert!(r.starts_with("secure_channel: "), "{r}");
    let r = reason("nvmf_delete_subsystem", json!({ "nqn": "nqn.2014-08.org.nvmexpress.discovery" }));
    assert_eq!(r, "nqn: the discovery subsystem cannot be deleted");
    let r = reason("nvmf_subsystem_allow_any_host", json!({ "nqn": NQN }));
    assert!(r.starts_with("allow_any_host: required parameter missing"), "{r}");
    let r =
        reason("nvmf_subsystem_add_host", json!({ "nqn": NQN, "host": "nqn.2014-08.x:h", "psk": "key0" }));
    assert!(r.starts_with("psk: ") && r.contains("key0"), "{r}");
}

/// TLS with SPDK's parameters: `nvmf_subsystem_add_host`'s `psk` names a keyring key in the
/// interchange format (errors name the key, never its text), `secure_channel` makes a
/// listener TLS only; the listings show both; removing the host takes its PSK.
#[test]
fn psk_hosts_and_secure_listeners() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture(RegistryOptions::default());
    f.transport_and_subsystem();
    let sub = "nqn.2016-06.io.spdk:tls";
    let host = "nqn.2014-08.org.nvmexpress:uuid:tls-host";
    f.call("nvmf_create_subsystem", json!({ "nqn": sub, "allow_any_host": false }));
    let key_file = |name: &str, text: &str| {
        let path = f._dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        f.call("keyring_file_add_key", json!({ "name": name, "path": path.to_str().unwrap() }));
    };
    let psk = fp_crypto::tls::ConfiguredPsk::new(Some(fp_crypto::tls::PskHash::Sha256), &[7; 32]).unwrap();
    let text = psk.to_interchange();
    key_file("psk0", &format!("{}\n", *text));
    let garbled = text.replace(&text[20..24], "AAAA");
    key_file("bad", &garbled);
    key_file("dhchap", "DHHC-1:00:not-a-tls-key:");
    let reason = |params: Value| {
        let e = f.fails("nvmf_subsystem_add_host", params);
        let (field, why) = e.bad_param().unwrap_or_else(|| panic!("not a parameter error: {e}"));
        format!("{field}: {why}")
    };
    for (key, why) in [("bad", "CRC-32"), ("dhchap", "NVMeTLSkey-1"), ("none", "none")] {
        let r = reason(json!({ "nqn": sub, "host": host, "psk": key }));
        assert!(r.starts_with("psk: ") && r.contains(key) && r.contains(why), "{r}");
        assert!(!r.contains(&garbled[16..]) && !r.contains(&text[16..]), "the key's text in an error: {r}");
    }
    f.call("nvmf_subsystem_add_host", json!({ "nqn": sub, "host": host, "psk": "psk0" }));
    let port = free_port();
    f.call(
        "nvmf_subsystem_add_listener",
        json!({ "nqn": sub, "listen_address": listen_address(port), "secure_channel": true }),
    );
    let shown = &f.call("nvmf_get_subsystems", json!({ "nqn": sub }))[0];
    assert_eq!(shown["hosts"], json!([{ "nqn": host, "psk": "psk0" }]));
    assert_eq!(shown["listen_addresses"][0]["secure_channel"], json!(true));
    assert_eq!(shown["listen_addresses"][0]["trsvcid"], json!(port.to_string()));
    let listeners = f.call("nvmf_subsystem_get_listeners", json!({ "nqn": sub }));
    assert_eq!(listeners[0]["secure_channel"], json!(true));
    assert!(listeners[0]["address"].get("secure_channel").is_none(), "{listeners}");
    // As SPDK: no secure channel where any host may connect; plain listeners show nothing.
    let e = f.fails(
        "nvmf_subsystem_add_listener",
        json!({ "nqn": NQN, "listen_address": listen_address(free_port()), "secure_channel": true }),
    );
    let (field, why) = e.bad_param().unwrap();
    assert_eq!(field, "secure_channel", "{why}");
    assert!(why.contains("allows any host"), "{why}");
    f.call(
        "nvmf_subsystem_add_listener",
        json!({ "nqn": NQN, "listen_address": listen_address(free_port()) }),
    );
    let plain = &f.call("nvmf_subsystem_get_listeners", json!({ "nqn": NQN }));
    assert!(array(plain).iter().all(|l| l.get("secure_channel").is_none()), "{plain}");
    f.call("nvmf_subsystem_remove_host", json!({ "nqn": sub, "host": host }));
    let shown = &f.call("nvmf_get_subsystems", json!({ "nqn": sub }))[0];
    assert_eq!(shown["hosts"], json!([]));
}

/// Listeners stay on loopback unless `nvmf_allow_remote` is set.
/// ANA with SPDK's parameters: `ana_reporting`, a listener's initial `ana_state`, a
/// namespace's `anagrpid`, `nvmf_subsystem_listener_set_ana_state`, and the states
/// `nvmf_subsystem_get_listeners` shows per group.
#[test]
fn ana_states_per_listener_and_group() {
    let f = fixture(RegistryOptions::default());
    f.call("nvmf_create_transport", json!({ "trtype": "TCP" }));
    f.call(
        "nvmf_create_subsystem",
        json!({ "nqn": NQN, "allow_any_host": true, "ana_reporting": true, "max_namespaces": 2 }),
    );
    let (p1, p2) = (free_port(), free_port());
    f.call("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": listen_address(p1) }));
    f.call(
        "nvmf_subsystem_add_listener",
        json!({ "nqn": NQN, "listen_address": listen_address(p2), "ana_state": "non_optimized" }),
    );
    f.malloc("m0");
    let nsid = f.call(
        "nvmf_subsystem_add_ns",
        json!({ "nqn": NQN, "namespace": { "bdev_name": "m0", "anagrpid": 2 } }),
    );
    assert_eq!(nsid, 1);
    f.call(
        "nvmf_subsystem_listener_set_ana_state",
        json!({ "nqn": NQN, "listen_address": listen_address(p1), "ana_state": "inaccessible", "anagrpid": 2 }),
    );
    let states = |l: &Value| -> Vec<(u64, String)> {
        l["ana_states"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["ana_group"].as_u64().unwrap(), s["ana_state"].as_str().unwrap().to_string()))
            .collect()
    };
    let listeners = f.call("nvmf_subsystem_get_listeners", json!({ "nqn": NQN }));
    assert_eq!(listeners[0]["address"]["trsvcid"], p1.to_string(), "{listeners}");
    assert_eq!(states(&listeners[0]), vec![(1, "optimized".into()), (2, "inaccessible".into())]);
    assert_eq!(states(&listeners[1]), vec![(1, "non_optimized".into()), (2, "non_optimized".into())]);
    assert_eq!(listeners[1]["ana_state"], "non_optimized");
    let subsystem = f.call("nvmf_get_subsystems", json!({ "nqn": NQN }));
    assert_eq!(subsystem[0]["namespaces"][0]["anagrpid"], 2, "{subsystem}");

    let e = f.fails(
        "nvmf_subsystem_listener_set_ana_state",
        json!({ "nqn": NQN, "listen_address": listen_address(p1), "ana_state": "optimized", "anagrpid": 3 }),
    );
    assert!(e.to_string().contains("anagrpid") && e.to_string().contains("1 to 2"), "{e}");
    let e = f.fails(
        "nvmf_subsystem_listener_set_ana_state",
        json!({ "nqn": NQN, "listen_address": listen_address(free_port()), "ana_state": "optimized" }),
    );
    assert!(e.to_string().contains("listener"), "{e}");
    f.malloc("m1");
    let e = f.fails(
        "nvmf_subsystem_add_ns",
        json!({ "nqn": NQN, "namespace": { "bdev_name": "m1", "anagrpid": 3 } }),
    );
    assert!(e.to_string().contains("anagrpid"), "{e}");

    // The namespace moves to group 1 (SPDK's nvmf_subsystem_set_ns_ana_group).
    let moved = json!({ "nqn": NQN, "nsid": 1, "anagrpid": 1 });
    assert_eq!(f.call("nvmf_subsystem_set_ns_ana_group", moved), json!(true));
    let subsystem = f.call("nvmf_get_subsystems", json!({ "nqn": NQN }));
    assert_eq!(subsystem[0]["namespaces"][0]["anagrpid"], 1, "{subsystem}");
    for (params, field) in [
        (json!({ "nqn": NQN, "nsid": 1, "anagrpid": 3 }), "anagrpid"),
        (json!({ "nqn": NQN, "nsid": 1, "anagrpid": 0 }), "anagrpid"),
        (json!({ "nqn": NQN, "nsid": 1 }), "anagrpid"),
        (json!({ "nqn": NQN, "anagrpid": 1 }), "nsid"),
    ] {
        let e = f.fails("nvmf_subsystem_set_ns_ana_group", params);
        assert!(e.to_string().contains(field), "{e}");
    }
    let e = f.fails("nvmf_subsystem_set_ns_ana_group", json!({ "nqn": NQN, "nsid": 2, "anagrpid": 1 }));
    assert!(e.to_string().contains("namespace"), "{e}");
}

#[test]
fn remote_listeners_need_the_setting() {
    let f = fixture(RegistryOptions::default());
    f.transport_and_subsystem();
    let any =
        json!({ "trtype": "TCP", "adrfam": "IPv4", "traddr": "0.0.0.0", "trsvcid": free_port().to_string() });
    let e = f.fails("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": any }));
    let (field, _) = e.bad_param().expect("a parameter error");
    assert_eq!(field, "traddr", "{e}");

    let f = fixture(RegistryOptions {
        kind_options: KindOptions::default().with("security", "nvmf_allow_remote", OptionValue::Bool(true)),
        ..RegistryOptions::default()
    });
    f.transport_and_subsystem();
    let port = free_port();
    let any = json!({ "trtype": "TCP", "adrfam": "IPv4", "traddr": "0.0.0.0", "trsvcid": port.to_string() });
    f.call("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": any }));
    TcpStream::connect(("127.0.0.1", port)).expect("a wildcard listener accepts on loopback too");
    f.call("nvmf_subsystem_remove_listener", json!({ "nqn": NQN, "listen_address": any }));
    assert_eq!(f.call("nvmf_subsystem_get_listeners", json!({ "nqn": NQN })), json!([]));
}

/// SPDK's socket implementation calls: the default (`posix`, or `uring` from the `[nvmf]
/// io_uring` option), a listener's own, names refused by their parameter.
#[test]
fn socket_implementations() {
    let f = fixture(RegistryOptions::default());
    let default = |f: &Fixture| f.call("sock_get_default_impl", json!({}));
    assert_eq!(default(&f), json!({ "impl_name": "posix" }));
    f.call("sock_set_default_impl", json!({ "impl_name": "uring" }));
    assert_eq!(default(&f), json!({ "impl_name": "uring" }));
    f.call("sock_impl_set_options", json!({ "impl_name": "uring" }));
    let e = f.fails("sock_set_default_impl", json!({ "impl_name": "vpp" }));
    let (field, why) = e.bad_param().expect("a parameter error");
    assert_eq!((field, why), ("impl_name", "unknown socket implementation \"vpp\" (posix or uring)"));
    let e = f.fails("sock_impl_set_options", json!({ "impl_name": "posix", "enable_ktls": true }));
    assert_eq!(e.bad_param().expect("a parameter error").0, "enable_ktls");
    // The process's default follows (the NVMe/TCP host's I/O queues take it); back to posix
    // for the other tests.
    assert_eq!(fp_conn::uring::default_impl(), fp_conn::uring::SocketImpl::Uring);
    f.call("sock_set_default_impl", json!({ "impl_name": "posix" }));
    assert_eq!(fp_conn::uring::default_impl(), fp_conn::uring::SocketImpl::Posix);

    f.transport_and_subsystem();
    let at = listen_address(free_port());
    let e =
        f.fails("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": at, "sock_impl": "x" }));
    assert_eq!(e.bad_param().expect("a parameter error").0, "sock_impl");
    f.call("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": at, "sock_impl": "posix" }));

    let f = fixture(RegistryOptions {
        kind_options: KindOptions::default().with("nvmf", "io_uring", OptionValue::Bool(true)),
        ..RegistryOptions::default()
    });
    assert_eq!(default(&f), json!({ "impl_name": "uring" }));
    fp_conn::uring::set_default_impl(fp_conn::uring::SocketImpl::Posix);
}

/// `nvmf_get_stats` per subsystem and namespace, and the metric families built from it.
#[test]
fn stats_and_metrics() {
    let f = fixture(RegistryOptions::default());
    f.transport_and_subsystem();
    f.malloc("m0");
    f.call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "m0", "nsid": 3 } }));
    let stats = f.call("nvmf_get_stats", json!({}));
    let s = &stats["subsystems"][0];
    assert_eq!(
        (s["nqn"].as_str(), s["controllers"].as_u64(), s["qpairs"].as_u64()),
        (Some(NQN), Some(0), Some(0))
    );
    assert_eq!(s["namespaces"][0]["nsid"], 3, "{stats}");
    assert_eq!(s["namespaces"][0]["read_ops"], 0, "{stats}");
    // SPDK's part: a poll group per reactor, nothing connected.
    assert_eq!(stats["tick_rate"], 1_000_000_000u64);
    assert_eq!(
        stats["poll_groups"],
        json!([{ "name": "nvmf_tgt_poll_group_0", "current_admin_qpairs": 0, "current_io_qpairs": 0,
                 "transports": [{ "trtype": "TCP" }] }])
    );

    let registry = f.registry.clone();
    let call = move |m: &str, p: Option<Value>| registry.call(m, p).ok();
    let families = super::NvmfKind.metrics(&call);
    let names: Vec<&str> = families.iter().map(|fam| fam.name).collect();
    assert_eq!(
        names,
        [
            "flashpath_nvmf_requests_total",
            "flashpath_nvmf_bytes_total",
            "flashpath_nvmf_errors_total",
            "flashpath_nvmf_controllers",
            "flashpath_nvmf_qpairs"
        ]
    );
    // One sample per operation of the one namespace, labelled with its subsystem and nsid.
    let requests = &families[0];
    assert_eq!(requests.samples.len(), 3);
    for (labels, _) in &requests.samples {
        assert_eq!(labels[0], ("nqn", NQN.to_string()));
        assert_eq!(labels[1], ("nsid", "3".to_string()));
    }
}

/// A namespace's bdev may grow (the namespace is told: `Export::resized`), not shrink: the
/// refusal names the namespace holding it.
#[test]
fn a_namespace_bdev_grows_but_does_not_shrink() {
    let f = fixture(RegistryOptions::default());
    f.transport_and_subsystem();
    f.call("bdev_null_create", json!({ "name": "n0", "num_blocks": 1024, "block_size": 512 }));
    f.call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "n0" } }));
    f.call("bdev_null_resize", json!({ "name": "n0", "new_size": 1 }));
    assert_eq!(f.bdev("n0")["num_blocks"], 2048);
    f.call("bdev_null_resize", json!({ "name": "n0", "new_size": 2 }));
    let e = f.fails("bdev_null_resize", json!({ "name": "n0", "new_size": 1 }));
    assert!(e.to_string().contains(&format!("{NQN}/1")), "{e}");
    assert_eq!(f.bdev("n0")["num_blocks"], 4096);
}

/// A registry on a running reactor, so queue pairs are served.
fn running_fixture() -> (Arc<Registry>, tempfile::TempDir, fp_reactor::ReactorSet) {
    let dir = tempfile::tempdir().unwrap();
    let reactors = fp_reactor::ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let registry =
        Registry::with_options(reactors.handles().to_vec(), dir.path(), RegistryOptions::default());
    (registry, dir, reactors)
}

#[test]
fn a_namespace_with_io_in_flight_is_not_released_when_its_drain_times_out() {
    let (registry, _dir, reactors) = running_fixture();
    let call =
        |m: &str, p: Value| registry.call(m, Some(p.clone())).unwrap_or_else(|e| panic!("{m} {p}: {e}"));
    registry.nvmf().set_drain_timeout(std::time::Duration::from_millis(300));
    call("nvmf_create_transport", json!({ "trtype": "tcp" }));
    call("nvmf_create_subsystem", json!({ "nqn": NQN, "allow_any_host": true }));
    let port = free_port();
    call("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": listen_address(port) }));
    call("bdev_malloc_create", json!({ "name": "m0", "num_blocks": 256, "block_size": 512 }));
    call("bdev_error_create", json!({ "base_name": "m0" }));
    call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "EE_m0", "nsid": 1 } }));
    call(
        "bdev_nvme_attach_controller",
        json!({ "name": "host", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
                "trsvcid": port.to_string(), "subnqn": NQN }),
    );
    // One write held by the error bdev: in flight on the namespace until resumed.
    call("bdev_error_inject_error", json!({ "name": "EE_m0", "io_type": "write", "error_type": "pending" }));
    let (nvme, _) = fp_bdev::ModuleHost::bdev(&*registry, "hostn1").expect("the host's namespace bdev");
    // The host's write, on a thread of its own: it returns once the write completed.
    let writer = std::thread::spawn(move || {
        let mut ch = nvme.open_channel().unwrap();
        fp_bdev::conformance::write_range(&mut *ch, 0, &[0x5a; 512]);
    });
    let held = |registry: &Registry| {
        let b = registry.call("bdev_get_bdevs", Some(json!({ "name": "EE_m0" }))).unwrap();
        let inj = &b[0]["driver_specific"]["error"]["injections"];
        assert!(inj.is_object(), "{b}");
        inj.get("write").is_none()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !held(&registry) {
        assert!(std::time::Instant::now() < deadline, "the write never reached the error bdev");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    // The drain times out: an error that says so and by how much; the bdev stays claimed.
    let e = registry.call("nvmf_subsystem_remove_ns", Some(json!({ "nqn": NQN, "nsid": 1 }))).unwrap_err();
    assert_eq!(e.to_rpc().code, -libc::EBUSY, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("1 command(s) are still in flight") && msg.contains("EE_m0"), "{msg}");
    let b = call("bdev_get_bdevs", json!({ "name": "EE_m0" }));
    assert_eq!(b[0]["claimed_by"], format!("{NQN}/1"), "{b}");
    let e = registry.call("bdev_error_delete", Some(json!({ "name": "EE_m0" }))).unwrap_err();
    assert_eq!(e.to_rpc().code, -libc::EBUSY, "{e}");
    // Hosts no longer see the namespace.
    let subs = call("nvmf_get_subsystems", json!({ "nqn": NQN }));
    assert_eq!(subs[0]["namespaces"], json!([]), "{subs}");
    // The subsystem cannot be deleted under it either.
    let e = registry.call("nvmf_delete_subsystem", Some(json!({ "nqn": NQN }))).unwrap_err();
    assert_eq!(e.to_rpc().code, -libc::EBUSY, "{e}");

    // Once the write finishes, removing again completes and releases the bdev.
    call("bdev_error_resume_pending", json!({ "name": "EE_m0" }));
    writer.join().expect("the write completed");
    assert_eq!(call("nvmf_subsystem_remove_ns", json!({ "nqn": NQN, "nsid": 1 })), true);
    assert_eq!(call("bdev_get_bdevs", json!({ "name": "EE_m0" }))[0]["claimed"], false);
    call("bdev_nvme_detach_controller", json!({ "name": "host" }));
    call("nvmf_delete_subsystem", json!({ "nqn": NQN }));
    drop(registry);
    reactors.shutdown();
}

/// A write a crypto bdev took and keeps retrying against its busy base is not in flight on
/// the device: `nvmf_subsystem_remove_ns` retries it until the daemon's drain bound
/// (`[nvmf] drain_timeout_ms`, here 300 ms), then answers it Command Abort Requested, answers
/// `true` and releases the bdev.
#[test]
fn removing_a_namespace_gives_up_a_write_parked_on_busy_at_the_configured_bound() {
    let dir = tempfile::tempdir().unwrap();
    let reactors = fp_reactor::ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let bound = std::time::Duration::from_millis(300);
    let options = RegistryOptions {
        kind_options: KindOptions::default().with(
            "nvmf",
            "drain_timeout_ms",
            OptionValue::Millis(bound.as_millis() as u64),
        ),
        ..RegistryOptions::default()
    };
    let registry = Registry::with_options(reactors.handles().to_vec(), dir.path(), options);
    let call =
        |m: &str, p: Value| registry.call(m, Some(p.clone())).unwrap_or_else(|e| panic!("{m} {p}: {e}"));
    call("nvmf_create_transport", json!({ "trtype": "tcp" }));
    call("nvmf_create_subsystem", json!({ "nqn": NQN, "allow_any_host": true }));
    let port = free_port();
    call("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": listen_address(port) }));
    call("bdev_malloc_create", json!({ "name": "m0", "num_blocks": 256, "block_size": 512 }));
    call("bdev_error_create", json!({ "base_name": "m0" }));
    call(
        "accel_crypto_key_create",
        json!({ "name": "k", "cipher": "AES_XTS", "key": "11".repeat(32), "key2": "22".repeat(32) }),
    );
    call("bdev_crypto_create", json!({ "base_bdev_name": "EE_m0", "name": "c", "key_name": "k" }));
    call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "c", "nsid": 1 } }));
    call(
        "bdev_nvme_attach_controller",
        json!({ "name": "host", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
                "trsvcid": port.to_string(), "subnqn": NQN }),
    );
    call(
        "bdev_error_inject_error",
        json!({ "name": "EE_m0", "io_type": "write", "error_type": "nomem", "num": 1u64 << 40 }),
    );
    let (nvme, _) = fp_bdev::ModuleHost::bdev(&*registry, "hostn1").expect("the host's namespace bdev");
    let writer = std::thread::spawn(move || {
        let mut ch = nvme.open_channel().unwrap();
        fp_bdev::conformance::write_status(&mut *ch, 0, &[0x5a; 512])
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let b = call("bdev_get_bdevs", json!({ "name": "EE_m0" }));
        let left = b[0]["driver_specific"]["error"]["injections"]["write"]["num"].as_u64();
        if left.is_some_and(|n| n < 1 << 40) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the write never reached the error bdev");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    let start = std::time::Instant::now();
    assert_eq!(call("nvmf_subsystem_remove_ns", json!({ "nqn": NQN, "nsid": 1 })), true);
    let took = start.elapsed();
    // The configured bound, not the 5 s default.
    assert!(took >= bound && took < fp_nvmf::DRAIN_TIMEOUT, "{took:?}");
    assert_eq!(call("bdev_get_bdevs", json!({ "name": "c" }))[0]["claimed"], false);
    let status = writer.join().expect("the write was answered");
    assert_ne!(status, fp_bdev::IoStatus::Success, "the parked write failed");
    call("bdev_nvme_detach_controller", json!({ "name": "host" }));
    call("nvmf_delete_subsystem", json!({ "nqn": NQN }));
    drop(registry);
    reactors.shutdown();
}
