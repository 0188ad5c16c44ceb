//! An rbd bdev's per-core channel: requests go to librbd as they are submitted, on the
//! caller's iovecs; librbd completes them on its own threads.
//!
//! A completion's callback runs on a librbd thread. It pushes `(slot, return value)` onto the
//! channel's bounded lock-free queue and, when the reactor sleeps on the channel's eventfd
//! (armed), writes it. `poll` drains the queue on the reactor. Nothing here allocates per
//! request; librbd allocates its completion, as it does for every caller.
//!
//! Lifetime: every request in flight holds a strong count of the shared half (taken at
//! submit, given back by the callback as its very last step), so the queue and the eventfd
//! outlive the last callback; dropping the channel waits for its requests, whose buffers
//! librbd may still be using.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use fp_bdev::{BdevError, BdevInfo, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

use crate::image::Image;
use crate::sys::{self, CompletionT, Lib};

/// Requests one channel keeps in flight at most; more are refused `Busy` until some complete.
pub const SLOTS: usize = 1024;

/// What a callback finds through its argument: the channel's shared half and its slot.
struct SlotArg {
    shared: *const Shared,
    slot: u32,
}

/// The half of a channel librbd's threads touch.
struct Shared {
    /// Completed `(slot, librbd's return value)`, at most one per slot in flight.
    done: ArrayQueue<(u32, i32)>,
    /// Set while the reactor may sleep on `eventfd`; callbacks write it only then.
    armed: AtomicBool,
    eventfd: OwnedFd,
    /// One per slot, handed to librbd as the callback argument.
    args: Box<[SlotArg]>,
    lib: &'static Lib,
}

// SAFETY: `args` holds pointers to this same `Shared` (kept alive by the strong count each
// request in flight holds) and plain integers; the rest is Sync by itself.
unsafe impl Send for Shared {}
// SAFETY: as above; callbacks only read `args` and use the queue, flag and eventfd, which are
// made for concurrent use.
unsafe impl Sync for Shared {}

/// librbd's completion callback, on a librbd thread.
///
/// # Safety
/// `arg` is a `SlotArg` of a `Shared` whose strong count the submitting channel raised for this
/// request; `c` is this request's completion.
unsafe extern "C" fn on_complete(c: CompletionT, arg: *mut c_void) {
    // SAFETY: per the function's contract, `arg` points into a live `Shared`'s `args`, and
    // the strong count this request holds keeps that `Shared` alive until the end.
    let (slot_arg, shared) = unsafe {
        let slot_arg = &*(arg as *const SlotArg);
        (slot_arg, &*slot_arg.shared)
    };
    let shared_ptr = slot_arg.shared;
    // SAFETY: `c` is this request's completion, finished (we are its callback); it is
    // released once, here, after its value is read.
    let ret = unsafe {
        let ret = (shared.lib.rbd_aio_get_return_value)(c);
        (shared.lib.rbd_aio_release)(c);
        ret
    };
    let ret = ret.clamp(i32::MIN as isize, i32::MAX as isize) as i32;
    // Cannot be full: it has room for every slot and a slot completes once.
    let _ = shared.done.push((slot_arg.slot, ret));
    // After the push, SeqCst against `arm`'s store-then-check: either the reactor sees the
    // entry before it sleeps, or this sees it armed and wakes it.
    if shared.armed.load(Ordering::SeqCst) {
        // A signal that fails (it cannot on an open eventfd) would only cost the reactor its
        // next timed wake-up.
        let _ = fp_sys::eventfd_signal(shared.eventfd.as_fd());
    }
    // SAFETY: gives back the count taken at submit; nothing of `shared` is used after this.
    unsafe { Arc::decrement_strong_count(shared_ptr) };
}

/// A channel of an rbd bdev.
pub struct RbdChannel {
    info: BdevInfo,
    image: Arc<Image>,
    shared: Arc<Shared>,
    /// The caller's tag of each slot in flight.
    tags: Box<[u32]>,
    /// Slots not in flight.
    free: Vec<u32>,
    /// Requests refused by librbd at submit (or malformed), completed by the next `poll`.
    failed: Vec<(u32, IoStatus)>,
    read_only: bool,
}

impl RbdChannel {
    pub(crate) fn new(info: BdevInfo, image: Arc<Image>, read_only: bool) -> Result<RbdChannel, BdevError> {
        let eventfd =
            fp_sys::eventfd().map_err(|source| BdevError::Open { path: "eventfd".into(), source })?;
        let lib = image.lib;
        let shared = Arc::new_cyclic(|me| Shared {
            done: ArrayQueue::new(SLOTS),
            armed: AtomicBool::new(true),
            eventfd,
            args: (0..SLOTS as u32).map(|slot| SlotArg { shared: me.as_ptr(), slot }).collect(),
            lib,
        });
        Ok(RbdChannel {
            info,
            image,
            shared,
            tags: vec![0; SLOTS].into_boxed_slice(),
            free: (0..SLOTS as u32).rev().collect(),
            failed: Vec::with_capacity(SLOTS),
            read_only,
        })
    }

    fn slots_in_flight(&self) -> usize {
        SLOTS - self.free.len()
    }

