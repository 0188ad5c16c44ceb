//! A small blocking NVMe/TCP host: ICReq, Connect, fabrics and admin commands, I/O with
//! in-capsule data or R2T and H2CData, C2HData reads, digests on or off. It checks every PDU
//! the target sends (lengths, digests) as it reads it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use fp_nvme_spec::fabrics::CONNECT_DATA_LEN;
use fp_nvme_spec::fabrics::{Connect, CNTLID_DYNAMIC};
use fp_nvme_spec::tcp::*;
use fp_nvme_spec::*;

pub(crate) const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub(crate) const HOSTID: [u8; 16] = [0x11; 16];

/// A PDU as received: its common header, header bytes and data.
#[derive(Debug)]
pub(crate) struct Pdu {
    pub ch: CommonHeader,
    pub header: Vec<u8>,
    pub data: Vec<u8>,
}

pub(crate) struct Host {
    pub s: TcpStream,
    pub digests: Digests,
    pub maxh2c: u32,
    pub cntlid: u16,
    pub qid: u16,
    cid: u16,
    /// In-capsule data the host uses for writes up to this size (else R2T).
    pub icd: usize,
    /// Splits its H2CData PDUs at this many bytes (at most MAXH2CDATA).
    pub h2c_chunk: usize,
}

pub(crate) fn sqe(opcode: u8, cid: u16, nsid: u32) -> Sqe {
    let mut s = Sqe([0; SQE_LEN]);
    s.0[0] = opcode;
    s.0[1] = 0x40;
    s.0[2..4].copy_from_slice(&cid.to_le_bytes());
    s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
    s
}

pub(crate) fn set_sgl(s: &mut Sqe, kind: u8, len: u32) {
    s.0[24..32].fill(0);
    s.0[32..36].copy_from_slice(&len.to_le_bytes());
    s.0[36..39].fill(0);
    s.0[39] = kind;
}

