//! The I/O queue pair of the TCP transport: [`TcpQueue`] as a reactor's [`IoQueue`]. The
//! opcode says the data's direction (Base 3, Figure 83); the rest is the queue's.

use fp_bdev::{Iovecs, SubmitError};
use fp_nvme_spec::{Cqe, Sqe, Status};

use super::queue::{direction, TcpQueue, AUTH_TAG};
use crate::transport::{IoQueue, QueueStats};
use crate::NvmeError;

impl TcpQueue {
    /// Advances the queue's re-authentication (see `reauth`), given its command's completion.
    #[cold]
    #[inline(never)]
    fn reauth_step(&mut self, cqe: Option<Cqe>) -> Result<(), NvmeError> {
        let Some(mut r) = self.reauth.take() else { return Ok(()) };
        let result = r.step(self, cqe);
        self.reauth = Some(r);
        result
    }

    /// The queue died with `e`: a re-authentication under way fails with it.
    #[cold]
    #[inline(never)]
    fn reauth_lost(&mut self, e: NvmeError) -> NvmeError {
        let qid = self.params().qid;
        match self.reauth.as_mut() {
            Some(r) => r.lost(qid, e),
            None => e,
        }
    }
}

impl IoQueue for TcpQueue {
    fn qid(&self) -> u16 {
        self.params().qid
    }

    fn submit(&mut self, sqe: &Sqe, iov: Iovecs, tag: u32) -> Result<(), SubmitError> {
        self.attach();
        if self.holding() {
            // Re-authenticating: the channel holds the command and sends it again.
            return Err(SubmitError::Busy);
        }
        self.submit_dir(sqe, iov, direction(sqe.opcode()), tag).map(|_| ())
    }

    fn flush(&mut self) {
        self.attach();
        // A send error kills the queue; the next poll reports it.
        let _ = self.send();
    }

    fn poll(&mut self, out: &mut Vec<(u32, Status)>) -> Result<usize, NvmeError> {
        self.attach();
        if self.uses_uring() {
            // No reactor poller submits for the engine here: arms a receive that ran out of
            // buffers again (an enter only when something is queued).
            fp_conn::uring::flush();
        }
        let due = self.reauth.as_ref().is_some_and(|r| r.due());
        if due {
            self.reauth_step(None)?;
        }
        let mut auth = None;
        let n = self
            .receive(&mut |tag: u32, cqe: &Cqe| {
                if tag == AUTH_TAG {
                    auth = Some(*cqe);
                } else {
                    out.push((tag, cqe.status));
                }
            })
            .map_err(|e| self.reauth_lost(e))?;
        if auth.is_some() {
            self.reauth_step(auth)?;
            return Ok(n - 1);
        }
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        TcpQueue::in_flight(self)
    }

    fn expired(&self, submitted_before: u64, out: &mut Vec<(u16, u32)>) {
        TcpQueue::expired(self, submitted_before, out)
    }

    fn drain(&mut self, out: &mut Vec<u32>) {
        TcpQueue::drain(self, out)
    }

    fn stats(&self) -> QueueStats {
        TcpQueue::stats(self)
    }
}
