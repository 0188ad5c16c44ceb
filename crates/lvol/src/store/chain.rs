//! The store's operations on parent chains: snapshots, clones (of a snapshot or of an external
//! bdev), inflating and decoupling a clone, and changing its parent.

use super::{check_external, Store};
use crate::format;
use crate::{ExternalParent, LvolError, NewCluster, ReadSource, Uuid, Volume, UNALLOCATED};

impl Store {
    /// Takes a snapshot of a volume (SPDK's way): the snapshot, read-only, takes the volume's
    /// clusters and its place in the parent chain; the volume becomes a thin clone of it with
    /// no clusters of its own, so the next write to each cluster copies it.
    pub fn snapshot(&mut self, uuid: &Uuid, snap_uuid: Uuid, snap_name: &str) -> Result<(), LvolError> {
        let i = self.index("lvol", uuid)?;
        self.check_new("snapshot_name", snap_uuid, snap_name)?;
        let v = &self.volumes[i];
        if v.snapshot {
            return Err(LvolError::State {
                field: "lvol",
                reason: format!("'{}' is a snapshot; a snapshot of a snapshot is refused", v.name),
            });
        }
        // The external field moves to the snapshot: the stream grows by a record the size of
        // the volume's.
        self.check_room(v.record_len() - v.name.len() as u64 + snap_name.len() as u64)?;
        let v = &mut self.volumes[i];
        let len = v.map.len();
        let snap = Volume {
            uuid: snap_uuid,
            name: snap_name.to_string(),
            parent: v.parent,
            thin: v.thin,
            read_only: true,
            snapshot: true,
            map: std::mem::replace(&mut v.map, vec![UNALLOCATED; len]),
            external: v.external.take(),
        };
        v.parent = Some(snap_uuid);
        v.thin = true;
        // The snapshot takes the volume's place in the list, so parents keep coming before
        // their clones and a load sees the same order.
        self.volumes.insert(i, snap);
        Ok(())
    }

    /// Creates a thin clone of a snapshot, of the snapshot's size.
    pub fn clone_snapshot(&mut self, snap: &Uuid, uuid: Uuid, name: &str) -> Result<(), LvolError> {
        let s = self.find("snapshot", snap)?;
        if !s.snapshot {
            return Err(LvolError::State {
                field: "snapshot",
                reason: format!("'{}' is not a snapshot; only snapshots can be cloned", s.name),
            });
        }
        let len = s.map.len();
        self.check_new("clone_name", uuid, name)?;
        self.check_room(format::record_len(name.len(), len as u64))?;
        self.volumes.push(Volume {
            uuid,
            name: name.to_string(),
            parent: Some(*snap),
            thin: true,
            read_only: false,
            snapshot: false,
            map: vec![UNALLOCATED; len],
            external: None,
        });
        Ok(())
    }

    /// SPDK's `bdev_lvol_inflate`: every unallocated cluster of the volume gets a cluster of its
    /// own, holding what reads saw there (the nearest ancestor's data, the external parent's, or
    /// zeroes), and the volume leaves its parent chain as a thick volume. A snapshot is refused (its clones read through
    /// it). Returns the new clusters, which the caller fills durably before the next commit.
    pub fn inflate(&mut self, uuid: &Uuid) -> Result<Vec<NewCluster>, LvolError> {
        let i = self.index("lvol", uuid)?;
        let v = &self.volumes[i];
        if v.snapshot {
            return Err(LvolError::State {
                field: "lvol",
                reason: format!("'{}' is a snapshot, which cannot be inflated", v.name),
            });
        }
        let fills = (0..v.size_clusters())
            .filter(|&j| v.map[j as usize] == UNALLOCATED)
            .map(|j| (j, self.source(v, j)))
            .collect();
        let new = self.fill(i, fills)?;
        let v = &mut self.volumes[i];
        v.parent = None;
        v.external = None;
        v.thin = false;
        Ok(new)
    }

    /// SPDK's `bdev_lvol_decouple_parent`: the volume stops depending on its parent, which is
    /// replaced by the parent's parent (or the parent's external parent). The clusters whose data
    /// came from the parent itself get a copy of it; the volume stays thin, reading the rest
    /// through the new parent. An esnap clone (an external parent and no parent) gets a copy of
    /// every cluster it read from the external bdev and no parent. Refused for a volume without
    /// either. A snapshot may be decoupled: what it reads is unchanged, so its clones read the
    /// same. Returns the new clusters, as [`Store::inflate`].
    pub fn decouple_parent(&mut self, uuid: &Uuid) -> Result<Vec<NewCluster>, LvolError> {
        let i = self.index("lvol", uuid)?;
        let v = &self.volumes[i];
        let (new_parent, new_external) = match (v.parent.and_then(|p| self.volume(&p)), &v.external) {
            (Some(parent), _) => (parent.parent, parent.external.clone()),
            (None, Some(_)) => (None, None),
            (None, None) => {
                return Err(LvolError::State { field: "lvol", reason: format!("'{}' has no parent", v.name) })
            }
        };
        let grandparent = new_parent.and_then(|g| self.volume(&g));
        let new_source = |j: u64| match (grandparent, &new_external) {
            (Some(g), _) => self.source(g, j),
            (None, Some(e)) if j < e.clusters => ReadSource::External,
            _ => ReadSource::Zeroes,
        };
        // A cluster needs a copy wherever the new chain would read something else than the old
        // one: the parent's own clusters, and also (past the end of a parent shorter than the
        // grandparent) zeroes the grandparent's data would replace.
        let fills = (0..v.size_clusters())
            .filter(|&j| v.map[j as usize] == UNALLOCATED)
            .map(|j| (j, self.source(v, j)))
            .filter(|&(j, old)| old != new_source(j))
            .collect();
        let new = self.fill(i, fills)?;
        let v = &mut self.volumes[i];
        v.parent = new_parent;
        v.external = new_external;
        Ok(new)
    }

