//! QoS in the disk layer: a disk's limits and group membership, and each channel's FIFO of
//! requests that wait for them.
//!
//! A request over a limit never fails: the channel holds it (in arrival order, so a small
//! request cannot overtake a large one forever) and submits it from `poll` once the limits
//! allow, counting it in flight meanwhile. The control plane changes limits or membership and
//! bumps the disk's QoS generation; each channel compares that word once per poll and rereads
//! the settings only when it moved, so a disk without QoS pays one predictable branch per
//! submit. docs/qos.md has the design.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::qos::{ChannelQos, DiskQos, GroupChannel, MemberId, QosError, QosGroup, QosLimits, Wait};
use crate::{IoOp, IoRequest};

use crate::clock::ticks;

/// A disk's membership of a group.
#[derive(Clone)]
struct Membership {
    group: Arc<QosGroup>,
    id: MemberId,
    weight: u64,
}

/// A disk's QoS settings (in `DiskShared`).
pub(crate) struct DiskQosState {
    limits: DiskQos,
    /// Bumped after every change of limits or membership; read by channels once per poll.
    pub(crate) generation: AtomicU64,
    membership: Mutex<Option<Membership>>,
}

/// Why a disk's QoS settings could not change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskQosError {
    #[error("QoS needs the disk layer, and I/O statistics are switched off in this daemon (serve --no-iostat / [stats] iostat = false)")]
    /// The daemon runs without the disk layer's accounting, which QoS lives in.
    AccountingOff,
    #[error("is already in QoS group '{0}'")]
    /// The disk is in this group already.
    InGroup(String),
    #[error("is not in QoS group '{0}'")]
    /// The disk is not in this group.
    NotInGroup(String),
    #[error(transparent)]
    /// The limits themselves were refused.
    Qos(#[from] QosError),
}

impl DiskQosState {
    pub(crate) fn new() -> DiskQosState {
        DiskQosState {
            limits: DiskQos::new(ticks::tick_rate()),
            generation: AtomicU64::new(0),
            membership: Mutex::new(None),
        }
    }

    fn membership(&self) -> MutexGuard<'_, Option<Membership>> {
        self.membership.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn set_limits(&self, limits: QosLimits) -> Result<(), QosError> {
        self.limits.set(limits, ticks::now())?;
        self.changed();
        Ok(())
    }

    pub(crate) fn limits(&self) -> QosLimits {
        self.limits.limits()
    }

    pub(crate) fn join(&self, group: &Arc<QosGroup>, weight: u64) -> Result<(), DiskQosError> {
        let mut m = self.membership();
        if let Some(m) = &*m {
            return Err(DiskQosError::InGroup(m.group.name().to_string()));
        }
        let id = group.join(weight, ticks::now())?;
        *m = Some(Membership { group: group.clone(), id, weight });
        self.changed();
        Ok(())
    }

    pub(crate) fn leave(&self, group: &str) -> Result<(), DiskQosError> {
        let mut m = self.membership();
        match m.take() {
            Some(old) if old.group.name() == group => {
                // Channels drop their side at their next poll; until then they may still
                // count into the freed place (an accuracy blip for a joiner, nothing unsafe).
                let _ = old.group.leave(old.id);
                self.changed();
                Ok(())
            }
            other => {
                *m = other;
                Err(DiskQosError::NotInGroup(group.to_string()))
            }
        }
    }

    pub(crate) fn set_weight(&self, group: &str, weight: u64) -> Result<(), DiskQosError> {
        let mut m = self.membership();
        match &mut *m {
            Some(old) if old.group.name() == group => {
                old.group.set_weight(old.id, weight, ticks::now())?;
                old.weight = weight;
                Ok(())
            }
            _ => Err(DiskQosError::NotInGroup(group.to_string())),
        }
    }

    /// The group, the weight and the fair rate in force.
    pub(crate) fn group(&self) -> Option<(Arc<QosGroup>, u64, u64)> {
        self.membership().as_ref().map(|m| (m.group.clone(), m.weight, m.group.member_rate(m.id)))
    }
}

