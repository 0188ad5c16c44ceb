//! The NBD export (issue 14) against the real tools: qemu-img convert/compare/info into and out
//! of an export, nbdinfo (size, flags, block sizes, `--map` of a sparse file and of a thin
//! volume), nbdcopy with four connections, nbdsh scripts of protocol cases (libnbd's strict
//! checks off where the server's own answer is under test), Unix and TCP listeners shared by
//! several exports, read-only exports, TLS with a CA made at test time, the RPCs' refusals, and
//! a disk that a read-only vhost-user-blk controller and a read-only NBD export serve together.
//!
//! The tools come from libnbd-bin, python3-libnbd (nbdsh), nbdkit, qemu-utils and gnutls-bin
//! (certtool); `./run test` installs them.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::nbd::{
    free_port, greet, nbdinfo_map, nbdsh_ok, random_file, read_opt_reply, run_tool, send_option,
    start_export, tool_ok, unix_uri, Endpoint, NbdConn, Sock, TestPki, OPT_GO, OPT_LIST, REP_ERR_TLS_REQD,
};
use common::{assert_same, bounded, pattern, BlkClient, ClientOpts, Daemon};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
/// nbdinfo's extent types: data, and a hole that reads as zeroes.
const DATA: u64 = 0;
const HOLE_ZERO: u64 = 3;

fn qemu_img(args: &[&str]) -> std::process::Output {
    run_tool(Command::new("qemu-img").args(args))
}

/// The export `name`'s entry in `nbd_get_disks`.
fn disk_entry(daemon: &Daemon, device: &str) -> Value {
    let disks = daemon.call("nbd_get_disks", json!({"nbd_device": device}));
    let list = disks.as_array().unwrap_or_else(|| panic!("nbd_get_disks returns an array: {disks}"));
    assert_eq!(list.len(), 1, "nbd_get_disks {{nbd_device: {device}}}: {disks}");
    list[0].clone()
}

