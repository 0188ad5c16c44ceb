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

/// In a module named like guest.rs's, so the workspace test step skips it (`--skip guest_vm::`)
/// and the guest step runs it alone (scripts/test.sh).
mod guest_vm {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::{Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::common::guest::migrate::{self, Migration, MigrationOpts};
    use super::common::guest::stamp::{self, check_and_resume, vm_config, WRITE_PHASE};
    use super::common::guest::{self, Vm};
    use super::common::Daemon;

    const MIB: u64 = 1 << 20;
    /// The guest's disk: small, so a check (every block re-read under TCG) takes about a second.
    const DISK_BYTES: u64 = 32 * MIB;

    /// One guest at a time, whatever the test runner's thread count.
    fn one_at_a_time() -> Option<MutexGuard<'static, ()>> {
        static LOCK: Mutex<()> = Mutex::new(());
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        guest::available().then_some(guard)
    }

    /// A sparse file of [`DISK_BYTES`] (reads as zeroes).
    fn disk_file(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::File::create(&path).and_then(|f| f.set_len(DISK_BYTES)).expect("creating a backing file");
        path
    }

    /// qemu-storage-daemon exporting one file as a vhost-user-blk socket (2 queues, O_DIRECT, no
    /// image locking, so a second one can open the file for the migration).
    struct Qsd {
        child: Child,
        socket: PathBuf,
    }

    impl Qsd {
        /// Whether qemu-storage-daemon runs: like [`guest::available`], a missing one fails the
        /// test under `CI=true` and skips it elsewhere.
        fn available() -> bool {
            let runs = Command::new("qemu-storage-daemon")
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            let ci = std::env::var("CI").as_deref() == Ok("true");
            assert!(
                runs || !ci,
                "CI=true and qemu-storage-daemon does not run (./run test installs qemu-utils)"
            );
            if !runs {
                eprintln!("SKIPPED: qemu-storage-daemon does not run (Debian package qemu-utils)");
            }
            runs
        }

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
        if !Qsd::available() {
            return;
        }
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
        check_and_resume(&mut vm1, 1, "after the cancelled migration", || file.clone());

        // Two daemons on one file. The destination is a qsd that served no frontend before:
        // qemu-storage-daemon 10.0 once panicked ("vu_panic: Error writing eventfd: Bad file
        // descriptor") serving a second frontend after the first one's migration was cancelled
        // and its QEMU gone, a bug of the reference, not of what this test checks.
        let q3 = Qsd::start(&file, dir.path().join("qsd3.sock"));
        let mut vm2 = Vm::boot(&vm_config("vm2", q3.socket.clone(), serial, true), dir.path());
        std::thread::sleep(WRITE_PHASE);
        let m = Migration::start(&mut vm1, &mut vm2, dir.path(), "qsd1-to-qsd3", &MigrationOpts::default());
        m.finish(&mut vm1, &mut vm2);
        check_and_resume(&mut vm2, 2, "after qsd1 -> qsd3", || file.clone());
        let last = stamp::check(&mut vm2, 3);
        stamp::assert_image_matches(&file, &last, "at the end");
        stamp::done(&mut vm2);
        eprintln!("qemu-storage-daemon chain: {:.1?} in all", t0.elapsed());
    }

    /// A vhost-user-blk controller with 2 queues on `dev`, the migration destination of the export
    /// `from` (`migrate_from`): a vhost controller's name or an NBD export's `nbd_device`.
    fn destination_controller(d: &Daemon, ctrlr: &str, dev: &str, from: &str) -> PathBuf {
        d.call(
            "vhost_create_blk_controller",
            json!({"ctrlr": ctrlr, "dev_name": dev, "num_queues": 2, "migrate_from": from}),
        );
        d.dir.path().join(ctrlr)
    }

