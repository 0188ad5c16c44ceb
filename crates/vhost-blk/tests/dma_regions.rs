//! Guest memory reaches the process's DMA map over the protocol: after SET_MEM_TABLE the
//! region the back-end mapped is registered (so an NVMe PCIe driver below hands guest buffers
//! to its device without a copy), and after the front-end disconnects it is gone.

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{memfd, Fixture};
use fp_bdev::dma::{memory_map, DmaRegion};
use vhost::vhost_user::message::VhostUserVirtioFeatures;
use vhost::vhost_user::Frontend;
use vhost::{VhostBackend, VhostUserMemoryRegionInfo};

/// A size no other registrant in this test process uses, to find the back-end's mapping.
const MEM: u64 = 0x5_3000;

fn guest_regions() -> Vec<DmaRegion> {
    memory_map().regions().iter().filter(|r| r.len as u64 == MEM).copied().collect()
}

#[test]
fn the_memory_table_is_registered_until_disconnect() {
    let f = Fixture::new();
    let fe = Frontend::from_stream(UnixStream::connect(&f.sock).unwrap(), 1);
    fe.set_owner().unwrap();
    fe.set_features((1 << 32) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()).unwrap();
    let file = memfd(MEM);
    file.write_all_at(b"guest bytes", 0x1234).unwrap();
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: MEM,
        userspace_addr: 0x7f00_0000_0000,
        mmap_offset: 0,
        mmap_handle: file.as_raw_fd(),
    };
    fe.set_mem_table(&[region]).unwrap();
    // SET_MEM_TABLE has no reply without REPLY_ACK: a request that has one comes back after
    // the table was applied (messages are served in order).
    fe.get_features().unwrap();
    let r = match guest_regions()[..] {
        [r] => r,
        ref other => panic!("one guest region expected in the DMA map, found {other:?}"),
    };
    // It is the back-end's mapping of the front-end's memory, at the IOVA a device would use.
    let vaddr = memory_map().vaddr_of(r.iova + 0x1234, 11).unwrap();
    // SAFETY: the back-end keeps the region mapped while the connection lives (it does here);
    // 11 bytes inside it.
    let seen = unsafe { std::slice::from_raw_parts(vaddr as *const u8, 11) };
    assert_eq!(seen, b"guest bytes");

    drop(fe);
    // The connection's thread notices the hang-up and drops its memory table.
    let start = Instant::now();
    while !guest_regions().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "guest memory still registered after disconnect");
        std::thread::sleep(Duration::from_millis(5));
    }
}
