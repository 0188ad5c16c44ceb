//! virtio-blk request parsing, semantic validation and config space.
//!
//! This crate is pure code: it never performs I/O. It turns a split-virtqueue
//! descriptor chain (virtio 1.2 §2.7) into a [`BlkRequest`] whose data buffers
//! are host `iovec`s into guest memory, checks the request against the disk
//! geometry ([`validate`]) and builds the device configuration space
//! ([`config`]). Everything here is meant to be driven by hostile input (a
//! guest) and is therefore bounded and panic-free on any chain.
//!
//! # Request format (§5.2.6)
//!
//! ```text
//! struct virtio_blk_req {
//!     le32 type;        // VIRTIO_BLK_T_*
//!     le32 reserved;
//!     le64 sector;      // in 512-byte units, whatever the block size
//!     u8   data[];      // device-readable (OUT, DISCARD, WRITE_ZEROES) or
//!                       // device-writable (IN, GET_ID)
//!     u8   status;      // device-writable, VIRTIO_BLK_S_*
//! };
//! ```
//!
//! # Parsing rules implemented by [`parse_chain`]
//!
//! 1. **Chain walk** is the ring's job ([`fp_virtq`]): either ring format's walker follows
//!    the chain with virtio's bounds (loops, `next` in range, indirect tables not nested and
//!    inside one memory region, at most 2^32 bytes, at most [`MAX_CHAIN_DESCRIPTORS`]
//!    descriptors) and hands over a [`Chain`] of the non-empty descriptors with their host
//!    addresses resolved; a walk failure becomes [`ParseErrorKind::BrokenChain`] or
//!    [`ParseErrorKind::ChainTooLong`] through [`ParseError::from_walk`].
//! 2. **Zero-length descriptors** carry no bytes and may be readable or writable anywhere in
//!    the chain: the walker does not keep them.
//! 3. **Status byte.** The status is the last byte of the last descriptor
//!    (§5.2.6). That descriptor must be device-writable: if the chain has no
//!    writable byte at all we fail with [`ParseErrorKind::NoStatus`], if it has
//!    writable descriptors but ends with a readable one with
//!    [`ParseErrorKind::StatusNotWritable`]. The status byte must be inside guest
//!    memory. In these cases [`ParseError::status`] is `None` and the caller
//!    must not complete the request (it should fail the queue / set
//!    `DEVICE_NEEDS_RESET`); in every later error case the status is known and
//!    the caller completes the request with [`ParseError::status_code`].
//! 4. **Ordering.** All device-readable descriptors must precede all
//!    device-writable ones (§2.7.4.2): [`ParseErrorKind::ReadableAfterWritable`].
//! 5. **Memory.** Every non-empty descriptor `[addr, addr + len)` must lie in
//!    guest memory ([`ParseErrorKind::DescriptorOutOfMemory`]). A buffer may
//!    span several adjacent memory regions; it is then split into one iovec per
//!    region piece.
//! 6. **No framing assumptions** (§5.2.6.2 / §2.7.4: "the device MUST NOT make
//!    assumptions about the particular arrangement of descriptors"). The
//!    readable bytes and the writable bytes are each treated as one byte stream:
//!    * the header is the first 16 readable bytes ([`ParseErrorKind::HeaderTooShort`]);
//!    * `OUT`: data = the readable bytes after the header; the writable stream
//!      must be exactly the status byte;
//!    * `IN` / `GET_ID`: data = the writable bytes minus the last one (the
//!      status); the readable stream must be exactly the header;
//!    * `FLUSH`: header + status only;
//!    * `DISCARD` / `WRITE_ZEROES`: the readable bytes after the header are the
//!      payload, which must be exactly one 16-byte
//!      `struct virtio_blk_discard_write_zeroes` (we advertise
//!      `max_discard_seg = max_write_zeroes_seg = 1`,
//!      [`ParseErrorKind::BadDiscardPayload`]); reserved flag bits, or the
//!      `unmap` flag on a discard, give [`ParseErrorKind::UnsupportedFlags`]
//!      (completed with `VIRTIO_BLK_S_UNSUPP` as §5.2.6.2 requires);
//!    * any other type parses as [`RequestType::Unsupported`] without looking at
//!      its payload; [`validate`] answers `VIRTIO_BLK_S_UNSUPP`.
//!
//!    Unexpected extra bytes give [`ParseErrorKind::UnexpectedReadable`] /
//!    [`ParseErrorKind::UnexpectedWritable`].
//! 7. **Capacity.** More data iovecs than `iov.len()` (after splitting at
//!    region boundaries) gives [`ParseErrorKind::TooManySegments`].
//!
//! The pointers placed in the iovecs and in [`StatusPtr`] are host virtual
//! addresses inside the guest memory mappings: they stay valid only while the
//! [`MemTable`] the chain was walked with is alive. No dirty-page logging is
//! done here.

