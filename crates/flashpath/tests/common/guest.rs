//! Guest VMs for the end-to-end tests: a Linux guest under QEMU (TCG) whose disks are the
//! daemon's vhost-user-blk sockets.
//!
//! * [`image`] builds the boot image once per test process with `tests/guest/build-image.sh`
//!   (cached on disk across runs; see docs/guest-tests.md) and returns its kernel and initramfs.
//! * [`available`] says whether guests can run here: it fails the test under `CI=true` when
//!   QEMU is missing, and elsewhere tells the caller to skip.
//! * [`Vm::boot`] starts QEMU with one `vhost-user-blk-pci` device per socket and the scenario
//!   on the kernel command line (`fp.scenario=NAME`), and streams the serial console: every line
//!   is kept ([`Vm::console`]), written to a file and handed to [`Vm::next_line`] /
//!   [`Vm::wait_for`] as it arrives, so a test can react to the guest while it runs (a crash
//!   test kills the daemon after some marker, restarts it and reads on). Every boot has a hard
//!   deadline ([`BOOT_TIMEOUT`] unless given); QEMU is killed on drop, and the console is printed
//!   when the test is failing.
//! * [`Vm::wait_result`] waits for the guest's `FLASHPATH-GUEST-RESULT:` line and collects its
//!   `FLASHPATH-GUEST-INFO:` lines; [`run_scenario`] does the whole boot and asserts PASS.
//! * [`expected_contents`] replays the `op` lines the guest reports for a disk, so the host can
//!   compare a whole backing file (or a RAM disk read back through libblkio) with what the guest
//!   wrote.
//! * For live migration a VM can have a QMP socket ([`VmConfig::qmp`], [`Vm::qmp`]), wait for an
//!   incoming migration ([`VmConfig::incoming`]) and take console input ([`VmConfig::console_input`],
//!   [`Vm::send_line`]); [`migrate`] drives a migration between two of them and [`stamp`] speaks
//!   the `migrate` scenario's console protocol and checks its stamped blocks from the host.
//! * A VM can have a NIC whose one destination is a port on the host's loopback
//!   ([`VmConfig::netdev`]), for the kernel's NVMe/TCP host against the daemon's target, and
//!   one port on the host's loopback forwarded to the guest's NVMe/TCP port
//!   ([`VmConfig::hostfwd`]), for a host-side initiator against the kernel's target.
//! * A VM can have an emulated NVMe controller on a raw image behind an emulated IOMMU
//!   ([`VmConfig::nvme`]: q35, `intel-iommu`, guest `intel_iommu=on`), with QEMU's doorbell
//!   trace events in a file, and files of the test's own (freshly built binaries) in a second
//!   cpio after the cached initramfs ([`VmConfig::extra_files`]).
//! * NVMe/TCP TLS: [`nvme_tls_psk`] derives, with flashpath's code, the TLS PSK a guest puts in
//!   its kernel's `.nvme` keyring for tlshd; [`secret_file`] writes it (owner-only) for
//!   [`VmConfig::extra_files`], so it never crosses the console ([`hex`] to check that).

pub mod ext4;
pub mod migrate;
pub mod qmp;
pub mod stamp;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Hard limit for one boot, from QEMU's start to the result line.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long QEMU gets to exit after the guest printed its result (it powers itself off).
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
pub const RESULT_MARKER: &str = "FLASHPATH-GUEST-RESULT:";
pub const INFO_MARKER: &str = "FLASHPATH-GUEST-INFO:";
/// Console lines a failed wait names in its panic message (the whole tail prints on drop).
const LAST_LINES_IN_PANIC: usize = 12;

