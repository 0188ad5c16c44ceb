//! The kill -9 loop of issue 11: the daemon is killed with SIGKILL at random moments while a
//! verified writer runs on a thin logical volume and snapshots of it are taken; after each
//! restart the lvstore must load by itself and every write acknowledged before a completed
//! flush must read back.
//!
//! The daemon's configuration file creates only the base (a `uring` bdev over a file), so every
//! restart exercises the lvstore's examine-and-load; the store, the volume and the snapshots are
//! made over RPC. The writer is a libblkio client in this process: batches of 4 KiB writes whose
//! every block names its slot and a generation, then a flush, after which (and only after which)
//! the batch counts as durable in its model. A second thread takes snapshots every few tens of
//! milliseconds while space allows. Each run lasts 10-300 ms before the kill. The seed is printed
//! and can be replayed with `FP_LVOL_KILL_SEED`; `FP_LVOL_KILLS` changes the number of kills.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{rpc_call, BlkClient, ClientOpts, Daemon, Op, OpKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
/// Small clusters, so that the writer keeps allocating (thin) and copying (after snapshots).
const CLUSTER: u64 = MIB;
const VOLUME_MIB: u64 = 32;
const VOLUME_CLUSTERS: u64 = VOLUME_MIB * MIB / CLUSTER;
/// The base file: sparse, room for the volume and many snapshots' worth of copies.
const BASE_BYTES: u64 = 2 << 30;
/// The writer's unit: a slot holds one whole generation of its own at a time.
const SLOT: usize = 4096;
const SLOTS: usize = (VOLUME_MIB * MIB) as usize / SLOT;
const SLOTS_PER_CLUSTER: usize = CLUSTER as usize / SLOT;
/// Writes per batch (one flush after each batch), spread over the client's queues.
const BATCH: usize = 8;
const QUEUES: usize = 2;
/// All but one write in 16 go to a window of this many clusters that moves on every few
/// batches, so each snapshot pins a few clusters rather than the whole volume; the rest land
/// anywhere.
const HOT_CLUSTERS: usize = 3;
const BATCHES_PER_WINDOW_STEP: u64 = 24;
/// Snapshots stop when fewer free clusters than this remain (a snapshot can pin a volume's
/// worth) or when this many exist (each is a record in the metadata area).
const MIN_FREE_CLUSTERS: u64 = 2 * VOLUME_CLUSTERS;
const MAX_SNAPSHOTS: usize = 200;
const DEFAULT_KILLS: usize = 55;
const LVS: &str = "lvs0";
const VOL: &str = "vol";
const CTRLR: &str = "fp-lvkill";
/// A block's header: magic, slot, generation; the rest is `pattern(generation, offset)`.
const MAGIC: u64 = 0x4c56_4b49_4c4c_0001;
/// How long a restarted daemon gets to show its volume again.
const LOAD_TIMEOUT: Duration = Duration::from_secs(20);
/// Upper bound for one run's threads to finish after the kill (or to connect and verify).
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

fn alias() -> String {
    format!("{LVS}/{VOL}")
}

/// The contents of `slot` at `generation` (0 is the zeroes of a never-written block).
fn block(slot: usize, generation: u64) -> Vec<u8> {
    common::stamped_block(MAGIC, slot, generation, SLOT)
}

/// What a block read back holds, for checking and for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Generation(u64),
    /// A well-formed block of another slot (a misplaced write or a wrong cluster mapping).
    OtherSlot {
        slot: u64,
        generation: u64,
    },
    /// Neither zeroes nor a whole block of this test: torn, stale or garbage.
    Garbage,
}

fn decode(slot: usize, got: &[u8]) -> Seen {
    // A slice comparison (memcmp) rather than a byte loop: most blocks are zeroes, and this
    // runs for every block of every read-back in an unoptimised build.
    if got == [0u8; SLOT].as_slice() {
        return Seen::Generation(0);
    }
    let word = |i: usize| u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    if word(0) != MAGIC {
        return Seen::Garbage;
    }
    let (s, generation) = (word(1), word(2));
    if s != slot as u64 {
        return Seen::OtherSlot { slot: s, generation };
    }
    if generation == 0 || got != block(slot, generation).as_slice() {
        return Seen::Garbage;
    }
    Seen::Generation(generation)
}

