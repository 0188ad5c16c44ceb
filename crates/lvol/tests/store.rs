//! The store's operations, commit and load, against an in-memory device.

use fp_lvol::{
    LvolError, MemDevice, MetaDevice, Page, ReadSource, Store, StoreOptions, Uuid, Volume, WriteTarget,
    PAGE_SIZE, UNALLOCATED,
};

const MIB: u64 = 1 << 20;

fn uuid(n: u8) -> Uuid {
    Uuid([n; 16])
}

fn opts() -> StoreOptions {
    StoreOptions {
        name: "lvs0".into(),
        uuid: uuid(0xAA),
        cluster_size: MIB,
        block_size: 512,
        area_pages: Some(8),
    }
}

/// A 20 MiB device: 17 metadata pages round up to 1 MiB, so 19 data clusters.
fn new_store() -> (MemDevice, Store) {
    let mut dev = MemDevice::new(20 * MIB / PAGE_SIZE as u64);
    let store = Store::create(&mut dev, &opts()).unwrap();
    (dev, store)
}

fn summary(s: &Store) -> (String, u64, u64, u64, Vec<Volume>) {
    (s.name().to_string(), s.total_clusters(), s.free_clusters(), s.generation(), s.volumes().to_vec())
}

fn reload(dev: &mut MemDevice, s: &Store) {
    let loaded = Store::load(dev).unwrap();
    assert_eq!(summary(&loaded), summary(s));
}

fn field(e: LvolError) -> String {
    match e {
        LvolError::Invalid { field, .. }
        | LvolError::NotFound { field, .. }
        | LvolError::Exists { field, .. }
        | LvolError::State { field, .. } => field.to_string(),
        other => format!("{other:?}"),
    }
}

#[test]
fn create_and_load_an_empty_store() {
    let (mut dev, s) = new_store();
    assert_eq!(s.total_clusters(), 19);
    assert_eq!(s.free_clusters(), 19);
    assert_eq!(s.generation(), 1);
    assert_eq!(s.cluster_offset(0), MIB);
    reload(&mut dev, &s);
    assert!(matches!(Store::load(&mut MemDevice::new(64)), Err(LvolError::NotAStore(_))));
}

#[test]
fn create_refuses_bad_options() {
    let mut dev = MemDevice::new(5120);
    for (o, f) in [
        (StoreOptions { cluster_size: 3000, ..opts() }, "cluster_sz"),
        (StoreOptions { name: "a/b".into(), ..opts() }, "lvs_name"),
        (StoreOptions { uuid: Uuid::NIL, ..opts() }, "uuid"),
        (StoreOptions { area_pages: Some(1), ..opts() }, "area_pages"),
        (StoreOptions { cluster_size: 1 << 30, ..opts() }, "bdev_name"),
    ] {
        assert_eq!(field(Store::create(&mut dev, &o).unwrap_err()), f);
    }
    assert!(dev.image().iter().all(|&b| b == 0), "a refused create wrote");
}

#[test]
fn thin_volume_allocates_on_first_write() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "thin", 4 * MIB, true).unwrap();
    assert_eq!(s.free_clusters(), 19);
    assert_eq!(s.cluster_for_read(&uuid(1), 2).unwrap(), None);
    assert_eq!(
        s.allocate_for_write(&uuid(1), 2).unwrap(),
        WriteTarget::Allocated { cluster: 0, copy_from: None }
    );
    assert_eq!(s.allocate_for_write(&uuid(1), 2).unwrap(), WriteTarget::Mapped(0));
    assert_eq!(
        s.allocate_for_write(&uuid(1), 0).unwrap(),
        WriteTarget::Allocated { cluster: 1, copy_from: None }
    );
    assert_eq!(s.cluster_for_read(&uuid(1), 2).unwrap(), Some(0));
    assert_eq!(s.free_clusters(), 17);
    assert_eq!(field(s.allocate_for_write(&uuid(1), 4).unwrap_err()), "offset");
    assert_eq!(s.commit(&mut dev).unwrap(), 2);
    reload(&mut dev, &s);
}

