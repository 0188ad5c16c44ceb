//! Several disks from one process (`fp-load --disk ...`): each disk has its own socket,
//! pattern, block size, depth and queues, and all run for the same duration, either from one
//! client thread (one loop over every disk's queues, as one busy vCPU would drive them, each
//! pass starting one disk further so that no disk is always last) or from one thread per disk. Each disk is accounted for on its own; the total adds them up.

use std::sync::atomic::AtomicBool;
use std::sync::Barrier;
use std::time::Duration;

use crate::engine::{self, disk_error, StartLine, ThreadCounts};
use crate::{
    parse_duration, parse_size, pin_current_thread, Counts, Histogram, LoadError, LoadResult, LoadSpec,
    Wakeups,
};
use crate::{Pattern, Region};

/// A run over several disks.
#[derive(Debug, Clone)]
pub struct MultiSpec {
    /// One spec per disk: its socket, pattern, block size, queue depth, queues, region,
    /// stride, `max_ios`, rate, read mix, seed, read-only flag and (with `thread_per_disk`) CPU.
    /// Their `duration`, `poll_queues`, `packed` and `measure_busy` are ignored: the fields
    /// below apply to every disk.
    pub disks: Vec<LoadSpec>,
    pub duration: Duration,
    pub poll_queues: bool,
    pub packed: bool,
    pub measure_busy: bool,
    /// With one thread: pin it here. With one thread per disk: pin the threads of disks
    /// that name no CPU of their own here.
    pub cpu: Option<usize>,
    /// Run each disk on its own thread (pinned to its [`LoadSpec::cpu`], else to `cpu`), all
    /// starting together once every disk is connected; otherwise one thread drives them all
    /// and a disk's own `cpu` is an error.
    pub thread_per_disk: bool,
}

/// What a multi-disk run measured.
#[derive(Debug, Clone)]
pub struct MultiResult {
    /// Each disk's result, in the order of [`MultiSpec::disks`]. With one thread for all
    /// disks their `client_busy_ns` and `wakeups` are `None` (the thread's are in `total`).
    pub disks: Vec<LoadResult>,
    /// The sum: counts and bytes added up, latencies over every disk's requests (the
    /// histograms merged), `elapsed` the longest disk's, `iops` and `mbps` the summed counts
    /// over that, `first_error` the first disk's that had one, `capacity` the disks' summed,
    /// `request_alignment` the largest, `client_busy_ns` and `wakeups` every client thread's,
    /// added, `kicks` the disks' added (with fp-load's own frontend), and the timeline the
    /// disks' added interval by interval.
    pub total: LoadResult,
}

