//! Fuzz the data path's ring walkers (`fp_virtq`, split and packed) and
//! `fp_virtio_blk::parse_chain` + `validate` with guest memory, rings and
//! descriptor chains that all come from the input.
//!
//! Input layout (little endian; missing bytes read as 0):
//!
//! | offset | size | meaning |
//! |-------:|-----:|---------|
//! | 0  | 1 | number of memory regions: `1 + b % 3` |
//! | 1  | 2 | first region's guest page number (address = n * 4 KiB) |
//! | 3  | 3 | region sizes: `(b % 16 + 1) * 4 KiB` each (4..64 KiB) |
//! | 6  | 2 | gap in pages before regions 2 and 3 (0 = adjacent) |
//! | 8  | 1 | queue size: `1 << (b % 9)` (1..256) |
//! | 9  | 2 | descriptor table / ring offset from the first region's start (16-aligned) |
//! | 11 | 2 | avail ring (split, 2-aligned) / driver area (packed, 4-aligned) offset |
//! | 13 | 2 | used ring (split, 4-aligned) / device area (packed, 4-aligned) offset |
//! | 15 | 2 | split: next_avail; packed: next avail slot (`% size`) and wrap bit 15 |
//! | 17 | 1 | disk flags: read_only, flush, discard, write_zeroes; bit 4: packed ring; bit 5: EVENT_IDX |
//! | 18 | 4 | capacity in sectors |
//! | 22 | 1 | block size: `1 << b` (bounded by `% 16`) |
//! | 23 | 1 | max discard / write-zeroes sectors (0 = unlimited) |
//! | 24 | .. | guest memory contents, from the first region's start on |
//!
//! Invariants checked: every iovec `parse_chain` returns, and the status byte
//! (on success and on error), lies entirely inside one region's host mapping,
//! and the iovec lengths add up to `data_len`; every request is completed into
//! the used ring and published without a fault. The fast paths give what the
//! general code gives: the split walker's (`walk` vs `walk_general`: the same
//! descriptors or the same error), the packed ring's (`pop` vs `pop_general` on a
//! second queue over the same ring: the same list, position and descriptors, or the
//! same error) and the parser's (`parse_chain` vs
//! `parse_chain_general`: the same request and iovecs, or the same error).
#![no_main]

use std::sync::Arc;

use fp_virtio_blk::{
    parse_chain, parse_chain_general, validate, DiskParams, GuestMemory, MemTable, ParseError, MAX_IOVECS,
};
use fp_virtq::{Chain, PackedQueue, PackedState, SplitQueue};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

const HEADER: usize = 24;
const PAGE: u64 = 0x1000;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&self, at: usize) -> u8 {
        self.0.get(at).copied().unwrap_or(0)
    }
    fn u16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.u8(at), self.u8(at + 1)])
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes([self.u8(at), self.u8(at + 1), self.u8(at + 2), self.u8(at + 3)])
    }
}

/// Host ranges `[start, end)` of every region.
fn host_ranges(mem: &GuestMemory) -> Vec<(usize, usize)> {
    mem.iter()
        .map(|r| {
            let start = mem.get_host_address(r.start_addr()).expect("region start is mapped") as usize;
            (start, start + r.len() as usize)
        })
        .collect()
}

fn inside_one_region(ranges: &[(usize, usize)], base: usize, len: usize) -> bool {
    ranges.iter().any(|&(s, e)| base >= s && base.checked_add(len).is_some_and(|end| end <= e))
}

