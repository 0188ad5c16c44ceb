//! NVMe multipath end to end (docs/nvme.md, "Multipath"): a daemon serves an error bdev over
//! its own NVMe/TCP target and attaches it back twice under one name, each path through a TCP
//! relay of the test's own (cutting a relay closes that path's connections and refuses new
//! ones, and holds no listener of the target's: the same target serves both paths).
//!
//! * [`two_paths_are_one_bdev_and_io_survives_the_loss_of_one`]: `-x multipath` adds a path
//!   (one bdev, two `ctrlrs` in `bdev_nvme_get_controllers`), the refusals (another
//!   subsystem, the same address, multipath disabled), `bdev_nvme_set_multipath_policy`,
//!   `bdev_nvme_get_io_paths`; verified random I/O over vhost-user while writes are held at
//!   the target and the first path is cut: no request fails, the data reads back; the path
//!   comes back (failback), then is detached by its address while the bdev stays.
//! * [`ana_states_of_the_listeners_steer_io_with_no_error`]: a subsystem with `ana_reporting`
//!   on two listeners, one path through each: verified I/O over vhost-user while writes are held
//!   at the target and the first listener turns inaccessible (no error, the I/O moves, and
//!   `bdev_nvme_get_io_paths` shows `ana_state`), then optimized again (failback), then
//!   non-optimized under active_active (everything to the optimized path).
//! * [`a_path_flapping_every_quarter_second_fails_no_io`]: one of two paths cut and restored
//!   every 250 ms, twelve times, under verified random I/O on both paths (active_active): no
//!   request fails, the data reads back, and the flapping path is back and carrying I/O after.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{random_write_verify, BlkClient, Daemon};
use fp_nvme::testing::Relay;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:mpath";
/// The RAM disk behind the subsystem: 16 MiB of 512-byte blocks.
const BLOCKS: u64 = 32768;

/// Serves error bdev `EE_m0` over RAM as namespace 1 of [`NQN`]; returns the port.
fn serve_target(d: &Daemon) -> u16 {
    d.malloc("m0", BLOCKS, 512);
    d.call("bdev_error_create", json!({"base_name": "m0"}));
    d.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    for nqn in [NQN, "nqn.2016-06.io.spdk:other"] {
        d.call("nvmf_create_subsystem", json!({"nqn": nqn, "allow_any_host": true}));
    }
    d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "EE_m0"}}));
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen =
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    for nqn in [NQN, "nqn.2016-06.io.spdk:other"] {
        d.call("nvmf_subsystem_add_listener", json!({"nqn": nqn, "listen_address": listen}));
    }
    port
}

