//! The emulated controller's device thread: it watches CC (enable, disable, shutdown), reads
//! the doorbells (BAR0, or the shadow page after Doorbell Buffer Config), fetches commands,
//! hands them to [`super::admin`] or [`super::io`], and posts completions with the phase tag
//! (Base 3.3.1). It spins briefly after work and then sleeps, woken early by a doorbell write
//! ([`crate::pcie::PciFunction::doorbell_rung`]), so an idle controller costs no core.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::dma::memory_map;
use fp_nvme_spec::registers;
use fp_nvme_spec::{Sqe, Status, SQE_LEN};

use super::config::Fault;
use super::shared::{Shared, BAR_LEN};

/// How long the thread spins after its last work before sleeping.
const SPIN: Duration = Duration::from_micros(30);
/// How long it sleeps when nothing wakes it (CC changes do not).
const NAP: Duration = Duration::from_micros(80);
/// Commands taken from one queue per round, so no queue starves the others.
const BURST: usize = 64;
/// The page size (CC.MPS = 0 is all the emulation takes).
pub(crate) const PAGE: u64 = 4096;

pub(crate) struct Sq {
    pub(crate) iova: u64,
    pub(crate) size: u16,
    pub(crate) head: u16,
    pub(crate) cqid: u16,
    /// Created after Doorbell Buffer Config: its tail is read from the shadow page.
    pub(crate) shadow: bool,
}

pub(crate) struct Cq {
    pub(crate) iova: u64,
    pub(crate) size: u16,
    pub(crate) tail: u16,
    pub(crate) phase: bool,
    pub(crate) shadow: bool,
}

/// A command fetched and not answered ([`Fault::StopAnswering`]): Abort finds it.
#[derive(Clone, Copy)]
pub(crate) struct Held {
    pub(crate) sqid: u16,
    pub(crate) cid: u16,
}

/// What executing a command produced.
pub(crate) enum Outcome {
    /// Complete it now.
    Done(Status, u32),
    /// Completed later (an Asynchronous Event Request).
    Later,
}

pub(crate) struct Device {
    pub(crate) sh: Arc<Shared>,
    pub(crate) enabled: bool,
    shutdown: bool,
    pub(crate) sqs: Vec<Option<Sq>>,
    pub(crate) cqs: Vec<Option<Cq>>,
    /// Shadow doorbell page and event index page (IOVAs).
    pub(crate) dbbuf: Option<(u64, u64)>,
    pub(crate) aers: Vec<u16>,
    pub(crate) held: Vec<Held>,
    pub(crate) features: [u32; 256],
}

/// Zeroes the registers and writes CAP and VS.
pub(crate) fn reset_registers(sh: &Shared) {
    for off in (0..BAR_LEN as u32).step_by(4) {
        sh.reg(off).store(0, Ordering::Relaxed);
    }
    // CAP: MQES, CQR (contiguous queues required), TO = 10 (5 s: a loaded test machine may
    // not run the thread for a while), DSTRD 0, CSS NVM,
    // MPSMIN = MPSMAX = 0 (4 KiB).
    let cap = u64::from(sh.cfg.max_queue_entries.max(2) - 1) | (1 << 16) | (10 << 24) | (1 << 37);
    sh.reg(registers::CAP).store(cap as u32, Ordering::Relaxed);
    sh.reg(registers::CAP + 4).store((cap >> 32) as u32, Ordering::Relaxed);
    // VS 2.0.0.
    sh.reg(registers::VS).store(0x0002_0000, Ordering::Release);
}

/// The thread's body.
pub(crate) fn run(sh: Arc<Shared>) {
    let mut d = Device {
        sh,
        enabled: false,
        shutdown: false,
        sqs: Vec::new(),
        cqs: Vec::new(),
        dbbuf: None,
        aers: Vec::new(),
        held: Vec::new(),
        features: [0; 256],
    };
    let mut last_work = Instant::now();
    let gate = d.sh.gate.clone();
    // Host memory is touched only with the gate held (see `DmaGate`).
    let locked = || gate.0.lock().unwrap_or_else(|e| e.into_inner());
    while !d.sh.stop.load(Ordering::Acquire) {
        if d.step_gated(locked()) {
            last_work = Instant::now();
            continue;
        }
        if last_work.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        // Ask to be told of the next submission, then look once more: a doorbell written
        // before the event index was would otherwise go unnoticed until the nap ends.
        let g = locked();
        d.set_event_indexes(true);
        d.sh.sleeping.store(true, Ordering::SeqCst);
        let worked = d.step_gated(g);
        if !worked {
            std::thread::park_timeout(NAP);
        }
        d.sh.sleeping.store(false, Ordering::SeqCst);
        let g = locked();
        d.set_event_indexes(false);
        drop(g);
        last_work = Instant::now() - SPIN / 2;
    }
}

