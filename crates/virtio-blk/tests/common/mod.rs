//! Shared helpers: a two-region guest memory, a mock split queue at address 0
//! and builders for descriptor chains and request headers.
#![allow(dead_code)]

use fp_virtio_blk::GuestMemory;
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;

/// End of the first region / start of the second one.
pub const REGION_SPLIT: u64 = 0x1_0000;
/// End of guest memory.
pub const MEM_END: u64 = 0x2_0000;
/// Queue size used by [`queue`].
pub const QSIZE: u16 = 16;

/// Two adjacent 64 KiB regions: [0, 0x10000) and [0x10000, 0x20000). Each is
/// a separate mmap, so a buffer crossing 0x10000 is not host-contiguous.
pub fn mem() -> GuestMemory {
    GuestMemory::from_ranges(&[
        (GuestAddress(0), REGION_SPLIT as usize),
        (GuestAddress(REGION_SPLIT), (MEM_END - REGION_SPLIT) as usize),
    ])
    .unwrap()
}

pub fn queue(mem: &GuestMemory) -> MockSplitQueue<'_, GuestMemory> {
    MockSplitQueue::new(mem, QSIZE)
}

pub fn raw(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags, next))
}

/// Store `descs` verbatim at table index 0.. and pop the chain headed at 0.
pub fn chain_raw<'q>(
    q: &'q MockSplitQueue<'_, GuestMemory>,
    descs: &[RawDescriptor],
) -> DescriptorChain<&'q GuestMemory> {
    q.build_multiple_desc_chains(descs).unwrap()
}

/// A linear chain of `(addr, len, writable)` descriptors at table index 0..
pub fn chain<'q>(
    q: &'q MockSplitQueue<'_, GuestMemory>,
    descs: &[(u64, u32, bool)],
) -> DescriptorChain<&'q GuestMemory> {
    let v: Vec<RawDescriptor> = descs
        .iter()
        .enumerate()
        .map(|(i, &(addr, len, w))| {
            let mut flags = if w { F_WRITE } else { 0 };
            if i + 1 < descs.len() {
                flags |= F_NEXT;
            }
            raw(addr, len, flags, (i + 1) as u16)
        })
        .collect();
    chain_raw(q, &v)
}

/// Write an indirect table of `(addr, len, writable)` entries at `table`,
/// linked 0 -> 1 -> ...; returns its byte length.
pub fn write_indirect(mem: &GuestMemory, table: u64, descs: &[(u64, u32, bool)]) -> u32 {
    for (i, &(addr, len, w)) in descs.iter().enumerate() {
        let mut flags = if w { F_WRITE } else { 0 };
        if i + 1 < descs.len() {
            flags |= F_NEXT;
        }
        mem.write_obj(raw(addr, len, flags, (i + 1) as u16), GuestAddress(table + 16 * i as u64)).unwrap();
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
        fp_virtio_blk::parse_chain(chain(&q, descs), &mut iovs())
    };
    (m, res)
}
