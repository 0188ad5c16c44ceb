//! An lvstore on an error bdev (`EE_u0`, over a file), through the registry as the RPC server
//! drives it: failed data writes reach the volume's user as `EIO` and change nothing; a failed
//! metadata write fails its method clearly and leaves the store broken (docs/lvol-format.md,
//! "Failures") until a reload, which shows exactly what was durable; a corrupted read of the
//! label at load refuses the store (a checksum error) until the read is clean again; and a
//! metadata page corrupted on its way down makes the load fall back to the other area.
//!
//! A "reload" is a new registry over the same file: auto-examine is off, so the error bdev is
//! created (and injected) before `bdev_examine` loads the store through it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::conformance::{read_range, run_batch, rw, write_range};
use fp_bdev::{IoChannel, IoOp, IoStatus};
use fp_lvol::bdev::LvStore;
use fp_lvol::LvolError;
use fp_registry::Registry;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const BASE: &str = "EE_u0";

/// A registry over the store's file, its error bdev created but, unless `examine`, not looked
/// at yet.
struct Daemonless {
    m: Arc<Registry>,
    _dir: tempfile::TempDir,
}

impl Daemonless {
    fn open(file: &Path, examine: bool) -> Daemonless {
        let dir = tempfile::tempdir().unwrap();
        let m = Registry::new(vec![], &dir.path().join("vhost"));
        let d = Daemonless { m, _dir: dir };
        d.ok("bdev_set_options", json!({"bdev_auto_examine": false}));
        d.ok("bdev_uring_create", json!({"name": "u0", "filename": file, "direct": false}));
        d.ok("bdev_error_create", json!({"base_name": "u0"}));
        if examine {
            d.ok("bdev_examine", json!({"name": BASE}));
        }
        d
    }

    fn ok(&self, method: &str, params: Value) -> Value {
        self.m.call(method, Some(params)).unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// The next `num` requests of `io_type` get byte `offset` of their data xored with `value`.
    fn corrupt(&self, io_type: &str, num: u64, offset: u64, value: u8) {
        let p = json!({"name": BASE, "io_type": io_type, "error_type": "corrupt_data", "num": num,
                       "corrupt_offset": offset, "corrupt_value": value});
        self.ok("bdev_error_inject_error", p);
    }

    fn inject(&self, io_type: &str, error_type: &str, num: u64) {
        let p = json!({"name": BASE, "io_type": io_type, "error_type": error_type, "num": num});
        self.ok("bdev_error_inject_error", p);
    }

    /// Whether an injection for `io_type` is still set (it goes when its `num` is used up).
    fn injected(&self, io_type: &str) -> bool {
        let b = self.ok("bdev_get_bdevs", json!({"name": BASE}));
        b[0]["driver_specific"]["error"]["injections"].get(io_type).is_some()
    }

    /// The volumes as `bdev_lvol_get_lvols` lists them: (name, allocated clusters), by name.
    fn volumes(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .ok("bdev_lvol_get_lvols", json!({}))
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["name"].as_str().unwrap().to_string(), v["num_allocated_clusters"].as_u64().unwrap()))
            .collect();
        v.sort();
        v
    }

    /// The size of bdev `alias` in bytes.
    fn size_of(&self, alias: &str) -> u64 {
        let b = self.ok("bdev_get_bdevs", json!({"name": alias}));
        b[0]["num_blocks"].as_u64().unwrap() * b[0]["block_size"].as_u64().unwrap()
    }

    fn channel(&self, bdev: &str) -> Box<dyn IoChannel> {
        self.m.disk(bdev).unwrap().open().unwrap()
    }

    /// Stops every module (the store's owner stops; it has nothing left to commit) and drops
    /// the registry, closing the file.
    fn close(self) {
        self.m.shutdown();
    }
}

