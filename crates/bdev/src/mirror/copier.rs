//! The copier: one per job, polled on one reactor. It copies dirty chunks from the source
//! device (under the disk layer, so its reads are neither counted nor marked) to the target,
//! a few runs at a time through buffers made once, and moves the job through its phases:
//! waiting for channels to attach, copying, switching them to blocking writes, ready,
//! detaching (docs/mirror.md).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::{
    CopyMode, MirrorShared, MirrorState, ATTACHING, COPYING, DETACHING, DONE, READY, SWITCHING,
};
use crate::copy_share::{CopyBudget, GuestBytes};
use crate::disk::GuestLoad;
use crate::iov::BounceBuf;
use crate::{Disk, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

/// Copy buffers per job.
const BUFFERS: usize = 16;

/// Bytes per buffer (a run of chunks copied by one read and one write), unless a chunk is
/// larger.
const BUFFER_BYTES: u64 = 1 << 20;

/// Busy chunks skipped per poll before the copier gives the writers a round.
const SKIPS_PER_POLL: u32 = 64;

/// How often idle reactors are woken while the copier waits for their channels.
const WAKE_EVERY: Duration = Duration::from_millis(2);

/// What a copier's poll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopierPoll {
    /// It moved something.
    Busy,
    /// Nothing to do this round.
    Idle,
    /// The job is over: drop the copier.
    Finished,
}

/// A job's copier before it is opened: `Send`, so the control plane can hand it to the reactor
/// that will poll it.
pub struct MirrorStart {
    job: Arc<MirrorShared>,
    /// The disk copied from: the copier reads its device and moves the disk's channels through
    /// the job's phases (the job's shared state, which the disk holds, does not hold it back).
    source: Disk,
    epoch: u64,
}

impl MirrorStart {
    pub(crate) fn new(job: Arc<MirrorShared>, source: Disk, epoch: u64) -> MirrorStart {
        MirrorStart { job, source, epoch }
    }

    /// Opens the copier's channels on the calling thread (its reactor). `waker` wakes the
    /// reactors serving the source, so that idle channels notice the job. A channel that
    /// cannot open fails the job, which then detaches at the first poll.
    pub fn open(self, waker: Option<Box<dyn Fn()>>) -> MirrorCopier {
        let MirrorStart { job, source, epoch } = self;
        let src = source.bdev().open_channel();
        let tgt = job.target.open_channel();
        let (src, tgt) = match (src, tgt) {
            (Ok(s), Ok(t)) => (Some(s), Some(t)),
            (Err(e), _) => {
                job.fail(format!("cannot open a channel of source '{}': {e}", job.source_name));
                (None, None)
            }
            (_, Err(e)) => {
                job.fail(format!("cannot open a channel of target '{}': {e}", job.target_name));
                (None, None)
            }
        };
        let buf_len = BUFFER_BYTES.max(job.map.granularity());
        let slots = (0..BUFFERS)
            .map(|_| CopySlot {
                buf: BounceBuf::zeroed(buf_len as usize),
                first: 0,
                chunks: 0,
                offset: 0,
                len: 0,
            })
            .collect();
        MirrorCopier {
            load: source.guest_load(),
            guest: GuestBytes::default(),
            share: CopyBudget::default(),
            job,
            source,
            src,
            tgt,
            slots,
            free: (0..BUFFERS as u32).rev().collect(),
            retry: Vec::with_capacity(BUFFERS),
            done: Vec::with_capacity(BUFFERS),
            cursor: 0,
            in_flight: 0,
            wait_epoch: Some(epoch),
            last_wake: Instant::now(),
            waker,
            allowance: BUFFER_BYTES,
            refilled: Instant::now(),
        }
    }
}

struct CopySlot {
    buf: BounceBuf,
    first: u64,
    chunks: u64,
    offset: u64,
    len: u64,
}

