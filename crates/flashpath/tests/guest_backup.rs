//! Backups with a real guest (docs/guest-tests.md, "Backups"): QEMU under TCG on flashpath's
//! vhost-user-blk disks.
//!
//! * `a_live_guests_disk_backs_up_full_then_incremental_at_the_points_in_time`: the
//!   `migrate` scenario's stamped writers run on a file disk; the host stops them (`check N`),
//!   reads the backing file as the expected image, starts a backup (its point in time is when
//!   `bdev_backup_start` returns), lets the writers resume while the job, held by a speed
//!   limit, runs, and then compares the backup (read back with fp-backup's `ChunkReader`) with
//!   that image byte for byte: first a full backup, then an incremental from the bitmap.
//! * `a_guest_reads_and_writes_a_disk_while_it_is_live_restored`: a backup the test
//!   made of a pattern is live-restored (`bdev_backup_restore_create`, slowed so it cannot be
//!   complete before the guest has read) onto a file disk; a guest on the restore bdev verifies
//!   the whole disk with `fpio` and writes some; once complete, the base file is the backup
//!   plus the guest's writes.
//!
//! The tests live in `guest_vm` so that the workspace's ordinary run skips them (`--skip
//! guest_vm::`); `./run test` runs them in its guest step, one at a time.

mod common;

mod guest_vm {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    use fp_backup::{BackupOptions, ChunkReader, Job, Plan, Store, StoreConfig};
    use serde_json::{json, Value};

    use super::common::backup::VecSource;
    use super::common::guest::stamp::{self, vm_config, WRITE_PHASE};
    use super::common::guest::{self, Vm, VmConfig, EXIT_TIMEOUT};
    use super::common::{pattern, Daemon};

    const MIB: u64 = 1 << 20;
    /// The guest's disk: small, TCG is slow.
    const SIZE: u64 = 32 * MIB;
    const CHUNK: u64 = 64 << 10;
    const CHUNKS: u64 = SIZE / CHUNK;
    /// A backup job at one chunk a second needs at least 512 s for the disk (the token bucket
    /// starts empty), longer than any guest here may run (stamp::VM_TIMEOUT, 400 s): the job is
    /// certainly still running while the guest writes, whatever the machine's speed.
    const SLOW: u64 = CHUNK;
    /// The live restore's copier at 128 KiB/s needs at least 256 s for the disk, more than a
    /// boot may take (guest::BOOT_TIMEOUT, 120 s): the restore is certainly incomplete when
    /// the guest starts.
    const RESTORE_SPEED: u64 = 128 << 10;

