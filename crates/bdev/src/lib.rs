//! The block device layer.
//!
//! A block device ("bdev", after SPDK) is two objects:
//!
//! * a [`BlockDevice`]: `Send + Sync`, created and deleted on the control plane, describing the
//!   device (name, geometry, which operations it supports) and able to open channels;
//! * an [`IoChannel`]: core-local (not `Send`), opened by the reactor that will submit I/O through
//!   it. All hot-path state (rings, completion lists, counters) lives here, so a channel never
//!   takes a lock.
//!
//! Callers submit [`IoRequest`]s tagged with a `u32` of their choice and later call
//! [`IoChannel::poll`] to reap completions, which come back by tag. Buffers are described by
//! `iovec`s that point into memory the caller keeps valid until the completion is reaped
//! (for the vhost-user frontend, guest memory): backends read and write them in place.
//!
//! Each backend is a bdev module (`modules/<name>/`): the device, and in `rpc.rs` its JSON-RPC
//! methods, which work through a [`ModuleHost`] (see [`module`]). `conformance` (feature
//! `conformance`) holds the checks every device must pass.
//!
//! Stacking: a volume, QoS or partition layer is itself a `BlockDevice` whose channel holds a
//! channel of the device below. A backend that completes on its own threads (Ceph RBD, say)
//! pushes completions into a lock-free queue owned by the channel and signals the fd returned by
//! [`IoChannel::completion_fd`], so a sleeping reactor wakes up.

#![deny(missing_docs)]

use std::os::unix::io::RawFd;
use std::sync::Arc;

pub mod buf;
pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod disk;
pub mod module;
pub mod modules;
pub mod qos;

pub use buf::AlignedBuf;
pub use disk::{Disk, DiskEvent};
pub use module::{BdevModule, ClaimType, ModuleError, ModuleHost, NewBdev};
pub use modules::delay::{DelayDevice, DelayLatency, LatencyKind};
pub use modules::malloc::RamDevice;
pub use modules::null::NullDevice;
pub use modules::uring::UringDevice;
pub use modules::{delay, malloc, null, uring};

/// What a request asks the device to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Read `len` bytes at `offset` into the iovecs.
    Read,
    /// Write `len` bytes at `offset` from the iovecs.
    Write,
    /// Make all completed writes durable.
    Flush,
    /// Deallocate `len` bytes at `offset`; later reads return unspecified data.
    Discard,
    /// Make `len` bytes at `offset` read back as zeroes.
    WriteZeroes,
}

/// One I/O request as handed to a channel.
///
/// `iov`/`iovcnt` describe the data buffers for `Read` and `Write` (their total length equals
/// `len`); they are ignored for the other operations.
#[derive(Debug, Clone, Copy)]
pub struct IoRequest {
    /// The caller's tag, handed back with the completion.
    pub tag: u32,
    /// What to do.
    pub op: IoOp,
    /// Byte offset on the device; a multiple of the block size.
    pub offset: u64,
    /// Length in bytes; a multiple of the block size.
    pub len: u64,
    /// The data buffers (`Read`, `Write`).
    pub iov: *const libc::iovec,
    /// Number of iovecs at `iov`.
    pub iovcnt: u32,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// Done.
    Success,
    /// The device failed the request; the value is a positive errno for diagnostics.
    Error(i32),
    /// The device does not support this operation.
    Unsupported,
}

/// Why a request was not accepted. The caller keeps ownership of it and may retry later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The channel's queue is full right now; poll and retry.
    #[error("channel queue is full")]
    Busy,
    /// Offset or length is not block-aligned or runs past the end of the device.
    #[error("request is outside the device or not block aligned")]
    OutOfRange,
    /// The device does not support this operation.
    #[error("operation not supported by this device")]
    Unsupported,
}

/// Which operations a device supports, reported in `bdev_get_bdevs` (SPDK's
/// `supported_io_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IoTypes {
    /// Reads.
    pub read: bool,
    /// Writes.
    pub write: bool,
    /// Flushes of a volatile cache.
    pub flush: bool,
    /// Unmap (discard, trim).
    pub unmap: bool,
    /// Writes of zeroes without a data buffer.
    pub write_zeroes: bool,
}

