//! Parameter decoding, result shapes and error paths of every method, on a target without
//! reactors (the bdev methods need none).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_rpc::{codes, RpcError};
use serde_json::json;

use super::*;

struct Fixture {
    methods: Arc<Registry>,
    dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    fixture_with(crate::Limits::default())
}

fn fixture_with(limits: crate::Limits) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let options = crate::RegistryOptions { limits, ..Default::default() };
    let methods = Registry::with_options(vec![], &dir.path().join("vhost"), options);
    Fixture { methods, dir }
}

impl Fixture {
    fn ok(&self, method: &str, params: Value) -> Value {
        let params = (!params.is_null()).then_some(params);
        self.methods.call(method, params).unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// Calls a method that must fail; returns its JSON-RPC error.
    fn err(&self, method: &str, params: Value) -> RpcError {
        let params = (!params.is_null()).then_some(params);
        match self.methods.call(method, params) {
            Ok(v) => panic!("{method} unexpectedly returned {v}"),
            Err(e) => e.to_rpc(),
        }
    }

    fn null(&self, name: &str) {
        self.ok("bdev_null_create", json!({"name": name, "num_blocks": 1024, "block_size": 512}));
    }
}

/// Asserts an invalid-params error whose message starts with `field: `.
fn assert_param(e: &RpcError, field: &str) {
    assert_eq!(e.code, codes::INVALID_PARAMS, "{e:?}");
    assert!(e.message.starts_with(&format!("{field}: ")), "{e:?} does not name {field}");
}

#[test]
fn unknown_method() {
    let f = fixture();
    let e = f.err("bdev_frob", Value::Null);
    assert_eq!(e.code, codes::METHOD_NOT_FOUND);
    assert!(e.message.contains("bdev_frob"));
}

#[test]
fn null_create_delete() {
    let f = fixture();
    assert_eq!(f.ok("bdev_null_create", json!({"name": "n0", "num_blocks": 8, "block_size": 4096})), "n0");
    let e = f.err("bdev_null_create", json!({"name": "n0", "num_blocks": 8, "block_size": 4096}));
    assert_eq!(e.code, -17);
    assert!(e.message.contains("already exists"));
    assert_eq!(f.ok("bdev_null_delete", json!({"name": "n0"})), true);
    let e = f.err("bdev_null_delete", json!({"name": "n0"}));
    assert_eq!(e.code, -19);
}

#[test]
fn create_param_errors_name_the_field() {
    let f = fixture();
    assert_param(&f.err("bdev_null_create", json!({"name": "n", "block_size": 512})), "num_blocks");
    assert_param(&f.err("bdev_null_create", Value::Null), "name");
    assert_param(&f.err("bdev_null_create", json!({"name": 5, "num_blocks": 1, "block_size": 512})), "name");
    assert_param(
        &f.err("bdev_null_create", json!({"name": "n", "num_blocks": -1, "block_size": 512})),
        "num_blocks",
    );
    assert_param(
        &f.err("bdev_null_create", json!({"name": "n", "num_blocks": 8, "block_size": 1u64 << 40})),
        "block_size",
    );
    let e = f.err("bdev_null_create", json!({"name": "n", "num_blocks": 8, "block_size": 1000}));
    assert_eq!(e.message, "block_size: 1000 is not a power of two between 512 and 65536");
    assert_param(
        &f.err("bdev_null_create", json!({"name": "n", "num_blocks": 0, "block_size": 512})),
        "num_blocks",
    );
    assert_param(
        &f.err("bdev_null_create", json!({"name": "a/b", "num_blocks": 1, "block_size": 512})),
        "name",
    );
    let e = f.err("bdev_null_create", json!({"name": "n", "num_blocks": 8, "block_size": 512, "size": 1}));
    assert_eq!(e.message, "size: unknown parameter; accepted: name, num_blocks, block_size");
    let e = f.err("bdev_null_create", json!({"name": "n", "num_blocks": 8, "block_size": 512, "uuid": "x"}));
    assert_eq!(e.message, "uuid: not supported by flashpath");
    let e = f.err("bdev_null_create", json!({"name": "n", "num_blocks": 8, "block_size": 512, "md_size": 8}));
    assert_eq!(e.message, "md_size: not supported by flashpath (only 0)");
    let e = f.err("bdev_null_create", json!(["n", 8, 512]));
    assert_eq!(e.code, codes::INVALID_PARAMS);
    assert!(e.message.contains("object"), "{e:?}");
    assert!(f.ok("bdev_get_bdevs", Value::Null).as_array().unwrap().is_empty());
}

/// What SPDK's rpc.py sends for `bdev_null_create n0 64 512`, `bdev_malloc_create 16 4096` and
/// `vhost_create_blk_controller vhost.0 n0`: every SPDK-only field at its default.
#[test]
fn accepts_rpc_py_defaults() {
    let f = fixture();
    let r = f.ok(
        "bdev_null_create",
        json!({"name": "n0", "num_blocks": 131072, "block_size": 512, "md_size": 0, "dif_type": 0,
               "dif_is_head_of_md": false, "dif_pi_format": 0}),
    );
    assert_eq!(r, "n0");
    let r = f.ok(
        "bdev_malloc_create",
        json!({"num_blocks": 4096, "block_size": 4096, "md_interleave": false, "dif_is_head_of_md": false,
               "numa_id": -1, "optimal_io_boundary": 0}),
    );
    assert_eq!(r, "Malloc0");
    let e = f.err(
        "vhost_create_blk_controller",
        json!({"ctrlr": "v", "dev_name": "zz", "readonly": false, "packed_ring": false,
               "transport": "vhost_user_blk", "num_queues": 1}),
    );
    assert_eq!(e.code, -19, "passes decoding, fails on the missing bdev: {e:?}");
    // flashpath offers packed rings to every frontend: SPDK's `-p` asks for what it does.
    let e = f.err(
        "vhost_create_blk_controller",
        json!({"ctrlr": "v", "dev_name": "zz", "packed_ring": true, "packed_ring_recovery": true}),
    );
    assert_eq!(e.code, -19, "passes decoding, fails on the missing bdev: {e:?}");
    let e = f.err("vhost_create_blk_controller", json!({"ctrlr": "v", "dev_name": "n0", "packed_ring": 1}));
    assert!(e.message.starts_with("packed_ring: expected true or false"), "{e:?}");
    let e = f.err("vhost_create_blk_controller", json!({"ctrlr": "v", "dev_name": "n0", "transport": "x"}));
    assert!(e.message.starts_with("transport: not supported by flashpath"), "{e:?}");
}

#[test]
fn malloc_auto_names_and_type_checked_delete() {
    let f = fixture();
    let params = json!({"num_blocks": 16, "block_size": 512});
    assert_eq!(f.ok("bdev_malloc_create", params.clone()), "Malloc0");
    assert_eq!(f.ok("bdev_malloc_create", params.clone()), "Malloc1");
    f.ok("bdev_malloc_delete", json!({"name": "Malloc0"}));
    assert_eq!(f.ok("bdev_malloc_create", params), "Malloc0");
    assert_eq!(
        f.ok("bdev_malloc_create", json!({"name": "ram", "num_blocks": 16, "block_size": 4096})),
        "ram"
    );
    // A delete of the wrong kind does not remove it (SPDK's rule).
    assert_eq!(f.err("bdev_null_delete", json!({"name": "ram"})).code, -19);
    assert_param(&f.err("bdev_malloc_delete", Value::Null), "name");
    assert_param(&f.err("bdev_malloc_delete", json!({"name": "ram", "force": true})), "force");
    assert_param(&f.err("bdev_malloc_create", json!({"num_blocks": 16})), "block_size");
}

#[test]
fn uring_create_and_errors() {
    let f = fixture();
    let file = f.dir.path().join("disk.img");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let name = f.ok("bdev_uring_create", json!({"name": "u0", "filename": file, "direct": false}));
    assert_eq!(name, "u0");
    let b = &f.ok("bdev_get_bdevs", json!({"name": "u0"}))[0];
    assert_eq!(b["driver_specific"]["uring"]["filename"], file.display().to_string());
    assert_eq!(b["num_blocks"].as_u64().unwrap() * b["block_size"].as_u64().unwrap(), 1 << 20);
    f.ok("bdev_uring_delete", json!({"name": "u0"}));

    assert_param(&f.err("bdev_uring_create", json!({"name": "u1"})), "filename");
    assert_param(
        &f.err("bdev_uring_create", json!({"name": "u1", "filename": file, "direct": "no"})),
        "direct",
    );
    // flashpath's `submit_batch`: 0 (one enter per reactor round) up to the largest ring.
    f.ok("bdev_uring_create", json!({"name": "u2", "filename": file, "direct": false, "submit_batch": 0}));
    f.ok("bdev_uring_delete", json!({"name": "u2"}));
    assert_param(
        &f.err(
            "bdev_uring_create",
            json!({"name": "u1", "filename": file, "direct": false, "submit_batch": 5000}),
        ),
        "submit_batch",
    );
    let missing = f.dir.path().join("missing.img");
    let e = f.err("bdev_uring_create", json!({"name": "u1", "filename": missing}));
    assert_eq!(e.code, -2, "{e:?}");
    assert!(e.message.contains("missing.img"), "{e:?}");
}

#[test]
fn get_bdevs_shape_and_errors() {
    let f = fixture();
    f.null("b");
    f.null("a");
    let all = f.ok("bdev_get_bdevs", Value::Null);
    let names: Vec<&str> = all.as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b"]);
    let b = &f.ok("bdev_get_bdevs", json!({"name": "a"}))[0];
    assert_eq!(b["product_name"], "Null disk");
    assert_eq!(b["block_size"], 512);
    assert_eq!(b["num_blocks"], 1024);
    assert_eq!(b["claimed"], false);
    assert!(b.get("claimed_by").is_none());
    assert!(b.get("claim_type").is_none());
    assert_eq!(b["supported_io_types"]["read"], true);
    assert_eq!(b["supported_io_types"]["reset"], false);
    assert_eq!(b["driver_specific"], json!({"null": {}}));
    assert_eq!(b["uuid"], bdev_uuid("a"));

    let e = f.err("bdev_get_bdevs", json!({"name": "zz"}));
    assert_eq!(e.code, -19);
    assert!(e.message.contains("'zz'"));
    assert_param(&f.err("bdev_get_bdevs", json!({"nmae": "a"})), "nmae");
    assert_param(&f.err("bdev_get_bdevs", json!({"timeout": "x"})), "timeout");
    assert_param(&f.err("bdev_get_bdevs", json!({"timeout": 3_600_000})), "timeout");
}

#[test]
fn claims_show_in_get_bdevs_and_refuse_deletion() {
    let f = fixture();
    f.null("a");
    let delay = json!({"name": "d", "base_bdev_name": "a", "avg_read_latency": 10,
        "p99_read_latency": 20, "avg_write_latency": 30, "p99_write_latency": 40});
    f.ok("bdev_delay_create", delay);
    let a = &f.ok("bdev_get_bdevs", json!({"name": "a"}))[0];
    assert_eq!(
        (&a["claimed"], &a["claim_type"], &a["claimed_by"]),
        (&json!(true), &json!("exclusive_write"), &json!("d"))
    );
    let d = &f.ok("bdev_get_bdevs", json!({"name": "d"}))[0];
    let expected = json!({"base_bdev_name": "a", "avg_read_latency": 10, "p99_read_latency": 20,
        "avg_write_latency": 30, "p99_write_latency": 40});
    assert_eq!(d["driver_specific"]["delay"], expected);
    let e = f.err("bdev_null_delete", json!({"name": "a"}));
    assert_eq!(e.code, -16, "{e:?}");
    assert!(e.message.contains("'d'"), "{e:?}");
    f.ok("bdev_delay_delete", json!({"name": "d"}));
    let a = &f.ok("bdev_get_bdevs", json!({"name": "a"}))[0];
    assert_eq!(a["claimed"], false);
    f.ok("bdev_null_delete", json!({"name": "a"}));
}

#[test]
fn get_bdevs_waits_for_a_bdev() {
    let f = Arc::new(fixture());
    let creator = {
        let f = f.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            f.null("late");
        })
    };
    let t0 = Instant::now();
    let v = f.ok("bdev_get_bdevs", json!({"name": "late", "timeout": 5000}));
    assert_eq!(v[0]["name"], "late");
    assert!(t0.elapsed() < Duration::from_secs(5));
    creator.join().unwrap();
    let t0 = Instant::now();
    assert_eq!(f.err("bdev_get_bdevs", json!({"name": "never", "timeout": 30})).code, -19);
    assert!(t0.elapsed() >= Duration::from_millis(30));
}

