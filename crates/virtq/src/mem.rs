//! Guest memory as the data path translates it.
//!
//! vm-memory's `GuestMemoryMmap` owns the mappings; translating through its traits costs a
//! region search, slice bookkeeping and bounds objects per access (measured at several hundred
//! instructions per request). A [`MemTable`] is built once per memory snapshot, on the queue's
//! own reactor, and keeps only `(guest address, length, host address)` per region plus the
//! index of the region that answered last: the common case is one subtraction and one compare.

use std::cell::Cell;
use std::sync::Arc;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// Guest memory type used by flashpath (no vm-memory dirty bitmap: live migration logs through
/// [`crate::DirtyLog`], whose bitmap the front-end provides).
pub type GuestMemory = vm_memory::GuestMemoryMmap<()>;

#[derive(Clone, Copy, Debug)]
struct Region {
    gpa: u64,
    len: u64,
    host: *mut u8,
}

impl Region {
    /// Host address of `[gpa, gpa + len)` if it lies inside this region.
    #[inline(always)]
    fn host_range(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let off = gpa.wrapping_sub(self.gpa);
        if off < self.len && len <= self.len - off {
            // SAFETY: `off < self.len`, so the result stays inside the region's mapping.
            Some(unsafe { self.host.add(off as usize) })
        } else {
            None
        }
    }

    /// Whether `[host, host + len)` lies inside this region's mapping.
    #[inline(always)]
    fn holds(&self, host: *const u8, len: usize) -> bool {
        let off = (host as usize).wrapping_sub(self.host as usize) as u64;
        off < self.len && len as u64 <= self.len - off
    }

    /// Guest address of host address `host` if it lies inside this region.
    #[inline(always)]
    fn guest_addr(&self, host: *const u8) -> Option<u64> {
        let off = (host as usize).wrapping_sub(self.host as usize) as u64;
        (off < self.len).then(|| self.gpa + off)
    }
}

/// A translation table over one guest-memory snapshot. Holds the snapshot alive, so every
/// pointer it returns stays valid for the table's lifetime. Not `Sync`: each queue has its own
/// (the recently-hit regions are per queue).
///
/// Two regions are remembered, not one: a request's header and status often live in one region
/// and its data in another (libblkio's request area and the application's buffers; a guest's
/// low and high memory), and with one entry every request would miss twice. They are kept as
/// copies of their entries, not as indices into `regions`: a translation then reads its three
/// fields straight from the table, with no index to load and bound-check (4 instructions less
/// per translation, three translations per request, under callgrind).
pub struct MemTable {
    regions: Box<[Region]>,
    /// The last region hit (a copy of one of `regions`).
    last: Cell<Region>,
    /// The region hit before it (a copy of one of `regions`).
    prev: Cell<Region>,
    mem: Arc<GuestMemory>,
}

impl MemTable {
    /// Builds the table; `None` when the snapshot has no region.
    pub fn new(mem: Arc<GuestMemory>) -> Option<MemTable> {
        let mut regions: Vec<Region> = mem
            .iter()
            .filter_map(|r| {
                let host = mem.get_host_address(r.start_addr()).ok()?;
                Some(Region { gpa: r.start_addr().0, len: r.len(), host })
            })
            .filter(|r| r.len > 0)
            .collect();
        if regions.is_empty() {
            return None;
        }
        regions.sort_by_key(|r| r.gpa);
        let first = Cell::new(regions[0]);
        Some(MemTable { regions: regions.into_boxed_slice(), last: first.clone(), prev: first, mem })
    }

