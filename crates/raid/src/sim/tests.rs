//! Random raid1 histories over recording bases (guest writes, base failures, returns with a
//! partial rebuild, clearing passes), then every crash point of the log, with every later
//! write of each base landed, none, some, or torn. At each: the newest superblock decodes from
//! at least one copy and is no older than one already durable; in-sync bases differ only in
//! chunks the union bitmap marks, and so does a base out of sync that a partial rebuild would
//! trust; reassembly then converges the bases.

use std::cell::Cell;
use std::rc::Rc;

use fp_bdev::Uuid;
use fp_bdev::{BdevInfo, Capacity, IoTypes};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::format::{Superblock, PAGE_SIZE};
use crate::intent::IntentMap;
use crate::meta_io::{load_bitmap, read_superblock};
use crate::owner::{new_shared, random_uuid, Member, Owner, OwnerOptions};
use crate::shared::Failure;
use crate::{RaidLevel, SlotState};

const BASE: u64 = (1 << 20) + (512 << 10);
const N: usize = 3;

fn info(sb: &Superblock) -> BdevInfo {
    BdevInfo {
        name: "sim".into(),
        product_name: "Raid Volume".into(),
        block_size: sb.block_size,
        capacity: Capacity::new(sb.raid_blocks),
        io_types: IoTypes { read: true, write: true, flush: true, unmap: false, write_zeroes: false },
        driver: "raid",
        driver_specific: None,
    }
}

fn options() -> OwnerOptions {
    OwnerOptions {
        clear_period: std::time::Duration::ZERO,
        process_window_bytes: 64 << 10,
        checkpoint_bytes: 64 << 10,
        ..OwnerOptions::default()
    }
}

/// A history: the log, and every superblock the owner wrote (by sequence).
struct History {
    log: Vec<(usize, SimOp)>,
    chunk: u64,
}

/// raid1's write path, synchronously, reporting failed bases as a channel does.
fn guest_write(o: &mut Owner, offset: u64, data: &[u8]) {
    let shared = o.shared().clone();
    let map = shared.intent.as_ref().unwrap();
    let t = map.begin_write(offset, data.len() as u64);
    if !map.is_durable(&t) {
        o.persist_bitmap();
    }
    assert!(map.is_durable(&t));
    let layout = shared.layout();
    let mut failed = false;
    for (slot, v) in layout.slots.iter().enumerate() {
        if v.state.takes_writes() {
            let m = o.member_mut(slot).unwrap();
            if m.io.write_at(layout.data_offset + offset, data).is_err() {
                shared.failures.push(Failure { slot, errno: libc::EIO }).unwrap();
                failed = true;
            }
        }
    }
    if failed {
        // The write completes only once the layout no longer trusts the failed base.
        o.handle_failures();
    }
    map.end_write(&t);
}

fn history(seed: u64, steps: usize) -> History {
    let mut rng = SmallRng::seed_from_u64(seed);
    let log: SimLog = Rc::default();
    let mut fails: Vec<Rc<Cell<bool>>> = Vec::new();
    let members: Vec<Option<Member>> = (0..N)
        .map(|i| {
            let b = SimBase::new(i, BASE, log.clone());
            fails.push(b.fail.clone());
            Some(Member { name: format!("b{i}"), bdev: None, io: Box::new(b) })
        })
        .collect();
    let uuids: Vec<Uuid> = (0..N).map(|_| random_uuid()).collect();
    let sb =
        Superblock::create("sim", RaidLevel::Raid1, 0, 512, random_uuid(), &uuids, &[BASE; N], true).unwrap();
    let chunk = sb.bitmap_chunk_bytes;
    let data_bytes = sb.raid_bytes();
    let shared = new_shared(info(&sb), &sb, true);
    let mut o = Owner::new(shared, members, sb, true, options());
    o.start().unwrap();
    let mut removed: Vec<Member> = Vec::new();
    for _ in 0..steps {
        let states: Vec<SlotState> = o.superblock().slots.iter().map(|s| s.state).collect();
        match rng.gen_range(0..10) {
            0..=5 => {
                let len = 512 * rng.gen_range(1..=8u64);
                let off = rng.gen_range(0..(data_bytes - len) / 512) * 512;
                guest_write(&mut o, off, &vec![rng.gen(); len as usize]);
            }
            6 => {
                // A base goes away (when another stays in sync); the next write finds out.
                let active: Vec<usize> = (0..N).filter(|&s| states[s] == SlotState::Active).collect();
                if active.len() >= 2 {
                    fails[active[rng.gen_range(0..active.len())]].set(true);
                }
            }
            7 => {
                // A failed base comes back: removed, then added again.
                if let Some(s) = (0..N).find(|&s| states[s] == SlotState::Failed) {
                    if let Ok(m) = o.remove_base(&format!("b{s}")) {
                        removed.push(m);
                    }
                }
                if let Some(m) = removed.pop() {
                    let id: usize = m.name[1..].parse().unwrap();
                    fails[id].set(false);
                    if let Err(e) = o.add_base(m) {
                        panic!("re-adding b{id}: {e}");
                    }
                }
            }
            _ => o.tick(),
        }
    }
    let log = log.borrow().clone();
    History { log, chunk }
}

