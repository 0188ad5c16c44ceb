//! The store: volumes and their cluster maps in memory, the operations on them, and their
//! commit to (and load from) two alternating metadata areas.
//!
//! Every operation checks all of its input and the room it needs (clusters, metadata bytes)
//! before it changes anything, so an error leaves the store untouched. Changes are in memory
//! until a commit makes them durable; a commit writes the whole metadata to the area not holding
//! the last durable generation and flushes (docs/lvol-format.md, "Atomic updates").

use std::collections::{HashMap, HashSet};

use crate::format::{self, Label, SuperBlock, MAX_AREA_PAGES, MAX_STREAM_PAGES, STREAM_FIXED};
use crate::{check_name, LvolError, MetaDevice, Page, Uuid, NAME_MAX, PAGE_SIZE, UNALLOCATED};
use crate::{ExternalParent, NewCluster, ReadSource, Volume, WriteTarget};

mod chain;
mod commit;

/// How to create a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub name: String,
    pub uuid: Uuid,
    pub cluster_size: u64,
    /// The base bdev's block size (512 or 4096); recorded for the module, which must use it.
    pub block_size: u32,
    /// Pages of each metadata area; by default enough for maps of twice the data clusters
    /// (thin volumes over-commit) and for 256 volumes, within [`MAX_AREA_PAGES`].
    pub area_pages: Option<u32>,
}

/// The writes of one commit, for a caller that performs them itself (the bdev module, through
/// a channel of the base bdev): write every page of [`CommitPlan::writes`] in any order, flush,
/// then [`Store::commit_done`]; on any error, [`Store::commit_failed`].
#[derive(Debug)]
pub struct CommitPlan {
    generation: u64,
    area: usize,
    /// The area's new contents, super block first.
    pages: Vec<Box<Page>>,
    /// Indexes into `pages` that differ from what the area is known to hold.
    changed: Vec<usize>,
    first_page: u64,
    released: usize,
}

impl CommitPlan {
    /// The generation this commit makes durable.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The pages to write: (device page, contents).
    pub fn writes(&self) -> impl Iterator<Item = (u64, &Page)> + '_ {
        self.changed.iter().map(|&i| (self.first_page + i as u64, &*self.pages[i]))
    }
}

/// A logical volume store in memory.
#[derive(Debug)]
pub struct Store {
    label: Label,
    name: String,
    total_clusters: u64,
    volumes: Vec<Volume>,
    /// One bit per cluster: owned by a map, or freed but not yet durable (`pending_free`).
    used: Vec<u64>,
    owned: u64,
    /// Clusters freed since the last durable commit: not reusable until a commit that no longer
    /// maps them is durable, or a crash could bring back the old owner over new data.
    pending_free: Vec<u32>,
    /// Where to start looking for a free cluster.
    hint: u64,
    /// The last durable generation, and the area (0 or 1) holding it.
    generation: u64,
    area: usize,
    /// What each area is known to hold (after a commit to it or a load from it), so a commit
    /// writes only the pages that differ; `None` when unknown.
    known: [Option<Vec<Box<Page>>>; 2],
    committing: bool,
}

impl Store {
    /// Creates an empty store on `dev`, writing the label and generation 1, then flushing. Any
    /// store that was on the device is gone (its second area's super block is zeroed).
    pub fn create<D: MetaDevice>(dev: &mut D, opts: &StoreOptions) -> Result<Store, LvolError> {
        check_name("lvs_name", &opts.name)?;
        format::check_geometry(opts.cluster_size, opts.block_size)
            .map_err(|reason| LvolError::Invalid { field: "cluster_sz", reason })?;
        if opts.uuid.is_nil() {
            return Err(LvolError::Invalid { field: "uuid", reason: "must not be nil".into() });
        }
        let size_pages = dev.size_pages();
        let area_pages = match opts.area_pages {
            Some(p) if !(2..=MAX_AREA_PAGES).contains(&p) => {
                return Err(LvolError::Invalid {
                    field: "area_pages",
                    reason: format!("{p}, not 2 to {MAX_AREA_PAGES}"),
                })
            }
            Some(p) => p,
            None => {
                let clusters = size_pages.saturating_mul(PAGE_SIZE as u64) / opts.cluster_size;
                let bytes = STREAM_FIXED + 256 * format::record_len(NAME_MAX, 0) + 8 * clusters;
                (1 + bytes.div_ceil(PAGE_SIZE as u64)).min(MAX_AREA_PAGES as u64) as u32
            }
        };
        let label = Label {
            uuid: opts.uuid,
            cluster_size: opts.cluster_size,
            block_size: opts.block_size,
            area_pages,
        };
        let total_clusters = clusters_on(&label, size_pages);
        if total_clusters == 0 {
            return Err(LvolError::Invalid {
                field: "bdev_name",
                reason: format!(
                    "{} bytes hold no data cluster of {} after {} bytes of metadata",
                    size_pages * PAGE_SIZE as u64,
                    opts.cluster_size,
                    label.data_offset()
                ),
            });
        }
        // Generation 1 goes to area 0.
        let mut store = Store::empty(label, opts.name.clone(), total_clusters, 0, 1);
        dev.write_page(0, &label.encode())?;
        dev.write_page(label.area_start(1), &[0u8; PAGE_SIZE])?;
        store.commit(dev)?;
        Ok(store)
    }

