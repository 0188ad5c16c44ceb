//! `serve --metrics ADDR`: the Prometheus endpoint.
//!
//! Every scrape of `/metrics` calls the same JSON-RPC methods the CLI and `rpc.py` call
//! (through a [`Source`], which `serve` points at `Methods::call`), and turns their results into
//! metric families that the `prometheus` crate's encoder writes in the text exposition format
//! (0.0.4, which `promtool check metrics` lints; `prometheus-client` only writes OpenMetrics,
//! whose counter names that linter rejects). Nothing is sampled in between, so the endpoint
//! and the RPCs cannot disagree, and a daemon without the endpoint pays nothing.
//!
//! The endpoint listens on loopback or a Unix socket only: the numbers are for a collector on
//! the same host, and an open port would be one more thing to firewall.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use fp_registry::metrics::{array, str_at, u64_at, Family, Labels, MetricKind};
use fp_registry::modules::MODULES;
use fp_registry::EXPORT_KINDS;
use prometheus::proto::{self, MetricFamily};
use prometheus::Encoder;
use serde_json::Value;

/// A JSON-RPC method's result for a method name and its parameters; `None` when the method is
/// missing (an older daemon part) or failed: the families it feeds are left out of that scrape.
pub type Source = Arc<dyn Fn(&str, Option<Value>) -> Option<Value> + Send + Sync>;

/// Where the endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsAddr::Tcp(a) => write!(f, "http://{a}/metrics"),
            MetricsAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// `setting` is where the address came from: the flag or the config key.
    #[error("{setting}: '{value}': {reason}")]
    Addr { setting: &'static str, value: String, reason: String },
    #[error("{setting}: cannot listen on {addr}: {reason}")]
    Listen { setting: &'static str, addr: MetricsAddr, reason: String },
}

/// Parses `host:port` (which must resolve to loopback addresses only) or `unix:PATH`, given as
/// `setting` (named in the error).
pub fn parse_addr(value: &str, setting: &'static str) -> Result<MetricsAddr, MetricsError> {
    let bad =
        |reason: &str| MetricsError::Addr { setting, value: value.to_string(), reason: reason.to_string() };
    if let Some(path) = value.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(bad("unix: needs a socket path, e.g. unix:/run/flashpath-metrics.sock"));
        }
        return Ok(MetricsAddr::Unix(path.into()));
    }
    let addrs: Vec<SocketAddr> = value
        .to_socket_addrs()
        .map_err(|_| bad("not a host:port or unix:PATH (e.g. 127.0.0.1:9111)"))?
        .collect();
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        Some(a) => Err(bad(&format!(
            "{} is not a loopback address; metrics are served on 127.0.0.1, [::1] or a unix: socket only",
            a.ip()
        ))),
        None => addrs.first().copied().map(MetricsAddr::Tcp).ok_or_else(|| bad("resolves to no address")),
    }
}

/// The running endpoint: one thread answering requests until [`MetricsServer::stop`].
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: MetricsAddr,
}

