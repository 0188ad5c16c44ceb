//! SPDK's own RPC client against flashpath (issue 21): every method flashpath shares with SPDK
//! is driven through `spdk-rpc` (the Python package `spdk`, 26.9) with SPDK's argument syntax,
//! so the compatibility claim is checked by SPDK's code rather than by ours.
//!
//! * [`every_shared_method_has_a_case`] starts the daemon, asks it for `rpc_get_methods` (through
//!   spdk-rpc) and intersects the answer with the subcommands `spdk-rpc --help` lists. Every
//!   method in that intersection must be claimed by one of the [`CASES`]; a method added to the
//!   daemon later without a compatibility case fails it, and so does an intersection that shrank
//!   suspiciously (a broken parse, a renamed method).
//! * Each case claims its methods and, at its end, asserts each of them succeeded through
//!   spdk-rpc at least once; the effect is checked through spdk-rpc too (and through a
//!   libblkio client or the `rbd` tool where the effect is outside the daemon).
//! * [`errors_come_back_through_spdk_rpc`]: a bad parameter gives SPDK's client error output
//!   with flashpath's message and a non-zero exit.
//! * The last five tests assert SPDK's behaviour where this test first found flashpath
//!   differing (packed-ring flags, `nbd_start_disk` without a device, `bdev_get_iostat`'s
//!   `names` and `reset_mode`, the `default` clear method, read-only volumes' I/O types).
//!
//! spdk-rpc is found from FLASHPATH_SPDK_RPC, else at `<target>/spdk-venv/bin/spdk-rpc`
//! (`./run test` installs it there); without it the tests fail and say how to install it.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::ceph::CephCluster;
use common::spdk::spdk_rpc_path;
use common::{BlkClient, Daemon};
use serde_json::{json, Value};

/// The methods each case exercises through spdk-rpc (its test function's name first).
const CASES: &[(&str, &[&str])] = &[
    (
        "malloc_null_and_framework",
        &[
            "bdev_malloc_create",
            "bdev_malloc_delete",
            "bdev_null_create",
            "bdev_null_resize",
            "bdev_null_delete",
            "bdev_get_bdevs",
            "spdk_get_version",
            "rpc_get_methods",
            "framework_get_reactors",
        ],
    ),
    (
        "vhost_and_nbd_exports",
        &[
            "vhost_create_blk_controller",
            "vhost_get_controllers",
            "vhost_controller_set_coalescing",
            "vhost_delete_controller",
            "nbd_start_disk",
            "nbd_get_disks",
            "nbd_stop_disk",
        ],
    ),
    (
        "iostat_histogram_and_qos",
        &[
            "bdev_set_qos_limit",
            "bdev_get_iostat",
            "bdev_reset_iostat",
            "bdev_enable_histogram",
            "bdev_get_histogram",
        ],
    ),
    (
        "lvol_store_and_volumes",
        &[
            "bdev_lvol_create_lvstore",
            "bdev_lvol_get_lvstores",
            "bdev_lvol_rename_lvstore",
            "bdev_lvol_grow_lvstore",
            "bdev_lvol_create",
            "bdev_lvol_get_lvols",
            "bdev_lvol_snapshot",
            "bdev_lvol_clone",
            "bdev_lvol_resize",
            "bdev_lvol_rename",
            "bdev_lvol_inflate",
            "bdev_lvol_decouple_parent",
            "bdev_lvol_set_read_only",
            "bdev_lvol_delete",
            "bdev_lvol_delete_lvstore",
        ],
    ),
    (
        "uring_and_delay",
        &[
            "bdev_uring_create",
            "bdev_uring_rescan",
            "bdev_uring_delete",
            "bdev_delay_create",
            "bdev_delay_update_latency",
            "bdev_delay_delete",
        ],
    ),
    (
        "error_injection_reaches_a_vhost_client",
        &["bdev_error_create", "bdev_error_inject_error", "bdev_error_resume_pending", "bdev_error_delete"],
    ),
    (
        "crypto_and_keys",
        &[
            "keyring_file_add_key",
            "keyring_get_keys",
            "keyring_file_remove_key",
            "accel_crypto_key_create",
            "accel_crypto_keys_get",
            "accel_crypto_key_destroy",
            "bdev_crypto_create",
            "bdev_crypto_delete",
        ],
    ),
    (
        "rbd_on_a_real_cluster",
        &[
            "bdev_rbd_register_cluster",
            "bdev_rbd_get_clusters_info",
            "bdev_rbd_unregister_cluster",
            "bdev_rbd_create",
            "bdev_rbd_resize",
            "bdev_rbd_delete",
        ],
    ),
    (
        "nvmf_target",
        &[
            "nvmf_create_transport",
            "nvmf_get_transports",
            "nvmf_create_subsystem",
            "nvmf_get_subsystems",
            "nvmf_subsystem_add_listener",
            "nvmf_subsystem_get_listeners",
            "nvmf_subsystem_remove_listener",
            "nvmf_subsystem_add_ns",
            "nvmf_subsystem_remove_ns",
            "nvmf_subsystem_add_host",
            "nvmf_subsystem_remove_host",
            "nvmf_subsystem_allow_any_host",
            "nvmf_subsystem_get_controllers",
            "nvmf_subsystem_get_qpairs",
            "nvmf_get_stats",
            "nvmf_delete_subsystem",
            "sock_set_default_impl",
            "sock_get_default_impl",
            "sock_impl_set_options",
        ],
    ),
    ("nvmf_dhchap", &["nvmf_set_config", "nvmf_subsystem_set_keys", "bdev_nvme_set_keys"]),
    ("nvmf_ana", &["nvmf_subsystem_listener_set_ana_state", "nvmf_subsystem_set_ns_ana_group"]),
    ("nvmf_tls", &["nvmf_subsystem_add_host", "nvmf_subsystem_add_listener", "nvmf_subsystem_get_listeners"]),
    (
        "nvme_controllers",
        &[
            "bdev_nvme_set_options",
            "bdev_nvme_attach_controller",
            "bdev_nvme_get_controllers",
            "bdev_nvme_reset_controller",
            "bdev_nvme_detach_controller",
            "bdev_nvme_get_io_paths",
        ],
    ),
    (
        "lvol_parents_and_shallow_copy",
        &[
            "bdev_lvol_set_parent",
            "bdev_lvol_set_parent_bdev",
            "bdev_lvol_clone_bdev",
            "bdev_lvol_start_shallow_copy",
            "bdev_lvol_check_shallow_copy",
        ],
    ),
    (
        "raid_levels_and_replicas",
        &[
            "bdev_raid_create",
            "bdev_raid_get_bdevs",
            "bdev_raid_set_options",
            "bdev_raid_remove_base_bdev",
            "bdev_raid_add_base_bdev",
            "bdev_raid_delete",
            "bdev_set_options",
            "bdev_examine",
        ],
    ),
];

/// Methods driven through spdk-rpc in a guest rather than by a case here: the host's kernel has
/// no ublk_drv, so guest_ublk.rs runs the daemon in the TCG guest and spdk-rpc reaches it through
/// a forwarded port; [`ublk_without_ublk_drv_is_refused_naming_the_control_device`] checks the
/// host's side.
const IN_THE_GUEST: &[&str] = &[
    "ublk_create_target",
    "ublk_destroy_target",
    "ublk_start_disk",
    "ublk_stop_disk",
    "ublk_recover_disk",
    "ublk_get_disks",
];

/// Fewer shared methods than this means the intersection itself is broken (48 when written, 64
/// with the nvmf methods, 69 with the nvme ones, 75 with the raid ones, 94 with the error,
/// crypto and key ones, 100 with the ublk ones).
const MIN_SHARED: usize = 100;

/// Upper bound for one spdk-rpc run (its own `-t` is per read, in CPU time).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

const MIB: u64 = 1 << 20;

/// What one spdk-rpc run gave.
struct Outcome {
    success: bool,
    stdout: String,
    stderr: String,
}

/// spdk-rpc pointed at one daemon's socket; remembers which methods succeeded through it.
struct SpdkRpc {
    exe: PathBuf,
    sock: PathBuf,
    succeeded: Mutex<BTreeSet<String>>,
}

impl SpdkRpc {
    fn new(daemon: &Daemon) -> SpdkRpc {
        SpdkRpc { exe: spdk_rpc_path(), sock: daemon.rpc.clone(), succeeded: Mutex::new(BTreeSet::new()) }
    }

    /// Runs `spdk-rpc -s <sock> -t 30 <args>`, bounded by [`RUN_TIMEOUT`].
    fn run(&self, args: &[&str]) -> Outcome {
        let mut all: Vec<&str> = vec!["-s", self.sock.to_str().expect("UTF-8 socket path"), "-t", "30"];
        all.extend_from_slice(args);
        let out = run_bounded(&self.exe, &all);
        if out.success {
            self.succeeded.lock().unwrap().insert(args[0].to_string());
        }
        out
    }

    /// Runs and asserts success; returns stdout without its final newline.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.success, "spdk-rpc {} failed:\n{}{}", args.join(" "), out.stdout, out.stderr);
        out.stdout.trim_end().to_string()
    }

    /// Runs, asserts success and parses what spdk-rpc printed as JSON.
    fn json(&self, args: &[&str]) -> Value {
        let text = self.ok(args);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("spdk-rpc {} printed no JSON ({e}):\n{text}", args.join(" ")))
    }

    /// Runs and asserts the JSON-RPC call failed the way SPDK's client reports it (exit 1, the
    /// request and the error response on stdout); returns the error object (code, message).
    fn fails(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(!out.success, "spdk-rpc {} succeeded but should fail:\n{}", args.join(" "), out.stdout);
        let (_, response) =
            out.stdout.split_once("Got JSON-RPC error response\nresponse:\n").unwrap_or_else(|| {
                panic!(
                    "spdk-rpc {}: no JSON-RPC error response:\n{}{}",
                    args.join(" "),
                    out.stdout,
                    out.stderr
                )
            });
        serde_json::from_str(response.trim()).unwrap_or_else(|e| {
            panic!("spdk-rpc {}: the error is not JSON ({e}):\n{response}", args.join(" "))
        })
    }

    /// `bdev_get_bdevs -b <name>`'s one bdev.
    fn bdev(&self, name: &str) -> Value {
        let v = self.json(&["bdev_get_bdevs", "-b", name]);
        assert_eq!(v.as_array().map(Vec::len), Some(1), "bdev_get_bdevs -b {name}: {v}");
        v[0].clone()
    }

    /// The names of all bdevs.
    fn bdev_names(&self) -> Vec<String> {
        let v = self.json(&["bdev_get_bdevs"]);
        v.as_array()
            .expect("an array")
            .iter()
            .map(|b| b["name"].as_str().expect("a name").to_string())
            .collect()
    }

    /// Asserts every method `case` claims in [`CASES`] succeeded through spdk-rpc.
    fn assert_case_covered(&self, case: &str) {
        let (_, claimed) = CASES.iter().find(|(name, _)| *name == case).expect("a case in CASES");
        let done = self.succeeded.lock().unwrap();
        let missing: Vec<&str> = claimed.iter().copied().filter(|m| !done.contains(*m)).collect();
        assert!(missing.is_empty(), "case {case} claims {missing:?} but never ran them successfully");
    }
}

