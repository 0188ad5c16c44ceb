//! A channel's view of the raid's bases: the layout it last loaded (with that layout's epoch)
//! and one channel per slot, opened on first use on the calling thread. A new epoch reloads
//! the layout; a slot whose base changed gets a new channel, and the old one, if it still has
//! requests in flight, is kept and polled until it drains (cold path, may allocate).
//!
//! The channel acknowledges each layout it takes up, and says how many requests it still has
//! on retired channels, in its [`ChannelAck`]; it marks itself idle there when it has nothing
//! in flight (see [`Bases::enter`], [`Bases::settle`]), so a removal need not wait for an idle
//! channel's reactor to wake.

use std::sync::Arc;

use fp_bdev::{Bdev, IoChannel, IoRequest, IoStatus, SubmitError};

use crate::shared::{ChannelAck, Layout, RaidShared};
use crate::SlotState;

/// One slot's channel and the device it belongs to (by address, to notice a replaced base).
struct Open {
    dev: usize,
    ch: Box<dyn IoChannel>,
}

/// Slot masks of a layout (bit `i`: slot `i`), worked out once per epoch so a request tests
/// a word instead of walking the slots.
#[derive(Debug, Clone, Copy, Default)]
pub struct Masks {
    /// Slots with a base that takes writes (Active, Rebuilding).
    pub writing: u32,
    /// Slots with an Active base.
    pub active: u32,
    /// Slots taking writes whose base has a cache to flush.
    pub flushable: u32,
    /// Some slot is not Active (missing, failed, rebuilding).
    pub degraded: bool,
}

impl Masks {
    fn of(layout: &Layout) -> Masks {
        let mut m = Masks::default();
        for (i, s) in layout.slots.iter().enumerate().take(32) {
            let Some(b) = s.bdev.as_ref() else {
                m.degraded = true;
                continue;
            };
            if s.state.takes_writes() {
                m.writing |= 1 << i;
                if b.info().io_types.flush {
                    m.flushable |= 1 << i;
                }
            }
            if s.state == SlotState::Active {
                m.active |= 1 << i;
            } else {
                m.degraded = true;
            }
        }
        m
    }
}

/// The layout a channel works with and its bases' channels.
pub struct Bases {
    pub shared: Arc<RaidShared>,
    epoch: u64,
    pub layout: Arc<Layout>,
    pub masks: Masks,
    open: Vec<Option<Open>>,
    /// Channels of bases that left their slot with requests still in flight.
    retired: Vec<(usize, Box<dyn IoChannel>)>,
    /// This channel's acknowledgement, listed in `shared.channels`.
    ack: Arc<ChannelAck>,
    /// Whether `ack` has the idle mark.
    idle: bool,
    /// The requests in flight `ack` shows.
    shown_in_flight: usize,
    /// The bytes of the requests taken, and what `ack` shows of them.
    bytes: u64,
    shown_bytes: u64,
}

fn dev_id(b: &Bdev) -> usize {
    Arc::as_ptr(b) as *const () as usize
}

impl Bases {
    /// The bases of `shared` as published now; no channel is opened yet.
    pub fn new(shared: Arc<RaidShared>) -> Bases {
        // Listed before the epoch is loaded: see `RaidShared::register_channel`.
        let ack = shared.register_channel();
        // Epoch before layout: the layout is then at least as new as the epoch noted.
        let epoch = shared.epoch();
        let layout = shared.layout();
        let open = (0..layout.slots.len()).map(|_| None).collect();
        let masks = Masks::of(&layout);
        ack.store(epoch, true);
        Bases {
            shared,
            epoch,
            layout,
            masks,
            open,
            retired: Vec::new(),
            ack,
            idle: true,
            shown_in_flight: 0,
            bytes: 0,
            shown_bytes: 0,
        }
    }

    /// Counts a request of `len` bytes taken (shown at the end of the poll).
    #[inline]
    pub fn count_bytes(&mut self, len: u64) {
        self.bytes += len;
    }

    /// Called first by every submit: a channel leaving idle clears its mark before it looks
    /// at the epoch (one branch when it was not idle).
    #[inline]
    pub fn enter(&mut self) {
        if self.idle {
            self.leave_idle();
        }
    }

    #[cold]
    fn leave_idle(&mut self) {
        self.idle = false;
        self.ack.store(self.epoch, false);
    }

    /// Called last by every poll with the channel's requests in flight: with none, the
    /// channel marks itself idle.
    #[inline]
    pub fn settle(&mut self, in_flight: usize) {
        if in_flight != self.shown_in_flight {
            self.shown_in_flight = in_flight;
            self.ack.set_in_flight(in_flight);
        }
        if in_flight == 0 && !self.idle {
            self.idle = true;
            self.ack.store(self.epoch, true);
        }
    }

    /// Publishes the requests in flight on retired channels, by slot (cold path).
    fn publish_retired(&self) {
        for slot in 0..self.open.len() {
            let n: usize = self.retired.iter().filter(|(s, _)| *s == slot).map(|(_, c)| c.in_flight()).sum();
            self.ack.set_retired(slot, u32::try_from(n).unwrap_or(u32::MAX));
        }
    }

