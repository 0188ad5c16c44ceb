//! The dirty log of live migration (vhost-user.rst, "Migration"): a bitmap over guest-physical
//! memory in which the device sets one bit per 4 KiB page it writes, bit `(gpa / 4096) % 8` of
//! byte `gpa / 4096 / 8`. The front-end (QEMU) clears bits as it copies pages concurrently, so
//! every set is an atomic OR; Relaxed is enough because the store that publishes the write to
//! the driver (the used index, a packed descriptor's flags) is a Release store that orders it.
//!
//! [`DirtyLog`] marks; [`RingLog`] is one ring's view of it (where its used side lives in guest
//! memory, and how many pages it marked).

use std::any::Any;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Size of a logged page (VHOST_LOG_PAGE).
pub const LOG_PAGE: u64 = 0x1000;

/// A dirty-page bitmap the device sets bits in. Shared by every queue of a connection.
pub struct DirtyLog {
    bitmap: *const AtomicU8,
    len: usize,
    /// Keeps the memory behind `bitmap` alive (a mapping of the front-end's log fd, or an
    /// allocation of [`DirtyLog::in_memory`]).
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the bitmap is only accessed through atomics, and `_owner` (Send + Sync) keeps it
// alive for as long as any holder of this value exists.
unsafe impl Send for DirtyLog {}
// SAFETY: as above; every access is an atomic operation.
unsafe impl Sync for DirtyLog {}

impl std::fmt::Debug for DirtyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyLog").field("bytes", &self.len).finish()
    }
}

impl DirtyLog {
    /// A log over `len` bytes at `bitmap`, kept alive by `owner`.
    ///
    /// # Safety
    /// `bitmap .. bitmap + len` must be mapped readable and writable for as long as `owner`
    /// lives, and be accessed by this process only atomically.
    pub unsafe fn new(bitmap: *mut u8, len: usize, owner: Arc<dyn Any + Send + Sync>) -> DirtyLog {
        DirtyLog { bitmap: bitmap.cast_const().cast(), len, _owner: owner }
    }

    /// A zeroed log of `len` bytes in this process's memory (tests, tools).
    pub fn in_memory(len: usize) -> DirtyLog {
        let bytes: Arc<[AtomicU8]> = (0..len).map(|_| AtomicU8::new(0)).collect();
        let bitmap = bytes.as_ptr();
        DirtyLog { bitmap, len, _owner: Arc::new(bytes) }
    }

    /// Size of the bitmap in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the bitmap has no byte at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every page below guest address `end` has its bit in the log.
    pub fn covers(&self, end: u64) -> bool {
        end == 0 || (end - 1) / LOG_PAGE / 8 < self.len as u64
    }

    fn byte(&self, i: usize) -> &AtomicU8 {
        debug_assert!(i < self.len);
        // SAFETY: callers check `i < len`; the bitmap is mapped while `self` lives (`new`).
        unsafe { &*self.bitmap.add(i) }
    }

    /// Marks every page that `[gpa, gpa + len)` touches; returns how many pages that is (pages
    /// beyond the end of the log are not marked nor counted: the connection refuses logs that
    /// do not cover guest memory, so only a hostile address gets there).
    #[inline]
    pub fn mark(&self, gpa: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        let mut marked = 0;
        for page in first..=last {
            let i = page / 8;
            if i >= self.len as u64 {
                break;
            }
            self.byte(i as usize).fetch_or(1 << (page % 8), Ordering::Relaxed);
            marked += 1;
        }
        marked
    }

    /// Whether page number `page` (guest address / 4096) is marked.
    pub fn is_marked(&self, page: u64) -> bool {
        let i = page / 8;
        i < self.len as u64 && self.byte(i as usize).load(Ordering::Relaxed) & (1 << (page % 8)) != 0
    }

    /// The page numbers marked, in order (tests and checks; walks the whole bitmap).
    pub fn marked_pages(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for i in 0..self.len {
            let b = self.byte(i).load(Ordering::Relaxed);
            out.extend((0..8).filter(|bit| b & (1 << bit) != 0).map(|bit| i as u64 * 8 + bit));
        }
        out
    }

    /// Clears every bit, as the front-end does when it syncs the log.
    pub fn clear(&self) {
        for i in 0..self.len {
            self.byte(i).store(0, Ordering::Relaxed);
        }
    }
}

/// How a ring logs what the device writes into its used side: the log, the guest address its
/// used ring (split) or device event area (packed) is logged at (vhost-user's
/// `log_guest_addr`), the guest address of the descriptor ring (packed: used descriptors are
/// written back there), and the pages marked so far.
#[derive(Clone, Debug)]
pub struct RingLog {
    log: Arc<DirtyLog>,
    used: u64,
    desc: u64,
    pages: u64,
}

impl RingLog {
    /// A ring log marking the used side at `used` and packed descriptors in the ring at `desc`.
    pub fn new(log: Arc<DirtyLog>, used: u64, desc: u64) -> RingLog {
        RingLog { log, used, desc, pages: 0 }
    }

    /// Marks `len` bytes at `offset` into the used ring / device event area.
    #[inline]
    pub(crate) fn used(&mut self, offset: u64, len: u64) {
        self.pages += self.log.mark(self.used.wrapping_add(offset), len);
    }

    /// Marks `len` bytes at `offset` into the descriptor ring.
    #[inline]
    pub(crate) fn desc(&mut self, offset: u64, len: u64) {
        self.pages += self.log.mark(self.desc.wrapping_add(offset), len);
    }

    /// Pages marked since the last call.
    pub(crate) fn take_pages(&mut self) -> u64 {
        std::mem::take(&mut self.pages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_every_page_a_range_touches_and_nothing_else() {
        let log = DirtyLog::in_memory(4);
        assert_eq!(log.mark(0x1fff, 2), 2, "two bytes across a page boundary");
        assert_eq!(log.marked_pages(), vec![1, 2]);
        assert_eq!(log.mark(0x5000, 0x1000), 1, "exactly one page");
        assert_eq!(log.mark(0x5000, 0), 0);
        assert_eq!(log.marked_pages(), vec![1, 2, 5]);
        assert!(log.is_marked(5) && !log.is_marked(4) && !log.is_marked(6));
        log.clear();
        assert!(log.marked_pages().is_empty());
    }

    #[test]
    fn pages_beyond_the_log_are_not_marked() {
        let log = DirtyLog::in_memory(1);
        assert!(log.covers(8 * LOG_PAGE) && !log.covers(8 * LOG_PAGE + 1) && log.covers(0));
        assert_eq!(log.mark(6 * LOG_PAGE, 4 * LOG_PAGE), 2, "pages 6 and 7 only");
        assert_eq!(log.mark(u64::MAX - 1, 8), 0, "no overflow at the top of the address space");
        assert_eq!(log.marked_pages(), vec![6, 7]);
    }

    #[test]
    fn ring_logs_count_what_they_mark() {
        let log = Arc::new(DirtyLog::in_memory(2));
        let mut r = RingLog::new(log.clone(), 0x3000, 0x8000);
        r.used(0xffe, 4);
        r.desc(16, 8);
        assert_eq!(r.take_pages(), 3);
        assert_eq!(r.take_pages(), 0);
        assert_eq!(log.marked_pages(), vec![3, 4, 8]);
    }
}
