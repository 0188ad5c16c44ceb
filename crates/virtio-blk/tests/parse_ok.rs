//! Well-formed chains: every request type, various descriptor framings,
//! buffers crossing a memory-region boundary, indirect tables.

mod common;

use common::*;
use fp_virtio_blk::*;

fn status_roundtrip(mem: &GuestMemory, req: &BlkRequest, status_addr: u64) {
    assert_eq!(req.status.as_ptr(), host(mem, status_addr));
    req.status.write(VIRTIO_BLK_S_UNSUPP);
    assert_eq!(byte(mem, status_addr), VIRTIO_BLK_S_UNSUPP);
}

#[test]
fn in_one_descriptor_per_part() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 8);
        let c = chain(&q, &[(0x1000, 16, false), (0x2000, 4096, true), (0x3000, 1, true)]);
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!(r.head, 0);
        assert_eq!(r.kind, RequestType::In);
        assert_eq!(r.sector, 8);
        assert_eq!(r.iovcnt, 1);
        assert_eq!(r.data_len, 4096);
        assert_eq!(r.segment, None);
        assert_eq!(r.writable_len, 4097);
        assert_eq!(iov[0].iov_base.cast::<u8>(), host(&m, 0x2000));
        assert_eq!(iov[0].iov_len, 4096);
        status_roundtrip(&m, &r, 0x3000);
    });
}

#[test]
fn out_header_and_data_in_one_descriptor() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, 0x40);
        let c = chain(&q, &[(0x1000, 16 + 1024, false), (0x3000, 1, true)]);
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!(r.kind, RequestType::Out);
        assert_eq!(r.sector, 0x40);
        assert_eq!(r.iovcnt, 1);
        assert_eq!(r.data_len, 1024);
        assert_eq!(r.writable_len, 1);
        assert_eq!(iov[0].iov_base.cast::<u8>(), host(&m, 0x1010));
        assert_eq!(iov[0].iov_len, 1024);
        status_roundtrip(&m, &r, 0x3000);
    });
}

#[test]
fn in_data_and_status_in_one_descriptor() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 0);
        let c = chain(&q, &[(0x1000, 16, false), (0x2000, 513, true)]);
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!(r.kind, RequestType::In);
        assert_eq!((r.iovcnt, r.data_len, r.writable_len), (1, 512, 513));
        assert_eq!(iov[0].iov_base.cast::<u8>(), host(&m, 0x2000));
        status_roundtrip(&m, &r, 0x2200);
    });
}

#[test]
fn out_header_split_over_two_descriptors_and_multi_segment_data() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, 77);
        // Move the second half of the header to 0x1100.
        let mut second = [0u8; 8];
        vm_memory::Bytes::read_slice(&m, &mut second, vm_memory::GuestAddress(0x1008)).unwrap();
        vm_memory::Bytes::write_slice(&m, &second, vm_memory::GuestAddress(0x1100)).unwrap();
        // Second descriptor: 8 header bytes followed by 512 data bytes.
        let c = chain(
            &q,
            &[
                (0x1000, 8, false),
                (0x1100, 8 + 512, false),
                (0x4000, 0, false), // zero-length: skipped
                (0x5000, 1024, false),
                (0x3000, 1, true),
            ],
        );
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!(r.kind, RequestType::Out);
        assert_eq!(r.sector, 77);
        assert_eq!((r.iovcnt, r.data_len), (2, 1536));
        assert_eq!(iov[0].iov_base.cast::<u8>(), host(&m, 0x1108));
        assert_eq!(iov[0].iov_len, 512);
        assert_eq!(iov[1].iov_base.cast::<u8>(), host(&m, 0x5000));
        assert_eq!(iov[1].iov_len, 1024);
    });
}

#[test]
fn in_data_split_across_memory_regions() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 0);
        let start = REGION_SPLIT - 0x800;
        let c = chain(&q, &[(0x1000, 16, false), (start, 0x1000, true), (0x3000, 1, true)]);
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!((r.iovcnt, r.data_len), (2, 0x1000));
        assert_eq!(iov[0].iov_base.cast::<u8>(), host(&m, start));
        assert_eq!(iov[0].iov_len, 0x800);
        assert_eq!(iov[1].iov_base.cast::<u8>(), host(&m, REGION_SPLIT));
        assert_eq!(iov[1].iov_len, 0x800);
    });
}

#[test]
fn header_and_status_crossing_regions() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        // Header straddles the region boundary; status is the last byte of a
        // writable buffer that also straddles it.
        let h = REGION_SPLIT - 8;
        header(&m, h, VIRTIO_BLK_T_IN, 5);
        let w = REGION_SPLIT + 0x100 - 0x200;
        let c = chain(&q, &[(h, 16, false), (w, 0x201, true)]);
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!(r.sector, 5);
        assert_eq!((r.iovcnt, r.data_len), (2, 0x200));
        status_roundtrip(&m, &r, w + 0x200);
    });
}

#[test]
fn flush() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
        let c = chain(&q, &[(0x1000, 16, false), (0x3000, 1, true)]);
        let r = parse(c, &mut iovs()).unwrap();
        assert_eq!(r.kind, RequestType::Flush);
        assert_eq!((r.iovcnt, r.data_len, r.writable_len), (0, 0, 1));
    });
}

