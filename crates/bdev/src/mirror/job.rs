//! A job's shared state ([`MirrorShared`]: the bitmap, the phase, the counters every channel
//! and the copier update) and the control plane's handle on it ([`MirrorJob`]).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bitmap::{granularity_for, DirtyMap};
use super::copier::MirrorStart;
use super::MirrorError;
use crate::{Bdev, BlockDevice, Disk};

/// A job's state as `bdev_mirror_get_jobs` reports it (QEMU's job states, folded: `running`
/// until the target has caught up, then `ready` while writes go to both disks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorState {
    /// Copying: the target has not caught up yet.
    Running,
    /// Caught up: every write goes to both disks until the job is completed or cancelled.
    Ready,
    /// Completed: the target held what the source held when the job detached.
    Completed,
    /// Cancelled: the target is left as it was, partly copied.
    Cancelled,
    /// Failed (the target or a copy failed); the source was never failed by the job.
    Failed,
}

impl MirrorState {
    /// The name the RPC reports.
    pub fn name(self) -> &'static str {
        match self {
            MirrorState::Running => "running",
            MirrorState::Ready => "ready",
            MirrorState::Completed => "completed",
            MirrorState::Cancelled => "cancelled",
            MirrorState::Failed => "failed",
        }
    }

    /// Whether the job is over.
    pub fn is_final(self) -> bool {
        matches!(self, MirrorState::Completed | MirrorState::Cancelled | MirrorState::Failed)
    }
}

/// What `bdev_mirror_get_jobs` reports of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorStatus {
    /// The job's name.
    pub job_id: String,
    /// The source bdev.
    pub source: String,
    /// The target bdev.
    pub target: String,
    /// Where it is.
    pub state: MirrorState,
    /// Bytes mirrored (the source's size when the job started).
    pub len: u64,
    /// Bytes the copier has copied so far (a chunk copied twice counts twice).
    pub copied: u64,
    /// Bytes still to copy: dirty chunks times the granularity.
    pub dirty_bytes: u64,
    /// Copies and blocking writes in flight.
    pub in_flight: u64,
    /// The chunk size, in bytes.
    pub granularity: u64,
    /// The copy's speed limit in bytes per second; 0: none.
    pub speed: u64,
    /// Why it failed.
    pub error: Option<String>,
}

/// What a job is asked for when it starts.
#[derive(Debug, Clone, Default)]
pub struct MirrorOptions {
    /// The job's name (the registry defaults it to the source's name).
    pub job_id: String,
    /// Bytes per bitmap bit; `None` picks 64 KiB, or more for a disk so large that the bitmap
    /// would exceed 1 MiB.
    pub granularity: Option<u64>,
    /// The copy's speed limit in bytes per second (QEMU's `speed`); 0: none. Guest writes
    /// mirrored once the job is ready are never held back by it.
    pub speed: u64,
}

// The phases, in order. A job moves forward only.
/// Attached; waiting until every channel of the source marks what it completes.
pub(crate) const ATTACHING: u8 = 0;
/// Copying dirty chunks.
pub(crate) const COPYING: u8 = 1;
/// Converged once; channels are switching to writing both disks.
pub(crate) const SWITCHING: u8 = 2;
/// Every channel writes both disks (`ready`).
pub(crate) const READY: u8 = 3;
/// Detached; waiting for channels to drop the target and copies to end.
pub(crate) const DETACHING: u8 = 4;
/// Over; `ending` says how.
pub(crate) const DONE: u8 = 5;

pub(crate) struct MirrorShared {
    pub(crate) job_id: String,
    pub(crate) source_name: String,
    pub(crate) target_name: String,
    pub(crate) source: Disk,
    pub(crate) target: Bdev,
    pub(crate) len: u64,
    pub(crate) map: DirtyMap,
    pub(crate) phase: AtomicU8,
    /// The final state, set when detaching starts.
    ending: AtomicU8,
    pub(crate) complete_asked: AtomicBool,
    pub(crate) cancel_asked: AtomicBool,
    failed: AtomicBool,
    error: Mutex<Option<String>>,
    pub(crate) copied: AtomicU64,
    pub(crate) copies_in_flight: AtomicU64,
    /// Blocking writes (and flushes) sent to both disks and not yet completed upward.
    pub(crate) dual_in_flight: AtomicI64,
    /// Writes in flight on the source alone while attached (and whatever each channel had in
    /// flight when it attached): each marks its chunks when it completes.
    pub(crate) source_only: AtomicI64,
    /// The copier's limit in bytes per second (0: none), changeable while the job runs.
    pub(crate) speed: AtomicU64,
}