#[test]
fn qemu_img_convert_compare_and_info_into_and_out_of_a_unix_export() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 16 * MIB / 512, 512);
    let sock = daemon.dir.path().join("m.nbd");
    let device = start_export(&daemon, "m", sock.to_str().unwrap(), false);
    let uri = unix_uri("m", &sock);
    let src = daemon.dir.path().join("src.raw");
    let data = random_file(&src, 14, (16 * MIB) as usize);
    let s = src.to_str().unwrap();

    let out = qemu_img(&["convert", "-n", "-f", "raw", "-O", "raw", s, &uri]);
    assert!(
        out.status.success(),
        "qemu-img convert into the export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (a, fa, b, fb) in [(s, "raw", uri.as_str(), "raw"), (uri.as_str(), "raw", s, "raw")] {
        let out = qemu_img(&["compare", "-f", fa, "-F", fb, a, b]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "qemu-img compare {a} {b}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // compare reads the export for real: one byte changed in the file is found, in the
    // sector-aligned piece that holds it (qemu-img names where that piece starts).
    let mut changed = data.clone();
    let at = 5 * MIB + 123;
    changed[at as usize] ^= 0x5a;
    let other = daemon.dir.path().join("changed.raw");
    std::fs::write(&other, &changed).unwrap();
    let out = qemu_img(&["compare", "-f", "raw", "-F", "raw", other.to_str().unwrap(), &uri]);
    assert_eq!(out.status.code(), Some(1), "qemu-img compare of different contents: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reported: u64 = stdout
        .trim()
        .strip_prefix("Content mismatch at offset ")
        .and_then(|r| r.trim_end_matches('!').parse().ok())
        .unwrap_or_else(|| panic!("qemu-img compare's mismatch line: {stdout}"));
    assert!(
        reported <= at && at - reported < 2 * MIB,
        "mismatch reported at {reported}, the byte is at {at}"
    );

    let back = daemon.dir.path().join("back.raw");
    let out = qemu_img(&["convert", "-f", "raw", "-O", "raw", &uri, back.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "qemu-img convert out of the export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same("qemu-img convert out of the export", 0, &std::fs::read(&back).unwrap(), &data);

    let info: Value =
        serde_json::from_str(&tool_ok(Command::new("qemu-img").args(["info", "--output=json", &uri])))
            .expect("qemu-img info --output=json");
    assert_eq!(info["virtual-size"], json!(16 * MIB), "{info}");

    // The data is on the disk itself: after the export stops, a vhost-user-blk client reads it.
    assert_eq!(daemon.call("nbd_stop_disk", json!({"nbd_device": device})), json!(true));
    assert!(!sock.exists(), "nbd_stop_disk left its socket behind");
    let vhost = daemon.controller("vhost.0", "m", Some(1), false);
    let got = bounded(Duration::from_secs(60), "blkio read-back", move || {
        BlkClient::open(&vhost, 1).read_all(0, (16 * MIB) as usize)
    });
    assert_same("the disk after qemu-img convert", 0, &got, &data);
    daemon.assert_alive();
}

#[test]
fn nbdinfo_over_tcp_reports_size_flags_and_block_sizes() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m4k", 2048, 4096); // 8 MiB of 4 KiB blocks
    daemon.malloc("m512", 1000, 512);
    let port = free_port();
    let tcp = format!("nbd://127.0.0.1:{port}/big");
    start_export(&daemon, "m4k", &tcp, false);
    let sock = daemon.dir.path().join("ro.nbd");
    start_export(&daemon, "m512", sock.to_str().unwrap(), true);

    for (uri, size, min, ro) in
        [(tcp.clone(), 8 * MIB, 4096, false), (unix_uri("m512", &sock), 512_000, 512, true)]
    {
        let out = tool_ok(Command::new("nbdinfo").args(["--json", "--no-content", &uri]));
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbdinfo --json: {e}: {out}"));
        assert_eq!(v["protocol"], "newstyle-fixed", "{v}");
        assert_eq!(v["structured"], true, "{v}");
        assert_eq!(v["TLS"], false, "{v}");
        let e = &v["exports"][0];
        assert_eq!(e["export-size"], json!(size), "{uri}: {e}");
        assert_eq!(e["is_read_only"], json!(ro), "{uri}: {e}");
        for flag in ["can_flush", "can_fua", "can_multi_conn", "can_cache"] {
            assert_eq!(e[flag], true, "{uri}: {flag}: {e}");
        }
        // Write-type commands are not offered on a read-only export.
        for flag in ["can_trim", "can_zero", "can_fast_zero"] {
            assert_eq!(e[flag], json!(!ro), "{uri}: {flag}: {e}");
        }
        assert_eq!(e["block_size_minimum"], json!(min), "{uri}: {e}");
        assert_eq!(e["block_size_preferred"], json!(4096), "{uri}: {e}");
        assert_eq!(e["block_size_maximum"], json!(32 * MIB), "{uri}: {e}");
        assert!(
            e["contexts"].as_array().is_some_and(|c| c.contains(&json!("base:allocation"))),
            "{uri}: base:allocation among the meta contexts: {e}"
        );
        assert_eq!(tool_ok(Command::new("nbdinfo").args(["--size", &uri])).trim(), size.to_string());
    }
    let entry = disk_entry(&daemon, &tcp);
    assert_eq!(entry["bdev_name"], "m4k", "{entry}");
    assert_eq!(entry["export_name"], "big", "{entry}");
    assert_eq!(entry["readonly"], false, "{entry}");
    assert_eq!(entry["tls"], false, "{entry}");
    let entry = disk_entry(&daemon, sock.to_str().unwrap());
    assert_eq!(
        (entry["bdev_name"].as_str(), entry["export_name"].as_str()),
        (Some("m512"), Some("m512")),
        "{entry}"
    );
    assert_eq!(entry["readonly"], true, "{entry}");
    daemon.assert_alive();
}

#[test]
fn nbdinfo_map_of_a_sparse_file_follows_its_holes() {
    let mut daemon = Daemon::start("0");
    let file = daemon.backing_file("sparse.img", 16 * MIB);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&pattern(1, MIB, MIB as usize), MIB).unwrap();
        f.write_all_at(&pattern(2, 8 * MIB, 64 << 10), 8 * MIB).unwrap();
        f.sync_all().unwrap();
    }
    daemon.uring("u", &file, None);
    let sock = daemon.dir.path().join("u.nbd");
    start_export(&daemon, "u", sock.to_str().unwrap(), false);
    let uri = unix_uri("u", &sock);
    let k64 = 64 << 10;
    assert_eq!(
        nbdinfo_map(&uri),
        vec![
            (0, MIB, HOLE_ZERO),
            (MIB, MIB, DATA),
            (2 * MIB, 6 * MIB, HOLE_ZERO),
            (8 * MIB, k64, DATA),
            (8 * MIB + k64, 8 * MIB - k64, HOLE_ZERO),
        ],
        "nbdinfo --map of the sparse file"
    );
    // A write into a hole makes data; a trim punches a hole again.
    nbdsh_ok(
        "import os\nh.connect_uri(os.environ['URI'])\nh.pwrite(b'\\x77' * 4096, 12 << 20)\n\
         h.trim(1 << 20, 1 << 20)\nh.flush()\nassert h.pread(4096, 1 << 20) == bytes(4096)\nprint('OK')\n",
        &[("URI", &uri)],
    );
    assert_eq!(
        nbdinfo_map(&uri),
        vec![
            (0, 8 * MIB, HOLE_ZERO),
            (8 * MIB, k64, DATA),
            (8 * MIB + k64, 4 * MIB - k64, HOLE_ZERO),
            (12 * MIB, 4096, DATA),
            (12 * MIB + 4096, 4 * MIB - 4096, HOLE_ZERO),
        ],
        "nbdinfo --map after a write into a hole and a trim"
    );
    daemon.assert_alive();
}

#[test]
fn nbdinfo_map_of_a_thin_volume_shows_its_clusters_and_its_ancestors() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m0", 64 * MIB / 512, 512);
    daemon.call("bdev_lvol_create_lvstore", json!({"bdev_name": "m0", "lvs_name": "lvs", "cluster_sz": MIB}));
    daemon.call(
        "bdev_lvol_create",
        json!({"lvs_name": "lvs", "lvol_name": "v", "size_in_mib": 16, "thin_provision": true}),
    );
    let sock = daemon.dir.path().join("v.nbd");
    let dev_v = format!("nbd+unix:///thin?socket={}", sock.display());
    start_export(&daemon, "lvs/v", &dev_v, false);
    let uri = unix_uri("thin", &sock);
    assert_eq!(nbdinfo_map(&uri), vec![(0, 16 * MIB, HOLE_ZERO)], "a new thin volume is one hole");
    // One 4 KiB block in each of clusters 0, 3 and 4 (at different places in each).
    nbdsh_ok(
        "import os\nh.connect_uri(os.environ['URI'])\nfor off in (0, (3 << 20) + 8192, (5 << 20) - 4096):\n    \
         h.pwrite(b'\\x42' * 4096, off)\nh.flush()\nprint('OK')\n",
        &[("URI", &uri)],
    );
    let written = vec![
        (0, MIB, DATA),
        (MIB, 2 * MIB, HOLE_ZERO),
        (3 * MIB, 2 * MIB, DATA),
        (5 * MIB, 11 * MIB, HOLE_ZERO),
    ];
    assert_eq!(nbdinfo_map(&uri), written, "the thin volume after writes in clusters 0, 3 and 4");
    assert_eq!(daemon.call("nbd_stop_disk", json!({"nbd_device": dev_v})), json!(true));

    // A snapshot holds those clusters; a clone of it sees them as data, plus its own.
    daemon.call("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s"}));
    daemon.call("bdev_lvol_clone", json!({"snapshot_name": "lvs/s", "clone_name": "c"}));
    let dev_c = format!("nbd+unix:///c?socket={}", sock.display());
    let dev_s = format!("nbd+unix:///s?socket={}", sock.display());
    start_export(&daemon, "lvs/c", &dev_c, false);
    start_export(&daemon, "lvs/s", &dev_s, true);
    let uri_c = unix_uri("c", &sock);
    nbdsh_ok(
        "import os\nh.connect_uri(os.environ['URI'])\nh.pwrite(b'\\x43' * 4096, 6 << 20)\nh.flush()\nprint('OK')\n",
        &[("URI", &uri_c)],
    );
    assert_eq!(nbdinfo_map(&unix_uri("s", &sock)), written, "the snapshot's map");
    assert_eq!(
        nbdinfo_map(&uri_c),
        vec![
            (0, MIB, DATA),
            (MIB, 2 * MIB, HOLE_ZERO),
            (3 * MIB, 2 * MIB, DATA),
            (5 * MIB, MIB, HOLE_ZERO),
            (6 * MIB, MIB, DATA),
            (7 * MIB, 9 * MIB, HOLE_ZERO),
        ],
        "the clone's map: its snapshot's clusters and its own"
    );
    // A snapshot exported writable is still read-only, and says so in the handshake.
    assert_eq!(daemon.call("nbd_stop_disk", json!({"nbd_device": dev_s})), json!(true));
    start_export(&daemon, "lvs/s", &dev_s, false);
    let out = nbdsh_ok(
        "import os\nh.connect_uri(os.environ['URI'])\nprint('RO', h.is_read_only())\nprint('OK')\n",
        &[("URI", &unix_uri("s", &sock))],
    );
    assert!(out.contains("RO True"), "a snapshot's export is advertised read-only: {out}");
    daemon.assert_alive();
}

