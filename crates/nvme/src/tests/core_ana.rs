//! Host-side ANA over the fake transport: two fake controllers as the two paths of one
//! namespace, each reporting ANA with a page and an I/O status the test sets. What the device
//! answers is fixed before each request, so no race decides where a request goes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::conformance::{read_range, write_range, write_status, IoBuf};
use fp_bdev::{BlockDevice, IoOp, IoStatus};
use fp_nvme_spec as spec;
use fp_nvme_spec::aer::{AsyncEventInfo, INFO_ANA_CHANGE};
use fp_nvme_spec::log_page::{AnaGroupDescriptor, AnaLogPage, AnaState, LID_ANA};

use super::core_fake::{attach, test_options, wait_for, FakeDevice};
use super::core_mpath::spin;
use crate::bdev::paths::{NsPath, Policy, Selector};
use crate::bdev::NvmeNamespace;
use crate::ctrlr::Controller;

/// A page with namespace 1 in ANA group 1 at `state`.
fn page(state: AnaState) -> AnaLogPage {
    AnaLogPage {
        change_count: 1,
        groups: vec![AnaGroupDescriptor { grpid: 1, change_count: 1, state, nsids: vec![1] }],
    }
}

/// Two fake controllers reporting ANA (namespace 1 optimized on both, ANATT `anatt` s) as the
/// paths of one namespace.
struct Paths {
    devs: [FakeDevice; 2],
    ctrlrs: [Arc<dyn Controller>; 2],
    ns: Arc<NvmeNamespace>,
    ids: [u64; 2],
}

impl Drop for Paths {
    fn drop(&mut self) {
        for c in &self.ctrlrs {
            c.detach();
        }
    }
}

fn paths(name: &str, anatt: u8) -> Paths {
    paths_reporting(name, Some(anatt))
}

/// [`paths`] with ANA reporting (ANATT in seconds) or without.
fn paths_reporting(name: &str, anatt: Option<u8>) -> Paths {
    let devs = [FakeDevice::new(&[(1, 4096, 64)]), FakeDevice::new(&[(1, 4096, 64)])];
    for d in &devs {
        let mut d = d.lock();
        d.ana = anatt.map(|_| page(AnaState::Optimized));
        d.anatt = anatt.unwrap_or(0);
    }
    let c0 = attach(&devs[0], "TCP", test_options(&format!("{name}a")).0, test_options(name).1).0;
    let c1 = attach(&devs[1], "TCP", test_options(&format!("{name}b")).0, test_options(name).1).0;
    let ns = c0.namespaces()[0].clone();
    let second: NsPath = c1.namespaces()[0].own_path().unwrap();
    ns.paths().set_multipath();
    ns.paths().add(second).unwrap();
    let ids = [ns.paths().ids()[0], ns.paths().ids()[1]];
    Paths { devs, ctrlrs: [c0, c1], ns, ids }
}

impl Paths {
    /// Device `i` reports `state` from now on: in its page and, with `fail_io`, as the status
    /// of every I/O command; with `notice`, it raises the ANA change notice.
    fn set(&self, i: usize, state: AnaState, fail_io: bool, notice: bool) {
        let mut d = self.devs[i].lock();
        d.ana = Some(page(state));
        d.io_status = state.io_status().filter(|_| fail_io);
        d.io_status_times = 0;
        if notice {
            d.events.push(AsyncEventInfo::notice(INFO_ANA_CHANGE, LID_ANA).dw0());
        }
    }

    /// Both devices report `state` (failing I/O with its status), with the notice; waits until
    /// the host shows it for both paths.
    fn set_both(&self, state: AnaState) {
        self.set(0, state, true, true);
        self.set(1, state, true, true);
        wait_for("both paths shown in the new state", || self.shown(0) == state && self.shown(1) == state);
    }

    /// Path `i`'s ANA state as `bdev_nvme_get_io_paths` shows it.
    fn shown(&self, i: usize) -> AnaState {
        let path = self.ns.paths().list()[i].clone();
        self.ns.path_info(&path).ana_state
    }

    /// Writes device `i` saw.
    fn writes(&self, i: usize) -> usize {
        self.devs[i].lock().seen.iter().filter(|s| s.opcode == spec::NVM_WRITE).count()
    }
}

#[test]
fn an_ana_status_sends_the_request_through_another_path_at_once_and_the_page_is_read_again() {
    let t = paths("anast", 10);
    assert_eq!((t.shown(0), t.shown(1)), (AnaState::Optimized, AnaState::Optimized));
    assert!(t.ns.path_info(&t.ns.paths().list()[0]).ana_reporting);
    let mut ch = t.ns.open_channel().unwrap();
    spin(&mut *ch, 130);
    write_range(&mut *ch, 0, &[1; 4096]);
    assert_eq!((t.writes(0), t.writes(1)), (1, 0), "active_passive: the first path");

    // The first path turns inaccessible without a notice: the host learns it from the
    // write's status, which is not failed upward but sent through the second path.
    let reads = t.devs[0].lock().ana_reads;
    t.set(0, AnaState::Inaccessible, true, false);
    write_range(&mut *ch, 4096, &[2; 4096]);
    assert_eq!((t.writes(0), t.writes(1)), (2, 1), "refused by the first path, served by the second");
    let view = t.ns.paths().channel_views().pop().unwrap();
    assert_eq!(view.failovers.load(Ordering::Relaxed), 1);
    wait_for("the first controller to read its ANA page again", || t.devs[0].lock().ana_reads > reads);
    wait_for("the first path shown inaccessible", || t.shown(0) == AnaState::Inaccessible);
    spin(&mut *ch, 130);
    assert_eq!(view.current.load(Ordering::Relaxed), t.ids[1], "the second path is current");
    for i in 0..4u64 {
        write_range(&mut *ch, i * 4096, &[3; 4096]);
    }
    assert_eq!((t.writes(0), t.writes(1)), (2, 5), "nothing more to the inaccessible path");
    assert!(read_range(&mut *ch, 0, 4096) == [3; 4096]);

    // Optimized again, with the notice: failback.
    t.set(0, AnaState::Optimized, false, true);
    wait_for("the first path shown optimized", || t.shown(0) == AnaState::Optimized);
    wait_for("the first path current again", || {
        spin(&mut *ch, 70);
        view.current.load(Ordering::Relaxed) == t.ids[0]
    });
    write_range(&mut *ch, 0, &[4; 4096]);
    assert_eq!((t.writes(0), t.writes(1)), (3, 5), "failback to the first path");
}

