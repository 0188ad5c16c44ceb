//! Dirty logging for live migration (vhost-user.rst, "Migration").
//!
//! The front-end hands us a log (SET_LOG_BASE: an fd, its size and offset), which
//! [`map_log`] maps shared and checks against the memory table. While the front-end has
//! acked VHOST_F_LOG_ALL, every byte the device writes into guest memory marks its page: the
//! data reads bring in, status bytes, GET_ID strings (`DataLog`, on the queue), and the
//! used side of the ring ([`fp_virtq::RingLog`], inside the ring). A queue receives its
//! [`QueueLog`] at start and, while it runs, by message, before the control plane replies.

use std::fs::File;
use std::sync::Arc;

use fp_virtio_blk::{GuestMemory, StatusPtr};
use fp_virtq::{DirtyLog, MemTable, RingLog, LOG_PAGE};
use vm_memory::{FileOffset, GuestMemoryBackend, GuestMemoryRegion, MmapRegion};

/// Why a log was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    /// mmap_size is 0 or size + offset overflows.
    #[error("log of {size:#x} bytes at offset {offset:#x}: empty or overflowing")]
    BadRange { size: u64, offset: u64 },
    /// The fd's file is shorter than offset + size: touching the rest would raise SIGBUS.
    #[error(
        "log of {size:#x} bytes at offset {offset:#x} runs past the end of its file ({file_size:#x} bytes)"
    )]
    BeyondFile { size: u64, offset: u64, file_size: u64 },
    /// mmap refused the fd (not mappable, no permission...).
    #[error("cannot map the log fd: {0}")]
    Map(String),
    /// The log has no bit for some page of guest memory.
    #[error(
        "log of {size:#x} bytes covers guest memory below {covered:#x} only, \
         but memory reaches {end:#x} (needs {needed:#x} bytes)"
    )]
    TooSmall { size: u64, covered: u64, end: u64, needed: u64 },
}

/// The end (exclusive) of the highest guest memory region.
pub(crate) fn memory_end(mem: &GuestMemory) -> u64 {
    mem.iter().map(|r| r.start_addr().0.saturating_add(r.len())).max().unwrap_or(0)
}

/// Bytes a log needs to cover guest memory up to `end` (exclusive): one bit per 4 KiB page.
pub fn log_bytes_for(end: u64) -> u64 {
    end.div_ceil(LOG_PAGE).div_ceil(8)
}

/// Checks that `log` has a bit for every page of `mem`.
pub fn check_covers(log: &DirtyLog, mem: &GuestMemory) -> Result<(), LogError> {
    let end = memory_end(mem);
    if log.covers(end) {
        return Ok(());
    }
    let size = log.len() as u64;
    Err(LogError::TooSmall { size, covered: size * 8 * LOG_PAGE, end, needed: log_bytes_for(end) })
}

/// Maps `size` bytes at `offset` of `file` shared and writable as a dirty log, and checks that
/// it covers `mem` (the current memory table, if any).
pub fn map_log(
    file: File,
    size: u64,
    offset: u64,
    mem: Option<&GuestMemory>,
) -> Result<Arc<DirtyLog>, LogError> {
    let bad = LogError::BadRange { size, offset };
    if size == 0 || offset.checked_add(size).is_none() {
        return Err(bad);
    }
    let len = usize::try_from(size).map_err(|_| bad)?;
    // As for memory regions: a shared mapping past the end of a regular file faults on touch.
    let meta = file.metadata().map_err(|e| LogError::Map(e.to_string()))?;
    if meta.file_type().is_file() && offset + size > meta.len() {
        return Err(LogError::BeyondFile { size, offset, file_size: meta.len() });
    }
    let region = MmapRegion::<()>::build(
        Some(FileOffset::new(file, offset)),
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_NORESERVE,
    )
    .map_err(|e| LogError::Map(e.to_string()))?;
    let bitmap = region.as_ptr();
    // SAFETY: `region` maps `len` bytes read/write at `bitmap` until it is dropped, and the
    // log keeps it alive; this process touches the bitmap only through the log's atomics.
    let log = Arc::new(unsafe { DirtyLog::new(bitmap, len, Arc::new(region)) });
    if let Some(mem) = mem {
        check_covers(&log, mem)?;
    }
    Ok(log)
}