#[test]
fn nbdcopy_with_four_connections_into_and_out_of_an_export() {
    let mut daemon = Daemon::start("0-1");
    daemon.malloc("m", 32 * MIB / 512, 512);
    let sock = daemon.dir.path().join("m.nbd");
    let device = start_export(&daemon, "m", sock.to_str().unwrap(), false);
    let uri = unix_uri("m", &sock);

    // The export starts full of a pattern, so zeroes that nbdcopy skipped would show.
    let garbage = daemon.dir.path().join("garbage.raw");
    std::fs::write(&garbage, pattern(9, 0, (32 * MIB) as usize)).unwrap();
    tool_ok(Command::new("nbdcopy").arg(&garbage).arg(&uri));
    // The source: random data with a 4 MiB hole, which nbdcopy sends as zeroing requests.
    let src = daemon.dir.path().join("src.raw");
    let mut data = random_file(&src, 77, (32 * MIB) as usize);
    data[(8 * MIB) as usize..(12 * MIB) as usize].fill(0);
    {
        let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
        f.set_len(8 * MIB).unwrap();
        f.set_len(12 * MIB).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&data[(12 * MIB) as usize..], 12 * MIB).unwrap();
    }
    for (from, to) in [
        (src.to_str().unwrap().to_string(), uri.clone()),
        (uri.clone(), {
            let p = daemon.dir.path().join("back.raw");
            p.to_str().unwrap().to_string()
        }),
    ] {
        let out = run_tool(Command::new("nbdcopy").args([
            "--connections=4",
            "--threads=4",
            "--verbose",
            &from,
            &to,
        ]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "nbdcopy {from} {to}: {}",
            stderr.lines().filter(|l| !l.starts_with("libnbd: debug")).collect::<Vec<_>>().join("\n")
        );
        // nbdcopy only opens several connections to a server that offers multi-conn.
        assert!(
            stderr.lines().any(|l| l.starts_with("nbdcopy: connections=4 ")),
            "nbdcopy did not use 4 connections: {}",
            stderr.lines().filter(|l| l.starts_with("nbdcopy:")).collect::<Vec<_>>().join("\n")
        );
    }
    assert_same(
        "nbdcopy out of the export",
        0,
        &std::fs::read(daemon.dir.path().join("back.raw")).unwrap(),
        &data,
    );

    // nbd_get_disks counts the connections open now.
    let ep = Endpoint::Unix(sock.clone());
    let conns: Vec<NbdConn> = (0..3).map(|_| NbdConn::connect(&ep, "m").expect("connect")).collect();
    assert!(conns.iter().all(|c| c.flags & common::nbd::TF_CAN_MULTI_CONN != 0));
    // The count follows the reactors' pollers, which take a connection up a moment after its
    // handshake: wait for it.
    let connections_become = |n: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while disk_entry(&daemon, &device)["connections"] != json!(n) {
            assert!(
                std::time::Instant::now() < deadline,
                "connections not {n}: {}",
                disk_entry(&daemon, &device)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    connections_become(3);
    for c in conns {
        c.disconnect();
    }
    connections_become(0);
    daemon.assert_alive();
}

/// The nbdsh script of protocol cases on a writable 64 MiB RAM disk of 512-byte blocks.
const PROTOCOL_CASES: &str = r#"
import errno, os
uri = os.environ['URI']
size = 64 << 20
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
assert h.get_size() == size, h.get_size()
assert h.get_structured_replies_negotiated()
assert not h.is_read_only()
for f in ('can_flush', 'can_fua', 'can_trim', 'can_zero', 'can_fast_zero', 'can_cache', 'can_multi_conn'):
    assert getattr(h, f)(), f
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
assert h.get_block_size(nbd.SIZE_MINIMUM) == 512, h.get_block_size(nbd.SIZE_MINIMUM)
assert h.get_block_size(nbd.SIZE_PREFERRED) == 4096, h.get_block_size(nbd.SIZE_PREFERRED)
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 << 20, h.get_block_size(nbd.SIZE_MAXIMUM)

base = 1 << 20
data = bytes((i * 7 + i // 4096) & 0xff for i in range(65536))
h.pwrite(data, base, nbd.CMD_FLAG_FUA)
assert h.pread(65536, base) == data
h.flush()
# Write zeroes without a hole: exactly the range reads zeroes.
h.zero(8192, base + 4096, nbd.CMD_FLAG_NO_HOLE)
want = data[:4096] + bytes(8192) + data[12288:]
assert h.pread(65536, base) == want
# FAST_ZERO: done at once, or refused with ENOTSUP and nothing changed.
try:
    h.zero(4096, base + 32768, nbd.CMD_FLAG_FAST_ZERO)
    want = want[:32768] + bytes(4096) + want[36864:]
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, e
assert h.pread(65536, base) == want
# A RAM disk reads zeroes where it was trimmed.
h.trim(4096, base + 49152)
want = want[:49152] + bytes(4096) + want[53248:]
assert h.pread(65536, base) == want
h.cache(65536, base)
# A big read and write at the largest size the server offers.
big = bytes(range(256)) * (128 * 1024)
h.pwrite(big, 16 << 20)
assert h.pread(len(big), 16 << 20) == big

# base:allocation of a RAM disk: all data; the last extent may reach past the range asked for
# (the protocol allows it), not past the end.
seen = []
def extents(ctx, off, entries, err):
    seen.append((ctx, off, list(entries)))
h.block_status(1 << 20, 4096, extents)
assert len(seen) == 1 and seen[0][0] == nbd.CONTEXT_BASE_ALLOCATION and seen[0][1] == 4096, seen
e = seen[0][2]
assert len(e) >= 2 and all(f == 0 for f in e[1::2]) and 0 < sum(e[0::2]) <= size - 4096, e
seen.clear()
h.block_status(1 << 20, 4096, extents, nbd.CMD_FLAG_REQ_ONE)
assert len(seen[0][2]) == 2 and seen[0][2][1] == 0 and 0 < seen[0][2][0] <= 1 << 20, seen
seen.clear()
h.block_status(4096, size - 4096, extents)
assert 0 < sum(seen[0][2][0::2]) <= 4096, seen

# The server's own checks, with libnbd's strict checks off: EINVAL, and the connection goes on.
h.set_strict_mode(0)
def fails(errnums, f, *args):
    try:
        f(*args)
    except nbd.Error as e:
        assert e.errnum in errnums, (f.__name__, args[1:], e)
        return
    raise AssertionError('%s%r succeeded' % (f.__name__, args[1:]))
# The contract says EINVAL; the NBD protocol recommends ENOSPC for writes past the end.
einval, past_end_write = (errno.EINVAL,), (errno.EINVAL, errno.ENOSPC)
fails(einval, h.pread, 1024, size - 512)
fails(einval, h.pread, 512, size)
fails(einval, h.pread, 512, 100)
fails(einval, h.pread, 100, 0)
fails(past_end_write, h.pwrite, b'x' * 1024, size - 512)
fails(einval, h.pwrite, b'x' * 512, 256)
fails(past_end_write, h.zero, 1024, size - 512)
fails(past_end_write, h.trim, 1024, size - 512)
fails(einval, h.cache, 1024, size - 512)
assert h.pread(65536, base) == want
assert h.pread(512, size - 512) == bytes(512)
h.shutdown()

# Option mode: list, info and go by hand.
g = nbd.NBD()
g.set_opt_mode(True)
g.set_full_info(True)
g.connect_uri(uri)
names = []
assert g.opt_list(lambda name, desc: names.append(name)) == 1
assert names == [os.environ['NAME']], names
contexts = []
g.opt_list_meta_context(lambda name: contexts.append(name))
assert nbd.CONTEXT_BASE_ALLOCATION in contexts, contexts
g.set_export_name('no-such-export')
try:
    g.opt_info()
    raise AssertionError('opt_info of a missing export succeeded')
except nbd.Error:
    pass
g.set_export_name(os.environ['NAME'])
g.opt_info()
assert g.get_size() == size and g.get_canonical_export_name() == os.environ['NAME']
assert g.get_block_size(nbd.SIZE_MINIMUM) == 512
g.opt_go()
assert g.aio_is_ready()
assert g.pread(65536, base) == want
g.shutdown()
a = nbd.NBD()
a.set_opt_mode(True)
a.connect_uri(uri)
a.opt_abort()
assert a.aio_is_closed()
print('OK')
"#;

#[test]
fn nbdsh_protocol_cases_on_unix_and_tcp() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 64 * MIB / 512, 512);
    daemon.malloc("t", 64 * MIB / 512, 512);
    let sock = daemon.dir.path().join("m.nbd");
    start_export(&daemon, "m", sock.to_str().unwrap(), false);
    let port = free_port();
    start_export(&daemon, "t", &format!("nbd://127.0.0.1:{port}"), false);
    nbdsh_ok(PROTOCOL_CASES, &[("URI", &unix_uri("m", &sock)), ("NAME", "m")]);
    // Over TCP, the export's name defaults to the bdev's.
    nbdsh_ok(PROTOCOL_CASES, &[("URI", &format!("nbd://127.0.0.1:{port}/t")), ("NAME", "t")]);
    daemon.assert_alive();
}

#[test]
fn several_exports_share_a_listener_and_the_empty_name_needs_a_single_one() {
    let mut daemon = Daemon::start("0");
    for name in ["a", "b", "c", "d"] {
        daemon.malloc(name, 4 * MIB / 512, 512);
    }
    let shared = daemon.dir.path().join("shared.nbd");
    let single = daemon.dir.path().join("single.nbd");
    let port = free_port();
    start_export(&daemon, "a", &format!("nbd+unix:///a?socket={}", shared.display()), false);
    start_export(&daemon, "b", &format!("nbd+unix:///bee?socket={}", shared.display()), true);
    start_export(&daemon, "c", single.to_str().unwrap(), false);
    start_export(&daemon, "d", &format!("nbd://127.0.0.1:{port}/d1"), false);
    // A read-only export of a bdev that a writable export claims is refused.
    let dev = format!("nbd://127.0.0.1:{port}/d2");
    let e = daemon
        .try_call("nbd_start_disk", json!({"bdev_name": "a", "nbd_device": dev, "readonly": true}))
        .expect_err("a read-only export of a bdev claimed by a writable export");
    assert!(e.message.contains("in use"), "{e:?}");

    let script = r#"
import os
def listing(uri):
    g = nbd.NBD()
    g.set_opt_mode(True)
    g.connect_uri(uri)
    names = []
    g.opt_list(lambda name, desc: names.append(name))
    g.set_export_name('')
    try:
        g.opt_go()
        empty = g.get_size()
    except nbd.Error:
        empty = None
    return sorted(names), empty
assert listing(os.environ['SHARED']) == (['a', 'bee'], None), listing(os.environ['SHARED'])
assert listing(os.environ['SINGLE']) == (['c'], 4 << 20), listing(os.environ['SINGLE'])
assert listing(os.environ['TCP']) == (['d1'], 4 << 20), listing(os.environ['TCP'])
# The exports behind one listener are different disks.
a = nbd.NBD(); a.connect_uri(os.environ['A'])
b = nbd.NBD(); b.connect_uri(os.environ['B'])
assert not a.is_read_only() and b.is_read_only()
a.pwrite(b'\xaa' * 4096, 0)
assert a.pread(4096, 0) == b'\xaa' * 4096
assert b.pread(4096, 0) == bytes(4096)
print('OK')
"#;
    let shared_uri = format!("nbd+unix://?socket={}", shared.display());
    let single_uri = format!("nbd+unix://?socket={}", single.display());
    let tcp_uri = format!("nbd://127.0.0.1:{port}");
    nbdsh_ok(
        script,
        &[
            ("SHARED", &shared_uri),
            ("SINGLE", &single_uri),
            ("TCP", &tcp_uri),
            ("A", &unix_uri("a", &shared)),
            ("B", &unix_uri("bee", &shared)),
        ],
    );
    // Stopping one export leaves the other on the shared listener.
    let dev_a = format!("nbd+unix:///a?socket={}", shared.display());
    assert_eq!(daemon.call("nbd_stop_disk", json!({"nbd_device": dev_a})), json!(true));
    assert!(shared.exists(), "the shared listener went away with one of its exports");
    assert_eq!(
        tool_ok(Command::new("nbdinfo").args(["--size", &unix_uri("bee", &shared)])).trim(),
        (4 * MIB).to_string()
    );
    let out = run_tool(Command::new("nbdinfo").args(["--size", &unix_uri("a", &shared)]));
    assert!(!out.status.success(), "a stopped export is still served");
    let disks = daemon.call("nbd_get_disks", Value::Null);
    assert_eq!(disks.as_array().map(Vec::len), Some(3), "{disks}");
    daemon.assert_alive();
}

#[test]
fn a_readonly_export_refuses_writes_with_eperm_and_keeps_its_data() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 4 * MIB / 512, 512);
    let sock = daemon.dir.path().join("w.nbd");
    let dev = start_export(&daemon, "m", sock.to_str().unwrap(), false);
    let data = pattern(3, 0, 1 << 20);
    let ep = Endpoint::Unix(sock.clone());
    let mut c = NbdConn::connect(&ep, "m").unwrap();
    assert_eq!(c.write(0, &data, 0).unwrap(), 0);
    c.disconnect();
    daemon.call("nbd_stop_disk", json!({"nbd_device": dev}));
    start_export(&daemon, "m", sock.to_str().unwrap(), true);
    let script = r#"
import errno, os
h.connect_uri(os.environ['URI'])
assert h.is_read_only()
want = h.pread(1 << 20, 0)
h.set_strict_mode(0)
for name, f, args in (('pwrite', h.pwrite, (b'\xff' * 4096, 0)), ('zero', h.zero, (4096, 0)), ('trim', h.trim, (4096, 0)),
                      ('pwrite FUA', h.pwrite, (b'\xff' * 4096, 8192, nbd.CMD_FLAG_FUA))):
    try:
        f(*args)
        raise AssertionError(name + ' succeeded on a read-only export')
    except nbd.Error as e:
        assert e.errnum == errno.EPERM, (name, e)
assert h.pread(1 << 20, 0) == want
h.flush()
print(want.hex()[:64])
print('OK')
"#;
    let out = nbdsh_ok(script, &[("URI", &unix_uri("m", &sock))]);
    assert!(out.starts_with(&hex(&data[..32])), "the read-only export reads what was written: {out}");
    // The same refusals from the test's own client, and the data still there.
    let mut c = NbdConn::connect(&ep, "m").unwrap();
    assert!(c.flags & common::nbd::TF_READ_ONLY != 0, "flags {:#x} without READ_ONLY", c.flags);
    assert_eq!(c.write(0, &[0xff; 4096], 0).unwrap(), common::nbd::EPERM);
    assert_eq!(c.command(common::nbd::CMD_WRITE_ZEROES, 0, 0, 4096).unwrap(), common::nbd::EPERM);
    assert_eq!(c.command(common::nbd::CMD_TRIM, 0, 0, 4096).unwrap(), common::nbd::EPERM);
    assert_same("read-only export", 0, &c.read(0, 1 << 20).unwrap().unwrap(), &data);
    c.disconnect();
    daemon.assert_alive();
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// qemu-img's `json:` filename of an NBD export over TCP with TLS credentials `tls0`, in a raw
/// format layer (so that `-f raw`/`-F raw`/`-O raw` find the protocol layer they expect).
fn tls_json(port: u16, name: &str) -> String {
    format!(
        r#"json:{{"driver":"raw","file":{{"driver":"nbd","server":{{"type":"inet","host":"127.0.0.1","port":"{port}"}},"export":"{name}","tls-creds":"tls0"}}}}"#
    )
}

fn tls_object(dir: &Path) -> String {
    format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", dir.display())
}

#[test]
fn qemu_img_over_tls_with_a_test_ca_and_plaintext_clients_refused() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 8 * MIB / 512, 512);
    daemon.malloc("v", 8 * MIB / 512, 512);
    let pki = TestPki::create(&daemon.dir.path().join("pki"));
    let port = free_port();
    let dev = format!("nbd://127.0.0.1:{port}/m");
    let r = daemon.call(
        "nbd_start_disk",
        json!({"bdev_name": "m", "nbd_device": dev, "tls_cert": pki.server_cert, "tls_key": pki.server_key}),
    );
    assert_eq!(r, json!(dev));
    assert_eq!(disk_entry(&daemon, &dev)["tls"], true);

    let src = daemon.dir.path().join("src.raw");
    let data = random_file(&src, 21, (8 * MIB) as usize);
    let obj = tls_object(&pki.client_dir);
    let target = tls_json(port, "m");
    let s = src.to_str().unwrap();
    let ok = |args: &[&str]| tool_ok(Command::new("qemu-img").args(args));
    ok(&["convert", "--object", &obj, "-n", "-f", "raw", "-O", "raw", s, &target]);
    ok(&["compare", "--object", &obj, "-f", "raw", "-F", "raw", s, &target]);
    let back = daemon.dir.path().join("back.raw");
    ok(&["convert", "--object", &obj, "-O", "raw", &target, back.to_str().unwrap()]);
    assert_same("qemu-img convert out over TLS", 0, &std::fs::read(&back).unwrap(), &data);
    let info: Value =
        serde_json::from_str(&ok(&["info", "--object", &obj, "--output=json", &target])).unwrap();
    assert_eq!(info["virtual-size"], json!(8 * MIB));
    // libnbd over TLS too.
    let nbds = format!("nbds://127.0.0.1:{port}/m?tls-certificates={}", pki.client_dir.display());
    assert_eq!(tool_ok(Command::new("nbdinfo").args(["--size", &nbds])).trim(), (8 * MIB).to_string());

    // Without TLS: refused by qemu-img, by nbdinfo, and option by option (TLS_REQD).
    let plain = format!("nbd://127.0.0.1:{port}/m");
    let out = qemu_img(&["info", &plain]);
    assert!(!out.status.success(), "qemu-img info without TLS on a TLS export succeeded");
    let out = run_tool(Command::new("nbdinfo").args(["--size", &plain]));
    assert!(!out.status.success(), "nbdinfo without TLS succeeded");
    assert!(String::from_utf8_lossy(&out.stderr).contains("TLS"), "{}", String::from_utf8_lossy(&out.stderr));
    let ep = Endpoint::Tcp(format!("127.0.0.1:{port}").parse().unwrap());
    let mut raw = Sock::connect(&ep).unwrap();
    greet(&mut raw).unwrap();
    for (opt, data) in [(OPT_LIST, Vec::new()), (OPT_GO, common::nbd::go_data("m", &[]))] {
        send_option(&mut raw, opt, &data).unwrap();
        let r = read_opt_reply(&mut raw).unwrap();
        assert_eq!((r.option, r.kind), (opt, REP_ERR_TLS_REQD), "option {opt} before STARTTLS: {r:?}");
    }
    drop(raw);

    // With tls_ca, a client must show a certificate that CA signed.
    let port2 = free_port();
    let dev2 = format!("nbd://127.0.0.1:{port2}/v");
    daemon.call(
        "nbd_start_disk",
        json!({"bdev_name": "v", "nbd_device": dev2, "tls_cert": pki.server_cert, "tls_key": pki.server_key,
               "tls_ca": pki.ca_cert}),
    );
    let target2 = tls_json(port2, "v");
    let info: Value =
        serde_json::from_str(&ok(&["info", "--object", &obj, "--output=json", &target2])).unwrap();
    assert_eq!(info["virtual-size"], json!(8 * MIB));
    for (dir, what) in [
        (&pki.client_nocert_dir, "no client certificate"),
        (&pki.client_foreign_dir, "a certificate of another CA"),
    ] {
        let out = qemu_img(&["info", "--object", &tls_object(dir), &target2]);
        assert!(!out.status.success(), "qemu-img with {what} was let in");
    }
    // The first export still serves, and so does the daemon.
    ok(&["compare", "--object", &obj, "-f", "raw", "-F", "raw", s, &target]);
    daemon.assert_alive();
}