    /// Starts `req` in librbd on `slot`; returns librbd's refusal (a negative errno). Its
    /// buffers are vouched for by its `Iovecs`, as for every [`IoChannel::submit`].
    #[inline]
    fn start(&mut self, slot: u32, req: &IoRequest) -> c_int {
        let lib = self.shared.lib;
        let arg = &self.shared.args[slot as usize] as *const SlotArg as *mut c_void;
        let mut c: CompletionT = std::ptr::null_mut();
        // SAFETY: `on_complete` matches librbd's callback type; `arg` stays valid while the
        // request holds its count of `shared`, taken here with the completion that will give it
        // back (its callback may run before the request's call below returns): `shared` is an
        // Arc owned by this channel, so its count is at least 1.
        let ret = unsafe {
            let ret = (lib.rbd_aio_create_completion)(arg, on_complete, &mut c);
            if ret >= 0 {
                Arc::increment_strong_count(Arc::as_ptr(&self.shared));
            }
            ret
        };
        if ret < 0 {
            return ret;
        }
        let image = self.image.handle;
        // SAFETY: `image` is open while `self.image` lives, which outlives every request (drop
        // waits); the request's `Iovecs` vouch for the iovecs and buffers until completion; `c` is
        // the fresh completion, handed to librbd here.
        let ret = unsafe {
            match req.op {
                IoOp::Read => {
                    (lib.rbd_aio_readv)(image, req.iov.as_ptr(), req.iov.count() as c_int, req.offset, c)
                }
                IoOp::Write => {
                    (lib.rbd_aio_writev)(image, req.iov.as_ptr(), req.iov.count() as c_int, req.offset, c)
                }
                IoOp::Flush => (lib.rbd_aio_flush)(image, c),
                IoOp::Discard => (lib.rbd_aio_discard)(image, req.offset, req.len, c),
                IoOp::WriteZeroes => (lib.rbd_aio_write_zeroes)(image, req.offset, req.len as usize, c, 0, 0),
            }
        };
        if ret < 0 {
            // librbd did not take the request: its callback will not run.
            // SAFETY: the completion is ours again and released once; the count taken above
            // is given back, the channel still holding its own.
            unsafe {
                (lib.rbd_aio_release)(c);
                Arc::decrement_strong_count(Arc::as_ptr(&self.shared));
            }
        }
        ret
    }
}

impl IoChannel for RbdChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if req.op != IoOp::Flush {
            self.info.check_range(req.offset, req.len)?;
        }
        let mutates = matches!(req.op, IoOp::Write | IoOp::Discard | IoOp::WriteZeroes);
        if mutates && self.read_only {
            return Err(SubmitError::Unsupported);
        }
        if matches!(req.op, IoOp::Read | IoOp::Write) && req.iov.total_len() != req.len {
            self.failed.push((req.tag, IoStatus::Error(libc::EINVAL)));
            return Ok(());
        }
        let Some(slot) = self.free.pop() else {
            return Err(SubmitError::Busy);
        };
        self.tags[slot as usize] = req.tag;
        let ret = self.start(slot, req);
        if ret < 0 {
            self.free.push(slot);
            log::debug!(
                "rbd bdev {}: librbd refused a {:?}: {}",
                self.info.name,
                req.op,
                sys::errno_text(ret.into())
            );
            self.failed.push((req.tag, IoStatus::Error(-ret)));
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let mut n = 0;
        for (tag, status) in self.failed.drain(..) {
            done(tag, status);
            n += 1;
        }
        while let Some((slot, ret)) = self.shared.done.pop() {
            self.free.push(slot);
            let status = if ret >= 0 { IoStatus::Success } else { IoStatus::Error(-ret) };
            done(self.tags[slot as usize], status);
            n += 1;
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.slots_in_flight() + self.failed.len()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        Some(self.shared.eventfd.as_raw_fd())
    }

    fn disarm_completion_fd(&mut self) {
        self.shared.armed.store(false, Ordering::Relaxed);
    }

    fn arm_completion_fd(&mut self) -> bool {
        // Cleared on every arming, not only after a known signal: a callback preempted
        // between its write and any flag saying so would leave the fd readable, and the
        // reactor waking at once, sleep after sleep (measured: 30 wake-ups per request when
        // librbd's threads share the reactor's core).
        let _ = fp_sys::eventfd_clear(self.shared.eventfd.as_fd());
        self.shared.armed.store(true, Ordering::SeqCst);
        self.shared.done.is_empty() && self.failed.is_empty()
    }

    /// Every request in flight is librbd's, whose callback signals the armed eventfd.
    fn sleeps_in_flight(&self) -> bool {
        true
    }
}

impl Drop for RbdChannel {
    fn drop(&mut self) {
        if self.slots_in_flight() == 0 {
            return;
        }
        log::debug!(
            "rbd bdev {}: channel closed with {} requests in flight; waiting for them",
            self.info.name,
            self.slots_in_flight()
        );
        // librbd may still be reading or writing the callers' buffers. Every request ends,
        // at the latest after rados_osd_op_timeout.
        while self.slots_in_flight() > 0 {
            while let Some((slot, _)) = self.shared.done.pop() {
                self.free.push(slot);
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}