pub mod config;

pub use fp_virtq::{Chain, Desc, GuestMemory, MemTable, WalkError, MAX_CHAIN_DESCRIPTORS};

/// Sector unit of the virtio-blk protocol (§5.2.6: `sector` is always in 512-byte units).
pub const SECTOR_SIZE: u64 = 512;
/// Length of the GET_ID string (§5.2.6, `VIRTIO_BLK_ID_BYTES`).
pub const VIRTIO_BLK_ID_BYTES: usize = 20;
/// Data segments advertised in the config `seg_max` field (§5.2.4).
pub const SEG_MAX: u32 = 126;
/// Capacity callers should give [`parse_chain`]: data iovecs after splitting at
/// memory-region boundaries.
pub const MAX_IOVECS: usize = 256;

/// Size of the request header `struct virtio_blk_req` up to `data` (§5.2.6).
pub const REQ_HEADER_SIZE: u64 = 16;
/// Size of `struct virtio_blk_discard_write_zeroes` (§5.2.6).
pub const DISCARD_SEGMENT_SIZE: u64 = 16;

/// Request types (§5.2.6).
pub const VIRTIO_BLK_T_IN: u32 = 0;
/// Write.
pub const VIRTIO_BLK_T_OUT: u32 = 1;
/// Flush the volatile write cache.
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
/// Get the device ID string.
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;
/// Discard (deallocate) ranges.
pub const VIRTIO_BLK_T_DISCARD: u32 = 11;
/// Write zeroes to ranges.
pub const VIRTIO_BLK_T_WRITE_ZEROES: u32 = 13;

/// `flags` bit 0 of `struct virtio_blk_discard_write_zeroes` (§5.2.6).
pub const VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP: u32 = 1;

/// Status: success (§5.2.6).
pub const VIRTIO_BLK_S_OK: u8 = 0;
/// Status: device or driver error.
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
/// Status: request unsupported by the device.
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

/// Kind of a block request (the header `type` field, §5.2.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestType {
    /// `VIRTIO_BLK_T_IN`: read from the disk into the writable buffers.
    In,
    /// `VIRTIO_BLK_T_OUT`: write the readable buffers to the disk.
    Out,
    /// `VIRTIO_BLK_T_FLUSH`.
    Flush,
    /// `VIRTIO_BLK_T_GET_ID`: write the ID string into the writable buffers.
    GetId,
    /// `VIRTIO_BLK_T_DISCARD`.
    Discard,
    /// `VIRTIO_BLK_T_WRITE_ZEROES`.
    WriteZeroes,
    /// Any other type (raw value); completed with `VIRTIO_BLK_S_UNSUPP`.
    Unsupported(u32),
}

impl RequestType {
    /// Decode the header `type` field.
    pub fn from_raw(t: u32) -> Self {
        match t {
            VIRTIO_BLK_T_IN => RequestType::In,
            VIRTIO_BLK_T_OUT => RequestType::Out,
            VIRTIO_BLK_T_FLUSH => RequestType::Flush,
            VIRTIO_BLK_T_GET_ID => RequestType::GetId,
            VIRTIO_BLK_T_DISCARD => RequestType::Discard,
            VIRTIO_BLK_T_WRITE_ZEROES => RequestType::WriteZeroes,
            other => RequestType::Unsupported(other),
        }
    }
}

/// Discard / write-zeroes payload (§5.2.6, `struct virtio_blk_discard_write_zeroes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First sector (512-byte units).
    pub sector: u64,
    /// Number of 512-byte sectors.
    pub num_sectors: u32,
    /// `VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP` (only ever true for write zeroes:
    /// the parser rejects it on a discard).
    pub unmap: bool,
}

