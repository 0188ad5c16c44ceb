//! The packed-ring back end: the `virtio-driver` crate (which libblkio is built on) used
//! directly over vhost-user, with `VIRTIO_F_RING_PACKED` negotiated. libblkio 0.5.1 hard-codes
//! its feature set and never negotiates packed rings.
//!
//! Mirrors what libblkio's virtio-blk driver does: the same feature set plus `RING_PACKED`, one
//! memfd-backed buffer region registered with the backend (`map_mem_region`), a notification
//! only when the device's event suppression asks for one, and writes on a device opened
//! read-only failed with `EBADF` without reaching the device.
//!
//! virtio-driver's transport sets up the rings, but the rings are driven here ([`PackedRing`]),
//! not by virtio-driver's own packed virtqueue: its vhost-user transport sends
//! `SET_VRING_BASE 0` for every ring, which for a packed ring means "both wrap counters 0"
//! (vhost-user.rst; QEMU sends 0x80008000 for a fresh ring), while its packed virtqueue starts
//! with wrap counters 1 as a fresh ring does (virtio 1.2 §2.8.1). A device that takes the base
//! at its word (flashpath does) then never sees a request. [`PackedRing`] instead starts where
//! base 0 says: at slot 0 with both wrap counters 0, every descriptor marked used from the lap
//! before (AVAIL = USED = 1), which is the state of a ring that went round once.

use std::io;
use std::num::Wrapping;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::io::RawFd;
use std::ptr::{addr_of, addr_of_mut};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_ring as vr;
use virtio_driver::virtqueue::{Virtqueue, VirtqueueLayout};
use virtio_driver::{
    virtio_blk_max_queues, EventFd, QueueNotifier, VhostUser, VirtioBlkConfig, VirtioBlkFeatureFlags,
    VirtioBlkReqBuf, VirtioBlkTransport, VirtioFeatureFlags,
};

use super::backend::{
    check_geometry, queue_size_for, reap_virtio, round_up, Backend, Connected, Done, IoQueue, BUF_ALIGN,
};
use crate::{LoadError, LoadSpec};

fn vd(op: &'static str) -> impl FnOnce(io::Error) -> LoadError {
    move |source| LoadError::Virtio { op, source }
}

/// Descriptor flags (virtio 1.2 §2.8.1, §2.7.5).
const F_NEXT: u16 = vr::VRING_DESC_F_NEXT as u16;
const F_WRITE: u16 = vr::VRING_DESC_F_WRITE as u16;
const F_AVAIL: u16 = 1 << vr::VRING_PACKED_DESC_F_AVAIL;
const F_USED: u16 = 1 << vr::VRING_PACKED_DESC_F_USED;
/// Event suppression flags (§2.8.10).
const EV_ENABLE: u16 = vr::VRING_PACKED_EVENT_FLAG_ENABLE as u16;
const EV_DISABLE: u16 = vr::VRING_PACKED_EVENT_FLAG_DISABLE as u16;
const EV_DESC: u16 = vr::VRING_PACKED_EVENT_FLAG_DESC as u16;

/// Descriptors per request: header, data, status.
const CHAIN: u16 = 3;
/// Bytes of shared memory per request slot for its header (16 bytes) and status byte.
const HDR_STRIDE: usize = 32;

/// `struct pvirtq_desc` (§2.8.13).
#[repr(C)]
struct Desc {
    addr: u64,
    len: u32,
    id: u16,
    flags: u16,
}

/// `struct pvirtq_event_suppress` (§2.8.14).
#[repr(C)]
struct EventSuppress {
    off_wrap: u16,
    flags: u16,
}

