//! The backup module end to end (docs/backup.md, "Stores and the catalogue"): backups made in
//! the test process with fp-backup into a `file://` store, which the daemon then reads.
//!
//! * [`catalogue_lists_gets_verifies_deletes_and_collects`]: `backup_store_add`, then
//!   `backup_list/get/verify/delete/gc` over two backups, a damaged chunk found by a full
//!   verify and not by a quick one, an encrypted backup verified with a keyring key.
//! * [`store_add_refusals_name_the_field`].
//! * [`live_restore_serves_at_once_keeps_the_guests_writes_and_completes`]: a restore bdev
//!   over a RAM base, held incomplete by a speed limit, exported over NBD: reads equal the
//!   backup, writes (spanning chunks) land, and once complete the base is backup + writes.
//! * [`live_restore_resumes_after_sigkill`]: the same over a file base with a configuration
//!   file and a state directory; SIGKILL mid-restore, restart: it resumes, the writes made
//!   before the kill survive, the result is exact.
//! * [`deleting_an_incomplete_restore_abandons_it_and_a_new_create_fetches_every_chunk_again`]:
//!   the delete removes the state file of a restore the guest wrote through; a new create of
//!   the same restore takes none of it up and ends with the base equal to the backup.
//! * [`a_corrupt_chunk_fails_its_reads_only`], [`restore_create_refusals_name_the_field`].

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::backup::VecSource;
use common::nbd::{start_export, Endpoint, NbdConn};
use common::Daemon;
use fp_backup::{BackupKey, BackupOptions, Job, Plan, Store, StoreConfig};
use serde_json::{json, Value};

const CHUNK: u64 = 64 << 10;
const CHUNKS: u64 = 8;

/// A disk in memory: a pattern per chunk, with chunks 2 and 5 all zero.
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

const SIZE: u64 = CHUNK * CHUNKS;

fn restore_status(d: &Daemon, name: &str) -> Value {
    let b = d.call("bdev_get_bdevs", json!({"name": name}));
    b[0]["driver_specific"]["backup_restore"].clone()
}

