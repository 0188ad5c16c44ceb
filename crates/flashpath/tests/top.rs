//! `flashpath top` as a person uses it: in a terminal (tmux, 120x30) next to a daemon with I/O
//! running, the screen shows the disk with non-zero IOPS, its latencies and QoS cell (and a
//! second disk's, held back by a limit), and the reactor rows; `q` quits with status 0 and the
//! pane closes.
//!
//! tmux comes from Debian (`./run test` installs it). Outside CI a missing tmux skips the test
//! with a printed reason; with `CI=true` it fails.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{BlkClient, Daemon};

/// A private tmux server (its own socket name), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("running tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn tmux_available() -> bool {
    let found = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
    if !found {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "tmux is not installed (./run test installs it)"
        );
        eprintln!("skipping: tmux is not installed (apt-get install tmux)");
    }
    found
}

/// The disk's row on screen, cell by cell, if it is there.
fn disk_row(screen: &str, disk: &str) -> Option<Vec<String>> {
    screen.lines().find_map(|l| {
        let cells: Vec<String> = l
            .trim_matches(|c: char| c == '│' || c.is_whitespace())
            .split_whitespace()
            .map(String::from)
            .collect();
        (cells.first().map(String::as_str) == Some(disk)).then_some(cells)
    })
}

/// The disk's READ/s on screen.
fn read_iops(screen: &str, disk: &str) -> Option<f64> {
    disk_row(screen, disk)?.get(1)?.parse().ok()
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool, context: impl Fn() -> String) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}:\n{}", context());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn top_shows_disk_iops_and_reactors_and_q_quits() {
    if !tmux_available() {
        return;
    }
    let daemon = Daemon::start("0");
    daemon.malloc("d0", 8192, 512);
    daemon.call("bdev_enable_histogram", serde_json::json!({"name": "d0", "enable": true}));
    // d1 reads as fast as d0 but is limited to 1,000 IOPS: nearly all its time is throttled.
    daemon.malloc("d1", 8192, 512);
    daemon.call("bdev_set_qos_limit", serde_json::json!({"name": "d1", "rw_ios_per_sec": 1000}));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = ["d0", "d1"]
        .into_iter()
        .map(|disk| {
            let sock = daemon.controller(&format!("c-{disk}"), disk, Some(1), false);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = BlkClient::open(&sock, 1);
                let until = Instant::now() + Duration::from_secs(60);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    c.read(0, (i % 512) * 4096, 4096).expect("read");
                    i += 1;
                }
            })
        })
        .collect();

    let tmux = Tmux { socket: format!("fp-top-{}", std::process::id()) };
    let status = daemon.dir.path().join("top.status");
    let stderr = daemon.dir.path().join("top.stderr");
    let command = format!(
        "{} --rpc {} top 2> {}; echo $? > {}",
        env!("CARGO_BIN_EXE_flashpath"),
        daemon.rpc.display(),
        stderr.display(),
        status.display()
    );
    let context = || {
        format!("{}\ntop's stderr: {}", tmux.screen(), std::fs::read_to_string(&stderr).unwrap_or_default())
    };
    let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "120", "-y", "30", &command]);
    assert!(started.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&started.stderr));

    // A refresh after the first second shows the rates.
    wait_until(
        "the d0 row with non-zero READ/s",
        Duration::from_secs(20),
        || read_iops(&tmux.screen(), "d0").is_some_and(|r| r > 0.0),
        context,
    );
    let screen = tmux.screen();
    eprintln!("{screen}");
    for header in ["DISK", "READ/s", "P99 us", "QD", "QOS", "ERR", "CORE", "BUSY%"] {
        assert!(screen.contains(header), "{header} missing:\n{screen}");
    }
    // With the histogram on, the mean, p50 and p99 latencies are numbers, in that order.
    let row = disk_row(&screen, "d0").unwrap();
    let latency: Vec<f64> =
        row[5..8].iter().map(|c| c.parse().unwrap_or_else(|_| panic!("{c}:\n{screen}"))).collect();
    assert!(latency.iter().all(|&us| us > 0.0) && latency[1] <= latency[2], "{latency:?}:\n{screen}");
    // QOS after QD: no limit on d0, so nothing waits and nothing was throttled; then ERR.
    assert_eq!(row[9..], ["0/0%", "0"], "{row:?}:\n{screen}");
    // d1's one reader waits for its limit: at most that request waiting, and most of the
    // interval throttled (the rest is the client's turn-around between requests).
    wait_until(
        "d1's QOS cell with most of the interval throttled",
        Duration::from_secs(20),
        || {
            let row = disk_row(&tmux.screen(), "d1").unwrap_or_default();
            let qos = row.get(9).and_then(|c| c.strip_suffix('%')?.split_once('/'));
            qos.is_some_and(|(queued, pct)| {
                queued.parse::<u64>().is_ok_and(|q| q <= 1) && pct.parse::<u64>().is_ok_and(|p| p >= 50)
            })
        },
        context,
    );
    // The reactor's row: its core, a busy share, and whether it polls or sleeps right now.
    assert!(
        screen.lines().any(|l| l.starts_with("│0 ") && (l.contains("polling") || l.contains("sleeping"))),
        "no reactor row:\n{}",
        context()
    );

    tmux.run(&["send-keys", "-t", "top", "q"]);
    wait_until("top exits", Duration::from_secs(10), || status_of(&status).is_some(), context);
    assert_eq!(status_of(&status).as_deref(), Some("0"));
    wait_until(
        "the pane closes",
        Duration::from_secs(10),
        || !tmux.run(&["has-session", "-t", "top"]).status.success(),
        context,
    );
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("an I/O thread");
    }
}

