//! A [`DiskChannel`]'s state and the entries of its requests in flight: below the layer's hot
//! path (`channel.rs`) and its mirror half (`mirror.rs`), which both work on them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::qos::ChannelQosState;
use super::shared::{BitmapSet, DiskShared};
use super::stats::{errno_slot, ChannelSlot, Successes, OPS};
use crate::clock::ticks;
use crate::fleece::FleeceShared;
use crate::iov::BounceBuf;
use crate::mirror::MirrorShared;
use crate::{IoChannel, IoRequest, IoStatus};

/// Slab entries made when a channel opens (tags below this need no growth).
pub(super) const SLAB_START: usize = 256;

/// Room for completions in a channel's batch when it opens (a poll that returns more grows it
/// once; the device's own list may hand over a larger one).
pub(super) const BATCH_START: usize = 256;

/// Tags below this index the dense slab directly (vhost-blk's tags are its slot indices,
/// bounded by the virtqueue size, at most 32768); larger tags, which the trait allows but no
/// frontend uses, are kept in a short list searched by tag, out of line.
pub(super) const DENSE_TAGS: u32 = 1 << 16;

/// A request in flight through a [`DiskChannel`], indexed by the caller's tag.
#[derive(Clone, Copy)]
pub(super) struct InFlight {
    pub(super) start: u64,
    /// Where it goes: a mirror marks the chunks of writes when they complete.
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) op: u8,
    /// The mirror attachment it was submitted under (0: none; `disk/mirror.rs`).
    pub(super) gen: u8,
    /// A mirrored request's progress (`disk/mirror.rs`).
    pub(super) mflags: u8,
}

pub(super) const EMPTY: InFlight = InFlight { start: 0, offset: 0, len: 0, op: 0, gen: 0, mflags: 0 };

/// What a frontend holding a [`DiskIo`](super::DiskIo) does with each completion. Any
/// `FnMut(tag, status)` is one; a frontend may implement it on its own type with
/// `#[inline(always)]` so that its handling is compiled into the layer's completion loop (a
/// closure there is inlined only when the compiler's cost model agrees).
pub trait Completion {
    /// Called once per completed request with its tag and status, after the layer counted it
    /// in the channel's slot (what [`DiskChannel::successes`] reads).
    fn complete(&mut self, tag: u32, status: IoStatus);

    /// Called instead of [`Completion::complete`] for a completion the layer did not count:
    /// every completion of a channel with accounting off ([`DiskIo::Device`]), and one whose
    /// tag the device made up. A frontend that reads its counts from the channel counts these
    /// itself; by default the same as `complete`.
    ///
    /// [`DiskIo::Device`]: super::DiskIo::Device
    #[inline(always)]
    fn complete_uncounted(&mut self, tag: u32, status: IoStatus) {
        self.complete(tag, status)
    }
}

impl<F: FnMut(u32, IoStatus)> Completion for F {
    #[inline(always)]
    fn complete(&mut self, tag: u32, status: IoStatus) {
        self(tag, status)
    }
}

/// A channel of a [`Disk`](crate::Disk): the device's channel plus accounting. See the module docs.
///
/// Requests keep the caller's tag on their way down: the entry of tag `t` is `slab[t]`, written
/// at each submit, so there is no free list and no tag to translate. A caller's tags must be
/// unique among its requests in flight (as they must be for it to tell completions apart).
/// A refused request leaves nothing in flight: its dense entry is stale until the tag's next
/// submit, and no completion reads it.
pub struct DiskChannel {
    pub(super) inner: Box<dyn IoChannel>,
    pub(super) slot: Arc<ChannelSlot>,
    pub(super) disk: Arc<DiskShared>,
    pub(super) slab: Vec<InFlight>,
    /// Entries of tags of [`DENSE_TAGS`] and above.
    pub(super) sparse: Vec<(u32, InFlight)>,
    /// The reset epochs applied to `slot`.
    pub(super) seen_epochs: u64,
    /// What succeeded before the resets `slot` applied cleared it, by [`op_index`], plus what
    /// the frontend counted before the channel opened ([`DiskChannel::count_successes_from`]):
    /// with `slot`'s own, what [`DiskChannel::successes`] reports.
    ///
    /// [`op_index`]: super::op_index
    pub(super) cleared: [Successes; OPS.len()],
    /// Accepted by the device and not yet completed.
    pub(super) in_flight: u64,
    /// What `slot` last showed of `in_flight` plus the held requests.
    pub(super) in_flight_reported: u64,
    pub(super) qos: ChannelQosState,
    /// What `slot` last showed of the held requests.
    pub(super) qos_reported: u64,
    /// The disk's mirror epoch this channel applied.
    pub(super) mirror_epoch: u64,
    /// The mirror job this channel feeds, if any (boxed: cold, and the channel stays small).
    pub(super) mirror: Option<Box<ChannelMirror>>,
    /// The disk's bitmap epoch this channel applied, and the bitmaps it marks then.
    pub(super) bitmap_epoch: u64,
    pub(super) bitmaps: Option<BitmapSet>,
    /// The fleece this channel copies before writes for, if any (`disk/fleece.rs`; boxed: cold).
    pub(super) fleece: Option<Box<ChannelFleece>>,
    /// A mirror job or a fleece is attached: submits take the cold path (one branch per submit
    /// for both).
    pub(super) hooked: bool,
    /// The last attachment number handed out (requests carry it in `InFlight::gen`).
    pub(super) next_gen: u8,
    /// The device's completions of one poll ([`IoChannel::poll_batch`]), empty between polls.
    pub(super) batch: Vec<(u32, IoStatus)>,
}