    /// The controller's write count (`flashpath_get_stats`), after asserting it counted no
    /// error, unsupported request or failed queue.
    fn writes_without_errors(d: &Daemon, ctrlr: &str) -> u64 {
        let all = d.call("flashpath_get_stats", serde_json::Value::Null);
        let stats = all["controllers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["ctrlr"] == json!(ctrlr)))
            .map(|c| c["stats"].clone())
            .unwrap_or_else(|| panic!("no stats for {ctrlr}: {all}"));
        let n = |k: &str| stats[k].as_u64().unwrap_or_else(|| panic!("no counter {k} in {stats}"));
        for k in ["io_errors", "unsupported", "failed_queues"] {
            assert_eq!(n(k), 0, "{ctrlr}: {k} in {stats}");
        }
        n("write_ops")
    }

    /// Waits (120 s at most: the guest runs under TCG on a busy machine) until the migrated
    /// guest's writers have written through the destination controller `ctrlr`, so that the
    /// check after it covers writes made there rather than a fixed time that may pass without any.
    fn wait_written_through(d: &Daemon, ctrlr: &str, what: &str) {
        let t0 = Instant::now();
        while writes_without_errors(d, ctrlr) == 0 {
            assert!(t0.elapsed() < Duration::from_secs(120), "{what} wrote nothing through {ctrlr} in 120 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{what} writing through {ctrlr} {:.2?} after the switch-over", t0.elapsed());
    }

    /// Waits until the mirror job `job` is `ready` (copied, every new write mirrored) and returns
    /// how long it took; panics if it fails or is cancelled.
    fn wait_mirror_ready(d: &Daemon, job: &str) -> Duration {
        let t0 = Instant::now();
        loop {
            let jobs = d.call("bdev_mirror_get_jobs", json!({"job_id": job}));
            let j = &jobs[0];
            match j["state"].as_str() {
                Some("ready") => {
                    eprintln!("mirror {job}: ready after {:.2?}: {j}", t0.elapsed());
                    return t0.elapsed();
                }
                Some("running") => {}
                _ => panic!("mirror {job} is not running on to ready: {jobs}"),
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "mirror {job} not ready after 120 s: {j}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The chain on flashpath, one guest boot (see the file's documentation): rollback, then cases
    /// (a), (b) and (d). After each step the guest re-reads every block and the host checks the
    /// file that holds the disk: the shared file through (b), the destination daemon's own file
    /// after (d).
    #[test]
    fn guest_migrates_within_a_daemon_between_daemons_on_one_file_and_without_shared_storage() {
        let Some(_one) = one_at_a_time() else { return };
        let t0 = Instant::now();
        let d1 = Daemon::start("0");
        let d2 = Daemon::start("1");
        let d3 = Daemon::start("0");
        let dir = d1.dir.path();
        let shared = disk_file(dir, "shared.img");
        d1.uring("disk", &shared, None);
        let serial = "vm-a";
        let sock_a = d1.controller("vm-a", "disk", Some(2), false);
        let mut vm1 = Vm::boot(&vm_config("vm1", sock_a, serial, false), dir);
        stamp::wait_writing(&mut vm1, 0);
        eprintln!("VM1 writing {:.1?} after the start", t0.elapsed());

        // Rollback: a slow migration to a second controller on the disk, cancelled while active;
        // VM1 runs on, its disk intact, and the controller serves the real migration next.
        let sock_a2 = destination_controller(&d1, "vm-a2", "disk", "vm-a");
        let mut vmx = Vm::boot(&vm_config("vm-cancelled", sock_a2.clone(), serial, true), dir);
        std::thread::sleep(WRITE_PHASE);
        let slow = MigrationOpts { max_bandwidth: Some(16 * MIB), ..MigrationOpts::default() };
        let m = Migration::start(&mut vm1, &mut vmx, dir, "cancelled", &slow);
        m.wait(&mut vm1, &["active"]);
        std::thread::sleep(Duration::from_millis(500));
        m.cancel(&mut vm1, &mut vmx);
        check_and_resume(&mut vm1, 1, "after the cancelled migration", || shared.clone());
        assert_eq!(writes_without_errors(&d1, "vm-a2"), 0, "the cancelled destination controller wrote");

        // (a) One daemon, two controllers on one disk.
        let mut vm2 = Vm::boot(&vm_config("vm2", sock_a2, serial, true), dir);
        std::thread::sleep(WRITE_PHASE);
        Migration::start(&mut vm1, &mut vm2, dir, "a-one-daemon", &MigrationOpts::default())
            .complete(&mut vm1, &mut vm2);
        // The hand-off rule: the source VM started again by mistake (`cont`) must not get its
        // rings back while the destination's run.
        vm1.qmp().run("cont", json!({}));
        let until = Instant::now() + Duration::from_secs(10);
        let refusal = "not started: the disk is served by controller 'vm-a2'";
        while !d1.stderr().contains(refusal) {
            assert!(Instant::now() < until, "daemon 1 did not refuse vm-a's rings after `cont` on VM1");
            std::thread::sleep(Duration::from_millis(50));
        }
        migrate::quit(&mut vm1);
        wait_written_through(&d1, "vm-a2", "VM2");
        check_and_resume(&mut vm2, 2, "after (a), one daemon", || shared.clone());
        assert!(writes_without_errors(&d1, "vm-a") > 0);
        d1.call("vhost_delete_controller", json!({"ctrlr": "vm-a"}));

        // (b) Two daemons on one file.
        d2.uring("disk", &shared, None);
        let sock_b = d2.controller("vm-b", "disk", Some(2), false);
        let mut vm3 = Vm::boot(&vm_config("vm3", sock_b, serial, true), dir);
        std::thread::sleep(WRITE_PHASE);
        Migration::start(&mut vm2, &mut vm3, dir, "b-two-daemons-one-file", &MigrationOpts::default())
            .finish(&mut vm2, &mut vm3);
        wait_written_through(&d2, "vm-b", "VM3");
        check_and_resume(&mut vm3, 3, "after (b), two daemons on one file", || shared.clone());
        writes_without_errors(&d1, "vm-a2");
        d1.call("vhost_delete_controller", json!({"ctrlr": "vm-a2"}));
        d1.call("bdev_uring_delete", json!({"name": "disk"}));

        // (d) Two daemons without shared storage: d3 has a file of its own, exported over NBD and
        // given to the controller VM4 will use; d2 mirrors its disk there while VM3 writes. Writes
        // blocking from the start, as the recipe in docs/migration.md says: VM3's writers never
        // pause, and in the background mode the copy (guest first) would not catch up with them.
        let own = disk_file(d3.dir.path(), "own.img");
        d3.uring("disk", &own, None);
        let nbd = d3.dir.path().join("disk.nbd");
        let nbd = nbd.to_str().expect("a UTF-8 path");
        d3.call("nbd_start_disk", json!({"bdev_name": "disk", "nbd_device": nbd}));
        let sock_d = destination_controller(&d3, "vm-d", "disk", nbd);
        d2.call("bdev_nbd_client_create", json!({"name": "remote", "address": nbd}));
        let job = d2.call(
            "bdev_mirror_start",
            json!({"source": "disk", "target": "remote", "copy_mode": "write-blocking"}),
        );
        let job = job
            .as_str()
            .unwrap_or_else(|| panic!("bdev_mirror_start returned {job}, not a job id"))
            .to_string();
        let copy_time = wait_mirror_ready(&d2, &job);
        let mut vm4 = Vm::boot(&vm_config("vm4", sock_d, serial, true), dir);
        let hold = MigrationOpts { pause_before_switchover: true, ..MigrationOpts::default() };
        let m = Migration::start(&mut vm3, &mut vm4, dir, "d-mirror", &hold);
        m.wait(&mut vm3, &["pre-switchover"]);
        let t = Instant::now();
        d2.call("bdev_mirror_complete", json!({"job_id": job}));
        eprintln!(
            "mirror {job}: copied in {copy_time:.2?}, completed at pre-switchover in {:.2?}",
            t.elapsed()
        );
        m.continue_switchover(&mut vm3);
        m.finish(&mut vm3, &mut vm4);
        let jobs = d2.call("bdev_mirror_get_jobs", json!({"job_id": job}));
        assert_eq!(jobs[0]["state"], "completed", "the mirror job after bdev_mirror_complete: {jobs}");
        d2.call("bdev_nbd_client_delete", json!({"name": "remote"}));
        wait_written_through(&d3, "vm-d", "VM4");
        let checks =
            check_and_resume(&mut vm4, 4, "after (d), the destination daemon's own file", || own.clone());
        assert!(checks.iter().all(|c| c.written > 0), "the guest wrote nothing: {checks:?}");
        writes_without_errors(&d2, "vm-b");

        let last = stamp::check(&mut vm4, 5);
        stamp::assert_image_matches(&own, &last, "at the end");
        stamp::done(&mut vm4);
        eprintln!("flashpath chain: {:.1?} in all", t0.elapsed());
    }
}
