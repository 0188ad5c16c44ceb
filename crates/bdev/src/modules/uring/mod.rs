//! The io_uring backend: a regular file or a block device driven through io_uring.
//!
//! # Files and geometry
//! The device opens its file twice, both read-write: once with `O_DIRECT` (when asked for, the
//! usual case) and once without. Reads and writes go to the `O_DIRECT` descriptor when the
//! offset, every iovec base and every iovec length meet the file's direct-I/O alignment (from
//! `statx(STATX_DIOALIGN)` when the kernel reports it, else the logical block size); anything
//! else (guest buffers need not be aligned) goes to the buffered descriptor. Both paths are zero
//! copy: the caller's iovecs are handed to the kernel as they are. The kernel keeps the two views
//! coherent (a direct read writes back dirty cached pages of its range first, a direct write
//! invalidates them), so mixing them is safe for non-overlapping or ordered requests.
//!
//! Size: the file length for a regular file, `BLKGETSIZE64` for a block device; a tail shorter
//! than one block is not exposed. Logical block size: `BLKSSZGET` for a block device, 512 for a
//! regular file; the caller may pick a larger power of two.
//!
//! # Rings
//! The project's model is "one ring per reactor". What this backend gives is one ring per
//! *channel*, i.e. per (device, reactor) pair, created by [`BlockDevice::open_channel`] on the
//! reactor thread that uses it. Today a reactor serves each device through one channel (a vhost
//! queue owns one channel, and a reactor typically serves one device's queues), so the two
//! coincide or differ only by a few idle rings; each ring costs a few pages and a file
//! descriptor, and an idle ring costs no system calls (see below). Sharing one ring between
//! all devices of a reactor would need a reactor-owned ring with completions routed back by
//! device, which the [`IoChannel`] API does not carry yet; nothing in the callers depends on
//! rings being per channel, so that can change behind this type.
//!
//! # Hot path
//! * [`IoChannel::submit`] builds one SQE (`READV`/`WRITEV` with the caller's iovec pointer,
//!   `FSYNC` with `DATASYNC` for `Flush`, `FALLOCATE(PUNCH_HOLE|KEEP_SIZE)` for `Discard`,
//!   `FALLOCATE(ZERO_RANGE|KEEP_SIZE)` for `WriteZeroes`) against registered files and puts it in
//!   the submission queue. Once `submit_batch` SQEs wait there
//!   ([`UringDevice::with_submit_batch`], 1 by default) it makes one `io_uring_enter` that
//!   hands them to the kernel; with 0 it makes no system call and `poll` submits. When the SQ
//!   is full the entry waits in a small preallocated overflow queue; when that is full too, or
//!   all per-request slots are taken (as many as the completion queue holds, so it cannot
//!   overflow), `submit` returns [`SubmitError::Busy`] and the caller retries after a `poll`.
//! * [`IoChannel::poll`] makes at most one `io_uring_enter`: only when SQEs are waiting, or when
//!   the kernel flags deferred completion work (`IORING_SQ_TASKRUN`) for requests in flight.
//!   Otherwise completions are reaped straight from the shared completion ring with no system
//!   call, and a channel with nothing in flight makes none at all. Entries waiting in the
//!   overflow queue move to the SQ after the enter and go to the kernel on the next poll.
//!
//! Why each request is submitted at once (issue 23): with `submit_batch` 0 one enter per round
//! submitted everything the round queued and ran the completion work, 0.2–0.6 enters per I/O
//! at QD32 where fio's engine, submitting each request as it comes, makes one. Fewer system
//! calls, but on the bench's virtio disk a round's batch reaches the device together and its
//! latency rose as if served as one (the mechanism is the device's; not traced): QD32 p50
//! 408–549 µs against fio's 322–354 µs on the same file. Submitting each request as it comes
//! brought p50 to 311–422 µs and QD32 IOPS to 1.08–2.34× those of batch 0 in 19 of 22
//! interleaved rounds over both clients. At QD1 the polled client's p50 was a few µs higher
//! in most later rounds, for no mechanism found (docs/benchmarks.md, "The file backend
//! against fio"). A device that prefers batches (a fast NVMe drive, where each
//! submission rings a doorbell) may want a larger `submit_batch` or 0; it is a parameter of
//! `bdev_uring_create`.
//!
//! # Ring set-up
//! Rings are created with `SINGLE_ISSUER | COOP_TASKRUN | TASKRUN_FLAG | SUBMIT_ALL`. Kernels
//! that refuse a flag (`EINVAL` from `io_uring_setup`; `SINGLE_ISSUER` needs 6.0,
//! `COOP_TASKRUN` 5.19) get `COOP_TASKRUN | TASKRUN_FLAG | SUBMIT_ALL`, then a plain ring, and
//! the first fallback is logged (once per process).
//!
//! Measured and left out (docs/benchmarks.md, "The file backend against fio"):
//! * `DEFER_TASKRUN` (what fio's engine uses) made no difference to IOPS at QD1 or QD32 within
//!   the machine's noise but tripled the enters at QD32 (0.66–0.79 per I/O against 0.20–0.23):
//!   with it, completion work runs only in an `io_uring_enter(GETEVENTS)` of ours, while
//!   `COOP_TASKRUN` work also runs in the enters that submit (issue 9).
//! * `SQPOLL` (issue 23): the kernel refuses it with `COOP_TASKRUN`/`TASKRUN_FLAG` (`EINVAL`),
//!   and its kernel thread busy-polls the SQ, so on two cores it shares one with a polling
//!   reactor or client. Pinned to the reactor's core, 21 IOPS at QD1 and 0.9 K at QD32 (polled
//!   client); pinned to the client's core, 33 IOPS at QD1 with a polled client and, with the
//!   completion-fd client, 1.2–4.5 K at QD1 and 6.9–28 K at QD32 against 3.9–4.5 K and
//!   19–24 K without; unpinned, 31–107 IOPS at QD1.
//! * Registered buffers (issue 23): tried by registering each guest memory mapping with the
//!   ring on first use and reading with `READ_FIXED` (a throw-away experiment; the trace
//!   showed every read fixed). Against the same binary without: 0.86–1.27× per round and
//!   point (one 2.00× in a disturbed round), no consistent gain; fio's own `--fixedbufs` made no difference to fio either. Pinning pages
//!   per I/O is not where this disk's time goes. Doing it for real needs the guest memory
//!   table at channel set-up: a hook on [`BlockDevice`] or [`IoChannel`] taking the regions
//!   (address, length) when a vhost queue starts and again on a new table, which issue 25's
//!   memory-registration hook is to add; the ring would then register them and use
//!   `READ_FIXED`/`READV_FIXED` (Linux 6.15) with the region's index.
//! * `NO_SQARRAY` (Linux 6.6, issue 23): no gain (QD32 completion-fd
//!   client 18–33 K against 29–45 K for the same binary without, in the same rounds).
//! * `IOPOLL` needs a device with poll queues and refuses our buffered descriptor.
//!
//! # Completion status
//! A negative result is `IoStatus::Error(errno)`, except `EOPNOTSUPP` on `Discard`/`WriteZeroes`
//! (a filesystem or device without that fallocate mode), which is `IoStatus::Unsupported`. A
//! short read or write is reported as `Error(EIO)` rather than resubmitted: with the device size
//! fixed at open time it only happens if the file shrank underneath us or the device failed
//! part-way, and a partial transfer is then an error for the guest anyway. The same applies to
//! a single transfer beyond Linux's per-call limit (just under 2 GiB). A `Read`/`Write` whose
//! iovecs do not add up to `len` completes with `Error(EINVAL)` without reaching the kernel;
//! one with more than `IOV_MAX` (1024) iovecs gets `Error(EINVAL)` from the kernel.
//!
//! On a block device, `Discard` becomes `PUNCH_HOLE`, which the kernel turns into an unmapping
//! write-zeroes and fails with `EOPNOTSUPP` (so `Unsupported`) on devices that cannot do that;
//! `WriteZeroes` becomes `ZERO_RANGE`, which falls back to writing zeroes and works everywhere.
//!
//! # Block status
//! [`BlockDevice::block_status`] answers from the file's holes (`lseek` with `SEEK_DATA` and
//! `SEEK_HOLE` on the buffered descriptor, `status.rs`), rounded to blocks so that a reported
//! hole never holds data; a block device, or a file system that cannot tell, is all data.
//!
//! # Wake-ups
//! Each channel registers a non-blocking eventfd with its ring and returns it from
//! [`IoChannel::completion_fd`]; the kernel signals it whenever it posts a completion. `poll`
//! never reads it (that would be a second system call). While the caller busy-polls
//! ([`IoChannel::disarm_completion_fd`]) the ring carries `IORING_CQ_EVENTFD_DISABLED` and the
//! kernel skips the signal, and with it the wake-up of the eventfd's epoll watchers, per
//! completion batch. [`IoChannel::arm_completion_fd`], before a sleep, clears that flag, drains
//! the counter (a count left from earlier would keep a level-triggered epoll returning at once)
//! and says whether anything is already waiting for `poll`. A completion that the kernel
//! finishes as deferred work of the reactor thread (most direct I/O) first interrupts the sleep: `epoll_wait` returns `EINTR`, the kernel posts the
//! completion on the way out and signals the eventfd. Treat `EINTR` as a wake-up.
//!
//! Dropping a channel with requests in flight blocks until the kernel has finished them, since
//! it may still be reading or writing the callers' buffers.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};

