//! End to end: `flashpath serve` with a configuration file, driven through the CLI (and once
//! through a raw socket, as SPDK's rpc.py writes), then stopped with SIGTERM.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const START_TIMEOUT: Duration = Duration::from_secs(30);

struct Daemon {
    /// `None` once [`Daemon::terminate`] has reaped it.
    child: Option<Child>,
    dir: tempfile::TempDir,
    rpc: PathBuf,
    vhost_dir: PathBuf,
    stderr: PathBuf,
}

impl Daemon {
    fn start(config: &str) -> Daemon {
        Daemon::start_with(|_| config.to_string())
    }

    /// Starts with the configuration `config` returns; it gets the test directory first.
    fn start_with(config: impl FnOnce(&Path) -> String) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let rpc = dir.path().join("rpc.sock");
        let vhost_dir = dir.path().join("vhost");
        let config_path = dir.path().join("flashpath.toml");
        std::fs::write(&config_path, config(dir.path())).unwrap();
        let stderr = dir.path().join("serve.stderr");
        let child = Command::new(env!("CARGO_BIN_EXE_flashpath"))
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .arg("--rpc")
            .arg(&rpc)
            .arg("--vhost-dir")
            .arg(&vhost_dir)
            .arg("--idle-window-us")
            .arg("200")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon { child: Some(child), dir, rpc, vhost_dir, stderr };
        let t0 = Instant::now();
        // Ready once the socket answers a call.
        while fp_rpc::RpcClient::connect(&d.rpc).and_then(|mut c| c.call("spdk_get_version", None)).is_err() {
            if let Some(status) = d.child_mut().try_wait().unwrap() {
                panic!("serve exited during start-up with {status}: {}", d.log());
            }
            assert!(t0.elapsed() < START_TIMEOUT, "serve not ready: {}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("the daemon was already reaped")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_flashpath")).arg("--rpc").arg(&self.rpc).args(args).output().unwrap()
    }

    /// Runs a CLI command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}\ndaemon log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut with_json = args.to_vec();
        with_json.push("--json");
        serde_json::from_str(&self.ok(&with_json)).unwrap()
    }

    /// Runs a CLI command that must fail with status 1; returns its one stderr line.
    fn refused(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stderr).unwrap().trim_end().to_string()
    }

    /// Sends SIGTERM and waits for the exit status. Returns it with the test directory (kept
    /// alive for checks) and the daemon's log.
    fn terminate(mut self) -> (std::process::ExitStatus, tempfile::TempDir, String) {
        let pid = libc::pid_t::try_from(self.child_mut().id()).unwrap();
        // SAFETY: kill(2) with a valid signal on our own child, which has not been reaped yet.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0);
        let t0 = Instant::now();
        let status = loop {
            if let Some(status) = self.child_mut().try_wait().unwrap() {
                break status;
            }
            // Drop kills it.
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "serve did not exit after SIGTERM: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.child = None;
        let log = self.log();
        let dir = tempfile::tempdir().unwrap();
        (status, std::mem::replace(&mut self.dir, dir), log)
    }
}

impl Drop for Daemon {
    /// A failing test must not leave a daemon running.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn names(list: &Value) -> Vec<String> {
    list.as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap().to_string()).collect()
}

const CONFIG: &str = r#"
[[bdev]]
type = "null"
name = "null0"
num_blocks = 2048
block_size = 512

[[bdev]]
type = "malloc"
name = "ram0"
num_blocks = 256
block_size = 4096
"#;

