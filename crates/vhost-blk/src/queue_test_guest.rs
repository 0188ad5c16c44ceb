//! A guest driver for the queue's unit tests: memory, rings written by hand as a driver would,
//! and the driver's ends of the kick and call eventfds.
//!
//! Guest memory is 1 MiB at 0. Rings: descriptors at page 0x10, available ring (or driver
//! event area) at 0x11, used ring (or device event area) at 0x12. Request headers at 0x30
//! (read-only for the device), status bytes at 0x31, data from 0x40 on.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use fp_bdev::{Bdev, RamDevice};
use fp_virtio_blk::{DiskParams, GuestMemory};
use fp_virtq::{DirtyLog, RingLog, DESC_F_AVAIL, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_USED, DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};

use crate::coalesce::{Clock, CoalescingSettings};
use crate::inflight::InflightArea;
use crate::log::QueueLog;
use crate::queue::QueueSetup;
use crate::QueueStats;

pub(crate) const SIZE: u16 = 16;
pub(crate) const DESC: u64 = 0x10000;
pub(crate) const AVAIL: u64 = 0x11000;
pub(crate) const USED: u64 = 0x12000;
pub(crate) const HDR: u64 = 0x30000;
pub(crate) const STATUS: u64 = 0x31000;
pub(crate) const T_IN: u32 = 0;
pub(crate) const T_OUT: u32 = 1;
pub(crate) const T_GET_ID: u32 = 8;

pub(crate) fn page(gpa: u64) -> u64 {
    gpa / 4096
}

pub(crate) fn eventfd() -> File {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh eventfd nobody else owns.
    unsafe { File::from_raw_fd(fd) }
}

/// The guest side: memory, the log the front-end gave, and one queue's driver state.
pub(crate) struct Guest {
    pub(crate) mem: Arc<GuestMemory>,
    pub(crate) log: Arc<DirtyLog>,
    pub(crate) packed: bool,
    pub(crate) next_desc: u16,
    pub(crate) avail_idx: u16,
    /// Packed: the driver's ring position and wrap counter.
    pub(crate) pos: u16,
    pub(crate) wrap: bool,
    /// Ring entries (`SIZE` unless a test needs larger batches).
    pub(crate) size: u16,
    /// Whether the queue is started with VIRTIO_F_EVENT_IDX negotiated.
    pub(crate) event_idx: bool,
    pub(crate) coalescing: Arc<CoalescingSettings>,
    pub(crate) clock: Clock,
    /// The driver's ends of the queue's kick and call eventfds (the same counters).
    pub(crate) kick: File,
    pub(crate) call: File,
}

impl Guest {
    pub(crate) fn new(packed: bool) -> Guest {
        Guest {
            mem: Arc::new(GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()),
            // 256 pages: 32 bytes.
            log: Arc::new(DirtyLog::in_memory(32)),
            packed,
            next_desc: 0,
            avail_idx: 0,
            pos: 0,
            wrap: true,
            size: SIZE,
            event_idx: false,
            coalescing: Arc::new(CoalescingSettings::default()),
            clock: Clock::Monotonic,
            kick: eventfd(),
            call: eventfd(),
        }
    }

    pub(crate) fn w<T: vm_memory::ByteValued>(&self, v: T, at: u64) {
        self.mem.write_obj(v, GuestAddress(at)).unwrap();
    }

    /// The log setting QEMU's migration asks for: everything (LOG_ALL) and the ring.
    pub(crate) fn logging(&self) -> QueueLog {
        QueueLog { data: Some(self.log.clone()), ring: Some(RingLog::new(self.log.clone(), USED, DESC)) }
    }

    pub(crate) fn setup(&self, bdev: &Bdev, stats: &Arc<QueueStats>, log: QueueLog) -> QueueSetup {
        self.setup_with(bdev, stats, log, None)
    }

    pub(crate) fn setup_with(
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
            size: self.size,
            desc: GuestAddress(DESC),
            avail: GuestAddress(AVAIL),
            used: GuestAddress(USED),
            base: if self.packed { 0x8000_8000 } else { 0 },
            event_idx: self.event_idx,
            packed: self.packed,
            mem: self.mem.clone(),
            kick: self.kick.try_clone().unwrap(),
            call: self.call.try_clone().unwrap(),
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
            coalescing: self.coalescing.clone(),
            clock: self.clock.clone(),
            log,
            hold: None,
        }
    }

    pub(crate) fn header(&self, at: u64, kind: u32, sector: u64) {
        self.w(kind, at);
        self.w(0u32, at + 4);
        self.w(sector, at + 8);
    }

    /// Writes split descriptors for `bufs` from `next_desc` on (chained); returns the first.
    pub(crate) fn split_descs(&mut self, table: u64, bufs: &[(u64, u32, bool)]) -> u16 {
        let first = self.next_desc;
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let idx = self.next_desc;
            self.next_desc = (self.next_desc + 1) % self.size;
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

    pub(crate) fn make_available(&mut self, head: u16) {
        self.w(head, AVAIL + 4 + 2 * u64::from(self.avail_idx % self.size));
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.w(self.avail_idx, AVAIL + 2);
    }

    /// Posts a request of (addr, len, device-writable) buffers in either ring layout.
    pub(crate) fn post(&mut self, bufs: &[(u64, u32, bool)]) {
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
                if self.pos == self.size {
                    (self.pos, self.wrap) = (0, !self.wrap);
                }
            }
        } else {
            let head = self.split_descs(DESC, bufs);
            self.make_available(head);
        }
    }

    /// Posts a split request whose buffers are in an indirect table at `table`.
    pub(crate) fn post_indirect(&mut self, table: u64, bufs: &[(u64, u32, bool)]) {
        let saved = std::mem::replace(&mut self.next_desc, 0);
        self.split_descs(table, bufs);
        self.next_desc = saved;
        let head = self.split_descs(DESC, &[(table, 16 * bufs.len() as u32, false)]);
        self.w(DESC_F_INDIRECT, DESC + 16 * u64::from(head) + 12);
        self.make_available(head);
    }

    /// Whether the first request posted has completed (split: used.idx 1; packed: the used
    /// flags in ring slot 0).
    pub(crate) fn completed(&self) -> bool {
        if self.packed {
            self.mem.read_obj::<u16>(GuestAddress(DESC + 14)).unwrap() & DESC_F_USED != 0
                && self.mem.read_obj::<u16>(GuestAddress(DESC + 14)).unwrap() & DESC_F_AVAIL != 0
        } else {
            self.used_idx() == 1
        }
    }

    pub(crate) fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
    }

    pub(crate) fn marked(&self) -> BTreeSet<u64> {
        self.log.marked_pages().into_iter().collect()
    }
}

pub(crate) fn ram() -> Bdev {
    Arc::new(RamDevice::new("ram", 512, 2048).unwrap())
}
