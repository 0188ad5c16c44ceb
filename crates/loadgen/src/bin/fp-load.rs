//! `fp-load`: drive a vhost-user-blk socket with a fixed I/O pattern through libblkio (or, with
//! `--packed`, through virtio-driver over packed virtqueues) and print IOPS, bandwidth and
//! completion latency percentiles (human-readable, or one JSON object with `--json`).
//!
//! Exit status: 0 on success, 1 when the run could not be set up or stalled, 2 on bad arguments
//! (clap), 3 when the run finished but some requests completed with an error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use fp_loadgen::{parse_duration, parse_size, LoadResult, LoadSpec, Pattern, Region};

/// Drive a vhost-user-blk device through libblkio and report IOPS and latency.
#[derive(Parser, Debug)]
#[command(name = "fp-load", version)]
struct Args {
    /// vhost-user-blk Unix socket to connect to.
    #[arg(long)]
    socket: PathBuf,
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
    #[arg(long, conflicts_with_all = ["brief", "hist_out", "client_busy"])]
    idle: bool,
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
    println!(
        "{:<14} {:<10} {:<6} {:>3} {:>7} {:>9.0} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7}",
        label.unwrap_or("-"),
        spec.pattern.as_str(),
        spec.block_size,
        spec.queue_depth,
        spec.num_queues,
        r.iops,
        r.mbps,
        r.lat_mean_ns / 1000.0,
        us(r.p50_ns),
        us(r.p99_ns),
        us(r.p999_ns),
        r.errors
    );
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--brief-header") {
        println!("{BRIEF_HEADER}");
        return ExitCode::SUCCESS;
    }
    let args = Args::parse();
    let mut spec = LoadSpec::new(&args.socket);
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
    spec.stride = args.stride;
    spec.max_ios = args.max_ios;
    if let Some(s) = args.seed {
        spec.seed = s;
    }
    if args.offset != 0 || args.size.is_some() {
        match args.size {
            Some(len) => spec.region = Some(Region { offset: args.offset, len }),
            None => match region_to_end(&spec, args.offset) {
                Ok(r) => spec.region = Some(r),
                Err(e) => {
                    eprintln!("fp-load: {e}");
                    return ExitCode::from(1);
                }
            },
        }
    }

    if args.idle {
        return match fp_loadgen::hold(&spec) {
            Ok(held) => {
                if args.json {
                    let v = serde_json::json!({
                        "label": args.label,
                        "socket": args.socket.display().to_string(),
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
                        args.socket.display(),
                        held.as_secs_f64()
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("fp-load: {e}");
                ExitCode::from(1)
            }
        };
    }

    let result = match fp_loadgen::run(&spec) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fp-load: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(path) = &args.hist_out {
        let text = result.histogram_json().to_string();
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("fp-load: writing {}: {e}", path.display());
            return ExitCode::from(1);
        }
    }
    if args.json {
        let mut v = result.to_json();
        let obj = v.as_object_mut().expect("to_json returns an object");
        obj.insert("label".into(), args.label.clone().into());
        obj.insert("socket".into(), args.socket.display().to_string().into());
        obj.insert("pattern".into(), spec.pattern.as_str().into());
        obj.insert("block_size".into(), spec.block_size.into());
        obj.insert("queue_depth".into(), spec.queue_depth.into());
        obj.insert("num_queues".into(), spec.num_queues.into());
        obj.insert("poll_queues".into(), spec.poll_queues.into());
        obj.insert("packed".into(), spec.packed.into());
        obj.insert("cpu".into(), spec.cpu.into());
        println!("{v}");
    } else if args.brief {
        print_brief(&spec, args.label.as_deref(), &result);
    } else {
        print_human(&spec, args.label.as_deref(), &result);
    }
    if result.errors > 0 {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
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
        return Err(format!("--offset {offset} is beyond the device's {cap} bytes"));
    }
    Ok(Region { offset, len: cap - offset })
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn print_human(spec: &LoadSpec, label: Option<&str>, r: &LoadResult) {
    let mode = if spec.poll_queues { "poll queues" } else { "completion fds" };
    let mode = if spec.packed { format!("packed, {mode}") } else { mode.to_string() };
    let cpu = spec.cpu.map(|c| format!(", client cpu {c}")).unwrap_or_default();
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
    if r.errors > 0 {
        println!("  ERRORS: {} requests failed (first: errno {})", r.errors, -r.first_error.unwrap_or(0));
    }
}
