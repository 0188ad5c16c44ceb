//! Guest memory as the frontend describes it: regions of shared files mapped into this process.
//!
//! vhost-user hands us each region as an fd plus three addresses (vhost-user.rst, "Memory region
//! description"): the guest-physical address the virtqueue descriptors use, the VMM's own
//! virtual address, which `SET_VRING_ADDR` uses for the rings, and the offset into the fd.
//! [`MemoryMap`] keeps both views. Each change builds a new immutable [`GuestMemory`] snapshot;
//! reactors receive the snapshot by message (an `Arc`), so the data path never locks to
//! translate an address.
//!
//! Each mapped region is also registered in the process's DMA map ([`fp_bdev::dma`]) while it
//! is in the table, so a driver below (NVMe over PCIe) hands guest buffers to its device
//! without a bounce copy. The registration holds the mapping: it is unregistered (the device
//! loses it) before the memory can be unmapped. Queues are stopped around every table change
//! (`connection.rs`), so no request is in flight when a region leaves. A region the map refuses
//! is logged and counted there ([`fp_bdev::dma::MemoryMap::stats`]); its requests are bounced.

use std::fs::File;
use std::sync::Arc;

use fp_bdev::dma::memory_map;
use fp_bdev::Iovecs;
use fp_virtio_blk::{parse_chain, parse_three, BlkRequest, Chain, Desc, GuestMemory, MemTable, ParseError};
use vhost::vhost_user::message::VhostUserMemoryRegion;
use vm_memory::{FileOffset, GuestAddress, GuestRegionMmap, MmapRegion};

/// A request slot's data iovecs: the parser fills them with host addresses of guest memory
/// ([`GuestIovecs::parse`] and [`GuestIovecs::parse_three`], the only ways in), and the request carries them to the bdev as
/// [`Iovecs`].
///
/// Its owner (a queue) keeps it, its entries unchanged, and the memory table the chain was
/// walked with until every request that carries its [`Iovecs`] has completed: a queue drains
/// before its table goes, and reuses a slot only after its request completed.
pub struct GuestIovecs {
    entries: Box<[libc::iovec]>,
}

impl GuestIovecs {
    /// Room for `slots` iovecs, all empty.
    pub fn new(slots: usize) -> GuestIovecs {
        let entries =
            (0..slots).map(|_| libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }).collect();
        GuestIovecs { entries }
    }

    /// Parses `chain` (walked with `table`) into a request whose data iovecs are these
    /// entries (see [`parse_chain`]).
    #[inline(always)]
    pub fn parse(&mut self, table: &MemTable, chain: &Chain, head: u16) -> Result<BlkRequest, ParseError> {
        parse_chain(table, chain, head, &mut self.entries)
    }

    /// Parses a three-descriptor chain a ring's walker read without storing it (see
    /// [`parse_three`]): `Some` for a plain read or write, `None` (nothing decided: walk the
    /// chain and [`GuestIovecs::parse`] it) otherwise.
    #[inline(always)]
    pub fn parse_three(&mut self, descs: &[Desc; 3], head: u16) -> Option<BlkRequest> {
        parse_three(descs, head, &mut self.entries)
    }

    /// The entries.
    pub fn entries(&self) -> &[libc::iovec] {
        &self.entries
    }

    /// The first `count` entries (at most all) as a request's buffers.
    #[inline(always)]
    pub fn iovecs(&self, count: u32) -> Iovecs {
        let count = count.min(self.entries.len() as u32);
        // SAFETY: the parser wrote each entry from a descriptor's host buffer or a piece the
        // table translated: inside one region of the chain's memory table, mapped and
        // writable; the owner keeps the entries unchanged and that table alive until the
        // requests carrying the result complete (the type's contract).
        unsafe { Iovecs::from_raw(self.entries.as_ptr(), count) }
    }
}

/// Upper bound on regions per connection (reported as `GET_MAX_MEM_SLOTS`). QEMU needs a handful
/// for a normal guest; libblkio adds one per registered buffer region.
pub const MAX_MEM_REGIONS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("memory region of size 0 or overflowing the address space (gpa {gpa:#x}, size {size:#x})")]
    BadRegion { gpa: u64, size: u64 },
    #[error("too many memory regions (at most {MAX_MEM_REGIONS})")]
    TooManyRegions,
    #[error("memory region at gpa {gpa:#x} overlaps another")]
    Overlap { gpa: u64 },
    #[error("cannot map memory region at gpa {gpa:#x}: {reason}")]
    Map { gpa: u64, reason: String },
    #[error("memory region at gpa {gpa:#x} ends at file offset {end:#x}, beyond the end of its file ({file_size:#x} bytes)")]
    BeyondFile { gpa: u64, end: u64, file_size: u64 },
    #[error("no memory region at gpa {gpa:#x} of size {size:#x} to remove")]
    NoSuchRegion { gpa: u64, size: u64 },
}

struct Region {
    gpa: u64,
    size: u64,
    user_addr: u64,
    mapped: Arc<GuestRegionMmap>,
    /// Its place in the DMA map, shared by the table's copies while they last.
    _dma: Arc<DmaRegistration>,
}

