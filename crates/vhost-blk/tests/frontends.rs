//! Every vhost-user front end we know of attaches and does I/O: each test replays the messages
//! one front end sends, in its order and with its values, against a real controller over its
//! Unix socket, then writes and reads back data through the rings.
//!
//! - QEMU 10's vhost-user-blk-pci: realize (vhost_user_backend_init, vhost_dev_init, the config
//!   read) and start (vhost_user_blk_start, vhost_dev_start), every request with NEED_REPLY.
//! - SPDK's virtio-user (lib/virtio/virtio_vhost_user.c, bdev_virtio_blk.c, v23.01): the queue
//!   enabled with its size as the value, before anything else about the ring; the config space
//!   read whole once per field; the memory table with guest addresses equal to its own virtual
//!   addresses.
//! - libblkio (the virtio-driver crate): the real library, in process.
//!
//! Then the front ends see each other's data, and out-of-range config reads are refused.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use blkio::{Blkio, ReqFlags};
use common::{memfd, Fixture};
use fp_virtio_blk::GuestMemory;
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserInflight, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::EventFd;

const MEM: u64 = 1 << 20;
/// The ring's descriptor table; the available and used rings follow as a split ring's legacy
/// layout puts them (what SPDK's virtio library allocates).
const RING: u64 = 0x10000;
/// Request header, status byte and data buffers, as offsets into guest memory.
const HDR: u64 = 0x30000;
const STATUS: u64 = 0x31000;
const DATA: u64 = 0x40000;
const READ_BACK: u64 = 0x50000;

const VIRTIO_BLK_T_IN: u32 = 0;
const VIRTIO_BLK_T_OUT: u32 = 1;
const VERSION_1: u64 = 1 << 32;
const EVENT_IDX: u64 = 1 << 29;
const PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
/// VHOST_USER_SET_VRING_ENABLE's request code.
const SET_VRING_ENABLE: u32 = 18;
/// VHOST_USER_GET_CONFIG's request code.
const GET_CONFIG: u32 = 24;
/// VHOST_USER_MAX_CONFIG_SIZE in SPDK's and DPDK's vhost-user headers: what SPDK's virtio-user
/// asks for on every config read.
const SPDK_CONFIG_READ: u32 = 256;

/// Guest memory in a memfd, and the guest physical address the front end gives its start.
struct Ram {
    file: std::fs::File,
    mem: GuestMemory,
    gpa_base: u64,
}

impl Ram {
    /// `gpa_is_vaddr`: SPDK's virtio-user registers its hugepages with guest physical address =
    /// its own virtual address; QEMU's guest memory starts at 0.
    fn new(gpa_is_vaddr: bool) -> Ram {
        let file = memfd(MEM);
        let mem = GuestMemory::from_ranges_with_files([(
            GuestAddress(0),
            MEM as usize,
            Some(FileOffset::new(file.try_clone().unwrap(), 0)),
        )])
        .unwrap();
        let mut ram = Ram { file, mem, gpa_base: 0 };
        if gpa_is_vaddr {
            ram.gpa_base = ram.vaddr(0);
        }
        ram
    }

    /// The front end's virtual address of `offset` (ring addresses are sent as these).
    fn vaddr(&self, offset: u64) -> u64 {
        self.mem.get_host_address(GuestAddress(offset)).unwrap() as u64
    }

    fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: self.gpa_base,
            memory_size: MEM,
            userspace_addr: self.vaddr(0),
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }
}

/// One split ring, driven by the test as a virtio-blk driver: one request at a time, in
/// descriptors 0-2.
struct Ring {
    size: u16,
    avail: u64,
    used: u64,
    avail_idx: u16,
    kick: EventFd,
    call: EventFd,
}

impl Ring {
    fn new(size: u16) -> Ring {
        let n = u64::from(size);
        let avail = RING + 16 * n;
        // The used ring starts at the next 4 KiB boundary after the available ring and its
        // used_event field (SPDK_ALIGN_CEIL(.., VIRTIO_PCI_VRING_ALIGN)).
        let used = (avail + 6 + 2 * n).next_multiple_of(4096);
        assert!(used + 6 + 8 * n <= HDR, "ring overlaps the buffers");
        Ring {
            size,
            avail,
            used,
            avail_idx: 0,
            kick: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            call: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        }
    }

