//! What the PCIe transport needs of a PCI function: its BAR0 (registers and doorbells) mapped
//! into this process, and DMA memory the function can reach. A VFIO-bound device
//! ([`super::vfio`]) and the emulated controller (`crate::emu`, feature `emu`) both give it.

use std::ptr::NonNull;

use fp_bdev::dma::memory_map;
use fp_bdev::AlignedBuf;

use crate::NvmeError;

/// A PCI function whose BAR0 is an NVMe controller's register file.
pub trait PciFunction: Send + Sync + 'static {
    /// Its address as SPDK's `traddr` spells it: "0000:00:04.0" (the emulated controller:
    /// "emu:N").
    fn address(&self) -> String;

    /// BAR0, mapped for as long as the function lives.
    fn bar0(&self) -> Bar;

    /// Resets the function (VFIO's function-level reset) when a controller reset through CC.EN
    /// did not bring it back; `Ok(false)` when the function has no reset.
    fn reset_function(&self) -> Result<bool, NvmeError> {
        Ok(false)
    }

    /// Told after every doorbell write the driver makes to BAR0 (`offset`, `value`). A real
    /// function learns of the write from the write itself, so the default does nothing (and
    /// compiles to nothing in the queue's hot path); the emulated controller, whose BAR0 is
    /// ordinary memory, counts it and wakes its device thread as the write would wake hardware.
    #[inline]
    fn doorbell_rung(&self, offset: u32, value: u32) {
        let _ = (offset, value);
    }
}

/// A mapped BAR: volatile, bounds-checked register access. Copies share the mapping; the
/// [`PciFunction`] that gave it keeps it mapped.
#[derive(Debug, Clone, Copy)]
pub struct Bar {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a BAR is device memory reached only through volatile accesses of whole registers;
// which thread writes a given doorbell is the queue's business (one owner per queue).
unsafe impl Send for Bar {}
// SAFETY: as above; reads and writes of distinct registers do not interfere.
unsafe impl Sync for Bar {}

impl Bar {
    /// A BAR at `base` of `len` bytes.
    ///
    /// # Safety
    /// `[base, base + len)` must be mapped, readable and writable, for as long as any copy of
    /// the `Bar` is used, and `base` aligned to 8 bytes.
    pub unsafe fn new(base: NonNull<u8>, len: usize) -> Bar {
        Bar { base, len }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn at<T>(&self, offset: u32) -> *mut T {
        let off = offset as usize;
        assert!(
            off % std::mem::size_of::<T>() == 0 && off + std::mem::size_of::<T>() <= self.len,
            "register {off:#x} outside a {}-byte BAR",
            self.len
        );
        // SAFETY: inside the mapping, checked above.
        unsafe { self.base.as_ptr().add(off) as *mut T }
    }

    /// Reads the 4-byte register at `offset`.
    #[inline]
    pub fn read32(&self, offset: u32) -> u32 {
        // SAFETY: `at` checks bounds and alignment; the mapping is valid (`new`'s contract).
        u32::from_le(unsafe { std::ptr::read_volatile(self.at::<u32>(offset)) })
    }

    /// Reads the 8-byte register at `offset` as two 4-byte reads, low first (a PCIe function
    /// need not take 8-byte accesses; Base 3.1.4 allows either).
    pub fn read64(&self, offset: u32) -> u64 {
        u64::from(self.read32(offset)) | (u64::from(self.read32(offset + 4)) << 32)
    }

    /// Writes the 4-byte register at `offset`.
    #[inline]
    pub fn write32(&self, offset: u32, value: u32) {
        // SAFETY: `at` checks bounds and alignment; the mapping is valid (`new`'s contract).
        unsafe { std::ptr::write_volatile(self.at::<u32>(offset), value.to_le()) }
    }

    /// Writes the 8-byte register at `offset`, low half first.
    pub fn write64(&self, offset: u32, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
}

/// Memory the device can reach: page-aligned, zeroed, registered in the process's DMA map
/// ([`fp_bdev::dma`]) for as long as it lives, so every IOMMU listener maps it.
pub struct DmaMemory {
    buf: AlignedBuf,
    iova: u64,
}

impl DmaMemory {
    /// `len` bytes (whole pages are taken).
    pub fn new(len: usize) -> Result<DmaMemory, NvmeError> {
        let buf = AlignedBuf::zeroed(len.next_multiple_of(fp_bdev::dma::DMA_PAGE));
        let iova = memory_map()
            .register(buf.as_ptr() as usize, buf.len())
            .map_err(|e| NvmeError::io("registering DMA memory", std::io::Error::other(e)))?;
        Ok(DmaMemory { buf, iova })
    }

    /// The device's address of byte 0.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// This process's address of byte 0.
    pub fn as_ptr(&self) -> *mut u8 {
        self.buf.as_ptr() as *mut u8
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes (the device may write them at any time it owns them: read them only when the
    /// protocol says they are the driver's).
    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// The bytes, for writing before the device is told of them.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }
}

impl Drop for DmaMemory {
    fn drop(&mut self) {
        if let Err(e) = memory_map().unregister(self.buf.as_ptr() as usize, self.buf.len()) {
            log::error!("unregistering DMA memory: {e}");
        }
    }
}
