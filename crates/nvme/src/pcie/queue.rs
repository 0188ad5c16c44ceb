//! An I/O queue pair of the PCIe transport, owned and polled by one reactor: the submission
//! ring, the completion ring read by phase bit, one command ID per ring slot with a
//! preallocated PRP list (or SGL segment) page each, and a small bounce pool for buffers the
//! device cannot reach or PRPs cannot describe. One SQ doorbell per [`IoQueue::flush`], one CQ
//! doorbell per [`IoQueue::poll`] that reaped; no locks and no allocation per command.
//!
//! A controller that breaks the protocol (a completion for a command ID not in flight, twice,
//! for a command it has not fetched, an SQ head outside the window it was given) kills the
//! queue: [`IoQueue::poll`] returns [`NvmeError::Protocol`] and every tag comes back through
//! [`IoQueue::drain`].

use std::sync::Arc;

use fp_bdev::clock::ticks;
use fp_bdev::dma::{memory_map, Translator};
use fp_bdev::{Iovecs, SubmitError};
use fp_nvme_spec::registers;
use fp_nvme_spec::{Cqe, Sqe, Status};

use super::function::{Bar, DmaMemory, PciFunction};
use super::prp::{self, Unfit, PAGE, PRP_LIST_ENTRIES, SGL_SEGMENT_DESCRIPTORS};
use super::ring::{CqRing, Doorbell, ShadowPages, SqRing};
use crate::cid::CidTable;
use crate::transport::{IoQueue, QueueStats};
use crate::NvmeError;

const NO_BOUNCE: u16 = u16::MAX;
/// Empty polls with commands in flight between two CSTS reads (a removed device reads all
/// ones; a BAR read costs a round trip to the device, so not on every poll).
const CSTS_CHECK_EVERY: u32 = 256;

/// What the queue keeps per command slot beside the command-id table: where the command sits
/// in the submission ring and its bounce buffer.
#[derive(Clone, Copy)]
struct Side {
    sq_pos: u16,
    bounce: u16,
}

/// Buffers of the queue's own DMA memory for requests whose memory the device cannot reach.
struct BouncePool {
    mem: DmaMemory,
    slot_len: usize,
    free: Vec<u16>,
    /// Per buffer: the caller's iovecs to copy back into on completion (reads); empty for
    /// writes. Capacity kept across uses.
    copy_back: Vec<Vec<(usize, usize)>>,
}

/// Why the queue died.
#[derive(Debug, Clone)]
enum Dead {
    Protocol(String),
    Gone(String),
}

impl Dead {
    fn error(&self) -> NvmeError {
        match self {
            Dead::Protocol(m) => NvmeError::Protocol(m.clone()),
            Dead::Gone(m) => NvmeError::Gone(m.clone()),
        }
    }
}

/// The rings and memory of one I/O queue pair, made by the transport before the controller
/// is told of them (Create I/O Completion / Submission Queue).
pub(crate) struct QueueMemory {
    pub(crate) sq: SqRing,
    pub(crate) cq: CqRing,
}

impl QueueMemory {
    pub(crate) fn new(depth: u16) -> Result<QueueMemory, NvmeError> {
        Ok(QueueMemory { sq: SqRing::new(depth)?, cq: CqRing::new(depth)? })
    }
}

/// What shapes an I/O queue beyond its rings.
pub(crate) struct QueueParams<F: PciFunction> {
    pub(crate) function: Arc<F>,
    pub(crate) qid: u16,
    pub(crate) dstrd: u32,
    pub(crate) shadow: Option<Arc<ShadowPages>>,
    pub(crate) sgl: bool,
    pub(crate) bounce_buffers: u16,
    pub(crate) bounce_len: usize,
}

