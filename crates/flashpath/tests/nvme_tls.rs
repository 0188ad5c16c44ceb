//! NVMe/TCP with TLS 1.3 end to end, flashpath's initiator against flashpath's target
//! (docs/nvmf.md and docs/nvme.md, "TLS"): one daemon serves a RAM disk on a `secure_channel`
//! listener to two hosts listed with PSKs and attaches it back over TLS.
//!
//! * [`the_initiator_and_the_target_run_tls_on_every_queue`]: SHA-256 and SHA-384 PSKs (the
//!   second host also authenticating with DH-HMAC-CHAP inside the channel); verified random I/O
//!   over vhost-user on two queues through the TLS controller; a reset reconnects through new
//!   handshakes and I/O goes on; the refusals: a wrong PSK, no PSK, another host's PSK, and a
//!   host with a PSK that the subsystem does not list, each named, the connected host
//!   unaffected.

mod common;

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;

use common::{random_write_verify, BlkClient, Daemon};
use fp_crypto::tls::{tls_available, ConfiguredPsk, PskHash};
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:tls";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:7a7a7a7a-0000-4000-8000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:7b7b7b7b-0000-4000-8000-00000000000b";
const HOST_C: &str = "nqn.2014-08.org.nvmexpress:uuid:7c7c7c7c-0000-4000-8000-00000000000c";
/// The RAM disk behind the subsystem: 16 MiB of 512-byte blocks.
const BLOCKS: u64 = 32768;

fn attach(port: u16, name: &str, host: &str, psk: Option<&str>) -> Value {
    let mut p = json!({"name": name, "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
                       "trsvcid": port.to_string(), "subnqn": NQN, "hostnqn": host,
                       "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1});
    if let Some(k) = psk {
        p["psk"] = json!(k);
    }
    p
}

/// The target's queue pairs of `host`.
fn qpairs_of(d: &Daemon, host: &str) -> usize {
    let ctrlrs = d.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN}));
    ctrlrs.as_array().unwrap().iter().filter(|c| c["hostnqn"] == host).count()
}

#[test]
fn the_initiator_and_the_target_run_tls_on_every_queue() {
    if !tls_available() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true and libssl.so.3 does not load");
        println!("skipped: libssl.so.3 not loadable");
        return;
    }
    let d = Daemon::start("0");
    let dir = tempfile::tempdir().unwrap();
    let psk_a = ConfiguredPsk::new(Some(PskHash::Sha256), &[0x5a; 32]).unwrap();
    let psk_b = ConfiguredPsk::new(Some(PskHash::Sha384), &[0x5b; 48]).unwrap();
    let wrong = ConfiguredPsk::new(Some(PskHash::Sha256), &[0xa5; 32]).unwrap();
    let keys = [
        ("psk_a", psk_a.to_interchange().to_string()),
        ("psk_b", psk_b.to_interchange().to_string()),
        ("wrong", wrong.to_interchange().to_string()),
        // DH-HMAC-CHAP inside the channel for host B: the host's and the controller's secrets.
        ("dh_host", "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:".to_string()),
        ("dh_ctrl", "DHHC-1:00:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj/jBqb2:".to_string()),
    ];
    for (name, text) in &keys {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{text}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        d.call("keyring_file_add_key", json!({"name": name, "path": path.to_str().unwrap()}));
    }

    d.malloc("m0", BLOCKS, 512);
    d.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    d.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": false}));
    d.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "m0"}}));
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen =
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    d.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": listen, "secure_channel": true}),
    );
    d.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOST_A, "psk": "psk_a"}));
    d.call(
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN, "host": HOST_B, "psk": "psk_b", "dhchap_key": "dh_host", "dhchap_ctrlr_key": "dh_ctrl"}),
    );
    // Host C is listed without a PSK: a secure listener has nothing to offer it.
    d.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOST_C}));
    let l = d.call("nvmf_subsystem_get_listeners", json!({"nqn": NQN}));
    assert_eq!(l[0]["secure_channel"], true, "{l}");

    // Host A, SHA-256: verified I/O on two queues, transfers up to 64 KiB.
    assert_eq!(
        d.call("bdev_nvme_attach_controller", attach(port, "NvmeA", HOST_A, Some("psk_a"))),
        json!(["NvmeAn1"])
    );
    let c = d.call("bdev_nvme_get_controllers", json!({"name": "NvmeA"}));
    assert_eq!(c[0]["ctrlrs"][0]["psk"], "psk_a", "{c}");
    assert_eq!(c[0]["ctrlrs"][0]["state"], "enabled", "{c}");
    assert_eq!(qpairs_of(&d, HOST_A), 1, "one controller of host A at the target");
    let sock = d.controller("vhost.tls", "NvmeAn1", Some(2), false);
    let mut client = BlkClient::open(&sock, 2);
    assert_eq!(client.capacity, BLOCKS * 512);
    let compared = random_write_verify(&mut client, 38, 6, 0, 8 << 20, Some(0));
    assert!(compared > 0);

    // Host B, SHA-384 and DH-HMAC-CHAP inside the channel, both directions of the keys.
    let mut b = attach(port, "NvmeB", HOST_B, Some("psk_b"));
    b["dhchap_key"] = json!("dh_host");
    b["dhchap_ctrlr_key"] = json!("dh_ctrl");
    assert_eq!(d.call("bdev_nvme_attach_controller", b), json!(["NvmeBn1"]));
    let q = d.call("nvmf_subsystem_get_qpairs", json!({"nqn": NQN}));
    let authenticated = q.as_array().unwrap().iter().filter(|p| p["auth"]["state"] == "completed").count();
    assert!(authenticated >= 1, "host B's admin queue authenticated inside TLS: {q}");

    // A reset: every queue of host A connects again through a new handshake; I/O goes on.
    assert_eq!(d.call("bdev_nvme_reset_controller", json!({"name": "NvmeA"})), json!(true));
    random_write_verify(&mut client, 39, 4, 8 << 20, 4 << 20, None);

    // Refusals, each named; host A's I/O is not disturbed.
    for (name, host, psk, want) in [
        ("Bad1", HOST_A, Some("wrong"), "wrong PSK"),
        // Another host's PSK: its identity names host A with SHA-384, which A has not.
        ("Bad2", HOST_A, Some("psk_b"), "unknown PSK identity"),
        ("Bad3", HOST_C, Some("psk_a"), "unknown PSK identity"),
        // A plain ICReq: the listener takes it for a ClientHello and closes.
        ("Bad4", HOST_A, None, "ICResp"),
    ] {
        let mut p = attach(port, name, host, psk);
        let o = p.as_object_mut().unwrap();
        o.remove("ctrlr_loss_timeout_sec");
        o.remove("reconnect_delay_sec");
        let e = d.try_call("bdev_nvme_attach_controller", p).unwrap_err();
        assert!(e.message.contains(want), "{name}: {e:?} (wanted {want:?})");
        assert!(!e.message.contains("NVMeTLSkey"), "{name}: a key's text is in the error: {e:?}");
        random_write_verify(&mut client, 40, 1, 12 << 20, 1 << 20, None);
    }
    let names: Vec<String> = d
        .call("bdev_nvme_get_controllers", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["NvmeA", "NvmeB"], "nothing left of the refused attaches");
    assert_eq!(qpairs_of(&d, HOST_C), 0);

    drop(client);
    d.call("vhost_delete_controller", json!({"ctrlr": "vhost.tls"}));
    for n in ["NvmeA", "NvmeB"] {
        assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": n})), json!(true));
    }
}