impl Drop for DiskQosState {
    fn drop(&mut self) {
        // The last channel is gone with the disk: its place in the group is free.
        if let Some(m) = self.membership().take() {
            let _ = m.group.leave(m.id);
        }
    }
}

/// A request held by a channel until its limits allow it.
struct Held {
    req: IoRequest,
    /// Its arrival tick (the wait is counted from it).
    arrived: u64,
    /// The retry tick the last refusal named.
    at: u64,
    stage: Stage,
}

/// How far a request got through the limits, so that a retry asks only what refused it.
#[derive(Default, Clone, Copy)]
struct Stage {
    disk_passed: bool,
    /// [`GroupChannel::admit`]'s stage.
    group: u8,
    /// Every limit passed; only the device's Busy held it.
    admitted: bool,
    /// It waited for a limit (it counts in the QoS statistics).
    waited: bool,
}

/// A channel's side of its disk's QoS.
pub(crate) struct ChannelQosState {
    /// Any limit or group applies: submits go through [`ChannelQosState::admit_new`].
    pub(crate) on: bool,
    /// The disk's generation last applied.
    seen: u64,
    disk_on: bool,
    disk: ChannelQos,
    /// Boxed: most disks are in no group, and the channel stays small.
    group: Option<Box<(Arc<QosGroup>, MemberId, GroupChannel)>>,
    held: VecDeque<Held>,
    /// Since when throttled time was last counted (valid while `held` is not empty).
    since: u64,
}

/// Requests a channel's FIFO holds before it grows (allocated when QoS first applies to it, not
/// per request): more than any frontend's virtqueue slots in practice.
const HELD_START: usize = 256;

/// What a channel does with a new request.
pub(crate) enum Admission {
    /// Submit it now.
    Go,
    /// Held; it counts as in flight.
    Held,
}

impl ChannelQosState {
    pub(crate) fn new() -> ChannelQosState {
        ChannelQosState {
            on: false,
            // Never equal to a disk's generation: the first poll applies the settings.
            seen: u64::MAX,
            disk_on: false,
            disk: ChannelQos::new(),
            group: None,
            held: VecDeque::new(),
            since: 0,
        }
    }

    /// Applies the disk's settings if they changed since the last look (once per poll).
    #[inline]
    pub(crate) fn refresh(&mut self, disk: &DiskQosState) {
        let generation = disk.generation.load(Ordering::Acquire);
        if generation != self.seen {
            self.apply(disk, generation);
        }
    }

    #[cold]
    #[inline(never)]
    fn apply(&mut self, disk: &DiskQosState, generation: u64) {
        self.seen = generation;
        self.disk_on = !disk.limits.limits().is_empty();
        let m = disk.membership().clone();
        let same = match (&self.group, &m) {
            (Some(b), Some(m)) => Arc::ptr_eq(&b.0, &m.group) && b.1 == m.id,
            (None, None) => true,
            _ => false,
        };
        if !same {
            self.group = m.map(|m| {
                let ch = GroupChannel::new(&m.group, m.id);
                Box::new((m.group, m.id, ch))
            });
        } else if let Some(b) = &mut self.group {
            // The group's config may have changed what fair sharing divides.
            let (g, _, ch) = &mut **b;
            ch.refresh(g);
        }
        self.on = self.disk_on || self.group.is_some();
        if self.on && self.held.capacity() == 0 {
            self.held.reserve(HELD_START);
        }
    }

    /// Asks every limit for a request of `op` and `len`, advancing its `stage`.
    #[inline]
    fn admit(
        &mut self,
        disk: &DiskQosState,
        op: IoOp,
        len: u64,
        stage: &mut Stage,
        now: u64,
    ) -> Result<(), Wait> {
        if !self.on {
            return Ok(());
        }
        if !stage.disk_passed {
            if self.disk_on {
                self.disk.admit(&disk.limits, now, op, len)?;
            }
            stage.disk_passed = true;
        }
        if let Some(b) = &mut self.group {
            let (g, _, ch) = &mut **b;
            ch.admit(g, now, op, len, &mut stage.group)?;
        }
        stage.admitted = true;
        Ok(())
    }

