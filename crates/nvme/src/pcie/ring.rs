//! The rings and doorbells the admin queue and the I/O queues share: a submission ring whose
//! head the controller reports in each completion, a completion ring read by phase bit (Base
//! 3.3.1), and a doorbell that is a BAR0 register or, after Doorbell Buffer Config, a shadow
//! entry in memory with an event index (Base 5.8).

use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use fp_nvme_spec::registers;
use fp_nvme_spec::{Cqe, Sqe, CQE_LEN, SQE_LEN};

use super::function::{Bar, DmaMemory, PciFunction};
use crate::NvmeError;

/// The shadow doorbell page and the event index page given to the controller by Doorbell
/// Buffer Config: entry `i` of each mirrors doorbell `i` (same stride as BAR0's doorbells).
pub struct ShadowPages {
    shadow: DmaMemory,
    eventidx: DmaMemory,
    stride_words: usize,
}

// SAFETY: the pages are written only through the doorbells, each owned by one queue (one
// thread at a time); the struct itself is never mutated after it is made.
unsafe impl Sync for ShadowPages {}
// SAFETY: as above; the memory is owned, not tied to a thread.
unsafe impl Send for ShadowPages {}

impl ShadowPages {
    /// Two zeroed pages for a controller with doorbell stride exponent `dstrd`.
    pub fn new(dstrd: u32) -> Result<ShadowPages, NvmeError> {
        Ok(ShadowPages {
            shadow: DmaMemory::new(super::prp::PAGE)?,
            eventidx: DmaMemory::new(super::prp::PAGE)?,
            stride_words: 1 << dstrd,
        })
    }

    /// IOVAs of the shadow page and the event index page.
    pub fn iovas(&self) -> (u64, u64) {
        (self.shadow.iova(), self.eventidx.iova())
    }

    /// Zeroes the shadow and event-index entries of queue `qid`'s two doorbells, before the
    /// queue is created: a queue made again with the ID of a deleted one must not inherit its
    /// tail and event index (with a stale event index ahead of the new tail, no register write
    /// would ever be due and the controller would never fetch the commands).
    pub fn clear_queue(&self, qid: u16) {
        for index in [2 * u32::from(qid), 2 * u32::from(qid) + 1] {
            if let Some((shadow, event)) = self.entry(index) {
                // SAFETY: valid entries (`entry`); the controller does not use them for a queue
                // that does not exist yet.
                unsafe {
                    std::ptr::write_volatile(shadow.as_ptr(), 0);
                    std::ptr::write_volatile(event.as_ptr(), 0);
                }
            }
        }
    }

    /// The shadow and event-index entries of doorbell `index` (2y: SQ y tail, 2y+1: CQ y
    /// head), if the pages hold it.
    fn entry(&self, index: u32) -> Option<(NonNull<u32>, NonNull<u32>)> {
        let word = index as usize * self.stride_words;
        if (word + 1) * 4 > self.shadow.len() {
            return None;
        }
        // SAFETY: inside both pages (checked above); each page lives as long as `self`, which
        // the doorbell keeps by its `Arc`.
        unsafe {
            Some((
                NonNull::new_unchecked((self.shadow.as_ptr() as *mut u32).add(word)),
                NonNull::new_unchecked((self.eventidx.as_ptr() as *mut u32).add(word)),
            ))
        }
    }
}

/// Whether a doorbell write from `old` to `new` passes the controller's event index `event`
/// (virtio's `vring_need_event`, modulo the ring size): the controller asked to be told once
/// the index moves past `event`.
#[inline]
pub fn need_event(event: u16, new: u16, old: u16, size: u16) -> bool {
    if event >= size {
        // A nonsense index: write the register, as without shadows.
        return true;
    }
    let dist = |from: u16, to: u16| (u32::from(to) + u32::from(size) - u32::from(from)) % u32::from(size);
    // `event` lies in [old, new).
    dist(old, event) < dist(old, new)
}

/// One doorbell of one queue.
pub struct Doorbell<F: PciFunction> {
    function: Arc<F>,
    bar: Bar,
    offset: u32,
    shadow: Option<(NonNull<u32>, NonNull<u32>, Arc<ShadowPages>)>,
    /// Admin doorbells go to BAR0 even with shadows (the shadow is kept too): controllers
    /// differ on whether the admin queue uses the shadow.
    always_mmio: bool,
}

