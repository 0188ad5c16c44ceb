//! The process's DMA memory map: which ranges of this process's memory a device may address,
//! and at which I/O virtual address (IOVA). docs/nvme.md, "Memory".
//!
//! A frontend registers the memory its requests point into (a vhost-user guest's regions, the
//! daemon's own [`crate::AlignedBuf`]s); a driver that hands addresses to hardware (the NVMe
//! PCIe driver) adds a [`DmaListener`] that maps each region into its IOMMU container, and
//! translates request addresses with a [`Translator`]. Anything outside the map is bounced by
//! the driver through memory of its own. This is SPDK's `spdk_mem_register` and memory-map
//! notification in one small piece: the map is process-wide because a buffer's owner (the
//! frontend) and its user (a driver several layers below) never meet.
//!
//! IOVAs are handed out here, not taken equal to virtual addresses: user-space addresses run to
//! 47 bits, and an IOMMU may translate fewer (QEMU's intel-iommu: 39).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Registration granularity: a page. Regions are widened to whole pages.
pub const DMA_PAGE: usize = 4096;
/// The first IOVA handed out: 4 GiB. Below it an IOMMU reserves windows a mapping may not use
/// (x86's MSI range at 0xfee00000, firmware's RMRRs), so a large region (a guest's memory)
/// starting low would cross one and be refused; above 4 GiB the window is free on x86.
pub const IOVA_BASE: u64 = 1 << 32;
/// The end of the IOVA space handed out: 39 bits, the narrowest IOMMU width a driver here
/// meets (QEMU's intel-iommu by default).
pub const IOVA_LIMIT: u64 = 1 << 39;

/// One registered range: `len` bytes at `vaddr`, visible to devices at `iova`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaRegion {
    /// Start in this process, page aligned.
    pub vaddr: usize,
    /// Length in bytes, whole pages.
    pub len: usize,
    /// Start as devices address it, page aligned.
    pub iova: u64,
}

impl DmaRegion {
    /// The IOVA of `[vaddr, vaddr + len)` if it lies wholly inside this region.
    #[inline]
    pub fn iova_of(&self, vaddr: usize, len: usize) -> Option<u64> {
        let off = vaddr.checked_sub(self.vaddr)?;
        (off.checked_add(len)? <= self.len).then(|| self.iova + off as u64)
    }
}

/// Something that makes regions reachable by a device (an IOMMU container). Called on the
/// control plane, under the map's lock: it must not register or unregister memory itself.
pub trait DmaListener: Send + Sync {
    /// `region` is registered: make it reachable at its IOVA.
    fn map(&self, region: &DmaRegion) -> std::io::Result<()>;
    /// `region` is going away: make it unreachable. Called before the memory is unmapped.
    fn unmap(&self, region: &DmaRegion);
}

/// Identifies a listener for [`MemoryMap::remove_listener`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerId(u64);

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
pub enum DmaError {
    /// The range overlaps a registered one without being it.
    #[error("the range {vaddr:#x}+{len:#x} overlaps a registered region")]
    Overlap {
        /// Start asked for.
        vaddr: usize,
        /// Length asked for.
        len: usize,
    },
    /// The range was not registered.
    #[error("the range {vaddr:#x}+{len:#x} is not registered")]
    NotRegistered {
        /// Start asked for.
        vaddr: usize,
        /// Length asked for.
        len: usize,
    },
    /// No IOVA space left for it.
    #[error("no IOVA space left for {0} bytes")]
    NoSpace(usize),
    /// A listener refused it (an IOMMU map failed).
    #[error("mapping for DMA failed: {0}")]
    Map(#[source] std::io::Error),
}

struct Entry {
    region: DmaRegion,
    /// Registrations of exactly this range: each unregisters once.
    refs: u32,
}

#[derive(Default)]
struct State {
    /// Sorted by vaddr, disjoint.
    entries: Vec<Entry>,
    /// Free IOVA ranges below `next_iova`, (iova, len), reused first fit.
    free: Vec<(u64, u64)>,
    next_iova: u64,
    listeners: Vec<(ListenerId, Arc<dyn DmaListener>)>,
    next_listener: u64,
}

/// The map. One per process: [`memory_map`].
pub struct MemoryMap {
    state: Mutex<State>,
    /// The regions as [`Translator`]s read them: replaced whole on each change.
    published: Mutex<Arc<Vec<DmaRegion>>>,
    /// Bumped after each change, so a translator reloads only then.
    generation: AtomicU64,
    /// Registrations refused (overlap, no IOVA space, a listener's map failed).
    failed: AtomicU64,
}

/// What the map holds now, and how often it refused (`MemoryMap::stats`): memory outside it
/// is bounced by a driver that needs an IOVA, so refusals cost a copy per request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DmaStats {
    /// Regions registered.
    pub regions: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Listeners (IOMMU containers) mapping them.
    pub listeners: u64,
    /// Registrations refused since the start.
    pub failed_registrations: u64,
}