/// One I/O queue pair over a PCIe function.
pub struct PcieIoQueue<F: PciFunction> {
    qid: u16,
    sq: SqRing,
    cq: CqRing,
    sq_db: Doorbell<F>,
    cq_db: Doorbell<F>,
    cq_told: u16,
    cids: CidTable,
    side: Box<[Side]>,
    lists: DmaMemory,
    translator: Translator,
    sgl: bool,
    bounce: BouncePool,
    stats: QueueStats,
    dead: Option<Dead>,
    /// Tags of completions reaped in a poll that then failed: handed back by `drain`.
    orphaned: Vec<u32>,
    bar: Bar,
    idle_polls: u32,
    /// The submission time of the batch being built ([`ticks::now`]), read at its first submit.
    stamp: u64,
    stamp_fresh: bool,
}

/// A command's data pointer: PRP1 and PRP2, or one SGL descriptor.
#[derive(Clone, Copy)]
enum DataPointer {
    Prp(u64, u64),
    Sgl([u8; 16]),
}

impl<F: PciFunction> PcieIoQueue<F> {
    pub(crate) fn new(mem: QueueMemory, p: QueueParams<F>) -> Result<PcieIoQueue<F>, NvmeError> {
        // One command ID per ring entry but one: a full ring keeps one entry empty.
        let cids = mem.sq.size() as usize - 1;
        let bounce_len = p.bounce_len.next_multiple_of(PAGE);
        Ok(PcieIoQueue {
            qid: p.qid,
            sq_db: Doorbell::new(p.function.clone(), p.dstrd, 2 * u32::from(p.qid), p.shadow.as_ref()),
            cq_db: Doorbell::new(p.function.clone(), p.dstrd, 2 * u32::from(p.qid) + 1, p.shadow.as_ref()),
            bar: p.function.bar0(),
            sq: mem.sq,
            cq: mem.cq,
            cq_told: 0,
            cids: CidTable::new(cids as u16),
            side: vec![Side { sq_pos: 0, bounce: NO_BOUNCE }; cids].into(),
            lists: DmaMemory::new(cids * PAGE)?,
            translator: memory_map().translator(),
            sgl: p.sgl,
            bounce: BouncePool {
                mem: DmaMemory::new(p.bounce_buffers as usize * bounce_len)?,
                slot_len: bounce_len,
                free: (0..p.bounce_buffers).rev().collect(),
                copy_back: (0..p.bounce_buffers).map(|_| Vec::with_capacity(16)).collect(),
            },
            stats: QueueStats::default(),
            dead: None,
            orphaned: Vec::with_capacity(cids),
            idle_polls: 0,
            stamp: 0,
            stamp_fresh: false,
        })
    }

    /// Builds the data pointer of the command in slot `slot` from the caller's memory, or returns why it
    /// must be bounced.
    #[inline]
    fn describe(&mut self, slot: usize, iov: &[libc::iovec]) -> Result<DataPointer, Unfit> {
        let off = slot * PAGE;
        let page_iova = self.lists.iova() + off as u64;
        // SAFETY: page `slot` of the list memory is this command's alone while it is in
        // flight; u64 and 16-byte arrays fit its alignment and size.
        let page = unsafe { self.lists.as_ptr().add(off) };
        // SAFETY: as above.
        let list = unsafe { &mut *(page as *mut [u64; PRP_LIST_ENTRIES]) };
        match prp::build_prps(iov, &mut self.translator, list, page_iova) {
            Ok((p1, p2)) => Ok(DataPointer::Prp(p1, p2)),
            Err(Unfit::Shape) if self.sgl => {
                // SAFETY: as above.
                let seg = unsafe { &mut *(page as *mut [[u8; 16]; SGL_SEGMENT_DESCRIPTORS]) };
                Ok(DataPointer::Sgl(prp::build_sgl(iov, &mut self.translator, seg, page_iova)?))
            }
            Err(e) => Err(e),
        }
    }

