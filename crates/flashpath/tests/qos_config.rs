//! QoS from the start-up configuration file and through the CLI, against a real daemon: the
//! file's `[[qos_limit]]` and `[[qos_group]]` tables are in force when `serve` answers, and
//! `flashpath qos ...` changes them and shows the change (`qos show`, `qos groups`), and what
//! a limit held back under load.

mod common;

use std::process::Output;

use common::{BlkClient, Daemon, Op, OpKind};
use serde_json::{json, Value};

const CONFIG: &str = r#"
[[bdev]]
type = "malloc"
name = "a"
num_blocks = 2048
block_size = 512

[[bdev]]
type = "malloc"
name = "b"
num_blocks = 2048
block_size = 512

[[qos_limit]]
name = "a"
rw_ios_per_sec = 20000

[[qos_group]]
name = "tenants"
iops_total = 10000
members = [ { bdev_name = "a", weight = 3 }, { bdev_name = "b" } ]

[[qos_group]]
name = "spare"
bps_read = 104857600
bps_read_max = 209715200
bps_read_max_length = 5

[[vhost_blk]]
ctrlr = "vhost.a"
dev_name = "a"
num_queues = 1
"#;

fn cli(d: &Daemon, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .arg("--rpc")
        .arg(&d.rpc)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running flashpath")
}

