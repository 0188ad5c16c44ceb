//! VFIO (the kernel's user-space device access, Documentation/driver-api/vfio.rst): a
//! container (`/dev/vfio/vfio`, one IOMMU context), a group (`/dev/vfio/N`, the devices an
//! IOMMU cannot tell apart) and a device fd, with the ioctls a user-space driver needs: type1
//! IOMMU mappings, region info, mmap of a BAR, config space reads and writes, reset.
//!
//! The structures and request numbers are the kernel's UAPI (include/uapi/linux/vfio.h), laid
//! out here by hand: every VFIO request is `_IO(';', 100 + n)` and carries its structure's
//! `argsz`, so the kernel checks the size, not the request number.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;

use crate::fs::{cvt, owned_fd};

/// `VFIO_API_VERSION`: the only version there has ever been.
pub const VFIO_API_VERSION: i32 = 0;
/// `VFIO_TYPE1_IOMMU`: the x86 IOMMU model (map and unmap of whole ranges).
pub const VFIO_TYPE1_IOMMU: u32 = 1;
/// `VFIO_TYPE1v2_IOMMU`: type1 with the stricter unmap semantics; preferred when offered.
pub const VFIO_TYPE1V2_IOMMU: u32 = 3;

/// `VFIO_GROUP_FLAGS_VIABLE`: every device of the group is bound to a VFIO driver (or none).
pub const GROUP_FLAGS_VIABLE: u32 = 1 << 0;
/// `VFIO_GROUP_FLAGS_CONTAINER_SET`: the group belongs to a container.
pub const GROUP_FLAGS_CONTAINER_SET: u32 = 1 << 1;
/// `VFIO_DEVICE_FLAGS_RESET`: the device has a reset (`VFIO_DEVICE_RESET` works).
pub const DEVICE_FLAGS_RESET: u32 = 1 << 0;
/// `VFIO_DEVICE_FLAGS_PCI`: a vfio-pci device (regions follow the PCI index layout).
pub const DEVICE_FLAGS_PCI: u32 = 1 << 1;
/// `VFIO_REGION_INFO_FLAG_READ`.
pub const REGION_INFO_FLAG_READ: u32 = 1 << 0;
/// `VFIO_REGION_INFO_FLAG_WRITE`.
pub const REGION_INFO_FLAG_WRITE: u32 = 1 << 1;
/// `VFIO_REGION_INFO_FLAG_MMAP`: the region may be mapped into the process.
pub const REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
/// `VFIO_DMA_MAP_FLAG_READ`: the device may read the mapping.
pub const DMA_MAP_FLAG_READ: u32 = 1 << 0;
/// `VFIO_DMA_MAP_FLAG_WRITE`: the device may write the mapping.
pub const DMA_MAP_FLAG_WRITE: u32 = 1 << 1;

/// `VFIO_PCI_BAR0_REGION_INDEX`.
pub const PCI_BAR0_REGION_INDEX: u32 = 0;
/// `VFIO_PCI_CONFIG_REGION_INDEX`: the function's configuration space.
pub const PCI_CONFIG_REGION_INDEX: u32 = 7;

const VFIO_TYPE: u64 = b';' as u64;
const VFIO_BASE: u64 = 100;

/// The VFIO requests used here: each is the kernel's `VFIO_` + its name in upper snake case
/// (`GroupGetDeviceFd`: `VFIO_GROUP_GET_DEVICE_FD`), the ioctl `_IO(VFIO_TYPE, VFIO_BASE + n)`
/// with `n` its discriminant (linux/vfio.h; no direction or size bits, linux/ioctl.h).
#[derive(Debug, Clone, Copy)]
#[repr(u64)]
enum Request {
    GetApiVersion,
    CheckExtension,
    SetIommu,
    GroupGetStatus,
    GroupSetContainer,
    GroupUnsetContainer,
    GroupGetDeviceFd,
    DeviceGetInfo,
    DeviceGetRegionInfo,
    DeviceReset = 11,
    IommuGetInfo,
    IommuMapDma,
    IommuUnmapDma,
}

