//! The checks every block device must pass (conformance). A module's tests call [`run_suite`]
//! with a function building its device, a module in another crate included (with this crate's
//! `conformance` feature in its dev-dependencies); the helpers below serve their own checks.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::iov::BounceBuf;
use crate::{BdevError, BlockDevice, IoChannel, IoOp, IoRequest, IoStatus, IovSlices, Iovecs, SubmitError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Whether a device keeps what is written, which decides the checks that apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Writes read back (RAM, files, stacked devices over them): every check.
    Keeps,
    /// Nothing is kept (null): only the checks on ranges and completions.
    Discards,
}

/// Every check that applies, each on a fresh device from `make`: zeroed, of at least 64
/// blocks, unclaimed by anything else.
pub fn run_suite(make: &dyn Fn() -> Arc<dyn BlockDevice>, storage: Storage) {
    check_range_rejected(&*make());
    check_completion_via_poll(&*make());
    if storage == Storage::Discards {
        return;
    }
    random_write_read_verify(&*make(), 0xc0f0_0001, 10, Layout::Mixed);
    check_flush_discard_write_zeroes(&*make());
    check_iov_len_mismatch(&*make());
    check_channel_per_thread(make());
}

/// How test buffers are laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// 4096-aligned base, every iovec a multiple of 512 bytes: eligible for O_DIRECT.
    Aligned,
    /// Odd base address and iovecs cut at arbitrary bytes.
    Unaligned,
    /// Either, chosen per request.
    Mixed,
}

/// Most iovecs a request over an [`IoBuf`] is cut into.
pub const MAX_PARTS: usize = 16;

/// A data buffer placed at a chosen alignment, and the requests that carry it.
///
/// Its requests ([`IoBuf::request`], [`IoBuf::request_cut`]) point into the buffer: keep it,
/// and leave it alone, until they have completed (as for a [`BounceBuf`]).
pub struct IoBuf {
    /// One byte more than asked for, so an unaligned buffer starts at byte 1.
    buf: BounceBuf,
    start: usize,
    len: usize,
    /// The iovecs of the latest request.
    cuts: IovSlices,
}

impl IoBuf {
    /// A zeroed buffer of `len` bytes, starting on a page boundary when `aligned`, one byte past one otherwise.
    pub fn new(len: usize, aligned: bool) -> IoBuf {
        // One byte past a page boundary is misaligned for any direct-I/O granularity.
        let start = usize::from(!aligned);
        IoBuf { buf: BounceBuf::zeroed(len + 1), start, len, cuts: IovSlices::new(MAX_PARTS) }
    }

    /// The buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf.bytes()[self.start..self.start + self.len]
    }

    /// The buffer's bytes, for writing.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf.bytes_mut()[self.start..self.start + self.len]
    }

    /// Random cuts of the buffer into at most `max_parts` pieces, at multiples of `grain` bytes.
    fn cut_points(&self, rng: &mut SmallRng, max_parts: usize, grain: usize) -> Vec<usize> {
        let len = self.len;
        let mut cuts: Vec<usize> = (1..rng.gen_range(1..=max_parts))
            .map(|_| rng.gen_range(0..=len / grain) * grain)
            .filter(|&c| c > 0 && c < len)
            .collect();
        cuts.push(0);
        cuts.push(len);
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }

    /// The buffer cut into at most `max_parts` iovecs, at multiples of `grain` bytes (for
    /// [`rw`]).
    pub fn iovecs(&mut self, rng: &mut SmallRng, max_parts: usize, grain: usize) -> Vec<libc::iovec> {
        let cuts = self.cut_points(rng, max_parts, grain);
        let base = self.bytes_mut().as_mut_ptr();
        cuts.windows(2)
            .map(|w| libc::iovec { iov_base: base.wrapping_add(w[0]).cast(), iov_len: w[1] - w[0] })
            .collect()
    }

    /// The whole buffer as one iovec (for [`rw`]).
    pub fn iovec(&mut self) -> libc::iovec {
        libc::iovec { iov_base: self.bytes_mut().as_mut_ptr().cast(), iov_len: self.len }
    }

    /// A read or write of the whole buffer, as one iovec, at `offset`.
    pub fn request(&mut self, tag: u32, op: IoOp, offset: u64) -> IoRequest {
        self.request_over([self.len as u64], tag, op, offset)
    }

    /// A read or write of the whole buffer at `offset`, cut into at most `max_parts` (up to
    /// [`MAX_PARTS`]) iovecs at random multiples of `grain` bytes.
    pub fn request_cut(
        &mut self,
        rng: &mut SmallRng,
        max_parts: usize,
        grain: usize,
        tag: u32,
        op: IoOp,
        offset: u64,
    ) -> IoRequest {
        let cuts = self.cut_points(rng, max_parts.min(MAX_PARTS), grain);
        self.request_over(cuts.windows(2).map(|w| (w[1] - w[0]) as u64), tag, op, offset)
    }

    fn request_over(
        &mut self,
        lens: impl IntoIterator<Item = u64>,
        tag: u32,
        op: IoOp,
        offset: u64,
    ) -> IoRequest {
        let whole = self.buf.iovecs(self.start + self.len);
        let iov = self.cuts.cut(&whole, self.start as u64, lens).expect("at most MAX_PARTS pieces");
        IoRequest { tag, op, offset, len: iov.total_len(), iov }
    }
}

