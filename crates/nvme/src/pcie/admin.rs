//! The admin queue of the PCIe transport, on the controller's control-plane thread: one
//! command at a time run to completion (its data copied through two pages of DMA memory of
//! the queue's own), Asynchronous Event Requests left outstanding, registers read and written
//! in BAR0 directly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_nvme_spec::registers;
use fp_nvme_spec::{Cqe, Sqe};

use super::function::{Bar, DmaMemory, PciFunction};
use super::prp::PAGE;
use super::ring::{CqRing, Doorbell, ShadowPages, SqRing};
use crate::cmd;
use crate::transport::{AdminData, AdminQueue};
use crate::NvmeError;

/// The largest admin data transfer: two pages (PRP1 and PRP2, no list).
pub const ADMIN_DATA_MAX: usize = 2 * PAGE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CidState {
    Free,
    /// The command `execute` waits for.
    Waiting,
    /// An Asynchronous Event Request.
    Aer,
    /// A command `execute` gave up on: its completion, if it comes, is dropped.
    Abandoned,
}

/// What the transport learnt when it enabled the controller, kept for `connect_io`.
#[derive(Debug, Clone)]
pub struct ControllerFacts {
    /// CAP.
    pub cap: u64,
    /// Identify Controller's CNTLID.
    pub cntlid: u16,
    /// Identify Controller's MDTS (a power of two of 4 KiB pages; 0: no limit).
    pub mdts: u8,
    /// SGLs offered (Identify Controller SGLS bits 1:0 = 01b) and asked for.
    pub sgl: bool,
}

/// A PCIe controller's admin queue.
pub struct PcieAdmin<F: PciFunction> {
    pub(crate) function: Arc<F>,
    bar: Bar,
    sq: SqRing,
    cq: CqRing,
    sq_db: Doorbell<F>,
    cq_db: Doorbell<F>,
    cq_told: u16,
    cids: Vec<CidState>,
    next_cid: usize,
    data: DmaMemory,
    events: Vec<Cqe>,
    waited: Option<Cqe>,
    dead: Option<String>,
    pub(crate) facts: ControllerFacts,
    pub(crate) shadow: Option<Arc<ShadowPages>>,
}

impl<F: PciFunction> PcieAdmin<F> {
    /// An admin queue on rings the controller was given (AQA, ASQ, ACQ) before it was enabled.
    pub(crate) fn new(function: Arc<F>, sq: SqRing, cq: CqRing, cap: u64) -> Result<Self, NvmeError> {
        let dstrd = registers::cap_dstrd(cap);
        Ok(PcieAdmin {
            bar: function.bar0(),
            sq_db: Doorbell::new(function.clone(), dstrd, 0, None),
            cq_db: Doorbell::new(function.clone(), dstrd, 1, None),
            function,
            cids: vec![CidState::Free; sq.size() as usize - 1],
            sq,
            cq,
            cq_told: 0,
            next_cid: 0,
            data: DmaMemory::new(ADMIN_DATA_MAX)?,
            events: Vec::new(),
            waited: None,
            dead: None,
            facts: ControllerFacts { cap, cntlid: 0, mdts: 0, sgl: false },
            shadow: None,
        })
    }

    /// Uses shadow doorbells from now on (after a successful Doorbell Buffer Config).
    pub(crate) fn use_shadow(&mut self, pages: Arc<ShadowPages>) {
        let dstrd = registers::cap_dstrd(self.facts.cap);
        self.sq_db = Doorbell::new(self.function.clone(), dstrd, 0, Some(&pages));
        self.cq_db = Doorbell::new(self.function.clone(), dstrd, 1, Some(&pages));
        // The shadow entries start where the registers are.
        self.sq_db.ring(self.sq_tail(), self.sq_tail(), self.sq.size());
        self.cq_db.ring(self.cq_told, self.cq_told, self.cq.size());
        self.shadow = Some(pages);
    }

    fn sq_tail(&self) -> u16 {
        self.sq.tail()
    }

    fn alive(&self) -> Result<(), NvmeError> {
        match &self.dead {
            Some(m) => Err(NvmeError::Protocol(m.clone())),
            None => Ok(()),
        }
    }

    fn gone_check(&mut self) -> Result<(), NvmeError> {
        let csts = self.bar.read32(registers::CSTS);
        if registers::is_gone(csts) {
            return Err(NvmeError::Gone(format!(
                "{}: the device reads all ones (removed)",
                self.function.address()
            )));
        }
        if csts & registers::CSTS_CFS != 0 {
            return Err(NvmeError::Gone(format!(
                "{}: controller fatal status (CSTS.CFS)",
                self.function.address()
            )));
        }
        Ok(())
    }

