//! The store end to end, with no network: object_store's in-memory store and local directory,
//! and a wrapper that injects faults.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use crate::*;

/// An [`ObjectStore`] over [`InMemory`] that fails, ages or counts requests on demand.
#[derive(Debug, Default)]
struct Faulty {
    inner: InMemory,
    /// Puts to fail (transiently, as a timeout would) before they succeed again.
    failing_puts: AtomicU32,
    /// Every request refused as by a wrong secret key.
    refuse_all: AtomicBool,
    /// HEAD answers report objects two hours old.
    old_heads: AtomicBool,
    /// Puts never answer (a store that accepted the connection and hangs).
    hang_puts: AtomicBool,
    /// The chunk puts seen (object keys).
    puts: Mutex<Vec<String>>,
}

impl std::fmt::Display for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faulty")
    }
}

impl Faulty {
    fn refused() -> object_store::Error {
        object_store::Error::PermissionDenied { path: "x".into(), source: "403 SignatureDoesNotMatch".into() }
    }
}

#[async_trait]
impl ObjectStore for Faulty {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.refuse_all.load(Relaxed) {
            return Err(Faulty::refused());
        }
        if self.hang_puts.load(Relaxed) {
            std::future::pending::<()>().await;
        }
        if self.failing_puts.load(Relaxed) > 0 {
            self.failing_puts.fetch_sub(1, Relaxed);
            return Err(object_store::Error::Generic {
                store: "Faulty",
                source: "connection timed out".into(),
            });
        }
        self.puts.lock().unwrap().push(location.to_string());
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        if self.refuse_all.load(Relaxed) {
            return Err(Faulty::refused());
        }
        let head = options.head;
        let mut result = self.inner.get_opts(location, options).await?;
        if head && self.old_heads.load(Relaxed) {
            result.meta.last_modified -= chrono::Duration::hours(2);
        }
        Ok(result)
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if self.refuse_all.load(Relaxed) {
            return Box::pin(futures::stream::once(async { Err(Faulty::refused()) }));
        }
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

const CS: u64 = MIN_CHUNK_SIZE;

/// A disk in memory; it cancels `job` when asked to read chunk `cancel_at`.
struct MemDisk {
    data: Vec<u8>,
    reads: Vec<u64>,
    cancel_at: Option<(u64, Arc<Job>)>,
}

impl MemDisk {
    fn new(data: Vec<u8>) -> MemDisk {
        MemDisk { data, reads: Vec::new(), cancel_at: None }
    }
}

impl ChunkSource for MemDisk {
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if let Some((at, job)) = &self.cancel_at {
            if offset / CS == *at {
                job.cancel();
            }
        }
        self.reads.push(offset / CS);
        buf.copy_from_slice(&self.data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
}

/// Chunk `i` of a test disk: distinct content per `(seed, i)`, compressible in part.
fn pattern(seed: u8, chunks: u64, tail: u64) -> Vec<u8> {
    let mut data = vec![0u8; (chunks * CS + tail) as usize];
    for (i, c) in data.chunks_mut(CS as usize).enumerate() {
        for (j, b) in c.iter_mut().enumerate() {
            *b = (j as u8).wrapping_mul(31) ^ (i as u8) ^ seed.wrapping_mul(7) ^ ((j >> 9) as u8);
        }
        c[0] = seed;
        c[1] = i as u8;
    }
    data
}

fn faulty_store() -> (Arc<Faulty>, Store) {
    let faulty = Arc::new(Faulty::default());
    let retry = RetryPolicy {
        attempts: 3,
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(4),
    };
    let location = format!("mem://{:p}", Arc::as_ptr(&faulty));
    let store = Store::with_object_store(faulty.clone(), &location, retry).unwrap();
    (faulty, store)
}

fn options(disk: &str, size: u64) -> BackupOptions {
    BackupOptions { chunk_size: CS, ..BackupOptions::new(disk, size) }
}

fn restore(store: &Store, manifest: &Manifest, key: Option<Arc<BackupKey>>) -> Vec<u8> {
    let reader = ChunkReader::new(store, Arc::new(manifest.clone()), key).unwrap();
    (0..reader.chunk_count()).flat_map(|i| reader.read(i).unwrap()).collect()
}

#[test]
fn full_backup_round_trips_and_zero_chunks_are_not_stored() {
    let (faulty, store) = faulty_store();
    let mut data = pattern(1, 6, 1000);
    data[2 * CS as usize..3 * CS as usize].fill(0);
    let job = Job::new();
    let m = backup(
        &store,
        &mut MemDisk::new(data.clone()),
        Plan::Full,
        &options("vol0", data.len() as u64),
        &job,
    )
    .unwrap();
    assert_eq!(m.chunks.len(), 7);
    assert_eq!(m.chunks[2], None);
    assert_eq!(m.chunk_len(6), 1000);
    let p = job.progress().snapshot();
    assert_eq!((p.chunks_read, p.chunks_zero, p.chunks_uploaded, p.bytes_read), (7, 1, 6, data.len() as u64));
    // Six chunk objects and the manifest, written last.
    let puts = faulty.puts.lock().unwrap().clone();
    assert_eq!(puts.len(), 7);
    assert_eq!(puts.last().unwrap(), &format!("backups/vol0/{}", m.id));
    assert_eq!(restore(&store, &m, None), data);
    let loaded = store.manifest("vol0", &m.id, None).unwrap();
    assert_eq!(loaded, m);
}

#[test]
fn incremental_rereads_changed_chunks_only_and_restores_alone() {
    let (_, store) = faulty_store();
    let mut data = pattern(2, 8, 0);
    let size = data.len() as u64;
    let full =
        backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", size), &Job::new())
            .unwrap();
    // A bitmap at 128 KiB granularity with one dirty bit marks two 64 KiB chunks; a write into
    // chunk 6 marks it.
    data[2 * CS as usize + 5] ^= 0xff;
    data[6 * CS as usize..7 * CS as usize].fill(0);
    let changed = chunks_of_extents([(2 * CS, 2 * CS), (6 * CS + 100, 10)], CS, size);
    assert_eq!(changed, [2, 3, 6]);
    let job = Job::new();
    let mut disk = MemDisk::new(data.clone());
    let inc = backup(
        &store,
        &mut disk,
        Plan::Incremental { parent: &full, changed: &changed },
        &options("vol0", size),
        &job,
    )
    .unwrap();
    assert_eq!(disk.reads, [2, 3, 6]);
    let p = job.progress().snapshot();
    // Chunk 3 did not change: its id is the parent's, no upload.
    assert_eq!((p.chunks_read, p.chunks_zero, p.chunks_skipped, p.chunks_uploaded), (3, 1, 1, 1));
    assert_eq!(inc.kind, BackupKind::Incremental);
    assert_eq!(inc.parent.as_deref(), Some(full.id.as_str()));
    // The parent deleted and collected: the incremental still restores on its own.
    store.delete("vol0", &full.id).unwrap();
    let gc = store.gc(Duration::ZERO).unwrap();
    assert_eq!(gc.chunks_deleted, 2, "the parent's chunks 2 and 6 only: {gc:?}");
    assert_eq!(restore(&store, &inc, None), data);
    assert!(store.verify(&inc, None, false).unwrap().is_ok());
}

#[test]
fn identical_chunks_are_stored_once_across_disks() {
    let (faulty, store) = faulty_store();
    let mut data = pattern(3, 4, 0);
    // Chunks 1 and 3 are equal within the disk.
    let (a, b) = data.split_at_mut(3 * CS as usize);
    b.copy_from_slice(&a[CS as usize..2 * CS as usize]);
    let size = data.len() as u64;
    let job = Job::new();
    backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", size), &job).unwrap();
    assert_eq!(job.progress().snapshot().chunks_uploaded, 3);
    let job = Job::new();
    let m =
        backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol1", size), &job).unwrap();
    let p = job.progress().snapshot();
    assert_eq!((p.chunks_uploaded, p.chunks_skipped), (0, 4));
    let chunk_puts = faulty.puts.lock().unwrap().iter().filter(|k| k.starts_with("chunks/")).count();
    assert_eq!(chunk_puts, 3);
    assert_eq!(restore(&store, &m, None), data);
    let listed = store.list(None).unwrap();
    assert_eq!(listed.iter().map(|b| b.disk.as_str()).collect::<Vec<_>>(), ["vol0", "vol1"]);
    assert_eq!(store.list(Some("vol1")).unwrap().len(), 1);
}

#[test]
fn encrypted_backups_round_trip_and_refuse_a_wrong_key() {
    let (faulty, store) = faulty_store();
    let data = pattern(4, 3, 77);
    let key = Arc::new(BackupKey::new("nightly", &[0x42; 32]).unwrap());
    let opts = BackupOptions { key: Some(key.clone()), ..options("vol0", data.len() as u64) };
    let m = backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &opts, &Job::new()).unwrap();
    assert_eq!(m.key_id.as_deref(), Some("nightly"));
    assert_eq!(restore(&store, &m, Some(key.clone())), data);
    // The store never sees a plaintext hash.
    let plain_ids: HashSet<String> =
        data.chunks(CS as usize).map(|c| ChunkId::of(c, None).object_key()).collect();
    assert!(faulty.puts.lock().unwrap().iter().all(|k| !plain_ids.contains(k)));
    store.manifest("vol0", &m.id, Some(&key)).unwrap();

