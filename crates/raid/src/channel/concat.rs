//! concat: the bases' data regions one after the other, each base's whole region in turn.

use super::split::SplitMap;

/// concat's mapping: where each base starts in the raid.
#[derive(Debug, Clone)]
pub struct ConcatMap {
    /// Raid offset of each base's first byte, then the raid's size.
    starts: Box<[u64]>,
}

impl ConcatMap {
    /// The map of bases of `sizes` bytes each, in order.
    pub fn new(sizes: &[u64]) -> ConcatMap {
        let mut starts = Vec::with_capacity(sizes.len() + 1);
        let mut at = 0;
        for s in sizes {
            starts.push(at);
            at += s;
        }
        starts.push(at);
        ConcatMap { starts: starts.into_boxed_slice() }
    }
}

impl SplitMap for ConcatMap {
    #[inline]
    fn map(&self, offset: u64) -> (usize, u64, u64) {
        // The last start not above `offset`; few bases, so a short search.
        let slot = self.starts.partition_point(|&s| s <= offset) - 1;
        let slot = slot.min(self.starts.len() - 2);
        let base_off = offset - self.starts[slot];
        (slot, base_off, self.starts[slot + 1] - offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_follow_each_other() {
        let m = ConcatMap::new(&[8192, 4096, 16384]);
        assert_eq!(m.map(0), (0, 0, 8192));
        assert_eq!(m.map(8192 - 512), (0, 8192 - 512, 512));
        assert_eq!(m.map(8192), (1, 0, 4096));
        assert_eq!(m.map(12288 + 1024), (2, 1024, 16384 - 1024));
    }
}