fn wait_complete(d: &Daemon, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let s = restore_status(d, name);
        if s["state"] == "complete" {
            assert_eq!(s["restored"], s["chunks"], "{s}");
            return;
        }
        assert!(std::time::Instant::now() < deadline, "restore not complete: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn nbd(d: &Daemon, bdev: &str) -> NbdConn {
    let sock = d.dir.path().join(format!("{bdev}.nbd"));
    start_export(d, bdev, sock.to_str().unwrap(), false);
    NbdConn::connect(&Endpoint::Unix(sock), bdev).unwrap()
}

fn read_all(c: &mut NbdConn) -> Vec<u8> {
    c.read(0, SIZE as u32).unwrap().expect("the read succeeds")
}

/// Guest writes: 512-byte aligned, not chunk aligned, one spanning two chunks, one inside a
/// zero chunk; applied to `want` too.
fn guest_writes(c: &mut NbdConn, want: &mut [u8]) {
    for (offset, len, seed) in
        [(CHUNK - 1024, 4096u64, 91u64), (5 * CHUNK + 512, 1536, 92), (7 * CHUNK + 3072, 512, 93)]
    {
        let data = common::pattern(seed, offset, len as usize);
        assert_eq!(c.write(offset, &data, 0).unwrap(), 0, "write at {offset}");
        want[offset as usize..(offset + len) as usize].copy_from_slice(&data);
    }
}

fn state_dir_args(dir: &Path) -> Vec<String> {
    vec!["--state-dir".into(), dir.display().to_string()]
}

#[test]
fn live_restore_serves_at_once_keeps_the_guests_writes_and_completes() {
    let store_dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let image = disk_image(11);
    let id = make_backup(store_dir.path(), "vm", &image, None);
    let args = state_dir_args(state.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start_with_args("0", &args);
    add_store(&d, "s", store_dir.path());
    d.malloc("base", SIZE / 512, 512);
    // 32 KiB/s: the copier alone needs at least 15 s for the 8 chunks, so it is not complete
    // when the checks below run (a lower bound, whatever the machine's speed).
    let r = d.call(
        "bdev_backup_restore_create",
        json!({"name": "r", "base_bdev": "base", "store": "s", "bdev": "vm", "backup_id": id, "speed": 32768}),
    );
    assert_eq!(r, "r");
    let s = restore_status(&d, "r");
    assert_eq!(s["state"], "copying", "{s}");
    assert_eq!(s["chunks"], CHUNKS);
    assert_eq!(s["store"], "s");
    assert_eq!(s["backup_id"], id.as_str());
    let b = d.call("bdev_get_bdevs", json!({"name": "r"}));
    assert_eq!(b[0]["num_blocks"], SIZE / 512);
    let base = d.call("bdev_get_bdevs", json!({"name": "base"}));
    assert_eq!(base[0]["claim_type"], "exclusive_write", "{base}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .arg("--rpc")
        .arg(&d.rpc)
        .args(["restore", "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("copying") && text.contains("base"), "{text}");
    let mut c = nbd(&d, "r");
    // Reads fetch what they touch at once.
    assert_eq!(c.read(3 * CHUNK + 512, 4096).unwrap().unwrap(), image[(3 * CHUNK + 512) as usize..][..4096]);
    assert!(read_all(&mut c) == image, "the restore bdev serves the backup");
    let mut want = image.clone();
    guest_writes(&mut c, &mut want);
    assert!(read_all(&mut c) == want, "the writes read back");
    drop(c);
    wait_complete(&d, "r");
    d.call("nbd_stop_disk", json!({"nbd_device": d.dir.path().join("r.nbd").to_str().unwrap()}));
    // A complete restore's file says so; deleting it leaves the base an ordinary disk.
    let file = std::fs::read_to_string(state.path().join("backup_restore/r.json")).unwrap();
    assert!(file.contains("\"complete\":true"), "{file}");
    assert_eq!(d.call("bdev_backup_restore_delete", json!({"name": "r"})), json!(true));
    let kept = std::fs::read_to_string(state.path().join("backup_restore/r.json")).unwrap();
    assert!(kept.contains("\"complete\":true"), "a complete restore's file stays: {kept}");
    let mut c = nbd(&d, "base");
    assert!(read_all(&mut c) == want, "the base is the backup plus the writes, byte for byte");
}

#[test]
fn deleting_an_incomplete_restore_abandons_it_and_a_new_create_fetches_every_chunk_again() {
    let store_dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let image = disk_image(51);
    let id = make_backup(store_dir.path(), "vm", &image, None);
    let args = state_dir_args(state.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start_with_args("0", &args);
    add_store(&d, "s", store_dir.path());
    d.malloc("base", SIZE / 512, 512);
    // One byte a second: the copier starts chunk 0 and no other; only reads and writes fetch.
    let create = json!({"name": "r", "base_bdev": "base", "store": "s", "bdev": "vm", "backup_id": id,
                        "speed": 1, "parallel": 1, "read_ahead": 0});
    let file = state.path().join("backup_restore/r.json");
    // The writes make chunks 0, 1, 5 and 7 durable (each fetched before its write lands).
    d.call("bdev_backup_restore_create", create.clone());
    let mut c = nbd(&d, "r");
    let mut want = image.clone();
    guest_writes(&mut c, &mut want);
    drop(c);
    d.call("nbd_stop_disk", json!({"nbd_device": d.dir.path().join("r.nbd").to_str().unwrap()}));
    let before = restore_status(&d, "r");
    assert_eq!(before["state"], "copying", "{before}");
    let durable = before["restored"].as_u64().unwrap();
    assert!((4..CHUNKS).contains(&durable), "the written chunks are durable, not all: {before}");
    assert!(file.exists(), "the state file names the durable chunks");

    // The delete abandons it: the state file goes.
    assert_eq!(d.call("bdev_backup_restore_delete", json!({"name": "r"})), json!(true));
    assert!(!file.exists(), "deleting an incomplete restore removes its state file");

    // A new create of the same restore starts over: the old durable set is not taken up (that
    // would be `durable` chunks at once). What the new one has is what it fetched since: the
    // copier's first chunk, and what reads of the new bdev fetched (a CI run saw 2; an early
    // read such as the new bdev's examination, which runs beside this call, is the likely
    // second), so the bound is the old set's size, not a count of fetches.
    // Everything it serves is the backup's, the writes made through the deleted restore being
    // overwritten chunk by chunk.
    d.call("bdev_backup_restore_create", create);
    let after = restore_status(&d, "r");
    assert!(after["restored"].as_u64().unwrap() < durable, "fetched again from the start: {after}");
    let mut c = nbd(&d, "r");
    assert!(read_all(&mut c) == image, "the new restore serves the backup, not the old writes");
    drop(c);
    wait_complete(&d, "r");
    d.call("nbd_stop_disk", json!({"nbd_device": d.dir.path().join("r.nbd").to_str().unwrap()}));
    assert_eq!(d.call("bdev_backup_restore_delete", json!({"name": "r"})), json!(true));
    let mut c = nbd(&d, "base");
    assert!(read_all(&mut c) == image, "the base ends equal to the backup");
    d.assert_alive();
}

#[test]
fn live_restore_resumes_after_sigkill() {
    use std::os::unix::fs::PermissionsExt;
    let store_dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let image = disk_image(21);
    let id = make_backup(store_dir.path(), "vm", &image, None);
    std::fs::create_dir(work.path().join("state")).unwrap();
    std::fs::set_permissions(work.path().join("state"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let file = work.path().join("base.img");
    std::fs::File::create(&file).unwrap().set_len(SIZE).unwrap();
    let config = work.path().join("flashpath.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{}\"\n\n[[backup_store]]\nname = \"s\"\nurl = \"file://{}\"\n\n\
             [[bdev]]\ntype = \"uring\"\nname = \"base\"\nfilename = \"{}\"\n\n\
             [[backup_restore]]\nname = \"r\"\nbase_bdev = \"base\"\nstore = \"s\"\nbdev = \"vm\"\n\
             backup_id = \"{id}\"\nspeed = 16384\nparallel = 1\nread_ahead = 0\n",
            work.path().join("state").display(),
            store_dir.path().display(),
            file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut d = Daemon::start_with_args("0", &["--config", config.to_str().unwrap()]);
    let mut c = nbd(&d, "r");
    let mut want = image.clone();
    guest_writes(&mut c, &mut want);
    drop(c);
    let s = restore_status(&d, "r");
    assert_eq!(s["state"], "copying", "16 KiB/s holds the copier back: {s}");
    d.kill9();
    d.restart();
    let s = restore_status(&d, "r");
    assert!(s["restored"].as_u64().unwrap() >= 3, "the chunks the writes touched were durable: {s}");
    let mut c = nbd(&d, "r");
    assert!(read_all(&mut c) == want, "after the restart: the backup and the writes");
    drop(c);
    wait_complete(&d, "r");
    let on_disk = std::fs::read(&file).unwrap();
    assert!(on_disk == want, "the base file is the backup plus the writes, byte for byte");
}

#[test]
fn a_corrupt_chunk_fails_its_reads_only() {
    let store_dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let image = disk_image(31);
    let id = make_backup(store_dir.path(), "vm", &image, None);
    damage_chunk(store_dir.path(), "vm", &id, 3);
    let args = state_dir_args(state.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start_with_args("0", &args);
    add_store(&d, "s", store_dir.path());
    d.malloc("base", SIZE / 512, 512);
    d.call(
        "bdev_backup_restore_create",
        json!({"name": "r", "base_bdev": "base", "store": "s", "bdev": "vm", "backup_id": id,
               "speed": 16384, "read_ahead": 0}),
    );
    let mut c = nbd(&d, "r");
    let err = c.read(3 * CHUNK, 4096).unwrap();
    assert!(err.is_err(), "a chunk that fails its check is an error, never data");
    assert_eq!(c.read(4 * CHUNK, 4096).unwrap().unwrap(), image[(4 * CHUNK) as usize..][..4096]);
    assert_eq!(c.read(0, 4096).unwrap().unwrap(), image[..4096]);
    let s = restore_status(&d, "r");
    assert!(s["error"].as_str().is_some_and(|e| e.contains("chunk 3")), "{s}");
}

#[test]
fn restore_create_refusals_name_the_field() {
    let store_dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let image = disk_image(41);
    let plain = make_backup(store_dir.path(), "vm", &image, None);
    let key = Arc::new(BackupKey::new("k1", &[9u8; 32]).unwrap());
    let secret = make_backup(store_dir.path(), "vm2", &image, Some(key));

    // Without a state directory.
    let d = Daemon::start("0");
    add_store(&d, "s", store_dir.path());
    d.malloc("base", SIZE / 512, 512);
    let p = json!({"name": "r", "base_bdev": "base", "store": "s", "bdev": "vm", "backup_id": plain});
    let e = err(&d, "bdev_backup_restore_create", p);
    assert!(e.contains("--state-dir"), "{e}");
    drop(d);

    let args = state_dir_args(state.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start_with_args("0", &args);
    add_store(&d, "s", store_dir.path());
    d.malloc("base", SIZE / 512, 512);
    d.malloc("small", SIZE / 512 - 8, 512);
    let create = |over: Value| {
        let mut p = json!({"name": "r", "base_bdev": "base", "store": "s", "bdev": "vm", "backup_id": plain});
        for (k, v) in over.as_object().unwrap() {
            p[k] = v.clone();
        }
        err(&d, "bdev_backup_restore_create", p)
    };
    assert!(create(json!({"store": "nope"})).starts_with("store:"));
    assert!(create(json!({"backup_id": "bad"})).starts_with("backup_id:"));
    let e = create(json!({"backup_id": "20000101T000000Z-00000000"}));
    assert!(e.contains("not found"), "{e}");
    assert!(create(json!({"base_bdev": "small"})).starts_with("base_bdev:"));
    assert!(create(json!({"parallel": 0})).starts_with("parallel:"));
    let e = create(json!({"name": "../escape"}));
    assert!(e.contains("name") && e.contains("/"), "{e}");
    let e = create(json!({"base_bdev": "nope"}));
    assert!(e.contains("nope"), "{e}");
    // An encrypted backup: no key, an unknown key, the wrong key.
    let e = create(json!({"bdev": "vm2", "backup_id": secret}));
    assert!(e.contains("key"), "{e}");
    assert!(create(json!({"bdev": "vm2", "backup_id": secret, "key": "nope"})).starts_with("key:"));
    add_key(&d, "k2", &[3u8; 32]);
    let e = create(json!({"bdev": "vm2", "backup_id": secret, "key": "k2"}));
    assert!(e.contains("key"), "{e}");
    // Nothing was left behind: the base is free.
    let base = d.call("bdev_get_bdevs", json!({"name": "base"}));
    assert_eq!(base[0]["claimed"], false, "{base}");
}