/// A read or write over `iov`, whose lengths give `len`.
///
/// # Safety
/// As for [`Iovecs::from_slice`]: `iov` and the buffers it describes outlive the request.
pub unsafe fn rw(tag: u32, op: IoOp, offset: u64, iov: &[libc::iovec]) -> IoRequest {
    let len = iov.iter().map(|v| v.iov_len as u64).sum();
    // SAFETY: passed on from our caller.
    IoRequest { tag, op, offset, len, iov: unsafe { Iovecs::from_slice(iov) } }
}

/// A request without data (flush, discard, write zeroes).
pub fn cmd(tag: u32, op: IoOp, offset: u64, len: u64) -> IoRequest {
    IoRequest { tag, op, offset, len, iov: Iovecs::NONE }
}

/// Polls until `want` completions arrived; fails after 20 s.
pub fn poll_until(ch: &mut dyn IoChannel, want: usize) -> Vec<(u32, IoStatus)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.len() < want {
        ch.poll(&mut |tag, status| got.push((tag, status)));
        assert!(Instant::now() < deadline, "only {} of {want} completions in 20 s", got.len());
        if got.len() < want {
            std::thread::yield_now();
        }
    }
    assert_eq!(got.len(), want, "more completions than requests");
    got
}

/// Submits every request (tag `i` at index `i`), retrying on `Busy` after a poll, and returns
/// their statuses once all completed.
pub fn run_batch(ch: &mut dyn IoChannel, reqs: &[IoRequest]) -> Vec<IoStatus> {
    let mut status: Vec<Option<IoStatus>> = vec![None; reqs.len()];
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut next, mut done) = (0, 0);
    while done < reqs.len() {
        while next < reqs.len() {
            assert_eq!(reqs[next].tag as usize, next, "tags must be indexes");
            match ch.submit(&reqs[next]) {
                Ok(()) => next += 1,
                Err(SubmitError::Busy) => break,
                Err(e) => panic!("request {next} rejected: {e}"),
            }
        }
        ch.poll(&mut |tag, s| {
            assert!(status[tag as usize].replace(s).is_none(), "tag {tag} completed twice");
            done += 1;
        });
        assert!(Instant::now() < deadline, "only {done} of {} completions in 20 s", reqs.len());
    }
    assert_eq!(ch.in_flight(), 0);
    status.into_iter().map(Option::unwrap).collect()
}

/// Runs one request to completion.
pub fn run(ch: &mut dyn IoChannel, req: IoRequest) -> IoStatus {
    let status = run_batch(ch, &[IoRequest { tag: 0, ..req }]);
    status[0]
}

/// Reads `[offset, offset + len)` into a fresh buffer.
pub fn read_range(ch: &mut dyn IoChannel, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = IoBuf::new(len, true);
    let status = run(ch, buf.request(0, IoOp::Read, offset));
    assert_eq!(status, IoStatus::Success, "read of {len} bytes at {offset}");
    buf.bytes().to_vec()
}

/// Writes `data` at `offset`.
pub fn write_range(ch: &mut dyn IoChannel, offset: u64, data: &[u8]) {
    let status = write_status(ch, offset, data);
    assert_eq!(status, IoStatus::Success, "write of {} bytes at {offset}", data.len());
}

/// Writes `data` at `offset` and returns how the write ended (for tests of failing writes in
/// crates that allow no unsafe code).
pub fn write_status(ch: &mut dyn IoChannel, offset: u64, data: &[u8]) -> IoStatus {
    let mut buf = IoBuf::new(data.len(), true);
    buf.bytes_mut().copy_from_slice(data);
    run(ch, buf.request(0, IoOp::Write, offset))
}

