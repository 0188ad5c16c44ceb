//! Hostile / malformed chains: every rejection path of `parse_chain`, plus a
//! deterministic pseudo-random chain generator checking that parsing never
//! panics and never yields a buffer outside guest memory.

mod common;

use common::*;
use fp_virtio_blk::*;

fn parse_err(c: Walked<'_>) -> ParseError {
    parse_err_with(c, &mut iovs())
}

fn parse_err_with(c: Walked<'_>, iov: &mut [libc::iovec]) -> ParseError {
    match parse(c, iov) {
        Ok(r) => panic!("unexpectedly parsed: {r:?}"),
        Err(e) => e,
    }
}

/// Expect `kind` with the status byte located at guest address `status`.
fn expect_status(m: &GuestMemory, e: &ParseError, kind: ParseErrorKind, status: u64) {
    assert_eq!(e.kind, kind, "{e}");
    let s = e.status.expect("status located");
    assert_eq!(s.as_ptr(), host(m, status));
    assert_eq!(e.status_code(), kind.status_code());
}

/// Expect `kind` without a status byte (the caller must fail the queue).
fn expect_fatal(e: &ParseError, kind: ParseErrorKind) {
    assert_eq!(e.kind, kind, "{e}");
    assert!(e.status.is_none(), "{e}: status should not be located");
}

#[test]
fn data_descriptor_outside_memory() {
    both(|| {
        let (m, r) = parse_linear(
            Some(VIRTIO_BLK_T_IN),
            &[(0x1000, 16, false), (0x10_0000, 512, true), (0x3000, 1, true)],
        );
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::DescriptorOutOfMemory, 0x3000);
    });
}

#[test]
fn header_descriptor_outside_memory() {
    both(|| {
        let (m, r) = parse_linear(None, &[(MEM_END + 0x1000, 16, false), (0x3000, 1, true)]);
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::DescriptorOutOfMemory, 0x3000);
    });
}

#[test]
fn status_outside_memory() {
    both(|| {
        let (_m, r) = parse_linear(
            Some(VIRTIO_BLK_T_IN),
            &[(0x1000, 16, false), (0x2000, 512, true), (MEM_END, 1, true)],
        );
        expect_fatal(&r.unwrap_err(), ParseErrorKind::DescriptorOutOfMemory);
        // Status at the very top of the address space (addr + len overflows).
        let (_m, r) = parse_linear(Some(VIRTIO_BLK_T_FLUSH), &[(0x1000, 16, false), (u64::MAX - 1, 8, true)]);
        expect_fatal(&r.unwrap_err(), ParseErrorKind::DescriptorOutOfMemory);
    });
}

#[test]
fn length_crossing_end_of_memory() {
    both(|| {
        let (m, r) = parse_linear(
            Some(VIRTIO_BLK_T_OUT),
            &[(0x1000, 16, false), (MEM_END - 0x100, 0x200, false), (0x3000, 1, true)],
        );
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::DescriptorOutOfMemory, 0x3000);
        // Writable data crossing the end, with the status inside the same buffer
        // (its last byte) out of memory too.
        let (_m, r) =
            parse_linear(Some(VIRTIO_BLK_T_IN), &[(0x1000, 16, false), (MEM_END - 0x100, 0x201, true)]);
        expect_fatal(&r.unwrap_err(), ParseErrorKind::DescriptorOutOfMemory);
    });
}

#[test]
fn address_wrapping_around_u64() {
    both(|| {
        let (m, r) = parse_linear(
            Some(VIRTIO_BLK_T_OUT),
            &[(0x1000, 16, false), (u64::MAX - 10, 512, false), (0x3000, 1, true)],
        );
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::DescriptorOutOfMemory, 0x3000);
    });
}

