//! Dirty logging on the data path: a queue polled by hand against rings this test writes as the
//! guest driver would, checking that exactly the pages the device wrote are marked.
//!
//! Guest memory is 1 MiB at 0. Rings: descriptors at page 0x10, available ring (or driver
//! event area) at 0x11, used ring (or device event area) at 0x12. Request headers at 0x30
//! (read-only for the device), status bytes at 0x31, data from 0x40 on.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use fp_bdev::{
    Bdev, BdevError, BdevInfo, BlockDevice, IoChannel, IoRequest, IoStatus, RamDevice, SubmitError,
};
use fp_reactor::Poller;
use fp_virtio_blk::{DiskParams, GuestMemory, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};
use fp_virtq::{DirtyLog, RingLog, DESC_F_AVAIL, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_USED, DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};

use crate::coalesce::{Clock, CoalescingSettings};
use crate::inflight::InflightArea;
use crate::log::QueueLog;
use crate::queue::{QueuePoller, QueueSetup};
use crate::QueueStats;

const SIZE: u16 = 16;
const DESC: u64 = 0x10000;
const AVAIL: u64 = 0x11000;
const USED: u64 = 0x12000;
const HDR: u64 = 0x30000;
const STATUS: u64 = 0x31000;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_GET_ID: u32 = 8;

fn page(gpa: u64) -> u64 {
    gpa / 4096
}