    fn config(&self, ram: &Ram) -> VringConfigData {
        VringConfigData {
            queue_max_size: self.size,
            queue_size: self.size,
            flags: 0,
            desc_table_addr: ram.vaddr(RING),
            used_ring_addr: ram.vaddr(self.used),
            avail_ring_addr: ram.vaddr(self.avail),
            log_addr: None,
        }
    }

    /// Submits one request of `len` bytes at `sector` with its data at `data` and waits for the
    /// device to complete it. Returns the status byte.
    fn request(&mut self, ram: &Ram, kind: u32, sector: u64, data: u64, len: u32) -> u8 {
        let m = &ram.mem;
        m.write_obj(kind, GuestAddress(HDR)).unwrap();
        m.write_obj(0u32, GuestAddress(HDR + 4)).unwrap();
        m.write_obj(sector, GuestAddress(HDR + 8)).unwrap();
        m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        const NEXT: u16 = 1;
        const WRITE: u16 = 2;
        let data_flags = if kind == VIRTIO_BLK_T_IN { NEXT | WRITE } else { NEXT };
        let chain = [(HDR, 16, NEXT), (data, len, data_flags), (STATUS, 1, WRITE)];
        for (i, (at, len, flags)) in chain.into_iter().enumerate() {
            let d = RING + 16 * i as u64;
            m.write_obj(ram.gpa_base + at, GuestAddress(d)).unwrap();
            m.write_obj(len, GuestAddress(d + 8)).unwrap();
            m.write_obj(flags, GuestAddress(d + 12)).unwrap();
            m.write_obj(i as u16 + 1, GuestAddress(d + 14)).unwrap();
        }
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % self.size);
        m.write_obj(0u16, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        m.write_obj(self.avail_idx, GuestAddress(self.avail + 2)).unwrap();
        self.kick.write(1).unwrap();
        let start = Instant::now();
        while m.read_obj::<u16>(GuestAddress(self.used + 2)).unwrap() != self.avail_idx {
            assert!(start.elapsed() < Duration::from_secs(10), "request not completed");
            std::thread::sleep(Duration::from_millis(1));
        }
        m.read_obj(GuestAddress(STATUS)).unwrap()
    }

    /// Writes `pattern` to 8 KiB at sector 8, reads it back into another buffer, and checks it.
    fn write_and_verify(&mut self, ram: &Ram, pattern: u8) {
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8 ^ pattern).collect();
        ram.mem.write_slice(&data, GuestAddress(DATA)).unwrap();
        assert_eq!(self.request(ram, VIRTIO_BLK_T_OUT, 8, DATA, 8192), 0, "write status");
        ram.mem.write_slice(&[0u8; 8192], GuestAddress(READ_BACK)).unwrap();
        assert_eq!(self.request(ram, VIRTIO_BLK_T_IN, 8, READ_BACK, 8192), 0, "read status");
        let mut back = vec![0u8; 8192];
        ram.mem.read_slice(&mut back, GuestAddress(READ_BACK)).unwrap();
        assert!(back == data, "data read back differs from data written");
    }
}

/// SET_VRING_ENABLE with any value, as SPDK frames it: version 1, no reply asked for.
fn set_vring_enable_raw(raw: &mut UnixStream, index: u32, num: u32) {
    let mut msg = Vec::with_capacity(20);
    for w in [SET_VRING_ENABLE, 0x1, 8, index, num] {
        msg.extend_from_slice(&w.to_le_bytes());
    }
    raw.write_all(&msg).unwrap();
}

/// GET_CONFIG of `size` bytes at `offset`, framed by hand; returns the reply's offset and size.
fn get_config_raw(raw: &mut UnixStream, offset: u32, size: u32) -> (u32, u32) {
    let mut msg = Vec::new();
    for w in [GET_CONFIG, 0x1, 12 + size, offset, size, 0] {
        msg.extend_from_slice(&w.to_le_bytes());
    }
    msg.resize(msg.len() + size as usize, 0);
    raw.write_all(&msg).unwrap();
    let mut reply = [0u8; 24];
    raw.read_exact(&mut reply).unwrap();
    let w = |i: usize| u32::from_le_bytes(reply[i..i + 4].try_into().unwrap());
    assert_eq!((w(0), w(4), w(8)), (GET_CONFIG, 0x5, 12), "a reply header with the config header only");
    (w(12), w(16))
}