    /// A new request at `now`: go at once, or wait behind the held ones or for its limits.
    /// The common case, a disk with only its own limits and nothing held, is inlined into the
    /// submit path: [`ChannelQos::admit`]'s fast path and two tests.
    #[inline(always)]
    pub(crate) fn admit_new(&mut self, disk: &DiskQosState, req: &IoRequest, now: u64) -> Admission {
        if self.held.is_empty() {
            match &mut self.group {
                // `on` without a group means the disk has limits of its own.
                None => {
                    return match self.disk.admit(&disk.limits, now, req.op, req.len) {
                        Ok(()) => Admission::Go,
                        Err(Wait(at)) => self.hold_refused(req, now, at, Stage::default()),
                    }
                }
                Some(b) if !self.disk_on => {
                    let (g, _, ch) = &mut **b;
                    let mut group = 0;
                    return match ch.admit(g, now, req.op, req.len, &mut group) {
                        Ok(()) => Admission::Go,
                        Err(Wait(at)) => {
                            let stage = Stage { disk_passed: true, group, ..Stage::default() };
                            self.hold_refused(req, now, at, stage)
                        }
                    };
                }
                Some(_) => {}
            }
        }
        self.admit_general(disk, req, now)
    }

    /// A new request refused at `stage` with nothing held: it heads the FIFO.
    #[cold]
    #[inline(never)]
    fn hold_refused(&mut self, req: &IoRequest, now: u64, at: u64, stage: Stage) -> Admission {
        self.since = now;
        let stage = Stage { waited: true, ..stage };
        self.held.push_back(Held { req: *req, arrived: now, at, stage });
        Admission::Held
    }

    /// [`ChannelQosState::admit_new`] for a disk in a group, or with requests held.
    #[inline(never)]
    fn admit_general(&mut self, disk: &DiskQosState, req: &IoRequest, now: u64) -> Admission {
        let mut stage = Stage::default();
        let mut at = now;
        if self.held.is_empty() {
            match self.admit(disk, req.op, req.len, &mut stage, now) {
                Ok(()) => return Admission::Go,
                Err(Wait(retry)) => {
                    at = retry;
                    self.since = now;
                }
            }
        }
        stage.waited = true;
        self.held.push_back(Held { req: *req, arrived: now, at, stage });
        Admission::Held
    }

    /// A request that passed its limits but that the device refused as Busy: first in line
    /// for the next poll, its limits already paid.
    pub(crate) fn hold_admitted(&mut self, req: &IoRequest, now: u64) {
        let stage = Stage { disk_passed: true, group: 2, admitted: true, waited: false };
        if self.held.is_empty() {
            self.since = now;
        }
        self.held.push_front(Held { req: *req, arrived: now, at: now, stage });
    }

    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Takes the held requests the limits now allow, in order, handing each to `submit`
    /// (which returns false when the device is busy: the request goes back to the head and
    /// the round ends). Counts waits and throttled time in `stats`. Returns how many went.
    pub(crate) fn release(
        &mut self,
        disk: &DiskQosState,
        now: u64,
        stats: &super::stats::ChannelSlot,
        mut submit: impl FnMut(&IoRequest) -> bool,
    ) -> usize {
        let mut sent = 0;
        while let Some(mut h) = self.held.pop_front() {
            // Without QoS any more (a limit removed), whatever waits goes at once.
            if !h.stage.admitted && self.on {
                if now < h.at {
                    self.held.push_front(h);
                    break;
                }
                if let Err(Wait(at)) = self.admit(disk, h.req.op, h.req.len, &mut h.stage, now) {
                    h.at = at;
                    self.held.push_front(h);
                    break;
                }
            }
            if !submit(&h.req) {
                self.held.push_front(h);
                break;
            }
            if h.stage.waited {
                stats.qos_admitted(now.saturating_sub(h.arrived));
            }
            sent += 1;
        }
        stats.qos_throttled(now.saturating_sub(self.since));
        self.since = now;
        sent
    }
}
