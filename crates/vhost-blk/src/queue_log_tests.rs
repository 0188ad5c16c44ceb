//! Dirty logging on the data path: a queue polled by hand against rings this test writes as the
//! guest driver would (`queue_test_guest`), checking that exactly the pages the device wrote
//! are marked.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, IoChannel, IoRequest, IoStatus, RamDevice, SubmitError,
};
use fp_reactor::Poller;
use fp_virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};
use vm_memory::{Bytes, GuestAddress};

use crate::inflight::InflightArea;
use crate::log::QueueLog;
use crate::queue::QueuePoller;
use crate::QueueStats;

use super::test_guest::*;

/// A RAM disk whose reads fail after the RAM disk wrote their data (a read that failed late),
/// or that holds every request forever (a back-end that dies with requests in flight).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    FailReads,
    Hold,
}

struct OddDevice {
    inner: RamDevice,
    mode: Mode,
}

struct OddChannel {
    inner: Box<dyn IoChannel>,
    mode: Mode,
    held: Vec<IoRequest>,
    failing: Arc<Mutex<Vec<u32>>>,
}

impl BlockDevice for OddDevice {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(OddChannel {
            inner: self.inner.open_channel()?,
            mode: self.mode,
            held: Vec::new(),
            failing: Arc::default(),
        }))
    }
}

impl IoChannel for OddChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        match self.mode {
            Mode::Hold => {
                self.held.push(*req);
                Ok(())
            }
            Mode::FailReads => {
                if req.op == fp_bdev::IoOp::Read {
                    self.failing.lock().unwrap().push(req.tag);
                }
                self.inner.submit(req)
            }
        }
    }
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let failing = self.failing.clone();
        self.inner.poll(&mut |tag, status| {
            let mut f = failing.lock().unwrap();
            match f.iter().position(|&t| t == tag) {
                Some(i) => {
                    f.remove(i);
                    done(tag, IoStatus::Error(libc::EIO));
                }
                None => done(tag, status),
            }
        })
    }
    fn in_flight(&self) -> usize {
        self.held.len() + self.inner.in_flight()
    }
}

/// A queue on `bdev` logging as `log` says, and its counters.
fn start(g: &Guest, bdev: &Bdev, log: QueueLog) -> (QueuePoller, Arc<QueueStats>) {
    let stats = Arc::new(QueueStats::default());
    (QueuePoller::new(g.setup(bdev, &stats, log)).unwrap(), stats)
}

fn pages(list: &[u64]) -> BTreeSet<u64> {
    list.iter().map(|&a| page(a)).collect()
}

/// A read of 4 KiB + 512 bytes into two buffers: one spanning pages 0x40-0x41 (starting
/// mid-page), one inside page 0x50.
const READ_BUFS: [(u64, u32, bool); 4] =
    [(HDR, 16, false), (0x40800, 4096, true), (0x50100, 512, true), (STATUS + 0x10, 1, true)];

fn run_read(packed: bool) {
    let mut g = Guest::new(packed);
    let (mut q, stats) = start(&g, &ram(), g.logging());
    g.header(HDR, T_IN, 8);
    g.post(&READ_BUFS);
    q.poll();
    assert!(g.completed(), "the read completed");
    assert_eq!(g.mem.read_obj::<u8>(GuestAddress(STATUS + 0x10)).unwrap(), VIRTIO_BLK_S_OK);
    // Data: exactly the pages of the two buffers; the status byte's page; the used side:
    // split writes used ring 0x12, packed the descriptor in ring 0x10 and the device event
    // area at 0x12 (notification suppression at start).
    let used_side = if packed { vec![DESC, USED] } else { vec![USED] };
    let mut want = pages(&[0x40800, 0x41000, 0x50100, STATUS]);
    want.extend(pages(&used_side));
    assert_eq!(g.marked(), want, "header and available side never marked");
    q.poll();
    assert_eq!(stats.logged_data_pages.load(Ordering::Relaxed), 3, "pages 0x40, 0x41, 0x50");
    assert!(stats.logged_pages.load(Ordering::Relaxed) >= 5);
}

#[test]
fn a_split_read_marks_exactly_its_data_status_and_used_pages() {
    run_read(false);
}

#[test]
fn a_packed_read_marks_its_data_status_and_written_back_descriptor() {
    run_read(true);
}

#[test]
fn an_indirect_read_marks_its_data_not_the_table() {
    let mut g = Guest::new(false);
    let (mut q, _) = start(&g, &ram(), g.logging());
    g.header(HDR, T_IN, 0);
    g.post_indirect(0x20000, &[(HDR, 16, false), (0x46000, 1024, true), (STATUS, 1, true)]);
    q.poll();
    assert_eq!(g.used_idx(), 1);
    assert_eq!(g.marked(), pages(&[0x46000, STATUS, USED]));
}

