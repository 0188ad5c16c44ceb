//! `qemu:dirty-bitmap:NAME` end to end on a socket: the contexts a client lists and selects,
//! and the block status chunks it gets, one per selected context, read from the bitmaps' live
//! bits.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use fp_bdev::disk::{BitmapUse, DirtyBitmap};
use fp_bdev::RamDevice;

use super::{option, string, Setup};
use crate::proto::*;
use crate::ExportBitmap;

/// A RAM disk of `blocks` blocks of `block` bytes exported as "ram" with the bitmaps named
/// and of the granularities given (made here, so the test marks them by hand).
fn exported(
    block: u32,
    blocks: u64,
    bitmaps: &[(&str, u64)],
) -> (Setup, crate::ExportHandle, Vec<Arc<DirtyBitmap>>) {
    let bdev = Arc::new(RamDevice::new("ram", block, blocks).unwrap());
    let size = u64::from(block) * blocks;
    let made: Vec<Arc<DirtyBitmap>> =
        bitmaps.iter().map(|(n, g)| Arc::new(DirtyBitmap::new(n, size, *g, false, true))).collect();
    let spec = made
        .iter()
        .map(|b| ExportBitmap {
            name: b.name().to_string(),
            bitmap: BitmapUse::new(b.clone(), "the test export"),
        })
        .collect();
    let (setup, handle) = super::export_full(false, bdev, spec, |_| ());
    (setup, handle, made)
}

fn greeted(path: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes()).unwrap();
    assert_eq!(option(&mut s, OPT_STRUCTURED_REPLY, &[])[0].0, REP_ACK);
    s
}

/// A LIST or SET of `queries` on export "ram": the contexts answered, as (id, name).
fn meta(s: &mut UnixStream, opt: u32, queries: &[&str]) -> Vec<(u32, String)> {
    let mut q = Vec::new();
    string(&mut q, "ram");
    q.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for x in queries {
        string(&mut q, x);
    }
    let r = option(s, opt, &q);
    assert_eq!(r.last().unwrap().0, REP_ACK);
    r[..r.len() - 1]
        .iter()
        .map(|(kind, p)| {
            assert_eq!(*kind, REP_META_CONTEXT);
            (u32::from_be_bytes(p[..4].try_into().unwrap()), String::from_utf8(p[4..].to_vec()).unwrap())
        })
        .collect()
}

fn go(s: &mut UnixStream) {
    let mut d = Vec::new();
    string(&mut d, "ram");
    d.extend_from_slice(&0u16.to_be_bytes());
    assert_eq!(option(s, OPT_GO, &d).last().unwrap().0, REP_ACK);
}

/// A block status request's chunks, as (context id, [(length, flags)]), checking that only the
/// last is DONE.
fn block_status(s: &mut UnixStream, flags: u16, offset: u64, length: u32) -> Vec<(u32, Vec<(u32, u32)>)> {
    let r = Request { flags, command: CMD_BLOCK_STATUS, cookie: 77, offset, length };
    s.write_all(&r.encode()).unwrap();
    let mut chunks = Vec::new();
    loop {
        let mut h = [0u8; CHUNK_HEADER_LEN];
        s.read_exact(&mut h).unwrap();
        let done = u16::from_be_bytes([h[4], h[5]]) == REPLY_FLAG_DONE;
        assert_eq!(u16::from_be_bytes([h[6], h[7]]), REPLY_TYPE_BLOCK_STATUS);
        assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), 77);
        let mut p = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut p).unwrap();
        let id = u32::from_be_bytes(p[..4].try_into().unwrap());
        let extents = p[4..]
            .chunks(8)
            .map(|e| {
                (
                    u32::from_be_bytes(e[..4].try_into().unwrap()),
                    u32::from_be_bytes(e[4..].try_into().unwrap()),
                )
            })
            .collect();
        chunks.push((id, extents));
        if done {
            return chunks;
        }
    }
}

/// A block status request answered with an error chunk: its errno.
fn refused(s: &mut UnixStream, offset: u64, length: u32) -> u32 {
    let r = Request { flags: 0, command: CMD_BLOCK_STATUS, cookie: 9, offset, length };
    s.write_all(&r.encode()).unwrap();
    let mut h = [0u8; CHUNK_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u16::from_be_bytes([h[6], h[7]]), REPLY_TYPE_ERROR);
    let mut p = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
    s.read_exact(&mut p).unwrap();
    u32::from_be_bytes(p[..4].try_into().unwrap())
}

const D: u32 = STATE_DIRTY;

