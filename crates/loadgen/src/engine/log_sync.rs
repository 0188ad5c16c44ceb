//! The dirty log's sync thread: every interval it scans the shared log bitmap and clears the
//! words it finds set with one atomic exchange each, as QEMU's `vhost_log_sync` does during
//! migration (the back end sets bits with atomic ORs at the same time, vhost-user.rst,
//! "Migration"), and keeps the union of what it saw for the report.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fp_virtq::driver::DriverMem;

use crate::DirtyLogReport;

/// Bytes of memory per log bit (vhost-user.rst: `VHOST_LOG_PAGE`).
pub(super) const LOG_PAGE: u64 = 4096;

/// Bytes of log for `memory` bytes of memory: one bit per page, in whole 64-bit words as the
/// scan reads them.
pub(super) fn log_bytes_for(memory: u64) -> u64 {
    memory.div_ceil(LOG_PAGE).div_ceil(64) * 8
}

/// Where the run's memory lies, in pages, to sort the dirty pages by what they hold.
#[derive(Clone, Debug)]
pub(super) struct PageMap {
    pub(super) data: Range<u64>,
    pub(super) headers: Range<u64>,
    pub(super) rings: Range<u64>,
    pub(super) data_pages_expected: u64,
}

/// What the thread hands back: scans, bits cleared, ns spent scanning, the union of the scans.
type Seen = (u64, u64, u64, Vec<u64>);

/// The log the thread scans: `words` 64-bit words.
struct LogView {
    log: DriverMem,
    words: usize,
}

impl LogView {
    /// Clears every set word, adding what it held to `seen` (the union); the bits cleared.
    fn sync(&self, seen: &mut [u64]) -> u64 {
        let mut bits = 0;
        for (i, acc) in seen.iter_mut().enumerate().take(self.words) {
            // Most words are zero: `take_u64` only takes the cache line for a set one.
            let v = self.log.take_u64(8 * i);
            bits += u64::from(v.count_ones());
            *acc |= v;
        }
        bits
    }
}

/// A running sync thread.
pub(super) struct LogSync {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Seen>>,
    interval: Duration,
    words: usize,
    map: PageMap,
}

impl LogSync {
    /// Starts scanning `log` (its whole 64-bit words) every `interval`, on `cpu` if given.
    pub(super) fn start(
        log: DriverMem,
        interval: Duration,
        cpu: Option<usize>,
        map: PageMap,
    ) -> std::io::Result<LogSync> {
        let words = log.len() / 8;
        let view = LogView { log, words };
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name("fp-load-logsync".into()).spawn(move || {
            if let Some(c) = cpu {
                // Beside the client, off the server's core; a failure only costs placement.
                let _ = fp_sys::pin_thread(&[c]);
            }
            let mut seen = vec![0u64; view.words];
            let (mut syncs, mut bits, mut ns) = (0u64, 0u64, 0u64);
            loop {
                let last = stop2.load(Ordering::Acquire);
                let t0 = Instant::now();
                bits += view.sync(&mut seen);
                ns += t0.elapsed().as_nanos() as u64;
                syncs += 1;
                if last {
                    return (syncs, bits, ns, seen);
                }
                std::thread::park_timeout(interval);
            }
        })?;
        Ok(LogSync { stop, thread: Some(thread), interval, words, map })
    }

    /// Stops the thread after one last scan (call it once no request is in flight) and sorts
    /// what it saw.
    pub(super) fn finish(&mut self) -> Option<DirtyLogReport> {
        let t = self.thread.take()?;
        self.stop.store(true, Ordering::Release);
        t.thread().unpark();
        let (syncs, bits_seen, sync_ns, seen) = t.join().ok()?;
        let mut r = DirtyLogReport {
            log_bytes: self.words as u64 * 8,
            memory_pages: self.map.rings.end,
            syncs,
            interval_ms: self.interval.as_millis() as u64,
            bits_seen,
            sync_ns,
            data_pages_expected: self.map.data_pages_expected,
            ..DirtyLogReport::default()
        };
        for (i, &w) in seen.iter().enumerate() {
            let mut w = w;
            while w != 0 {
                let page = i as u64 * 64 + u64::from(w.trailing_zeros());
                w &= w - 1;
                let m = &self.map;
                if m.data.contains(&page) {
                    r.data_pages += 1;
                } else if m.headers.contains(&page) {
                    r.header_pages += 1;
                } else if m.rings.contains(&page) {
                    r.ring_pages += 1;
                } else {
                    r.other_pages += 1;
                }
            }
        }
        Some(r)
    }
}

impl Drop for LogSync {
    fn drop(&mut self) {
        // The mapping goes after this: the thread must be gone first.
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_has_a_bit_per_page_in_whole_words() {
        assert_eq!(log_bytes_for(4096), 8);
        assert_eq!(log_bytes_for(64 * 4096), 8);
        assert_eq!(log_bytes_for(64 * 4096 + 1), 16);
        assert_eq!(log_bytes_for(512 << 20), 16 * 1024);
    }

    #[test]
    fn the_thread_clears_what_it_sees_and_sorts_the_union() {
        // 200 pages: data 0..100, headers 100..101, rings 101..110, the rest nothing's.
        let log =
            std::sync::Arc::new(fp_virtq::driver::SharedMem::new(4096, false).unwrap()).view().sub(0, 32);
        let map = PageMap { data: 0..100, headers: 100..101, rings: 101..110, data_pages_expected: 3 };
        // Pages 0, 1, 99 (data), 100 (header), 105 (ring), 150 (other).
        log.write_u64(0, 0b11);
        log.write_u64(8, 1 << (99 - 64) | 1 << (100 - 64) | 1 << (105 - 64));
        log.write_u64(16, 1 << (150 - 128));
        let mut s = LogSync::start(log.clone(), Duration::from_millis(5), None, map).unwrap();
        // Until the thread's first scan has cleared word 2, the last set one (a scan clears the
        // words in order): waiting for that, not for a time, holds on a loaded machine too.
        let until = Instant::now() + Duration::from_secs(10);
        while log.read_u64(16) != 0 {
            assert!(Instant::now() < until, "the sync thread did not scan in 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Page 0 dirtied again after a scan: counted again in bits_seen, once in the union.
        log.or_u64(0, 1);
        let r = s.finish().unwrap();
        assert!(r.syncs >= 2, "{r:?}");
        assert_eq!(r.bits_seen, 7);
        assert_eq!((r.data_pages, r.header_pages, r.ring_pages, r.other_pages), (3, 1, 1, 1));
        assert_eq!(r.data_pages_expected, 3);
        assert_eq!(r.log_bytes, 32);
        assert_eq!(
            (0..4).map(|w| log.read_u64(8 * w)).collect::<Vec<_>>(),
            vec![0; 4],
            "every word was cleared"
        );
        assert!(s.finish().is_none(), "finished once");
    }
}
