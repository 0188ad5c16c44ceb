//! What a queue's stop answers: the ring position, or why it could not stop within its bound.

use std::time::Duration;

/// How a queue stops.
///
/// Today only [`StopMode::Drain`]: GET_VRING_BASE, at the end of a migration too, waits for
/// every request in flight, so the vring base it answers leaves nothing behind. QEMU 11.1's
/// GET_VRING_BASE_INFLIGHT would add a mode that stops taking requests and returns at once,
/// leaving the requests still in flight recorded in the in-flight area (`crate::inflight`)
/// for the destination to resubmit: the poller would then reply before `in_flight() == 0` and
/// keep the tracker's records instead of completing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopMode {
    /// Stop taking requests, complete everything in flight, then report the position.
    #[default]
    Drain,
}

/// What a stopped queue reports back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// The vring base to resume from (GET_VRING_BASE's answer, in [`QueueSetup::base`](crate::queue::QueueSetup::base)'s
    /// encoding).
    pub base: u32,
    /// How long the stop took, by the queue's clock.
    pub took: Duration,
    /// Requests the bdev still refused as Busy at the bound, completed with
    /// VIRTIO_BLK_S_IOERR.
    pub failed_at_bound: u32,
    /// Requests not accepted by the bdev at the bound and left recorded in the in-flight area,
    /// for the next back-end to resubmit.
    pub left_in_flight_area: u32,
}

/// A stop that reached its bound with requests the bdev holds (submitted, not completed): they
/// cannot be completed while the bdev owns their buffers. The queue takes nothing more, keeps
/// the guest memory mapped and removes itself once the bdev has completed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "queue {index} did not stop within {bound:?} (waited {waited:?}): {in_bdev} requests still held by \
     the bdev{}",
    parked_note(*failed_at_bound, *left_in_flight_area)
)]
pub struct StopStuck {
    pub index: u16,
    pub bound: Duration,
    pub waited: Duration,
    /// Requests submitted to the bdev and not completed.
    pub in_bdev: usize,
    /// As in [`Stopped`].
    pub failed_at_bound: u32,
    pub left_in_flight_area: u32,
}

fn parked_note(failed: u32, left: u32) -> String {
    match (failed, left) {
        (0, 0) => String::new(),
        _ => format!(
            "; of the requests still refused as busy, {failed} were failed with IOERR and {left} left \
             in the in-flight area"
        ),
    }
}

/// What a stop answers: the ring position, or why the queue could not stop in time.
pub type StopReply = Result<Stopped, StopStuck>;