#[test]
fn four_gib_lengths() {
    both(|| {
        // A single 4 GiB - 1 descriptor plus the header exceeds the 2^32-byte
        // chain limit: the iterator stops early -> broken chain.
        let (_m, r) = parse_linear(
            Some(VIRTIO_BLK_T_IN),
            &[(0x1000, 16, false), (0x2000, u32::MAX, true), (0x3000, 1, true)],
        );
        expect_fatal(&r.unwrap_err(), ParseErrorKind::BrokenChain);
        // Just under the limit but far beyond guest memory.
        let (m, r) = parse_linear(
            Some(VIRTIO_BLK_T_IN),
            &[(0x1000, 16, false), (0x2000, 0xFFFF_0000, true), (0x3000, 1, true)],
        );
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::DescriptorOutOfMemory, 0x3000);
        // Two descriptors whose sum exceeds 2^32.
        let (_m, r) = parse_linear(
            Some(VIRTIO_BLK_T_OUT),
            &[
                (0x1000, 16, false),
                (0x2000, 0x8000_0000, false),
                (0x2000, 0x8000_0000, false),
                (0x3000, 1, true),
            ],
        );
        expect_fatal(&r.unwrap_err(), ParseErrorKind::BrokenChain);
    });
}

#[test]
fn loop_in_descriptor_table() {
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_IN, 0);
    let c = chain_raw(&q, &[raw(0x1000, 16, F_NEXT, 1), raw(0x2000, 512, F_NEXT | F_WRITE, 0)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
    // Self loop on the last (writable) descriptor.
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_IN, 0);
    let c = chain_raw(&q, &[raw(0x1000, 16, F_NEXT, 1), raw(0x2000, 1, F_NEXT | F_WRITE, 1)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
}

#[test]
fn chain_longer_than_queue() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, 0);
        // Every descriptor of the table has NEXT: the chain visits all QSIZE
        // entries and wants one more.
        let mut d = vec![raw(0x1000, 16, F_NEXT, 1)];
        for i in 1..QSIZE {
            d.push(raw(0x2000 + 512 * u64::from(i), 512, F_NEXT, (i + 1) % QSIZE));
        }
        let c = chain_raw(&q, &d);
        expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
    });
}

#[test]
fn next_index_out_of_range() {
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
    let c = chain_raw(&q, &[raw(0x1000, 16, F_NEXT, 100)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
}

#[test]
fn indirect_table_outside_memory() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        let c = chain_raw(&q, &[raw(MEM_END + 0x1000, 48, F_INDIRECT, 0)]);
        expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
        // Table starting inside memory but running past its end.
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
        let t = MEM_END - 16;
        write_indirect(&m, t, &[(0x1000, 16, false)]);
        // Entry 0 is valid and has no NEXT; make it point to a second entry.
        write_desc(&m, t, raw(0x1000, 16, F_NEXT, 1));
        let c = chain_raw(&q, &[raw(t, 32, F_INDIRECT, 0)]);
        expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
    });
}

