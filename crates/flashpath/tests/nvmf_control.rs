//! The nvmf export's control plane as a host sees it, through the minimal NVMe/TCP host of
//! tests/common/nvme_tcp.rs: a disk resized with the CLI reaches a connected host as a
//! Namespace Attribute Changed event and a new size in Identify Namespace; removing the host
//! from the subsystem's list disconnects it; deleting the subsystem under a connected host
//! releases the disk and closes the connections.

mod common;

use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

use common::nvme_tcp::Host;
use common::{bounded, Daemon};
use serde_json::json;

const NQN: &str = "nqn.2016-06.io.spdk:ctl1";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:2b2b2b2b-2b2b-2b2b-2b2b-2b2b2b2b2b2b";
const OTHER_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:3c3c3c3c-3c3c-3c3c-3c3c-3c3c3c3c3c3c";

/// A daemon with a 4 MiB null disk `n0` as namespace 1 of [`NQN`], listening on a free
/// loopback port; returns it with the listener's address.
fn target(allow_any_host: bool) -> (Daemon, String) {
    let d = Daemon::start("0");
    d.call("bdev_null_create", json!({"name": "n0", "num_blocks": 8192, "block_size": 512}));
    d.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    d.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": allow_any_host}));
    d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "n0"}}));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen =
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    d.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": listen}));
    (d, format!("127.0.0.1:{port}"))
}

fn connect(addr: &str) -> Host {
    let addr = addr.to_string();
    bounded(Duration::from_secs(30), "connecting", move || {
        Host::connect(&addr, NQN, HOSTNQN).expect("connect")
    })
}

/// NSZE, the namespace's size in blocks (Identify Namespace bytes 0-7).
fn nsze(host: &mut Host) -> u64 {
    let (c, data) = host.admin.identify_namespace(1).unwrap();
    assert_eq!(c.status, 0, "Identify Namespace: {c:?}");
    u64::from_le_bytes(data[0..8].try_into().unwrap())
}

/// Waits until `conn` is closed by the target (a read returns end of file or an error).
fn closed(stream_read: impl FnOnce() -> std::io::Result<usize>) -> bool {
    matches!(stream_read(), Ok(0) | Err(_))
}

#[test]
fn a_resized_disk_reaches_the_connected_host() {
    let (d, addr) = target(true);
    let mut host = connect(&addr);
    assert_eq!(nsze(&mut host), 8192);
    assert_eq!(host.admin.enable_namespace_events().unwrap().status, 0);
    let aer = host.admin.async_event_request().unwrap();
    // The CLI, as an operator resizes a disk: 4 MiB to 8 MiB.
    let out = Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .args(["--rpc", d.rpc.to_str().unwrap(), "disk", "resize", "n0", "--size", "8MiB"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c = host.admin.wait(aer).unwrap();
    // Asynchronous event: type Notice (2), information Namespace Attribute Changed (0), log page
    // Changed Namespace List (04h) (NVMe Base 2.0, 5.2).
    assert_eq!((c.status, c.dw0 & 0x7, (c.dw0 >> 8) & 0xff, (c.dw0 >> 16) & 0xff), (0, 2, 0, 4), "{c:?}");
    assert_eq!(nsze(&mut host), 16384);
}

#[test]
fn a_host_removed_from_the_list_is_disconnected() {
    let (d, addr) = target(false);
    d.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOSTNQN}));
    let mut host = connect(&addr);
    assert_eq!(d.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN}))[0]["hostnqn"], HOSTNQN);
    d.call("nvmf_subsystem_remove_host", json!({"nqn": NQN, "host": HOSTNQN}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN})) != json!([]) {
        assert!(Instant::now() < deadline, "the removed host's controller is still there");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut byte = [0u8; 1];
    assert!(closed(|| host.io.stream().read(&mut byte)), "the I/O queue's connection stays open");
}

#[test]
fn deleting_a_subsystem_under_a_connected_host_releases_the_disk() {
    let (d, addr) = target(true);
    let mut host = connect(&addr);
    assert_eq!(host.io.write(1, 0, 512, &[7; 512]).unwrap().status, 0);
    d.call("nvmf_delete_subsystem", json!({"nqn": NQN}));
    assert_eq!(d.call("bdev_get_bdevs", json!({"name": "n0"}))[0]["claimed"], false);
    let mut byte = [0u8; 1];
    assert!(closed(|| host.admin.stream().read(&mut byte)), "the admin queue's connection stays open");
    assert!(closed(|| host.io.stream().read(&mut byte)), "the I/O queue's connection stays open");
    assert!(std::net::TcpStream::connect(&addr).is_err(), "the listener outlived its subsystem");
    d.call("bdev_null_delete", json!({"name": "n0"}));
}