/// Rounds of concurrent writes to random, non-overlapping ranges through multi-iovec buffers,
/// each followed by reads of the same ranges (cut differently) checked against a model; ends
/// by reading the whole device back. The device must start zeroed.
pub fn random_write_read_verify(dev: &dyn BlockDevice, seed: u64, rounds: usize, layout: Layout) {
    const BATCH: usize = 8;
    let info = dev.info().clone();
    let bs = info.block_size as usize;
    let region = info.num_blocks() as usize / BATCH;
    assert!(region >= 1, "device too small for the test");
    let mut model = vec![0u8; info.size_bytes() as usize];
    let mut ch = dev.open_channel().unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);

    for round in 0..rounds {
        let mut ranges = Vec::with_capacity(BATCH);
        let mut bufs = Vec::with_capacity(BATCH);
        for r in 0..BATCH {
            let blocks = rng.gen_range(1..=region.min(64));
            let first = r * region + rng.gen_range(0..=region - blocks);
            let (offset, len) = ((first * bs) as u64, blocks * bs);
            let aligned = match layout {
                Layout::Aligned => true,
                Layout::Unaligned => false,
                Layout::Mixed => rng.gen(),
            };
            let mut buf = IoBuf::new(len, aligned);
            rng.fill(buf.bytes_mut());
            model[offset as usize..offset as usize + len].copy_from_slice(buf.bytes());
            ranges.push((offset, len, aligned));
            bufs.push(buf);
        }
        let grain = |aligned: bool| if aligned { 512 } else { 1 };
        for op in [IoOp::Write, IoOp::Read] {
            if op == IoOp::Read {
                bufs.iter_mut().for_each(|b| b.bytes_mut().fill(0xee));
            }
            // Cut afresh for each: reads see other iovecs than the writes had.
            let reqs: Vec<IoRequest> = bufs
                .iter_mut()
                .zip(&ranges)
                .enumerate()
                .map(|(i, (b, &(offset, _, aligned)))| {
                    b.request_cut(&mut rng, 6, grain(aligned), i as u32, op, offset)
                })
                .collect();
            let status = run_batch(&mut *ch, &reqs);
            assert!(status.iter().all(|s| *s == IoStatus::Success), "round {round} {op:?}: {status:?}");
        }
        for (buf, &(offset, len, _)) in bufs.iter().zip(&ranges) {
            let want = &model[offset as usize..offset as usize + len];
            assert!(buf.bytes() == want, "round {round}: data read at {offset} (+{len}) differs");
        }
    }

    const CHUNK: usize = 1 << 20;
    for (i, want) in model.chunks(CHUNK).enumerate() {
        let offset = (i * CHUNK) as u64;
        assert!(read_range(&mut *ch, offset, want.len()) == want, "final read at {offset} differs");
    }
}

/// Misaligned and out-of-bounds requests are refused at submit, leaving nothing in flight.
pub fn check_range_rejected(dev: &dyn BlockDevice) {
    let info = dev.info();
    let (bs, size) = (u64::from(info.block_size), info.size_bytes());
    let mut ch = dev.open_channel().unwrap();
    let mut buf = IoBuf::new(2 * bs as usize, true);
    let bad = [
        (1, bs),                 // misaligned offset
        (bs, bs / 2),            // partial block
        (size, bs),              // starts at the end
        (size - bs, 2 * bs),     // runs past the end
        (0, size + bs),          // longer than the device
        (u64::MAX - bs + 1, bs), // wraps around
    ];
    for op in [IoOp::Read, IoOp::Write, IoOp::Discard, IoOp::WriteZeroes] {
        for &(offset, len) in &bad {
            // The iovec describes all of `buf`, not `len`: the range is refused before any
            // iovec is looked at.
            let req = IoRequest { len, ..buf.request(9, op, offset) };
            let r = ch.submit(&req);
            assert_eq!(r, Err(SubmitError::OutOfRange), "{op:?} {offset}+{len}");
        }
    }
    assert_eq!(ch.in_flight(), 0);
    assert_eq!(ch.poll(&mut |tag, _| panic!("refused request {tag} completed")), 0);
    // The last blocks are fine.
    let status = run(&mut *ch, buf.request(0, IoOp::Write, size - 2 * bs));
    assert_eq!(status, IoStatus::Success);
}

/// Completions come only from `poll`, once per request, and `in_flight` counts the rest.
pub fn check_completion_via_poll(dev: &dyn BlockDevice) {
    let bs = dev.info().block_size as usize;
    let mut ch = dev.open_channel().unwrap();
    let mut bufs: Vec<IoBuf> = (0..4).map(|_| IoBuf::new(bs, true)).collect();
    // `bufs` outlive the requests, all completed below.
    let mut reqs: Vec<IoRequest> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| b.request(100 + i as u32, IoOp::Write, (i * bs) as u64))
        .collect();
    reqs.push(cmd(200, IoOp::Flush, 0, 0));
    reqs.push(cmd(201, IoOp::WriteZeroes, 4 * bs as u64, bs as u64));
    reqs.push(cmd(202, IoOp::Discard, 5 * bs as u64, bs as u64));
    // The first buffer again, read.
    reqs.push(IoRequest { tag: 203, op: IoOp::Read, ..reqs[0] });

    assert_eq!(ch.in_flight(), 0);
    for (n, req) in reqs.iter().enumerate() {
        ch.submit(req).unwrap();
        assert_eq!(ch.in_flight(), n + 1);
    }
    let mut seen = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < reqs.len() {
        let before = ch.in_flight();
        let n = ch.poll(&mut |tag, status| {
            assert_eq!(status, IoStatus::Success, "tag {tag}");
            assert!(seen.insert(tag), "tag {tag} completed twice");
        });
        assert_eq!(ch.in_flight(), before - n);
        assert!(Instant::now() < deadline);
    }
    let want: HashSet<u32> = reqs.iter().map(|r| r.tag).collect();
    assert_eq!(seen, want);
    assert_eq!(ch.in_flight(), 0);
    assert_eq!(ch.poll(&mut |tag, _| panic!("extra completion {tag}")), 0);
}

