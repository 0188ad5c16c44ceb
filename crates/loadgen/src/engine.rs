//! The client loop: connect, fill every queue to depth, replace each completion with a new
//! request until the duration elapses, then drain.
//!
//! The loop, the offset generator and the accounting are shared by two back ends behind
//! [`Backend`] and [`IoQueue`]: libblkio (split virtqueues, the default) and the
//! `virtio-driver` crate used directly with packed virtqueues ([`LoadSpec::packed`]).

mod libblkio;
mod virtio;

use std::os::unix::io::RawFd;
use std::time::{Duration, Instant};

use crate::rng::SplitMix64;
use crate::{Histogram, LoadError, LoadResult, LoadSpec, Pattern};

/// Deepest queue accepted. A libblkio virtio-blk request takes three descriptors and the
/// largest virtqueue is 32768 entries.
pub(crate) const MAX_QUEUE_DEPTH: usize = 4096;

/// How long requests in flight at the end may take to complete before the run is declared
/// stuck.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Busy-poll rounds with nothing completed between two clock reads.
const IDLE_SPINS_PER_CLOCK_READ: u32 = 256;

/// Slot buffers are spaced at least this far apart (and aligned to it), so that an O_DIRECT
/// backend sees page-aligned buffers whatever the block size.
const BUF_ALIGN: usize = 4096;

/// One request slot of a queue: what was submitted and when.
#[derive(Clone, Copy)]
struct Slot {
    submitted: Instant,
    write: bool,
}

/// A completed request: the slot it was submitted with and its result (0, or a negative errno).
#[derive(Clone, Copy, Default)]
pub(crate) struct Done {
    slot: usize,
    ret: i32,
}

/// One virtqueue of a back end.
pub(crate) trait IoQueue {
    /// Queues a request for `slot` (the device may not see it before the next [`reap`]).
    ///
    /// [`reap`]: IoQueue::reap
    fn enqueue(
        &mut self,
        write: bool,
        offset: u64,
        buf: *mut u8,
        len: usize,
        slot: usize,
    ) -> Result<(), LoadError>;
    /// Notifies the device of queued requests if it asks for it, then takes up to `out.len()`
    /// completions without waiting.
    fn reap(&mut self, out: &mut [Done]) -> Result<usize, LoadError>;
    /// Turns on completion notifications and returns the fd they are signalled on.
    fn enable_completion_fd(&mut self) -> Result<RawFd, LoadError>;
}

/// A way to connect to the device.
pub(crate) trait Backend: Sized {
    type Queue: IoQueue;
    /// Connects, starts `spec.num_queues` queues and maps a buffer region of at least
    /// `buf_len` bytes.
    fn connect(spec: &LoadSpec, buf_len: usize) -> Result<Connected<Self>, LoadError>;
}

/// What [`Backend::connect`] returns.
pub(crate) struct Connected<B: Backend> {
    queues: Vec<B::Queue>,
    backend: B,
    /// The buffer region: `buf_len` bytes at `buf`, mapped read-write and shared with the device.
    buf: *mut u8,
    buf_len: usize,
    capacity: u64,
    request_alignment: u32,
}

/// The device's checks common to both back ends.
fn check_geometry(spec: &LoadSpec, request_alignment: u32, max_queues: usize) -> Result<(), LoadError> {
    if spec.block_size % request_alignment as usize != 0 {
        return Err(LoadError::InvalidSpec(format!(
            "block size {} is not a multiple of the device's request alignment {request_alignment}",
            spec.block_size
        )));
    }
    if spec.num_queues > max_queues {
        return Err(LoadError::InvalidSpec(format!(
            "{} queues requested but the device offers {max_queues}",
            spec.num_queues
        )));
    }
    Ok(())
}

/// Virtqueue entries for `queue_depth` requests: each takes three descriptors (header, data,
/// status); the default 256 unless the depth needs more.
fn queue_size_for(queue_depth: usize) -> usize {
    (queue_depth * 3).next_power_of_two().max(256)
}

