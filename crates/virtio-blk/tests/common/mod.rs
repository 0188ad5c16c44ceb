//! Shared helpers: a two-region guest memory, a queue at address 0 in either ring layout (split
//! or packed, chosen per run by [`both`]), and builders for descriptor chains and request
//! headers. Chains are written into guest memory exactly as a driver would and taken back with
//! the data path's own ring code (`fp_virtq`), so the parser is tested behind the real walker.
#![allow(dead_code)]

use std::cell::Cell;
use std::sync::Arc;

use fp_virtio_blk::{BlkRequest, Chain, GuestMemory, MemTable, ParseError};
use fp_virtq::{PackedQueue, PackedState, SplitQueue, WalkError};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

pub use fp_virtq::{
    DESC_F_AVAIL as F_AVAIL, DESC_F_INDIRECT as F_INDIRECT, DESC_F_NEXT as F_NEXT, DESC_F_WRITE as F_WRITE,
};

/// End of the first region / start of the second one.
pub const REGION_SPLIT: u64 = 0x1_0000;
/// End of guest memory.
pub const MEM_END: u64 = 0x2_0000;
/// Queue size used by [`queue`].
pub const QSIZE: u16 = 16;
/// Ring parts (either layout), all below 0x1000 where the tests put their buffers.
const DESC_TABLE: u64 = 0x0;
const AVAIL_OR_DRIVER: u64 = 0x100;
const USED_OR_DEVICE: u64 = 0x200;
/// Buffer id the packed ring's mock writes into every descriptor but the last of a list, to
/// show that the id is taken from the last one.
const DECOY_ID: u16 = 0x7777;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Split,
    Packed,
}

thread_local! {
    static LAYOUT: Cell<Layout> = const { Cell::new(Layout::Split) };
}

pub fn layout() -> Layout {
    LAYOUT.with(|l| l.get())
}

/// Runs `f` once with split rings and once with packed rings.
pub fn both(f: impl Fn()) {
    for l in [Layout::Split, Layout::Packed] {
        LAYOUT.with(|c| c.set(l));
        f();
    }
    LAYOUT.with(|c| c.set(Layout::Split));
}

/// Runs `f` with packed rings (cases the split format cannot express).
pub fn packed_only(f: impl Fn()) {
    LAYOUT.with(|c| c.set(Layout::Packed));
    f();
    LAYOUT.with(|c| c.set(Layout::Split));
}

/// A descriptor as a driver writes it: `next` is the split ring's link (ignored by packed rings,
/// whose lists are consecutive slots).
#[derive(Clone, Copy, Debug)]
pub struct RawDescriptor {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

impl RawDescriptor {
    pub fn addr_raw(&self) -> u64 {
        self.addr
    }
}

/// Two adjacent 64 KiB regions: [0, 0x10000) and [0x10000, 0x20000). Each is
/// a separate mmap, so a buffer crossing 0x10000 is not host-contiguous.
pub fn mem() -> GuestMemory {
    GuestMemory::from_ranges(&[
        (GuestAddress(0), REGION_SPLIT as usize),
        (GuestAddress(REGION_SPLIT), (MEM_END - REGION_SPLIT) as usize),
    ])
    .unwrap()
}

/// A queue over `mem`, in the current [`layout`].
pub struct Queue<'m> {
    pub mem: &'m GuestMemory,
    pub table: MemTable,
}

pub fn queue(mem: &GuestMemory) -> Queue<'_> {
    Queue { mem, table: MemTable::new(Arc::new(mem.clone())).unwrap() }
}

pub fn raw(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor { addr, len, flags, next }
}

/// Writes one descriptor at `at` in the current layout's format (a ring slot or an indirect
/// table entry). Packed descriptors get `id` and, when `avail` is set, the availability bits of
/// the first lap.
fn write_desc_as(mem: &GuestMemory, at: u64, d: RawDescriptor, id: u16, avail: bool) {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&d.addr.to_le_bytes());
    b[8..12].copy_from_slice(&d.len.to_le_bytes());
    match layout() {
        Layout::Split => {
            b[12..14].copy_from_slice(&d.flags.to_le_bytes());
            b[14..16].copy_from_slice(&d.next.to_le_bytes());
        }
        Layout::Packed => {
            let flags = if avail { d.flags | F_AVAIL } else { d.flags };
            b[12..14].copy_from_slice(&id.to_le_bytes());
            b[14..16].copy_from_slice(&flags.to_le_bytes());
        }
    }
    mem.write_slice(&b, GuestAddress(at)).unwrap();
}

