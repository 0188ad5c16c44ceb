//! The NVMe driver's control plane end to end (docs/nvme.md): a daemon serves a RAM disk over
//! its own NVMe/TCP target on loopback and attaches it back as an NVMe/TCP controller
//! (`bdev_nvme_attach_controller`), so the whole initiator (controller thread, I/O queue pairs
//! polled on the reactors, resets) runs against a real target in the same process.
//!
//! * [`a_tcp_controller_serves_verified_io_and_survives_resets`]: `Nvme0n1` served over
//!   vhost-user, random writes read back and compared while `bdev_nvme_reset_controller` runs
//!   again and again (no request fails), `bdev_nvme_get_controllers` in SPDK's shape, detach
//!   refused while exported, then detached.
//! * [`every_refusal_names_its_field`]: bad parameters over JSON-RPC, "invalid params" naming
//!   the field, the daemon unharmed.
//! * [`a_config_file_attaches_controllers_before_the_bdevs`]: a second daemon attaches the
//!   first's subsystem from `[[nvme_controller]]` and stacks a delay bdev on it from `[[bdev]]`.
//! * [`the_cli_attaches_lists_resets_and_detaches`]: `flashpath nvme ...`.
//! * [`the_daemon_stops_with_a_controller_attached`]: SIGTERM detaches it, promptly.
//! * [`a_lost_tcp_controller_reconnects_by_its_timeouts`]: SPDK's reconnect policy over RPC.
//! * [`the_host_nqn_is_the_one_the_target_checks`]: `hostnqn` against a host list.
//! * [`dhchap_keys_are_keyring_names`]: `dhchap_key` / `dhchap_ctrlr_key` resolved in the keyring,
//!   by `bdev_nvme_attach_controller`, `bdev_nvme_set_keys` and `flashpath nvme set-keys`.
//! * [`psk_is_a_keyring_name_and_every_queue_runs_tls`]: `psk` resolved in the keyring and
//!   refused by name; through a TLS terminator in front of the target, a wrong PSK refused by
//!   kind and the right one attached, `psk` in `bdev_nvme_get_controllers`.
//! * [`namespace_changes_reach_the_registry`]: a namespace resized, removed and added back on
//!   the target reaches the attached side's bdevs through asynchronous events; removed while
//!   exported, its bdev stays (its I/O fails) until detach deletes it.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{random_write_verify, rpc_call, BlkClient, Daemon};
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:nvme-ctl";
/// The RAM disk behind the subsystem: 32 MiB of 512-byte blocks.
const BLOCKS: u64 = 65536;

/// Makes `d` serve a RAM disk `m0` as namespace 1 of [`NQN`] on a free loopback port; returns
/// the port.
fn serve_target(d: &Daemon) -> u16 {
    d.malloc("m0", BLOCKS, 512);
    d.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    d.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": true}));
    d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "m0"}}));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen =
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    d.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": listen}));
    port
}

fn attach_params(name: &str, port: u16) -> Value {
    json!({"name": name, "trtype": "tcp", "traddr": "127.0.0.1", "adrfam": "ipv4",
           "trsvcid": port.to_string(), "subnqn": NQN})
}

