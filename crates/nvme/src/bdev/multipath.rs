//! Multipath: one namespace reached through several controllers of one subsystem (SPDK's
//! `nvme_bdev` with one `nvme_io_path` per controller). The namespace's [`PathSet`] lists the
//! paths and the policy; each channel is a `MultipathChannel`, one I/O queue pair per path
//! (an `NvmeChannel` each, generic over the transport: no dynamic call per I/O).
//!
//! Path choice (`bdev_nvme_set_multipath_policy`): `active_passive` sends everything to the
//! first path that is up (so a first path that comes back takes the I/O again: failback);
//! `active_active` spreads I/O over the paths that are up, `round_robin` (switching after
//! `rr_min_io` requests) or `queue_depth` (the fewest requests in flight).
//!
//! ANA (`ctrlr::ana`): each path's ANA state is a byte its controller thread publishes and the
//! channel loads at its sweeps. Optimized paths come first, non-optimized ones only when no
//! optimized path is up (SPDK's rule, both policies); inaccessible, persistent loss, change and
//! a state being read again take no new I/O. A request refused with an ANA status was not
//! carried out: it goes through another path at once (no quiesce bound), and the path waits for
//! its controller to read the page again. With no accessible path but one up that may become so
//! (within ANATT), requests wait in the channel; persistent loss everywhere fails them.
//!
//! Failover and the Command Quiesce Time rule (NVMe Base 2.1, section 9.6 "Communication Loss
//! Handling", with Identify Controller's CQT): a command sent to a controller whose connection
//! was lost may still be executed by that controller until it notices the loss (its
//! keep-alive timer, KATO) and quiesces its commands (CQT). Sending the same write through
//! another controller before then can be overtaken by the old one (the corruption of
//! spdk#3593). So a request held by a path that went down is retried on another path only
//! once (a) the path's queue was drained and closed (the path's channel hands the queue to its
//! controller thread, which drops it; the controller counts the queues handed back and not
//! dropped yet, and the retry waits for none) and (b) KATO + CQT have passed since
//! the channel saw the path down (when CQT is 0, [`UNREPORTED_CQT_MS`] stands in for it). A
//! request that never reached the old path (still waiting for a command slot) waits the same;
//! the rule is kept simple rather than tight. Until then it waits; meanwhile new I/O goes to
//! the paths that are up.
//!
//! No I/O fails while a path is up: a failure that is the path's (the controller given up or
//! past `fast_io_fail_timeout_sec`, or detached) is retried on a path that is up, after the
//! same bound. With no path up, the paths' own rules decide: the request waits on a path that
//! is reconnecting and fails as that path's `fast_io_fail_timeout_sec` or
//! `ctrlr_loss_timeout_sec` says.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fp_bdev::clock::ticks;
use fp_bdev::{BdevError, IoChannel, IoOp, IoRequest, IoStatus, Iovecs, SubmitError};

use crate::ctrlr::ana::{AnaWord, ANA_UPDATING};
use crate::ctrlr::shared::{Shared, ST_DELETING, ST_ENABLED, ST_FAILED};
use crate::transport::Transport;

use super::channel::{poll_kept, NvmeChannel};
use super::paths::{lock, ChannelView, NsParams, PathSet, Policy, Selector};
use super::status::{ANA_LOST, ANA_RETRY};

/// The quiesce time assumed for a controller that reports no CQT (Identify Controller's CQT
/// is 0): one second more after the keep-alive timeout.
pub const UNREPORTED_CQT_MS: u64 = 1000;

/// The errno a path's channel gives a request back with when the multipath channel takes it
/// off a path that is down (never seen above the multipath channel).
pub(super) const RELEASED: i32 = libc::ENOTCONN;

/// Rounds between two sweeps: idle paths polled, the path list and the view refreshed.
const SWEEP_EVERY: u32 = 64;

/// One request as the caller gave it.
#[derive(Clone, Copy)]
struct Slot {
    req: IoRequest,
    /// Tick before which it may not be sent again (parked after its path went down).
    ready_at: u64,
    /// What it fails with if no path is left.
    status: IoStatus,
    /// The path it was taken off when parked.
    from: u64,
}

/// One path of a channel.
struct PathChan<T: Transport> {
    id: u64,
    ch: NvmeChannel<T>,
    /// Tick at which this channel saw the path down; none while it is up.
    down_since: Option<u64>,
    /// KATO + CQT in ticks, fixed when the path went down.
    quiesce_ticks: u64,
    /// Gone from the namespace's path list: no new I/O.
    removed: bool,
    /// The namespace's ANA state through this path, loaded at sweeps (and marked updating at
    /// once when an I/O failed with an ANA status).
    ana: AnaWord,
}