/// Runs `exe args` with stdin closed (spdk-rpc reads commands from a non-tty stdin when given
/// no method) and kills it after [`RUN_TIMEOUT`].
fn run_bounded(exe: &Path, args: &[&str]) -> Outcome {
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("stdout")));
    let err = reader(Box::new(child.stderr.take().expect("stderr")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for spdk-rpc") {
            break status;
        }
        if started.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("spdk-rpc {} did not finish within {RUN_TIMEOUT:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Outcome { success: status.success(), stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// The subcommands spdk-rpc knows, from its `--help` (each at a 4-space indent).
fn spdk_subcommands(exe: &Path) -> BTreeSet<String> {
    let out = run_bounded(exe, &["--help"]);
    assert!(out.success, "spdk-rpc --help failed:\n{}{}", out.stdout, out.stderr);
    out.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|rest| rest.starts_with(|c: char| c.is_ascii_lowercase()))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
        .map(str::to_string)
        .collect()
}

fn daemon() -> Daemon {
    Daemon::start("0")
}

#[test]
fn every_shared_method_has_a_case() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    let known = spdk_subcommands(&rpc.exe);
    assert!(known.len() > 200, "spdk-rpc --help lists only {} subcommands: {known:?}", known.len());
    let ours = rpc.json(&["rpc_get_methods"]);
    let ours: BTreeSet<String> = ours
        .as_array()
        .expect("an array")
        .iter()
        .map(|m| m.as_str().expect("a string").to_string())
        .collect();
    let shared: BTreeSet<&String> = ours.iter().filter(|m| known.contains(*m)).collect();
    assert!(
        shared.len() >= MIN_SHARED,
        "only {} methods shared with SPDK (at least {MIN_SHARED} expected): {shared:?}",
        shared.len()
    );
    let claimed: BTreeSet<&str> = CASES
        .iter()
        .flat_map(|(_, methods)| methods.iter().copied())
        .chain(IN_THE_GUEST.iter().copied())
        .collect();
    let uncovered: Vec<&String> = shared.iter().copied().filter(|m| !claimed.contains(m.as_str())).collect();
    assert!(
        uncovered.is_empty(),
        "methods flashpath shares with SPDK that no case drives through spdk-rpc: {uncovered:?} \
         (add them to a case in tests/spdk_rpc.rs)"
    );
    let stale: Vec<&str> = claimed.iter().copied().filter(|m| !shared.iter().any(|s| s == m)).collect();
    assert!(stale.is_empty(), "CASES claims methods that are not shared with SPDK any more: {stale:?}");
}

#[test]
fn malloc_null_and_framework() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);

    // bdev_malloc_create's size is in MiB, SPDK's client turns it into num_blocks.
    assert_eq!(rpc.ok(&["bdev_malloc_create", "-b", "Malloc7", "64", "512"]), "Malloc7");
    let b = rpc.bdev("Malloc7");
    assert_eq!((b["block_size"].as_u64(), b["num_blocks"].as_u64()), (Some(512), Some(64 * MIB / 512)));
    assert_eq!(b["product_name"], "Malloc disk");
    // Without -b the daemon names it, as SPDK does.
    assert_eq!(rpc.ok(&["bdev_malloc_create", "8", "4096"]), "Malloc0");
    assert_eq!(rpc.bdev("Malloc0")["num_blocks"].as_u64(), Some(8 * MIB / 4096));
    rpc.ok(&["bdev_malloc_delete", "Malloc0"]);
    assert_eq!(rpc.bdev_names(), ["Malloc7"]);

    assert_eq!(rpc.ok(&["bdev_null_create", "Null0", "16", "4096"]), "Null0");
    assert_eq!(rpc.bdev("Null0")["num_blocks"].as_u64(), Some(16 * MIB / 4096));
    assert_eq!(rpc.ok(&["bdev_null_resize", "Null0", "32"]), "true");
    assert_eq!(rpc.bdev("Null0")["num_blocks"].as_u64(), Some(32 * MIB / 4096));
    rpc.ok(&["bdev_null_delete", "Null0"]);

    // bdev_get_bdevs -t: the daemon waits that long for the named bdev, then says it is missing.
    let started = Instant::now();
    let e = rpc.fails(&["bdev_get_bdevs", "-b", "Null0", "-t", "300"]);
    assert!(started.elapsed() >= Duration::from_millis(300), "-t 300 returned after {:?}", started.elapsed());
    assert!(e["message"].as_str().unwrap().contains("Null0"), "{e}");
    assert_eq!(e["code"], -19, "{e}");
    rpc.ok(&["bdev_malloc_delete", "Malloc7"]);
    assert!(rpc.bdev_names().is_empty());

    let v = rpc.json(&["spdk_get_version"]);
    assert!(v["version"].as_str().is_some_and(|s| s.starts_with("flashpath")), "{v}");
    for field in ["major", "minor", "patch"] {
        assert!(v["fields"][field].is_u64(), "spdk_get_version fields.{field}: {v}");
    }

    for extra in [&[][..], &["-c"], &["-i"]] {
        let mut args = vec!["rpc_get_methods"];
        args.extend_from_slice(extra);
        let m = rpc.json(&args);
        let m = m.as_array().expect("an array");
        for name in ["bdev_malloc_create", "rpc_get_methods", "vhost_create_blk_controller"] {
            assert!(m.iter().any(|x| x == name), "rpc_get_methods {extra:?} lacks {name}");
        }
    }

    let r = rpc.json(&["framework_get_reactors"]);
    assert!(r["tick_rate"].as_u64().is_some_and(|t| t > 0), "{r}");
    let reactors = r["reactors"].as_array().expect("reactors");
    assert_eq!(reactors.len(), 1, "one reactor for --cpus 0: {r}");
    assert_eq!(reactors[0]["lcore"], 0, "{r}");
    rpc.assert_case_covered("malloc_null_and_framework");
}

#[test]
fn vhost_and_nbd_exports() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "16", "512"]);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc1", "8", "4096"]);

    // vhost: the socket appears in the daemon's directory and a client sees the disk.
    rpc.ok(&["vhost_create_blk_controller", "--cpumask", "0x1", "vhost.0", "Malloc0"]);
    let sock = d.dir.path().join("vhost.0");
    assert!(sock.exists(), "no socket at {}", sock.display());
    let c = rpc.json(&["vhost_get_controllers", "-n", "vhost.0"]);
    assert_eq!(c.as_array().map(Vec::len), Some(1), "{c}");
    assert_eq!(c[0]["ctrlr"], "vhost.0");
    assert_eq!(c[0]["backend_specific"]["block"]["bdev"], "Malloc0");
    assert_eq!(c[0]["backend_specific"]["block"]["readonly"], false);
    assert_eq!(c[0]["cpumask"], "0x1");
    let client = BlkClient::open(&sock, 1);
    assert_eq!(client.capacity, 16 * MIB);
    drop(client);

    rpc.ok(&["vhost_controller_set_coalescing", "vhost.0", "100", "10000"]);
    let c = rpc.json(&["vhost_get_controllers", "-n", "vhost.0"]);
    assert_eq!((c[0]["delay_base_us"].as_u64(), c[0]["iops_threshold"].as_u64()), (Some(100), Some(10000)));

    rpc.ok(&["vhost_create_blk_controller", "-r", "--transport", "vhost_user_blk", "vhost.1", "Malloc1"]);
    let c = rpc.json(&["vhost_get_controllers"]);
    let names: Vec<&str> = c.as_array().unwrap().iter().map(|x| x["ctrlr"].as_str().unwrap()).collect();
    assert_eq!(names, ["vhost.0", "vhost.1"]);
    assert_eq!(c[1]["backend_specific"]["block"]["readonly"], true);
    rpc.ok(&["vhost_delete_controller", "vhost.0"]);
    rpc.ok(&["vhost_delete_controller", "vhost.1"]);
    assert!(!sock.exists(), "vhost_delete_controller left {}", sock.display());
    assert_eq!(rpc.json(&["vhost_get_controllers"]), Value::Array(vec![]));

    // NBD: flashpath's nbd_device is the socket the export listens on.
    let nbd = d.dir.path().join("nbd0.sock");
    let nbd = nbd.to_str().unwrap();
    assert_eq!(rpc.ok(&["nbd_start_disk", "Malloc0", nbd]), nbd);
    assert!(Path::new(nbd).exists(), "nbd_start_disk made no socket at {nbd}");
    let disks = rpc.json(&["nbd_get_disks"]);
    assert_eq!(disks.as_array().map(Vec::len), Some(1), "{disks}");
    assert_eq!(
        (disks[0]["nbd_device"].as_str(), disks[0]["bdev_name"].as_str()),
        (Some(nbd), Some("Malloc0"))
    );
    assert_eq!(rpc.json(&["nbd_get_disks", "-n", nbd]), disks);
    rpc.ok(&["nbd_stop_disk", nbd]);
    assert_eq!(rpc.json(&["nbd_get_disks"]), Value::Array(vec![]));
    rpc.assert_case_covered("vhost_and_nbd_exports");
}