#[test]
fn list_offers_qemu_contexts_by_namespace_and_set_selects_by_full_name_only() {
    let (setup, handle, _) = exported(512, 8192, &[("b0", 65536), ("b1", 4096)]);
    let mut s = greeted(&setup.sock);
    let all = vec![
        (0, BASE_ALLOCATION.to_string()),
        (0, "qemu:dirty-bitmap:b0".to_string()),
        (0, "qemu:dirty-bitmap:b1".to_string()),
    ];
    assert_eq!(meta(&mut s, OPT_LIST_META_CONTEXT, &[]), all);
    assert_eq!(meta(&mut s, OPT_LIST_META_CONTEXT, &["qemu:"]), all[1..]);
    assert_eq!(meta(&mut s, OPT_LIST_META_CONTEXT, &["qemu:dirty-bitmap:"]), all[1..]);
    assert_eq!(
        meta(&mut s, OPT_LIST_META_CONTEXT, &["qemu:dirty-bitmap:b1", "base:"]),
        [all[0].clone(), all[2].clone()]
    );
    // Unknown names, other namespaces and a namespace alone select nothing in a SET.
    assert_eq!(
        meta(
            &mut s,
            OPT_SET_META_CONTEXT,
            &["qemu:", "qemu:dirty-bitmap:", "qemu:dirty-bitmap:zz", "qemu:allocation-depth", "x:y"]
        ),
        []
    );
    // Both kinds at once, each with its own id; the order of the queries does not matter.
    assert_eq!(
        meta(&mut s, OPT_SET_META_CONTEXT, &["qemu:dirty-bitmap:b1", "nope", BASE_ALLOCATION]),
        [
            (BASE_ALLOCATION_ID, BASE_ALLOCATION.to_string()),
            (FIRST_BITMAP_ID + 1, "qemu:dirty-bitmap:b1".to_string())
        ]
    );
    go(&mut s);
    let chunks = block_status(&mut s, 0, 0, 1 << 20);
    assert_eq!(chunks, [(BASE_ALLOCATION_ID, vec![(1 << 20, 0)]), (FIRST_BITMAP_ID + 1, vec![(1 << 20, 0)])]);
    drop(s);
    handle.stop();
}

#[test]
fn block_status_reports_dirty_runs_cut_to_the_request_and_req_one_gives_one_extent_per_context() {
    let (setup, handle, maps) = exported(512, 8192, &[("b0", 65536), ("b1", 4096)]);
    maps[0].mark(65536, 1); // b0: [64 KiB, 128 KiB)
    maps[1].mark(8192, 8192); // b1: [8 KiB, 16 KiB)
    maps[1].mark(100 * 4096, 4096);
    let mut s = greeted(&setup.sock);
    let set = meta(&mut s, OPT_SET_META_CONTEXT, &["qemu:dirty-bitmap:b0", "qemu:dirty-bitmap:b1"]);
    assert_eq!(set.iter().map(|c| c.0).collect::<Vec<_>>(), [FIRST_BITMAP_ID, FIRST_BITMAP_ID + 1]);
    go(&mut s);
    let whole = 8192 * 512;
    assert_eq!(
        block_status(&mut s, 0, 0, whole),
        [
            (FIRST_BITMAP_ID, vec![(65536, 0), (65536, D), (whole - 131072, 0)]),
            (
                FIRST_BITMAP_ID + 1,
                vec![(8192, 0), (8192, D), (100 * 4096 - 16384, 0), (4096, D), (whole - 101 * 4096, 0)]
            ),
        ]
    );
    // A request inside a chunk larger than itself, starting mid-chunk: cut to the request.
    assert_eq!(
        block_status(&mut s, 0, 70 * 1024, 1024),
        [(FIRST_BITMAP_ID, vec![(1024, D)]), (FIRST_BITMAP_ID + 1, vec![(1024, 0)])]
    );
    // A dirty run going on past the request's end stops at it.
    assert_eq!(
        block_status(&mut s, 0, 4096, 8192),
        [(FIRST_BITMAP_ID, vec![(8192, 0)]), (FIRST_BITMAP_ID + 1, vec![(4096, 0), (4096, D)])]
    );
    assert_eq!(
        block_status(&mut s, CMD_FLAG_REQ_ONE, 60 * 1024, 1 << 20),
        [(FIRST_BITMAP_ID, vec![(4096, 0)]), (FIRST_BITMAP_ID + 1, vec![(100 * 4096 - 60 * 1024, 0)])]
    );
    // The bits are read at each query: a write marked now shows at once.
    maps[1].mark(0, 1);
    assert_eq!(block_status(&mut s, CMD_FLAG_REQ_ONE, 0, 65536)[1], (FIRST_BITMAP_ID + 1, vec![(4096, D)]));
    // Past the end: EINVAL, as for base:allocation.
    assert_eq!(refused(&mut s, u64::from(whole), 512), EINVAL);
    drop(s);
    handle.stop();
}

#[test]
fn a_granularity_smaller_than_the_block_reports_whole_blocks_dirty_when_any_chunk_is() {
    let (setup, handle, maps) = exported(4096, 256, &[("fine", 512)]);
    maps[0].mark(4096 + 512, 512); // one 512-byte chunk inside block 1
    maps[0].mark(3 * 4096 + 3584, 1024); // the end of block 3 and the start of block 4
    let mut s = greeted(&setup.sock);
    meta(&mut s, OPT_SET_META_CONTEXT, &["qemu:dirty-bitmap:fine"]);
    go(&mut s);
    assert_eq!(
        block_status(&mut s, 0, 0, 256 * 4096),
        [(FIRST_BITMAP_ID, vec![(4096, 0), (4096, D), (4096, 0), (8192, D), (251 * 4096, 0)])]
    );
    drop(s);
    handle.stop();
}

#[test]
fn block_status_without_a_context_is_refused_and_a_held_bitmap_is_busy_until_the_export_stops() {
    let (setup, handle, maps) = exported(512, 8192, &[("b0", 65536)]);
    assert!(maps[0].busy());
    let mut s = greeted(&setup.sock);
    go(&mut s);
    assert_eq!(refused(&mut s, 0, 512), EINVAL);
    drop(s);
    handle.stop();
    drop(setup);
    assert!(!maps[0].busy(), "the export's hold ends with it");
}
