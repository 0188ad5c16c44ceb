//! The emulated controller's handle: its BAR0 (ordinary memory), the state its device thread
//! shares with the tests (namespaces' RAM, faults, counters), and the thread's life.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fp_bdev::dma::{memory_map, ListenerId};
use fp_nvme_spec::registers;

use super::config::{EmuConfig, EmuCounters, EmuNamespace, Fault};
use super::device;
use super::shared::{DmaGate, Namespace, RegisterPair, Shared, BAR_LEN};
use crate::pcie::{Bar, PciFunction};
use crate::NvmeError;

/// An NVMe controller emulated in this process: BAR0 is memory, a thread is the device. It
/// reaches the host's memory only through the DMA map ([`fp_bdev::dma::MemoryMap::vaddr_of`]),
/// as an IOMMU would let it.
pub struct EmulatedController {
    shared: Arc<Shared>,
    bar: Bar,
    thread: Option<JoinHandle<()>>,
    listener: Option<ListenerId>,
}

impl EmulatedController {
    /// A controller made of `cfg`, disabled (CC.EN = 0), its device thread running.
    pub fn new(cfg: EmuConfig) -> Arc<EmulatedController> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let queues = cfg.io_queues as usize + 1;
        let namespaces = cfg
            .namespaces
            .iter()
            .map(|n| Namespace {
                nsid: n.nsid,
                block_size: n.block_size,
                data: vec![0; (n.num_blocks * u64::from(n.block_size)) as usize],
            })
            .collect();
        let shared = Arc::new(Shared {
            address: format!("emu:{}", NEXT.fetch_add(1, Ordering::Relaxed)),
            bar: (0..BAR_LEN / 8).map(|_| RegisterPair::default()).collect(),
            fault: AtomicU8::new(Fault::None as u8),
            namespaces: Mutex::new(namespaces),
            changed: Mutex::new(Vec::new()),
            aer_pending: AtomicBool::new(false),
            sq_doorbells: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            cq_doorbells: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            io_commands: AtomicU64::new(0),
            admin_commands: AtomicU64::new(0),
            keep_alives: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
            dbbuf_configs: AtomicU64::new(0),
            enables: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            thread: OnceLock::new(),
            inject: Mutex::new(VecDeque::new()),
            flr: AtomicBool::new(false),
            gate: Arc::new(DmaGate::default()),
            cfg,
        });
        device::reset_registers(&shared);
        // Mapping nothing fails, so this cannot; without it the device would only be unsafe
        // for memory freed while in use, so carry on regardless.
        let listener = memory_map().add_listener(shared.gate.clone()).ok();
        // SAFETY: the BAR's memory lives in `shared`, which the controller keeps as long as
        // any `Bar` copy may be used (the transport keeps the controller's `Arc`); it is
        // 8-aligned (RegisterPair).
        let bar =
            unsafe { Bar::new(NonNull::new(shared.bar.as_ptr() as *mut u8).expect("non-null"), BAR_LEN) };
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nvme-{}", shared.address))
            .spawn(move || device::run(sh))
            .expect("spawning the emulated controller's thread");
        let _ = shared.thread.set(thread.thread().clone());
        Arc::new(EmulatedController { shared, bar, thread: Some(thread), listener })
    }

    /// Sets the fault to commit from now on ([`Fault::None`]: behave again).
    pub fn set_fault(&self, f: Fault) {
        self.shared.fault.store(f as u8, Ordering::Release);
        if f == Fault::Disappear {
            // A removed function: every read of BAR0 completes with all ones.
            for w in self.shared.bar.iter().flat_map(|pair| &pair.0) {
                w.store(u32::MAX, Ordering::Release);
            }
        }
        self.shared.wake();
    }

    /// The counters now.
    pub fn counters(&self) -> EmuCounters {
        let all = |v: &[AtomicU64]| v.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let sh = &self.shared;
        EmuCounters {
            sq_doorbells: all(&sh.sq_doorbells),
            cq_doorbells: all(&sh.cq_doorbells),
            io_commands: sh.io_commands.load(Ordering::Relaxed),
            admin_commands: sh.admin_commands.load(Ordering::Relaxed),
            keep_alives: sh.keep_alives.load(Ordering::Relaxed),
            aborts: sh.aborts.load(Ordering::Relaxed),
            doorbell_buffer_configs: sh.dbbuf_configs.load(Ordering::Relaxed),
            enables: sh.enables.load(Ordering::Relaxed),
            completions: sh.completions.load(Ordering::Relaxed),
        }
    }

    /// Completions posted so far (all queues), without the rest of [`EmulatedController::counters`].
    pub fn completions(&self) -> u64 {
        self.shared.completions.load(Ordering::Acquire)
    }

    /// `len` bytes of namespace `nsid` from byte `offset`, as the controller holds them.
    pub fn read_namespace(&self, nsid: u32, offset: u64, len: usize) -> Option<Vec<u8>> {
        let ns = self.shared.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        let n = ns.iter().find(|n| n.nsid == nsid)?;
        let start = usize::try_from(offset).ok()?;
        n.data.get(start..start.checked_add(len)?).map(<[u8]>::to_vec)
    }

    /// Writes `data` into namespace `nsid` at byte `offset` (behind the host's back).
    pub fn write_namespace(&self, nsid: u32, offset: u64, data: &[u8]) -> bool {
        let mut ns = self.shared.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        let Some(n) = ns.iter_mut().find(|n| n.nsid == nsid) else { return false };
        let start = offset as usize;
        match n.data.get_mut(start..start + data.len()) {
            Some(d) => {
                d.copy_from_slice(data);
                true
            }
            None => false,
        }
    }

    fn changed(&self, nsid: u32) {
        let mut c = self.shared.changed.lock().unwrap_or_else(|e| e.into_inner());
        if !c.contains(&nsid) {
            c.push(nsid);
        }
        self.shared.aer_pending.store(true, Ordering::Release);
        self.shared.wake();
    }

    /// Adds a namespace (its blocks zero) and raises a Namespace Attribute Changed event.
    pub fn add_namespace(&self, n: EmuNamespace) {
        self.shared.namespaces.lock().unwrap_or_else(|e| e.into_inner()).push(Namespace {
            nsid: n.nsid,
            block_size: n.block_size,
            data: vec![0; (n.num_blocks * u64::from(n.block_size)) as usize],
        });
        self.changed(n.nsid);
    }

    /// Resizes namespace `nsid` to `num_blocks` (kept data stays) and raises the event.
    pub fn resize_namespace(&self, nsid: u32, num_blocks: u64) -> bool {
        let mut ns = self.shared.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        let Some(n) = ns.iter_mut().find(|n| n.nsid == nsid) else { return false };
        n.data.resize((num_blocks * u64::from(n.block_size)) as usize, 0);
        drop(ns);
        self.changed(nsid);
        true
    }

    /// Removes namespace `nsid` and raises the event.
    pub fn remove_namespace(&self, nsid: u32) -> bool {
        let mut ns = self.shared.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        let before = ns.len();
        ns.retain(|n| n.nsid != nsid);
        let removed = ns.len() != before;
        drop(ns);
        if removed {
            self.changed(nsid);
        }
        removed
    }

    /// Under [`Fault::Scripted`]: posts `cqe` (16 raw bytes, phase tag included, exactly as
    /// given) at the tail of I/O completion queue `qid`.
    pub fn inject_completion(&self, qid: u16, cqe: [u8; 16]) {
        self.shared.inject.lock().unwrap_or_else(|e| e.into_inner()).push_back((qid, cqe));
        self.shared.wake();
    }

    /// Waits until the device posted every injected completion (at most `timeout`); whether
    /// it did.
    pub fn wait_injected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.shared.inject.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            if Instant::now() >= deadline {
                return false;
            }
            self.shared.wake();
            std::thread::yield_now();
        }
        true
    }

    /// Writes a register as the device (CSTS, CAP: hostile values for the fuzz target).
    pub fn write_register(&self, offset: u32, value: u32) {
        self.shared.reg(offset).store(value, Ordering::Release);
    }
}

impl PciFunction for EmulatedController {
    fn address(&self) -> String {
        self.shared.address.clone()
    }

    fn bar0(&self) -> Bar {
        self.bar
    }

    /// Resets the controller as a function-level reset would: every queue gone, CC and CSTS
    /// zero (CSTS.CFS stays while [`Fault::FatalStatus`] does).
    fn reset_function(&self) -> Result<bool, NvmeError> {
        self.shared.flr.store(true, Ordering::Release);
        self.shared.wake();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.shared.flr.load(Ordering::Acquire) {
            if Instant::now() >= deadline {
                return Err(NvmeError::Timeout(format!("{}: function-level reset", self.shared.address)));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(true)
    }

    #[inline]
    fn doorbell_rung(&self, offset: u32, _value: u32) {
        let index = (offset.wrapping_sub(registers::DOORBELLS) / 4) as usize;
        let counters = if index % 2 == 0 { &self.shared.sq_doorbells } else { &self.shared.cq_doorbells };
        if let Some(c) = counters.get(index / 2) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.shared.wake();
    }
}

impl Drop for EmulatedController {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        if let Some(id) = self.listener.take() {
            memory_map().remove_listener(id);
        }
    }
}
