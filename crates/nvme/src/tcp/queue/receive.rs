//! A queue pair's receiving side: PDU headers staged and checked, C2HData's data into the
//! command's buffers (straight from the socket when nothing of it is staged), completions,
//! and R2Ts answered with H2CData from the caller's buffers.

use std::io::{self, IoSliceMut};
use std::os::fd::AsFd;

use fp_bdev::{iov, Iovecs};
use fp_conn::Recv;

use fp_nvme_spec::tcp::{self as pdu, CommonHeader, DataHeader, Layout, CH_LEN, HEADER_ROOM};
use fp_nvme_spec::{Cqe, Status, CQE_LEN};

use super::{protocol, Dir, Rx, TcpQueue};
use crate::NvmeError;

/// Caller buffer ranges one direct receive takes at most (the staging buffer is one more).
const RECV_BATCH: usize = 32;

/// The fields of a PDU header the controller sent, read out of the staging buffer.
enum Pdu {
    Resp(Cqe),
    C2hData(DataHeader),
    R2t(DataHeader),
    TermReq(Option<pdu::TermReq>),
    Other(u8),
}

impl TcpQueue {
    pub(super) fn rx_header(
        &mut self,
        done: &mut impl FnMut(u32, &Cqe),
        count: &mut usize,
    ) -> Result<bool, NvmeError> {
        if !self.stage(CH_LEN)? {
            return Ok(false);
        }
        self.last_ch.copy_from_slice(&self.rx.data()[..CH_LEN]);
        let ch = CommonHeader::parse(&self.last_ch);
        // HPDA 0 was asked: data at any multiple of 4.
        let l = match pdu::check_header(&ch, self.p.digests, 0, u32::MAX) {
            Ok(l) => l,
            Err(e) => {
                return Err(self.violation(e.fes, e.fei, format!("bad PDU header from the controller: {e}")))
            }
        };
        // Header, its digest, and the padding up to the data: all staged (at most 255 + 4).
        let head = if l.data_len > 0 { l.data_offset } else { l.header_len };
        if !self.stage(head)? {
            return Ok(false);
        }
        let hlen = usize::from(ch.hlen);
        let hb = &self.rx.data()[..head];
        if l.header_len > hlen && !pdu::header_digest_ok(&hb[..l.header_len], hlen) {
            return Err(self.violation(pdu::FES_HEADER_DIGEST_ERROR, 0, "header digest mismatch"));
        }
        // The fields, read where they were staged (check_header matched the header's length
        // to its type): no copy of the header of the queue's own.
        let hb = &hb[..hlen];
        let pdu = match ch.pdu_type {
            pdu::PDU_CAPSULE_RESP => {
                Pdu::Resp(Cqe::from_bytes(hb[CH_LEN..CH_LEN + CQE_LEN].try_into().expect("sixteen bytes")))
            }
            pdu::PDU_C2H_DATA => Pdu::C2hData(DataHeader::parse(hb).expect("a data header is 24 bytes")),
            pdu::PDU_R2T => Pdu::R2t(DataHeader::parse(hb).expect("an R2T header is 24 bytes")),
            pdu::PDU_C2H_TERM_REQ => Pdu::TermReq(pdu::TermReq::parse(hb)),
            t => Pdu::Other(t),
        };
        self.rx.consume(head);
        match pdu {
            Pdu::Resp(cqe) => self.complete(cqe, done, count)?,
            Pdu::C2hData(d) => self.c2h_header(&l, d)?,
            Pdu::R2t(d) => self.r2t(d)?,
            Pdu::TermReq(t) => {
                return Err(self.die(protocol(format!("the controller ended the connection: {t:?}"))));
            }
            Pdu::Other(t) => {
                let what = format!("unexpected PDU type {t:#x} from the controller");
                return Err(self.violation(pdu::FES_INVALID_HEADER_FIELD, 0, what));
            }
        }
        Ok(true)
    }

    /// The slot of command `cid`, which the controller named in a PDU: in flight, or the
    /// queue dies.
    fn busy_slot(&mut self, cid: u16, what: &str) -> Result<usize, NvmeError> {
        match self.cids.lookup(cid) {
            Ok((i, _)) => Ok(i),
            Err(e) => Err(self.sequence(format!("{what} names a command not in flight ({e})"))),
        }
    }

