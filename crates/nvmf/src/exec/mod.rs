//! The transport-neutral command executor: namespace I/O from a submission queue entry (Read,
//! Write, Flush, Write Zeroes, Dataset Management; FUA as a flush after the write) in `io`, the
//! admin queue's commands through the [`crate::Controller`] in `admin`.

use std::sync::Arc;
use std::time::Instant;

use fp_bdev::disk::DiskIo;
use fp_bdev::{IoOp, IoRequest, IoStatus, SubmitError};
use fp_nvme_spec::*;

use crate::controller::AdminResult;
use crate::subsystem::{Namespace, NsCounters};
use crate::tcp::qpair::QpairPoller;

mod admin;
mod io;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Free,
    /// An R2T is out (or queued); the host's H2CData fills the buffer.
    AwaitData,
    /// Its R2T waits for a large buffer to receive the data into.
    AwaitBuffer,
    /// Ready to start (its data, if any, is here).
    Ready,
    /// Requests in flight on a channel.
    Submitted,
    /// A FUA write completed; its flush is in flight.
    Flushing,
    /// An Asynchronous Event Request waiting for an event.
    Parked,
    /// Its PDUs are queued.
    Sending,
}

/// A namespace as this queue uses it: its channel and counters.
pub(crate) struct NsChan {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) chan: DiskIo,
    pub(crate) counters: Arc<NsCounters>,
    pub(crate) in_flight: u32,
    /// Detached: new commands get Invalid Namespace; dropped once `in_flight` is 0.
    pub(crate) removed: bool,
}
