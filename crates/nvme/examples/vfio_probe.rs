//! Probes an NVMe function through VFIO, without the driver's queue code: opens it
//! ([`VfioFunction::open`]), reads CAP/VS/CSTS from BAR0, then brings up the admin queue by
//! hand (Base 3.5.1) and sends Identify commands whose data lands in memory of each kind the
//! DMA map holds: driver memory ([`DmaMemory`]), a daemon buffer ([`AlignedBuf`], registered by
//! itself) and a shared file mapping registered by hand (as a vhost-user guest region is). A
//! last Identify points at an IOVA that is in no region: the IOMMU must refuse it. Then a
//! function-level reset. For checking VFIO inside the test guest (docs/nvme.md).
//!
//! Usage: `vfio_probe 0000:00:04.0 [ADDRESS...]` (as root, the functions bound to vfio-pci). Prints
//! `VFIO-PROBE: ...` lines and ends with `VFIO-PROBE: PASS` or an error.

use std::time::{Duration, Instant};

use fp_bdev::dma::memory_map;
use fp_bdev::{AlignedBuf, Iovecs};
use fp_nvme::cmd;
use fp_nvme::pcie::vfio::VfioFunction;
use fp_nvme::pcie::{Bar, DmaMemory, PciFunction};
use fp_nvme::transport::{IoQueue, Transport};
use fp_nvme_spec::registers;

const ENTRIES: u16 = 8;

/// The driver's log lines on stdout, beside the probe's.
struct Log;

