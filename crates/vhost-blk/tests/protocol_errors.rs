//! Bad vhost-user input closes that connection, with a logged reason, and nothing else: the
//! controller accepts the next frontend and serves it normally.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use std::time::{Duration, Instant};

use blkio::{Blkio, ReqFlags};
use common::Fixture;
use vhost::vhost_user::Frontend;
use vhost::{VhostBackend, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

impl Fixture {
    /// A well-behaved client still gets a working disk.
    fn assert_disk_works(&self) {
        let mut b = Blkio::new("virtio-blk-vhost-user").unwrap();
        b.set_str("path", self.sock.to_str().unwrap()).unwrap();
        b.connect().unwrap();
        let mut out = b.start().unwrap();
        let q = &mut out.queues[0];
        let region = b.alloc_mem_region(4096).unwrap();
        b.map_mem_region(&region).unwrap();
        // SAFETY: 4096 bytes of mapped memory owned by `region`.
        let buf = unsafe { std::slice::from_raw_parts_mut(region.addr as *mut u8, 4096) };
        buf.fill(0x5a);
        q.write(0, buf.as_ptr(), 4096, 1, ReqFlags::empty());
        let mut c = [std::mem::MaybeUninit::<blkio::Completion>::uninit()];
        assert_eq!(q.do_io(&mut c, 1, None, None).unwrap(), 1);
        // SAFETY: do_io initialised one completion.
        assert_eq!(unsafe { c[0].assume_init_ref() }.ret, 0);
    }
}

/// Waits until the server closes `s` (read returns EOF or reset). Fails after `limit`.
fn assert_closed_by_server(s: &mut UnixStream, limit: Duration) {
    s.set_read_timeout(Some(limit)).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("connection not closed after {:?}: {e}", start.elapsed()),
        }
        assert!(start.elapsed() < limit, "connection still open");
    }
}

fn connect(path: &Path) -> UnixStream {
    UnixStream::connect(path).unwrap()
}

#[test]
fn garbage_closes_the_connection_only() {
    let f = Fixture::new();
    let mut s = connect(&f.sock);
    // A header with an unknown request code and an absurd size.
    s.write_all(&[0xff, 0xff, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f]).unwrap();
    assert_closed_by_server(&mut s, Duration::from_secs(10));
    f.assert_disk_works();
}

#[test]
fn a_stalled_partial_message_is_dropped() {
    let f = Fixture::new();
    let mut s = connect(&f.sock);
    // Half a header, then silence: the server must not wait forever.
    s.write_all(&[1, 0, 0, 0, 1, 0]).unwrap();
    assert_closed_by_server(&mut s, Duration::from_secs(15));
    f.assert_disk_works();
}

#[test]
fn a_ring_kicked_before_any_memory_table_is_refused() {
    let f = Fixture::new();
    let frontend = Frontend::connect(&f.sock, 1).unwrap();
    frontend.set_owner().unwrap();
    let features = frontend.get_features().unwrap();
    // Not EVENT_IDX (bit 30), nor LOG_ALL (26): that needs LOG_SHMFD, and only a migration asks for it.
    frontend.set_features(features & !(1 << 30) & !(1 << 26)).unwrap();
    frontend.set_vring_num(0, 16).unwrap();
    let ring = VringConfigData {
        queue_max_size: 16,
        queue_size: 16,
        flags: 0,
        desc_table_addr: 0x10000,
        used_ring_addr: 0x12000,
        avail_ring_addr: 0x11000,
        log_addr: None,
    };
    frontend.set_vring_addr(0, &ring).unwrap();
    let kick = EventFd::new(0).unwrap();
    // Out of order: no SET_MEM_TABLE yet. The backend drops the connection.
    let _ = frontend.set_vring_kick(0, &kick);
    let start = Instant::now();
    while frontend.get_features().is_ok() {
        assert!(start.elapsed() < Duration::from_secs(10), "connection still usable");
        std::thread::sleep(Duration::from_millis(20));
    }
    f.assert_disk_works();
}

#[test]
fn out_of_range_ring_parameters_are_refused() {
    let f = Fixture::new();
    for num in [0u16, 3, 2048] {
        let frontend = Frontend::connect(&f.sock, 1).unwrap();
        frontend.set_owner().unwrap();
        let _ = frontend.set_vring_num(0, num);
        let start = Instant::now();
        while frontend.get_features().is_ok() {
            assert!(start.elapsed() < Duration::from_secs(10), "queue size {num} accepted");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    f.assert_disk_works();
}

/// A frontend that sends requests but never reads the replies: once the socket buffers are
/// full, the controller's reply would block forever, wedging the controller (and any RPC that
/// deletes it). It is dropped instead, and the next frontend is served.
#[test]
fn a_frontend_that_never_reads_replies_is_dropped() {
    let f = Fixture::new();
    let s = connect(&f.sock);
    // GET_FEATURES (1) with the version-1 flag and no body: 12 bytes each, each with an 8-byte
    // reply; 100 K of them are far more than the socket buffers hold.
    let flood = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut flood = flood;
        let msg = [1u8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        for _ in 0..100_000 {
            if flood.write_all(&msg).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let sock = f.sock.clone();
    std::thread::spawn(move || {
        let fx = Fixture { _dir: tempfile::tempdir().unwrap(), sock, ctrl: None, reactors: None };
        fx.assert_disk_works();
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the controller is still stuck on a frontend that does not read");
    eprintln!("next frontend served after {:?}", start.elapsed());
    drop(s);
    writer.join().unwrap();
}
