//! What the emulated controller's handle and its device thread share: BAR0, the namespaces'
//! RAM, the counters and the DMA gate. Plain state below both ([`super::controller`] makes
//! it, `device` runs on it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use fp_bdev::dma::{DmaListener, DmaRegion};

use super::config::{EmuConfig, Fault};

/// BAR0's size: the registers' page and the doorbells (stride 4) of up to 1023 queues.
pub(crate) const BAR_LEN: usize = 0x2000;

/// Two 4-byte registers of BAR0, 8-aligned so the BAR's memory is (the PCIe driver's `Bar`
/// asks for it) and an 8-byte register is one pair.
#[derive(Default)]
#[repr(C, align(8))]
pub(crate) struct RegisterPair(pub(crate) [AtomicU32; 2]);

/// One namespace's RAM.
pub(crate) struct Namespace {
    pub(crate) nsid: u32,
    pub(crate) block_size: u32,
    pub(crate) data: Vec<u8>,
}

impl Namespace {
    pub(crate) fn num_blocks(&self) -> u64 {
        self.data.len() as u64 / u64::from(self.block_size)
    }
}

/// The emulation's IOMMU unmap: the device thread holds the gate while it touches host memory
/// ([`fp_bdev::dma::MemoryMap::device_read`] and the like), and unregistering memory waits for it
/// before the memory is freed. Afterwards the region is no longer in the map, so the thread's
/// next access fails as a real device's DMA to an unmapped address does.
#[derive(Default)]
pub(crate) struct DmaGate(pub(crate) Mutex<()>);

impl DmaListener for DmaGate {
    fn map(&self, _region: &DmaRegion) -> std::io::Result<()> {
        Ok(())
    }

    fn unmap(&self, _region: &DmaRegion) {
        drop(self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// What the device thread and the handle share.
pub(crate) struct Shared {
    pub(crate) cfg: EmuConfig,
    pub(crate) address: String,
    pub(crate) bar: Box<[RegisterPair]>,
    pub(crate) fault: AtomicU8,
    pub(crate) namespaces: Mutex<Vec<Namespace>>,
    /// Namespaces changed since the host last read the Changed Namespace List log.
    pub(crate) changed: Mutex<Vec<u32>>,
    /// A namespace change not yet reported by an Asynchronous Event.
    pub(crate) aer_pending: AtomicBool,
    pub(crate) sq_doorbells: Box<[AtomicU64]>,
    pub(crate) cq_doorbells: Box<[AtomicU64]>,
    pub(crate) io_commands: AtomicU64,
    pub(crate) admin_commands: AtomicU64,
    pub(crate) keep_alives: AtomicU64,
    pub(crate) aborts: AtomicU64,
    pub(crate) dbbuf_configs: AtomicU64,
    pub(crate) enables: AtomicU64,
    pub(crate) completions: AtomicU64,
    pub(crate) stop: AtomicBool,
    pub(crate) sleeping: AtomicBool,
    pub(crate) thread: OnceLock<std::thread::Thread>,
    /// Raw completions to post (queue ID, 16 bytes), for [`Fault::Scripted`].
    pub(crate) inject: Mutex<VecDeque<(u16, [u8; 16])>>,
    /// A function-level reset asked for; the device clears it when done.
    pub(crate) flr: AtomicBool,
    pub(crate) gate: Arc<DmaGate>,
}

impl Shared {
    /// The 4-byte register at `offset`.
    pub(crate) fn reg(&self, offset: u32) -> &AtomicU32 {
        let off = offset as usize;
        assert!(off % 4 == 0 && off + 4 <= BAR_LEN, "register {off:#x} outside BAR0");
        &self.bar[off / 8].0[off / 4 % 2]
    }

    pub(crate) fn fault(&self) -> Fault {
        Fault::from_u8(self.fault.load(Ordering::Acquire))
    }

    pub(crate) fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}
