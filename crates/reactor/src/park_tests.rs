//! The round's order and parked pollers, stepped deterministically: counted in rounds and polls,
//! never in time.

use super::*;
use std::cell::{Cell, RefCell};
use std::os::unix::io::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

fn reactor() -> Reactor {
    Reactor::new(0, None, ReactorConfig { idle_window: Duration::from_secs(3600) }).unwrap()
}

/// Always has work, like a queue kept full.
struct Busy;

impl Poller for Busy {
    fn poll(&mut self) -> PollStatus {
        PollStatus::Busy
    }
}

/// Notes its name in the round's log when polled.
struct Named {
    name: u8,
    log: Rc<RefCell<Vec<u8>>>,
}

impl Poller for Named {
    fn poll(&mut self) -> PollStatus {
        self.log.borrow_mut().push(self.name);
        PollStatus::Busy
    }
}

#[test]
fn each_round_starts_one_poller_further() {
    let mut r = reactor();
    let log = Rc::new(RefCell::new(Vec::new()));
    for name in 0..3 {
        r.add_poller(Box::new(Named { name, log: log.clone() }));
    }
    let rounds: Vec<Vec<u8>> = (0..4)
        .map(|_| {
            r.poll_once();
            std::mem::take(&mut *log.borrow_mut())
        })
        .collect();
    assert_eq!(rounds, [vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1], vec![0, 1, 2]]);
}

/// A queue's stand-in: work the test hands it, announced on its eventfd (a kick) once it armed
/// its notifications.
struct Queue {
    kick: EventFd,
    work: Rc<Cell<u32>>,
    polls: Rc<Cell<u32>>,
    armed: Rc<Cell<u32>>,
    /// Work turns up while it arms (`prepare_sleep` returns false) this many more times.
    races: u32,
    parks: bool,
}

impl Poller for Queue {
    fn poll(&mut self) -> PollStatus {
        self.polls.set(self.polls.get() + 1);
        if self.work.get() > 0 {
            self.work.set(self.work.get() - 1);
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }
    fn prepare_sleep(&mut self) -> bool {
        self.armed.set(self.armed.get() + 1);
        let _ = self.kick.read();
        if self.races > 0 {
            self.races -= 1;
            return false;
        }
        true
    }
    fn wake_fds(&self) -> Vec<RawFd> {
        vec![self.kick.as_raw_fd()]
    }
    fn parks_when_idle(&self) -> bool {
        self.parks
    }
}

struct Handles {
    kick: EventFd,
    work: Rc<Cell<u32>>,
    polls: Rc<Cell<u32>>,
    armed: Rc<Cell<u32>>,
}

fn queue(parks: bool, races: u32) -> (Box<Queue>, Handles) {
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let h = Handles {
        kick: kick.try_clone().unwrap(),
        work: Rc::new(Cell::new(0)),
        polls: Rc::new(Cell::new(0)),
        armed: Rc::new(Cell::new(0)),
    };
    let q =
        Queue { kick, work: h.work.clone(), polls: h.polls.clone(), armed: h.armed.clone(), races, parks };
    (Box::new(q), h)
}

/// Gives a parked queue a request and its kick, and runs rounds until it is served: within the
/// parked check's bound, counted in rounds.
fn kick_and_serve(r: &mut Reactor, h: &Handles) {
    h.work.set(1);
    h.kick.write(1).unwrap();
    let mut waited = 0;
    while h.work.get() > 0 {
        assert!(waited < PARKED_CHECK_ROUNDS, "the parked poller's work waited {waited} rounds");
        r.poll_once();
        waited += 1;
    }
}

fn rounds(r: &mut Reactor, n: u32) {
    for _ in 0..n {
        r.poll_once();
    }
}

#[test]
fn an_idle_poller_is_parked_and_polled_again_only_once_its_fd_fires() {
    let mut r = reactor();
    r.add_poller(Box::new(Busy));
    let (q, h) = queue(true, 0);
    let id = r.add_poller(q);
    rounds(&mut r, PARK_AFTER_IDLE_POLLS - 1);
    assert_eq!(r.is_parked(id), Some(false));
    rounds(&mut r, 1);
    assert_eq!(r.is_parked(id), Some(true), "parked after {PARK_AFTER_IDLE_POLLS} idle polls");
    assert_eq!((h.polls.get(), h.armed.get()), (PARK_AFTER_IDLE_POLLS, 1), "its notifications armed");
    // Not polled at all while its fd is quiet, however many checks go by.
    rounds(&mut r, 10 * PARKED_CHECK_ROUNDS);
    assert_eq!(h.polls.get(), PARK_AFTER_IDLE_POLLS);
    let s = r.stats().snapshot();
    assert_eq!((s.parked, s.parks), (1, 1));
    // A request and its kick: served within the check's bound in rounds.
    kick_and_serve(&mut r, &h);
    assert_eq!(r.is_parked(id), Some(false));
    assert_eq!(r.stats().snapshot().parked, 0);
    // Idle again: parked again after as many idle polls.
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.is_parked(id), Some(true));
    assert_eq!(r.stats().snapshot().parks, 2);
}

