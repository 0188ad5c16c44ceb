//! The owner over bases in memory (synchronous, step by step) and over RAM bdevs (its thread,
//! with writer threads doing raid1's write path as the channels do).

use fp_bdev::copy_share::CopyShare;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::Uuid;
use fp_bdev::{Bdev, BdevInfo, Capacity, IoTypes, Iovecs, RamDevice};

use std::sync::mpsc;

use super::handle::{Call, Msg};
use super::*;
use crate::meta_io::{read_superblock, ChannelIo, MemBase};
use crate::shared::Failure;

const MIB: u64 = 1 << 20;

fn info(name: &str, sb: &Superblock) -> BdevInfo {
    BdevInfo {
        name: name.into(),
        product_name: "Raid Volume".into(),
        block_size: sb.block_size,
        capacity: Capacity::new(sb.raid_blocks),
        io_types: IoTypes { read: true, write: true, flush: true, unmap: false, write_zeroes: false },
        driver: "raid",
        driver_specific: None,
    }
}

fn new_sb(n: usize, base_bytes: u64) -> Superblock {
    let uuids: Vec<Uuid> = (0..n).map(|_| random_uuid()).collect();
    Superblock::create("r", RaidLevel::Raid1, 0, 512, random_uuid(), &uuids, &vec![base_bytes; n], true)
        .unwrap()
}

fn fast() -> OwnerOptions {
    OwnerOptions {
        clear_period: Duration::from_millis(20),
        process_window_bytes: 256 << 10,
        checkpoint_bytes: MIB,
        checkpoint_interval: Duration::from_secs(60),
        idle_park: Duration::from_millis(5),
        ..OwnerOptions::default()
    }
}

fn mem_member(i: usize, bytes: u64) -> Option<Member> {
    Some(Member { name: format!("m{i}"), bdev: None, io: Box::new(MemBase::new(bytes)) })
}

/// A raid1 of `n` bases in memory, started (formatted).
fn mem_raid(n: usize, base_bytes: u64) -> Owner {
    let sb = new_sb(n, base_bytes);
    let shared = new_shared(info("r", &sb), &sb, true);
    let members = (0..n).map(|i| mem_member(i, base_bytes)).collect();
    let mut o = Owner::new(shared, members, sb, true, fast());
    o.start().unwrap();
    o
}

fn io(o: &mut Owner, slot: usize) -> &mut dyn BaseIo {
    o.member_mut(slot).unwrap().io.as_mut()
}

/// raid1's write path, synchronously: intent, durable bits, every base taking writes.
fn write(o: &mut Owner, offset: u64, data: &[u8]) {
    let map = o.shared().clone();
    let map = map.intent.as_ref().unwrap();
    let t = map.begin_write(offset, data.len() as u64);
    if !map.is_durable(&t) {
        o.persist_bitmap();
    }
    assert!(map.is_durable(&t));
    let layout = o.shared().layout();
    for (slot, v) in layout.slots.iter().enumerate() {
        if v.state.takes_writes() {
            io(o, slot).write_at(layout.data_offset + offset, data).unwrap();
        }
    }
    map.end_write(&t);
}

fn data(o: &mut Owner, slot: usize) -> Vec<u8> {
    let sb = o.superblock().clone();
    let mut v = vec![0; sb.raid_bytes() as usize];
    io(o, slot).read_at(sb.data_offset, &mut v).unwrap();
    v
}

fn run_process(o: &mut Owner) {
    let mut n = 0;
    while o.process_running() {
        o.tick();
        n += 1;
        assert!(n < 100_000, "process does not end");
    }
}

#[test]
fn a_new_raid_is_formatted_unclean_and_stops_clean() {
    let mut o = mem_raid(2, 8 * MIB);
    for slot in 0..2 {
        let sb = read_superblock(io(&mut o, slot)).unwrap().unwrap();
        assert_eq!((sb.seq, sb.slot as usize, sb.clean), (1, slot, false));
    }
    assert_eq!(o.shared().layout().slots.iter().filter(|s| s.state == SlotState::Active).count(), 2);
    assert_eq!(o.shared().epoch(), 1);
    write(&mut o, 3 * 65536, &[5; 4096]);
    assert_eq!(o.shared().counters.bitmap_writes.load(Ordering::Relaxed), 2);
    o.stop().unwrap();
    for slot in 0..2 {
        let sb = read_superblock(io(&mut o, slot)).unwrap().unwrap();
        assert!(sb.clean && sb.seq == 2);
        let map = IntentMap::new(sb.raid_bytes(), sb.bitmap_chunk_bytes, true);
        assert_eq!(meta_io::load_bitmap(io(&mut o, slot), &sb, &map).unwrap(), 0);
        assert!(map.is_set(3) && map.set_count() == 1, "the bit is on every base");
    }
}

