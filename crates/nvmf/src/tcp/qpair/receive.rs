//! A queue pair's receiving side: PDUs out of the socket (many per read), header checks,
//! capsules into slots with their in-capsule data, H2CData straight into the command's buffer
//! after it is checked against its R2T (TCP 3.6.2.7), and term requests for what is refused.

use super::*;

/// One receive into `dst`: through the queue's TLS session, out of the io_uring engine's
/// buffers, or a `recv` system call.
#[inline]
fn recv(
    tls: &mut Option<TlsStream>,
    uring: &mut Option<UringSocket>,
    fd: BorrowedFd<'_>,
    dst: &mut [u8],
) -> Recv {
    if let Some(t) = tls {
        return Recv::from_result(t.recv(fd, dst));
    }
    match uring {
        Some(u) => u.recv(dst),
        None => Recv::from_socket(fd, dst),
    }
}

impl QpairPoller {
    pub(super) fn can_accept(&self) -> bool {
        !self.life.is_closing() && !self.exec.free.is_empty()
    }

    /// A fatal transport error: a C2HTermReq echoing the offending header, then close.
    pub(super) fn terminate(&mut self, err: PduError, header_len: usize) {
        let mut b = [0u8; DATA_HLEN + TERM_REQ_MAX_DATA];
        let hdr = &self.rx.data()[..header_len.min(self.rx.len())];
        let n = write_c2h_term_req(&mut b, &err, hdr);
        self.term = Some((b, n));
        self.life.set_misbehaved(true);
        self.close_after(&format!("{err}: terminated"));
    }

    pub(super) fn receive(&mut self) -> bool {
        self.read = read_round(self, READS_PER_ROUND);
        self.read.moved
    }

    /// The socket failed: nothing more is sent; wait for the channels, then close.
    pub(super) fn fail(&mut self, why: &str) {
        // The kernel lets go of the send's memory before its slots are released.
        if let Some(u) = &mut self.uring {
            u.close();
        }
        self.close_after(why);
        self.life.set_broken();
        self.term = None;
        while let Some(i) = self.tx.drop_front() {
            self.release(i);
        }
    }