impl MirrorShared {
    /// Fails the job (first error wins); the copier detaches it. Never touches the source.
    pub(crate) fn fail(&self, why: String) {
        let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_none() {
            log::warn!("mirror job '{}': {why}", self.job_id);
            *e = Some(why);
        }
        self.failed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Whether new writes should stop going to the target (failed or cancelled).
    pub(crate) fn stopping(&self) -> bool {
        self.failed() || self.cancel_asked.load(Ordering::SeqCst)
    }

    /// Whether channels should write both disks.
    pub(crate) fn wants_dual(&self) -> bool {
        let p = self.phase.load(Ordering::SeqCst);
        (SWITCHING..=READY).contains(&p) && !self.stopping()
    }

    pub(crate) fn set_ending(&self, state: MirrorState) {
        self.ending.store(state as u8, Ordering::SeqCst);
    }

    pub(crate) fn state(&self) -> MirrorState {
        match self.phase.load(Ordering::SeqCst) {
            DONE => match self.ending.load(Ordering::SeqCst) {
                x if x == MirrorState::Completed as u8 => MirrorState::Completed,
                x if x == MirrorState::Cancelled as u8 => MirrorState::Cancelled,
                _ => MirrorState::Failed,
            },
            READY => MirrorState::Ready,
            DETACHING if self.ending.load(Ordering::SeqCst) == MirrorState::Completed as u8 => {
                MirrorState::Ready
            }
            _ => MirrorState::Running,
        }
    }
}

/// The control plane's handle on a mirror job. Cheap to clone.
#[derive(Clone)]
pub struct MirrorJob(pub(crate) Arc<MirrorShared>);

impl std::fmt::Debug for MirrorJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorJob").field("job_id", &self.0.job_id).finish_non_exhaustive()
    }
}

impl MirrorJob {
    /// Attaches a job copying `source` to `target` and returns its handle and what starts its
    /// copier ([`MirrorStart::open`], on the reactor that will poll it). From here on, every
    /// write that completes on `source` marks its chunks. Refuses what cannot work: the disk
    /// layer off, a second job on `source`, a target smaller, read-only, without writes, or
    /// with a larger block size, a bad granularity.
    pub fn start(
        source: &Disk,
        target: Bdev,
        options: MirrorOptions,
    ) -> Result<(MirrorJob, MirrorStart), MirrorError> {
        let si = source.info();
        let ti = target.info();
        let invalid = |field, reason: String| Err(MirrorError::Invalid { field, reason });
        if si.name == ti.name {
            return invalid("target", format!("'{}' is the source itself", ti.name));
        }
        if !source.accounting() {
            return Err(MirrorError::AccountingOff(si.name.clone()));
        }
        let len = si.size_bytes();
        if ti.size_bytes() < len {
            let t = ti.size_bytes();
            return invalid("target", format!("'{}' has {t} bytes, fewer than the source's {len}", ti.name));
        }
        if target.read_only() || !ti.io_types.write {
            return invalid("target", format!("'{}' does not accept writes", ti.name));
        }
        if ti.block_size > si.block_size {
            return invalid(
                "target",
                format!(
                    "'{}' has {}-byte blocks, larger than the source's {}: source writes would not fit it",
                    ti.name, ti.block_size, si.block_size
                ),
            );
        }
        let granularity = granularity_for(len, si.block_size, options.granularity)
            .map_err(|reason| MirrorError::Invalid { field: "granularity", reason })?;
        let shared = Arc::new(MirrorShared {
            job_id: options.job_id,
            source_name: si.name.clone(),
            target_name: ti.name.clone(),
            source: source.clone(),
            target,
            len,
            map: DirtyMap::new(len, granularity),
            phase: AtomicU8::new(ATTACHING),
            ending: AtomicU8::new(MirrorState::Failed as u8),
            complete_asked: AtomicBool::new(false),
            cancel_asked: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            copied: AtomicU64::new(0),
            copies_in_flight: AtomicU64::new(0),
            dual_in_flight: AtomicI64::new(0),
            source_only: AtomicI64::new(0),
            speed: AtomicU64::new(options.speed),
        });
        let epoch = source.attach_mirror(&shared)?;
        log::info!(
            "mirror job '{}': '{}' to '{}', {len} bytes in chunks of {granularity}",
            shared.job_id,
            shared.source_name,
            shared.target_name
        );
        Ok((MirrorJob(shared.clone()), MirrorStart::new(shared, epoch)))
    }

