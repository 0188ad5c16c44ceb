//! An export's state as its listener, its connections and the registry share it: the bdev,
//! what the export allows, its reactors and its live connections. It sits below both
//! `server` (which starts and stops exports) and `conn` (which serves one connection), so
//! neither needs the other's internals to reach it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fp_bdev::disk::BitmapUse;
use fp_bdev::Bdev;
use fp_reactor::{PollerId, ReactorHandle};

use crate::proto::*;
use crate::stats::{ConnStats, NbdStats};

/// A dirty bitmap an export offers as the `qemu:dirty-bitmap:NAME` metadata context. The hold
/// keeps the bitmap (it reads the live bits at each query) and makes it refuse removal while
/// the export lives.
#[derive(Debug)]
pub struct ExportBitmap {
    /// The context's leaf name: the bitmap's name.
    pub name: String,
    pub bitmap: BitmapUse,
}

/// An export as its listener, its connections and the registry share it.
pub(crate) struct ExportShared {
    pub(crate) name: String,
    pub(crate) bdev: Bdev,
    pub(crate) readonly: bool,
    /// Its `qemu:dirty-bitmap:` contexts, with the window each is read by: the least common
    /// multiple of its granularity and the disk's block size, so every extent is whole blocks.
    pub(crate) bitmaps: Vec<(ExportBitmap, u64)>,
    reactors: Vec<ReactorHandle>,
    next_reactor: AtomicUsize,
    /// Its connections' pollers; touched when a connection starts or ends and on stop.
    conns: Mutex<Conns>,
    pub(crate) connections: AtomicUsize,
    /// How long a closing connection keeps retrying requests the disk refuses as busy.
    pub(crate) close_timeout: std::time::Duration,
}

/// A connection being served: its reactor, its poller there and its counters, which say
/// whether it still runs.
pub(crate) type LiveConn = (ReactorHandle, PollerId, Arc<ConnStats>);

#[derive(Default)]
pub(crate) struct Conns {
    pub(crate) stopping: bool,
    live: Vec<LiveConn>,
    /// Those asked to close (the export stopping), until they have.
    closing: Vec<LiveConn>,
    /// What the connections that ended counted.
    closed: NbdStats,
}

impl Conns {
    /// Records a connection now served, forgetting those that have ended.
    pub(crate) fn add(&mut self, conn: LiveConn) {
        self.live.retain(|c| c.2.alive.load(Ordering::Relaxed));
        self.live.push(conn);
    }

    /// A connection ends: its final counts join the closed total, under the same lock that
    /// [`ExportShared::stats`] reads both under, so no count is missed or seen twice.
    pub(crate) fn close(&mut self, stats: &ConnStats, last: &NbdStats) {
        self.closed.add(last);
        stats.alive.store(false, Ordering::Relaxed);
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Locks `m`; a panic while it was held leaves plain data behind, so keep going.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ExportShared {
    /// An export of `bdev` named `name`, its connections spread over `reactors`.
    pub(crate) fn new(
        name: String,
        bdev: Bdev,
        readonly: bool,
        bitmaps: Vec<ExportBitmap>,
        reactors: Vec<ReactorHandle>,
        close_timeout: std::time::Duration,
    ) -> ExportShared {
        let block = u64::from(bdev.info().block_size).max(1);
        let bitmaps = bitmaps
            .into_iter()
            .map(|b| {
                let g = b.bitmap.granularity();
                let unit = g / gcd(g, block) * block;
                (b, unit)
            })
            .collect();
        ExportShared {
            name,
            bdev,
            readonly,
            bitmaps,
            reactors,
            next_reactor: AtomicUsize::new(0),
            conns: Mutex::new(Conns::default()),
            connections: AtomicUsize::new(0),
            close_timeout,
        }
    }

    /// The reactor for the next connection, round robin.
    pub(crate) fn next_reactor(&self) -> &ReactorHandle {
        let i = self.next_reactor.fetch_add(1, Ordering::Relaxed) % self.reactors.len();
        &self.reactors[i]
    }

    /// Its connections, to add one unless the export is stopping.
    pub(crate) fn conns(&self) -> MutexGuard<'_, Conns> {
        lock(&self.conns)
    }

    /// Marks the export stopping (no connection is added after) and hands back those served
    /// now and not asked to close yet, for the caller to ask; they are kept to count.
    pub(crate) fn stop_conns(&self) -> Vec<LiveConn> {
        let mut c = lock(&self.conns);
        c.stopping = true;
        let new = std::mem::take(&mut c.live);
        c.closing.extend(new.iter().cloned());
        new
    }

    /// Connections asked to close that are still open.
    pub(crate) fn closing_conns(&self) -> usize {
        let mut c = lock(&self.conns);
        c.closing.retain(|l| l.2.alive.load(Ordering::Relaxed));
        c.closing.len()
    }

    /// The connections asked to close that are still open.
    pub(crate) fn closing_list(&self) -> Vec<LiveConn> {
        let mut c = lock(&self.conns);
        c.closing.retain(|l| l.2.alive.load(Ordering::Relaxed));
        c.closing.clone()
    }

    /// What its connections counted, live and closed.
    pub(crate) fn stats(&self) -> NbdStats {
        let c = lock(&self.conns);
        let mut total = c.closed;
        for (_, _, s) in c.live.iter().chain(&c.closing).filter(|l| l.2.alive.load(Ordering::Relaxed)) {
            total.add(&s.load());
        }
        total
    }

    /// Transmission flags: what the device supports, less what a read-only export refuses.
    /// Every backend's flush covers the whole device (an fsync, a librbd flush, ...), whichever
    /// channel it comes from, so a flush on one connection covers writes completed on all of
    /// them: multi-conn is safe.
    pub(crate) fn flags(&self) -> u16 {
        let t = self.bdev.info().io_types;
        let mut f = TFLAG_HAS_FLAGS | TFLAG_SEND_CACHE | TFLAG_CAN_MULTI_CONN | TFLAG_SEND_DF;
        if t.flush {
            f |= TFLAG_SEND_FLUSH | TFLAG_SEND_FUA;
        }
        if self.readonly || self.bdev.read_only() {
            f |= TFLAG_READ_ONLY;
        } else {
            if t.unmap {
                f |= TFLAG_SEND_TRIM;
            }
            if t.write_zeroes {
                f |= TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO;
            }
        }
        f
    }
}
