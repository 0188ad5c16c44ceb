//! A fake in-memory transport for the controller and channel tests: a "device" behind a
//! mutex with namespaces in RAM, that completes what it is sent when the queue is polled,
//! and that can be told to stall, fail, drop its connections, refuse to come back, or raise
//! asynchronous events. Every knob is a field of [`Dev`]; counters say what the driver did.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fp_bdev::clock::ticks;
use fp_bdev::{Iovecs, SubmitError};
use fp_nvme_spec::identify as id;
use fp_nvme_spec::log_page::{AnaLogPage, LID_ANA};
use fp_nvme_spec::registers;
use fp_nvme_spec::{self as spec, Cqe, Sqe, Status};

use fp_crypto::dhchap::DhchapSecret;

use crate::cid::CidTable;
use crate::transport::{AdminData, AdminQueue, IoQueue, QueueStats, Transport};
use crate::NvmeError;

/// One namespace of the fake device.
pub(crate) struct FakeNs {
    pub(crate) block_size: u32,
    pub(crate) data: Vec<u8>,
}

impl FakeNs {
    pub(crate) fn new(block_size: u32, blocks: u64) -> FakeNs {
        FakeNs { block_size, data: vec![0; (blocks * u64::from(block_size)) as usize] }
    }
}

/// An I/O command the device saw: opcode, SLBA, block count, queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) opcode: u8,
    pub(crate) slba: u64,
    pub(crate) nlb: u32,
    pub(crate) qid: u16,
}

/// The device's state and knobs.
pub(crate) struct Dev {
    pub(crate) namespaces: BTreeMap<u32, FakeNs>,
    pub(crate) mdts: u8,
    pub(crate) oncs: u16,
    pub(crate) vwc: u8,
    pub(crate) kas: u16,
    pub(crate) mqes: u16,
    pub(crate) max_queues: u16,
    /// Bumped by each `connect_admin`: queues of an older session are dead.
    pub(crate) session: u64,
    /// `connect_admin` fails while set (the target is unreachable).
    pub(crate) down: bool,
    /// How `connect_admin` fails while down: "gone" (a PCIe device removed) or not.
    pub(crate) down_gone: bool,
    /// I/O commands are taken but not completed while set.
    pub(crate) stall: bool,
    /// Stalled commands: (qid, cid).
    pub(crate) stalled: Vec<(u16, u16)>,
    /// Abort completes the aborted command (with Abort Requested) when set.
    pub(crate) abort_works: bool,
    /// I/O completes with this status instead of being carried out...
    pub(crate) io_status: Option<Status>,
    /// ...for this many commands (0: until told otherwise).
    pub(crate) io_status_times: u32,
    /// Asynchronous events to deliver (dword 0 values).
    pub(crate) events: Vec<u32>,
    // Counters.
    pub(crate) connects: u32,
    pub(crate) aborts: Vec<(u16, u16)>,
    /// Commands aborted, whose completion (Abort Requested) their queue delivers next.
    aborted: Vec<(u16, u16)>,
    pub(crate) keep_alives: u32,
    pub(crate) log_pages: u32,
    pub(crate) queues_made: u32,
    pub(crate) queues_deleted: Vec<u16>,
    pub(crate) shutdowns: u32,
    pub(crate) seen: Vec<Seen>,
    /// Largest data transfer of one command, in bytes.
    pub(crate) max_seen_transfer: u64,
    /// The host key the device asks its queues to authenticate with (none: it does not ask).
    pub(crate) auth_key: Option<DhchapSecret>,
    /// In-band re-authentications of the admin queue.
    pub(crate) reauths: u32,
    /// The I/O queue counts in-band re-authentications were asked for.
    pub(crate) io_reauths: Vec<usize>,
    /// ANA reporting: the page Get Log Page 0Ch returns (every namespace in ANA group 1 by
    /// Identify), and ANATT in seconds.
    pub(crate) ana: Option<AnaLogPage>,
    pub(crate) anatt: u8,
    /// ANA log pages read.
    pub(crate) ana_reads: u32,
}

/// The fake device, shared by the transport, its queues and the test.
#[derive(Clone)]
pub(crate) struct FakeDevice(Arc<Mutex<Dev>>);