mod rpc;
mod status;

pub use rpc::UringModule;

use crate::{
    validate_geometry, BdevError, BdevInfo, BlockDevice, BlockExtent, Capacity, IoChannel, IoOp, IoRequest,
    IoStatus, SubmitError, ALL_IO_TYPES,
};

/// Submission queue size used unless [`UringDevice::with_ring_entries`] says otherwise.
pub const DEFAULT_RING_ENTRIES: u32 = 256;
/// SQEs a channel lets wait before [`IoChannel::submit`] hands them to the kernel, unless
/// [`UringDevice::with_submit_batch`] says otherwise: each request at once (module docs, "Hot
/// path", for the figures).
pub const DEFAULT_SUBMIT_BATCH: u32 = 1;
const MAX_RING_ENTRIES: u32 = 4096;

/// Indexes of the device's descriptors in each ring's registered-file table.
const FILE_BUFFERED: types::Fixed = types::Fixed(0);
const FILE_DIRECT: types::Fixed = types::Fixed(1);

/// `_IOR(0x12, 114, size_t)`: libc does not export it. The direction bits sit differently on
/// the architectures with the "old" ioctl layout.
const BLKGETSIZE64: libc::Ioctl = {
    let size = (std::mem::size_of::<usize>() as libc::Ioctl) << 16;
    let read = if cfg!(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc",
        target_arch = "sparc64"
    )) {
        2 << 29
    } else {
        2 << 30
    };
    read | size | (0x12 << 8) | 114
};

