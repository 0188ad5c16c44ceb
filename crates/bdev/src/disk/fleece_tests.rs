//! Copy-before-write through the disk layer: a RAM base, its writes through a disk channel,
//! the point-in-time view read through its own device.

use std::sync::Arc;

use super::Disk;
use crate::fleece::{FleeceDevice, FleeceShared};
use crate::modules::error::{ErrorDevice, ErrorType, Injection};
use crate::{Bdev, BlockDevice, IoChannel, IoOp, IoRequest, IoStatus, Iovecs, RamDevice};

const BS: u32 = 512;
const BLOCKS: u64 = 256; // 128 KiB: 32 chunks of 4 KiB
const G: u64 = 4096;

fn pattern(byte: u8, len: usize) -> Vec<u8> {
    vec![byte; len]
}

/// Submits one request and returns its completion, polling `ch` (and `also`, the channel whose
/// reactor would run beside it) until it comes.
fn run(ch: &mut dyn IoChannel, op: IoOp, offset: u64, buf: &mut [u8]) -> IoStatus {
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let with_data = matches!(op, IoOp::Read | IoOp::Write);
    // SAFETY: `iov` and `buf` outlive the request, which completes before this returns.
    let iov = if with_data { unsafe { Iovecs::from_raw(&iov, 1) } } else { Iovecs::NONE };
    let req = IoRequest { tag: 7, op, offset, len: buf.len() as u64, iov };
    ch.submit(&req).expect("accepted");
    for _ in 0..100_000 {
        let mut got = None;
        ch.poll(&mut |t, s| {
            assert_eq!(t, 7);
            got = Some(s)
        });
        if let Some(s) = got {
            return s;
        }
    }
    panic!("{op:?} at {offset} never completed");
}

struct Setup {
    base: Disk,
    view: FleeceDevice,
    shared: Arc<FleeceShared>,
    guest: Box<dyn IoChannel>,
}

/// A base filled with `a`, a channel of it open, a fleece onto `target` attached and acknowledged.
fn setup(base_dev: Bdev, target: Bdev) -> Setup {
    let base = Disk::new(base_dev, true);
    let mut guest = base.open().unwrap();
    let mut all = pattern(0xaa, (BLOCKS * u64::from(BS)) as usize);
    assert_eq!(run(&mut *guest, IoOp::Write, 0, &mut all), IoStatus::Success);
    let shared = Arc::new(FleeceShared::new("fl", "base", base.bdev().clone(), "tgt", target, G));
    let epoch = base.attach_fleece(&shared).unwrap();
    // The channel acknowledges at its next poll (nothing in flight).
    guest.poll(&mut |_, _| {});
    assert!(base.fleece_acked(epoch));
    let view = FleeceDevice::new(shared.clone());
    Setup { base, view, shared, guest }
}

fn injection(error_type: ErrorType, num: u64) -> Injection {
    Injection { error_type, num, queue_depth: 0, corrupt_offset: 0, corrupt_value: 0 }
}

fn ram(name: &str) -> Bdev {
    Arc::new(RamDevice::new(name, BS, BLOCKS).unwrap())
}

