//! [`BlkController`]: one running export and what `info()` reports ([`ControllerConfig`] says what
//! it serves).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::ControllerConfig;
use crate::connection::Connection;
use crate::socket::{bind, notify_config_change, serve};
use crate::state::ControllerState;
use crate::{coalesce, ControllerStats, Error, HandOff};

#[derive(Debug, Clone, serde::Serialize)]
pub struct ControllerInfo {
    pub name: String,
    pub socket_path: PathBuf,
    pub bdev_name: String,
    pub read_only: bool,
    pub num_queues: u16,
    /// The bound of one queue stop.
    pub stop_timeout: Duration,
    pub cores: Vec<usize>,
    pub connected: bool,
    /// Notification coalescing: `(delay_base_us, iops_threshold)`.
    pub coalescing: (u32, u32),
    pub stats: ControllerStats,
    /// Each queue that has started, by index, with its own counters (summed in `stats`).
    pub queues: Vec<(u16, ControllerStats)>,
}

/// A running vhost-user-blk export.
pub struct BlkController {
    shared: Arc<ControllerState>,
    socket_path: PathBuf,
    read_only: bool,
    thread: Option<JoinHandle<()>>,
}

impl BlkController {
    /// Binds the socket and starts serving.
    pub fn start(config: ControllerConfig) -> Result<BlkController, Error> {
        let socket_path = config.socket_path.clone();
        let read_only = config.read_only;
        let shared = ControllerState::new(config)?;
        let listener = bind(&socket_path)?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vhost-{}", shared.name))
            .spawn(move || serve(listener, thread_shared))
            .map_err(|e| Error::Other(format!("cannot start controller thread: {e}")))?;
        Ok(BlkController { shared, socket_path, read_only, thread: Some(thread) })
    }

    /// The hand-off gate, for a controller created to take this one's disk over.
    pub fn handoff(&self) -> Arc<HandOff> {
        self.shared.handoff.clone()
    }

    pub fn info(&self) -> ControllerInfo {
        let s = &self.shared;
        let mut stats = ControllerStats::default();
        let mut queues = Vec::new();
        for (index, q) in s.queue_stats.started_indexed() {
            stats.add(q);
            let mut one = ControllerStats::default();
            one.add(q);
            queues.push((index, one));
        }
        let mut cores: Vec<usize> = s.reactors.iter().filter_map(|r| r.core()).collect();
        cores.sort_unstable();
        cores.dedup();
        ControllerInfo {
            name: s.name.to_string(),
            socket_path: self.socket_path.clone(),
            bdev_name: s.bdev.info().name.clone(),
            read_only: self.read_only,
            num_queues: s.num_queues,
            stop_timeout: s.stop_timeout,
            cores,
            connected: s.connected.load(Ordering::Relaxed),
            coalescing: s.coalescing.get(),
            stats,
            queues,
        }
    }

    /// Sets guest notification coalescing for every queue, running ones included
    /// ([`coalesce`]). `delay_base_us` 0 turns it off; callers check it against
    /// [`coalesce::MAX_DELAY_BASE_US`].
    pub fn set_coalescing(&self, delay_base_us: u32, iops_threshold: u32) {
        self.shared.coalescing.set(delay_base_us.min(coalesce::MAX_DELAY_BASE_US), iops_threshold);
    }

    /// The disk changed size: offers `size_bytes` (rounded down to whole sectors) from now on,
    /// to running queues (from their next round) and in the config space, and tells a connected
    /// frontend with VHOST_USER_BACKEND_CONFIG_CHANGE_MSG (vhost-user.rst), which makes QEMU
    /// re-read the config space and interrupt the guest. Returns whether a frontend was told.
    ///
    /// Requests already validated against the old size may still reach past a new, smaller
    /// end; the bdev refuses those itself, so shrinking is safe, if rude to the guest.
    pub fn resize(&self, size_bytes: u64) -> bool {
        let sectors = size_bytes / fp_virtio_blk::SECTOR_SIZE;
        self.shared.capacity_sectors.store(sectors, Ordering::Relaxed);
        let mut channel = self.shared.backend_channel();
        let Some(stream) = channel.as_mut() else {
            return false;
        };
        match notify_config_change(stream) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("{}: cannot send the config change to the frontend: {e}", self.shared.name);
                *channel = None;
                false
            }
        }
    }

    /// Disconnects the frontend (stopping its queues), removes the socket, joins the thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.raise();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket_path);
    }
}

impl Drop for BlkController {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The protocol handler of one connection without a listener or thread (`config.socket_path`
/// is ignored): the `vhost_messages` fuzz target feeds it messages itself. Not API.
#[doc(hidden)]
pub fn connection_for_fuzzing(config: ControllerConfig) -> Result<Connection, Error> {
    Ok(Connection::new(ControllerState::new(config)?))
}