    /// The snapshot this table translates.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.mem
    }

    /// Host address of `[gpa, gpa + len)` when the whole range lies in one region (`len` may be
    /// 0: then `gpa` must be inside a region). Always inlined: two compares on the hot path,
    /// and a call cost the packed walker's fast path 20 instructions per descriptor under
    /// callgrind when LLVM left it out of line.
    #[inline(always)]
    pub fn translate(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let p = self.host_or_null(gpa, len);
        (!p.is_null()).then_some(p)
    }

    /// [`MemTable::translate`] as a pointer, null for `None` (no mapping lies at address 0):
    /// what a walked descriptor keeps. A walker that stored `translate`'s result so paid for the
    /// `Option` (a select per descriptor, 7 instructions per request under callgrind).
    #[inline(always)]
    pub(crate) fn host_or_null(&self, gpa: u64, len: u64) -> *mut u8 {
        if let Some(p) = self.last.get().host_range(gpa, len) {
            return p;
        }
        // No reordering on a hit here: the common pattern alternates between two regions, and
        // keeping the order costs a store per access for nothing.
        if let Some(p) = self.prev.get().host_range(gpa, len) {
            return p;
        }
        self.translate_slow(gpa, len).unwrap_or(std::ptr::null_mut())
    }

    #[cold]
    fn translate_slow(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let i = self.position(gpa)?;
        let p = self.regions[i].host_range(gpa, len)?;
        self.prev.set(self.last.get());
        self.last.set(self.regions[i]);
        Some(p)
    }

    /// Guest address of host address `host` (a pointer this table handed out, e.g. an iovec
    /// built from a descriptor), for logging what the device wrote there. The region of the
    /// last forward translation is tried first: a request's data and status were translated
    /// just before, so the common case is one compare.
    #[inline]
    pub fn guest_addr(&self, host: *const u8) -> Option<u64> {
        if let Some(g) = self.last.get().guest_addr(host) {
            return Some(g);
        }
        if let Some(g) = self.prev.get().guest_addr(host) {
            return Some(g);
        }
        self.regions.iter().find_map(|r| r.guest_addr(host))
    }

    /// Whether `[host, host + len)` lies inside one region's mapping: a pointer this table
    /// handed out (a descriptor's host address, an iovec or status byte built from one) still
    /// points into memory the table keeps mapped. The regions of the last translations are
    /// tried first: the common case is two compares.
    #[inline(always)]
    fn holds(&self, host: *const u8, len: usize) -> bool {
        self.last.get().holds(host, len)
            || self.prev.get().holds(host, len)
            || self.regions.iter().any(|r| r.holds(host, len))
    }

    /// The byte at guest address `gpa`, to store into: `None` outside guest memory.
    #[inline]
    pub fn byte(&self, gpa: u64) -> Option<GuestByte> {
        self.translate(gpa, 1).map(GuestByte::from_host)
    }

    /// Copies the bytes at `host` into `out`, one volatile load each (the guest may write them
    /// meanwhile): `false`, copying nothing, when they are not inside one region.
    pub fn read_bytes(&self, host: *const u8, out: &mut [u8]) -> bool {
        if !self.holds(host, out.len()) {
            return false;
        }
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: inside one region's mapping, which this table keeps alive.
            *b = unsafe { std::ptr::read_volatile(host.wrapping_add(i)) };
        }
        true
    }

    /// Stores `src` at `host`, one volatile store each (the guest may look at any time):
    /// `false`, storing nothing, when the bytes are not inside one region.
    #[inline(always)]
    pub fn write_bytes(&self, host: *mut u8, src: &[u8]) -> bool {
        if !self.holds(host, src.len()) {
            return false;
        }
        for (i, &b) in src.iter().enumerate() {
            // SAFETY: inside one region's mapping, which this table keeps alive and which is
            // mapped writable (guest RAM); a `u8` store has no alignment requirement.
            unsafe { std::ptr::write_volatile(host.wrapping_add(i), b) };
        }
        true
    }

    /// Index of the region containing `gpa`.
    fn position(&self, gpa: u64) -> Option<usize> {
        let i = self.regions.partition_point(|r| r.gpa <= gpa).checked_sub(1)?;
        (gpa - self.regions[i].gpa < self.regions[i].len).then_some(i)
    }

    /// Calls `f` with the host pieces of `[gpa, gpa + len)`, which may run across adjacent
    /// regions (each region is a separate mapping). Returns false, possibly after some calls,
    /// when part of the range is outside guest memory or `f` returned false.
    pub fn for_each_piece(&self, gpa: u64, len: u64, mut f: impl FnMut(*mut u8, u64) -> bool) -> bool {
        let (mut gpa, mut left) = (gpa, len);
        while left > 0 {
            let Some(i) = self.position(gpa) else { return false };
            let r = self.regions[i];
            let off = gpa - r.gpa;
            let take = left.min(r.len - off);
            // SAFETY: `off < r.len`.
            if !f(unsafe { r.host.add(off as usize) }, take) {
                return false;
            }
            left -= take;
            match gpa.checked_add(take) {
                Some(next) => gpa = next,
                None => return left == 0,
            }
        }
        true
    }

    /// Whether `[gpa, gpa + len)` is entirely guest memory (possibly across regions).
    pub fn contains(&self, gpa: u64, len: u64) -> bool {
        self.translate(gpa, len).is_some() || self.for_each_piece(gpa, len, |_, _| true)
    }
}

/// One byte of guest memory the device writes (a request's status byte): made only from a
/// walked descriptor or a memory table's translation, so it stays valid while that table lives,
/// which its owner (a queue) keeps until the byte is written. An address only, so it may move
/// between threads; [`GuestByte::DETACHED`] stands for none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestByte(usize);

impl GuestByte {
    /// No byte: stores to it do nothing (for requests built without a ring, in tests).
    pub const DETACHED: GuestByte = GuestByte(0);

    /// A byte the table translated (crate-only: that is what makes it valid).
    #[inline(always)]
    pub(crate) fn from_host(host: *mut u8) -> GuestByte {
        GuestByte(host.expose_provenance())
    }

