//! Logical volumes through the real daemon and libblkio: verified random I/O on a thin volume
//! from two queues on two reactors (first writes race for the same clusters), snapshots taken
//! while a client writes (no error, nothing lost), and the refusals that protect a volume in use.

mod common;

use std::time::Duration;

use common::{assert_same, bounded, pattern, random_write_verify, BlkClient, Daemon};
use serde_json::json;

const MIB: u64 = 1 << 20;

/// A malloc base with lvstore `lvs` (1 MiB clusters) and a thin volume `lvs/v` of `size`.
fn volume(daemon: &Daemon, size: u64) {
    daemon.malloc("m0", 64 * MIB / 512, 512);
    daemon.call("bdev_lvol_create_lvstore", json!({"bdev_name": "m0", "lvs_name": "lvs", "cluster_sz": MIB}));
    daemon.call(
        "bdev_lvol_create",
        json!({"lvs_name": "lvs", "lvol_name": "v", "size_in_mib": size / MIB, "thin_provision": true}),
    );
}

/// The first `len` bytes, read 64 KiB at a time (the client's arena is small).
fn read_all(c: &mut BlkClient, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    for off in (0..len).step_by(64 * 1024) {
        out.extend(c.read(0, off, 64 * 1024).unwrap_or_else(|e| panic!("read at {off}: {e}")));
    }
    out
}

#[test]
fn thin_volume_random_write_verify_2_queues_2_reactors() {
    let mut daemon = Daemon::start("0-1");
    volume(&daemon, 16 * MIB);
    let sock = daemon.controller("vhost.0", "lvs/v", Some(2), false);
    let compared = bounded(Duration::from_secs(180), "random io", move || {
        let mut c = BlkClient::open(&sock, 2);
        assert_eq!(c.capacity, 16 * MIB);
        // A thin volume reads zeroes until written.
        random_write_verify(&mut c, 7, 10, 0, 16 * MIB, Some(0))
    });
    assert!(compared >= 16 * MIB);
    let lvols = daemon.call("bdev_lvol_get_lvols", json!({}));
    assert!(lvols[0]["num_allocated_clusters"].as_u64().unwrap() > 0, "{lvols}");
    daemon.assert_alive();
}

#[test]
fn snapshots_under_writes_fail_nothing_and_the_volume_in_use_is_protected() {
    let mut daemon = Daemon::start("0");
    volume(&daemon, 8 * MIB);
    let sock = daemon.controller("vhost.0", "lvs/v", Some(1), false);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    // The writer reports each round it finishes, so that every snapshot comes after one more
    // whole round, however fast the machine runs.
    let (round_tx, round_rx) = std::sync::mpsc::channel::<u64>();
    let writer = std::thread::spawn(move || {
        let mut c = BlkClient::open(&sock, 1);
        let mut round = 0u64;
        // Rewrites the whole volume in 64 KiB writes until told to stop, each round its pattern.
        loop {
            for off in (0..8 * MIB).step_by(64 * 1024) {
                let data = pattern(round, off, 64 * 1024);
                assert_eq!(c.write(0, off, &data), 0, "write at {off} in round {round}");
            }
            assert_eq!(c.flush(0), 0);
            round += 1;
            let _ = round_tx.send(round);
            if rx.try_recv().is_ok() {
                break;
            }
        }
        let got = read_all(&mut c, 8 * MIB);
        assert_same("the volume after the snapshots", 0, &got, &pattern(round - 1, 0, (8 * MIB) as usize));
        round
    });
    for i in 0..5 {
        // Generous: a round is 8 MiB in 128 writes.
        round_rx.recv_timeout(Duration::from_secs(60)).expect("the writer finished no round in 60 s");
        daemon.call("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": format!("s{i}")}));
    }
    tx.send(()).unwrap();
    let rounds = bounded(Duration::from_secs(120), "writer", move || writer.join().unwrap());
    assert!(rounds >= 5, "the writer made only {rounds} rounds");
    // A snapshot holds a consistent state: each 64 KiB piece is one round's data, written in
    // order, so the rounds seen never increase along the volume... and are all real rounds.
    let snap_sock = daemon.controller("vhost.s4", "lvs/s4", Some(1), true);
    let mut c =
        BlkClient::connect(&snap_sock, common::ClientOpts { read_only: true, ..Default::default() }).unwrap();
    let got = read_all(&mut c, 8 * MIB);
    let mut seen = Vec::new();
    for off in (0..8 * MIB).step_by(64 * 1024) {
        let piece = &got[off as usize..(off + 64 * 1024) as usize];
        let round = (0..rounds).find(|&r| piece == &pattern(r, off, 64 * 1024)[..]);
        seen.push(round.unwrap_or_else(|| panic!("snapshot s4 at {off}: not any round's data")));
    }
    assert!(seen.windows(2).all(|w| w[0] >= w[1]), "snapshot rounds along the volume: {seen:?}");
    drop(c);
    // In use: the volume, the snapshot with clones, the store.
    let e = daemon.try_call("bdev_lvol_delete", json!({"name": "lvs/v"})).unwrap_err();
    assert!(e.message.contains("vhost.0"), "{e:?}");
    let e = daemon.try_call("bdev_lvol_delete", json!({"name": "lvs/s0"})).unwrap_err();
    assert!(e.message.starts_with("name: "), "{e:?}");
    let e = daemon.try_call("bdev_lvol_delete_lvstore", json!({"lvs_name": "lvs"})).unwrap_err();
    assert!(e.message.contains("vhost"), "{e:?}");
    assert_eq!(
        daemon.call("bdev_lvol_get_lvols", json!({})).as_array().unwrap().len(),
        6,
        "nothing was deleted"
    );
    daemon.assert_alive();
}

/// `flashpath volume ...` against a daemon: stdout of what it made, one stderr line naming the
/// argument when refused.
#[test]
fn the_volume_cli_creates_lists_and_refuses_in_one_line() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m0", 64 * MIB / 512, 512);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flashpath"))
            .args(args)
            .env("FLASHPATH_RPC", &daemon.rpc)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (code, uuid, _) =
        cli(&["volume", "create-store", "--disk", "m0", "--name", "lvs", "--cluster-size", "1MiB"]);
    assert_eq!((code, uuid.trim().len()), (Some(0), 36), "{uuid}");
    let (code, v, _) = cli(&["volume", "create", "lvs/v", "--size", "8MiB", "--thin"]);
    assert_eq!(code, Some(0));
    assert_eq!(cli(&["volume", "snapshot", "lvs/v", "s"]).0, Some(0));
    assert_eq!(cli(&["volume", "clone", "lvs/s", "c"]).0, Some(0));
    let (_, list, _) = cli(&["volume", "list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 4, "{list}");
    assert!(
        lines.iter().any(|l| l.starts_with("lvs/v") && l.contains(v.trim()) && l.contains("clone")),
        "{list}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("lvs/s") && l.contains("snapshot") && l.contains("8 MiB")),
        "{list}"
    );
    let (_, stores, _) = cli(&["volume", "stores"]);
    assert!(
        stores
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("lvs") && l.contains("m0") && l.contains("1 MiB")),
        "{stores}"
    );
    let (code, out, err) = cli(&["volume", "delete", "lvs/s"]);
    assert_eq!((code, out.as_str()), (Some(1), ""));
    assert_eq!(err, "error: VOLUME: 's' has clones; delete them (or inflate them) first\n");
    let (code, _, err) = cli(&["volume", "create-store", "--disk", "nope", "--name", "x"]);
    assert_eq!((code, err.as_str()), (Some(1), "error: --disk: no bdev 'nope'\n"));
    daemon.assert_alive();
}