/// Runs every disk of `spec` and returns each one's result and the total.
pub fn run_multi(spec: &MultiSpec) -> Result<MultiResult, LoadError> {
    if spec.disks.is_empty() {
        return Err(LoadError::InvalidSpec("a multi-disk run needs at least one disk".into()));
    }
    let mut disks = spec.disks.clone();
    for (i, d) in disks.iter_mut().enumerate() {
        d.duration = spec.duration;
        d.poll_queues = spec.poll_queues;
        d.packed = spec.packed;
        d.measure_busy = spec.measure_busy;
        if !spec.thread_per_disk && d.cpu.is_some() {
            return Err(disk_error(
                i,
                d,
                LoadError::InvalidSpec("a disk's own cpu needs one thread per disk".into()),
            ));
        }
        d.validate().map_err(|e| disk_error(i, d, e))?;
    }
    // One loop drives every disk through the first disk's back end: the others must use it too.
    let client = |d: &LoadSpec| (d.frontend || d.hugetlb || d.dirty_log, d.hugetlb, d.dirty_log);
    if let Some((i, d)) = disks.iter().enumerate().find(|(_, d)| client(d) != client(&disks[0])) {
        return Err(disk_error(
            i,
            d,
            LoadError::InvalidSpec(
                "every disk of a run needs the same client (frontend, hugetlb, dirty log)".into(),
            ),
        ));
    }

    let results = if spec.thread_per_disk {
        let barrier = Barrier::new(disks.len());
        let failed = AtomicBool::new(false);
        let outcomes: Vec<Result<engine::ThreadResults, LoadError>> = std::thread::scope(|s| {
            let handles: Vec<_> = disks
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let (barrier, failed) = (&barrier, &failed);
                    let cpu = d.cpu.or(spec.cpu);
                    std::thread::Builder::new()
                        .name(format!("fp-load-{i}"))
                        .spawn_scoped(s, move || {
                            let line = StartLine { barrier, failed };
                            if let Some(Err(e)) = cpu.map(pin_current_thread) {
                                // Still meet the others at the start line, or they wait forever.
                                line.failed.store(true, std::sync::atomic::Ordering::SeqCst);
                                line.barrier.wait();
                                return Err(e);
                            }
                            engine::run_disks_on_this_thread(std::slice::from_ref(d), Some(line))
                        })
                        .map_err(|source| LoadError::Os { op: "spawning a client thread", source })
                })
                .collect();
            handles.into_iter().map(|h| h.and_then(|h| h.join().map_err(|_| LoadError::Panicked)?)).collect()
        });
        // Report the disk that failed, not the ones cancelled because of it.
        let mut cancelled = None;
        let mut results = Vec::with_capacity(disks.len());
        let mut busy: Option<u64> = None;
        let mut sleeps: Option<Wakeups> = None;
        for (i, o) in outcomes.into_iter().enumerate() {
            match o {
                Ok((mut r, b)) => {
                    let mut r = r.pop().expect("one result per disk");
                    // One disk per thread: the thread's wake-ups are the disk's.
                    r.client_busy_ns = b.busy_ns;
                    r.wakeups = b.wakeups;
                    busy = b.busy_ns.map(|b| b + busy.unwrap_or(0));
                    sleeps = b.wakeups.map(|w| w + sleeps.unwrap_or_default());
                    results.push(r);
                }
                Err(LoadError::Cancelled) => cancelled = Some(disk_error(i, &disks[i], LoadError::Cancelled)),
                Err(e) => return Err(disk_error(i, &disks[i], e)),
            }
        }
        if let Some(e) = cancelled {
            return Err(e);
        }
        (results, ThreadCounts { busy_ns: busy, wakeups: sleeps })
    } else {
        let cpu = spec.cpu;
        let disks = &disks;
        let out = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("fp-load".into())
                .spawn_scoped(s, move || {
                    if let Some(cpu) = cpu {
                        pin_current_thread(cpu)?;
                    }
                    engine::run_disks_on_this_thread(disks, None)
                })
                .map_err(|source| LoadError::Os { op: "spawning the client thread", source })?
                .join()
                .map_err(|_| LoadError::Panicked)?
        });
        let (results, counts) =
            out.map_err(|e| if disks.len() == 1 { disk_error(0, &disks[0], e) } else { e })?;
        (results, counts)
    };
    let (disks, counts) = results;
    let total = total_of(&disks, counts);
    Ok(MultiResult { disks, total })
}

/// The total of `disks` (see [`MultiResult::total`]) with the client threads' own figures,
/// added up over the threads: their busy time and their sleeps on the completion fds.
fn total_of(disks: &[LoadResult], threads: ThreadCounts) -> LoadResult {
    let mut hist = Histogram::new();
    let mut c = Counts::default();
    let (mut capacity, mut request_alignment) = (0u64, 0u32);
    for r in disks {
        hist.merge(&r.histogram);
        c.ios += r.ios;
        c.bytes += r.bytes;
        c.reads += r.reads;
        c.writes += r.writes;
        c.errors += r.errors;
        c.first_error = c.first_error.or(r.first_error);
        c.elapsed = c.elapsed.max(r.elapsed);
        capacity = capacity.saturating_add(r.capacity);
        request_alignment = request_alignment.max(r.request_alignment);
    }
    let mut total = LoadResult::from_counts(c, hist, capacity, request_alignment);
    total.client_busy_ns = threads.busy_ns;
    total.wakeups = threads.wakeups;
    total.kicks = disks.iter().map(|r| r.kicks).sum();
    // fp-load gives every disk the same interval. Each disk counts from its own start: with a
    // thread per disk those differ by the time the threads take to leave the start line.
    for t in disks.iter().filter_map(|r| r.timeline.as_ref()) {
        match total.timeline.as_mut() {
            Some(sum) => sum.add(t),
            None => total.timeline = Some(t.clone()),
        }
    }
    total
}