/// A file or block device read and written through io_uring with O_DIRECT.
pub struct UringDevice {
    shared: Arc<Shared>,
    ring_entries: u32,
    submit_batch: u32,
}

/// What channels share with the device: the description and the open files, which must stay
/// open while any channel's ring may use them.
struct Shared {
    info: BdevInfo,
    buffered: File,
    direct: Option<File>,
    align: DioAlign,
}

impl UringDevice {
    /// Opens `path` (a regular file or a block device) read-write, with `O_DIRECT` when `direct`.
    pub fn new(name: &str, path: &Path, block_size: Option<u32>, direct: bool) -> Result<Self, BdevError> {
        UringDevice::open_with(name, path, block_size, direct, |direct| open_file(path, direct))
    }

    /// [`UringDevice::new`], with the caller opening `path`: `open(false)` returns a read-write
    /// descriptor and, when `direct`, `open(true)` a read-write `O_DIRECT` one. A caller that
    /// restricts where a path may lead does so in `open`; `path` itself is only reported.
    pub fn open_with(
        name: &str,
        path: &Path,
        block_size: Option<u32>,
        direct: bool,
        open: impl Fn(bool) -> io::Result<File>,
    ) -> Result<Self, BdevError> {
        let open_err = |source| BdevError::Open { path: path.display().to_string(), source };
        let buffered = open(false).map_err(open_err)?;
        let probe = probe_file(&buffered, path)?;

        let block_size = match block_size {
            None => probe.logical_block_size,
            Some(bs) if bs.is_power_of_two() && bs >= probe.logical_block_size => bs,
            Some(bs) => {
                return Err(BdevError::InvalidParam {
                    field: "block_size",
                    reason: format!(
                        "{bs} must be a power of two no smaller than the logical block size {} \
                         of {}",
                        probe.logical_block_size,
                        path.display()
                    ),
                })
            }
        };
        let num_blocks = probe.size / u64::from(block_size);
        if num_blocks == 0 {
            return Err(BdevError::InvalidParam {
                field: "filename",
                reason: format!(
                    "{} holds {} bytes, less than one {block_size}-byte block",
                    path.display(),
                    probe.size
                ),
            });
        }
        validate_geometry(name, block_size, num_blocks)?;

        let direct = if direct {
            let file = open(true).map_err(|e| {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    log::warn!(
                        "uring bdev {name}: {} does not support O_DIRECT; create it with direct \
                         I/O off",
                        path.display()
                    );
                }
                open_err(e)
            })?;
            Some(file)
        } else {
            None
        };
        let align = DioAlign::probe(direct.as_ref().unwrap_or(&buffered), probe.logical_block_size);

