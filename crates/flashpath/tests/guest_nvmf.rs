//! The Linux kernel's NVMe/TCP host against flashpath's NVMe/TCP target: a `flashpath serve`
//! with two reactors serves a RAM disk as a namespace on a listener on 127.0.0.1, set up with
//! SPDK's JSON-RPC methods; a QEMU guest (TCG, tests/guest/, docs/guest-tests.md) reaches it
//! through QEMU's user network with `restrict=on`, whose one way out is a `guestfwd` to that
//! port on the host's loopback. The guest's `nvmf` scenario (tests/guest/init) discovers,
//! connects with two I/O queues, runs fio with verify, makes and checks ext4, sees a resize the
//! host makes, writes past the old end and disconnects; it connects again with a 2 s KATO, the
//! host stops the VM until the target has torn the controller down, the kernel reconnects, and
//! the host deletes the subsystem under it. The host checks the target's controllers and queue pairs while the
//! guest is connected, that the first controller's are gone after its disconnect, and the RAM
//! disk's contents afterwards: the file system with e2fsck and debugfs, the writes past the old
//! end byte for byte.
//!
//! One boot in this binary. It runs with the other guest tests (`./run test`, one at a time);
//! the module is `guest_vm` so that the step running everything else skips it. Without QEMU or
//! socat it fails under `CI=true` and is skipped elsewhere.

mod common;

mod guest_vm {
    use std::collections::HashMap;
    use std::net::TcpListener;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use serde_json::{json, Value};

    use super::common::guest::ext4::{assert_e2fsck_clean, debugfs_cat};
    use super::common::guest::{self, DiskOp, Vm, VmConfig, BOOT_TIMEOUT, EXIT_TIMEOUT};
    use super::common::{assert_same, bounded, pattern, BlkClient, ClientOpts, Daemon};

    const MIB: u64 = 1 << 20;
    const NQN: &str = "nqn.2016-06.io.flashpath:guest";
    const SERIAL: &str = "FPGUEST0001";
    /// The host NQN the guest's init writes to /etc/nvme/hostnqn.
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f1a5c0de-0000-4000-8000-000000000024";
    /// The guest's `op` lines for the namespace name it `nvmf`.
    const OPS: &str = "nvmf";

    /// Whether QEMU and socat (QEMU runs it for each forwarded connection) are here; under
    /// `CI=true` a missing one fails the test.
    fn available() -> bool {
        if !guest::available() {
            return false;
        }
        let socat = Command::new("socat").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if socat.is_ok_and(|s| s.success()) {
            return true;
        }
        let hint = "./run test installs it (apt-get install socat)";
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true and socat does not run; {hint}");
        eprintln!("SKIPPED: socat does not run, so the guest cannot reach the target; {hint}");
        false
    }

