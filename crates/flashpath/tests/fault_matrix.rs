//! The fault matrix (docs/testing.md, "Fault matrix"): exports × stacks × faults × events,
//! every pair of values in at least one case. Each row of [`matrix!`] below is one case with a
//! daemon (two for the remote stacks) of its own, and asserts:
//!
//! * the event completes within its bound ([`EVENT_BOUND`]: an upper limit, not a speed check);
//! * every acknowledged write reads back (a model of stamped blocks, seeded by block and
//!   generation), except on a RAM stack after the daemon was stopped;
//! * the client gets a clear error where one is due (an injected EIO, a lost remote, a refused
//!   base delete naming its holder, a corrupted read with exactly the injected byte changed);
//! * the next client is served ([`SERVE_BOUND`]) and its write reads back;
//! * the bystander (a second disk with its own client, on the same reactor) keeps its I/O going
//!   while the fault holds the case's request and after the event;
//! * the daemon's fds (/proc/PID/fd) and threads (/proc/PID/task) come back to their count.
//!
//! Faults are held deterministically (error bdev `pending` and `nomem`, SIGSTOP of the remote),
//! never raced against a timer: each case waits until the request is observably held.

mod common;

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use common::fault::*;
use serde_json::json;

#[derive(Debug, Clone, Copy)]
struct Case {
    export: Export,
    stack: Stack,
    fault: Fault,
    event: Event,
}

macro_rules! matrix {
    ($($name:ident: $e:ident $s:ident $f:ident $v:ident;)*) => {
        const CASES: &[(&str, Case)] = &[$((
            stringify!($name),
            Case { export: Export::$e, stack: Stack::$s, fault: Fault::$f, event: Event::$v },
        ),)*];
        $(case_test!($name: $e $s $f $v);)*
    };
}

/// One row's test; an NVMe/TCP row is two, `name::posix` and `name::uring`, one per socket
/// implementation of the target's queue pairs.
macro_rules! case_test {
    ($name:ident: Nvmf $s:ident $f:ident $v:ident) => {
        mod $name {
            use super::*;
            fn case() -> Case {
                Case { export: Export::Nvmf, stack: Stack::$s, fault: Fault::$f, event: Event::$v }
            }
            #[test]
            fn posix() {
                run_case(case(), "posix");
            }
            #[test]
            fn uring() {
                run_case(case(), "uring");
            }
        }
    };
    ($name:ident: $e:ident $s:ident $f:ident $v:ident) => {
        #[test]
        fn $name() {
            run_case(
                Case { export: Export::$e, stack: Stack::$s, fault: Fault::$f, event: Event::$v },
                "posix",
            );
        }
    };
}

