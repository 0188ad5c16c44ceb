//! Reactors: the polled, per-core event loops that run flashpath's data path.
//!
//! A [`Reactor`] is a plain object: a list of [`Poller`]s, an inbox of messages, and the adaptive
//! polling state. It has no thread of its own; [`Reactor::poll_once`] runs one round. That keeps
//! the scheduling library apart from core placement (as SPDK separates `spdk_thread` from its
//! reactors): [`ReactorSet`] puts one reactor on each listed core, pinned, and loops it; tests
//! step several reactors on one OS thread, deterministically.
//!
//! Rules the data path relies on:
//! * pollers report whether they did work ([`PollStatus`]);
//! * other threads reach a reactor only through [`ReactorHandle::send`], a lock-free queue plus an
//!   eventfd wake-up; the message runs on the reactor with `&mut Reactor`;
//! * a reactor busy-polls while any poller has work pending or did work within the idle window,
//!   then asks every poller to re-arm its notifications and sleeps in `epoll_wait` on their fds
//!   and its inbox. Both phases are counted in [`ReactorStats`].

use std::any::Any;
use std::io;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// What a poller did in one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollStatus {
    /// It did some work (moved a request, reaped a completion, ...).
    Busy,
    /// It found nothing to do.
    Idle,
    /// It is done for good: the reactor drops it.
    Finished,
}

/// A unit of work a reactor calls every round.
///
/// Pollers are core-local: they are built elsewhere from `Send` parts and constructed on their
/// reactor by a message, so they need not be `Send` themselves.
pub trait Poller: Any {
    /// Does whatever work is ready, without blocking.
    fn poll(&mut self) -> PollStatus;

    /// Work outstanding that will complete without a wake-up (I/O in flight on a polled backend):
    /// the reactor never sleeps while a poller says so.
    fn has_pending(&self) -> bool {
        false
    }

    /// Re-arms notifications before the reactor sleeps. Returns `false` when work turned up while
    /// re-arming, in which case the reactor does not sleep.
    fn prepare_sleep(&mut self) -> bool {
        true
    }

    /// Called after the reactor wakes (or gives up on sleeping): drain wake-up fds, turn
    /// notifications off again.
    fn after_wake(&mut self) {}

    /// File descriptors whose readability should wake the reactor while it sleeps. Asked once,
    /// when the poller is added.
    fn wake_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    /// How long this poller wants the reactor to keep polling after the last work before it
    /// sleeps; `None` for the reactor's configured window. A poller whose work comes back from
    /// far away (a Ceph cluster answers in milliseconds, through an fd) asks for less: spinning
    /// through such waits would burn a core per disk for nothing. The reactor keeps the longest
    /// window any of its pollers wants, never longer than its configured one.
    fn idle_window(&self) -> Option<Duration> {
        None
    }
}

/// Identifies a poller on its reactor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PollerId(u64);

/// A message: a closure run on the reactor.
pub type Message = Box<dyn FnOnce(&mut Reactor) + Send>;

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct ReactorConfig {
    /// How long a reactor keeps busy-polling after it last did work, before it sleeps.
    pub idle_window: Duration,
}

/// The default idle window. See docs/architecture.md ("Adaptive polling") for the measurement
/// behind it: long enough that a guest's next request at queue depth 1 almost always arrives
/// while the reactor still polls, short enough that an idle disk costs nothing measurable.
pub const DEFAULT_IDLE_WINDOW: Duration = Duration::from_micros(200);

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig { idle_window: DEFAULT_IDLE_WINDOW }
    }
}

/// Counters a reactor publishes for the control plane (single writer, relaxed atomics).
#[derive(Debug, Default)]
pub struct ReactorStats {
    /// Nanoseconds spent in rounds where some poller did work.
    pub busy_ns: AtomicU64,
    /// Nanoseconds spent polling without finding work.
    pub idle_ns: AtomicU64,
    /// Nanoseconds spent asleep in epoll.
    pub sleep_ns: AtomicU64,
    /// Rounds run.
    pub rounds: AtomicU64,
    /// Times the reactor went to sleep.
    pub sleeps: AtomicU64,
    /// Messages processed.
    pub messages: AtomicU64,
    /// Pollers currently registered.
    pub pollers: AtomicU64,
    /// True while asleep.
    pub sleeping: AtomicBool,
    /// When the current sleep began ([`mono_ns`]), or 0 while awake; lets a snapshot count a
    /// sleep that is still going on.
    pub sleep_since_ns: AtomicU64,
}