#[test]
fn nested_indirect() {
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
    // Inner table (valid on its own).
    let inner = write_indirect(&m, 0x9000, &[(0x1000, 16, false), (0x3000, 1, true)]);
    // Outer table whose first entry is itself indirect.
    write_desc(&m, 0x8000, raw(0x9000, inner, F_INDIRECT, 0));
    let c = chain_raw(&q, &[raw(0x8000, 16, F_INDIRECT, 0)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
    // Nested indirect after a valid entry.
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
    let inner = write_indirect(&m, 0x9000, &[(0x3000, 1, true)]);
    write_desc(&m, 0x8000, raw(0x1000, 16, F_NEXT, 1));
    write_desc(&m, 0x8010, raw(0x9000, inner, F_INDIRECT, 0));
    let c = chain_raw(&q, &[raw(0x8000, 32, F_INDIRECT, 0)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
}

#[test]
fn bad_indirect_tables() {
    // Length not a multiple of 16.
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
    write_indirect(&m, 0x8000, &[(0x1000, 16, false), (0x3000, 1, true)]);
    let c = chain_raw(&q, &[raw(0x8000, 24, F_INDIRECT, 0)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
    // Empty table.
    let m = mem();
    let q = queue(&m);
    let c = chain_raw(&q, &[raw(0x8000, 0, F_INDIRECT, 0)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
    // `next` beyond the table.
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
    write_indirect(&m, 0x8000, &[(0x1000, 16, false), (0x3000, 1, true)]);
    write_desc(&m, 0x8000, raw(0x1000, 16, F_NEXT, 5));
    let c = chain_raw(&q, &[raw(0x8000, 32, F_INDIRECT, 0)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
    // Loop inside the table.
    let m = mem();
    let q = queue(&m);
    header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
    write_indirect(&m, 0x8000, &[(0x1000, 16, false), (0x3000, 1, true)]);
    write_desc(&m, 0x8010, raw(0x3000, 1, F_WRITE | F_NEXT, 0));
    let c = chain_raw(&q, &[raw(0x8000, 32, F_INDIRECT, 0)]);
    expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
}

#[test]
fn chain_beyond_hard_descriptor_limit() {
    both(|| {
        // An indirect table may hold up to 65535 entries; we stop at MAX_CHAIN_DESCRIPTORS.
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
        let mut d = vec![(0x1000, 16, false)];
        d.extend(std::iter::repeat_n((0x2000, 0, false), MAX_CHAIN_DESCRIPTORS));
        d.push((0x3000, 1, true));
        let len = write_indirect(&m, 0x8000, &d);
        let c = chain_raw(&q, &[raw(0x8000, len, F_INDIRECT, 0)]);
        expect_fatal(&parse_err(c), ParseErrorKind::ChainTooLong);
        // Exactly at the limit is accepted.
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
        let mut d = vec![(0x1000, 16, false)];
        d.extend(std::iter::repeat_n((0x2000, 0, false), MAX_CHAIN_DESCRIPTORS - 2));
        d.push((0x3000, 1, true));
        let len = write_indirect(&m, 0x8000, &d);
        let c = chain_raw(&q, &[raw(0x8000, len, F_INDIRECT, 0)]);
        assert_eq!(parse(c, &mut iovs()).unwrap().kind, RequestType::Flush);
    });
}

#[test]
fn zero_length_descriptors() {
    both(|| {
        // Only zero-length descriptors.
        let (_m, r) = parse_linear(None, &[(0x1000, 0, false), (0x3000, 0, true)]);
        expect_fatal(&r.unwrap_err(), ParseErrorKind::NoStatus);
        // Zero-length descriptors anywhere (even readable ones after writable
        // ones, or outside memory) are ignored.
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 0);
        let c = chain(
            &q,
            &[
                (0x3000, 0, true),
                (0x1000, 16, false),
                (MEM_END + 0x1000, 0, false),
                (0x2000, 512, true),
                (0x5000, 0, false),
                (0x3000, 1, true),
                (0x4000, 0, false),
            ],
        );
        let r = parse(c, &mut iovs()).unwrap();
        assert_eq!((r.kind, r.iovcnt, r.data_len), (RequestType::In, 1, 512));
        assert_eq!(r.status.as_ptr(), host(&m, 0x3000));
    });
}

#[test]
fn status_in_read_only_descriptor() {
    both(|| {
        let (_m, r) = parse_linear(
            Some(VIRTIO_BLK_T_IN),
            &[(0x1000, 16, false), (0x2000, 512, true), (0x3000, 1, false)],
        );
        expect_fatal(&r.unwrap_err(), ParseErrorKind::StatusNotWritable);
    });
}

#[test]
fn no_writable_descriptor() {
    both(|| {
        let (_m, r) = parse_linear(
            Some(VIRTIO_BLK_T_OUT),
            &[(0x1000, 16, false), (0x2000, 512, false), (0x3000, 1, false)],
        );
        expect_fatal(&r.unwrap_err(), ParseErrorKind::NoStatus);
    });
}

#[test]
fn writable_before_readable() {
    both(|| {
        let (m, r) = parse_linear(
            Some(VIRTIO_BLK_T_IN),
            &[(0x2000, 512, true), (0x1000, 16, false), (0x3000, 1, true)],
        );
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::ReadableAfterWritable, 0x3000);
    });
}

#[test]
fn header_shorter_than_16_bytes() {
    both(|| {
        let (m, r) = parse_linear(None, &[(0x1000, 8, false), (0x3000, 1, true)]);
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::HeaderTooShort, 0x3000);
        // 15 bytes over two descriptors.
        let (m, r) = parse_linear(None, &[(0x1000, 8, false), (0x1100, 7, false), (0x3000, 1, true)]);
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::HeaderTooShort, 0x3000);
        // No readable descriptor at all.
        let (m, r) = parse_linear(None, &[(0x2000, 512, true), (0x3000, 1, true)]);
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::HeaderTooShort, 0x3000);
    });
}

#[test]
fn too_many_segments() {
    both(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, 0);
        let c = chain(
            &q,
            &[
                (0x1000, 16, false),
                (0x2000, 512, false),
                (0x2400, 512, false),
                (0x2800, 512, false),
                (0x3000, 1, true),
            ],
        );
        let mut small = iovs();
        expect_status(&m, &parse_err_with(c, &mut small[..2]), ParseErrorKind::TooManySegments, 0x3000);
        // One descriptor split by a region boundary needs two iovecs.
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 0);
        let c = chain(&q, &[(0x1000, 16, false), (REGION_SPLIT - 512, 1024, true), (0x3000, 1, true)]);
        let mut small = iovs();
        expect_status(&m, &parse_err_with(c, &mut small[..1]), ParseErrorKind::TooManySegments, 0x3000);
    });
}

#[test]
fn max_iovecs_through_indirect_table() {
    both(|| {
        // header + MAX_IOVECS data segments + status is accepted; one more is not.
        for (n, ok) in [(MAX_IOVECS, true), (MAX_IOVECS + 1, false)] {
            let m = mem();
            let q = queue(&m);
            header(&m, 0x1000, VIRTIO_BLK_T_OUT, 0);
            let mut d = vec![(0x1000, 16, false)];
            // Non-adjacent 16-byte pieces in the second region.
            d.extend((0..n as u64).map(|i| (REGION_SPLIT + 32 * i, 16, false)));
            d.push((0x3000, 1, true));
            let len = write_indirect(&m, 0x4000, &d);
            let c = chain_raw(&q, &[raw(0x4000, len, F_INDIRECT, 0)]);
            let mut iov = iovs();
            let res = parse(c, &mut iov);
            if ok {
                let r = res.unwrap();
                assert_eq!((r.iovcnt as usize, r.data_len), (n, 16 * n as u64));
            } else {
                assert_eq!(res.unwrap_err().kind, ParseErrorKind::TooManySegments);
            }
        }
    });
}

#[test]
fn bad_discard_payloads() {
    both(|| {
        for ty in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
            for payload in [0u32, 8, 15, 17, 32] {
                let m = mem();
                let q = queue(&m);
                header(&m, 0x1000, ty, 0);
                segment(&m, 0x1010, 0, 8, 0);
                segment(&m, 0x1020, 8, 8, 0);
                let c = chain(&q, &[(0x1000, 16 + payload, false), (0x3000, 1, true)]);
                expect_status(&m, &parse_err(c), ParseErrorKind::BadDiscardPayload, 0x3000);
            }
            // Reserved flag bits -> UNSUPP (§5.2.6.2).
            for flags in [2u32, 0x8000_0000, 0xffff_fffe] {
                let m = mem();
                let q = queue(&m);
                header(&m, 0x1000, ty, 0);
                segment(&m, 0x1010, 0, 8, flags);
                let c = chain(&q, &[(0x1000, 32, false), (0x3000, 1, true)]);
                let e = parse_err(c);
                expect_status(&m, &e, ParseErrorKind::UnsupportedFlags, 0x3000);
                assert_eq!(e.status_code(), VIRTIO_BLK_S_UNSUPP);
            }
            // Extra writable bytes besides the status.
            let m = mem();
            let q = queue(&m);
            header(&m, 0x1000, ty, 0);
            segment(&m, 0x1010, 0, 8, 0);
            let c = chain(&q, &[(0x1000, 32, false), (0x3000, 2, true)]);
            expect_status(&m, &parse_err(c), ParseErrorKind::UnexpectedWritable, 0x3001);
        }
        // The unmap flag on a discard -> UNSUPP.
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_DISCARD, 0);
        segment(&m, 0x1010, 0, 8, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
        let c = chain(&q, &[(0x1000, 32, false), (0x3000, 1, true)]);
        expect_status(&m, &parse_err(c), ParseErrorKind::UnsupportedFlags, 0x3000);
    });
}

#[test]
fn unexpected_bytes_for_type() {
    both(|| {
        // IN with readable bytes after the header.
        let (m, r) = parse_linear(Some(VIRTIO_BLK_T_IN), &[(0x1000, 32, false), (0x2000, 513, true)]);
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::UnexpectedReadable, 0x2200);
        // OUT with a writable data buffer.
        let (m, r) = parse_linear(
            Some(VIRTIO_BLK_T_OUT),
            &[(0x1000, 16, false), (0x2000, 512, true), (0x3000, 1, true)],
        );
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::UnexpectedWritable, 0x3000);
        // FLUSH with data either way.
        let (m, r) = parse_linear(Some(VIRTIO_BLK_T_FLUSH), &[(0x1000, 16 + 512, false), (0x3000, 1, true)]);
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::UnexpectedReadable, 0x3000);
        let (m, r) = parse_linear(Some(VIRTIO_BLK_T_FLUSH), &[(0x1000, 16, false), (0x3000, 9, true)]);
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::UnexpectedWritable, 0x3008);
        // GET_ID with readable bytes after the header.
        let (m, r) = parse_linear(Some(VIRTIO_BLK_T_GET_ID), &[(0x1000, 17, false), (0x2000, 21, true)]);
        expect_status(&m, &r.unwrap_err(), ParseErrorKind::UnexpectedReadable, 0x2014);
    });
}

