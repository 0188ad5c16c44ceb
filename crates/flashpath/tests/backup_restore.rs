//! The backup module end to end (docs/backup.md, "Stores and the catalogue"): backups made in
//! the test process with fp-backup into a `file://` store, which the daemon then reads.
//!
//! * [`catalogue_lists_gets_verifies_deletes_and_collects`]: `backup_store_add`, then
//!   `backup_list/get/verify/delete/gc` over two backups, a damaged chunk found by a full
//!   verify and not by a quick one, an encrypted backup verified with a keyring key.
//! * [`store_add_refusals_name_the_field`].

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use fp_backup::{BackupKey, BackupOptions, ChunkSource, Job, Plan, Store, StoreConfig};
use serde_json::{json, Value};

const CHUNK: u64 = 64 << 10;
const CHUNKS: u64 = 8;

/// A disk in memory: a pattern per chunk, with chunks 2 and 5 all zero.
struct VecSource(Vec<u8>);

impl ChunkSource for VecSource {
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let at = offset as usize;
        buf.copy_from_slice(&self.0[at..at + buf.len()]);
        Ok(())
    }
}

fn disk_image(seed: u64) -> Vec<u8> {
    let mut data = common::pattern(seed, 0, (CHUNK * CHUNKS) as usize);
    for zero in [2u64, 5] {
        data[(zero * CHUNK) as usize..((zero + 1) * CHUNK) as usize].fill(0);
    }
    data
}

/// Backs `data` up as disk `disk` into the directory store at `dir`; returns the backup id.
fn make_backup(dir: &Path, disk: &str, data: &[u8], key: Option<Arc<BackupKey>>) -> String {
    let config = StoreConfig { url: format!("file://{}", dir.display()), ..StoreConfig::default() };
    let store = Store::open(&config).unwrap();
    let mut options = BackupOptions::new(disk, data.len() as u64);
    options.chunk_size = CHUNK;
    options.key = key;
    let manifest =
        fp_backup::backup(&store, &mut VecSource(data.to_vec()), Plan::Full, &options, &Job::new()).unwrap();
    manifest.id
}

fn add_store(d: &Daemon, name: &str, dir: &Path) {
    let url = format!("file://{}", dir.display());
    assert_eq!(d.call("backup_store_add", json!({"name": name, "url": url})), json!(true));
}

fn err(d: &Daemon, method: &str, params: Value) -> String {
    match d.try_call(method, params.clone()) {
        Err(e) => e.message,
        Ok(v) => panic!("{method} {params} succeeded: {v}"),
    }
}

/// Writes a 32-byte key file, owner-only, and adds it to the daemon's keyring as `name`.
fn add_key(d: &Daemon, name: &str, material: &[u8]) -> Arc<BackupKey> {
    use std::os::unix::fs::PermissionsExt;
    let path = d.dir.path().join(format!("{name}.key"));
    std::fs::write(&path, material).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    d.call("keyring_file_add_key", json!({"name": name, "path": path.to_str().unwrap()}));
    Arc::new(BackupKey::new(name, material).unwrap())
}

