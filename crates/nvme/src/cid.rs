//! The command-id table every queue keeps (PCIe and TCP, admin and I/O): which command ids are
//! in flight, the caller's tag behind each, and when it was submitted (for timeouts).
//!
//! A command id (CID, Base 2.0 4.2 "Submission Queue Entry", dword 0 bits 31:16) is a slot
//! index in the low bits and a per-slot generation in the high bits. The generation moves each
//! time a slot is freed, so a controller that completes the same command twice, or completes
//! an id it was never given, is caught even when the slot has been reused since ("unknown or
//! duplicate command id", the issue's hostile cases): [`CidTable::complete`] refuses it and the
//! queue treats that as a protocol violation. CID FFFFh is never handed out (Base 2.0 says it
//! should not be used: the Error Information log page uses it for "no command").
//!
//! Hot path: [`CidTable::alloc`] and [`CidTable::complete`] are a free-list pop/push and a
//! handful of loads and stores on one 16-byte slot; nothing allocates after [`CidTable::new`].
//! The free list is a stack, so the slots (and whatever per-slot memory a transport keeps
//! beside them, indexed by [`CidTable::slot`]) that were used last are used again first, while
//! they are still in cache.

/// Why a completion's command id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CidError {
    /// The id names no slot of this queue, or a slot whose current command has another
    /// generation: the controller made it up or completed an old command again.
    #[error("completion for unknown command id {0:#06x}")]
    Unknown(u16),
    /// The id's slot holds no command: completed already (a duplicate completion).
    #[error("completion for command id {0:#06x}, which is not in flight")]
    NotInFlight(u16),
}

impl From<CidError> for crate::NvmeError {
    fn from(e: CidError) -> crate::NvmeError {
        crate::NvmeError::Protocol(e.to_string())
    }
}

/// One command slot. 16 bytes: four to a cache line.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The tick [`CidTable::alloc`] was given.
    submitted: u64,
    /// The caller's tag.
    tag: u32,
    /// The command id of the slot's current (or next) command: its index with its
    /// generation, kept whole so that checking a completion is one comparison.
    cid: u16,
    /// A command is in flight in this slot.
    busy: bool,
}

/// Command ids of one queue: at most `capacity` in flight.
#[derive(Debug)]
pub struct CidTable {
    slots: Box<[Slot]>,
    /// Free slot indexes, a stack (most recently freed on top).
    free: Vec<u16>,
    /// `(1 << index bits) - 1`: the bits of a command id that index the slot.
    index_mask: u16,
    /// `1 << index bits`: what moves a command id to the next generation of its slot (as a
    /// `u32`, so that an index of all 16 bits moves nothing).
    generation_step: u32,
}

impl CidTable {
    /// A table of `capacity` slots (1..=65535; a queue of N entries holds at most N - 1
    /// commands, so that is what a submission queue of N entries passes).
    ///
    /// # Panics
    /// When `capacity` is 0 (a queue with no room is a caller's bug).
    pub fn new(capacity: u16) -> CidTable {
        assert!(capacity > 0, "a command-id table needs at least one slot");
        // Index bits: enough for the largest index (at least one, so that slot 0 and a
        // generation never make 0xFFFF alone).
        let index_bits = (16 - (capacity - 1).leading_zeros()).max(1);
        let generation_step = 1u32 << index_bits;
        CidTable {
            // Generation 0: the id of slot i is i.
            slots: (0..capacity).map(|cid| Slot { cid, ..Slot::default() }).collect(),
            // Reversed, so slot 0 is popped first: ids start small, as a reader of a trace
            // expects.
            free: (0..capacity).rev().collect(),
            index_mask: (generation_step - 1) as u16,
            generation_step,
        }
    }

