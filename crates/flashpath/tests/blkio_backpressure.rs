//! Back-pressure (Busy) on the vhost-user stop paths, with the error bdev's `nomem` injection
//! (docs/error.md) refusing every read: a client that goes away with a read refused as busy
//! does not wedge its controller (the stop keeps retrying the read, and ends at its bound
//! whatever the disk does), the next client is served, and SIGTERM stops the daemon, in bounded
//! time however many exports have requests their disks hold.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_same, bounded, pattern, BlkClient, Daemon, Op, OpKind};
use serde_json::{json, Value};

const EE: &str = "EE_M0";
const CTRLR: &str = "vhost.bp";
/// Refusals enough to last the whole test: the queue retries a refused read every round.
const FOREVER: u64 = 100_000_000;
const DATA_LEN: usize = 64 << 10;

/// A daemon with a RAM disk `M0`, its error bdev and a one-queue controller on it (with
/// `stop_timeout_ms` when given), holding `pattern(5, 0, DATA_LEN)` at offset 0.
fn error_disk(stop_timeout_ms: Option<u64>) -> (Daemon, PathBuf) {
    let daemon = Daemon::start("0");
    daemon.malloc("M0", 8192, 512);
    assert_eq!(daemon.call("bdev_error_create", json!({"base_name": "M0"})), true);
    let mut params = json!({"ctrlr": CTRLR, "dev_name": EE, "num_queues": 1});
    if let Some(ms) = stop_timeout_ms {
        params["stop_timeout_ms"] = json!(ms);
    }
    daemon.call("vhost_create_blk_controller", params);
    let sock = daemon.dir.path().join(CTRLR);
    let s = sock.clone();
    bounded(Duration::from_secs(60), "initial write", move || {
        BlkClient::open(&s, 1).write_all(0, &pattern(5, 0, DATA_LEN));
    });
    (daemon, sock)
}

fn inject_nomem(daemon: &Daemon) {
    let p = json!({"name": EE, "io_type": "read", "error_type": "nomem", "num": FOREVER});
    assert_eq!(daemon.call("bdev_error_inject_error", p), true);
}

fn clear(daemon: &Daemon) {
    let p = json!({"name": EE, "io_type": "clear", "error_type": "nomem", "num": 0});
    assert_eq!(daemon.call("bdev_error_inject_error", p), true);
}

fn controller(daemon: &Daemon) -> Value {
    daemon.call("vhost_get_controllers", json!({"name": CTRLR}))[0].clone()
}

/// A client thread that puts 8 reads in flight (QD 8) and, once `abort` is set, gives up on
/// them and goes away (disconnects) with them outstanding. Returns when the reads are refused
/// as busy: one waits in the queue, refused on every retry.
fn client_with_parked_reads(daemon: &Daemon, sock: &Path) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    client_with_reads(daemon, sock, |daemon| {
        let refused = daemon.call("bdev_get_bdevs", json!({"name": EE}))[0]["driver_specific"]["error"]
            ["injections"]["read"]["num"]
            .as_u64()
            .is_some_and(|left| left < FOREVER - 100);
        refused && controller(daemon)["stats"]["in_flight"].as_u64() == Some(1)
    })
}

