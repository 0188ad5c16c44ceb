//! A log-bucketed latency histogram in the style of HdrHistogram.
//!
//! Values (nanoseconds, but any `u64` works) are counted in buckets whose width grows with the
//! value: every power-of-two range `[2^e, 2^(e+1))` is split into [`SUB_BUCKETS`] equal
//! sub-buckets, and values below `SUB_BUCKETS` get one bucket each. A recorded value is therefore
//! known to within `1 / SUB_BUCKETS` of itself (under 0.8 %), over the whole `u64` range, with a
//! fixed table of [`BUCKETS`] counters allocated once when the histogram is made. Recording is a
//! leading-zero count, a shift and an increment: no allocation, no branch on the table size.
//!
//! Percentiles report the *highest value equivalent* to the bucket holding the requested rank
//! (the bucket's upper bound), clamped to the exact minimum and maximum seen, so they never
//! understate a latency by more than one bucket width and never exceed the real maximum.

/// log2 of the number of sub-buckets per power-of-two range.
pub const SUB_BITS: u32 = 7;
/// Sub-buckets per power-of-two range; also the bound below which values are counted exactly.
pub const SUB_BUCKETS: u64 = 1 << SUB_BITS;
/// Total number of counters: one block of `SUB_BUCKETS` for the exact range `[0, SUB_BUCKETS)`
/// and one for each exponent from `SUB_BITS` to 63.
pub const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) << SUB_BITS;

/// The counter index for `value`.
#[inline]
pub fn bucket_index(value: u64) -> usize {
    if value < SUB_BUCKETS {
        return value as usize;
    }
    // exp >= SUB_BITS here: the position of the highest set bit.
    let exp = 63 - value.leading_zeros();
    let shift = exp - SUB_BITS;
    // (value >> shift) is in [SUB_BUCKETS, 2 * SUB_BUCKETS): its low SUB_BITS bits pick the
    // sub-bucket, and the block number is shift + 1 (block 0 is the exact range).
    let block = (shift + 1) as usize;
    (block << SUB_BITS) + ((value >> shift) - SUB_BUCKETS) as usize
}

/// The smallest and largest value counted by bucket `index` (inclusive).
#[inline]
pub fn bucket_bounds(index: usize) -> (u64, u64) {
    let block = index >> SUB_BITS;
    let sub = (index as u64) & (SUB_BUCKETS - 1);
    if block == 0 {
        return (sub, sub);
    }
    let shift = (block - 1) as u32;
    let low = (SUB_BUCKETS + sub) << shift;
    let high = low + ((1u64 << shift) - 1);
    (low, high)
}

/// A latency histogram with a fixed, preallocated table.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.total)
            .field("min", &self.min())
            .field("max", &self.max)
            .field("mean", &self.mean())
            .finish()
    }
}

impl Histogram {
    /// An empty histogram; the only allocation it ever makes.
    pub fn new() -> Self {
        Histogram { counts: vec![0u64; BUCKETS].into_boxed_slice(), total: 0, sum: 0, min: u64::MAX, max: 0 }
    }

    /// Counts one value.
    #[inline]
    pub fn record(&mut self, value: u64) {
        // bucket_index() < BUCKETS for every u64, so this never goes out of bounds.
        self.counts[bucket_index(value)] += 1;
        self.total += 1;
        self.sum += u128::from(value);
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// Adds every count of `other` to `self`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += *b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Forgets every value, keeping the table.
    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.total = 0;
        self.sum = 0;
        self.min = u64::MAX;
        self.max = 0;
    }