    let wrong = Arc::new(BackupKey::new("nightly", &[0x43; 32]).unwrap());
    let err = store.manifest("vol0", &m.id, Some(&wrong)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Key, "{err}");
    let reader = ChunkReader::new(&store, Arc::new(m.clone()), Some(wrong)).unwrap();
    let err = reader.read(0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Key, "{err}");
    assert!(ChunkReader::new(&store, Arc::new(m.clone()), None).is_err());
    // A full verify needs the key; a quick one does not.
    assert!(store.verify(&m, None, true).unwrap().is_ok());
    assert!(store.verify(&m, Some(&key), false).unwrap().is_ok());
    assert_eq!(store.verify(&m, None, false).unwrap_err().kind(), ErrorKind::Invalid);
}

#[test]
fn a_cancelled_backup_writes_no_manifest_and_a_rerun_uploads_only_the_rest() {
    let (faulty, store) = faulty_store();
    let data = pattern(5, 10, 0);
    let size = data.len() as u64;
    let job = Job::new();
    let mut disk = MemDisk { cancel_at: Some((4, job.clone())), ..MemDisk::new(data.clone()) };
    let err = backup(&store, &mut disk, Plan::Full, &options("vol0", size), &job).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    let first = job.progress().snapshot();
    // Chunk 4 was read (the cancel came during its read); nothing after it. The uploads still
    // in flight at the cancel were dropped: some of the 5 may not be stored.
    assert_eq!(first.chunks_read, 5);
    assert!(first.chunks_uploaded <= 5, "{first:?}");
    assert!(store.list(None).unwrap().is_empty());
    assert!(faulty.puts.lock().unwrap().iter().all(|k| k.starts_with("chunks/")));
    let stored = faulty.puts.lock().unwrap().len() as u64;
    assert!(stored >= first.chunks_uploaded && stored <= 5, "{first:?}: {stored} stored");

    let job = Job::new();
    let m =
        backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", size), &job).unwrap();
    let second = job.progress().snapshot();
    // What the first run stored is found (HEAD) and skipped; the rest is uploaded.
    assert_eq!((second.chunks_skipped, second.chunks_uploaded), (stored, 10 - stored));
    assert_eq!(restore(&store, &m, None), data);
}

/// Waits (at most 15 s) until `cond` holds.
fn within_15_s(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs a backup of `data` on its own thread; its result comes back through the receiver.
fn backup_on_a_thread(
    store: Store,
    data: Vec<u8>,
    job: &Arc<Job>,
) -> (std::thread::JoinHandle<()>, std::sync::mpsc::Receiver<Result<Manifest>>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let job = job.clone();
    let size = data.len() as u64;
    let t = std::thread::spawn(move || {
        let r = backup(&store, &mut MemDisk::new(data), Plan::Full, &options("vol0", size), &job);
        let _ = tx.send(r);
    });
    (t, rx)
}

/// Cancels `job` and expects its backup (thread `t`) to end `Cancelled` within 15 s.
fn cancel_within_15_s(
    job: &Job,
    t: std::thread::JoinHandle<()>,
    done: &std::sync::mpsc::Receiver<Result<Manifest>>,
) {
    job.cancel();
    let r = done.recv_timeout(Duration::from_secs(15)).expect("the cancel ends the job within 15 s");
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Cancelled);
    t.join().unwrap();
}

#[test]
fn a_cancel_drops_uploads_a_hung_store_never_answers() {
    // Every upload slot held by a PUT that never answers: the reader waits for a slot.
    let (faulty, store) = faulty_store();
    faulty.hang_puts.store(true, Relaxed);
    let job = Job::new();
    let (t, done) = backup_on_a_thread(store, pattern(16, 10, 0), &job);
    // 4 uploads in flight (the default), the fifth chunk read and waiting for a slot.
    within_15_s("the uploads to hang", || job.progress().snapshot().chunks_read == 5);
    cancel_within_15_s(&job, t, &done);
    let p = job.progress().snapshot();
    assert_eq!((p.chunks_read, p.chunks_uploaded), (5, 0), "{p:?}");
    assert!(faulty.puts.lock().unwrap().is_empty());

    // Every chunk read, the job waiting for its last uploads, which hang.
    let (faulty, store) = faulty_store();
    faulty.hang_puts.store(true, Relaxed);
    let job = Job::new();
    let (t, done) = backup_on_a_thread(store, pattern(17, 3, 0), &job);
    within_15_s("every chunk to be read", || job.progress().snapshot().chunks_read == 3);
    cancel_within_15_s(&job, t, &done);
    assert!(faulty.puts.lock().unwrap().is_empty(), "no manifest either");
}

#[test]
fn transient_store_errors_are_retried_and_lasting_ones_name_the_object() {
    let (faulty, store) = faulty_store();
    let data = pattern(6, 2, 0);
    let size = data.len() as u64;
    faulty.failing_puts.store(2, Relaxed);
    backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", size), &Job::new()).unwrap();

    // More failures than attempts: the job fails naming a chunk, and writes no manifest.
    let data = pattern(7, 2, 0);
    faulty.failing_puts.store(100, Relaxed);
    let err =
        backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol1", size), &Job::new())
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let text = err.to_string();
    assert!(text.contains("chunks/") && text.contains("3 attempt") && text.contains("timed out"), "{text}");
    faulty.failing_puts.store(0, Relaxed);
    assert!(store.list(Some("vol1")).unwrap().is_empty());

    // Refused (credentials) is not retried.
    faulty.refuse_all.store(true, Relaxed);
    let err = store.list(None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(err.to_string().contains("1 attempt"), "{err}");
}

#[test]
fn verify_finds_corrupt_and_missing_chunks_and_readers_refuse_them() {
    let (faulty, store) = faulty_store();
    let data = pattern(8, 4, 0);
    let m = backup(
        &store,
        &mut MemDisk::new(data.clone()),
        Plan::Full,
        &options("vol0", data.len() as u64),
        &Job::new(),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let (id1, id2, id3) = (m.chunks[1].unwrap(), m.chunks[2].unwrap(), m.chunks[3].unwrap());
    // Chunk 1: a flipped bit in its payload; chunk 2: gone; chunk 3: truncated.
    rt.block_on(async {
        let p1 = Path::from(id1.object_key());
        let mut b = faulty.inner.get(&p1).await.unwrap().bytes().await.unwrap().to_vec();
        let at = b.len() - 1;
        b[at] ^= 1;
        faulty.inner.put(&p1, b.into()).await.unwrap();
        faulty.inner.delete(&Path::from(id2.object_key())).await.unwrap();
        let p3 = Path::from(id3.object_key());
        let b = faulty.inner.get(&p3).await.unwrap().bytes().await.unwrap();
        faulty.inner.put(&p3, b.slice(..b.len() / 2).into()).await.unwrap();
    });
    let report = store.verify(&m, None, false).unwrap();
    assert_eq!(report.chunks_checked, 4);
    assert_eq!(report.missing, [(2, id2)]);
    assert_eq!(report.corrupt.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
    assert!(report.corrupt[1].2.contains("truncated"), "{:?}", report.corrupt);
    // A quick verify sees only the missing one.
    let quick = store.verify(&m, None, true).unwrap();
    assert_eq!((quick.missing.len(), quick.corrupt.len()), (1, 0));
    let reader = ChunkReader::new(&store, Arc::new(m.clone()), None).unwrap();
    assert_eq!(reader.read(0).unwrap(), &data[..CS as usize]);
    assert_eq!(reader.read(1).unwrap_err().kind(), ErrorKind::Corrupt);
    assert_eq!(reader.read(2).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(reader.read(3).unwrap_err().kind(), ErrorKind::Truncated);
    // The asynchronous read gives the same answer.
    let (tx, rx) = std::sync::mpsc::channel();
    reader.read_async(1, move |r| tx.send(r.map_err(|e| e.kind())).unwrap());
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)).unwrap(), Err(ErrorKind::Corrupt));
    // The last handle may be the one an asynchronous read holds: it ends on the runtime's own
    // thread without a panic, and the read still completes.
    let (tx, rx) = std::sync::mpsc::channel();
    reader.read_async(0, move |r| tx.send(r.map(|b| b.len())).unwrap());
    drop((reader, store));
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)).unwrap().unwrap(), CS as usize);
}

