//! Data pointers of PCIe commands: PRP entries and lists (Base 4.1.1) and SGLs (Base 4.1.2),
//! built from a request's iovecs through the queue's [`Translator`] into the command's own
//! preallocated list page. The memory page size is 4 KiB (CC.MPS = 0).
//!
//! PRPs describe a transfer only when every iovec but the first starts on a page boundary and
//! every iovec but the last ends on one; anything else goes as an SGL (when the controller
//! offers SGLs) or is bounced by the queue.

use fp_bdev::dma::Translator;

/// The memory page size the driver sets (CC.MPS = 0): 4 KiB.
pub const PAGE: usize = 4096;
const PAGE_MASK: u64 = PAGE as u64 - 1;
/// PRP entries in one list page.
pub const PRP_LIST_ENTRIES: usize = PAGE / 8;
/// SGL descriptors in one segment page.
pub const SGL_SEGMENT_DESCRIPTORS: usize = PAGE / 16;
/// SGL descriptor type Data Block (Base 4.1.2.1, Figure 115), subtype Address.
pub const SGL_DATA_BLOCK: u8 = 0x00;
/// SGL descriptor type Segment.
pub const SGL_SEGMENT: u8 = 0x20;
/// SGL descriptor type Last Segment.
pub const SGL_LAST_SEGMENT: u8 = 0x30;

/// Why a request's iovecs cannot be handed to the device as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfit {
    /// Some iovec is not (wholly) inside one registered DMA region.
    NotRegistered,
    /// The iovecs break the PRP rules (alignment) or need more entries than one list page.
    Shape,
}

/// One SGL descriptor's 16 bytes: `len` bytes at `addr`, type byte `kind`.
pub fn sgl_descriptor(addr: u64, len: u32, kind: u8) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[15] = kind;
    d
}

/// Builds PRP1 and PRP2 for `iov`, writing a PRP list into `list` (the command's list page,
/// at `list_iova`) when more than two entries are needed. Empty iovecs are skipped.
#[inline]
pub fn build_prps(
    iov: &[libc::iovec],
    tr: &mut Translator,
    list: &mut [u64; PRP_LIST_ENTRIES],
    list_iova: u64,
) -> Result<(u64, u64), Unfit> {
    // The common request: one piece of at most two pages, no list.
    if let [v] = iov {
        let len = v.iov_len as u64;
        if len != 0 {
            let iova = tr.translate(v.iov_base as usize, v.iov_len).ok_or(Unfit::NotRegistered)?;
            let first = PAGE as u64 - (iova & PAGE_MASK);
            if iova & 3 == 0 && len <= first + PAGE as u64 {
                return Ok((iova, if len <= first { 0 } else { iova + first }));
            }
        }
    }
    let mut n = 0usize;
    let mut prp1 = 0u64;
    let last = iov.len().saturating_sub(1);
    for (i, v) in iov.iter().enumerate() {
        let len = v.iov_len;
        if len == 0 {
            continue;
        }
        let iova = tr.translate(v.iov_base as usize, len).ok_or(Unfit::NotRegistered)?;
        let end = iova + len as u64;
        // Dword alignment of every entry (Base 4.1.1); page alignment inside the transfer.
        if iova & 3 != 0 || (n > 0 && iova & PAGE_MASK != 0) || (i < last && end & PAGE_MASK != 0) {
            return Err(Unfit::Shape);
        }
        let mut a = iova;
        loop {
            if n == 0 {
                prp1 = a;
            } else {
                // One list page holds entries 2..=513; a longer transfer is refused (the
                // transport's transfer limit keeps requests below it).
                *list.get_mut(n - 1).ok_or(Unfit::Shape)? = a;
            }
            n += 1;
            a = (a & !PAGE_MASK) + PAGE as u64;
            if a >= end {
                break;
            }
        }
    }
    Ok(match n {
        0 | 1 => (prp1, 0),
        2 => (prp1, list[0]),
        _ => (prp1, list_iova),
    })
}

