//! Fuzz loading a logical-volume store (`fp_lvol::Store::load`) from an arbitrary device image:
//! the metadata a base bdev holds is whatever its last writer, a crash or a hostile image
//! provider left there, and the store is loaded automatically when the bdev appears.
//!
//! Input layout:
//!
//! | offset | size | meaning |
//! |-------:|-----:|---------|
//! | 0 | 1 | bit 0: re-seal the image before loading (below) |
//! | 1 | .. | the device image, from page 0; a partial last page is ignored; at most 64 pages |
//!
//! Re-sealing puts the magic numbers in place and recomputes the label's and each super block's
//! CRC-32C and the super blocks' page-checksum tables, as far as the (mutated) label and super
//! blocks say where things are. Without it nearly every mutation would stop at a checksum;
//! with it the fuzzer reaches the stream decoder and the store's cross-checks (parents, cycles,
//! cluster ownership, free count).
//!
//! Invariants: loading never panics and fails only with `NotAStore` or `Corrupt`; a store that
//! loads maps no cluster twice, its free count is what its maps leave, and it goes on working:
//! it commits, loads back the same, takes a new volume and an allocating write, commits and
//! loads back the same again.
//!
//! `FP_FUZZ_TRACE=1` prints each input's load outcome.
#![no_main]

mod common;

use std::collections::HashSet;

use fp_lvol::crc::crc32c;
use fp_lvol::format::{
    self, CRC_AT, LABEL_MAGIC, MAX_GENERATION, MAX_STREAM_PAGES, SUPER_HEADER, SUPER_MAGIC,
};
use fp_lvol::{LvolError, MemDevice, Store, Uuid, PAGE_SIZE, UNALLOCATED};
use libfuzzer_sys::fuzz_target;

const MAX_PAGES: usize = 64;

fn u32_at(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(p[at..at + 4].try_into().unwrap())
}

fn page_mut(image: &mut [u8], i: usize) -> Option<&mut [u8; PAGE_SIZE]> {
    image.get_mut(i * PAGE_SIZE..(i + 1) * PAGE_SIZE).map(|p| p.try_into().unwrap())
}

fn reseal(image: &mut [u8]) {
    let Some(label) = page_mut(image, 0) else { return };
    label[..8].copy_from_slice(&LABEL_MAGIC);
    format::seal(label);
    // area_pages: after magic, version, crc, uuid, cluster size and block size.
    let area_pages = u32_at(label, 44) as usize;
    for area in 0..2 {
        let start = 1 + area * area_pages;
        let Some(sb) = page_mut(image, start) else { continue };
        sb[..8].copy_from_slice(&SUPER_MAGIC);
        // Stream pages: after magic .. area_pages (offset 56).
        let stream_pages = (u32_at(sb, 60) as usize).min(MAX_STREAM_PAGES);
        let mut crcs = Vec::new();
        for i in 0..stream_pages {
            match image.get((start + 1 + i) * PAGE_SIZE..(start + 2 + i) * PAGE_SIZE) {
                Some(p) => crcs.push(crc32c(p)),
                None => break,
            }
        }
        let sb = page_mut(image, start).unwrap();
        for (i, c) in crcs.iter().enumerate() {
            sb[SUPER_HEADER + 4 * i..SUPER_HEADER + 4 * i + 4].copy_from_slice(&c.to_le_bytes());
        }
        format::seal(sb);
    }
    debug_assert_eq!(CRC_AT, 12);
}

type Summary = (String, u64, u64, u64, Vec<fp_lvol::Volume>);

fn summary(s: &Store) -> Summary {
    (s.name().to_string(), s.total_clusters(), s.free_clusters(), s.generation(), s.volumes().to_vec())
}

fn check(s: &Store) {
    let mut seen = HashSet::new();
    for v in s.volumes() {
        for &c in v.map.iter().filter(|&&c| c != UNALLOCATED) {
            assert!((c as u64) < s.total_clusters(), "cluster {c} past the store");
            assert!(seen.insert(c), "cluster {c} owned twice");
        }
    }
    assert_eq!(s.free_clusters(), s.total_clusters() - seen.len() as u64, "free count");
}

/// A store at [`MAX_GENERATION`] must refuse to commit and leave the device's store as it
/// was; returns whether the store was there (the target then stops).
fn refused_at_the_last_generation(store: &mut Store, dev: &mut MemDevice) -> bool {
    if store.generation() < MAX_GENERATION {
        return false;
    }
    let durable = summary(&Store::load(dev).expect("load before the refused commit"));
    assert!(store.commit(dev).is_err(), "a commit past generation {MAX_GENERATION}");
    assert_eq!(summary(&Store::load(dev).expect("load after the refused commit")), durable);
    true
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, image)) = data.split_first() else { return };
    let mut image = image[..image.len().min(MAX_PAGES * PAGE_SIZE)].to_vec();
    if flags & 1 != 0 {
        reseal(&mut image);
    }
    let mut dev = MemDevice::from_image(image);
    let loaded = Store::load(&mut dev);
    if common::trace() {
        match &loaded {
            Ok(s) => eprintln!(
                "loaded generation {}: {} volumes, {} free clusters",
                s.generation(),
                s.volumes().len(),
                s.free_clusters()
            ),
            Err(e) => eprintln!("refused: {e}"),
        }
    }
    let mut store = match loaded {
        Ok(s) => s,
        Err(LvolError::NotAStore(_) | LvolError::Corrupt(_)) => return,
        Err(e) => panic!("load failed with {e:?}"),
    };
    check(&store);
    // Every store that loads commits, and its commit is what loads next (twice, below); but a
    // store at the last generation a super block may hold refuses, changing nothing.
    if refused_at_the_last_generation(&mut store, &mut dev) {
        return;
    }
    store.commit(&mut dev).expect("commit of a loaded store");
    let back = Store::load(&mut dev).expect("load after commit");
    assert_eq!(summary(&back), summary(&store));
    // A new volume and a first write to it, if the store has room (refusals change nothing).
    let uuid = Uuid([0xF5; 16]);
    if store.create_volume(uuid, "fuzz-new", store.cluster_size(), true).is_ok() {
        let _ = store.allocate_for_write(&uuid, 0);
    }
    check(&store);
    if refused_at_the_last_generation(&mut store, &mut dev) {
        return;
    }
    store.commit(&mut dev).expect("second commit");
    let back = Store::load(&mut dev).expect("load after the second commit");
    assert_eq!(summary(&back), summary(&store));
});
