//! `fp-load`: drive a vhost-user-blk socket with a fixed I/O pattern through libblkio (or, with
//! `--packed`, through virtio-driver over packed virtqueues) and print IOPS, bandwidth and
//! completion latency percentiles (human-readable, or one JSON object with `--json`).
//!
//! With `--disk` (repeated) or `--job FILE` it drives several sockets from one process, each
//! disk with its own pattern, block size, depth and queues, and reports each disk and the
//! total (see [`fp_loadgen::parse_disk`] for the keys and [`fp_loadgen::MultiSpec`] for the
//! threads):
//!
//! ```text
//! fp-load --time 10s --cpu 1 --disk socket=/var/tmp/flashpath/vhost.0,qd=128,label=noisy \
//!     --disk socket=/var/tmp/flashpath/vhost.1,qd=1 --disk socket=/var/tmp/flashpath/vhost.2,qd=1
//! ```
//!
//! Global options (`--pattern`, `--bs`, `--qd`, ...) are the defaults of the disks' keys.
//!
//! Exit status: 0 on success, 1 when the run could not be set up or stalled, 2 on bad arguments
//! (clap), 3 when the run finished but some requests completed with an error (with `--verify`,
//! a read that did not return what was written counts as one).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use fp_loadgen::{
    parse_disk, parse_duration, parse_size, DiskArg, LoadResult, LoadSpec, MultiResult, MultiSpec, Pattern,
    Region,
};

