//! A backup job's plain types (`backup.rs` acts on them): what a start asks for (also the job
//! record), the states, what `bdev_backup_get_jobs` shows, and the entry the registry keeps.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use fp_backup::ProgressSnapshot;
use serde::{Deserialize, Serialize};

/// What `bdev_backup_start` asks for; also the job record kept in the state directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupSpec {
    pub bdev: String,
    pub store: String,
    /// Defaults to the bdev's name.
    pub job_id: Option<String>,
    /// "full" or "incremental".
    pub sync: String,
    pub bitmap: Option<String>,
    /// The bitmap's granularity when a full backup adds it.
    pub granularity: Option<u64>,
    pub parent: Option<String>,
    pub chunk_size: Option<u64>,
    pub key: Option<String>,
    pub parallel: Option<u64>,
    /// Bytes per second read from the disk; 0: no limit.
    pub speed: u64,
}

/// A job's state, with QEMU's names where they mean the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupState {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl BackupState {
    pub fn name(self) -> &'static str {
        match self {
            BackupState::Running => "running",
            BackupState::Completed => "completed",
            BackupState::Failed => "failed",
            BackupState::Cancelled => "cancelled",
        }
    }
}

/// What `bdev_backup_get_jobs` reports of a job.
#[derive(Debug, Clone)]
pub struct BackupStatus {
    pub job_id: String,
    pub bdev: String,
    pub store: String,
    pub sync: String,
    pub bitmap: Option<String>,
    pub state: BackupState,
    pub backup_id: Option<String>,
    pub error: Option<String>,
    pub progress: ProgressSnapshot,
    /// The speed limit in bytes per second (0: none).
    pub speed: u64,
    /// Bytes read per second since the job started.
    pub read_rate: u64,
}

/// Where a job stands, shared between its thread and the registry.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) state: BackupState,
    pub(crate) backup_id: Option<String>,
    pub(crate) error: Option<String>,
}

/// A job as the registry keeps it.
pub(crate) struct BackupEntry {
    pub(crate) spec: BackupSpec,
    /// The sync actually run (a resumed incremental with an inconsistent bitmap runs full).
    pub(crate) sync: String,
    pub(crate) job: Arc<fp_backup::Job>,
    pub(crate) outcome: Arc<Mutex<Outcome>>,
    /// Set when the daemon's shutdown cancels the job: its record stays, so it resumes.
    pub(crate) stopping: Arc<AtomicBool>,
    pub(crate) thread: Option<JoinHandle<()>>,
    pub(crate) started: Instant,
}

impl BackupEntry {
    pub(crate) fn state(&self) -> BackupState {
        lock(&self.outcome).state
    }

    pub(crate) fn status(&self, job_id: &str) -> BackupStatus {
        let o = lock(&self.outcome);
        let progress = self.job.progress().snapshot();
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        BackupStatus {
            job_id: job_id.to_string(),
            bdev: self.spec.bdev.clone(),
            store: self.spec.store.clone(),
            sync: self.sync.clone(),
            bitmap: self.spec.bitmap.clone(),
            state: o.state,
            backup_id: o.backup_id.clone(),
            error: o.error.clone(),
            progress,
            speed: self.job.speed_limit(),
            read_rate: (progress.bytes_read as f64 / secs) as u64,
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Backup jobs by id.
pub(crate) type Backups = BTreeMap<String, BackupEntry>;
