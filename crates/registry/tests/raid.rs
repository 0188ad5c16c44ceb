//! The raid module through the registry, as the RPC server drives it: SPDK's methods and
//! shapes, I/O through the raid's disk landing on every replica, the refusals (each naming
//! its field), and assembly from superblocks by examine (delay bdevs over RAM disks stand for
//! replicas that go and come back: deleting and recreating a delay bdev re-examines it).

use std::sync::Arc;

use fp_bdev::conformance::{read_range, write_range};
use fp_registry::Registry;
use fp_rpc::codes;
use serde_json::{json, Value};

fn registry() -> (Arc<Registry>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let m = Registry::new(vec![], &dir.path().join("vhost"));
    (m, dir)
}

fn ok(m: &Registry, method: &str, params: Value) -> Value {
    m.call(method, (!params.is_null()).then_some(params)).unwrap_or_else(|e| panic!("{method}: {e}"))
}

fn err(m: &Registry, method: &str, params: Value) -> fp_rpc::RpcError {
    m.call(method, (!params.is_null()).then_some(params))
        .map(|v| panic!("{method} gave {v}"))
        .unwrap_err()
        .to_rpc()
}

fn assert_param(e: &fp_rpc::RpcError, field: &str) {
    assert_eq!(e.code, codes::INVALID_PARAMS, "{e:?}");
    assert!(e.message.starts_with(&format!("{field}: ")), "{e:?} does not name {field}");
}

fn malloc(m: &Registry, name: &str, mib: u64, block_size: u64) {
    let blocks = (mib << 20) / block_size;
    ok(m, "bdev_malloc_create", json!({"name": name, "num_blocks": blocks, "block_size": block_size}));
}

fn delay(m: &Registry, name: &str, base: &str) {
    ok(
        m,
        "bdev_delay_create",
        json!({"name": name, "base_bdev_name": base, "avg_read_latency": 0, "p99_read_latency": 0,
               "avg_write_latency": 0, "p99_write_latency": 0}),
    );
}

/// `n` replicas: delay bdevs `d<i>` over 8 MiB RAM disks `m<i>`.
fn replicas(m: &Registry, n: usize) {
    for i in 0..n {
        malloc(m, &format!("m{i}"), 8, 512);
        delay(m, &format!("d{i}"), &format!("m{i}"));
    }
}

fn raids(m: &Registry, category: &str) -> Vec<Value> {
    ok(m, "bdev_raid_get_bdevs", json!({"category": category})).as_array().unwrap().clone()
}

fn raid(m: &Registry, name: &str) -> Value {
    raids(m, "all").into_iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no raid {name}"))
}

/// Waits (10 s at most) until the raid's slots are `want`.
fn wait_slots(m: &Registry, name: &str, want: Value) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = raid(m, name);
        if r["flashpath"]["slots"] == want {
            return r;
        }
        assert!(std::time::Instant::now() < deadline, "slots stay {}", r["flashpath"]["slots"]);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

#[test]
fn raid1_by_rpc_in_spdk_shapes_with_data_on_both_replicas() {
    let (m, _dir) = registry();
    malloc(&m, "m0", 4, 512);
    malloc(&m, "m1", 5, 512);
    let r =
        ok(&m, "bdev_raid_create", json!({"name": "r1", "raid_level": "raid1", "base_bdevs": ["m0", "m1"]}));
    assert_eq!(r, json!(true));
    let info = raid(&m, "r1");
    assert_eq!(info["state"], "online");
    assert_eq!(info["raid_level"], "raid1");
    assert_eq!(info["strip_size_kb"], 0);
    assert_eq!(info["superblock"], false);
    assert_eq!(info["num_base_bdevs"], 2);
    assert_eq!(info["num_base_bdevs_discovered"], 2);
    assert_eq!(info["num_base_bdevs_operational"], 2);
    assert_eq!(info["base_bdevs_list"][1]["name"], "m1");
    assert_eq!(info["base_bdevs_list"][0]["is_configured"], true);
    // The smaller base decides (SPDK-like).
    assert_eq!(info["base_bdevs_list"][0]["data_size"], 4 * 2048);
    assert_eq!(info["flashpath"]["slots"], json!(["active", "active"]));
    assert_eq!(raids(&m, "online").len(), 1);
    assert!(raids(&m, "configuring").is_empty());
    let b = ok(&m, "bdev_get_bdevs", json!({"name": "r1"}));
    assert_eq!(b[0]["num_blocks"], 4 * 2048);
    assert_eq!(b[0]["driver_specific"]["raid"]["raid_level"], "raid1");
    // Both bases are claimed by the raid.
    assert_eq!(err(&m, "bdev_malloc_delete", json!({"name": "m0"})).code, -libc::EBUSY);

    let data = pattern(4, 64 << 10);
    let mut ch = m.disk("r1").unwrap().open().unwrap();
    write_range(&mut *ch, 1 << 20, &data);
    assert!(read_range(&mut *ch, 1 << 20, data.len()) == data);
    drop(ch);
    for base in ["m0", "m1"] {
        let mut ch = m.disk(base).unwrap().open().unwrap();
        assert!(read_range(&mut *ch, 1 << 20, data.len()) == data, "{base}");
    }

    ok(&m, "bdev_raid_delete", json!({"name": "r1"}));
    assert!(raids(&m, "all").is_empty());
    ok(&m, "bdev_malloc_delete", json!({"name": "m0"}));
    assert_eq!(err(&m, "bdev_raid_delete", json!({"name": "r1"})).code, -libc::ENODEV);
}