#[test]
fn delete_and_gc_keep_chunks_other_backups_use() {
    let (faulty, store) = faulty_store();
    let a = pattern(9, 3, 0);
    let mut b = a.clone();
    b[..CS as usize].fill(0xee);
    let size = a.len() as u64;
    let ma = backup(&store, &mut MemDisk::new(a), Plan::Full, &options("vol0", size), &Job::new()).unwrap();
    let mb = backup(&store, &mut MemDisk::new(b.clone()), Plan::Full, &options("vol1", size), &Job::new())
        .unwrap();
    // Objects that are not ours, under either prefix, are left alone and stop nothing.
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for stray in ["backups/vol0/notes.txt", "chunks/ab/readme", "chunks/zz"] {
        rt.block_on(faulty.inner.put(&Path::from(stray), b"x".to_vec().into())).unwrap();
    }
    // Young chunks are kept whatever refers to them.
    store.delete("vol0", &ma.id).unwrap();
    assert_eq!(store.delete("vol0", &ma.id).unwrap_err().kind(), ErrorKind::NotFound);
    let gc = store.gc(GC_GRACE).unwrap();
    assert_eq!((gc.chunks_deleted, gc.chunks_young, gc.chunks_referenced), (0, 1, 3));
    // Past the grace period, only vol0's own chunk 0 goes.
    let gc = store.gc(Duration::ZERO).unwrap();
    assert_eq!((gc.manifests, gc.chunks_seen, gc.chunks_deleted, gc.foreign_objects), (1, 6, 1, 2));
    assert_eq!(store.list(None).unwrap().len(), 1);
    assert!(store.verify(&mb, None, false).unwrap().is_ok());
    assert_eq!(restore(&store, &mb, None), b);
    // A damaged manifest stops the GC rather than orphaning its chunks.
    rt.block_on(faulty.inner.put(&Path::from(mb.object_key()), b"FPBKMANI junk".to_vec().into())).unwrap();
    let err = store.gc(Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("garbage collection refused"), "{err}");
    assert!(store.list(None).unwrap()[0].manifest.is_err());
}