/// Kernel arguments of every boot: serial console; a panic ends the VM (`-no-reboot`); skip the
/// crypto self-tests and the jitter entropy source, which cost seconds under TCG.
const KERNEL_ARGS: &str = "console=ttyS0 panic=-1 cryptomgr.notests initcall_blacklist=jent_mod_init";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The QEMU binary: `$FLASHPATH_QEMU`, or `qemu-system-x86_64` from the PATH.
pub fn qemu_binary() -> String {
    std::env::var("FLASHPATH_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into())
}

/// Whether guest tests can run: QEMU must start. Without it a test fails under `CI=true` (CI
/// must run the guests) and is skipped elsewhere, with a message saying how to get QEMU.
pub fn available() -> bool {
    let qemu = qemu_binary();
    let works = Command::new(&qemu)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if works {
        return true;
    }
    let hint = "./run test installs it (qemu-system-x86 from bookworm-backports)";
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("CI=true and {qemu} does not run: the guest tests must not be skipped in CI; {hint}");
    }
    eprintln!("SKIPPED: {qemu} does not run, so no guest test runs; {hint}");
    false
}

/// The boot image: an uncompressed kernel booted through PVH and the initramfs.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
}

/// Builds the image on first use in this process (or finds it in the cache) and returns it.
/// Panics with the build script's output if it fails.
pub fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let script = repo_root().join("tests/guest/build-image.sh");
        let t0 = Instant::now();
        let out =
            Command::new("bash").arg(&script).stdin(Stdio::null()).output().expect("running build-image.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{} failed ({}):\n{stderr}{stdout}", script.display(), out.status);
        let dir = stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("image: "))
            .unwrap_or_else(|| panic!("build-image.sh printed no 'image: DIR' line:\n{stderr}{stdout}"));
        let dir = PathBuf::from(dir.trim());
        eprintln!("guest image {} ready in {:.1?}", dir.display(), t0.elapsed());
        Image { vmlinux: dir.join("vmlinux"), initramfs: dir.join("initramfs.cpio"), dir }
    })
}

/// The address in the guest's user network that [`VmConfig::netdev`] forwards to the host's
/// loopback (the guest itself is 10.0.2.15).
pub const NVMF_GUEST_ADDR: &str = "10.0.2.100";

/// The guest's NVMe/TCP port that [`VmConfig::hostfwd`] forwards a host port to.
pub const NVME_TCP_GUEST_PORT: u16 = 4420;

/// QEMU's `-netdev` of [`VmConfig::netdev`] and [`VmConfig::hostfwd`]: user networking without
/// a route out (`restrict=on`); a `guestfwd` that runs `socat` for each connection the guest
/// opens to [`NVMF_GUEST_ADDR`]`:port`, joining it to `127.0.0.1:port` on the host; a
/// `hostfwd` from `127.0.0.1:port` on the host to the guest's [`NVME_TCP_GUEST_PORT`].
fn forward_netdev(guestfwd: impl IntoIterator<Item = u16>, hostfwd: Option<u16>) -> String {
    let mut s = "user,id=n0,restrict=on".to_string();
    for port in guestfwd {
        s.push_str(&format!(",guestfwd=tcp:{NVMF_GUEST_ADDR}:{port}-cmd:socat STDIO TCP:127.0.0.1:{port}"));
    }
    if let Some(port) = hostfwd {
        s.push_str(&format!(",hostfwd=tcp:127.0.0.1:{port}-:{NVME_TCP_GUEST_PORT}"));
    }
    s
}

/// An emulated NVMe controller (QEMU's `-device nvme`) on a raw image, behind an emulated
/// IOMMU: the VM becomes q35 with `kernel-irqchip=split` and `-device intel-iommu,intremap=on`,
/// and the guest boots with `intel_iommu=on`, so the function can be handed to VFIO.
#[derive(Debug, Clone)]
pub struct NvmeDevice {
    /// The namespace's backing file (raw; its size is the namespace's).
    pub image: PathBuf,
    /// The controller's serial number (the guest finds the function by it).
    pub serial: String,
    /// QEMU's `pci_nvme_mmio_doorbell_sq` / `_cq` trace events go to this file, one line per
    /// doorbell write (see [`count_doorbells`]).
    pub trace: Option<PathBuf>,
}

