//! Fuzz crash recovery from a front-end's in-flight area (vhost-user.rst, "Inflight I/O
//! tracking"), split and packed layouts: the region's bytes come from the front-end, which keeps
//! the file across a back-end crash and may hand back anything.
//!
//! Input layout (missing bytes read as 0):
//!
//! | offset | size | meaning |
//! |-------:|-----:|---------|
//! | 0 | 1 | queue size: `1 << (b % 9)` (1..256) |
//! | 1 | 1 | bit 0: packed layout |
//! | 2 | 4 | split: the ring's used index (low 16 bits); packed: the vring base (`PackedState`) |
//! | 6 | 2 | packed: the flags `flags_at` reports for the ring slot recovery asks about |
//! | 8 | 16 | ids / heads to take, complete and publish after recovery |
//! | 24 | .. | the region's bytes, from its start |
//!
//! Invariants: recovery never panics; split resubmission lists distinct heads below the queue
//! size; packed resubmission lists requests of at least one slot whose slots add up to at most
//! the queue size, and a recovered ring position is inside the ring; the tracker then takes,
//! completes and publishes without panicking.
#![no_main]

use std::collections::HashSet;
use std::os::unix::fs::FileExt;

use fp_vhost_blk::inflight::{InflightArea, Tracker};
use fp_virtq::{PackedState, RawDesc};
use libfuzzer_sys::fuzz_target;

const HEADER: usize = 24;

fuzz_target!(|data: &[u8]| {
    let b = |i: usize| data.get(i).copied().unwrap_or(0);
    let size = 1u16 << (b(0) % 9);
    let packed = b(1) & 1 != 0;
    let base = u32::from_le_bytes([b(2), b(3), b(4), b(5)]);
    let flags = u16::from_le_bytes([b(6), b(7)]);
    let Ok((area, file, len)) = InflightArea::create(1, size) else { return };
    let region = data.get(HEADER..).unwrap_or(&[]);
    let region = &region[..region.len().min(len as usize)];
    file.write_all_at(region, 0).expect("write the region");

    let mut tracker = if packed {
        let Ok(mut q) = area.packed_queue(0, size) else { return };
        let Ok(r) = q.recover(PackedState::from_vring_base(base), |_| Some(flags)) else { return };
        let mut slots = 0u32;
        for req in &r.resubmit {
            assert!(req.slots >= 1, "a request of no slots: {req:?}");
            assert_eq!(usize::from(req.slots), req.descs.len(), "{req:?}");
            slots += u32::from(req.slots);
        }
        assert!(slots <= u32::from(size), "{slots} slots in flight in a ring of {size}");
        // A fresh region passes the front-end's base through (the ring checks it when it
        // starts); a recovered position comes from the record and must be inside the ring.
        if r.reused {
            assert!(r.state.next_avail < size && r.state.next_used < size, "{:?}", r.state);
        }
        Tracker::Packed(q)
    } else {
        let Ok(mut q) = area.queue(0, size) else { return };
        let r = q.recover(base as u16);
        let distinct: HashSet<u16> = r.resubmit.iter().copied().collect();
        assert_eq!(distinct.len(), r.resubmit.len(), "a head twice: {:?}", r.resubmit);
        assert!(r.resubmit.iter().all(|&h| h < size), "{:?}", r.resubmit);
        Tracker::Split(q)
    };
    // Keep using the recovered record as the data path would.
    for i in 0..8 {
        let id = u16::from_le_bytes([b(8 + 2 * i), b(9 + 2 * i)]) % size.max(1);
        if let Tracker::Packed(q) = &mut tracker {
            q.begin();
            q.record(RawDesc { addr: 0x1000, len: 16, id, flags: 0 });
        }
        tracker.taken(id);
        tracker.completing(id, 1);
        if i % 3 == 2 {
            tracker.published(i as u16);
        }
    }
    tracker.published(0);
});
