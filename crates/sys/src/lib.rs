//! flashpath's system calls in one place: safe wrappers over libc.
//!
//! The crates above this one (the registry, the RPC server, the daemon) hold no `unsafe` of
//! their own; what they need from the kernel beyond `std` lives here, one file per topic, each
//! call wrapped so that its preconditions are met inside and its failure is an `io::Error`.
//! Foreign libraries (librbd), guest-memory mappings and io_uring stay with the code that
//! uses them: their safety depends on that code's invariants, not on the call alone.

#![deny(missing_docs)]

mod affinity;
pub mod clock;
mod eventfd;
mod fs;
mod poll;
mod signal;
mod socket;
mod sysinfo;
mod timer;
mod tsc;
pub mod vfio;

pub use affinity::{allowed_cpus, current_cpu, first_allowed_cpu, pin_thread, CPU_SETSIZE};
pub use eventfd::{eventfd, eventfd_clear, eventfd_signal};
pub use fs::{memfd, openat, pipe, rename_noreplace, set_nonblocking, set_umask};
pub use poll::{poll, wait_readable};
pub use signal::{raise, SignalSet};
pub use socket::{
    gather, is_unix_stream, peek_nonblocking, recv_iovecs_nonblocking, recv_nonblocking,
    recv_vectored_nonblocking, recv_with_fds, send_iovecs_nonblocking, send_vectored_nonblocking,
    send_with_fds, set_priority, set_send_buffer, shutdown, MAX_SEND_FDS,
};
pub use sysinfo::total_ram;
pub use timer::Timer;
#[cfg(target_arch = "x86_64")]
pub use tsc::rdtsc;