/// Host pointer to the guest's status byte.
#[derive(Clone, Copy, Debug)]
pub struct StatusPtr(*mut u8);

// SAFETY: a `StatusPtr` is only an address; moving it to another thread cannot
// cause a data race by itself. The only dereference, `StatusPtr::write`, is
// `unsafe` and its caller guarantees the mapping is alive; the byte belongs to
// exactly one in-flight request, which is completed by exactly one thread.
unsafe impl Send for StatusPtr {}

impl StatusPtr {
    /// Wrap a raw host pointer (for callers that build requests themselves, e.g. tests).
    pub fn from_raw(ptr: *mut u8) -> Self {
        StatusPtr(ptr)
    }

    /// The host address of the status byte.
    pub fn as_ptr(self) -> *mut u8 {
        self.0
    }

    /// Store the status byte (volatile: the guest may observe it).
    ///
    /// # Safety
    /// The guest memory mapping the pointer was taken from must still be alive.
    pub unsafe fn write(self, status: u8) {
        // SAFETY: the parser only builds a `StatusPtr` from a 1-byte slice of a
        // device-writable guest memory region; the caller guarantees that the
        // mapping is still alive. A volatile store of a `u8` has no alignment
        // requirement.
        unsafe { std::ptr::write_volatile(self.0, status) }
    }
}

/// A parsed virtio-blk request.
#[derive(Debug)]
pub struct BlkRequest {
    /// Head descriptor index, to be returned in the used ring.
    pub head: u16,
    /// Request type.
    pub kind: RequestType,
    /// Header `sector` field (512-byte units).
    pub sector: u64,
    /// Number of iovecs filled in the caller's array: the data for `In`/`Out`,
    /// the ID buffer for `GetId`, 0 otherwise.
    pub iovcnt: u32,
    /// Total bytes of those iovecs.
    pub data_len: u64,
    /// `Some` for `Discard` / `WriteZeroes`.
    pub segment: Option<Segment>,
    /// The status byte.
    pub status: StatusPtr,
    /// Value for the used-ring `len` field when the request is completed: the
    /// number of bytes the device writes *including the status byte*:
    /// * `In`: `data_len + 1` (the whole writable area);
    /// * `GetId`: `min(data_len, 20) + 1` ([`write_id`] writes at most 20 bytes);
    /// * everything else (including `Unsupported`): `1`.
    ///
    /// Use the same value whatever the final status (drivers do not interpret
    /// `len` for virtio-blk; an `In` that failed half-way may have written data).
    pub writable_len: u32,
}

/// Why a chain could not be parsed.
#[derive(Debug)]
pub struct ParseError {
    /// Head descriptor index.
    pub head: u16,
    /// What is wrong.
    pub kind: ParseErrorKind,
    /// `Some` when the status byte was located: the caller completes the
    /// request with [`ParseError::status_code`] (used len 1). `None`: the
    /// chain is too broken to complete; the caller must fail the queue.
    pub status: Option<StatusPtr>,
}

impl ParseError {
    /// A chain the ring's walker could not follow (no status byte: the queue must fail).
    pub fn from_walk(head: u16, e: WalkError) -> ParseError {
        let kind = match e {
            WalkError::Broken => ParseErrorKind::BrokenChain,
            WalkError::TooLong => ParseErrorKind::ChainTooLong,
        };
        ParseError { head, kind, status: None }
    }

    /// Status byte to complete the request with (when `status` is `Some`).
    pub fn status_code(&self) -> u8 {
        self.kind.status_code()
    }
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "virtio-blk chain at head {}: {}", self.head, self.kind)
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.kind)
    }
}

