//! kill -9 on an RBD disk (issue 13): a daemon whose configuration file creates the rbd bdev and
//! its controller is killed with SIGKILL while a verified writer runs; after each restart
//! every write acknowledged before a completed flush must read back, and the new daemon must
//! be able to write although the dead one still held the image's exclusive lock (it waits for
//! the dead client's watch to time out), and after a final clean restart without waiting.
//!
//! The writer is a libblkio client in this process: batches of 4 KiB writes whose every block
//! names its slot and generation, then a flush, after which (and only after which) the batch
//! counts as durable. A generation written but not covered by a flush may or may not be there
//! after the kill; nothing else may. The seed is printed and replayed with `FP_RBD_KILL_SEED`;
//! `FP_RBD_KILLS` changes the number of kills.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::ceph::CephCluster;
use common::{bounded, BlkClient, Daemon, Op, OpKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
const IMAGE_MIB: u64 = 16;
const SLOT: usize = 4096;
/// The slots the writer uses: the first 8 MiB (two librbd objects).
const SLOTS: usize = 8 * MIB as usize / SLOT;
const BATCH: usize = 8;
const QUEUES: usize = 2;
const CTRLR: &str = "vhost.rbd";
const DEFAULT_KILLS: usize = 3;
/// A block's header: magic, slot, generation; the rest is `pattern(generation, offset)`.
const MAGIC: u64 = 0x5242_444b_494c_4c01;
/// Upper bound for connecting and reading back after a restart, or for the first write.
const PHASE_TIMEOUT: Duration = Duration::from_secs(90);
/// The test cluster's `osd client watch timeout` (tests/ceph/cluster.sh; Ceph's default is
/// 30 s): a SIGKILLed client's watch on the image lasts that long, and with it the exclusive
/// lock the new daemon's first write must break.
const WATCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than that the first write may take (restart, lock break, blocklisting).
const LOCK_SLACK: Duration = Duration::from_secs(10);

fn block(slot: usize, generation: u64) -> Vec<u8> {
    common::stamped_block(MAGIC, slot, generation, SLOT)
}

/// What each slot may hold.
struct Model {
    /// The last generation covered by a completed flush (0: never written, zeroes).
    durable: Vec<u64>,
    /// Generations written after it, not (yet) covered by a completed flush.
    maybe: Vec<Vec<u64>>,
    next_generation: u64,
}

impl Model {
    fn submitted(&mut self, slot: usize, generation: u64) {
        self.maybe[slot].push(generation);
    }

    /// A flush submitted after every write in `maybe` completed has completed.
    fn flushed(&mut self) {
        for (slot, maybe) in self.maybe.iter_mut().enumerate() {
            if let Some(&g) = maybe.last() {
                self.durable[slot] = g;
                maybe.clear();
            }
        }
    }

    /// Checks what `slot` read back; what was read is what it holds from now on.
    fn check(&mut self, when: &str, slot: usize, got: &[u8]) {
        let durable = self.durable[slot];
        let found =
            std::iter::once(durable).chain(self.maybe[slot].iter().copied()).find(|&g| got == block(slot, g));
        let Some(g) = found else {
            let word = |i: usize| u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().unwrap());
            panic!(
                "{when}: slot {slot} (offset {:#x}): expected generation {durable} (the last flushed) or one of the \
                 unflushed {:?}; read magic {:#x} slot {} generation {} (first 32 bytes {:02x?})",
                slot * SLOT,
                self.maybe[slot],
                word(0),
                word(1),
                word(2),
                &got[..32]
            );
        };
        if !self.maybe[slot].is_empty() {
            self.maybe[slot] = vec![g];
        }
    }
}

