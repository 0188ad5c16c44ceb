//! The lvol methods issue 26 added, through the registry as the RPC server calls them: data seen
//! through a new parent (`bdev_lvol_set_parent`), the fragment map, shallow copies, clones of
//! external snapshots, byte-sized `size`, and the refusals, each naming its field.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::Iovecs;
use fp_bdev::{IoChannel, IoOp, IoRequest, IoStatus};
use fp_registry::Registry;
use fp_rpc::codes;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

struct Fixture {
    m: Arc<Registry>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// A 32 MiB malloc bdev `m0` holding lvstore `lvs` of 1 MiB clusters.
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let m = Registry::new(vec![], &dir.path().join("vhost"));
        let f = Fixture { m, _dir: dir };
        f.ok("bdev_malloc_create", json!({"name": "m0", "num_blocks": 65536, "block_size": 512}));
        f.ok("bdev_lvol_create_lvstore", json!({"bdev_name": "m0", "lvs_name": "lvs", "cluster_sz": MIB}));
        f
    }

    fn ok(&self, method: &str, params: Value) -> Value {
        self.m.call(method, Some(params)).unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    fn err(&self, method: &str, params: Value) -> fp_rpc::RpcError {
        self.m.call(method, Some(params)).map(|v| panic!("{method} gave {v}")).unwrap_err().to_rpc()
    }

    /// A thin volume of `mib` MiB.
    fn thin(&self, name: &str, mib: u64) -> String {
        let p = json!({"lvs_name": "lvs", "lvol_name": name, "size_in_mib": mib, "thin_provision": true});
        self.ok("bdev_lvol_create", p).as_str().unwrap().to_string()
    }

    fn io(&self, bdev: &str, op: IoOp, offset: u64, buf: &mut [u8]) {
        let mut ch = self.m.disk(bdev).unwrap().open().unwrap();
        run(&mut *ch, op, offset, buf)
            .unwrap_or_else(|e| panic!("{op:?} of '{bdev}' at {offset}: errno {e}"));
    }

    fn write(&self, bdev: &str, offset: u64, fill: u8, len: u64) {
        self.io(bdev, IoOp::Write, offset, &mut vec![fill; len as usize]);
    }

    /// The first byte of each MiB of `bdev`'s first `mib` MiB (each is filled with one value).
    fn bytes(&self, bdev: &str, mib: u64) -> Vec<u8> {
        let mut buf = vec![0xee; (mib * MIB) as usize];
        self.io(bdev, IoOp::Read, 0, &mut buf);
        buf.chunks(MIB as usize)
            .map(|c| {
                assert!(c.iter().all(|&b| b == c[0]), "a MiB of '{bdev}' is not uniform");
                c[0]
            })
            .collect()
    }
}

/// One request on `ch`, waited for.
fn run(ch: &mut dyn IoChannel, op: IoOp, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let iovs = unsafe { Iovecs::from_raw(&iov, 1) };
    let req = IoRequest { tag: 7, op, offset, len: buf.len() as u64, iov: iovs };
    ch.submit(&req).map_err(|_| libc::EINVAL)?;
    let start = Instant::now();
    let mut status = None;
    while status.is_none() {
        ch.poll(&mut |_, s| status = Some(s));
        assert!(start.elapsed() < Duration::from_secs(10), "request never completed");
        std::thread::yield_now();
    }
    match status {
        Some(IoStatus::Success) => Ok(()),
        Some(IoStatus::Error(e)) => Err(e),
        _ => Err(libc::EOPNOTSUPP),
    }
}

fn assert_param(e: &fp_rpc::RpcError, field: &str) {
    assert_eq!(e.code, codes::INVALID_PARAMS, "{e:?}");
    assert!(e.message.starts_with(&format!("{field}: ")), "{e:?} does not name {field}");
}

fn lvol<'a>(lvols: &'a Value, name: &str) -> &'a Value {
    lvols.as_array().unwrap().iter().find(|v| v["name"] == name).unwrap()
}

