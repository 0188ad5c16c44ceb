//! Shallow copies (SPDK's `bdev_lvol_start_shallow_copy`): the clusters a read-only volume owns
//! itself, copied to the same offsets of another bdev, on a thread of their own so that neither
//! the RPC thread nor the store's owner waits for megabytes to move.
//!
//! The copy reads the base directly at the clusters' places. They cannot move under it: the
//! volume is read-only (its map only grows, by inflate or decouple, which add clusters the copy
//! does not need), and while the copy runs the volume's `busy` count makes the owner refuse to
//! delete it or shrink it, which could hand its clusters to another volume.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use fp_bdev::module::ModuleHost;
use fp_bdev::Bdev;

use super::owner::BaseIo;
use super::LvStore;
use crate::{LvolError, Uuid};

/// The claim holder kind a shallow copy takes its destination with.
pub(crate) const HOLDER: &str = "lvol_shallow_copy";

/// Where a shallow copy is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyState {
    InProgress,
    Complete,
    Error(String),
}

/// One shallow copy, as `bdev_lvol_check_shallow_copy` reports it.
pub struct ShallowCopy {
    pub id: u32,
    /// The volume's own clusters: (the volume's cluster index, the data cluster).
    total: u64,
    copied: AtomicU64,
    state: Mutex<CopyState>,
}

impl ShallowCopy {
    pub fn copied_clusters(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    pub fn total_clusters(&self) -> u64 {
        self.total
    }

    pub fn state(&self) -> CopyState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl LvStore {
    /// Starts copying the clusters the read-only volume `uuid` owns to `dst` (claimed by the
    /// caller as `dst_name`, the claim held by `holder`, released when the copy ends). Refuses
    /// a volume that is not read-only and a destination smaller than the volume.
    pub fn start_shallow_copy(
        self: &Arc<Self>,
        id: u32,
        uuid: &Uuid,
        dst: Bdev,
        release: impl FnOnce() + Send + 'static,
    ) -> Result<Arc<ShallowCopy>, LvolError> {
        let vol = *uuid;
        let dst_bytes = dst.info().size_bytes();
        let (clusters, shared) = super::call(&self.tx, move |o| {
            o.check_usable()?;
            let v = o
                .store
                .volume(&vol)
                .ok_or(LvolError::NotFound { field: "src_lvol_name", value: vol.to_string() })?;
            if !v.read_only {
                return Err(LvolError::State {
                    field: "src_lvol_name",
                    reason: format!(
                        "'{}' must be read-only (a snapshot, or bdev_lvol_set_read_only)",
                        v.name
                    ),
                });
            }
            let size = v.size_clusters() * o.geo.cluster_size();
            if dst_bytes < size {
                return Err(LvolError::Invalid {
                    field: "dst_bdev_name",
                    reason: format!("{dst_bytes} bytes, smaller than the volume's {size}"),
                });
            }
            let own: Vec<(u64, u32)> = (0..v.size_clusters())
                .filter_map(|j| Some((j, v.map[j as usize])).filter(|&(_, c)| c != crate::UNALLOCATED))
                .collect();
            let shared = o.vols[&vol].clone();
            shared.busy.fetch_add(1, Ordering::SeqCst);
            Ok((own, shared))
        })?;
        let op = Arc::new(ShallowCopy {
            id,
            total: clusters.len() as u64,
            copied: AtomicU64::new(0),
            state: Mutex::new(CopyState::InProgress),
        });
        let (base, geo, me) = (self.raw_base(), self.geo, op.clone());
        let spawned = std::thread::Builder::new().name(format!("lvol-copy-{id}")).spawn(move || {
            let result = copy_clusters(base, dst, geo, &clusters, &me.copied);
            shared.busy.fetch_sub(1, Ordering::SeqCst);
            release();
            *me.state.lock().unwrap_or_else(|p| p.into_inner()) = match result {
                Ok(()) => CopyState::Complete,
                Err(e) => CopyState::Error(e),
            };
        });
        if let Err(e) = spawned {
            // The closure (and with it the busy count's decrement) never ran.
            if let Some(s) = self.device(uuid) {
                s.shared.busy.fetch_sub(1, Ordering::SeqCst);
            }
            return Err(LvolError::State {
                field: "src_lvol_name",
                reason: format!("cannot start a thread: {e}"),
            });
        }
        Ok(op)
    }
}

/// Copies each `(index, cluster)` from the base to `index`'s offset of `dst`, then flushes.
fn copy_clusters(
    base: Bdev,
    dst: Bdev,
    geo: super::shared::Geometry,
    clusters: &[(u64, u32)],
    copied: &AtomicU64,
) -> Result<(), String> {
    let errno = |what: &str, e: i32| format!("{what}: {}", std::io::Error::from_raw_os_error(e));
    let mut from = BaseIo::open(base).map_err(|e| e.to_string())?;
    let mut to = BaseIo::open(dst).map_err(|e| e.to_string())?;
    let cs = geo.cluster_size();
    for &(index, cluster) in clusters {
        from.copy_to(geo.phys(cluster), &mut to, index * cs, cs)
            .map_err(|e| errno(&format!("cluster {index}"), e))?;
        copied.fetch_add(1, Ordering::Relaxed);
    }
    to.flush().map_err(|e| errno("flush", e))
}

/// A host handle for a copy's thread, to release the destination's claim when it ends.
pub(crate) fn releaser(
    host: &dyn ModuleHost,
    name: String,
    holder: String,
) -> impl FnOnce() + Send + 'static {
    let weak: Option<Weak<dyn ModuleHost + Send + Sync>> = host.weak_handle();
    move || {
        if let Some(h) = weak.and_then(|w| w.upgrade()) {
            h.release_claim(&name, HOLDER, &holder);
        }
    }
}
