//! The client loop: connect, fill every queue to depth, replace each completion with a new
//! request until the duration elapses, then drain.
//!
//! The loop, the offset generator and the accounting are shared by three back ends behind
//! [`Backend`] and [`IoQueue`]: libblkio (split virtqueues, the default), the
//! `virtio-driver` crate used directly with packed virtqueues ([`LoadSpec::packed`]), and
//! fp-load's own vhost-user frontend with split rings, which can run with dirty logging on
//! ([`LoadSpec::frontend`], [`LoadSpec::dirty_log`]).

mod backend;
mod frontend;
mod libblkio;
mod log_sync;
mod split;
mod virtio;

use std::time::{Duration, Instant};

use fp_virtq::driver::DriverMem;

use crate::rng::SplitMix64;
use crate::verify::Verifier;
use crate::{Counts, Histogram, LoadError, LoadResult, LoadSpec, Pattern, Timeline, Wakeups};
use backend::{round_up, Backend, CompletionFd, Done, IoQueue, Req, BUF_ALIGN};

/// How long requests in flight at the end may take to complete before the run is declared
/// stuck.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The stderr line of [`LoadSpec::mark_phases`] when the measured interval starts.
pub const PHASE_MEASURING: &str = "fp-load: measuring";
/// ... and when it ends.
pub const PHASE_MEASURED: &str = "fp-load: measured";

/// Busy-poll rounds with nothing completed between two clock reads.
const IDLE_SPINS_PER_CLOCK_READ: u32 = 256;

/// One request slot of a queue: what was submitted and when.
#[derive(Clone, Copy)]
struct Slot {
    submitted: Instant,
    write: bool,
}

struct QueueState<Q> {
    q: Q,
    slots: Box<[Slot]>,
    /// The queue's buffers: slot `i`'s at `i * stride`.
    data: DriverMem,
    /// With [`LoadSpec::verify`]: a slot's block, copied out of the shared buffer to stamp or
    /// check it (the device may write shared memory at any time, so no reference is formed
    /// into it); empty without.
    scratch: Vec<u8>,
}

/// Picks the next request's direction and offset.
struct OpGen {
    pattern: Pattern,
    read_percent: u64,
    rng: SplitMix64,
    region_offset: u64,
    /// Random patterns: blocks in the region; sequential ones: request positions in it.
    blocks: u64,
    block_size: u64,
    /// Sequential patterns: bytes between consecutive positions.
    step: u64,
    /// Next position for sequential patterns, shared by all queues.
    cursor: u64,
}

impl OpGen {
    #[inline]
    fn next(&mut self) -> (bool, u64) {
        let write = match self.pattern {
            Pattern::RandRead | Pattern::Read => false,
            Pattern::RandWrite | Pattern::Write => true,
            Pattern::RandRw => self.rng.below(100) >= self.read_percent,
        };
        let at = if self.pattern.is_random() {
            self.rng.below(self.blocks) * self.block_size
        } else {
            let b = self.cursor;
            self.cursor += 1;
            if self.cursor == self.blocks {
                self.cursor = 0;
            }
            b * self.step
        };
        (write, self.region_offset + at)
    }
}

/// Running totals of the measured interval (`counts.elapsed` is set at the end).
struct Stats {
    counts: Counts,
    hist: Histogram,
}

/// The connected device: its queues and the back end that owns them and the buffer region.
///
/// Field order matters for drop: queues go before the back end, as both libblkio and
/// virtio-driver expect.
struct Device<B: Backend> {
    queues: Vec<QueueState<B::Queue>>,
    backend: B,
    capacity: u64,
    request_alignment: u32,
}

impl<B: Backend> Device<B> {
    fn connect(spec: &LoadSpec, stride: usize) -> Result<Device<B>, LoadError> {
        let per_queue = stride * spec.queue_depth;
        let c = B::connect(spec, per_queue * spec.num_queues)?;

        // Fill the buffers with a seeded non-zero pattern so written data is not all zeroes.
        let mut rng = SplitMix64::new(spec.seed ^ 0xb0f_fe75);
        let mut chunk = vec![0u8; 64 * 1024];
        for at in (0..c.data.len()).step_by(chunk.len()) {
            let n = chunk.len().min(c.data.len() - at);
            for word in chunk[..n].chunks_mut(8) {
                let v = rng.next_u64().to_le_bytes();
                word.copy_from_slice(&v[..word.len()]);
            }
            c.data.write_bytes(at, &chunk[..n]);
        }

        let now = Instant::now();
        let queues = c
            .queues
            .into_iter()
            .enumerate()
            .map(|(i, q)| QueueState {
                q,
                slots: vec![Slot { submitted: now, write: false }; spec.queue_depth].into_boxed_slice(),
                data: c.data.sub(i * per_queue, per_queue),
                scratch: if spec.verify { vec![0; spec.block_size] } else { Vec::new() },
            })
            .collect();
        Ok(Device {
            queues,
            backend: c.backend,
            capacity: c.capacity,
            request_alignment: c.request_alignment,
        })
    }
}

