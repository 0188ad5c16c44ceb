//! `validate` semantics and config space / feature bits.

use fp_virtio_blk::config::*;
use fp_virtio_blk::*;

fn disk() -> DiskParams {
    DiskParams {
        capacity_sectors: 1 << 21, // 1 GiB
        block_size: 4096,
        read_only: false,
        flush: true,
        discard: true,
        write_zeroes: true,
        max_discard_sectors: 1 << 16,
        max_write_zeroes_sectors: 1 << 15,
    }
}

fn req(kind: RequestType, sector: u64, data_len: u64) -> BlkRequest {
    BlkRequest {
        head: 0,
        kind,
        sector,
        iovcnt: 1,
        data_len,
        segment: None,
        status: StatusPtr::DETACHED,
        writable_len: 1,
    }
}

fn seg_req(kind: RequestType, sector: u64, num_sectors: u32) -> BlkRequest {
    let mut r = req(kind, 0, 0);
    r.segment = Some(Segment { sector, num_sectors, unmap: false });
    r
}

const IOERR: Result<(), u8> = Err(VIRTIO_BLK_S_IOERR);
const UNSUPP: Result<(), u8> = Err(VIRTIO_BLK_S_UNSUPP);

#[test]
fn read_write_ok_and_ranges() {
    let d = disk();
    let cap = d.capacity_sectors;
    for k in [RequestType::In, RequestType::Out] {
        assert_eq!(validate(&req(k, 0, 4096), &d), Ok(()));
        assert_eq!(validate(&req(k, cap - 8, 4096), &d), Ok(()), "last block");
        assert_eq!(validate(&req(k, cap - 8, 8192), &d), IOERR, "past the end");
        assert_eq!(validate(&req(k, cap, 4096), &d), IOERR, "at capacity");
        assert_eq!(validate(&req(k, u64::MAX - 7, 4096), &d), IOERR, "overflow");
        assert_eq!(validate(&req(k, u64::MAX, 4096), &d), IOERR, "overflow");
        assert_eq!(validate(&req(k, (u64::MAX / 512) & !7, 4096), &d), IOERR);
        assert_eq!(validate(&req(k, 0, 0), &d), IOERR, "empty");
        assert_eq!(validate(&req(k, 0, 512), &d), IOERR, "below block size");
        assert_eq!(validate(&req(k, 0, 4097), &d), IOERR, "not a sector multiple");
        assert_eq!(validate(&req(k, 1, 4096), &d), IOERR, "misaligned sector");
        assert_eq!(validate(&req(k, 4, 4096), &d), IOERR, "misaligned sector");
    }
    // 512-byte disk: sector granularity.
    let d512 = DiskParams { block_size: 512, ..d };
    assert_eq!(validate(&req(RequestType::In, 3, 1536), &d512), Ok(()));
    assert_eq!(validate(&req(RequestType::In, 3, 100), &d512), IOERR);
    // A bogus block size falls back to 512.
    let dbad = DiskParams { block_size: 1000, ..d };
    assert_eq!(validate(&req(RequestType::In, 1, 512), &dbad), Ok(()));
    // u64::MAX capacity: overflow-safe.
    let dmax = DiskParams { capacity_sectors: u64::MAX, block_size: 512, ..d };
    assert_eq!(validate(&req(RequestType::In, u64::MAX - 1, 512), &dmax), Ok(()));
    assert_eq!(validate(&req(RequestType::In, u64::MAX - 1, 1024), &dmax), IOERR);
    assert_eq!(validate(&req(RequestType::In, u64::MAX, 512), &dmax), IOERR);
}

#[test]
fn read_only_disk() {
    let d = DiskParams { read_only: true, ..disk() };
    assert_eq!(validate(&req(RequestType::In, 0, 4096), &d), Ok(()));
    assert_eq!(validate(&req(RequestType::Out, 0, 4096), &d), IOERR);
    assert_eq!(validate(&seg_req(RequestType::Discard, 0, 8), &d), IOERR);
    assert_eq!(validate(&seg_req(RequestType::WriteZeroes, 0, 8), &d), IOERR);
    assert_eq!(validate(&req(RequestType::Flush, 0, 0), &d), Ok(()));
    assert_eq!(validate(&req(RequestType::GetId, 0, 20), &d), Ok(()));
}

#[test]
fn unsupported_and_disabled_features() {
    let d = disk();
    assert_eq!(validate(&req(RequestType::Unsupported(2), 0, 0), &d), UNSUPP);
    assert_eq!(validate(&req(RequestType::Unsupported(u32::MAX), 0, 0), &d), UNSUPP);
    let off = DiskParams { flush: false, discard: false, write_zeroes: false, ..d };
    assert_eq!(validate(&req(RequestType::Flush, 0, 0), &off), UNSUPP);
    assert_eq!(validate(&seg_req(RequestType::Discard, 0, 8), &off), UNSUPP);
    assert_eq!(validate(&seg_req(RequestType::WriteZeroes, 0, 8), &off), UNSUPP);
    // Disabled takes precedence over read-only.
    let off_ro = DiskParams { read_only: true, ..off };
    assert_eq!(validate(&seg_req(RequestType::Discard, 0, 8), &off_ro), UNSUPP);
    // GET_ID with a short buffer is fine.
    assert_eq!(validate(&req(RequestType::GetId, 0, 4), &d), Ok(()));
}

