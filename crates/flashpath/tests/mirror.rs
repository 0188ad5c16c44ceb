//! The mirror end to end (issue 22, docs/mirror.md): a vhost-user-blk client writes to a RAM
//! disk while a job copies it to another RAM disk; after `bdev_mirror_complete` the target,
//! exported in turn, reads back exactly what the source holds. The CLI shows the job.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_same, bounded, pattern, BlkClient, Daemon};
use serde_json::{json, Value};

const DISK: u64 = 32 << 20;

fn job(daemon: &Daemon, id: &str) -> Value {
    daemon.call("bdev_mirror_get_jobs", json!({ "job_id": id }))[0].clone()
}

fn cli(daemon: &Daemon, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .arg("--rpc")
        .arg(&daemon.rpc)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "flashpath {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_disk_written_by_a_guest_is_mirrored_to_a_ram_disk_and_completes_equal() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("src", DISK / 512, 512);
    daemon.malloc("dst", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "src", Some(1), false);

    // The guest: fills the disk, then writes 4 KiB blocks at random places until told to stop,
    // then reads the whole disk back.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let (s, w) = (stop.clone(), written.clone());
    let guest = std::thread::spawn(move || {
        bounded(Duration::from_secs(240), "guest", move || {
            let mut c = BlkClient::open(&sock, 1);
            c.write_all(0, &pattern(1, 0, DISK as usize));
            w.fetch_add(1, Ordering::SeqCst);
            let mut rng = 0x2545_F491_4F6C_DD1Du64;
            while !s.load(Ordering::SeqCst) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let off = (rng % (DISK / 4096)) * 4096;
                assert_eq!(c.write(0, off, &pattern(rng, off, 4096)), 0, "a write at {off} failed");
                w.fetch_add(1, Ordering::SeqCst);
            }
            c.read_all(0, DISK as usize)
        })
    });
    while written.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }

    let id = daemon.call("bdev_mirror_start", json!({ "source": "src", "target": "dst", "job_id": "move" }));
    assert_eq!(id, "move");
    let until = Instant::now() + Duration::from_secs(60);
    let at_start = written.load(Ordering::SeqCst);
    while job(&daemon, "move")["state"] != "ready" {
        assert!(Instant::now() < until, "never ready: {}", job(&daemon, "move"));
        std::thread::sleep(Duration::from_millis(5));
    }
    // The guest keeps writing in ready: each write now goes to both disks.
    let ready_at = written.load(Ordering::SeqCst);
    while written.load(Ordering::SeqCst) < ready_at + 500 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = cli(&daemon, &["mirror", "status", "move"]);
    assert!(status.contains("move") && status.contains("ready"), "{status}");
    stop.store(true, Ordering::SeqCst);
    let source = guest.join().unwrap();
    let total = written.load(Ordering::SeqCst);
    assert!(total > at_start + 500, "the guest wrote while the job ran ({at_start} then {total})");

    assert_eq!(cli(&daemon, &["mirror", "complete", "move"]), "");
    let j = job(&daemon, "move");
    assert_eq!((j["state"].as_str(), j["dirty_bytes"].as_u64()), (Some("completed"), Some(0)), "{j}");
    assert!(j["copied"].as_u64().unwrap() >= DISK);

    // The target is free again: export it and read it.
    let sock2 = daemon.controller("vhost.1", "dst", Some(1), false);
    let target = bounded(Duration::from_secs(120), "read the target", move || {
        BlkClient::open(&sock2, 1).read_all(0, DISK as usize)
    });
    assert_same("the target after completion", 0, &target, &source);
    let status = cli(&daemon, &["mirror", "status"]);
    assert!(status.contains("completed"), "{status}");
    daemon.assert_alive();
}

#[test]
fn refusals_reach_the_operator_and_the_source_stays_served() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("src", DISK / 512, 512);
    daemon.malloc("small", DISK / 512 - 8, 512);
    daemon.malloc("dst", DISK / 512, 512);
    let sock = daemon.controller("vhost.0", "src", Some(1), false);
    let e = daemon.try_call("bdev_mirror_start", json!({ "source": "src", "target": "small" })).unwrap_err();
    assert!(e.message.starts_with("target: ") && e.message.contains("fewer than the source's"), "{e:?}");
    // A disk an export holds cannot be a target.
    let e = daemon.try_call("bdev_mirror_start", json!({ "source": "dst", "target": "src" })).unwrap_err();
    assert!(e.message.contains("in use by 'vhost.0'"), "{e:?}");
    daemon.call("bdev_mirror_start", json!({ "source": "src", "target": "dst" }));
    let e = daemon.try_call("bdev_malloc_delete", json!({ "name": "dst" })).unwrap_err();
    assert!(e.message.contains("mirror src"), "{e:?}");
    // Cancel: the disk stays served; the target is free.
    assert_eq!(cli(&daemon, &["mirror", "cancel", "src"]), "");
    assert_eq!(job(&daemon, "src")["state"], "cancelled");
    let back = bounded(Duration::from_secs(60), "guest", move || {
        let mut c = BlkClient::open(&sock, 1);
        c.write_all(4096, &pattern(9, 4096, 8192));
        c.read_all(4096, 8192)
    });
    assert_same("the source after cancel", 4096, &back, &pattern(9, 4096, 8192));
    daemon.call("bdev_malloc_delete", json!({ "name": "dst" }));
    daemon.assert_alive();
}
