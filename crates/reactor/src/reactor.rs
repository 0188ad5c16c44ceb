//! One polled event loop: its pollers, its inbox, and the adaptive switch between
//! busy-polling and sleeping in epoll.

use std::any::Any;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::poller::{PollStatus, Poller, PollerId};
use crate::stats::{mono_ns, ReactorStats};

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

    /// The counters the reactor publishes.
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

pub(crate) struct Slot {
    id: PollerId,
    poller: Box<dyn Poller>,
    pub(crate) fds: Vec<RawFd>,
}

/// One polled event loop. See the module docs.
pub struct Reactor {
    id: usize,
    core: Option<usize>,
    config: ReactorConfig,
    pub(crate) pollers: Vec<Slot>,
    next_poller: u64,
    inbox: Arc<Inbox>,
    epoll: Epoll,
    stats: Arc<ReactorStats>,
    last_tick: Instant,
    pub(crate) last_work: Instant,
    last_round_busy: bool,
    stop: bool,
    /// How long [`Reactor::drain_held`] may wait at shutdown ([`Reactor::request_shutdown`]).
    shutdown_bound: Duration,
}

/// How long a reactor waits at shutdown, by default, for requests backends still hold
/// ([`Reactor::drain_held`]): as long as a vhost-user queue's default stop bound.
pub const DEFAULT_SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

/// The longest a draining reactor sleeps before it checks its bound again (it wakes earlier
/// for any completion signalled through a poller's fd).
const DRAIN_SLEEP: Duration = Duration::from_millis(50);

const INBOX_TOKEN: u64 = u64::MAX;

impl Reactor {
    /// A reactor without pollers, number `id` in its set, on `core` if pinned. It runs only
    /// when someone calls [`Reactor::run`] or [`Reactor::poll_once`].
    pub fn new(id: usize, core: Option<usize>, config: ReactorConfig) -> io::Result<Reactor> {
        let inbox = Arc::new(Inbox { queue: SegQueue::new(), wake: EventFd::new(EFD_NONBLOCK)? });
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            inbox.wake.as_raw_fd(),
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
            shutdown_bound: DEFAULT_SHUTDOWN_BOUND,
        })
    }

    /// The reactor's index in its set.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The CPU the reactor is pinned to, if any.
    pub fn core(&self) -> Option<usize> {
        self.core
    }

    /// A handle other threads message this reactor through.
    pub fn handle(&self) -> ReactorHandle {
        ReactorHandle { id: self.id, core: self.core, inbox: self.inbox.clone(), stats: self.stats.clone() }
    }

    /// The counters this reactor publishes.
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

    /// How many pollers are registered.
    pub fn poller_count(&self) -> usize {
        self.pollers.len()
    }

    /// Makes [`Reactor::run`] return after the current round.
    pub fn request_stop(&mut self) {
        self.stop = true;
    }

    /// Makes [`Reactor::run`] return after the current round; the thread that runs it then
    /// waits up to `bound` for what backends still hold ([`Reactor::drain_held`]).
    pub fn request_shutdown(&mut self, bound: Duration) {
        self.shutdown_bound = bound;
        self.stop = true;
    }

    /// The bound [`Reactor::request_shutdown`] set ([`DEFAULT_SHUTDOWN_BOUND`] otherwise).
    pub fn shutdown_bound(&self) -> Duration {
        self.shutdown_bound
    }

    /// Requests the pollers handed to backends that have not come back
    /// ([`Poller::held_by_backend`]).
    pub fn held_by_backends(&self) -> usize {
        self.pollers.iter().map(|s| s.poller.held_by_backend()).sum()
    }

    /// Shutdown, before the pollers are dropped: runs rounds (sleeping when the reactor may)
    /// until no poller has a request a backend holds, or until `bound` has passed. A poller
    /// dropped with such a request would free memory the backend may still write (a guest's
    /// buffers unmapped under a disk). Returns how many are still held at the bound (0 when all
    /// came back), and logs how long it waited and what is left.
    pub fn drain_held(&mut self, bound: Duration) -> usize {
        let start = Instant::now();
        let at_start = self.held_by_backends();
        loop {
            let held = self.held_by_backends();
            let waited = start.elapsed();
            if held == 0 {
                if at_start > 0 {
                    log::info!(
                        "reactor {}: shutdown waited {waited:?} for {at_start} requests the backends held",
                        self.id
                    );
                }
                return 0;
            }
            if waited >= bound {
                let pollers = self.pollers.iter().filter(|s| s.poller.held_by_backend() > 0).count();
                log::error!(
                    "reactor {}: shutdown waited {waited:?}, past its bound of {bound:?} by {:?}: {held} \
                     requests still held by the backends of {pollers} pollers (of {at_start} at the \
                     start); dropping them with their memory",
                    self.id,
                    waited - bound
                );
                return held;
            }
            self.poll_once();
            if self.may_sleep() {
                self.sleep(Some((bound - waited).min(DRAIN_SLEEP)));
            }
        }
    }

    /// Whether [`Reactor::request_stop`] was called.
    pub fn stop_requested(&self) -> bool {
        self.stop
    }

    pub(crate) fn unwatch(&self, fds: &[RawFd]) {
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
    pub(crate) fn may_sleep(&self) -> bool {
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