/// The NVMe-oF target as SPDK's scripts set it up: the transport, a subsystem with a listener
/// that accepts TCP connections, namespaces that claim their bdevs, allowed hosts, the
/// listings, and a deletion that releases everything. (Hosts connecting are the engine's and
/// the guest's tests.)
#[test]
fn nvmf_target() {
    const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:2b7c3e6a-0000-4000-8000-000000000001";
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "16", "512"]);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc1", "8", "4096"]);

    rpc.ok(&["nvmf_create_transport", "-t", "TCP", "-c", "8192", "-q", "64", "-y", "2"]);
    let t = rpc.json(&["nvmf_get_transports", "--trtype", "tcp"]);
    assert_eq!(t.as_array().map(Vec::len), Some(1), "{t}");
    assert_eq!((t[0]["trtype"].as_str(), t[0]["max_queue_depth"].as_u64()), (Some("TCP"), Some(64)), "{t}");
    assert_eq!(
        (t[0]["in_capsule_data_size"].as_u64(), t[0]["sock_priority"].as_u64()),
        (Some(8192), Some(2)),
        "{t}"
    );
    // An option flashpath does not implement is refused by name rather than ignored.
    let e = rpc.fails(&["nvmf_create_transport", "-t", "TCP", "-z"]);
    assert!(e["message"].as_str().unwrap().starts_with("zcopy: not supported"), "{e}");

    rpc.ok(&[
        "nvmf_create_subsystem",
        NQN,
        "-a",
        "-s",
        "SPDK00000000000001",
        "-d",
        "flashpath test",
        "-m",
        "8",
    ]);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    // The socket implementation: SPDK's calls, and a listener's own (`-S`).
    assert_eq!(rpc.json(&["sock_get_default_impl"])["impl_name"], "posix");
    rpc.ok(&["sock_impl_set_options", "-i", "uring"]);
    rpc.ok(&["sock_set_default_impl", "-i", "uring"]);
    assert_eq!(rpc.json(&["sock_get_default_impl"])["impl_name"], "uring");
    rpc.ok(&["sock_set_default_impl", "-i", "posix"]);
    let listener = ["-t", "tcp", "-a", "127.0.0.1", "-s", &port, "-f", "ipv4", "-S", "uring"];
    rpc.ok(&[&["nvmf_subsystem_add_listener", NQN][..], &listener].concat());
    std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("the listener accepts connections");
    let l = rpc.json(&["nvmf_subsystem_get_listeners", NQN]);
    assert_eq!(l[0]["address"]["traddr"], "127.0.0.1", "{l}");
    assert_eq!(
        (l[0]["address"]["trtype"].as_str(), l[0]["address"]["adrfam"].as_str()),
        (Some("TCP"), Some("IPv4"))
    );
    assert_eq!(l[0]["address"]["trsvcid"], port.as_str(), "{l}");
    // The discovery subsystem on a port of its own, rpc.py's `discovery` shorthand.
    let dport = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let discovery_listener = ["-t", "tcp", "-a", "127.0.0.1", "-s", &dport, "-f", "ipv4"];
    rpc.ok(&[&["nvmf_subsystem_add_listener", "discovery"][..], &discovery_listener].concat());
    std::net::TcpStream::connect(format!("127.0.0.1:{dport}")).expect("the discovery listener accepts");
    let l = rpc.json(&["nvmf_subsystem_get_listeners", "nqn.2014-08.org.nvmexpress.discovery"]);
    assert!(l.as_array().unwrap().iter().any(|a| a["address"]["trsvcid"] == dport.as_str()), "{l}");
    rpc.ok(&[&["nvmf_subsystem_remove_listener", "discovery"][..], &discovery_listener].concat());

    rpc.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc0"]);
    rpc.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc1", "-n", "4", "-g", "0123456789ABCDEF0123456789ABCDEF"]);
    let m0 = rpc.bdev("Malloc0");
    assert_eq!(
        (m0["claimed"].as_bool(), m0["claimed_by"].as_str()),
        (Some(true), Some(format!("{NQN}/1").as_str()))
    );
    // A namespace's bdev cannot be deleted under it.
    let e = rpc.fails(&["bdev_malloc_delete", "Malloc0"]);
    assert_eq!(e["code"], -16, "{e}");

    rpc.ok(&["nvmf_subsystem_allow_any_host", NQN, "--no-allow-any-host"]);
    rpc.ok(&["nvmf_subsystem_add_host", NQN, HOST]);
    let s = rpc.json(&["nvmf_get_subsystems", NQN]);
    assert_eq!(s.as_array().map(Vec::len), Some(1), "{s}");
    let s = &s[0];
    assert_eq!((s["nqn"].as_str(), s["subtype"].as_str()), (Some(NQN), Some("NVMe")));
    assert_eq!(
        (s["serial_number"].as_str(), s["model_number"].as_str()),
        (Some("SPDK00000000000001"), Some("flashpath test"))
    );
    assert_eq!((s["allow_any_host"].as_bool(), s["max_namespaces"].as_u64()), (Some(false), Some(8)));
    assert_eq!(s["hosts"], serde_json::json!([{ "nqn": HOST }]));
    let ns: Vec<(u64, &str)> = s["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["nsid"].as_u64().unwrap(), n["bdev_name"].as_str().unwrap()))
        .collect();
    assert_eq!(ns, [(1, "Malloc0"), (4, "Malloc1")]);
    assert_eq!(s["namespaces"][1]["nguid"], "0123456789ABCDEF0123456789ABCDEF");
    assert_eq!(s["namespaces"][0]["uuid"], m0["uuid"], "a namespace has its bdev's UUID, as in SPDK");
    let all = rpc.json(&["nvmf_get_subsystems"]);
    assert!(all.as_array().unwrap().iter().any(|s| s["subtype"] == "Discovery"), "{all}");

    assert_eq!(rpc.json(&["nvmf_subsystem_get_controllers", NQN]), Value::Array(vec![]));
    assert_eq!(rpc.json(&["nvmf_subsystem_get_qpairs", NQN]), Value::Array(vec![]));
    let stats = rpc.json(&["nvmf_get_stats"]);
    assert_eq!(stats["subsystems"][0]["nqn"], NQN, "{stats}");
    assert_eq!(stats["subsystems"][0]["namespaces"].as_array().map(Vec::len), Some(2), "{stats}");

    rpc.ok(&["nvmf_subsystem_remove_host", NQN, HOST]);
    rpc.ok(&["nvmf_subsystem_remove_ns", NQN, "1"]);
    assert_eq!(rpc.bdev("Malloc0")["claimed"], false);
    rpc.ok(&[
        "nvmf_subsystem_remove_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port,
        "-f",
        "ipv4",
    ]);
    assert_eq!(rpc.json(&["nvmf_subsystem_get_listeners", NQN]), Value::Array(vec![]));
    assert!(std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err(), "the listener closed");
    // Deleting the subsystem removes its remaining namespace and releases Malloc1.
    rpc.ok(&["nvmf_delete_subsystem", NQN]);
    assert_eq!(rpc.bdev("Malloc1")["claimed"], false);
    let e = rpc.fails(&["nvmf_get_subsystems", NQN]);
    assert_eq!(e["code"], -19, "{e}");
    rpc.ok(&["bdev_malloc_delete", "Malloc0"]);
    rpc.ok(&["bdev_malloc_delete", "Malloc1"]);
    rpc.assert_case_covered("nvmf_target");
}

/// The NVMe driver's methods with SPDK's syntax: the daemon's own NVMe/TCP subsystem attached
/// back as a controller, the parameters rpc.py sends unasked accepted, the rest refused by name.
#[test]
fn nvme_controllers() {
    const NQN: &str = "nqn.2016-06.io.spdk:cnode7";
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "16", "512"]);
    rpc.ok(&["nvmf_create_transport", "-t", "TCP"]);
    rpc.ok(&["nvmf_create_subsystem", NQN, "-a"]);
    rpc.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc0"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    rpc.ok(&["nvmf_subsystem_add_listener", NQN, "-t", "tcp", "-a", "127.0.0.1", "-s", &port, "-f", "ipv4"]);

    // rpc.py sends delay_cmd_submit, the failback and statistics flags with their defaults.
    rpc.ok(&[
        "bdev_nvme_set_options",
        "-t",
        "3000000",
        "--timeout-admin-us",
        "6000000",
        "-a",
        "abort",
        "-k",
        "5000",
        "-s",
        "2048",
        "-p",
        "2000",
    ]);
    let e = rpc.fails(&["bdev_nvme_set_options", "-d"]);
    assert!(e["message"].as_str().unwrap().starts_with("delay_cmd_submit: not supported"), "{e}");
    let e = rpc.fails(&["bdev_nvme_set_options", "-r", "5"]);
    assert!(e["message"].as_str().unwrap().starts_with("bdev_retry_count: not supported"), "{e}");

    let attach = [
        "bdev_nvme_attach_controller",
        "-b",
        "Nvme0",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port,
        "-f",
        "ipv4",
        "-n",
        NQN,
    ];
    // SPDK's `--psk` names a keyring key (TLS): one the keyring lacks is refused naming it.
    let e = rpc.fails(&[&attach[..], &["--psk", "nope"]].concat());
    assert!(
        e["message"].as_str().unwrap().starts_with("psk: invalid parameter key: no key named 'nope'"),
        "{e}"
    );
    assert_eq!(rpc.ok(&attach), "Nvme0n1");
    let b = rpc.bdev("Nvme0n1");
    assert_eq!(
        (b["num_blocks"].as_u64(), b["block_size"].as_u64()),
        (Some(16 * MIB / 512), Some(512)),
        "{b}"
    );
    assert_eq!(b["driver_specific"]["nvme"]["controller"], "Nvme0", "{b}");
    let c = rpc.json(&["bdev_nvme_get_controllers", "-n", "Nvme0"]);
    assert_eq!(c[0]["name"], "Nvme0", "{c}");
    let path = &c[0]["ctrlrs"][0];
    assert_eq!(path["state"], "enabled", "{c}");
    assert_eq!(path["trid"]["trsvcid"], port.as_str(), "{c}");
    assert_eq!(path["trid"]["subnqn"], NQN, "{c}");
    let cntlid = path["cntlid"].as_u64().expect("a cntlid").to_string();
    rpc.ok(&["bdev_nvme_reset_controller", "Nvme0", "-c", &cntlid]);
    // Options are the process's, refused once a controller is attached (as SPDK does).
    let e = rpc.fails(&["bdev_nvme_set_options", "-t", "1000"]);
    assert!(e["message"].as_str().unwrap().contains("refused once a controller is attached"), "{e}");
    // A second path under the same name through the same address is refused, as SPDK does.
    let e = rpc.fails(&[&attach[..], &["-x", "multipath"]].concat());
    assert!(e["message"].as_str().unwrap().starts_with("traddr: "), "{e}");
    // Through a second listener it is a second path of the same bdev, with the policy of
    // SPDK's newest client (`multipath_opts`).
    let port2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    rpc.ok(&["nvmf_subsystem_add_listener", NQN, "-t", "tcp", "-a", "127.0.0.1", "-s", &port2, "-f", "ipv4"]);
    let mut second = attach.to_vec();
    second[8] = &port2;
    let second =
        [&second[..], &["-x", "multipath", "--policy", "active_active", "--selector", "queue_depth"]]
            .concat();
    assert_eq!(rpc.ok(&second), "Nvme0n1");
    let c = rpc.json(&["bdev_nvme_get_controllers", "-n", "Nvme0"]);
    assert_eq!(c[0]["ctrlrs"].as_array().map(Vec::len), Some(2), "{c}");
    assert_eq!(c[0]["ctrlrs"][1]["trid"]["trsvcid"], port2.as_str(), "{c}");
    let paths = rpc.json(&["bdev_nvme_get_io_paths", "-n", "Nvme0n1"]);
    assert!(paths["poll_groups"].is_array(), "{paths}");
    rpc.ok(&["bdev_nvme_detach_controller", "Nvme0", "-t", "tcp", "-a", "127.0.0.1", "-s", &port2]);
    let c = rpc.json(&["bdev_nvme_get_controllers", "-n", "Nvme0"]);
    assert_eq!(c[0]["ctrlrs"].as_array().map(Vec::len), Some(1), "{c}");
    assert!(rpc.bdev_names().contains(&"Nvme0n1".to_string()));
    let e = rpc.fails(&[
        "bdev_nvme_attach_controller",
        "-b",
        "Nvme1",
        "-t",
        "rdma",
        "-a",
        "127.0.0.1",
        "-n",
        NQN,
    ]);
    assert!(e["message"].as_str().unwrap().starts_with("trtype: 'rdma' is not supported"), "{e}");

    // rpc.py's detach sends every path selector, null when not given.
    rpc.ok(&["bdev_nvme_detach_controller", "Nvme0", "-t", "tcp", "-a", "127.0.0.1", "-s", &port]);
    assert!(!rpc.bdev_names().contains(&"Nvme0n1".to_string()));
    assert_eq!(rpc.json(&["bdev_nvme_get_controllers"]), Value::Array(vec![]));
    rpc.assert_case_covered("nvme_controllers");
}

