//! The vhost-user frontend back end: fp-load's own frontend, set up through the `vhost` crate's
//! `Frontend` and driving split rings of its own (`split.rs`), so that it can do what libblkio
//! and virtio-driver cannot: turn on dirty logging the way QEMU does during a migration
//! ([`LoadSpec::dirty_log`]).
//!
//! The device starts as QEMU starts it (`vhost_dev_start`: features, memory table, rings,
//! enable). With `dirty_log` logging is then turned on as QEMU turns it on for a running
//! device when a migration starts (vhost-user.rst, "Migration"; QEMU's
//! `vhost_log_global_start`, then `vhost_dev_set_log`): `SET_LOG_BASE` with a memfd log sized
//! for the memory (`VHOST_USER_PROTOCOL_F_LOG_SHMFD`), `SET_FEATURES` with `VHOST_F_LOG_ALL`,
//! and every ring's `SET_VRING_ADDR` again with `VHOST_VRING_F_LOG` and its used ring's guest
//! address. A sync thread scans and clears the log every [`LOG_SYNC_INTERVAL`]
//! (`log_sync.rs`). Without `dirty_log` the same frontend runs without any of that, so that
//! logging off and on differ in the logging alone.
//!
//! The frontend's memory is one memfd region at guest-physical address 0: the data buffers,
//! then the request headers and status bytes, then the rings ([`RegionLayout`]), sent whole
//! with `SET_MEM_TABLE` once, before the rings start: no `CONFIGURE_MEM_SLOTS` needed, and no
//! table ever changes under a running ring. That is what SPDK's vhost target (rte_vhost in
//! SPDK 23.01) accepts: it offers no `CONFIGURE_MEM_SLOTS`, and it registers every region for
//! DMA from its 2 MiB-aligned start, so the region must be hugetlbfs-backed: with
//! [`LoadSpec::hugetlb`], or when the device lacks `CONFIGURE_MEM_SLOTS`, it is a memfd of
//! 2 MiB huge pages. SPDK also starts a device asynchronously after its rings are enabled:
//! before returning, `connect` sends one read through each queue and waits for it
//! ([`START_TIMEOUT`]), so that no measured request waits for the start.
//!
//! `SET_LOG_BASE` is sent here rather than through `Frontend::set_log_base`, which expects the
//! back end to echo the 16-byte log description: back ends answer differently (libvhost-user,
//! in qemu-storage-daemon, with a u64; flashpath with an empty payload) and QEMU accepts any.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use fp_virtq::driver::{DriverMem, SharedMem, SplitLayout};

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_F_SIZE_MAX,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::backend::{
    check_geometry, queue_size_for, round_up, Backend, BlkQueue, BlkRing, CompletionFd, Connected, VringFds,
    BUF_ALIGN, HDR_STRIDE,
};
use super::log_sync::{log_bytes_for, LogSync, PageMap, LOG_PAGE};
use super::split::SplitRing;
use super::virtio::{alloc_shared, HUGE_PAGE};
use crate::{DirtyLogReport, LoadError, LoadSpec};

/// How long a queue's first request may take once the rings are enabled (SPDK starts its
/// session asynchronously, some 20 ms after the last ring is enabled).
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the sync thread scans the log (QEMU syncs at least once per migration iteration).
pub(crate) const LOG_SYNC_INTERVAL: Duration = Duration::from_millis(100);

/// `VHOST_F_LOG_ALL` (vhost-user.rst: feature bit 26).
const VHOST_F_LOG_ALL: u64 = 1 << 26;
/// `VHOST_VRING_F_LOG`: log the used ring at `log_guest_addr` (vhost-user.rst, "Migration").
const VHOST_VRING_F_LOG: u32 = 1;
/// `VHOST_USER_SET_LOG_BASE`'s request code and the header's version and reply flags.
const SET_LOG_BASE: u32 = 6;
const HDR_VERSION: u32 = 0x1;
const HDR_REPLY: u32 = 0x4;

fn vu(op: &'static str) -> impl FnOnce(vhost::Error) -> LoadError {
    move |e| LoadError::Vhost { op, message: e.to_string() }
}

fn os(op: &'static str) -> impl FnOnce(io::Error) -> LoadError {
    move |source| LoadError::Os { op, source }
}

