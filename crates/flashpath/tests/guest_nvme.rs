//! NVMe in the TCG guest (tests/guest/, docs/guest-tests.md): QEMU's emulated NVMe controller
//! on a raw image, behind an emulated IOMMU (q35, `intel-iommu`, the guest's `intel_iommu=on`),
//! and the Linux kernel's NVMe/TCP target (nvmet over configfs) reached from the host's
//! loopback through a `hostfwd` on a `restrict=on` user network. The guest's `nvme` scenario
//! (tests/guest/init) writes a pattern through the kernel's nvme driver, hands the function to
//! vfio-pci (its IOMMU group's /dev/vfio/N appears), runs flashpath's driver on it (fp-nvme's
//! examples `nvme_guest` and `vfio_bdev`, which this test puts in the guest: the kernel's
//! pattern found, the bdev conformance suite, I/O from registered buffers without a bounce, two
//! controller resets under verified I/O, a pattern region across a detach and a second
//! attach), configures nvmet-tcp on a file in its RAM and then takes the host's commands on the
//! console. Before that, flashpath itself runs in the guest on the function: `flashpath serve`,
//! `flashpath nvme attach` (PCIe), the namespace over vhost-user to fp-load writing at random
//! at QD32 while the controller is reset (no request fails), detach, attach again, and fp-load's
//! random reads at QD32 with nothing bounced (the client's memory is mapped for the device). At
//! QD32 the doorbell writes per I/O of the kernel's driver (fio) and of flashpath's (fp-load
//! through the daemon) are counted from QEMU's trace between console handshakes and printed.
//!
//! The guest's binaries are this build's (`flashpath`, `target/<profile>/fp-load` and
//! `examples/`), which `cargo test --workspace` builds; run alone, the test needs
//! `cargo build -p fp-loadgen --bin fp-load -p fp-nvme --example nvme_guest --example vfio_bdev`
//! first.
//!
//! The host checks that the guest's NVMe/TCP target answers an Initialize Connection Request
//! on the forwarded port, then connects to it with the tests' minimal NVMe/TCP host
//! (common/nvme_tcp.rs), reads the pattern the guest put in the namespace's file and writes
//! one the guest then finds there; then flashpath's own initiator (a daemon on the host,
//! `bdev_nvme_attach_controller` over TCP) serves the namespace over vhost-user to a libblkio
//! client: verified random I/O, a pattern region read again after
//! `bdev_nvme_reset_controller`, a detach, and the guest finds the region in the file; then
//! DH-HMAC-CHAP against nvmet, and TLS: the guest's nvmet port takes TLS 1.3 only (tlshd, the
//! TLS PSK derived by flashpath's code in the `.nvme` keyring), flashpath's initiator is refused
//! without `psk` and with it attaches, runs verified I/O and writes a region the guest then
//! finds in the file. After
//! QEMU exited: flashpath's driver's pattern region in the raw image, and QEMU's doorbell trace
//! events against the driver's own doorbell count.
//!
//! One boot in this binary. It runs with the other guest tests (`./run test`, one at a time);
//! the module is `guest_vm` so that the step running everything else skips it. Without QEMU it
//! fails under `CI=true` and is skipped elsewhere.

mod common;

mod guest_vm {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    use super::common::guest::{
        self, count_doorbells, nvme_tls_psk, secret_file, DiskOp, NvmeDevice, Vm, VmConfig, EXIT_TIMEOUT,
    };
    use super::common::nbd::free_port;
    use super::common::nvme_tcp::Host;
    use super::common::{
        assert_same, bounded, pattern, random_write_verify, rpc_call, BlkClient, Daemon, RpcError,
    };
    use serde_json::json;

