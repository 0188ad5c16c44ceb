//! Reactors: the polled, per-core event loops that run flashpath's data path.
//!
//! A [`Reactor`] is a plain object: a list of [`Poller`]s, an inbox of messages, and the adaptive
//! polling state. It has no thread of its own; [`Reactor::poll_once`] runs one round. That keeps
//! the scheduling library apart from core placement (as SPDK separates `spdk_thread` from its
//! reactors): [`ReactorSet`] puts one reactor on each listed core, pinned, and loops it; tests
//! step several reactors on one OS thread, deterministically.
//!
//! Rules the data path relies on:
//! * pollers report whether they did work ([`PollStatus`]);
//! * other threads reach a reactor only through [`ReactorHandle::send`], a lock-free queue plus an
//!   eventfd wake-up; the message runs on the reactor with `&mut Reactor`;
//! * a reactor busy-polls while any poller has work pending or did work within the idle window
//!   (but not once every poller is parked), then asks every poller to re-arm its notifications
//!   and sleeps in `epoll_wait` on their fds and its inbox. Both phases are counted in
//!   [`ReactorStats`];
//! * a round polls every poller once, starting one poller further each round, so no poller is
//!   always served first; a poller that opts in ([`Poller::parks_when_idle`]) and stays idle
//!   for a while is parked: not polled until its wake fds fire.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod cpus;
mod poller;
mod reactor;
mod set;
mod stats;

pub use cpus::{parse_cpu_list, parse_cpumask, MAX_CPUMASK_LEN};
pub use poller::{PollStatus, Poller, PollerId};
pub use reactor::{
    Message, Reactor, ReactorConfig, ReactorHandle, CALL_BOUND, DEFAULT_IDLE_WINDOW, DEFAULT_SHUTDOWN_BOUND,
    PARKED_CHECK_INTERVAL, PARKED_CHECK_ROUNDS, PARK_AFTER_IDLE_POLLS,
};
pub use set::ReactorSet;
pub use stats::{mono_ns, ReactorStats, ReactorStatsSnapshot};

/// The system calls the daemon needs beyond `std` (signals, umask, CPU affinity, ...), for
/// crates above this one that keep no `unsafe` of their own.
pub use fp_sys as sys;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod park_tests;