/// Where the parts of the one memory region lie, as offsets from its start (guest-physical
/// addresses): data buffers, then headers and status bytes, then one ring per queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RegionLayout {
    /// Bytes of data buffers from offset 0.
    pub(super) data_len: usize,
    /// Bytes of headers from `data_len`: `HDR_STRIDE` per slot of every queue.
    pub(super) hdr_len: usize,
    /// The rings' layout; ring `i` starts at `rings + i * ring.len`.
    pub(super) ring: SplitLayout,
    pub(super) rings: usize,
    /// The region's length: a multiple of [`HUGE_PAGE`] with `hugetlb`.
    pub(super) len: usize,
}

impl RegionLayout {
    pub(super) fn new(buf_len: usize, queues: usize, depth: usize, queue_size: usize, hugetlb: bool) -> Self {
        let ring = SplitLayout::new(queue_size);
        let data_len = round_up(buf_len, BUF_ALIGN);
        let hdr_len = round_up(queues * depth * HDR_STRIDE, BUF_ALIGN);
        let rings = data_len + hdr_len;
        let used = rings + queues * ring.len;
        let len = if hugetlb { round_up(used, HUGE_PAGE) } else { used };
        RegionLayout { data_len, hdr_len, ring, rings, len }
    }

    /// Offset of queue `i`'s ring.
    pub(super) fn ring_at(&self, i: usize) -> usize {
        self.rings + i * self.ring.len
    }

    /// Offset of queue `i`'s first header, for `depth` slots per queue.
    pub(super) fn hdrs_at(&self, i: usize, depth: usize) -> usize {
        self.data_len + i * depth * HDR_STRIDE
    }
}

/// The connection, the memory region and the dirty log (its sync thread holds the log's
/// mapping). Dropped after the queues.
pub(super) struct VhostFrontend {
    _frontend: Frontend,
    _mem: Arc<SharedMem>,
    log: Option<LogSync>,
    hugetlb: bool,
}

/// A ring's kick and call eventfds, which the back end was given.
pub(super) struct KickCall {
    kick: EventFd,
    call: EventFd,
    /// Kicks sent.
    kicks: u64,
}

impl VringFds for KickCall {
    fn kick(&mut self) -> Result<(), LoadError> {
        self.kick.write(1).map_err(os("kick"))?;
        self.kicks += 1;
        Ok(())
    }

    fn completion_fd(&mut self) -> Result<CompletionFd, LoadError> {
        Ok(CompletionFd::Vmm(self.call.try_clone().map_err(os("dup"))?))
    }

    fn kicks(&self) -> Option<u64> {
        Some(self.kicks)
    }
}

pub(super) type FrontendQueue = BlkQueue<SplitRing, KickCall>;

