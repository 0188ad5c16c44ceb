//! The registry's limits, on targets whose reactors are never run (creating a controller only
//! binds its socket; nothing reaches a reactor until a frontend connects).

use std::sync::Arc;

use fp_bdev::{BdevError, ClaimType};

use super::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use fp_reactor::{Reactor, ReactorConfig};
use serde_json::json;

struct Fixture {
    registry: Arc<Registry>,
    dir: tempfile::TempDir,
    /// Kept alive so the handles stay valid.
    _reactor: Reactor,
}

fn fixture(limits: Limits) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let reactor = Reactor::new(0, None, ReactorConfig::default()).unwrap();
    let options = RegistryOptions { limits, ..RegistryOptions::default() };
    let registry = Registry::with_options(vec![reactor.handle()], dir.path(), options);
    Fixture { registry, dir, _reactor: reactor }
}

/// A module method and its parameters.
type Call = (&'static str, serde_json::Value);

/// Creating bdevs as the RPC server does, through their module's method.
trait CreateBdev {
    fn create_bdev(&self, call: Call) -> Result<serde_json::Value, RegistryError>;
}

impl CreateBdev for Registry {
    fn create_bdev(&self, (method, params): Call) -> Result<serde_json::Value, RegistryError> {
        self.call_module(method, Some(params)).expect("a module's method")
    }
}

fn null(name: &str) -> Call {
    ("bdev_null_create", json!({ "name": name, "num_blocks": 8, "block_size": 512 }))
}

fn malloc(num_blocks: u64, block_size: u32) -> Call {
    ("bdev_malloc_create", json!({ "name": "m", "num_blocks": num_blocks, "block_size": block_size }))
}

fn delay(name: &str, base: &str) -> Call {
    let params = json!({ "name": name, "base_bdev_name": base, "avg_read_latency": 0,
        "p99_read_latency": 0, "avg_write_latency": 0, "p99_write_latency": 0 });
    ("bdev_delay_create", params)
}

fn vhost(ctrlr: &str, dev: &str, num_queues: Option<u16>) -> VhostBlkSpec {
    VhostBlkSpec {
        ctrlr: ctrlr.into(),
        dev_name: dev.into(),
        cpus: None,
        readonly: false,
        num_queues,
        migrate_from: None,
        stop_timeout: None,
    }
}

#[test]
fn default_limits_are_finite() {
    let l = Limits::default();
    assert_eq!((l.max_bdevs, l.max_exports), (DEFAULT_MAX_BDEVS, DEFAULT_MAX_EXPORTS));
    assert_eq!(l.max_malloc_bytes, total_ram().unwrap());
}

#[test]
fn bdev_limit_counts_every_type_and_frees_on_delete() {
    let f = fixture(Limits { max_bdevs: 3, ..Limits::default() });
    f.registry.create_bdev(null("a")).unwrap();
    f.registry.create_bdev(malloc(8, 512)).unwrap();
    f.registry.create_bdev(delay("d", "a")).unwrap();
    let e = f.registry.create_bdev(null("b")).unwrap_err();
    assert!(matches!(e, RegistryError::LimitReached { limit: 3, .. }), "{e:?}");
    assert_eq!(e.errno(), -28);
    assert!(!e.is_invalid_params());
    assert_eq!(
        e.to_string(),
        "cannot create bdev 'b': 3 bdevs already exist, the limit set by limits.max_bdevs"
    );
    // A delay bdev over a new base is refused the same way, and leaves the base unclaimed.
    let e = f.registry.create_bdev(delay("d2", "m"));
    assert!(matches!(e, Err(RegistryError::LimitReached { .. })), "{e:?}");
    assert!(f.registry.bdevs(Some("m")).unwrap()[0].claims.is_empty());
    f.registry.delete_bdev("m", None).unwrap();
    f.registry.create_bdev(null("b")).unwrap();
    assert_eq!(f.registry.bdevs(None).unwrap().len(), 3);
}

#[test]
fn controller_limit_refuses_the_next_one_and_frees_on_delete() {
    let f = fixture(Limits { max_exports: 2, ..Limits::default() });
    for d in ["a", "b", "c"] {
        f.registry.create_bdev(null(d)).unwrap();
    }
    f.registry.create_vhost_blk(vhost("v0", "a", None)).unwrap();
    f.registry.create_vhost_blk(vhost("v1", "b", None)).unwrap();
    let e = f.registry.create_vhost_blk(vhost("v2", "c", None)).unwrap_err();
    assert_eq!(e.errno(), -28);
    assert_eq!(
        e.to_string(),
        "cannot create controller 'v2': 2 controllers already exist, the limit set by limits.max_exports"
    );
    // The refused controller left nothing behind: no socket, its bdev unclaimed.
    assert!(!f.dir.path().join("v2").exists());
    assert!(f.registry.bdevs(Some("c")).unwrap()[0].claims.is_empty());
    f.registry.delete_vhost("v0").unwrap();
    f.registry.create_vhost_blk(vhost("v2", "c", None)).unwrap();
    assert_eq!(f.registry.controllers(None).unwrap().len(), 2);
    f.registry.shutdown();
}

#[test]
fn num_queues_outside_1_to_max_queues_is_refused() {
    let f = fixture(Limits::default());
    f.registry.create_bdev(null("a")).unwrap();
    let max = fp_vhost_blk::MAX_QUEUES;
    for n in [0, max + 1, u16::MAX] {
        let e = f.registry.create_vhost_blk(vhost("v", "a", Some(n))).unwrap_err();
        assert!(
            matches!(&e, RegistryError::Invalid { field: "num_queues", reason } if reason.contains(&max.to_string())),
            "{n}: {e:?}"
        );
    }
    // Nothing refused was created.
    assert!(f.registry.controllers(None).unwrap().is_empty());
    assert!(f.registry.bdevs(Some("a")).unwrap()[0].claims.is_empty());
    f.registry.shutdown();
}

#[test]
fn without_num_queues_a_controller_offers_max_queues_on_one_reactor() {
    let f = fixture(Limits::default());
    f.registry.create_bdev(null("a")).unwrap();
    f.registry.create_vhost_blk(vhost("v", "a", None)).unwrap();
    // One reactor, yet every queue a frontend may ask for (QEMU: one per vCPU).
    assert_eq!(f.registry.reactors().len(), 1);
    let c = &f.registry.controllers(Some("v")).unwrap()[0];
    assert_eq!(c.num_queues, fp_vhost_blk::MAX_QUEUES);
    assert_eq!(c.stats, fp_vhost_blk::ControllerStats::default(), "no queue has run yet");
    f.registry.shutdown();
}

#[test]
fn an_explicit_num_queues_is_the_bound_offered() {
    let f = fixture(Limits::default());
    let max = fp_vhost_blk::MAX_QUEUES;
    for (i, n) in [1, 3, max].into_iter().enumerate() {
        let (dev, ctrlr) = (format!("d{i}"), format!("v{i}"));
        f.registry.create_bdev(null(&dev)).unwrap();
        f.registry.create_vhost_blk(vhost(&ctrlr, &dev, Some(n))).unwrap();
        assert_eq!(f.registry.controllers(Some(&ctrlr)).unwrap()[0].num_queues, n, "{ctrlr}");
    }
    f.registry.shutdown();
}

#[test]
fn malloc_larger_than_the_limit_is_refused_before_mapping() {
    let f = fixture(Limits { max_malloc_bytes: 1 << 20, ..Limits::default() });
    let e = f.registry.create_bdev(malloc(257, 4096)).unwrap_err();
    assert!(e.is_invalid_params(), "{e:?}");
    let RegistryError::Invalid { field, reason } = &e else { panic!("{e:?}") };
    assert_eq!(*field, "num_blocks");
    assert!(reason.contains("1052672 bytes, more than the 1048576 allowed"), "{reason}");
    f.registry.create_bdev(malloc(256, 4096)).unwrap();
}

#[test]
fn a_petabyte_malloc_is_refused_on_any_machine_by_default() {
    let f = fixture(Limits::default());
    let e = f.registry.create_bdev(malloc((1 << 50) / 4096, 4096)).unwrap_err();
    assert!(matches!(e, RegistryError::Invalid { field: "num_blocks", .. }), "{e:?}");
    // A size that overflows 64 bits gets the geometry error, not a wrapped-around size.
    let e = f.registry.create_bdev(malloc(u64::MAX / 512, 4096)).unwrap_err();
    let RegistryError::Bdev(BdevError::InvalidParam { field: "num_blocks", reason }) = &e else {
        panic!("{e:?}")
    };
    assert!(reason.contains("fit 64 bits"), "{reason}");
    // So does a null bdev, which has no memory to cap.
    let e = f
        .registry
        .create_bdev(("bdev_null_create", json!({ "name": "n", "num_blocks": u64::MAX, "block_size": 512 })));
    assert!(
        matches!(e, Err(RegistryError::Bdev(BdevError::InvalidParam { field: "num_blocks", .. }))),
        "{e:?}"
    );
    assert!(f.registry.bdevs(None).unwrap().is_empty());
}

#[test]
fn vhost_sockets_get_the_configured_mode() {
    let f = fixture(Limits::default());
    f.registry.create_bdev(null("a")).unwrap();
    f.registry.create_vhost_blk(vhost("v0", "a", None)).unwrap();
    let mode = std::fs::metadata(f.dir.path().join("v0")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, DEFAULT_SOCKET_MODE, "{mode:o}");
    f.registry.shutdown();

    let reactor = Reactor::new(0, None, ReactorConfig::default()).unwrap();
    let options = RegistryOptions { socket_mode: 0o660, ..RegistryOptions::default() };
    let registry = Registry::with_options(vec![reactor.handle()], f.dir.path(), options);
    registry.create_bdev(null("b")).unwrap();
    registry.create_vhost_blk(vhost("v1", "b", None)).unwrap();
    let mode = std::fs::metadata(f.dir.path().join("v1")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o660, "{mode:o}");
    registry.shutdown();
}

/// A registry whose uring bdevs must live in `<dir>/exports`, with a disk image inside and one
/// outside.
fn exported() -> (Arc<Registry>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let exports = dir.path().join("exports");
    std::fs::create_dir_all(exports.join("sub")).unwrap();
    for f in ["exports/in.img", "exports/sub/deep.img", "outside.img"] {
        std::fs::write(dir.path().join(f), vec![0u8; 64 << 10]).unwrap();
    }
    let options = RegistryOptions {
        export_dirs: Some(ExportDirs::new(std::slice::from_ref(&exports)).unwrap()),
        ..RegistryOptions::default()
    };
    (Registry::with_options(vec![], &dir.path().join("vhost"), options), dir)
}

fn uring(name: &str, filename: &Path) -> Call {
    ("bdev_uring_create", json!({ "name": name, "filename": filename, "direct": false }))
}

fn refused_outside(registry: &Registry, filename: &Path) {
    let e = registry.create_bdev(uring("u", filename)).unwrap_err();
    assert_eq!(e.errno(), -13, "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("filename: '{}' is outside the allowed export directories", filename.display())
    );
    assert!(registry.bdevs(None).unwrap().is_empty());
}

#[test]
fn export_dirs_allow_files_inside() {
    let (registry, dir) = exported();
    let ex = dir.path().join("exports");
    registry.create_bdev(uring("a", &ex.join("in.img"))).unwrap();
    registry.create_bdev(uring("b", &ex.join("sub/deep.img"))).unwrap();
    // Symlinks and `..` are fine as long as where they lead is inside.
    std::os::unix::fs::symlink(ex.join("sub/deep.img"), ex.join("alias.img")).unwrap();
    registry.create_bdev(uring("c", &ex.join("alias.img"))).unwrap();
    let direct = ("bdev_uring_create", json!({ "name": "d", "filename": ex.join("sub/../in.img") }));
    match registry.create_bdev(direct) {
        // tmpfs has no O_DIRECT; the open itself got through the walk.
        Ok(_) | Err(RegistryError::Bdev(BdevError::Open { .. })) => {}
        Err(e) => panic!("{e:?}"),
    }
    // The name reported is the one asked for.
    let b = &registry.bdevs(Some("c")).unwrap()[0];
    assert_eq!(b.info.driver_specific.as_ref().unwrap().1, ex.join("alias.img").display().to_string());
    // A missing file inside is an open error (ENOENT), not a refusal.
    let e = registry.create_bdev(uring("e", &ex.join("none.img"))).unwrap_err();
    assert_eq!(e.errno(), -2, "{e:?}");
}

#[test]
fn export_dirs_refuse_paths_leading_outside() {
    let (registry, dir) = exported();
    let ex = dir.path().join("exports");
    refused_outside(&registry, Path::new("/etc/passwd"));
    refused_outside(&registry, &dir.path().join("outside.img"));
    refused_outside(&registry, &ex.join("../outside.img"));
    refused_outside(&registry, &ex.join("sub/../../outside.img"));
    // A file next to the export directory whose name starts the same.
    std::fs::create_dir(dir.path().join("exports2")).unwrap();
    std::fs::write(dir.path().join("exports2/x.img"), vec![0u8; 4096]).unwrap();
    refused_outside(&registry, &dir.path().join("exports2/x.img"));
    // Symlinks inside that lead out: to a file, and to a directory.
    std::os::unix::fs::symlink(dir.path().join("outside.img"), ex.join("escape.img")).unwrap();
    refused_outside(&registry, &ex.join("escape.img"));
    std::os::unix::fs::symlink("/etc", ex.join("etc")).unwrap();
    refused_outside(&registry, &ex.join("etc/passwd"));
    // Outside and missing: still "outside", which does not tell whether it exists.
    refused_outside(&registry, Path::new("/nonexistent/disk.img"));
}

#[test]
fn without_export_dirs_any_path_opens() {
    let f = fixture(Limits::default());
    let outside = f.dir.path().join("anywhere.img");
    std::fs::write(&outside, vec![0u8; 4096]).unwrap();
    f.registry.create_bdev(uring("u", &outside)).unwrap();
}

fn readonly(ctrlr: &str, dev: &str) -> VhostBlkSpec {
    VhostBlkSpec { readonly: true, ..vhost(ctrlr, dev, Some(1)) }
}

fn takes_over(ctrlr: &str, dev: &str, from: &str) -> VhostBlkSpec {
    VhostBlkSpec { migrate_from: Some(from.into()), ..vhost(ctrlr, dev, Some(1)) }
}

#[test]
fn a_migration_destination_shares_the_disk_with_its_source_only() {
    let f = fixture(Limits::default());
    f.registry.create_bdev(null("a")).unwrap();
    f.registry.create_bdev(null("b")).unwrap();
    f.registry.create_vhost_blk(vhost("src", "a", Some(1))).unwrap();
    f.registry.create_vhost_blk(vhost("other", "b", Some(1))).unwrap();
    let refused = |spec: VhostBlkSpec, needle: &str| {
        let e = f.registry.create_vhost_blk(spec).unwrap_err();
        assert!(e.to_string().contains(needle), "{e}");
        assert!(e.to_string().contains("migrate_from"), "names the field: {e}");
    };
    // Naming an export of another bdev, or none.
    refused(takes_over("dst", "a", "other"), "not the only holder");
    refused(takes_over("dst", "b", "nobody"), "not the only holder");
    f.registry.create_vhost_blk(takes_over("dst", "a", "src")).unwrap();
    let b = &f.registry.bdevs(Some("a")).unwrap()[0];
    assert_eq!(b.claimed_by().as_deref(), Some("src,dst"));
    // A second destination for one disk, and a plain writer, are refused.
    refused(takes_over("dst2", "a", "src"), "already has a migration destination ('dst')");
    let e = f.registry.create_vhost_blk(vhost("w", "a", Some(1))).unwrap_err();
    assert!(matches!(&e, RegistryError::InUse { by, .. } if by == "src,dst"), "{e:?}");
    let e = f.registry.create_vhost_blk(VhostBlkSpec { readonly: true, ..takes_over("r", "a", "src") });
    assert!(e.unwrap_err().to_string().contains("read-only"));
    // The migration done, the source goes; the destination holds the disk alone.
    f.registry.delete_vhost("src").unwrap();
    assert_eq!(f.registry.bdevs(Some("a")).unwrap()[0].claimed_by().as_deref(), Some("dst"));
    // A read-only export has nothing to hand over.
    f.registry.create_bdev(null("c")).unwrap();
    f.registry.create_vhost_blk(readonly("ro", "c")).unwrap();
    refused(takes_over("dst3", "c", "ro"), "read-only");
}

#[test]
fn read_only_controllers_share_a_bdev_a_writer_excludes_them() {
    let f = fixture(Limits::default());
    f.registry.create_bdev(null("a")).unwrap();
    f.registry.create_vhost_blk(readonly("r1", "a")).unwrap();
    f.registry.create_vhost_blk(readonly("r2", "a")).unwrap();
    let b = &f.registry.bdevs(Some("a")).unwrap()[0];
    let kinds: Vec<_> = b.claims.iter().map(|c| (c.holder.as_str(), c.claim_type)).collect();
    assert_eq!(kinds, [("r1", ClaimType::ReadManyWriteNone), ("r2", ClaimType::ReadManyWriteNone)]);
    // Neither a writable controller nor an exclusive stacked bdev may join the readers.
    let e = f.registry.create_vhost_blk(vhost("w", "a", Some(1))).unwrap_err();
    assert!(matches!(&e, RegistryError::InUse { by, .. } if by == "r1,r2"), "{e:?}");
    let e = f.registry.create_bdev(delay("d", "a")).unwrap_err();
    assert!(matches!(&e, RegistryError::InUse { .. }), "{e:?}");
    assert_eq!(e.errno(), -16);
    // Deleting the bdev is refused, naming who holds it.
    let e = f.registry.delete_bdev("a", None).unwrap_err();
    assert_eq!((e.errno(), e.to_string()), (-16, "bdev 'a' is in use by 'r1,r2'".to_string()));
    f.registry.delete_vhost("r1").unwrap();
    assert_eq!(f.registry.bdevs(Some("a")).unwrap()[0].claimed_by().as_deref(), Some("r2"));
    f.registry.delete_vhost("r2").unwrap();
    // Unclaimed again: a writer takes it, exclusively.
    f.registry.create_vhost_blk(vhost("w", "a", Some(1))).unwrap();
    let e = f.registry.create_vhost_blk(readonly("r3", "a")).unwrap_err();
    assert!(matches!(&e, RegistryError::InUse { by, .. } if by == "w"), "{e:?}");
    f.registry.delete_vhost("w").unwrap();
    f.registry.delete_bdev("a", None).unwrap();
}

#[test]
fn a_delay_bdev_claims_its_base_exclusively_until_deleted() {
    let f = fixture(Limits::default());
    f.registry.create_bdev(null("a")).unwrap();
    f.registry.create_bdev(delay("d", "a")).unwrap();
    let b = &f.registry.bdevs(Some("a")).unwrap()[0];
    assert_eq!(b.claims[0].claim_type, ClaimType::ExclusiveWrite);
    assert_eq!((b.claims[0].holder.as_str(), b.claims[0].holder_kind), ("d", "bdev"));
    let e = f.registry.create_vhost_blk(readonly("r", "a")).unwrap_err();
    assert!(matches!(&e, RegistryError::InUse { by, .. } if by == "d"), "{e:?}");
    let e = f.registry.create_bdev(delay("d2", "a")).unwrap_err();
    assert!(matches!(&e, RegistryError::InUse { .. }), "{e:?}");
    // The wrong module's delete does not find it; the delay one releases the base.
    let e = f.registry.delete_bdev("d", Some("null")).unwrap_err();
    assert!(matches!(&e, RegistryError::NotFound { .. }), "{e:?}");
    f.registry.call_module("bdev_delay_delete", Some(json!({ "name": "d" }))).unwrap().unwrap();
    assert!(f.registry.bdevs(Some("a")).unwrap()[0].claims.is_empty());
    f.registry.create_vhost_blk(readonly("r", "a")).unwrap();
}

#[test]
fn module_methods_are_dispatched_by_name() {
    let f = fixture(Limits::default());
    assert!(f.registry.call_module("vhost_create_blk_controller", None).is_none());
    let names: Vec<&str> = f.registry.module_methods().collect();
    for m in ["bdev_null_create", "bdev_malloc_delete", "bdev_uring_create", "bdev_delay_update_latency"] {
        assert!(names.contains(&m), "{m} in {names:?}");
    }
    // Parameter errors name the field and are -22.
    let e = f.registry.call_module("bdev_null_create", Some(json!({ "name": "n" }))).unwrap().unwrap_err();
    assert!(matches!(&e, RegistryError::Param(p) if p.field == "num_blocks"), "{e:?}");
    assert!(e.is_invalid_params());
    // A bdev's module reports its driver_specific.
    f.registry.create_bdev(null("a")).unwrap();
    f.registry.create_bdev(delay("d", "a")).unwrap();
    let d = &f.registry.bdevs(Some("d")).unwrap()[0];
    assert_eq!(d.driver_specific["base_bdev_name"], "a");
    assert_eq!(d.driver_specific["p99_write_latency"], 0);
}

/// The configuration file maps `type = "<name>"` to `bdev_<name>_create`, and methods are found
/// by name across modules: every module a `[[bdev]]` table may name needs the create method
/// (the nvme module's bdevs come from `bdev_nvme_attach_controller`), and no name may repeat.
#[test]
fn every_module_has_its_create_method_and_names_are_unique() {
    let mut names = std::collections::BTreeSet::new();
    for m in modules::MODULES {
        let methods: Vec<&str> = m.methods().iter().map(|(n, _)| *n).collect();
        let create = format!("bdev_{}_create", m.name());
        if m.configurable() {
            assert!(methods.contains(&create.as_str()), "{}: {methods:?}", m.name());
        }
        assert!(names.insert(m.name()), "module {} twice", m.name());
        for n in methods {
            assert!(names.insert(n), "method {n} twice");
        }
    }
}

/// `nbd_start_disk` without `nbd_device` takes the first `nbdN` socket in the vhost directory
/// that no export uses and no file occupies, as SPDK takes the first free `/dev/nbdN`; with
/// every one taken it is the export limit's error.
#[test]
fn an_nbd_export_without_a_device_gets_the_first_free_socket() {
    let f = fixture(Limits { max_exports: 3, ..Limits::default() });
    let dir = f.dir.path();
    std::fs::write(dir.join("nbd0"), b"someone else's").unwrap();
    let first = f.registry.free_nbd_device().unwrap();
    assert_eq!(first, dir.join("nbd1").to_str().unwrap());
    f.registry.create_bdev(null("n0")).unwrap();
    let started = f.registry.call("nbd_start_disk", Some(json!({"bdev_name": "n0"}))).unwrap();
    assert_eq!(started, json!(first));
    assert!(dir.join("nbd1").exists(), "the export listens there");
    assert_eq!(f.registry.free_nbd_device().unwrap(), dir.join("nbd2").to_str().unwrap());
    std::fs::write(dir.join("nbd2"), b"").unwrap();
    let e = f.registry.free_nbd_device().unwrap_err();
    assert!(matches!(e, RegistryError::LimitReached { setting: "limits.max_exports", .. }), "{e}");
    f.registry.stop_nbd(&first).unwrap();
}

/// A module's thread reaches the registry through `weak_handle` while it lives, and not after:
/// the handle does not keep it alive.
#[test]
fn the_weak_handle_reaches_the_registry_while_it_lives() {
    use fp_bdev::ModuleHost;
    let f = fixture(Limits::default());
    f.registry.create_bdev(null("n0")).unwrap();
    let weak = f.registry.weak_handle().expect("the registry gives a handle");
    let host = weak.upgrade().expect("the registry lives");
    assert!(host.bdev_exists("n0"));
    host.delete_bdev("n0", "null").unwrap();
    assert!(!f.registry.bdev_exists("n0"));
    drop(host);
    let Fixture { registry, dir, _reactor } = f;
    drop(registry);
    assert!(weak.upgrade().is_none(), "the handle kept the registry alive");
    drop(dir);
}
