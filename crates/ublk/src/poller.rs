//! A ublk queue's poller on its reactor: the kernel hands requests over as completions of the
//! tags' FETCH commands; each goes to the bdev channel with the tag's buffer as its data (the
//! kernel copies between the block request and that buffer: the one copy 6.12's interface
//! requires without zero copy); its completion goes back as COMMIT_AND_FETCH_REQ. Every
//! round's commands leave in one `io_uring_enter`. Nothing here allocates per request: the
//! lists are made with the queue's depth as their capacity.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fp_bdev::disk::{Completion, DiskIo};
use fp_bdev::{Bdev, IoOp, IoRequest, IoStatus, Iovecs, SubmitError};
use fp_reactor::{PollStatus, Poller};

use crate::sys::QueueRing;
use crate::uapi::{op, IoDesc, IO_RES_ABORT, IO_RES_OK};

/// What a queue counted and where it is, shared with the control plane.
#[derive(Debug, Default)]
pub struct QueueShared {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
    pub write_zeroes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
    /// Requests refused before reaching the bdev (a range or op the device cannot take).
    pub invalid: AtomicU64,
    /// Every tag was aborted by the kernel and the bdev returned every request: the poller
    /// is gone from its reactor.
    pub finished: AtomicBool,
    /// The control plane gives up waiting: requests the bdev holds back as busy are aborted.
    pub give_up_parked: AtomicBool,
    /// The control plane gives the queue up (a failed start, a stop past its bound): it
    /// leaves its reactor once the bdev returned its requests, whatever the kernel did.
    pub quit: AtomicBool,
}

/// The counters a [`QueueShared`] holds, read at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    pub read_ops: u64,
    pub write_ops: u64,
    pub flush_ops: u64,
    pub discard_ops: u64,
    pub write_zeroes_ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub invalid: u64,
}

impl QueueStats {
    pub fn add(&mut self, s: &QueueShared) {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.read_ops += r(&s.reads);
        self.write_ops += r(&s.writes);
        self.flush_ops += r(&s.flushes);
        self.discard_ops += r(&s.discards);
        self.write_zeroes_ops += r(&s.write_zeroes);
        self.bytes_read += r(&s.bytes_read);
        self.bytes_written += r(&s.bytes_written);
        self.errors += r(&s.errors);
        self.invalid += r(&s.invalid);
    }
}

/// Where a tag is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    /// Its FETCH (or COMMIT_AND_FETCH) waits in the kernel.
    Kernel,
    /// Refused as busy by the bdev: retried each round.
    Parked,
    /// With the bdev; `flush_after` for a FUA write, whose flush follows it.
    Bdev { flush_after: bool },
    /// The kernel aborted it (the device stops, or the daemon's queue goes): never fetched again.
    Aborted,
}

/// One tag's request as it goes to the bdev.
#[derive(Debug, Clone, Copy)]
struct Slot {
    tag: Tag,
    req: IoRequest,
    /// What the commit reports on success: the bytes of a read or write, 0 otherwise.
    done_bytes: i32,
    /// A FUA write, whose flush is still to be issued.
    fua: bool,
    /// The operation the kernel asked for (a FUA write's flush counts as the write).
    asked: IoOp,
}

/// Completions collected from the channel (the disk layer's [`Completion`]).
struct Collected<'a>(&'a mut Vec<(u32, IoStatus)>);

impl Completion for Collected<'_> {
    fn complete(&mut self, tag: u32, status: IoStatus) {
        self.0.push((tag, status));
    }
}

/// Why a descriptor cannot go to the bdev, as the errno the commit carries.
pub fn check_desc(
    d: &IoDesc,
    block_size: u32,
    dev_bytes: u64,
    buf_size: usize,
) -> Result<(IoOp, u64, u64), i32> {
    let op = match d.op() {
        op::READ => IoOp::Read,
        op::WRITE => IoOp::Write,
        // A flush has no range: the block layer leaves its sector at all ones (`blk_rq_init`).
        op::FLUSH => return Ok((IoOp::Flush, 0, 0)),
        op::DISCARD => IoOp::Discard,
        op::WRITE_ZEROES => IoOp::WriteZeroes,
        _ => return Err(libc::EOPNOTSUPP),
    };
    let offset = d.start_sector.checked_mul(512).ok_or(libc::EINVAL)?;
    let len = u64::from(d.nr_sectors) * 512;
    let end = offset.checked_add(len).ok_or(libc::EINVAL)?;
    if len == 0 || end > dev_bytes || offset % u64::from(block_size) != 0 || len % u64::from(block_size) != 0
    {
        return Err(libc::EINVAL);
    }
    if matches!(op, IoOp::Read | IoOp::Write) && len > buf_size as u64 {
        return Err(libc::EINVAL);
    }
    Ok((op, offset, len))
}