/// The queues' completion fds, waited for with `poll(2)`.
struct Waiter {
    fds: Vec<CompletionFd>,
    polled: Vec<libc::pollfd>,
    counts: Wakeups,
}

impl Waiter {
    fn new<'a, Q: IoQueue + 'a>(
        queues: impl Iterator<Item = &'a mut QueueState<Q>>,
    ) -> Result<Waiter, LoadError> {
        let fds = queues.map(|qs| qs.q.enable_completion_fd()).collect::<Result<Vec<_>, _>>()?;
        let polled =
            fds.iter().map(|fd| libc::pollfd { fd: fd.raw(), events: libc::POLLIN, revents: 0 }).collect();
        Ok(Waiter { fds, polled, counts: Wakeups::default() })
    }

    /// Sleeps until a completion fd fires or `timeout` passes, then clears the fds that fired.
    ///
    /// The caller must have drained every queue (with notifications enabled) since the last
    /// submission: a completion after that drain writes the eventfd, so it is not missed.
    fn wait(&mut self, timeout: Duration) -> Result<(), LoadError> {
        let timeout = timeout.min(Duration::from_secs(1));
        let n = match fp_sys::poll(&mut self.polled, Some(timeout)) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(LoadError::Os { op: "poll", source: e }),
        };
        if n > 0 {
            self.counts.wakeups += 1;
        }
        for (p, fd) in self.polled.iter_mut().zip(&self.fds) {
            if std::mem::take(&mut p.revents) != 0 {
                // A failed clear only makes the next wait return at once.
                self.counts.notifications += fd.clear().unwrap_or(0);
            }
        }
        Ok(())
    }
}

impl<Q: IoQueue> QueueState<Q> {
    /// Submits slot `slot`'s next request; with `verify`, at a block of the verifier's choice
    /// for the disk-wide slot `global`, and a write's data stamped.
    #[inline]
    fn submit(
        &mut self,
        slot: usize,
        gen: &mut OpGen,
        verify: Option<(&mut Verifier, usize)>,
        stride: usize,
        bs: usize,
        now: Instant,
    ) -> Result<(), LoadError> {
        let (write, mut offset) = gen.next();
        let at = slot * stride;
        if let Some((v, global)) = verify {
            // The slot has no request in flight, so the device does not touch its buffer now.
            let block = &mut self.scratch[..bs];
            self.data.read_bytes(at, block);
            offset = v.submit(global, write, block);
            self.data.write_bytes(at, block);
        }
        self.slots[slot] = Slot { submitted: now, write };
        self.q.enqueue(Req { write, offset, buf: self.data.addr_of(at), len: bs, slot })
    }
}

pub(crate) fn run_on_this_thread(spec: &LoadSpec) -> Result<LoadResult, LoadError> {
    let (mut results, busy) = run_disks_on_this_thread(std::slice::from_ref(spec), None)?;
    let mut r = results.pop().expect("one result per disk");
    r.client_busy_ns = busy.busy_ns;
    r.wakeups = busy.wakeups;
    Ok(r)
}

/// How the client threads of a run with one thread per disk start together: every thread
/// connects, then waits at `barrier`; if any failed to connect (`failed`), the others give up.
pub(crate) struct StartLine<'a> {
    pub(crate) barrier: &'a std::sync::Barrier,
    pub(crate) failed: &'a std::sync::atomic::AtomicBool,
}

/// What one client thread measured: each disk's result, in order, without
/// `client_busy_ns` and `wakeups`, and the thread's own figures.
pub(crate) type ThreadResults = (Vec<LoadResult>, ThreadCounts);

/// What a client thread measured for all its disks together.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ThreadCounts {
    /// With `measure_busy`: the thread's busy time, ns.
    pub(crate) busy_ns: Option<u64>,
    /// With completion fds: its sleeps, up to the end of the measured interval.
    pub(crate) wakeups: Option<Wakeups>,
}

