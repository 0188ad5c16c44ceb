//! Backup jobs in the registry, to a `file://` store opened here: the parent record a full
//! backup leaves is what an incremental needs, and anything that makes the bitmap stop holding
//! "the changes since that backup" (clear, disable, remove) forgets it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::RegistryOptions;

#[test]
fn store_names_map_every_bdev_name_one_way() {
    assert_eq!(store_disk_name("vm0").unwrap(), "vm0");
    assert_eq!(store_disk_name("lvs/vol.1").unwrap(), "lvs@2fvol.1");
    assert_eq!(store_disk_name(".hidden").unwrap(), "@2ehidden");
    assert_eq!(store_disk_name("a@b").unwrap(), "a@40b");
    assert_ne!(store_disk_name("a/b").unwrap(), store_disk_name("a@2fb").unwrap());
    assert!(matches!(store_disk_name(&"/".repeat(100)), Err(RegistryError::Invalid { field: "bdev", .. })));
}

struct Fixture {
    registry: Arc<Registry>,
    store: Arc<Store>,
    _dirs: [tempfile::TempDir; 3],
}

fn fixture() -> Fixture {
    let (vhost, state, store_dir) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let options =
        RegistryOptions { state_dir: Some(state.path().to_path_buf()), ..RegistryOptions::default() };
    let registry = Registry::with_options(Vec::new(), vhost.path(), options);
    let url = format!("file://{}", store_dir.path().display());
    let store = Arc::new(Store::open(&fp_backup::StoreConfig { url, ..Default::default() }).unwrap());
    Fixture { registry, store, _dirs: [vhost, state, store_dir] }
}

impl Fixture {
    fn start(&self, sync: &str) -> Result<String, RegistryError> {
        let spec = BackupSpec {
            bdev: "m0".into(),
            store: "st".into(),
            job_id: None,
            sync: sync.into(),
            bitmap: Some("b".into()),
            granularity: None,
            parent: None,
            chunk_size: Some(64 << 10),
            key: None,
            parallel: None,
            speed: 0,
        };
        self.registry.backup_start_with(spec, self.store.clone(), None, false)
    }

    fn wait(&self, id: &str) -> BackupStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.registry.backup_jobs(Some(id)).unwrap().remove(0);
            if s.state != BackupState::Running {
                self.registry.backup_cancel(id, BACKUP_WAIT).unwrap();
                return s;
            }
            assert!(Instant::now() < deadline, "{s:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn parent_field(e: RegistryError) -> &'static str {
    match e {
        RegistryError::Invalid { field, .. } => field,
        other => panic!("{other}"),
    }
}

#[test]
fn what_stops_the_bitmap_tracking_the_last_backup_forgets_it_as_a_parent() {
    let f = fixture();
    f.registry.malloc_for_test("m0", 2048);
    assert_eq!(parent_field(f.start("incremental").unwrap_err()), "bitmap", "no bitmap yet");
    let id = f.start("full").unwrap();
    let s = f.wait(&id);
    assert_eq!(s.state, BackupState::Completed, "{s:?}");
    assert_eq!(s.progress.chunks_total, 16);
    let s = f.wait(&f.start("incremental").unwrap());
    assert_eq!((s.state, s.progress.chunks_total), (BackupState::Completed, 0), "{s:?}");
    for (method, undo) in
        [("bdev_dirty_bitmap_clear", None), ("bdev_dirty_bitmap_disable", Some("bdev_dirty_bitmap_enable"))]
    {
        f.registry.call_json(method, json!({ "bdev": "m0", "name": "b" })).unwrap();
        if let Some(undo) = undo {
            f.registry.call_json(undo, json!({ "bdev": "m0", "name": "b" })).unwrap();
        }
        assert_eq!(parent_field(f.start("incremental").unwrap_err()), "parent", "after {method}");
        assert_eq!(f.wait(&f.start("full").unwrap()).state, BackupState::Completed);
    }
    f.registry.call_json("bdev_dirty_bitmap_remove", json!({ "bdev": "m0", "name": "b" })).unwrap();
    f.registry.call_json("bdev_dirty_bitmap_add", json!({ "bdev": "m0", "name": "b" })).unwrap();
    assert_eq!(parent_field(f.start("incremental").unwrap_err()), "parent", "a new bitmap of the same name");
    // Nothing is left of the jobs: no fleece, no scratch bdev, no record.
    assert_eq!(f.registry.bdevs(None).unwrap().len(), 1);
}
