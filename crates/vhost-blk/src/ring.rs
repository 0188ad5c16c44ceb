//! The ring glue of one queue: [`Ring`] is either layout behind one interface, and [`open`]
//! builds it in the negotiated layout, recovering the in-flight record first when the
//! front-end keeps one (the ring's position then comes from the record).

use fp_virtq::{Chain, MemTable, PackedQueue, RingError, RingLog, SplitQueue};
use vm_memory::{Address, Bytes};

use crate::inflight::{Pending, Position, RingNow, Tracker};
use crate::queue_setup::{QueueSetup, StartError};

/// What the used ring needs to return a request: the head index (split) or buffer id (packed),
/// and how many ring slots the request took (packed; 1 for split).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Head {
    pub(crate) id: u16,
    pub(crate) slots: u16,
}

/// Either ring format, dispatched by one predictable branch per call.
pub(crate) enum Ring {
    Split(SplitQueue),
    Packed(PackedQueue),
}

impl Ring {
    /// Takes the next available chain into `chain`; a packed tracker records its ring
    /// descriptors as they are read. An error fails the queue. Always inlined: with
    /// [`crate::queue`]'s two copies of its caller it was left out of line, its frame and its
    /// result through memory costing more than the caller's frame saved.
    #[inline(always)]
    pub(crate) fn pop(
        &mut self,
        table: &MemTable,
        chain: &mut Chain,
        tracker: &mut Option<Box<Tracker>>,
    ) -> Result<Option<Head>, String> {
        match self {
            Ring::Split(q) => {
                let Some(head) = q.pop().map_err(|e| format!("bad available ring: {e}"))? else {
                    return Ok(None);
                };
                q.walk(table, head, chain).map_err(|e| format!("request {head} cannot be completed: {e}"))?;
                Ok(Some(Head { id: head, slots: 1 }))
            }
            Ring::Packed(q) => {
                let popped = match tracker.as_deref_mut() {
                    Some(Tracker::Packed(t)) => {
                        t.begin();
                        q.pop_with(table, chain, |d| t.record(d))
                    }
                    _ => q.pop(table, chain),
                };
                match popped {
                    Ok(Some(h)) => Ok(Some(Head { id: h.id, slots: h.slots })),
                    Ok(None) => Ok(None),
                    Err(e) => Err(format!("packed ring: {e}")),
                }
            }
        }
    }

    /// Whether the ring certainly holds no request to take now: a split ring's available
    /// index shows none (an index in error does not count as none: taking reports it); a
    /// packed ring is not asked (its `pop` finds out).
    #[inline(always)]
    pub(crate) fn shows_none(&mut self) -> bool {
        match self {
            Ring::Split(q) => matches!(q.has_available(), Ok(false)),
            Ring::Packed(_) => false,
        }
    }

    #[inline(always)]
    pub(crate) fn push_used(&mut self, head: Head, len: u32) {
        match self {
            Ring::Split(q) => q.push_used(head.id, len),
            Ring::Packed(q) => q.push_used(head.id, len, head.slots),
        }
    }

    #[inline]
    pub(crate) fn publish(&mut self) -> u16 {
        match self {
            Ring::Split(q) => q.publish(),
            Ring::Packed(q) => q.publish(),
        }
    }

    /// The split ring's used index after the last publish (what in-flight tracking records).
    pub(crate) fn next_used(&self) -> u16 {
        match self {
            Ring::Split(q) => q.next_used(),
            Ring::Packed(q) => q.state().next_used,
        }
    }

    #[inline]
    pub(crate) fn needs_notification(&mut self) -> bool {
        match self {
            Ring::Split(q) => q.needs_notification(),
            Ring::Packed(q) => q.needs_notification(),
        }
    }

    /// Whether the driver's field, read without a fence, declines a notification for now (see
    /// the rings' `declines_for_now`: provisional, to be asked again).
    #[inline(always)]
    pub(crate) fn declines_for_now(&self) -> bool {
        match self {
            Ring::Split(q) => q.declines_for_now(),
            Ring::Packed(q) => q.declines_for_now(),
        }
    }

    /// Requests the driver has out, as far as the ring can count them (see the split ring's
    /// `outstanding`); 0 for a packed ring, which cannot count them without walking its
    /// descriptors: its driver's depth shows in the heads it uses instead.
    #[inline(always)]
    pub(crate) fn outstanding(&self) -> u16 {
        match self {
            Ring::Split(q) => q.outstanding(),
            Ring::Packed(_) => 0,
        }
    }