#[test]
fn get_id_full_and_short_buffers() {
    both(|| {
        let id = *b"flashpath-serial-001";
        for (buf_len, expect) in [(20u32, 20u32), (8, 8), (64, 20)] {
            let m = mem();
            let q = queue(&m);
            header(&m, 0x1000, VIRTIO_BLK_T_GET_ID, 0);
            let c = chain(&q, &[(0x1000, 16, false), (0x2000, buf_len, true), (0x3000, 1, true)]);
            let mut iov = iovs();
            let r = parse(c, &mut iov).unwrap();
            assert_eq!(r.kind, RequestType::GetId);
            assert_eq!(r.data_len, u64::from(buf_len));
            assert_eq!(r.writable_len, expect + 1);
            let n = write_id(&q.table, &iov[..r.iovcnt as usize], &id);
            assert_eq!(n, expect);
            let mut got = vec![0u8; buf_len as usize];
            vm_memory::Bytes::read_slice(&m, &mut got, vm_memory::GuestAddress(0x2000)).unwrap();
            assert_eq!(&got[..expect as usize], &id[..expect as usize]);
            assert!(got[expect as usize..].iter().all(|&b| b == 0));
        }
    });
}

#[test]
fn get_id_split_across_regions() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_GET_ID, 0);
        let start = REGION_SPLIT - 7;
        let c = chain(&q, &[(0x1000, 16, false), (start, 21, true)]);
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!((r.iovcnt, r.data_len), (2, 20));
        let id = *b"ABCDEFGHIJKLMNOPQRST";
        assert_eq!(write_id(&q.table, &iov[..2], &id), 20);
        let mut got = [0u8; 20];
        vm_memory::Bytes::read_slice(&m, &mut got, vm_memory::GuestAddress(start)).unwrap();
        assert_eq!(got, id);
    });
}

#[test]
fn discard_and_write_zeroes() {
    both(|| {
        for (ty, flags, kind) in [
            (VIRTIO_BLK_T_DISCARD, 0, RequestType::Discard),
            (VIRTIO_BLK_T_WRITE_ZEROES, 0, RequestType::WriteZeroes),
            (VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP, RequestType::WriteZeroes),
        ] {
            let m = mem();
            let q = queue(&m);
            header(&m, 0x1000, ty, 0);
            segment(&m, 0x1010, 4096, 128, flags);
            // Header + payload in one descriptor.
            let c = chain(&q, &[(0x1000, 32, false), (0x3000, 1, true)]);
            let r = parse(c, &mut iovs()).unwrap();
            assert_eq!(r.kind, kind);
            assert_eq!(r.segment, Some(Segment { sector: 4096, num_sectors: 128, unmap: flags != 0 }));
            assert_eq!((r.iovcnt, r.writable_len), (0, 1));

            // Header and payload in separate descriptors.
            let m = mem();
            let q = queue(&m);
            header(&m, 0x1000, ty, 0);
            segment(&m, 0x2000, 8, 16, flags);
            let c = chain(&q, &[(0x1000, 16, false), (0x2000, 16, false), (0x3000, 1, true)]);
            let r = parse(c, &mut iovs()).unwrap();
            assert_eq!(r.segment.unwrap().sector, 8);
            assert_eq!(r.segment.unwrap().num_sectors, 16);
        }
    });
}

#[test]
fn unsupported_type_parses() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, 2, 0); // VIRTIO_BLK_T_SCSI_CMD
        let c = chain(&q, &[(0x1000, 64, false), (0x2000, 100, true)]);
        let r = parse(c, &mut iovs()).unwrap();
        assert_eq!(r.kind, RequestType::Unsupported(2));
        assert_eq!((r.iovcnt, r.writable_len), (0, 1));
        status_roundtrip(&m, &r, 0x2000 + 99);
    });
}

#[test]
fn indirect_chain() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 3);
        let len = write_indirect(
            &m,
            0x8000,
            &[(0x1000, 16, false), (0x2000, 512, true), (0x2400, 512, true), (0x3000, 1, true)],
        );
        let c = chain_raw(&q, &[raw(0x8000, len, F_INDIRECT, 0)]);
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!(r.kind, RequestType::In);
        assert_eq!((r.sector, r.iovcnt, r.data_len), (3, 2, 1024));
        assert_eq!(iov[1].iov_base.cast::<u8>(), host(&m, 0x2400));
        status_roundtrip(&m, &r, 0x3000);
    });
}

#[test]
fn direct_descriptor_followed_by_indirect_table() {
    // Split rings only: a packed list may not link an indirect descriptor (parse_hostile).
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_OUT, 9);
    let len = write_indirect(&m, 0x8000, &[(0x2000, 4096, false), (0x3000, 1, true)]);
    let c = chain_raw(&q, &[raw(0x1000, 16, F_NEXT, 1), raw(0x8000, len, F_INDIRECT, 0)]);
    let r = parse(c, &mut iovs()).unwrap();
    assert_eq!((r.kind, r.sector, r.data_len), (RequestType::Out, 9, 4096));
}

#[test]
fn ring_pop_and_parse_sequence() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, 1);
        header(&m, 0x1100, VIRTIO_BLK_T_FLUSH, 0);
        // Two chains in one ring: [0, 1, 2] and [3, 4].
        let first = [raw(0x1000, 16, F_NEXT, 1), raw(0x2000, 512, F_NEXT, 2), raw(0x3000, 1, F_WRITE, 0)];
        let second = [raw(0x1100, 16, F_NEXT, 4), raw(0x3001, 1, F_WRITE, 0)];
        let mut kinds = vec![];
        let mut heads = vec![];
        for w in pop_all(&q, &[&first, &second]) {
            let r = parse(w, &mut iovs()).unwrap();
            kinds.push(r.kind);
            heads.push(r.head);
        }
        assert_eq!(kinds, vec![RequestType::Out, RequestType::Flush]);
        // Split rings report the head index; packed rings the list's buffer id (0 in the mock).
        let expected = if layout() == Layout::Split { vec![0, 3] } else { vec![0, 0] };
        assert_eq!(heads, expected);
    });
}