        Ok(UringDevice {
            shared: Arc::new(Shared {
                info: BdevInfo {
                    name: name.to_string(),
                    product_name: "URING bdev".into(),
                    block_size,
                    capacity: Capacity::new(num_blocks),
                    io_types: ALL_IO_TYPES,
                    driver: "uring",
                    driver_specific: Some(("filename".into(), path.display().to_string())),
                },
                buffered,
                direct,
                align,
            }),
            ring_entries: DEFAULT_RING_ENTRIES,
            submit_batch: DEFAULT_SUBMIT_BATCH,
        })
    }

    /// Sets the submission queue size of channels opened from now on: a power of two from 2 to
    /// 4096. Each channel accepts up to twice as many requests in flight.
    pub fn with_ring_entries(mut self, entries: u32) -> Result<Self, BdevError> {
        if !entries.is_power_of_two() || !(2..=MAX_RING_ENTRIES).contains(&entries) {
            return Err(BdevError::InvalidParam {
                field: "ring_entries",
                reason: format!("{entries} is not a power of two between 2 and {MAX_RING_ENTRIES}"),
            });
        }
        self.ring_entries = entries;
        Ok(self)
    }

    /// Sets how many SQEs a channel opened from now on lets wait in its submission queue
    /// before `submit` makes the `io_uring_enter` that hands them to the kernel: 1 (the
    /// default) submits each request as it comes; 0 leaves every submission to `poll`, one
    /// enter per reactor round. At most 4096.
    pub fn with_submit_batch(mut self, batch: u32) -> Result<Self, BdevError> {
        if batch > MAX_RING_ENTRIES {
            return Err(BdevError::InvalidParam {
                field: "submit_batch",
                reason: format!("{batch} is more than {MAX_RING_ENTRIES}"),
            });
        }
        self.submit_batch = batch;
        Ok(self)
    }

    /// Whether aligned requests bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.shared.direct.is_some()
    }
}

impl BlockDevice for UringDevice {
    fn info(&self) -> &BdevInfo {
        &self.shared.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(UringChannel::new(Arc::clone(&self.shared), self.ring_entries, self.submit_batch)?))
    }

    /// Any size up to the file's (or block device's) own, whole blocks: the disk never reaches
    /// past the end of what backs it. [`UringDevice::backing_blocks`] is the usual new size.
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        let info = &self.shared.info;
        validate_geometry(&info.name, info.block_size, num_blocks)?;
        let backing = self.backing_blocks()?;
        if num_blocks > backing {
            return Err(BdevError::InvalidParam {
                field: "num_blocks",
                reason: format!("{num_blocks} blocks reach past the end of the file ({backing} blocks)"),
            });
        }
        info.capacity.set(num_blocks);
        Ok(())
    }

    /// The file's holes, from `lseek(SEEK_DATA / SEEK_HOLE)` (`status.rs`): at most 64 extents
    /// and a few hundred `lseek`s per call.
    fn block_status(&self, offset: u64, len: u64, out: &mut Vec<BlockExtent>) -> Result<(), BdevError> {
        let info = &self.shared.info;
        info.check_status_range(offset, len)?;
        let fd = self.shared.buffered.as_raw_fd();
        status::extents(offset, len, u64::from(info.block_size), |find, at| status::lseek(fd, find, at), out);
        Ok(())
    }
}

impl UringDevice {
    /// How many whole blocks the file or block device holds now (`bdev_uring_rescan` resizes
    /// the bdev to this after the file was grown or truncated).
    pub fn backing_blocks(&self) -> Result<u64, BdevError> {
        let info = &self.shared.info;
        let path = info.driver_specific.as_ref().map(|(_, p)| p.as_str()).unwrap_or_default();
        let probe = probe_file(&self.shared.buffered, Path::new(path))?;
        Ok(probe.size / u64::from(info.block_size))
    }
}

/// Opens `path` read-write, with `O_DIRECT` when `direct`: what [`UringDevice::new`] does
/// when the caller sets no restriction on where the path may lead.
pub fn open_file(path: &Path, direct: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

struct Probe {
    size: u64,
    logical_block_size: u32,
}

fn probe_file(file: &File, path: &Path) -> Result<Probe, BdevError> {
    let open_err = |source| BdevError::Open { path: path.display().to_string(), source };
    let meta = file.metadata().map_err(open_err)?;
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(Probe { size: meta.len(), logical_block_size: 512 });
    }
    if !ft.is_block_device() {
        return Err(BdevError::InvalidParam {
            field: "filename",
            reason: format!("{} is neither a regular file nor a block device", path.display()),
        });
    }
    let fd = file.as_raw_fd();
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live u64.
    if unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut size as *mut u64) } < 0 {
        return Err(open_err(io::Error::last_os_error()));
    }
    let mut logical: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points to a live c_int.
    if unsafe { libc::ioctl(fd, libc::BLKSSZGET, &mut logical as *mut libc::c_int) } < 0 {
        return Err(open_err(io::Error::last_os_error()));
    }
    let logical_block_size =
        u32::try_from(logical).ok().filter(|n| n.is_power_of_two()).ok_or_else(|| {
            BdevError::InvalidParam {
                field: "filename",
                reason: format!("{} reports logical block size {logical}", path.display()),
            }
        })?;
    Ok(Probe { size, logical_block_size })
}