fn attach_params(port: u16, multipath: &str) -> Value {
    json!({"name": "Nvme0", "trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": port.to_string(),
           "subnqn": NQN, "multipath": multipath, "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1})
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `Nvme0n1`'s paths in `bdev_nvme_get_io_paths`, over every poll group.
fn io_paths(d: &Daemon) -> Vec<Value> {
    let r = d.call("bdev_nvme_get_io_paths", json!({"name": "Nvme0n1"}));
    r["poll_groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["io_paths"].as_array().unwrap().clone())
        .collect()
}

/// Under active_passive (everything through the first path), verified random I/O in `rounds`
/// rounds over 4 MiB at 4 MiB, in a thread, with four of its writes held at error bdev
/// `error_bdev` (waited for); returns the thread, which gives back the client and the bytes it
/// compared.
fn hold_writes_under_workload(
    d: &Daemon,
    error_bdev: &str,
    mut client: BlkClient,
    rounds: usize,
) -> std::thread::JoinHandle<(BlkClient, u64)> {
    d.call("bdev_nvme_set_multipath_policy", json!({"name": "Nvme0n1", "policy": "active_passive"}));
    d.call(
        "bdev_error_inject_error",
        json!({"name": error_bdev, "io_type": "write", "error_type": "pending", "num": 4}),
    );
    let worker = std::thread::spawn(move || {
        let compared = random_write_verify(&mut client, 2, rounds, 4 << 20, 4 << 20, Some(0));
        (client, compared)
    });
    wait_until("the target to hold four writes", || {
        let b = &d.call("bdev_get_bdevs", json!({"name": error_bdev}))[0];
        let injections = &b["driver_specific"]["error"]["injections"];
        assert!(injections.is_object(), "{b}");
        injections["write"]["num"].as_u64().is_none_or(|n| n == 0)
    });
    worker
}

#[test]
fn two_paths_are_one_bdev_and_io_survives_the_loss_of_one() {
    let d = Daemon::start("0");
    // A lost path's requests move after KATO + 1 s (the target reports no CQT).
    d.call("bdev_nvme_set_options", json!({"keep_alive_timeout_ms": 1000}));
    let port = serve_target(&d);
    let relays = [Relay::start(port).unwrap(), Relay::start(port).unwrap()];
    assert_eq!(
        d.call("bdev_nvme_attach_controller", attach_params(relays[0].port(), "multipath")),
        json!(["Nvme0n1"])
    );

    // Refusals, each naming its field, nothing changed.
    let refusals = [
        (
            json!({"multipath": "disable"}),
            "name: NVMe controller 'Nvme0' already exists and multipath is disabled",
        ),
        (
            json!({"trsvcid": relays[0].port().to_string()}),
            "traddr: NVMe controller 'Nvme0' already has the path",
        ),
        (
            json!({"subnqn": "nqn.2016-06.io.spdk:other"}),
            "subnqn: NVMe controller 'Nvme0' already exists, but uses a different subnqn",
        ),
    ];
    for (extra, want) in refusals {
        let mut p = attach_params(relays[1].port(), "multipath");
        p.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let e = d.try_call("bdev_nvme_attach_controller", p).unwrap_err();
        assert!(e.message.starts_with(want), "{e:?} (wanted {want})");
    }
    assert_eq!(
        d.call("bdev_nvme_attach_controller", attach_params(relays[1].port(), "multipath")),
        json!(["Nvme0n1"])
    );

    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    let ctrlrs = c[0]["ctrlrs"].as_array().unwrap();
    assert_eq!(ctrlrs.len(), 2, "{c}");
    let ports: Vec<&str> = ctrlrs.iter().map(|p| p["trid"]["trsvcid"].as_str().unwrap()).collect();
    assert_eq!(ports, [relays[0].port().to_string(), relays[1].port().to_string()], "{c}");
    assert_ne!(ctrlrs[0]["cntlid"], ctrlrs[1]["cntlid"], "{c}");
    assert!(ctrlrs.iter().all(|p| p["state"] == "enabled"), "{c}");
    let b = &d.call("bdev_get_bdevs", json!({"name": "Nvme0n1"}))[0];
    assert_eq!(b["driver_specific"]["nvme"]["ns_data"]["can_share"], true, "{b}");
    let entries = b["driver_specific"]["nvme"]["paths"].as_array().expect("every path's entry");
    let ports: Vec<&str> = entries.iter().map(|e| e["trid"]["trsvcid"].as_str().unwrap()).collect();
    assert_eq!(ports, [relays[0].port().to_string(), relays[1].port().to_string()], "{b}");

    for (p, want) in [
        (
            json!({"name": "Nvme0n1", "policy": "both"}),
            "policy: 'both' is not one of active_passive, active_active",
        ),
        (
            json!({"name": "Nvme0n1", "policy": "active_passive", "selector": "queue_depth"}),
            "selector: 'queue_depth': a selector is for active_active only",
        ),
        (json!({"name": "nope", "policy": "active_active"}), "name: no NVMe bdev 'nope'"),
    ] {
        let e = d.try_call("bdev_nvme_set_multipath_policy", p).unwrap_err();
        assert!(e.message.starts_with(want), "{e:?} (wanted {want})");
    }
    let set = json!({"name": "Nvme0n1", "policy": "active_active", "selector": "round_robin"});
    assert_eq!(d.call("bdev_nvme_set_multipath_policy", set), json!(true));

    let sock = d.controller("vhost.0", "Nvme0n1", Some(2), false);
    let mut client = BlkClient::open(&sock, 2);
    assert_eq!(client.capacity, BLOCKS * 512);
    random_write_verify(&mut client, 1, 4, 0, 4 << 20, Some(0));
    let paths = io_paths(&d);
    assert!(!paths.is_empty(), "no channel reported");
    for p in &paths {
        assert_eq!(p["bdev_name"], "Nvme0n1");
        assert_eq!(p["accessible"], true, "{p}");
        assert_eq!(p["transport"]["subnqn"], NQN, "{p}");
    }
    let ports: std::collections::BTreeSet<&str> =
        paths.iter().map(|p| p["transport"]["trsvcid"].as_str().unwrap()).collect();
    assert_eq!(ports.len(), 2, "{paths:?}");

    // Writes held at the target (active_passive: all sent through the first path), then the
    // first path is cut: the workload sees no error.
    let worker = hold_writes_under_workload(&d, "EE_m0", client, 12);
    let cut_at = Instant::now();
    relays[0].cut();
    d.call("bdev_error_resume_pending", json!({"name": "EE_m0"}));
    let (mut client, compared) = worker.join().expect("the workload saw no error");
    assert!(compared > 0);
    // The held writes were sent again only after the quiesce bound (KATO 1 s + 1 s).
    assert!(
        cut_at.elapsed() >= Duration::from_secs(2),
        "the workload ended {:?} after the cut",
        cut_at.elapsed()
    );
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    assert_ne!(c[0]["ctrlrs"][0]["state"], "enabled", "the cut path is down: {c}");

    // Failback: the path returns and carries I/O again.
    relays[0].restore();
    wait_until("the first path to reconnect", || {
        d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}))[0]["ctrlrs"][0]["state"] == "enabled"
    });
    wait_until("both paths connected on a channel", || {
        random_write_verify(&mut client, 3, 1, 8 << 20, 4 << 20, None);
        let paths = io_paths(&d);
        paths.iter().filter(|p| p["connected"] == true).count() >= 2
    });

    // One path detached by its address: the bdev stays, served by the other.
    let detach = json!({"name": "Nvme0", "trtype": "TCP", "traddr": "127.0.0.1", "trsvcid": relays[0].port().to_string()});
    assert_eq!(d.call("bdev_nvme_detach_controller", detach), json!(true));
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    assert_eq!(c[0]["ctrlrs"].as_array().map(Vec::len), Some(1), "{c}");
    assert_eq!(c[0]["ctrlrs"][0]["trid"]["trsvcid"], relays[1].port().to_string(), "{c}");
    random_write_verify(&mut client, 4, 4, 12 << 20, 4 << 20, Some(0));
    drop(client);
    d.call("vhost_delete_controller", json!({"ctrlr": "vhost.0"}));
    assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Nvme0"})), json!(true));
    assert!(d.try_call("bdev_get_bdevs", json!({"name": "Nvme0n1"})).is_err());
}

const ANA_NQN: &str = "nqn.2016-06.io.spdk:ana";

/// Serves error bdev `EE_m1` over RAM as namespace 1 of [`ANA_NQN`] (ANA reporting) on two
/// listeners; returns their ports.
fn serve_ana_target(d: &Daemon) -> [u16; 2] {
    d.malloc("m1", BLOCKS, 512);
    d.call("bdev_error_create", json!({"base_name": "m1"}));
    d.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    d.call("nvmf_create_subsystem", json!({"nqn": ANA_NQN, "allow_any_host": true, "ana_reporting": true}));
    d.call("nvmf_subsystem_add_ns", json!({"nqn": ANA_NQN, "namespace": {"bdev_name": "EE_m1"}}));
    [(); 2].map(|_| {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        d.call("nvmf_subsystem_add_listener", json!({"nqn": ANA_NQN, "listen_address": listen(port)}));
        port
    })
}

fn listen(port: u16) -> Value {
    json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()})
}