impl Request {
    /// The request number the ioctl takes.
    const fn number(self) -> u64 {
        (VFIO_TYPE << 8) | (VFIO_BASE + self as u64)
    }
}

/// `struct vfio_group_status`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct GroupStatusRaw {
    argsz: u32,
    flags: u32,
}

/// `struct vfio_device_info` (without capabilities: `cap_offset` is read, never followed).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct DeviceInfoRaw {
    argsz: u32,
    flags: u32,
    num_regions: u32,
    num_irqs: u32,
    cap_offset: u32,
}

/// `struct vfio_region_info`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct RegionInfoRaw {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

/// `struct vfio_iommu_type1_info` (its capability chain follows when `argsz` allows).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct IommuInfoRaw {
    argsz: u32,
    flags: u32,
    iova_pgsizes: u64,
    cap_offset: u32,
    pad: u32,
}

/// `VFIO_IOMMU_INFO_PGSIZES`: `iova_pgsizes` is filled in.
const IOMMU_INFO_PGSIZES: u32 = 1 << 0;
/// `VFIO_IOMMU_INFO_CAPS`: a capability chain starts at `cap_offset`.
const IOMMU_INFO_CAPS: u32 = 1 << 1;
/// `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`: the valid IOVA ranges.
const CAP_IOVA_RANGE: u16 = 1;
/// `VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL`: how many more mappings the container takes.
const CAP_DMA_AVAIL: u16 = 3;

/// `struct vfio_iommu_type1_dma_map`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct DmaMapRaw {
    argsz: u32,
    flags: u32,
    vaddr: u64,
    iova: u64,
    size: u64,
}

/// `struct vfio_iommu_type1_dma_unmap` (no dirty bitmap: `data[]` is empty).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct DmaUnmapRaw {
    argsz: u32,
    flags: u32,
    iova: u64,
    size: u64,
}

fn argsz<T>() -> u32 {
    std::mem::size_of::<T>() as u32
}

/// An ioctl whose argument is a plain integer; returns the non-negative result.
fn ioctl_val(fd: &impl AsRawFd, req: Request, arg: libc::c_ulong) -> io::Result<i32> {
    // SAFETY: the descriptor is open (borrowed from its owner); the VFIO requests passed here
    // take an integer argument and read or write no memory of ours.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), req.number() as _, arg) })
}

/// An ioctl whose argument points at `arg`: a VFIO structure starting with `argsz` (a fixed
/// one, or 8-aligned words with room for the capabilities after it), the `int` or the
/// NUL-terminated name a request takes. Returns the non-negative result.
fn ioctl_ptr<T: ?Sized>(fd: &impl AsRawFd, req: Request, arg: &mut T) -> io::Result<i32> {
    // SAFETY: `arg` is live and writable for all its bytes, and its layout is what `req`
    // takes: the kernel reads `argsz` first and touches no more than that many bytes, which
    // callers set to at most `arg`'s size (or, for an int or a name, reads just that).
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), req.number() as _, (arg as *mut T).cast::<u8>()) })
}

fn open_rw(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(path)?;
    Ok(OwnedFd::from(f))
}

/// A VFIO container: one IOMMU address space that groups join.
#[derive(Debug)]
pub struct VfioContainer {
    fd: OwnedFd,
}

impl VfioContainer {
    /// Opens `/dev/vfio/vfio` and checks the API version.
    pub fn open() -> io::Result<VfioContainer> {
        Self::open_path(Path::new("/dev/vfio/vfio"))
    }

    /// Opens the container device at `path` (tests) and checks the API version.
    pub fn open_path(path: &Path) -> io::Result<VfioContainer> {
        let c = VfioContainer { fd: open_rw(path)? };
        let v = c.api_version()?;
        if v != VFIO_API_VERSION {
            return Err(io::Error::other(format!("VFIO API version {v}, expected {VFIO_API_VERSION}")));
        }
        Ok(c)
    }