impl FakeDevice {
    /// A device with `namespaces` (nsid, block size, blocks), MDTS 5 (128 KiB), DSM, Write
    /// Zeroes and a volatile cache.
    pub(crate) fn new(namespaces: &[(u32, u32, u64)]) -> FakeDevice {
        FakeDevice(Arc::new(Mutex::new(Dev {
            namespaces: namespaces.iter().map(|&(n, bs, blocks)| (n, FakeNs::new(bs, blocks))).collect(),
            mdts: 5,
            oncs: 0b1100,
            vwc: 1,
            kas: 1,
            mqes: 255,
            max_queues: 8,
            session: 0,
            down: false,
            down_gone: false,
            stall: false,
            stalled: Vec::new(),
            abort_works: true,
            io_status: None,
            io_status_times: 0,
            events: Vec::new(),
            connects: 0,
            aborts: Vec::new(),
            aborted: Vec::new(),
            keep_alives: 0,
            log_pages: 0,
            queues_made: 0,
            queues_deleted: Vec::new(),
            shutdowns: 0,
            seen: Vec::new(),
            max_seen_transfer: 0,
            auth_key: None,
            reauths: 0,
            io_reauths: Vec::new(),
            ana: None,
            anatt: 0,
            ana_reads: 0,
        })))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Dev> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A transport to it, of type `trtype` ("TCP" or "PCIe").
    pub(crate) fn transport(&self, trtype: &'static str) -> FakeTransport {
        FakeTransport { dev: self.clone(), trtype, key: Mutex::new(None) }
    }

    /// Loses every connection (admin and I/O queues die) and, with `down`, keeps the target
    /// unreachable until [`FakeDevice::up`].
    pub(crate) fn drop_connections(&self, down: bool) {
        let mut d = self.lock();
        d.session += 1;
        d.down = down;
    }

    /// The target is reachable again.
    pub(crate) fn up(&self) {
        self.lock().down = false;
    }
}

pub(crate) struct FakeTransport {
    dev: FakeDevice,
    trtype: &'static str,
    /// The host's DH-HMAC-CHAP key (`set_dhchap_keys`).
    key: Mutex<Option<DhchapSecret>>,
}

impl FakeTransport {
    /// A queue's authentication: the host's key must be the one the device asks for.
    fn authenticate(&self, d: &Dev, queue: &str) -> Result<(), NvmeError> {
        match &d.auth_key {
            Some(want) if self.key.lock().unwrap().as_ref() != Some(want) => {
                Err(NvmeError::Auth(format!("{queue}: the fake device refused the host's key")))
            }
            _ => Ok(()),
        }
    }
}

impl Transport for FakeTransport {
    type Admin = FakeAdmin;
    type Io = FakeIo;

    fn trtype(&self) -> &'static str {
        self.trtype
    }

    fn traddr(&self) -> String {
        "fake:0".into()
    }

