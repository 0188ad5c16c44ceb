//! What a live restore's channels and its worker share: the chunk states, the queue of chunks
//! the channels ask for, the worker's thread to wake, the phase and the last error.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use crossbeam_queue::SegQueue;

use super::chunks::ChunkStates;

/// The copier's limits.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Bytes per second, 0 for none.
    pub speed: u64,
    /// Copier fetches in flight at most.
    pub parallel: usize,
    /// Chunks asked for after one a request needs.
    pub read_ahead: u64,
}

/// The longest a request waits for its chunks (a fetch is bounded by fp-backup's request
/// timeouts and retries; this bounds the wait whatever happens): then it fails with ETIMEDOUT.
pub const PARK_BOUND: Duration = Duration::from_secs(180);

/// The restore's phase, as `driver_specific.backup_restore.state` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The copier runs.
    Copying = 0,
    /// Every chunk is on the base: the bdev is a pass-through.
    Complete = 1,
    /// The copier gave up (chunks failed after its retries); the restored chunks still serve.
    Failed = 2,
}

impl Phase {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Copying => "copying",
            Phase::Complete => "complete",
            Phase::Failed => "failed",
        }
    }
}

/// What the channels and the worker share.
pub(crate) struct Shared {
    pub(crate) chunks: ChunkStates,
    /// Chunks the channels want, moved to FETCHING by them.
    pub(crate) demand: SegQueue<u64>,
    pub(crate) worker: OnceLock<Thread>,
    pub(crate) complete: AtomicBool,
    pub(crate) phase: AtomicU8,
    pub(crate) stop: AtomicBool,
    /// The last error (control plane reads it; the worker writes it).
    pub(crate) error: Mutex<Option<String>>,
    pub(crate) read_ahead: u64,
}

impl Shared {
    pub(crate) fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Asks the worker for chunk `i` (already FETCHING), and the `read_ahead` after it that are
    /// absent.
    pub(crate) fn ask(&self, i: u64) {
        self.demand.push(i);
        for next in (i + 1)..(i + 1 + self.read_ahead).min(self.chunks.count()) {
            if self.chunks.claim_fetch(next) {
                self.demand.push(next);
            }
        }
    }

    pub(crate) fn wake_worker(&self) {
        if let Some(t) = self.worker.get() {
            t.unpark();
        }
    }

    pub(crate) fn set_error(&self, e: String) {
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    pub(crate) fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            1 => Phase::Complete,
            2 => Phase::Failed,
            _ => Phase::Copying,
        }
    }
}