/// Runs `specs` (one per disk) from this thread in one loop, all for `specs[0].duration`
/// with `specs[0]`'s completion mode, back end and busy measurement (the callers make these
/// the same for every disk). With `start`, waits there after connecting.
pub(crate) fn run_disks_on_this_thread(
    specs: &[LoadSpec],
    start: Option<StartLine<'_>>,
) -> Result<ThreadResults, LoadError> {
    if specs[0].packed {
        run::<virtio::VirtioDriver>(specs, start)
    } else if specs[0].frontend || specs[0].dirty_log {
        run::<frontend::VhostFrontend>(specs, start)
    } else {
        run::<libblkio::Libblkio>(specs, start)
    }
}

/// When the requests of a disk with a rate are due.
struct Pacer {
    rate: u64,
    /// Requests submitted so far.
    issued: u64,
    start: Instant,
}

impl Pacer {
    /// When request number `issued` is due.
    fn due(&self) -> Instant {
        self.start
            + Duration::from_nanos((u128::from(self.issued) * 1_000_000_000 / u128::from(self.rate)) as u64)
    }
}

/// One disk of a run: its device, where its requests go, and what it measured.
struct Disk<B: Backend> {
    dev: Device<B>,
    gen: OpGen,
    bs: usize,
    /// Bytes between two slots' buffers.
    stride: usize,
    queue_depth: usize,
    /// Requests not yet submitted (`max_ios`).
    left: u64,
    in_flight: usize,
    /// With `rate_iops`: when each request is due.
    pacer: Option<Pacer>,
    /// With `rate_iops`: free slots (queue, slot) whose next request is not due yet;
    /// preallocated for every slot.
    waiting: Vec<(usize, usize)>,
    stats: Stats,
    /// With [`LoadSpec::timeline`]: completions per interval since `started`.
    timeline: Option<Timeline>,
    /// With [`LoadSpec::verify`]: which blocks each slot uses and what they should hold.
    verify: Option<Verifier>,
    /// When the measured run started (set by `fill`).
    started: Instant,
    /// Set when the duration has elapsed or `max_ios` requests completed: from then on
    /// nothing is submitted or counted for this disk.
    stopped_at: Option<Instant>,
}

impl<B: Backend> Disk<B> {
    fn open(spec: &LoadSpec) -> Result<Disk<B>, LoadError> {
        let bs = spec.block_size;
        let stride = round_up(bs, BUF_ALIGN);
        let dev = Device::<B>::connect(spec, stride)?;

        let (region_offset, region_len) = match spec.region {
            Some(r) => (r.offset, r.len),
            None => (0, dev.capacity),
        };
        let align = u64::from(dev.request_alignment);
        if region_offset % align != 0 {
            return Err(LoadError::InvalidSpec(format!(
                "region offset {region_offset} is not a multiple of the request alignment {align}"
            )));
        }
        let end = region_offset.checked_add(region_len);
        if end.is_none_or(|e| e > dev.capacity) {
            return Err(LoadError::InvalidSpec(format!(
                "region {region_offset}+{region_len} runs past the device's {} bytes",
                dev.capacity
            )));
        }
        if region_len < bs as u64 {
            return Err(LoadError::InvalidSpec(format!(
                "the region ({region_len} bytes) holds no {bs}-byte block"
            )));
        }
        let step = spec.stride.unwrap_or(bs as u64);
        // Random: any whole block; sequential: every `step` bytes while a request still fits.
        let blocks = if spec.pattern.is_random() {
            region_len / bs as u64
        } else {
            (region_len - bs as u64) / step + 1
        };
        let verify = if spec.verify {
            let unit = if spec.pattern.is_random() { bs as u64 } else { step };
            let slots = spec.queue_depth * spec.num_queues;
            let v = Verifier::new(region_offset, unit, blocks, slots, spec.pattern.is_random(), spec.seed);
            Some(v.map_err(LoadError::InvalidSpec)?)
        } else {
            None
        };
        let gen = OpGen {
            pattern: spec.pattern,
            read_percent: u64::from(spec.read_percent),
            rng: SplitMix64::new(spec.seed),
            region_offset,
            blocks,
            block_size: bs as u64,
            step,
            cursor: 0,
        };
        Ok(Disk {
            dev,
            gen,
            bs,
            stride,
            queue_depth: spec.queue_depth,
            left: spec.max_ios.unwrap_or(u64::MAX),
            in_flight: 0,
            pacer: spec.rate_iops.map(|rate| Pacer { rate, issued: 0, start: Instant::now() }),
            waiting: Vec::with_capacity(if spec.rate_iops.is_some() {
                spec.queue_depth * spec.num_queues
            } else {
                0
            }),
            stats: Stats { counts: Counts::default(), hist: Histogram::new() },
            timeline: spec.timeline.map(|step| Timeline::new(step, spec.duration)),
            verify,
            started: Instant::now(),
            stopped_at: None,
        })
    }