#[test]
fn raid0_and_concat_take_spdk_parameters_and_old_names() {
    let (m, _dir) = registry();
    for n in ["a", "b", "c", "d"] {
        malloc(&m, n, 2, 512);
    }
    // rpc.py sends a list; older clients one space-separated string; `strip_size` is the old name.
    ok(
        &m,
        "bdev_raid_create",
        json!({"name": "r0", "raid_level": "0", "base_bdevs": "a b", "strip_size": 64}),
    );
    ok(
        &m,
        "bdev_raid_create",
        json!({"name": "cc", "raid_level": "concat", "base_bdevs": ["c", "d"], "strip_size_kb": 4, "superblock": false}),
    );
    let r0 = raid(&m, "r0");
    assert_eq!((r0["raid_level"].clone(), r0["strip_size_kb"].clone()), (json!("raid0"), json!(64)));
    let b = ok(&m, "bdev_get_bdevs", json!({"name": "r0"}));
    assert_eq!(b[0]["num_blocks"], 2 * 4096);
    let data = pattern(1, 192 << 10);
    for name in ["r0", "cc"] {
        let mut ch = m.disk(name).unwrap().open().unwrap();
        write_range(&mut *ch, (2 << 20) - (64 << 10), &data);
        assert!(read_range(&mut *ch, (2 << 20) - (64 << 10), data.len()) == data, "{name}");
    }
    // No redundancy: no base leaves, none joins.
    assert_param(&err(&m, "bdev_raid_remove_base_bdev", json!({"name": "a"})), "name");
    malloc(&m, "e", 2, 512);
    assert_param(
        &err(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r0", "base_bdev": "e"})),
        "raid_bdev",
    );
}

#[test]
fn every_refusal_names_its_field() {
    let (m, _dir) = registry();
    malloc(&m, "m0", 4, 512);
    malloc(&m, "m1", 4, 512);
    malloc(&m, "k", 4, 4096);
    malloc(&m, "tiny", 1, 512);
    let create = |p: Value| err(&m, "bdev_raid_create", p);
    assert_param(
        &create(
            json!({"name": "r", "raid_level": "raid5f", "base_bdevs": ["m0", "m1"], "strip_size_kb": 64}),
        ),
        "raid_level",
    );
    assert_param(
        &create(json!({"name": "r", "raid_level": "raid0", "base_bdevs": ["m0", "m1"], "strip_size_kb": 48})),
        "strip_size_kb",
    );
    assert_param(
        &create(json!({"name": "r", "raid_level": "raid0", "base_bdevs": ["m0", "m1"]})),
        "strip_size_kb",
    );
    assert_param(
        &create(json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "m1"], "strip_size_kb": 64})),
        "strip_size_kb",
    );
    assert_param(
        &create(json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "m0"]})),
        "base_bdevs",
    );
    assert_param(&create(json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0"]})), "base_bdevs");
    assert_param(
        &create(json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "k"]})),
        "base_bdevs",
    );
    assert_param(
        &create(json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "m1"], "uuid": "nope"})),
        "uuid",
    );
    assert_param(
        &create(json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "m1"], "bogus": 1})),
        "bogus",
    );
    assert_eq!(
        create(json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "nosuch"]})).code,
        -libc::ENODEV
    );
    // Every refusal left the bases unclaimed.
    ok(&m, "bdev_raid_create", json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "m1"]}));
    // A base claimed elsewhere (here: by the raid just made).
    malloc(&m, "m2", 4, 512);
    assert_eq!(
        create(json!({"name": "s", "raid_level": "raid1", "base_bdevs": ["m2", "m1"]})).code,
        -libc::EBUSY
    );
    assert_eq!(
        create(json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m2", "tiny"]})).code,
        -libc::EEXIST
    );
    // The last active replica never leaves; a too small or mismatched one never joins.
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "m1"}));
    assert_eq!(raid(&m, "r")["flashpath"]["slots"], json!(["active", "failed"]));
    assert_eq!(raid(&m, "r")["num_base_bdevs_operational"], 1);
    assert_param(&err(&m, "bdev_raid_remove_base_bdev", json!({"name": "m0"})), "name");
    assert_param(
        &err(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "tiny"})),
        "base_bdev",
    );
    assert_param(
        &err(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "k"})),
        "base_bdev",
    );
    assert_param(
        &err(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "m0"})),
        "base_bdev",
    );
    assert_param(&err(&m, "bdev_raid_get_bdevs", json!({"category": "some"})), "category");
    assert_param(
        &err(&m, "bdev_raid_set_options", json!({"process_window_size_kb": 0})),
        "process_window_size_kb",
    );
    for weight in [0, 101] {
        assert_param(&err(&m, "bdev_raid_set_options", json!({"process_weight": weight})), "process_weight");
    }
    ok(
        &m,
        "bdev_raid_set_options",
        json!({"process_window_size_kb": 2048, "process_max_bandwidth_mb_sec": 100, "process_weight": 50}),
    );
    // A removed base is free again; it rejoins, rebuilt in full (no superblock), and the
    // slot is taken.
    ok(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "m1"}));
    let r = wait_slots(&m, "r", json!(["active", "active"]));
    assert_eq!(r["flashpath"]["rebuilds_completed"], 1);
    assert_eq!(r["flashpath"]["rebuild_bytes_copied"], 4 << 20);
    assert_eq!(
        err(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "m2"})).code,
        -libc::EBUSY
    );
}

fn create_sb(m: &Registry, name: &str, bases: &[&str]) {
    ok(
        m,
        "bdev_raid_create",
        json!({"name": name, "raid_level": "raid1", "base_bdevs": bases, "superblock": true}),
    );
}

#[test]
fn examine_assembles_from_superblocks_and_create_is_idempotent() {
    let (m, _dir) = registry();
    malloc(&m, "m0", 8, 512);
    malloc(&m, "m1", 8, 512);
    delay(&m, "d0", "m0");
    delay(&m, "d1", "m1");
    create_sb(&m, "r", &["d0", "d1"]);
    let info = raid(&m, "r");
    let uuid = info["uuid"].clone();
    assert_eq!(info["superblock"], true);
    let offset = info["base_bdevs_list"][0]["data_offset"].as_u64().unwrap();
    assert!(offset > 0 && (offset * 512).is_multiple_of(1 << 20), "data_offset {offset}");
    let data = pattern(8, 32 << 10);
    let mut ch = m.disk("r").unwrap().open().unwrap();
    write_range(&mut *ch, 0, &data);
    drop(ch);
    // The daemon "restarts": the raid goes, the replicas go and come back one by one.
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    ok(&m, "bdev_delay_delete", json!({"name": "d0"}));
    ok(&m, "bdev_delay_delete", json!({"name": "d1"}));
    delay(&m, "d1", "m1");
    let c = raid(&m, "r");
    assert_eq!(c["state"], "configuring");
    assert_eq!(c["uuid"], uuid);
    assert_eq!(c["num_base_bdevs_discovered"], 1);
    assert_eq!(raids(&m, "configuring").len(), 1);
    assert_eq!(
        err(&m, "bdev_delay_delete", json!({"name": "d1"})).code,
        -libc::EBUSY,
        "claimed while configuring"
    );
    // Its only base removed, the configuring raid is forgotten; the base comes back.
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "d1"}));
    assert!(raids(&m, "all").is_empty());
    ok(&m, "bdev_delay_delete", json!({"name": "d1"}));
    delay(&m, "d1", "m1");
    assert_eq!(raid(&m, "r")["state"], "configuring");
    // A configuration file creating it now: accepted, still configuring.
    create_sb(&m, "r", &["d0", "d1"]);
    assert_eq!(raid(&m, "r")["state"], "configuring");
    delay(&m, "d0", "m0");
    let r = raid(&m, "r");
    assert_eq!(r["state"], "online");
    assert_eq!(r["uuid"], uuid);
    assert_eq!(r["flashpath"]["slots"], json!(["active", "active"]));
    let mut ch = m.disk("r").unwrap().open().unwrap();
    assert!(read_range(&mut *ch, 0, data.len()) == data);
    drop(ch);
    // A configuration file creating it again: accepted, unchanged.
    create_sb(&m, "r", &["d0", "d1"]);
    assert_eq!(raid(&m, "r")["uuid"], uuid);
    // Not the same raid: refused.
    assert_eq!(
        err(
            &m,
            "bdev_raid_create",
            json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["d1", "d0"], "superblock": true})
        )
        .code,
        -libc::EEXIST
    );
}

