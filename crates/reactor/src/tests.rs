//! Several reactors stepped deterministically on one thread.

use super::*;
use std::any::Any;
use std::cell::RefCell;
use std::os::unix::io::RawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Counts down `work` units, one per poll, then idles; optionally finishes.
struct Countdown {
    work: Rc<RefCell<u32>>,
    finish_when_done: bool,
}

impl Poller for Countdown {
    fn poll(&mut self) -> PollStatus {
        let mut w = self.work.borrow_mut();
        if *w > 0 {
            *w -= 1;
            PollStatus::Busy
        } else if self.finish_when_done {
            PollStatus::Finished
        } else {
            PollStatus::Idle
        }
    }
}

fn reactor(id: usize) -> Reactor {
    Reactor::new(id, None, ReactorConfig { idle_window: Duration::from_millis(1) }).unwrap()
}

#[test]
fn messages_hop_between_reactors_in_order() {
    let mut a = reactor(0);
    let mut b = reactor(1);
    let hb = b.handle();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Reactor A forwards a message to B, which replies to A; step them alternately.
    let ha = a.handle();
    let l = log.clone();
    ha.send(move |ra| {
        l.lock().unwrap().push(format!("a{}", ra.id()));
        let l2 = l.clone();
        let back = ra.handle();
        hb.send(move |rb| {
            l2.lock().unwrap().push(format!("b{}", rb.id()));
            let l3 = l2.clone();
            back.send(move |ra| l3.lock().unwrap().push(format!("a{}-again", ra.id())));
        });
    });
    assert!(!b.poll_once(), "b has nothing yet");
    assert!(a.poll_once());
    assert!(b.poll_once());
    assert!(a.poll_once());
    assert!(!a.poll_once());
    assert_eq!(*log.lock().unwrap(), vec!["a0", "b1", "a0-again"]);
    assert_eq!(a.stats().snapshot().messages, 2);
    assert_eq!(b.stats().snapshot().messages, 1);
}

#[test]
fn busy_and_idle_rounds_are_counted_and_finished_pollers_dropped() {
    let mut r = reactor(0);
    let work = Rc::new(RefCell::new(3));
    r.add_poller(Box::new(Countdown { work: work.clone(), finish_when_done: true }));
    assert_eq!(r.poller_count(), 1);
    for _ in 0..3 {
        assert!(r.poll_once());
    }
    assert!(r.poll_once(), "finishing counts as work");
    assert_eq!(r.poller_count(), 0);
    assert!(!r.poll_once());
    let s = r.stats().snapshot();
    assert_eq!(s.rounds, 5);
    assert!(s.idle_ns > 0 || s.busy_ns > 0);
}

#[test]
fn poller_mut_downcasts_and_remove_returns_it() {
    let mut r = reactor(0);
    let work = Rc::new(RefCell::new(0));
    let id = r.add_poller(Box::new(Countdown { work: work.clone(), finish_when_done: false }));
    r.poller_mut::<Countdown>(id).unwrap().finish_when_done = true;
    let p = r.remove_poller(id).unwrap();
    let any: Box<dyn Any> = p;
    assert!(any.downcast::<Countdown>().unwrap().finish_when_done);
    assert!(r.remove_poller(id).is_none());
}

/// A poller with a wake-up fd, like a virtqueue's kick eventfd.
struct Kicked {
    fd: EventFd,
    armed: Rc<RefCell<u32>>,
}

impl Poller for Kicked {
    fn poll(&mut self) -> PollStatus {
        PollStatus::Idle
    }
    fn prepare_sleep(&mut self) -> bool {
        *self.armed.borrow_mut() += 1;
        true
    }
    fn after_wake(&mut self) {
        let _ = self.fd.read();
    }
    fn wake_fds(&self) -> Vec<RawFd> {
        vec![std::os::unix::io::AsRawFd::as_raw_fd(&self.fd)]
    }
}

#[test]
fn sleeps_only_after_the_idle_window_and_wakes_on_a_kick() {
    let mut r = reactor(0);
    let armed = Rc::new(RefCell::new(0));
    let fd = EventFd::new(EFD_NONBLOCK).unwrap();
    let kick = fd.try_clone().unwrap();
    r.add_poller(Box::new(Kicked { fd, armed: armed.clone() }));
    r.poll_once();
    r.last_work = fp_sys::clock::ticks();
    r.poll_once();
    assert!(!r.may_sleep(), "inside the idle window");
    std::thread::sleep(Duration::from_millis(2));
    r.poll_once();
    assert!(r.may_sleep());
    kick.write(1).unwrap();
    // The kick is already pending, so epoll returns at once.
    assert!(r.sleep(Some(Duration::from_secs(5))));
    assert_eq!(*armed.borrow(), 1);
    assert_eq!(r.stats().snapshot().sleeps, 1);
    // after_wake drained the eventfd.
    assert!(kick.read().is_err());
}

