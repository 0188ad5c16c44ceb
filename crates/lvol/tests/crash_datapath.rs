//! The crash simulator over the data path (issue 11, "Crash consistency"): the lvol bdev module
//! runs on a [`RecordingBdev`], which records every write and flush of the metadata owner and of
//! the volumes' channels in one order.
//!
//! A random workload runs through volume channels: writes to unallocated and allocated clusters
//! (some across a cluster boundary), snapshots of volumes being written, clones of snapshots and
//! writes to them, flushes, and discards of whole clusters. The test keeps, for each volume, the
//! history of what was written to it (a snapshot or a clone starts with a copy of its origin's
//! history). Every sector written carries a stamp (write id, sector number), so what a sector
//! reads back names the write it came from. A write is durable once a flush on its channel
//! completed after it did.
//!
//! Then, for hundreds of crash points (each a random cut of the recorded events, with a random
//! subset of the writes after the last completed flush landed, some torn), the image is loaded:
//! `Store::load` must give a store whose maps are consistent, and `LvStore::load` over a fresh
//! device with the image must bring back every volume that was fully created, where each sector
//! reads its last durable write, or a write after it that could have landed (never another
//! write's data, a misplaced sector or, once a durable write is there, zeroes). Sectors a
//! discard covered are unspecified until the next durable write. Neither load may panic; before
//! the store's creation completed, a clear error or "no store" is fine.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::recording_bdev::{RecordingBdev, SECTOR};
use fp_bdev::conformance::{self, cmd, rw};
use fp_bdev::{Bdev, BlockDevice, IoChannel, IoOp, IoStatus};
use fp_lvol::bdev::{LvStore, LvolDevice};
use fp_lvol::{LvolError, MemDevice, Store, StoreOptions, Uuid, UNALLOCATED};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const CLUSTER: u64 = 64 << 10;
const BLOCK: u32 = 512;
const BASE_BYTES: u64 = 8 << 20;
const SECTOR_U64: u64 = SECTOR as u64;

/// A write of the workload. Volumes' histories refer to it by index, so a flush that makes it
/// durable does so for every volume whose data includes it (a snapshot taken after it).
struct Write {
    /// Every sector it wrote carries this id; 0 for a write-zeroes.
    id: u64,
    /// Base events recorded before it was submitted: a crash cut at or before this cannot hold it.
    submitted: usize,
    /// The base position once a flush after it had completed on its channel.
    durable_at: Option<usize>,
}

#[derive(Clone, Copy)]
enum Change {
    Write {
        write: usize,
        offset: u64,
        len: u64,
    },
    /// A discard of a whole cluster: what its sectors read is unspecified from here on.
    Discard {
        offset: u64,
        len: u64,
        submitted: usize,
    },
}

impl Change {
    fn range(&self) -> (u64, u64) {
        match *self {
            Change::Write { offset, len, .. } | Change::Discard { offset, len, .. } => (offset, len),
        }
    }
}

struct Vol {
    name: String,
    dev: Arc<LvolDevice>,
    ch: Box<dyn IoChannel>,
    snapshot: bool,
    history: Vec<Change>,
    /// Writes completed on this channel since its last flush.
    unflushed: Vec<usize>,
    /// The base position when its creation returned: a crash after it must find the volume.
    ready: usize,
}

impl Vol {
    fn size(&self) -> u64 {
        self.dev.info().size_bytes()
    }
}

/// The sector's stamp: write id, the volume sector it was written to, and a check word.
fn stamp(buf: &mut [u8], id: u64, sector: u64) {
    buf[..8].copy_from_slice(&id.to_le_bytes());
    buf[8..16].copy_from_slice(&sector.to_le_bytes());
    buf[16..SECTOR - 8].fill(id as u8 ^ sector as u8);
    buf[SECTOR - 8..].copy_from_slice(&(id ^ sector.rotate_left(32)).to_le_bytes());
}

