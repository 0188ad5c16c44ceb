//! The vhost-user protocol for one connection, on the control plane.
//!
//! [`Connection`] implements `vhost`'s `VhostUserBackendReqHandlerMut`: it records what the
//! frontend configures (features, memory table, ring sizes/addresses/fds) and starts a queue on
//! its reactor once the ring is fully described, enabled and kicked (vhost-user.rst, "Starting
//! and stopping rings"). Anything that changes what a running queue depends on (GET_VRING_BASE,
//! SET_VRING_ENABLE 0, a memory-table change, disconnect) first stops the queue by message and
//! waits for its in-flight requests, so the reactor never touches memory that is being unmapped.
//!
//! Live migration (vhost-user.rst, "Migration"): SET_LOG_BASE maps the dirty log
//! ([`crate::log`]); VHOST_F_LOG_ALL (SET_FEATURES) and VHOST_VRING_F_LOG (SET_VRING_ADDR) turn
//! logging on and off while the queues run, the only changes accepted on a running queue. Each
//! change reaches the running queues by a message their reactors run before the reply, so every
//! guest write after the reply is logged as the front-end asked.
//!
//! Any error returned here makes the listener close the connection (logged with the reason);
//! the disk and other connections are unaffected.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_reactor::{PollerId, ReactorHandle};
use fp_virtio_blk::config::{config_space, device_features};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig, VhostUserSharedMsg,
    VhostUserSingleMemoryRegion, VhostUserVirtioFeatures, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    Backend, Error as VuError, GpuBackend, Result as VuResult, VhostUserBackendReqHandlerMut,
};
use vhost::VhostUserMemoryRegionBase;

use crate::inflight::InflightArea;
use crate::log::{log_bytes_for, map_log, QueueLog};
use crate::memory::{MemoryMap, MAX_MEM_REGIONS};
use crate::queue::{QueuePoller, QueueSetup, StopMode, StopReply};
use crate::state::ControllerState;
use crate::HandOff;
use fp_virtq::{DirtyLog, RingLog, LOG_PAGE};

/// Largest ring the device accepts (libblkio asks for 256, QEMU for 128 or 256).
pub const MAX_QUEUE_SIZE: u32 = 1024;

/// How long past a stop's bound the control plane waits for the queue's answer: the queue
/// answers at the bound itself, in its reactor's next round; only a reactor that no longer runs
/// would not.
pub const STOP_REPLY_MARGIN: Duration = Duration::from_secs(2);

/// The feature bits the connection itself looks at, as masks.
const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
const VIRTIO_F_RING_PACKED: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
/// VHOST_F_LOG_ALL (bit 26): the front-end wants every write to guest memory logged.
const VHOST_F_LOG_ALL: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();

#[derive(Default)]
struct Vring {
    size: Option<u16>,
    /// desc, used, avail as VMM virtual addresses.
    addrs: Option<(u64, u64, u64)>,
    /// SET_VRING_BASE's value (split: the next available index; packed: both positions and
    /// wrap counters, vhost-user.rst).
    base: u32,
    kick: Option<File>,
    call: Option<File>,
    enabled: bool,
    running: Option<(usize, PollerId)>,
    /// SET_VRING_ADDR's `log_guest_addr` while its VHOST_VRING_F_LOG flag is set.
    log_addr: Option<u64>,
    /// Guest addresses of the descriptor ring and the used ring (split) or device event area
    /// (packed) of the running queue.
    ring_gpa: (u64, u64),
}

/// Protocol state of one frontend connection.
pub struct Connection {
    shared: Arc<ControllerState>,
    acked_features: u64,
    protocol_features: u64,
    memory: MemoryMap,
    vrings: Vec<Vring>,
    /// The in-flight area (GET/SET_INFLIGHT_FD), shared with the front-end.
    inflight: Option<Arc<InflightArea>>,
    /// The dirty log (SET_LOG_BASE), shared with the front-end.
    log: Option<Arc<DirtyLog>>,
}

fn invalid(what: &'static str) -> VuError {
    VuError::InvalidOperation(what)
}