#[test]
fn vhost_create_errors() {
    let f = fixture();
    f.null("d0");
    assert_param(&f.err("vhost_create_blk_controller", json!({"ctrlr": "v0"})), "dev_name");
    assert_param(&f.err("vhost_create_blk_controller", json!({"dev_name": "d0"})), "ctrlr");
    let e = f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "cpumask": "zz"}));
    assert_param(&e, "cpumask");
    assert!(e.message.contains("0x3"), "{e:?}");
    // This target has no reactors, so no mask can select one.
    let e = f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "cpumask": "[0]"}));
    assert_param(&e, "cpumask");
    assert_param(
        &f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "num_queues": 70000})),
        "num_queues",
    );
    // 0 and one past MAX_QUEUES pass the decoder (a u16) and are refused by the target.
    for n in [0, fp_vhost_blk::MAX_QUEUES + 1] {
        let e =
            f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "num_queues": n}));
        assert_param(&e, "num_queues");
        assert_eq!(e.message, format!("num_queues: {n} is not between 1 and 64"));
    }
    assert_param(&f.err("vhost_create_blk_controller", json!({"ctrlr": "a/b", "dev_name": "d0"})), "ctrlr");
    assert_param(
        &f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "readonly": "yes"})),
        "readonly",
    );
    let e = f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "queues": 2}));
    assert_eq!(
        e.message,
        "queues: unknown parameter; accepted: ctrlr, dev_name, cpumask, readonly, num_queues, migrate_from, stop_timeout_ms, packed_ring, packed_ring_recovery"
    );
    // A stop bound of 0 would fail every request in flight at once; above 10 min is refused by
    // the decoder.
    let e =
        f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "stop_timeout_ms": 0}));
    assert_param(&e, "stop_timeout_ms");
    assert_eq!(e.message, "stop_timeout_ms: 0 is not between 1 and 600000");
    let e = f.err(
        "vhost_create_blk_controller",
        json!({"ctrlr": "v0", "dev_name": "d0", "stop_timeout_ms": 600_001}),
    );
    assert_param(&e, "stop_timeout_ms");
    let e = f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "transport": "x"}));
    assert_eq!(e.message, "transport: not supported by flashpath (only \"vhost_user_blk\")");
    let e = f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "nope", "num_queues": 1}));
    assert_eq!(e.code, -19);
    assert!(e.message.contains("'nope'"));
}