/// Writes an indirect-table entry (or any descriptor outside the ring) at `at`.
pub fn write_desc(mem: &GuestMemory, at: u64, d: RawDescriptor) {
    write_desc_as(mem, at, d, DECOY_ID, false);
}

/// A chain taken from the ring (or the walker's refusal) with the head the used ring reports.
pub struct Walked<'q> {
    pub table: &'q MemTable,
    pub head: u16,
    pub chain: Result<Chain, WalkError>,
}

/// Makes the lists `chains` available in the ring (the split ring's heads are each list's first
/// table index; packed lists take consecutive slots) and takes them back.
pub fn pop_all<'q>(q: &'q Queue<'_>, chains: &[&[RawDescriptor]]) -> Vec<Walked<'q>> {
    let mut out = Vec::new();
    match layout() {
        Layout::Split => {
            let mut at = 0u16;
            let mut heads = Vec::new();
            for c in chains {
                heads.push(at);
                for d in c.iter() {
                    write_desc_as(q.mem, DESC_TABLE + 16 * u64::from(at), *d, 0, false);
                    at += 1;
                }
            }
            for (i, h) in heads.iter().enumerate() {
                q.mem.write_obj(*h, GuestAddress(AVAIL_OR_DRIVER + 4 + 2 * i as u64)).unwrap();
            }
            q.mem.write_obj(heads.len() as u16, GuestAddress(AVAIL_OR_DRIVER + 2)).unwrap();
            let mut ring =
                SplitQueue::new(&q.table, DESC_TABLE, AVAIL_OR_DRIVER, USED_OR_DEVICE, QSIZE, true, 0, 0)
                    .unwrap();
            while let Some(head) = ring.pop().unwrap() {
                let mut chain = Chain::new();
                let res = ring.walk(&q.table, head, &mut chain).map(|_| chain);
                // Every chain a test makes checks the walker's fast path against the general
                // walk: the same descriptors, or the same error.
                let mut general = Chain::new();
                let res_general = ring.walk_general(&q.table, head, &mut general).map(|_| general);
                assert_eq!(
                    res.as_ref().map(desc_fields).map_err(|e| *e),
                    res_general.as_ref().map(desc_fields).map_err(|e| *e),
                    "split walker: fast path and general walk differ"
                );
                out.push(Walked { table: &q.table, head, chain: res });
            }
        }
        Layout::Packed => {
            let mut slot = 0u64;
            for c in chains {
                for (i, d) in c.iter().enumerate() {
                    // The buffer id goes into the list's last descriptor (§2.8.6).
                    let id = if i + 1 == c.len() { 0 } else { DECOY_ID };
                    assert!(slot < u64::from(QSIZE), "packed mock: lists longer than the ring");
                    write_desc_as(q.mem, DESC_TABLE + 16 * slot, *d, id, true);
                    slot += 1;
                }
            }
            let mut ring = PackedQueue::new(
                &q.table,
                DESC_TABLE,
                AVAIL_OR_DRIVER,
                USED_OR_DEVICE,
                QSIZE,
                true,
                PackedState::START,
            )
            .unwrap();
            loop {
                let mut chain = Chain::new();
                match ring.pop(&q.table, &mut chain) {
                    Ok(Some(h)) => out.push(Walked { table: &q.table, head: h.id, chain: Ok(chain) }),
                    Ok(None) => break,
                    Err(e) => {
                        out.push(Walked { table: &q.table, head: 0, chain: Err(e) });
                        break;
                    }
                }
            }
        }
    }
    out
}

/// Stores `descs` verbatim at ring index 0.. and takes the chain headed at 0.
pub fn chain_raw<'q>(q: &'q Queue<'_>, descs: &[RawDescriptor]) -> Walked<'q> {
    pop_all(q, &[descs]).into_iter().next().expect("a chain was made available")
}

