//! virtio-blk request parsing, semantic validation and config space.
//!
//! This crate is pure code: it never performs I/O. It turns a split-virtqueue
//! descriptor chain (virtio 1.2 §2.7) into a [`BlkRequest`] whose data buffers
//! are host `iovec`s into guest memory, checks the request against the disk
//! geometry ([`validate()`]) and builds the device configuration space
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
//!      its payload; [`validate()`] answers `VIRTIO_BLK_S_UNSUPP`.
//!
//!    Unexpected extra bytes give [`ParseErrorKind::UnexpectedReadable`] /
//!    [`ParseErrorKind::UnexpectedWritable`].
//! 7. **Capacity.** More data iovecs than `iov.len()` (after splitting at
//!    region boundaries) gives [`ParseErrorKind::TooManySegments`].
//!
//! A read or write in exactly three descriptors (16-byte readable header, one data buffer,
//! 1-byte writable status, each inside one memory region) is parsed by a fast path in one
//! pass; [`parse_chain_general`] applies the rules above to every other chain, and gives the
//! same result on the fast path's chains too (tests and the `chain_parser` fuzz target check
//! that).
//!
//! The pointers placed in the iovecs and in [`StatusPtr`] are host virtual
//! addresses inside the guest memory mappings: they stay valid only while the
//! [`MemTable`] the chain was walked with is alive. No dirty-page logging is
//! done here.

#![deny(missing_docs)]

pub mod config;
mod parse;
mod request;
mod validate;

use virtio_bindings::virtio_blk as vb;

pub use fp_virtq::{Chain, Desc, GuestMemory, MemTable, WalkError, MAX_CHAIN_DESCRIPTORS};
pub use parse::{parse_chain, parse_chain_general, parse_three, ParseError, ParseErrorKind};
pub use request::{write_id, BlkRequest, RequestType, Segment, StatusPtr};
pub use validate::{validate, validate_sized, DiskParams};
/// `flags` bit 0 of `struct virtio_blk_discard_write_zeroes` (§5.2.6).
pub use vb::VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;
/// Request types (§5.2.6): read, write, flush, get ID, discard, write zeroes.
pub use vb::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES,
};

/// Sector unit of the virtio-blk protocol (§5.2.6: `sector` is always in 512-byte units).
pub const SECTOR_SIZE: u64 = 512;
/// Length of the GET_ID string (§5.2.6, `VIRTIO_BLK_ID_BYTES`).
pub const VIRTIO_BLK_ID_BYTES: usize = vb::VIRTIO_BLK_ID_BYTES as usize;
/// Data segments advertised in the config `seg_max` field (§5.2.4).
pub const SEG_MAX: u32 = 126;
/// Capacity callers should give [`parse_chain`]: data iovecs after splitting at
/// memory-region boundaries.
pub const MAX_IOVECS: usize = 256;

/// Size of the request header `struct virtio_blk_req` up to `data` (§5.2.6): 16 bytes.
pub const REQ_HEADER_SIZE: u64 = std::mem::size_of::<vb::virtio_blk_outhdr>() as u64;
/// Size of `struct virtio_blk_discard_write_zeroes` (§5.2.6): 16 bytes.
pub const DISCARD_SEGMENT_SIZE: u64 = std::mem::size_of::<vb::virtio_blk_discard_write_zeroes>() as u64;

// The parser reads both as fixed 16-byte arrays.
const _: () = assert!(REQ_HEADER_SIZE == 16 && DISCARD_SEGMENT_SIZE == 16);

/// Status: success (§5.2.6).
pub const VIRTIO_BLK_S_OK: u8 = vb::VIRTIO_BLK_S_OK as u8;
/// Status: device or driver error.
pub const VIRTIO_BLK_S_IOERR: u8 = vb::VIRTIO_BLK_S_IOERR as u8;
/// Status: request unsupported by the device.
pub const VIRTIO_BLK_S_UNSUPP: u8 = vb::VIRTIO_BLK_S_UNSUPP as u8;
