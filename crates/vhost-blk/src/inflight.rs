//! Crash-safe in-flight tracking (vhost-user.rst, "Inflight I/O tracking", split virtqueues).
//!
//! The back-end keeps, in a shared memory file it hands to the front-end
//! (`GET_INFLIGHT_FD`), a record of every request it has taken from the available ring and not
//! yet returned. The front-end keeps the file across a back-end crash and hands it to the new
//! back-end (`SET_INFLIGHT_FD`), which resubmits what was in flight, in the order it was taken.
//! Requests completed out of order before the crash are not in the record, so they are not
//! replayed.
//!
//! Layout, per queue (all fields native-endian, as the spec's C structs):
//! a 16-byte header `{ features: u64, version: u16, desc_num: u16, last_batch_head: u16,
//! used_idx: u16 }` then `desc_num` entries of 16 bytes
//! `{ inflight: u8, padding: [u8; 5], next: u16, counter: u64 }`. flashpath rounds each queue's
//! region up to 64 bytes; the whole file is `num_queues` such regions.
//!
//! Write ordering is what makes this crash-safe: a head is marked in flight before its request
//! is submitted; on completion the batch is linked through `next`, the used index is published,
//! and only then are the marks cleared and `used_idx` updated. A crash between the publish and
//! the clearing is detected on recovery (`used_idx` differs from the ring's index) and the
//! last batch is cleared then.

use std::fs::File;
use std::sync::atomic::{compiler_fence, Ordering};
use std::sync::Arc;

use vm_memory::{FileOffset, MmapRegion};