#[test]
fn a_failure_is_durable_before_the_layout_drops_the_base() {
    let mut o = mem_raid(2, 8 * MIB);
    let epoch = o.shared().epoch();
    o.shared().failures.push(Failure { slot: 1, errno: libc::EIO }).unwrap();
    o.handle_failures();
    assert_eq!(o.shared().layout().slots[1].state, SlotState::Failed);
    assert!(o.shared().epoch() > epoch);
    let sb = read_superblock(io(&mut o, 0)).unwrap().unwrap();
    assert_eq!(sb.slots[1].state, SlotState::Failed);
    assert_eq!(o.shared().counters.base_failures.load(Ordering::Relaxed), 1);
    // Slot 1's own superblock was not written: it still says Active, with an older sequence.
    let old = read_superblock(io(&mut o, 1)).unwrap().unwrap();
    assert!(old.seq < sb.seq && old.slots[1].state == SlotState::Active);
    // The last in-sync base cannot be removed; the failed one can.
    assert!(matches!(o.remove_base("m0"), Err(RaidError::InvalidParam { field: "name", .. })));
    o.remove_base("m1").unwrap();
}

#[test]
fn a_returning_base_copies_only_what_it_missed() {
    let bytes = 16 * MIB;
    let mut o = mem_raid(2, bytes);
    write(&mut o, 0, &vec![1; 2 * MIB as usize]);
    // Idle for two passes: the bits clear, so they do not count as missed later.
    std::thread::sleep(Duration::from_millis(25));
    o.tick();
    std::thread::sleep(Duration::from_millis(25));
    o.tick();
    assert_eq!(o.shared().intent.as_ref().unwrap().set_count(), 0);
    o.shared().failures.push(Failure { slot: 1, errno: libc::EIO }).unwrap();
    o.tick();
    let returning = o.remove_base("m1").unwrap();
    // Degraded writes: three chunks' worth of 4 KiB writes plus one 128 KiB write.
    for off in [0, 5 * 65536, 9 * 65536 + 4096] {
        write(&mut o, off, &[2; 4096]);
    }
    write(&mut o, 4 * MIB, &[3; 131072]);
    std::thread::sleep(Duration::from_millis(45));
    o.tick();
    assert_eq!(o.shared().intent.as_ref().unwrap().set_count(), 5, "no clearing while degraded");
    let slot = o.add_base(returning).unwrap();
    assert_eq!(slot, 1);
    assert_eq!(o.shared().layout().slots[1].state, SlotState::Rebuilding);
    assert_eq!(o.shared().process.kind.load(Ordering::Relaxed), 1, "partial");
    run_process(&mut o);
    assert_eq!(o.shared().counters.rebuild_bytes_copied.load(Ordering::Relaxed), 5 * 65536);
    assert_eq!(o.shared().counters.rebuilds_completed.load(Ordering::Relaxed), 1);
    assert_eq!(o.shared().layout().slots[1].state, SlotState::Active);
    assert!(data(&mut o, 0) == data(&mut o, 1));
    let sb = read_superblock(io(&mut o, 1)).unwrap().unwrap();
    assert_eq!(sb.slots[1].state, SlotState::Active);
}

#[test]
fn a_new_base_gets_everything_and_foreign_or_small_bases_are_refused() {
    let bytes = 8 * MIB;
    let mut o = mem_raid(2, bytes);
    write(&mut o, MIB, &[9; 8192]);
    o.shared().failures.push(Failure { slot: 0, errno: libc::EIO }).unwrap();
    o.tick();
    o.remove_base("m0").unwrap();
    let small = Member { name: "s".into(), bdev: None, io: Box::new(MemBase::new(4 * MIB)) };
    let e = o.add_base(small).err().unwrap();
    assert!(matches!(e, RaidError::InvalidParam { field: "base_bdev", .. }), "{e}");
    // A base of another raid is refused.
    let mut other = mem_raid(2, bytes);
    let foreign = other.members[0].take().unwrap();
    let e = o.add_base(Member { name: "f".into(), ..foreign }).err().unwrap();
    assert!(e.to_string().contains("another raid"), "{e}");
    let fresh = Member { name: "n".into(), bdev: None, io: Box::new(MemBase::new(bytes)) };
    assert_eq!(o.add_base(fresh).unwrap(), 0);
    assert_eq!(o.shared().process.kind.load(Ordering::Relaxed), 2, "full");
    run_process(&mut o);
    let raid = o.superblock().raid_bytes();
    assert_eq!(o.shared().counters.rebuild_bytes_copied.load(Ordering::Relaxed), raid);
    assert!(data(&mut o, 0) == data(&mut o, 1));
}