/// What the writer knows about each slot.
struct Model {
    /// The last generation written before a flush that completed (0: zeroes).
    durable: Vec<u64>,
    /// Generations submitted after it and not yet covered by a completed flush: acknowledged
    /// or in flight at the kill, each may or may not be what the disk holds.
    maybe: Vec<Vec<u64>>,
    /// Slots with a non-empty `maybe`.
    dirty: Vec<usize>,
    next_generation: u64,
    /// The hot window's first cluster, and how many batches it has been there.
    window: usize,
    window_batches: u64,
    /// Every slot's durable generation when this run's writes began, and those writes in
    /// order: what a snapshot taken during the run may hold.
    run_base: Vec<u64>,
    run_writes: Vec<(usize, u64)>,
}

impl Model {
    fn new() -> Model {
        Model {
            durable: vec![0; SLOTS],
            maybe: vec![Vec::new(); SLOTS],
            dirty: Vec::new(),
            next_generation: 1,
            window: 0,
            window_batches: 0,
            run_base: Vec::new(),
            run_writes: Vec::new(),
        }
    }

    fn submitted(&mut self, slot: usize, generation: u64) {
        if self.maybe[slot].is_empty() {
            self.dirty.push(slot);
        }
        self.maybe[slot].push(generation);
        self.run_writes.push((slot, generation));
    }

    /// A flush submitted after every write in `maybe` completed has completed.
    fn flushed(&mut self) {
        for slot in self.dirty.drain(..) {
            self.durable[slot] = self.maybe[slot].pop().expect("a dirty slot has a generation");
            self.maybe[slot].clear();
        }
    }

    /// Checks what `slot` read back (`when`: after which kill); the value read becomes what the
    /// slot holds (and is durable once the flush after the read-back completes).
    fn check(&mut self, when: &str, slot: usize, got: &[u8]) {
        let durable = self.durable[slot];
        let seen = decode(slot, got);
        let ok = match seen {
            Seen::Generation(g) => g == durable || self.maybe[slot].contains(&g),
            _ => false,
        };
        if !ok {
            let first_bad = got.iter().zip(block(slot, durable)).position(|(a, b)| *a != b);
            panic!(
                "{when}: slot {slot} (volume offset {:#x}, cluster {}): expected generation \
                 {durable} (the last flushed write{}) or one of the later unflushed {:?}, read {seen:?} \
                 (first byte differing from generation {durable} at {first_bad:?}; first 32 bytes {:02x?})",
                slot * SLOT,
                slot / SLOTS_PER_CLUSTER,
                if durable == 0 { ": none, zeroes" } else { "" },
                self.maybe[slot],
                &got[..32],
            );
        }
        if let Seen::Generation(g) = seen {
            if !self.maybe[slot].is_empty() {
                self.maybe[slot].clear();
                self.maybe[slot].push(g);
            }
        }
    }

    /// The next batch: `BATCH` distinct slots, mostly in the hot window.
    fn pick(&mut self, rng: &mut StdRng) -> Vec<usize> {
        self.window_batches += 1;
        if self.window_batches >= BATCHES_PER_WINDOW_STEP {
            self.window_batches = 0;
            self.window = (self.window + 1) % VOLUME_CLUSTERS as usize;
        }
        let mut slots: Vec<usize> = Vec::with_capacity(BATCH);
        while slots.len() < BATCH {
            let slot = if rng.gen_ratio(15, 16) {
                let cluster = (self.window + rng.gen_range(0..HOT_CLUSTERS)) % VOLUME_CLUSTERS as usize;
                cluster * SLOTS_PER_CLUSTER + rng.gen_range(0..SLOTS_PER_CLUSTER)
            } else {
                rng.gen_range(0..SLOTS)
            };
            if !slots.contains(&slot) {
                slots.push(slot);
            }
        }
        slots
    }
}