/// What `O_DIRECT` requires of a request: memory addresses aligned to `mem`, file offset and
/// every segment length aligned to `len` (both powers of two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DioAlign {
    mem: u64,
    len: u64,
}

impl DioAlign {
    fn probe(file: &File, logical_block_size: u32) -> DioAlign {
        let fallback = DioAlign { mem: u64::from(logical_block_size), len: u64::from(logical_block_size) };
        // SAFETY: statx is a plain C struct for which all-zero bytes are a valid value.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open, the path is an empty C string as AT_EMPTY_PATH requires, and
        // `stx` is a live, writable statx buffer.
        let rc = unsafe {
            libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx)
        };
        let reported = rc == 0
            && stx.stx_mask & libc::STATX_DIOALIGN != 0
            && stx.stx_dio_mem_align.is_power_of_two()
            && stx.stx_dio_offset_align.is_power_of_two();
        if reported {
            DioAlign { mem: u64::from(stx.stx_dio_mem_align), len: u64::from(stx.stx_dio_offset_align) }
        } else {
            fallback
        }
    }

    /// Sums the iovec lengths (`None` on overflow) and says whether the request may go to the
    /// `O_DIRECT` descriptor.
    fn scan(&self, offset: u64, iov: &[libc::iovec]) -> (Option<u64>, bool) {
        let (mem_mask, len_mask) = (self.mem - 1, self.len - 1);
        let mut aligned = offset & len_mask == 0;
        let mut total = Some(0u64);
        for v in iov {
            let len = v.iov_len as u64;
            aligned &= (v.iov_base as u64) & mem_mask == 0 && len & len_mask == 0;
            total = total.and_then(|t| t.checked_add(len));
        }
        (total, aligned)
    }
}

/// One request owned by the channel between `submit` and the `poll` that returns it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    tag: u32,
    op: IoOp,
    /// Bytes a read or write must transfer.
    len: u64,
    /// The outcome of a request completed without the kernel (see `UringChannel::local`).
    status: IoStatus,
}

const EMPTY_SLOT: Slot = Slot { tag: 0, op: IoOp::Flush, len: 0, status: IoStatus::Success };

struct UringChannel {
    ring: IoUring,
    shared: Arc<Shared>,
    /// Signalled by the kernel on every completion; registered with `ring`.
    eventfd: OwnedFd,
    slots: Box<[Slot]>,
    /// Indexes of unused slots; its capacity is the slot count, so it never reallocates.
    free: Vec<u32>,
    /// SQEs accepted while the SQ was full, in order; never grows past `overflow_cap`.
    overflow: VecDeque<squeue::Entry>,
    overflow_cap: usize,
    /// Slots of requests finished in `submit` without reaching the kernel, for the next `poll`.
    local: VecDeque<u32>,
    /// SQEs in the SQ or in the kernel: pushed and not yet reaped.
    in_ring: usize,
    /// Whether the last `io_uring_enter` failed, so a persisting failure is logged once.
    enter_failing: bool,
    /// SQEs that make `submit` enter at once; 0: only `poll` enters.
    submit_batch: usize,
}