/// A crash image, read in place.
struct Image<'a>(&'a [u8]);

impl BaseIo for Image<'_> {
    fn size_bytes(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        buf.copy_from_slice(&self.0[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&mut self, _: u64, _: &[u8]) -> Result<(), i32> {
        Err(libc::EROFS)
    }
    fn flush(&mut self) -> Result<(), i32> {
        Ok(())
    }
}

/// The bases of a crash image: each base's own superblock, if any copy decodes.
fn own_superblocks(images: &[Vec<u8>]) -> Vec<Option<Superblock>> {
    images.iter().map(|img| read_superblock(&mut Image(img)).unwrap()).collect()
}

/// For each crash point and base: the highest superblock sequence written to the base and
/// flushed after, before that point.
fn durable_seqs(log: &[(usize, SimOp)]) -> Vec<[u64; N]> {
    let mut out = vec![[0; N]];
    let (mut best, mut pending) = ([0u64; N], [0u64; N]);
    for (b, op) in log {
        match op {
            SimOp::Write { offset, data } if *offset < 2 * PAGE_SIZE as u64 => {
                if let Ok(sb) = Superblock::decode(&data[..PAGE_SIZE]) {
                    pending[*b] = pending[*b].max(sb.seq);
                }
            }
            SimOp::Flush => best[*b] = best[*b].max(pending[*b]),
            _ => {}
        }
        out.push(best);
    }
    out
}

/// Checks one crash image set; returns the images by slot for reassembly.
fn check(
    durable: &[u64; N],
    h: &History,
    images: &[Vec<u8>],
    what: &str,
) -> Option<(Superblock, Vec<Option<usize>>)> {
    let own = own_superblocks(images);
    for id in 0..N {
        let d = durable[id];
        if d > 0 {
            let sb = own[id].as_ref().unwrap_or_else(|| panic!("{what}: base {id} lost its superblock"));
            assert!(sb.seq >= d, "{what}: base {id} went back from seq {d} to {}", sb.seq);
        }
    }
    let newest = own.iter().flatten().max_by_key(|s| s.seq)?.clone();
    // Bases by slot: a base belongs to the slot its own superblock names, when the newest
    // superblock lists it there under the same identity.
    let mut by_slot: Vec<Option<usize>> = vec![None; newest.slots.len()];
    for (id, sb) in own.iter().enumerate() {
        if let Some(sb) = sb {
            let s = sb.slot as usize;
            if sb.raid_uuid == newest.raid_uuid && sb.slots[s].uuid == newest.slots[s].uuid {
                by_slot[s] = Some(id);
            }
        }
    }
    let map = IntentMap::new(newest.raid_bytes(), h.chunk, true);
    for (s, img) in by_slot.iter().enumerate() {
        if let (Some(id), SlotState::Active) = (img, newest.slots[s].state) {
            load_bitmap(&mut Image(&images[*id]), &newest, &map).unwrap();
        }
    }
    let reference =
        (0..by_slot.len()).find(|&s| by_slot[s].is_some() && newest.slots[s].state == SlotState::Active);
    let Some(reference) = reference else { return Some((newest, by_slot)) };
    let off = newest.data_offset as usize;
    let chunk_of = |id: usize, c: u64| {
        let a = off + (c * h.chunk) as usize;
        &images[id][a..(a + h.chunk as usize).min(off + newest.raid_bytes() as usize)]
    };
    for c in 0..map.chunks() {
        if map.is_set(c) {
            continue;
        }
        let want = chunk_of(by_slot[reference].unwrap(), c);
        for (s, img) in by_slot.iter().enumerate() {
            let rec = &newest.slots[s];
            let trusted = match rec.state {
                SlotState::Active => true,
                // A partial rebuild trusts every unmarked chunk; a full one those below its offset.
                SlotState::Failed => true,
                SlotState::Rebuilding => rec.rebuild_partial || (c + 1) * h.chunk <= rec.rebuild_offset,
                SlotState::Empty => false,
            };
            if let (Some(img), true) = (img, trusted) {
                assert!(
                    chunk_of(*img, c) == want,
                    "{what}: slot {s} ({:?}) differs in unmarked chunk {c}",
                    rec.state
                );
            }
        }
    }
    Some((newest, by_slot))
}

/// Reassembles a crash image and runs its resync and rebuilds: the in-sync bases converge.
fn reassemble(newest: Superblock, images: &[Vec<u8>], by_slot: Vec<Option<usize>>, what: &str) {
    let members = by_slot
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            id.map(|id| images[id].clone()).map(|image| Member {
                name: format!("b{i}"),
                bdev: None,
                io: Box::new(MemBase { image, fail: false, flushes: 0 }) as Box<dyn BaseIo>,
            })
        })
        .collect();
    let shared = new_shared(info(&newest), &newest, true);
    let mut o = Owner::new(shared, members, newest.clone(), true, options());
    o.start().unwrap();
    let mut n = 0;
    while o.process_running() {
        o.tick();
        n += 1;
        assert!(n < 10_000, "{what}: the process does not end");
    }
    let sb = o.superblock().clone();
    let mut first: Option<Vec<u8>> = None;
    for s in 0..sb.slots.len() {
        if sb.slots[s].state != SlotState::Active {
            continue;
        }
        let Some(m) = o.member_mut(s) else { continue };
        let mut v = vec![0; sb.raid_bytes() as usize];
        m.io.read_at(sb.data_offset, &mut v).unwrap();
        match &first {
            None => first = Some(v),
            Some(f) => {
                assert!(*f == v, "{what}: slot {s} differs from the first in-sync base after reassembly")
            }
        }
    }
}