#[test]
fn limits_are_errno_errors_naming_their_setting() {
    let f = fixture_with(crate::Limits { max_bdevs: 2, max_malloc_bytes: 1 << 20, ..Default::default() });
    f.null("a");
    f.ok("bdev_malloc_create", json!({"num_blocks": 256, "block_size": 4096}));
    for (method, params) in [
        ("bdev_null_create", json!({"name": "b", "num_blocks": 8, "block_size": 512})),
        ("bdev_malloc_create", json!({"num_blocks": 8, "block_size": 512})),
        (
            "bdev_delay_create",
            json!({"name": "d", "base_bdev_name": "a", "avg_read_latency": 0,
            "p99_read_latency": 0, "avg_write_latency": 0, "p99_write_latency": 0}),
        ),
    ] {
        let e = f.err(method, params);
        assert_eq!(e.code, -28, "{method}: {e:?}");
        assert!(e.message.ends_with("2 bdevs already exist, the limit set by limits.max_bdevs"), "{e:?}");
    }
    f.ok("bdev_null_delete", json!({"name": "a"}));
    // Too large for the RAM cap: an invalid num_blocks, which says what the cap is.
    let e = f.err("bdev_malloc_create", json!({"num_blocks": 257, "block_size": 4096}));
    assert_param(&e, "num_blocks");
    assert!(e.message.contains("limits.max_malloc_bytes"), "{e:?}");
}