    const MIB: u64 = 1 << 20;
    const SERIAL: &str = "FPNVME0001";
    const NQN: &str = "nqn.2016-06.io.flashpath:guest-nvmet";
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f1a5c0de-0000-4000-8000-000000000025";
    /// The guest's `op` lines for the emulated controller's namespace.
    const OPS: &str = "nvme";
    /// The pattern region flashpath's driver writes in the guest (init's `nvme` scenario).
    const DRIVER_REGION: (u64, u64, u64) = (8 * MIB, MIB, 63);
    /// The region flashpath's NVMe/TCP initiator writes on the guest's nvmet namespace.
    const TCP_REGION: (u64, u64, u64) = (12 * MIB, MIB, 64);
    /// DH-HMAC-CHAP secrets (`DHHC-1`, as `nvme gen-dhchap-key` writes them): the host's
    /// (transformed with SHA-256), the controller's (48 bytes, SHA-384) and one the subsystem
    /// does not have.
    const HOST_KEY: &str = "DHHC-1:01:AQgPFh0kKzI5QEdOVVxjanF4f4aNlJuiqbC3vsXM09pl1OOC:";
    const CTRL_KEY: &str =
        "DHHC-1:02:Aw4ZJC86RVBbZnF8h5KdqLO+ydTf6vUACxYhLDdCTVhjbnmEj5qlsLvG0dzn8v0I2Am4Nw==:";
    const WRONG_KEY: &str = "DHHC-1:01:CQ4TGB0iJywxNjtARUpPVFleY2htcnd8gYaLkJWan6TDcoGq:";
    /// The host's next key (`bdev_nvme_set_keys`).
    const NEXT_KEY: &str = "DHHC-1:01:AwoRGB8mLTQ7QklQV15lbHN6gYiPlp2kq7K5wMfO1dyVhg6h:";
    /// The region written and verified while the keys change: (offset, length).
    const REKEY_REGION: (u64, usize) = (14 * MIB, 256 << 10);

    /// `bdev_nvme_attach_controller` `name` of the guest's subsystem on `port` (forwarded to
    /// its nvmet) as [`HOSTNQN`], with the `extra` parameters (keys, a PSK).
    fn attach_guest(
        d: &Daemon,
        port: u16,
        name: &str,
        extra: serde_json::Value,
    ) -> Result<serde_json::Value, RpcError> {
        let mut p = json!({
            "name": name, "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string(), "subnqn": NQN, "hostnqn": HOSTNQN
        });
        p.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
        d.try_call("bdev_nvme_attach_controller", p)
    }

    /// The guest's nvmet then admits [`HOSTNQN`] only, with DH-HMAC-CHAP (SHA-384, ffdhe2048,
    /// bidirectional): flashpath's initiator without a key and with a wrong one is refused by
    /// name, with the keys it authenticates every queue and reads the region it wrote before.
    fn dhchap_against_the_kernel(vm: &mut Vm, d: &Daemon, port: u16) {
        vm.send_line(&format!("auth {HOSTNQN} {HOST_KEY} {CTRL_KEY} hmac(sha384) ffdhe2048"));
        vm.wait_for("the guest's DH-HMAC-CHAP host", |l| l.contains("nvme nvmet auth ready"), GUEST_DEADLINE);
        let keys = tempfile::tempdir().expect("tempdir");
        for (name, text) in
            [("host0", HOST_KEY), ("ctrl0", CTRL_KEY), ("wrong0", WRONG_KEY), ("host1", NEXT_KEY)]
        {
            let path = keys.path().join(name);
            std::fs::write(&path, text).expect("writing a key file");
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            d.call("keyring_file_add_key", json!({"name": name, "path": path.to_str().unwrap()}));
        }
        let attach = |keys: serde_json::Value| attach_guest(d, port, "Auth0", keys);
        let e = attach(json!({})).unwrap_err();
        assert!(e.message.contains("no dhchap_key was given"), "without a key: {e:?}");
        let e = attach(json!({"dhchap_key": "wrong0"})).unwrap_err();
        assert!(refused_response(&e.message), "with a wrong key: {e:?}");
        assert_eq!(d.call("bdev_nvme_get_controllers", json!({})), json!([]));
        let names = attach(json!({"dhchap_key": "host0", "dhchap_ctrlr_key": "ctrl0"}))
            .unwrap_or_else(|e| panic!("with the keys: {e:?}"));
        assert_eq!(names, json!(["Auth0n1"]));
        let sock = d.controller("vhost.auth", "Auth0n1", Some(1), false);
        let (roff, rlen, rseed) = TCP_REGION;
        let path = sock.clone();
        bounded(Duration::from_secs(120), "reading through an authenticated controller", move || {
            let mut c = BlkClient::open(&path, 1);
            let want = pattern(rseed, roff, rlen as usize);
            assert_same(
                "the region read over authenticated queues",
                roff,
                &c.read_all(roff, rlen as usize),
                &want,
            );
        });
        let rounds = rekey_under_io(vm, d, &sock);
        d.call("vhost_delete_controller", json!({"ctrlr": "vhost.auth"}));
        // A key the subsystem does not have: refused, saying why; the controller then fails
        // to reconnect with it and is detached. The data is unharmed: attached again with the
        // right keys, the region reads back as last written.
        let e = d
            .try_call(
                "bdev_nvme_set_keys",
                json!({"name": "Auth0", "dhchap_key": "wrong0", "dhchap_ctrlr_key": "ctrl0"}),
            )
            .unwrap_err();
        assert!(e.message.contains("Auth0") && refused_response(&e.message), "{e:?}");
        assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Auth0"})), json!(true));
        attach(json!({"dhchap_key": "host1", "dhchap_ctrlr_key": "ctrl0"}))
            .unwrap_or_else(|e| panic!("with the new keys: {e:?}"));
        let sock = d.controller("vhost.auth", "Auth0n1", Some(1), false);
        bounded(Duration::from_secs(120), "reading after a refused key", move || {
            let (off, len) = REKEY_REGION;
            let mut c = BlkClient::open(&sock, 1);
            assert_same(
                "the region after a refused key",
                off,
                &c.read_all(off, len),
                &rekey_pattern(rounds - 1),
            );
        });
        d.call("vhost_delete_controller", json!({"ctrlr": "vhost.auth"}));
        assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Auth0"})), json!(true));
        eprintln!("guest 'nvme': DH-HMAC-CHAP against the kernel's nvmet: refused without a key and with a wrong one, bidirectional with the keys, keys changed under I/O ({rounds} rounds verified), a wrong new key refused and the data unharmed");
    }

