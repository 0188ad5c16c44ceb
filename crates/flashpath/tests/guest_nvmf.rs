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
//! Before the resize, with the first subsystem connected, the guest's `nvmf_auth` runs the
//! kernel's DH-HMAC-CHAP against a second subsystem that admits the guest's host NQN with keys
//! only (bidirectional; SHA-512 and ffdhe3072 at the connect): a wrong secret refused, fio
//! verifying over the authenticated queues, then with a verifying fio running the host's and
//! then the controller's key changed on the target (`nvmf_subsystem_set_keys`) and in sysfs,
//! each followed by a re-authentication of every queue of the same controller (the host
//! watches `nvmf_subsystem_get_qpairs`' `auth` objects change hash), and the replaced secret
//! refused at the next connect.
//!
//! NVMe/TCP over TLS 1.3 with PSKs: the guest's `tls` scenario has the kernel's NVMe/TCP
//! host connect to the kernel's own target (nvmet) inside the guest through tlshd, the agent of
//! the kernel's handshake upcall, with the TLS PSK derived on the host by flashpath's code
//! (fp-crypto) from a PSK in the interchange format: a connect without TLS refused, every
//! queue of both sides under kTLS, fio verifying over it, one successful handshake per queue
//! in tlshd's log, and the PSK never on the console. A second boot has the kernel's host
//! connect to flashpath's target over TLS: a secure listener (`secure_channel`), the guest's
//! host listed with `psk` (a keyring key in the interchange format), three queues under kTLS,
//! fio verifying over them; a second host NQN offering a PSK the target does not have, a third
//! the target does not list and a connect without TLS are refused (the daemon logs the host NQN
//! and the kind) while the first host's controller stays live with its data.
//!
//! Four boots in this binary. They run with the other guest tests (`./run test`, one at a
//! time); the module is `guest_vm` so that the step running everything else skips it. Without
//! QEMU or socat it fails under `CI=true` and is skipped elsewhere.

mod common;

mod guest_vm {
    use std::collections::HashMap;
    use std::net::TcpListener;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use serde_json::{json, Value};

    use super::common::guest::ext4::{assert_e2fsck_clean, debugfs_cat};
    use super::common::guest::{
        self, hex, nvme_tls_psk, secret_file, DiskOp, GuestResult, Vm, VmConfig, BOOT_TIMEOUT, EXIT_TIMEOUT,
    };
    use super::common::{assert_same, bounded, pattern, BlkClient, ClientOpts, Daemon};

    const MIB: u64 = 1 << 20;
    const NQN: &str = "nqn.2016-06.io.flashpath:guest";
    const SERIAL: &str = "FPGUEST0001";
    /// The host NQN the guest's init writes to /etc/nvme/hostnqn.
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f1a5c0de-0000-4000-8000-000000000024";
    /// The guest's `op` lines for the namespace name it `nvmf`.
    const OPS: &str = "nvmf";
    /// The subsystem the guest must authenticate to (DH-HMAC-CHAP), over its own RAM disk.
    const AUTH_NQN: &str = "nqn.2016-06.io.flashpath:guest-auth";
    /// DH-HMAC-CHAP secrets as `nvme gen-dhchap-key` writes them: the host's first (SHA-256
    /// transform) and the controller's (48 bytes, SHA-384), their replacements (64 bytes,
    /// SHA-512; 48 bytes, no transform), and one the subsystem never has.
    const HOST_KEY: &str = "DHHC-1:01:sInzpt8zAslrstFcOdfRI+sctNzuJ2aElzqPylPK1q2fVAkx:";
    const CTRL_KEY: &str =
        "DHHC-1:02:+yR/dy1TA2eI+GY4gARWC9YHcke2eLK8TXEsRCmVikLHwAgQwHmbKQ34xGEAeqIg944pQg==:";
    const NEW_HOST_KEY: &str = "DHHC-1:03:HKqiG+usQFvhQJ//yyxt/rZPKTkKi8hCkk8DVEWrlLKUvhqqxQaEMLip0AdBBs595LYTn1cRHJOHydeBdJNEFZcXki0=:";
    const NEW_CTRL_KEY: &str =
        "DHHC-1:00:h228Tirf9r9QlmWusnvqPAISAbBeeFaoHq3P0R1EvHNuBo0dpoMj3dP4L3zsll0j9e/7RQ==:";
    const WRONG_KEY: &str = "DHHC-1:01:M84Yg39eZVGcgz/fM3CVZjMpavVeBz1NcItGYFHjdtkWXpzg:";

