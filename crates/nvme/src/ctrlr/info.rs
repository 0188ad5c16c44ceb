//! `bdev_nvme_get_controllers`' answer for one controller: SPDK's shape (name, and per path
//! its state, transport ID, controller ID and host) with flashpath's counters beside it.

use crate::transport::{HostId, QueueStats, TransportId};

/// One controller as `bdev_nvme_get_controllers` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ControllerInfo {
    /// The controller's name.
    pub name: String,
    /// Its paths (one: flashpath has no multipath).
    pub ctrlrs: Vec<ControllerPath>,
}

/// One path to a controller.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ControllerPath {
    /// SPDK's states: "enabled", "resetting", "reconnect_is_delayed", "failed", "deleting".
    pub state: &'static str,
    /// The transport ID.
    pub trid: TransportId,
    /// The controller ID.
    pub cntlid: u16,
    /// The host's side.
    pub host: HostId,
    /// flashpath: the controller's generation (moves at each reset or reconnect).
    pub generation: u64,
    /// flashpath: resets (and reconnect attempts) done.
    pub resets: u64,
    /// flashpath: reconnect attempts after the controller was lost.
    pub reconnect_attempts: u64,
    /// flashpath: Abort commands sent for timed-out I/O.
    pub aborts: u64,
    /// flashpath: asynchronous events received.
    pub async_events: u64,
    /// flashpath: I/O queue pairs in use, and the most the controller gives.
    pub io_queues: u16,
    /// flashpath: see `io_queues`.
    pub max_io_queues: u16,
    /// flashpath: entries of each I/O queue.
    pub io_queue_depth: u16,
    /// flashpath: the largest transfer of one command, in bytes.
    pub max_transfer: u32,
    /// flashpath: the namespaces (NSIDs) with bdevs.
    pub namespaces: Vec<u32>,
    /// flashpath: the I/O queues' counters summed (submitted, completed, doorbells, bounced).
    pub stats: QueueStats,
    /// flashpath: why the last reset failed, while the controller is not back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}