/// A field of a whole-config-space read, as SPDK's virtio_user_read_dev_config takes it.
fn field<const N: usize>(cfg: &[u8], offset: usize) -> [u8; N] {
    cfg[offset..offset + N].try_into().unwrap()
}

fn connect(f: &Fixture) -> UnixStream {
    UnixStream::connect(&f.sock).unwrap()
}

/// Runs `test` and fails if it has not finished within a generous minute: `vhost`'s front end
/// waits for a reply without a time-out (it retries through receive time-outs), so a back-end
/// that never answers would otherwise hang the test.
fn bounded(test: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        test();
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => t.join().unwrap(),
        // The test panicked: report its panic.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(t.join().unwrap_err())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("no answer from the controller within 60 s")
        }
    }
}

/// An attached front end: its protocol connection, memory and ring.
struct Attached {
    fe: Frontend,
    raw: UnixStream,
    ram: Ram,
    ring: Ring,
}

/// SPDK's `bdev_virtio_attach_controller --dev-type blk --trtype user`: the messages of
/// virtio_user_dev_init, virtio_dev_reset, virtio_blk_dev_init and virtio_dev_start, in order.
fn spdk_virtio_user_attach(f: &Fixture, queue_size: u16) -> Attached {
    let mut raw = connect(f);
    let mut fe = Frontend::from_stream(raw.try_clone().unwrap(), 1);
    // virtio_user_dev_init.
    fe.set_owner().unwrap();
    // virtio_negotiate_features: the features bdev_virtio_blk wants, VERSION_1 and
    // PROTOCOL_FEATURES, as far as the device offers them; then MQ and CONFIG.
    let wanted = (1 << 1) | (1 << 2) | (1 << 5) | (1 << 6) | (1 << 10) | (1 << 12) | (1 << 13);
    let offered = fe.get_features().unwrap();
    assert_ne!(offered & PROTOCOL_FEATURES, 0);
    fe.set_features(offered & (wanted | EVENT_IDX | VERSION_1 | PROTOCOL_FEATURES)).unwrap();
    let protocol = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(protocol & (VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG))
        .unwrap();
    // virtio_blk_dev_init: blk_size, capacity, num_queues, seg_max; each read asks for the
    // whole 256 bytes at offset 0 and takes its field from the reply.
    let mut read_config = || {
        let (reply, cfg) = fe
            .get_config(0, SPDK_CONFIG_READ, VhostUserConfigFlags::empty(), &[0; SPDK_CONFIG_READ as usize])
            .unwrap();
        assert_eq!((reply.offset, reply.size), (0, SPDK_CONFIG_READ));
        cfg
    };
    assert_eq!(u32::from_le_bytes(field(&read_config(), 20)), 512, "blk_size");
    assert_eq!(u64::from_le_bytes(field(&read_config(), 0)), 2048, "capacity");
    assert_eq!(u16::from_le_bytes(field(&read_config(), 34)), 1, "num_queues");
    assert_ne!(u32::from_le_bytes(field(&read_config(), 12)), 0, "seg_max");
    // virtio_dev_start -> virtio_alloc_queues -> virtio_user_setup_queue: the queue is enabled
    // with its size as the value, before its size, addresses or fds are known.
    set_vring_enable_raw(&mut raw, 0, u32::from(queue_size));
    // DRIVER_OK -> virtio_user_start_device.
    assert_eq!(fe.get_queue_num().unwrap(), 1);
    let ram = Ram::new(true);
    let ring = Ring::new(queue_size);
    fe.set_vring_call(0, &ring.call).unwrap();
    fe.set_mem_table(&[ram.region()]).unwrap();
    // SPDK waits for a reply to know the table is in place (it does not use REPLY_ACK).
    fe.get_features().unwrap();
    fe.set_vring_num(0, queue_size).unwrap();
    fe.set_vring_base(0, 0).unwrap();
    fe.set_vring_addr(0, &ring.config(&ram)).unwrap();
    fe.set_vring_kick(0, &ring.kick).unwrap();
    Attached { fe, raw, ram, ring }
}