impl<T: Transport> PathChan<T> {
    /// Up: its controller enabled and a queue in hand.
    #[inline]
    fn up(&self) -> bool {
        !self.removed && self.ch.shared.state() & ST_ENABLED != 0 && self.ch.has_queue()
    }

    /// The queues handed back to the controller thread (after a failure or a reset) are
    /// closed: it dropped them all, or it ended (a detached controller's thread closes them
    /// as it ends). Every channel of the controller counts, which errs on the safe side.
    fn old_queues_closed(&self) -> bool {
        self.ch.shared.retiring() == 0 || self.ch.shared.state() & ST_DELETING != 0
    }

    /// May still carry I/O: not given up (a path reconnecting holds requests).
    #[inline]
    fn usable(&self) -> bool {
        !self.removed && self.ch.shared.state() & ST_FAILED == 0
    }

    /// Up, and of ANA class `optimized` (else non-optimized): takes new I/O.
    #[inline]
    fn serves(&self, optimized: bool) -> bool {
        let class =
            if optimized { self.ana.optimized() } else { self.ana.accessible() && !self.ana.optimized() };
        class && self.up()
    }

    /// Up and inaccessible, in change or being read again, within ANATT: I/O waits for it.
    fn may_serve(&self) -> bool {
        self.up() && self.ana.may_become_accessible()
    }
}

/// Where the next request goes.
enum Choice {
    /// To path `i` (which may hold it, or fail it, by its own rules).
    Path(usize),
    /// Nowhere yet: a path may become accessible (ANA); the request waits in the channel.
    Wait,
    /// Nowhere: it fails with this status.
    Fail(IoStatus),
}

/// A multipath namespace's channel: one [`NvmeChannel`] per path.
pub(crate) struct MultipathChannel<T: Transport> {
    set: Arc<PathSet>,
    /// What `bdev_nvme_get_io_paths` reads of this channel.
    view: Arc<ChannelView>,
    ns: NsParams,
    /// One channel per path, in the set's order (a path added later at the end).
    paths: Vec<PathChan<T>>,
    /// The set's version `paths` follows.
    version: u64,
    /// The requests, by the tag the paths' channels see.
    slots: Box<[Slot]>,
    /// Slots not in use.
    free: Vec<u32>,
    /// Requests off a path that went down, waiting for their `ready_at`.
    parked: VecDeque<u32>,
    /// One path's completions in a round, kept between rounds (no allocation per poll).
    inner: Vec<(u32, IoStatus)>,
    /// `poll`'s completions, kept between calls.
    batch: Vec<(u32, IoStatus)>,
    /// Requests failed without a path (no path left to serve them), returned at the next poll.
    done: Vec<(u32, IoStatus)>,
    /// Round robin: the path last chosen, and how many requests it took in a row.
    rr: usize,
    rr_sent: u32,
    /// Requests accepted and not yet returned (parked ones included).
    in_flight: usize,
    /// Poll rounds, for the sweeps.
    polls: u32,
    /// The view has the polling thread's name.
    named: bool,
}

impl<T: Transport> MultipathChannel<T> {
    /// A channel over every path of `set`; `first` is the first path's backend (already
    /// known to be of transport `T`).
    pub(crate) fn open(first: Arc<Shared<T>>, set: Arc<PathSet>, ns: &NsParams) -> Result<Self, BdevError> {
        let requests = first.global.io_queue_requests.max(1) as usize;
        let mut ch = MultipathChannel {
            view: set.add_view(),
            set,
            ns: ns.clone(),
            paths: Vec::new(),
            version: u64::MAX,
            slots: vec![
                Slot {
                    req: IoRequest { tag: 0, op: IoOp::Read, offset: 0, len: 0, iov: Iovecs::NONE },
                    ready_at: 0,
                    status: IoStatus::Success,
                    from: 0,
                };
                requests
            ]
            .into_boxed_slice(),
            free: (0..requests as u32).rev().collect(),
            parked: VecDeque::with_capacity(requests),
            inner: Vec::with_capacity(requests),
            batch: Vec::with_capacity(requests),
            done: Vec::with_capacity(requests),
            rr: 0,
            rr_sent: 0,
            in_flight: 0,
            polls: 0,
            named: false,
        };
        ch.sync_paths(true)?;
        if ch.paths.is_empty() {
            return Err(BdevError::Unsupported("a multipath namespace with no path".into()));
        }
        Ok(ch)
    }

