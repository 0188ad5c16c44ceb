//! Backup jobs (`bdev_backup_start` and friends): one bdev backed up to a store
//! ([`fp_backup`]), full or incremental, while its guest keeps writing. docs/backup.md, "Backup
//! jobs", tells the story.
//!
//! # The point in time, atomically with the bitmap
//!
//! A job with a `bitmap` first takes it ([`fp_bdev::disk::DirtyBitmap::take`]: every bit set
//! before the swap is in the frozen copy, every later one stays in the bitmap), THEN creates a
//! fleece of the bdev (the point in time the backup reads). In that order no write is ever
//! missed by the next incremental backup:
//!
//! * a write completed before the take is in the frozen copy (an incremental reads its chunk)
//!   and in the image;
//! * a write completed between the take and the fleece is in the live bitmap AND in the image:
//!   the next backup reads its chunk again, which costs a chunk, never a miss;
//! * a write after the fleece is in the live bitmap, not in the image: the next backup reads it.
//!
//! The other order (fleece, then take) would lose a write that completed between the two: it is
//! not in the image, and its bit would be cleared by the take.
//!
//! A full backup takes (clears) the bitmap too, adding it when absent (persistent, the given
//! granularity or 64 KiB) and removing and re-adding it when inconsistent, so that afterwards
//! it tracks the changes since this backup. When a job fails or is cancelled, its frozen copy
//! is merged back through the job's hold ([`fp_bdev::disk::BitmapUse::merge_back`]): nothing is lost.
//!
//! # The fleece's target
//!
//! A temporary io_uring bdev (`backup.<job>.scratch`) over a sparse file in the state directory
//! (`backup-jobs/<hex job>.scratch`): only the chunks the guest changes while the job runs take
//! room. It is made directly (not through `bdev_uring_create`): the state directory is the
//! daemon's own, not an export directory. A daemon without a state directory refuses backup
//! jobs (naming `bdev`): it has no room for the target, no job record to resume from and no
//! place for a bitmap's parent record.
//!
//! # Parent record, job record, resume
//!
//! After a backup with a bitmap succeeds, `<hex bdev>.<hex bitmap>.backup` in the state
//! directory records the store and backup id the bitmap was last taken for: an incremental's
//! parent. Anything that makes the bitmap stop covering "changes since that backup" (remove,
//! clear, disable, a new add) deletes it (`bitmaps.rs`). Each job's start parameters are
//! `backup-jobs/<hex job>.json`, written at start and removed at its end, but for a daemon stop:
//! [`Registry::resume_backup_jobs`] starts each record left again, as a full backup when its
//! bitmap came back inconsistent (a crash). Content addressing makes the rerun upload only what
//! the first run did not.
//!
//! The job's reads run on a thread of its own (never a reactor): a channel of the fleece bdev
//! read synchronously ([`fp_bdev::sync_io`]), chunk by chunk, through a DMA-able bounce buffer.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fp_backup::{BackupKey, ChunkSource, Manifest, Plan, Store};
use fp_bdev::disk::{BitmapUse, DirtyBitmap, FrozenBitmap, DEFAULT_BITMAP_GRANULARITY};
use fp_bdev::iov::BounceBuf;
use fp_bdev::{sync_io, BlockDevice, IoChannel, IoOp, IoRequest, ModuleHost, NewBdev, UringDevice};
use serde::{Deserialize, Serialize};

use crate::backup_state::{lock, BackupEntry, Outcome};
pub use crate::backup_state::{BackupSpec, BackupState, BackupStatus};
use crate::state_files::{hex, write_atomically};
use crate::{FleeceSpec, Registry, RegistryError};

/// How long `bdev_backup_cancel` and the daemon's shutdown wait for a job to end. A job sees a
/// cancel between chunks and drops its uploads in flight ([`fp_backup::Job::cancel`]), so it
/// normally ends within a chunk's read; the bound covers a read of the disk that hangs.
pub const BACKUP_WAIT: Duration = Duration::from_secs(60);

/// The state directory's folder of job records and scratch files.
const JOBS_DIR: &str = "backup-jobs";

