//! `serve --metrics`: a real Prometheus scrapes the daemon while libblkio drives I/O, and the
//! value it stores is checked through its HTTP API; `promtool check metrics` lints the
//! exposition; a QoS-limited disk's held-back requests reach the exposition; the Unix-socket
//! endpoint answers; bad addresses are refused at start.
//!
//! Prometheus and promtool come from the Debian package `prometheus` (`./run test` installs
//! it). Outside CI a missing binary skips the Prometheus test with a printed reason; with
//! `CI=true` it fails.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{bounded, BlkClient, Daemon};
use fp_loadgen::{LoadSpec, Pattern};
use serde_json::{json, Value};

/// Reads done by the test; the scraped counter must say exactly this.
const READS: u64 = 150;
const WRITES: u64 = 20;

/// Finds `name` on PATH. `None` outside CI means skip; in CI a missing tool is a failure.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "{name} is not installed (Debian package prometheus; ./run test installs it)"
        );
        eprintln!("skipping: {name} is not installed (apt-get install prometheus)");
    }
    found
}

/// One HTTP/1.0 GET over `stream`; returns the status code and body.
fn http_get(mut stream: impl Read + Write, host: &str, path: &str) -> (u16, String) {
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").expect("sending the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("reading the response");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}

fn get_tcp(addr: &str, path: &str) -> (u16, String) {
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    http_get(stream, addr, path)
}

