//! One request's descriptors, as either ring format's walker collects them.

use crate::access::load_u64_le;
use crate::mem::{GuestByte, MemTable};

/// Hard bound on the descriptors (zero-length ones included) one chain may contain, whatever
/// the queue size and indirect table sizes: the work per chain is bounded. A conforming
/// virtio-blk driver uses at most `seg_max + 2`.
pub const MAX_CHAIN_DESCRIPTORS: usize = 512;

/// One non-empty descriptor of a chain.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    /// Guest-physical address.
    pub addr: u64,
    /// Length in bytes (never 0: empty descriptors are not stored).
    pub len: u32,
    /// Device-writable (`VIRTQ_DESC_F_WRITE`).
    pub write: bool,
    /// Host address of the whole buffer when it lies inside one memory region, else null (the
    /// buffer spans regions or is not guest memory at all: the consumer decides). Set only by
    /// the walkers, from the memory table's translation: see [`Desc::host`].
    pub(crate) host: *mut u8,
}

impl Desc {
    /// Host address of the whole buffer when it lies inside one memory region, else null. Like
    /// every guest address this crate hands out, it stays valid while the [`MemTable`] the chain
    /// was walked with lives: the chain's owner keeps that table.
    #[inline(always)]
    pub fn host(&self) -> *mut u8 {
        self.host
    }

    /// Loads `N` little-endian u64 from bytes `offset..offset + 8 * N` of the buffer (any
    /// alignment, each one machine access, see [`crate::access`]): `None` when the buffer is
    /// not in one region or holds fewer bytes.
    #[inline(always)]
    pub fn load_u64s<const N: usize>(&self, offset: usize) -> Option<[u64; N]> {
        if self.host.is_null() || offset.checked_add(8 * N)? > self.len as usize {
            return None;
        }
        let p = self.host.wrapping_add(offset);
        // SAFETY: inside the buffer, which the table translated to one mapping; the chain's
        // owner keeps that table (and so the mapping) alive while it uses the chain.
        Some(std::array::from_fn(|i| unsafe { load_u64_le(p.wrapping_add(8 * i)) }))
    }

    /// Byte `i` of the buffer, to store into (a request's status): `None` when the buffer is
    /// not in one region or `i` is past its end.
    #[inline(always)]
    pub fn byte(&self, i: u32) -> Option<GuestByte> {
        (!self.host.is_null() && i < self.len)
            .then(|| GuestByte::from_host(self.host.wrapping_add(i as usize)))
    }
}

/// Why a chain could not be walked. Neither case locates a status byte: the request cannot be
/// completed, and the queue must fail (virtio 1.2 §2.7.5.2 / §2.8: the device may treat this
/// as a fatal driver error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    /// A loop, a chain longer than its table, `next` or a head out of range, an indirect table
    /// that is empty, misaligned in length, nested, not inside one memory region or in a
    /// list where it may not be, or more than 2^32 bytes in all.
    #[error("broken descriptor chain (loop, too long, bad next/indirect table or > 4 GiB)")]
    Broken,
    /// More than [`MAX_CHAIN_DESCRIPTORS`] descriptors.
    #[error("descriptor chain longer than {MAX_CHAIN_DESCRIPTORS} descriptors")]
    TooLong,
}

/// A reusable buffer for one chain: allocated once per queue, refilled per request.
pub struct Chain {
    descs: Box<[Desc; MAX_CHAIN_DESCRIPTORS]>,
    len: usize,
    /// Descriptors walked, empty ones included.
    seen: usize,
    /// Bytes of all descriptors walked.
    total: u32,
}

impl Default for Chain {
    fn default() -> Self {
        Self::new()
    }
}

impl Chain {
    /// An empty chain with room for [`MAX_CHAIN_DESCRIPTORS`] descriptors, allocated once per
    /// queue and refilled for every request.
    pub fn new() -> Chain {
        let empty = Desc { addr: 0, len: 0, write: false, host: std::ptr::null_mut() };
        Chain { descs: Box::new([empty; MAX_CHAIN_DESCRIPTORS]), len: 0, seen: 0, total: 0 }
    }

    /// The non-empty descriptors, in chain order.
    #[inline]
    pub fn descs(&self) -> &[Desc] {
        &self.descs[..self.len]
    }

    #[inline]
    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.seen = 0;
        self.total = 0;
    }

    /// Adds one walked descriptor: enforces the 2^32-byte and [`MAX_CHAIN_DESCRIPTORS`] limits,
    /// drops empty descriptors and resolves the host address.
    #[inline(always)]
    pub(crate) fn add(&mut self, mem: &MemTable, addr: u64, len: u32, write: bool) -> Result<(), WalkError> {
        // §2.7.5.2 / §2.8: a chain is at most 2^32 bytes.
        self.total = self.total.checked_add(len).ok_or(WalkError::Broken)?;
        self.seen += 1;
        if self.seen > MAX_CHAIN_DESCRIPTORS {
            return Err(WalkError::TooLong);
        }
        if len != 0 {
            let host = mem.host_or_null(addr, u64::from(len));
            // `len < seen <= MAX_CHAIN_DESCRIPTORS`: always a slot.
            let slot = self.descs.get_mut(self.len).ok_or(WalkError::TooLong)?;
            *slot = Desc { addr, len, write, host };
            self.len += 1;
        }
        Ok(())
    }

    /// Stores a chain of exactly three non-empty descriptors as a walker's fast path read it
    /// ([`SplitQueue::read_three`](crate::SplitQueue::read_three), the packed walker's): the
    /// same contents the general walkers would leave after the three, without their
    /// per-descriptor bookkeeping. The fast paths checked what the general walkers check:
    /// `total` is the three lengths' sum without overflow and no length is 0.
    #[inline(always)]
    pub fn set_three(&mut self, descs: [Desc; 3], total: u32) {
        self.descs[..3].copy_from_slice(&descs);
        self.len = 3;
        self.seen = 3;
        self.total = total;
    }

    /// Builds a chain from `(addr, len, writable)` triples as if a ring had held them (tests and
    /// tools that make requests without a ring).
    pub fn from_buffers(mem: &MemTable, bufs: &[(u64, u32, bool)]) -> Result<Chain, WalkError> {
        let mut c = Chain::new();
        for &(addr, len, write) in bufs {
            c.add(mem, addr, len, write)?;
        }
        Ok(c)
    }
}

/// Reads the 16 bytes of descriptor `index` of a table at `table` as two little-endian u64
/// (`addr`, then `len | flags << 32 | next_or_id << 48` for both formats' layouts). Indirect
/// tables need no alignment (§2.7.5.3).
///
/// # Safety
/// `table + 16 * (index + 1)` must not pass the end of a live mapping.
#[inline(always)]
pub(crate) unsafe fn read_desc(table: *const u8, index: u32) -> (u64, u64) {
    // SAFETY: the caller guarantees the 16 bytes are mapped.
    unsafe {
        let p = table.add(16 * index as usize);
        (load_u64_le(p), load_u64_le(p.add(8)))
    }
}
