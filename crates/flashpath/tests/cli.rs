//! Command-line errors: each is one line on stderr that names the option and what it accepts,
//! with exit status 2 for a malformed command line and 1 for a failed operation. The rbd
//! commands also run against a real daemon and a real Ceph cluster (common/ceph.rs).

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn flashpath(args: &[&str], rpc: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .args(args)
        .env("FLASHPATH_RPC", rpc)
        .env_remove("RUST_LOG")
        .output()
        .expect("running flashpath")
}

/// Runs a command that must fail; returns (exit code, the single stderr line).
fn fails(args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = flashpath(args, &dir.path().join("no.sock"));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(out.stdout.is_empty(), "{args:?} printed to stdout: {:?}", String::from_utf8_lossy(&out.stdout));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: expected one line on stderr, got {stderr:?}");
    (out.status.code().unwrap(), lines[0].to_string())
}

/// Runs a command against the daemon at `rpc` that must succeed; returns its stdout.
fn succeeds(rpc: &Path, args: &[&str]) -> String {
    let out = flashpath(args, rpc);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command the daemon at `rpc` must refuse; returns its one stderr line.
fn refused_by(rpc: &Path, args: &[&str]) -> String {
    let out = flashpath(args, rpc);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr:?}");
    stderr.trim_end().to_string()
}

fn assert_usage(args: &[&str], expected: &str) {
    let (code, line) = fails(args);
    assert_eq!(line, expected, "{args:?}");
    assert_eq!(code, 2, "{args:?}: {line}");
}

#[test]
fn size_errors() {
    assert_usage(
        &["disk", "create", "--type", "null", "--name", "a", "--size", "12XB"],
        "error: --size: '12XB' is not a size (examples: 512MiB, 1G, 4096)",
    );
    assert_usage(
        &["disk", "create", "--type", "ram", "--size", "1000"],
        "error: --size: 1000 bytes is not a whole number of 512-byte blocks",
    );
    assert_usage(
        &["disk", "create", "--type", "ram", "--size", "1G", "--num-blocks", "5"],
        "error: --size cannot be used with --num-blocks",
    );
    assert_usage(
        &["disk", "create", "--type", "null", "--name", "a"],
        "error: --size: required for --type null (or --num-blocks)",
    );
}

#[test]
fn volume_errors_name_the_argument() {
    assert_usage(&["volume", "create", "lvsv", "--size", "16MiB"], "error: VOLUME: 'lvsv' is not STORE/NAME");
    assert_usage(
        &["volume", "create", "lvs/v", "--size", "3000KiB"],
        "error: --size: 3072000 bytes is not a non-zero whole number of MiB",
    );
    assert_usage(
        &["volume", "resize", "lvs/v", "--size", "0"],
        "error: --size: 0 bytes is not a non-zero whole number of MiB",
    );
}

#[test]
fn enum_and_number_errors_list_accepted_values() {
    assert_usage(
        &["disk", "create", "--type", "tape"],
        "error: --type: 'tape' is not one of null, ram, file, rbd",
    );
    assert_usage(
        &["disk", "create", "--type", "ram", "--size", "1G", "--block-size", "big"],
        "error: --block-size: 'big' is not a whole number between 0 and 4294967295",
    );
    assert_usage(
        &["vhost", "create", "--name", "v", "--disk", "d", "--queues", "70000"],
        "error: --queues: '70000' is not a whole number between 0 and 65535",
    );
    assert_usage(
        &["mirror", "start", "a", "b", "--copy-mode", "blocking"],
        "error: --copy-mode: 'blocking' is not one of background, write-blocking",
    );
    assert_usage(
        &["--log-level", "loud", "version"],
        "error: --log-level: 'loud' is not a log level (accepted: off, error, warn, info, debug, trace)",
    );
}

#[test]
fn options_that_do_not_go_together() {
    assert_usage(
        &["disk", "create", "--type", "file", "--name", "f"],
        "error: --path: required for --type file",
    );
    assert_usage(
        &["disk", "create", "--type", "file", "--name", "f", "--path", "/x", "--size", "1G"],
        "error: --size: not used with --type file: the disk has the file's size",
    );
    assert_usage(
        &["disk", "create", "--type", "null", "--name", "a", "--size", "1G", "--path", "/x"],
        "error: --path: only used with --type file",
    );
    assert_usage(
        &["disk", "create", "--type", "null", "--size", "1G"],
        "error: --name: required for --type null",
    );
    assert_usage(&["vhost", "create", "--name", "v"], "error: missing required option --disk");
}

#[test]
fn unknown_commands_and_options() {
    assert_usage(&["diks", "list"], "error: unknown command 'diks' (did you mean 'disk'?)");
    assert_usage(&["disk", "list", "--colour"], "error: unknown option '--colour' (see --help)");
    assert_usage(
        &["rpc", "bdev_get_bdevs", "{"],
        "error: PARAMS: not valid JSON: EOF while parsing an object at line 1 column 1",
    );
}

#[test]
fn no_daemon_is_a_one_line_failure_naming_the_socket() {
    let (code, line) = fails(&["disk", "list"]);
    assert_eq!(code, 1);
    assert!(line.starts_with("error: cannot connect to "), "{line}");
    assert!(line.contains("no.sock"), "{line}");
    assert!(line.contains("flashpath serve"), "{line}");
}

