//! Data verification ([`LoadSpec::verify`]): every write is stamped, every read of a block
//! written earlier in the run is compared with the last completed write of that block.
//!
//! The stamp: each 512-byte sector starts with its byte offset on the device and the write's
//! sequence number (both little-endian `u64`), and the rest of the sector is SplitMix64 output
//! seeded from those two, so a sector read back from the wrong place, from an older write or
//! with a torn middle does not compare equal. Blocks are shared out among the request slots
//! (position `p` is only used by slot `p % slots`), so two requests in flight never touch the
//! same block and "the last completed write" is always defined.
//!
//! [`LoadSpec::verify`]: crate::LoadSpec::verify

use crate::rng::SplitMix64;

/// Bytes each stamp covers.
pub(crate) const SECTOR: usize = 512;

/// Positions at most that a verified run tracks (4 bytes each): `--size` bounds bigger devices.
pub(crate) const MAX_POSITIONS: u64 = 1 << 26;

/// What a verified run found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Reads compared with the last completed write of their block.
    pub verified: u64,
    /// Of those, how many differed (each is also counted as an error).
    pub mismatches: u64,
    /// The device byte offset of the first sector that differed.
    pub first_mismatch: Option<u64>,
}

/// The words of the sector stamped at `offset` by write `seq`.
fn sector_words(offset: u64, seq: u64) -> impl Iterator<Item = u64> {
    let mut rng = SplitMix64::new(offset ^ seq.rotate_left(32) ^ 0x7e51_ab1e_5eed_0000);
    [offset, seq].into_iter().chain(std::iter::repeat_with(move || rng.next_u64())).take(SECTOR / 8)
}

/// Fills `buf` (whole sectors) with the stamp of write `seq` at device offset `offset`.
pub(crate) fn stamp(buf: &mut [u8], offset: u64, seq: u64) {
    for (i, sector) in buf.chunks_exact_mut(SECTOR).enumerate() {
        for (dst, w) in sector.chunks_exact_mut(8).zip(sector_words(offset + (i * SECTOR) as u64, seq)) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
    }
}

/// The device offset of the first sector of `buf` (read at `offset`) that is not the stamp of
/// write `seq`, if any.
pub(crate) fn check(buf: &[u8], offset: u64, seq: u64) -> Option<u64> {
    buf.chunks_exact(SECTOR).enumerate().find_map(|(i, sector)| {
        let at = offset + (i * SECTOR) as u64;
        let same = sector.chunks_exact(8).zip(sector_words(at, seq)).all(|(b, w)| b == w.to_le_bytes());
        (!same).then_some(at)
    })
}

/// One slot's request in flight.
#[derive(Clone, Copy, Default)]
struct InFlight {
    pos: u64,
    write: bool,
    seq: u32,
}

/// A disk's verification state: who may use which block, what each block should hold.
pub(crate) struct Verifier {
    region_offset: u64,
    /// Bytes between positions (the block size, or the stride of a sequential pattern).
    unit: u64,
    random: bool,
    rng: SplitMix64,
    /// Per position: the sequence number of its last completed write; 0 when unknown.
    expected: Box<[u32]>,
    /// Per slot (queue-major): its request in flight.
    slots: Box<[InFlight]>,
    /// Per slot, sequential patterns: how many of its positions it has used.
    cursors: Box<[u64]>,
    next_seq: u32,
    report: VerifyReport,
}

impl Verifier {
    /// For `positions` positions `unit` bytes apart from `region_offset`, shared by `slots`
    /// request slots; an error saying why when some slot would have no position or there
    /// are too many to track.
    pub(crate) fn new(
        region_offset: u64,
        unit: u64,
        positions: u64,
        slots: usize,
        random: bool,
        seed: u64,
    ) -> Result<Verifier, String> {
        if positions < slots as u64 {
            return Err(format!(
                "--verify gives each of the {slots} request slots its own blocks, but the region has {positions}"
            ));
        }
        if positions > MAX_POSITIONS {
            return Err(format!(
                "--verify tracks at most {MAX_POSITIONS} blocks and the region has {positions}; limit it with --size"
            ));
        }
        Ok(Verifier {
            region_offset,
            unit,
            random,
            rng: SplitMix64::new(seed ^ 0x0ff5_e7c4_ec4e_d000),
            expected: vec![0; positions as usize].into_boxed_slice(),
            slots: vec![InFlight::default(); slots].into_boxed_slice(),
            cursors: vec![0; slots].into_boxed_slice(),
            next_seq: 0,
            report: VerifyReport::default(),
        })
    }

    /// Picks the position of slot `slot`'s next request; with `write`, stamps `buf` for it.
    /// Returns the device offset.
    pub(crate) fn submit(&mut self, slot: usize, write: bool, buf: &mut [u8]) -> u64 {
        let n = self.slots.len() as u64;
        let positions = self.expected.len() as u64;
        // Slot `slot` owns positions slot, slot + n, slot + 2n, ...
        let owned = (positions - slot as u64).div_ceil(n);
        let k = if self.random {
            self.rng.below(owned)
        } else {
            let c = self.cursors[slot];
            self.cursors[slot] = if c + 1 == owned { 0 } else { c + 1 };
            c
        };
        let pos = slot as u64 + k * n;
        let offset = self.region_offset + pos * self.unit;
        let mut seq = 0;
        if write {
            // 0 means "unknown": skipped when the counter wraps.
            self.next_seq = self.next_seq.wrapping_add(1).max(1);
            seq = self.next_seq;
            stamp(buf, offset, u64::from(seq));
        }
        self.slots[slot] = InFlight { pos, write, seq };
        offset
    }