    /// Loads the store on `dev`: the newest generation whose area is whole (its super block and
    /// every stream page match their checksums) and consistent. An area left torn by a crash
    /// is ignored; the other then holds the last durable generation.
    pub fn load<D: MetaDevice>(dev: &mut D) -> Result<Store, LvolError> {
        let size_pages = dev.size_pages();
        if size_pages == 0 {
            return Err(LvolError::NotAStore("the device is smaller than a page".into()));
        }
        let mut page = Box::new([0u8; PAGE_SIZE]);
        dev.read_page(0, &mut page)?;
        let label = match Label::decode(&page) {
            Ok(Some(l)) => l,
            Ok(None) => return Err(LvolError::NotAStore("no lvstore label in page 0".into())),
            Err(e) => return Err(LvolError::Corrupt(e)),
        };
        if label.area_start(2) > size_pages {
            return Err(LvolError::Corrupt(format!(
                "metadata areas of {} pages do not fit a device of {size_pages} pages",
                label.area_pages
            )));
        }
        let mut found: Vec<(WholeArea, usize)> = Vec::new();
        let mut reasons = Vec::new();
        for area in 0..2 {
            match read_area(dev, &label, area)? {
                Ok(whole) => found.push((whole, area)),
                Err(e) => reasons.push(format!("area {area}: {e}")),
            }
        }
        found.sort_by_key(|((sb, _), _)| std::cmp::Reverse(sb.generation));
        if let [((a, _), _), ((b, _), _)] = &found[..] {
            if a.generation == b.generation {
                return Err(LvolError::Corrupt(format!("both areas hold generation {}", a.generation)));
            }
        }
        let Some(((sb, pages), area)) = found.into_iter().next() else {
            return Err(LvolError::Corrupt(reasons.join("; ")));
        };
        // The newest whole area must also be consistent; an inconsistent one is not a torn write
        // (its checksums match) but damage or a bug, which is reported, not papered over by
        // going back to the older generation.
        Store::from_area(label, size_pages, &sb, pages, area)
    }

    /// SPDK's `bdev_lvol_delete_lvstore` on the device: zeroes the label, flushes, then zeroes
    /// both super blocks and flushes. Once the first flush returns the device holds no store
    /// (`NotAStore` on load); a crash before leaves the store whole or none (the label's fields
    /// and magic are in its first sector). The volumes' data is left as it is (SPDK's
    /// `clear_method` is the module's). The store must not be used afterwards (the module's
    /// owner marks it so).
    pub fn destroy<D: MetaDevice>(&self, dev: &mut D) -> Result<(), LvolError> {
        let zero = [0u8; PAGE_SIZE];
        dev.write_page(0, &zero)?;
        dev.flush()?;
        for area in 0..2 {
            dev.write_page(self.label.area_start(area), &zero)?;
        }
        dev.flush()?;
        Ok(())
    }

    /// A store without volumes whose last durable generation is `generation`, in `area`.
    fn empty(label: Label, name: String, total_clusters: u64, generation: u64, area: usize) -> Store {
        Store {
            label,
            name,
            total_clusters,
            volumes: Vec::new(),
            used: vec![0; total_clusters.div_ceil(64) as usize],
            owned: 0,
            pending_free: Vec::new(),
            hint: 0,
            generation,
            area,
            known: [None, None],
            committing: false,
        }
    }

    fn from_area(
        label: Label,
        size_pages: u64,
        sb: &SuperBlock,
        pages: Vec<Box<Page>>,
        area: usize,
    ) -> Result<Store, LvolError> {
        let corrupt =
            |e: String| LvolError::Corrupt(format!("area {area}, generation {}: {e}", sb.generation));
        if sb.uuid != label.uuid
            || sb.cluster_size != label.cluster_size
            || sb.block_size != label.block_size
            || sb.area_pages != label.area_pages
        {
            return Err(corrupt("super block does not match the label".into()));
        }
        let fits = label.clusters_in(size_pages);
        if sb.total_clusters == 0 || sb.total_clusters > fits || sb.total_clusters > UNALLOCATED as u64 {
            return Err(corrupt(format!("{} clusters on a device that holds {fits}", sb.total_clusters)));
        }
        let mut stream = Vec::with_capacity(sb.stream_len as usize);
        for p in &pages[1..] {
            stream.extend_from_slice(&p[..]);
        }
        if stream[sb.stream_len as usize..].iter().any(|&b| b != 0) {
            return Err(corrupt("bytes after the end of the stream".into()));
        }
        stream.truncate(sb.stream_len as usize);
        let volumes = format::decode_stream(&stream).map_err(corrupt)?;
        let mut store = Store::empty(label, sb.name.clone(), sb.total_clusters, sb.generation, area);
        store.known[area] = Some(pages);
        store.adopt(volumes).map_err(corrupt)?;
        if store.free_clusters() != sb.free_clusters {
            return Err(corrupt(format!(
                "super block counts {} free clusters, the maps leave {}",
                sb.free_clusters,
                store.free_clusters()
            )));
        }
        Ok(store)
    }