fn invalid(field: &'static str, reason: impl Into<String>) -> RegistryError {
    RegistryError::Invalid { field, reason: reason.into() }
}

/// The name a bdev's backups have in a store. fp-backup allows 1 to 255 of `A-Z a-z 0-9 . - _
/// : + @`, not starting with a dot; every other byte (an lvol's `lvs/vol` `/`), a leading dot
/// and `@` itself are written `@` and two hex digits, so two bdevs never share a name.
pub fn store_disk_name(bdev: &str) -> Result<String, RegistryError> {
    let mut out = String::with_capacity(bdev.len());
    for (i, b) in bdev.bytes().enumerate() {
        let plain =
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'+') || (b == b'.' && i > 0);
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("@{b:02x}"));
        }
    }
    fp_backup::check_name("bdev", &out).map_err(|e| invalid("bdev", e.to_string()))?;
    Ok(out)
}

/// The record of the backup a bitmap was last taken for: an incremental's default parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ParentRecord {
    pub(crate) store: String,
    pub(crate) backup_id: String,
}

pub(crate) fn parent_record_path(dir: &Path, bdev: &str, bitmap: &str) -> PathBuf {
    dir.join(format!("{}.{}.backup", hex(bdev), hex(bitmap)))
}

fn io_error(path: &Path, e: std::io::Error) -> RegistryError {
    RegistryError::Bdev(fp_bdev::BdevError::Io(format!("{}: {e}", path.display())))
}

/// The fleece bdev of job `job_id`, and its scratch target.
fn fleece_name(job_id: &str) -> String {
    format!("backup.{job_id}")
}

fn scratch_name(job_id: &str) -> String {
    format!("backup.{job_id}.scratch")
}

/// What a job's thread needs, made by the start.
struct Prepared {
    bdev: String,
    disk_name: String,
    disk_size: u64,
    store: Arc<Store>,
    /// The store's name (`backup_store_add`), for the parent record.
    store_name: String,
    key: Option<Arc<BackupKey>>,
    chunk_size: u64,
    parent: Option<Manifest>,
    bitmap: Option<(BitmapUse, FrozenBitmap)>,
    fleece: String,
    scratch: String,
    scratch_file: PathBuf,
    record: PathBuf,
}

/// The fleece read as a [`ChunkSource`]: one channel, opened on the job's thread.
struct FleeceSource {
    chan: Box<dyn IoChannel>,
    bounce: BounceBuf,
}

impl ChunkSource for FleeceSource {
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let step = self.bounce.len();
        for (i, piece) in buf.chunks_mut(step).enumerate() {
            let iov = self.bounce.iovecs(piece.len());
            let req = IoRequest {
                tag: 0,
                op: IoOp::Read,
                offset: offset + (i * step) as u64,
                len: piece.len() as u64,
                iov,
            };
            sync_io::run(self.chan.as_mut(), &req, &mut || false)
                .map_err(std::io::Error::from_raw_os_error)?;
            piece.copy_from_slice(&self.bounce.bytes()[..piece.len()]);
        }
        Ok(())
    }
}

impl Registry {
    fn jobs_dir(&self) -> Result<PathBuf, RegistryError> {
        let dir = self.state_dir().ok_or_else(|| {
            invalid(
                "bdev",
                "a backup job needs the daemon's state directory (serve --state-dir / state_dir) for its \
                 scratch target and its record",
            )
        })?;
        let jobs = dir.join(JOBS_DIR);
        fs::create_dir_all(&jobs).map_err(|e| io_error(&jobs, e))?;
        Ok(jobs)
    }

    /// The store named `name` (`backup_store_add`).
    fn backup_store(&self, name: &str) -> Result<Arc<Store>, RegistryError> {
        Ok(fp_backup_bdev::stores(self).get(name)?)
    }

    /// The keyring key named `name`, as a backup key.
    fn backup_key(&self, name: &str) -> Result<Arc<BackupKey>, RegistryError> {
        Ok(fp_backup_bdev::backup_key(self, name)?)
    }