#[test]
fn a_tcp_controller_serves_verified_io_and_survives_resets() {
    let d = Daemon::start("0");
    let port = serve_target(&d);
    let names = d.call("bdev_nvme_attach_controller", attach_params("Nvme0", port));
    assert_eq!(names, json!(["Nvme0n1"]));

    let b = &d.call("bdev_get_bdevs", json!({"name": "Nvme0n1"}))[0];
    assert_eq!((b["num_blocks"].as_u64(), b["block_size"].as_u64()), (Some(BLOCKS), Some(512)), "{b}");
    assert_eq!(b["product_name"], "NVMe disk");
    let nvme = &b["driver_specific"]["nvme"];
    assert_eq!(nvme["controller"], "Nvme0", "{b}");
    assert_eq!(nvme["ns_data"]["id"], 1, "{b}");
    assert_eq!(nvme["trid"]["trtype"], "TCP", "{b}");

    let c = d.call("bdev_nvme_get_controllers", json!({}));
    assert_eq!(c.as_array().map(Vec::len), Some(1), "{c}");
    assert_eq!(c[0]["name"], "Nvme0");
    let path = &c[0]["ctrlrs"][0];
    assert_eq!(path["state"], "enabled", "{c}");
    assert_eq!(
        path["trid"],
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string(), "subnqn": NQN})
    );
    assert!(path["host"]["nqn"].as_str().unwrap().starts_with("nqn.2014-08.org.nvmexpress:uuid:"), "{c}");
    // Our own target sees the same controller ID.
    let ours = d.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN}));
    assert_eq!(ours[0]["cntlid"], path["cntlid"], "{ours} vs {c}");
    assert_eq!(d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"})), c);

    // Verified random I/O through vhost-user, with resets going on under it.
    let sock = d.controller("vhost.0", "Nvme0n1", Some(2), false);
    let mut client = BlkClient::open(&sock, 2);
    assert_eq!(client.capacity, BLOCKS * 512);
    let stop = Arc::new(AtomicBool::new(false));
    let resetter = {
        let (rpc, stop) = (d.rpc.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut resets = 0;
            while !stop.load(Ordering::Acquire) {
                let r = rpc_call(&rpc, "bdev_nvme_reset_controller", Some(json!({"name": "Nvme0"}))).unwrap();
                assert_eq!(r.unwrap(), json!(true), "reset {resets}");
                resets += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            resets
        })
    };
    let compared = random_write_verify(&mut client, 25, 24, 0, 8 << 20, Some(0));
    stop.store(true, Ordering::Release);
    let resets = resetter.join().expect("the reset thread");
    assert!(compared >= 8 << 20, "compared {compared} bytes");
    assert!(resets >= 2, "only {resets} resets ran under I/O");
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    assert_eq!(c[0]["ctrlrs"][0]["state"], "enabled", "{c}");
    // The same data, read again after the last reset.
    random_write_verify(&mut client, 26, 2, 8 << 20, 1 << 20, Some(0));

    // Detach is refused while the namespace is exported, as every delete, and changes nothing.
    let e = d.try_call("bdev_nvme_detach_controller", json!({"name": "Nvme0"})).unwrap_err();
    assert_eq!(e.code, -16, "{e:?}");
    assert!(e.message.contains("Nvme0n1") && e.message.contains("vhost.0"), "{e:?}");
    assert_eq!(d.call("bdev_get_bdevs", json!({"name": "Nvme0n1"}))[0]["name"], "Nvme0n1");
    drop(client);
    d.call("vhost_delete_controller", json!({"ctrlr": "vhost.0"}));
    assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Nvme0"})), json!(true));
    assert!(d.try_call("bdev_get_bdevs", json!({"name": "Nvme0n1"})).is_err());
    assert_eq!(d.call("bdev_nvme_get_controllers", json!({})), json!([]));
    // The target let go of the host's controller.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN})) != json!([]) {
        assert!(std::time::Instant::now() < deadline, "the target still has the detached controller");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Attached again under the same name, the disk holds what was written.
    assert_eq!(d.call("bdev_nvme_attach_controller", attach_params("Nvme0", port)), json!(["Nvme0n1"]));
}

