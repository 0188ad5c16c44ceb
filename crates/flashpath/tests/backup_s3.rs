//! Backup jobs against a real S3 server, the test cluster's RADOS Gateway (docs/backup.md,
//! "Backup jobs"): a store added by `backup_store_add` (path-style, plain HTTP), a full backup
//! and an incremental one of a RAM disk written through NBD, each read back here with
//! fp-backup and compared byte for byte; then the catalogue: `backup_list`, `backup_verify`,
//! `backup_delete` of the full one and `backup_gc`, which collects exactly the chunks only the
//! deleted backup named, leaving the incremental whole.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::ceph::CephCluster;
use common::nbd::{start_export, Endpoint, NbdConn};
use common::{bounded, pattern, Daemon};
use fp_backup::{ChunkReader, Store, StoreConfig};
use serde_json::{json, Value};

const SIZE: u64 = 2 << 20;
const CHUNK: u64 = 64 << 10;

fn write(ep: &Endpoint, offset: u64, data: Vec<u8>) {
    let ep = ep.clone();
    bounded(Duration::from_secs(60), "nbd write", move || {
        let mut c = NbdConn::connect(&ep, "m0").unwrap();
        assert_eq!(c.write(offset, &data, 0).unwrap(), 0);
    });
}

fn wait_end(d: &Daemon, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let j = d.call("bdev_backup_get_jobs", json!({ "job_id": id }))[0].clone();
        if j["state"] != "running" {
            return j;
        }
        assert!(Instant::now() < deadline, "job {id} still running: {j}\n{}", d.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn full_and_incremental_to_the_rados_gateway_then_list_verify_delete_gc() {
    let Some(cluster) = CephCluster::start_with_rgw() else { return };
    let s3 = cluster.rgw();
    let state = tempfile::Builder::new().prefix("fp-backup-s3-").tempdir_in("/var/tmp").unwrap();
    let d = Daemon::start_with_args("0", &["--state-dir", state.path().to_str().unwrap()]);
    d.call(
        "backup_store_add",
        json!({ "name": "rgw", "url": format!("s3://{}", s3.bucket), "endpoint": s3.url, "region": s3.region,
                "access_key_id": s3.access_key, "secret_access_key": s3.secret_key,
                "allow_http": true, "path_style": true }),
    );
    d.malloc("m0", SIZE / 512, 512);
    let sock = d.dir.path().join("m0.nbd");
    start_export(&d, "m0", sock.to_str().unwrap(), false);
    let ep = Endpoint::Unix(sock);
    let mut image = pattern(1, 0, SIZE as usize);
    write(&ep, 0, image.clone());

    let id = d.call(
        "bdev_backup_start",
        json!({ "bdev": "m0", "store": "rgw", "sync": "full", "bitmap": "b", "chunk_size": CHUNK }),
    );
    let j = wait_end(&d, id.as_str().unwrap());
    assert_eq!(j["state"], "completed", "{j}\n{}", d.stderr());
    let full = j["backup_id"].as_str().unwrap().to_string();
    assert_eq!(j["progress"]["chunks_uploaded"], SIZE / CHUNK);
    d.call("bdev_backup_cancel", json!({ "job_id": "m0" }));

    // Two chunks change: the incremental reads and uploads those only.
    for off in [5 * CHUNK, 20 * CHUNK + 4096] {
        let data = pattern(2, off, 4096);
        image[off as usize..off as usize + 4096].copy_from_slice(&data);
        write(&ep, off, data);
    }
    let id = d.call(
        "bdev_backup_start",
        json!({ "bdev": "m0", "store": "rgw", "sync": "incremental", "bitmap": "b" }),
    );
    let j = wait_end(&d, id.as_str().unwrap());
    assert_eq!(j["state"], "completed", "{j}");
    assert_eq!(
        (j["progress"]["chunks_read"].as_u64(), j["progress"]["chunks_uploaded"].as_u64()),
        (Some(2), Some(2))
    );
    let inc = j["backup_id"].as_str().unwrap().to_string();

    // Read back with fp-backup's own client.
    let store = Store::open(&StoreConfig {
        url: format!("s3://{}", s3.bucket),
        endpoint: s3.url.clone(),
        region: s3.region.clone(),
        access_key: s3.access_key.clone(),
        secret_key: s3.secret_key.clone(),
        allow_http: true,
        path_style: true,
    })
    .unwrap();
    let read = |id: &str| -> Vec<u8> {
        let reader =
            ChunkReader::new(&store, Arc::new(store.manifest("m0", id, None).unwrap()), None).unwrap();
        (0..reader.chunk_count()).flat_map(|i| reader.read(i).unwrap()).collect()
    };
    assert!(read(&inc) == image, "the incremental backup is not the disk");
    assert!(read(&full) == pattern(1, 0, SIZE as usize), "the full backup is not the disk at its start");

    let list = d.call("backup_list", json!({ "store": "rgw", "bdev": "m0" }));
    let ids: Vec<&str> = list.as_array().unwrap().iter().map(|b| b["backup_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [full.as_str(), inc.as_str()]);
    assert_eq!(list[1]["kind"], "incremental");
    assert_eq!(list[1]["parent"], json!(full));
    let v = d.call("backup_verify", json!({ "store": "rgw", "bdev": "m0", "backup_id": inc }));
    assert_eq!(v["ok"], true, "{v}");

    // The full one goes; the GC takes the two chunks only it named.
    d.call("backup_delete", json!({ "store": "rgw", "bdev": "m0", "backup_id": full }));
    let gc = d.call("backup_gc", json!({ "store": "rgw", "grace_sec": 0 }));
    assert_eq!(gc["chunks_deleted"], 2, "{gc}");
    let v = d.call("backup_verify", json!({ "store": "rgw", "bdev": "m0", "backup_id": inc }));
    assert_eq!(v["ok"], true, "{v}");
    assert!(read(&inc) == image);
}