    /// `VFIO_GET_API_VERSION`.
    pub fn api_version(&self) -> io::Result<i32> {
        ioctl_val(&self.fd, Request::GetApiVersion, 0)
    }

    /// `VFIO_CHECK_EXTENSION`: whether the container offers IOMMU model `ext`
    /// ([`VFIO_TYPE1V2_IOMMU`], [`VFIO_TYPE1_IOMMU`]).
    pub fn check_extension(&self, ext: u32) -> io::Result<bool> {
        Ok(ioctl_val(&self.fd, Request::CheckExtension, ext as libc::c_ulong)? > 0)
    }

    /// `VFIO_SET_IOMMU`: selects the IOMMU model; needs a group in the container first.
    pub fn set_iommu(&self, model: u32) -> io::Result<()> {
        ioctl_val(&self.fd, Request::SetIommu, model as libc::c_ulong).map(drop)
    }

    /// `VFIO_IOMMU_GET_INFO` (type1, after [`VfioContainer::set_iommu`]): page sizes, valid
    /// IOVA ranges, how many more mappings.
    pub fn iommu_info(&self) -> io::Result<IommuInfo> {
        ask_iommu_info(|buf| ioctl_ptr(&self.fd, Request::IommuGetInfo, buf).map(drop))
    }

    /// `VFIO_IOMMU_MAP_DMA`: lets the container's devices reach `[vaddr, vaddr + size)` at
    /// `iova`, with `flags` ([`DMA_MAP_FLAG_READ`] | [`DMA_MAP_FLAG_WRITE`]). The kernel pins
    /// the pages (counted against `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`).
    ///
    /// # Safety
    /// A device may then read and write that memory at any time, behind the compiler's back:
    /// the range must be memory the caller hands to devices (no Rust object relies on its
    /// contents), and must be unmapped with [`VfioContainer::unmap_dma`] before it is freed.
    pub unsafe fn map_dma(&self, vaddr: usize, iova: u64, size: u64, flags: u32) -> io::Result<()> {
        let mut m = DmaMapRaw { argsz: argsz::<DmaMapRaw>(), flags, vaddr: vaddr as u64, iova, size };
        ioctl_ptr(&self.fd, Request::IommuMapDma, &mut m).map(drop)
    }

    /// `VFIO_IOMMU_UNMAP_DMA`: removes the mappings in `[iova, iova + size)`; returns how many
    /// bytes were unmapped.
    pub fn unmap_dma(&self, iova: u64, size: u64) -> io::Result<u64> {
        let mut u = DmaUnmapRaw { argsz: argsz::<DmaUnmapRaw>(), flags: 0, iova, size };
        ioctl_ptr(&self.fd, Request::IommuUnmapDma, &mut u)?;
        Ok(u.size)
    }
}

/// `VFIO_IOMMU_GET_INFO`'s exchange, `ioctl` making the call: the fixed part first; when the
/// kernel names a bigger `argsz`, the capabilities need room, so it asks again with a buffer of
/// that size (8-byte words for the 64-bit fields), a few times in case it grew.
fn ask_iommu_info(mut ioctl: impl FnMut(&mut [u64]) -> io::Result<()>) -> io::Result<IommuInfo> {
    let mut want = std::mem::size_of::<IommuInfoRaw>();
    for _ in 0..5 {
        let mut buf = vec![0u64; want.div_ceil(8)];
        // `argsz` is the first 32-bit field, `flags` (0) the second: the first word.
        buf[0] = words_of_u32s(want as u32, 0);
        ioctl(&mut buf)?;
        let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let got = u32::from_ne_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        if got <= want {
            return parse_iommu_info(&bytes[..want]);
        }
        want = got;
    }
    Err(io::Error::other("VFIO IOMMU info kept growing"))
}

