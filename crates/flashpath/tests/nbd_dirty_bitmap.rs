//! A disk's dirty bitmap served over NBD as `qemu:dirty-bitmap:NAME` (docs/nbd.md, docs/backup.md
//! "Over NBD"), read by the standard clients: `nbdinfo --map=qemu:dirty-bitmap:NAME --json`
//! (libnbd-bin) and `qemu-img map --output=json` with `x-dirty-bitmap` (qemu-utils) must report
//! exactly the chunks written as dirty and the rest clean. Also the refusals at
//! `nbd_start_disk` (an unknown bitmap, one of another size), a removal or clear while
//! exported (EBUSY), and the CLI's `--bitmap`.
//!
//! The tools are installed by `./run test`; outside CI, FLASHPATH_SKIP_NBD_TOOLS=1 skips these
//! tests when they are missing.

mod common;

use std::path::Path;
use std::process::Command;

use common::nbd::{tool_ok, unix_uri, Endpoint, NbdConn};
use common::Daemon;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;
const SIZE: u64 = 16 * MIB;
const GRANULARITY: u64 = 64 * KIB;

/// Whether nbdinfo and qemu-img are there (or the test is skipped, outside CI only).
fn tools_present() -> bool {
    common::tools_or_skip(
        &["nbdinfo", "qemu-img"],
        "nbdinfo or qemu-img is missing (Debian libnbd-bin, qemu-utils)",
        "FLASHPATH_SKIP_NBD_TOOLS",
    )
}

/// Extents as (offset, length, dirty), adjacent ones of one state merged (a server may
/// describe a run in pieces); they must cover the disk without gaps.
type Runs = Vec<(u64, u64, bool)>;

fn push_run(runs: &mut Runs, next: &mut u64, off: u64, len: u64, dirty: bool, out: &str) {
    assert_eq!(off, *next, "extents not contiguous: {out}");
    *next = off + len;
    match runs.last_mut() {
        Some(last) if last.2 == dirty => last.1 += len,
        _ => runs.push((off, len, dirty)),
    }
}

/// `nbdinfo --map=qemu:dirty-bitmap:NAME --json URI`: type 1 (NBD_STATE_DIRTY) is dirty.
fn nbdinfo_dirty(uri: &str, bitmap: &str) -> Runs {
    let out = tool_ok(
        Command::new("nbdinfo").arg(format!("--map=qemu:dirty-bitmap:{bitmap}")).args(["--json", uri]),
    );
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbdinfo --map --json: {e}: {out}"));
    let (mut runs, mut next) = (Vec::new(), 0);
    for e in v.as_array().expect("an array of extents") {
        let ty = e["type"].as_u64().unwrap();
        assert!(ty <= 1, "a qemu:dirty-bitmap extent of type {ty}: {out}");
        push_run(
            &mut runs,
            &mut next,
            e["offset"].as_u64().unwrap(),
            e["length"].as_u64().unwrap(),
            ty == 1,
            &out,
        );
    }
    assert_eq!(next, SIZE, "nbdinfo --map covers the disk: {out}");
    runs
}

/// `qemu-img map --output=json` over the export with `x-dirty-bitmap`: QEMU's NBD client then
/// reads the bitmap's context in place of `base:allocation`, its dirty flag (bit 0) standing
/// where the hole flag would, so a dirty extent shows `"data": false` and a clean one
/// `"data": true` (QEMU's docs/interop/nbd.rst and its iotests read it the same way).
fn qemu_img_dirty(sock: &Path, export: &str, bitmap: &str) -> Runs {
    let opts = format!(
        "driver=nbd,server.type=unix,server.path={},export={export},x-dirty-bitmap=qemu:dirty-bitmap:{bitmap}",
        sock.display()
    );
    let out = tool_ok(Command::new("qemu-img").args(["map", "--output=json", "--image-opts", &opts]));
    let v: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("qemu-img map --output=json: {e}: {out}"));
    let (mut runs, mut next) = (Vec::new(), 0);
    for e in v.as_array().expect("an array of extents") {
        assert_eq!(e["zero"], false, "a dirty bitmap never says zero: {out}");
        let data = e["data"].as_bool().unwrap();
        push_run(
            &mut runs,
            &mut next,
            e["start"].as_u64().unwrap(),
            e["length"].as_u64().unwrap(),
            !data,
            &out,
        );
    }
    assert_eq!(next, SIZE, "qemu-img map covers the disk: {out}");
    runs
}