impl Connection {
    pub fn new(shared: Arc<ControllerState>) -> Connection {
        let vrings = (0..shared.num_queues).map(|_| Vring::default()).collect();
        Connection {
            shared,
            acked_features: 0,
            protocol_features: 0,
            memory: MemoryMap::default(),
            vrings,
            inflight: None,
            log: None,
        }
    }

    /// The controller this connection serves.
    pub(crate) fn shared(&self) -> &Arc<ControllerState> {
        &self.shared
    }

    /// Whether the front-end negotiated VHOST_USER_PROTOCOL_F_LOG_SHMFD (SET_LOG_BASE then
    /// carries the log as an fd).
    pub(crate) fn log_shmfd_negotiated(&self) -> bool {
        self.protocol_features & VhostUserProtocolFeatures::LOG_SHMFD.bits() != 0
    }

    fn offered_features(&self) -> u64 {
        device_features(&self.shared.disk)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | VHOST_F_LOG_ALL
    }

    fn log_all(&self) -> bool {
        self.acked_features & VHOST_F_LOG_ALL != 0
    }

    /// Whether the front-end asked for any logging (of the data path or of some ring).
    fn logging(&self) -> bool {
        self.log_all() || self.vrings.iter().any(|v| v.log_addr.is_some())
    }

    /// What queue `index` logs now. The ring logs its used side at `log_guest_addr` when the
    /// front-end set VHOST_VRING_F_LOG, and at the used ring's own address when it only acked
    /// LOG_ALL (logging more than asked is harmless; less would lose writes).
    fn queue_log(&self, index: usize) -> QueueLog {
        let Some(log) = &self.log else { return QueueLog::default() };
        let v = &self.vrings[index];
        let (desc, used) = v.ring_gpa;
        let ring_at = v.log_addr.or(self.log_all().then_some(used));
        QueueLog {
            data: self.log_all().then(|| log.clone()),
            ring: ring_at.map(|at| RingLog::new(log.clone(), at, desc)),
        }
    }

    /// Hands queue `index`'s log setting to it if it runs, and returns once its reactor has
    /// taken it: every guest write after this is logged as it says.
    fn update_queue_log(&self, index: usize) -> VuResult<()> {
        let Some((_, id)) = self.vrings[index].running else { return Ok(()) };
        let log = self.queue_log(index);
        self.reactor_for(index)
            .call(move |r| {
                if let Some(p) = r.poller_mut::<QueuePoller>(id) {
                    p.set_log(log);
                }
            })
            .ok_or(invalid("reactor is gone"))
    }

    fn update_queue_logs(&self) -> VuResult<()> {
        (0..self.vrings.len()).try_for_each(|i| self.update_queue_log(i))
    }

    /// Refuses a memory layout reaching `end` (exclusive) that the log has no bits for, while
    /// logging is on: the writes there could not be logged and the migration would lose them.
    /// (QEMU grows the log before it grows the memory table.)
    fn check_log_covers(&self, end: u64) -> VuResult<()> {
        match &self.log {
            Some(log) if self.logging() && !log.covers(end) => {
                log::warn!(
                    "{}: memory up to {end:#x} refused: the dirty log ({:#x} bytes) covers only up to {:#x}, \
                     {:#x} bytes needed",
                    self.shared.name,
                    log.len(),
                    log.len() as u64 * 8 * LOG_PAGE,
                    log_bytes_for(end)
                );
                Err(invalid("memory table not covered by the dirty log"))
            }
            _ => Ok(()),
        }
    }

    fn packed(&self) -> bool {
        self.acked_features & VIRTIO_F_RING_PACKED != 0
    }

    /// Whether the front-end acked VHOST_USER_F_PROTOCOL_FEATURES (rings then start disabled
    /// and SET_VRING_ENABLE is allowed).
    pub(crate) fn protocol_features_negotiated(&self) -> bool {
        self.acked_features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0
    }

    /// Whether a request with NEED_REPLY gets an acknowledgement (VHOST_USER_PROTOCOL_F_REPLY_ACK).
    pub(crate) fn reply_ack_negotiated(&self) -> bool {
        self.protocol_features_negotiated()
            && self.protocol_features & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
    }

    fn vring(&mut self, index: u32) -> VuResult<&mut Vring> {
        self.vrings.get_mut(index as usize).ok_or(VuError::InvalidParam)
    }