/// Runs a command that must succeed; returns its stdout.
fn ok(d: &Daemon, args: &[&str]) -> String {
    let out = cli(d, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    assert!(stderr.is_empty(), "{args:?} wrote to stderr: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that the daemon must refuse; returns its one line on stderr.
fn refused(d: &Daemon, args: &[&str]) -> String {
    let out = cli(d, args);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr:?}");
    stderr.trim_end().to_string()
}

/// The cells of the table row whose first cell is `first` (none may be empty but the last).
fn row(table: &str, first: &str) -> Vec<String> {
    let line = table.lines().find(|l| l.split_whitespace().next() == Some(first));
    let line = line.unwrap_or_else(|| panic!("no row {first} in\n{table}"));
    line.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect()
}

fn limits(d: &Daemon, disk: &str) -> Value {
    d.call("bdev_get_bdevs", json!({ "name": disk }))[0]["assigned_rate_limits"].clone()
}

#[test]
fn config_limits_are_in_force_and_the_cli_changes_and_shows_them() {
    let d = Daemon::start_with_config("0", |_| CONFIG.to_string());

    // From the file.
    let show = ok(&d, &["qos", "show"]);
    let header = row(&show, "DISK");
    assert_eq!(header[..7], ["DISK", "IOPS", "MiB/s", "READ MiB/s", "WRITE MiB/s", "GROUP", "WEIGHT"]);
    assert_eq!(row(&show, "a")[..7], ["a", "20000", "-", "-", "-", "tenants", "3"]);
    assert_eq!(row(&show, "b")[..7], ["b", "-", "-", "-", "-", "tenants", "1"]);
    let groups = ok(&d, &["qos", "groups"]);
    assert_eq!(row(&groups, "tenants"), ["tenants", "iops_total 10000 IOPS", "a", "3", "7500 IOPS"]);
    let b_row: Vec<&str> = groups.lines().find(|l| l.contains(" b ")).unwrap().split_whitespace().collect();
    assert_eq!(b_row, ["b", "1", "2500", "IOPS"]);
    assert_eq!(
        row(&groups, "spare"),
        ["spare", "bps_read 100 MiB/s (burst 200 MiB/s for 5 s)", "-", "-", "-"]
    );

    // Set a limit, see it; 0 removes it, an option left out is kept.
    ok(&d, &["qos", "limit", "b", "--iops", "5000", "--read-mbps", "7"]);
    assert_eq!(row(&ok(&d, &["qos", "show", "b"]), "b")[..5], ["b", "5000", "-", "7", "-"]);
    ok(&d, &["qos", "limit", "b", "--iops", "0", "--write-mbps", "3"]);
    assert_eq!(
        limits(&d, "b"),
        json!({"rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 7, "w_mbytes_per_sec": 3})
    );

    // Groups: weight, limits, membership.
    ok(&d, &["qos", "group", "weight", "tenants", "b", "5"]);
    assert_eq!(row(&ok(&d, &["qos", "show", "b"]), "b")[5..7], ["tenants", "5"]);
    ok(&d, &["qos", "group", "set", "spare", "--iops-total", "4000", "--bps-read", "50MiB"]);
    ok(&d, &["qos", "group", "remove", "tenants", "b"]);
    ok(&d, &["qos", "group", "add", "spare", "b", "--weight", "2"]);
    let spare = &d.call("bdev_qos_get_groups", json!({ "name": "spare" }))[0];
    assert_eq!((spare["iops_total"].as_u64(), spare["bps_read"].as_u64()), (Some(4000), Some(50 << 20)));
    assert_eq!(spare["bps_read_max"], 209715200, "a limit left out is kept");
    assert_eq!(spare["members"], json!([{ "bdev_name": "b", "weight": 2, "rate": 4000 }]));
    ok(&d, &["qos", "group", "create", "new", "--iops-total", "2000", "--bps-write", "64MiB"]);
    let new = &d.call("bdev_qos_get_groups", json!({ "name": "new" }))[0];
    assert_eq!((new["iops_total"].as_u64(), new["bps_write"].as_u64()), (Some(2000), Some(64 << 20)));
    ok(&d, &["qos", "group", "delete", "new"]);
    let names: Vec<Value> = d
        .call("bdev_qos_get_groups", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].clone())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(!names.contains(&json!("new")), "{names:?}");

    // The daemon's refusals name the option (or argument) the user typed, and change nothing.
    assert_eq!(
        refused(&d, &["qos", "limit", "a", "--iops", "10"]),
        "error: --iops: 10 is below the minimum of 1000"
    );
    assert_eq!(limits(&d, "a")["rw_ios_per_sec"], 20000);
    assert_eq!(
        refused(&d, &["qos", "group", "add", "tenants", "b"]),
        "error: DISK: bdev 'b' is already in QoS group 'spare'"
    );
    assert_eq!(
        refused(&d, &["qos", "group", "add", "tenants", "a", "--weight", "0"]),
        "error: --weight: 0 is not a weight (1 to 65535)"
    );
    assert_eq!(
        refused(&d, &["qos", "group", "create", "x", "--bps-total-max", "1G"]),
        "error: --bps-total: a burst ceiling (max) needs an average"
    );
    assert_eq!(refused(&d, &["qos", "show", "zz"]), "error: bdev 'zz' does not exist");
    assert_eq!(refused(&d, &["qos", "groups", "zz"]), "error: QoS group 'zz' does not exist");

    // --json: the RPC results as they are.
    let json: Value = serde_json::from_str(&ok(&d, &["--json", "qos", "groups", "tenants"])).unwrap();
    assert_eq!(json[0]["members"][0]["bdev_name"], "a");
    let json: Value = serde_json::from_str(&ok(&d, &["--json", "qos", "show", "a"])).unwrap();
    assert_eq!(json["bdevs"][0]["assigned_rate_limits"]["rw_ios_per_sec"], 20000);
}

/// 200 reads at once against a disk the file limits to 1,000 IOPS: all complete, and `qos show`
/// counts the ones held, with time throttled, and none held once they are done.
#[test]
fn qos_show_counts_what_a_limit_held_back() {
    let d = Daemon::start_with_config("0", |_| {
        "[[bdev]]\ntype = \"malloc\"\nname = \"d0\"\nnum_blocks = 8192\nblock_size = 512\n\
         [[qos_limit]]\nname = \"d0\"\nrw_ios_per_sec = 1000\n\
         [[vhost_blk]]\nctrlr = \"vhost.0\"\ndev_name = \"d0\"\nnum_queues = 1\n"
            .to_string()
    });
    let before = row(&ok(&d, &["qos", "show", "d0"]), "d0");
    assert_eq!(before[1..], ["1000", "-", "-", "-", "-", "-", "0", "0", "0.000s"]);
    let mut client = BlkClient::open(&d.dir.path().join("vhost.0"), 1);
    let ops: Vec<Op> = (0..200)
        .map(|i| Op {
            queue: 0,
            kind: OpKind::Read,
            offset: i * 4096,
            len: 4096,
            buf: (i as usize % 64) * 4096,
        })
        .collect();
    let started = std::time::Instant::now();
    assert!(client.run(&ops).iter().all(|&ret| ret == 0));
    // 200 requests at 1,000 a second take 0.2 s, less the few the first grant lets through.
    assert!(started.elapsed().as_secs_f64() > 0.15, "{:?}", started.elapsed());
    let after = row(&ok(&d, &["qos", "show", "d0"]), "d0");
    assert_eq!(after[7], "0", "none held once all completed: {after:?}");
    let held: u64 = after[8].parse().unwrap();
    assert!((150..=200).contains(&held), "{after:?}");
    let throttled: f64 = after[9].trim_end_matches('s').parse().unwrap();
    assert!(throttled > 0.1, "{after:?}");
}
