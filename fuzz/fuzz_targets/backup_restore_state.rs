//! Fuzz a live restore's state file parser (`fp_backup_bdev::restore::state_file::parse`): the
//! file in the state directory is read whenever the restore bdev is created (at each start),
//! after whatever a crash, a full disk or another hand left there.
//!
//! Input: the file's bytes as they are, read as the state of a fixed restore of 20 chunks.
//!
//! Invariants: parsing never panics; a file taken up has a bitmap of exactly the bytes 20
//! chunks need and no bit past the last chunk; encoding what was taken up and parsing it
//! again gives the same.
#![no_main]

use fp_backup_bdev::restore::state_file::{encode, parse, Identity};
use libfuzzer_sys::fuzz_target;

const CHUNKS: u64 = 20;

fuzz_target!(|data: &[u8]| {
    let id = Identity {
        name: "r".into(),
        store: "s".into(),
        disk: "vm".into(),
        backup_id: "20261130T101500Z-1a2b3c4d".into(),
        size: CHUNKS << 16,
    };
    let Ok(Some(loaded)) = parse(data, &id, CHUNKS) else { return };
    assert_eq!(loaded.bitmap.len() as u64, CHUNKS.div_ceil(8));
    assert_eq!(loaded.bitmap[2] >> (CHUNKS % 8), 0, "a bit past the last chunk");
    let again = encode(&id, CHUNKS, &loaded.bitmap, loaded.complete);
    assert_eq!(parse(&again, &id, CHUNKS), Ok(Some(loaded)));
});
