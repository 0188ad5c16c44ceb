//! The emulated controller's data path: walking a command's PRPs (Base 4.1.1) or SGL (Base
//! 4.1.2) into host memory reachable through the DMA map, and the NVM commands (read, write,
//! flush, write zeroes, dataset management) on the namespaces' RAM.

use fp_bdev::dma::memory_map;
use fp_nvme_spec::{self as spec, Sqe, Status};

use super::device::{Device, Outcome, PAGE};
use crate::pcie::prp::{SGL_DATA_BLOCK, SGL_LAST_SEGMENT, SGL_SEGMENT};

/// Invalid PRP Offset (Base Figure 95).
const SC_INVALID_PRP_OFFSET: u8 = 0x13;
/// Descriptors or list entries one command may make the device read, so a looping list ends.
const WALK_LIMIT: usize = 8192;

/// Host memory pieces (IOVAs the DMA map holds, and lengths) a command's data pointer
/// describes.
pub(crate) type Segments = Vec<(u64, usize)>;

fn transfer_error() -> Status {
    Status::generic(spec::SC_DATA_TRANSFER_ERROR)
}

fn read_u64(iova: u64) -> Result<u64, Status> {
    let mut b = [0u8; 8];
    if !memory_map().device_read(iova, &mut b) {
        return Err(transfer_error());
    }
    Ok(u64::from_le_bytes(b))
}

fn reach(out: &mut Segments, iova: u64, len: usize) -> Result<(), Status> {
    memory_map().vaddr_of(iova, len).ok_or(transfer_error())?;
    out.push((iova, len));
    Ok(())
}

fn prp_segments(prp1: u64, prp2: u64, len: usize) -> Result<Segments, Status> {
    let bad_offset = Status::generic(SC_INVALID_PRP_OFFSET);
    let mut out = Vec::new();
    if prp1 & 3 != 0 {
        return Err(bad_offset);
    }
    let first = len.min((PAGE - prp1 % PAGE) as usize);
    reach(&mut out, prp1, first)?;
    let mut rem = len - first;
    if rem == 0 {
        return Ok(out);
    }
    if rem <= PAGE as usize {
        if prp2 % PAGE != 0 {
            return Err(bad_offset);
        }
        reach(&mut out, prp2, rem)?;
        return Ok(out);
    }
    let mut list = prp2;
    if list & 7 != 0 {
        return Err(bad_offset);
    }
    let mut walked = 0;
    while rem > 0 {
        walked += 1;
        if walked > WALK_LIMIT {
            return Err(bad_offset);
        }
        let entry = read_u64(list)?;
        let last_in_page = (list + 8) % PAGE == 0;
        if last_in_page && rem > PAGE as usize {
            // The last entry of a list page points at the next list page.
            if entry & 7 != 0 {
                return Err(bad_offset);
            }
            list = entry;
            continue;
        }
        if entry % PAGE != 0 {
            return Err(bad_offset);
        }
        let n = rem.min(PAGE as usize);
        reach(&mut out, entry, n)?;
        rem -= n;
        list += 8;
    }
    Ok(out)
}

fn sgl_segments(first: [u8; 16], len: usize) -> Result<Segments, Status> {
    let mut out = Vec::new();
    let mut have = 0usize;
    // Descriptors still to read in the current segment: (iova, count).
    let mut pending: Option<(u64, u64)> = None;
    let mut d = first;
    let mut walked = 0;
    loop {
        walked += 1;
        if walked > WALK_LIMIT {
            return Err(Status::generic(spec::SC_SGL_DESCRIPTOR_TYPE_INVALID));
        }
        let desc = spec::SglDescriptor(d);
        match desc.type_byte() {
            SGL_DATA_BLOCK => {
                let n = (desc.length() as usize).min(len - have);
                if n > 0 {
                    reach(&mut out, desc.address(), n)?;
                }
                have += n;
            }
            SGL_SEGMENT | SGL_LAST_SEGMENT => {
                if desc.length() % 16 != 0 || desc.length() == 0 {
                    return Err(Status::generic(spec::SC_SGL_DESCRIPTOR_TYPE_INVALID));
                }
                pending = Some((desc.address(), u64::from(desc.length() / 16)));
            }
            _ => return Err(Status::generic(spec::SC_SGL_DESCRIPTOR_TYPE_INVALID)),
        }
        if have == len {
            return Ok(out);
        }
        match pending {
            Some((at, left)) if left > 0 => {
                if !memory_map().device_read(at, &mut d) {
                    return Err(transfer_error());
                }
                pending = Some((at + 16, left - 1));
            }
            _ => return Err(Status::generic(spec::SC_SGL_DATA_LENGTH_INVALID)),
        }
    }
}

