//! The mirror end to end (issue 22, docs/mirror.md): a vhost-user-blk client, and an NBD
//! client, write to a RAM disk while a job copies it to another RAM disk; after
//! `bdev_mirror_complete` the target, exported in turn, reads back exactly what the source
//! holds. The CLI shows the job.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::nbd::{start_export, Endpoint, NbdConn};
use common::{assert_same, bounded, pattern, BlkClient, Daemon};
use serde_json::{json, Value};

const DISK: u64 = 32 << 20;

/// A writing client's controls: how many writes it completed, and whether it should pause
/// (and has).
#[derive(Default)]
struct Writer {
    written: AtomicU64,
    pause: AtomicBool,
    paused: AtomicBool,
    stop: AtomicBool,
}

impl Writer {
    /// Called by the client between writes: false once told to stop; holds it while paused.
    fn go_on(&self) -> bool {
        while self.pause.load(Ordering::SeqCst) && !self.stop.load(Ordering::SeqCst) {
            self.paused.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
        }
        self.paused.store(false, Ordering::SeqCst);
        !self.stop.load(Ordering::SeqCst)
    }
}

/// Once the client has written `during` more times under job `id` (its writes dirty what was
/// copied), pauses it and waits until the job is ready; then lets it write `more` times (to
/// both disks). The pause is what lets the job converge whatever the machine's speed: the
/// copier's share grows with the client's bytes, and in the background mode a client that
/// never pauses may leave something dirty at every round's end (the write-blocking mode, which
/// needs no pause, is tested round by round in fp-bdev's mirror tests).
fn write_until_ready_then_write_more(daemon: &Daemon, id: &str, w: &Writer, during: u64, more: u64) {
    let at_start = w.written.load(Ordering::SeqCst);
    wait_for_writes(&w.written, at_start + during, &format!("while job {id} copies"));
    w.pause.store(true, Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(60);
    while !w.paused.load(Ordering::SeqCst) || job(daemon, id)["state"] != "ready" {
        assert!(Instant::now() < until, "never ready: {}", job(daemon, id));
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready_at = w.written.load(Ordering::SeqCst);
    w.pause.store(false, Ordering::SeqCst);
    wait_for_writes(&w.written, ready_at + more, &format!("after job {id} was ready"));
}

/// Waits (60 s at most) until `written` reaches `n`.
fn wait_for_writes(written: &AtomicU64, n: u64, what: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    while written.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < until, "{what}: {} writes in 60 s, not {n}", written.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(5));
    }
}

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
    let writer = Arc::new(Writer::default());
    let w = writer.clone();
    let guest = std::thread::spawn(move || {
        bounded(Duration::from_secs(240), "guest", move || {
            let mut c = BlkClient::open(&sock, 1);
            c.write_all(0, &pattern(1, 0, DISK as usize));
            w.written.fetch_add(1, Ordering::SeqCst);
            let mut rng = 0x2545_F491_4F6C_DD1Du64;
            while w.go_on() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let off = (rng % (DISK / 4096)) * 4096;
                assert_eq!(c.write(0, off, &pattern(rng, off, 4096)), 0, "a write at {off} failed");
                w.written.fetch_add(1, Ordering::SeqCst);
            }
            c.read_all(0, DISK as usize)
        })
    });
    wait_for_writes(&writer.written, 1, "the guest filling the disk");

    let id = daemon.call("bdev_mirror_start", json!({ "source": "src", "target": "dst", "job_id": "move" }));
    assert_eq!(id, "move");
    // The guest writes while the job copies, and in ready: each write then goes to both disks.
    write_until_ready_then_write_more(&daemon, "move", &writer, 300, 500);
    let status = cli(&daemon, &["mirror", "status", "move"]);
    assert!(status.contains("move") && status.contains("ready"), "{status}");
    writer.stop.store(true, Ordering::SeqCst);
    let source = guest.join().unwrap();

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
    // Slowed to a crawl, it is still copying when cancelled; the limit shows, and changes.
    daemon.call("bdev_mirror_start", json!({ "source": "src", "target": "dst", "speed": 1 << 20 }));
    assert_eq!(job(&daemon, "src")["speed"], json!(1 << 20));
    assert_eq!(cli(&daemon, &["mirror", "set-speed", "src", "2MiB"]), "");
    assert_eq!(job(&daemon, "src")["speed"], json!(2 << 20));
    let e = daemon.try_call("bdev_mirror_set_speed", json!({ "job_id": "nope", "speed": 1 })).unwrap_err();
    assert!(e.message.contains("nope"), "{e:?}");
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