fn set_ana(d: &Daemon, port: u16, state: &str) {
    let p = json!({"nqn": ANA_NQN, "listen_address": listen(port), "ana_state": state});
    d.call("nvmf_subsystem_listener_set_ana_state", p);
}

/// `Nvme0n1`'s path through `port` in every poll group's `bdev_nvme_get_io_paths`.
fn paths_via(d: &Daemon, port: u16) -> Vec<Value> {
    io_paths(d).into_iter().filter(|p| on_port(&p["transport"], port)).collect()
}

/// Whether transport ID `trid` is at `port` (its `trsvcid`, a string).
fn on_port(trid: &Value, port: u16) -> bool {
    trid["trsvcid"].as_str().and_then(|s| s.parse::<u16>().ok()) == Some(port)
}

/// Commands each path's queues submitted (`bdev_get_bdevs`' per-path counters), by port.
fn submitted(d: &Daemon, ports: [u16; 2]) -> [u64; 2] {
    let b = &d.call("bdev_get_bdevs", json!({"name": "Nvme0n1"}))[0];
    let entries = b["driver_specific"]["nvme"]["paths"].as_array().expect("every path's entry").clone();
    ports.map(|port| {
        let e = entries.iter().find(|e| on_port(&e["trid"], port)).expect("the path's entry");
        e["stats"]["submitted"].as_u64().unwrap()
    })
}