/// One run: connect, check every slot, flush, time the first write (the exclusive lock),
/// signal `ready`, then write and flush batches until `abort`.
fn writer(
    run: usize,
    sock: PathBuf,
    mut model: Model,
    seed: u64,
    abort: Arc<AtomicBool>,
    ready: mpsc::Sender<Duration>,
) -> (Model, u64) {
    let when = format!("after kill {run}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = BlkClient::open(&sock, QUEUES);
    assert_eq!(c.capacity, IMAGE_MIB * MIB, "{when}: capacity");
    let all = c.read_all(0, SLOTS * SLOT);
    for (slot, got) in all.chunks(SLOT).enumerate() {
        model.check(&when, slot, got);
    }
    // The first write takes the image's exclusive lock from the dead daemon.
    let t = Instant::now();
    let slot = rng.gen_range(0..SLOTS);
    let g = model.next_generation;
    model.next_generation += 1;
    model.submitted(slot, g);
    let r = c.write(0, (slot * SLOT) as u64, &block(slot, g));
    assert_eq!(r, 0, "{when}: the first write (slot {slot})");
    let first_write = t.elapsed();
    assert_eq!(c.flush(1), 0, "{when}: the flush after the read-back");
    model.flushed();
    ready.send(first_write).expect("the main thread waits");

    let mut batches = 0;
    while !abort.load(Ordering::Acquire) {
        let mut ops = Vec::with_capacity(BATCH);
        let mut slots = Vec::with_capacity(BATCH);
        while slots.len() < BATCH {
            let s = rng.gen_range(0..SLOTS);
            if !slots.contains(&s) {
                slots.push(s);
            }
        }
        for (i, &slot) in slots.iter().enumerate() {
            let g = model.next_generation;
            model.next_generation += 1;
            model.submitted(slot, g);
            c.arena()[i * SLOT..(i + 1) * SLOT].copy_from_slice(&block(slot, g));
            ops.push(Op {
                queue: i % QUEUES,
                kind: OpKind::Write,
                offset: (slot * SLOT) as u64,
                len: SLOT,
                buf: i * SLOT,
            });
        }
        let Some(rets) = c.run_until(&ops, &abort) else { break };
        for (op, r) in ops.iter().zip(&rets) {
            assert_eq!(*r, 0, "{when}: write at {:#x}", op.offset);
        }
        let flush = Op { queue: batches as usize % QUEUES, kind: OpKind::Flush, offset: 0, len: 0, buf: 0 };
        let Some(rets) = c.run_until(&[flush], &abort) else { break };
        assert_eq!(rets[0], 0, "{when}: flush");
        model.flushed();
        batches += 1;
    }
    drop(c);
    (model, batches)
}

fn env_or<T: std::str::FromStr>(key: &str, default: impl FnOnce() -> T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or_else(default)
}

/// The `[[vhost_blk]]` table every variant ends with.
fn controller_table() -> String {
    format!("[[vhost_blk]]\nctrlr = \"{CTRLR}\"\ndev_name = \"rbd0\"\nnum_queues = {QUEUES}\n")
}

#[test]
fn rbd_disk_on_a_registered_cluster_survives_kill9_under_writes() {
    kill9_loop(|ceph| {
        format!(
            "[[rbd_cluster]]\nname = \"c0\"\nconfig_file = \"{}\"\n\n\
             [[bdev]]\ntype = \"rbd\"\nname = \"rbd0\"\npool_name = \"rbd\"\nrbd_name = \"disk\"\n\
             cluster_name = \"c0\"\n\n{}",
            ceph.conf().display(),
            controller_table()
        )
    });
}

#[test]
fn rbd_disk_with_its_own_connection_survives_kill9_under_writes() {
    // The bdev's `config` replaces ceph.conf.
    kill9_loop(|ceph| {
        format!(
            "[[bdev]]\ntype = \"rbd\"\nname = \"rbd0\"\npool_name = \"rbd\"\nrbd_name = \"disk\"\n\
             config = {{ mon_host = \"{}\", auth_client_required = \"none\" }}\n\n{}",
            ceph.mon_host(),
            controller_table()
        )
    });
}

/// Starts a daemon with the configuration `config` gives for the cluster (bdev `rbd0` on image
/// `disk`, controller [`CTRLR`]), then kills and restarts it under the writer.
fn kill9_loop(config: impl FnOnce(&CephCluster) -> String) {
    let Some(ceph) = CephCluster::start() else { return };
    ceph.create_image("disk", IMAGE_MIB);
    let kills: usize = env_or("FP_RBD_KILLS", || DEFAULT_KILLS);
    let seed: u64 = env_or("FP_RBD_KILL_SEED", || {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("rbd kill -9: seed {seed} (FP_RBD_KILL_SEED), {kills} kills (FP_RBD_KILLS)");
    let mut rng = StdRng::seed_from_u64(seed);
    let text = config(&ceph);
    let mut d = Daemon::start_with_config("0,1", |_| text);
    let mut model = Model { durable: vec![0; SLOTS], maybe: vec![Vec::new(); SLOTS], next_generation: 1 };
    let (mut batches, mut first_writes) = (0u64, Vec::new());
    for run in 0..=kills {
        let sock = d.dir.path().join(CTRLR);
        let abort = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let w = {
            let (abort, seed) = (abort.clone(), rng.gen());
            std::thread::spawn(move || writer(run, sock, model, seed, abort, ready_tx))
        };
        match ready_rx.recv_timeout(PHASE_TIMEOUT) {
            Ok(t) => {
                assert!(
                    t <= WATCH_TIMEOUT + LOCK_SLACK,
                    "after kill {run}: the first write waited {t:?} for the dead daemon's lock \
                     (watch timeout {WATCH_TIMEOUT:?})"
                );
                first_writes.push(t);
            }
            Err(_) => {
                let _ = bounded(Duration::from_secs(5), "the writer", move || w.join());
                panic!("after kill {run}: the writer did not read back and write within {PHASE_TIMEOUT:?}");
            }
        }
        if run == kills {
            abort.store(true, Ordering::Release);
            model = bounded(PHASE_TIMEOUT, "the last writer", move || w.join().unwrap()).0;
            break;
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(100..=400)));
        abort.store(true, Ordering::Release);
        d.kill9();
        let (m, b) = bounded(PHASE_TIMEOUT, "the writer after the kill", move || w.join().unwrap());
        model = m;
        batches += b;
        d.restart();
    }
    // A clean stop closes the image, releasing its lock: the next daemon writes at once.
    d.stop();
    d.restart();
    let (tx, rx) = mpsc::channel();
    let (sock, abort) = (d.dir.path().join(CTRLR), Arc::new(AtomicBool::new(true)));
    let w = std::thread::spawn(move || writer(kills + 1, sock, model, rng.gen(), abort, tx));
    model = bounded(PHASE_TIMEOUT, "the writer after a clean restart", move || w.join().unwrap()).0;
    let clean = rx.recv().expect("the writer reports its first write");
    assert!(clean < Duration::from_secs(2), "after a clean restart the first write took {clean:?}");
    let written = model.durable.iter().filter(|&&g| g != 0).count();
    eprintln!(
        "rbd kill -9: {kills} kills, {batches} flushed batches, {written} of {SLOTS} slots written; \
         the first write after each start took {first_writes:?}, after a clean restart {clean:?}"
    );
    assert!(batches >= kills as u64, "the writer hardly ran: {batches} batches in {kills} runs");
    d.assert_alive();
}
