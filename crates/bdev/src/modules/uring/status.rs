//! Block status of a uring device: the holes of its file, from `lseek(SEEK_DATA / SEEK_HOLE)`.
//!
//! A file system reports holes at its own granularity, which may be finer or coarser than the
//! device's block size. Boundaries are rounded so that a reported hole never contains data: a
//! hole's start rounds up to a block, its end down, and a hole shorter than a block vanishes
//! into the data around it. Where the file cannot tell (`EINVAL` from a file system without
//! `SEEK_DATA`, or any other error) the rest is data, which claims nothing. A block device
//! answers as one whole run of data (the kernel's generic `lseek`).

use std::os::fd::RawFd;

use crate::BlockExtent;

/// Most extents one call reports: it runs on a reactor, so a fragmented file is described a
/// prefix at a time.
pub(super) const MAX_EXTENTS: usize = 64;
/// Most `lseek`s one call makes (holes that round away cost seeks but add no extent).
const MAX_SEEKS: usize = 4 * MAX_EXTENTS;

/// Which boundary an `lseek` looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Find {
    Data,
    Hole,
}

/// What one `lseek` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seek {
    /// The next offset of the kind asked for.
    At(u64),
    /// `ENXIO`: no data from here on (`SEEK_DATA`), or the offset is past the end of the file.
    Nothing,
    /// The file cannot tell: take the rest as data.
    Unknown,
}

/// `lseek(fd, at, SEEK_DATA or SEEK_HOLE)`. The descriptor's position moves, which nobody
/// minds: all the device's I/O is positional.
pub(super) fn lseek(fd: RawFd, find: Find, at: u64) -> Seek {
    let Ok(at) = libc::off_t::try_from(at) else {
        return Seek::Unknown;
    };
    let whence = match find {
        Find::Data => libc::SEEK_DATA,
        Find::Hole => libc::SEEK_HOLE,
    };
    // SAFETY: lseek takes plain values; the caller keeps `fd` open.
    let r = unsafe { libc::lseek(fd, at, whence) };
    if r >= 0 {
        return Seek::At(r as u64);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENXIO) => Seek::Nothing,
        // No SEEK_DATA/SEEK_HOLE on this file system (the man page's EINVAL).
        Some(libc::EINVAL | libc::EOPNOTSUPP) => Seek::Unknown,
        errno => {
            log::debug!("uring bdev: lseek({find:?}) at {at} failed with errno {errno:?}; reporting data");
            Seek::Unknown
        }
    }
}

