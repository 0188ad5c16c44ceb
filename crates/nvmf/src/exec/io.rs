//! Namespace I/O: a command checked (namespace, range, size, access) and submitted to the
//! namespace's channel; completions reaped, FUA writes followed by a flush, statuses mapped to
//! NVMe's, counters kept.

use super::*;

impl Executor {
    /// The namespace a command names, if attached.
    pub(crate) fn namespace(&self, nsid: u32) -> Option<&NsChan> {
        self.ns.get(nsid as usize).and_then(|n| n.as_ref()).filter(|n| !n.removed)
    }

    /// Checks an I/O command before its data is asked for: namespace, range, size, access.
    pub(crate) fn check_io(&self, sqe: &Sqe) -> Result<(), Status> {
        let op = sqe.opcode();
        if op == OPC_FABRICS {
            return Err(Status::generic(if sqe.fctype() == FCTYPE_CONNECT {
                SC_COMMAND_SEQUENCE_ERROR
            } else {
                SC_INVALID_OPCODE
            }));
        }
        if !matches!(op, NVM_READ | NVM_WRITE | NVM_FLUSH | NVM_WRITE_ZEROES | NVM_DATASET_MANAGEMENT) {
            return Err(Status::generic(SC_INVALID_OPCODE));
        }
        let ns = self.namespace(sqe.nsid()).ok_or(Status::generic(SC_INVALID_NAMESPACE))?;
        if let Some(refusal) = ns.ana_refusal {
            return Err(refusal);
        }
        let info = ns.ns.bdev.info();
        let writes = matches!(op, NVM_WRITE | NVM_WRITE_ZEROES | NVM_DATASET_MANAGEMENT);
        if writes && (ns.ns.read_only || ns.ns.bdev.read_only() || !info.io_types.write) {
            return Err(Status::generic(SC_NAMESPACE_WRITE_PROTECTED));
        }
        if matches!(op, NVM_READ | NVM_WRITE | NVM_WRITE_ZEROES) {
            let nlb = u64::from(sqe.nlb());
            if sqe.slba().checked_add(nlb).is_none_or(|end| end > info.num_blocks()) {
                return Err(Status::generic(SC_LBA_OUT_OF_RANGE));
            }
            if op != NVM_WRITE_ZEROES {
                let len = nlb * u64::from(info.block_size);
                if len > self.max_io as u64 {
                    return Err(Status::generic(SC_INVALID_FIELD));
                }
                if u64::from(sqe.sgl().length()) != len {
                    return Err(Status::generic(SC_SGL_DATA_LENGTH_INVALID));
                }
            }
        }
        if op == NVM_DATASET_MANAGEMENT {
            let ranges = (sqe.cdw(10) & 0xFF) as usize + 1;
            if (sqe.sgl().length() as usize) < ranges * 16 {
                return Err(Status::generic(SC_SGL_DATA_LENGTH_INVALID));
            }
        }
        Ok(())
    }

    pub(crate) fn io_command<T: Transport>(&mut self, t: &mut T, i: u16) -> Result<(), SubmitError> {
        let sqe = t.command(i).sqe;
        // Checked again (a write's before its data request too): the namespace may have gone
        // since.
        if let Err(st) = self.check_io(&sqe) {
            // Off the data path: only commands check_io refuses get here.
            if is_auth(&sqe) {
                self.auth_command(t, i);
                return Ok(());
            }
            self.count_error(sqe.nsid());
            self.complete(t, i, st);
            return Ok(());
        }
        let nsid = sqe.nsid();
        let ns = self.ns[nsid as usize].as_ref().expect("checked");
        let info = ns.ns.bdev.info();
        let bs = u64::from(info.block_size);
        let (offset, len) = (sqe.slba() * bs, u64::from(sqe.nlb()) * bs);
        match sqe.opcode() {
            NVM_READ => {
                if !self.take_buffer(t, i, len as usize) {
                    // Every large buffer is in use: tried again from the ready queue.
                    return Err(SubmitError::Busy);
                }
                t.command(i).len = len as usize;
                self.submit(t, i, nsid, IoOp::Read, offset, len)
            }
            NVM_WRITE if t.command(i).flushed => {
                // A FUA write's flush the channel was too busy for.
                t.command(i).phase = Phase::Flushing;
                self.submit(t, i, nsid, IoOp::Flush, 0, 0)
            }
            NVM_WRITE => self.submit(t, i, nsid, IoOp::Write, offset, len),
            NVM_FLUSH if !info.io_types.flush => {
                self.finish(t, i, Status::SUCCESS);
                Ok(())
            }
            NVM_FLUSH => self.submit(t, i, nsid, IoOp::Flush, 0, 0),
            NVM_WRITE_ZEROES if !info.io_types.write_zeroes => {
                self.complete(t, i, Status::generic(SC_INVALID_OPCODE));
                Ok(())
            }
            NVM_WRITE_ZEROES => self.submit(t, i, nsid, IoOp::WriteZeroes, offset, len),
            NVM_DATASET_MANAGEMENT => self.deallocate(t, i, nsid),
            _ => unreachable!("check_io accepts only these"),
        }
    }