/// Idles, asking for its own idle window.
struct Windowed(Option<Duration>);

impl Poller for Windowed {
    fn poll(&mut self) -> PollStatus {
        PollStatus::Idle
    }
    fn idle_window(&self) -> Option<Duration> {
        self.0
    }
}

#[test]
fn the_idle_window_is_the_longest_its_pollers_want_and_at_most_the_configured_one() {
    let mut r = Reactor::new(0, None, ReactorConfig { idle_window: Duration::from_secs(3600) }).unwrap();
    r.add_poller(Box::new(Windowed(Some(Duration::ZERO))));
    r.last_work = fp_sys::clock::ticks();
    r.poll_once();
    assert!(r.may_sleep(), "its only poller wants no window");
    r.add_poller(Box::new(Windowed(Some(Duration::from_millis(2)))));
    r.last_work = fp_sys::clock::ticks();
    r.poll_once();
    assert!(!r.may_sleep(), "the longer window wins");
    std::thread::sleep(Duration::from_millis(3));
    r.poll_once();
    assert!(r.may_sleep());
    r.add_poller(Box::new(Windowed(None)));
    r.last_work = fp_sys::clock::ticks();
    std::thread::sleep(Duration::from_millis(3));
    r.poll_once();
    assert!(!r.may_sleep(), "a poller without a wish keeps the configured hour");
    let mut capped = Reactor::new(1, None, ReactorConfig { idle_window: Duration::ZERO }).unwrap();
    capped.add_poller(Box::new(Windowed(Some(Duration::from_secs(3600)))));
    capped.poll_once();
    assert!(capped.may_sleep(), "never longer than the configured window");
}

#[test]
fn a_wake_up_left_by_a_message_taken_while_polling_ends_one_sleep_only() {
    let mut r = reactor(0);
    r.handle().send(|_| {});
    assert!(r.poll_once(), "the message runs");
    // Its wake-up count is still there: the next sleep returns at once and takes it...
    let start = Instant::now();
    assert!(r.sleep(Some(Duration::from_secs(5))));
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    // ...so the one after that sleeps its whole timeout.
    let start = Instant::now();
    r.sleep(Some(Duration::from_millis(50)));
    assert!(start.elapsed() >= Duration::from_millis(50), "{:?}", start.elapsed());
}

#[test]
fn a_message_wakes_a_sleeping_reactor_thread() {
    let set = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let h = set.handles()[0].clone();
    // Let it go to sleep.
    std::thread::sleep(Duration::from_millis(50));
    let asleep = h.stats().snapshot();
    assert!(asleep.sleeps >= 1 && asleep.sleeping);
    // The sleep still in progress already counts.
    assert!(asleep.sleep_ns >= 20_000_000, "{asleep:?}");
    let got = h.call(|r| r.id() + 41).unwrap();
    assert_eq!(got, 41);
    set.shutdown();
}

#[test]
fn a_call_to_a_reactor_that_does_not_answer_ends_at_its_bound() {
    // Nothing steps this reactor until the call has given up: the wait is held, not raced.
    let mut r = reactor(0);
    let h = r.handle();
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    let got = h.call_within(Duration::from_millis(1), move |_| {
        flag.store(true, std::sync::atomic::Ordering::SeqCst)
    });
    assert_eq!(got, None, "a call without an answer returns None at its bound");
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    // The message is still delivered if the reactor ever runs again.
    assert!(r.poll_once());
    assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
    // And a reactor that answers gives the result.
    let h2 = h.clone();
    let answer = std::thread::spawn(move || h2.call(|r| r.id() + 7));
    while !answer.is_finished() {
        r.poll_once();
        std::thread::yield_now();
    }
    assert_eq!(answer.join().unwrap(), Some(7));
}

