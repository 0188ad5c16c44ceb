//! The owner's handle: the thread that runs an [`Owner`], and the control calls other threads
//! send it (each bounded by a wait, answered without the owner when it is busy).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fp_bdev::copy_share::CopyShare;
use fp_bdev::Bdev;
use fp_bdev::Uuid;

use super::{random_uuid, BaseSpec, Member, Owner, OwnerOptions};
use crate::format::{SlotRecord, Superblock};
use crate::meta_io::ChannelIo;
use crate::shared::RaidShared;
use crate::{RaidError, SlotState};

pub(super) type Call = Box<dyn FnOnce(&mut Owner) + Send>;

/// How long a control call waits for the owner (an addition, a removal, the superblock, a
/// stop) before it answers without it: the owner may be retrying a metadata write on a base
/// that answers Busy, which it does for as long as the base does (back-pressure), unless the
/// base is leaving or the raid stopping.
pub const OWNER_WAIT: Duration = Duration::from_secs(5);

/// A call the owner was asked for, after the caller's bound ([`OwnerHandle::call_within`]).
#[derive(Debug)]
pub enum CallWait<R> {
    /// Done: the call's result.
    Answered(R),
    /// Not taken up within the bound (the owner was busy with other metadata I/O): withdrawn,
    /// it will not run.
    Withdrawn,
    /// Under way past the bound: the receiver gets the result when it is done.
    UnderWay(mpsc::Receiver<R>),
}

impl<R> CallWait<R> {
    /// The result, if the call answered within its bound.
    pub fn answered(self) -> Option<R> {
        match self {
            CallWait::Answered(r) => Some(r),
            _ => None,
        }
    }
}

impl StopWait {
    /// The result, if the owner stopped within the bound.
    pub fn stopped(self) -> Option<Result<(), RaidError>> {
        match self {
            StopWait::Stopped(r) => Some(r),
            StopWait::UnderWay(_) => None,
        }
    }
}

/// A removal after its bound ([`OwnerHandle::remove_base`]): the removed base's bdev, or why
/// the owner refused.
pub type RemoveWait = CallWait<Result<Option<Bdev>, RaidError>>;

/// A stop after its bound ([`OwnerHandle::delete`], [`OwnerHandle::shutdown`]).
#[derive(Debug)]
pub enum StopWait {
    /// The owner stopped (its thread ended): whether its last metadata writes succeeded.
    Stopped(Result<(), RaidError>),
    /// Still at its metadata I/O past the bound (a request a base has not answered): the
    /// thread goes on alone, holding what that request uses; the receiver gets its result
    /// when it ends.
    UnderWay(mpsc::Receiver<Result<(), RaidError>>),
}

pub(super) enum Msg {
    Call(Call),
    /// An orderly stop; `delete` also erases the superblocks.
    Stop {
        delete: bool,
        reply: mpsc::SyncSender<Result<(), RaidError>>,
    },
}

/// The handle the raid bdev and the RPC methods hold. Dropping it stops the thread *without*
/// marking the raid clean (as a crash would: the next assembly resyncs); call
/// [`OwnerHandle::shutdown`] or [`OwnerHandle::delete`] for an orderly stop.
pub struct OwnerHandle {
    pub(super) tx: Sender<Msg>,
    pub(super) shared: Arc<RaidShared>,
    thread: Option<JoinHandle<()>>,
}

impl OwnerHandle {
    /// Starts the owner thread of a raid: opens its channels of the bases (by slot, as the
    /// superblock's slots), then [`Owner::start`] (formatting a new raid's bases when
    /// `superblock.seq == 0`), and publishes the first layout before returning. `superblock`:
    /// `None` for a raid without one (the record is then built from `shared` and the bases).
    pub fn spawn(
        shared: Arc<RaidShared>,
        bases: Vec<Option<BaseSpec>>,
        superblock: Option<Superblock>,
        options: OwnerOptions,
    ) -> Result<OwnerHandle, RaidError> {
        let persist = superblock.is_some();
        let sb = match superblock {
            Some(sb) => sb,
            None => in_memory_record(&shared, &bases),
        };
        if sb.slots.len() != bases.len() {
            return Err(RaidError::InvalidParam {
                field: "base_bdevs",
                reason: format!("{} bases for {} slots", bases.len(), sb.slots.len()),
            });
        }
        let (tx, rx) = mpsc::channel::<Msg>();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("raid-{}", sb.name))
            .spawn(move || {
                thread_shared.owner_waker.store(Some(Arc::new(std::thread::current())));
                let opened: Result<Vec<Option<Member>>, RaidError> = bases
                    .into_iter()
                    .map(|b| {
                        b.map(|b| {
                            let io = ChannelIo::open(b.bdev.clone())?
                                .give_up_when_leaving(thread_shared.clone(), b.name.clone());
                            Ok(Member { name: b.name, bdev: Some(b.bdev), io: Box::new(io) })
                        })
                        .transpose()
                    })
                    .collect();
                let mut owner = match opened {
                    Ok(members) => Owner::new(thread_shared, members, sb, persist, options),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                match owner.start() {
                    Ok(()) => {
                        let _ = ready_tx.send(Ok(()));
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                }
                run(owner, rx);
            })
            .map_err(|e| RaidError::Busy(format!("cannot start the raid's owner thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(OwnerHandle { tx, shared, thread: Some(thread) }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(RaidError::Busy("the raid's owner thread died while starting".into()))
            }
        }
    }

    /// Runs `f` on the owner's thread and returns its result, waiting [`OWNER_WAIT`] at most:
    /// past it, a call not taken up is withdrawn and `what` (what was asked, as "the addition
    /// of 'm2'") named in the error; one under way goes on, its result dropped.
    pub fn call<R: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Owner) -> R + Send + 'static,
    ) -> Result<R, RaidError> {
        match self.call_within(OWNER_WAIT, f)? {
            CallWait::Answered(r) => Ok(r),
            CallWait::Withdrawn => Err(self.not_taken_up(what, OWNER_WAIT)),
            CallWait::UnderWay(_) => Err(RaidError::Busy(format!(
                "raid '{}': {what} was still under way after {} s: its owner is writing metadata \
                 to a base that answers Busy",
                self.shared.info.name,
                OWNER_WAIT.as_secs()
            ))),
        }
    }

