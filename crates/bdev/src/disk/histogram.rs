//! Latency histograms with SPDK's log-linear buckets (`include/spdk/histogram_data.h`).
//!
//! A value in ticks falls into range `r` by its highest set bit and, inside the range, into one
//! of `2^granularity` equal buckets; range 0 holds the values below `2^granularity` one per
//! bucket. With the default granularity of 7 a bucket is at most 1/128 of its value wide, and
//! the full 64-bit span takes 58 ranges of 128 buckets (59 KiB of counters). The bucket array,
//! in that order, is what `bdev_get_histogram` sends base64-encoded, as SPDK does.

use std::sync::atomic::{AtomicU64, Ordering};

/// SPDK's `SPDK_HISTOGRAM_GRANULARITY_DEFAULT` (older SPDK called it `bucket_shift`).
pub const GRANULARITY: u32 = 7;
/// Buckets per range.
const PER_RANGE: usize = 1 << GRANULARITY;
/// The highest range: the one of `u64::MAX` (SPDK's `max_range` for the full span).
pub const MAX_RANGE: u32 = 64 - GRANULARITY;
/// Buckets in all.
pub const NUM_BUCKETS: usize = PER_RANGE * (MAX_RANGE as usize + 1);

/// The bucket a value falls into (SPDK's `spdk_histogram_data_tally`, full span).
#[inline]
pub fn bucket_of(value: u64) -> usize {
    let lsb = 64 - GRANULARITY;
    let clz = value.leading_zeros();
    let range = lsb.saturating_sub(clz);
    let shift = range.saturating_sub(1);
    let index = (value >> shift) as usize & (PER_RANGE - 1);
    ((range as usize) << GRANULARITY) + index
}

/// The first value past bucket `bucket` (SPDK's `__spdk_histogram_data_get_bucket_start` of the
/// bucket, which SPDK's iterator reports as the bucket's end). Saturates for the last bucket.
pub fn bucket_end(bucket: usize) -> u64 {
    let range = (bucket >> GRANULARITY) as u32;
    let index = (bucket & (PER_RANGE - 1)) as u64 + 1;
    if range == 0 {
        return index;
    }
    let base = 1u128 << (range + GRANULARITY - 1);
    (base + (u128::from(index) << (range - 1))).min(u128::from(u64::MAX)) as u64
}

/// One channel's buckets: written by the channel alone (load + store), read by anyone.
pub(crate) struct ChannelHistogram(Box<[AtomicU64]>);

impl ChannelHistogram {
    pub(crate) fn new() -> ChannelHistogram {
        ChannelHistogram((0..NUM_BUCKETS).map(|_| AtomicU64::new(0)).collect())
    }

    #[inline]
    pub(crate) fn record(&self, ticks: u64) {
        let b = &self.0[bucket_of(ticks)];
        b.store(b.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(crate) fn add_to(&self, into: &mut Histogram) {
        for (sum, b) in into.buckets.iter_mut().zip(self.0.iter()) {
            *sum += b.load(Ordering::Relaxed);
        }
    }

    /// Zeroes the buckets; only while no channel records (histograms off).
    pub(crate) fn clear(&self) {
        for b in self.0.iter() {
            b.store(0, Ordering::Relaxed);
        }
    }
}

/// Merged buckets, as a reader sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    /// One count per bucket ([`bucket_of`] maps a value to its bucket).
    pub buckets: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { buckets: vec![0; NUM_BUCKETS] }
    }
}

/// Latencies at the percentiles people read, in the histogram's unit (the upper edge of the
/// bucket that holds the percentile, so never below the true value). `None` when empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
}

impl Histogram {
    /// Counts `value` in its bucket.
    pub fn record(&mut self, value: u64) {
        self.buckets[bucket_of(value)] += 1;
    }

    /// Values recorded.
    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper edge of the bucket holding the `q`-quantile (0 < q <= 1), or `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        // The rank of the quantile, 1-based: the smallest n with n >= q * total.
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(bucket_end(i));
            }
        }
        None
    }

    /// p50, p90, p99 and p99.9 from the merged buckets.
    pub fn percentiles(&self) -> Option<Percentiles> {
        Some(Percentiles {
            p50: self.quantile(0.5)?,
            p90: self.quantile(0.9)?,
            p99: self.quantile(0.99)?,
            p999: self.quantile(0.999)?,
        })
    }

    /// The buckets as SPDK sends them: each a little-endian u64, base64 (RFC 4648, padded).
    pub fn to_base64(&self) -> String {
        let bytes: Vec<u8> = self.buckets.iter().flat_map(|b| b.to_le_bytes()).collect();
        base64_encode(&bytes)
    }

    /// Reads [`Histogram::to_base64`]'s encoding (what a client of `bdev_get_histogram` does).
    pub fn from_base64(text: &str) -> Option<Histogram> {
        let bytes = base64_decode(text)?;
        if bytes.len() != NUM_BUCKETS * 8 {
            return None;
        }
        let buckets =
            bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        Some(Histogram { buckets })
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (SPDK's `spdk_base64_encode`).
pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes [`base64_encode`]'s output; `None` for anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for (ci, chunk) in text.chunks(4).enumerate() {
        let last = ci == text.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            let v = ALPHABET.iter().position(|&a| a == c)? as u32;
            n = n << 6 | v;
        }
        n <<= 6 * pad as u32;
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - pad]);
    }
    Some(out)
}