/// Waits (driving I/O: a channel loads the ANA states at its sweeps, which an idle reactor may
/// not run) until every channel's current path is the one through `ports[to]`; then a verified
/// workload (seed `seed`, 4 MiB at `base`, whose blocks were never written) goes through it
/// only.
fn io_goes_only_through(
    d: &Daemon,
    client: &mut BlkClient,
    ports: [u16; 2],
    to: usize,
    seed: u64,
    base: u64,
) {
    wait_until("the current path to move", || {
        random_write_verify(client, seed + 100, 1, 0, 1 << 20, None);
        io_paths(d).iter().all(|p| p["current"] == on_port(&p["transport"], ports[to]))
    });
    let before = submitted(d, ports);
    random_write_verify(client, seed, 4, base, 4 << 20, None);
    wait_until("the path's counters to show the workload", || submitted(d, ports)[to] > before[to]);
    assert_eq!(submitted(d, ports)[1 - to], before[1 - to], "I/O went through the other path");
}

#[test]
fn ana_states_of_the_listeners_steer_io_with_no_error() {
    let d = Daemon::start("0");
    let ports = serve_ana_target(&d);
    for port in ports {
        let p = json!({"name": "Nvme0", "trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": port.to_string(),
                       "subnqn": ANA_NQN, "multipath": "multipath"});
        assert_eq!(d.call("bdev_nvme_attach_controller", p), json!(["Nvme0n1"]));
    }
    let b = &d.call("bdev_get_bdevs", json!({"name": "Nvme0n1"}))[0];
    assert_eq!(b["driver_specific"]["nvme"]["ctrlr_data"]["ana_reporting"], true, "{b}");
    assert_eq!(b["driver_specific"]["nvme"]["ns_data"]["ana_state"], "optimized", "{b}");

    let sock = d.controller("vhost.0", "Nvme0n1", Some(2), false);
    let mut client = BlkClient::open(&sock, 2);
    random_write_verify(&mut client, 1, 2, 0, 4 << 20, Some(0));
    for port in ports {
        let paths = paths_via(&d, port);
        assert!(!paths.is_empty(), "no channel reports the path through {port}");
        for p in &paths {
            assert_eq!((&p["ana_state"], &p["accessible"]), (&json!("optimized"), &json!(true)), "{p}");
        }
    }

    // Active-passive: writes held at the target on the first path; its listener turns
    // inaccessible; the writes are let go and the workload goes on through the second path.
    let worker = hold_writes_under_workload(&d, "EE_m1", client, 8);
    set_ana(&d, ports[0], "inaccessible");
    wait_until("the first path shown inaccessible", || {
        paths_via(&d, ports[0]).iter().all(|p| p["ana_state"] == "inaccessible" && p["accessible"] == false)
    });
    d.call("bdev_error_resume_pending", json!({"name": "EE_m1"}));
    let (mut client, compared) = worker.join().expect("the workload saw no error");
    assert!(compared > 0);
    io_goes_only_through(&d, &mut client, ports, 1, 3, 8 << 20);
    let inaccessible = paths_via(&d, ports[0]);
    assert!(
        inaccessible.iter().all(|p| p["ana_state"] == "inaccessible" && p["current"] == false),
        "{inaccessible:?}"
    );

    // Optimized again: failback.
    set_ana(&d, ports[0], "optimized");
    io_goes_only_through(&d, &mut client, ports, 0, 4, 12 << 20);

    // Active-active with the first path non-optimized: everything to the optimized second.
    let set = json!({"name": "Nvme0n1", "policy": "active_active", "selector": "round_robin"});
    assert_eq!(d.call("bdev_nvme_set_multipath_policy", set), json!(true));
    set_ana(&d, ports[0], "non_optimized");
    wait_until("the first path shown non-optimized", || {
        paths_via(&d, ports[0]).iter().all(|p| p["ana_state"] == "non_optimized" && p["accessible"] == true)
    });
    io_goes_only_through(&d, &mut client, ports, 1, 5, 0);
    drop(client);
    d.call("vhost_delete_controller", json!({"ctrlr": "vhost.0"}));
    assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Nvme0"})), json!(true));
}

