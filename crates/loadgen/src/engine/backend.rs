//! What the client loop needs of a back end ([`Backend`], [`IoQueue`]) and what both back ends
//! share: the buffer alignment, the device's geometry checks and the virtqueue size. The loop
//! (`engine.rs`) and each back end (`libblkio.rs`, `virtio.rs`) depend on this file, not on
//! each other.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::io::RawFd;

use fp_virtq::driver::DriverMem;

use crate::{DirtyLogReport, LoadError, LoadSpec};

/// Slot buffers are spaced at least this far apart (and aligned to it), so that an O_DIRECT
/// backend sees page-aligned buffers whatever the block size.
pub(super) const BUF_ALIGN: usize = 4096;

/// A completed request: the slot it was submitted with and its result (0, or a negative errno).
#[derive(Clone, Copy, Default)]
pub(crate) struct Done {
    pub(super) slot: usize,
    pub(super) ret: i32,
}

/// One request: `len` bytes at device offset `offset`, from or into the buffer at process
/// address `buf` (inside [`Connected::data`]), for slot `slot`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Req {
    pub(super) write: bool,
    pub(super) offset: u64,
    pub(super) buf: u64,
    pub(super) len: usize,
    pub(super) slot: usize,
}

/// One virtqueue of a back end.
pub(crate) trait IoQueue {
    /// Queues `req` (the device may not see it before the next [`reap`]).
    ///
    /// [`reap`]: IoQueue::reap
    fn enqueue(&mut self, req: Req) -> Result<(), LoadError>;
    /// Notifies the device of queued requests if it asks for it, then takes up to `out.len()`
    /// completions without waiting.
    fn reap(&mut self, out: &mut [Done]) -> Result<usize, LoadError>;
    /// Turns on completion notifications and returns the eventfd they are signalled on (its own
    /// descriptor of it: the waiter keeps it).
    fn enable_completion_fd(&mut self) -> Result<CompletionFd, LoadError>;
    /// Kicks (notifications to the device) sent so far, where the back end sends them itself.
    fn kicks(&self) -> Option<u64> {
        None
    }
}

/// A queue's completion eventfd, as the waiter holds it.
pub(crate) enum CompletionFd {
    /// A descriptor of its own.
    Owned(OwnedFd),
    /// A duplicate of an eventfd the `vhost` crate takes.
    Vmm(vmm_sys_util::eventfd::EventFd),
}

impl CompletionFd {
    pub(super) fn raw(&self) -> RawFd {
        match self {
            CompletionFd::Owned(fd) => fd.as_raw_fd(),
            CompletionFd::Vmm(e) => e.as_raw_fd(),
        }
    }

    /// Resets the (non-blocking) counter; returns what it held (0 when nothing was signalled).
    pub(super) fn clear(&self) -> io::Result<u64> {
        match self {
            CompletionFd::Owned(fd) => fp_sys::eventfd_clear(fd.as_fd()),
            CompletionFd::Vmm(e) => match e.read() {
                Ok(n) => Ok(n),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(err) => Err(err),
            },
        }
    }
}

/// A way to connect to the device.
pub(crate) trait Backend: Sized {
    type Queue: IoQueue;
    /// Connects, starts `spec.num_queues` queues and maps a buffer region of at least
    /// `buf_len` bytes.
    fn connect(spec: &LoadSpec, buf_len: usize) -> Result<Connected<Self>, LoadError>;
    /// With [`LoadSpec::dirty_log`]: stops the log's sync thread after a last scan and reports
    /// what it saw; call it once nothing is in flight. `None` for back ends without a log.
    fn dirty_log(&mut self) -> Option<DirtyLogReport> {
        None
    }
    /// Whether the memory shared with the device is of huge pages ([`LoadSpec::hugetlb`]).
    fn hugetlb(&self) -> bool {
        false
    }
}

/// What [`Backend::connect`] returns.
pub(crate) struct Connected<B: Backend> {
    pub(super) queues: Vec<B::Queue>,
    pub(super) backend: B,
    /// The data buffers, shared with the device.
    pub(super) data: DriverMem,
    pub(super) capacity: u64,
    pub(super) request_alignment: u32,
}

