//! What a namespace and its channels share about its paths: the channel parameters
//! (`NsParams`), what a namespace asks of a controller (`NamespaceBackend`), and the path
//! list with its policy ([`PathSet`]), which the multipath channel follows. Kept below the
//! namespace and both channels, which all name it.

use std::any::Any;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use fp_bdev::{BdevError, Capacity, IoChannel};

use crate::ctrlr::ana::AnaWord;
use crate::ctrlr::ControllerData;
use crate::transport::{QueueStats, TransportId};

/// What a channel needs to know of its namespace, fixed when the namespace is made.
#[derive(Debug, Clone)]
pub(crate) struct NsParams {
    pub(crate) nsid: u32,
    pub(crate) block_size: u32,
    /// Shared with the namespace's `BdevInfo`.
    pub(crate) capacity: Capacity,
    /// The most bytes of data one command moves (MDTS, the transport's bound).
    pub(crate) max_transfer: u32,
    /// A volatile write cache is present and `enable_flush` is on: Flush goes to the
    /// controller (otherwise it completes at once: without a cache written data is already
    /// durable; with one, the operator chose to leave it to the controller).
    pub(crate) volatile_cache: bool,
    /// Dataset Management (deallocate) is supported.
    pub(crate) dsm: bool,
    /// Write Zeroes is supported.
    pub(crate) write_zeroes: bool,
}

/// What a namespace asks of its controller (implemented by the controller's shared half for
/// its transport).
pub(crate) trait NamespaceBackend: Send + Sync {
    /// Opens a channel: an I/O queue pair of the controller, for `ns`.
    fn open_channel(self: Arc<Self>, ns: &NsParams) -> Result<Box<dyn IoChannel>, BdevError>;
    /// The controller's name.
    fn controller_name(&self) -> &str;
    /// The transport ID.
    fn trid(&self) -> TransportId;
    /// Identify Controller as last read, and the version register.
    fn controller_data(&self) -> (ControllerData, u32);
    /// The channels' counters summed.
    fn stats(&self) -> QueueStats;
    /// This path's identity, unique in the process (one per attached controller).
    fn path_id(&self) -> u64;
    /// The controller's state word (`ctrlr::shared`): enabled, resetting, failed.
    fn state_word(&self) -> u64;
    /// Namespace `nsid`'s ANA state through this controller; `None` when the controller does
    /// not report ANA.
    fn ana(&self, nsid: u32) -> Option<AnaWord>;
    /// Opens a channel over every path of `set` (each of this backend's transport; a path
    /// of another transport is refused).
    fn open_multipath(
        self: Arc<Self>,
        set: Arc<PathSet>,
        ns: &NsParams,
    ) -> Result<Box<dyn IoChannel>, BdevError>;
    /// The backend as [`Any`], for a multipath channel to find its paths' concrete type.
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// Paths one namespace may have.
pub const MAX_PATHS: usize = 8;

/// How active-active picks among the paths that are up (SPDK's selectors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selector {
    /// In turn, `rr_min_io` requests each.
    RoundRobin,
    /// The path with the fewest requests in flight on this channel.
    QueueDepth,
}

/// A namespace's multipath policy (`bdev_nvme_set_multipath_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Everything to the first path that is up.
    ActivePassive,
    /// Spread over the paths that are up.
    ActiveActive {
        /// How.
        selector: Selector,
        /// Requests sent to a path before round robin moves on (1 or more).
        rr_min_io: u32,
    },
}

impl Policy {
    fn encode(self) -> u64 {
        match self {
            Policy::ActivePassive => 0,
            Policy::ActiveActive { selector: Selector::RoundRobin, rr_min_io } => {
                1 | (u64::from(rr_min_io) << 8)
            }
            Policy::ActiveActive { selector: Selector::QueueDepth, rr_min_io } => {
                2 | (u64::from(rr_min_io) << 8)
            }
        }
    }

    fn decode(v: u64) -> Policy {
        let rr_min_io = ((v >> 8) as u32).max(1);
        match v & 0xff {
            1 => Policy::ActiveActive { selector: Selector::RoundRobin, rr_min_io },
            2 => Policy::ActiveActive { selector: Selector::QueueDepth, rr_min_io },
            _ => Policy::ActivePassive,
        }
    }

    /// SPDK's names: (`policy`, `selector`).
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            Policy::ActivePassive => ("active_passive", "round_robin"),
            Policy::ActiveActive { selector: Selector::RoundRobin, .. } => ("active_active", "round_robin"),
            Policy::ActiveActive { selector: Selector::QueueDepth, .. } => ("active_active", "queue_depth"),
        }
    }
}