    /// A TCP port on 127.0.0.1 that was free a moment ago.
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("binding 127.0.0.1:0").port()
    }

    /// `nvmf_subsystem_get_controllers` and `_get_qpairs` for [`NQN`].
    fn controllers_and_qpairs(d: &Daemon) -> (Vec<Value>, Vec<Value>) {
        let list = |method: &str| -> Vec<Value> {
            let v = d.call(method, json!({ "nqn": NQN }));
            v.as_array().unwrap_or_else(|| panic!("{method} returned {v}")).clone()
        };
        (list("nvmf_subsystem_get_controllers"), list("nvmf_subsystem_get_qpairs"))
    }

    #[test]
    fn linux_nvme_tcp_host_discovers_connects_verifies_sees_a_resize_and_disconnects() {
        if !available() {
            return;
        }
        let (size, grown) = (64 * MIB, 96 * MIB);
        let d = Daemon::start("0,1");
        d.malloc("ram", size / 512, 512);
        let port = free_port();
        d.call("nvmf_create_transport", json!({ "trtype": "TCP" }));
        d.call(
            "nvmf_create_subsystem",
            json!({ "nqn": NQN, "allow_any_host": true, "serial_number": SERIAL }),
        );
        let nsid =
            d.call("nvmf_subsystem_add_ns", json!({ "nqn": NQN, "namespace": { "bdev_name": "ram" } }));
        assert_eq!(nsid, json!(1), "the first namespace's NSID");
        d.call(
            "nvmf_subsystem_add_listener",
            json!({
                "nqn": NQN,
                "listen_address": {
                    "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()
                }
            }),
        );

        let cfg = VmConfig {
            netdev: Some(port),
            qmp: true,
            kernel_args: vec![format!("fp.nvmf.port={port}"), format!("fp.nvmf.nqn={NQN}")],
            ..VmConfig::new("nvmf", Vec::new())
        };
        let mut vm = Vm::boot(&cfg, d.dir.path());
        vm.wait_for(
            "the resize marker",
            |l| l.contains(&format!("nvmf resize waiting at {size}")),
            BOOT_TIMEOUT,
        );

        // Connected, with fio and ext4 done: one controller of the guest's host NQN, its admin
        // queue and the two I/O queues it asked for (nr_io_queues=2).
        let (ctrls, qpairs) = controllers_and_qpairs(&d);
        assert_eq!(ctrls.len(), 1, "controllers while the guest is connected: {ctrls:?}");
        assert_eq!(ctrls[0]["hostnqn"], json!(HOSTNQN), "{ctrls:?}");
        let cntlid = ctrls[0]["cntlid"].clone();
        let mut qids: Vec<u64> = qpairs.iter().map(|q| q["qid"].as_u64().expect("qid")).collect();
        qids.sort_unstable();
        assert_eq!(qids, [0, 1, 2], "qpairs while the guest is connected: {qpairs:?}");
        assert!(qpairs.iter().all(|q| q["cntlid"] == cntlid), "qpairs of another controller: {qpairs:?}");
        // The two I/O queues are polled on the two reactors (queue i on reactor i mod 2): each
        // names its poll group ("thread", as SPDK's objects do).
        let threads: std::collections::BTreeSet<&str> = qpairs
            .iter()
            .filter(|q| q["qid"] != json!(0))
            .map(|q| q["thread"].as_str().unwrap_or_else(|| panic!("a qpair without its thread: {q}")))
            .collect();
        assert_eq!(threads.len(), 2, "the two I/O qpairs share a poll group: {qpairs:?}");

        // The namespace grows; the guest must see it without doing anything (the asynchronous
        // event, then the changed-namespace log and a rescan).
        assert_eq!(
            d.call("bdev_malloc_resize", json!({ "name": "ram", "new_size_bytes": grown })),
            json!(true)
        );

        // After the resize, the writes past the old end and a disconnect, the guest connects
        // again (KATO 2 s): only that controller is left, with its three queue pairs (the first
        // one's are gone).
        let line = vm.wait_for("the second connect", |l| l.contains("nvmf kato waiting"), BOOT_TIMEOUT);
        let (ctrls, qpairs) = controllers_and_qpairs(&d);
        assert_eq!(ctrls.len(), 1, "controllers after the disconnect and a new connect: {ctrls:?}");
        assert_eq!(qpairs.len(), 3, "qpairs after the disconnect and a new connect: {qpairs:?}");
        assert!(line.ends_with(&format!("cntlid={}", ctrls[0]["cntlid"])), "{line} vs {ctrls:?}");
        // Keep-alive expiry: with the VM stopped no Keep Alive comes, and the target tears the
        // controller down (KATO + its grace); once the VM runs again the kernel reconnects.
        vm.qmp().run("stop", Value::Null);
        let stopped = Instant::now();
        while !controllers_and_qpairs(&d).0.is_empty() {
            assert!(stopped.elapsed() < Duration::from_secs(30), "the controller outlived KATO by 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        let torn_down = stopped.elapsed();
        assert!(torn_down >= Duration::from_secs(2), "torn down {torn_down:?} after the stop, before KATO");
        eprintln!("guest 'nvmf': the target tore the stopped host's controller down after {torn_down:.1?}");
        vm.qmp().run("cont", Value::Null);
        let line = vm.wait_for("the reconnect", |l| l.contains("nvmf kato reconnected"), BOOT_TIMEOUT);
        let (ctrls, qpairs) = controllers_and_qpairs(&d);
        assert_eq!(ctrls.len(), 1, "controllers after the reconnect: {ctrls:?}");
        assert_eq!(qpairs.len(), 3, "qpairs after the reconnect: {qpairs:?}");
        assert!(line.ends_with(&format!("cntlid={}", ctrls[0]["cntlid"])), "{line} vs {ctrls:?}");

        // The subsystem is deleted under the connected host.
        vm.wait_for("the deletion marker", |l| l.contains("nvmf delete waiting"), BOOT_TIMEOUT);
        assert_eq!(d.call("nvmf_delete_subsystem", json!({ "nqn": NQN })), json!(true));
        let subsystems = d.call("nvmf_get_subsystems", Value::Null);
        assert!(
            subsystems.as_array().is_some_and(|s| s.iter().all(|s| s["nqn"] != json!(NQN))),
            "{NQN} is still listed: {subsystems}"
        );

        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        eprintln!("guest 'nvmf': PASS after {:.1?}", r.time);
        let r = vm.whole_result(&r);

        // What the guest saw.
        let entries = r.info_after("nvmf discovered");
        let entry = entries
            .iter()
            .map(|l| l.split_whitespace().filter_map(|w| w.split_once('=')).collect::<HashMap<_, _>>())
            .find(|e| e.get("subnqn") == Some(&NQN))
            .unwrap_or_else(|| panic!("the discovery log does not list {NQN}: {entries:?}"));
        let port_s = port.to_string();
        for (k, v) in [
            ("trtype", "tcp"),
            ("adrfam", "ipv4"),
            ("subtype", "nvme_subsystem"),
            ("traddr", "127.0.0.1"),
            ("trsvcid", &port_s),
        ] {
            assert_eq!(entry.get(k), Some(&v), "discovery entry {k}: {entry:?}");
        }
        let ctrl = r.fields("nvmf ctrl");
        for (k, v) in [("transport", "tcp"), ("queue_count", "3"), ("serial", SERIAL)] {
            assert_eq!(ctrl.get(k).map(String::as_str), Some(v), "controller {k} in the guest: {ctrl:?}");
        }
        assert_eq!(ctrl.get("cntlid").map(String::as_str), Some(cntlid.to_string().as_str()), "{ctrl:?}");
        let disk = r.fields("nvmf disk");
        for (k, v) in [("size", size.to_string()), ("lbs", "512".into()), ("ro", "0".into())] {
            assert_eq!(disk.get(k), Some(&v), "namespace {k} in the guest: {disk:?}");
        }
        let fio = r.fields("nvmf fio");
        for (k, v) in [("status", "0"), ("errors", "0"), ("write_kib", "8192"), ("read_kib", "8192")] {
            assert_eq!(fio.get(k).map(String::as_str), Some(v), "fio {k}: {fio:?}");
        }
        assert_eq!(r.info_after("nvmf ext4 ok").len(), 1, "{:?}", r.info);
        assert_eq!(r.info_after("nvmf resized to"), [grown.to_string()], "{:?}", r.info);
        assert_eq!(r.info_after("nvmf disconnected").len(), 1, "{:?}", r.info);
        // The deletion closed the connections, and the kernel gave the controller up.
        let gone = r.info_after("nvmf gone");
        assert_eq!(gone.len(), 1, "{:?}", r.info);
        eprintln!("guest 'nvmf': after the subsystem's deletion: {}", gone[0]);

        // The RAM disk holds what the guest wrote: a read-only vhost-user-blk controller on the
        // bdev the deleted subsystem released reads it back.
        let sock = d.controller("readback", "ram", Some(1), true);
        let img_bytes = bounded(Duration::from_secs(120), "RAM disk read-back", move || {
            let opts = ClientOpts { read_only: true, ..ClientOpts::default() };
            let mut c =
                BlkClient::connect(&sock, opts).expect("libblkio connect to the read-back controller");
            assert_eq!(c.capacity, grown, "the RAM disk's size after the resize");
            c.read_all(0, grown as usize)
        });
        let ops = r.ops(OPS);
        assert_eq!(ops.len(), 2, "the guest's writes past the old end: {ops:?}");
        for op in &ops {
            let DiskOp::Write { offset, len, seed } = *op else { panic!("unexpected op {op:?}") };
            assert!(offset >= size, "{op:?} is inside the file system");
            let got = &img_bytes[offset as usize..(offset + len) as usize];
            assert_same(
                "a write past the old end, read back from the RAM disk",
                offset,
                got,
                &pattern(seed, offset, len as usize),
            );
        }
        let img = d.dir.path().join("ram.img");
        std::fs::write(&img, &img_bytes).expect("writing the RAM disk's image");
        assert_e2fsck_clean("the file system the guest made over NVMe/TCP", &img);
        assert_same(
            "/fp/pattern.bin",
            0,
            &debugfs_cat(&img, "/fp/pattern.bin"),
            &pattern(51, 0, 3 * MIB as usize),
        );
        assert_same("/fp/direct.bin", 0, &debugfs_cat(&img, "/fp/direct.bin"), &pattern(52, 0, MIB as usize));
        assert_eq!(debugfs_cat(&img, "/fp/hello.txt"), b"written over NVMe/TCP\n");
    }
    /// `nvmf_subsystem_get_listeners`: each listener's port and group 1's ANA state.
    fn ana_states(d: &Daemon, nqn: &str) -> Vec<(String, String)> {
        let v = d.call("nvmf_subsystem_get_listeners", json!({ "nqn": nqn }));
        let listeners = v.as_array().unwrap_or_else(|| panic!("nvmf_subsystem_get_listeners returned {v}"));
        listeners
            .iter()
            .map(|l| {
                let group1 = &l["ana_states"][0];
                assert_eq!(group1["ana_group"], json!(1), "{l}");
                let port = l["address"]["trsvcid"].as_str().unwrap_or_default();
                (port.to_string(), group1["ana_state"].as_str().unwrap_or_default().to_string())
            })
            .collect()
    }

    /// The kernel's native NVMe multipath over two listeners of one subsystem with ANA
    /// reporting (the guest's `nvmf_ana` scenario): one block device with two paths; the first
    /// listener made inaccessible, then optimized again, while fio writes and verifies in a
    /// loop; the kernel's per-path `ana_state` follows and no I/O fails.
    #[test]
    fn linux_multipath_follows_ana_states_of_two_listeners_without_io_errors() {
        if !available() {
            return;
        }
        const ANA_NQN: &str = "nqn.2016-06.io.flashpath:ana";
        let d = Daemon::start("0,1");
        d.malloc("ram", 32 * MIB / 512, 512);
        d.call("nvmf_create_transport", json!({ "trtype": "TCP" }));
        d.call(
            "nvmf_create_subsystem",
            json!({ "nqn": ANA_NQN, "allow_any_host": true, "serial_number": SERIAL, "ana_reporting": true }),
        );
        d.call("nvmf_subsystem_add_ns", json!({ "nqn": ANA_NQN, "namespace": { "bdev_name": "ram" } }));
        let ports = [free_port(), free_port()];
        let address = |port: u16| json!({ "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string() });
        for port in ports {
            d.call("nvmf_subsystem_add_listener", json!({ "nqn": ANA_NQN, "listen_address": address(port) }));
        }
        let set = |state: &str| {
            let params = json!({ "nqn": ANA_NQN, "listen_address": address(ports[0]), "ana_state": state });
            assert_eq!(d.call("nvmf_subsystem_listener_set_ana_state", params), json!(true));
        };

        let cfg = VmConfig {
            netdev: Some(ports[0]),
            netdev_more: vec![ports[1]],
            kernel_args: vec![
                format!("fp.nvmf.port={}", ports[0]),
                format!("fp.nvmf.port2={}", ports[1]),
                format!("fp.nvmf.nqn={ANA_NQN}"),
            ],
            ..VmConfig::new("nvmf_ana", Vec::new())
        };
        let mut vm = Vm::boot(&cfg, d.dir.path());
        vm.wait_for("the first state change", |l| l.contains("nvmf_ana inaccessible waiting"), BOOT_TIMEOUT);
        // Two controllers, one per listener.
        let ctrls = d.call("nvmf_subsystem_get_controllers", json!({ "nqn": ANA_NQN }));
        assert_eq!(ctrls.as_array().map(Vec::len), Some(2), "controllers of the two paths: {ctrls}");
        set("inaccessible");
        let (p0, p1) = (ports[0].to_string(), ports[1].to_string());
        assert_eq!(
            ana_states(&d, ANA_NQN),
            [(p0.clone(), "inaccessible".to_string()), (p1.clone(), "optimized".to_string())]
        );
        vm.wait_for("the second state change", |l| l.contains("nvmf_ana optimized waiting"), BOOT_TIMEOUT);
        set("optimized");

        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        eprintln!("guest 'nvmf_ana': PASS after {:.1?}", r.time);
        let r = vm.whole_result(&r);
        let seen = r.info_after("nvmf_ana paths");
        let both = format!("{p0}=optimized {p1}=optimized");
        let first_down = format!("{p0}=inaccessible {p1}=optimized");
        let down = seen.iter().position(|l| *l == first_down);
        let down = down.unwrap_or_else(|| panic!("the kernel never saw {first_down}: {seen:?}"));
        assert!(seen[..down].contains(&both.as_str()), "both paths optimized before the change: {seen:?}");
        assert_eq!(seen.last(), Some(&both.as_str()), "both paths optimized again at the end: {seen:?}");
        let fio = r.fields("nvmf_ana fio");
        eprintln!("guest 'nvmf_ana': the kernel's paths {seen:?}; fio {fio:?}");
        assert_eq!(fio.get("failed").map(String::as_str), Some("0"), "{fio:?}");
        let runs: u32 = fio.get("runs").and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(runs >= 4, "fio runs {runs}: two whole runs after each state change expected");
    }
}