    #[inline]
    fn c2h_header(&mut self, l: &Layout, d: DataHeader) -> Result<(), NvmeError> {
        let i = self.busy_slot(d.cccid, "C2HData")?;
        let s = &self.slots[i];
        if s.dir != Dir::FromDevice {
            return Err(self.sequence(format!("C2HData for command {}, which reads no data", d.cccid)));
        }
        if d.offset != s.done || d.length as usize != l.data_len {
            let what = format!(
                "C2HData at {} of {} bytes (PDU data {}) where {} were received",
                d.offset, d.length, l.data_len, s.done
            );
            return Err(self.violation(pdu::FES_DATA_OUT_OF_RANGE, 0, what));
        }
        if u64::from(d.offset) + u64::from(d.length) > u64::from(s.len) {
            let what = format!(
                "C2HData to {} beyond the command's {} bytes",
                u64::from(d.offset) + u64::from(d.length),
                s.len
            );
            return Err(self.violation(pdu::FES_DATA_OUT_OF_RANGE, 0, what));
        }
        let last = l.ch.flags & pdu::FLAG_LAST_PDU != 0;
        let success = l.ch.flags & pdu::FLAG_SUCCESS != 0;
        if success && !last {
            return Err(self.violation(
                pdu::FES_INVALID_HEADER_FIELD,
                1,
                "C2HData with SUCCESS but not LAST_PDU",
            ));
        }
        self.rx_state = Rx::Data {
            cid: d.cccid,
            slot: i as u16,
            offset: d.offset,
            left: d.length,
            crc: 0,
            digest: l.data_digest,
            success,
        };
        Ok(())
    }