// SAFETY: the shadow pointers point into pages the `Arc` keeps; one queue (one thread at a
// time) writes a given doorbell.
unsafe impl<F: PciFunction> Send for Doorbell<F> {}

impl<F: PciFunction> Doorbell<F> {
    /// Doorbell `index` (2y or 2y+1) of a controller with stride exponent `dstrd`.
    pub fn new(function: Arc<F>, dstrd: u32, index: u32, shadow: Option<&Arc<ShadowPages>>) -> Self {
        let bar = function.bar0();
        let shadow = shadow.and_then(|s| s.entry(index).map(|(a, b)| (a, b, s.clone())));
        Doorbell {
            function,
            bar,
            offset: registers::DOORBELLS + index * (4 << dstrd),
            shadow,
            always_mmio: index < 2,
        }
    }

    /// Tells the controller the index moved from `old` to `new`; returns whether BAR0 was
    /// written (the statistic).
    #[inline]
    pub fn ring(&self, old: u16, new: u16, size: u16) -> bool {
        if let Some((shadow, event, _)) = &self.shadow {
            // SAFETY: the entries are valid (`ShadowPages::entry`); the controller reads and
            // writes them concurrently, hence volatile accesses.
            let ev = unsafe {
                std::ptr::write_volatile(shadow.as_ptr(), u32::from(new).to_le());
                // The shadow write must be visible before the event index is read, as the
                // controller writes the index before reading the shadow (Base 5.8).
                fence(Ordering::SeqCst);
                u32::from_le(std::ptr::read_volatile(event.as_ptr()))
            };
            if !self.always_mmio && !need_event(ev as u16, new, old, size) {
                return false;
            }
        }
        self.bar.write32(self.offset, u32::from(new));
        self.function.doorbell_rung(self.offset, u32::from(new));
        true
    }
}

/// A submission ring: entries are written at `tail`, the controller is told `rung`, and it
/// reports in each completion how far it has fetched (`head`).
pub struct SqRing {
    mem: DmaMemory,
    size: u16,
    tail: u16,
    rung: u16,
    head: u16,
    /// Entries the controller was told of and has not reported fetched: from head to rung.
    given: u16,
}

impl SqRing {
    /// A ring of `size` entries.
    pub fn new(size: u16) -> Result<SqRing, NvmeError> {
        Ok(SqRing {
            mem: DmaMemory::new(size as usize * SQE_LEN)?,
            size,
            tail: 0,
            rung: 0,
            head: 0,
            given: 0,
        })
    }

    /// The ring's IOVA.
    pub fn iova(&self) -> u64 {
        self.mem.iova()
    }

    /// Entries in the ring.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The index the next entry goes to.
    pub fn tail(&self) -> u16 {
        self.tail
    }

    /// Whether no entry is free (one is always left empty: head == tail means empty).
    #[inline]
    pub fn full(&self) -> bool {
        self.next(self.tail) == self.head
    }

    #[inline]
    fn next(&self, i: u16) -> u16 {
        if i + 1 == self.size {
            0
        } else {
            i + 1
        }
    }

    /// Copies `sqe` into the entry at the tail and returns that entry, for the caller to set
    /// its command ID and data pointer, and its position. The caller checked [`SqRing::full`].
    #[inline]
    pub fn push(&mut self, sqe: &Sqe) -> (&mut Sqe, u16) {
        let at = self.tail;
        self.tail = self.next(at);
        // SAFETY: `at < size`, inside the ring; `Sqe` is 64 bytes of alignment 1; the entry
        // is the driver's until the doorbell passes it.
        let slot = unsafe { &mut *(self.mem.as_ptr().add(at as usize * SQE_LEN) as *mut Sqe) };
        slot.0 = sqe.0;
        (slot, at)
    }

    /// Whether entries were pushed since the last doorbell; then the old and new tail.
    #[inline]
    pub fn pending(&self) -> Option<(u16, u16)> {
        (self.tail != self.rung).then_some((self.rung, self.tail))
    }

