//! The nbd_client bdev against real servers: nbdkit (the conformance suite every device passes,
//! server errors, a server killed mid-I/O, TCP on loopback), qemu-nbd (data written through the
//! bdev is in the server's file and the other way round; a read-only export) and
//! qemu-storage-daemon's NBD server. The tools must be installed (`apt-get install nbdkit
//! qemu-utils`); the tests fail saying so when they are not.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fp_bdev::conformance::{self, cmd, poll_until, read_range, rw, write_range, IoBuf, Storage};
use fp_bdev::{BdevError, BlockDevice, IoOp, IoStatus};
use fp_nbd::client::{NbdClientDetail, NbdClientDevice};
use fp_nbd::Address;

/// A server process, killed when dropped.
struct Server {
    child: Child,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program args...` with `{sock}` in the arguments replaced by a fresh socket path,
/// and waits until it listens there.
fn spawn(program: &str, args: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let args: Vec<String> = args.iter().map(|a| a.replace("{sock}", sock.to_str().unwrap())).collect();
    let mut child = Command::new(program)
        .args(&args)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}): install nbdkit and qemu-utils"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listening(&sock) {
        assert!(Instant::now() < deadline, "{program} did not listen on its socket in 10 s");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{program} {args:?} exited ({status}) before making its socket");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Server { child, sock, _dir: dir }
}

/// Whether a process listens on the Unix socket at `path`, from /proc/net/unix (flag
/// `__SO_ACCEPTCON`). Not the file's existence: it appears at `bind`, a moment before
/// `listen`, and a connect in between is refused; nor a probe connection, after which qemu-nbd
/// would exit.
fn listening(path: &Path) -> bool {
    const ACCEPTING: u32 = 0x0001_0000;
    let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(7).is_some_and(|p| Path::new(p) == path)
            && u32::from_str_radix(fields[3], 16).is_ok_and(|flags| flags & ACCEPTING != 0)
    })
}

fn nbdkit(args: &[&str]) -> Server {
    let mut all = vec!["--foreground", "--unix", "{sock}", "--exit-with-parent"];
    all.extend_from_slice(args);
    spawn("nbdkit", &all)
}

fn attach(name: &str, sock: &Path, export: &str, read_only: bool) -> Result<NbdClientDevice, BdevError> {
    let detail =
        NbdClientDetail { address: sock.display().to_string(), export_name: export.into(), read_only };
    NbdClientDevice::connect(name, Address::Unix(sock.to_path_buf()), detail, None)
}

#[test]
fn passes_the_conformance_suite_on_nbdkit() {
    // Each check gets a fresh, zeroed 1 MiB server; they live until the suite is over.
    let servers = Arc::new(Mutex::new(Vec::new()));
    let make = || -> Arc<dyn BlockDevice> {
        let s = nbdkit(&["memory", "1M"]);
        let dev = attach("c", &s.sock, "", false).unwrap();
        servers.lock().unwrap().push(s);
        Arc::new(dev)
    };
    conformance::run_suite(&make, Storage::Keeps);
}

#[test]
fn reports_what_the_server_offers() {
    let s = nbdkit(&["memory", "4M"]);
    let dev = attach("c", &s.sock, "", false).unwrap();
    let info = dev.info();
    assert_eq!((info.block_size, info.num_blocks(), info.driver), (512, 8192, "nbd_client"));
    assert!(info.io_types.write && info.io_types.flush && info.io_types.unmap && info.io_types.write_zeroes);
    assert!(!dev.read_only());
    assert!(dev.export().used_go);

    let ro = nbdkit(&["-r", "memory", "4M"]);
    let dev = attach("r", &ro.sock, "", false).unwrap();
    assert!(dev.read_only() && !dev.info().io_types.write && !dev.info().io_types.write_zeroes);

    // A server whose block size is 4 KiB: the bdev takes it; 512 is refused.
    let bs = nbdkit(&["--filter=blocksize-policy", "memory", "4M", "blocksize-minimum=4096"]);
    assert_eq!(attach("b", &bs.sock, "", false).unwrap().info().block_size, 4096);
    let detail = NbdClientDetail { address: "x".into(), export_name: String::new(), read_only: false };
    let e = NbdClientDevice::connect("b", Address::Unix(bs.sock.clone()), detail, Some(512)).err().unwrap();
    assert!(e.to_string().contains("block_size"), "{e}");

    // Nothing listening; not an NBD server.
    let e = attach("x", Path::new("/nonexistent/sock"), "", false).err().unwrap();
    assert!(e.to_string().contains("cannot connect"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        use std::io::Write;
        let (mut c, _) = l.accept().unwrap();
        c.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
    });
    let e = attach("x", &path, "", false).err().unwrap();
    assert!(e.to_string().contains("not an NBD server"), "{e}");
    t.join().unwrap();
}

#[test]
fn requests_over_the_servers_maximum_are_split() {
    let s = nbdkit(&[
        "--filter=blocksize-policy",
        "memory",
        "4M",
        "blocksize-maximum=65536",
        "blocksize-error-policy=error",
    ]);
    let dev = attach("c", &s.sock, "", false).unwrap();
    assert_eq!(dev.max_transfer(), 65536);
    let mut ch = dev.open_channel().unwrap();
    let data: Vec<u8> = (0..(3u32 << 20) / 2).map(|i| (i % 249) as u8).collect();
    write_range(&mut *ch, 512, &data);
    assert!(read_range(&mut *ch, 512, data.len()) == data);
}

#[test]
fn server_errors_reach_the_caller_as_their_errno() {
    let s = nbdkit(&["--filter=error", "memory", "1M", "error=ENOSPC", "error-pwrite-rate=100%"]);
    let dev = attach("c", &s.sock, "", false).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = IoBuf::new(4096, true);
    let iov = [buf.iovec()];
    // SAFETY: `buf` and `iov` outlive the request.
    let status = unsafe { conformance::run(&mut *ch, rw(0, IoOp::Write, 0, &iov)) };
    assert_eq!(status, IoStatus::Error(libc::ENOSPC));
    // Reads still work on the same connection.
    assert_eq!(read_range(&mut *ch, 0, 4096), vec![0; 4096]);
}

#[test]
fn data_crosses_both_ways_through_qemu_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.raw");
    let file = std::fs::File::create(&img).unwrap();
    file.set_len(40 << 20).unwrap();
    let s = spawn(
        "qemu-nbd",
        &["--format=raw", "--socket={sock}", "--export-name=disk", "--shared=4", img.to_str().unwrap()],
    );
    // A wrong export name is refused with the server's reason.
    let e = attach("c", &s.sock, "nope", false).err().unwrap();
    assert!(e.to_string().contains("no such export"), "{e}");
    let dev = attach("c", &s.sock, "disk", false).unwrap();
    assert_eq!(dev.info().size_bytes(), 40 << 20);
    let mut ch = dev.open_channel().unwrap();

    // Through the bdev, then in the file.
    let data: Vec<u8> = (0..(2 << 20)).map(|i: u32| (i % 251) as u8).collect();
    write_range(&mut *ch, 1 << 20, &data);
    assert_eq!(conformance::run(&mut *ch, cmd(0, IoOp::Flush, 0, 0)), IoStatus::Success);
    let mut back = vec![0u8; data.len()];
    std::fs::File::open(&img).unwrap().read_exact_at(&mut back, 1 << 20).unwrap();
    assert!(back == data, "the file holds what went through the bdev");

    // In the file, then through the bdev (a second channel: its own connection).
    let other: Vec<u8> = (0..65536).map(|i: u32| (i * 13 % 256) as u8).collect();
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().write_all_at(&other, 5 << 20).unwrap();
    let mut ch2 = dev.open_channel().unwrap();
    assert!(read_range(&mut *ch2, 5 << 20, other.len()) == other);
    assert_eq!(dev.stats.connections.load(std::sync::atomic::Ordering::Relaxed), 2);

    // The largest request the protocol customarily allows, 32 MiB, both ways.
    assert_eq!(dev.max_transfer(), 32 << 20);
    let big: Vec<u8> = (0..(32u32 << 20)).map(|i| (i / 4096) as u8 ^ (i % 7) as u8).collect();
    write_range(&mut *ch2, 8 << 20, &big);
    assert!(read_range(&mut *ch, 8 << 20, big.len()) == big);

    // 64 requests in flight at once.
    let mut bufs: Vec<IoBuf> = (0..64).map(|_| IoBuf::new(65536, true)).collect();
    let iovs: Vec<[libc::iovec; 1]> = bufs.iter_mut().map(|b| [b.iovec()]).collect();
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let reqs: Vec<_> = iovs
        .iter()
        .enumerate()
        .map(|(i, v)| unsafe { rw(i as u32, IoOp::Read, (i as u64 % 8) << 20, v) })
        .collect();
    let st = conformance::run_batch(&mut *ch, &reqs);
    assert!(st.iter().all(|s| *s == IoStatus::Success));
}

#[test]
fn qemu_storage_daemon_exports_work_too() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.raw");
    std::fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
    let blockdev = format!("driver=file,node-name=f,filename={}", img.display());
    let s = spawn(
        "qemu-storage-daemon",
        &[
            "--blockdev",
            &blockdev,
            "--nbd-server",
            "addr.type=unix,addr.path={sock}",
            "--export",
            "type=nbd,id=e,node-name=f,name=disk,writable=on",
        ],
    );
    let dev = attach("q", &s.sock, "disk", false).unwrap();
    assert_eq!(dev.info().size_bytes(), 4 << 20);
    let mut ch = dev.open_channel().unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    write_range(&mut *ch, 1 << 20, &data);
    assert_eq!(conformance::run(&mut *ch, cmd(0, IoOp::Flush, 0, 0)), IoStatus::Success);
    let mut back = vec![0u8; data.len()];
    std::fs::File::open(&img).unwrap().read_exact_at(&mut back, 1 << 20).unwrap();
    assert!(back == data, "the file holds what went through the bdev");
    assert!(read_range(&mut *ch, 1 << 20, data.len()) == data);
}

#[test]
fn a_read_only_export_refuses_writes_with_erofs() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.raw");
    std::fs::write(&img, vec![7u8; 1 << 20]).unwrap();
    let s = spawn("qemu-nbd", &["--format=raw", "--socket={sock}", "--read-only", img.to_str().unwrap()]);
    let dev = attach("c", &s.sock, "", false).unwrap();
    assert!(dev.read_only());
    let mut ch = dev.open_channel().unwrap();
    let mut buf = IoBuf::new(4096, true);
    let iov = [buf.iovec()];
    // SAFETY: `buf` and `iov` outlive the request.
    let status = unsafe { conformance::run(&mut *ch, rw(0, IoOp::Write, 0, &iov)) };
    assert_eq!(status, IoStatus::Error(libc::EROFS));
    assert_eq!(read_range(&mut *ch, 0, 4096), vec![7u8; 4096]);
    assert_eq!(std::fs::read(&img).unwrap(), vec![7u8; 1 << 20], "nothing written");

    // Asked read-only by the client on a writable export: the same.
    let w = nbdkit(&["memory", "1M"]);
    let dev = attach("c", &w.sock, "", true).unwrap();
    let mut ch = dev.open_channel().unwrap();
    // SAFETY: as above.
    let status = unsafe { conformance::run(&mut *ch, rw(0, IoOp::Write, 0, &iov)) };
    assert_eq!(status, IoStatus::Error(libc::EROFS));
}

#[test]
fn a_server_killed_mid_io_fails_every_request_with_eio() {
    // Reads take 2 s on the server, so they are in flight when it dies.
    let mut s = nbdkit(&["--filter=delay", "memory", "1M", "rdelay=2"]);
    let dev = attach("c", &s.sock, "", false).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let mut bufs: Vec<IoBuf> = (0..8).map(|_| IoBuf::new(4096, true)).collect();
    let iovs: Vec<[libc::iovec; 1]> = bufs.iter_mut().map(|b| [b.iovec()]).collect();
    for (i, v) in iovs.iter().enumerate() {
        // SAFETY: the buffers outlive the channel's use of them (polled to the end below).
        unsafe { ch.submit(&rw(i as u32, IoOp::Read, 0, v)) }.unwrap();
    }
    ch.poll(&mut |t, _| panic!("request {t} done before the server answered"));
    assert_eq!(ch.in_flight(), 8);
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let started = Instant::now();
    let got = poll_until(&mut *ch, 8);
    assert!(got.iter().all(|(_, st)| *st == IoStatus::Error(libc::EIO)), "{got:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(dev.stats.connections_lost.load(std::sync::atomic::Ordering::Relaxed), 1);
    // Later requests fail at once, and the channel never waits for a wake-up.
    // SAFETY: as above.
    unsafe { ch.submit(&rw(9, IoOp::Read, 0, &iovs[0])) }.unwrap();
    assert!(!ch.arm_completion_fd(), "a failed request is ready: no sleep");
    assert_eq!(poll_until(&mut *ch, 1), [(9, IoStatus::Error(libc::EIO))]);
    assert!(ch.arm_completion_fd());
    // The dead socket left the epoll set: the completion fd is quiet.
    let fd = ch.completion_fd().unwrap();
    assert_eq!(fp_sys::wait_readable(&[fd], Some(Duration::from_millis(100))).unwrap(), [false]);
    // A new channel cannot connect: an error, not a hang.
    assert!(dev.open_channel().is_err());
}

#[test]
fn a_connection_dropped_before_first_use_is_made_again() {
    let mut s = nbdkit(&["memory", "1M"]);
    let dev = attach("c", &s.sock, "", false).unwrap();
    // The server restarts (same socket, same export) before any channel opened: the
    // connection kept from the create is dead, and the first channel makes a new one.
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let _ = std::fs::remove_file(&s.sock);
    let sock = s.sock.to_str().unwrap().to_string();
    s.child = Command::new("nbdkit")
        .args(["--foreground", "--unix", &sock, "--exit-with-parent", "memory", "1M"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.sock.exists() {
        assert!(Instant::now() < deadline, "nbdkit did not come back");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut ch = dev.open_channel().unwrap();
    write_range(&mut *ch, 0, &[3; 512]);
    assert_eq!(read_range(&mut *ch, 0, 512), vec![3; 512]);
    assert_eq!(dev.stats.connections_lost.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn tcp_on_loopback_works_too() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let port_arg = port.to_string();
    let mut server = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "--ipaddr", "127.0.0.1", "--port", &port_arg])
        .args(["memory", "1M"])
        .spawn()
        .expect("nbdkit");
    let uri = format!("nbd://127.0.0.1:{port}");
    let device = fp_nbd::parse_device(&uri).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let dev = loop {
        let detail = NbdClientDetail { address: uri.clone(), export_name: String::new(), read_only: false };
        match NbdClientDevice::connect("t", device.address.clone(), detail, None) {
            Ok(d) => break d,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("nbdkit on {uri}: {e}"),
        }
    };
    let mut ch = dev.open_channel().unwrap();
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 3) as u8).collect();
    write_range(&mut *ch, 4096, &data);
    assert!(read_range(&mut *ch, 4096, data.len()) == data);
    drop(ch);
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn a_sleeping_caller_is_woken_by_replies() {
    let s = nbdkit(&["--filter=delay", "memory", "1M", "rdelay=200ms"]);
    let dev = attach("c", &s.sock, "", false).unwrap();
    let mut ch = dev.open_channel().unwrap();
    assert!(ch.sleeps_in_flight());
    let mut buf = IoBuf::new(4096, true);
    let iov = [buf.iovec()];
    // SAFETY: `buf` outlives the request.
    unsafe { ch.submit(&rw(1, IoOp::Read, 0, &iov)) }.unwrap();
    ch.poll(&mut |_, _| panic!("too early"));
    assert!(ch.arm_completion_fd());
    let fd = ch.completion_fd().unwrap();
    // Asleep until the reply is there, as a reactor would be.
    assert_eq!(fp_sys::wait_readable(&[fd], Some(Duration::from_secs(10))).unwrap(), [true]);
    ch.disarm_completion_fd();
    assert_eq!(poll_until(&mut *ch, 1), [(1, IoStatus::Success)]);
    // Idle: nothing wakes the caller.
    assert!(ch.arm_completion_fd());
    assert_eq!(fp_sys::wait_readable(&[fd], Some(Duration::from_millis(100))).unwrap(), [false]);
}
