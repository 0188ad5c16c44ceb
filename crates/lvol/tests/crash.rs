//! The crash simulator over the metadata path (issue 11, "Crash consistency").
//!
//! A random workload of volume operations and commits runs on a [`RecordingDevice`]. Then, for
//! hundreds of crash points, the image a crash could leave is built: every write before the
//! last flush that completed before the crash, plus a random subset of the writes after it,
//! landed in random order (now and then one of them torn: only some of its sectors written).
//! Each image is loaded, and the test checks that the load succeeds
//! once any commit was durable (and otherwise fails with a clear error, never a panic); that
//! the loaded store is exactly the state of one commit, no older than the last durable one and
//! no newer than the last one started; that no cluster is owned twice and the free count
//! matches the maps; and that the recovered store commits and loads again.
//!
//! The data path's part is modelled too, as the bdev module will do it: every newly allocated
//! cluster gets a tag (an allocation id) written into its first page, and a flush, before the
//! commit that maps it ("Data before metadata" in docs/lvol-format.md). After a crash, every
//! cluster the loaded store maps must hold the tag of the allocation that generation mapped.
//! That catches a cluster reused before the commit freeing it was durable.

use std::collections::{HashMap, HashSet};

use fp_lvol::sim::{Op, RecordingDevice};
use fp_lvol::{LvolError, MemDevice, MetaDevice, Store, StoreOptions, Uuid, Volume, PAGE_SIZE, UNALLOCATED};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const CLUSTER: u64 = 64 << 10;

type Summary = (String, u64, u64, Vec<Volume>);

fn summary(s: &Store) -> Summary {
    (s.name().to_string(), s.total_clusters(), s.free_clusters(), s.volumes().to_vec())
}

/// What each commit of the workload made durable.
struct Commit {
    generation: u64,
    /// Log length when it started (its first write, if any, is at this index).
    started: usize,
    /// Log length after its flush.
    flushed: usize,
    state: Summary,
    /// The allocation id each cluster mapped in this generation holds.
    tags: HashMap<u32, u64>,
}

const TAG_MAGIC: &[u8; 8] = b"DATATAG!";

fn owned(s: &Store) -> HashSet<u32> {
    s.volumes().iter().flat_map(|v| v.map.iter().copied()).filter(|&c| c != UNALLOCATED).collect()
}

fn tag_page(s: &Store, cluster: u32) -> u64 {
    s.cluster_offset(cluster) / PAGE_SIZE as u64
}

fn read_tag(image: &mut MemDevice, s: &Store, cluster: u32) -> Option<u64> {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    image.read_page(tag_page(s, cluster), &mut p).unwrap();
    (p[..8] == TAG_MAGIC[..]).then(|| u64::from_le_bytes(p[8..16].try_into().unwrap()))
}

fn new_uuid(rng: &mut SmallRng) -> Uuid {
    let mut u = [0u8; 16];
    rng.fill(&mut u);
    u[0] |= 1; // never nil
    Uuid(u)
}

