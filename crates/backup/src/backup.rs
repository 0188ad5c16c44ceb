//! Taking a backup: read the disk chunk by chunk, skip zero chunks and chunks the store has,
//! upload the rest in parallel, then write the manifest.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use crate::catalogue::GC_GRACE;
use crate::chunk::encode_chunk;
use crate::chunk_id::ChunkId;
use crate::error::{invalid, BackupError, Result};
use crate::key::BackupKey;
use crate::manifest::{check_name, new_backup_id, BackupKind, Manifest};
use crate::store::{self, Store};
use crate::{check_chunk_size, chunk_count, DEFAULT_CHUNK_SIZE};

/// The disk a backup reads, chunk by chunk, from a control thread (blocking). [`backup`] reads
/// it on the calling thread only, so it need not be `Send` (a bdev channel is not: it belongs
/// to the thread that opened it).
pub trait ChunkSource {
    /// Fills `buf` with the disk's bytes from `offset` on; `buf` never reaches past the end.
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

/// What to back up.
#[derive(Debug, Clone, Copy)]
pub enum Plan<'a> {
    /// Every chunk.
    Full,
    /// The chunks in `changed` (indexes, any order; see [`crate::chunks_of_extents`]) are
    /// read again; the others' ids are the parent's. The parent must be of the same disk, size,
    /// chunk size and key.
    Incremental {
        /// The backup this one builds on.
        parent: &'a Manifest,
        /// The chunks that changed since the parent.
        changed: &'a [u64],
    },
}

/// How to back up.
#[derive(Debug, Clone)]
pub struct BackupOptions {
    /// The disk's name (recorded in the manifest and its object key).
    pub disk: String,
    /// The disk's size in bytes.
    pub disk_size: u64,
    /// The chunk size: a power of two from 64 KiB to 16 MiB; an incremental backup takes its
    /// parent's.
    pub chunk_size: u64,
    /// The key of an encrypted backup.
    pub key: Option<Arc<BackupKey>>,
    /// Uploads in flight at most (at least 1).
    pub parallel: usize,
}

impl BackupOptions {
    /// Options with the defaults: 1 MiB chunks, no encryption, 4 uploads in flight.
    pub fn new(disk: &str, disk_size: u64) -> BackupOptions {
        BackupOptions {
            disk: disk.to_string(),
            disk_size,
            chunk_size: DEFAULT_CHUNK_SIZE,
            key: None,
            parallel: 4,
        }
    }
}

/// A backup's counters, updated as it goes (relaxed atomics: each is exact, the set is not a
/// snapshot of one instant).
#[derive(Debug, Default)]
pub struct Progress {
    /// Chunks the backup will consider (all for a full backup, the changed for an incremental).
    pub chunks_total: AtomicU64,
    /// Chunks read from the disk.
    pub chunks_read: AtomicU64,
    /// Chunks read and found all zero (not stored).
    pub chunks_zero: AtomicU64,
    /// Chunks read whose content the store already had (this job's own, the parent's, or
    /// found by a HEAD).
    pub chunks_skipped: AtomicU64,
    /// Chunk objects uploaded.
    pub chunks_uploaded: AtomicU64,
    /// Bytes read from the disk.
    pub bytes_read: AtomicU64,
    /// Bytes uploaded (encoded chunk objects, the manifest not counted).
    pub bytes_uploaded: AtomicU64,
}

/// A copy of [`Progress`]'s counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressSnapshot {
    /// [`Progress::chunks_total`].
    pub chunks_total: u64,
    /// [`Progress::chunks_read`].
    pub chunks_read: u64,
    /// [`Progress::chunks_zero`].
    pub chunks_zero: u64,
    /// [`Progress::chunks_skipped`].
    pub chunks_skipped: u64,
    /// [`Progress::chunks_uploaded`].
    pub chunks_uploaded: u64,
    /// [`Progress::bytes_read`].
    pub bytes_read: u64,
    /// [`Progress::bytes_uploaded`].
    pub bytes_uploaded: u64,
}