#[test]
fn thick_volume_takes_its_clusters_and_refusals_change_nothing() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "thick", 5 * MIB, false).unwrap();
    assert_eq!(s.volume(&uuid(1)).unwrap().map, vec![0, 1, 2, 3, 4]);
    assert_eq!(s.free_clusters(), 14);
    let before = summary(&s);
    assert!(matches!(
        s.create_volume(uuid(2), "big", 15 * MIB, false),
        Err(LvolError::NoSpace { needed: 15, free: 14 })
    ));
    assert_eq!(field(s.create_volume(uuid(2), "thick", MIB, true).unwrap_err()), "lvol_name");
    assert_eq!(field(s.create_volume(uuid(1), "other", MIB, true).unwrap_err()), "uuid");
    assert_eq!(field(s.create_volume(uuid(2), "odd", MIB + 512, true).unwrap_err()), "size");
    assert_eq!(field(s.create_volume(uuid(2), "zero", 0, true).unwrap_err()), "size");
    assert_eq!(field(s.create_volume(uuid(2), &"n".repeat(64), MIB, true).unwrap_err()), "lvol_name");
    assert_eq!(field(s.resize_volume(&uuid(1), 30 * MIB).unwrap_err()), "NoSpace { needed: 25, free: 14 }");
    assert_eq!(field(s.delete_volume(&uuid(9)).unwrap_err()), "lvol");
    assert_eq!(summary(&s), before);
    // Grow allocates, shrink frees the tail.
    s.resize_volume(&uuid(1), 7 * MIB).unwrap();
    assert_eq!(s.volume(&uuid(1)).unwrap().map, vec![0, 1, 2, 3, 4, 5, 6]);
    s.resize_volume(&uuid(1), 2 * MIB).unwrap();
    assert_eq!(s.free_clusters(), 17);
    s.commit(&mut dev).unwrap();
    reload(&mut dev, &s);
}

#[test]
fn freed_clusters_are_reused_only_after_a_durable_commit() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "a", 10 * MIB, false).unwrap();
    s.commit(&mut dev).unwrap();
    s.delete_volume(&uuid(1)).unwrap();
    assert_eq!(s.free_clusters(), 19);
    assert_eq!(s.allocatable_clusters(), 9);
    // Clusters 0..10 are still the deleted volume's on disk: a new volume gets 10..
    s.create_volume(uuid(2), "b", 2 * MIB, false).unwrap();
    assert_eq!(s.volume(&uuid(2)).unwrap().map, vec![10, 11]);
    // A commit prepared now releases them only when it is done.
    let plan = s.prepare_commit().unwrap();
    assert!(matches!(s.prepare_commit(), Err(LvolError::CommitInFlight)));
    s.delete_volume(&uuid(2)).unwrap();
    for (page, data) in plan.writes() {
        dev.write_page(page, data).unwrap();
    }
    s.commit_done(plan);
    // 0..10 are back; 10 and 11 wait for the next commit.
    assert_eq!(s.allocatable_clusters(), 17);
    s.create_volume(uuid(3), "c", MIB, false).unwrap();
    assert_eq!(s.volume(&uuid(3)).unwrap().map, vec![0]);
    s.commit(&mut dev).unwrap();
    assert_eq!(s.allocatable_clusters(), 18);
    reload(&mut dev, &s);
}

