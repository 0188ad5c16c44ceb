//! A parsed request: its type, its discard/write-zeroes segment, the guest's status byte, and
//! the GET_ID reply writer.

use fp_virtq::{GuestByte, MemTable};

use crate::VIRTIO_BLK_ID_BYTES;
use crate::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES,
};

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

/// The guest's status byte: made by the parser from the chain's last descriptor, valid while
/// the memory table the chain was walked with lives (see [`GuestByte`]).
#[derive(Clone, Copy, Debug)]
pub struct StatusPtr(GuestByte);

impl StatusPtr {
    /// No status byte: writes do nothing (for requests built without a ring, in tests).
    pub const DETACHED: StatusPtr = StatusPtr(GuestByte::DETACHED);

    pub(crate) fn new(byte: GuestByte) -> Self {
        StatusPtr(byte)
    }

    /// Whether this is [`StatusPtr::DETACHED`] (the parser never makes one).
    #[inline(always)]
    pub fn is_detached(self) -> bool {
        self.0 == GuestByte::DETACHED
    }

    /// The host address of the status byte.
    pub fn as_ptr(self) -> *mut u8 {
        self.0.as_ptr()
    }

    /// Store the status byte (volatile: the guest may observe it).
    #[inline(always)]
    pub fn write(self, status: u8) {
        self.0.store(status)
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

/// Copy the ID string into the request's iovecs (GetId), through `mem`, the table the parser
/// translated them with: at most [`VIRTIO_BLK_ID_BYTES`] bytes, fewer if the buffer is shorter
/// (§5.2.6: the ID is not NUL-terminated when it is 20 bytes long). Returns the number of bytes
/// written; it stops at an iovec outside `mem`'s memory.
pub fn write_id(mem: &MemTable, iov: &[libc::iovec], id: &[u8; VIRTIO_BLK_ID_BYTES]) -> u32 {
    let mut done = 0usize;
    for v in iov {
        if done == id.len() {
            break;
        }
        let take = v.iov_len.min(id.len() - done);
        if !mem.write_bytes(v.iov_base.cast(), &id[done..done + take]) {
            break;
        }
        done += take;
    }
    // `done <= 20`.
    done as u32
}