/// A mapping registered in the process's DMA map; unregistered on drop, before its own hold on
/// the mapping goes (fields drop after `drop`), so never after the memory is unmapped.
struct DmaRegistration {
    vaddr: usize,
    len: usize,
    registered: bool,
    _mapping: Arc<GuestRegionMmap>,
}

impl DmaRegistration {
    fn new(gpa: u64, mapping: Arc<GuestRegionMmap>) -> DmaRegistration {
        let (vaddr, len) = (mapping.as_ptr() as usize, mapping.size());
        let registered = match memory_map().register(vaddr, len) {
            Ok(_) => true,
            Err(e) => {
                log::warn!("guest memory at gpa {gpa:#x} ({len:#x} bytes) not registered for DMA (its I/O is copied): {e}");
                false
            }
        };
        DmaRegistration { vaddr, len, registered, _mapping: mapping }
    }
}

impl Drop for DmaRegistration {
    fn drop(&mut self) {
        if self.registered {
            if let Err(e) = memory_map().unregister(self.vaddr, self.len) {
                log::error!("guest memory at {:#x}: leaving the DMA map: {e}", self.vaddr);
            }
        }
    }
}

/// The connection's current memory layout.
#[derive(Default)]
pub struct MemoryMap {
    regions: Vec<Region>,
    snapshot: Option<Arc<GuestMemory>>,
}

impl MemoryMap {
    /// Replaces the whole table (`SET_MEM_TABLE`).
    pub fn set_table(
        &mut self,
        regions: &[VhostUserMemoryRegion],
        files: Vec<File>,
    ) -> Result<(), MemoryError> {
        if regions.len() > MAX_MEM_REGIONS {
            return Err(MemoryError::TooManyRegions);
        }
        let mut new = Vec::with_capacity(regions.len());
        for (r, f) in regions.iter().zip(files) {
            new.push(map_region(r, f)?);
        }
        let snapshot = build(&mut new)?;
        self.regions = new;
        self.snapshot = snapshot;
        Ok(())
    }

    /// Adds one region (`ADD_MEM_REG`).
    pub fn add(&mut self, region: &VhostUserMemoryRegion, file: File) -> Result<(), MemoryError> {
        if self.regions.len() >= MAX_MEM_REGIONS {
            return Err(MemoryError::TooManyRegions);
        }
        let mapped = map_region(region, file)?;
        self.rebuild(|regions| {
            regions.push(mapped);
            Ok(())
        })
    }

    /// Removes one region (`REM_MEM_REG`), matched by guest address and size.
    pub fn remove(&mut self, region: &VhostUserMemoryRegion) -> Result<(), MemoryError> {
        self.rebuild(|regions| {
            let pos = regions
                .iter()
                .position(|r| r.gpa == region.guest_phys_addr && r.size == region.memory_size)
                .ok_or(MemoryError::NoSuchRegion { gpa: region.guest_phys_addr, size: region.memory_size })?;
            regions.remove(pos);
            Ok(())
        })
    }

    /// Applies `change` to a copy of the region list and, if the result is a valid layout,
    /// makes it current with a fresh snapshot. On error nothing changes.
    fn rebuild(
        &mut self,
        change: impl FnOnce(&mut Vec<Region>) -> Result<(), MemoryError>,
    ) -> Result<(), MemoryError> {
        let mut new: Vec<Region> = self.regions.iter().map(Region::clone_ref).collect();
        change(&mut new)?;
        let snapshot = build(&mut new)?;
        self.regions = new;
        self.snapshot = snapshot;
        Ok(())
    }

    /// The current snapshot, if any memory is mapped.
    pub fn snapshot(&self) -> Option<Arc<GuestMemory>> {
        self.snapshot.clone()
    }

    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    /// Translates a VMM virtual address range (as in `SET_VRING_ADDR`) to a guest-physical
    /// address. The whole range must sit in one region.
    pub fn user_to_guest(&self, user_addr: u64, len: u64) -> Option<GuestAddress> {
        self.regions.iter().find_map(|r| {
            let off = user_addr.checked_sub(r.user_addr)?;
            let end = off.checked_add(len)?;
            (end <= r.size).then(|| GuestAddress(r.gpa + off))
        })
    }
}

impl Region {
    fn clone_ref(&self) -> Region {
        Region {
            gpa: self.gpa,
            size: self.size,
            user_addr: self.user_addr,
            mapped: self.mapped.clone(),
            _dma: self._dma.clone(),
        }
    }
}

