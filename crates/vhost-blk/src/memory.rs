//! Guest memory as the frontend describes it: regions of shared files mapped into this process.
//!
//! vhost-user hands us each region as an fd plus three addresses (vhost-user.rst, "Memory region
//! description"): the guest-physical address the virtqueue descriptors use, the VMM's own
//! virtual address, which `SET_VRING_ADDR` uses for the rings, and the offset into the fd.
//! [`MemoryMap`] keeps both views. Each change builds a new immutable [`GuestMemory`] snapshot;
//! reactors receive the snapshot by message (an `Arc`), so the data path never locks to
//! translate an address.

use std::fs::File;
use std::sync::Arc;

use fp_virtio_blk::GuestMemory;
use vhost::vhost_user::message::VhostUserMemoryRegion;
use vm_memory::{FileOffset, GuestAddress, GuestRegionMmap, MmapRegion};

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
        Region { gpa: self.gpa, size: self.size, user_addr: self.user_addr, mapped: self.mapped.clone() }
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
    let mapped = GuestRegionMmap::new(mmap, GuestAddress(r.guest_phys_addr)).ok_or_else(bad)?;
    Ok(Region {
        gpa: r.guest_phys_addr,
        size: r.memory_size,
        user_addr: r.user_addr,
        mapped: Arc::new(mapped),
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
