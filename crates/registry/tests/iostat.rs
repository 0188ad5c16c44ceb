//! The disk layer's methods: shapes, counts after real I/O through a disk channel, errors.

use fp_bdev::disk::Histogram;
use fp_bdev::{IoChannel, IoOp, IoRequest};
use std::sync::Arc;

use fp_bdev::Iovecs;
use fp_registry::Registry;
use fp_rpc::codes;
use serde_json::{json, Value};

/// The registry answers the methods.
type Methods = Arc<Registry>;

fn methods() -> (Methods, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let m = Registry::new(vec![], &dir.path().join("vhost"));
    m.call("bdev_null_create", Some(json!({"name": "n0", "num_blocks": 1024, "block_size": 512}))).unwrap();
    (m, dir)
}

fn ok(m: &Methods, method: &str, params: Value) -> Value {
    m.call(method, (!params.is_null()).then_some(params)).unwrap_or_else(|e| panic!("{method}: {e}"))
}

fn err(m: &Methods, method: &str, params: Value) -> fp_rpc::RpcError {
    m.call(method, (!params.is_null()).then_some(params))
        .map(|v| panic!("{method} gave {v}"))
        .unwrap_err()
        .to_rpc()
}

fn assert_param(e: &fp_rpc::RpcError, field: &str) {
    assert_eq!(e.code, codes::INVALID_PARAMS, "{e:?}");
    assert!(e.message.starts_with(&format!("{field}: ")), "{e:?} does not name {field}");
}

/// Runs `n` requests of `op` and `len` bytes through a channel of bdev `name`'s disk.
fn io(m: &Methods, name: &str, op: IoOp, len: u64, n: u32) -> Box<dyn IoChannel> {
    let mut ch = m.disk(name).unwrap().open().unwrap();
    drive(&mut ch, op, len, n);
    ch
}

fn drive(ch: &mut Box<dyn IoChannel>, op: IoOp, len: u64, n: u32) {
    for tag in 0..n {
        let r = IoRequest { tag, op, offset: 0, len, iov: Iovecs::NONE };
        ch.submit(&r).unwrap();
    }
    let mut done = 0;
    ch.poll(&mut |_, _| done += 1);
    assert_eq!(done, n);
}

#[test]
fn iostat_counts_what_went_through_the_disk() {
    let (m, _d) = methods();
    let _a = io(&m, "n0", IoOp::Read, 4096, 3);
    let b = io(&m, "n0", IoOp::Write, 512, 2);
    drop(b); // a closed channel's counts stay
    let _c = io(&m, "n0", IoOp::Discard, 1024, 1);
    let v = ok(&m, "bdev_get_iostat", json!({"name": "n0"}));
    assert!(v["tick_rate"].as_u64().unwrap() > 0 && v["ticks"].as_u64().unwrap() > 0);
    let s = &v["bdevs"][0];
    assert_eq!(s["name"], "n0");
    assert_eq!((s["num_read_ops"].as_u64(), s["bytes_read"].as_u64()), (Some(3), Some(12288)));
    assert_eq!((s["num_write_ops"].as_u64(), s["bytes_written"].as_u64()), (Some(2), Some(1024)));
    assert_eq!((s["num_unmap_ops"].as_u64(), s["bytes_unmapped"].as_u64()), (Some(1), Some(1024)));
    let (sum, max, min) = (
        s["read_latency_ticks"].as_u64().unwrap(),
        s["max_read_latency_ticks"].as_u64().unwrap(),
        s["min_read_latency_ticks"].as_u64().unwrap(),
    );
    assert!(min <= max && max <= sum, "{s}");
    assert_eq!(s["min_flush_latency_ticks"], 0, "nothing flushed: SPDK prints 0");
    assert_eq!(s["queue_depth"], 0);
    assert_eq!(s["io_error"], json!({}));
    // No limit: nothing held back, but the fields are there for a collector to find.
    for k in ["qos_queued", "qos_queued_total", "qos_wait_ticks", "qos_throttled_ticks"] {
        assert_eq!(s[k], 0, "{k}: {s}");
    }
    // All bdevs: the same numbers.
    ok(&m, "bdev_null_create", json!({"name": "n1", "num_blocks": 8, "block_size": 512}));
    let all = ok(&m, "bdev_get_iostat", Value::Null);
    let names: Vec<&str> =
        all["bdevs"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["n0", "n1"]);
    assert_eq!(all["bdevs"][0]["num_read_ops"], 3);
    assert_eq!(all["bdevs"][1]["num_read_ops"], 0);
}

