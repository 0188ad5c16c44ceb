//! Mirror jobs through the registry's methods, on a real reactor: a copy that completes, the
//! claims and deletions a job holds off, every refusal. (The data itself is checked in
//! fp-bdev's mirror tests and end to end in crates/flashpath/tests/mirror.rs.)

use std::time::{Duration, Instant};

use fp_reactor::{ReactorConfig, ReactorSet};
use serde_json::{json, Value};

use crate::{Registry, RegistryError, RegistryOptions};

struct Fixture {
    registry: std::sync::Arc<Registry>,
    reactors: Option<ReactorSet>,
    _dir: tempfile::TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(r) = self.reactors.take() {
            r.shutdown();
        }
    }
}

fn fixture(iostat: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let reactors = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let options = RegistryOptions { iostat, ..RegistryOptions::default() };
    let registry = Registry::with_options(reactors.handles().to_vec(), dir.path(), options);
    Fixture { registry, reactors: Some(reactors), _dir: dir }
}

impl Fixture {
    fn call(&self, method: &str, params: Value) -> Result<Value, fp_rpc::RpcError> {
        self.registry.call_json(method, params)
    }

    fn malloc(&self, name: &str, num_blocks: u64) {
        self.registry.malloc_for_test(name, num_blocks)
    }

    fn job(&self, id: &str) -> Value {
        self.call("bdev_mirror_get_jobs", json!({ "job_id": id })).unwrap()[0].clone()
    }

