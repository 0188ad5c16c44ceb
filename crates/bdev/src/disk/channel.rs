//! A [`DiskChannel`]: the device's channel plus accounting, timing each request in a slab
//! indexed by the caller's tag and counting into its own slot (the module docs of `disk`), and
//! the [`Completion`] a frontend hands its polls.

use std::os::unix::io::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::bitmaps::{mark_each, DirtyBitmap};
use super::channel_state::{account, take_sparse, Completion, DiskChannel, InFlight, DENSE_TAGS, EMPTY};
use super::fleece;
use super::histogram::ChannelHistogram;
use super::mirror;
use super::qos::Admission;
use super::shared::ALL_EPOCH;
use super::stats::{errno_slot, op_index, ChannelSlot, Successes};
use crate::clock::ticks;
use crate::{IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

impl DiskChannel {
    /// Applies resets the control plane asked for since the last look.
    #[inline]
    pub(super) fn apply_resets(&mut self) {
        let epochs = self.disk.epochs.load(Ordering::Relaxed);
        if epochs != self.seen_epochs {
            self.apply_resets_slow(epochs);
        }
    }

    #[cold]
    pub(super) fn apply_resets_slow(&mut self, epochs: u64) {
        if epochs / ALL_EPOCH != self.seen_epochs / ALL_EPOCH {
            for (op, cleared) in self.cleared.iter_mut().enumerate() {
                *cleared = *cleared + self.slot.successes(op);
            }
            self.slot.clear();
        } else {
            self.slot.clear_maxmin();
        }
        self.seen_epochs = epochs;
        // Release: a reader that sees the new epoch sees the cleared counters.
        self.slot.seen_epochs.store(epochs, Ordering::Release);
    }

    /// Records the entry of a tag beyond the slab: grows the slab up to [`DENSE_TAGS`], or
    /// keeps the entry in `sparse`.
    #[cold]
    pub(super) fn record_beyond(&mut self, tag: u32, e: InFlight) {
        if tag < DENSE_TAGS {
            let want = (tag as usize + 1).max(self.slab.len() * 2).min(DENSE_TAGS as usize);
            self.slab.resize(want, EMPTY);
            self.slab[tag as usize] = e;
        } else if let Some(s) = self.sparse.iter_mut().find(|s| s.0 == tag) {
            s.1 = e;
        } else {
            self.sparse.push((tag, e));
        }
    }

    /// A request the device refused: nothing of it stays in flight; all but Busy count as
    /// errors. (A dense entry needs no undoing: it is only read for a tag the device returns.)
    #[cold]
    pub(super) fn refused(&mut self, req: &IoRequest, e: SubmitError) -> SubmitError {
        if req.tag >= DENSE_TAGS {
            self.sparse.retain(|s| s.0 != req.tag);
        }
        let op = op_index(req.op);
        match e {
            SubmitError::Busy => {}
            SubmitError::OutOfRange => self.slot.failure(op, errno_slot(libc::EINVAL)),
            SubmitError::Unsupported => self.slot.failure(op, 0),
        }
        e
    }

    /// Submits `req` to the device, timing it ([`IoChannel::submit`] without the dynamic call,
    /// for a frontend that holds the channel by type). Always inlined into the frontend's
    /// submission: as a call its frame cost 15 instructions per request under callgrind.
    #[inline(always)]
    pub fn submit_request(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.submit_arrived(req, ticks::now())
    }

    /// [`DiskChannel::submit_request`] with the request's arrival time `now` read by the
    /// caller ([`arrival_clock`](super::arrival_clock)), once for a batch of requests rather
    /// than once for each: the latency the layer measures starts at the batch's start.
    #[inline(always)]
    pub fn submit_arrived(&mut self, req: &IoRequest, now: u64) -> Result<(), SubmitError> {
        // The entry is filled before the call, so nothing of `req` need survive it. Its start
        // is the arrival: a wait for QoS counts in the request's latency, as the guest sees it.
        let e = InFlight {
            start: now,
            offset: req.offset,
            len: req.len,
            op: op_index(req.op) as u8,
            gen: 0,
            mflags: 0,
        };
        match self.slab.get_mut(req.tag as usize) {
            Some(slot) => *slot = e,
            None => self.record_beyond(req.tag, e),
        }
        if self.qos.on {
            if let Admission::Held = self.qos.admit_new(&self.disk.qos, req, now) {
                // The caller's guarantees for `req` hold until its completion, which `poll`
                // returns after submitting it: holding the copy is within them.
                return Ok(());
            }
        }
        // `in_flight` counts what went down to the device; a write the fleece holds is counted
        // when it goes down at a poll (and as held meanwhile).
        let submitted =
            if !self.hooked { self.inner.submit(req).map(|()| true) } else { self.submit_hooked(req) };
        match submitted {
            Ok(down) => {
                self.in_flight += u64::from(down);
                Ok(())
            }
            Err(SubmitError::Busy) if self.qos.on => {
                // Its limits are paid: it goes first at the next poll rather than back to the
                // caller, who would pay them again.
                self.qos.hold_admitted(req, now);
                Ok(())
            }
            Err(e) => Err(self.refused(req, e)),
        }
    }

    /// Submits the held requests whose limits now allow them; one that the device refuses
    /// for good completes through `done` with its error. Returns how many completed so.
    #[cold]
    #[inline(never)]
    pub(super) fn release_held(&mut self, done: &mut impl Completion) -> usize {
        let now = ticks::now();
        let Self { inner, qos, disk, slot, in_flight, sparse, slab, mirror, fleece, .. } = self;
        let mut failed = 0;
        qos.release(&disk.qos, now, slot, |req| {
            let submitted = match (&mut *mirror, &mut *fleece) {
                (_, Some(f)) => DiskChannel::fleece_submit(&mut **inner, f, req),
                (None, None) => inner.submit(req).map(|()| true),
                (Some(m), None) => mirror::submit_down(&mut **inner, m, slab, sparse, req).map(|()| true),
            };
            match submitted {
                Ok(down) => {
                    *in_flight += u64::from(down);
                    true
                }
                Err(SubmitError::Busy) => false,
                Err(e) => {
                    if req.tag >= DENSE_TAGS {
                        sparse.retain(|s| s.0 != req.tag);
                    }
                    let op = op_index(req.op);
                    let status = match e {
                        SubmitError::OutOfRange | SubmitError::Busy => {
                            slot.failure(op, errno_slot(libc::EINVAL));
                            IoStatus::Error(libc::EINVAL)
                        }
                        SubmitError::Unsupported => {
                            slot.failure(op, 0);
                            IoStatus::Unsupported
                        }
                    };
                    done.complete(req.tag, status);
                    failed += 1;
                    true
                }
            }
        });
        failed
    }

    /// Polls the device, counting each completion before `done` sees it
    /// ([`IoChannel::poll`] with `done` inlined, for a frontend that holds the channel by type).
    #[inline(always)]
    pub fn poll_with(&mut self, done: &mut impl Completion) -> usize {
        self.apply_resets();
        // A mirror job attached, switched or detached: cold, once per change.
        if self.disk.mirror_epoch.load(Ordering::Relaxed) != self.mirror_epoch {
            self.refresh_mirror();
        }
        // A bitmap added or removed: cold, once per change.
        if self.disk.bitmap_epoch.load(Ordering::Relaxed) != self.bitmap_epoch {
            self.refresh_bitmaps();
        }
        self.qos.refresh(&self.disk.qos);
        let mut failed = if self.qos.held() > 0 { self.release_held(done) } else { 0 };
        if self.fleece.is_some() {
            failed += self.poll_fleece(done);
        }
        // Whether to record latencies in a histogram is decided once per poll, not per request.
        let histogram_on = self.disk.histogram_on.load(Ordering::Relaxed);
        if self.mirror.is_some() {
            let (reaped, upward) = self.reap_mirrored(done, histogram_on);
            self.in_flight = self.in_flight.saturating_sub(reaped as u64);
            self.report_in_flight();
            return upward + failed;
        }
        let Self { inner, slot, slab, sparse, batch, bitmaps, fleece, mirror_epoch, .. } = &mut *self;
        let slot: &ChannelSlot = slot;
        inner.poll_batch(batch);
        if let Some(f) = fleece.as_mut().filter(|f| f.unwatched > 0) {
            fleece::count_unwatched(f, batch, slab, sparse, slot, *mirror_epoch);
        }
        if let Some(set) = bitmaps {
            // Before any completion goes up: whoever learns of a write finds it marked.
            mark_batch(set, batch, slab, sparse);
        }
        let n = if histogram_on {
            // Allocated once per channel, the first time histograms are on.
            let h = slot.hist.get_or_init(ChannelHistogram::new);
            reap(batch, slab, sparse, slot, done, |ticks| h.record(ticks))
        } else {
            reap(batch, slab, sparse, slot, done, |_| {})
        };
        batch.clear();
        self.in_flight = self.in_flight.saturating_sub(n as u64);
        self.report_in_flight();
        n + failed
    }

    /// Takes the disk's current set of bitmaps.
    #[cold]
    #[inline(never)]
    fn refresh_bitmaps(&mut self) {
        let book = self.disk.book();
        self.bitmap_epoch = self.disk.bitmap_epoch.load(Ordering::SeqCst);
        self.bitmaps = book.bitmap_set.clone();
    }

    /// The requests of `op`'s kind that succeeded through this channel since it opened, and
    /// their bytes: what its slot counted, resets included, plus what
    /// [`DiskChannel::count_successes_from`] added. A frontend that counts per channel reads
    /// them here rather than counting each completion again.
    #[inline(always)]
    pub fn successes(&self, op: IoOp) -> Successes {
        let op = op_index(op);
        self.cleared[op] + self.slot.successes(op)
    }

    /// Adds `earlier` to what [`DiskChannel::successes`] reports for `op` from now on: what a
    /// frontend counted before it opened this channel (a queue restarted on its counters), so
    /// that reading its counts costs it no addition of its own. The disk's statistics
    /// (`bdev_get_iostat`) do not see it.
    pub fn count_successes_from(&mut self, op: IoOp, earlier: Successes) {
        let op = op_index(op);
        self.cleared[op] = self.cleared[op] + earlier;
    }

    /// Shows the requests in flight and held in the channel's slot, when they changed.
    #[inline]
    pub(super) fn report_in_flight(&mut self) {
        let held = self.qos.held() as u64;
        if self.in_flight + held != self.in_flight_reported {
            self.in_flight_reported = self.in_flight + held;
            self.slot.set_in_flight(self.in_flight_reported);
        }
        if held != self.qos_reported {
            self.qos_reported = held;
            self.slot.set_qos_queued(held);
        }
    }
}

/// Marks the bitmaps of `set` for each write of `batch`, whatever its status (out of line:
/// only with a bitmap defined).
#[cold]
#[inline(never)]
fn mark_batch(
    set: &[Arc<DirtyBitmap>],
    batch: &[(u32, IoStatus)],
    slab: &[InFlight],
    sparse: &[(u32, InFlight)],
) {
    let requests = batch.iter().filter_map(|&(tag, _)| {
        let e = match slab.get(tag as usize) {
            Some(e) => e,
            None => &sparse.iter().find(|s| s.0 == tag)?.1,
        };
        Some((e.op, e.offset, e.len))
    });
    mark_each(set, requests);
}

/// The completion loop of [`DiskChannel::poll_with`] over one poll's batch: counts each
/// completion in `slot`, passes its latency to `record`, then hands it to `done` with the
/// caller's tag. One loop with everything inlined, no call per completion.
#[inline(always)]
pub(super) fn reap(
    batch: &[(u32, IoStatus)],
    slab: &[InFlight],
    sparse: &mut Vec<(u32, InFlight)>,
    slot: &ChannelSlot,
    done: &mut impl Completion,
    record: impl Fn(u64),
) -> usize {
    // One clock read per poll round, at its first success: the requests reaped in one round
    // had all completed by then (those that completed earlier waited for this poll, which is
    // when the frontend learns of them).
    let mut now = 0;
    for &(tag, status) in batch {
        let e = match slab.get(tag as usize) {
            Some(e) => *e,
            None => match take_sparse(sparse, tag) {
                Some(e) => e,
                // Not a tag of ours: the device broke its contract; pass it on unchanged.
                None => {
                    done.complete_uncounted(tag, status);
                    continue;
                }
            },
        };
        account(slot, &e, status, &mut now, &record);
        done.complete(tag, status);
    }
    batch.len()
}

impl IoChannel for DiskChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.submit_request(req)
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.poll_with(&mut |tag, status| done(tag, status))
    }

    fn in_flight(&self) -> usize {
        // A mirrored write whose target half is out is still in flight for the caller.
        let mirrored = self.mirror.as_ref().map_or(0, |m| m.waiting());
        let held = self.fleece.as_ref().map_or(0, |f| f.held());
        self.inner.in_flight() + self.qos.held() + mirrored + held
    }

    /// What the device channel parked (requests QoS holds are not refused, only paced).
    fn parked(&self) -> usize {
        self.inner.parked()
    }

    fn abort_parked(&mut self) -> usize {
        self.inner.abort_parked()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        self.inner.completion_fd()
    }

    fn disarm_completion_fd(&mut self) {
        self.inner.disarm_completion_fd()
    }

    fn arm_completion_fd(&mut self) -> bool {
        self.inner.arm_completion_fd()
    }

    /// Requests held by QoS are released only by `poll`, so not while any is held.
    fn sleeps_in_flight(&self) -> bool {
        // The mirror's target may not signal the completion fd: keep polling while attached.
        // A fleece's copies complete on channels of their own: keep polling while it works.
        self.qos.held() == 0
            && self.mirror.is_none()
            && self.fleece.as_ref().is_none_or(|f| f.idle())
            && self.inner.sleeps_in_flight()
    }
}

impl Drop for DiskChannel {
    /// Folds this channel's counters into the disk's retired totals, so closing a queue loses
    /// nothing.
    fn drop(&mut self) {
        if let Some(m) = self.mirror.take() {
            m.release();
        }
        if let Some(f) = self.fleece.take() {
            if f.active > 0 {
                // Its claimed chunks would never be marked copied: writes elsewhere must not
                // wait for them, and the snapshot cannot be trusted.
                f.fleece.break_snapshot("a channel of the base closed with copies in flight".into());
            }
        }
        let disk = self.disk.clone();
        let mut book = disk.book();
        // Under the lock no reset can slip between applying and folding.
        self.apply_resets();
        let mut s = self.slot.snapshot();
        s.queue_depth = 0;
        s.qos.queued = 0;
        book.retired.merge(&s, true);
        if self.disk.histogram_on.load(Ordering::Relaxed) {
            if let Some(h) = self.slot.hist.get() {
                h.add_to(&mut book.retired_hist);
            }
        }
        book.live.retain(|s| !Arc::ptr_eq(s, &self.slot));
        self.disk.live_changes.fetch_add(1, Ordering::Release);
    }
}