/// Every operation supported: what the RAM, null and file backends report.
pub(crate) const ALL_IO_TYPES: IoTypes =
    IoTypes { read: true, write: true, flush: true, unmap: true, write_zeroes: true };

/// A device's size in blocks, shared by its description, every copy of it and every channel:
/// a resize (`bdev_null_resize`, `bdev_uring_rescan`, ...) is one store that all of them see.
/// On the hot path it is one relaxed load of a line that is written only on resize.
#[derive(Debug, Clone)]
pub struct Capacity(Arc<std::sync::atomic::AtomicU64>);

impl Capacity {
    /// A capacity of `num_blocks` blocks.
    pub fn new(num_blocks: u64) -> Capacity {
        Capacity(Arc::new(std::sync::atomic::AtomicU64::new(num_blocks)))
    }

    /// The size now, in blocks.
    pub fn blocks(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the size. Callers serialise resizes of one device (the registry does).
    pub fn set(&self, num_blocks: u64) {
        self.0.store(num_blocks, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Two capacities are equal when they hold the same size now.
impl PartialEq for Capacity {
    fn eq(&self, other: &Capacity) -> bool {
        self.blocks() == other.blocks()
    }
}

impl Eq for Capacity {}

/// The description of a device. Everything but the size is fixed at creation; the size is a
/// shared [`Capacity`], so a copy taken earlier still reports (and checks against) the size now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdevInfo {
    /// The bdev's name, unique in the registry.
    pub name: String,
    /// SPDK's `product_name`, e.g. "Null disk".
    pub product_name: String,
    /// Logical block size in bytes (512 or 4096 typically).
    pub block_size: u32,
    /// The size, shared with every copy and channel.
    pub capacity: Capacity,
    /// The operations the device supports.
    pub io_types: IoTypes,
    /// The name of the module that makes it: "null", "malloc", "uring", "delay", ...
    pub driver: &'static str,
    /// Backend-specific details for `bdev_get_bdevs`' `driver_specific` (e.g. the file name).
    pub driver_specific: Option<(String, String)>,
}

impl BdevInfo {
    /// The size now, in blocks.
    pub fn num_blocks(&self) -> u64 {
        self.capacity.blocks()
    }

    /// The size now, in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks() * u64::from(self.block_size)
    }

    /// Checks that `[offset, offset + len)` is block aligned and inside the device.
    pub fn check_range(&self, offset: u64, len: u64) -> Result<(), SubmitError> {
        let bs = u64::from(self.block_size);
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(SubmitError::OutOfRange);
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(SubmitError::OutOfRange),
        }
    }

    /// Checks the range of a [`BlockDevice::block_status`] call: block aligned, not empty,
    /// inside the device; the error names the parameter at fault.
    pub fn check_status_range(&self, offset: u64, len: u64) -> Result<(), BdevError> {
        let bs = u64::from(self.block_size);
        let size = self.size_bytes();
        let invalid = |field, reason| Err(BdevError::InvalidParam { field, reason });
        if !offset.is_multiple_of(bs) || offset >= size {
            return invalid("offset", format!("{offset} is not a {bs}-byte block inside {size} bytes"));
        }
        if len == 0 || !len.is_multiple_of(bs) || len > size - offset {
            return invalid(
                "len",
                format!("{len} is not a non-zero multiple of {bs} bytes ending inside {size} bytes"),
            );
        }
        Ok(())
    }
}

/// Errors from creating devices or opening channels (control plane), and from
/// [`BlockDevice::block_status`].
#[derive(Debug, thiserror::Error)]
pub enum BdevError {
    /// A parameter is out of range or inconsistent.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParam {
        /// The parameter's name, as the RPC method spells it.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The backing file or device cannot be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// Its path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The io_uring instance cannot be created.
    #[error("cannot set up io_uring: {0}")]
    Uring(#[source] std::io::Error),
    /// The device's memory cannot be allocated.
    #[error("out of memory allocating {0} bytes")]
    NoMemory(u64),
    /// The device cannot do what was asked (resize a device of a fixed size, say).
    #[error("{0}")]
    Unsupported(String),
}

/// A run of bytes with one allocation state (NBD's `base:allocation`; qemu's block status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockExtent {
    /// Length of the run, in bytes.
    pub len: u64,
    /// Not allocated (reads come from nowhere).
    pub hole: bool,
    /// Reads return zeroes.
    pub zero: bool,
}

impl BlockExtent {
    /// Allocated bytes that may hold anything.
    pub const fn data(len: u64) -> BlockExtent {
        BlockExtent { len, hole: false, zero: false }
    }