/// The poller of one ublk queue.
pub struct QueuePoller {
    // The channel before the ring: dropped first, so the bdev is done with the tags' buffers
    // before they are freed.
    channel: DiskIo,
    ring: QueueRing,
    bdev: Bdev,
    block_size: u32,
    slots: Vec<Slot>,
    parked: VecDeque<u16>,
    cqes: Vec<(u16, i32)>,
    done: Vec<(u32, IoStatus)>,
    aborted: usize,
    shared: Arc<QueueShared>,
    name: String,
}

impl QueuePoller {
    /// Opens the bdev's channel for this reactor and fetches every tag: the kernel may hand
    /// requests over as soon as the device starts.
    pub fn new(
        ring: QueueRing,
        bdev: Bdev,
        shared: Arc<QueueShared>,
        name: String,
    ) -> Result<QueuePoller, String> {
        let channel = match bdev.as_disk() {
            Some(disk) => disk.open_typed(),
            None => bdev.open_channel().map(DiskIo::Device),
        }
        .map_err(|e| format!("cannot open a channel of bdev '{}': {e}", bdev.info().name))?;
        let depth = ring.depth() as usize;
        let idle = IoRequest { tag: 0, op: IoOp::Flush, offset: 0, len: 0, iov: Iovecs::NONE };
        let mut p = QueuePoller {
            channel,
            block_size: bdev.info().block_size,
            bdev,
            slots: vec![
                Slot { tag: Tag::Kernel, req: idle, done_bytes: 0, fua: false, asked: IoOp::Flush };
                depth
            ],
            parked: VecDeque::with_capacity(depth),
            cqes: Vec::with_capacity(depth),
            done: Vec::with_capacity(depth),
            aborted: 0,
            shared,
            ring,
            name,
        };
        for tag in 0..depth as u16 {
            p.ring.fetch(tag);
        }
        p.ring.submit().map_err(|e| format!("ublk queue {}: FETCH_REQ: {e}", p.ring.q_id()))?;
        Ok(p)
    }

    /// A request the kernel handed over with tag `tag`.
    fn take(&mut self, tag: u16) {
        let d = self.ring.desc(tag);
        let dev_bytes = self.bdev.info().size_bytes();
        let (op, offset, len) = match check_desc(&d, self.block_size, dev_bytes, self.ring.buf_size()) {
            Ok(v) => v,
            Err(errno) => {
                // The kernel's requests are trusted input; one refused here is a mismatch worth
                // seeing (the first few of each queue).
                if self.shared.invalid.fetch_add(1, Ordering::Relaxed) < 8 {
                    log::warn!(
                        "{}: tag {tag}: request refused with errno {errno}: op_flags {:#x}, sector {}, {} sectors",
                        self.name,
                        d.op_flags,
                        d.start_sector,
                        d.nr_sectors
                    );
                }
                self.ring.commit(tag, -errno);
                return;
            }
        };
        let iov = match op {
            IoOp::Read | IoOp::Write => self.ring.iov(tag, len as usize),
            _ => Iovecs::NONE,
        };
        let s = &mut self.slots[tag as usize];
        s.req = IoRequest { tag: tag as u32, op, offset, len, iov };
        s.done_bytes = if matches!(op, IoOp::Read | IoOp::Write) { len as i32 } else { 0 };
        s.fua = op == IoOp::Write && d.op_flags & op::F_FUA != 0;
        s.asked = op;
        self.submit_or_park(tag);
    }

    /// Hands tag `tag`'s request to the bdev, or parks it at the end of the line when the
    /// bdev is busy.
    fn submit_or_park(&mut self, tag: u16) {
        if !self.submit(tag) {
            self.slots[tag as usize].tag = Tag::Parked;
            self.parked.push_back(tag);
        }
    }