#[test]
fn a_write_marks_only_its_status_and_the_used_ring() {
    let mut g = Guest::new(false);
    let (mut q, stats) = start(&g, &ram(), g.logging());
    g.header(HDR, T_OUT, 0);
    g.post(&[(HDR, 16, false), (0x60000, 8192, false), (STATUS, 1, true)]);
    q.poll();
    assert_eq!(g.used_idx(), 1);
    assert_eq!(g.marked(), pages(&[STATUS, USED]), "the data the device only read is not marked");
    q.poll();
    assert_eq!(stats.logged_data_pages.load(Ordering::Relaxed), 0);
}

#[test]
fn get_id_marks_the_bytes_of_the_string_only() {
    let mut g = Guest::new(false);
    let (mut q, _) = start(&g, &ram(), g.logging());
    // A 512-byte buffer crossing into page 0x45, of which the 20 bytes written lie in 0x44.
    g.header(HDR, T_GET_ID, 0);
    g.post(&[(HDR, 16, false), (0x44f00, 512, true), (STATUS, 1, true)]);
    q.poll();
    assert_eq!(g.used_idx(), 1);
    assert_eq!(g.marked(), pages(&[0x44f00, STATUS, USED]));
    // And 20 bytes that do cross: both pages.
    g.log.clear();
    g.post(&[(HDR, 16, false), (0x47ff0, 512, true), (STATUS, 1, true)]);
    q.poll();
    assert_eq!(g.marked(), pages(&[0x47ff0, 0x48000, STATUS, USED]));
}

#[test]
fn a_failed_read_still_marks_its_data_pages() {
    let mut g = Guest::new(false);
    let bdev: Bdev =
        Arc::new(OddDevice { inner: RamDevice::new("ram", 512, 2048).unwrap(), mode: Mode::FailReads });
    let (mut q, _) = start(&g, &bdev, g.logging());
    g.header(HDR, T_IN, 0);
    g.post(&[(HDR, 16, false), (0x49000, 4096, true), (STATUS, 1, true)]);
    q.poll();
    assert_eq!(g.used_idx(), 1);
    assert_eq!(g.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(), VIRTIO_BLK_S_IOERR);
    assert_eq!(g.marked(), pages(&[0x49000, STATUS, USED]));
}

#[test]
fn nothing_is_marked_while_logging_is_off_and_everything_once_it_is_on() {
    let mut g = Guest::new(false);
    let (mut q, stats) = start(&g, &ram(), QueueLog::default());
    g.header(HDR, T_IN, 8);
    g.post(&READ_BUFS);
    q.poll();
    g.header(HDR, T_GET_ID, 8);
    g.post(&[(HDR, 16, false), (0x44f00, 512, true), (STATUS, 1, true)]);
    q.poll();
    assert_eq!(g.used_idx(), 2);
    assert!(g.marked().is_empty());
    assert_eq!(stats.logged_pages.load(Ordering::Relaxed), 0);
    // The front-end starts logging on the running queue (LOG_ALL and VHOST_VRING_F_LOG).
    q.set_log(g.logging());
    g.header(HDR, T_IN, 8);
    g.post(&READ_BUFS);
    q.poll();
    assert_eq!(g.marked(), pages(&[0x40800, 0x41000, 0x50100, STATUS, USED]));
    // And stops it.
    q.set_log(QueueLog::default());
    g.log.clear();
    g.post(&READ_BUFS);
    q.poll();
    assert_eq!(g.used_idx(), 4);
    assert!(g.marked().is_empty());
}

fn run_resubmitted_read(packed: bool) {
    let mut g = Guest::new(packed);
    let (area, _file, _) = InflightArea::create(1, SIZE).unwrap();
    let stats = Arc::new(QueueStats::default());
    // The first back-end takes the read and dies with it in flight, before logging started.
    {
        let held: Bdev =
            Arc::new(OddDevice { inner: RamDevice::new("ram", 512, 2048).unwrap(), mode: Mode::Hold });
        let mut q =
            QueuePoller::new(g.setup_with(&held, &stats, QueueLog::default(), Some(area.clone()))).unwrap();
        g.header(HDR, T_IN, 8);
        g.post(&READ_BUFS);
        q.poll();
        assert!(!g.completed(), "held in flight");
    }
    g.log.clear();
    // The next one starts during the migration: the read it resubmits (split: walked again
    // from the ring; packed: from its record) is logged like any other.
    let mut q = QueuePoller::new(g.setup_with(&ram(), &stats, g.logging(), Some(area))).unwrap();
    q.poll();
    assert!(g.completed());
    let mut want = pages(&[0x40800, 0x41000, 0x50100, STATUS, USED]);
    if packed {
        want.insert(page(DESC));
    }
    assert_eq!(g.marked(), want);
}

#[test]
fn a_split_read_resubmitted_from_the_inflight_area_is_marked() {
    run_resubmitted_read(false);
}

#[test]
fn a_packed_read_resubmitted_from_its_inflight_record_is_marked() {
    run_resubmitted_read(true);
}
