//! A PCI function bound to vfio-pci: its group and type1 container, BAR0 mapped, bus mastering
//! on, and the process's DMA map ([`fp_bdev::dma`]) mirrored into the container's IOMMU so the
//! device reaches exactly the registered memory at the map's IOVAs.
//!
//! Functions of one IOMMU group share one container (a group joins one container only): a
//! process-wide table keyed by group number holds it while any of its functions is open.
//! Errors name the fix: a function still on the kernel's `nvme` driver gets the rebinding
//! steps (docs/nvme.md, "PCIe devices").

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use fp_bdev::dma::{memory_map, DmaListener, DmaRegion, ListenerId, DMA_PAGE, IOVA_BASE, IOVA_LIMIT};
use fp_sys::vfio::{
    MappedRegion, RegionInfo, VfioContainer, VfioDevice, VfioGroup, DEVICE_FLAGS_PCI, DEVICE_FLAGS_RESET,
    DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE, PCI_BAR0_REGION_INDEX, PCI_CONFIG_REGION_INDEX,
    VFIO_TYPE1V2_IOMMU, VFIO_TYPE1_IOMMU,
};

use super::function::{Bar, PciFunction};
use crate::NvmeError;

/// PCI class code of an NVMe controller: mass storage (01), non-volatile memory (08), NVM
/// Express programming interface (02). NVMe Base 2.0, 3.8.1 / PCI Code and ID Assignment.
pub const NVME_CLASS: u32 = 0x01_08_02;
/// PCI configuration space: the Command register (PCI Local Bus 3.0, 6.2.2).
const PCI_COMMAND: u64 = 0x04;
/// Command register: Memory Space Enable.
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: Bus Master Enable (the function may issue DMA).
const PCI_COMMAND_MASTER: u16 = 1 << 2;
/// Drivers that leave a group viable besides vfio-pci (the kernel's own allow list).
const HARMLESS_DRIVERS: [&str; 3] = ["vfio-pci", "pci-stub", "pcieport"];

/// Where [`VfioFunction::open`] looks: sysfs and the VFIO device nodes (tests point them at a
/// temporary tree).
#[derive(Debug, Clone)]
pub struct VfioPaths {
    /// `/sys/bus/pci/devices`.
    pub pci_devices: PathBuf,
    /// `/dev/vfio`.
    pub dev_vfio: PathBuf,
}

impl Default for VfioPaths {
    fn default() -> VfioPaths {
        VfioPaths { pci_devices: "/sys/bus/pci/devices".into(), dev_vfio: "/dev/vfio".into() }
    }
}

/// A group joined to its container, shared by the open functions of the group. Dropping it
/// unmaps all DMA (the listener goes) and leaves the container.
struct GroupContainer {
    number: u32,
    /// The group, and the container (also held by the DMA map while the listener is in);
    /// `None` only inside `drop`, which closes them in that order.
    fds: Option<(VfioGroup, Arc<ContainerMapper>)>,
    listener: ListenerId,
}

impl GroupContainer {
    fn group(&self) -> &VfioGroup {
        &self.fds.as_ref().expect("open until dropped").0
    }
}

/// The container as the DMA map's listener.
struct ContainerMapper {
    container: VfioContainer,
}

impl DmaListener for ContainerMapper {
    fn map(&self, region: &DmaRegion) -> std::io::Result<()> {
        // SAFETY: the DMA map hands out only memory registered for devices, and unmaps it (our
        // `unmap`) before its owner frees it (`MemoryMap::unregister` runs before the munmap or
        // free: its contract).
        unsafe {
            self.container.map_dma(
                region.vaddr,
                region.iova,
                region.len as u64,
                DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE,
            )
        }
    }

    fn unmap(&self, region: &DmaRegion) {
        match self.container.unmap_dma(region.iova, region.len as u64) {
            Ok(n) if n == region.len as u64 => {}
            Ok(n) => log::error!("VFIO unmap of iova {:#x}: {n:#x} of {:#x} bytes", region.iova, region.len),
            Err(e) => log::error!("VFIO unmap of iova {:#x}+{:#x}: {e}", region.iova, region.len),
        }
    }
}