    /// Hands tag `tag`'s request to the bdev; `false` when the bdev is busy (nothing changed).
    fn submit(&mut self, tag: u16) -> bool {
        let s = self.slots[tag as usize];
        match self.channel.submit(&s.req) {
            Ok(()) => {
                self.slots[tag as usize].tag = Tag::Bdev { flush_after: s.fua };
                true
            }
            Err(SubmitError::Busy) => false,
            Err(SubmitError::OutOfRange) => {
                self.finish(tag, -libc::EINVAL);
                true
            }
            Err(SubmitError::Unsupported) => {
                self.finish(tag, -libc::EOPNOTSUPP);
                true
            }
        }
    }

    /// Commits tag `tag`'s result and counts it.
    fn finish(&mut self, tag: u16, result: i32) {
        let s = &self.slots[tag as usize];
        let sh = &self.shared;
        if result < 0 {
            if sh.errors.fetch_add(1, Ordering::Relaxed) < 8 {
                log::warn!(
                    "{}: tag {tag}: {:?} of {} bytes at {} failed with errno {}",
                    self.name,
                    s.asked,
                    s.req.len,
                    s.req.offset,
                    -result
                );
            }
        } else {
            let (ops, bytes) = match s.asked {
                IoOp::Read => (&sh.reads, Some(&sh.bytes_read)),
                IoOp::Write => (&sh.writes, Some(&sh.bytes_written)),
                IoOp::Flush => (&sh.flushes, None),
                IoOp::Discard => (&sh.discards, None),
                IoOp::WriteZeroes => (&sh.write_zeroes, None),
            };
            ops.fetch_add(1, Ordering::Relaxed);
            if let Some(b) = bytes {
                b.fetch_add(s.done_bytes as u64, Ordering::Relaxed);
            }
        }
        self.slots[tag as usize].tag = Tag::Kernel;
        self.ring.commit(tag, result);
    }

    /// A bdev completion.
    fn completed(&mut self, tag: u32, status: IoStatus) {
        let Ok(tag) = u16::try_from(tag) else { return };
        let Some(s) = self.slots.get(tag as usize).copied() else { return };
        let Tag::Bdev { flush_after } = s.tag else { return };
        let flush_after = flush_after && s.fua;
        match status {
            // A FUA write is durable once a flush issued after it completed completes.
            IoStatus::Success if flush_after => {
                let slot = &mut self.slots[tag as usize];
                slot.req =
                    IoRequest { tag: tag as u32, op: IoOp::Flush, offset: 0, len: 0, iov: Iovecs::NONE };
                slot.fua = false;
                self.submit_or_park(tag);
            }
            IoStatus::Success => self.finish(tag, s.done_bytes),
            IoStatus::Error(errno) => self.finish(tag, -errno.abs().max(1)),
            IoStatus::Unsupported => self.finish(tag, -libc::EOPNOTSUPP),
        }
    }

    /// A completion from the kernel: a request for the tag, or the tag's end.
    fn kernel(&mut self, tag: u16, res: i32) {
        if tag as usize >= self.slots.len() {
            log::error!("{}: completion for tag {tag} beyond the queue depth", self.name);
            return;
        }
        match res {
            IO_RES_OK => self.take(tag),
            IO_RES_ABORT => {
                self.slots[tag as usize].tag = Tag::Aborted;
                self.aborted += 1;
            }
            e => {
                // The kernel refused the command itself (a commit it no longer expects, as
                // when the device is being torn down): the tag is not fetched again.
                log::warn!(
                    "{}: tag {tag}: the kernel answered {}",
                    self.name,
                    std::io::Error::from_raw_os_error(-e)
                );
                self.slots[tag as usize].tag = Tag::Aborted;
                self.aborted += 1;
            }
        }
    }
}