#[test]
fn serve_with_config_drive_cli_and_stop() {
    let d = Daemon::start(CONFIG);
    assert!(d.log().contains("ready"), "{}", d.log());

    // The configured disks.
    let disks = d.json(&["disk", "list"]);
    assert_eq!(names(&disks), ["null0", "ram0"]);
    assert_eq!(disks[1]["product_name"], "Malloc disk");
    assert_eq!(disks[1]["block_size"], 4096);
    let table = d.ok(&["disk", "list"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("ram0") && table.contains("1 MiB"), "{table}");

    // Create and delete through the CLI.
    assert_eq!(d.ok(&["disk", "create", "--type", "ram", "--size", "1MiB"]).trim(), "Malloc0");
    assert_eq!(
        d.ok(&["disk", "create", "--type", "null", "--name", "n1", "--num-blocks", "64"]).trim(),
        "n1"
    );
    let file = d.dir.path().join("disk.img");
    std::fs::File::create(&file).unwrap().set_len(1 << 20).unwrap();
    let created =
        d.ok(&["disk", "create", "--type", "file", "--name", "f0", "--path", file.to_str().unwrap()]);
    assert_eq!(created.trim(), "f0");
    let f0 = &d.json(&["disk", "list", "f0"])[0];
    assert_eq!(f0["driver_specific"]["uring"]["filename"], file.to_str().unwrap());
    assert_eq!(names(&d.json(&["disk", "list"])), ["Malloc0", "f0", "n1", "null0", "ram0"]);
    for name in ["Malloc0", "n1", "f0"] {
        d.ok(&["disk", "delete", name]);
    }
    assert_eq!(names(&d.json(&["disk", "list"])), ["null0", "ram0"]);

    // Daemon-side validation comes back naming the CLI's option.
    assert_eq!(
        d.refused(&[
            "disk",
            "create",
            "--type",
            "null",
            "--name",
            "bad",
            "--num-blocks",
            "8",
            "--block-size",
            "1000"
        ]),
        "error: --block-size: 1000 is not a power of two between 512 and 65536"
    );
    assert_eq!(d.refused(&["disk", "delete", "nope"]), "error: bdev 'nope' does not exist");
    assert_eq!(
        d.refused(&["disk", "create", "--type", "null", "--name", "null0", "--num-blocks", "8"]),
        "error: bdev 'null0' already exists"
    );

    // Reactors, version, methods.
    let reactors = d.json(&["reactor", "list"]);
    assert_eq!(reactors["tick_rate"], 1_000_000_000u64);
    assert_eq!(reactors["reactors"].as_array().unwrap().len(), 1);
    assert_eq!(reactors["reactors"][0]["pollers_parked"], 0, "nothing to park: {reactors}");
    let table = d.ok(&["reactor", "list"]);
    assert!(table.starts_with("CORE") && table.lines().next().unwrap().ends_with("PARKED"), "{table}");
    assert_eq!(d.ok(&["version"]).trim(), format!("flashpath v{}", env!("CARGO_PKG_VERSION")));
    let methods = d.json(&["rpc", "rpc_get_methods"]);
    let methods: Vec<&str> = methods.as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    for m in ["bdev_malloc_create", "bdev_get_bdevs", "vhost_create_blk_controller", "framework_get_reactors"]
    {
        assert!(methods.contains(&m), "{m} missing from {methods:?}");
    }
    let refused = d.refused(&["rpc", "no_such_method"]);
    assert!(refused.contains("-32601"), "{refused}");

    let (status, dir, log) = d.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("SIGTERM"), "{log}");
    assert!(!dir.path().join("rpc.sock").exists(), "RPC socket left behind");
}

#[test]
fn vhost_controller_lifecycle_through_cli() {
    let d = Daemon::start(&format!(
        "{CONFIG}\n[[vhost_blk]]\nctrlr = \"vhost.0\"\ndev_name = \"ram0\"\nnum_queues = 2\n"
    ));
    let ctrls = d.json(&["vhost", "list"]);
    assert_eq!(ctrls[0]["ctrlr"], "vhost.0");
    assert_eq!(ctrls[0]["backend_specific"]["block"]["bdev"], "ram0");
    assert_eq!(ctrls[0]["num_queues"], 2);
    let socket0 = d.vhost_dir.join("vhost.0");
    assert!(socket0.exists());
    assert_eq!(d.json(&["disk", "list", "ram0"])[0]["claimed"], true);
    assert!(d.refused(&["disk", "delete", "ram0"]).contains("in use"));

    let printed =
        d.ok(&["vhost", "create", "--name", "vhost.1", "--disk", "null0", "--readonly", "--queues", "1"]);
    assert_eq!(Path::new(printed.trim()), d.vhost_dir.join("vhost.1"));
    assert!(d.ok(&["vhost", "list"]).contains("vhost.1"));
    let listed = d.json(&["vhost", "list", "vhost.1"]);
    assert_eq!(listed[0]["backend_specific"]["block"]["readonly"], true);
    d.ok(&["vhost", "delete", "vhost.1"]);
    assert!(!d.vhost_dir.join("vhost.1").exists());
    // A mask naming only a core without a reactor.
    let lcore = d.json(&["reactor", "list"])["reactors"][0]["lcore"].as_u64().unwrap();
    let mask = format!("0x{:x}", 1u128 << (lcore + 1));
    assert_eq!(
        d.refused(&["vhost", "create", "--name", "v2", "--disk", "null0", "--cpus", &mask]),
        format!("error: --cpus: selects no reactor core; reactors run on cores {lcore}")
    );

    let (status, _dir, log) = d.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!socket0.exists(), "vhost socket left behind");
}

