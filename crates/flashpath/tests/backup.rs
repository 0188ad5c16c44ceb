//! Backup jobs end to end (docs/backup.md, "Backup jobs"), to a `file://` store read back here
//! with fp-backup. The guest writes through NBD; a speed limit (a lower bound on the job's
//! time: the token bucket starts empty) keeps a job running while the test writes.
//!
//! * [`full_incremental_cancel`]: (a) a full backup while the disk is written after its start
//!   equals the image at the start; (b) an incremental from the bitmap reads only the changed
//!   chunks and equals the disk at its start; (c) a cancelled incremental leaves the bits in
//!   the bitmap, and a rerun works.
//! * [`a_killed_daemon_resumes_the_job_as_a_full_backup`] is (d).
//! * [`a_disk_resized_while_its_backup_runs_fails_the_job_naming_the_size_change`]: a file disk
//!   grown (`bdev_uring_rescan`) under a job held by its speed limit.
//! * [`refusals_name_the_field`] and [`an_inconsistent_bitmap_refuses_an_incremental`] are (e).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::nbd::{start_export, Endpoint, NbdConn};
use common::{bounded, pattern, Daemon};
use fp_backup::{ChunkReader, Store, StoreConfig};
use serde_json::{json, Value};

const SIZE: u64 = 4 << 20;
const CHUNK: u64 = 64 << 10;
const CHUNKS: u64 = SIZE / CHUNK;
/// Slow enough that no job at this speed ends within a minute (one chunk a second, from an
/// empty bucket), fast enough to be seen moving.
const SLOW: u64 = CHUNK;

/// A daemon with a state directory, a file disk `vm0` (its file kept across restarts) and the
/// store `st` in `<files>/store`, all from its configuration file (owner-only: a
/// `[[backup_store]]` table may hold a secret).
struct Fixture {
    d: Daemon,
    files: tempfile::TempDir,
}

impl std::ops::Deref for Fixture {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.d
    }
}

impl std::ops::DerefMut for Fixture {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.d
    }
}

fn daemon() -> Fixture {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let files = tempfile::Builder::new().prefix("fp-backup-").tempdir_in("/var/tmp").unwrap();
    let dir = files.path();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::create_dir_all(dir.join("store")).unwrap();
    let file = dir.join("vm0.img");
    std::fs::File::create(&file).unwrap().set_len(SIZE).unwrap();
    let text = format!(
        "state_dir = \"{}\"\n\n[[bdev]]\ntype = \"uring\"\nname = \"vm0\"\nfilename = \"{}\"\n\n\
         [[backup_store]]\nname = \"st\"\nurl = \"file://{}\"\n",
        dir.join("state").display(),
        file.display(),
        dir.join("store").display()
    );
    let config = dir.join("flashpath.toml");
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&config).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    let d = Daemon::start_with_args("0", &["--config", config.to_str().unwrap()]);
    Fixture { d, files }
}

fn export(d: &Daemon) -> Endpoint {
    let sock = d.dir.path().join("vm0.nbd");
    start_export(d, "vm0", sock.to_str().unwrap(), false);
    Endpoint::Unix(sock)
}