#[test]
fn the_rpcs_refuse_bad_input_naming_the_field_and_change_nothing() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 2048, 512);
    let port = free_port();
    let sock = daemon.dir.path().join("ok.nbd");
    start_export(&daemon, "m", sock.to_str().unwrap(), true);
    let before = daemon.call("nbd_get_disks", Value::Null);
    assert_eq!(before.as_array().map(Vec::len), Some(1), "{before}");
    let entry = &before[0];
    assert_eq!(entry["nbd_device"], json!(sock), "{entry}");
    assert_eq!(entry["connections"], json!(0), "{entry}");

    let refused = |params: Value, field: &str| {
        let e = daemon.try_call("nbd_start_disk", params.clone()).expect_err("refused");
        assert_eq!(e.code, -32602, "nbd_start_disk {params}: {e:?}");
        assert!(
            e.message.starts_with(&format!("{field}:")),
            "nbd_start_disk {params}: the error names {field}: {e:?}"
        );
    };
    // A non-loopback address without TLS, 0.0.0.0 included.
    for host in ["0.0.0.0", "192.0.2.1", "[::]"] {
        let dev = format!("nbd://{host}:{port}/m2");
        let e = daemon
            .try_call("nbd_start_disk", json!({"bdev_name": "m", "nbd_device": dev, "readonly": true}))
            .unwrap_err();
        assert_eq!(e.code, -32602, "{dev}: {e:?}");
        assert!(
            e.message.starts_with("nbd_device:") || e.message.starts_with("tls_cert:"),
            "{dev}: the error names nbd_device (or tls_cert): {e:?}"
        );
    }
    refused(json!({"bdev_name": "m", "nbd_device": "relative.sock", "readonly": true}), "nbd_device");
    // A path that holds a file, or a socket someone listens on, is never replaced.
    let file = daemon.dir.path().join("precious.txt");
    std::fs::write(&file, b"keep me").unwrap();
    let busy = daemon.dir.path().join("busy.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&busy).unwrap();
    for path in [&file, &busy] {
        refused(json!({"bdev_name": "m", "nbd_device": path, "readonly": true}), "nbd_device");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    assert!(
        std::os::unix::net::UnixStream::connect(&busy).is_ok(),
        "the other listener's socket was replaced"
    );
    refused(
        json!({"bdev_name": "m", "nbd_device": format!("ftp://127.0.0.1:{port}/x"), "readonly": true}),
        "nbd_device",
    );
    refused(
        json!({"bdev_name": "m", "nbd_device": format!("nbd://127.0.0.1:{port}/x"), "readonly": "yes"}),
        "readonly",
    );
    refused(
        json!({"bdev_name": "m", "nbd_device": format!("nbd://127.0.0.1:{port}/x"), "bogus": 1}),
        "bogus",
    );
    refused(json!({"nbd_device": format!("nbd://127.0.0.1:{port}/x")}), "bdev_name");
    // A missing bdev, the same device twice, a missing certificate file: errors naming them.
    let e = daemon
        .try_call(
            "nbd_start_disk",
            json!({"bdev_name": "nope", "nbd_device": format!("nbd://127.0.0.1:{port}/x")}),
        )
        .unwrap_err();
    assert!(e.message.contains("nope"), "{e:?}");
    let e = daemon
        .try_call("nbd_start_disk", json!({"bdev_name": "m", "nbd_device": sock, "readonly": true}))
        .unwrap_err();
    assert!(e.message.contains("nbd_device") || e.message.contains(sock.to_str().unwrap()), "{e:?}");
    let e = daemon
        .try_call(
            "nbd_start_disk",
            json!({"bdev_name": "m", "nbd_device": format!("nbd://127.0.0.1:{port}/x"), "readonly": true,
                   "tls_cert": "/nonexistent/cert.pem", "tls_key": "/nonexistent/key.pem"}),
        )
        .unwrap_err();
    assert!(e.message.starts_with("tls_cert:") || e.message.starts_with("tls_key:"), "{e:?}");
    // An unknown export is "not found" (-19), as an unknown bdev or controller is.
    for method in ["nbd_stop_disk", "nbd_get_disks"] {
        let e = daemon.try_call(method, json!({"nbd_device": "/no/such.sock"})).unwrap_err();
        assert!(e.code == -19 && e.message.contains("'/no/such.sock'"), "{method}: {e:?}");
    }
    assert_eq!(daemon.call("nbd_get_disks", Value::Null), before, "a refused call changed the exports");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "a refused export left a listener on {port}"
    );

    // With a certificate and key, any address is allowed.
    let pki = TestPki::create(&daemon.dir.path().join("pki"));
    let dev = format!("nbd://0.0.0.0:{port}/any");
    daemon.call(
        "nbd_start_disk",
        json!({"bdev_name": "m", "nbd_device": dev, "readonly": true, "tls_cert": pki.server_cert, "tls_key": pki.server_key}),
    );
    let nbds = format!("nbds://127.0.0.1:{port}/any?tls-certificates={}", pki.client_dir.display());
    assert_eq!(tool_ok(Command::new("nbdinfo").args(["--size", &nbds])).trim(), "1048576");
    assert_eq!(daemon.call("nbd_stop_disk", json!({"nbd_device": dev})), json!(true));
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nbd_stop_disk left the listener on {port}"
    );
    daemon.assert_alive();
}