    /// The error of a call `what` the owner did not take up within `wait`.
    pub fn not_taken_up(&self, what: &str, wait: Duration) -> RaidError {
        RaidError::Busy(format!(
            "raid '{}' did not take up {what} within {} s: its owner is still writing metadata to \
             a base that answers Busy; nothing changed",
            self.shared.info.name,
            wait.as_secs()
        ))
    }

    /// Runs `f` on the owner's thread, waited for `wait` at most. A call the owner has not
    /// taken up by then is withdrawn (it never runs); one it is working on goes on, and the
    /// caller gets the receiver of its result.
    pub fn call_within<R: Send + 'static>(
        &self,
        wait: Duration,
        f: impl FnOnce(&mut Owner) -> R + Send + 'static,
    ) -> Result<CallWait<R>, RaidError> {
        const QUEUED: u8 = 0;
        const STARTED: u8 = 1;
        const WITHDRAWN: u8 = 2;
        let stage = Arc::new(AtomicU8::new(QUEUED));
        let (tx, rx) = mpsc::sync_channel(1);
        let call: Call = {
            let stage = stage.clone();
            Box::new(move |o| {
                if stage.compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    return;
                }
                let _ = tx.send(f(o));
            })
        };
        self.tx.send(Msg::Call(call)).map_err(|_| gone())?;
        self.shared.wake_owner();
        match rx.recv_timeout(wait) {
            Ok(r) => Ok(CallWait::Answered(r)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if stage.compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    Ok(CallWait::Withdrawn)
                } else {
                    Ok(CallWait::UnderWay(rx))
                }
            }
        }
    }

    /// The shared state.
    pub fn shared(&self) -> &Arc<RaidShared> {
        &self.shared
    }

    /// `bdev_raid_add_base_bdev`: the owner opens its channel of `bdev` and adds it (see
    /// [`Owner::add_base`]), waited for `wait` at most (see [`OwnerHandle::call_within`]).
    /// The answer is the slot.
    pub fn add_base(
        &self,
        name: String,
        bdev: Bdev,
        wait: Duration,
    ) -> Result<CallWait<Result<usize, RaidError>>, RaidError> {
        self.call_within(wait, move |o| {
            let io = ChannelIo::open(bdev.clone())?.give_up_when_leaving(o.shared.clone(), name.clone());
            o.add_base(Member { name, bdev: Some(bdev), io: Box::new(io) })
        })
    }

    /// `bdev_raid_remove_base_bdev`: [`Owner::remove_base`] on the owner's thread, waited for
    /// `wait` at most. The answer is the removed base's bdev (to release its claim). A removal
    /// the owner has not taken up by then is withdrawn (nothing changed); one it is working
    /// on goes on, and the caller gets the receiver of its answer.
    ///
    /// The owner's metadata I/O to `name` gives a Busy up meanwhile (see
    /// [`RaidShared::leaving`]), so a base that stays busy cannot hold the owner up; the caller
    /// marks it leaving first, and the owner clears the mark once it has answered.
    pub fn remove_base(&self, name: &str, wait: Duration) -> Result<RemoveWait, RaidError> {
        let call = {
            let name = name.to_string();
            move |o: &mut Owner| {
                let r = o.remove_base(&name).map(|m| m.bdev);
                o.shared.set_leaving(&name, false);
                r
            }
        };
        let r = self.call_within(wait, call);
        if matches!(r, Ok(CallWait::Withdrawn)) {
            self.shared.set_leaving(name, false);
        }
        r
    }

    /// `bdev_raid_set_options`: window, speed limit and share of rebuilds, now and later.
    /// Queued, not waited for: the owner takes it up when it is next free, and nothing here can
    /// fail but the owner being gone.
    pub fn set_process_options(
        &self,
        window_kb: u64,
        max_bandwidth_mb_sec: u64,
        share: CopyShare,
    ) -> Result<(), RaidError> {
        let call: Call =
            Box::new(move |o| o.set_process_options(window_kb << 10, max_bandwidth_mb_sec, share));
        self.tx.send(Msg::Call(call)).map_err(|_| gone())?;
        self.shared.wake_owner();
        Ok(())
    }

    /// The superblock as the owner holds it, waited for [`OWNER_WAIT`] at most (RPCs answer
    /// from the published layout instead: [`RaidShared::layout`]).
    pub fn superblock(&self) -> Result<Superblock, RaidError> {
        self.call("reading its superblock", |o| o.superblock().clone())
    }

    /// An orderly stop after the raid's I/O drained: clean superblocks, thread joined;
    /// waited for `wait` at most (see `OwnerHandle::stop`).
    pub fn shutdown(mut self, wait: Duration) -> Result<StopWait, RaidError> {
        self.stop(false, wait)
    }

    /// `bdev_raid_delete`: an orderly stop that also erases the superblocks; waited for `wait`
    /// at most (see `OwnerHandle::stop`).
    pub fn delete(mut self, wait: Duration) -> Result<StopWait, RaidError> {
        self.stop(true, wait)
    }

    /// Marks the raid stopping (its owner gives a busy base's metadata writes up after
    /// [`crate::shared::STOP_BUSY_GRACE`]), asks the owner to stop and waits `wait` at most.
    /// Past it the thread is left to end alone, never joined here: it may hold a request a
    /// base has not answered, whose buffer must outlive it.
    fn stop(&mut self, delete: bool, wait: Duration) -> Result<StopWait, RaidError> {
        self.shared.set_stopping();
        let (reply, rx) = mpsc::sync_channel(1);
        self.tx.send(Msg::Stop { delete, reply }).map_err(|_| gone())?;
        self.shared.wake_owner();
        match rx.recv_timeout(wait) {
            Ok(r) => {
                if let Some(t) = self.thread.take() {
                    // It answered as it ends: the join is immediate.
                    let _ = t.join();
                }
                Ok(StopWait::Stopped(r))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.thread = None;
                Ok(StopWait::UnderWay(rx))
            }
        }
    }
}

