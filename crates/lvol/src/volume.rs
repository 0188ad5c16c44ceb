//! A volume as the store keeps it, and the plain answers about its clusters (where a read comes
//! from, what a write needs): the types the on-disk format and the store both name.

use crate::{Uuid, UNALLOCATED};

/// One volume: a snapshot, a clone (it has a parent) or a plain volume, thin or thick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub uuid: Uuid,
    pub name: String,
    /// The snapshot whose data shows through this volume's unallocated clusters.
    pub parent: Option<Uuid>,
    /// Clusters are allocated on first write; a thick volume has all of them from creation.
    pub thin: bool,
    pub read_only: bool,
    pub snapshot: bool,
    /// Physical cluster of each of the volume's clusters, or [`UNALLOCATED`]. Its length is the
    /// volume's size in clusters.
    pub map: Vec<u32>,
    /// An external snapshot (SPDK's esnap): a bdev outside the store read where neither the
    /// volume nor a parent has a cluster. Only a volume without `parent` has one; a snapshot of
    /// it takes it over, as it takes the parent.
    pub external: Option<ExternalParent>,
}

/// A bdev as the last layer of a volume's chain, named as the module finds it again at load
/// (when it is missing, reads that need it fail until it appears, as SPDK's "missing esnap").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalParent {
    /// The bdev's name (1 to 255 bytes).
    pub name: String,
    /// Its size in clusters when it became the parent: clusters past it read zeroes.
    pub clusters: u64,
}

/// Where a read of one of a volume's clusters comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSource {
    /// A data cluster of the store (the volume's own or an ancestor's).
    Cluster(u32),
    /// The same cluster of the chain's external parent.
    External,
    /// Nothing: zeroes.
    Zeroes,
}

impl Volume {
    pub fn size_clusters(&self) -> u64 {
        self.map.len() as u64
    }

    /// Clusters this volume owns (allocated in its own map).
    pub fn allocated_clusters(&self) -> u64 {
        self.map.iter().filter(|&&c| c != UNALLOCATED).count() as u64
    }
}

/// What a write to a volume's cluster needs (from [`Store::allocate_for_write`](crate::Store::allocate_for_write)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteTarget {
    /// The volume owns the cluster already: write in place.
    Mapped(u32),
    /// A cluster was allocated to the volume. Before the write completes, the whole new cluster
    /// must hold `copy_from`'s data (copy-on-write from the parent chain) or zeroes (`None`),
    /// with the write applied over it, durably, before the commit that maps it
    /// (docs/lvol-format.md, "Data before metadata").
    Allocated { cluster: u32, copy_from: Option<u32> },
    /// As `Allocated`, the data to copy being the same cluster of the chain's external parent.
    AllocatedFromExternal { cluster: u32 },
}

/// A cluster that [`Store::inflate`](crate::Store::inflate) or [`Store::decouple_parent`](crate::Store::decouple_parent) gave a volume: (the volume's
/// cluster index, the new data cluster, where its contents come from: a data cluster to copy,
/// the same cluster of the external parent, or zeroes). As for [`WriteTarget::Allocated`], the
/// caller fills every one of them durably before the commit that maps them.
pub type NewCluster = (u64, u32, ReadSource);