    /// How many commands may be in flight at once.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Commands in flight.
    #[inline]
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no slot is free.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// Takes a slot for a command with `tag` submitted at tick `now`
    /// ([`fp_bdev::clock::ticks::now`], read once per round by the caller); returns its command
    /// id, or `None` when every slot is in flight (the caller answers `Busy`).
    #[inline]
    pub fn alloc(&mut self, tag: u32, now: u64) -> Option<u16> {
        let index = self.free.pop()?;
        let slot = &mut self.slots[usize::from(index)];
        slot.busy = true;
        slot.tag = tag;
        slot.submitted = now;
        Some(slot.cid)
    }

    /// The slot index of command id `cid`, for per-slot memory a transport keeps beside the
    /// table (a PRP list page, a TCP request's iovecs). Meaningful only for an id this table
    /// handed out and has not completed; check with [`CidTable::lookup`] for ids a controller
    /// sent.
    #[inline]
    pub fn slot(&self, cid: u16) -> usize {
        usize::from(cid & self.index_mask)
    }

    /// The slot and tag of command id `cid` when it is in flight, without completing it (a
    /// TCP data PDU names a command before its completion does).
    #[inline]
    pub fn lookup(&self, cid: u16) -> Result<(usize, u32), CidError> {
        let index = self.slot(cid);
        let slot = self.slots.get(index).ok_or(CidError::Unknown(cid))?;
        if slot.cid != cid {
            return Err(CidError::Unknown(cid));
        }
        if !slot.busy {
            return Err(CidError::NotInFlight(cid));
        }
        Ok((index, slot.tag))
    }

    /// Completes command id `cid`: frees its slot and returns its tag. An id that is not in
    /// flight (unknown, of another generation, or completed already) is refused and changes
    /// nothing.
    #[inline]
    pub fn complete(&mut self, cid: u16) -> Result<u32, CidError> {
        let index = self.slot(cid);
        let step = self.generation_step;
        let Some(slot) = self.slots.get_mut(index) else { return Err(CidError::Unknown(cid)) };
        if slot.cid != cid {
            return Err(CidError::Unknown(cid));
        }
        if !slot.busy {
            return Err(CidError::NotInFlight(cid));
        }
        slot.busy = false;
        slot.cid = next_cid(cid, step);
        let tag = slot.tag;
        self.free.push(index as u16);
        Ok(tag)
    }

    /// The submission tick of command id `cid` when it is in flight.
    pub fn submitted_at(&self, cid: u16) -> Option<u64> {
        self.lookup(cid).ok().map(|(index, _)| self.slots[index].submitted)
    }

    /// Appends `(cid, tag)` of every command in flight submitted before tick
    /// `submitted_before`, for the timeout path ([`crate::transport::IoQueue::expired`]). A
    /// scan of the table: called at most every few milliseconds, not per I/O.
    pub fn expired(&self, submitted_before: u64, out: &mut Vec<(u16, u32)>) {
        for slot in self.slots.iter() {
            if slot.busy && slot.submitted < submitted_before {
                out.push((slot.cid, slot.tag));
            }
        }
    }

    /// Appends `(cid, tag)` of every command in flight, oldest submission first.
    pub fn in_flight_commands(&self, out: &mut Vec<(u16, u32)>) {
        let first = out.len();
        self.expired(u64::MAX, out);
        let slots = &self.slots;
        let mask = self.index_mask;
        out[first..].sort_by_key(|&(cid, _)| slots[usize::from(cid & mask)].submitted);
    }

    /// Forgets every command in flight, appending their tags to `out` (oldest submission
    /// first, so a resubmission keeps their order): after a reset or a lost connection nothing
    /// will complete them. Their ids become unknown: a completion that still arrives for one
    /// is refused.
    pub fn drain(&mut self, out: &mut Vec<u32>) {
        let mut busy: Vec<(u64, u16)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.busy)
            .map(|(i, s)| (s.submitted, i as u16))
            .collect();
        busy.sort_unstable();
        for (_, index) in busy {
            let slot = &mut self.slots[usize::from(index)];
            out.push(slot.tag);
            slot.busy = false;
            slot.cid = next_cid(slot.cid, self.generation_step);
            self.free.push(index);
        }
    }
}