    /// Accounts for slot `slot`'s completion (`ok`: without error), whose data is in `buf`.
    /// Returns false when a read did not return what the block's last write put there.
    pub(crate) fn complete(&mut self, slot: usize, ok: bool, buf: &[u8]) -> bool {
        let f = self.slots[slot];
        let pos = f.pos as usize;
        if f.write {
            // A failed write may have changed part of the block: its content is unknown.
            self.expected[pos] = if ok { f.seq } else { 0 };
            return true;
        }
        let seq = self.expected[pos];
        if !ok || seq == 0 {
            return true;
        }
        self.report.verified += 1;
        match check(buf, self.region_offset + f.pos * self.unit, u64::from(seq)) {
            None => true,
            Some(at) => {
                self.report.mismatches += 1;
                self.report.first_mismatch.get_or_insert(at);
                false
            }
        }
    }

    pub(crate) fn report(&self) -> VerifyReport {
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_checks_only_against_its_own_offset_and_write() {
        let mut buf = vec![0u8; 4096];
        stamp(&mut buf, 8192, 7);
        assert_eq!(check(&buf, 8192, 7), None);
        // Each sector carries its own offset: the data of another block does not pass.
        assert_eq!(check(&buf, 4096, 7), Some(4096));
        // Nor does an older write of the same block.
        assert_eq!(check(&buf, 8192, 6), Some(8192));
        // The sectors differ from each other, so a sector in the wrong place is caught.
        assert_ne!(buf[..SECTOR], buf[SECTOR..2 * SECTOR]);
        // One flipped byte in the middle of the fourth sector.
        buf[3 * SECTOR + 100] ^= 1;
        assert_eq!(check(&buf, 8192, 7), Some(8192 + 3 * SECTOR as u64));
        // Zeroes (an unwritten or null device) never pass.
        assert_eq!(check(&[0u8; 1024], 0, 1), Some(0));
    }

    #[test]
    fn slots_never_share_a_block() {
        for random in [true, false] {
            let mut v = Verifier::new(1 << 20, 4096, 10, 4, random, 3).unwrap();
            let mut buf = [0u8; 4096];
            for _ in 0..1000 {
                for slot in 0..4 {
                    let off = v.submit(slot, false, &mut buf);
                    assert_eq!(off % 4096, 0);
                    let pos = (off - (1 << 20)) / 4096;
                    assert!(pos < 10, "{off}");
                    assert_eq!(pos % 4, slot as u64);
                }
            }
        }
    }

    #[test]
    fn sequential_slots_walk_their_own_blocks() {
        let mut v = Verifier::new(0, 512, 5, 2, false, 0).unwrap();
        let mut buf = [0u8; 512];
        let got: Vec<u64> = (0..4).map(|_| v.submit(0, false, &mut buf) / 512).collect();
        assert_eq!(got, vec![0, 2, 4, 0]);
        let got: Vec<u64> = (0..3).map(|_| v.submit(1, false, &mut buf) / 512).collect();
        assert_eq!(got, vec![1, 3, 1]);
    }

    #[test]
    fn reads_check_the_last_completed_write() {
        // One slot, one block: every request goes to offset 0.
        let mut v = Verifier::new(0, 1024, 1, 1, true, 0).unwrap();
        let mut dev = [0u8; 1024];
        let mut buf = [0u8; 1024];
        // A read of a block never written is not checked.
        v.submit(0, false, &mut buf);
        assert!(v.complete(0, true, &dev));
        assert_eq!(v.report().verified, 0);
        // A write, "done" by the device, then a read of it.
        v.submit(0, true, &mut buf);
        dev = buf;
        assert!(v.complete(0, true, &buf));
        v.submit(0, false, &mut buf);
        assert!(v.complete(0, true, &dev));
        // A second write that the device drops: the read returns the first write's data.
        v.submit(0, true, &mut buf);
        assert!(v.complete(0, true, &buf));
        v.submit(0, false, &mut buf);
        assert!(!v.complete(0, true, &dev));
        // A failed write leaves the block unknown: not checked again until rewritten.
        v.submit(0, true, &mut buf);
        assert!(v.complete(0, false, &buf));
        v.submit(0, false, &mut buf);
        assert!(v.complete(0, true, &[0u8; 1024]));
        // A failed read is not compared.
        v.submit(0, true, &mut buf);
        assert!(v.complete(0, true, &buf));
        v.submit(0, false, &mut buf);
        assert!(v.complete(0, false, &[0u8; 1024]));
        assert_eq!(v.report(), VerifyReport { verified: 2, mismatches: 1, first_mismatch: Some(0) });
    }

    #[test]
    fn every_slot_needs_a_block() {
        assert!(Verifier::new(0, 4096, 3, 4, true, 0).is_err());
        assert!(Verifier::new(0, 4096, MAX_POSITIONS + 1, 4, true, 0).is_err());
    }
}