    /// Fills every queue to depth (or to `max_ios`); with a rate, every slot waits for its
    /// request's turn instead (the first is due at once).
    fn fill(&mut self, now: Instant) -> Result<(), LoadError> {
        self.started = now;
        if let Some(p) = self.pacer.as_mut() {
            p.start = now;
            for q in (0..self.dev.queues.len()).rev() {
                self.waiting.extend((0..self.queue_depth).rev().map(|slot| (q, slot)));
            }
            return self.release_due(now);
        }
        for (q, qs) in self.dev.queues.iter_mut().enumerate() {
            for slot in 0..self.queue_depth {
                if self.left == 0 {
                    return Ok(());
                }
                self.left -= 1;
                let verify = self.verify.as_mut().map(|v| (v, q * self.queue_depth + slot));
                qs.submit(slot, &mut self.gen, verify, self.stride, self.bs, now)?;
                self.in_flight += 1;
            }
        }
        Ok(())
    }

    /// With a rate: submits from the waiting slots every request due by `now`.
    fn release_due(&mut self, now: Instant) -> Result<(), LoadError> {
        let Some(p) = self.pacer.as_mut() else { return Ok(()) };
        while self.stopped_at.is_none() && self.left > 0 && p.due() <= now {
            let Some((q, slot)) = self.waiting.pop() else { break };
            self.left -= 1;
            p.issued += 1;
            let verify = self.verify.as_mut().map(|v| (v, q * self.queue_depth + slot));
            self.dev.queues[q].submit(slot, &mut self.gen, verify, self.stride, self.bs, now)?;
            self.in_flight += 1;
        }
        Ok(())
    }

    /// When this disk next has something to submit, if it waits for a rate.
    fn next_due(&self) -> Option<Instant> {
        let p = self.pacer.as_ref()?;
        (self.stopped_at.is_none() && self.left > 0 && !self.waiting.is_empty()).then(|| p.due())
    }

    /// One pass over the disk's queues: accounts for what completed and, while the disk runs,
    /// replaces each completion with a new request in the same slot. Returns how many
    /// requests completed.
    #[inline]
    fn pass(&mut self, completions: &mut [Done], deadline: Instant) -> Result<usize, LoadError> {
        let mut reaped = 0usize;
        let bs = self.bs;
        if self.pacer.is_some() && !self.waiting.is_empty() {
            // First, so that the reaps below push what is released to the device before the
            // loop may sleep.
            self.release_due(Instant::now())?;
        }
        for (q, qs) in self.dev.queues.iter_mut().enumerate() {
            let n = qs.q.reap(completions)?;
            if n == 0 {
                continue;
            }
            reaped += n;
            self.in_flight -= n;
            let now = Instant::now();
            let counting = self.stopped_at.is_none();
            if counting && now >= deadline {
                self.stopped_at = Some(now);
            }
            if !counting {
                continue;
            }
            let (stats, hist) = (&mut self.stats.counts, &mut self.stats.hist);
            let ios_before = stats.ios;
            for c in &completions[..n] {
                let slot = c.slot;
                let s = qs.slots[slot];
                let global = q * self.queue_depth + slot;
                let ret = match self.verify.as_mut() {
                    Some(v) => {
                        // The slot's request completed, so the device no longer writes it.
                        let data = &mut qs.scratch[..bs];
                        qs.data.read_bytes(slot * self.stride, data);
                        // A read that did not return the block's last write is an error too.
                        if v.complete(global, c.ret >= 0, data) {
                            c.ret
                        } else {
                            -libc::EILSEQ
                        }
                    }
                    None => c.ret,
                };
                if ret < 0 {
                    stats.errors += 1;
                    stats.first_error.get_or_insert(ret);
                } else {
                    stats.ios += 1;
                    stats.bytes += bs as u64;
                    if s.write {
                        stats.writes += 1;
                    } else {
                        stats.reads += 1;
                    }
                    hist.record(now.saturating_duration_since(s.submitted).as_nanos() as u64);
                }
                if self.stopped_at.is_none() && self.left > 0 {
                    if self.pacer.is_some() {
                        // Submitted by `release_due` when its turn comes.
                        self.waiting.push((q, slot));
                        continue;
                    }
                    self.left -= 1;
                    let verify = self.verify.as_mut().map(|v| (v, global));
                    qs.submit(slot, &mut self.gen, verify, self.stride, bs, now)?;
                    self.in_flight += 1;
                }
            }
            if let Some(t) = self.timeline.as_mut() {
                t.record(now.saturating_duration_since(self.started), self.stats.counts.ios - ios_before);
            }
        }

        if self.stopped_at.is_none() && self.left == 0 && self.in_flight == 0 {
            // Every request of `max_ios` completed (and was counted): the disk is done.
            self.stopped_at = Some(Instant::now());
        }
        Ok(reaped)
    }

