//! A queue pair's sending side: every queued PDU (R2Ts, C2HData with the bdev's buffer,
//! responses, a term request last) in vectored writes, and what a slot does once its PDUs are
//! out.

use super::*;

/// Sends what the socket (or the queue's TLS session) takes now; `Ok(0)` when it is full.
fn send(tls: &mut Option<TlsStream>, fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    let sent = match tls {
        Some(t) => t.send_vectored(fd, bufs),
        None => fp_sys::send_vectored_nonblocking(fd, bufs),
    };
    match sent {
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(0),
        r => r,
    }
}

impl QpairPoller {
    /// Sends queued PDUs; true when it sent anything.
    pub(super) fn send(&mut self) -> bool {
        if self.uring.is_some() {
            return self.send_uring();
        }
        let mut moved = false;
        if self.tls.is_some() && self.flush_tls() {
            return true;
        }
        self.tx.set_blocked(false);
        while !self.tx.is_empty() && !self.life.is_broken() {
            let (slots, fd, tls) = (&self.slots, self.fd.as_fd(), &mut self.tls);
            match self.tx.write(|i| slots[i as usize].pieces(), |iov| send(tls, fd, iov)) {
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
        self.send_term();
        if let Some(t) = &self.tls {
            self.tls_stalled = t.has_unsent();
        }
        self.note_blocked(moved);
        moved
    }

    /// Sends the TLS ciphertext still waiting for the socket (the session took the PDUs'
    /// plaintext already), even when no PDU is queued. True when the socket failed (the queue
    /// is failing).
    fn flush_tls(&mut self) -> bool {
        let Some(t) = &mut self.tls else { return false };
        if !t.has_unsent() || self.life.is_broken() {
            return false;
        }
        match t.flush(self.fd.as_fd()) {
            Ok(done) => {
                self.tls_stalled = !done;
                false
            }
            Err(e) => {
                self.fail(&format!("sending: {e}"));
                true
            }
        }
    }

    /// Sends the queue's TLS close_notify, best effort, on an orderly close.
    pub(super) fn close_tls(&mut self) {
        if let Some(t) = &mut self.tls {
            if !self.life.is_broken() {
                t.close(self.fd.as_fd());
            }
        }
    }

    /// Sends queued PDUs through the io_uring engine: takes the result of the send in the
    /// kernel, and queues the next (every PDU queued, gathered) for the round's submission.
    fn send_uring(&mut self) -> bool {
        let mut moved = self.reap_sent();
        let Some(u) = self.uring.as_mut() else { return moved };
        if !u.send_in_flight() && !self.tx.is_empty() && !self.life.is_broken() {
            let slots = &self.slots;
            let mut iov = [IoSlice::new(&[]); fp_conn::IOV_PER_WRITE];
            let n = self.tx.gather(|i| slots[i as usize].pieces(), &mut iov);
            moved |= u.queue_send(&iov[..n]);
        }
        let in_flight = u.send_in_flight();
        if in_flight {
            self.send_polls = self.send_polls.saturating_add(1);
        }
        self.tx.set_blocked(in_flight && self.send_polls > SEND_STALL_POLLS);
        if !in_flight {
            self.send_term();
        }
        self.note_blocked(moved);
        moved
    }

    /// Takes the result of the send the kernel finished, if any: the slots whose PDUs it took
    /// whole are done (an R2T's slot may take its H2CData from now on). Called after every
    /// receive too: a host's answer to a PDU (H2CData after an R2T, the next command after a
    /// read's data) completes after the send that carried it, so it never finds that send
    /// unaccounted. True when there was a result.
    pub(super) fn reap_sent(&mut self) -> bool {
        let Some(r) = self.uring.as_mut().and_then(|u| u.take_sent()) else { return false };
        self.send_polls = 0;
        match r {
            Ok(n) => self.tx.took(n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => {
                self.fail(&format!("sending: {e}"));
                return true;
            }
        }
        while let Some(i) = self.tx.pop_sent(|i| self.slots[i as usize].tx_len()) {
            self.sent(i);
        }
        true
    }

    /// The term request goes last, once every PDU before it is out (best effort: the queue
    /// closes after it).
    fn send_term(&mut self) {
        if self.tx.is_empty() && !self.life.is_broken() {
            if let Some((b, n)) = self.term.take() {
                let _ = send(&mut self.tls, self.fd.as_fd(), &[IoSlice::new(&b[..n])]);
            }
        }
    }

    /// Starts (or restarts, after progress) the clock of a host that stopped reading.
    fn note_blocked(&mut self, moved: bool) {
        if self.tx.is_blocked() {
            if moved || self.blocked_since.is_none() {
                self.blocked_since = Some(Instant::now());
            }
        } else {
            self.blocked_since = None;
        }
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
            // The two clocks disagree by a little: look again when `Instant` says it is due.
            self.tick_due_in(due - now);
            return;
        }
        let _ = self.timer.drain();
        // On the timer's own schedule, so the next check finds it expired.
        let every = self.tick_interval();
        let next = if due + every > now { due + every } else { now + every };
        self.next_tick = Some(next);
        self.tick_due_in(next - now);
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
        if let Some(u) = &mut self.uring {
            u.close();
        }
        self.close_tls();
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