#[test]
fn every_refusal_names_its_field() {
    let d = Daemon::start("0");
    let port = serve_target(&d);
    let tcp = |extra: Value| {
        let mut p = attach_params("Nvme9", port);
        p.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        ("bdev_nvme_attach_controller", p)
    };
    d.call("bdev_nvme_attach_controller", attach_params("Nvme0", port));
    let cases = [
        (tcp(json!({"trtype": "rdma"})), "trtype: 'rdma' is not supported: PCIe or TCP"),
        (tcp(json!({"traddr": "not-an-ip"})), "traddr: 'not-an-ip' is not an IPv4 or IPv6 address"),
        (tcp(json!({"adrfam": "ipv6"})), "adrfam: IPv6 does not match traddr 127.0.0.1"),
        (tcp(json!({"trsvcid": "70000"})), "trsvcid: '70000' is not a port number"),
        (tcp(json!({"subnqn": "cnode1"})), "subnqn: 'cnode1' is not an NQN"),
        (tcp(json!({"hostaddr": "127.0.0.2"})), "hostaddr: not supported"),
        (tcp(json!({"multipath": "both"})), "multipath: 'both' is not one of disable, failover, multipath"),
        (tcp(json!({"psk": "k"})), "psk: invalid parameter key: no key named 'k' in the keyring"),
        (tcp(json!({"ctrlr_loss_timeout_sec": 5})), "reconnect_delay_sec: must not be 0"),
        (
            tcp(json!({"ctrlr_loss_timeout_sec": 5, "reconnect_delay_sec": 6})),
            "reconnect_delay_sec: 6 is more than",
        ),
        (
            tcp(
                json!({"ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 2, "fast_io_fail_timeout_sec": 1}),
            ),
            "fast_io_fail_timeout_sec: 1 is less than reconnect_delay_sec 2",
        ),
        (
            tcp(json!({"name": "Nvme0"})),
            "name: NVMe controller 'Nvme0' already exists and multipath is disabled",
        ),
        (
            tcp(json!({"name": "Nvme0", "multipath": "multipath"})),
            "traddr: NVMe controller 'Nvme0' already has the path",
        ),
        (tcp(json!({"bogus": 1})), "bogus: unknown parameter; accepted: name, trtype"),
        (
            (
                "bdev_nvme_attach_controller",
                json!({"name": "P", "trtype": "PCIe", "traddr": "0000:00:04.0", "trsvcid": "1"}),
            ),
            "trsvcid: only for trtype TCP",
        ),
        (("bdev_nvme_detach_controller", json!({"name": "nope"})), "name: no NVMe controller 'nope'"),
        (
            ("bdev_nvme_detach_controller", json!({"name": "Nvme0", "traddr": "10.0.0.1"})),
            "traddr: '10.0.0.1' is not a path",
        ),
        (("bdev_nvme_reset_controller", json!({"name": "nope"})), "name: no NVMe controller 'nope'"),
        (("bdev_nvme_reset_controller", json!({"name": "Nvme0", "cntlid": 65535})), "cntlid: 65535 is not"),
        (("bdev_nvme_get_controllers", json!({"name": "nope"})), "name: no NVMe controller 'nope'"),
        (
            ("bdev_nvme_set_options", json!({"action_on_timeout": "explode"})),
            "action_on_timeout: 'explode' is not one of",
        ),
        (
            ("bdev_nvme_set_options", json!({"timeout_us": 1000})),
            "timeout_us: bdev_nvme_set_options is refused once a controller is attached",
        ),
    ];
    for ((method, params), want) in cases {
        let e = d.try_call(method, params.clone()).unwrap_err();
        assert_eq!(e.code, -32602, "{method} {params}: {e:?}");
        assert!(
            e.message.starts_with(want),
            "{method} {params}: {:?} does not start with {want:?}",
            e.message
        );
    }
    // A subsystem that does not exist: the target refuses the Connect; nothing is left behind.
    let e = d
        .try_call("bdev_nvme_attach_controller", tcp(json!({"subnqn": "nqn.2016-06.io.spdk:none"})).1)
        .unwrap_err();
    assert_ne!(e.code, -32602, "{e:?}");
    // A PCI function that is not there: VFIO's open says so.
    let e = d
        .try_call(
            "bdev_nvme_attach_controller",
            json!({"name": "P", "trtype": "pcie", "traddr": "ffff:ff:1f.7"}),
        )
        .unwrap_err();
    assert!(e.message.contains("ffff:ff:1f.7"), "{e:?}");
    let c = d.call("bdev_nvme_get_controllers", json!({}));
    assert_eq!(c.as_array().map(Vec::len), Some(1), "only Nvme0 is attached: {c}");
    let names: Vec<Value> =
        d.call("bdev_get_bdevs", json!({})).as_array().unwrap().iter().map(|b| b["name"].clone()).collect();
    assert_eq!(names, [json!("Nvme0n1"), json!("m0")]);
    // Options are settable again once nothing is attached.
    d.call("bdev_nvme_detach_controller", json!({"name": "Nvme0"}));
    d.call(
        "bdev_nvme_set_options",
        json!({"timeout_us": 5_000_000, "action_on_timeout": "abort", "keep_alive_timeout_ms": 5000}),
    );
    assert_eq!(d.call("bdev_nvme_attach_controller", attach_params("Nvme1", port)), json!(["Nvme1n1"]));
}

#[test]
fn a_config_file_attaches_controllers_before_the_bdevs() {
    let target = Daemon::start("0");
    let port = serve_target(&target);
    let d = Daemon::start_with_config("0", |_| {
        format!(
            r#"
            [[bdev]]
            type = "delay"
            name = "slow"
            base_bdev_name = "Remote0n1"
            avg_read_latency = 10
            p99_read_latency = 10
            avg_write_latency = 10
            p99_write_latency = 10

            [nvme_options]
            keep_alive_timeout_ms = 4000

            [[nvme_controller]]
            name = "Remote0"
            trtype = "TCP"
            traddr = "127.0.0.1"
            trsvcid = "{port}"
            subnqn = "{NQN}"
            ctrlr_loss_timeout_sec = -1
            reconnect_delay_sec = 1
            "#
        )
    });
    let b = &d.call("bdev_get_bdevs", json!({"name": "slow"}))[0];
    assert_eq!(b["num_blocks"].as_u64(), Some(BLOCKS), "{b}");
    let r = &d.call("bdev_get_bdevs", json!({"name": "Remote0n1"}))[0];
    assert_eq!(r["claimed"], true, "{r}");
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Remote0"}));
    assert_eq!(c[0]["ctrlrs"][0]["trid"]["trsvcid"], port.to_string(), "{c}");
}

fn cli(rpc: &Path, args: &[&str]) -> (bool, String, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_flashpath")).arg("--rpc").arg(rpc).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn the_cli_attaches_lists_resets_and_detaches() {
    let d = Daemon::start("0");
    let port = serve_target(&d).to_string();
    let (ok, out, err) = cli(&d.rpc, &["nvme", "options", "--keep-alive-timeout-ms", "6000"]);
    assert!(ok, "{err}");
    assert_eq!(out, "");
    let attach = [
        "nvme",
        "attach",
        "Nvme0",
        "--trtype",
        "tcp",
        "--traddr",
        "127.0.0.1",
        "--trsvcid",
        &port,
        "--subnqn",
        NQN,
    ];
    let (ok, out, err) = cli(&d.rpc, &attach);
    assert!(ok, "{err}");
    assert_eq!(out, "Nvme0n1\n");
    let (ok, out, err) = cli(&d.rpc, &["nvme", "list"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[..5], ["Nvme0", "enabled", "TCP", &format!("127.0.0.1:{port}"), NQN], "{out}");
    assert_eq!(row.last(), Some(&"Nvme0n1"), "{out}");
    let (ok, _, err) = cli(&d.rpc, &["nvme", "reset", "Nvme0"]);
    assert!(ok, "{err}");
    // Refusals are one line naming the option typed.
    let (ok, _, err) = cli(&d.rpc, &["nvme", "attach", "Nvme1", "--trtype", "rdma", "--traddr", "127.0.0.1"]);
    assert!(!ok);
    assert_eq!(err, "error: --trtype: 'rdma' is not supported: PCIe or TCP\n");
    let (ok, _, err) = cli(&d.rpc, &["nvme", "options", "--timeout-us", "10"]);
    assert!(!ok);
    assert!(
        err.starts_with("error: --timeout-us: bdev_nvme_set_options is refused once")
            && err.lines().count() == 1,
        "{err}"
    );
    let (ok, _, err) = cli(&d.rpc, &["nvme", "detach", "Nvme7"]);
    assert!(!ok);
    assert_eq!(err, "error: NAME: no NVMe controller 'Nvme7'\n");
    let (ok, _, err) = cli(&d.rpc, &["nvme", "detach", "Nvme0"]);
    assert!(ok, "{err}");
    let (ok, out, _) = cli(&d.rpc, &["--json", "nvme", "list"]);
    assert!(ok);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!([]));
}

/// Waits until `check` holds, for up to 10 s.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A namespace resized or removed on the target reaches the attached side through the
/// controller's asynchronous events: the bdev is resized (its export told), then deleted.
#[test]
fn namespace_changes_reach_the_registry() {
    let d = Daemon::start("0");
    d.call("bdev_null_create", json!({"name": "n0", "num_blocks": 8192, "block_size": 512}));
    d.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    d.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": true}));
    d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "n0"}}));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen =
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    d.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": listen}));
    assert_eq!(d.call("bdev_nvme_attach_controller", attach_params("Nvme0", port)), json!(["Nvme0n1"]));
    let blocks = || d.try_call("bdev_get_bdevs", json!({"name": "Nvme0n1"})).ok()?[0]["num_blocks"].as_u64();
    assert_eq!(blocks(), Some(8192));

    d.call("bdev_null_resize", json!({"name": "n0", "new_size": 8}));
    eventually("Nvme0n1 did not grow to 8 MiB", || blocks() == Some(16384));

    d.call("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 1}));
    eventually("Nvme0n1 was not deleted with its namespace", || {
        d.try_call("bdev_get_bdevs", json!({"name": "Nvme0n1"})).is_err()
    });
    // The controller itself stays, with no namespace, until detached.
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    assert_eq!(c[0]["ctrlrs"][0]["namespaces"], json!([]), "{c}");
    d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "n0", "nsid": 1}}));
    eventually("Nvme0n1 did not come back with its namespace", || blocks() == Some(16384));
    // Removed while exported: the bdev stays, its I/O fails, and detach deletes it once the
    // export is gone.
    let sock = d.controller("vhost.0", "Nvme0n1", Some(1), false);
    let mut client = BlkClient::open(&sock, 1);
    assert_eq!(client.write(0, 0, &[1; 4096]), 0);
    d.call("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 1}));
    eventually("the removed namespace's I/O still succeeds", || client.write(0, 0, &[2; 4096]) != 0);
    assert_eq!(blocks(), Some(16384), "the exported bdev stays");
    let e = d.try_call("bdev_nvme_detach_controller", json!({"name": "Nvme0"})).unwrap_err();
    assert_eq!(e.code, -16, "{e:?}");
    drop(client);
    d.call("vhost_delete_controller", json!({"ctrlr": "vhost.0"}));
    assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Nvme0"})), json!(true));
    assert_eq!(blocks(), None, "detach deleted the orphaned bdev");
}