    /// The non-empty buckets, ascending: `(low, high, count)` with inclusive bounds.
    pub fn nonzero_buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(i, &c)| {
            let (low, high) = bucket_bounds(i);
            (low, high, c)
        })
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Smallest value recorded (exact), 0 when empty.
    pub fn min(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            self.min
        }
    }

    /// Largest value recorded (exact), 0 when empty.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Arithmetic mean of the values recorded (exact up to float rounding), 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value at percentile `p` (0..=100): the smallest bucket upper bound such that at least
    /// `p` % of the values are at or below it, clamped to `[min, max]`. 0 when empty.
    ///
    /// The rank is `ceil(p / 100 * count)`, at least 1, so `p = 0` gives the minimum and
    /// `p = 100` the maximum.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let p = if p.is_nan() { 100.0 } else { p.clamp(0.0, 100.0) };
        let rank = ((p / 100.0) * self.total as f64).ceil() as u64;
        let rank = rank.clamp(1, self.total);
        let mut seen = 0u64;
        for (index, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (_, high) = bucket_bounds(index);
                return high.clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rng::SplitMix64;

    fn next(rng: &mut SplitMix64) -> u64 {
        rng.next_u64()
    }

    #[test]
    fn small_values_have_exact_buckets() {
        for v in 0..SUB_BUCKETS {
            assert_eq!(bucket_index(v), v as usize);
            assert_eq!(bucket_bounds(v as usize), (v, v));
        }
        assert_eq!(bucket_index(SUB_BUCKETS), SUB_BUCKETS as usize);
        // 128..=255 are still exact (shift 0); 256 starts buckets of width 2.
        assert_eq!(bucket_bounds(bucket_index(255)), (255, 255));
        assert_eq!(bucket_bounds(bucket_index(256)), (256, 257));
        assert_eq!(bucket_bounds(bucket_index(257)), (256, 257));
    }

    #[test]
    fn every_value_lies_in_its_bucket_and_buckets_tile_the_range() {
        // Bucket i+1 starts right after bucket i ends, for the whole table.
        let mut expected_low = 0u64;
        for i in 0..BUCKETS {
            let (low, high) = bucket_bounds(i);
            assert_eq!(low, expected_low, "bucket {i}");
            assert!(high >= low);
            assert_eq!(bucket_index(low), i);
            assert_eq!(bucket_index(high), i);
            if i + 1 == BUCKETS {
                assert_eq!(high, u64::MAX);
            } else {
                expected_low = high + 1;
            }
        }
        let mut s = SplitMix64::new(7);
        for _ in 0..100_000 {
            let v = next(&mut s) >> (next(&mut s) % 64);
            let (low, high) = bucket_bounds(bucket_index(v));
            assert!(low <= v && v <= high, "{v} not in [{low}, {high}]");
            // Relative width bound: high - low < low / SUB_BUCKETS (+1 for the exact range).
            assert!((high - low) <= low / SUB_BUCKETS, "{v}: [{low}, {high}] too wide");
        }
        assert_eq!(bucket_index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn empty_histogram_reports_zero() {
        let h = Histogram::new();
        assert_eq!(h.count(), 0);
        assert_eq!(h.percentile(50.0), 0);
        assert_eq!(h.percentile(99.9), 0);
        assert_eq!(h.min(), 0);
        assert_eq!(h.max(), 0);
        assert_eq!(h.mean(), 0.0);
    }

    #[test]
    fn exact_percentiles_on_small_values() {
        let mut h = Histogram::new();
        for v in 1..=100u64 {
            h.record(v);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.percentile(50.0), 50);
        assert_eq!(h.percentile(99.0), 99);
        assert_eq!(h.percentile(99.9), 100);
        assert_eq!(h.percentile(100.0), 100);
        assert_eq!(h.percentile(0.0), 1);
        assert_eq!(h.percentile(1.0), 1);
        assert_eq!(h.percentile(1.5), 2);
        assert_eq!(h.mean(), 50.5);
    }

    #[test]
    fn percentiles_of_a_uniform_range_are_within_one_bucket() {
        let mut h = Histogram::new();
        let n = 1_000_000u64;
        for v in 1..=n {
            h.record(v * 10); // 10 ns .. 10 ms
        }
        for (p, exact) in [(50.0, 5_000_000u64), (99.0, 9_900_000), (99.9, 9_990_000)] {
            let got = h.percentile(p);
            assert!(got >= exact, "p{p}: {got} < {exact}");
            let err = (got - exact) as f64 / exact as f64;
            assert!(err <= 1.0 / SUB_BUCKETS as f64, "p{p}: {got} vs {exact}, error {err}");
        }
        assert_eq!(h.percentile(100.0), 10 * n);
        assert_eq!(h.min(), 10);
        assert_eq!(h.max(), 10 * n);
        assert!((h.mean() - 10.0 * (n as f64 + 1.0) / 2.0).abs() < 1e-6);
    }

    #[test]
    fn percentiles_match_sorted_reference_on_random_data() {
        let mut h = Histogram::new();
        let mut values = Vec::new();
        let mut s = SplitMix64::new(42);
        for _ in 0..50_000 {
            // Log-uniform-ish latencies from ~1 us to ~10 ms.
            let v = 1_000 + (next(&mut s) % 10_000_000) / (1 + next(&mut s) % 100);
            values.push(v);
            h.record(v);
        }
        values.sort_unstable();
        for p in [1.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0] {
            let rank = ((p / 100.0) * values.len() as f64).ceil().max(1.0) as usize;
            let exact = values[rank - 1];
            let got = h.percentile(p);
            let (low, high) = bucket_bounds(bucket_index(exact));
            assert!(got >= low && got <= high, "p{p}: {got} not in bucket [{low}, {high}] of {exact}");
        }
    }

    #[test]
    fn single_huge_value_and_clamping() {
        let mut h = Histogram::new();
        h.record(u64::MAX);
        assert_eq!(h.percentile(50.0), u64::MAX);
        h.record(1_000_003);
        // Rank 1 of 2 falls in 1_000_003's bucket, which is 4096 wide at this magnitude: the
        // reported value is that bucket's upper bound (below the maximum, so not clamped).
        let (low, high) = bucket_bounds(bucket_index(1_000_003));
        assert_eq!(high - low + 1, 4096);
        assert_eq!(h.percentile(50.0), high);
        assert_eq!(h.min(), 1_000_003);
        assert_eq!(h.max(), u64::MAX);
    }

    #[test]
    fn percentiles_are_clamped_to_the_recorded_maximum() {
        let mut h = Histogram::new();
        // Both values share one bucket whose upper bound is far above them.
        h.record(1_000_001);
        h.record(1_000_002);
        assert_eq!(bucket_index(1_000_001), bucket_index(1_000_002));
        assert!(bucket_bounds(bucket_index(1_000_002)).1 > 1_000_002);
        assert_eq!(h.percentile(0.0), 1_000_002);
        assert_eq!(h.percentile(50.0), 1_000_002);
        assert_eq!(h.percentile(100.0), 1_000_002);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        let mut all = Histogram::new();
        let mut s = SplitMix64::new(3);
        for i in 0..10_000 {
            let v = next(&mut s) % 1_000_000;
            if i % 3 == 0 {
                a.record(v)
            } else {
                b.record(v)
            }
            all.record(v);
        }
        a.merge(&b);
        assert_eq!(a.count(), all.count());
        assert_eq!(a.min(), all.min());
        assert_eq!(a.max(), all.max());
        assert_eq!(a.mean(), all.mean());
        for p in [50.0, 99.0, 99.9] {
            assert_eq!(a.percentile(p), all.percentile(p));
        }
        let listed: Vec<(u64, u64, u64)> = a.nonzero_buckets().collect();
        assert_eq!(listed.iter().map(|b| b.2).sum::<u64>(), a.count());
        assert!(listed.windows(2).all(|w| w[0].1 < w[1].0), "ascending, disjoint");
        assert!(listed.iter().all(|&(l, h, c)| l <= h && c > 0));
        a.clear();
        assert_eq!(a.count(), 0);
        assert_eq!(a.nonzero_buckets().count(), 0);
        assert_eq!(a.percentile(99.0), 0);
    }
}