    /// Dataset Management: with the Deallocate attribute, one unmap per range (Base 7.2,
    /// NVM Command Set 3.2.3); without, nothing to do.
    pub(crate) fn deallocate<T: Transport>(
        &mut self,
        t: &mut T,
        i: u16,
        nsid: u32,
    ) -> Result<(), SubmitError> {
        let sqe = t.command(i).sqe;
        let ns = self.ns[nsid as usize].as_ref().expect("checked");
        let info = ns.ns.bdev.info();
        let ranges = (sqe.cdw(10) & 0xFF) + 1;
        if sqe.cdw(11) & (1 << 2) == 0 || !info.io_types.unmap {
            self.finish(t, i, Status::SUCCESS);
            return Ok(());
        }
        let bs = u64::from(info.block_size);
        let blocks = info.num_blocks();
        while t.command(i).next_range < ranges {
            let c = t.command(i);
            let r = c.next_range as usize;
            let b = &c.buf.as_ref().expect("DSM data").bytes()[r * 16..r * 16 + 16];
            let nlb = u64::from(u32::from_le_bytes(b[4..8].try_into().expect("four")));
            let slba = u64::from_le_bytes(b[8..16].try_into().expect("eight"));
            c.next_range += 1;
            if nlb == 0 {
                continue;
            }
            if slba.checked_add(nlb).is_none_or(|e| e > blocks) {
                t.command(i).status = Status::generic(SC_LBA_OUT_OF_RANGE);
                break;
            }
            match self.submit(t, i, nsid, IoOp::Discard, slba * bs, nlb * bs) {
                Ok(()) => {}
                Err(SubmitError::Busy) => {
                    // Tried again: from the ready queue now, or when the ranges in flight end.
                    let c = t.command(i);
                    c.next_range -= 1;
                    if c.pending == 0 {
                        return Err(SubmitError::Busy);
                    }
                    return Ok(());
                }
                // Refused: with nothing in flight `submit` answered the command already; with
                // ranges in flight, they finish it with the status `submit` recorded.
                Err(_) => return Ok(()),
            }
        }
        let c = t.command(i);
        if c.pending == 0 {
            let st = c.status;
            self.finish(t, i, st);
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn submit<T: Transport>(
        &mut self,
        t: &mut T,
        i: u16,
        nsid: u32,
        op: IoOp,
        offset: u64,
        len: u64,
    ) -> Result<(), SubmitError> {
        let data = matches!(op, IoOp::Read | IoOp::Write);
        let s = t.command(i);
        let req = IoRequest {
            tag: u32::from(i),
            op,
            offset,
            len,
            // The slot keeps its buffer, untouched, until this command's completion comes back.
            iov: match (&mut s.buf, data) {
                (Some(b), true) => b.iovecs(len as usize),
                _ => fp_bdev::Iovecs::NONE,
            },
        };
        let ns = self.ns[nsid as usize].as_mut().expect("checked");
        match ns.chan.submit(&req) {
            Ok(()) => {
                ns.in_flight += 1;
                s.pending += 1;
                if s.phase != Phase::Flushing {
                    s.phase = Phase::Submitted;
                }
                Ok(())
            }
            Err(SubmitError::Busy) => Err(SubmitError::Busy),
            Err(e) => {
                let st = match e {
                    SubmitError::OutOfRange => Status::generic(SC_LBA_OUT_OF_RANGE),
                    _ => Status::generic(SC_INVALID_OPCODE),
                };
                if s.pending == 0 {
                    self.count_error(nsid);
                    self.complete(t, i, st);
                } else {
                    s.status = st;
                }
                Err(e)
            }
        }
    }

    pub(crate) fn count_error(&self, nsid: u32) {
        if let Some(Some(n)) = self.ns.get(nsid as usize) {
            NsCounters::bump(&n.counters.errors, 1);
        }
    }

    /// Reaps every channel's completions.
    pub(crate) fn reap<T: Transport>(&mut self, t: &mut T) -> usize {
        let mut done = std::mem::take(&mut self.completions);
        let mut n = 0;
        for (nsid, slot) in self.ns.iter_mut().enumerate() {
            let Some(ns) = slot else { continue };
            if ns.in_flight == 0 {
                continue;
            }
            let got = ns.chan.poll(&mut |tag: u32, st: IoStatus| done.push((nsid as u32, tag, st)));
            ns.in_flight -= got as u32;
            n += got;
        }
        for &(_, tag, st) in &done {
            self.completed(t, tag as u16, st);
        }
        done.clear();
        self.completions = done;
        if n > 0 && self.ns.iter().flatten().any(|n| n.removed && n.in_flight == 0) {
            self.ns_generation = u64::MAX;
        }
        n
    }

    pub(crate) fn completed<T: Transport>(&mut self, t: &mut T, i: u16, st: IoStatus) {
        // Read only on an error (it is not free: the transport's state).
        let closing = st != IoStatus::Success && t.closing();
        let s = t.command(i);
        s.pending -= 1;
        let op = s.sqe.opcode();
        if st != IoStatus::Success && s.status.is_success() {
            s.status = match st {
                IoStatus::Unsupported => Status::generic(SC_INVALID_OPCODE),
                // Given up at a closing queue's bound: as a command that never started there.
                IoStatus::Error(libc::ECANCELED) if closing => Status::generic(SC_ABORTED_SQ_DELETION),
                IoStatus::Error(e) => status_of_errno(e, op),
                IoStatus::Success => Status::SUCCESS,
            };
        }
        if s.pending > 0 {
            return;
        }
        if op == NVM_DATASET_MANAGEMENT && s.status.is_success() {
            let ranges = (s.sqe.cdw(10) & 0xFF) + 1;
            if s.next_range < ranges {
                s.phase = Phase::Ready;
                self.ready.push_back(i);
                return;
            }
        }
        // FUA: the write is durable once the device's cache is flushed.
        let nsid = s.sqe.nsid();
        let flush = self.ns[nsid as usize].as_ref().is_some_and(|n| n.ns.bdev.info().io_types.flush);
        if op == NVM_WRITE && s.status.is_success() && s.sqe.fua() && flush && !s.flushed {
            s.flushed = true;
            s.phase = Phase::Flushing;
            if self.submit(t, i, nsid, IoOp::Flush, 0, 0).is_err() {
                // Busy: the flush is tried again from the ready queue.
                let s = t.command(i);
                if s.pending == 0 && s.phase == Phase::Flushing {
                    s.phase = Phase::Ready;
                    self.ready.push_back(i);
                }
            }
            return;
        }
        let st = t.command(i).status;
        self.finish(t, i, st);
    }

    /// Counts a finished I/O command and queues what answers it.
    pub(crate) fn finish<T: Transport>(&mut self, t: &mut T, i: u16, st: Status) {
        let s = t.command(i);
        let (op, len) = (s.sqe.opcode(), s.len as u64);
        if let Some(Some(n)) = self.ns.get(s.sqe.nsid() as usize) {
            let c = &n.counters;
            if !st.is_success() {
                NsCounters::bump(&c.errors, 1);
            } else if op == NVM_READ {
                NsCounters::bump(&c.read_ops, 1);
                NsCounters::bump(&c.bytes_read, len);
            } else if op == NVM_WRITE {
                NsCounters::bump(&c.write_ops, 1);
                NsCounters::bump(&c.bytes_written, len);
            } else {
                NsCounters::bump(&c.other_ops, 1);
            }
        }
        if op == NVM_READ && st.is_success() && t.send_data(i, len as usize, true) {
            return self.send(t, i);
        }
        self.complete(t, i, st);
    }
}

/// An errno from a bdev as an NVMe status (Base 4.6.1.2).
fn status_of_errno(e: i32, op: u8) -> Status {
    match e {
        libc::EROFS | libc::EPERM | libc::EACCES => Status::generic(SC_NAMESPACE_WRITE_PROTECTED),
        libc::ENOSPC | libc::EDQUOT => Status::generic(SC_CAPACITY_EXCEEDED),
        libc::EINVAL | libc::EOVERFLOW => Status::generic(SC_LBA_OUT_OF_RANGE),
        libc::ENOTSUP => Status::generic(SC_INVALID_OPCODE),
        libc::EIO | libc::EILSEQ | libc::ENODATA if op == NVM_READ => {
            Status::media(SC_UNRECOVERED_READ_ERROR)
        }
        libc::EIO if op == NVM_WRITE || op == NVM_WRITE_ZEROES => Status::media(SC_WRITE_FAULT),
        // A request given up while parked on Busy (its namespace or queue went away): what
        // SPDK answers for the bdev I/O it aborts from a channel's busy (nomem) queue when the
        // channel goes (bdev_channel_destroy; spdk_bdev_io_get_nvme_status maps ABORTED to the
        // generic Command Abort Requested, NVMe Base 2.0 figure 102, 07h).
        libc::ECANCELED => Status::generic(SC_ABORT_REQUESTED),
        libc::EAGAIN | libc::EBUSY | libc::ENOMEM | libc::ETIMEDOUT => {
            Status::generic(SC_TRANSIENT_TRANSPORT_ERROR).retryable()
        }
        _ => Status::generic(SC_INTERNAL_ERROR),
    }
}