/// Writes `data` at `offset` of `vm0` through NBD, and into the test's model `image`.
fn write(ep: &Endpoint, image: &mut [u8], offset: u64, data: Vec<u8>) {
    image[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
    let ep = ep.clone();
    bounded(Duration::from_secs(60), "nbd write", move || {
        let mut c = NbdConn::connect(&ep, "vm0").unwrap();
        for (i, piece) in data.chunks(128 << 10).enumerate() {
            assert_eq!(c.write(offset + (i as u64) * (128 << 10), piece, 0).unwrap(), 0);
        }
    });
}

fn store_dir(f: &Fixture) -> PathBuf {
    f.files.path().join("store")
}

/// The disk image backup `id` of `vm0` holds, read back from the store.
fn read_backup(store: &Path, id: &str) -> Vec<u8> {
    let store =
        Store::open(&StoreConfig { url: format!("file://{}", store.display()), ..Default::default() })
            .unwrap();
    let m = Arc::new(store.manifest("vm0", id, None).unwrap());
    let reader = ChunkReader::new(&store, m, None).unwrap();
    (0..reader.chunk_count()).flat_map(|i| reader.read(i).unwrap()).collect()
}

fn job(d: &Daemon, id: &str) -> Value {
    d.call("bdev_backup_get_jobs", json!({ "job_id": id }))[0].clone()
}

/// Waits (bounded) until job `id` is no longer running; returns it.
fn wait_end(d: &Daemon, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let j = job(d, id);
        if j["state"] != "running" {
            return j;
        }
        assert!(Instant::now() < deadline, "job {id} still running: {j}\n{}", d.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(d: &Daemon, params: Value) -> String {
    d.call("bdev_backup_start", params).as_str().unwrap().to_string()
}

fn extents(d: &Daemon) -> Value {
    d.call("bdev_dirty_bitmap_get_extents", json!({ "bdev": "vm0", "name": "b" }))["extents"].clone()
}

#[test]
fn full_incremental_cancel() {
    let d = daemon();
    let ep = export(&d);
    let mut image = vec![0u8; SIZE as usize];
    // Chunk 60 stays zero (never stored); the rest is pattern 1.
    write(&ep, &mut image, 0, pattern(1, 0, (60 * CHUNK) as usize));
    write(&ep, &mut image, 61 * CHUNK, pattern(1, 61 * CHUNK, (3 * CHUNK) as usize));

    // (a) A full backup, adding the bitmap; the guest writes after its start.
    let id = start(
        &d,
        json!({ "bdev": "vm0", "store": "st", "sync": "full", "bitmap": "b", "chunk_size": CHUNK, "speed": SLOW }),
    );
    assert_eq!(id, "vm0");
    let at_full = image.clone();
    assert_eq!(job(&d, "vm0")["state"], "running");
    // A bdev with a running backup cannot be deleted.
    let e = d.try_call("bdev_uring_delete", json!({ "name": "vm0" })).unwrap_err();
    assert_eq!(e.code, i64::from(-libc::EBUSY), "{}", e.message);
    let changed = [(3 * CHUNK + 512, 4096usize), (10 * CHUNK, 2 * CHUNK as usize), (63 * CHUNK, 512)];
    for (off, len) in changed {
        write(&ep, &mut image, off, pattern(2, off, len));
    }
    assert_eq!(job(&d, "vm0")["state"], "running", "the speed limit keeps the job running");
    d.call("bdev_backup_set_speed", json!({ "job_id": "vm0", "speed": 0 }));
    let j = wait_end(&d, "vm0");
    assert_eq!(j["state"], "completed", "{j}");
    let full = j["backup_id"].as_str().unwrap().to_string();
    assert_eq!(j["progress"]["chunks_total"], CHUNKS);
    assert_eq!(j["progress"]["chunks_zero"], 1);
    assert!(read_backup(&store_dir(&d), &full) == at_full, "the full backup is not the image at its start");
    // The bitmap holds the writes made after the start.
    let ext = extents(&d);
    let marked: Vec<(u64, u64)> = ext
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(marked, [(3 * CHUNK, CHUNK), (10 * CHUNK, 2 * CHUNK), (63 * CHUNK, CHUNK)]);
    d.call("bdev_backup_cancel", json!({ "job_id": "vm0" })); // dismissed

    // (b) An incremental from the bitmap: only the 4 changed chunks are read.
    let at_inc = image.clone();
    let id = start(&d, json!({ "bdev": "vm0", "store": "st", "sync": "incremental", "bitmap": "b" }));
    let j = wait_end(&d, &id);
    assert_eq!(j["state"], "completed", "{j}");
    assert_eq!(j["progress"]["chunks_total"], 4);
    assert_eq!(j["progress"]["chunks_read"], 4);
    let inc = j["backup_id"].as_str().unwrap().to_string();
    assert!(
        read_backup(&store_dir(&d), &inc) == at_inc,
        "the incremental backup is not the disk at its start"
    );
    assert_eq!(extents(&d), json!([]));
    d.call("bdev_backup_cancel", json!({ "job_id": "vm0" }));

    // (c) Cancelled: the bits go back into the bitmap; a rerun works.
    write(&ep, &mut image, 20 * CHUNK, pattern(3, 20 * CHUNK, 8192));
    write(&ep, &mut image, 40 * CHUNK, pattern(3, 40 * CHUNK, 8192));
    let id = start(
        &d,
        json!({ "bdev": "vm0", "store": "st", "sync": "incremental", "bitmap": "b", "speed": SLOW }),
    );
    assert_eq!(extents(&d), json!([]), "the job took the bits");
    // The job holds the bitmap: the methods that change it refuse it, naming the job.
    let e = d.try_call("bdev_dirty_bitmap_clear", json!({ "bdev": "vm0", "name": "b" })).unwrap_err();
    assert_eq!(e.code, i64::from(-libc::EBUSY), "{}", e.message);
    assert!(e.message.contains(&format!("backup job '{id}'")), "{}", e.message);
    d.call("bdev_backup_cancel", json!({ "job_id": id }));
    let j = job(&d, &id);
    assert_eq!(j["state"], "cancelled", "{j}");
    assert_eq!(
        extents(&d),
        json!([{ "offset": 20 * CHUNK, "length": CHUNK }, { "offset": 40 * CHUNK, "length": CHUNK }])
    );
    d.call("bdev_backup_cancel", json!({ "job_id": id }));
    let at_rerun = image.clone();
    let id = start(&d, json!({ "bdev": "vm0", "store": "st", "sync": "incremental", "bitmap": "b" }));
    let j = wait_end(&d, &id);
    assert_eq!(j["state"], "completed", "{j}");
    assert_eq!(j["progress"]["chunks_read"], 2);
    assert!(read_backup(&store_dir(&d), j["backup_id"].as_str().unwrap()) == at_rerun);
    // The job's fleece and scratch bdev are gone.
    let names: Vec<Value> =
        d.call("bdev_get_bdevs", json!({})).as_array().unwrap().iter().map(|b| b["name"].clone()).collect();
    assert_eq!(names, [json!("vm0")]);
}

#[test]
fn a_killed_daemon_resumes_the_job_as_a_full_backup() {
    let mut d = daemon();
    let ep = export(&d);
    let mut image = vec![0u8; SIZE as usize];
    write(&ep, &mut image, 0, pattern(7, 0, SIZE as usize));
    let id = start(
        &d,
        json!({ "bdev": "vm0", "store": "st", "sync": "full", "bitmap": "b", "chunk_size": CHUNK, "speed": SLOW }),
    );
    // Two chunks uploaded, then the daemon dies.
    let deadline = Instant::now() + Duration::from_secs(60);
    while job(&d, &id)["progress"]["chunks_uploaded"].as_u64().unwrap() < 2 {
        assert!(Instant::now() < deadline, "no upload: {}", job(&d, &id));
        std::thread::sleep(Duration::from_millis(20));
    }
    d.kill9();
    d.restart();
    let j = job(&d, &id);
    assert_eq!(j["sync"], "full", "{j}");
    d.call("bdev_backup_set_speed", json!({ "job_id": id, "speed": 0 }));
    let j = wait_end(&d, &id);
    assert_eq!(j["state"], "completed", "{j}\n{}", d.stderr());
    let uploaded = j["progress"]["chunks_uploaded"].as_u64().unwrap();
    assert!(uploaded < CHUNKS && uploaded > 0, "uploaded {uploaded} of {CHUNKS}: {j}");
    assert!(read_backup(&store_dir(&d), j["backup_id"].as_str().unwrap()) == image);
    // The bitmap was made anew (consistent), and no record is left.
    let list = d.call("bdev_dirty_bitmap_list", json!({ "bdev": "vm0" }));
    assert_eq!(list[0]["inconsistent"], false, "{list}");
    let left: Vec<_> = std::fs::read_dir(d.files.path().join("state/backup-jobs")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_disk_resized_while_its_backup_runs_fails_the_job_naming_the_size_change() {
    let d = daemon();
    let id = start(
        &d,
        json!({ "bdev": "vm0", "store": "st", "sync": "full", "bitmap": "b", "chunk_size": CHUNK, "speed": SLOW }),
    );
    // The speed limit holds the job (one chunk a second from an empty bucket) while the disk grows.
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.files.path().join("vm0.img"))
        .unwrap()
        .set_len(2 * SIZE)
        .unwrap();
    d.call("bdev_uring_rescan", json!({ "name": "vm0" }));
    assert_eq!(d.call("bdev_get_bdevs", json!({ "name": "vm0" }))[0]["num_blocks"], 2 * SIZE / 512);
    assert_eq!(job(&d, &id)["state"], "running", "the speed limit keeps the job running");
    d.call("bdev_backup_set_speed", json!({ "job_id": id, "speed": 0 }));
    let j = wait_end(&d, &id);
    assert_eq!(j["state"], "failed", "{j}");
    let error = j["error"].as_str().unwrap();
    assert!(
        error.starts_with("bdev:")
            && error.contains("'vm0'")
            && error.contains("resized")
            && error.contains(&SIZE.to_string())
            && error.contains(&(2 * SIZE).to_string()),
        "the error names the disk and its size change: {error}"
    );
    // No backup was written; the job's fleece and scratch bdev are gone.
    assert_eq!(d.call("backup_list", json!({ "store": "st" })), json!([]));
    let names: Vec<Value> =
        d.call("bdev_get_bdevs", json!({})).as_array().unwrap().iter().map(|b| b["name"].clone()).collect();
    assert_eq!(names, [json!("vm0")]);
    // The bits the job took went back (a full backup's fresh bitmap had none), and the bitmap
    // is free again.
    assert_eq!(d.call("bdev_dirty_bitmap_list", json!({ "bdev": "vm0" }))[0]["busy"], false);
}

/// The field a -32602 refusal names.
fn refused(d: &Daemon, params: Value) -> String {
    let e = d.try_call("bdev_backup_start", params.clone()).unwrap_err();
    assert_eq!(e.code, -32602, "{params}: {}", e.message);
    e.message.split(':').next().unwrap().to_string()
}

#[test]
fn refusals_name_the_field() {
    let d = daemon();
    let p = |extra: Value| {
        let mut p = json!({ "bdev": "vm0", "store": "st", "sync": "full" });
        p.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        p
    };
    assert_eq!(refused(&d, p(json!({ "store": "nope" }))), "store");
    assert_eq!(refused(&d, p(json!({ "key": "nope" }))), "key");
    assert_eq!(refused(&d, p(json!({ "sync": "sideways" }))), "sync");
    assert_eq!(refused(&d, p(json!({ "chunk_size": 1000 }))), "chunk_size");
    assert_eq!(refused(&d, p(json!({ "sync": "incremental" }))), "bitmap");
    assert_eq!(refused(&d, p(json!({ "sync": "incremental", "bitmap": "nope" }))), "bitmap");
    // A bitmap with no backup recorded for it: no parent.
    d.call("bdev_dirty_bitmap_add", json!({ "bdev": "vm0", "name": "b", "persistent": true }));
    assert_eq!(refused(&d, p(json!({ "sync": "incremental", "bitmap": "b" }))), "parent");
    assert_eq!(refused(&d, p(json!({ "sync": "incremental", "bitmap": "b", "parent": "x" }))), "parent");
    let e = d.try_call("bdev_backup_start", p(json!({ "bdev": "nope" }))).unwrap_err();
    assert_eq!(e.code, i64::from(-libc::ENODEV));
    let e = d.try_call("bdev_backup_cancel", json!({ "job_id": "nope" })).unwrap_err();
    assert_eq!(e.code, i64::from(-libc::ENODEV));
    assert_eq!(d.call("bdev_backup_get_jobs", json!({})), json!([]));
    // Nothing was left behind by the refusals.
    assert_eq!(d.call("bdev_get_bdevs", json!({})).as_array().unwrap().len(), 1);
}

#[test]
fn an_inconsistent_bitmap_refuses_an_incremental() {
    let mut d = daemon();
    d.call("bdev_dirty_bitmap_add", json!({ "bdev": "vm0", "name": "b", "persistent": true }));
    let id = start(&d, json!({ "bdev": "vm0", "store": "st", "sync": "full", "bitmap": "b" }));
    assert_eq!(wait_end(&d, &id)["state"], "completed");
    d.kill9();
    d.restart();
    assert_eq!(d.call("bdev_dirty_bitmap_list", json!({ "bdev": "vm0" }))[0]["inconsistent"], true);
    assert_eq!(
        refused(&d, json!({ "bdev": "vm0", "store": "st", "sync": "incremental", "bitmap": "b" })),
        "bitmap"
    );
    // A full backup re-creates it.
    let id = start(&d, json!({ "bdev": "vm0", "store": "st", "sync": "full", "bitmap": "b" }));
    assert_eq!(wait_end(&d, &id)["state"], "completed");
    assert_eq!(d.call("bdev_dirty_bitmap_list", json!({ "bdev": "vm0" }))[0]["inconsistent"], false);
}

#[test]
fn backups_need_a_state_directory() {
    let d = Daemon::start("0");
    d.malloc("m0", 2048, 512);
    let e =
        d.try_call("bdev_backup_start", json!({ "bdev": "m0", "store": "st", "sync": "full" })).unwrap_err();
    assert_eq!(e.code, -32602);
    assert!(e.message.starts_with("bdev: a backup job needs the daemon's state directory"), "{}", e.message);
}