/// The device's checks common to both back ends.
pub(super) fn check_geometry(
    spec: &LoadSpec,
    request_alignment: u32,
    max_queues: usize,
) -> Result<(), LoadError> {
    if spec.block_size % request_alignment as usize != 0 {
        return Err(LoadError::InvalidSpec(format!(
            "block size {} is not a multiple of the device's request alignment {request_alignment}",
            spec.block_size
        )));
    }
    if spec.num_queues > max_queues {
        return Err(LoadError::InvalidSpec(format!(
            "{} queues requested but the device offers {max_queues}",
            spec.num_queues
        )));
    }
    Ok(())
}

/// What fp-load's own drivers (packed, and split through its frontend) need of a ring that
/// carries virtio-blk requests.
pub(super) trait BlkRing {
    /// Makes request `slot` available: a read or write of `len` bytes at process address
    /// `buf`, at `sector`.
    fn push(&mut self, slot: u16, write: bool, sector: u64, buf: u64, len: usize);
    /// Whether the device wants a notification for what was made available since the last call.
    fn notify_needed(&mut self) -> bool;
    /// The next completed request: its slot and virtio-blk status.
    fn pop(&mut self) -> Option<(u16, u8)>;
    /// Asks the device for completion notifications (`on`) or for none (a polling driver).
    fn set_used_notifications(&mut self, on: bool);
}

/// How fp-load's own drivers reach the device outside the ring: the kick and the completion
/// eventfd (vhost-user's vring kick and call fds).
pub(super) trait VringFds {
    /// Notifies the device of new requests.
    fn kick(&mut self) -> Result<(), LoadError>;
    /// The completion eventfd, as the waiter keeps it.
    fn completion_fd(&mut self) -> Result<CompletionFd, LoadError>;
    /// Kicks sent so far, where counted.
    fn kicks(&self) -> Option<u64> {
        None
    }
}

/// A queue of fp-load's own drivers over `ring`, kicking through `fds`: writes on a device
/// opened read-only fail with `EBADF` without reaching the device, as libblkio fails them.
pub(super) struct BlkQueue<R, F> {
    pub(super) ring: R,
    pub(super) fds: F,
    read_only: bool,
    /// Requests added since the last notification check.
    to_notify: bool,
    /// Writes refused on a read-only device, completed at the next reap.
    refused: Vec<usize>,
}

impl<R: BlkRing, F: VringFds> BlkQueue<R, F> {
    pub(super) fn new(ring: R, fds: F, read_only: bool, depth: usize) -> BlkQueue<R, F> {
        BlkQueue { ring, fds, read_only, to_notify: false, refused: Vec::with_capacity(depth) }
    }
}

impl<R: BlkRing, F: VringFds> IoQueue for BlkQueue<R, F> {
    #[inline]
    fn enqueue(&mut self, r: Req) -> Result<(), LoadError> {
        if r.write && self.read_only {
            self.refused.push(r.slot);
            return Ok(());
        }
        self.ring.push(r.slot as u16, r.write, r.offset / 512, r.buf, r.len);
        self.to_notify = true;
        Ok(())
    }

    /// Kicks the device if it wants to hear of what was added since the last call (one check
    /// per batch), then takes completions ([`reap_virtio`]).
    #[inline]
    fn reap(&mut self, out: &mut [Done]) -> Result<usize, LoadError> {
        if std::mem::take(&mut self.to_notify) && self.ring.notify_needed() {
            self.fds.kick()?;
        }
        let ring = &mut self.ring;
        Ok(reap_virtio(out, &mut self.refused, || ring.pop()))
    }

    fn enable_completion_fd(&mut self) -> Result<CompletionFd, LoadError> {
        let fd = self.fds.completion_fd()?;
        self.ring.set_used_notifications(true);
        Ok(fd)
    }

    fn kicks(&self) -> Option<u64> {
        self.fds.kicks()
    }
}