#[test]
fn gc_and_backups_exclude_each_other_in_process() {
    let (_, store) = faulty_store();
    let other_handle =
        Store::with_object_store(store.objects().clone(), store.location(), RetryPolicy::default()).unwrap();
    let guard = other_handle.begin_gc().unwrap();
    let data = pattern(10, 1, 0);
    let err =
        backup(&store, &mut MemDisk::new(data), Plan::Full, &options("vol0", CS), &Job::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    drop(guard);
    let _backup = store.begin_backup().unwrap();
    assert_eq!(other_handle.gc(Duration::ZERO).unwrap_err().kind(), ErrorKind::Busy);
}

#[test]
fn chunks_found_old_are_written_again_for_a_concurrent_gc() {
    let (faulty, store) = faulty_store();
    let data = pattern(11, 2, 0);
    let size = data.len() as u64;
    backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", size), &Job::new()).unwrap();
    faulty.old_heads.store(true, Relaxed);
    let job = Job::new();
    backup(&store, &mut MemDisk::new(data), Plan::Full, &options("vol1", size), &job).unwrap();
    assert_eq!(job.progress().snapshot().chunks_uploaded, 2);
}

#[test]
fn the_speed_limit_holds_reads_back() {
    let (_, store) = faulty_store();
    let data = pattern(12, 4, 0);
    let job = Job::new();
    job.set_speed_limit(8 * CS);
    let start = Instant::now();
    backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", data.len() as u64), &job)
        .unwrap();
    // The bucket starts empty: 4 chunks at 8 chunks a second take at least half a second.
    assert!(start.elapsed() >= Duration::from_millis(450), "{:?}", start.elapsed());
}

/// Does `act` to `job` from another thread, 200 ms from now.
fn in_200_ms(job: &Arc<Job>, act: fn(&Job)) -> std::thread::JoinHandle<()> {
    let job = job.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        act(&job);
    })
}

