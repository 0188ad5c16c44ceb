//! Fuzz the persistent dirty bitmap file's parser (`fp_bdev::disk::bitmap_file`): the files in
//! the state directory are read whenever a bdev appears, after whatever a crash, a full disk or
//! another hand left there.
//!
//! Input: the file's bytes as they are.
//!
//! Invariants: parsing never panics and allocates no more than the input holds; a file that
//! parses encodes back to the same bytes, has the word count its size and granularity call
//! for, a granularity the RPC would accept and no bit beyond the bdev's end; its bits, merged
//! into a bitmap of its geometry, count no more dirty bytes than its size.
#![no_main]

use fp_bdev::disk::bitmap_file::{words_for, BitmapFile};
use fp_bdev::disk::{check_granularity, DirtyBitmap};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = BitmapFile::parse(data) else { return };
    assert_eq!(file.encode(), data, "a parsed file re-encodes differently");
    assert_eq!(file.words.len() as u64, words_for(file.size, file.granularity));
    assert!(check_granularity("granularity", file.granularity).is_ok());
    // Small enough to build: the words are already in memory, the bitmap is as large.
    let b = DirtyBitmap::new(&file.name, file.size, file.granularity, true, true);
    b.merge_from(&file.bits());
    assert!(b.info().count <= file.size);
    let set: u64 = file.words.iter().map(|w| u64::from(w.count_ones())).sum();
    assert_eq!(b.take().words().iter().map(|w| u64::from(w.count_ones())).sum::<u64>(), set);
});
