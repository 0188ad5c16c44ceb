//! One polled event loop: its pollers, its inbox, and the adaptive switch between
//! busy-polling and sleeping in epoll.

use std::any::Any;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_sys::clock::{ticks, TickScale};

use crossbeam_queue::SegQueue;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::poller::{PollStatus, Poller, PollerId};
use crate::stats::{add_own, mono_ns, ReactorStats};

/// How long a control-plane call waits for a reactor's answer: a reactor runs its inbox every
/// round, so one that has not answered in this long is wedged, and the caller reports an error
/// instead of hanging with it (even a reactor under callgrind answers within milliseconds).
pub const CALL_BOUND: Duration = Duration::from_secs(60);

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

    /// Runs `f` on the reactor and waits for its result, at most [`CALL_BOUND`]. Control
    /// plane only: it blocks. Returns `None` if the reactor is gone or did not answer in time.
    pub fn call<R: Send + 'static>(&self, f: impl FnOnce(&mut Reactor) -> R + Send + 'static) -> Option<R> {
        self.call_within(CALL_BOUND, f)
    }

    /// [`ReactorHandle::call`] with its own bound. A reactor that has not answered by then is
    /// wedged (a round takes microseconds): the caller gets `None` and the reactor is named
    /// in the log; `f` still runs if the reactor ever reaches it.
    pub fn call_within<R: Send + 'static>(
        &self,
        bound: Duration,
        f: impl FnOnce(&mut Reactor) -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.send(move |r| {
            let _ = tx.send(f(r));
        });
        match rx.recv_timeout(bound) {
            Ok(v) => Some(v),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => None,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                log::error!("reactor {}: no answer to a control-plane call within {bound:?}", self.id);
                None
            }
        }
    }
}

pub(crate) struct Slot {
    id: PollerId,
    poller: Box<dyn Poller>,
    pub(crate) fds: Vec<RawFd>,
    /// It asked to be parked when idle and has fds to be woken by.
    parkable: bool,
    /// Polls in a row that found nothing to do.
    idle_polls: u32,
    /// Not polled until one of its fds fires (its notifications are armed).
    parked: bool,
    /// Reported `Finished` this round: removed at its end.
    finished: bool,
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
    /// When the last round ended ([`fp_sys::clock::ticks`]: a TSC read, not a vDSO call, once
    /// per round).
    last_tick: u64,
    /// When a round last did work, in ticks.
    pub(crate) last_work: u64,
    /// The clock's ticks in nanoseconds (the counters are in nanoseconds).
    scale: TickScale,
    last_round_busy: bool,
    stop: bool,
    /// How long [`Reactor::drain_held`] may wait at shutdown ([`Reactor::request_shutdown`]).
    shutdown_bound: Duration,
    /// The fds of parked pollers only, asked without waiting every few rounds.
    parked_epoll: Epoll,
    /// How many pollers are parked: the last ones in `pollers` (a round polls those before).
    parked: usize,
    rounds_since_parked_check: u32,
    ns_since_parked_check: u64,
    /// Where the next round starts.
    round_start: usize,
    /// Times the parked set was asked ([`Reactor::wake_parked`]): one system call each.
    pub(crate) parked_waits: u64,
}

/// How long a reactor waits at shutdown, by default, for requests backends still hold
/// ([`Reactor::drain_held`]): as long as a vhost-user queue's default stop bound.
pub const DEFAULT_SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

/// The longest a draining reactor sleeps before it checks its bound again (it wakes earlier
/// for any completion signalled through a poller's fd).
const DRAIN_SLEEP: Duration = Duration::from_millis(50);

const INBOX_TOKEN: u64 = u64::MAX;

/// Events one sleep's `epoll_wait` returns at most. A wake-up that fills them all asks the
/// parked set for the rest.
pub(crate) const WAKE_EVENTS: usize = 16;

/// Polls in a row without work after which a poller that allows it is parked
/// ([`Poller::parks_when_idle`]). Parking and waking cost a few system calls (re-arming its
/// notifications, adding its fds to the parked set and removing them), about 4 µs. 1000 idle
/// polls last about 40 µs in the lightest rounds seen (two idle queues on a reactor, ~40 ns a
/// round), where parking then costs about a tenth of the idle time but the reactor soon sleeps
/// anyway; with 16 queues a round takes about 1 µs, and a queue must have been idle about 1 ms.
/// A queue whose driver submits more often than that is never parked.
pub const PARK_AFTER_IDLE_POLLS: u32 = 1000;

/// Parked pollers' fds are checked (one `epoll_wait` without waiting, about 0.4 µs) every this
/// many rounds: about 2 % of the lightest rounds (a QD-1 queue's, about 0.3 µs), and a bound
/// on how long a parked queue's first request waits, counted in rounds.
pub const PARKED_CHECK_ROUNDS: u32 = 64;