/// A fresh 64 MiB file with an lvstore `lvs` of 1 MiB clusters on `EE_u0`.
fn new_store(dir: &Path) -> (PathBuf, Daemonless) {
    let file = dir.join("base.img");
    std::fs::File::create(&file).unwrap().set_len(64 * MIB).unwrap();
    let d = Daemonless::open(&file, false);
    d.ok("bdev_lvol_create_lvstore", json!({"bdev_name": BASE, "lvs_name": "lvs", "cluster_sz": MIB}));
    (file, d)
}

fn create(d: &Daemonless, name: &str, mib: u64, thin: bool) -> Result<Value, fp_rpc::RpcError> {
    let p = json!({"lvs_name": "lvs", "lvol_name": name, "size_in_mib": mib, "thin_provision": thin});
    d.m.call("bdev_lvol_create", Some(p)).map_err(|e| e.to_rpc())
}

/// One request on `ch`, waited for: its status.
fn submit(ch: &mut dyn IoChannel, op: IoOp, offset: u64, buf: &mut [u8]) -> IoStatus {
    let iov = [libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }];
    // SAFETY: `iov` and `buf` outlive the request: `run_batch` returns once it completed.
    unsafe { run_batch(ch, &[rw(0, op, offset, &iov)]) }.remove(0)
}

fn fill(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Data writes that fail on the base fail the volume's write with `EIO`: the volume keeps its
/// old data, nothing else changes (no cluster allocated or lost, the store still commits), and
/// once the injection is used up the same write lands.
#[test]
fn a_failed_data_write_reaches_the_volume_as_eio_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_file, d) = new_store(dir.path());
    create(&d, "thick", 2, false).unwrap();
    create(&d, "thin", 4, true).unwrap();
    let old = fill(1, 8192);
    let new = fill(2, 8192);
    for v in ["lvs/thick", "lvs/thin"] {
        write_range(&mut *d.channel(v), 0, &old);
    }
    let before = d.volumes();
    assert_eq!(before, [("thick".to_string(), 2), ("thin".to_string(), 1)]);

    for v in ["lvs/thick", "lvs/thin"] {
        let mut ch = d.channel(v);
        d.inject("write", "failure", 1);
        assert_eq!(submit(&mut *ch, IoOp::Write, 0, &mut new.clone()), IoStatus::Error(libc::EIO), "{v}");
        assert!(!d.injected("write"), "{v}: the failure was not taken by this write");
        assert_eq!(read_range(&mut *ch, 0, old.len()), old, "{v}: a failed write changed the volume");
    }
    assert_eq!(d.volumes(), before);
    // The store was not hurt: it still commits, and the writes land now.
    create(&d, "after", 1, true).expect("a volume created after the failures");
    for v in ["lvs/thick", "lvs/thin"] {
        let mut ch = d.channel(v);
        write_range(&mut *ch, 0, &new);
        assert_eq!(read_range(&mut *ch, 0, new.len()), new, "{v}");
    }
    d.close();
}