/// The 64-bit word whose bytes in memory are those of `first` then `second`.
fn words_of_u32s(first: u32, second: u32) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&first.to_ne_bytes());
    bytes[4..].copy_from_slice(&second.to_ne_bytes());
    u64::from_ne_bytes(bytes)
}

/// What a type1 container's IOMMU accepts (`VFIO_IOMMU_GET_INFO`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IommuInfo {
    /// Bitmap of the page sizes it maps (bit 12: 4 KiB); 0 when not reported.
    pub page_sizes: u64,
    /// The IOVA ranges a mapping may use, `(first, last)` inclusive, reserved windows (the
    /// x86 MSI range at 0xfee00000) left out; empty when the kernel does not report them.
    pub iova_ranges: Vec<(u64, u64)>,
    /// How many more mappings it takes (type1 limits their number: module parameter
    /// `dma_entry_limit`), when reported.
    pub dma_avail: Option<u32>,
}

impl IommuInfo {
    /// Whether `[start, end)` lies in one valid range (true when no ranges are reported).
    pub fn allows(&self, start: u64, end: u64) -> bool {
        self.iova_ranges.is_empty()
            || self.iova_ranges.iter().any(|&(a, b)| a <= start && end.saturating_sub(1) <= b)
    }
}

/// Reads `VFIO_IOMMU_GET_INFO`'s answer: the fixed part and the capabilities it knows.
fn parse_iommu_info(buf: &[u8]) -> io::Result<IommuInfo> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("VFIO IOMMU info: {what}"));
    let u16_at = |o: usize| buf.get(o..o + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let u32_at = |o: usize| buf.get(o..o + 4).map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")));
    let u64_at = |o: usize| buf.get(o..o + 8).map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
    let flags = u32_at(4).ok_or_else(|| bad("short"))?;
    let mut info = IommuInfo::default();
    if flags & IOMMU_INFO_PGSIZES != 0 {
        info.page_sizes = u64_at(8).ok_or_else(|| bad("short"))?;
    }
    if flags & IOMMU_INFO_CAPS == 0 {
        return Ok(info);
    }
    let mut at = u32_at(16).ok_or_else(|| bad("short"))? as usize;
    let mut seen = 0;
    while at != 0 {
        seen += 1;
        if seen > 64 || at < std::mem::size_of::<IommuInfoRaw>() {
            return Err(bad("capability chain loops or points backwards"));
        }
        let id = u16_at(at).ok_or_else(|| bad("capability outside the buffer"))?;
        let next = u32_at(at + 4).ok_or_else(|| bad("capability outside the buffer"))? as usize;
        match id {
            CAP_IOVA_RANGE => {
                let n = u32_at(at + 8).ok_or_else(|| bad("IOVA range capability cut short"))?;
                for i in 0..n as usize {
                    let o = at + 16 + i * 16;
                    let (a, b) = u64_at(o).zip(u64_at(o + 8)).ok_or_else(|| bad("IOVA range cut short"))?;
                    info.iova_ranges.push((a, b));
                }
            }
            CAP_DMA_AVAIL => info.dma_avail = Some(u32_at(at + 8).ok_or_else(|| bad("DMA avail cut short"))?),
            _ => {}
        }
        at = next;
    }
    Ok(info)
}

/// A group's state (`VFIO_GROUP_GET_STATUS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupStatus {
    /// Every device of the group is bound to a VFIO driver or to none: usable.
    pub viable: bool,
    /// The group already belongs to a container.
    pub container_set: bool,
}

/// A VFIO group (`/dev/vfio/N`).
#[derive(Debug)]
pub struct VfioGroup {
    fd: OwnedFd,
}

impl VfioGroup {
    /// Opens `/dev/vfio/<number>`.
    pub fn open(number: u32) -> io::Result<VfioGroup> {
        Self::open_path(&Path::new("/dev/vfio").join(number.to_string()))
    }

    /// Opens the group device at `path`.
    pub fn open_path(path: &Path) -> io::Result<VfioGroup> {
        Ok(VfioGroup { fd: open_rw(path)? })
    }