fn map_region(r: &VhostUserMemoryRegion, file: File) -> Result<Region, MemoryError> {
    let bad = || MemoryError::BadRegion { gpa: r.guest_phys_addr, size: r.memory_size };
    if r.memory_size == 0
        || r.guest_phys_addr.checked_add(r.memory_size).is_none()
        || r.user_addr.checked_add(r.memory_size).is_none()
        || r.mmap_offset.checked_add(r.memory_size).is_none()
    {
        return Err(bad());
    }
    let size = usize::try_from(r.memory_size).map_err(|_| bad())?;
    // Touching a page of a shared mapping beyond the end of its file raises SIGBUS, which
    // would take the whole daemon down: a region must lie inside its file. (Files that are not
    // regular, such as DAX devices, have no meaningful size here; mmap itself refuses ranges
    // they cannot back.)
    let meta =
        file.metadata().map_err(|e| MemoryError::Map { gpa: r.guest_phys_addr, reason: e.to_string() })?;
    if meta.file_type().is_file() && r.mmap_offset + r.memory_size > meta.len() {
        return Err(MemoryError::BeyondFile {
            gpa: r.guest_phys_addr,
            end: r.mmap_offset + r.memory_size,
            file_size: meta.len(),
        });
    }
    let mmap = MmapRegion::<()>::build(
        Some(FileOffset::new(file, r.mmap_offset)),
        size,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_NORESERVE,
    )
    .map_err(|e| MemoryError::Map { gpa: r.guest_phys_addr, reason: e.to_string() })?;
    let mapped = Arc::new(GuestRegionMmap::new(mmap, GuestAddress(r.guest_phys_addr)).ok_or_else(bad)?);
    Ok(Region {
        gpa: r.guest_phys_addr,
        size: r.memory_size,
        user_addr: r.user_addr,
        _dma: Arc::new(DmaRegistration::new(r.guest_phys_addr, mapped.clone())),
        mapped,
    })
}

fn build(regions: &mut [Region]) -> Result<Option<Arc<GuestMemory>>, MemoryError> {
    if regions.is_empty() {
        return Ok(None);
    }
    regions.sort_by_key(|r| r.gpa);
    for w in regions.windows(2) {
        if w[0].gpa + w[0].size > w[1].gpa {
            return Err(MemoryError::Overlap { gpa: w[1].gpa });
        }
    }
    let mem = GuestMemory::from_arc_regions(regions.iter().map(|r| r.mapped.clone()).collect())
        .map_err(|_| MemoryError::Overlap { gpa: regions[0].gpa })?;
    Ok(Some(Arc::new(mem)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use vm_memory::GuestMemoryBackend;

    fn memfd(len: u64) -> File {
        // SAFETY: a valid NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"dma-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh fd nobody else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    fn region(gpa: u64, size: u64) -> VhostUserMemoryRegion {
        VhostUserMemoryRegion::new(gpa, size, 0x7000_0000 + gpa, 0)
    }

    /// The process address where `mem` maps `gpa`.
    fn host(mem: &GuestMemory, gpa: u64) -> usize {
        mem.get_host_address(GuestAddress(gpa)).unwrap() as usize
    }

    /// The DMA map's region starting at `vaddr`, if any.
    fn in_dma_map(vaddr: usize) -> Option<fp_bdev::dma::DmaRegion> {
        memory_map().regions().iter().find(|r| r.vaddr == vaddr).copied()
    }

    #[test]
    fn regions_are_in_the_dma_map_exactly_while_in_the_table() {
        const A: u64 = 0x4_0000;
        const B: u64 = 0x2_0000;
        let mut m = MemoryMap::default();
        let a = memfd(A);
        m.set_table(&[region(0, A)], vec![a]).unwrap();
        // Old snapshots are kept below so no mapping is unmapped (and its address reused by
        // another test) while the map is checked.
        let first = m.snapshot().unwrap();
        let va = host(&first, 0);
        let ra = in_dma_map(va).expect("SET_MEM_TABLE registers the region");
        assert_eq!(ra.len as u64, A);
        assert_eq!(memory_map().vaddr_of(ra.iova + 0x100, 8), Some(va + 0x100));

        m.add(&region(0x10_0000, B), memfd(B)).unwrap();
        let second = m.snapshot().unwrap();
        let vb = host(&second, 0x10_0000);
        assert_eq!(in_dma_map(vb).map(|r| r.len as u64), Some(B), "ADD_MEM_REG registers");
        assert_eq!(in_dma_map(va), Some(ra), "the other region keeps its IOVA");

        m.remove(&region(0x10_0000, B)).unwrap();
        assert_eq!(in_dma_map(vb), None, "REM_MEM_REG unregisters");
        assert_eq!(in_dma_map(va), Some(ra));

        // A new table replaces the old one: the new region in, the old one out.
        m.set_table(&[region(0, A)], vec![memfd(A)]).unwrap();
        let third = m.snapshot().unwrap();
        let vc = host(&third, 0);
        assert_ne!(vc, va);
        assert!(in_dma_map(vc).is_some());
        assert_eq!(in_dma_map(va), None, "the replaced table left the map");

        // A refused change leaves the map as it was.
        assert!(m.add(&region(0, A), memfd(A)).is_err(), "overlaps");
        assert!(in_dma_map(vc).is_some());

        // The connection goes (disconnect): everything leaves.
        drop(m);
        assert_eq!(in_dma_map(vc), None);
        drop((first, second, third));
    }
}