/// Beside guest requests in flight on the raid's channels, a rebuild step copies only its
/// share, in requests of one unit, then rests; with none it copies its whole window.
#[test]
fn a_rebuild_beside_guest_io_copies_its_share_and_rests_and_its_window_without() {
    let bytes = 8 * MIB;
    let mut o = mem_raid(2, bytes);
    replace_with_new_base(&mut o, 1, 1, bytes);
    let copied = |o: &Owner| o.shared().counters.rebuild_bytes_copied.load(Ordering::Relaxed);
    let guest = o.shared().register_channel();
    guest.set_in_flight(32);
    // 32 requests in flight on a channel that completed none: taken for 4 KiB each.
    assert_eq!(o.shared().guest_requests().bytes(o.shared()).window_bytes(), 32 * 4096);
    let share = o.process.as_ref().unwrap().0.window(32 * 4096);
    let full = o.process.as_ref().unwrap().0.window(0);
    assert!(share.requests as u64 * share.request_bytes < full.requests as u64 * full.request_bytes);
    assert!(share.request_bytes <= crate::rebuild::SHARE_UNIT);
    o.tick();
    assert_eq!(copied(&o), share.requests as u64 * share.request_bytes, "its share beside the guest");
    assert!(o.throttled_until.is_some(), "it rests after a step beside the guest");
    assert!(!o.busy());
    // The guest's requests end (and the rest is over): the next step takes the whole window.
    guest.set_in_flight(0);
    o.throttled_until = None;
    let before = copied(&o);
    o.tick();
    assert_eq!(copied(&o) - before, full.requests as u64 * full.request_bytes, "the whole window");
    assert!(o.throttled_until.is_none(), "no rest without guest I/O");
    o.shared().unregister_channel(&guest);
    run_process(&mut o);
    assert!(data(&mut o, 0) == data(&mut o, 1));
}

/// Slot `slot`'s base fails and is removed; `mib` MiB are written degraded; a new base (a
/// full rebuild) is added in its place.
fn replace_with_new_base(o: &mut Owner, slot: usize, mib: u64, bytes: u64) {
    o.shared().failures.push(Failure { slot, errno: libc::EIO }).unwrap();
    o.tick();
    o.remove_base(&format!("m{slot}")).unwrap();
    write(o, 0, &vec![4; (mib * MIB) as usize]);
    o.add_base(Member { name: "new".into(), bdev: None, io: Box::new(MemBase::new(bytes)) }).unwrap();
}

#[test]
fn a_rebuild_resumes_from_its_checkpoint_after_a_crash() {
    let bytes = 16 * MIB;
    let mut o = mem_raid(2, bytes);
    replace_with_new_base(&mut o, 1, 12, bytes);
    // Copy a few windows (the checkpoint is persisted every MiB), then "crash".
    for _ in 0..14 {
        o.tick();
    }
    let mut bases: Vec<MemBase> = Vec::new();
    for slot in 0..2 {
        let mut m = MemBase::new(bytes);
        io(&mut o, slot).read_at(0, &mut m.image).unwrap();
        bases.push(m);
    }
    drop(o);
    let sbs: Vec<Superblock> = bases.iter_mut().map(|b| read_superblock(b).unwrap().unwrap()).collect();
    let newest = sbs.iter().max_by_key(|s| s.seq).unwrap().clone();
    let rec = &newest.slots[1];
    assert_eq!(rec.state, SlotState::Rebuilding);
    assert!(!rec.rebuild_partial);
    let resumed_at = rec.rebuild_offset;
    assert!(resumed_at >= 2 * MIB && resumed_at < newest.raid_bytes(), "{resumed_at}");
    assert!(!newest.clean);
    // Reassembly: the bases by slot, the newest superblock.
    let shared = new_shared(info("r", &newest), &newest, true);
    let members = bases
        .into_iter()
        .enumerate()
        .map(|(i, b)| Some(Member { name: format!("m{i}"), bdev: None, io: Box::new(b) as Box<dyn BaseIo> }))
        .collect();
    let mut o = Owner::new(shared, members, newest, true, fast());
    o.start().unwrap();
    run_process(&mut o);
    let copied = o.shared().counters.rebuild_bytes_copied.load(Ordering::Relaxed);
    let raid = o.superblock().raid_bytes();
    // The resync of the unclean stop copies the set chunks (12 MiB written) to slot 1 too;
    // the rebuild itself only what lies past the checkpoint.
    assert_eq!(copied, 12 * MIB + (raid - resumed_at));
    assert!(data(&mut o, 0) == data(&mut o, 1));
    assert_eq!(o.superblock().slots[1].state, SlotState::Active);
}