#[test]
fn a_disk_written_over_nbd_is_mirrored_and_completes_equal() {
    const SIZE: u64 = 8 << 20;
    let mut daemon = Daemon::start("0");
    daemon.malloc("src", SIZE / 512, 512);
    daemon.malloc("dst", SIZE / 512, 512);
    let sock = daemon.dir.path().join("src.nbd");
    start_export(&daemon, "src", sock.to_str().unwrap(), false);
    let writer = Arc::new(Writer::default());
    let w = writer.clone();
    let ep = Endpoint::Unix(sock);
    let client = std::thread::spawn(move || {
        bounded(Duration::from_secs(240), "nbd client", move || {
            let mut c = NbdConn::connect(&ep, "src").unwrap();
            let mut rng = 0x9E37_79B9_7F4A_7C15u64;
            while w.go_on() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let off = (rng % (SIZE / 4096)) * 4096;
                assert_eq!(c.write(off, &pattern(rng, off, 4096), 0).unwrap(), 0, "a write at {off} failed");
                w.written.fetch_add(1, Ordering::SeqCst);
            }
            let mut all = Vec::new();
            for off in (0..SIZE).step_by(1 << 20) {
                all.extend(c.read(off, 1 << 20).unwrap().unwrap());
            }
            c.disconnect();
            all
        })
    });
    wait_for_writes(&writer.written, 100, "the nbd client before the job");
    daemon.call("bdev_mirror_start", json!({ "source": "src", "target": "dst", "granularity": 4096 }));
    write_until_ready_then_write_more(&daemon, "src", &writer, 300, 300);
    writer.stop.store(true, Ordering::SeqCst);
    let source = client.join().unwrap();
    assert_eq!(daemon.call("bdev_mirror_complete", json!({ "job_id": "src" })), true);
    assert_eq!(job(&daemon, "src")["state"], "completed");
    let sock2 = daemon.dir.path().join("dst.nbd");
    start_export(&daemon, "dst", sock2.to_str().unwrap(), true);
    let ep2 = Endpoint::Unix(sock2);
    let target = bounded(Duration::from_secs(60), "read the target", move || {
        let mut c = NbdConn::connect(&ep2, "dst").unwrap();
        let mut all = Vec::new();
        for off in (0..SIZE).step_by(1 << 20) {
            all.extend(c.read(off, 1 << 20).unwrap().unwrap());
        }
        all
    });
    assert_same("the target after completion", 0, &target, &source);
    daemon.assert_alive();
}

/// The destination daemon dies while the job runs (the network drops, the host fails): the job
/// fails with the error, and the VM on the source never notices: every write it makes, before
/// and after, succeeds and reads back.
#[test]
fn a_target_that_disappears_fails_the_job_never_the_source() {
    const BIG: u64 = 256 << 20; // still copying when the target goes, on most runs
    let mut b = Daemon::start("0");
    b.malloc("dst", BIG / 512, 512);
    let nbd_sock = b.dir.path().join("dst.nbd");
    start_export(&b, "dst", nbd_sock.to_str().unwrap(), false);
    let uri = common::nbd::unix_uri("dst", &nbd_sock);

    let mut a = Daemon::start("0");
    a.malloc("src", BIG / 512, 512);
    let vsock = a.controller("vhost.0", "src", Some(1), false);
    a.call("bdev_nbd_client_create", json!({ "name": "remote", "address": uri }));
    a.call("bdev_mirror_start", json!({ "source": "src", "target": "remote" }));

    // The guest writes 64 KiB blocks round the first 16 MiB until told to stop; a failed
    // write ends it at once.
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    // The guest's completed writes, so that the test waits for its progress, not for a time.
    let written = Arc::new(AtomicU64::new(0));
    let w = written.clone();
    let guest = std::thread::spawn(move || {
        let mut c = BlkClient::open(&vsock, 1);
        let mut n = 0u64;
        while !s.load(Ordering::SeqCst) {
            let off = (n % 256) * 65536;
            let r = c.write(0, off, &pattern(n, off, 65536));
            if r != 0 {
                return Err(format!("write {n} at {off} failed: {r}"));
            }
            n += 1;
            w.store(n, Ordering::SeqCst);
        }
        // The last round of blocks reads back as written.
        for i in n.saturating_sub(256)..n {
            let off = (i % 256) * 65536;
            let got = c.read(0, off, 65536).map_err(|r| format!("read at {off} failed: {r}"))?;
            if got != pattern(i, off, 65536) {
                return Err(format!("block {i} at {off} does not read back"));
            }
        }
        Ok(n)
    });
    wait_for_writes(&written, 1, "before the kill");
    b.kill9();
    let until = Instant::now() + Duration::from_secs(60);
    let failed = loop {
        let j = job(&a, "src");
        if j["state"] == "failed" {
            break j;
        }
        assert!(Instant::now() < until, "the job did not notice its target went: {j}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(failed["error"].as_str().is_some_and(|e| !e.is_empty()), "the job says why: {failed}");
    // The guest goes on writing after the failure.
    let at_failure = written.load(Ordering::SeqCst);
    wait_for_writes(&written, at_failure + 16, "after the job failed");
    stop.store(true, Ordering::SeqCst);
    let writes = bounded(Duration::from_secs(60), "guest", move || guest.join().unwrap()).unwrap();
    assert!(writes >= at_failure + 16, "{writes} writes, {at_failure} when the job failed");
    // The target is released; the remote disk goes; the source is served on.
    assert_eq!(a.call("bdev_mirror_cancel", json!({ "job_id": "src" })), json!(true));
    assert_eq!(a.call("bdev_nbd_client_delete", json!({ "name": "remote" })), json!(true));
    a.assert_alive();
}