/// DH-HMAC-CHAP through SPDK's client on both sides of one daemon: keys in the keyring,
/// `nvmf_set_config --dhchap-*`, `nvmf_subsystem_add_host --dhchap-key/--dhchap-ctrlr-key`,
/// `bdev_nvme_attach_controller --dhchap-key/--dhchap-ctrlr-key` to the daemon's own
/// listener, `nvmf_subsystem_set_keys` for the next connection, and `bdev_nvme_set_keys` (keys
/// cleared: the next connection is refused).
#[test]
fn nvmf_dhchap() {
    use std::os::unix::fs::PermissionsExt;
    const NQN: &str = "nqn.2016-06.io.spdk:cnode9";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:2b7c3e6a-0000-4000-8000-000000000009";
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    // Secrets as nvme-cli's gen-dhchap-key writes them (a transform hash, the key, its CRC).
    for (name, text) in [
        ("host0", "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"),
        ("host1", "DHHC-1:00:ISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0Dc1bqW:"),
        ("ctrl0", "DHHC-1:00:YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4AupgK0:"),
    ] {
        let file = d.backing_file(name, 0);
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        rpc.ok(&["keyring_file_add_key", name, file.to_str().unwrap()]);
    }
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "16", "512"]);
    rpc.ok(&["nvmf_create_transport", "-t", "TCP"]);
    rpc.ok(&["nvmf_create_subsystem", NQN]);
    rpc.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc0"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    rpc.ok(&["nvmf_subsystem_add_listener", NQN, "-t", "tcp", "-a", "127.0.0.1", "-s", &port, "-f", "ipv4"]);
    rpc.ok(&["nvmf_set_config", "--dhchap-digests", "sha256,sha384", "--dhchap-dhgroups", "null,ffdhe2048"]);
    let e = rpc.fails(&["nvmf_set_config", "--dhchap-dhgroups", "ffdhe1024"]);
    assert!(e["message"].as_str().unwrap().starts_with("dhchap_dhgroups: "), "{e}");
    rpc.ok(&["nvmf_subsystem_add_host", NQN, HOST, "--dhchap-key", "host0", "--dhchap-ctrlr-key", "ctrl0"]);

    let target = ["-t", "tcp", "-a", "127.0.0.1", "-s", port.as_str(), "-f", "ipv4", "-n", NQN, "-q", HOST];
    let attach = |name: &'static str, keys: &[&'static str]| -> Vec<&str> {
        [&["bdev_nvme_attach_controller", "-b", name][..], &target, keys].concat()
    };
    let bidirectional = attach("Nvme0", &["--dhchap-key", "host0", "--dhchap-ctrlr-key", "ctrl0"]);
    assert_eq!(rpc.ok(&bidirectional), "Nvme0n1");
    rpc.ok(&["bdev_nvme_detach_controller", "Nvme0"]);
    let e = rpc.fails(&attach("Nvme1", &["--dhchap-key", "host1"]));
    assert!(e["message"].as_str().is_some(), "a wrong key is refused: {e}");

    // New keys for the host: the next connection needs them.
    rpc.ok(&["nvmf_subsystem_set_keys", NQN, HOST, "--dhchap-key", "host1"]);
    rpc.fails(&attach("Nvme1", &["--dhchap-key", "host0"]));
    assert_eq!(rpc.ok(&attach("Nvme1", &["--dhchap-key", "host1"])), "Nvme1n1");

    // The host's keys change with bdev_nvme_set_keys: a controller key alone or a key not in
    // the keyring is refused naming it; no key clears them (SPDK's rule), and the next
    // connection, which this subsystem makes authenticate, is refused for want of one.
    let e = rpc.fails(&["bdev_nvme_set_keys", "Nvme1", "--dhchap-ctrlr-key", "ctrl0"]);
    assert!(e["message"].as_str().unwrap().starts_with("dhchap_ctrlr_key: "), "{e}");
    let e = rpc.fails(&["bdev_nvme_set_keys", "Nvme1", "--dhchap-key", "nope"]);
    assert!(e["message"].as_str().unwrap().starts_with("dhchap_key: "), "{e}");
    rpc.ok(&["bdev_nvme_set_keys", "Nvme1"]);
    let e = rpc.fails(&["bdev_nvme_reset_controller", "Nvme1"]);
    assert!(e["message"].as_str().unwrap().contains("no dhchap_key was given"), "{e}");
    rpc.ok(&["bdev_nvme_detach_controller", "Nvme1"]);
    rpc.assert_case_covered("nvmf_dhchap");
}