    /// [`AUTH_NQN`] over a 16 MiB RAM disk on the listener at `port`, admitting [`HOSTNQN`]
    /// only, with keys from the keyring (files in `dir`); DH-HMAC-CHAP may use SHA-512 and
    /// ffdhe3072 only, so the guest's connect runs in them.
    fn auth_subsystem(d: &Daemon, port: u16, dir: &std::path::Path) {
        for (name, text) in
            [("host0", HOST_KEY), ("ctrl0", CTRL_KEY), ("host1", NEW_HOST_KEY), ("ctrl1", NEW_CTRL_KEY)]
        {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("writing a key file");
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            d.call("keyring_file_add_key", json!({"name": name, "path": path.to_str().unwrap()}));
        }
        d.malloc("ram_auth", 16 * MIB / 512, 512);
        d.call("nvmf_create_subsystem", json!({ "nqn": AUTH_NQN, "allow_any_host": false }));
        d.call("nvmf_subsystem_add_ns", json!({ "nqn": AUTH_NQN, "namespace": { "bdev_name": "ram_auth" } }));
        let listen =
            json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
        d.call("nvmf_subsystem_add_listener", json!({ "nqn": AUTH_NQN, "listen_address": listen }));
        d.call(
            "nvmf_subsystem_add_host",
            json!({ "nqn": AUTH_NQN, "host": HOSTNQN, "dhchap_key": "host0", "dhchap_ctrlr_key": "ctrl0" }),
        );
        d.call("nvmf_set_config", json!({ "dhchap_digests": ["sha512"], "dhchap_dhgroups": ["ffdhe3072"] }));
    }

    /// A queue pair's `auth` object of `nvmf_subsystem_get_qpairs`: (qid, digest, dhgroup,
    /// state), `null`s when it has none.
    type QueueAuth = (u64, Value, Value, Value);

    /// [`AUTH_NQN`]'s controllers (cntlid) and its queues' [`QueueAuth`], by qid.
    fn auth_state(d: &Daemon) -> (Vec<Value>, Vec<QueueAuth>) {
        let ctrls = d.call("nvmf_subsystem_get_controllers", json!({ "nqn": AUTH_NQN }));
        let qpairs = d.call("nvmf_subsystem_get_qpairs", json!({ "nqn": AUTH_NQN }));
        let mut q: Vec<_> = qpairs
            .as_array()
            .unwrap_or_else(|| panic!("nvmf_subsystem_get_qpairs returned {qpairs}"))
            .iter()
            .map(|q| {
                let a = &q["auth"];
                (
                    q["qid"].as_u64().expect("qid"),
                    a["digest"].clone(),
                    a["dhgroup"].clone(),
                    a["state"].clone(),
                )
            })
            .collect();
        q.sort_by_key(|q| q.0);
        (ctrls.as_array().expect("controllers").iter().map(|c| c["cntlid"].clone()).collect(), q)
    }