/// The command id after `cid` for its slot: the next generation (wrapping), skipping FFFFh.
/// With an index of all 16 bits (`step` 1 << 16) the id stays as it is: no generation bits.
#[inline]
fn next_cid(cid: u16, step: u32) -> u16 {
    let next = (u32::from(cid) + step) as u16;
    if next == u16::MAX {
        // Generation 0 of the same slot.
        (u32::from(next) & (step - 1)) as u16
    } else {
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_taken_and_given_back() {
        let mut t = CidTable::new(4);
        let a = t.alloc(10, 1).unwrap();
        let b = t.alloc(11, 2).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.in_flight(), 2);
        assert_eq!(t.lookup(b), Ok((t.slot(b), 11)));
        assert_eq!(t.complete(a), Ok(10));
        assert_eq!(t.complete(b), Ok(11));
        assert_eq!(t.in_flight(), 0);
        for i in 0..4 {
            t.alloc(i, 0).unwrap();
        }
        assert!(t.is_full());
        assert_eq!(t.alloc(99, 0), None);
    }

    #[test]
    fn duplicate_and_unknown_completions_are_refused() {
        let mut t = CidTable::new(8);
        let a = t.alloc(1, 0).unwrap();
        assert_eq!(t.complete(a), Ok(1));
        // The same id again, slot still free: not in flight.
        assert!(t.complete(a).is_err());
        // The slot reused: the old id carries the old generation.
        let a2 = t.alloc(2, 0).unwrap();
        assert_eq!(t.slot(a2), t.slot(a));
        assert_ne!(a2, a);
        assert_eq!(t.complete(a), Err(CidError::Unknown(a)));
        assert_eq!(t.lookup(a), Err(CidError::Unknown(a)));
        // An index beyond the table.
        assert_eq!(t.complete(7 | 0x100), Err(CidError::Unknown(7 | 0x100)));
        assert_eq!(t.complete(0xffff), Err(CidError::Unknown(0xffff)));
        // Refusals changed nothing.
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.complete(a2), Ok(2));
    }

    #[test]
    fn cid_ffff_is_never_handed_out() {
        for cap in [1u16, 2, 3, 255, 256, 4096, 32768, 32769, 65535] {
            let mut t = CidTable::new(cap);
            // Every slot but the last in flight, so the last one is reused on each round and
            // its generation goes round its whole range (and more).
            for i in 0..cap - 1 {
                t.alloc(u32::from(i), 0).unwrap();
            }
            let rounds = 2 * ((1u32 << 16) / t.generation_step) + 1;
            for _ in 0..rounds {
                let id = t.alloc(7, 0).unwrap();
                assert_eq!(t.slot(id), usize::from(cap - 1));
                assert_ne!(id, 0xffff, "capacity {cap}");
                assert_eq!(t.complete(id), Ok(7));
            }
        }
    }

    #[test]
    fn expired_and_drain_see_what_is_in_flight() {
        let mut t = CidTable::new(16);
        let old = t.alloc(1, 100).unwrap();
        let mid = t.alloc(2, 200).unwrap();
        let new = t.alloc(3, 300).unwrap();
        t.complete(mid).unwrap();
        let mut out = Vec::new();
        t.expired(250, &mut out);
        assert_eq!(out, vec![(old, 1)]);
        assert_eq!(t.submitted_at(new), Some(300));
        let mut all = Vec::new();
        t.in_flight_commands(&mut all);
        assert_eq!(all, vec![(old, 1), (new, 3)]);
        let mut tags = Vec::new();
        t.drain(&mut tags);
        assert_eq!(tags, vec![1, 3]);
        assert_eq!(t.in_flight(), 0);
        // A completion arriving after the drain is refused.
        assert!(t.complete(old).is_err());
        assert!(t.complete(new).is_err());
    }
}