#[test]
fn the_speed_limit_changes_while_the_job_runs_and_a_throttled_job_cancels() {
    let (_, store) = faulty_store();
    let data = pattern(15, 4, 0);
    let size = data.len() as u64;
    // One byte a second would take days: lifting the limit lets the job finish.
    let job = Job::new();
    job.set_speed_limit(1);
    let lifter = in_200_ms(&job, |job| job.set_speed_limit(0));
    let start = Instant::now();
    backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", size), &job).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(150));
    lifter.join().unwrap();
    // A job held by its limit sees a cancel.
    let job = Job::new();
    job.set_speed_limit(1);
    let canceller = in_200_ms(&job, Job::cancel);
    let err = backup(&store, &mut MemDisk::new(data), Plan::Full, &options("vol1", size), &job).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(job.progress().snapshot().chunks_read, 0);
    canceller.join().unwrap();
}

#[test]
fn a_local_directory_store_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig { url: format!("file://{}", dir.path().display()), ..Default::default() };
    let store = Store::open(&config).unwrap();
    let data = pattern(13, 3, 512);
    let size = data.len() as u64;
    let m = backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", size), &Job::new())
        .unwrap();
    assert!(dir.path().join(m.object_key()).exists());
    let again = Store::open(&config).unwrap();
    let loaded = again.manifest("vol0", &m.id, None).unwrap();
    assert_eq!(restore(&again, &loaded, None), data);
    again.delete("vol0", &m.id).unwrap();
    assert_eq!(again.gc(Duration::ZERO).unwrap().chunks_deleted, 4);
    assert!(again.list(None).unwrap().is_empty());
}