    fn connect_admin(&self, _depth: u16, _timeout: Duration) -> Result<FakeAdmin, NvmeError> {
        let mut d = self.dev.lock();
        d.connects += 1;
        if d.down {
            return Err(if d.down_gone {
                NvmeError::Gone("the fake device is gone".into())
            } else {
                NvmeError::io("connecting", std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            });
        }
        self.authenticate(&d, "admin queue")?;
        d.session += 1;
        // A new session forgets what the old one had in flight.
        d.stalled.clear();
        d.aborted.clear();
        Ok(FakeAdmin { dev: self.dev.clone(), session: d.session, aers: 0 })
    }

    fn connect_io(&self, admin: &mut FakeAdmin, qid: u16, depth: u16) -> Result<FakeIo, NvmeError> {
        let mut d = self.dev.lock();
        if d.session != admin.session {
            return Err(NvmeError::Gone("connection lost".into()));
        }
        self.authenticate(&d, &format!("I/O queue {qid}"))?;
        d.queues_made += 1;
        Ok(FakeIo {
            dev: self.dev.clone(),
            session: admin.session,
            qid,
            cids: CidTable::new(depth - 1),
            queued: Vec::new(),
            held: Vec::new(),
            ready: Vec::new(),
            stats: QueueStats::default(),
        })
    }

    fn disconnect_io(&self, _admin: &mut FakeAdmin, qid: u16) -> Result<(), NvmeError> {
        self.dev.lock().queues_deleted.push(qid);
        Ok(())
    }

    fn shutdown(&self, _admin: &mut FakeAdmin, _timeout: Duration) {
        self.dev.lock().shutdowns += 1;
    }

    fn set_dhchap_keys(
        &self,
        key: Option<DhchapSecret>,
        ctrlr_key: Option<DhchapSecret>,
    ) -> Result<(), NvmeError> {
        if key.is_none() && ctrlr_key.is_some() {
            return Err(NvmeError::InvalidParam { field: "dhchap_ctrlr_key", reason: "no host key".into() });
        }
        *self.key.lock().unwrap() = key;
        Ok(())
    }

    fn reauthenticate_admin(&self, admin: &mut FakeAdmin, _timeout: Duration) -> Result<(), NvmeError> {
        let mut d = self.dev.lock();
        admin.live(&d)?;
        d.reauths += 1;
        self.authenticate(&d, "admin queue")
    }

    fn reauthenticate_io(&self, queues: usize, _timeout: Duration) -> Result<(), NvmeError> {
        let mut d = self.dev.lock();
        d.io_reauths.push(queues);
        self.authenticate(&d, "I/O queue")
    }
}

pub(crate) struct FakeAdmin {
    dev: FakeDevice,
    session: u64,
    aers: u32,
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

impl FakeAdmin {
    fn live(&self, d: &Dev) -> Result<(), NvmeError> {
        if d.session != self.session || d.down {
            return Err(NvmeError::Gone("connection lost".into()));
        }
        Ok(())
    }
}

impl AdminQueue for FakeAdmin {
    fn execute(&mut self, sqe: Sqe, data: AdminData<'_>, _timeout: Duration) -> Result<Cqe, NvmeError> {
        let mut d = self.dev.lock();
        self.live(&d)?;
        let mut cqe = Cqe::new(sqe.cid(), Status::SUCCESS);
        let out = match data {
            AdminData::FromDevice(b) => Some(b),
            _ => None,
        };
        match sqe.opcode() {
            spec::ADMIN_IDENTIFY => {
                let b = out.expect("Identify has data");
                b.fill(0);
                match sqe.cdw(10) as u8 {
                    spec::identify::CNS_CONTROLLER => {
                        put(b, id::IDC_SN, b"FAKE0001");
                        put(b, id::IDC_MN, b"fake controller");
                        b[id::IDC_MDTS] = d.mdts;
                        put(b, id::IDC_CNTLID, &7u16.to_le_bytes());
                        put(b, id::IDC_VER, &0x10400u32.to_le_bytes());
                        put(b, id::IDC_OAES, &(1u32 << 8).to_le_bytes());
                        b[id::IDC_AERL] = 3;
                        put(b, id::IDC_KAS, &d.kas.to_le_bytes());
                        let nn = d.namespaces.keys().last().copied().unwrap_or(0).max(4);
                        put(b, id::IDC_NN, &nn.to_le_bytes());
                        put(b, id::IDC_ONCS, &d.oncs.to_le_bytes());
                        b[id::IDC_VWC] = d.vwc;
                        if let Some(page) = &d.ana {
                            b[id::IDC_CMIC] = id::CMIC_ANA_REPORTING | id::CMIC_MULTI_CONTROLLER;
                            b[id::IDC_ANATT] = d.anatt;
                            let groups = page.groups.iter().map(|g| g.grpid).max().unwrap_or(1);
                            put(b, id::IDC_NANAGRPID, &groups.to_le_bytes());
                            put(
                                b,
                                id::IDC_OAES,
                                &(id::OAES_NS_ATTRIBUTE | id::OAES_ANA_CHANGE).to_le_bytes(),
                            );
                        }
                    }
                    spec::identify::CNS_ACTIVE_NS_LIST => {
                        let after = sqe.nsid();
                        for (i, n) in d.namespaces.keys().filter(|&&n| n > after).take(1024).enumerate() {
                            put(b, i * 4, &n.to_le_bytes());
                        }
                    }
                    spec::identify::CNS_NAMESPACE => {
                        if let Some(ns) = d.namespaces.get(&sqe.nsid()) {
                            let blocks = ns.data.len() as u64 / u64::from(ns.block_size);
                            put(b, id::IDN_NSZE, &blocks.to_le_bytes());
                            put(b, id::IDN_NCAP, &blocks.to_le_bytes());
                            let lbads = ns.block_size.trailing_zeros();
                            put(b, id::IDN_LBAF0, &(lbads << 16).to_le_bytes());
                            if d.ana.is_some() {
                                put(b, id::IDN_ANAGRPID, &1u32.to_le_bytes());
                            }
                        }
                    }
                    _ => cqe.status = Status::generic(spec::SC_INVALID_FIELD),
                }
            }
            spec::ADMIN_SET_FEATURES => {
                if sqe.cdw(10) as u8 == spec::features::FID_NUMBER_OF_QUEUES {
                    let n = u32::from(d.max_queues - 1);
                    cqe.dw0 = n | (n << 16);
                }
            }
            spec::ADMIN_GET_LOG_PAGE => {
                d.log_pages += 1;
                if let Some(b) = out {
                    b.fill(0);
                    if sqe.cdw(10) as u8 == LID_ANA {
                        let page = d.ana.as_ref().map(AnaLogPage::encode).unwrap_or_default();
                        d.ana_reads += 1;
                        let at = (u64::from(sqe.cdw(13)) << 32 | u64::from(sqe.cdw(12))) as usize;
                        let from = page.get(at..).unwrap_or_default();
                        let n = from.len().min(b.len());
                        b[..n].copy_from_slice(&from[..n]);
                    }
                }
            }
            spec::ADMIN_ABORT => {
                let (sqid, cid) = (sqe.cdw(10) as u16, (sqe.cdw(10) >> 16) as u16);
                d.aborts.push((sqid, cid));
                cqe.dw0 = 1; // not aborted, unless below
                if d.abort_works {
                    if let Some(i) = d.stalled.iter().position(|&s| s == (sqid, cid)) {
                        d.stalled.remove(i);
                        d.aborted.push((sqid, cid));
                        cqe.dw0 = 0;
                    }
                }
            }
            spec::ADMIN_KEEP_ALIVE => d.keep_alives += 1,
            _ => cqe.status = Status::generic(spec::SC_INVALID_OPCODE),
        }
        Ok(cqe)
    }

