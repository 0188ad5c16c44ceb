//! Back-pressure at close: a command the device refused as busy is retried while its queue
//! closes, and answered (aborted) at the close bound rather than dropped unanswered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::{Bdev, ErrorDevice, ErrorType, Injection};
use fp_nvme_spec::tcp::Digests;
use fp_nvme_spec::*;

use super::api::ram;
use super::host::*;
use super::io::{pattern, wait_for, NQN};
use crate::tcp::qpair::CLOSE_TIMEOUT;
use crate::testing::LoopbackTarget;
use crate::*;

/// An injection count no test uses up: a reactor retries a busy command millions of times a
/// second.
const NOMEM_FOREVER: u64 = 1 << 60;

struct BusyTarget {
    t: NvmfTarget,
    port: u16,
    ee: Arc<ErrorDevice>,
    /// Stops the target and its reactor when the test drops it.
    _loopback: LoopbackTarget,
}

/// A target whose namespace 1 is an error bdev refusing every write as busy.
fn busy_target() -> BusyTarget {
    busy_target_over(false)
}

/// [`busy_target`], or with `crypto` its namespace a crypto bdev over that error bdev: a
/// stacked bdev that takes the write and retries its refused piece itself (parked on Busy
/// inside the bdev stack, not in the queue).
fn busy_target_over(crypto: bool) -> BusyTarget {
    let ee = Arc::new(ErrorDevice::new("ee0", ram("ram0", 8192)).unwrap());
    let bdev: Bdev = if crypto {
        let key = fp_crypto::CryptoKey::new("k", &[1; 32], &[2; 32]).unwrap();
        Arc::new(fp_crypto::CryptoDevice::new("c0", ee.clone(), Arc::new(key)).unwrap())
    } else {
        ee.clone()
    };
    let loopback = LoopbackTarget::start(&[0], TransportOptions::default()).unwrap();
    loopback.target().set_sock_impl(super::sock_impl());
    loopback.add_subsystem(NQN, bdev, if crypto { "c0" } else { "ee0" }).unwrap();
    let nomem = Injection {
        error_type: ErrorType::Nomem,
        num: NOMEM_FOREVER,
        queue_depth: 0,
        corrupt_offset: 0,
        corrupt_value: 0,
    };
    ee.inject(&[1], nomem).unwrap();
    BusyTarget { t: loopback.target().clone(), port: loopback.port(), ee, _loopback: loopback }
}

/// Sends a 4 KiB in-capsule write and waits until the device has refused it at least once.
fn send_refused_write(tg: &BusyTarget, q: &mut Host) -> u16 {
    let mut s = q.rw_sqe(NVM_WRITE, 1, 0, 8);
    set_sgl(&mut s, SGL_IN_CAPSULE, 4096);
    q.send_capsule(&s, &pattern(9, 4096));
    let refused = || tg.ee.injections()[1].is_some_and(|i| i.num < NOMEM_FOREVER);
    assert!(wait_for(refused), "the write never reached the device");
    s.cid()
}

on_each_sock_impl!(a_command_refused_as_busy_is_retried_while_its_queue_closes);
fn a_command_refused_as_busy_is_retried_while_its_queue_closes() {
    let tg = busy_target();
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let cid = send_refused_write(&tg, &mut q);
    // The target closes every queue; once the queue's reactor has taken that message (the
    // call below runs after it), the device takes requests again.
    tg.t.stop();
    tg.t.inner.reactors[0].call(|_| ()).expect("the reactor answers");
    tg.ee.clear();
    let cqe = q.response();
    assert_eq!((cqe.cid, cqe.status), (cid, Status::SUCCESS));
    q.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(q.closed().0, "the queue closes once the write is answered");
}