#[test]
fn snapshots_clones_and_copy_on_write() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "vol", 3 * MIB, false).unwrap();
    s.snapshot(&uuid(1), uuid(2), "snap").unwrap();
    let snap = s.volume(&uuid(2)).unwrap();
    assert!(snap.snapshot && snap.read_only && !snap.thin && snap.map == vec![0, 1, 2]);
    let vol = s.volume(&uuid(1)).unwrap();
    assert!(vol.thin && vol.parent == Some(uuid(2)) && vol.map == vec![UNALLOCATED; 3]);
    assert_eq!(s.free_clusters(), 16);
    // Reads go through to the snapshot; the first write copies.
    assert_eq!(s.cluster_for_read(&uuid(1), 1).unwrap(), Some(1));
    assert_eq!(
        s.allocate_for_write(&uuid(1), 1).unwrap(),
        WriteTarget::Allocated { cluster: 3, copy_from: Some(1) }
    );
    assert_eq!(s.cluster_for_read(&uuid(1), 1).unwrap(), Some(3));
    // A clone of the snapshot, and a snapshot of the clone: a chain of two.
    s.clone_snapshot(&uuid(2), uuid(3), "clone").unwrap();
    s.allocate_for_write(&uuid(3), 0).unwrap();
    s.snapshot(&uuid(3), uuid(4), "snap2").unwrap();
    assert_eq!(s.volume(&uuid(4)).unwrap().parent, Some(uuid(2)));
    assert!(s.volume(&uuid(4)).unwrap().thin);
    assert_eq!(s.cluster_for_read(&uuid(3), 0).unwrap(), Some(4));
    assert_eq!(s.cluster_for_read(&uuid(3), 2).unwrap(), Some(2));
    assert_eq!(
        s.allocate_for_write(&uuid(3), 2).unwrap(),
        WriteTarget::Allocated { cluster: 5, copy_from: Some(2) }
    );
    // Refusals, each naming its field, changing nothing.
    let before = summary(&s);
    assert_eq!(field(s.snapshot(&uuid(2), uuid(9), "s3").unwrap_err()), "lvol");
    assert_eq!(field(s.resize_volume(&uuid(2), MIB).unwrap_err()), "lvol");
    assert_eq!(field(s.delete_volume(&uuid(2)).unwrap_err()), "lvol");
    assert_eq!(field(s.clone_snapshot(&uuid(1), uuid(9), "c2").unwrap_err()), "snapshot");
    assert_eq!(field(s.snapshot(&uuid(1), uuid(9), "snap").unwrap_err()), "snapshot_name");
    assert_eq!(field(s.allocate_for_write(&uuid(2), 0).unwrap_err()), "lvol");
    assert_eq!(summary(&s), before);
    s.commit(&mut dev).unwrap();
    reload(&mut dev, &s);
    // Clones first, then the snapshot can go.
    s.delete_volume(&uuid(1)).unwrap();
    assert!(s.delete_volume(&uuid(2)).is_err());
    s.delete_volume(&uuid(3)).unwrap();
    s.delete_volume(&uuid(4)).unwrap();
    s.delete_volume(&uuid(2)).unwrap();
    assert_eq!(s.free_clusters(), 19);
    s.commit(&mut dev).unwrap();
    reload(&mut dev, &s);
}

#[test]
fn release_frees_only_what_no_parent_shows_through() {
    let (_dev, mut s) = new_store();
    s.create_volume(uuid(1), "vol", 2 * MIB, true).unwrap();
    s.allocate_for_write(&uuid(1), 0).unwrap();
    s.snapshot(&uuid(1), uuid(2), "snap").unwrap();
    s.allocate_for_write(&uuid(1), 0).unwrap();
    s.allocate_for_write(&uuid(1), 1).unwrap();
    // Cluster 0 has the snapshot's data under it: unmapping would expose it.
    assert!(!s.release_cluster(&uuid(1), 0).unwrap());
    assert!(s.release_cluster(&uuid(1), 1).unwrap());
    assert!(!s.release_cluster(&uuid(1), 1).unwrap());
    assert_eq!(s.volume(&uuid(1)).unwrap().map, vec![1, UNALLOCATED]);
    s.create_volume(uuid(3), "thick", MIB, false).unwrap();
    assert!(!s.release_cluster(&uuid(3), 0).unwrap());
}

#[test]
fn renames_and_read_only() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "a", MIB, true).unwrap();
    s.create_volume(uuid(2), "b", MIB, true).unwrap();
    assert_eq!(field(s.rename_volume(&uuid(1), "b").unwrap_err()), "new_name");
    s.rename_volume(&uuid(1), "c").unwrap();
    s.rename_store("lvs1").unwrap();
    s.set_read_only(&uuid(2)).unwrap();
    assert_eq!(field(s.allocate_for_write(&uuid(2), 0).unwrap_err()), "lvol");
    s.commit(&mut dev).unwrap();
    let loaded = Store::load(&mut dev).unwrap();
    assert_eq!(loaded.name(), "lvs1");
    assert!(loaded.volume_by_name("c").is_some() && loaded.volume(&uuid(2)).unwrap().read_only);
}

#[test]
fn metadata_area_full_is_refused() {
    let (_dev, mut s) = new_store();
    let (used, cap) = s.metadata_bytes();
    assert_eq!((used, cap), (4, 7 * PAGE_SIZE as u64));
    // 7 pages hold maps of about 7,150 clusters.
    assert!(matches!(
        s.create_volume(uuid(1), "huge", 8000 * MIB, true),
        Err(LvolError::MetadataFull { .. })
    ));
    s.create_volume(uuid(1), "big", 7000 * MIB, true).unwrap();
    assert!(matches!(s.snapshot(&uuid(1), uuid(2), "s"), Err(LvolError::MetadataFull { .. })));
    assert!(matches!(s.resize_volume(&uuid(1), 7200 * MIB), Err(LvolError::MetadataFull { .. })));
}

/// A device that counts its writes and fails them once `writes_left` runs out.
struct Counting {
    inner: MemDevice,
    writes: usize,
    writes_left: usize,
}