    fn submit_async_event_request(&mut self) -> Result<(), NvmeError> {
        self.aers += 1;
        Ok(())
    }

    fn poll_async_events(&mut self, out: &mut Vec<Cqe>) -> Result<(), NvmeError> {
        let mut d = self.dev.lock();
        self.live(&d)?;
        while self.aers > 0 && !d.events.is_empty() {
            let dw0 = d.events.remove(0);
            self.aers -= 1;
            out.push(Cqe { dw0, ..Cqe::new(0, Status::SUCCESS) });
        }
        Ok(())
    }

    fn get_property(&mut self, offset: u32, _eight_bytes: bool) -> Result<u64, NvmeError> {
        let d = self.dev.lock();
        self.live(&d)?;
        Ok(match offset {
            registers::CAP => u64::from(d.mqes) | (1 << 24) | (1 << 37),
            registers::VS => 0x10400,
            registers::CSTS => u64::from(registers::CSTS_RDY),
            _ => 0,
        })
    }

    fn set_property(&mut self, _offset: u32, _value: u64, _eight_bytes: bool) -> Result<(), NvmeError> {
        self.live(&self.dev.lock())
    }

    fn cntlid(&self) -> u16 {
        7
    }
}

pub(crate) struct FakeIo {
    dev: FakeDevice,
    session: u64,
    qid: u16,
    cids: CidTable,
    /// Submitted, not flushed: the command (with its ID) and its iovecs.
    queued: Vec<(Sqe, Vec<libc::iovec>)>,
    /// Taken by a stalling device, not carried out yet.
    held: Vec<(Sqe, Vec<libc::iovec>)>,
    /// Completed by the device, not reaped.
    ready: Vec<(u16, Status)>,
    stats: QueueStats,
}

// SAFETY: the iovecs point into buffers the submitter keeps valid until completion; the queue
// moves between threads only as a whole (control plane to its reactor).
unsafe impl Send for FakeIo {}

/// Carries out one I/O command on the device's RAM.
///
/// # Safety
/// `iov` describes buffers valid for the transfer.
unsafe fn execute(d: &mut Dev, sqe: &Sqe, iov: &[libc::iovec]) -> Status {
    if let Some(s) = d.io_status {
        if d.io_status_times > 0 {
            d.io_status_times -= 1;
            if d.io_status_times == 0 {
                d.io_status = None;
            }
        }
        return s;
    }
    let Some(ns) = d.namespaces.get_mut(&sqe.nsid()) else {
        return Status::generic(spec::SC_INVALID_NAMESPACE);
    };
    let bs = ns.block_size as usize;
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let size = ns.data.len();
    let range = |slba: u64, nlb: usize| -> Option<std::ops::Range<usize>> {
        let start = (slba as usize).checked_mul(bs)?;
        let end = start.checked_add(nlb * bs)?;
        (end <= size).then_some(start..end)
    };
    match sqe.opcode() {
        spec::NVM_READ | spec::NVM_WRITE => {
            let nlb = sqe.nlb() as usize;
            let Some(r) = range(sqe.slba(), nlb) else { return Status::generic(spec::SC_LBA_OUT_OF_RANGE) };
            if total != r.len() {
                return Status::generic(spec::SC_DATA_TRANSFER_ERROR);
            }
            d.max_seen_transfer = d.max_seen_transfer.max(total as u64);
            let mut at = r.start;
            for v in iov {
                // SAFETY: the caller's buffers (function contract).
                let buf = unsafe { std::slice::from_raw_parts_mut(v.iov_base as *mut u8, v.iov_len) };
                if sqe.opcode() == spec::NVM_WRITE {
                    ns.data[at..at + v.iov_len].copy_from_slice(buf);
                } else {
                    buf.copy_from_slice(&ns.data[at..at + v.iov_len]);
                }
                at += v.iov_len;
            }
        }
        spec::NVM_WRITE_ZEROES => {
            let Some(r) = range(sqe.slba(), sqe.nlb() as usize) else {
                return Status::generic(spec::SC_LBA_OUT_OF_RANGE);
            };
            ns.data[r].fill(0);
        }
        spec::NVM_DATASET_MANAGEMENT => {
            let ranges = sqe.cdw(10) as usize + 1;
            if total != ranges * 16 {
                return Status::generic(spec::SC_DATA_TRANSFER_ERROR);
            }
            // SAFETY: one iovec of the ranges, as the channel sends them.
            let b = unsafe { std::slice::from_raw_parts(iov[0].iov_base as *const u8, iov[0].iov_len) };
            for r in b.chunks_exact(16) {
                let nlb = u32::from_le_bytes(r[4..8].try_into().unwrap()) as usize;
                let slba = u64::from_le_bytes(r[8..16].try_into().unwrap());
                let Some(r) = range(slba, nlb) else { return Status::generic(spec::SC_LBA_OUT_OF_RANGE) };
                // Deallocated blocks read back as zeroes here (DLFEAT would say so).
                ns.data[r].fill(0);
            }
        }
        spec::NVM_FLUSH => {}
        _ => return Status::generic(spec::SC_INVALID_OPCODE),
    }
    Status::SUCCESS
}

impl IoQueue for FakeIo {
    fn qid(&self) -> u16 {
        self.qid
    }

