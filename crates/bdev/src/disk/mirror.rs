//! The disk layer's side of a mirror job (`crate::mirror`): where QEMU inserts a filter node
//! above the source, flashpath's channels do the job's part themselves.
//!
//! * Attach, switch and detach bump the disk's mirror epoch under the book's lock; each
//!   channel looks at the epoch once per poll and, when it moved, picks the change up here
//!   (cold) and acknowledges the epoch in its slot. The copier waits for every live channel's
//!   acknowledgement before each next step, so "every channel marks" and "every channel writes
//!   both disks" are facts when it acts on them, idle channels included (the registry wakes
//!   their reactors).
//! * Attached: every write, discard and write-zeroes that completes marks its chunks before
//!   its completion goes up, and those submitted while attached count in the job's
//!   `source_only` until then (with whatever the channel had in flight when it attached).
//! * Blocking (the job is ready): writes and flushes go to the source and the target with the
//!   same tag and complete upward when both are done, with the source's status. A write holds
//!   its chunks' writer counts meanwhile, so no copy starts under it; one that found a copy
//!   running, or that the source failed, marks its chunks at the end (the copier then brings
//!   the source's content over the target's half). A target failure fails the job, never the
//!   request.
//! * Detached: the channel stops mirroring new requests, keeps the target channel until its
//!   mirrored requests are done, then drops it and acknowledges.
//!
//! With no job attached this file costs the layer one relaxed load per poll and one branch per
//! submit and per poll.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::bitmaps::mark_all;
use super::channel_state::{
    account, take_sparse, ChannelMirror, Completion, DiskChannel, InFlight, DENSE_TAGS,
};
use super::histogram::ChannelHistogram;
use super::shared::Disk;
use crate::mirror::{MirrorError, MirrorShared};
use crate::{BlockDevice, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

/// `InFlight::mflags`: sent to both disks.
const DUAL: u8 = 1;
/// The source's half is done (its status in `ChannelMirror::src_status`).
const SRC_DONE: u8 = 2;
/// The target's half is done.
const TGT_DONE: u8 = 4;
/// A copy was running on its chunks when it was submitted: mark them at the end.
const SAW_COPY: u8 = 8;

/// Whether the operation (an `op_index`) changes data: write, discard, write-zeroes.
fn changes_data(op: u8) -> bool {
    matches!(op, 1 | 3 | 4)
}

fn encode(status: IoStatus) -> i32 {
    match status {
        IoStatus::Success => 0,
        IoStatus::Error(errno) => errno.max(1),
        IoStatus::Unsupported => -1,
    }
}

fn decode(status: i32) -> IoStatus {
    match status {
        0 => IoStatus::Success,
        -1 => IoStatus::Unsupported,
        errno => IoStatus::Error(errno),
    }
}

impl ChannelMirror {
    /// Requests the caller still waits for beyond the source's own.
    pub(super) fn waiting(&self) -> usize {
        self.waiting as usize
    }

    /// Gives back what this channel counted (it is closing).
    pub(super) fn release(&self) {
        self.job.source_only.fetch_sub(self.counted, Ordering::SeqCst);
        self.job.dual_in_flight.fetch_sub(self.duals as i64, Ordering::SeqCst);
    }

    /// Counts one request on the source alone.
    fn count(&mut self, n: i64) {
        self.counted += n;
        self.job.source_only.fetch_add(n, Ordering::SeqCst);
    }
}

impl Disk {
    /// Attaches `job`; returns the epoch channels must acknowledge.
    pub(crate) fn attach_mirror(&self, job: &Arc<MirrorShared>) -> Result<u64, MirrorError> {
        let mut book = self.book();
        if !self.0.accounting {
            return Err(MirrorError::AccountingOff(self.info().name.clone()));
        }
        if let Some(f) = &book.fleece {
            return Err(MirrorError::Invalid {
                field: "source",
                reason: format!("'{}' has a fleece, '{}': delete it first", self.info().name, f.name),
            });
        }
        if let Some(other) = &book.mirror {
            return Err(MirrorError::SourceBusy {
                bdev: self.info().name.clone(),
                job: other.job_id.clone(),
            });
        }
        book.mirror = Some(job.clone());
        Ok(self.0.mirror_epoch.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Tells channels the attached job changed phase; returns the epoch to acknowledge.
    pub(crate) fn bump_mirror(&self) -> u64 {
        let _book = self.book();
        self.0.mirror_epoch.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Detaches `job` (if it is the one attached); returns the epoch to acknowledge.
    pub(crate) fn detach_mirror(&self, job: &Arc<MirrorShared>) -> u64 {
        let mut book = self.book();
        if book.mirror.as_ref().is_some_and(|m| Arc::ptr_eq(m, job)) {
            book.mirror = None;
        }
        self.0.mirror_epoch.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether every live channel has applied mirror epoch `epoch`.
    pub(crate) fn mirror_acked(&self, epoch: u64) -> bool {
        self.book().live.iter().all(|s| s.mirror_ack.load(Ordering::Acquire) >= epoch)
    }

    /// The name of the mirror job attached to this disk, if any.
    pub fn mirror_job(&self) -> Option<String> {
        self.book().mirror.as_ref().map(|m| m.job_id.clone())
    }
}

/// The entry of `tag`, dense or sparse.
pub(super) fn entry_mut<'a>(
    slab: &'a mut [InFlight],
    sparse: &'a mut [(u32, InFlight)],
    tag: u32,
) -> Option<&'a mut InFlight> {
    match slab.get_mut(tag as usize) {
        Some(e) => Some(e),
        None => sparse.iter_mut().find(|s| s.0 == tag).map(|s| &mut s.1),
    }
}

/// Submits `req` with a job attached: to both disks when blocking, else to the source with its
/// chunks to mark at completion.
///
pub(super) fn submit_down(
    inner: &mut dyn IoChannel,
    m: &mut ChannelMirror,
    slab: &mut [InFlight],
    sparse: &mut [(u32, InFlight)],
    req: &IoRequest,
) -> Result<(), SubmitError> {
    let Some(e) = entry_mut(slab, sparse, req.tag) else {
        return inner.submit(req);
    };
    e.mflags = 0;
    if m.draining {
        e.gen = 0;
        return inner.submit(req);
    }
    e.gen = m.gen;
    let writes = changes_data(e.op);
    let dual = m.target.is_some()
        && req.tag < DENSE_TAGS
        && matches!(req.op, IoOp::Write | IoOp::Flush)
        && !m.job.stopping();
    if dual {
        let chunks = match req.op {
            IoOp::Write => m.job.map.chunk_range(req.offset, req.len),
            _ => 0..0,
        };
        let saw_copy = m.job.map.writer_enter(chunks.clone());
        if let Err(err) = inner.submit(req) {
            m.job.map.writer_leave(chunks);
            return Err(err);
        }
        let target = m.target.as_mut().expect("checked above");
        match target.submit(req) {
            Ok(()) => {
                e.mflags = DUAL | if saw_copy { SAW_COPY } else { 0 };
                if m.src_status.len() <= req.tag as usize {
                    // Grows to the largest tag once, like the slab.
                    m.src_status.resize(req.tag as usize + 1, 0);
                }
                m.duals += 1;
                m.job.dual_in_flight.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            Err(_) => {
                // The target cannot take it now (busy, a block size it refuses): the source
                // has it, so it becomes a write the copier carries over.
                m.job.map.writer_leave(chunks);
                if writes {
                    m.count(1);
                }
                return Ok(());
            }
        }
    }
    // Counted before the source has it: the copier never sees none counted while it is out.
    if writes {
        m.count(1);
    }
    let r = inner.submit(req);
    if r.is_err() && writes {
        m.count(-1);
    }
    r
}

impl DiskChannel {
    /// Submits with a job attached (see [`submit_down`]).
    #[cold]
    #[inline(never)]
    pub(super) fn submit_mirrored(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        let Self { inner, mirror, slab, sparse, .. } = self;
        let m = mirror.as_mut().expect("called with a mirror attached");
        submit_down(&mut **inner, m, slab, sparse, req)
    }

    /// Applies the disk's mirror change: attach, open the target, let go.
    #[cold]
    #[inline(never)]
    pub(super) fn refresh_mirror(&mut self) {
        let (epoch, want, fleece) = {
            let book = self.disk.book();
            (self.disk.mirror_epoch.load(Ordering::SeqCst), book.mirror.clone(), book.fleece.clone())
        };
        let fleece_settled = self.refresh_fleece(fleece);
        if let Some(m) = self.mirror.as_mut() {
            if !want.as_ref().is_some_and(|w| Arc::ptr_eq(w, &m.job)) {
                m.draining = true;
                if m.duals > 0 {
                    // Looked at again at the next poll; no acknowledgement until let go.
                    return;
                }
                if let Some(m) = self.mirror.take() {
                    m.release();
                }
            }
        }
        if self.mirror.is_none() {
            if let Some(job) = want {
                self.next_gen = self.next_gen.wrapping_add(1).max(1);
                let mut m = Box::new(ChannelMirror {
                    job,
                    gen: self.next_gen,
                    target: None,
                    draining: false,
                    counted: 0,
                    duals: 0,
                    waiting: 0,
                    src_status: Vec::new(),
                });
                // What is in flight now was submitted unwatched: it marks when it completes.
                m.count(self.in_flight as i64);
                self.mirror = Some(m);
            }
        }
        if let Some(m) = self.mirror.as_mut() {
            if !m.draining && m.target.is_none() && m.job.wants_dual() {
                match m.job.target.open_channel() {
                    Ok(ch) => m.target = Some(ch),
                    Err(e) => {
                        m.job.fail(format!("cannot open a channel of target '{}': {e}", m.job.target_name))
                    }
                }
            }
        }
        self.hooked = self.mirror.is_some() || self.fleece.is_some();
        self.mirror_epoch = epoch;
        if fleece_settled {
            self.slot.mirror_ack.store(epoch, Ordering::Release);
        }
    }

    /// [`reap`](super::reap) with a job attached: marks what completes on the source alone,
    /// joins the halves of mirrored requests. Returns the source's completions and those
    /// handed to `done`.
    #[cold]
    #[inline(never)]
    pub(super) fn reap_mirrored(&mut self, done: &mut impl Completion, histogram_on: bool) -> (usize, usize) {
        let Self { inner, slot, slab, sparse, mirror, bitmaps, .. } = self;
        let slot = &**slot;
        let bitmaps = bitmaps.as_deref();
        // Before the completion goes up, as on the plain path (`channel.rs`).
        let mark = |e: &InFlight| {
            if let Some(set) = bitmaps {
                mark_all(set, e.op, e.offset, e.len);
            }
        };
        let m = mirror.as_mut().expect("called with a mirror attached");
        let h = histogram_on.then(|| slot.hist.get_or_init(ChannelHistogram::new));
        let record = |ticks| {
            if let Some(h) = h {
                h.record(ticks)
            }
        };
        let mut now = 0;
        let mut upward = 0;
        let reaped = inner.poll(&mut |tag, status| {
            let mut taken;
            let e = match slab.get_mut(tag as usize) {
                Some(e) => e,
                None => match take_sparse(sparse, tag) {
                    Some(e) => {
                        taken = e;
                        &mut taken
                    }
                    None => {
                        upward += 1;
                        return done.complete_uncounted(tag, status);
                    }
                },
            };
            if e.mflags & DUAL != 0 {
                if e.mflags & TGT_DONE == 0 {
                    e.mflags |= SRC_DONE;
                    m.src_status[tag as usize] = encode(status);
                    m.waiting += 1;
                    return;
                }
                finish_dual(m, e, status);
            } else if !m.draining {
                let writes = changes_data(e.op);
                if writes {
                    // Before the completion goes up: whoever learns of the write finds it marked.
                    m.job.map.mark(e.offset, e.len);
                }
                if writes || e.gen != m.gen {
                    m.count(-1);
                }
            }
            mark(e);
            account(slot, e, status, &mut now, &record);
            upward += 1;
            done.complete(tag, status);
        });
        if let Some(target) = m.target.as_mut() {
            let job = &m.job;
            let (mut duals, mut waiting, src_status) = (m.duals, m.waiting, &m.src_status);
            target.poll(&mut |tag, status| {
                let Some(e) = slab.get_mut(tag as usize) else { return };
                if e.mflags & DUAL == 0 || e.mflags & TGT_DONE != 0 {
                    return;
                }
                if status != IoStatus::Success {
                    job.fail(format!(
                        "{} to target '{}' at {} failed: {status:?}",
                        if e.op == 2 { "flush" } else { "write" },
                        job.target_name,
                        e.offset
                    ));
                }
                e.mflags |= TGT_DONE;
                if e.mflags & SRC_DONE != 0 {
                    waiting -= 1;
                    duals -= 1;
                    let status = decode(src_status[tag as usize]);
                    finish_dual_chunks(job, e, status);
                    mark(e);
                    account(slot, e, status, &mut now, &record);
                    upward += 1;
                    done.complete(tag, status);
                }
            });
            m.duals = duals;
            m.waiting = waiting;
        }
        (reaped, upward)
    }
}

/// Both halves of a mirrored request are done (the source's last, with `source`).
fn finish_dual(m: &mut ChannelMirror, e: &InFlight, source: IoStatus) {
    m.duals -= 1;
    finish_dual_chunks(&m.job, e, source);
}

/// Lets go of a mirrored write's chunks (the source's half ended with `source`), marking them
/// first if a copy ran under it, or if the source failed it: the target's half may have landed
/// where the source kept its old data (or part of the new), and the copier must bring the
/// source's content over again. Marked before the write stops counting in `dual_in_flight`:
/// a completion that sees none in flight finds every such mark.
fn finish_dual_chunks(job: &MirrorShared, e: &InFlight, source: IoStatus) {
    if e.op == 1 {
        if e.mflags & SAW_COPY != 0 || source != IoStatus::Success {
            job.map.mark(e.offset, e.len);
        }
        job.map.writer_leave(job.map.chunk_range(e.offset, e.len));
    }
    job.dual_in_flight.fetch_sub(1, Ordering::SeqCst);
}