/// One random operation; refusals (no space, a snapshot with clones, ...) are part of the mix
/// and must leave the store as it was, which the commits' recorded states then show. Returns
/// the name of an inflate, decouple or grow that changed the store, so the run can show it
/// reached them.
fn random_op(s: &mut Store, rng: &mut SmallRng, names: &mut u32, base_clusters: u64) -> Option<&'static str> {
    let vols: Vec<Volume> = s.volumes().to_vec();
    let pick = |rng: &mut SmallRng| vols.choose(rng).map(|v| (v.uuid, v.map.len() as u64));
    *names += 1;
    let name = format!("v{names}");
    let mut reached = None;
    let mut note = |what: &'static str, changed: bool| {
        if changed {
            reached = Some(what);
        }
    };
    let clones: Vec<&Volume> = vols.iter().filter(|v| v.parent.is_some()).collect();
    let _ = match rng.gen_range(0..128) {
        0..=14 => {
            let thin = rng.gen_bool(0.7);
            // Thin volumes larger than the store, or small enough to inflate.
            let clusters = match (thin, rng.gen_bool(0.5)) {
                (true, true) => rng.gen_range(1..700),
                _ => rng.gen_range(1..5),
            };
            s.create_volume(new_uuid(rng), &name, clusters * CLUSTER, thin)
        }
        15..=22 => match pick(rng) {
            Some((u, _)) => s.delete_volume(&u),
            None => Ok(()),
        },
        23..=30 => match pick(rng) {
            Some((u, _)) => s.resize_volume(&u, rng.gen_range(1..700) * CLUSTER),
            None => Ok(()),
        },
        31..=40 => match pick(rng) {
            Some((u, _)) => s.snapshot(&u, new_uuid(rng), &name),
            None => Ok(()),
        },
        41..=48 => match vols.iter().filter(|v| v.snapshot).collect::<Vec<_>>().choose(rng) {
            Some(v) => s.clone_snapshot(&v.uuid, new_uuid(rng), &name),
            None => Ok(()),
        },
        49..=88 => match pick(rng) {
            Some((u, len)) => s.allocate_for_write(&u, rng.gen_range(0..len)).map(|_| ()),
            None => Ok(()),
        },
        89..=95 => match pick(rng) {
            Some((u, len)) => s.release_cluster(&u, rng.gen_range(0..len)).map(|_| ()),
            None => Ok(()),
        },
        96..=97 => match pick(rng) {
            Some((u, _)) => s.rename_volume(&u, &name),
            None => Ok(()),
        },
        // The caller tags every newly mapped cluster, as it does for allocations on write.
        // Most clones are larger than the store: inflate the one needing the fewest clusters.
        100..=105 => match clones.iter().min_by_key(|v| v.map.len() as u64 - v.allocated_clusters()) {
            Some(v) => s.inflate(&v.uuid).map(|new| note("inflate", !new.is_empty())),
            None => Ok(()),
        },
        106..=110 => match clones.choose(rng) {
            Some(v) => s.decouple_parent(&v.uuid).map(|_| note("decouple", true)),
            None => Ok(()),
        },
        111..=114 => s.grow(base_clusters).map(|grew| note("grow", grew)),
        // A thin volume re-parented onto a snapshot of its size (most pairs are refused: the
        // refusals must change nothing either).
        115..=121 => {
            let snaps: Vec<&Volume> = vols.iter().filter(|v| v.snapshot).collect();
            match snaps.choose(rng) {
                Some(p) => {
                    let fits: Vec<&Volume> = vols
                        .iter()
                        .filter(|w| {
                            w.thin && !w.snapshot && w.map.len() == p.map.len() && w.parent != Some(p.uuid)
                        })
                        .collect();
                    let any: Vec<&Volume> = vols.iter().filter(|w| !w.snapshot).collect();
                    match if rng.gen_bool(0.8) { fits.choose(rng) } else { any.choose(rng) } {
                        Some(v) => s.set_parent(&v.uuid, &p.uuid).map(|()| note("set_parent", true)),
                        None => Ok(()),
                    }
                }
                None => Ok(()),
            }
        }
        // External snapshots: a clone of one, or a thin volume given one (the record grows by
        // the optional field), most by the same name so that snapshots move it around.
        122..=127 => {
            let external = fp_lvol::ExternalParent {
                name: if rng.gen_bool(0.8) { "golden".into() } else { format!("esnap{names}") },
                clusters: rng.gen_range(1..8),
            };
            // Volumes without a parent only, so that clones stay for inflate and decouple.
            let plain: Vec<&Volume> =
                vols.iter().filter(|v| v.thin && !v.snapshot && v.parent.is_none()).collect();
            match plain.choose(rng) {
                Some(v) if rng.gen_bool(0.7) => {
                    s.set_external_parent(&v.uuid, external).map(|()| note("set_external_parent", true))
                }
                _ => s.clone_external(new_uuid(rng), &name, external).map(|()| note("clone_external", true)),
            }
        }
        _ => match pick(rng) {
            Some((u, _)) => s.set_read_only(&u),
            None => s.rename_store(&name),
        },
    };
    reached
}

/// Independent checks of a loaded store: each cluster owned by one volume at most, in range,
/// and the free count is what the maps leave.
fn check_invariants(s: &Store) {
    let mut owner = vec![false; s.total_clusters() as usize];
    let mut owned = 0;
    for v in s.volumes() {
        for &c in v.map.iter().filter(|&&c| c != UNALLOCATED) {
            assert!(!std::mem::replace(&mut owner[c as usize], true), "cluster {c} owned twice");
            owned += 1;
        }
    }
    assert_eq!(s.free_clusters(), s.total_clusters() - owned, "free count does not match the maps");
    s.check_consistency().unwrap();
}

