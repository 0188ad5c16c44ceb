//! Live migration of a Linux guest on flashpath disks (issue 22; docs/migration.md,
//! docs/guest-tests.md). QEMU (TCG) boots the `migrate` scenario: two writers, one per vCPU,
//! stamp 4 KiB blocks continuously with O_DIRECT and record each acknowledged write in guest RAM.
//! While they write, QEMU migrates the VM over QMP to a second QEMU started with
//! `-incoming defer`; the host then tells the guest on its (migrated) console to stop and re-read
//! every block, and reads the backing file itself to check it holds the same. One boot carries
//! the whole chain, VM1 -> VM2 -> VM3 -> VM4:
//!
//! * rollback: a migration to a destination controller is cancelled (`migrate_cancel`); VM1
//!   runs on and its disk is intact;
//! * (a) one daemon, two controllers on one disk: VM1 -> VM2 (`migrate_from`);
//! * (b) two daemons on one file: VM2 -> VM3;
//! * (d) two daemons without shared storage: VM3 -> VM4, the source daemon mirroring the disk to
//!   the destination daemon's own file over NBD, completed at `pre-switchover`.
//!
//! (c), two daemons on one RBD image, is in migration_rbd.rs. `qemu_storage_daemon_...` runs
//! the same guest on qemu-storage-daemon, the peer the benchmark compares with: when a flashpath
//! case fails, it tells whether the harness and QEMU work. Without QEMU the tests fail under
//! `CI=true` and are skipped elsewhere.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::guest::migrate::{Migration, MigrationOpts};
use common::guest::{self, stamp, Vm, VmConfig};

const MIB: u64 = 1 << 20;
/// The guest's disk: small, so a check (every block re-read under TCG) takes about a second.
const DISK_BYTES: u64 = 32 * MIB;
/// Guest RAM, all of which each migration copies: the least the image boots in (with 256 MiB
/// the kernel cannot unpack the 86 MiB initramfs: "Initramfs unpacking failed: write error").
const GUEST_MIB: u32 = 320;
/// How long the writers run before a migration starts, and on the destination before a check.
const WRITE_PHASE: Duration = Duration::from_millis(1500);
/// A bound on the whole chain for each VM (QEMU's start to the guest's result).
const VM_TIMEOUT: Duration = Duration::from_secs(400);

/// One guest at a time, whatever the test runner's thread count.
fn one_at_a_time() -> Option<MutexGuard<'static, ()>> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    guest::available().then_some(guard)
}

/// A VM of the chain: the `migrate` scenario on one disk, with QMP and console input; the disk
/// found in the guest by `serial`. Every VM of a chain gets the same kernel line (QEMU requires
/// source and destination to match).
fn vm_config(name: &str, socket: PathBuf, serial: &str, incoming: bool) -> VmConfig {
    VmConfig {
        name: Some(name.into()),
        mem_mib: GUEST_MIB,
        kernel_args: vec![format!("fp.disk={serial}")],
        timeout: VM_TIMEOUT,
        qmp: true,
        incoming,
        console_input: true,
        ..VmConfig::new("migrate", vec![socket])
    }
}

/// A sparse file of [`DISK_BYTES`] (reads as zeroes).
fn disk_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path).and_then(|f| f.set_len(DISK_BYTES)).expect("creating a backing file");
    path
}

/// Lets the writers run, then checks the disk from the guest (`check n`) and from the host
/// (`image`), and starts the writers again (`resume n`).
fn check_and_resume(vm: &mut Vm, n: u32, image: &Path, what: &str) -> Vec<stamp::StampCheck> {
    std::thread::sleep(WRITE_PHASE);
    let checks = stamp::check(vm, n);
    stamp::assert_image_matches(image, &checks, what);
    stamp::resume(vm, n);
    checks
}

/// qemu-storage-daemon exporting one file as a vhost-user-blk socket (2 queues, O_DIRECT, no
/// image locking, so a second one can open the file for the migration).
struct Qsd {
    child: Child,
    socket: PathBuf,
}

impl Qsd {
    fn start(file: &Path, socket: PathBuf) -> Qsd {
        let child = Command::new("qemu-storage-daemon")
            .arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=file0,filename={},cache.direct=on,locking=off",
                file.display()
            ))
            .args(["--blockdev", "driver=raw,node-name=disk0,file=file0", "--export"])
            .arg(format!(
                "type=vhost-user-blk,id=exp0,node-name=disk0,addr.type=unix,addr.path={},writable=on,num-queues=2",
                socket.display()
            ))
            .stdin(Stdio::null())
            .spawn()
            .expect("starting qemu-storage-daemon (Debian package qemu-utils)");
        let until = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(
                Instant::now() < until,
                "qemu-storage-daemon made no socket {} in 10 s",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Qsd { child, socket }
    }
}

impl Drop for Qsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The chain's shape on qemu-storage-daemon: a cancelled migration, then two daemons on one
/// file (case b), with the same guest, checks and timings as the flashpath tests.
#[test]
fn qemu_storage_daemon_two_daemons_on_one_file_as_the_reference() {
    let Some(_one) = one_at_a_time() else { return };
    let t0 = Instant::now();
    let dir = tempfile::Builder::new().prefix("fp-mig-qsd-").tempdir_in("/var/tmp").unwrap();
    let file = disk_file(dir.path(), "disk.img");
    let q1 = Qsd::start(&file, dir.path().join("qsd1.sock"));
    let q2 = Qsd::start(&file, dir.path().join("qsd2.sock"));
    // qemu-storage-daemon's vhost-user-blk export answers GET_ID with this serial.
    let serial = "vhost_user_blk";
    let mut vm1 = Vm::boot(&vm_config("vm1", q1.socket.clone(), serial, false), dir.path());
    stamp::wait_writing(&mut vm1, 0);
    eprintln!("VM1 writing {:.1?} after the start", t0.elapsed());

    // Rollback: a slow migration to q2, cancelled while active.
    let mut vmx = Vm::boot(&vm_config("vm-cancelled", q2.socket.clone(), serial, true), dir.path());
    std::thread::sleep(WRITE_PHASE);
    let slow = MigrationOpts { max_bandwidth: Some(16 * MIB), ..MigrationOpts::default() };
    let m = Migration::start(&mut vm1, &mut vmx, dir.path(), "cancelled", &slow);
    m.wait(&mut vm1, &["active"]);
    std::thread::sleep(Duration::from_millis(500));
    m.cancel(&mut vm1, &mut vmx);
    check_and_resume(&mut vm1, 1, &file, "after the cancelled migration");

    // Two daemons on one file.
    let mut vm2 = Vm::boot(&vm_config("vm2", q2.socket.clone(), serial, true), dir.path());
    std::thread::sleep(WRITE_PHASE);
    let m = Migration::start(&mut vm1, &mut vm2, dir.path(), "qsd1-to-qsd2", &MigrationOpts::default());
    m.finish(&mut vm1, &mut vm2);
    check_and_resume(&mut vm2, 2, &file, "after qsd1 -> qsd2");
    let last = stamp::check(&mut vm2, 3);
    stamp::assert_image_matches(&file, &last, "at the end");
    stamp::done(&mut vm2);
    eprintln!("qemu-storage-daemon chain: {:.1?} in all", t0.elapsed());
}
