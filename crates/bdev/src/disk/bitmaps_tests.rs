//! Dirty bitmaps against the scripted device: what marks them and what does not, granularity
//! at the edges, several channels at once, merge, clear, take, and no allocation per request.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use super::*;

/// Counts the allocations of the threads that ask for it (the rest of the test binary's are
/// passed through uncounted).
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed to `System` unchanged; the counter is a const-initialised
// thread-local `Cell`, which neither allocates nor re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: as `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn at(tag: u32, op: IoOp, offset: u64, len: u64) -> IoRequest {
    IoRequest { tag, op, offset, len, iov: Iovecs::NONE }
}

/// Submits `reqs` and reaps them all.
fn run(ch: &mut Box<dyn IoChannel>, reqs: &[IoRequest]) -> Vec<(u32, IoStatus)> {
    for r in reqs {
        ch.submit(r).unwrap();
    }
    reap(ch)
}

fn add(disk: &Disk, name: &str, granularity: u64) -> Arc<DirtyBitmap> {
    let len = disk.info().size_bytes();
    disk.add_dirty_bitmap(DirtyBitmap::new(name, len, granularity, false, true)).unwrap()
}

fn extents(b: &DirtyBitmap) -> Vec<(u64, u64)> {
    b.snapshot().extents(0, u64::MAX, MAX_EXTENTS)
}

#[test]
fn completed_writes_discards_and_write_zeroes_mark_reads_and_flushes_do_not() {
    let (disk, _script) = scripted();
    let mut ch = disk.open().unwrap();
    let b = add(&disk, "b0", 4096);
    run(
        &mut ch,
        &[
            at(0, IoOp::Write, 4096, 512),
            at(1, IoOp::Discard, 3 * 4096, 4096),
            at(2, IoOp::WriteZeroes, 8 * 4096, 2 * 4096),
            at(3, IoOp::Read, 20 * 4096, 4096),
            at(4, IoOp::Flush, 0, 0),
        ],
    );
    assert_eq!(extents(&b), [(4096, 4096), (3 * 4096, 4096), (8 * 4096, 2 * 4096)]);
    assert_eq!(b.info().count, 4 * 4096);
}

#[test]
fn failed_writes_mark_too() {
    // A write the device failed may have changed part of its range: its chunks are marked, so
    // a backup reads them again rather than missing a change.
    let (disk, script) = scripted();
    let mut ch = disk.open().unwrap();
    let b = add(&disk, "b0", 512);
    script.lock().unwrap().fail = Some(IoStatus::Error(libc::EIO));
    run(&mut ch, &[at(0, IoOp::Write, 0, 4096)]);
    script.lock().unwrap().fail = Some(IoStatus::Unsupported);
    run(&mut ch, &[at(0, IoOp::Discard, 8192, 4096)]);
    // A failed read marks nothing.
    script.lock().unwrap().fail = Some(IoStatus::Error(libc::EIO));
    run(&mut ch, &[at(0, IoOp::Read, 16384, 4096)]);
    assert_eq!(extents(&b), [(0, 4096), (8192, 4096)]);
}

#[test]
fn a_write_marks_before_its_completion_goes_up() {
    let (disk, _script) = scripted();
    let mut ch = disk.open().unwrap();
    let b = add(&disk, "b0", 512);
    ch.submit(&at(7, IoOp::Write, 1024, 512)).unwrap();
    let mut seen = None;
    ch.poll(&mut |_, _| seen = Some(b.info().count));
    assert_eq!(seen, Some(512));
}

#[test]
fn granularity_rounds_out_to_whole_chunks_and_cuts_at_the_end_of_the_disk() {
    let (disk, _script) = scripted();
    let size = disk.info().size_bytes();
    let mut ch = disk.open().unwrap();
    let b = add(&disk, "b0", 64 << 10);
    // One byte either side of a chunk boundary: both chunks.
    run(&mut ch, &[at(0, IoOp::Write, (64 << 10) - 512, 1024)]);
    assert_eq!(extents(&b), [(0, 128 << 10)]);
    // The last chunk, and a write past the end of the disk (marks nothing beyond it).
    run(&mut ch, &[at(1, IoOp::Write, size - 512, 512), at(2, IoOp::Write, size, 512)]);
    assert_eq!(extents(&b), [(0, 128 << 10), (size - (64 << 10), 64 << 10)]);
    // Extents are cut to the range asked for.
    assert_eq!(b.snapshot().extents(1000, 5000, MAX_EXTENTS), [(1000, 5000)]);
    assert_eq!(b.snapshot().extents(size - 512, 1 << 30, MAX_EXTENTS), [(size - 512, 512)]);
    assert_eq!(b.snapshot().extents(0, 1 << 30, 1), [(0, 128 << 10)], "bounded");
}