impl MetricsServer {
    /// Binds `addr` (given as `setting`, named in errors) and starts answering; a bound address
    /// (a port or socket in use) fails here.
    pub fn start(
        addr: &MetricsAddr,
        setting: &'static str,
        source: Source,
    ) -> Result<MetricsServer, MetricsError> {
        let listen_err = |e: &dyn fmt::Display| MetricsError::Listen {
            setting,
            addr: addr.clone(),
            reason: e.to_string(),
        };
        let server = match addr {
            MetricsAddr::Tcp(a) => tiny_http::Server::http(a),
            MetricsAddr::Unix(p) => {
                remove_stale_socket(p);
                tiny_http::Server::http_unix(p)
            }
        }
        .map_err(|e| listen_err(&e))?;
        // An ephemeral port (":0") is reported as the one the kernel picked.
        let addr = match server.server_addr() {
            tiny_http::ListenAddr::IP(a) => MetricsAddr::Tcp(a),
            tiny_http::ListenAddr::Unix(_) => addr.clone(),
        };
        let server = Arc::new(server);
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve(&s, &source))
            .map_err(|e| listen_err(&e))?;
        Ok(MetricsServer { server, thread: Some(thread), addr })
    }

    /// Where it listens (with the actual port when `:0` was asked for).
    pub fn addr(&self) -> &MetricsAddr {
        &self.addr
    }

    /// Stops answering and removes the Unix socket.
    pub fn stop(mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let MetricsAddr::Unix(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Removes a socket file nobody listens on any more (left by a daemon that was killed), so a
/// restart can bind it; a live socket, or a file of another kind, stays and fails the bind.
fn remove_stale_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if is_socket
        && std::os::unix::net::UnixStream::connect(path)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
    {
        log::info!("metrics: removing the stale socket {}", path.display());
        let _ = std::fs::remove_file(path);
    }
}

fn serve(server: &tiny_http::Server, source: &Source) {
    let content_type = tiny_http::Header::from_bytes("Content-Type", prometheus::TEXT_FORMAT)
        .expect("the exposition format's content type is a valid header");
    // `unblock` ends the iterator.
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or_default();
        let response = if path == "/metrics" {
            match render(source) {
                Ok(text) => tiny_http::Response::from_string(text).with_header(content_type.clone()),
                Err(e) => {
                    tiny_http::Response::from_string(format!("encoding failed: {e}\n")).with_status_code(500)
                }
            }
        } else {
            tiny_http::Response::from_string("flashpath: metrics are at /metrics\n").with_status_code(404)
        };
        if let Err(e) = request.respond(response) {
            log::debug!("metrics: answering a scrape failed: {e}");
        }
    }
}

/// One scrape's text: what `/metrics` answers.
pub fn render(source: &Source) -> Result<String, prometheus::Error> {
    let mut text = Vec::new();
    prometheus::TextEncoder::new().encode(&collect(source), &mut text)?;
    Ok(String::from_utf8(text).expect("the text encoder writes UTF-8"))
}

/// `f` for the encoder; `None` when it has no samples (the encoder refuses those).
fn encode(f: Family) -> Option<MetricFamily> {
    if f.samples.is_empty() {
        return None;
    }
    let mut out = MetricFamily::default();
    out.set_name(f.name.to_string());
    out.set_help(f.help.to_string());
    out.set_field_type(match f.kind {
        MetricKind::Counter => proto::MetricType::COUNTER,
        MetricKind::Gauge => proto::MetricType::GAUGE,
    });
    out.set_metric(
        f.samples
            .into_iter()
            .map(|(labels, value)| {
                let mut m = proto::Metric::from_label(label_pairs(labels));
                match f.kind {
                    MetricKind::Counter => {
                        let mut c = proto::Counter::default();
                        c.set_value(value);
                        m.set_counter(c);
                    }
                    MetricKind::Gauge => {
                        let mut g = proto::Gauge::default();
                        g.set_value(value);
                        m.set_gauge(g);
                    }
                }
                m
            })
            .collect(),
    );
    Some(out)
}

fn label_pairs(labels: Labels) -> Vec<proto::LabelPair> {
    labels
        .into_iter()
        .map(|(name, value)| {
            let mut l = proto::LabelPair::default();
            l.set_name(name.to_string());
            l.set_value(value);
            l
        })
        .collect()
}

/// All of a disk's errors in one `bdev_get_iostat` entry: `io_error` is keyed by errno name.
pub fn io_error_total(bdev: &Value) -> u64 {
    bdev.get("io_error").and_then(Value::as_object).map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
}

/// A `bdev_get_iostat` result's ticks per second, in which its latencies and QoS times are
/// counted; nanoseconds when the result lacks one.
pub fn tick_rate(io: &Value) -> f64 {
    io.get("tick_rate").and_then(Value::as_u64).filter(|&t| t > 0).unwrap_or(1_000_000_000) as f64
}

const NS_PER_S: f64 = 1e9;