#[test]
fn per_channel_lists_open_channels() {
    let (m, _d) = methods();
    let _a = io(&m, "n0", IoOp::Read, 512, 1);
    let _b = io(&m, "n0", IoOp::Read, 512, 2);
    let v = ok(&m, "bdev_get_iostat", json!({"name": "n0", "per_channel": true}));
    assert_eq!(v["name"], "n0");
    let ops: Vec<u64> =
        v["channels"].as_array().unwrap().iter().map(|c| c["num_read_ops"].as_u64().unwrap()).collect();
    assert_eq!(ops, [1, 2]);
    assert_eq!(v["channels"][1]["thread_id"], 1);
    assert_eq!(v["channels"][1]["qos_queued_total"], 0);
    assert_param(&err(&m, "bdev_get_iostat", json!({"per_channel": true})), "per_channel");
}

#[test]
fn reset_modes() {
    let (m, _d) = methods();
    let mut ch = io(&m, "n0", IoOp::Read, 512, 4);
    ok(&m, "bdev_reset_iostat", json!({"name": "n0", "mode": "maxmin"}));
    let s = ok(&m, "bdev_get_iostat", json!({"name": "n0"}))["bdevs"][0].clone();
    assert_eq!((s["num_read_ops"].as_u64(), s["max_read_latency_ticks"].as_u64()), (Some(4), Some(0)));
    ok(&m, "bdev_reset_iostat", json!({"mode": "none"}));
    ok(&m, "bdev_reset_iostat", Value::Null); // every bdev, mode all
    let s = ok(&m, "bdev_get_iostat", json!({"name": "n0"}))["bdevs"][0].clone();
    assert_eq!((s["num_read_ops"].as_u64(), s["read_latency_ticks"].as_u64()), (Some(0), Some(0)));
    drive(&mut ch, IoOp::Read, 512, 1);
    assert_eq!(ok(&m, "bdev_get_iostat", json!({"name": "n0"}))["bdevs"][0]["num_read_ops"], 1);
    assert_param(&err(&m, "bdev_reset_iostat", json!({"mode": "some"})), "mode");
}

#[test]
fn histogram_enable_get_disable() {
    let (m, _d) = methods();
    let e = err(&m, "bdev_get_histogram", json!({"name": "n0"}));
    assert_eq!(e.code, -libc::EFAULT);
    assert!(e.message.contains("n0") && e.message.contains("not enabled"), "{e:?}");
    ok(&m, "bdev_enable_histogram", json!({"name": "n0", "enable": true}));
    let _a = io(&m, "n0", IoOp::Read, 512, 5);
    let _b = io(&m, "n0", IoOp::Write, 512, 2);
    let v = ok(&m, "bdev_get_histogram", json!({"name": "n0"}));
    assert_eq!((v["granularity"].as_u64(), v["bucket_shift"].as_u64()), (Some(7), Some(7)));
    assert_eq!((v["min_range"].as_u64(), v["max_range"].as_u64()), (Some(0), Some(57)));
    assert!(v["tsc_rate"].as_u64().unwrap() > 0);
    let h = Histogram::from_base64(v["histogram"].as_str().unwrap()).expect("SPDK's encoding");
    assert_eq!(h.total(), 7);
    assert_eq!(v["count"], 7);
    let p = &v["percentiles_us"];
    assert!(p["p50"].as_f64().unwrap() <= p["p99_9"].as_f64().unwrap(), "{p}");
    ok(&m, "bdev_enable_histogram", json!({"name": "n0", "enable": false}));
    assert_eq!(err(&m, "bdev_get_histogram", json!({"name": "n0"})).code, -libc::EFAULT);
}