/// A job's copier, polled by its reactor until it reports [`CopierPoll::Finished`].
pub struct MirrorCopier {
    pub(super) job: Arc<MirrorShared>,
    /// The disk copied from, whose channels the copier moves through the job's phases.
    source: Disk,
    // The channels come before the buffers: dropped first, they wait for what is in flight
    // (io_uring's does) while the buffers it reads and writes still exist.
    src: Option<Box<dyn IoChannel>>,
    tgt: Option<Box<dyn IoChannel>>,
    slots: Vec<CopySlot>,
    free: Vec<u32>,
    /// Slots read whose write the target refused as busy.
    retry: Vec<u32>,
    /// Completions reaped this round (made once).
    done: Vec<(u32, IoStatus)>,
    cursor: u64,
    pub(super) in_flight: usize,
    /// The disk epoch every channel must acknowledge before the next step.
    wait_epoch: Option<u64>,
    last_wake: Instant,
    waker: Option<Box<dyn Fn()>>,
    /// The guest I/O in flight on the source, which the copier yields to (the job's share).
    load: GuestLoad,
    /// The guest's bytes this round (`load`), and the copy's credit beside them.
    guest: GuestBytes,
    share: CopyBudget,
    /// Bytes the speed limit lets the copier start, and when that was last topped up.
    allowance: u64,
    refilled: Instant,
}

impl MirrorCopier {
    /// Whether the reactor should keep polling without sleeping: until the job is over.
    pub fn has_pending(&self) -> bool {
        self.job.phase.load(Ordering::SeqCst) != DONE
    }

    /// The longest copy in flight, in bytes.
    #[cfg(test)]
    pub(super) fn longest_in_flight(&self) -> u64 {
        let free = |i: usize| self.free.contains(&(i as u32));
        (0..self.slots.len()).filter(|&i| !free(i)).map(|i| self.slots[i].len).max().unwrap_or(0)
    }

    /// One round: reap copies, move the job on, start copies.
    pub fn poll(&mut self) -> CopierPoll {
        // Every round, so that what the guest completed is counted per round.
        self.guest = self.load.bytes();
        let mut busy = self.reap();
        let job = self.job.clone();
        let phase = job.phase.load(Ordering::SeqCst);
        if phase < DETACHING {
            if job.failed() {
                self.detach(MirrorState::Failed);
                return CopierPoll::Busy;
            }
            if job.cancel_asked.load(Ordering::SeqCst) {
                self.detach(MirrorState::Cancelled);
                return CopierPoll::Busy;
            }
        }
        match phase {
            ATTACHING => {
                if self.acked() {
                    if job.copy_mode == CopyMode::WriteBlocking {
                        // Every channel marks what it completes: now each writes both disks.
                        job.phase.store(SWITCHING, Ordering::SeqCst);
                        self.wait_epoch = Some(self.source.bump_mirror());
                    } else {
                        job.phase.store(COPYING, Ordering::SeqCst);
                    }
                    busy = true;
                }
            }
            COPYING => {
                busy |= self.start_copies();
                if self.in_flight == 0 && job.map.dirty_chunks() == 0 {
                    // Converged once: channels start writing both disks.
                    job.phase.store(SWITCHING, Ordering::SeqCst);
                    self.wait_epoch = Some(self.source.bump_mirror());
                    busy = true;
                }
            }
            SWITCHING => {
                busy |= self.start_copies();
                // Writing blocking from the start, ready once the copy has converged under the
                // blocking writes: nothing dirty, no copy in flight, and no write left from
                // before the switch (each marks when it completes).
                let converged = job.copy_mode == CopyMode::Background
                    || (self.in_flight == 0
                        && job.map.dirty_chunks() == 0
                        && job.source_only.load(Ordering::SeqCst) <= 0);
                if self.acked() && converged {
                    job.phase.store(READY, Ordering::SeqCst);
                    log::info!("mirror job '{}': ready", job.job_id);
                    busy = true;
                }
            }
            READY => {
                busy |= self.start_copies();
                // Order: writes on the source alone, and blocking writes (which mark when a
                // copy ran under them or the source failed them), mark before they stop
                // counting, so with none counted, the bitmap read after holds all they did.
                if job.complete_asked.load(Ordering::SeqCst)
                    && job.source_only.load(Ordering::SeqCst) <= 0
                    && job.dual_in_flight.load(Ordering::SeqCst) <= 0
                    && self.in_flight == 0
                    && job.map.dirty_chunks() == 0
                {
                    self.detach(MirrorState::Completed);
                    busy = true;
                }
            }
            DETACHING => {
                if self.in_flight == 0 && self.acked() {
                    self.src = None;
                    self.tgt = None;
                    job.phase.store(DONE, Ordering::SeqCst);
                    log::info!("mirror job '{}': {}", job.job_id, job.state().name());
                    return CopierPoll::Finished;
                }
            }
            _ => return CopierPoll::Finished,
        }
        if busy {
            CopierPoll::Busy
        } else {
            CopierPoll::Idle
        }
    }

