//! The PCIe transport: enables the controller through BAR0 (Base 3.5.1), makes the admin
//! queue and I/O queue pairs in DMA memory, configures shadow doorbells where offered, and
//! shuts the controller down (CC.SHN).
//!
//! I/O completion queues are created without interrupts (IEN = 0): a reactor never sleeps
//! with I/O in flight on an NVMe channel, so it always finds completions by polling, and
//! sleeps only when idle. "Interrupts only for the reactor's sleep" thus needs none.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_nvme_spec::registers;

use super::admin::PcieAdmin;
use super::function::PciFunction;
use super::prp::{PAGE, PRP_LIST_ENTRIES};
use super::queue::{PcieIoQueue, QueueMemory, QueueParams};
use super::ring::{CqRing, ShadowPages, SqRing};
use crate::cmd;
use crate::transport::{AdminData, AdminQueue, Transport};
use crate::NvmeError;

/// Identify Controller's OACS bit 8: Doorbell Buffer Config supported (Base 5.17.2.1).
const OACS_DOORBELL_BUFFER: u16 = 1 << 8;
/// Queue creation and deletion take at most this long.
const ATTACH_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// How the PCIe transport uses what a controller offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieOptions {
    /// Use shadow doorbells (Doorbell Buffer Config) when the controller offers them.
    pub shadow_doorbells: bool,
    /// Describe data with SGLs when PRPs cannot and the controller offers SGLs.
    pub sgl: bool,
    /// Bounce buffers per I/O queue, for memory the device cannot reach.
    pub bounce_buffers: u16,
    /// Bytes of each bounce buffer: also the transport's transfer limit, so that any request
    /// can be bounced.
    pub bounce_size: u32,
}

impl Default for PcieOptions {
    fn default() -> Self {
        PcieOptions { shadow_doorbells: true, sgl: true, bounce_buffers: 4, bounce_size: 256 * 1024 }
    }
}

/// NVMe over PCIe on one function.
pub struct PcieTransport<F: PciFunction> {
    function: Arc<F>,
    opts: PcieOptions,
}

impl<F: PciFunction> PcieTransport<F> {
    /// The transport for `function`; nothing is touched before `connect_admin`.
    pub fn new(function: Arc<F>, opts: PcieOptions) -> Self {
        PcieTransport { function, opts }
    }

    /// The function.
    pub fn function(&self) -> &Arc<F> {
        &self.function
    }