    /// Takes the complete PDUs out of the receive buffer. False when it stopped for lack of a
    /// slot (the host sent more commands than its queue holds, or we are slow).
    pub(super) fn take_pdus(&mut self) -> bool {
        loop {
            if self.life.is_closing() {
                return true;
            }
            let avail = self.rx.len();
            if let Some(h) = self.h2c_digest {
                if avail < DIGEST_LEN {
                    return true;
                }
                let d = &self.rx.data()[..DIGEST_LEN];
                let b = self.slots[h.slot as usize].cmd.buf.as_ref().expect("has a buffer");
                let ok = crc32c(&b.bytes()[h.offset..h.offset + h.len]).to_le_bytes() == d;
                self.rx.consume(DIGEST_LEN);
                self.h2c_digest = None;
                if !ok {
                    self.life.set_misbehaved(true);
                    self.close_after("H2CData data digest mismatch");
                    return true;
                }
                self.h2c_finished(h);
                continue;
            }
            if avail < CH_LEN {
                return true;
            }
            let ch = CommonHeader::parse(self.rx.data()[..CH_LEN].try_into().expect("eight"));
            let l = match check_header(&ch, self.wire.digests, 0, self.max_plen) {
                Ok(l) => l,
                Err(e) => {
                    self.terminate(e, usize::from(ch.hlen).clamp(CH_LEN, MAX_HLEN));
                    return true;
                }
            };
            match ch.pdu_type {
                PDU_CAPSULE_CMD => {
                    if l.data_len > self.icd {
                        let e = PduError {
                            fes: FES_DATA_LIMIT_EXCEEDED,
                            fei: 4,
                            what: "in-capsule data over IOCCSZ",
                        };
                        self.terminate(e, l.header_len);
                        return true;
                    }
                    if avail < l.plen() {
                        return true;
                    }
                    if !self.can_accept() {
                        return false;
                    }
                    if !self.header_ok(&l) {
                        return true;
                    }
                    let pdu = &self.rx.data()[..l.plen()];
                    if l.data_digest {
                        let data = &pdu[l.data_offset..l.data_offset + l.data_len];
                        let d = &pdu[l.data_offset + l.data_len..];
                        if crc32c(data).to_le_bytes() != d {
                            self.life.set_misbehaved(true);
                            self.close_after("capsule data digest mismatch");
                            return true;
                        }
                    }
                    let sqe = capsule_sqe(&pdu[..CAPSULE_CMD_HLEN]).expect("a capsule header");
                    let i = self.exec.free.pop().expect("can_accept checked");
                    self.capsule(i, sqe, l.data_offset, l.data_len);
                    self.rx.consume(l.plen());
                }
                PDU_H2C_DATA => {
                    if avail < l.data_offset {
                        return true;
                    }
                    if !self.header_ok(&l) {
                        return true;
                    }
                    let h = DataHeader::parse(self.rx.data()).expect("a data header");
                    let Some(h2c) = self.check_h2c(&h, &l) else { return true };
                    self.rx.consume(l.data_offset);
                    let have = self.rx.len().min(h2c.len);
                    let s = &mut self.slots[h2c.slot as usize];
                    let b = s.cmd.buf.as_mut().expect("a write awaiting data has a buffer");
                    b.bytes_mut()[h2c.offset..h2c.offset + have].copy_from_slice(&self.rx.data()[..have]);
                    s.cmd.received += have;
                    self.rx.consume(have);
                    if have == h2c.len {
                        self.h2c_done(h2c);
                    } else {
                        self.h2c = Some(h2c);
                        return true;
                    }
                }
                PDU_H2C_TERM_REQ => {
                    if avail < l.plen() {
                        return true;
                    }
                    let t = TermReq::parse(self.rx.data()).expect("a term header");
                    self.life.set_misbehaved(true);
                    self.close_after(&format!(
                        "host terminated the connection (FES {:#x}, FEI {})",
                        t.fes, t.fei
                    ));
                    return true;
                }
                _ => {
                    let e = PduError {
                        fes: FES_PDU_SEQUENCE_ERROR,
                        fei: 0,
                        what: "a PDU a host may not send now",
                    };
                    self.terminate(e, l.header_len.min(MAX_HLEN));
                    return true;
                }
            }
        }
    }

    /// Checks the header digest of the PDU at the front of the receive buffer.
    pub(super) fn header_ok(&mut self, l: &Layout) -> bool {
        let hlen = usize::from(l.ch.hlen);
        if l.header_len == hlen || header_digest_ok(&self.rx.data()[..l.header_len], hlen) {
            return true;
        }
        let e = PduError { fes: FES_HEADER_DIGEST_ERROR, fei: 0, what: "header digest mismatch" };
        self.terminate(e, l.header_len);
        false
    }