/// Small deterministic generator (xorshift64*), no external crate needed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_desc(rng: &mut Rng) -> RawDescriptor {
    let addr = match rng.below(8) {
        0 => MEM_END - rng.below(0x40),
        1 => REGION_SPLIT - rng.below(0x40),
        2 => u64::MAX - rng.below(0x40),
        3 => 0x8000 + 16 * rng.below(8), // the indirect table area
        4 => 0x1000 + 16 * rng.below(4), // the header area
        _ => 0x1000 + rng.below(MEM_END),
    };
    let len = match rng.below(8) {
        0 => 0,
        1 => 1,
        2 => 16,
        3 => 32,
        4 => u32::MAX - rng.below(32) as u32,
        5 => 16 * rng.below(6) as u32, // plausible indirect table sizes
        _ => rng.below(0x3000) as u32,
    };
    let flags = (rng.below(8) as u16) & (F_NEXT | F_WRITE | F_INDIRECT);
    let next = rng.below(u64::from(QSIZE) + 4) as u16;
    raw(addr, len, flags, next)
}

/// A well-formed-looking linear chain (header, 0..6 data buffers, status),
/// then 0..2 random mutations.
fn plausible_chain(rng: &mut Rng) -> Vec<RawDescriptor> {
    let write_data = rng.below(2) == 0;
    let mut d: Vec<(u64, u32, u16)> = vec![(0x1000 + 16 * rng.below(4), 16, 0)];
    for _ in 0..rng.below(7) {
        let addr = 0x9000 + rng.below(MEM_END - 0xA000);
        let len = 512 * (1 + rng.below(8) as u32);
        d.push((addr, len, if write_data { F_WRITE } else { 0 }));
    }
    d.push((0x3000 + rng.below(64), 1, F_WRITE));
    for _ in 0..rng.below(3) {
        let i = rng.below(d.len() as u64) as usize;
        match rng.below(4) {
            0 => d[i].0 = random_desc(rng).addr_raw(),
            1 => d[i].1 = rng.below(0x2000) as u32,
            2 => d[i].2 ^= F_WRITE,
            _ => {
                let j = rng.below(d.len() as u64) as usize;
                d.swap(i, j)
            }
        }
    }
    let n = d.len();
    d.iter()
        .enumerate()
        .map(|(i, &(a, l, f))| {
            let f = if i + 1 < n { f | F_NEXT } else { f };
            raw(a, l, f, (i + 1) as u16)
        })
        .collect()
}