    /// Waits until CSTS.RDY is `ready`, CSTS.CFS is set, or `timeout` passes.
    fn wait_ready(&self, ready: bool, timeout: Duration) -> Result<(), NvmeError> {
        let bar = self.function.bar0();
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            let csts = bar.read32(registers::CSTS);
            if registers::is_gone(csts) {
                return Err(NvmeError::Gone(format!(
                    "{}: the device reads all ones (removed)",
                    self.function.address()
                )));
            }
            if (csts & registers::CSTS_RDY != 0) == ready {
                return Ok(());
            }
            if ready && csts & registers::CSTS_CFS != 0 {
                return Err(NvmeError::Gone(format!(
                    "{}: controller fatal status (CSTS.CFS)",
                    self.function.address()
                )));
            }
            if Instant::now() >= deadline {
                return Err(NvmeError::Timeout(format!(
                    "{}: waiting for CSTS.RDY = {} (CSTS {csts:#x})",
                    self.function.address(),
                    u8::from(ready)
                )));
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// CC.EN = 0 and wait for CSTS.RDY = 0 (Base 3.5.2). A controller still becoming ready
    /// (EN = 1, RDY = 0) is let finish first: clearing EN then is undefined.
    fn disable(&self, timeout: Duration) -> Result<(), NvmeError> {
        let bar = self.function.bar0();
        let cc = bar.read32(registers::CC);
        if cc & registers::CC_EN != 0 {
            if bar.read32(registers::CSTS) & registers::CSTS_RDY == 0 {
                // A controller that never gets ready is disabled all the same.
                let _ = self.wait_ready(true, timeout);
            }
            bar.write32(registers::CC, cc & !(registers::CC_EN | registers::CC_SHN_MASK));
        }
        self.wait_ready(false, timeout)
    }

    fn identify(&self, admin: &mut PcieAdmin<F>, timeout: Duration) -> Result<(), NvmeError> {
        let mut id = vec![0u8; 4096];
        let c = admin.execute(
            cmd::identify(fp_nvme_spec::identify::CNS_CONTROLLER, 0),
            AdminData::FromDevice(&mut id),
            timeout,
        )?;
        if !c.status.is_success() {
            return Err(NvmeError::Command { what: "Identify Controller", status: c.status });
        }
        admin.facts.mdts = id[77];
        admin.facts.cntlid = u16::from_le_bytes([id[78], id[79]]);
        admin.facts.sgl = self.opts.sgl && id[536] & 3 == 1;
        let oacs = u16::from_le_bytes([id[256], id[257]]);
        if self.opts.shadow_doorbells && oacs & OACS_DOORBELL_BUFFER != 0 {
            let pages = Arc::new(ShadowPages::new(registers::cap_dstrd(admin.facts.cap))?);
            let (shadow, eventidx) = pages.iovas();
            let c = admin.execute(cmd::doorbell_buffer_config(shadow, eventidx), AdminData::None, timeout)?;
            if c.status.is_success() {
                admin.use_shadow(pages);
            } else {
                log::warn!(
                    "{}: Doorbell Buffer Config failed (sct {:#x} sc {:#x}); using BAR0 doorbells",
                    self.function.address(),
                    c.status.sct,
                    c.status.sc
                );
            }
        }
        Ok(())
    }
}

fn check(what: &'static str, c: fp_nvme_spec::Cqe) -> Result<(), NvmeError> {
    if c.status.is_success() {
        Ok(())
    } else {
        Err(NvmeError::Command { what, status: c.status })
    }
}

impl<F: PciFunction> Transport for PcieTransport<F> {
    type Admin = PcieAdmin<F>;
    type Io = PcieIoQueue<F>;

    fn trtype(&self) -> &'static str {
        "PCIe"
    }

    fn traddr(&self) -> String {
        self.function.address()
    }

    fn max_transfer(&self) -> u32 {
        // One PRP list page after PRP1: 513 pages, of which a transfer starting mid-page
        // uses all; so 512 whole pages. And a bounce buffer must hold it.
        ((PRP_LIST_ENTRIES * PAGE) as u32).min(self.opts.bounce_size)
    }

    fn connect_admin(&self, depth: u16, timeout: Duration) -> Result<PcieAdmin<F>, NvmeError> {
        let bar = self.function.bar0();
        let address = self.function.address();
        if registers::is_gone(bar.read32(registers::CSTS)) {
            return Err(NvmeError::Gone(format!("{address}: the device reads all ones (removed)")));
        }
        let cap = bar.read64(registers::CAP);
        if registers::cap_mpsmin(cap) != 0 {
            return Err(NvmeError::Unsupported(format!(
                "{address}: the controller's smallest memory page is {} KiB; the driver uses 4 KiB",
                4 << registers::cap_mpsmin(cap)
            )));
        }
        if !registers::cap_css_nvm(cap) {
            return Err(NvmeError::Unsupported(format!(
                "{address}: the controller lacks the NVM command set"
            )));
        }
        let ready = crate::transport::ready_timeout(cap);
        self.disable(ready)?;
        // Admin queues hold at most 4096 entries (AQA's 12-bit fields), I/O ones CAP.MQES + 1.
        let depth = depth.clamp(2, 4096).min(registers::cap_mqes(cap).saturating_add(1).max(2));
        let sq = SqRing::new(depth)?;
        let cq = CqRing::new(depth)?;
        bar.write32(registers::AQA, u32::from(depth - 1) | (u32::from(depth - 1) << 16));
        bar.write64(registers::ASQ, sq.iova());
        bar.write64(registers::ACQ, cq.iova());
        let mut admin = PcieAdmin::new(self.function.clone(), sq, cq, cap)?;
        bar.write32(registers::CC, registers::CC_EN | registers::CC_IOQES | registers::CC_CSS_NVM);
        self.wait_ready(true, ready)?;
        self.identify(&mut admin, timeout)?;
        Ok(admin)
    }

    fn connect_io(
        &self,
        admin: &mut PcieAdmin<F>,
        qid: u16,
        depth: u16,
    ) -> Result<PcieIoQueue<F>, NvmeError> {
        let cap = admin.facts.cap;
        let depth = depth.clamp(2, registers::cap_mqes(cap).saturating_add(1).max(2));
        let mem = QueueMemory::new(depth)?;
        if let Some(shadow) = &admin.shadow {
            shadow.clear_queue(qid);
        }
        let t = ATTACH_COMMAND_TIMEOUT;
        check(
            "Create I/O Completion Queue",
            admin.execute(cmd::create_io_cq(qid, depth, mem.cq.iova(), None), AdminData::None, t)?,
        )?;
        let sq = admin.execute(cmd::create_io_sq(qid, depth, mem.sq.iova(), qid), AdminData::None, t);
        if let Err(e) = sq.and_then(|c| check("Create I/O Submission Queue", c)) {
            let _ = admin.execute(cmd::delete_io_cq(qid), AdminData::None, t);
            return Err(e);
        }
        PcieIoQueue::new(
            mem,
            QueueParams {
                function: self.function.clone(),
                qid,
                dstrd: registers::cap_dstrd(cap),
                shadow: admin.shadow.clone(),
                sgl: admin.facts.sgl,
                bounce_buffers: self.opts.bounce_buffers,
                bounce_len: self.max_transfer() as usize,
            },
        )
    }

    fn disconnect_io(&self, admin: &mut PcieAdmin<F>, qid: u16) -> Result<(), NvmeError> {
        let t = ATTACH_COMMAND_TIMEOUT;
        check("Delete I/O Submission Queue", admin.execute(cmd::delete_io_sq(qid), AdminData::None, t)?)?;
        check("Delete I/O Completion Queue", admin.execute(cmd::delete_io_cq(qid), AdminData::None, t)?)
    }

    fn shutdown(&self, _admin: &mut PcieAdmin<F>, timeout: Duration) {
        let bar = self.function.bar0();
        let cc = bar.read32(registers::CC);
        if registers::is_gone(cc) {
            return;
        }
        bar.write32(registers::CC, (cc & !registers::CC_SHN_MASK) | registers::CC_SHN_NORMAL);
        let deadline = Instant::now() + timeout;
        loop {
            let csts = bar.read32(registers::CSTS);
            if registers::is_gone(csts) || csts & registers::CSTS_SHST_MASK == registers::CSTS_SHST_COMPLETE {
                return;
            }
            if Instant::now() >= deadline {
                log::warn!("{}: shutdown did not complete in {timeout:?}", self.function.address());
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
