//! The packed-ring back end: the `virtio-driver` crate (which libblkio is built on) used
//! directly over vhost-user, with `VIRTIO_F_RING_PACKED` negotiated. libblkio 0.5.1 hard-codes
//! its feature set and never negotiates packed rings.
//!
//! Mirrors what libblkio's virtio-blk driver does: the same feature set plus `RING_PACKED`, one
//! memfd-backed region registered with the backend (`map_mem_region`), a notification only when
//! the device's event suppression asks for one, and writes on a device opened read-only failed
//! with `EBADF` without reaching the device. The region holds the data buffers, the request
//! headers and the rings (virtio-driver lays the rings out in it), so that every access goes
//! through `fp_virtq::driver`'s views of memory fp-load owns.
//!
//! virtio-driver's transport sets up the rings, but the rings are driven here ([`PackedRing`] on
//! `fp_virtq::driver::PackedDriver`),
//! not by virtio-driver's own packed virtqueue: its vhost-user transport sends
//! `SET_VRING_BASE 0` for every ring, which for a packed ring means "both wrap counters 0"
//! (vhost-user.rst; QEMU sends 0x80008000 for a fresh ring), while its packed virtqueue starts
//! with wrap counters 1 as a fresh ring does (virtio 1.2 §2.8.1). A device that takes the base
//! at its word (flashpath does) then never sees a request. [`PackedRing`] instead starts where
//! base 0 says: at slot 0 with both wrap counters 0, every descriptor marked used from the lap
//! before (AVAIL = USED = 1), which is the state of a ring that went round once.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use fp_virtq::driver::{DriverMem, PackedDriver, SharedMem, SharedMemError};
use fp_virtq::{PackedState, DESC_F_NEXT, DESC_F_WRITE};
use virtio_driver::virtqueue::{Virtqueue, VirtqueueLayout};
use virtio_driver::{
    virtio_blk_max_queues, EventFd, QueueNotifier, VhostUser, VirtioBlkConfig, VirtioBlkFeatureFlags,
    VirtioBlkReqBuf, VirtioBlkTransport, VirtioFeatureFlags,
};

use super::backend::{
    check_geometry, queue_size_for, round_up, Backend, BlkQueue, BlkRing, CompletionFd, Connected,
    ReqHeaders, VringFds, BUF_ALIGN, CHAIN, HDR_STRIDE,
};
use crate::{LoadError, LoadSpec};

fn vd(op: &'static str) -> impl FnOnce(io::Error) -> LoadError {
    move |source| LoadError::Virtio { op, source }
}

/// The driver side of one packed virtqueue carrying virtio-blk requests of three descriptors
/// each, with the request's slot as its buffer id.
pub(super) struct PackedRing {
    ring: PackedDriver,
    hdrs: ReqHeaders,
}

impl BlkRing for PackedRing {
    #[inline]
    fn push(&mut self, slot: u16, write: bool, sector: u64, buf: u64, len: usize) {
        let hdr = self.hdrs.prepare(slot, write, sector);
        let data = if write { DESC_F_NEXT } else { DESC_F_NEXT | DESC_F_WRITE };
        self.ring.push(slot, &[(hdr, 16, DESC_F_NEXT), (buf, len as u32, data), (hdr + 16, 1, DESC_F_WRITE)]);
    }

    #[inline]
    fn notify_needed(&mut self) -> bool {
        self.ring.notify_needed()
    }

    #[inline]
    fn pop(&mut self) -> Option<(u16, u8)> {
        let (slot, _) = self.ring.pop_used()?;
        Some((slot, self.hdrs.status(slot)))
    }

    fn set_used_notifications(&mut self, on: bool) {
        self.ring.set_used_notifications(on);
    }
}

/// The vhost-user connection and the shared region: data buffers, request headers and the
/// rings. Dropped after the queues (see [`super::Device`]).
pub(super) struct VirtioDriver {
    transport: Box<VirtioBlkTransport>,
    mem: Arc<SharedMem>,
}

impl Drop for VirtioDriver {
    fn drop(&mut self) {
        let _ = self.transport.unmap_mem_region(self.mem.addr(), self.mem.len());
    }
}

