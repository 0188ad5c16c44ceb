//! ublk in the TCG guest (tests/guest/, docs/guest-tests.md, docs/ublk.md): the host's kernel has
//! no ublk_drv, so the daemon runs inside the guest (this build's `flashpath`, added in a
//! second cpio) and serves its disks as /dev/ublkbN there. The guest's `ublk` scenario
//! (tests/guest/init): a RAM disk with ext4, files and `fio --verify` on two queues; the same
//! device id refused; its bdev's deletion refused; an lvol and a crypto disk under `fio
//! --verify`; a stop under fio's load, the other disks unaffected; a stop while an error bdev
//! holds a write (bounded, the disk kept, deleted by a second stop once the write is released);
//! an lvol's growth reaching the device only through a stop and start (6.12 has no
//! UPDATE_SIZE); a file disk with user recovery, `kill -9` of the daemon under fio, a new daemon
//! recovering it from its configuration file, fio finishing without a verify error; a second
//! daemon refused that device's id by the kernel. Then SPDK's own client drives the ublk
//! methods from the host: a `hostfwd` port reaches the guest's port 4420, where socat relays it
//! to the daemon's RPC socket.
//!
//! One boot. It runs with the other guest tests (`./run test`, one at a time); the module is
//! `guest_vm` so that the step running everything else skips it. Without QEMU it fails under
//! `CI=true` and is skipped elsewhere. spdk-rpc as for tests/spdk_rpc.rs.

mod common;

mod guest_vm {
    use std::process::Command;
    use std::time::Duration;

    use super::common::guest::{self, Vm, VmConfig};
    use super::common::nbd::free_port;
    use super::common::spdk::spdk_rpc_path;
    use serde_json::Value;

    /// The guest's whole life and each wait in it: only a hang reaches it.
    const GUEST_DEADLINE: Duration = Duration::from_secs(900);

    /// spdk-rpc against the daemon in the guest, through the forwarded `port`: (success, stdout
    /// and stderr).
    fn spdk(port: u16, args: &[&str]) -> (bool, String) {
        let out = Command::new(spdk_rpc_path())
            .args(["-s", "127.0.0.1", "-p", &port.to_string(), "-t", "120"])
            .args(args)
            .output()
            .expect("running spdk-rpc");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("guest 'ublk': spdk-rpc {}: {}", args.join(" "), text.trim());
        (out.status.success(), text)
    }

    fn spdk_ok(port: u16, args: &[&str]) -> String {
        let (ok, text) = spdk(port, args);
        assert!(ok, "spdk-rpc {args:?} failed: {text}");
        text
    }

    fn spdk_json(port: u16, args: &[&str]) -> Value {
        let text = spdk_ok(port, args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("spdk-rpc {args:?}: not JSON ({e}): {text}"))
    }