#[test]
fn the_view_keeps_the_old_data_while_the_base_changes() {
    let mut s = setup(ram("base"), ram("tgt"));
    // Unaligned to chunks, spanning three of them.
    let mut b = pattern(0xbb, 3 * 4096 + 1024);
    assert_eq!(run(&mut *s.guest, IoOp::Write, 4096 + 512, &mut b), IoStatus::Success);
    let mut z = pattern(0, 8192);
    assert_eq!(run(&mut *s.guest, IoOp::WriteZeroes, 64 << 10, &mut z), IoStatus::Success);
    assert_eq!(run(&mut *s.guest, IoOp::Discard, 96 << 10, &mut z), IoStatus::Success);
    // Written again: copied already, no second copy.
    assert_eq!(run(&mut *s.guest, IoOp::Write, 4096 + 512, &mut b), IoStatus::Success);
    assert_eq!(s.shared.copied_chunks(), 4 + 2 + 2);
    let mut view = s.view.open_channel().unwrap();
    let mut got = pattern(0, (BLOCKS * u64::from(BS)) as usize);
    assert_eq!(run(&mut *view, IoOp::Read, 0, &mut got), IoStatus::Success);
    assert!(got.iter().all(|&x| x == 0xaa), "the view shows the point in time");
    let mut now = pattern(0, 4096);
    assert_eq!(run(&mut *s.guest, IoOp::Read, 8192, &mut now), IoStatus::Success);
    assert!(now.iter().all(|&x| x == 0xbb));
    // Read-only.
    let mut one = pattern(1, 512);
    assert_eq!(run(&mut *view, IoOp::Write, 0, &mut one), IoStatus::Error(libc::EROFS));
    assert_eq!(run(&mut *view, IoOp::Flush, 0, &mut []), IoStatus::Success);
    // Detached: writes cost nothing more, the target is no longer written.
    let epoch = s.base.detach_fleece(&s.shared);
    s.guest.poll(&mut |_, _| {});
    assert!(s.base.fleece_acked(epoch));
    let mut c = pattern(0xcc, 4096);
    assert_eq!(run(&mut *s.guest, IoOp::Write, 120 << 10, &mut c), IoStatus::Success);
    assert_eq!(s.shared.copied_chunks(), 8);
}

#[test]
fn a_failed_copy_breaks_the_snapshot_not_the_write() {
    let target = Arc::new(ErrorDevice::new("tgt", ram("ram")).unwrap());
    let inj = injection(ErrorType::Failure, 100);
    target.inject(&[1], inj).unwrap();
    let mut s = setup(ram("base"), target);
    let mut b = pattern(0xbb, 4096);
    assert_eq!(run(&mut *s.guest, IoOp::Write, 0, &mut b), IoStatus::Success);
    assert!(s.shared.broken());
    assert!(s.shared.error().unwrap().contains("target"));
    let mut view = s.view.open_channel().unwrap();
    let mut got = pattern(0, 4096);
    assert_eq!(run(&mut *view, IoOp::Read, 8192, &mut got), IoStatus::Error(libc::EIO));
}

#[test]
fn a_write_waits_for_a_point_in_time_read_of_its_chunk() {
    let base_err = Arc::new(ErrorDevice::new("base", ram("ram")).unwrap());
    let mut s = setup(base_err.clone(), ram("tgt"));
    // Reads of the base are held from now on (the view's, and the copy's).
    let pending = injection(ErrorType::Pending, 100);
    base_err.inject(&[0], pending).unwrap();
    let mut view = s.view.open_channel().unwrap();
    let mut got = pattern(0, 4096);
    let iov = libc::iovec { iov_base: got.as_mut_ptr().cast(), iov_len: got.len() };
    // SAFETY: `iov` and `got` outlive the read, reaped below.
    let iov = unsafe { Iovecs::from_raw(&iov, 1) };
    let read = IoRequest { tag: 1, op: IoOp::Read, offset: 0, len: 4096, iov };
    view.submit(&read).unwrap();
    // The guest's write of that chunk is held: its copy's read is held too, and the view's read
    // is in flight on the base.
    let mut b = pattern(0xbb, 4096);
    let wiov = libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() };
    // SAFETY: as above.
    let wiov = unsafe { Iovecs::from_raw(&wiov, 1) };
    let write = IoRequest { tag: 2, op: IoOp::Write, offset: 0, len: 4096, iov: wiov };
    s.guest.submit(&write).unwrap();
    for _ in 0..100 {
        s.guest.poll(&mut |_, _| panic!("the write went down under a point-in-time read"));
        view.poll(&mut |_, _| panic!("the view's read is held"));
    }
    assert_eq!(s.guest.in_flight(), 1);
    base_err.resume_pending();
    base_err.clear();
    let (mut read_done, mut write_done) = (None, None);
    for _ in 0..100_000 {
        view.poll(&mut |_, st| read_done = Some(st));
        s.guest.poll(&mut |_, st| write_done = Some(st));
        if read_done.is_some() && write_done.is_some() {
            break;
        }
    }
    assert_eq!(read_done, Some(IoStatus::Success));
    assert_eq!(write_done, Some(IoStatus::Success));
    assert!(got.iter().all(|&x| x == 0xaa), "the view's read saw the old data");
    let mut again = pattern(0, 4096);
    assert_eq!(run(&mut *view, IoOp::Read, 0, &mut again), IoStatus::Success);
    assert!(again.iter().all(|&x| x == 0xaa));
}