// Generated greedily (every valid fault × event pair first, then rows until every valid pair
// of any two dimensions is covered); `every_valid_pair_is_covered` checks it.
matrix! {
    c01_vhost_ram_busy_disconnect: Vhost Ram Busy Disconnect;
    c02_nbd_lvol_busy_queue_stop: Nbd Lvol Busy QueueStop;
    c03_vhost_raid1_busy_hand_off: Vhost Raid1 Busy HandOff;
    c04_nvmf_crypto_busy_remove_export: Nvmf Crypto Busy RemoveExport;
    c05_nbd_raid1_busy_raid_remove_base: Nbd Raid1 Busy RaidRemoveBase;
    c06_vhost_nbdclient_busy_sigterm: Vhost NbdClient Busy Sigterm;
    c07_vhost_nvmeinit_busy_kill9: Vhost NvmeInit Busy Kill9Restart;
    c08_nbd_crypto_pending_disconnect: Nbd Crypto Pending Disconnect;
    c09_nvmf_ram_pending_queue_stop: Nvmf Ram Pending QueueStop;
    c10_vhost_lvol_pending_hand_off: Vhost Lvol Pending HandOff;
    c11_nbd_nbdclient_pending_remove_export: Nbd NbdClient Pending RemoveExport;
    c12_nvmf_raid1_pending_raid_remove_base: Nvmf Raid1 Pending RaidRemoveBase;
    c13_nbd_nvmeinit_pending_sigterm: Nbd NvmeInit Pending Sigterm;
    c14_nbd_ram_pending_kill9: Nbd Ram Pending Kill9Restart;
    c15_nvmf_lvol_eio_disconnect: Nvmf Lvol Eio Disconnect;
    c16_vhost_crypto_eio_queue_stop: Vhost Crypto Eio QueueStop;
    c17_vhost_ram_eio_hand_off: Vhost Ram Eio HandOff;
    c18_vhost_raid1_eio_remove_export: Vhost Raid1 Eio RemoveExport;
    c19_vhost_raid1_eio_raid_remove_base: Vhost Raid1 Eio RaidRemoveBase;
    c20_nvmf_nbdclient_eio_sigterm: Nvmf NbdClient Eio Sigterm;
    c21_nvmf_nvmeinit_eio_kill9: Nvmf NvmeInit Eio Kill9Restart;
    c22_vhost_raid1_corrupt_disconnect: Vhost Raid1 Corrupt Disconnect;
    c23_nbd_nbdclient_corrupt_queue_stop: Nbd NbdClient Corrupt QueueStop;
    c24_vhost_crypto_corrupt_hand_off: Vhost Crypto Corrupt HandOff;
    c25_nvmf_ram_corrupt_remove_export: Nvmf Ram Corrupt RemoveExport;
    c26_vhost_raid1_corrupt_raid_remove_base: Vhost Raid1 Corrupt RaidRemoveBase;
    c27_vhost_lvol_corrupt_sigterm: Vhost Lvol Corrupt Sigterm;
    c28_vhost_lvol_corrupt_kill9: Vhost Lvol Corrupt Kill9Restart;
    c29_vhost_nbdclient_base_removed_disconnect: Vhost NbdClient BaseRemoved Disconnect;
    c30_nbd_raid1_base_removed_queue_stop: Nbd Raid1 BaseRemoved QueueStop;
    c31_vhost_nvmeinit_base_removed_hand_off: Vhost NvmeInit BaseRemoved HandOff;
    c32_nvmf_lvol_base_removed_remove_export: Nvmf Lvol BaseRemoved RemoveExport;
    c33_vhost_raid1_base_removed_raid_remove_base: Vhost Raid1 BaseRemoved RaidRemoveBase;
    c34_vhost_ram_base_removed_sigterm: Vhost Ram BaseRemoved Sigterm;
    c35_vhost_crypto_base_removed_kill9: Vhost Crypto BaseRemoved Kill9Restart;
    c36_vhost_nvmeinit_remote_killed_disconnect: Vhost NvmeInit RemoteKilled Disconnect;
    c37_nbd_nbdclient_remote_killed_queue_stop: Nbd NbdClient RemoteKilled QueueStop;
    c38_vhost_nbdclient_remote_killed_hand_off: Vhost NbdClient RemoteKilled HandOff;
    c39_nvmf_nvmeinit_remote_killed_remove_export: Nvmf NvmeInit RemoteKilled RemoveExport;
    c40_vhost_nbdclient_remote_killed_sigterm: Vhost NbdClient RemoteKilled Sigterm;
    c41_vhost_nbdclient_remote_killed_kill9: Vhost NbdClient RemoteKilled Kill9Restart;
    c42_vhost_nbdclient_remote_stalled_disconnect: Vhost NbdClient RemoteStalled Disconnect;
    c43_nbd_nvmeinit_remote_stalled_queue_stop: Nbd NvmeInit RemoteStalled QueueStop;
    c44_vhost_nbdclient_remote_stalled_hand_off: Vhost NbdClient RemoteStalled HandOff;
    c45_nvmf_nbdclient_remote_stalled_remove_export: Nvmf NbdClient RemoteStalled RemoveExport;
    c46_vhost_nbdclient_remote_stalled_sigterm: Vhost NbdClient RemoteStalled Sigterm;
    c47_vhost_nbdclient_remote_stalled_kill9: Vhost NbdClient RemoteStalled Kill9Restart;
    c48_nbd_raid1_eio_sigterm: Nbd Raid1 Eio Sigterm;
    c49_vhost_raid1_busy_kill9: Vhost Raid1 Busy Kill9Restart;
    c50_vhost_crypto_busy_sigterm: Vhost Crypto Busy Sigterm;
    c51_vhost_nvmeinit_corrupt_disconnect: Vhost NvmeInit Corrupt Disconnect;
}

const EXPORTS: [Export; 3] = [Export::Vhost, Export::Nbd, Export::Nvmf];
const STACKS: [Stack; 6] =
    [Stack::Ram, Stack::Lvol, Stack::Raid1, Stack::Crypto, Stack::NbdClient, Stack::NvmeInit];
const FAULTS: [Fault; 7] = [
    Fault::Busy,
    Fault::Pending,
    Fault::Eio,
    Fault::Corrupt,
    Fault::BaseRemoved,
    Fault::RemoteKilled,
    Fault::RemoteStalled,
];
const EVENTS: [Event; 7] = [
    Event::Disconnect,
    Event::QueueStop,
    Event::HandOff,
    Event::RemoveExport,
    Event::RaidRemoveBase,
    Event::Sigterm,
    Event::Kill9Restart,
];

/// One value per dimension as strings, for pair bookkeeping.
fn dims(e: Export, s: Stack, f: Fault, v: Event) -> [String; 4] {
    [format!("{e:?}"), format!("{s:?}"), format!("{f:?}"), format!("{v:?}")]
}

