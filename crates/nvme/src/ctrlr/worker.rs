//! The controller thread: it owns the admin queue and does everything that is not I/O, one
//! step at a time: bring-up (Identify, queue count, asynchronous events, keep-alive,
//! namespaces), I/O queue pairs for channels, aborts, resets, reconnects, asynchronous event
//! handling (Changed Namespace List, Base 2.0 5.2 and 5.16.1.5), detach.
//!
//! Reconnect policy (SPDK's three parameters): once a reset fails (or the connection is
//! lost), attempts repeat every `reconnect_delay_sec` until `ctrlr_loss_timeout_sec` has
//! passed since the loss (-1: forever; 0: no second attempt); then the controller is failed
//! and its namespaces removed. `fast_io_fail_timeout_sec` after the loss, channels fail the
//! I/O they hold instead of keeping it for the controller's return.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::BlockDevice;
use fp_nvme_spec::log_page::{AnaLogPage, LID_ANA};
use fp_nvme_spec::Cqe;
use fp_nvme_spec::{aer, registers};

use crate::bdev::{NamespaceBackend, NvmeNamespace};
use crate::cmd;
use crate::transport::{AdminData, AdminQueue, IoQueue, Transport};
use crate::NvmeError;

use super::ana;
use super::identify::{nsid_list, ControllerData, NamespaceData};
use super::namespaces::{lock_ns, Events, NamespaceEvent, NsMap};
use super::shared::*;

/// Entries of the admin queue.
pub(crate) const ADMIN_DEPTH: u16 = 32;
/// I/O queue pairs asked of a controller (Set Features Number of Queues).
const MAX_IO_QUEUES: u16 = 64;
/// Asynchronous Event Requests kept outstanding at most.
const MAX_AERS: u8 = 4;
/// Asynchronous event type 2h: notice; information 00h: Namespace Attribute Changed (Base 2.0
/// 5.2.1, Figure 147 and 150).
const AER_TYPE_NOTICE: u32 = 2;
const AER_NOTICE_NS_CHANGED: u32 = 0;

pub(crate) struct Worker<T: Transport> {
    shared: Arc<Shared<T>>,
    rx: Receiver<Msg<T>>,
    admin: Option<T::Admin>,
    namespaces: NsMap,
    events: Events,
    /// I/O queue IDs not in use, least recently used first: an ID is taken again as late as
    /// possible, so nothing of a deleted queue (a late completion, a doorbell value a device
    /// keeps) meets its successor.
    free_qids: VecDeque<u16>,
    /// Channels waiting for a queue until the controller is back.
    waiting: Vec<GrantReply<T>>,
    /// RPC resets waiting for the outcome of the next attempt.
    reset_replies: Vec<std::sync::mpsc::SyncSender<Result<(), NvmeError>>>,
    /// When the controller was lost; none while it is enabled.
    lost_at: Option<Instant>,
    next_attempt: Option<Instant>,
    next_keep_alive: Option<Instant>,
    next_admin_poll: Instant,
    aer_buf: Vec<Cqe>,
    /// The next ANATT deadline of a namespace inaccessible or in change.
    next_anatt: Option<Instant>,
}

impl<T: Transport> Worker<T> {
    pub(crate) fn new(
        shared: Arc<Shared<T>>,
        rx: Receiver<Msg<T>>,
        namespaces: NsMap,
        events: Events,
    ) -> Self {
        Worker {
            shared,
            rx,
            admin: None,
            namespaces,
            events,
            free_qids: VecDeque::new(),
            waiting: Vec::new(),
            reset_replies: Vec::new(),
            lost_at: None,
            next_attempt: None,
            next_keep_alive: None,
            next_admin_poll: Instant::now(),
            aer_buf: Vec::new(),
            next_anatt: None,
        }
    }

    /// The first bring-up, on the attaching thread's behalf: the namespaces found are the
    /// controller's initial ones (no events for them).
    pub(crate) fn attach(&mut self) -> Result<(), NvmeError> {
        let found = self.connect()?;
        let snap = self.shared.snapshot().clone();
        let mut map = lock_ns(&self.namespaces);
        for (nsid, data) in found {
            map.insert(nsid, self.namespace(nsid, data, &snap));
        }
        drop(map);
        self.shared.bump(ST_ENABLED);
        Ok(())
    }