    /// The host's PSK for the TLS step, in the interchange format (`nvme gen-tls-key
    /// --hmac=1`).
    const TLS_PSK: &str = "NVMeTLSkey-1:01:CJych5tv/ATxBQO2Ts2SHSNg7On5BmzOaZcpd3P2gKyjYJnj:";
    /// The region flashpath's initiator writes over TLS on the guest's nvmet namespace.
    const TLS_REGION: (u64, u64, u64) = (13 * MIB, 512 << 10, 66);

    /// The guest's nvmet then takes TLS 1.3 only on its port (tlshd with the TLS PSK of
    /// [`HOSTNQN`] for the subsystem, derived by flashpath's code, in the `.nvme` keyring):
    /// flashpath's initiator without a PSK is refused; with `psk` (a keyring key holding
    /// [`TLS_PSK`]) it attaches, verified random I/O runs and a pattern region is written over
    /// TLS, which the guest then finds in the namespace's file; the guest's tlshd logged a
    /// successful handshake per queue.
    fn tls_against_the_kernel(vm: &mut Vm, d: &Daemon, port: u16) {
        vm.send_line(&format!("tls {HOSTNQN}"));
        let ready =
            vm.wait_for("the guest's TLS port", |l| l.contains("nvme nvmet tls ready"), GUEST_DEADLINE);
        assert!(ready.contains("tsas=tls1.3") && ready.contains("treq=required"), "{ready}");
        let keys = tempfile::tempdir().expect("tempdir");
        let path = secret_file(keys.path(), "tls0", TLS_PSK.as_bytes());
        d.call("keyring_file_add_key", json!({"name": "tls0", "path": path.to_str().unwrap()}));
        let attach = |extra: serde_json::Value| attach_guest(d, port, "Tls0", extra);
        let e = attach(json!({})).expect_err("an attach without TLS to a port that requires it");
        eprintln!("guest 'nvme': without a PSK: {}", e.message);
        assert_eq!(d.call("bdev_nvme_get_controllers", json!({})), json!([]));
        vm.send_line("tlsstat");
        let plain =
            vm.wait_for("tlshd's counts", |l| l.contains("nvme nvmet tls handshakes"), GUEST_DEADLINE);
        assert_eq!(handshakes(&plain).0, 0, "a handshake succeeded without a PSK: {plain}");
        let names = attach(json!({"psk": "tls0"})).unwrap_or_else(|e| panic!("with the PSK: {e:?}"));
        assert_eq!(names, json!(["Tls0n1"]));
        let c = d.call("bdev_nvme_get_controllers", json!({"name": "Tls0"}));
        assert_eq!(c[0]["ctrlrs"][0]["state"], "enabled", "{c}");
        assert_eq!(c[0]["ctrlrs"][0]["psk"], "tls0", "{c}");
        // While attached: every queue's socket in the guest under kTLS.
        vm.send_line("tlsstat");
        let attached =
            vm.wait_for("tlshd's counts", |l| l.contains("nvme nvmet tls handshakes"), GUEST_DEADLINE);
        let sock = d.controller("vhost.tls", "Tls0n1", Some(1), false);
        let (roff, rlen, rseed) = TLS_REGION;
        let compared = bounded(Duration::from_secs(120), "I/O over TLS", move || {
            let mut c = BlkClient::open(&sock, 1);
            assert_eq!(c.capacity, NVMET_SIZE, "the namespace's size over TLS");
            let compared = random_write_verify(&mut c, 81, 4, 4 * MIB, 4 * MIB, None);
            let want = pattern(rseed, roff, rlen as usize);
            c.write_all(roff, &want);
            assert_same("the region read back over TLS", roff, &c.read_all(roff, rlen as usize), &want);
            compared
        });
        d.call("vhost_delete_controller", json!({"ctrlr": "vhost.tls"}));
        assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Tls0"})), json!(true));
        guest_verify(vm, roff, rlen, rseed);
        let (ok, failed, stat) = handshakes(&attached);
        let (_, failed0, _) = handshakes(&plain);
        eprintln!("guest 'nvme': TLS against the kernel's nvmet: {compared} bytes compared; the guest's tlshd: {ok} handshakes ok, {failed} failed; {stat:?}");
        assert!(failed0 >= 1, "the attach without a PSK failed no handshake in the guest: {plain}");
        // The attach connected the admin queue and at least one I/O queue, each through a
        // handshake (the port takes nothing else); the initiator closes I/O queues it no
        // longer needs, so fewer sockets may be open than handshakes were made.
        assert!(ok >= 2 && failed == failed0, "the attach's handshakes (admin and I/O queues): {attached}");
        let sockets = stat.get("TlsCurrTxSw").and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
        assert!(sockets >= 1 && sockets <= ok, "kTLS sockets while attached: {attached}");
    }

