//! What a volume's channels and its store's metadata owner share: the published cluster maps,
//! read on the reactors without locks, and the flags and counters of the quiesce handshake.
//!
//! Maps: each volume has a [`Layer`] of atomic entries (its own clusters). A [`View`] is the
//! volume's layer followed by its ancestors' (a snapshot's layer never changes once taken). The
//! owner fills an entry after the metadata that maps it is durable; a structural change
//! (snapshot, resize, inflate) publishes a new `View` while the volume's writes are held.
//!
//! Quiesce: a channel counts a write in `writes` before it reads `frozen`; the owner sets
//! `frozen` before it reads the counters. Both sides use sequentially consistent operations, so
//! either the owner sees the write counted (and waits for it), or the channel sees the volume
//! frozen (and holds the write until it thaws).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;
use crossbeam_queue::SegQueue;
use fp_bdev::{IoRequest, IoStatus};

use crate::{ReadSource, Store, UNALLOCATED};

/// One volume's own cluster map, as the data path reads it.
pub(crate) struct Layer(Box<[AtomicU32]>);

impl Layer {
    pub(crate) fn from_map(map: &[u32]) -> Arc<Layer> {
        Arc::new(Layer(map.iter().map(|&c| AtomicU32::new(c)).collect()))
    }

    /// The entry for cluster `index`; `None` past the layer's end.
    #[inline]
    pub(crate) fn get(&self, index: u64) -> Option<u32> {
        self.0.get(index as usize).map(|e| e.load(Ordering::Acquire))
    }

    /// Publishes an entry (the owner, after the commit mapping it is durable).
    pub(crate) fn set(&self, index: u64, cluster: u32) {
        if let Some(e) = self.0.get(index as usize) {
            e.store(cluster, Ordering::Release);
        }
    }
}

/// A volume's layer and its ancestors', nearest first, and the size in clusters of the chain's
/// external parent (0: none), read where no layer maps a cluster.
pub(crate) struct View {
    pub(crate) layers: Vec<Arc<Layer>>,
    pub(crate) external: u64,
}

impl View {
    /// The volume's own cluster at `index`, or [`UNALLOCATED`].
    #[inline]
    pub(crate) fn own(&self, index: u64) -> u32 {
        self.layers[0].get(index).unwrap_or(UNALLOCATED)
    }

    /// Where a read of cluster `index` comes from: the nearest layer mapping it; `None` (zeroes)
    /// when none does, or past a layer's end (nothing further up either, as in the store).
    #[inline]
    pub(crate) fn resolve(&self, index: u64) -> Option<u32> {
        match self.source(index) {
            ReadSource::Cluster(c) => Some(c),
            _ => None,
        }
    }

    /// Where a read of cluster `index` comes from, the external parent included.
    #[inline]
    pub(crate) fn source(&self, index: u64) -> ReadSource {
        for layer in &self.layers {
            match layer.get(index) {
                None => return ReadSource::Zeroes,
                Some(UNALLOCATED) => continue,
                Some(c) => return ReadSource::Cluster(c),
            }
        }
        if index < self.external {
            ReadSource::External
        } else {
            ReadSource::Zeroes
        }
    }
}

/// A volume as its channels and the owner share it.
pub(crate) struct VolumeShared {
    pub(crate) view: Arc<ArcSwap<View>>,
    /// Writes are held while set (a snapshot, resize, inflate is being made).
    pub(crate) frozen: AtomicBool,
    pub(crate) read_only: AtomicBool,
    /// Shallow copies reading the volume's clusters: while non-zero the owner refuses to delete
    /// or shrink the volume.
    pub(crate) busy: AtomicU32,
    /// The open channels, for the owner to wait on their writes. Touched at channel open and
    /// close and during a quiesce, never per request.
    pub(crate) channels: Mutex<Vec<Weak<ChannelShared>>>,
}

impl VolumeShared {
    pub(crate) fn new(view: View, read_only: bool) -> Arc<VolumeShared> {
        Arc::new(VolumeShared {
            view: Arc::new(ArcSwap::from_pointee(view)),
            frozen: AtomicBool::new(false),
            read_only: AtomicBool::new(read_only),
            busy: AtomicU32::new(0),
            channels: Mutex::new(Vec::new()),
        })
    }

    /// The volume's own layer now.
    pub(crate) fn own_layer(&self) -> Arc<Layer> {
        self.view.load().layers[0].clone()
    }

    /// Writes in flight on all channels (the owner, while quiescing).
    pub(crate) fn writes_in_flight(&self) -> u64 {
        let mut chans = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        chans.retain(|w| w.strong_count() > 0);
        chans.iter().filter_map(Weak::upgrade).map(|c| c.writes.load(Ordering::SeqCst)).sum()
    }
}

/// One channel's side of the handshake with the owner.
pub(crate) struct ChannelShared {
    /// Writes submitted and not completed (held ones excluded).
    pub(crate) writes: AtomicU64,
    /// The owner's answers, drained by the channel's `poll`.
    pub(crate) replies: SegQueue<Reply>,
}

/// A piece of a request (the part inside one cluster) waiting for the owner.
pub(crate) struct Piece {
    /// The channel's request slot.
    pub(crate) slot: u32,
    /// The piece as it goes to the base, `offset` still relative to the cluster's start.
    pub(crate) req: IoRequest,
    /// The volume's cluster index.
    pub(crate) index: u64,
}

/// The owner's answer to a channel.
pub(crate) enum Reply {
    /// The piece's cluster is mapped, durably: send it to the base at `cluster`.
    Mapped { piece: Piece, cluster: u32 },
    /// The owner carried out (or failed) a piece of a request itself.
    Done { slot: u32, status: IoStatus },
}

/// Where clusters are on the base.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) cluster_shift: u32,
    /// Byte offset of cluster 0.
    pub(crate) data_offset: u64,
    pub(crate) block_size: u32,
}

impl Geometry {
    pub(crate) fn of(store: &Store) -> Geometry {
        Geometry {
            cluster_shift: store.cluster_size().trailing_zeros(),
            data_offset: store.cluster_offset(0),
            block_size: store.block_size(),
        }
    }

    pub(crate) fn cluster_size(&self) -> u64 {
        1 << self.cluster_shift
    }

    /// Byte offset of cluster `c` on the base.
    #[inline]
    pub(crate) fn phys(&self, c: u32) -> u64 {
        self.data_offset + (u64::from(c) << self.cluster_shift)
    }
}