/// The first pages of a device: the store is created on part of the base, which then "grows"
/// to the whole device (the workload's grow operation).
struct Prefix<'a>(&'a mut RecordingDevice, u64);

impl MetaDevice for Prefix<'_> {
    fn size_pages(&self) -> u64 {
        self.1
    }
    fn read_page(&mut self, page: u64, buf: &mut fp_lvol::Page) -> Result<(), fp_lvol::DeviceError> {
        self.0.read_page(page, buf)
    }
    fn write_page(&mut self, page: u64, buf: &fp_lvol::Page) -> Result<(), fp_lvol::DeviceError> {
        self.0.write_page(page, buf)
    }
    fn flush(&mut self) -> Result<(), fp_lvol::DeviceError> {
        self.0.flush()
    }
}

fn run(seed: u64, commits: usize, crash_points: usize) {
    let mut rng = SmallRng::seed_from_u64(seed);
    // 4 MiB: 1 + 2 x 6 metadata pages, rounded up to 64 KiB, then 63 data clusters; the store
    // is created on the first 3 MiB (47 clusters) and may grow to all of it.
    let mut dev = RecordingDevice::new((4 << 20) / PAGE_SIZE as u64);
    let opts = StoreOptions {
        name: "lvs".into(),
        uuid: new_uuid(&mut rng),
        cluster_size: CLUSTER,
        block_size: 512,
        area_pages: Some(6),
    };
    let mut s = Store::create(&mut Prefix(&mut dev, (3 << 20) / PAGE_SIZE as u64), &opts).unwrap();
    let base_clusters = s.clusters_for_device(4 << 20);
    let mut history = vec![Commit {
        generation: 1,
        started: 0,
        flushed: dev.log().len(),
        state: summary(&s),
        tags: HashMap::new(),
    }];
    let mut names = 0;
    let mut reached: HashMap<&str, usize> = HashMap::new();
    let mut multi_page = 0;
    let mut allocations = 0u64;
    let mut tag_of: HashMap<u32, u64> = HashMap::new();
    for _ in 0..commits {
        for _ in 0..rng.gen_range(1..4) {
            let before = owned(&s);
            if let Some(what) = random_op(&mut s, &mut rng, &mut names, base_clusters) {
                *reached.entry(what).or_insert(0) += 1;
            }
            s.check_consistency().unwrap();
            // Each newly mapped cluster (allocated on write, or for a thick volume) gets its data.
            for c in owned(&s).difference(&before) {
                allocations += 1;
                tag_of.insert(*c, allocations);
                let mut p = Box::new([0u8; PAGE_SIZE]);
                p[..8].copy_from_slice(TAG_MAGIC);
                p[8..16].copy_from_slice(&allocations.to_le_bytes());
                dev.write_page(tag_page(&s, *c), &p).unwrap();
            }
        }
        // Data before metadata: the new clusters' contents are durable before the commit.
        dev.flush().unwrap();
        let started = dev.log().len();
        let generation = s.commit(&mut dev).unwrap();
        if dev.log().len() - started > 3 {
            multi_page += 1;
        }
        let tags = owned(&s).into_iter().map(|c| (c, tag_of[&c])).collect();
        history.push(Commit { generation, started, flushed: dev.log().len(), state: summary(&s), tags });
    }
    // The workload must reach what the test is about: multi-page commits, snapshots and clones.
    assert!(multi_page > commits / 10, "only {multi_page} commits wrote more than 2 stream pages");
    assert!(history.iter().any(|c| c.state.3.iter().any(|v| v.parent.is_some())), "no clone ever");
    for what in ["inflate", "decouple", "grow", "set_parent"] {
        assert!(reached.contains_key(what), "no {what} ever changed the store: {reached:?}");
    }
    assert!(
        history.iter().any(|c| c.state.3.iter().any(|v| v.external.is_some())),
        "no external parent ever committed: {reached:?}"
    );
    let by_gen: HashMap<u64, &Commit> = history.iter().map(|c| (c.generation, c)).collect();

    let log_len = dev.log().len();
    let mut loaded_older_than_started = 0;
    for point in 0..crash_points {
        // Crash after `completed` operations; the last few points crash at the very end.
        let completed = if point < 4 { log_len - point } else { rng.gen_range(0..=log_len) };
        let durable = dev.durable_prefix(completed);
        let mut landed: Vec<(usize, usize)> = (durable..completed)
            .filter(|&i| matches!(dev.log()[i], Op::Write { .. }) && rng.gen_bool(0.5))
            .map(|i| (i, PAGE_SIZE))
            .collect();
        landed.shuffle(&mut rng);
        // Now and then one of them lands torn, some of its 512-byte sectors only.
        if !landed.is_empty() && rng.gen_bool(0.3) {
            let k = rng.gen_range(0..landed.len());
            landed[k].1 = 512 * rng.gen_range(1..PAGE_SIZE / 512);
        }
        let mut image = dev.crash_image_torn(durable, &landed);
        let last_durable = history.iter().rev().find(|c| c.flushed <= durable);
        let newest_started = history.iter().rev().find(|c| c.started < completed);
        let what = format!("seed {seed}, crash after {completed} of {log_len} ops ({} landed)", landed.len());
        let mut store = match Store::load(&mut image) {
            Ok(store) => store,
            Err(e @ (LvolError::NotAStore(_) | LvolError::Corrupt(_))) => {
                assert!(last_durable.is_none(), "{what}: generation {} was durable, load failed: {e}", {
                    last_durable.unwrap().generation
                });
                continue;
            }
            Err(e) => panic!("{what}: unexpected error {e:?}"),
        };
        let g = store.generation();
        let commit = by_gen.get(&g).unwrap_or_else(|| panic!("{what}: loaded unknown generation {g}"));
        assert!(last_durable.is_none_or(|d| g >= d.generation), "{what}: lost durable generation");
        assert!(newest_started.is_some_and(|n| g <= n.generation), "{what}: generation {g} never started");
        assert_eq!(summary(&store), commit.state, "{what}: generation {g} loaded with other contents");
        check_invariants(&store);
        for c in owned(&store) {
            assert_eq!(read_tag(&mut image, &store, c), Some(commit.tags[&c]), "{what}: data of cluster {c}");
        }
        if newest_started.is_some_and(|n| g < n.generation) {
            loaded_older_than_started += 1;
        }
        // The recovered store goes on: a change commits over the torn area and loads back.
        let next = store.generation() + 1;
        let _ = store.create_volume(new_uuid(&mut rng), "after-crash", CLUSTER, true);
        assert_eq!(store.commit(&mut image).unwrap(), next, "{what}");
        let again = Store::load(&mut image).unwrap();
        assert_eq!(summary(&again), summary(&store), "{what}: the commit after recovery");
        check_invariants(&again);
    }
    // Many crash points fall inside a commit and must have gone back to the one before it.
    assert!(loaded_older_than_started > crash_points / 10, "only {loaded_older_than_started} fell back");
}