/// A thin volume made the clone of a snapshot reads the snapshot's data where it owns nothing,
/// its own data where it does; re-parenting a clone switches what shows through.
#[test]
fn set_parent_shows_the_snapshot_through_unowned_clusters() {
    let f = Fixture::new();
    f.thin("v", 4);
    f.write("lvs/v", 0, 0xa1, 2 * MIB);
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s1"}));
    f.write("lvs/v", 0, 0xb1, 3 * MIB);
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s2"}));
    let w = f.thin("w", 4);
    f.write("lvs/w", MIB, 0x77, MIB);
    assert_eq!(f.bytes("lvs/w", 4), [0, 0x77, 0, 0]);

    f.ok("bdev_lvol_set_parent", json!({"lvol_name": "lvs/w", "parent_name": "lvs/s1"}));
    assert_eq!(f.bytes("lvs/w", 4), [0xa1, 0x77, 0, 0], "the parent's data, the clone's own first");
    let lvols = f.ok("bdev_lvol_get_lvols", json!({}));
    assert_eq!(lvol(&lvols, "w")["is_clone"], true);
    // Re-parenting a clone (by UUID this time); a write goes on copying from the new parent.
    f.ok("bdev_lvol_set_parent", json!({"lvol_name": w, "parent_name": "lvs/s2"}));
    assert_eq!(f.bytes("lvs/w", 4), [0xb1, 0x77, 0xb1, 0]);
    f.write("lvs/w", 2 * MIB, 0x55, 4096);
    let mut buf = vec![0u8; 8192];
    f.io("lvs/w", IoOp::Read, 2 * MIB, &mut buf);
    assert!(buf[..4096].iter().all(|&b| b == 0x55) && buf[4096..].iter().all(|&b| b == 0xb1));
    // The snapshots themselves are unchanged.
    assert_eq!(f.bytes("lvs/s1", 4), [0xa1, 0xa1, 0, 0]);
}

#[test]
fn set_parent_refusals_name_the_field() {
    let f = Fixture::new();
    f.thin("v", 4);
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s"}));
    f.thin("small", 2);
    f.ok("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "thick", "size_in_mib": 4}));
    let set = |lvol: &str, parent: &str| {
        f.err("bdev_lvol_set_parent", json!({"lvol_name": lvol, "parent_name": parent}))
    };
    assert_param(&set("lvs/thick", "lvs/s"), "lvol_name");
    assert_param(&set("lvs/small", "lvs/s"), "parent_name");
    assert_param(&set("lvs/small", "lvs/v"), "parent_name");
    assert_param(&set("lvs/v", "lvs/s"), "parent_name"); // already its parent
    assert_param(&set("lvs/s", "lvs/s"), "parent_name");
    assert_param(&set("lvs/nope", "lvs/s"), "lvol_name");
    assert_param(&set("lvs/v", "lvs/nope"), "parent_name");
    assert_param(&f.err("bdev_lvol_set_parent", json!({"lvol_name": "lvs/v"})), "parent_name");
    // A snapshot in another store.
    f.ok("bdev_malloc_create", json!({"name": "m1", "num_blocks": 32768, "block_size": 512}));
    f.ok("bdev_lvol_create_lvstore", json!({"bdev_name": "m1", "lvs_name": "other", "cluster_sz": MIB}));
    let p = json!({"lvs_name": "other", "lvol_name": "o", "size_in_mib": 4, "thin_provision": true});
    f.ok("bdev_lvol_create", p);
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "other/o", "snapshot_name": "os"}));
    f.thin("x", 4);
    assert_param(&set("lvs/x", "other/os"), "parent_name");
    let lvols = f.ok("bdev_lvol_get_lvols", json!({"lvs_name": "lvs"}));
    assert_eq!(lvol(&lvols, "x")["is_clone"], false, "nothing changed");
}

