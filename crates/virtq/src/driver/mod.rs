//! The driver side of a virtqueue, for a client that plays the guest (fp-load): the memory it
//! shares with the device ([`SharedMem`], [`DriverMem`]) and the two ring layouts
//! ([`SplitDriver`], virtio 1.2 §2.7; [`PackedDriver`], §2.8).
//!
//! The one unsafe step is describing memory the driver does not own ([`DriverMem::new`]: the
//! caller promises it is mapped and outlives every view). Memory fp-virtq maps itself
//! ([`SharedMem`], a memfd the device maps too) gives views safely, each holding the mapping
//! alive. Every access after that is a bounds-checked volatile load or store at an offset: the
//! device writes the same memory at any time, so nothing here forms a Rust reference into it.
//! An offset outside the view, or misaligned for its width, panics as a slice index does.

mod packed;
#[cfg(test)]
mod ring_tests;
mod split;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use packed::PackedDriver;
pub use split::{SplitDriver, SplitLayout};

/// The huge page size [`SharedMem::new`] uses with `hugetlb`.
pub const HUGE_PAGE: usize = 2 << 20;
/// `MFD_HUGE_2MB`: `MFD_HUGETLB`'s page size, log2 in bits 26.. (memfd_create(2)).
const MFD_HUGE_2MB: libc::c_uint = 21 << 26;

/// Why shared memory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SharedMemError {
    /// A system call failed.
    #[error("{op}: {source}")]
    Os {
        /// The call.
        op: &'static str,
        /// Its error.
        #[source]
        source: io::Error,
    },
    /// Huge pages were asked for and the system has too few free.
    #[error(
        "{op}: no {pages} free 2 MiB huge pages for the shared memory ({source}); raise vm.nr_hugepages"
    )]
    NoHugePages {
        /// The call that failed.
        op: &'static str,
        /// Huge pages needed.
        pages: usize,
        /// Its error.
        #[source]
        source: io::Error,
    },
    /// A length of zero, or with `hugetlb` not a multiple of [`HUGE_PAGE`].
    #[error(
        "shared memory of {0} bytes: the length must be non-zero (and whole 2 MiB pages with huge pages)"
    )]
    BadLength(usize),
}