/// The doorbell writes in a trace file of [`NvmeDevice::trace`]: (submission queue tail writes,
/// completion queue head writes), I/O queues only (the admin queue, 0, is left out).
pub fn count_doorbells(trace: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(trace).unwrap_or_else(|e| panic!("reading {}: {e}", trace.display()));
    let (mut sq, mut cq) = (0, 0);
    for line in text.lines() {
        // "pci_nvme_mmio_doorbell_sq sqid 1 new_tail 5" (the log backend's format, after a
        // pid/time prefix).
        let count = if line.contains("pci_nvme_mmio_doorbell_sq") {
            &mut sq
        } else if line.contains("pci_nvme_mmio_doorbell_cq") {
            &mut cq
        } else {
            continue;
        };
        let qid = line.split_whitespace().skip_while(|w| *w != "sqid" && *w != "cqid").nth(1);
        if qid.and_then(|q| q.parse::<u32>().ok()).is_some_and(|q| q != 0) {
            *count += 1;
        }
    }
    (sq, cq)
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// `fp.scenario=` for the guest's init (tests/guest/init).
    pub scenario: String,
    /// vhost-user-blk sockets, one `vhost-user-blk-pci` device each, in this order.
    pub disks: Vec<PathBuf>,
    /// `num-queues` of each device; `None` leaves it out, so QEMU asks for one per vCPU.
    pub num_queues: Option<u16>,
    /// `packed=on` on each device, so QEMU negotiates VIRTIO_F_RING_PACKED (off by default).
    pub packed: bool,
    pub vcpus: u32,
    pub mem_mib: u32,
    /// More kernel arguments (e.g. `fp.something=value` for a scenario).
    pub kernel_args: Vec<String>,
    /// From QEMU's start to the result line; QEMU is killed when it passes.
    pub timeout: Duration,
    /// Names the console, stderr and QMP files (`console-<name>.log`); the scenario if `None`.
    /// The VMs of one migration share a scenario, so they need names of their own.
    pub name: Option<String>,
    /// A QMP socket, `<dir>/qmp-<name>.sock`, for [`Vm::qmp`].
    pub qmp: bool,
    /// `-incoming defer`: the VM waits for `migrate-incoming` (see [`migrate`]) instead of
    /// booting; its console then continues the migrated guest's.
    pub incoming: bool,
    /// QEMU's stdin is a pipe to the serial console ([`Vm::send_line`]) instead of /dev/null.
    pub console_input: bool,
    /// A virtio-net NIC on QEMU's user network with `restrict=on` (no route out of QEMU) whose
    /// only way out is [`NVMF_GUEST_ADDR`]`:PORT` forwarded to `127.0.0.1:PORT` on the host, one
    /// socat per TCP connection (the nvmf scenario's target). Loopback only: nothing else is
    /// reachable, and nothing here can name another host address.
    pub netdev: Option<u16>,
    /// More ports forwarded as [`VmConfig::netdev`]'s, each to the same port on the host's
    /// loopback (two listeners of one subsystem, say); used only with `netdev`.
    pub netdev_more: Vec<u16>,
    /// `hostfwd` of `127.0.0.1:PORT` on the host to the guest's [`NVME_TCP_GUEST_PORT`] on the
    /// same `restrict=on` user network (a NIC is added if [`VmConfig::netdev`] is `None`).
    pub hostfwd: Option<u16>,
    /// An emulated NVMe controller behind an emulated IOMMU (see [`NvmeDevice`]).
    pub nvme: Option<NvmeDevice>,
    /// Files the test adds to the guest's root file system: (host file, absolute path in the
    /// guest). They go into a second cpio, stripped when they are ELF binaries, which the
    /// kernel unpacks after the cached initramfs (the two are concatenated into the VM's
    /// directory); [`VmConfig::mem_mib`] must hold both.
    pub extra_files: Vec<(PathBuf, String)>,
}

