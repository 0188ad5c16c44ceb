//! The I/O queue pair of the TCP transport: [`TcpQueue`] as a reactor's [`IoQueue`]. The
//! opcode says the data's direction (Base 3, Figure 83); the rest is the queue's.

use fp_bdev::{Iovecs, SubmitError};
use fp_nvme_spec::{Cqe, Sqe, Status};

use super::queue::{direction, TcpQueue};
use crate::transport::{IoQueue, QueueStats};
use crate::NvmeError;

impl IoQueue for TcpQueue {
    fn qid(&self) -> u16 {
        self.params().qid
    }

    fn submit(&mut self, sqe: &Sqe, iov: Iovecs, tag: u32) -> Result<(), SubmitError> {
        self.attach();
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
        self.receive(&mut |tag: u32, cqe: &Cqe| out.push((tag, cqe.status)))
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