    /// The guest's nvmet namespace file must hold pattern `seed` over `[off, off + len)`.
    fn guest_verify(vm: &mut Vm, off: u64, len: u64, seed: u64) {
        vm.send_line(&format!("verify {off} {len} {seed}"));
        vm.wait_for(
            "the guest's verify",
            |l| l.contains(&format!("nvme nvmet verified {off} ")),
            GUEST_DEADLINE,
        );
    }

    /// A `tlsstat` line: (successful handshakes, failed ones, the other `key=value` words).
    fn handshakes(line: &str) -> (u32, u32, std::collections::HashMap<String, String>) {
        let words: std::collections::HashMap<String, String> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let n =
            |k: &str| words.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{k} in {line}"));
        (n("ok"), n("failed"), words)
    }

    /// Whether an error says the controller refused the host's DH-HMAC-CHAP response: by
    /// AUTH_Failure1, or by closing the connection (nvmet fails the controller once it refused,
    /// and the connection may close before its Failure1 is sent).
    fn refused_response(message: &str) -> bool {
        message.contains("refused the host's response")
            || message.contains("closed the connection after the host's response")
    }

    /// What round `r` of [`rekey_under_io`] writes.
    fn rekey_pattern(r: u64) -> Vec<u8> {
        pattern(100 + r, REKEY_REGION.0, REKEY_REGION.1)
    }

    /// nvmet gets the host's next key and `bdev_nvme_set_keys` gives flashpath the same while
    /// a client writes and verifies [`REKEY_REGION`] over the controller's queues (which
    /// authenticate again in band, without a reset): no I/O fails. Returns the rounds verified.
    fn rekey_under_io(vm: &mut Vm, d: &Daemon, sock: &std::path::Path) -> u64 {
        vm.send_line(&format!("rekey {HOSTNQN} {NEXT_KEY}"));
        vm.wait_for("the guest's new host key", |l| l.contains("nvme nvmet rekeyed"), GUEST_DEADLINE);
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
        let (stop, rounds) =
            (std::sync::Arc::new(AtomicBool::new(false)), std::sync::Arc::new(AtomicU64::new(0)));
        let (stop2, rounds2, sock) = (stop.clone(), rounds.clone(), sock.to_path_buf());
        let io = std::thread::spawn(move || {
            let (off, len) = REKEY_REGION;
            let mut c = BlkClient::open(&sock, 1);
            let mut r = 0;
            // Two more rounds once the keys have changed.
            let mut after = 0;
            while after < 2 {
                if stop2.load(SeqCst) {
                    after += 1;
                }
                let want = rekey_pattern(r);
                c.write_all(off, &want);
                assert_same("the region written while the keys change", off, &c.read_all(off, len), &want);
                r += 1;
                rounds2.store(r, SeqCst);
            }
            r
        });
        while rounds.load(SeqCst) == 0 && !io.is_finished() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = d.call(
            "bdev_nvme_set_keys",
            json!({"name": "Auth0", "dhchap_key": "host1", "dhchap_ctrlr_key": "ctrl0"}),
        );
        assert_eq!(r, json!(true), "bdev_nvme_set_keys");
        // Every queue authenticated again in band: no reset, no new connection.
        let c = d.call("bdev_nvme_get_controllers", json!({"name": "Auth0"}));
        assert_eq!(c[0]["ctrlrs"][0]["resets"], 0, "{c}");
        stop.store(true, SeqCst);
        bounded(Duration::from_secs(300), "I/O while the keys change", move || {
            io.join().expect("the I/O thread")
        })
    }