/// Every family, from one call of each method.
fn collect(source: &Source) -> Vec<MetricFamily> {
    let mut families = Vec::new();
    if let Some(v) = source("spdk_get_version", None) {
        let mut info = Family::gauge("flashpath_build_info", "The daemon's version; the value is always 1");
        info.push(vec![("version", str_at(&v, "version"))], 1u64);
        families.push(info);
    }
    if let Some(s) = source("flashpath_get_stats", None) {
        let mut up = Family::gauge("flashpath_uptime_seconds", "Seconds since the daemon started");
        up.push(Labels::new(), u64_at(&s, "uptime_ns") as f64 / NS_PER_S);
        families.push(up);
    }
    if let Some(r) = source("framework_get_reactors", None) {
        families.extend(reactors(&r));
    }
    // Each bdev module's and export kind's, read through the same methods.
    let call = |method: &str, params: Option<Value>| source(method, params);
    for module in MODULES {
        families.extend(module.metrics(&call));
    }
    for kind in EXPORT_KINDS {
        families.extend(kind.metrics(&call));
    }
    let mut histograms = Vec::new();
    if let Some(io) = source("bdev_get_iostat", None) {
        families.extend(bdevs(&io));
        // Disks whose histogram is off refuse `bdev_get_histogram` and are left out.
        for b in array(&io["bdevs"]) {
            let name = str_at(b, "name");
            if let Some(h) = source("bdev_get_histogram", Some(serde_json::json!({ "name": name }))) {
                histograms.extend(latency_histogram(&name, &h));
            }
        }
    }
    let mut out: Vec<MetricFamily> = families.into_iter().filter_map(encode).collect();
    if !histograms.is_empty() {
        let mut f = MetricFamily::default();
        f.set_name("flashpath_bdev_io_latency_seconds".to_string());
        f.set_help("Latency of a disk's I/Os (bdev_enable_histogram turns a disk's on)".to_string());
        f.set_field_type(proto::MetricType::HISTOGRAM);
        f.set_metric(histograms);
        out.push(f);
    }
    out
}

/// The bucket bounds Prometheus gets, in seconds: 1-2-5 steps from 1 µs to 10 s. The disk
/// layer's log-linear buckets (7424 of them) are far too many series to store.
const LATENCY_BOUNDS_S: [f64; 22] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5,
    1.0, 2.0, 5.0, 10.0,
];

/// One disk's `bdev_get_histogram` result as a Prometheus histogram. A disk-layer bucket counts
/// under the first bound its whole range fits below, so a cumulative count never includes an
/// I/O slower than its bound. The sum takes each bucket at its midpoint: the buckets are at
/// most 1/128 of their value wide, so it is that close to the true sum.
fn latency_histogram(name: &str, h: &Value) -> Option<proto::Metric> {
    let hist = fp_registry::metrics::Histogram::from_base64(h.get("histogram")?.as_str()?)?;
    let rate = h.get("tsc_rate").and_then(Value::as_u64).filter(|&r| r > 0)? as f64;
    let mut cumulative = [0u64; LATENCY_BOUNDS_S.len()];
    let (mut count, mut sum_ticks) = (0u64, 0f64);
    let mut start = 0u64;
    for (i, &n) in hist.buckets.iter().enumerate() {
        let end = fp_registry::metrics::bucket_end(i);
        if n > 0 {
            count += n;
            sum_ticks += n as f64 * (start as f64 + end as f64) / 2.0;
            // The bucket holds values below `end`.
            let last_s = end.saturating_sub(1) as f64 / rate;
            if let Some(first) = LATENCY_BOUNDS_S.iter().position(|&b| last_s <= b) {
                for c in &mut cumulative[first..] {
                    *c += n;
                }
            }
        }
        start = end;
    }
    let mut ph = proto::Histogram::default();
    ph.set_sample_count(count);
    ph.set_sample_sum(sum_ticks / rate);
    ph.set_bucket(
        LATENCY_BOUNDS_S
            .iter()
            .zip(cumulative)
            .map(|(&bound, n)| {
                let mut b = proto::Bucket::default();
                b.set_upper_bound(bound);
                b.set_cumulative_count(n);
                b
            })
            .collect(),
    );
    let mut m = proto::Metric::from_label(label_pairs(vec![("bdev", name.to_string())]));
    m.set_histogram(ph);
    Some(m)
}