/// Parse failure reasons.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// The ring's walker could not follow the chain ([`WalkError::Broken`]): loop,
    /// chain longer than the queue, `next` or head out of range, bad indirect
    /// table, or more than 2^32 bytes.
    #[error("broken descriptor chain (loop, too long, bad next/indirect table or > 4 GiB)")]
    BrokenChain,
    /// More than [`MAX_CHAIN_DESCRIPTORS`] descriptors.
    #[error("descriptor chain longer than {MAX_CHAIN_DESCRIPTORS} descriptors")]
    ChainTooLong,
    /// No device-writable byte in the chain.
    #[error("no device-writable status byte")]
    NoStatus,
    /// The chain's last byte (the status) is in a device-readable descriptor.
    #[error("status byte in a device-readable descriptor")]
    StatusNotWritable,
    /// A descriptor's buffer is not entirely inside guest memory.
    #[error("descriptor buffer outside guest memory")]
    DescriptorOutOfMemory,
    /// A device-readable descriptor follows a device-writable one (§2.7.4.2).
    #[error("device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
    /// Fewer than 16 device-readable bytes.
    #[error("request header shorter than 16 bytes")]
    HeaderTooShort,
    /// Device-readable bytes after the header for a request that takes none.
    #[error("unexpected device-readable bytes after the header")]
    UnexpectedReadable,
    /// Device-writable bytes besides the status for a request that takes none.
    #[error("unexpected device-writable bytes before the status")]
    UnexpectedWritable,
    /// More data iovecs than the caller's array holds.
    #[error("too many data segments")]
    TooManySegments,
    /// Discard / write-zeroes payload is not exactly one 16-byte segment.
    #[error("discard/write-zeroes payload is not exactly one segment")]
    BadDiscardPayload,
    /// Reserved flag bits set, or `unmap` on a discard (§5.2.6.2: UNSUPP).
    #[error("unsupported discard/write-zeroes flags")]
    UnsupportedFlags,
}

impl ParseErrorKind {
    /// Status byte to complete a request failing with this error:
    /// `VIRTIO_BLK_S_UNSUPP` for [`ParseErrorKind::UnsupportedFlags`] (§5.2.6.2),
    /// `VIRTIO_BLK_S_IOERR` otherwise.
    pub fn status_code(self) -> u8 {
        match self {
            ParseErrorKind::UnsupportedFlags => VIRTIO_BLK_S_UNSUPP,
            _ => VIRTIO_BLK_S_IOERR,
        }
    }
}