/// Fills `out` with the writes refused on a read-only device (`EBADF`, never sent), then with
/// the completions `pop` returns (a slot and its virtio-blk status, virtio 1.2 §5.2.6); the
/// count. What both of fp-load's own virtio drivers (packed, and split through its frontend)
/// do in `reap`.
#[inline]
fn reap_virtio(
    out: &mut [Done],
    refused: &mut Vec<usize>,
    mut pop: impl FnMut() -> Option<(u16, u8)>,
) -> usize {
    let mut n = 0;
    while n < out.len() {
        let Some(slot) = refused.pop() else { break };
        out[n] = Done { slot, ret: -libc::EBADF };
        n += 1;
    }
    while n < out.len() {
        let Some((slot, status)) = pop() else { break };
        let ret = match status {
            0 => 0,
            1 => -libc::EIO,
            2 => -libc::ENOTSUP,
            _ => -libc::EPROTO,
        };
        out[n] = Done { slot: usize::from(slot), ret };
        n += 1;
    }
    n
}

/// Descriptors per virtio-blk request of fp-load's own drivers: header, data, status.
pub(super) const CHAIN: u16 = 3;
/// Bytes of shared memory per request slot for its header (16 bytes) and status byte.
pub(super) const HDR_STRIDE: usize = 32;

/// The request headers and status bytes of one queue's slots (virtio 1.2 §5.2.6,
/// `struct virtio_blk_req`), `HDR_STRIDE` apart in memory shared with the device.
pub(super) struct ReqHeaders {
    mem: DriverMem,
    depth: usize,
}

impl ReqHeaders {
    /// The headers of `depth` slots at the start of `mem`.
    pub(super) fn new(mem: &DriverMem, depth: usize) -> ReqHeaders {
        ReqHeaders { mem: mem.sub(0, depth * HDR_STRIDE), depth }
    }

    /// Writes slot `slot`'s header (a read or write at `sector`) and marks its status byte
    /// unwritten; returns the header's process address (the status byte follows 16 bytes on).
    #[inline]
    pub(super) fn prepare(&self, slot: u16, write: bool, sector: u64) -> u64 {
        let at = usize::from(slot) * HDR_STRIDE;
        self.mem.write_u32(at, u32::from(write));
        self.mem.write_u32(at + 4, 0);
        self.mem.write_u64(at + 8, sector);
        self.mem.write_u8(at + 16, 0xff);
        self.mem.addr_of(at)
    }

    /// Process address of slot `slot`'s header.
    #[inline]
    pub(super) fn addr(&self, slot: u16) -> u64 {
        self.mem.addr_of(usize::from(slot) * HDR_STRIDE)
    }

    /// Slot `slot`'s status byte, as the device wrote it.
    ///
    /// # Panics
    /// If the device completed a slot fp-load never submitted (past the queue depth): the run
    /// then ends with the client thread's panic (`LoadError::Panicked`), naming the slot.
    #[inline]
    pub(super) fn status(&self, slot: u16) -> u8 {
        let at = usize::from(slot);
        assert!(at < self.depth, "the device completed request {slot}, past the queue depth {}", self.depth);
        self.mem.read_u8(at * HDR_STRIDE + 16)
    }
}

/// Virtqueue entries for `queue_depth` requests: each takes three descriptors (header, data,
/// status); the default 256 unless the depth needs more.
pub(super) fn queue_size_for(queue_depth: usize) -> usize {
    (queue_depth * 3).next_power_of_two().max(256)
}

