//! A live restore's channel: requests whose chunks are as they need go straight to the base's
//! channel (no allocation, no lock: one atomic load per chunk); the others are parked here, the
//! absent chunks asked of the worker through a lock-free queue, and looked at again at each
//! poll once the worker bumped the generation (or their bound ran out).

use std::sync::Arc;
use std::time::Instant;

use fp_bdev::{BdevInfo, IoChannel, IoOp, IoRequest, IoStatus, SubmitError};

use super::chunks::{Need, Verdict};
use super::shared::{Shared, PARK_BOUND};

/// A parked request and when it was parked.
struct Parked {
    req: IoRequest,
    since: Instant,
}

pub(super) struct RestoreChannel {
    pub(super) shared: Arc<Shared>,
    pub(super) base: Box<dyn IoChannel>,
    pub(super) info: BdevInfo,
    parked: Vec<Parked>,
    /// Completions made here (a parked request that failed or timed out).
    done_here: Vec<(u32, IoStatus)>,
    seen: u64,
    last_look: Instant,
}

/// How often parked requests are looked at even without news (for their time bound).
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

impl RestoreChannel {
    pub(super) fn new(shared: Arc<Shared>, base: Box<dyn IoChannel>, info: BdevInfo) -> RestoreChannel {
        RestoreChannel {
            shared,
            base,
            info,
            parked: Vec::with_capacity(64),
            done_here: Vec::with_capacity(64),
            seen: 0,
            last_look: Instant::now(),
        }
    }

    fn need(op: IoOp) -> Option<Need> {
        match op {
            IoOp::Read => Some(Need::Restored),
            IoOp::Write | IoOp::WriteZeroes | IoOp::Discard => Some(Need::Durable),
            IoOp::Flush => None,
        }
    }

    fn verdict(&self, req: &IoRequest) -> Verdict {
        let Some(need) = Self::need(req.op) else { return Verdict::Go };
        if req.len == 0 || self.shared.is_complete() {
            return Verdict::Go;
        }
        let shared = &self.shared;
        let mut asked = false;
        let v = shared.chunks.verdict(req.offset, req.len, need, &mut |i| {
            shared.ask(i);
            asked = true;
        });
        if asked {
            shared.wake_worker();
        }
        v
    }

    /// Looks at the parked requests again: sends those now free to go, fails those whose chunk
    /// failed or whose bound ran out.
    fn look(&mut self) {
        let now = Instant::now();
        let generation = self.shared.chunks.generation();
        if generation == self.seen && now.duration_since(self.last_look) < LOOK_EVERY {
            return;
        }
        self.seen = generation;
        self.last_look = now;
        let mut i = 0;
        while i < self.parked.len() {
            let req = self.parked[i].req;
            let verdict = self.verdict(&req);
            let status = match verdict {
                Verdict::Go => match self.base.submit(&req) {
                    Ok(()) => None,
                    // The base is full: try again at the next look.
                    Err(SubmitError::Busy) => {
                        i += 1;
                        continue;
                    }
                    Err(SubmitError::Unsupported) => Some(IoStatus::Unsupported),
                    Err(SubmitError::OutOfRange) => Some(IoStatus::Error(libc::EINVAL)),
                },
                Verdict::Fail => Some(IoStatus::Error(libc::EIO)),
                Verdict::Wait if now.duration_since(self.parked[i].since) > PARK_BOUND => {
                    Some(IoStatus::Error(libc::ETIMEDOUT))
                }
                Verdict::Wait => {
                    i += 1;
                    continue;
                }
            };
            if let Some(status) = status {
                self.done_here.push((req.tag, status));
            }
            self.parked.swap_remove(i);
        }
    }
}

impl IoChannel for RestoreChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        match self.verdict(req) {
            Verdict::Go => self.base.submit(req),
            Verdict::Fail => {
                self.done_here.push((req.tag, IoStatus::Error(libc::EIO)));
                Ok(())
            }
            Verdict::Wait => {
                self.parked.push(Parked { req: *req, since: Instant::now() });
                Ok(())
            }
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        if !self.parked.is_empty() {
            self.look();
        }
        let mine = self.done_here.len();
        for (tag, status) in self.done_here.drain(..) {
            done(tag, status);
        }
        mine + self.base.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.base.in_flight() + self.parked.len() + self.done_here.len()
    }
}