/// What a snapshot must hold: taken after every generation up to `flushed` was flushed and
/// before any after `submitted` was sent, it holds per slot the last generation up to `flushed`
/// (`exact`) or one written between the two (`later`). Once read, `exact` is what was read and
/// `later` is empty: a snapshot never changes.
struct SnapshotExpectation {
    name: String,
    run: usize,
    exact: Vec<u64>,
    later: std::collections::HashMap<usize, Vec<u64>>,
    checks: usize,
}

impl SnapshotExpectation {
    fn new(name: String, run: usize, model: &Model, flushed: u64, submitted: u64) -> SnapshotExpectation {
        let mut exact = model.run_base.clone();
        let mut later = std::collections::HashMap::<usize, Vec<u64>>::new();
        for &(slot, generation) in &model.run_writes {
            if generation <= flushed {
                exact[slot] = generation;
            } else if generation <= submitted {
                later.entry(slot).or_default().push(generation);
            }
        }
        SnapshotExpectation { name, run, exact, later, checks: 0 }
    }

    /// Holds the place of one being verified on another thread.
    fn placeholder() -> SnapshotExpectation {
        SnapshotExpectation {
            name: String::new(),
            run: 0,
            exact: Vec::new(),
            later: Default::default(),
            checks: 0,
        }
    }

    fn check(&mut self, when: &str, slot: usize, got: &[u8]) {
        let want = self.exact[slot];
        let later = self.later.get(&slot).map(Vec::as_slice).unwrap_or(&[]);
        let seen = decode(slot, got);
        match seen {
            Seen::Generation(g) if g == want || later.contains(&g) => self.exact[slot] = g,
            _ => panic!(
                "{when}: snapshot {} (taken in run {}, read {} times before): slot {slot} (offset {:#x}): \
                 expected generation {want}{} or one of {later:?}, read {seen:?} (first 32 bytes {:02x?})",
                self.name,
                self.run,
                self.checks,
                slot * SLOT,
                if self.checks > 0 { " (what it held before)" } else { " (flushed before the snapshot)" },
                &got[..32],
            ),
        }
    }

    /// Reads the whole snapshot through `sock` and checks it.
    fn verify(&mut self, when: &str, sock: &Path) {
        let mut c = BlkClient::connect(sock, ClientOpts { read_only: true, ..ClientOpts::default() })
            .unwrap_or_else(|e| panic!("{when}: connecting to snapshot {}: {e}", self.name));
        let all = c.read_all(0, SLOTS * SLOT);
        for (slot, b) in all.chunks(SLOT).enumerate() {
            self.check(when, slot, b);
        }
        self.later.clear();
        self.checks += 1;
    }
}

/// What one run's writer did.
#[derive(Default, Debug)]
struct WriterStats {
    /// Batches written and flushed.
    batches: u64,
}