impl log::Log for Log {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            println!("VFIO-PROBE: log {} {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() {
    log::set_logger(&Log).expect("first logger");
    log::set_max_level(log::LevelFilter::Info);
    let addrs: Vec<String> = std::env::args().skip(1).collect();
    if addrs.is_empty() {
        println!("usage: vfio_probe ADDRESS [ADDRESS...]");
        std::process::exit(2);
    }
    if let Err(e) = run(&addrs) {
        println!("VFIO-PROBE: FAIL {e}");
        std::process::exit(1);
    }
    println!("VFIO-PROBE: PASS");
}

/// Opens every function first (functions of one group share its container), probes each
/// while all are open, then closes the first and probes the last again: its mappings must
/// survive the other's close.
fn run(addrs: &[String]) -> Result<(), String> {
    // Registered before any container exists: mapped when the first one adds its listener.
    let mut early = AlignedBuf::zeroed(4096);
    let mut fs = Vec::new();
    for a in addrs {
        fs.push(VfioFunction::open(a).map_err(|e| e.to_string())?);
    }
    println!("VFIO-PROBE: {} open, DMA map {:?}", fs.len(), memory_map().stats());
    match VfioFunction::open(&addrs[0]) {
        Ok(_) => return Err(format!("{} opened twice in one process", addrs[0])),
        Err(e) => println!("VFIO-PROBE: second open refused: {e}"),
    }
    for f in &fs {
        probe(f, &mut early)?;
    }
    if fs.len() > 1 {
        let first = fs.remove(0);
        println!("VFIO-PROBE: closing {}", first.address());
        drop(first);
        probe(fs.last().expect("one left"), &mut early)?;
    }
    io_check(fs.last().expect("one left").clone())?;
    drop(fs);
    println!("VFIO-PROBE: closed, DMA map {:?}", memory_map().stats());
    Ok(())
}

fn wait(bar: &Bar, what: &str, ok: impl Fn(u32) -> bool) -> Result<(), String> {
    let start = Instant::now();
    while !ok(bar.read32(registers::CSTS)) {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!("{what}: CSTS {:#x} after 10 s", bar.read32(registers::CSTS)));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The admin queue pair in driver memory, with its tail and phase.
struct Admin {
    bar: Bar,
    sq: DmaMemory,
    cq: DmaMemory,
    tail: u16,
    head: u16,
    phase: bool,
    cid: u16,
}

impl Admin {
    /// Submits `sqe` and polls its completion; returns (status field, dword 0).
    fn run(&mut self, mut sqe: fp_nvme_spec::Sqe) -> Result<(u16, u32), String> {
        self.cid += 1;
        sqe.set_cid(self.cid);
        let at = usize::from(self.tail) * 64;
        self.sq.as_mut_slice()[at..at + 64].copy_from_slice(&sqe.0);
        self.tail = (self.tail + 1) % ENTRIES;
        self.bar.write32(registers::DOORBELLS, u32::from(self.tail));
        let start = Instant::now();
        loop {
            let at = usize::from(self.head) * 16;
            // SAFETY: 16 bytes inside the completion ring; read volatile, the device writes it.
            let cqe: [u8; 16] = unsafe { std::ptr::read_volatile(self.cq.as_ptr().add(at).cast()) };
            let status = u16::from_le_bytes([cqe[14], cqe[15]]);
            if (status & 1 == 1) == self.phase {
                self.head = (self.head + 1) % ENTRIES;
                if self.head == 0 {
                    self.phase = !self.phase;
                }
                let stride = 4 << registers::cap_dstrd(self.bar.read64(registers::CAP));
                self.bar.write32(registers::DOORBELLS + stride, u32::from(self.head));
                let cid = u16::from_le_bytes([cqe[12], cqe[13]]);
                if cid != self.cid {
                    return Err(format!("completion for cid {cid}, expected {}", self.cid));
                }
                return Ok((status >> 1, u32::from_le_bytes(cqe[0..4].try_into().unwrap())));
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err("admin command not completed in 10 s".into());
            }
            std::hint::spin_loop();
        }
    }

    /// Identify `cns` into `iova`; returns the status field.
    fn identify(&mut self, cns: u8, nsid: u32, iova: u64) -> Result<u16, String> {
        let mut sqe = cmd::identify(cns, nsid);
        sqe.set_prp(iova, 0);
        Ok(self.run(sqe)?.0)
    }
}

type Queue = fp_nvme::pcie::PcieIoQueue<VfioFunction>;

/// Submits `cmds` (command, iovecs) in one batch (one doorbell) and waits for them all.
fn batch(q: &mut Queue, cmds: &[(fp_nvme_spec::Sqe, Vec<libc::iovec>)]) -> Result<(), String> {
    for (i, (sqe, iov)) in cmds.iter().enumerate() {
        // SAFETY: the buffers outlive the completions awaited below.
        q.submit(sqe, unsafe { Iovecs::from_slice(iov) }, i as u32).map_err(|e| format!("submit: {e:?}"))?;
    }
    q.flush();
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < cmds.len() {
        q.poll(&mut out).map_err(|e| e.to_string())?;
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!("{} of {} completions in 10 s", out.len(), cmds.len()));
        }
    }
    match out.iter().find(|(_, st)| !st.is_success()) {
        Some((tag, st)) => Err(format!("command {tag} failed: sct {:#x} sc {:#x}", st.sct, st.sc)),
        None => Ok(()),
    }
}

fn iov(p: *const u8, len: usize) -> libc::iovec {
    libc::iovec { iov_base: p as *mut libc::c_void, iov_len: len }
}

