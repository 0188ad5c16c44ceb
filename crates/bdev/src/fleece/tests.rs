//! The chunk state machine: one copier per chunk, writes held under copies and readers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{check_granularity, ChunkMap, WriterStep};

#[test]
fn chunks_cover_the_range_and_stop_at_the_end() {
    let m = ChunkMap::new(10 * 4096 + 512, 4096);
    assert_eq!(m.count(), 11);
    assert_eq!(m.chunks(0, 0), 0..0);
    assert_eq!(m.chunks(0, 1), 0..1);
    assert_eq!(m.chunks(4095, 2), 0..2);
    assert_eq!(m.chunks(10 * 4096, 512), 10..11);
}

#[test]
fn a_write_copies_once_then_goes() {
    let m = ChunkMap::new(4 * 4096, 4096);
    assert_eq!(m.writer_step(1), WriterStep::Copy);
    assert!(m.try_start_copy(1));
    // A second channel finds it copying: it waits, and cannot claim it.
    assert_eq!(m.writer_step(1), WriterStep::Wait);
    assert!(!m.try_start_copy(1));
    m.finish_copy(1);
    assert!(m.copied(1));
    assert_eq!(m.writer_step(1), WriterStep::Go);
    assert!(!m.try_start_copy(1));
    // Its neighbours are untouched.
    assert_eq!(m.writer_step(0), WriterStep::Copy);
    assert_eq!(m.writer_step(2), WriterStep::Copy);
}

#[test]
fn a_base_reader_holds_the_write_past_the_copy() {
    let m = ChunkMap::new(2 * 4096, 4096);
    assert!(m.start_base_read(0));
    // The copy may run under the reader (both only read the base)...
    assert!(m.try_start_copy(0));
    // ...and a reader arriving while it copies still reads the base.
    assert!(m.start_base_read(0));
    m.finish_copy(0);
    // Copied, but two readers of the base are in flight: the write waits.
    assert_eq!(m.writer_step(0), WriterStep::Wait);
    // A new reader goes to the target.
    assert!(!m.start_base_read(0));
    m.end_base_read(0);
    assert_eq!(m.writer_step(0), WriterStep::Wait);
    m.end_base_read(0);
    assert_eq!(m.writer_step(0), WriterStep::Go);
}

#[test]
fn racing_writers_copy_each_chunk_exactly_once() {
    let m = Arc::new(ChunkMap::new(64 * 4096, 4096));
    let copies = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (m, copies) = (m.clone(), copies.clone());
            std::thread::spawn(move || {
                for c in 0..64 {
                    if m.writer_step(c) == WriterStep::Copy && m.try_start_copy(c) {
                        copies.fetch_add(1, Ordering::SeqCst);
                        m.finish_copy(c);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // However the threads interleaved, each chunk was claimed by one of them.
    assert_eq!(copies.load(Ordering::SeqCst), 64);
    assert!((0..64).all(|c| m.copied(c) && m.writer_step(c) == WriterStep::Go));
}

#[test]
fn granularity_rules() {
    assert!(check_granularity(65536, 512).is_ok());
    assert!(check_granularity(4096, 4096).is_ok());
    assert!(check_granularity(2048, 512).is_err());
    assert!(check_granularity(65535, 512).is_err());
    assert!(check_granularity(32 << 20, 512).is_err());
}