struct QueueState<Q> {
    q: Q,
    slots: Box<[Slot]>,
    /// Buffer of slot 0; slot `i` uses `buf + i * stride`.
    buf: *mut u8,
    in_flight: usize,
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

/// Running totals of the measured interval.
struct Stats {
    ios: u64,
    bytes: u64,
    reads: u64,
    writes: u64,
    errors: u64,
    first_error: Option<i32>,
    hist: Histogram,
}

/// The connected device: its queues and the back end that owns them and the buffer region.
///
/// Field order matters for drop: queues go before the back end, as both libblkio and
/// virtio-driver expect.
struct Device<B: Backend> {
    queues: Vec<QueueState<B::Queue>>,
    _backend: B,
    capacity: u64,
    request_alignment: u32,
}

fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

impl<B: Backend> Device<B> {
    fn connect(spec: &LoadSpec, stride: usize) -> Result<Device<B>, LoadError> {
        let per_queue = stride * spec.queue_depth;
        let c = B::connect(spec, per_queue * spec.num_queues)?;

        // Fill the buffers with a seeded non-zero pattern so written data is not all zeroes.
        let mut rng = SplitMix64::new(spec.seed ^ 0xb0f_fe75);
        // SAFETY: the back end just mapped `buf_len` bytes at `buf` read-write in this process
        // and has not handed them to the device yet.
        let bytes = unsafe { std::slice::from_raw_parts_mut(c.buf, c.buf_len) };
        for chunk in bytes.chunks_mut(8) {
            let v = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }

        let now = Instant::now();
        let queues = c
            .queues
            .into_iter()
            .enumerate()
            .map(|(i, q)| QueueState {
                q,
                slots: vec![Slot { submitted: now, write: false }; spec.queue_depth].into_boxed_slice(),
                buf: c.buf.wrapping_add(i * per_queue),
                in_flight: 0,
            })
            .collect();
        Ok(Device {
            queues,
            _backend: c.backend,
            capacity: c.capacity,
            request_alignment: c.request_alignment,
        })
    }
}

/// An epoll instance watching the queues' completion fds.
struct Waiter {
    epfd: RawFd,
    fds: Vec<RawFd>,
    events: Vec<libc::epoll_event>,
}

impl Waiter {
    fn new<Q: IoQueue>(queues: &mut [QueueState<Q>]) -> Result<Waiter, LoadError> {
        let os = |op| move |source| LoadError::Os { op, source };
        // SAFETY: plain system call, no pointers.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(os("epoll_create1")(std::io::Error::last_os_error()));
        }
        let mut w = Waiter { epfd, fds: Vec::new(), events: Vec::new() };
        for (i, qs) in queues.iter_mut().enumerate() {
            let fd = qs.q.enable_completion_fd()?;
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: i as u64 };
            // SAFETY: `epfd` and `fd` are open descriptors; `ev` is a valid epoll_event.
            let rc = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
            if rc != 0 {
                return Err(os("epoll_ctl")(std::io::Error::last_os_error()));
            }
            w.fds.push(fd);
        }
        w.events = vec![libc::epoll_event { events: 0, u64: 0 }; w.fds.len()];
        Ok(w)
    }

    /// Sleeps until a completion fd fires or `timeout` passes, then clears the fds that fired.
    ///
    /// The caller must have drained every queue (with notifications enabled) since the last
    /// submission: a completion after that drain writes the eventfd, so it is not missed.
    fn wait(&mut self, timeout: Duration) -> Result<(), LoadError> {
        let ms = timeout.as_micros().div_ceil(1000).min(1000) as i32;
        // SAFETY: `events` has room for `events.len()` entries, the count passed.
        let n =
            unsafe { libc::epoll_wait(self.epfd, self.events.as_mut_ptr(), self.events.len() as i32, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(LoadError::Os { op: "epoll_wait", source: e });
        }
        for ev in &self.events[..n as usize] {
            let fd = self.fds[ev.u64 as usize];
            let mut val = 0u64;
            // SAFETY: `fd` is a non-blocking eventfd owned by the back end and open for the queue's
            // lifetime; `val` is 8 writable bytes. EAGAIN (already cleared) is harmless.
            unsafe { libc::read(fd, (&mut val as *mut u64).cast(), 8) };
        }
        Ok(())
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // SAFETY: `epfd` is ours and closed exactly once.
        unsafe { libc::close(self.epfd) };
    }
}