#[test]
fn another_raids_superblock_is_refused_and_a_stale_replica_is_rebuilt() {
    let (m, _dir) = registry();
    replicas(&m, 4);
    create_sb(&m, "r", &["d0", "d1"]);
    // d1 leaves (its superblock stays at the old seq), then the raid stops.
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "d1"}));
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    for d in ["d0", "d1"] {
        ok(&m, "bdev_delay_delete", json!({"name": d}));
    }
    // Another raid of the same name takes the name first.
    create_sb(&m, "r", &["d2", "d3"]);
    let other = raid(&m, "r")["uuid"].clone();
    delay(&m, "d0", "m0");
    assert_eq!(raid(&m, "r")["uuid"], other);
    ok(&m, "bdev_delay_delete", json!({"name": "d0"})); // not claimed: refused by the raid
    ok(&m, "bdev_raid_delete", json!({"name": "r", "clear_sb": true}));
    // The first raid comes back: d0 alone is enough (d1 is Failed in the newest superblock).
    delay(&m, "d0", "m0");
    let r = raid(&m, "r");
    assert_eq!(r["state"], "online");
    assert_eq!(r["flashpath"]["slots"], json!(["active", "failed"]));
    // Written while d1 is away: only that chunk is dirty.
    let data = pattern(3, 16 << 10);
    let mut ch = m.disk("r").unwrap().open().unwrap();
    write_range(&mut *ch, 1 << 20, &data);
    drop(ch);
    assert_eq!(raid(&m, "r")["flashpath"]["degraded_bytes_written"], 16 << 10);
    // The stale replica returns: it joins its slot as a rebuild target, never as a source,
    // and gets only what it missed.
    delay(&m, "d1", "m1");
    let r = wait_slots(&m, "r", json!(["active", "active"]));
    let chunk = r["flashpath"]["bitmap_chunk_bytes"].as_u64().unwrap();
    assert_eq!(r["flashpath"]["rebuild_bytes_copied"], chunk, "a partial rebuild of one chunk");
    let offset = r["base_bdevs_list"][1]["data_offset"].as_u64().unwrap() * 512;
    let mut ch = m.disk("m1").unwrap().open().unwrap();
    assert!(read_range(&mut *ch, offset + (1 << 20), data.len()) == data);
    drop(ch);
    // The cleared bases carry no superblock any more: nothing is assembled from them.
    ok(&m, "bdev_delay_delete", json!({"name": "d2"}));
    delay(&m, "d2", "m2");
    assert_eq!(raids(&m, "all").len(), 1);
}

/// A corrupted bitmap page is never trusted: its chunks count as dirty (and are counted), so
/// the next rebuild copies them rather than skipping what it cannot know.
#[test]
fn a_corrupted_bitmap_page_is_treated_as_all_dirty() {
    let (m, _dir) = registry();
    replicas(&m, 2);
    create_sb(&m, "r", &["d0", "d1"]);
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    ok(&m, "bdev_delay_delete", json!({"name": "d0"}));
    ok(&m, "bdev_delay_delete", json!({"name": "d1"}));
    // Garbage over the first bitmap page (page 2) of m0.
    let mut ch = m.disk("m0").unwrap().open().unwrap();
    write_range(&mut *ch, 2 * 4096, &pattern(99, 4096));
    drop(ch);
    delay(&m, "d0", "m0");
    delay(&m, "d1", "m1");
    let r = raid(&m, "r");
    assert_eq!(r["state"], "online");
    assert_eq!(r["flashpath"]["bitmap_pages_corrupt"], 1);
}

/// `bdev_raid_add_base_bdev` refuses a base that carries another raid's superblock: its data
/// belongs elsewhere, and it is never overwritten by surprise.
#[test]
fn a_base_of_another_raid_is_refused_by_add() {
    let (m, _dir) = registry();
    replicas(&m, 4);
    create_sb(&m, "x", &["d0", "d1"]);
    create_sb(&m, "y", &["d2", "d3"]);
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "d1"}));
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "d3"}));
    assert_param(
        &err(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "y", "base_bdev": "d1"})),
        "base_bdev",
    );
    // Refused and released: its own raid takes it back.
    ok(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "x", "base_bdev": "d1"}));
    wait_slots(&m, "x", json!(["active", "active"]));
}

/// A rebuild shows as SPDK's `process` while it runs; `bdev_raid_set_options` reaches the
/// running raids (a speed limit holds it back, lifting it lets it finish).
#[test]
fn a_rebuild_shows_its_progress_and_follows_set_options() {
    let (m, _dir) = registry();
    replicas(&m, 2);
    ok(&m, "bdev_raid_set_options", json!({"process_window_size_kb": 64, "process_max_bandwidth_mb_sec": 1}));
    ok(&m, "bdev_raid_create", json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["d0", "d1"]}));
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "d1"}));
    ok(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "d1"}));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let p = loop {
        let r = raid(&m, "r");
        if r["process"]["progress"]["blocks"].as_u64().is_some_and(|b| b > 0) {
            break r["process"].clone();
        }
        assert!(std::time::Instant::now() < deadline, "no progress: {r}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(p["type"], "rebuild");
    assert_eq!(p["target"], "d1");
    assert!(p["progress"]["percent"].as_u64().unwrap() < 100, "{p}");
    assert_eq!(raid(&m, "r")["flashpath"]["slots"], json!(["active", "rebuilding"]));
    ok(&m, "bdev_raid_set_options", json!({"process_max_bandwidth_mb_sec": 0}));
    let r = wait_slots(&m, "r", json!(["active", "active"]));
    assert!(r.get("process").is_none(), "{r}");
}

/// A full rebuild's target that appears only after the raid assembled without it resumes its
/// full rebuild from the checkpoint (catching up below it from the bitmap), never as a partial
/// one: its copy was never complete, so the bitmap alone does not cover what it lacks.
#[test]
fn a_full_rebuild_target_returning_late_resumes_in_full() {
    for assemble_with_it in [false, true] {
        full_rebuild_target_returns_late(assemble_with_it);
    }
}

fn full_rebuild_target_returns_late(assemble_with_it: bool) {
    let (m, _dir) = registry();
    replicas(&m, 3);
    ok(&m, "bdev_raid_set_options", json!({"process_window_size_kb": 64, "process_max_bandwidth_mb_sec": 1}));
    create_sb(&m, "r", &["d0", "d1"]);
    let data = pattern(7, 1 << 20);
    let mut ch = m.disk("r").unwrap().open().unwrap();
    write_range(&mut *ch, 0, &data);
    drop(ch);
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "d1"}));
    ok(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "d2"}));
    assert_eq!(raid(&m, "r")["flashpath"]["rebuild_kind"], "full");
    // Stopped mid-rebuild; d0 comes back first, the raid assembles without d2.
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    ok(&m, "bdev_delay_delete", json!({"name": "d0"}));
    ok(&m, "bdev_delay_delete", json!({"name": "d2"}));
    delay(&m, "d0", "m0");
    assert_eq!(raid(&m, "r")["state"], "online");
    assert_eq!(raid(&m, "r")["flashpath"]["slots"], json!(["active", "failed"]));
    ok(&m, "bdev_raid_set_options", json!({"process_max_bandwidth_mb_sec": 0}));
    if assemble_with_it {
        // Stopped again, d2's record (still Rebuilding, its checkpoint) in d0's superblock; d2
        // appears first this time, and joins at assembly.
        ok(&m, "bdev_raid_delete", json!({"name": "r"}));
        ok(&m, "bdev_delay_delete", json!({"name": "d0"}));
        delay(&m, "d2", "m2");
        assert_eq!(raid(&m, "r")["state"], "configuring");
        delay(&m, "d0", "m0");
    } else {
        delay(&m, "d2", "m2");
    }
    let r = wait_slots(&m, "r", json!(["active", "active"]));
    assert_eq!(r["flashpath"]["rebuild_kind"], "none", "{r:#}");
    let size = r["base_bdevs_list"][0]["data_size"].as_u64().unwrap() * 512;
    let copied = r["flashpath"]["rebuild_bytes_copied"].as_u64().unwrap();
    assert!(copied > 0 && copied <= size, "copied {copied} of {size}: {r:#}");
    // Both replicas hold the same data region, the written megabyte included.
    let offset = r["base_bdevs_list"][0]["data_offset"].as_u64().unwrap() * 512;
    let region = |b: &str| read_range(&mut *m.disk(b).unwrap().open().unwrap(), offset, size as usize);
    let (a, b) = (region("m0"), region("m2"));
    assert!(a == b, "the replicas differ after the resumed rebuild");
    assert!(a[..data.len()] == data[..]);
}

