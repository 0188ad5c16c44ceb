//! A minimal NVMe/TCP host for the daemon's tests: one connection per queue, no digests, one
//! command at a time. It connects an admin queue (Connect, Property Set CC.EN, Property Get
//! CSTS.RDY) and an I/O queue, and reads and writes blocks of namespace 1 with data in the
//! command capsule (writes) or in C2HData PDUs (reads).
//!
//! The layouts are the NVMe/TCP transport specification's (PDU headers: ICReq, ICResp,
//! CapsuleCmd, CapsuleResp, C2HData) and NVMe-oF 1.1's (Connect, Property Get/Set), written
//! here again on purpose rather than imported from `fp_nvmf`: a host that shares the target's
//! constants could not catch a wrong one.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const PDU_ICREQ: u8 = 0x00;
const PDU_ICRESP: u8 = 0x01;
const PDU_CAPSULE_CMD: u8 = 0x04;
const PDU_CAPSULE_RESP: u8 = 0x05;
const PDU_C2H_DATA: u8 = 0x07;
/// C2HData flags: the command's last data PDU, and (with it) "no response capsule follows".
const C2H_LAST_PDU: u8 = 0x04;
const C2H_SUCCESS: u8 = 0x08;

const OPC_FABRICS: u8 = 0x7f;
const FCTYPE_PROPERTY_SET: u8 = 0x00;
const FCTYPE_CONNECT: u8 = 0x01;
const FCTYPE_PROPERTY_GET: u8 = 0x04;
const OPC_WRITE: u8 = 0x01;
const OPC_READ: u8 = 0x02;
const OPC_IDENTIFY: u8 = 0x06;
const OPC_SET_FEATURES: u8 = 0x09;
const OPC_ASYNC_EVENT_REQUEST: u8 = 0x0c;
/// Set Features: Asynchronous Event Configuration, and its Namespace Attribute Notices bit.
const FID_ASYNC_EVENT_CONFIG: u32 = 0x0b;
const AEC_NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
/// CDW0 flags: PSDT = 01b, data described by SGLs (every NVMe-oF command).
const PSDT_SGL: u8 = 0x40;
/// SGL descriptor types (byte 15): data block with an offset into the capsule, and transport
/// data block (the data moves in separate PDUs).
const SGL_IN_CAPSULE: u8 = 0x01;
const SGL_TRANSPORT: u8 = 0x5a;

const PROP_CC: u32 = 0x14;
const PROP_CSTS: u32 = 0x1c;

/// One queue's connection.
pub struct Queue {
    stream: TcpStream,
    cid: u16,
}

/// A completion: its status field (0: success) and its first dword.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub status: u16,
    pub dw0: u32,
}

fn header(pdu_type: u8, flags: u8, hlen: u8, pdo: u8, plen: u32) -> [u8; 8] {
    let mut h = [pdu_type, flags, hlen, pdo, 0, 0, 0, 0];
    h[4..8].copy_from_slice(&plen.to_le_bytes());
    h
}