#[test]
fn spdk_style_concatenated_requests() {
    let d = Daemon::start("");
    let mut s = UnixStream::connect(&d.rpc).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // rpc.py writes request objects back to back, without separators.
    s.write_all(
        concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"bdev_null_create","params":{"name":"n","num_blocks":8,"block_size":512}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"bdev_get_bdevs","params":{"name":"n"}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"bdev_null_create","params":{"name":"n","num_blocks":8}}"#
        )
        .as_bytes(),
    )
    .unwrap();
    let mut lines = BufReader::new(s).lines();
    let mut next = || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    assert_eq!(next()["result"], "n");
    assert_eq!(next()["result"][0]["num_blocks"], 8);
    let e = next();
    assert_eq!(e["id"], 3);
    assert_eq!(e["error"]["code"], -32602);
    assert!(e["error"]["message"].as_str().unwrap().starts_with("block_size: "), "{e}");
    let (status, _, log) = d.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode()
        & 0o7777
}

#[test]
fn sockets_and_the_vhost_dir_are_owner_only_by_default() {
    let d = Daemon::start(&format!("{CONFIG}\n[[vhost_blk]]\nctrlr = \"v0\"\ndev_name = \"null0\"\n"));
    assert_eq!(mode(&d.rpc), 0o600, "RPC socket");
    assert_eq!(mode(&d.vhost_dir), 0o700, "vhost directory created by serve");
    assert_eq!(mode(&d.vhost_dir.join("v0")), 0o600, "vhost socket from the config file");
    d.ok(&["vhost", "create", "--name", "v1", "--disk", "ram0"]);
    assert_eq!(mode(&d.vhost_dir.join("v1")), 0o600, "vhost socket from an RPC call");
    // Nothing else was left next to the RPC socket (its staging directory is gone).
    let mut left: Vec<String> = std::fs::read_dir(d.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["flashpath.toml", "rpc.sock", "serve.stderr", "vhost"]);
    let (status, _, log) = d.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
}