impl VmConfig {
    /// Two vCPUs, 512 MiB, two queues per disk, split rings, [`BOOT_TIMEOUT`].
    pub fn new(scenario: &str, disks: Vec<PathBuf>) -> VmConfig {
        VmConfig {
            scenario: scenario.into(),
            disks,
            num_queues: Some(2),
            packed: false,
            vcpus: 2,
            mem_mib: 512,
            kernel_args: Vec::new(),
            timeout: BOOT_TIMEOUT,
            name: None,
            qmp: false,
            incoming: false,
            console_input: false,
            netdev: None,
            netdev_more: Vec::new(),
            hostfwd: None,
            nvme: None,
            extra_files: Vec::new(),
        }
    }

    /// The name of the VM's files and messages.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.scenario)
    }
}

/// `base` followed by a cpio (newc) of `files` (see [`VmConfig::extra_files`]), written to
/// `out.cpio`; the staging tree is `out/`. Returns the cpio's path.
fn initramfs_with(base: &Path, files: &[(PathBuf, String)], out: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(out);
    for (src, dest) in files {
        let rel = dest.strip_prefix('/').unwrap_or_else(|| panic!("{dest}: not an absolute guest path"));
        let to = out.join(rel);
        std::fs::create_dir_all(to.parent().expect("a file has a parent"))
            .expect("creating the staging tree");
        std::fs::copy(src, &to)
            .unwrap_or_else(|e| panic!("copying {} into the guest's files: {e}", src.display()));
        let mut magic = [0u8; 4];
        let elf = File::open(&to).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"\x7fELF";
        if elf {
            // Debug binaries are mostly debug info: 120 MiB of flashpath strips to about 20.
            let ok = Command::new("strip").arg(&to).status().is_ok_and(|s| s.success());
            assert!(ok, "strip {} failed", to.display());
        }
    }
    let cpio = out.with_extension("cpio");
    std::fs::copy(base, &cpio).expect("copying the initramfs");
    // The kernel unpacks concatenated archives one after the other; paths are relative to the
    // root, and the files keep their modes (executables stay executable).
    let script = format!(
        "cd '{}' && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 >> '{}'",
        out.display(),
        cpio.display()
    );
    let ok = Command::new("sh").args(["-c", &script]).status().is_ok_and(|s| s.success());
    assert!(ok, "packing the guest's extra files failed: {script}");
    cpio
}

/// A running QEMU and its console.
pub struct Vm {
    child: Option<Child>,
    /// The serial console's input when [`VmConfig::console_input`].
    stdin: Option<ChildStdin>,
    /// The QMP socket when [`VmConfig::qmp`], and the connection once made.
    qmp_path: Option<PathBuf>,
    qmp: Option<qmp::Qmp>,
    console: Arc<Mutex<String>>,
    lines: mpsc::Receiver<String>,
    /// The console as a file (`<dir>/console-<name>.log`, see [`VmConfig::name`]), written as
    /// lines arrive.
    pub console_path: PathBuf,
    qemu_stderr: PathBuf,
    started: Instant,
    deadline: Instant,
    /// [`VmConfig::name`]: the scenario unless the VM has a name of its own.
    scenario: String,
    /// [`VmConfig::mem_mib`].
    mem_mib: u32,
}