impl Counting {
    fn new(inner: MemDevice) -> Counting {
        Counting { inner, writes: 0, writes_left: usize::MAX }
    }
}

impl MetaDevice for Counting {
    fn size_pages(&self) -> u64 {
        self.inner.size_pages()
    }
    fn read_page(&mut self, page: u64, buf: &mut Page) -> Result<(), fp_lvol::DeviceError> {
        self.inner.read_page(page, buf)
    }
    fn write_page(&mut self, page: u64, buf: &Page) -> Result<(), fp_lvol::DeviceError> {
        if self.writes_left == 0 {
            return Err(fp_lvol::DeviceError { op: "write", page, reason: "injected".into() });
        }
        self.writes_left -= 1;
        self.writes += 1;
        self.inner.write_page(page, buf)
    }
    fn flush(&mut self) -> Result<(), fp_lvol::DeviceError> {
        Ok(())
    }
}

#[test]
fn a_failed_commit_keeps_the_old_generation_and_can_be_retried() {
    let (dev, mut s) = new_store();
    let mut dev = Counting { writes_left: 1, ..Counting::new(dev) };
    s.create_volume(uuid(1), "a", 3000 * MIB, true).unwrap();
    let e = s.commit(&mut dev).unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert_eq!(s.generation(), 1);
    // Half an area is on the device: the load still finds generation 1.
    assert_eq!(Store::load(&mut dev.inner).unwrap().generation(), 1);
    dev.writes_left = usize::MAX;
    assert_eq!(s.commit(&mut dev).unwrap(), 2);
    reload(&mut dev.inner, &s);
}

/// Commits write only the pages that differ from what the target area held.
#[test]
fn commits_write_only_changed_pages() {
    let (dev, mut s) = new_store();
    let mut dev = Counting::new(dev);
    s.create_volume(uuid(1), "a", 5000 * MIB, true).unwrap();
    s.commit(&mut dev).unwrap(); // area 1, unknown: super + 5 stream pages
    assert_eq!(dev.writes, 6);
    s.commit(&mut dev).unwrap(); // area 0 held the empty store: its page 1 and the new ones
    assert_eq!(dev.writes, 12);
    // One allocation near the end of the map changes one stream page; each area is known now.
    s.allocate_for_write(&uuid(1), 4999).unwrap();
    s.commit(&mut dev).unwrap();
    assert_eq!(dev.writes, 14);
    s.commit(&mut dev).unwrap();
    assert_eq!(dev.writes, 16);
    reload(&mut dev.inner, &s);
}

#[test]
fn a_damaged_newest_area_falls_back_and_a_damaged_label_is_reported() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "a", MIB, true).unwrap();
    s.commit(&mut dev).unwrap(); // generation 2 in area 1 (pages 9..)
    let mut torn = dev.clone();
    torn.image_mut()[10 * PAGE_SIZE + 5] ^= 1;
    let old = Store::load(&mut torn).unwrap();
    assert_eq!((old.generation(), old.volumes().len()), (1, 0));
    let mut bad = dev.clone();
    bad.image_mut()[20] ^= 1;
    assert!(matches!(Store::load(&mut bad), Err(LvolError::Corrupt(e)) if e.contains("label checksum")));
    // Both areas damaged: a corruption error naming both.
    let mut both = dev.clone();
    both.image_mut()[PAGE_SIZE + 30] ^= 1;
    both.image_mut()[9 * PAGE_SIZE + 30] ^= 1;
    let e = Store::load(&mut both).unwrap_err().to_string();
    assert!(e.contains("area 0") && e.contains("area 1"), "{e}");
    // A device cut short of its areas or its clusters.
    let mut short = MemDevice::from_image(dev.image()[..12 * PAGE_SIZE].to_vec());
    assert!(matches!(Store::load(&mut short), Err(LvolError::Corrupt(_))));
    let mut short = MemDevice::from_image(dev.image()[..(10 * MIB) as usize].to_vec());
    assert!(Store::load(&mut short).unwrap_err().to_string().contains("clusters on a device"));
}