    /// `VFIO_GROUP_GET_STATUS`.
    pub fn status(&self) -> io::Result<GroupStatus> {
        let mut s = GroupStatusRaw { argsz: argsz::<GroupStatusRaw>(), flags: 0 };
        ioctl_ptr(&self.fd, Request::GroupGetStatus, &mut s)?;
        Ok(GroupStatus {
            viable: s.flags & GROUP_FLAGS_VIABLE != 0,
            container_set: s.flags & GROUP_FLAGS_CONTAINER_SET != 0,
        })
    }

    /// `VFIO_GROUP_SET_CONTAINER`: joins `container`.
    pub fn set_container(&self, container: &VfioContainer) -> io::Result<()> {
        let mut fd: i32 = container.fd.as_raw_fd();
        ioctl_ptr(&self.fd, Request::GroupSetContainer, &mut fd).map(drop)
    }

    /// `VFIO_GROUP_UNSET_CONTAINER`: leaves the container (every device fd closed first).
    pub fn unset_container(&self) -> io::Result<()> {
        ioctl_val(&self.fd, Request::GroupUnsetContainer, 0).map(drop)
    }

    /// `VFIO_GROUP_GET_DEVICE_FD`: the device named `name` ("0000:00:04.0").
    pub fn device(&self, name: &str) -> io::Result<VfioDevice> {
        let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // The kernel only reads the NUL-terminated name.
        let fd = ioctl_ptr(&self.fd, Request::GroupGetDeviceFd, &mut c.into_bytes_with_nul()[..])?;
        // SAFETY: VFIO_GROUP_GET_DEVICE_FD answers with a new descriptor, which nothing else owns.
        Ok(VfioDevice { fd: File::from(unsafe { owned_fd(fd) }?) })
    }
}

/// A device's summary (`VFIO_DEVICE_GET_INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `VFIO_DEVICE_FLAGS_*` ([`DEVICE_FLAGS_RESET`], [`DEVICE_FLAGS_PCI`]).
    pub flags: u32,
    /// Regions (for PCI: BARs 0-5, ROM, config, ...).
    pub num_regions: u32,
    /// Interrupt kinds.
    pub num_irqs: u32,
}

/// One region of a device (`VFIO_DEVICE_GET_REGION_INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// Its index.
    pub index: u32,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Size in bytes (0: not implemented).
    pub size: u64,
    /// Offset in the device fd where reads, writes and mmap reach it.
    pub offset: u64,
}

/// A VFIO device fd.
#[derive(Debug)]
pub struct VfioDevice {
    /// A `File` for its positioned reads and writes (config space).
    fd: File,
}

impl VfioDevice {
    /// `VFIO_DEVICE_GET_INFO`.
    pub fn info(&self) -> io::Result<DeviceInfo> {
        let mut i = DeviceInfoRaw { argsz: argsz::<DeviceInfoRaw>(), ..Default::default() };
        ioctl_ptr(&self.fd, Request::DeviceGetInfo, &mut i)?;
        Ok(DeviceInfo { flags: i.flags, num_regions: i.num_regions, num_irqs: i.num_irqs })
    }

    /// `VFIO_DEVICE_GET_REGION_INFO` of region `index`.
    pub fn region_info(&self, index: u32) -> io::Result<RegionInfo> {
        let mut r = RegionInfoRaw { argsz: argsz::<RegionInfoRaw>(), index, ..Default::default() };
        ioctl_ptr(&self.fd, Request::DeviceGetRegionInfo, &mut r)?;
        Ok(RegionInfo { index, flags: r.flags, size: r.size, offset: r.offset })
    }

