//! Point-in-time views (fleecing, docs/backup.md) end to end, through NBD: the guest writes its
//! disk through one export while a backup reads the fleece bdev through another.
//!
//! * [`the_view_stays_at_the_point_in_time`]: a RAM disk with pattern A, a fleece, writes of
//!   pattern B (unaligned, spanning chunks), write-zeroes and discards through NBD; the fleece
//!   reads A everywhere, the base B; the fleece refuses writes (read-only); delete is refused
//!   while exported, then the base's writes no longer reach the target.
//! * [`a_guest_write_waits_for_a_point_in_time_read_in_flight`]: the base is a delay bdev whose
//!   reads take a second; a fleece read of a chunk is sent, then a guest write of it: the read
//!   returns the old data.
//! * [`a_failing_target_breaks_the_snapshot_not_the_guest`].
//! * [`refusals_name_the_field`], and the CLI (`flashpath fleece create|status|delete`).

mod common;

use std::time::{Duration, Instant};

use common::nbd::{start_export, Endpoint, NbdConn, CMD_READ, CMD_TRIM, CMD_WRITE_ZEROES};
use common::{bounded, pattern, Daemon};
use serde_json::{json, Value};

const BLOCKS: u64 = 2048; // 1 MiB of 512-byte blocks
const SIZE: usize = (BLOCKS * 512) as usize;
const G: u64 = 4096;

fn export(d: &Daemon, bdev: &str, readonly: bool) -> Endpoint {
    let sock = d.dir.path().join(format!("{bdev}.nbd"));
    start_export(d, bdev, sock.to_str().unwrap(), readonly);
    Endpoint::Unix(sock)
}

fn fleece_info(d: &Daemon, name: &str) -> Value {
    d.call("bdev_get_bdevs", json!({ "name": name }))[0]["driver_specific"]["fleece"].clone()
}

/// Writes pattern A over the whole base through NBD.
fn fill(ep: &Endpoint, name: &'static str) {
    let ep = ep.clone();
    bounded(Duration::from_secs(60), "fill", move || {
        let mut c = NbdConn::connect(&ep, name).unwrap();
        for off in (0..SIZE).step_by(128 << 10) {
            assert_eq!(c.write(off as u64, &pattern(1, off as u64, 128 << 10), 0).unwrap(), 0);
        }
    });
}

/// Reads all of `name` at `ep` through NBD.
fn read_all(ep: &Endpoint, name: &'static str) -> Vec<u8> {
    let ep = ep.clone();
    bounded(Duration::from_secs(60), "read all", move || {
        let mut c = NbdConn::connect(&ep, name).unwrap();
        let mut out = Vec::with_capacity(SIZE);
        for off in (0..SIZE).step_by(128 << 10) {
            out.extend(c.read(off as u64, 128 << 10).unwrap().unwrap());
        }
        out
    })
}