/// Longhorn's fragment map: the clusters the volume owns itself, a bit each, LSB first.
#[test]
fn fragmap_lists_the_clusters_the_volume_owns() {
    let f = Fixture::new();
    f.thin("v", 10);
    f.write("lvs/v", 0, 1, 4096);
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s"}));
    // After the snapshot, cluster 0 is the snapshot's: only the clone's own writes count.
    f.write("lvs/v", MIB, 2, 4096);
    f.write("lvs/v", 9 * MIB, 3, 4096);
    let m = f.ok("bdev_lvol_get_fragmap", json!({"name": "lvs/v"}));
    assert_eq!(m["cluster_size"], MIB);
    assert_eq!(m["num_clusters"], 10);
    assert_eq!(m["num_allocated_clusters"], 2);
    // Bits 1 and 9: bytes 0x02, 0x02.
    assert_eq!(m["fragmap"], "AgI=");
    let m = f.ok("bdev_lvol_get_fragmap", json!({"name": "lvs/s"}));
    assert_eq!((m["num_allocated_clusters"].as_u64(), m["fragmap"].as_str()), (Some(1), Some("AQA=")));
    let m = f.ok("bdev_lvol_get_fragmap", json!({"name": "lvs/v", "offset": MIB, "size": 2 * MIB}));
    assert_eq!((m["num_clusters"].as_u64(), m["fragmap"].as_str()), (Some(2), Some("AQ==")));
    let m = f.ok("bdev_lvol_get_fragmap", json!({"name": "lvs/v", "offset": 8 * MIB}));
    assert_eq!((m["num_clusters"].as_u64(), m["fragmap"].as_str()), (Some(2), Some("Ag==")));
    let frag = |p: Value| f.err("bdev_lvol_get_fragmap", p);
    assert_param(&frag(json!({"name": "lvs/v", "offset": 4096})), "offset");
    assert_param(&frag(json!({"name": "lvs/v", "offset": 11 * MIB})), "offset");
    assert_param(&frag(json!({"name": "lvs/v", "size": 4096})), "size");
    assert_param(&frag(json!({"name": "lvs/v", "offset": MIB, "size": 10 * MIB})), "size");
    assert_param(&frag(json!({"name": "lvs/nope"})), "name");
    assert_param(&frag(json!({"name": "m0"})), "name");
}