/// `v` rounded up to a multiple of `to`.
pub(super) fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring that records what it is given and completes what the test says.
    #[derive(Default)]
    struct FakeRing {
        pushed: Vec<(u16, bool, u64, u64, usize)>,
        wants_kick: bool,
        checks: usize,
        done: Vec<(u16, u8)>,
    }

    impl BlkRing for FakeRing {
        fn push(&mut self, slot: u16, write: bool, sector: u64, buf: u64, len: usize) {
            self.pushed.push((slot, write, sector, buf, len));
        }
        fn notify_needed(&mut self) -> bool {
            self.checks += 1;
            self.wants_kick
        }
        fn pop(&mut self) -> Option<(u16, u8)> {
            self.done.pop()
        }
        fn set_used_notifications(&mut self, _on: bool) {}
    }

    #[derive(Default)]
    struct CountKicks(u64);

    impl VringFds for CountKicks {
        fn kick(&mut self) -> Result<(), LoadError> {
            self.0 += 1;
            Ok(())
        }
        fn completion_fd(&mut self) -> Result<CompletionFd, LoadError> {
            Err(LoadError::InvalidSpec("no fd in this test".into()))
        }
        fn kicks(&self) -> Option<u64> {
            Some(self.0)
        }
    }

    fn req(write: bool, slot: usize) -> Req {
        Req { write, offset: 4096 * slot as u64, buf: 0x1000 * slot as u64, len: 4096, slot }
    }

    /// The device hears of a batch once, when its ring asks for it, and is not asked again
    /// until something new is queued; completions map virtio-blk statuses to errnos.
    #[test]
    fn a_batch_is_checked_for_a_kick_once_and_statuses_become_errnos() {
        let mut q =
            BlkQueue::new(FakeRing { wants_kick: true, ..FakeRing::default() }, CountKicks(0), false, 4);
        q.enqueue(req(false, 0)).unwrap();
        q.enqueue(req(true, 1)).unwrap();
        assert_eq!(q.ring.pushed, [(0, false, 0, 0, 4096), (1, true, 8, 0x1000, 4096)]);
        let mut out = [Done::default(); 4];
        assert_eq!(q.reap(&mut out).unwrap(), 0);
        assert_eq!((q.kicks(), q.ring.checks), (Some(1), 1));
        assert_eq!(q.reap(&mut out).unwrap(), 0);
        assert_eq!((q.kicks(), q.ring.checks), (Some(1), 1), "nothing new: no check, no kick");
        q.ring.done = vec![(1, 1), (0, 0), (3, 2), (2, 9)];
        assert_eq!(q.reap(&mut out).unwrap(), 4);
        let got: Vec<_> = out.iter().map(|d| (d.slot, d.ret)).collect();
        assert_eq!(got, [(2, -libc::EPROTO), (3, -libc::ENOTSUP), (0, 0), (1, -libc::EIO)]);
    }

    /// On a read-only device writes never reach the ring: they complete with EBADF at the next
    /// reap, and a ring that asks for no kick gets none.
    #[test]
    fn writes_on_a_read_only_device_fail_with_ebadf_without_the_device() {
        let mut q = BlkQueue::new(FakeRing::default(), CountKicks(0), true, 4);
        q.enqueue(req(true, 2)).unwrap();
        q.enqueue(req(false, 3)).unwrap();
        assert_eq!(q.ring.pushed.len(), 1, "only the read reached the ring");
        let mut out = [Done::default(); 4];
        assert_eq!(q.reap(&mut out).unwrap(), 1);
        assert_eq!((out[0].slot, out[0].ret), (2, -libc::EBADF));
        assert_eq!(q.kicks(), Some(0), "the ring asked for no kick");
    }

    fn headers(depth: usize) -> (DriverMem, ReqHeaders) {
        let mem = std::sync::Arc::new(fp_virtq::driver::SharedMem::new(4096, false).unwrap()).view();
        let h = ReqHeaders::new(&mem.sub(1024, 1024), depth);
        (mem, h)
    }

    /// `struct virtio_blk_req`'s header (type, reserved, sector) and an unwritten status byte.
    #[test]
    fn a_header_is_written_where_its_address_says() {
        let (mem, h) = headers(4);
        let addr = h.prepare(2, true, 77);
        assert_eq!(addr, mem.addr_of(1024 + 2 * HDR_STRIDE));
        let at = 1024 + 2 * HDR_STRIDE;
        assert_eq!((mem.read_u32(at), mem.read_u32(at + 4), mem.read_u64(at + 8)), (1, 0, 77));
        assert_eq!(h.status(2), 0xff);
        mem.write_u8(at + 16, 0);
        assert_eq!(h.status(2), 0);
    }

    #[test]
    #[should_panic(expected = "the device completed request 4, past the queue depth 4")]
    fn a_slot_the_device_made_up_is_named() {
        headers(4).1.status(4);
    }

    #[test]
    fn round_up_works() {
        assert_eq!(round_up(1, 4096), 4096);
        assert_eq!(round_up(4096, 4096), 4096);
        assert_eq!(round_up(4097, 4096), 8192);
        assert_eq!(round_up(512, 512), 512);
    }
}