#[test]
fn sizes_that_overflow_are_refused_naming_the_field() {
    let f = fixture();
    for method in ["bdev_null_create", "bdev_malloc_create"] {
        let e = f.err(method, json!({"name": "x", "num_blocks": u64::MAX, "block_size": 512}));
        assert_param(&e, "num_blocks");
        let e = f.err(method, json!({"name": "x", "num_blocks": 1u64 << 60, "block_size": 65536}));
        assert_param(&e, "num_blocks");
        assert_param(
            &f.err(method, json!({"name": "x", "num_blocks": 8, "block_size": 1u64 << 32})),
            "block_size",
        );
        assert_param(
            &f.err(method, json!({"name": "x", "num_blocks": 8.5, "block_size": 512})),
            "num_blocks",
        );
        assert_param(
            &f.err(method, json!({"name": "x", "num_blocks": "18446744073709551616", "block_size": 512})),
            "num_blocks",
        );
    }
    // 2^64 does not even parse as a u64.
    let e = f.methods.call(
        "bdev_null_create",
        Some(
            serde_json::from_str(r#"{"name": "x", "num_blocks": 18446744073709551616, "block_size": 512}"#)
                .unwrap(),
        ),
    );
    assert_param(&e.unwrap_err().to_rpc(), "num_blocks");
    // A petabyte RAM disk is more than any machine this runs on: refused, nothing mapped.
    let e = f.err("bdev_malloc_create", json!({"num_blocks": (1u64 << 50) / 4096, "block_size": 4096}));
    assert_param(&e, "num_blocks");
    assert!(f.ok("bdev_get_bdevs", Value::Null).as_array().unwrap().is_empty());
}

#[test]
fn an_oversized_cpumask_is_refused_before_it_is_expanded() {
    let f = fixture();
    f.null("d0");
    // Each range expands to up to 1024 cores: a request full of them would ask for gigabytes.
    let mask = "0-1023,".repeat(100_000);
    let e = f.err("vhost_create_blk_controller", json!({"ctrlr": "v0", "dev_name": "d0", "cpumask": mask}));
    assert_param(&e, "cpumask");
    assert!(e.message.contains("longer than"), "{e:?}");
}

#[test]
fn vhost_get_and_delete_errors() {
    let f = fixture();
    assert_eq!(f.ok("vhost_get_controllers", Value::Null), json!([]));
    assert_eq!(f.err("vhost_get_controllers", json!({"name": "v9"})).code, -19);
    assert_eq!(f.err("vhost_delete_controller", json!({"ctrlr": "v9"})).code, -19);
    assert_param(&f.err("vhost_delete_controller", json!({"ctrlr": "v9", "name": "v9"})), "name");
    assert_param(&f.err("vhost_delete_controller", Value::Null), "ctrlr");
}

#[test]
fn reactors_version_methods_stats() {
    let f = fixture();
    let r = f.ok("framework_get_reactors", Value::Null);
    assert_eq!(r["tick_rate"], 1_000_000_000u64);
    assert_eq!(r["reactors"], json!([]));
    assert_param(&f.err("framework_get_reactors", json!({"x": 1})), "x");

    let v = f.ok("spdk_get_version", Value::Null);
    assert_eq!(v["version"], format!("flashpath v{}", env!("CARGO_PKG_VERSION")));
    assert_eq!(v["fields"]["major"], env!("CARGO_PKG_VERSION_MAJOR").parse::<u64>().unwrap());
    assert!(v["fields"]["suffix"].is_string());

    let m = f.ok("rpc_get_methods", json!({"current": true}));
    let names: Vec<&str> = m.as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted: {names:?}");
    // The table's methods, every export kind's and every module's.
    let kinds: usize = EXPORT_KINDS.iter().map(|k| k.methods().len()).sum();
    assert_eq!(names.len(), METHODS.len() + kinds + f.methods.module_methods().count());
    for expected in [
        "bdev_get_bdevs",
        "vhost_create_blk_controller",
        "framework_get_reactors",
        "spdk_get_version",
        "bdev_malloc_create",
        "bdev_delay_update_latency",
    ] {
        assert!(names.contains(&expected));
    }
    assert_param(&f.err("rpc_get_methods", json!({"current": 1})), "current");

    f.null("n");
    let s = f.ok("flashpath_get_stats", Value::Null);
    assert_eq!(s["num_bdevs"], 1);
    assert_eq!(s["controllers"], json!([]));
    assert_eq!(s["reactors"]["count"], 0);
}

#[test]
fn cpumask_parse_and_format() {
    assert_eq!(parse_cpumask("0x5").unwrap(), [0, 2]);
    assert_eq!(parse_cpumask("[0,1]").unwrap(), [0, 1]);
    assert_eq!(parse_cpumask(" [ 2-3 ] ").unwrap(), [2, 3]);
    assert_eq!(parse_cpumask("1").unwrap(), [1]);
    assert_eq!(parse_cpumask("0x0").unwrap_err().field, "cpumask");
    assert!(parse_cpumask("[a]").is_err());
    assert_eq!(cpumask_hex(&[0]), "0x1");
    assert_eq!(cpumask_hex(&[0, 2]), "0x5");
    assert_eq!(cpumask_hex(&[4]), "0x10");
    assert_eq!(cpumask_hex(&[0, 1, 2, 3, 8]), "0x10f");
    assert_eq!(cpumask_hex(&[]), "0x0");
    for cores in [vec![1usize, 5], vec![0, 63, 64]] {
        assert_eq!(parse_cpumask(&cpumask_hex(&cores)).unwrap(), cores);
    }
}

#[test]
fn uuid_is_stable_and_well_formed() {
    let u = bdev_uuid("Malloc0");
    assert_eq!(u, bdev_uuid("Malloc0"));
    assert_ne!(u, bdev_uuid("Malloc1"));
    let parts: Vec<&str> = u.split('-').collect();
    assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
    assert!(parts[2].starts_with('8'), "{u}");
    assert!(matches!(parts[3].chars().next().unwrap(), '8' | '9' | 'a' | 'b'), "{u}");
}

#[test]
fn delay_create_claims_its_base_and_delete_releases_it() {
    let f = fixture();
    f.null("base");
    let lat = |avg_w: u64, p99_w: u64| {
        json!({"base_bdev_name": "base", "name": "slow", "avg_read_latency": 0, "p99_read_latency": 0,
               "avg_write_latency": avg_w, "p99_write_latency": p99_w})
    };
    assert_param(&f.err("bdev_delay_create", lat(100, 10)), "p99_write_latency");
    assert_param(&f.err("bdev_delay_create", lat(100, 20_000_000)), "p99_write_latency");
    let mut missing = lat(1, 1);
    missing["base_bdev_name"] = json!("nope");
    assert_eq!(f.err("bdev_delay_create", missing).code, -19);
    assert_eq!(f.ok("bdev_delay_create", lat(100, 200)), "slow");
    let bdevs = f.ok("bdev_get_bdevs", json!({"name": "slow"}));
    assert_eq!(bdevs[0]["num_blocks"], 1024);
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "base"}))[0]["claimed"], true);
    // The base cannot go while the delay bdev stacks on it, nor be stacked on twice.
    assert_eq!(f.err("bdev_null_delete", json!({"name": "base"})).code, -16);
    let mut twice = lat(1, 1);
    twice["name"] = json!("slow2");
    assert_eq!(f.err("bdev_delay_create", twice).code, -16);
    // bdev_delay_update_latency: SPDK's parameters; bad input names the field, changes nothing.
    let update = |name: &str, kind: &str, us: u64| json!({"delay_bdev_name": name, "latency_type": kind, "latency_us": us});
    assert_eq!(f.ok("bdev_delay_update_latency", update("slow", "p99_write", 5000)), true);
    assert_eq!(f.ok("bdev_delay_update_latency", update("slow", "avg_write", 5000)), true);
    assert_param(&f.err("bdev_delay_update_latency", update("slow", "avg_write", 6000)), "latency_us");
    assert_param(&f.err("bdev_delay_update_latency", update("slow", "p50", 1)), "latency_type");
    assert_param(&f.err("bdev_delay_update_latency", update("slow", "avg_read", 20_000_000)), "latency_us");
    assert_eq!(f.err("bdev_delay_update_latency", update("nope", "avg_read", 1)).code, -19);
    assert_eq!(f.err("bdev_delay_update_latency", update("base", "avg_read", 1)).code, -19);
    assert_eq!(f.ok("bdev_delay_delete", json!({"name": "slow"})), true);
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "base"}))[0]["claimed"], false);
    assert_eq!(f.ok("bdev_null_delete", json!({"name": "base"})), true);
}