    /// Records that the controller was told the tail.
    #[inline]
    pub fn mark_rung(&mut self) {
        self.given += self.dist(self.rung, self.tail);
        self.rung = self.tail;
    }

    /// Entries from `from` forward to `to` around the ring.
    #[inline]
    fn dist(&self, from: u16, to: u16) -> u16 {
        if to >= from {
            to - from
        } else {
            to + (self.size - from)
        }
    }

    /// Takes the controller's new head from a completion: it must lie between the known head
    /// and the tail the controller was told (it cannot fetch what it was not given).
    #[inline]
    pub fn update_head(&mut self, sqhd: u16) -> Result<(), NvmeError> {
        let fetched = self.dist(self.head, sqhd);
        if sqhd >= self.size || fetched > self.given {
            return Err(NvmeError::Protocol(format!(
                "SQ head {sqhd} outside the fetchable window {}..={} of a {}-entry queue",
                self.head, self.rung, self.size
            )));
        }
        self.head = sqhd;
        self.given -= fetched;
        Ok(())
    }

    /// Whether the entry at `pos` is still waiting to be fetched (between head and the told
    /// tail): a completion for it means the controller made it up.
    #[inline]
    pub fn unfetched(&self, pos: u16) -> bool {
        self.dist(self.head, pos) < self.given
    }
}

/// A completion ring read by phase bit.
pub struct CqRing {
    mem: DmaMemory,
    size: u16,
    head: u16,
    phase: bool,
    reaped: bool,
}

impl CqRing {
    /// A ring of `size` entries (zeroed: phase 0, so the first lap's tag is 1).
    pub fn new(size: u16) -> Result<CqRing, NvmeError> {
        Ok(CqRing {
            mem: DmaMemory::new(size as usize * CQE_LEN)?,
            size,
            head: 0,
            phase: true,
            reaped: false,
        })
    }

    /// The ring's IOVA.
    pub fn iova(&self) -> u64 {
        self.mem.iova()
    }

    /// The next completion if the controller posted it (its phase tag is this lap's), and
    /// moves past it.
    #[inline]
    pub fn pop(&mut self) -> Option<Cqe> {
        // SAFETY: `head < size`, inside the ring; the device writes entries concurrently,
        // so they are read with volatile loads, dword 3 (with the phase tag) first.
        let base = unsafe { self.mem.as_ptr().add(self.head as usize * CQE_LEN) as *const u32 };
        // SAFETY: as above; four aligned dwords.
        let dw3 = u32::from_le(unsafe { std::ptr::read_volatile(base.add(3)) });
        if (dw3 & (1 << 16) != 0) != self.phase {
            return None;
        }
        // The rest of the entry is read only after its phase tag said it is complete.
        fence(Ordering::Acquire);
        // SAFETY: as above.
        let (dw0, dw1, dw2) = unsafe {
            (
                u32::from_le(std::ptr::read_volatile(base)),
                u32::from_le(std::ptr::read_volatile(base.add(1))),
                u32::from_le(std::ptr::read_volatile(base.add(2))),
            )
        };
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
            self.phase = !self.phase;
        }
        self.reaped = true;
        Some(Cqe::from_dwords(dw0, dw1, dw2, dw3))
    }

    /// If completions were reaped since the last call: the head to tell the controller, and
    /// the one it was last told.
    #[inline]
    pub fn take_reaped(&mut self, last_told: u16) -> Option<(u16, u16)> {
        std::mem::take(&mut self.reaped).then_some((last_told, self.head))
    }

    /// Entries in the ring.
    pub fn size(&self) -> u16 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_index_rule() {
        // The controller asked to hear of index 5: a move from 3 to 7 passes it, 6 to 7 not.
        assert!(need_event(5, 7, 3, 16));
        assert!(!need_event(5, 7, 6, 16));
        assert!(need_event(5, 6, 5, 16));
        // Around the wrap.
        assert!(need_event(15, 1, 14, 16));
        assert!(!need_event(13, 1, 14, 16));
        // An index one behind the controller's position means "do not tell me".
        assert!(!need_event(2, 9, 3, 16));
        assert!(need_event(99, 1, 0, 16), "a nonsense index rings the register");
    }
}