/// Parse one walked chain into a [`BlkRequest`], filling `iov` with the data buffers. `head`
/// is what the used ring reports for the request (the split ring's head index, the packed
/// ring's buffer id). See the crate documentation for the exact rules.
///
/// `iov` should hold [`MAX_IOVECS`] entries; its contents on error are unspecified.
#[inline]
pub fn parse_chain(
    mem: &MemTable,
    chain: &Chain,
    head: u16,
    iov: &mut [libc::iovec],
) -> Result<BlkRequest, ParseError> {
    let err = |kind, status| ParseError { head, kind, status };
    let descs = chain.descs();

    // ---- 1. Locate the status byte: last byte of the last descriptor. ----
    let n_readable = descs.iter().position(|d| d.write).ok_or(err(ParseErrorKind::NoStatus, None))?;
    // A writable descriptor exists, so the chain is not empty.
    let last = descs[descs.len() - 1];
    if !last.write {
        return Err(err(ParseErrorKind::StatusNotWritable, None));
    }
    let status_ptr = if last.host.is_null() {
        last.addr
            .checked_add(u64::from(last.len) - 1)
            .and_then(|a| mem.translate(a, 1))
            .ok_or(err(ParseErrorKind::DescriptorOutOfMemory, None))?
    } else {
        // SAFETY: `host` covers the descriptor's `len >= 1` bytes inside one mapping.
        unsafe { last.host.add(last.len as usize - 1) }
    };
    let status_ptr = StatusPtr(status_ptr);
    let status = Some(status_ptr);

    // ---- 2. Ordering and memory bounds of every descriptor. ----
    let (readable, writable) = descs.split_at(n_readable);
    if writable.iter().any(|d| !d.write) {
        return Err(err(ParseErrorKind::ReadableAfterWritable, status));
    }
    let mut r_len = 0u64;
    for d in readable {
        if d.host.is_null() && !mem.contains(d.addr, u64::from(d.len)) {
            return Err(err(ParseErrorKind::DescriptorOutOfMemory, status));
        }
        r_len += u64::from(d.len);
    }
    let mut w_len = 0u64;
    for d in writable {
        if d.host.is_null() && !mem.contains(d.addr, u64::from(d.len)) {
            return Err(err(ParseErrorKind::DescriptorOutOfMemory, status));
        }
        w_len += u64::from(d.len);
    }

    // ---- 3. Header: the first 16 readable bytes. ----
    if r_len < REQ_HEADER_SIZE {
        return Err(err(ParseErrorKind::HeaderTooShort, status));
    }
    let hdr: [u8; REQ_HEADER_SIZE as usize] = read_stream(mem, readable, 0);
    let raw_type = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    let sector = u64::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11], hdr[12], hdr[13], hdr[14], hdr[15]]);
    let kind = RequestType::from_raw(raw_type);

    let mut req = BlkRequest {
        head,
        kind,
        sector,
        iovcnt: 0,
        data_len: 0,
        segment: None,
        status: status_ptr,
        writable_len: 1,
    };

    // ---- 4. Per-type framing. ----
    match kind {
        RequestType::In | RequestType::GetId => {
            if r_len != REQ_HEADER_SIZE {
                return Err(err(ParseErrorKind::UnexpectedReadable, status));
            }
            let data_len = w_len - 1;
            req.iovcnt = emit_iovecs(mem, writable, 0, data_len, iov).map_err(|k| err(k, status))?;
            req.data_len = data_len;
            let written =
                if kind == RequestType::In { data_len } else { data_len.min(VIRTIO_BLK_ID_BYTES as u64) };
            req.writable_len = u32::try_from(written + 1).unwrap_or(u32::MAX);
        }
        RequestType::Out => {
            if w_len != 1 {
                return Err(err(ParseErrorKind::UnexpectedWritable, status));
            }
            let data_len = r_len - REQ_HEADER_SIZE;
            req.iovcnt =
                emit_iovecs(mem, readable, REQ_HEADER_SIZE, data_len, iov).map_err(|k| err(k, status))?;
            req.data_len = data_len;
        }
        RequestType::Flush => {
            if r_len != REQ_HEADER_SIZE {
                return Err(err(ParseErrorKind::UnexpectedReadable, status));
            }
            if w_len != 1 {
                return Err(err(ParseErrorKind::UnexpectedWritable, status));
            }
        }
        RequestType::Discard | RequestType::WriteZeroes => {
            if w_len != 1 {
                return Err(err(ParseErrorKind::UnexpectedWritable, status));
            }
            if r_len - REQ_HEADER_SIZE != DISCARD_SEGMENT_SIZE {
                return Err(err(ParseErrorKind::BadDiscardPayload, status));
            }
            let raw: [u8; DISCARD_SEGMENT_SIZE as usize] = read_stream(mem, readable, REQ_HEADER_SIZE);
            let seg = decode_segment(&raw);
            let flags = u32::from_le_bytes([raw[12], raw[13], raw[14], raw[15]]);
            // §5.2.6.2: unknown flags -> UNSUPP; unmap on a discard -> UNSUPP.
            if flags & !VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0 || (kind == RequestType::Discard && seg.unmap)
            {
                return Err(err(ParseErrorKind::UnsupportedFlags, status));
            }
            req.segment = Some(seg);
        }
        RequestType::Unsupported(_) => {}
    }
    Ok(req)
}

fn decode_segment(raw: &[u8; DISCARD_SEGMENT_SIZE as usize]) -> Segment {
    let mut s = [0u8; 8];
    s.copy_from_slice(&raw[0..8]);
    let num_sectors = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
    let flags = u32::from_le_bytes([raw[12], raw[13], raw[14], raw[15]]);
    Segment {
        sector: u64::from_le_bytes(s),
        num_sectors,
        unmap: flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0,
    }
}

/// Copies `N` bytes starting at byte `offset` of the stream formed by `descs`, which the caller
/// checked to be guest memory and to hold at least `offset + N` bytes.
#[inline(always)]
fn read_stream<const N: usize>(mem: &MemTable, descs: &[Desc], offset: u64) -> [u8; N] {
    // Common case: the bytes lie in the first descriptor, host-contiguous.
    if let Some(d) = descs.first() {
        if !d.host.is_null() && offset + N as u64 <= u64::from(d.len) && N % 8 == 0 {
            let mut out = [0u8; N];
            for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
                // SAFETY: `offset + N <= len` bytes from `host` are inside one mapping.
                let w = unsafe { fp_virtq::access::load_u64_le(d.host.add(offset as usize + 8 * i)) };
                chunk.copy_from_slice(&w.to_le_bytes());
            }
            return out;
        }
    }
    read_stream_slow(mem, descs, offset)
}