/// The `host:port` the daemon reported for its metrics endpoint. The daemon prints it just
/// after it starts answering RPCs, so under load the line can come a moment after `start`.
fn metrics_addr(daemon: &Daemon) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stderr = daemon.stderr();
        if let Some(line) = stderr.lines().find_map(|l| l.strip_prefix("flashpath metrics at http://")) {
            return line.trim_end_matches("/metrics").to_string();
        }
        assert!(Instant::now() < deadline, "no metrics line in the daemon's stderr:\n{stderr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Percent-encodes a PromQL query for a URL.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server, killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Prometheus {
    fn start(bin: &Path, dir: &Path, target: &str) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: flashpath\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting prometheus");
        Prometheus { child, addr, log }
    }

    /// The query's first sample value, if the query returns any.
    fn query(&self, promql: &str) -> Option<f64> {
        let stream = TcpStream::connect(&self.addr).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let (status, body) =
            http_get(stream, &self.addr, &format!("/api/v1/query?query={}", url_encode(promql)));
        if status != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_read_counts_and_promtool_accepts_the_exposition() {
    let (Some(prometheus), Some(promtool)) = (tool("prometheus"), tool("promtool")) else { return };
    let daemon = Daemon::start_with_args("0", &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&daemon);
    daemon.malloc("d0", 8192, 512);
    daemon.call("bdev_enable_histogram", serde_json::json!({"name": "d0", "enable": true}));
    let sock = daemon.controller("c0", "d0", Some(1), false);

    let server = Prometheus::start(&prometheus, daemon.dir.path(), &addr);
    let mut c = BlkClient::open(&sock, 1);
    for i in 0..WRITES {
        assert_eq!(c.write(0, i * 4096, &[0x5a; 4096]), 0, "write {i}");
    }
    for i in 0..READS {
        c.read(0, (i % 64) * 4096, 4096).unwrap_or_else(|e| panic!("read {i} failed: {e}"));
    }

    // The exposition itself: the counters are exact, and promtool's linter accepts it.
    let (status, text) = get_tcp(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains(&format!(
            "flashpath_vhost_requests_total{{ctrlr=\"c0\",bdev=\"d0\",type=\"read\"}} {READS}\n"
        )),
        "{text}"
    );
    assert!(text.contains("flashpath_vhost_in_flight{ctrlr=\"c0\",bdev=\"d0\"} 0\n"), "{text}");
    // No migration, no dirty log: nothing marked.
    assert!(
        text.contains("flashpath_vhost_logged_pages_total{ctrlr=\"c0\",bdev=\"d0\",what=\"data\"} 0\n"),
        "{text}"
    );
    // Guest kicks (the unit tests check the count): the series is there for every controller.
    assert!(text.contains("flashpath_vhost_kicks_total{ctrlr=\"c0\",bdev=\"d0\"} "), "{text}");
    // The client's one queue, on its own.
    assert!(
        text.contains("flashpath_vhost_queue_in_flight{ctrlr=\"c0\",bdev=\"d0\",queue=\"0\"} 0\n"),
        "{text}"
    );
    // The disk layer's view of the same I/O, and its latency histogram.
    assert!(
        text.contains(&format!("flashpath_bdev_ops_total{{bdev=\"d0\",type=\"read\"}} {READS}\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "flashpath_bdev_io_latency_seconds_count{{bdev=\"d0\"}} {}\n",
            READS + WRITES
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "flashpath_bdev_io_latency_seconds_bucket{{bdev=\"d0\",le=\"+Inf\"}} {}\n",
            READS + WRITES
        )),
        "{text}"
    );
    // No QoS limit on d0: its QoS series exist (a rate over them works from the start) at 0.
    for family in [
        "flashpath_bdev_qos_queued",
        "flashpath_bdev_qos_queued_total",
        "flashpath_bdev_qos_wait_seconds_total",
        "flashpath_bdev_qos_throttled_seconds_total",
    ] {
        assert!(text.contains(&format!("{family}{{bdev=\"d0\"}} 0\n")), "{family}: {text}");
    }
    assert!(text.contains("flashpath_reactor_busy_seconds_total{lcore=\"0\"}"), "{text}");
    assert!(text.contains(&format!(
        "flashpath_build_info{{version=\"flashpath v{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    )));
    assert_promtool_accepts(&promtool, &text);

    // What Prometheus stored from its own scrapes.
    let promql = "flashpath_vhost_requests_total{job=\"flashpath\",ctrlr=\"c0\",type=\"read\"}";
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = None;
    while Instant::now() < deadline {
        seen = server.query(promql);
        if seen == Some(READS as f64) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(seen, Some(READS as f64), "{promql} through Prometheus; its log:\n{}", server.log());
    let written = server.query("flashpath_vhost_bytes_total{ctrlr=\"c0\",direction=\"write\"}");
    assert_eq!(written, Some((WRITES * 4096) as f64));
    let disk_reads = server.query("flashpath_bdev_ops_total{bdev=\"d0\",type=\"read\"}");
    assert_eq!(disk_reads, Some(READS as f64));
    // Every I/O took under 10 s: the histogram's top finite bucket holds them all.
    let under_10s = server.query("flashpath_bdev_io_latency_seconds_bucket{bdev=\"d0\",le=\"10\"}");
    assert_eq!(under_10s, Some((READS + WRITES) as f64));
    assert_eq!(server.query("up{job=\"flashpath\"}"), Some(1.0));
}

/// `promtool check metrics` lints `text` clean.
fn assert_promtool_accepts(promtool: &Path, text: &str) {
    let mut lint = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    lint.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let lint = lint.wait_with_output().unwrap();
    assert!(
        lint.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
}

/// A sample's value in an exposition, found by its name and labels as written.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// QoS end to end: a disk limited to 1,000 IOPS and flooded at QD32 for 0.6 s holds requests
/// back; `bdev_get_iostat` counts them and the scraped counters rise from 0 to its numbers.
#[test]
fn a_flooded_limited_disk_counts_what_qos_held_back() {
    let daemon = Daemon::start_with_args("0", &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&daemon);
    daemon.malloc("d0", 8192, 512);
    let sock = daemon.controller("c0", "d0", Some(1), false);
    let limited = Instant::now();
    assert_eq!(daemon.call("bdev_set_qos_limit", json!({"name": "d0", "rw_ios_per_sec": 1000})), true);
    let scrape = || {
        let (status, text) = get_tcp(&addr, "/metrics");
        assert_eq!(status, 200, "{text}");
        let at = |family: &str| sample(&text, &format!("{family}{{bdev=\"d0\"}}"));
        let values = [
            at("flashpath_bdev_qos_queued"),
            at("flashpath_bdev_qos_queued_total"),
            at("flashpath_bdev_qos_wait_seconds_total"),
            at("flashpath_bdev_qos_throttled_seconds_total"),
        ];
        values.map(|v| v.unwrap_or_else(|| panic!("a QoS series of d0 missing:\n{text}")))
    };
    assert_eq!(scrape(), [0.0; 4]);

    let mut spec = LoadSpec::new(&sock);
    spec.pattern = Pattern::RandRead;
    spec.queue_depth = 32;
    spec.duration = Duration::from_millis(600);
    let r = bounded(Duration::from_secs(60), "the flood", move || fp_loadgen::run(&spec).expect("fp-load"));
    assert_eq!(r.errors, 0, "{r:?}");
    // The limit is an upper bound; how close a loaded machine comes to it is not this test's
    // business (blkio_qos.rs): that the limiter held requests back is checked in its counters.
    assert!(r.ios > 0 && r.iops < 1500.0, "{} IOPS under a 1,000 IOPS limit", r.iops);

    let io = daemon.call("bdev_get_iostat", json!({"name": "d0"}));
    let since_limit = limited.elapsed().as_secs_f64();
    let s = &io["bdevs"][0];
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k}: {s}"));
    // fp-load waits for its requests, so none is left waiting.
    assert_eq!((n("qos_queued"), n("queue_depth")), (0, 0), "{s}");
    let queued = n("qos_queued_total");
    assert!(queued > 0 && queued <= n("num_read_ops"), "{queued} of the reads held back: {s}");
    assert!(n("qos_wait_ticks") > 0 && n("qos_throttled_ticks") > 0, "{s}");
    // The one channel was throttled only while the limit existed, and no request waited longer.
    let rate = io["tick_rate"].as_u64().unwrap() as f64;
    for k in ["qos_throttled_ticks", "max_read_latency_ticks"] {
        assert!(n(k) as f64 / rate <= since_limit, "{k}: more than the {since_limit} s since the limit: {s}");
    }
    // Idle since: the scrape says what the RPC said, in seconds at its tick rate.
    let [now, total, wait_s, throttled_s] = scrape();
    assert_eq!((now, total), (0.0, queued as f64));
    for (scraped, ticks) in [(wait_s, n("qos_wait_ticks")), (throttled_s, n("qos_throttled_ticks"))] {
        assert!((scraped - ticks as f64 / rate).abs() < 1e-9, "{scraped} s for {ticks} ticks at {rate}/s");
    }
}

/// The config file's `metrics` key, here a Unix socket (over a stale one).
#[test]
fn unix_socket_endpoint_from_the_config_answers_and_is_removed_at_stop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.sock");
    // A socket left by a killed daemon: nobody listens on it, so serve replaces it.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let daemon = Daemon::start_with_config("0", |_| format!("metrics = \"unix:{}\"\n", path.display()));
    let stream = UnixStream::connect(&path).expect("connecting to the metrics socket");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (status, text) = http_get(stream, "localhost", "/metrics");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("# TYPE flashpath_uptime_seconds gauge"), "{text}");
    let (status, _) = http_get(UnixStream::connect(&path).unwrap(), "localhost", "/other");
    assert_eq!(status, 404);
    drop(daemon);
    assert!(!path.exists(), "the metrics socket outlived the daemon");
}

/// Runs `serve` with `--metrics value`; returns its exit code and stderr.
fn serve_fails(value: &str) -> (Option<i32>, String) {
    serve_with(tempfile::tempdir().unwrap().path(), &["--metrics", value])
}

/// Runs `serve` in `dir` with `args` added; returns its exit code and stderr.
fn serve_with(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flashpath"))
        .args(["serve", "--cpus", "0"])
        .args(args)
        .arg("--rpc")
        .arg(dir.join("rpc.sock"))
        .arg("--vhost-dir")
        .arg(dir.join("vhost"))
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!dir.join("rpc.sock").exists(), "the RPC socket was left behind");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn an_address_in_use_stops_serve_at_start_naming_the_option() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, stderr) = serve_fails(&addr);
    assert_eq!(code, Some(1), "{stderr}");
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "{stderr}");
    assert_eq!(
        line,
        format!(
            "error: --metrics: cannot listen on http://{addr}/metrics: Address already in use (os error 98)"
        )
    );
    // A Unix socket someone listens on is in use too, and stays theirs.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.sock");
    let _live = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let (code, stderr) = serve_fails(&format!("unix:{}", path.display()));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.starts_with("error: --metrics: cannot listen on unix:"), "{stderr}");
    assert!(stderr.trim_end().ends_with("Address already in use (os error 98)"), "{stderr}");
    assert!(UnixStream::connect(&path).is_ok(), "the listener's socket was removed");
}

#[test]
fn non_loopback_and_malformed_addresses_are_refused() {
    for (value, why) in [
        ("192.0.2.1:9111", "192.0.2.1 is not a loopback address"),
        ("0.0.0.0:9111", "0.0.0.0 is not a loopback address"),
        ("localhost", "not a host:port or unix:PATH"),
        ("unix:", "unix: needs a socket path"),
    ] {
        let (code, stderr) = serve_fails(value);
        assert_eq!(code, Some(1), "{value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{value}: {stderr}");
        assert!(stderr.starts_with(&format!("error: --metrics: '{value}': {why}")), "{value}: {stderr}");
    }
}

#[test]
fn a_bad_config_address_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("flashpath.toml");
    std::fs::write(&config, "metrics = \"[2001:db8::1]:9111\"\n").unwrap();
    let (code, stderr) = serve_with(dir.path(), &["--config", config.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: metrics: '[2001:db8::1]:9111': 2001:db8::1 is not a loopback address"),
        "{stderr}"
    );
}

/// An NBD export counts what its clients asked, request by request: `nbd_get_disks` reports it
/// and the endpoint exposes it, for the export beside the disk layer's view.
#[test]
fn an_nbd_export_counts_its_requests_bytes_and_errors() {
    use common::nbd::{start_export, Endpoint, NbdConn, CMD_FLUSH};
    let daemon = Daemon::start_with_args("0", &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&daemon);
    daemon.malloc("d0", 8192, 512);
    let sock = daemon.dir.path().join("d0.nbd");
    let device = start_export(&daemon, "d0", sock.to_str().unwrap(), false);
    let mut c = NbdConn::connect(&Endpoint::Unix(sock.clone()), "d0").expect("connect");
    for i in 0..3 {
        assert_eq!(c.write(i * 4096, &[7; 4096], 0).unwrap(), 0, "write {i}");
    }
    for i in 0..5 {
        c.read(i * 4096, 4096).unwrap().unwrap_or_else(|e| panic!("read {i}: error {e}"));
    }
    assert_eq!(c.command(CMD_FLUSH, 0, 0, 0).unwrap(), 0);
    // Past the end of the 4 MiB disk: answered with an error, counted as a read and an error.
    assert!(c.read(8192 * 512, 4096).unwrap().is_err());

    let want = json!({
        "read_ops": 6, "write_ops": 3, "flush_ops": 1, "trim_ops": 0, "write_zeroes_ops": 0,
        "cache_ops": 0, "block_status_ops": 0, "bytes_read": 5 * 4096, "bytes_written": 3 * 4096,
        "errors": 1,
    });
    // A connection publishes its counts at the end of the reactor round that sent the replies:
    // the client may read the last reply a moment before.
    let stats = || daemon.call("nbd_get_disks", json!({"nbd_device": device}))[0]["stats"].clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats() != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stats(), want);

    let (status, text) = get_tcp(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let labels = format!("nbd_device=\"{device}\",bdev=\"d0\"");
    for (series, value) in [
        (format!("flashpath_nbd_requests_total{{{labels},command=\"read\"}}"), 6.0),
        (format!("flashpath_nbd_requests_total{{{labels},command=\"write\"}}"), 3.0),
        (format!("flashpath_nbd_requests_total{{{labels},command=\"flush\"}}"), 1.0),
        (format!("flashpath_nbd_requests_total{{{labels},command=\"trim\"}}"), 0.0),
        (format!("flashpath_nbd_bytes_total{{{labels},direction=\"read\"}}"), (5 * 4096) as f64),
        (format!("flashpath_nbd_bytes_total{{{labels},direction=\"write\"}}"), (3 * 4096) as f64),
        (format!("flashpath_nbd_errors_total{{{labels}}}"), 1.0),
        (format!("flashpath_nbd_connections{{{labels}}}"), 1.0),
    ] {
        assert_eq!(sample(&text, &series), Some(value), "{series}:\n{text}");
    }
    if let Some(promtool) = tool("promtool") {
        assert_promtool_accepts(&promtool, &text);
    }

    // The counts outlive the connection: a closed connection's join the export's total.
    c.disconnect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.call("nbd_get_disks", json!({"nbd_device": device}))[0]["connections"] != json!(0) {
        assert!(Instant::now() < deadline, "the connection did not close");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stats(), want);
}

/// An NVMe-oF subsystem from the configuration file: its namespace's series (by subsystem,
/// nsid and operation) and its connected controllers and queue pairs, all zero with no host
/// connected, in an exposition promtool accepts. (Counting a host's commands is the engine's
/// test; the scrape reads the same `nvmf_get_stats` the RPC answers.)
#[test]
fn an_nvmf_subsystem_has_its_series_from_the_start() {
    const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
    let port = free_port();
    let daemon = Daemon::start_with_config("0", |_| {
        format!(
            "metrics = \"127.0.0.1:0\"\n\
             [[bdev]]\ntype = \"malloc\"\nname = \"m0\"\nnum_blocks = 2048\nblock_size = 512\n\
             [[nvmf_transport]]\ntrtype = \"TCP\"\n\
             [[nvmf_subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
             [[nvmf_listener]]\nnqn = \"{NQN}\"\n\
             listen_address = {{ trtype = \"TCP\", adrfam = \"IPv4\", traddr = \"127.0.0.1\", trsvcid = \"{port}\" }}\n\
             [[nvmf_ns]]\nnqn = \"{NQN}\"\nnamespace = {{ bdev_name = \"m0\", nsid = 2 }}\n"
        )
    });
    let addr = metrics_addr(&daemon);
    let (status, text) = get_tcp(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let ns = format!("nqn=\"{NQN}\",nsid=\"2\"");
    for series in [
        format!("flashpath_nvmf_requests_total{{{ns},op=\"read\"}}"),
        format!("flashpath_nvmf_requests_total{{{ns},op=\"write\"}}"),
        format!("flashpath_nvmf_requests_total{{{ns},op=\"other\"}}"),
        format!("flashpath_nvmf_bytes_total{{{ns},direction=\"read\"}}"),
        format!("flashpath_nvmf_bytes_total{{{ns},direction=\"write\"}}"),
        format!("flashpath_nvmf_errors_total{{{ns}}}"),
        format!("flashpath_nvmf_controllers{{nqn=\"{NQN}\"}}"),
        format!("flashpath_nvmf_qpairs{{nqn=\"{NQN}\"}}"),
    ] {
        assert_eq!(sample(&text, &series), Some(0.0), "{series}:\n{text}");
    }
    assert!(text.contains("# TYPE flashpath_nvmf_requests_total counter"), "{text}");
    assert!(text.contains("# TYPE flashpath_nvmf_qpairs gauge"), "{text}");
    if let Some(promtool) = tool("promtool") {
        assert_promtool_accepts(&promtool, &text);
    }
    // The listener from the file listens.
    TcpStream::connect(("127.0.0.1", port)).expect("the configured listener accepts connections");
}

/// A host's commands through an NVMe/TCP connection (tests/common/nvme_tcp.rs) are counted per
/// namespace exactly, in `nvmf_get_stats` and in the exposition, and its controller and queue
/// pairs show in `nvmf_subsystem_get_controllers`/`_get_qpairs` and the gauges while it is
/// connected.
#[test]
fn an_nvmf_namespace_counts_a_hosts_commands() {
    use common::nvme_tcp::Host;
    const NQN: &str = "nqn.2016-06.io.spdk:cnode9";
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:2b2b2b2b-2b2b-2b2b-2b2b-2b2b2b2b2b2b";
    let daemon = Daemon::start_with_args("0", &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&daemon);
    daemon.malloc("d0", 8192, 512);
    let port = free_port();
    daemon.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    daemon.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": true}));
    daemon.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "d0"}}));
    let listen =
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    daemon.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": listen}));

    let target = format!("127.0.0.1:{port}");
    let mut host = bounded(Duration::from_secs(30), "connecting", move || {
        Host::connect(&target, NQN, HOSTNQN).expect("connect")
    });
    for i in 0..3u64 {
        let c = host.io.write(1, i * 8, 512, &[i as u8 + 1; 4096]).unwrap();
        assert_eq!(c.status, 0, "write {i}");
    }
    for i in 0..5u64 {
        let (c, data) = host.io.read(1, (i % 3) * 8, 512, 8).unwrap();
        assert_eq!(c.status, 0, "read {i}");
        assert_eq!(data, vec![(i % 3) as u8 + 1; 4096], "read {i} got other data");
    }
    let controllers = daemon.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN}));
    assert_eq!(controllers.as_array().map(Vec::len), Some(1), "{controllers}");
    assert_eq!(
        (controllers[0]["cntlid"].as_u64(), controllers[0]["hostnqn"].as_str()),
        (Some(host.cntlid.into()), Some(HOSTNQN))
    );
    assert_eq!(controllers[0]["num_io_qpairs"], 1, "{controllers}");
    let qpairs = daemon.call("nvmf_subsystem_get_qpairs", json!({"nqn": NQN}));
    let qids: Vec<u64> = qpairs.as_array().unwrap().iter().map(|q| q["qid"].as_u64().unwrap()).collect();
    assert_eq!(qids, [0, 1], "{qpairs}");
    assert_eq!(qpairs[1]["listen_address"]["trsvcid"], port.to_string(), "{qpairs}");

    let groups = daemon.call("nvmf_get_stats", json!({}))["poll_groups"].clone();
    assert_eq!(groups[0]["name"], qpairs[1]["thread"], "{groups} {qpairs}");
    assert_eq!(
        (groups[0]["current_admin_qpairs"].as_u64(), groups[0]["current_io_qpairs"].as_u64()),
        (Some(1), Some(1))
    );
    let ns = || daemon.call("nvmf_get_stats", json!({}))["subsystems"][0]["namespaces"][0].clone();
    let want = json!({"nsid": 1, "bdev_name": "d0", "read_ops": 5, "write_ops": 3, "bytes_read": 5 * 4096,
                      "bytes_written": 3 * 4096, "other_ops": 0, "errors": 0});
    // The queue pair publishes its counts at the end of the reactor round that answered.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ns() != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ns(), want);

    let (status, text) = get_tcp(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let labels = format!("nqn=\"{NQN}\",nsid=\"1\"");
    for (series, value) in [
        (format!("flashpath_nvmf_requests_total{{{labels},op=\"read\"}}"), 5.0),
        (format!("flashpath_nvmf_requests_total{{{labels},op=\"write\"}}"), 3.0),
        (format!("flashpath_nvmf_bytes_total{{{labels},direction=\"read\"}}"), (5 * 4096) as f64),
        (format!("flashpath_nvmf_bytes_total{{{labels},direction=\"write\"}}"), (3 * 4096) as f64),
        (format!("flashpath_nvmf_errors_total{{{labels}}}"), 0.0),
        (format!("flashpath_nvmf_controllers{{nqn=\"{NQN}\"}}"), 1.0),
        (format!("flashpath_nvmf_qpairs{{nqn=\"{NQN}\"}}"), 2.0),
    ] {
        assert_eq!(sample(&text, &series), Some(value), "{series}:\n{text}");
    }

    // The host goes away: its controller with it; the counts stay with the namespace.
    drop(host);
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN})) != json!([]) {
        assert!(Instant::now() < deadline, "the controller outlived its connections");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ns(), want);
}

