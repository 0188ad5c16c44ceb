//! A job's shared state ([`MirrorShared`]: the bitmap, the phase, the counters every channel
//! and the copier update) and its [`MirrorState`]. Below the copier and the job's handle,
//! which both work on it.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use super::bitmap::DirtyMap;
use crate::copy_share::CopyShare;
use crate::Bdev;

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

/// When guest writes start going to the target as well (QEMU's `copy-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyMode {
    /// Writes go to the source alone, marking their chunks, until the copy has converged once;
    /// then to both disks (`ready`). The guest's writes cost nothing extra while the job
    /// copies, but the copier must outpace what they dirty.
    #[default]
    Background,
    /// Writes go to both disks from the start: a write never dirties a chunk, so the dirty set
    /// only shrinks and the job converges at any copy pace, for a second write per guest
    /// write (QEMU's `write-blocking`).
    WriteBlocking,
}

impl CopyMode {
    /// The RPC's names, QEMU's.
    pub const NAMES: [&'static str; 2] = ["background", "write-blocking"];

    /// The name the RPC takes and reports.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The mode named `name`, if any.
    pub fn from_name(name: &str) -> Option<CopyMode> {
        [CopyMode::Background, CopyMode::WriteBlocking].into_iter().find(|m| m.name() == name)
    }
}

// The phases, in order. A job moves forward only.
/// Attached; waiting until every channel of the source marks what it completes.
pub(crate) const ATTACHING: u8 = 0;
/// Copying dirty chunks.
pub(crate) const COPYING: u8 = 1;
/// Converged once (or, writing blocking, from the start); channels are switching to writing
/// both disks, or (writing blocking) write both while the copier still copies.
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
    pub(crate) target: Bdev,
    pub(crate) len: u64,
    pub(crate) map: DirtyMap,
    pub(crate) phase: AtomicU8,
    /// The final state, set when detaching starts.
    pub(super) ending: AtomicU8,
    pub(crate) complete_asked: AtomicBool,
    pub(crate) cancel_asked: AtomicBool,
    pub(super) failed: AtomicBool,
    pub(super) error: Mutex<Option<String>>,
    pub(crate) copied: AtomicU64,
    pub(crate) copies_in_flight: AtomicU64,
    /// Blocking writes (and flushes) sent to both disks and not yet completed upward.
    pub(crate) dual_in_flight: AtomicI64,
    /// Writes in flight on the source alone while attached (and whatever each channel had in
    /// flight when it attached): each marks its chunks when it completes.
    pub(crate) source_only: AtomicI64,
    /// The copier's limit in bytes per second (0: none), changeable while the job runs.
    pub(crate) speed: AtomicU64,
    /// The copier's share of the source beside guest I/O.
    pub(crate) share: CopyShare,
    pub(crate) copy_mode: CopyMode,
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