impl Drop for GroupContainer {
    fn drop(&mut self) {
        // Held through the teardown: an open of this group meanwhile waits, rather than find
        // the group's fd still open (the kernel lets one open at a time: EBUSY).
        let _table = groups().lock().unwrap_or_else(|e| e.into_inner());
        memory_map().remove_listener(self.listener);
        if let Some((group, container)) = self.fds.take() {
            if let Err(e) = group.unset_container() {
                log::warn!("VFIO group {}: leaving its container: {e}", self.number);
            }
            drop(group);
            drop(container);
        }
    }
}

fn groups() -> &'static Mutex<HashMap<u32, Weak<GroupContainer>>> {
    static GROUPS: OnceLock<Mutex<HashMap<u32, Weak<GroupContainer>>>> = OnceLock::new();
    GROUPS.get_or_init(Default::default)
}

/// A function bound to vfio-pci, open for the PCIe transport.
pub struct VfioFunction {
    address: String,
    // Field order is drop order: BAR unmapped, then the device fd closed, then the group
    // leaves its container (when this was its last function), and only then may the
    // function be opened again.
    bar0_map: MappedRegion,
    bar0: Bar,
    device: VfioDevice,
    resettable: bool,
    _group: Arc<GroupContainer>,
    _claim: Claim,
}

impl std::fmt::Debug for VfioFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioFunction")
            .field("address", &self.address)
            .field("bar0_len", &self.bar0.len())
            .finish()
    }
}

impl VfioFunction {
    /// Opens the function at `address` ("0000:00:04.0"; "00:04.0" means domain 0): checks in
    /// sysfs that it is an NVMe controller bound to vfio-pci in a viable group, joins (or
    /// shares) its group's type1 container, maps BAR0, enables memory space and bus
    /// mastering, and maps every registered DMA region (and every later one) for it.
    pub fn open(address: &str) -> Result<Arc<VfioFunction>, NvmeError> {
        Self::open_in(&VfioPaths::default(), address)
    }

    /// [`VfioFunction::open`] with sysfs and `/dev/vfio` elsewhere.
    pub fn open_in(paths: &VfioPaths, address: &str) -> Result<Arc<VfioFunction>, NvmeError> {
        let address = canonical_address(address)?;
        // Two drivers of one controller in a process would fight over its queues.
        let claim = Claim::new(&address)?;
        let group_number = check_sysfs(paths, &address)?;
        let group = shared_group(paths, group_number)?;
        let device = group.group().device(&address).map_err(|e| io(format!("VFIO device {address}"), e))?;
        let info = device.info().map_err(|e| io(format!("VFIO device info of {address}"), e))?;
        if info.flags & DEVICE_FLAGS_PCI == 0 {
            return Err(NvmeError::Unsupported(format!("VFIO device {address} is not a PCI function")));
        }
        let bar =
            device.region_info(PCI_BAR0_REGION_INDEX).map_err(|e| io(format!("BAR0 of {address}"), e))?;
        let bar0_map = device.map_region(&bar).map_err(|e| {
            io(format!("mapping BAR0 of {address} ({:#x} bytes, flags {:#x})", bar.size, bar.flags), e)
        })?;
        // SAFETY: the mapping is page aligned, `len` bytes long, readable and writable, and
        // lives in `bar0_map` as long as the function (which every holder of the Bar keeps).
        let bar0 = unsafe { Bar::new(bar0_map.as_ptr(), bar0_map.len()) };
        let config = device
            .region_info(PCI_CONFIG_REGION_INDEX)
            .map_err(|e| io(format!("config space of {address}"), e))?;
        enable_bus_master(&device, &config)
            .map_err(|e| io(format!("enabling bus mastering on {address}"), e))?;
        log::info!(
            "VFIO: {address} open (group {group_number}, BAR0 {:#x} bytes, reset {})",
            bar0.len(),
            info.flags & DEVICE_FLAGS_RESET != 0
        );
        Ok(Arc::new(VfioFunction {
            address,
            bar0_map,
            bar0,
            device,
            resettable: info.flags & DEVICE_FLAGS_RESET != 0,
            _group: group,
            _claim: claim,
        }))
    }
}

impl PciFunction for VfioFunction {
    fn address(&self) -> String {
        self.address.clone()
    }