    /// The guest's whole life and each wait in it: only a hang reaches it.
    const GUEST_DEADLINE: Duration = Duration::from_secs(600);
    /// The size of the file the guest's nvmet namespace is on.
    const NVMET_SIZE: u64 = 16 * MIB;

    /// An NVMe/TCP Initialize Connection Request (NVMe/TCP transport spec 1.0, 3.6.2.2): the
    /// common header (PDU type 00h, no flags, HLEN = PLEN = 128, PDO 0), PFV 0, HPDA 0, no
    /// digests, MAXR2T 0 (one R2T outstanding); the rest reserved.
    fn ic_req() -> [u8; 128] {
        let mut pdu = [0u8; 128];
        pdu[2] = 128; // HLEN
        pdu[4..8].copy_from_slice(&128u32.to_le_bytes()); // PLEN
        pdu
    }

    /// Connects to the guest's nvmet-tcp through the forwarded port and checks its
    /// Initialize Connection Response (3.6.2.3): PDU type 01h, HLEN = PLEN = 128, PFV 0, no
    /// digests (none asked for), and MAXH2CDATA at least 4096 (the spec's minimum). Returns
    /// MAXH2CDATA. QEMU's user network accepts the connection before the guest has answered,
    /// so an early refusal shows as a closed stream: retried for a while.
    fn ic_exchange(port: u16) -> u32 {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = || -> std::io::Result<[u8; 128]> {
                let mut s = TcpStream::connect(("127.0.0.1", port))?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                s.write_all(&ic_req())?;
                let mut resp = [0u8; 128];
                s.read_exact(&mut resp)?;
                Ok(resp)
            };
            match attempt() {
                Ok(resp) => {
                    assert_eq!(resp[0], 0x01, "PDU type of the answer to ICReq: {resp:02x?}");
                    assert_eq!(resp[2], 128, "ICResp HLEN: {resp:02x?}");
                    assert_eq!(u32::from_le_bytes(resp[4..8].try_into().unwrap()), 128, "ICResp PLEN");
                    assert_eq!(u16::from_le_bytes([resp[8], resp[9]]), 0, "ICResp PFV");
                    assert_eq!(resp[11], 0, "ICResp DGST: digests nobody asked for");
                    let maxh2cdata = u32::from_le_bytes(resp[12..16].try_into().unwrap());
                    assert!(maxh2cdata >= 4096, "ICResp MAXH2CDATA {maxh2cdata} < 4096");
                    return maxh2cdata;
                }
                Err(e) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "no ICResp from the guest's nvmet-tcp: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// A binary of this build: `target/<profile>/<rel>` (the test runs from
    /// `target/<profile>/deps`).
    fn built(rel: &str, how: &str) -> std::path::PathBuf {
        let exe = std::env::current_exe().expect("the test's path");
        let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>/deps/<test>");
        let path = profile_dir.join(rel);
        assert!(path.is_file(), "{} is missing: build it with `{how}`", path.display());
        path
    }

    #[test]
    fn emulated_nvme_behind_the_iommu_goes_to_vfio_pci_and_the_kernel_nvmet_tcp_answers() {
        if !guest::available() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        // Small: the conformance suite reads the whole namespace back, slowly under TCG.
        let size = 16 * MIB;
        let image = dir.path().join("nvme.img");
        std::fs::File::create(&image).and_then(|f| f.set_len(size)).expect("creating the NVMe image");
        let trace = dir.path().join("nvme-trace.log");
        let port = free_port();
        let cfg = VmConfig {
            nvme: Some(NvmeDevice {
                image: image.clone(),
                serial: SERIAL.into(),
                trace: Some(trace.clone()),
            }),
            hostfwd: Some(port),
            console_input: true,
            // A bound for a hang, not a speed: the driver's part takes about 30 s under TCG on
            // an idle machine and more than 120 s on one whose two cores are shared by a dozen
            // builds (seen in a fresh-machine CI run).
            timeout: GUEST_DEADLINE,
            kernel_args: vec![
                format!("fp.nvme.serial={SERIAL}"),
                format!("fp.nvme.nqn={NQN}"),
                "fp.nvme.driver=1".into(),
            ],
            extra_files: ["nvme_guest", "vfio_bdev"]
                .iter()
                .map(|e| {
                    let how = format!("cargo build -p fp-nvme --example {e}");
                    (built(&format!("examples/{e}"), &how), format!("/usr/bin/{e}"))
                })
                .chain([
                    (
                        secret_file(dir.path(), "nvme.psk", &nvme_tls_psk(TLS_PSK, HOSTNQN, NQN)),
                        "/tls/nvme.psk".into(),
                    ),
                    (env!("CARGO_BIN_EXE_flashpath").into(), "/usr/bin/flashpath".into()),
                    (built("fp-load", "cargo build -p fp-loadgen --bin fp-load"), "/usr/bin/fp-load".into()),
                ])
                .collect(),
            // The root file system is in RAM and holds the daemon (about 60 MiB stripped, with
            // the backup store's HTTP stack), the driver's programs and the 16 MiB nvmet file.
            mem_mib: 768,
            ..VmConfig::new("nvme", Vec::new())
        };
        let mut vm = Vm::boot(&cfg, dir.path());
        // Until the target is ready, the guest stops at each bench mark until told "go", and
        // the doorbell writes QEMU traced are counted there.
        let mut marks: Vec<(String, (u64, u64))> = Vec::new();
        let mut bench = Vec::new();
        loop {
            let line = vm.wait_for(
                "nvmet-tcp",
                |l| l.contains("nvme bench ") || l.contains("nvme nvmet ready"),
                GUEST_DEADLINE,
            );
            let Some(i) = line.find("nvme bench ") else { break };
            let words: Vec<&str> = line[i + "nvme bench ".len()..].split_whitespace().collect();
            let now = count_doorbells(&trace);
            match words[..] {
                [name, "begin"] => marks.push((name.to_string(), now)),
                [name, "end", ios] => {
                    let (begun, (sq0, cq0)) = marks.pop().expect("an end without a begin");
                    assert_eq!(begun, name, "{line}");
                    let ios: u64 = ios
                        .strip_prefix("ios=")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| panic!("{line}"));
                    assert!(ios > 0, "{line}");
                    bench.push((name.to_string(), ios, now.0 - sq0, now.1 - cq0));
                }
                _ => panic!("a bench line of another shape: {line}"),
            }
            vm.send_line("go");
        }
        // Doorbell writes per I/O at QD32 (4 KiB random reads): figures, not assertions.
        for (name, ios, sq, cq) in &bench {
            eprintln!(
                "guest 'nvme': bench {name}: {ios} I/Os at QD32, {sq} SQ and {cq} CQ doorbell writes: {:.3} per I/O",
                (sq + cq) as f64 / *ios as f64
            );
        }
        assert_eq!(bench.iter().map(|b| b.0.as_str()).collect::<Vec<_>>(), ["kernel", "flashpath"]);

        let maxh2cdata = ic_exchange(port);
        eprintln!("guest 'nvme': the kernel's nvmet-tcp answered ICReq on 127.0.0.1:{port} (MAXH2CDATA {maxh2cdata})");
        // An NVMe/TCP host on the host's loopback: the namespace's block size from Identify,
        // the guest's pattern read back, a pattern of ours written, read back, and found by the
        // guest in the namespace's file.
        let addr = format!("127.0.0.1:{port}");
        let mut host = Host::connect(&addr, NQN, HOSTNQN).expect("connecting to the guest's nvmet-tcp");
        let (c, id) = host.admin.identify_namespace(1).expect("Identify Namespace 1");
        assert_eq!(c.status, 0, "Identify Namespace 1: {c:?}");
        // NVM Command Set 1.0, Identify Namespace: NSZE at 0, FLBAS at 26 (format index in bits
        // 3:0), the LBA formats from 128, four bytes each, LBADS (log2 of the block size) the
        // third byte.
        let nsze = u64::from_le_bytes(id[0..8].try_into().unwrap());
        let lbads = id[128 + 4 * (id[26] & 0xf) as usize + 2];
        let bs = 1usize << lbads;
        assert_eq!(
            nsze * bs as u64,
            NVMET_SIZE,
            "the nvmet namespace's size (NSZE {nsze}, {bs}-byte blocks)"
        );
        let blocks_per_io = (4096 / bs).max(1) as u16;
        let io = bs * blocks_per_io as usize;
        let mut got = Vec::new();
        for lba in (0..MIB / bs as u64).step_by(blocks_per_io as usize) {
            let (c, data) = host.io.read(1, lba, bs, blocks_per_io).expect("read over NVMe/TCP");
            assert_eq!(c.status, 0, "read of LBA {lba}: {c:?}");
            got.extend_from_slice(&data);
        }
        assert_same("the guest's pattern read over NVMe/TCP", 0, &got, &pattern(61, 0, MIB as usize));
        let (off, len) = (2 * MIB, 256 * 1024u64);
        let want = pattern(62, off, len as usize);
        for (i, chunk) in want.chunks(io).enumerate() {
            let lba = (off as usize + i * io) / bs;
            let c = host.io.write(1, lba as u64, bs, chunk).expect("write over NVMe/TCP");
            assert_eq!(c.status, 0, "write of LBA {lba}: {c:?}");
        }
        let (c, back) = host.io.read(1, off / bs as u64, bs, blocks_per_io).expect("read back");
        assert_eq!(c.status, 0, "read back: {c:?}");
        assert_same("a block written over NVMe/TCP, read back", off, &back, &want[..io]);
        drop(host);

        // flashpath's own initiator: a daemon on the host attaches the guest's subsystem
        // (bdev_nvme_attach_controller over TCP) and serves the namespace over vhost-user; a
        // libblkio client writes and reads back at random, writes a pattern region, and reads
        // it again after bdev_nvme_reset_controller. Then the guest finds the region in the file.
        let d = Daemon::start("0");
        let attach = json!({
            "name": "Guest0", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string(), "subnqn": NQN, "hostnqn": HOSTNQN
        });
        assert_eq!(d.call("bdev_nvme_attach_controller", attach), json!(["Guest0n1"]));
        let c = d.call("bdev_nvme_get_controllers", json!({"name": "Guest0"}));
        assert_eq!(c[0]["ctrlrs"][0]["state"], "enabled", "{c}");
        assert_eq!(c[0]["ctrlrs"][0]["trid"]["subnqn"], NQN, "{c}");
        let sock = d.controller("vhost.nvmet", "Guest0n1", Some(1), false);
        let (rpc, (roff, rlen, rseed)) = (d.rpc.clone(), TCP_REGION);
        let compared =
            bounded(Duration::from_secs(120), "I/O through flashpath's NVMe/TCP initiator", move || {
                let mut c = BlkClient::open(&sock, 1);
                assert_eq!(c.capacity, NVMET_SIZE, "the namespace's size through the initiator");
                let compared = random_write_verify(&mut c, 71, 4, 4 * MIB, 4 * MIB, None);
                let want = pattern(rseed, roff, rlen as usize);
                c.write_all(roff, &want);
                let r =
                    rpc_call(&rpc, "bdev_nvme_reset_controller", Some(json!({"name": "Guest0"}))).unwrap();
                assert_eq!(r.unwrap(), json!(true), "bdev_nvme_reset_controller");
                assert_same("the region read after a reset", roff, &c.read_all(roff, rlen as usize), &want);
                compared
            });
        eprintln!("guest 'nvme': flashpath's NVMe/TCP initiator: {compared} bytes compared, a reset, the region read back");
        d.call("vhost_delete_controller", json!({"ctrlr": "vhost.nvmet"}));
        assert_eq!(d.call("bdev_nvme_detach_controller", json!({"name": "Guest0"})), json!(true));
        guest_verify(&mut vm, roff, rlen, rseed);
        guest_verify(&mut vm, 0, MIB, 61);
        guest_verify(&mut vm, off, len, 62);
        dhchap_against_the_kernel(&mut vm, &d, port);
        tls_against_the_kernel(&mut vm, &d, port);
        vm.send_line("done");
        let r = vm.wait_result();
        assert!(r.passed, "guest: {}\n{}", r.detail, vm.report());
        vm.wait_exit(EXIT_TIMEOUT);
        eprintln!("guest 'nvme': PASS after {:.1?}", r.time);
        let r = vm.whole_result(&r);
        for l in &r.info {
            eprintln!("guest 'nvme': {l}");
        }

        // The kernel's driver had the function first, and the namespace is the image.
        let k = r.fields("nvme kernel");
        assert_eq!(k.get("class").map(String::as_str), Some("0x010802"), "the function's class: {k:?}");
        assert_eq!(k.get("driver").map(String::as_str), Some("nvme"), "{k:?}");
        assert_eq!(k.get("size"), Some(&size.to_string()), "the namespace's size: {k:?}");
        // Then vfio-pci, with its group's character device.
        let v = r.fields("nvme vfio-pci");
        assert_eq!(v.get("addr"), k.get("addr"), "{v:?} vs {k:?}");
        assert_eq!(v.get("driver").map(String::as_str), Some("vfio-pci"), "{v:?}");
        let addr = k.get("addr").expect("addr");
        let members = v.get("group_devices").expect("group_devices");
        assert!(members.split(',').any(|m| m == addr), "{addr} is not in its own IOMMU group: {v:?}");
        // flashpath itself in the guest: attached, verified random reads and writes under a
        // reset with no error and no read that differed from its block's last write, detached.
        let w = r.fields("nvme daemon verified under a reset");
        let count = |k: &str| w.get(k).and_then(|n| n.parse::<u64>().ok());
        assert_eq!(w.get("errors").map(String::as_str), Some("0"), "{w:?}");
        assert_eq!(w.get("mismatches").map(String::as_str), Some("0"), "{w:?}");
        assert!(count("ios").is_some_and(|n| n > 0), "{w:?}");
        assert!(count("writes").is_some_and(|n| n > 0), "{w:?}");
        assert!(count("verified").is_some_and(|n| n > 0), "no read was checked: {w:?}");
        assert_eq!(r.info_after("nvme daemon attached"), ["state=enabled"], "{:?}", r.info);
        assert_eq!(r.info_after("nvme daemon stopped").len(), 1, "{:?}", r.info);
        // Zero copy: the vhost-user client's memory is in the DMA map (registered when its
        // memory table arrived), so nothing of the benchmark's reads was bounced.
        let ds = r.fields("nvme daemon stats");
        assert_eq!(ds.get("bounced").map(String::as_str), Some("0"), "{ds:?}");
        assert!(ds.get("completed").and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n >= 2048), "{ds:?}");
        // flashpath's driver on the function, through VFIO.
        let attached = r.info_after("nvme nvme_guest attached");
        assert_eq!(attached.len(), 3, "attached to find, to write, and after the detach: {:?}", r.info);
        assert!(
            attached.iter().all(|l| l.starts_with(addr.as_str()) && l.contains("namespaces=1")),
            "{attached:?}"
        );
        let want = format!("block_size=512 num_blocks={}", size / 512);
        assert_eq!(r.info_after("nvme nvme_guest namespace 1"), [want.as_str(), &want], "{:?}", r.info);
        // It read what the kernel's driver wrote before it had the function.
        assert_eq!(
            r.info_after("nvme written by the kernel's driver:"),
            [format!("{MIB} {MIB} 60")],
            "{:?}",
            r.info
        );
        assert_eq!(r.info_after("nvme nvme_guest found"), [format!("{MIB} {MIB} 60")], "{:?}", r.info);
        assert_eq!(r.info_after("nvme vfio_bdev conformance suite passed").len(), 1, "{:?}", r.info);
        assert_eq!(r.info_after("nvme vfio_bdev PASS").len(), 1, "{:?}", r.info);
        assert_eq!(r.info_after("nvme nvme_guest reset twice under I/O").len(), 1, "{:?}", r.info);
        let stats = r.fields("nvme nvme_guest stats");
        let stat = |k: &str| -> u64 {
            stats.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{k}: {stats:?}"))
        };
        // Commands in flight at a reset are drained and resubmitted: counted as submitted twice,
        // completed once.
        assert!(stat("completed") > 0 && stat("completed") <= stat("submitted"), "{stats:?}");
        assert!(stat("doorbells") > 0, "{stats:?}");
        eprintln!("guest 'nvme': flashpath's driver: {stats:?}");
        let t = r.fields("nvme nvmet ready");
        assert_eq!(t.get("nqn").map(String::as_str), Some(NQN), "{t:?}");

        // The region flashpath's driver wrote last (after the suite, which overwrote the
        // kernel's pattern) is in the raw image, as the re-attached driver read it back.
        let ops = r.ops(OPS);
        let (offset, len, seed) = DRIVER_REGION;
        assert_eq!(ops, [DiskOp::Write { offset, len, seed }]);
        let img = std::fs::read(&image).expect("reading the NVMe image");
        assert_eq!(img.len() as u64, size);
        let got = &img[offset as usize..][..len as usize];
        assert_same(
            "flashpath's pattern region, in the raw image",
            offset,
            got,
            &pattern(seed, offset, len as usize),
        );

        // QEMU traced the I/O queues' doorbell writes of both drivers: the kernel's (at least
        // one per command it sent: the boot's partition scan, the write and its read-back) and
        // flashpath's, whose own count (BAR0 writes; the shadow ones skipped) cannot exceed
        // what the device saw.
        let (sq, cq) = count_doorbells(&trace);
        eprintln!(
            "guest 'nvme': QEMU traced {sq} submission and {cq} completion doorbell writes on I/O queues"
        );
        assert!(
            sq + cq >= stat("doorbells"),
            "QEMU saw {sq} + {cq} doorbell writes, flashpath counted {stats:?}"
        );
        assert!(sq >= 2 && cq >= 2, "doorbells in {}: sq {sq} cq {cq}", trace.display());
    }
}