/// SIGTERM with a controller attached to the daemon's own subsystem (whose target stops first)
/// still stops the daemon promptly: the controller is detached without waiting on the target.
#[test]
fn the_daemon_stops_with_a_controller_attached() {
    let mut d = Daemon::start("0");
    let port = serve_target(&d);
    d.call("bdev_nvme_attach_controller", attach_params("Nvme0", port));
    d.controller("vhost.0", "Nvme0n1", Some(1), false);
    let started = std::time::Instant::now();
    d.assert_stops_on_sigterm();
    assert!(started.elapsed() < Duration::from_secs(5), "stopping took {:?}", started.elapsed());
    let log = std::fs::read_to_string(&d.stderr_path).unwrap();
    assert!(
        log.contains("bdev 'Nvme0n1' deleted") && log.contains("nvme Nvme0: detached at shutdown"),
        "{log}"
    );
}

/// A TCP controller whose connections are lost (its subsystem deleted on the target)
/// reconnects every `reconnect_delay_sec` while `ctrlr_loss_timeout_sec` lasts, and serves the
/// same data once the subsystem is back; the bdev stays through it.
#[test]
fn a_lost_tcp_controller_reconnects_by_its_timeouts() {
    let d = Daemon::start("0");
    let port = serve_target(&d);
    let mut params = attach_params("Nvme0", port);
    params["ctrlr_loss_timeout_sec"] = json!(-1);
    params["reconnect_delay_sec"] = json!(1);
    d.call("bdev_nvme_attach_controller", params);
    let sock = d.controller("vhost.0", "Nvme0n1", Some(1), false);
    let mut client = BlkClient::open(&sock, 1);
    assert_eq!(client.write(0, 4096, &[0x5a; 4096]), 0);

    d.call("nvmf_delete_subsystem", json!({"nqn": NQN}));
    let state = || d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}))[0]["ctrlrs"][0].clone();
    eventually("the controller did not notice its lost connections", || state()["state"] != "enabled");
    assert_eq!(d.call("bdev_get_bdevs", json!({"name": "Nvme0n1"}))[0]["name"], "Nvme0n1");

    d.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": true}));
    d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "m0"}}));
    let listen =
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    d.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": listen}));
    eventually("the controller did not reconnect", || state()["state"] == "enabled");
    assert!(state()["reconnect_attempts"].as_u64() >= Some(1), "{}", state());
    assert_eq!(client.read(0, 4096, 4096).unwrap(), [0x5a; 4096]);
    assert_eq!(client.write(0, 8192, &[0xa5; 4096]), 0);
    assert_eq!(client.read(0, 8192, 4096).unwrap(), [0xa5; 4096]);
}