#[test]
fn resize_grows_and_shrinks_and_refuses_bad_sizes_changing_nothing() {
    let f = fixture();
    let blocks = |name: &str| f.ok("bdev_get_bdevs", json!({"name": name}))[0]["num_blocks"].clone();
    f.null("n"); // 1024 blocks of 512 bytes
    assert_eq!(f.ok("bdev_null_resize", json!({"name": "n", "new_size": 2})), true);
    assert_eq!(blocks("n"), 4096);
    assert_eq!(f.ok("bdev_null_resize", json!({"name": "n", "new_size_bytes": 512 * 100})), true);
    assert_eq!(blocks("n"), 100);
    // Not whole blocks, zero, both sizes, neither: invalid params naming the field.
    assert_param(&f.err("bdev_null_resize", json!({"name": "n", "new_size_bytes": 1000})), "new_size_bytes");
    assert_param(&f.err("bdev_null_resize", json!({"name": "n", "new_size": 0})), "new_size");
    assert_param(
        &f.err("bdev_null_resize", json!({"name": "n", "new_size": 1, "new_size_bytes": 512})),
        "new_size_bytes",
    );
    assert_param(&f.err("bdev_null_resize", json!({"name": "n"})), "new_size");
    assert_param(&f.err("bdev_null_resize", json!({"name": "n", "new_size": -1})), "new_size");
    assert_eq!(blocks("n"), 100);
    // A missing bdev, or one of another module: -19 (ENODEV).
    assert_eq!(f.err("bdev_null_resize", json!({"name": "nope", "new_size": 1})).code, -19);
    f.ok("bdev_malloc_create", json!({"name": "m", "num_blocks": 2048, "block_size": 512}));
    assert_eq!(f.err("bdev_null_resize", json!({"name": "m", "new_size": 4})).code, -19);
    assert_eq!(f.err("bdev_uring_rescan", json!({"name": "m"})).code, -19);
    // A RAM disk grows in place, and shrinks.
    assert_eq!(f.ok("bdev_malloc_resize", json!({"name": "m", "new_size": 4})), true);
    assert_eq!(blocks("m"), 8192);
    assert_eq!(f.ok("bdev_malloc_resize", json!({"name": "m", "new_size": 1})), true);
    assert_eq!(blocks("m"), 2048);
}

#[test]
fn a_bdev_in_use_may_grow_but_not_shrink_and_its_stack_follows() {
    let f = fixture();
    f.null("base");
    f.ok(
        "bdev_delay_create",
        json!({"base_bdev_name": "base", "name": "slow", "avg_read_latency": 0, "p99_read_latency": 0,
               "avg_write_latency": 0, "p99_write_latency": 0}),
    );
    let e = f.err("bdev_null_resize", json!({"name": "base", "new_size_bytes": 512 * 512}));
    assert_eq!(e.code, -16, "{e:?}");
    assert!(e.message.contains("shrink") && e.message.contains("slow"), "{e:?}");
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "base"}))[0]["num_blocks"], 1024);
    // Growing is fine, and the delay bdev on top grows with its base.
    assert_eq!(f.ok("bdev_null_resize", json!({"name": "base", "new_size": 1})), true);
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "slow"}))[0]["num_blocks"], 2048);
}

#[test]
fn malloc_resize_is_bounded_by_the_memory_limit() {
    let limits = crate::Limits { max_malloc_bytes: 4 << 20, ..Default::default() };
    let f = fixture_with(limits);
    f.ok("bdev_malloc_create", json!({"name": "m", "num_blocks": 2048, "block_size": 512}));
    assert_eq!(f.ok("bdev_malloc_resize", json!({"name": "m", "new_size": 4})), true);
    assert_param(&f.err("bdev_malloc_resize", json!({"name": "m", "new_size": 5})), "new_size");
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "m"}))[0]["num_blocks"], 8192);
}

#[test]
fn uring_rescan_takes_the_file_size() {
    let f = fixture();
    let path = f.dir.path().join("disk.img");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(1 << 20).unwrap();
    f.ok("bdev_uring_create", json!({"name": "u", "filename": path, "direct": false}));
    file.set_len(3 << 20).unwrap();
    assert_eq!(f.ok("bdev_uring_rescan", json!({"name": "u"})), true);
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "u"}))[0]["num_blocks"], 3 * 2048);
    // A file cut to less than a block: refused, naming the field; the bdev keeps its size.
    file.set_len(100).unwrap();
    let e = f.err("bdev_uring_rescan", json!({"name": "u"}));
    assert_param(&e, "num_blocks");
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "u"}))[0]["num_blocks"], 3 * 2048);
    assert_param(&f.err("bdev_uring_rescan", json!({"name": "u", "new_size": 1})), "new_size");
}

// ---- logical volumes (bdev_lvol_*) ----

fn lvstore(f: &Fixture) -> String {
    f.ok("bdev_malloc_create", json!({"name": "m0", "num_blocks": 32768, "block_size": 512}));
    f.ok("bdev_lvol_create_lvstore", json!({"bdev_name": "m0", "lvs_name": "lvs", "cluster_sz": 1048576}))
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn lvstore_create_list_and_errors() {
    let f = fixture();
    let uuid = lvstore(&f);
    let stores = f.ok("bdev_lvol_get_lvstores", Value::Null);
    let s = &stores[0];
    assert_eq!(
        (s["uuid"].as_str(), s["name"].as_str(), s["base_bdev"].as_str()),
        (Some(&*uuid), Some("lvs"), Some("m0"))
    );
    assert_eq!((s["cluster_size"].as_u64(), s["block_size"].as_u64()), (Some(1 << 20), Some(512)));
    let total = s["total_data_clusters"].as_u64().unwrap();
    assert!(total > 10 && total < 16, "{s}");
    assert_eq!(s["free_clusters"], s["total_data_clusters"]);
    assert_eq!(f.ok("bdev_lvol_get_lvstores", json!({"uuid": uuid}))[0]["name"], "lvs");
    // The base is the store's now.
    let b = &f.ok("bdev_get_bdevs", json!({"name": "m0"}))[0];
    assert_eq!((b["claimed"].as_bool(), b["claim_type"].as_str()), (Some(true), Some("exclusive_write")));
    assert!(f.methods.call("bdev_malloc_delete", Some(json!({"name": "m0"}))).is_err(), "the base is in use");
    f.null("n0");
    assert_param(
        &f.err("bdev_lvol_create_lvstore", json!({"bdev_name": "n0", "lvs_name": "x"})),
        "bdev_name",
    );
    assert_param(
        &f.err("bdev_lvol_create_lvstore", json!({"bdev_name": "nope", "lvs_name": "x"})),
        "bdev_name",
    );
    f.ok("bdev_malloc_create", json!({"name": "m1", "num_blocks": 32768, "block_size": 512}));
    assert_param(
        &f.err("bdev_lvol_create_lvstore", json!({"bdev_name": "m1", "lvs_name": "lvs"})),
        "lvs_name",
    );
    assert_param(
        &f.err("bdev_lvol_create_lvstore", json!({"bdev_name": "m1", "lvs_name": "a/b"})),
        "lvs_name",
    );
    for bad in [3000, 1 << 31] {
        assert_param(
            &f.err(
                "bdev_lvol_create_lvstore",
                json!({"bdev_name": "m1", "lvs_name": "y", "cluster_sz": bad}),
            ),
            "cluster_sz",
        );
    }
    assert_param(
        &f.err(
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "m1", "lvs_name": "y", "clear_method": "shred"}),
        ),
        "clear_method",
    );
    assert_param(&f.err("bdev_lvol_get_lvstores", json!({"uuid": "not-a-uuid"})), "uuid");
    assert_param(&f.err("bdev_lvol_get_lvstores", json!({"uuid": uuid, "lvs_name": "lvs"})), "lvs_name");
    // m1 is untouched by the refusals: still unclaimed.
    assert!(f.ok("bdev_get_bdevs", json!({"name": "m1"}))[0]["claimed"] == false);
    // Sizes are whole clusters (4 MiB by default).
    f.ok("bdev_lvol_create_lvstore", json!({"bdev_name": "m1", "lvs_name": "big"}));
    assert_param(
        &f.err("bdev_lvol_create", json!({"lvs_name": "big", "lvol_name": "w", "size_in_mib": 3})),
        "size_in_mib",
    );
    assert_param(
        &f.err("bdev_lvol_create", json!({"lvs_name": "big", "lvol_name": "w", "size_in_mib": 0})),
        "size_in_mib",
    );
}