impl Device {
    /// One round with the DMA gate held (`_gate` is its guard, released on return).
    fn step_gated(&mut self, _gate: std::sync::MutexGuard<'_, ()>) -> bool {
        self.step()
    }

    fn step(&mut self) -> bool {
        let sh = self.sh.clone();
        if sh.flr.load(Ordering::Acquire) {
            self.disable();
            reset_registers(&sh);
            if sh.fault() == Fault::FatalStatus {
                sh.reg(registers::CSTS).store(registers::CSTS_CFS, Ordering::Release);
            }
            sh.flr.store(false, Ordering::Release);
            return true;
        }
        match sh.fault() {
            Fault::Disappear => return false,
            Fault::FatalStatus => {
                // A reset (CC.EN = 0) still clears RDY, but the controller never gets ready.
                let csts = sh.reg(registers::CSTS);
                if sh.reg(registers::CC).load(Ordering::Acquire) & registers::CC_EN == 0 && self.enabled {
                    self.disable();
                }
                csts.fetch_or(registers::CSTS_CFS, Ordering::AcqRel);
                return false;
            }
            _ => {}
        }
        let cc = sh.reg(registers::CC).load(Ordering::Acquire);
        let mut work = false;
        if cc & registers::CC_EN != 0 && !self.enabled {
            self.enable();
            work = true;
        } else if cc & registers::CC_EN == 0 && self.enabled {
            self.disable();
            work = true;
        }
        if !self.enabled {
            return work;
        }
        let shn = cc & registers::CC_SHN_MASK != 0;
        if shn != self.shutdown {
            self.shutdown = shn;
            let csts = sh.reg(registers::CSTS);
            let v = csts.load(Ordering::Acquire) & !registers::CSTS_SHST_MASK;
            csts.store(if shn { v | registers::CSTS_SHST_COMPLETE } else { v }, Ordering::Release);
            work = true;
        }
        work |= self.post_injected();
        for qid in 0..self.sqs.len() {
            work |= self.process(qid as u16);
        }
        work |= self.raise_event();
        work
    }

    fn enable(&mut self) {
        let sh = &self.sh;
        let aqa = sh.reg(registers::AQA).load(Ordering::Acquire);
        let read64 = |off: u32| {
            u64::from(sh.reg(off).load(Ordering::Acquire))
                | (u64::from(sh.reg(off + 4).load(Ordering::Acquire)) << 32)
        };
        let (asq, acq) = (read64(registers::ASQ), read64(registers::ACQ));
        let sq_size = (aqa & 0xfff) as u16 + 1;
        let cq_size = ((aqa >> 16) & 0xfff) as u16 + 1;
        if sq_size < 2 || cq_size < 2 || asq % PAGE != 0 || acq % PAGE != 0 {
            sh.reg(registers::CSTS).store(registers::CSTS_CFS, Ordering::Release);
            return;
        }
        let queues = self.sh.cfg.io_queues as usize + 1;
        self.sqs = (0..queues).map(|_| None).collect();
        self.cqs = (0..queues).map(|_| None).collect();
        self.sqs[0] = Some(Sq { iova: asq, size: sq_size, head: 0, cqid: 0, shadow: false });
        self.cqs[0] = Some(Cq { iova: acq, size: cq_size, tail: 0, phase: true, shadow: false });
        self.enabled = true;
        self.shutdown = false;
        sh.enables.fetch_add(1, Ordering::Relaxed);
        sh.reg(registers::CSTS).store(registers::CSTS_RDY, Ordering::Release);
    }