#[test]
fn discard_write_zeroes_bounds() {
    let d = disk();
    let cap = d.capacity_sectors;
    for (k, max) in [
        (RequestType::Discard, d.max_discard_sectors),
        (RequestType::WriteZeroes, d.max_write_zeroes_sectors),
    ] {
        assert_eq!(validate(&seg_req(k, 8, 8), &d), Ok(()));
        assert_eq!(validate(&seg_req(k, 0, max), &d), Ok(()));
        assert_eq!(validate(&seg_req(k, 0, max + 8), &d), IOERR, "above max");
        assert_eq!(validate(&seg_req(k, 0, 0), &d), IOERR, "empty");
        assert_eq!(validate(&seg_req(k, 1, 8), &d), IOERR, "misaligned start");
        assert_eq!(validate(&seg_req(k, 0, 9), &d), IOERR, "misaligned length");
        assert_eq!(validate(&seg_req(k, cap - 8, 16), &d), IOERR, "past the end");
        assert_eq!(validate(&seg_req(k, u64::MAX - 7, 8), &d), IOERR, "overflow");
        assert_eq!(validate(&req(k, 0, 0), &d), IOERR, "no segment");
    }
    // 0 = unlimited.
    let unl = DiskParams { max_discard_sectors: 0, capacity_sectors: u64::MAX, ..d };
    assert_eq!(validate(&seg_req(RequestType::Discard, 0, 0xFFFF_FFF8), &unl), Ok(()));
}

#[test]
fn config_layout() {
    assert_eq!(std::mem::size_of::<VirtioBlkConfig>(), 60);
    assert_eq!(VIRTIO_BLK_CONFIG_SIZE, 60);
    let c = config_space(&disk(), 4);
    let b = c.to_bytes();
    assert_eq!(b.len(), 60);
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap());
    assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 1 << 21); // capacity
    assert_eq!(u32_at(8), 0); // size_max
    assert_eq!(u32_at(12), SEG_MAX); // seg_max
    assert_eq!(&b[16..20], &[0, 0, 0, 0]); // geometry
    assert_eq!(u32_at(20), 4096); // blk_size
    assert_eq!(&b[24..32], &[0; 8]); // topology
    assert_eq!(b[32], 1); // writeback (flush offered)
    assert_eq!(b[33], 0); // unused0
    assert_eq!(u16_at(34), 4); // num_queues
    assert_eq!(u32_at(36), 1 << 16); // max_discard_sectors
    assert_eq!(u32_at(40), 1); // max_discard_seg
    assert_eq!(u32_at(44), 8); // discard_sector_alignment (4096 / 512)
    assert_eq!(u32_at(48), 1 << 15); // max_write_zeroes_sectors
    assert_eq!(u32_at(52), 1); // max_write_zeroes_seg
    assert_eq!(b[56], 1); // write_zeroes_may_unmap
    assert_eq!(&b[57..60], &[0, 0, 0]); // unused1
}

#[test]
fn config_without_optional_features() {
    let d = DiskParams {
        flush: false,
        discard: false,
        write_zeroes: false,
        max_discard_sectors: 0,
        max_write_zeroes_sectors: 0,
        block_size: 512,
        ..disk()
    };
    let c = config_space(&d, 1);
    let b = c.to_bytes();
    assert_eq!(b[32], 0);
    assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 512);
    assert!(b[36..60].iter().all(|&x| x == 0));
    // Unlimited maxima are advertised as u32::MAX.
    let d2 = DiskParams { discard: true, write_zeroes: true, ..d };
    let c2 = config_space(&d2, 1);
    let b2 = c2.to_bytes();
    assert_eq!(&b2[36..40], &[0xff; 4]);
    assert_eq!(&b2[48..52], &[0xff; 4]);
}

#[test]
fn feature_bits() {
    let base: u64 = [34, 32, 29, 28, 2, 6, 12].iter().map(|b| 1u64 << b).sum();
    let d = disk();
    assert_eq!(device_features(&d), base | (1 << 9) | (1 << 13) | (1 << 14));
    let ro = DiskParams { read_only: true, flush: false, discard: false, write_zeroes: false, ..d };
    assert_eq!(device_features(&ro), base | (1 << 5));
    assert_eq!((VIRTIO_F_VERSION_1, VIRTIO_F_RING_PACKED), (32, 34));
    assert_eq!(VIRTIO_RING_F_EVENT_IDX, 29);
    assert_eq!(VIRTIO_RING_F_INDIRECT_DESC, 28);
    assert_eq!(
        [VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH],
        [2, 5, 6, 9]
    );
    assert_eq!([VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES], [12, 13, 14]);
}

#[test]
fn config_bytes_are_the_structs_memory_image() {
    let c = VirtioBlkConfig {
        capacity: 0x0102_0304_0506_0708,
        size_max: 0x090a_0b0c,
        seg_max: 0x0d0e_0f10,
        geometry: VirtioBlkGeometry { cylinders: 0x1112, heads: 0x13, sectors: 0x14 },
        blk_size: 0x1516_1718,
        topology: VirtioBlkTopology {
            physical_block_exp: 0x19,
            alignment_offset: 0x1a,
            min_io_size: 0x1b1c,
            opt_io_size: 0x1d1e_1f20,
        },
        writeback: 0x21,
        unused0: 0x22,
        num_queues: 0x2324,
        max_discard_sectors: 0x2526_2728,
        max_discard_seg: 0x292a_2b2c,
        discard_sector_alignment: 0x2d2e_2f30,
        max_write_zeroes_sectors: 0x3132_3334,
        max_write_zeroes_seg: 0x3536_3738,
        write_zeroes_may_unmap: 0x39,
        unused1: [0x3a, 0x3b, 0x3c],
    };
    // SAFETY: a packed struct of integers: 60 initialised bytes, no padding.
    let image = unsafe { std::slice::from_raw_parts((&c as *const VirtioBlkConfig).cast::<u8>(), 60) };
    assert_eq!(&c.to_bytes()[..], image);
}