impl Progress {
    /// The counters now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        ProgressSnapshot {
            chunks_total: self.chunks_total.load(Relaxed),
            chunks_read: self.chunks_read.load(Relaxed),
            chunks_zero: self.chunks_zero.load(Relaxed),
            chunks_skipped: self.chunks_skipped.load(Relaxed),
            chunks_uploaded: self.chunks_uploaded.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_uploaded: self.bytes_uploaded.load(Relaxed),
        }
    }
}

/// A running backup's handle, shared (`Arc`) between the thread that runs it and whoever
/// watches it: progress, cancellation, speed limit.
#[derive(Debug, Default)]
pub struct Job {
    progress: Progress,
    cancelled: AtomicBool,
    /// Wakes the backup's waits on the store (a free upload slot, the uploads in flight) at a
    /// cancel: a store that does not answer must not hold the cancel up.
    cancel_signal: Notify,
    speed_limit: AtomicU64,
}

impl Job {
    /// A job with no speed limit.
    pub fn new() -> Arc<Job> {
        Arc::new(Job::default())
    }

    /// The counters.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Asks the backup to stop: it reads no further chunk, drops the uploads in flight (a PUT
    /// that does not answer does not hold it up; an object is written whole or not at all, and
    /// a rerun asks the store again for each), and returns [`BackupError::Cancelled`] without
    /// writing a manifest.
    pub fn cancel(&self) {
        self.cancelled.store(true, Relaxed);
        self.cancel_signal.notify_waiters();
    }

    /// Resolves once the job is cancelled (at once if it is already).
    async fn cancelled(&self) {
        loop {
            let signal = self.cancel_signal.notified();
            tokio::pin!(signal);
            // Registered before the flag is read: a cancel between the two still wakes it.
            signal.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            signal.await;
        }
    }

    /// Whether [`Job::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Relaxed)
    }

    /// Limits reading the disk to `bytes_per_second` (0: unlimited); takes effect at once.
    pub fn set_speed_limit(&self, bytes_per_second: u64) {
        self.speed_limit.store(bytes_per_second, Relaxed);
    }

    /// The speed limit in bytes per second (0: unlimited).
    pub fn speed_limit(&self) -> u64 {
        self.speed_limit.load(Relaxed)
    }
}

/// A token bucket on the bytes read: it fills at the job's speed limit, up to one second's
/// worth (or one chunk, if larger), and starts empty.
struct Throttle {
    tokens: f64,
    last: Instant,
}

/// The longest single sleep of the throttle, so a cancel or a new limit is seen soon.
const THROTTLE_SLICE: Duration = Duration::from_millis(100);

impl Throttle {
    fn new() -> Throttle {
        Throttle { tokens: 0.0, last: Instant::now() }
    }

    /// Waits until `bytes` may be read; false when the job was cancelled meanwhile.
    fn take(&mut self, bytes: u64, job: &Job) -> bool {
        loop {
            if job.is_cancelled() {
                return false;
            }
            let limit = job.speed_limit();
            let now = Instant::now();
            if limit == 0 {
                self.tokens = 0.0;
                self.last = now;
                return true;
            }
            let burst = limit.max(bytes) as f64;
            self.tokens =
                (self.tokens + now.duration_since(self.last).as_secs_f64() * limit as f64).min(burst);
            self.last = now;
            if self.tokens >= bytes as f64 {
                self.tokens -= bytes as f64;
                return true;
            }
            let wait = Duration::from_secs_f64((bytes as f64 - self.tokens) / limit as f64);
            std::thread::sleep(wait.min(THROTTLE_SLICE));
        }
    }
}