/// The driver side of one packed virtqueue carrying virtio-blk requests of three descriptors
/// each, with the request's slot as its buffer id.
struct PackedRing {
    desc: *mut Desc,
    driver: *mut EventSuppress,
    device: *const EventSuppress,
    size: u16,
    next_avail: u16,
    avail_wrap: bool,
    /// Descriptors made available since the last notification check.
    pending: u16,
    next_used: u16,
    used_wrap: bool,
    event_idx: bool,
    /// Per-slot header (16 bytes) and status byte, `HDR_STRIDE` apart, in shared memory.
    hdrs: *mut u8,
}

impl PackedRing {
    /// Writes descriptor `i` but for its flags.
    ///
    /// # Safety
    /// `i < self.size`.
    #[inline]
    unsafe fn write_desc(&mut self, i: u16, addr: u64, len: u32, id: u16) {
        // SAFETY: `i` is inside the descriptor ring (caller), which lies in the transport's
        // ring memory for the ring's lifetime.
        unsafe {
            let d = self.desc.add(usize::from(i));
            addr_of_mut!((*d).addr).write_volatile(addr.to_le());
            addr_of_mut!((*d).len).write_volatile(len.to_le());
            addr_of_mut!((*d).id).write_volatile(id.to_le());
        }
    }

    #[inline]
    fn set_flags(&mut self, i: u16, flags: u16) {
        // SAFETY: callers pass positions below `size`; see `write_desc`.
        unsafe { addr_of_mut!((*self.desc.add(usize::from(i))).flags).write_volatile(flags.to_le()) };
    }

    /// The available flags for the current lap.
    #[inline]
    fn avail_flags(&self) -> u16 {
        if self.avail_wrap {
            F_AVAIL
        } else {
            F_USED
        }
    }

    #[inline]
    fn advance_avail(&mut self) -> u16 {
        let i = self.next_avail;
        self.next_avail += 1;
        if self.next_avail == self.size {
            self.next_avail = 0;
            self.avail_wrap = !self.avail_wrap;
        }
        i
    }

    /// Makes request `slot` available: a read or write of `len` bytes at `buf`, at `sector`.
    /// The caller keeps at most `size / 3` requests in flight, so the three slots are free.
    #[inline]
    fn push(&mut self, slot: u16, write: bool, sector: u64, buf: *mut u8, len: usize) {
        // SAFETY: slot < queue depth; the header area holds `queue depth` entries.
        let hdr = unsafe { self.hdrs.add(usize::from(slot) * HDR_STRIDE) };
        // SAFETY: 16 bytes of header and one status byte inside the slot's entry.
        unsafe {
            hdr.cast::<u32>().write_volatile(u32::from(write).to_le());
            hdr.add(4).cast::<u32>().write_volatile(0);
            hdr.add(8).cast::<u64>().write_unaligned(sector.to_le());
            hdr.add(16).write_volatile(0xff);
        }
        let data_flags = if write { F_NEXT } else { F_NEXT | F_WRITE };
        let first_flags = self.avail_flags() | F_NEXT;
        let p0 = self.advance_avail();
        // SAFETY: p0 < size.
        unsafe { self.write_desc(p0, hdr as u64, 16, slot) };
        let f1 = self.avail_flags() | data_flags;
        let p1 = self.advance_avail();
        // SAFETY: p1 < size.
        unsafe { self.write_desc(p1, buf as u64, len as u32, slot) };
        self.set_flags(p1, f1);
        let f2 = self.avail_flags() | F_WRITE;
        let p2 = self.advance_avail();
        // SAFETY: p2 < size.
        unsafe { self.write_desc(p2, hdr as u64 + 16, 1, slot) };
        self.set_flags(p2, f2);
        // The first descriptor's flags make the whole chain visible: last, after the rest.
        fence(Ordering::Release);
        self.set_flags(p0, first_flags);
        self.pending += CHAIN;
    }