    /// Maps `region` (which must allow it: [`REGION_INFO_FLAG_MMAP`]) shared, readable and
    /// writable.
    pub fn map_region(&self, region: &RegionInfo) -> io::Result<MappedRegion> {
        if region.flags & REGION_INFO_FLAG_MMAP == 0 {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "region cannot be mapped"));
        }
        let len = usize::try_from(region.size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "region has no size"));
        }
        let offset =
            libc::off_t::try_from(region.offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a new shared mapping chosen by the kernel (no address hint), of an open
        // descriptor; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(MappedRegion { ptr, len })
    }

    /// Reads `buf.len()` bytes of `region` at `offset` (configuration space: `pread`).
    pub fn read_region(&self, region: &RegionInfo, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = region_pos(region, offset, buf.len())?;
        full_transfer(self.fd.read_at(buf, at), buf.len())
    }

    /// Writes `buf` to `region` at `offset` (configuration space: `pwrite`).
    pub fn write_region(&self, region: &RegionInfo, offset: u64, buf: &[u8]) -> io::Result<()> {
        let at = region_pos(region, offset, buf.len())?;
        full_transfer(self.fd.write_at(buf, at), buf.len())
    }

    /// `VFIO_DEVICE_RESET`: a function-level (or equivalent) reset.
    pub fn reset(&self) -> io::Result<()> {
        ioctl_val(&self.fd, Request::DeviceReset, 0).map(drop)
    }
}

fn region_pos(region: &RegionInfo, offset: u64, len: usize) -> io::Result<u64> {
    let end = offset.checked_add(len as u64).filter(|&e| e <= region.size);
    let at =
        end.and_then(|_| region.offset.checked_add(offset)).filter(|&a| libc::off_t::try_from(a).is_ok());
    at.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{len} bytes at {offset:#x} outside region {} of {:#x} bytes", region.index, region.size),
        )
    })
}

fn full_transfer(n: io::Result<usize>, want: usize) -> io::Result<()> {
    let n = n?;
    if n != want {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{n} of {want} bytes transferred")));
    }
    Ok(())
}