#[test]
fn every_flipped_byte_of_the_metadata_is_an_error_or_an_older_generation() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "a", 3 * MIB, false).unwrap();
    s.snapshot(&uuid(1), uuid(2), "s").unwrap();
    s.commit(&mut dev).unwrap();
    s.allocate_for_write(&uuid(1), 0).unwrap();
    s.commit(&mut dev).unwrap();
    // Every byte of the label, of both super blocks' headers and of the stream pages' starts,
    // and a stride through the rest of those pages.
    let places = [0usize, 1, 2, 9, 10]
        .into_iter()
        .flat_map(|p| (0..PAGE_SIZE).filter(|b| *b < 192 || b % 127 == 0).map(move |b| p * PAGE_SIZE + b));
    for at in places {
        for bit in [0x01u8, 0x80] {
            let mut d = dev.clone();
            d.image_mut()[at] ^= bit;
            match Store::load(&mut d) {
                Ok(l) => assert!(
                    summary(&l) == summary(&s) || l.generation() < s.generation(),
                    "byte {at} bit {bit:#x}: generation {} loaded as something else",
                    l.generation()
                ),
                Err(LvolError::Corrupt(_) | LvolError::NotAStore(_)) => {}
                Err(e) => panic!("byte {at}: unexpected {e:?}"),
            }
        }
    }
}

/// Writes `volumes` as generation 2 of a store on a fresh device, sealed as a commit would,
/// and loads it: the store's cross-checks on records no operation would produce.
fn load_records(volumes: &[Volume], area_pages: u32) -> Result<Store, LvolError> {
    let mut dev = MemDevice::new(8192);
    let s = Store::create(&mut dev, &StoreOptions { area_pages: Some(area_pages), ..opts() }).unwrap();
    let stream = fp_lvol::format::encode_stream(volumes);
    let pages = fp_lvol::format::stream_pages(&stream);
    let owned = volumes.iter().flat_map(|v| &v.map).filter(|&&c| c != UNALLOCATED).count() as u64;
    let sb = fp_lvol::format::SuperBlock {
        generation: 2,
        uuid: s.uuid(),
        cluster_size: MIB,
        block_size: 512,
        area_pages,
        total_clusters: s.total_clusters(),
        free_clusters: s.total_clusters().saturating_sub(owned),
        stream_len: stream.len() as u64,
        name: "lvs0".into(),
        page_crcs: pages.iter().map(|p| fp_lvol::crc::crc32c(&p[..])).collect(),
    };
    let start = 1 + area_pages as u64;
    dev.write_page(start, &sb.encode()).unwrap();
    for (i, p) in pages.iter().enumerate() {
        dev.write_page(start + 1 + i as u64, p).unwrap();
    }
    Store::load(&mut dev)
}

fn record(n: u32, parent: Option<u32>, snapshot: bool, map: Vec<u32>) -> Volume {
    let id = |n: u32| {
        let mut u = [0x11u8; 16];
        u[..4].copy_from_slice(&n.to_le_bytes());
        Uuid(u)
    };
    Volume {
        uuid: id(n),
        name: format!("v{n}"),
        parent: parent.map(id),
        thin: true,
        read_only: snapshot,
        snapshot,
        map,
        external: None,
    }
}

#[test]
fn load_checks_what_spans_records() {
    let corrupt = |vols: &[Volume]| match load_records(vols, 8) {
        Err(LvolError::Corrupt(e)) => e,
        other => panic!("{other:?}"),
    };
    let ok = [record(1, None, true, vec![0]), record(2, Some(1), false, vec![UNALLOCATED])];
    assert_eq!(load_records(&ok, 8).unwrap().volumes(), &ok);
    assert!(corrupt(&[record(1, Some(9), false, vec![])]).contains("is not in the store"));
    assert!(corrupt(&[record(1, None, false, vec![]), record(2, Some(1), false, vec![])])
        .contains("not a snapshot"));
    let cycle = [
        record(1, Some(3), true, vec![]),
        record(2, Some(1), true, vec![]),
        record(3, Some(2), true, vec![]),
    ];
    assert!(corrupt(&cycle).contains("cycle"));
    assert!(
        corrupt(&[record(1, None, false, vec![5]), record(2, None, false, vec![5])]).contains("owned twice")
    );
    assert!(corrupt(&[record(1, None, false, vec![5000])]).contains("past the store"));
    let mut twin = record(2, None, false, vec![]);
    twin.name = "v1".into();
    assert!(corrupt(&[record(1, None, false, vec![]), twin]).contains("repeated name"));
    let mut thick = record(1, None, false, vec![UNALLOCATED]);
    thick.thin = false;
    assert!(corrupt(&[thick]).contains("thick"));
    let mut rw_snap = record(1, None, true, vec![]);
    rw_snap.read_only = false;
    assert!(corrupt(&[rw_snap]).contains("not read-only"));
}