    /// Copies a request through a bounce buffer: for a write now, for a read on completion.
    ///
    /// # Safety
    /// The buffers of `iov` stay valid until the completion (what the [`Iovecs`] given to
    /// [`IoQueue::submit`] vouch for).
    unsafe fn bounce_in(
        &mut self,
        opcode: u8,
        slot: usize,
        iov: &[libc::iovec],
    ) -> Result<(DataPointer, u16), SubmitError> {
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        if total > self.bounce.slot_len {
            return Err(SubmitError::Unsupported);
        }
        let b = self.bounce.free.pop().ok_or(SubmitError::Busy)?;
        let off = b as usize * self.bounce.slot_len;
        // SAFETY: buffer `b` is this request's alone until its completion.
        let dst = unsafe { self.bounce.mem.as_ptr().add(off) };
        let copy_back = &mut self.bounce.copy_back[b as usize];
        copy_back.clear();
        let mut at = 0;
        for v in iov {
            // Opcode bits 1:0 give the data direction (Base 5, Figure 138): 01b to the
            // controller, 10b from it.
            if opcode & 1 != 0 {
                // SAFETY: the caller's buffer is readable (submit's contract); the bounce
                // buffer holds `total` bytes.
                unsafe { std::ptr::copy_nonoverlapping(v.iov_base as *const u8, dst.add(at), v.iov_len) };
            }
            if opcode & 2 != 0 {
                copy_back.push((v.iov_base as usize, v.iov_len));
            }
            at += v.iov_len;
        }
        let one = [libc::iovec { iov_base: dst as *mut libc::c_void, iov_len: total }];
        let Ok(d) = self.describe(slot, &one) else {
            // The bounce memory is registered and contiguous: PRPs always describe it.
            self.bounce.free.push(b);
            return Err(SubmitError::Unsupported);
        };
        self.stats.bounced += 1;
        Ok((d, b))
    }

    fn release_bounce(&mut self, b: u16, copy: bool) {
        if b == NO_BOUNCE {
            return;
        }
        if copy {
            // SAFETY: the device is done with buffer `b` (its command completed).
            let mut src =
                unsafe { self.bounce.mem.as_ptr().add(b as usize * self.bounce.slot_len) as *const u8 };
            for &(dst, len) in &self.bounce.copy_back[b as usize] {
                // SAFETY: the caller's read buffer stays valid and ours until the completion
                // is returned (submit's contract).
                unsafe {
                    std::ptr::copy_nonoverlapping(src, dst as *mut u8, len);
                    src = src.add(len);
                }
            }
        }
        self.bounce.free.push(b);
    }

    fn die(&mut self, why: Dead) -> NvmeError {
        let e = why.error();
        self.dead = Some(why);
        e
    }

    #[inline]
    fn complete(&mut self, c: Cqe, out: &mut Vec<(u32, Status)>) -> Result<(), NvmeError> {
        if c.sqid != self.qid {
            return Err(NvmeError::Protocol(format!("completion for SQ {} on queue {}", c.sqid, self.qid)));
        }
        self.sq.update_head(c.sqhd)?;
        // Unknown, of an old generation, or completed already: refused by the table.
        let side = self.side.get(self.cids.slot(c.cid)).copied();
        let tag = self.cids.complete(c.cid)?;
        let side = side.unwrap_or(Side { sq_pos: 0, bounce: NO_BOUNCE });
        if self.sq.unfetched(side.sq_pos) {
            // The queue dies; the command goes back with the others through `drain`.
            self.orphaned.push(tag);
            return Err(NvmeError::Protocol(format!(
                "completion for command {:#x} the controller has not fetched (queue {})",
                c.cid, self.qid
            )));
        }
        self.stats.completed += 1;
        self.release_bounce(side.bounce, c.status.is_success());
        out.push((tag, c.status));
        Ok(())
    }

    fn check_status(&mut self) -> Result<(), NvmeError> {
        let csts = self.bar.read32(registers::CSTS);
        if registers::is_gone(csts) {
            return Err(self.die(Dead::Gone("the device reads all ones (removed)".into())));
        }
        if csts & registers::CSTS_CFS != 0 {
            return Err(self.die(Dead::Gone("controller fatal status (CSTS.CFS)".into())));
        }
        Ok(())
    }
}

impl<F: PciFunction> IoQueue for PcieIoQueue<F> {
    fn qid(&self) -> u16 {
        self.qid
    }