    /// Checks an H2CData against the R2T it answers (TCP 3.6.2.7): the tag names a command
    /// waiting for data, the offset continues what arrived, the length fits MAXH2CDATA and
    /// the command's transfer.
    pub(super) fn check_h2c(&mut self, h: &DataHeader, l: &Layout) -> Option<H2c> {
        let bad = |fes, fei, what| PduError { fes, fei, what };
        let slot = self.slots.get(h.ttag as usize);
        let err = match slot {
            None => Some(bad(FES_INVALID_HEADER_FIELD, 10, "H2CData with an unknown transfer tag")),
            Some(s) if s.cmd.phase != Phase::AwaitData || !s.r2t_out || s.cmd.sqe.cid() != h.cccid => {
                Some(bad(FES_INVALID_HEADER_FIELD, 8, "H2CData for no R2T outstanding"))
            }
            Some(_) if h.length as usize != l.data_len || h.length == 0 => {
                Some(bad(FES_INVALID_HEADER_FIELD, 16, "H2CData DATAL does not match its PDU"))
            }
            Some(_) if h.length > MAX_H2C_DATA => {
                Some(bad(FES_DATA_LIMIT_EXCEEDED, 16, "H2CData over MAXH2CDATA"))
            }
            Some(s) if h.offset as usize != s.cmd.received => {
                Some(bad(FES_DATA_OUT_OF_RANGE, 12, "H2CData offset out of order"))
            }
            Some(s) if h.offset as usize + h.length as usize > s.cmd.len => {
                Some(bad(FES_DATA_OUT_OF_RANGE, 16, "H2CData past the R2T's length"))
            }
            Some(_) => None,
        };
        if let Some(e) = err {
            self.terminate(e, l.header_len);
            return None;
        }
        Some(H2c { slot: h.ttag, offset: h.offset as usize, len: h.length as usize, digest: l.data_digest })
    }

    /// An H2CData's data is in: its digest next, or done.
    pub(super) fn h2c_done(&mut self, h: H2c) {
        if h.digest {
            self.h2c_digest = Some(h);
        } else {
            self.h2c_finished(h);
        }
    }

    pub(super) fn h2c_finished(&mut self, h: H2c) {
        self.exec.data_received(&mut tcp!(self), h.slot);
    }

    /// A command capsule arrived in slot `i`; its in-capsule data is `rx.data()[data..data +
    /// len]`.
    pub(super) fn capsule(&mut self, i: u16, sqe: Sqe, data: usize, data_len: usize) {
        self.sqhd = (self.sqhd + 1) % self.sq_entries;
        self.slots[i as usize].reset();
        let in_capsule = &self.rx.data()[data..data + data_len];
        self.exec.accept(&mut tcp!(self), i, sqe, in_capsule);
    }
}

/// The receive round's view of the queue: H2CData payloads straight into the command's buffer,
/// PDUs through the receive buffer.
impl Reader for QpairPoller {
    fn closing(&self) -> bool {
        self.life.is_closing()
    }

    fn recv_payload(&mut self) -> Option<Recv> {
        let h = self.h2c?;
        let s = &mut self.slots[h.slot as usize];
        // The offset was checked to continue what arrived: `received` is where we are.
        let (start, end) = (s.cmd.received, h.offset + h.len);
        let dst =
            &mut s.cmd.buf.as_mut().expect("a write awaiting data has a buffer").bytes_mut()[start..end];
        let r = recv(&mut self.tls, &mut self.uring, self.fd.as_fd(), dst);
        if let Recv::Data(n) = r {
            s.cmd.received += n;
            if start + n == end {
                self.reap_sent();
                self.h2c = None;
                self.h2c_done(h);
            }
        }
        Some(r)
    }

    fn parse(&mut self) -> bool {
        self.take_pdus()
    }

    fn receiving(&self) -> bool {
        self.h2c.is_some()
    }

    fn recv_more(&mut self) -> Recv {
        self.rx.compact();
        let (fd, uring, tls) = (self.fd.as_fd(), &mut self.uring, &mut self.tls);
        let r = self.rx.fill(|dst| recv(tls, uring, fd, dst));
        self.reap_sent();
        r
    }

    fn buffered(&self) -> bool {
        !self.rx.is_empty()
    }

    fn drained(&self) -> bool {
        self.rx.last_fill_short()
    }

    fn peer_closed(&mut self, at: PeerClosed) {
        self.life.set_misbehaved(at.misbehaved());
        self.close_after(match at {
            PeerClosed::Clean => "host disconnected",
            PeerClosed::MidHeader => "host disconnected in the middle of a PDU",
            PeerClosed::MidPayload => "host disconnected in the middle of a data PDU",
        });
    }

    fn failed(&mut self, why: String) {
        self.fail(&why);
    }
}