    fn result(mut self, start: Instant, duration: Duration) -> LoadResult {
        let dirty_log = self.dev.backend.dirty_log();
        let Stats { mut counts, hist } = self.stats;
        counts.elapsed = self.stopped_at.map_or(duration, |t| t.duration_since(start));
        let mut r = LoadResult::from_counts(counts, hist, self.dev.capacity, self.dev.request_alignment);
        r.timeline = self.timeline;
        r.dirty_log = dirty_log;
        r.hugetlb = self.dev.backend.hugetlb();
        r.kicks = self.dev.queues.iter().map(|q| q.q.kicks()).sum();
        r.verify = self.verify.as_ref().map(Verifier::report);
        r
    }
}

/// The order of one thread's passes over its disks: each pass starts one disk further than the
/// last, as a reactor's rounds do. A fixed order was the measurement's, not the device's: the
/// last disks of every pass got up to 13 % fewer I/Os than the best placed ones against one
/// server core (16 disks at QD 8; reversing the disks' order moved the deficit with it), because
/// whatever the device has not finished when the pass comes round again is always theirs
/// (docs/architecture.md, "Many queues on one reactor").
#[derive(Debug, Default)]
struct PassOrder {
    /// The disk the next pass starts with.
    first: usize,
}

impl PassOrder {
    /// The disks of the next pass over `n`, in the order it serves them.
    #[inline]
    fn next_pass(&mut self, n: usize) -> impl Iterator<Item = usize> {
        let first = if self.first < n { self.first } else { 0 };
        self.first = first + 1;
        (first..n).chain(0..first)
    }
}

/// `error` as the error of disk `index` (a run of several disks says whose an error is;
/// the multi-disk runner tags its own errors with it too).
pub(crate) fn disk_error(index: usize, spec: &LoadSpec, error: LoadError) -> LoadError {
    match error {
        LoadError::Disk { .. } => error,
        e => LoadError::Disk { index, socket: spec.socket.display().to_string(), source: Box::new(e) },
    }
}