/// Backs up the disk `source` reads to `store`, as `plan` says, and returns the manifest it
/// wrote last. Blocks; run it on a control thread.
///
/// Chunks are read one at a time on the calling thread (at the job's speed limit), hashed,
/// compressed and sealed there; uploads run on the store's runtime, `options.parallel` at a
/// time. A chunk the store already has is not uploaded: the parent's ids and this job's are
/// known, the others are asked with a HEAD first. So a backup run again after a crash or a
/// cancel uploads only what the first run did not. A store error is retried
/// ([`crate::RetryPolicy`]), then fails the job naming the object; the chunks uploaded stay
/// (a rerun skips them) and no manifest is written.
///
/// Refused with [`crate::ErrorKind::Busy`] while a GC runs on the same store in this process.
pub fn backup(
    store: &Store,
    source: &mut dyn ChunkSource,
    plan: Plan<'_>,
    options: &BackupOptions,
    job: &Arc<Job>,
) -> Result<Manifest> {
    check_name("disk", &options.disk)?;
    if options.disk_size == 0 {
        return Err(invalid("disk_size", "0"));
    }
    let key = options.key.as_deref();
    let (chunk_size, mut ids, to_read, kind, parent_id): (u64, Vec<Option<ChunkId>>, Vec<u64>, _, _) =
        match plan {
            Plan::Full => {
                check_chunk_size(options.chunk_size)?;
                let n = chunk_count(options.disk_size, options.chunk_size);
                (options.chunk_size, vec![None; n as usize], (0..n).collect(), BackupKind::Full, None)
            }
            Plan::Incremental { parent, changed } => {
                check_parent(parent, options)?;
                let n = parent.chunks.len() as u64;
                let mut changed = changed.to_vec();
                changed.sort_unstable();
                changed.dedup();
                if let Some(&bad) = changed.iter().find(|&&i| i >= n) {
                    return Err(invalid("changed", format!("chunk {bad} of a disk of {n} chunks")));
                }
                (
                    parent.chunk_size,
                    parent.chunks.clone(),
                    changed,
                    BackupKind::Incremental,
                    Some(parent.id.clone()),
                )
            }
        };
    let _guard = store.begin_backup()?;
    let created = chrono::Utc::now();
    let id = new_backup_id(created);
    let progress = &job.progress;
    progress.chunks_total.store(to_read.len() as u64, Relaxed);

    let mut known: HashSet<ChunkId> = ids.iter().flatten().copied().collect();
    let permits = Arc::new(Semaphore::new(options.parallel.max(1)));
    let failure: Arc<Mutex<Option<BackupError>>> = Arc::default();
    let mut uploads = JoinSet::new();
    let mut throttle = Throttle::new();
    let mut buf = vec![0u8; chunk_size as usize];
    let mut outcome = Ok(());
    for &index in &to_read {
        if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            break;
        }
        let offset = index * chunk_size;
        let len = chunk_size.min(options.disk_size - offset) as usize;
        if !throttle.take(len as u64, job) {
            break;
        }
        let plain = &mut buf[..len];
        if let Err(source) = source.read(offset, plain) {
            outcome = Err(BackupError::Source { disk: options.disk.clone(), offset, source });
            break;
        }
        progress.chunks_read.fetch_add(1, Relaxed);
        progress.bytes_read.fetch_add(len as u64, Relaxed);
        if is_zero(plain) {
            ids[index as usize] = None;
            progress.chunks_zero.fetch_add(1, Relaxed);
            continue;
        }
        let chunk_id = ChunkId::of(plain, key);
        ids[index as usize] = Some(chunk_id);
        if !known.insert(chunk_id) {
            progress.chunks_skipped.fetch_add(1, Relaxed);
            continue;
        }
        let object = Bytes::from(encode_chunk(plain, key));
        // A free upload slot, or a cancel: every slot may be held by a PUT that never answers.
        let permit = store.block_on(async {
            tokio::select! {
                permit = permits.clone().acquire_owned() => Some(permit.expect("the semaphore is never closed")),
                () = job.cancelled() => None,
            }
        });
        let Some(permit) = permit else { break };
        let (objects, retry, failure, job) =
            (store.objects().clone(), store.retry(), failure.clone(), job.clone());
        uploads.spawn_on(
            async move {
                let _permit = permit;
                let result = upload_chunk(&objects, retry, &chunk_id, object).await;
                let progress = job.progress();
                match result {
                    Ok(Some(bytes)) => {
                        progress.chunks_uploaded.fetch_add(1, Relaxed);
                        progress.bytes_uploaded.fetch_add(bytes, Relaxed);
                    }
                    Ok(None) => {
                        progress.chunks_skipped.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                    }
                }
            },
            store.runtime().handle(),
        );
        while uploads.try_join_next().is_some() {}
    }
    // Every upload in flight ends (each is bounded by the retry policy) before the job does,
    // unless the job is cancelled: then those still in flight are dropped at once.
    store.block_on(async {
        let drained = tokio::select! {
            () = async { while uploads.join_next().await.is_some() {} } => true,
            () = job.cancelled() => false,
        };
        if !drained {
            uploads.abort_all();
            while uploads.join_next().await.is_some() {}
        }
    });
    outcome?;
    if let Some(e) = failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    if job.is_cancelled() {
        return Err(BackupError::Cancelled { disk: options.disk.clone() });
    }
    let manifest = Manifest {
        id,
        disk: options.disk.clone(),
        disk_size: options.disk_size,
        chunk_size,
        created: created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        kind,
        parent: parent_id,
        key_id: key.map(|k| k.name().to_string()),
        chunks: ids,
    };
    let object = manifest.object_key();
    manifest.check(&object)?;
    let bytes = Bytes::from(manifest.encode(key)?);
    store.block_on(store::put(store.objects(), store.retry(), &object, bytes))?;
    log::info!(
        "backup {object} to {}: {} chunks, {} zero, {} uploaded",
        store.location(),
        manifest.chunks.len(),
        manifest.zero_chunks(),
        progress.chunks_uploaded.load(Relaxed)
    );
    Ok(manifest)
}