/// SIGTERM while three hosts' writes are held by three disks (error bdevs' `pending`, never
/// resumed): the daemon exits within its documented bound, one drain timeout (5 s) for all
/// namespaces together (docs/nvmf.md, "Stopping the daemon"), having logged each command still
/// outstanding.
#[test]
fn the_daemon_stops_within_one_drain_bound_with_writes_stuck_on_its_disks() {
    let mut d = Daemon::start("0");
    d.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    d.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": true}));
    let disks = ["m1", "m2", "m3"];
    for m in disks {
        d.call("bdev_malloc_create", json!({"name": m, "num_blocks": 8192, "block_size": 512}));
        d.call("bdev_error_create", json!({"base_name": m}));
        d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": format!("EE_{m}")}}));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen =
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    d.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": listen}));
    let mut writers = Vec::new();
    for (i, m) in disks.iter().enumerate() {
        let host = connect(&format!("127.0.0.1:{port}"));
        let ee = format!("EE_{m}");
        d.call("bdev_error_inject_error", json!({"name": ee, "io_type": "write", "error_type": "pending"}));
        writers.push(std::thread::spawn(move || {
            // The whole host: its admin queue must stay connected (keeping the controller).
            let mut host = host;
            host.io.stream().set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            host.io.write(i as u32 + 1, 0, 512, &[7; 512])
        }));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let b = d.call("bdev_get_bdevs", json!({"name": ee}));
            if b[0]["driver_specific"]["error"]["injections"].get("write").is_none() {
                break;
            }
            assert!(Instant::now() < deadline, "the write never reached {ee}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let started = Instant::now();
    // One drain bound for all three namespaces (8 s with the stops' report margin), not one
    // per namespace (15 s).
    let status = d.stop().expect("the daemon's exit status");
    let took = started.elapsed();
    let stderr = d.stderr();
    use std::os::unix::process::ExitStatusExt;
    assert!(status.success() || status.signal() == Some(libc::SIGTERM), "{status} after {took:?}\n{stderr}");
    assert!(took < Duration::from_secs(12), "SIGTERM took {took:?}: not one drain bound for all\n{stderr}");
    for m in disks {
        let said =
            format!("(bdev 'EE_{m}'): 1 command(s) still outstanding on the device as the target stops");
        assert!(stderr.contains(&said), "nothing said about EE_{m}'s held write:\n{stderr}");
    }
    // The hosts are not left hanging either: each write ends (aborted) or its connection closes.
    for w in writers {
        let _ = w.join().expect("the writer ended");
    }
}

/// DHHC-1 secrets `host0`, `host1` and `ctrl0` as owner-only files in `dir`.
fn add_key_files(dir: &std::path::Path) {
    for (name, text) in [
        ("host0", "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n"),
        ("host1", "DHHC-1:00:ISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0Dc1bqW:\n"),
        ("ctrl0", "DHHC-1:00:YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4AupgK0:\n"),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
}

/// The secrets of [`add_key_files`] in the daemon's keyring, under their names.
fn add_keys(d: &Daemon, dir: &std::path::Path) {
    add_key_files(dir);
    for name in ["host0", "host1", "ctrl0"] {
        d.call("keyring_file_add_key", json!({"name": name, "path": dir.join(name).to_str().unwrap()}));
    }
}

fn attach_params(name: &str, addr: &str, keys: serde_json::Value) -> serde_json::Value {
    let (traddr, port) = addr.split_once(':').unwrap();
    let mut p = json!({"name": name, "trtype": "tcp", "traddr": traddr, "adrfam": "ipv4",
                       "trsvcid": port, "subnqn": NQN, "hostnqn": HOSTNQN});
    p.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
    p
}

/// flashpath's initiator against flashpath's target with DH-HMAC-CHAP: a host with a key
/// must authenticate each queue; the right key attaches (unidirectional, and bidirectional
/// with the controller's key) and serves verified I/O, a wrong one is refused while another
/// host's connection carries on, a command before authentication gets Authentication
/// Required, and `nvmf_subsystem_set_keys` applies to the next connection.
#[test]
fn dhchap_authenticates_each_host_with_its_keys() {
    let (d, addr) = target(false);
    let dir = tempfile::tempdir().unwrap();
    add_keys(&d, dir.path());
    // The exchange runs in ffdhe2048; the host offers SHA-256 and SHA-384 only.
    d.call("nvmf_set_config", json!({"dhchap_dhgroups": ["ffdhe2048"]}));
    d.call("bdev_nvme_set_options", json!({"dhchap_digests": ["sha256", "sha384"]}));
    for (params, want) in [
        (json!({"dhchap_dhgroups": ["ffdhe1024"]}), "dhchap_dhgroups: 'ffdhe1024' is not one of"),
        (json!({"conn_sched": "roundrobin"}), "conn_sched"),
    ] {
        let e = d.try_call("nvmf_set_config", params.clone()).unwrap_err();
        assert!(e.message.starts_with(want), "{params}: {e:?}");
    }
    let e = d
        .try_call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOSTNQN, "dhchap_key": "nope"}))
        .unwrap_err();
    assert!(e.message.starts_with("dhchap_key: "), "{e:?}");
    d.call(
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN, "host": HOSTNQN, "dhchap_key": "host0", "dhchap_ctrlr_key": "ctrl0"}),
    );
    // The hosts with their keys' names, as SPDK shows them; never a secret.
    let s = d.call("nvmf_get_subsystems", json!({"nqn": NQN}));
    let want = json!([{"nqn": HOSTNQN, "dhchap_key": "host0", "dhchap_ctrlr_key": "ctrl0"}]);
    assert_eq!(s[0]["hosts"], want, "{s}");
    assert!(!s.to_string().contains("DHHC-1"), "a secret in nvmf_get_subsystems: {s}");
    // Namespace 2 keeps what is written, for the I/O check.
    d.malloc("m0", 2048, 512);
    d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "m0"}}));
    // Another host, without keys, connected all along.
    d.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": OTHER_HOSTNQN}));
    let other = Host::connect(&addr, NQN, OTHER_HOSTNQN);
    let mut other = other.expect("a host without keys connects without authenticating");

    // A command other than authentication before the transaction: Authentication Required.
    let mut q = common::nvme_tcp::Queue::open(&addr).unwrap();
    q.connect(NQN, HOSTNQN, 0, 32, 0xffff).unwrap();
    let c = q.property_set(0x14, 0x0046_0001).unwrap();
    // SCT 1, SC 0x91 (the DNR bit aside).
    assert_eq!(c.status & 0x7ff, 0x191, "Property Set before authentication: {c:?}");
    drop(q);

    let wrong = d.try_call(
        "bdev_nvme_attach_controller",
        attach_params("Nvme0", &addr, json!({"dhchap_key": "host1"})),
    );
    assert!(wrong.is_err(), "a wrong key attached: {wrong:?}");
    let none = d.try_call("bdev_nvme_attach_controller", attach_params("Nvme0", &addr, json!({})));
    assert!(none.is_err(), "no key attached: {none:?}");

    assert_eq!(nsze(&mut other), 8192, "the other host's connection after the refusals");
    // The refused hosts' controllers are gone once their connections close: only the other
    // host's is left.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = d.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN}));
        let hosts: Vec<&str> = c.as_array().unwrap().iter().map(|c| c["hostnqn"].as_str().unwrap()).collect();
        if hosts == [OTHER_HOSTNQN] {
            break;
        }
        assert!(Instant::now() < deadline, "controllers left by refused hosts: {c}");
        std::thread::sleep(Duration::from_millis(20));
    }

    let uni = attach_params("Nvme0", &addr, json!({"dhchap_key": "host0"}));
    assert_eq!(d.call("bdev_nvme_attach_controller", uni), json!(["Nvme0n1", "Nvme0n2"]));
    d.call("bdev_nvme_detach_controller", json!({"name": "Nvme0"}));
    let bi = attach_params("Nvme0", &addr, json!({"dhchap_key": "host0", "dhchap_ctrlr_key": "ctrl0"}));
    assert_eq!(d.call("bdev_nvme_attach_controller", bi), json!(["Nvme0n1", "Nvme0n2"]));
    // I/O over the authenticated queues, read back through a vhost-user disk.
    let sock = d.controller("vhost.0", "Nvme0n2", Some(1), false);
    let mut client = common::BlkClient::open(&sock, 1);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(client.write(0, 8192, &data), 0);
    assert_eq!(client.read(0, 8192, 4096).expect("read back"), data);
    // A host expecting another controller key refuses the controller.
    let bad_ctrl = attach_params("Nvme1", &addr, json!({"dhchap_key": "host0", "dhchap_ctrlr_key": "host1"}));
    assert!(d.try_call("bdev_nvme_attach_controller", bad_ctrl).is_err());

    d.call("nvmf_subsystem_set_keys", json!({"nqn": NQN, "host": HOSTNQN, "dhchap_key": "host1"}));
    let hosts = &d.call("nvmf_get_subsystems", json!({"nqn": NQN}))[0]["hosts"];
    assert!(hosts.as_array().unwrap().contains(&json!({"nqn": HOSTNQN, "dhchap_key": "host1"})), "{hosts}");
    let old = attach_params("Nvme2", &addr, json!({"dhchap_key": "host0"}));
    assert!(d.try_call("bdev_nvme_attach_controller", old).is_err(), "the replaced key still works");
    let new = attach_params("Nvme2", &addr, json!({"dhchap_key": "host1"}));
    assert_eq!(d.call("bdev_nvme_attach_controller", new), json!(["Nvme2n1", "Nvme2n2"]));
    // Only a hash the host does not offer: refused; one it offers: authenticated.
    d.call("nvmf_set_config", json!({"dhchap_digests": ["sha512"]}));
    assert!(d
        .try_call(
            "bdev_nvme_attach_controller",
            attach_params("Nvme3", &addr, json!({"dhchap_key": "host1"}))
        )
        .is_err());
    d.call("nvmf_set_config", json!({"dhchap_digests": ["sha384"]}));
    let sha384 = attach_params("Nvme3", &addr, json!({"dhchap_key": "host1"}));
    assert_eq!(d.call("bdev_nvme_attach_controller", sha384), json!(["Nvme3n1", "Nvme3n2"]));
    // The connection authenticated before the change still serves its host.
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    assert_eq!(c[0]["ctrlrs"][0]["state"], "enabled", "{c}");
}