#[test]
fn a_poller_that_does_not_ask_or_finds_work_while_arming_is_not_parked() {
    let mut r = reactor();
    let (q, never) = queue(false, 0);
    let never_id = r.add_poller(q);
    let (q, racing) = queue(true, 1);
    let racing_id = r.add_poller(q);
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.is_parked(never_id), Some(false));
    assert_eq!(never.armed.get(), 0, "never asked to arm");
    assert_eq!(r.is_parked(racing_id), Some(false), "work turned up while it armed");
    assert_eq!(racing.armed.get(), 1);
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.is_parked(racing_id), Some(true), "the next time it armed cleanly");
    assert_eq!(r.parked_count(), 1);
}

#[test]
fn reaching_a_parked_poller_wakes_it_and_removing_it_takes_it_out_of_the_parked_set() {
    let mut r = reactor();
    let (q, h) = queue(true, 0);
    let id = r.add_poller(q);
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.is_parked(id), Some(true));
    // A message gives it work its fd does not show (a stop): polled in the very next round.
    r.poller_mut::<Queue>(id).unwrap().work.set(1);
    assert_eq!(r.is_parked(id), Some(false));
    r.poll_once();
    assert_eq!(h.work.get(), 0);
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.parked_count(), 1);
    assert!(r.remove_poller(id).is_some());
    assert_eq!((r.parked_count(), r.poller_count()), (0, 0));
    // Its fd firing now reaches nobody.
    h.kick.write(1).unwrap();
    rounds(&mut r, PARKED_CHECK_ROUNDS);
}

#[test]
fn a_sleeping_reactor_wakes_for_a_parked_poller_and_polls_it() {
    let mut r = Reactor::new(0, None, ReactorConfig { idle_window: Duration::ZERO }).unwrap();
    let (q, h) = queue(true, 0);
    let id = r.add_poller(q);
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.is_parked(id), Some(true));
    assert!(r.may_sleep());
    h.work.set(1);
    h.kick.write(1).unwrap();
    // The kick is already there: epoll returns at once (the timeout only bounds a failure).
    assert!(r.sleep(Some(Duration::from_secs(5))));
    assert_eq!(h.armed.get(), 1, "armed once, when parked; not again for the sleep");
    assert_eq!(r.is_parked(id), Some(false), "woken after the sleep");
    r.poll_once();
    assert_eq!(h.work.get(), 0);
}

/// A poller added while another is parked is polled from the next round on, and the parked
/// one is not: parked pollers sit at the end of the list, and a new one must not land behind
/// them (it was never polled, and the parked one was polled in its place and tried to park
/// again, its fd already in the parked set: a second controller's first request got no answer).
#[test]
fn a_poller_added_beside_a_parked_one_is_polled_and_the_parked_one_is_not() {
    let mut r = reactor();
    let (q, parked) = queue(true, 0);
    let parked_id = r.add_poller(q);
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.is_parked(parked_id), Some(true));
    let (q, added) = queue(true, 0);
    let added_id = r.add_poller(q);
    added.work.set(3);
    rounds(&mut r, 3);
    assert_eq!(added.work.get(), 0, "the new poller was not polled");
    assert_eq!(added.polls.get(), 3);
    assert_eq!(parked.polls.get(), PARK_AFTER_IDLE_POLLS, "the parked poller was polled");
    assert_eq!(r.is_parked(added_id), Some(false));
    assert_eq!(r.parked_count(), 1);
    // Both park and wake as before.
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.parked_count(), 2);
    kick_and_serve(&mut r, &parked);
    assert_eq!(r.is_parked(added_id), Some(true));
}