    /// `bdev_backup_start`: checks, takes the bitmap, makes the point in time, and starts the
    /// job's thread; returns the job's id.
    pub fn backup_start(&self, spec: BackupSpec) -> Result<String, RegistryError> {
        self.jobs_dir()?;
        let store = self.backup_store(&spec.store)?;
        let key = spec.key.as_deref().map(|k| self.backup_key(k)).transpose()?;
        self.backup_start_with(spec, store, key, false)
    }

    /// [`Registry::backup_start`] with the store and key resolved; `resumed` when a job record
    /// left by an earlier run is started again.
    pub(crate) fn backup_start_with(
        &self,
        spec: BackupSpec,
        store: Arc<Store>,
        key: Option<Arc<BackupKey>>,
        resumed: bool,
    ) -> Result<String, RegistryError> {
        let jobs_dir = self.jobs_dir()?;
        let state_dir = self.state_dir().map(Path::to_path_buf).unwrap_or_default();
        let bdev = self
            .lock()
            .canonical(&spec.bdev)
            .map(String::from)
            .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: spec.bdev.clone() })?;
        let job_id = spec.job_id.clone().unwrap_or_else(|| bdev.clone());
        if job_id.is_empty() || job_id.len() > 255 || job_id.chars().any(char::is_control) {
            return Err(invalid("job_id", "1 to 255 bytes, no control characters"));
        }
        let mut incremental = match spec.sync.as_str() {
            "full" => false,
            "incremental" => true,
            other => return Err(invalid("sync", format!("'{other}' is not one of full, incremental"))),
        };
        if incremental && spec.bitmap.is_none() {
            return Err(invalid("bitmap", "an incremental backup needs the bitmap that tracks its changes"));
        }
        let chunk_size = spec.chunk_size.unwrap_or(fp_backup::DEFAULT_CHUNK_SIZE);
        fp_backup::check_chunk_size(chunk_size).map_err(|e| invalid("chunk_size", e.to_string()))?;
        if spec.parallel == Some(0) {
            return Err(invalid("parallel", "at least 1"));
        }
        let disk_name = store_disk_name(&bdev)?;
        {
            let st = self.lock();
            if st.backups.get(&job_id).is_some_and(|e| e.state() == BackupState::Running) {
                return Err(RegistryError::AlreadyExists { kind: "backup job", name: job_id });
            }
            if let Some((id, _)) =
                st.backups.iter().find(|(_, e)| e.state() == BackupState::Running && e.spec.bdev == bdev)
            {
                return Err(RegistryError::InUse { name: bdev, by: format!("backup {id}") });
            }
        }
        let disk = self.disk(&bdev)?;
        let disk_size = disk.info().size_bytes();
        let block_size = disk.info().block_size;

        // The bitmap: the frozen copy of the changes since the parent.
        let mut parent = None;
        let mut bitmap_use = None;
        if let Some(name) = &spec.bitmap {
            let found = disk.dirty_bitmaps().into_iter().find(|b| b.name() == name);
            if resumed && incremental && found.as_ref().is_some_and(|b| b.inconsistent()) {
                log::warn!(
                    "backup job '{job_id}': bitmap '{name}' of '{bdev}' came back inconsistent (the daemon \
                     stopped uncleanly): resuming as a full backup"
                );
                incremental = false;
            }
            if incremental {
                let b = found.ok_or_else(|| {
                    invalid("bitmap", format!("bdev '{bdev}' has no dirty bitmap '{name}'"))
                })?;
                if b.inconsistent() {
                    return Err(invalid(
                        "bitmap",
                        format!("'{name}' is inconsistent (it may have missed writes): take a full backup"),
                    ));
                }
                let record = read_parent_record(&state_dir, &bdev, name)?;
                let id = match (&record, &spec.parent) {
                    (None, _) => {
                        return Err(invalid(
                            "parent",
                            format!(
                                "no backup is recorded for bitmap '{name}' of '{bdev}': take a full backup \
                                 with it first"
                            ),
                        ))
                    }
                    (Some(r), _) if r.store != spec.store => {
                        return Err(invalid(
                            "parent",
                            format!(
                                "bitmap '{name}' was last taken for a backup to store '{}', not '{}': take a \
                                 full backup",
                                r.store, spec.store
                            ),
                        ))
                    }
                    (Some(r), Some(p)) if *p != r.backup_id => {
                        return Err(invalid(
                            "parent",
                            format!(
                                "bitmap '{name}' was last taken for backup {}, not {p}: it holds the changes \
                                 since {}",
                                r.backup_id, r.backup_id
                            ),
                        ))
                    }
                    (Some(r), _) => r.backup_id.clone(),
                };
                let m = store
                    .manifest(&disk_name, &id, key.as_deref())
                    .map_err(|e| invalid("parent", e.to_string()))?;
                if m.disk_size != disk_size {
                    return Err(invalid(
                        "parent",
                        format!(
                            "{id} is of {} bytes, the disk has {disk_size}: take a full backup",
                            m.disk_size
                        ),
                    ));
                }
                if m.key_id.as_deref() != key.as_deref().map(BackupKey::name) {
                    return Err(invalid(
                        "key",
                        format!("parent {id} was made with key {:?}: an incremental uses its key", m.key_id),
                    ));
                }
                if spec.chunk_size.is_some_and(|c| c != m.chunk_size) {
                    return Err(invalid(
                        "chunk_size",
                        format!(
                            "parent {id} has chunks of {} bytes: an incremental takes its parent's",
                            m.chunk_size
                        ),
                    ));
                }
                parent = Some(m);
                bitmap_use = Some(hold_bitmap(b, &bdev, &job_id)?);
            } else {
                let b = match found {
                    Some(b) if b.inconsistent() => {
                        self.remove_dirty_bitmap(&bdev, &disk, name).map_err(method_error)?;
                        log::info!(
                            "backup job '{job_id}': inconsistent bitmap '{name}' of '{bdev}' re-created"
                        );
                        None
                    }
                    other => other,
                };
                let b = match b {
                    Some(b) => b,
                    None => {
                        let g = fp_bdev::disk::check_granularity(
                            "granularity",
                            spec.granularity.unwrap_or(DEFAULT_BITMAP_GRANULARITY),
                        )
                        .map_err(|e| invalid("granularity", e.to_string()))?;
                        let fresh = DirtyBitmap::new(name, disk_size, g, true, true);
                        self.add_dirty_bitmap(&bdev, &disk, fresh).map_err(method_error)?
                    }
                };
                bitmap_use = Some(hold_bitmap(b, &bdev, &job_id)?);
            }
        }
        let sync = if incremental { "incremental" } else { "full" }.to_string();

        // The record first: a crash from here on leaves it, and the next start resumes.
        let record = jobs_dir.join(format!("{}.json", hex(&job_id)));
        let mut recorded = spec.clone();
        recorded.job_id = Some(job_id.clone());
        let text = serde_json::to_vec_pretty(&recorded).map_err(|e| invalid("job_id", e.to_string()))?;
        write_atomically(&record, &text).map_err(|e| io_error(&record, e))?;
        let forget = || {
            let _ = fs::remove_file(&record);
        };

        // Take, THEN fleece (module docs): a write between the two is read again next time.
        let bitmap = bitmap_use.map(|u| {
            let frozen = u.take();
            (u, frozen)
        });
        let merge_back = |bitmap: &Option<(BitmapUse, FrozenBitmap)>| {
            if let Some((u, frozen)) = bitmap {
                u.merge_back(frozen);
            }
        };
        let scratch = scratch_name(&job_id);
        let scratch_file = jobs_dir.join(format!("{}.scratch", hex(&job_id)));
        if let Err(e) = self.make_scratch(&scratch, &scratch_file, disk_size, block_size) {
            merge_back(&bitmap);
            forget();
            return Err(e);
        }
        let fleece = match self.fleece_create(FleeceSpec {
            name: fleece_name(&job_id),
            base_bdev: bdev.clone(),
            target_bdev: scratch.clone(),
            granularity: None,
        }) {
            Ok(f) => f,
            Err(e) => {
                merge_back(&bitmap);
                self.drop_scratch(&scratch, &scratch_file);
                forget();
                return Err(match e {
                    RegistryError::Invalid { reason, .. } => invalid("bdev", reason),
                    other => other,
                });
            }
        };

        let job = fp_backup::Job::new();
        job.set_speed_limit(spec.speed);
        let outcome =
            Arc::new(Mutex::new(Outcome { state: BackupState::Running, backup_id: None, error: None }));
        let stopping = Arc::new(AtomicBool::new(false));
        let prepared = Prepared {
            bdev: bdev.clone(),
            disk_name,
            disk_size,
            store,
            store_name: spec.store.clone(),
            key,
            chunk_size: parent.as_ref().map_or(chunk_size, |m| m.chunk_size),
            parent,
            bitmap,
            fleece,
            scratch,
            scratch_file,
            record,
        };
        let Some(me) = self.me.upgrade() else {
            return Err(RegistryError::NotNow("the registry is going away".into()));
        };
        let (t_job, t_outcome, t_stopping, t_id) =
            (job.clone(), outcome.clone(), stopping.clone(), job_id.clone());
        let parallel = spec.parallel.unwrap_or(4) as usize;
        let mut st = self.lock();
        let thread = std::thread::Builder::new()
            .name(format!("backup-{job_id}"))
            .spawn(move || me.run_backup(&t_id, prepared, parallel, &t_job, &t_outcome, &t_stopping))
            .map_err(|e| RegistryError::NotNow(format!("no thread for the backup job: {e}")))?;
        st.backups.insert(
            job_id.clone(),
            BackupEntry {
                spec,
                sync: sync.clone(),
                job,
                outcome,
                stopping,
                thread: Some(thread),
                started: Instant::now(),
            },
        );
        drop(st);
        log::info!("backup job '{job_id}' started: {sync} backup of '{bdev}'");
        Ok(job_id)
    }

    fn make_scratch(&self, name: &str, file: &Path, size: u64, block_size: u32) -> Result<(), RegistryError> {
        let f = fs::File::create(file).map_err(|e| io_error(file, e))?;
        f.set_len(size).map_err(|e| io_error(file, e))?;
        drop(f);
        // O_DIRECT keeps the copies out of the page cache; a file system without it (tmpfs)
        // gets buffered I/O.
        let dev = UringDevice::new(name, file, Some(block_size), true)
            .or_else(|_| UringDevice::new(name, file, Some(block_size), false))
            .inspect_err(|_| {
                let _ = fs::remove_file(file);
            })?;
        ModuleHost::add_bdev(self, "uring", NewBdev::new(Arc::new(dev))).map_err(|e| {
            let _ = fs::remove_file(file);
            RegistryError::from(e)
        })?;
        Ok(())
    }

    fn drop_scratch(&self, name: &str, file: &Path) {
        if let Err(e) = self.delete_bdev(name, Some("uring")) {
            log::error!("backup scratch bdev '{name}' not deleted: {e}");
        }
        if let Err(e) = fs::remove_file(file) {
            log::error!("backup scratch file {} not removed: {e}", file.display());
        }
    }

    /// The job's thread: reads the fleece into the store, then ends the job.
    fn run_backup(
        &self,
        job_id: &str,
        p: Prepared,
        parallel: usize,
        job: &Arc<fp_backup::Job>,
        outcome: &Mutex<Outcome>,
        stopping: &AtomicBool,
    ) {
        let result = self.backup_read(&p, parallel, job);
        // The resize check: the image is of the size the job started with. The manifest is
        // already in the store; it goes again, so that a failed job leaves no backup behind
        // (nothing records it as a parent, and a listing would show a backup of a job that
        // failed). Its chunks are left to the GC.
        let result = result.and_then(|m| {
            let now = self.disk(&p.bdev).map(|d| d.info().size_bytes()).unwrap_or(0);
            if now != m.disk_size {
                if let Err(e) = p.store.delete(&p.disk_name, &m.id) {
                    log::error!("backup job '{job_id}': backup {} of a resized disk not deleted: {e}", m.id);
                }
                Err(format!(
                    "bdev: '{}' was resized from {} to {now} bytes while the backup ran: take a full backup",
                    p.bdev, m.disk_size
                ))
            } else {
                Ok(m)
            }
        });
        if let Err(e) = self.fleece_delete(&p.fleece) {
            log::error!("backup job '{job_id}': fleece '{}' not deleted: {e}", p.fleece);
        }
        self.drop_scratch(&p.scratch, &p.scratch_file);
        let daemon_stop = stopping.load(Ordering::SeqCst);
        let mut o = lock(outcome);
        match result {
            Ok(m) => {
                if let (Some((u, _)), Some(dir)) = (&p.bitmap, self.state_dir()) {
                    let path = parent_record_path(dir, &p.bdev, u.name());
                    let rec = ParentRecord { store: p.store_name.clone(), backup_id: m.id.clone() };
                    let bytes = serde_json::to_vec(&rec).unwrap_or_default();
                    if let Err(e) = write_atomically(&path, &bytes) {
                        log::error!(
                            "backup job '{job_id}': parent record {} not written: {e}",
                            path.display()
                        );
                    }
                }
                o.state = BackupState::Completed;
                o.backup_id = Some(m.id.clone());
                log::info!("backup job '{job_id}' completed: backup {} of '{}'", m.id, p.bdev);
            }
            Err(e) => {
                // Through the job's own hold: the bitmap methods refuse everyone else meanwhile.
                if let Some((u, frozen)) = &p.bitmap {
                    u.merge_back(frozen);
                }
                if job.is_cancelled() {
                    o.state = BackupState::Cancelled;
                    log::info!(
                        "backup job '{job_id}' cancelled{}",
                        if daemon_stop { " by the daemon's stop" } else { "" }
                    );
                } else {
                    log::error!("backup job '{job_id}' failed: {e}");
                    o.state = BackupState::Failed;
                    o.error = Some(e);
                }
            }
        }
        if !daemon_stop {
            let _ = fs::remove_file(&p.record);
        }
    }

    fn backup_read(
        &self,
        p: &Prepared,
        parallel: usize,
        job: &Arc<fp_backup::Job>,
    ) -> Result<Manifest, String> {
        let disk = self.disk(&p.fleece).map_err(|e| e.to_string())?;
        let chan = disk.open().map_err(|e| format!("bdev: cannot read the point in time: {e}"))?;
        let mut source = FleeceSource { chan, bounce: BounceBuf::zeroed(p.chunk_size as usize) };
        let changed: Vec<u64>;
        let plan = match (&p.parent, &p.bitmap) {
            (Some(parent), Some((_, frozen))) => {
                let extents = frozen.extents(0, p.disk_size, usize::MAX);
                changed = fp_backup::chunks_of_extents(extents, parent.chunk_size, p.disk_size);
                Plan::Incremental { parent, changed: &changed }
            }
            _ => Plan::Full,
        };
        let mut options = fp_backup::BackupOptions::new(&p.disk_name, p.disk_size);
        options.chunk_size = p.chunk_size;
        options.key = p.key.clone();
        options.parallel = parallel;
        fp_backup::backup(&p.store, &mut source, plan, &options, job).map_err(|e| e.to_string())
    }

    fn backup_entry_status(&self, job_id: &str) -> Result<BackupStatus, RegistryError> {
        self.lock()
            .backups
            .get(job_id)
            .map(|e| e.status(job_id))
            .ok_or_else(|| RegistryError::NotFound { kind: "backup job", name: job_id.into() })
    }

    /// `bdev_backup_get_jobs`: every job (those that ended too, until dismissed), or one.
    pub fn backup_jobs(&self, job_id: Option<&str>) -> Result<Vec<BackupStatus>, RegistryError> {
        match job_id {
            Some(id) => Ok(vec![self.backup_entry_status(id)?]),
            None => Ok(self.lock().backups.iter().map(|(id, e)| e.status(id)).collect()),
        }
    }

    /// `bdev_backup_set_speed`: a running job's new speed limit in bytes per second (0: none).
    pub fn backup_set_speed(&self, job_id: &str, speed: u64) -> Result<(), RegistryError> {
        let st = self.lock();
        let e = st
            .backups
            .get(job_id)
            .ok_or_else(|| RegistryError::NotFound { kind: "backup job", name: job_id.into() })?;
        if e.state() != BackupState::Running {
            return Err(RegistryError::NotNow(format!(
                "backup job '{job_id}' is {}: it is over",
                e.state().name()
            )));
        }
        e.job.set_speed_limit(speed);
        log::info!("backup job '{job_id}': speed limit {speed} bytes/s (0: none)");
        Ok(())
    }

    /// `bdev_backup_cancel`: cancels a running job and waits (up to `wait`) until it ended (its
    /// bitmap's bits merged back, its fleece gone); a job that ended is dismissed.
    pub fn backup_cancel(&self, job_id: &str, wait: Duration) -> Result<BackupStatus, RegistryError> {
        let thread = {
            let mut st = self.lock();
            let e = st
                .backups
                .get_mut(job_id)
                .ok_or_else(|| RegistryError::NotFound { kind: "backup job", name: job_id.into() })?;
            if e.state() != BackupState::Running {
                let status = e.status(job_id);
                if let Some(t) = e.thread.take() {
                    let _ = t.join();
                }
                st.backups.remove(job_id);
                log::info!("backup job '{job_id}' dismissed");
                return Ok(status);
            }
            e.job.cancel();
            e.thread.take()
        };
        self.join_backup(job_id, thread, wait)?;
        self.backup_entry_status(job_id)
    }

    /// Waits (bounded) for a job's thread; a thread that does not end is left running.
    fn join_backup(
        &self,
        job_id: &str,
        thread: Option<JoinHandle<()>>,
        wait: Duration,
    ) -> Result<(), RegistryError> {
        let Some(thread) = thread else { return Ok(()) };
        let deadline = Instant::now() + wait;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                if let Some(e) = self.lock().backups.get_mut(job_id) {
                    e.thread = Some(thread);
                }
                return Err(RegistryError::NotNow(format!(
                    "backup job '{job_id}' has not ended after {} s; it goes on: see bdev_backup_get_jobs",
                    wait.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = thread.join();
        Ok(())
    }

    /// At the daemon's clean shutdown, before the bitmaps are saved: cancels every running job
    /// (its bits merged back) and keeps its record, so the next start resumes it. Returns the
    /// bdevs whose job did not end in time: their bitmaps must stay IN_USE (they lack the
    /// frozen bits).
    pub(crate) fn stop_backups(&self, wait: Duration) -> Vec<String> {
        let running: Vec<(String, String, Option<JoinHandle<()>>)> = {
            let mut st = self.lock();
            st.backups
                .iter_mut()
                .filter(|(_, e)| e.state() == BackupState::Running)
                .map(|(id, e)| {
                    e.stopping.store(true, Ordering::SeqCst);
                    e.job.cancel();
                    (id.clone(), e.spec.bdev.clone(), e.thread.take())
                })
                .collect()
        };
        let deadline = Instant::now() + wait;
        let mut left = Vec::new();
        for (id, bdev, thread) in running {
            let wait = deadline.saturating_duration_since(Instant::now());
            if let Err(e) = self.join_backup(&id, thread, wait) {
                log::error!("{e}");
                left.push(self.lock().canonical(&bdev).unwrap_or(&bdev).to_string());
            }
        }
        left
    }

    /// Starts again every job whose record a stopped daemon left in the state directory (after
    /// the configuration file is applied). A record that cannot start ends as a failed job,
    /// listed by `bdev_backup_get_jobs`, and goes.
    pub fn resume_backup_jobs(&self) {
        let Some(dir) = self.state_dir().map(|d| d.join(JOBS_DIR)) else { return };
        let Ok(entries) = fs::read_dir(&dir) else { return };
        let mut records: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        records.sort();
        for path in records {
            let spec = fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<BackupSpec>(&b).map_err(|e| e.to_string()));
            let spec = match spec {
                Ok(s) => s,
                Err(e) => {
                    log::error!("backup job record {}: not resumed, left alone: {e}", path.display());
                    continue;
                }
            };
            let job_id = spec.job_id.clone().unwrap_or_else(|| spec.bdev.clone());
            log::info!("backup job '{job_id}': resuming (a record left by the last run)");
            let started = self
                .backup_store(&spec.store)
                .and_then(|s| Ok((s, spec.key.as_deref().map(|k| self.backup_key(k)).transpose()?)))
                .and_then(|(store, key)| self.backup_start_with(spec.clone(), store, key, true));
            if let Err(e) = started {
                log::error!("backup job '{job_id}': not resumed: {e}");
                let _ = fs::remove_file(&path);
                let sync = spec.sync.clone();
                self.lock().backups.insert(
                    job_id,
                    BackupEntry {
                        spec,
                        sync,
                        job: fp_backup::Job::new(),
                        outcome: Arc::new(Mutex::new(Outcome {
                            state: BackupState::Failed,
                            backup_id: None,
                            error: Some(format!("not resumed: {e}")),
                        })),
                        stopping: Arc::default(),
                        thread: None,
                        started: Instant::now(),
                    },
                );
            }
        }
    }

    /// The running backup job of bdev `name`, if any.
    pub(crate) fn backup_on(st: &crate::state::State, name: &str) -> Option<String> {
        st.backups
            .iter()
            .find(|(_, e)| e.state() == BackupState::Running && e.spec.bdev == name)
            .map(|(id, _)| id.clone())
    }
}

/// Holds bitmap `b` of `bdev` for job `job_id`, alone: refused (naming the holder) while an
/// export or another job holds it.
fn hold_bitmap(b: Arc<DirtyBitmap>, bdev: &str, job_id: &str) -> Result<BitmapUse, RegistryError> {
    let name = b.name().to_string();
    BitmapUse::exclusive(b, bdev, &format!("backup job '{job_id}'")).map_err(|e| match e {
        fp_bdev::disk::BitmapError::Busy { holder, .. } => RegistryError::InUse {
            name: bdev.into(),
            by: format!("{holder}, through its dirty bitmap '{name}'"),
        },
        other => invalid("bitmap", other.to_string()),
    })
}

/// A bitmap method's refusal, as this job's: a field of the bitmap methods is `bitmap` here.
fn method_error(e: crate::MethodError) -> RegistryError {
    match e {
        crate::MethodError::Registry(RegistryError::Invalid { reason, .. }) => invalid("bitmap", reason),
        crate::MethodError::Registry(r) => r,
        crate::MethodError::Failed { code, message } => {
            RegistryError::Module { errno: code, source: message.into() }
        }
        other => invalid("bitmap", other.to_string()),
    }
}

fn read_parent_record(dir: &Path, bdev: &str, bitmap: &str) -> Result<Option<ParentRecord>, RegistryError> {
    let path = parent_record_path(dir, bdev, bitmap);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            invalid("parent", format!("{}: {e} (remove the file to start over)", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(&path, e)),
    }
}

impl Registry {
    /// Deletes the parent record of bitmap `name` of `bdev`: the bitmap no longer holds the
    /// changes since that backup (removed, cleared, disabled, made anew).
    pub(crate) fn forget_backup_parent(&self, bdev: &str, name: &str) {
        let Some(dir) = self.state_dir() else { return };
        let bdev = self.lock().canonical(bdev).unwrap_or(bdev).to_string();
        forget_parent(dir, &bdev, name);
    }
}

fn forget_parent(dir: &Path, bdev: &str, name: &str) {
    let path = parent_record_path(dir, bdev, name);
    match fs::remove_file(&path) {
        Ok(()) => {
            log::info!("bdev '{bdev}': bitmap '{name}' no longer tracks its last backup; record removed")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::error!("{}: not removed: {e}", path.display()),
    }
}

#[cfg(test)]
#[path = "backup_tests.rs"]
mod tests;
