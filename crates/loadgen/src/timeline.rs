//! A delivered-rate timeline: completions counted per fixed interval from the start of the
//! measured run (`fp-load --timeline 1s`), so a rate limit can be checked over 1 s windows, or
//! a burst seen falling back to its average, from one run. The buckets are allocated when the
//! disk is opened; recording is an add per batch of completions.

use std::time::Duration;

/// Most buckets a timeline may have (8 MiB of counts): bounds a tiny interval over a long run.
pub const MAX_BUCKETS: u64 = 1 << 20;

/// Completions per interval; bucket `i` covers `[i·interval, (i+1)·interval)` from the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    pub interval: Duration,
    /// One count per interval of the run: `ceil(duration / interval)` of them. The last one
    /// also holds the batch that completed as the run ended (a few microseconds past it).
    pub ios: Vec<u64>,
}

impl Timeline {
    /// Buckets for a run of `duration` in steps of `interval` (both checked by
    /// [`LoadSpec::validate`](crate::LoadSpec::validate)).
    pub fn new(interval: Duration, duration: Duration) -> Timeline {
        let n = buckets(interval, duration).unwrap_or(1).max(1);
        Timeline { interval, ios: vec![0; n as usize] }
    }

    /// Counts `n` completions seen `since_start` after the start.
    #[inline]
    pub fn record(&mut self, since_start: Duration, n: u64) {
        let i = (since_start.as_nanos() / self.interval.as_nanos()) as usize;
        let last = self.ios.len() - 1;
        self.ios[i.min(last)] += n;
    }

    /// Adds `other`'s counts bucket by bucket (the total of several disks); the longer of the
    /// two sets the length.
    pub fn add(&mut self, other: &Timeline) {
        if other.ios.len() > self.ios.len() {
            self.ios.resize(other.ios.len(), 0);
        }
        for (a, b) in self.ios.iter_mut().zip(&other.ios) {
            *a += b;
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "interval_s": self.interval.as_secs_f64(), "ios": self.ios })
    }
}

/// How many buckets a run of `duration` needs at `interval`, if the interval is positive.
pub(crate) fn buckets(interval: Duration, duration: Duration) -> Option<u64> {
    if interval.is_zero() {
        return None;
    }
    let n = duration.as_nanos().div_ceil(interval.as_nanos());
    Some(u64::try_from(n).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn completions_land_in_their_interval_and_late_ones_in_the_last() {
        let mut t = Timeline::new(MS(1000), MS(3000));
        assert_eq!(t.ios, vec![0, 0, 0]);
        t.record(MS(0), 5);
        t.record(MS(999), 1);
        t.record(MS(1000), 7);
        t.record(MS(2999), 2);
        // The batch that crossed the end of the run.
        t.record(MS(3000) + Duration::from_micros(3), 4);
        assert_eq!(t.ios, vec![6, 7, 6]);
    }

    #[test]
    fn a_run_that_is_not_a_whole_number_of_intervals_has_a_short_last_bucket() {
        assert_eq!(Timeline::new(MS(1000), MS(2500)).ios.len(), 3);
        assert_eq!(Timeline::new(MS(250), MS(1000)).ios.len(), 4);
        // A run shorter than the interval still has one bucket.
        assert_eq!(Timeline::new(MS(1000), MS(10)).ios.len(), 1);
        assert_eq!(buckets(Duration::ZERO, MS(10)), None);
    }

    #[test]
    fn totals_add_bucket_by_bucket() {
        let mut a = Timeline { interval: MS(1000), ios: vec![1, 2] };
        a.add(&Timeline { interval: MS(1000), ios: vec![10, 20, 30] });
        assert_eq!(a.ios, vec![11, 22, 30]);
        assert_eq!(a.to_json(), serde_json::json!({"interval_s": 1.0, "ios": [11, 22, 30]}));
    }
}