/// TLS through SPDK's client: a PSK in the interchange format in the keyring,
/// `nvmf_subsystem_add_host --psk`, `nvmf_subsystem_add_listener --secure-channel` (refused on
/// a subsystem any host may use, as SPDK), the listings showing both; a key that is not a PSK
/// is refused naming `psk` and the key, never its text.
#[test]
fn nvmf_tls() {
    use std::os::unix::fs::PermissionsExt;
    const NQN: &str = "nqn.2016-06.io.spdk:cnode10";
    const OPEN: &str = "nqn.2016-06.io.spdk:cnode11";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:2b7c3e6a-0000-4000-8000-000000000010";
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    // nvme-cli's gen-tls-key form: hash 01, 32 bytes and their CRC-32.
    let psk = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    for (name, text) in
        [("psk0", psk), ("dh0", "DHHC-1:00:YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4AupgK0:")]
    {
        let file = d.backing_file(name, 0);
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        rpc.ok(&["keyring_file_add_key", name, file.to_str().unwrap()]);
    }
    rpc.ok(&["nvmf_create_transport", "-t", "TCP"]);
    rpc.ok(&["nvmf_create_subsystem", NQN]);
    rpc.ok(&["nvmf_create_subsystem", OPEN, "-a"]);
    let e = rpc.fails(&["nvmf_subsystem_add_host", NQN, HOST, "--psk", "dh0"]);
    let m = e["message"].as_str().unwrap();
    assert!(m.starts_with("psk: key 'dh0' is not a TLS PSK"), "{e}");
    assert!(!m.contains("YWJj"), "the key's text in an error: {e}");
    rpc.ok(&["nvmf_subsystem_add_host", NQN, HOST, "--psk", "psk0"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let listener = ["-t", "tcp", "-a", "127.0.0.1", "-s", port.as_str(), "-f", "ipv4", "--secure-channel"];
    let e = rpc.fails(&[&["nvmf_subsystem_add_listener", OPEN][..], &listener].concat());
    assert!(e["message"].as_str().unwrap().starts_with("secure_channel: "), "{e}");
    rpc.ok(&[&["nvmf_subsystem_add_listener", NQN][..], &listener].concat());
    let sub = &rpc.json(&["nvmf_get_subsystems", NQN])[0];
    assert_eq!(sub["hosts"], json!([{ "nqn": HOST, "psk": "psk0" }]), "{sub}");
    assert_eq!(sub["listen_addresses"][0]["secure_channel"], json!(true), "{sub}");
    let listeners = rpc.json(&["nvmf_subsystem_get_listeners", NQN]);
    assert_eq!(listeners[0]["secure_channel"], json!(true), "{listeners}");
    // A host speaking NVMe/TCP in the clear gets no ICResp there.
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut icreq = [0u8; 128];
    icreq[..8].copy_from_slice(&[0, 0, 128, 0, 128, 0, 0, 0]);
    s.write_all(&icreq).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.first() != Some(&1) && got.len() < 128, "an ICResp in the clear: {got:?}");
    rpc.ok(&["nvmf_subsystem_remove_host", NQN, HOST]);
    assert_eq!(rpc.json(&["nvmf_get_subsystems", NQN])[0]["hosts"], json!([]));
    rpc.assert_case_covered("nvmf_tls");
}

/// ANA with SPDK's syntax: a subsystem with ANA reporting (`-r`), a namespace in group 2
/// (`-a`), a listener added inaccessible (`-n`), one group's state set (`-g`) and every
/// group's; `nvmf_subsystem_get_listeners` shows each group's state per listener; the
/// namespace moved to another group.
#[test]
fn nvmf_ana() {
    const NQN: &str = "nqn.2016-06.io.spdk:cnode10";
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "16", "512"]);
    rpc.ok(&["nvmf_create_transport", "-t", "TCP"]);
    rpc.ok(&["nvmf_create_subsystem", NQN, "-r", "-m", "2"]);
    rpc.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc0", "-a", "2"]);
    let ports: Vec<String> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string())
        .collect();
    let at = |port: &str| -> Vec<String> {
        ["-t", "tcp", "-a", "127.0.0.1", "-s", port, "-f", "ipv4"].map(String::from).to_vec()
    };
    let with = |head: &[&str], port: &str, tail: &[&str]| -> Vec<String> {
        head.iter().map(|s| s.to_string()).chain(at(port)).chain(tail.iter().map(|s| s.to_string())).collect()
    };
    let run = |args: Vec<String>| rpc.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    run(with(&["nvmf_subsystem_add_listener", NQN], &ports[0], &[]));
    run(with(&["nvmf_subsystem_add_listener", NQN], &ports[1], &["-n", "inaccessible"]));
    run(with(
        &["nvmf_subsystem_listener_set_ana_state", NQN],
        &ports[0],
        &["-n", "non_optimized", "-g", "2"],
    ));
    run(with(&["nvmf_subsystem_listener_set_ana_state", NQN], &ports[1], &["-n", "optimized"]));
    let listeners = rpc.json(&["nvmf_subsystem_get_listeners", NQN]);
    let states: Vec<Vec<&str>> = listeners
        .as_array()
        .expect("an array")
        .iter()
        .map(|l| {
            l["ana_states"]
                .as_array()
                .expect("ana_states")
                .iter()
                .map(|s| s["ana_state"].as_str().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(states, [["optimized", "non_optimized"], ["optimized", "optimized"]], "{listeners}");
    let subsystems = rpc.json(&["nvmf_get_subsystems"]);
    let ours = subsystems.as_array().unwrap().iter().find(|s| s["nqn"] == NQN).expect("listed");
    assert_eq!(
        (&ours["namespaces"][0]["nsid"], &ours["namespaces"][0]["anagrpid"]),
        (&json!(1), &json!(2)),
        "{ours}"
    );
    // The namespace moves to group 1.
    rpc.ok(&["nvmf_subsystem_set_ns_ana_group", NQN, "1", "1"]);
    let subsystems = rpc.json(&["nvmf_get_subsystems", NQN]);
    assert_eq!(subsystems[0]["namespaces"][0]["anagrpid"], json!(1), "{subsystems}");
    rpc.assert_case_covered("nvmf_ana");
}

/// Issue 26's lvol methods: a thin volume given a snapshot as its parent reads the snapshot's
/// data where it owns nothing, and so does one given another bdev (an external snapshot) or
/// cloned from one; a read-only volume's own clusters (only those) are copied to another bdev
/// in the background, polled until complete.
#[test]
fn lvol_parents_and_shallow_copy() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Base", "64", "4096"]);
    rpc.ok(&["bdev_lvol_create_lvstore", "Base", "lvs0", "-c", &MIB.to_string()]);
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "-t", "v", "4"]);
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "-t", "w", "4"]);
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "thick", "4"]);
    let fill = |bdev: &str, offset: u64, byte: u8| {
        let sock = d.controller("fill", bdev, Some(1), false);
        let mut c = BlkClient::open(&sock, 1);
        c.write_all(offset, &vec![byte; MIB as usize]);
        drop(c);
        d.call("vhost_delete_controller", json!({"ctrlr": "fill"}));
    };
    let first_bytes = |bdev: &str, mibs: u64| -> Vec<u8> {
        let sock = d.controller("peek", bdev, Some(1), true);
        let mut c = BlkClient::connect(&sock, common::ClientOpts { read_only: true, ..Default::default() })
            .expect("read-only client");
        let got = (0..mibs).map(|i| c.read_all(i * MIB, 4096)[0]).collect();
        drop(c);
        d.call("vhost_delete_controller", json!({"ctrlr": "peek"}));
        got
    };

    // v: 0x11 in its first MiB, snapshot s, then 0x22 in its third MiB (v's own cluster).
    fill("lvs0/v", 0, 0x11);
    rpc.ok(&["bdev_lvol_snapshot", "lvs0/v", "s"]);
    fill("lvs0/v", 2 * MIB, 0x22);

    // w becomes s's child: s's data shows through where w owns nothing.
    assert_eq!(first_bytes("lvs0/w", 4), [0, 0, 0, 0]);
    rpc.ok(&["bdev_lvol_set_parent", "lvs0/w", "lvs0/s"]);
    assert_eq!(first_bytes("lvs0/w", 4), [0x11, 0, 0, 0]);
    let lvols = rpc.json(&["bdev_lvol_get_lvols", "-l", "lvs0"]);
    let w = lvols.as_array().unwrap().iter().find(|l| l["name"] == "w").unwrap();
    assert_eq!(w["is_clone"], true, "{lvols}");
    // Only a thin volume takes a parent; the error names the field.
    let e = rpc.fails(&["bdev_lvol_set_parent", "lvs0/thick", "lvs0/s"]);
    assert!(e["message"].as_str().unwrap().starts_with("lvol_name"), "{e}");

    // External snapshots: a RAM disk `Golden` as the parent of a thin volume, and cloned.
    rpc.ok(&["bdev_malloc_create", "-b", "Golden", "4", "4096"]);
    fill("Golden", MIB, 0x33);
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "-t", "e", "4"]);
    rpc.ok(&["bdev_lvol_set_parent_bdev", "lvs0/e", "Golden"]);
    assert_eq!(first_bytes("lvs0/e", 4), [0, 0x33, 0, 0]);
    let clone = rpc.ok(&["bdev_lvol_clone_bdev", "Golden", "lvs0", "gc"]);
    assert_eq!(rpc.bdev("lvs0/gc")["name"], clone.trim_matches('"'), "the clone's UUID is its name");
    assert_eq!(first_bytes("lvs0/gc", 4), [0, 0x33, 0, 0]);
    let lvols = rpc.json(&["bdev_lvol_get_lvols", "-l", "lvs0"]);
    let gc = lvols.as_array().unwrap().iter().find(|l| l["name"] == "gc").unwrap();
    assert_eq!(gc["is_esnap_clone"], true, "{lvols}");
    let e = rpc.fails(&["bdev_lvol_clone_bdev", "Nope", "lvs0", "gc2"]);
    assert!(e["message"].as_str().unwrap().starts_with("bdev"), "{e}");

    // A shallow copy of v copies its one own cluster, at its own offset, and nothing else.
    rpc.ok(&["bdev_malloc_create", "-b", "Dst", "8", "4096"]);
    fill("Dst", 0, 0xff);
    let e = rpc.fails(&["bdev_lvol_start_shallow_copy", "lvs0/v", "Dst"]);
    assert!(e["message"].as_str().unwrap().starts_with("src_lvol_name"), "the volume must be read-only: {e}");
    rpc.ok(&["bdev_lvol_set_read_only", "lvs0/v"]);
    let op = rpc.json(&["bdev_lvol_start_shallow_copy", "lvs0/v", "Dst"]);
    let id = op["operation_id"].as_u64().unwrap_or_else(|| panic!("no operation_id: {op}")).to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let s = rpc.json(&["bdev_lvol_check_shallow_copy", &id]);
        if s["state"] != "in progress" {
            break s;
        }
        assert!(Instant::now() < deadline, "shallow copy {id} still running: {s}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!((&done["state"], done["copied_clusters"].as_u64()), (&json!("complete"), Some(1)), "{done}");
    assert_eq!(done["total_clusters"].as_u64(), Some(1), "{done}");
    assert_eq!(first_bytes("Dst", 4), [0xff, 0, 0x22, 0]);
    rpc.assert_case_covered("lvol_parents_and_shallow_copy");
}