impl Vm {
    /// Starts QEMU; its console and stderr files go in `dir`.
    pub fn boot(cfg: &VmConfig, dir: &Path) -> Vm {
        let img = image();
        let mem = cfg.mem_mib;
        let mut cmd = Command::new(qemu_binary());
        cmd.args(["-accel", "tcg", "-cpu", "max", "-smp"])
            .arg(cfg.vcpus.to_string())
            .arg("-m")
            .arg(format!("{mem}M"))
            // vhost-user needs the guest's RAM in shared memory the daemon can map.
            .arg("-object")
            .arg(format!("memory-backend-memfd,id=mem,size={mem}M,share=on"));
        if let Some(nvme) = &cfg.nvme {
            // The IOMMU comes first, before the PCI devices it translates for; interrupt
            // remapping needs the split irqchip.
            cmd.args(["-machine", "q35,kernel-irqchip=split,memory-backend=mem"])
                .args(["-device", "intel-iommu,intremap=on"])
                .arg("-drive")
                .arg(format!("if=none,id=nv0,file={},format=raw,cache=writeback", nvme.image.display()))
                .arg("-device")
                .arg(format!("nvme,serial={},drive=nv0", nvme.serial));
            if let Some(trace) = &nvme.trace {
                cmd.arg("-trace").arg(format!("enable=pci_nvme_mmio_doorbell_*,file={}", trace.display()));
            }
        } else {
            cmd.args(["-machine", "memory-backend=mem"]);
        }
        for (i, sock) in cfg.disks.iter().enumerate() {
            let mut device = format!("vhost-user-blk-pci,chardev=disk{i}");
            if let Some(n) = cfg.num_queues {
                device.push_str(&format!(",num-queues={n}"));
            }
            if cfg.packed {
                device.push_str(",packed=on");
            }
            cmd.arg("-chardev")
                .arg(format!("socket,id=disk{i},path={},reconnect-ms=1000", sock.display()))
                .arg("-device")
                .arg(device);
        }
        if cfg.netdev.is_some() || cfg.hostfwd.is_some() {
            cmd.arg("-netdev")
                .arg(forward_netdev(cfg.netdev.iter().chain(&cfg.netdev_more).copied(), cfg.hostfwd))
                .args(["-device", "virtio-net-pci,netdev=n0"]);
        }
        let mut append = format!("{KERNEL_ARGS} fp.scenario={}", cfg.scenario);
        if cfg.nvme.is_some() {
            append.push_str(" intel_iommu=on");
        }
        for a in &cfg.kernel_args {
            append.push(' ');
            append.push_str(a);
        }
        cmd.args(["-display", "none", "-nodefaults", "-serial", "stdio", "-no-reboot", "-kernel"])
            .arg(&img.vmlinux)
            .arg("-initrd")
            .arg(if cfg.extra_files.is_empty() {
                img.initramfs.clone()
            } else {
                initramfs_with(
                    &img.initramfs,
                    &cfg.extra_files,
                    &dir.join(format!("initramfs-{}", cfg.name())),
                )
            })
            .arg("-append")
            .arg(append);
        let name = cfg.name();
        let qmp_path = cfg.qmp.then(|| dir.join(format!("qmp-{name}.sock")));
        if let Some(path) = &qmp_path {
            cmd.arg("-qmp").arg(format!("unix:{},server=on,wait=off", path.display()));
        }
        if cfg.incoming {
            // The destination of a migration: same machine, devices and kernel line as the
            // source (QEMU requires it), and RAM and device state from the source.
            cmd.args(["-incoming", "defer"]);
        }
        let console_path = dir.join(format!("console-{name}.log"));
        let qemu_stderr = dir.join(format!("qemu-{name}.stderr"));
        let started = Instant::now();
        let mut child = cmd
            .stdin(if cfg.console_input { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(File::create(&qemu_stderr).expect("creating QEMU's stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", qemu_binary()));
        let stdout = child.stdout.take().expect("QEMU's stdout");
        let stdin = child.stdin.take();
        let console = Arc::new(Mutex::new(String::new()));
        let (tx, lines) = mpsc::channel();
        let mut file = File::create(&console_path).expect("creating the console file");
        let kept = Arc::clone(&console);
        std::thread::Builder::new()
            .name("guest-console".into())
            .spawn(move || {
                let mut r = BufReader::new(stdout);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match r.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let line = String::from_utf8_lossy(&buf).trim_end_matches(['\r', '\n']).replace('\r', "");
                    let _ = writeln!(file, "{line}");
                    {
                        let mut c = kept.lock().unwrap_or_else(|e| e.into_inner());
                        c.push_str(&line);
                        c.push('\n');
                    }
                    // Nobody may be listening any more; the file and the copy go on.
                    let _ = tx.send(line);
                }
            })
            .expect("spawning the console thread");
        Vm {
            child: Some(child),
            stdin,
            qmp_path,
            qmp: None,
            console,
            lines,
            console_path,
            qemu_stderr,
            started,
            deadline: started + cfg.timeout,
            scenario: name.to_string(),
            mem_mib: cfg.mem_mib,
        }
    }

    /// Types `line` and a newline on the serial console (the guest's /dev/console). Needs
    /// [`VmConfig::console_input`].
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("send_line needs VmConfig::console_input");
        if let Err(e) = stdin.write_all(format!("{line}\n").as_bytes()).and_then(|()| stdin.flush()) {
            panic!("guest '{}': writing '{line}' to the console: {e}", self.scenario);
        }
    }

