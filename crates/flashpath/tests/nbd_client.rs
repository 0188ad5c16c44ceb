//! The nbd_client bdev (issue 22, part 3) between two daemons, as a migration without shared
//! storage uses it: daemon B attaches daemon A's NBD export as a disk and serves it again over
//! vhost-user-blk (libblkio) and NBD (qemu-img); what one side writes, the other reads. Then
//! daemon A dies mid-I/O: B's requests fail with an error, B lives on, and the disk can be
//! deleted. The RPCs' refusals name their field.
//!
//! The tools come from qemu-utils; `./run test` installs them.

mod common;

use std::process::Command;
use std::time::Duration;

use common::nbd::{random_file, run_tool, start_export, unix_uri};
use common::{assert_same, bounded, pattern, BlkClient, Daemon};
use serde_json::json;

const MIB: u64 = 1 << 20;

fn qemu_img_ok(args: &[&str]) {
    let out = run_tool(Command::new("qemu-img").args(args));
    assert!(out.status.success(), "qemu-img {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Daemon A with a 16 MiB RAM disk `src` exported at `<A>/src.nbd`.
fn source() -> (Daemon, String) {
    let a = Daemon::start("0");
    a.malloc("src", 16 * MIB / 512, 512);
    let sock = a.dir.path().join("src.nbd");
    start_export(&a, "src", sock.to_str().unwrap(), false);
    let uri = unix_uri("src", &sock);
    (a, uri)
}

#[test]
fn a_remote_export_is_a_disk_that_both_sides_see_alike() {
    let (a, uri) = source();
    let b = Daemon::start("0");
    let r = b.call("bdev_nbd_client_create", json!({"name": "remote", "address": uri}));
    assert_eq!(r, json!("remote"));
    let bdev = &b.call("bdev_get_bdevs", json!({"name": "remote"}))[0];
    assert_eq!(bdev["product_name"], "NBD client disk", "{bdev}");
    assert_eq!(bdev["num_blocks"], json!(16 * MIB / 512), "{bdev}");
    let detail = &bdev["driver_specific"]["nbd_client"];
    assert_eq!(detail["address"], json!(uri), "{bdev}");
    assert_eq!(detail["export_name"], "src", "{bdev}");
    assert_eq!(detail["read_only"], false, "{bdev}");

    // Written through B's vhost-user-blk controller, read from A's export.
    let vsock = b.controller("vr", "remote", Some(1), false);
    let data = pattern(22, 0, (4 * MIB) as usize);
    let mut client = BlkClient::open(&vsock, 1);
    client.write_all(MIB, &data);
    assert_eq!(client.flush(0), 0);
    let out = b.dir.path().join("out.raw");
    qemu_img_ok(&["convert", "-f", "raw", "-O", "raw", &uri, out.to_str().unwrap()]);
    let on_a = std::fs::read(&out).unwrap();
    assert_same("A's disk after writes through B", MIB, &on_a[MIB as usize..(5 * MIB) as usize], &data);

    // Written into A's export, read through B's controller and B's own NBD export of it.
    let src = b.dir.path().join("src.raw");
    let file = random_file(&src, 7, (16 * MIB) as usize);
    qemu_img_ok(&["convert", "-n", "-f", "raw", "-O", "raw", src.to_str().unwrap(), &uri]);
    let got = client.read_all(3 * MIB, (2 * MIB) as usize);
    assert_same(
        "B's reads after writes into A",
        3 * MIB,
        &got,
        &file[(3 * MIB) as usize..(5 * MIB) as usize],
    );
    drop(client);
    b.call("vhost_delete_controller", json!({"ctrlr": "vr"}));
    let bsock = b.dir.path().join("remote.nbd");
    start_export(&b, "remote", bsock.to_str().unwrap(), false);
    let b_uri = unix_uri("remote", &bsock);
    qemu_img_ok(&["compare", "-f", "raw", "-F", "raw", src.to_str().unwrap(), &b_uri]);

    // Deleting while exported is refused; after the export goes, it works.
    assert!(b.try_call("bdev_nbd_client_delete", json!({"name": "remote"})).is_err());
    b.call("nbd_stop_disk", json!({"nbd_device": bsock.to_str().unwrap()}));
    assert_eq!(b.call("bdev_nbd_client_delete", json!({"name": "remote"})), json!(true));
    assert_eq!(b.call("bdev_get_bdevs", json!(null)), json!([]));
    drop(a);
}

#[test]
fn the_source_dying_mid_io_fails_requests_not_the_daemon() {
    let (mut a, uri) = source();
    let mut b = Daemon::start("0");
    b.call("bdev_nbd_client_create", json!({"name": "remote", "address": uri}));
    let vsock = b.controller("vr", "remote", Some(1), false);
    let mut client = BlkClient::open(&vsock, 1);
    assert_eq!(client.write(0, 0, &[0x5a; 4096]), 0);
    // A writer keeps 1 MiB writes going while A is killed under it; it stops at the first
    // failure. Every request ends, with an error, in bounded time.
    // The kill waits for the writer's first write, rather than a time, so that it comes
    // mid-I/O however slow the machine is.
    let (first_tx, first_rx) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        let data = vec![0x33u8; MIB as usize];
        for i in 0.. {
            let r = client.write(0, (i % 16) * MIB, &data);
            if r < 0 {
                let after = [client.read(0, 0, 4096).err().unwrap_or(0), client.flush(0)];
                return (i, r, after);
            }
            let _ = first_tx.send(());
        }
        unreachable!()
    });
    first_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the writer's first 1 MiB write did not complete in 60 s");
    a.kill9();
    let (writes, failed, after) =
        bounded(Duration::from_secs(30), "I/O after the source died", move || writer.join().unwrap());
    assert!(writes > 0, "writes went through before the kill");
    let rets = [failed, after[0], after[1]];
    assert!(rets.iter().all(|&r| r < 0), "requests to a dead server fail: {rets:?}");
    b.assert_alive();
    assert!(b.stderr().contains("connection to"), "the loss is logged:\n{}", b.stderr());
    let bdev = &b.call("bdev_get_bdevs", json!({"name": "remote"}))[0];
    assert_eq!(bdev["driver_specific"]["nbd_client"]["connections_lost"], json!(1), "{bdev}");
    b.call("vhost_delete_controller", json!({"ctrlr": "vr"}));
    assert_eq!(b.call("bdev_nbd_client_delete", json!({"name": "remote"})), json!(true));
    b.assert_alive();
}

