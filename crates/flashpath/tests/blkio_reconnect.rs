//! Clients come and go while the daemon stays up: a clean disconnect and reconnect (with a
//! different queue count), many short sessions in a row, a client process killed with SIGKILL in
//! the middle of I/O, SIGTERM with a client still attached, and a client that swaps its shared
//! memory regions while connected.

mod common;

use std::io::BufReader;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_same, bounded, pattern, wait_for_line, BlkClient, Daemon, Op, OpKind};

/// Set in the environment of the helper process started by
/// `reconnect_after_client_killed_mid_io`: the socket it should load.
const CHILD_SOCKET_ENV: &str = "FP_E2E_CHILD_SOCKET";
/// What the helper writes before it starts its endless load (offset 0, this length, seed 77).
const CHILD_DATA_LEN: usize = 256 << 10;
const CHILD_SEED: u64 = 77;

#[test]
fn reconnect_after_clean_disconnect_keeps_data() {
    let mut daemon = Daemon::start("0,1");
    daemon.malloc("m", 8192, 512); // 4 MiB
    let sock = daemon.controller("vhost.0", "m", Some(2), false);
    bounded(Duration::from_secs(60), "reconnect", move || {
        let a_data = pattern(1, 0, 128 << 10);
        {
            let mut a = BlkClient::open(&sock, 1);
            a.write_all(0, &a_data);
            assert_eq!(a.flush(0), 0);
        } // A disconnects here.
        let b_data = pattern(2, 1 << 20, 128 << 10);
        {
            let mut b = BlkClient::open(&sock, 2);
            let got = b.read_all(0, a_data.len());
            assert_same("B reading A's data", 0, &got, &a_data);
            // B uses its second queue too: the device was reset to two queues.
            assert_eq!(b.write(1, 1 << 20, &b_data), 0);
            let got = b.read(1, 1 << 20, b_data.len()).expect("B reads back on queue 1");
            assert_same("B's own data", 1 << 20, &got, &b_data);
        }
        let mut c = BlkClient::open(&sock, 1);
        assert_same("C reading A's data", 0, &c.read_all(0, a_data.len()), &a_data);
        assert_same("C reading B's data", 1 << 20, &c.read_all(1 << 20, b_data.len()), &b_data);
    });
    daemon.assert_alive();
}

#[test]
fn many_short_sessions_in_a_row() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 2048, 512); // 1 MiB
    let sock = daemon.controller("vhost.0", "m", Some(2), false);
    let sessions = 30;
    bounded(Duration::from_secs(120), "sessions", move || {
        for i in 0..sessions {
            let mut c = BlkClient::open(&sock, 1 + i % 2);
            let off = (i as u64 % 64) * 4096;
            // Check what the previous session wrote, then write this session's block.
            if i > 0 {
                let prev = ((i - 1) as u64 % 64) * 4096;
                let got = c.read(0, prev, 4096).expect("read");
                assert_same(
                    &format!("session {i} reading session {}", i - 1),
                    prev,
                    &got,
                    &pattern(i as u64 - 1, prev, 4096),
                );
            }
            assert_eq!(c.write(c.num_queues() - 1, off, &pattern(i as u64, off, 4096)), 0, "session {i}");
        }
    });
    daemon.assert_alive();
}

/// Helper for `reconnect_after_client_killed_mid_io`, run by it in a child process: writes a
/// known pattern, prints CHILD-WRITTEN, then keeps 16 writes in flight on each of two queues, printing
/// CHILD-LOADING after the first batch, until it is killed (or 60 s pass).
#[test]
#[ignore = "helper process for reconnect_after_client_killed_mid_io; not a test on its own"]
fn child_writer_process() {
    let sock = std::env::var(CHILD_SOCKET_ENV)
        .expect("child_writer_process runs only as a child of reconnect_after_client_killed_mid_io");
    let mut c = BlkClient::open(std::path::Path::new(&sock), 2);
    c.write_all(0, &pattern(CHILD_SEED, 0, CHILD_DATA_LEN));
    assert_eq!(c.flush(0), 0);
    println!("\nCHILD-WRITTEN");
    let start = Instant::now();
    let mut batch = 0u64;
    while start.elapsed() < Duration::from_secs(60) {
        let ops: Vec<Op> = (0..32)
            .map(|i| Op {
                queue: i % 2,
                kind: OpKind::Write,
                offset: (1 << 20) + ((batch * 32 + i as u64) % 256) * 4096,
                len: 4096,
                buf: i * 4096,
            })
            .collect();
        let rets = c.run(&ops);
        assert!(rets.iter().all(|&r| r == 0), "child write failed: {rets:?}");
        if batch == 0 {
            println!("CHILD-LOADING");
        }
        batch += 1;
    }
}