impl<Q: IoQueue> QueueState<Q> {
    #[inline]
    fn submit(
        &mut self,
        slot: usize,
        gen: &mut OpGen,
        stride: usize,
        bs: usize,
        now: Instant,
    ) -> Result<(), LoadError> {
        let (write, offset) = gen.next();
        // The slot's buffer lies inside the mapped region: slot < queue depth.
        let buf = self.buf.wrapping_add(slot * stride);
        self.slots[slot] = Slot { submitted: now, write };
        self.q.enqueue(write, offset, buf, bs, slot)?;
        self.in_flight += 1;
        Ok(())
    }
}

pub(crate) fn run_on_this_thread(spec: &LoadSpec) -> Result<LoadResult, LoadError> {
    if spec.packed {
        run::<virtio::VirtioDriver>(spec)
    } else {
        run::<libblkio::Libblkio>(spec)
    }
}

fn run<B: Backend>(spec: &LoadSpec) -> Result<LoadResult, LoadError> {
    let bs = spec.block_size;
    let stride = round_up(bs, BUF_ALIGN);
    let mut dev = Device::<B>::connect(spec, stride)?;

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
    let blocks =
        if spec.pattern.is_random() { region_len / bs as u64 } else { (region_len - bs as u64) / step + 1 };
    let mut gen = OpGen {
        pattern: spec.pattern,
        read_percent: u64::from(spec.read_percent),
        rng: SplitMix64::new(spec.seed),
        region_offset,
        blocks,
        block_size: bs as u64,
        step,
        cursor: 0,
    };
    // Requests not yet submitted (`max_ios`).
    let mut left = spec.max_ios.unwrap_or(u64::MAX);

    let mut waiter = if spec.poll_queues { None } else { Some(Waiter::new(&mut dev.queues)?) };
    let mut completions = vec![Done::default(); spec.queue_depth];
    let mut stats =
        Stats { ios: 0, bytes: 0, reads: 0, writes: 0, errors: 0, first_error: None, hist: Histogram::new() };

    let start = Instant::now();
    let deadline = start + spec.duration;
    'fill: for qs in dev.queues.iter_mut() {
        for slot in 0..spec.queue_depth {
            if left == 0 {
                break 'fill;
            }
            left -= 1;
            qs.submit(slot, &mut gen, stride, bs, start)?;
        }
    }

    // Set when the duration has elapsed: from then on nothing is submitted or counted.
    let mut stopped_at: Option<Instant> = None;
    let mut idle_spins = 0u32;
    // With `measure_busy`: time spent in passes that completed something, while counting.
    let mut busy_ns = 0u64;
    loop {
        let mut reaped = 0usize;
        let pass_start = if spec.measure_busy && stopped_at.is_none() { Some(Instant::now()) } else { None };
        for qs in dev.queues.iter_mut() {
            let n = qs.q.reap(&mut completions)?;
            if n == 0 {
                continue;
            }
            reaped += n;
            let now = Instant::now();
            let counting = stopped_at.is_none();
            if counting && now >= deadline {
                stopped_at = Some(now);
            }
            for c in &completions[..n] {
                let slot = c.slot;
                qs.in_flight -= 1;
                if !counting {
                    continue;
                }
                let s = qs.slots[slot];
                if c.ret < 0 {
                    stats.errors += 1;
                    stats.first_error.get_or_insert(c.ret);
                } else {
                    stats.ios += 1;
                    stats.bytes += bs as u64;
                    if s.write {
                        stats.writes += 1;
                    } else {
                        stats.reads += 1;
                    }
                    stats.hist.record(now.saturating_duration_since(s.submitted).as_nanos() as u64);
                }
                if stopped_at.is_none() && left > 0 {
                    left -= 1;
                    qs.submit(slot, &mut gen, stride, bs, now)?;
                }
            }
        }

        if reaped > 0 {
            idle_spins = 0;
            if let Some(t0) = pass_start {
                busy_ns += t0.elapsed().as_nanos() as u64;
            }
        } else {
            idle_spins += 1;
        }
        let in_flight: usize = dev.queues.iter().map(|q| q.in_flight).sum();
        if stopped_at.is_none() && left == 0 && in_flight == 0 {
            // Every request of `max_ios` completed (and was counted): the run ends here.
            stopped_at = Some(Instant::now());
        }
        if let Some(t) = stopped_at {
            if in_flight == 0 {
                break;
            }
            if reaped == 0 && (waiter.is_some() || idle_spins >= IDLE_SPINS_PER_CLOCK_READ) {
                idle_spins = 0;
                let waited = t.elapsed();
                if waited > DRAIN_TIMEOUT {
                    return Err(LoadError::DrainTimeout(in_flight, waited));
                }
                if let Some(w) = waiter.as_mut() {
                    w.wait(DRAIN_TIMEOUT - waited)?;
                }
            }
            continue;
        }
        if reaped == 0 {
            // Nothing completed in a full pass over the queues (each do_io also pushed out
            // what was submitted before it): check the clock, then sleep or spin on.
            if waiter.is_some() || idle_spins >= IDLE_SPINS_PER_CLOCK_READ {
                idle_spins = 0;
                let now = Instant::now();
                if now >= deadline {
                    stopped_at = Some(now);
                    continue;
                }
                if let Some(w) = waiter.as_mut() {
                    w.wait(deadline - now)?;
                }
            }
        }
    }

    let elapsed = stopped_at.map_or(spec.duration, |t| t.duration_since(start));
    let secs = elapsed.as_secs_f64().max(1e-9);
    let h = &stats.hist;
    Ok(LoadResult {
        ios: stats.ios,
        bytes: stats.bytes,
        reads: stats.reads,
        writes: stats.writes,
        elapsed,
        iops: stats.ios as f64 / secs,
        mbps: stats.bytes as f64 / secs / 1e6,
        lat_mean_ns: h.mean(),
        lat_min_ns: h.min(),
        lat_max_ns: h.max(),
        p50_ns: h.percentile(50.0),
        p99_ns: h.percentile(99.0),
        p999_ns: h.percentile(99.9),
        errors: stats.errors,
        first_error: stats.first_error,
        capacity: dev.capacity,
        request_alignment: dev.request_alignment,
        histogram: stats.hist.clone(),
        client_busy_ns: spec.measure_busy.then_some(busy_ns),
    })
}

/// Connects, starts the queues as [`run_on_this_thread`] would, then holds the connection for
/// `spec.duration` without submitting anything, and disconnects.
pub(crate) fn hold_on_this_thread(spec: &LoadSpec) -> Result<Duration, LoadError> {
    if spec.packed {
        hold::<virtio::VirtioDriver>(spec)
    } else {
        hold::<libblkio::Libblkio>(spec)
    }
}

fn hold<B: Backend>(spec: &LoadSpec) -> Result<Duration, LoadError> {
    let stride = round_up(spec.block_size, BUF_ALIGN);
    let mut dev = Device::<B>::connect(spec, stride)?;
    // Completion-fd queues are armed as for a run, so the device sees the same state.
    let _waiter = if spec.poll_queues { None } else { Some(Waiter::new(&mut dev.queues)?) };
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
    fn round_up_works() {
        assert_eq!(round_up(1, 4096), 4096);
        assert_eq!(round_up(4096, 4096), 4096);
        assert_eq!(round_up(4097, 4096), 8192);
        assert_eq!(round_up(512, 512), 512);
    }
}
