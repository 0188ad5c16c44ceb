//! Dirty bitmaps end to end (docs/backup.md): writes through every frontend mark a disk's
//! bitmaps, exactly; a persistent bitmap survives a clean restart with its bits and comes back
//! inconsistent after a crash; refusals name their field; the CLI lists and shows them.
//!
//! * [`writes_through_vhost_nbd_and_nvme_tcp_show_up_exactly`]: one RAM disk, a bitmap of
//!   4 KiB granularity; a vhost-user-blk client (BlkClient) writes, write-zeroes and discards,
//!   an NBD client writes, and the daemon's own NVMe/TCP target, attached back as `Nvme0n1`
//!   and exported over vhost-user in turn, carries a write: `bdev_dirty_bitmap_get_extents`
//!   shows each of them and nothing else.
//! * [`a_persistent_bitmap_survives_sigterm_and_is_inconsistent_after_sigkill`].
//! * [`refusals_name_the_field`].
//! * [`a_busy_bitmap_refuses_every_change_naming_its_holder`]: a bitmap an NBD export holds
//!   refuses remove, clear, enable, disable and merge (into and from) with EBUSY, naming the
//!   export, and changes nothing; once the export stops they all work.

mod common;

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use common::nbd::{start_export, Endpoint, NbdConn};
use common::{bounded, pattern, BlkClient, Daemon};
use serde_json::{json, Value};

const BLOCKS: u64 = 16384; // 8 MiB of 512-byte blocks
const NQN: &str = "nqn.2016-06.io.spdk:bitmaps";