/// One path of a namespace: a controller's backend.
#[derive(Clone)]
pub struct NsPath {
    /// The controller's path identity (unique in the process).
    pub id: u64,
    pub(crate) backend: Arc<dyn NamespaceBackend>,
}

/// What one channel tells `bdev_nvme_get_io_paths`: its thread, the path it would use now,
/// and which of its paths have a connected queue. Written by the channel's reactor at most
/// every sweep (64 poll rounds).
#[derive(Debug)]
pub struct ChannelView {
    /// The thread that polls the channel (named at its first sweep).
    pub thread: Mutex<String>,
    /// The path ID the channel would send the next request to (0: none).
    pub current: AtomicU64,
    /// Path IDs with a connected queue on this channel, one slot per path (0: empty).
    pub connected: [AtomicU64; MAX_PATHS],
    /// Each path's ANA state as this channel last loaded it: the path ID shifted left by 8 bits
    /// over the state's byte (`ctrlr::ana`), one slot per path (0: empty).
    pub ana: [AtomicU64; MAX_PATHS],
    /// Requests retried on another path after their path went down.
    pub failovers: AtomicU64,
}

impl ChannelView {
    /// Path `id`'s ANA state as this channel last loaded it (none before its first sweep).
    pub(crate) fn ana_of(&self, id: u64) -> Option<AnaWord> {
        self.ana.iter().map(|a| a.load(Ordering::Relaxed)).find(|v| v >> 8 == id).map(|v| AnaWord(v as u8))
    }
}

/// The paths of one namespace and how they are used; shared by the namespace and its
/// channels.
pub struct PathSet {
    paths: Mutex<Vec<NsPath>>,
    /// Moves whenever `paths` changes; channels compare it every sweep.
    pub(super) version: AtomicU64,
    policy: AtomicU64,
    /// The namespace's channels are multipath channels (set before any is opened).
    multipath: AtomicU32,
    channels: Mutex<Vec<Weak<ChannelView>>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PathSet {
    pub(crate) fn new(first: NsPath) -> PathSet {
        PathSet {
            paths: Mutex::new(vec![first]),
            version: AtomicU64::new(0),
            policy: AtomicU64::new(Policy::ActivePassive.encode()),
            multipath: AtomicU32::new(0),
            channels: Mutex::new(Vec::new()),
        }
    }

    /// The paths now, first (preferred) first.
    pub fn list(&self) -> Vec<NsPath> {
        lock(&self.paths).clone()
    }

    /// The path IDs now.
    pub fn ids(&self) -> Vec<u64> {
        lock(&self.paths).iter().map(|p| p.id).collect()
    }

    /// Makes the namespace's channels multipath channels (for channels opened from now on).
    pub fn set_multipath(&self) {
        self.multipath.store(1, Ordering::Release);
    }

    /// Whether the namespace's channels are multipath channels.
    pub fn is_multipath(&self) -> bool {
        self.multipath.load(Ordering::Acquire) != 0
    }

    /// Adds a path at the end (the least preferred); refused beyond [`MAX_PATHS`].
    pub(crate) fn add(&self, path: NsPath) -> Result<(), String> {
        let mut paths = lock(&self.paths);
        if paths.iter().any(|p| p.id == path.id) {
            return Ok(());
        }
        if paths.len() >= MAX_PATHS {
            return Err(format!("a namespace has at most {MAX_PATHS} paths"));
        }
        paths.push(path);
        self.version.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Removes path `id`; returns how many paths are left.
    pub fn remove(&self, id: u64) -> usize {
        let mut paths = lock(&self.paths);
        paths.retain(|p| p.id != id);
        self.version.fetch_add(1, Ordering::Release);
        paths.len()
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        Policy::decode(self.policy.load(Ordering::Relaxed))
    }

    /// Sets the policy; channels follow at their next request.
    pub fn set_policy(&self, policy: Policy) {
        self.policy.store(policy.encode(), Ordering::Relaxed);
    }

    /// The views of the channels open now.
    pub fn channel_views(&self) -> Vec<Arc<ChannelView>> {
        lock(&self.channels).iter().filter_map(Weak::upgrade).collect()
    }

    pub(super) fn add_view(&self) -> Arc<ChannelView> {
        let v = Arc::new(ChannelView {
            thread: Mutex::new(String::new()),
            current: AtomicU64::new(0),
            connected: Default::default(),
            ana: Default::default(),
            failovers: AtomicU64::new(0),
        });
        let mut list = lock(&self.channels);
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&v));
        v
    }
}