#[test]
fn an_unclean_stop_resyncs_the_set_chunks_from_the_first_base() {
    let bytes = 8 * MIB;
    let mut o = mem_raid(3, bytes);
    write(&mut o, 0, &[1; 4096]);
    // A crash with a write in flight: it reached base 0 only.
    let map = o.shared().clone();
    let t = map.intent.as_ref().unwrap().begin_write(2 * MIB, 4096);
    o.persist_bitmap();
    let off = o.superblock().data_offset + 2 * MIB;
    io(&mut o, 0).write_at(off, &[7; 4096]).unwrap();
    let _ = t;
    let sb = o.superblock().clone();
    let members: Vec<Option<Member>> = o.members.iter_mut().map(|m| m.take()).collect();
    drop(o);
    let shared = new_shared(info("r", &sb), &sb, true);
    let mut o = Owner::new(shared, members, sb, true, fast());
    o.start().unwrap();
    assert_eq!(o.shared().process.kind.load(Ordering::Relaxed), 3);
    let l = o.shared().layout();
    assert_eq!(l.slots[0].state, SlotState::Active);
    assert!(l.slots[1..].iter().all(|s| s.state == SlotState::Rebuilding), "reads only from the source");
    run_process(&mut o);
    assert_eq!(o.shared().counters.rebuild_bytes_copied.load(Ordering::Relaxed), 2 * 2 * 65536);
    assert!(o.shared().layout().slots.iter().all(|s| s.state == SlotState::Active));
    let d0 = data(&mut o, 0);
    assert!(d0 == data(&mut o, 1) && d0 == data(&mut o, 2));
    assert_eq!(d0[2 * MIB as usize], 7);
}

/// raid1's write path as a channel does it, over the layout's bdevs, on this thread.
struct Writer {
    shared: Arc<RaidShared>,
    chans: Vec<Option<Box<dyn fp_bdev::IoChannel>>>,
}

impl Writer {
    fn new(shared: Arc<RaidShared>) -> Writer {
        Writer { shared, chans: Vec::new() }
    }

    fn write(&mut self, offset: u64, buf: &mut [u8]) {
        let map = self.shared.intent.as_ref().unwrap();
        let t = map.begin_write(offset, buf.len() as u64);
        while !map.is_durable(&t) {
            self.shared.wake_owner();
            std::thread::yield_now();
        }
        let layout = self.shared.layout();
        self.chans.resize_with(layout.slots.len(), || None);
        for (slot, v) in layout.slots.iter().enumerate() {
            if !v.state.takes_writes() {
                continue;
            }
            // Opened when first needed (the bases' bdevs do not change in this test).
            let bdev = v.bdev.as_ref().unwrap();
            let ch = self.chans[slot].get_or_insert_with(|| bdev.open_channel().unwrap());
            let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
            let req = fp_bdev::IoRequest {
                tag: 0,
                op: fp_bdev::IoOp::Write,
                offset: layout.data_offset + offset,
                len: buf.len() as u64,
                // SAFETY: the test keeps the buffers and their iovecs until the request completes.
                iov: unsafe { Iovecs::from_raw(&iov, 1) },
            };
            ch.submit(&req).unwrap();
            let mut done = false;
            while !done {
                ch.poll(&mut |_, s| {
                    assert_eq!(s, fp_bdev::IoStatus::Success);
                    done = true;
                });
            }
        }
        map.end_write(&t);
    }
}

fn ram(name: &str, bytes: u64) -> Bdev {
    Arc::new(RamDevice::new(name, 512, bytes / 512).unwrap())
}

fn read_all(b: &Bdev, offset: u64, len: u64) -> Vec<u8> {
    let mut io = ChannelIo::open(b.clone()).unwrap();
    let mut v = vec![0; len as usize];
    io.read_at(offset, &mut v).unwrap();
    v
}

/// A raid1 over two RAM bdevs named `n0` and `n1`, started degraded on the first only.
struct RamRaid {
    b0: Bdev,
    b1: Bdev,
    sb: Superblock,
    shared: Arc<RaidShared>,
    handle: OwnerHandle,
}

fn ram_raid(n: &str, bytes: u64, opts: OwnerOptions) -> RamRaid {
    let (b0, b1) = (ram(&format!("{n}0"), bytes), ram(&format!("{n}1"), bytes));
    let uuids = [random_uuid(), Uuid::NIL];
    let sb = Superblock::create(n, RaidLevel::Raid1, 0, 512, random_uuid(), &uuids, &[bytes, bytes], true)
        .unwrap();
    let shared = new_shared(info(n, &sb), &sb, true);
    let bases = vec![Some(BaseSpec { name: format!("{n}0"), bdev: b0.clone() }), None];
    let handle = OwnerHandle::spawn(shared.clone(), bases, Some(sb.clone()), opts).unwrap();
    RamRaid { b0, b1, sb, shared, handle }
}

