//! Descriptor-chain parsing: a walked [`Chain`] becomes a [`BlkRequest`] with its data as host
//! iovecs, following the rules in the crate documentation.

use fp_virtq::{Chain, Desc, MemTable, WalkError, MAX_CHAIN_DESCRIPTORS};

use crate::request::{BlkRequest, RequestType, Segment, StatusPtr};
use crate::{
    DISCARD_SEGMENT_SIZE, REQ_HEADER_SIZE, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};

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
/// `iov` should hold [`MAX_IOVECS`](crate::MAX_IOVECS) entries; its contents on error are unspecified.
///
/// A read or write in three descriptors (header, data, status, each inside one memory region)
/// takes a fast path that builds the request in one pass; everything else goes through
/// [`parse_chain_general`], with the same result for any chain (the `chain_parser` fuzz
/// target compares them).
#[inline]
pub fn parse_chain(
    mem: &MemTable,
    chain: &Chain,
    head: u16,
    iov: &mut [libc::iovec],
) -> Result<BlkRequest, ParseError> {
    if let Some(req) = chain.descs().try_into().ok().and_then(|three| parse_three(three, head, iov)) {
        return Ok(req);
    }
    parse_chain_general(mem, chain, head, iov)
}

/// The fast path of [`parse_chain`]: `Some` for an `IN` or `OUT` request whose chain is a
/// readable 16-byte header, one data descriptor of the request's direction and a writable
/// 1-byte status, all three host-contiguous; `None` (nothing decided: the caller parses the
/// walked chain with [`parse_chain`]) otherwise.
///
/// Public for a ring's walker that reads a three-descriptor chain without storing it
/// (`fp_virtq::SplitQueue::read_three`): inlined into the same function, the three stay in
/// registers from the descriptor table to the request.
///
/// What the general parser would do with such a chain, rule by rule: the status is the last
/// descriptor's only byte; readable precede writable; every descriptor is guest memory (it was
/// translated); the header is the first descriptor; `IN` wants exactly the header readable and
/// its data is the writable bytes but the status, `OUT` wants exactly the status writable and
/// its data is the readable bytes after the header: in both cases the data descriptor, whole,
/// as one iovec.
#[inline(always)]
pub fn parse_three(descs: &[Desc; 3], head: u16, iov: &mut [libc::iovec]) -> Option<BlkRequest> {
    let [h, d, s] = descs;
    if h.write || h.len != REQ_HEADER_SIZE as u32 || !s.write || s.len != 1 {
        return None;
    }
    if d.host().is_null() {
        return None;
    }
    // `None` (to the general parser) when the header or status is not in one region.
    let [w0, sector] = h.load_u64s(0)?;
    let status = s.byte(0)?;
    let kind = RequestType::from_raw(w0 as u32);
    let writable_len = match kind {
        // The walker bounds a chain to 2^32 bytes, so `d.len + 1` fits; saturate as the
        // general parser does for a chain built another way.
        RequestType::In if d.write => d.len.saturating_add(1),
        RequestType::Out if !d.write => 1,
        _ => return None,
    };
    *iov.first_mut()? = libc::iovec { iov_base: d.host().cast(), iov_len: d.len as usize };
    Some(BlkRequest {
        head,
        kind,
        sector,
        iovcnt: 1,
        data_len: u64::from(d.len),
        segment: None,
        status: StatusPtr::new(status),
        writable_len,
    })
}

/// The general parser [`parse_chain`] falls back to: any chain, every rule of the crate
/// documentation. Public so tests and fuzzing can compare the fast path with it.
#[inline(never)]
pub fn parse_chain_general(
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
    // The descriptor's last byte (`len >= 1`), in its host buffer, else translated alone.
    let status_byte = match last.byte(last.len - 1) {
        Some(b) => Some(b),
        None => last.addr.checked_add(u64::from(last.len) - 1).and_then(|a| mem.byte(a)),
    };
    let status_ptr = StatusPtr::new(status_byte.ok_or(err(ParseErrorKind::DescriptorOutOfMemory, None))?);
    let status = Some(status_ptr);

    // ---- 2. Ordering and memory bounds of every descriptor. ----
    let (readable, writable) = descs.split_at(n_readable);
    if writable.iter().any(|d| !d.write) {
        return Err(err(ParseErrorKind::ReadableAfterWritable, status));
    }
    let mut r_len = 0u64;
    for d in readable {
        if d.host().is_null() && !mem.contains(d.addr, u64::from(d.len)) {
            return Err(err(ParseErrorKind::DescriptorOutOfMemory, status));
        }
        r_len += u64::from(d.len);
    }
    let mut w_len = 0u64;
    for d in writable {
        if d.host().is_null() && !mem.contains(d.addr, u64::from(d.len)) {
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
        if !d.host().is_null() && offset + N as u64 <= u64::from(d.len) && N % 8 == 0 {
            let mut out = [0u8; N];
            if out.chunks_exact_mut(8).enumerate().all(|(i, chunk)| {
                d.load_u64s::<1>(offset as usize + 8 * i)
                    .map(|[w]| chunk.copy_from_slice(&w.to_le_bytes()))
                    .is_some()
            }) {
                return out;
            }
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
            // `p` covers `n` mapped bytes (a translated piece); one volatile load each.
            let ok = mem.read_bytes(p, &mut out[done..done + n as usize]);
            done += n as usize;
            ok
        };
        if d.host().is_null() {
            // Checked to be guest memory: every piece is mapped.
            mem.for_each_piece(d.addr + skip, take as u64, copy);
        } else {
            // `skip + take <= len` bytes from `host` are inside one mapping.
            copy(d.host().wrapping_add(skip as usize), take as u64);
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
        if d.host().is_null() {
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
            // `offset < dlen`: inside the descriptor's mapped bytes.
            let base = d.host().wrapping_add(offset as usize);
            *slot = libc::iovec { iov_base: base.cast(), iov_len: take as usize };
            cnt += 1;
        }
        remaining -= take;
        offset = 0;
    }
    // `cnt <= iov.len()`; a caller array larger than u32::MAX entries is absurd.
    Ok(u32::try_from(cnt).unwrap_or(u32::MAX))
}
