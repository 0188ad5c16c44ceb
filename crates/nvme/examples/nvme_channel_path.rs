//! The namespace channel's own path length: I/O through `NvmeChannel` over a null transport
//! (a queue that completes every command at its flush, no device), so what is counted is the
//! channel (request and command slots, command building, completion, status mapping) plus the
//! command-id table the real transports share. Run it under callgrind twice with two counts
//! and divide the difference of the instruction totals by the difference of the counts:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/nvme_channel_path 100000
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/nvme_channel_path 200000
//! ```

use std::time::Duration;

use fp_bdev::Iovecs;
use fp_bdev::{BlockDevice, IoOp, IoRequest, IoStatus, SubmitError};
use fp_nvme::cid::CidTable;
use fp_nvme::ctrlr::{self, GlobalOptions};
use fp_nvme::transport::{AdminData, AdminQueue, IoQueue, QueueStats, Transport};
use fp_nvme::NvmeError;
use fp_nvme_spec::identify as id;
use fp_nvme_spec::registers;
use fp_nvme_spec::{self as spec, Cqe, Sqe, Status};

/// Queue depth of the run.
const QD: usize = 32;

struct NullTransport;
struct NullAdmin;
struct NullQueue {
    cids: CidTable,
    /// Submitted, not flushed; then completed.
    queued: Vec<u16>,
    done: Vec<u16>,
    stats: QueueStats,
}

impl Transport for NullTransport {
    type Admin = NullAdmin;
    type Io = NullQueue;
    fn trtype(&self) -> &'static str {
        "PCIe"
    }
    fn traddr(&self) -> String {
        "null".into()
    }
    fn connect_admin(&self, _depth: u16, _timeout: Duration) -> Result<NullAdmin, NvmeError> {
        Ok(NullAdmin)
    }
    fn connect_io(&self, _admin: &mut NullAdmin, _qid: u16, depth: u16) -> Result<NullQueue, NvmeError> {
        let n = usize::from(depth);
        Ok(NullQueue {
            cids: CidTable::new(depth - 1),
            queued: Vec::with_capacity(n),
            done: Vec::with_capacity(n),
            stats: QueueStats::default(),
        })
    }
    fn disconnect_io(&self, _admin: &mut NullAdmin, _qid: u16) -> Result<(), NvmeError> {
        Ok(())
    }
    fn shutdown(&self, _admin: &mut NullAdmin, _timeout: Duration) {}
}

impl AdminQueue for NullAdmin {
    fn execute(&mut self, sqe: Sqe, data: AdminData<'_>, _timeout: Duration) -> Result<Cqe, NvmeError> {
        let mut cqe = Cqe::new(sqe.cid(), Status::SUCCESS);
        if let AdminData::FromDevice(b) = data {
            b.fill(0);
            match (sqe.opcode(), sqe.cdw(10) as u8) {
                (spec::ADMIN_IDENTIFY, spec::identify::CNS_CONTROLLER) => {
                    b[id::IDC_MDTS] = 5;
                    b[id::IDC_NN] = 1;
                }
                (spec::ADMIN_IDENTIFY, spec::identify::CNS_ACTIVE_NS_LIST) if sqe.nsid() == 0 => b[0] = 1,
                (spec::ADMIN_IDENTIFY, spec::identify::CNS_NAMESPACE) => {
                    b[id::IDN_NSZE..id::IDN_NSZE + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
                    b[id::IDN_LBAF0 + 2] = 12;
                }
                _ => {}
            }
        }
        if sqe.opcode() == spec::ADMIN_SET_FEATURES
            && sqe.cdw(10) as u8 == spec::features::FID_NUMBER_OF_QUEUES
        {
            cqe.dw0 = 3 | (3 << 16);
        }
        Ok(cqe)
    }
    fn submit_async_event_request(&mut self) -> Result<(), NvmeError> {
        Ok(())
    }
    fn poll_async_events(&mut self, _out: &mut Vec<Cqe>) -> Result<(), NvmeError> {
        Ok(())
    }
    fn get_property(&mut self, offset: u32, _eight_bytes: bool) -> Result<u64, NvmeError> {
        Ok(if offset == registers::CAP { 1023 | (1 << 24) } else { 0 })
    }
    fn set_property(&mut self, _offset: u32, _value: u64, _eight_bytes: bool) -> Result<(), NvmeError> {
        Ok(())
    }
    fn cntlid(&self) -> u16 {
        1
    }
}

impl IoQueue for NullQueue {
    fn qid(&self) -> u16 {
        1
    }
    fn submit(&mut self, sqe: &Sqe, _iov: Iovecs, tag: u32) -> Result<(), SubmitError> {
        let cid = self.cids.alloc(tag, 0).ok_or(SubmitError::Busy)?;
        let mut s = *sqe;
        s.set_cid(cid);
        std::hint::black_box(&s);
        self.queued.push(cid);
        Ok(())
    }
    fn flush(&mut self) {
        self.done.append(&mut self.queued);
    }
    fn poll(&mut self, out: &mut Vec<(u32, Status)>) -> Result<usize, NvmeError> {
        let n = self.done.len();
        for &cid in &self.done {
            out.push((self.cids.complete(cid)?, Status::SUCCESS));
        }
        self.done.clear();
        Ok(n)
    }
    fn in_flight(&self) -> usize {
        self.cids.in_flight()
    }
    fn expired(&self, submitted_before: u64, out: &mut Vec<(u16, u32)>) {
        self.cids.expired(submitted_before, out)
    }
    fn drain(&mut self, out: &mut Vec<u32>) {
        self.cids.drain(out)
    }
    fn stats(&self) -> QueueStats {
        self.stats
    }
}

fn main() {
    let ios: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let global = GlobalOptions { keep_alive_timeout_ms: 0, ..Default::default() };
    let opts = global.controller_options("null");
    let c = ctrlr::attach(NullTransport, opts, global, Box::new(|_| {})).expect("attach");
    let ns = c.namespaces()[0].clone();
    let mut ch = ns.open_channel().expect("channel");
    let mut buf = vec![0u8; QD * 4096];
    let iovs: Vec<libc::iovec> = buf
        .chunks_mut(4096)
        .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: 4096 })
        .collect();
    let mut out: Vec<(u32, IoStatus)> = Vec::with_capacity(QD);
    let mut done = 0;
    let mut next = 0usize;
    // Keep QD in flight: resubmit each completion's slot.
    for (slot, iov) in iovs.iter().enumerate() {
        // SAFETY: the buffers and their iovecs outlive the requests, all reaped below.
        let req = IoRequest {
            tag: slot as u32,
            op: IoOp::Read,
            offset: 4096 * slot as u64,
            len: 4096,
            // SAFETY: the test keeps the buffers and their iovecs until the request completes.
            iov: unsafe { Iovecs::from_raw(iov, 1) },
        };
        ch.submit(&req).expect("submit");
        next += 1;
    }
    while done < ios {
        out.clear();
        ch.poll_batch(&mut out);
        for &(tag, status) in &out {
            assert_eq!(status, IoStatus::Success);
            done += 1;
            if next < ios {
                let slot = tag as usize;
                let offset = 4096 * ((next * 7) % 4096) as u64;
                // SAFETY: the test keeps the buffers and their iovecs until the request completes.
                let req = IoRequest {
                    tag,
                    op: IoOp::Read,
                    offset,
                    len: 4096,
                    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
                    iov: unsafe { Iovecs::from_raw(&iovs[slot], 1) },
                };
                ch.submit(&req).expect("submit");
                next += 1;
            }
        }
    }
    drop(ch);
    c.detach();
    println!("{done} I/Os at QD{QD}");
}