    fn submit(&mut self, sqe: &Sqe, iov: Iovecs, tag: u32) -> Result<(), SubmitError> {
        let cid = self.cids.alloc(tag, ticks::now()).ok_or(SubmitError::Busy)?;
        let mut sqe = *sqe;
        sqe.set_cid(cid);
        self.queued.push((sqe, iov.as_slice().to_vec()));
        self.stats.submitted += 1;
        Ok(())
    }

    fn flush(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        self.stats.doorbells += 1;
        let mut d = self.dev.lock();
        if d.session != self.session {
            self.queued.clear();
            return;
        }
        for (sqe, iov) in self.queued.drain(..) {
            let lba = matches!(sqe.opcode(), spec::NVM_READ | spec::NVM_WRITE | spec::NVM_WRITE_ZEROES);
            let (slba, nlb) = if lba { (sqe.slba(), sqe.nlb()) } else { (0, 0) };
            d.seen.push(Seen { opcode: sqe.opcode(), slba, nlb, qid: self.qid });
            if d.stall {
                d.stalled.push((self.qid, sqe.cid()));
                self.held.push((sqe, iov));
                continue;
            }
            // SAFETY: the submitter keeps the buffers valid until the completion is reaped.
            let status = unsafe { execute(&mut d, &sqe, &iov) };
            self.ready.push((sqe.cid(), status));
        }
    }