    /// Waits (120 s at most) until [`AUTH_NQN`] has one controller whose three queues all
    /// show a completed transaction in `digest` and `dhgroup`; returns its cntlid.
    fn await_authenticated(d: &Daemon, digest: &str, dhgroup: &str, what: &str) -> Value {
        let start = Instant::now();
        loop {
            let (ctrls, qpairs) = auth_state(d);
            let want: Vec<_> =
                (0..3).map(|qid| (qid, json!(digest), json!(dhgroup), json!("completed"))).collect();
            if ctrls.len() == 1 && qpairs == want {
                return ctrls[0].clone();
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{what}: after 120 s, controllers {ctrls:?}, queues (qid, digest, dhgroup, state) {qpairs:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The guest's `nvmf_auth` (tests/guest/init): a wrong secret refused, the right ones
    /// connect in SHA-512 / ffdhe3072; then, with a verifying fio running, two key changes,
    /// the host's then the controller's: each time the target gets the new keys
    /// (`nvmf_subsystem_set_keys`) and allows another hash, the guest writes the new secret to
    /// sysfs, and every queue of the same controller must show a transaction in that hash.
    fn dhchap_with_the_kernel(vm: &mut Vm, d: &Daemon) {
        vm.wait_for("the authentication marker", |l| l.contains("nvmf auth waiting"), BOOT_TIMEOUT);
        vm.send_line(&format!("auth {AUTH_NQN} {HOST_KEY} {CTRL_KEY} {WRONG_KEY}"));
        vm.wait_for("the first key change", |l| l.contains("nvmf auth rekey waiting 1"), BOOT_TIMEOUT);
        let cntlid = await_authenticated(d, "sha512", "ffdhe3072", "the guest's connect");
        for (round, which, keys, secret, digest) in [
            (1, "host", ["host1", "ctrl0"], NEW_HOST_KEY, "sha384"),
            (2, "ctrl", ["host1", "ctrl1"], NEW_CTRL_KEY, "sha256"),
        ] {
            if round > 1 {
                vm.wait_for(
                    "the next key change",
                    |l| l.contains(&format!("nvmf auth rekey waiting {round}")),
                    BOOT_TIMEOUT,
                );
            }
            d.call(
                "nvmf_set_config",
                json!({ "dhchap_digests": [digest], "dhchap_dhgroups": ["ffdhe2048"] }),
            );
            d.call(
                "nvmf_subsystem_set_keys",
                json!({ "nqn": AUTH_NQN, "host": HOSTNQN, "dhchap_key": keys[0], "dhchap_ctrlr_key": keys[1] }),
            );
            vm.send_line(&format!("rekey {which} {secret}"));
            let what = format!("re-authentication after the {which} key's change");
            assert_eq!(
                await_authenticated(d, digest, "ffdhe2048", &what),
                cntlid,
                "{what}: another controller"
            );
            vm.send_line("rekeyed");
        }
        vm.wait_for("the end of the authentication steps", |l| l.contains("nvmf auth done"), BOOT_TIMEOUT);
        let (ctrls, _) = auth_state(d);
        assert!(ctrls.is_empty(), "controllers of {AUTH_NQN} after the guest's disconnect: {ctrls:?}");
        eprintln!("guest 'nvmf': DH-HMAC-CHAP: the kernel's host connected, re-authenticated every queue twice under fio");
    }

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

        auth_subsystem(&d, port, d.dir.path());

        let cfg = VmConfig {
            netdev: Some(port),
            qmp: true,
            console_input: true,
            kernel_args: vec![format!("fp.nvmf.port={port}"), format!("fp.nvmf.nqn={NQN}")],
            ..VmConfig::new("nvmf", Vec::new())
        };
        let mut vm = Vm::boot(&cfg, d.dir.path());
        dhchap_with_the_kernel(&mut vm, &d);
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
        // DH-HMAC-CHAP: the wrong and the replaced secrets refused by the kernel's connect,
        // fio over the authenticated queues, and the verifying fio through the key changes
        // (stopped by SIGTERM: status 128, no error, data verified).
        for what in ["wrong secret", "old secret"] {
            let refused = r.info_after(&format!("nvmf auth {what} refused"));
            assert_eq!(refused.len(), 1, "{what}: {:?}", r.info);
            eprintln!("guest 'nvmf': a connect with the {what}: {}", refused[0]);
        }
        let fio = r.fields("nvmf auth fio");
        for (k, v) in [("status", "0"), ("errors", "0"), ("write_kib", "4096"), ("read_kib", "4096")] {
            assert_eq!(
                fio.get(k).map(String::as_str),
                Some(v),
                "fio over the authenticated queues, {k}: {fio:?}"
            );
        }
        let fio = r.fields("nvmf auth rekey fio");
        assert_eq!(fio.get("status").map(String::as_str), Some("128"), "{fio:?}");
        assert_eq!(fio.get("errors").map(String::as_str), Some("0"), "{fio:?}");
        let verified: u64 = fio.get("read_kib").and_then(|v| v.parse().ok()).unwrap_or(0);
        assert!(verified > 0, "the fio through the key changes verified nothing: {fio:?}");
        eprintln!("guest 'nvmf': fio through the key changes: {fio:?}");
        assert_eq!(r.info_after("nvmf auth same controller").len(), 1, "{:?}", r.info);
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
    /// listener made inaccessible, then optimized again, then the second listener removed
    /// (its controller's connections close; the kernel keeps reconnecting) and added back
    /// non-optimized (the kernel reconnects on its own), while fio writes and verifies in a
    /// loop; the kernel's paths (`nvme list-subsys`: controller state and ANA state) follow
    /// and no I/O fails.
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
        vm.wait_for("the listener's removal", |l| l.contains("nvmf_ana remove waiting"), BOOT_TIMEOUT);
        let removed = json!({ "nqn": ANA_NQN, "listen_address": address(ports[1]) });
        assert_eq!(d.call("nvmf_subsystem_remove_listener", removed), json!(true));
        assert_eq!(ana_states(&d, ANA_NQN), [(p0.clone(), "optimized".to_string())]);
        // The second path's controller went with its listener (its queues close once their
        // commands are answered); the kernel's reconnects find no listener.
        let controllers = || d.call("nvmf_subsystem_get_controllers", json!({ "nqn": ANA_NQN }));
        let end = Instant::now() + Duration::from_secs(30);
        while controllers().as_array().map(Vec::len) != Some(1) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(controllers().as_array().map(Vec::len), Some(1), "after the removal: {}", controllers());
        vm.wait_for("the listener's return", |l| l.contains("nvmf_ana add waiting"), BOOT_TIMEOUT);
        let added =
            json!({ "nqn": ANA_NQN, "listen_address": address(ports[1]), "ana_state": "non_optimized" });
        assert_eq!(d.call("nvmf_subsystem_add_listener", added), json!(true));
        assert_eq!(
            ana_states(&d, ANA_NQN),
            [(p0.clone(), "optimized".to_string()), (p1.clone(), "non_optimized".to_string())]
        );

        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        eprintln!("guest 'nvmf_ana': PASS after {:.1?}", r.time);
        let r = vm.whole_result(&r);
        // The guest lists paths ordered by port as text; compare them by port.
        let by_port = |line: &str| -> HashMap<String, String> {
            line.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(p, v)| (p.into(), v.into()))
                .collect()
        };
        let paths =
            |a: &str, b: &str| HashMap::from([(p0.clone(), a.to_string()), (p1.clone(), b.to_string())]);
        let seen: Vec<HashMap<String, String>> =
            r.info_after("nvmf_ana paths").into_iter().map(by_port).collect();
        let (both, first_down) = (paths("optimized", "optimized"), paths("inaccessible", "optimized"));
        let down = seen.iter().position(|l| *l == first_down);
        let down = down.unwrap_or_else(|| panic!("the kernel never saw {first_down:?}: {seen:?}"));
        assert!(seen[..down].contains(&both), "both paths optimized before the change: {seen:?}");
        assert!(seen[down..].contains(&both), "both paths optimized again: {seen:?}");
        let back = paths("optimized", "non-optimized");
        assert_eq!(seen.last(), Some(&back), "the second path back, non-optimized: {seen:?}");
        // `nvme list-subsys` after each step: controller state / ANA state per path.
        let subsys: Vec<HashMap<String, String>> =
            r.info_after("nvmf_ana subsys").into_iter().map(by_port).collect();
        let steps = [
            ("live/optimized", "live/optimized"),
            ("live/inaccessible", "live/optimized"),
            ("live/optimized", "live/optimized"),
            ("live/optimized", "connecting/"),
            ("live/optimized", "live/non-optimized"),
        ];
        assert_eq!(subsys.len(), steps.len(), "one list-subsys line per step: {subsys:?}");
        for (shown, (a, b)) in subsys.iter().zip(steps) {
            // A reconnecting path shows the ANA state it last read, if any: its prefix is
            // what counts.
            let ok = shown.len() == 2
                && shown.get(&p0).is_some_and(|s| s == a)
                && shown.get(&p1).is_some_and(|s| if b.ends_with('/') { s.starts_with(b) } else { s == b });
            assert!(ok, "nvme list-subsys showed {shown:?}, expected {p0}={a} {p1}={b}");
        }
        let fio = r.fields("nvmf_ana fio");
        eprintln!("guest 'nvmf_ana': the kernel's paths {seen:?}; list-subsys {subsys:?}; fio {fio:?}");
        assert_eq!(fio.get("failed").map(String::as_str), Some("0"), "{fio:?}");
        let runs: u32 = fio.get("runs").and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(runs >= 8, "fio runs {runs}: two whole runs after each of the four steps expected");
    }

    /// The PSK of the TLS steps in the interchange format, as `nvme gen-tls-key --hmac=1`
    /// writes it (SHA-256: TLS_AES_128_GCM_SHA256, identities `NVMe0R01 ...`).
    const TLS_PSK: &str = "NVMeTLSkey-1:01:RiRzRT3uqVaBbdYtZXMrn5RNK2iGEfbZ9xEiR9tw0vFYpNcO:";
    /// The subsystem the guest's nvmet serves over TLS to the guest's own host.
    const K2K_NQN: &str = "nqn.2016-06.io.flashpath:tls-k2k";

    /// The guest's lines of a TLS connect (`tls PART ...`): a live controller over TCP with
    /// three queues whose TLS key (sysfs `tls_key`, hex) is the one the guest inserted,
    /// `sockets` sockets with kTLS in software both ways while connected, and fio status 0 with
    /// no error after 8 MiB written and verified.
    fn check_tls_connect(r: &GuestResult, part: &str, sockets: u32) {
        let key = r.fields(&format!("tls {part} psk"));
        let ctrl = r.fields(&format!("tls {part} ctrl"));
        eprintln!("guest 'tls' {part}: the controller {ctrl:?}");
        for (k, v) in [("transport", "tcp"), ("state", "live"), ("queue_count", "3")] {
            assert_eq!(ctrl.get(k).map(String::as_str), Some(v), "{part}: controller {k}: {ctrl:?}");
        }
        let inserted: u32 = key.get("key").and_then(|k| k.parse().ok()).unwrap_or_else(|| panic!("{key:?}"));
        assert_eq!(ctrl.get("tls_key"), Some(&format!("{inserted:08x}")), "{part}: {ctrl:?} vs {key:?}");
        let stat = r.fields(&format!("tls {part} tls_stat"));
        eprintln!("guest 'tls' {part}: /proc/net/tls_stat while connected {stat:?}");
        for k in ["TlsCurrTxSw", "TlsCurrRxSw"] {
            assert_eq!(stat.get(k), Some(&sockets.to_string()), "{part}: {k}: {stat:?}");
        }
        let fio = r.fields(&format!("tls {part} fio"));
        for (k, v) in [("status", "0"), ("errors", "0"), ("write_kib", "8192"), ("read_kib", "8192")] {
            assert_eq!(fio.get(k).map(String::as_str), Some(v), "{part}: fio over TLS, {k}: {fio:?}");
        }
    }

    /// tlshd's handshake counts the guest reported as `tls PART handshakes WHEN ok=N
    /// failed=M`: (N, M).
    fn handshake_counts(r: &GuestResult, part: &str, when: &str) -> (u32, u32) {
        let f = r.fields(&format!("tls {part} handshakes {when}"));
        let n =
            |k: &str| f.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{part} {when}: {f:?}"));
        (n("ok"), n("failed"))
    }

    /// The kernel's NVMe/TCP host and target inside one guest over TLS 1.3 through tlshd (the
    /// guest's `tls` scenario): proves the image's tlshd, kernel modules and keyring handling
    /// before flashpath takes either side. The TLS PSK comes from flashpath's derivation and
    /// reaches the guest in the initramfs, never on the console.
    #[test]
    fn linux_host_and_nvmet_connect_over_tls_through_tlshd() {
        if !guest::available() {
            return;
        }
        let dir = tempfile::Builder::new().prefix("fp-guest-tls-").tempdir().expect("a temporary directory");
        let psk = nvme_tls_psk(TLS_PSK, HOSTNQN, K2K_NQN);
        assert_eq!(psk.len(), 32, "a SHA-256 TLS PSK");
        let psk_file = secret_file(dir.path(), "k2k.psk", &psk);
        let cfg = VmConfig {
            kernel_args: vec![format!("fp.tls.nqn={K2K_NQN}")],
            extra_files: vec![(psk_file, "/tls/k2k.psk".into())],
            ..VmConfig::new("tls", Vec::new())
        };
        let mut vm = Vm::boot(&cfg, dir.path());
        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        eprintln!("guest 'tls': PASS after {:.1?}", r.time);
        let console = vm.console();
        assert!(!console.to_lowercase().contains(&hex(&psk)), "the TLS PSK is on the console");
        // tlshd's own log reaches the console (its lines are what tells a failed handshake).
        assert!(
            console.lines().any(|l| l.starts_with("tlshd[") && l.ends_with("was successful")),
            "no tlshd log line on the console"
        );

        let tlshd = r.fields("tls tlshd");
        eprintln!("guest 'tls': tlshd {tlshd:?}");
        let nvmet = r.fields("tls k2k nvmet ready");
        assert_eq!(nvmet.get("tsas").map(String::as_str), Some("tls1.3"), "{nvmet:?}");
        assert_eq!(nvmet.get("treq").map(String::as_str), Some("required"), "{nvmet:?}");
        let plain = r.info_after("tls k2k plain refused");
        assert_eq!(plain.len(), 1, "{:?}", r.info);
        eprintln!("guest 'tls': a connect without TLS: {}", plain[0]);
        // Three queues (admin and two I/O) on each side, each socket with kTLS in software
        // both ways.
        check_tls_connect(&r, "k2k", 6);
        // tlshd's handshakes: the connect without TLS failed in the target's (nvmet handed
        // its plain ICReq to tlshd as a ClientHello), then one success per queue on each side
        // and no failure.
        let count = |when: &str| handshake_counts(&r, "k2k", when);
        let (before, after) = (count("before"), count("after"));
        eprintln!(
            "guest 'tls': tlshd's handshakes (ok, failed) before the TLS connect {before:?}, after {after:?}"
        );
        assert_eq!(before.0, 0, "successful handshakes before the TLS connect");
        assert_eq!((after.0 - before.0, after.1 - before.1), (6, 0), "the TLS connect's handshakes");
    }

    /// The flashpath subsystem the guest's kernel host reaches over TLS.
    const FP_TLS_NQN: &str = "nqn.2016-06.io.flashpath:tls";
    /// A second host of [`FP_TLS_NQN`] (the guest's init: `TLS_HOSTNQN2`), listed with
    /// [`TLS_PSK2`]; the guest offers a TLS PSK derived from [`WRONG_TLS_PSK`] for it.
    const TLS_HOSTNQN2: &str = "nqn.2014-08.org.nvmexpress:uuid:f1a5c0de-0000-4000-8000-000000000026";
    const TLS_PSK2: &str = "NVMeTLSkey-1:01:FRuydB66guRujhyGEJiA76Ke5KpDjeSzXiSpA6rQYCPAT4IS:";
    const WRONG_TLS_PSK: &str = "NVMeTLSkey-1:01:pVYTjbxf3fmUNnN1MMj/ooQGITJlrrl+BjLQSDAvpJ/6dCEX:";
    /// A host NQN [`FP_TLS_NQN`] does not list (the guest's init: `TLS_HOSTNQN3`); the guest
    /// has a TLS PSK for it and tries a connect with TLS and one without.
    const TLS_HOSTNQN3: &str = "nqn.2014-08.org.nvmexpress:uuid:f1a5c0de-0000-4000-8000-000000000027";

    /// The kernel's NVMe/TCP host against flashpath's target over TLS 1.3 (the guest's `tls`
    /// scenario, `tls_fp`): a secure listener (`secure_channel`), the guest's host listed with
    /// a PSK (`psk`, a keyring key in the interchange format) and a second host with another;
    /// the guest's tlshd does the host's handshakes with the TLS PSKs derived from them by
    /// flashpath's code. The TLS connect gets three queues under kTLS and fio verifies over
    /// them; the second host NQN offering a PSK the target does not have, a third host NQN the
    /// target does not list and a connect without TLS are refused, the daemon logs each with
    /// the host NQN (when the identity named one) and the kind, and the first host's controller
    /// stays live with its data.
    #[test]
    fn linux_host_connects_to_flashpath_over_tls_and_bad_hosts_are_refused() {
        if !available() {
            return;
        }
        let mut d = Daemon::start("0,1");
        d.malloc("ram_tls", 32 * MIB / 512, 512);
        d.call("nvmf_create_transport", json!({ "trtype": "TCP" }));
        d.call(
            "nvmf_create_subsystem",
            json!({ "nqn": FP_TLS_NQN, "allow_any_host": false, "serial_number": SERIAL }),
        );
        d.call(
            "nvmf_subsystem_add_ns",
            json!({ "nqn": FP_TLS_NQN, "namespace": { "bdev_name": "ram_tls" } }),
        );
        for (name, text) in [("tls-host", TLS_PSK), ("tls-host2", TLS_PSK2)] {
            let path = secret_file(d.dir.path(), name, text.as_bytes());
            d.call("keyring_file_add_key", json!({"name": name, "path": path.to_str().unwrap()}));
        }
        for (host, key) in [(HOSTNQN, "tls-host"), (TLS_HOSTNQN2, "tls-host2")] {
            d.call("nvmf_subsystem_add_host", json!({ "nqn": FP_TLS_NQN, "host": host, "psk": key }));
        }
        let port = free_port();
        let listen =
            json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
        d.call(
            "nvmf_subsystem_add_listener",
            json!({ "nqn": FP_TLS_NQN, "listen_address": listen, "secure_channel": true }),
        );
        let listeners = d.call("nvmf_subsystem_get_listeners", json!({ "nqn": FP_TLS_NQN }));
        assert_eq!(listeners[0]["secure_channel"], json!(true), "{listeners}");

        let psk = nvme_tls_psk(TLS_PSK, HOSTNQN, FP_TLS_NQN);
        let wrong = nvme_tls_psk(WRONG_TLS_PSK, TLS_HOSTNQN2, FP_TLS_NQN);
        let unknown = nvme_tls_psk(TLS_PSK, TLS_HOSTNQN3, FP_TLS_NQN);
        let files = [("fp.psk", &psk), ("fp-wrong.psk", &wrong), ("fp-unknown.psk", &unknown)]
            .map(|(name, bytes)| (secret_file(d.dir.path(), name, bytes), format!("/tls/{name}")));
        let cfg = VmConfig {
            netdev: Some(port),
            kernel_args: vec![format!("fp.tls.fpnqn={FP_TLS_NQN}"), format!("fp.nvmf.port={port}")],
            extra_files: files.to_vec(),
            name: Some("tls-fp".into()),
            ..VmConfig::new("tls", Vec::new())
        };
        let mut vm = Vm::boot(&cfg, d.dir.path());
        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        eprintln!("guest 'tls' (flashpath's target): PASS after {:.1?}", r.time);
        let console = vm.console().to_lowercase();
        for (what, bytes) in
            [("the TLS PSK", &psk), ("the wrong TLS PSK", &wrong), ("the unknown host's", &unknown)]
        {
            assert!(!console.contains(&hex(bytes)), "{what} is on the console");
        }

        // The guest's three sockets (the target is on the host) under kTLS both ways.
        check_tls_connect(&r, "fp", 3);
        let count = |when: &str| handshake_counts(&r, "fp", when);
        let (before, connected, after) = (count("before"), count("connected"), count("after"));
        eprintln!("guest 'tls': tlshd's handshakes (ok, failed): before {before:?}, connected {connected:?}, after {after:?}");
        assert_eq!((connected.0 - before.0, connected.1 - before.1), (3, 0), "the TLS connect's handshakes");
        assert_eq!(after.0, connected.0, "a handshake succeeded after the first connect");
        // The wrong PSK's and the unknown host's handshakes failed; the plain connect had none.
        assert_eq!(after.1, connected.1 + 2, "tlshd's failed handshakes: {after:?}");
        for what in ["wrong-psk", "unknown-host", "plain"] {
            let refused = r.info_after(&format!("tls fp refused {what}"));
            assert_eq!(refused.len(), 1, "{what}: {:?}", r.info);
            eprintln!("guest 'tls': the connect {what}: {}", refused[0]);
        }
        assert_eq!(r.info_after("tls fp first host unaffected").len(), 1, "{:?}", r.info);

        // The daemon refused each by the host NQN the identity named (when there was one) and
        // the kind, never the first host, and goes on.
        let log = d.stderr();
        for (host, kind) in [
            (Some(TLS_HOSTNQN2), "wrong PSK"),
            (Some(TLS_HOSTNQN3), "unknown PSK identity"),
            (None, "TLS protocol error"),
        ] {
            let line = log
                .lines()
                .find(|l| l.contains("TLS handshake refused") && l.contains(kind))
                .unwrap_or_else(|| panic!("no refused TLS handshake '{kind}' in the daemon's log:\n{log}"));
            eprintln!("guest 'tls': the daemon logged: {line}");
            if let Some(host) = host {
                assert!(line.contains(&format!("host {host}:")), "{line}");
            }
        }
        assert!(
            !log.lines()
                .any(|l| l.contains("TLS handshake refused") && l.contains(&format!("host {HOSTNQN}:"))),
            "the first host was refused:\n{log}"
        );
        d.assert_alive();
        let ctrls = d.call("nvmf_subsystem_get_controllers", json!({ "nqn": FP_TLS_NQN }));
        assert_eq!(ctrls, json!([]), "controllers after the guest's disconnect");
    }
}