    /// The VM's QMP connection, made on first use (QEMU creates the socket at start-up; this
    /// waits up to 10 s for it). Needs [`VmConfig::qmp`].
    pub fn qmp(&mut self) -> &mut qmp::Qmp {
        if self.qmp.is_none() {
            let path = self.qmp_path.clone().expect("Vm::qmp needs VmConfig::qmp");
            let conn = qmp::Qmp::connect(&path, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("guest '{}': QMP at {}: {e}", self.scenario, path.display()));
            self.qmp = Some(conn);
        }
        self.qmp.as_mut().expect("connected above")
    }

    /// The name given in [`VmConfig::name`] (or the scenario).
    pub fn name(&self) -> &str {
        &self.scenario
    }

    /// Everything the console printed so far.
    pub fn console(&self) -> String {
        self.console.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `r` with the INFO lines of the whole console, including those a [`Vm::wait_for`]
    /// consumed before [`Vm::wait_result`].
    pub fn whole_result(&self, r: &GuestResult) -> GuestResult {
        let console = self.console();
        let info = console
            .lines()
            .filter_map(|l| Some(l[l.find(INFO_MARKER)? + INFO_MARKER.len()..].trim().to_string()));
        GuestResult { info: info.collect(), ..r.clone() }
    }

    /// QEMU's stderr so far.
    pub fn qemu_stderr(&self) -> String {
        std::fs::read_to_string(&self.qemu_stderr).unwrap_or_default()
    }

    /// Time since QEMU started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The next console line, or `None` if none came before `until` (or the boot deadline,
    /// whichever is first) or the console closed (QEMU exited).
    pub fn next_line(&mut self, until: Instant) -> Option<String> {
        let until = until.min(self.deadline);
        let left = until.saturating_duration_since(Instant::now());
        let line = self.lines.recv_timeout(left).ok()?;
        // Too little RAM for the image: files are missing and the scenario fails later in a
        // way that does not say why.
        assert!(
            !line.contains("Initramfs unpacking failed"),
            "guest '{}' has too little RAM ({} MiB) for its initramfs: {line}",
            self.name(),
            self.mem_mib
        );
        Some(line)
    }

    /// Reads lines until `pred` accepts one and returns it. Panics if the console closes or
    /// `timeout` (bounded by the boot deadline) passes first; QEMU is then killed, and the
    /// console is printed when the `Vm` is dropped.
    pub fn wait_for(&mut self, what: &str, mut pred: impl FnMut(&str) -> bool, timeout: Duration) -> String {
        let until = Instant::now().checked_add(timeout).unwrap_or(self.deadline);
        loop {
            match self.next_line(until) {
                Some(line) if pred(&line) => return line,
                Some(_) => {}
                None => {
                    let why = if self.exited() { "QEMU exited" } else { "timed out" };
                    self.kill();
                    // Drop prints the console and QEMU's stderr; the message itself names
                    // the guest's last lines, so that a log cut short still shows where the
                    // guest stood.
                    let console = self.console();
                    let lines: Vec<&str> = console.lines().collect();
                    let last = lines[lines.len().saturating_sub(LAST_LINES_IN_PANIC)..].join("\n  | ");
                    panic!(
                        "guest '{}': {why} after {:.1?} waiting for {what}; its last lines:\n  | {last}",
                        self.scenario,
                        self.elapsed()
                    );
                }
            }
        }
    }

    /// Waits for the result line (within the boot deadline) and returns it with the INFO lines
    /// printed before it.
    pub fn wait_result(&mut self) -> GuestResult {
        let mut info = Vec::new();
        let line = self.wait_for(
            "the result line",
            |l| {
                if let Some(i) = l.find(INFO_MARKER) {
                    info.push(l[i + INFO_MARKER.len()..].trim().to_string());
                }
                l.contains(RESULT_MARKER)
            },
            Duration::MAX,
        );
        let rest = line[line.find(RESULT_MARKER).expect("matched") + RESULT_MARKER.len()..].trim();
        let (verdict, detail) = rest.split_once(' ').unwrap_or((rest, ""));
        GuestResult { passed: verdict == "PASS", detail: detail.to_string(), info, time: self.elapsed() }
    }

    /// Waits for QEMU to exit (the guest powers off after its result); kills it after
    /// `timeout` and panics.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let until = Instant::now() + timeout;
        let child = self.child.as_mut().expect("QEMU already reaped");
        loop {
            if let Some(status) = child.try_wait().expect("waiting for QEMU") {
                self.child = None;
                return status;
            }
            if Instant::now() > until {
                self.kill();
                panic!("guest '{}': QEMU did not exit within {timeout:?}", self.scenario);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn exited(&mut self) -> bool {
        self.child.as_mut().is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    /// Kills QEMU (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        self.qmp = None;
        self.stdin = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The end of the console and QEMU's stderr, for failure messages.
    pub fn report(&self) -> String {
        let console = self.console();
        let lines: Vec<&str> = console.lines().collect();
        let tail = &lines[lines.len().saturating_sub(120)..];
        format!(
            "---- guest console (last {} of {} lines; all in {}) ----\n{}\n---- QEMU stderr ----\n{}\n---- end ----",
            tail.len(),
            lines.len(),
            self.console_path.display(),
            tail.join("\n"),
            self.qemu_stderr()
        )
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("guest '{}' (dropped while the test fails):\n{}", self.scenario, self.report());
        }
    }
}

/// What the guest reported.
#[derive(Debug, Clone)]
pub struct GuestResult {
    pub passed: bool,
    /// The scenario name after PASS; "<scenario>: <reason>" after FAIL.
    pub detail: String,
    /// The text after each `FLASHPATH-GUEST-INFO:`, in order.
    pub info: Vec<String>,
    /// From QEMU's start to the result line.
    pub time: Duration,
}

impl GuestResult {
    /// The INFO lines that start with `word`, without it.
    pub fn info_after(&self, word: &str) -> Vec<&str> {
        self.info.iter().filter_map(|l| l.strip_prefix(word)).map(str::trim).collect()
    }

    /// The `key=value` words of the one INFO line that starts with `word`; panics unless
    /// exactly one does.
    pub fn fields(&self, word: &str) -> HashMap<String, String> {
        let lines = self.info_after(word);
        assert_eq!(lines.len(), 1, "one '{word}' line expected: {:?}", self.info);
        lines[0]
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.into(), v.into()))
            .collect()
    }

    /// The `disk` line of the disk with this serial, as key=value pairs (plus "dev").
    pub fn disk(&self, serial: &str) -> HashMap<String, String> {
        for l in self.info_after("disk") {
            let mut words = l.split_whitespace();
            let dev = words.next().unwrap_or_default();
            let mut m: HashMap<String, String> =
                words.filter_map(|w| w.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
            if m.get("serial").map(String::as_str) == Some(serial) {
                m.insert("dev".into(), dev.into());
                return m;
            }
        }
        panic!("the guest reported no disk with serial {serial}: {:?}", self.info)
    }

    /// The `irqs` line as (queue name, interrupts), e.g. ("virtio0-req.1", 57).
    pub fn irqs(&self) -> Vec<(String, u64)> {
        self.info_after("irqs")
            .iter()
            .flat_map(|l| l.split_whitespace())
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(0)))
            .collect()
    }

