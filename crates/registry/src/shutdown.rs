//! The daemon's shutdown: every export stops at once, against one deadline.
//!
//! Stopping an export waits for the requests its disk holds, up to a bound. One after another,
//! N exports with stuck disks would take N bounds; started together they take the longest one,
//! however many there are. What has not stopped by the deadline is logged and left behind: the
//! daemon is going away, and a disk that never answers must not keep it.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::state::ExportEntry;

/// How long past the bound the shutdown waits for a stop to report back. A stop ends at its
/// bound by itself; only one whose thread is held elsewhere misses this. It is longer than the
/// margin a vhost-user controller's own stop allows its queues' answers, so that a controller
/// giving up on a reactor that no longer runs reports that itself before the shutdown names it.
pub(crate) const REPORT_MARGIN: Duration =
    Duration::from_secs(fp_vhost_blk::connection::STOP_REPLY_MARGIN.as_secs() + 1);

/// What the shutdown knows of an export whose stop runs on a thread of its own.
struct Stopping {
    kind: &'static str,
    name: String,
    bdev: String,
}

/// Tells the shutdown that stop `index` ended, also when the stop panicked (the report is sent
/// as the thread unwinds).
struct Report {
    index: usize,
    done: mpsc::Sender<usize>,
}

impl Drop for Report {
    fn drop(&mut self) {
        let _ = self.done.send(self.index);
    }
}

/// Stops `exports` all at once, each with [`Export::stop_at_shutdown`]`(stop_bound)`, and waits
/// for them until `bound` (the longest any of them should take) plus [`REPORT_MARGIN`] from now.
/// Each still stopping then is logged, with how far past `bound` it is. Returns the names of
/// those, in order.
pub(crate) fn stop_all(exports: Vec<ExportEntry>, stop_bound: Duration, bound: Duration) -> Vec<String> {
    let started = Instant::now();
    let deadline = started + bound + REPORT_MARGIN;
    let (done, reports) = mpsc::channel();
    let mut stopping = BTreeMap::new();
    for (index, ExportEntry { name, kind, bdev, export }) in exports.into_iter().enumerate() {
        let info = Stopping { kind, name, bdev };
        // The export goes to the thread through this slot, so that it is still here to stop
        // inline when no thread can be started.
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(export)));
        let theirs = slot.clone();
        let report = Report { index, done: done.clone() };
        let spawned = std::thread::Builder::new().name(format!("stop-{}", info.kind)).spawn(move || {
            let _report = report;
            let export = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(e) = export {
                e.stop_at_shutdown(stop_bound);
            }
        });
        if let Err(e) = spawned {
            log::warn!(
                "{} export '{}': no thread to stop it on ({e}); stopping it now",
                info.kind,
                info.name
            );
            let export = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(export) = export {
                export.stop_at_shutdown(stop_bound);
            }
            log::info!("{} export '{}' deleted", info.kind, info.name);
            continue;
        }
        stopping.insert(index, info);
    }
    drop(done);
    while !stopping.is_empty() {
        let Ok(index) = reports.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            break;
        };
        if let Some(s) = stopping.remove(&index) {
            log::info!("{} export '{}' deleted ({:?} into the shutdown)", s.kind, s.name, started.elapsed());
        }
    }
    let waited = started.elapsed();
    stopping
        .into_values()
        .map(|s| {
            log::error!(
                "{} export '{}' (bdev '{}'): its stop has not ended after {waited:?}, past the shutdown \
                 bound of {bound:?} by {:?}; the daemon goes on without it",
                s.kind,
                s.name,
                s.bdev,
                waited.saturating_sub(bound)
            );
            s.name
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::sync::{Arc, Condvar, Mutex};

    use super::*;
    use crate::exports::Export;

    /// Waits generously; only a broken implementation reaches it.
    const TEST_LIMIT: Duration = Duration::from_secs(30);

    /// Stops once `needed` stops are under way together (or never, for `needed` above the
    /// number of exports): the stops can only end if they run at the same time.
    struct Rendezvous {
        arrived: Arc<(Mutex<usize>, Condvar)>,
        needed: usize,
    }

    impl Export for Rendezvous {
        fn resized(&self, _: u64) {}
        fn stop(self: Box<Self>) {
            let (count, cv) = &*self.arrived;
            let mut n = count.lock().unwrap();
            *n += 1;
            cv.notify_all();
            let limit = Instant::now() + TEST_LIMIT;
            while *n < self.needed && Instant::now() < limit {
                n = cv.wait_timeout(n, TEST_LIMIT).unwrap().0;
            }
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    fn exports(n: usize, needed: usize) -> Vec<ExportEntry> {
        let arrived = Arc::new((Mutex::new(0), Condvar::new()));
        (0..n)
            .map(|i| ExportEntry {
                name: format!("e{i}"),
                kind: "test",
                bdev: "b".into(),
                export: Box::new(Rendezvous { arrived: arrived.clone(), needed }),
            })
            .collect()
    }

    #[test]
    fn every_export_stops_at_the_same_time() {
        // Stopped one after another, each would wait for the others until the test's limit.
        let started = Instant::now();
        let left = stop_all(exports(5, 5), Duration::from_secs(1), TEST_LIMIT);
        assert!(left.is_empty(), "stops that did not end together: {left:?}");
        assert!(started.elapsed() < TEST_LIMIT, "the stops ran one after another");
    }

    #[test]
    fn stops_still_running_at_the_deadline_are_left_behind_and_named() {
        // Waiting for a sixth that never comes: none ends before the test's limit.
        let started = Instant::now();
        let left = stop_all(exports(2, 6), Duration::from_millis(50), Duration::from_millis(50));
        assert_eq!(left, ["e0", "e1"]);
        assert!(started.elapsed() < TEST_LIMIT, "the shutdown waited for the stops themselves");
    }
}