#[test]
fn volumes_snapshots_clones_by_rpc() {
    let f = fixture();
    let lvs_uuid = lvstore(&f);
    let v = f.ok(
        "bdev_lvol_create",
        json!({"lvs_name": "lvs", "lvol_name": "v", "size_in_mib": 4, "thin_provision": true}),
    );
    let v = v.as_str().unwrap().to_string();
    // Named by UUID, aliased lvs/v; either finds it.
    let b = &f.ok("bdev_get_bdevs", json!({"name": "lvs/v"}))[0];
    assert_eq!(
        (b["name"].as_str(), b["uuid"].as_str(), b["aliases"][0].as_str()),
        (Some(&*v), Some(&*v), Some("lvs/v"))
    );
    assert_eq!(
        (b["driver_specific"]["lvol"]["lvol_store_uuid"].as_str(), b["num_blocks"].as_u64()),
        (Some(&*lvs_uuid), Some(8192))
    );
    let snap = f
        .ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s"}))
        .as_str()
        .unwrap()
        .to_string();
    let clone = f
        .ok("bdev_lvol_clone", json!({"snapshot_name": "lvs/s", "clone_name": "c"}))
        .as_str()
        .unwrap()
        .to_string();
    let lvols = f.ok("bdev_lvol_get_lvols", json!({"lvs_name": "lvs"}));
    let find = |u: &str| lvols.as_array().unwrap().iter().find(|l| l["uuid"] == u).unwrap().clone();
    let (lv, ls, lc) = (find(&v), find(&snap), find(&clone));
    assert_eq!(
        (lv["alias"].as_str(), lv["is_clone"].as_bool(), lv["is_snapshot"].as_bool()),
        (Some("lvs/v"), Some(true), Some(false))
    );
    assert_eq!((ls["is_snapshot"].as_bool(), ls["name"].as_str()), (Some(true), Some("s")));
    assert_eq!(
        (lc["is_clone"].as_bool(), lc["is_thin_provisioned"].as_bool(), lc["lvs"]["uuid"].as_str()),
        (Some(true), Some(true), Some(&*lvs_uuid))
    );
    // Bad input, each naming its field and changing nothing.
    assert_param(
        &f.err("bdev_lvol_snapshot", json!({"lvol_name": "lvs/s", "snapshot_name": "s2"})),
        "lvol_name",
    );
    assert_param(
        &f.err("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "c"})),
        "snapshot_name",
    );
    assert_param(&f.err("bdev_lvol_resize", json!({"name": "lvs/s", "size_in_mib": 8})), "name");
    assert_param(&f.err("bdev_lvol_delete", json!({"name": "lvs/s"})), "name");
    assert_param(
        &f.err("bdev_lvol_clone", json!({"snapshot_name": "lvs/v", "clone_name": "c2"})),
        "snapshot_name",
    );
    assert_param(
        &f.err("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "w", "size_in_mib": 4096})),
        "size_in_mib",
    );
    assert_param(
        &f.err("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "w", "size_in_mib": 16})),
        "size_in_mib",
    );
    assert_param(
        &f.err("bdev_lvol_create", json!({"lvs_name": "lvs", "lvol_name": "v", "size_in_mib": 1})),
        "lvol_name",
    );
    assert_param(&f.err("bdev_lvol_create", json!({"lvol_name": "w", "size_in_mib": 1})), "lvs_name");
    assert_param(
        &f.err(
            "bdev_lvol_create",
            json!({"uuid": "00000000-0000-0000-0000-000000000000", "lvol_name": "w", "size_in_mib": 1}),
        ),
        "uuid",
    );
    assert_param(&f.err("bdev_lvol_delete", json!({"name": "lvs/nope"})), "name");
    assert_eq!(f.ok("bdev_lvol_get_lvols", Value::Null).as_array().unwrap().len(), 3);
    // Resize, rename, read-only, delete.
    f.ok("bdev_lvol_resize", json!({"name": v, "size_in_mib": 8}));
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "lvs/v"}))[0]["num_blocks"], 16384);
    f.ok("bdev_lvol_rename", json!({"old_name": "lvs/v", "new_name": "v2"}));
    assert!(f.methods.call("bdev_get_bdevs", Some(json!({"name": "lvs/v"}))).is_err());
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "lvs/v2"}))[0]["name"], v.as_str());
    f.ok("bdev_lvol_rename_lvstore", json!({"old_name": "lvs", "new_name": "pool"}));
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "pool/c"}))[0]["name"], clone.as_str());
    f.ok("bdev_lvol_set_read_only", json!({"name": "pool/c"}));
    f.ok("bdev_lvol_delete", json!({"name": "pool/c"}));
    f.ok("bdev_lvol_delete", json!({"name": "pool/v2"}));
    f.ok("bdev_lvol_delete", json!({"name": "pool/s"}));
    let s = &f.ok("bdev_lvol_get_lvstores", json!({"lvs_name": "pool"}))[0];
    assert_eq!(s["free_clusters"], s["total_data_clusters"], "every cluster is free again");
    // The base grows; the store takes the new room when asked.
    f.ok("bdev_malloc_resize", json!({"name": "m0", "new_size": 32}));
    f.ok("bdev_lvol_grow_lvstore", json!({"lvs_name": "pool"}));
    let grown = &f.ok("bdev_lvol_get_lvstores", json!({"lvs_name": "pool"}))[0];
    assert_eq!(grown["total_data_clusters"].as_u64(), Some(s["total_data_clusters"].as_u64().unwrap() + 16));
    assert_param(&f.err("bdev_lvol_grow_lvstore", json!({"lvs_name": "nope"})), "lvs_name");
    f.ok("bdev_lvol_delete_lvstore", json!({"lvs_name": "pool"}));
    assert_eq!(f.ok("bdev_lvol_get_lvstores", Value::Null), json!([]));
    f.ok("bdev_malloc_delete", json!({"name": "m0"}));
}

