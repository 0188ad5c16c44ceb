//! The commands the driver sends, built as [`Sqe`]s with the command ID and data pointer left
//! zero: the queue that sends one fills those. Sections are the NVMe Base Specification 2.0's
//! and the NVM Command Set Specification 1.0's ("NVM"); the opcodes and codes are
//! `fp_nvme_spec`'s.

use fp_nvme_spec::{self as spec, Sqe};

/// Identify (Base 5.17): `cns` for namespace `nsid` (0 when not about one); 4 KiB of data.
pub fn identify(cns: u8, nsid: u32) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_IDENTIFY);
    s.set_nsid(nsid);
    s.set_cdw(10, u32::from(cns));
    s
}

/// Set Features (Base 5.27) `fid` with dword 11 `value`.
pub fn set_features(fid: u8, value: u32) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_SET_FEATURES);
    s.set_cdw(10, u32::from(fid));
    s.set_cdw(11, value);
    s
}

/// Get Features (Base 5.15) `fid`, current value.
pub fn get_features(fid: u8) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_GET_FEATURES);
    s.set_cdw(10, u32::from(fid));
    s
}

/// Get Log Page (Base 5.16): `len` bytes (a multiple of 4) of log `lid` from byte `offset`.
pub fn get_log_page(lid: u8, nsid: u32, len: u32, offset: u64) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_GET_LOG_PAGE);
    s.set_nsid(nsid);
    let numd = len / 4 - 1;
    s.set_cdw(10, u32::from(lid) | ((numd & 0xffff) << 16));
    s.set_cdw(11, numd >> 16);
    s.set_cdw(12, offset as u32);
    s.set_cdw(13, (offset >> 32) as u32);
    s
}

/// Create I/O Completion Queue (Base 5.4): `qid` of `size` entries at `iova` (physically
/// contiguous), interrupts off or on `vector`.
pub fn create_io_cq(qid: u16, size: u16, iova: u64, vector: Option<u16>) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_CREATE_IO_CQ);
    s.set_prp(iova, 0);
    s.set_cdw(10, u32::from(qid) | (u32::from(size - 1) << 16));
    // PC (physically contiguous) and IEN with the vector.
    let ien = vector.map_or(0, |v| 2 | (u32::from(v) << 16));
    s.set_cdw(11, 1 | ien);
    s
}

/// Create I/O Submission Queue (Base 5.5): `qid` of `size` entries at `iova`, completing to
/// completion queue `cqid`.
pub fn create_io_sq(qid: u16, size: u16, iova: u64, cqid: u16) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_CREATE_IO_SQ);
    s.set_prp(iova, 0);
    s.set_cdw(10, u32::from(qid) | (u32::from(size - 1) << 16));
    s.set_cdw(11, 1 | (u32::from(cqid) << 16));
    s
}

/// Delete I/O Submission Queue (Base 5.7).
pub fn delete_io_sq(qid: u16) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_DELETE_IO_SQ);
    s.set_cdw(10, u32::from(qid));
    s
}

/// Delete I/O Completion Queue (Base 5.6).
pub fn delete_io_cq(qid: u16) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_DELETE_IO_CQ);
    s.set_cdw(10, u32::from(qid));
    s
}

/// Abort (Base 5.1) command `cid` on submission queue `sqid`.
pub fn abort(sqid: u16, cid: u16) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_ABORT);
    s.set_cdw(10, u32::from(sqid) | (u32::from(cid) << 16));
    s
}

/// Asynchronous Event Request (Base 5.2).
pub fn async_event_request() -> Sqe {
    Sqe::command(spec::ADMIN_ASYNC_EVENT_REQUEST)
}

/// Keep Alive (Base 5.25).
pub fn keep_alive() -> Sqe {
    Sqe::command(spec::ADMIN_KEEP_ALIVE)
}

/// Doorbell Buffer Config (Base 5.8): the shadow doorbell page at `shadow` and the event
/// index page at `eventidx` (both one page, IOVAs).
pub fn doorbell_buffer_config(shadow: u64, eventidx: u64) -> Sqe {
    let mut s = Sqe::command(spec::ADMIN_DOORBELL_BUFFER_CONFIG);
    s.set_prp(shadow, eventidx);
    s
}

/// Read or Write (NVM 3.2.4, 3.2.6) of `nlb` blocks (at least 1) at `slba` of `nsid`, with
/// Force Unit Access when `fua`.
pub fn read_write(write: bool, nsid: u32, slba: u64, nlb: u32, fua: bool) -> Sqe {
    let mut s = Sqe::command(if write { spec::NVM_WRITE } else { spec::NVM_READ });
    s.set_nsid(nsid);
    s.set_cdw(10, slba as u32);
    s.set_cdw(11, (slba >> 32) as u32);
    s.set_cdw(12, (nlb - 1) | if fua { 1 << 30 } else { 0 });
    s
}

/// Flush (Base 7.1) of `nsid`.
pub fn flush(nsid: u32) -> Sqe {
    let mut s = Sqe::command(spec::NVM_FLUSH);
    s.set_nsid(nsid);
    s
}

/// Write Zeroes (NVM 3.2.8) of `nlb` blocks at `slba`, deallocating where the namespace can
/// (DEAC) when `deallocate`.
pub fn write_zeroes(nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Sqe {
    let mut s = Sqe::command(spec::NVM_WRITE_ZEROES);
    s.set_nsid(nsid);
    s.set_cdw(10, slba as u32);
    s.set_cdw(11, (slba >> 32) as u32);
    s.set_cdw(12, (nlb - 1) | if deallocate { 1 << 25 } else { 0 });
    s
}

/// Dataset Management with Deallocate (NVM 3.2.3) of `ranges` 16-byte ranges (at least 1),
/// which the data pointer carries ([`dsm_range`]).
pub fn deallocate(nsid: u32, ranges: u32) -> Sqe {
    let mut s = Sqe::command(spec::NVM_DATASET_MANAGEMENT);
    s.set_nsid(nsid);
    s.set_cdw(10, ranges - 1);
    s.set_cdw(11, 1 << 2);
    s
}

/// One Dataset Management range (NVM Figure 40): `nlb` blocks at `slba`.
pub fn dsm_range(slba: u64, nlb: u32) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[4..8].copy_from_slice(&nlb.to_le_bytes());
    r[8..16].copy_from_slice(&slba.to_le_bytes());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_read_back_through_the_targets_view() {
        let mut s = read_write(true, 3, 0x1_2345_6789, 8, true);
        s.set_cid(0xbeef);
        assert_eq!(s.opcode(), spec::NVM_WRITE);
        assert_eq!(s.cid(), 0xbeef);
        assert_eq!(s.nsid(), 3);
        assert_eq!(s.slba(), 0x1_2345_6789);
        assert_eq!(s.nlb(), 8);
        assert!(s.fua());
        let g = get_log_page(spec::log_page::LID_CHANGED_NS, 0xffff_ffff, 4096, 0);
        assert_eq!(g.cdw(10), 0x04 | (1023 << 16));
        let cq = create_io_cq(2, 128, 0x20_0000, None);
        assert_eq!(cq.cdw(10), 2 | (127 << 16));
        assert_eq!(cq.cdw(11), 1);
    }
}