/// A hostile area full of records in one long parent chain loads (or is refused) in linear
/// time: 60,000 snapshots, each the parent of the next.
#[test]
fn a_long_parent_chain_loads_quickly() {
    let n = 60_000;
    let vols: Vec<Volume> = (0..n).map(|i| record(i, i.checked_sub(1), true, vec![])).collect();
    let t = std::time::Instant::now();
    let s = load_records(&vols, fp_lvol::format::MAX_AREA_PAGES).unwrap();
    assert_eq!(s.volumes().len(), n as usize);
    assert!(t.elapsed() < std::time::Duration::from_secs(20), "{:?}", t.elapsed());
}

/// What each of the volume's clusters reads now (its own cluster, an ancestor's, or zeroes).
fn reads(s: &Store, u: Uuid) -> Vec<Option<u32>> {
    (0..s.volume(&u).unwrap().size_clusters()).map(|j| s.cluster_for_read(&u, j).unwrap()).collect()
}

/// The new clusters' contents, applied to what the volume read before: what it must read after.
fn after_fill(before: &[Option<u32>], new: &[fp_lvol::NewCluster]) -> Vec<Option<u32>> {
    let mut want = before.to_vec();
    for &(j, c, from) in new {
        let read = before[j as usize].map_or(ReadSource::Zeroes, ReadSource::Cluster);
        assert_eq!(from, read, "cluster {j} is filled from what it read");
        want[j as usize] = Some(c);
    }
    want
}

#[test]
fn inflate_gives_a_volume_all_its_clusters_and_drops_its_parent() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "vol", 3 * MIB, false).unwrap();
    s.snapshot(&uuid(1), uuid(2), "snap").unwrap();
    s.allocate_for_write(&uuid(1), 1).unwrap(); // cluster 3, a copy of 1
    s.resize_volume(&uuid(1), 4 * MIB).unwrap(); // index 3: past the snapshot, zeroes
    let before = reads(&s, uuid(1));
    assert_eq!(before, vec![Some(0), Some(3), Some(2), None]);
    let new = s.inflate(&uuid(1)).unwrap();
    assert_eq!(
        new,
        vec![(0, 4, ReadSource::Cluster(0)), (2, 5, ReadSource::Cluster(2)), (3, 6, ReadSource::Zeroes)]
    );
    assert_eq!(reads(&s, uuid(1)), after_fill(&before, &new));
    let v = s.volume(&uuid(1)).unwrap();
    assert!(v.parent.is_none() && !v.thin && v.map == vec![4, 3, 5, 6]);
    assert_eq!(s.free_clusters(), 12);
    s.check_consistency().unwrap();
    // The snapshot lost its only clone: it can go now.
    s.check_delete(&uuid(2)).unwrap();
    s.commit(&mut dev).unwrap();
    reload(&mut dev, &s);
    // A thin volume without a parent becomes thick, zero-filled; a thick one has nothing to do.
    s.create_volume(uuid(3), "thin", 2 * MIB, true).unwrap();
    s.allocate_for_write(&uuid(3), 1).unwrap();
    assert_eq!(s.inflate(&uuid(3)).unwrap(), vec![(0, 8, ReadSource::Zeroes)]);
    assert!(!s.volume(&uuid(3)).unwrap().thin);
    assert_eq!(s.inflate(&uuid(3)).unwrap(), vec![]);
    s.commit(&mut dev).unwrap();
    reload(&mut dev, &s);
}

#[test]
fn inflate_refusals_change_nothing() {
    let (_dev, mut s) = new_store();
    s.create_volume(uuid(1), "vol", 12 * MIB, false).unwrap();
    s.snapshot(&uuid(1), uuid(2), "snap").unwrap();
    s.allocate_for_write(&uuid(1), 0).unwrap();
    let before = summary(&s);
    assert_eq!(field(s.inflate(&uuid(2)).unwrap_err()), "lvol");
    assert_eq!(field(s.inflate(&uuid(9)).unwrap_err()), "lvol");
    // 11 clusters wanted, 6 left.
    assert!(matches!(s.inflate(&uuid(1)), Err(LvolError::NoSpace { needed: 11, free: 6 })));
    assert_eq!(summary(&s), before);
    s.check_consistency().unwrap();
}

