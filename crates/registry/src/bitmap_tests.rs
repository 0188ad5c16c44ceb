//! Dirty bitmaps through the registry's methods: writes on a disk's channel show up in
//! get_extents; every refusal names its field and changes nothing; persistent bitmaps survive a
//! clean stop and come back inconsistent after a crash (a file left IN_USE).

use fp_bdev::{sync_io, IoOp, IoRequest, Iovecs};
use serde_json::{json, Value};

use crate::{Registry, RegistryOptions};

struct Fixture {
    registry: std::sync::Arc<Registry>,
    _dir: tempfile::TempDir,
}

fn fixture(state_dir: Option<&std::path::Path>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let options =
        RegistryOptions { state_dir: state_dir.map(|p| p.to_path_buf()), ..RegistryOptions::default() };
    let registry = Registry::with_options(Vec::new(), dir.path(), options);
    Fixture { registry, _dir: dir }
}

impl Fixture {
    /// Writes `len` bytes at `offset` of `bdev` through its disk (as an export would).
    fn write(&self, bdev: &str, op: IoOp, offset: u64, len: u64) {
        let disk = self.registry.disk(bdev).unwrap();
        let mut ch = disk.open().unwrap();
        // Kept until `run` has waited for the request.
        let mut buf = fp_bdev::iov::BounceBuf::zeroed(len as usize);
        let iov = if op == IoOp::Write { buf.iovecs(len as usize) } else { Iovecs::NONE };
        let req = IoRequest { tag: 1, op, offset, len, iov };
        sync_io::run(&mut *ch, &req, &mut || false).unwrap();
    }

    fn extents(&self, bdev: &str, name: &str) -> Value {
        self.registry
            .call_json("bdev_dirty_bitmap_get_extents", json!({ "bdev": bdev, "name": name }))
            .unwrap()["extents"]
            .clone()
    }

    fn list(&self) -> Value {
        self.registry.call_json("bdev_dirty_bitmap_list", json!({})).unwrap()
    }
}

/// The field a -32602 refusal names.
fn refused_field(e: fp_rpc::RpcError) -> String {
    assert_eq!(e.code, -32602, "{e:?}");
    e.message.split(':').next().unwrap().to_string()
}

#[test]
fn writes_show_up_exactly_and_clear_enable_disable_merge_act() {
    let f = fixture(None);
    f.registry.malloc_for_test("m0", 2048);
    f.registry
        .call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "a", "granularity": 4096 }))
        .unwrap();
    f.registry
        .call_json(
            "bdev_dirty_bitmap_add",
            json!({ "bdev": "m0", "name": "b", "granularity": 4096, "disabled": true }),
        )
        .unwrap();
    f.write("m0", IoOp::Write, 8192, 512);
    f.write("m0", IoOp::WriteZeroes, 65536, 8192);
    assert_eq!(
        f.extents("m0", "a"),
        json!([{ "offset": 8192, "length": 4096 }, { "offset": 65536, "length": 8192 }])
    );
    assert_eq!(f.extents("m0", "b"), json!([]));
    let list = f.list();
    assert_eq!(
        list[0],
        json!({ "bdev": "m0", "name": "a", "granularity": 4096, "recording": true, "persistent": false,
                "inconsistent": false, "count": 12288, "busy": false })
    );
    assert_eq!(list[1]["recording"], false);
    f.registry
        .call_json("bdev_dirty_bitmap_merge", json!({ "bdev": "m0", "target": "b", "bitmaps": ["a"] }))
        .unwrap();
    f.registry.call_json("bdev_dirty_bitmap_clear", json!({ "bdev": "m0", "name": "a" })).unwrap();
    assert_eq!(f.extents("m0", "a"), json!([]));
    assert_eq!(f.list()[1]["count"], 12288);
    f.registry.call_json("bdev_dirty_bitmap_disable", json!({ "bdev": "m0", "name": "a" })).unwrap();
    f.write("m0", IoOp::Write, 0, 512);
    assert_eq!(f.extents("m0", "a"), json!([]));
    f.registry.call_json("bdev_dirty_bitmap_enable", json!({ "bdev": "m0", "name": "a" })).unwrap();
    f.write("m0", IoOp::Discard, 0, 512);
    assert_eq!(f.extents("m0", "a"), json!([{ "offset": 0, "length": 4096 }]));
    // A range: cut to it.
    let r = f.registry.call_json(
        "bdev_dirty_bitmap_get_extents",
        json!({ "bdev": "m0", "name": "b", "offset": 66000, "length": 100 }),
    );
    assert_eq!(r.unwrap(), json!({ "extents": [{ "offset": 66000, "length": 100 }], "next": null }));
    f.registry.call_json("bdev_dirty_bitmap_remove", json!({ "bdev": "m0", "name": "a" })).unwrap();
    assert_eq!(f.list().as_array().unwrap().len(), 1);
    // The bitmaps go with the bdev.
    f.registry.delete_bdev("m0", None).unwrap();
    assert_eq!(f.list(), json!([]));
}