fn run<B: Backend>(
    specs: &[LoadSpec],
    start_line: Option<StartLine<'_>>,
) -> Result<ThreadResults, LoadError> {
    let first = &specs[0];
    // With several disks, an error says whose it is.
    let tag = |i: usize| move |e| if specs.len() > 1 { disk_error(i, &specs[i], e) } else { e };
    let opened: Result<Vec<Disk<B>>, LoadError> =
        specs.iter().enumerate().map(|(i, s)| Disk::<B>::open(s).map_err(tag(i))).collect();
    if let Some(line) = start_line {
        if opened.is_err() {
            line.failed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        line.barrier.wait();
        if opened.is_ok() && line.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LoadError::Cancelled);
        }
    }
    let mut disks = opened?;

    let mut waiter = if first.poll_queues {
        None
    } else {
        Some(Waiter::new(disks.iter_mut().flat_map(|d| d.dev.queues.iter_mut()))?)
    };
    let depth = disks.iter().map(|d| d.queue_depth).max().unwrap_or(1);
    let mut completions = vec![Done::default(); depth];

    let start = Instant::now();
    let deadline = start + first.duration;
    for (i, d) in disks.iter_mut().enumerate() {
        d.fill(start).map_err(tag(i))?;
    }
    if first.mark_phases {
        eprintln!("{PHASE_MEASURING}");
    }
    let mut end_marked = false;

    // Disks still submitting and counting.
    let mut running = disks.len();
    // The waiter's counts when the last disk stopped counting (the drain left out).
    let mut wakeups: Option<Wakeups> = None;
    let mut idle_spins = 0u32;
    // With `measure_busy`: time spent in passes that completed something, while counting.
    let mut busy_ns = 0u64;
    let mut order = PassOrder::default();
    loop {
        let pass_start = if first.measure_busy && running > 0 { Some(Instant::now()) } else { None };
        let mut reaped = 0usize;
        for i in order.next_pass(disks.len()) {
            reaped += disks[i].pass(&mut completions, deadline).map_err(tag(i))?;
        }

        if reaped > 0 {
            idle_spins = 0;
            if let Some(t0) = pass_start {
                busy_ns += t0.elapsed().as_nanos() as u64;
            }
        } else {
            idle_spins += 1;
        }
        let mut in_flight = 0;
        let mut last_stop: Option<Instant> = None;
        running = 0;
        for d in &disks {
            in_flight += d.in_flight;
            match d.stopped_at {
                None => running += 1,
                Some(t) => last_stop = last_stop.max(Some(t)),
            }
        }
        if running == 0 {
            if wakeups.is_none() {
                wakeups = waiter.as_ref().map(|w| w.counts);
            }
            if first.mark_phases && !end_marked {
                end_marked = true;
                eprintln!("{PHASE_MEASURED}");
            }
            if in_flight == 0 {
                break;
            }
            if reaped == 0 && (waiter.is_some() || idle_spins >= IDLE_SPINS_PER_CLOCK_READ) {
                idle_spins = 0;
                let waited = last_stop.map_or(Duration::ZERO, |t| t.elapsed());
                if waited > DRAIN_TIMEOUT {
                    return Err(LoadError::DrainTimeout(in_flight, waited));
                }
                if let Some(w) = waiter.as_mut() {
                    w.wait(DRAIN_TIMEOUT - waited)?;
                }
            }
            continue;
        }
        if reaped == 0 && (waiter.is_some() || idle_spins >= IDLE_SPINS_PER_CLOCK_READ) {
            // Nothing completed in a full pass over the queues (each do_io also pushed out
            // what was submitted before it): check the clock, then sleep or spin on.
            idle_spins = 0;
            let now = Instant::now();
            if now >= deadline {
                for d in disks.iter_mut() {
                    d.stopped_at.get_or_insert(now);
                }
                continue;
            }
            // A disk with a rate may have a request due before then.
            let wake = disks.iter().filter_map(Disk::next_due).min().map_or(deadline, |t| t.min(deadline));
            if let Some(w) = waiter.as_mut() {
                w.wait(wake.saturating_duration_since(now))?;
            }
        }
    }

    let results = disks.into_iter().map(|d| d.result(start, first.duration)).collect();
    Ok((results, ThreadCounts { busy_ns: first.measure_busy.then_some(busy_ns), wakeups }))
}

/// Connects, starts the queues as [`run_on_this_thread`] would, then holds the connection for
/// `spec.duration` without submitting anything, and disconnects.
pub(crate) fn hold_on_this_thread(spec: &LoadSpec) -> Result<Duration, LoadError> {
    if spec.packed {
        hold::<virtio::VirtioDriver>(spec)
    } else if spec.frontend || spec.dirty_log {
        hold::<frontend::VhostFrontend>(spec)
    } else {
        hold::<libblkio::Libblkio>(spec)
    }
}