/// [`read_stream`] across descriptors and memory regions.
#[cold]
fn read_stream_slow<const N: usize>(mem: &MemTable, descs: &[Desc], offset: u64) -> [u8; N] {
    let mut out = [0u8; N];
    let mut done = 0usize;
    let mut skip = offset;
    for d in descs {
        if done == N {
            break;
        }
        let len = u64::from(d.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let take = ((len - skip) as usize).min(N - done);
        let mut copy = |p: *mut u8, n: u64| {
            for i in 0..n as usize {
                // SAFETY: `p` covers `n` mapped bytes (a translated piece). Volatile: as above.
                out[done + i] = unsafe { std::ptr::read_volatile(p.add(i)) };
            }
            done += n as usize;
            true
        };
        if d.host.is_null() {
            // Checked to be guest memory: every piece is mapped.
            mem.for_each_piece(d.addr + skip, take as u64, copy);
        } else {
            // SAFETY: `skip + take <= len` bytes from `host` are inside one mapping.
            copy(unsafe { d.host.add(skip as usize) }, take as u64);
        }
        skip = 0;
    }
    out
}

/// Fills `iov` with the host buffers covering bytes `[offset, offset + len)` of the stream
/// formed by `descs` (checked to be guest memory), splitting at memory-region boundaries.
/// Returns the number of iovecs used.
#[inline]
fn emit_iovecs(
    mem: &MemTable,
    descs: &[Desc],
    mut offset: u64,
    len: u64,
    iov: &mut [libc::iovec],
) -> Result<u32, ParseErrorKind> {
    let mut cnt = 0usize;
    let mut remaining = len;
    for d in descs {
        if remaining == 0 {
            break;
        }
        let dlen = u64::from(d.len);
        if offset >= dlen {
            offset -= dlen;
            continue;
        }
        let take = (dlen - offset).min(remaining);
        if d.host.is_null() {
            let mut full = false;
            let covered = mem.for_each_piece(d.addr + offset, take, |p, n| match iov.get_mut(cnt) {
                Some(slot) => {
                    *slot = libc::iovec { iov_base: p.cast(), iov_len: n as usize };
                    cnt += 1;
                    true
                }
                None => {
                    full = true;
                    false
                }
            });
            if full {
                return Err(ParseErrorKind::TooManySegments);
            }
            if !covered {
                return Err(ParseErrorKind::DescriptorOutOfMemory);
            }
        } else {
            let slot = iov.get_mut(cnt).ok_or(ParseErrorKind::TooManySegments)?;
            // SAFETY: `offset < dlen`: inside the descriptor's mapped bytes.
            let base = unsafe { d.host.add(offset as usize) };
            *slot = libc::iovec { iov_base: base.cast(), iov_len: take as usize };
            cnt += 1;
        }
        remaining -= take;
        offset = 0;
    }
    // `cnt <= iov.len()`; a caller array larger than u32::MAX entries is absurd.
    Ok(u32::try_from(cnt).unwrap_or(u32::MAX))
}

/// Disk properties the request is validated against and the config space is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskParams {
    /// Capacity in 512-byte sectors.
    pub capacity_sectors: u64,
    /// Logical block size in bytes (a power of two >= 512; other values are treated as 512).
    pub block_size: u32,
    /// Offer `VIRTIO_BLK_F_RO` and refuse writes.
    pub read_only: bool,
    /// Offer `VIRTIO_BLK_F_FLUSH` (volatile write cache).
    pub flush: bool,
    /// Offer `VIRTIO_BLK_F_DISCARD`.
    pub discard: bool,
    /// Offer `VIRTIO_BLK_F_WRITE_ZEROES`.
    pub write_zeroes: bool,
    /// Max sectors per discard (0 = unlimited, advertised as `u32::MAX`).
    pub max_discard_sectors: u32,
    /// Max sectors per write zeroes (0 = unlimited, advertised as `u32::MAX`).
    pub max_write_zeroes_sectors: u32,
}

impl DiskParams {
    /// Logical block size actually used: `block_size` if it is a power of two
    /// of at least 512 bytes, else 512.
    pub fn effective_block_size(&self) -> u32 {
        if self.block_size >= SECTOR_SIZE as u32 && self.block_size.is_power_of_two() {
            self.block_size
        } else {
            SECTOR_SIZE as u32
        }
    }
}