    /// CC.EN = 0: a controller reset (Base 3.7.2): queues deleted, doorbells zero, RDY = 0.
    fn disable(&mut self) {
        self.enabled = false;
        self.shutdown = false;
        self.sqs.clear();
        self.cqs.clear();
        self.dbbuf = None;
        self.aers.clear();
        self.held.clear();
        for off in (registers::DOORBELLS..BAR_LEN as u32).step_by(4) {
            self.sh.reg(off).store(0, Ordering::Relaxed);
        }
        self.sh.reg(registers::CSTS).store(0, Ordering::Release);
    }

    /// Doorbell `index`'s value: BAR0, or the shadow entry.
    fn doorbell(&self, index: u32, shadow: bool) -> u32 {
        if let (true, Some((page, _))) = (shadow, self.dbbuf) {
            // The host writes it concurrently: one atomic load.
            return memory_map().device_load_u32(page + u64::from(index) * 4).unwrap_or(0);
        }
        self.sh.reg(registers::DOORBELLS + index * 4).load(Ordering::Acquire)
    }

    /// The event indexes of shadowed SQs: while the thread polls, one behind its position
    /// (the host need not write BAR0); before it sleeps, its position (the next submission
    /// writes BAR0, which wakes it).
    fn set_event_indexes(&self, sleeping: bool) {
        for qid in 0..self.sqs.len() {
            self.set_sq_event(qid as u16, sleeping);
        }
        // Pairs with the host's fence between its shadow write and its event index read.
        fence(Ordering::SeqCst);
    }

    /// The event index of shadowed SQ `qid`, as [`Device::set_event_indexes`] says.
    fn set_sq_event(&self, qid: u16, sleeping: bool) {
        let Some((_, events)) = self.dbbuf else { return };
        let Some(sq) = self.sqs.get(qid as usize).and_then(Option::as_ref).filter(|s| s.shadow) else {
            return;
        };
        let v = if sleeping { sq.head } else { (sq.head + sq.size - 1) % sq.size };
        memory_map().device_store_u32(events + u64::from(qid) * 8, u32::from(v));
    }

    /// The event index of shadowed CQ `cqid`: one behind the host's head, so the host never
    /// writes the register (the thread reads the shadow whenever it needs room).
    pub(crate) fn quiet_cq_event(&self, cqid: u16) {
        let (Some((_, events)), Some(cq)) =
            (self.dbbuf, self.cqs.get(cqid as usize).and_then(Option::as_ref))
        else {
            return;
        };
        if !cq.shadow {
            return;
        }
        let head = self.doorbell(2 * u32::from(cqid) + 1, true) as u16 % cq.size;
        memory_map().device_store_u32(
            events + (2 * u64::from(cqid) + 1) * 4,
            u32::from((head + cq.size - 1) % cq.size),
        );
    }

    fn cq_has_room(&self, cqid: u16) -> bool {
        let Some(cq) = self.cqs.get(cqid as usize).and_then(Option::as_ref) else { return false };
        let head = self.doorbell(2 * u32::from(cqid) + 1, cq.shadow);
        (cq.tail + 1) % cq.size != head as u16
    }

    /// Posts 16 raw bytes at `cqid`'s tail (the phase tag is whatever they hold).
    fn post_raw(&mut self, cqid: u16, bytes: [u8; 16]) {
        let Some(cq) = self.cqs.get_mut(cqid as usize).and_then(Option::as_mut) else { return };
        let entry = cq.iova + u64::from(cq.tail) * 16;
        // Dword 3 (the phase tag) is stored last, after the rest is visible.
        if memory_map().device_write(entry, &bytes[..12]) {
            fence(Ordering::Release);
            let dw3 = u32::from_le_bytes(bytes[12..16].try_into().expect("four bytes"));
            memory_map().device_store_u32(entry + 12, dw3.to_le());
        }
        cq.tail += 1;
        if cq.tail == cq.size {
            cq.tail = 0;
            cq.phase = !cq.phase;
        }
        self.sh.completions.fetch_add(1, Ordering::Release);
    }