#[test]
fn an_lvstore_loads_when_its_base_bdev_appears() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk");
    std::fs::File::create(&file).unwrap().set_len(32 << 20).unwrap();
    let v;
    {
        let f = fixture();
        f.ok("bdev_uring_create", json!({"name": "u0", "filename": file, "block_size": 4096}));
        f.ok("bdev_lvol_create_lvstore", json!({"bdev_name": "u0", "lvs_name": "lvs"}));
        v = f.ok(
            "bdev_lvol_create",
            json!({"lvs_name": "lvs", "lvol_name": "v", "size_in_mib": 8, "thin_provision": true}),
        );
        f.ok("bdev_lvol_snapshot", json!({"lvol_name": "lvs/v", "snapshot_name": "s"}));
    }
    let f = fixture();
    f.ok("bdev_uring_create", json!({"name": "again", "filename": file, "block_size": 4096}));
    let b = &f.ok("bdev_get_bdevs", json!({"name": "lvs/v"}))[0];
    assert_eq!(b["name"], v);
    let stores = f.ok("bdev_lvol_get_lvstores", Value::Null);
    assert_eq!((stores[0]["name"].as_str(), stores[0]["base_bdev"].as_str()), (Some("lvs"), Some("again")));
    assert_eq!(f.ok("bdev_lvol_get_lvols", Value::Null).as_array().unwrap().len(), 2);
}