#[test]
fn a_disk_served_read_only_by_vhost_and_by_nbd_reads_the_same_through_both() {
    let mut daemon = Daemon::start("0-1");
    daemon.malloc("m", 8 * MIB / 512, 512);
    let data = pattern(11, 0, (8 * MIB) as usize);
    let rw = daemon.controller("rw", "m", Some(1), false);
    let d = data.clone();
    bounded(Duration::from_secs(60), "writer", move || BlkClient::open(&rw, 1).write_all(0, &d));
    // A writable controller excludes any export of its bdev, read-only ones included.
    let sock = daemon.dir.path().join("m.nbd");
    let e = daemon
        .try_call("nbd_start_disk", json!({"bdev_name": "m", "nbd_device": sock, "readonly": true}))
        .expect_err("a read-only export of a bdev a writable controller holds");
    assert!(e.message.contains("in use by 'rw'"), "the refusal names the holder: {e:?}");
    daemon.call("vhost_delete_controller", json!({"ctrlr": "rw"}));

    let ro = daemon.controller("ro", "m", Some(2), true);
    start_export(&daemon, "m", sock.to_str().unwrap(), true);
    // Neither a writable export nor a writable controller can join them.
    let e = daemon
        .try_call("nbd_start_disk", json!({"bdev_name": "m", "nbd_device": daemon.dir.path().join("w.nbd")}))
        .expect_err("a writable export next to read-only holders");
    assert!(e.message.contains("in use"), "{e:?}");
    let e = daemon
        .try_call("vhost_create_blk_controller", json!({"ctrlr": "w2", "dev_name": "m"}))
        .expect_err("a writable controller next to a read-only export");
    assert!(e.message.contains("in use"), "{e:?}");
    let bdevs = daemon.call("bdev_get_bdevs", json!({"name": "m"}));
    assert_eq!(bdevs[0]["claim_type"], "read_many_write_none", "{bdevs}");

    // Both at once: the vhost client on two queues and nbdcopy out of the export.
    let out = daemon.dir.path().join("nbd.raw");
    let uri = unix_uri("m", &sock);
    let out2 = out.clone();
    let nbd_side = std::thread::spawn(move || {
        tool_ok(Command::new("nbdcopy").arg(&uri).arg(&out2));
    });
    let vhost_side = bounded(Duration::from_secs(120), "read-only vhost reader", move || {
        let mut c =
            BlkClient::connect(&ro, ClientOpts { num_queues: 2, read_only: true, ..ClientOpts::default() })
                .expect("a read-only client starts");
        c.read_all(0, (8 * MIB) as usize)
    });
    nbd_side.join().expect("nbdcopy");
    assert_same("read through vhost-user-blk", 0, &vhost_side, &data);
    assert_same("read through NBD", 0, &std::fs::read(&out).unwrap(), &data);
    daemon.assert_alive();
}