#[test]
fn random_crash_points_seed_1() {
    run(1, 80, 300);
}

#[test]
fn random_crash_points_seed_2() {
    run(2, 80, 300);
}

#[test]
fn random_crash_points_seed_3() {
    run(3, 120, 300);
}

/// The crash image rules themselves: durable writes stay, later ones only if chosen.
#[test]
fn crash_images_follow_the_model() {
    let mut dev = RecordingDevice::new(4);
    let page = |b: u8| Box::new([b; PAGE_SIZE]);
    dev.write_page(0, &page(1)).unwrap();
    dev.flush().unwrap();
    dev.write_page(1, &page(2)).unwrap();
    dev.write_page(1, &page(3)).unwrap();
    assert_eq!(dev.durable_prefix(1), 0);
    assert_eq!(dev.durable_prefix(4), 2);
    let img = dev.crash_image(2, &[]);
    assert_eq!((img.image()[0], img.image()[PAGE_SIZE]), (1, 0));
    // The two unflushed writes of page 1 land in either order.
    assert_eq!(dev.crash_image(2, &[3, 2]).image()[PAGE_SIZE], 2);
    assert_eq!(dev.crash_image(2, &[2, 3]).image()[PAGE_SIZE], 3);
    // A torn write: its first sector landed over the earlier write, the rest did not.
    let img = dev.crash_image_torn(2, &[(2, PAGE_SIZE), (3, 512)]);
    assert_eq!((img.image()[PAGE_SIZE], img.image()[PAGE_SIZE + 512]), (3, 2));
}