    fn send(&mut self, sqe: &Sqe, state: CidState, data: Option<(u64, usize)>) -> Result<u16, NvmeError> {
        self.alive()?;
        let n = self.cids.len();
        let cid = (0..n)
            .map(|i| (self.next_cid + i) % n)
            .find(|&c| self.cids[c] == CidState::Free)
            .ok_or_else(|| NvmeError::Protocol("no free admin command ID".into()))?;
        if self.sq.full() {
            return Err(NvmeError::Protocol("the admin submission queue is full".into()));
        }
        self.next_cid = (cid + 1) % n;
        let (entry, _) = self.sq.push(sqe);
        entry.set_cid(cid as u16);
        if let Some((iova, len)) = data {
            entry.set_psdt(0);
            entry.set_prp(iova, if len > PAGE { iova + PAGE as u64 } else { 0 });
        }
        self.cids[cid] = state;
        if let Some((old, new)) = self.sq.pending() {
            self.sq_db.ring(old, new, self.sq.size());
            self.sq.mark_rung();
        }
        Ok(cid as u16)
    }

    fn take(&mut self, c: Cqe) -> Result<(), NvmeError> {
        self.sq.update_head(c.sqhd)?;
        let cqe = Cqe { dw0: c.dw0, dw1: c.dw1, sqhd: c.sqhd, sqid: c.sqid, cid: c.cid, status: c.status };
        match self.cids.get(c.cid as usize).copied() {
            Some(CidState::Waiting) => self.waited = Some(cqe),
            Some(CidState::Aer) => self.events.push(cqe),
            Some(CidState::Abandoned) => {}
            _ => {
                return Err(NvmeError::Protocol(format!(
                    "admin completion for command {} not in flight",
                    c.cid
                )))
            }
        }
        self.cids[c.cid as usize] = CidState::Free;
        Ok(())
    }

    fn reap(&mut self) -> Result<(), NvmeError> {
        self.alive()?;
        while let Some(c) = self.cq.pop() {
            if let Err(e) = self.take(c) {
                self.dead = Some(e.to_string());
                return Err(e);
            }
        }
        if let Some((old, new)) = self.cq.take_reaped(self.cq_told) {
            self.cq_db.ring(old, new, self.cq.size());
            self.cq_told = new;
        }
        Ok(())
    }
}

impl<F: PciFunction> AdminQueue for PcieAdmin<F> {
    fn execute(&mut self, sqe: Sqe, data: AdminData<'_>, timeout: Duration) -> Result<Cqe, NvmeError> {
        let len = match &data {
            AdminData::None => 0,
            AdminData::FromDevice(b) => b.len(),
            AdminData::ToDevice(b) => b.len(),
        };
        if len > ADMIN_DATA_MAX {
            return Err(NvmeError::InvalidParam {
                field: "data",
                reason: format!("{len} bytes of admin data, at most {ADMIN_DATA_MAX}"),
            });
        }
        match &data {
            AdminData::ToDevice(b) => self.data.as_mut_slice()[..len].copy_from_slice(b),
            AdminData::FromDevice(_) => self.data.as_mut_slice()[..len].fill(0),
            AdminData::None => {}
        }
        let dptr = (len > 0).then(|| (self.data.iova(), len));
        self.waited = None;
        let cid = self.send(&sqe, CidState::Waiting, dptr)?;
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            self.reap()?;
            if let Some(c) = self.waited.take() {
                if let AdminData::FromDevice(b) = data {
                    b.copy_from_slice(&self.data.as_slice()[..len]);
                }
                return Ok(c);
            }
            if Instant::now() >= deadline {
                self.cids[cid as usize] = CidState::Abandoned;
                if len > 0 {
                    // The controller may still write the abandoned command's data: a fresh page
                    // for the next command, and the old one unregistered (unmapped), so a late
                    // transfer faults rather than lands in another command's data.
                    self.data = DmaMemory::new(ADMIN_DATA_MAX)?;
                }
                self.gone_check()?;
                return Err(NvmeError::Timeout(format!("admin command {:#04x}", sqe.opcode())));
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                if spins % 64 == 0 {
                    self.gone_check()?;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    fn submit_async_event_request(&mut self) -> Result<(), NvmeError> {
        self.send(&cmd::async_event_request(), CidState::Aer, None).map(|_| ())
    }

    fn poll_async_events(&mut self, out: &mut Vec<Cqe>) -> Result<(), NvmeError> {
        self.reap()?;
        if self.waited.take().is_some() {
            // Only `execute` waits, and it returned: nothing else may complete as Waiting.
            return Err(NvmeError::Protocol("admin completion outside a command".into()));
        }
        out.append(&mut self.events);
        Ok(())
    }

    /// A removed device reads all ones: a read that gives all ones checks CSTS and answers
    /// [`NvmeError::Gone`] when that is all ones too.
    fn get_property(&mut self, offset: u32, eight_bytes: bool) -> Result<u64, NvmeError> {
        let v = if eight_bytes { self.bar.read64(offset) } else { u64::from(self.bar.read32(offset)) };
        if registers::is_gone(v as u32) && registers::is_gone(self.bar.read32(registers::CSTS)) {
            return Err(NvmeError::Gone(format!(
                "{}: the device reads all ones (removed)",
                self.function.address()
            )));
        }
        Ok(v)
    }

    fn set_property(&mut self, offset: u32, value: u64, eight_bytes: bool) -> Result<(), NvmeError> {
        if eight_bytes {
            self.bar.write64(offset, value);
        } else {
            self.bar.write32(offset, value as u32);
        }
        Ok(())
    }

    fn cntlid(&self) -> u16 {
        self.facts.cntlid
    }
}