    fn bar0(&self) -> Bar {
        debug_assert_eq!(self.bar0.len(), self.bar0_map.len());
        self.bar0
    }

    fn reset_function(&self) -> Result<bool, NvmeError> {
        if !self.resettable {
            return Ok(false);
        }
        self.device.reset().map_err(|e| io(format!("VFIO reset of {}", self.address), e))?;
        // A function-level reset clears the Command register (PCIe Base, FLR): DMA and BAR
        // access are off until enabled again.
        let config = self
            .device
            .region_info(PCI_CONFIG_REGION_INDEX)
            .map_err(|e| io(format!("config space of {}", self.address), e))?;
        enable_bus_master(&self.device, &config)
            .map_err(|e| io(format!("enabling bus mastering on {}", self.address), e))?;
        Ok(true)
    }
}

/// A function's address held in the process-wide set of open functions; released on drop.
struct Claim(String);

fn claimed() -> &'static Mutex<HashSet<String>> {
    static OPEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

impl Claim {
    fn new(address: &str) -> Result<Claim, NvmeError> {
        if !claimed().lock().unwrap_or_else(|e| e.into_inner()).insert(address.to_owned()) {
            return Err(NvmeError::InvalidParam {
                field: "traddr",
                reason: format!("PCI function {address} is already open in this process"),
            });
        }
        Ok(Claim(address.to_owned()))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        claimed().lock().unwrap_or_else(|e| e.into_inner()).remove(&self.0);
    }
}

fn io(what: String, e: std::io::Error) -> NvmeError {
    NvmeError::io(what, e)
}