on_each_sock_impl!(a_command_still_refused_at_the_close_bound_is_answered_aborted);
fn a_command_still_refused_at_the_close_bound_is_answered_aborted() {
    let tg = busy_target();
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let cid = send_refused_write(&tg, &mut q);
    let start = Instant::now();
    tg.t.stop();
    let cqe = q.response();
    assert_eq!((cqe.cid, cqe.status), (cid, Status::generic(SC_ABORTED_SQ_DELETION)));
    assert!(start.elapsed() >= CLOSE_TIMEOUT, "answered before the bound: {:?}", start.elapsed());
    q.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(q.closed().0);
}

on_each_sock_impl!(
    removing_a_namespace_retries_a_command_parked_below_until_the_bound_then_answers_it_aborted
);
fn removing_a_namespace_retries_a_command_parked_below_until_the_bound_then_answers_it_aborted() {
    let tg = busy_target_over(true);
    let bound = Duration::from_millis(400);
    tg.t.set_drain_timeout(bound);
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let cid = send_refused_write(&tg, &mut q);
    let start = Instant::now();
    // Nothing is on the device: the crypto bdev holds the write refused as busy. It is not
    // counted as in flight there; it is given up at the bound and the removal succeeds.
    tg.t.remove_namespace(NQN, 1).expect("a command parked on Busy does not hold the namespace");
    assert!(start.elapsed() >= bound, "given up before the bound: {:?}", start.elapsed());
    q.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let cqe = q.response();
    assert_eq!((cqe.cid, cqe.status), (cid, Status::generic(SC_ABORT_REQUESTED)));
    // It never reached the device: refused every time.
    assert!(tg.ee.injections()[1].is_some_and(|i| i.num < NOMEM_FOREVER));
}

on_each_sock_impl!(a_command_parked_below_that_the_device_takes_before_the_bound_completes);
fn a_command_parked_below_that_the_device_takes_before_the_bound_completes() {
    let tg = busy_target_over(true);
    tg.t.set_drain_timeout(Duration::from_secs(30));
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let cid = send_refused_write(&tg, &mut q);
    let ee = tg.ee.clone();
    let remove = {
        let t = tg.t.clone();
        std::thread::spawn(move || t.remove_namespace(NQN, 1))
    };
    // The drain retries it: once the device takes requests again, the write completes and
    // the removal answers long before its bound.
    ee.clear();
    let cqe = q.response();
    assert_eq!((cqe.cid, cqe.status), (cid, Status::SUCCESS));
    remove.join().unwrap().expect("drained");
}

on_each_sock_impl!(a_closing_queue_gives_up_a_command_parked_below_at_its_bound);
fn a_closing_queue_gives_up_a_command_parked_below_at_its_bound() {
    let tg = busy_target_over(true);
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let cid = send_refused_write(&tg, &mut q);
    let start = Instant::now();
    tg.t.stop();
    q.s.set_read_timeout(Some(CLOSE_TIMEOUT + Duration::from_secs(5))).unwrap();
    let cqe = q.response();
    assert_eq!((cqe.cid, cqe.status), (cid, Status::generic(SC_ABORTED_SQ_DELETION)));
    assert!(start.elapsed() >= CLOSE_TIMEOUT, "answered before the bound: {:?}", start.elapsed());
    assert!(q.closed().0, "the queue closes once the write is answered");
}

on_each_sock_impl!(a_closing_queue_retries_for_the_close_bound_the_target_was_given);
fn a_closing_queue_retries_for_the_close_bound_the_target_was_given() {
    let tg = busy_target();
    let bound = CLOSE_TIMEOUT * 2;
    tg.t.set_close_timeout(bound);
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let cid = send_refused_write(&tg, &mut q);
    let start = Instant::now();
    tg.t.stop();
    q.s.set_read_timeout(Some(bound + Duration::from_secs(5))).unwrap();
    let cqe = q.response();
    assert_eq!((cqe.cid, cqe.status), (cid, Status::generic(SC_ABORTED_SQ_DELETION)));
    assert!(start.elapsed() >= bound, "answered at the default bound: {:?}", start.elapsed());
}