impl Queue {
    /// Connects and exchanges ICReq/ICResp (no digests, PDU data aligned as the target asks).
    pub fn open(addr: &str) -> std::io::Result<Queue> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        let mut q = Queue { stream, cid: 0 };
        let mut icreq = [0u8; 128];
        icreq[..8].copy_from_slice(&header(PDU_ICREQ, 0, 128, 0, 128));
        q.stream.write_all(&icreq)?;
        let (h, _) = q.read_pdu()?;
        assert_eq!(h[0], PDU_ICRESP, "ICResp expected: {h:?}");
        Ok(q)
    }

    /// One PDU: its header bytes (common header and the type's own) and its data.
    fn read_pdu(&mut self) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
        let mut ch = [0u8; 8];
        self.stream.read_exact(&mut ch)?;
        let (hlen, pdo) = (ch[2] as usize, ch[3] as usize);
        let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; plen - 8];
        self.stream.read_exact(&mut rest)?;
        let mut h = ch.to_vec();
        h.extend_from_slice(&rest[..hlen - 8]);
        let data = if pdo > 0 && plen > pdo { rest[pdo - 8..].to_vec() } else { Vec::new() };
        Ok((h, data))
    }

    /// Sends a command capsule (64-byte SQE, in-capsule data) with the next command ID.
    fn send(&mut self, mut sqe: [u8; 64], data: &[u8]) -> std::io::Result<u16> {
        self.cid = self.cid.wrapping_add(1);
        sqe[2..4].copy_from_slice(&self.cid.to_le_bytes());
        let hlen = 72u8;
        let pdo = if data.is_empty() { 0 } else { hlen };
        let mut pdu = header(PDU_CAPSULE_CMD, 0, hlen, pdo, 72 + data.len() as u32).to_vec();
        pdu.extend_from_slice(&sqe);
        pdu.extend_from_slice(data);
        self.stream.write_all(&pdu)?;
        Ok(self.cid)
    }

    /// Reads PDUs until command `cid` completes; returns its completion and the data that came
    /// with it.
    fn complete(&mut self, cid: u16) -> std::io::Result<(Completion, Vec<u8>)> {
        let mut data = Vec::new();
        loop {
            let (h, d) = self.read_pdu()?;
            match h[0] {
                PDU_C2H_DATA => {
                    assert_eq!(u16::from_le_bytes([h[8], h[9]]), cid, "C2HData for another command");
                    let offset = u32::from_le_bytes(h[12..16].try_into().unwrap()) as usize;
                    assert_eq!(offset, data.len(), "C2HData out of order");
                    data.extend_from_slice(&d);
                    if h[1] & (C2H_LAST_PDU | C2H_SUCCESS) == C2H_LAST_PDU | C2H_SUCCESS {
                        return Ok((Completion { status: 0, dw0: 0 }, data));
                    }
                }
                PDU_CAPSULE_RESP => {
                    let cqe = &h[8..24];
                    assert_eq!(
                        u16::from_le_bytes([cqe[12], cqe[13]]),
                        cid,
                        "a completion for another command"
                    );
                    let status = u16::from_le_bytes([cqe[14], cqe[15]]) >> 1;
                    let dw0 = u32::from_le_bytes(cqe[0..4].try_into().unwrap());
                    return Ok((Completion { status, dw0 }, data));
                }
                other => panic!("unexpected PDU type {other:#x}: {h:?}"),
            }
        }
    }

    /// A submission entry for `opcode`, its data described by SGLs.
    fn sqe(opcode: u8) -> [u8; 64] {
        let mut sqe = [0u8; 64];
        sqe[0] = opcode;
        sqe[1] = PSDT_SGL;
        sqe
    }

    fn fabrics(fctype: u8) -> [u8; 64] {
        let mut sqe = Queue::sqe(OPC_FABRICS);
        sqe[4] = fctype;
        sqe
    }

    /// Connect (NVMe-oF 1.1, 3.3): queue `qid` with `entries` entries, to controller `cntlid`
    /// (0xFFFF: a new one); returns the controller ID.
    pub fn connect(
        &mut self,
        subnqn: &str,
        hostnqn: &str,
        qid: u16,
        entries: u16,
        cntlid: u16,
    ) -> std::io::Result<u16> {
        let mut sqe = Queue::fabrics(FCTYPE_CONNECT);
        sqe[24 + 8..24 + 12].copy_from_slice(&1024u32.to_le_bytes());
        sqe[39] = SGL_IN_CAPSULE;
        sqe[42..44].copy_from_slice(&qid.to_le_bytes());
        sqe[44..46].copy_from_slice(&(entries - 1).to_le_bytes());
        let mut data = [0u8; 1024];
        data[..16].copy_from_slice(&[0x2b; 16]);
        data[16..18].copy_from_slice(&cntlid.to_le_bytes());
        data[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
        data[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
        let cid = self.send(sqe, &data)?;
        let (c, _) = self.complete(cid)?;
        assert_eq!(c.status, 0, "Connect of queue {qid} to {subnqn} failed: {c:?}");
        Ok(c.dw0 as u16)
    }

    pub fn property_set(&mut self, offset: u32, value: u32) -> std::io::Result<Completion> {
        let mut sqe = Queue::fabrics(FCTYPE_PROPERTY_SET);
        sqe[44..48].copy_from_slice(&offset.to_le_bytes());
        sqe[48..52].copy_from_slice(&value.to_le_bytes());
        let cid = self.send(sqe, &[])?;
        Ok(self.complete(cid)?.0)
    }

    fn property_get(&mut self, offset: u32) -> std::io::Result<u32> {
        let mut sqe = Queue::fabrics(FCTYPE_PROPERTY_GET);
        sqe[44..48].copy_from_slice(&offset.to_le_bytes());
        let cid = self.send(sqe, &[])?;
        let (c, _) = self.complete(cid)?;
        assert_eq!(c.status, 0, "Property Get {offset:#x}: {c:?}");
        Ok(c.dw0)
    }

    fn rw(opcode: u8, nsid: u32, lba: u64, blocks: u16, sgl: u8, len: usize) -> [u8; 64] {
        let mut sqe = Queue::sqe(opcode);
        sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
        sqe[24 + 8..24 + 12].copy_from_slice(&(len as u32).to_le_bytes());
        sqe[39] = sgl;
        sqe[40..48].copy_from_slice(&lba.to_le_bytes());
        sqe[48..50].copy_from_slice(&(blocks - 1).to_le_bytes());
        sqe
    }

    /// Writes `data` (whole blocks of `block_size`, at most the in-capsule size) at `lba`.
    pub fn write(
        &mut self,
        nsid: u32,
        lba: u64,
        block_size: usize,
        data: &[u8],
    ) -> std::io::Result<Completion> {
        let sqe =
            Queue::rw(OPC_WRITE, nsid, lba, (data.len() / block_size) as u16, SGL_IN_CAPSULE, data.len());
        let cid = self.send(sqe, data)?;
        Ok(self.complete(cid)?.0)
    }

    /// The connection, for tests that watch it close.
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Sends an Asynchronous Event Request; [`Queue::wait`] gets its completion when an event
    /// comes.
    pub fn async_event_request(&mut self) -> std::io::Result<u16> {
        self.send(Queue::sqe(OPC_ASYNC_EVENT_REQUEST), &[])
    }

    /// Enables Namespace Attribute Changed events (Set Features, Asynchronous Event
    /// Configuration).
    pub fn enable_namespace_events(&mut self) -> std::io::Result<Completion> {
        let mut sqe = Queue::sqe(OPC_SET_FEATURES);
        sqe[40..44].copy_from_slice(&FID_ASYNC_EVENT_CONFIG.to_le_bytes());
        sqe[44..48].copy_from_slice(&AEC_NAMESPACE_ATTRIBUTE.to_le_bytes());
        let cid = self.send(sqe, &[])?;
        Ok(self.complete(cid)?.0)
    }

    /// Waits for command `cid`'s completion.
    pub fn wait(&mut self, cid: u16) -> std::io::Result<Completion> {
        Ok(self.complete(cid)?.0)
    }

    /// Identify Namespace (CNS 00h): the 4096-byte data structure.
    pub fn identify_namespace(&mut self, nsid: u32) -> std::io::Result<(Completion, Vec<u8>)> {
        let mut sqe = Queue::sqe(OPC_IDENTIFY);
        sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
        sqe[24 + 8..24 + 12].copy_from_slice(&4096u32.to_le_bytes());
        sqe[39] = SGL_TRANSPORT;
        let cid = self.send(sqe, &[])?;
        self.complete(cid)
    }

    /// Reads `blocks` blocks at `lba`.
    pub fn read(
        &mut self,
        nsid: u32,
        lba: u64,
        block_size: usize,
        blocks: u16,
    ) -> std::io::Result<(Completion, Vec<u8>)> {
        let len = blocks as usize * block_size;
        let cid = self.send(Queue::rw(OPC_READ, nsid, lba, blocks, SGL_TRANSPORT, len), &[])?;
        self.complete(cid)
    }
}

/// A controller with its admin queue and one I/O queue.
pub struct Host {
    pub admin: Queue,
    pub io: Queue,
    pub cntlid: u16,
}

impl Host {
    /// Connects to `subnqn` at `addr` as `hostnqn`, enables the controller and connects I/O
    /// queue 1.
    pub fn connect(addr: &str, subnqn: &str, hostnqn: &str) -> std::io::Result<Host> {
        let mut admin = Queue::open(addr)?;
        let cntlid = admin.connect(subnqn, hostnqn, 0, 32, 0xffff)?;
        // CC: EN, 64-byte submission and 16-byte completion queue entries (IOSQES 6, IOCQES 4).
        let c = admin.property_set(PROP_CC, 0x0046_0001)?;
        assert_eq!(c.status, 0, "Property Set CC: {c:?}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while admin.property_get(PROP_CSTS)? & 1 == 0 {
            assert!(Instant::now() < deadline, "CSTS.RDY never set");
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut io = Queue::open(addr)?;
        io.connect(subnqn, hostnqn, 1, 32, cntlid)?;
        Ok(Host { admin, io, cntlid })
    }
}