    /// Whether the device wants a notification for what was made available since the last
    /// call (§2.8.10, as virtio-driver's packed virtqueue decides it).
    #[inline]
    fn notify_needed(&mut self) -> bool {
        fence(Ordering::SeqCst);
        // SAFETY: the device area lies in the ring memory for the ring's lifetime.
        let (flags, off_wrap) = unsafe {
            (
                u16::from_le(addr_of!((*self.device).flags).read_volatile()),
                u16::from_le(addr_of!((*self.device).off_wrap).read_volatile()),
            )
        };
        let pending = std::mem::take(&mut self.pending);
        if flags == EV_DISABLE {
            return false;
        }
        if !self.event_idx || flags != EV_DESC {
            return true;
        }
        let new = Wrapping(self.next_avail);
        let old = new - Wrapping(pending);
        let mut event = Wrapping(off_wrap & 0x7fff);
        if (off_wrap >> 15 == 1) != self.avail_wrap {
            event -= Wrapping(self.size);
        }
        new - event - Wrapping(1) < new - old
    }

    /// The next completed request: its slot and virtio-blk status.
    #[inline]
    fn pop(&mut self) -> Option<(u16, u8)> {
        let i = self.next_used;
        // SAFETY: next_used < size.
        let d = unsafe { self.desc.add(usize::from(i)) };
        // SAFETY: as above.
        let flags = u16::from_le(unsafe { addr_of!((*d).flags).read_volatile() });
        let (avail, used) = (flags & F_AVAIL != 0, flags & F_USED != 0);
        if avail != used || used != self.used_wrap {
            return None;
        }
        fence(Ordering::Acquire);
        // SAFETY: as above.
        let slot = u16::from_le(unsafe { addr_of!((*d).id).read_volatile() });
        self.next_used += CHAIN;
        if self.next_used >= self.size {
            self.next_used -= self.size;
            self.used_wrap = !self.used_wrap;
        }
        // SAFETY: the device returned an id we submitted, a slot below the queue depth.
        let status = unsafe { self.hdrs.add(usize::from(slot) * HDR_STRIDE + 16).read_volatile() };
        Some((slot, status))
    }

    fn set_used_notifications(&mut self, on: bool) {
        let flags = if on { EV_ENABLE } else { EV_DISABLE };
        // SAFETY: the driver area lies in the ring memory for the ring's lifetime.
        unsafe { addr_of_mut!((*self.driver).flags).write_volatile(flags.to_le()) };
        fence(Ordering::SeqCst);
    }
}

/// The vhost-user connection and the buffer region. Dropped after the queues (see
/// [`super::Device`]), whose rings live in memory the transport owns.
pub(super) struct VirtioDriver {
    transport: Box<VirtioBlkTransport>,
    buf: *mut u8,
    len: usize,
    memfd: OwnedFd,
}

impl Drop for VirtioDriver {
    fn drop(&mut self) {
        let _ = self.transport.unmap_mem_region(self.buf as usize, self.len);
        // SAFETY: `buf`/`len` is the mapping made in `connect`, unmapped exactly once; the
        // queues that pointed into it are gone (they are dropped before the back end).
        unsafe { libc::munmap(self.buf.cast(), self.len) };
    }
}

pub(super) struct VirtioQueue {
    ring: PackedRing,
    notifier: Box<dyn QueueNotifier>,
    call: Arc<EventFd>,
    read_only: bool,
    /// Requests added since the last notification.
    to_notify: bool,
    /// Writes refused on a read-only device, completed at the next reap.
    refused: Vec<usize>,
}

impl IoQueue for VirtioQueue {
    #[inline]
    fn enqueue(
        &mut self,
        write: bool,
        offset: u64,
        buf: *mut u8,
        len: usize,
        slot: usize,
    ) -> Result<(), LoadError> {
        if write && self.read_only {
            self.refused.push(slot);
            return Ok(());
        }
        self.ring.push(slot as u16, write, offset / 512, buf, len);
        self.to_notify = true;
        Ok(())
    }