#[test]
fn non_optimized_paths_take_io_only_when_no_optimized_path_is_up() {
    let t = paths("anano", 10);
    let mut ch = t.ns.open_channel().unwrap();
    t.ns.paths().set_policy(Policy::ActiveActive { selector: Selector::RoundRobin, rr_min_io: 1 });
    t.set(0, AnaState::NonOptimized, false, true);
    wait_for("the first path shown non-optimized", || t.shown(0) == AnaState::NonOptimized);
    spin(&mut *ch, 130);
    for i in 0..8u64 {
        write_range(&mut *ch, i * 4096, &[5; 4096]);
    }
    assert_eq!((t.writes(0), t.writes(1)), (0, 8), "round robin: the optimized path only");
    t.ns.paths().set_policy(Policy::ActiveActive { selector: Selector::QueueDepth, rr_min_io: 1 });
    for i in 0..4u64 {
        write_range(&mut *ch, i * 4096, &[6; 4096]);
    }
    assert_eq!((t.writes(0), t.writes(1)), (0, 12), "queue depth: the optimized path only");

    // The optimized path goes inaccessible: the non-optimized one serves.
    t.set(1, AnaState::Inaccessible, true, true);
    wait_for("the second path shown inaccessible", || t.shown(1) == AnaState::Inaccessible);
    spin(&mut *ch, 130);
    for i in 0..4u64 {
        write_range(&mut *ch, i * 4096, &[7; 4096]);
    }
    assert_eq!((t.writes(0), t.writes(1)), (4, 12), "the non-optimized path when no optimized one");
}

#[test]
fn with_every_path_inaccessible_io_waits_then_goes_where_a_path_turns_optimized() {
    let t = paths("anawait", 60);
    let mut ch = t.ns.open_channel().unwrap();
    t.set_both(AnaState::Inaccessible);
    spin(&mut *ch, 130);
    let mut b = IoBuf::new(4096, true);
    b.bytes_mut().fill(8);
    ch.submit(&b.request(9, IoOp::Write, 0)).unwrap();
    let mut done = Vec::new();
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        ch.poll(&mut |tag, status| done.push((tag, status)));
    }
    assert!(done.is_empty(), "a write completed with every path inaccessible: {done:?}");
    assert_eq!((t.writes(0), t.writes(1)), (0, 0), "nothing sent to an inaccessible path");

    t.set(1, AnaState::Optimized, false, true);
    wait_for("the write to go through the second path", || {
        ch.poll(&mut |tag, status| done.push((tag, status)));
        !done.is_empty()
    });
    assert_eq!(done, vec![(9, IoStatus::Success)]);
    assert_eq!((t.writes(0), t.writes(1)), (0, 1));
    assert!(read_range(&mut *ch, 0, 4096) == [8; 4096]);
}

#[test]
fn persistent_loss_everywhere_fails_io_and_anatt_bounds_the_wait_for_inaccessible_paths() {
    let t = paths("analoss", 1);
    let mut ch = t.ns.open_channel().unwrap();
    t.set_both(AnaState::PersistentLoss);
    spin(&mut *ch, 130);
    assert_eq!(write_status(&mut *ch, 0, &[1; 4096]), IoStatus::Error(libc::ENOLINK));
    assert_eq!((t.writes(0), t.writes(1)), (0, 0));

    // Inaccessible on both: the write waits ANATT (1 s) from when the host read the state,
    // then fails.
    let set_at = Instant::now();
    t.set_both(AnaState::Inaccessible);
    spin(&mut *ch, 130);
    let status = write_status(&mut *ch, 0, &[2; 4096]);
    assert_eq!(status, IoStatus::Error(libc::EIO));
    assert!(set_at.elapsed() >= Duration::from_secs(1), "failed {:?} after the change", set_at.elapsed());
    assert_eq!((t.writes(0), t.writes(1)), (0, 0));
}

#[test]
fn an_ana_status_from_a_controller_without_ana_reporting_is_retried_on_its_path() {
    let t = paths_reporting("anaoff", None);
    assert!(!t.ns.path_info(&t.ns.paths().list()[0]).ana_reporting);
    let mut ch = t.ns.open_channel().unwrap();
    spin(&mut *ch, 130);
    {
        let mut d = t.devs[0].lock();
        d.io_status = AnaState::Inaccessible.io_status();
        d.io_status_times = 2;
    }
    write_range(&mut *ch, 0, &[1; 4096]);
    assert_eq!((t.writes(0), t.writes(1)), (3, 0), "two refusals, then served on the same path");
    assert_eq!(t.devs[0].lock().ana_reads, 0, "no ANA page read");
    assert_eq!(t.shown(0), AnaState::Optimized);
}