#[test]
fn configurations_are_checked_and_never_show_secrets() {
    let config = StoreConfig {
        url: "s3://bucket/pre/fix".into(),
        endpoint: "http://127.0.0.1:7480".into(),
        access_key: "AKIDSECRETACCESS".into(),
        secret_key: "very-secret-key".into(),
        allow_http: false,
        path_style: true,
        ..Default::default()
    };
    let text = format!("{config:?} {}", config.describe());
    assert!(!text.contains("very-secret-key") && !text.contains("AKIDSECRETACCESS"), "{text}");
    let err = Store::open(&config).unwrap_err();
    assert!(err.to_string().contains("allow_http"), "{err}");
    let store = Store::open(&StoreConfig { allow_http: true, ..config.clone() }).unwrap();
    assert!(!format!("{store:?}").contains("secret"));
    let err = Store::open(&StoreConfig { secret_key: String::new(), ..config }).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused);
    assert!(err.to_string().contains("missing credentials"), "{err}");
    assert_eq!(
        Store::open(&StoreConfig { url: "ftp://x".into(), ..Default::default() }).unwrap_err().kind(),
        ErrorKind::Invalid
    );
}

#[test]
fn plans_are_checked() {
    let (_, store) = faulty_store();
    let data = pattern(14, 2, 0);
    let size = data.len() as u64;
    let full =
        backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &options("vol0", size), &Job::new())
            .unwrap();
    let grown = options("vol0", size + CS);
    let err = backup(
        &store,
        &mut MemDisk::new(data.clone()),
        Plan::Incremental { parent: &full, changed: &[] },
        &grown,
        &Job::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("full backup"), "{err}");
    let err = backup(
        &store,
        &mut MemDisk::new(data.clone()),
        Plan::Incremental { parent: &full, changed: &[9] },
        &options("vol0", size),
        &Job::new(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    let bad = BackupOptions { chunk_size: 3 << 20, ..options("vol0", size) };
    assert!(backup(&store, &mut MemDisk::new(data.clone()), Plan::Full, &bad, &Job::new()).is_err());
    assert!(backup(&store, &mut MemDisk::new(data), Plan::Full, &options("a/b", size), &Job::new()).is_err());
}

#[test]
fn extents_map_to_chunks() {
    assert_eq!(chunks_of_extents([(0, 1)], CS, 10 * CS), [0]);
    assert_eq!(chunks_of_extents([(CS - 1, 2), (5 * CS, 0)], CS, 10 * CS), [0, 1]);
    // A 1 MiB bitmap bit over 64 KiB chunks: 16 chunks, cut at the disk's end.
    assert_eq!(chunks_of_extents([(0, 16 * CS)], CS, 10 * CS), (0..10).collect::<Vec<_>>());
    assert_eq!(chunks_of_extents([(20 * CS, CS)], CS, 10 * CS), Vec::<u64>::new());
}

/// Writes the fuzz targets' seeds (`fuzz/regressions/backup_chunk/`, `.../backup_manifest/`):
/// real objects need zstd and AES-GCM, which `fuzz/gen_seeds.py` has no module for. Run it by
/// hand after a format change: `cargo test -p fp-backup --lib -- --ignored write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions");
    let write = |target: &str, name: &str, selector: u8, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), [&[selector][..], bytes].concat()).unwrap();
    };
    let key = BackupKey::new("fuzz", &[0x42; 32]).unwrap();
    let compressible = vec![0x5au8; 4096];
    // xorshift64: bytes zstd cannot shrink, so the chunk is stored raw.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..1000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    write("backup_chunk", "seed-compressed", 0, &encode_chunk(&compressible, None));
    write("backup_chunk", "seed-raw", 0, &encode_chunk(&random, None));
    write("backup_chunk", "seed-sealed-compressed", 0x42, &encode_chunk(&compressible, Some(&key)));
    write("backup_chunk", "seed-sealed-raw", 0x42, &encode_chunk(&random, Some(&key)));
    write("backup_chunk", "seed-truncated", 0, &encode_chunk(&random, None)[..100]);
    let manifest = Manifest {
        id: "20261130T093512Z-0badcafe".into(),
        disk: "vol0".into(),
        disk_size: 3 * CS + 100,
        chunk_size: CS,
        created: "2026-11-30T09:35:12Z".into(),
        kind: BackupKind::Full,
        parent: None,
        key_id: None,
        chunks: vec![Some(ChunkId::of(&random, None)), None, Some(ChunkId::of(&compressible, None)), None],
    };
    write("backup_manifest", "seed-full", 0, &manifest.encode(None).unwrap());
    let incremental = Manifest {
        kind: BackupKind::Incremental,
        parent: Some("20261129T093512Z-00000001".into()),
        key_id: Some("fuzz".into()),
        ..manifest.clone()
    };
    let sealed = incremental.encode(Some(&key)).unwrap();
    write("backup_manifest", "seed-incremental-authenticated", 0x42, &sealed);
    write("backup_manifest", "seed-authenticated-read-without-key", 0, &sealed);
    let mut newer = manifest.encode(None).unwrap();
    newer[8] = 2;
    write("backup_manifest", "seed-newer-version", 0, &newer);
}