fn iov_in_memory(m: &GuestMemory, v: &libc::iovec) -> bool {
    let p = v.iov_base as usize;
    [(0u64, REGION_SPLIT), (REGION_SPLIT, MEM_END)].iter().any(|&(start, end)| {
        let base = host(m, start) as usize;
        p >= base && p + v.iov_len <= base + (end - start) as usize
    })
}

#[test]
fn random_chains_never_escape_memory() {
    both(|| {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let types = [0u32, 1, 4, 8, 11, 13, 2, 0xffff_ffff];
        let (mut ok, mut err) = (0, 0);
        // Miri interprets every instruction: a hundredth of the chains still walks every path.
        let rounds = if cfg!(miri) { 30 } else { 3000 };
        for _ in 0..rounds {
            let m = mem();
            let q = queue(&m);
            for i in 0..4u64 {
                let ty = types[rng.below(types.len() as u64) as usize];
                header(&m, 0x1000 + 16 * i, ty, rng.below(1 << 20));
            }
            for i in 0..8u64 {
                let d = random_desc(&mut rng);
                write_desc(&m, 0x8000 + 16 * i, d);
            }
            let descs = if rng.below(2) == 0 {
                let n = 1 + rng.below(u64::from(QSIZE)) as usize;
                (0..n).map(|_| random_desc(&mut rng)).collect()
            } else {
                plausible_chain(&mut rng)
            };
            let c = chain_raw(&q, &descs);
            let mut iov = iovs();
            let cap = 1 + rng.below(MAX_IOVECS as u64) as usize;
            match parse(c, &mut iov[..cap]) {
                Ok(r) => {
                    ok += 1;
                    assert!(r.iovcnt as usize <= cap);
                    let iov = &iov[..r.iovcnt as usize];
                    assert_eq!(iov.iter().map(|v| v.iov_len as u64).sum::<u64>(), r.data_len);
                    assert!(iov.iter().all(|v| v.iov_len > 0 && iov_in_memory(&m, v)));
                    let s = libc::iovec { iov_base: r.status.as_ptr().cast(), iov_len: 1 };
                    assert!(iov_in_memory(&m, &s));
                }
                Err(e) => {
                    err += 1;
                    if let Some(s) = e.status {
                        let s = libc::iovec { iov_base: s.as_ptr().cast(), iov_len: 1 };
                        assert!(iov_in_memory(&m, &s));
                    }
                }
            }
        }
        assert!(err > 0);
        eprintln!("random chains: {ok} parsed, {err} rejected");
    });
}