/// What a sector read back: `None` for zeroes, else the id of the write whose stamp it holds.
fn decode(buf: &[u8], sector: u64) -> Result<Option<u64>, String> {
    if buf == [0u8; SECTOR] {
        return Ok(None);
    }
    let id = u64::from_le_bytes(buf[..8].try_into().unwrap());
    let mut want = [0u8; SECTOR];
    stamp(&mut want, id, sector);
    if buf != want {
        let at = u64::from_le_bytes(buf[8..16].try_into().unwrap());
        return Err(format!("not the stamp of a write to this sector (id {id}, stamped for sector {at})"));
    }
    Ok(Some(id))
}

struct Workload {
    rng: SmallRng,
    base: Arc<RecordingBdev>,
    lvs: Arc<LvStore>,
    vols: Vec<Vol>,
    writes: Vec<Write>,
    /// Base position when the store's creation returned.
    store_ready: usize,
    names: u32,
    /// Writes that failed (the store full): they may have landed in part, never durably.
    failed: usize,
    /// The inflates, decouples and grows that were done.
    done: Vec<&'static str>,
}

impl Workload {
    fn new(seed: u64) -> Workload {
        let mut rng = SmallRng::seed_from_u64(seed);
        // The store is created on 6 MiB; the base grows to BASE_BYTES during the workload.
        let base = RecordingBdev::new("base", BLOCK, (6 << 20) / BLOCK as u64);
        let mut uuid = [0u8; 16];
        rng.fill(&mut uuid);
        uuid[0] |= 1;
        let opts = StoreOptions {
            name: "lvs".into(),
            uuid: Uuid(uuid),
            cluster_size: CLUSTER,
            block_size: BLOCK,
            area_pages: None,
        };
        let lvs = LvStore::create(base.clone() as Bdev, "base", &opts).unwrap();
        let store_ready = base.position();
        let mut w = Workload {
            rng,
            base,
            lvs,
            vols: Vec::new(),
            writes: Vec::new(),
            store_ready,
            names: 0,
            failed: 0,
            done: Vec::new(),
        };
        for (name, clusters, thin) in [("thin", 16, true), ("thick", 8, false)] {
            let dev = w.lvs.create_volume(name, clusters * CLUSTER, thin).unwrap();
            w.add(name.to_string(), dev, false, Vec::new());
        }
        w
    }

    fn add(&mut self, name: String, dev: Arc<LvolDevice>, snapshot: bool, history: Vec<Change>) {
        let ch = dev.open_channel().unwrap();
        let ready = self.base.position();
        self.vols.push(Vol { name, dev, ch, snapshot, history, unflushed: Vec::new(), ready });
    }

    fn pick(&mut self, snapshot: bool) -> Option<usize> {
        let of: Vec<usize> = (0..self.vols.len()).filter(|&i| self.vols[i].snapshot == snapshot).collect();
        of.choose(&mut self.rng).copied()
    }

    fn step(&mut self) {
        match self.rng.gen_range(0..100) {
            0..=59 => self.write(),
            60..=77 => {
                let v = self.pick(false).unwrap();
                self.flush(v);
            }
            78..=81 if self.vols.len() < 9 => {
                let v = self.pick(false).unwrap();
                self.names += 1;
                let name = format!("snap{}", self.names);
                let dev = self.lvs.snapshot(&self.vols[v].dev.uuid(), &name).unwrap();
                let history = self.vols[v].history.clone();
                self.add(name, dev, true, history);
            }
            82..=85 if self.vols.len() < 9 => {
                if let Some(s) = self.pick(true) {
                    self.names += 1;
                    let name = format!("clone{}", self.names);
                    let dev = self.lvs.clone_snapshot(&self.vols[s].dev.uuid(), &name).unwrap();
                    let history = self.vols[s].history.clone();
                    self.add(name, dev, false, history);
                }
            }
            86..=91 => self.write_zeroes(),
            // Neither changes what any volume reads; refusals (no parent, no room) are fine.
            92..=93 => {
                let v = self.pick(false).unwrap();
                self.note("inflate", self.lvs.inflate(&self.vols[v].dev.uuid()));
            }
            94..=95 => {
                let v = self.rng.gen_range(0..self.vols.len());
                self.note("decouple", self.lvs.decouple_parent(&self.vols[v].dev.uuid()));
            }
            96 if !self.done.contains(&"grow") => {
                self.base.resize(BASE_BYTES / BLOCK as u64).unwrap();
                assert!(self.lvs.grow().unwrap(), "the store did not grow with its base");
                self.done.push("grow");
            }
            _ => self.discard(),
        }
    }

