//! `fp-loadgen`: a block I/O load generator that drives a vhost-user-blk device through
//! libblkio (the pure-Rust `blkio` crate), independently of flashpath's own code.
//!
//! One client thread owns the libblkio instance and all of its queues. It keeps every queue at
//! the requested depth: each completion is accounted for and immediately replaced by a new
//! request in the same slot, so the per-I/O work is a clock read shared by a batch of
//! completions, a few arithmetic operations to pick the next offset, one histogram increment and
//! libblkio's own enqueue. Buffers live in one region of memory shared with the device, allocated
//! and mapped once ([`fp_virtq::driver::SharedMem`], reached through bounds-checked views);
//! latencies go to a preallocated log-bucket [`Histogram`]. Nothing is allocated per I/O.
//!
//! Two completion modes, as libblkio offers them:
//! * **completion-fd queues** (`poll_queues = false`): the thread sleeps in `poll` on the
//!   queues' completion eventfds when no completion is ready, like an interrupt-driven guest;
//! * **poll queues** (`poll_queues = true`): the thread busy-polls the used rings and never
//!   sleeps, like a polled-mode guest driver.
//!
//! With [`LoadSpec::packed`] the same loop drives **packed virtqueues** instead: libblkio 0.5.1
//! never negotiates `VIRTIO_F_RING_PACKED`, so that mode uses the `virtio-driver` crate
//! (libblkio's own virtio layer) directly, with the same buffers, accounting and output.
//!
//! With [`LoadSpec::frontend`] it drives split rings through a vhost-user frontend of its own
//! (the `vhost` crate for the messages), which can also run with **dirty logging** on as QEMU
//! does during a migration ([`LoadSpec::dirty_log`]): a memfd log, used rings logged, a thread
//! that scans and clears the log every 100 ms, and a [`DirtyLogReport`] of the pages it saw.
//!
//! Use [`run`] with a [`LoadSpec`] to get a [`LoadResult`]; the `fp-load` binary wraps it.
//!
//! **Several disks** ([`run_multi`] with a [`MultiSpec`]; `fp-load --disk ...`): each disk has
//! its own socket, pattern, block size, depth, queues and request count, and its own
//! accounting; all run for the same time. By default one client thread drives them all in one
//! loop (one pass over every disk's queues, one `poll` over all their completion fds), as
//! one vCPU driving many virtual disks would; with [`MultiSpec::thread_per_disk`] each disk
//! has its own pinned thread, and the threads start together once every disk is connected.
//! The [`MultiResult`] has each disk's [`LoadResult`] and their total. Every disk runs through
//! the same client (libblkio, or fp-load's own frontend, over huge pages or not): the disks
//! must agree on [`LoadSpec::frontend`] and [`LoadSpec::hugetlb`].
//!
//! With [`LoadSpec::verify`] every write is stamped and every read of a block written earlier
//! in the run is checked against that block's last completed write ([`VerifyReport`]).
//!
//! With [`LoadSpec::timeline`] each disk also counts its completions per interval from the
//! start ([`Timeline`]): the delivered rate second by second, to check a rate limit over short
//! windows or watch a burst fall back to its average.

// The ring and memory accesses go through `fp_virtq::driver`; what is left is libblkio's API
// (`engine/libblkio.rs`: its completion buffers and the completion fd it hands out as a number).
#![deny(unsafe_code)]

mod args;
mod client;
mod dirty_log;
mod engine;
mod error;
pub mod hist;
mod multi;
mod result;
pub mod rng;
mod spec;
pub mod timeline;
mod verify;

pub use args::{parse_duration, parse_size};
pub use client::{hold, pin_current_thread, run};
pub use dirty_log::DirtyLogReport;
pub use engine::{PHASE_MEASURED, PHASE_MEASURING};
pub use error::LoadError;
pub use hist::Histogram;
pub use multi::{parse_disk, run_multi, DiskArg, MultiResult, MultiSpec};
pub(crate) use result::Counts;
pub use result::{LoadResult, Wakeups};
pub use spec::{LoadSpec, Pattern, Region};
pub use timeline::Timeline;
pub use verify::VerifyReport;

#[cfg(test)]
mod tests;