    fn wait_state(&self, id: &str, state: &str) -> Value {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let j = self.job(id);
            if j["state"] == state || Instant::now() > until {
                assert_eq!(j["state"], state, "{j}");
                return j;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[test]
fn a_job_copies_completes_and_releases_the_target() {
    let f = fixture(true);
    f.malloc("src", 8192);
    f.malloc("tgt", 16384);
    let id = f.call("bdev_mirror_start", json!({ "source": "src", "target": "tgt" })).unwrap();
    assert_eq!(id, "src", "job_id defaults to the source's name");
    let claims = &f.registry.bdevs(Some("tgt")).unwrap()[0].claims;
    assert_eq!(claims[0].holder, "mirror src");
    assert_eq!(claims[0].claim_type.name(), "exclusive_write");
    // Neither disk may go while the job runs.
    let e = f.registry.delete_bdev("src", None).unwrap_err();
    assert!(matches!(e, RegistryError::InUse { ref by, .. } if by == "mirror src"), "{e}");
    assert!(f.registry.delete_bdev("tgt", None).is_err());

    let j = f.wait_state("src", "ready");
    assert_eq!((j["len"].as_u64(), j["dirty_bytes"].as_u64()), (Some(8192 * 512), Some(0)));
    assert_eq!(j["granularity"], 65536);
    assert_eq!(j["weight"], fp_bdev::copy_share::DEFAULT_COPY_WEIGHT, "guest first by default");
    assert_eq!(j["copy_mode"], "background", "QEMU's default");
    assert!(j["copied"].as_u64().unwrap() >= 8192 * 512);
    assert_eq!(f.call("bdev_mirror_complete", json!({ "job_id": "src" })).unwrap(), true);
    let j = f.job("src");
    assert_eq!(j["state"], "completed");
    assert!(j.get("error").is_none());
    assert!(f.registry.bdevs(Some("tgt")).unwrap()[0].claims.is_empty(), "released on completion");
    // Ended jobs stay listed until cancelled (dismissed); then the source may go.
    assert_eq!(f.call("bdev_mirror_cancel", json!({ "job_id": "src" })).unwrap(), true);
    assert_eq!(f.call("bdev_mirror_get_jobs", json!({})).unwrap(), json!([]));
    f.registry.delete_bdev("src", None).unwrap();
    f.registry.delete_bdev("tgt", None).unwrap();
}

#[test]
fn a_job_takes_the_weight_and_copy_mode_asked_for() {
    let f = fixture(true);
    f.malloc("src", 2048);
    f.malloc("tgt", 2048);
    let p = json!({ "source": "src", "target": "tgt", "weight": 60, "copy_mode": "write-blocking" });
    f.call("bdev_mirror_start", p).unwrap();
    let j = f.job("src");
    assert_eq!((&j["weight"], &j["copy_mode"]), (&json!(60), &json!("write-blocking")));
    let j = f.wait_state("src", "ready");
    assert_eq!(j["dirty_bytes"], 0);
    assert_eq!(f.call("bdev_mirror_complete", json!({ "job_id": "src" })).unwrap(), true);
    assert_eq!(f.job("src")["state"], "completed");
}

#[test]
fn cancel_leaves_both_disks_free() {
    let f = fixture(true);
    f.malloc("src", 1 << 17); // 64 MiB: still copying when cancelled
    f.malloc("tgt", 1 << 17);
    f.call("bdev_mirror_start", json!({ "source": "src", "target": "tgt", "job_id": "m1" })).unwrap();
    assert_eq!(f.call("bdev_mirror_cancel", json!({ "job_id": "m1" })).unwrap(), true);
    let j = f.job("m1");
    assert_eq!(j["state"], "cancelled");
    assert_eq!(j["in_flight"], 0);
    assert!(f.registry.bdevs(Some("tgt")).unwrap()[0].claims.is_empty());
    let e = f.call("bdev_mirror_complete", json!({ "job_id": "m1" })).unwrap_err();
    assert!(e.message.contains("is cancelled: it is over"), "{e:?}");
    assert_eq!(e.code, -libc::EBUSY, "not an I/O error: the job is in the wrong state");
    f.registry.delete_bdev("src", None).unwrap();
}

#[test]
fn refusals_name_what_is_wrong() {
    let f = fixture(true);
    f.malloc("src", 2048);
    f.malloc("tgt", 2048);
    f.malloc("small", 2047);
    f.malloc("other", 2048);
    let start = |p: Value| f.call("bdev_mirror_start", p).unwrap_err();
    let e = start(json!({ "source": "nope", "target": "tgt" }));
    assert_eq!((e.code, e.message.as_str()), (-libc::ENODEV, "bdev 'nope' does not exist"));
    let e = start(json!({ "source": "src", "target": "small" }));
    assert!(e.message.starts_with("target: ") && e.message.contains("fewer than the source's"), "{e:?}");
    let e = start(json!({ "source": "src", "target": "src" }));
    assert!(e.message.starts_with("target: ") && e.message.contains("the source itself"), "{e:?}");
    let e = start(json!({ "source": "src", "target": "tgt", "granularity": 3000 }));
    assert!(e.message.starts_with("granularity: ") && e.message.contains("power of two"), "{e:?}");
    let e = start(json!({ "source": "src", "target": "tgt", "buf_size": 1 }));
    assert!(e.message.contains("buf_size: unknown parameter"), "{e:?}");
    let e = start(json!({ "target": "tgt" }));
    assert!(e.message.contains("source"), "{e:?}");
    for weight in [0, 101] {
        let e = start(json!({ "source": "src", "target": "tgt", "weight": weight }));
        assert!(e.message.starts_with("weight: "), "{e:?}");
    }
    let e = start(json!({ "source": "src", "target": "tgt", "copy_mode": "blocking" }));
    assert_eq!(e.message, "copy_mode: 'blocking' is not one of background, write-blocking");

    f.call("bdev_mirror_start", json!({ "source": "src", "target": "tgt" })).unwrap();
    let e = start(json!({ "source": "src", "target": "other", "job_id": "j2" }));
    assert_eq!(e.code, -libc::EBUSY);
    assert!(e.message.contains("mirror src"), "a second job on one source: {e:?}");
    let e = start(json!({ "source": "other", "target": "tgt", "job_id": "j3" }));
    assert_eq!(e.code, -libc::EBUSY, "the target is claimed: {e:?}");
    let e = start(json!({ "source": "other", "target": "small", "job_id": "src" }));
    assert_eq!(e.code, -libc::EEXIST, "the job id is taken: {e:?}");
    let e = f.call("bdev_mirror_get_jobs", json!({ "job_id": "zz" })).unwrap_err();
    assert_eq!(e.code, -libc::ENODEV);
    f.call("bdev_mirror_cancel", json!({ "job_id": "src" })).unwrap();

    let off = fixture(false);
    off.malloc("src", 2048);
    off.malloc("tgt", 2048);
    let e = off.call("bdev_mirror_start", json!({ "source": "src", "target": "tgt" })).unwrap_err();
    assert!(e.message.contains("statistics are switched off"), "{e:?}");
    assert!(off.registry.bdevs(Some("tgt")).unwrap()[0].claims.is_empty(), "nothing left claimed");
}