impl Poller for QueuePoller {
    fn poll(&mut self) -> PollStatus {
        let mut work = false;
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        if self.ring.reap(&mut cqes) > 0 {
            work = true;
            for &(tag, res) in &cqes {
                self.kernel(tag, res);
            }
        }
        self.cqes = cqes;
        if self.shared.give_up_parked.load(Ordering::Relaxed) && self.channel.parked() > 0 {
            self.channel.abort_parked();
        }
        // Busy requests are retried in their order; the first still refused ends the round's
        // retries.
        while let Some(&tag) = self.parked.front() {
            if !self.submit(tag) {
                break;
            }
            self.parked.pop_front();
            work = true;
        }
        let mut done = std::mem::take(&mut self.done);
        done.clear();
        if self.channel.poll(&mut Collected(&mut done)) > 0 {
            work = true;
            for &(tag, status) in &done {
                self.completed(tag, status);
            }
        }
        self.done = done;
        if let Err(e) = self.ring.submit() {
            if e.raw_os_error() != Some(libc::EAGAIN) && e.raw_os_error() != Some(libc::EBUSY) {
                log::error!("{}: io_uring_enter: {e}", self.name);
            }
        }
        let all_aborted = self.aborted == self.slots.len();
        if (all_aborted || self.shared.quit.load(Ordering::Acquire))
            && self.channel.in_flight() == 0
            && self.parked.is_empty()
        {
            log::info!(
                "{}: {}; the queue stops",
                self.name,
                if all_aborted { "every tag aborted by the kernel" } else { "given up by the control plane" }
            );
            self.shared.finished.store(true, Ordering::Release);
            return PollStatus::Finished;
        }
        if work {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    fn has_pending(&self) -> bool {
        self.channel.in_flight() > 0 || !self.parked.is_empty()
    }

    fn held_by_backend(&self) -> usize {
        self.channel.in_flight()
    }

    fn prepare_sleep(&mut self) -> bool {
        self.ring.arm_wake()
    }

    fn after_wake(&mut self) {
        self.ring.disarm_wake();
    }

    fn wake_fds(&self) -> Vec<RawFd> {
        vec![self.ring.wake_fd()]
    }

    fn parks_when_idle(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(op: u8, flags: u32, start: u64, sectors: u32) -> IoDesc {
        IoDesc { op_flags: u32::from(op) | flags, nr_sectors: sectors, start_sector: start, addr: 0 }
    }

    #[test]
    fn descriptors_map_to_bdev_operations() {
        let mib = 1 << 20;
        assert_eq!(check_desc(&desc(op::READ, 0, 8, 8), 4096, mib, 65536), Ok((IoOp::Read, 4096, 4096)));
        assert_eq!(
            check_desc(&desc(op::WRITE, op::F_FUA, 0, 16), 512, mib, 65536),
            Ok((IoOp::Write, 0, 8192))
        );
        assert_eq!(check_desc(&desc(op::FLUSH, 0, 0, 0), 4096, mib, 65536), Ok((IoOp::Flush, 0, 0)));
        // A flush's sector as the block layer leaves it: all ones.
        assert_eq!(check_desc(&desc(op::FLUSH, 0, u64::MAX, 0), 4096, mib, 65536), Ok((IoOp::Flush, 0, 0)));
        assert_eq!(check_desc(&desc(op::DISCARD, 0, 0, 2048), 4096, mib, 4096), Ok((IoOp::Discard, 0, mib)));
        assert_eq!(
            check_desc(&desc(op::WRITE_ZEROES, op::F_NOUNMAP, 0, 8), 4096, mib, 4096),
            Ok((IoOp::WriteZeroes, 0, 4096))
        );
    }

    #[test]
    fn out_of_range_or_unknown_requests_are_refused() {
        let mib = 1 << 20;
        // Past the end.
        assert_eq!(check_desc(&desc(op::READ, 0, 2040, 16), 512, mib, 65536), Err(libc::EINVAL));
        // Not aligned to the bdev's block.
        assert_eq!(check_desc(&desc(op::READ, 0, 1, 8), 4096, mib, 65536), Err(libc::EINVAL));
        // Larger than the tag's buffer.
        assert_eq!(check_desc(&desc(op::WRITE, 0, 0, 256), 512, mib, 65536), Err(libc::EINVAL));
        // Zero length, an overflowing sector, an op the bdev layer has no counterpart for.
        assert_eq!(check_desc(&desc(op::READ, 0, 0, 0), 512, mib, 65536), Err(libc::EINVAL));
        assert_eq!(check_desc(&desc(op::READ, 0, u64::MAX, 8), 512, mib, 65536), Err(libc::EINVAL));
        assert_eq!(check_desc(&desc(op::WRITE_SAME, 0, 0, 8), 512, mib, 65536), Err(libc::EOPNOTSUPP));
        assert_eq!(check_desc(&desc(13, 0, 0, 8), 512, mib, 65536), Err(libc::EOPNOTSUPP));
    }
}