fn hold<B: Backend>(spec: &LoadSpec) -> Result<Duration, LoadError> {
    let stride = round_up(spec.block_size, BUF_ALIGN);
    let mut dev = Device::<B>::connect(spec, stride)?;
    // Completion-fd queues are armed as for a run, so the device sees the same state.
    let _waiter = if spec.poll_queues { None } else { Some(Waiter::new(dev.queues.iter_mut())?) };
    let start = Instant::now();
    std::thread::sleep(spec.duration);
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(pattern: Pattern, blocks: u64) -> OpGen {
        OpGen {
            pattern,
            read_percent: 70,
            rng: SplitMix64::new(5),
            region_offset: 1 << 20,
            blocks,
            block_size: 4096,
            step: 4096,
            cursor: 0,
        }
    }

    #[test]
    fn a_stride_spaces_sequential_offsets() {
        let mut g = OpGen { step: 1 << 20, ..gen(Pattern::Write, 3) };
        let got: Vec<u64> = (0..4).map(|_| g.next().1).collect();
        let base = 1u64 << 20;
        assert_eq!(got, vec![base, base + (1 << 20), base + (2 << 20), base]);
    }

    #[test]
    fn sequential_offsets_wrap_inside_the_region() {
        let mut g = gen(Pattern::Write, 3);
        let got: Vec<(bool, u64)> = (0..7).map(|_| g.next()).collect();
        let base = 1u64 << 20;
        let want: Vec<(bool, u64)> = [0, 1, 2, 0, 1, 2, 0].iter().map(|b| (true, base + b * 4096)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn random_offsets_are_aligned_and_in_range() {
        let mut g = gen(Pattern::RandRead, 1000);
        for _ in 0..10_000 {
            let (w, off) = g.next();
            assert!(!w);
            assert!(off >= 1 << 20);
            assert!(off < (1 << 20) + 1000 * 4096);
            assert_eq!(off % 4096, 0);
        }
    }

    #[test]
    fn randrw_mix_follows_read_percent() {
        let mut g = gen(Pattern::RandRw, 1000);
        let writes = (0..100_000).filter(|_| g.next().0).count();
        // 30 % writes, within 1 percentage point.
        assert!((29_000..31_000).contains(&writes), "{writes} writes of 100000");
    }

    #[test]
    fn each_pass_starts_one_disk_further() {
        let mut order = PassOrder::default();
        let passes: Vec<Vec<usize>> = (0..4).map(|_| order.next_pass(3).collect()).collect();
        assert_eq!(passes, vec![vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1], vec![0, 1, 2]]);
        // Fewer disks than where the next pass would start: it starts again at the first.
        let mut order = PassOrder { first: 2 };
        assert_eq!(order.next_pass(2).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(order.next_pass(1).collect::<Vec<_>>(), vec![0]);
    }

    /// 16 disks at QD 8 against a model of a device that cannot keep up: per pass it completes
    /// 120 requests of the 128 the client offers, taking them queue by queue in the order the
    /// pass made them available (a server that follows the client). Whoever comes last in the
    /// pass waits, and with a fixed order that was always the same disk (it got nothing). Each
    /// pass starting one disk further, no disk gets more than one queue depth more than another
    /// over the run, whatever its place.
    #[test]
    fn a_device_slower_than_the_client_serves_every_disk_alike() {
        const DISKS: usize = 16;
        const QD: u64 = 8;
        const PER_PASS: u64 = 120;
        const PASSES: usize = 1600;
        let mut order = PassOrder::default();
        // Per disk: available to the device, completed and not yet reaped, and reaped.
        let (mut waiting, mut done, mut reaped) = ([QD; DISKS], [0u64; DISKS], [0u64; DISKS]);
        for _ in 0..PASSES {
            let pass: Vec<usize> = order.next_pass(DISKS).collect();
            for &i in &pass {
                // The client reaps what completed and resubmits as many.
                reaped[i] += done[i];
                waiting[i] += std::mem::take(&mut done[i]);
            }
            let mut left = PER_PASS;
            for &i in &pass {
                let served = waiting[i].min(left);
                waiting[i] -= served;
                done[i] += served;
                left -= served;
            }
        }
        let (min, max) = (*reaped.iter().min().unwrap(), *reaped.iter().max().unwrap());
        assert!(min > 0 && max - min <= QD, "per-disk completions {reaped:?}");
        assert!(reaped.iter().sum::<u64>() >= PER_PASS * (PASSES as u64 - 1), "the device was kept busy");
    }

    #[test]
    fn a_pacer_spaces_requests_evenly_from_the_start() {
        let start = Instant::now();
        let mut p = Pacer { rate: 4000, issued: 0, start };
        let mut due = Vec::new();
        for n in [0, 1, 2, 3999, 4000, 12_000] {
            p.issued = n;
            due.push(p.due() - start);
        }
        let us = Duration::from_micros;
        assert_eq!(due, vec![us(0), us(250), us(500), us(999_750), us(1_000_000), us(3_000_000)]);
        // A rate that does not divide a second: due times round down, never drift.
        let p = Pacer { rate: 3, issued: 3_000_000, start };
        assert_eq!(p.due() - start, Duration::from_secs(1_000_000));
    }
}