pub(crate) fn set_cdw(s: &mut Sqe, n: usize, v: u32) {
    let at = 40 + (n - 10) * 4;
    s.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// A Connect command (32 entries) and its data.
pub(crate) fn connect_command(
    qid: u16,
    subnqn: &str,
    hostnqn: &str,
    cntlid: u16,
    kato: u32,
) -> (Sqe, [u8; CONNECT_DATA_LEN]) {
    let c = Connect {
        cid: 0,
        qid,
        sq_entries: 32,
        cattr: 0,
        kato_ms: kato,
        hostid: HOSTID,
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: hostnqn.into(),
    };
    let mut s = Sqe([0; SQE_LEN]);
    let mut d = [0u8; CONNECT_DATA_LEN];
    c.write(&mut s, &mut d);
    (s, d)
}

impl Host {
    /// A host on a connected socket, before anything is exchanged.
    pub(crate) fn wrap(s: TcpStream, digests: Digests) -> Host {
        Host { s, digests, maxh2c: 0, cntlid: 0, qid: 0, cid: 0, icd: 4096, h2c_chunk: usize::MAX }
    }

    /// A socket to the target with a tiny receive buffer (set before connecting, so the TCP
    /// window stays small): a host that does not read blocks the target's sends soon.
    pub(crate) fn small_window(port: u16) -> TcpStream {
        use std::os::fd::FromRawFd;
        // SAFETY: plain calls; the descriptor is checked and then owned by the TcpStream.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let size: libc::c_int = 4096;
            let p = (&size as *const libc::c_int).cast();
            let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            assert_eq!(libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, p, len), 0);
            let mut sa: libc::sockaddr_in = std::mem::zeroed();
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_port = port.to_be();
            sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let salen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            assert_eq!(libc::connect(fd, (&sa as *const libc::sockaddr_in).cast(), salen), 0);
            TcpStream::from_raw_fd(fd)
        }
    }

    /// Connects the socket and exchanges ICReq/ICResp.
    pub(crate) fn open(port: u16, digests: Digests) -> Host {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        let mut h = Host::wrap(s, digests);
        let mut b = [0u8; IC_LEN];
        IcReq { pfv: 0, hpda: 0, digests, maxr2t: 0 }.write(&mut b);
        h.s.write_all(&b).unwrap();
        h.s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], PDU_IC_RESP);
        let r = IcResp::parse(&b);
        assert_eq!(r.digests, digests);
        h.maxh2c = r.maxh2cdata;
        h
    }

    /// ICReq then Connect; returns the Connect's completion.
    pub(crate) fn connect_raw(
        port: u16,
        digests: Digests,
        qid: u16,
        subnqn: &str,
        hostnqn: &str,
        cntlid: u16,
        kato: u32,
    ) -> (Host, Cqe) {
        let mut h = Host::open(port, digests);
        let cqe = h.connect(qid, subnqn, hostnqn, cntlid, kato);
        (h, cqe)
    }

    /// A Connect on a host whose ICReq is done; returns its completion.
    pub(crate) fn connect(&mut self, qid: u16, subnqn: &str, hostnqn: &str, cntlid: u16, kato: u32) -> Cqe {
        let (s, d) = connect_command(qid, subnqn, hostnqn, cntlid, kato);
        self.send_capsule(&s, &d);
        let cqe = self.response();
        self.cntlid = cqe.dw0 as u16;
        self.qid = qid;
        cqe
    }

    /// An admin queue of a new controller, enabled.
    pub(crate) fn admin(port: u16, subnqn: &str, kato: u32) -> Host {
        let (mut h, cqe) =
            Host::connect_raw(port, Digests::default(), 0, subnqn, HOSTNQN, CNTLID_DYNAMIC, kato);
        assert!(cqe.status.is_success(), "{cqe:?}");
        h.enable();
        h
    }

    /// I/O queue `qid` of the controller `admin` runs.
    pub(crate) fn io(port: u16, subnqn: &str, cntlid: u16, qid: u16, digests: Digests) -> Host {
        let (h, cqe) = Host::connect_raw(port, digests, qid, subnqn, HOSTNQN, cntlid, 0);
        assert!(cqe.status.is_success(), "{cqe:?}");
        assert_eq!(cqe.dw0 as u16, cntlid);
        h
    }

    pub(crate) fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    pub(crate) fn send_capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        let mut b = [0u8; HEADER_ROOM];
        let n = write_capsule_cmd(&mut b, sqe, data.len(), self.digests, 0);
        let mut out = b[..n].to_vec();
        out.extend_from_slice(data);
        if self.digests.data && !data.is_empty() {
            out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        self.s.write_all(&out).unwrap();
    }

    /// Reads one PDU, checking its layout and digests.
    pub(crate) fn read_pdu(&mut self) -> std::io::Result<Pdu> {
        let mut ch = [0u8; CH_LEN];
        self.s.read_exact(&mut ch)?;
        let c = CommonHeader::parse(&ch);
        let l = check_header(&c, self.digests, 0, 1 << 24)
            .unwrap_or_else(|e| panic!("target sent a bad PDU: {e} {c:?}"));
        let mut rest = vec![0u8; l.plen() - CH_LEN];
        self.s.read_exact(&mut rest)?;
        let mut all = ch.to_vec();
        all.extend_from_slice(&rest);
        if l.header_len > usize::from(c.hlen) {
            assert!(header_digest_ok(&all, usize::from(c.hlen)), "bad header digest from the target");
        }
        let data = all[l.data_offset..l.data_offset + l.data_len].to_vec();
        if l.data_digest {
            assert_eq!(crc32c(&data).to_le_bytes(), all[l.data_offset + l.data_len..], "bad data digest");
        }
        Ok(Pdu { ch: c, header: all[..usize::from(c.hlen)].to_vec(), data })
    }

    /// Reads PDUs until a response capsule.
    pub(crate) fn response(&mut self) -> Cqe {
        let p = self.read_pdu().unwrap();
        assert_eq!(p.ch.pdu_type, PDU_CAPSULE_RESP, "{p:?}");
        Cqe::from_bytes(p.header[8..24].try_into().unwrap())
    }

    /// Sends a command and runs it to its completion: host data in the capsule (up to
    /// `icd`) or by R2T, controller data gathered from C2HData. A C2HData with SUCCESS stands
    /// for the completion.
    pub(crate) fn run(&mut self, mut sqe: Sqe, out: &[u8], in_len: usize) -> (Cqe, Vec<u8>) {
        let cid = sqe.cid();
        let in_capsule = !out.is_empty() && out.len() <= self.icd;
        if in_capsule {
            set_sgl(&mut sqe, SGL_IN_CAPSULE, out.len() as u32);
            self.send_capsule(&sqe, out);
        } else {
            set_sgl(&mut sqe, SGL_TRANSPORT, (out.len().max(in_len)) as u32);
            self.send_capsule(&sqe, &[]);
        }
        let mut data = Vec::new();
        loop {
            let p = self.read_pdu().unwrap();
            match p.ch.pdu_type {
                PDU_R2T => {
                    let r = DataHeader::parse(&p.header).unwrap();
                    assert_eq!(r.cccid, cid);
                    let (start, end) = (r.offset as usize, (r.offset + r.length) as usize);
                    let chunk = self.h2c_chunk.min(self.maxh2c as usize);
                    let mut off = start;
                    while off < end {
                        let n = chunk.min(end - off);
                        let h = DataHeader { cccid: cid, ttag: r.ttag, offset: off as u32, length: n as u32 };
                        self.send_h2c(&h, &out[off..off + n], off + n == end);
                        off += n;
                    }
                }
                PDU_C2H_DATA => {
                    let h = DataHeader::parse(&p.header).unwrap();
                    assert_eq!(h.cccid, cid);
                    assert_eq!(h.offset as usize, data.len());
                    data.extend_from_slice(&p.data);
                    if p.ch.flags & FLAG_SUCCESS != 0 {
                        assert!(p.ch.flags & FLAG_LAST_PDU != 0);
                        return (Cqe::new(cid, Status::SUCCESS), data);
                    }
                }
                PDU_CAPSULE_RESP => {
                    let cqe = Cqe::from_bytes(p.header[8..24].try_into().unwrap());
                    assert_eq!(cqe.cid, cid);
                    return (cqe, data);
                }
                t => panic!("unexpected PDU type {t:#x}"),
            }
        }
    }

    pub(crate) fn send_h2c(&mut self, h: &DataHeader, data: &[u8], last: bool) {
        let mut b = [0u8; HEADER_ROOM];
        let n = write_h2c_data(&mut b, h, last, self.digests, 0);
        let mut v = b[..n].to_vec();
        v.extend_from_slice(data);
        if self.digests.data {
            v.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        self.s.write_all(&v).unwrap();
    }

    pub(crate) fn prop_set(&mut self, ofst: u32, value: u64) -> Cqe {
        let mut s = sqe(OPC_FABRICS, self.next_cid(), 0);
        s.0[4] = FCTYPE_PROPERTY_SET;
        s.0[40] = if ofst == 0 { 1 } else { 0 };
        s.0[44..48].copy_from_slice(&ofst.to_le_bytes());
        s.0[48..56].copy_from_slice(&value.to_le_bytes());
        self.run(s, &[], 0).0
    }

    pub(crate) fn prop_get(&mut self, ofst: u32) -> Cqe {
        let mut s = sqe(OPC_FABRICS, self.next_cid(), 0);
        s.0[4] = FCTYPE_PROPERTY_GET;
        s.0[40] = if ofst == 0 { 1 } else { 0 };
        s.0[44..48].copy_from_slice(&ofst.to_le_bytes());
        self.run(s, &[], 0).0
    }

    /// CC.EN = 1 (with the entry sizes), then CSTS.RDY.
    pub(crate) fn enable(&mut self) {
        let cqe = self.prop_set(0x14, 1 | (6 << 16) | (4 << 20));
        assert!(cqe.status.is_success(), "{cqe:?}");
        let csts = self.prop_get(0x1C);
        assert_eq!(csts.dw0 & 1, 1, "CSTS.RDY");
    }

    pub(crate) fn identify(&mut self, cns: u32, nsid: u32) -> (Cqe, Vec<u8>) {
        let mut s = sqe(ADMIN_IDENTIFY, self.next_cid(), nsid);
        set_cdw(&mut s, 10, cns);
        self.run(s, &[], 4096)
    }

    pub(crate) fn set_features(&mut self, fid: u8, value: u32) -> Cqe {
        let mut s = sqe(ADMIN_SET_FEATURES, self.next_cid(), 0);
        set_cdw(&mut s, 10, u32::from(fid));
        set_cdw(&mut s, 11, value);
        self.run(s, &[], 0).0
    }

    pub(crate) fn rw_sqe(&mut self, opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
        let mut s = sqe(opcode, self.next_cid(), nsid);
        set_cdw(&mut s, 10, slba as u32);
        set_cdw(&mut s, 11, (slba >> 32) as u32);
        set_cdw(&mut s, 12, nlb - 1);
        s
    }

    pub(crate) fn write(&mut self, nsid: u32, slba: u64, data: &[u8], fua: bool) -> Cqe {
        let mut s = self.rw_sqe(NVM_WRITE, nsid, slba, (data.len() / 512) as u32);
        if fua {
            let v = s.cdw(12) | (1 << 30);
            set_cdw(&mut s, 12, v);
        }
        self.run(s, data, 0).0
    }

    pub(crate) fn read(&mut self, nsid: u32, slba: u64, blocks: u32) -> (Cqe, Vec<u8>) {
        let s = self.rw_sqe(NVM_READ, nsid, slba, blocks);
        self.run(s, &[], blocks as usize * 512)
    }

    /// Whether the target closed the connection (after whatever it still sends: a term
    /// request, which is returned).
    pub(crate) fn closed(&mut self) -> (bool, Option<TermReq>) {
        let mut term = None;
        loop {
            let mut ch = [0u8; CH_LEN];
            match self.s.read_exact(&mut ch) {
                Ok(()) => {}
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                {
                    return (false, term)
                }
                Err(_) => return (true, term),
            }
            let c = CommonHeader::parse(&ch);
            let mut rest = vec![0u8; (c.plen as usize).saturating_sub(CH_LEN).min(4096)];
            if self.s.read_exact(&mut rest).is_err() {
                return (true, term);
            }
            if c.pdu_type == PDU_C2H_TERM_REQ {
                let mut all = ch.to_vec();
                all.extend_from_slice(&rest);
                term = TermReq::parse(&all);
            }
        }
    }
}