#[test]
fn bad_parameters_are_refused_naming_the_field() {
    let (_a, uri) = source();
    let b = Daemon::start("0");
    let cases = [
        (json!({"address": uri}), "name"),
        (json!({"name": "x"}), "address"),
        (json!({"name": "x", "address": "relative/path"}), "address"),
        (json!({"name": "x", "address": "/nonexistent/socket"}), "address"),
        (json!({"name": "x", "address": uri, "export_name": "other"}), "export_name"),
        (json!({"name": "x", "address": uri.replace("/src?", "/nope?")}), "address"),
        (json!({"name": "x", "address": uri, "block_size": 100}), "block_size"),
        (json!({"name": "x", "address": uri, "bogus": 1}), "bogus"),
    ];
    for (params, field) in cases {
        let e = b.try_call("bdev_nbd_client_create", params.clone()).expect_err("refused");
        assert!(e.message.contains(field), "{params}: {} should name {field}", e.message);
    }
    assert_eq!(b.call("bdev_get_bdevs", json!(null)), json!([]));
    let e = b.try_call("bdev_nbd_client_delete", json!({"name": "x"})).expect_err("no such bdev");
    assert_eq!(e.code, -19, "{}", e.message);
}

/// `flashpath nbd-client ...` with the daemon's RPC socket; returns stdout, asserting success.
fn cli(daemon: &Daemon, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .args(args)
        .env("FLASHPATH_RPC", &daemon.rpc)
        .env_remove("RUST_LOG")
        .output()
        .expect("running flashpath");
    assert!(out.status.success(), "flashpath {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_cli_attaches_lists_and_detaches() {
    let (a, _) = source();
    let b = Daemon::start("0");
    let sock = a.dir.path().join("src.nbd");
    let out =
        cli(&b, &["nbd-client", "attach", "r", sock.to_str().unwrap(), "--export", "src", "--read-only"]);
    assert_eq!(out.trim(), "r");
    let list = cli(&b, &["nbd-client", "list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert!(lines[0].starts_with("DISK") && lines[0].contains("ADDRESS"), "{list}");
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row, ["r", sock.to_str().unwrap(), "src", "16777216", "512", "yes", "0", "0"], "{list}");
    assert!(b.call("bdev_get_bdevs", json!({"name": "r"}))[0]["supported_io_types"]["write"] == false);
    cli(&b, &["nbd-client", "detach", "r"]);
    assert_eq!(cli(&b, &["nbd-client", "list"]).lines().count(), 1, "only the header is left");
}

#[test]
fn a_config_file_attaches_a_remote_export() {
    let (_a, uri) = source();
    let b = Daemon::start_with_config("0", |_| {
        format!("[[bdev]]\ntype = \"nbd_client\"\nname = \"remote\"\naddress = \"{uri}\"\nread_only = true\n")
    });
    let bdev = &b.call("bdev_get_bdevs", json!({"name": "remote"}))[0];
    assert_eq!(bdev["driver_specific"]["nbd_client"]["read_only"], true, "{bdev}");
    assert_eq!(bdev["num_blocks"], json!(16 * MIB / 512), "{bdev}");
}

#[test]
fn two_reactors_use_two_connections() {
    let (_a, uri) = source();
    let b = Daemon::start("0,1");
    b.call("bdev_nbd_client_create", json!({"name": "remote", "address": uri}));
    let vsock = b.controller("vr", "remote", Some(2), false);
    let mut client = BlkClient::open(&vsock, 2);
    // Queue i runs on reactor i: each writes its half through its own connection.
    let halves = [pattern(1, 0, MIB as usize), pattern(2, 0, MIB as usize)];
    for (q, data) in halves.iter().enumerate() {
        assert_eq!(client.write(q, q as u64 * MIB, data), 0, "queue {q}");
    }
    for (q, data) in halves.iter().enumerate() {
        let other = 1 - q;
        let got = client.read(other, q as u64 * MIB, MIB as usize).unwrap();
        assert_same("read through the other queue", q as u64 * MIB, &got, data);
    }
    let bdev = &b.call("bdev_get_bdevs", json!({"name": "remote"}))[0];
    assert_eq!(bdev["driver_specific"]["nbd_client"]["connections"], json!(2), "{bdev}");
}
