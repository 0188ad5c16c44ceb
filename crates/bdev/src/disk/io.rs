//! [`DiskIo`]: a channel from [`Disk::open_typed`](super::Disk::open_typed), dispatched by
//! type rather than through a vtable.

use std::os::unix::io::RawFd;

use super::channel_state::{Completion, DiskChannel};
use super::stats::Successes;
use crate::{IoChannel, IoOp, IoRequest, SubmitError};

/// A channel from [`Disk::open_typed`](super::Disk::open_typed): the layer's own when the disk counts, the device's
/// otherwise. Its methods are [`IoChannel`]'s, dispatched by a match rather than a vtable.
// Unboxed on purpose: a channel is made once and lives in its poller, and a box would cost an
// indirection per request.
#[allow(clippy::large_enum_variant)]
pub enum DiskIo {
    /// The layer's own channel: counted, timed, QoS applied.
    Counted(DiskChannel),
    /// The device's channel, untouched (accounting off).
    Device(Box<dyn IoChannel>),
}

impl DiskIo {
    /// As [`IoChannel::submit`].
    #[inline]
    pub fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        match self {
            DiskIo::Counted(ch) => ch.submit_request(req),
            DiskIo::Device(ch) => ch.submit(req),
        }
    }

    /// As [`DiskIo::submit`], with the request's arrival time `now` read once for a batch
    /// of requests ([`arrival_clock`](super::arrival_clock)), not once for each: the
    /// layer's latency figures then start at the batch's start (a frontend takes a batch in
    /// a few microseconds at most). The device's own channel takes no time.
    #[inline]
    pub fn submit_arrived(&mut self, req: &IoRequest, now: u64) -> Result<(), SubmitError> {
        match self {
            DiskIo::Counted(ch) => ch.submit_arrived(req, now),
            DiskIo::Device(ch) => ch.submit(req),
        }
    }

    #[inline(always)]
    /// Reaps completions, handing each to `done`; returns how many. Always inlined, as
    /// [`DiskChannel::poll_with`]: a frontend that reaps from more than one place (the vhost
    /// queue's round) had it left out of line, a call per poll.
    pub fn poll(&mut self, done: &mut impl Completion) -> usize {
        match self {
            DiskIo::Counted(ch) => ch.poll_with(done),
            DiskIo::Device(ch) => ch.poll(&mut |tag, status| done.complete_uncounted(tag, status)),
        }
    }

    /// See [`DiskChannel::count_successes_from`]; nothing when the layer does not count.
    pub fn count_successes_from(&mut self, op: IoOp, earlier: Successes) {
        if let DiskIo::Counted(ch) = self {
            ch.count_successes_from(op, earlier);
        }
    }

    /// What succeeded of `op`'s kind through the channel since it opened
    /// ([`DiskChannel::successes`]); `None` when the layer does not count (accounting off).
    #[inline(always)]
    pub fn successes(&self, op: IoOp) -> Option<Successes> {
        match self {
            DiskIo::Counted(ch) => Some(ch.successes(op)),
            DiskIo::Device(_) => None,
        }
    }

    /// Requests submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.channel().in_flight()
    }

    /// See [`IoChannel::parked`].
    pub fn parked(&self) -> usize {
        self.channel().parked()
    }

    /// See [`IoChannel::abort_parked`].
    pub fn abort_parked(&mut self) -> usize {
        self.channel_mut().abort_parked()
    }

    /// See [`IoChannel::completion_fd`].
    pub fn completion_fd(&self) -> Option<RawFd> {
        self.channel().completion_fd()
    }

    /// See [`IoChannel::disarm_completion_fd`].
    pub fn disarm_completion_fd(&mut self) {
        self.channel_mut().disarm_completion_fd()
    }

    /// See [`IoChannel::arm_completion_fd`].
    pub fn arm_completion_fd(&mut self) -> bool {
        self.channel_mut().arm_completion_fd()
    }

    /// See [`IoChannel::sleeps_in_flight`].
    pub fn sleeps_in_flight(&self) -> bool {
        self.channel().sleeps_in_flight()
    }

    fn channel(&self) -> &dyn IoChannel {
        match self {
            DiskIo::Counted(ch) => ch,
            DiskIo::Device(ch) => &**ch,
        }
    }

    fn channel_mut(&mut self) -> &mut dyn IoChannel {
        match self {
            DiskIo::Counted(ch) => ch,
            DiskIo::Device(ch) => &mut **ch,
        }
    }
}