/// The host memory `sqe`'s data pointer gives for `len` bytes.
pub(crate) fn segments(sqe: &Sqe, len: usize) -> Result<Segments, Status> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let b = &sqe.0;
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"));
    match sqe.psdt() {
        0 => prp_segments(u64_at(24), u64_at(32), len),
        1 => sgl_segments(b[24..40].try_into().expect("sixteen bytes"), len),
        _ => Err(Status::generic(spec::SC_INVALID_FIELD)),
    }
}

/// Copies `data` into the host memory of `segs` (reachable when `segments` made them; the
/// DMA gate keeps them mapped while the device works).
pub(crate) fn to_host(segs: &Segments, data: &[u8]) {
    let mut at = 0;
    for &(iova, n) in segs {
        let n = n.min(data.len() - at);
        memory_map().device_write(iova, &data[at..at + n]);
        at += n;
    }
}

/// Copies the host memory of `segs` into `data`.
pub(crate) fn from_host(segs: &Segments, data: &mut [u8]) {
    let mut at = 0;
    for &(iova, n) in segs {
        let n = n.min(data.len() - at);
        memory_map().device_read(iova, &mut data[at..at + n]);
        at += n;
    }
}

impl Device {
    /// Executes an NVM command.
    pub(crate) fn io(&mut self, sqe: &Sqe) -> Outcome {
        let status = self.nvm(sqe).err().unwrap_or(Status::SUCCESS);
        Outcome::Done(status, 0)
    }