#[test]
fn cpu_lists_parse() {
    assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
    assert_eq!(parse_cpu_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
    assert_eq!(parse_cpu_list("0x5").unwrap(), vec![0, 2]);
    assert!(parse_cpu_list("x").unwrap_err().contains("'x'"));
    assert!(parse_cpu_list("3-1").is_err());
    assert!(parse_cpu_list("0x0").is_err());
}

struct Panics;

impl Poller for Panics {
    fn poll(&mut self) -> PollStatus {
        panic!("a poller bug");
    }
}

/// A panic on a reactor thread takes the whole process down (SIGABRT) instead of leaving a
/// dead core behind a live-looking daemon. Runs itself as a child process to observe that.
#[test]
fn a_panicking_poller_aborts_the_process() {
    use std::os::unix::process::ExitStatusExt;
    if std::env::var_os("FP_REACTOR_PANIC_CHILD").is_some() {
        let set = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
        set.handles()[0].send(|r| {
            r.add_poller(Box::new(Panics));
        });
        std::thread::sleep(std::time::Duration::from_secs(20));
        // Only reached if the panic did not abort.
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tests::a_panicking_poller_aborts_the_process", "--nocapture", "--test-threads=1"])
        .env("FP_REACTOR_PANIC_CHILD", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "child ended with {:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stderr).contains("a poller bug"));
}

/// A backend request the poller's memory is lent to: held until `release` is set, then given
/// back at the next poll. Records that a drain asked about it and whether it was dropped while
/// the request was still held.
struct HeldRequest {
    release: Arc<std::sync::atomic::AtomicBool>,
    held: bool,
    drain_asked: Arc<std::sync::atomic::AtomicBool>,
    dropped: Arc<std::sync::Mutex<Option<bool>>>,
}

impl HeldRequest {
    fn new() -> (HeldRequest, Arc<std::sync::atomic::AtomicBool>, Arc<std::sync::Mutex<Option<bool>>>) {
        let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dropped = Arc::new(std::sync::Mutex::new(None));
        let p = HeldRequest {
            release: release.clone(),
            held: true,
            drain_asked: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            dropped: dropped.clone(),
        };
        (p, release, dropped)
    }
}

impl Poller for HeldRequest {
    fn poll(&mut self) -> PollStatus {
        if self.held && self.release.load(std::sync::atomic::Ordering::Acquire) {
            self.held = false;
            return PollStatus::Busy;
        }
        PollStatus::Idle
    }

    fn has_pending(&self) -> bool {
        self.held
    }

    fn held_by_backend(&self) -> usize {
        self.drain_asked.store(true, std::sync::atomic::Ordering::Release);
        usize::from(self.held)
    }
}

impl Drop for HeldRequest {
    fn drop(&mut self) {
        *self.dropped.lock().unwrap() = Some(self.held);
    }
}

#[test]
fn a_drain_polls_until_the_backend_gives_the_request_back() {
    let mut r = reactor(0);
    let (p, release, dropped) = HeldRequest::new();
    r.add_poller(Box::new(p));
    // Given back once the drain has started: a message run by the drain's first round.
    r.handle().send(move |_| release.store(true, std::sync::atomic::Ordering::Release));
    assert_eq!(r.held_by_backends(), 1);
    assert_eq!(r.drain_held(Duration::from_secs(60)), 0);
    assert_eq!(*dropped.lock().unwrap(), None, "the drain drops nothing itself");
}

#[test]
fn a_drain_ends_at_its_bound_with_what_is_still_held() {
    let mut r = reactor(0);
    let (p, _release, _dropped) = HeldRequest::new();
    r.add_poller(Box::new(p));
    let bound = Duration::from_millis(30);
    let started = Instant::now();
    assert_eq!(r.drain_held(bound), 1, "the backend never gave it back");
    let took = started.elapsed();
    assert!(took >= bound && took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn shutdown_waits_for_a_request_a_backend_holds_before_dropping_its_poller() {
    let set = ReactorSet::start(&[0], ReactorConfig::default()).unwrap();
    let (p, release, dropped) = HeldRequest::new();
    let drain_asked = p.drain_asked.clone();
    set.handles()[0].call(move |r| r.add_poller(Box::new(p))).unwrap();
    let shutdown = std::thread::spawn(move || set.shutdown_within(Duration::from_secs(120)));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !drain_asked.load(std::sync::atomic::Ordering::Acquire) {
        assert!(
            dropped.lock().unwrap().is_none(),
            "the poller was dropped without waiting for its held request"
        );
        assert!(Instant::now() < deadline, "the shutdown never asked what backends hold");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(*dropped.lock().unwrap(), None, "dropped while its request is held");
    release.store(true, std::sync::atomic::Ordering::Release);
    shutdown.join().unwrap();
    assert_eq!(*dropped.lock().unwrap(), Some(false), "dropped once the backend gave the request back");
}