    /// Unallocated bytes that read back as zeroes.
    pub const fn hole(len: u64) -> BlockExtent {
        BlockExtent { len, hole: true, zero: true }
    }

    /// Appends `self` to `out`, merged into the last extent when that one is at index `first`
    /// or later (this call's own) and in the same state, so callers may push piece by piece.
    /// An empty extent is dropped.
    pub fn append_to(self, out: &mut Vec<BlockExtent>, first: usize) {
        if self.len == 0 {
            return;
        }
        let mine = out.len() > first;
        match out.last_mut() {
            Some(last) if mine && last.hole == self.hole && last.zero == self.zero => last.len += self.len,
            _ => out.push(self),
        }
    }
}

/// A block device: shared, created on the control plane.
pub trait BlockDevice: Send + Sync {
    /// The device's description.
    fn info(&self) -> &BdevInfo;

    /// Opens a channel for the calling thread. Called on the reactor that will use it.
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError>;

    /// Changes the size to `num_blocks` (control plane). The caller has checked that nobody
    /// depends on blocks a shrink would remove, and tells the device's holders afterwards.
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        let _ = num_blocks;
        Err(BdevError::Unsupported(format!("a {} bdev cannot be resized", self.info().driver)))
    }

    /// The allocation state of `[offset, offset + len)` (block aligned, inside the device),
    /// appended to `out` as extents in order: at least one, together at most `len` bytes (a
    /// device may describe only a prefix, to bound the work of one call). Called on a reactor:
    /// must not block for long (an `lseek` is fine, a network round trip is not).
    ///
    /// The default, for devices that cannot tell (or cannot tell cheaply): one extent, all
    /// data. That is never wrong, only less useful: a hole is a promise, data is not.
    fn block_status(&self, offset: u64, len: u64, out: &mut Vec<BlockExtent>) -> Result<(), BdevError> {
        self.info().check_status_range(offset, len)?;
        out.push(BlockExtent::data(len));
        Ok(())
    }

    /// Whether the device refuses writes now (a snapshot volume, say), so a frontend can tell
    /// its clients instead of failing each write.
    fn read_only(&self) -> bool {
        false
    }

    /// The [`Disk`] this device is, if it is one: a frontend then opens its channels by type
    /// ([`Disk::open_typed`]) and saves a dynamic call per request.
    fn as_disk(&self) -> Option<&Disk> {
        None
    }
}

/// A per-core I/O channel. Never shared between threads.
pub trait IoChannel {
    /// Queues a request.
    ///
    /// Backends may batch: a submitted request is only guaranteed to reach the device when
    /// [`IoChannel::poll`] runs next.
    ///
    /// # Safety
    /// For `Read` and `Write`, `req.iov` must point to `req.iovcnt` valid iovecs whose buffers
    /// stay valid (and, for reads, writable and not otherwise accessed) until this request's
    /// completion is returned by `poll`. The iovec array itself must stay valid until then too.
    unsafe fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError>;

    /// Pushes queued requests to the device (at most one system call) and reaps completions,
    /// calling `done(tag, status)` for each. Returns how many completed.
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize;

    /// Requests submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;