/// The queue's notifier and completion eventfd, as virtio-driver's transport made them.
pub(super) struct TransportFds {
    notifier: Box<dyn QueueNotifier>,
    call: Arc<EventFd>,
}

impl VringFds for TransportFds {
    fn kick(&mut self) -> Result<(), LoadError> {
        self.notifier.notify().map_err(vd("notify"))
    }

    fn completion_fd(&mut self) -> Result<CompletionFd, LoadError> {
        let os = |op| move |source| LoadError::Os { op, source };
        fp_sys::set_nonblocking(self.call.as_fd()).map_err(os("fcntl O_NONBLOCK"))?;
        Ok(CompletionFd::Owned(self.call.as_fd().try_clone_to_owned().map_err(os("dup"))?))
    }
}

pub(super) type VirtioQueue = BlkQueue<PackedRing, TransportFds>;

/// Shared memory for fp-load's own drivers, as libblkio's `alloc_mem_region` makes it; with
/// `hugetlb`, of 2 MiB huge pages (`len` a multiple of [`HUGE_PAGE`]).
pub(super) fn alloc_shared(len: usize, hugetlb: bool) -> Result<SharedMem, LoadError> {
    SharedMem::new(len, hugetlb).map_err(|e| match e {
        SharedMemError::Os { op, source } => LoadError::Os { op, source },
        e => LoadError::Unsupported(e.to_string()),
    })
}

pub(super) use fp_virtq::driver::HUGE_PAGE;

impl Backend for VirtioDriver {
    type Queue = VirtioQueue;