    /// The host address (null when detached).
    #[inline(always)]
    pub fn as_ptr(self) -> *mut u8 {
        std::ptr::with_exposed_provenance_mut(self.0)
    }

    /// Stores `value` (volatile: the guest may look at any time).
    #[inline(always)]
    pub fn store(self, value: u8) {
        if self.0 != 0 {
            // SAFETY: a byte inside one mapping of the memory table that made it, which its
            // owner keeps alive (the type's contract); guest RAM is mapped writable; a `u8`
            // store has no alignment requirement.
            unsafe { std::ptr::write_volatile(self.as_ptr(), value) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    fn table() -> MemTable {
        // Two adjacent regions and one after a gap.
        let mem = GuestMemory::from_ranges(&[
            (GuestAddress(0x1000), 0x1000),
            (GuestAddress(0x2000), 0x1000),
            (GuestAddress(0x8000), 0x1000),
        ])
        .unwrap();
        MemTable::new(Arc::new(mem)).unwrap()
    }

    #[test]
    fn ranges_translate_only_inside_one_region() {
        let t = table();
        let base = t.memory().get_host_address(GuestAddress(0x2000)).unwrap();
        assert_eq!(t.translate(0x2010, 16), Some(base.wrapping_add(0x10)));
        assert_eq!(t.translate(0x2000, 0x1000), Some(base));
        assert_eq!(t.translate(0x2001, 0x1000), None, "crosses the end of the last region hit");
        assert_eq!(t.translate(0x1ff0, 0x20), None, "spans two regions");
        assert_eq!(t.translate(0x3000, 1), None, "in the gap");
        assert!(t.translate(0x8fff, 1).is_some());
        assert_eq!(t.translate(0x8fff, 2), None);
        assert_eq!(t.translate(u64::MAX, 1), None);
        assert_eq!(t.translate(0x8000, u64::MAX), None);
        assert_eq!(t.translate(0, 1), None);
    }

    #[test]
    fn pieces_follow_adjacent_regions_and_stop_at_gaps() {
        let t = table();
        let mut pieces = Vec::new();
        assert!(t.for_each_piece(0x1ff0, 0x20, |p, n| {
            pieces.push((p, n));
            true
        }));
        assert_eq!(pieces.len(), 2);
        assert_eq!((pieces[0].1, pieces[1].1), (0x10, 0x10));
        assert!(t.contains(0x1000, 0x2000));
        assert!(!t.contains(0x2000, 0x1001), "runs into the gap");
        assert!(!t.contains(u64::MAX - 4, 8));
        assert!(!t.for_each_piece(0x1000, 0x20, |_, _| false), "the callback can stop the walk");
    }

    #[test]
    fn host_addresses_translate_back() {
        let t = table();
        for gpa in [0x1000, 0x1fff, 0x2010, 0x8000, 0x8fff] {
            let host = t.translate(gpa, 1).unwrap();
            assert_eq!(t.guest_addr(host), Some(gpa));
        }
        // Not the region hit last: found by the scan.
        let low = t.translate(0x1008, 1).unwrap();
        t.translate(0x8000, 1).unwrap();
        t.translate(0x2000, 1).unwrap();
        assert_eq!(t.guest_addr(low), Some(0x1008));
        let elsewhere = [0u8; 4];
        assert_eq!(t.guest_addr(elsewhere.as_ptr()), None, "not guest memory");
        assert_eq!(t.guest_addr(std::ptr::null()), None);
    }

    #[test]
    fn guest_bytes_are_reached_only_inside_one_region() {
        let t = table();
        let p = t.translate(0x2ff0, 16).unwrap();
        assert!(t.write_bytes(p, &[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]));
        let mut b = [0u8; 9];
        assert!(t.read_bytes(p.wrapping_add(7), &mut b));
        assert_eq!(b, [0, 2, 0, 0, 0, 0, 0, 0, 0]);
        // Across the region's end (even if another region's mapping follows), or not guest
        // memory.
        let mut c = [0u8; 24];
        assert!(!t.read_bytes(p, &mut c));
        assert!(!t.write_bytes(p.wrapping_add(15), &[1, 1]));
        let mut outside = [7u8; 8];
        assert!(!t.write_bytes(outside.as_mut_ptr(), &[1]));
        assert_eq!(outside, [7; 8]);
        assert!(!t.read_bytes(std::ptr::null(), &mut b));
        // A region other than the last two hit is found too.
        let low = t.translate(0x1000, 8).unwrap();
        t.translate(0x8000, 1).unwrap();
        t.translate(0x2000, 1).unwrap();
        assert!(t.read_bytes(low, &mut b));
        // The status byte a memory table translates is stored through.
        let status = t.byte(0x2ff0).unwrap();
        status.store(9);
        assert!(t.read_bytes(p, &mut b[..1]));
        assert_eq!(b[0], 9);
        assert_eq!(t.byte(0x3000), None);
        GuestByte::DETACHED.store(1);
    }
}