    /// An fd that becomes readable when a completion is ready, for a reactor that wants to sleep
    /// with requests in flight. `None` when completions only come from `poll` itself.
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }

    /// The caller busy-polls from now on: the channel may stop signalling
    /// [`IoChannel::completion_fd`] (a signal nobody waits for still costs the backend, and the
    /// kernel, work per completion) until [`IoChannel::arm_completion_fd`]. A channel starts
    /// armed.
    fn disarm_completion_fd(&mut self) {}

    /// The caller is about to sleep on [`IoChannel::completion_fd`]: makes it signal again and
    /// clears signals already consumed by `poll`, so it is readable only for news. Returns
    /// `false` when completions are ready already; `poll` before sleeping then.
    fn arm_completion_fd(&mut self) -> bool {
        true
    }

    /// Whether the caller may sleep on [`IoChannel::completion_fd`] with requests in flight:
    /// every one of them will signal it (once armed) when it completes. True for a backend
    /// whose requests complete on other threads after long waits (Ceph RBD), where polling
    /// through the wait costs a core; false (the default) keeps the caller polling while
    /// anything is in flight, as a fast local device wants.
    fn sleeps_in_flight(&self) -> bool {
        false
    }
}

/// A shared handle to a device.
pub type Bdev = Arc<dyn BlockDevice>;

/// Total bytes described by an iovec array.
///
/// # Safety
/// `iov` must point to `iovcnt` readable iovecs.
pub unsafe fn iov_total_len(iov: *const libc::iovec, iovcnt: u32) -> u64 {
    let mut total = 0u64;
    for i in 0..iovcnt as usize {
        // SAFETY: the caller guarantees `iovcnt` readable elements.
        total += unsafe { (*iov.add(i)).iov_len } as u64;
    }
    total
}

/// The iovecs of a `Read` or `Write` request as a slice (empty when `iovcnt` is 0, whatever
/// `iov` holds, so a null pointer is fine then).
///
/// # Safety
/// As for [`IoChannel::submit`]: when `req.iovcnt` is non-zero, `req.iov` points to that many
/// readable iovecs that stay valid and unmodified for `'a`.
pub unsafe fn request_iovecs<'a>(req: &IoRequest) -> &'a [libc::iovec] {
    if req.iovcnt == 0 || req.iov.is_null() {
        return &[];
    }
    // SAFETY: non-null and, by the caller's contract, `iovcnt` initialised iovecs valid for 'a;
    // iovec's alignment is guaranteed by the pointer's type.
    unsafe { std::slice::from_raw_parts(req.iov, req.iovcnt as usize) }
}

/// Completions of requests a backend carried out inside `submit`, held for the next `poll`
/// (callers never get a completion from `submit` itself). Grows only to the peak queue depth,
/// then is reused.
pub(crate) struct DoneList(Vec<(u32, IoStatus)>);

impl DoneList {
    pub(crate) fn new() -> Self {
        DoneList(Vec::with_capacity(1024))
    }

    pub(crate) fn push(&mut self, tag: u32, status: IoStatus) {
        self.0.push((tag, status));
    }

    /// Hands every held completion to `done`; returns how many.
    pub(crate) fn deliver(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let n = self.0.len();
        for (tag, status) in self.0.drain(..) {
            done(tag, status);
        }
        n
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// Checks the parameters every device constructor shares.
pub fn validate_geometry(name: &str, block_size: u32, num_blocks: u64) -> Result<(), BdevError> {
    if name.is_empty() || name.len() > 255 || name.contains(|c: char| c.is_control() || c == '/') {
        return Err(BdevError::InvalidParam {
            field: "name",
            reason: "must be 1-255 characters, no '/' or control characters".into(),
        });
    }
    if !(512..=65536).contains(&block_size) || !block_size.is_power_of_two() {
        return Err(BdevError::InvalidParam {
            field: "block_size",
            reason: format!("{block_size} is not a power of two between 512 and 65536"),
        });
    }
    if num_blocks == 0 || num_blocks.checked_mul(u64::from(block_size)).is_none() {
        return Err(BdevError::InvalidParam {
            field: "num_blocks",
            reason: format!("{num_blocks} must be non-zero and the size must fit 64 bits"),
        });
    }
    Ok(())
}