/// One parsed `--disk` argument (see [`parse_disk`]).
#[derive(Debug, Clone)]
pub struct DiskArg {
    pub spec: LoadSpec,
    /// The name the disk is reported under (`label=`); `None` reports its socket.
    pub label: Option<String>,
    /// `offset=` without `size=`: the region runs from here to the end of the device, which
    /// only the device knows (the caller asks it and sets [`LoadSpec::region`]).
    pub offset_to_end: Option<u64>,
}

/// Parses one disk of a multi-disk run, `key=value` pairs separated by commas:
/// `socket=PATH` (required), `pattern=`, `bs=`, `qd=` (or `iodepth=`), `queues=`, `ios=`,
/// `rate=` (IOPS), `offset=`, `size=`, `stride=`, `rwmix-read=`, `seed=`, `read-only` (or `read-only=true`),
/// `cpu=` and `label=`. Keys not given take their value from `defaults`, but for the seed,
/// which is `defaults.seed + index` so that the disks do not all issue the same offsets.
/// An error names the key.
pub fn parse_disk(arg: &str, defaults: &LoadSpec, index: usize) -> Result<DiskArg, String> {
    let mut spec = defaults.clone();
    spec.seed = defaults.seed.wrapping_add(index as u64);
    spec.region = None;
    spec.cpu = None;
    let mut socket = None;
    let mut label = None;
    let (mut offset, mut size) = (None, None);
    let mut seen: Vec<&str> = Vec::new();
    for item in arg.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (item, ""),
        };
        if seen.contains(&key) {
            return Err(format!("{key}: given twice"));
        }
        seen.push(key);
        let bad = |what: &str| format!("{key}: '{value}' is not {what}");
        let number = || value.parse::<u64>().map_err(|_| bad("a whole number"));
        let size_of = || parse_size(value).map_err(|e| format!("{key}: {e}"));
        let as_usize = |n: u64| usize::try_from(n).map_err(|_| bad("small enough"));
        match key {
            "socket" if value.is_empty() => return Err("socket: the path is empty".into()),
            "socket" => socket = Some(value.to_string()),
            "pattern" => spec.pattern = value.parse::<Pattern>().map_err(|e| format!("{key}: {e}"))?,
            "bs" => spec.block_size = as_usize(size_of()?)?,
            "qd" | "iodepth" => spec.queue_depth = as_usize(number()?)?,
            "queues" => spec.num_queues = as_usize(number()?)?,
            "ios" => spec.max_ios = Some(number()?),
            "rate" => spec.rate_iops = Some(number()?),
            "offset" => offset = Some(size_of()?),
            "size" => size = Some(size_of()?),
            "stride" => spec.stride = Some(size_of()?),
            "rwmix-read" => {
                spec.read_percent = value.parse::<u8>().ok().filter(|p| *p <= 100).ok_or_else(|| bad("0 to 100"))?
            }
            "seed" => spec.seed = number()?,
            "read-only" => {
                spec.read_only = match value {
                    "" | "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => return Err(bad("true or false")),
                }
            }
            "cpu" => spec.cpu = Some(as_usize(number()?)?),
            "label" => label = Some(value.to_string()),
            "time" => {
                // A common mistake worth a precise message: the duration is the run's.
                parse_duration(value).map_err(|e| format!("{key}: {e}"))?;
                return Err("time: every disk runs for the whole run's --time".into());
            }
            _ => return Err(format!("{key}: unknown key (expected socket, pattern, bs, qd, queues, ios, rate, offset, size, stride, rwmix-read, seed, read-only, cpu or label)")),
        }
    }
    spec.socket = socket.ok_or("socket: missing (socket=PATH)")?.into();
    let offset_to_end = match (offset, size) {
        (o, Some(len)) => {
            spec.region = Some(Region { offset: o.unwrap_or(0), len });
            None
        }
        (Some(o), None) if o != 0 => Some(o),
        _ => None,
    };
    spec.validate().map_err(|e| match e {
        LoadError::InvalidSpec(m) => m,
        e => e.to_string(),
    })?;
    Ok(DiskArg { spec, label, offset_to_end })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> LoadSpec {
        let mut d = LoadSpec::new("/unused");
        d.queue_depth = 4;
        d.block_size = 8192;
        d
    }

    #[test]
    fn a_disk_takes_its_keys_and_the_defaults_for_the_rest() {
        let d = defaults();
        let a =
            parse_disk("socket=/tmp/a.sock,qd=128,pattern=randwrite,ios=1000,label=noisy,rate=20000", &d, 3)
                .unwrap();
        assert_eq!(a.spec.rate_iops, Some(20000));
        assert_eq!(a.spec.socket, std::path::PathBuf::from("/tmp/a.sock"));
        assert_eq!(a.spec.queue_depth, 128);
        assert_eq!(a.spec.pattern, Pattern::RandWrite);
        assert_eq!(a.spec.max_ios, Some(1000));
        assert_eq!(a.label.as_deref(), Some("noisy"));
        assert_eq!(a.spec.block_size, 8192, "bs from the defaults");
        assert_eq!(a.spec.num_queues, 1);
        assert_eq!(a.spec.seed, d.seed + 3, "each disk its own seed");
        assert_eq!(a.offset_to_end, None);
        assert_eq!(a.spec.region, None);

        let b = parse_disk(
            "socket=b, bs=64k, iodepth=2, queues=2, offset=1M, size=4M, rwmix-read=70, \
             pattern=randrw, seed=7, read-only, cpu=1",
            &d,
            0,
        )
        .unwrap();
        assert_eq!(b.spec.block_size, 64 << 10);
        assert_eq!((b.spec.queue_depth, b.spec.num_queues), (2, 2));
        assert_eq!(b.spec.region, Some(Region { offset: 1 << 20, len: 4 << 20 }));
        assert_eq!((b.spec.read_percent, b.spec.seed, b.spec.read_only), (70, 7, true));
        assert_eq!(b.spec.cpu, Some(1));

        let c = parse_disk("socket=c,pattern=write,stride=1M,offset=8M", &d, 0).unwrap();
        assert_eq!(c.spec.stride, Some(1 << 20));
        assert_eq!(c.offset_to_end, Some(8 << 20));
        assert_eq!(c.spec.region, None);
        assert_eq!(c.spec.rate_iops, None);
    }

    #[test]
    fn bad_disks_name_the_key() {
        let d = defaults();
        let err = |s: &str| parse_disk(s, &d, 0).unwrap_err();
        assert!(err("qd=4").starts_with("socket:"), "{}", err("qd=4"));
        assert!(err("socket=").starts_with("socket:"));
        assert!(err("socket=a,qd=deep").starts_with("qd:"));
        assert!(err("socket=a,bs=huge").starts_with("bs:"));
        assert!(err("socket=a,pattern=zigzag").starts_with("pattern:"));
        assert!(err("socket=a,rwmix-read=101").starts_with("rwmix-read:"));
        assert!(err("socket=a,read-only=maybe").starts_with("read-only:"));
        assert!(err("socket=a,colour=red").starts_with("colour: unknown key"));
        assert!(err("socket=a,qd=1,qd=2").starts_with("qd: given twice"));
        assert!(err("socket=a,time=5s").starts_with("time:"));
        // Values that parse but make no sense are refused by the spec's own checks.
        assert!(err("socket=a,qd=0").contains("queue depth 0"), "{}", err("socket=a,qd=0"));
        assert!(err("socket=a,bs=1000").contains("block size 1000"));
        assert!(err("socket=a,pattern=randread,stride=1M").contains("stride"));
        assert!(err("socket=a,rate=fast").starts_with("rate:"));
        assert!(err("socket=a,rate=0").contains("rate must be positive"));
    }

    fn result(ios: u64, errors: u64, elapsed_ms: u64, lat: &[u64], first_error: Option<i32>) -> LoadResult {
        let mut h = Histogram::new();
        lat.iter().for_each(|&v| h.record(v));
        let c = Counts {
            ios,
            bytes: ios * 4096,
            reads: ios / 2,
            writes: ios - ios / 2,
            errors,
            first_error,
            elapsed: Duration::from_millis(elapsed_ms),
        };
        LoadResult::from_counts(c, h, 1 << 20, 512)
    }

    #[test]
    fn the_total_adds_the_disks_up() {
        let a = result(3, 0, 1000, &[1_000, 2_000, 3_000], None);
        let b = result(2, 4, 2000, &[10_000, 20_000], Some(-libc::EIO));
        let mut c = result(1, 1, 500, &[100_000], Some(-libc::EINVAL));
        c.request_alignment = 4096;
        let threads =
            ThreadCounts { busy_ns: Some(77), wakeups: Some(Wakeups { wakeups: 5, notifications: 9 }) };
        let t = total_of(&[a, b, c], threads);
        assert_eq!((t.ios, t.bytes, t.reads, t.writes, t.errors), (6, 6 * 4096, 2, 4, 5));
        assert_eq!(t.first_error, Some(-libc::EIO));
        assert_eq!(t.elapsed, Duration::from_secs(2));
        assert!((t.iops - 3.0).abs() < 1e-9, "6 I/Os over the longest 2 s: {}", t.iops);
        assert_eq!(t.histogram.count(), 6);
        assert_eq!((t.lat_min_ns, t.lat_max_ns), (1_000, 100_000));
        let mean = (1_000 + 2_000 + 3_000 + 10_000 + 20_000 + 100_000) as f64 / 6.0;
        assert!((t.lat_mean_ns - mean).abs() < 1e-6);
        assert_eq!((t.capacity, t.request_alignment), (3 << 20, 4096));
        assert_eq!(t.client_busy_ns, Some(77));
        assert_eq!(
            t.wakeups,
            Some(Wakeups { wakeups: 5, notifications: 9 }),
            "one thread's sleeps, all disks'"
        );
        assert_eq!(t.kicks, None, "libblkio counts no kicks");
    }

    #[test]
    fn the_total_adds_the_disks_kicks() {
        let mut a = result(3, 0, 1000, &[1_000], None);
        let mut b = result(2, 0, 1000, &[2_000], None);
        (a.kicks, b.kicks) = (Some(3), Some(4));
        let t = total_of(&[a, b], ThreadCounts::default());
        assert_eq!(t.kicks, Some(7));
        assert_eq!(t.wakeups, None, "polled queues: no sleeps");
    }

    /// A 10 ms run of `disks` from one thread on completion fds.
    fn ten_ms_of(disks: Vec<LoadSpec>) -> MultiSpec {
        MultiSpec {
            disks,
            duration: Duration::from_millis(10),
            poll_queues: false,
            packed: false,
            measure_busy: false,
            cpu: None,
            thread_per_disk: false,
        }
    }

    #[test]
    fn a_disk_cpu_needs_a_thread_per_disk_and_bad_disks_are_named() {
        let mut d = LoadSpec::new("/nonexistent/a.sock");
        d.cpu = Some(0);
        let mut m = ten_ms_of(vec![LoadSpec::new("/nonexistent/b.sock"), d]);
        match run_multi(&m) {
            Err(LoadError::Disk { index: 1, source, .. }) => {
                assert!(matches!(*source, LoadError::InvalidSpec(_)))
            }
            other => panic!("{other:?}"),
        }
        // No disk is there: each one fails to connect, and the error names the first.
        m.thread_per_disk = true;
        match run_multi(&m) {
            Err(LoadError::Disk { index: 0, socket, source }) => {
                assert_eq!(socket, "/nonexistent/b.sock");
                assert!(matches!(*source, LoadError::Blkio { op: "connect", .. }), "{source:?}");
            }
            other => panic!("{other:?}"),
        }
        m.thread_per_disk = false;
        m.disks[1].cpu = None;
        match run_multi(&m) {
            Err(LoadError::Disk { index: 0, source, .. }) => {
                assert!(matches!(*source, LoadError::Blkio { op: "connect", .. }), "{source:?}")
            }
            other => panic!("{other:?}"),
        }
        m.disks.clear();
        assert!(matches!(run_multi(&m), Err(LoadError::InvalidSpec(_))));
    }

    #[test]
    fn every_disk_needs_the_same_client() {
        let mut libblkio = LoadSpec::new("/nonexistent/a.sock");
        let mut frontend = LoadSpec::new("/nonexistent/b.sock");
        frontend.frontend = true;
        let mut m = ten_ms_of(vec![libblkio.clone(), frontend.clone()]);
        // Refused before connecting (no disk is there: a connect would fail on disk 0 instead).
        match run_multi(&m) {
            Err(LoadError::Disk { index: 1, source, .. }) => {
                assert!(
                    matches!(&*source, LoadError::InvalidSpec(m) if m.contains("same client")),
                    "{source:?}"
                )
            }
            other => panic!("{other:?}"),
        }
        // Huge pages or not is part of the client too.
        frontend.hugetlb = true;
        libblkio.frontend = true;
        m.disks = vec![libblkio, frontend];
        assert!(matches!(run_multi(&m), Err(LoadError::Disk { index: 1, .. })));
    }
}
