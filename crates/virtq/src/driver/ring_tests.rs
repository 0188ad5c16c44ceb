//! The driver rings against fp-virtq's own device-side rings, both over one memory region: what
//! one side writes is what the other reads.

use std::ptr::NonNull;
use std::sync::Arc;

use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::{DriverMem, PackedDriver, SplitDriver, SplitLayout};
use crate::{Chain, GuestMemory, MemTable, PackedQueue, PackedState, SplitQueue, DESC_F_NEXT, DESC_F_WRITE};

const LEN: usize = 0x10000;

/// Guest memory of `LEN` bytes at guest address 0, its device-side table, and a driver view of
/// the same bytes (offset = guest address).
fn memory() -> (Arc<GuestMemory>, MemTable, DriverMem) {
    let m = Arc::new(GuestMemory::from_ranges(&[(GuestAddress(0), LEN)]).unwrap());
    let table = MemTable::new(Arc::clone(&m)).unwrap();
    let host = m.get_host_address(GuestAddress(0)).unwrap();
    // SAFETY: the region's `LEN` bytes are mapped (page-aligned) and `m`, which owns them, is
    // returned with the view and outlives it in every test.
    let view = unsafe { DriverMem::new(NonNull::new(host).unwrap(), LEN) };
    (m, table, view)
}

/// The chain's descriptors as (guest address, length, device-writable).
fn fields(c: &Chain) -> Vec<(u64, u32, bool)> {
    c.descs().iter().map(|d| (d.addr, d.len, d.write)).collect()
}

/// A split ring of `size` entries at 0 from both sides.
fn split(size: u16) -> (Arc<GuestMemory>, MemTable, SplitDriver, SplitQueue) {
    let (m, table, mem) = memory();
    let layout = SplitLayout::new(usize::from(size));
    let drv = SplitDriver::new(mem.sub(0, layout.len), size);
    let dev = SplitQueue::new(&table, 0, layout.avail as u64, layout.used as u64, size, false, 0, 0).unwrap();
    (m, table, drv, dev)
}

#[test]
fn a_split_chain_reaches_the_device_and_its_completion_the_driver() {
    let (_m, table, mut drv, mut dev) = split(16);
    drv.write_desc(3, 0x8000, 16, DESC_F_NEXT, 4);
    drv.write_desc(4, 0x9000, 4096, DESC_F_NEXT | DESC_F_WRITE, 5);
    drv.write_desc(5, 0x8010, 1, DESC_F_WRITE, 0);
    assert_eq!(drv.desc(4), (0x9000, 4096, DESC_F_NEXT | DESC_F_WRITE, 5));
    drv.push_avail(3);
    assert_eq!(dev.pop().unwrap(), None, "nothing is visible before the publish");
    drv.publish();
    assert!(drv.notify_needed(), "a device that asked for nothing is notified");
    assert!(!drv.notify_needed(), "nothing new since the last check");
    assert_eq!(dev.pop().unwrap(), Some(3));
    let mut chain = Chain::new();
    dev.walk(&table, 3, &mut chain).unwrap();
    assert_eq!(fields(&chain), [(0x8000, 16, false), (0x9000, 4096, true), (0x8010, 1, true)]);
    assert_eq!(drv.pop_used(), None);
    dev.push_used(3, 4097);
    dev.publish();
    assert_eq!(drv.pop_used(), Some((3, 4097)));
    assert_eq!(drv.pop_used(), None);
}

#[test]
fn split_notifications_follow_each_sides_flags() {
    let (_m, _table, mut drv, mut dev) = split(16);
    dev.disable_notification();
    drv.write_desc(0, 0x8000, 1, 0, 0);
    drv.push_avail(0);
    drv.publish();
    assert!(!drv.notify_needed(), "the device polls: no kick");
    drv.set_used_notifications(false);
    assert!(!dev.driver_waits(), "the driver polls: no interrupt");
    drv.set_used_notifications(true);
    assert!(dev.driver_waits());
}

#[test]
fn the_split_index_wraps_past_the_ring_size() {
    let (_m, _table, mut drv, mut dev) = split(4);
    drv.write_desc(1, 0x8000, 1, 0, 0);
    for round in 0..11u32 {
        drv.push_avail(1);
        drv.publish();
        assert_eq!(dev.pop().unwrap(), Some(1), "round {round}");
        dev.push_used(1, round);
        dev.publish();
        assert_eq!(drv.pop_used(), Some((1, round)));
    }
}