    fn connect(spec: &LoadSpec, buf_len: usize) -> Result<Connected<Self>, LoadError> {
        let path = spec
            .socket
            .to_str()
            .ok_or_else(|| LoadError::InvalidSpec(format!("socket path {:?} is not UTF-8", spec.socket)))?;
        // libblkio's set (virtio_blk.rs, `connect`) plus RING_PACKED.
        let blk = VirtioBlkFeatureFlags::SIZE_MAX
            | VirtioBlkFeatureFlags::SEG_MAX
            | VirtioBlkFeatureFlags::RO
            | VirtioBlkFeatureFlags::BLK_SIZE
            | VirtioBlkFeatureFlags::FLUSH
            | VirtioBlkFeatureFlags::TOPOLOGY
            | VirtioBlkFeatureFlags::MQ
            | VirtioBlkFeatureFlags::DISCARD
            | VirtioBlkFeatureFlags::WRITE_ZEROES
            | VirtioBlkFeatureFlags::CONFIG_WCE;
        let wanted = blk.bits()
            | (VirtioFeatureFlags::VERSION_1
                | VirtioFeatureFlags::RING_EVENT_IDX
                | VirtioFeatureFlags::RING_PACKED)
                .bits();
        let vhost =
            VhostUser::<VirtioBlkConfig, VirtioBlkReqBuf>::new(path, wanted).map_err(vd("connect"))?;
        let transport: Box<VirtioBlkTransport> = Box::new(vhost);
        let features = transport.get_features();
        if features & VirtioFeatureFlags::RING_PACKED.bits() == 0 {
            return Err(LoadError::Unsupported(
                "--packed: the server does not offer VIRTIO_F_RING_PACKED (bit 34)".into(),
            ));
        }
        let blk = VirtioBlkFeatureFlags::from_bits_truncate(features);
        let read_only = spec.read_only || spec.pattern.is_read_only();
        if blk.contains(VirtioBlkFeatureFlags::RO) && !read_only {
            return Err(LoadError::Virtio { op: "start", source: io::Error::from_raw_os_error(libc::EROFS) });
        }
        let cfg = transport.get_config().map_err(vd("get config"))?;
        let capacity = { cfg.capacity }.to_native() * 512;
        let request_alignment = if blk.contains(VirtioBlkFeatureFlags::BLK_SIZE) {
            { cfg.blk_size }.to_native().max(1)
        } else {
            512
        };
        let max_queues = virtio_blk_max_queues(&*transport).map_err(vd("get max queues"))?;
        check_geometry(spec, request_alignment, max_queues)?;

        // Data buffers, then each queue's request headers and status bytes, then the rings, in
        // one region.
        let queue_size = queue_size_for(spec.queue_depth);
        let n = spec.num_queues;
        let flags = VirtioFeatureFlags::from_bits_truncate(features);
        let layout =
            VirtqueueLayout::new::<VirtioBlkReqBuf>(1, queue_size, flags).map_err(vd("ring layout"))?;
        let data_len = round_up(buf_len, BUF_ALIGN);
        let hdr_len = round_up(n * spec.queue_depth * HDR_STRIDE, BUF_ALIGN);
        let stride = round_up(layout.end_offset, BUF_ALIGN);
        let rings_at = data_len + hdr_len;
        let mut shared = alloc_shared(rings_at + n * stride, false)?;
        let fd = shared.fd().as_raw_fd();
        let mut transport = transport;
        transport.map_mem_region(shared.addr(), shared.len(), fd, 0).map_err(vd("map_mem_region"))?;

        // The rings: laid out and registered by virtio-driver, driven by `PackedDriver`.
        let mut vqs = Vec::with_capacity(n);
        for q in shared.as_mut_slice()[rings_at..].chunks_mut(stride) {
            let t = transport.iova_translator();
            vqs.push(Virtqueue::<VirtioBlkReqBuf>::new(t, q, queue_size as u16, flags).map_err(vd("ring"))?);
        }
        transport.setup_queues(&vqs).map_err(vd("setting up the queues"))?;
        drop(vqs);

        let backend = VirtioDriver { transport, mem: Arc::new(shared) };
        let region = backend.mem.view();
        let event_idx = flags.contains(VirtioFeatureFlags::RING_EVENT_IDX);
        let queues = (0..n)
            .map(|i| {
                let q = region.sub(rings_at + i * stride, stride);
                let mut ring = PackedDriver::new(
                    q.clone(),
                    q.sub(layout.driver_area_offset, 4),
                    q.sub(layout.device_area_offset, 4),
                    queue_size as u16,
                    CHAIN,
                    event_idx,
                    // Where `SET_VRING_BASE 0` put the device (see the module docs).
                    PackedState::from_vring_base(0),
                );
                ring.set_used_notifications(false);
                let hdrs = ReqHeaders::new(
                    &region.sub(data_len + i * spec.queue_depth * HDR_STRIDE, hdr_len),
                    spec.queue_depth,
                );
                let fds = TransportFds {
                    notifier: backend.transport.get_submission_notifier(i),
                    call: backend.transport.get_completion_fd(i),
                };
                BlkQueue::new(PackedRing { ring, hdrs }, fds, read_only, spec.queue_depth)
            })
            .collect();
        let data: DriverMem = region.sub(0, data_len);
        Ok(Connected { queues, backend, data, capacity, request_alignment })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_huge_pages() -> u64 {
        let info = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
        let line = info.lines().find(|l| l.starts_with("HugePages_Free:")).expect("HugePages_Free");
        line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a count")
    }

    /// The block size of the file behind `fd`, and its size.
    fn stat(mem: &SharedMem) -> (u64, u64) {
        let f = std::fs::File::from(mem.fd().try_clone_to_owned().expect("dup"));
        let m = f.metadata().expect("fstat");
        use std::os::unix::fs::MetadataExt;
        (m.blksize(), m.size())
    }

    /// With huge pages free the memory is a hugetlbfs memfd (2 MiB blocks) that holds what is
    /// written to it; without, the error names the cure instead of a bare ENOMEM.
    #[test]
    fn hugetlb_memory_is_of_huge_pages_or_says_why_not() {
        match alloc_shared(HUGE_PAGE, true) {
            Ok(mem) => {
                assert_eq!(stat(&mem).0 as usize, HUGE_PAGE);
                let v = Arc::new(mem).view();
                v.write_u8(HUGE_PAGE - 1, 7);
                assert_eq!(v.read_u8(HUGE_PAGE - 1), 7);
            }
            Err(LoadError::Unsupported(m)) => {
                assert!(free_huge_pages() < 1, "failed with huge pages free: {m}");
                assert!(m.contains("nr_hugepages"), "{m}");
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    #[test]
    fn plain_memory_needs_no_huge_pages() {
        let mem = alloc_shared(12288, false).expect("a plain memfd");
        assert_eq!(stat(&mem).1, 12288);
    }
}