/// Nanoseconds on a process-wide monotonic clock (for timestamps shared between threads).
pub fn mono_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    // Never 0, so 0 can mean "no timestamp".
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

impl ReactorStats {
    pub fn snapshot(&self) -> ReactorStatsSnapshot {
        ReactorStatsSnapshot {
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            idle_ns: self.idle_ns.load(Ordering::Relaxed),
            sleep_ns: self.sleep_ns.load(Ordering::Relaxed) + {
                // A sleep in progress counts up to now; it is added for good when it ends.
                let since = self.sleep_since_ns.load(Ordering::Relaxed);
                if since == 0 {
                    0
                } else {
                    mono_ns().saturating_sub(since)
                }
            },
            rounds: self.rounds.load(Ordering::Relaxed),
            sleeps: self.sleeps.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
            pollers: self.pollers.load(Ordering::Relaxed),
            sleeping: self.sleeping.load(Ordering::Relaxed),
        }
    }
}

/// A plain copy of [`ReactorStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReactorStatsSnapshot {
    pub busy_ns: u64,
    pub idle_ns: u64,
    pub sleep_ns: u64,
    pub rounds: u64,
    pub sleeps: u64,
    pub messages: u64,
    pub pollers: u64,
    pub sleeping: bool,
}

struct Inbox {
    queue: SegQueue<Message>,
    wake: EventFd,
}

/// A `Send + Clone` handle for messaging a reactor from any thread.
#[derive(Clone)]
pub struct ReactorHandle {
    id: usize,
    core: Option<usize>,
    inbox: Arc<Inbox>,
    stats: Arc<ReactorStats>,
}

impl ReactorHandle {
    /// The reactor's index in its set.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The CPU the reactor is pinned to, if any.
    pub fn core(&self) -> Option<usize> {
        self.core
    }

    pub fn stats(&self) -> &Arc<ReactorStats> {
        &self.stats
    }

    /// Queues `f` to run on the reactor and wakes it.
    pub fn send(&self, f: impl FnOnce(&mut Reactor) + Send + 'static) {
        self.inbox.queue.push(Box::new(f));
        // A failed write means the counter is saturated, which already wakes the reactor.
        let _ = self.inbox.wake.write(1);
    }

    /// Runs `f` on the reactor and waits for its result. Control plane only: it blocks.
    /// Returns `None` if the reactor is gone.
    pub fn call<R: Send + 'static>(&self, f: impl FnOnce(&mut Reactor) -> R + Send + 'static) -> Option<R> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.send(move |r| {
            let _ = tx.send(f(r));
        });
        rx.recv().ok()
    }
}

struct Slot {
    id: PollerId,
    poller: Box<dyn Poller>,
    fds: Vec<RawFd>,
}

/// One polled event loop. See the module docs.
pub struct Reactor {
    id: usize,
    core: Option<usize>,
    config: ReactorConfig,
    pollers: Vec<Slot>,
    next_poller: u64,
    inbox: Arc<Inbox>,
    epoll: Epoll,
    stats: Arc<ReactorStats>,
    last_tick: Instant,
    last_work: Instant,
    last_round_busy: bool,
    stop: bool,
}

const INBOX_TOKEN: u64 = u64::MAX;