    fn note(&mut self, what: &'static str, r: Result<(), LvolError>) {
        match r {
            Ok(()) => self.done.push(what),
            Err(LvolError::NoSpace { .. } | LvolError::State { .. }) => {}
            Err(e) => panic!("{what}: {e}"),
        }
    }

    /// 1 to 16 sectors anywhere in a writable volume, so some cross a cluster boundary; one in
    /// ten a whole cluster.
    fn write(&mut self) {
        let v = self.pick(false).unwrap();
        let size = self.vols[v].size();
        let (first, sectors) = if self.rng.gen_bool(0.1) {
            let per_cluster = CLUSTER / SECTOR_U64;
            (self.rng.gen_range(0..size / CLUSTER) * per_cluster, per_cluster)
        } else {
            let sectors = self.rng.gen_range(1..=16u64);
            (self.rng.gen_range(0..size / SECTOR_U64 - sectors + 1), sectors)
        };
        let id = self.writes.len() as u64 + 1;
        let mut data = vec![0u8; (sectors * SECTOR_U64) as usize];
        for (i, s) in data.chunks_mut(SECTOR).enumerate() {
            stamp(s, id, first + i as u64);
        }
        let iov = [libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() }];
        let submitted = self.base.position();
        // SAFETY: `data` and `iov` outlive the call, which waits for the completion.
        let status =
            unsafe { conformance::run(&mut *self.vols[v].ch, rw(0, IoOp::Write, first * SECTOR_U64, &iov)) };
        let write = self.writes.len();
        self.writes.push(Write { id, submitted, durable_at: None });
        let vol = &mut self.vols[v];
        vol.history.push(Change::Write { write, offset: first * SECTOR_U64, len: data.len() as u64 });
        // A failed write (the store full) may have landed in part; it never becomes durable.
        if status == IoStatus::Success {
            vol.unflushed.push(write);
        } else {
            self.failed += 1;
        }
    }

    /// A whole cluster (which a thin volume may free) or a few sectors.
    fn write_zeroes(&mut self) {
        let v = self.pick(false).unwrap();
        let size = self.vols[v].size();
        let (offset, len) = if self.rng.gen_bool(0.5) {
            (self.rng.gen_range(0..size / CLUSTER) * CLUSTER, CLUSTER)
        } else {
            let sectors = self.rng.gen_range(1..=16u64);
            (self.rng.gen_range(0..size / SECTOR_U64 - sectors + 1) * SECTOR_U64, sectors * SECTOR_U64)
        };
        let submitted = self.base.position();
        // SAFETY: write-zeroes has no buffers.
        let status = conformance::run(&mut *self.vols[v].ch, cmd(0, IoOp::WriteZeroes, offset, len));
        let write = self.writes.len();
        self.writes.push(Write { id: 0, submitted, durable_at: None });
        let vol = &mut self.vols[v];
        vol.history.push(Change::Write { write, offset, len });
        if status == IoStatus::Success {
            vol.unflushed.push(write);
        } else {
            self.failed += 1;
        }
    }

    fn flush(&mut self, v: usize) {
        let status = conformance::run(&mut *self.vols[v].ch, cmd(0, IoOp::Flush, 0, 0));
        assert_eq!(status, IoStatus::Success);
        let at = self.base.position();
        for w in std::mem::take(&mut self.vols[v].unflushed) {
            self.writes[w].durable_at.get_or_insert(at);
        }
    }

    fn discard(&mut self) {
        let v = self.pick(false).unwrap();
        let clusters = self.vols[v].size() / CLUSTER;
        let offset = self.rng.gen_range(0..clusters) * CLUSTER;
        let submitted = self.base.position();
        // SAFETY: a discard has no buffers.
        let status = conformance::run(&mut *self.vols[v].ch, cmd(0, IoOp::Discard, offset, CLUSTER));
        assert_eq!(status, IoStatus::Success, "discard of a whole cluster");
        self.vols[v].history.push(Change::Discard { offset, len: CLUSTER, submitted });
    }
}