#[test]
fn decouple_copies_only_the_parents_own_clusters() {
    let (mut dev, mut s) = new_store();
    // vol -> snap2 -> snap1: snap1 holds 0 and 1, snap2 holds a copy of index 1.
    s.create_volume(uuid(1), "vol", 2 * MIB, false).unwrap();
    s.snapshot(&uuid(1), uuid(2), "snap1").unwrap();
    s.allocate_for_write(&uuid(1), 1).unwrap(); // 2
    s.snapshot(&uuid(1), uuid(3), "snap2").unwrap();
    assert_eq!(s.volume(&uuid(3)).unwrap().map, vec![UNALLOCATED, 2]);
    let before = reads(&s, uuid(1));
    let new = s.decouple_parent(&uuid(1)).unwrap();
    // Index 0 reads snap1's cluster through either chain; index 1 was snap2's own.
    assert_eq!(new, vec![(1, 3, ReadSource::Cluster(2))]);
    assert_eq!(reads(&s, uuid(1)), after_fill(&before, &new));
    let v = s.volume(&uuid(1)).unwrap();
    assert!(v.parent == Some(uuid(2)) && v.thin && v.map == vec![UNALLOCATED, 3]);
    s.check_consistency().unwrap();
    s.check_delete(&uuid(3)).unwrap();
    // Again: snap1 has no parent, so everything it holds is copied and vol stands alone, thin.
    let before = reads(&s, uuid(1));
    let new = s.decouple_parent(&uuid(1)).unwrap();
    assert_eq!(new, vec![(0, 4, ReadSource::Cluster(0))]);
    assert_eq!(reads(&s, uuid(1)), after_fill(&before, &new));
    assert!(s.volume(&uuid(1)).unwrap().parent.is_none() && s.volume(&uuid(1)).unwrap().thin);
    // Without a parent: refused, naming the volume.
    let e = s.decouple_parent(&uuid(1)).unwrap_err();
    assert!(e.to_string().contains("has no parent"), "{e}");
    assert_eq!(field(e), "lvol");
    // A snapshot can be decoupled too: snap2 stops depending on snap1.
    let before = reads(&s, uuid(3));
    let new = s.decouple_parent(&uuid(3)).unwrap();
    assert_eq!(new, vec![(0, 5, ReadSource::Cluster(0))]);
    assert_eq!(reads(&s, uuid(3)), after_fill(&before, &new));
    s.check_delete(&uuid(2)).unwrap();
    s.commit(&mut dev).unwrap();
    reload(&mut dev, &s);
}

/// Past the end of a parent shorter than the grandparent, the volume read zeroes; the
/// grandparent's data must not show through after the decouple.
#[test]
fn decouple_keeps_zeroes_past_a_shorter_parent() {
    let (mut dev, mut s) = new_store();
    s.create_volume(uuid(1), "vol", 2 * MIB, false).unwrap();
    s.snapshot(&uuid(1), uuid(2), "long").unwrap();
    s.resize_volume(&uuid(1), MIB).unwrap();
    s.snapshot(&uuid(1), uuid(3), "short").unwrap();
    s.resize_volume(&uuid(1), 2 * MIB).unwrap();
    let before = reads(&s, uuid(1));
    assert_eq!(before, vec![Some(0), None]);
    let new = s.decouple_parent(&uuid(1)).unwrap();
    assert_eq!(new, vec![(1, 2, ReadSource::Zeroes)]);
    assert_eq!(reads(&s, uuid(1)), after_fill(&before, &new));
    assert_eq!(s.volume(&uuid(1)).unwrap().parent, Some(uuid(2)));
    s.commit(&mut dev).unwrap();
    reload(&mut dev, &s);
}

#[test]
fn decouple_refused_without_room_changes_nothing() {
    let (_dev, mut s) = new_store();
    s.create_volume(uuid(1), "vol", 10 * MIB, false).unwrap();
    s.snapshot(&uuid(1), uuid(2), "snap").unwrap();
    s.create_volume(uuid(3), "filler", 5 * MIB, false).unwrap();
    let before = summary(&s);
    assert!(matches!(s.decouple_parent(&uuid(1)), Err(LvolError::NoSpace { needed: 10, free: 4 })));
    assert_eq!(field(s.decouple_parent(&uuid(9)).unwrap_err()), "lvol");
    assert_eq!(summary(&s), before);
}

#[test]
fn check_delete_says_what_delete_would() {
    let (_dev, mut s) = new_store();
    s.create_volume(uuid(1), "vol", MIB, true).unwrap();
    s.snapshot(&uuid(1), uuid(2), "snap").unwrap();
    let before = summary(&s);
    let e = s.check_delete(&uuid(2)).unwrap_err();
    assert!(e.to_string().contains("has clones"), "{e}");
    assert_eq!(field(s.check_delete(&uuid(9)).unwrap_err()), "lvol");
    s.check_delete(&uuid(1)).unwrap();
    assert_eq!(summary(&s), before);
}