/// Check that `[sector, sector + num_sectors)` (512-byte units) is inside the
/// disk and aligned to its block size; overflow-safe.
fn check_range(sector: u64, num_sectors: u64, disk: &DiskParams) -> Result<(), u8> {
    // The block size is a power of two of at least 512 bytes: masks instead of divisions.
    let block_mask = u64::from(disk.effective_block_size()) / SECTOR_SIZE - 1;
    if num_sectors == 0 || (sector | num_sectors) & block_mask != 0 {
        return Err(VIRTIO_BLK_S_IOERR);
    }
    match sector.checked_add(num_sectors) {
        Some(end) if end <= disk.capacity_sectors => Ok(()),
        _ => Err(VIRTIO_BLK_S_IOERR),
    }
}

/// Semantic checks after parsing (§5.2.6.2 device requirements): `Ok` or the
/// status byte to complete the request with.
///
/// * `In`/`Out`: `data_len` a non-zero multiple of 512 and of the block size,
///   `sector` aligned to the block size, `[sector, sector + data_len/512)`
///   inside the capacity → else `IOERR`; `Out` on a read-only disk → `IOERR`.
/// * `Flush`/`Discard`/`WriteZeroes` when the feature is disabled → `UNSUPP`.
/// * `Discard`/`WriteZeroes`: read-only → `IOERR`; `num_sectors` zero, above
///   the advertised maximum, misaligned or out of range → `IOERR`.
/// * `GetId` → always `Ok` (a buffer shorter than 20 bytes gets what fits).
/// * `Unsupported(_)` → `UNSUPP`.
#[inline]
pub fn validate(req: &BlkRequest, disk: &DiskParams) -> Result<(), u8> {
    match req.kind {
        RequestType::In | RequestType::Out => {
            if req.kind == RequestType::Out && disk.read_only {
                return Err(VIRTIO_BLK_S_IOERR);
            }
            let bs = u64::from(disk.effective_block_size());
            if req.data_len == 0 || req.data_len & (bs - 1) != 0 {
                return Err(VIRTIO_BLK_S_IOERR);
            }
            check_range(req.sector, req.data_len / SECTOR_SIZE, disk)
        }
        RequestType::Flush => {
            if disk.flush {
                Ok(())
            } else {
                Err(VIRTIO_BLK_S_UNSUPP)
            }
        }
        RequestType::GetId => Ok(()),
        RequestType::Discard | RequestType::WriteZeroes => {
            let (enabled, max) = if req.kind == RequestType::Discard {
                (disk.discard, disk.max_discard_sectors)
            } else {
                (disk.write_zeroes, disk.max_write_zeroes_sectors)
            };
            if !enabled {
                return Err(VIRTIO_BLK_S_UNSUPP);
            }
            if disk.read_only {
                return Err(VIRTIO_BLK_S_IOERR);
            }
            let seg = req.segment.ok_or(VIRTIO_BLK_S_IOERR)?;
            if max != 0 && seg.num_sectors > max {
                return Err(VIRTIO_BLK_S_IOERR);
            }
            check_range(seg.sector, u64::from(seg.num_sectors), disk)
        }
        RequestType::Unsupported(_) => Err(VIRTIO_BLK_S_UNSUPP),
    }
}

/// Copy the ID string into the request's iovecs (GetId): at most
/// [`VIRTIO_BLK_ID_BYTES`] bytes, fewer if the buffer is shorter (§5.2.6: the
/// ID is not NUL-terminated when it is 20 bytes long). Returns the number of
/// bytes written.
///
/// # Safety
/// Every iovec must point to live memory writable for `iov_len` bytes.
pub unsafe fn write_id(iov: &[libc::iovec], id: &[u8; VIRTIO_BLK_ID_BYTES]) -> u32 {
    let mut done = 0usize;
    for v in iov {
        if done == id.len() {
            break;
        }
        let take = v.iov_len.min(id.len() - done);
        let dst = v.iov_base.cast::<u8>();
        for (i, b) in id[done..done + take].iter().enumerate() {
            // SAFETY: `i < take <= iov_len`, and the caller guarantees the
            // iovec is live writable memory. Guest memory is shared with the
            // guest, hence a volatile store.
            unsafe { std::ptr::write_volatile(dst.add(i), *b) };
        }
        done += take;
    }
    // `done <= 20`.
    done as u32
}