/// For each sector of a volume, the indexes of the changes in its history that cover it.
fn covering(vol: &Vol) -> Vec<Vec<u32>> {
    let mut cover = vec![Vec::new(); (vol.size() / SECTOR_U64) as usize];
    for (i, c) in vol.history.iter().enumerate() {
        let (offset, len) = c.range();
        for s in offset / SECTOR_U64..(offset + len) / SECTOR_U64 {
            cover[s as usize].push(i as u32);
        }
    }
    cover
}

/// What sector may hold after a crash at `cut`: `None` when unspecified (a discard since the
/// last durable write), else whether zeroes may be read and the ids that may.
fn allowed(vol: &Vol, writes: &[Write], cover: &[u32], cut: usize) -> Option<(bool, Vec<u64>)> {
    let (mut zero, mut ids, mut discarded) = (true, Vec::new(), false);
    for &i in cover {
        match vol.history[i as usize] {
            Change::Write { write, .. } => {
                let w = &writes[write];
                if w.submitted >= cut {
                    continue;
                }
                if w.durable_at.is_some_and(|d| d <= cut) {
                    (zero, discarded) = (false, false);
                    ids.clear();
                }
                match w.id {
                    0 => zero = true,
                    id => ids.push(id),
                }
            }
            Change::Discard { submitted, .. } => discarded |= submitted < cut,
        }
    }
    (!discarded).then_some((zero, ids))
}

/// Independent checks of a loaded store's maps: each cluster owned once, the free count.
fn check_store(image: &[u8], what: &str) -> Result<(), LvolError> {
    let store = Store::load(&mut MemDevice::from_image(image.to_vec()))?;
    store.check_consistency().unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut owner = vec![false; store.total_clusters() as usize];
    for c in store.volumes().iter().flat_map(|v| v.map.iter()).filter(|&&c| c != UNALLOCATED) {
        assert!(!std::mem::replace(&mut owner[*c as usize], true), "{what}: cluster {c} owned twice");
    }
    let owned = owner.iter().filter(|&&o| o).count() as u64;
    assert_eq!(store.free_clusters(), store.total_clusters() - owned, "{what}: free count");
    Ok(())
}