/// Drive a vhost-user-blk device through libblkio and report IOPS and latency.
#[derive(Parser, Debug)]
#[command(name = "fp-load", version)]
struct Args {
    /// vhost-user-blk Unix socket to connect to.
    #[arg(long, required_unless_present_any = ["disk", "job"], conflicts_with_all = ["disk", "job"])]
    socket: Option<PathBuf>,
    /// One disk of a multi-disk run, as comma-separated keys: socket=PATH (required),
    /// pattern, bs, qd, queues, ios, rate, offset, size, stride, rwmix-read, seed, read-only,
    /// cpu, label; the global options give the keys' defaults. Repeat for each disk.
    #[arg(long, value_name = "KEY=VALUE,...")]
    disk: Vec<String>,
    /// A job file of disks: one --disk value per line (blank lines and lines starting with #
    /// are skipped), run before the --disk arguments.
    #[arg(long, value_name = "FILE")]
    job: Option<PathBuf>,
    /// Multi-disk runs: one client thread per disk (pinned to the disk's cpu=, else to --cpu)
    /// instead of one for all; implied when a disk names a cpu.
    #[arg(long)]
    thread_per_disk: bool,
    /// randread, randwrite, read, write or randrw.
    #[arg(long, default_value = "randread")]
    pattern: Pattern,
    /// Bytes per request (4096, 4k, 128k, ...).
    #[arg(long = "bs", default_value = "4k", value_parser = parse_size)]
    block_size: u64,
    /// Requests in flight per queue.
    #[arg(long = "qd", visible_alias = "iodepth", default_value_t = 1)]
    queue_depth: usize,
    /// Queues to use.
    #[arg(long = "queues", default_value_t = 1)]
    num_queues: usize,
    /// How long to run (5, 5s, 500ms, 1m).
    #[arg(long = "time", default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// Busy-poll libblkio poll queues instead of sleeping on completion fds.
    #[arg(long)]
    poll: bool,
    /// Use packed virtqueues (VIRTIO_F_RING_PACKED) through virtio-driver instead of split
    /// ones through libblkio; fails if the server does not offer them.
    #[arg(long)]
    packed: bool,
    /// Drive split rings through fp-load's own vhost-user frontend instead of libblkio (the
    /// --dirty-log path with logging off: its baseline; it counts the kicks it sends).
    #[arg(long, conflicts_with_all = ["packed"])]
    frontend: bool,
    /// Dirty logging on, as QEMU runs it while migrating (implies --frontend): VHOST_F_LOG_ALL,
    /// a memfd log sized for fp-load's memory (SET_LOG_BASE), used rings logged, a thread that
    /// scans and clears the log every 100 ms; the JSON output's "dirty_log" says what it saw.
    #[arg(long, conflicts_with_all = ["packed", "disk"])]
    dirty_log: bool,
    /// Put the memory shared with the server in 2 MiB huge pages (an MFD_HUGETLB memfd), as
    /// SPDK's vhost target needs (implies --frontend; chosen anyway when the server offers no
    /// CONFIGURE_MEM_SLOTS). Needs free huge pages (vm.nr_hugepages), at least one per disk.
    #[arg(long, conflicts_with_all = ["packed"])]
    hugetlb: bool,
    /// Print "fp-load: measuring" on stderr when the measured interval starts (every disk
    /// connected and its queues filled) and "fp-load: measured" when it ends, so that a caller
    /// can sample a server over the I/O alone, without the connects around it.
    #[arg(long, conflicts_with = "idle")]
    mark_phases: bool,
    /// Pin the client thread to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Start of the region to use, in bytes.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    offset: u64,
    /// Length of the region to use, in bytes (default: from --offset to the end of the device).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// For read and write: bytes from one request's start to the next (default: --bs), e.g.
    /// a cluster size to touch each cluster once.
    #[arg(long, value_parser = parse_size)]
    stride: Option<u64>,
    /// Stop after this many requests (--time still bounds the run).
    #[arg(long = "ios")]
    max_ios: Option<u64>,
    /// Submit at most this many requests per second (each disk, in a multi-disk run);
    /// latency still runs from submission.
    #[arg(long = "rate", value_name = "IOPS")]
    rate_iops: Option<u64>,
    /// Also count completions per interval of this length (1s, 100ms, ...) from the start:
    /// the JSON output's "timeline" (each disk's and the total), a line in the human one.
    #[arg(long, value_name = "INTERVAL", value_parser = parse_duration)]
    timeline: Option<Duration>,
    /// For randrw: percentage of reads.
    #[arg(long = "rwmix-read", default_value_t = 50)]
    read_percent: u8,
    /// Seed for offsets and write data.
    #[arg(long)]
    seed: Option<u64>,
    /// Open the device read-only (implied by read and randread; needed for a read-only device).
    #[arg(long)]
    read_only: bool,
    /// Write the latency histogram to this file as JSON (non-empty buckets as
    /// [low_ns, high_ns, count]), e.g. to plot a latency CDF.
    #[arg(long, value_name = "FILE")]
    hist_out: Option<PathBuf>,
    /// Also measure the client's own busy time (passes over the queues that completed
    /// something); adds a clock read per pass, so leave it off for latency figures.
    #[arg(long)]
    client_busy: bool,
    /// Connect and start the queues, then hold them idle for --time without any I/O (an
    /// attached, idle disk), and exit.
    #[arg(long, conflicts_with_all = ["brief", "hist_out", "client_busy", "disk", "job", "timeline"])]
    idle: bool,
    /// Check the data: stamp every write (each 512-byte sector with its offset and the write's
    /// sequence number) and compare every read of a block written earlier in the run with its
    /// last completed write; each request slot gets its own blocks, so the region needs
    /// qd x queues blocks. The JSON output gets "verified", "mismatches" and
    /// "first_mismatch"; a mismatch counts as an error (exit status 3). libblkio client only.
    #[arg(long, conflicts_with_all = ["disk", "job", "packed", "frontend", "dirty_log", "hugetlb", "idle"])]
    verify: bool,
    /// A name printed with the results.
    #[arg(long)]
    label: Option<String>,
    /// Print one JSON object instead of the human summary.
    #[arg(long, conflicts_with = "brief")]
    json: bool,
    /// Print one table row (see --brief-header) instead of the human summary.
    #[arg(long)]
    brief: bool,
    /// Print the header line for --brief rows and exit.
    #[arg(long, exclusive = true)]
    brief_header: bool,
}