    /// Follows the namespace's path list: new paths get a queue pair (waited for when
    /// `wait`, at open; otherwise asked for and taken at a later round), removed ones take
    /// no new I/O and go once empty.
    #[cold]
    fn sync_paths(&mut self, wait: bool) -> Result<(), BdevError> {
        // A removed path's channel (and its queue pair) goes once nothing is left on it.
        self.paths.retain(|p| !(p.removed && p.ch.in_flight() == 0));
        let version = self.set.version.load(Ordering::Acquire);
        if version == self.version {
            return Ok(());
        }
        self.version = version;
        let list = self.set.list();
        for p in &mut self.paths {
            p.removed = !list.iter().any(|n| n.id == p.id);
        }
        self.paths.retain(|p| !(p.removed && p.ch.in_flight() == 0));
        for n in list {
            if self.paths.iter().any(|p| p.id == n.id) {
                continue;
            }
            let Ok(shared) = n.backend.clone().as_any().downcast::<Shared<T>>() else {
                log::warn!("nvme {}: path {} is of another transport; left out", self.set_name(), n.id);
                continue;
            };
            // Only an enabled controller is waited for: a path that is down must not hold up a
            // channel the other paths could serve.
            let wait = wait && shared.state() & ST_ENABLED != 0;
            match shared.path_channel(&self.ns, wait) {
                Ok(mut ch) => {
                    ch.set_member();
                    let ana = ch.ana();
                    self.paths.push(PathChan {
                        id: n.id,
                        ch,
                        down_since: None,
                        quiesce_ticks: 0,
                        removed: false,
                        ana,
                    })
                }
                Err(e) if wait && self.paths.is_empty() => return Err(e),
                Err(e) => log::warn!("nvme {}: no channel on path {}: {e}", self.set_name(), n.id),
            }
        }
        Ok(())
    }

    fn set_name(&self) -> String {
        self.paths.first().map_or_else(String::new, |p| format!("{}n{}", p.ch.shared.opts.name, self.ns.nsid))
    }

    /// The path of ANA class `optimized` (else non-optimized) the policy picks among those
    /// up; round robin moves on when it picks.
    #[inline]
    fn pick(&mut self, optimized: bool) -> Option<usize> {
        let n = self.paths.len();
        match self.set.policy() {
            Policy::ActivePassive => self.paths.iter().position(|p| p.serves(optimized)),
            Policy::ActiveActive { selector: Selector::RoundRobin, rr_min_io } => {
                let start = if self.rr_sent >= rr_min_io { self.rr + 1 } else { self.rr };
                let found = (0..n).map(|k| (start + k) % n).find(|&i| self.paths[i].serves(optimized));
                if let Some(i) = found {
                    if i != self.rr || self.rr_sent >= rr_min_io {
                        self.rr_sent = 0;
                    }
                    self.rr = i;
                    self.rr_sent += 1;
                }
                found
            }
            Policy::ActiveActive { selector: Selector::QueueDepth, .. } => (0..n)
                .filter(|&i| self.paths[i].serves(optimized))
                .min_by_key(|&i| self.paths[i].ch.in_flight()),
        }
    }

    /// Where the next request goes: an optimized path that is up, per the policy; else a
    /// non-optimized one (SPDK's rule, both policies); else it waits while a path that is up
    /// may become accessible (ANA, within ANATT); else a path that may come back holds it;
    /// else it fails (persistent loss on a path: [`ANA_LOST`]).
    #[inline]
    fn select(&mut self) -> Choice {
        if let Some(i) = self.pick(true).or_else(|| self.pick(false)) {
            return Choice::Path(i);
        }
        self.select_slow()
    }

    #[cold]
    fn select_slow(&self) -> Choice {
        if self.paths.iter().any(|p| p.may_serve()) {
            return Choice::Wait;
        }
        if let Some(i) = self.paths.iter().position(|p| !p.up() && p.usable()) {
            return Choice::Path(i);
        }
        if self.paths.iter().any(|p| p.up() && p.ana.lost()) {
            return Choice::Fail(IoStatus::Error(ANA_LOST));
        }
        if self.paths.iter().any(|p| p.up()) {
            // Up, but inaccessible or in change past ANATT.
            return Choice::Fail(IoStatus::Error(libc::EIO));
        }
        match self.paths.iter().position(|p| !p.removed) {
            Some(i) => Choice::Path(i),
            None => Choice::Fail(IoStatus::Error(libc::ENODEV)),
        }
    }