/// Kills the child client if the test fails before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn reconnect_after_client_killed_mid_io() {
    let mut daemon = Daemon::start("0,1");
    daemon.malloc("m", 8192, 512); // 4 MiB
    let sock = daemon.controller("vhost.0", "m", Some(2), false);

    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().expect("test binary path"))
            .args(["child_writer_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_SOCKET_ENV, &sock)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the child client"),
    );
    let stdout = child.0.stdout.take().expect("child stdout");
    let reached = bounded(Duration::from_secs(60), "child start", move || {
        let mut r = BufReader::new(stdout);
        wait_for_line(&mut r, "CHILD-WRITTEN");
        wait_for_line(&mut r, "CHILD-LOADING");
        r
    });
    // The child has completed at least one batch and is in the middle of the next ones.
    child.0.kill().expect("SIGKILL to the child");
    let status = child.0.wait().expect("reaping the child");
    assert!(status.code().is_none(), "the child exited on its own ({status}) instead of being killed");
    drop(reached);

    bounded(Duration::from_secs(60), "reconnect after kill", move || {
        let mut c = BlkClient::open(&sock, 2);
        let got = c.read_all(0, CHILD_DATA_LEN);
        assert_same("data written by the killed client", 0, &got, &pattern(CHILD_SEED, 0, CHILD_DATA_LEN));
        let fresh = pattern(78, 2 << 20, 64 << 10);
        assert_eq!(c.write(1, 2 << 20, &fresh), 0);
        assert_same(
            "new data after reconnect",
            2 << 20,
            &c.read(0, 2 << 20, fresh.len()).expect("read"),
            &fresh,
        );
    });
    daemon.assert_alive();
}

#[test]
fn sigterm_with_a_client_attached_stops_the_daemon() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 2048, 512);
    let sock = daemon.controller("vhost.0", "m", Some(1), false);
    let c = bounded(Duration::from_secs(30), "connect", move || {
        let mut c = BlkClient::open(&sock, 1);
        assert_eq!(c.write(0, 0, &pattern(1, 0, 4096)), 0);
        c
    });
    daemon.assert_stops_on_sigterm();
    // The client's session is gone; tearing it down must not hang.
    bounded(Duration::from_secs(30), "client teardown after the daemon stopped", move || drop(c));
}

#[test]
fn memory_regions_change_while_connected() {
    let mut daemon = Daemon::start("0,1");
    daemon.malloc("m", 8192, 512); // 4 MiB
    let sock = daemon.controller("vhost.0", "m", Some(2), false);
    bounded(Duration::from_secs(60), "memory regions", move || {
        let mut c = BlkClient::open(&sock, 2);
        for round in 0..6u64 {
            let off = round * (256 << 10);
            let data = pattern(round + 10, off, 256 << 10);
            assert_eq!(c.write((round % 2) as usize, off, &data), 0, "write before region change {round}");
            // A new buffer region is added and the old one removed while the queues run; the
            // sizes vary so the daemon's memory map really changes.
            c.replace_arena((4 << 20) + (round as usize) * 4096);
            for prev in 0..=round {
                let poff = prev * (256 << 10);
                let got =
                    c.read(((prev + 1) % 2) as usize, poff, 256 << 10).expect("read after region change");
                assert_same(
                    &format!("round {round}, data of round {prev}"),
                    poff,
                    &got,
                    &pattern(prev + 10, poff, 256 << 10),
                );
            }
        }
    });
    daemon.assert_alive();
}