    /// One guest at a time, whatever the test runner's thread count.
    fn one_at_a_time() -> Option<MutexGuard<'static, ()>> {
        static LOCK: Mutex<()> = Mutex::new(());
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        guest::available().then_some(guard)
    }

    /// A sparse file of [`SIZE`] bytes (reads as zeroes).
    fn sparse_file(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::File::create(&path).and_then(|f| f.set_len(SIZE)).expect("creating a backing file");
        path
    }

    /// A daemon on reactor 0 with a state directory and `extra` (configuration tables), and
    /// the directory store `st` at `store` (added by RPC: in the configuration file it would
    /// make the file hold key material, which must be owner-only).
    fn daemon(files: &Path, store: &Path, extra: &str) -> Daemon {
        std::fs::create_dir_all(files.join("state")).unwrap();
        std::fs::create_dir_all(store).unwrap();
        let state = files.join("state");
        let extra = extra.to_string();
        let d = Daemon::start_with_config("0", move |_| {
            format!("state_dir = \"{}\"\n\n{extra}", state.display())
        });
        let url = format!("file://{}", store.display());
        assert_eq!(d.call("backup_store_add", json!({ "name": "st", "url": url })), json!(true));
        d
    }

    fn open_store(dir: &Path) -> Store {
        Store::open(&StoreConfig { url: format!("file://{}", dir.display()), ..Default::default() })
            .expect("opening the directory store")
    }

    /// The disk image backup `id` of `disk` holds, read back from the store with `ChunkReader`.
    fn read_backup(store: &Path, disk: &str, id: &str) -> Vec<u8> {
        let store = open_store(store);
        let m = Arc::new(store.manifest(disk, id, None).expect("the backup's manifest"));
        let reader = ChunkReader::new(&store, m, None).expect("a reader of the backup");
        (0..reader.chunk_count()).flat_map(|i| reader.read(i).expect("reading a chunk")).collect()
    }

    fn job(d: &Daemon, id: &str) -> Value {
        d.call("bdev_backup_get_jobs", json!({ "job_id": id }))[0].clone()
    }

    /// Lifts the job's speed limit and waits (bounded) until it has ended; returns it.
    fn finish_job(d: &Daemon, id: &str) -> Value {
        d.call("bdev_backup_set_speed", json!({ "job_id": id, "speed": 0 }));
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let j = job(d, id);
            if j["state"] != "running" {
                return j;
            }
            assert!(Instant::now() < deadline, "job {id} still running after 120 s: {j}\n{}", d.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The offset of the first byte where `a` and `b` differ, for messages.
    fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
        a.iter().zip(b).position(|(x, y)| x != y)
    }

    /// The 64 KiB chunks in which `a` and `b` differ.
    fn chunks_differing(a: &[u8], b: &[u8]) -> usize {
        a.chunks(CHUNK as usize).zip(b.chunks(CHUNK as usize)).filter(|(x, y)| x != y).count()
    }

    /// Stops the guest's writers (`check n`, verified in the guest), reads the backing file as
    /// the image of this point in time and checks it against what the guest verified.
    fn pause_and_image(vm: &mut Vm, n: u32, file: &Path, what: &str) -> Vec<u8> {
        let checks = stamp::check(vm, n);
        stamp::assert_image_matches(file, &checks, what);
        std::fs::read(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
    }

    #[test]
    fn a_live_guests_disk_backs_up_full_then_incremental_at_the_points_in_time() {
        let Some(_one) = one_at_a_time() else { return };
        let t0 = Instant::now();
        let files = tempfile::Builder::new().prefix("fp-guest-backup-").tempdir_in("/var/tmp").unwrap();
        let file = sparse_file(files.path(), "vm0.img");
        let store = files.path().join("store");
        let serial = "fp-bk";
        let disk = format!(
            "[[bdev]]\ntype = \"uring\"\nname = \"vm0\"\nfilename = \"{}\"\n\n\
             [[vhost_blk]]\nctrlr = \"{serial}\"\ndev_name = \"vm0\"\nnum_queues = 2\n",
            file.display()
        );
        let d = daemon(files.path(), &store, &disk);
        let mut vm = Vm::boot(&vm_config("backup", d.dir.path().join(serial), serial, false), d.dir.path());
        stamp::wait_writing(&mut vm, 0);
        std::thread::sleep(WRITE_PHASE);

        // (a) Full: the writers stand still while the host takes the image and starts the job.
        let at_full = pause_and_image(&mut vm, 1, &file, "before the full backup");
        let id = d.call(
            "bdev_backup_start",
            json!({ "bdev": "vm0", "store": "st", "sync": "full", "bitmap": "b", "chunk_size": CHUNK,
                    "speed": SLOW }),
        );
        let id = id.as_str().expect("a job id").to_string();
        stamp::resume(&mut vm, 1);
        std::thread::sleep(WRITE_PHASE);
        // The guest wrote while the job ran (`check` asserts each writer wrote in this phase).
        let after_full = pause_and_image(&mut vm, 2, &file, "during the full backup");
        let j = job(&d, &id);
        assert_eq!(
            j["state"], "running",
            "the speed limit keeps the job running while the guest writes: {j}"
        );
        let changed = chunks_differing(&at_full, &after_full);
        assert!(changed > 0, "the guest changed no chunk during the full backup");
        let j = finish_job(&d, &id);
        assert_eq!(j["state"], "completed", "{j}\n{}", d.stderr());
        assert_eq!(j["progress"]["chunks_total"], CHUNKS, "{j}");
        let full = j["backup_id"].as_str().expect("the full backup's id").to_string();
        let got = read_backup(&store, "vm0", &full);
        assert!(
            got == at_full,
            "the full backup is not the disk when the job started (first difference at byte {:?}; \
             {} chunks differ from the start, {} from the disk after the guest's later writes)",
            first_difference(&got, &at_full),
            chunks_differing(&got, &at_full),
            chunks_differing(&got, &after_full)
        );
        eprintln!(
            "full backup {full}: equals the image at its start; the guest changed {changed} chunks during it"
        );
        d.call("bdev_backup_cancel", json!({ "job_id": id })); // dismisses the ended job

        // (b) Incremental from the bitmap, at the point where the writers stand now.
        let at_inc = after_full;
        let id = d.call(
            "bdev_backup_start",
            json!({ "bdev": "vm0", "store": "st", "sync": "incremental", "bitmap": "b", "speed": SLOW }),
        );
        let id = id.as_str().expect("a job id").to_string();
        stamp::resume(&mut vm, 2);
        std::thread::sleep(WRITE_PHASE);
        let after_inc = pause_and_image(&mut vm, 3, &file, "during the incremental backup");
        let j = job(&d, &id);
        assert_eq!(
            j["state"], "running",
            "the speed limit keeps the job running while the guest writes: {j}"
        );
        let later = chunks_differing(&at_inc, &after_inc);
        assert!(later > 0, "the guest changed no chunk during the incremental backup");
        let j = finish_job(&d, &id);
        assert_eq!(j["state"], "completed", "{j}\n{}", d.stderr());
        // Exactly the chunks the guest changed between the two points in time were read.
        assert_eq!(j["progress"]["chunks_total"], changed as u64, "{j}");
        assert_eq!(j["progress"]["chunks_read"], changed as u64, "{j}");
        let inc = j["backup_id"].as_str().expect("the incremental's id").to_string();
        let b = d.call("backup_get", json!({ "store": "st", "bdev": "vm0", "backup_id": inc }));
        assert_eq!(b["parent"], full.as_str(), "{b}");
        let got = read_backup(&store, "vm0", &inc);
        assert!(
            got == at_inc,
            "the incremental backup is not the disk when its job started (first difference at byte {:?}; \
             {} chunks differ from it, {} from the disk after the guest's later writes)",
            first_difference(&got, &at_inc),
            chunks_differing(&got, &at_inc),
            chunks_differing(&got, &after_inc)
        );
        eprintln!(
            "incremental {inc}: equals the image at its start; the guest changed {later} chunks during it"
        );
        stamp::done(&mut vm);
        eprintln!("backup guest: {:.1?} in all", t0.elapsed());
    }

    /// A chunk that is all zeroes in the restored disk's backup (not stored).
    const ZERO_CHUNK: u64 = 256;
    /// The guest's writes after its check: (offset, length, seed); one across a chunk boundary,
    /// one inside the zero chunk, one at the end of the disk.
    const GUEST_WRITES: [(u64, u64, u64); 3] =
        [(3 * CHUNK - 4096, 12288, 72), (ZERO_CHUNK * CHUNK + 8192, 4096, 73), (SIZE - 65536, 65536, 74)];

    /// Types `command` in the guest's shell, then waits for its `ok` or `failed` word; the word
    /// is computed by the shell (`$((...))`), so the echo of the typed line never matches.
    fn shell(vm: &mut Vm, step: u32, command: &str) {
        vm.send_line(&format!("{command} && echo bk-ok-$((1000+{step})) || echo bk-failed-$((1000+{step}))"));
        let (ok, failed) = (format!("bk-ok-{}", 1000 + step), format!("bk-failed-{}", 1000 + step));
        let line = vm.wait_for(
            &ok,
            |l| l.trim_end().ends_with(&ok) || l.trim_end().ends_with(&failed),
            Duration::from_secs(120),
        );
        assert!(line.trim_end().ends_with(&ok), "the guest's '{command}' failed: {line}");
    }

    fn restore_status(d: &Daemon) -> Value {
        d.call("bdev_get_bdevs", json!({ "name": "rst" }))[0]["driver_specific"]["backup_restore"].clone()
    }

    #[test]
    fn a_guest_reads_and_writes_a_disk_while_it_is_live_restored() {
        let Some(_one) = one_at_a_time() else { return };
        let t0 = Instant::now();
        let files = tempfile::Builder::new().prefix("fp-guest-restore-").tempdir_in("/var/tmp").unwrap();
        let store = files.path().join("store");
        std::fs::create_dir_all(&store).unwrap();
        // The backup: pattern 71 with one zero chunk, made here with fp-backup.
        let mut image = pattern(71, 0, SIZE as usize);
        image[(ZERO_CHUNK * CHUNK) as usize..((ZERO_CHUNK + 1) * CHUNK) as usize].fill(0);
        let mut options = BackupOptions::new("vm", SIZE);
        options.chunk_size = CHUNK;
        let manifest = fp_backup::backup(
            &open_store(&store),
            &mut VecSource(image.clone()),
            Plan::Full,
            &options,
            &Job::new(),
        )
        .expect("making the backup");
        let base = sparse_file(files.path(), "base.img");
        let d = daemon(
            files.path(),
            &store,
            &format!("[[bdev]]\ntype = \"uring\"\nname = \"base\"\nfilename = \"{}\"\n", base.display()),
        );
        d.call(
            "bdev_backup_restore_create",
            json!({ "name": "rst", "base_bdev": "base", "store": "st", "bdev": "vm", "backup_id": manifest.id,
                    "speed": RESTORE_SPEED }),
        );
        let serial = "fp-rst";
        d.call("vhost_create_blk_controller", json!({ "ctrlr": serial, "dev_name": "rst", "num_queues": 2 }));
        let cfg = VmConfig { console_input: true, ..VmConfig::new("shell", vec![d.dir.path().join(serial)]) };
        let mut vm = Vm::boot(&cfg, d.dir.path());
        vm.wait_for("the guest's shell", |l| l.contains("interactive shell"), guest::BOOT_TIMEOUT);
        let at_start = restore_status(&d);
        assert_eq!(at_start["state"], "copying", "{at_start}");
        assert_eq!(at_start["chunks"], CHUNKS, "{at_start}");
        let restored = at_start["restored"].as_u64().expect("restored");
        assert!(restored < CHUNKS, "the restore must be incomplete when the guest starts: {at_start}");
        eprintln!("guest started after {:.1?} with {restored} of {CHUNKS} chunks restored", vm.elapsed());

        // The guest reads the whole disk, which the restore fetches as the reads reach it.
        let zero = ZERO_CHUNK * CHUNK;
        shell(&mut vm, 1, &format!("fpio verify /dev/vda 0 {zero} 71"));
        shell(&mut vm, 2, &format!("fpio check-zero /dev/vda {zero} {CHUNK}"));
        shell(&mut vm, 3, &format!("fpio verify /dev/vda {} {} 71", zero + CHUNK, SIZE - zero - CHUNK));
        let mut want = image;
        for (i, (offset, len, seed)) in GUEST_WRITES.into_iter().enumerate() {
            shell(&mut vm, 10 + i as u32, &format!("fpio write /dev/vda {offset} {len} {seed}"));
            want[offset as usize..(offset + len) as usize].copy_from_slice(&pattern(
                seed,
                offset,
                len as usize,
            ));
        }
        for (i, (offset, len, seed)) in GUEST_WRITES.into_iter().enumerate() {
            shell(&mut vm, 20 + i as u32, &format!("fpio verify /dev/vda {offset} {len} {seed}"));
        }
        vm.send_line("poweroff -f");
        vm.wait_exit(EXIT_TIMEOUT);
        eprintln!("guest done after {:.1?}", t0.elapsed());

        // Every chunk was read by the guest, so the restore completes without the copier.
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let s = restore_status(&d);
            if s["state"] == "complete" {
                assert_eq!(s["restored"], s["chunks"], "{s}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the restore is not complete after 300 s: {s}\n{}",
                d.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        d.call("vhost_delete_controller", json!({ "ctrlr": serial }));
        assert_eq!(d.call("bdev_backup_restore_delete", json!({ "name": "rst" })), json!(true));
        d.call("bdev_uring_delete", json!({ "name": "base" }));
        let got = std::fs::read(&base).expect("reading the base file");
        assert!(
            got == want,
            "the base is not the backup plus the guest's writes (first difference at byte {:?})",
            first_difference(&got, &want)
        );
        eprintln!("live restore guest: {:.1?} in all", t0.elapsed());
    }
}