const HEADER: usize = 16;
const ENTRY: usize = 16;
const ALIGN: usize = 64;
const VERSION: u16 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InflightError {
    #[error("in-flight area of {size} bytes is too small for {queues} queues of {queue_size} entries")]
    TooSmall { size: u64, queues: u16, queue_size: u16 },
    #[error("in-flight area of {size} bytes at offset {offset} does not fit its file ({file_len} bytes)")]
    BeyondFile { offset: u64, size: u64, file_len: u64 },
    #[error("invalid in-flight description: {0}")]
    Invalid(&'static str),
    #[error("cannot create or map the in-flight area: {0}")]
    Map(String),
    #[error("queue {index} has {ring} entries but its in-flight region was made for {region}")]
    SizeMismatch { index: u16, ring: u16, region: u16 },
}

/// Bytes one queue's region takes.
pub fn queue_region_size(queue_size: u16) -> usize {
    (HEADER + ENTRY * usize::from(queue_size)).div_ceil(ALIGN) * ALIGN
}

/// The mapped in-flight file of one connection.
pub struct InflightArea {
    map: MmapRegion<()>,
    num_queues: u16,
    queue_size: u16,
}

impl InflightArea {
    /// Creates a zeroed area (`GET_INFLIGHT_FD`). Returns it and the file to send.
    pub fn create(num_queues: u16, queue_size: u16) -> Result<(Arc<InflightArea>, File, u64), InflightError> {
        if num_queues == 0 || queue_size == 0 || !queue_size.is_power_of_two() {
            return Err(InflightError::Invalid("queue count and size must be non-zero, size a power of two"));
        }
        let size = queue_region_size(queue_size) * usize::from(num_queues);
        // SAFETY: the name is a valid NUL-terminated string; the result is checked.
        let fd = unsafe { libc::memfd_create(c"flashpath-inflight".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(InflightError::Map(std::io::Error::last_os_error().to_string()));
        }
        // SAFETY: `fd` is a fresh memfd owned by nobody else.
        let file = unsafe { <File as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
        file.set_len(size as u64).map_err(|e| InflightError::Map(e.to_string()))?;
        let area = Self::map(&file, size as u64, 0, num_queues, queue_size)?;
        Ok((area, file, size as u64))
    }

    /// Maps an area the front-end hands back (`SET_INFLIGHT_FD`).
    pub fn map(
        file: &File,
        mmap_size: u64,
        mmap_offset: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Arc<InflightArea>, InflightError> {
        if num_queues == 0 || queue_size == 0 {
            return Err(InflightError::Invalid("zero queues or queue size"));
        }
        let need = queue_region_size(queue_size) as u64 * u64::from(num_queues);
        if mmap_size < need || mmap_size > (1 << 30) {
            return Err(InflightError::TooSmall { size: mmap_size, queues: num_queues, queue_size });
        }
        // The file is the front-end's: a page mapped past its end would raise SIGBUS on the
        // reactor at the first access.
        let file_len = file.metadata().map_err(|e| InflightError::Map(e.to_string()))?.len();
        if mmap_offset.checked_add(need).is_none_or(|end| end > file_len) {
            return Err(InflightError::BeyondFile { offset: mmap_offset, size: need, file_len });
        }
        let dup = file.try_clone().map_err(|e| InflightError::Map(e.to_string()))?;
        let map = MmapRegion::<()>::build(
            Some(FileOffset::new(dup, mmap_offset)),
            need as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .map_err(|e| InflightError::Map(e.to_string()))?;
        Ok(Arc::new(InflightArea { map, num_queues, queue_size }))
    }

    pub fn num_queues(&self) -> u16 {
        self.num_queues
    }

    pub fn queue_size(&self) -> u16 {
        self.queue_size
    }

    /// The tracker for queue `index` with a ring of `ring_size` entries.
    pub fn queue(self: &Arc<Self>, index: u16, ring_size: u16) -> Result<InflightQueue, InflightError> {
        if index >= self.num_queues {
            return Err(InflightError::Invalid("queue index beyond the in-flight area"));
        }
        if ring_size != self.queue_size {
            return Err(InflightError::SizeMismatch { index, ring: ring_size, region: self.queue_size });
        }
        let offset = queue_region_size(self.queue_size) * usize::from(index);
        // SAFETY: `offset` + the region size is within the mapping (checked in `map`).
        let base = unsafe { self.map.as_ptr().add(offset) };
        Ok(InflightQueue { _area: self.clone(), base, size: ring_size, counter: 0, batch_len: 0 })
    }
}

/// What recovery found in a queue's region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Heads to resubmit, oldest first.
    pub resubmit: Vec<u16>,
    /// Whether the region held state from a previous back-end (false: freshly initialised).
    pub reused: bool,
}

/// One queue's region. Lives on the queue's reactor.
pub struct InflightQueue {
    _area: Arc<InflightArea>,
    base: *mut u8,
    size: u16,
    counter: u64,
    /// Entries linked into the current completion batch.
    batch_len: u16,
}

impl InflightQueue {
    // Field accessors. SAFETY for all: `base` points to this queue's region inside the mapping
    // held alive by `_area` (checked at construction); offsets are inside the region for
    // `head < size`; the front-end only stores the file, so this thread is the only writer.
    // Volatile accesses keep every store in program order relative to the used-ring publish,
    // which is what recovery after a crash relies on.

    fn read_u16(&self, off: usize) -> u16 {
        // SAFETY: see above; 2-aligned offsets in a page-aligned mapping.
        unsafe { std::ptr::read_volatile(self.base.add(off) as *const u16) }
    }

    fn write_u16(&mut self, off: usize, v: u16) {
        // SAFETY: see above.
        unsafe { std::ptr::write_volatile(self.base.add(off) as *mut u16, v) }
    }

    fn entry(&self, head: u16) -> usize {
        HEADER + ENTRY * usize::from(head)
    }

    fn inflight(&self, head: u16) -> bool {
        // SAFETY: see above.
        unsafe { std::ptr::read_volatile(self.base.add(self.entry(head))) != 0 }
    }

    fn set_inflight(&mut self, head: u16, v: bool) {
        let off = self.entry(head);
        // SAFETY: see above.
        unsafe { std::ptr::write_volatile(self.base.add(off), u8::from(v)) }
    }

    fn counter_of(&self, head: u16) -> u64 {
        // SAFETY: see above; 8-aligned (16-byte entries after a 16-byte header).
        unsafe { std::ptr::read_volatile(self.base.add(self.entry(head) + 8) as *const u64) }
    }

    fn set_counter(&mut self, head: u16, v: u64) {
        let off = self.entry(head) + 8;
        // SAFETY: see above.
        unsafe { std::ptr::write_volatile(self.base.add(off) as *mut u64, v) }
    }

    /// Prepares the region when the queue starts. `ring_used_idx` is the used ring's `idx` as
    /// the guest sees it now.
    pub fn recover(&mut self, ring_used_idx: u16) -> Recovered {
        let version = self.read_u16(8);
        if version != VERSION || self.read_u16(10) != self.size {
            // Fresh (or foreign) region: start clean.
            // SAFETY: the region is `queue_region_size(size)` bytes (see accessors).
            unsafe { std::ptr::write_bytes(self.base, 0, queue_region_size(self.size)) };
            self.write_u16(8, VERSION);
            self.write_u16(10, self.size);
            self.write_u16(14, ring_used_idx);
            self.counter = 0;
            return Recovered { resubmit: Vec::new(), reused: false };
        }
        let used_idx = self.read_u16(14);
        if used_idx != ring_used_idx {
            // The previous back-end published a batch but died before clearing its marks.
            let batch = ring_used_idx.wrapping_sub(used_idx);
            let mut head = self.read_u16(12);
            for _ in 0..batch.min(self.size) {
                if head >= self.size {
                    break;
                }
                self.set_inflight(head, false);
                head = self.read_u16(self.entry(head) + 6);
            }
            self.write_u16(14, ring_used_idx);
        }
        let mut pending: Vec<(u64, u16)> =
            (0..self.size).filter(|&h| self.inflight(h)).map(|h| (self.counter_of(h), h)).collect();
        pending.sort_unstable();
        // The counters are the frontend's memory: a hostile one may have left u64::MAX there.
        self.counter = (0..self.size).map(|h| self.counter_of(h)).max().unwrap_or(0).wrapping_add(1);
        Recovered { resubmit: pending.into_iter().map(|(_, h)| h).collect(), reused: true }
    }

    /// Records that `head` was taken from the available ring.
    pub fn taken(&mut self, head: u16) {
        if head >= self.size {
            return;
        }
        let c = self.counter;
        self.counter = self.counter.wrapping_add(1);
        self.set_counter(head, c);
        compiler_fence(Ordering::SeqCst);
        self.set_inflight(head, true);
    }

    /// Links `head` into the batch about to be published.
    pub fn completing(&mut self, head: u16) {
        if head >= self.size {
            return;
        }
        let last = self.read_u16(12);
        let off = self.entry(head) + 6;
        self.write_u16(off, last);
        self.write_u16(12, head);
        self.batch_len += 1;
    }

    /// After the used index `used_idx` was published: clears the batch's marks.
    pub fn published(&mut self, used_idx: u16) {
        compiler_fence(Ordering::SeqCst);
        let mut head = self.read_u16(12);
        for _ in 0..self.batch_len {
            if head >= self.size {
                break;
            }
            self.set_inflight(head, false);
            head = self.read_u16(self.entry(head) + 6);
        }
        self.batch_len = 0;
        compiler_fence(Ordering::SeqCst);
        self.write_u16(14, used_idx);
    }

    /// Heads currently marked in flight (for tests and diagnostics).
    pub fn marked(&self) -> Vec<u16> {
        (0..self.size).filter(|&h| self.inflight(h)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area() -> Arc<InflightArea> {
        InflightArea::create(2, 8).unwrap().0
    }

    #[test]
    fn region_sizes_are_aligned_and_checked() {
        assert_eq!(queue_region_size(8), 192);
        assert_eq!(queue_region_size(256), 4160);
        let (_, file, size) = InflightArea::create(2, 8).unwrap();
        assert_eq!(size, 384);
        assert!(matches!(InflightArea::map(&file, 100, 0, 2, 8), Err(InflightError::TooSmall { .. })));
        let a = InflightArea::map(&file, size, 0, 2, 8).unwrap();
        assert!(matches!(a.queue(0, 16), Err(InflightError::SizeMismatch { .. })));
        assert!(a.queue(2, 8).is_err());
        // An area that claims more of the file than the file holds (a front-end's lie that would
        // end in SIGBUS), including through the offset.
        assert!(matches!(InflightArea::map(&file, 8320, 0, 2, 256), Err(InflightError::BeyondFile { .. })));
        assert!(matches!(InflightArea::map(&file, size, 64, 2, 8), Err(InflightError::BeyondFile { .. })));
        assert!(matches!(
            InflightArea::map(&file, size, u64::MAX, 2, 8),
            Err(InflightError::BeyondFile { .. })
        ));
    }

    #[test]
    fn a_clean_region_recovers_nothing_and_resubmits_in_taken_order() {
        let a = area();
        let mut q = a.queue(1, 8).unwrap();
        assert_eq!(q.recover(0), Recovered { resubmit: vec![], reused: false });
        for h in [5, 2, 7] {
            q.taken(h);
        }
        // Head 2 completes (out of order) and is published.
        q.completing(2);
        q.published(1);
        // "Crash": a new tracker over the same region, ring used idx 1.
        let mut again = a.queue(1, 8).unwrap();
        let r = again.recover(1);
        assert!(r.reused);
        assert_eq!(r.resubmit, vec![5, 7], "in the order they were taken; 2 is not replayed");
        // Queue 0 is untouched.
        let mut q0 = a.queue(0, 8).unwrap();
        assert!(!q0.recover(0).reused);
    }

    #[test]
    fn a_crash_between_publish_and_clearing_clears_the_last_batch() {
        let a = area();
        let mut q = a.queue(0, 8).unwrap();
        q.recover(0);
        for h in [1, 3, 4] {
            q.taken(h);
        }
        q.completing(4);
        q.completing(1);
        // The used index (2) reaches the guest, then the back-end dies before `published`.
        let mut again = a.queue(0, 8).unwrap();
        let r = again.recover(2);
        assert_eq!(r.resubmit, vec![3]);
        assert_eq!(again.marked(), vec![3]);
        // Counting continues after the largest counter seen.
        again.taken(6);
        let mut third = a.queue(0, 8).unwrap();
        assert_eq!(third.recover(2).resubmit, vec![3, 6]);
    }

    #[test]
    fn a_crash_before_publish_resubmits_the_whole_batch() {
        let a = area();
        let mut q = a.queue(0, 8).unwrap();
        q.recover(0);
        q.taken(0);
        q.taken(1);
        q.completing(1);
        let mut again = a.queue(0, 8).unwrap();
        assert_eq!(again.recover(0).resubmit, vec![0, 1], "the guest never saw 1 complete");
    }
}