/// A write that fails while the store prepares a thin volume's new cluster (its zeroing, the
/// flush before the commit that maps it, or the read of the parent's cluster it copies) fails
/// the guest's write with `EIO` and nothing else: the cluster is not mapped, the volume reads
/// what it read before, the store still commits, and the retry allocates and lands. (A failure
/// of the commit itself is another matter: see the metadata test below.)
#[test]
fn a_failed_first_write_to_a_thin_cluster_is_eio_and_the_retry_lands() {
    let dir = tempfile::tempdir().unwrap();
    let (file, d) = new_store(dir.path());
    create(&d, "thin", 4, true).unwrap();
    let mut ch = d.channel("lvs/thin");
    for (i, kind) in ["write_zeroes", "flush"].into_iter().enumerate() {
        let at = i as u64 * MIB;
        let data = fill(3 + i as u8, 4096);
        d.inject(kind, "failure", 1);
        assert_eq!(
            submit(&mut *ch, IoOp::Write, at, &mut data.clone()),
            IoStatus::Error(libc::EIO),
            "{kind}"
        );
        assert!(!d.injected(kind), "{kind}: the failure was not taken by the allocation");
        assert_eq!(d.volumes(), [("thin".to_string(), i as u64)], "{kind}: a cluster stayed allocated");
        assert_eq!(read_range(&mut *ch, at, 4096), vec![0; 4096], "{kind}: a failed first write left data");
        write_range(&mut *ch, at, &data);
        assert_eq!(read_range(&mut *ch, at, 4096), data, "{kind}");
        assert_eq!(d.volumes(), [("thin".to_string(), i as u64 + 1)], "{kind}");
    }
    drop(ch);
    // Copy-on-write: the first write to a clone's cluster copies the snapshot's; that read fails.
    d.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/thin", "snapshot_name": "snap"}));
    let mut ch = d.channel("lvs/thin");
    let patch = fill(9, 512);
    d.inject("read", "failure", 1);
    assert_eq!(submit(&mut *ch, IoOp::Write, 512, &mut patch.clone()), IoStatus::Error(libc::EIO), "copy");
    assert!(!d.injected("read"));
    assert_eq!(read_range(&mut *ch, 0, 4096), fill(3, 4096), "the clone after a failed copy");
    write_range(&mut *ch, 512, &patch);
    let mut want = fill(3, 4096);
    want[512..1024].copy_from_slice(&patch);
    assert_eq!(read_range(&mut *ch, 0, 4096), want, "the copied cluster with the write over it");
    create(&d, "after", 1, true).expect("the store still commits");
    drop(ch);
    d.close();

    let d = Daemonless::open(&file, true);
    let mut ch = d.channel("lvs/thin");
    assert_eq!(read_range(&mut *ch, 0, 4096), want, "after a reload");
    assert_eq!(read_range(&mut *ch, MIB, 4096), fill(4, 4096), "after a reload");
    assert_eq!(read_range(&mut *d.channel("lvs/snap"), 0, 4096), fill(3, 4096), "the snapshot");
    drop(ch);
    d.close();
}

/// What one metadata change does, and how to see whether it happened.
struct Change {
    what: &'static str,
    run: fn(&Daemonless) -> Result<Value, fp_rpc::RpcError>,
    /// The volumes (name, allocated clusters) when the change happened.
    after: &'static [(&'static str, u64)],
}

/// A new store as the later tests start from it: thick `v` (2 MiB), written, and thin `t`
/// (4 MiB).
fn store_with_volumes(dir: &Path) -> (PathBuf, Daemonless) {
    let (file, d) = new_store(dir);
    create(&d, "v", 2, false).unwrap();
    create(&d, "t", 4, true).unwrap();
    write_range(&mut *d.channel("lvs/v"), 0, &fill(7, 4096));
    (file, d)
}
const BEFORE: &[(&str, u64)] = &[("t", 0), ("v", 2)];

fn changes() -> Vec<Change> {
    vec![
        Change { what: "create", run: |d| create(d, "w", 1, false), after: &[("t", 0), ("v", 2), ("w", 1)] },
        Change {
            what: "resize",
            run: |d| {
                d.m.call("bdev_lvol_resize", Some(json!({"name": "lvs/v", "size_in_mib": 3})))
                    .map_err(|e| e.to_rpc())
            },
            after: &[("t", 0), ("v", 3)],
        },
        Change {
            what: "snapshot",
            run: |d| {
                let p = json!({"lvol_name": "lvs/v", "snapshot_name": "s"});
                d.m.call("bdev_lvol_snapshot", Some(p)).map_err(|e| e.to_rpc())
            },
            after: &[("s", 2), ("t", 0), ("v", 0)],
        },
        Change {
            what: "delete",
            run: |d| d.m.call("bdev_lvol_delete", Some(json!({"name": "lvs/t"}))).map_err(|e| e.to_rpc()),
            after: &[("v", 2)],
        },
    ]
}