#[test]
fn nbd_stop_disk_disconnects_busy_clients_and_releases_the_bdev() {
    let mut daemon = Daemon::start("0-1");
    daemon.malloc("m", 16 * MIB / 512, 512);
    let sock = daemon.dir.path().join("m.nbd");
    let dev = start_export(&daemon, "m", sock.to_str().unwrap(), false);
    // Deleting an exported bdev is refused, naming the export.
    let e =
        daemon.try_call("bdev_malloc_delete", json!({"name": "m"})).expect_err("deleting an exported bdev");
    assert!(e.message.contains("in use"), "{e:?}");
    // Two clients writing and reading as fast as they can, and one stalled in its handshake.
    let ep = Endpoint::Unix(sock.clone());
    // `stopped` is set once nbd_stop_disk has returned: it shuts each connection down before
    // it answers, so a write sent after that must fail (one sent before may still be
    // answered). `writes` counts the writes done, so that the stop comes after each worker's
    // first one however slow the machine is.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stopped = std::sync::Arc::new(AtomicBool::new(false));
    let writes: std::sync::Arc<[AtomicU64; 2]> = std::sync::Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let workers: Vec<_> = (0..2u64)
        .map(|i| {
            let (ep, stopped, writes) = (ep.clone(), stopped.clone(), writes.clone());
            std::thread::spawn(move || {
                let mut c = NbdConn::connect(&ep, "m").expect("connect");
                let data = pattern(i, i * MIB, 64 << 10);
                let mut done = 0u64;
                loop {
                    let after_stop = stopped.load(Ordering::SeqCst);
                    match c.write(i * MIB, &data, 0) {
                        Ok(0) if after_stop => {
                            panic!("worker {i} was still connected after nbd_stop_disk returned")
                        }
                        Ok(0) => done += 1,
                        Ok(e) => panic!("worker {i}: write error {e}"),
                        Err(_) => return done, // disconnected by nbd_stop_disk
                    }
                    writes[i as usize].store(done, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let mut stalled = Sock::connect(&ep).unwrap();
    let mut hello = [0u8; 18];
    std::io::Read::read_exact(&mut stalled, &mut hello).unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while writes.iter().any(|w| w.load(Ordering::SeqCst) == 0) {
        assert!(std::time::Instant::now() < until, "a worker wrote nothing in 60 s: {writes:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = std::time::Instant::now();
    assert_eq!(daemon.call("nbd_stop_disk", json!({"nbd_device": dev})), json!(true));
    stopped.store(true, Ordering::SeqCst);
    assert!(started.elapsed() < Duration::from_secs(10), "nbd_stop_disk took {:?}", started.elapsed());
    for w in workers {
        let done = bounded(Duration::from_secs(10), "worker", move || w.join().expect("worker"));
        assert!(done > 0, "a worker wrote nothing before the stop");
    }
    // A client that was in its handshake may still be connected (its handshake thread times
    // out by itself), but it cannot reach the stopped export.
    let greeted = u32::from(hello[17] & 3);
    let reached = std::io::Write::write_all(&mut stalled, &greeted.to_be_bytes())
        .and_then(|()| send_option(&mut stalled, OPT_GO, &common::nbd::go_data("m", &[])))
        .and_then(|()| read_opt_reply(&mut stalled));
    if let Ok(r) = reached {
        assert_eq!(r.kind, common::nbd::REP_ERR_UNKNOWN, "GO on a stopped export: {r:?}");
    }
    assert!(!sock.exists(), "the socket is still there");
    assert!(Sock::connect(&ep).is_err(), "the stopped export still accepts connections");
    assert_eq!(daemon.call("nbd_get_disks", Value::Null), json!([]));
    // The bdev is free again: a writable controller takes it and reads what the workers wrote.
    let vhost = daemon.controller("vhost.0", "m", Some(1), false);
    let got = bounded(Duration::from_secs(30), "blkio read-back", move || {
        BlkClient::open(&vhost, 1).read_all(0, (2 * MIB) as usize)
    });
    for i in 0..2u64 {
        let at = (i * MIB) as usize;
        assert_same("a worker's writes", i * MIB, &got[at..at + (64 << 10)], &pattern(i, i * MIB, 64 << 10));
    }
    daemon.call("vhost_delete_controller", json!({"ctrlr": "vhost.0"}));
    daemon.call("bdev_malloc_delete", json!({"name": "m"}));
    daemon.assert_alive();
}

#[test]
fn sigterm_with_nbd_clients_attached_stops_the_daemon() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 2048, 512);
    let sock = daemon.dir.path().join("m.nbd");
    start_export(&daemon, "m", sock.to_str().unwrap(), false);
    let ep = Endpoint::Unix(sock);
    let mut c = NbdConn::connect(&ep, "m").unwrap();
    assert_eq!(c.write(0, &pattern(1, 0, 4096), 0).unwrap(), 0);
    let mut in_handshake = Sock::connect(&ep).unwrap();
    greet(&mut in_handshake).unwrap();
    daemon.assert_stops_on_sigterm();
    assert!(c.sock.wait_closed(Duration::from_secs(5)).is_ok());
    assert!(in_handshake.wait_closed(Duration::from_secs(5)).is_ok());
}

#[test]
fn a_disk_grown_while_exported_shows_its_new_size_to_new_clients() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 4 * MIB / 512, 512);
    let sock = daemon.dir.path().join("m.nbd");
    let dev = start_export(&daemon, "m", sock.to_str().unwrap(), false);
    let ep = Endpoint::Unix(sock.clone());
    let mut old = NbdConn::connect(&ep, "m").unwrap();
    assert_eq!(old.size, 4 * MIB);
    let data = pattern(8, 0, 1 << 20);
    assert_eq!(old.write(0, &data, 0).unwrap(), 0);
    daemon.call("bdev_malloc_resize", json!({"name": "m", "new_size": 8}));
    // A client connecting now sees 8 MiB and uses all of it; the one before keeps working.
    let uri = unix_uri("m", &sock);
    assert_eq!(tool_ok(Command::new("nbdinfo").args(["--size", &uri])).trim(), (8 * MIB).to_string());
    let mut new = NbdConn::connect(&ep, "m").unwrap();
    assert_eq!(new.size, 8 * MIB);
    let tail = pattern(9, 8 * MIB - 4096, 4096);
    assert_eq!(new.write(8 * MIB - 4096, &tail, 0).unwrap(), 0);
    assert_eq!(new.read(8 * MIB - 4096, 4096).unwrap().unwrap(), tail);
    assert_eq!(new.read(0, 1 << 20).unwrap().unwrap(), data);
    assert_eq!(old.read(0, 1 << 20).unwrap().unwrap(), data);
    // Shrinking under the export is refused, and the size stays.
    let e = daemon.try_call("bdev_malloc_resize", json!({"name": "m", "new_size": 2})).expect_err("a shrink");
    assert!(e.message.contains("in use"), "{e:?}");
    assert_eq!(NbdConn::connect(&ep, "m").unwrap().size, 8 * MIB);
    old.disconnect();
    new.disconnect();
    daemon.call("nbd_stop_disk", json!({"nbd_device": dev}));
    daemon.assert_alive();
}
