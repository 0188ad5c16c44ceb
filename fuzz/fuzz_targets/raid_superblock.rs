//! Fuzz the raid's on-disk metadata (`fp_raid::format`, `fp_raid::meta_io`): the superblock
//! copies and bitmap pages a base holds are whatever its last writer, a crash or a hostile
//! image left there, and they are read whenever the base appears (examine) or joins.
//!
//! Input layout:
//!
//! | offset | size | meaning |
//! |-------:|-----:|---------|
//! | 0 | 1 | bit 0, 1, 2: re-seal superblock copy A, copy B, the bitmap page (below) |
//! | 1 | 4096 | page 0: superblock copy A |
//! | 4097 | 4096 | page 1: superblock copy B |
//! | 8193 | 4096 | page 2: the first bitmap page |
//!
//! Missing bytes are zero. Re-sealing puts the magic in place and recomputes the page's CRC-32C,
//! so mutations reach the field checks instead of stopping at the checksum.
//!
//! Invariants: decoding never panics; a page that decodes encodes back to the same bytes, and
//! the value decodes again to itself; `newest` takes a valid copy with the highest sequence;
//! a bitmap page accepted for a superblock belongs to its raid and is not newer than it; the
//! base read through `meta_io` gives the same superblock, and loading its bitmap (when the map
//! is small enough to build) either trusts the page or marks its whole range dirty; the
//! base-size check never overflows, and passes only when the slot's data lies in the base.
#![no_main]

use fp_raid::format::{newest, BitmapPage, Superblock, BITMAP_BITS_PER_PAGE, PAGE_SIZE};
use fp_raid::meta_io::{self, MemBase};
use fp_raid::IntentMap;
use libfuzzer_sys::fuzz_target;

fn reseal(page: &mut [u8], magic: &[u8; 8], crc_at: usize) {
    page[..8].copy_from_slice(magic);
    page[crc_at..crc_at + 4].fill(0);
    let crc = crc32c::crc32c(page);
    page[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let mut image = vec![0u8; 3 * PAGE_SIZE];
    let n = rest.len().min(image.len());
    image[..n].copy_from_slice(&rest[..n]);
    if flags & 1 != 0 {
        reseal(&mut image[..PAGE_SIZE], b"FPRAIDSB", 12);
    }
    if flags & 2 != 0 {
        reseal(&mut image[PAGE_SIZE..2 * PAGE_SIZE], b"FPRAIDSB", 12);
    }
    if flags & 4 != 0 {
        reseal(&mut image[2 * PAGE_SIZE..], b"FPRAIDBM", 8);
    }
    let copies: Vec<_> = (0..2).map(|i| Superblock::decode(&image[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])).collect();
    for (i, c) in copies.iter().enumerate() {
        if let Ok(sb) = c {
            let page = sb.encode();
            assert_eq!(&page[..], &image[i * PAGE_SIZE..(i + 1) * PAGE_SIZE], "copy {i} re-encodes differently");
            assert_eq!(&Superblock::decode(&page[..]).unwrap(), sb);
        }
    }
    let best = newest(copies[0].clone(), copies[1].clone());
    let valid: Vec<&Superblock> = copies.iter().filter_map(|c| c.as_ref().ok()).collect();
    match &best {
        Some(b) => assert!(valid.iter().all(|v| v.seq <= b.seq) && valid.contains(&b)),
        None => assert!(valid.is_empty()),
    }
    let bitmap = &image[2 * PAGE_SIZE..];
    if let Ok(bp) = BitmapPage::decode(bitmap) {
        assert_eq!(&bp.encode()[..], bitmap, "the bitmap page re-encodes differently");
    }
    let mut base = MemBase { image: image.clone(), fail: false, flushes: 0 };
    let read = meta_io::read_superblock(&mut base).expect("reads inside the image succeed");
    assert_eq!(read, best);
    let Some(sb) = best else { return };
    // The base-size check examine makes: checked arithmetic, and a pass means the own slot's
    // data lies inside the base (the image's size stands for it, and the largest base).
    for base_bytes in [base.image.len() as u64, u64::MAX] {
        if sb.check_base_size(usize::from(sb.slot), base_bytes).is_ok() {
            let rec = &sb.slots[usize::from(sb.slot)];
            assert!(sb.data_offset.checked_add(rec.data_bytes).is_some_and(|end| end <= base_bytes));
        }
    }
    if let Ok(bp) = BitmapPage::decode_for(bitmap, &sb, 0) {
        assert!(bp.raid_uuid == sb.raid_uuid && bp.seq <= sb.seq && bp.index == 0);
    }
    // The map for the superblock's geometry, when it is small enough for a fuzz input.
    let chunk = sb.bitmap_chunk_bytes;
    if sb.bitmap_pages != 1 || chunk == 0 || sb.raid_bytes().div_ceil(chunk) > 1 << 16 {
        return;
    }
    let map = IntentMap::new(sb.raid_bytes(), chunk, true);
    let corrupt = meta_io::load_bitmap(&mut base, &sb, &map).expect("reads inside the image succeed");
    match BitmapPage::decode_for(bitmap, &sb, 0) {
        Ok(bp) => {
            assert_eq!(corrupt, 0);
            let set: u64 = bp.words.iter().map(|w| u64::from(w.count_ones())).sum();
            assert!(map.set_count() <= set);
        }
        Err(_) => {
            assert_eq!(corrupt, 1);
            assert_eq!(map.set_count(), map.chunks().min(BITMAP_BITS_PER_PAGE));
        }
    }
});