#[test]
fn a_disk_whose_size_is_not_a_multiple_of_the_granularity_counts_its_last_chunk_short() {
    let info = NullDevice::new("odd", 512, 3).unwrap().info().clone();
    let script = Arc::new(Mutex::new(Script::default()));
    let disk = Disk::new(Arc::new(ScriptDevice { info, script }), true);
    let mut ch = disk.open().unwrap();
    let b = add(&disk, "b0", 64 << 10);
    run(&mut ch, &[at(0, IoOp::Write, 512, 512)]);
    assert_eq!(b.info().count, 1536);
    assert_eq!(extents(&b), [(0, 1536)]);
}

#[test]
fn granularity_is_checked() {
    for g in [0, 256, 3000, 128 << 20] {
        assert_eq!(check_granularity("granularity", g).unwrap_err().field(), Some("granularity"), "{g}");
    }
    assert_eq!(check_granularity("granularity", 512), Ok(512));
    assert_eq!(check_granularity("granularity", 64 << 20), Ok(64 << 20));
}

#[test]
fn several_channels_on_several_threads_mark_the_same_bitmap() {
    let (disk, _script) = scripted();
    let b = add(&disk, "b0", 512);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let disk = disk.clone();
            s.spawn(move || {
                let mut ch = disk.open().unwrap();
                // Each thread writes every fourth block: together they cover 1024 blocks,
                // each word of the bitmap shared by all four.
                for i in 0..256u64 {
                    run(&mut ch, &[at(0, IoOp::Write, (i * 4 + t) * 512, 512)]);
                }
            });
        }
    });
    assert_eq!(b.info().count, 1024 * 512);
    assert_eq!(extents(&b), [(0, 1024 * 512)]);
}

#[test]
fn a_channel_opened_before_the_bitmap_picks_it_up_at_its_next_poll() {
    let (disk, _script) = scripted();
    let mut ch = disk.open().unwrap();
    ch.submit(&at(0, IoOp::Write, 0, 512)).unwrap();
    let b = add(&disk, "b0", 512);
    reap(&mut ch);
    assert_eq!(extents(&b), [(0, 512)], "in flight at the add, completed after it");
    disk.remove_dirty_bitmap("b0").unwrap();
    run(&mut ch, &[at(0, IoOp::Write, 4096, 512)]);
    assert_eq!(extents(&b), [(0, 512)], "removed: no longer marked");
}

#[test]
fn disable_stops_marking_and_enable_resumes() {
    let (disk, _script) = scripted();
    let mut ch = disk.open().unwrap();
    let b = add(&disk, "b0", 512);
    disk.set_dirty_bitmap_recording("b0", false).unwrap();
    run(&mut ch, &[at(0, IoOp::Write, 0, 512)]);
    assert!(b.is_empty());
    assert!(!b.info().recording);
    disk.set_dirty_bitmap_recording("b0", true).unwrap();
    run(&mut ch, &[at(0, IoOp::Write, 512, 512)]);
    assert_eq!(extents(&b), [(512, 512)]);
    // A bitmap added disabled records nothing until enabled.
    let len = disk.info().size_bytes();
    let off = disk.add_dirty_bitmap(DirtyBitmap::new("off", len, 512, false, false)).unwrap();
    run(&mut ch, &[at(0, IoOp::Write, 0, 512)]);
    assert!(off.is_empty());
}

#[test]
fn take_clears_and_what_it_took_can_be_given_back() {
    let (disk, _script) = scripted();
    let mut ch = disk.open().unwrap();
    let b = add(&disk, "b0", 512);
    run(&mut ch, &[at(0, IoOp::Write, 0, 1024)]);
    let frozen = b.take();
    assert!(b.is_empty());
    run(&mut ch, &[at(0, IoOp::Write, 4096, 512)]);
    assert_eq!(frozen.extents(0, u64::MAX, MAX_EXTENTS), [(0, 1024)]);
    assert_eq!(extents(&b), [(4096, 512)]);
    // A backup that failed gives its bits back.
    b.merge_from(&frozen);
    assert_eq!(extents(&b), [(0, 1024), (4096, 512)]);
    assert_eq!(b.info().count, 1536);
}

#[test]
fn merge_sets_the_union_and_refuses_another_granularity_naming_it() {
    let (disk, _script) = scripted();
    let mut ch = disk.open().unwrap();
    let a = add(&disk, "a", 512);
    add(&disk, "b", 512);
    add(&disk, "coarse", 4096);
    run(&mut ch, &[at(0, IoOp::Write, 0, 512)]);
    disk.set_dirty_bitmap_recording("a", false).unwrap();
    run(&mut ch, &[at(0, IoOp::Write, 8192, 512)]);
    disk.merge_dirty_bitmaps("a", &["b".into()]).unwrap();
    assert_eq!(extents(&a), [(0, 512), (8192, 512)], "a disabled target takes a merge");
    let e = disk.merge_dirty_bitmaps("a", &["b".into(), "coarse".into()]).unwrap_err();
    assert_eq!(e.field(), Some("bitmaps"));
    assert!(e.to_string().contains("'coarse'"), "{e}");
    let e = disk.merge_dirty_bitmaps("a", &["nope".into()]).unwrap_err();
    assert!(matches!(e, BitmapError::NotFound { ref name, .. } if name == "nope"), "{e}");
}