    /// Detaches from the source; the job ends `ending` once channels let go of it.
    fn detach(&mut self, ending: MirrorState) {
        self.job.set_ending(ending);
        self.job.phase.store(DETACHING, Ordering::SeqCst);
        self.retry_release();
        self.wait_epoch = Some(self.source.detach_mirror(&self.job));
    }

    /// Gives back the slots read and never written (detaching: they will not be).
    fn retry_release(&mut self) {
        while let Some(s) = self.retry.pop() {
            self.end_slot(s);
        }
    }

    /// Whether every channel of the source acknowledged the epoch waited for; wakes idle
    /// reactors now and then meanwhile.
    fn acked(&mut self) -> bool {
        let Some(epoch) = self.wait_epoch else { return true };
        if self.source.mirror_acked(epoch) {
            self.wait_epoch = None;
            return true;
        }
        if self.last_wake.elapsed() >= WAKE_EVERY {
            self.last_wake = Instant::now();
            if let Some(w) = &self.waker {
                w();
            }
        }
        false
    }

    /// Bytes the job's speed limit lets the copier start now: what the elapsed time earned,
    /// saved up to a tenth of a second's worth (or one buffer), so the limit holds over any
    /// tenth of a second rather than on average over the job. `u64::MAX` without a limit.
    fn budget(&mut self) -> u64 {
        let speed = self.job.speed.load(Ordering::Relaxed);
        if speed == 0 {
            return u64::MAX;
        }
        let now = Instant::now();
        let earned = u128::from(speed) * now.duration_since(self.refilled).as_nanos() / 1_000_000_000;
        self.refilled = now;
        // At least one chunk, however slow the limit, or the copier would never start one.
        let cap = (speed / 10).max(BUFFER_BYTES).max(self.job.map.granularity());
        self.allowance = (u128::from(self.allowance) + earned).min(u128::from(cap)) as u64;
        self.allowance
    }

    /// Starts copies of dirty chunks while buffers are free and the speed limit allows.
    fn start_copies(&mut self) -> bool {
        if self.src.is_none() || self.tgt.is_none() {
            return false;
        }
        let mut budget = self.budget();
        let limited = budget != u64::MAX;
        let mut started = false;
        let mut skips = 0;
        let map = &self.job.map;
        let gran = map.granularity();
        // Beside guest I/O the copier starts its share of the guest's bytes this round, in runs
        // of one chunk.
        let mut credit = self.share.round(self.job.share, self.guest, gran);
        // Runs of a buffer only beside a guest idle for long (`LONG_QUIET_ROUNDS`).
        let run_bytes = if credit.is_some() || !self.share.long_requests(self.job.share) {
            gran
        } else {
            self.slots[0].buf.len() as u64
        };
        while let Some(&slot) = self.free.last() {
            if budget < gran || credit.is_some_and(|c| c < gran) {
                break;
            }
            let Some(c) = map.next_dirty(self.cursor) else { break };
            if !map.try_begin_copy(c) {
                // A blocking write or a copy is on it: later.
                self.cursor = c + 1;
                skips += 1;
                if skips >= SKIPS_PER_POLL {
                    break;
                }
                continue;
            }
            // Clear before reading: a write completing from here on marks it again.
            map.clear(c);
            let cap = (run_bytes / gran).min(budget / gran).max(1);
            let mut n = 1;
            while n < cap && c + n < map.chunks() && map.is_dirty(c + n) && map.try_begin_copy(c + n) {
                map.clear(c + n);
                n += 1;
            }
            let (offset, _) = map.chunk_bytes(c);
            let (last_off, last_len) = map.chunk_bytes(c + n - 1);
            let len = last_off + last_len - offset;
            let s = &mut self.slots[slot as usize];
            s.first = c;
            s.chunks = n;
            s.offset = offset;
            s.len = len;
            let req = IoRequest { tag: slot, op: IoOp::Read, offset, len, iov: s.buf.iovecs(len as usize) };
            let src = self.src.as_mut().expect("checked above");
            match src.submit(&req) {
                Ok(()) => {
                    self.free.pop();
                    self.in_flight += 1;
                    self.job.copies_in_flight.fetch_add(1, Ordering::Relaxed);
                    self.cursor = c + n;
                    budget -= len;
                    if let Some(c) = credit.as_mut() {
                        *c -= len;
                        self.share.spend(len);
                    }
                    started = true;
                }
                Err(e) => {
                    for k in c..c + n {
                        map.mark(map.chunk_bytes(k).0, 1);
                        map.end_copy(k);
                    }
                    if e != SubmitError::Busy {
                        self.job
                            .fail(format!("cannot read source '{}' at {offset}: {e}", self.job.source_name));
                    }
                    break;
                }
            }
        }
        if limited {
            self.allowance = budget;
        }
        started
    }