fuzz_target!(|data: &[u8]| {
    let inp = Input(data);

    // ---- Guest memory. ----
    let nregions = 1 + usize::from(inp.u8(0) % 3);
    let mut ranges = Vec::with_capacity(nregions);
    let mut addr = u64::from(inp.u16(1)) * PAGE;
    for i in 0..nregions {
        if i > 0 {
            addr += u64::from(inp.u8(5 + i)) * PAGE;
        }
        let size = (u64::from(inp.u8(3 + i) % 16) + 1) * PAGE;
        ranges.push((GuestAddress(addr), size as usize));
        addr += size;
    }
    let base = ranges[0].0;
    let mem = match GuestMemory::from_ranges(&ranges) {
        Ok(m) => m,
        Err(_) => return,
    };
    // Contents: the rest of the input, from the first region's start on,
    // spilling into the following regions (gaps are skipped).
    let mut content = data.get(HEADER..).unwrap_or(&[]);
    for &(start, size) in &ranges {
        if content.is_empty() {
            break;
        }
        let n = content.len().min(size);
        mem.write_slice(&content[..n], start).expect("write inside a region");
        content = &content[n..];
    }

    // ---- Disk. ----
    let flags = inp.u8(17);
    let max = u32::from(inp.u8(23));
    let disk = DiskParams {
        capacity_sectors: u64::from(inp.u32(18)),
        block_size: 1u32 << (inp.u8(22) % 16),
        read_only: flags & 1 != 0,
        flush: flags & 2 != 0,
        discard: flags & 4 != 0,
        write_zeroes: flags & 8 != 0,
        max_discard_sectors: max,
        max_write_zeroes_sectors: max,
    };

    // ---- Ring. ----
    let size = 1u16 << (inp.u8(8) % 9);
    let event_idx = flags & 0x20 != 0;
    let Some(table) = MemTable::new(Arc::new(mem.clone())) else { return };
    let desc = base.0 + u64::from(inp.u16(9) & !15);
    let mut ring = if flags & 0x10 != 0 {
        let pos = inp.u16(15);
        let state = PackedState {
            next_avail: (pos & 0x7fff) % size,
            avail_wrap: pos & 0x8000 != 0,
            next_used: (pos & 0x7fff) % size,
            used_wrap: pos & 0x8000 != 0,
        };
        let driver = base.0 + u64::from(inp.u16(11) & !3);
        let device = base.0 + u64::from(inp.u16(13) & !3);
        match PackedQueue::new(&table, desc, driver, device, size, event_idx, state) {
            // The second queue, over the same ring, takes every list with the general loop.
            Ok(q) => {
                let general = PackedQueue::new(&table, desc, driver, device, size, event_idx, state)
                    .expect("the same parameters");
                Ring::Packed(q, general)
            }
            Err(_) => return,
        }
    } else {
        let avail = base.0 + u64::from(inp.u16(11) & !1);
        let used = base.0 + u64::from(inp.u16(13) & !3);
        let next = inp.u16(15);
        match SplitQueue::new(&table, desc, avail, used, size, event_idx, next, next) {
            Ok(q) => Ring::Split(q),
            Err(_) => return,
        }
    };

    // ---- Take, parse and complete every available chain. ----
    let host = host_ranges(&mem);
    let mut iov = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOVECS];
    let mut iov_general = iov.clone();
    let mut chain = Chain::new();
    let mut chain_general = Chain::new();
    for _ in 0..size {
        let (head, slots) = match &mut ring {
            Ring::Split(q) => match q.pop() {
                Ok(Some(h)) => {
                    let fast = q.walk(&table, h, &mut chain);
                    let general = q.walk_general(&table, h, &mut chain_general);
                    assert_eq!(fast, general, "split walker: fast path and general walk differ at head {h}");
                    if fast.is_ok() {
                        assert_eq!(
                            desc_fields(&chain),
                            desc_fields(&chain_general),
                            "split walker: fast path and general walk differ at head {h}"
                        );
                    }
                    match fast {
                        Ok(()) => (h, 1),
                        Err(e) => {
                            let _ = ParseError::from_walk(h, e).to_string();
                            break;
                        }
                    }
                }
                _ => break,
            },
            Ring::Packed(q, general) => {
                let fast = q.pop(&table, &mut chain);
                let slow = general.pop_general(&table, &mut chain_general);
                assert_eq!(fast, slow, "packed ring: fast path and general loop differ");
                // The available side only: the used side moves on `q` alone (completions).
                let avail = |s: fp_virtq::PackedState| (s.next_avail, s.avail_wrap);
                assert_eq!(avail(q.state()), avail(general.state()), "packed ring: positions differ");
                if let Ok(Some(_)) = fast {
                    assert_eq!(
                        desc_fields(&chain),
                        desc_fields(&chain_general),
                        "packed ring: fast path and general loop differ"
                    );
                }
                match fast {
                    Ok(Some(h)) => (h.id, h.slots),
                    _ => break,
                }
            }
        };
        let parsed = parse_chain(&table, &chain, head, &mut iov);
        let general = parse_chain_general(&table, &chain, head, &mut iov_general);
        assert_eq!(format!("{parsed:?}"), format!("{general:?}"), "parser: fast path and general parse differ");
        if let Ok(req) = &parsed {
            let cnt = req.iovcnt as usize;
            let same = iov[..cnt]
                .iter()
                .zip(&iov_general[..cnt])
                .all(|(a, b)| a.iov_base == b.iov_base && a.iov_len == b.iov_len);
            assert!(same, "parser: fast path and general parse give different iovecs: {req:?}");
        }
        match parsed {
            Ok(req) => {
                let cnt = req.iovcnt as usize;
                assert!(cnt <= iov.len(), "iovcnt {cnt} > capacity");
                let mut total = 0u64;
                for v in &iov[..cnt] {
                    assert!(v.iov_len > 0, "empty iovec returned: {req:?}");
                    assert!(
                        inside_one_region(&host, v.iov_base as usize, v.iov_len),
                        "iovec {:p}+{} outside guest memory: {req:?}",
                        v.iov_base,
                        v.iov_len
                    );
                    total += v.iov_len as u64;
                }
                assert_eq!(total, req.data_len, "iovec lengths do not add up: {req:?}");
                assert!(
                    inside_one_region(&host, req.status.as_ptr() as usize, 1),
                    "status byte outside guest memory: {req:?}"
                );
                let _ = validate(&req, &disk);
            }
            Err(e) => {
                if let Some(s) = e.status {
                    assert!(
                        inside_one_region(&host, s.as_ptr() as usize, 1),
                        "error status byte outside guest memory: {e:?}"
                    );
                }
                let _ = e.to_string();
            }
        }
        match &mut ring {
            Ring::Split(q) => q.push_used(head, 1),
            Ring::Packed(q, _) => q.push_used(head, 1, slots),
        }
    }
    match &mut ring {
        Ring::Split(q) => {
            q.publish();
            let _ = q.needs_notification();
            let _ = q.enable_notification();
        }
        Ring::Packed(q, _) => {
            q.publish();
            let _ = q.needs_notification();
            let _ = q.enable_notification();
        }
    }
});

enum Ring {
    Split(SplitQueue),
    /// The queue the data path would use, and one that takes the same lists with the general
    /// loop only.
    Packed(PackedQueue, PackedQueue),
}

/// What a walked chain holds, field by field, for comparing two walks.
fn desc_fields(c: &Chain) -> Vec<(u64, u32, bool, usize)> {
    c.descs().iter().map(|d| (d.addr, d.len, d.write, d.host() as usize)).collect()
}