/// `hostnqn` is the NQN the target checks: a subsystem that admits only one host refuses the
/// daemon's default NQN (nothing is left attached) and takes the one it lists.
#[test]
fn the_host_nqn_is_the_one_the_target_checks() {
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6a1f0c2e-5b7d-4c8e-9f10-2b3c4d5e6f70";
    let d = Daemon::start("0");
    let port = serve_target(&d);
    d.call("nvmf_subsystem_allow_any_host", json!({"nqn": NQN, "allow_any_host": false}));
    d.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOST}));
    assert!(d.try_call("bdev_nvme_attach_controller", attach_params("Nvme0", port)).is_err());
    assert_eq!(d.call("bdev_nvme_get_controllers", json!({})), json!([]));
    let mut params = attach_params("Nvme0", port);
    params["hostnqn"] = json!(HOST);
    assert_eq!(d.call("bdev_nvme_attach_controller", params), json!(["Nvme0n1"]));
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    assert_eq!(c[0]["ctrlrs"][0]["host"]["nqn"], HOST, "{c}");
    assert_eq!(d.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN}))[0]["hostnqn"], HOST);
}

/// `dhchap_key` and `dhchap_ctrlr_key` name keyring keys: a name not in the keyring or a key
/// that is no DHHC-1 secret is refused naming the parameter (nothing is left attached); good
/// keys attach (this target does not ask for authentication, so they are not used: the
/// transaction itself is `fp-nvme`'s `tcp::auth_tests`, and the kernel's in `guest_nvme`).
#[test]
fn dhchap_keys_are_keyring_names() {
    let d = Daemon::start("0");
    let port = serve_target(&d);
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("host0", "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n"),
        ("garbage", "not a secret\n"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        d.call("keyring_file_add_key", json!({"name": name, "path": path.to_str().unwrap()}));
    }
    d.call("bdev_nvme_set_options", json!({"dhchap_digests": ["sha256"], "dhchap_dhgroups": ["null"]}));
    let with = |keys: Value| {
        let mut p = attach_params("Nvme0", port);
        p.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
        p
    };
    for (keys, want) in [
        (json!({"dhchap_key": "nope"}), "dhchap_key: "),
        (json!({"dhchap_key": "garbage"}), "dhchap_key: key 'garbage' is not a DHHC-1 secret"),
        (
            json!({"dhchap_key": "host0", "dhchap_ctrlr_key": "garbage"}),
            "dhchap_ctrlr_key: key 'garbage' is not a DHHC-1 secret",
        ),
        (json!({"dhchap_ctrlr_key": "host0"}), "dhchap_ctrlr_key: needs dhchap_key"),
    ] {
        let e = d.try_call("bdev_nvme_attach_controller", with(keys.clone())).unwrap_err();
        assert_eq!(e.code, -32602, "{keys}: {e:?}");
        assert!(e.message.starts_with(want), "{keys}: {:?} does not start with {want:?}", e.message);
        assert!(!e.message.contains("AAECAw"), "{keys}: the key's text is in the error: {e:?}");
    }
    assert!(d
        .try_call("bdev_nvme_attach_controller", with(json!({"dhchap_key": "nope"})))
        .unwrap_err()
        .message
        .contains("no key named 'nope'"));
    assert_eq!(d.call("bdev_nvme_get_controllers", json!({})), json!([]));
    assert_eq!(
        d.call("bdev_nvme_attach_controller", with(json!({"dhchap_key": "host0"}))),
        json!(["Nvme0n1"])
    );

    // bdev_nvme_set_keys names what it refuses the same way, and the controller stays.
    for (keys, want) in [
        (json!({"name": "Nvme9"}), "name: no NVMe controller 'Nvme9'"),
        (json!({"name": "Nvme0", "dhchap_key": "nope"}), "dhchap_key: "),
        (
            json!({"name": "Nvme0", "dhchap_key": "garbage"}),
            "dhchap_key: key 'garbage' is not a DHHC-1 secret",
        ),
        (
            json!({"name": "Nvme0", "dhchap_ctrlr_key": "host0"}),
            "dhchap_ctrlr_key: authenticating the controller needs a host key",
        ),
        (json!({"name": "Nvme0", "dhchap_key": "host0", "surprise": 1}), "surprise"),
    ] {
        let e = d.try_call("bdev_nvme_set_keys", keys.clone()).unwrap_err();
        assert!(e.message.contains(want), "{keys}: {:?} does not say {want:?}", e.message);
        assert!(!e.message.contains("AAECAw"), "{keys}: the key's text is in the error: {e:?}");
    }
    // No key: the keys are cleared, nothing authenticates now (SPDK's rule); the CLI does the
    // same with `nvme set-keys`.
    assert_eq!(d.call("bdev_nvme_set_keys", json!({"name": "Nvme0"})), json!(true));
    let (ok, out, err) = cli(&d.rpc, &["nvme", "set-keys", "Nvme0"]);
    assert!(ok && out.is_empty(), "{err}");
    let (ok, _, err) = cli(&d.rpc, &["nvme", "set-keys", "Nvme0", "--dhchap-key", "nope"]);
    assert!(!ok && err.starts_with("error: --dhchap-key: ") && err.lines().count() == 1, "{err}");
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    assert_eq!(c[0]["ctrlrs"][0]["state"], "enabled", "{c}");
}