/// raid0 and concat keep a superblock too (no bitmap): they come back by examine with their
/// data where it was.
#[test]
fn raid0_and_concat_with_a_superblock_come_back() {
    let (m, _dir) = registry();
    replicas(&m, 4);
    let data = pattern(5, 256 << 10);
    for (name, level, bases) in [("z", "raid0", ["d0", "d1"]), ("c", "concat", ["d2", "d3"])] {
        ok(
            &m,
            "bdev_raid_create",
            json!({"name": name, "raid_level": level, "base_bdevs": bases, "strip_size_kb": 64, "superblock": true}),
        );
        let mut ch = m.disk(name).unwrap().open().unwrap();
        write_range(&mut *ch, 64 << 10, &data);
        drop(ch);
        ok(&m, "bdev_raid_delete", json!({"name": name}));
        for (i, b) in bases.iter().enumerate() {
            ok(&m, "bdev_delay_delete", json!({"name": b}));
            delay(&m, b, &format!("m{}", &b[1..]));
            let want = if i == 0 { "configuring" } else { "online" };
            assert_eq!(raid(&m, name)["state"], want, "{name} after {b}");
        }
        let r = raid(&m, name);
        assert_eq!((r["raid_level"].clone(), r["superblock"].clone()), (json!(level), json!(true)));
        let mut ch = m.disk(name).unwrap().open().unwrap();
        assert!(read_range(&mut *ch, 64 << 10, data.len()) == data, "{name}");
    }
}

/// SPDK's error bdev as a failing replica: write failures injected on one raid1 base through
/// `EE_<base>` take that base out, and I/O goes on, landing on the other replica.
#[test]
fn raid1_takes_out_a_replica_whose_writes_fail_by_injection() {
    let (m, _dir) = registry();
    malloc(&m, "m0", 4, 512);
    malloc(&m, "m1", 4, 512);
    assert_eq!(ok(&m, "bdev_error_create", json!({"base_name": "m1"})), json!(true));
    ok(&m, "bdev_raid_create", json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "EE_m1"]}));
    let mut ch = m.disk("r").unwrap().open().unwrap();
    let before = pattern(1, 16 << 10);
    write_range(&mut *ch, 0, &before);
    ok(
        &m,
        "bdev_error_inject_error",
        json!({"name": "EE_m1", "io_type": "write", "error_type": "failure", "num": 1000}),
    );
    let b = ok(&m, "bdev_get_bdevs", json!({"name": "EE_m1"}));
    assert_eq!(b[0]["driver_specific"]["error"]["injections"]["write"]["num"], 1000);
    // The write succeeds on the raid (one replica took it) and the failing one is taken out.
    let after = pattern(2, 16 << 10);
    write_range(&mut *ch, 64 << 10, &after);
    wait_slots(&m, "r", json!(["active", "failed"]));
    assert_eq!(raid(&m, "r")["state"], "online");
    // I/O goes on: more writes, and reads of everything.
    let more = pattern(3, 16 << 10);
    write_range(&mut *ch, 128 << 10, &more);
    // Block 0 too: a raid without a superblock once wrote its in-memory bitmap there.
    assert!(read_range(&mut *ch, 0, before.len()) == before);
    assert!(read_range(&mut *ch, 64 << 10, after.len()) == after);
    assert!(read_range(&mut *ch, 128 << 10, more.len()) == more);
    drop(ch);
    let mut m0 = m.disk("m0").unwrap().open().unwrap();
    assert!(read_range(&mut *m0, 128 << 10, more.len()) == more);
    drop(m0);
    // Taken out, the error bdev is free again and may be deleted; the injection count shows
    // what the raid sent it before giving up on it.
    let left = ok(&m, "bdev_get_bdevs", json!({"name": "EE_m1"}))[0]["driver_specific"]["error"]
        ["injections"]["write"]["num"]
        .as_u64()
        .unwrap();
    assert!(left < 1000, "{left}");
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    ok(&m, "bdev_error_delete", json!({"name": "EE_m1"}));
    ok(&m, "bdev_malloc_delete", json!({"name": "m1"}));
}

/// A raid1 without a superblock keeps its write-intent bitmap in memory: the guest's block 0
/// on every base stays the guest's (the owner once wrote a bitmap page there after a write).
#[test]
fn raid1_without_a_superblock_writes_no_bitmap_over_data() {
    let (m, _dir) = registry();
    malloc(&m, "m0", 4, 512);
    malloc(&m, "m1", 4, 512);
    ok(&m, "bdev_raid_create", json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["m0", "m1"]}));
    let mut ch = m.disk("r").unwrap().open().unwrap();
    let data = pattern(7, 8 << 10);
    write_range(&mut *ch, 0, &data);
    write_range(&mut *ch, 1 << 20, &data);
    // The owner persists bitmaps within milliseconds of a write; give it time to.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(read_range(&mut *ch, 0, data.len()) == data);
    drop(ch);
    for base in ["m0", "m1"] {
        let mut ch = m.disk(base).unwrap().open().unwrap();
        assert!(read_range(&mut *ch, 0, data.len()) == data, "{base}");
    }
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
}

/// Whether the first `bytes` of bdev `name` are all zero (an erased superblock area).
fn zeroed(m: &Registry, name: &str, bytes: usize) -> bool {
    let mut ch = m.disk(name).unwrap().open().unwrap();
    read_range(&mut *ch, 0, bytes).iter().all(|&b| b == 0)
}

/// `clear_sb` answers an error naming each base whose superblock it could not erase (a base
/// failing writes), and still erases the others; the raid is deleted either way.
#[test]
fn delete_with_clear_sb_names_a_base_it_could_not_erase() {
    let (m, _dir) = registry();
    malloc(&m, "m0", 8, 512);
    malloc(&m, "m1", 8, 512);
    ok(&m, "bdev_error_create", json!({"base_name": "m1"}));
    create_sb(&m, "r", &["m0", "EE_m1"]);
    assert!(!zeroed(&m, "m1", 8192), "a superblock was written");
    ok(
        &m,
        "bdev_error_inject_error",
        json!({"name": "EE_m1", "io_type": "write", "error_type": "failure", "num": 1000}),
    );
    let e = err(&m, "bdev_raid_delete", json!({"name": "r", "clear_sb": true}));
    assert_eq!(e.code, -libc::EIO, "{e:?}");
    assert!(e.message.contains("'EE_m1'") && !e.message.contains("'m0'"), "{e:?}");
    assert!(raids(&m, "all").is_empty());
    assert!(zeroed(&m, "m0", 8192), "m0's superblock erased");
    assert!(!zeroed(&m, "m1", 8192), "m1's superblock kept, as the answer says");
    ok(&m, "bdev_error_delete", json!({"name": "EE_m1"}));
}

/// `clear_sb` on a raid still configuring erases the superblocks of the bases examine found:
/// the base coming back is not taken for the deleted raid again.
#[test]
fn delete_with_clear_sb_erases_a_configuring_raids_bases() {
    let (m, _dir) = registry();
    replicas(&m, 2);
    create_sb(&m, "r", &["d0", "d1"]);
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    for d in ["d0", "d1"] {
        ok(&m, "bdev_delay_delete", json!({"name": d}));
    }
    delay(&m, "d1", "m1");
    assert_eq!(raid(&m, "r")["state"], "configuring");
    ok(&m, "bdev_raid_delete", json!({"name": "r", "clear_sb": true}));
    assert!(zeroed(&m, "m1", 8192), "the configuring base's superblock erased");
    ok(&m, "bdev_delay_delete", json!({"name": "d1"}));
    delay(&m, "d1", "m1");
    assert!(raids(&m, "all").is_empty());
}