/// ... and at least this often when rounds are long (many busy queues): the same bound in time.
/// After a sleep they are checked at once.
pub const PARKED_CHECK_INTERVAL: Duration = Duration::from_micros(50);

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
        // Calibrates the clock here, on the control plane, before any round reads it.
        let scale = TickScale::of_clock();
        let now = ticks();
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
            scale,
            last_round_busy: true,
            stop: false,
            shutdown_bound: DEFAULT_SHUTDOWN_BOUND,
            parked_epoll: Epoll::new()?,
            parked: 0,
            rounds_since_parked_check: 0,
            ns_since_parked_check: 0,
            round_start: 0,
            parked_waits: 0,
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
        let parkable = poller.parks_when_idle() && !fds.is_empty();
        self.pollers.push(Slot { id, poller, fds, parkable, idle_polls: 0, parked: false, finished: false });
        // Parked pollers are the last ones (a round polls the ones before): the new one goes
        // before them.
        let first_parked = self.pollers.len() - 1 - self.parked;
        let last = self.pollers.len() - 1;
        self.pollers.swap(first_parked, last);
        self.stats.pollers.store(self.pollers.len() as u64, Ordering::Relaxed);
        id
    }

    /// Unregisters a poller and hands it back (downcast it with `Box<dyn Any>::downcast`).
    pub fn remove_poller(&mut self, id: PollerId) -> Option<Box<dyn Poller>> {
        let mut pos = self.pollers.iter().position(|s| s.id == id)?;
        if self.pollers[pos].parked {
            pos = self.unpark(pos);
        }
        let slot = self.pollers.remove(pos);
        self.unwatch(&slot.fds);
        self.stats.pollers.store(self.pollers.len() as u64, Ordering::Relaxed);
        Some(slot.poller)
    }

    /// Mutable access to a registered poller of a known type. A parked poller is woken: whoever
    /// reaches it may give it work its fds do not show (a stop, a new memory table).
    pub fn poller_mut<T: Poller>(&mut self, id: PollerId) -> Option<&mut T> {
        let mut pos = self.pollers.iter().position(|s| s.id == id)?;
        if self.pollers[pos].parked {
            pos = self.unpark(pos);
        }
        let any: &mut dyn Any = self.pollers[pos].poller.as_mut();
        any.downcast_mut::<T>()
    }

    /// Whether the poller is parked ([`Poller::parks_when_idle`]); `None` if it is not here.
    pub fn is_parked(&self, id: PollerId) -> Option<bool> {
        self.pollers.iter().find(|s| s.id == id).map(|s| s.parked)
    }

    /// How many pollers are parked now.
    pub fn parked_count(&self) -> usize {
        self.parked
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
        // Two loads; a pop that finds nothing costs several times that, every round.
        if self.inbox.queue.is_empty() {
            return 0;
        }
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

    /// Runs one round: messages, then every poller once (but the parked ones), starting one
    /// poller further than the last round did. Returns whether anything did work.
    pub fn poll_once(&mut self) -> bool {
        self.round()
    }

    /// [`Reactor::poll_once`], inlined into [`Reactor::run`]'s loop: the call's frame was a
    /// sixth of the reactor's own work in a round.
    #[inline(always)]
    fn round(&mut self) -> bool {
        let mut busy = self.drain_inbox() > 0;
        if self.parked > 0 {
            self.rounds_since_parked_check += 1;
            if self.rounds_since_parked_check >= PARKED_CHECK_ROUNDS
                || self.ns_since_parked_check >= PARKED_CHECK_INTERVAL.as_nanos() as u64
            {
                self.wake_parked();
            }
        }
        // Parked pollers are the last ones: a round does not even look at them.
        let n = self.pollers.len() - self.parked;
        // A fixed order would serve the same queue first in every round, and its requests
        // would always wait least.
        let start = if self.round_start < n { self.round_start } else { 0 };
        self.round_start = start + 1;
        let mut settle = false;
        for k in 0..n {
            let i = if start + k < n { start + k } else { start + k - n };
            let slot = &mut self.pollers[i];
            match slot.poller.poll() {
                PollStatus::Busy => {
                    busy = true;
                    slot.idle_polls = 0;
                }
                // Counted only where it leads somewhere: `park` starts the count again, so it
                // never passes the threshold.
                PollStatus::Idle if slot.parkable => {
                    slot.idle_polls += 1;
                    if slot.idle_polls >= PARK_AFTER_IDLE_POLLS {
                        settle |= self.park(i);
                    }
                }
                PollStatus::Idle => {}
                PollStatus::Finished => {
                    busy = true;
                    settle = true;
                    slot.finished = true;
                }
            }
        }
        if settle {
            self.settle();
        }
        // One clock read per round: the time since the last tick is charged to the round that
        // just ran.
        let now = ticks();
        let elapsed = self.scale.ns(now.wrapping_sub(self.last_tick));
        self.last_tick = now;
        self.ns_since_parked_check += elapsed;
        if busy {
            add_own(&self.stats.busy_ns, elapsed);
            self.last_work = now;
        } else {
            add_own(&self.stats.idle_ns, elapsed);
        }
        add_own(&self.stats.rounds, 1);
        self.last_round_busy = busy;
        busy
    }

    /// After a round: removes the pollers that finished, and moves those parked in it behind
    /// the others.
    #[cold]
    #[inline(never)]
    fn settle(&mut self) {
        let mut i = 0;
        while i < self.pollers.len() {
            if self.pollers[i].finished {
                let slot = self.pollers.remove(i);
                self.unwatch(&slot.fds);
            } else {
                i += 1;
            }
        }
        self.stats.pollers.store(self.pollers.len() as u64, Ordering::Relaxed);
        let (mut i, mut end) = (0, self.pollers.len());
        while i < end {
            if self.pollers[i].parked {
                end -= 1;
                self.pollers.swap(i, end);
            } else {
                i += 1;
            }
        }
    }

    /// Parks poller `i` if nothing is pending on it and its notifications arm without finding
    /// work; otherwise it starts counting idle polls again. Returns whether it parked it (it
    /// stays in its place until [`Reactor::settle`]).
    #[cold]
    #[inline(never)]
    fn park(&mut self, i: usize) -> bool {
        let slot = &mut self.pollers[i];
        slot.idle_polls = 0;
        if slot.poller.has_pending() {
            return false;
        }
        if !slot.poller.prepare_sleep() {
            slot.poller.after_wake();
            return false;
        }
        for (k, &fd) in slot.fds.iter().enumerate() {
            if let Err(e) =
                self.parked_epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, slot.id.0))
            {
                log::warn!("reactor {}: cannot park a poller, fd {fd}: {e}; it stays polled", self.id);
                for &added in &slot.fds[..k] {
                    let _ = self.parked_epoll.ctl(ControlOperation::Delete, added, EpollEvent::default());
                }
                slot.poller.after_wake();
                return false;
            }
        }
        slot.parked = true;
        self.parked += 1;
        self.stats.parked.store(self.parked as u64, Ordering::Relaxed);
        self.stats.parks.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Polls parked poller `i` again from this round on; returns where it is now (moved to
    /// the front of the parked ones, which becomes the end of the others). Not during a round.
    fn unpark(&mut self, i: usize) -> usize {
        let first_parked = self.pollers.len() - self.parked;
        self.pollers.swap(i, first_parked);
        let slot = &mut self.pollers[first_parked];
        for &fd in &slot.fds {
            // Only fails if the fd was closed already, which took it out of the set.
            let _ = self.parked_epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        slot.parked = false;
        slot.idle_polls = 0;
        slot.poller.after_wake();
        self.parked -= 1;
        self.stats.parked.store(self.parked as u64, Ordering::Relaxed);
        first_parked
    }

    /// Polls every parked poller again from the next round on; each parks again once idle
    /// for as long as before. For work that reaches pollers other than through their fds: a
    /// mirror job waits until every channel of its source has taken up a change, which an
    /// idle channel does only when its queue's poller polls it. Not during a round (from a
    /// message: the inbox is drained between rounds).
    pub fn unpark_all(&mut self) {
        while self.parked > 0 {
            let first_parked = self.pollers.len() - self.parked;
            self.unpark(first_parked);
        }
    }

    /// Unparks the pollers whose fds fired, without waiting.
    #[cold]
    #[inline(never)]
    fn wake_parked(&mut self) {
        self.parked_waits += 1;
        self.rounds_since_parked_check = 0;
        self.ns_since_parked_check = 0;
        let mut events = [EpollEvent::default(); WAKE_EVENTS];
        loop {
            let n = match self.parked_epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) => {
                    if e.kind() != io::ErrorKind::Interrupted {
                        log::warn!("reactor {}: epoll_wait on parked pollers failed: {e}", self.id);
                    }
                    return;
                }
            };
            self.unpark_fired(&events[..n]);
            if n < events.len() {
                return;
            }
        }
    }

    /// Whether the reactor may sleep now: nothing pending and idle for a whole window, or every
    /// poller parked (see [`Reactor::all_parked`]).
    ///
    /// Inlined, and only the first test: after a busy round (every round while the reactor
    /// has work) the call's frame cost ten times the test.
    #[inline(always)]
    pub(crate) fn may_sleep(&self) -> bool {
        !self.last_round_busy && self.may_sleep_after_idle_round()
    }

    /// [`Reactor::may_sleep`] after a round that found nothing to do.
    #[inline(never)]
    fn may_sleep_after_idle_round(&self) -> bool {
        (self.all_parked()
            || self.scale.ns(self.last_tick.wrapping_sub(self.last_work))
                >= self.idle_window().as_nanos() as u64)
            && !self.pollers[..self.pollers.len() - self.parked].iter().any(|s| s.poller.has_pending())
            && self.inbox.queue.is_empty()
    }

    /// Every poller is parked: a round polls nothing, and the rest of the idle window would
    /// only ask the parked set without waiting, one `epoll_wait` every few empty rounds (27
    /// system calls per request measured for a QD-1 client at 2000 requests per second, the
    /// server busy 15 % of its core), where a sleep waits on the same fds with one. Parked
    /// pollers' notifications are armed, so a sleep misses nothing, and it ends on the first
    /// kick rather than at the next check.
    fn all_parked(&self) -> bool {
        self.parked > 0 && self.parked == self.pollers.len()
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
        // Parked pollers are armed already.
        let mut armed = 0;
        let mut abort = false;
        for slot in self.pollers.iter_mut() {
            armed += 1;
            if !slot.parked && !slot.poller.prepare_sleep() {
                abort = true;
                break;
            }
        }
        let mut slept = false;
        // Whether our own wake-up counter fired. Read it only then: a count left from a
        // message sent while we polled makes the next epoll_wait return at once, which reads it
        // then; reading it after every sleep cost a system call per sleep.
        let mut inbox_signalled = false;
        // What the wait returned: which pollers' fds fired, the first `ready` of `events`
        // (`usize::MAX` when it did not say: no wait, an error).
        let mut events = [EpollEvent::default(); WAKE_EVENTS];
        let mut ready = usize::MAX;
        if !abort && self.inbox.queue.is_empty() {
            self.stats.sleeping.store(true, Ordering::Relaxed);
            self.stats.sleep_since_ns.store(mono_ns(), Ordering::Relaxed);
            self.stats.sleeps.fetch_add(1, Ordering::Relaxed);
            let start = ticks();
            let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
            match self.epoll.wait(ms, &mut events) {
                Ok(n) => {
                    ready = n;
                    inbox_signalled = events[..n].iter().any(|e| e.data() == INBOX_TOKEN);
                }
                Err(e) => {
                    inbox_signalled = true;
                    if e.kind() != io::ErrorKind::Interrupted {
                        log::warn!("reactor {}: epoll_wait failed: {e}", self.id);
                    }
                }
            }
            let now = ticks();
            // Clear the open-sleep mark before adding the whole sleep, so a concurrent snapshot
            // may briefly undercount but never counts the sleep twice.
            self.stats.sleep_since_ns.store(0, Ordering::Relaxed);
            self.stats.sleep_ns.fetch_add(self.scale.ns(now.wrapping_sub(start)), Ordering::Relaxed);
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
            if !slot.parked {
                slot.poller.after_wake();
            }
        }
        if slept && self.parked > 0 {
            // The wake-up may have been a parked poller's.
            self.unpark_woken(&events, ready);
        }
        slept
    }

    /// After a sleep: unparks the pollers whose fds fired, as the sleep's own `epoll_wait`
    /// returned them (the reactor's set watches every poller's fds, parked or not), rather
    /// than asking the parked set again: a system call less per wake-up. When the wait did not
    /// say (`ready` is `usize::MAX`: an error or an interruption) or its buffer was full (more
    /// may be ready), the parked set is asked as before.
    fn unpark_woken(&mut self, events: &[EpollEvent], ready: usize) {
        if ready >= events.len() {
            self.wake_parked();
            return;
        }
        self.unpark_fired(&events[..ready]);
        // As after a check of the parked set: the next one is a full interval away.
        self.rounds_since_parked_check = 0;
        self.ns_since_parked_check = 0;
    }

    /// Unparks the parked pollers that `fired` names (an event's data is its poller's id;
    /// events of running pollers and of the inbox match none).
    fn unpark_fired(&mut self, fired: &[EpollEvent]) {
        for e in fired {
            let first_parked = self.pollers.len() - self.parked;
            if let Some(i) = self.pollers[first_parked..].iter().position(|s| s.id.0 == e.data()) {
                self.unpark(first_parked + i);
            }
        }
    }

    /// Loops until [`Reactor::request_stop`]: busy rounds back to back, sleeping when idle.
    pub fn run(&mut self) {
        while !self.stop {
            self.round();
            if self.may_sleep() {
                self.sleep(None);
            }
        }
    }
}