fn extents(d: &Daemon, bdev: &str, name: &str) -> Vec<(u64, u64)> {
    let r = d.call("bdev_dirty_bitmap_get_extents", json!({ "bdev": bdev, "name": name }));
    assert_eq!(r["next"], Value::Null);
    r["extents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect()
}

fn cli(d: &Daemon, args: &[&str]) -> String {
    let out =
        Command::new(env!("CARGO_BIN_EXE_flashpath")).arg("--rpc").arg(&d.rpc).args(args).output().unwrap();
    assert!(out.status.success(), "flashpath {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn writes_through_vhost_nbd_and_nvme_tcp_show_up_exactly() {
    let mut d = Daemon::start("0");
    d.malloc("m0", BLOCKS, 512);
    assert_eq!(cli(&d, &["bitmap", "add", "m0", "b0", "--granularity", "4KiB"]), "");
    d.call(
        "bdev_dirty_bitmap_add",
        json!({ "bdev": "m0", "name": "off", "granularity": 4096, "disabled": true }),
    );

    // vhost-user-blk: a write, write-zeroes and a discard; a read marks nothing.
    let sock = d.controller("vhost.0", "m0", Some(1), false);
    bounded(Duration::from_secs(60), "vhost client", move || {
        let mut c = BlkClient::open(&sock, 1);
        assert_eq!(c.write(0, 4096, &pattern(1, 4096, 512)), 0);
        assert_eq!(c.write_zeroes(0, 16 * 4096, 8192, false), 0);
        assert_eq!(c.discard(0, 40 * 4096, 4096), 0);
        c.read(0, 100 * 4096, 4096).unwrap();
    });
    let mut want = vec![(4096, 4096), (16 * 4096, 8192), (40 * 4096, 4096)];
    assert_eq!(extents(&d, "m0", "b0"), want);
    d.call("vhost_delete_controller", json!({ "ctrlr": "vhost.0" }));

    // NBD.
    let nbd = d.dir.path().join("m0.nbd");
    start_export(&d, "m0", nbd.to_str().unwrap(), false);
    let ep = Endpoint::Unix(nbd.clone());
    bounded(Duration::from_secs(60), "nbd client", move || {
        let mut c = NbdConn::connect(&ep, "m0").unwrap();
        assert_eq!(c.write(60 * 4096 + 512, &pattern(2, 0, 1024), 0).unwrap(), 0);
    });
    want.push((60 * 4096, 4096));
    assert_eq!(extents(&d, "m0", "b0"), want);
    d.call("nbd_stop_disk", json!({ "nbd_device": nbd.to_str().unwrap() }));

    // NVMe/TCP: the daemon's own target, attached back, exported over vhost-user.
    d.call("nvmf_create_transport", json!({ "trtype": "TCP" }));
    d.call("nvmf_create_subsystem", json!({ "nqn": NQN, "allow_any_host": true }));
    d.call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "m0" } }));
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen =
        json!({ "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string() });
    d.call("nvmf_subsystem_add_listener", json!({ "nqn": NQN, "listen_address": listen }));
    let attach = json!({ "name": "Nvme0", "trtype": "tcp", "traddr": "127.0.0.1",
                         "trsvcid": port.to_string(), "subnqn": NQN });
    assert_eq!(d.call("bdev_nvme_attach_controller", attach), json!(["Nvme0n1"]));
    let sock = d.controller("vhost.1", "Nvme0n1", Some(1), false);
    bounded(Duration::from_secs(60), "vhost client over NVMe/TCP", move || {
        let mut c = BlkClient::open(&sock, 1);
        assert_eq!(c.write(0, 80 * 4096, &pattern(3, 0, 3 * 4096)), 0);
    });
    want.push((80 * 4096, 3 * 4096));
    assert_eq!(extents(&d, "m0", "b0"), want);
    assert_eq!(extents(&d, "m0", "off"), [], "a disabled bitmap marks nothing");

    let list = d.call("bdev_dirty_bitmap_list", json!({ "bdev": "m0" }));
    assert_eq!(list[0]["count"], json!(4096 + 8192 + 4096 + 4096 + 3 * 4096));
    let shown = cli(&d, &["bitmap", "list"]);
    assert!(shown.contains("b0") && shown.contains("off"), "{shown}");
    let shown = cli(&d, &["bitmap", "extents", "m0", "b0"]);
    assert!(shown.contains(&(80 * 4096).to_string()), "{shown}");
    d.assert_alive();
}

#[test]
fn a_persistent_bitmap_survives_sigterm_and_is_inconsistent_after_sigkill() {
    let state = tempfile::tempdir().unwrap();
    let state_arg = state.path().to_str().unwrap().to_string();
    // The bdev comes from the configuration file at every start: its bitmap is loaded then.
    let mut d = Daemon::start_with_config("0", |_| {
        format!(
            "state_dir = \"{state_arg}\"\n\n[[bdev]]\ntype = \"malloc\"\nname = \"m0\"\nnum_blocks = {BLOCKS}\nblock_size = 512\n\n\
             [[dirty_bitmap]]\nbdev = \"m0\"\nname = \"daily\"\npersistent = true\ngranularity = 4096\n"
        )
    });
    let sock = d.controller("vhost.0", "m0", Some(1), false);
    bounded(Duration::from_secs(60), "vhost client", move || {
        let mut c = BlkClient::open(&sock, 1);
        assert_eq!(c.write(0, 8 * 4096, &pattern(1, 0, 4096)), 0);
    });
    assert_eq!(extents(&d, "m0", "daily"), [(8 * 4096, 4096)]);

    // A clean restart: the bits are back (the config's table finds it loaded and leaves it).
    d.assert_stops_on_sigterm();
    d.restart();
    let list = d.call("bdev_dirty_bitmap_list", json!({}));
    assert_eq!(
        (list[0]["persistent"].clone(), list[0]["inconsistent"].clone()),
        (json!(true), json!(false)),
        "{list}"
    );
    assert_eq!(extents(&d, "m0", "daily"), [(8 * 4096, 4096)]);
    let sock = d.controller("vhost.0", "m0", Some(1), false);
    bounded(Duration::from_secs(60), "vhost client", move || {
        let mut c = BlkClient::open(&sock, 1);
        assert_eq!(c.write(0, 0, &pattern(2, 0, 512)), 0);
    });
    assert_eq!(extents(&d, "m0", "daily"), [(0, 4096), (8 * 4096, 4096)]);

    // A crash: the bitmap may have missed writes; it comes back inconsistent and refused.
    d.kill9();
    d.restart();
    let list = d.call("bdev_dirty_bitmap_list", json!({}));
    assert_eq!(list[0]["inconsistent"], json!(true), "{list}");
    let e =
        d.try_call("bdev_dirty_bitmap_get_extents", json!({ "bdev": "m0", "name": "daily" })).unwrap_err();
    assert_eq!(e.code, -32602);
    assert!(e.message.starts_with("name: ") && e.message.contains("inconsistent"), "{e:?}");
    wait_until("the crash logged", || d.stderr().contains("loaded inconsistent"));
    // Only removal works; it takes the file with it.
    d.call("bdev_dirty_bitmap_remove", json!({ "bdev": "m0", "name": "daily" }));
    assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 0);
    d.assert_alive();
}