/// Clients before SPDK 23.05 send `size` in bytes; SPDK rounded it up to whole clusters.
#[test]
fn byte_sized_size_is_rounded_up_to_clusters() {
    let f = Fixture::new();
    let p = json!({"lvs_name": "lvs", "lvol_name": "b", "size": 3 * MIB - 512, "thin_provision": true});
    f.ok("bdev_lvol_create", p);
    let bdev = f.ok("bdev_get_bdevs", json!({"name": "lvs/b"}));
    assert_eq!(bdev[0]["num_blocks"], 3 * MIB / 512);
    f.ok("bdev_lvol_resize", json!({"name": "lvs/b", "size": 4 * MIB + 1}));
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "lvs/b"}))[0]["num_blocks"], 5 * MIB / 512);
    f.ok("bdev_lvol_resize", json!({"name": "lvs/b", "size_in_mib": 2}));
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "lvs/b"}))[0]["num_blocks"], 2 * MIB / 512);
    let both = json!({"lvs_name": "lvs", "lvol_name": "c", "size": MIB, "size_in_mib": 1});
    assert_param(&f.err("bdev_lvol_create", both), "size");
    assert_param(&f.err("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "c", "size": 0})), "size");
    assert_param(&f.err("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "c"})), "size_in_mib");
    let big = json!({"lvs_name": "lvs", "lvol_name": "c", "size": 1u64 << 40, "thin_provision": true});
    assert_param(&f.err("bdev_lvol_create", big), "size");
    assert_param(&f.err("bdev_lvol_resize", json!({"name": "lvs/b", "size": MIB, "size_in_mib": 1})), "size");
    assert_param(
        &f.err("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "c", "size": -1})),
        "size",
    );
}

/// Polls `bdev_lvol_check_shallow_copy` until the copy is no longer in progress.
fn wait_copy(f: &Fixture, id: &Value) -> Value {
    let start = Instant::now();
    loop {
        let s = f.ok("bdev_lvol_check_shallow_copy", json!({"operation_id": id}));
        if s["state"] != "in progress" {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "copy {id} still running: {s}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Only the clusters the read-only volume owns itself land on the destination, at their own
/// offsets; the rest of the destination is untouched.
#[test]
fn shallow_copy_copies_only_the_volumes_own_clusters() {
    let f = Fixture::new();
    f.thin("v", 4);
    f.write("lvs/v", 0, 0x11, MIB);
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s"}));
    f.write("lvs/v", 2 * MIB, 0x22, MIB);
    f.ok("bdev_malloc_create", json!({"name": "d", "num_blocks": 16384, "block_size": 512}));
    f.write("d", 0, 0xff, 8 * MIB);
    let start = |src: &str, dst: &str| {
        f.m.call("bdev_lvol_start_shallow_copy", Some(json!({"src_lvol_name": src, "dst_bdev_name": dst})))
    };
    assert_param(&start("lvs/v", "d").unwrap_err().to_rpc(), "src_lvol_name");
    f.ok("bdev_lvol_set_read_only", json!({"name": "lvs/v"}));
    let id = start("lvs/v", "d").unwrap()["operation_id"].clone();
    let done = wait_copy(&f, &id);
    assert_eq!(done, json!({"state": "complete", "copied_clusters": 1, "total_clusters": 1}));
    assert_eq!(f.bytes("d", 8), [0xff, 0xff, 0x22, 0xff, 0xff, 0xff, 0xff, 0xff]);
    // The claim went with the copy: the same destination takes the snapshot's clusters next.
    let id2 = start("lvs/s", "d").unwrap()["operation_id"].clone();
    assert_ne!(id, id2);
    assert_eq!(wait_copy(&f, &id2)["state"], "complete");
    assert_eq!(f.bytes("d", 4), [0x11, 0xff, 0x22, 0xff]);
    // Refusals: a destination smaller than the volume, unknown names and operations.
    f.ok("bdev_malloc_create", json!({"name": "small", "num_blocks": 2048, "block_size": 512}));
    assert_param(&start("lvs/v", "small").unwrap_err().to_rpc(), "dst_bdev_name");
    assert_param(&start("lvs/v", "nope").unwrap_err().to_rpc(), "dst_bdev_name");
    assert_param(&start("lvs/v", "lvs/v").unwrap_err().to_rpc(), "dst_bdev_name");
    assert_param(&start("lvs/nope", "d").unwrap_err().to_rpc(), "src_lvol_name");
    assert_param(&f.err("bdev_lvol_check_shallow_copy", json!({"operation_id": 99})), "operation_id");
    assert_param(&f.err("bdev_lvol_check_shallow_copy", json!({"operation_id": "x"})), "operation_id");
    // The lvstore's own base is claimed by the store: a copy cannot overwrite it.
    assert!(start("lvs/v", "m0").is_err());
}

/// A 4 MiB malloc bdev `golden` whose MiBs hold 0x10, 0x20, 0x30, 0x40.
fn golden(f: &Fixture) {
    f.ok("bdev_malloc_create", json!({"name": "golden", "num_blocks": 8192, "block_size": 512}));
    for (i, b) in [0x10u8, 0x20, 0x30, 0x40].into_iter().enumerate() {
        f.write("golden", i as u64 * MIB, b, MIB);
    }
}

/// A clone of an external snapshot reads it where it owns nothing, copies from it on the first
/// write to a cluster, and keeps it claimed read-many-write-none while any volume reads it.
#[test]
fn clone_bdev_reads_the_external_snapshot_and_copies_on_write() {
    let f = Fixture::new();
    golden(&f);
    let uuid = f.ok("bdev_lvol_clone_bdev", json!({"bdev": "golden", "lvs_name": "lvs", "clone_name": "c"}));
    assert!(uuid.as_str().unwrap().len() == 36, "{uuid}");
    assert_eq!(f.bytes("lvs/c", 4), [0x10, 0x20, 0x30, 0x40]);
    f.write("lvs/c", MIB, 0x99, 4096);
    let mut buf = vec![0u8; 8192];
    f.io("lvs/c", IoOp::Read, MIB, &mut buf);
    assert!(buf[..4096].iter().all(|&b| b == 0x99) && buf[4096..].iter().all(|&b| b == 0x20));
    assert_eq!(f.bytes("golden", 4), [0x10, 0x20, 0x30, 0x40], "the external snapshot is never written");
    let lvols = f.ok("bdev_lvol_get_lvols", json!({}));
    let c = lvol(&lvols, "c");
    assert_eq!((c["is_esnap_clone"].as_bool(), c["is_degraded"].as_bool()), (Some(true), Some(false)));
    assert_eq!(c["external_snapshot_name"], "golden");
    let m = f.ok("bdev_lvol_get_fragmap", json!({"name": "lvs/c"}));
    assert_eq!((m["num_allocated_clusters"].as_u64(), m["fragmap"].as_str()), (Some(1), Some("Ag==")));
    // Nobody may write it now: an lvstore on it is refused, and so is deleting it.
    let on_golden = json!({"bdev_name": "golden", "lvs_name": "g", "cluster_sz": MIB});
    let e = f.err("bdev_lvol_create_lvstore", on_golden.clone());
    assert!(e.code == -libc::EBUSY && e.message.contains("in use"), "{e:?}");
    let e = f.err("bdev_malloc_delete", json!({"name": "golden"}));
    assert!(e.message.contains("lvol_esnap") || e.code == -libc::EBUSY, "{e:?}");
    // A snapshot of the clone takes the external parent over; the clone reads the same.
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/c", "snapshot_name": "s"}));
    let mut after = vec![0u8; 8192];
    f.io("lvs/c", IoOp::Read, MIB, &mut after);
    assert_eq!(after, buf);
    let mut snap = vec![0u8; 8192];
    f.io("lvs/s", IoOp::Read, MIB, &mut snap);
    assert_eq!(snap, buf, "the snapshot holds the clone's cluster, the rest from the external");
    f.io("lvs/s", IoOp::Read, 3 * MIB, &mut snap);
    assert!(snap.iter().all(|&b| b == 0x40));
    let lvols = f.ok("bdev_lvol_get_lvols", json!({}));
    assert_eq!(lvol(&lvols, "s")["is_esnap_clone"], true);
    assert_eq!(
        (lvol(&lvols, "c")["is_esnap_clone"].as_bool(), lvol(&lvols, "c")["is_clone"].as_bool()),
        (Some(false), Some(true))
    );
    // Once no volume reads it, the claim goes.
    f.ok("bdev_lvol_delete", json!({"name": "lvs/c"}));
    f.ok("bdev_lvol_delete", json!({"name": "lvs/s"}));
    f.ok("bdev_lvol_create_lvstore", on_golden);
}

#[test]
fn set_parent_bdev_makes_a_thin_volume_an_esnap_clone() {
    let f = Fixture::new();
    golden(&f);
    f.thin("w", 4);
    f.write("lvs/w", 3 * MIB, 0x77, MIB);
    f.ok("bdev_lvol_set_parent_bdev", json!({"lvol_name": "lvs/w", "parent_name": "golden"}));
    assert_eq!(f.bytes("lvs/w", 4), [0x10, 0x20, 0x30, 0x77]);
    let set = |lvol: &str, parent: &str| {
        f.err("bdev_lvol_set_parent_bdev", json!({"lvol_name": lvol, "parent_name": parent}))
    };
    assert_param(&set("lvs/w", "golden"), "parent_name"); // already its parent
    f.ok("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "thick", "size_in_mib": 4}));
    assert_param(&set("lvs/thick", "golden"), "lvol_name");
    f.ok("bdev_malloc_create", json!({"name": "odd", "num_blocks": 3000, "block_size": 512}));
    assert_param(&set("lvs/w", "odd"), "parent_name");
    assert_param(&set("lvs/w", "nope"), "parent_name");
    assert_param(&set("lvs/w", "lvs/thick"), "parent_name");
    assert_param(&set("lvs/nope", "golden"), "lvol_name");
    assert_param(&set("lvs/w", "m0"), "parent_name"); // the store's base: claimed for writing
    f.ok("bdev_malloc_create", json!({"name": "big_blocks", "num_blocks": 1024, "block_size": 4096}));
    assert_param(&set("lvs/w", "big_blocks"), "parent_name"); // 4 KiB blocks under 512-byte ones
    let clone = |p: Value| f.err("bdev_lvol_clone_bdev", p);
    assert_param(&clone(json!({"bdev": "golden", "lvs_name": "nope", "clone_name": "c"})), "lvs_name");
    assert_param(&clone(json!({"bdev": "nope", "lvs_name": "lvs", "clone_name": "c"})), "bdev");
    assert_param(&clone(json!({"bdev": "odd", "lvs_name": "lvs", "clone_name": "c"})), "bdev");
    assert_param(&clone(json!({"bdev": "golden", "lvs_name": "lvs", "clone_name": "w"})), "clone_name");
    assert_param(&clone(json!({"bdev": "golden", "lvs_name": "lvs", "clone_name": "a/b"})), "clone_name");
    // Back to a snapshot parent: the external snapshot is let go.
    f.thin("v", 4);
    f.write("lvs/v", 0, 0x5a, 4 * MIB);
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s"}));
    f.ok("bdev_lvol_set_parent", json!({"lvol_name": "lvs/w", "parent_name": "lvs/s"}));
    assert_eq!(f.bytes("lvs/w", 4), [0x5a, 0x5a, 0x5a, 0x77]);
    f.ok("bdev_malloc_delete", json!({"name": "golden"}));
}

/// Inflate and decouple copy what an esnap clone reads from its external snapshot: afterwards
/// it reads the same without it, and the external snapshot is let go.
#[test]
fn inflate_and_decouple_copy_from_the_external_snapshot() {
    let f = Fixture::new();
    golden(&f);
    let clone = |name: &str| {
        f.ok("bdev_lvol_clone_bdev", json!({"bdev": "golden", "lvs_name": "lvs", "clone_name": name}));
        f.write(&format!("lvs/{name}"), 2 * MIB, 0x99, MIB);
    };
    let want = [0x10, 0x20, 0x99, 0x40];
    clone("a");
    clone("b");
    clone("c");
    // c's snapshot takes the external parent; decoupling c makes it an esnap clone again.
    f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/c", "snapshot_name": "cs"}));
    f.ok("bdev_lvol_decouple_parent", json!({"name": "lvs/c"}));
    let lvols = f.ok("bdev_lvol_get_lvols", json!({}));
    let c = lvol(&lvols, "c");
    assert_eq!((c["is_clone"].as_bool(), c["is_esnap_clone"].as_bool()), (Some(false), Some(true)));
    assert_eq!(c["num_allocated_clusters"], 1, "the snapshot's cluster copied in");
    assert_eq!(f.bytes("lvs/c", 4), want);
    f.ok("bdev_lvol_inflate", json!({"name": "lvs/a"}));
    f.ok("bdev_lvol_decouple_parent", json!({"name": "lvs/b"}));
    for name in ["c", "cs"] {
        f.ok("bdev_lvol_decouple_parent", json!({"name": format!("lvs/{name}")}));
    }
    let lvols = f.ok("bdev_lvol_get_lvols", json!({}));
    let a = lvol(&lvols, "a");
    assert_eq!(
        (a["is_esnap_clone"].as_bool(), a["is_thin_provisioned"].as_bool()),
        (Some(false), Some(false))
    );
    let b = lvol(&lvols, "b");
    assert_eq!((b["is_esnap_clone"].as_bool(), b["num_allocated_clusters"].as_u64()), (Some(false), Some(4)));
    assert_param(&f.err("bdev_lvol_decouple_parent", json!({"name": "lvs/b"})), "name");
    // Nothing reads the external snapshot any more: it can go, and the volumes read the same.
    f.ok("bdev_malloc_delete", json!({"name": "golden"}));
    for name in ["a", "b", "c"] {
        assert_eq!(f.bytes(&format!("lvs/{name}"), 4), want, "{name}");
    }
}

/// The external parent persists: a daemon that loads the store without the bdev reports the
/// clone degraded and fails the reads that need it; when a bdev of that name appears it is
/// claimed and attached, and the clone reads everything again.
#[test]
fn a_missing_external_snapshot_is_attached_when_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.img");
    std::fs::File::create(&file).unwrap().set_len(16 * MIB).unwrap();
    let uring = json!({"name": "u", "filename": file, "direct": false});
    {
        let f = Fixture::new();
        f.ok("bdev_uring_create", uring.clone());
        f.ok("bdev_lvol_create_lvstore", json!({"bdev_name": "u", "lvs_name": "disk", "cluster_sz": MIB}));
        golden(&f);
        f.ok("bdev_lvol_clone_bdev", json!({"bdev": "golden", "lvs_name": "disk", "clone_name": "c"}));
        f.write("disk/c", 0, 0x66, MIB);
        f.m.shutdown();
    }
    let f = Fixture::new();
    f.ok("bdev_uring_create", uring);
    let c = lvol(&f.ok("bdev_lvol_get_lvols", json!({"lvs_name": "disk"})), "c").clone();
    assert_eq!((c["is_esnap_clone"].as_bool(), c["is_degraded"].as_bool()), (Some(true), Some(true)));
    assert_eq!(c["external_snapshot_name"], "golden");
    let mut ch = f.m.disk("disk/c").unwrap().open().unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(run(&mut *ch, IoOp::Read, 0, &mut buf), Ok(()), "the clone's own cluster");
    assert!(buf.iter().all(|&b| b == 0x66));
    assert_eq!(run(&mut *ch, IoOp::Read, MIB, &mut buf), Err(libc::EIO), "the external snapshot's");
    golden(&f);
    let c = lvol(&f.ok("bdev_lvol_get_lvols", json!({"lvs_name": "disk"})), "c").clone();
    assert_eq!(c["is_degraded"], false);
    assert_eq!(f.bytes("disk/c", 4), [0x66, 0x20, 0x30, 0x40]);
    let e = f.err("bdev_malloc_delete", json!({"name": "golden"}));
    assert_eq!(e.code, -libc::EBUSY, "claimed again: {e:?}");
}