/// A base smaller than the data region its superblock records (a shrunk disk, or a crafted
/// superblock) is refused by examine and left unclaimed: the raid's I/O would run past its end.
#[test]
fn examine_refuses_a_base_smaller_than_its_superblock_says() {
    let (m, _dir) = registry();
    replicas(&m, 2);
    create_sb(&m, "r", &["d0", "d1"]);
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    // m1's superblock copies on a 2 MiB disk: it records about 7 MiB of data past 1 MiB.
    let mut ch = m.disk("m1").unwrap().open().unwrap();
    let pages = read_range(&mut *ch, 0, 8192);
    drop(ch);
    malloc(&m, "small", 2, 512);
    let mut ch = m.disk("small").unwrap().open().unwrap();
    write_range(&mut *ch, 0, &pages);
    drop(ch);
    for d in ["d0", "d1"] {
        ok(&m, "bdev_delay_delete", json!({"name": d}));
    }
    delay(&m, "ds", "small");
    assert!(raids(&m, "all").is_empty(), "a base too small was taken: {:?}", raids(&m, "all"));
    ok(&m, "bdev_delay_delete", json!({"name": "ds"}));
    // The real bases still assemble the raid.
    delay(&m, "d0", "m0");
    delay(&m, "d1", "m1");
    assert_eq!(raid(&m, "r")["state"], "online");
}

/// The registry as a module host, with a hook run right after one claim is taken: what a
/// concurrent examine (on another thread) may do between an examine's look at the raid list
/// and the moment it adds its base, made deterministic.
struct ClaimHook {
    reg: Arc<Registry>,
    base: &'static str,
    hook: std::sync::Mutex<Option<Hook>>,
}

/// What [`ClaimHook`] runs once, on the registry.
type Hook = Box<dyn FnOnce(&Registry) + Send>;

impl fp_bdev::module::ModuleHost for ClaimHook {
    fn check_new_bdev(&self, name: &str) -> Result<(), fp_bdev::module::ModuleError> {
        self.reg.check_new_bdev(name)
    }
    fn add_bdev(
        &self,
        module: &'static str,
        new: fp_bdev::module::NewBdev,
    ) -> Result<String, fp_bdev::module::ModuleError> {
        self.reg.add_bdev(module, new)
    }
    fn claimable(
        &self,
        name: &str,
        claim: fp_bdev::module::ClaimType,
    ) -> Result<fp_bdev::Bdev, fp_bdev::module::ModuleError> {
        self.reg.claimable(name, claim)
    }
    fn bdev_exists(&self, name: &str) -> bool {
        self.reg.bdev_exists(name)
    }
    fn bdev_name(&self, name: &str) -> Option<String> {
        fp_bdev::module::ModuleHost::bdev_name(&*self.reg, name)
    }
    fn set_aliases(&self, name: &str, aliases: Vec<String>) -> Result<(), fp_bdev::module::ModuleError> {
        self.reg.set_aliases(name, aliases)
    }
    fn bdev(&self, name: &str) -> Option<(fp_bdev::Bdev, &'static str)> {
        fp_bdev::module::ModuleHost::bdev(&*self.reg, name)
    }
    fn claim(
        &self,
        name: &str,
        holder_kind: &'static str,
        holder: &str,
        claim: fp_bdev::module::ClaimType,
    ) -> Result<fp_bdev::Bdev, fp_bdev::module::ModuleError> {
        let got = self.reg.claim(name, holder_kind, holder, claim);
        if name == self.base {
            if let Some(hook) = self.hook.lock().unwrap().take() {
                hook(&self.reg);
            }
        }
        got
    }
    fn release_claim(&self, name: &str, holder_kind: &'static str, holder: &str) {
        self.reg.release_claim(name, holder_kind, holder)
    }
    fn module_state(
        &self,
        module: &'static str,
        init: &dyn Fn() -> Arc<dyn std::any::Any + Send + Sync>,
    ) -> Arc<dyn std::any::Any + Send + Sync> {
        self.reg.module_state(module, init)
    }
    fn block_size(&self, name: &str) -> Result<u32, fp_bdev::module::ModuleError> {
        self.reg.block_size(name)
    }
    fn module_device(
        &self,
        name: &str,
        module: &'static str,
        kind: &'static str,
    ) -> Result<Arc<dyn std::any::Any + Send + Sync>, fp_bdev::module::ModuleError> {
        self.reg.module_device(name, module, kind)
    }
    fn resize_bdev(
        &self,
        name: &str,
        module: &'static str,
        num_blocks: u64,
    ) -> Result<(), fp_bdev::module::ModuleError> {
        self.reg.resize_bdev(name, module, num_blocks)
    }
    fn delete_bdev(&self, name: &str, module: &'static str) -> Result<(), fp_bdev::module::ModuleError> {
        fp_bdev::module::ModuleHost::delete_bdev(&*self.reg, name, module)
    }
    fn memory_limit(&self) -> u64 {
        self.reg.memory_limit()
    }
    fn check_memory_size(
        &self,
        name: &str,
        block_size: u32,
        num_blocks: u64,
    ) -> Result<(), fp_bdev::module::ModuleError> {
        self.reg.check_memory_size(name, block_size, num_blocks)
    }
    fn file_opener(
        &self,
        filename: &std::path::Path,
    ) -> Result<fp_bdev::module::FileOpener, fp_bdev::module::ModuleError> {
        self.reg.file_opener(filename)
    }
}

/// Two examines of one raid's bases at once: while one has looked at the raid (configuring)
/// and is claiming its base, the other completes and assembles the raid. The first must then
/// join the assembled raid, not trip over its configuring list being gone.
#[test]
fn an_examine_whose_raid_was_assembled_meanwhile_joins_it() {
    let (m, _dir) = registry();
    replicas(&m, 3);
    create_sb(&m, "r", &["d0", "d1", "d2"]);
    // d0 leaves: slot 0 is Failed (its identity kept) in the newest superblock of d1 and d2.
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "d0"}));
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    for d in ["d0", "d1", "d2"] {
        ok(&m, "bdev_delay_delete", json!({"name": d}));
    }
    ok(&m, "bdev_set_options", json!({"bdev_auto_examine": false}));
    replicas_back(&m);
    ok(&m, "bdev_examine", json!({"name": "d2"}));
    assert_eq!(raid(&m, "r")["state"], "configuring");
    let hooked = ClaimHook {
        reg: m.clone(),
        base: "d0",
        hook: std::sync::Mutex::new(Some(Box::new(|reg: &Registry| {
            // The other examine: d1 completes the raid (d0 is not needed: Failed), which is
            // assembled at once.
            fp_raid::examine::examine(reg, "d1", "delay");
            assert_eq!(raid(reg, "r")["state"], "online");
        }))),
    };
    fp_raid::examine::examine(&hooked, "d0", "delay");
    // d0 joined its slot back (partial rebuild) rather than being lost or crashing examine.
    wait_slots(&m, "r", json!(["active", "active", "active"]));
    assert_eq!(raid(&m, "r")["base_bdevs_list"][0]["name"], "d0");
}