/// The runs of a disk of SIZE whose dirty chunks are `dirty` (sorted, disjoint).
fn expected(dirty: &[(u64, u64)]) -> Runs {
    let (mut runs, mut at) = (Vec::new(), 0);
    for &(off, len) in dirty {
        if off > at {
            runs.push((at, off - at, false));
        }
        runs.push((off, len, true));
        at = off + len;
    }
    if at < SIZE {
        runs.push((at, SIZE - at, false));
    }
    runs
}

fn rpc_error(d: &Daemon, method: &str, params: Value) -> (i64, String) {
    let e = d.try_call(method, params.clone()).expect_err(&format!("{method} {params} must fail"));
    (e.code, e.message)
}

#[test]
fn nbdinfo_and_qemu_img_map_report_exactly_the_written_chunks_dirty() {
    if !tools_present() {
        return;
    }
    let daemon = Daemon::start("0");
    daemon.malloc("m", SIZE / 512, 512);
    daemon.call("bdev_dirty_bitmap_add", json!({ "bdev": "m", "name": "inc", "granularity": GRANULARITY }));
    let sock = daemon.dir.path().join("m.nbd");
    let device = sock.to_str().unwrap();
    daemon.call("nbd_start_disk", json!({ "bdev_name": "m", "nbd_device": device, "bitmaps": ["inc"] }));
    let uri = unix_uri("m", &sock);
    assert_eq!(nbdinfo_dirty(&uri, "inc"), expected(&[]), "a new bitmap is all clean");

    // Writes over the export itself: one inside a chunk, one across a chunk boundary, a
    // write-zeroes of two whole chunks, the disk's last block.
    let mut conn = NbdConn::connect(&Endpoint::Unix(sock.clone()), "m").expect("connect");
    assert_eq!(conn.write(MIB + 4 * KIB, &[0xa5; 4096], 0).unwrap(), 0);
    assert_eq!(conn.write(5 * MIB + 60 * KIB, &[0x5a; 8192], 0).unwrap(), 0);
    assert_eq!(conn.command(common::nbd::CMD_WRITE_ZEROES, 0, 9 * MIB, 128 * KIB as u32).unwrap(), 0);
    assert_eq!(conn.write(SIZE - 512, &[1; 512], 0).unwrap(), 0);
    conn.disconnect();
    let want = expected(&[
        (MIB, GRANULARITY),
        (5 * MIB, 2 * GRANULARITY),
        (9 * MIB, 2 * GRANULARITY),
        (SIZE - GRANULARITY, GRANULARITY),
    ]);
    assert_eq!(nbdinfo_dirty(&uri, "inc"), want, "nbdinfo --map=qemu:dirty-bitmap:inc");
    assert_eq!(qemu_img_dirty(&sock, "m", "inc"), want, "qemu-img map with x-dirty-bitmap");
    // The same bits as the RPC sees them.
    let rpc = daemon.call("bdev_dirty_bitmap_get_extents", json!({ "bdev": "m", "name": "inc" }));
    let rpc: Vec<(u64, u64)> = rpc["extents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(expected(&rpc), want, "bdev_dirty_bitmap_get_extents");

    // An exported bitmap is busy, as QEMU's: clearing it is refused, naming the export, and
    // changes nothing.
    let (code, message) =
        rpc_error(&daemon, "bdev_dirty_bitmap_clear", json!({ "bdev": "m", "name": "inc" }));
    assert_eq!(code, -16, "{message}");
    assert!(message.contains("'inc'") && message.contains(&format!("NBD export {device}")), "{message}");
    assert_eq!(nbdinfo_dirty(&uri, "inc"), want, "after a refused bdev_dirty_bitmap_clear");
    // A write shows at the next query: the export reads the live bits.
    let mut conn = NbdConn::connect(&Endpoint::Unix(sock.clone()), "m").expect("connect");
    assert_eq!(conn.write(12 * MIB, &[7; 512], 0).unwrap(), 0);
    conn.disconnect();
    let want = expected(&[
        (MIB, GRANULARITY),
        (5 * MIB, 2 * GRANULARITY),
        (9 * MIB, 2 * GRANULARITY),
        (12 * MIB, GRANULARITY),
        (SIZE - GRANULARITY, GRANULARITY),
    ]);
    assert_eq!(nbdinfo_dirty(&uri, "inc"), want, "a write after the export started");
    assert_eq!(daemon.call("nbd_stop_disk", json!({ "nbd_device": device })), true);
    // Stopped: the clear works.
    daemon.call("bdev_dirty_bitmap_clear", json!({ "bdev": "m", "name": "inc" }));
    let rpc = daemon.call("bdev_dirty_bitmap_get_extents", json!({ "bdev": "m", "name": "inc" }));
    assert_eq!(rpc["extents"], json!([]));
}

#[test]
fn bad_bitmaps_are_refused_at_start_and_an_exported_bitmap_cannot_be_removed() {
    if !tools_present() {
        return;
    }
    let daemon = Daemon::start("0");
    daemon.malloc("m", SIZE / 512, 512);
    daemon.malloc("half", SIZE / 1024, 512);
    daemon.malloc("twin", SIZE / 512, 512);
    for (bdev, name) in [("m", "b"), ("half", "b"), ("twin", "t")] {
        daemon.call("bdev_dirty_bitmap_add", json!({ "bdev": bdev, "name": name }));
    }
    let sock = daemon.dir.path().join("m.nbd");
    let device = sock.to_str().unwrap();
    let start = |bitmaps: Value| json!({ "bdev_name": "m", "nbd_device": device, "bitmaps": bitmaps });

    let (code, message) = rpc_error(&daemon, "nbd_start_disk", start(json!(["nope"])));
    assert_eq!(code, -32602, "{message}");
    assert!(message.contains("bitmaps") && message.contains("nope"), "{message}");
    let (code, message) =
        rpc_error(&daemon, "nbd_start_disk", start(json!([{ "bdev": "half", "name": "b" }])));
    assert_eq!(code, -32602, "{message}");
    assert!(message.contains("bitmaps") && message.contains(&(SIZE / 2).to_string()), "{message}");
    assert_eq!(daemon.call("nbd_get_disks", json!({})), json!([]), "a refused start leaves nothing");
    assert_eq!(daemon.call("bdev_get_bdevs", json!({ "name": "m" }))[0]["claimed"], false);

    // The CLI: a bitmap of the disk and one of another bdev of its size; both are served.
    let out = Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .arg("--rpc")
        .arg(&daemon.rpc)
        .args(["nbd", "start", "m", device, "--bitmap", "b", "--bitmap", "twin/t"])
        .output()
        .unwrap();
    assert!(out.status.success(), "flashpath nbd start --bitmap: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(daemon.call("nbd_get_disks", json!({}))[0]["bitmaps"], json!(["b", "t"]));
    let uri = unix_uri("m", &sock);
    assert_eq!(nbdinfo_dirty(&uri, "t"), expected(&[]));
    let list = tool_ok(Command::new("nbdinfo").args(["--list", "--json", &uri]));
    assert!(
        list.contains("qemu:dirty-bitmap:b")
            && list.contains("qemu:dirty-bitmap:t")
            && list.contains("base:allocation"),
        "nbdinfo --list shows every context: {list}"
    );

    // Exported bitmaps are busy: removal is refused until the export stops.
    for (bdev, name) in [("m", "b"), ("twin", "t")] {
        let listed = daemon.call("bdev_dirty_bitmap_list", json!({ "bdev": bdev }));
        assert_eq!(listed[0]["busy"], true, "{listed}");
        let (code, message) =
            rpc_error(&daemon, "bdev_dirty_bitmap_remove", json!({ "bdev": bdev, "name": name }));
        assert_eq!(code, -16, "{message}");
        assert!(message.contains("busy"), "{message}");
    }
    assert_eq!(daemon.call("nbd_stop_disk", json!({ "nbd_device": device })), true);
    for (bdev, name) in [("m", "b"), ("twin", "t")] {
        assert_eq!(daemon.call("bdev_dirty_bitmap_list", json!({ "bdev": bdev }))[0]["busy"], false);
        assert_eq!(daemon.call("bdev_dirty_bitmap_remove", json!({ "bdev": bdev, "name": name })), true);
    }
}