    #[inline]
    fn reap(&mut self, out: &mut [Done]) -> Result<usize, LoadError> {
        if self.to_notify && self.ring.notify_needed() {
            self.notifier.notify().map_err(vd("notify"))?;
            self.to_notify = false;
        }
        let ring = &mut self.ring;
        Ok(reap_virtio(out, &mut self.refused, || ring.pop()))
    }

    fn enable_completion_fd(&mut self) -> Result<RawFd, LoadError> {
        fp_sys::set_nonblocking(self.call.as_fd())
            .map_err(|source| LoadError::Os { op: "fcntl O_NONBLOCK", source })?;
        self.ring.set_used_notifications(true);
        Ok(self.call.as_raw_fd())
    }
}

/// A shared (memfd) mapping of `len` bytes, as libblkio's `alloc_mem_region` makes; with
/// `hugetlb`, of 2 MiB huge pages (`len` a multiple of [`HUGE_PAGE`]).
pub(super) fn alloc_shared(len: usize, hugetlb: bool) -> Result<(OwnedFd, *mut u8), LoadError> {
    let os = |op| move |source| LoadError::Os { op, source };
    // 2 MiB pages named explicitly rather than the system's default huge page size, so that
    // `len` (a multiple of HUGE_PAGE from the caller) fits them whatever the default.
    let flags =
        if hugetlb { libc::MFD_CLOEXEC | libc::MFD_HUGETLB | MFD_HUGE_2MB } else { libc::MFD_CLOEXEC };
    debug_assert!(!hugetlb || len % HUGE_PAGE == 0);
    let hint = |op: &'static str| {
        move |e: io::Error| {
            if hugetlb && matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EINVAL)) {
                LoadError::Unsupported(format!(
                    "{op}: no {} free 2 MiB huge pages for fp-load's memory ({e}); raise vm.nr_hugepages",
                    len / HUGE_PAGE
                ))
            } else {
                LoadError::Os { op, source: e }
            }
        }
    };
    // SAFETY: the name is a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"fp-load-buf".as_ptr(), flags) };
    if fd < 0 {
        return Err(hint("memfd_create")(io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain system call on an open descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(os("ftruncate")(io::Error::last_os_error()));
    }
    // SAFETY: a fresh shared mapping of the whole memfd; no existing memory is affected.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    // A shared hugetlb mapping reserves its pages here (hugetlbpage.rst, "reservation"), so a
    // shortage is this error and never a SIGBUS at first touch.
    if addr == libc::MAP_FAILED {
        return Err(hint("mmap")(io::Error::last_os_error()));
    }
    Ok((fd, addr.cast()))
}

/// The huge page size of `alloc_shared(_, true)`.
pub(super) const HUGE_PAGE: usize = 2 << 20;
/// `MFD_HUGE_2MB`: `MFD_HUGETLB`'s page size, log2 in bits 26.. (memfd_create(2)).
const MFD_HUGE_2MB: libc::c_uint = 21 << 26;

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

        // Data buffers, then each queue's request headers and status bytes, in one region.
        let data_len = round_up(buf_len, BUF_ALIGN);
        let hdr_len = round_up(spec.num_queues * spec.queue_depth * HDR_STRIDE, BUF_ALIGN);
        let len = data_len + hdr_len;
        let (memfd, buf) = alloc_shared(len, false)?;
        let mut backend = VirtioDriver { transport, buf, len, memfd };
        let fd = backend.memfd.as_raw_fd();
        backend.transport.map_mem_region(buf as usize, len, fd, 0).map_err(vd("map_mem_region"))?;

        // The rings: laid out and registered by virtio-driver, driven by `PackedRing`.
        let queue_size = queue_size_for(spec.queue_depth);
        let n = spec.num_queues;
        let flags = VirtioFeatureFlags::from_bits_truncate(features);
        let layout =
            VirtqueueLayout::new::<VirtioBlkReqBuf>(n, queue_size, flags).map_err(vd("ring layout"))?;
        let translators: Vec<_> = (0..n).map(|_| backend.transport.iova_translator()).collect();
        let mem = backend.transport.alloc_queue_mem(&layout).map_err(vd("alloc_queue_mem"))?;
        let (base, stride) = (mem.as_mut_ptr(), layout.end_offset);
        let mut rings = Vec::with_capacity(n);
        let mut vqs = Vec::with_capacity(n);
        for (i, t) in translators.into_iter().enumerate() {
            // SAFETY: `alloc_queue_mem` returned `n * stride` bytes owned by the transport,
            // which outlives the rings; queue `i` gets its own `stride` bytes.
            let q = unsafe { std::slice::from_raw_parts_mut(base.add(i * stride), stride) };
            let desc = q.as_mut_ptr().cast::<Desc>();
            for d in 0..queue_size {
                // SAFETY: the layout holds `queue_size` 16-byte descriptors at offset 0. Marked
                // used in the lap with wrap counter 1, i.e. neither available nor used in the
                // lap the rings start in (wrap counters 0; see the module docs).
                unsafe { addr_of_mut!((*desc.add(d)).flags).write_volatile((F_AVAIL | F_USED).to_le()) };
            }
            rings.push(PackedRing {
                desc,
                // SAFETY: the driver and device areas lie inside queue `i`'s bytes.
                driver: unsafe { q.as_mut_ptr().add(layout.driver_area_offset) }.cast(),
                // SAFETY: as above.
                device: unsafe { q.as_mut_ptr().add(layout.device_area_offset) }.cast(),
                size: queue_size as u16,
                next_avail: 0,
                avail_wrap: false,
                pending: 0,
                next_used: 0,
                used_wrap: false,
                event_idx: flags.contains(VirtioFeatureFlags::RING_EVENT_IDX),
                // SAFETY: the header area follows the data buffers inside the region.
                hdrs: unsafe { buf.add(data_len + i * spec.queue_depth * HDR_STRIDE) },
            });
            vqs.push(Virtqueue::<VirtioBlkReqBuf>::new(t, q, queue_size as u16, flags).map_err(vd("ring"))?);
        }
        backend.transport.setup_queues(&vqs).map_err(vd("setting up the queues"))?;
        drop(vqs);

        let queues = rings
            .into_iter()
            .enumerate()
            .map(|(i, mut ring)| {
                ring.set_used_notifications(false);
                VirtioQueue {
                    ring,
                    notifier: backend.transport.get_submission_notifier(i),
                    call: backend.transport.get_completion_fd(i),
                    read_only,
                    to_notify: false,
                    refused: Vec::with_capacity(spec.queue_depth),
                }
            })
            .collect();
        Ok(Connected { queues, backend, buf, buf_len: data_len, capacity, request_alignment })
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

    /// With huge pages free the memory is a hugetlbfs memfd (2 MiB blocks) that holds what is
    /// written to it; without, the error names the cure instead of a bare ENOMEM.
    #[test]
    fn hugetlb_memory_is_of_huge_pages_or_says_why_not() {
        match alloc_shared(HUGE_PAGE, true) {
            Ok((fd, p)) => {
                // SAFETY: a zeroed stat buffer for fstat on our open descriptor.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
                assert_eq!(st.st_blksize as usize, HUGE_PAGE);
                // SAFETY: the mapping is HUGE_PAGE bytes long and ours.
                unsafe {
                    p.add(HUGE_PAGE - 1).write_volatile(7);
                    assert_eq!(p.add(HUGE_PAGE - 1).read_volatile(), 7);
                    libc::munmap(p.cast(), HUGE_PAGE);
                }
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
        let (fd, p) = alloc_shared(12288, false).expect("a plain memfd");
        // SAFETY: a zeroed stat buffer for fstat on our open descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        assert_eq!(st.st_size, 12288);
        // SAFETY: the mapping is 12288 bytes long and ours.
        unsafe { libc::munmap(p.cast(), 12288) };
    }
}