/// `(addr, len, writable)` entries linked 0 -> 1 -> ... (NEXT on all but the last).
pub fn linked(descs: &[(u64, u32, bool)]) -> Vec<RawDescriptor> {
    descs
        .iter()
        .enumerate()
        .map(|(i, &(addr, len, w))| {
            let mut flags = if w { F_WRITE } else { 0 };
            if i + 1 < descs.len() {
                flags |= F_NEXT;
            }
            raw(addr, len, flags, (i + 1) as u16)
        })
        .collect()
}

/// A linear chain of `(addr, len, writable)` descriptors at ring index 0..
pub fn chain<'q>(q: &'q Queue<'_>, descs: &[(u64, u32, bool)]) -> Walked<'q> {
    chain_raw(q, &linked(descs))
}

/// A walked chain's descriptors, field by field (for comparing two walks).
pub fn desc_fields(c: &Chain) -> Vec<(u64, u32, bool, usize)> {
    c.descs().iter().map(|d| (d.addr, d.len, d.write, d.host() as usize)).collect()
}

/// Parses a walked chain the way the data path does, and checks that the general parser gives
/// the same request, iovecs or error (the fast path must not be observable).
pub fn parse(w: Walked<'_>, iov: &mut [libc::iovec]) -> Result<BlkRequest, ParseError> {
    match w.chain {
        Ok(c) => {
            let res = fp_virtio_blk::parse_chain(w.table, &c, w.head, iov);
            let mut iov_general = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; iov.len()];
            let general = fp_virtio_blk::parse_chain_general(w.table, &c, w.head, &mut iov_general);
            assert_eq!(
                format!("{res:?}"),
                format!("{general:?}"),
                "parser: fast path and general parse differ"
            );
            if let Ok(r) = &res {
                let n = r.iovcnt as usize;
                let pairs = |v: &[libc::iovec]| {
                    v.iter().map(|x| (x.iov_base as usize, x.iov_len)).collect::<Vec<_>>()
                };
                assert_eq!(pairs(&iov[..n]), pairs(&iov_general[..n]), "parser: iovecs differ");
            }
            res
        }
        Err(e) => Err(ParseError::from_walk(w.head, e)),
    }
}

/// Write an indirect table of `(addr, len, writable)` entries at `table`,
/// linked 0 -> 1 -> ...; returns its byte length.
pub fn write_indirect(mem: &GuestMemory, table: u64, descs: &[(u64, u32, bool)]) -> u32 {
    for (i, d) in linked(descs).into_iter().enumerate() {
        write_desc(mem, table + 16 * i as u64, d);
    }
    (descs.len() * 16) as u32
}

/// Write a request header at `addr`.
pub fn header(mem: &GuestMemory, addr: u64, ty: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&ty.to_le_bytes());
    h[4..8].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(addr)).unwrap();
}

/// Write a discard / write-zeroes segment at `addr`.
pub fn segment(mem: &GuestMemory, addr: u64, sector: u64, num: u32, flags: u32) {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&sector.to_le_bytes());
    s[8..12].copy_from_slice(&num.to_le_bytes());
    s[12..16].copy_from_slice(&flags.to_le_bytes());
    mem.write_slice(&s, GuestAddress(addr)).unwrap();
}

pub fn host(mem: &GuestMemory, addr: u64) -> *mut u8 {
    mem.get_host_address(GuestAddress(addr)).unwrap()
}

pub fn byte(mem: &GuestMemory, addr: u64) -> u8 {
    mem.read_obj::<u8>(GuestAddress(addr)).unwrap()
}

pub fn iovs() -> Vec<libc::iovec> {
    vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; fp_virtio_blk::MAX_IOVECS]
}

/// Fresh two-region memory and queue; when `ty` is given, a request header
/// of that type (sector 0) at 0x1000; then parse the linear chain `descs`.
/// The memory is returned so the request's pointers stay valid.
pub fn parse_linear(
    ty: Option<u32>,
    descs: &[(u64, u32, bool)],
) -> (GuestMemory, Result<fp_virtio_blk::BlkRequest, fp_virtio_blk::ParseError>) {
    let m = mem();
    let res = {
        let q = queue(&m);
        if let Some(ty) = ty {
            header(&m, 0x1000, ty, 0);
        }
        parse(chain(&q, descs), &mut iovs())
    };
    (m, res)
}