    /// Moves C2HData's data into the command's buffers: what is staged by copy, the rest by a
    /// receive straight into them.
    pub(super) fn rx_data(
        &mut self,
        done: &mut impl FnMut(u32, &Cqe),
        count: &mut usize,
    ) -> Result<bool, NvmeError> {
        let Rx::Data { cid, slot: si, mut offset, mut left, mut crc, digest, success } = self.rx_state else {
            unreachable!("rx_data outside data")
        };
        let slot = &self.slots[usize::from(si)];
        let orphan = slot.orphan;
        let staged = self.rx.len().min(left as usize);
        let mut progressed = false;
        if staged > 0 {
            let src = &self.rx.data()[..staged];
            if digest {
                crc = pdu::crc32c_append(crc, src);
            }
            if !orphan {
                // The range was checked against the command's length.
                iov::copy_from_slice(&slot.iov, u64::from(offset), src);
            }
            self.rx.consume(staged);
            if !orphan {
                self.data.copied += staged as u64;
            }
            offset += staged as u32;
            left -= staged as u32;
            progressed = true;
        } else if !orphan && left > 0 && !self.rx_drained {
            // Nothing staged: receive the rest into the buffers, and what follows into staging.
            self.rx.clear();
            let (r, offered) = {
                let mut bufs: [IoSliceMut<'_>; RECV_BATCH + 1] =
                    std::array::from_fn(|_| IoSliceMut::new(&mut []));
                // Views of the command's buffers for the receive's duration only.
                let n = iov::io_slices_mut(
                    &slot.iov,
                    u64::from(offset),
                    u64::from(left),
                    &mut bufs[..RECV_BATCH],
                );
                bufs[n] = IoSliceMut::new(self.rx.spare_mut());
                let offered: usize = bufs[..=n].iter().map(|b| b.len()).sum();
                let r = match (&mut self.uring, &mut self.tls) {
                    (None, None) => fp_sys::recv_vectored_nonblocking(self.fd.as_fd(), &mut bufs[..=n]),
                    (None, Some(t)) => t.recv_vectored(self.fd.as_fd(), &mut bufs[..=n]),
                    (Some(u), _) => match u.recv_vectored(&mut bufs[..=n]) {
                        Recv::Data(got) => Ok(got),
                        Recv::WouldBlock => Err(io::ErrorKind::WouldBlock.into()),
                        Recv::Eof => Ok(0),
                        Recv::Failed(why) => Err(io::Error::other(why)),
                    },
                };
                (r, offered)
            };
            match r {
                Ok(0) => return Err(self.die(NvmeError::Gone("the controller closed the connection".into()))),
                Ok(got) => {
                    self.rx_drained = got < offered && self.socket_drained();
                    let into_buf = got.min(left as usize);
                    if digest {
                        // The bytes of the command's buffer the receive just wrote.
                        iov::runs(&slot.iov, u64::from(offset), into_buf as u64, |run| {
                            crc = pdu::crc32c_append(crc, run.bytes(&slot.iov));
                        });
                    }
                    self.rx.filled(got - into_buf);
                    self.data.direct += into_buf as u64;
                    offset += into_buf as u32;
                    left -= into_buf as u32;
                    progressed = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => progressed = true,
                Err(e) => return Err(self.die(NvmeError::Gone(format!("receive: {e}")))),
            }
        } else if left > 0 {
            // An orphan's data: through staging, then dropped.
            progressed = self.stage(1)?;
        }
        // What followed our send comes after its result (see `stage`): this receive may have
        // staged the next PDU.
        self.reap_sent()?;
        if left == 0 {
            self.slots[usize::from(si)].done = offset;
            if digest {
                self.rx_state = Rx::Digest { cid, crc, success };
            } else {
                self.rx_state = Rx::Header;
                self.c2h_done(cid, success, done, count)?;
            }
            return Ok(true);
        }
        self.rx_state = Rx::Data { cid, slot: si, offset, left, crc, digest, success };
        Ok(progressed)
    }

    /// A C2HData's data is in: with SUCCESS it stands for a successful completion (TCP
    /// 3.6.2.8).
    pub(super) fn c2h_done(
        &mut self,
        cid: u16,
        success: bool,
        done: &mut impl FnMut(u32, &Cqe),
        count: &mut usize,
    ) -> Result<(), NvmeError> {
        if success {
            self.complete(Cqe::new(cid, Status::SUCCESS), done, count)?;
        }
        Ok(())
    }

    /// A completion (a response capsule, or a C2HData with SUCCESS).
    #[inline]
    fn complete(
        &mut self,
        cqe: Cqe,
        done: &mut impl FnMut(u32, &Cqe),
        count: &mut usize,
    ) -> Result<(), NvmeError> {
        let i = self.busy_slot(cqe.cid, "a completion")?;
        let s = &self.slots[i];
        if s.tx_pending > 0 {
            return Err(self.sequence(format!("completion of command {} before its data was sent", cqe.cid)));
        }
        if self.p.strict_reads
            && s.dir == Dir::FromDevice
            && cqe.status.is_success()
            && s.done != s.len
            && !s.short_ok
        {
            return Err(self.die(protocol(format!(
                "read {} completed with {} of its {} bytes",
                cqe.cid, s.done, s.len
            ))));
        }
        let orphan = s.orphan;
        let tag = self.cids.complete(cqe.cid).expect("looked up above");
        self.release(i);
        self.stats.completed += 1;
        if !orphan {
            *count += 1;
            done(tag, &cqe);
        }
        Ok(())
    }

    pub(super) fn release(&mut self, i: usize) {
        let s = &mut self.slots[i];
        s.orphan = false;
        s.iov = Iovecs::NONE;
    }

    /// An R2T: queue H2CData PDUs for the range it asks, from the caller's buffers.
    fn r2t(&mut self, d: DataHeader) -> Result<(), NvmeError> {
        let i = self.busy_slot(d.cccid, "R2T")?;
        let s = &self.slots[i];
        if s.dir != Dir::ToDevice || s.len <= self.p.icd {
            return Err(self.sequence(format!("R2T for command {}, which sends no data by R2T", d.cccid)));
        }
        // One R2T outstanding per command (MAXR2T 0): the next one comes after the data of the
        // last, in order, and within the command.
        let end = u64::from(d.offset) + u64::from(d.length);
        if s.tx_pending > 0 || d.offset != s.done || d.length == 0 || end > u64::from(s.len) {
            let what = format!(
                "R2T for {} bytes at {} of command {} ({} bytes, {} asked before)",
                d.length, d.offset, d.cccid, s.len, s.done
            );
            return Err(self.violation(pdu::FES_DATA_OUT_OF_RANGE, 0, what));
        }
        self.slots[i].done = end as u32;
        let mut off = d.offset;
        let chunk = self.p.maxh2cdata;
        while u64::from(off) < end {
            let n = chunk.min((end - u64::from(off)) as u32);
            let last = u64::from(off + n) == end;
            let dh = DataHeader { cccid: d.cccid, ttag: d.ttag, offset: off, length: n };
            let mut b = [0u8; HEADER_ROOM];
            let hl = pdu::write_h2c_data(&mut b, &dh, last, self.p.digests, self.p.cpda);
            self.push_arena(&b[..hl]);
            self.push_data(i as u16, off as usize, n as usize);
            off += n;
        }
        Ok(())
    }
}
