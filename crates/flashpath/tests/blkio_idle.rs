//! An idle daemon does not burn CPU: with two controllers, each with a connected and started
//! libblkio client that issues no I/O, the daemon's CPU time over 3 s stays under 2 % of one
//! core; and after a burst of I/O it falls back under that bound.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{bounded, cpu_ticks, pattern, ticks_per_second, BlkClient, Daemon, Op, OpKind};

/// The two tests measure CPU time: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const WINDOW: Duration = Duration::from_secs(3);
const MAX_SHARE: f64 = 0.02;

/// Starts a daemon on cores 0 and 1 with two RAM-disk controllers and two attached clients.
fn setup() -> (Daemon, BlkClient, BlkClient) {
    let daemon = Daemon::start("0,1");
    daemon.malloc("m0", 4096, 512);
    daemon.malloc("m1", 4096, 512);
    let s0 = daemon.controller("c0", "m0", Some(2), false);
    let s1 = daemon.controller("c1", "m1", Some(2), false);
    let (a, b) = bounded(Duration::from_secs(30), "connect", move || {
        (BlkClient::open(&s0, 2), BlkClient::open(&s1, 2))
    });
    (daemon, a, b)
}

/// The daemon's CPU use over [`WINDOW`], as a fraction of one core.
fn cpu_share(daemon: &Daemon) -> f64 {
    let pid = daemon.pid();
    let t0 = cpu_ticks(pid);
    let start = Instant::now();
    std::thread::sleep(WINDOW);
    let ticks = cpu_ticks(pid) - t0;
    let secs = start.elapsed().as_secs_f64();
    ticks as f64 / ticks_per_second() as f64 / secs
}

#[test]
fn idle_daemon_with_attached_clients_uses_under_2_percent_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (mut daemon, a, b) = setup();
    // Let start-up work (controller creation, vhost-user negotiation) finish before measuring.
    std::thread::sleep(Duration::from_millis(500));
    let share = cpu_share(&daemon);
    eprintln!("idle daemon CPU: {:.2} % of one core", share * 100.0);
    assert!(
        share < MAX_SHARE,
        "idle daemon used {:.1} % of a core over {WINDOW:?} (limit {:.0} %)",
        share * 100.0,
        MAX_SHARE * 100.0
    );
    daemon.assert_alive();
    drop((a, b));
}

#[test]
fn daemon_goes_back_to_idle_after_an_io_burst() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (mut daemon, a, b) = setup();
    let before = cpu_ticks(daemon.pid());
    let (a, b) = bounded(Duration::from_secs(60), "burst", move || {
        let mut clients = [a, b];
        let start = Instant::now();
        let mut round = 0u64;
        // About a second of back-to-back batches on both clients.
        while start.elapsed() < Duration::from_secs(1) {
            for c in clients.iter_mut() {
                let ops: Vec<Op> = (0..16)
                    .map(|i| Op {
                        queue: i % 2,
                        kind: OpKind::Write,
                        offset: (i as u64) * 4096,
                        len: 4096,
                        buf: i * 4096,
                    })
                    .collect();
                let data = pattern(round, 0, 16 * 4096);
                c.arena()[..data.len()].copy_from_slice(&data);
                assert!(c.run(&ops).iter().all(|&r| r == 0), "burst write failed");
            }
            round += 1;
        }
        let [a, b] = clients;
        (a, b)
    });
    // The measurement must see the daemon working, or "idle" below would prove nothing.
    let busy = cpu_ticks(daemon.pid()) - before;
    eprintln!("daemon CPU during the burst: {busy} ticks");
    assert!(busy > 0, "no CPU time was measured for the daemon while it served I/O");
    std::thread::sleep(Duration::from_millis(500));
    let share = cpu_share(&daemon);
    eprintln!("daemon CPU after the burst: {:.2} % of one core", share * 100.0);
    assert!(
        share < MAX_SHARE,
        "after an I/O burst the daemon kept using {:.1} % of a core over {WINDOW:?} (limit {:.0} %)",
        share * 100.0,
        MAX_SHARE * 100.0
    );
    daemon.assert_alive();
    drop((a, b));
}