#[test]
fn the_view_stays_at_the_point_in_time() {
    let d = Daemon::start("0");
    d.malloc("base", BLOCKS, 512);
    d.malloc("tgt", BLOCKS, 512);
    let base = export(&d, "base", false);
    fill(&base, "base");
    let a = pattern(1, 0, SIZE);
    let r = d.call(
        "bdev_fleece_create",
        json!({ "name": "fl", "base_bdev": "base", "target_bdev": "tgt", "granularity": G }),
    );
    assert_eq!(r, json!("fl"));
    let info = fleece_info(&d, "fl");
    assert_eq!(info["copied_chunks"], 0);
    assert_eq!(info["broken"], false);
    assert_eq!(d.call("bdev_get_bdevs", json!({ "name": "tgt" }))[0]["claimed"], true);

    // Pattern B: unaligned to chunks, spanning chunks; write-zeroes and a discard.
    let mut want = a.clone();
    let writes: [(u64, usize); 3] = [(512, 1024), (3 * G + 1536, 2 * G as usize), (100 * G, 64 << 10)];
    {
        let ep = base.clone();
        bounded(Duration::from_secs(60), "guest writes", move || {
            let mut c = NbdConn::connect(&ep, "base").unwrap();
            for (off, len) in writes {
                assert_eq!(c.write(off, &pattern(2, off & !7, len), 0).unwrap(), 0);
            }
            assert_eq!(c.command(CMD_WRITE_ZEROES, 0, 40 * G + 512, 8192).unwrap(), 0);
            assert_eq!(c.command(CMD_TRIM, 0, 200 * G, 3 * G as u32).unwrap(), 0);
        });
    }
    for (off, len) in writes {
        want[off as usize..off as usize + len].copy_from_slice(&pattern(2, off & !7, len));
    }
    want[40 * G as usize + 512..40 * G as usize + 512 + 8192].fill(0);
    let now = read_all(&base, "base");
    for (off, len) in writes {
        assert_eq!(
            &now[off as usize..off as usize + len],
            &want[off as usize..off as usize + len],
            "the base shows B"
        );
    }
    assert!(now[40 * G as usize + 512..40 * G as usize + 512 + 8192].iter().all(|&x| x == 0));

    let fl = export(&d, "fl", true);
    let view = read_all(&fl, "fl");
    assert!(view == a, "the fleece shows pattern A everywhere");
    // 1 + 3 + 16 chunks written, 3 zeroed (40.125 to 42.125), 3 discarded.
    assert_eq!(fleece_info(&d, "fl")["copied_chunks"], 1 + 3 + 16 + 3 + 3);
    let ep = fl.clone();
    bounded(Duration::from_secs(60), "fleece write", move || {
        let mut c = NbdConn::connect(&ep, "fl").unwrap();
        assert_ne!(c.write(0, &[0u8; 512], 0).unwrap(), 0, "the fleece is read-only");
    });

    // Delete: refused while exported; then the target is released and no longer written.
    let e = d.try_call("bdev_fleece_delete", json!({ "name": "fl" })).unwrap_err();
    assert!(e.message.contains("in use"), "{e:?}");
    d.call("nbd_stop_disk", json!({ "nbd_device": d.dir.path().join("fl.nbd").to_str().unwrap() }));
    assert_eq!(d.call("bdev_fleece_delete", json!({ "name": "fl" })), true);
    assert_eq!(d.call("bdev_get_bdevs", json!({ "name": "tgt" }))[0]["claimed"], false);
    let writes_before =
        d.call("bdev_get_iostat", json!({ "name": "tgt" }))["bdevs"][0]["num_write_ops"].clone();
    let ep = base.clone();
    bounded(Duration::from_secs(60), "write after delete", move || {
        let mut c = NbdConn::connect(&ep, "base").unwrap();
        assert_eq!(c.write(220 * G, &pattern(3, 0, 8192), 0).unwrap(), 0);
    });
    let writes_after =
        d.call("bdev_get_iostat", json!({ "name": "tgt" }))["bdevs"][0]["num_write_ops"].clone();
    assert_eq!(writes_before, writes_after, "no copy after delete");
    // The base can be deleted again once the fleece is gone.
    d.call("nbd_stop_disk", json!({ "nbd_device": d.dir.path().join("base.nbd").to_str().unwrap() }));
    d.call("bdev_malloc_delete", json!({ "name": "base" }));
}