    /// Sends slot `s` to a path, parks it, or fails it (at the next poll); the path's own
    /// refusal comes back.
    fn send(&mut self, s: u32) -> Result<(), SubmitError> {
        match self.select() {
            Choice::Path(i) => {
                let req = IoRequest { tag: s, ..self.slots[s as usize].req };
                self.paths[i].ch.submit(&req)
            }
            Choice::Wait => {
                let slot = &mut self.slots[s as usize];
                slot.ready_at = 0;
                slot.from = 0;
                self.parked.push_back(s);
                Ok(())
            }
            Choice::Fail(status) => {
                self.done.push((self.slots[s as usize].req.tag, status));
                self.free.push(s);
                Ok(())
            }
        }
    }

    /// A path's completion of slot `s`.
    #[inline]
    fn completed(&mut self, i: usize, s: u32, status: IoStatus, now: u64, out: &mut Vec<(u32, IoStatus)>) {
        if status == IoStatus::Error(ANA_RETRY) {
            // The path's ANA state moved (its controller reads the page again): the command was
            // not carried out there, so it goes through another path at once; this path takes
            // no new I/O until the page is read.
            self.paths[i].ana = AnaWord(self.paths[i].ana.0 | ANA_UPDATING);
            let slot = &mut self.slots[s as usize];
            slot.ready_at = now;
            slot.status = IoStatus::Error(libc::EIO);
            slot.from = 0;
            self.parked.push_back(s);
            self.view.failovers.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let IoStatus::Error(errno) = status {
            let path = &self.paths[i];
            let path_failure =
                errno == RELEASED || (matches!(errno, libc::EIO | libc::ENODEV) && path.down_since.is_some());
            if path_failure && (errno == RELEASED || self.another_may_serve(i)) {
                let slot = &mut self.slots[s as usize];
                slot.ready_at = path.down_since.map_or(now, |d| d + path.quiesce_ticks);
                slot.status = if errno == RELEASED { IoStatus::Error(libc::EIO) } else { status };
                slot.from = path.id;
                self.parked.push_back(s);
                self.view.failovers.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        out.push((self.slots[s as usize].req.tag, status));
        self.free.push(s);
    }

    /// Another path is up and accessible, or may become so (ANA): a request off path `i`
    /// goes there, or waits for it.
    fn another_may_serve(&self, i: usize) -> bool {
        self.paths
            .iter()
            .enumerate()
            .any(|(j, p)| j != i && (p.serves(true) || p.serves(false) || p.may_serve()))
    }

    /// Notes path `i` up or down after its poll.
    #[inline]
    fn observe(&mut self, i: usize, now: u64) {
        let up = self.paths[i].up();
        let p = &mut self.paths[i];
        match (up, p.down_since) {
            (false, None) => {
                p.down_since = Some(now);
                p.quiesce_ticks = quiesce_ticks(&p.ch.shared);
                log::warn!(
                    "nvme {}n{}: path {} ({}) down; its requests move to another path after {} ms",
                    p.ch.shared.opts.name,
                    self.ns.nsid,
                    p.id,
                    p.ch.shared.transport.traddr(),
                    p.quiesce_ticks * 1000 / ticks::tick_rate().max(1)
                );
            }
            (true, Some(_)) => {
                p.down_since = None;
                log::info!("nvme {}n{}: path {} up again", p.ch.shared.opts.name, self.ns.nsid, p.id);
            }
            _ => {}
        }
    }

    /// Paths down whose quiesce bound passed give their held requests back, when another
    /// path is up to take them.
    #[cold]
    fn release_held(&mut self, now: u64) {
        for i in 0..self.paths.len() {
            let p = &self.paths[i];
            let Some(since) = p.down_since else { continue };
            if p.ch.in_flight() == 0
                || now < since + p.quiesce_ticks
                || p.ch.has_queue()
                || !p.old_queues_closed()
            {
                continue;
            }
            if self.another_may_serve(i) {
                self.paths[i].ch.release_held(RELEASED);
            }
        }
    }

    /// Sends parked requests whose time came.
    #[cold]
    fn unpark(&mut self, now: u64, out: &mut Vec<(u32, IoStatus)>) {
        for _ in 0..self.parked.len() {
            let Some(s) = self.parked.pop_front() else { break };
            let slot = &self.slots[s as usize];
            let closed = self.paths.iter().find(|p| p.id == slot.from).is_none_or(|p| p.old_queues_closed());
            if now < slot.ready_at || !closed {
                self.parked.push_back(s);
                continue;
            }
            match self.send(s) {
                Ok(()) => {}
                Err(SubmitError::Busy) => {
                    self.parked.push_front(s);
                    return;
                }
                Err(_) => {
                    out.push((self.slots[s as usize].req.tag, self.slots[s as usize].status));
                    self.free.push(s);
                }
            }
        }
    }

    /// Publishes what `bdev_nvme_get_io_paths` shows.
    #[cold]
    fn publish_view(&mut self) {
        // The thread's name once (a lock and a copy), at the first sweep.
        if !self.named {
            self.named = true;
            *lock(&self.view.thread) = std::thread::current().name().unwrap_or("unnamed").to_string();
        }
        let current = match self.set.policy() {
            Policy::ActivePassive => {
                let first = |optimized| self.paths.iter().find(|p| p.serves(optimized));
                first(true).or_else(|| first(false)).map_or(0, |p| p.id)
            }
            _ => self.paths.get(self.rr).filter(|p| p.serves(true) || p.serves(false)).map_or(0, |p| p.id),
        };
        self.view.current.store(current, Ordering::Relaxed);
        // An idle path's channel is polled only at sweeps: its counters go out here.
        for p in &self.paths {
            p.ch.publish_stats();
        }
        for (k, slot) in self.view.connected.iter().enumerate() {
            let id = self.paths.get(k).filter(|p| p.up()).map_or(0, |p| p.id);
            slot.store(id, Ordering::Relaxed);
        }
        for (k, slot) in self.view.ana.iter().enumerate() {
            let v = self.paths.get(k).map_or(0, |p| (p.id << 8) | u64::from(p.ana.0));
            slot.store(v, Ordering::Relaxed);
        }
    }
}

/// KATO + CQT of a path's controller, in ticks ([`UNREPORTED_CQT_MS`] for a CQT of 0).
fn quiesce_ticks<T: Transport>(shared: &Shared<T>) -> u64 {
    let cqt = u64::from(shared.snapshot().cdata.cqt);
    let ms = u64::from(shared.global.keep_alive_timeout_ms) + if cqt == 0 { UNREPORTED_CQT_MS } else { cqt };
    ((u128::from(ms) * u128::from(ticks::tick_rate())) / 1000).min(u128::from(u64::MAX)) as u64
}

impl<T: Transport> IoChannel for MultipathChannel<T> {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        let s = self.free.pop().ok_or(SubmitError::Busy)?;
        self.slots[s as usize] = Slot { req: *req, ready_at: 0, status: IoStatus::Error(libc::EIO), from: 0 };
        match self.send(s) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(e) => {
                self.free.push(s);
                Err(e)
            }
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        poll_kept(self, |c| &mut c.batch, done)
    }

    fn poll_batch(&mut self, out: &mut Vec<(u32, IoStatus)>) -> usize {
        let first = out.len();
        self.polls = self.polls.wrapping_add(1);
        let sweep = self.polls % SWEEP_EVERY == 0;
        if sweep {
            let _ = self.sync_paths(false);
            for p in &mut self.paths {
                p.ana = p.ch.ana();
            }
        }
        let now = ticks::now();
        let mut inner = std::mem::take(&mut self.inner);
        let mut any_down = false;
        for i in 0..self.paths.len() {
            // An idle path is polled at sweeps only: that is when it takes a new queue and a
            // path that came back is seen.
            if !sweep && self.paths[i].ch.in_flight() == 0 {
                any_down |= self.paths[i].down_since.is_some();
                continue;
            }
            inner.clear();
            self.paths[i].ch.poll_batch(&mut inner);
            self.observe(i, now);
            any_down |= self.paths[i].down_since.is_some();
            for &(s, status) in &inner {
                self.completed(i, s, status, now, out);
            }
        }
        self.inner = inner;
        if any_down {
            self.release_held(now);
        }
        if !self.parked.is_empty() {
            self.unpark(now, out);
        }
        if !self.done.is_empty() {
            out.append(&mut self.done);
        }
        if sweep {
            self.publish_view();
        }
        let n = out.len() - first;
        self.in_flight -= n;
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl<T: Transport> Shared<T> {
    /// A multipath channel over `set`, this controller its first path.
    pub(crate) fn open_multipath_channel(
        self: Arc<Self>,
        set: Arc<PathSet>,
        ns: &NsParams,
    ) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(MultipathChannel::open(self, set, ns)?))
    }

    /// `self` as [`Any`].
    pub(crate) fn any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