/// "DDDD:BB:DD.F" in lower case, from that or "BB:DD.F"; anything else (a path, a name) is
/// refused before it reaches a sysfs path.
pub fn canonical_address(address: &str) -> Result<String, NvmeError> {
    let bad = || NvmeError::InvalidParam {
        field: "traddr",
        reason: format!("{address:?} is not a PCI address (DDDD:BB:DD.F, e.g. 0000:00:04.0)"),
    };
    let parts: Vec<&str> = address.split(':').collect();
    let (domain, bus, devfn) = match parts[..] {
        [d, b, df] => (d, b, df),
        [b, df] => ("0000", b, df),
        _ => return Err(bad()),
    };
    let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
    let hex = |s: &str, max_len: usize, max: u32| {
        (!s.is_empty() && s.len() <= max_len && s.bytes().all(|c| c.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
            .filter(|&v| v <= max)
    };
    let domain = hex(domain, 4, 0xffff).ok_or_else(bad)?;
    let bus = hex(bus, 2, 0xff).ok_or_else(bad)?;
    let dev = hex(dev, 2, 0x1f).ok_or_else(bad)?;
    let func = hex(func, 1, 7).ok_or_else(bad)?;
    Ok(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// The basename of the symlink `link` points to, if it is one.
fn link_name(link: &Path) -> Option<String> {
    std::fs::read_link(link).ok()?.file_name()?.to_str().map(str::to_owned)
}

/// The sysfs checks: present, an NVMe controller, on vfio-pci, in a group whose other members
/// are harmless. Returns the group number.
fn check_sysfs(paths: &VfioPaths, address: &str) -> Result<u32, NvmeError> {
    let dev = paths.pci_devices.join(address);
    if !dev.exists() {
        return Err(NvmeError::InvalidParam {
            field: "traddr",
            reason: format!("no PCI function {address} ({} does not exist)", dev.display()),
        });
    }
    let class =
        std::fs::read_to_string(dev.join("class")).map_err(|e| io(format!("{}/class", dev.display()), e))?;
    let class = u32::from_str_radix(class.trim().trim_start_matches("0x"), 16).unwrap_or(u32::MAX);
    if class != NVME_CLASS {
        return Err(NvmeError::Unsupported(format!(
            "PCI function {address} has class {class:#08x}, not an NVMe controller ({NVME_CLASS:#08x})"
        )));
    }
    match link_name(&dev.join("driver")).as_deref() {
        Some("vfio-pci") => {}
        driver => {
            let unbind = match driver {
                Some(d) => format!("echo {address} > /sys/bus/pci/drivers/{d}/unbind; "),
                None => String::new(),
            };
            return Err(NvmeError::Unsupported(format!(
                "PCI function {address} is bound to {}, not vfio-pci; as root: modprobe vfio-pci; {unbind}\
                 echo vfio-pci > /sys/bus/pci/devices/{address}/driver_override; \
                 echo {address} > /sys/bus/pci/drivers_probe (the kernel needs an IOMMU: intel_iommu=on or amd_iommu=on)",
                driver.map_or("no driver".to_owned(), |d| format!("driver {d}"))
            )));
        }
    }
    let group = link_name(&dev.join("iommu_group")).ok_or_else(|| {
        NvmeError::Unsupported(format!(
            "PCI function {address} has no IOMMU group: the kernel runs without an IOMMU (boot with intel_iommu=on or amd_iommu=on)"
        ))
    })?;
    let number: u32 = group.parse().map_err(|_| {
        NvmeError::Unsupported(format!("PCI function {address}: IOMMU group {group:?} is not a number"))
    })?;
    let members = dev.join("iommu_group/devices");
    let entries = std::fs::read_dir(&members).map_err(|e| io(format!("{}", members.display()), e))?;
    let mut blocking = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(d) = link_name(&entry.path().join("driver")) {
            if !HARMLESS_DRIVERS.contains(&d.as_str()) {
                blocking.push(format!("{name} (driver {d})"));
            }
        }
    }
    if !blocking.is_empty() {
        blocking.sort();
        return Err(NvmeError::Unsupported(format!(
            "IOMMU group {number} of {address} is not viable: {} must be bound to vfio-pci or unbound too",
            blocking.join(", ")
        )));
    }
    Ok(number)
}

/// The group's container, shared when another function of the group is open; else the group
/// opened, checked viable, joined to a new type1 container that mirrors the DMA map.
fn shared_group(paths: &VfioPaths, number: u32) -> Result<Arc<GroupContainer>, NvmeError> {
    let mut table = groups().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = table.get(&number).and_then(Weak::upgrade) {
        return Ok(g);
    }
    let path = paths.dev_vfio.join(number.to_string());
    let group = VfioGroup::open_path(&path).map_err(|e| io(format!("opening {}", path.display()), e))?;
    let status = group.status().map_err(|e| io(format!("VFIO group {number} status"), e))?;
    if !status.viable {
        return Err(NvmeError::Unsupported(format!(
            "VFIO group {number} is not viable: every device in /sys/kernel/iommu_groups/{number}/devices must be bound to vfio-pci or unbound"
        )));
    }
    if status.container_set {
        return Err(NvmeError::Unsupported(format!(
            "VFIO group {number} already belongs to a container (another process uses it)"
        )));
    }
    let cpath = paths.dev_vfio.join("vfio");
    let container =
        VfioContainer::open_path(&cpath).map_err(|e| io(format!("opening {}", cpath.display()), e))?;
    let model = if container.check_extension(VFIO_TYPE1V2_IOMMU).unwrap_or(false) {
        VFIO_TYPE1V2_IOMMU
    } else if container.check_extension(VFIO_TYPE1_IOMMU).unwrap_or(false) {
        VFIO_TYPE1_IOMMU
    } else {
        return Err(NvmeError::Unsupported("the VFIO container offers no type1 IOMMU".into()));
    };
    group
        .set_container(&container)
        .map_err(|e| io(format!("VFIO group {number}: joining a container"), e))?;
    if let Err(e) = container.set_iommu(model) {
        let _ = group.unset_container();
        return Err(io(format!("VFIO group {number}: setting IOMMU type {model}"), e));
    }
    check_iommu(&container, number)?;
    let mapper = Arc::new(ContainerMapper { container });
    let listener = match memory_map().add_listener(mapper.clone()) {
        Ok(id) => id,
        Err(e) => {
            let _ = group.unset_container();
            return Err(NvmeError::io(
                format!("VFIO group {number}: mapping the registered DMA memory"),
                std::io::Error::other(e),
            ));
        }
    };
    let g = Arc::new(GroupContainer { number, fds: Some((group, mapper)), listener });
    table.retain(|_, w| w.strong_count() > 0);
    table.insert(number, Arc::downgrade(&g));
    Ok(g)
}

/// The IOMMU must map 4 KiB pages; the DMA map's IOVA window should lie in one of its valid
/// ranges (else regions there fail to map and their I/O is bounced: said once, here).
fn check_iommu(container: &VfioContainer, number: u32) -> Result<(), NvmeError> {
    let info = match container.iommu_info() {
        Ok(i) => i,
        Err(e) => {
            log::warn!(
                "VFIO group {number}: no IOMMU info ({e}); assuming 4 KiB pages and the whole IOVA space"
            );
            return Ok(());
        }
    };
    if info.page_sizes != 0 && info.page_sizes & DMA_PAGE as u64 == 0 {
        return Err(NvmeError::Unsupported(format!(
            "VFIO group {number}: the IOMMU maps no 4 KiB pages (page sizes {:#x})",
            info.page_sizes
        )));
    }
    let ranges: Vec<String> = info.iova_ranges.iter().map(|(a, b)| format!("{a:#x}-{b:#x}")).collect();
    if info.allows(IOVA_BASE, IOVA_LIMIT) {
        log::info!(
            "VFIO group {number}: IOMMU page sizes {:#x}, IOVA ranges [{}], mappings available {:?}",
            info.page_sizes,
            ranges.join(", "),
            info.dma_avail
        );
    } else {
        log::warn!(
            "VFIO group {number}: the IOMMU takes IOVAs [{}] only, the DMA map hands out {IOVA_BASE:#x}-{:#x}: \
             memory registered outside fails to map and its I/O is bounced",
            ranges.join(", "),
            IOVA_LIMIT - 1
        );
    }
    Ok(())
}

/// Sets Memory Space and Bus Master Enable in the Command register (read, modify, write).
fn enable_bus_master(device: &VfioDevice, config: &RegionInfo) -> std::io::Result<()> {
    let mut cmd = [0u8; 2];
    device.read_region(config, PCI_COMMAND, &mut cmd)?;
    let value = u16::from_le_bytes(cmd);
    let want = value | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
    if want != value {
        device.write_region(config, PCI_COMMAND, &want.to_le_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn addresses_are_canonical_or_refused() {
        assert_eq!(canonical_address("0000:00:04.0").unwrap(), "0000:00:04.0");
        assert_eq!(canonical_address("00:1F.7").unwrap(), "0000:00:1f.7");
        assert_eq!(canonical_address("1:2:3.4").unwrap(), "0001:02:03.4");
        for bad in [
            "",
            "0000:00:04",
            "0000:00:20.0",
            "0000:00:04.8",
            "../../x:00:04.0",
            "0000:00:04.0/..",
            "a:b:c:d.0",
        ] {
            assert!(
                matches!(canonical_address(bad), Err(NvmeError::InvalidParam { field: "traddr", .. })),
                "{bad:?} accepted"
            );
        }
    }

    /// A sysfs tree: one function `addr` of `class` bound to `driver`, in group 5 with `others`
    /// (name, driver).
    fn sysfs(
        addr: &str,
        class: &str,
        driver: Option<&str>,
        others: &[(&str, Option<&str>)],
    ) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let devices = t.path().join("sys/bus/pci/devices");
        let drivers = t.path().join("sys/bus/pci/drivers");
        let group = t.path().join("sys/kernel/iommu_groups/5");
        std::fs::create_dir_all(group.join("devices")).unwrap();
        std::fs::create_dir_all(&devices).unwrap();
        let all = std::iter::once((addr, driver)).chain(others.iter().copied());
        for (name, drv) in all {
            let real = t.path().join("sys/devices/pci0000:00").join(name);
            std::fs::create_dir_all(&real).unwrap();
            std::fs::write(real.join("class"), format!("{class}\n")).unwrap();
            symlink(&group, real.join("iommu_group")).unwrap();
            if let Some(d) = drv {
                std::fs::create_dir_all(drivers.join(d)).unwrap();
                symlink(drivers.join(d), real.join("driver")).unwrap();
            }
            symlink(&real, devices.join(name)).unwrap();
            symlink(&real, group.join("devices").join(name)).unwrap();
        }
        std::fs::create_dir_all(t.path().join("dev/vfio")).unwrap();
        t
    }

    fn paths(t: &tempfile::TempDir) -> VfioPaths {
        VfioPaths { pci_devices: t.path().join("sys/bus/pci/devices"), dev_vfio: t.path().join("dev/vfio") }
    }

    fn open_err(t: &tempfile::TempDir, addr: &str) -> NvmeError {
        VfioFunction::open_in(&paths(t), addr).unwrap_err()
    }

    #[test]
    fn a_function_is_open_once_per_process() {
        let a = Claim::new("0000:7f:00.0").unwrap();
        let e = Claim::new("0000:7f:00.0").err().expect("second claim refused");
        assert!(e.to_string().contains("already open"), "{e}");
        drop(a);
        let _again = Claim::new("0000:7f:00.0").unwrap();
        // A failed open releases its claim.
        let t = sysfs("0000:00:08.0", "0x010802", Some("nvme"), &[]);
        for _ in 0..2 {
            assert!(matches!(open_err(&t, "0000:00:08.0"), NvmeError::Unsupported(_)));
        }
    }

    #[test]
    fn a_missing_function_names_the_address() {
        let t = sysfs("0000:00:09.0", "0x010802", Some("vfio-pci"), &[]);
        let e = open_err(&t, "0000:00:05.0");
        assert!(matches!(e, NvmeError::InvalidParam { field: "traddr", .. }), "{e}");
        assert!(e.to_string().contains("0000:00:05.0"), "{e}");
    }

    #[test]
    fn a_function_on_the_kernel_driver_gets_the_rebinding_steps() {
        let t = sysfs("0000:00:04.0", "0x010802", Some("nvme"), &[]);
        let e = open_err(&t, "00:04.0");
        let msg = e.to_string();
        assert!(matches!(e, NvmeError::Unsupported(_)), "{msg}");
        assert!(msg.contains("bound to driver nvme"), "{msg}");
        assert!(msg.contains("echo 0000:00:04.0 > /sys/bus/pci/drivers/nvme/unbind"), "{msg}");
        assert!(msg.contains("echo vfio-pci > /sys/bus/pci/devices/0000:00:04.0/driver_override"), "{msg}");
        assert!(msg.contains("drivers_probe"), "{msg}");
        // Unbound: no unbind step.
        let t = sysfs("0000:00:04.0", "0x010802", None, &[]);
        let msg = open_err(&t, "0000:00:04.0").to_string();
        assert!(msg.contains("bound to no driver") && !msg.contains("unbind"), "{msg}");
    }

    #[test]
    fn a_function_that_is_not_nvme_is_refused() {
        let t = sysfs("0000:00:03.0", "0x020000", Some("vfio-pci"), &[]);
        let msg = open_err(&t, "0000:00:03.0").to_string();
        assert!(msg.contains("class 0x020000") && msg.contains("not an NVMe controller"), "{msg}");
    }

    #[test]
    fn a_group_with_a_device_on_another_driver_is_not_viable() {
        let others =
            [("0000:00:04.1", Some("e1000e")), ("0000:00:04.2", None), ("0000:00:00.0", Some("pcieport"))];
        let t = sysfs("0000:00:06.0", "0x010802", Some("vfio-pci"), &others);
        let msg = open_err(&t, "0000:00:06.0").to_string();
        assert!(msg.contains("group 5") && msg.contains("not viable"), "{msg}");
        assert!(msg.contains("0000:00:04.1 (driver e1000e)"), "{msg}");
        assert!(
            !msg.contains("04.2") && !msg.contains("00.0 ("),
            "unbound and bridge members are fine: {msg}"
        );
    }

    #[test]
    fn a_viable_group_without_its_device_node_fails_naming_it() {
        let t = sysfs("0000:00:07.0", "0x010802", Some("vfio-pci"), &[("0000:00:04.1", Some("vfio-pci"))]);
        let e = open_err(&t, "0000:00:07.0");
        let msg = e.to_string();
        assert!(
            matches!(&e, NvmeError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{msg}"
        );
        assert!(msg.contains("dev/vfio/5"), "{msg}");
        assert!(groups().lock().unwrap().get(&5).and_then(Weak::upgrade).is_none(), "nothing kept");
    }
}