/// The delay bdevs of `replicas` created again over their RAM disks.
fn replicas_back(m: &Registry) {
    for i in 0..3 {
        delay(m, &format!("d{i}"), &format!("m{i}"));
    }
}

/// Whether the bdev `name` is claimed (by anything).
fn claimed(m: &Registry, name: &str) -> bool {
    ok(m, "bdev_get_bdevs", json!({"name": name}))[0]["claimed"].as_bool().unwrap()
}

/// `bdev_raid_remove_base_bdev` of a base with a write still in flight to it (held by a
/// `pending` injection, while the raid's channel keeps being polled as a reactor would) waits
/// for it at most `REMOVE_DRAIN_WAIT`, then answers an error saying how long it waited and
/// how many requests are outstanding, and keeps the base claimed: never released under I/O.
/// Once the write ends, the base is released; the raid goes on degraded and every
/// acknowledged write reads back.
#[test]
fn removing_a_base_with_a_write_in_flight_keeps_it_claimed_until_the_write_ends() {
    use fp_bdev::conformance::{rw, IoBuf};
    use fp_bdev::{IoOp, IoStatus};
    use std::time::{Duration, Instant};

    let (m, _dir) = registry();
    for i in 0..2 {
        malloc(&m, &format!("m{i}"), 4, 512);
        ok(&m, "bdev_error_create", json!({"base_name": format!("m{i}")}));
    }
    ok(&m, "bdev_raid_create", json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["EE_m0", "EE_m1"]}));
    let mut ch = m.disk("r").unwrap().open().unwrap();
    let first = pattern(1, 16 << 10);
    write_range(&mut *ch, 0, &first);

    // The next write reaches EE_m1 and is held there.
    ok(
        &m,
        "bdev_error_inject_error",
        json!({"name": "EE_m1", "io_type": "write", "error_type": "pending", "num": 1}),
    );
    let held = pattern(2, 16 << 10);
    let mut buf = IoBuf::new(held.len(), true);
    buf.bytes_mut().copy_from_slice(&held);
    let iov = [buf.iovec()];
    // SAFETY: `buf` and `iov` outlive the request (it is polled to its end below).
    unsafe { ch.submit(&rw(7, IoOp::Write, 64 << 10, &iov)) }.unwrap();
    let mut done = Vec::new();
    for _ in 0..100 {
        ch.poll(&mut |t, s| done.push((t, s)));
    }
    assert!(done.is_empty(), "the write is held on EE_m1");
    // Its one `pending` injection is spent: EE_m1 holds the write.
    let left = ok(&m, "bdev_get_bdevs", json!({"name": "EE_m1"}))[0]["driver_specific"]["error"]
        ["injections"]["write"]["num"]
        .as_u64();
    assert!(left.is_none_or(|n| n == 0), "EE_m1 holds the write: {left:?}");

    // The removal runs on another thread (an RPC thread) while this one polls the raid's
    // channel (its reactor).
    let remover = {
        let m = m.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let r = m.call("bdev_raid_remove_base_bdev", Some(json!({"name": "EE_m1"})));
            (r.map_err(|e| e.to_rpc()), start.elapsed())
        })
    };
    while !remover.is_finished() {
        ch.poll(&mut |t, s| done.push((t, s)));
        std::thread::yield_now();
    }
    let (answer, took) = remover.join().unwrap();
    assert!(done.is_empty(), "the write is still held: {done:?}");
    let e = answer.expect_err("the removal cannot finish with a write in flight to the base");
    assert_eq!(e.code, -libc::EBUSY, "{e:?}");
    assert!(e.message.contains("EE_m1") && e.message.contains("5 s"), "{e:?}");
    assert!(e.message.contains("1 request"), "{e:?}");
    // The bound (5 s), plus a generous margin for a loaded machine.
    assert!(took >= Duration::from_secs(5) && took < Duration::from_secs(30), "{took:?}");

    // The base left the raid but stays claimed: not deleted, not reused, not added back.
    wait_slots(&m, "r", json!(["active", "failed"]));
    assert!(claimed(&m, "EE_m1"));
    assert_eq!(err(&m, "bdev_error_delete", json!({"name": "EE_m1"})).code, -libc::EBUSY);
    assert!(m
        .call("bdev_raid_add_base_bdev", Some(json!({"raid_bdev": "r", "base_bdev": "EE_m1"})))
        .is_err());
    assert!(claimed(&m, "EE_m1"));

    // The write ends: the raid completes it (EE_m0 took it too) and the base is released.
    ok(&m, "bdev_error_resume_pending", json!({"name": "EE_m1"}));
    let deadline = Instant::now() + Duration::from_secs(20);
    while done.is_empty() {
        ch.poll(&mut |t, s| done.push((t, s)));
        assert!(Instant::now() < deadline, "the held write never completed");
        std::thread::yield_now();
    }
    assert_eq!(done, [(7, IoStatus::Success)]);
    while claimed(&m, "EE_m1") {
        ch.poll(&mut |_, _| {});
        assert!(Instant::now() < deadline, "EE_m1 stays claimed after its write ended");
        std::thread::sleep(Duration::from_millis(5));
    }

    // Degraded, the raid goes on; every acknowledged write reads back.
    let last = pattern(3, 16 << 10);
    write_range(&mut *ch, 128 << 10, &last);
    assert!(read_range(&mut *ch, 0, first.len()) == first);
    assert!(read_range(&mut *ch, 64 << 10, held.len()) == held);
    assert!(read_range(&mut *ch, 128 << 10, last.len()) == last);
    assert_eq!(raid(&m, "r")["num_base_bdevs_operational"], 1);
    drop(ch);
    ok(&m, "bdev_error_delete", json!({"name": "EE_m1"}));
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
}

/// A removal with the raid's channels open but idle (nothing in flight, never polled again,
/// as on a sleeping reactor) answers at once and releases the base.
#[test]
fn removing_a_base_under_idle_channels_answers_at_once() {
    use std::time::{Duration, Instant};

    let (m, _dir) = registry();
    replicas(&m, 2);
    ok(&m, "bdev_raid_create", json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["d0", "d1"]}));
    let mut busy = m.disk("r").unwrap().open().unwrap();
    let never_used = m.disk("r").unwrap().open().unwrap();
    let data = pattern(5, 8 << 10);
    write_range(&mut *busy, 0, &data);
    let start = Instant::now();
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "d1"}));
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert!(!claimed(&m, "d1"));
    assert!(read_range(&mut *busy, 0, data.len()) == data);
    drop((busy, never_used));
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
}

