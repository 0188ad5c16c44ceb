//! Heap buffers aligned for `O_DIRECT`: what a frontend or layer that owns its data buffers
//! (the NBD server, the volume store's metadata I/O) hands to any backend.
//!
//! Each buffer is registered in the process's DMA map ([`crate::dma`]) while it lives, so a
//! driver that hands addresses to a device (NVMe over PCIe) reaches it without a bounce copy.
//! Buffers are made per connection slot or per owner, not per I/O: the registration (a lock
//! and a copy of the region list) stays off the data path.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::dma::memory_map;

/// The alignment: a page, which satisfies every device's `O_DIRECT` rules.
pub const BUF_ALIGN: usize = 4096;

/// A zero-initialised, page-aligned heap buffer of a fixed length, whole pages allocated.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Its IOVA in the DMA map; `None` when the map refused it (logged, counted there).
    iova: Option<u64>,
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `len` bytes (at least one page is allocated, so an empty one is valid too).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // Whole pages are ours (the layout's size), so registering them exposes no other
        // allocation to a device.
        let iova = match memory_map().register(ptr.as_ptr() as usize, layout.size()) {
            Ok(iova) => Some(iova),
            Err(e) => {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    log::warn!("a buffer could not be registered for DMA (devices get a copy): {e}");
                }
                None
            }
        };
        AlignedBuf { ptr, len, iova }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.next_multiple_of(BUF_ALIGN).max(BUF_ALIGN), BUF_ALIGN)
            .expect("valid layout")
    }

    /// The I/O virtual address of byte 0 in the DMA map ([`crate::dma`]), if it is registered.
    pub fn iova(&self) -> Option<u64> {
        self.iova
    }

    /// Length in bytes, as asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the buffer (aligned to `BUF_ALIGN`).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The start of the buffer, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes as a slice.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes owned by this buffer, borrowed mutably once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // Devices lose it before the allocator may hand it out again.
        if self.iova.is_some() {
            if let Err(e) = memory_map().unregister(self.ptr.as_ptr() as usize, Self::layout(self.len).size())
            {
                log::error!("unregistering a buffer from the DMA map: {e}");
            }
        }
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_writable() {
        for len in [0, 1, 4096, 5000, 1 << 20] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % BUF_ALIGN, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(7);
            assert_eq!(b.as_slice().len(), len);
        }
    }

    #[test]
    fn buffers_are_in_the_dma_map_while_they_live() {
        let mut t = memory_map().translator();
        let b = AlignedBuf::zeroed(5000);
        let base = b.as_ptr() as usize;
        let iova = b.iova().expect("registered");
        // The whole allocation (two pages) translates, the iova of byte 0 first.
        assert_eq!(t.translate(base, 5000), Some(iova));
        assert_eq!(t.translate(base + 8191, 1), Some(iova + 8191));
        assert_eq!(memory_map().vaddr_of(iova + 100, 8), Some(base + 100));
        drop(b);
        // Other tests may reuse the address at once, but not this IOVA for this range unless
        // they registered it again: check the range as it was is gone.
        assert!(memory_map().regions().iter().all(|r| !(r.vaddr == base && r.iova == iova && r.len == 8192)));
    }
}