/// The process's map.
pub fn memory_map() -> &'static MemoryMap {
    static MAP: OnceLock<MemoryMap> = OnceLock::new();
    MAP.get_or_init(MemoryMap::new)
}

fn page_span(vaddr: usize, len: usize) -> (usize, usize) {
    let start = vaddr & !(DMA_PAGE - 1);
    let end = (vaddr + len.max(1)).div_ceil(DMA_PAGE) * DMA_PAGE;
    (start, end - start)
}

impl MemoryMap {
    fn new() -> MemoryMap {
        MemoryMap {
            state: Mutex::new(State { next_iova: IOVA_BASE, ..State::default() }),
            published: Mutex::new(Arc::new(Vec::new())),
            generation: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// What the map holds and how often it refused.
    pub fn stats(&self) -> DmaStats {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        DmaStats {
            regions: st.entries.len() as u64,
            bytes: st.entries.iter().map(|e| e.region.len as u64).sum(),
            listeners: st.listeners.len() as u64,
            failed_registrations: self.failed.load(Ordering::Relaxed),
        }
    }

    /// Registers `[vaddr, vaddr + len)` (widened to whole pages) and maps it in every listener;
    /// returns the IOVA of `vaddr`. Registering exactly a registered range again counts a
    /// reference; any other overlap is refused. The memory must stay mapped until the matching
    /// [`MemoryMap::unregister`].
    pub fn register(&self, vaddr: usize, len: usize) -> Result<u64, DmaError> {
        let r = self.register_inner(vaddr, len);
        if r.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn register_inner(&self, vaddr: usize, len: usize) -> Result<u64, DmaError> {
        let (start, span) = page_span(vaddr, len);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let at = st.entries.partition_point(|e| e.region.vaddr + e.region.len <= start);
        if let Some(e) = st.entries.get_mut(at) {
            if e.region.vaddr == start && e.region.len == span {
                e.refs += 1;
                return Ok(e.region.iova + (vaddr - start) as u64);
            }
            if e.region.vaddr < start + span {
                return Err(DmaError::Overlap { vaddr, len });
            }
        }
        let iova = st.alloc_iova(span as u64).ok_or(DmaError::NoSpace(span))?;
        let region = DmaRegion { vaddr: start, len: span, iova };
        for (i, (_, l)) in st.listeners.iter().enumerate() {
            if let Err(e) = l.map(&region) {
                for (_, done) in &st.listeners[..i] {
                    done.unmap(&region);
                }
                st.free_iova(iova, span as u64);
                return Err(DmaError::Map(e));
            }
        }
        st.entries.insert(at, Entry { region, refs: 1 });
        self.publish(&st);
        Ok(iova + (vaddr - start) as u64)
    }

    /// Drops one registration of the range [`MemoryMap::register`] took; the last one unmaps
    /// it from every listener.
    pub fn unregister(&self, vaddr: usize, len: usize) -> Result<(), DmaError> {
        let (start, span) = page_span(vaddr, len);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Sorted by vaddr: a bisection, not a scan (thousands of slot buffers come and go).
        let at = st.entries.partition_point(|e| e.region.vaddr < start);
        if st.entries.get(at).is_none_or(|e| e.region.vaddr != start || e.region.len != span) {
            return Err(DmaError::NotRegistered { vaddr, len });
        }
        st.entries[at].refs -= 1;
        if st.entries[at].refs > 0 {
            return Ok(());
        }
        let region = st.entries.remove(at).region;
        // Translators stop handing out the IOVA before the device loses it.
        self.publish(&st);
        for (_, l) in &st.listeners {
            l.unmap(&region);
        }
        st.free_iova(region.iova, region.len as u64);
        Ok(())
    }

    /// Adds a listener and maps every region registered now in it (all or nothing).
    pub fn add_listener(&self, listener: Arc<dyn DmaListener>) -> Result<ListenerId, DmaError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (i, e) in st.entries.iter().enumerate() {
            if let Err(err) = listener.map(&e.region) {
                for done in &st.entries[..i] {
                    listener.unmap(&done.region);
                }
                return Err(DmaError::Map(err));
            }
        }
        let id = ListenerId(st.next_listener);
        st.next_listener += 1;
        st.listeners.push((id, listener));
        Ok(id)
    }

    /// Removes a listener, unmapping every region from it.
    pub fn remove_listener(&self, id: ListenerId) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = st.listeners.iter().position(|(l, _)| *l == id) {
            let (_, l) = st.listeners.remove(i);
            for e in &st.entries {
                l.unmap(&e.region);
            }
        }
    }

    /// The regions now, sorted by address.
    pub fn regions(&self) -> Arc<Vec<DmaRegion>> {
        self.published.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The virtual address of `[iova, iova + len)` if one region holds it all: what an
    /// emulated device does in place of an IOMMU. Control-plane speed (a lock and a scan).
    pub fn vaddr_of(&self, iova: u64, len: usize) -> Option<usize> {
        self.regions().iter().find_map(|r| {
            let off = iova.checked_sub(r.iova)?;
            (off.checked_add(len as u64)? <= r.len as u64).then(|| r.vaddr + off as usize)
        })
    }

    /// Copies the `dst.len()` bytes at `iova` into `dst`, as a device reads memory handed to
    /// it (an emulated device, in place of DMA); `false`, with nothing read, when no region
    /// holds them all.
    pub fn device_read(&self, iova: u64, dst: &mut [u8]) -> bool {
        let Some(vaddr) = self.vaddr_of(iova, dst.len()) else { return false };
        // SAFETY: the range lies in one registered region, which its owner keeps mapped until it
        // unregisters it (`register`'s contract) and hands to devices, to read and write at any
        // time, as hardware would; `dst` is the caller's own memory, not a region's.
        unsafe { std::ptr::copy_nonoverlapping(vaddr as *const u8, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` to the memory at `iova`, as a device writes memory handed to it; `false`,
    /// with nothing written, when no region holds all of it.
    pub fn device_write(&self, iova: u64, src: &[u8]) -> bool {
        let Some(vaddr) = self.vaddr_of(iova, src.len()) else { return false };
        // SAFETY: as in `device_read`: registered memory, handed to devices to write.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), vaddr as *mut u8, src.len()) };
        true
    }

    /// The 4-byte word at `iova` (4-aligned), loaded atomically with `Acquire`, as a device
    /// reads a word the host updates concurrently (a shadow doorbell); `None` when no region
    /// holds it or it is not aligned.
    pub fn device_load_u32(&self, iova: u64) -> Option<u32> {
        let word = self.device_word(iova)?;
        // SAFETY: an aligned word of registered memory (see `device_word`), which every party
        // accesses atomically or by whole stores.
        Some(unsafe { (*word).load(Ordering::Acquire) })
    }

    /// Stores `v` atomically with `Release` to the 4-byte word at `iova` (4-aligned), as a
    /// device publishes a word the host polls (an event index, a completion's last dword);
    /// `false` when no region holds it or it is not aligned.
    pub fn device_store_u32(&self, iova: u64, v: u32) -> bool {
        let Some(word) = self.device_word(iova) else { return false };
        // SAFETY: as in `device_load_u32`.
        unsafe { (*word).store(v, Ordering::Release) };
        true
    }

    /// The registered, 4-aligned word at `iova`.
    fn device_word(&self, iova: u64) -> Option<*const AtomicU32> {
        let vaddr = self.vaddr_of(iova, 4)?;
        (vaddr % 4 == 0).then_some(vaddr as *const AtomicU32)
    }

    /// A translator for one thread's hot path.
    pub fn translator(&'static self) -> Translator {
        Translator { map: self, generation: u64::MAX, regions: Arc::new(Vec::new()), last: 0 }
    }

    fn publish(&self, st: &State) {
        let regions = Arc::new(st.entries.iter().map(|e| e.region).collect());
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = regions;
        self.generation.fetch_add(1, Ordering::Release);
    }
}

impl State {
    fn alloc_iova(&mut self, len: u64) -> Option<u64> {
        if let Some(i) = self.free.iter().position(|&(_, l)| l >= len) {
            let (iova, l) = self.free[i];
            if l == len {
                self.free.remove(i);
            } else {
                self.free[i] = (iova + len, l - len);
            }
            return Some(iova);
        }
        let iova = self.next_iova;
        (iova + len <= IOVA_LIMIT).then(|| {
            self.next_iova += len;
            iova
        })
    }

    fn free_iova(&mut self, iova: u64, len: u64) {
        if iova + len == self.next_iova {
            self.next_iova = iova;
        } else {
            self.free.push((iova, len));
        }
    }
}

/// One thread's view of the map: a copy of the regions, reloaded when the map changed (one
/// atomic load per call otherwise) and searched by bisection, the region of the last hit
/// first (a queue's requests mostly land in one region: a guest's RAM, a buffer pool).
pub struct Translator {
    map: &'static MemoryMap,
    generation: u64,
    regions: Arc<Vec<DmaRegion>>,
    last: usize,
}

impl Translator {
    /// The IOVA of `[vaddr, vaddr + len)`, or `None` when no one region holds it all (the
    /// caller bounces it).
    #[inline]
    pub fn translate(&mut self, vaddr: usize, len: usize) -> Option<u64> {
        let generation = self.map.generation.load(Ordering::Acquire);
        if generation == self.generation {
            if let Some(iova) = self.regions.get(self.last).and_then(|g| g.iova_of(vaddr, len)) {
                return Some(iova);
            }
        }
        self.search(vaddr, len, generation)
    }

    /// Reloads the regions if the map changed, and bisects them.
    #[inline(never)]
    fn search(&mut self, vaddr: usize, len: usize, generation: u64) -> Option<u64> {
        if generation != self.generation {
            self.regions = self.map.regions();
            self.generation = generation;
        }
        let r = &self.regions;
        let at = r.partition_point(|g| g.vaddr + g.len <= vaddr);
        let iova = r.get(at)?.iova_of(vaddr, len)?;
        self.last = at;
        Some(iova)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Recorder {
        mapped: Mutex<Vec<DmaRegion>>,
        refuse_after: AtomicUsize,
    }

    impl DmaListener for Recorder {
        fn map(&self, region: &DmaRegion) -> std::io::Result<()> {
            let mut m = self.mapped.lock().unwrap();
            if m.len() >= self.refuse_after.load(Ordering::Relaxed) {
                return Err(std::io::Error::from_raw_os_error(libc::ENOMEM));
            }
            m.push(*region);
            Ok(())
        }
        fn unmap(&self, region: &DmaRegion) {
            self.mapped.lock().unwrap().retain(|r| r != region);
        }
    }

    fn buf(pages: usize) -> crate::AlignedBuf {
        crate::AlignedBuf::zeroed(pages * DMA_PAGE)
    }

    #[test]
    fn registered_memory_translates_and_maps_in_listeners() {
        // A private map: the process-wide one is shared with other tests.
        let map: &'static MemoryMap = Box::leak(Box::new(MemoryMap::new()));
        let rec = Arc::new(Recorder { refuse_after: AtomicUsize::new(usize::MAX), ..Default::default() });
        let id = map.add_listener(rec.clone()).unwrap();
        let a = buf(4);
        let base = a.as_ptr() as usize;
        let iova = map.register(base, 4 * DMA_PAGE).unwrap();
        assert!(iova >= IOVA_BASE);
        let mut t = map.translator();
        assert_eq!(t.translate(base + 100, 512), Some(iova + 100));
        assert_eq!(t.translate(base + 4 * DMA_PAGE - 512, 512), Some(iova + 4 * DMA_PAGE as u64 - 512));
        assert_eq!(t.translate(base + 4 * DMA_PAGE - 512, 1024), None, "runs past the region");
        assert_eq!(map.vaddr_of(iova + 8, 8), Some(base + 8));
        assert_eq!(rec.mapped.lock().unwrap().len(), 1);
        // A second registration of the same range is a reference; an overlap is refused.
        assert_eq!(map.register(base, 4 * DMA_PAGE).unwrap(), iova);
        assert!(matches!(map.register(base + DMA_PAGE, DMA_PAGE), Err(DmaError::Overlap { .. })));
        map.unregister(base, 4 * DMA_PAGE).unwrap();
        assert_eq!(t.translate(base, 8), Some(iova));
        map.unregister(base, 4 * DMA_PAGE).unwrap();
        assert_eq!(t.translate(base, 8), None);
        assert!(rec.mapped.lock().unwrap().is_empty());
        assert!(matches!(map.unregister(base, 4 * DMA_PAGE), Err(DmaError::NotRegistered { .. })));
        map.remove_listener(id);
    }

    #[test]
    fn a_listener_that_refuses_leaves_nothing_registered() {
        let map: &'static MemoryMap = Box::leak(Box::new(MemoryMap::new()));
        let a = buf(1);
        let b = buf(2);
        map.register(a.as_ptr() as usize, DMA_PAGE).unwrap();
        // Added late: maps what is there.
        let rec = Arc::new(Recorder { refuse_after: AtomicUsize::new(1), ..Default::default() });
        map.add_listener(rec.clone()).unwrap();
        assert_eq!(rec.mapped.lock().unwrap().len(), 1);
        assert!(matches!(map.register(b.as_ptr() as usize, 2 * DMA_PAGE), Err(DmaError::Map(_))));
        assert_eq!(map.regions().len(), 1);
        assert_eq!(map.translator().translate(b.as_ptr() as usize, 8), None);
        let st = map.stats();
        assert_eq!(
            (st.regions, st.bytes, st.listeners, st.failed_registrations),
            (1, DMA_PAGE as u64, 1, 1),
            "the refusal is counted"
        );
    }

    #[test]
    fn iova_space_is_reused_after_unregister() {
        let map: &'static MemoryMap = Box::leak(Box::new(MemoryMap::new()));
        let (a, b, c) = (buf(2), buf(2), buf(1));
        let ia = map.register(a.as_ptr() as usize, 2 * DMA_PAGE).unwrap();
        let ib = map.register(b.as_ptr() as usize, 2 * DMA_PAGE).unwrap();
        assert_eq!(ib, ia + 2 * DMA_PAGE as u64);
        map.unregister(a.as_ptr() as usize, 2 * DMA_PAGE).unwrap();
        let ic = map.register(c.as_ptr() as usize, DMA_PAGE).unwrap();
        assert_eq!(ic, ia, "first fit in the freed range");
        // Unaligned ranges are widened to pages.
        map.unregister(c.as_ptr() as usize + 10, 20).unwrap();
    }

    #[test]
    fn a_device_reaches_registered_memory_only() {
        let map: &'static MemoryMap = Box::leak(Box::new(MemoryMap::new()));
        let mem = buf(1);
        let iova = map.register(mem.as_ptr() as usize, DMA_PAGE).unwrap();
        assert!(map.device_write(iova + 8, &[1, 2, 3, 4]));
        let mut back = [0u8; 6];
        assert!(map.device_read(iova + 7, &mut back));
        assert_eq!(back, [0, 1, 2, 3, 4, 0]);
        assert!(map.device_store_u32(iova + 16, 0xdead_beef));
        assert_eq!(map.device_load_u32(iova + 16), Some(0xdead_beef));
        // Unaligned words, ranges past the region and unmapped addresses are refused.
        assert_eq!(map.device_load_u32(iova + 2), None);
        assert!(!map.device_store_u32(iova + 2, 1));
        assert!(!map.device_write(iova + DMA_PAGE as u64 - 2, &[9; 4]));
        assert!(!map.device_read(iova - 8, &mut back));
        map.unregister(mem.as_ptr() as usize, DMA_PAGE).unwrap();
        assert!(!map.device_read(iova, &mut back));
    }
}