/// `bdev_raid_remove_base_bdev` of a base that answers every write Busy (`nomem`, kept on
/// through the removal) while a guest write waits on it: the raid's owner was retrying its
/// bitmap write to that base and never took the removal up. The owner gives the leaving
/// base's Busy up, so the removal answers (well within its bound), the base is released, and
/// the guest write completes on the other replica.
#[test]
fn removing_a_base_that_stays_busy_answers_and_the_write_waiting_on_it_completes() {
    use fp_bdev::conformance::{rw, IoBuf};
    use fp_bdev::{IoOp, IoStatus};
    use std::time::{Duration, Instant};

    let (m, _dir) = registry();
    for i in 0..2 {
        malloc(&m, &format!("m{i}"), 8, 512);
        ok(&m, "bdev_error_create", json!({"base_name": format!("m{i}")}));
    }
    create_sb(&m, "r", &["EE_m0", "EE_m1"]);
    let mut ch = m.disk("r").unwrap().open().unwrap();
    let first = pattern(1, 16 << 10);
    write_range(&mut *ch, 0, &first);

    ok(
        &m,
        "bdev_error_inject_error",
        json!({"name": "EE_m0", "io_type": "write", "error_type": "nomem", "num": 1_000_000_000u64}),
    );
    // A write to a chunk far from the first: its bitmap bit must be made durable on both
    // bases first, and EE_m0 answers Busy to the bitmap write and to the write itself.
    let held = pattern(2, 16 << 10);
    let mut buf = IoBuf::new(held.len(), true);
    buf.bytes_mut().copy_from_slice(&held);
    let iov = [buf.iovec()];
    // SAFETY: `buf` and `iov` outlive the request (it is polled to its end below, or the
    // test fails and the process ends).
    unsafe { ch.submit(&rw(7, IoOp::Write, 2 << 20, &iov)) }.unwrap();
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        ch.poll(&mut |t, s| done.push((t, s)));
        let left = ok(&m, "bdev_get_bdevs", json!({"name": "EE_m0"}))[0]["driver_specific"]["error"]
            ["injections"]["write"]["num"]
            .as_u64()
            .unwrap();
        if left < 1_000_000_000 {
            break;
        }
        assert!(Instant::now() < deadline, "EE_m0 was never sent a write");
        std::thread::yield_now();
    }
    assert!(done.is_empty(), "the write waits on the busy EE_m0: {done:?}");

    // The removal runs on another thread (an RPC thread) while this one polls the raid's
    // channel (its reactor). The thread keeps the registry alive if it never answers.
    let remover = {
        let m = m.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let r = m.call("bdev_raid_remove_base_bdev", Some(json!({"name": "EE_m0"})));
            (r.map_err(|e| e.to_rpc()), start.elapsed())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !remover.is_finished() {
        ch.poll(&mut |t, s| done.push((t, s)));
        assert!(Instant::now() < deadline, "bdev_raid_remove_base_bdev never answered (EE_m0 stays busy)");
        std::thread::yield_now();
    }
    let (answer, took) = remover.join().unwrap();
    assert_eq!(answer.unwrap(), json!(true));
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(!claimed(&m, "EE_m0"), "the removed base is released");
    while done.is_empty() {
        ch.poll(&mut |t, s| done.push((t, s)));
        assert!(Instant::now() < deadline, "the write waiting on EE_m0 never completed");
        std::thread::yield_now();
    }
    assert_eq!(done, [(7, IoStatus::Success)]);
    let r = wait_slots(&m, "r", json!(["failed", "active"]));
    // Asked for, not a failure of the base.
    assert_eq!(r["flashpath"]["base_failures"], 0, "{r}");

    assert!(read_range(&mut *ch, 0, first.len()) == first);
    assert!(read_range(&mut *ch, 2 << 20, held.len()) == held);
    drop(ch);
    let mut m1 = m.disk("m1").unwrap().open().unwrap();
    let data_offset = raid(&m, "r")["base_bdevs_list"][1]["data_offset"].as_u64().unwrap() * 512;
    assert!(read_range(&mut *m1, data_offset + (2 << 20), held.len()) == held);
    drop(m1);
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    ok(&m, "bdev_error_delete", json!({"name": "EE_m0"}));
}

/// The memory of the write `owner_stuck_on_a_busy_base` leaves waiting.
struct HeldWrite {
    _buf: fp_bdev::conformance::IoBuf,
    _iov: Box<[libc::iovec; 1]>,
}

/// A raid1 "r" with a superblock whose owner is stuck on a busy base: "r" over EE_m0 and m1
/// (and a third slot, left free by removing m2, when `free_slot`); EE_m0 answers every write
/// Busy (`nomem`) and a guest write (tag 7, `buf`) to a chunk not written before waits for
/// its bitmap bit, which the owner keeps retrying on EE_m0. Returns once EE_m0 was sent the
/// owner's first write. The write's buffer and iovec are returned with the channel: they
/// must outlive the write.
fn owner_stuck_on_a_busy_base(m: &Registry, free_slot: bool) -> (Box<dyn fp_bdev::IoChannel>, HeldWrite) {
    use fp_bdev::conformance::{rw, IoBuf};
    use fp_bdev::IoOp;
    use std::time::{Duration, Instant};

    malloc(m, "m0", 8, 512);
    ok(m, "bdev_error_create", json!({"base_name": "m0"}));
    malloc(m, "m1", 8, 512);
    malloc(m, "m2", 8, 512);
    if free_slot {
        create_sb(m, "r", &["EE_m0", "m1", "m2"]);
        ok(m, "bdev_raid_remove_base_bdev", json!({"name": "m2"}));
    } else {
        create_sb(m, "r", &["EE_m0", "m1"]);
    }
    let mut ch = m.disk("r").unwrap().open().unwrap();
    write_range(&mut *ch, 0, &pattern(1, 16 << 10));
    ok(
        m,
        "bdev_error_inject_error",
        json!({"name": "EE_m0", "io_type": "write", "error_type": "nomem", "num": 1_000_000_000u64}),
    );
    let mut buf = IoBuf::new(16 << 10, true);
    buf.bytes_mut().copy_from_slice(&pattern(2, 16 << 10));
    let iov = Box::new([buf.iovec()]);
    // SAFETY: `buf` and `iov` (returned with the channel) outlive the request: callers poll
    // it to its end or drop the channel first.
    unsafe { ch.submit(&rw(7, IoOp::Write, 2 << 20, &iov[..])) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        ch.poll(&mut |t, s| panic!("the write waits on the busy EE_m0, yet {t} ended: {s:?}"));
        let left = ok(m, "bdev_get_bdevs", json!({"name": "EE_m0"}))[0]["driver_specific"]["error"]
            ["injections"]["write"]["num"]
            .as_u64()
            .unwrap();
        if left < 1_000_000_000 {
            return (ch, HeldWrite { _buf: buf, _iov: iov });
        }
        assert!(Instant::now() < deadline, "EE_m0 was never sent a write");
        std::thread::yield_now();
    }
}

/// Runs `method` on another thread (an RPC thread) while this one polls `ch` (the raid's
/// reactor; completions go to `done`); fails if it does not answer within 20 s. Returns the
/// answer and how long it took.
fn call_while_polling(
    m: &Arc<Registry>,
    ch: &mut dyn fp_bdev::IoChannel,
    done: &mut Vec<(u32, fp_bdev::IoStatus)>,
    method: &'static str,
    params: Value,
) -> (Result<Value, fp_rpc::RpcError>, std::time::Duration) {
    use std::time::{Duration, Instant};
    let caller = {
        let m = m.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let r = m.call(method, Some(params));
            (r.map_err(|e| e.to_rpc()), start.elapsed())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !caller.is_finished() {
        ch.poll(&mut |t, s| done.push((t, s)));
        assert!(Instant::now() < deadline, "{method} never answered (EE_m0 stays busy)");
        std::thread::yield_now();
    }
    caller.join().unwrap()
}

/// Clears EE_m0's injections and polls `ch` until the write `owner_stuck_on_a_busy_base`
/// started has ended (in `done`, or later); returns its status.
fn finish_the_held_write(
    m: &Registry,
    ch: &mut dyn fp_bdev::IoChannel,
    mut done: Vec<(u32, fp_bdev::IoStatus)>,
) -> fp_bdev::IoStatus {
    use std::time::{Duration, Instant};
    ok(m, "bdev_error_inject_error", json!({"name": "EE_m0", "io_type": "clear", "error_type": "nomem"}));
    let deadline = Instant::now() + Duration::from_secs(20);
    while done.is_empty() {
        ch.poll(&mut |t, s| done.push((t, s)));
        assert!(Instant::now() < deadline, "the held write never ended");
        std::thread::yield_now();
    }
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].0, 7);
    done[0].1
}