    /// The job's name.
    pub fn job_id(&self) -> &str {
        &self.0.job_id
    }

    /// The source bdev's name.
    pub fn source(&self) -> &str {
        &self.0.source_name
    }

    /// The target bdev's name.
    pub fn target(&self) -> &str {
        &self.0.target_name
    }

    /// Its state now.
    pub fn state(&self) -> MirrorState {
        self.0.state()
    }

    /// What `bdev_mirror_get_jobs` reports.
    pub fn status(&self) -> MirrorStatus {
        let s = &self.0;
        let g = s.map.granularity();
        let dirty = (s.map.dirty_chunks() * g).min(s.len);
        let duals = s.dual_in_flight.load(Ordering::SeqCst).max(0) as u64;
        MirrorStatus {
            job_id: s.job_id.clone(),
            source: s.source_name.clone(),
            target: s.target_name.clone(),
            state: s.state(),
            len: s.len,
            copied: s.copied.load(Ordering::Relaxed),
            dirty_bytes: dirty,
            in_flight: s.copies_in_flight.load(Ordering::Relaxed) + duals,
            granularity: g,
            speed: s.speed.load(Ordering::Relaxed),
            error: s.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// Changes the copy's speed limit (bytes per second, 0: none; QEMU's
    /// `block-job-set-speed`), from the copier's next round.
    pub fn set_speed(&self, speed: u64) {
        self.0.speed.store(speed, Ordering::Relaxed);
    }

    /// Asks a `ready` job to complete: once nothing is dirty and no write is in flight on the
    /// source alone, it detaches and ends `completed`. Refused before `ready` (as QEMU's
    /// `block-job-complete`) and after the end.
    pub fn complete(&self) -> Result<(), MirrorError> {
        let state = self.state();
        if state != MirrorState::Ready {
            let reason = match state {
                MirrorState::Running => "it can be completed once ready (the target has caught up)",
                _ => "it is over",
            };
            return Err(self.wrong_state(state, reason));
        }
        self.0.complete_asked.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Cancels the job at any point before its end: it detaches, the target keeps what was
    /// copied. Refused once over.
    pub fn cancel(&self) -> Result<(), MirrorError> {
        let state = self.state();
        if state.is_final() {
            return Err(self.wrong_state(state, "it is over"));
        }
        self.0.cancel_asked.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn wrong_state(&self, state: MirrorState, reason: &str) -> MirrorError {
        MirrorError::WrongState { job: self.0.job_id.clone(), state: state.name(), reason: reason.into() }
    }

    /// Waits until the job is over or `timeout` passes; returns the state then.
    pub fn wait(&self, timeout: Duration) -> MirrorState {
        let until = Instant::now() + timeout;
        loop {
            let s = self.state();
            if s.is_final() || Instant::now() >= until {
                return s;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until the job is `ready` (or over) or `timeout` passes; returns the state then.
    pub fn wait_ready(&self, timeout: Duration) -> MirrorState {
        let until = Instant::now() + timeout;
        loop {
            let s = self.state();
            if s != MirrorState::Running || Instant::now() >= until {
                return s;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