    fn poll(&mut self, out: &mut Vec<(u32, Status)>) -> Result<usize, NvmeError> {
        {
            let mut d = self.dev.lock();
            if d.session != self.session {
                return Err(NvmeError::Gone("connection lost".into()));
            }
            // Aborted commands complete with Abort Requested; once the device stops stalling,
            // the others are carried out.
            let qid = self.qid;
            for &(_, cid) in d.aborted.iter().filter(|a| a.0 == qid) {
                self.held.retain(|(sqe, _)| sqe.cid() != cid);
                self.ready.push((cid, Status::generic(spec::SC_ABORT_REQUESTED)));
            }
            d.aborted.retain(|a| a.0 != qid);
            if !d.stall {
                d.stalled.retain(|s| s.0 != qid);
                for (sqe, iov) in std::mem::take(&mut self.held) {
                    // SAFETY: the submitter keeps the buffers valid until completion.
                    let status = unsafe { execute(&mut d, &sqe, &iov) };
                    self.ready.push((sqe.cid(), status));
                }
            }
        }
        let n = self.ready.len();
        for (cid, status) in self.ready.drain(..) {
            let tag = self.cids.complete(cid)?;
            out.push((tag, status));
        }
        self.stats.completed += n as u64;
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.cids.in_flight()
    }

    fn expired(&self, submitted_before: u64, out: &mut Vec<(u16, u32)>) {
        self.cids.expired(submitted_before, out)
    }

    fn drain(&mut self, out: &mut Vec<u32>) {
        self.queued.clear();
        self.held.clear();
        self.ready.clear();
        self.cids.drain(out);
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }
}

/// Options for a test attach: reconnect knobs in units of `second` (10 ms), admin queue polled
/// every millisecond, no keep-alive.
pub(crate) fn test_options(name: &str) -> (crate::ctrlr::ControllerOptions, crate::ctrlr::GlobalOptions) {
    let global = crate::ctrlr::GlobalOptions {
        keep_alive_timeout_ms: 0,
        nvme_adminq_poll_period_us: 1000,
        timeout_admin_us: 2_000_000,
        ..Default::default()
    };
    let mut opts = global.controller_options(name);
    opts.second = Duration::from_millis(10);
    (opts, global)
}

/// The namespace events a controller reported.
pub(crate) type EventLog = Arc<Mutex<Vec<crate::ctrlr::NamespaceEvent>>>;

/// Attaches a controller of `dev`, recording its namespace events.
pub(crate) fn attach(
    dev: &FakeDevice,
    trtype: &'static str,
    opts: crate::ctrlr::ControllerOptions,
    global: crate::ctrlr::GlobalOptions,
) -> (Arc<dyn crate::ctrlr::Controller>, EventLog) {
    let log: EventLog = Arc::default();
    let l = log.clone();
    let c = crate::ctrlr::attach(
        dev.transport(trtype),
        opts,
        global,
        Box::new(move |e| l.lock().unwrap().push(e)),
    )
    .expect("attach");
    (c, log)
}

/// Waits until `cond` holds, up to 30 s: a bound for a hang, not a speed (a reset that takes
/// 40 ms on an idle machine took over 5 s on one shared by a CI run and a dozen builds).
pub(crate) fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