/// Builds an SGL for `iov`: one Data Block descriptor for one iovec, else a Last Segment
/// descriptor pointing at Data Block descriptors written into `segment` (at `segment_iova`).
/// Returns the command's descriptor. SGLs take any alignment (Identify Controller SGLS = 01b).
pub fn build_sgl(
    iov: &[libc::iovec],
    tr: &mut Translator,
    segment: &mut [[u8; 16]; SGL_SEGMENT_DESCRIPTORS],
    segment_iova: u64,
) -> Result<[u8; 16], Unfit> {
    let mut n = 0usize;
    let mut only = [0u8; 16];
    for v in iov.iter().filter(|v| v.iov_len != 0) {
        let len = u32::try_from(v.iov_len).map_err(|_| Unfit::Shape)?;
        let iova = tr.translate(v.iov_base as usize, v.iov_len).ok_or(Unfit::NotRegistered)?;
        let d = sgl_descriptor(iova, len, SGL_DATA_BLOCK);
        *segment.get_mut(n).ok_or(Unfit::Shape)? = d;
        only = d;
        n += 1;
    }
    Ok(if n <= 1 { only } else { sgl_descriptor(segment_iova, (n * 16) as u32, SGL_LAST_SEGMENT) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp_bdev::dma::memory_map;
    use fp_bdev::AlignedBuf;

    fn iov(p: *const u8, len: usize) -> libc::iovec {
        libc::iovec { iov_base: p as *mut libc::c_void, iov_len: len }
    }

    struct Reg(AlignedBuf, u64);
    impl Reg {
        fn new(pages: usize) -> Reg {
            let b = AlignedBuf::zeroed(pages * PAGE);
            let iova = memory_map().register(b.as_ptr() as usize, b.len()).unwrap();
            Reg(b, iova)
        }
        fn at(&self, off: usize) -> *const u8 {
            // SAFETY: tests stay inside the buffer.
            unsafe { self.0.as_ptr().add(off) }
        }
    }
    impl Drop for Reg {
        fn drop(&mut self) {
            memory_map().unregister(self.0.as_ptr() as usize, self.0.len()).unwrap();
        }
    }

    #[test]
    fn prps_follow_the_page_rules() {
        let r = Reg::new(8);
        let mut tr = memory_map().translator();
        let mut list = [0u64; PRP_LIST_ENTRIES];
        // One page, offset: PRP1 only.
        assert_eq!(build_prps(&[iov(r.at(512), 512)], &mut tr, &mut list, 0x9000), Ok((r.1 + 512, 0)));
        // Crossing one page boundary: PRP2 is the second page.
        assert_eq!(
            build_prps(&[iov(r.at(2048), 4096)], &mut tr, &mut list, 0x9000),
            Ok((r.1 + 2048, r.1 + 4096))
        );
        // Three pages: a list.
        let (p1, p2) = build_prps(&[iov(r.at(0), 3 * PAGE)], &mut tr, &mut list, 0x9000).unwrap();
        assert_eq!((p1, p2), (r.1, 0x9000));
        assert_eq!(&list[..2], &[r.1 + 4096, r.1 + 8192]);
        // Page-aligned pieces out of order chain fine.
        let (p1, p2) = build_prps(
            &[iov(r.at(4 * PAGE + 1024), 3072), iov(r.at(0), PAGE), iov(r.at(2 * PAGE), 100)],
            &mut tr,
            &mut list,
            0x9000,
        )
        .unwrap();
        assert_eq!((p1, p2), (r.1 + 4 * 4096 + 1024, 0x9000));
        assert_eq!(&list[..2], &[r.1, r.1 + 2 * 4096]);
        // An inner iovec off a page boundary, or a first one ending inside a page: Shape.
        assert_eq!(
            build_prps(&[iov(r.at(0), 512), iov(r.at(PAGE), 512)], &mut tr, &mut list, 0),
            Err(Unfit::Shape)
        );
        assert_eq!(
            build_prps(&[iov(r.at(0), PAGE), iov(r.at(PAGE + 8), 8)], &mut tr, &mut list, 0),
            Err(Unfit::Shape)
        );
        // Odd addresses break dword alignment.
        assert_eq!(build_prps(&[iov(r.at(3), 8)], &mut tr, &mut list, 0), Err(Unfit::Shape));
        // Memory outside the map.
        // (Plain heap memory: an AlignedBuf registers itself.)
        let other = vec![0u64; PAGE / 8];
        assert_eq!(
            build_prps(&[iov(other.as_ptr().cast(), 8)], &mut tr, &mut list, 0),
            Err(Unfit::NotRegistered)
        );
    }

    #[test]
    fn sgls_take_any_alignment() {
        let r = Reg::new(2);
        let mut tr = memory_map().translator();
        let mut seg = [[0u8; 16]; SGL_SEGMENT_DESCRIPTORS];
        let d = build_sgl(&[iov(r.at(3), 10)], &mut tr, &mut seg, 0x7000).unwrap();
        assert_eq!(d, sgl_descriptor(r.1 + 3, 10, SGL_DATA_BLOCK));
        let d = build_sgl(&[iov(r.at(3), 10), iov(r.at(100), 7)], &mut tr, &mut seg, 0x7000).unwrap();
        assert_eq!(d, sgl_descriptor(0x7000, 32, SGL_LAST_SEGMENT));
        assert_eq!(seg[1], sgl_descriptor(r.1 + 100, 7, SGL_DATA_BLOCK));
    }
}