#[test]
fn help_and_version_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let out = flashpath(&["--help"], &dir.path().join("x"));
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for cmd in ["serve", "disk", "vhost", "nbd", "reactor", "version", "rpc"] {
        assert!(help.contains(cmd), "help lacks {cmd}: {help}");
    }
    let out = flashpath(&["--version"], &dir.path().join("x"));
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn serve_config_errors_stop_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let rpc = dir.path().join("rpc.sock");
    let config = dir.path().join("bad.toml");
    let serve = |config: &Path| {
        flashpath(
            &[
                "serve",
                "--config",
                config.to_str().unwrap(),
                "--vhost-dir",
                dir.path().join("vhost").to_str().unwrap(),
                "--log-level",
                "off",
            ],
            &rpc,
        )
    };
    let one_line = |out: &Output| {
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
        stderr.trim_end().to_string()
    };

    std::fs::write(
        &config,
        "[[bdev]]\ntype = \"null\"\nname = \"a\"\nnum_blocks = 8\nblock_size = 512\n\n\
         [[bdev]]\ntype = \"null\"\nname = \"b\"\nnum_blocks = 8\nblock_size = 1000\n",
    )
    .unwrap();
    assert_eq!(
        one_line(&serve(&config)),
        "config error: bdev[1].block_size: 1000 is not a power of two between 512 and 65536"
    );
    assert!(!rpc.exists(), "the RPC socket must not be left behind");

    std::fs::write(&config, "[[vhost_blk]]\nctrlr = \"v\"\ndev_name = \"a\"\nqueues = 2\n").unwrap();
    assert_eq!(
        one_line(&serve(&config)),
        "config error: vhost_blk[0].queues: unknown parameter; accepted: ctrlr, dev_name, cpumask, readonly, num_queues, migrate_from, stop_timeout_ms, packed_ring, packed_ring_recovery"
    );

    // A group member's error names the group, the member and the field.
    std::fs::write(
        &config,
        "[[bdev]]\ntype = \"null\"\nname = \"a\"\nnum_blocks = 8\nblock_size = 512\n\
         [[qos_group]]\nname = \"g\"\niops_total = 1000\nmembers = [{ bdev_name = \"a\", weight = 0 }]\n",
    )
    .unwrap();
    assert_eq!(
        one_line(&serve(&config)),
        "config error: qos_group[0].members[0].weight: 0 is not a weight (1 to 65535)"
    );
    assert!(!rpc.exists(), "the RPC socket must not be left behind");

    std::fs::write(&config, "[reactor]\nidle_window = 5\n").unwrap();
    let line = one_line(&serve(&config));
    assert!(
        line.starts_with(&format!("config error: {}:2:1: unknown field `idle_window`", config.display())),
        "{line}"
    );

    let line = one_line(&serve(&dir.path().join("missing.toml")));
    assert!(line.starts_with("config error: cannot read "), "{line}");

    let out = flashpath(&["serve", "--cpus", "0-x", "--log-level", "off"], &rpc);
    assert_eq!(one_line(&out), "error: --cpus: '0-x' is not a cpu number or range (e.g. 0, 0-3, 0,2, 0x3)");

    std::fs::write(&config, "[limits]\nmax_bdevs = 0\n").unwrap();
    assert_eq!(one_line(&serve(&config)), "config error: limits.max_bdevs: must be at least 1");

    // Export directories must exist, whichever way they are given.
    std::fs::write(&config, "[security]\nexport_dirs = [\"/nonexistent/disks\"]\n").unwrap();
    assert_eq!(
        one_line(&serve(&config)),
        "error: security.export_dirs: /nonexistent/disks: No such file or directory (os error 2)"
    );
    let out = flashpath(&["serve", "--export-dir", "/nonexistent/x", "--log-level", "off"], &rpc);
    assert_eq!(one_line(&out), "error: --export-dir: /nonexistent/x: No such file or directory (os error 2)");
    assert!(!rpc.exists(), "the RPC socket must not be left behind");
}

#[test]
fn qos_errors_name_the_option() {
    assert_usage(
        &["qos", "limit", "d0"],
        "error: qos limit: no limit given: set at least one of --iops, --mbps, --read-mbps, --write-mbps (0 removes one)",
    );
    assert_usage(
        &["qos", "limit", "d0", "--mbps", "1.5"],
        "error: --mbps: '1.5' is not a whole number between 0 and 18446744073709551615",
    );
    assert_usage(
        &["qos", "group", "set", "g"],
        "error: qos group set: no limit given: set at least one, e.g. --iops-total N (0 removes one)",
    );
    assert_usage(
        &["qos", "group", "create", "g", "--bps-read-max", "1X"],
        "error: --bps-read-max: '1X' is not a size (examples: 512MiB, 1G, 4096)",
    );
    assert_usage(
        &["qos", "group", "create", "g", "--iops-total-max-length", "5s"],
        "error: --iops-total-max-length: '5s' is not a whole number between 0 and 18446744073709551615",
    );
    assert_usage(
        &["qos", "group", "add", "g", "d0", "--weight", "70000"],
        "error: --weight: '70000' is not a whole number between 0 and 65535",
    );
    assert_usage(
        &["qos", "group", "weight", "g", "d0", "x"],
        "error: <WEIGHT>: 'x' is not a whole number between 0 and 65535",
    );
    assert_usage(&["qos", "group", "remove", "g"], "error: missing required option <DISK>");
    assert_usage(&["qos", "shwo"], "error: unknown command 'shwo' (did you mean 'show'?)");
    assert_usage(&["qos", "grups"], "error: unknown command 'grups' (did you mean 'group' or 'groups'?)");
}

#[test]
fn rbd_options_that_do_not_go_together() {
    assert_usage(
        &["disk", "create", "--type", "rbd", "--image", "i"],
        "error: --pool: required for --type rbd",
    );
    assert_usage(
        &["disk", "create", "--type", "rbd", "--pool", "p"],
        "error: --image: required for --type rbd",
    );
    assert_usage(
        &["disk", "create", "--type", "rbd", "--pool", "p", "--image", "i", "--size", "1G"],
        "error: --size: not used with --type rbd: the disk has the image's size (disk resize changes it)",
    );
    assert_usage(
        &["disk", "create", "--type", "rbd", "--pool", "p", "--image", "i", "--path", "/x"],
        "error: --path: only used with --type file",
    );
    assert_usage(
        &["disk", "create", "--type", "ram", "--size", "1G", "--pool", "p"],
        "error: --pool: only used with --type rbd",
    );
    assert_usage(
        &["disk", "create", "--type", "file", "--name", "f", "--path", "/x", "--read-only"],
        "error: --read-only: only used with --type rbd",
    );
    assert_usage(
        &["rbd", "cluster", "add", "c", "--param", "rados_osd_op_timeout"],
        "error: --param: 'rados_osd_op_timeout' is not KEY=VALUE (e.g. rados_osd_op_timeout=5)",
    );
    assert_usage(
        &["rbd", "cluster", "add", "c", "--param", "a=1", "--param", "a=2"],
        "error: --param: a given twice",
    );
    assert_usage(&["rbd", "cluster", "add"], "error: missing required option <NAME>");
    assert_usage(&["rbd", "clustr", "list"], "error: unknown command 'clustr' (did you mean 'cluster'?)");
    assert_usage(&["disk", "resize", "d"], "error: missing required option --size");
    assert_usage(
        &["disk", "resize", "d", "--size", "2X"],
        "error: --size: '2X' is not a size (examples: 512MiB, 1G, 4096)",
    );
}

#[test]
fn nbd_options_that_do_not_go_together() {
    assert_usage(
        &["nbd", "start", "d0", "/tmp/nbd.sock", "--tls-cert", "c.pem"],
        "error: --tls-key: required with --tls-cert",
    );
    assert_usage(
        &["nbd", "start", "d0", "/tmp/nbd.sock", "--tls-key", "k.pem"],
        "error: --tls-cert: required with --tls-key",
    );
    assert_usage(
        &["nbd", "start", "d0", "/tmp/nbd.sock", "--tls-ca", "ca.pem"],
        "error: --tls-ca: only used with --tls-cert and --tls-key",
    );
    assert_usage(&["nbd", "start", "d0"], "error: missing required option <NBD_DEVICE>");
    assert_usage(&["nbd", "stop"], "error: missing required option <NBD_DEVICE>");
    assert_usage(
        &["nbd", "start", "d0", "/x", "--read-only"],
        "error: unknown option '--read-only' (did you mean '--readonly'?)",
    );
    assert_usage(&["nbd", "strat"], "error: unknown command 'strat' (did you mean 'start'?)");
}