/// Sends `SET_LOG_BASE` with the log's memfd on `sock` (a duplicate of the frontend's socket)
/// and waits for the back end's reply, whatever its payload (see the module docs).
fn set_log_base(sock: &mut UnixStream, log: BorrowedFd<'_>, size: u64) -> Result<(), LoadError> {
    let mut msg = Vec::with_capacity(28);
    for w in [SET_LOG_BASE, HDR_VERSION, 16] {
        msg.extend_from_slice(&w.to_le_bytes());
    }
    msg.extend_from_slice(&size.to_le_bytes()); // mmap_size
    msg.extend_from_slice(&0u64.to_le_bytes()); // mmap_offset
    let sent = fp_sys::send_with_fds(sock.as_fd(), &msg, &[log]).map_err(os("SET_LOG_BASE"))?;
    if sent != msg.len() {
        return Err(LoadError::Vhost {
            op: "SET_LOG_BASE",
            message: format!("sent {sent} of {} bytes", msg.len()),
        });
    }
    let mut hdr = [0u8; 12];
    sock.read_exact(&mut hdr).map_err(os("SET_LOG_BASE reply"))?;
    let word = |i: usize| u32::from_le_bytes(hdr[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let (req, flags, len) = (word(0), word(1), word(2));
    if req != SET_LOG_BASE || flags & HDR_REPLY == 0 || len > 64 {
        return Err(LoadError::Vhost {
            op: "SET_LOG_BASE",
            message: format!("unexpected reply: request {req}, flags {flags:#x}, size {len}"),
        });
    }
    let mut body = vec![0u8; len as usize];
    sock.read_exact(&mut body).map_err(os("SET_LOG_BASE reply"))?;
    Ok(())
}

/// Sends one read of `len` bytes at sector 0 into process address `buf` through `q` (slot 0, nothing else in
/// flight) and polls for its completion: the device has started the queue once it answers.
fn wait_started(q: &mut FrontendQueue, buf: u64, len: usize) -> Result<(), LoadError> {
    q.ring.push(0, false, 0, buf, len);
    if q.ring.notify_needed() {
        q.fds.kick.write(1).map_err(os("kick"))?;
    }
    let start = std::time::Instant::now();
    loop {
        if let Some((_, status)) = q.ring.pop() {
            if status != 0 {
                return Err(LoadError::Vhost {
                    op: "start",
                    message: format!("the first read completed with virtio-blk status {status}"),
                });
            }
            return Ok(());
        }
        if start.elapsed() > START_TIMEOUT {
            return Err(LoadError::Vhost {
                op: "start",
                message: format!("no queue started: a first read got no answer in {START_TIMEOUT:?}"),
            });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Reads the virtio-blk config's capacity (sectors) and block size (when offered).
fn read_config(fe: &mut Frontend, features: u64) -> Result<(u64, u32), LoadError> {
    // capacity u64, size_max u32, seg_max u32, geometry (4 bytes), blk_size u32 (§5.2.4).
    let (_, cfg) =
        fe.get_config(0, 24, VhostUserConfigFlags::empty(), &[0u8; 24]).map_err(vu("GET_CONFIG"))?;
    let capacity = u64::from_le_bytes(cfg[0..8].try_into().expect("8 bytes")) * 512;
    let blk = if features & (1 << VIRTIO_BLK_F_BLK_SIZE) != 0 {
        u32::from_le_bytes(cfg[20..24].try_into().expect("4 bytes")).max(1)
    } else {
        512
    };
    Ok((capacity, blk))
}

impl Backend for VhostFrontend {
    type Queue = FrontendQueue;

    fn connect(spec: &LoadSpec, buf_len: usize) -> Result<Connected<Self>, LoadError> {
        let sock = UnixStream::connect(&spec.socket).map_err(os("connect"))?;
        let mut raw = sock.try_clone().map_err(os("dup"))?;
        let mut fe = Frontend::from_stream(sock, spec.num_queues as u64);
        fe.set_owner().map_err(vu("SET_OWNER"))?;
        let offered = fe.get_features().map_err(vu("GET_FEATURES"))?;
        let proto = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if offered & proto == 0 || offered & (1 << VIRTIO_F_VERSION_1) == 0 {
            return Err(LoadError::Unsupported(
                "the server offers no VHOST_USER_F_PROTOCOL_FEATURES or VIRTIO_F_VERSION_1".into(),
            ));
        }
        let pf = fe.get_protocol_features().map_err(vu("GET_PROTOCOL_FEATURES"))?;
        let mut want = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG;
        if spec.dirty_log {
            if !pf.contains(VhostUserProtocolFeatures::LOG_SHMFD) || offered & VHOST_F_LOG_ALL == 0 {
                return Err(LoadError::Unsupported(format!(
                    "--dirty-log: the server does not offer {}",
                    if offered & VHOST_F_LOG_ALL == 0 {
                        "VHOST_F_LOG_ALL"
                    } else {
                        "VHOST_USER_PROTOCOL_F_LOG_SHMFD"
                    }
                )));
            }
            want |= VhostUserProtocolFeatures::LOG_SHMFD;
        }
        if !pf.contains(VhostUserProtocolFeatures::CONFIG) {
            return Err(LoadError::Unsupported(
                "the server does not offer VHOST_USER_PROTOCOL_F_CONFIG".into(),
            ));
        }
        fe.set_protocol_features(pf & want).map_err(vu("SET_PROTOCOL_FEATURES"))?;
        let max_queues = if pf.contains(VhostUserProtocolFeatures::MQ) {
            fe.get_queue_num().map_err(vu("GET_QUEUE_NUM"))? as usize
        } else {
            1
        };
        let (capacity, request_alignment) = read_config(&mut fe, offered)?;
        check_geometry(spec, request_alignment, max_queues)?;
        let read_only = spec.read_only || spec.pattern.is_read_only();
        if offered & (1 << VIRTIO_BLK_F_RO) != 0 && !read_only {
            return Err(LoadError::Os { op: "start", source: io::Error::from_raw_os_error(libc::EROFS) });
        }
        let blk = [
            VIRTIO_BLK_F_SIZE_MAX,
            VIRTIO_BLK_F_SEG_MAX,
            VIRTIO_BLK_F_RO,
            VIRTIO_BLK_F_BLK_SIZE,
            VIRTIO_BLK_F_FLUSH,
            VIRTIO_BLK_F_MQ,
        ]
        .iter()
        .fold(0u64, |f, b| f | 1 << b);
        let features = offered & (blk | proto | 1 << VIRTIO_F_VERSION_1);
        fe.set_features(features).map_err(vu("SET_FEATURES"))?;

        // One region: data buffers, headers and status bytes, rings.
        let n = spec.num_queues;
        let queue_size = queue_size_for(spec.queue_depth);
        let hugetlb = spec.hugetlb || !pf.contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS);
        let lay = RegionLayout::new(buf_len, n, spec.queue_depth, queue_size, hugetlb);
        let (layout, data_len, hdr_len, len) = (lay.ring, lay.data_len, lay.hdr_len, lay.len);
        let mem = Arc::new(alloc_shared(len, hugetlb)?);
        let region: DriverMem = mem.view();
        let mut backend = VhostFrontend { _frontend: fe, _mem: mem, log: None, hugetlb };
        let fe = &mut backend._frontend;
        let table = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: len as u64,
            userspace_addr: region.addr_of(0),
            mmap_offset: 0,
            mmap_handle: backend._mem.fd().as_raw_fd(),
        };
        fe.set_mem_table(&[table]).map_err(vu("SET_MEM_TABLE"))?;

        let mut queues = Vec::with_capacity(n);
        let mut addrs = Vec::with_capacity(n);
        for i in 0..n {
            // Queue `i`'s ring and headers in the (zeroed) region; queue_size_for gives at least
            // three entries per slot.
            let ring = SplitRing::new(
                region.sub(lay.ring_at(i), layout.len),
                queue_size as u16,
                spec.queue_depth,
                &region.sub(lay.hdrs_at(i, spec.queue_depth), spec.queue_depth * HDR_STRIDE),
                &region,
            );
            let ring_va = region.addr_of(lay.ring_at(i));
            fe.set_vring_num(i, queue_size as u16).map_err(vu("SET_VRING_NUM"))?;
            fe.set_vring_base(i, 0).map_err(vu("SET_VRING_BASE"))?;
            let addr = VringConfigData {
                queue_max_size: queue_size as u16,
                queue_size: queue_size as u16,
                flags: 0,
                desc_table_addr: ring_va,
                used_ring_addr: ring_va + layout.used as u64,
                avail_ring_addr: ring_va + layout.avail as u64,
                log_addr: None,
            };
            fe.set_vring_addr(i, &addr).map_err(vu("SET_VRING_ADDR"))?;
            addrs.push(VringConfigData { flags: VHOST_VRING_F_LOG, log_addr: Some(ring.used_gpa()), ..addr });
            let kick = EventFd::new(EFD_NONBLOCK).map_err(os("eventfd"))?;
            let call = EventFd::new(EFD_NONBLOCK).map_err(os("eventfd"))?;
            fe.set_vring_kick(i, &kick).map_err(vu("SET_VRING_KICK"))?;
            fe.set_vring_call(i, &call).map_err(vu("SET_VRING_CALL"))?;
            let mut ring = ring;
            ring.set_used_notifications(false);
            queues.push(BlkQueue::new(ring, KickCall { kick, call, kicks: 0 }, read_only, spec.queue_depth));
        }

        let fe = &mut backend._frontend;
        for i in 0..n {
            fe.set_vring_enable(i, true).map_err(vu("SET_VRING_ENABLE"))?;
        }
        let probe_len = request_alignment as usize;
        for q in queues.iter_mut() {
            wait_started(q, region.addr_of(0), probe_len)?;
        }

        // Logging on, as QEMU turns it on for a running device when a migration starts
        // (vhost_log_global_start, then vhost_dev_set_log): the log, LOG_ALL, then each ring's
        // used-ring logging. No request is in flight yet.
        if spec.dirty_log {
            let log_len = log_bytes_for(len as u64);
            let log = Arc::new(alloc_shared(log_len as usize, false)?);
            set_log_base(&mut raw, log.fd(), log_len)?;
            fe.set_features(features | VHOST_F_LOG_ALL).map_err(vu("SET_FEATURES"))?;
            for (i, a) in addrs.iter().enumerate() {
                fe.set_vring_addr(i, a).map_err(vu("SET_VRING_ADDR"))?;
            }
            // Neither message has a reply without REPLY_ACK: QEMU then sends GET_FEATURES and
            // waits for its answer (vhost-user.c, `enforce_reply`), so that the back end has
            // taken both in before anything else happens. The same here, before any request.
            fe.get_features().map_err(vu("GET_FEATURES"))?;
            let page = |b: usize| b as u64 / LOG_PAGE;
            let slot_pages = (spec.block_size as u64).div_ceil(LOG_PAGE);
            let reads = spec.pattern != crate::Pattern::RandWrite
                && spec.pattern != crate::Pattern::Write
                && !(spec.pattern == crate::Pattern::RandRw && spec.read_percent == 0);
            let map = PageMap {
                data: 0..page(data_len),
                headers: page(data_len)..page(data_len + hdr_len),
                rings: page(data_len + hdr_len)..page(len),
                data_pages_expected: if reads { (n * spec.queue_depth) as u64 * slot_pages } else { 0 },
            };
            let sync = LogSync::start(log.view(), LOG_SYNC_INTERVAL, spec.cpu, map)
                .map_err(os("starting the log sync thread"))?;
            backend.log = Some(sync);
        }
        let data = region.sub(0, data_len);
        Ok(Connected { queues, backend, data, capacity, request_alignment })
    }

    fn dirty_log(&mut self) -> Option<DirtyLogReport> {
        self.log.as_mut().and_then(|l| l.finish())
    }

    fn hugetlb(&self) -> bool {
        self.hugetlb
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every part lies inside the region, after the one before it, and aligned as its users
    /// need: buffers and headers on BUF_ALIGN, rings on pages, the whole on 2 MiB with huge
    /// pages (hugetlbfs mappings come in whole pages).
    #[test]
    fn the_region_holds_its_parts_in_order_and_aligned() {
        for (buf_len, queues, depth, hugetlb) in [
            (4096, 1, 1, false),
            (32 * 4096, 1, 32, true),
            (2 * 128 * 4096, 2, 128, true),
            (4 << 20, 3, 64, false),
        ] {
            let size = queue_size_for(depth);
            let l = RegionLayout::new(buf_len, queues, depth, size, hugetlb);
            let what = format!("{buf_len} bytes, {queues} queues of depth {depth}, hugetlb {hugetlb}");
            assert!(l.data_len >= buf_len, "{what}");
            assert_eq!(l.data_len % BUF_ALIGN, 0, "{what}");
            assert!(l.hdr_len >= queues * depth * HDR_STRIDE, "{what}");
            assert_eq!(l.rings, l.data_len + l.hdr_len, "{what}");
            assert_eq!(l.ring, SplitLayout::new(size), "{what}");
            for q in 0..queues {
                assert_eq!(l.ring_at(q) % 4096, 0, "{what}: ring {q}");
                let hdrs = l.hdrs_at(q, depth);
                assert!(hdrs >= l.data_len && hdrs + depth * HDR_STRIDE <= l.rings, "{what}: headers {q}");
            }
            let end = l.ring_at(queues - 1) + l.ring.len;
            assert!(end <= l.len, "{what}");
            if hugetlb {
                assert_eq!(l.len % HUGE_PAGE, 0, "{what}");
                assert!(l.len - end < HUGE_PAGE, "{what}: more than one page of padding");
            } else {
                assert_eq!(l.len, end, "{what}: no padding without huge pages");
            }
        }
    }

    /// Huge pages only pad the end: every part stays where it is without them, so the two
    /// memory kinds differ in the page size alone.
    #[test]
    fn huge_pages_only_pad_the_end() {
        let (a, b) =
            (RegionLayout::new(131072, 2, 32, 128, false), RegionLayout::new(131072, 2, 32, 128, true));
        assert_eq!((a.data_len, a.hdr_len, a.rings, a.ring), (b.data_len, b.hdr_len, b.rings, b.ring));
        assert_eq!(b.len, HUGE_PAGE);
    }
}