/// QEMU 10's vhost-user-blk-pci: realize, then the guest driver's DRIVER_OK.
fn qemu_vhost_user_blk_start(f: &Fixture) -> Attached {
    const QUEUE_SIZE: u16 = 128;
    let raw = connect(f);
    let mut fe = Frontend::from_stream(raw.try_clone().unwrap(), 1);
    // vhost_user_backend_init: QEMU knows every protocol feature the device offers.
    let offered = fe.get_features().unwrap();
    let protocol = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(protocol).unwrap();
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    assert_eq!(fe.get_queue_num().unwrap(), 1);
    assert!(fe.get_max_mem_slots().unwrap() >= 8);
    let (backend_channel, _qemu_end) = UnixStream::pair().unwrap();
    fe.set_backend_request_fd(&backend_channel).unwrap();
    // vhost_dev_init: owner, features again, and each queue's masked call notifier.
    fe.set_owner().unwrap();
    assert_eq!(fe.get_features().unwrap(), offered);
    let masked = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    fe.set_vring_call(0, &masked).unwrap();
    // vhost_user_blk_realize_connect: config_len bytes at offset 0 (36 without discard and
    // write-zeroes, more with them).
    let (_, cfg) = fe.get_config(0, 36, VhostUserConfigFlags::empty(), &[0; 36]).unwrap();
    assert_eq!(u64::from_le_bytes(field(&cfg, 0)), 2048, "capacity");
    // vhost_user_blk_start: the guest notifiers, the in-flight area, then vhost_dev_start.
    let ring = Ring::new(QUEUE_SIZE);
    fe.set_vring_call(0, &ring.call).unwrap();
    let (inflight, file) = fe.get_inflight_fd(&VhostUserInflight::new(0, 0, 1, QUEUE_SIZE)).unwrap();
    fe.set_inflight_fd(&inflight, file.as_raw_fd()).unwrap();
    fe.set_features(offered & (VERSION_1 | EVENT_IDX | PROTOCOL_FEATURES | (1 << 6) | (1 << 12))).unwrap();
    let ram = Ram::new(false);
    fe.add_mem_region(&ram.region()).unwrap();
    fe.set_vring_num(0, QUEUE_SIZE).unwrap();
    fe.set_vring_base(0, 0).unwrap();
    fe.set_vring_addr(0, &ring.config(&ram)).unwrap();
    fe.set_vring_kick(0, &ring.kick).unwrap();
    fe.set_vring_call(0, &ring.call).unwrap();
    fe.set_vring_enable(0, true).unwrap();
    Attached { fe, raw, ram, ring }
}

#[test]
fn spdk_virtio_user_attaches_and_does_io() {
    bounded(|| {
        let f = Fixture::new();
        // 512 is bdev_virtio_attach_controller's default --vq-size; 1024 the largest we accept.
        for queue_size in [512, 1024] {
            let mut a = spdk_virtio_user_attach(&f, queue_size);
            a.ring.write_and_verify(&a.ram, queue_size as u8);
            assert!(a.fe.get_features().is_ok(), "connection still up");
        }
    });
}