    /// Reloads the layout when the epoch moved (one load when it did not). Returns whether
    /// it moved.
    #[inline]
    pub fn refresh(&mut self) -> bool {
        let e = self.shared.epoch();
        if e == self.epoch {
            return false;
        }
        self.reload(e);
        true
    }

    #[cold]
    fn reload(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.layout = self.shared.layout();
        self.masks = Masks::of(&self.layout);
        if self.open.len() < self.layout.slots.len() {
            self.open.resize_with(self.layout.slots.len(), || None);
        }
        for (slot, entry) in self.open.iter_mut().enumerate() {
            let want = self.layout.slots.get(slot).and_then(|s| s.bdev.as_ref()).map(dev_id);
            let keep = matches!((&*entry, want), (Some(o), Some(w)) if o.dev == w);
            if !keep {
                if let Some(old) = entry.take() {
                    if old.ch.in_flight() > 0 {
                        self.retired.push((slot, old.ch));
                    }
                }
            }
        }
        // What is still in flight to the bases that left, then the acknowledgement: a removal
        // that sees the epoch acknowledged sees those counts too.
        self.publish_retired();
        self.ack.store(epoch, self.idle);
    }

    /// The channel of `slot`'s base, opened now if it has none; `None` when the slot has no
    /// base or its channel cannot be opened (logged: the caller treats it as an I/O error).
    #[inline]
    pub fn channel(&mut self, slot: usize) -> Option<&mut (dyn IoChannel + 'static)> {
        if self.open[slot].is_none() {
            self.open_slot(slot)?;
        }
        self.open[slot].as_mut().map(|o| &mut *o.ch)
    }

    /// Submits `req` to `slot`'s base; a slot without a channel refuses it as out of range
    /// (the caller fails it like any base's error).
    #[inline]
    pub fn submit(&mut self, slot: usize, req: &IoRequest) -> Result<(), SubmitError> {
        match self.channel(slot) {
            Some(ch) => ch.submit(req),
            None => Err(SubmitError::OutOfRange),
        }
    }

    /// The end of every poll: hands the completions gathered in `completed` to `done`, then
    /// marks the channel idle when `in_flight` (its parents) is zero. Returns how many it
    /// handed up.
    #[inline]
    pub fn hand_up(
        &mut self,
        completed: &mut Vec<(u32, IoStatus)>,
        done: &mut dyn FnMut(u32, IoStatus),
        in_flight: usize,
    ) -> usize {
        let n = completed.len();
        for (tag, status) in completed.drain(..) {
            done(tag, status);
        }
        if n > 0 {
            self.ack.count_completed(n);
        }
        if self.bytes != self.shown_bytes {
            self.shown_bytes = self.bytes;
            self.ack.set_bytes(self.bytes);
        }
        self.settle(in_flight);
        n
    }

    #[cold]
    fn open_slot(&mut self, slot: usize) -> Option<()> {
        let bdev = self.layout.slots.get(slot)?.bdev.as_ref()?;
        match bdev.open_channel() {
            Ok(ch) => {
                self.open[slot] = Some(Open { dev: dev_id(bdev), ch });
                Some(())
            }
            Err(e) => {
                log::warn!("raid '{}': cannot open a channel of slot {slot}: {e}", self.shared.info.name);
                None
            }
        }
    }

    /// Slots with an open channel, in order (for polling).
    pub fn slots(&self) -> usize {
        self.open.len()
    }

    /// Polls the channel of `slot`, if open, appending `(tag, status)` to `out`.
    #[inline]
    pub fn poll_slot(&mut self, slot: usize, out: &mut Vec<(u32, IoStatus)>) -> usize {
        match self.open[slot].as_mut() {
            Some(o) if o.ch.in_flight() > 0 => o.ch.poll_batch(out),
            _ => 0,
        }
    }

    /// Polls the retired channels: `f(slot, tag, status)` for each completion; a drained one
    /// is closed.
    pub fn poll_retired(&mut self, out: &mut Vec<(u32, IoStatus)>, f: &mut dyn FnMut(usize, u32, IoStatus)) {
        if self.retired.is_empty() {
            return;
        }
        for (slot, ch) in self.retired.iter_mut() {
            out.clear();
            ch.poll_batch(out);
            for &(tag, status) in out.iter() {
                f(*slot, tag, status);
            }
        }
        out.clear();
        self.retired.retain(|(_, ch)| ch.in_flight() > 0);
        self.publish_retired();
    }

    /// What the open base channels park on Busy below them ([`IoChannel::parked`]).
    pub fn parked(&self) -> usize {
        self.open.iter().flatten().map(|o| o.ch.parked()).sum()
    }

    /// Gives up what the open base channels park ([`IoChannel::abort_parked`]): each such
    /// child completes with `ECANCELED` at the next poll.
    pub fn abort_parked(&mut self) -> usize {
        self.open.iter_mut().flatten().map(|o| o.ch.abort_parked()).sum()
    }

    /// Requests in flight on every base channel.
    pub fn in_flight(&self) -> usize {
        let open: usize = self.open.iter().flatten().map(|o| o.ch.in_flight()).sum();
        open + self.retired.iter().map(|(_, c)| c.in_flight()).sum::<usize>()
    }
}

impl Drop for Bases {
    fn drop(&mut self) {
        self.shared.unregister_channel(&self.ack);
    }
}