#[test]
fn bad_input_names_the_field_or_the_bdev() {
    let (m, _d) = methods();
    for (method, params) in [
        ("bdev_get_iostat", json!({"name": "nope"})),
        ("bdev_reset_iostat", json!({"name": "nope"})),
        ("bdev_enable_histogram", json!({"name": "nope", "enable": true})),
        ("bdev_get_histogram", json!({"name": "nope"})),
    ] {
        let e = err(&m, method, params);
        assert_eq!(e.code, -19, "{method}: {e:?}");
        assert!(e.message.contains("'nope'"), "{method}: {e:?}");
    }
    assert_param(&err(&m, "bdev_enable_histogram", json!({"name": "n0"})), "enable");
    assert_param(&err(&m, "bdev_enable_histogram", json!({"name": "n0", "enable": 1})), "enable");
    assert_param(
        &err(&m, "bdev_enable_histogram", json!({"name": "n0", "enable": true, "granularity": 9})),
        "granularity",
    );
    assert_param(&err(&m, "bdev_get_histogram", Value::Null), "name");
    assert_param(&err(&m, "bdev_get_iostat", json!({"name": "n0", "names": ["n0"]})), "names");
    // An unknown bdev among `names`: SPDK's -ENODEV, the field named.
    let e = err(&m, "bdev_get_iostat", json!({"names": ["n0", "nope"]}));
    assert_eq!(e.code, -19, "{e:?}");
    assert!(e.message.starts_with("names: ") && e.message.contains("'nope'"), "{e:?}");
    assert_param(&err(&m, "bdev_get_iostat", json!({"names": "n0"})), "names");
    // Nothing changed: still off, SPDK's neutral values accepted.
    assert_eq!(err(&m, "bdev_get_histogram", json!({"name": "n0"})).code, -libc::EFAULT);
    ok(&m, "bdev_enable_histogram", json!({"name": "n0", "enable": true, "granularity": 7}));
}

#[test]
fn deleting_the_bdev_drops_its_statistics() {
    let (m, _d) = methods();
    drop(io(&m, "n0", IoOp::Read, 512, 2));
    ok(&m, "bdev_null_delete", json!({"name": "n0"}));
    assert_eq!(err(&m, "bdev_get_iostat", json!({"name": "n0"})).code, -19);
    ok(&m, "bdev_null_create", json!({"name": "n0", "num_blocks": 1024, "block_size": 512}));
    assert_eq!(ok(&m, "bdev_get_iostat", json!({"name": "n0"}))["bdevs"][0]["num_read_ops"], 0);
}

#[test]
fn resize_and_delete_reach_the_disks_subscribers() {
    let (m, _d) = methods();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    m.disk("n0").unwrap().subscribe(Box::new(move |e| s.lock().unwrap().push(*e)));
    ok(&m, "bdev_null_resize", json!({"name": "n0", "new_size_bytes": 2048 * 512}));
    ok(&m, "bdev_null_delete", json!({"name": "n0"}));
    assert_eq!(
        *seen.lock().unwrap(),
        [fp_bdev::DiskEvent::Resized { num_blocks: 2048 }, fp_bdev::DiskEvent::Removed]
    );
}

/// SPDK 26's client sends `names` (a list) and `reset_mode`: the named disks only, and what was
/// read is reset after the read.
#[test]
fn names_pick_the_disks_and_reset_mode_resets_after_the_read() {
    let (m, _d) = methods();
    ok(&m, "bdev_null_create", json!({"name": "n1", "num_blocks": 1024, "block_size": 512}));
    ok(&m, "bdev_null_create", json!({"name": "n2", "num_blocks": 1024, "block_size": 512}));
    let _a = io(&m, "n0", IoOp::Read, 512, 3);
    let _b = io(&m, "n2", IoOp::Read, 512, 5);
    let v = ok(&m, "bdev_get_iostat", json!({"names": ["n2", "n0"]}));
    let got: Vec<(&str, u64)> = v["bdevs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["name"].as_str().unwrap(), b["num_read_ops"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, [("n2", 5), ("n0", 3)]);
    let v = ok(&m, "bdev_get_iostat", json!({"names": ["n2"], "reset_mode": "all"}));
    assert_eq!(v["bdevs"][0]["num_read_ops"], 5, "the read shows the counts before the reset");
    let v = ok(&m, "bdev_get_iostat", json!({"names": ["n2", "n0"]}));
    assert_eq!(
        (v["bdevs"][0]["num_read_ops"].as_u64(), v["bdevs"][1]["num_read_ops"].as_u64()),
        (Some(0), Some(3))
    );
    let v = ok(&m, "bdev_get_iostat", json!({"names": ["n0"], "per_channel": true}));
    assert_eq!(v["channels"][0]["num_read_ops"], 3);
    assert_param(
        &err(&m, "bdev_get_iostat", json!({"names": ["n0", "n2"], "per_channel": true})),
        "per_channel",
    );
    assert_param(&err(&m, "bdev_get_iostat", json!({"name": "n0", "names": ["n2"]})), "names");
    assert_param(&err(&m, "bdev_get_iostat", json!({"names": "n0"})), "names");
    assert_param(&err(&m, "bdev_get_iostat", json!({"names": ["n0", 7]})), "names[1]");
    assert_param(&err(&m, "bdev_get_iostat", json!({"reset_mode": "error"})), "reset_mode");
    assert_eq!(err(&m, "bdev_get_iostat", json!({"names": ["n0", "nope"]})).code, -19);
}