impl Reactor {
    pub fn new(id: usize, core: Option<usize>, config: ReactorConfig) -> io::Result<Reactor> {
        let inbox = Arc::new(Inbox { queue: SegQueue::new(), wake: EventFd::new(EFD_NONBLOCK)? });
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            inbox.wake.as_raw_fd_checked(),
            EpollEvent::new(EventSet::IN, INBOX_TOKEN),
        )?;
        let now = Instant::now();
        Ok(Reactor {
            id,
            core,
            config,
            pollers: Vec::new(),
            next_poller: 0,
            inbox,
            epoll,
            stats: Arc::new(ReactorStats::default()),
            last_tick: now,
            last_work: now,
            last_round_busy: true,
            stop: false,
        })
    }

    pub fn id(&self) -> usize {
        self.id
    }

    pub fn core(&self) -> Option<usize> {
        self.core
    }

    pub fn handle(&self) -> ReactorHandle {
        ReactorHandle { id: self.id, core: self.core, inbox: self.inbox.clone(), stats: self.stats.clone() }
    }

    pub fn stats(&self) -> &Arc<ReactorStats> {
        &self.stats
    }

    /// Registers a poller; it runs from the next round on.
    pub fn add_poller(&mut self, poller: Box<dyn Poller>) -> PollerId {
        let id = PollerId(self.next_poller);
        self.next_poller += 1;
        let fds = poller.wake_fds();
        for &fd in &fds {
            if let Err(e) = self.epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, id.0)) {
                log::warn!("reactor {}: cannot watch fd {fd}: {e}", self.id);
            }
        }
        self.pollers.push(Slot { id, poller, fds });
        self.stats.pollers.store(self.pollers.len() as u64, Ordering::Relaxed);
        id
    }

    /// Unregisters a poller and hands it back (downcast it with `Box<dyn Any>::downcast`).
    pub fn remove_poller(&mut self, id: PollerId) -> Option<Box<dyn Poller>> {
        let pos = self.pollers.iter().position(|s| s.id == id)?;
        let slot = self.pollers.remove(pos);
        self.unwatch(&slot.fds);
        self.stats.pollers.store(self.pollers.len() as u64, Ordering::Relaxed);
        Some(slot.poller)
    }

    /// Mutable access to a registered poller of a known type.
    pub fn poller_mut<T: Poller>(&mut self, id: PollerId) -> Option<&mut T> {
        let slot = self.pollers.iter_mut().find(|s| s.id == id)?;
        let any: &mut dyn Any = slot.poller.as_mut();
        any.downcast_mut::<T>()
    }

    pub fn poller_count(&self) -> usize {
        self.pollers.len()
    }

    /// Makes [`Reactor::run`] return after the current round.
    pub fn request_stop(&mut self) {
        self.stop = true;
    }

    pub fn stop_requested(&self) -> bool {
        self.stop
    }

    fn unwatch(&self, fds: &[RawFd]) {
        for &fd in fds {
            // The fd may already be closed by its owner; nothing else to do then.
            let _ = self.epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
    }

    /// Runs queued messages. Returns how many ran.
    fn drain_inbox(&mut self) -> usize {
        let mut n = 0;
        while let Some(msg) = self.inbox.queue.pop() {
            msg(self);
            n += 1;
        }
        if n > 0 {
            self.stats.messages.fetch_add(n as u64, Ordering::Relaxed);
        }
        n
    }

    /// Runs one round: messages, then every poller once. Returns whether anything did work.
    pub fn poll_once(&mut self) -> bool {
        let mut busy = self.drain_inbox() > 0;
        let mut i = 0;
        while i < self.pollers.len() {
            match self.pollers[i].poller.poll() {
                PollStatus::Busy => {
                    busy = true;
                    i += 1;
                }
                PollStatus::Idle => i += 1,
                PollStatus::Finished => {
                    busy = true;
                    let slot = self.pollers.remove(i);
                    self.unwatch(&slot.fds);
                    self.stats.pollers.store(self.pollers.len() as u64, Ordering::Relaxed);
                }
            }
        }
        // One clock read per round: the time since the last tick is charged to the round that
        // just ran.
        let now = Instant::now();
        let elapsed = now.duration_since(self.last_tick).as_nanos() as u64;
        self.last_tick = now;
        if busy {
            self.stats.busy_ns.fetch_add(elapsed, Ordering::Relaxed);
            self.last_work = now;
        } else {
            self.stats.idle_ns.fetch_add(elapsed, Ordering::Relaxed);
        }
        self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        self.last_round_busy = busy;
        busy
    }

    /// Whether the reactor may sleep now: nothing pending and idle for a whole window.
    fn may_sleep(&self) -> bool {
        !self.last_round_busy
            && self.last_tick.duration_since(self.last_work) >= self.idle_window()
            && !self.pollers.iter().any(|s| s.poller.has_pending())
            && self.inbox.queue.is_empty()
    }

    /// The window [`Reactor::may_sleep`] waits: the longest its pollers want (the configured
    /// one unless all of them want less).
    fn idle_window(&self) -> Duration {
        let configured = self.config.idle_window;
        self.pollers
            .iter()
            .map(|s| s.poller.idle_window().map_or(configured, |w| w.min(configured)))
            .max()
            .unwrap_or(configured)
    }

    /// Re-arms notifications and sleeps until a wake-up fd fires or `timeout` passes.
    /// Returns whether it actually slept.
    pub fn sleep(&mut self, timeout: Option<Duration>) -> bool {
        let mut armed = 0;
        let mut abort = false;
        for slot in self.pollers.iter_mut() {
            armed += 1;
            if !slot.poller.prepare_sleep() {
                abort = true;
                break;
            }
        }
        let mut slept = false;
        // Whether our own wake-up counter fired. Read it only then: a count left from a
        // message sent while we polled makes the next epoll_wait return at once, which reads it
        // then; reading it after every sleep cost a system call per sleep.
        let mut inbox_signalled = false;
        if !abort && self.inbox.queue.is_empty() {
            self.stats.sleeping.store(true, Ordering::Relaxed);
            self.stats.sleep_since_ns.store(mono_ns(), Ordering::Relaxed);
            self.stats.sleeps.fetch_add(1, Ordering::Relaxed);
            let start = Instant::now();
            let mut events = [EpollEvent::default(); 16];
            let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
            match self.epoll.wait(ms, &mut events) {
                Ok(n) => inbox_signalled = events[..n].iter().any(|e| e.data() == INBOX_TOKEN),
                Err(e) => {
                    inbox_signalled = true;
                    if e.kind() != io::ErrorKind::Interrupted {
                        log::warn!("reactor {}: epoll_wait failed: {e}", self.id);
                    }
                }
            }
            let now = Instant::now();
            // Clear the open-sleep mark before adding the whole sleep, so a concurrent snapshot
            // may briefly undercount but never counts the sleep twice.
            self.stats.sleep_since_ns.store(0, Ordering::Relaxed);
            self.stats.sleep_ns.fetch_add(now.duration_since(start).as_nanos() as u64, Ordering::Relaxed);
            self.stats.sleeping.store(false, Ordering::Relaxed);
            self.last_tick = now;
            self.last_work = now;
            slept = true;
        }
        // Drain our own wake-up counter; messages themselves are in the queue.
        if inbox_signalled {
            let _ = self.inbox.wake.read();
        }
        for slot in self.pollers.iter_mut().take(armed) {
            slot.poller.after_wake();
        }
        slept
    }

    /// Loops until [`Reactor::request_stop`]: busy rounds back to back, sleeping when idle.
    pub fn run(&mut self) {
        while !self.stop {
            self.poll_once();
            if self.may_sleep() {
                self.sleep(None);
            }
        }
    }
}