#[test]
fn grow_takes_the_clusters_a_grown_base_holds() {
    let (dev, mut s) = new_store();
    let old_image = dev.image().to_vec();
    // The base grows from 20 to 30 MiB.
    let mut image = old_image.clone();
    image.resize((30 * MIB) as usize, 0);
    let mut dev = MemDevice::from_image(image);
    assert_eq!(s.clusters_for_device(20 * MIB), 19);
    assert_eq!(s.clusters_for_device(30 * MIB + 4095), 29);
    // Shrinking or more clusters than a map can name: refused, nothing changed.
    let before = summary(&s);
    assert_eq!(field(s.grow(18).unwrap_err()), "base_bdev");
    assert_eq!(field(s.grow(u32::MAX as u64 + 1).unwrap_err()), "base_bdev");
    assert!(!s.grow(19).unwrap());
    assert_eq!(summary(&s), before);
    assert!(s.grow(29).unwrap());
    assert_eq!((s.total_clusters(), s.free_clusters()), (29, 29));
    s.create_volume(uuid(1), "big", 25 * MIB, false).unwrap();
    assert_eq!(s.volume(&uuid(1)).unwrap().map[24], 24);
    s.check_consistency().unwrap();
    s.commit(&mut dev).unwrap();
    reload(&mut dev, &s);
    // The grown store does not fit the old base any more.
    let mut old = MemDevice::from_image(old_image);
    old.image_mut().copy_from_slice(&dev.image()[..(20 * MIB) as usize]);
    assert!(Store::load(&mut old).unwrap_err().to_string().contains("clusters on a device"));
}

#[test]
fn destroy_leaves_no_store_at_any_crash_point() {
    use fp_lvol::sim::RecordingDevice;
    let mut dev = RecordingDevice::new(20 * MIB / PAGE_SIZE as u64);
    let mut s = Store::create(&mut dev, &opts()).unwrap();
    s.create_volume(uuid(1), "a", 2 * MIB, false).unwrap();
    s.commit(&mut dev).unwrap();
    let start = dev.log().len();
    s.destroy(&mut dev).unwrap();
    let end = dev.log().len();
    assert_eq!(end - start, 5, "3 writes and 2 flushes");
    // Any crash inside it: the whole store (the label's flush not done) or no store at all.
    for completed in start..=end {
        let durable = dev.durable_prefix(completed);
        for landed in [vec![], (durable..completed).collect::<Vec<_>>()] {
            match Store::load(&mut dev.crash_image(durable, &landed)) {
                Ok(l) => {
                    assert!(durable <= start, "crash after {completed}: loaded after the label's flush");
                    assert_eq!(l.volumes().len(), 1);
                }
                Err(LvolError::NotAStore(_)) => assert!(!landed.is_empty() || durable > start),
                Err(e) => panic!("crash after {completed}: {e}"),
            }
        }
    }
    // A new store can be created over it.
    let mut image = dev.crash_image(end, &[]);
    Store::create(&mut image, &opts()).unwrap();
    assert!(Store::load(&mut image).unwrap().volumes().is_empty());
}

/// The fuzz seed of a store with an external parent (written by fuzz/gen_seeds.py from
/// docs/lvol-format.md's tables, independently of this crate's encoder) loads, and reads resolve
/// through the external parent where no map has a cluster.
#[test]
fn the_esnap_fuzz_seed_loads_as_documented() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/regressions/lvol_metadata/seed-esnap");
    let seed = std::fs::read(path).unwrap();
    let mut dev = MemDevice::from_image(seed[1..].to_vec());
    let s = Store::load(&mut dev).unwrap();
    let snap = s.volume_by_name("snap").unwrap();
    let ext = snap.external.as_ref().unwrap();
    assert_eq!((ext.name.as_str(), ext.clusters), ("golden", 2));
    let clone = s.volume_by_name("clone").unwrap().uuid;
    assert_eq!(s.chain_external(&clone), Some(ext));
    assert_eq!(s.read_source(&clone, 0).unwrap(), ReadSource::Cluster(0));
    assert_eq!(s.read_source(&clone, 1).unwrap(), ReadSource::Cluster(3));
    assert_eq!(s.read_source(&snap.uuid, 1).unwrap(), ReadSource::External);
}