    /// Serves messages until detached (or every handle is gone).
    pub(crate) fn run(mut self) {
        loop {
            let wait = self.next_deadline().saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(Msg::Detach { reply }) => {
                    self.detach();
                    self.drop_handed_back();
                    let _ = reply.send(());
                    return;
                }
                Ok(msg) => self.handle(msg),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.detach();
                    self.drop_handed_back();
                    return;
                }
            }
            self.tick();
        }
    }

    /// At the thread's end: the queues channels handed back and not yet taken are dropped
    /// (closed), and counted so.
    fn drop_handed_back(&mut self) {
        while let Ok(msg) = self.rx.try_recv() {
            if matches!(msg, Msg::Retire { .. } | Msg::QueueFailed { .. }) {
                drop(msg);
                self.shared.retired();
            }
        }
    }

    fn enabled(&self) -> bool {
        self.shared.state() & ST_ENABLED != 0
    }

    fn failed(&self) -> bool {
        self.shared.state() & ST_FAILED != 0
    }

    fn next_deadline(&self) -> Instant {
        let mut d = self.next_admin_poll;
        for t in [self.next_keep_alive, self.next_attempt, self.fast_fail_at(), self.next_anatt]
            .into_iter()
            .flatten()
        {
            d = d.min(t);
        }
        d
    }

    fn fast_fail_at(&self) -> Option<Instant> {
        let secs = self.shared.opts.fast_io_fail_timeout_sec;
        match self.lost_at {
            Some(at) if secs != 0 && self.shared.state() & (ST_FAST_FAIL | ST_FAILED) == 0 => {
                Some(at + self.shared.opts.seconds(u64::from(secs)))
            }
            _ => None,
        }
    }

    fn handle(&mut self, msg: Msg<T>) {
        match msg {
            Msg::ConnectIo { reply } => {
                if self.enabled() {
                    self.grant(reply);
                } else if self.failed() {
                    let _ = reply.send(Err(self.failure()));
                } else {
                    self.waiting.push(reply);
                }
            }
            Msg::DisconnectIo { queue, state } => {
                let qid = queue.qid();
                if generation(state) == generation(self.shared.state()) && self.enabled() {
                    self.delete_queue(qid);
                }
                // Only now: the controller no longer uses the queue's memory.
                drop(queue);
            }
            Msg::Retire { queue } => {
                drop(queue);
                self.shared.retired();
            }
            Msg::QueueFailed { state, queue, error } => {
                if generation(state) == generation(self.shared.state()) {
                    log::warn!("nvme {}: I/O queue {} failed: {error}", self.shared.opts.name, queue.qid());
                    self.reset();
                }
                drop(queue);
                self.shared.retired();
            }
            Msg::SetKeys { key, ctrlr_key, reply } => {
                let _ = reply.send(self.set_keys(key, ctrlr_key));
            }
            Msg::Abort { state, sqid, cid } => {
                if generation(state) != generation(self.shared.state()) || !self.enabled() {
                    return;
                }
                self.shared.snapshot().aborts += 1;
                log::warn!("nvme {}: aborting command {cid:#x} of queue {sqid}", self.shared.opts.name);
                match self.admin_cmd("Abort", cmd::abort(sqid, cid), AdminData::None) {
                    Ok(_) => {}
                    Err(NvmeError::Command { status, .. }) => {
                        log::warn!("nvme {}: Abort refused: {status:?}", self.shared.opts.name)
                    }
                    Err(_) => self.reset(),
                }
            }
            Msg::Reset { state, reply } => {
                if let Some(s) = state {
                    if generation(s) != generation(self.shared.state()) {
                        return;
                    }
                }
                if let Some(r) = reply {
                    self.reset_replies.push(r);
                }
                self.reset();
            }
            Msg::ReadAna => {
                // A controller resetting reads the page as it comes back.
                if self.enabled() {
                    let nsids = self.known_nsids();
                    if let Err(e) = self.read_ana(&nsids) {
                        log::warn!("nvme {}: reading the ANA log page: {e}", self.shared.opts.name);
                        if !matches!(e, NvmeError::Command { .. } | NvmeError::Protocol(_)) {
                            self.reset();
                        }
                    }
                }
            }
            Msg::Detach { .. } => unreachable!("handled by run"),
        }
    }

    /// Periodic work: asynchronous events, keep-alive, reconnect attempts, fast I/O failure.
    fn tick(&mut self) {
        let now = Instant::now();
        if let Some(at) = self.fast_fail_at() {
            if now >= at {
                log::warn!("nvme {}: fast_io_fail_timeout_sec passed: failing I/O", self.shared.opts.name);
                let flags = (self.shared.state() & 0xff) | ST_FAST_FAIL;
                self.shared.set_flags(flags);
            }
        }
        if let Some(at) = self.next_attempt {
            if now >= at {
                self.next_attempt = None;
                self.reset();
            }
        }
        if self.next_anatt.is_some_and(|at| now >= at) {
            self.next_anatt = self.shared.ana.expire(self.anatt(), now);
            log::warn!(
                "nvme {}: a namespace stayed inaccessible or in ANA change longer than ANATT",
                self.shared.opts.name
            );
        }
        if !self.enabled() {
            return;
        }
        if let Some(at) = self.next_keep_alive {
            if now >= at {
                self.next_keep_alive = Some(now + self.keep_alive_interval());
                self.shared.snapshot().keep_alives += 1;
                if let Err(e) = self.admin_cmd("Keep Alive", cmd::keep_alive(), AdminData::None) {
                    log::warn!("nvme {}: keep alive: {e}", self.shared.opts.name);
                    if !matches!(e, NvmeError::Command { .. }) {
                        self.reset();
                        return;
                    }
                }
            }
        }
        if now >= self.next_admin_poll {
            self.next_admin_poll = now + self.shared.global.admin_poll_period();
            self.poll_async_events();
        }
    }

    fn keep_alive_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.shared.global.keep_alive_timeout_ms / 2).max(1))
    }

    /// Runs an admin command; an error status is an error.
    fn admin_cmd(
        &mut self,
        what: &'static str,
        sqe: fp_nvme_spec::Sqe,
        data: AdminData<'_>,
    ) -> Result<Cqe, NvmeError> {
        let timeout = self.shared.global.admin_timeout();
        let admin = self.admin.as_mut().ok_or_else(|| NvmeError::Gone("no admin queue".into()))?;
        run_admin(admin, what, sqe, data, timeout)
    }

    fn poll_async_events(&mut self) {
        let Some(admin) = self.admin.as_mut() else { return };
        self.aer_buf.clear();
        if let Err(e) = admin.poll_async_events(&mut self.aer_buf) {
            log::warn!("nvme {}: admin queue: {e}", self.shared.opts.name);
            self.reset();
            return;
        }
        let events = std::mem::take(&mut self.aer_buf);
        let mut rescan = false;
        for cqe in &events {
            self.shared.snapshot().async_events += 1;
            if !cqe.status.is_success() {
                // Aborted at a reset, or the controller's limit: not re-armed.
                continue;
            }
            let kind = cqe.dw0 & 0x7;
            let info = (cqe.dw0 >> 8) & 0xff;
            let log_page = (cqe.dw0 >> 16) & 0xff;
            log::info!(
                "nvme {}: asynchronous event type {kind} info {info:#x} log {log_page:#x}",
                self.shared.opts.name
            );
            if kind == AER_TYPE_NOTICE && info == AER_NOTICE_NS_CHANGED {
                rescan = true;
            }
            let ana_change = kind == u32::from(aer::TYPE_NOTICE)
                && info == u32::from(aer::INFO_ANA_CHANGE)
                && self.shared.snapshot().cdata.ana_reporting();
            // Reading the log page the event names clears it (RAE 0) and lets the controller
            // report the next one; then the request is re-armed. The ANA page is read whole
            // and its states published.
            if ana_change {
                let nsids = self.known_nsids();
                if let Err(e) = self.read_ana(&nsids) {
                    log::warn!("nvme {}: reading the ANA log page: {e}", self.shared.opts.name);
                }
            } else if log_page != 0 {
                let mut page = vec![0u8; 4096];
                let len =
                    if log_page == u32::from(fp_nvme_spec::log_page::LID_CHANGED_NS) { 4096 } else { 512 };
                let sqe = cmd::get_log_page(log_page as u8, 0xffff_ffff, len, 0);
                if let Err(e) =
                    self.admin_cmd("Get Log Page", sqe, AdminData::FromDevice(&mut page[..len as usize]))
                {
                    log::warn!("nvme {}: reading log page {log_page:#x}: {e}", self.shared.opts.name);
                }
            }
            if let Some(admin) = self.admin.as_mut() {
                if let Err(e) = admin.submit_async_event_request() {
                    log::warn!(
                        "nvme {}: re-arming an asynchronous event request: {e}",
                        self.shared.opts.name
                    );
                }
            }
        }
        self.aer_buf = events;
        if rescan {
            match self.scan_namespaces() {
                Ok(found) => {
                    // New namespaces take their ANA states before they are bdevs.
                    let nsids: Vec<(u32, u32)> = found.iter().map(|(n, d)| (*n, d.anagrpid)).collect();
                    if let Err(e) = self.read_ana(&nsids) {
                        log::warn!("nvme {}: reading the ANA log page: {e}", self.shared.opts.name);
                    }
                    self.apply_namespaces(found)
                }
                Err(e) => log::warn!("nvme {}: namespace rescan: {e}", self.shared.opts.name),
            }
        }
    }

    /// Connects the admin queue and brings the controller up; returns its usable namespaces.
    /// On success the admin queue is in place (the state word is the caller's to set).
    fn connect(&mut self) -> Result<Vec<(u32, NamespaceData)>, NvmeError> {
        let name = self.shared.opts.name.clone();
        let timeout = self.shared.global.admin_timeout();
        let t = &self.shared.transport;
        let mut admin = t.connect_admin(ADMIN_DEPTH, timeout)?;
        let cap = admin.get_property(registers::CAP, true)?;
        let vs = admin.get_property(registers::VS, false)? as u32;
        let mut buf = vec![0u8; 4096];
        run_admin(
            &mut admin,
            "Identify Controller",
            cmd::identify(fp_nvme_spec::identify::CNS_CONTROLLER, 0),
            AdminData::FromDevice(&mut buf),
            timeout,
        )?;
        let cdata = ControllerData::parse(&buf);
        let want = u32::from(MAX_IO_QUEUES - 1);
        let cqe = run_admin(
            &mut admin,
            "Set Features (Number of Queues)",
            cmd::set_features(fp_nvme_spec::features::FID_NUMBER_OF_QUEUES, want | (want << 16)),
            AdminData::None,
            timeout,
        )?;
        let granted = (cqe.dw0 & 0xffff).min(cqe.dw0 >> 16).min(want) as u16 + 1;
        // Namespace Attribute Notices (OAES bit 8) and ANA Change Notices (bit 11) when
        // offered; the requests go out either way (errors and health events come through them
        // too, and some controllers send notices they do not advertise).
        let mut aec = 0;
        if cdata.namespace_notices() {
            aec |= aer::AEC_NS_ATTRIBUTE;
        }
        if cdata.ana_reporting() && cdata.ana_notices() {
            aec |= aer::AEC_ANA_CHANGE;
        }
        if aec != 0 {
            let r = run_admin(
                &mut admin,
                "Set Features (Asynchronous Event Configuration)",
                cmd::set_features(fp_nvme_spec::features::FID_ASYNC_EVENT_CONFIG, aec),
                AdminData::None,
                timeout,
            );
            match r {
                Ok(_) => {}
                Err(NvmeError::Command { status, .. }) => {
                    log::warn!("nvme {name}: asynchronous event configuration refused: {status:?}")
                }
                Err(e) => return Err(e),
            }
        }
        for _ in 0..(cdata.aerl + 1).min(MAX_AERS) {
            admin.submit_async_event_request()?;
        }
        let kato = self.shared.global.keep_alive_timeout_ms;
        let fabrics = t.trtype() != "PCIe";
        self.next_keep_alive = None;
        if kato != 0 && (cdata.kas != 0 || fabrics) {
            if !fabrics {
                // PCIe: the timer is a feature (Base 5.27.1.12); fabrics set it at Connect.
                run_admin(
                    &mut admin,
                    "Set Features (Keep Alive Timer)",
                    cmd::set_features(fp_nvme_spec::features::FID_KEEP_ALIVE_TIMER, kato),
                    AdminData::None,
                    timeout,
                )?;
            }
            self.next_keep_alive = Some(Instant::now() + self.keep_alive_interval());
        }
        let page = 1u32 << (12 + registers::cap_mpsmin(cap));
        let max_transfer =
            cdata.max_transfer(page).unwrap_or(u32::MAX).min(MAX_TRANSFER_DEFAULT).min(t.max_transfer());
        let depth = self.shared.opts.io_queue_depth.min(registers::cap_mqes(cap).saturating_add(1)).max(2);
        {
            let mut s = self.shared.snapshot();
            s.cntlid = admin.cntlid();
            s.vs = vs;
            s.cdata = cdata;
            s.max_transfer = max_transfer;
            s.io_queue_depth = depth;
            s.max_io_queues = granted;
            s.io_queues = 0;
        }
        self.free_qids = (1..=granted).collect();
        let old = self.admin.replace(admin);
        // The old admin queue (of before a reset) goes only now: the controller was disabled
        // by `connect_admin`, so it no longer writes into its memory.
        drop(old);
        self.next_admin_poll = Instant::now();
        let found = self.scan_namespaces()?;
        // The states before the controller is enabled: no channel sends I/O on what it
        // reported before a reset. A controller that refuses the page serves as optimized
        // (SPDK's choice); one that does not answer fails the bring-up.
        let nsids: Vec<(u32, u32)> = found.iter().map(|(n, d)| (*n, d.anagrpid)).collect();
        match self.read_ana(&nsids) {
            Ok(()) => {}
            Err(e @ (NvmeError::Command { .. } | NvmeError::Protocol(_))) => {
                log::warn!("nvme {name}: reading the ANA log page: {e}; its paths count as optimized")
            }
            Err(e) => return Err(e),
        }
        Ok(found)
    }

    /// The namespaces known now, with their Identify ANAGRPID.
    fn known_nsids(&self) -> Vec<(u32, u32)> {
        lock_ns(&self.namespaces).iter().map(|(n, ns)| (*n, ns.data().anagrpid)).collect()
    }

    /// The controller's ANA transition time.
    fn anatt(&self) -> Duration {
        ana::anatt(self.shared.snapshot().cdata.anatt)
    }

    /// Reads the whole ANA log page (sized from NANAGRPID and the namespaces, in pieces of at
    /// most the transfer limit, each bounded by the admin timeout) and publishes the states of
    /// `nsids`; nothing for a controller without ANA reporting. On failure the states stay as
    /// they were.
    fn read_ana(&mut self, nsids: &[(u32, u32)]) -> Result<(), NvmeError> {
        let (reporting, nanagrpid, max_transfer) = {
            let s = self.shared.snapshot();
            (s.cdata.ana_reporting(), s.cdata.nanagrpid, s.max_transfer)
        };
        if !reporting {
            return Ok(());
        }
        self.shared.ana.start_read();
        let len = ana::page_len(nanagrpid, nsids.len());
        let piece = (max_transfer as usize).clamp(4096, ana::ANA_PAGE_MAX) & !3;
        let mut page = vec![0u8; len];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(piece);
            let sqe = cmd::get_log_page(LID_ANA, 0xffff_ffff, n as u32, at as u64);
            if let Err(e) =
                self.admin_cmd("Get Log Page (ANA)", sqe, AdminData::FromDevice(&mut page[at..at + n]))
            {
                self.shared.ana.keep();
                return Err(e);
            }
            at += n;
        }
        let parsed = match AnaLogPage::parse(&page) {
            Ok(p) => p,
            Err(e) => {
                self.shared.ana.keep();
                return Err(NvmeError::Protocol(format!("ANA log page: {e}")));
            }
        };
        let anatt = self.anatt();
        self.next_anatt = self.shared.ana.publish(&parsed, nsids, anatt, Instant::now());
        let states: Vec<String> =
            parsed.groups.iter().map(|g| format!("{}:{}", g.grpid, g.state.name())).collect();
        log::info!(
            "nvme {}: ANA log page {} (groups {})",
            self.shared.opts.name,
            parsed.change_count,
            states.join(" ")
        );
        Ok(())
    }

    /// Identify of every active namespace the driver can use.
    fn scan_namespaces(&mut self) -> Result<Vec<(u32, NamespaceData)>, NvmeError> {
        let name = self.shared.opts.name.clone();
        let nn = self.shared.snapshot().cdata.nn;
        let mut nsids = Vec::new();
        let mut buf = vec![0u8; 4096];
        let mut after = 0u32;
        loop {
            buf.fill(0);
            let r = self.admin_cmd(
                "Identify (Active Namespace ID list)",
                cmd::identify(fp_nvme_spec::identify::CNS_ACTIVE_NS_LIST, after),
                AdminData::FromDevice(&mut buf),
            );
            match r {
                Ok(_) => {}
                Err(NvmeError::Command { .. }) if after == 0 => {
                    // Before NVMe 1.1 there is no list: every NSID up to NN.
                    nsids = (1..=nn.min(1024)).collect();
                    break;
                }
                Err(e) => return Err(e),
            }
            let page = nsid_list(&buf);
            let full = page.len() == 1024;
            after = page.last().copied().unwrap_or(0);
            nsids.extend(page);
            if !full {
                break;
            }
        }
        let mut found = Vec::new();
        for nsid in nsids {
            buf.fill(0);
            self.admin_cmd(
                "Identify Namespace",
                cmd::identify(fp_nvme_spec::identify::CNS_NAMESPACE, nsid),
                AdminData::FromDevice(&mut buf),
            )?;
            let data = NamespaceData::parse(&buf);
            match data.usable() {
                Ok(()) => found.push((nsid, data)),
                Err(why) if data.nsze != 0 => log::warn!("nvme {name}: namespace {nsid} left out: {why}"),
                Err(_) => {}
            }
        }
        Ok(found)
    }

    /// The namespace `nsid` a scan found, served through this controller with its limits in
    /// `snap`.
    fn namespace(&self, nsid: u32, data: NamespaceData, snap: &Snapshot) -> Arc<NvmeNamespace> {
        let backend: Arc<dyn NamespaceBackend> = self.shared.clone();
        Arc::new(NvmeNamespace::new(
            backend,
            nsid,
            data,
            &snap.cdata,
            snap.max_transfer,
            self.shared.global.enable_flush,
        ))
    }

    /// Compares a scan with the namespaces known: new ones are added, sizes updated, missing
    /// ones removed, each with its event.
    fn apply_namespaces(&mut self, found: Vec<(u32, NamespaceData)>) {
        let snap = self.shared.snapshot().clone();
        let mut events = Vec::new();
        {
            let mut map = lock_ns(&self.namespaces);
            let present: Vec<u32> = found.iter().map(|(n, _)| *n).collect();
            let gone: Vec<u32> = map.keys().copied().filter(|n| !present.contains(n)).collect();
            for nsid in gone {
                map.remove(&nsid);
                events.push(NamespaceEvent::Removed { nsid });
            }
            for (nsid, data) in found {
                if let Some(ns) = map.get(&nsid).filter(|ns| ns.info().block_size == data.block_size) {
                    if ns.update(data) {
                        events.push(NamespaceEvent::Resized { nsid, num_blocks: data.nsze });
                    }
                    continue;
                }
                // New, or reformatted with another block size: a different disk.
                if map.remove(&nsid).is_some() {
                    events.push(NamespaceEvent::Removed { nsid });
                }
                let ns = self.namespace(nsid, data, &snap);
                map.insert(nsid, ns.clone());
                events.push(NamespaceEvent::Added(ns));
            }
        }
        for e in events {
            log::info!("nvme {}: {e:?}", self.shared.opts.name);
            (self.events)(e);
        }
    }

    /// `bdev_nvme_set_keys`, as SPDK's: the keys are replaced (kept even if authenticating
    /// with them fails); without a host key nothing authenticates now. With one, the admin
    /// queue authenticates again in band, then every I/O queue in band on its reactor (the
    /// transport's), waited for here (bounded). A failed admin transaction fails the queue as
    /// SPDK's does: the controller resets, and reconnects with the new keys; a failed I/O
    /// queue dies, and its channel's report resets the controller the same way.
    fn set_keys(
        &mut self,
        key: Option<fp_crypto::dhchap::DhchapSecret>,
        ctrlr_key: Option<fp_crypto::dhchap::DhchapSecret>,
    ) -> Result<(), NvmeError> {
        let name = self.shared.opts.name.clone();
        let authenticate = key.is_some();
        self.shared.transport.set_dhchap_keys(key, ctrlr_key)?;
        if !authenticate || !self.enabled() {
            // A controller being reconnected authenticates with the new keys when it is back.
            return Ok(());
        }
        let timeout = self.shared.global.admin_timeout();
        let admin = self.admin.as_mut().expect("an enabled controller has its admin queue");
        if let Err(e) = self.shared.transport.reauthenticate_admin(admin, timeout) {
            log::warn!("nvme {name}: authenticating again with the new keys failed: {e}; resetting");
            self.reset();
            return Err(e);
        }
        // Queues granted (or on their way to a channel): each authenticates at its next poll.
        let queues = usize::from(self.shared.snapshot().io_queues);
        self.shared.transport.reauthenticate_io(queues, timeout)?;
        log::info!("nvme {name}: the admin queue and {queues} I/O queues authenticated with the new keys");
        Ok(())
    }

    /// Makes an I/O queue pair for a channel.
    fn grant(&mut self, reply: GrantReply<T>) {
        let Some(qid) = self.free_qids.pop_front() else {
            let _ = reply.send(Err(NvmeError::Unsupported(format!(
                "the controller gives {} I/O queue pairs; all are in use",
                self.shared.snapshot().max_io_queues
            ))));
            return;
        };
        let depth = self.shared.snapshot().io_queue_depth;
        let admin = self.admin.as_mut().expect("an enabled controller has its admin queue");
        match self.shared.transport.connect_io(admin, qid, depth) {
            Ok(queue) => {
                self.shared.snapshot().io_queues += 1;
                let state = self.shared.state();
                if let Err(back) = reply.send(Ok(IoGrant { queue, state })) {
                    // The channel went away meanwhile: delete the queue again.
                    self.delete_queue(qid);
                    drop(back);
                }
            }
            Err(e) => {
                self.free_qids.push_back(qid);
                log::warn!("nvme {}: making I/O queue {qid}: {e}", self.shared.opts.name);
                let fatal = !matches!(e, NvmeError::Command { .. } | NvmeError::Unsupported(_));
                let _ = reply.send(Err(e));
                if fatal {
                    self.reset();
                }
            }
        }
    }

    /// Deletes I/O queue `qid` on the controller and frees the ID (the caller drops the queue
    /// afterwards).
    fn delete_queue(&mut self, qid: u16) {
        if let Some(admin) = self.admin.as_mut() {
            if let Err(e) = self.shared.transport.disconnect_io(admin, qid) {
                log::warn!("nvme {}: deleting I/O queue {qid}: {e}", self.shared.opts.name);
            }
        }
        self.free_qids.push_back(qid);
        self.shared.snapshot().io_queues -= 1;
    }

    /// The error channels get once the controller is failed.
    fn failure(&self) -> NvmeError {
        if self.shared.state() & ST_GONE != 0 {
            NvmeError::Gone(format!("controller {} is gone", self.shared.opts.name))
        } else {
            NvmeError::Gone(format!("controller {} failed", self.shared.opts.name))
        }
    }

    /// Resets (or reconnects) the controller: every queue becomes invalid, the admin queue is
    /// connected again and the controller brought up; channels then ask for new queues and
    /// resubmit what they held. A failure starts (or continues) the reconnect policy.
    fn reset(&mut self) {
        let name = self.shared.opts.name.clone();
        let keep = self.shared.state() & (ST_FAST_FAIL | ST_GONE);
        self.shared.bump(ST_RESETTING | keep);
        {
            let mut s = self.shared.snapshot();
            s.resets += 1;
            if self.lost_at.is_some() {
                s.reconnect_attempts += 1;
            }
        }
        self.next_attempt = None;
        log::info!("nvme {name}: resetting");
        let result = self.connect();
        match result {
            Ok(found) => {
                self.lost_at = None;
                self.shared.snapshot().last_error = None;
                self.shared.set_flags(ST_ENABLED);
                log::info!("nvme {name}: reset done");
                for r in self.reset_replies.drain(..) {
                    let _ = r.send(Ok(()));
                }
                for reply in std::mem::take(&mut self.waiting) {
                    self.grant(reply);
                }
                self.apply_namespaces(found);
            }
            Err(e) => self.lost(e),
        }
    }

    /// A reset failed: schedules the next attempt, or gives the controller up.
    fn lost(&mut self, e: NvmeError) {
        let name = self.shared.opts.name.clone();
        log::warn!("nvme {name}: reset failed: {e}");
        let now = Instant::now();
        let at = *self.lost_at.get_or_insert(now);
        let gone = matches!(e, NvmeError::Gone(_));
        self.shared.snapshot().last_error = Some(e.to_string());
        self.admin = None;
        let opts = &self.shared.opts;
        let give_up = match opts.ctrlr_loss_timeout_sec {
            -1 => false,
            0 => true,
            s => now.duration_since(at) >= opts.seconds(s as u64),
        };
        if give_up {
            self.fail(gone);
        } else {
            self.next_attempt = Some(now + opts.seconds(u64::from(opts.reconnect_delay_sec)));
            let keep = self.shared.state() & ST_FAST_FAIL;
            self.shared.set_flags(ST_RESETTING | keep | if gone { ST_GONE } else { 0 });
        }
        for r in self.reset_replies.drain(..) {
            let _ = r.send(Err(NvmeError::Gone(format!("reset of {name} failed: {e}"))));
        }
    }

    /// Gives the controller up: I/O fails, waiting channels are told, namespaces removed.
    fn fail(&mut self, gone: bool) {
        log::error!(
            "nvme {}: controller lost; failing its I/O and removing its namespaces",
            self.shared.opts.name
        );
        self.admin = None;
        self.next_attempt = None;
        self.next_keep_alive = None;
        self.shared.bump(ST_FAILED | if gone { ST_GONE } else { 0 });
        for reply in std::mem::take(&mut self.waiting) {
            let _ = reply.send(Err(self.failure()));
        }
        self.apply_namespaces(Vec::new());
    }

    /// Detach: channels stop, the controller is shut down (CC.SHN) and the admin queue closed.
    fn detach(&mut self) {
        let keep = self.shared.state() & ST_GONE;
        self.shared.bump(ST_FAILED | ST_DELETING | keep);
        for reply in std::mem::take(&mut self.waiting) {
            let _ =
                reply.send(Err(NvmeError::Gone(format!("controller {} is detached", self.shared.opts.name))));
        }
        if let Some(mut admin) = self.admin.take() {
            self.shared.transport.shutdown(&mut admin, self.shared.global.admin_timeout());
        }
        // Queues that channels still hand back are dropped as their messages come: none
        // will, the receiver goes with this thread.
        lock_ns(&self.namespaces).clear();
    }
}

/// The transfer bound when neither MDTS nor the transport sets one: 1 MiB (SPDK's default
/// `max_xfer_size` bound for PCIe is larger, but a larger command only delays others).
const MAX_TRANSFER_DEFAULT: u32 = 1 << 20;

/// Runs an admin command to completion; an error status is [`NvmeError::Command`].
pub(crate) fn run_admin<A: AdminQueue>(
    admin: &mut A,
    what: &'static str,
    sqe: fp_nvme_spec::Sqe,
    data: AdminData<'_>,
    timeout: Duration,
) -> Result<Cqe, NvmeError> {
    let cqe = admin.execute(sqe, data, timeout)?;
    if !cqe.status.is_success() {
        return Err(NvmeError::Command { what, status: cqe.status });
    }
    Ok(cqe)
}