    /// Reaps reads (then writes them to the target) and writes (then frees their slot).
    fn reap(&mut self) -> bool {
        let mut busy = false;
        if let Some(src) = self.src.as_mut() {
            let done = &mut self.done;
            src.poll(&mut |tag, status| done.push((tag, status)));
            while let Some((slot, status)) = self.done.pop() {
                busy = true;
                match status {
                    IoStatus::Success => self.write_slot(slot),
                    IoStatus::Error(errno) => {
                        let off = self.slots[slot as usize].offset;
                        self.job.fail(format!(
                            "read of source '{}' at {off} failed: {}",
                            self.job.source_name,
                            std::io::Error::from_raw_os_error(errno)
                        ));
                        self.end_slot(slot);
                    }
                    IoStatus::Unsupported => {
                        self.job.fail(format!("source '{}' refused a read", self.job.source_name));
                        self.end_slot(slot);
                    }
                }
            }
        }
        // Writes the target refused as busy, until it refuses one again.
        while let Some(slot) = self.retry.pop() {
            let before = self.retry.len();
            self.write_slot(slot);
            if self.retry.len() > before {
                break;
            }
        }
        if let Some(tgt) = self.tgt.as_mut() {
            let done = &mut self.done;
            tgt.poll(&mut |tag, status| done.push((tag, status)));
            while let Some((slot, status)) = self.done.pop() {
                busy = true;
                let (offset, len) = (self.slots[slot as usize].offset, self.slots[slot as usize].len);
                match status {
                    IoStatus::Success => {
                        self.job.copied.fetch_add(len, Ordering::Relaxed);
                    }
                    IoStatus::Error(errno) => self.job.fail(format!(
                        "write to target '{}' at {offset} failed: {}",
                        self.job.target_name,
                        std::io::Error::from_raw_os_error(errno)
                    )),
                    IoStatus::Unsupported => {
                        self.job.fail(format!("target '{}' refused a write", self.job.target_name))
                    }
                }
                self.end_slot(slot);
            }
        }
        busy
    }

    /// Writes a slot read from the source to the target.
    fn write_slot(&mut self, slot: u32) {
        if self.job.phase.load(Ordering::SeqCst) >= DETACHING || self.job.failed() {
            self.end_slot(slot);
            return;
        }
        let s = &mut self.slots[slot as usize];
        let offset = s.offset;
        let req =
            IoRequest { tag: slot, op: IoOp::Write, offset, len: s.len, iov: s.buf.iovecs(s.len as usize) };
        let tgt = self.tgt.as_mut().expect("a read completed, so both channels are open");
        match tgt.submit(&req) {
            Ok(()) => {}
            Err(SubmitError::Busy) => self.retry.push(slot),
            Err(e) => {
                self.job.fail(format!("cannot write target '{}' at {offset}: {e}", self.job.target_name));
                self.end_slot(slot);
            }
        }
    }

    /// A copy is over (done or given up): its chunks may be copied or written again.
    fn end_slot(&mut self, slot: u32) {
        let s = &self.slots[slot as usize];
        for c in s.first..s.first + s.chunks {
            self.job.map.end_copy(c);
        }
        self.free.push(slot);
        self.in_flight -= 1;
        self.job.copies_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
