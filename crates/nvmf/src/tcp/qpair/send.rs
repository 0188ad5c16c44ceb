//! A queue pair's sending side: every queued PDU (R2Ts, C2HData with the bdev's buffer,
//! responses, a term request last) in vectored writes, and what a slot does once its PDUs are
//! out.

use super::*;

/// Sends what the socket takes now; `Ok(0)` when it is full.
fn send(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    match fp_sys::send_vectored_nonblocking(fd, bufs) {
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(0),
        r => r,
    }
}

impl QpairPoller {
    /// Sends queued PDUs; true when it sent anything.
    pub(super) fn send(&mut self) -> bool {
        let mut moved = false;
        self.tx.set_blocked(false);
        while !self.tx.is_empty() && !self.life.is_broken() {
            let (slots, fd) = (&self.slots, self.fd.as_fd());
            match self.tx.write(|i| slots[i as usize].pieces(), |iov| send(fd, iov)) {
                Sent::Bytes(_) => moved = true,
                Sent::Blocked => break,
                Sent::Failed(e) => {
                    self.fail(&format!("sending: {e}"));
                    return true;
                }
            }
            while let Some(i) = self.tx.pop_sent(|i| self.slots[i as usize].tx_len()) {
                self.sent(i);
            }
        }
        if self.tx.is_empty() && !self.life.is_broken() {
            if let Some((b, n)) = self.term.take() {
                let _ = send(self.fd.as_fd(), &[IoSlice::new(&b[..n])]);
            }
        }
        if self.tx.is_blocked() {
            if moved || self.blocked_since.is_none() {
                self.blocked_since = Some(Instant::now());
            }
        } else {
            self.blocked_since = None;
        }
        moved
    }

    /// A slot's PDUs are out: an R2T's slot waits for its data, the others are done.
    pub(super) fn sent(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        if s.cmd.phase == Phase::AwaitData {
            s.r2t_out = true;
            s.hdr_len = 0;
            return;
        }
        self.release(i);
    }

    /// Nothing in flight, nothing waiting to start (see `close_answering`), nothing to send.
    pub(super) fn drained(&self) -> bool {
        !self.exec.in_flight()
            && self.exec.ready.is_empty()
            && self.exec.await_buf.is_empty()
            && (self.life.is_broken() || self.tx.is_empty())
    }

    /// Timers: keep-alive on the admin queue, a host that stopped reading.
    pub(super) fn tick(&mut self, now: Instant) {
        let Some(due) = self.next_tick else { return };
        if now < due {
            return;
        }
        let _ = self.timer.drain();
        // On the timer's own schedule, so the next check finds it expired.
        let every = self.tick_interval();
        self.next_tick = Some(if due + every > now { due + every } else { now + every });
        if let Some(c) = &self.exec.admin {
            if !self.life.is_closing() && c.keep_alive_expired(now) {
                log::warn!("{}: keep-alive timeout expired", self.what());
                self.exec.teardown = true;
                self.close_answering("keep-alive timeout");
            }
        }
        if self.blocked_since.is_some_and(|t| now.duration_since(t) > SEND_TIMEOUT) {
            self.fail("the host stopped reading for 30 s");
        }
    }

    /// The queue is done: unregister; an admin queue takes its controller down (every I/O
    /// queue, on whatever reactor).
    pub(super) fn finish_queue(&mut self) {
        self.life.end(&format!("nvmf: {}", self.what()));
        let _ = fp_sys::shutdown(self.fd.as_fd());
        let io = {
            let mut st = lock(&self.exec.sub.state);
            let cntlid = self.exec.ctrl.cntlid;
            if self.exec.admin.is_some() {
                self.exec.ctrl.gone.store(true, Ordering::Release);
                let io: Vec<(u16, QpairRef)> =
                    st.controllers.remove(&cntlid).map(|e| e.io.into_iter().collect()).unwrap_or_default();
                st.orphans.extend(io.iter().map(|(qid, q)| (cntlid, *qid, q.clone())));
                io.into_iter().map(|(_, q)| q).collect()
            } else {
                if let Some(e) = st.controllers.get_mut(&cntlid) {
                    if e.io.get(&self.wire.qid).is_some_and(|q| Some(q.id) == self.id) {
                        e.io.remove(&self.wire.qid);
                    }
                }
                let me = (cntlid, self.wire.qid, self.id);
                st.orphans.retain(|(c, qid, q)| (*c, *qid, Some(q.id)) != me);
                Vec::new()
            }
        };
        if let Some(c) = &mut self.exec.admin {
            let _ = c.take_parked();
        }
        close_qpairs(&io, "its controller went away");
        for n in self.exec.ns.iter().flatten() {
            if let Some(fd) = n.chan.completion_fd() {
                let _ = self.interest.epoll().ctl(ControlOperation::Delete, fd, EpollEvent::default());
            }
        }
    }
}