/// While the owner retries its bitmap write on a base that stays Busy, `bdev_raid_get_bdevs`
/// answers at once (from the layout the owner published), and `bdev_raid_add_base_bdev`
/// answers within its bound with an error saying what it waited for: the owner never took
/// the addition up, nothing changed and the base is released. Once the base answers again,
/// the same addition succeeds.
#[test]
fn get_bdevs_and_add_base_answer_while_the_owner_retries_a_busy_base() {
    use std::time::Duration;
    let (m, _dir) = registry();
    let (mut ch, _buf) = owner_stuck_on_a_busy_base(&m, true);

    let mut done = Vec::new();
    let (answer, took) =
        call_while_polling(&m, &mut *ch, &mut done, "bdev_raid_get_bdevs", json!({"category": "all"}));
    let answer = answer.unwrap();
    assert_eq!(answer[0]["flashpath"]["slots"], json!(["active", "active", "failed"]), "{answer}");
    assert!(took < Duration::from_secs(2), "{took:?}");

    let (answer, took) = call_while_polling(
        &m,
        &mut *ch,
        &mut done,
        "bdev_raid_add_base_bdev",
        json!({"raid_bdev": "r", "base_bdev": "m2"}),
    );
    let e = answer.unwrap_err();
    assert_eq!(e.code, -libc::EBUSY, "{e:?}");
    assert!(e.message.contains("'m2'") && e.message.contains("5 s") && e.message.contains("Busy"), "{e:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(!claimed(&m, "m2"), "an addition not taken up leaves the base free");
    assert_eq!(raid(&m, "r")["flashpath"]["slots"], json!(["active", "active", "failed"]));

    assert!(done.is_empty(), "the write waits on the owner: {done:?}");
    assert_eq!(finish_the_held_write(&m, &mut *ch, done), fp_bdev::IoStatus::Success);
    ok(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "m2"}));
    wait_slots(&m, "r", json!(["active", "active", "active"]));
    assert!(read_range(&mut *ch, 2 << 20, 16 << 10) == pattern(2, 16 << 10));
    drop(ch);
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
}

/// `bdev_raid_delete` of a raid whose owner retries a metadata write on a base that stays
/// Busy answers within a few seconds: the stop gives the busy base's writes up. With
/// `clear_sb`, the answer names the base whose superblock was not erased and why; the other
/// base is erased. The write that waited on the owner ends, and the raid is gone.
#[test]
fn delete_answers_while_the_owner_retries_a_busy_base() {
    use std::time::Duration;
    let (m, _dir) = registry();
    let (mut ch, _buf) = owner_stuck_on_a_busy_base(&m, false);
    let mut done = Vec::new();
    let (answer, took) = call_while_polling(
        &m,
        &mut *ch,
        &mut done,
        "bdev_raid_delete",
        json!({"name": "r", "clear_sb": true}),
    );
    let e = answer.unwrap_err();
    assert!(
        e.message.contains("'EE_m0'") && !e.message.contains("'m1'") && e.message.contains("Busy"),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(raids(&m, "all").is_empty());
    assert!(!claimed(&m, "EE_m0") && !claimed(&m, "m1"));
    assert!(zeroed(&m, "m1", 8192), "m1's superblock erased");
    // The owner gave the bitmap write to EE_m0 up: the write went to m1 alone.
    assert_eq!(finish_the_held_write(&m, &mut *ch, done), fp_bdev::IoStatus::Success);
    drop(ch);
    ok(&m, "bdev_error_delete", json!({"name": "EE_m0"}));
}

/// The daemon's shutdown stops a raid whose owner retries a metadata write on a base that
/// stays Busy in bounded time: the stop gives the busy base's writes up.
#[test]
fn shutdown_ends_while_the_owner_retries_a_busy_base() {
    use std::time::{Duration, Instant};
    let (m, _dir) = registry();
    let (mut ch, _buf) = owner_stuck_on_a_busy_base(&m, false);
    let stopper = {
        let m = m.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            m.shutdown();
            start.elapsed()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut done = Vec::new();
    while !stopper.is_finished() {
        ch.poll(&mut |t, s| done.push((t, s)));
        assert!(Instant::now() < deadline, "shutdown never ended (EE_m0 stays busy)");
        std::thread::yield_now();
    }
    let took = stopper.join().unwrap();
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(raids(&m, "all").is_empty());
    assert_eq!(finish_the_held_write(&m, &mut *ch, done), fp_bdev::IoStatus::Success);
    drop(ch);
}

/// With a reactor in the daemon, a rebuild's copies run there (the owner's thread copies
/// nothing): a base removed and a fresh one added ends identical, every byte counted as
/// copied on the reactor; a target removed mid-rebuild (its copies drained first) can be
/// deleted at once.
#[test]
fn with_a_reactor_the_rebuild_copies_there() {
    use fp_reactor::{ReactorConfig, ReactorSet};
    let reactors = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = Registry::new(reactors.handles().to_vec(), &dir.path().join("vhost"));
    for (name, mib) in [("m0", 8), ("m1", 8), ("m2", 8)] {
        malloc(&m, name, mib, 512);
    }
    create_sb(&m, "r", &["m0", "m1"]);
    let data = pattern(9, 1 << 20);
    let mut ch = m.disk("r").unwrap().open().unwrap();
    write_range(&mut *ch, 3 << 20, &data);
    drop(ch);
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "m1"}));
    ok(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "m2"}));
    let r = wait_slots(&m, "r", json!(["active", "active"]));
    let copied = r["flashpath"]["rebuild_bytes_copied"].as_u64().unwrap();
    assert!(copied > 0);
    assert_eq!(r["flashpath"]["rebuild_bytes_on_reactor"].as_u64(), Some(copied), "{r}");
    let bytes = raid(&m, "r")["base_bdevs_list"][0]["data_size"].as_u64().unwrap() * 512;
    let offset = raid(&m, "r")["base_bdevs_list"][0]["data_offset"].as_u64().unwrap() * 512;
    let image = |name: &str| {
        let mut ch = m.disk(name).unwrap().open().unwrap();
        read_range(&mut *ch, offset, bytes as usize)
    };
    assert!(image("m0") == image("m2"), "the rebuilt base differs");

    // A slow rebuild whose target is removed while its copies run: drained, then taken out.
    malloc(&m, "m3", 8, 512);
    ok(&m, "bdev_raid_set_options", json!({"process_max_bandwidth_mb_sec": 1}));
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "m2"}));
    ok(&m, "bdev_raid_add_base_bdev", json!({"raid_bdev": "r", "base_bdev": "m3"}));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while raid(&m, "r")["process"]["progress"]["blocks"].as_u64().is_none_or(|b| b == 0) {
        assert!(std::time::Instant::now() < deadline, "no progress");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    ok(&m, "bdev_raid_remove_base_bdev", json!({"name": "m3"}));
    assert_eq!(raid(&m, "r")["flashpath"]["slots"], json!(["active", "failed"]));
    ok(&m, "bdev_malloc_delete", json!({"name": "m3"}));
    ok(&m, "bdev_raid_set_options", json!({"process_max_bandwidth_mb_sec": 0}));
    ok(&m, "bdev_raid_delete", json!({"name": "r"}));
    drop(m);
    reactors.shutdown();
}
