//! A device and its channels: [`BlockDevice`] (shared, made on the control plane), its
//! description ([`BdevInfo`], [`IoTypes`], the shared [`Capacity`]), and [`IoChannel`] (one per
//! core, where every request goes).

use std::any::Any;
use std::os::unix::io::RawFd;
use std::sync::Arc;

use crate::{BdevError, IoRequest, IoStatus, SubmitError};

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
///
/// A [`Capacity::derived`] one (a stacked device that starts at an offset on its base, or has
/// larger blocks) holds its own size too, which its base's [`Capacity::set`] recomputes: the
/// hot path stays one load for every device, and the derived size follows each resize of the
/// base without anyone else propagating it.
#[derive(Debug, Clone)]
pub struct Capacity(Arc<CapacityCell>);

#[derive(Debug)]
struct CapacityCell {
    /// The size in blocks: the only field the I/O path reads.
    blocks: std::sync::atomic::AtomicU64,
    /// Whether the size follows another capacity (then only that one's `set` changes it).
    derived: bool,
    /// The capacities derived from this one, recomputed when it is set (control plane only).
    dependents: std::sync::Mutex<Vec<Dependent>>,
}

/// A capacity derived from another: what lies after `offset` bytes of the base (blocks of
/// `base_block_size` bytes), in whole blocks of `block_size` bytes.
#[derive(Debug)]
struct Dependent {
    cell: std::sync::Weak<CapacityCell>,
    base_block_size: u64,
    offset: u64,
    block_size: u64,
}

impl Dependent {
    fn blocks_of(&self, base_blocks: u64) -> u64 {
        base_blocks.saturating_mul(self.base_block_size).saturating_sub(self.offset) / self.block_size
    }
}

impl CapacityCell {
    fn new(num_blocks: u64, derived: bool) -> CapacityCell {
        CapacityCell {
            blocks: std::sync::atomic::AtomicU64::new(num_blocks),
            derived,
            dependents: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Stores the size, then recomputes the capacities derived from this one (and theirs),
    /// forgetting those whose devices are gone.
    fn store(&self, num_blocks: u64) {
        self.blocks.store(num_blocks, std::sync::atomic::Ordering::Relaxed);
        let mut dependents = self.dependents.lock().unwrap_or_else(|p| p.into_inner());
        dependents.retain(|d| match d.cell.upgrade() {
            Some(cell) => {
                cell.store(d.blocks_of(num_blocks));
                true
            }
            None => false,
        });
    }
}

impl Capacity {
    /// A capacity of `num_blocks` blocks.
    pub fn new(num_blocks: u64) -> Capacity {
        Capacity(Arc::new(CapacityCell::new(num_blocks, false)))
    }

    /// The capacity of what lies after byte `offset` of a device of capacity `base` and
    /// `base_block_size`-byte blocks, in whole `block_size`-byte blocks (rounded down; 0 while
    /// the base is no larger than `offset`). It follows every resize of `base`.
    pub fn derived(base: &Capacity, base_block_size: u32, offset: u64, block_size: u32) -> Capacity {
        assert!(block_size > 0, "a derived capacity needs a block size");
        let mut dependents = base.0.dependents.lock().unwrap_or_else(|p| p.into_inner());
        let mut link = Dependent {
            cell: std::sync::Weak::new(),
            base_block_size: u64::from(base_block_size),
            offset,
            block_size: u64::from(block_size),
        };
        // Computed under the base's lock, so a resize of the base cannot slip in between.
        let cell = Arc::new(CapacityCell::new(link.blocks_of(base.blocks()), true));
        link.cell = Arc::downgrade(&cell);
        dependents.push(link);
        Capacity(cell)
    }

    /// The size now, in blocks.
    #[inline]
    pub fn blocks(&self) -> u64 {
        self.0.blocks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the size. Callers serialise resizes of one device (the registry does). A derived
    /// capacity follows its base and is never set: that is a bug, ignored (and caught in debug
    /// builds).
    pub fn set(&self, num_blocks: u64) {
        if self.0.derived {
            debug_assert!(false, "a derived capacity is set through its base");
            return;
        }
        self.0.store(num_blocks);
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
    #[inline]
    pub fn check_range(&self, offset: u64, len: u64) -> Result<(), SubmitError> {
        // Every constructor checks the block size with `validate_geometry` (a power of two):
        // one mask for both alignments, where two remainders cost two divisions per request.
        // A block size that is not a power of two (only a device built by hand) gets the
        // remainders.
        let bs = u64::from(self.block_size);
        let misaligned = if bs.is_power_of_two() {
            (offset | len) & (bs - 1) != 0
        } else {
            !offset.is_multiple_of(bs) || !len.is_multiple_of(bs)
        };
        if misaligned {
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

    /// The device as its own type, for a layer that recognises itself behind a [`Bdev`]: the
    /// disk layer answers, and `as_disk` on a [`Bdev`] finds the [`Disk`](crate::Disk) this way
    /// (the layer above names this trait, never the reverse). Others keep the default.
    fn as_any(&self) -> Option<&dyn Any> {
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
    /// Safe: the buffers were vouched for when the request's [`Iovecs`](crate::Iovecs) were
    /// built; the channel uses them until it returns the request's completion from `poll`.
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError>;

    /// Pushes queued requests to the device (at most one system call) and reaps completions,
    /// calling `done(tag, status)` for each. Returns how many completed.
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize;

    /// [`IoChannel::poll`] that appends each completion's `(tag, status)` to `out` instead of
    /// calling back for each: the caller then walks the batch with its own handling compiled
    /// in, where a callback through `dyn` costs an indirect call per completion. Returns how
    /// many it appended. The caller keeps `out` between polls (cleared, its capacity kept), so
    /// it allocates only when a poll returns more than any before. A channel whose
    /// completions already sit in a list overrides this to hand the list over.
    fn poll_batch(&mut self, out: &mut Vec<(u32, IoStatus)>) -> usize {
        self.poll(&mut |tag, status| out.push((tag, status)))
    }

    /// Requests submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;

    /// Requests counted in [`IoChannel::in_flight`] that the channel holds back, retrying them
    /// at each `poll`, because a device under it refused them as busy: nothing of them is on
    /// a device yet. A frontend going away waits for these only up to its bound (then
    /// [`IoChannel::abort_parked`]), and for the others as long as they take. The default, for
    /// a channel that hands every `Busy` back to its caller: none.
    fn parked(&self) -> usize {
        0
    }

    /// Gives up retrying what [`IoChannel::parked`] counts, in this channel and the ones under
    /// it: each such request completes at the next `poll` with `ECANCELED` and never reaches a
    /// device. A request split in pieces, some on a device, completes with that error once
    /// those pieces do. Returns how many requests (or pieces) it gave up.
    fn abort_parked(&mut self) -> usize {
        0
    }

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

#[cfg(test)]
mod capacity_tests {
    use super::Capacity;

    #[test]
    fn a_derived_capacity_follows_its_base_in_whole_blocks_after_the_offset() {
        let base = Capacity::new(100);
        // 512-byte base blocks, 4 KiB skipped, 4 KiB blocks: (51200 - 4096) / 4096 = 11.
        let derived = Capacity::derived(&base, 512, 4096, 4096);
        assert_eq!(derived.blocks(), 11);
        base.set(107);
        assert_eq!(derived.blocks(), 12, "rounded down after a grow");
        base.set(8);
        assert_eq!(derived.blocks(), 0, "a base no larger than the offset leaves nothing");
        // A copy shares the base, as a clone of an own capacity shares its size.
        let copy = derived.clone();
        base.set(24);
        assert_eq!(copy.blocks(), 2);
    }
}