fn eventfd() -> File {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh eventfd nobody else owns.
    unsafe { File::from_raw_fd(fd) }
}

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
    unsafe fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        match self.mode {
            Mode::Hold => {
                self.held.push(*req);
                Ok(())
            }
            Mode::FailReads => {
                if req.op == fp_bdev::IoOp::Read {
                    self.failing.lock().unwrap().push(req.tag);
                }
                // SAFETY: our caller's guarantee, passed on.
                unsafe { self.inner.submit(req) }
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

/// The guest side: memory, the log the front-end gave, and one queue's driver state.
struct Guest {
    mem: Arc<GuestMemory>,
    log: Arc<DirtyLog>,
    packed: bool,
    next_desc: u16,
    avail_idx: u16,
    /// Packed: the driver's ring position and wrap counter.
    pos: u16,
    wrap: bool,
}

impl Guest {
    fn new(packed: bool) -> Guest {
        Guest {
            mem: Arc::new(GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()),
            // 256 pages: 32 bytes.
            log: Arc::new(DirtyLog::in_memory(32)),
            packed,
            next_desc: 0,
            avail_idx: 0,
            pos: 0,
            wrap: true,
        }
    }

    fn w<T: vm_memory::ByteValued>(&self, v: T, at: u64) {
        self.mem.write_obj(v, GuestAddress(at)).unwrap();
    }

    /// The log setting QEMU's migration asks for: everything (LOG_ALL) and the ring.
    fn logging(&self) -> QueueLog {
        QueueLog { data: Some(self.log.clone()), ring: Some(RingLog::new(self.log.clone(), USED, DESC)) }
    }

    fn setup(&self, bdev: &Bdev, stats: &Arc<QueueStats>, log: QueueLog) -> QueueSetup {
        self.setup_with(bdev, stats, log, None)
    }

    fn setup_with(
        &self,
        bdev: &Bdev,
        stats: &Arc<QueueStats>,
        log: QueueLog,
        inflight: Option<Arc<InflightArea>>,
    ) -> QueueSetup {
        let sectors = bdev.info().size_bytes() / 512;
        QueueSetup {
            controller: "log".into(),
            index: 0,
            size: SIZE,
            desc: GuestAddress(DESC),
            avail: GuestAddress(AVAIL),
            used: GuestAddress(USED),
            base: if self.packed { 0x8000_8000 } else { 0 },
            event_idx: false,
            packed: self.packed,
            mem: self.mem.clone(),
            kick: eventfd(),
            call: eventfd(),
            bdev: bdev.clone(),
            disk: DiskParams {
                capacity_sectors: sectors,
                block_size: 512,
                read_only: false,
                flush: true,
                discard: false,
                write_zeroes: false,
                max_discard_sectors: 0,
                max_write_zeroes_sectors: 0,
            },
            capacity_sectors: Arc::new(std::sync::atomic::AtomicU64::new(sectors)),
            serial: *b"log-serial-twenty-by",
            stats: stats.clone(),
            inflight,
            coalescing: Arc::new(CoalescingSettings::default()),
            clock: Clock::Monotonic,
            log,
        }
    }

    fn header(&self, at: u64, kind: u32, sector: u64) {
        self.w(kind, at);
        self.w(0u32, at + 4);
        self.w(sector, at + 8);
    }

    /// Writes split descriptors for `bufs` from `next_desc` on (chained); returns the first.
    fn split_descs(&mut self, table: u64, bufs: &[(u64, u32, bool)]) -> u16 {
        let first = self.next_desc;
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let idx = self.next_desc;
            self.next_desc = (self.next_desc + 1) % SIZE;
            let last = i == bufs.len() - 1;
            let flags = if writable { DESC_F_WRITE } else { 0 } | if last { 0 } else { DESC_F_NEXT };
            let at = table + 16 * u64::from(idx);
            self.w(addr, at);
            self.w(len, at + 8);
            self.w(flags, at + 12);
            self.w(self.next_desc, at + 14);
        }
        first
    }

    fn make_available(&mut self, head: u16) {
        self.w(head, AVAIL + 4 + 2 * u64::from(self.avail_idx % SIZE));
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.w(self.avail_idx, AVAIL + 2);
    }

    /// Posts a request of (addr, len, device-writable) buffers in either ring layout.
    fn post(&mut self, bufs: &[(u64, u32, bool)]) {
        if self.packed {
            for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
                let lap = if self.wrap { DESC_F_AVAIL } else { DESC_F_USED };
                let next = if i + 1 < bufs.len() { DESC_F_NEXT } else { 0 };
                let at = DESC + 16 * u64::from(self.pos);
                self.w(addr, at);
                self.w(len, at + 8);
                self.w(7u16, at + 12);
                self.w(lap | next | if writable { DESC_F_WRITE } else { 0 }, at + 14);
                self.pos += 1;
                if self.pos == SIZE {
                    (self.pos, self.wrap) = (0, !self.wrap);
                }
            }
        } else {
            let head = self.split_descs(DESC, bufs);
            self.make_available(head);
        }
    }

    /// Posts a split request whose buffers are in an indirect table at `table`.
    fn post_indirect(&mut self, table: u64, bufs: &[(u64, u32, bool)]) {
        let saved = std::mem::replace(&mut self.next_desc, 0);
        self.split_descs(table, bufs);
        self.next_desc = saved;
        let head = self.split_descs(DESC, &[(table, 16 * bufs.len() as u32, false)]);
        self.w(DESC_F_INDIRECT, DESC + 16 * u64::from(head) + 12);
        self.make_available(head);
    }

    fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
    }

    fn marked(&self) -> BTreeSet<u64> {
        self.log.marked_pages().into_iter().collect()
    }
}

/// A queue on `bdev` logging as `log` says, and its counters.
fn start(g: &Guest, bdev: &Bdev, log: QueueLog) -> (QueuePoller, Arc<QueueStats>) {
    let stats = Arc::new(QueueStats::default());
    (QueuePoller::new(g.setup(bdev, &stats, log)).unwrap(), stats)
}

fn ram() -> Bdev {
    Arc::new(RamDevice::new("ram", 512, 2048).unwrap())
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
    let done = if packed {
        g.mem.read_obj::<u16>(GuestAddress(DESC + 14)).unwrap() & DESC_F_USED != 0
    } else {
        g.used_idx() == 1
    };
    assert!(done, "the read completed");
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

#[test]
fn a_read_resubmitted_from_the_inflight_area_is_marked() {
    let mut g = Guest::new(false);
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
        assert_eq!(g.used_idx(), 0);
    }
    assert!(g.marked().is_empty());
    // The next one starts during the migration: the resubmitted read is logged.
    let bdev = ram();
    let mut q = QueuePoller::new(g.setup_with(&bdev, &stats, g.logging(), Some(area))).unwrap();
    q.poll();
    assert_eq!(g.used_idx(), 1);
    assert_eq!(g.marked(), pages(&[0x40800, 0x41000, 0x50100, STATUS, USED]));
}