#[test]
fn packed_indirect_descriptor_inside_a_list() {
    // §2.8.7: an indirect descriptor is never linked by NEXT (split rings allow one at the end
    // of a chain, packed rings do not).
    packed_only(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
        let len = write_indirect(&m, 0x8000, &[(0x3000, 1, true)]);
        let c = chain_raw(&q, &[raw(0x1000, 16, F_NEXT, 1), raw(0x8000, len, F_INDIRECT, 0)]);
        expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
        // Nor may it carry NEXT itself.
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_FLUSH, 0);
        let len = write_indirect(&m, 0x8000, &[(0x1000, 16, false), (0x3000, 1, true)]);
        let c = chain_raw(&q, &[raw(0x8000, len, F_INDIRECT | F_NEXT, 1), raw(0x3000, 1, F_WRITE, 0)]);
        expect_fatal(&parse_err(c), ParseErrorKind::BrokenChain);
    });
}

#[test]
fn packed_indirect_tables_ignore_reserved_flags() {
    // §2.8.7: in a packed indirect table only WRITE counts; NEXT, INDIRECT and the id are
    // reserved and ignored, so entries are taken in order and a nested-looking entry is data.
    packed_only(|| {
        let m = mem();
        let q = queue(&m);
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, 3);
        write_desc(&m, 0x8000, raw(0x1000, 16, 0, 9));
        write_desc(&m, 0x8010, raw(0x2000, 512, F_INDIRECT | F_NEXT, 0));
        write_desc(&m, 0x8020, raw(0x3000, 1, F_WRITE, 0));
        let c = chain_raw(&q, &[raw(0x8000, 48, F_INDIRECT, 0)]);
        let mut iov = iovs();
        let r = parse(c, &mut iov).unwrap();
        assert_eq!((r.kind, r.sector, r.iovcnt, r.data_len), (RequestType::Out, 3, 1, 512));
        assert_eq!(r.status.as_ptr(), host(&m, 0x3000));
    });
}