/// The configuration file: `[nvmf_config]` sets the groups, an `[[nvmf_host]]` names its key
/// in the keyring, and that host must authenticate; the subsystem has `require_dhchap`, so no
/// host can be listed without a key nor any host allowed, and `nvmf_get_subsystems` shows it
/// and the host's key name.
#[test]
fn a_config_file_host_with_a_key_must_authenticate() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = Daemon::start_with_config("0", |dir| {
        add_key_files(dir);
        let key = dir.join("host0");
        format!(
            r#"
[[keyring_file_key]]
name = "host0"
path = "{}"

[[bdev]]
type = "null"
name = "n0"
num_blocks = 8192
block_size = 512

[nvmf_config]
dhchap_dhgroups = ["ffdhe3072"]

[[nvmf_transport]]
trtype = "TCP"

[[nvmf_subsystem]]
nqn = "{NQN}"
allow_any_host = false
require_dhchap = true

[[nvmf_listener]]
nqn = "{NQN}"
listen_address = {{ trtype = "TCP", adrfam = "IPv4", traddr = "127.0.0.1", trsvcid = "{port}" }}

[[nvmf_host]]
nqn = "{NQN}"
host = "{HOSTNQN}"
dhchap_key = "host0"

[[nvmf_ns]]
nqn = "{NQN}"
namespace = {{ bdev_name = "n0" }}
"#,
            key.display()
        )
    });
    let addr = format!("127.0.0.1:{port}");
    assert!(d.try_call("bdev_nvme_attach_controller", attach_params("Nvme0", &addr, json!({}))).is_err());
    let keyed = attach_params("Nvme0", &addr, json!({"dhchap_key": "host0"}));
    assert_eq!(d.call("bdev_nvme_attach_controller", keyed), json!(["Nvme0n1"]));

    let s = &d.call("nvmf_get_subsystems", json!({"nqn": NQN}))[0];
    assert_eq!(s["require_dhchap"], json!(true), "{s}");
    assert_eq!(s["hosts"], json!([{"nqn": HOSTNQN, "dhchap_key": "host0"}]), "{s}");
    for (method, params, want) in [
        (
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": OTHER_HOSTNQN}),
            "dhchap_key: required: the subsystem has require_dhchap",
        ),
        (
            "nvmf_subsystem_set_keys",
            json!({"nqn": NQN, "host": HOSTNQN}),
            "dhchap_key: required: the subsystem has require_dhchap",
        ),
        (
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": NQN, "allow_any_host": true}),
            "allow_any_host: require_dhchap and allow_any_host together",
        ),
        (
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2016-06.io.spdk:ctl2", "allow_any_host": true, "require_dhchap": true}),
            "require_dhchap: require_dhchap and allow_any_host together",
        ),
    ] {
        let e = d.try_call(method, params.clone()).unwrap_err();
        assert!(e.message.starts_with(want), "{method} {params}: {e:?}");
    }
    // The host kept its key: it still authenticates.
    let again = attach_params("Nvme1", &addr, json!({"dhchap_key": "host0"}));
    assert_eq!(d.call("bdev_nvme_attach_controller", again), json!(["Nvme1n1"]));
}