/// Flips one byte in the middle of the stored object of chunk `index` of a backup.
fn damage_chunk(dir: &Path, disk: &str, id: &str, index: usize) {
    let config = StoreConfig { url: format!("file://{}", dir.display()), ..StoreConfig::default() };
    let store = Store::open(&config).unwrap();
    let manifest = store.manifest(disk, id, None).unwrap();
    let object = manifest.chunks[index].expect("a stored chunk").object_key();
    let path = dir.join(object);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn catalogue_lists_gets_verifies_deletes_and_collects() {
    let store_dir = tempfile::tempdir().unwrap();
    let d = Daemon::start("0");
    let first = make_backup(store_dir.path(), "vm1", &disk_image(1), None);
    // Backup ids have a one-second timestamp: the second must sort after the first.
    std::thread::sleep(Duration::from_millis(1100));
    let second = make_backup(store_dir.path(), "vm1", &disk_image(2), None);
    add_store(&d, "s", store_dir.path());
    assert_eq!(
        d.call("backup_store_list", json!({})),
        json!([{"name": "s", "url": format!("file://{}", store_dir.path().display()), "endpoint": ""}])
    );

    let list = d.call("backup_list", json!({"store": "s"}));
    let ids: Vec<&str> = list.as_array().unwrap().iter().map(|b| b["backup_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [first.as_str(), second.as_str()]);
    let b = &list[0];
    assert_eq!(b["bdev"], "vm1");
    assert_eq!(b["kind"], "full");
    assert_eq!(b["size"], CHUNK * CHUNKS);
    assert_eq!(b["chunk_size"], CHUNK);
    assert_eq!(b["chunks"], CHUNKS);
    assert_eq!(b["zero_chunks"], 2);
    assert_eq!(b["parent"], Value::Null);
    assert_eq!(b["key"], Value::Null);
    assert_eq!(d.call("backup_list", json!({"store": "s", "bdev": "other"})), json!([]));
    assert_eq!(d.call("backup_get", json!({"store": "s", "bdev": "vm1", "backup_id": first})), list[0]);

    let ok = d.call("backup_verify", json!({"store": "s", "bdev": "vm1", "backup_id": first}));
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(ok["chunks_checked"], CHUNKS - 2);

    // A damaged chunk: a full verify finds it, a quick one (presence only) does not.
    damage_chunk(store_dir.path(), "vm1", &first, 3);
    let bad = d.call("backup_verify", json!({"store": "s", "bdev": "vm1", "backup_id": first}));
    assert_eq!(bad["ok"], false, "{bad}");
    assert_eq!(bad["corrupt"][0]["chunk"], 3, "{bad}");
    let quick =
        d.call("backup_verify", json!({"store": "s", "bdev": "vm1", "backup_id": first, "quick": true}));
    assert_eq!(quick["ok"], true, "{quick}");

    // An encrypted backup: listed with its key's name, verified with the keyring's key.
    let key = add_key(&d, "k1", &[7u8; 32]);
    let secret = make_backup(store_dir.path(), "vm2", &disk_image(3), Some(key));
    let listed = d.call("backup_list", json!({"store": "s", "bdev": "vm2"}));
    assert_eq!(listed[0]["key"], "k1");
    let v = d.call("backup_verify", json!({"store": "s", "bdev": "vm2", "backup_id": secret, "key": "k1"}));
    assert_eq!(v["ok"], true, "{v}");
    let no_key = err(&d, "backup_verify", json!({"store": "s", "bdev": "vm2", "backup_id": secret}));
    assert!(no_key.contains("key"), "{no_key}");
    let unknown_key =
        err(&d, "backup_verify", json!({"store": "s", "bdev": "vm2", "backup_id": secret, "key": "nope"}));
    assert!(unknown_key.starts_with("key:"), "{unknown_key}");

    // Errors name the field.
    assert!(err(&d, "backup_list", json!({"store": "nope"})).starts_with("store:"));
    assert!(err(&d, "backup_get", json!({"store": "s", "bdev": "vm1", "backup_id": "x"}))
        .starts_with("backup_id:"));
    assert!(
        err(&d, "backup_get", json!({"store": "s", "bdev": "a/b", "backup_id": first})).starts_with("bdev:")
    );
    let missing = "20000101T000000Z-00000000";
    let gone = err(&d, "backup_get", json!({"store": "s", "bdev": "vm1", "backup_id": missing}));
    assert!(gone.contains("not found"), "{gone}");

    // Delete the first backup; a GC with no grace collects the chunks only it referred to.
    assert_eq!(
        d.call("backup_delete", json!({"store": "s", "bdev": "vm1", "backup_id": first})),
        json!(true)
    );
    let left = d.call("backup_list", json!({"store": "s", "bdev": "vm1"}));
    assert_eq!(left.as_array().unwrap().len(), 1);
    let gc = d.call("backup_gc", json!({"store": "s", "grace_sec": 0}));
    assert_eq!(gc["manifests"], 2, "{gc}");
    assert_eq!(gc["chunks_deleted"], CHUNKS - 2, "{gc}");
    let v = d.call("backup_verify", json!({"store": "s", "bdev": "vm1", "backup_id": second}));
    assert_eq!(v["ok"], true, "{v}");

    assert_eq!(d.call("backup_store_remove", json!({"name": "s"})), json!(true));
    assert!(err(&d, "backup_store_remove", json!({"name": "s"})).starts_with("name:"));
}

#[test]
fn store_add_refusals_name_the_field() {
    let d = Daemon::start("0");
    let dir = tempfile::tempdir().unwrap();
    let e = err(&d, "backup_store_add", json!({"name": "s", "url": "ftp://x"}));
    assert!(e.starts_with("url:"), "{e}");
    let e = err(&d, "backup_store_add", json!({"name": "s", "url": "file:///no/such/dir/anywhere"}));
    assert!(e.starts_with("url:"), "{e}");
    let e = err(&d, "backup_store_add", json!({"name": "s", "url": "s3://bucket"}));
    assert!(e.starts_with("access_key_id:"), "{e}");
    let e = err(
        &d,
        "backup_store_add",
        json!({"name": "s", "url": "s3://bucket", "access_key_id": "AK", "secret_access_key": "very-secret-value",
               "endpoint": "http://127.0.0.1:9"}),
    );
    assert!(e.starts_with("endpoint:"), "{e}");
    assert!(!e.contains("very-secret-value"), "{e}");
    let e = err(
        &d,
        "backup_store_add",
        json!({"name": "s", "url": "s3://bucket", "access_key_id": "AK", "secret_access_key": "very-secret-value",
               "endpoint": "http://127.0.0.1:9", "allow_http": true}),
    );
    assert!(e.starts_with("endpoint:"), "{e}");
    assert!(!e.contains("very-secret-value"), "{e}");
    assert!(!d.stderr().contains("very-secret-value"), "a secret reached the log");
    let e = err(&d, "backup_store_add", json!({"name": "s", "url": "file:///x", "bogus": 1}));
    assert!(e.starts_with("bogus:"), "{e}");
    add_store(&d, "s", dir.path());
    let e =
        err(&d, "backup_store_add", json!({"name": "s", "url": format!("file://{}", dir.path().display())}));
    assert!(e.starts_with("name:"), "{e}");
}