/// Loads the image through the module and checks every volume's sectors; returns how many
/// sectors with a durable write were checked.
fn check_volumes(w: &Workload, covers: &[Vec<Vec<u32>>], image: Vec<u8>, cut: usize, what: &str) -> usize {
    let base = RecordingBdev::from_image("base", BLOCK, image);
    let lvs = match LvStore::load(base as Bdev, "base") {
        Ok(Some(lvs)) => lvs,
        Ok(None) | Err(LvolError::NotAStore(_) | LvolError::Corrupt(_)) if cut < w.store_ready => return 0,
        Ok(None) => panic!("{what}: no store"),
        Err(e) => panic!("{what}: {e}"),
    };
    let infos = lvs.volumes().unwrap();
    let mut durable = 0;
    for (vol, cover) in w.vols.iter().zip(covers) {
        let Some(info) = infos.iter().find(|i| i.name == vol.name) else {
            assert!(cut < vol.ready, "{what}: volume '{}' lost", vol.name);
            continue;
        };
        let dev = lvs.device(&info.uuid).unwrap();
        assert_eq!(dev.info().size_bytes(), vol.size(), "{what}: size of '{}'", vol.name);
        let mut ch = dev.open_channel().unwrap();
        for chunk in 0..vol.size() / CLUSTER {
            let data = conformance::read_range(&mut *ch, chunk * CLUSTER, CLUSTER as usize);
            for (i, got) in data.chunks(SECTOR).enumerate() {
                let sector = chunk * (CLUSTER / SECTOR_U64) + i as u64;
                let Some((zero, ids)) = allowed(vol, &w.writes, &cover[sector as usize], cut) else {
                    continue;
                };
                durable += usize::from(!zero);
                let ok = match decode(got, sector) {
                    Ok(None) => zero,
                    Ok(Some(id)) => ids.contains(&id),
                    Err(e) => panic!("{what}: '{}' sector {sector}: {e}", vol.name),
                };
                assert!(
                    ok,
                    "{what}: '{}' sector {sector} holds {:?}; zeroes allowed: {zero}, writes allowed: {ids:?}",
                    vol.name,
                    decode(got, sector)
                );
            }
        }
    }
    lvs.close();
    durable
}

fn run(seed: u64, steps: usize, crash_points: usize) {
    let start = Instant::now();
    let mut w = Workload::new(seed);
    for _ in 0..steps {
        w.step();
    }
    let v = w.pick(false).unwrap();
    w.flush(v);
    let end = w.base.position();
    // The workload must reach what the test is about.
    let durable = w.writes.iter().filter(|x| x.durable_at.is_some()).count();
    let snapshots = w.vols.iter().filter(|v| v.snapshot).count();
    let clones = w.vols.len() - snapshots - 2;
    assert!(durable > steps / 5 && snapshots > 0 && clones > 0, "{durable} durable, {snapshots}, {clones}");
    for what in ["inflate", "decouple", "grow"] {
        assert!(w.done.contains(&what), "no {what} was done: {:?}", w.done);
    }
    let covers: Vec<_> = w.vols.iter().map(covering).collect();
    let workload_time = start.elapsed();

    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
    let mut checked = 0;
    for point in 0..crash_points {
        // A few cuts before the store is whole, a few at the very end, the rest anywhere.
        let cut = match point {
            0..=2 => rng.gen_range(0..w.store_ready),
            3..=5 => end,
            _ => rng.gen_range(w.store_ready..=end),
        };
        let what = format!("seed {seed}, crash after {cut} of {end} events");
        let image = w.base.crash_image_at(cut, &mut rng);
        match check_store(&image, &what) {
            Ok(()) => {}
            Err(e) => assert!(cut < w.store_ready, "{what}: Store::load: {e}"),
        }
        checked += check_volumes(&w, &covers, image, cut, &what);
    }
    assert!(checked > crash_points * 100, "only {checked} durable sectors checked");
    eprintln!(
        "seed {seed}: {steps} steps ({} writes, {durable} durable, {} failed, {} volumes, {end} events, {} inflates, \
         {} decouples) in {workload_time:?}, {crash_points} crash points ({checked} durable sectors checked) in {:?}",
        w.writes.len(),
        w.failed,
        w.vols.len(),
        w.done.iter().filter(|&&d| d == "inflate").count(),
        w.done.iter().filter(|&&d| d == "decouple").count(),
        start.elapsed() - workload_time
    );
    w.lvs.close();
}

#[test]
fn random_crash_points_seed_1() {
    run(1, 300, 200);
}

#[test]
fn random_crash_points_seed_2() {
    run(2, 300, 200);
}

#[test]
fn random_crash_points_seed_3() {
    run(3, 300, 200);
}
