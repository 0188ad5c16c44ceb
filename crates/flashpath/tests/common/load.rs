//! What must hold for any fp-load result of a run without failures, whatever the test.

use fp_loadgen::{LoadResult, LoadSpec, Pattern};

/// Counts, bytes, histogram, capacity, latency order and the pattern's mix of `r`, a result of
/// running `s` against a disk of `capacity` bytes.
pub fn check_result(what: &str, s: &LoadSpec, r: &LoadResult, capacity: u64) {
    assert_eq!(r.errors, 0, "{what}: errors (first {:?})", r.first_error);
    assert!(r.ios > 0, "{what}: no I/O completed");
    assert_eq!(r.reads + r.writes, r.ios, "{what}: reads + writes != ios");
    assert_eq!(r.bytes, r.ios * s.block_size as u64, "{what}: bytes");
    assert_eq!(r.histogram.count(), r.ios, "{what}: histogram count");
    assert_eq!(r.capacity, capacity, "{what}: capacity");
    assert!(
        r.lat_min_ns > 0
            && r.lat_min_ns <= r.p50_ns
            && r.p50_ns <= r.p99_ns
            && r.p99_ns <= r.p999_ns
            && r.p999_ns <= r.lat_max_ns,
        "{what}: zero latency or percentiles out of order: {r:?}"
    );
    match s.pattern {
        Pattern::RandRead | Pattern::Read => assert_eq!(r.writes, 0, "{what}: writes in a read run"),
        Pattern::RandWrite | Pattern::Write => assert_eq!(r.reads, 0, "{what}: reads in a write run"),
        Pattern::RandRw => assert!(r.reads > 0 && r.writes > 0, "{what}: randrw did not mix: {r:?}"),
    }
}