#[test]
fn limits_and_socket_mode_from_the_config_file() {
    let d = Daemon::start(&format!(
        "[limits]\nmax_bdevs = 3\nmax_exports = 1\nmax_malloc_bytes = 1048576\n\
         [security]\nsocket_mode = 0o660\n{CONFIG}\n\
         [[vhost_blk]]\nctrlr = \"v0\"\ndev_name = \"null0\"\n"
    ));
    assert_eq!(mode(&d.vhost_dir.join("v0")), 0o660);
    // The group needs to enter the directory to reach a socket it may use.
    assert_eq!(mode(&d.vhost_dir), 0o710);
    assert_eq!(mode(&d.rpc), 0o600, "the RPC socket does not follow socket_mode");

    assert_eq!(
        d.refused(&["disk", "create", "--type", "ram", "--name", "big", "--size", "2MiB"]),
        "error: --size: 4096 blocks of 512 bytes are 2097152 bytes, more than the 1048576 allowed for a \
         RAM bdev (limits.max_malloc_bytes, by default the machine's RAM)"
    );
    d.ok(&["disk", "create", "--type", "null", "--name", "n2", "--num-blocks", "64"]);
    assert_eq!(
        d.refused(&["disk", "create", "--type", "null", "--name", "n3", "--num-blocks", "64"]),
        "error: cannot create bdev 'n3': 3 bdevs already exist, the limit set by limits.max_bdevs"
    );
    let e = d.refused(&["rpc", "vhost_create_blk_controller", r#"{"ctrlr": "v1", "dev_name": "ram0"}"#]);
    assert!(e.contains("(code -28)") && e.contains("the limit set by limits.max_exports"), "{e}");
    d.ok(&["vhost", "delete", "v0"]);
    d.ok(&["vhost", "create", "--name", "v1", "--disk", "ram0"]);
    let (status, _, log) = d.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
}

#[test]
fn export_dirs_confine_file_disks() {
    let d = Daemon::start_with(|dir| {
        std::fs::create_dir(dir.join("exports")).unwrap();
        for f in ["exports/in.img", "outside.img"] {
            std::fs::File::create(dir.join(f)).unwrap().set_len(1 << 20).unwrap();
        }
        format!("[security]\nexport_dirs = [\"{}\"]\n", dir.join("exports").display())
    });
    let exports = d.dir.path().join("exports");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let file_disk =
        |name: &str, file: &str| d.cli(&["disk", "create", "--type", "file", "--name", name, "--path", file]);

    let created = file_disk("in", &path(&exports.join("in.img")));
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    for outside in [
        "/etc/passwd".to_string(),
        path(&d.dir.path().join("outside.img")),
        path(&exports.join("../outside.img")),
    ] {
        let out = file_disk("out", &outside);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim_end(),
            format!("error: --path: '{outside}' is outside the allowed export directories")
        );
    }
    std::os::unix::fs::symlink(d.dir.path().join("outside.img"), exports.join("link.img")).unwrap();
    let link = path(&exports.join("link.img"));
    let e = d.refused(&["rpc", "bdev_uring_create", &format!(r#"{{"name": "out", "filename": "{link}"}}"#)]);
    assert_eq!(e, format!("error: filename: '{link}' is outside the allowed export directories (code -13)"));
    assert_eq!(names(&d.json(&["disk", "list"])), ["in"]);
    let (status, _, log) = d.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
}

#[test]
fn notification_coalescing_is_set_per_controller() {
    let d = Daemon::start(&format!("{CONFIG}\n[[vhost_blk]]\nctrlr = \"vhost.0\"\ndev_name = \"ram0\"\n"));
    let listed = d.json(&["vhost", "list", "vhost.0"]);
    assert_eq!(
        (listed[0]["delay_base_us"].as_u64(), listed[0]["iops_threshold"].as_u64()),
        (Some(0), Some(60000))
    );
    let set = r#"{"ctrlr": "vhost.0", "delay_base_us": 80, "iops_threshold": 50000}"#;
    assert_eq!(d.ok(&["rpc", "vhost_controller_set_coalescing", set]).trim(), "true");
    let listed = d.json(&["vhost", "list", "vhost.0"]);
    assert_eq!(
        (listed[0]["delay_base_us"].as_u64(), listed[0]["iops_threshold"].as_u64()),
        (Some(80), Some(50000))
    );
    // Bad input: a message naming the field or the controller, nothing changed.
    let too_long = r#"{"ctrlr": "vhost.0", "delay_base_us": 20000, "iops_threshold": 1}"#;
    assert!(d.refused(&["rpc", "vhost_controller_set_coalescing", too_long]).contains("delay_base_us"));
    let missing = r#"{"ctrlr": "nope", "delay_base_us": 10, "iops_threshold": 1}"#;
    assert!(d.refused(&["rpc", "vhost_controller_set_coalescing", missing]).contains("nope"));
    let no_threshold = r#"{"ctrlr": "vhost.0", "delay_base_us": 10}"#;
    assert!(d.refused(&["rpc", "vhost_controller_set_coalescing", no_threshold]).contains("iops_threshold"));
    let listed = d.json(&["vhost", "list", "vhost.0"]);
    assert_eq!(listed[0]["delay_base_us"].as_u64(), Some(80));
}