impl Drop for OwnerHandle {
    /// Stops the thread without the clean mark, as a crash would: closing the channel stops it
    /// at its next look, and the raid stopping makes a busy base's metadata writes give up.
    /// Joined for [`OWNER_WAIT`] at most; past it the thread ends alone (it may hold a request
    /// a base has not answered).
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.shared.set_stopping();
            let (tx, _) = mpsc::channel();
            drop(std::mem::replace(&mut self.tx, tx));
            self.shared.wake_owner();
            let deadline = Instant::now() + OWNER_WAIT;
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                log::warn!(
                    "raid '{}': its owner thread did not stop within {} s (a base has not answered its \
                     metadata I/O); it ends on its own once the base answers",
                    self.shared.info.name,
                    OWNER_WAIT.as_secs()
                );
            }
        }
    }
}

fn gone() -> RaidError {
    RaidError::Busy("the raid's owner thread is gone".into())
}

/// The slot record of a raid without a superblock (kept in memory only).
fn in_memory_record(shared: &RaidShared, bases: &[Option<BaseSpec>]) -> Superblock {
    let info = &shared.info;
    Superblock {
        seq: 0,
        raid_uuid: Uuid::NIL,
        name: info.name.clone(),
        level: shared.level,
        strip_size_kb: (shared.strip_bytes >> 10) as u32,
        block_size: info.block_size,
        raid_blocks: info.num_blocks(),
        data_offset: 0,
        bitmap_chunk_bytes: 0,
        bitmap_first_page: 0,
        bitmap_pages: 0,
        clean: true,
        slot: 0,
        slots: bases
            .iter()
            .enumerate()
            .map(|(i, b)| SlotRecord {
                state: if b.is_some() { SlotState::Active } else { SlotState::Empty },
                uuid: if b.is_some() { random_uuid() } else { Uuid::NIL },
                data_bytes: shared.base_data_bytes.get(i).copied().unwrap_or(0),
                rebuild_offset: 0,
                rebuild_partial: false,
            })
            .collect(),
    }
}

/// The owner thread's loop.
fn run(mut owner: Owner, rx: Receiver<Msg>) {
    loop {
        loop {
            match rx.try_recv() {
                Ok(Msg::Call(f)) => f(&mut owner),
                Ok(Msg::Stop { delete, reply }) => {
                    let r = if delete { owner.delete() } else { owner.stop() };
                    let _ = reply.send(r);
                    return;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        owner.tick();
        if !owner.busy() {
            let now = Instant::now();
            let mut park = owner.options.idle_park.min(owner.options.clear_period);
            if let Some(t) = owner.throttled_until {
                park = park.min(t.saturating_duration_since(now));
            }
            std::thread::park_timeout(park);
        }
    }
}