    /// The content-changing operations the guest reported for the disk with this serial.
    pub fn ops(&self, serial: &str) -> Vec<DiskOp> {
        self.info_after("op")
            .iter()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                if w.first() != Some(&serial) {
                    return None;
                }
                let n = |i: usize| -> u64 {
                    w.get(i).and_then(|x| x.parse().ok()).unwrap_or_else(|| panic!("malformed op line: {l}"))
                };
                Some(match w.get(1) {
                    Some(&"write") => DiskOp::Write { offset: n(2), len: n(3), seed: n(4) },
                    Some(&"zero") => DiskOp::Zero { offset: n(2), len: n(3) },
                    _ => panic!("unknown op line: {l}"),
                })
            })
            .collect()
    }
}

/// A change the guest made to a disk (an `op` INFO line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskOp {
    /// `fpio write`: [`super::pattern`]`(seed, offset, len)` at `offset`.
    Write { offset: u64, len: u64, seed: u64 },
    /// A discard or write-zeroes that the guest saw read back as zeroes.
    Zero { offset: u64, len: u64 },
}

/// The contents a disk of `size` bytes that started as zeroes must have after `ops`.
pub fn expected_contents(size: u64, ops: &[DiskOp]) -> Vec<u8> {
    let mut img = vec![0u8; size as usize];
    for op in ops {
        match *op {
            DiskOp::Write { offset, len, seed } => {
                let (o, l) = (offset as usize, len as usize);
                img[o..o + l].copy_from_slice(&super::pattern(seed, offset, l));
            }
            DiskOp::Zero { offset, len } => img[offset as usize..(offset + len) as usize].fill(0),
        }
    }
    img
}

