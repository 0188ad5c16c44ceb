//! Dirty logging over the protocol, as QEMU drives it for a live migration: SET_LOG_BASE (its
//! exact reply, and the logs it must refuse), VHOST_F_LOG_ALL and VHOST_VRING_F_LOG toggled on
//! a running queue, and the pages a read then marks in the front-end's log.

mod common;

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{memfd, Fixture};
use fp_virtio_blk::GuestMemory;
use vhost::vhost_user::message::{
    VhostUserProtocolFeatures, VhostUserVirtioFeatures, VhostUserVringAddrFlags,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const VERSION_1: u64 = 1 << 32;
const LOG_ALL: u64 = 1 << 26;
const MEM: u64 = 1 << 20;
const DESC: u64 = 0x10000;
const AVAIL: u64 = 0x11000;
const USED: u64 = 0x12000;
const SIZE: u16 = 16;

/// A front-end that acked `protocol`, with a raw clone of its socket for the messages `vhost`'s
/// front-end would frame differently, and guest memory (1 MiB at 0, a memfd) in its table.
struct Session {
    fe: Frontend,
    raw: UnixStream,
    mem: GuestMemory,
}

impl Session {
    fn new(f: &Fixture, protocol: VhostUserProtocolFeatures) -> Session {
        let stream = UnixStream::connect(&f.sock).unwrap();
        let raw = stream.try_clone().unwrap();
        let mut fe = Frontend::from_stream(stream, 1);
        fe.set_owner().unwrap();
        assert_ne!(fe.get_features().unwrap() & LOG_ALL, 0, "VHOST_F_LOG_ALL offered");
        fe.set_features(VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()).unwrap();
        let offered = fe.get_protocol_features().unwrap();
        assert!(offered.contains(VhostUserProtocolFeatures::LOG_SHMFD), "{offered:?}");
        fe.set_protocol_features(protocol).unwrap();
        let file = memfd(MEM);
        let mem = GuestMemory::from_ranges_with_files([(
            GuestAddress(0),
            MEM as usize,
            Some(FileOffset::new(file.try_clone().unwrap(), 0)),
        )])
        .unwrap();
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM,
            userspace_addr: self_user_addr(&mem, 0),
            mmap_offset: 0,
            mmap_handle: file.as_raw_fd(),
        };
        fe.set_mem_table(&[region]).unwrap();
        Session { fe, raw, mem }
    }

    /// Sends SET_LOG_BASE for `size` bytes of `fd` and returns the reply's header, or `None`
    /// when the back-end closed the connection instead.
    fn set_log_base(&mut self, fd: &impl AsRawFd, size: u64) -> Option<[u32; 3]> {
        let mut msg = Vec::new();
        for w in [6u32, 1, 16] {
            msg.extend_from_slice(&w.to_le_bytes());
        }
        msg.extend_from_slice(&size.to_le_bytes());
        msg.extend_from_slice(&0u64.to_le_bytes());
        self.raw.send_with_fds(&[&msg[..]], &[fd.as_raw_fd()]).unwrap();
        let mut reply = [0u8; 12];
        self.raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        self.raw.read_exact(&mut reply).ok()?;
        let w = |i: usize| u32::from_le_bytes(reply[i..i + 4].try_into().unwrap());
        Some([w(0), w(4), w(8)])
    }

    fn closed(&mut self) -> bool {
        let start = Instant::now();
        while self.fe.get_features().is_ok() {
            if start.elapsed() > Duration::from_secs(10) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    fn ring(&self, log: Option<u64>) -> VringConfigData {
        VringConfigData {
            queue_max_size: SIZE,
            queue_size: SIZE,
            flags: if log.is_some() { VhostUserVringAddrFlags::VHOST_VRING_F_LOG.bits() } else { 0 },
            desc_table_addr: self_user_addr(&self.mem, DESC),
            used_ring_addr: self_user_addr(&self.mem, USED),
            avail_ring_addr: self_user_addr(&self.mem, AVAIL),
            log_addr: log,
        }
    }
}

fn self_user_addr(mem: &GuestMemory, gpa: u64) -> u64 {
    mem.get_host_address(GuestAddress(gpa)).unwrap() as u64
}

fn log_pages(log: &File, len: usize) -> Vec<u64> {
    let mut b = vec![0u8; len];
    log.read_exact_at(&mut b, 0).unwrap();
    (0..len as u64 * 8).filter(|p| b[(p / 8) as usize] & (1 << (p % 8)) != 0).collect()
}

#[test]
fn log_all_without_log_shmfd_is_refused() {
    let f = Fixture::new();
    let mut s = Session::new(&f, VhostUserProtocolFeatures::CONFIG);
    let _ = s.fe.set_features(VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() | LOG_ALL);
    assert!(s.closed(), "LOG_ALL without LOG_SHMFD accepted");
}

#[test]
fn set_log_base_replies_with_an_empty_payload_and_refuses_bad_logs() {
    let f = Fixture::new();
    let proto = VhostUserProtocolFeatures::LOG_SHMFD | VhostUserProtocolFeatures::REPLY_ACK;
    let mut s = Session::new(&f, proto);
    // 1 MiB of guest memory: 256 pages, 32 bytes of log.
    let log = memfd(4096);
    assert_eq!(s.set_log_base(&log, 32), Some([6, 0x5, 0]), "a header with REPLY set and no payload");
    assert!(s.fe.get_features().is_ok(), "the connection goes on");
    // Too small for the memory table.
    assert_eq!(s.set_log_base(&log, 31), None);
    assert!(s.closed());

    // Not mappable at all.
    let mut s = Session::new(&f, proto);
    let pipe = EventFd::new(0).unwrap();
    assert_eq!(s.set_log_base(&pipe, 32), None);
    assert!(s.closed());

    // Without LOG_SHMFD the message is not expected at all.
    let mut s = Session::new(&f, VhostUserProtocolFeatures::REPLY_ACK);
    assert_eq!(s.set_log_base(&log, 32), None);
    assert!(s.closed());
}

#[test]
fn logging_starts_and_stops_on_a_running_queue() {
    let f = Fixture::new();
    let proto = VhostUserProtocolFeatures::LOG_SHMFD | VhostUserProtocolFeatures::REPLY_ACK;
    let mut s = Session::new(&f, proto);
    s.fe.set_vring_num(0, SIZE).unwrap();
    s.fe.set_vring_addr(0, &s.ring(None)).unwrap();
    s.fe.set_vring_base(0, 0).unwrap();
    let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    s.fe.set_vring_call(0, &call).unwrap();
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    s.fe.set_vring_kick(0, &kick).unwrap();
    s.fe.set_vring_enable(0, true).unwrap();
    assert!(s.fe.get_features().is_ok(), "queue started");

    // A read of 8 KiB into pages 0x40-0x41, status in page 0x31.
    let mut avail_idx = 0u16;
    let mut read = |s: &Session| {
        let m = &s.mem;
        m.write_obj(0u32, GuestAddress(0x30000)).unwrap();
        m.write_obj(0u64, GuestAddress(0x30008)).unwrap();
        let bufs = [(0x30000u64, 16u32, 0u16), (0x40000, 8192, 2), (0x31000, 1, 2)];
        for (i, (addr, len, write)) in bufs.into_iter().enumerate() {
            let at = DESC + 16 * i as u64;
            m.write_obj(addr, GuestAddress(at)).unwrap();
            m.write_obj(len, GuestAddress(at + 8)).unwrap();
            m.write_obj(write | if i < 2 { 1 } else { 0 }, GuestAddress(at + 12)).unwrap();
            m.write_obj(i as u16 + 1, GuestAddress(at + 14)).unwrap();
        }
        m.write_obj(0u16, GuestAddress(AVAIL + 4 + 2 * u64::from(avail_idx % SIZE))).unwrap();
        avail_idx += 1;
        m.write_obj(avail_idx, GuestAddress(AVAIL + 2)).unwrap();
        kick.write(1).unwrap();
        let start = Instant::now();
        while m.read_obj::<u16>(GuestAddress(USED + 2)).unwrap() != avail_idx {
            assert!(start.elapsed() < Duration::from_secs(10), "read not completed");
            std::thread::sleep(Duration::from_millis(1));
        }
    };

    // Migration starts: the log, then LOG_ALL and VHOST_VRING_F_LOG on the running queue.
    let log = memfd(32);
    assert_eq!(s.set_log_base(&log, 32), Some([6, 0x5, 0]));
    s.fe.set_features(VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() | LOG_ALL).unwrap();
    s.fe.set_vring_addr(0, &s.ring(Some(USED))).unwrap();
    assert!(s.fe.get_features().is_ok(), "logging accepted on the running queue");
    read(&s);
    assert_eq!(log_pages(&log, 32), vec![0x12, 0x31, 0x40, 0x41], "used ring, status, data");
    let stats = f.ctrl().info().stats;
    assert_eq!(stats.logged_data_pages, 2);

    // Migration ends (cancelled): logging stops, and nothing more is marked.
    s.fe.set_features(VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()).unwrap();
    s.fe.set_vring_addr(0, &s.ring(None)).unwrap();
    // A request with a reply: the back-end has served the two messages above.
    assert!(s.fe.get_features().is_ok());
    log.write_all_at(&[0u8; 32], 0).unwrap();
    read(&s);
    assert_eq!(log_pages(&log, 32), Vec::<u64>::new());

    // Anything else on the running queue is still refused.
    let _ = s.fe.set_features(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
    assert!(s.closed(), "dropping VIRTIO_F_VERSION_1 on a running queue accepted");
}