    fn reactor_for(&self, index: usize) -> &ReactorHandle {
        &self.shared.reactors[index % self.shared.reactors.len()]
    }

    /// Starts the queue if it is fully described, enabled and not running.
    fn try_start(&mut self, index: usize) -> VuResult<()> {
        let enabled_by_default = !self.protocol_features_negotiated();
        let v = &self.vrings[index];
        if v.running.is_some() || !(v.enabled || enabled_by_default) {
            return Ok(());
        }
        let (Some(size), Some((desc, used, avail)), Some(kick)) = (v.size, v.addrs, v.kick.as_ref()) else {
            return Ok(());
        };
        let mem = self.memory.snapshot().ok_or(invalid("ring kicked before any memory table"))?;
        let n = u64::from(size);
        let packed = self.packed();
        // Split: descriptor table, available ring, used ring (virtio 1.2 §2.7). Packed: the
        // descriptor ring and the driver and device event suppression areas (§2.8).
        let (avail_len, used_len) = if packed { (4, 4) } else { (6 + 2 * n, 6 + 8 * n) };
        let desc_gpa = self
            .memory
            .user_to_guest(desc, 16 * n)
            .ok_or(invalid("descriptor table address outside memory"))?;
        let avail_gpa = self
            .memory
            .user_to_guest(avail, avail_len)
            .ok_or(invalid("available ring address outside memory"))?;
        let used_gpa =
            self.memory.user_to_guest(used, used_len).ok_or(invalid("used ring address outside memory"))?;
        let kick = kick.try_clone().map_err(VuError::ReqHandlerError)?;
        // Without a call fd the guest is never interrupted; use a private eventfd so the queue
        // still works for a polling driver.
        let call = match v.call.as_ref() {
            Some(c) => c.try_clone().map_err(VuError::ReqHandlerError)?,
            None => private_eventfd()?,
        };
        let base = v.base;
        // Before `queue_log`, which logs the ring at these addresses.
        self.vrings[index].ring_gpa = (desc_gpa.0, used_gpa.0);
        // During a migration within this daemon the disk may have a second controller; only
        // one of them writes at a time (crate::HandOff).
        let hold = match HandOff::hold(&self.shared.handoff, &self.shared.name) {
            Ok(hold) => hold,
            Err(holder) => {
                log::warn!(
                    "{} queue {index}: not started: the disk is served by controller '{holder}', whose \
                     queues still run (a migration hand-off stops them first)",
                    self.shared.name
                );
                return Err(invalid("the disk is served by another controller"));
            }
        };
        let setup = QueueSetup {
            controller: self.shared.name.clone(),
            index: index as u16,
            size,
            desc: desc_gpa,
            avail: avail_gpa,
            used: used_gpa,
            base,
            event_idx: self.acked_features & VIRTIO_RING_F_EVENT_IDX != 0,
            packed,
            mem,
            kick,
            call,
            bdev: self.shared.bdev.clone(),
            disk: self.shared.disk_now(),
            capacity_sectors: self.shared.capacity_sectors.clone(),
            serial: self.shared.serial,
            stats: self.shared.queue_stats[index].clone(),
            inflight: self.inflight.clone(),
            coalescing: self.shared.coalescing.clone(),
            clock: crate::coalesce::Clock::Monotonic,
            log: self.queue_log(index),
            // A queue that does not start drops it with the setup.
            hold: Some(hold),
        };
        let reactor = self.reactor_for(index).clone();
        let started = reactor
            .call(move |r| QueuePoller::new(setup).map(|p| r.add_poller(Box::new(p))))
            .ok_or(invalid("reactor is gone"));
        match started? {
            Ok(id) => {
                log::info!(
                    "{} queue {index}: started on reactor {} (size {size})",
                    self.shared.name,
                    reactor.id()
                );
                self.vrings[index].running = Some((reactor.id(), id));
                Ok(())
            }
            Err(e) => {
                log::warn!("{}: {e}", self.shared.name);
                Err(invalid("queue could not start"))
            }
        }
    }

    /// Stops the queue if running; its ring position becomes the vring base.
    fn stop(&mut self, index: usize) -> VuResult<()> {
        self.stop_queues(&[index])
    }