trait EventFdExt {
    fn as_raw_fd_checked(&self) -> RawFd;
}

impl EventFdExt for EventFd {
    fn as_raw_fd_checked(&self) -> RawFd {
        std::os::unix::io::AsRawFd::as_raw_fd(self)
    }
}

/// Parses a CPU list: `0`, `0,2`, `0-3`, `0-1,4`, or an SPDK-style hex mask `0x3`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        let mask = u128::from_str_radix(hex, 16).map_err(|_| format!("'{s}' is not a hex cpu mask"))?;
        let cpus: Vec<usize> = (0..128).filter(|i| mask & (1u128 << i) != 0).collect();
        if cpus.is_empty() {
            return Err("cpu mask selects no cpu".into());
        }
        return Ok(cpus);
    }
    let mut cpus = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let bad = || format!("'{part}' is not a cpu number or range (e.g. 0, 0-3, 0,2, 0x3)");
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.trim().parse().map_err(|_| bad())?;
            let b: usize = b.trim().parse().map_err(|_| bad())?;
            if a > b || b >= 1024 {
                return Err(bad());
            }
            cpus.extend(a..=b);
        } else {
            let c: usize = part.parse().map_err(|_| bad())?;
            if c >= 1024 {
                return Err(bad());
            }
            cpus.push(c);
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    if cpus.is_empty() {
        return Err("empty cpu list".into());
    }
    Ok(cpus)
}