fn check_parent(parent: &Manifest, options: &BackupOptions) -> Result<()> {
    let object = parent.object_key();
    parent.check(&object)?;
    if parent.disk != options.disk {
        return Err(invalid(
            "parent",
            format!("{object} is a backup of {}, not {}", parent.disk, options.disk),
        ));
    }
    if parent.disk_size != options.disk_size {
        return Err(invalid(
            "parent",
            format!(
                "{object} is of {} bytes, the disk has {}: a resized disk needs a full backup",
                parent.disk_size, options.disk_size
            ),
        ));
    }
    let key = options.key.as_deref().map(BackupKey::name);
    if parent.key_id.as_deref() != key {
        return Err(invalid(
            "parent",
            format!("{object} was made with key {:?}, this backup uses {key:?}: the chunk ids differ, take a full backup", parent.key_id),
        ));
    }
    Ok(())
}

/// Whether every byte is zero (a word at a time).
fn is_zero(buf: &[u8]) -> bool {
    let (words, rest) = buf.split_at(buf.len() / 8 * 8);
    words.chunks_exact(8).all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == 0)
        && rest.iter().all(|&b| b == 0)
}

/// Uploads chunk `id` unless the store has it. Returns the bytes uploaded, or `None` when the
/// store had it. A chunk found but older than half the GC grace period is written again, so
/// that its last-modified time is fresh: a GC in another process that did not see this
/// backup's manifest (not written yet) then keeps it as young (docs/backup.md, "Garbage
/// collection").
async fn upload_chunk(
    objects: &Arc<dyn object_store::ObjectStore>,
    retry: store::RetryPolicy,
    id: &ChunkId,
    object: Bytes,
) -> Result<Option<u64>> {
    let key = id.object_key();
    if let Some(meta) = store::head(objects, retry, &key).await? {
        let age = chrono::Utc::now().signed_duration_since(meta.last_modified);
        if age.to_std().map_or(true, |age| age < GC_GRACE / 2) {
            return Ok(None);
        }
    }
    let len = object.len() as u64;
    store::put(objects, retry, &key, object).await?;
    Ok(Some(len))
}