/// The driver's PCIe transport over the function: an I/O queue pair, writes and reads from
/// registered memory (zero copy) and from plain heap memory (bounced), compared.
fn io_check(f: std::sync::Arc<VfioFunction>) -> Result<(), String> {
    use fp_nvme::pcie::{PcieOptions, PcieTransport};
    let t = PcieTransport::new(f, PcieOptions::default());
    let mut admin = t.connect_admin(32, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let mut q = t.connect_io(&mut admin, 1, 64).map_err(|e| e.to_string())?;
    const LEN: usize = 64 * 1024;
    let mut src = AlignedBuf::zeroed(LEN);
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    // 1. Registered memory both ways: 128 blocks written at 0, read back in 16 4-KiB reads
    // sent as one batch.
    let nlb = (LEN / 512) as u32;
    batch(&mut q, &[(cmd::read_write(true, 1, 0, nlb, false), vec![iov(src.as_ptr(), LEN)])])?;
    let dst = AlignedBuf::zeroed(LEN);
    let reads: Vec<_> = (0..16)
        .map(|i| {
            let p = dst.as_ptr().wrapping_add(i * 4096);
            (cmd::read_write(false, 1, (i * 8) as u64, 8, false), vec![iov(p, 4096)])
        })
        .collect();
    let before = q.stats();
    batch(&mut q, &reads)?;
    let after = q.stats();
    if dst.as_slice() != src.as_slice() {
        return Err("data read back from registered memory differs".into());
    }
    println!(
        "VFIO-PROBE: io: 64 KiB written and read back zero copy; 16 reads in one batch rang {} doorbells; {:?}",
        after.doorbells - before.doorbells,
        after
    );
    if after.bounced != 0 {
        return Err(format!("registered memory was bounced: {after:?}"));
    }
    // 2. Plain heap memory: bounced both ways, same data.
    let heap: Vec<u8> = src.as_slice()[..8192].iter().map(|b| !b).collect();
    batch(&mut q, &[(cmd::read_write(true, 1, 1000, 16, false), vec![iov(heap.as_ptr(), 8192)])])?;
    let mut back = vec![0u8; 8192];
    batch(&mut q, &[(cmd::read_write(false, 1, 1000, 16, false), vec![iov(back.as_mut_ptr(), 8192)])])?;
    let st = q.stats();
    println!("VFIO-PROBE: io: 8 KiB from and to unregistered memory, {} bounced", st.bounced);
    if back != heap || st.bounced != 2 {
        return Err(format!("unregistered memory: data equal {}, stats {st:?}", back == heap));
    }
    drop(q);
    t.disconnect_io(&mut admin, 1).map_err(|e| e.to_string())?;
    t.shutdown(&mut admin, Duration::from_secs(5));
    println!(
        "VFIO-PROBE: io: queue deleted, controller shut down (CSTS {:#x})",
        t.function().bar0().read32(registers::CSTS)
    );
    Ok(())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_owned()
}

fn probe(f: &VfioFunction, early: &mut AlignedBuf) -> Result<(), String> {
    let bar = f.bar0();
    let cap = bar.read64(registers::CAP);
    let vs = bar.read32(registers::VS);
    println!(
        "VFIO-PROBE: open {} BAR0 {:#x} bytes CAP {cap:#018x} (MQES {}, DSTRD {}) VS {}.{}.{} CSTS {:#x}",
        f.address(),
        bar.len(),
        registers::cap_mqes(cap),
        registers::cap_dstrd(cap),
        vs >> 16,
        (vs >> 8) & 0xff,
        vs & 0xff,
        bar.read32(registers::CSTS)
    );
    if vs == u32::MAX || vs >> 16 == 0 {
        return Err(format!("VS {vs:#x} is no NVMe version"));
    }

    // Controller initialisation (Base 3.5.1): disable, admin queue registers, enable.
    bar.write32(registers::CC, 0);
    wait(&bar, "disable", |c| c & registers::CSTS_RDY == 0)?;
    let sq = DmaMemory::new(usize::from(ENTRIES) * 64).map_err(|e| e.to_string())?;
    let cq = DmaMemory::new(usize::from(ENTRIES) * 16).map_err(|e| e.to_string())?;
    let q = u32::from(ENTRIES - 1);
    bar.write32(registers::AQA, q | (q << 16));
    bar.write64(registers::ASQ, sq.iova());
    bar.write64(registers::ACQ, cq.iova());
    bar.write32(registers::CC, registers::CC_EN | registers::CC_CSS_NVM | registers::CC_IOQES);
    wait(&bar, "enable", |c| c & registers::CSTS_RDY != 0)?;
    println!("VFIO-PROBE: enabled, admin SQ at iova {:#x}, CQ at {:#x}", sq.iova(), cq.iova());
    let mut admin = Admin { bar, sq, cq, tail: 0, head: 0, phase: true, cid: 0 };

    // 1. Driver memory.
    let data = DmaMemory::new(4096).map_err(|e| e.to_string())?;
    let st = admin.identify(fp_nvme_spec::identify::CNS_CONTROLLER, 0, data.iova())?;
    let id = data.as_slice();
    println!(
        "VFIO-PROBE: identify into DmaMemory status {st:#x}: vid {:#06x} serial {:?} model {:?}",
        u16::from_le_bytes([id[0], id[1]]),
        text(&id[4..24]),
        text(&id[24..64])
    );
    if st != 0 || id[24..64].iter().all(|&b| b == 0) {
        return Err("Identify Controller into DmaMemory brought no data".into());
    }
    let model = id[24..64].to_vec();

    // 2. A daemon buffer: registered in the map by itself (before the container existed), so
    // mapped in the container.
    let buf = early;
    buf.as_mut_slice().fill(0);
    let iova = buf.iova().ok_or("an AlignedBuf is not in the DMA map")?;
    let st = admin.identify(fp_nvme_spec::identify::CNS_CONTROLLER, 0, iova)?;
    println!("VFIO-PROBE: identify into AlignedBuf (iova {iova:#x}) status {st:#x}");
    if st != 0 || buf.as_slice()[24..64] != model[..] {
        return Err("Identify Controller into an AlignedBuf differs".into());
    }

    // 3. A shared mapping registered by hand, as vhost-user guest regions are.
    let len = 2 << 20;
    // SAFETY: a new anonymous shared mapping chosen by the kernel; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    let base = memory_map().register(p as usize, len).map_err(|e| e.to_string())?;
    let st = admin.identify(fp_nvme_spec::identify::CNS_NAMESPACE, 1, base + 0x1000)?;
    // SAFETY: 4 KiB inside the 2 MiB mapping, written by the device before the completion.
    let ns = unsafe { std::slice::from_raw_parts((p as *const u8).add(0x1000), 4096) };
    let nsze = u64::from_le_bytes(ns[0..8].try_into().unwrap());
    let lbaf = ns[128 + 4 * usize::from(ns[26] & 0xf) + 2];
    println!(
        "VFIO-PROBE: identify namespace 1 into a registered mapping (iova {:#x}) status {st:#x}: {nsze} blocks of {} bytes",
        base + 0x1000,
        1u32 << lbaf
    );
    if st != 0 || nsze == 0 {
        return Err("Identify Namespace into a registered mapping brought no data".into());
    }
    println!("VFIO-PROBE: DMA map {:?}", memory_map().stats());

    // 4. After unregistering, the same IOVA is unreachable: the IOMMU refuses the transfer
    // (QEMU's controller still completes it with success: the data must not arrive).
    // SAFETY: the 4 KiB written above, still mapped; the device is idle.
    unsafe { std::ptr::write_bytes((p as *mut u8).add(0x1000), 0, 4096) };
    memory_map().unregister(p as usize, len).map_err(|e| e.to_string())?;
    let st = admin.identify(fp_nvme_spec::identify::CNS_NAMESPACE, 1, base + 0x1000)?;
    // SAFETY: the same 4 KiB, still mapped; read after the completion.
    let arrived =
        unsafe { std::slice::from_raw_parts((p as *const u8).add(0x1000), 4096) }.iter().any(|&b| b != 0);
    println!(
        "VFIO-PROBE: identify into the unregistered iova {:#x}: status {st:#x}, data arrived: {arrived}",
        base + 0x1000
    );
    // SAFETY: unmaps the mapping made above, no longer registered and no longer borrowed.
    unsafe { libc::munmap(p, len) };
    if arrived {
        return Err("a transfer to an unregistered IOVA reached memory: the IOMMU does not isolate".into());
    }

    // 5. Function-level reset: the controller comes back disabled.
    let reset = f.reset_function().map_err(|e| e.to_string())?;
    let (cc, csts) = (bar.read32(registers::CC), bar.read32(registers::CSTS));
    println!("VFIO-PROBE: reset_function {reset}: CC {cc:#x} CSTS {csts:#x}");
    if reset && (cc & registers::CC_EN != 0 || csts & registers::CSTS_RDY != 0) {
        return Err("the controller is still enabled after the function reset".into());
    }
    drop(admin);
    Ok(())
}
