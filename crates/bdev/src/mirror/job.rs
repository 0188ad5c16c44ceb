//! The control plane's handle on a job ([`MirrorJob`]): starting it, what it reports, asking it
//! to complete or cancel.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bitmap::{granularity_for, DirtyMap};
use super::copier::MirrorStart;
use super::shared::{CopyMode, MirrorShared, MirrorState, ATTACHING};
use super::MirrorError;
use crate::copy_share::CopyShare;
use crate::{Bdev, BlockDevice, Disk};

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
    /// The copy's share (percent) of the requests in flight while the guest has some.
    pub weight: u8,
    /// When guest writes go to the target as well.
    pub copy_mode: CopyMode,
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
    /// The copy's share of the source beside guest I/O (`copy_share`): guest first by default,
    /// its whole window while the source has no guest request in flight.
    pub share: CopyShare,
    /// When guest writes start going to the target as well.
    pub copy_mode: CopyMode,
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
            share: options.share,
            copy_mode: options.copy_mode,
        });
        let epoch = source.attach_mirror(&shared)?;
        log::info!(
            "mirror job '{}': '{}' to '{}', {len} bytes in chunks of {granularity}, {}",
            shared.job_id,
            shared.source_name,
            shared.target_name,
            shared.copy_mode.name()
        );
        Ok((MirrorJob(shared.clone()), MirrorStart::new(shared, source.clone(), epoch)))
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
            weight: s.share.weight(),
            copy_mode: s.copy_mode,
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