/// `bdev_raid_get_bdevs all`'s entry for `name`.
fn raid_entry(rpc: &SpdkRpc, name: &str) -> Value {
    let all = rpc.json(&["bdev_raid_get_bdevs", "all"]);
    all.as_array()
        .and_then(|l| l.iter().find(|r| r["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("raid {name} not listed: {all}"))
}

#[test]
fn raid_levels_and_replicas() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    for m in ["M0", "M1", "M2", "M3", "M4"] {
        rpc.ok(&["bdev_malloc_create", "-b", m, "32", "4096"]);
    }

    // raid1 with a superblock: rpc.py splits `-b` at whitespace and sends a list.
    // rpc.py prints nothing for bdev_raid_create.
    assert_eq!(rpc.ok(&["bdev_raid_create", "-n", "r1", "-r", "raid1", "-b", "M0 M1", "-s"]), "");
    let r = raid_entry(&rpc, "r1");
    assert_eq!(
        (&r["raid_level"], &r["state"], &r["superblock"]),
        (&json!("raid1"), &json!("online"), &json!(true)),
        "{r}"
    );
    assert_eq!(
        (r["num_base_bdevs"].as_u64(), r["num_base_bdevs_operational"].as_u64()),
        (Some(2), Some(2)),
        "{r}"
    );
    let names: Vec<&str> =
        r["base_bdevs_list"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["M0", "M1"], "{r}");
    // The superblock and bitmap take the start of each base; the raid is the rest.
    let data_blocks = r["base_bdevs_list"][0]["data_size"].as_u64().unwrap();
    assert!(r["base_bdevs_list"][0]["data_offset"].as_u64() > Some(0), "{r}");
    assert_eq!(rpc.bdev("r1")["num_blocks"].as_u64(), Some(data_blocks));

    // raid0 by SPDK's alias "0", strip size in KiB; no superblock: the whole bases.
    rpc.ok(&["bdev_raid_create", "-n", "r0", "-r", "0", "-z", "64", "-b", "M2 M3"]);
    assert_eq!(rpc.bdev("r0")["num_blocks"].as_u64(), Some(2 * 32 * MIB / 4096));
    let online = rpc.json(&["bdev_raid_get_bdevs", "online"]);
    assert_eq!(online.as_array().map(Vec::len), Some(2), "{online}");
    assert_eq!(rpc.json(&["bdev_raid_get_bdevs", "configuring"]), json!([]));

    // Refusals name the field: a strip size that is not a power of two, a claimed base.
    let e = rpc.fails(&["bdev_raid_create", "-n", "bad", "-r", "raid0", "-z", "3", "-b", "M4 M0"]);
    assert_eq!(e["code"], -32602, "{e}");
    assert!(e["message"].as_str().unwrap().starts_with("strip_size_kb"), "{e}");
    assert!(!rpc.run(&["bdev_raid_create", "-n", "bad", "-r", "raid1", "-b", "M4 M0"]).success);
    assert!(!rpc.run(&["bdev_raid_remove_base_bdev", "M2"]).success, "a raid0 base cannot be removed");

    // A replica out and back: the raid1 stays online, degraded, and rebuilds.
    rpc.ok(&["bdev_raid_set_options", "-w", "512", "-b", "1000"]);
    rpc.ok(&["bdev_raid_remove_base_bdev", "M1"]);
    let r = raid_entry(&rpc, "r1");
    assert_eq!((&r["state"], r["num_base_bdevs_operational"].as_u64()), (&json!("online"), Some(1)), "{r}");
    assert!(!rpc.run(&["bdev_raid_remove_base_bdev", "M0"]).success, "the last replica cannot be removed");
    rpc.ok(&["bdev_raid_add_base_bdev", "r1", "M1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = raid_entry(&rpc, "r1");
        if r["num_base_bdevs_operational"] == 2 && r["process"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "the rebuild did not finish: {r}");
        std::thread::sleep(Duration::from_millis(20));
    }

    rpc.ok(&["bdev_raid_delete", "r0"]);
    rpc.ok(&["bdev_raid_delete", "r1"]);
    assert_eq!(rpc.json(&["bdev_raid_get_bdevs", "all"]), json!([]));

    // M0 still carries r1's superblock. With auto-examine off (a replica host), a new bdev
    // over it is left alone until bdev_examine names it; then the raid module finds r1.
    let e = rpc.fails(&["bdev_examine", "-b", "M0"]);
    assert!(e["message"].as_str().unwrap().starts_with("name: bdev_auto_examine is on"), "{e}");
    rpc.ok(&["bdev_set_options", "--no-auto-examine"]);
    rpc.ok(&["bdev_delay_create", "-b", "M0", "-d", "D0", "-r", "0", "-t", "0", "-w", "0", "-n", "0"]);
    assert_eq!(rpc.json(&["bdev_raid_get_bdevs", "all"]), json!([]));
    rpc.ok(&["bdev_examine", "-b", "D0"]);
    let r = raid_entry(&rpc, "r1");
    assert_eq!(r["state"], "configuring", "one of two replicas found: {r}");
    rpc.ok(&["bdev_raid_delete", "r1"]);
    rpc.ok(&["bdev_set_options", "--auto-examine"]);
    let e = rpc.fails(&["bdev_set_options", "-p", "1024"]);
    assert!(e["message"].as_str().unwrap().starts_with("bdev_io_pool_size: not supported"), "{e}");
    rpc.ok(&["bdev_delay_delete", "D0"]);
    // The bases are free again.
    for m in ["M0", "M1", "M2", "M3", "M4"] {
        rpc.ok(&["bdev_malloc_delete", m]);
    }
    rpc.assert_case_covered("raid_levels_and_replicas");
}

#[test]
fn iostat_histogram_and_qos() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "16", "512"]);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc1", "16", "512"]);

    // QoS: every one of SPDK's four limits lands in assigned_rate_limits; 0 lifts one.
    rpc.ok(&[
        "bdev_set_qos_limit",
        "Malloc0",
        "--rw-ios-per-sec",
        "20000",
        "--rw-mbytes-per-sec",
        "100",
        "--r-mbytes-per-sec",
        "50",
        "--w-mbytes-per-sec",
        "40",
    ]);
    let limits = &rpc.bdev("Malloc0")["assigned_rate_limits"];
    let want = [
        ("rw_ios_per_sec", 20000),
        ("rw_mbytes_per_sec", 100),
        ("r_mbytes_per_sec", 50),
        ("w_mbytes_per_sec", 40),
    ];
    for (k, v) in want {
        assert_eq!(limits[k].as_u64(), Some(v), "{k}: {limits}");
    }
    rpc.ok(&["bdev_set_qos_limit", "Malloc0", "--rw-ios-per-sec", "0"]);
    let limits = &rpc.bdev("Malloc0")["assigned_rate_limits"];
    assert_eq!(
        (limits["rw_ios_per_sec"].as_u64(), limits["rw_mbytes_per_sec"].as_u64()),
        (Some(0), Some(100))
    );

    // Histograms on, then I/O through a vhost client so the counters move.
    rpc.ok(&["bdev_enable_histogram", "--histogram", "--granularity", "7", "Malloc1"]);
    rpc.ok(&["vhost_create_blk_controller", "vhost.1", "Malloc1"]);
    let mut client = BlkClient::open(&d.dir.path().join("vhost.1"), 1);
    for i in 0..4u64 {
        assert_eq!(client.write(0, i * 4096, &[0x5a; 4096]), 0, "write {i}");
    }
    assert!(client.read(0, 0, 4096).is_ok(), "read");
    drop(client);

    let s = rpc.json(&["bdev_get_iostat"]);
    assert!(s["tick_rate"].as_u64().is_some_and(|t| t > 0) && s["ticks"].is_u64(), "{s}");
    let one = |s: &Value, name: &str| -> Value {
        s["bdevs"].as_array().expect("bdevs").iter().find(|b| b["name"] == name).cloned().expect(name)
    };
    let m1 = one(&s, "Malloc1");
    assert_eq!(
        (m1["num_write_ops"].as_u64(), m1["bytes_written"].as_u64()),
        (Some(4), Some(4 * 4096)),
        "{m1}"
    );
    assert_eq!(m1["num_read_ops"].as_u64(), Some(1), "{m1}");
    assert_eq!(one(&s, "Malloc0")["num_write_ops"].as_u64(), Some(0));
    let h = rpc.json(&["bdev_get_histogram", "Malloc1"]);
    assert_eq!(h["granularity"].as_u64(), Some(7), "{h}");
    assert!(h["tsc_rate"].as_u64().is_some_and(|t| t > 0), "{h}");
    assert!(h["histogram"].as_str().is_some_and(|b| !b.is_empty()), "the histogram is base64 data");
    assert_eq!(h["count"].as_u64(), Some(5), "4 writes and a read counted");

    rpc.ok(&["bdev_reset_iostat", "-b", "Malloc1", "-m", "all"]);
    let m1 = one(&rpc.json(&["bdev_get_iostat"]), "Malloc1");
    assert_eq!((m1["num_write_ops"].as_u64(), m1["num_read_ops"].as_u64()), (Some(0), Some(0)), "{m1}");
    rpc.ok(&["bdev_reset_iostat"]);

    rpc.ok(&["bdev_enable_histogram", "--no-histogram", "Malloc1"]);
    rpc.fails(&["bdev_get_histogram", "Malloc1"]);
    rpc.assert_case_covered("iostat_histogram_and_qos");
}

#[test]
fn lvol_store_and_volumes() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Base", "64", "4096"]);

    let uuid = rpc.ok(&["bdev_lvol_create_lvstore", "Base", "lvs0"]);
    let stores = rpc.json(&["bdev_lvol_get_lvstores", "-l", "lvs0"]);
    assert_eq!(stores.as_array().map(Vec::len), Some(1), "{stores}");
    assert_eq!(
        (stores[0]["uuid"].as_str(), stores[0]["base_bdev"].as_str()),
        (Some(uuid.as_str()), Some("Base"))
    );
    assert_eq!(rpc.json(&["bdev_lvol_get_lvstores", "-u", &uuid]), stores);
    let free = stores[0]["free_clusters"].as_u64().expect("free_clusters");

    // Thin and thick volumes, sizes in MiB; the bdev is the lvol's UUID with alias lvs/name.
    let thin = rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "-t", "thin", "8"]);
    let thick = rpc.ok(&["bdev_lvol_create", "-u", &uuid, "thick", "4"]);
    let b = rpc.bdev("lvs0/thin");
    assert_eq!(b["name"], thin.as_str());
    assert_eq!(b["aliases"], serde_json::json!(["lvs0/thin"]));
    assert_eq!(b["num_blocks"].as_u64(), Some(8 * MIB / 4096));
    assert_eq!(rpc.bdev(&thick)["num_blocks"].as_u64(), Some(4 * MIB / 4096));
    let lvols = rpc.json(&["bdev_lvol_get_lvols", "-l", "lvs0"]);
    let lvol = |lvols: &Value, name: &str| -> Value {
        lvols
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(lvol(&lvols, "thin")["is_thin_provisioned"], true);
    assert_eq!(lvol(&lvols, "thick")["is_thin_provisioned"], false);
    assert_eq!(lvol(&lvols, "thick")["lvs"]["name"], "lvs0");
    assert_eq!(rpc.json(&["bdev_lvol_get_lvols", "-u", &uuid]), lvols);

    // Snapshot, clone, inflate, decouple.
    let snap = rpc.ok(&["bdev_lvol_snapshot", "lvs0/thin", "snap"]);
    assert_eq!(rpc.bdev("lvs0/snap")["name"], snap.as_str());
    rpc.ok(&["bdev_lvol_clone", "lvs0/snap", "clone"]);
    rpc.ok(&["bdev_lvol_clone", "lvs0/snap", "clone2"]);
    let lvols = rpc.json(&["bdev_lvol_get_lvols"]);
    assert_eq!(lvol(&lvols, "snap")["is_snapshot"], true);
    assert_eq!(lvol(&lvols, "clone")["is_clone"], true);
    assert_eq!(lvol(&lvols, "thin")["is_clone"], true, "the snapshotted volume is now a clone of it");
    rpc.ok(&["bdev_lvol_inflate", "lvs0/clone"]);
    rpc.ok(&["bdev_lvol_decouple_parent", "lvs0/clone2"]);
    let lvols = rpc.json(&["bdev_lvol_get_lvols"]);
    assert_eq!(lvol(&lvols, "clone")["is_clone"], false, "inflated");
    assert_eq!(lvol(&lvols, "clone")["is_thin_provisioned"], false, "inflated");
    assert_eq!(lvol(&lvols, "clone2")["is_clone"], false, "decoupled");

    // Resize, rename, read-only, delete.
    rpc.ok(&["bdev_lvol_resize", "lvs0/thick", "12"]);
    assert_eq!(rpc.bdev("lvs0/thick")["num_blocks"].as_u64(), Some(12 * MIB / 4096));
    rpc.ok(&["bdev_lvol_rename", "lvs0/thick", "big"]);
    assert_eq!(rpc.bdev("lvs0/big")["name"], thick.as_str());
    rpc.fails(&["bdev_get_bdevs", "-b", "lvs0/thick"]);
    rpc.ok(&["bdev_lvol_set_read_only", "lvs0/big"]);
    rpc.ok(&["bdev_lvol_delete", "lvs0/clone2"]);
    let names: BTreeSet<String> = rpc
        .json(&["bdev_lvol_get_lvols"])
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["big", "clone", "snap", "thin"].into_iter().map(String::from).collect());
    assert!(rpc.json(&["bdev_lvol_get_lvstores"])[0]["free_clusters"].as_u64() < Some(free));

    // The store: rename, grow (by name and by UUID: the base did not grow, so nothing to add),
    // delete with its volumes.
    rpc.ok(&["bdev_lvol_rename_lvstore", "lvs0", "lvs1"]);
    assert_eq!(rpc.bdev(&thick)["aliases"], serde_json::json!(["lvs1/big"]));
    assert_eq!(rpc.ok(&["bdev_lvol_grow_lvstore", "-l", "lvs1"]), "true");
    assert_eq!(rpc.ok(&["bdev_lvol_grow_lvstore", "-u", &uuid]), "true");
    rpc.ok(&["bdev_lvol_delete_lvstore", "-l", "lvs1"]);
    assert_eq!(rpc.json(&["bdev_lvol_get_lvstores"]), Value::Array(vec![]));
    assert_eq!(rpc.bdev_names(), ["Base"]);

    // SPDK's options: a cluster size and clear method for the store, one for each volume.
    rpc.ok(&["bdev_lvol_create_lvstore", "-c", "1048576", "--clear-method", "none", "Base", "lvs2"]);
    assert_eq!(rpc.json(&["bdev_lvol_get_lvstores"])[0]["cluster_size"].as_u64(), Some(MIB));
    for method in ["none", "unmap", "write_zeroes"] {
        let uuid = rpc.ok(&["bdev_lvol_create", "-l", "lvs2", "-c", method, method, "3"]);
        assert_eq!(rpc.bdev(&uuid)["num_blocks"].as_u64(), Some(3 * MIB / 4096), "{method}");
    }
    rpc.assert_case_covered("lvol_store_and_volumes");
}