    /// Stops the running queues among `indices`, all at once, each bounded by the controller's
    /// stop timeout (docs/architecture.md, "Stopping a queue"); each one's ring position
    /// becomes its vring base. A queue the bdev still holds requests of at the bound fails the
    /// stop (and so the connection): it stays on its reactor, taking nothing, with the guest
    /// memory mapped, until the bdev gives them back.
    fn stop_queues(&mut self, indices: &[usize]) -> VuResult<()> {
        let bound = self.shared.stop_timeout;
        let mut waiting = Vec::new();
        for &index in indices {
            let Some((_, id)) = self.vrings[index].running.take() else { continue };
            let (tx, rx) = sync_channel::<StopReply>(1);
            self.reactor_for(index).send(move |r| match r.poller_mut::<QueuePoller>(id) {
                Some(p) => p.request_stop(StopMode::Drain, bound, tx),
                // Already gone: nothing in flight. Dropping tx tells the waiter.
                None => drop(tx),
            });
            waiting.push((index, rx));
        }
        let deadline = Instant::now() + bound + STOP_REPLY_MARGIN;
        let name = &self.shared.name;
        let mut result = Ok(());
        for (index, rx) in waiting {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok(stopped)) => {
                    self.vrings[index].base = stopped.base;
                    // The queue released its hold on the disk before answering. (A queue that
                    // does not stop in time keeps it until the bdev completes what it holds:
                    // the other controller must not write beside it.)
                    if stopped.failed_at_bound + stopped.left_in_flight_area > 0 {
                        log::warn!(
                            "{name} queue {index}: stopped at {:#x} after {:?}, at its bound of {bound:?}: \
                             {} requests refused as busy failed with IOERR, {} left in the in-flight area",
                            stopped.base,
                            stopped.took,
                            stopped.failed_at_bound,
                            stopped.left_in_flight_area
                        );
                    } else {
                        log::info!("{name} queue {index}: stopped at {:#x}", stopped.base);
                    }
                }
                Ok(Err(stuck)) => {
                    // The queue logged the details; the front-end learns it by the error.
                    log::error!("{name}: {stuck}");
                    result = Err(invalid("queue did not stop"));
                }
                Err(RecvTimeoutError::Timeout) => {
                    log::error!(
                        "{name} queue {index}: no answer to its stop within {:?} (its reactor does \
                         not run)",
                        bound + STOP_REPLY_MARGIN
                    );
                    result = Err(invalid("queue did not stop"));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    log::error!("{name} queue {index}: gone from its reactor before it was stopped");
                    result = Err(invalid("queue did not stop"));
                }
            }
        }
        result
    }

    fn running_queues(&self) -> Vec<usize> {
        (0..self.vrings.len()).filter(|&i| self.vrings[i].running.is_some()).collect()
    }

    /// Stops running queues around a memory change and restarts them on the new snapshot.
    fn with_queues_stopped(&mut self, change: impl FnOnce(&mut MemoryMap) -> VuResult<()>) -> VuResult<()> {
        let running = self.running_queues();
        self.stop_queues(&running)?;
        change(&mut self.memory)?;
        for i in running {
            self.try_start(i)?;
        }
        Ok(())
    }

    /// Stops every queue (disconnect, reset).
    pub fn stop_all(&mut self) {
        let _ = self.stop_queues(&self.running_queues());
    }

    fn reset(&mut self) {
        self.stop_all();
        let n = self.vrings.len();
        self.vrings = (0..n).map(|_| Vring::default()).collect();
        self.acked_features = 0;
        self.log = None;
    }
}

fn private_eventfd() -> VuResult<File> {
    fp_sys::eventfd().map(File::from).map_err(VuError::ReqHandlerError)
}