/// A packed ring at 0, its driver and device event areas at 0x1000 and 0x1004, starting as
/// `SET_VRING_BASE 0` says: both wrap counters 0.
fn packed(size: u16, event_idx: bool) -> (Arc<GuestMemory>, MemTable, PackedDriver, PackedQueue) {
    let (m, table, mem) = memory();
    let state = PackedState::from_vring_base(0);
    let drv = PackedDriver::new(
        mem.sub(0, 16 * usize::from(size)),
        mem.sub(0x1000, 4),
        mem.sub(0x1004, 4),
        size,
        3,
        event_idx,
        state,
    );
    let dev = PackedQueue::new(&table, 0, 0x1000, 0x1004, size, event_idx, state).unwrap();
    (m, table, drv, dev)
}

#[test]
fn packed_chains_reach_the_device_across_both_wrap_counters() {
    let (_m, table, mut drv, mut dev) = packed(6, false);
    let mut chain = Chain::new();
    assert_eq!(dev.pop(&table, &mut chain).unwrap(), None, "a fresh ring offers nothing");
    // Six rounds of one chain each: three laps of a 6-descriptor ring, wrap counters 0, 1, 0.
    for round in 0..6u16 {
        let id = round % 2;
        let hdr = 0x8000 + 0x20 * u64::from(id);
        drv.push(id, &[(hdr, 16, DESC_F_NEXT), (0x9000, 512, DESC_F_NEXT), (hdr + 16, 1, DESC_F_WRITE)]);
        let head = dev.pop(&table, &mut chain).unwrap().expect("the chain");
        assert_eq!((head.id, head.slots), (id, 3), "round {round}");
        assert_eq!(fields(&chain), [(hdr, 16, false), (0x9000, 512, false), (hdr + 16, 1, true)]);
        assert_eq!(drv.pop_used(), None, "round {round}: not used yet");
        dev.push_used(id, 1, head.slots);
        dev.publish();
        assert_eq!(drv.pop_used(), Some((id, 1)), "round {round}");
        assert_eq!(drv.pop_used(), None);
    }
}

#[test]
fn packed_notifications_follow_the_event_areas() {
    let (_m, table, mut drv, mut dev) = packed(6, true);
    let mut chain = Chain::new();
    let bufs = [(0x8000, 16, DESC_F_NEXT), (0x9000, 512, DESC_F_NEXT), (0x8010, 1, DESC_F_WRITE)];
    drv.push(0, &bufs);
    // The device's area starts zeroed: ENABLE, a notification for everything.
    assert!(drv.notify_needed());
    dev.disable_notification();
    drv.push(1, &bufs);
    assert!(!drv.notify_needed(), "the device polls");
    assert!(dev.pop(&table, &mut chain).unwrap().is_some());
    assert!(dev.pop(&table, &mut chain).unwrap().is_some());
    // Asking again with EVENT_IDX names the next descriptor: the next chain passes it.
    assert!(!dev.enable_notification(), "nothing arrived meanwhile");
    drv.push(0, &bufs);
    assert!(drv.notify_needed(), "the chain at the device's event descriptor");
    drv.set_used_notifications(false);
    assert!(!dev.driver_waits(), "the driver polls");
    drv.set_used_notifications(true);
    assert!(dev.driver_waits());
}

#[test]
fn the_split_layout_puts_each_area_on_its_own_page() {
    assert_eq!(SplitLayout::new(256), SplitLayout { avail: 4096, used: 8192, len: 12288 });
    assert_eq!(SplitLayout::new(1024), SplitLayout { avail: 16384, used: 20480, len: 20480 + 12288 });
}

/// Rings are powers of two and chains three descriptors long: a chain straddles the ring's end
/// and the used position wraps with it (the device skips a chain's slots, §2.8.9).
#[test]
fn packed_chains_straddle_the_rings_end() {
    let (_m, table, mut drv, mut dev) = packed(8, false);
    let mut chain = Chain::new();
    let bufs = [(0x8000, 16, DESC_F_NEXT), (0x9000, 512, DESC_F_NEXT), (0x8010, 1, DESC_F_WRITE)];
    // One chain at a time, over almost five laps of the 8-descriptor ring.
    for round in 0..13u16 {
        drv.push(round % 2, &bufs);
        let head = dev.pop(&table, &mut chain).unwrap().expect("the chain");
        assert_eq!((head.id, head.slots), (round % 2, 3), "round {round}");
        dev.push_used(head.id, 0, head.slots);
        dev.publish();
        assert_eq!(drv.pop_used(), Some((round % 2, 0)), "round {round}");
    }
}