#[test]
fn uring_and_delay() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    let file = d.backing_file("disk.img", 8 * MIB);
    let path = file.to_str().unwrap();

    // bdev_uring_create FILE NAME [BLOCK_SIZE].
    assert_eq!(rpc.ok(&["bdev_uring_create", path, "Uring0", "4096"]), "Uring0");
    let b = rpc.bdev("Uring0");
    assert_eq!((b["block_size"].as_u64(), b["num_blocks"].as_u64()), (Some(4096), Some(8 * MIB / 4096)));
    std::fs::File::options().write(true).open(&file).unwrap().set_len(16 * MIB).unwrap();
    assert_eq!(rpc.ok(&["bdev_uring_rescan", "Uring0"]), "true");
    assert_eq!(rpc.bdev("Uring0")["num_blocks"].as_u64(), Some(16 * MIB / 4096));

    // bdev_delay_create -b BASE -d NAME -r AVG_READ -t P99_READ -w AVG_WRITE -n P99_WRITE.
    let args =
        ["bdev_delay_create", "-b", "Uring0", "-d", "Delay0", "-r", "10", "-t", "20", "-w", "30", "-n", "40"];
    assert_eq!(rpc.ok(&args), "Delay0");
    let delay = |rpc: &SpdkRpc| rpc.bdev("Delay0")["driver_specific"]["delay"].clone();
    let want = [
        ("avg_read_latency", 10),
        ("p99_read_latency", 20),
        ("avg_write_latency", 30),
        ("p99_write_latency", 40),
    ];
    let got = delay(&rpc);
    for (k, v) in want {
        assert_eq!(got[k].as_u64(), Some(v), "{k}: {got}");
    }
    assert_eq!(got["base_bdev_name"], "Uring0");
    assert_eq!(rpc.ok(&["bdev_delay_update_latency", "Delay0", "avg_read", "15"]), "true");
    assert_eq!(rpc.ok(&["bdev_delay_update_latency", "Delay0", "p99_write", "50"]), "true");
    let got = delay(&rpc);
    assert_eq!((got["avg_read_latency"].as_u64(), got["p99_write_latency"].as_u64()), (Some(15), Some(50)));
    assert_eq!(rpc.bdev("Uring0")["claimed"], true);

    rpc.ok(&["bdev_delay_delete", "Delay0"]);
    assert_eq!(rpc.bdev("Uring0")["claimed"], false);
    rpc.ok(&["bdev_uring_delete", "Uring0"]);
    assert!(rpc.bdev_names().is_empty());
    rpc.assert_case_covered("uring_and_delay");
}

#[test]
fn crypto_and_keys() {
    use std::os::unix::fs::PermissionsExt;
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    let k1 = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let k2 = "ffeeddccbbaa99887766554433221100f0e1d2c3b4a5968778695a4b3c2d1e0f";

    // keyring_file_add_key NAME PATH: owner-only files only, refused naming `path`.
    let key_file = d.backing_file("tls.key", 0);
    std::fs::write(&key_file, "NVMeTLSkey-1:01:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0:").unwrap();
    let path = key_file.to_str().unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = rpc.fails(&["keyring_file_add_key", "tls0", path]);
    assert!(e["message"].as_str().unwrap().starts_with("path:"), "{e}");
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    rpc.ok(&["keyring_file_add_key", "tls0", path]);
    let keys = rpc.json(&["keyring_get_keys"]);
    assert_eq!(keys[0]["name"], "tls0", "{keys}");
    assert_eq!(keys[0]["path"], path, "{keys}");
    assert!(!keys.to_string().contains("c2Vj"), "key material returned: {keys}");
    rpc.ok(&["keyring_file_remove_key", "tls0"]);
    assert_eq!(rpc.json(&["keyring_get_keys"]), json!([]));

    // accel_crypto_key_create -c AES_XTS -k KEY -e KEY2 -n NAME.
    let e = rpc.fails(&[
        "accel_crypto_key_create",
        "-c",
        "AES_XTS",
        "-k",
        &k1[..40],
        "-e",
        &k2[..40],
        "-n",
        "bad",
    ]);
    assert!(e["message"].as_str().unwrap().starts_with("key:"), "{e}");
    let e = rpc.fails(&["accel_crypto_key_create", "-c", "AES_XTS", "-k", k1, "-e", k1, "-n", "bad"]);
    assert!(e["message"].as_str().unwrap().starts_with("key2:"), "{e}");
    assert!(!e.to_string().contains(&k1[..16]), "key material in the error: {e}");
    rpc.ok(&["accel_crypto_key_create", "-c", "AES_XTS", "-k", k1, "-e", k2, "-n", "key0"]);
    rpc.ok(&[
        "accel_crypto_key_create",
        "-c",
        "AES_XTS",
        "-k",
        &k1[..32],
        "-e",
        &k2[..32],
        "-t",
        "SIMPLE_LBA",
        "-n",
        "key1",
    ]);
    let keys = rpc.json(&["accel_crypto_keys_get"]);
    assert_eq!(keys.as_array().unwrap().len(), 2, "{keys}");
    assert!(!keys.to_string().contains(&k1[..16]) && !keys.to_string().contains(&k2[..16]), "{keys}");
    let one = rpc.json(&["accel_crypto_keys_get", "-k", "key0"]);
    assert_eq!(
        (one[0]["name"].as_str(), one[0]["cipher"].as_str()),
        (Some("key0"), Some("AES_XTS")),
        "{one}"
    );

    // bdev_crypto_create BASE NAME -n KEY_NAME.
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "8", "4096"]);
    assert_eq!(rpc.ok(&["bdev_crypto_create", "Malloc0", "Crypto0", "-n", "key0"]), "Crypto0");
    let b = rpc.bdev("Crypto0");
    assert_eq!((b["block_size"].as_u64(), b["num_blocks"].as_u64()), (Some(4096), Some(8 * MIB / 4096)));
    let ds = &b["driver_specific"]["crypto"];
    assert_eq!(
        (ds["base_bdev_name"].as_str(), ds["key_name"].as_str()),
        (Some("Malloc0"), Some("key0")),
        "{b}"
    );
    assert_eq!(rpc.bdev("Malloc0")["claimed"], true);
    let e = rpc.fails(&["accel_crypto_key_destroy", "-n", "key0"]);
    assert!(e["message"].as_str().unwrap().contains("in use by 'Crypto0'"), "{e}");

    rpc.ok(&["bdev_crypto_delete", "Crypto0"]);
    assert_eq!(rpc.bdev("Malloc0")["claimed"], false);
    rpc.ok(&["accel_crypto_key_destroy", "-n", "key0"]);
    rpc.ok(&["accel_crypto_key_destroy", "-n", "key1"]);
    assert_eq!(rpc.json(&["accel_crypto_keys_get"]), json!([]));
    rpc.assert_case_covered("crypto_and_keys");
}

#[test]
fn rbd_on_a_real_cluster() {
    let Some(ceph) = CephCluster::start() else { return };
    ceph.create_image("img", 16);
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    let conf = ceph.conf().to_str().unwrap();

    assert_eq!(rpc.ok(&["bdev_rbd_register_cluster", "c1", "--config-file", conf]), "c1");
    let args =
        ["bdev_rbd_register_cluster", "c2", "--config-file", conf, "--config-param", "rbd_cache=false"];
    assert_eq!(rpc.ok(&[&args[..], &["--user", "admin"]].concat()), "c2");
    let all = rpc.json(&["bdev_rbd_get_clusters_info"]);
    assert_eq!(all.as_array().map(Vec::len), Some(2), "{all}");
    let c2 = rpc.json(&["bdev_rbd_get_clusters_info", "-b", "c2"]);
    assert_eq!(c2["cluster_name"], "c2");
    assert_eq!(c2["config_file"], conf);
    assert_eq!(c2["config_param"]["rbd_cache"], "false");
    assert_eq!(c2["user_id"], "admin");

    // bdev_rbd_create POOL IMAGE BLOCK_SIZE: SPDK's default name Ceph0; -r for read-only.
    assert_eq!(rpc.ok(&["bdev_rbd_create", "-c", "c1", "rbd", "img", "4096"]), "Ceph0");
    let b = rpc.bdev("Ceph0");
    assert_eq!((b["block_size"].as_u64(), b["num_blocks"].as_u64()), (Some(4096), Some(16 * MIB / 4096)));
    assert_eq!(rpc.ok(&["bdev_rbd_create", "-b", "Ro", "-r", "-c", "c2", "rbd", "img", "512"]), "Ro");
    assert_eq!(rpc.bdev("Ro")["supported_io_types"]["write"], false);
    // A bdev with its own connection: --config key=value instead of a cluster.
    let mon = format!("mon_host={}", ceph.mon_host());
    let own = ["bdev_rbd_create", "-b", "Own", "--config", &mon, "--config", "auth_client_required=none"];
    assert_eq!(rpc.ok(&[&own[..], &["rbd", "img", "4096"]].concat()), "Own");

    // bdev_rbd_resize NAME MIB: the image grows, as `rbd info` sees.
    assert_eq!(rpc.ok(&["bdev_rbd_resize", "Ceph0", "32"]), "true");
    assert_eq!(ceph.image_info("img")["size"].as_u64(), Some(32 * MIB));
    assert_eq!(rpc.bdev("Ceph0")["num_blocks"].as_u64(), Some(32 * MIB / 4096));

    for name in ["Ceph0", "Ro", "Own"] {
        rpc.ok(&["bdev_rbd_delete", name]);
    }
    assert!(rpc.bdev_names().is_empty());
    rpc.ok(&["bdev_rbd_unregister_cluster", "c1"]);
    rpc.ok(&["bdev_rbd_unregister_cluster", "c2"]);
    assert_eq!(rpc.json(&["bdev_rbd_get_clusters_info"]), Value::Array(vec![]));
    rpc.assert_case_covered("rbd_on_a_real_cluster");
}