/// A shared, writable mapping of a memfd, which the device maps too (vhost-user's memory
/// table). Unmapped when dropped: hold it (or a [`DriverMem`] of it) while the device may use it.
#[derive(Debug)]
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping has no state tied to a thread (whichever thread drops it unmaps it), and
// `SharedMem` hands out no shared references into it: `as_mut_slice` borrows it exclusively,
// views only make volatile or atomic accesses, which are sound from any thread.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// `len` bytes of zeroed memfd-backed memory; with `hugetlb`, of 2 MiB huge pages (named
    /// explicitly rather than the system's default huge page size, so that `len`, a multiple of
    /// [`HUGE_PAGE`], fits them whatever the default).
    pub fn new(len: usize, hugetlb: bool) -> Result<SharedMem, SharedMemError> {
        if len == 0 || (hugetlb && len % HUGE_PAGE != 0) {
            return Err(SharedMemError::BadLength(len));
        }
        let flags =
            if hugetlb { libc::MFD_CLOEXEC | libc::MFD_HUGETLB | MFD_HUGE_2MB } else { libc::MFD_CLOEXEC };
        let fail = |op: &'static str| {
            let source = io::Error::last_os_error();
            if hugetlb && matches!(source.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EINVAL)) {
                SharedMemError::NoHugePages { op, pages: len / HUGE_PAGE, source }
            } else {
                SharedMemError::Os { op, source }
            }
        };
        // SAFETY: the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"fp-driver-mem".as_ptr(), flags) };
        if fd < 0 {
            return Err(fail("memfd_create"));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len).map_err(|_| SharedMemError::BadLength(len))?;
        // SAFETY: plain system call on an open descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(fail("ftruncate"));
        }
        // SAFETY: a fresh shared mapping of the whole memfd; no existing memory is affected.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        // A shared hugetlb mapping reserves its pages here (hugetlbpage.rst, "reservation"), so
        // a shortage is this error and never a SIGBUS at first touch.
        if addr == libc::MAP_FAILED {
            return Err(fail("mmap"));
        }
        let ptr = NonNull::new(addr.cast()).ok_or(SharedMemError::BadLength(len))?;
        Ok(SharedMem { ptr, len, fd })
    }

    /// The memfd, for the device's memory table.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// The mapping's address in this process.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The mapping's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: a mapping has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The whole mapping as bytes, while no view of it exists (`&mut self`): for a library that
    /// lays out its own structures in it before the device starts.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` mapped bytes, borrowed exclusively; the device is not using them yet
        // (caller's sequencing; the bytes are plain data either way).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// A view of the whole mapping that keeps it alive.
    pub fn view(self: &Arc<SharedMem>) -> DriverMem {
        DriverMem { ptr: self.ptr, len: self.len, _owner: Some(Arc::clone(self)) }
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; every view holds an `Arc` to this
        // value, so none is left.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A window of memory shared with the device, read and written only with volatile (or atomic)
/// accesses at bounds-checked offsets. Cloning is cheap; a clone views the same bytes.
#[derive(Clone, Debug)]
pub struct DriverMem {
    ptr: NonNull<u8>,
    len: usize,
    /// The mapping this view lies in, when fp-virtq made it.
    _owner: Option<Arc<SharedMem>>,
}

// SAFETY: a view only loads and stores through volatile or atomic accesses, which are sound
// from any thread, and its memory stays mapped while it exists (an `Arc` to the mapping, or the
// promise made to `new`, which covers every thread).
unsafe impl Send for DriverMem {}
// SAFETY: as above; `&DriverMem` offers nothing more than an owned view does.
unsafe impl Sync for DriverMem {}

impl DriverMem {
    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr .. ptr + len` is mapped readable and writable, 8-byte aligned, and stays mapped for
    /// as long as this view or any view made from it exists. Other parties may write it
    /// concurrently (that is what the volatile accesses are for), but nothing in this process
    /// holds a Rust reference into it while the views are used.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> DriverMem {
        debug_assert_eq!(ptr.as_ptr() as usize % 8, 0);
        DriverMem { ptr, len, _owner: None }
    }

    /// The `len` bytes at `offset` of this view.
    ///
    /// # Panics
    /// If they are not all inside it.
    pub fn sub(&self, offset: usize, len: usize) -> DriverMem {
        self.check(offset, len, 1);
        // Inside the mapping (checked), which does not start at or wrap to 0.
        let ptr = NonNull::new(self.ptr.as_ptr().wrapping_add(offset)).expect("a mapped address");
        DriverMem { ptr, len, _owner: self._owner.clone() }
    }

    /// Bytes in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The process address of byte `offset` (vhost-user front ends address guest memory by it).
    ///
    /// # Panics
    /// If `offset` is past the end.
    #[inline]
    pub fn addr_of(&self, offset: usize) -> u64 {
        assert!(offset <= self.len, "offset {offset} past a {}-byte view", self.len);
        self.ptr.as_ptr() as u64 + offset as u64
    }

    /// Panics unless `width` bytes at `offset` lie inside the view and `offset` is a multiple of
    /// `align` (the view starts 8-aligned).
    #[inline(always)]
    fn check(&self, offset: usize, width: usize, align: usize) {
        let inside = offset <= self.len && width <= self.len - offset;
        assert!(inside, "{width} bytes at offset {offset} outside a {}-byte view", self.len);
        assert!(offset % align == 0, "offset {offset} not {align}-aligned");
    }

    #[inline(always)]
    fn at<T>(&self, offset: usize) -> *mut T {
        self.check(offset, std::mem::size_of::<T>(), std::mem::align_of::<T>());
        // Inside the view (checked above); the callers dereference it.
        self.ptr.as_ptr().wrapping_add(offset).cast()
    }

    /// Loads the `T` at `offset` (aligned for `T`), one volatile access.
    #[inline(always)]
    fn load<T: Copy>(&self, offset: usize) -> T {
        // SAFETY: a mapped, aligned `T` inside the view (`at` checks); `T` is a plain integer.
        unsafe { self.at::<T>(offset).read_volatile() }
    }

    /// Stores `v` at `offset` (aligned for `T`), one volatile access.
    #[inline(always)]
    fn store<T: Copy>(&self, offset: usize, v: T) {
        // SAFETY: as in `load`; the view is writable (constructor).
        unsafe { self.at::<T>(offset).write_volatile(v) }
    }

    /// Loads the byte at `offset`.
    #[inline]
    pub fn read_u8(&self, offset: usize) -> u8 {
        self.load(offset)
    }

    /// Loads the little-endian u16 at `offset` (2-aligned).
    #[inline]
    pub fn read_u16(&self, offset: usize) -> u16 {
        u16::from_le(self.load(offset))
    }

    /// Loads the little-endian u32 at `offset` (4-aligned).
    #[inline]
    pub fn read_u32(&self, offset: usize) -> u32 {
        u32::from_le(self.load(offset))
    }

    /// Loads the little-endian u64 at `offset` (8-aligned).
    #[inline]
    pub fn read_u64(&self, offset: usize) -> u64 {
        u64::from_le(self.load(offset))
    }

    /// Stores `v` at `offset`.
    #[inline]
    pub fn write_u8(&self, offset: usize, v: u8) {
        self.store(offset, v)
    }

    /// Stores `v` little-endian at `offset` (2-aligned).
    #[inline]
    pub fn write_u16(&self, offset: usize, v: u16) {
        self.store(offset, v.to_le())
    }

    /// Stores `v` little-endian at `offset` (4-aligned).
    #[inline]
    pub fn write_u32(&self, offset: usize, v: u32) {
        self.store(offset, v.to_le())
    }

    /// Stores `v` little-endian at `offset` (8-aligned).
    #[inline]
    pub fn write_u64(&self, offset: usize, v: u64) {
        self.store(offset, v.to_le())
    }

    /// The u64 at `offset` (8-aligned) as an atomic.
    #[inline(always)]
    fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned, mapped word (`at` checks) that lives as long as `self` and that
        // every party accesses atomically or volatilely; AtomicU64 has u64's size and alignment.
        unsafe { AtomicU64::from_ptr(self.at::<u64>(offset)) }
    }

    /// Atomically takes the u64 at `offset` (8-aligned) and leaves 0: for bitmaps the device
    /// sets bits in with atomic ORs (the vhost-user dirty log). A plain load first, so that a
    /// word already 0 costs no exclusive cache-line access.
    #[inline]
    pub fn take_u64(&self, offset: usize) -> u64 {
        let w = self.atomic_u64(offset);
        if w.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        w.swap(0, Ordering::AcqRel)
    }

    /// Atomically ORs `bits` into the u64 at `offset` (8-aligned), as a device marks a log.
    #[inline]
    pub fn or_u64(&self, offset: usize, bits: u64) {
        self.atomic_u64(offset).fetch_or(bits, Ordering::AcqRel);
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    #[inline]
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len(), 1);
        // SAFETY: inside the view (checked). A byte copy into our own buffer: bytes the device
        // changes meanwhile make the copy a mix, never an out-of-bounds access, and `out` is not
        // shared memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) }
    }

    /// Copies `data` to `offset`.
    #[inline]
    pub fn write_bytes(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len(), 1);
        // SAFETY: inside the view (checked) and writable; `data` is not shared memory, so the
        // two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view of 4 KiB of heap memory that `words` owns (Miri runs the accessors over it; it
    /// cannot run `memfd_create`).
    fn heap_view(words: &mut [u64; 512]) -> DriverMem {
        // SAFETY: 4 KiB of 8-aligned memory, borrowed for as long as the test uses the view.
        unsafe { DriverMem::new(NonNull::from(words).cast(), 4096) }
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create is a foreign call Miri cannot run")]
    fn shared_memory_is_zeroed_and_reads_back_what_is_written() {
        let m = Arc::new(SharedMem::new(8192, false).expect("a memfd"));
        let v = m.view();
        assert_eq!((v.len(), v.read_u64(8184)), (8192, 0));
        v.write_u16(2, 0xbeef);
        v.write_u32(4, 0xdead_beef);
        v.write_u64(8, u64::MAX - 1);
        v.write_u8(17, 9);
        assert_eq!(
            (v.read_u16(2), v.read_u32(4), v.read_u64(8), v.read_u8(17)),
            (0xbeef, 0xdead_beef, u64::MAX - 1, 9)
        );
        let w = v.sub(8, 128);
        assert_eq!(w.read_u64(0), u64::MAX - 1);
        assert_eq!(w.addr_of(0), v.addr_of(8));
        let mut b = [0u8; 4];
        v.write_bytes(100, &[1, 2, 3, 4]);
        w.read_bytes(92, &mut b);
        assert_eq!(b, [1, 2, 3, 4]);
        v.or_u64(16, 0b101);
        assert_eq!((v.take_u64(16), v.take_u64(16)), (0b101 | 9 << 8, 0));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create is a foreign call Miri cannot run")]
    fn a_view_keeps_its_mapping_alive() {
        let m = Arc::new(SharedMem::new(4096, false).unwrap());
        let v = m.view().sub(4000, 96);
        drop(m);
        v.write_u64(88, 7);
        assert_eq!(v.read_u64(88), 7);
    }

    #[test]
    #[should_panic(expected = "outside a 16-byte view")]
    fn an_access_past_the_view_panics() {
        heap_view(&mut [0; 512]).sub(0, 16).read_u64(16);
    }

    #[test]
    #[should_panic(expected = "not 4-aligned")]
    fn a_misaligned_access_panics() {
        heap_view(&mut [0; 512]).write_u32(2, 1);
    }

    #[test]
    fn bad_lengths_are_refused_by_name() {
        assert!(matches!(SharedMem::new(0, false), Err(SharedMemError::BadLength(0))));
        assert!(matches!(SharedMem::new(4096, true), Err(SharedMemError::BadLength(4096))));
    }
}