#[test]
fn every_valid_pair_is_covered_and_every_row_is_valid() {
    use std::collections::BTreeSet;
    let mut need = BTreeSet::new();
    for e in EXPORTS {
        for s in STACKS {
            for f in FAULTS {
                for v in EVENTS {
                    if excluded(Some(e), Some(s), Some(f), Some(v)).is_none() {
                        let d = dims(e, s, f, v);
                        for i in 0..4 {
                            for j in i + 1..4 {
                                need.insert((i, d[i].clone(), j, d[j].clone()));
                            }
                        }
                    }
                }
            }
        }
    }
    let mut names = BTreeSet::new();
    for (name, c) in CASES {
        assert!(names.insert(*name), "{name} twice");
        if let Some(why) = excluded(Some(c.export), Some(c.stack), Some(c.fault), Some(c.event)) {
            panic!("{name} is not a valid case: {why}");
        }
        let d = dims(c.export, c.stack, c.fault, c.event);
        for i in 0..4 {
            for j in i + 1..4 {
                need.remove(&(i, d[i].clone(), j, d[j].clone()));
            }
        }
    }
    assert!(need.is_empty(), "pairs no case covers: {need:?}");
    // 3 × 6 × 7 × 7 = 882 combinations; the pairwise table is far smaller.
    assert!(CASES.len() <= 60, "{} cases", CASES.len());
}

/// Injects `error_type` for `io_type` on the error bdev `ee` of daemon `d`.
fn inject(d: &common::Daemon, ee: &str, io_type: &str, error_type: &str, num: u64) {
    let mut p = json!({"name": ee, "io_type": io_type, "error_type": error_type, "num": num});
    if error_type == "corrupt_data" {
        p["corrupt_offset"] = json!(100);
        p["corrupt_value"] = json!(0xff);
    }
    assert_eq!(d.call("bdev_error_inject_error", p), json!(true));
}

