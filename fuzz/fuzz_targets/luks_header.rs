//! Fuzz the LUKS header reader (`fp_luks::Volume::load`): a LUKS volume's first bytes are
//! whatever cryptsetup, QEMU, a crash or a hostile image left there, and the crypto bdev reads
//! them whenever it opens the volume. Never unlocks (the KDFs' cost is the point of them).
//!
//! Input layout:
//!
//! | offset | size | meaning |
//! |-------:|-----:|---------|
//! | 0 | 1 | bit 0, 1: re-seal the LUKS2 primary, secondary copy (below) |
//! | 1 | rest | the device image (its size is the device's) |
//!
//! Re-sealing recomputes a copy's SHA-256 checksum (over its `hdr_size` bytes with the checksum
//! field zeroed; the secondary is taken at the primary's `hdr_size`), so mutations of the JSON
//! reach the parser and the field checks instead of stopping at the checksum.
//!
//! Invariants: loading never panics and fails only with NotLuks, NewerVersion, Damaged or
//! Unsupported (every read is inside the image); a volume that loads answers every accessor
//! (data_size never exceeds the device past the data offset), and its header, encoded and
//! written over a copy of the image, loads back to the same volume.
#![no_main]

use fp_luks::{ErrorKind, MemIo, MetaIo, Volume};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const COPY_SIZES: [u64; 9] = [0x4000, 0x8000, 0x1_0000, 0x2_0000, 0x4_0000, 0x8_0000, 0x10_0000, 0x20_0000, 0x40_0000];

fn hdr_size(image: &[u8], at: usize) -> Option<usize> {
    let raw: [u8; 8] = image.get(at + 8..at + 16)?.try_into().ok()?;
    let size = u64::from_be_bytes(raw);
    COPY_SIZES.contains(&size).then_some(size as usize)
}

fn reseal(image: &mut [u8], at: usize, size: usize) {
    let Some(copy) = image.get_mut(at..at + size) else { return };
    copy[448..512].fill(0);
    let sum = Sha256::digest(&copy[..]);
    copy[448..480].copy_from_slice(&sum);
}

fn same(a: &Volume, b: &Volume, device: u64) {
    assert_eq!(a.version(), b.version());
    assert_eq!(a.uuid(), b.uuid());
    assert_eq!(a.label(), b.label());
    assert_eq!(a.cipher(), b.cipher());
    assert_eq!(a.key_bits(), b.key_bits());
    assert_eq!(a.sector_size(), b.sector_size());
    assert_eq!(a.data_offset(), b.data_offset());
    assert_eq!(a.data_size(device), b.data_size(device));
    assert_eq!(a.keyslots(), b.keyslots());
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let mut image = rest.to_vec();
    if let Some(size) = hdr_size(&image, 0) {
        if flags & 1 != 0 {
            reseal(&mut image, 0, size);
        }
        if flags & 2 != 0 {
            reseal(&mut image, size, size);
        }
    }
    let mut io = MemIo(image);
    let vol = match Volume::load(&mut io) {
        Ok(v) => v,
        Err(e) => {
            let kind = e.kind();
            assert!(
                matches!(kind, ErrorKind::NotLuks | ErrorKind::NewerVersion | ErrorKind::Damaged | ErrorKind::Unsupported),
                "load failed with {e}"
            );
            return;
        }
    };
    let device = io.size();
    for size in [0, device, u64::MAX] {
        assert!(vol.data_size(size) <= size.saturating_sub(vol.data_offset()));
    }
    assert_eq!(vol.cipher(), "aes-xts-plain64");
    assert!(vol.sector_size().is_power_of_two() && (512..=4096).contains(&vol.sector_size()));
    for slot in vol.keyslots() {
        assert!(slot.area_offset + slot.area_size <= vol.data_offset(), "slot {} overlaps the data", slot.slot);
    }
    let copies = match vol.encode_header() {
        Ok(c) => c,
        // Numbers the JSON spelt shorter than serde_json writes them may no longer fit.
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            return;
        }
    };
    let end = copies.iter().map(|(at, b)| *at as usize + b.len()).max().unwrap_or(0);
    let mut again = MemIo(io.0.clone());
    if again.0.len() < end {
        again.0.resize(end, 0);
    }
    for (at, bytes) in &copies {
        again.write_at(*at, bytes).expect("inside the image");
    }
    let reloaded = Volume::load(&mut again).expect("an encoded header loads");
    same(&vol, &reloaded, device);
});