/// One run of the writer: connect, check every slot against the model, flush, tell the main
/// thread it is ready, then write and flush batches until the daemon is killed under it.
fn writer(
    run: usize,
    sock: PathBuf,
    mut model: Model,
    seed: u64,
    abort: Arc<AtomicBool>,
    marks: Arc<Watermarks>,
    ready: mpsc::Sender<()>,
) -> (Model, WriterStats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let when = format!("after kill {run}");
    let mut c = BlkClient::open(&sock, QUEUES);
    assert_eq!(c.capacity, VOLUME_MIB * MIB, "after kill {run}: the volume's capacity");
    let step = (c.max_io.min(MIB as usize) / SLOT).max(1) * SLOT;
    let mut off = 0;
    while off < SLOTS * SLOT {
        let n = step.min(SLOTS * SLOT - off);
        let got = c
            .read(0, off as u64, n)
            .unwrap_or_else(|r| panic!("after kill {run}: reading {n} bytes at {off:#x}: ret {r}"));
        for (i, b) in got.chunks(SLOT).enumerate() {
            model.check(&when, off / SLOT + i, b);
        }
        off += n;
    }
    // What was read is on the base now; once flushed it is what must survive the next kill.
    assert_eq!(c.flush(0), 0, "after kill {run}: the flush after the read-back");
    model.flushed();
    model.run_base = model.durable.clone();
    model.run_writes.clear();
    marks.flushed.store(model.next_generation - 1, Ordering::Release);
    marks.submitted.store(model.next_generation - 1, Ordering::Release);
    ready.send(()).expect("the main thread waits for the writer");

    let mut stats = WriterStats::default();
    while !abort.load(Ordering::Acquire) {
        let slots = model.pick(&mut rng);
        let mut ops = Vec::with_capacity(BATCH);
        for (i, &slot) in slots.iter().enumerate() {
            let generation = model.next_generation;
            model.next_generation += 1;
            model.submitted(slot, generation);
            c.arena()[i * SLOT..(i + 1) * SLOT].copy_from_slice(&block(slot, generation));
            ops.push(Op {
                queue: i % QUEUES,
                kind: OpKind::Write,
                offset: (slot * SLOT) as u64,
                len: SLOT,
                buf: i * SLOT,
            });
        }
        marks.submitted.store(model.next_generation - 1, Ordering::Release);
        let Some(rets) = c.run_until(&ops, &abort) else { break };
        for (op, r) in ops.iter().zip(&rets) {
            assert_eq!(
                *r,
                0,
                "run {run}, before kill {}: write of slot {} failed",
                run + 1,
                op.offset / SLOT as u64
            );
        }
        let flush = Op { queue: rng.gen_range(0..QUEUES), kind: OpKind::Flush, offset: 0, len: 0, buf: 0 };
        let Some(rets) = c.run_until(&[flush], &abort) else { break };
        assert_eq!(rets[0], 0, "run {run}, before kill {}: flush failed", run + 1);
        model.flushed();
        marks.flushed.store(model.next_generation - 1, Ordering::Release);
        stats.batches += 1;
    }
    // The daemon is dead or dying: requests may be outstanding, so the client is not used again.
    drop(c);
    (model, stats)
}

/// The writer's progress, for the snapshot thread: every generation up to `flushed` has been
/// flushed, none after `submitted` has been sent.
#[derive(Default)]
struct Watermarks {
    flushed: AtomicU64,
    submitted: AtomicU64,
}

/// What one run's snapshot thread did.
#[derive(Default, Debug)]
struct SnapStats {
    /// Snapshots whose RPC returned their name, with the writer's `flushed` before the call
    /// and `submitted` after it: they must exist after the restart.
    acked: Vec<(String, u64, u64)>,
    /// The snapshot requested when the daemon died, if any: it may or may not exist.
    unknown: Option<String>,
    skipped_for_space: u64,
}

/// Calls `method`; `None` if the daemon is gone and the kill was expected, panics otherwise.
fn call_or_killed(rpc: &Path, method: &str, params: Value, abort: &AtomicBool, run: usize) -> Option<Value> {
    match rpc_call(rpc, method, Some(params.clone())) {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => panic!("run {run}: {method} {params} failed: {} {}", e.code, e.message),
        Err(_) if abort.load(Ordering::Acquire) => None,
        Err(e) => panic!("run {run}: {method} failed at the transport level before kill {}: {e}", run + 1),
    }
}

fn snapshotter(
    run: usize,
    rpc: PathBuf,
    mut existing: usize,
    seed: u64,
    abort: Arc<AtomicBool>,
    marks: Arc<Watermarks>,
) -> SnapStats {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut stats = SnapStats::default();
    loop {
        std::thread::sleep(Duration::from_millis(rng.gen_range(15..=45)));
        if abort.load(Ordering::Acquire) {
            return stats;
        }
        let Some(stores) =
            call_or_killed(&rpc, "bdev_lvol_get_lvstores", json!({"lvs_name": LVS}), &abort, run)
        else {
            return stats;
        };
        let free = stores[0]["free_clusters"].as_u64().expect("free_clusters");
        if free < MIN_FREE_CLUSTERS || existing >= MAX_SNAPSHOTS {
            stats.skipped_for_space += 1;
            continue;
        }
        let name = format!("snap{existing}");
        let params = json!({"lvol_name": alias(), "snapshot_name": name});
        let flushed = marks.flushed.load(Ordering::Acquire);
        match call_or_killed(&rpc, "bdev_lvol_snapshot", params, &abort, run) {
            Some(v) => {
                assert!(v.is_string(), "run {run}: bdev_lvol_snapshot returned {v}, not a bdev name");
                stats.acked.push((name, flushed, marks.submitted.load(Ordering::Acquire)));
            }
            None => {
                stats.unknown = Some(name);
                return stats;
            }
        }
        existing += 1;
    }
}