/// The ring set-ups tried in order, best first: the first that `io_uring_setup` accepts is
/// used. A channel is used by the one thread that opened it (it is not `Send`), which is what
/// SINGLE_ISSUER (Linux 6.0) promises. COOP_TASKRUN (5.19) stops completions from interrupting
/// the reactor, and TASKRUN_FLAG tells `poll` when an enter is needed to get them. DEFER_TASKRUN
/// is left out on purpose (module docs, "Ring set-up").
const RING_MODES: [RingMode; 3] = [
    RingMode { name: "SINGLE_ISSUER|COOP_TASKRUN|TASKRUN_FLAG|SUBMIT_ALL", single: true, coop: true },
    RingMode { name: "COOP_TASKRUN|TASKRUN_FLAG|SUBMIT_ALL", single: false, coop: true },
    RingMode { name: "no set-up flags", single: false, coop: false },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RingMode {
    name: &'static str,
    single: bool,
    coop: bool,
}

/// Whether a fallback was logged already: once per process is enough (every channel of every
/// device runs on the same kernel).
static FALLBACK_LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn build_ring(entries: u32) -> io::Result<(IoUring, RingMode)> {
    build_first(entries, |mode| {
        let mut b = IoUring::builder();
        if mode.single {
            b.setup_single_issuer();
        }
        if mode.coop {
            b.setup_coop_taskrun().setup_taskrun_flag().setup_submit_all();
        }
        b.build(entries)
    })
}

/// Tries [`RING_MODES`] in order with `setup`. A mode refused with `EINVAL` (a kernel that does
/// not know one of its flags) falls back to the next, with a log line; any other error is final.
fn build_first<T>(
    entries: u32,
    mut setup: impl FnMut(&RingMode) -> io::Result<T>,
) -> io::Result<(T, RingMode)> {
    let mut refused: Vec<&str> = Vec::new();
    for mode in &RING_MODES {
        match setup(mode) {
            Ok(ring) => {
                if !refused.is_empty() && !FALLBACK_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    log::warn!(
                        "uring bdev: io_uring_setup refused {} (EINVAL: kernel too old?); rings use {} \
                         ({entries} entries)",
                        refused.join(", then "),
                        mode.name
                    );
                }
                return Ok((ring, *mode));
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => refused.push(mode.name),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EINVAL))
}

impl UringChannel {
    fn new(shared: Arc<Shared>, entries: u32, submit_batch: u32) -> Result<Self, BdevError> {
        let (ring, mode) = build_ring(entries).map_err(BdevError::Uring)?;
        log::debug!("uring bdev {}: channel ring with {}", shared.info.name, mode.name);
        let mut files = [shared.buffered.as_raw_fd(), -1];
        let nfiles = match &shared.direct {
            Some(direct) => {
                files[1] = direct.as_raw_fd();
                2
            }
            None => 1,
        };
        ring.submitter().register_files(&files[..nfiles]).map_err(BdevError::Uring)?;

        let eventfd = fp_sys::eventfd().map_err(BdevError::Uring)?;
        ring.submitter().register_eventfd(eventfd.as_raw_fd()).map_err(BdevError::Uring)?;

        let sq_entries = ring.params().sq_entries() as usize;
        // Never more requests in flight than the CQ holds, so completions cannot overflow it.
        let nslots = ring.params().cq_entries() as usize;
        let overflow_cap = (sq_entries / 4).max(4);
        Ok(UringChannel {
            ring,
            shared,
            eventfd,
            slots: vec![EMPTY_SLOT; nslots].into_boxed_slice(),
            free: (0..nslots as u32).rev().collect(),
            overflow: VecDeque::with_capacity(overflow_cap),
            overflow_cap,
            local: VecDeque::with_capacity(nslots),
            in_ring: 0,
            enter_failing: false,
            submit_batch: submit_batch as usize,
        })
    }

    /// Builds the SQE for `req`, or the status it completes with at once.
    fn prepare(&self, req: &IoRequest) -> Result<squeue::Entry, IoStatus> {
        let shared = &*self.shared;
        match req.op {
            IoOp::Read | IoOp::Write => {
                let iov = req.iov.as_slice();
                let (total, aligned) = shared.align.scan(req.offset, iov);
                if total != Some(req.len) {
                    return Err(IoStatus::Error(libc::EINVAL));
                }
                if req.len == 0 {
                    return Err(IoStatus::Success);
                }
                let file = if aligned && shared.direct.is_some() { FILE_DIRECT } else { FILE_BUFFERED };
                // The iovec pointer goes to the kernel as is: the request's `Iovecs` vouch for
                // the array and its buffers until completion.
                Ok(if req.op == IoOp::Read {
                    opcode::Readv::new(file, req.iov.as_ptr(), req.iov.count()).offset(req.offset).build()
                } else {
                    opcode::Writev::new(file, req.iov.as_ptr(), req.iov.count()).offset(req.offset).build()
                })
            }
            IoOp::Flush => Ok(opcode::Fsync::new(FILE_BUFFERED).flags(types::FsyncFlags::DATASYNC).build()),
            IoOp::Discard | IoOp::WriteZeroes if req.len == 0 => Err(IoStatus::Success),
            IoOp::Discard => Ok(opcode::Fallocate::new(FILE_BUFFERED, req.len)
                .offset(req.offset)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build()),
            IoOp::WriteZeroes => Ok(opcode::Fallocate::new(FILE_BUFFERED, req.len)
                .offset(req.offset)
                .mode(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE)
                .build()),
        }
    }

    /// Queues `entry` in the SQ, or the overflow queue when the SQ is full. `false` when both
    /// are full.
    ///
    /// # Safety
    /// Everything the entry points to stays valid until its completion is reaped.
    unsafe fn queue(&mut self, entry: squeue::Entry) -> bool {
        // Keep FIFO order: once anything waits in the overflow queue, newcomers wait behind it.
        if self.overflow.is_empty() {
            // SAFETY: passed on from the caller; the entry's files are registered with this ring
            // and stay open while `self.shared` lives.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.in_ring += 1;
                return true;
            }
        }
        if self.overflow.len() < self.overflow_cap {
            self.overflow.push_back(entry);
            return true;
        }
        false
    }

    /// Moves waiting overflow entries into the SQ as far as it has room.
    fn refill_sq(&mut self) {
        if self.overflow.is_empty() {
            return;
        }
        let mut sq = self.ring.submission();
        while let Some(entry) = self.overflow.front() {
            // SAFETY: the entry was accepted by `submit`, whose caller keeps its buffers valid
            // until completion; its files are registered with this ring.
            if unsafe { sq.push(entry) }.is_err() {
                break;
            }
            self.overflow.pop_front();
            self.in_ring += 1;
        }
    }

    /// One `io_uring_enter` if there is anything for the kernel to do, else none.
    fn enter_if_needed(&mut self) {
        if self.in_ring == 0 {
            return;
        }
        let needed = {
            let sq = self.ring.submission();
            !sq.is_empty() || sq.taskrun() || sq.cq_overflow()
        };
        if !needed {
            return;
        }
        // `submit` adds GETEVENTS itself when the kernel flagged pending completion work.
        match self.ring.submit() {
            Ok(_) => self.enter_failing = false,
            // Transient (a signal, or the kernel short of memory): the entries stay queued and
            // the next poll tries again.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
            Err(e) => {
                if !self.enter_failing {
                    log::warn!("uring bdev {}: io_uring_enter failed: {e}", self.shared.info.name);
                }
                self.enter_failing = true;
            }
        }
    }
}