fn injections(d: &common::Daemon, ee: &str) -> serde_json::Value {
    d.call("bdev_get_bdevs", json!({"name": ee}))[0]["driver_specific"]["error"]["injections"].clone()
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a daemon this test started; no memory is involved.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// SIGSTOPs `pid` and waits (bounded) until every one of its threads is stopped: kill(2)
/// returns before the signal takes effect, and a reactor still running could answer the request
/// that is meant to hang.
fn stop_process(pid: u32, what: &str) {
    signal(pid, libc::SIGSTOP);
    let deadline = Instant::now() + EVENT_BOUND;
    loop {
        let states: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.filter_map(|t| t.ok())
                    .map(|t| std::fs::read_to_string(t.path().join("stat")).unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        // A thread's state follows its name, which is in parentheses.
        let stopped = |stat: &String| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'));
        if !states.is_empty() && states.iter().all(stopped) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: pid {pid} not stopped by SIGSTOP: {states:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The error bdevs that take the injection (both replicas for a corrupted raid1 read, so the
/// raid's choice of replica does not matter).
fn fault_bdevs(c: Case) -> Vec<&'static str> {
    match (c.stack, c.fault) {
        (Stack::Raid1, Fault::Corrupt) => vec!["EE_u0", "EE_u1"],
        (Stack::Ram, _) => vec!["EE_m"],
        _ => vec!["EE_u0"],
    }
}

/// Whether the case's request, refused as busy, waits in a device below the export rather
/// than in this daemon's stack: the remote daemon parks it (an NBD client or NVMe/TCP initiator
/// stack), or a raid1 write waits for its second copy (giving that up would leave the copies
/// different). An NBD or NVMe-oF stop then answers EBUSY at its bound and keeps the bdev.
fn held_below_on_busy(c: Case) -> bool {
    c.fault == Fault::Busy
        && matches!(c.stack, Stack::NbdClient | Stack::NvmeInit | Stack::Raid1)
        && matches!(c.event, Event::QueueStop | Event::RemoveExport)
        && c.export != Export::Vhost
}

/// Ends an injected fault (the daemon holding it must be running).
fn clear(rig: &Rig, c: Case) {
    let (d, _) = rig.fault_point();
    for ee in fault_bdevs(c) {
        let p = json!({"name": ee, "io_type": "clear", "error_type": "failure"});
        assert_eq!(d.call("bdev_error_inject_error", p), json!(true));
    }
}

const FAULT_BLOCK: u64 = 20;

/// Runs case `c`, an NVMe/TCP export's queue pairs on socket implementation `sock_impl`.
fn run_case(c: Case, sock_impl: &'static str) {
    let what = format!("{:?} ({sock_impl}) / {:?} / {:?} / {:?}", c.export, c.stack, c.fault, c.event);
    let started = Instant::now();
    let mut rig = Rig::new(c.export, c.stack, sock_impl);
    Bystander::prepare(&rig.local);
    let never = AtomicBool::new(false);
    let mut model = Model::default();

    // Acknowledged writes before the fault, from a first client that then leaves: the fds and
    // threads the stack opens at its first I/O and keeps (its channels) are in the baseline.
    let mut first = rig.connect("the first client");
    for b in 0..8 {
        match first.write(b, &block_data(b, 1), &never) {
            Outcome::Done(_) => {
                model.acked.insert(b, 1);
            }
            o => panic!("{what}: write of block {b} before the fault: {o:?}"),
        }
    }
    drop(first);
    let mut baseline = settled_counts(rig.local.pid());
    let mut baseline_fds = fd_list(rig.local.pid());
    let mut by = Some(Bystander::start(&rig.local));
    by.as_ref().unwrap().assert_progress(10, &what);

    let mut client = rig.connect("client A");
    for b in 8..12 {
        match client.write(b, &block_data(b, 1), &never) {
            Outcome::Done(_) => {
                model.acked.insert(b, 1);
            }
            o => panic!("{what}: write of block {b} before the fault: {o:?}"),
        }
    }

    // The fault.
    match c.fault {
        Fault::Busy | Fault::Pending | Fault::Eio | Fault::Corrupt => {
            let (d, _) = rig.fault_point();
            for ee in fault_bdevs(c) {
                match c.fault {
                    Fault::Busy => inject(d, ee, "write", "nomem", 1_000_000_000),
                    Fault::Pending => inject(d, ee, "write", "pending", 1),
                    Fault::Eio => inject(d, ee, "write", "failure", 1),
                    _ => inject(d, ee, "read", "corrupt_data", 1),
                }
            }
        }
        Fault::BaseRemoved if c.stack.remote() => rig.remote_unexport(),
        Fault::BaseRemoved => {
            let (method, base) = match c.stack {
                Stack::Ram => ("bdev_malloc_delete", "m"),
                _ => ("bdev_uring_delete", "u0"),
            };
            let e = rig.local.try_call(method, json!({"name": base})).expect_err("deleting a claimed base");
            assert!(
                e.message.contains(base) && e.message.contains("in use"),
                "{what}: the refusal names the base and its holder: {}",
                e.message
            );
        }
        Fault::RemoteKilled => {
            rig.remote.as_mut().expect("remote").kill9();
        }
        Fault::RemoteStalled => stop_process(rig.remote.as_ref().expect("remote").pid(), &what),
    }

    // The faulted request, on a thread of its own so a hold can last through the event.
    let (severer, abort) = client.severer();
    let op = std::thread::spawn(move || {
        let o = if c.fault == Fault::Corrupt {
            client.read(0, &abort)
        } else {
            client.write(FAULT_BLOCK, &block_data(FAULT_BLOCK, 1), &abort)
        };
        (client, o)
    });
    let mut held = None;
    let mut returned = None;
    if c.fault.holds() {
        // Wait until the request is observably held (not a timer).
        let deadline = Instant::now() + EVENT_BOUND;
        loop {
            let is_held = match c.fault {
                Fault::Busy => {
                    let (d, ee) = rig.fault_point();
                    injections(d, ee)["write"]["num"].as_u64().is_some_and(|n| n < 1_000_000_000)
                }
                Fault::Pending => {
                    let (d, ee) = rig.fault_point();
                    injections(d, ee).get("write").is_none()
                }
                _ => rig.top_in_flight() > 0,
            };
            if is_held {
                break;
            }
            assert!(!op.is_finished(), "{what}: the faulted request completed while the fault holds it");
            assert!(Instant::now() < deadline, "{what}: the faulted request was never held");
            std::thread::sleep(Duration::from_millis(5));
        }
        by.as_ref().unwrap().assert_progress(20, &format!("{what}: while the request is held"));
        held = Some(op);
    } else {
        let (cl, o) = common::bounded(EVENT_BOUND, "faulted request", move || op.join().expect("op thread"));
        match (c.fault, c.stack) {
            (Fault::Eio, Stack::Raid1) => {
                assert_eq!(o, Outcome::Done(Vec::new()), "{what}: raid1 hides one replica's EIO");
            }
            (Fault::Eio | Fault::RemoteKilled, _)
            | (Fault::BaseRemoved, Stack::NbdClient | Stack::NvmeInit) => {
                assert!(matches!(o, Outcome::Failed(_)), "{what}: the write must fail with an error: {o:?}")
            }
            (Fault::BaseRemoved, _) => {
                assert_eq!(o, Outcome::Done(Vec::new()), "{what}: a refused delete changes nothing")
            }
            (Fault::Corrupt, _) => {
                let Outcome::Done(got) = &o else { panic!("{what}: the corrupted read: {o:?}") };
                let want = block_data(0, 1);
                let diff: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
                if c.stack == Stack::Crypto {
                    // A ciphertext byte changed garbles its whole 16-byte AES-XTS block.
                    assert!(
                        !diff.is_empty() && diff.iter().all(|i| (96..112).contains(i)),
                        "{what}: the corrupted read differs only in the XTS block of byte 100: {diff:?}"
                    );
                } else {
                    assert_eq!(
                        diff,
                        vec![100],
                        "{what}: the corrupted read differs exactly at the injected byte"
                    );
                    assert_eq!(got[100], want[100] ^ 0xff, "{what}: the injected value");
                }
            }
            _ => unreachable!(),
        }
        if o == Outcome::Done(Vec::new()) && c.fault != Fault::Corrupt {
            model.acked.insert(FAULT_BLOCK, 1);
        }
        by.as_ref().unwrap().assert_progress(20, &format!("{what}: after the fault"));
        returned = Some(cl);
    }
    let resolve_hold = |rig: &Rig| {
        // Ends a hold that an event has to wait for (pending, a stalled remote); Busy must not
        // hold an event up, so it stays until after the event.
        match c.fault {
            Fault::Pending => clear(rig, c),
            Fault::RemoteStalled => signal(rig.remote.as_ref().unwrap().pid(), libc::SIGCONT),
            _ => {}
        }
    };
    let mut resolved = false;
    let sock = rig.local.rpc.clone();

    // The event.
    let mut restarted = false;
    match c.event {
        Event::Disconnect => {
            severer.sever();
            drop(returned.take());
        }
        Event::QueueStop | Event::RemoveExport | Event::RaidRemoveBase | Event::HandOff => {
            let calls: Vec<(&'static str, serde_json::Value)> = match c.event {
                Event::QueueStop => vec![rig.queue_stop_rpc()],
                Event::RemoveExport => rig.remove_export_rpcs(),
                Event::RaidRemoveBase => vec![("bdev_raid_remove_base_bdev", json!({"name": "EE_u0"}))],
                _ => vec![(
                    "vhost_create_blk_controller",
                    json!({"ctrlr": "v2", "dev_name": rig.top, "num_queues": 1, "migrate_from": "v"}),
                )],
            };
            let s = sock.clone();
            let again = calls.clone();
            let ev = std::thread::spawn(move || {
                calls.into_iter().map(|(m, p)| rpc(&s, m, p)).collect::<Result<Vec<_>, String>>()
            });
            if c.event == Event::HandOff {
                // The source's client leaves; its queues stop before the destination's start.
                severer.sever();
                drop(returned.take());
            }
            if c.fault != Fault::Busy {
                resolve_hold(&rig);
                resolved = true;
            }
            let r = common::bounded(EVENT_BOUND, "the event", move || ev.join().expect("event thread"));
            match r {
                Err(e) if held_below_on_busy(c) && e.contains("-16") => {
                    // The request is not parked in this daemon: a device below the export holds
                    // it (the remote daemon parks it on its Busy; raid1 waits for its second
                    // copy). A stop cannot end it, so it says so, by how much, and keeps the
                    // bdev; once the Busy clears the same stop ends.
                    assert!(e.contains("still"), "{what}: the refusal says what is still held: {e}");
                    clear(&rig, c);
                    resolved = true;
                    let s = sock.clone();
                    let r = common::bounded(EVENT_BOUND, "the event again", move || {
                        again.into_iter().map(|(m, p)| rpc(&s, m, p)).collect::<Result<Vec<_>, String>>()
                    });
                    r.unwrap_or_else(|e| panic!("{what}: the event, once the Busy cleared, failed: {e}"));
                }
                r => {
                    r.unwrap_or_else(|e| panic!("{what}: the event failed: {e}"));
                }
            }
            if c.event == Event::RemoveExport {
                let deadline = Instant::now() + EVENT_BOUND;
                while rig.top_claimed() {
                    assert!(Instant::now() < deadline, "{what}: the export did not release {}", rig.top);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            if c.event != Event::RaidRemoveBase {
                severer.sever();
            }
        }
        Event::Sigterm | Event::Kill9Restart => {
            let pid = rig.local.pid();
            by.take().unwrap().abandon();
            severer.sever();
            let t = Instant::now();
            if c.event == Event::Sigterm {
                rig.local.assert_stops_on_sigterm();
            } else {
                rig.local.kill9();
            }
            assert!(t.elapsed() < EVENT_BOUND, "{what}: the daemon took {:?} to go", t.elapsed());
            assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "{what}: pid {pid} still there");
            restarted = true;
        }
    }
    if !c.event.ends_daemon() && c.fault == Fault::Busy {
        // The event is done with the request still parked on Busy.
        by.as_ref().unwrap().assert_progress(20, &format!("{what}: after the event"));
    }

    // The faulted request ends (or its client has gone).
    if !resolved && c.fault.holds() && !(restarted && local_is(c)) {
        resolve_hold_after(&rig, c);
    }
    if let Some(op) = held.take() {
        let (cl, o) = common::bounded(EVENT_BOUND, "the held request", move || op.join().expect("op thread"));
        if let Outcome::Done(_) = o {
            model.acked.insert(FAULT_BLOCK, 1);
        }
        drop(cl);
    }
    drop(returned.take());
    // The faulted client is done: its connection ends with the severer's clone of its socket
    // (events that do not sever it leave that clone open until here).
    drop(severer);

    // Clear the fault and bring the export back.
    if c.fault == Fault::RemoteKilled {
        let r = rig.remote.as_mut().unwrap();
        r.restart();
        rig.build_remote(false);
    } else if c.fault == Fault::BaseRemoved && c.stack.remote() {
        rig.remote_export();
    } else if matches!(c.fault, Fault::Eio | Fault::Corrupt) && !(restarted && local_is(c)) {
        clear(&rig, c);
    }
    if restarted {
        rig.local.restart();
        rig.build_local(false);
        rig.export_top();
        Bystander::prepare(&rig.local);
        baseline = settled_counts(rig.local.pid());
        baseline_fds = fd_list(rig.local.pid());
        by = Some(Bystander::start(&rig.local));
        by.as_ref().unwrap().assert_progress(10, &what);
    } else {
        let broken = c.stack.remote() && matches!(c.fault, Fault::BaseRemoved | Fault::RemoteKilled);
        if broken {
            rig.reattach_remote();
        } else {
            match c.event {
                Event::QueueStop => rig.undo_queue_stop(),
                Event::RemoveExport => rig.export_top(),
                Event::HandOff => {
                    rig.ctrlr = "v2".into();
                }
                _ => {}
            }
        }
    }

    // The next client: everything acknowledged reads back, and it is served.
    let mut next = rig.connect("the next client");
    let check_data = !restarted || c.stack.persistent();
    if check_data {
        for (&b, &g) in &model.acked {
            match next.read(b, &never) {
                Outcome::Done(got) => common::assert_same(
                    &format!("{what}: acknowledged block {b}"),
                    b * 4096,
                    &got,
                    &block_data(b, g),
                ),
                o => panic!("{what}: reading acknowledged block {b}: {o:?}"),
            }
        }
    }
    assert_eq!(
        next.write(30, &block_data(30, 3), &never),
        Outcome::Done(Vec::new()),
        "{what}: the next client's write"
    );
    assert_eq!(next.read(30, &never), Outcome::Done(block_data(30, 3)), "{what}: the next client's read");
    drop(next);
    if c.export == Export::Nbd {
        // libnbd too (nbdcopy) reads the acknowledged blocks back through the export.
        let out = rig.local.dir.path().join("nbdcopy.raw");
        let uri = rig.nbd_uri();
        common::nbd::tool_ok(std::process::Command::new("nbdcopy").arg(&uri).arg(&out));
        let disk = std::fs::read(&out).expect("nbdcopy's copy");
        let mut want: Vec<(u64, u64)> = vec![(30, 3)];
        if check_data {
            want.extend(model.acked.iter().map(|(&b, &g)| (b, g)));
        }
        for (b, g) in want {
            let at = (b * 4096) as usize;
            common::assert_same(
                &format!("{what}: block {b} through nbdcopy"),
                at as u64,
                &disk[at..at + 4096],
                &block_data(b, g),
            );
        }
    }
    if rig.ctrlr == "v2" {
        let r = common::bounded(EVENT_BOUND, "deleting the source controller", move || {
            rpc(&sock, "vhost_delete_controller", json!({"ctrlr": "v"}))
        });
        r.unwrap_or_else(|e| panic!("{what}: {e}"));
        // The source's listening socket went, the destination's came: one for one.
    }
    by.as_ref().unwrap().assert_progress(10, &format!("{what}: at the end"));
    let by_ops = by.take().unwrap().finish();
    assert!(by_ops > 0);
    // The bystander's client has left too: the count is the one before any client came.
    let pid = rig.local.pid();
    let r = std::panic::catch_unwind(|| assert_settles(pid, baseline, &what));
    if let Err(e) = r {
        let now = fd_list(pid);
        eprintln!("{what}: fds before the case: {baseline_fds:?}");
        let extra: Vec<&String> = now.iter().filter(|f| !baseline_fds.contains(f)).collect();
        eprintln!("{what}: fds not there before: {extra:?}");
        for p in socket_peers(&extra) {
            eprintln!("{what}: {p}");
        }
        std::panic::resume_unwind(e);
    }
    rig.local.assert_alive();
    eprintln!("{what}: passed in {:?}", started.elapsed());
}

/// Whether the case's fault lives in the local daemon (and dies with it).
fn local_is(c: Case) -> bool {
    !c.stack.remote()
}

/// Ends a hold after the event (Busy, or a hold the event did not need ended first).
fn resolve_hold_after(rig: &Rig, c: Case) {
    match c.fault {
        Fault::Busy | Fault::Pending => clear(rig, c),
        Fault::RemoteStalled => signal(rig.remote.as_ref().unwrap().pid(), libc::SIGCONT),
        _ => {}
    }
}

/// A small seeded generator (splitmix64), so a soak's schedule repeats from its seed.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// One case of the whole product, named as the soak's report names it, e.g.
/// `FP_CASE="Nbd / NvmeInit / Busy / QueueStop" cargo test -p flashpath --test fault_matrix --
/// --ignored --exact one_case`: to run again a combination the soak found failing.
#[test]
#[ignore = "one case by name: FP_CASE=\"Export / Stack / Fault / Event\""]
fn one_case() {
    let name = std::env::var("FP_CASE").expect("FP_CASE names the case: \"Export / Stack / Fault / Event\"");
    let parts: Vec<&str> = name.split('/').map(str::trim).collect();
    assert_eq!(parts.len(), 4, "FP_CASE is \"Export / Stack / Fault / Event\", not {name:?}");
    fn find<T: Copy + std::fmt::Debug>(all: &[T], want: &str) -> T {
        *all.iter()
            .find(|v| format!("{v:?}") == want)
            .unwrap_or_else(|| panic!("{want:?} is none of {all:?}"))
    }
    let c = Case {
        export: find(&EXPORTS, parts[0]),
        stack: find(&STACKS, parts[1]),
        fault: find(&FAULTS, parts[2]),
        event: find(&EVENTS, parts[3]),
    };
    if let Some(why) = excluded(Some(c.export), Some(c.stack), Some(c.fault), Some(c.event)) {
        panic!("{name} is not a case: {why}");
    }
    // An NVMe/TCP case's socket implementation: FP_SOCK_IMPL, posix by default.
    let sock_impl = match std::env::var("FP_SOCK_IMPL").as_deref() {
        Ok("uring") => "uring",
        Ok("posix") | Err(_) => "posix",
        Ok(other) => panic!("FP_SOCK_IMPL is posix or uring, not {other:?}"),
    };
    run_case(c, sock_impl);
}

/// The soak (`./run soak --minutes N [--seed S]`, docs/testing.md "Soak"): for the given time,
/// matrix cases drawn from every valid combination on a seeded schedule (each with all of a
/// case's checks, on daemons of its own), while one long-lived daemon serves a disk under
/// verified load that the schedule also hits (Busy parked writes, held writes resumed, the
/// client cut off and reconnecting) and whose RSS, fds and threads are sampled every second.
/// Prints a report; fails on any failed case, lost write, hang or bound missed, on RSS growth
/// after the first minute beyond a bound, and on fds or threads that do not come back.
/// Ignored in the ordinary run: `FP_SOAK_SECONDS` (default 60) and `FP_SOAK_SEED` (default 1).
#[test]
#[ignore = "the soak: ./run soak --minutes N"]
fn soak() {
    let seconds: u64 = std::env::var("FP_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = std::env::var("FP_SOAK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut rng = Seeded(seed);
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);

    // The long-lived daemon: a RAM disk under an error bdev, under verified load.
    let d = common::Daemon::start("0");
    d.malloc("sm", 256, 4096);
    d.call("bdev_error_create", json!({"base_name": "sm"}));
    d.controller("by", "EE_sm", Some(1), false);
    let pid = d.pid();
    let baseline = settled_counts(pid);
    let mut load = Some(Bystander::start(&d));
    let mut verified = 0u64;
    // RSS, fds and threads of the long-lived daemon, every second, from a thread of its own.
    let sampling = std::sync::Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut samples: Vec<(Duration, u64, (usize, usize))> = Vec::new();
            while sampling.load(std::sync::atomic::Ordering::Acquire) {
                samples.push((started.elapsed(), rss_kib(pid), fds_and_threads(pid)));
                std::thread::sleep(Duration::from_secs(1));
            }
            samples.push((started.elapsed(), rss_kib(pid), fds_and_threads(pid)));
            samples
        })
    };
    let mut fired: std::collections::BTreeMap<String, u32> = Default::default();
    let mut failures: Vec<String> = Vec::new();
    let mut worst_case = Duration::ZERO;

    while Instant::now() < until {
        // One action on the long-lived daemon.
        let action = rng.pick(&["busy", "pending", "reconnect"]);
        *fired.entry(format!("long-lived: {action}")).or_default() += 1;
        let l = load.as_ref().unwrap();
        match action {
            "busy" => {
                inject(&d, "EE_sm", "write", "nomem", 1_000_000_000);
                let deadline = Instant::now() + EVENT_BOUND;
                while injections(&d, "EE_sm")["write"]["num"].as_u64().is_some_and(|n| n == 1_000_000_000) {
                    assert!(Instant::now() < deadline, "soak: the load's write was never parked on Busy");
                    std::thread::sleep(Duration::from_millis(5));
                }
                clear_named(&d, "EE_sm");
                l.assert_progress(20, "soak: after Busy cleared");
            }
            "pending" => {
                inject(&d, "EE_sm", "write", "pending", 1);
                let deadline = Instant::now() + EVENT_BOUND;
                while injections(&d, "EE_sm").get("write").is_some() {
                    assert!(Instant::now() < deadline, "soak: the load's write was never held");
                    std::thread::sleep(Duration::from_millis(5));
                }
                assert_eq!(d.call("bdev_error_resume_pending", json!({"name": "EE_sm"})), json!(true));
                l.assert_progress(20, "soak: after resume");
            }
            _ => {
                verified += load.take().unwrap().finish();
                load = Some(Bystander::start(&d));
                load.as_ref().unwrap().assert_progress(20, "soak: the reconnected client");
            }
        }

        // One matrix case from every valid combination.
        let c = loop {
            let c = Case {
                export: rng.pick(&EXPORTS),
                stack: rng.pick(&STACKS),
                fault: rng.pick(&FAULTS),
                event: rng.pick(&EVENTS),
            };
            if excluded(Some(c.export), Some(c.stack), Some(c.fault), Some(c.event)).is_none() {
                break c;
            }
        };
        let sock_impl = rng.pick(&["posix", "uring"]);
        let name = format!("{:?} ({sock_impl}) / {:?} / {:?} / {:?}", c.export, c.stack, c.fault, c.event);
        *fired.entry(format!("fault {:?}", c.fault)).or_default() += 1;
        *fired.entry(format!("event {:?}", c.event)).or_default() += 1;
        let t = Instant::now();
        let r = std::panic::catch_unwind(|| run_case(c, sock_impl));
        worst_case = worst_case.max(t.elapsed());
        println!(
            "soak: {:>6.1}s  {name}: {}",
            started.elapsed().as_secs_f64(),
            if r.is_ok() { "ok" } else { "FAILED" }
        );
        if r.is_err() {
            failures.push(name);
        }
    }
    verified += load.take().unwrap().finish();
    sampling.store(false, std::sync::atomic::Ordering::Release);
    let samples = sampler.join().expect("the sampler");
    let settled = within(SETTLE_BOUND, move || {
        assert_settles(pid, baseline, "soak: the long-lived daemon");
    });

    // The report.
    println!("soak report (seed {seed}, {:.0} s)", started.elapsed().as_secs_f64());
    for (what, n) in &fired {
        println!("  fired {n:>4} × {what}");
    }
    println!("  long-lived daemon: {verified} verified writes read back");
    println!("  slowest case: {worst_case:?} (each event bounded by {EVENT_BOUND:?})");
    // Growth is measured from the first minute on (from half-way in a shorter run): start-up
    // and the allocator's first arenas are not growth.
    let reference = Duration::from_secs(60).min(started.elapsed() / 2);
    let after_minute = samples.iter().find(|s| s.0 >= reference).or(samples.first()).unwrap();
    let last = samples.last().unwrap();
    let growth = last.1 as i64 - after_minute.1 as i64;
    println!(
        "  RSS: {} KiB at {:.0} s, {} KiB at the end ({growth:+} KiB)",
        after_minute.1,
        after_minute.0.as_secs_f64(),
        last.1
    );
    let (fmin, fmax) = samples.iter().fold((usize::MAX, 0), |(a, b), s| (a.min(s.2 .0), b.max(s.2 .0)));
    let (tmin, tmax) = samples.iter().fold((usize::MAX, 0), |(a, b), s| (a.min(s.2 .1), b.max(s.2 .1)));
    println!(
        "  fds {fmin}..{fmax}, threads {tmin}..{tmax} over {} samples; baseline {baseline:?}",
        samples.len()
    );
    println!("  cases failed: {}", failures.len());
    for f in &failures {
        println!("    {f}");
    }
    assert!(failures.is_empty(), "soak: {} cases failed: {failures:?}", failures.len());
    assert!(settled.is_ok(), "soak: the long-lived daemon's fds or threads did not come back");
    // 16 MiB: far above allocator noise, far below a per-request leak over minutes.
    assert!(growth < 16 << 10, "soak: RSS grew by {growth} KiB after the first minute");
    assert!(verified > 0, "soak: the long-lived load verified nothing");
}

fn clear_named(d: &common::Daemon, ee: &str) {
    let p = json!({"name": ee, "io_type": "clear", "error_type": "failure"});
    assert_eq!(d.call("bdev_error_inject_error", p), json!(true));
}