    /// A dead queue answers [`SubmitError::Busy`] (its owner drains it on the poll error).
    #[inline]
    fn submit(&mut self, sqe: &Sqe, iov: Iovecs, tag: u32) -> Result<(), SubmitError> {
        let iov = iov.as_slice();
        if self.dead.is_some() || self.sq.full() || self.cids.is_full() {
            return Err(SubmitError::Busy);
        }
        // One clock read per batch: a command's submission time is its batch's first submit
        // (the same poll round), ample for timeouts of milliseconds and more.
        if !self.stamp_fresh {
            self.stamp = ticks::now();
            self.stamp_fresh = true;
        }
        let cid = self.cids.alloc(tag, self.stamp).ok_or(SubmitError::Busy)?;
        let slot = self.cids.slot(cid);
        let (dptr, bounce) = match self.describe(slot, iov) {
            Ok(d) => (d, NO_BOUNCE),
            // SAFETY: the buffers stay valid until the completion (what `Iovecs` vouch for).
            Err(_) => match unsafe { self.bounce_in(sqe.opcode(), slot, iov) } {
                Ok(b) => b,
                Err(e) => {
                    // Not sent: the slot goes back (its next id has a new generation).
                    let _ = self.cids.complete(cid);
                    return Err(e);
                }
            },
        };
        // The ring entry is written only once the command is sure to go.
        let (entry, pos) = self.sq.push(sqe);
        entry.set_cid(cid);
        match dptr {
            DataPointer::Prp(p1, p2) => {
                entry.set_psdt(0);
                entry.set_prp(p1, p2);
            }
            DataPointer::Sgl(d) => {
                entry.set_psdt(1);
                entry.set_sgl(d);
            }
        }
        self.side[slot] = Side { sq_pos: pos, bounce };
        self.stats.submitted += 1;
        Ok(())
    }

    #[inline]
    fn flush(&mut self) {
        self.stamp_fresh = false;
        if let Some((old, new)) = self.sq.pending() {
            if self.dead.is_none() && self.sq_db.ring(old, new, self.sq.size()) {
                self.stats.doorbells += 1;
            }
            self.sq.mark_rung();
        }
    }

    #[inline]
    fn poll(&mut self, out: &mut Vec<(u32, Status)>) -> Result<usize, NvmeError> {
        if let Some(d) = &self.dead {
            return Err(d.error());
        }
        let start = out.len();
        while let Some(c) = self.cq.pop() {
            if let Err(e) = self.complete(c, out) {
                // Nothing of a failed poll counts: its completions go back through `drain`
                // with the rest (reads and writes may be sent again).
                self.orphaned.extend(out.drain(start..).map(|(t, _)| t));
                self.dead = Some(match &e {
                    NvmeError::Gone(m) => Dead::Gone(m.clone()),
                    other => Dead::Protocol(other.to_string()),
                });
                return Err(e);
            }
        }
        let n = out.len() - start;
        if let Some((old, new)) = self.cq.take_reaped(self.cq_told) {
            if self.cq_db.ring(old, new, self.cq.size()) {
                self.stats.doorbells += 1;
            }
            self.cq_told = new;
        }
        if n == 0 && self.cids.in_flight() > 0 {
            self.idle_polls += 1;
            if self.idle_polls % CSTS_CHECK_EVERY == 0 {
                self.check_status()?;
            }
        } else {
            self.idle_polls = 0;
        }
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.cids.in_flight()
    }

    fn expired(&self, submitted_before: u64, out: &mut Vec<(u16, u32)>) {
        self.cids.expired(submitted_before, out);
    }

    /// Bounce buffers of drained commands are not handed out again (the device may still
    /// write them): a drained queue is not used again.
    fn drain(&mut self, out: &mut Vec<u32>) {
        self.cids.drain(out);
        out.append(&mut self.orphaned);
        if self.dead.is_none() {
            self.dead = Some(Dead::Protocol("the queue was drained".into()));
        }
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }
}