/// The longest SPDK cpumask text accepted, in bytes: every range in a list expands to up to
/// 1024 cores before duplicates go, so the text is bounded; a list naming all 1024 cores one
/// by one still fits.
pub const MAX_CPUMASK_LEN: usize = 5000;

/// Parses SPDK's cpumask text: a hex mask (`"0x3"`), or a CPU list, bracketed as SPDK writes
/// it (`"[0,1]"`) or bare (`"0-3"`, `"0,2"`).
pub fn parse_cpumask(mask: &str) -> Result<Vec<usize>, String> {
    if mask.len() > MAX_CPUMASK_LEN {
        return Err(format!("{} characters, longer than {MAX_CPUMASK_LEN}", mask.len()));
    }
    let s = mask.trim();
    let inner = s.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(s);
    parse_cpu_list(inner)
        .map_err(|e| format!("{e}; accepted: a hex mask like \"0x3\" or a list like \"[0,1]\" or \"0-3\""))
}

fn pin_to_core(core: usize) -> io::Result<()> {
    pin_thread(&[core])
}

/// Restricts the calling thread to `cores` (each below 1024, as [`parse_cpu_list`] checks);
/// threads it creates afterwards inherit that.
pub fn pin_thread(cores: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &core in cores {
        if core >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cpu {core} is out of range")));
        }
        // SAFETY: CPU_SET writes inside `set`; `core` < CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(core, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The running reactors of a process, one thread each, pinned.
pub struct ReactorSet {
    handles: Vec<ReactorHandle>,
    threads: Vec<JoinHandle<()>>,
}

impl ReactorSet {
    /// Starts one reactor per listed core. Fails if a core cannot be used.
    pub fn start(cores: &[usize], config: ReactorConfig) -> io::Result<ReactorSet> {
        let mut handles = Vec::new();
        let mut threads = Vec::new();
        for (id, &core) in cores.iter().enumerate() {
            let (tx, rx) = std::sync::mpsc::channel();
            let thread = std::thread::Builder::new().name(format!("reactor_{core}")).spawn(move || {
                let setup = pin_to_core(core).and_then(|_| Reactor::new(id, Some(core), config));
                match setup {
                    Ok(mut reactor) => {
                        let _ = tx.send(Ok(reactor.handle()));
                        // A reactor that died would leave every queue and channel on its core
                        // silently unserved while the process looks healthy. Fail fast instead:
                        // a supervisor restarts the daemon, and vhost-user frontends reconnect
                        // and have their in-flight requests resubmitted.
                        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reactor.run()));
                        if run.is_err() {
                            log::error!("reactor on cpu {core} panicked: aborting the process");
                            std::process::abort();
                        }
                        // Drop pollers (and their queues) on this thread, where they live.
                        while let Some(slot) = reactor.pollers.pop() {
                            reactor.unwatch(&slot.fds);
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            })?;
            let handle = rx
                .recv()
                .map_err(|_| io::Error::other("reactor thread died during start-up"))?
                .map_err(|e| io::Error::new(e.kind(), format!("reactor on cpu {core}: {e}")))?;
            handles.push(handle);
            threads.push(thread);
        }
        Ok(ReactorSet { handles, threads })
    }

    pub fn handles(&self) -> &[ReactorHandle] {
        &self.handles
    }

    /// Stops every reactor after its current round and joins the threads.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for h in &self.handles {
            h.send(|r| r.request_stop());
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ReactorSet {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests;
pub use fp_sys as sys;