fn completion_status(slot: &Slot, res: i32) -> IoStatus {
    if res < 0 {
        let errno = -res;
        if errno == libc::EOPNOTSUPP && matches!(slot.op, IoOp::Discard | IoOp::WriteZeroes) {
            return IoStatus::Unsupported;
        }
        return IoStatus::Error(errno);
    }
    if matches!(slot.op, IoOp::Read | IoOp::Write) && res as u64 != slot.len {
        return IoStatus::Error(libc::EIO);
    }
    IoStatus::Success
}

impl IoChannel for UringChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.shared.info.check_range(req.offset, req.len)?;
        let Some(&slot) = self.free.last() else {
            return Err(SubmitError::Busy);
        };
        let mut state = Slot { tag: req.tag, op: req.op, len: req.len, status: IoStatus::Success };
        match self.prepare(req) {
            Ok(entry) => {
                // SAFETY: the request's `Iovecs` vouch for the iovecs and buffers until its
                // completion is returned by `poll`, which is after the kernel is done with them.
                if !unsafe { self.queue(entry.user_data(u64::from(slot))) } {
                    return Err(SubmitError::Busy);
                }
                if self.submit_batch != 0 && self.ring.submission().len() >= self.submit_batch {
                    self.enter_if_needed();
                }
            }
            Err(status) => {
                state.status = status;
                self.local.push_back(slot);
            }
        }
        self.free.pop();
        self.slots[slot as usize] = state;
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let mut n = 0;
        while let Some(slot) = self.local.pop_front() {
            let state = self.slots[slot as usize];
            self.free.push(slot);
            done(state.tag, state.status);
            n += 1;
        }

        self.enter_if_needed();
        self.refill_sq();

        for cqe in self.ring.completion() {
            let slot = cqe.user_data() as u32;
            let state = self.slots[slot as usize];
            self.free.push(slot);
            self.in_ring -= 1;
            done(state.tag, completion_status(&state, cqe.result()));
            n += 1;
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        Some(self.eventfd.as_raw_fd())
    }

    fn disarm_completion_fd(&mut self) {
        // IORING_CQ_EVENTFD_DISABLED: the kernel checks it before each eventfd signal, which
        // otherwise costs a wake-up of the eventfd's epoll watchers per completion batch.
        self.ring.completion().disable_eventfd();
    }

    fn arm_completion_fd(&mut self) -> bool {
        self.ring.completion().enable_eventfd();
        // The flag store must be visible to the kernel before we look at the rings: a completion
        // posted after the look then signals.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let mut counter = 0u64;
        // SAFETY: the eventfd is open (we own it) and non-blocking; `counter` is a live u64.
        // An empty counter fails with EAGAIN, which is what we want.
        unsafe { libc::eventfd_read(self.eventfd.as_raw_fd(), &mut counter) };
        let sq = self.ring.submission();
        let idle = sq.is_empty() && !sq.taskrun() && !sq.cq_overflow();
        drop(sq);
        idle && self.overflow.is_empty() && self.local.is_empty() && self.ring.completion().is_empty()
    }
}