#[test]
fn a_channel_opened_after_the_point_in_time_copies_before_its_first_write() {
    let s = setup(ram("base"), ram("tgt"));
    // Opened after the attach, written before it ever polled.
    let mut late = s.base.open().unwrap();
    let mut b = pattern(0xbb, 4096);
    assert_eq!(run(&mut *late, IoOp::Write, 16 << 10, &mut b), IoStatus::Success);
    assert_eq!(s.shared.copied_chunks(), 1);
    let mut view = s.view.open_channel().unwrap();
    let mut got = pattern(0, 4096);
    assert_eq!(run(&mut *view, IoOp::Read, 16 << 10, &mut got), IoStatus::Success);
    assert!(got.iter().all(|&x| x == 0xaa));
}

#[test]
fn the_attach_is_acknowledged_once_earlier_writes_are_done() {
    let base_err = Arc::new(ErrorDevice::new("base", ram("ram")).unwrap());
    let base = Disk::new(base_err.clone(), true);
    let mut guest = base.open().unwrap();
    let pending = injection(ErrorType::Pending, 1);
    base_err.inject(&[1], pending).unwrap();
    let mut b = pattern(0xbb, 4096);
    let iov = libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() };
    // SAFETY: `iov` and `b` outlive the write, reaped below.
    let iov = unsafe { Iovecs::from_raw(&iov, 1) };
    guest.submit(&IoRequest { tag: 3, op: IoOp::Write, offset: 0, len: 4096, iov }).unwrap();
    let shared = Arc::new(FleeceShared::new("fl", "base", base.bdev().clone(), "tgt", ram("tgt"), G));
    let epoch = base.attach_fleece(&shared).unwrap();
    for _ in 0..10 {
        guest.poll(&mut |_, _| panic!("held by the error bdev"));
    }
    // The write from before the point in time is still out: no acknowledgement yet.
    assert!(!base.fleece_acked(epoch));
    base_err.resume_pending();
    let mut done = None;
    for _ in 0..100_000 {
        guest.poll(&mut |_, st| done = Some(st));
        if done.is_some() {
            break;
        }
    }
    assert_eq!(done, Some(IoStatus::Success));
    assert!(base.fleece_acked(epoch));
    // It landed before the point in time: nothing was copied for it.
    assert_eq!(shared.copied_chunks(), 0);
}

#[test]
fn a_write_the_fleece_held_leaves_nothing_in_flight_so_the_next_fleece_attaches() {
    let mut s = setup(ram("base"), ram("tgt"));
    // Held until its chunk is copied, then sent down at a poll.
    let mut b = pattern(0xbb, 4096);
    assert_eq!(run(&mut *s.guest, IoOp::Write, 8192, &mut b), IoStatus::Success);
    assert_eq!(s.shared.copied_chunks(), 1);
    assert_eq!(s.guest.in_flight(), 0);
    let epoch = s.base.detach_fleece(&s.shared);
    s.guest.poll(&mut |_, _| {});
    assert!(s.base.fleece_acked(epoch));
    // A second point in time on the idle channel: it has nothing in flight from before, so it
    // acknowledges at its next poll (a held write once counted twice kept it waiting forever).
    let second = Arc::new(FleeceShared::new("fl2", "base", s.base.bdev().clone(), "tgt2", ram("tgt2"), G));
    let epoch = s.base.attach_fleece(&second).unwrap();
    s.guest.poll(&mut |_, _| {});
    assert!(s.base.fleece_acked(epoch), "an idle channel did not take the second fleece up");
}