/// Appends the extents of `[offset, offset + len)` (block aligned, `len` non-zero) to `out`,
/// asking `seek` where data and holes begin; at most [`MAX_EXTENTS`] of them, covering a prefix
/// of the range when the file is more fragmented than that.
pub(super) fn extents(
    offset: u64,
    len: u64,
    block_size: u64,
    mut seek: impl FnMut(Find, u64) -> Seek,
    out: &mut Vec<BlockExtent>,
) {
    let first = out.len();
    let end = offset + len;
    let down = |x: u64| x - x % block_size;
    let mut cur = offset;
    let mut seeks = 0;
    // Each round starts on a block boundary and ends at least one block further on.
    while cur < end && out.len() - first < MAX_EXTENTS && seeks < MAX_SEEKS {
        seeks += 2;
        let data = match seek(Find::Data, cur) {
            Seek::At(x) if x < end => x.max(cur),
            Seek::At(_) | Seek::Nothing => {
                BlockExtent::hole(end - cur).append_to(out, first);
                return;
            }
            Seek::Unknown => {
                BlockExtent::data(end - cur).append_to(out, first);
                return;
            }
        };
        // The hole runs to the block holding the first byte of data, and not into it.
        let hole_end = down(data);
        if hole_end > cur {
            BlockExtent::hole(hole_end - cur).append_to(out, first);
            cur = hole_end;
            if out.len() - first == MAX_EXTENTS {
                return;
            }
        }
        // The data runs to the end of the block holding its last byte. A file always ends in
        // a hole (at its size), so anything but a position is a file changing underneath:
        // data to the end, which is never wrong.
        let data_end = match seek(Find::Hole, data) {
            Seek::At(y) => y.max(data + 1).min(end).next_multiple_of(block_size),
            Seek::Nothing | Seek::Unknown => end,
        };
        BlockExtent::data(data_end - cur).append_to(out, first);
        cur = data_end;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::{BlockDevice, UringDevice};

    const D: BlockExtent = BlockExtent::data(0);
    const H: BlockExtent = BlockExtent::hole(0);

    fn ext(kind: BlockExtent, len: u64) -> BlockExtent {
        BlockExtent { len, ..kind }
    }

    /// A file of `size` bytes whose data is the sorted, disjoint byte ranges `data`, answering
    /// as Linux's `lseek` does.
    fn layout_seek(data: &[(u64, u64)], size: u64) -> impl Fn(Find, u64) -> Seek + '_ {
        move |find, at| {
            if at >= size {
                return Seek::Nothing;
            }
            let inside = data.iter().find(|&&(s, e)| s <= at && at < e);
            match (find, inside) {
                (Find::Data, Some(_)) => Seek::At(at),
                (Find::Data, None) => data.iter().find(|r| r.0 > at).map_or(Seek::Nothing, |r| Seek::At(r.0)),
                (Find::Hole, Some(&(_, e))) => Seek::At(e.min(size)),
                (Find::Hole, None) => Seek::At(at),
            }
        }
    }

    fn run(data: &[(u64, u64)], size: u64, offset: u64, len: u64, bs: u64) -> Vec<BlockExtent> {
        let mut out = vec![ext(H, 7)];
        extents(offset, len, bs, layout_seek(data, size), &mut out);
        assert_eq!(out[0], ext(H, 7), "extents before the call's are left alone");
        out.remove(0);
        out
    }

    /// What every answer must satisfy: at least one extent, none empty, neighbours differ,
    /// a prefix of the range, every boundary on a block, no data byte inside a hole.
    fn check(data: &[(u64, u64)], out: &[BlockExtent], offset: u64, len: u64, bs: u64) {
        assert!(!out.is_empty());
        assert!(out.iter().all(|e| e.len > 0 && e.len % bs == 0 && e.hole == e.zero), "{out:?}");
        assert!(out.windows(2).all(|w| w[0].hole != w[1].hole), "unmerged: {out:?}");
        assert!(out.iter().map(|e| e.len).sum::<u64>() <= len);
        let mut at = offset;
        for e in out {
            if e.hole {
                let overlap = data.iter().find(|&&(s, end)| s < at + e.len && at < end);
                assert!(overlap.is_none(), "hole [{at}, {}) holds data {overlap:?}: {out:?}", at + e.len);
            }
            at += e.len;
        }
    }

    #[test]
    fn block_aligned_layouts_come_back_exactly() {
        let data = [(4096, 8192), (65536, 131072)];
        let out = run(&data, 1 << 20, 0, 1 << 20, 512);
        let expect =
            [ext(H, 4096), ext(D, 4096), ext(H, 65536 - 8192), ext(D, 65536), ext(H, (1 << 20) - 131072)];
        assert_eq!(out, expect);
        // A range starting and ending mid-extent.
        let out = run(&data, 1 << 20, 6144, 65536, 512);
        assert_eq!(out, [ext(D, 2048), ext(H, 65536 - 8192), ext(D, 6144)]);
        // Past the last data, and past the end of the file: one hole.
        assert_eq!(run(&data, 1 << 20, 131072, 4096, 512), [ext(H, 4096)]);
        assert_eq!(run(&data, 4096, 8192, 4096, 512), [ext(H, 4096)]);
    }

    #[test]
    fn holes_finer_or_coarser_than_a_block_never_hide_data() {
        // Byte-granular data: holes shrink to whole blocks inside them, or vanish.
        let data = [(1000, 1001), (3000, 5000), (5100, 5200), (20000, 20480)];
        let out = run(&data, 32768, 0, 32768, 512);
        check(&data, &out, 0, 32768, 512);
        assert_eq!(
            out,
            [
                ext(H, 512),
                ext(D, 512),
                ext(H, 1536),
                ext(D, 5632 - 2560),
                ext(H, 19968 - 5632),
                ext(D, 512),
                ext(H, 12288)
            ]
        );
        // A device block coarser than the file system's: a block with any data in it is data.
        let out = run(&data, 1 << 20, 0, 1 << 20, 65536);
        assert_eq!(out, [ext(D, 65536), ext(H, (1 << 20) - 65536)]);
        // Many layouts, offsets and block sizes.
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut rand = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..500 {
            let mut data = Vec::new();
            let mut at = rand(3000);
            while at < 60000 {
                let end = at + 1 + rand(5000);
                data.push((at, end));
                at = end + 1 + rand(5000);
            }
            let bs = 512 << rand(4);
            let size = 65536 + rand(2) * 4096;
            let offset = rand(65536 / bs) * bs;
            let len = (1 + rand((65536 - offset) / bs)) * bs;
            let out = run(&data, size, offset, len, bs);
            check(&data, &out, offset, len, bs);
            assert_eq!(out.iter().map(|e| e.len).sum::<u64>(), len, "few enough extents for all of it");
        }
    }

    #[test]
    fn a_fragmented_file_is_described_a_prefix_at_a_time() {
        // Data in every other 4 KiB block: 256 extents in 1 MiB.
        let data: Vec<(u64, u64)> = (0..128).map(|i| (i * 8192, i * 8192 + 4096)).collect();
        let out = run(&data, 1 << 20, 0, 1 << 20, 4096);
        assert_eq!(out.len(), MAX_EXTENTS);
        check(&data, &out, 0, 1 << 20, 4096);
        assert_eq!(out.iter().map(|e| e.len).sum::<u64>(), MAX_EXTENTS as u64 * 4096);
        // The caller carries on from where the answer stopped.
        let next = run(&data, 1 << 20, 256 * 1024, 4096 * 3, 4096);
        assert_eq!(next, [ext(D, 4096), ext(H, 4096), ext(D, 4096)]);
    }

    #[test]
    fn a_file_that_cannot_tell_is_all_data() {
        let mut out = Vec::new();
        extents(4096, 8192, 512, |_, _| Seek::Unknown, &mut out);
        assert_eq!(out, [ext(D, 8192)]);
        // SEEK_DATA works but SEEK_HOLE then fails (the file changed): data to the end.
        out.clear();
        extents(
            0,
            8192,
            512,
            |f, at| if f == Find::Data { Seek::At(at + 1024) } else { Seek::Unknown },
            &mut out,
        );
        assert_eq!(out, [ext(H, 1024), ext(D, 7168)]);
    }

    /// Whether the file system under `file` reports holes (a fresh sparse file has no data).
    fn reports_holes(file: &std::fs::File) -> bool {
        use std::os::fd::AsRawFd;
        lseek(file.as_raw_fd(), Find::Data, 0) == Seek::Nothing
    }

    #[test]
    fn a_sparse_file_reports_its_holes() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(1 << 20).unwrap();
        let sparse = reports_holes(f.as_file());
        f.as_file().write_all_at(&[1u8; 4096], 0).unwrap();
        f.as_file().write_all_at(&[2u8; 4096], 512 * 1024).unwrap();
        // 512 bytes inside the block at 64 KiB.
        f.as_file().write_all_at(&[3u8; 512], 65536 + 1024).unwrap();
        f.flush().unwrap();
        let status = |bs: Option<u32>, offset: u64, len: u64| {
            let dev = UringDevice::new("u", f.path(), bs, false).unwrap();
            let mut out = Vec::new();
            dev.block_status(offset, len, &mut out).unwrap();
            out
        };
        if !sparse {
            // A file system without holes (or without SEEK_DATA): everything is data.
            assert_eq!(status(None, 0, 1 << 20), [ext(D, 1 << 20)]);
            return;
        }
        let whole = status(None, 0, 1 << 20);
        let data = [(0, 4096), (65536 + 1024, 65536 + 1536), (512 * 1024, 516 * 1024)];
        check(&data, &whole, 0, 1 << 20, 512);
        // Exact on a file system allocating 4 KiB blocks (ext4, xfs, btrfs, tmpfs on x86).
        if std::os::unix::fs::MetadataExt::blksize(&f.as_file().metadata().unwrap()) == 4096 {
            let expect = [
                ext(D, 4096),
                ext(H, 65536 - 4096),
                ext(D, 4096),
                ext(H, 512 * 1024 - 69632),
                ext(D, 4096),
                ext(H, 512 * 1024 - 4096),
            ];
            assert_eq!(whole, expect);
            // Mid-extent start and end.
            assert_eq!(status(None, 2048, 65536), [ext(D, 2048), ext(H, 65536 - 4096), ext(D, 2048)]);
        }
        // A device block coarser than the file system's: whole 64 KiB blocks.
        let coarse = status(Some(65536), 0, 1 << 20);
        assert_eq!(coarse, [ext(D, 131072), ext(H, 512 * 1024 - 131072), ext(D, 65536), ext(H, 448 * 1024)]);
        // Bad ranges are refused, naming the parameter.
        let dev = UringDevice::new("u", f.path(), None, false).unwrap();
        let field = |offset, len| match dev.block_status(offset, len, &mut Vec::new()) {
            Err(crate::BdevError::InvalidParam { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!((field(100, 512), field(1 << 20, 512)), ("offset", "offset"));
        assert_eq!((field(0, 0), field(0, 100), field(512, 1 << 20)), ("len", "len", "len"));
    }
}