#[test]
fn refusals_name_the_field() {
    let mut d = Daemon::start("0");
    d.malloc("m0", BLOCKS, 512);
    let refused = |method: &str, p: Value| {
        let e = d.try_call(method, p).unwrap_err();
        assert_eq!(e.code, -32602, "{e:?}");
        e.message.split(':').next().unwrap().to_string()
    };
    assert_eq!(
        refused("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "a", "persistent": true })),
        "persistent"
    );
    assert_eq!(
        refused("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "a", "granularity": 1000 })),
        "granularity"
    );
    d.call("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "a" }));
    d.call("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "fine", "granularity": 512 }));
    let p = json!({ "bdev": "m0", "target": "a", "bitmaps": ["fine"] });
    assert_eq!(refused("bdev_dirty_bitmap_merge", p), "bitmaps");
    assert_eq!(refused("bdev_dirty_bitmap_clear", json!({ "bdev": "m0", "name": "nope" })), "name");
    assert_eq!(d.call("bdev_dirty_bitmap_list", json!({})).as_array().unwrap().len(), 2);
    d.assert_alive();
}

#[test]
fn a_busy_bitmap_refuses_every_change_naming_its_holder() {
    let mut d = Daemon::start("0");
    d.malloc("m0", BLOCKS, 512);
    for name in ["held", "free"] {
        d.call("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": name, "granularity": 4096 }));
    }
    let sock = d.dir.path().join("m0.nbd");
    let device = sock.to_str().unwrap();
    d.call("nbd_start_disk", json!({ "bdev_name": "m0", "nbd_device": device, "bitmaps": ["held"] }));
    let mut conn = NbdConn::connect(&Endpoint::Unix(sock.clone()), "m0").expect("connect");
    assert_eq!(conn.write(8192, &pattern(3, 8192, 4096), 0).unwrap(), 0);
    conn.disconnect();
    assert_eq!(extents(&d, "m0", "held"), [(8192, 4096)]);
    let listed = d.call("bdev_dirty_bitmap_list", json!({ "bdev": "m0" }));
    assert_eq!(listed[0]["busy"], true, "{listed}");

    let bm = |name: &str| json!({ "bdev": "m0", "name": name });
    let refusals = [
        ("bdev_dirty_bitmap_remove", bm("held")),
        ("bdev_dirty_bitmap_clear", bm("held")),
        ("bdev_dirty_bitmap_enable", bm("held")),
        ("bdev_dirty_bitmap_disable", bm("held")),
        ("bdev_dirty_bitmap_merge", json!({ "bdev": "m0", "target": "held", "bitmaps": ["free"] })),
        ("bdev_dirty_bitmap_merge", json!({ "bdev": "m0", "target": "free", "bitmaps": ["held"] })),
    ];
    for (method, params) in &refusals {
        let e = d.try_call(method, params.clone()).unwrap_err();
        assert_eq!(e.code, i64::from(-libc::EBUSY), "{method} {params}: {e:?}");
        assert!(
            e.message.contains("'held'") && e.message.contains(&format!("NBD export {device}")),
            "{method}: the message names the bitmap and its holder: {}",
            e.message
        );
    }
    // Nothing changed: the bits, recording, the merge target.
    assert_eq!(extents(&d, "m0", "held"), [(8192, 4096)]);
    assert_eq!(extents(&d, "m0", "free"), [(8192, 4096)]);
    let listed = d.call("bdev_dirty_bitmap_list", json!({ "bdev": "m0" }));
    assert_eq!((listed[0]["recording"].clone(), listed.as_array().unwrap().len()), (json!(true), 2));
    // The other bitmap of the disk is not held.
    d.call("bdev_dirty_bitmap_clear", bm("free"));
    assert!(extents(&d, "m0", "free").is_empty());

    assert_eq!(d.call("nbd_stop_disk", json!({ "nbd_device": device })), true);
    d.call("bdev_dirty_bitmap_merge", json!({ "bdev": "m0", "target": "free", "bitmaps": ["held"] }));
    assert_eq!(extents(&d, "m0", "free"), [(8192, 4096)]);
    for method in ["bdev_dirty_bitmap_disable", "bdev_dirty_bitmap_enable", "bdev_dirty_bitmap_clear"] {
        assert_eq!(d.call(method, bm("held")), true, "{method}");
    }
    assert!(extents(&d, "m0", "held").is_empty());
    d.call("bdev_dirty_bitmap_remove", bm("held"));
    d.assert_alive();
}