#[test]
fn an_inconsistent_bitmap_refuses_all_but_removal() {
    let (disk, _script) = scripted();
    let b = add(&disk, "b0", 512);
    add(&disk, "ok", 512);
    b.set_inconsistent();
    let refused = |e: BitmapError| assert_eq!(e, BitmapError::Inconsistent("b0".into()));
    refused(disk.dirty_bitmap("b0").unwrap_err());
    refused(disk.set_dirty_bitmap_recording("b0", true).unwrap_err());
    refused(disk.merge_dirty_bitmaps("ok", &["b0".into()]).unwrap_err());
    refused(disk.merge_dirty_bitmaps("b0", &["ok".into()]).unwrap_err());
    assert!(disk.dirty_bitmaps()[0].info().inconsistent);
    disk.remove_dirty_bitmap("b0").unwrap();
    assert_eq!(disk.dirty_bitmaps().len(), 1);
}

#[test]
fn names_are_unique_per_disk_and_accounting_off_refuses() {
    let (disk, _script) = scripted();
    add(&disk, "b0", 512);
    let len = disk.info().size_bytes();
    let e = disk.add_dirty_bitmap(DirtyBitmap::new("b0", len, 512, false, true)).unwrap_err();
    assert!(matches!(e, BitmapError::Exists { .. }), "{e}");
    assert!(matches!(disk.remove_dirty_bitmap("x"), Err(BitmapError::NotFound { .. })));
    let off = Disk::new(Arc::new(NullDevice::new("n", 512, 8).unwrap()), false);
    let e = off.add_dirty_bitmap(DirtyBitmap::new("b0", 4096, 512, false, true)).unwrap_err();
    assert_eq!(e, BitmapError::AccountingOff);
}

#[test]
fn marking_allocates_nothing_per_request() {
    let (disk, _script) = scripted();
    let mut ch = disk.open_typed().unwrap();
    let b = add(&disk, "b0", 512);
    let mut done = |_: u32, _: IoStatus| {};
    // Warm up: the set is picked up and the slab and batch are at size.
    for tag in 0..8 {
        ch.submit(&at(tag, IoOp::Write, 0, 512)).unwrap();
    }
    ch.poll(&mut done);
    COUNTING.with(|c| c.set(true));
    for round in 0..100u64 {
        for tag in 0..8u32 {
            ch.submit(&at(tag, IoOp::Write, (round * 8 + u64::from(tag)) * 512, 512)).unwrap();
        }
        ch.poll(&mut done);
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCATIONS.with(Cell::get), 0);
    assert_eq!(b.info().count, 800 * 512);
}

/// Every run of `[offset, end)` by `unit` windows, as (dirty, start, len).
fn runs(b: &DirtyBitmap, offset: u64, end: u64, unit: u64) -> Vec<(bool, u64, u64)> {
    let mut out = Vec::new();
    let mut at = offset;
    while at < end {
        let (dirty, stop) = b.run_at(at, end, unit);
        assert!(stop > at, "a run moves forward");
        out.push((dirty, at, stop - at));
        at = stop;
    }
    out
}

#[test]
fn runs_are_read_from_the_live_bits_by_window_and_past_the_end_are_dirty() {
    let b = DirtyBitmap::new("b", 1 << 20, 4096, false, true);
    b.mark(8192, 100); // chunk 2
    b.mark(64 * 4096, 4096 * 3); // chunks 64..67, across a word
    assert_eq!(
        runs(&b, 0, 1 << 20, 4096),
        vec![
            (false, 0, 8192),
            (true, 8192, 4096),
            (false, 12288, 61 * 4096),
            (true, 64 * 4096, 3 * 4096),
            (false, 67 * 4096, (1 << 20) - 67 * 4096)
        ]
    );
    // Cut to the range, starting mid-run.
    assert_eq!(runs(&b, 65 * 4096, 66 * 4096, 4096), vec![(true, 65 * 4096, 4096)]);
    // Windows larger than the granularity: a window is dirty when any chunk is.
    assert_eq!(runs(&b, 0, 128 * 1024, 32 * 1024), vec![(true, 0, 32 * 1024), (false, 32 * 1024, 96 * 1024)]);
    assert_eq!(runs(&b, 4096, 3 * 32 * 1024, 32 * 1024)[0], (true, 4096, 32 * 1024 - 4096));
    // A bit set after a query shows in the next one: no copy is kept.
    b.mark(0, 1);
    assert_eq!(b.run_at(0, 1 << 20, 4096), (true, 4096));
    // A disk grown past the bitmap: the bytes it never tracked are dirty.
    assert_eq!(b.run_at((1 << 20) - 4096, (1 << 20) + 8192, 4096), (false, 1 << 20));
    assert_eq!(b.run_at(1 << 20, (1 << 20) + 8192, 4096), (true, (1 << 20) + 8192));
    b.mark((1 << 20) - 4096, 4096);
    assert_eq!(b.run_at((1 << 20) - 4096, (1 << 20) + 8192, 4096), (true, (1 << 20) + 8192));
}