#[test]
fn writes_through_a_stacked_bdev_mark_the_bases_bitmaps() {
    let f = fixture(None);
    f.registry.malloc_for_test("m0", 2048);
    f.registry.call_json("bdev_error_create", json!({ "base_name": "m0" })).unwrap();
    f.registry.call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "base" })).unwrap();
    f.registry.call_json("bdev_dirty_bitmap_add", json!({ "bdev": "EE_m0", "name": "top" })).unwrap();
    f.write("EE_m0", IoOp::Write, 131072, 4096);
    let want = json!([{ "offset": 131072, "length": 65536 }]);
    assert_eq!(f.extents("m0", "base"), want);
    assert_eq!(f.extents("EE_m0", "top"), want);
}

#[test]
fn refusals_name_the_field_and_change_nothing() {
    let f = fixture(None);
    f.registry.malloc_for_test("m0", 2048);
    f.registry.call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "a" })).unwrap();
    f.registry
        .call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "fine", "granularity": 512 }))
        .unwrap();
    let add = |p: Value| refused_field(f.registry.call_json("bdev_dirty_bitmap_add", p).unwrap_err());
    assert_eq!(add(json!({ "bdev": "m0", "name": "x", "granularity": 3000 })), "granularity");
    assert_eq!(add(json!({ "bdev": "m0", "name": "x", "granularity": 256 })), "granularity");
    assert_eq!(add(json!({ "bdev": "m0", "name": "x", "persistent": true })), "persistent");
    assert_eq!(add(json!({ "bdev": "m0", "name": "" })), "name");
    assert_eq!(add(json!({ "bdev": "m0", "name": "a/b" })), "name");
    assert_eq!(add(json!({ "bdev": "m0", "name": "x", "colour": 1 })), "colour");
    let e = f.registry.call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "a" })).unwrap_err();
    assert_eq!(e.code, -libc::EEXIST, "{e:?}");
    let merge = |p: Value| refused_field(f.registry.call_json("bdev_dirty_bitmap_merge", p).unwrap_err());
    assert_eq!(merge(json!({ "bdev": "m0", "target": "a", "bitmaps": ["fine"] })), "bitmaps");
    assert_eq!(merge(json!({ "bdev": "m0", "target": "a", "bitmaps": [] })), "bitmaps");
    assert_eq!(merge(json!({ "bdev": "m0", "target": "nope", "bitmaps": ["a"] })), "target");
    assert_eq!(merge(json!({ "bdev": "m0", "target": "a", "bitmaps": ["nope"] })), "bitmaps");
    for m in ["bdev_dirty_bitmap_remove", "bdev_dirty_bitmap_clear", "bdev_dirty_bitmap_enable"] {
        assert_eq!(
            refused_field(f.registry.call_json(m, json!({ "bdev": "m0", "name": "nope" })).unwrap_err()),
            "name",
            "{m}"
        );
    }
    let e = f
        .registry
        .call_json("bdev_dirty_bitmap_get_extents", json!({ "bdev": "m0", "name": "a", "offset": 1 << 30 }));
    assert_eq!(refused_field(e.unwrap_err()), "offset");
    let e = f.registry.call_json("bdev_dirty_bitmap_list", json!({ "bdev": "nope" })).unwrap_err();
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    assert_eq!(f.list().as_array().unwrap().len(), 2, "nothing added or removed");
}