/// `psk` names a keyring key in the interchange format: a missing or malformed key is refused
/// naming the parameter (never quoting the key); a target that does not speak TLS fails the
/// attach; through a TLS terminator (fp-nvme's test one, in this process, in front of the
/// daemon's own plain target) holding another PSK the refusal names its kind, holding the
/// same one the controller attaches with one handshake per queue under the host's version 0
/// identity, and `bdev_nvme_get_controllers` shows the path's `psk`.
#[test]
fn psk_is_a_keyring_name_and_every_queue_runs_tls() {
    use fp_crypto::tls::{tls_available, ConfiguredPsk, PskHash};
    use fp_nvme::testing::TlsTerminator;

    if !tls_available() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true and libssl.so.3 does not load");
        println!("skipped: libssl.so.3 not loadable");
        return;
    }
    let d = Daemon::start("0");
    let port = serve_target(&d);
    let dir = tempfile::tempdir().unwrap();
    let key = ConfiguredPsk::new(Some(PskHash::Sha256), &[0x3c; 32]).unwrap();
    let other = ConfiguredPsk::new(Some(PskHash::Sha256), &[0xc3; 32]).unwrap();
    let text = key.to_interchange();
    for (name, text) in
        [("tls0", format!("{}\n", text.as_str())), ("garbage", "NVMeTLSkey-1:01:@@@@:\n".into())]
    {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        d.call("keyring_file_add_key", json!({"name": name, "path": path.to_str().unwrap()}));
    }
    let hostnqn = "nqn.2014-08.org.nvmexpress:uuid:3c3c3c3c-0000-4000-8000-000000000001";
    let with = |port: u16, psk: &str| {
        let mut p = attach_params("Nvme0", port);
        p["psk"] = json!(psk);
        p["hostnqn"] = json!(hostnqn);
        p
    };
    let secret = &text.as_str()["NVMeTLSkey-1:01:".len()..text.len() - 1];
    for (psk, want) in [
        ("nope", "psk: invalid parameter key: no key named 'nope' in the keyring"),
        ("garbage", "psk: key 'garbage' is not a TLS PSK in the interchange format"),
    ] {
        let e = d.try_call("bdev_nvme_attach_controller", with(port, psk)).unwrap_err();
        assert_eq!(e.code, -32602, "{psk}: {e:?}");
        assert!(e.message.starts_with(want), "{psk}: {:?} does not start with {want:?}", e.message);
    }
    // The plain target takes the ClientHello for a PDU and drops the connection.
    let e = d.try_call("bdev_nvme_attach_controller", with(port, "tls0")).unwrap_err();
    assert!(e.message.contains("TLS handshake"), "{e:?}");
    let wrong = TlsTerminator::start(port, Some(other)).unwrap();
    let e = d.try_call("bdev_nvme_attach_controller", with(wrong.port(), "tls0")).unwrap_err();
    assert!(e.message.contains("wrong PSK") && e.message.contains(hostnqn), "{e:?}");
    assert!(!e.message.contains(secret), "the key's text is in the error: {e:?}");
    assert_eq!(d.call("bdev_nvme_get_controllers", json!({})), json!([]), "nothing left behind");

    let tls = TlsTerminator::start(port, Some(key)).unwrap();
    assert_eq!(d.call("bdev_nvme_attach_controller", with(tls.port(), "tls0")), json!(["Nvme0n1"]));
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    assert_eq!(c[0]["ctrlrs"][0]["psk"], "tls0", "{c}");
    assert_eq!(c[0]["ctrlrs"][0]["state"], "enabled", "{c}");
    let ids = tls.identities();
    assert!(!ids.is_empty() && ids.iter().all(|i| *i == format!("NVMe0R01 {hostnqn} {NQN}")), "{ids:?}");
    assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Nvme0"})), json!(true));
}