    /// Takes decoded volumes after checking everything that involves more than one record:
    /// unique uuids and names, parents that exist, are snapshots and form no cycle, thick
    /// volumes fully allocated, clusters in range and owned once.
    fn adopt(&mut self, volumes: Vec<Volume>) -> Result<(), String> {
        // Hash lookups and a single walk of the parent links keep this linear: a hostile area
        // can hold tens of thousands of records.
        let what = |i: usize| format!("volume {i} ('{}')", volumes[i].name.escape_debug());
        let mut by_uuid = HashMap::with_capacity(volumes.len());
        let mut names = HashSet::with_capacity(volumes.len());
        for (i, v) in volumes.iter().enumerate() {
            check_name("lvol_name", &v.name).map_err(|e| format!("{}: {e}", what(i)))?;
            if v.uuid.is_nil() || by_uuid.insert(v.uuid, i).is_some() {
                return Err(format!("{}: nil or repeated uuid {}", what(i), v.uuid));
            }
            if !names.insert(v.name.as_str()) {
                return Err(format!("{}: repeated name", what(i)));
            }
            if v.snapshot && !v.read_only {
                return Err(format!("{}: a snapshot that is not read-only", what(i)));
            }
            if !v.thin && (v.parent.is_some() || v.external.is_some() || v.map.contains(&UNALLOCATED)) {
                return Err(format!("{}: thick, but with a parent or unallocated clusters", what(i)));
            }
            if v.parent.is_some() && v.external.is_some() {
                return Err(format!("{}: both a parent and an external parent", what(i)));
            }
        }
        let mut parent = Vec::with_capacity(volumes.len());
        for (i, v) in volumes.iter().enumerate() {
            let p = match v.parent {
                None => None,
                Some(p) => match by_uuid.get(&p) {
                    None => return Err(format!("{}: parent {p} is not in the store", what(i))),
                    Some(&pi) if !volumes[pi].snapshot => {
                        return Err(format!("{}: parent {} is not a snapshot", what(i), what(pi)))
                    }
                    Some(&pi) => Some(pi),
                },
            };
            parent.push(p);
        }
        // Each volume has one parent at most, so following the links from every volume, never
        // twice through the same one, finds any cycle.
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            OnPath,
            Done,
        }
        let mut mark = vec![Mark::New; volumes.len()];
        for start in 0..volumes.len() {
            let mut path = Vec::new();
            let mut at = Some(start);
            while let Some(i) = at {
                match mark[i] {
                    Mark::Done => break,
                    Mark::OnPath => return Err(format!("{}: its parents form a cycle", what(i))),
                    Mark::New => {
                        mark[i] = Mark::OnPath;
                        path.push(i);
                        at = parent[i];
                    }
                }
            }
            for i in path {
                mark[i] = Mark::Done;
            }
        }
        // Every writer keeps parents before their clones; the owner builds views in that order.
        for (i, p) in parent.iter().enumerate() {
            if let Some(pi) = *p {
                if pi > i {
                    return Err(format!("{}: listed before its parent {}", what(i), what(pi)));
                }
            }
        }
        for (i, v) in volumes.iter().enumerate() {
            for (j, &c) in v.map.iter().enumerate() {
                if c == UNALLOCATED {
                    continue;
                }
                if c as u64 >= self.total_clusters {
                    return Err(format!(
                        "{}: cluster {j} maps to {c}, past the store's {}",
                        what(i),
                        self.total_clusters
                    ));
                }
                if self.is_used(c) {
                    return Err(format!("{}: cluster {c} is owned twice", what(i)));
                }
                self.set_used(c, true);
                self.owned += 1;
            }
        }
        self.volumes = volumes;
        Ok(())
    }

    // ---- queries ----

    pub fn uuid(&self) -> Uuid {
        self.label.uuid
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn cluster_size(&self) -> u64 {
        self.label.cluster_size
    }

    pub fn block_size(&self) -> u32 {
        self.label.block_size
    }

    pub fn total_clusters(&self) -> u64 {
        self.total_clusters
    }

    /// Clusters no volume maps (SPDK's `free_clusters`); it includes clusters freed since the
    /// last commit, which become allocatable when it is durable.
    pub fn free_clusters(&self) -> u64 {
        self.total_clusters - self.owned
    }

    /// Clusters an allocation may take now.
    pub fn allocatable_clusters(&self) -> u64 {
        self.free_clusters() - self.pending_free.len() as u64
    }

    /// The last durable generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn volumes(&self) -> &[Volume] {
        &self.volumes
    }

    pub fn volume(&self, uuid: &Uuid) -> Option<&Volume> {
        self.volumes.iter().find(|v| v.uuid == *uuid)
    }

    pub fn volume_by_name(&self, name: &str) -> Option<&Volume> {
        self.volumes.iter().find(|v| v.name == name)
    }

    /// Whether any volume has `uuid` as its parent (SPDK's `is_clone` of the children).
    pub fn has_clones(&self, uuid: &Uuid) -> bool {
        self.volumes.iter().any(|v| v.parent == Some(*uuid))
    }

    /// Whether [`Store::delete_volume`] would delete the volume, changing nothing: so the module
    /// can refuse before it closes the volume's bdev. Returns the volume's index.
    pub fn check_delete(&self, uuid: &Uuid) -> Result<usize, LvolError> {
        let i = self.index("lvol", uuid)?;
        if self.has_clones(uuid) {
            return Err(LvolError::State {
                field: "lvol",
                reason: format!("'{}' has clones; delete them (or inflate them) first", self.volumes[i].name),
            });
        }
        Ok(i)
    }

    /// Data clusters a base device of `bytes` bytes holds with this store's geometry (what
    /// [`Store::grow`] takes when the base has grown).
    pub fn clusters_for_device(&self, bytes: u64) -> u64 {
        clusters_on(&self.label, bytes / PAGE_SIZE as u64)
    }

    /// Byte offset on the base device of a data cluster.
    pub fn cluster_offset(&self, cluster: u32) -> u64 {
        self.label.data_offset() + cluster as u64 * self.label.cluster_size
    }

    /// Bytes of metadata the stream takes now, and the most an area holds.
    pub fn metadata_bytes(&self) -> (u64, u64) {
        (self.stream_len(), self.metadata_capacity())
    }

    /// Where a read of the volume's cluster `index` comes from: its own cluster, else the
    /// nearest ancestor's, else `None` (zeroes; also past a shorter parent's end).
    pub fn cluster_for_read(&self, uuid: &Uuid, index: u64) -> Result<Option<u32>, LvolError> {
        let (i, _) = self.entry(uuid, index, false)?;
        Ok(self.resolve(&self.volumes[i], index))
    }

    /// Where a read of the volume's cluster `index` comes from, the external parent included.
    pub fn read_source(&self, uuid: &Uuid, index: u64) -> Result<ReadSource, LvolError> {
        let (i, _) = self.entry(uuid, index, false)?;
        Ok(self.source(&self.volumes[i], index))
    }

    fn resolve(&self, v: &Volume, index: u64) -> Option<u32> {
        match self.source(v, index) {
            ReadSource::Cluster(c) => Some(c),
            _ => None,
        }
    }

    fn source(&self, v: &Volume, index: u64) -> ReadSource {
        let mut at = Some(v);
        while let Some(w) = at {
            match w.map.get(index as usize) {
                Some(&c) if c != UNALLOCATED => return ReadSource::Cluster(c),
                // Past this ancestor's end there is nothing further up either.
                None => return ReadSource::Zeroes,
                _ => match (&w.external, w.parent) {
                    (Some(e), _) if index < e.clusters => return ReadSource::External,
                    (_, p) => at = p.and_then(|p| self.volume(&p)),
                },
            }
        }
        ReadSource::Zeroes
    }

    /// The external parent at the end of the volume's chain, if any.
    pub fn chain_external(&self, uuid: &Uuid) -> Option<&ExternalParent> {
        let mut at = self.volume(uuid);
        while let Some(w) = at {
            if w.external.is_some() {
                return w.external.as_ref();
            }
            at = w.parent.and_then(|p| self.volume(&p));
        }
        None
    }

    /// The external parents the store's volumes name (each once).
    pub fn external_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.volumes.iter().filter_map(|v| v.external.as_ref().map(|e| e.name.clone())).collect();
        names.sort();
        names.dedup();
        names
    }

    // ---- volume operations ----

    /// Creates a volume of `size` bytes (a whole number of clusters). A thick volume gets all its
    /// clusters now.
    pub fn create_volume(&mut self, uuid: Uuid, name: &str, size: u64, thin: bool) -> Result<(), LvolError> {
        self.check_new("lvol_name", uuid, name)?;
        let clusters = self.clusters_of("size", size)?;
        self.check_room(format::record_len(name.len(), clusters))?;
        if !thin {
            self.check_allocatable(clusters)?;
        }
        let mut map = vec![UNALLOCATED; clusters as usize];
        if !thin {
            for e in &mut map {
                *e = self.allocate().expect("room checked");
            }
        }
        self.volumes.push(Volume {
            uuid,
            name: name.to_string(),
            parent: None,
            thin,
            read_only: false,
            snapshot: false,
            map,
            external: None,
        });
        Ok(())
    }

    /// Deletes a volume; its clusters are free once the next commit is durable. A snapshot with
    /// clones is refused.
    pub fn delete_volume(&mut self, uuid: &Uuid) -> Result<(), LvolError> {
        let i = self.check_delete(uuid)?;
        let v = self.volumes.remove(i);
        for c in v.map {
            self.release(c);
        }
        Ok(())
    }

    /// Changes a volume's size (a whole number of clusters). Growing a thick volume allocates;
    /// shrinking frees the clusters past the end. Snapshots are refused: clones read through
    /// them.
    pub fn resize_volume(&mut self, uuid: &Uuid, size: u64) -> Result<(), LvolError> {
        let i = self.index("lvol", uuid)?;
        if self.volumes[i].snapshot {
            return Err(LvolError::State {
                field: "lvol",
                reason: format!("'{}' is a snapshot, which cannot be resized", self.volumes[i].name),
            });
        }
        let clusters = self.clusters_of("size", size)?;
        let old = self.volumes[i].size_clusters();
        if clusters > old {
            self.check_room(4 * (clusters - old))?;
            if !self.volumes[i].thin {
                self.check_allocatable(clusters - old)?;
            }
            for _ in old..clusters {
                let c =
                    if self.volumes[i].thin { UNALLOCATED } else { self.allocate().expect("room checked") };
                self.volumes[i].map.push(c);
            }
        } else {
            let tail = self.volumes[i].map.split_off(clusters as usize);
            for c in tail {
                self.release(c);
            }
        }
        Ok(())
    }

    pub fn set_read_only(&mut self, uuid: &Uuid) -> Result<(), LvolError> {
        let i = self.index("lvol", uuid)?;
        self.volumes[i].read_only = true;
        Ok(())
    }

    pub fn rename_volume(&mut self, uuid: &Uuid, new_name: &str) -> Result<(), LvolError> {
        let i = self.index("lvol", uuid)?;
        check_name("new_name", new_name)?;
        if self.volumes.iter().any(|v| v.name == new_name && v.uuid != *uuid) {
            return Err(LvolError::Exists { field: "new_name", value: new_name.to_string() });
        }
        let grow = (new_name.len() as u64).saturating_sub(self.volumes[i].name.len() as u64);
        self.check_room(grow)?;
        self.volumes[i].name = new_name.to_string();
        Ok(())
    }

    pub fn rename_store(&mut self, new_name: &str) -> Result<(), LvolError> {
        check_name("new_name", new_name)?;
        self.name = new_name.to_string();
        Ok(())
    }

    /// Makes a write to the volume's cluster `index` possible: the cluster it owns, or a newly
    /// allocated one with where its initial contents come from (copy-on-write).
    pub fn allocate_for_write(&mut self, uuid: &Uuid, index: u64) -> Result<WriteTarget, LvolError> {
        let (i, c) = self.entry(uuid, index, true)?;
        if c != UNALLOCATED {
            return Ok(WriteTarget::Mapped(c));
        }
        self.check_allocatable(1)?;
        let source = self.source(&self.volumes[i], index);
        let cluster = self.allocate().expect("room checked");
        self.volumes[i].map[index as usize] = cluster;
        Ok(match source {
            ReadSource::Cluster(c) => WriteTarget::Allocated { cluster, copy_from: Some(c) },
            ReadSource::Zeroes => WriteTarget::Allocated { cluster, copy_from: None },
            ReadSource::External => WriteTarget::AllocatedFromExternal { cluster },
        })
    }

    /// Takes back the cluster [`Store::allocate_for_write`] just gave the volume's cluster
    /// `index` (its data could not be prepared); it is free once the next commit is durable.
    pub fn undo_allocation(&mut self, uuid: &Uuid, index: u64) {
        if let Some(i) = self.volumes.iter().position(|v| v.uuid == *uuid) {
            if let Some(e) = self.volumes[i].map.get_mut(index as usize) {
                let c = std::mem::replace(e, UNALLOCATED);
                self.release(c);
            }
        }
    }

    /// Unmaps the thin volume's cluster `index` (unmap or write-zeroes of the whole cluster),
    /// freeing it once the next commit is durable. Returns false, changing nothing, when the
    /// cluster must stay: the volume is thick, owns no such cluster, or a parent has data there
    /// that unmapping would expose (the caller writes zeroes instead).
    pub fn release_cluster(&mut self, uuid: &Uuid, index: u64) -> Result<bool, LvolError> {
        let (i, c) = self.entry(uuid, index, true)?;
        let v = &self.volumes[i];
        let parent_data = match (&v.external, v.parent) {
            (Some(e), _) => index < e.clusters,
            (None, Some(p)) => self.volume(&p).is_some_and(|p| self.source(p, index) != ReadSource::Zeroes),
            (None, None) => false,
        };
        if !v.thin || c == UNALLOCATED || parent_data {
            return Ok(false);
        }
        self.volumes[i].map[index as usize] = UNALLOCATED;
        self.release(c);
        Ok(true)
    }

    /// The clusters `[first, first + count)` of the volume that it owns itself (not through a
    /// parent), one bit each, least significant bit first (SPDK's bit arrays, as Longhorn's
    /// `bdev_lvol_get_fragmap` encodes them), and how many are set.
    pub fn owned_bitmap(&self, uuid: &Uuid, first: u64, count: u64) -> Result<(Vec<u8>, u64), LvolError> {
        let v = self.find("name", uuid)?;
        let end = first.checked_add(count).filter(|&e| e <= v.size_clusters()).ok_or_else(|| {
            LvolError::Invalid {
                field: "size",
                reason: format!(
                    "clusters {first}..{} past the volume's {}",
                    first.saturating_add(count),
                    v.size_clusters()
                ),
            }
        })?;
        let mut bits = vec![0u8; count.div_ceil(8) as usize];
        let mut set = 0;
        for (k, &c) in v.map[first as usize..end as usize].iter().enumerate() {
            if c != UNALLOCATED {
                bits[k / 8] |= 1 << (k % 8);
                set += 1;
            }
        }
        Ok((bits, set))
    }

    /// SPDK's `bdev_lvol_grow_lvstore` after the base device grew: the store counts
    /// `total_clusters` data clusters from now on (see [`Store::clusters_for_device`]). Nothing
    /// moves and no metadata room is needed: the free set is derived from the maps, so only the
    /// super block's count changes. Returns whether the store grew; shrinking is refused.
    pub fn grow(&mut self, total_clusters: u64) -> Result<bool, LvolError> {
        if total_clusters < self.total_clusters {
            return Err(LvolError::State {
                field: "base_bdev",
                reason: format!(
                    "the base holds {total_clusters} data clusters, fewer than the store's {}; a \
                     store cannot shrink",
                    self.total_clusters
                ),
            });
        }
        if total_clusters > UNALLOCATED as u64 {
            return Err(LvolError::Invalid {
                field: "base_bdev",
                reason: format!(
                    "{total_clusters} clusters, more than a cluster map can name ({UNALLOCATED})"
                ),
            });
        }
        if total_clusters == self.total_clusters {
            return Ok(false);
        }
        self.total_clusters = total_clusters;
        self.used.resize(total_clusters.div_ceil(64) as usize, 0);
        Ok(true)
    }

    /// Checks the in-memory state against itself (for tests and after a load): every mapped
    /// cluster in range and owned once, the used bitmap exactly the owned and pending-free
    /// clusters, the free count what the maps leave, parents that exist and are snapshots,
    /// thick volumes without parent or hole. `Err` names the first problem.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut seen = vec![0u64; self.used.len()];
        let mut owned = 0u64;
        let mut listed = HashSet::new();
        let mut mark = |c: u32, what: &dyn Fn() -> String| {
            if c as u64 >= self.total_clusters {
                return Err(format!("{}: cluster {c} past the store's {}", what(), self.total_clusters));
            }
            let (w, bit) = (c as usize / 64, 1u64 << (c % 64));
            if seen[w] & bit != 0 {
                return Err(format!("{}: cluster {c} is held twice", what()));
            }
            seen[w] |= bit;
            Ok(())
        };
        for v in &self.volumes {
            for &c in v.map.iter().filter(|&&c| c != UNALLOCATED) {
                mark(c, &|| format!("volume '{}'", v.name))?;
                owned += 1;
            }
            if let Some(p) = v.parent {
                if !self.volume(&p).is_some_and(|p| p.snapshot) {
                    return Err(format!("volume '{}': parent {p} is not a snapshot of the store", v.name));
                }
                // The owner builds views in list order, each on its parent's.
                if !listed.contains(&p) {
                    return Err(format!("volume '{}': listed before its parent {p}", v.name));
                }
            }
            listed.insert(v.uuid);
            if !v.thin && (v.parent.is_some() || v.external.is_some() || v.map.contains(&UNALLOCATED)) {
                return Err(format!("volume '{}': thick, but with a parent or a hole", v.name));
            }
            if v.parent.is_some() && v.external.is_some() {
                return Err(format!("volume '{}': both a parent and an external parent", v.name));
            }
        }
        for &c in &self.pending_free {
            mark(c, &|| "freed, not yet durable".to_string())?;
        }
        if owned != self.owned {
            return Err(format!("the maps own {owned} clusters, the store counts {}", self.owned));
        }
        if seen != self.used {
            return Err("the used bitmap is not the owned and freed clusters".into());
        }
        Ok(())
    }

    // ---- commit ----

    fn find(&self, field: &'static str, uuid: &Uuid) -> Result<&Volume, LvolError> {
        self.volume(uuid).ok_or_else(|| LvolError::NotFound { field, value: uuid.to_string() })
    }

    fn index(&self, field: &'static str, uuid: &Uuid) -> Result<usize, LvolError> {
        self.volumes
            .iter()
            .position(|v| v.uuid == *uuid)
            .ok_or_else(|| LvolError::NotFound { field, value: uuid.to_string() })
    }

    /// The volume's index and its map entry `index`, checked: the volume exists, the index is in
    /// it and, for a write, the volume is writable.
    fn entry(&self, uuid: &Uuid, index: u64, write: bool) -> Result<(usize, u32), LvolError> {
        let i = self.index("lvol", uuid)?;
        let v = &self.volumes[i];
        if write && v.read_only {
            return Err(LvolError::State { field: "lvol", reason: format!("'{}' is read-only", v.name) });
        }
        match v.map.get(index as usize) {
            Some(&c) => Ok((i, c)),
            None => Err(LvolError::Invalid {
                field: "offset",
                reason: format!("cluster {index} past the volume's {} clusters", v.size_clusters()),
            }),
        }
    }

    fn check_new(&self, field: &'static str, uuid: Uuid, name: &str) -> Result<(), LvolError> {
        check_name(field, name)?;
        if self.volumes.iter().any(|v| v.name == name) {
            return Err(LvolError::Exists { field, value: name.to_string() });
        }
        if uuid.is_nil() || self.volume(&uuid).is_some() {
            return Err(LvolError::Exists { field: "uuid", value: uuid.to_string() });
        }
        Ok(())
    }

    fn clusters_of(&self, field: &'static str, size: u64) -> Result<u64, LvolError> {
        let cs = self.label.cluster_size;
        if size == 0 || size % cs != 0 {
            return Err(LvolError::Invalid {
                field,
                reason: format!("{size} bytes is not a positive multiple of the cluster size {cs}"),
            });
        }
        Ok(size / cs)
    }

    fn stream_len(&self) -> u64 {
        STREAM_FIXED + self.volumes.iter().map(Volume::record_len).sum::<u64>()
    }

    fn metadata_capacity(&self) -> u64 {
        (self.label.area_pages as u64 - 1).min(MAX_STREAM_PAGES as u64) * PAGE_SIZE as u64
    }

    fn check_room(&self, more: u64) -> Result<(), LvolError> {
        let needed = self.stream_len().saturating_add(more);
        if needed > self.metadata_capacity() {
            return Err(LvolError::MetadataFull { needed, capacity: self.metadata_capacity() });
        }
        Ok(())
    }

    fn check_allocatable(&self, n: u64) -> Result<(), LvolError> {
        if n > self.allocatable_clusters() {
            return Err(LvolError::NoSpace { needed: n, free: self.allocatable_clusters() });
        }
        Ok(())
    }

    fn is_used(&self, c: u32) -> bool {
        self.used[c as usize / 64] & (1 << (c % 64)) != 0
    }

    fn set_used(&mut self, c: u32, used: bool) {
        if used {
            self.used[c as usize / 64] |= 1 << (c % 64);
        } else {
            self.used[c as usize / 64] &= !(1 << (c % 64));
        }
    }

    /// The lowest allocatable cluster, marked used and owned.
    fn allocate(&mut self) -> Option<u32> {
        let start = (self.hint / 64) as usize;
        for w in start..self.used.len() {
            if self.used[w] != u64::MAX {
                let c = w as u64 * 64 + self.used[w].trailing_ones() as u64;
                if c >= self.total_clusters {
                    return None;
                }
                self.set_used(c as u32, true);
                self.owned += 1;
                self.hint = c + 1;
                return Some(c as u32);
            }
        }
        None
    }

    /// Allocates a cluster for each `(index, copy_from)` of volume `i`, or none if there are not
    /// enough.
    fn fill(&mut self, i: usize, fills: Vec<(u64, ReadSource)>) -> Result<Vec<NewCluster>, LvolError> {
        self.check_allocatable(fills.len() as u64)?;
        let mut new = Vec::with_capacity(fills.len());
        for (j, copy_from) in fills {
            let cluster = self.allocate().expect("room checked");
            self.volumes[i].map[j as usize] = cluster;
            new.push((j, cluster, copy_from));
        }
        Ok(new)
    }

    /// A cluster no map holds any more: not owned, but kept from allocation until durable.
    fn release(&mut self, c: u32) {
        if c != UNALLOCATED {
            self.owned -= 1;
            self.pending_free.push(c);
        }
    }
}