impl Drop for UringChannel {
    fn drop(&mut self) {
        if self.in_ring == 0 {
            return;
        }
        log::debug!(
            "uring bdev {}: channel closed with {} requests in flight; waiting for them",
            self.shared.info.name,
            self.in_ring
        );
        // The kernel may still be reading or writing the callers' buffers: closing the ring
        // does not wait for that, so wait here.
        while self.in_ring > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                Err(e) => {
                    log::error!(
                        "uring bdev {}: cannot wait for {} requests in flight: {e}",
                        self.shared.info.name,
                        self.in_ring
                    );
                    return;
                }
            }
            self.in_ring -= self.ring.completion().count();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(base: usize, len: usize) -> libc::iovec {
        libc::iovec { iov_base: base as *mut libc::c_void, iov_len: len }
    }

    #[test]
    fn direct_routing_needs_aligned_offset_bases_and_lengths() {
        let a = DioAlign { mem: 512, len: 512 };
        assert_eq!(a.scan(4096, &[iov(8192, 512), iov(16384, 1024)]), (Some(1536), true));
        assert_eq!(a.scan(4096, &[iov(8192 + 8, 512)]), (Some(512), false));
        assert_eq!(a.scan(4096, &[iov(8192, 100), iov(16384, 412)]), (Some(512), false));
        assert_eq!(a.scan(4096 + 512, &[iov(8192, 512)]), (Some(512), true));
        let coarse = DioAlign { mem: 4, len: 4096 };
        assert_eq!(coarse.scan(512, &[iov(8196, 4096)]), (Some(4096), false));
        assert_eq!(coarse.scan(8192, &[iov(8196, 4096)]), (Some(4096), true));
        assert_eq!(a.scan(0, &[iov(0, usize::MAX), iov(0, 1)]).0, None);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn blkgetsize64_matches_the_kernel_header() {
        assert_eq!(BLKGETSIZE64, 0x8008_1272);
    }

    #[test]
    fn ring_setup_falls_back_flag_by_flag() {
        let einval = || io::Error::from_raw_os_error(libc::EINVAL);
        // A kernel without SINGLE_ISSUER (5.19): the next mode.
        let (tried, mode) = build_first(8, |m| if m.single { Err(einval()) } else { Ok(m.name) }).unwrap();
        assert_eq!((tried, mode), (RING_MODES[1].name, RING_MODES[1]));
        // A kernel without any of the flags: the plain ring.
        let (_, mode) = build_first(8, |m| if m.coop { Err(einval()) } else { Ok(()) }).unwrap();
        assert_eq!(mode, RING_MODES[2]);
        // Other errors are not a missing flag.
        let e = build_first(8, |_| -> io::Result<()> { Err(io::Error::from_raw_os_error(libc::ENOMEM)) });
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::ENOMEM));
        // This kernel takes the first mode that it knows, and a real ring works with it.
        let (ring, mode) = build_ring(8).unwrap();
        assert!(ring.params().sq_entries() >= 8, "{mode:?}");
    }

    #[test]
    fn short_and_failed_transfers_are_errors() {
        let read = Slot { tag: 1, op: IoOp::Read, len: 4096, status: IoStatus::Success };
        assert_eq!(completion_status(&read, 4096), IoStatus::Success);
        assert_eq!(completion_status(&read, 512), IoStatus::Error(libc::EIO));
        assert_eq!(completion_status(&read, -libc::EIO), IoStatus::Error(libc::EIO));
        assert_eq!(completion_status(&read, -libc::EOPNOTSUPP), IoStatus::Error(libc::EOPNOTSUPP));
        let discard = Slot { op: IoOp::Discard, ..read };
        assert_eq!(completion_status(&discard, 0), IoStatus::Success);
        assert_eq!(completion_status(&discard, -libc::EOPNOTSUPP), IoStatus::Unsupported);
    }
}