/// Connects to an NBD socket and reads the server's first 16 bytes: the fixed newstyle greeting.
fn nbd_greeting(socket: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut greeting = vec![0; 16];
    s.read_exact(&mut greeting).unwrap();
    greeting
}

/// The nbd commands against a daemon: an export that answers with the NBD greeting, its row in
/// the list, refusals that name the option, and stop.
#[test]
fn nbd_commands_on_a_daemon() {
    let d = common::Daemon::start("0");
    let ok = |args: &[&str]| succeeds(&d.rpc, args);
    let refused = |args: &[&str]| refused_by(&d.rpc, args);
    ok(&["disk", "create", "--type", "ram", "--name", "d0", "--size", "1MiB"]);
    ok(&["disk", "create", "--type", "ram", "--name", "d1", "--size", "1MiB"]);
    let sock = d.dir.path().join("d0.nbd");
    let sock_s = sock.to_str().unwrap();
    assert_eq!(ok(&["nbd", "start", "d0", sock_s]), format!("{sock_s}\n"));
    assert_eq!(nbd_greeting(&sock), b"NBDMAGICIHAVEOPT");
    // A read-only export of d1 under a name of its own, on a URI.
    let ro = d.dir.path().join("ro.nbd");
    let ro_uri = format!("nbd+unix:///golden?socket={}", ro.display());
    assert_eq!(ok(&["nbd", "start", "d1", &ro_uri, "--readonly"]), format!("{ro_uri}\n"));

    let list = ok(&["nbd", "list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "{list}");
    let cols = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(cols(lines[0]), ["DEVICE", "DISK", "EXPORT", "READONLY", "TLS", "CONNECTIONS"]);
    let row =
        |dev: &str| lines.iter().map(|l| cols(l)).find(|c| c[0] == dev).unwrap_or_else(|| panic!("{list}"));
    assert_eq!(row(sock_s), [sock_s, "d0", "d0", "no", "no", "0"]);
    assert_eq!(row(&ro_uri), [ro_uri.as_str(), "d1", "golden", "yes", "no", "0"]);
    let one: serde_json::Value = serde_json::from_str(&ok(&["nbd", "list", sock_s, "--json"])).unwrap();
    assert_eq!(one[0]["bdev_name"], "d0", "{one}");

    // Refusals name the option or argument that was wrong, and change nothing.
    let e = refused(&["nbd", "start", "d1", "http://x"]);
    assert!(e.starts_with("error: NBD_DEVICE: 'http://x' is not an absolute socket path"), "{e}");
    let e = refused(&["nbd", "start", "d1", "nbd://0.0.0.0:10999/x", "--readonly"]);
    assert!(e.starts_with("error: --tls-cert: ") && e.contains("needs tls_cert and tls_key"), "{e}");
    let missing = d.dir.path().join("missing.pem");
    let missing = missing.to_str().unwrap();
    let tls_sock = d.dir.path().join("tls.nbd");
    let e = refused(&[
        "nbd",
        "start",
        "d1",
        tls_sock.to_str().unwrap(),
        "--readonly",
        "--tls-cert",
        missing,
        "--tls-key",
        missing,
    ]);
    assert!(e.starts_with("error: --tls-cert: cannot read "), "{e}");
    assert!(!tls_sock.exists(), "a refused export leaves no socket");
    // d0 is exported writable: claimed alone, even by a reader.
    let e = refused(&["nbd", "start", "d0", d.dir.path().join("again.nbd").to_str().unwrap(), "--readonly"]);
    assert!(e.starts_with("error: ") && e.contains("d0"), "{e}");
    assert_eq!(ok(&["nbd", "list"]).lines().count(), 3);

    assert_eq!(ok(&["nbd", "stop", sock_s]), "");
    assert!(!sock.exists(), "the socket is removed with the export");
    let e = refused(&["nbd", "stop", sock_s]);
    assert!(e.starts_with("error: ") && e.contains(sock_s), "{e}");
    ok(&["nbd", "stop", &ro_uri]);
    assert_eq!(ok(&["nbd", "list", "--json"]).trim(), "[]");
    ok(&["disk", "delete", "d0"]);
}

/// `serve --config` with `[[nbd_disk]]` tables: the exports come up after the disks and the
/// controllers, a read-only export sharing its disk with a read-only controller.
#[test]
fn serve_config_with_nbd_disk_tables() {
    let d = common::Daemon::start_with_config("0", |dir| {
        format!(
            "[[nbd_disk]]\nbdev_name = \"ram0\"\nnbd_device = \"{}\"\nreadonly = true\n\n\
             [[vhost_blk]]\nctrlr = \"v0\"\ndev_name = \"ram0\"\nreadonly = true\n\n\
             [[bdev]]\ntype = \"malloc\"\nname = \"ram0\"\nnum_blocks = 2048\nblock_size = 512\n",
            dir.join("ram0.nbd").display()
        )
    });
    let sock = d.dir.path().join("ram0.nbd");
    let disks = d.call("nbd_get_disks", serde_json::Value::Null);
    assert_eq!(
        disks,
        serde_json::json!([{"nbd_device": sock, "bdev_name": "ram0", "export_name": "ram0",
                            "readonly": true, "tls": false, "connections": 0, "bitmaps": [],
                            "stats": {"read_ops": 0, "write_ops": 0, "flush_ops": 0, "trim_ops": 0,
                                      "write_zeroes_ops": 0, "cache_ops": 0, "block_status_ops": 0,
                                      "bytes_read": 0, "bytes_written": 0, "errors": 0}}])
    );
    assert_eq!(nbd_greeting(&sock), b"NBDMAGICIHAVEOPT");
    let bdev = d.call("bdev_get_bdevs", serde_json::json!({"name": "ram0"}));
    assert_eq!(bdev[0]["claim_type"], "read_many_write_none", "{bdev}");
}

/// The raid commands against a daemon whose config file made a raid1 over two RAM disks:
/// the list's rows, a replica removed and added back until the raid is in sync again,
/// options, refusals that name the option, and delete freeing the bases.
#[test]
fn raid_commands_and_config_tables() {
    let d = common::Daemon::start_with_config("0", |_| {
        "[raid_options]\nprocess_window_size_kb = 256\n\n\
         [[bdev]]\ntype = \"malloc\"\nname = \"m0\"\nnum_blocks = 4096\nblock_size = 4096\n\n\
         [[bdev]]\ntype = \"malloc\"\nname = \"m1\"\nnum_blocks = 4096\nblock_size = 4096\n\n\
         [[bdev]]\ntype = \"raid\"\nname = \"r1\"\nraid_level = \"raid1\"\nbase_bdevs = [\"m0\", \"m1\"]\n\
         superblock = true\n"
            .to_string()
    });
    let ok = |args: &[&str]| succeeds(&d.rpc, args);
    let refused = |args: &[&str]| refused_by(&d.rpc, args);
    let cols = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let list = ok(&["raid", "list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(cols(lines[0]), ["RAID", "LEVEL", "STATE", "SUPERBLOCK", "OPERATIONAL", "BASES", "PROCESS"]);
    assert_eq!(
        cols(lines[1]),
        ["r1", "raid1", "online", "yes", "2/2", "m0(active),m1(active)", "-"],
        "{list}"
    );

    ok(&["disk", "create", "--type", "ram", "--name", "m2", "--size", "16MiB", "--block-size", "4096"]);
    ok(&["disk", "create", "--type", "ram", "--name", "m3", "--size", "16MiB", "--block-size", "4096"]);
    assert_eq!(
        ok(&[
            "raid",
            "create",
            "r0",
            "--level",
            "raid0",
            "--base",
            "m2",
            "--base",
            "m3",
            "--strip-size-kb",
            "64"
        ]),
        ""
    );
    let one: serde_json::Value = serde_json::from_str(&ok(&["raid", "list", "r0", "--json"])).unwrap();
    assert_eq!(
        (&one[0]["raid_level"], &one[0]["strip_size_kb"]),
        (&serde_json::json!("raid0"), &serde_json::json!(64)),
        "{one}"
    );

    // A replica out and back in.
    ok(&["raid", "options", "--process-max-bandwidth-mb-sec", "1000"]);
    ok(&["raid", "remove", "m1"]);
    let row = cols(ok(&["raid", "list", "r1"]).lines().nth(1).unwrap());
    assert_eq!(row[4], "1/2", "{row:?}");
    ok(&["raid", "add", "r1", "m1"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // In sync again: both slots active and no rebuild left.
    while cols(ok(&["raid", "list", "r1"]).lines().nth(1).unwrap())[5..] != ["m0(active),m1(active)", "-"] {
        assert!(std::time::Instant::now() < deadline, "{}", ok(&["raid", "list"]));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Refusals name the option or argument.
    ok(&["disk", "create", "--type", "ram", "--name", "m4", "--size", "16MiB", "--block-size", "4096"]);
    let e = refused(&[
        "raid",
        "create",
        "bad",
        "--level",
        "raid0",
        "--base",
        "m4",
        "--base",
        "m0",
        "--strip-size-kb",
        "3",
    ]);
    assert!(e.starts_with("error: --strip-size-kb: "), "{e}");
    let e = refused(&["raid", "create", "bad", "--level", "raid6", "--base", "m4"]);
    assert!(e.starts_with("error: --level: "), "{e}");
    let e = refused(&["raid", "list", "nope"]);
    assert!(e.starts_with("error: no raid bdev named 'nope'"), "{e}");

    ok(&["raid", "delete", "r0"]);
    ok(&["raid", "delete", "r1", "--clear-superblock"]);
    assert_eq!(ok(&["raid", "list"]).lines().count(), 1);
    for m in ["m0", "m1", "m2", "m3", "m4"] {
        ok(&["disk", "delete", m]);
    }
}

/// The rbd commands against a daemon and a real cluster: a shared connection, disks on it
/// (read-write and read-only), a resize that reaches the image, refusals that name the option,
/// and the clean-up order the daemon enforces.
#[test]
fn rbd_commands_on_a_real_cluster() {
    let Some(ceph) = common::ceph::CephCluster::start() else { return };
    ceph.create_image("cli-img", 64);
    let d = common::Daemon::start("0");
    let conf = ceph.conf().to_str().unwrap();
    let ok = |args: &[&str]| succeeds(&d.rpc, args);
    let refused = |args: &[&str]| refused_by(&d.rpc, args);

    assert_eq!(
        ok(&[
            "rbd",
            "cluster",
            "add",
            "ceph",
            "--config-file",
            conf,
            "--cpus",
            "0",
            "--param",
            "rados_osd_op_timeout=5"
        ]),
        "ceph\n"
    );
    let info = d.call("bdev_rbd_get_clusters_info", serde_json::json!({"name": "ceph"}));
    assert_eq!(info["config_file"], conf, "{info}");
    assert_eq!(info["core_mask"], "0", "{info}");
    let e = refused(&["rbd", "cluster", "add", "other", "--config-file", conf, "--cpus", "0-x"]);
    assert!(e.starts_with("error: --cpus: "), "{e}");
    assert_eq!(info["config_param"], serde_json::json!({"rados_osd_op_timeout": "5"}), "{info}");
    assert_eq!(
        refused(&["rbd", "cluster", "add", "ceph", "--config-file", conf]),
        "error: NAME: cluster 'ceph' is already registered"
    );

    let rbd = ["disk", "create", "--type", "rbd", "--pool", "rbd", "--cluster", "ceph"];
    let with = |extra: &[&'static str]| [&rbd[..], extra].concat();
    assert_eq!(ok(&with(&["--image", "cli-img", "--name", "vm1"])), "vm1\n");
    assert_eq!(
        ok(&with(&["--image", "cli-img", "--name", "ro", "--read-only", "--block-size", "4096"])),
        "ro\n"
    );
    let list = ok(&["disk", "list"]);
    let row = |name: &str| {
        list.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{list}"))
    };
    for want in [
        "rbd",
        "64 MiB",
        "512",
        "131072",
        "pool_name=rbd",
        "rbd_name=cli-img",
        "cluster_name=ceph",
        "read_only=false",
    ] {
        assert!(row("vm1").contains(want), "{want} in {list}");
    }
    for want in ["4096", "16384", "read_only=true"] {
        assert!(row("ro").contains(want), "{want} in {list}");
    }
    let clusters = ok(&["rbd", "cluster", "list"]);
    let lines: Vec<&str> = clusters.lines().collect();
    assert_eq!(lines.len(), 2, "{clusters}");
    assert!(lines[0].starts_with("CLUSTER") && lines[0].contains("DISKS"), "{clusters}");
    for want in ["ceph ", conf, "  0  ", "ro,vm1", "rados_osd_op_timeout=5"] {
        assert!(lines[1].contains(want), "{want} in {clusters}");
    }

    // Refusals name the option that was wrong.
    let e = refused(&with(&["--image", "no-such-image"]));
    assert!(e.starts_with("error: --image: "), "{e}");
    let e = refused(&[
        "disk",
        "create",
        "--type",
        "rbd",
        "--pool",
        "no-pool",
        "--image",
        "cli-img",
        "--cluster",
        "ceph",
    ]);
    assert!(e.starts_with("error: --pool: "), "{e}");
    assert_eq!(
        refused(&[
            "disk",
            "create",
            "--type",
            "rbd",
            "--pool",
            "rbd",
            "--image",
            "cli-img",
            "--cluster",
            "nope"
        ]),
        "error: --cluster: no registered cluster 'nope'"
    );
    let e = refused(&with(&["--image", "cli-img", "--block-size", "1000"]));
    assert!(e.starts_with("error: --block-size: "), "{e}");
    assert_eq!(
        refused(&["rbd", "cluster", "remove", "ceph"]),
        "error: NAME: cluster 'ceph' is used by 2 rbd bdev(s); delete them first"
    );

    // A resize reaches the image: the rbd tool sees the new size.
    ok(&["disk", "resize", "vm1", "--size", "128MiB"]);
    let bdev = d.call("bdev_get_bdevs", serde_json::json!({"name": "vm1"}));
    assert_eq!(bdev[0]["num_blocks"], 128 * 2048, "{bdev}");
    let image: serde_json::Value =
        serde_json::from_slice(&ceph.rbd(&["info", "--format", "json", "rbd/cli-img"]).stdout).unwrap();
    assert_eq!(image["size"], 128u64 << 20, "{image}");
    let e = refused(&["disk", "resize", "vm1", "--size", "1000"]);
    assert!(e.starts_with("error: --size: 1000 bytes"), "{e}");
    assert_eq!(refused(&["disk", "resize", "nope", "--size", "1G"]), "error: bdev 'nope' does not exist");

    ok(&["disk", "delete", "vm1"]);
    ok(&["disk", "delete", "ro"]);
    assert_eq!(ok(&["rbd", "cluster", "remove", "ceph"]), "");
    assert_eq!(ok(&["rbd", "cluster", "list"]).lines().count(), 1, "only the header");
    assert_eq!(refused(&["rbd", "cluster", "remove", "ceph"]), "error: NAME: no registered cluster 'ceph'");

    // A monitor that does not answer: one line naming the cluster, after client_mount_timeout.
    let e = refused(&[
        "rbd",
        "cluster",
        "add",
        "far",
        "--param",
        "mon_host=127.0.0.1:9",
        "--param",
        "client_mount_timeout=1",
    ]);
    assert!(e.starts_with("error: ") && e.contains("cluster 'far'"), "{e}");
    assert_eq!(ok(&["rbd", "cluster", "list", "--json"]).trim(), "[]");
}

/// `serve --config` with `[[rbd_cluster]]` and `[[bdev]] type = "rbd"` tables: the disk comes up
/// on the shared connection; a cluster whose monitor does not answer stops start-up with one
/// line naming the entry and the cluster.
#[test]
fn serve_config_with_rbd_tables() {
    let Some(ceph) = common::ceph::CephCluster::start() else { return };
    ceph.create_image("cfg-img", 16);
    let conf = ceph.conf().display().to_string();
    let d = common::Daemon::start_with_config("0", |_| {
        format!(
            "[[bdev]]\ntype = \"rbd\"\nname = \"vm1\"\npool_name = \"rbd\"\nrbd_name = \"cfg-img\"\n\
             cluster_name = \"ceph\"\nblock_size = 4096\n\n\
             [[rbd_cluster]]\nname = \"ceph\"\nconfig_file = \"{conf}\"\n\
             config_param = {{ rados_osd_op_timeout = \"5\" }}\n"
        )
    });
    let bdev = d.call("bdev_get_bdevs", serde_json::json!({"name": "vm1"}));
    assert_eq!(bdev[0]["num_blocks"], 16 * 256, "{bdev}");
    assert_eq!(
        bdev[0]["driver_specific"]["rbd"],
        serde_json::json!({"pool_name": "rbd", "rbd_name": "cfg-img", "cluster_name": "ceph", "read_only": false}),
        "{bdev}"
    );
    let info = d.call("bdev_rbd_get_clusters_info", serde_json::Value::Null);
    assert_eq!(info[0]["config_param"], serde_json::json!({"rados_osd_op_timeout": "5"}), "{info}");
    drop(d);

    let dir = tempfile::tempdir().unwrap();
    let rpc = dir.path().join("rpc.sock");
    let config = dir.path().join("far.toml");
    std::fs::write(
        &config,
        "[[rbd_cluster]]\nname = \"far\"\n\
         config_param = { mon_host = \"127.0.0.1:9\", client_mount_timeout = \"1\" }\n",
    )
    .unwrap();
    let vhost = dir.path().join("vhost");
    let out = flashpath(
        &[
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--vhost-dir",
            vhost.to_str().unwrap(),
            "--log-level",
            "off",
        ],
        &rpc,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // flashpath's own message is one line, the last. Before it librados logs, on the daemon's
    // stderr, that it found no keyring: lines of its own, not flashpath's to reword.
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let (last, before) = lines.split_last().expect("an error on stderr");
    assert!(last.starts_with("config error: rbd_cluster[0]: cannot connect to cluster 'far': "), "{stderr}");
    for line in before {
        assert!(
            line.contains("keyring") || line.contains("monclient"),
            "not librados' keyring notice: {line}"
        );
    }
    assert!(!rpc.exists(), "the RPC socket must not be left behind");
}

#[test]
fn nvmf_usage_errors() {
    assert_usage(
        &["nvmf", "listener", "add", "nqn.2016-06.io.spdk:c1", "127.0.0.1:0"],
        "error: ADDRESS: '127.0.0.1:0' has no port from 1 to 65535 (examples: 127.0.0.1:4420, [::1]:4420)",
    );
    assert_usage(
        &["nvmf", "listener", "add", "nqn.2016-06.io.spdk:c1", "[::1"],
        "error: ADDRESS: '[::1' has no closing ']' (examples: 127.0.0.1:4420, [::1]:4420)",
    );
    assert_usage(
        &["nvmf", "ns", "add", "nqn.2016-06.io.spdk:c1", "d0", "--nsid", "0"],
        "error: --nsid: must be 1 or more",
    );
    assert_usage(
        &["nvmf", "ns", "remove", "nqn.2016-06.io.spdk:c1"],
        "error: missing required option <NSID>",
    );
    assert_usage(&["nvmf", "subsytem"], "error: unknown command 'subsytem' (did you mean 'subsystem'?)");
}

#[test]
fn nvme_multipath_usage_errors() {
    for (args, expected) in [
        (
            "nvme attach N --trtype tcp --traddr 127.0.0.1 -x both",
            "error: --multipath: 'both' is not one of multipath, failover, disable",
        ),
        (
            "nvme set-multipath-policy Nvme0n1 -p random",
            "error: --policy: 'random' is not one of active_passive, active_active",
        ),
        (
            "nvme set-multipath-policy Nvme0n1 -p active_active -s fastest",
            "error: --selector: 'fastest' is not one of round_robin, queue_depth",
        ),
        (
            "nvme set-multipath-policy Nvme0n1 -p active_active -r many",
            "error: --rr-min-io: 'many' is not a whole number between 0 and 4294967295",
        ),
        ("nvme set-multipath-policy Nvme0n1", "error: missing required option --policy"),
    ] {
        assert_usage(&args.split(' ').collect::<Vec<_>>(), expected);
    }
}

/// `nvme attach -x multipath`, `nvme io-paths` and `nvme set-multipath-policy` against a
/// daemon that attaches its own subsystem through two of its listeners; removing one listener
/// disconnects that path (its controller reconnects in vain), adding it back lets it
/// reconnect.
#[test]
fn nvme_multipath_commands_on_a_daemon() {
    const NQN: &str = "nqn.2016-06.io.spdk:cli-mpath";
    let d = common::Daemon::start("0");
    let ok = |args: &[&str]| succeeds(&d.rpc, args);
    let refused = |args: &[&str]| refused_by(&d.rpc, args);
    let cols = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    ok(&["disk", "create", "--type", "ram", "--name", "m0", "--size", "4MiB"]);
    ok(&["nvmf", "transport", "create"]);
    ok(&["nvmf", "subsystem", "create", NQN, "--allow-any-host"]);
    ok(&["nvmf", "ns", "add", NQN, "m0"]);
    let ports: Vec<String> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string())
        .collect();
    for p in &ports {
        ok(&["nvmf", "listener", "add", NQN, &format!("127.0.0.1:{p}")]);
    }
    // A command line given as one string.
    let run = |line: &str| ok(&line.split_whitespace().collect::<Vec<_>>());
    let attach = |port: &str, mode: &str| {
        format!(
            "nvme attach Nvme0 --trtype tcp --traddr 127.0.0.1 --trsvcid {port} --subnqn {NQN} -x {mode} \
             --ctrlr-loss-timeout-sec -1 --reconnect-delay-sec 1"
        )
    };
    assert_eq!(run(&attach(&ports[0], "multipath")), "Nvme0n1\n");
    let e = refused_by(&d.rpc, &attach(&ports[1], "disable").split_whitespace().collect::<Vec<_>>());
    assert!(e.starts_with("error: "), "{e}");
    assert_eq!(run(&attach(&ports[1], "multipath")), "Nvme0n1\n");

    // The paths a channel holds, per reactor thread: none open yet, so only the header.
    let out = ok(&["nvme", "io-paths", "Nvme0n1"]);
    assert_eq!(
        out.lines().map(cols).collect::<Vec<_>>(),
        [["DISK", "THREAD", "CNTLID", "ADDRESS", "CURRENT", "CONNECTED", "ACCESSIBLE"]],
        "{out}"
    );
    let json: serde_json::Value = serde_json::from_str(&ok(&["nvme", "io-paths", "--json"])).unwrap();
    assert!(json["poll_groups"].is_array(), "{json}");
    let list = ok(&["nvme", "list", "Nvme0"]);
    assert_eq!(cols(list.lines().nth(1).unwrap())[0], "Nvme0", "{list}");

    // The policy: the daemon's refusals name the option.
    let e = refused(
        &"nvme set-multipath-policy Nvme0n1 -p active_active -s queue_depth -r 2"
            .split(' ')
            .collect::<Vec<_>>(),
    );
    assert!(e.starts_with("error: --rr-min-io: "), "{e}");
    let e = refused(&["nvme", "set-multipath-policy", "Nvme9n1", "-p", "active_passive"]);
    assert!(e.starts_with("error: NAME: "), "{e}");
    assert_eq!(run("nvme set-multipath-policy Nvme0n1 -p active_active -s round_robin -r 4"), "");

    // Removing the second listener disconnects that path only; the controller keeps trying.
    ok(&["nvmf", "listener", "remove", NQN, &format!("127.0.0.1:{}", ports[1])]);
    let state = |port: &str| -> String {
        let v = d.call("bdev_nvme_get_controllers", serde_json::json!({"name": "Nvme0"}));
        let path = v[0]["ctrlrs"].as_array().unwrap().iter().find(|c| c["trid"]["trsvcid"] == port).cloned();
        path.map(|p| p["state"].as_str().unwrap_or_default().to_string()).unwrap_or_default()
    };
    let wait = |what: &str, cond: &dyn Fn() -> bool| {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !cond() {
            assert!(std::time::Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    wait("the second path to lose its controller", &|| state(&ports[1]) != "enabled");
    assert_eq!(state(&ports[0]), "enabled");
    // Back: it reconnects on its own.
    ok(&["nvmf", "listener", "add", NQN, &format!("127.0.0.1:{}", ports[1])]);
    wait("the second path to reconnect", &|| state(&ports[1]) == "enabled");
    ok(&["nvme", "detach", "Nvme0"]);
}

/// The nvmf commands against a daemon: transport, subsystem, listener (which accepts TCP
/// connections), namespaces and hosts, their tables, refusals naming the argument, and a
/// deletion that releases the disks.
#[test]
fn nvmf_commands_on_a_daemon() {
    const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100";
    let d = common::Daemon::start("0");
    let ok = |args: &[&str]| succeeds(&d.rpc, args);
    let refused = |args: &[&str]| refused_by(&d.rpc, args);
    let cols = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    ok(&["disk", "create", "--type", "ram", "--name", "d0", "--size", "1MiB"]);
    ok(&["disk", "create", "--type", "ram", "--name", "d1", "--size", "1MiB"]);

    // A listener needs the transport first, and says so.
    ok(&["nvmf", "subsystem", "create", NQN, "--serial", "FP01"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let e = refused(&["nvmf", "listener", "add", NQN, &address]);
    assert!(e.contains("nvmf_create_transport"), "{e}");
    assert_eq!(ok(&["nvmf", "transport", "create", "--max-queue-depth", "64"]), "");
    let t = ok(&["nvmf", "transport", "list"]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(cols(lines[0]), ["TYPE", "QUEUE_DEPTH", "ADMIN_DEPTH", "IO_QPAIRS", "IN_CAPSULE", "MAX_IO"]);
    assert_eq!(cols(lines[1]), ["TCP", "64", "128", "127", "4096", "131072"]);
    ok(&["nvmf", "listener", "add", NQN, &address]);
    std::net::TcpStream::connect(&address).expect("the listener accepts connections");

    assert_eq!(ok(&["nvmf", "ns", "add", NQN, "d0"]), "1\n");
    assert_eq!(ok(&["nvmf", "ns", "add", NQN, "d1", "--nsid", "7", "--read-only"]), "7\n");
    ok(&["nvmf", "host", "add", NQN, HOST]);
    let list = ok(&["nvmf", "subsystem", "list", NQN]);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(cols(lines[0]), ["NQN", "TYPE", "LISTENERS", "HOSTS", "NAMESPACES"]);
    assert_eq!(cols(lines[1]), [NQN, "NVMe", &address, HOST, "1=d0,7=d1"]);
    // The discovery subsystem is listed too.
    assert!(ok(&["nvmf", "subsystem", "list"]).contains("Discovery"));
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["nvmf", "subsystem", "list", NQN, "--json"])).unwrap();
    assert_eq!(json[0]["serial_number"], "FP01", "{json}");
    let disk = ok(&["disk", "list", "d1", "--json"]);
    assert!(disk.contains(&format!("{NQN}/7")), "the disk's holder is its namespace: {disk}");
    assert_eq!(
        cols(ok(&["nvmf", "controllers", NQN]).lines().next().unwrap()),
        ["CNTLID", "HOST_NQN", "HOST_ID", "IO_QPAIRS"]
    );
    assert_eq!(ok(&["nvmf", "qpairs", NQN]).lines().count(), 1, "a header and no queue pair");

    // Refusals name what was wrong.
    let e = refused(&["nvmf", "ns", "add", NQN, "d2"]);
    assert_eq!(e, "error: bdev 'd2' does not exist");
    let e = refused(&["nvmf", "ns", "add", NQN, "d0"]);
    assert!(e.contains("d0"), "{e}");
    let e = refused(&["nvmf", "ns", "add", NQN, "d0", "--nguid", "xyz"]);
    assert_eq!(e, "error: --nguid: 'xyz' is not 32 hexadecimal digits");
    let e = refused(&["nvmf", "host", "add", NQN, "not-an-nqn"]);
    assert!(e.starts_with("error: HOST_NQN: "), "{e}");
    // A host with DH-HMAC-CHAP keys, named in the keyring; the list shows their names.
    const KEYED: &str = "nqn.2014-08.org.nvmexpress:uuid:1f0e0d0c-0b0a-0908-0706-050403020100";
    let key_file = d.dir.path().join("host0");
    std::fs::write(&key_file, "DHHC-1:00:ISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0Dc1bqW:\n").unwrap();
    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    d.call("keyring_file_add_key", serde_json::json!({"name": "host0", "path": key_file.to_str().unwrap()}));
    let e =
        refused(&["nvmf", "host", "add", NQN, KEYED, "--dhchap-key", "host0", "--dhchap-ctrlr-key", "nope"]);
    assert!(e.starts_with("error: --dhchap-ctrlr-key: "), "{e}");
    ok(&["nvmf", "host", "add", NQN, KEYED, "--dhchap-key", "host0", "--dhchap-ctrlr-key", "host0"]);
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["nvmf", "subsystem", "list", NQN, "--json"])).unwrap();
    let keyed = serde_json::json!({"nqn": KEYED, "dhchap_key": "host0", "dhchap_ctrlr_key": "host0"});
    assert!(json[0]["hosts"].as_array().unwrap().contains(&keyed), "{json}");
    ok(&["nvmf", "host", "remove", NQN, KEYED]);
    // Every host must authenticate: no host without a key, and not with --allow-any-host.
    const STRICT: &str = "nqn.2016-06.io.spdk:strict";
    ok(&["nvmf", "subsystem", "create", STRICT, "--require-dhchap"]);
    let e = refused(&["nvmf", "host", "add", STRICT, HOST]);
    assert!(e.starts_with("error: --dhchap-key: required"), "{e}");
    ok(&["nvmf", "host", "add", STRICT, HOST, "--dhchap-key", "host0"]);
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["nvmf", "subsystem", "list", STRICT, "--json"])).unwrap();
    assert_eq!(json[0]["require_dhchap"], true, "{json}");
    ok(&["nvmf", "subsystem", "delete", STRICT]);
    // A host with a TLS PSK and a secure listener (a key that is not a PSK refused naming the
    // option); the list marks the listener.
    const TLS: &str = "nqn.2016-06.io.spdk:tls";
    ok(&["nvmf", "subsystem", "create", TLS]);
    let psk_file = d.dir.path().join("psk0");
    std::fs::write(&psk_file, "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:\n").unwrap();
    std::fs::set_permissions(&psk_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    d.call("keyring_file_add_key", serde_json::json!({"name": "psk0", "path": psk_file.to_str().unwrap()}));
    let e = refused(&["nvmf", "host", "add", TLS, HOST, "--psk", "host0"]);
    assert!(e.starts_with("error: --psk: key 'host0' is not a TLS PSK"), "{e}");
    ok(&["nvmf", "host", "add", TLS, HOST, "--psk", "psk0"]);
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let tls_address = format!("127.0.0.1:{tls_port}");
    ok(&["nvmf", "listener", "add", TLS, &tls_address, "--secure-channel"]);
    let list = ok(&["nvmf", "subsystem", "list", TLS]);
    assert_eq!(cols(list.lines().nth(1).unwrap())[2], format!("{tls_address}(tls)"), "{list}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["nvmf", "subsystem", "list", TLS, "--json"])).unwrap();
    assert_eq!(json[0]["hosts"], serde_json::json!([{"nqn": HOST, "psk": "psk0"}]), "{json}");
    let e = refused(&["nvmf", "listener", "add", NQN, &tls_address]);
    assert!(e.starts_with("error: --secure-channel: "), "{e}");
    ok(&["nvmf", "listener", "remove", TLS, &tls_address]);
    ok(&["nvmf", "subsystem", "delete", TLS]);
    let e = refused(&["nvmf", "ns", "remove", NQN, "9"]);
    assert!(e.contains("does not exist"), "{e}");
    let e = refused(&["nvmf", "subsystem", "delete", "nqn.2016-06.io.spdk:none"]);
    assert_eq!(e, "error: subsystem 'nqn.2016-06.io.spdk:none' does not exist");
    let e = refused(&["disk", "delete", "d0"]);
    assert!(e.contains(&format!("{NQN}/1")), "{e}");

    ok(&["nvmf", "host", "remove", NQN, HOST]);
    ok(&["nvmf", "ns", "remove", NQN, "1"]);
    ok(&["nvmf", "listener", "remove", NQN, &address]);
    assert!(std::net::TcpStream::connect(&address).is_err(), "the listener closed");
    ok(&["nvmf", "subsystem", "delete", NQN]);
    ok(&["disk", "delete", "d0"]);
    ok(&["disk", "delete", "d1"]);
}

/// The error commands against a daemon whose config file made an error disk over a RAM disk:
/// injections shown by `disk list --json`'s driver_specific, clear, resume, refusals that name
/// the argument, and delete freeing the base.
#[test]
fn error_commands_and_config_tables() {
    let d = common::Daemon::start_with_config("0", |_| {
        "[[bdev]]\ntype = \"malloc\"\nname = \"m0\"\nnum_blocks = 1024\nblock_size = 512\n\n\
         [[bdev]]\ntype = \"error\"\nbase_name = \"m0\"\n"
            .to_string()
    });
    let ok = |args: &[&str]| succeeds(&d.rpc, args);
    let refused = |args: &[&str]| refused_by(&d.rpc, args);
    let injections = || -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&["rpc", "bdev_get_bdevs", r#"{"name":"EE_m0"}"#])).unwrap();
        v[0]["driver_specific"]["error"]["injections"].clone()
    };
    assert_eq!(injections(), serde_json::json!({}));
    ok(&["error", "inject", "EE_m0", "read", "failure", "-n", "3", "-q", "2"]);
    ok(&[
        "error",
        "inject",
        "EE_m0",
        "write",
        "corrupt_data",
        "--corrupt-offset",
        "7",
        "--corrupt-value",
        "9",
    ]);
    let i = injections();
    assert_eq!(
        (&i["read"]["num"], &i["read"]["queue_depth"]),
        (&serde_json::json!(3), &serde_json::json!(2))
    );
    assert_eq!(
        (&i["write"]["corrupt_offset"], &i["write"]["corrupt_value"]),
        (&serde_json::json!(7), &serde_json::json!(9))
    );
    ok(&["error", "resume", "EE_m0"]);
    ok(&["error", "inject", "EE_m0", "clear", "failure"]);
    assert_eq!(injections(), serde_json::json!({}));
    let e = refused(&["error", "inject", "EE_m0", "reed", "failure"]);
    assert!(e.starts_with("error: IO_TYPE: "), "{e}");
    let e = refused(&["error", "inject", "EE_m0", "write", "corrupt_data"]);
    assert!(e.starts_with("error: --corrupt-value: "), "{e}");
    let e = refused(&["disk", "delete", "m0"]);
    assert!(e.contains("m0"), "{e}");
    ok(&["error", "delete", "EE_m0"]);
    assert_eq!(ok(&["error", "create", "m0"]).trim_end(), "EE_m0");
    ok(&["error", "delete", "EE_m0"]);
    ok(&["disk", "delete", "m0"]);
}

#[test]
fn crypto_commands_on_a_daemon() {
    use std::os::unix::fs::PermissionsExt;
    let d = common::Daemon::start("0");
    let ok = |args: &[&str]| succeeds(&d.rpc, args);
    let refused = |args: &[&str]| refused_by(&d.rpc, args);
    let hex = "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4\n\
               0f1e2d3c4b5a69788796a5b4c3d2e1f000112233445566778899aabbccddeeff\n";
    let file = d.dir.path().join("xts.key");
    std::fs::write(&file, hex).unwrap();
    let f = file.to_str().unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    // Checked before the daemon is asked: a usage error (exit 2), one line.
    let out = flashpath(&["crypto", "key", "create", "k0", "--key-file", f], &d.rpc);
    let e = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.starts_with("error: --key-file: ") && e.contains("owner-only") && e.lines().count() == 1,
        "{e}"
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    ok(&["crypto", "key", "create", "k0", "--key-file", f]);
    let keys = ok(&["crypto", "key", "list"]);
    assert_eq!(keys.lines().nth(1).unwrap().split_whitespace().collect::<Vec<_>>(), ["k0", "AES_XTS", "512"]);
    assert!(!keys.contains("603deb"), "{keys}");

    ok(&["disk", "create", "--type", "ram", "--name", "d0", "--size", "1MiB"]);
    assert_eq!(ok(&["crypto", "create", "c0", "d0", "--key", "k0"]), "c0\n");
    let list = ok(&["crypto", "list"]);
    let row: Vec<&str> = list.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row, ["c0", "d0", "k0", "1048576", "512"], "{list}");
    let e = refused(&["crypto", "key", "destroy", "k0"]);
    assert!(e.contains("in use by 'c0'"), "{e}");
    let e = refused(&["crypto", "create", "c1", "d0", "--key", "nokey"]);
    assert!(e.contains("--key"), "{e}");
    ok(&["crypto", "delete", "c0"]);
    ok(&["crypto", "key", "destroy", "k0"]);
    assert_eq!(ok(&["crypto", "key", "list"]).lines().count(), 1);
}

/// `crypto keyring`, `crypto luks format|dump|test|add-key|kill-slot|reencrypt` and `crypto
/// create --luks-key` on a daemon; a refused passphrase names its option.
#[test]
fn luks_commands_on_a_daemon() {
    use std::os::unix::fs::PermissionsExt;
    let d = common::Daemon::start("0");
    let ok = |args: &[&str]| succeeds(&d.rpc, args);
    let refused = |args: &[&str]| refused_by(&d.rpc, args);
    let mut keys = Vec::new();
    for (name, pass) in [("p0", "first"), ("p1", "second"), ("bad", "wrong")] {
        let f = d.dir.path().join(name);
        std::fs::write(&f, pass).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        ok(&["crypto", "keyring", "add", name, f.to_str().unwrap()]);
        keys.push(f);
    }
    let list = ok(&["crypto", "keyring", "list"]);
    assert_eq!(list.lines().count(), 4, "{list}");
    assert!(!list.contains("first"), "{list}");
    ok(&["disk", "create", "--type", "ram", "--name", "d0", "--size", "32MiB"]);
    let fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let uuid = ok(&[&["crypto", "luks", "format", "d0", "--passphrase-key", "p0"][..], &fast].concat());
    assert_eq!(uuid.trim().len(), 36, "a UUID: {uuid}");
    let e = refused(&[&["crypto", "luks", "format", "d0", "--passphrase-key", "p0"][..], &fast].concat());
    assert!(e.contains("BASE") && e.contains("force"), "{e}");
    assert_eq!(ok(&["crypto", "luks", "test", "--base", "d0", "--passphrase-key", "p0"]), "0\n");
    let e = refused(&["crypto", "create", "c0", "d0", "--luks-key", "bad"]);
    assert!(e.starts_with("error: --luks-key: "), "{e}");
    assert_eq!(ok(&["crypto", "create", "c0", "d0", "--luks-key", "p0"]), "c0\n");
    assert_eq!(
        ok(&[&["crypto", "luks", "add-key", "c0", "--passphrase-key", "p1"][..], &fast].concat()),
        "1\n"
    );
    let dump = ok(&["crypto", "luks", "dump", "c0"]);
    assert!(dump.contains("Version: luks2") && dump.contains("Sector size: 4096"), "{dump}");
    let slots: Vec<&str> = dump.lines().skip_while(|l| !l.starts_with("SLOT")).skip(1).collect();
    assert_eq!(slots.len(), 2, "{dump}");
    assert!(slots[1].starts_with("1 ") && slots[1].contains("pbkdf2"), "{dump}");
    ok(&["crypto", "luks", "kill-slot", "c0", "0"]);
    let e = refused(&["crypto", "luks", "kill-slot", "c0", "1"]);
    assert!(e.starts_with("error: --key-slot: "), "{e}");
    ok(&[&["crypto", "luks", "reencrypt", "start", "c0", "--passphrase-key", "p1"][..], &fast].concat());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let status = ok(&["crypto", "luks", "reencrypt", "status"]);
        let row = status.lines().nth(1).unwrap_or_default().to_string();
        if row.contains("done") {
            assert!(row.starts_with("c0 ") && row.contains("100.0%"), "{status}");
            break;
        }
        assert!(row.contains("running"), "{status}");
        assert!(std::time::Instant::now() < deadline, "{status}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let slot = ok(&["crypto", "luks", "test", "c0", "--passphrase-key", "p1"]);
    assert!(slot.trim().parse::<u32>().is_ok(), "the passphrase given to the job opens the new key: {slot}");
    let e = refused(&["crypto", "luks", "test", "c0", "--passphrase-key", "p0"]);
    assert!(e.starts_with("error: --passphrase-key: "), "{e}");
    ok(&["crypto", "delete", "c0"]);
}
