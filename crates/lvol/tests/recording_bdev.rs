//! The data-path crash simulator's device (tests/common/recording_bdev.rs): it is a correct
//! block device, it records in one order across threads, and its crash images follow the model.

mod common;

use std::sync::Arc;

use common::recording_bdev::{Event, RecordingBdev, SECTOR};
use fp_bdev::conformance::{self, cmd, read_range, write_range, Storage};
use fp_bdev::{BlockDevice, IoChannel, IoOp, IoStatus};
use rand::rngs::SmallRng;
use rand::SeedableRng;

const BS: u32 = 512;

#[test]
fn it_passes_the_block_device_conformance_suite() {
    conformance::run_suite(&|| RecordingBdev::new("rec", BS, 256) as Arc<dyn BlockDevice>, Storage::Keeps);
}

/// Submits a flush and, if `complete`, polls it back.
fn flush(ch: &mut dyn IoChannel, complete: bool) {
    ch.submit(&cmd(9, IoOp::Flush, 0, 0)).unwrap();
    if complete {
        assert_eq!(conformance::poll_until(ch, 1), vec![(9, IoStatus::Success)]);
    }
}

fn sectors(image: &[u8], offset: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| image[offset + i * SECTOR]).collect()
}

#[test]
fn crash_images_keep_what_a_completed_flush_covers_and_any_subset_of_the_rest() {
    let dev = RecordingBdev::new("rec", BS, 64);
    let mut ch = dev.open_channel().unwrap();
    write_range(&mut *ch, 0, &[1; 4096]);
    flush(&mut *ch, true);
    let after_first_flush = dev.position();
    write_range(&mut *ch, 0, &[2; 4096]);
    write_range(&mut *ch, 8192, &[3; 4096]);
    // Submitted, not yet returned by poll: it does not count.
    flush(&mut *ch, false);
    assert_eq!(dev.durable_flush(dev.position()), Some(1));
    let mut rng = SmallRng::seed_from_u64(7);
    let (mut old, mut new, mut torn, mut absent, mut present) = (0, 0, 0, 0, 0);
    for _ in 0..400 {
        let image = dev.crash_image(&mut rng);
        // Page 0: the flushed write (1), overwritten in whole or in part by the later one (2).
        let s = sectors(&image, 0, 8);
        assert!(s.iter().all(|&b| b == 1 || b == 2), "{s:?}");
        match (s.contains(&1), s.contains(&2)) {
            (true, false) => old += 1,
            (false, true) => new += 1,
            _ => torn += 1,
        }
        // Page 2: zeroes or the unflushed write, whole or in part.
        let s = sectors(&image, 8192, 8);
        assert!(s.iter().all(|&b| b == 0 || b == 3), "{s:?}");
        if s.contains(&3) {
            present += 1;
        } else {
            absent += 1;
        }
        // Within a sector, nothing is torn.
        assert!(image[..4096].chunks(SECTOR).all(|c| c.iter().all(|&b| b == c[0])));
    }
    assert!(
        old > 50 && new > 50 && torn > 20 && absent > 50 && present > 50,
        "{old} {new} {torn} {absent} {present}"
    );
    // A cut before the first flush completed keeps nothing for sure.
    let early = dev.crash_image_at(after_first_flush - 1, &mut rng);
    assert!(early[0] == 0 || early[0] == 1);
    assert_eq!(dev.durable_flush(after_first_flush - 1), None);
    // Once the second flush is polled back, every write is durable: every crash image is the
    // device as it is.
    conformance::poll_until(&mut *ch, 1);
    for _ in 0..20 {
        assert_eq!(dev.crash_image(&mut rng), dev.image());
    }
}

#[test]
fn discards_and_write_zeroes_are_recorded_as_zeroes() {
    let dev = RecordingBdev::new("rec", BS, 64);
    let mut ch = dev.open_channel().unwrap();
    write_range(&mut *ch, 0, &[5; 8192]);
    for (op, at) in [(IoOp::Discard, 0), (IoOp::WriteZeroes, 4096)] {
        ch.submit(&cmd(1, op, at, 4096)).unwrap();
        conformance::poll_until(&mut *ch, 1);
    }
    assert_eq!(read_range(&mut *ch, 0, 8192), vec![0; 8192]);
    let events = dev.events();
    assert_eq!(
        events[1..],
        [Event::Zeroes { offset: 0, len: 4096 }, Event::Zeroes { offset: 4096, len: 4096 }]
    );
    flush(&mut *ch, true);
    assert_eq!(dev.crash_image(&mut SmallRng::seed_from_u64(1)), vec![0; 64 * 512]);
}

/// Channels on several threads: every write lands in the one log, each with its data, and a
/// crash image after all flushes completed is the device as it is.
#[test]
fn channels_on_several_threads_record_in_one_order() {
    let dev = RecordingBdev::new("rec", BS, 1024);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let dev = Arc::clone(&dev);
            s.spawn(move || {
                let mut ch = dev.open_channel().unwrap();
                for i in 0..50u64 {
                    write_range(&mut *ch, (t as u64 * 256 + i) * 512, &[t + 1; 512]);
                }
                flush(&mut *ch, true);
            });
        }
    });
    let events = dev.events();
    let writes = events.iter().filter(|e| matches!(e, Event::Write { .. })).count();
    let done = events.iter().filter(|e| matches!(e, Event::FlushDone(_))).count();
    assert_eq!((writes, done, events.len()), (200, 4, 208));
    assert_eq!(dev.crash_image(&mut SmallRng::seed_from_u64(3)), dev.image());
    for t in 0..4u8 {
        assert_eq!(dev.image()[t as usize * 256 * 512 + 49 * 512], t + 1);
    }
}

#[test]
fn it_resizes_and_loads_from_an_image() {
    let dev = RecordingBdev::new("rec", BS, 16);
    let mut ch = dev.open_channel().unwrap();
    write_range(&mut *ch, 0, &[4; 512]);
    dev.resize(32).unwrap();
    assert_eq!(dev.info().num_blocks(), 32);
    write_range(&mut *ch, 31 * 512, &[6; 512]);
    let copy = RecordingBdev::from_image("copy", BS, dev.image());
    let mut ch = copy.open_channel().unwrap();
    assert_eq!(read_range(&mut *ch, 0, 512), vec![4; 512]);
    assert_eq!(read_range(&mut *ch, 31 * 512, 512), vec![6; 512]);
    assert_eq!(copy.position(), 0);
}