fn owned(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    list.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// Each metadata change with every metadata write failing: the method fails naming the failed
/// write, the store refuses later changes (it is broken: its memory is ahead of the disk) even
/// once the writes work again, while the volume it already had keeps serving reads and writes;
/// a reload shows the store as it was before the change, and the change then works and
/// survives the next reload.
#[test]
fn a_failed_metadata_write_fails_the_method_and_a_reload_shows_what_was_durable() {
    for c in changes() {
        let what = c.what;
        let dir = tempfile::tempdir().unwrap();
        let (file, d) = store_with_volumes(dir.path());
        assert_eq!(d.volumes(), owned(BEFORE), "{what}");

        d.inject("write", "failure", 1000);
        let e = (c.run)(&d).map(|v| panic!("{what} with failing writes gave {v}")).unwrap_err();
        assert!(
            e.message.starts_with("metadata write of page") && e.message.contains("Input/output error"),
            "{what}: {e:?}"
        );
        assert_eq!(e.code, -libc::EIO, "{what}: {e:?}");
        d.inject("clear", "failure", 0);
        // Broken until reloaded: a change is refused, naming the store and why.
        let e = create(&d, "x", 1, true)
            .map(|v| panic!("{what}: a change on a broken store gave {v}"))
            .unwrap_err();
        assert!(e.message.starts_with("lvs: the store is broken"), "{what}: {e:?}");
        // Nor does it allocate: a first write to a thin volume's cluster fails (unless the
        // failed change was the delete of that volume, whose bdev went first).
        if what != "delete" {
            let mut ch = d.channel("lvs/t");
            let status = submit(&mut *ch, IoOp::Write, 0, &mut fill(5, 4096));
            assert_eq!(status, IoStatus::Error(libc::EIO), "{what}");
        }
        // A volume's own clusters still read and write.
        let mut ch = d.channel("lvs/v");
        write_range(&mut *ch, 4096, &fill(8, 4096));
        assert_eq!(read_range(&mut *ch, 0, 4096), fill(7, 4096), "{what}");
        drop(ch);
        d.close();

        // The store as the last durable commit left it, the data written meanwhile kept.
        let d = Daemonless::open(&file, true);
        assert_eq!(d.volumes(), owned(BEFORE), "{what}: after the reload");
        assert_eq!(d.size_of("lvs/v"), 2 * MIB, "{what}");
        let mut ch = d.channel("lvs/v");
        assert_eq!(read_range(&mut *ch, 0, 8192), [fill(7, 4096), fill(8, 4096)].concat(), "{what}");
        drop(ch);
        (c.run)(&d).unwrap_or_else(|e| panic!("{what} after the reload: {e:?}"));
        assert_eq!(d.volumes(), owned(c.after), "{what}");
        d.close();
        let d = Daemonless::open(&file, true);
        assert_eq!(d.volumes(), owned(c.after), "{what}: after the second reload");
        d.close();
    }
}

/// The label read corrupted at load: once, on the examine's first look, the load re-reads it
/// and the store loads; on every read, the store is refused with a checksum error and no
/// volume appears (nothing crashes, nothing is written); once the reads are clean again,
/// examining the bdev loads the store with its volumes and data.
#[test]
fn a_corrupted_label_read_refuses_the_store_until_the_reads_are_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (file, d) = store_with_volumes(dir.path());
    d.close();

    // The first read only (examine's probe of page 0): the load reads the label again.
    let d = Daemonless::open(&file, false);
    d.corrupt("read", 1, 100, 0x40);
    d.ok("bdev_examine", json!({"name": BASE}));
    assert_eq!(d.volumes(), owned(BEFORE));
    d.close();

    let d = Daemonless::open(&file, false);
    d.corrupt("read", 1000, 100, 0x40);
    let raw = d.m.disk(BASE).unwrap().bdev().clone();
    match LvStore::load(raw, BASE) {
        Err(LvolError::Corrupt(m)) => assert!(m.contains("checksum"), "{m}"),
        other => panic!("a store with a corrupted label gave {:?}", other.map(|s| s.is_some())),
    }
    d.ok("bdev_examine", json!({"name": BASE}));
    assert_eq!(d.ok("bdev_lvol_get_lvstores", json!({})), json!([]));
    assert!(d.m.disk("lvs/v").is_err(), "a volume of a refused store");
    // The label's magic corrupted: no store at all (not an lvstore), not an error.
    d.corrupt("read", 1000, 0, 0x40);
    assert!(matches!(LvStore::load(d.m.disk(BASE).unwrap().bdev().clone(), BASE), Ok(None)));
    d.inject("clear", "failure", 0);
    d.ok("bdev_examine", json!({"name": BASE}));
    assert_eq!(d.volumes(), owned(BEFORE));
    assert_eq!(read_range(&mut *d.channel("lvs/v"), 0, 4096), fill(7, 4096));
    d.close();
}