/// `framework_get_reactors`: where each reactor's time went.
fn reactors(r: &Value) -> [Family; 4] {
    let mut busy = Family::counter("flashpath_reactor_busy_seconds_total", "Time a reactor spent doing work");
    let mut idle = Family::counter(
        "flashpath_reactor_idle_seconds_total",
        "Time a reactor spent polling and finding nothing",
    );
    let mut sleep =
        Family::counter("flashpath_reactor_sleep_seconds_total", "Time a reactor spent asleep in epoll");
    let mut sleeps = Family::counter("flashpath_reactor_sleeps_total", "Times a reactor went to sleep");
    for x in array(&r["reactors"]) {
        let labels = vec![("lcore", u64_at(x, "lcore").to_string())];
        busy.push(labels.clone(), u64_at(x, "busy") as f64 / NS_PER_S);
        idle.push(labels.clone(), u64_at(x, "poll_idle_ns") as f64 / NS_PER_S);
        sleep.push(labels.clone(), u64_at(x, "sleep_ns") as f64 / NS_PER_S);
        sleeps.push(labels, u64_at(x, "sleeps"));
    }
    [busy, idle, sleep, sleeps]
}

/// `bdev_get_iostat` (SPDK's shape): the generic bdev layer's per-disk counters, and what the
/// disk's QoS limits held back.
fn bdevs(io: &Value) -> [Family; 9] {
    let tick_rate = tick_rate(io);
    let seconds = |b: &Value, key: &str| u64_at(b, key) as f64 / tick_rate;
    let mut ops = Family::counter("flashpath_bdev_ops_total", "I/Os a disk completed, by type");
    let mut bytes = Family::counter("flashpath_bdev_bytes_total", "Bytes a disk read, wrote or unmapped");
    let mut latency = Family::counter(
        "flashpath_bdev_latency_seconds_total",
        "Summed latency of a disk's I/Os, by type (divide by flashpath_bdev_ops_total for the mean)",
    );
    let mut errors = Family::counter(
        "flashpath_bdev_io_errors_total",
        "I/Os a disk completed with an error, by errno name (EIO, unsupported, ...)",
    );
    let mut depth = Family::gauge("flashpath_bdev_queue_depth", "I/Os submitted to a disk and not completed");
    let mut qos_queued = Family::gauge(
        "flashpath_bdev_qos_queued",
        "I/Os waiting for a disk's QoS limit now (counted in flashpath_bdev_queue_depth too)",
    );
    let mut qos_queued_total =
        Family::counter("flashpath_bdev_qos_queued_total", "I/Os that had to wait for a disk's QoS limit");
    let mut qos_wait = Family::counter(
        "flashpath_bdev_qos_wait_seconds_total",
        "Summed time I/Os waited for a disk's QoS limit (divide by flashpath_bdev_qos_queued_total for the mean)",
    );
    let mut qos_throttled = Family::counter(
        "flashpath_bdev_qos_throttled_seconds_total",
        "Time a disk's channels held an I/O back for its QoS limit, summed over channels",
    );
    for b in array(&io["bdevs"]) {
        let name = str_at(b, "name");
        let with = |op: &str| vec![("bdev", name.clone()), ("type", op.to_string())];
        for (op, moved) in [
            ("read", Some("read")),
            ("write", Some("written")),
            ("unmap", Some("unmapped")),
            ("flush", None),
            ("write_zeroes", Some("zeroed")),
        ] {
            ops.push(with(op), u64_at(b, &format!("num_{op}_ops")));
            if let Some(moved) = moved {
                bytes.push(with(op), u64_at(b, &format!("bytes_{moved}")));
            }
            latency.push(with(op), seconds(b, &format!("{op}_latency_ticks")));
        }
        // EIO always has a series, so a rate over it exists before the first error.
        let by_errno = b.get("io_error").and_then(Value::as_object);
        if !by_errno.is_some_and(|m| m.contains_key("EIO")) {
            errors.push(vec![("bdev", name.clone()), ("errno", "EIO".to_string())], 0u64);
        }
        for (errno, n) in by_errno.into_iter().flatten() {
            errors.push(vec![("bdev", name.clone()), ("errno", errno.clone())], n.as_u64().unwrap_or(0));
        }
        let disk = vec![("bdev", name)];
        depth.push(disk.clone(), u64_at(b, "queue_depth"));
        qos_queued.push(disk.clone(), u64_at(b, "qos_queued"));
        qos_queued_total.push(disk.clone(), u64_at(b, "qos_queued_total"));
        qos_wait.push(disk.clone(), seconds(b, "qos_wait_ticks"));
        qos_throttled.push(disk, seconds(b, "qos_throttled_ticks"));
    }
    [ops, bytes, latency, errors, depth, qos_queued, qos_queued_total, qos_wait, qos_throttled]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn addresses_are_loopback_or_unix() {
        assert_eq!(
            parse_addr("127.0.0.1:9111", "--metrics").unwrap(),
            MetricsAddr::Tcp("127.0.0.1:9111".parse().unwrap())
        );
        assert_eq!(parse_addr("[::1]:0", "--metrics").unwrap(), MetricsAddr::Tcp("[::1]:0".parse().unwrap()));
        assert_eq!(
            parse_addr("unix:/run/m.sock", "metrics").unwrap(),
            MetricsAddr::Unix("/run/m.sock".into())
        );
        let e = parse_addr("10.0.0.1:9111", "--metrics").unwrap_err().to_string();
        assert!(e.starts_with("--metrics: '10.0.0.1:9111': 10.0.0.1 is not a loopback address"), "{e}");
        assert!(parse_addr("9111", "metrics").unwrap_err().to_string().contains("not a host:port"));
    }

    /// A raid1 mid-rebuild: one series per slot and state, the progress as a ratio, the
    /// counters of its `flashpath` object.
    #[test]
    fn raids_become_per_raid_families() {
        let source: Source = Arc::new(|method, params| match method {
            "bdev_raid_get_bdevs" => {
                assert_eq!(params, Some(json!({"category": "all"})));
                Some(json!([{
                    "name": "r1", "raid_level": "raid1", "state": "online", "num_base_bdevs": 2,
                    "num_base_bdevs_operational": 1,
                    "process": {"type": "rebuild", "target": "b", "progress": {"blocks": 5, "percent": 25.0}},
                    "base_bdevs_list": [{"name": "a"}, {"name": "b"}],
                    "flashpath": {
                        "slots": ["active", "rebuilding"],
                        "rebuild_bytes_copied": 65536, "degraded_bytes_written": 4096, "base_failures": 1,
                    },
                }, {"name": "r0", "raid_level": "raid0", "state": "configuring", "num_base_bdevs": 2}]))
            }
            _ => None,
        });
        let text = render(&source).unwrap();
        for line in [
            "flashpath_raid_online{raid=\"r1\",level=\"raid1\"} 1\n",
            "flashpath_raid_online{raid=\"r0\",level=\"raid0\"} 0\n",
            "flashpath_raid_base_bdevs_operational{raid=\"r1\",level=\"raid1\"} 1\n",
            "flashpath_raid_slot_state{raid=\"r1\",slot=\"1\",base=\"b\",state=\"rebuilding\"} 1\n",
            "flashpath_raid_slot_state{raid=\"r1\",slot=\"1\",base=\"b\",state=\"active\"} 0\n",
            "flashpath_raid_process_progress_ratio{raid=\"r1\",type=\"rebuild\",target=\"b\"} 0.25\n",
            "flashpath_raid_rebuild_bytes_copied_total{raid=\"r1\",level=\"raid1\"} 65536\n",
            "flashpath_raid_degraded_bytes_written_total{raid=\"r1\",level=\"raid1\"} 4096\n",
            "flashpath_raid_base_failures_total{raid=\"r1\",level=\"raid1\"} 1\n",
            "flashpath_raid_rebuilds_completed_total{raid=\"r0\",level=\"raid0\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("progress_ratio{raid=\"r0\""), "{text}");
    }

    /// The per-disk families follow `bdev_get_iostat`'s SPDK shape, latency and QoS ticks
    /// converted to seconds at the reported tick rate.
    #[test]
    fn iostat_becomes_per_disk_families() {
        let source: Source = Arc::new(|method, _| match method {
            "bdev_get_iostat" => Some(json!({
                "tick_rate": 1_000_000u64,
                "ticks": 5,
                "bdevs": [{
                    "name": "d0", "bytes_read": 8192, "num_read_ops": 2, "bytes_written": 512,
                    "num_write_ops": 1, "bytes_unmapped": 0, "num_unmap_ops": 0,
                    "read_latency_ticks": 1500, "write_latency_ticks": 250000,
                    "unmap_latency_ticks": 0, "io_error": {"ENOSPC": 3}, "queue_depth": 7,
                    "qos_queued": 5, "qos_queued_total": 1200, "qos_wait_ticks": 3_500_000,
                    "qos_throttled_ticks": 750_000,
                }],
            })),
            _ => None,
        });
        let text = render(&source).unwrap();
        for line in [
            "flashpath_bdev_ops_total{bdev=\"d0\",type=\"read\"} 2\n",
            "flashpath_bdev_bytes_total{bdev=\"d0\",type=\"write\"} 512\n",
            "flashpath_bdev_latency_seconds_total{bdev=\"d0\",type=\"read\"} 0.0015\n",
            "flashpath_bdev_latency_seconds_total{bdev=\"d0\",type=\"write\"} 0.25\n",
            "flashpath_bdev_io_errors_total{bdev=\"d0\",errno=\"EIO\"} 0\n",
            "flashpath_bdev_io_errors_total{bdev=\"d0\",errno=\"ENOSPC\"} 3\n",
            "flashpath_bdev_queue_depth{bdev=\"d0\"} 7\n",
            "flashpath_bdev_qos_queued{bdev=\"d0\"} 5\n",
            "flashpath_bdev_qos_queued_total{bdev=\"d0\"} 1200\n",
            "flashpath_bdev_qos_wait_seconds_total{bdev=\"d0\"} 3.5\n",
            "flashpath_bdev_qos_throttled_seconds_total{bdev=\"d0\"} 0.75\n",
            "# TYPE flashpath_bdev_qos_queued gauge\n",
            "# TYPE flashpath_bdev_qos_queued_total counter\n",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        // Methods that fail leave their families out rather than failing the scrape.
        assert!(!text.contains("flashpath_reactor"), "{text}");
    }

    /// `vhost_get_controllers`' per-queue counters become a per-queue in-flight gauge.
    #[test]
    fn each_started_queue_has_its_in_flight_gauge() {
        let source: Source = Arc::new(|method, _| match method {
            "vhost_get_controllers" => Some(json!([{
                "ctrlr": "c0", "backend_specific": {"block": {"bdev": "d0"}}, "connected": true,
                "stats": {"in_flight": 5},
                "queues": [{"id": 0, "in_flight": 2}, {"id": 3, "in_flight": 3}],
            }])),
            _ => None,
        });
        let text = render(&source).unwrap();
        for line in [
            "flashpath_vhost_queue_in_flight{ctrlr=\"c0\",bdev=\"d0\",queue=\"0\"} 2\n",
            "flashpath_vhost_queue_in_flight{ctrlr=\"c0\",bdev=\"d0\",queue=\"3\"} 3\n",
            "flashpath_vhost_in_flight{ctrlr=\"c0\",bdev=\"d0\"} 5\n",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    /// Disk-layer buckets land under the first Prometheus bound their whole range fits below;
    /// the sum takes bucket midpoints.
    #[test]
    fn disk_histograms_become_prometheus_histograms() {
        let mut h = fp_registry::metrics::Histogram::default();
        // One tick is a microsecond here.
        for ticks in [1, 1, 1, 40, 40, 3000] {
            h.record(ticks);
        }
        let result = json!({ "histogram": h.to_base64(), "tsc_rate": 1_000_000u64 });
        let m = latency_histogram("d0", &result).unwrap();
        let ph = m.get_histogram();
        assert_eq!(ph.get_sample_count(), 6);
        // 1 falls in [1, 2), 40 in [40, 41), 3000 in [2992, 3008).
        assert!((ph.get_sample_sum() - (3.0 * 1.5 + 2.0 * 40.5 + 3000.0) / 1e6).abs() < 1e-12);
        let at = |bound: f64| {
            ph.get_bucket().iter().find(|b| b.upper_bound() == bound).map(|b| b.cumulative_count())
        };
        assert_eq!(at(1e-6), Some(3));
        assert_eq!(at(2e-5), Some(3));
        assert_eq!(at(5e-5), Some(5));
        assert_eq!(at(2e-3), Some(5));
        assert_eq!(at(5e-3), Some(6));
        assert_eq!(at(10.0), Some(6));
        assert!(latency_histogram("d0", &json!({ "histogram": "not base64!", "tsc_rate": 1 })).is_none());
    }
}