/// The hostile path: a link flapping every few hundred milliseconds. The flapping
/// path's connections close and its reconnects are refused while it is cut; requests on it
/// wait the quiesce bound and move to the other path; nothing fails upward, and once it
/// stays up it carries I/O again. The workload runs rounds until the flapping is over (and
/// at least two), so the checks hold at any speed.
#[test]
fn a_path_flapping_every_quarter_second_fails_no_io() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let d = Daemon::start("0");
    d.call("bdev_nvme_set_options", json!({"keep_alive_timeout_ms": 1000}));
    let port = serve_target(&d);
    let relays = [Relay::start(port).unwrap(), Relay::start(port).unwrap()];
    for r in &relays {
        assert_eq!(
            d.call("bdev_nvme_attach_controller", attach_params(r.port(), "multipath")),
            json!(["Nvme0n1"])
        );
    }
    let set = json!({"name": "Nvme0n1", "policy": "active_active", "selector": "round_robin"});
    assert_eq!(d.call("bdev_nvme_set_multipath_policy", set), json!(true));
    let sock = d.controller("vhost.0", "Nvme0n1", Some(2), false);
    let mut client = BlkClient::open(&sock, 2);
    random_write_verify(&mut client, 7, 1, 0, 4 << 20, Some(0));

    let flapping = Arc::new(AtomicBool::new(true));
    let still = flapping.clone();
    let worker = std::thread::spawn(move || {
        let (mut rounds, mut compared) = (0u64, 0u64);
        while still.load(Ordering::Relaxed) || rounds < 2 {
            compared += random_write_verify(&mut client, 100 + rounds, 1, 0, 4 << 20, None);
            rounds += 1;
        }
        (client, rounds, compared)
    });
    for _ in 0..12 {
        relays[0].cut();
        std::thread::sleep(Duration::from_millis(250));
        relays[0].restore();
        std::thread::sleep(Duration::from_millis(250));
    }
    flapping.store(false, Ordering::Relaxed);
    let (mut client, rounds, compared) = worker.join().expect("no request failed while the path flapped");
    assert!(rounds >= 2 && compared > 0, "{rounds} rounds, {compared} bytes compared");

    // The flapping path comes back for good and takes I/O again.
    wait_until("the flapping path to reconnect", || {
        d.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}))[0]["ctrlrs"][0]["state"] == "enabled"
    });
    wait_until("both paths connected on a channel", || {
        random_write_verify(&mut client, 900, 1, 8 << 20, 4 << 20, None);
        io_paths(&d).iter().filter(|p| p["connected"] == true).count() >= 2
    });
    random_write_verify(&mut client, 901, 2, 0, 8 << 20, None);
    drop(client);
    d.call("vhost_delete_controller", json!({"ctrlr": "vhost.0"}));
    assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Nvme0"})), json!(true));
}