#[test]
fn writers_on_threads_during_a_full_rebuild_end_identical() {
    let bytes = 32 * MIB;
    let RamRaid { b0, b1, sb, shared, handle: h } = ram_raid("b", bytes, fast());
    let raid = sb.raid_bytes();
    let mut w = Writer::new(shared.clone());
    for i in 0..raid / MIB {
        w.write(i * MIB, &mut vec![i as u8 + 1; MIB as usize]);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (shared, stop, written) = (shared.clone(), stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut w = Writer::new(shared);
                let mut x = t + 1;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    // Each thread its own half: overlapping writes are unordered on a mirror.
                    let off = ((x >> 20) % (raid / 2 / 4096)) * 4096 + t * (raid / 2);
                    w.write(off, &mut vec![(x >> 56) as u8; 4096]);
                    written.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    h.set_process_options(128, 0, CopyShare::default()).unwrap();
    assert_eq!(h.add_base("b1".into(), b1.clone(), OWNER_WAIT).unwrap().answered().unwrap().unwrap(), 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    while shared.counters.rebuilds_completed.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "rebuild did not finish");
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(written.load(Ordering::Relaxed) > 0);
    let off = sb.data_offset;
    assert!(read_all(&b0, off, raid) == read_all(&b1, off, raid), "replicas differ after the rebuild");
    assert_eq!(shared.layout().slots[1].state, SlotState::Active);
    let sbh = h.superblock().unwrap();
    h.shutdown(OWNER_WAIT).unwrap().stopped().unwrap().unwrap();
    let mut io0 = ChannelIo::open(b0.clone()).unwrap();
    let on_disk = read_superblock(&mut io0).unwrap().unwrap();
    assert!(on_disk.clean && on_disk.seq == sbh.seq + 1);
}

#[test]
fn a_rebuild_whose_source_fails_continues_from_another_in_sync_base() {
    let bytes = 16 * MIB;
    let mut o = mem_raid(3, bytes);
    replace_with_new_base(&mut o, 2, 8, bytes);
    for _ in 0..6 {
        o.tick();
    }
    // The source (slot 0) fails mid-rebuild; slot 1 takes over from the checkpoint.
    o.shared().failures.push(Failure { slot: 0, errno: libc::EIO }).unwrap();
    run_process(&mut o);
    assert_eq!(o.superblock().slots[0].state, SlotState::Failed);
    assert_eq!(o.superblock().slots[2].state, SlotState::Active);
    assert!(data(&mut o, 1) == data(&mut o, 2));
    let raid = o.superblock().raid_bytes();
    let copied = o.shared().counters.rebuild_bytes_copied.load(Ordering::Relaxed);
    assert!(copied >= raid && copied < raid + 4 * MIB, "{copied}");
}

#[test]
fn dropping_the_owner_mid_rebuild_resumes_at_the_checkpoint_on_respawn() {
    let bytes = 24 * MIB;
    // Slow enough to stop halfway: 64 KiB windows at 40 MB/s, a checkpoint every 1 MiB. No
    // clearing pass before the crash, however slow the machine: the chunks written stay dirty,
    // so the respawn's resync is all of them (a pass between the writes and the add cleared
    // them on a loaded machine).
    let opts = OwnerOptions {
        process_window_bytes: 64 << 10,
        process_max_bandwidth_mb_sec: 40,
        clear_period: Duration::from_secs(3600),
        ..fast()
    };
    let RamRaid { b0, b1, sb, shared, handle: h } = ram_raid("d", bytes, opts);
    let mut w = Writer::new(shared.clone());
    let raid = sb.raid_bytes();
    w.write(0, &mut vec![3; raid as usize]);
    h.add_base("d1".into(), b1.clone(), OWNER_WAIT).unwrap().answered().unwrap().unwrap();
    while shared.process.blocks_done.load(Ordering::Relaxed) * 512 < raid / 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(h); // as a crash: no clean mark
    let newest = [&b0, &b1]
        .iter()
        .map(|b| read_superblock(&mut ChannelIo::open((*b).clone()).unwrap()).unwrap().unwrap())
        .max_by_key(|s| s.seq)
        .unwrap();
    let rec = newest.slots[1].clone();
    assert_eq!(rec.state, SlotState::Rebuilding);
    assert!(rec.rebuild_offset >= 2 * MIB && rec.rebuild_offset < raid, "{}", rec.rebuild_offset);
    assert!(!newest.clean);
    let shared = new_shared(info("d", &newest), &newest, true);
    let bases = vec![
        Some(BaseSpec { name: "d0".into(), bdev: b0.clone() }),
        Some(BaseSpec { name: "d1".into(), bdev: b1.clone() }),
    ];
    let h = OwnerHandle::spawn(shared.clone(), bases, Some(newest.clone()), fast()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while shared.counters.rebuilds_completed.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the resumed rebuild did not finish");
        std::thread::sleep(Duration::from_millis(5));
    }
    let copied = shared.counters.rebuild_bytes_copied.load(Ordering::Relaxed);
    // The unclean stop's resync (the chunks written) plus the rest of the rebuild.
    assert_eq!(copied, raid + (raid - rec.rebuild_offset), "resumed at {}", rec.rebuild_offset);
    h.shutdown(OWNER_WAIT).unwrap().stopped().unwrap().unwrap();
    let off = newest.data_offset;
    assert!(read_all(&b0, off, raid) == read_all(&b1, off, raid));
}

#[test]
fn a_full_rebuild_target_missing_at_assembly_resumes_when_it_returns() {
    let bytes = 16 * MIB;
    let mut o = mem_raid(2, bytes);
    replace_with_new_base(&mut o, 1, 4, bytes);
    for _ in 0..14 {
        o.tick();
    }
    assert!(o.process_running(), "stopped mid-rebuild");
    // "Crash", and assemble from the in-sync base alone: the target keeps its record.
    let sb = read_superblock(io(&mut o, 0)).unwrap().unwrap();
    let (m0, m1) = (o.members[0].take(), o.members[1].take());
    drop(o);
    let rec = sb.slots[1].clone();
    assert_eq!((rec.state, rec.rebuild_partial), (SlotState::Rebuilding, false));
    let at = rec.rebuild_offset;
    assert!(at >= 2 * MIB && at < sb.raid_bytes(), "{at}");
    let shared = new_shared(info("r", &sb), &sb, true);
    let mut o = Owner::new(shared, vec![m0, None], sb.clone(), true, fast());
    o.start().unwrap();
    let on_disk = read_superblock(io(&mut o, 0)).unwrap().unwrap();
    assert_eq!(on_disk.slots[1], rec, "the away target's record (identity, checkpoint) is kept");
    // Written while it is away: below its checkpoint (inside the 4 MiB already marked) and
    // above it.
    write(&mut o, 0, &vec![9; MIB as usize]);
    write(&mut o, 12 * MIB, &vec![8; MIB as usize]);
    let slot = o.add_base(m1.unwrap()).unwrap();
    assert_eq!(slot, 1);
    run_process(&mut o);
    let copied = o.shared().counters.rebuild_bytes_copied.load(Ordering::Relaxed);
    let raid = o.superblock().raid_bytes();
    // The marked chunks below the checkpoint (the 4 MiB written since slot 1 was replaced),
    // then everything past it: not the whole raid again.
    assert_eq!(copied, (4 * MIB).min(at) + (raid - at), "resumed at {at}");
    assert!(data(&mut o, 0) == data(&mut o, 1));
    assert_eq!(o.superblock().slots[1].state, SlotState::Active);
}

/// A raid1 "w" over two bases in sync, "w0" (an error bdev over RAM, for injections) and
/// "w1", with its owner thread.
fn two_in_sync() -> (Arc<fp_bdev::ErrorDevice>, Arc<RaidShared>, OwnerHandle) {
    let bytes = 8 * MIB;
    let w0 = Arc::new(fp_bdev::ErrorDevice::new("w0", ram("m0", bytes)).unwrap());
    let w1 = ram("w1", bytes);
    let uuids = [random_uuid(), random_uuid()];
    let sb = Superblock::create("w", RaidLevel::Raid1, 0, 512, random_uuid(), &uuids, &[bytes, bytes], true)
        .unwrap();
    let shared = new_shared(info("w", &sb), &sb, true);
    let bases = vec![
        Some(BaseSpec { name: "w0".into(), bdev: w0.clone() }),
        Some(BaseSpec { name: "w1".into(), bdev: w1 }),
    ];
    let h = OwnerHandle::spawn(shared.clone(), bases, Some(sb), fast()).unwrap();
    (w0, shared, h)
}

/// Holds the owner in a call until the returned sender is dropped; returns once it does.
fn hold_owner(h: &OwnerHandle) -> mpsc::Sender<()> {
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (held_tx, held_rx) = mpsc::channel();
    let call: Call = Box::new(move |_| {
        held_tx.send(()).unwrap();
        let _ = release_rx.recv();
    });
    h.tx.send(Msg::Call(call)).unwrap();
    h.shared.wake_owner();
    held_rx.recv().unwrap();
    release_tx
}

/// A removal the owner does not take up within its bound (it is busy with another call) is
/// withdrawn: its leaving mark is cleared, and it never runs, even once the owner is free.
#[test]
fn a_removal_not_taken_up_within_its_bound_is_withdrawn_and_never_runs() {
    let (_w0, shared, h) = two_in_sync();
    let hold = hold_owner(&h);
    shared.set_leaving("w1", true);
    let r = h.remove_base("w1", Duration::from_millis(20)).unwrap();
    assert!(matches!(r, CallWait::Withdrawn), "the owner was held: the removal cannot have run");
    assert!(!shared.is_leaving("w1"));
    drop(hold);
    // Taken up after the withdrawn call: the removal did not run.
    let sb = h.superblock().unwrap();
    assert_eq!(sb.slots[1].state, SlotState::Active);
    assert_eq!(shared.layout().slots[1].name.as_deref(), Some("w1"));
    h.shutdown(OWNER_WAIT).unwrap().stopped().unwrap().unwrap();
}

/// A removal the owner took up but has not finished within its bound (its superblock write
/// to the other base is held, not Busy) is under way: the caller gets the receiver of its
/// answer, which comes with the removed base once the write ends.
#[test]
fn a_removal_still_in_progress_at_its_bound_answers_later() {
    let (w0, shared, h) = two_in_sync();
    let write = 1;
    let pending = fp_bdev::Injection {
        error_type: fp_bdev::ErrorType::Pending,
        num: u64::MAX,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    w0.inject(&[write], pending).unwrap();
    // The bound only decides between the two answers; the owner taking the removal up late
    // (a loaded machine) gives a withdrawn one, with nothing changed: asked again then.
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        shared.set_leaving("w1", true);
        match h.remove_base("w1", Duration::from_millis(200)).unwrap() {
            CallWait::UnderWay(rx) => break rx,
            CallWait::Withdrawn => {
                assert_eq!(shared.layout().slots[1].state, SlotState::Active);
                assert!(Instant::now() < deadline, "the owner never took the removal up");
            }
            CallWait::Answered(r) => {
                panic!("answered while its superblock write is held: {:?}", r.map(|_| ()))
            }
        }
    };
    // Held on w0's superblock write: not done, the layout unchanged.
    assert!(matches!(answer.try_recv(), Err(mpsc::TryRecvError::Empty)));
    assert_eq!(shared.layout().slots[1].name.as_deref(), Some("w1"));
    w0.clear();
    w0.resume_pending();
    let removed = answer.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!(removed.unwrap().info().name, "w1");
    assert!(!shared.is_leaving("w1"));
    let layout = shared.layout();
    assert_eq!((layout.slots[1].state, layout.slots[1].name.as_deref()), (SlotState::Failed, None));
    assert_eq!(shared.counters.base_failures.load(Ordering::Relaxed), 0, "asked for, not a failure");
    h.shutdown(OWNER_WAIT).unwrap().stopped().unwrap().unwrap();
}

/// Runners started by the owner, kept for the test's thread to poll (as a reactor would).
fn test_reactors() -> (Reactors, Arc<std::sync::Mutex<Vec<fp_bdev::module::BackgroundStart>>>) {
    let started = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = started.clone();
    let reactors = Reactors(Arc::new(move |start| {
        keep.lock().unwrap().push(start);
        true
    }));
    (reactors, started)
}

fn ram_member(name: &str, b: &Bdev) -> Option<Member> {
    Some(Member {
        name: name.into(),
        bdev: Some(b.clone()),
        io: Box::new(ChannelIo::open(b.clone()).unwrap()),
    })
}

/// A full rebuild whose copies run on a runner (polled here, as on a reactor) over RAM bdevs:
/// the target ends identical, every byte counted once; beside a guest moving 128 KiB a round
/// the runner copies no more than its share, and with no guest it fills its buffers.
#[test]
fn a_rebuild_on_a_reactor_copies_everything_keeping_its_share_beside_guest_io() {
    use fp_bdev::module::{BackgroundJob, BackgroundPoll};
    let bytes = 8 * MIB;
    let (b0, b1) = (ram("a0", bytes), ram("a1", bytes));
    let sb = new_sb(2, bytes);
    let shared = new_shared(info("r", &sb), &sb, true);
    let (reactors, started) = test_reactors();
    let options = OwnerOptions { reactors: Some(reactors), process_window_bytes: MIB, ..fast() };
    let members = vec![ram_member("a0", &b0), ram_member("a1", &b1)];
    let mut o = Owner::new(shared.clone(), members, sb, true, options);
    o.start().unwrap();
    write(&mut o, 0, &vec![0x6Du8; bytes as usize / 2]);
    o.shared().failures.push(Failure { slot: 1, errno: libc::EIO }).unwrap();
    o.tick();
    o.remove_base("a1").unwrap();
    let fresh = ram("a2", bytes);
    o.add_base(ram_member("a2", &fresh).unwrap()).unwrap();

    let guest = shared.register_channel();
    guest.set_in_flight(32);
    let (chunk, slots) = {
        let c = &o.process.as_ref().unwrap().0;
        (c.chunk_bytes(), c.runner_slots_for_window())
    };
    // The guest takes 128 KiB a round; the runner polls twice a round here: the first poll
    // earns weight / (100 - weight) of them in cost, a copied byte costing `COPY_BYTE_COST`
    // of the guest's (the floor gives nothing in these rounds: it waits `FLOOR_ROUNDS` short
    // ones).
    let w = u64::from(fp_bdev::copy_share::DEFAULT_COPY_WEIGHT);
    let per_round = (32 * 4096) * w / (100 - w) / fp_bdev::copy_share::COPY_BYTE_COST;
    let mut guest_bytes = 0;
    const SHARE_ROUNDS: u64 = 40;
    let copied = |o: &Owner| o.shared().counters.rebuild_bytes_copied.load(Ordering::Relaxed);
    let unshared = |o: &Owner| o.shared().counters.rebuild_bytes_unshared.load(Ordering::Relaxed);
    let mut runners: Vec<Box<dyn BackgroundJob>> = Vec::new();
    let mut most = 0;
    let mut rounds = 0;
    let mut link = None;
    while o.process_running() {
        rounds += 1;
        assert!(rounds < 1_000_000, "the rebuild does not end");
        if rounds == SHARE_ROUNDS {
            let beside = copied(&o);
            assert!(beside > 0, "the rebuild progressed beside the guest");
            assert!(beside <= SHARE_ROUNDS * per_round + chunk, "{beside} bytes beside the guest");
            assert_eq!(unshared(&o), 0, "every order beside the guest on the share's credit");
            guest.set_in_flight(0);
            most = 0;
        }
        if rounds < SHARE_ROUNDS {
            guest_bytes += 32 * 4096;
            guest.set_bytes(guest_bytes);
        }
        o.tick();
        if link.is_none() {
            link = o.process.as_ref().and_then(|(c, _)| c.link().cloned());
        }
        runners.extend(started.lock().unwrap().drain(..).map(|start| start()));
        // The runner's view: what it holds after taking the orders of this round.
        for r in runners.iter_mut() {
            r.poll();
        }
        // Orders the runner holds: sent, taken, not sent back.
        let held = o
            .process
            .as_ref()
            .and_then(|(c, _)| c.link().map(|l| c.ordered.len() - l.queued().0 - l.queued().1))
            .unwrap_or(0);
        most = most.max(held);
        runners.retain_mut(|r| r.poll() != BackgroundPoll::Finished);
    }
    assert!(rounds > SHARE_ROUNDS);
    assert_eq!(most, slots, "an idle guest leaves the runner all its buffers");
    let raid = o.superblock().raid_bytes();
    assert_eq!(shared.counters.rebuild_bytes_copied.load(Ordering::Relaxed), raid, "each byte once");
    // Beside the guest only the share's credit (and the floor); the rest once it was quiet.
    let beside = unshared(&o);
    assert!(beside > 0 && beside < raid, "{beside} of {raid} bytes started with no limit");
    let off = o.superblock().data_offset;
    assert!(read_all(&b0, off, raid) == read_all(&fresh, off, raid), "the target differs");
    // The runner wakes the owner as half its window comes back or when it runs dry, not for
    // every chunk.
    let wakes = link.expect("the rebuild ran on the runner").owner_wakes();
    let chunks = raid.div_ceil(chunk);
    assert!(wakes > 0 && wakes * 4 <= chunks, "{wakes} wake-ups for {chunks} chunks");
    for _ in 0..10 {
        runners.retain_mut(|r| r.poll() != BackgroundPoll::Finished);
    }
    assert!(runners.is_empty(), "the runner ends with the rebuild");
    shared.unregister_channel(&guest);
}

/// A rebuild held to a speed limit on a runner sends its orders a chunk at a time as the
/// limit allows them, not its window at once: the runner's rounds then carry the copy evenly
/// beside a guest instead of in bursts.
#[test]
fn a_limited_rebuild_on_a_runner_orders_a_chunk_at_a_time() {
    use crate::rebuild::{CopyGeometry, Step};
    use crate::rebuild_io::CopyLink;
    let bytes = 8 * MIB;
    let sb = new_sb(2, bytes);
    let shared = new_shared(info("r", &sb), &sb, true);
    let intent = shared.intent.as_ref().unwrap();
    let geo = CopyGeometry {
        data_offset: 0,
        data_bytes: bytes,
        window_bytes: MIB,
        max_mb_sec: 1,
        share: CopyShare::default(),
    };
    let mut c = Copier::new(ProcessKind::Full, 0, vec![1], 0, intent, geo);
    let (chunk, slots) = (c.chunk_bytes(), c.runner_slots_for_window());
    assert!(slots > 1, "a window of {slots} orders");
    let link = CopyLink::new(slots, CopyShare::default(), shared.clone());
    c.run_on(link.clone(), slots);
    let mut no_bases: Vec<Option<Box<dyn BaseIo>>> = Vec::new();
    assert_eq!(c.step(&mut no_bases, intent, 0), (0, Step::Working));
    assert_eq!(link.queued().0, 1, "one chunk's order, not the window's");
    // The chunk out counts as copied: the next order waits for its time at 1 MB/s.
    match c.step(&mut no_bases, intent, 0) {
        (0, Step::Throttled(until)) => {
            let wait = until - Instant::now();
            let due = Duration::from_secs_f64(chunk as f64 / 1e6);
            assert!(wait <= due && wait > due / 2, "{wait:?} for a chunk due in {due:?}");
        }
        s => panic!("{s:?}"),
    }
    assert_eq!(link.queued().0, 1);
}