    /// Posts a completion of `cid` from `sqid` with this lap's phase (or the wrong one).
    pub(crate) fn post(
        &mut self,
        sqid: u16,
        cid: u16,
        status: Status,
        dw0: u32,
        sqhd: u16,
        wrong_phase: bool,
    ) {
        let Some(cqid) = self.sqs.get(sqid as usize).and_then(Option::as_ref).map(|s| s.cqid) else { return };
        let Some(phase) = self.cqs.get(cqid as usize).and_then(Option::as_ref).map(|c| c.phase) else {
            return;
        };
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&dw0.to_le_bytes());
        b[8..10].copy_from_slice(&sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&sqid.to_le_bytes());
        b[12..14].copy_from_slice(&cid.to_le_bytes());
        let field = status.field() | u16::from(phase != wrong_phase);
        b[14..16].copy_from_slice(&field.to_le_bytes());
        self.post_raw(cqid, b);
    }

    fn post_injected(&mut self) -> bool {
        let mut work = false;
        loop {
            let next = self.sh.inject.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            let Some((qid, bytes)) = next else { return work };
            self.post_raw(qid, bytes);
            work = true;
        }
    }

    /// Fetches and executes what queue `qid` holds.
    fn process(&mut self, qid: u16) -> bool {
        let fault = self.sh.fault();
        if qid > 0 && fault == Fault::Scripted {
            return false;
        }
        let Some((iova, size, cqid, shadow)) =
            self.sqs.get(qid as usize).and_then(Option::as_ref).map(|s| (s.iova, s.size, s.cqid, s.shadow))
        else {
            return false;
        };
        let tail = self.doorbell(2 * u32::from(qid), shadow);
        if tail >= u32::from(size) {
            // An invalid doorbell write (Base 4.1: an error the controller may ignore).
            return false;
        }
        let tail = tail as u16;
        let mut n = 0;
        while n < BURST {
            let head = match self.sqs.get(qid as usize).and_then(Option::as_ref) {
                Some(s) if s.head != tail => s.head,
                _ => break,
            };
            if !self.cq_has_room(cqid) {
                break;
            }
            let mut raw = [0u8; SQE_LEN];
            if !memory_map().device_read(iova + u64::from(head) * SQE_LEN as u64, &mut raw) {
                // The ring is unreachable: the host broke it; stop, as a real device faults.
                self.sh.reg(registers::CSTS).fetch_or(registers::CSTS_CFS, Ordering::AcqRel);
                return false;
            }
            let sqe = Sqe(raw);
            let new_head = (head + 1) % size;
            if let Some(s) = self.sqs.get_mut(qid as usize).and_then(Option::as_mut) {
                s.head = new_head;
            }
            n += 1;
            if qid == 0 {
                self.sh.admin_commands.fetch_add(1, Ordering::Relaxed);
                if let Outcome::Done(status, dw0) = self.admin(&sqe) {
                    self.post(0, sqe.cid(), status, dw0, new_head, false);
                }
                continue;
            }
            self.sh.io_commands.fetch_add(1, Ordering::Relaxed);
            let Outcome::Done(status, dw0) = self.io(&sqe) else { continue };
            match fault {
                Fault::StopAnswering => self.held.push(Held { sqid: qid, cid: sqe.cid() }),
                Fault::UnknownCid => self.post(qid, 0xffff, status, dw0, new_head, false),
                Fault::DuplicateCid => {
                    self.post(qid, sqe.cid(), status, dw0, new_head, false);
                    if self.cq_has_room(cqid) {
                        self.post(qid, sqe.cid(), status, dw0, new_head, false);
                    }
                }
                Fault::WrongPhase => self.post(qid, sqe.cid(), status, dw0, new_head, true),
                Fault::SqHeadBeyondTail => self.post(qid, sqe.cid(), status, dw0, (tail + 1) % size, false),
                _ => self.post(qid, sqe.cid(), status, dw0, new_head, false),
            }
        }
        if n > 0 {
            // Still polling: keep both event indexes just behind, so the host writes neither
            // register while the thread is awake.
            self.set_sq_event(qid, false);
            self.quiet_cq_event(cqid);
        }
        n > 0
    }

    /// Completes an outstanding Asynchronous Event Request when a namespace changed: Notice,
    /// Namespace Attribute Changed, log page 04h (Base 5.2, Figure 145).
    fn raise_event(&mut self) -> bool {
        if self.aers.is_empty() || !self.sh.aer_pending.swap(false, Ordering::AcqRel) {
            return false;
        }
        let cid = self.aers.remove(0);
        let head = self.sqs[0].as_ref().map_or(0, |s| s.head);
        self.post(0, cid, Status::SUCCESS, 0x0004_0002, head, false);
        true
    }
}
