//! A real Linux guest on flashpath disks: QEMU (TCG) boots Debian's cloud kernel with a
//! busybox initramfs (tests/guest/, docs/guest-tests.md) whose disks are vhost-user-blk
//! sockets of a `flashpath serve` started from a configuration file. Each test runs one guest
//! scenario (`fp.scenario=` in tests/guest/init), asserts the guest's PASS line and then checks
//! the disks from the host: the backing files byte for byte, the file system with e2fsck and
//! debugfs, a RAM disk through libblkio, and the daemon's counters.
//!
//! The tests run one at a time (a lock; `./run test` also runs this binary alone, after the
//! others, with one test thread): the guest's two vCPUs and the daemon fill a 2-core machine.
//! Without QEMU they fail under `CI=true` and are skipped elsewhere.

mod common;

mod guest_vm {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::{Mutex, MutexGuard};

    use serde_json::{json, Value};

    use super::common::ceph::CephCluster;
    use super::common::guest::ext4::{assert_e2fsck_clean, debugfs, debugfs_cat, e2fs_tool};
    use super::common::guest::{
        self, expected_contents, run_scenario, DiskOp, GuestResult, Vm, VmConfig, BOOT_TIMEOUT, EXIT_TIMEOUT,
    };
    use super::common::{assert_same, bounded, pattern, BlkClient, ClientOpts, Daemon};

    const MIB: u64 = 1 << 20;

