//! Synchronous I/O for control threads: one request submitted on a channel and waited for, on
//! the calling thread. For metadata owners and examine code (a raid's superblock and bitmap, an
//! lvstore's pages and copy-on-write copies), which run one request at a time on a thread of
//! their own; never on a reactor, which must not block.
//!
//! Errors are positive errnos, as the callers keep them: an `OutOfRange` refusal is `EINVAL`, an
//! `Unsupported` one (or completion) `EOPNOTSUPP`, a failed completion its own errno.

use std::time::Duration;

use crate::{IoChannel, IoRequest, IoStatus, SubmitError};

/// The errno of a request given up while its channel answered Busy (see [`run`]'s
/// `give_up_busy`). Nothing was sent.
pub const GIVEN_UP: i32 = libc::ECANCELED;

/// The longest one wait for the channel's completion fd lasts: a lost wakeup costs this much,
/// not a hang.
const WAIT_SLICE: Duration = Duration::from_millis(1);

/// Submits `req` on `chan` and waits for its completion.
///
/// A Busy refusal is retried (after a short wait) until `give_up_busy` returns true, which makes
/// the call fail with [`GIVEN_UP`] with nothing sent: a metadata owner whose base stays busy must
/// not be kept from taking up the removal or stop that ends it. Callers with no such event pass
/// `|| false`. The wait for the completion lasts as long as the request does; the channel's own
/// timeouts (a device's, a transport's) bound it.
pub fn run(
    chan: &mut dyn IoChannel,
    req: &IoRequest,
    give_up_busy: &mut dyn FnMut() -> bool,
) -> Result<(), i32> {
    loop {
        match chan.submit(req) {
            Ok(()) => break,
            // Nothing in flight yet: giving up leaves nothing behind on the channel.
            Err(SubmitError::Busy) if give_up_busy() => return Err(GIVEN_UP),
            Err(SubmitError::Busy) => idle(chan),
            Err(SubmitError::OutOfRange) => return Err(libc::EINVAL),
            Err(SubmitError::Unsupported) => return Err(libc::EOPNOTSUPP),
        }
    }
    loop {
        let mut status = None;
        chan.poll(&mut |_, s| status = Some(s));
        match status {
            Some(IoStatus::Success) => return Ok(()),
            Some(IoStatus::Error(e)) => return Err(e),
            Some(IoStatus::Unsupported) => return Err(libc::EOPNOTSUPP),
            None => idle(chan),
        }
    }
}

/// Waits a little for a completion without spinning a core.
fn idle(chan: &mut dyn IoChannel) {
    match chan.completion_fd() {
        Some(fd) if chan.arm_completion_fd() => {
            let _ = fp_sys::wait_readable(&[fd], Some(WAIT_SLICE));
        }
        // Completions are ready already: poll again at once.
        Some(_) => {}
        None => std::thread::yield_now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoOp, Iovecs};

    /// Refuses `busy` submissions as Busy, then completes each request with `status` after
    /// `polls` empty polls.
    struct Scripted {
        busy: u32,
        polls: u32,
        status: IoStatus,
        held: Option<u32>,
        refusal: Option<SubmitError>,
    }

    impl IoChannel for Scripted {
        fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
            if let Some(e) = self.refusal {
                return Err(e);
            }
            if self.busy > 0 {
                self.busy -= 1;
                return Err(SubmitError::Busy);
            }
            self.held = Some(req.tag);
            Ok(())
        }

        fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
            if self.polls > 0 {
                self.polls -= 1;
                return 0;
            }
            match self.held.take() {
                Some(tag) => {
                    done(tag, self.status);
                    1
                }
                None => 0,
            }
        }

        fn in_flight(&self) -> usize {
            usize::from(self.held.is_some())
        }
    }

    fn chan(busy: u32, status: IoStatus) -> Scripted {
        Scripted { busy, polls: 3, status, held: None, refusal: None }
    }

    const FLUSH: IoRequest = IoRequest { tag: 7, op: IoOp::Flush, offset: 0, len: 0, iov: Iovecs::NONE };

    #[test]
    fn busy_is_retried_and_the_completion_waited_for() {
        let mut c = chan(5, IoStatus::Success);
        assert_eq!(run(&mut c, &FLUSH, &mut || false), Ok(()));
        assert_eq!((c.busy, c.polls, c.held), (0, 0, None));
    }

    #[test]
    fn errors_come_back_as_errnos() {
        assert_eq!(run(&mut chan(0, IoStatus::Error(libc::EIO)), &FLUSH, &mut || false), Err(libc::EIO));
        assert_eq!(run(&mut chan(0, IoStatus::Unsupported), &FLUSH, &mut || false), Err(libc::EOPNOTSUPP));
        for (refusal, errno) in
            [(SubmitError::OutOfRange, libc::EINVAL), (SubmitError::Unsupported, libc::EOPNOTSUPP)]
        {
            let mut c = Scripted { refusal: Some(refusal), ..chan(0, IoStatus::Success) };
            assert_eq!(run(&mut c, &FLUSH, &mut || false), Err(errno));
        }
    }

    #[test]
    fn a_busy_channel_is_given_up_when_asked_with_nothing_sent() {
        let mut c = chan(u32::MAX, IoStatus::Success);
        let mut asked = 0;
        let r = run(&mut c, &FLUSH, &mut || {
            asked += 1;
            asked == 3
        });
        assert_eq!(r, Err(GIVEN_UP));
        assert_eq!((asked, c.busy, c.held), (3, u32::MAX - 3, None));
    }
}