#[test]
fn iostat_off_refuses_bitmaps() {
    let dir = tempfile::tempdir().unwrap();
    let options = RegistryOptions { iostat: false, ..RegistryOptions::default() };
    let registry = Registry::with_options(Vec::new(), dir.path(), options);
    let p = json!({ "name": "m0", "num_blocks": 64, "block_size": 512 });
    registry.call_module("bdev_malloc_create", Some(p)).unwrap().unwrap();
    let e = registry.call("bdev_dirty_bitmap_add", Some(json!({ "bdev": "m0", "name": "a" }))).unwrap_err();
    assert_eq!(e.to_rpc().code, -libc::EOPNOTSUPP);
}

#[test]
fn a_persistent_bitmap_survives_a_clean_stop_and_a_crash_leaves_it_inconsistent() {
    let state = tempfile::tempdir().unwrap();
    // First life: add, write, stop cleanly.
    {
        let f = fixture(Some(state.path()));
        f.registry.malloc_for_test("m0", 2048);
        f.registry
            .call_json(
                "bdev_dirty_bitmap_add",
                json!({ "bdev": "m0", "name": "p", "persistent": true, "granularity": 4096 }),
            )
            .unwrap();
        f.registry.call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "gone" })).unwrap();
        f.write("m0", IoOp::Write, 4096, 4096);
        f.registry.shutdown();
    }
    // Second life: the bits are back (the non-persistent bitmap is not); then a crash (no
    // shutdown: the file stays IN_USE).
    {
        let f = fixture(Some(state.path()));
        f.registry.malloc_for_test("m0", 2048);
        assert_eq!(f.list().as_array().unwrap().len(), 1);
        assert_eq!(f.list()[0]["persistent"], true);
        assert_eq!(f.list()[0]["inconsistent"], false);
        assert_eq!(f.extents("m0", "p"), json!([{ "offset": 4096, "length": 4096 }]));
        f.write("m0", IoOp::Write, 0, 512);
    }
    // Third life: inconsistent, refused but for removal, which deletes the file.
    let f = fixture(Some(state.path()));
    f.registry.malloc_for_test("m0", 2048);
    assert_eq!(f.list()[0]["inconsistent"], true);
    let e = f
        .registry
        .call_json("bdev_dirty_bitmap_get_extents", json!({ "bdev": "m0", "name": "p" }))
        .unwrap_err();
    assert!(e.message.contains("inconsistent"), "{e:?}");
    f.registry
        .call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "q", "granularity": 4096 }))
        .unwrap();
    assert_eq!(
        refused_field(
            f.registry
                .call_json(
                    "bdev_dirty_bitmap_merge",
                    json!({ "bdev": "m0", "target": "q", "bitmaps": ["p"] })
                )
                .unwrap_err()
        ),
        "bitmaps"
    );
    f.registry.call_json("bdev_dirty_bitmap_remove", json!({ "bdev": "m0", "name": "p" })).unwrap();
    assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 0);
}

#[test]
fn a_file_for_another_size_is_never_applied_and_a_deleted_bdev_saves_its_bitmaps() {
    let state = tempfile::tempdir().unwrap();
    {
        let f = fixture(Some(state.path()));
        f.registry.malloc_for_test("m0", 2048);
        f.registry
            .call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "p", "persistent": true }))
            .unwrap();
        f.write("m0", IoOp::Write, 0, 512);
        // Deleting the bdev closes its bitmaps cleanly: a bdev of this name and size gets them.
        f.registry.delete_bdev("m0", None).unwrap();
        f.registry.malloc_for_test("m0", 2048);
        assert_eq!(f.list()[0]["inconsistent"], false);
        assert_eq!(f.extents("m0", "p"), json!([{ "offset": 0, "length": 65536 }]));
        f.registry.delete_bdev("m0", None).unwrap();
        // Another size: not applied, the file left alone.
        f.registry.malloc_for_test("m0", 4096);
        assert_eq!(f.list(), json!([]));
    }
    assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 1);
}
