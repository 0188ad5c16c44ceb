//! Live migration, case (c): two flashpath daemons on one Ceph RBD image (issue 22;
//! docs/migration.md, docs/guest-tests.md). A real single-node cluster (common/ceph.rs), one
//! image opened by both daemons; the guest's `migrate` scenario (stamped writers, see
//! migration.rs) moves VM1 (daemon 1) -> VM2 (daemon 2) -> VM3 (daemon 1 again). librbd's
//! exclusive lock must follow the I/O each time: the test reads its owner with `rbd lock ls`
//! after each migration and the image's contents with `rbd export`, outside flashpath. Its own
//! file so the cluster lives in its own process; fails without QEMU or Ceph under `CI=true`.

mod common;

/// In a module named like guest.rs's, so the workspace test step skips it (`--skip guest_vm::`)
/// and the guest step runs it alone (scripts/test.sh).
mod guest_vm {
    use std::path::PathBuf;
    use std::time::Instant;

    use serde_json::{json, Value};

    use super::common::ceph::CephCluster;
    use super::common::guest::migrate::migrate;
    use super::common::guest::stamp::{self, check_and_resume, vm_config};
    use super::common::guest::{self, Vm};
    use super::common::Daemon;

    const IMAGE_MIB: u64 = 32;
    const CLUSTER: &str = "ceph";

    /// The daemon's `disk`: the image `vm` on the cluster, and a controller `ctrlr` on it.
    fn rbd_disk(d: &Daemon, ceph: &CephCluster, ctrlr: &str) -> PathBuf {
        d.call("bdev_rbd_register_cluster", ceph.register_params(CLUSTER, json!({})));
        d.call(
            "bdev_rbd_create",
            json!({"name": "disk", "pool_name": "rbd", "rbd_name": "vm", "cluster_name": CLUSTER}),
        );
        d.controller(ctrlr, "disk", Some(2), false)
    }

    /// The client that holds the image's exclusive lock (`rbd lock ls`), e.g. "client.4161".
    fn lock_owner(ceph: &CephCluster) -> String {
        let out = ceph.rbd(&["lock", "ls", "--format", "json", "rbd/vm"]);
        let locks: Value =
            serde_json::from_slice(&out.stdout).expect("rbd lock ls --format json prints JSON");
        let locks = locks.as_array().unwrap_or_else(|| panic!("rbd lock ls: not a list: {locks}"));
        assert_eq!(locks.len(), 1, "rbd lock ls: one exclusive lock expected: {locks:?}");
        locks[0]["locker"].as_str().unwrap_or_else(|| panic!("no locker in {locks:?}")).to_string()
    }

    #[test]
    fn guest_migrates_between_two_daemons_on_one_rbd_image_and_back() {
        if !guest::available() {
            return;
        }
        let Some(ceph) = CephCluster::start() else { return };
        let t0 = Instant::now();
        ceph.create_image("vm", IMAGE_MIB);
        let d1 = Daemon::start("0");
        let d2 = Daemon::start("1");
        let dir = d1.dir.path();
        let sock1 = rbd_disk(&d1, &ceph, "vm-c");
        let sock2 = rbd_disk(&d2, &ceph, "vm-c2");
        let serial = "vm-c";
        // The image read back with `rbd export`, outside flashpath, while the writers stand still.
        let ceph = &ceph;
        let export = |n: u32| {
            move || {
                let img = dir.join(format!("export-{n}.img"));
                let _ = std::fs::remove_file(&img);
                ceph.rbd(&["export", "rbd/vm", img.to_str().expect("a UTF-8 path")]);
                img
            }
        };

        let mut vm1 = Vm::boot(&vm_config("vm1", sock1.clone(), serial, false), dir);
        stamp::wait_writing(&mut vm1, 0);
        check_and_resume(&mut vm1, 1, "on daemon 1", export(1));
        let first = lock_owner(ceph);

        let mut vm2 = Vm::boot(&vm_config("vm2", sock2, serial, true), dir);
        std::thread::sleep(stamp::WRITE_PHASE);
        migrate(&mut vm1, &mut vm2, dir, "c-rbd-daemon1-to-daemon2");
        check_and_resume(&mut vm2, 2, "after daemon 1 -> daemon 2", export(2));
        let second = lock_owner(ceph);
        assert_ne!(first, second, "the exclusive lock stayed with daemon 1 while daemon 2 wrote");

        // And back: daemon 1's image takes the lock again.
        let mut vm3 = Vm::boot(&vm_config("vm3", sock1, serial, true), dir);
        std::thread::sleep(stamp::WRITE_PHASE);
        migrate(&mut vm2, &mut vm3, dir, "c-rbd-daemon2-to-daemon1");
        check_and_resume(&mut vm3, 3, "after daemon 2 -> daemon 1", export(3));
        assert_eq!(lock_owner(ceph), first, "the exclusive lock did not come back to daemon 1");
        let last = stamp::check(&mut vm3, 4);
        stamp::assert_image_matches(&export(4)(), &last, "at the end");
        stamp::done(&mut vm3);
        eprintln!("RBD chain: {:.1?} once the cluster ran", t0.elapsed());
    }
}