/// An NVMe controller (the daemon's own NVMe/TCP subsystem attached back) has its series:
/// up while enabled, its resets, and its I/O queues' commands and sends, as
/// `bdev_nvme_get_controllers` reports them.
#[test]
fn an_nvme_controller_counts_its_commands_and_resets() {
    const NQN: &str = "nqn.2016-06.io.spdk:metrics";
    let daemon = Daemon::start_with_args("0", &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&daemon);
    daemon.malloc("m0", 8192, 512);
    daemon.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    daemon.call("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": true}));
    daemon.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "m0"}}));
    let port = free_port().to_string();
    let listen = json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port});
    daemon.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": listen}));
    let attach =
        json!({"name": "Nvme0", "trtype": "TCP", "traddr": "127.0.0.1", "trsvcid": port, "subnqn": NQN});
    assert_eq!(daemon.call("bdev_nvme_attach_controller", attach), json!(["Nvme0n1"]));
    let sock = daemon.controller("c0", "Nvme0n1", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    for i in 0..8 {
        assert_eq!(c.write(0, i * 4096, &[i as u8; 4096]), 0, "write {i}");
    }
    assert_eq!(daemon.call("bdev_nvme_reset_controller", json!({"name": "Nvme0"})), true);
    assert_eq!(c.read(0, 0, 4096).unwrap(), [0u8; 4096]);

    let (status, text) = get_tcp(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let labels = format!("{{controller=\"Nvme0\",trtype=\"TCP\",traddr=\"127.0.0.1\",trsvcid=\"{port}\"}}");
    let at = |family: &str| {
        sample(&text, &format!("{family}{labels}")).unwrap_or_else(|| panic!("{family} missing:\n{text}"))
    };
    let path = &daemon.call("bdev_nvme_get_controllers", json!({"name": "Nvme0"}))[0]["ctrlrs"][0];
    assert_eq!(at("flashpath_nvme_controller_up"), 1.0);
    assert!(at("flashpath_nvme_resets_total") >= 1.0, "{text}");
    assert_eq!(at("flashpath_nvme_resets_total"), path["resets"].as_f64().unwrap());
    let submitted = at("flashpath_nvme_commands_submitted_total");
    assert!(submitted >= 9.0 && submitted == path["stats"]["submitted"].as_f64().unwrap(), "{text}\n{path}");
    assert!(at("flashpath_nvme_doorbells_total") >= 1.0, "{text}");
    assert_eq!(at("flashpath_nvme_bounced_total"), path["stats"]["bounced"].as_f64().unwrap());
}

/// A raid1 with one replica taken out and put back: the exposition follows
/// `bdev_raid_get_bdevs` (degraded, then in sync with a rebuild counted), and promtool accepts
/// the raid families.
#[test]
fn a_raid1_shows_its_replicas_and_rebuild() {
    let daemon = Daemon::start_with_args("0", &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&daemon);
    daemon.malloc("m0", 4096, 4096);
    daemon.malloc("m1", 4096, 4096);
    let create = json!({"name": "r1", "raid_level": "raid1", "base_bdevs": ["m0", "m1"], "superblock": true});
    assert_eq!(daemon.call("bdev_raid_create", create), true);
    let sock = daemon.controller("c0", "r1", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    assert_eq!(c.write(0, 0, &[7; 4096]), 0);
    let raid = "{raid=\"r1\",level=\"raid1\"}";
    let scrape = || {
        let (status, text) = get_tcp(&addr, "/metrics");
        assert_eq!(status, 200, "{text}");
        text
    };
    let at = |text: &str, series: &str| {
        sample(text, series).unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    let text = scrape();
    assert_eq!(at(&text, &format!("flashpath_raid_online{raid}")), 1.0);
    assert_eq!(at(&text, &format!("flashpath_raid_base_bdevs{raid}")), 2.0);
    assert_eq!(at(&text, &format!("flashpath_raid_base_bdevs_operational{raid}")), 2.0);
    let slot1 = |state: &str| {
        format!("flashpath_raid_slot_state{{raid=\"r1\",slot=\"1\",base=\"m1\",state=\"{state}\"}}")
    };
    assert_eq!(at(&text, &slot1("active")), 1.0);

    daemon.call("bdev_raid_remove_base_bdev", json!({"name": "m1"}));
    assert_eq!(c.write(0, 4096, &[8; 4096]), 0);
    let text = scrape();
    assert_eq!(at(&text, &format!("flashpath_raid_base_bdevs_operational{raid}")), 1.0);
    assert!(at(&text, &format!("flashpath_raid_degraded_bytes_written_total{raid}")) >= 4096.0, "{text}");

    daemon.call("bdev_raid_add_base_bdev", json!({"raid_bdev": "r1", "base_bdev": "m1"}));
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape();
        if sample(&text, &format!("flashpath_raid_rebuilds_completed_total{raid}")) == Some(1.0)
            && sample(&text, &slot1("active")) == Some(1.0)
        {
            break text;
        }
        assert!(Instant::now() < deadline, "no completed rebuild:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(at(&text, &format!("flashpath_raid_rebuild_bytes_copied_total{raid}")) >= 4096.0, "{text}");
    assert!(at(&text, &format!("flashpath_raid_superblock_writes_total{raid}")) >= 1.0, "{text}");
    if let Some(promtool) = tool("promtool") {
        assert_promtool_accepts(&promtool, &text);
    }
}
