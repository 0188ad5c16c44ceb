//! The module's data path and control operations, in process over RAM bases.

use std::sync::Arc;

use fp_bdev::conformance::{self, read_range, write_range, Storage};
use fp_bdev::{Bdev, BlockDevice, BlockExtent, IoOp, IoStatus, RamDevice};

use super::{LvStore, LvolDevice};
use crate::{StoreOptions, Uuid};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn ram(size: u64) -> Bdev {
    Arc::new(RamDevice::new("base", 512, size / 512).unwrap())
}

fn store_on(base: Bdev, cluster: u64) -> Arc<LvStore> {
    let opts = StoreOptions {
        name: "lvs".into(),
        uuid: super::new_uuid(),
        cluster_size: cluster,
        block_size: base.info().block_size,
        area_pages: None,
    };
    LvStore::create(base, "base", &opts).unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn free(lvs: &LvStore) -> u64 {
    lvs.info().unwrap().free_clusters
}

#[test]
fn thin_and_thick_volumes_pass_the_conformance_suite() {
    for thin in [true, false] {
        // Small clusters, so the suite's requests cross cluster boundaries.
        conformance::run_suite(
            &|| {
                let lvs = store_on(ram(8 * MIB), 16 * KIB);
                let dev: Arc<dyn BlockDevice> = lvs.create_volume("v", 2 * MIB, thin).unwrap();
                // The store stays open as long as the device: its owner thread holds the store.
                std::mem::forget(lvs);
                dev
            },
            Storage::Keeps,
        );
    }
}

#[test]
fn thin_volumes_allocate_on_first_write_and_read_zeroes_elsewhere() {
    let lvs = store_on(ram(8 * MIB), 64 * KIB);
    let before = free(&lvs);
    let v = lvs.create_volume("v", 4 * MIB, true).unwrap();
    assert_eq!(free(&lvs), before, "a thin volume takes no cluster at creation");
    let mut ch = v.open_channel().unwrap();
    // Crosses the boundary between clusters 1 and 2.
    let data = pattern(7, 8 * 1024);
    write_range(&mut *ch, 128 * KIB - 4096, &data);
    assert_eq!(free(&lvs), before - 2);
    assert_eq!(read_range(&mut *ch, 128 * KIB - 4096, data.len()), data);
    // The rest of both new clusters reads zeroes, as does an untouched one.
    assert!(read_range(&mut *ch, 64 * KIB, 60 * 1024).iter().all(|&b| b == 0));
    assert!(read_range(&mut *ch, MIB, 64 * 1024).iter().all(|&b| b == 0));
    let thick = lvs.create_volume("t", MIB, false).unwrap();
    assert_eq!(free(&lvs), before - 2 - 16);
    drop(thick);
}

#[test]
fn snapshots_and_clones_keep_their_own_data() {
    let lvs = store_on(ram(16 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", MIB, true).unwrap();
    let mut ch = v.open_channel().unwrap();
    let a = pattern(1, MIB as usize);
    write_range(&mut *ch, 0, &a);
    let snap = lvs.snapshot(&v.uuid(), "s").unwrap();
    // Overwrite part of one cluster: the volume copies it first.
    let b = pattern(2, 4096);
    write_range(&mut *ch, 70 * KIB, &b);
    let mut expect = a.clone();
    expect[70 * 1024..74 * 1024].copy_from_slice(&b);
    assert_eq!(read_range(&mut *ch, 0, MIB as usize), expect);
    let mut sch = snap.open_channel().unwrap();
    assert_eq!(read_range(&mut *sch, 0, MIB as usize), a, "the snapshot keeps the old data");
    // The snapshot refuses writes.
    let st = write_status(&mut *sch, 0, &b);
    assert_eq!(st, IoStatus::Error(libc::EROFS));
    let clone = lvs.clone_snapshot(&snap.uuid(), "c").unwrap();
    let mut cch = clone.open_channel().unwrap();
    assert_eq!(read_range(&mut *cch, 0, MIB as usize), a);
    let c = pattern(3, 8192);
    write_range(&mut *cch, 0, &c);
    let mut cexpect = a.clone();
    cexpect[..8192].copy_from_slice(&c);
    assert_eq!(read_range(&mut *cch, 0, MIB as usize), cexpect);
    assert_eq!(read_range(&mut *sch, 0, MIB as usize), a);
    assert_eq!(read_range(&mut *ch, 0, MIB as usize), expect);
    // A snapshot with clones is not deleted.
    assert!(lvs.check_delete(&snap.uuid()).is_err());
}

fn write_status(ch: &mut dyn fp_bdev::IoChannel, offset: u64, data: &[u8]) -> IoStatus {
    let mut buf = conformance::IoBuf::new(data.len(), true);
    buf.bytes_mut().copy_from_slice(data);
    let iov = [buf.iovec()];
    // SAFETY: `buf` and `iov` outlive the request, which is polled to its end here.
    unsafe { ch.submit(&conformance::rw(9, IoOp::Write, offset, &iov)).unwrap() };
    conformance::poll_until(ch, 1)[0].1
}

fn command(ch: &mut dyn fp_bdev::IoChannel, op: IoOp, offset: u64, len: u64) -> IoStatus {
    ch.submit(&conformance::cmd(5, op, offset, len)).unwrap();
    conformance::poll_until(ch, 1)[0].1
}

#[test]
fn whole_cluster_discards_free_thin_clusters_and_partial_ones_do_not() {
    let lvs = store_on(ram(8 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", MIB, true).unwrap();
    let mut ch = v.open_channel().unwrap();
    write_range(&mut *ch, 0, &pattern(4, 256 * 1024));
    let used = free(&lvs);
    assert_eq!(command(&mut *ch, IoOp::Discard, 64 * KIB, 128 * KIB), IoStatus::Success);
    assert_eq!(free(&lvs), used + 2);
    assert!(read_range(&mut *ch, 64 * KIB, 128 * 1024).iter().all(|&b| b == 0));
    assert_eq!(command(&mut *ch, IoOp::WriteZeroes, 4096, 4096), IoStatus::Success);
    assert_eq!(free(&lvs), used + 2, "a partial write-zeroes keeps its cluster");
    assert!(read_range(&mut *ch, 4096, 4096).iter().all(|&b| b == 0));
    assert_eq!(read_range(&mut *ch, 0, 4096), pattern(4, 4096));
    // Write-zeroes of a whole clone cluster whose parent has data keeps zeroes, not the parent's.
    let snap = lvs.snapshot(&v.uuid(), "s").unwrap();
    assert_eq!(command(&mut *ch, IoOp::WriteZeroes, 0, 64 * KIB), IoStatus::Success);
    assert!(read_range(&mut *ch, 0, 64 * 1024).iter().all(|&b| b == 0));
    let mut sch = snap.open_channel().unwrap();
    assert_eq!(read_range(&mut *sch, 0, 4096)[..], [pattern(4, 4096)[..].to_vec()].concat()[..4096]);
}

#[test]
fn a_store_reloads_with_its_volumes_and_data() {
    let base = ram(16 * MIB);
    let (vu, su, a, b);
    {
        let lvs = store_on(base.clone(), 64 * KIB);
        let v = lvs.create_volume("v", MIB, true).unwrap();
        let mut ch = v.open_channel().unwrap();
        a = pattern(9, 512 * 1024);
        write_range(&mut *ch, 0, &a);
        let s = lvs.snapshot(&v.uuid(), "s").unwrap();
        b = pattern(10, 4096);
        write_range(&mut *ch, 0, &b);
        assert_eq!(command(&mut *ch, IoOp::Flush, 0, 0), IoStatus::Success);
        lvs.rename("lvs2").unwrap();
        (vu, su) = (v.uuid(), s.uuid());
        lvs.close();
    }
    let lvs = LvStore::load(base, "base").unwrap().expect("a store");
    assert_eq!(lvs.name(), "lvs2");
    let vols = lvs.volumes().unwrap();
    let v = vols.iter().find(|x| x.uuid == vu).unwrap();
    assert_eq!((v.name.as_str(), v.parent, v.snapshot), ("v", Some(su), false));
    let dev: Arc<LvolDevice> = lvs.device(&vu).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let mut expect = a.clone();
    expect[..4096].copy_from_slice(&b);
    assert_eq!(read_range(&mut *ch, 0, expect.len()), expect);
    let mut sch = lvs.device(&su).unwrap().open_channel().unwrap();
    assert_eq!(read_range(&mut *sch, 0, a.len()), a);
    assert!(LvStore::load(ram(MIB), "empty").unwrap().is_none());
}

#[test]
fn snapshots_taken_under_writes_hold_them_and_lose_none() {
    let lvs = store_on(ram(64 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", 4 * MIB, true).unwrap();
    let dev = v.clone();
    let writer = std::thread::spawn(move || {
        let mut ch = dev.open_channel().unwrap();
        let mut last = vec![0u8; 64];
        for round in 0..400u32 {
            let slot = (round % 64) as usize;
            let data = vec![(round % 251) as u8 + 1; 4096];
            // Every write succeeds, snapshots or not.
            assert_eq!(
                write_status(&mut *ch, slot as u64 * 64 * KIB, &data),
                IoStatus::Success,
                "round {round}"
            );
            last[slot] = data[0];
        }
        last
    });
    let mut snaps: Vec<Uuid> = Vec::new();
    for i in 0..10 {
        snaps.push(lvs.snapshot(&v.uuid(), &format!("s{i}")).unwrap().uuid());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let last = writer.join().unwrap();
    let mut ch = v.open_channel().unwrap();
    for (slot, &byte) in last.iter().enumerate() {
        let got = read_range(&mut *ch, slot as u64 * 64 * KIB, 4096);
        assert!(got.iter().all(|&b| b == byte), "slot {slot}: expected {byte}, read {}", got[0]);
    }
    // Each snapshot is a consistent chain link: the newest holds nothing newer than the volume.
    assert_eq!(lvs.volumes().unwrap().iter().filter(|v| v.snapshot).count(), 10);
}

#[test]
fn resize_grows_and_shrinks_a_volume() {
    let lvs = store_on(ram(16 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", MIB, false).unwrap();
    let before = free(&lvs);
    v.resize(2 * MIB / 512).unwrap();
    assert_eq!(v.info().size_bytes(), 2 * MIB);
    assert_eq!(free(&lvs), before - 16);
    let mut ch = v.open_channel().unwrap();
    write_range(&mut *ch, 2 * MIB - 4096, &pattern(5, 4096));
    drop(ch);
    v.resize(MIB / 512).unwrap();
    assert_eq!(free(&lvs), before);
    assert!(v.resize(1000).is_err(), "not a whole number of clusters");
}

#[test]
fn inflate_and_decouple_copy_the_parents_data_in_and_free_the_parent() {
    let lvs = store_on(ram(32 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", MIB, true).unwrap();
    let mut ch = v.open_channel().unwrap();
    let a = pattern(11, 256 * 1024);
    write_range(&mut *ch, 0, &a);
    let s1 = lvs.snapshot(&v.uuid(), "s1").unwrap();
    let b = pattern(12, 128 * 1024);
    write_range(&mut *ch, 192 * KIB, &b);
    let s2 = lvs.snapshot(&v.uuid(), "s2").unwrap();
    let c = pattern(13, 4096);
    write_range(&mut *ch, 8 * KIB, &c);
    let mut expect = vec![0u8; MIB as usize];
    expect[..a.len()].copy_from_slice(&a);
    expect[192 * 1024..192 * 1024 + b.len()].copy_from_slice(&b);
    expect[8 * 1024..12 * 1024].copy_from_slice(&c);
    assert_eq!(read_range(&mut *ch, 0, MIB as usize), expect);
    let parent = |u: Uuid| lvs.volumes().unwrap().into_iter().find(|x| x.uuid == u).unwrap().parent;
    // Decouple: s2's own clusters come in, s1 becomes the parent; the data does not change.
    lvs.decouple_parent(&v.uuid()).unwrap();
    assert_eq!(parent(v.uuid()), Some(s1.uuid()));
    assert_eq!(read_range(&mut *ch, 0, MIB as usize), expect);
    lvs.check_delete(&s2.uuid()).unwrap();
    lvs.delete_volume(&s2.uuid()).unwrap();
    assert_eq!(read_range(&mut *ch, 0, MIB as usize), expect);
    // Inflate: every cluster its own, no parent; s1 can go and the data stays.
    lvs.inflate(&v.uuid()).unwrap();
    assert_eq!(parent(v.uuid()), None);
    lvs.delete_volume(&s1.uuid()).unwrap();
    let info = lvs.volumes().unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!((info[0].allocated_clusters, info[0].thin), (16, false));
    assert_eq!(read_range(&mut *ch, 0, MIB as usize), expect);
    // Reused clusters (the snapshots') never show through: write something new, read back.
    write_range(&mut *ch, 512 * KIB, &pattern(14, 4096));
    assert_eq!(read_range(&mut *ch, 512 * KIB, 4096), pattern(14, 4096));
    assert!(lvs.inflate(&v.uuid()).is_ok(), "inflating a volume without parent changes nothing");
}

#[test]
fn caller_tags_of_any_value_come_back_unchanged() {
    let lvs = store_on(ram(8 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", MIB, false).unwrap();
    let mut ch = v.open_channel().unwrap();
    // Small tags take the pass-through path, large ones (the top bits the channel uses for
    // itself) the slot path; a request across two clusters always the slot path.
    for (tag, offset) in
        [(7u32, 0u64), (u32::MAX, 8 * KIB), ((1 << 30) + 3, 16 * KIB), (1 << 31, 64 * KIB - 4096)]
    {
        let data = pattern(tag as u8, 8192);
        let mut buf = conformance::IoBuf::new(data.len(), true);
        buf.bytes_mut().copy_from_slice(&data);
        let iov = [buf.iovec()];
        // SAFETY: `buf` and `iov` outlive the request, polled to its end here.
        unsafe { ch.submit(&conformance::rw(tag, IoOp::Write, offset, &iov)).unwrap() };
        assert_eq!(conformance::poll_until(&mut *ch, 1), vec![(tag, IoStatus::Success)]);
        let mut rbuf = conformance::IoBuf::new(data.len(), true);
        let riov = [rbuf.iovec()];
        // SAFETY: as above.
        unsafe { ch.submit(&conformance::rw(tag, IoOp::Read, offset, &riov)).unwrap() };
        assert_eq!(conformance::poll_until(&mut *ch, 1), vec![(tag, IoStatus::Success)]);
        assert_eq!(rbuf.bytes(), &data[..], "tag {tag:#x}");
    }
    assert_eq!(ch.in_flight(), 0);
}

fn status(dev: &LvolDevice, offset: u64, len: u64) -> Vec<BlockExtent> {
    let mut out = Vec::new();
    dev.block_status(offset, len, &mut out).unwrap();
    out
}

const fn data(len: u64) -> BlockExtent {
    BlockExtent::data(len)
}

const fn hole(len: u64) -> BlockExtent {
    BlockExtent::hole(len)
}

#[test]
fn thin_volumes_report_unwritten_clusters_as_holes() {
    let lvs = store_on(ram(8 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", MIB, true).unwrap();
    assert_eq!(status(&v, 0, MIB), [hole(MIB)]);
    let mut ch = v.open_channel().unwrap();
    // Clusters 1 and 2 (a write across their boundary), and 8.
    write_range(&mut *ch, 128 * KIB - 4096, &pattern(1, 8192));
    write_range(&mut *ch, 512 * KIB + 4096, &pattern(2, 4096));
    let all = [hole(64 * KIB), data(128 * KIB), hole(320 * KIB), data(64 * KIB), hole(448 * KIB)];
    assert_eq!(status(&v, 0, MIB), all);
    // Starting and ending mid-cluster.
    assert_eq!(status(&v, 32 * KIB, 64 * KIB), [hole(32 * KIB), data(32 * KIB)]);
    assert_eq!(status(&v, 520 * KIB, 4096), [data(4096)]);
    assert_eq!(status(&v, 200 * KIB, 512), [hole(512)]);
    // A discarded cluster is a hole again; a partly zeroed one stays data.
    assert_eq!(command(&mut *ch, IoOp::Discard, 64 * KIB, 64 * KIB), IoStatus::Success);
    assert_eq!(command(&mut *ch, IoOp::WriteZeroes, 128 * KIB, 4096), IoStatus::Success);
    assert_eq!(status(&v, 0, 256 * KIB), [hole(128 * KIB), data(64 * KIB), hole(64 * KIB)]);
    // A thick volume is data throughout.
    let t = lvs.create_volume("t", MIB, false).unwrap();
    assert_eq!(status(&t, 0, MIB), [data(MIB)]);
    // Bad ranges are refused, naming the parameter.
    let field = |offset, len| match v.block_status(offset, len, &mut Vec::new()) {
        Err(fp_bdev::BdevError::InvalidParam { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (field(100, 512), field(MIB, 512), field(0, 0), field(512, MIB)),
        ("offset", "offset", "len", "len")
    );
}

#[test]
fn snapshots_and_clones_report_their_ancestors_clusters_as_data() {
    let lvs = store_on(ram(16 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", MIB, true).unwrap();
    let mut ch = v.open_channel().unwrap();
    write_range(&mut *ch, 0, &pattern(1, 4096));
    let snap = lvs.snapshot(&v.uuid(), "s").unwrap();
    // The volume's own layer is empty now: cluster 0 is data through its snapshot.
    let before = [data(64 * KIB), hole(MIB - 64 * KIB)];
    assert_eq!(status(&v, 0, MIB), before);
    assert_eq!(status(&snap, 0, MIB), before);
    write_range(&mut *ch, 256 * KIB, &pattern(2, 4096));
    let after = [data(64 * KIB), hole(192 * KIB), data(64 * KIB), hole(MIB - 320 * KIB)];
    assert_eq!(status(&v, 0, MIB), after);
    assert_eq!(status(&snap, 0, MIB), before, "the snapshot does not see the volume's writes");
    let clone = lvs.clone_snapshot(&snap.uuid(), "c").unwrap();
    assert_eq!(status(&clone, 0, MIB), before);
    let mut cch = clone.open_channel().unwrap();
    write_range(&mut *cch, 64 * KIB, &pattern(3, 4096));
    assert_eq!(status(&clone, 0, MIB), [data(128 * KIB), hole(MIB - 128 * KIB)]);
    assert_eq!(status(&v, 0, MIB), after);
}

#[test]
fn a_fragmented_volume_is_described_a_prefix_at_a_time() {
    let lvs = store_on(ram(8 * MIB), 16 * KIB);
    let v = lvs.create_volume("v", 4 * MIB, true).unwrap();
    let mut ch = v.open_channel().unwrap();
    // Every other cluster: 256 extents.
    for c in (0..256).step_by(2) {
        write_range(&mut *ch, c * 16 * KIB, &pattern(c as u8, 512));
    }
    let out = status(&v, 0, 4 * MIB);
    assert_eq!(out.len(), 64);
    assert!(out.iter().enumerate().all(|(i, e)| e.len == 16 * KIB && e.hole == (i % 2 == 1)));
    // The caller carries on where the answer stopped.
    assert_eq!(status(&v, MIB, 48 * KIB), [data(16 * KIB), hole(16 * KIB), data(16 * KIB)]);
}

/// A store reloaded without its external snapshot: the esnap clone is degraded (reads that need
/// the external bdev and first writes to its clusters fail, its own clusters read fine) until
/// the bdev is attached again, when everything reads as before.
#[test]
fn an_esnap_clone_is_degraded_until_its_external_snapshot_returns() {
    let base = ram(16 * MIB);
    let golden = ram(MIB);
    let g = pattern(3, MIB as usize);
    write_range(&mut *golden.open_channel().unwrap(), 0, &g);
    let (cu, own);
    {
        let lvs = store_on(base.clone(), 64 * KIB);
        let c = lvs.clone_external("c", "golden", MIB).unwrap();
        lvs.attach_external("golden", golden.clone()).unwrap();
        let mut ch = c.open_channel().unwrap();
        assert_eq!(read_range(&mut *ch, 0, MIB as usize), g);
        own = pattern(8, 4096);
        write_range(&mut *ch, 64 * KIB, &own);
        assert_eq!(read_range(&mut *ch, 64 * KIB + 4096, 4096), g[(64 * KIB + 4096) as usize..][..4096]);
        assert!(lvs.clone_external("d", "golden", MIB + 1).is_err(), "not whole clusters");
        cu = c.uuid();
        lvs.close();
    }
    let lvs = LvStore::load(base, "base").unwrap().expect("a store");
    let v = lvs.volumes().unwrap().into_iter().find(|v| v.uuid == cu).unwrap();
    assert_eq!((v.external.as_deref(), v.degraded), (Some("golden"), true));
    let mut ch = lvs.device(&cu).unwrap().open_channel().unwrap();
    assert_eq!(read_range(&mut *ch, 64 * KIB, 4096), own, "its own cluster reads");
    let mut buf = conformance::IoBuf::new(4096, true);
    let iov = [buf.iovec()];
    // SAFETY: `buf` and `iov` outlive the request, polled to its end here.
    unsafe { ch.submit(&conformance::rw(3, IoOp::Read, 0, &iov)).unwrap() };
    assert_eq!(conformance::poll_until(&mut *ch, 1)[0].1, IoStatus::Error(libc::EIO));
    let before = free(&lvs);
    assert_eq!(write_status(&mut *ch, 4096, &own), IoStatus::Error(libc::EIO));
    assert_eq!(free(&lvs), before, "a failed copy from the external snapshot allocates nothing");
    let e = lvs.inflate(&cu).unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
    assert_eq!(free(&lvs), before, "nor does an inflate refused for it");
    lvs.attach_external("golden", golden).unwrap();
    assert!(!lvs.volumes().unwrap().into_iter().find(|v| v.uuid == cu).unwrap().degraded);
    assert_eq!(read_range(&mut *ch, 0, 4096), g[..4096]);
    assert_eq!(write_status(&mut *ch, 4096, &own), IoStatus::Success);
    let mut expect = g[..64 * KIB as usize].to_vec();
    expect[4096..8192].copy_from_slice(&own);
    assert_eq!(read_range(&mut *ch, 0, expect.len()), expect);
}

/// While a shallow copy reads a volume's clusters, the volume cannot be deleted or resized
/// (its clusters could go to another volume under the copy).
#[test]
fn a_volume_being_copied_is_neither_deleted_nor_resized() {
    let lvs = store_on(ram(8 * MIB), 64 * KIB);
    let v = lvs.create_volume("v", MIB, true).unwrap();
    v.shared.busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let e = lvs.check_delete(&v.uuid()).unwrap_err().to_string();
    assert!(e.contains("shallow copy"), "{e}");
    assert!(lvs.delete_volume(&v.uuid()).is_err());
    assert!(v.resize(2 * MIB / 512).is_err());
    v.shared.busy.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    v.resize(2 * MIB / 512).unwrap();
    lvs.delete_volume(&v.uuid()).unwrap();
}