fn status_of(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// `flashpath stats`: the per-disk table counts what a client did; `--json` stays the raw
/// `flashpath_get_stats` result.
#[test]
fn stats_table_counts_per_disk() {
    let daemon = Daemon::start("0");
    daemon.malloc("d0", 8192, 512);
    let sock = daemon.controller("c0", "d0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    for i in 0..7u64 {
        c.read(0, i * 4096, 4096).expect("read");
    }
    assert_eq!(c.write(0, 0, &[1; 8192]), 0);
    let stats = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flashpath"));
        cmd.arg("--rpc").arg(&daemon.rpc).arg("stats");
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("running flashpath stats");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = stats(false);
    let header =
        text.lines().find(|l| l.starts_with("DISK")).unwrap_or_else(|| panic!("no disk table:\n{text}"));
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>()[..5],
        ["DISK", "READS", "WRITES", "READ", "WRITTEN"]
    );
    let row: Vec<&str> =
        text.lines().find(|l| l.starts_with("d0 ")).expect("d0 row").split_whitespace().collect();
    assert_eq!(row[..7], ["d0", "7", "1", "28", "KiB", "8", "KiB"], "{text}");
    let json: serde_json::Value = serde_json::from_str(&stats(true)).unwrap();
    assert_eq!(json["controllers"][0]["stats"]["read_ops"], 7, "{json}");
}

/// Without a terminal (output piped), `top` fails with one line instead of drawing or panicking.
#[test]
fn top_without_a_terminal_is_a_one_line_error() {
    let daemon = Daemon::start("0");
    let out = Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .arg("--rpc")
        .arg(&daemon.rpc)
        .arg("top")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running flashpath top");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("flashpath top needs an interactive terminal"), "{stderr}");
}

/// An NVMe-oF subsystem gets its panel: its NQN with the controllers and queue pairs connected
/// now (none here: hosts connecting are the engine's tests) and its rates.
#[test]
fn top_shows_nvmf_subsystems() {
    if !tmux_available() {
        return;
    }
    const NQN: &str = "nqn.2016-06.io.spdk:top1";
    let daemon = Daemon::start("0");
    daemon.malloc("d0", 8192, 512);
    daemon.call("nvmf_create_transport", serde_json::json!({"trtype": "TCP"}));
    daemon.call("nvmf_create_subsystem", serde_json::json!({"nqn": NQN, "allow_any_host": true}));
    daemon.call("nvmf_subsystem_add_ns", serde_json::json!({"nqn": NQN, "namespace": {"bdev_name": "d0"}}));

    let tmux = Tmux { socket: format!("fp-top-nvmf-{}", std::process::id()) };
    let status = daemon.dir.path().join("top.status");
    let command = format!(
        "{} --rpc {} top; echo $? > {}",
        env!("CARGO_BIN_EXE_flashpath"),
        daemon.rpc.display(),
        status.display()
    );
    let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "120", "-y", "30", &command]);
    assert!(started.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&started.stderr));
    let row = || {
        tmux.screen().lines().find_map(|l| {
            let cells: Vec<String> = l
                .trim_matches(|c: char| c == '│' || c.is_whitespace())
                .split_whitespace()
                .map(String::from)
                .collect();
            (cells.first().map(String::as_str) == Some(NQN)).then_some(cells)
        })
    };
    wait_until("the subsystem's row", Duration::from_secs(20), || row().is_some(), || tmux.screen());
    let screen = tmux.screen();
    assert!(screen.contains(" nvmf subsystems "), "no panel title:\n{screen}");
    for header in ["SUBSYSTEM", "CTRLRS", "QPAIRS", "IO/s", "MB/s"] {
        assert!(screen.contains(header), "{header} missing:\n{screen}");
    }
    assert_eq!(row().unwrap()[1..], ["0", "0", "0", "0.00", "0"], "{screen}");
    tmux.run(&["send-keys", "-t", "top", "q"]);
    wait_until("top exits", Duration::from_secs(10), || status_of(&status).is_some(), || tmux.screen());
    assert_eq!(status_of(&status).as_deref(), Some("0"));
}