    /// Whether the driver waits to hear of the next completion (see the rings' `driver_waits`).
    #[inline]
    pub(crate) fn driver_waits(&self) -> bool {
        match self {
            Ring::Split(q) => q.driver_waits(),
            Ring::Packed(q) => q.driver_waits(),
        }
    }

    pub(crate) fn enable_notification(&mut self) -> bool {
        match self {
            Ring::Split(q) => q.enable_notification(),
            Ring::Packed(q) => q.enable_notification(),
        }
    }

    pub(crate) fn disable_notification(&mut self) {
        match self {
            Ring::Split(q) => q.disable_notification(),
            Ring::Packed(q) => q.disable_notification(),
        }
    }

    /// Starts or stops logging the ring's used-side writes.
    pub(crate) fn set_log(&mut self, log: Option<RingLog>) {
        match self {
            Ring::Split(q) => q.set_log(log),
            Ring::Packed(q) => q.set_log(log),
        }
    }

    /// Pages the ring's writes marked since the last call.
    #[inline]
    pub(crate) fn take_logged_pages(&mut self) -> u64 {
        match self {
            Ring::Split(q) => q.take_logged_pages(),
            Ring::Packed(q) => q.take_logged_pages(),
        }
    }

    /// The vring base to report once nothing is in flight.
    pub(crate) fn base(&self) -> u32 {
        match self {
            Ring::Split(q) => u32::from(q.next_avail()),
            Ring::Packed(q) => q.state().to_vring_base(),
        }
    }
}

/// What [`open`] gives the queue: its ring, its in-flight tracker when the front-end keeps
/// one, and the requests a previous back-end left in flight, to resubmit.
pub(crate) type Opened = (Ring, Option<Box<Tracker>>, Vec<Pending>);

/// Builds queue `s`'s ring in the negotiated layout. With in-flight tracking the ring's position
/// comes from the region, not the base: after a back-end crash the front-end resets the base
/// (split: to the used index) and cannot know how far the crashed back-end got; everything it
/// had taken beyond that is either completed (in the used ring) or recorded in flight, and is
/// returned here to be resubmitted.
pub(crate) fn open(s: &QueueSetup, table: &MemTable) -> Result<Opened, StartError> {
    let index = s.index;
    let ring_err = |source| StartError::Ring { index, source };
    let mut position = Position::from_vring_base(s.base, s.packed);
    let mut tracker = None;
    let mut resubmit = Vec::new();
    if let Some(area) = &s.inflight {
        let inflight_err = |source| StartError::Inflight { index, source };
        let mut t = area.tracker(index, s.size, s.packed).map_err(inflight_err)?;
        // What recovery reads of the guest's ring: the layout-specific part.
        let flags_at = |slot: u16| {
            let at = s.desc.checked_add(16 * u64::from(slot) + 14)?;
            s.mem.read_obj::<u16>(at).ok().map(u16::from_le)
        };
        let ring = if s.packed {
            RingNow::Packed { flags_at: &flags_at }
        } else {
            let used_idx: u16 = s.mem.read_obj(s.used.unchecked_add(2)).map_err(|_| {
                ring_err(RingError::OutsideMemory { what: "used ring", addr: s.used.0, len: 4 })
            })?;
            RingNow::Split { used_idx }
        };
        let recovered = t.recover(position, ring).map_err(inflight_err)?;
        if recovered.reused {
            position = recovered.position;
            if !recovered.resubmit.is_empty() {
                log::info!(
                    "{} queue {index}: resubmitting {} in-flight requests from before the restart",
                    s.controller,
                    recovered.resubmit.len()
                );
            }
            resubmit = recovered.resubmit;
        }
        tracker = Some(Box::new(t));
    }
    let ring = match position {
        Position::Packed(state) => Ring::Packed(
            PackedQueue::new(table, s.desc.0, s.avail.0, s.used.0, s.size, s.event_idx, state)
                .map_err(ring_err)?,
        ),
        Position::Split { next_avail, next_used } => Ring::Split(
            SplitQueue::new(table, s.desc.0, s.avail.0, s.used.0, s.size, s.event_idx, next_avail, next_used)
                .map_err(ring_err)?,
        ),
    };
    Ok((ring, tracker, resubmit))
}