    /// One guest at a time, whatever the test runner's thread count.
    fn one_at_a_time() -> Option<MutexGuard<'static, ()>> {
        static LOCK: Mutex<()> = Mutex::new(());
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        guest::available().then_some(guard)
    }

    /// A sparse file of `size` bytes in `dir` (reads as zeroes).
    fn sparse_file(dir: &Path, name: &str, size: u64) -> PathBuf {
        let path = dir.join(name);
        std::fs::File::create(&path).and_then(|f| f.set_len(size)).expect("creating a backing file");
        path
    }

    /// `[[bdev]]` of an io_uring file disk and a `[[vhost_blk]]` on it with `num_queues`, or
    /// without it (the daemon's default) when `None`.
    fn file_disk_config(
        bdev: &str,
        file: &Path,
        ctrlr: &str,
        readonly: bool,
        num_queues: Option<u16>,
    ) -> String {
        let queues = num_queues.map(|n| format!("num_queues = {n}\n")).unwrap_or_default();
        format!(
            "[[bdev]]\ntype = \"uring\"\nname = \"{bdev}\"\nfilename = \"{}\"\n\n\
             [[vhost_blk]]\nctrlr = \"{ctrlr}\"\ndev_name = \"{bdev}\"\n{queues}readonly = {readonly}\n\n",
            file.display()
        )
    }

    /// How the guest's device is set up.
    #[derive(Debug, Clone, Copy)]
    struct Device {
        /// Both the controller's `num_queues` and the device's `num-queues`; `None` leaves both
        /// out, so QEMU asks for one queue per vCPU (2) and the daemon offers its default.
        queues: Option<u16>,
        /// `packed=on` on the device: QEMU negotiates VIRTIO_F_RING_PACKED.
        packed: bool,
    }

    /// Two queues, split rings: what most tests use.
    const TWO_SPLIT: Device = Device { queues: Some(2), packed: false };
    /// Two queues, packed rings.
    const TWO_PACKED: Device = Device { queues: Some(2), packed: true };

    /// Boots `scenario` on one io_uring file disk of `size` bytes, exported as the controller
    /// `ctrlr` by a daemon on `cpus` started from a configuration file, asserts PASS and that
    /// the guest saw the disk as exported (size, 512-byte blocks, 2 queues, read-only flag) on
    /// the ring layout `dev` asks for. The backing file holds `initial` and then zeroes
    /// (sparse). Returns the daemon, the backing file and the guest's result.
    fn guest_on_file_disk(
        scenario: &str,
        cpus: &str,
        ctrlr: &str,
        size: u64,
        readonly: bool,
        initial: &[u8],
        dev: Device,
    ) -> (Daemon, PathBuf, GuestResult) {
        let d = Daemon::start_with_config(cpus, |dir| {
            let file = dir.join(format!("{ctrlr}.img"));
            std::fs::write(&file, initial)
                .and_then(|_| std::fs::File::options().write(true).open(&file))
                .and_then(|f| f.set_len(size))
                .expect("filling the backing file");
            file_disk_config(ctrlr, &file, ctrlr, readonly, dev.queues)
        });
        let file = d.dir.path().join(format!("{ctrlr}.img"));
        let vm = VmConfig {
            num_queues: dev.queues,
            packed: dev.packed,
            ..VmConfig::new(scenario, vec![d.dir.path().join(ctrlr)])
        };
        let r = run_scenario(&vm, d.dir.path());
        assert_disk(&r, ctrlr, size, 512, readonly);
        assert_eq!(ring_packed(&r, ctrlr), dev.packed, "{ctrlr}: VIRTIO_F_RING_PACKED negotiated ({dev:?})");
        (d, file, r)
    }

    /// Whether the guest's driver negotiated VIRTIO_F_RING_PACKED (bit 34) for the disk, from
    /// the `features` string of its `disk` line (sysfs: one 0/1 character per bit from bit 0).
    fn ring_packed(r: &GuestResult, serial: &str) -> bool {
        let f = r.disk(serial)["features"].clone();
        // VIRTIO_F_VERSION_1 (bit 32) is always negotiated: a check that the bits are in order.
        assert_eq!(f.as_bytes().get(32), Some(&b'1'), "{serial}: features={f}, without VERSION_1");
        match f.as_bytes().get(34) {
            Some(b'1') => true,
            Some(b'0') => false,
            _ => panic!("{serial}: features={f} has no bit 34"),
        }
    }

    /// The daemon's counters for one controller.
    fn stats(d: &Daemon, ctrlr: &str) -> Value {
        let all = d.call("flashpath_get_stats", Value::Null);
        all["controllers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["ctrlr"] == json!(ctrlr)))
            .map(|c| c["stats"].clone())
            .unwrap_or_else(|| panic!("no stats for {ctrlr}: {all}"))
    }

    fn counter(stats: &Value, name: &str) -> u64 {
        stats[name].as_u64().unwrap_or_else(|| panic!("no counter {name} in {stats}"))
    }

    /// No request failed and no queue broke.
    fn assert_no_errors(stats: &Value) {
        for name in ["io_errors", "unsupported", "failed_queues"] {
            assert_eq!(counter(stats, name), 0, "{name} in {stats}");
        }
    }

    /// The guest saw the disk as the daemon exports it.
    fn assert_disk(r: &GuestResult, serial: &str, size: u64, lbs: u32, ro: bool) {
        let d = r.disk(serial);
        assert_eq!(d["size"], size.to_string(), "{serial}: size in the guest ({d:?})");
        assert_eq!(d["lbs"], lbs.to_string(), "{serial}: logical block size in the guest ({d:?})");
        assert_eq!(d["ro"], if ro { "1" } else { "0" }, "{serial}: read-only flag in the guest ({d:?})");
        assert_eq!(d["hw_queues"], "2", "{serial}: blk-mq hardware queues in the guest ({d:?})");
    }

    /// Every request queue of the guest's disks raised interrupts, i.e. carried completions.
    fn assert_all_queues_used(r: &GuestResult, devices: usize) {
        let irqs = r.irqs();
        assert_eq!(irqs.len(), 2 * devices, "one interrupt line per request queue: {irqs:?}");
        for (q, n) in &irqs {
            assert!(*n > 0, "request queue {q} had no interrupt (all I/O on one queue?): {irqs:?}");
        }
    }

    /// The host-side checks of the `data` scenario on a disk of `size` bytes backed by `file`.
    fn check_data_scenario(d: &Daemon, file: &Path, r: &GuestResult, size: u64) {
        let disk = r.disk("fp-data");
        assert_eq!(disk["cache"], "write_back", "the device offers FLUSH, so the guest caches writes");
        assert_ne!(disk["discard_max"], "0", "the device offers discard");
        assert_ne!(disk["write_zeroes_max"], "0", "the device offers write-zeroes");
        assert_all_queues_used(r, 1);

        // Replay what the guest reports having done and compare the whole file.
        let ops = r.ops("fp-data");
        let writes = ops.iter().filter(|o| matches!(o, DiskOp::Write { .. })).count();
        let zeroes = ops.iter().filter(|o| matches!(o, DiskOp::Zero { .. })).count();
        assert!(writes >= 10 && zeroes >= 2, "fewer ops than the scenario does: {ops:?}");
        assert!(
            ops.iter().any(|o| matches!(o, DiskOp::Write { offset, len, .. } if offset + len == size)),
            "no write reached the last block: {ops:?}"
        );
        let got = std::fs::read(file).expect("reading the backing file");
        assert_same("the backing file after the guest", 0, &got, &expected_contents(size, &ops));

        let s = stats(d, "fp-data");
        assert_no_errors(&s);
        for name in ["flush_ops", "discard_ops", "write_zeroes_ops", "write_ops", "read_ops"] {
            assert!(counter(&s, name) > 0, "{name} = 0: {s}");
        }
    }

    /// The `data` scenario on a 64 MiB disk served from reactor 0, and its host-side checks.
    fn data_on_one_reactor(dev: Device) {
        let size = 64 * MIB;
        let (d, file, r) = guest_on_file_disk("data", "0", "fp-data", size, false, &[], dev);
        check_data_scenario(&d, &file, &r, size);
    }

    #[test]
    fn data_written_in_the_guest_is_in_the_backing_file() {
        let Some(_one) = one_at_a_time() else { return };
        data_on_one_reactor(TWO_SPLIT);
    }

    /// The `data` scenario with `packed=on` on the device: the guest drives both queues as
    /// packed virtqueues (VIRTIO_F_RING_PACKED, checked in the guest's sysfs), with the same
    /// host-side checks as on split rings.
    #[test]
    fn data_written_through_packed_virtqueues_is_in_the_backing_file() {
        let Some(_one) = one_at_a_time() else { return };
        data_on_one_reactor(TWO_PACKED);
    }

    /// QEMU's default device line: no `num-queues`, so QEMU asks for one queue per vCPU (2),
    /// from a controller created without `num_queues` on a daemon with one reactor. The daemon
    /// must offer enough queues for QEMU to start, and both queues work on that one reactor.
    #[test]
    fn the_default_device_line_gets_a_queue_per_vcpu_from_one_reactor() {
        let Some(_one) = one_at_a_time() else { return };
        let size = 64 * MIB;
        let (d, file, r) = guest_on_file_disk(
            "data",
            "0",
            "fp-data",
            size,
            false,
            &[],
            Device { queues: None, packed: false },
        );
        // assert_disk saw 2 blk-mq queues in the guest; the daemon offered all it may.
        let ctrl = d.call("vhost_get_controllers", json!({"name": "fp-data"}));
        assert_eq!(ctrl[0]["num_queues"], 64, "{ctrl}");
        assert_eq!(ctrl[0]["cores"], json!([0]), "{ctrl}");
        check_data_scenario(&d, &file, &r, size);
        let log = d.stderr();
        for q in 0..2 {
            assert!(log.contains(&format!("fp-data queue {q}: started on reactor 0")), "queue {q}:\n{log}");
        }
        assert!(!log.contains("fp-data queue 2:"), "QEMU started a third queue:\n{log}");
    }

    #[test]
    fn ext4_made_in_the_guest_checks_clean_on_the_host() {
        let Some(_one) = one_at_a_time() else { return };
        let (d, img, _) = guest_on_file_disk("filesystem", "0", "fp-fs", 64 * MIB, false, &[], TWO_SPLIT);
        check_filesystem_scenario(&d, &img);
    }

    /// The host-side checks of the `filesystem` scenario: `img` (the disk's contents, written
    /// after QEMU exited) is a clean ext4 holding what the guest wrote, and the controller
    /// `fp-fs` counted flushes and discards and no error.
    fn check_filesystem_scenario(d: &Daemon, img: &Path) {
        // The guest has unmounted it and QEMU is gone: the file is a quiescent ext4 image.
        assert_e2fsck_clean("the file system made in the guest", img);
        let p = debugfs_cat(img, "/fp/pattern.bin");
        assert_same("/fp/pattern.bin (page cache)", 0, &p, &pattern(42, 0, 3 << 20));
        let p = debugfs_cat(img, "/fp/direct.bin");
        assert_same("/fp/direct.bin (O_DIRECT)", 0, &p, &pattern(43, 0, 1 << 20));
        assert_eq!(debugfs_cat(img, "/fp/hello.txt"), b"hello from the flashpath guest\n");
        assert_eq!(debugfs_cat(img, "/fp/small/f123"), b"small file 123\n");
        let ls =
            Command::new(e2fs_tool("debugfs")).args(["-R", "ls -p /fp/small"]).arg(img).output().unwrap();
        let files = String::from_utf8_lossy(&ls.stdout).lines().filter(|l| l.contains("/f")).count();
        assert_eq!(files, 200, "files in /fp/small");

        let s = stats(d, "fp-fs");
        assert_no_errors(&s);
        // The journal commits with flushes; mke2fs discards the device first.
        assert!(counter(&s, "flush_ops") > 0, "no flush: {s}");
        assert!(counter(&s, "discard_ops") > 0, "mke2fs sent no discard: {s}");
    }

    /// The `load` scenario (fio randrw with verify) on two queues, served from reactors 0 and
    /// 1, and its host-side checks.
    fn fio_on_two_queues(dev: Device) {
        let (d, _, r) = guest_on_file_disk("load", "0,1", "fp-load", 64 * MIB, false, &[], dev);
        check_load_scenario(&d, &r);
    }

    /// The host-side checks of the `load` scenario on the controller `fp-load`.
    fn check_load_scenario(d: &Daemon, r: &GuestResult) {
        let fio = r.info_after("fio").join(" ");
        assert!(fio.contains("status=0") && fio.contains("errors=0"), "fio: {fio}");
        assert_all_queues_used(r, 1);
        let s = stats(d, "fp-load");
        assert_no_errors(&s);
        assert!(counter(&s, "write_ops") > 1000 && counter(&s, "read_ops") > 1000, "too little I/O: {s}");
    }

    #[test]
    fn fio_randrw_with_verify_on_two_queues() {
        let Some(_one) = one_at_a_time() else { return };
        fio_on_two_queues(TWO_SPLIT);
    }

    #[test]
    fn fio_randrw_with_verify_on_two_packed_queues() {
        let Some(_one) = one_at_a_time() else { return };
        fio_on_two_queues(TWO_PACKED);
    }

    /// Issue 13's guest test: a disk on an RBD image of a real cluster (common/ceph.rs),
    /// declared in the configuration file (`[[rbd_cluster]]`, `[[bdev]] type = "rbd"`). The
    /// guest first runs fio randrw with crc32c verify on both queues over the raw disk (the
    /// `load` scenario), then, on a new controller over the same disk, makes an ext4 file
    /// system, writes files through the page cache and with O_DIRECT, unmounts, mounts again
    /// and checks them (`filesystem`). The host then reads the image back with `rbd export`,
    /// outside flashpath, and checks the file system and every file in it.
    #[test]
    fn guest_on_an_rbd_image_runs_fio_verify_and_keeps_its_ext4() {
        let Some(_one) = one_at_a_time() else { return };
        let Some(ceph) = CephCluster::start() else { return };
        // The file disks' size: at 32 MiB fio writes too little for check_load_scenario.
        let size = 64 * MIB;
        ceph.create_image("guest", size / MIB);
        let conf = ceph.conf().display().to_string();
        let d = Daemon::start_with_config("0,1", |_| {
            format!(
                "[[rbd_cluster]]\nname = \"ceph\"\nconfig_file = \"{conf}\"\n\n\
                 [[bdev]]\ntype = \"rbd\"\nname = \"rbd0\"\npool_name = \"rbd\"\nrbd_name = \"guest\"\n\
                 cluster_name = \"ceph\"\n\n\
                 [[vhost_blk]]\nctrlr = \"fp-load\"\ndev_name = \"rbd0\"\nnum_queues = 2\n"
            )
        });
        let t0 = std::time::Instant::now();
        let r = run_scenario(&VmConfig::new("load", vec![d.dir.path().join("fp-load")]), d.dir.path());
        assert_disk(&r, "fp-load", size, 512, false);
        check_load_scenario(&d, &r);

        // The guests find their disk by serial, the controller's name: the same disk again
        // under the name the `filesystem` scenario looks for.
        d.call("vhost_delete_controller", json!({"ctrlr": "fp-load"}));
        let sock = d.controller("fp-fs", "rbd0", Some(2), false);
        let r = run_scenario(&VmConfig::new("filesystem", vec![sock]), d.dir.path());
        assert_disk(&r, "fp-fs", size, 512, false);
        eprintln!("both guests on the rbd disk took {:.1?}", t0.elapsed());

        let img = d.dir.path().join("guest.img");
        ceph.rbd(&["export", "rbd/guest", img.to_str().expect("a UTF-8 path")]);
        assert_eq!(std::fs::metadata(&img).map(|m| m.len()).ok(), Some(size), "the exported image's size");
        check_filesystem_scenario(&d, &img);
    }

    #[test]
    fn readonly_disk_reads_in_the_guest_and_refuses_writes() {
        let Some(_one) = one_at_a_time() else { return };
        let size = 16 * MIB;
        let initial = pattern(77, 0, 4 << 20);
        let (d, file, r) = guest_on_file_disk("readonly", "0", "fp-ro", size, true, &initial, TWO_SPLIT);
        let mut before = initial;
        before.resize(size as usize, 0);
        // Linux refuses writes to a disk whose device offers VIRTIO_BLK_F_RO before they reach
        // the device (EPERM), so the daemon must have seen reads only.
        for what in ["direct write", "buffered write"] {
            let refusal = r.info_after(what).join(" ");
            assert!(refusal.starts_with("refused at"), "{what} in the guest: {refusal:?}");
        }
        let disk = r.disk("fp-ro");
        assert_eq!(disk["discard_max"], "0", "a read-only disk offers no discard");
        assert_eq!(disk["write_zeroes_max"], "0", "a read-only disk offers no write-zeroes");
        let s = stats(&d, "fp-ro");
        assert_no_errors(&s);
        assert!(counter(&s, "read_ops") > 0, "no reads: {s}");
        for name in ["write_ops", "discard_ops", "write_zeroes_ops", "bytes_written"] {
            assert_eq!(counter(&s, name), 0, "{name} on a read-only disk: {s}");
        }
        assert!(std::fs::read(&file).unwrap() == before, "the read-only disk's backing file changed");
    }

    #[test]
    fn two_disks_ram_and_file_from_one_daemon() {
        let Some(_one) = one_at_a_time() else { return };
        let (ram_size, file_size) = (32 * MIB, 48 * MIB);
        let d = Daemon::start_with_config("0,1", |dir| {
            let file = sparse_file(dir, "fp-file.img", file_size);
            format!(
                "[[bdev]]\ntype = \"malloc\"\nname = \"ram\"\nnum_blocks = {}\nblock_size = 4096\n\n\
                 [[vhost_blk]]\nctrlr = \"fp-ram\"\ndev_name = \"ram\"\nnum_queues = 2\n\n{}",
                ram_size / 4096,
                file_disk_config("file", &file, "fp-file", false, Some(2))
            )
        });
        let ram_sock = d.dir.path().join("fp-ram");
        let cfg = VmConfig::new("multi", vec![ram_sock.clone(), d.dir.path().join("fp-file")]);
        let r = run_scenario(&cfg, d.dir.path());
        assert_disk(&r, "fp-ram", ram_size, 4096, false);
        assert_disk(&r, "fp-file", file_size, 512, false);
        assert_all_queues_used(&r, 2);

        let file_ops = r.ops("fp-file");
        assert!(file_ops.len() >= 2, "file disk ops: {file_ops:?}");
        let got = std::fs::read(d.dir.path().join("fp-file.img")).unwrap();
        assert_same("the file disk's backing file", 0, &got, &expected_contents(file_size, &file_ops));

        // QEMU has disconnected; read the RAM disk back through the same socket with libblkio.
        let ram_ops = r.ops("fp-ram");
        assert!(ram_ops.len() >= 2, "RAM disk ops: {ram_ops:?}");
        let got = bounded(std::time::Duration::from_secs(60), "RAM read-back", move || {
            BlkClient::open(&ram_sock, 1).read_all(0, ram_size as usize)
        });
        assert_same(
            "the RAM disk read back through libblkio",
            0,
            &got,
            &expected_contents(ram_size, &ram_ops),
        );

        for c in ["fp-ram", "fp-file"] {
            let s = stats(&d, c);
            assert_no_errors(&s);
            assert!(counter(&s, "write_ops") > 0, "{c}: {s}");
        }
    }

    /// Size of the file behind the 512-byte crypto pair (`fp-enc`, `fp-raw`).
    const CRYPTO_SIZE: u64 = 32 * MIB;
    /// Size of the file behind the 4096-byte pair (`fp-enc4k`, `fp-raw4k`).
    const CRYPTO4K_SIZE: u64 = 8 * MIB;
    /// Size of the RAM disk under the error bdev `EE_m` (`fp-err`).
    const ERR_SIZE: u64 = 16 * MIB;
    /// Write failures injected before the boot.
    const WRITE_FAILURES: u64 = 3;
    /// The 4 KiB writes the guest makes to the error disk (`crypto` in tests/guest/init).
    const GUEST_ERROR_WRITES: u64 = 5;
    /// Read failures injected while the guest waits: more than it will consume, so the clear
    /// (not the count running out) is what ends them.
    const READ_FAILURES: u64 = 100;
    /// The reads the guest tries while the read injection holds.
    const GUEST_FAILED_READS: u64 = 2;

    /// The text files the `crypto` scenario writes (tests/guest/init): plaintext that must not
    /// reach the backing file.
    const CRYPTO_MARKERS: [&str; 2] =
        ["FLASHPATH-PLAINTEXT-MARKER-ext4-via-crypto-bdev", "FLASHPATH-PLAINTEXT-MARKER-ext4-via-dm-crypt"];

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Creates `path` with mode 0600 (key material is never readable by others, even briefly).
    fn write_owner_only(path: &Path, bytes: &[u8]) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| f.write_all(bytes))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// The first 16 bytes of each 512-byte sector of `data`: with the pattern's words naming
    /// their position, a sector of plaintext stored anywhere in a disk sector shows as one of
    /// these, and 16 bytes of ciphertext match one by chance with probability 2^-128.
    fn sector_heads(data: &[u8]) -> std::collections::HashSet<[u8; 16]> {
        data.chunks(512).map(|s| s[..16].try_into().expect("16 bytes")).collect()
    }

    /// The sectors of `disk` that start as a sector of `plaintext` does (see [`sector_heads`]).
    fn plaintext_sectors(disk: &[u8], plaintext: &[Vec<u8>]) -> usize {
        let heads: std::collections::HashSet<[u8; 16]> =
            plaintext.iter().flat_map(|p| sector_heads(p)).collect();
        disk.chunks(512).filter(|s| heads.contains(&s[..16])).count()
    }

    /// The `injections.<io_type>` left on the error bdev `name`, as `num` (0 when none is
    /// listed).
    fn injection_left(d: &Daemon, name: &str, io_type: &str) -> u64 {
        let b = d.call("bdev_get_bdevs", json!({"name": name}));
        let inj = &b[0]["driver_specific"]["error"]["injections"][io_type];
        if inj.is_null() {
            0
        } else {
            inj["num"].as_u64().unwrap_or_else(|| panic!("{name}: injections.{io_type} without num: {b}"))
        }
    }

    /// `bdev_get_iostat`'s `io_error` count of `EIO` for `name`.
    fn iostat_eio(d: &Daemon, name: &str) -> u64 {
        let v = d.call("bdev_get_iostat", json!({"name": name}));
        let errors = &v["bdevs"][0]["io_error"];
        assert!(errors.is_object(), "{name}: no io_error in {v}");
        errors.get("EIO").map_or(0, |n| n.as_u64().expect("a count"))
    }

    /// The `luks` scenario's files (tests/guest/init).
    const LUKS_SIZE: u64 = 48 * MIB;
    const LUKS_MARKERS: [&str; 2] = [
        "FLASHPATH-PLAINTEXT-MARKER-ext4-via-luks-bdev",
        "FLASHPATH-PLAINTEXT-MARKER-ext4-via-cryptsetup-luks",
    ];

    /// LUKS2 both ways with Linux's own tools, one boot (`luks` in tests/guest/init). The host
    /// formats file A as LUKS2 over RPC, opens it as a crypto bdev, adds key slot 1 and adds
    /// then removes slot 2; the guest makes ext4 on that disk, and cryptsetup/dm-crypt in the
    /// guest open the raw volume with slot 0 and slot 1 (e2fsck -fn clean, files intact) and
    /// refuse the removed slot's passphrase. The host then re-encrypts the disk online to a new
    /// key, held part way while the guest writes files and running while it writes more; the
    /// guest finds every file, and dm-crypt opens the re-encrypted volume with the same
    /// passphrase (the new key): ext4 clean, the files intact. The guest then formats file B with `cryptsetup
    /// luksFormat` and writes ext4 through dm-crypt; after the boot flashpath opens B and the
    /// host finds that file system clean with the guest's files in it. No plaintext in A or B.
    #[test]
    fn luks_volumes_open_both_ways_with_cryptsetup_and_dm_crypt() {
        let Some(_one) = one_at_a_time() else { return };
        let files = tempfile::Builder::new().prefix("fp-luks-").tempdir_in("/var/tmp").expect("a directory");
        let dir = files.path();
        let a = sparse_file(dir, "a.img", LUKS_SIZE);
        let b = sparse_file(dir, "b.img", LUKS_SIZE);
        let passes = ["pass zero", "pass one", "pass two"];
        let pass_files: Vec<PathBuf> = passes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let f = dir.join(format!("pass{i}"));
                write_owner_only(&f, p.as_bytes());
                f
            })
            .collect();
        let mut config = String::new();
        for (i, f) in pass_files.iter().enumerate() {
            config
                .push_str(&format!("[[keyring_file_key]]\nname = \"k{i}\"\npath = \"{}\"\n\n", f.display()));
        }
        config.push_str(&format!(
            "[[bdev]]\ntype = \"uring\"\nname = \"a-enc\"\nfilename = \"{a}\"\n\n\
             [[bdev]]\ntype = \"uring\"\nname = \"a-raw\"\nfilename = \"{a}\"\n\n\
             [[bdev]]\ntype = \"uring\"\nname = \"b-raw\"\nfilename = \"{b}\"\n\n",
            a = a.display(),
            b = b.display()
        ));
        let config_path = dir.join("flashpath.toml");
        write_owner_only(&config_path, config.as_bytes());
        let d = Daemon::start_with_args("0", &["--config", config_path.to_str().expect("a UTF-8 path")]);
        let fast = json!({"pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000});
        let mut fmt = json!({"base_bdev_name": "a-enc", "key_name": "k0"});
        fmt.as_object_mut().unwrap().extend(fast.as_object().unwrap().clone());
        d.call("bdev_luks_format", fmt);
        d.call("bdev_crypto_create", json!({"base_bdev_name": "a-enc", "name": "l2", "luks_key_name": "k0"}));
        for k in ["k1", "k2"] {
            let mut p = json!({"name": "l2", "key_name": k});
            p.as_object_mut().unwrap().extend(fast.as_object().unwrap().clone());
            d.call("bdev_luks_add_keyslot", p);
        }
        d.call("bdev_luks_remove_keyslot", json!({"name": "l2", "key_slot": 2}));
        let exports = [("fp-l2", "l2"), ("fp-l2raw", "a-raw"), ("fp-cs", "b-raw")];
        for (ctrlr, bdev) in exports {
            d.call("vhost_create_blk_controller", json!({"ctrlr": ctrlr, "dev_name": bdev}));
        }

        let vm_cfg = VmConfig {
            console_input: true,
            extra_files: (0..3).map(|i| (pass_files[i].clone(), format!("/pass{i}"))).collect(),
            ..VmConfig::new("luks", exports.iter().map(|(c, _)| d.dir.path().join(c)).collect())
        };
        let mut vm = Vm::boot(&vm_cfg, d.dir.path());
        vm.wait_for("the guest's writer", |l| l.contains("luks reencrypt writer ready"), BOOT_TIMEOUT);
        let job = |d: &Daemon| d.call("bdev_luks_reencrypt_get", json!({"name": "l2"}))[0].clone();
        let mut start = json!({"name": "l2", "key_name": "k0", "speed_limit": 4});
        start.as_object_mut().unwrap().extend(fast.as_object().unwrap().clone());
        d.call("bdev_luks_reencrypt_start", start);
        // Held part way: the guest's first writes land on a disk of two keys.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while job(&d)["done_bytes"].as_u64().unwrap_or(0) < 2 * MIB {
            assert!(std::time::Instant::now() < deadline, "no progress: {}", job(&d));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        d.call("bdev_luks_reencrypt_pause", json!({"name": "l2"}));
        // The pause takes effect between two hotzones (after the one in hand, and any wait of
        // the speed limit): the guest writes once the job says so.
        while job(&d)["state"] != "paused" {
            assert!(std::time::Instant::now() < deadline, "never paused: {}", job(&d));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        vm.send_line("go");
        vm.wait_for("the held writes", |l| l.contains("luks reencrypt held writes done"), BOOT_TIMEOUT);
        let held = job(&d);
        assert_eq!(held["state"], "paused", "{held}");
        d.call("bdev_luks_reencrypt_resume", json!({"name": "l2"}));
        vm.send_line("go");
        vm.wait_for("the writes beside the job", |l| l.contains("luks reencrypt writes done"), BOOT_TIMEOUT);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        while job(&d)["state"] != "done" {
            assert!(job(&d)["state"] == "running", "{}", job(&d));
            assert!(std::time::Instant::now() < deadline, "the job did not finish: {}", job(&d));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        vm.send_line("go");
        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        let r = vm.whole_result(&r);
        assert_eq!(
            r.info_after("luks dm-crypt reads the re-encrypted volume").len(),
            1,
            "dm-crypt read the new key's volume"
        );
        assert_disk(&r, "fp-l2", LUKS_SIZE - 16 * MIB, 4096, false);
        assert_disk(&r, "fp-l2raw", LUKS_SIZE, 512, false);
        let dump = r.info_after("luks dump").join(" ");
        assert!(dump.contains("Version: 2"), "cryptsetup's luksDump of flashpath's volume: {dump}");
        assert_eq!(
            r.info_after("luks removed slot refused").len(),
            1,
            "the removed slot's passphrase opened nothing"
        );
        let lbs = r.info_after("luks dm-crypt reads flashpath's LUKS2 volume").join(" ");
        assert_eq!(lbs, "lbs=4096", "dm-crypt's mapping of flashpath's LUKS2 volume");

        // cryptsetup's volume through flashpath: its plaintext, read over vhost-user, is a
        // clean ext4 holding the guest's files.
        d.call("vhost_delete_controller", json!({"ctrlr": "fp-cs"}));
        d.call("bdev_crypto_create", json!({"base_bdev_name": "b-raw", "name": "cs", "luks_key_name": "k0"}))
            .as_str()
            .expect("a name");
        let h = d.call("bdev_luks_get_header", json!({"name": "cs"}));
        let size = h["data_size"].as_u64().expect("data_size");
        let sock = d.controller("fp-cs-open", "cs", Some(1), false);
        let mut c = BlkClient::open(&sock, 1);
        let plain = dir.join("cs-plain.img");
        let mut image = Vec::with_capacity(size as usize);
        let mut at = 0;
        while at < size {
            let n = (size - at).min(4 * MIB);
            image.extend(c.read_all(at, n as usize));
            at += n;
        }
        std::fs::write(&plain, &image).expect("writing the plaintext image");
        assert_e2fsck_clean("cryptsetup's LUKS2 volume read through flashpath", &plain);
        assert_eq!(debugfs_cat(&plain, "/fp/marker.txt"), format!("{}\n", LUKS_MARKERS[1]).into_bytes());
        assert_eq!(debugfs_cat(&plain, "/fp/pattern.bin"), pattern(62, 0, MIB as usize));

        // Neither file holds the guest's plaintext.
        for f in [&a, &b] {
            let img = std::fs::read(f).expect("reading a LUKS file");
            for m in LUKS_MARKERS {
                assert!(
                    !img.windows(m.len()).any(|w| w == m.as_bytes()),
                    "{m} in plaintext in {}",
                    f.display()
                );
            }
        }
    }

    /// Issue 27's guest test of the crypto and error bdevs, one boot (`crypto` in
    /// tests/guest/init). One daemon, started from a configuration file holding the key
    /// (`[[accel_crypto_key]]`, owner-only), exports two crypto bdevs and, as is, the uring bdevs
    /// on the same files under them (512- and 4096-byte blocks), and an error bdev over a RAM
    /// disk. In the guest, Linux's dm-crypt (`cryptsetup open --type plain --cipher
    /// aes-xts-plain64`, the same key) reads the ext4 the guest made on the crypto disk (e2fsck
    /// -fn clean, the files intact) and the crypto disk reads what dm-crypt wrote, on both
    /// block sizes; the host then finds no plaintext in the files. The error disk's first 3
    /// writes fail with EIO and the next succeed; reads fail with EIO while the host holds a
    /// read injection and succeed with the right data after it clears it; the daemon counted
    /// exactly those errors.
    #[test]
    fn crypto_disks_match_dm_crypt_and_injected_errors_reach_the_guest() {
        let Some(_one) = one_at_a_time() else { return };
        // The configuration holds a key, so it must be owner-only: written here, not by
        // Daemon::start_with_config.
        let files =
            tempfile::Builder::new().prefix("fp-crypto-").tempdir_in("/var/tmp").expect("a directory");
        let dir = files.path();
        let key = pattern(0xc0ff_ee27, 0, 64);
        assert_ne!(key[..32], key[32..], "XTS needs two different halves");
        let key_file = dir.join("crypto.key");
        write_owner_only(&key_file, &key);
        let f = sparse_file(dir, "crypto.img", CRYPTO_SIZE);
        let f4 = sparse_file(dir, "crypto4k.img", CRYPTO4K_SIZE);
        let mut config = format!(
            "[[accel_crypto_key]]\nname = \"k0\"\ncipher = \"AES_XTS\"\nkey = \"{}\"\nkey2 = \"{}\"\n\n\
             [[bdev]]\ntype = \"uring\"\nname = \"f-enc\"\nfilename = \"{f}\"\n\n\
             [[bdev]]\ntype = \"crypto\"\nname = \"enc\"\nbase_bdev_name = \"f-enc\"\nkey_name = \"k0\"\n\n\
             [[bdev]]\ntype = \"uring\"\nname = \"f-raw\"\nfilename = \"{f}\"\n\n\
             [[bdev]]\ntype = \"uring\"\nname = \"f4k-enc\"\nfilename = \"{f4}\"\nblock_size = 4096\n\n\
             [[bdev]]\ntype = \"crypto\"\nname = \"enc4k\"\nbase_bdev_name = \"f4k-enc\"\nkey_name = \"k0\"\n\n\
             [[bdev]]\ntype = \"uring\"\nname = \"f4k-raw\"\nfilename = \"{f4}\"\nblock_size = 4096\n\n\
             [[bdev]]\ntype = \"malloc\"\nname = \"m\"\nnum_blocks = {}\nblock_size = 512\n\n\
             [[bdev]]\ntype = \"error\"\nbase_name = \"m\"\n\n",
            hex(&key[..32]),
            hex(&key[32..]),
            ERR_SIZE / 512,
            f = f.display(),
            f4 = f4.display(),
        );
        let exports = [
            ("fp-enc", "enc"),
            ("fp-raw", "f-raw"),
            ("fp-enc4k", "enc4k"),
            ("fp-raw4k", "f4k-raw"),
            ("fp-err", "EE_m"),
        ];
        for (ctrlr, bdev) in exports {
            config.push_str(&format!(
                "[[vhost_blk]]\nctrlr = \"{ctrlr}\"\ndev_name = \"{bdev}\"\nnum_queues = 2\n\n"
            ));
        }
        let config_path = dir.join("flashpath.toml");
        write_owner_only(&config_path, config.as_bytes());
        let d = Daemon::start_with_args("0", &["--config", config_path.to_str().expect("a UTF-8 path")]);
        d.call(
            "bdev_error_inject_error",
            json!({"name": "EE_m", "io_type": "write", "error_type": "failure", "num": WRITE_FAILURES}),
        );

        let vm_cfg = VmConfig {
            console_input: true,
            extra_files: vec![(key_file.clone(), "/crypto.key".into())],
            ..VmConfig::new("crypto", exports.iter().map(|(c, _)| d.dir.path().join(c)).collect())
        };
        let mut vm = Vm::boot(&vm_cfg, d.dir.path());
        vm.wait_for("the guest's writes to the error disk", |l| l.contains("error read ready"), BOOT_TIMEOUT);
        let crypto_part = vm.elapsed();
        let t0 = std::time::Instant::now();
        assert_eq!(injection_left(&d, "EE_m", "write"), 0, "the guest's writes used up the write injection");
        d.call(
            "bdev_error_inject_error",
            json!({"name": "EE_m", "io_type": "read", "error_type": "failure", "num": READ_FAILURES}),
        );
        vm.send_line("go");
        vm.wait_for("the guest's failed reads", |l| l.contains("error read waiting for clear"), BOOT_TIMEOUT);
        // Exactly the guest's two reads took an injected failure: nothing else read the disk.
        assert_eq!(
            injection_left(&d, "EE_m", "read"),
            READ_FAILURES - GUEST_FAILED_READS,
            "reads failed so far"
        );
        let failed = WRITE_FAILURES + GUEST_FAILED_READS;
        assert_eq!(iostat_eio(&d, "EE_m"), failed, "EE_m's EIO count before the clear");
        assert_eq!(counter(&stats(&d, "fp-err"), "io_errors"), failed, "fp-err's io_errors before the clear");
        d.call(
            "bdev_error_inject_error",
            json!({"name": "EE_m", "io_type": "clear", "error_type": "failure"}),
        );
        assert_eq!(injection_left(&d, "EE_m", "read"), 0, "the clear ended the read injection");
        vm.send_line("go");
        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        eprintln!(
            "crypto scenario: boot, crypto and 4 KiB parts {crypto_part:.1?}; error reads to QEMU's exit {:.1?}",
            t0.elapsed()
        );
        let r = vm.whole_result(&r);

        assert_disk(&r, "fp-enc", CRYPTO_SIZE, 512, false);
        assert_disk(&r, "fp-raw", CRYPTO_SIZE, 512, false);
        assert_disk(&r, "fp-enc4k", CRYPTO4K_SIZE, 4096, false);
        assert_disk(&r, "fp-raw4k", CRYPTO4K_SIZE, 4096, false);
        assert_disk(&r, "fp-err", ERR_SIZE, 512, false);
        let mappings = r.info_after("crypto dm-crypt plain");
        assert!(
            mappings.iter().any(|l| l.contains("lbs=512") && l.contains(&format!("size={CRYPTO_SIZE}"))),
            "the 512-byte dm-crypt mapping: {mappings:?}"
        );
        assert!(
            mappings.iter().any(|l| l.starts_with("4k ") && l.contains("lbs=4096")),
            "the 4096-byte dm-crypt mapping: {mappings:?}"
        );

        // The guest saw the injected errors as EIO, exactly WRITE_FAILURES of its writes and
        // every read under the read injection; a failed write left the disk as it was.
        for i in 1..=GUEST_ERROR_WRITES {
            let fails = i <= WRITE_FAILURES;
            let status = r.info_after(&format!("error write {i} ")).join(" ");
            let want = if fails { "status=3 Input/output error" } else { "status=0" };
            assert!(status.starts_with(want), "write {i}: {status:?}, want {want:?}");
            let written = r.info_after(&format!("error written {i} ")).join(" ");
            assert_eq!(written, if fails { "zeroes" } else { "data" }, "what write {i} left");
        }
        for i in 1..=GUEST_FAILED_READS {
            let status = r.info_after(&format!("error read {i} ")).join(" ");
            assert!(status.starts_with("status=3 Input/output error"), "read {i}: {status:?}");
        }

        // The plaintext the guest wrote is nowhere in the files; its ciphertext is.
        // (Files start at file-system blocks, so each text file's first sector starts with its
        // marker.)
        let img = std::fs::read(&f).expect("reading the crypto disk's file");
        let mut plaintext: Vec<Vec<u8>> = CRYPTO_MARKERS.iter().map(|m| m.as_bytes().to_vec()).collect();
        plaintext.extend([pattern(71, 0, 2 << 20), pattern(72, 0, 1 << 20), pattern(73, 0, 1 << 20)]);
        let leaked = plaintext_sectors(&img, &plaintext);
        assert_eq!(leaked, 0, "sectors of the guest's files in plaintext in {}", f.display());
        let nonzero = img.iter().filter(|&&b| b != 0).count() as u64;
        assert!(nonzero > 4 * MIB, "only {nonzero} non-zero bytes: the guest's 4 MiB of files are not there");
        let img4 = std::fs::read(&f4).expect("reading the 4096-byte crypto disk's file");
        let writes4 = [(0, 262144usize, 81), (3 * MIB + 8192, 65536, 82), (2 * MIB, 131072, 83)];
        let plaintext4: Vec<Vec<u8>> =
            writes4.iter().map(|&(off, len, seed)| pattern(seed, off, len)).collect();
        let leaked = plaintext_sectors(&img4, &plaintext4);
        assert_eq!(leaked, 0, "sectors of the guest's writes in plaintext in {}", f4.display());
        for (off, len, seed) in writes4 {
            let stored = &img4[off as usize..off as usize + len];
            assert!(stored.iter().any(|&b| b != 0), "nothing stored at {off} for pattern {seed}");
        }

        for (ctrlr, _) in &exports[..4] {
            let s = stats(&d, ctrlr);
            assert_no_errors(&s);
            assert!(counter(&s, "write_ops") > 0 && counter(&s, "read_ops") > 0, "{ctrlr}: {s}");
        }
        // The error disk: the counts stayed at what was injected, and the data is whole
        // through another client after the guest.
        assert_eq!(iostat_eio(&d, "EE_m"), failed, "EE_m's EIO count at the end");
        let s = stats(&d, "fp-err");
        assert_eq!(counter(&s, "io_errors"), failed, "fp-err's io_errors at the end: {s}");
        let sock = d.dir.path().join("fp-err");
        let (first, second) =
            bounded(std::time::Duration::from_secs(60), "error disk read-back", move || {
                let mut c = BlkClient::open(&sock, 1);
                (c.read_all(MIB, MIB as usize), c.read_all(4 * MIB, MIB as usize))
            });
        assert_same("EE_m [1 MiB, 2 MiB) after the guest", MIB, &first, &pattern(95, MIB, MIB as usize));
        assert_same(
            "EE_m [4 MiB, 5 MiB) after the guest",
            4 * MIB,
            &second,
            &pattern(96, 4 * MIB, MIB as usize),
        );
    }

    /// Online resize: the file behind a running guest's disk grows, `bdev_uring_rescan` tells
    /// the daemon, and the guest's kernel sees the new capacity through the config-change
    /// notification (VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, then QEMU's config interrupt) without
    /// doing anything itself; writes across the old end and at the new end land in the file.
    #[test]
    fn a_grown_disk_reaches_the_running_guest() {
        let Some(_one) = one_at_a_time() else { return };
        let (size, grown) = (32 * MIB, 48 * MIB);
        let d = Daemon::start_with_config("0", |dir| {
            let file = sparse_file(dir, "fp-resize.img", size);
            file_disk_config("resize", &file, "fp-resize", false, Some(2))
        });
        let file = d.dir.path().join("fp-resize.img");
        let mut vm = Vm::boot(&VmConfig::new("resize", vec![d.dir.path().join("fp-resize")]), d.dir.path());
        vm.wait_for(
            "the guest's first write",
            |l| l.contains(&format!("resize waiting at {size}")),
            BOOT_TIMEOUT,
        );
        std::fs::File::options()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_len(grown))
            .expect("growing the file");
        assert_eq!(d.call("bdev_uring_rescan", json!({"name": "resize"})), json!(true));
        let bdev = d.call("bdev_get_bdevs", json!({"name": "resize"}));
        assert_eq!(bdev[0]["num_blocks"], grown / 512, "{bdev}");

        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        // The first write's line came before the one the test waited for: read the whole console.
        let console = vm.console();
        assert!(console.contains(&format!("resized to {grown}")), "the guest never saw {grown} bytes");
        let ops = vm.whole_result(&r).ops("fp-resize");
        assert_eq!(ops.len(), 3, "{ops:?}");
        let got = std::fs::read(&file).expect("reading the backing file");
        assert_same("the grown backing file", 0, &got, &expected_contents(grown, &ops));
        assert!(d.stderr().contains("resized"), "{}", d.stderr());
        assert_no_errors(&stats(&d, "fp-resize"));
    }

    /// Crash-safe restart: the daemon is killed with SIGKILL while the guest writes on both
    /// queues, started again with the same configuration, later stopped cleanly (SIGTERM, as an
    /// upgrade would) and started again. QEMU reconnects each time; requests in flight at the
    /// crash are resubmitted from the in-flight area. The guest must see no I/O error and no
    /// bad data, and every write it saw acknowledged must be in the backing file.
    #[test]
    fn daemon_killed_and_restarted_under_guest_io_loses_nothing() {
        killed_and_restarted_under_guest_io(false);
    }

    /// The same with `packed=on`: the packed layout of the in-flight area, requests resubmitted
    /// from their recorded descriptors (the guest may have reused the ring slots meanwhile).
    #[test]
    fn daemon_killed_and_restarted_under_guest_io_on_packed_rings_loses_nothing() {
        killed_and_restarted_under_guest_io(true);
    }

    fn killed_and_restarted_under_guest_io(packed: bool) {
        let Some(_one) = one_at_a_time() else { return };
        let size = 64 * MIB;
        // A delay bdev (50 ms per write) over the file keeps each guest writer's request in
        // flight nearly all the time, so the SIGKILL lands with requests the new daemon must
        // resubmit.
        let mut d = Daemon::start_with_config("0", |dir| {
            let file = sparse_file(dir, "fp-restart.img", size);
            format!(
                "[[bdev]]\ntype = \"uring\"\nname = \"restart-file\"\nfilename = \"{}\"\n\n\
                 [[bdev]]\ntype = \"delay\"\nname = \"restart\"\nbase_bdev_name = \"restart-file\"\n\
                 avg_read_latency = 0\np99_read_latency = 0\navg_write_latency = 50000\np99_write_latency = 50000\n\n\
                 [[vhost_blk]]\nctrlr = \"fp-restart\"\ndev_name = \"restart\"\nnum_queues = 2\n",
                file.display()
            )
        });
        let file = d.dir.path().join("fp-restart.img");
        let cfg = VmConfig { packed, ..VmConfig::new("restart", vec![d.dir.path().join("fp-restart")]) };
        let mut vm = Vm::boot(&cfg, d.dir.path());
        let round = |n: u32| move |l: &str| l.contains(&format!("round {n} ok"));

        vm.wait_for("round 10 of the write loop", round(10), BOOT_TIMEOUT);
        // Kill while the daemon holds a guest write. Sampling `in_flight` alone races the
        // request's completion, so writes submitted from now on wait the longest the delay bdev
        // allows; once the 50 ms ones have drained, whatever is in flight stays so until the
        // kill. (The restarted daemon is configured with 50 ms again.)
        for kind in ["p99_write", "avg_write"] {
            let max_us = fp_bdev::delay::MAX_DELAY.as_micros() as u64;
            d.call(
                "bdev_delay_update_latency",
                json!({"delay_bdev_name": "restart", "latency_type": kind, "latency_us": max_us}),
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        // Both writers stuck on a held write: two requests in flight on three looks 50 ms apart
        // (a read, with no delay, is over in well under that).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut held = 0;
        while held < 3 {
            assert!(std::time::Instant::now() < deadline, "the guest's writes never both got held");
            held = if counter(&stats(&d, "fp-restart"), "in_flight") >= 2 { held + 1 } else { 0 };
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        d.kill9();
        d.restart();
        vm.wait_for("round 60 after the SIGKILL restart", round(60), BOOT_TIMEOUT);
        let status = d.stop().expect("the daemon was running");
        assert!(status.success(), "SIGTERM with a guest attached must exit cleanly: {status:?}");
        d.restart();

        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        // The disk line came long before the result (waiting for the rounds consumed it), so
        // read it from the whole console too.
        let all = vm.whole_result(&r);
        assert_eq!(ring_packed(&all, "fp-restart"), packed, "VIRTIO_F_RING_PACKED negotiated");
        // The write reports came before the result line (some while the test waited for the
        // rounds), so read them from the whole console rather than from the result.
        let ops = all.ops("fp-restart");
        assert_eq!(ops.len(), 120, "every round reported its write: {ops:?}");
        let got = std::fs::read(&file).expect("reading the backing file");
        assert_same("the backing file after two restarts", 0, &got, &expected_contents(size, &ops));
        let log = d.stderr();
        assert_eq!(log.matches("restarting flashpath serve").count(), 2, "{log}");
        for line in log.lines().filter(|l| l.contains("resubmitting") || l.contains("in-flight")) {
            eprintln!("daemon: {line}");
        }
        // Only the SIGKILL can leave requests to resubmit: SIGTERM drains the queues first.
        assert!(
            log.contains("in-flight requests from before the restart"),
            "no request was resubmitted after the SIGKILL:\n{log}"
        );
        assert_no_errors(&stats(&d, "fp-restart"));
    }

    // ---- Logical volumes: a golden image, a clone of its snapshot in a guest, a snapshot of
    // the clone while the guest writes (issue 11). ----

    /// The lvstore's cluster size: 1 MiB rather than the default 4 MiB, so the guest's writes
    /// allocate (and copy) many clusters, some of them while the snapshot is taken.
    const LVOL_CLUSTER: u64 = MIB;
    /// The golden volume, its clones and snapshots: a 64 MiB ext4 file system.
    const LVOL_SIZE: u64 = 64 * MIB;
    /// Rounds the `lvol` scenario writes (`rounds` in tests/guest/init).
    const LVOL_ROUNDS: u32 = 30;
    /// The round after which the guest waits for the host (`fp.lvol.hold=`), which then holds
    /// the guest's writes and snapshots the clone while the next round's are held.
    const LVOL_SNAPSHOT_AFTER: u32 = 5;
    /// The writes the `pending` injection on the clone's error bdev holds: more than the guest
    /// can issue while it lasts, so `bdev_error_resume_pending` (not the count running out) is
    /// what ends it.
    const LVOL_HELD_WRITES: u64 = 1_000_000;

    /// The files the host puts in the golden image, as (path, contents); the `lvol` scenario
    /// checks the same names and contents in the guest.
    fn golden_files() -> Vec<(String, Vec<u8>)> {
        let mut files = vec![
            ("/golden/hello.txt".to_string(), b"the golden image of the flashpath lvol test\n".to_vec()),
            ("/golden/pattern.bin".to_string(), pattern(61, 0, 2 << 20)),
        ];
        for i in 0..100 {
            files.push((format!("/golden/small/f{i}"), format!("golden file {i}\n").into_bytes()));
        }
        files
    }

    /// An ext4 image of `size` bytes at `dir/golden.img` holding `files`, made by mke2fs -d
    /// (4 KiB blocks). Inode tables and the journal are written out now, so the guest's kernel
    /// has no lazy initialisation left to do behind the test's back. Returns the image's bytes.
    fn ext4_image(dir: &Path, size: u64, files: &[(String, Vec<u8>)]) -> Vec<u8> {
        let root = dir.join("golden-root");
        for (path, data) in files {
            let p = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().expect("a file has a directory"))
                .expect("creating a directory");
            std::fs::write(&p, data).expect("writing a golden file");
        }
        let img = sparse_file(dir, "golden.img", size);
        let out = Command::new(e2fs_tool("mke2fs"))
            .args(["-t", "ext4", "-q", "-F", "-b", "4096", "-L", "golden"])
            .args(["-E", "lazy_itable_init=0,lazy_journal_init=0", "-d"])
            .arg(&root)
            .arg(&img)
            .output()
            .expect("running mke2fs");
        assert!(
            out.status.success(),
            "mke2fs -d failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read(&img).expect("reading the golden image")
    }

    /// What mounting does to a file system that was in use when its image was taken: replay
    /// the journal and release orphan inodes (`e2fsck -p` without `-f` stops there when the
    /// file system was not marked as having errors). Anything else it reports fails the test,
    /// so a repair cannot hide an inconsistency from the `-fn` check that follows.
    fn recover_like_mount(what: &str, img: &Path) {
        let out = Command::new(e2fs_tool("e2fsck")).arg("-p").arg(img).output().expect("running e2fsck -p");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        // 0: nothing to do; 1: the journal was replayed or orphans released.
        assert!(matches!(out.status.code(), Some(0 | 1)), "{what}: e2fsck -p ({}):\n{text}", out.status);
        eprintln!("{what}: e2fsck -p ({}): {}", out.status, text.trim().replace('\n', " | "));
        let benign = ["e2fsck ", "recovering journal", "orphan", "clean, "];
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                benign.iter().any(|b| line.contains(b)),
                "{what}: e2fsck -p did more than recover: {line:?}\n{text}"
            );
        }
    }

    /// The regular files in a directory of an ext4 image, as (name, size), from `debugfs ls -p`
    /// (lines `/INODE/MODE/UID/GID/NAME/SIZE/`).
    fn debugfs_files(img: &Path, dir: &str) -> Vec<(String, u64)> {
        String::from_utf8_lossy(&debugfs(img, &format!("ls -p {dir}")))
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('/').collect();
                // Regular files only: mode 100xxx.
                (f.len() >= 7 && f[2].starts_with("100"))
                    .then(|| (f[5].to_string(), f[6].parse().unwrap_or(0)))
            })
            .collect()
    }

    /// The golden files read back with debugfs equal what the host wrote.
    fn assert_golden_files(what: &str, img: &Path, files: &[(String, Vec<u8>)]) {
        for (path, data) in files {
            assert_same(&format!("{what}: {path}"), 0, &debugfs_cat(img, path), data);
        }
    }

    /// A file of an image taken while the guest wrote it: no longer than it will be, and each
    /// 4 KiB block either what the guest writes there or zeroes (not yet written), never
    /// anything else (stale or misplaced data).
    fn assert_pattern_or_zero(what: &str, got: &[u8], want: &[u8]) {
        assert!(got.len() <= want.len(), "{what}: {} bytes, more than the {} written", got.len(), want.len());
        for (i, block) in got.chunks(4096).enumerate() {
            let w = &want[i * 4096..i * 4096 + block.len()];
            assert!(
                block == w || block.iter().all(|&b| b == 0),
                "{what}: block {i} is neither the guest's data nor zeroes"
            );
        }
    }

    /// Reads a whole volume back through a read-only libblkio connection to its controller.
    fn read_volume(sock: &Path, size: u64) -> Vec<u8> {
        let sock = sock.to_path_buf();
        bounded(std::time::Duration::from_secs(120), "lvol read-back", move || {
            let opts = ClientOpts { read_only: true, ..ClientOpts::default() };
            let mut c = BlkClient::connect(&sock, opts)
                .unwrap_or_else(|e| panic!("libblkio connect to {}: {e}", sock.display()));
            assert_eq!(c.capacity, size, "{}: capacity", sock.display());
            c.read_all(0, size as usize)
        })
    }

    /// The volume named `name` in `bdev_lvol_get_lvols`.
    fn lvol_info<'a>(lvols: &'a Value, name: &str) -> &'a Value {
        lvols
            .as_array()
            .and_then(|l| l.iter().find(|v| v["name"] == json!(name)))
            .unwrap_or_else(|| panic!("no volume {name} in {lvols}"))
    }

    /// Issue 11's guest test. The host makes an ext4 image with known files and copies it into
    /// a thin "golden" volume (only its non-zero clusters); snapshots it; clones the snapshot
    /// and exports the clone through an error bdev. The guest mounts the clone, checks the golden
    /// files and writes new ones on both vCPUs. After its fifth synced round it waits; the host
    /// makes the error bdev hold every write, lets the guest go on, and once a write is held
    /// snapshots the clone, then releases the writes (which land on the clone after the
    /// snapshot, copying the clusters it now shares). The guest must go on without an I/O
    /// error. Afterwards the host reads every volume back through libblkio: the golden volume
    /// and its snapshot equal the image byte for byte; the clone checks clean with e2fsck and
    /// holds the old and the new files; the clone's snapshot, once its journal is replayed as a
    /// mount would, checks clean, holds the golden files and every round synced before it, and
    /// nothing of the rounds after.
    #[test]
    fn guest_writes_a_clone_of_a_golden_volume_while_it_is_snapshotted() {
        let Some(_one) = one_at_a_time() else { return };
        let d = Daemon::start("0,1");
        let dir = d.dir.path().to_path_buf();
        let files = golden_files();
        let image = ext4_image(&dir, LVOL_SIZE, &files);

        // A 256 MiB RAM disk: the golden data, the clone's copies and the metadata fit easily.
        d.malloc("base", 256 * MIB / 512, 512);
        let lvs = d.call(
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "base", "lvs_name": "lvs", "cluster_sz": LVOL_CLUSTER}),
        );
        assert!(lvs.is_string(), "bdev_lvol_create_lvstore returns the store's UUID: {lvs}");
        let golden = d.call(
            "bdev_lvol_create",
            json!({"lvs_name": "lvs", "lvol_name": "golden", "size_in_mib": LVOL_SIZE / MIB, "thin_provision": true}),
        );
        assert!(golden.is_string(), "bdev_lvol_create returns the volume's bdev name: {golden}");

        // The image's non-zero clusters; the others stay unallocated and read as zeroes.
        let golden_sock = d.controller("fp-golden", "lvs/golden", Some(1), false);
        let (sock, img) = (golden_sock.clone(), image.clone());
        let copied = bounded(std::time::Duration::from_secs(120), "golden copy", move || {
            let mut c = BlkClient::open(&sock, 1);
            assert_eq!(c.capacity, LVOL_SIZE, "the golden volume's capacity");
            let mut copied = 0;
            for (i, chunk) in img.chunks(LVOL_CLUSTER as usize).enumerate() {
                if chunk.iter().any(|&b| b != 0) {
                    c.write_all(i as u64 * LVOL_CLUSTER, chunk);
                    copied += 1;
                }
            }
            assert_eq!(c.flush(0), 0, "flush of the golden volume");
            copied
        });
        eprintln!("golden image: {copied} of {} clusters hold data", LVOL_SIZE / LVOL_CLUSTER);

        d.call("bdev_lvol_snapshot", json!({"lvol_name": "lvs/golden", "snapshot_name": "golden-snap"}));
        let clone =
            d.call("bdev_lvol_clone", json!({"snapshot_name": "lvs/golden-snap", "clone_name": "vm"}));
        let clone = clone
            .as_str()
            .unwrap_or_else(|| panic!("bdev_lvol_clone returns the clone's bdev name: {clone}"));
        // The guest's writes go through an error bdev over the clone, so that the host can hold
        // them while it takes the snapshot: what the snapshot holds then does not depend on how
        // fast the guest runs.
        assert_eq!(d.call("bdev_error_create", json!({"base_name": clone})), json!(true));
        let ee = format!("EE_{clone}");
        let vm_sock = d.controller("fp-lvol", &ee, Some(2), false);

        let vm_cfg = VmConfig {
            console_input: true,
            kernel_args: vec![format!("fp.lvol.hold={LVOL_SNAPSHOT_AFTER}")],
            ..VmConfig::new("lvol", vec![vm_sock.clone()])
        };
        let mut vm = Vm::boot(&vm_cfg, &dir);
        let marker = format!("lvol round {LVOL_SNAPSHOT_AFTER} ok");
        vm.wait_for("the guest's synced rounds before the snapshot", |l| l.contains(&marker), BOOT_TIMEOUT);
        d.call(
            "bdev_error_inject_error",
            json!({"name": ee, "io_type": "write", "error_type": "pending", "num": LVOL_HELD_WRITES}),
        );
        vm.send_line("go");
        // The next round's writes come after the "go", so they will be held; wait until one
        // write (of that round, or the 24 MiB file's or the journal's) is.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while injection_left(&d, &ee, "write") == LVOL_HELD_WRITES {
            assert!(
                std::time::Instant::now() < deadline,
                "no write of the guest was held within 120 s of its go\n{}",
                vm.console()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let t0 = std::time::Instant::now();
        let snap = d.call("bdev_lvol_snapshot", json!({"lvol_name": "lvs/vm", "snapshot_name": "vm-snap"}));
        let took = t0.elapsed();
        assert!(snap.is_string(), "bdev_lvol_snapshot returns the snapshot's bdev name: {snap}");
        let held = LVOL_HELD_WRITES - injection_left(&d, &ee, "write");
        let iostat = d.call("bdev_get_iostat", json!({"name": ee}));
        let in_flight = iostat["bdevs"][0]["queue_depth"].as_u64().unwrap_or(0);
        assert!(in_flight >= 1, "the held writes are in flight on {ee} after the snapshot: {iostat}");
        // The next round ends with a sync, which cannot complete while its writes are held.
        let next = LVOL_SNAPSHOT_AFTER + 1;
        let console = vm.console();
        assert!(
            !console.contains(&format!("lvol round {next} ok")),
            "the guest announced round {next} while its writes were held:\n{console}"
        );
        eprintln!("snapshot of the clone took {took:?}, with {held} of the guest's writes held");
        assert_eq!(d.call("bdev_error_resume_pending", json!({"name": ee})), json!(true));
        assert_eq!(injection_left(&d, &ee, "write"), 0, "the resume ended the pending injection");
        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        let all = vm.whole_result(&r);
        assert_disk(&all, "fp-lvol", LVOL_SIZE, 512, false);
        assert_no_errors(&stats(&d, "fp-lvol"));

        let lvols = d.call("bdev_lvol_get_lvols", json!({"lvs_name": "lvs"}));
        for (name, key, want) in [
            ("golden-snap", "is_snapshot", true),
            ("vm", "is_clone", true),
            ("vm", "is_thin_provisioned", true),
            ("vm", "is_snapshot", false),
            ("vm-snap", "is_snapshot", true),
        ] {
            assert_eq!(lvol_info(&lvols, name)[key], json!(want), "{name}: {key} in {lvols}");
        }

        // Read every volume back: the clone through the socket the guest used, the others
        // through controllers of their own (read-only for the snapshots).
        let golden_snap_sock = d.controller("fp-golden-snap", "lvs/golden-snap", Some(1), true);
        let vm_snap_sock = d.controller("fp-vm-snap", "lvs/vm-snap", Some(1), true);
        assert_same("the golden volume after the guest", 0, &read_volume(&golden_sock, LVOL_SIZE), &image);
        assert_same("the golden snapshot", 0, &read_volume(&golden_snap_sock, LVOL_SIZE), &image);
        let clone_img = dir.join("vm.img");
        std::fs::write(&clone_img, read_volume(&vm_sock, LVOL_SIZE)).expect("writing the clone's image");
        let snap_img = dir.join("vm-snap.img");
        std::fs::write(&snap_img, read_volume(&vm_snap_sock, LVOL_SIZE))
            .expect("writing the snapshot's image");

        // The clone: unmounted cleanly by the guest, so no recovery may be needed.
        assert_e2fsck_clean("the clone", &clone_img);
        assert_golden_files("the clone", &clone_img, &files);
        for n in 1..=LVOL_ROUNDS {
            let f = debugfs_cat(&clone_img, &format!("/new/r{n}.bin"));
            assert_same(
                &format!("the clone: /new/r{n}.bin"),
                0,
                &f,
                &pattern(100 + u64::from(n), 0, 256 << 10),
            );
            assert_eq!(debugfs_cat(&clone_img, &format!("/new/t{n}.txt")), format!("round {n}\n").as_bytes());
        }
        assert_same(
            "the clone: /new/big.bin",
            0,
            &debugfs_cat(&clone_img, "/new/big.bin"),
            &pattern(99, 0, 24 << 20),
        );
        assert_eq!(
            debugfs_cat(&clone_img, "/new/done.txt"),
            format!("the guest wrote {LVOL_ROUNDS} rounds\n").as_bytes()
        );

        // The clone's snapshot: taken with the file system mounted and being written, so it is
        // what a crash at that moment would leave.
        recover_like_mount("the clone's snapshot", &snap_img);
        assert_e2fsck_clean("the clone's snapshot (after recovery)", &snap_img);
        assert_golden_files("the clone's snapshot", &snap_img, &files);
        let new: std::collections::HashMap<String, u64> =
            debugfs_files(&snap_img, "/new").into_iter().collect();
        eprintln!("the clone's snapshot holds {} new files: {new:?}", new.len());
        // Every write the guest made after the host's "go" was held until after the snapshot,
        // and its files of a round are created only in that round: the rounds synced before
        // are there whole, and nothing of the later ones, not even a directory entry.
        for n in 1..=LVOL_ROUNDS {
            let (bin, txt) = (format!("r{n}.bin"), format!("t{n}.txt"));
            if n <= LVOL_SNAPSHOT_AFTER {
                let want = pattern(100 + u64::from(n), 0, 256 << 10);
                let f = debugfs_cat(&snap_img, &format!("/new/{bin}"));
                assert_same(&format!("the clone's snapshot: /new/{bin} (synced before it)"), 0, &f, &want);
                assert_eq!(debugfs_cat(&snap_img, &format!("/new/{txt}")), format!("round {n}\n").as_bytes());
            } else {
                assert!(
                    !new.contains_key(&bin) && !new.contains_key(&txt),
                    "round {n} (after the snapshot) is in it: {new:?}"
                );
            }
        }
        if new.contains_key("big.bin") {
            let f = debugfs_cat(&snap_img, "/new/big.bin");
            assert_pattern_or_zero("the clone's snapshot: /new/big.bin", &f, &pattern(99, 0, 24 << 20));
        }
        assert!(!new.contains_key("done.txt"), "done.txt, written after every round, is in the snapshot");
    }
}