#[test]
fn spdk_enable_values_other_than_one_enable_and_zero_disables() {
    bounded(|| {
        let f = Fixture::new();
        let mut a = spdk_virtio_user_attach(&f, 512);
        a.ring.write_and_verify(&a.ram, 1);
        // Disabled: the queue stops, and its state is what the driver has seen completed.
        set_vring_enable_raw(&mut a.raw, 0, 0);
        assert_eq!(a.fe.get_vring_base(0).unwrap(), u32::from(a.ring.avail_idx));
        // Started again with another non-zero value (GET_VRING_BASE took the kick fd: send it again).
        a.fe.set_vring_base(0, a.ring.avail_idx).unwrap();
        a.fe.set_vring_kick(0, &a.ring.kick).unwrap();
        set_vring_enable_raw(&mut a.raw, 0, 7);
        a.ring.write_and_verify(&a.ram, 2);
        // An index past the device's queues is refused: the connection closes, nothing else.
        set_vring_enable_raw(&mut a.raw, 5, 512);
        let start = Instant::now();
        while a.fe.get_features().is_ok() {
            assert!(start.elapsed() < Duration::from_secs(10), "SET_VRING_ENABLE of queue 5 accepted");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut again = spdk_virtio_user_attach(&f, 512);
        again.ring.write_and_verify(&again.ram, 3);
    });
}

#[test]
fn qemu_vhost_user_blk_starts_and_does_io() {
    bounded(|| {
        let f = Fixture::new();
        let mut a = qemu_vhost_user_blk_start(&f);
        a.ring.write_and_verify(&a.ram, 0x11);
        // vhost_dev_stop: queues disabled (acknowledged), then their state fetched.
        a.fe.set_vring_enable(0, false).unwrap();
        assert_eq!(a.fe.get_vring_base(0).unwrap(), u32::from(a.ring.avail_idx));
        drop(a.raw);
    });
}

#[test]
fn libblkio_attaches_and_sees_what_spdk_and_qemu_wrote() {
    bounded(|| {
        let f = Fixture::new();
        let mut spdk = spdk_virtio_user_attach(&f, 512);
        spdk.ring.write_and_verify(&spdk.ram, 0x5a);
        drop(spdk);

        let mut b = Blkio::new("virtio-blk-vhost-user").unwrap();
        b.set_str("path", f.sock.to_str().unwrap()).unwrap();
        b.connect().unwrap();
        assert_eq!(b.get_u64("capacity").unwrap(), 2048 * 512);
        let mut out = b.start().unwrap();
        let q = &mut out.queues[0];
        let region = b.alloc_mem_region(8192).unwrap();
        b.map_mem_region(&region).unwrap();
        // SAFETY: 8192 bytes of mapped memory owned by `region`.
        let buf = unsafe { std::slice::from_raw_parts_mut(region.addr as *mut u8, 8192) };
        q.read(8 * 512, buf.as_mut_ptr(), 8192, 1, ReqFlags::empty());
        let mut c = [std::mem::MaybeUninit::<blkio::Completion>::uninit()];
        assert_eq!(q.do_io(&mut c, 1, None, None).unwrap(), 1);
        // SAFETY: do_io initialised one completion.
        assert_eq!(unsafe { c[0].assume_init_ref() }.ret, 0);
        let expected: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8 ^ 0x5a).collect();
        assert!(buf[..] == expected[..], "libblkio reads what SPDK's front end wrote");
        drop(out);
        drop(b);

        let mut qemu = qemu_vhost_user_blk_start(&f);
        qemu.ring.write_and_verify(&qemu.ram, 0xa5);
    });
}

#[test]
fn partial_config_reads_are_answered_from_their_offset() {
    bounded(|| {
        let f = Fixture::new();
        let mut raw = connect(&f);
        let mut fe = Frontend::from_stream(raw.try_clone().unwrap(), 1);
        fe.set_owner().unwrap();
        let offered = fe.get_features().unwrap();
        fe.set_features(offered & (VERSION_1 | PROTOCOL_FEATURES)).unwrap();
        fe.set_protocol_features(VhostUserProtocolFeatures::CONFIG).unwrap();
        let whole =
            |fe: &mut Frontend| fe.get_config(0, 60, VhostUserConfigFlags::empty(), &[0; 60]).unwrap().1;
        let cfg = whole(&mut fe);
        // Field by field, as a driver reads a PCI config space.
        for (offset, size) in [(0u32, 8u32), (12, 4), (20, 4), (34, 2), (1, 3), (59, 1)] {
            let (reply, part) =
                fe.get_config(offset, size, VhostUserConfigFlags::empty(), &vec![0; size as usize]).unwrap();
            assert_eq!((reply.offset, reply.size), (offset, size));
            assert_eq!(
                part[..],
                cfg[offset as usize..(offset + size) as usize],
                "offset {offset} size {size}"
            );
        }
        // Past this device's fields but within the 256 bytes a front end may read: zeroes.
        let (_, tail) = fe.get_config(56, 200, VhostUserConfigFlags::empty(), &[0; 200]).unwrap();
        assert_eq!(tail[..4], cfg[56..60]);
        assert!(tail[4..].iter().all(|&b| b == 0));
        // Beyond 256 bytes: an error reply (a config header with size 0, no payload), and the
        // connection goes on. Sent by hand: `vhost`'s front end waits for a full payload instead.
        for (offset, size) in [(0u32, 257u32), (256, 4), (200, 100)] {
            assert_eq!(
                get_config_raw(&mut raw, offset, size),
                (offset, 0),
                "offset {offset} size {size} answered"
            );
        }
        assert_eq!(whole(&mut fe), cfg, "connection still up after refused reads");
    });
}