/// A commit whose first page is corrupted on its way down (the device took the write and said
/// so): the store goes on in memory, but its new area does not match its checksums, so a
/// reload falls back to the other area, the previous generation: the change is gone, the
/// store loads and commits again.
#[test]
fn a_metadata_page_corrupted_on_its_way_down_loads_the_previous_generation() {
    let dir = tempfile::tempdir().unwrap();
    let (file, d) = store_with_volumes(dir.path());
    d.corrupt("write", 1, 200, 1);
    create(&d, "w", 1, false).expect("the device acknowledged the commit");
    assert!(!d.injected("write"), "the corruption was not taken by the commit");
    assert_eq!(d.volumes(), owned(&[("t", 0), ("v", 2), ("w", 1)]));
    // Closing commits nothing new (no change since), so the damaged area stays the newest.
    d.close();

    let d = Daemonless::open(&file, true);
    assert_eq!(d.volumes(), owned(BEFORE), "the damaged generation was loaded");
    create(&d, "w", 1, false).expect("the store commits again");
    d.close();
    let d = Daemonless::open(&file, true);
    assert_eq!(d.volumes(), owned(&[("t", 0), ("v", 2), ("w", 1)]));
    d.close();
}

/// A metadata write held by a `pending` injection holds the method that commits (and the
/// store's other methods, which its owner serves one at a time), and nothing else: the registry
/// is not locked meanwhile, so `bdev_error_resume_pending` answers and lets the commit finish;
/// the change is then durable.
#[test]
fn a_held_metadata_write_holds_its_method_until_resume_pending() {
    let dir = tempfile::tempdir().unwrap();
    let (file, d) = store_with_volumes(dir.path());
    d.inject("write", "pending", 1000);
    let d = Arc::new(d);
    let creating = {
        let d = d.clone();
        std::thread::spawn(move || create(&d, "w", 1, false))
    };
    let held_since = std::time::Instant::now();
    while !d.injected("write")
        || d.ok("bdev_get_iostat", json!({"name": BASE}))["bdevs"][0]["queue_depth"] == 0
    {
        assert!(held_since.elapsed() < Duration::from_secs(10), "the commit's write was not held");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(!creating.is_finished(), "bdev_lvol_create returned with its commit held");
    // No bdev for the volume before its commit is durable. (The store's own methods, such as
    // bdev_lvol_get_lvols, wait for its owner, which waits for the write.)
    assert!(d.m.disk("lvs/w").is_err(), "a bdev for a volume whose commit is held");
    // Other methods answer meanwhile, from another thread than the one waiting.
    let resume = {
        let d = d.clone();
        std::thread::spawn(move || d.ok("bdev_error_resume_pending", json!({"name": BASE})))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(resume.is_finished() && creating.is_finished()) {
        assert!(std::time::Instant::now() < deadline, "resume_pending or the create never returned");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(resume.join().unwrap(), json!(true));
    creating.join().unwrap().expect("the create once its write was resumed");
    let d = Arc::into_inner(d).unwrap();
    assert_eq!(d.volumes(), owned(&[("t", 0), ("v", 2), ("w", 1)]));
    d.close();
    let d = Daemonless::open(&file, true);
    assert_eq!(d.volumes(), owned(&[("t", 0), ("v", 2), ("w", 1)]), "after a reload");
    d.close();
}
