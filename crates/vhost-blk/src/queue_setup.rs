//! What a queue needs to start on its reactor, built on the control plane, and why a start
//! fails. Below both the queue and its ring glue, which open a queue from it.

use std::fs::File;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use fp_bdev::Bdev;
use fp_virtio_blk::{DiskParams, GuestMemory, VIRTIO_BLK_ID_BYTES};
use fp_virtq::RingError;
use vm_memory::GuestAddress;

use crate::coalesce::{Clock, CoalescingSettings};
use crate::handoff::HandOffHold;
use crate::inflight::InflightArea;
use crate::log::QueueLog;
use crate::stats::QueueStats;

/// Everything needed to start a queue on a reactor. `Send`; built on the control plane.
pub struct QueueSetup {
    pub controller: Arc<str>,
    pub index: u16,
    pub size: u16,
    /// Descriptor table (split) or descriptor ring (packed).
    pub desc: GuestAddress,
    /// Available ring (split) or driver event suppression area (packed).
    pub avail: GuestAddress,
    /// Used ring (split) or device event suppression area (packed).
    pub used: GuestAddress,
    /// Ring position to continue from, as SET_VRING_BASE carries it: the next available index
    /// (split), or [`fp_virtq::PackedState::to_vring_base`]'s encoding (packed).
    pub base: u32,
    pub event_idx: bool,
    /// VIRTIO_F_RING_PACKED was negotiated.
    pub packed: bool,
    pub mem: Arc<GuestMemory>,
    pub kick: File,
    pub call: File,
    pub bdev: Bdev,
    pub disk: DiskParams,
    /// The disk's capacity now, in sectors (it changes when the disk is resized).
    pub capacity_sectors: Arc<AtomicU64>,
    pub serial: [u8; VIRTIO_BLK_ID_BYTES],
    pub stats: Arc<QueueStats>,
    /// The connection's in-flight area, when the front-end negotiated INFLIGHT_SHMFD.
    pub inflight: Option<Arc<InflightArea>>,
    /// The controller's notification coalescing settings ([`crate::coalesce`]).
    pub coalescing: Arc<CoalescingSettings>,
    /// The queue's time source (tests step it by hand).
    pub clock: Clock,
    /// What the queue logs for live migration (nothing by default).
    pub log: QueueLog,
    /// The controller's share of its disk's migration gate ([`crate::HandOff`]), released when
    /// nothing of the queue touches the disk any more (`None`: no gate, as in tests).
    pub hold: Option<HandOffHold>,
}

/// Why a queue could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("queue {index}: {source}")]
    Ring {
        index: u16,
        #[source]
        source: RingError,
    },
    #[error("queue {index}: no guest memory mapped")]
    NoMemory { index: u16 },
    #[error("queue {index}: {source}")]
    Inflight {
        index: u16,
        #[source]
        source: crate::inflight::InflightError,
    },
    #[error("queue {index}: cannot resubmit in-flight requests: {reason}")]
    Resubmit { index: u16, reason: String },
    #[error("queue {index}: cannot open a channel to the bdev: {source}")]
    Channel {
        index: u16,
        #[source]
        source: fp_bdev::BdevError,
    },
}