/// A region mapped into this process; unmapped on drop.
#[derive(Debug)]
pub struct MappedRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory (device registers); it may be unmapped from any
// thread, and its accesses are its users' business.
unsafe impl Send for MappedRegion {}
// SAFETY: as above: the struct itself holds only the address and length.
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    /// The start (page aligned).
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: an empty region is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map_region` made, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn request_numbers_are_the_kernels() {
        // linux/vfio.h: VFIO_TYPE ';' (0x3b), VFIO_BASE 100 (0x64).
        // The implicit discriminants count from 0 up to the jump to 11: their ends and the jump.
        use Request::*;
        let numbers = [GetApiVersion, GroupGetDeviceFd, DeviceGetRegionInfo, DeviceReset, IommuUnmapDma];
        assert_eq!(numbers.map(Request::number), [0x3b64, 0x3b6a, 0x3b6c, 0x3b6f, 0x3b72]);
        assert_eq!(
            (CheckExtension.number(), SetIommu.number(), GroupGetStatus.number()),
            (0x3b65, 0x3b66, 0x3b67)
        );
        assert_eq!((GroupSetContainer.number(), GroupUnsetContainer.number()), (0x3b68, 0x3b69));
        assert_eq!(
            (DeviceGetInfo.number(), IommuGetInfo.number(), IommuMapDma.number()),
            (0x3b6b, 0x3b70, 0x3b71)
        );
    }

    #[test]
    fn structures_have_the_uapi_layout() {
        assert_eq!(size_of::<GroupStatusRaw>(), 8);
        assert_eq!(size_of::<DeviceInfoRaw>(), 20);
        assert_eq!(size_of::<RegionInfoRaw>(), 32);
        assert_eq!(offset_of!(RegionInfoRaw, size), 16);
        assert_eq!(offset_of!(RegionInfoRaw, offset), 24);
        assert_eq!(size_of::<IommuInfoRaw>(), 24);
        assert_eq!(offset_of!(IommuInfoRaw, cap_offset), 16);
        assert_eq!(size_of::<DmaMapRaw>(), 32);
        assert_eq!(offset_of!(DmaMapRaw, vaddr), 8);
        assert_eq!(offset_of!(DmaMapRaw, size), 24);
        assert_eq!(size_of::<DmaUnmapRaw>(), 24);
        assert_eq!(offset_of!(DmaUnmapRaw, iova), 8);
    }

    /// An answer as the kernel lays it out: the fixed part, then capabilities at `cap_offset`.
    fn info_bytes(flags: u32, caps: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![0u8; 24];
        b[4..8].copy_from_slice(&flags.to_ne_bytes());
        b[8..16].copy_from_slice(&0x4020_1000u64.to_ne_bytes());
        if !caps.is_empty() {
            b[16..20].copy_from_slice(&24u32.to_ne_bytes());
        }
        for (i, (id, body)) in caps.iter().enumerate() {
            let at = b.len();
            let next = if i + 1 < caps.len() { (at + 8 + body.len()) as u32 } else { 0 };
            b.extend_from_slice(&id.to_ne_bytes());
            b.extend_from_slice(&1u16.to_ne_bytes());
            b.extend_from_slice(&next.to_ne_bytes());
            b.extend_from_slice(body);
        }
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b
    }

    #[test]
    fn iommu_info_capabilities_are_read() {
        let mut ranges = Vec::new();
        ranges.extend_from_slice(&2u32.to_ne_bytes());
        ranges.extend_from_slice(&0u32.to_ne_bytes());
        for (a, b) in [(0u64, 0xfedf_ffffu64), (0xfef0_0000, (1 << 39) - 1)] {
            ranges.extend_from_slice(&a.to_ne_bytes());
            ranges.extend_from_slice(&b.to_ne_bytes());
        }
        let avail = [65535u32.to_ne_bytes(), [0; 4]].concat();
        let b = info_bytes(IOMMU_INFO_PGSIZES | IOMMU_INFO_CAPS, &[(9, vec![0; 8]), (1, ranges), (3, avail)]);
        let info = parse_iommu_info(&b).unwrap();
        assert_eq!(info.page_sizes, 0x4020_1000);
        assert_eq!(info.iova_ranges, vec![(0, 0xfedf_ffff), (0xfef0_0000, (1 << 39) - 1)]);
        assert_eq!(info.dma_avail, Some(65535));
        assert!(info.allows(1 << 32, 1 << 39));
        assert!(!info.allows(1 << 20, 1 << 39), "crosses the MSI window");
        assert!(!info.allows(1 << 32, (1 << 39) + 1));
        // No capabilities: no ranges, everything allowed.
        let plain = parse_iommu_info(&info_bytes(IOMMU_INFO_PGSIZES, &[])).unwrap();
        assert!(plain.iova_ranges.is_empty() && plain.dma_avail.is_none() && plain.allows(0, u64::MAX));
        // A chain cut short or pointing back is an error, not a wild read.
        let mut cut = b.clone();
        cut.truncate(b.len() - 10);
        assert!(parse_iommu_info(&cut).is_err());
        let mut looped = info_bytes(IOMMU_INFO_CAPS, &[(9, vec![0; 8])]);
        looped[28..32].copy_from_slice(&24u32.to_ne_bytes());
        assert!(parse_iommu_info(&looped).is_err());
    }

    /// A kernel answering `VFIO_IOMMU_GET_INFO` with `answer`: its `argsz` alone when the
    /// buffer's is smaller, the whole answer otherwise; counts the calls.
    fn fake_kernel(answer: Vec<u8>, calls: &mut usize) -> impl FnMut(&mut [u64]) -> io::Result<()> + '_ {
        move |buf: &mut [u64]| {
            *calls += 1;
            let mut bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
            let argsz = u32::from_ne_bytes(bytes[..4].try_into().unwrap()) as usize;
            assert_eq!(argsz, bytes.len(), "argsz is the buffer's size");
            let fits = answer.len() <= argsz;
            let n = if fits { answer.len() } else { 4 };
            bytes[..n].copy_from_slice(&answer[..n]);
            for (w, b) in buf.iter_mut().zip(bytes.chunks_exact(8)) {
                *w = u64::from_ne_bytes(b.try_into().unwrap());
            }
            Ok(())
        }
    }

    #[test]
    fn iommu_info_asks_again_with_room_for_the_capabilities() {
        let mut range = [1u32.to_ne_bytes(), [0; 4]].concat();
        range.extend_from_slice(&[0x1000u64.to_ne_bytes(), 0xfedf_ffffu64.to_ne_bytes()].concat());
        let answer = info_bytes(IOMMU_INFO_PGSIZES | IOMMU_INFO_CAPS, &[(1, range)]);
        assert_eq!(answer.len(), 56, "the fixed 24 bytes and one capability");
        let mut calls = 0;
        let info = ask_iommu_info(fake_kernel(answer, &mut calls)).unwrap();
        assert_eq!(calls, 2, "once for the size, once with room");
        assert_eq!((info.page_sizes, info.iova_ranges), (0x4020_1000, vec![(0x1000, 0xfedf_ffff)]));
        let mut calls = 0;
        let plain = ask_iommu_info(fake_kernel(info_bytes(IOMMU_INFO_PGSIZES, &[]), &mut calls)).unwrap();
        assert_eq!((calls, plain.page_sizes), (1, 0x4020_1000), "no capabilities: one call");
        let mut calls = 0;
        let growing = |buf: &mut [u64]| {
            calls += 1;
            buf[0] = words_of_u32s((buf.len() * 8 + 8) as u32, 0);
            Ok(())
        };
        assert!(ask_iommu_info(growing).is_err(), "bounded");
        assert_eq!(calls, 5);
        let refused = |_: &mut [u64]| Err(io::Error::from_raw_os_error(libc::EINVAL));
        assert_eq!(ask_iommu_info(refused).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn a_missing_group_or_container_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let e = VfioGroup::open_path(&dir.path().join("7")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = VfioContainer::open_path(&dir.path().join("vfio")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn vfio_requests_on_other_files_fail_cleanly() {
        // /dev/null is no VFIO node: every request is refused (ENOTTY) rather than misread.
        let null = Path::new("/dev/null");
        assert_eq!(VfioContainer::open_path(null).unwrap_err().raw_os_error(), Some(libc::ENOTTY));
        let g = VfioGroup::open_path(null).unwrap();
        assert_eq!(g.status().unwrap_err().raw_os_error(), Some(libc::ENOTTY));
        assert_eq!(g.device("0000:00:04.0").unwrap_err().raw_os_error(), Some(libc::ENOTTY));
    }

    #[test]
    fn region_accesses_stay_inside_the_region() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(256).unwrap();
        let dev = VfioDevice { fd: f };
        let cfg = RegionInfo { index: PCI_CONFIG_REGION_INDEX, flags: 3, size: 64, offset: 128 };
        dev.write_region(&cfg, 4, &[0x06, 0x00]).unwrap();
        let mut b = [0u8; 2];
        dev.read_region(&cfg, 4, &mut b).unwrap();
        assert_eq!(b, [6, 0]);
        assert!(dev.read_region(&cfg, 63, &mut b).is_err(), "runs past the region");
        // The write landed at the region's offset in the fd.
        let mut raw = [0u8; 1];
        let whole = RegionInfo { index: 0, flags: 3, size: 256, offset: 0 };
        dev.read_region(&whole, 132, &mut raw).unwrap();
        assert_eq!(raw[0], 6);
        let no_mmap = RegionInfo { flags: REGION_INFO_FLAG_READ, ..whole };
        assert_eq!(dev.map_region(&no_mmap).unwrap_err().kind(), io::ErrorKind::Unsupported);
        // A file maps like a region that allows it.
        let m = dev.map_region(&RegionInfo { flags: REGION_INFO_FLAG_MMAP, ..whole }).unwrap();
        // SAFETY: 256 mapped bytes; byte 132 is inside.
        assert_eq!(unsafe { *m.as_ptr().as_ptr().add(132) }, 6);
    }
}