    #[test]
    fn flashpath_disks_are_kernel_block_devices_through_ublk_and_survive_a_kill_9() {
        if !guest::available() {
            return;
        }
        let spdk_rpc = spdk_rpc_path();
        assert!(spdk_rpc.is_file());
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let cfg = VmConfig {
            hostfwd: Some(port),
            console_input: true,
            timeout: GUEST_DEADLINE,
            extra_files: vec![(env!("CARGO_BIN_EXE_flashpath").into(), "/usr/bin/flashpath".into())],
            // The root file system is in RAM: the daemon, three 32 MiB RAM disks, an lvol's,
            // the recovery disk's file and the queues' buffers.
            mem_mib: 1024,
            ..VmConfig::new("ublk", Vec::new())
        };
        let mut vm = Vm::boot(&cfg, dir.path());
        vm.wait_for("the SPDK client's turn", |l| l.contains("ublk spdk-rpc ready"), GUEST_DEADLINE);

        // The recovered disk is there, as SPDK's client reads it.
        let disks = spdk_json(port, &["ublk_get_disks"]);
        let d4 = disks.as_array().and_then(|a| a.iter().find(|d| d["ublk_id"] == 4)).cloned();
        let d4 = d4.unwrap_or_else(|| panic!("no ublk disk 4 after the recovery: {disks}"));
        assert_eq!(d4["ublk_device"], "/dev/ublkb4", "{d4}");
        assert_eq!(d4["bdev_name"], "rec0", "{d4}");
        assert_eq!(d4["recovered"], true, "{d4}");
        assert_eq!(d4["copy_mode"], "kernel_copy", "{d4}");
        // A new disk through SPDK's argument syntax, listed, refused a second time, stopped.
        assert_eq!(spdk_ok(port, &["ublk_start_disk", "ram9", "5", "-q", "1", "-d", "32"]).trim(), "5");
        let d5 = spdk_json(port, &["ublk_get_disks", "-n", "5"]);
        assert_eq!(d5[0]["num_queues"], 1, "{d5}");
        assert_eq!(d5[0]["queue_depth"], 32, "{d5}");
        let (ok, text) = spdk(port, &["ublk_start_disk", "ram9", "6", "-q", "64"]);
        assert!(!ok && text.contains("num_queues"), "64 queues: {text}");
        // Recovering a live device is refused (its daemon is alive).
        let (ok, text) = spdk(port, &["ublk_recover_disk", "ram9", "4"]);
        assert!(!ok, "recovering a live device: {text}");
        spdk_ok(port, &["ublk_stop_disk", "5"]);
        // The target goes, with the recovered disk; then it comes back.
        spdk_ok(port, &["ublk_destroy_target"]);
        assert_eq!(spdk_json(port, &["ublk_get_disks"]), serde_json::json!([]));
        spdk_ok(port, &["ublk_create_target", "-m", "0x3"]);
        vm.send_line("go");

        let r = vm.wait_result();
        // With the lines read before the SPDK client's turn.
        let r = vm.whole_result(&r);
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        for l in &r.info {
            if l.starts_with("ublk") {
                eprintln!("guest 'ublk': {l}");
            }
        }
        let refused = r.info_after("ublk refused").join(" ");
        assert!(
            refused.starts_with("status=1") && refused.contains("/dev/ublkb1") && refused.contains("exists"),
            "the same id twice: {refused}"
        );
        // The bdev under a disk cannot be deleted: the disk claims it.
        let delete = r.info_after("ublk delete refused").join(" ");
        assert!(delete.starts_with("status=1") && delete.contains("/dev/ublkb1"), "{delete}");
        // The same id in the kernel, asked for by a second daemon: the kernel's EEXIST.
        let kernel = r.info_after("ublk kernel refused").join(" ");
        assert!(kernel.starts_with("status=1") && kernel.contains("in use"), "{kernel}");
        let stop = r.info_after("ublk stop under load").join(" | ");
        assert!(stop.contains("status=0"), "stop under load: {stop}");
        // A held request: the stop fails at its bound, the device stays, a second stop after
        // the request completed deletes it.
        let held = r.info_after("ublk stop held").join(" | ");
        assert!(
            held.contains("status=1") && held.contains("requests in flight"),
            "stop with a held write: {held}"
        );
        assert!(held.contains("disk listed=yes"), "{held}");
        assert!(held.contains("second stop ok listed=no"), "{held}");
        // 24 MiB, then 28 MiB only after a stop and start (no UPDATE_SIZE on 6.12).
        let live = r.info_after("ublk resize live").join(" ");
        assert!(live.contains("size=25165824") && live.contains("\"live_resize\":false"), "{live}");
        let after = r.info_after("ublk resize after restart").join(" ");
        assert_eq!(after, "size=29360128");
        let shutdown = r.info_after("ublk shutdown").join(" ");
        assert_eq!(shutdown, "status=0 device present=no char device present=no");
        let killed = r.info_after("ublk killed daemon;").join(" ");
        assert!(killed.contains("/dev/ublkb4 present=yes"), "after kill -9: {killed}");
        let recovered = r.info_after("ublk recovered").join(" ");
        assert!(recovered.contains("\"recovered\":true"), "{recovered}");
        assert!(!r.info_after("ublk fio across recovery ok").is_empty(), "{:?}", r.info);
    }
}