/// An external parent's name fits its length byte; it has at least a cluster.
fn check_external(e: &ExternalParent) -> Result<(), LvolError> {
    if e.name.is_empty() || e.name.len() > u8::MAX as usize {
        return Err(LvolError::Invalid {
            field: "parent_name",
            reason: format!("a bdev name of {} bytes; 1 to 255 are recorded", e.name.len()),
        });
    }
    if e.clusters == 0 {
        return Err(LvolError::Invalid { field: "parent_name", reason: "smaller than a cluster".into() });
    }
    Ok(())
}

/// Data clusters a device of `size_pages` pages holds, at most as many as a map can name.
fn clusters_on(label: &Label, size_pages: u64) -> u64 {
    label.clusters_in(size_pages).min(UNALLOCATED as u64)
}

/// An area whose every page matched its checksum: its super block and its pages.
type WholeArea = (SuperBlock, Vec<Box<Page>>);

/// Reads and checks one area: `Ok(Err(reason))` when it is not whole (torn, never written,
/// damaged), `Err` only when the device fails.
fn read_area<D: MetaDevice>(
    dev: &mut D,
    label: &Label,
    area: usize,
) -> Result<Result<WholeArea, String>, LvolError> {
    let start = label.area_start(area);
    let mut sb_page = Box::new([0u8; PAGE_SIZE]);
    dev.read_page(start, &mut sb_page)?;
    let sb = match SuperBlock::decode(&sb_page) {
        Ok(sb) => sb,
        Err(e) => return Ok(Err(e)),
    };
    if sb.page_crcs.len() as u64 >= label.area_pages as u64 {
        return Ok(Err(format!("{} stream pages in an area of {}", sb.page_crcs.len(), label.area_pages)));
    }
    let mut pages = vec![sb_page];
    for (i, &crc) in sb.page_crcs.iter().enumerate() {
        let mut p = Box::new([0u8; PAGE_SIZE]);
        dev.read_page(start + 1 + i as u64, &mut p)?;
        let got = crate::crc::crc32c(&p[..]);
        if got != crc {
            return Ok(Err(format!(
                "generation {}: stream page {i} checksum {got:#010x}, the super block has {crc:#010x}",
                sb.generation
            )));
        }
        pages.push(p);
    }
    Ok(Ok((sb, pages)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    /// An empty store of 1 MiB clusters on `dev`.
    fn empty_on(dev: &mut MemDevice) -> Store {
        let opts = StoreOptions {
            name: "lvs".into(),
            uuid: Uuid([1; 16]),
            cluster_size: 1 << 20,
            block_size: 512,
            area_pages: Some(4),
        };
        Store::create(dev, &opts).unwrap()
    }

    fn store() -> Store {
        let mut s = empty_on(&mut MemDevice::new(2560));
        s.create_volume(Uuid([2; 16]), "a", 3 << 20, false).unwrap();
        s.create_volume(Uuid([3; 16]), "b", 2 << 20, true).unwrap();
        s.allocate_for_write(&Uuid([3; 16]), 1).unwrap();
        s.release_cluster(&Uuid([3; 16]), 1).unwrap();
        s
    }

    /// set_parent makes a thin volume a clone, keeps parents listed first, and loads back.
    #[test]
    fn set_parent_is_durable_and_keeps_the_order() {
        let mut dev = MemDevice::new(2560);
        let mut s = empty_on(&mut dev);
        let (w, v, snap) = (Uuid([2; 16]), Uuid([3; 16]), Uuid([4; 16]));
        s.create_volume(w, "w", 2 << 20, true).unwrap();
        s.create_volume(v, "v", 2 << 20, true).unwrap();
        let c = match s.allocate_for_write(&v, 0).unwrap() {
            WriteTarget::Allocated { cluster, .. } => cluster,
            other => panic!("{other:?}"),
        };
        s.snapshot(&v, snap, "s").unwrap();
        s.set_parent(&w, &snap).unwrap();
        assert_eq!(s.cluster_for_read(&w, 0).unwrap(), Some(c));
        s.check_consistency().unwrap();
        s.commit(&mut dev).unwrap();
        let loaded = Store::load(&mut dev).unwrap();
        assert_eq!(loaded.volumes(), s.volumes());
        assert_eq!(loaded.volume(&w).unwrap().parent, Some(snap));
        let e = s.set_parent(&w, &snap).unwrap_err().to_string();
        assert!(e.starts_with("parent_name: ") && e.contains("already"), "{e}");
    }

    /// An esnap clone reads its external parent up to the parent's size and zeroes past it
    /// (after a resize); a write there copies from the external parent; a whole-cluster unmap
    /// keeps a cluster the external parent would show through.
    #[test]
    fn external_parents_end_where_the_bdev_ended() {
        let mut s = empty_on(&mut MemDevice::new(2560));
        let c = Uuid([2; 16]);
        s.clone_external(c, "c", ExternalParent { name: "golden".into(), clusters: 2 }).unwrap();
        s.resize_volume(&c, 3 << 20).unwrap();
        let sources: Vec<ReadSource> = (0..3).map(|j| s.read_source(&c, j).unwrap()).collect();
        assert_eq!(sources, [ReadSource::External, ReadSource::External, ReadSource::Zeroes]);
        assert!(matches!(s.allocate_for_write(&c, 1).unwrap(), WriteTarget::AllocatedFromExternal { .. }));
        assert!(matches!(
            s.allocate_for_write(&c, 2).unwrap(),
            WriteTarget::Allocated { copy_from: None, .. }
        ));
        assert!(!s.release_cluster(&c, 1).unwrap(), "the external parent would show through");
        assert!(s.release_cluster(&c, 2).unwrap());
        let e = s.set_external_parent(&c, ExternalParent { name: "golden".into(), clusters: 2 }).unwrap_err();
        assert!(e.to_string().starts_with("parent_name: "), "{e}");
        let e = s.clone_external(Uuid([3; 16]), "d", ExternalParent { name: String::new(), clusters: 1 });
        assert!(e.unwrap_err().to_string().starts_with("parent_name: "));
        s.check_consistency().unwrap();
    }

    /// The checker finds each kind of damage to the in-memory state.
    #[test]
    fn check_consistency_finds_damage() {
        let s = store();
        s.check_consistency().unwrap();
        let damaged = |f: &dyn Fn(&mut Store), want: &str| {
            let mut s = store();
            f(&mut s);
            let e = s.check_consistency().unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        damaged(&|s| s.volumes[1].map[0] = 0, "held twice");
        damaged(&|s| s.volumes[1].map[0] = 3, "held twice"); // the pending-free cluster
        damaged(&|s| s.volumes[1].map[0] = 9999, "past the store");
        damaged(&|s| s.used[0] &= !1, "used bitmap");
        damaged(&|s| s.used[0] |= 1 << 40, "used bitmap");
        damaged(&|s| s.owned += 1, "the store counts");
        damaged(&|s| s.volumes[1].parent = Some(Uuid([2; 16])), "not a snapshot");
        damaged(&|s| s.volumes[0].map[2] = UNALLOCATED, "thick");
    }
}