/// Column layout shared by `--brief-header` and `--brief`.
const BRIEF_HEADER: &str = "label          pattern    bs     qd  queues      IOPS     MB/s   mean_us    p50_us    p99_us  p99.9_us  errors";

fn print_brief(spec: &LoadSpec, label: Option<&str>, r: &LoadResult) {
    let (bs, qd, queues) =
        (spec.block_size.to_string(), spec.queue_depth.to_string(), spec.num_queues.to_string());
    brief_row(label.unwrap_or("-"), spec.pattern.as_str(), &bs, &qd, &queues, r);
}

/// One row in the `BRIEF_HEADER` layout.
fn brief_row(label: &str, pattern: &str, bs: &str, qd: &str, queues: &str, r: &LoadResult) {
    println!(
        "{:<14} {:<10} {:<6} {:>3} {:>7} {:>9.0} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7}",
        label,
        pattern,
        bs,
        qd,
        queues,
        r.iops,
        r.mbps,
        r.lat_mean_ns / 1000.0,
        us(r.p50_ns),
        us(r.p99_ns),
        us(r.p999_ns),
        r.errors
    );
}

/// How a run ends in an error: the exit code (1: the device or the run; 2: the arguments) and
/// the message.
struct Failure(u8, String);

impl From<fp_loadgen::LoadError> for Failure {
    fn from(e: fp_loadgen::LoadError) -> Failure {
        Failure(1, e.to_string())
    }
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--brief-header") {
        println!("{BRIEF_HEADER}");
        return ExitCode::SUCCESS;
    }
    let args = Args::parse();
    let ran = match args.socket.clone() {
        Some(socket) => run_one(&args, socket),
        None => run_disks(&args),
    };
    ran.unwrap_or_else(|Failure(code, message)| {
        eprintln!("fp-load: {message}");
        ExitCode::from(code)
    })
}

/// Writes the `--hist-out` file.
fn write_hist(path: &std::path::Path, v: &serde_json::Value) -> Result<(), Failure> {
    std::fs::write(path, v.to_string() + "\n")
        .map_err(|e| Failure(1, format!("writing {}: {e}", path.display())))
}