/// Checks that a kick, call or err fd is an eventfd and makes sure writing it never blocks.
///
/// The frontend chooses these fds. Anything else (a pipe, a socket) could fill up, and a
/// blocking eventfd whose counter the frontend has pushed to its maximum blocks every further
/// write: either would stall the reactor, and every other disk on it, in the middle of a
/// notification. The fd's file description is shared with the frontend, so O_NONBLOCK becomes
/// visible there too; QEMU, cloud-hypervisor and libblkio create theirs non-blocking anyway.
fn checked_eventfd(fd: File, what: &'static str) -> VuResult<File> {
    let link =
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(VuError::ReqHandlerError)?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        log::warn!("{what} fd is not an eventfd ({})", link.display());
        return Err(VuError::InvalidParam);
    }
    fp_sys::set_nonblocking(fd.as_fd()).map_err(VuError::ReqHandlerError)?;
    Ok(fd)
}

fn mem_error(e: crate::memory::MemoryError) -> VuError {
    log::warn!("memory table rejected: {e}");
    VuError::InvalidParam
}

impl VhostUserBackendReqHandlerMut for Connection {
    fn set_owner(&mut self) -> VuResult<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        self.reset();
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        self.reset();
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        Ok(self.offered_features())
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        if features & !self.offered_features() != 0 {
            log::warn!("{}: driver acked features {features:#x} we did not offer", self.shared.name);
            return Err(VuError::InvalidParam);
        }
        if features & VHOST_F_LOG_ALL != 0 && !self.log_shmfd_negotiated() {
            log::warn!(
                "{}: VHOST_F_LOG_ALL acked without VHOST_USER_PROTOCOL_F_LOG_SHMFD: the dirty log can \
                 only be a shared-memory fd (SET_LOG_BASE)",
                self.shared.name
            );
            return Err(invalid("VHOST_F_LOG_ALL without VHOST_USER_PROTOCOL_F_LOG_SHMFD"));
        }
        if self.running_queues().is_empty() {
            self.acked_features = features;
            return Ok(());
        }
        // QEMU toggles LOG_ALL on a running device when a migration starts and ends; anything
        // else would change what the running queues were started with.
        let changed = features ^ self.acked_features;
        if changed & !VHOST_F_LOG_ALL != 0 {
            return Err(invalid("SET_FEATURES while queues run (only VHOST_F_LOG_ALL may change)"));
        }
        if changed == 0 {
            return Ok(());
        }
        self.acked_features = features;
        // Turning logging on with a log that misses part of memory would lose writes there
        // (turning it off is always fine).
        if let (true, Some(mem)) = (self.log_all(), self.memory.snapshot()) {
            if let Err(e) = self.check_log_covers(crate::log::memory_end(&mem)) {
                self.acked_features ^= VHOST_F_LOG_ALL;
                return Err(e);
            }
        }
        log::info!(
            "{}: dirty logging of all writes {}",
            self.shared.name,
            if self.log_all() { "started" } else { "stopped" }
        );
        self.update_queue_logs()
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        if ctx.len() != files.len() {
            return Err(VuError::InvalidParam);
        }
        self.check_log_covers(
            ctx.iter().map(|r| r.guest_phys_addr.saturating_add(r.memory_size)).max().unwrap_or(0),
        )?;
        self.with_queues_stopped(|m| m.set_table(ctx, files).map_err(mem_error))?;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        if num == 0 || num > MAX_QUEUE_SIZE || !num.is_power_of_two() {
            log::warn!("queue size {num} is not a power of two up to {MAX_QUEUE_SIZE}");
            return Err(VuError::InvalidParam);
        }
        let v = self.vring(index)?;
        if v.running.is_some() {
            return Err(invalid("SET_VRING_NUM on a running queue"));
        }
        v.size = Some(num as u16);
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        log: u64,
    ) -> VuResult<()> {
        let log_addr = flags.contains(VhostUserVringAddrFlags::VHOST_VRING_F_LOG).then_some(log);
        let packed = self.packed();
        let log_end = self.log.as_ref().map(|l| l.len() as u64 * 8 * LOG_PAGE);
        let name = self.shared.name.clone();
        let v = self.vring(index)?;
        if let (Some(at), Some(end), Some(size)) = (log_addr, log_end, v.size) {
            // vhost-user.rst, "Migration": the last byte of the logged ring must be in the log.
            let len = if packed { 4 } else { 6 + 8 * u64::from(size) };
            if at.checked_add(len).is_none_or(|e| e > end) {
                log::warn!("{name}: queue {index}: log_guest_addr {at:#x} (+{len}) is beyond the dirty log's {end:#x}");
                return Err(VuError::InvalidParam);
            }
        }
        if v.running.is_none() {
            v.addrs = Some((descriptor, used, available));
            v.log_addr = log_addr;
            return Ok(());
        }
        // QEMU sets and clears VHOST_VRING_F_LOG on running rings when a migration starts and
        // ends (and waits for REPLY_ACK): that alone is accepted while the queue runs.
        if v.addrs != Some((descriptor, used, available)) {
            return Err(invalid("SET_VRING_ADDR on a running queue may only change VHOST_VRING_F_LOG"));
        }
        if v.log_addr == log_addr {
            return Ok(());
        }
        v.log_addr = log_addr;
        log::info!(
            "{name} queue {index}: used ring logging {}",
            if log_addr.is_some() { "started" } else { "stopped" }
        );
        self.update_queue_log(index as usize)
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        let packed = self.packed();
        let v = self.vring(index)?;
        if v.running.is_some() {
            return Err(invalid("SET_VRING_BASE on a running queue"));
        }
        v.base = base;
        // A split ring's base is a 16-bit index; a packed ring's packs two 15-bit positions and
        // their wrap counters (checked against the ring size when the queue starts).
        if !packed && base > u32::from(u16::MAX) {
            return Err(VuError::InvalidParam);
        }
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        self.vring(index)?;
        self.stop(index as usize)?;
        let v = &mut self.vrings[index as usize];
        // The ring is stopped now; a new kick starts it again (vhost-user.rst).
        v.kick = None;
        Ok(VhostUserVringState::new(index, v.base))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let index = u32::from(index);
        self.vring(index)?;
        let Some(fd) = fd else {
            return Err(invalid("polling rings without a kick fd are not supported"));
        };
        let fd = checked_eventfd(fd, "kick")?;
        self.stop(index as usize)?;
        self.vrings[index as usize].kick = Some(fd);
        self.try_start(index as usize)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = usize::from(index);
        self.vring(u32::from(index))?;
        self.vrings[i].call = fd.map(|f| checked_eventfd(f, "call")).transpose()?;
        if let (Some((_, id)), Some(call)) = (self.vrings[i].running, self.vrings[i].call.as_ref()) {
            let call = call.try_clone().map_err(VuError::ReqHandlerError)?;
            self.reactor_for(i).send(move |r| {
                if let Some(p) = r.poller_mut::<QueuePoller>(id) {
                    p.set_call(call);
                }
            });
        }
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        // We never report ring errors through the err fd (failures are logged and counted),
        // but a frontend that sends something else than an eventfd is confused or hostile.
        self.vring(u32::from(index))?;
        fd.map(|f| checked_eventfd(f, "err")).transpose().map(|_| ())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::INFLIGHT_SHMFD
            // Live migration: the dirty log is a shared-memory fd (SET_LOG_BASE).
            | VhostUserProtocolFeatures::LOG_SHMFD
            // For config-change notifications (a resized disk): BlkController::resize.
            | VhostUserProtocolFeatures::BACKEND_REQ)
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        let offered = self.get_protocol_features()?.bits();
        if features & !offered != 0 {
            return Err(VuError::InvalidParam);
        }
        self.protocol_features = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        Ok(u64::from(self.shared.num_queues))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        self.vring(index)?.enabled = enable;
        if enable {
            self.try_start(index as usize)
        } else {
            self.stop(index as usize)
        }
    }

    fn get_config(&mut self, offset: u32, size: u32, _flags: VhostUserConfigFlags) -> VuResult<Vec<u8>> {
        let cfg = config_space(&self.shared.disk_now(), self.shared.num_queues);
        let bytes = cfg.to_bytes();
        let start = offset as usize;
        let end = start.checked_add(size as usize).ok_or(VuError::InvalidParam)?;
        if end > bytes.len() {
            // Frontends may read a larger struct than this device version defines: pad with
            // zeroes up to the vhost-user config limit (256 bytes), refuse beyond.
            if end > 256 {
                log::warn!(
                    "{}: GET_CONFIG of {size} bytes at offset {offset} refused: past the 256-byte config space",
                    self.shared.name
                );
                return Err(VuError::InvalidParam);
            }
            let mut out = vec![0u8; size as usize];
            if start < bytes.len() {
                out[..bytes.len() - start].copy_from_slice(&bytes[start..]);
            }
            return Ok(out);
        }
        Ok(bytes[start..end].to_vec())
    }

    fn set_config(&mut self, _offset: u32, _buf: &[u8], _flags: VhostUserConfigFlags) -> VuResult<()> {
        // No writable config fields are offered (no VIRTIO_BLK_F_CONFIG_WCE).
        Err(invalid("config space is read-only"))
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> VuResult<()> {
        Err(invalid("not a GPU device"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> VuResult<File> {
        Err(invalid("shared objects are not supported"))
    }

    fn get_inflight_fd(&mut self, inflight: &VhostUserInflight) -> VuResult<(VhostUserInflight, File)> {
        if inflight.num_queues == 0
            || inflight.num_queues > self.shared.num_queues
            || u32::from(inflight.queue_size) > MAX_QUEUE_SIZE
        {
            return Err(VuError::InvalidParam);
        }
        let (area, file, size) =
            InflightArea::create(inflight.num_queues, inflight.queue_size).map_err(|e| {
                log::warn!("{}: {e}", self.shared.name);
                VuError::InvalidParam
            })?;
        log::info!(
            "{}: new in-flight area for {} queues of {} entries",
            self.shared.name,
            inflight.num_queues,
            inflight.queue_size
        );
        self.inflight = Some(area);
        Ok((VhostUserInflight::new(size, 0, inflight.num_queues, inflight.queue_size), file))
    }

    fn set_inflight_fd(&mut self, inflight: &VhostUserInflight, file: File) -> VuResult<()> {
        if !self.running_queues().is_empty() {
            return Err(invalid("SET_INFLIGHT_FD while queues run"));
        }
        if u32::from(inflight.queue_size) > MAX_QUEUE_SIZE || inflight.num_queues > self.shared.num_queues {
            return Err(VuError::InvalidParam);
        }
        let area = InflightArea::map(
            &file,
            inflight.mmap_size,
            inflight.mmap_offset,
            inflight.num_queues,
            inflight.queue_size,
        )
        .map_err(|e| {
            log::warn!("{}: {e}", self.shared.name);
            VuError::InvalidParam
        })?;
        log::info!("{}: in-flight area attached ({} bytes)", self.shared.name, inflight.mmap_size);
        self.inflight = Some(area);
        Ok(())
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        Ok(MAX_MEM_REGIONS as u64)
    }

    fn add_mem_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
        fd: File,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        let r: VhostUserMemoryRegion = **region;
        let end = self.memory.snapshot().map_or(0, |m| crate::log::memory_end(&m));
        self.check_log_covers(end.max(r.guest_phys_addr.saturating_add(r.memory_size)))?;
        self.with_queues_stopped(|m| m.add(&r, fd).map_err(mem_error))?;
        Ok(None)
    }

    fn remove_mem_region(&mut self, region: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        let r: VhostUserMemoryRegion = **region;
        self.with_queues_stopped(|m| m.remove(&r).map_err(mem_error))
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> VuResult<Option<File>> {
        Err(invalid("device state transfer is not supported"))
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        Err(invalid("device state transfer is not supported"))
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        Err(invalid("shared memory regions are not supported"))
    }

    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> VuResult<()> {
        // `vhost` only passes this on with LOG_SHMFD negotiated (the fd is the log itself).
        let mem = self.memory.snapshot();
        let new = map_log(file, log.mmap_size, log.mmap_offset, mem.as_deref()).map_err(|e| {
            log::warn!("{}: SET_LOG_BASE refused: {e}", self.shared.name);
            VuError::InvalidParam
        })?;
        log::info!(
            "{}: dirty log attached ({:#x} bytes, guest memory below {:#x})",
            self.shared.name,
            new.len(),
            new.len() as u64 * 8 * LOG_PAGE
        );
        // QEMU replaces the log while logging (it grows with memory) and, once we have
        // replied, syncs and frees the old one: the queues must be writing the new one by then.
        self.log = Some(new);
        self.update_queue_logs()
    }

    fn set_backend_req_fd(&mut self, _backend: Backend) {}
}
