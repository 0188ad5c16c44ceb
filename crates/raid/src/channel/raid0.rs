//! raid0: strips of `strip_bytes` laid across the bases in turn, strip `i` on base
//! `i % n` at strip `i / n` of that base.

use super::split::SplitMap;

/// raid0's mapping: `n` bases, strips of `strip_bytes` (a power of two).
#[derive(Debug, Clone, Copy)]
pub struct Raid0Map {
    shift: u32,
    n: u64,
}

impl Raid0Map {
    /// The map of `n` bases with strips of `strip_bytes` (a power of two).
    pub fn new(n: usize, strip_bytes: u64) -> Raid0Map {
        debug_assert!(strip_bytes.is_power_of_two() && n > 0);
        Raid0Map { shift: strip_bytes.trailing_zeros(), n: n as u64 }
    }
}

impl SplitMap for Raid0Map {
    #[inline]
    fn map(&self, offset: u64) -> (usize, u64, u64) {
        let strip = offset >> self.shift;
        let within = offset & ((1 << self.shift) - 1);
        let slot = (strip % self.n) as usize;
        let base_off = ((strip / self.n) << self.shift) + within;
        (slot, base_off, (1 << self.shift) - within)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_go_round_the_bases() {
        let m = Raid0Map::new(3, 4096);
        assert_eq!(m.map(0), (0, 0, 4096));
        assert_eq!(m.map(4096 + 512), (1, 512, 3584));
        assert_eq!(m.map(2 * 4096), (2, 0, 4096));
        assert_eq!(m.map(3 * 4096 + 1024), (0, 4096 + 1024, 3072));
        assert_eq!(m.map(7 * 4096), (1, 2 * 4096, 4096));
    }
}
