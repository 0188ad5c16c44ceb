//! What one controller shares between its listener thread, its connections and
//! [`BlkController::info`](crate::BlkController::info): the disk as offered, its current size,
//! the queues' counters and the stop signal.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fp_bdev::Bdev;
use fp_reactor::ReactorHandle;
use fp_virtio_blk::{DiskParams, VIRTIO_BLK_ID_BYTES};

use crate::config::ControllerConfig;
use crate::{CoalescingSettings, Error, HandOff, QueueStats};

/// The largest discard / write-zeroes request we accept, in sectors (2 GiB): large enough that
/// guests rarely split, small enough that one request cannot monopolise a backend.
const MAX_DISCARD_SECTORS: u32 = 1 << 22;

/// Controller state shared by the listener thread, its connections and `info()`.
pub struct ControllerState {
    pub name: Arc<str>,
    pub bdev: Bdev,
    /// The geometry offered; its capacity is the one at creation, [`ControllerState::disk_now`] has the
    /// current one.
    pub disk: DiskParams,
    /// The capacity now, in 512-byte sectors: changed by [`BlkController::resize`](crate::BlkController::resize), read by the
    /// config space and by each queue once per round.
    pub capacity_sectors: Arc<AtomicU64>,
    /// This controller's end of the frontend's backend channel (SET_BACKEND_REQ_FD), while a
    /// frontend that set one is connected: config-change notifications go there.
    pub(crate) backend_channel: Mutex<Option<UnixStream>>,
    pub serial: [u8; VIRTIO_BLK_ID_BYTES],
    pub num_queues: u16,
    pub reactors: Vec<ReactorHandle>,
    pub queue_stats: QueueStatsTable,
    pub(crate) connected: AtomicBool,
    /// Signalled once to stop the controller thread; it waits on this fd beside its sockets, so
    /// an idle controller never wakes up.
    pub(crate) stop: StopSignal,
    /// Guest notification coalescing, read by the queues per batch.
    pub coalescing: Arc<CoalescingSettings>,
    /// Which controller on this disk may run queues ([`HandOff`]).
    pub handoff: Arc<HandOff>,
    /// The bound of one queue stop (GET_VRING_BASE, a memory change, a disconnect).
    pub stop_timeout: Duration,
}

impl ControllerState {
    /// The controller's state before any socket exists: geometry, serial and an unraised stop.
    pub(crate) fn new(config: ControllerConfig) -> Result<Arc<ControllerState>, Error> {
        let info = config.bdev.info().clone();
        let disk = DiskParams {
            capacity_sectors: info.size_bytes() / fp_virtio_blk::SECTOR_SIZE,
            block_size: info.block_size,
            read_only: config.read_only,
            flush: info.io_types.flush,
            // Both change data: a read-only export does not offer them at all.
            discard: info.io_types.unmap && !config.read_only,
            write_zeroes: info.io_types.write_zeroes && !config.read_only,
            max_discard_sectors: MAX_DISCARD_SECTORS,
            max_write_zeroes_sectors: MAX_DISCARD_SECTORS,
        };
        let mut serial = [0u8; VIRTIO_BLK_ID_BYTES];
        let n = config.name.len().min(VIRTIO_BLK_ID_BYTES);
        serial[..n].copy_from_slice(&config.name.as_bytes()[..n]);
        if config.reactors.is_empty() {
            return Err(Error::Other("no reactor to run the queues on".into()));
        }
        Ok(Arc::new(ControllerState {
            name: config.name.as_str().into(),
            bdev: config.bdev,
            capacity_sectors: Arc::new(AtomicU64::new(disk.capacity_sectors)),
            backend_channel: Mutex::new(None),
            disk,
            serial,
            num_queues: config.num_queues,
            reactors: config.reactors,
            queue_stats: QueueStatsTable::new(config.num_queues),
            connected: AtomicBool::new(false),
            stop: StopSignal::new().map_err(|e| Error::Other(format!("cannot create eventfd: {e}")))?,
            coalescing: Arc::new(CoalescingSettings::default()),
            handoff: config.handoff,
            stop_timeout: config.stop_timeout,
        }))
    }
}

impl ControllerState {
    /// The geometry with the current capacity.
    pub fn disk_now(&self) -> DiskParams {
        DiskParams { capacity_sectors: self.capacity_sectors.load(Ordering::Relaxed), ..self.disk }
    }

    pub(crate) fn backend_channel(&self) -> std::sync::MutexGuard<'_, Option<UnixStream>> {
        self.backend_channel.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Each offered queue's counters, allocated when the queue first starts and then kept for the
/// controller's life (the counters add up across connections).
///
/// A controller offers up to [`MAX_QUEUES`](crate::MAX_QUEUES) queues and a frontend starts a few of them. All 64
/// allocated up front took 7.5 KiB per controller: 1.9 MiB more RSS (a sixth of the daemon's) at
/// the default limit of 256 controllers. An unused slot is 16 bytes.
pub struct QueueStatsTable {
    slots: Box<[OnceLock<Arc<QueueStats>>]>,
}

impl QueueStatsTable {
    fn new(num_queues: u16) -> QueueStatsTable {
        QueueStatsTable { slots: (0..num_queues).map(|_| OnceLock::new()).collect() }
    }

    /// The counters of the queues that have started at least once.
    pub fn started(&self) -> impl Iterator<Item = &Arc<QueueStats>> {
        self.slots.iter().filter_map(OnceLock::get)
    }

    /// The same, with each queue's index.
    pub fn started_indexed(&self) -> impl Iterator<Item = (u16, &Arc<QueueStats>)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| s.get().map(|q| (i as u16, q)))
    }
}

/// Queue `index`'s counters, created on first use (the queue's first start). Panics when
/// `index` is not an offered queue, as a slice would: callers check the index first.
impl std::ops::Index<usize> for QueueStatsTable {
    type Output = Arc<QueueStats>;

    fn index(&self, index: usize) -> &Arc<QueueStats> {
        self.slots[index].get_or_init(Default::default)
    }
}

/// A one-shot stop request that a thread can wait on with poll(2).
pub(crate) struct StopSignal {
    pub(crate) fd: vmm_sys_util::eventfd::EventFd,
}

impl StopSignal {
    fn new() -> std::io::Result<StopSignal> {
        Ok(StopSignal { fd: vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)? })
    }

    pub(crate) fn raise(&self) {
        // Never read: the fd stays readable, so every later wait sees it too.
        let _ = self.fd.write(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_QUEUES;

    #[test]
    fn queue_counters_exist_once_their_queue_has_started() {
        let t = QueueStatsTable::new(MAX_QUEUES);
        assert_eq!(t.started().count(), 0);
        let q = t[3].clone();
        q.read_ops.store(7, Ordering::Relaxed);
        // The same counters on the next start (a reconnect), and only that queue's exist.
        assert!(Arc::ptr_eq(&q, &t[3]));
        let started: Vec<u64> = t.started().map(|s| s.read_ops.load(Ordering::Relaxed)).collect();
        assert_eq!(started, [7]);
        let last = usize::from(MAX_QUEUES) - 1;
        assert!(!Arc::ptr_eq(&t[last], &q));
        assert_eq!(t.started().count(), 2);
    }
}