/// A channel's attachment to a job.
pub(super) struct ChannelMirror {
    pub(super) job: Arc<MirrorShared>,
    /// This attachment's number, carried by the requests submitted under it.
    pub(super) gen: u8,
    /// The target's channel, once the job wants blocking writes.
    pub(super) target: Option<Box<dyn IoChannel>>,
    /// The job detached: mirror nothing new, finish what is mirrored, then let go.
    pub(super) draining: bool,
    /// What this channel added to the job's `source_only` and has not taken back.
    pub(super) counted: i64,
    /// Requests sent to both disks and not yet completed upward.
    pub(super) duals: u64,
    /// Of those, the ones whose source half is done.
    pub(super) waiting: u64,
    /// The source's status of each such request, by tag (out of the in-flight entry, which
    /// every request writes: a mirror's fields there cost the layer when none is attached).
    pub(super) src_status: Vec<i32>,
}

/// A channel's attachment to a fleece (`disk/fleece.rs`).
pub(super) struct ChannelFleece {
    pub(super) fleece: Arc<FleeceShared>,
    /// The base's device channel (below the disk) the copies read from.
    pub(super) base: Box<dyn IoChannel>,
    /// The target's channel the copies write to.
    pub(super) target: Box<dyn IoChannel>,
    /// Writes waiting for their chunks' copies, in submission order.
    pub(super) held: VecDeque<Held>,
    /// The copy slots (their index is the copy's tag on `base` and `target`).
    pub(super) copies: Vec<FleeceCopy>,
    /// Slots not free.
    pub(super) active: usize,
    /// Detached: held writes go down, copies finish, then the channel lets go.
    pub(super) draining: bool,
    /// Requests in flight from before the attachment: the channel acknowledges once they are done.
    pub(super) unwatched: u64,
}

/// A held write.
#[derive(Clone, Copy)]
pub(super) struct Held {
    pub(super) req: IoRequest,
    pub(super) since: Instant,
}

/// One copy of a chunk: base to buffer to target.
pub(super) struct FleeceCopy {
    pub(super) chunk: u64,
    pub(super) phase: Phase,
    pub(super) buf: Option<BounceBuf>,
}

/// A copy slot's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Free,
    ReadQueued,
    Reading,
    WriteQueued,
    Writing,
}

/// Counts one completion in `slot`, passing its latency to `record`. `now` is read once per
/// poll round, at its first success (see [`reap`]).
#[inline(always)]
pub(super) fn account(
    slot: &ChannelSlot,
    e: &InFlight,
    status: IoStatus,
    now: &mut u64,
    record: &impl Fn(u64),
) {
    let op = usize::from(e.op);
    match status {
        IoStatus::Success => {
            if *now == 0 {
                *now = ticks::now();
            }
            let ticks = now.saturating_sub(e.start);
            slot.success(op, e.len, ticks);
            record(ticks);
        }
        IoStatus::Error(errno) => slot.failure(op, errno_slot(errno)),
        IoStatus::Unsupported => slot.failure(op, 0),
    }
}

/// Removes and returns the entry of a tag beyond the dense slab.
#[cold]
pub(super) fn take_sparse(sparse: &mut Vec<(u32, InFlight)>, tag: u32) -> Option<InFlight> {
    let i = sparse.iter().position(|s| s.0 == tag)?;
    Some(sparse.swap_remove(i).1)
}