/// A client thread as [`client_with_parked_reads`], returning once `ready` says the reads are
/// where the test wants them.
fn client_with_reads(
    daemon: &Daemon,
    sock: &Path,
    ready: impl Fn(&Daemon) -> bool,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let abort = Arc::new(AtomicBool::new(false));
    let (a, s) = (abort.clone(), sock.to_path_buf());
    let client = std::thread::spawn(move || {
        let mut c = BlkClient::open(&s, 1);
        let ops: Vec<Op> = (0..8)
            .map(|i| Op { queue: 0, kind: OpKind::Read, offset: i * 4096, len: 4096, buf: i as usize * 4096 })
            .collect();
        assert!(c.run_until(&ops, &a).is_none(), "reads completed while the disk refuses them all");
        drop(c);
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if ready(daemon) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reads did not get there: {}",
            daemon.call("vhost_get_controllers", Value::Null)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (abort, client)
}

fn wait_for_log(daemon: &Daemon, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon.stderr().contains(line) {
        assert!(Instant::now() < deadline, "no '{line}' in the log:\n{}", daemon.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A new client reads back what was written and writes and reads its own data.
fn next_client_is_served(sock: &Path, what: &str) {
    let s = sock.to_path_buf();
    bounded(Duration::from_secs(20), what, move || {
        let mut c = BlkClient::open(&s, 1);
        assert_same("data before the wedge", 0, &c.read_all(0, DATA_LEN), &pattern(5, 0, DATA_LEN));
        let fresh = pattern(6, 1 << 20, 16 << 10);
        c.write_all(1 << 20, &fresh);
        assert_same("data after the wedge", 1 << 20, &c.read_all(1 << 20, fresh.len()), &fresh);
    });
}

#[test]
fn a_client_gone_with_reads_refused_as_busy_does_not_wedge_the_controller() {
    // A bound far beyond the test's own: the stop must end by retrying the read, not by
    // failing it at the bound.
    let (mut daemon, sock) = error_disk(Some(120_000));
    inject_nomem(&daemon);
    let (abort, client) = client_with_parked_reads(&daemon, &sock);
    abort.store(true, Ordering::Release);
    // The client's teardown stops the queue with the read still refused; then the disk
    // takes reads again.
    wait_for_log(&daemon, "queue 0: stopping with 1 requests outstanding (1 not accepted by the bdev yet)");
    clear(&daemon);
    bounded(Duration::from_secs(20), "client teardown", move || client.join().unwrap());
    next_client_is_served(&sock, "client after the wedge");
    assert_eq!(controller(&daemon)["stats"]["in_flight"], 0);
    // (The queue restarted after the client's memory change and failed the other seven reads,
    // whose buffers were gone: those are not the parked one.)
    assert!(
        !daemon.stderr().contains("stop reached its bound"),
        "the parked read was failed:\n{}",
        daemon.stderr()
    );
    daemon.assert_alive();
}

#[test]
fn a_stop_ends_at_its_bound_while_the_disk_refuses_and_fails_the_parked_read() {
    let bound = Duration::from_millis(1000);
    let (mut daemon, sock) = error_disk(Some(bound.as_millis() as u64));
    assert_eq!(controller(&daemon)["stop_timeout_ms"], 1000);
    inject_nomem(&daemon);
    let (abort, client) = client_with_parked_reads(&daemon, &sock);
    let started = Instant::now();
    abort.store(true, Ordering::Release);
    bounded(Duration::from_secs(20), "client teardown", move || client.join().unwrap());
    // The disconnect stops the queue: it retries the read until the bound, then fails it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while controller(&daemon)["connected"] == true || controller(&daemon)["stats"]["in_flight"] != 0 {
        assert!(Instant::now() < deadline, "the stop did not end: {}", controller(&daemon));
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = started.elapsed();
    assert!(took >= bound, "the stop ended after {took:?}, before its bound, with the disk refusing");
    // The read refused as busy got IOERR at the bound (libblkio keeps no in-flight area).
    let c = controller(&daemon);
    assert!(c["stats"]["io_errors"].as_u64().unwrap() >= 1, "{c}");
    let log = daemon.stderr();
    assert!(
        log.contains("stop reached its bound of 1s after")
            && log.contains("still refused as busy: 1 completed with IOERR, 0 left in the in-flight area"),
        "the bound is logged:\n{log}"
    );
    clear(&daemon);
    next_client_is_served(&sock, "client after the bounded stop");
    daemon.assert_alive();
}

#[test]
fn sigterm_stops_the_daemon_with_a_read_refused_as_busy() {
    let (mut daemon, sock) = error_disk(Some(1000));
    inject_nomem(&daemon);
    let (abort, client) = client_with_parked_reads(&daemon, &sock);
    daemon.assert_stops_on_sigterm();
    abort.store(true, Ordering::Release);
    bounded(Duration::from_secs(20), "client teardown", move || client.join().unwrap());
}

#[test]
fn sigterm_waits_its_bound_for_reads_the_disk_holds_and_says_what_is_left() {
    // The daemon's bound, for the controller (created without its own) and for shutdown.
    let bound = Duration::from_millis(500);
    let mut daemon = Daemon::start_with_args("0", &["--vhost-stop-timeout-ms", "500"]);
    daemon.malloc("M0", 8192, 512);
    assert_eq!(daemon.call("bdev_error_create", json!({"base_name": "M0"})), true);
    daemon.call("vhost_create_blk_controller", json!({"ctrlr": CTRLR, "dev_name": EE, "num_queues": 1}));
    assert_eq!(controller(&daemon)["stop_timeout_ms"], 500);
    let sock = daemon.dir.path().join(CTRLR);
    // Held until resumed, which nobody does: the disk owns the reads' buffers to the end.
    let p = json!({"name": EE, "io_type": "read", "error_type": "pending", "num": FOREVER});
    assert_eq!(daemon.call("bdev_error_inject_error", p), true);
    let (abort, client) =
        client_with_reads(&daemon, &sock, |d| controller(d)["stats"]["in_flight"].as_u64() == Some(8));
    let started = Instant::now();
    daemon.assert_stops_on_sigterm();
    let took = started.elapsed();
    abort.store(true, Ordering::Release);
    bounded(Duration::from_secs(20), "client teardown", move || client.join().unwrap());
    let log = daemon.stderr();
    // The queue's stop ends at its bound, then the reactor waits the bound once more (within the
    // shutdown's one deadline) for the held reads before it drops the queue (and unmaps the
    // guest memory they point into).
    assert!(took >= 2 * bound, "SIGTERM took {took:?}: it did not wait for the held reads\n{log}");
    assert!(
        took < bound + Duration::from_secs(8),
        "SIGTERM took {took:?}: more than one shutdown deadline\n{log}"
    );
    assert!(log.contains("queue 0 did not stop within 500ms"), "{log}");
    assert!(
        log.contains("reactor 0: shutdown waited")
            && log.contains("past its bound of 500ms by")
            && log.contains("8 requests still held by the backends of 1 pollers"),
        "{log}"
    );
    assert!(log.contains("queue 0: dropped with 8 requests still held by the bdev"), "{log}");
}

#[test]
fn the_daemon_wide_stop_bound_reaches_controllers_created_without_one() {
    let stop_timeout_ms = |daemon: &Daemon, name: &str| {
        daemon.call("vhost_get_controllers", json!({"name": name}))[0]["stop_timeout_ms"].clone()
    };
    // From the config file, for a controller of the file and one created by RPC.
    let daemon = Daemon::start_with_config("0", |_| {
        "[vhost]\nstop_timeout_ms = 1500\n\n[[bdev]]\ntype = \"null\"\nname = \"n0\"\nnum_blocks = 64\n\
         block_size = 512\n\n[[vhost_blk]]\nctrlr = \"from_file\"\ndev_name = \"n0\"\n"
            .to_string()
    });
    assert_eq!(stop_timeout_ms(&daemon, "from_file"), 1500);
    for n in ["n1", "n2"] {
        daemon.call("bdev_null_create", json!({"name": n, "num_blocks": 64, "block_size": 512}));
    }
    daemon.call("vhost_create_blk_controller", json!({"ctrlr": "by_rpc", "dev_name": "n1"}));
    assert_eq!(stop_timeout_ms(&daemon, "by_rpc"), 1500);
    // A controller's own bound wins over the daemon's.
    daemon.call(
        "vhost_create_blk_controller",
        json!({"ctrlr": "own", "dev_name": "n2", "stop_timeout_ms": 40}),
    );
    assert_eq!(stop_timeout_ms(&daemon, "own"), 40);
    drop(daemon);
    // From the command line.
    let daemon = Daemon::start_with_args("0", &["--vhost-stop-timeout-ms", "2500"]);
    daemon.call("bdev_null_create", json!({"name": "n0", "num_blocks": 64, "block_size": 512}));
    daemon.call("vhost_create_blk_controller", json!({"ctrlr": "by_rpc", "dev_name": "n0"}));
    assert_eq!(stop_timeout_ms(&daemon, "by_rpc"), 2500);
}

/// SIGTERM with three controllers and two NBD exports, each with requests its disk holds
/// (error bdevs' `pending`, never resumed): every export stops at once, against one deadline,
/// so the daemon exits in about two stop bounds (the exports' stops, then the reactors' wait
/// for the held requests), not one per export, and logs each stuck export.
#[test]
fn sigterm_stops_every_stuck_export_at_once_within_one_bound() {
    use common::nbd::{start_export, Endpoint, NbdConn, CMD_READ};
    // Long enough that a busy machine's scheduling hiccups stay well inside the assertion's
    // margin (5 bounds against the 2 it takes).
    let bound = Duration::from_millis(1500);
    let mut daemon = Daemon::start_with_args("0", &["--vhost-stop-timeout-ms", "1500"]);
    let mut clients = Vec::new();
    for i in 0..3 {
        let (disk, ctrlr) = (format!("M{i}"), format!("vhost.stuck{i}"));
        daemon.malloc(&disk, 8192, 512);
        assert_eq!(daemon.call("bdev_error_create", json!({"base_name": disk})), true);
        let ee = format!("EE_{disk}");
        daemon.call("vhost_create_blk_controller", json!({"ctrlr": ctrlr, "dev_name": ee, "num_queues": 1}));
        let p = json!({"name": ee, "io_type": "read", "error_type": "pending", "num": FOREVER});
        assert_eq!(daemon.call("bdev_error_inject_error", p), true);
        let sock = daemon.dir.path().join(&ctrlr);
        clients.push(client_with_reads(&daemon, &sock, |d| {
            d.call("vhost_get_controllers", json!({"name": ctrlr}))[0]["stats"]["in_flight"].as_u64()
                == Some(8)
        }));
    }
    let mut nbd_conns = Vec::new();
    for j in 0..2 {
        let disk = format!("N{j}");
        daemon.malloc(&disk, 8192, 512);
        assert_eq!(daemon.call("bdev_error_create", json!({"base_name": disk})), true);
        let ee = format!("EE_{disk}");
        let sock = daemon.dir.path().join(format!("{disk}.nbd"));
        start_export(&daemon, &ee, sock.to_str().unwrap(), false);
        let mut conn = NbdConn::connect(&Endpoint::Unix(sock.clone()), &ee).expect("NBD connect");
        let p = json!({"name": ee, "io_type": "read", "error_type": "pending", "num": 1});
        assert_eq!(daemon.call("bdev_error_inject_error", p), true);
        conn.send(0, CMD_READ, 0, 4096, &[]).expect("sending the read");
        let deadline = Instant::now() + Duration::from_secs(20);
        // The injection is used up once the read reached the disk, which holds it.
        while daemon.call("bdev_get_bdevs", json!({"name": ee}))[0]["driver_specific"]["error"]["injections"]
            .get("read")
            .is_some()
        {
            assert!(Instant::now() < deadline, "the NBD read never reached {ee}");
            std::thread::sleep(Duration::from_millis(10));
        }
        nbd_conns.push((sock, ee, conn));
    }
    let stuck_exports = 5;

    let started = Instant::now();
    // Stopping the exports one after another took 3 bounds and 5 s per NBD export.
    let status = daemon.stop().expect("the daemon's exit status");
    let took = started.elapsed();
    let log = daemon.stderr();
    use std::os::unix::process::ExitStatusExt;
    assert!(status.success() || status.signal() == Some(libc::SIGTERM), "{status} after {took:?}\n{log}");
    for (abort, client) in clients {
        abort.store(true, Ordering::Release);
        bounded(Duration::from_secs(20), "client teardown", move || client.join().unwrap());
    }
    // The exports' stops, in parallel, end at the bound; the reactor then waits a bound for the
    // held reads before it drops the queues. One bound per export would be 5 s and more.
    assert!(took >= 2 * bound, "SIGTERM took {took:?}: it did not wait for the held reads\n{log}");
    assert!(
        took < stuck_exports * bound,
        "SIGTERM took {took:?}, not one bound for all {stuck_exports} stuck exports\n{log}"
    );
    for i in 0..3 {
        let said = format!("vhost.stuck{i}: queue 0 did not stop within 1.5s");
        assert!(log.contains(&said), "nothing said about vhost.stuck{i}'s held reads:\n{log}");
    }
    for (sock, ee, _conn) in &nbd_conns {
        let said = format!(
            "nbd export '{}' (bdev '{ee}'): 1 connection(s) still wait for requests the disk has not \
             completed at the shutdown bound of 1.5s",
            sock.display()
        );
        assert!(log.contains(&said), "nothing said about {ee}'s held read:\n{log}");
    }
}
