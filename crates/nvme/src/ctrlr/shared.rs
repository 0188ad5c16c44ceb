//! What a controller's thread, its namespaces and its channels share: the state word every
//! channel reads once per poll round, the message line to the controller thread, and the
//! channels' presence flags and counters.
//!
//! The state word is the controller's generation (bumped whenever the queues the channels hold
//! stop being valid: a reset, a lost connection, a detach) and a few flags. A channel that sees
//! it change takes the slow path: it drains its queue, keeps the drained requests, and asks for
//! a new queue (or fails them, once the controller is given up).
//!
//! Before the controller thread touches the device after bumping the generation (a reset
//! disables it; a new queue may take an old queue's ID), it waits until no channel is inside
//! a poll round that read the old word: each channel raises its presence flag before reading
//! the word and lowers it after its doorbell write (a Dekker handshake, sequentially
//! consistent on both sides). So no doorbell of an old queue is ever written to a re-enabled
//! controller.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, SyncSender};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::transport::{QueueStats, Transport};
use crate::NvmeError;

use super::ana::AnaTable;
use super::identify::ControllerData;
use super::options::{ControllerOptions, GlobalOptions};

/// Flag: the controller is enabled; queues may be made and used.
pub(crate) const ST_ENABLED: u64 = 1;
/// Flag: `fast_io_fail_timeout_sec` passed while reconnecting: held and new I/O fail (EIO).
pub(crate) const ST_FAST_FAIL: u64 = 1 << 1;
/// Flag: the controller is given up (or detached): I/O fails (EIO, or ENODEV with
/// [`ST_GONE`]).
pub(crate) const ST_FAILED: u64 = 1 << 2;
/// Flag: the controller is unreachable (a removed device, CSTS.CFS): failures say ENODEV.
pub(crate) const ST_GONE: u64 = 1 << 3;
/// Flag: a reset or reconnect is under way (or waiting for its next attempt).
pub(crate) const ST_RESETTING: u64 = 1 << 4;
/// Flag: the controller is being detached.
pub(crate) const ST_DELETING: u64 = 1 << 5;
/// The generation sits above the flags.
pub(crate) const GEN_SHIFT: u32 = 8;

/// The generation of a state word.
#[inline]
pub(crate) fn generation(state: u64) -> u64 {
    state >> GEN_SHIFT
}

/// An I/O queue handed to a channel, with the state word it belongs to.
pub(crate) struct IoGrant<T: Transport> {
    pub(crate) queue: T::Io,
    pub(crate) state: u64,
}

/// The reply to a request for an I/O queue.
pub(crate) type GrantReply<T> = SyncSender<Result<IoGrant<T>, NvmeError>>;

/// What channels and handles ask of the controller thread.
pub(crate) enum Msg<T: Transport> {
    /// Make an I/O queue pair (now, or once the controller is back).
    ConnectIo { reply: GrantReply<T> },
    /// A channel closed: its queue (drained) of state word `state`, deleted on the
    /// controller and then dropped (the device stops using its memory before it is freed).
    DisconnectIo { queue: T::Io, state: u64 },
    /// A queue of an older generation, drained, for the controller thread to drop (after the
    /// device stopped using it).
    Retire { queue: T::Io },
    /// A queue died (`poll` failed) under state word `state`: reset, then drop it.
    QueueFailed { state: u64, queue: T::Io, error: NvmeError },
    /// Abort command `cid` of submission queue `sqid` (a timed-out command).
    Abort { state: u64, sqid: u16, cid: u16 },
    /// Reset the controller: a channel's timeout path (`state` = the word it saw; nothing
    /// happens when the generation moved since) or the RPC (`state` none, `reply` some).
    Reset { state: Option<u64>, reply: Option<SyncSender<Result<(), NvmeError>>> },
    /// New DH-HMAC-CHAP keys (`bdev_nvme_set_keys`): the queues authenticate again with them.
    SetKeys {
        key: Option<fp_crypto::dhchap::DhchapSecret>,
        ctrlr_key: Option<fp_crypto::dhchap::DhchapSecret>,
        reply: SyncSender<Result<(), NvmeError>>,
    },
    /// Read the ANA log page again: a channel saw an I/O fail with an ANA path status.
    ReadAna,
    /// Shut down and stop the thread.
    Detach { reply: SyncSender<()> },
}

/// One channel's half the controller thread reads: its presence flag and its counters.
#[derive(Debug, Default)]
pub(crate) struct ChannelShared {
    /// Raised while the channel is in a poll round (see the module docs).
    pub(crate) active: AtomicBool,
    pub(crate) submitted: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) doorbells: AtomicU64,
    pub(crate) bounced: AtomicU64,
}

impl ChannelShared {
    /// Publishes the channel's queue counters (`base` are those of its earlier queues).
    pub(crate) fn publish(&self, s: QueueStats) {
        self.submitted.store(s.submitted, Ordering::Relaxed);
        self.completed.store(s.completed, Ordering::Relaxed);
        self.doorbells.store(s.doorbells, Ordering::Relaxed);
        self.bounced.store(s.bounced, Ordering::Relaxed);
    }

    fn read(&self) -> QueueStats {
        QueueStats {
            submitted: self.submitted.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            doorbells: self.doorbells.load(Ordering::Relaxed),
            bounced: self.bounced.load(Ordering::Relaxed),
        }
    }
}

/// Sums two sets of counters.
pub(crate) fn add_stats(a: QueueStats, b: QueueStats) -> QueueStats {
    QueueStats {
        submitted: a.submitted + b.submitted,
        completed: a.completed + b.completed,
        doorbells: a.doorbells + b.doorbells,
        bounced: a.bounced + b.bounced,
    }
}

