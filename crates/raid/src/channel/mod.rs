//! The raid bdev's per-core channels, one file per level, and the pieces they share: the
//! parent slab ([`slab`]), the bases' channels opened lazily per layout epoch ([`bases`]) and
//! the splitting of a request by strip or base boundaries ([`split`], for raid0 and concat).
//!
//! Nothing here allocates per request: every table is sized when the channel is opened, and a
//! request that finds no room is refused with `SubmitError::Busy`.

pub mod bases;
pub mod concat;
pub mod raid0;
pub mod raid1;
pub mod slab;
pub mod split;

pub use concat::ConcatMap;
pub use raid0::Raid0Map;
pub use raid1::Raid1Channel;
pub use split::{SplitChannel, SplitMap};

use fp_bdev::{BdevInfo, IoOp, IoRequest, IoStatus, SubmitError};

/// Requests one channel keeps in flight upward (the parent slab's size).
pub const MAX_PARENTS: usize = 256;

/// What every level's `submit` decides before it takes a parent.
pub(crate) enum Admit {
    /// Goes to the bases.
    Take,
    /// Ends at once, without a base: iovecs that do not add up to the length (EINVAL), or an
    /// empty read or write (success).
    Done(IoStatus),
}

/// Refuses a request outside the raid, or of an operation it does not offer: discard and
/// write-zeroes are refused here rather than passed to bases that may differ (done on one
/// replica and not the other, they would leave them diverging).
pub(crate) fn admit(info: &BdevInfo, req: &IoRequest) -> Result<Admit, SubmitError> {
    info.check_range(req.offset, req.len)?;
    let supported = match req.op {
        IoOp::Discard => info.io_types.unmap,
        IoOp::WriteZeroes => info.io_types.write_zeroes,
        _ => true,
    };
    if !supported {
        return Err(SubmitError::Unsupported);
    }
    let rw = matches!(req.op, IoOp::Read | IoOp::Write);
    if rw && req.iov.total_len() != req.len {
        return Ok(Admit::Done(IoStatus::Error(libc::EINVAL)));
    }
    if req.len == 0 && req.op != IoOp::Flush {
        return Ok(Admit::Done(IoStatus::Success));
    }
    Ok(Admit::Take)
}

#[cfg(test)]
mod tests;