#[test]
fn a_held_bitmap_is_busy_and_refuses_removal_until_released() {
    let (disk, _script) = scripted();
    let b = add(&disk, "b", 65536);
    let hold = BitmapUse::new(b.clone(), "NBD export /run/x.sock");
    assert!(b.busy() && b.info().busy);
    assert!(matches!(disk.remove_dirty_bitmap("b"), Err(BitmapError::Busy { .. })));
    drop(hold);
    assert!(!b.info().busy);
    disk.remove_dirty_bitmap("b").unwrap();
}

/// The refusal of a held bitmap, checked whole: EBUSY's variant, naming bitmap, disk and holder.
fn assert_busy(r: Result<(), BitmapError>, name: &str, holder: &str) {
    let e = r.unwrap_err();
    assert!(
        matches!(&e, BitmapError::Busy { bdev, name: n, holder: h } if bdev == "s0" && n == name && h == holder),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.contains(&format!("'{name}'")) && text.contains(holder) && text.contains("busy"), "{text}");
}

#[test]
fn a_held_bitmap_refuses_clear_enable_disable_and_merge_either_way_and_changes_nothing() {
    let (disk, _script) = scripted();
    let held = add(&disk, "held", 65536);
    let free = add(&disk, "free", 65536);
    held.mark(0, 4096);
    held.mark(3 * 65536, 4096);
    free.mark(5 * 65536, 1);
    let (held_bits, free_bits) = (held.snapshot(), free.snapshot());
    let job = "backup job 'vm0'";
    let hold = BitmapUse::exclusive(held.clone(), "s0", job).unwrap();

    assert_busy(disk.clear_dirty_bitmap("held"), "held", job);
    assert_busy(disk.set_dirty_bitmap_recording("held", false), "held", job);
    assert_busy(disk.set_dirty_bitmap_recording("held", true), "held", job);
    assert_busy(disk.merge_dirty_bitmaps("held", &["free".into()]), "held", job);
    assert_busy(disk.merge_dirty_bitmaps("free", &["held".into()]), "held", job);
    assert_busy(disk.remove_dirty_bitmap("held").map(drop), "held", job);
    // A second holder wanting it alone is refused too, naming the first.
    assert_busy(BitmapUse::exclusive(held.clone(), "s0", "backup job 'other'").map(drop), "held", job);
    // Nothing changed: the bits, recording, the other bitmap.
    assert_eq!((held.snapshot(), free.snapshot()), (held_bits.clone(), free_bits.clone()));
    assert!(held.recording() && held.busy());

    // The holder's own path still works: a failed backup gives its frozen bits back.
    let frozen = hold.take();
    assert!(held.is_empty());
    hold.merge_back(&frozen);
    assert_eq!(held.snapshot(), held_bits);

    // The other bitmap is not held: its methods work while the first one is held.
    disk.clear_dirty_bitmap("free").unwrap();
    disk.set_dirty_bitmap_recording("free", false).unwrap();
    assert!(free.is_empty() && !free.recording());

    // Released: every method works again.
    drop(hold);
    disk.merge_dirty_bitmaps("free", &["held".into()]).unwrap();
    assert_eq!(free.snapshot(), held_bits);
    disk.set_dirty_bitmap_recording("held", false).unwrap();
    disk.clear_dirty_bitmap("held").unwrap();
    assert!(held.is_empty() && !held.recording());
}

#[test]
fn shared_holds_are_counted_and_each_release_leaves_the_others() {
    let (disk, _script) = scripted();
    let b = add(&disk, "b", 65536);
    let one = BitmapUse::new(b.clone(), "NBD export /run/one.sock");
    let two = BitmapUse::new(b.clone(), "NBD export /run/two.sock");
    assert_busy(disk.clear_dirty_bitmap("b"), "b", "NBD export /run/one.sock");
    drop(one);
    assert_busy(disk.clear_dirty_bitmap("b"), "b", "NBD export /run/two.sock");
    drop(two);
    disk.clear_dirty_bitmap("b").unwrap();
}