#[test]
fn a_guest_write_waits_for_a_point_in_time_read_in_flight() {
    let d = Daemon::start("0");
    d.malloc("ram", BLOCKS, 512);
    d.malloc("tgt", BLOCKS, 512);
    // Reads of the base take a second; writes none.
    let lat = json!({ "base_bdev_name": "ram", "name": "slow", "avg_read_latency": 1_000_000,
                      "p99_read_latency": 1_000_000, "avg_write_latency": 0, "p99_write_latency": 0 });
    d.call("bdev_delay_create", lat);
    let base = export(&d, "slow", false);
    fill(&base, "slow");
    d.call(
        "bdev_fleece_create",
        json!({ "name": "fl", "base_bdev": "slow", "target_bdev": "tgt", "granularity": G }),
    );
    let fl = export(&d, "fl", true);
    let (ep_fl, ep_base) = (fl.clone(), base.clone());
    let (old, write_took) = bounded(Duration::from_secs(60), "read under write", move || {
        let mut reader = NbdConn::connect(&ep_fl, "fl").unwrap();
        let mut writer = NbdConn::connect(&ep_base, "slow").unwrap();
        // The read goes out first and sits on the base for a second...
        let cookie = reader.send(0, CMD_READ, 8 * G, G as u32, &[]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // ...then the guest overwrites that chunk. Whichever it finds (the read in flight, or
        // the chunk copied), the read must return the old data.
        let start = Instant::now();
        assert_eq!(writer.write(8 * G, &pattern(9, 8 * G, G as usize), 0).unwrap(), 0);
        let took = start.elapsed();
        let (err, data) = reader.reply(cookie, G as usize).unwrap();
        assert_eq!(err, 0);
        (data, took)
    });
    assert!(old == pattern(1, 8 * G, G as usize), "the fleece read returned the point-in-time data");
    // The write waited for its copy's read of the base, delayed a second (a lower bound only).
    assert!(write_took >= Duration::from_millis(500), "{write_took:?}");
    let view = read_all(&fl, "fl");
    assert!(view == pattern(1, 0, SIZE));
}

#[test]
fn a_failing_target_breaks_the_snapshot_not_the_guest() {
    let d = Daemon::start("0");
    d.malloc("base", BLOCKS, 512);
    d.malloc("ram", BLOCKS, 512);
    d.call("bdev_error_create", json!({ "base_name": "ram" }));
    let inj = json!({ "name": "EE_ram", "io_type": "write", "error_type": "failure", "num": 1000 });
    assert_eq!(d.call("bdev_error_inject_error", inj), true);
    let base = export(&d, "base", false);
    fill(&base, "base");
    d.call("bdev_fleece_create", json!({ "name": "fl", "base_bdev": "base", "target_bdev": "EE_ram" }));
    let ep = base.clone();
    bounded(Duration::from_secs(60), "guest write", move || {
        let mut c = NbdConn::connect(&ep, "base").unwrap();
        assert_eq!(c.write(0, &pattern(2, 0, 4096), 0).unwrap(), 0, "the guest's write succeeds");
    });
    let info = fleece_info(&d, "fl");
    assert_eq!(info["broken"], true, "{info}");
    assert!(info["error"].as_str().unwrap().contains("EE_ram"), "{info}");
    let fl = export(&d, "fl", true);
    bounded(Duration::from_secs(60), "broken read", move || {
        let mut c = NbdConn::connect(&fl, "fl").unwrap();
        assert!(c.read(65536, 4096).unwrap().is_err(), "a broken fleece fails every read");
    });
    // Later writes go through untouched.
    let ep = base.clone();
    bounded(Duration::from_secs(60), "guest write", move || {
        let mut c = NbdConn::connect(&ep, "base").unwrap();
        assert_eq!(c.write(131072, &pattern(2, 0, 4096), 0).unwrap(), 0);
        assert_eq!(c.read(131072, 4096).unwrap().unwrap(), pattern(2, 0, 4096));
    });
}

#[test]
fn refusals_name_the_field() {
    let d = Daemon::start("0");
    d.malloc("base", BLOCKS, 512);
    d.malloc("small", BLOCKS / 2, 512);
    d.malloc("tgt", BLOCKS, 512);
    d.malloc("tgt2", BLOCKS, 512);
    let refuse = |params: Value, field: &str| {
        let e = d.try_call("bdev_fleece_create", params.clone()).unwrap_err();
        assert_eq!(e.code, -32602, "{params}: {e:?}");
        assert!(e.message.contains(field), "{params}: {e:?}");
    };
    refuse(json!({ "name": "f", "base_bdev": "nope", "target_bdev": "tgt" }), "base_bdev");
    refuse(json!({ "name": "f", "base_bdev": "base", "target_bdev": "nope" }), "target_bdev");
    refuse(json!({ "name": "f", "base_bdev": "base", "target_bdev": "small" }), "target_bdev");
    refuse(json!({ "name": "f", "base_bdev": "base", "target_bdev": "base" }), "target_bdev");
    refuse(
        json!({ "name": "f", "base_bdev": "base", "target_bdev": "tgt", "granularity": 1000 }),
        "granularity",
    );
    refuse(json!({ "name": "base", "base_bdev": "base", "target_bdev": "tgt" }), "name");
    d.call("bdev_fleece_create", json!({ "name": "f", "base_bdev": "base", "target_bdev": "tgt" }));
    // The target is the fleece's now; the base has its fleece.
    refuse(json!({ "name": "g", "base_bdev": "tgt2", "target_bdev": "tgt" }), "target_bdev");
    refuse(json!({ "name": "g", "base_bdev": "base", "target_bdev": "tgt2" }), "base_bdev");
    // The base cannot shrink under it (the view keeps its size); it may grow.
    let e =
        d.try_call("bdev_malloc_resize", json!({ "name": "base", "new_size_bytes": SIZE / 2 })).unwrap_err();
    assert!(e.message.contains("fleece f"), "{e:?}");
    // Neither the base nor the target can be deleted under it.
    assert!(d.try_call("bdev_malloc_delete", json!({ "name": "base" })).is_err());
    assert!(d.try_call("bdev_malloc_delete", json!({ "name": "tgt" })).is_err());
    let e = d.try_call("bdev_mirror_start", json!({ "source": "base", "target": "tgt2" })).unwrap_err();
    assert!(e.message.contains("fleece"), "{e:?}");
    assert_eq!(d.call("bdev_fleece_delete", json!({ "name": "f" })), true);
    d.call("bdev_malloc_delete", json!({ "name": "tgt" }));
    let e = d.try_call("bdev_fleece_delete", json!({ "name": "f" })).unwrap_err();
    assert_eq!(e.code, -19, "{e:?}");

    // The CLI.
    assert_eq!(cli(&d, &["fleece", "create", "v", "base", "tgt2", "--granularity", "16KiB"]).trim(), "v");
    let status = cli(&d, &["fleece", "status"]);
    assert!(status.contains("NAME") && status.contains("tgt2") && status.contains("16 KiB"), "{status}");
    cli(&d, &["fleece", "delete", "v"]);
    assert!(!cli(&d, &["fleece", "status"]).contains("tgt2"));
}

fn cli(d: &Daemon, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .arg("--rpc")
        .arg(&d.rpc)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "flashpath {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}