    /// SPDK's `bdev_lvol_set_parent`: the thin volume `uuid` reads its unallocated clusters
    /// through snapshot `snap` from now on (a thin volume without parent becomes its clone; a
    /// clone changes parent). Clusters the volume owns keep priority; nothing is copied. As in
    /// SPDK the volume must be thin and the parent a snapshot of exactly the volume's size; a
    /// snapshot as the volume is refused here (its clones would silently see other data), and
    /// so is a parent that is already the volume's.
    pub fn set_parent(&mut self, uuid: &Uuid, snap: &Uuid) -> Result<(), LvolError> {
        let i = self.index("lvol_name", uuid)?;
        let s = self.find("parent_name", snap)?;
        let v = &self.volumes[i];
        let refuse = |field, reason: String| Err(LvolError::State { field, reason });
        if uuid == snap {
            return refuse("parent_name", format!("'{}' cannot be its own parent", v.name));
        }
        if v.snapshot {
            return refuse("lvol_name", format!("'{}' is a snapshot; its clones read through it", v.name));
        }
        if !v.thin {
            return refuse("lvol_name", format!("'{}' is not thin-provisioned", v.name));
        }
        if !s.snapshot {
            return refuse("parent_name", format!("'{}' is not a snapshot", s.name));
        }
        if v.parent == Some(*snap) {
            return refuse("parent_name", format!("'{}' is already the parent of '{}'", s.name, v.name));
        }
        if s.map.len() != v.map.len() {
            return Err(LvolError::Invalid {
                field: "parent_name",
                reason: format!(
                    "'{}' has {} clusters, '{}' {}: the sizes must be the same",
                    s.name,
                    s.map.len(),
                    v.name,
                    v.map.len()
                ),
            });
        }
        // A volume that is not a snapshot has no clones, so no cycle can form, and the list
        // keeps parents before their clones (what a load and the owner's views rely on) by
        // moving the volume after its new parent.
        let mut v = self.volumes.remove(i);
        v.parent = Some(*snap);
        // An esnap clone stops reading its external parent (SPDK drops it too).
        v.external = None;
        let at = self.volumes.iter().position(|w| w.uuid == *snap).expect("found above") + 1;
        self.volumes.insert(at, v);
        Ok(())
    }

    /// SPDK's `bdev_lvol_set_parent_bdev`: the thin volume `uuid` reads its unallocated clusters
    /// from the external bdev `external` from now on (it leaves any parent snapshot). As in SPDK
    /// the volume must be thin and the bdev a whole number of clusters (the caller checks the
    /// bdev); a snapshot is refused here, as for [`Store::set_parent`].
    pub fn set_external_parent(&mut self, uuid: &Uuid, external: ExternalParent) -> Result<(), LvolError> {
        check_external(&external)?;
        let i = self.index("lvol_name", uuid)?;
        let v = &self.volumes[i];
        let refuse = |field, reason: String| Err(LvolError::State { field, reason });
        if v.snapshot {
            return refuse("lvol_name", format!("'{}' is a snapshot; its clones read through it", v.name));
        }
        if !v.thin {
            return refuse("lvol_name", format!("'{}' is not thin-provisioned", v.name));
        }
        if v.external.as_ref().is_some_and(|e| e.name == external.name) {
            return refuse(
                "parent_name",
                format!("'{}' is already the parent of '{}'", external.name, v.name),
            );
        }
        let old = v.external.as_ref().map_or(0, |e| format::external_len(e.name.len()));
        self.check_room(format::external_len(external.name.len()).saturating_sub(old))?;
        let v = &mut self.volumes[i];
        v.parent = None;
        v.external = Some(external);
        Ok(())
    }

    /// SPDK's `bdev_lvol_clone_bdev`: a thin volume of the external bdev's size reading all of
    /// it through, owning nothing yet.
    pub fn clone_external(
        &mut self,
        uuid: Uuid,
        name: &str,
        external: ExternalParent,
    ) -> Result<(), LvolError> {
        check_external(&external)?;
        self.check_new("clone_name", uuid, name)?;
        let clusters = external.clusters;
        if clusters > UNALLOCATED as u64 {
            return Err(LvolError::Invalid {
                field: "bdev",
                reason: format!("{clusters} clusters is too many"),
            });
        }
        self.check_room(
            format::record_len(name.len(), clusters) + format::external_len(external.name.len()),
        )?;
        self.volumes.push(Volume {
            uuid,
            name: name.to_string(),
            parent: None,
            thin: true,
            read_only: false,
            snapshot: false,
            map: vec![UNALLOCATED; clusters as usize],
            external: Some(external),
        });
        Ok(())
    }
}