    fn nvm(&mut self, sqe: &Sqe) -> Result<(), Status> {
        let sh = self.sh.clone();
        let mut namespaces = sh.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        let ns = namespaces
            .iter_mut()
            .find(|n| n.nsid == sqe.nsid())
            .ok_or(Status::generic(spec::SC_INVALID_NAMESPACE))?;
        let bs = ns.block_size as usize;
        let range = |slba: u64, nlb: u64, blocks: u64| -> Result<std::ops::Range<usize>, Status> {
            match slba.checked_add(nlb) {
                Some(end) if end <= blocks => Ok(slba as usize * bs..end as usize * bs),
                _ => Err(Status::generic(spec::SC_LBA_OUT_OF_RANGE)),
            }
        };
        let mdts = sh.cfg.mdts;
        match sqe.opcode() {
            spec::NVM_FLUSH => Ok(()),
            op @ (spec::NVM_READ | spec::NVM_WRITE) => {
                let r = range(sqe.slba(), u64::from(sqe.nlb()), ns.num_blocks())?;
                if mdts > 0 && r.len() > (PAGE as usize) << mdts {
                    return Err(Status::generic(spec::SC_INVALID_FIELD));
                }
                let segs = segments(sqe, r.len())?;
                if op == spec::NVM_WRITE {
                    from_host(&segs, &mut ns.data[r]);
                } else {
                    to_host(&segs, &ns.data[r]);
                }
                Ok(())
            }
            spec::NVM_WRITE_ZEROES => {
                let r = range(sqe.slba(), u64::from(sqe.nlb()), ns.num_blocks())?;
                ns.data[r].fill(0);
                Ok(())
            }
            spec::NVM_DATASET_MANAGEMENT => {
                let count = (sqe.cdw(10) & 0xff) as usize + 1;
                let mut ranges = vec![0u8; count * 16];
                from_host(&segments(sqe, ranges.len())?, &mut ranges);
                if sqe.cdw(11) & (1 << 2) != 0 {
                    // Deallocate: deallocated blocks read as zeroes here.
                    for r in ranges.chunks_exact(16) {
                        let nlb = u32::from_le_bytes(r[4..8].try_into().expect("four bytes"));
                        let slba = u64::from_le_bytes(r[8..16].try_into().expect("eight bytes"));
                        let r = range(slba, u64::from(nlb), ns.num_blocks())?;
                        ns.data[r].fill(0);
                    }
                }
                Ok(())
            }
            _ => Err(Status::generic(spec::SC_INVALID_OPCODE)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcie::prp::sgl_descriptor;
    use crate::pcie::DmaMemory;

    fn put_u64(m: &mut DmaMemory, at: usize, v: u64) {
        m.as_mut_slice()[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn prp_lists_chain_across_pages() {
        // Pages: 0 data (PRP1), 1-3 data, 4 and 5 list pages.
        let mut m = DmaMemory::new(6 * PAGE as usize).unwrap();
        let iova = m.iova();
        let page = |i: u64| iova + i * PAGE;
        // The first list starts two entries before its page's end: one data entry, then the
        // pointer to the next list, which holds the last two.
        let list = page(5) - 16;
        put_u64(&mut m, 5 * PAGE as usize - 16, page(1));
        put_u64(&mut m, 5 * PAGE as usize - 8, page(5));
        put_u64(&mut m, 5 * PAGE as usize, page(2));
        put_u64(&mut m, 5 * PAGE as usize + 8, page(3));
        let segs = prp_segments(page(0), list, 4 * PAGE as usize).unwrap();
        let want: Segments = (0..4).map(|i| (page(i), PAGE as usize)).collect();
        assert_eq!(segs, want);
        // Two pages: PRP2 is the second page itself, and must be page aligned.
        assert_eq!(prp_segments(page(0) + 512, page(1), 4096).unwrap().len(), 2);
        assert_eq!(prp_segments(page(0), page(1) + 8, 8192), Err(Status::generic(SC_INVALID_PRP_OFFSET)));
        assert_eq!(prp_segments(page(0) + 2, 0, 8), Err(Status::generic(SC_INVALID_PRP_OFFSET)));
        // Outside the DMA map: what an IOMMU refuses.
        assert_eq!(prp_segments(0x10, 0, 8), Err(Status::generic(spec::SC_DATA_TRANSFER_ERROR)));
    }

    #[test]
    fn sgl_segments_chain() {
        let mut m = DmaMemory::new(2 * PAGE as usize).unwrap();
        let iova = m.iova();
        // Segment at 0x100: a 100-byte block at 0x1000, then a Last Segment at 0x200 with a
        // 28-byte block at 0x1800.
        let s = m.as_mut_slice();
        s[0x100..0x110].copy_from_slice(&sgl_descriptor(iova + 0x1000, 100, SGL_DATA_BLOCK));
        s[0x110..0x120].copy_from_slice(&sgl_descriptor(iova + 0x200, 16, SGL_LAST_SEGMENT));
        s[0x200..0x210].copy_from_slice(&sgl_descriptor(iova + 0x1800, 28, SGL_DATA_BLOCK));
        let first = sgl_descriptor(iova + 0x100, 32, SGL_SEGMENT);
        assert_eq!(sgl_segments(first, 128).unwrap(), vec![(iova + 0x1000, 100), (iova + 0x1800, 28)]);
        // Fewer bytes described than the command moves.
        assert_eq!(sgl_segments(first, 200), Err(Status::generic(spec::SC_SGL_DATA_LENGTH_INVALID)));
        // A descriptor type the emulation does not take.
        assert_eq!(
            sgl_segments(sgl_descriptor(iova, 8, 0x50), 8),
            Err(Status::generic(spec::SC_SGL_DESCRIPTOR_TYPE_INVALID))
        );
    }
}
