//! One ublk queue's kernel side: /dev/ublkcN's descriptor array for the queue (mmap'd
//! read-only), one buffer per tag, and a ring of 64-byte SQEs carrying FETCH_REQ and
//! COMMIT_AND_FETCH_REQ as `IORING_OP_URING_CMD`, with an eventfd registered on it so that a
//! sleeping reactor wakes when the kernel hands a request over.
//!
//! Built, used and dropped on one reactor thread: the kernel binds a queue to the task that
//! fetched its tags (6.12's `ubq_daemon`), so every command must come from that thread.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use fp_bdev::Iovecs;
use io_uring::{opcode, types, IoUring};

use crate::uapi::{desc_len, desc_offset, io_cmd, Encoding, IoCmd, IoDesc};

/// The tags' buffers: one anonymous mapping, `depth` buffers of `buf_size` bytes. A mapping
/// rather than the allocator: its pages are zero and untouched until a request that large
/// comes (an aligned allocation would be zeroed by writing it, 64 MiB per queue of 128 tags).
struct Buffers {
    ptr: NonNull<u8>,
    len: usize,
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `QueueRing::new`, of this length, unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The queue's descriptors, mapped from /dev/ublkcN.
struct Descs {
    ptr: NonNull<IoDesc>,
    len: usize,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `QueueRing::new`, of this length, unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A queue's ring, descriptors and buffers.
pub struct QueueRing {
    // Dropped in this order: the ring first (closing it cancels the queue's commands, so the
    // kernel stops using the buffers), then the buffers, the mapping, the device.
    ring: IoUring,
    eventfd: OwnedFd,
    /// Held for its memory, reached through `iovs`.
    _bufs: Buffers,
    /// One iovec per tag over its buffer, its length set per request ([`QueueRing::iov`]).
    iovs: Box<[libc::iovec]>,
    descs: Descs,
    cdev: Arc<File>,
    q_id: u16,
    depth: u16,
    buf_size: usize,
    fetch_op: u32,
    commit_op: u32,
    /// Commands pushed since the last submit.
    queued: usize,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

impl QueueRing {
    /// Maps queue `q_id`'s descriptors from `cdev` (/dev/ublkcN), allocates `depth` buffers
    /// of `buf_size` bytes, makes the ring and its eventfd. Nothing is fetched yet.
    pub fn new(
        cdev: Arc<File>,
        q_id: u16,
        depth: u16,
        buf_size: usize,
        encoding: Encoding,
    ) -> io::Result<QueueRing> {
        if depth == 0 || buf_size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queue depth and buffer size must be > 0",
            ));
        }
        let page = page_size();
        let len = desc_len(depth, page);
        let off = desc_offset(q_id, page);
        // SAFETY: a fresh shared read-only mapping of the device's descriptor area for this
        // queue, at the offset and length the driver documents; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                cdev.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let descs =
            Descs { ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave NULL"))?, len };
        let total = buf_size
            .checked_mul(depth as usize)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "buffers too large"))?;
        // SAFETY: a fresh private anonymous mapping of `total` (> 0) bytes; nothing else
        // refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        let bufs = Buffers { ptr, len: total };
        let iovs = (0..depth as usize)
            .map(|t| libc::iovec {
                // SAFETY: tag `t` < depth, so its buffer lies inside the allocation.
                iov_base: unsafe { bufs.ptr.as_ptr().add(t * buf_size) }.cast(),
                iov_len: buf_size,
            })
            .collect();
        let ring = IoUring::builder().build(u32::from(depth).next_power_of_two())?;
        let eventfd = fp_sys::eventfd()?;
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        Ok(QueueRing {
            ring,
            eventfd,
            _bufs: bufs,
            iovs,
            descs,
            cdev,
            q_id,
            depth,
            buf_size,
            fetch_op: encoding.io(io_cmd::FETCH_REQ),
            commit_op: encoding.io(io_cmd::COMMIT_AND_FETCH_REQ),
            queued: 0,
        })
    }

    pub fn depth(&self) -> u16 {
        self.depth
    }

    pub fn q_id(&self) -> u16 {
        self.q_id
    }

    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// The eventfd the kernel signals with each completion.
    pub fn wake_fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// Clears the eventfd after a wake-up and stops the kernel signalling it: while the reactor
    /// polls, a signal per completion would be work for nothing.
    pub fn disarm_wake(&mut self) {
        self.ring.completion().disable_eventfd();
        let _ = fp_sys::eventfd_clear(self.eventfd.as_fd());
    }

    /// Has the kernel signal the eventfd again before the reactor sleeps; `false` when
    /// completions wait already (checked after arming, so none slips between).
    pub fn arm_wake(&mut self) -> bool {
        self.ring.completion().enable_eventfd();
        !self.has_completions()
    }

    /// Whether completions wait in the ring.
    pub fn has_completions(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }

    /// Tag `tag`'s descriptor, as the kernel wrote it before completing the tag's FETCH.
    pub fn desc(&self, tag: u16) -> IoDesc {
        assert!(tag < self.depth, "tag {tag} beyond the queue depth {}", self.depth);
        // SAFETY: `tag` < depth, so the descriptor lies in the mapping; the kernel wrote it
        // before posting the completion we are acting on and does not change it until the
        // tag is committed; a volatile read takes it whole.
        unsafe { std::ptr::read_volatile(self.descs.ptr.as_ptr().add(tag as usize)) }
    }

    /// Tag `tag`'s buffer as one iovec of `len` bytes (at most the buffer size), for the bdev.
    pub fn iov(&mut self, tag: u16, len: usize) -> Iovecs {
        assert!(
            tag < self.depth && len <= self.buf_size,
            "tag {tag} / {len} bytes beyond the queue's buffers"
        );
        let iov = &mut self.iovs[tag as usize];
        iov.iov_len = len;
        // SAFETY: the iovec describes part of tag `tag`'s buffer, which lives as long as this
        // queue; the queue's poller keeps the queue until the bdev channel returned every
        // request (it drops the channel first), and hands one tag to one request at a time.
        unsafe { Iovecs::from_raw(iov as *const libc::iovec, 1) }
    }

    /// Queues FETCH_REQ for `tag`: the kernel completes it with the tag's next request.
    pub fn fetch(&mut self, tag: u16) {
        self.push(self.fetch_op, tag, 0);
    }

    /// Queues COMMIT_AND_FETCH_REQ for `tag`: `result` (bytes done or a negative errno)
    /// completes the tag's request, and the tag waits for the next.
    pub fn commit(&mut self, tag: u16, result: i32) {
        self.push(self.commit_op, tag, result);
    }

    fn push(&mut self, op: u32, tag: u16, result: i32) {
        let addr = self.iovs[tag as usize].iov_base as u64;
        let c = IoCmd { q_id: self.q_id, tag, result, addr };
        let sqe = opcode::UringCmd16::new(types::Fd(self.cdev.as_raw_fd()), op)
            .cmd(c.to_bytes())
            .build()
            .user_data(tag as u64);
        // SAFETY: the command names the tag's buffer, which lives as long as this queue (the
        // ring is dropped first); the SQ has one entry per tag (at least `depth`), and a tag
        // has at most one command outstanding, so it cannot be full.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        debug_assert!(pushed.is_ok(), "one SQ entry per tag");
        if pushed.is_err() {
            log::error!("ublk queue {}: submission queue full (tag {tag})", self.q_id);
        }
        self.queued += 1;
    }

    /// Submits what was queued with one system call; returns how many went.
    pub fn submit(&mut self) -> io::Result<usize> {
        if self.queued == 0 {
            return Ok(0);
        }
        let n = self.ring.submit()?;
        self.queued = self.queued.saturating_sub(n);
        Ok(n)
    }

    /// Appends each completion's `(tag, result)` to `out`.
    pub fn reap(&mut self, out: &mut Vec<(u16, i32)>) -> usize {
        let mut n = 0;
        for cqe in self.ring.completion() {
            out.push((cqe.user_data() as u16, cqe.result()));
            n += 1;
        }
        n
    }
}