/// The store's volumes by name, once the volume is back after a (re)start.
fn wait_for_volume(d: &Daemon, run: usize) -> Vec<Value> {
    let start = Instant::now();
    loop {
        if let Ok(Value::Array(lvols)) = d.try_call("bdev_lvol_get_lvols", json!({"lvs_name": LVS})) {
            if lvols.iter().any(|l| l["name"] == VOL) {
                return lvols;
            }
        }
        assert!(
            start.elapsed() < LOAD_TIMEOUT,
            "after kill {run}: the lvstore {LVS} with volume {VOL} did not come back within {LOAD_TIMEOUT:?}:\n{}",
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Exports `snap` read-only, reads it whole and checks it, then deletes the controller.
fn verify_snapshot(d: &Daemon, snap: &mut SnapshotExpectation, when: &str) {
    const SNAP_CTRLR: &str = "fp-lvkill-snap";
    let dev = format!("{LVS}/{}", snap.name);
    d.call("vhost_create_blk_controller", json!({"ctrlr": SNAP_CTRLR, "dev_name": dev, "readonly": true}));
    let sock = d.dir.path().join(SNAP_CTRLR);
    let mut e = std::mem::replace(snap, SnapshotExpectation::placeholder());
    let when = when.to_string();
    *snap = common::bounded(PHASE_TIMEOUT, "a snapshot's read-back", move || {
        e.verify(&when, &sock);
        e
    });
    d.call("vhost_delete_controller", json!({"ctrlr": SNAP_CTRLR}));
}

/// Joins `h`, failing the test if it takes longer than `limit`.
fn join_within<T>(h: JoinHandle<T>, limit: Duration, what: &str) -> T {
    let start = Instant::now();
    while !h.is_finished() {
        assert!(start.elapsed() < limit, "{what} did not finish within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

fn kills() -> usize {
    std::env::var("FP_LVOL_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_KILLS)
}

fn seed() -> u64 {
    std::env::var("FP_LVOL_KILL_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64
    })
}

#[test]
fn lvol_survives_kill9_loop_under_writes_and_snapshots() {
    let seed = seed();
    let kills = kills();
    eprintln!("lvol kill -9 loop: seed {seed} (FP_LVOL_KILL_SEED), {kills} kills (FP_LVOL_KILLS)");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let mut d = Daemon::start_with_config("0", |dir| {
        let file = dir.join("lvs.img");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(BASE_BYTES))
            .expect("creating the sparse base file");
        // Buffered: SIGKILL leaves the page cache alone, so what the daemon wrote survives it
        // either way, and read-backs through the page cache keep the loop fast.
        format!(
            "[[bdev]]\ntype = \"uring\"\nname = \"base\"\nfilename = \"{}\"\ndirect = false\n",
            file.display()
        )
    });
    let lvs_uuid = d.call(
        "bdev_lvol_create_lvstore",
        json!({"bdev_name": "base", "lvs_name": LVS, "cluster_sz": CLUSTER}),
    );
    assert!(lvs_uuid.is_string(), "bdev_lvol_create_lvstore returned {lvs_uuid}");
    let vol_uuid = d.call(
        "bdev_lvol_create",
        json!({"lvs_name": LVS, "lvol_name": VOL, "size_in_mib": VOLUME_MIB, "thin_provision": true}),
    );
    let vol_uuid = vol_uuid.as_str().expect("bdev_lvol_create returns the volume's bdev name").to_string();
    let total_clusters = d.call("bdev_lvol_get_lvstores", json!({"lvs_name": LVS}))[0]["total_data_clusters"]
        .as_u64()
        .expect("total_data_clusters");
    assert!(total_clusters > MIN_FREE_CLUSTERS + VOLUME_CLUSTERS, "{total_clusters} data clusters");

    let mut model = Model::new();
    let mut snapshots: Vec<SnapshotExpectation> = Vec::new();
    let mut snapshots_now = 0usize;
    let (mut batches, mut max_free, mut min_free) = (0u64, 0u64, u64::MAX);
    // A snapshot whose RPC the kill interrupted (it may or may not exist), and how many did.
    let mut in_flight_snapshot: Option<String> = None;
    let (mut in_flight_snapshots, mut survived_in_flight) = (0usize, 0usize);
    let mut run_ms = Vec::with_capacity(kills);
    // Where the time goes: restarts and loads, snapshot read-backs, the volume's read-backs.
    let mut phase = [Duration::ZERO; 3];
    let mut t = Instant::now();

    for run in 0..=kills {
        let lvols = wait_for_volume(&d, run);
        phase[0] += t.elapsed();
        t = Instant::now();
        let vol = lvols.iter().find(|l| l["name"] == VOL).expect("wait_for_volume found it");
        assert_eq!(vol["uuid"], json!(vol_uuid), "after kill {run}: the volume's UUID");
        assert_eq!(vol["alias"], json!(alias()), "after kill {run}: the volume's alias");
        assert_eq!(vol["is_thin_provisioned"], json!(true), "after kill {run}: {vol}");
        for snap in &snapshots {
            assert!(
                lvols.iter().any(|l| l["name"] == json!(snap.name) && l["is_snapshot"] == json!(true)),
                "after kill {run}: snapshot {} (run {}) was acknowledged but is missing: {lvols:?}",
                snap.name,
                snap.run
            );
        }
        snapshots_now = lvols.iter().filter(|l| l["is_snapshot"] == json!(true)).count();
        let store = &d.call("bdev_lvol_get_lvstores", json!({"lvs_name": LVS}))[0];
        let free = store["free_clusters"].as_u64().expect("free_clusters");
        // Nothing is ever deleted here, so no free is pending: every cluster is free or owned.
        let owned: u64 =
            lvols.iter().map(|l| l["num_allocated_clusters"].as_u64().expect("num_allocated_clusters")).sum();
        assert_eq!(
            free + owned,
            total_clusters,
            "after kill {run}: {free} free clusters and {owned} owned by the volumes do not add up to the store's \
             {total_clusters}: {lvols:?}"
        );
        if let Some(name) = in_flight_snapshot.take() {
            survived_in_flight += lvols.iter().any(|l| l["name"] == json!(name)) as usize;
        }
        (max_free, min_free) = (max_free.max(free), min_free.min(free));
        // One snapshot per restart (each read costs as much as the volume's): after odd kills
        // the newest not read yet, after even ones any (read before or not).
        let newest_unread = snapshots.iter().rposition(|s| s.checks == 0).filter(|_| run % 2 == 1);
        let pick =
            newest_unread.or_else(|| (!snapshots.is_empty()).then(|| rng.gen_range(0..snapshots.len())));
        if let Some(i) = pick {
            verify_snapshot(&d, &mut snapshots[i], &format!("after kill {run}"));
        }
        phase[1] += t.elapsed();
        t = Instant::now();

        d.call(
            "vhost_create_blk_controller",
            json!({"ctrlr": CTRLR, "dev_name": alias(), "num_queues": QUEUES}),
        );
        let sock = d.dir.path().join(CTRLR);
        let abort = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let marks = Arc::new(Watermarks::default());
        let w = {
            let (abort, seed, marks) = (abort.clone(), rng.gen(), marks.clone());
            std::thread::Builder::new()
                .name("lvol-writer".into())
                .spawn(move || writer(run, sock, model, seed, abort, marks, ready_tx))
                .expect("spawning the writer")
        };
        if ready_rx.recv_timeout(PHASE_TIMEOUT).is_err() {
            // The writer panicked (its message says why) or hung.
            let _ = join_within(w, Duration::from_secs(1), "the writer's read-back");
            panic!("after kill {run}: the writer did not connect and read back within {PHASE_TIMEOUT:?}");
        }
        phase[2] += t.elapsed();
        if run == kills {
            // The last restart only checks; the daemon then stops cleanly.
            abort.store(true, Ordering::Release);
            model = join_within(w, PHASE_TIMEOUT, "the final writer").0;
            break;
        }

        let s = {
            let (abort, seed, rpc) = (abort.clone(), rng.gen(), d.rpc.clone());
            std::thread::Builder::new()
                .name("lvol-snapshots".into())
                .spawn(move || snapshotter(run, rpc, snapshots_now, seed, abort, marks))
                .expect("spawning the snapshot thread")
        };
        let ms = rng.gen_range(10..=300);
        run_ms.push(ms);
        std::thread::sleep(Duration::from_millis(ms));
        // Before the kill, so that the threads take the failures that follow for what they are.
        abort.store(true, Ordering::Release);
        d.kill9();
        let (m, ws) = join_within(w, PHASE_TIMEOUT, "the writer after the kill");
        model = m;
        batches += ws.batches;
        let ss = join_within(s, PHASE_TIMEOUT, "the snapshot thread after the kill");
        in_flight_snapshots += ss.unknown.is_some() as usize;
        in_flight_snapshot = ss.unknown;
        for (name, flushed, submitted) in ss.acked {
            snapshots.push(SnapshotExpectation::new(name, run, &model, flushed, submitted));
        }
        t = Instant::now();
        d.restart();
    }

    // A clean stop and start must load the same.
    d.stop();
    d.restart();
    let lvols = wait_for_volume(&d, kills);
    assert_eq!(
        lvols.iter().filter(|l| l["is_snapshot"] == json!(true)).count(),
        snapshots_now,
        "after the clean restart: {lvols:?}"
    );
    let unread = snapshots.iter().filter(|s| s.checks == 0).count();
    let mut final_picks: Vec<usize> =
        (0..snapshots.len()).filter(|&i| snapshots[i].checks == 0).take(6).collect();
    final_picks
        .extend((0..4).map(|_| rng.gen_range(0..snapshots.len().max(1))).filter(|&i| i < snapshots.len()));
    final_picks.sort_unstable();
    final_picks.dedup();
    for &i in &final_picks {
        verify_snapshot(&d, &mut snapshots[i], "after the final clean restart");
    }
    d.call("vhost_create_blk_controller", json!({"ctrlr": CTRLR, "dev_name": vol_uuid, "num_queues": 1}));
    let sock = d.dir.path().join(CTRLR);
    let final_model = common::bounded(PHASE_TIMEOUT, "the final read-back", move || {
        let mut c = BlkClient::open(&sock, 1);
        let all = c.read_all(0, SLOTS * SLOT);
        for (slot, b) in all.chunks(SLOT).enumerate() {
            model.check("after the final clean restart", slot, b);
        }
        model
    });
    let written = final_model.durable.iter().filter(|&&g| g != 0).count();
    eprintln!(
        "lvol kill -9 loop: {kills} kills in {:?} (runs of {}-{} ms), {batches} flushed batches, \
         {written} of {SLOTS} slots written, {} snapshots acknowledged ({snapshots_now} at the end), \
         {in_flight_snapshots} snapshot RPCs cut by the kill ({survived_in_flight} of them taken), \
         {} snapshot read-backs ({unread} snapshots never read), free clusters {min_free}-{max_free} \
         of {total_clusters}; restarts and loads {:?}, snapshot reads {:?}, volume reads {:?}",
        started.elapsed(),
        run_ms.iter().min().unwrap_or(&0),
        run_ms.iter().max().unwrap_or(&0),
        snapshots.len(),
        snapshots.iter().map(|s| s.checks).sum::<usize>(),
        phase[0],
        phase[1],
        phase[2],
    );
    // The loop must really have exercised what it claims to.
    assert!(batches > kills as u64, "the writer hardly ran: {batches} batches in {kills} runs");
    assert!(snapshots.len() >= kills / 2, "only {} snapshots in {kills} runs", snapshots.len());
    assert!(
        total_clusters - min_free > VOLUME_CLUSTERS,
        "at most {} clusters were ever allocated: no copy-on-write beyond the volume's own",
        total_clusters - min_free
    );
}