#[test]
fn every_crash_point_keeps_the_bitmap_invariant() {
    for seed in 0..3 {
        let h = history(seed, 60);
        let mut rng = SmallRng::seed_from_u64(seed ^ 0xabcdef);
        let durable = durable_seqs(&h.log);
        let mut replay = Replay::new(&h.log, N, BASE);
        loop {
            let completed = replay.completed();
            // With nothing unflushed anywhere every landing gives the same images.
            let landings: &[Landing] = if replay.unflushed() == 0 {
                &[Landing::None]
            } else {
                &[Landing::None, Landing::All, Landing::Mask(rng.gen()), Landing::Torn(512)]
            };
            for (k, &landing) in landings.iter().enumerate() {
                // Each base lands its own subset.
                let per_base = |id: usize| match landing {
                    Landing::Mask(m) => {
                        Landing::Mask(m.rotate_left(id as u32 * 21) ^ (id as u64).wrapping_mul(0x9e37_79b9))
                    }
                    l => l,
                };
                let images: Vec<Vec<u8>> = (0..N).map(|id| replay.image(id, per_base(id))).collect();
                let what =
                    format!("seed {seed}, crash after {completed} of {} ops, {landing:?}", h.log.len());
                let Some((newest, by_slot)) = check(&durable[completed], &h, &images, &what) else {
                    continue;
                };
                if (k == 2 || landings.len() == 1) && completed % 8 == 0 {
                    reassemble(newest, &images, by_slot, &what);
                }
            }
            if !replay.advance() {
                break;
            }
        }
    }
}

#[test]
fn the_histories_exercise_failures_returns_and_clearing() {
    let h = history(3, 60);
    let sb_writes = h
        .log
        .iter()
        .filter(|(_, op)| matches!(op, SimOp::Write { offset, .. } if *offset < 2 * PAGE_SIZE as u64))
        .count();
    let bitmap_writes = h
        .log
        .iter()
        .filter(|(_, op)| matches!(op, SimOp::Write { offset, .. } if (2 * PAGE_SIZE as u64..1 << 20).contains(offset)))
        .count();
    assert!(sb_writes > N * 2, "{sb_writes} superblock writes");
    assert!(bitmap_writes > 10, "{bitmap_writes} bitmap writes");
}

/// The clearing pass's rule, directly: a write whose bit was already durable (so no bitmap
/// pass flushed it) is flushed on every base before a page without its bit is written.
#[test]
fn a_cleared_bit_lands_only_after_its_writes_are_flushed() {
    let log: SimLog = Rc::default();
    let members: Vec<Option<Member>> = (0..2)
        .map(|i| {
            Some(Member {
                name: format!("b{i}"),
                bdev: None,
                io: Box::new(SimBase::new(i, BASE, log.clone())) as Box<dyn BaseIo>,
            })
        })
        .collect();
    let uuids = [random_uuid(), random_uuid()];
    let sb =
        Superblock::create("c", RaidLevel::Raid1, 0, 512, random_uuid(), &uuids, &[BASE; 2], true).unwrap();
    let mut o = Owner::new(new_shared(info(&sb), &sb, true), members, sb, true, options());
    o.start().unwrap();
    guest_write(&mut o, 0, &[1; 512]);
    // The bit is durable now: this write sets nothing and no pass flushes after it.
    guest_write(&mut o, 512, &[2; 512]);
    let second = log.borrow().len();
    o.tick();
    o.tick();
    assert_eq!(o.shared().intent.as_ref().unwrap().set_count(), 0);
    let log = log.borrow();
    for id in 0..2 {
        let ops: Vec<&SimOp> = log[second..].iter().filter(|(b, _)| *b == id).map(|(_, op)| op).collect();
        let page = ops
            .iter()
            .position(|op| matches!(op, SimOp::Write { offset, .. } if *offset == 2 * PAGE_SIZE as u64))
            .expect("the cleared page is written");
        assert!(
            ops[..page].iter().any(|op| matches!(op, SimOp::Flush)),
            "base {id}: no flush before the cleared page"
        );
    }
}