/// What the controller thread last learnt, for `info()` and new namespaces.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub(crate) cdata: ControllerData,
    pub(crate) cntlid: u16,
    /// The controller's version register.
    pub(crate) vs: u32,
    /// The transfer limit in bytes for one command.
    pub(crate) max_transfer: u32,
    /// Entries of each I/O queue.
    pub(crate) io_queue_depth: u16,
    /// I/O queue pairs the controller granted.
    pub(crate) max_io_queues: u16,
    /// I/O queue pairs made now.
    pub(crate) io_queues: u16,
    pub(crate) resets: u64,
    pub(crate) reconnect_attempts: u64,
    pub(crate) aborts: u64,
    pub(crate) keep_alives: u64,
    pub(crate) async_events: u64,
    pub(crate) last_error: Option<String>,
}

/// The shared half of one controller.
pub(crate) struct Shared<T: Transport> {
    pub(crate) transport: T,
    /// This controller's identity as a path of its namespaces (unique in the process).
    pub(crate) path_id: u64,
    /// Queues channels handed back after a failure or a reset ([`Shared::hand_back`]) that
    /// the controller thread has not dropped (closed) yet: multipath moves a lost path's
    /// requests elsewhere only once this is 0.
    retiring: AtomicUsize,
    pub(crate) opts: ControllerOptions,
    pub(crate) global: GlobalOptions,
    state: AtomicU64,
    tx: Sender<Msg<T>>,
    channels: Mutex<Vec<Weak<ChannelShared>>>,
    /// Counters of channels closed since.
    closed_stats: Mutex<QueueStats>,
    pub(crate) snapshot: Mutex<Snapshot>,
    /// Its namespaces' ANA states, as the controller thread last read them.
    pub(crate) ana: AnaTable,
}

impl<T: Transport> Shared<T> {
    pub(crate) fn new(
        transport: T,
        opts: ControllerOptions,
        global: GlobalOptions,
        tx: Sender<Msg<T>>,
    ) -> Self {
        static NEXT_PATH: AtomicU64 = AtomicU64::new(1);
        Shared {
            transport,
            path_id: NEXT_PATH.fetch_add(1, Ordering::Relaxed),
            retiring: AtomicUsize::new(0),
            opts,
            global,
            state: AtomicU64::new((1 << GEN_SHIFT) | ST_RESETTING),
            tx,
            channels: Mutex::new(Vec::new()),
            closed_stats: Mutex::new(QueueStats::default()),
            snapshot: Mutex::new(Snapshot::default()),
            ana: AnaTable::default(),
        }
    }

    /// The state word (one load; sequentially consistent for the presence handshake).
    #[inline]
    pub(crate) fn state(&self) -> u64 {
        self.state.load(Ordering::SeqCst)
    }

    /// Sets the flags, keeping the generation (no queue becomes invalid).
    pub(crate) fn set_flags(&self, flags: u64) {
        let g = generation(self.state());
        self.state.store((g << GEN_SHIFT) | flags, Ordering::SeqCst);
    }

    /// Moves to the next generation with `flags` and waits until no channel is inside a poll
    /// round that read an older word: afterwards no old queue is touched by its channel.
    pub(crate) fn bump(&self, flags: u64) -> u64 {
        let g = generation(self.state()) + 1;
        let word = (g << GEN_SHIFT) | flags;
        self.state.store(word, Ordering::SeqCst);
        let channels: Vec<Arc<ChannelShared>> =
            self.lock_channels().iter().filter_map(Weak::upgrade).collect();
        let start = Instant::now();
        for c in channels {
            while c.active.load(Ordering::SeqCst) {
                if start.elapsed() > Duration::from_secs(5) {
                    log::error!("nvme {}: a channel stays inside one poll round for 5 s", self.opts.name);
                    break;
                }
                std::thread::yield_now();
            }
        }
        word
    }

    /// Hands a queue back to the controller thread (`Retire`, `QueueFailed`), counted in
    /// [`Shared::retiring`] until the thread drops it.
    pub(crate) fn hand_back(&self, msg: Msg<T>) {
        self.retiring.fetch_add(1, Ordering::SeqCst);
        if !self.send(msg) {
            // The thread is gone: the message, and the queue in it, was dropped with it.
            self.retiring.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The controller thread dropped a queue handed back.
    pub(crate) fn retired(&self) {
        self.retiring.fetch_sub(1, Ordering::SeqCst);
    }

    /// Queues handed back and not closed yet.
    pub(crate) fn retiring(&self) -> usize {
        self.retiring.load(Ordering::SeqCst)
    }

    /// Sends `msg` to the controller thread; false when it has stopped (the controller is
    /// detached).
    pub(crate) fn send(&self, msg: Msg<T>) -> bool {
        self.tx.send(msg).is_ok()
    }

    fn lock_channels(&self) -> std::sync::MutexGuard<'_, Vec<Weak<ChannelShared>>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a channel's shared half.
    pub(crate) fn add_channel(&self) -> Arc<ChannelShared> {
        let c = Arc::new(ChannelShared::default());
        let mut list = self.lock_channels();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&c));
        c
    }

    /// A channel closes: its counters join the closed ones.
    pub(crate) fn channel_closed(&self, last: QueueStats) {
        let mut c = self.closed_stats.lock().unwrap_or_else(|e| e.into_inner());
        *c = add_stats(*c, last);
    }

    /// The counters of every channel, open and closed, summed.
    pub(crate) fn stats(&self) -> QueueStats {
        let mut sum = *self.closed_stats.lock().unwrap_or_else(|e| e.into_inner());
        for c in self.lock_channels().iter().filter_map(Weak::upgrade) {
            sum = add_stats(sum, c.read());
        }
        sum
    }

    pub(crate) fn snapshot(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }
}