/// Boots `cfg`, waits for the result within its deadline, asserts PASS and waits for QEMU to
/// exit. Panics with the console on any failure.
pub fn run_scenario(cfg: &VmConfig, dir: &Path) -> GuestResult {
    let mut vm = Vm::boot(cfg, dir);
    let result = vm.wait_result();
    // On failure, dropping `vm` prints the console and QEMU's stderr.
    assert!(result.passed, "guest scenario failed: {}", result.detail);
    vm.wait_exit(EXIT_TIMEOUT);
    eprintln!(
        "guest '{}': PASS after {:.1?} (QEMU exited after {:.1?})",
        cfg.scenario,
        result.time,
        vm.elapsed()
    );
    result
}

/// The TLS PSK that a host `hostnqn` with `configured` (a PSK in the interchange format) and a
/// target both derive for subsystem `subnqn` (identity version 0, `NVMe0R0h <hostnqn>
/// <subnqn>`, as Linux 6.12 offers it), by flashpath's code (fp-crypto): the payload of the
/// `psk` key a guest puts in its kernel's `.nvme` keyring under that identity for tlshd.
pub fn nvme_tls_psk(configured: &str, hostnqn: &str, subnqn: &str) -> Vec<u8> {
    use fp_crypto::tls::{ConfiguredPsk, IdentityVersion};
    let retained = ConfiguredPsk::parse(configured)
        .and_then(|c| c.retained(hostnqn))
        .unwrap_or_else(|e| panic!("the test's PSK: {e}"));
    let identity = retained.identity(IdentityVersion::V0, hostnqn, subnqn).expect("the PSK identity");
    let hh = retained.hash() as u8;
    assert_eq!(identity.to_string(), format!("NVMe0R{hh:02} {hostnqn} {subnqn}"));
    retained.tls_psk(&identity).expect("the TLS PSK").to_vec()
}

/// Writes `bytes` to `dir/name`, readable by its owner only, and returns the path.
pub fn secret_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod 600 {}: {e}", path.display()));
    path
}

/// `bytes` in lowercase hex (to look for a secret in a console log).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