/// `unpark_all` (sent by a mirror job waiting for its source's channels) has every parked
/// poller polled from the next round on, without its fd firing; each parks again once idle.
#[test]
fn unpark_all_polls_parked_pollers_without_their_fds_firing() {
    let mut r = reactor();
    let (q1, h1) = queue(true, 0);
    let (q2, h2) = queue(true, 0);
    let (id1, id2) = (r.add_poller(q1), r.add_poller(q2));
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!((r.is_parked(id1), r.is_parked(id2)), (Some(true), Some(true)));
    r.unpark_all();
    assert_eq!(r.parked_count(), 0);
    rounds(&mut r, 1);
    assert_eq!((h1.polls.get(), h2.polls.get()), (PARK_AFTER_IDLE_POLLS + 1, PARK_AFTER_IDLE_POLLS + 1));
    rounds(&mut r, PARK_AFTER_IDLE_POLLS - 1);
    assert_eq!(r.parked_count(), 2, "parked again once idle as long");
}

/// Once every poller is parked a round polls nothing, and the rest of the idle window would
/// only ask the parked set again and again: the reactor may sleep at once (its window here is
/// an hour). Not while any poller is still polled.
#[test]
fn a_reactor_whose_pollers_are_all_parked_sleeps_without_waiting_out_its_window() {
    let mut r = reactor();
    let (q, h) = queue(true, 0);
    let id = r.add_poller(q);
    // Polled every round, idle: the queue parks beside it.
    let polled = r.add_poller(queue(false, 0).0);
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.is_parked(id), Some(true));
    assert!(!r.may_sleep(), "a polled poller keeps the window");
    assert!(r.remove_poller(polled).is_some());
    assert!(r.may_sleep(), "every poller parked");
    // The sleep ends on the kick; the queue is polled again and waits out the window.
    h.work.set(1);
    h.kick.write(1).unwrap();
    assert!(r.sleep(Some(Duration::from_secs(5))));
    assert_eq!(r.is_parked(id), Some(false));
    r.poll_once();
    assert_eq!(h.work.get(), 0);
    assert!(!r.may_sleep(), "inside the window after work");
}

/// After a sleep the pollers whose fds fired are unparked from what the sleep's own wait
/// returned, without asking the parked set again (a system call per wake-up); the others stay
/// parked.
#[test]
fn a_wake_up_unparks_the_pollers_it_was_for_without_asking_the_parked_set() {
    let mut r = Reactor::new(0, None, ReactorConfig { idle_window: Duration::ZERO }).unwrap();
    let (q1, h1) = queue(true, 0);
    let (q2, _h2) = queue(true, 0);
    let (id1, id2) = (r.add_poller(q1), r.add_poller(q2));
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.parked_count(), 2);
    let asked = r.parked_waits;
    h1.kick.write(1).unwrap();
    assert!(r.sleep(Some(Duration::from_secs(5))));
    assert_eq!((r.is_parked(id1), r.is_parked(id2)), (Some(false), Some(true)));
    assert_eq!(r.parked_waits, asked, "the parked set was asked again after the wake-up");
}

/// More pollers woken at once than one wait returns: the parked set is asked for the rest, and
/// every one of them is polled again.
#[test]
fn a_wake_up_for_more_pollers_than_one_wait_returns_unparks_them_all() {
    let mut r = Reactor::new(0, None, ReactorConfig { idle_window: Duration::ZERO }).unwrap();
    let queues: Vec<_> = (0..crate::reactor::WAKE_EVENTS + 1).map(|_| queue(true, 0)).collect();
    let mut handles = Vec::new();
    for (q, h) in queues {
        handles.push((r.add_poller(q), h));
    }
    rounds(&mut r, PARK_AFTER_IDLE_POLLS);
    assert_eq!(r.parked_count(), crate::reactor::WAKE_EVENTS + 1);
    for (_, h) in &handles {
        h.kick.write(1).unwrap();
    }
    assert!(r.sleep(Some(Duration::from_secs(5))));
    assert_eq!(r.parked_count(), 0);
}