/// Flush succeeds; zeroed ranges read back as zeroes, discarded blocks as zeroes or their old
/// data (a discard is a hint: [`IoOp::Discard`] leaves them unspecified, and librbd skips
/// discards below its granularity), and nothing around them changes.
pub fn check_flush_discard_write_zeroes(dev: &dyn BlockDevice) {
    let bs = dev.info().block_size as usize;
    let mut ch = dev.open_channel().unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    for op in [IoOp::Discard, IoOp::WriteZeroes] {
        let mut data = vec![0u8; 64 * bs];
        rng.fill(&mut data[..]);
        write_range(&mut *ch, 0, &data);
        let old = data.clone();
        assert_eq!(run(&mut *ch, cmd(0, IoOp::Flush, 0, 0)), IoStatus::Success);
        let mut hit = [false; 64];
        for (first, blocks) in [(1, 1), (5, 3), (16, 24), (63, 1)] {
            let req = cmd(0, op, (first * bs) as u64, (blocks * bs) as u64);
            assert_eq!(run(&mut *ch, req), IoStatus::Success, "{op:?}");
            data[first * bs..(first + blocks) * bs].fill(0);
            hit[first..first + blocks].fill(true);
        }
        // An empty range is a no-op.
        assert_eq!(run(&mut *ch, cmd(0, op, 0, 0)), IoStatus::Success);
        let got = read_range(&mut *ch, 0, data.len());
        for (block, &hit) in hit.iter().enumerate() {
            let range = block * bs..(block + 1) * bs;
            let kept = op == IoOp::Discard && hit && got[range.clone()] == old[range.clone()];
            assert!(
                kept || got[range.clone()] == data[range],
                "{op:?} read back wrong data in block {block}"
            );
        }
    }
}

/// A read or write whose iovecs do not add up to `len` fails without touching data.
pub fn check_iov_len_mismatch(dev: &dyn BlockDevice) {
    let bs = dev.info().block_size as usize;
    let mut ch = dev.open_channel().unwrap();
    write_range(&mut *ch, 0, &vec![0x11; bs]);
    let mut half = IoBuf::new(bs / 2, true);
    for op in [IoOp::Write, IoOp::Read] {
        let req = IoRequest { len: bs as u64, ..half.request(0, op, 0) };
        assert_eq!(run(&mut *ch, req), IoStatus::Error(libc::EINVAL), "{op:?}");
    }
    assert_eq!(read_range(&mut *ch, 0, bs), vec![0x11; bs]);
}

/// Two threads, each with its own channel on the same device, write and verify their own half;
/// then a third channel sees both halves.
pub fn check_channel_per_thread(dev: Arc<dyn BlockDevice>) {
    let size = dev.info().size_bytes() as usize;
    let half = size / 2;
    let pattern = |t: usize, i: usize| (t * 131 + i / 512 * 7 + i) as u8;
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                let mut ch = dev.open_channel().unwrap();
                let data: Vec<u8> = (0..half).map(|i| pattern(t, i)).collect();
                let offset = (t * half) as u64;
                for _ in 0..4 {
                    write_range(&mut *ch, offset, &data);
                    assert!(read_range(&mut *ch, offset, half) == data, "thread {t}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut ch = dev.open_channel().unwrap();
    let all = read_range(&mut *ch, 0, 2 * half);
    for t in 0..2 {
        assert!((0..half).all(|i| all[t * half + i] == pattern(t, i)), "half {t}");
    }
}

/// The error is `InvalidParam` for `field`.
pub fn assert_invalid<T>(result: Result<T, BdevError>, field: &str) {
    match result {
        Err(BdevError::InvalidParam { field: f, reason }) => {
            assert_eq!(f, field, "wrong field ({reason})");
            assert!(!reason.is_empty());
        }
        Err(e) => panic!("expected an invalid {field}, got {e}"),
        Ok(_) => panic!("expected an invalid {field}, got a device"),
    }
}