/// SPDK's error bdev: errors injected through spdk-rpc reach a vhost client as I/O errors, `num`
/// of them, and the data path is whole again once they are used up or cleared.
#[test]
fn error_injection_reaches_a_vhost_client() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    assert_eq!(rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "8", "512"]), "Malloc0");
    // bdev_error_create BASE: SPDK names it EE_<BASE> and answers true.
    assert_eq!(rpc.ok(&["bdev_error_create", "Malloc0"]), "true");
    assert_eq!(rpc.bdev("EE_Malloc0")["driver_specific"]["error"]["base_bdev_name"], "Malloc0");
    assert_eq!(rpc.bdev("Malloc0")["claimed"], true);
    rpc.ok(&["vhost_create_blk_controller", "vhost.e", "EE_Malloc0"]);
    let mut client = BlkClient::open(&d.dir.path().join("vhost.e"), 1);
    assert_eq!(client.write(0, 0, &[0x3c; 4096]), 0);

    // bdev_error_inject_error NAME IO_TYPE ERROR_TYPE -n NUM: two reads fail, then they pass.
    rpc.ok(&["bdev_error_inject_error", "EE_Malloc0", "read", "failure", "-n", "2"]);
    assert_eq!(client.read(0, 0, 4096), Err(-libc::EIO));
    assert_eq!(client.read(0, 0, 4096), Err(-libc::EIO));
    assert_eq!(client.read(0, 0, 4096), Ok(vec![0x3c; 4096]));
    // Writes too, until cleared.
    rpc.ok(&["bdev_error_inject_error", "EE_Malloc0", "write", "failure", "-n", "1000"]);
    assert_eq!(client.write(0, 0, &[0x11; 4096]), -libc::EIO);
    assert_eq!(rpc.bdev("EE_Malloc0")["driver_specific"]["error"]["injections"]["write"]["num"], 999);
    rpc.ok(&["bdev_error_inject_error", "EE_Malloc0", "clear", "failure"]);
    assert_eq!(client.write(0, 0, &[0x11; 4096]), 0);
    // A read corrupted on its way back: one byte xored, the disk keeps its data.
    rpc.ok(&["bdev_error_inject_error", "EE_Malloc0", "read", "corrupt_data", "-o", "9", "-v", "255"]);
    let mut want = vec![0x11; 4096];
    want[9] = 0xee;
    assert_eq!(client.read(0, 0, 4096), Ok(want));
    assert_eq!(client.read(0, 0, 4096), Ok(vec![0x11; 4096]));
    // A write corrupted on its way down: the disk has one byte changed.
    rpc.ok(&["bdev_error_inject_error", "EE_Malloc0", "write", "corrupt_data", "-o", "4095", "-v", "1"]);
    assert_eq!(client.write(0, 0, &[0x22; 4096]), 0);
    let mut want = vec![0x22; 4096];
    want[4095] = 0x23;
    assert_eq!(client.read(0, 0, 4096), Ok(want));
    // Nothing held: resuming is a no-op that succeeds.
    rpc.ok(&["bdev_error_resume_pending", "EE_Malloc0"]);
    let e = rpc.fails(&["bdev_error_inject_error", "EE_Malloc0", "read", "nvme_failure"]);
    assert!(e["message"].as_str().unwrap().starts_with("error_type: "), "{e}");
    drop(client);

    rpc.ok(&["vhost_delete_controller", "vhost.e"]);
    rpc.ok(&["bdev_error_delete", "EE_Malloc0"]);
    assert_eq!(rpc.bdev("Malloc0")["claimed"], false);
    rpc.ok(&["bdev_malloc_delete", "Malloc0"]);
    rpc.assert_case_covered("error_injection_reaches_a_vhost_client");
}

/// On a host without ublk_drv (the test machines' kernels), SPDK's client gets a one-line
/// refusal naming the control device, and no target is made.
#[test]
fn ublk_without_ublk_drv_is_refused_naming_the_control_device() {
    if Path::new("/dev/ublk-control").exists() {
        eprintln!("this host has /dev/ublk-control: the refusal is not testable here");
        return;
    }
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    let e = rpc.fails(&["ublk_create_target"]);
    assert_eq!(e["code"], -libc::ENODEV, "{e}");
    let m = e["message"].as_str().unwrap_or_default();
    assert!(m.contains("/dev/ublk-control") && m.contains("ublk_drv") && !m.contains('\n'), "{e}");
    let e = rpc.fails(&["ublk_start_disk", "Malloc0", "1"]);
    assert!(e["message"].as_str().unwrap_or_default().contains("ublk_create_target"), "{e}");
    assert_eq!(rpc.json(&["ublk_get_disks"]), json!([]));
}

#[test]
fn errors_come_back_through_spdk_rpc() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "8", "512"]);

    // A value out of range: flashpath's message, invalid params, exit 1.
    let e = rpc.fails(&["bdev_set_qos_limit", "Malloc0", "--rw-ios-per-sec", "500"]);
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(e["message"], "rw_ios_per_sec: 500 is below the minimum of 1000");
    // An SPDK option flashpath does not implement is refused by name, not ignored.
    let e = rpc.fails(&[
        "bdev_malloc_create",
        "-b",
        "M1",
        "-u",
        "11111111-2222-3333-4444-555555555555",
        "8",
        "512",
    ]);
    assert_eq!(e["code"], -32602, "{e}");
    assert!(e["message"].as_str().unwrap().starts_with("uuid:"), "{e}");
    // An unknown bdev: ENODEV, with its name.
    let e = rpc.fails(&["bdev_get_bdevs", "-b", "nope"]);
    assert_eq!(e["code"], -19, "{e}");
    assert_eq!(e["message"], "bdev 'nope' does not exist");
    // A file that is not there.
    let e = rpc.fails(&["bdev_rbd_register_cluster", "bad", "--config-file", "/nonexistent/ceph.conf"]);
    assert!(e["message"].as_str().unwrap().contains("/nonexistent/ceph.conf"), "{e}");
    // Nothing changed.
    assert_eq!(rpc.bdev_names(), ["Malloc0"]);
    assert_eq!(rpc.json(&["bdev_rbd_get_clusters_info"]), Value::Array(vec![]));
}

// ---- Where spdk-rpc first found flashpath differing from SPDK (fixed since). ----

/// `vhost_create_blk_controller -p` (SPDK: offer packed rings): flashpath offers
/// VIRTIO_F_RING_PACKED to every frontend, so it takes `packed_ring: true` (it refused it once).
#[test]
fn vhost_packed_ring_flags_are_accepted() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "8", "512"]);
    rpc.ok(&["vhost_create_blk_controller", "-p", "vhost.0", "Malloc0"]);
    assert!(d.dir.path().join("vhost.0").exists());
}

/// `nbd_start_disk BDEV` without a device: SPDK picks one and returns it; so does flashpath
/// (a socket in the vhost directory).
#[test]
fn nbd_start_disk_without_a_device_picks_one() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "8", "512"]);
    let device = rpc.ok(&["nbd_start_disk", "Malloc0"]);
    assert!(!device.is_empty(), "nbd_start_disk returns the device it chose");
    let disks = rpc.json(&["nbd_get_disks"]);
    assert_eq!(disks[0]["nbd_device"].as_str(), Some(device.as_str()), "{disks}");
}

/// `bdev_get_iostat --names A,B` and `--reset-mode`: SPDK 26.9's client sends `names` (a list)
/// and `reset_mode`, not the older `name`.
#[test]
fn bdev_get_iostat_takes_names_and_a_reset_mode() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "8", "512"]);
    rpc.ok(&["bdev_malloc_create", "-b", "Malloc1", "8", "512"]);
    let s = rpc.json(&["bdev_get_iostat", "--names", "Malloc1"]);
    let names: Vec<&str> =
        s["bdevs"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Malloc1"]);
    let s = rpc.json(&["bdev_get_iostat", "-c", "--names", "Malloc1"]);
    assert!(s["channels"].is_array() || s["bdevs"].is_array(), "{s}");
    rpc.json(&["bdev_get_iostat", "--reset-mode", "all"]);
}

/// `bdev_lvol_create -c default`: spdk-rpc offers `default` among the clear methods and SPDK
/// takes it (LVOL_CLEAR_WITH_DEFAULT, the store's method); so does flashpath.
#[test]
fn bdev_lvol_create_takes_the_default_clear_method() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Base", "32", "4096"]);
    rpc.ok(&["bdev_lvol_create_lvstore", "Base", "lvs0"]);
    let uuid = rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "-c", "default", "v", "4"]);
    assert_eq!(rpc.bdev("lvs0/v")["name"], uuid.as_str());
}

/// `bdev_lvol_set_read_only` (and a snapshot): SPDK's lvol bdev reports write, unmap and
/// write_zeroes unsupported for a read-only blob (vbdev_lvol_io_type_supported); so does
/// flashpath.
#[test]
fn a_read_only_lvol_reports_no_writes() {
    let d = daemon();
    let rpc = SpdkRpc::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Base", "32", "4096"]);
    rpc.ok(&["bdev_lvol_create_lvstore", "Base", "lvs0"]);
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "v", "4"]);
    rpc.ok(&["bdev_lvol_set_read_only", "lvs0/v"]);
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "w", "4"]);
    rpc.ok(&["bdev_lvol_snapshot", "lvs0/w", "snap"]);
    for name in ["lvs0/v", "lvs0/snap"] {
        let io = rpc.bdev(name)["supported_io_types"].clone();
        for op in ["write", "unmap", "write_zeroes"] {
            assert_eq!(io[op], false, "{name}: {op} on a read-only lvol: {io}");
        }
        assert_eq!(io["read"], true, "{name}: {io}");
    }
}