/// Exit code 3 when requests failed.
fn exit_for(errors: u64) -> ExitCode {
    if errors > 0 {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

/// A run on one disk, `socket`.
fn run_one(args: &Args, socket: PathBuf) -> Result<ExitCode, Failure> {
    let mut spec = base_spec(args, socket);
    if args.offset != 0 || args.size.is_some() {
        match args.size {
            Some(len) => spec.region = Some(Region { offset: args.offset, len }),
            None => spec.region = Some(region_to_end(&spec, args.offset).map_err(|e| Failure(1, e))?),
        }
    }

    if args.idle {
        let held = fp_loadgen::hold(&spec)?;
        if args.json {
            let v = serde_json::json!({
                "label": args.label,
                "socket": spec.socket.display().to_string(),
                "idle": true,
                "num_queues": spec.num_queues,
                "poll_queues": spec.poll_queues,
                "packed": spec.packed,
                "elapsed_s": held.as_secs_f64(),
            });
            println!("{v}");
        } else {
            println!(
                "held {} queue(s) on {} idle for {:.2} s",
                spec.num_queues,
                spec.socket.display(),
                held.as_secs_f64()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }

    let result = fp_loadgen::run(&spec)?;
    if let Some(path) = &args.hist_out {
        write_hist(path, &result.histogram_json())?;
    }
    if args.json {
        let mut v = result.to_json();
        annotate(&mut v, &spec, args.label.as_deref());
        println!("{v}");
    } else if args.brief {
        print_brief(&spec, args.label.as_deref(), &result);
    } else {
        print_human(&spec, args.label.as_deref(), &result);
    }
    Ok(exit_for(result.errors))
}

/// The spec the global options describe, for `socket`; in a multi-disk run, the defaults of
/// every disk's keys.
fn base_spec(args: &Args, socket: PathBuf) -> LoadSpec {
    let mut spec = LoadSpec::new(socket);
    spec.pattern = args.pattern;
    spec.block_size = args.block_size as usize;
    spec.queue_depth = args.queue_depth;
    spec.num_queues = args.num_queues;
    spec.duration = args.duration;
    spec.poll_queues = args.poll;
    spec.cpu = args.cpu;
    spec.read_percent = args.read_percent;
    spec.read_only = args.read_only;
    spec.measure_busy = args.client_busy;
    spec.packed = args.packed;
    spec.frontend = args.frontend || args.hugetlb;
    spec.dirty_log = args.dirty_log;
    spec.hugetlb = args.hugetlb;
    spec.stride = args.stride;
    spec.max_ios = args.max_ios;
    spec.rate_iops = args.rate_iops;
    spec.timeline = args.timeline;
    spec.verify = args.verify;
    spec.mark_phases = args.mark_phases;
    if let Some(s) = args.seed {
        spec.seed = s;
    }
    spec
}

/// Adds what was run (`spec`) and its `label` to a result's JSON object.
fn annotate(v: &mut serde_json::Value, spec: &LoadSpec, label: Option<&str>) {
    let obj = v.as_object_mut().expect("to_json returns an object");
    obj.insert("label".into(), label.into());
    obj.insert("socket".into(), spec.socket.display().to_string().into());
    obj.insert("pattern".into(), spec.pattern.as_str().into());
    obj.insert("block_size".into(), spec.block_size.into());
    obj.insert("queue_depth".into(), spec.queue_depth.into());
    obj.insert("num_queues".into(), spec.num_queues.into());
    obj.insert("poll_queues".into(), spec.poll_queues.into());
    obj.insert("packed".into(), spec.packed.into());
    obj.insert("frontend".into(), (spec.frontend || spec.dirty_log).into());
    obj.insert("cpu".into(), spec.cpu.into());
    obj.insert("rate_iops".into(), spec.rate_iops.into());
}

/// The disks of `--job` then `--disk`, parsed against the global options.
fn disk_args(args: &Args) -> Result<Vec<DiskArg>, String> {
    let mut lines: Vec<(String, String)> = Vec::new();
    if let Some(path) = &args.job {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--job {}: {e}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if !line.is_empty() && !line.starts_with('#') {
                lines.push((format!("{} line {}", path.display(), n + 1), line.to_string()));
            }
        }
    }
    lines.extend(args.disk.iter().map(|d| (format!("--disk '{d}'"), d.clone())));
    let mut defaults = base_spec(args, PathBuf::new());
    defaults.cpu = None;
    let mut disks = Vec::with_capacity(lines.len());
    for (i, (whence, line)) in lines.iter().enumerate() {
        disks.push(parse_disk(line, &defaults, i).map_err(|e| format!("{whence}: {e}"))?);
    }
    if disks.is_empty() {
        return Err(format!(
            "--job {}: no disks in the file",
            args.job.as_deref().unwrap_or(Path::new("")).display()
        ));
    }
    Ok(disks)
}

/// A multi-disk run (`--disk`, `--job`).
fn run_disks(args: &Args) -> Result<ExitCode, Failure> {
    let mut disks = disk_args(args).map_err(|e| Failure(2, e))?;
    for (i, d) in disks.iter_mut().enumerate() {
        if let Some(offset) = d.offset_to_end {
            // Asks the device, like a single disk's --offset without --size: a failure is
            // the device's, not the arguments'.
            let r = region_to_end(&d.spec, offset)
                .map_err(|e| Failure(1, format!("disk {i} ({}): {e}", d.spec.socket.display())))?;
            d.spec.region = Some(r);
        }
    }
    let spec = MultiSpec {
        thread_per_disk: args.thread_per_disk || disks.iter().any(|d| d.spec.cpu.is_some()),
        disks: disks.iter().map(|d| d.spec.clone()).collect(),
        duration: args.duration,
        poll_queues: args.poll,
        packed: args.packed,
        measure_busy: args.client_busy,
        cpu: args.cpu,
    };
    let result = fp_loadgen::run_multi(&spec)?;
    if let Some(path) = &args.hist_out {
        let mut v = result.total.histogram_json();
        let per_disk: Vec<_> = result.disks.iter().map(LoadResult::histogram_json).collect();
        v.as_object_mut().expect("an object").insert("disks".into(), per_disk.into());
        write_hist(path, &v)?;
    }
    // The disks' effective specs (the shared options applied), for the output.
    let effective: Vec<LoadSpec> = spec
        .disks
        .iter()
        .map(|d| LoadSpec {
            duration: spec.duration,
            poll_queues: spec.poll_queues,
            packed: spec.packed,
            measure_busy: spec.measure_busy,
            cpu: if spec.thread_per_disk { d.cpu.or(spec.cpu) } else { spec.cpu },
            ..d.clone()
        })
        .collect();
    if args.json {
        let per_disk: Vec<_> = result
            .disks
            .iter()
            .zip(&effective)
            .zip(&disks)
            .map(|((r, s), d)| {
                let mut v = r.to_json();
                annotate(&mut v, s, d.label.as_deref());
                v
            })
            .collect();
        let v = serde_json::json!({
            "label": args.label,
            "num_disks": per_disk.len(),
            "thread_per_disk": spec.thread_per_disk,
            "poll_queues": spec.poll_queues,
            "packed": spec.packed,
            "cpu": spec.cpu,
            "disks": per_disk,
            "total": result.total.to_json(),
        });
        println!("{v}");
    } else {
        print_disks(args, &spec, &effective, &disks, &result);
    }
    Ok(exit_for(result.total.errors))
}

/// The multi-disk text output: with --brief one row per disk and the total, otherwise a title,
/// the header and the rows.
fn print_disks(args: &Args, spec: &MultiSpec, effective: &[LoadSpec], disks: &[DiskArg], r: &MultiResult) {
    if !args.brief {
        let mode = if spec.poll_queues { "poll queues" } else { "completion fds" };
        let mode = if spec.packed { format!("packed, {mode}") } else { mode.to_string() };
        let threads = if spec.thread_per_disk {
            "one client thread per disk".to_string()
        } else {
            format!("one client thread{}", spec.cpu.map(|c| format!(" on cpu {c}")).unwrap_or_default())
        };
        let label = args.label.as_deref().map(|l| format!("{l}: ")).unwrap_or_default();
        println!("{label}{} disks, {threads} ({mode}), {:.2} s", disks.len(), r.total.elapsed.as_secs_f64());
        println!("{BRIEF_HEADER}");
    }
    for ((res, s), d) in r.disks.iter().zip(effective).zip(disks) {
        let name = d.label.clone().unwrap_or_else(|| {
            s.socket
                .file_name()
                .map_or_else(|| s.socket.display().to_string(), |f| f.to_string_lossy().into_owned())
        });
        print_brief(s, Some(&name), res);
    }
    brief_row("total", "-", "-", "-", "-", &r.total);
    if !args.brief {
        print_timeline(&r.total);
        for ((res, s), d) in r.disks.iter().zip(effective).zip(disks) {
            if res.errors > 0 {
                let name = d.label.clone().unwrap_or_else(|| s.socket.display().to_string());
                println!(
                    "  ERRORS on {name}: {} requests failed (first: errno {})",
                    res.errors,
                    -res.first_error.unwrap_or(0)
                );
            }
        }
    }
}

/// `--offset` without `--size`: the region runs to the end of the device, which is only known
/// after connecting; ask the device once, then let the run connect again.
fn region_to_end(spec: &LoadSpec, offset: u64) -> Result<Region, String> {
    let mut b = blkio::Blkio::new("virtio-blk-vhost-user").map_err(|e| e.to_string())?;
    let path = spec.socket.to_str().ok_or("socket path is not UTF-8")?;
    b.set_str("path", path).map_err(|e| e.to_string())?;
    b.connect().map_err(|e| format!("connect: {e}"))?;
    let cap = b.get_u64("capacity").map_err(|e| e.to_string())?;
    if offset >= cap {
        return Err(format!("offset {offset} is beyond the device's {cap} bytes"));
    }
    Ok(Region { offset, len: cap - offset })
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn print_human(spec: &LoadSpec, label: Option<&str>, r: &LoadResult) {
    let mode = if spec.poll_queues { "poll queues" } else { "completion fds" };
    let mode = if spec.packed {
        format!("packed, {mode}")
    } else if spec.dirty_log {
        format!("own frontend, dirty log on, {mode}")
    } else if spec.frontend {
        format!("own frontend, {mode}")
    } else {
        mode.to_string()
    };
    let cpu = spec.cpu.map(|c| format!(", client cpu {c}")).unwrap_or_default();
    let cpu = match spec.rate_iops {
        Some(r) => format!("{cpu}, at most {r} IOPS"),
        None => cpu,
    };
    let label = label.map(|l| format!("{l}: ")).unwrap_or_default();
    println!(
        "{label}{} bs={} qd={} queues={} ({mode}{cpu}) on {}",
        spec.pattern,
        spec.block_size,
        spec.queue_depth,
        spec.num_queues,
        spec.socket.display()
    );
    println!(
        "  {:>10.0} IOPS  {:>9.1} MB/s  {} I/Os in {:.2} s  (device {} bytes, {}-byte blocks)",
        r.iops,
        r.mbps,
        r.ios,
        r.elapsed.as_secs_f64(),
        r.capacity,
        r.request_alignment
    );
    println!(
        "  latency us: mean {:.1}  min {:.1}  p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        r.lat_mean_ns / 1000.0,
        us(r.lat_min_ns),
        us(r.p50_ns),
        us(r.p99_ns),
        us(r.p999_ns),
        us(r.lat_max_ns)
    );
    print_timeline(r);
    if let Some(k) = r.kicks {
        println!("  kicks sent: {k} ({:.3} per I/O)", k as f64 / r.ios.max(1) as f64);
    }
    if let Some(w) = r.wakeups {
        let per = |n: u64| if n > 0 { r.ios as f64 / n as f64 } else { 0.0 };
        println!(
            "  completion fds: {} wake-ups ({:.1} completions each), {} notifications ({:.1} completions each)",
            w.wakeups,
            per(w.wakeups),
            w.notifications,
            per(w.notifications)
        );
    }
    if let Some(d) = &r.dirty_log {
        println!(
            "  dirty log: {} scans every {} ms, {} bits cleared ({:.3} per I/O); distinct pages: data {} \
             (expected {}), headers {}, rings {}, other {}",
            d.syncs,
            d.interval_ms,
            d.bits_seen,
            d.bits_seen as f64 / r.ios.max(1) as f64,
            d.data_pages,
            d.data_pages_expected,
            d.header_pages,
            d.ring_pages,
            d.other_pages
        );
    }
    if let Some(v) = r.verify {
        let first = v.first_mismatch.map(|o| format!(" (first at byte {o})")).unwrap_or_default();
        println!("  verified {} reads: {} mismatches{first}", v.verified, v.mismatches);
    }
    if r.errors > 0 {
        println!("  ERRORS: {} requests failed (first: errno {})", r.errors, -r.first_error.unwrap_or(0));
    }
}

/// The human output's timeline line, if the run has one.
fn print_timeline(r: &LoadResult) {
    if let Some(t) = &r.timeline {
        let counts: Vec<String> = t.ios.iter().map(u64::to_string).collect();
        println!("  I/Os per {:?}: {}", t.interval, counts.join(" "));
    }
}