/// What a queue logs: the data path's writes (VHOST_F_LOG_ALL) and the ring's used side
/// (VHOST_VRING_F_LOG, or LOG_ALL: logging more than asked is safe). `Default`: nothing.
#[derive(Clone, Debug, Default)]
pub struct QueueLog {
    pub data: Option<Arc<DirtyLog>>,
    pub ring: Option<RingLog>,
}

/// The data path's log: marks the guest pages behind host pointers the parser produced.
pub(crate) struct DataLog {
    log: Arc<DirtyLog>,
}

impl DataLog {
    pub(crate) fn new(log: Arc<DirtyLog>) -> DataLog {
        DataLog { log }
    }

    /// Marks the pages of `len` bytes at host address `host` (inside one region of `table`).
    /// Returns the pages marked.
    #[inline]
    fn host_range(&self, table: &MemTable, host: *const u8, len: u64) -> u64 {
        match table.guest_addr(host) {
            Some(gpa) => self.log.mark(gpa, len),
            // Every pointer logged came from `table`: not reached.
            None => 0,
        }
    }

    /// Marks the status byte's page.
    #[inline]
    pub(crate) fn status(&self, table: &MemTable, status: StatusPtr) -> u64 {
        self.host_range(table, status.as_ptr(), 1)
    }

    /// Marks the pages of the first `limit` bytes of `iov` (a read's data buffers; GET_ID's
    /// string). Returns the pages marked.
    #[inline]
    pub(crate) fn iovecs(&self, table: &MemTable, iov: &[libc::iovec], mut limit: u64) -> u64 {
        let mut pages = 0;
        for v in iov {
            if limit == 0 {
                break;
            }
            let take = (v.iov_len as u64).min(limit);
            pages += self.host_range(table, v.iov_base.cast(), take);
            limit -= take;
        }
        pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vm_memory::GuestAddress;

    fn mem(end: u64) -> GuestMemory {
        GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000), (GuestAddress(end - 0x1000), 0x1000)]).unwrap()
    }

    fn file(len: u64) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![0u8; len as usize]).unwrap();
        f
    }

    #[test]
    fn a_log_must_cover_every_page_of_guest_memory() {
        // 1 GiB of address space: 262144 pages, 32 KiB of log.
        let m = mem(1 << 30);
        assert_eq!(log_bytes_for(1 << 30), 32768);
        assert!(map_log(file(32768), 32768, 0, Some(&m)).is_ok());
        let e = map_log(file(32768), 32767, 0, Some(&m)).unwrap_err();
        assert!(matches!(e, LogError::TooSmall { needed: 32768, end: 0x4000_0000, .. }), "{e}");
        assert!(e.to_string().contains("needs 0x8000 bytes"), "{e}");
        // With an offset into the file.
        assert!(map_log(file(4096 + 32768), 32768, 4096, Some(&m)).is_ok());
        // No memory table yet: any log is accepted (checked when memory arrives).
        assert!(map_log(file(8), 8, 0, None).is_ok());
    }

    #[test]
    fn unmappable_or_short_logs_are_refused() {
        assert!(matches!(map_log(file(4096), 8192, 0, None), Err(LogError::BeyondFile { .. })));
        assert!(matches!(map_log(file(4096), 0, 0, None), Err(LogError::BadRange { .. })));
        assert!(matches!(map_log(file(4096), 8, u64::MAX, None), Err(LogError::BadRange { .. })));
        // A pipe cannot be mapped.
        let (r, _w) = fp_sys::pipe().unwrap();
        let e = map_log(File::from(r), 4096, 0, None).unwrap_err();
        assert!(matches!(e, LogError::Map(_)), "{e}");
    }

    #[test]
    fn marks_reach_the_file_the_front_end_reads() {
        use std::os::unix::fs::FileExt;
        let f = file(16);
        let log = map_log(f.try_clone().unwrap(), 16, 0, None).unwrap();
        log.mark(9 * LOG_PAGE, 1);
        let mut b = [0u8; 2];
        f.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(b, [0, 0b10], "bit 1 of byte 1 is page 9");
    }
}