#[test]
fn qos_limits_are_set_changed_shown_and_removed() {
    let f = fixture();
    f.null("q0");
    let limits =
        |f: &Fixture| f.ok("bdev_get_bdevs", json!({"name": "q0"}))[0]["assigned_rate_limits"].clone();
    assert_eq!(
        limits(&f),
        json!({"rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0})
    );
    assert_eq!(f.ok("bdev_set_qos_limit", json!({"name": "q0", "rw_ios_per_sec": 20000})), true);
    // A limit left out keeps its value; 0 removes one; any number of changes.
    for i in 0..100u64 {
        f.ok("bdev_set_qos_limit", json!({"name": "q0", "w_mbytes_per_sec": 10 + i}));
    }
    assert_eq!(
        limits(&f),
        json!({"rw_ios_per_sec": 20000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 109})
    );
    f.ok("bdev_set_qos_limit", json!({"name": "q0", "rw_ios_per_sec": 0, "w_mbytes_per_sec": 0}));
    assert_eq!(limits(&f)["rw_ios_per_sec"], 0);
    assert_eq!(limits(&f)["w_mbytes_per_sec"], 0);
}

#[test]
fn bad_qos_limits_name_the_field_and_change_nothing() {
    let f = fixture();
    f.null("q0");
    f.ok("bdev_set_qos_limit", json!({"name": "q0", "rw_ios_per_sec": 5000}));
    assert_param(&f.err("bdev_set_qos_limit", json!({"name": "q0", "rw_ios_per_sec": -5})), "rw_ios_per_sec");
    let e = f.err("bdev_set_qos_limit", json!({"name": "q0", "rw_ios_per_sec": 999}));
    assert_param(&e, "rw_ios_per_sec");
    assert!(e.message.contains("below the minimum of 1000"), "{e:?}");
    assert_param(
        &f.err("bdev_set_qos_limit", json!({"name": "q0", "r_mbytes_per_sec": 1u64 << 60})),
        "r_mbytes_per_sec",
    );
    assert_param(
        &f.err("bdev_set_qos_limit", json!({"name": "q0", "r_mbytes_per_sec": "10"})),
        "r_mbytes_per_sec",
    );
    assert_param(&f.err("bdev_set_qos_limit", json!({"name": "q0"})), "rw_ios_per_sec");
    assert_param(&f.err("bdev_set_qos_limit", json!({"name": "q0", "rw_iops": 10})), "rw_iops");
    assert_param(&f.err("bdev_set_qos_limit", json!({"rw_ios_per_sec": 5000})), "name");
    assert_eq!(f.err("bdev_set_qos_limit", json!({"name": "nope", "rw_ios_per_sec": 5000})).code, -19);
    let l = &f.ok("bdev_get_bdevs", json!({"name": "q0"}))[0]["assigned_rate_limits"];
    assert_eq!((l["rw_ios_per_sec"].as_u64(), l["r_mbytes_per_sec"].as_u64()), (Some(5000), Some(0)));
}

#[test]
fn qos_groups_by_rpc() {
    let f = fixture();
    f.null("a");
    f.null("b");
    f.ok(
        "bdev_qos_group_create",
        json!({"name": "g", "iops_total": 10000, "iops_total_max": 20000, "iops_total_max_length": 5}),
    );
    f.ok("bdev_qos_group_add_bdev", json!({"name": "g", "bdev_name": "a", "weight": 3}));
    f.ok("bdev_qos_group_add_bdev", json!({"name": "g", "bdev_name": "b"}));
    let g = &f.ok("bdev_qos_get_groups", json!({"name": "g"}))[0];
    assert_eq!((g["iops_total"].as_u64(), g["iops_total_max"].as_u64()), (Some(10000), Some(20000)));
    assert_eq!((g["iops_total_max_length"].as_u64(), g["bps_write"].as_u64()), (Some(5), Some(0)));
    assert_eq!(g["fair_on"], "iops_total");
    let members: Vec<(String, u64)> = g["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["bdev_name"].as_str().unwrap().to_string(), m["weight"].as_u64().unwrap()))
        .collect();
    assert_eq!(members, [("a".to_string(), 3), ("b".to_string(), 1)]);
    // The weighted shares of the ceiling (the burst is whole at the start): 15 K / 5 K.
    let rates: Vec<u64> =
        g["members"].as_array().unwrap().iter().map(|m| m["rate"].as_u64().unwrap()).collect();
    assert_eq!(rates, [15000, 5000]);
    assert_eq!(
        f.ok("bdev_get_bdevs", json!({"name": "a"}))[0]["qos_group"],
        json!({"name": "g", "weight": 3})
    );
    // Set changes only what is given.
    f.ok(
        "bdev_qos_group_set",
        json!({"name": "g", "iops_total_max": 0, "iops_total_max_length": 0, "bps_read": 1048576}),
    );
    let g = &f.ok("bdev_qos_get_groups", json!({}))[0];
    assert_eq!(
        (g["iops_total"].as_u64(), g["iops_total_max"].as_u64(), g["bps_read"].as_u64()),
        (Some(10000), Some(0), Some(1048576))
    );
    f.ok("bdev_qos_group_set_weight", json!({"name": "g", "bdev_name": "b", "weight": 2}));
    assert_eq!(f.ok("bdev_get_bdevs", json!({"name": "b"}))[0]["qos_group"]["weight"], 2);
    // The shares follow the weight at once: 3:2 of 10 K.
    let g = &f.ok("bdev_qos_get_groups", json!({"name": "g"}))[0];
    let rates: Vec<u64> =
        g["members"].as_array().unwrap().iter().map(|m| m["rate"].as_u64().unwrap()).collect();
    assert_eq!(rates, [6000, 4000]);
    // A disk in two groups, a group with members deleted, bad values: errors naming the field.
    f.ok("bdev_qos_group_create", json!({"name": "h"}));
    let e = f.err("bdev_qos_group_add_bdev", json!({"name": "h", "bdev_name": "a"}));
    assert_param(&e, "bdev_name");
    assert!(e.message.contains("already in QoS group 'g'"), "{e:?}");
    assert_eq!(f.err("bdev_qos_group_create", json!({"name": "g"})).code, -17);
    let e = f.err("bdev_qos_group_delete", json!({"name": "g"}));
    assert_eq!(e.code, -16);
    assert_eq!(e.message, "QoS group 'g' still has members: a,b (remove them first)");
    assert_param(
        &f.err("bdev_qos_group_add_bdev", json!({"name": "h", "bdev_name": "a", "weight": 0})),
        "weight",
    );
    assert_param(
        &f.err("bdev_qos_group_add_bdev", json!({"name": "h", "bdev_name": "a", "weight": 65536})),
        "weight",
    );
    assert_param(&f.err("bdev_qos_group_create", json!({"name": "x", "iops_total_max": 10})), "iops_total");
    assert_param(
        &f.err("bdev_qos_group_create", json!({"name": "x", "iops_total": 10, "iops_read": 5})),
        "iops_total",
    );
    assert_param(&f.err("bdev_qos_group_create", json!({"name": "x", "bps_read": -1})), "bps_read");
    assert_param(
        &f.err("bdev_qos_group_create", json!({"name": "x", "iops_write_max_length": 100000})),
        "iops_write_max_length",
    );
    assert_param(&f.err("bdev_qos_group_set", json!({"name": "g"})), "iops_total");
    assert_param(
        &f.err("bdev_qos_group_set", json!({"name": "g", "iops_total": 10, "iops_read": 5})),
        "iops_total",
    );
    assert_param(&f.err("bdev_qos_group_remove_bdev", json!({"name": "h", "bdev_name": "a"})), "bdev_name");
    assert_eq!(f.err("bdev_qos_group_add_bdev", json!({"name": "zz", "bdev_name": "a"})).code, -19);
    assert_eq!(f.err("bdev_qos_group_add_bdev", json!({"name": "h", "bdev_name": "zz"})).code, -19);
    assert_eq!(f.ok("bdev_qos_get_groups", json!({"name": "g"}))[0]["iops_total"], 10000, "unchanged");
    // Members leave (removed, or their bdev deleted); then the group goes.
    f.ok("bdev_qos_group_remove_bdev", json!({"name": "g", "bdev_name": "a"}));
    f.ok("bdev_null_delete", json!({"name": "b"}));
    assert_eq!(f.ok("bdev_qos_get_groups", json!({"name": "g"}))[0]["members"], json!([]));
    assert!(f.ok("bdev_get_bdevs", json!({"name": "a"}))[0].get("qos_group").is_none());
    f.ok("bdev_qos_group_delete", json!({"name": "g"}));
    assert_eq!(f.err("bdev_qos_get_groups", json!({"name": "g"})).code, -19);
}

#[test]
fn rbd_methods_refuse_bad_input_by_field_without_touching_a_cluster() {
    let f = fixture();
    // Decoding and lookups fail before anything connects.
    assert_param(&f.err("bdev_rbd_create", json!({"rbd_name": "i"})), "pool_name");
    assert_param(&f.err("bdev_rbd_create", json!({"pool_name": "p"})), "rbd_name");
    assert_param(
        &f.err("bdev_rbd_create", json!({"pool_name": "p", "rbd_name": "i", "cluster_name": "c"})),
        "cluster_name",
    );
    assert_param(
        &f.err(
            "bdev_rbd_create",
            json!({"pool_name": "p", "rbd_name": "i", "cluster_name": "c", "user_id": "u"}),
        ),
        "user_id",
    );
    assert_param(&f.err("bdev_rbd_create", json!({"pool_name": "p", "rbd_name": "i", "uuid": "x"})), "uuid");
    assert_param(
        &f.err("bdev_rbd_create", json!({"pool_name": "p", "rbd_name": "i", "block_size": -1})),
        "block_size",
    );
    assert_param(&f.err("bdev_rbd_register_cluster", json!({})), "name");
    assert_param(&f.err("bdev_rbd_register_cluster", json!({"name": "c", "core_mask": "0xg"})), "core_mask");
    assert_param(
        &f.err("bdev_rbd_register_cluster", json!({"name": "c", "config_param": {"a": {"b": 1}}})),
        "config_param.a",
    );
    assert_param(
        &f.err("bdev_rbd_register_cluster", json!({"name": "c", "config_param": ["x"]})),
        "config_param",
    );
    assert_param(&f.err("bdev_rbd_unregister_cluster", json!({"name": "c"})), "name");
    assert_param(&f.err("bdev_rbd_get_clusters_info", json!({"name": "c"})), "name");
    assert_eq!(f.ok("bdev_rbd_get_clusters_info", json!({})), json!([]));
    assert_eq!(f.err("bdev_rbd_delete", json!({"name": "nope"})).code, -19);
    assert_eq!(f.err("bdev_rbd_resize", json!({"name": "nope", "new_size": 1})).code, -19);
    // Resizing a bdev of another module through the rbd method is refused.
    f.ok("bdev_null_create", json!({"name": "n", "num_blocks": 8, "block_size": 512}));
    assert_eq!(f.err("bdev_rbd_resize", json!({"name": "n", "new_size": 1})).code, -19);
    assert!(f
        .ok("rpc_get_methods", json!({}))
        .as_array()
        .unwrap()
        .contains(&json!("bdev_rbd_register_cluster")));
}
