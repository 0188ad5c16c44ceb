//! One NVMe-oF controller's state and its admin queue (Fabrics 3, Base 5): properties, Identify,
//! Get Log Page, features, asynchronous events and the keep-alive timer. Pure logic: the engine
//! calls [`Controller::admin`] from the admin queue pair's poller with each command (after
//! Connect) and sends what it returns; nothing here does I/O, blocks or panics on any input.

use std::time::{Duration, Instant};

use fp_nvme_spec::fabrics::PropertyAccess;

use crate::aer::{AsyncEvent, AsyncEvents};
use crate::features::{FeatureEffect, FeatureError, FeatureLimits, Features};
use fp_nvme_spec::identify::{
    CNS_ACTIVE_NS_LIST, CNS_CONTROLLER, CNS_IO_COMMAND_SET_CONTROLLER, CNS_NAMESPACE, CNS_NS_DESCRIPTORS,
    CSI_NVM,
};
use fp_nvme_spec::log_page::{
    LogRequest, ANA_LSP_RGO, LID_ANA, LID_CHANGED_NS, LID_DISCOVERY, LID_ERROR, LID_FIRMWARE_SLOT, LID_SMART,
};

use crate::identify;
use crate::log_page::{self, ChangedNamespaces};
pub use crate::model::ControllerConfig;
use crate::model::{SubsystemKind, SubsystemView};
use crate::properties::{Properties, PropertyEffect};
use fp_nvme_spec::{
    Cqe, Sqe, Status, ADMIN_ABORT, ADMIN_ASYNC_EVENT_REQUEST, ADMIN_GET_FEATURES, ADMIN_GET_LOG_PAGE,
    ADMIN_IDENTIFY, ADMIN_KEEP_ALIVE, ADMIN_SET_FEATURES, FCTYPE_CONNECT, FCTYPE_DISCONNECT,
    FCTYPE_PROPERTY_GET, FCTYPE_PROPERTY_SET, OPC_FABRICS, SC_ASYNC_EVENT_LIMIT_EXCEEDED,
    SC_COMMAND_SEQUENCE_ERROR, SC_FEATURE_NOT_CHANGEABLE, SC_FEATURE_NOT_SAVEABLE, SC_INVALID_FIELD,
    SC_INVALID_LOG_PAGE, SC_INVALID_NAMESPACE, SC_INVALID_OPCODE,
};

/// How long past KATO a controller lives without a Keep Alive before it is torn down. Linux
/// hosts before 5.16 send Keep Alive every KATO (not KATO / 2), so the command arrives just as
/// the timer runs out; the slack keeps a late one from tearing down a healthy association
/// (Base 3.9.5 lets the controller account for transport delays).
pub const KEEP_ALIVE_GRACE: Duration = Duration::from_secs(1);

/// Abort's dword 0 bit 0: the command was not aborted (Base 5.1).
const ABORT_NOT_ABORTED: u32 = 1;
/// Reserved NSIDs that the Active Namespace ID list refuses (Base 5.17.2.2).
const NSID_BROADCAST: u32 = 0xFFFF_FFFF;
const NSID_RESERVED: u32 = 0xFFFF_FFFE;
/// SMART critical warning events, which an I/O controller may enable (it never raises one).
const AEC_SMART: u32 = 0xFF;

/// What the engine does with an admin command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminResult {
    /// Send this completion (cid/sqid filled in by the controller from the command); `data` is
    /// what the command returns to the host (Identify, Get Log Page, Get Features with data),
    /// empty if none. The engine sends at most the SGL's length of it (C2HData), then the
    /// response.
    Complete { cqe: Cqe, data: Vec<u8> },
    /// An Asynchronous Event Request: parked, completed later by `namespace_changed` /
    /// `discovery_changed` (or `take_parked` when the controller goes away).
    Parked,
    /// Disconnect (fctype 08h) on the admin queue: the engine answers `cqe` then tears the
    /// controller down when `teardown` is true. (A shutdown through CC.SHN is a `Complete`: the
    /// host reads CSTS.SHST afterwards, so the association must outlive it; the host closes
    /// it.)
    Complete2 { cqe: Cqe, teardown: bool },
}

/// One controller: created by an admin queue's Connect, alive until Disconnect, keep-alive
/// expiry or the end of its connection.
#[derive(Debug)]
pub struct Controller {
    cfg: ControllerConfig,
    props: Properties,
    features: Features,
    events: AsyncEvents,
    changed: ChangedNamespaces,
    /// When the last command (Keep Alive or any other) arrived on the admin queue.
    last_heard: Instant,
}

fn complete(cid: u16, status: Status) -> AdminResult {
    AdminResult::Complete { cqe: Cqe::new(cid, status), data: Vec::new() }
}

fn complete_dw0(cid: u16, dw0: u32) -> AdminResult {
    let mut cqe = Cqe::new(cid, Status::SUCCESS);
    cqe.dw0 = dw0;
    AdminResult::Complete { cqe, data: Vec::new() }
}

fn complete_data(cid: u16, data: Vec<u8>) -> AdminResult {
    AdminResult::Complete { cqe: Cqe::new(cid, Status::SUCCESS), data }
}

fn invalid_field(cid: u16) -> AdminResult {
    complete(cid, Status::generic(SC_INVALID_FIELD))
}

impl Controller {
    pub fn new(cfg: ControllerConfig, now: Instant) -> Controller {
        let io_queues = cfg.kind == SubsystemKind::Nvme;
        Controller {
            props: Properties::new(cfg.max_queue_entries, io_queues),
            features: Features::new(cfg.kato_ms),
            events: AsyncEvents::default(),
            changed: ChangedNamespaces::default(),
            last_heard: now,
            cfg,
        }
    }

    pub fn cntlid(&self) -> u16 {
        self.cfg.cntlid
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.cfg
    }

    /// Every admin-queue command except Connect: Property Get/Set (CAP, VS, CC, CSTS,
    /// shutdown), Identify (controller, namespace, active NS list, NS descriptor list), Get Log
    /// Page (error, SMART/health, changed namespace list, discovery log for discovery
    /// controllers), Set/Get Features (number of queues, async event config, keep-alive timer,
    /// ...), AER, Keep Alive, Abort (answers "not aborted"), and anything else with Invalid
    /// Opcode. `data_in` is the command's host data (in-capsule), empty if none. Never panics
    /// on any input.
    pub fn admin(&mut self, sqe: &Sqe, data_in: &[u8], view: &SubsystemView, now: Instant) -> AdminResult {
        // No admin command takes host data (Set Features with data is only for features not
        // kept here), so `data_in` is never read.
        let _ = data_in;
        // Any command shows the host is alive (the target's side of Base 3.9.5's timer).
        self.last_heard = now;
        let cid = sqe.cid();
        if sqe.opcode() == OPC_FABRICS {
            return self.fabrics(sqe);
        }
        if sqe.fuse() != 0 {
            // No fused operations (FUSES 0).
            return invalid_field(cid);
        }
        if !self.props.enabled() {
            // Before CC.EN = 1 only fabrics commands are allowed (Fabrics 3.5).
            return complete(cid, Status::generic(SC_COMMAND_SEQUENCE_ERROR));
        }
        match sqe.opcode() {
            ADMIN_IDENTIFY => self.identify(sqe, view),
            ADMIN_GET_LOG_PAGE => self.get_log_page(sqe, view),
            ADMIN_SET_FEATURES => self.set_features(sqe, view),
            ADMIN_GET_FEATURES => self.get_features(sqe, view),
            ADMIN_ASYNC_EVENT_REQUEST => match self.events.request(cid) {
                Ok(Some(cqe)) => AdminResult::Complete { cqe, data: Vec::new() },
                Ok(None) => AdminResult::Parked,
                Err(_) => complete(cid, Status::command_specific(SC_ASYNC_EVENT_LIMIT_EXCEEDED)),
            },
            ADMIN_KEEP_ALIVE => complete(cid, Status::SUCCESS),
            // Commands complete as soon as they are seen here, so none is ever aborted.
            ADMIN_ABORT if self.cfg.kind == SubsystemKind::Nvme => complete_dw0(cid, ABORT_NOT_ABORTED),
            _ => complete(cid, Status::generic(SC_INVALID_OPCODE)),
        }
    }

    fn fabrics(&mut self, sqe: &Sqe) -> AdminResult {
        let cid = sqe.cid();
        match sqe.fctype() {
            FCTYPE_PROPERTY_GET => {
                let access = PropertyAccess::from_sqe(sqe);
                match self.props.get(&access) {
                    Ok(v) => {
                        let mut cqe = Cqe::new(cid, Status::SUCCESS);
                        cqe.dw0 = v as u32;
                        cqe.dw1 = (v >> 32) as u32;
                        AdminResult::Complete { cqe, data: Vec::new() }
                    }
                    Err(_) => invalid_field(cid),
                }
            }
            FCTYPE_PROPERTY_SET => match self.props.set(&PropertyAccess::from_sqe(sqe)) {
                Ok(PropertyEffect::Reset) => {
                    self.reset();
                    complete(cid, Status::SUCCESS)
                }
                Ok(_) => complete(cid, Status::SUCCESS),
                Err(_) => invalid_field(cid),
            },
            FCTYPE_DISCONNECT => {
                AdminResult::Complete2 { cqe: Cqe::new(cid, Status::SUCCESS), teardown: true }
            }
            // The admin queue is connected already.
            FCTYPE_CONNECT => complete(cid, Status::generic(SC_COMMAND_SEQUENCE_ERROR)),
            _ => complete(cid, Status::generic(SC_INVALID_OPCODE)),
        }
    }

    /// CC.EN 1 -> 0 (Base 3.7.2): the features and events start over.
    fn reset(&mut self) {
        self.features = Features::new(self.cfg.kato_ms);
        self.events.reset();
        self.changed.clear();
    }

    fn identify(&self, sqe: &Sqe, view: &SubsystemView) -> AdminResult {
        let cid = sqe.cid();
        let cns = sqe.cdw(10) as u8;
        let nsid = sqe.nsid();
        let discovery = self.cfg.kind == SubsystemKind::Discovery;
        let invalid_ns = || complete(cid, Status::generic(SC_INVALID_NAMESPACE));
        match cns {
            CNS_CONTROLLER => complete_data(cid, identify::controller(&self.cfg, view)),
            // Discovery controllers answer Identify Controller only (Fabrics 5).
            _ if discovery => invalid_field(cid),
            CNS_NAMESPACE => match view.namespace(nsid) {
                Some(ns) => complete_data(cid, identify::namespace(Some(ns), view)),
                // An inactive NSID in range reads as zeroes; 0, FFFFFFFFh (no namespace
                // management) and NSIDs past NN are invalid (Base 5.17.2.1).
                None if nsid == 0 || nsid == NSID_BROADCAST || nsid > view.max_namespaces => invalid_ns(),
                None => complete_data(cid, identify::namespace(None, view)),
            },
            CNS_ACTIVE_NS_LIST if nsid >= NSID_RESERVED => invalid_ns(),
            CNS_ACTIVE_NS_LIST => complete_data(cid, identify::active_namespaces(view, nsid)),
            CNS_NS_DESCRIPTORS => match view.namespace(nsid) {
                Some(ns) => complete_data(cid, identify::descriptors(ns)),
                None => invalid_ns(),
            },
            CNS_IO_COMMAND_SET_CONTROLLER if (sqe.cdw(11) >> 24) as u8 == CSI_NVM => {
                complete_data(cid, identify::nvm_controller())
            }
            _ => invalid_field(cid),
        }
    }

    fn get_log_page(&mut self, sqe: &Sqe, view: &SubsystemView) -> AdminResult {
        let cid = sqe.cid();
        let req = LogRequest::from_sqe(sqe);
        let page = match (self.cfg.kind, req.lid) {
            (SubsystemKind::Discovery, LID_DISCOVERY) => {
                let asqsz = self.cfg.max_admin_queue_entries.min(u32::from(u16::MAX)) as u16;
                log_page::discovery(view, asqsz)
            }
            (SubsystemKind::Nvme, LID_ERROR) => log_page::error_information(),
            (SubsystemKind::Nvme, LID_SMART) => log_page::smart_health(),
            (SubsystemKind::Nvme, LID_FIRMWARE_SLOT) => {
                log_page::firmware_slot(&identify::firmware_revision())
            }
            (SubsystemKind::Nvme, LID_CHANGED_NS) => self.changed.page(),
            (SubsystemKind::Nvme, LID_ANA) if view.ana_reporting => {
                log_page::ana(view, req.lsp & ANA_LSP_RGO != 0)
            }
            _ => return complete(cid, Status::command_specific(SC_INVALID_LOG_PAGE)),
        };
        let Some(data) = log_page::cut(&req, &page, self.cfg.max_transfer_bytes) else {
            return invalid_field(cid);
        };
        // The list holds what changed since it was last read (Base 5.16.1.5), whatever RAE says;
        // RAE only decides whether the event may fire again (Base 5.2.1).
        if req.lid == LID_CHANGED_NS {
            self.changed.clear();
        }
        if !req.rae {
            self.events.log_read(req.lid);
        }
        complete_data(cid, data)
    }

    fn limits(&self, view: &SubsystemView) -> FeatureLimits {
        let discovery = self.cfg.kind == SubsystemKind::Discovery;
        FeatureLimits {
            discovery,
            volatile_cache: view.namespaces.iter().any(|n| n.volatile_cache),
            max_io_queues: if discovery { 0 } else { self.cfg.max_io_queues },
            events: identify::oaes(self.cfg.kind, view) | if discovery { 0 } else { AEC_SMART },
        }
    }

    fn feature_error(cid: u16, e: FeatureError) -> AdminResult {
        let status = match e {
            FeatureError::InvalidField => Status::generic(SC_INVALID_FIELD),
            FeatureError::NotSaveable => Status::command_specific(SC_FEATURE_NOT_SAVEABLE),
            FeatureError::NotChangeable => Status::command_specific(SC_FEATURE_NOT_CHANGEABLE),
        };
        complete(cid, status)
    }

    fn set_features(&mut self, sqe: &Sqe, view: &SubsystemView) -> AdminResult {
        let limits = self.limits(view);
        match self.features.set(sqe, &limits) {
            // A new KATO counts from now; last_heard was just set.
            Ok((dw0, FeatureEffect::KeepAlive(_) | FeatureEffect::None)) => complete_dw0(sqe.cid(), dw0),
            Err(e) => Self::feature_error(sqe.cid(), e),
        }
    }

    fn get_features(&self, sqe: &Sqe, view: &SubsystemView) -> AdminResult {
        match self.features.get(sqe, &self.limits(view), &self.cfg.hostid) {
            Ok((dw0, data)) => {
                let mut cqe = Cqe::new(sqe.cid(), Status::SUCCESS);
                cqe.dw0 = dw0;
                AdminResult::Complete { cqe, data }
            }
            Err(e) => Self::feature_error(sqe.cid(), e),
        }
    }

    /// A namespace was attached, detached or resized (its view is already updated): the parked
    /// AER's completion to send now if the event is enabled and an AER is parked; otherwise the
    /// event is kept until the host asks. Records nsid in the changed namespace list.
    pub fn namespace_changed(&mut self, nsid: u32) -> Option<Cqe> {
        if self.cfg.kind != SubsystemKind::Nvme {
            return None;
        }
        self.changed.add(nsid);
        let enabled = self.features.async_event_config() & AsyncEvent::NamespaceAttribute.config_bit() != 0;
        self.events.raise(AsyncEvent::NamespaceAttribute, enabled)
    }

    /// The ANA states the controller reports changed (its view is already updated): the
    /// parked AER's completion to send now if the host enabled ANA change notices.
    pub fn ana_changed(&mut self) -> Option<Cqe> {
        if self.cfg.kind != SubsystemKind::Nvme {
            return None;
        }
        let enabled = self.features.async_event_config() & AsyncEvent::AnaChange.config_bit() != 0;
        self.events.raise(AsyncEvent::AnaChange, enabled)
    }

    /// The discovery log changed (discovery controllers).
    pub fn discovery_changed(&mut self) -> Option<Cqe> {
        if self.cfg.kind != SubsystemKind::Discovery {
            return None;
        }
        let enabled = self.features.async_event_config() & AsyncEvent::DiscoveryChange.config_bit() != 0;
        self.events.raise(AsyncEvent::DiscoveryChange, enabled)
    }

    /// The keep-alive timeout in force (Connect's KATO or Set Features), None when off.
    pub fn keep_alive_timeout(&self) -> Option<Duration> {
        match self.features.kato_ms() {
            0 => None,
            ms => Some(Duration::from_millis(u64::from(ms))),
        }
    }

    /// KATO passed since the last Keep Alive (or command) with no keep-alive: tear down.
    pub fn keep_alive_expired(&self, now: Instant) -> bool {
        match self.keep_alive_timeout() {
            Some(kato) => now.saturating_duration_since(self.last_heard) > kato + KEEP_ALIVE_GRACE,
            None => false,
        }
    }

    /// CC.EN = 1 and CSTS.RDY = 1 (and no shutdown asked for): I/O queues may connect and
    /// I/O may flow.
    pub fn ready(&self) -> bool {
        self.props.ready()
    }

    /// I/O queues the host may create (Set Features Number of Queues, else max_io_queues).
    pub fn io_queues_allowed(&self) -> u16 {
        if self.cfg.kind == SubsystemKind::Discovery {
            return 0;
        }
        self.features.io_queues_allowed(&FeatureLimits {
            discovery: false,
            volatile_cache: false,
            max_io_queues: self.cfg.max_io_queues,
            events: 0,
        })
    }

    /// Asynchronous Event Requests parked now (a controller reset keeps them: they are
    /// answered by a later event or by `take_parked`).
    pub fn parked(&self) -> usize {
        self.events.parked()
    }

    /// Completions of parked AERs to fail (Command Aborted due to SQ Deletion) when the
    /// controller ends.
    pub fn take_parked(&mut self) -> Vec<Cqe> {
        self.events.take_parked()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{DiscoveryEntry, NamespaceInfo};
    use fp_nvme_spec::fabrics::DISCOVERY_NQN;

    pub(crate) fn config(kind: SubsystemKind) -> ControllerConfig {
        ControllerConfig {
            cntlid: 7,
            kind,
            subnqn: "nqn.2024-01.io.flashpath:disk1".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:host".into(),
            hostid: [0xAB; 16],
            max_queue_entries: 128,
            max_admin_queue_entries: 128,
            max_io_queues: 127,
            in_capsule_data_size: 4096,
            max_transfer_bytes: 131072,
            kato_ms: 5000,
        }
    }

    /// Two namespaces: NSID 1 (512-byte blocks, UUID + NGUID, deallocates) and NSID 3
    /// (4096-byte blocks, EUI-64 only, read only, writes zeroes, volatile cache).
    pub(crate) fn nvm_view() -> SubsystemView {
        SubsystemView {
            kind: SubsystemKind::Nvme,
            nqn: "nqn.2024-01.io.flashpath:disk1".into(),
            serial: "SN0001".into(),
            model: "fp test".into(),
            max_namespaces: 32,
            namespaces: vec![
                NamespaceInfo {
                    nsid: 1,
                    block_size: 512,
                    num_blocks: 2048,
                    uuid: [0x11; 16],
                    nguid: [0x22; 16],
                    eui64: [0; 8],
                    read_only: false,
                    volatile_cache: false,
                    deallocate: true,
                    write_zeroes: false,
                    anagrpid: 1,
                },
                NamespaceInfo {
                    nsid: 3,
                    block_size: 4096,
                    num_blocks: 256,
                    uuid: [0; 16],
                    nguid: [0; 16],
                    eui64: [0x33; 8],
                    read_only: true,
                    volatile_cache: true,
                    deallocate: false,
                    write_zeroes: true,
                    anagrpid: 3,
                },
            ],
            discovery_log: Vec::new(),
            generation: 0,
            ana_reporting: false,
            ana: Default::default(),
        }
    }

    pub(crate) fn discovery_view() -> SubsystemView {
        let entry = |subtype: u8, subnqn: &str| DiscoveryEntry {
            adrfam: 1,
            subtype,
            port_id: 1,
            traddr: "127.0.0.1".into(),
            trsvcid: "4420".into(),
            subnqn: subnqn.into(),
        };
        SubsystemView {
            kind: SubsystemKind::Discovery,
            nqn: DISCOVERY_NQN.into(),
            serial: String::new(),
            model: String::new(),
            max_namespaces: 0,
            namespaces: Vec::new(),
            discovery_log: vec![entry(2, "nqn.2024-01.io.flashpath:disk1"), entry(3, DISCOVERY_NQN)],
            generation: 5,
            ana_reporting: false,
            ana: Default::default(),
        }
    }

    pub(crate) fn sqe(opcode: u8, cid: u16, nsid: u32, cdw: &[(usize, u32)]) -> Sqe {
        let mut s = Sqe([0; 64]);
        s.0[0] = opcode;
        s.0[2..4].copy_from_slice(&cid.to_le_bytes());
        s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        for &(n, v) in cdw {
            s.0[40 + (n - 10) * 4..44 + (n - 10) * 4].copy_from_slice(&v.to_le_bytes());
        }
        s
    }

    fn property_set(cid: u16, offset: u32, value: u64) -> Sqe {
        let mut s = sqe(OPC_FABRICS, cid, 0, &[]);
        s.0[4] = FCTYPE_PROPERTY_SET;
        s.0[44..48].copy_from_slice(&offset.to_le_bytes());
        s.0[48..56].copy_from_slice(&value.to_le_bytes());
        s
    }

    fn property_get(cid: u16, offset: u32, eight_bytes: bool) -> Sqe {
        let mut s = sqe(OPC_FABRICS, cid, 0, &[]);
        s.0[4] = FCTYPE_PROPERTY_GET;
        s.0[40] = u8::from(eight_bytes);
        s.0[44..48].copy_from_slice(&offset.to_le_bytes());
        s
    }

    /// CC as Linux writes it to enable: EN, IOSQES 6, IOCQES 4.
    const CC_ENABLE: u64 = 1 | (6 << 16) | (4 << 20);

    fn enabled(kind: SubsystemKind, now: Instant) -> Controller {
        let mut c = Controller::new(config(kind), now);
        let view = if kind == SubsystemKind::Nvme { nvm_view() } else { discovery_view() };
        assert_eq!(c.admin(&property_set(1, 0x14, CC_ENABLE), &[], &view, now), complete(1, Status::SUCCESS));
        assert!(c.ready());
        c
    }

    fn status_of(r: &AdminResult) -> Status {
        match r {
            AdminResult::Complete { cqe, .. } | AdminResult::Complete2 { cqe, .. } => cqe.status,
            AdminResult::Parked => panic!("parked"),
        }
    }

    fn data_of(r: AdminResult) -> Vec<u8> {
        match r {
            AdminResult::Complete { cqe, data } => {
                assert!(cqe.status.is_success(), "{cqe:?}");
                data
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn success_completions_do_not_say_do_not_retry() {
        // Linux reads any nonzero status (DNR included) of an admin command as a failure.
        assert_eq!(Cqe::new(1, Status::SUCCESS).to_bytes()[14..16], [0, 0]);
    }

    #[test]
    fn bring_up_like_linux() {
        let now = Instant::now();
        let mut c = Controller::new(config(SubsystemKind::Nvme), now);
        let view = nvm_view();
        // Before CC.EN: only fabrics commands.
        let id = sqe(ADMIN_IDENTIFY, 2, 0, &[(10, 1)]);
        assert_eq!(status_of(&c.admin(&id, &[], &view, now)), Status::generic(SC_COMMAND_SEQUENCE_ERROR));
        match c.admin(&property_get(3, 0, true), &[], &view, now) {
            AdminResult::Complete { cqe, .. } => {
                assert_eq!(cqe.cid, 3);
                assert_eq!(cqe.dw0 & 0xFFFF, 127);
                assert_eq!(cqe.dw1 >> 5 & 1, 1, "CSS NVM (bit 37)");
            }
            other => panic!("{other:?}"),
        }
        match c.admin(&property_get(4, 8, false), &[], &view, now) {
            AdminResult::Complete { cqe, .. } => assert_eq!((cqe.dw0, cqe.dw1), (0x0001_0300, 0)),
            other => panic!("{other:?}"),
        }
        assert!(!c.ready());
        assert_eq!(status_of(&c.admin(&property_set(5, 0x14, CC_ENABLE), &[], &view, now)), Status::SUCCESS);
        assert!(c.ready());
        match c.admin(&property_get(6, 0x1C, false), &[], &view, now) {
            AdminResult::Complete { cqe, .. } => assert_eq!(cqe.dw0, 1, "CSTS.RDY"),
            other => panic!("{other:?}"),
        }
        let data = data_of(c.admin(&id, &[], &view, now));
        assert_eq!(data.len(), 4096);
        assert_eq!(u16::from_le_bytes([data[78], data[79]]), 7, "CNTLID matches Connect's");
        // Shutdown: answered, SHST complete, no teardown (the host polls CSTS next).
        let shn = property_set(7, 0x14, CC_ENABLE | (1 << 14));
        assert_eq!(c.admin(&shn, &[], &view, now), complete(7, Status::SUCCESS));
        match c.admin(&property_get(8, 0x1C, false), &[], &view, now) {
            AdminResult::Complete { cqe, .. } => assert_eq!((cqe.dw0 >> 2) & 3, 0b10),
            other => panic!("{other:?}"),
        }
        assert!(!c.ready());
    }

    #[test]
    fn bad_properties_and_fabrics_commands() {
        let now = Instant::now();
        let mut c = Controller::new(config(SubsystemKind::Nvme), now);
        let view = nvm_view();
        let bad_cc = property_set(1, 0x14, 1 | (7 << 16) | (4 << 20));
        assert_eq!(status_of(&c.admin(&bad_cc, &[], &view, now)), Status::generic(SC_INVALID_FIELD));
        assert!(!c.ready());
        assert_eq!(
            status_of(&c.admin(&property_get(2, 0x100, false), &[], &view, now)),
            Status::generic(SC_INVALID_FIELD)
        );
        let mut connect = sqe(OPC_FABRICS, 3, 0, &[]);
        connect.0[4] = FCTYPE_CONNECT;
        assert_eq!(
            status_of(&c.admin(&connect, &[], &view, now)),
            Status::generic(SC_COMMAND_SEQUENCE_ERROR)
        );
        let mut auth = sqe(OPC_FABRICS, 4, 0, &[]);
        auth.0[4] = 0x05;
        assert_eq!(status_of(&c.admin(&auth, &[], &view, now)), Status::generic(SC_INVALID_OPCODE));
        let mut disconnect = sqe(OPC_FABRICS, 5, 0, &[]);
        disconnect.0[4] = FCTYPE_DISCONNECT;
        assert_eq!(
            c.admin(&disconnect, &[], &view, now),
            AdminResult::Complete2 { cqe: Cqe::new(5, Status::SUCCESS), teardown: true }
        );
    }

    #[test]
    fn identify_namespaces_and_lists() {
        let now = Instant::now();
        let mut c = enabled(SubsystemKind::Nvme, now);
        let view = nvm_view();
        let ns = data_of(c.admin(&sqe(ADMIN_IDENTIFY, 1, 3, &[(10, 0)]), &[], &view, now));
        assert_eq!(u64::from_le_bytes(ns[0..8].try_into().unwrap()), 256);
        let inactive = data_of(c.admin(&sqe(ADMIN_IDENTIFY, 2, 2, &[(10, 0)]), &[], &view, now));
        assert!(inactive.iter().all(|&b| b == 0));
        for nsid in [0, 33, 0xFFFF_FFFF] {
            let r = c.admin(&sqe(ADMIN_IDENTIFY, 3, nsid, &[(10, 0)]), &[], &view, now);
            assert_eq!(status_of(&r), Status::generic(SC_INVALID_NAMESPACE), "nsid {nsid}");
        }
        let list = data_of(c.admin(&sqe(ADMIN_IDENTIFY, 4, 0, &[(10, 2)]), &[], &view, now));
        assert_eq!(&list[0..12], &[1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        let r = c.admin(&sqe(ADMIN_IDENTIFY, 5, 0xFFFF_FFFE, &[(10, 2)]), &[], &view, now);
        assert_eq!(status_of(&r), Status::generic(SC_INVALID_NAMESPACE));
        let desc = data_of(c.admin(&sqe(ADMIN_IDENTIFY, 6, 1, &[(10, 3)]), &[], &view, now));
        assert_eq!((desc[0], desc[1]), (2, 16));
        let r = c.admin(&sqe(ADMIN_IDENTIFY, 7, 2, &[(10, 3)]), &[], &view, now);
        assert_eq!(status_of(&r), Status::generic(SC_INVALID_NAMESPACE));
        let r = c.admin(&sqe(ADMIN_IDENTIFY, 8, 0, &[(10, 0x1C)]), &[], &view, now);
        assert_eq!(status_of(&r), Status::generic(SC_INVALID_FIELD));
        // CNS 06h: the NVM command set's controller structure (Linux asks); other sets refused.
        let nvm = data_of(c.admin(&sqe(ADMIN_IDENTIFY, 9, 0, &[(10, 6)]), &[], &view, now));
        assert_eq!(nvm.len(), 4096);
        let r = c.admin(&sqe(ADMIN_IDENTIFY, 10, 0, &[(10, 6), (11, 2 << 24)]), &[], &view, now);
        assert_eq!(status_of(&r), Status::generic(SC_INVALID_FIELD), "zoned namespaces");
    }

    #[test]
    fn namespace_change_reaches_a_parked_aer_once() {
        let now = Instant::now();
        let mut c = enabled(SubsystemKind::Nvme, now);
        let view = nvm_view();
        // Enable namespace attribute notices as Linux does.
        let aec = sqe(ADMIN_SET_FEATURES, 2, 0, &[(10, 0x0B), (11, 1 << 8)]);
        assert_eq!(status_of(&c.admin(&aec, &[], &view, now)), Status::SUCCESS);
        assert_eq!(
            c.admin(&sqe(ADMIN_ASYNC_EVENT_REQUEST, 40, 0, &[]), &[], &view, now),
            AdminResult::Parked
        );
        let cqe = c.namespace_changed(3).expect("parked AER completes");
        assert_eq!((cqe.cid, cqe.dw0, cqe.status), (40, 0x0004_0002, Status::SUCCESS));
        // Masked until the log is read: a second change is only recorded.
        assert_eq!(
            c.admin(&sqe(ADMIN_ASYNC_EVENT_REQUEST, 41, 0, &[]), &[], &view, now),
            AdminResult::Parked
        );
        assert_eq!(c.namespace_changed(1), None);
        // Read with RAE set: the list empties, the event stays masked.
        let peek = sqe(ADMIN_GET_LOG_PAGE, 3, 0xFFFF_FFFF, &[(10, 0x04 | (1 << 15) | (1023 << 16))]);
        let log = data_of(c.admin(&peek, &[], &view, now));
        assert_eq!(log.len(), 4096);
        assert_eq!(&log[0..12], &[1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(c.namespace_changed(1), None);
        // Read with RAE cleared (as Linux reads it): the list empties and the next change
        // reports.
        let read = sqe(ADMIN_GET_LOG_PAGE, 4, 0xFFFF_FFFF, &[(10, 0x04 | (1023 << 16))]);
        let log = data_of(c.admin(&read, &[], &view, now));
        assert_eq!(&log[0..8], &[1, 0, 0, 0, 0, 0, 0, 0], "only what changed since the last read");
        let log = data_of(c.admin(&read, &[], &view, now));
        assert!(log.iter().all(|&b| b == 0), "cleared on read");
        assert_eq!(c.namespace_changed(3).map(|q| q.cid), Some(41));
    }

    #[test]
    fn events_without_config_are_not_reported_and_parked_are_aborted() {
        let now = Instant::now();
        let mut c = enabled(SubsystemKind::Nvme, now);
        let view = nvm_view();
        for cid in 0..4 {
            assert_eq!(
                c.admin(&sqe(ADMIN_ASYNC_EVENT_REQUEST, cid, 0, &[]), &[], &view, now),
                AdminResult::Parked
            );
        }
        let r = c.admin(&sqe(ADMIN_ASYNC_EVENT_REQUEST, 9, 0, &[]), &[], &view, now);
        assert_eq!(status_of(&r), Status::command_specific(SC_ASYNC_EVENT_LIMIT_EXCEEDED));
        assert_eq!(c.namespace_changed(1), None, "notices not enabled");
        assert_eq!(c.discovery_changed(), None, "not a discovery controller");
        let aborted = c.take_parked();
        assert_eq!(aborted.iter().map(|q| q.cid).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert!(aborted.iter().all(|q| q.status == Status::generic(0x08)));
    }

    #[test]
    fn discovery_controller_serves_its_log_and_change_event() {
        let now = Instant::now();
        let mut c = enabled(SubsystemKind::Discovery, now);
        let view = discovery_view();
        // Linux reads the header first, then the whole page.
        let header = sqe(ADMIN_GET_LOG_PAGE, 1, 0, &[(10, 0x70 | (1 << 15) | (3 << 16))]);
        let h = data_of(c.admin(&header, &[], &view, now));
        assert_eq!(h.len(), 16);
        assert_eq!(u64::from_le_bytes(h[0..8].try_into().unwrap()), 5);
        assert_eq!(u64::from_le_bytes(h[8..16].try_into().unwrap()), 2);
        let numd = (3 * 1024 / 4 - 1) as u32;
        let all = sqe(ADMIN_GET_LOG_PAGE, 2, 0, &[(10, 0x70 | (numd << 16))]);
        assert_eq!(data_of(c.admin(&all, &[], &view, now)).len(), 3072);
        // Second entry alone, by offset.
        let second = sqe(ADMIN_GET_LOG_PAGE, 3, 0, &[(10, 0x70 | (255 << 16)), (12, 2048)]);
        let e = data_of(c.admin(&second, &[], &view, now));
        assert_eq!((e.len(), e[2]), (1024, 3));
        let past = sqe(ADMIN_GET_LOG_PAGE, 4, 0, &[(10, 0x70), (12, 4096)]);
        assert_eq!(status_of(&c.admin(&past, &[], &view, now)), Status::generic(SC_INVALID_FIELD));
        let smart = sqe(ADMIN_GET_LOG_PAGE, 5, 0, &[(10, 0x02 | (127 << 16))]);
        assert_eq!(
            status_of(&c.admin(&smart, &[], &view, now)),
            Status::command_specific(SC_INVALID_LOG_PAGE)
        );
        let ns = sqe(ADMIN_IDENTIFY, 6, 1, &[(10, 0)]);
        assert_eq!(status_of(&c.admin(&ns, &[], &view, now)), Status::generic(SC_INVALID_FIELD));
        // Discovery log change notices.
        let aec = sqe(ADMIN_SET_FEATURES, 7, 0, &[(10, 0x0B), (11, 1 << 31)]);
        assert_eq!(status_of(&c.admin(&aec, &[], &view, now)), Status::SUCCESS);
        assert_eq!(c.admin(&sqe(ADMIN_ASYNC_EVENT_REQUEST, 8, 0, &[]), &[], &view, now), AdminResult::Parked);
        assert_eq!(c.namespace_changed(1), None);
        let cqe = c.discovery_changed().unwrap();
        assert_eq!((cqe.cid, cqe.dw0), (8, 0x0070_F002));
        assert_eq!(c.io_queues_allowed(), 0);
    }

    #[test]
    fn smart_and_error_logs() {
        let now = Instant::now();
        let mut c = enabled(SubsystemKind::Nvme, now);
        let view = nvm_view();
        let smart = data_of(c.admin(
            &sqe(ADMIN_GET_LOG_PAGE, 1, 0xFFFF_FFFF, &[(10, 0x02 | (127 << 16))]),
            &[],
            &view,
            now,
        ));
        assert_eq!((smart.len(), smart[0], smart[3], smart[4]), (512, 0, 100, 10));
        let err =
            data_of(c.admin(&sqe(ADMIN_GET_LOG_PAGE, 2, 0, &[(10, 0x01 | (15 << 16))]), &[], &view, now));
        assert_eq!(err, vec![0; 64]);
        let disc = sqe(ADMIN_GET_LOG_PAGE, 3, 0, &[(10, 0x70)]);
        assert_eq!(
            status_of(&c.admin(&disc, &[], &view, now)),
            Status::command_specific(SC_INVALID_LOG_PAGE)
        );
    }

    #[test]
    fn keep_alive_timer_and_expiry() {
        let t0 = Instant::now();
        let mut c = enabled(SubsystemKind::Nvme, t0);
        let view = nvm_view();
        assert_eq!(c.keep_alive_timeout(), Some(Duration::from_millis(5000)));
        assert!(!c.keep_alive_expired(t0 + Duration::from_millis(5900)));
        let t1 = t0 + Duration::from_millis(5500);
        assert_eq!(c.admin(&sqe(ADMIN_KEEP_ALIVE, 1, 0, &[]), &[], &view, t1), complete(1, Status::SUCCESS));
        assert!(!c.keep_alive_expired(t1 + Duration::from_millis(6000)));
        assert!(c.keep_alive_expired(t1 + Duration::from_millis(6001)));
        // Set Features KATO to 1 s at t1: expiry counts from then with the new value.
        let kato = sqe(ADMIN_SET_FEATURES, 2, 0, &[(10, 0x0F), (11, 1000)]);
        assert_eq!(status_of(&c.admin(&kato, &[], &view, t1)), Status::SUCCESS);
        assert!(c.keep_alive_expired(t1 + Duration::from_millis(2001)));
        let off = sqe(ADMIN_SET_FEATURES, 3, 0, &[(10, 0x0F), (11, 0)]);
        assert_eq!(status_of(&c.admin(&off, &[], &view, t1)), Status::SUCCESS);
        assert!(!c.keep_alive_expired(t1 + Duration::from_secs(3600)));
    }

    #[test]
    fn queues_abort_and_unknown_opcodes() {
        let now = Instant::now();
        let mut c = enabled(SubsystemKind::Nvme, now);
        let view = nvm_view();
        assert_eq!(c.io_queues_allowed(), 127);
        let nq = sqe(ADMIN_SET_FEATURES, 1, 0, &[(10, 0x07), (11, 1 | (1 << 16))]);
        match c.admin(&nq, &[], &view, now) {
            AdminResult::Complete { cqe, .. } => assert_eq!(cqe.dw0, 1 | (1 << 16)),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.io_queues_allowed(), 2);
        match c.admin(&sqe(ADMIN_ABORT, 2, 0, &[(10, 5 << 16)]), &[], &view, now) {
            AdminResult::Complete { cqe, .. } => assert_eq!((cqe.dw0 & 1, cqe.status), (1, Status::SUCCESS)),
            other => panic!("{other:?}"),
        }
        for opc in [0x00, 0x01, 0x05, 0x0D, 0x10, 0x80, 0xFF] {
            let r = c.admin(&sqe(opc, 3, 0, &[]), &[], &view, now);
            assert_eq!(status_of(&r), Status::generic(SC_INVALID_OPCODE), "opcode {opc:#x}");
        }
        let mut fused = sqe(ADMIN_IDENTIFY, 4, 0, &[(10, 1)]);
        fused.0[1] = 1;
        assert_eq!(status_of(&c.admin(&fused, &[], &view, now)), Status::generic(SC_INVALID_FIELD));
        let get_host = sqe(ADMIN_GET_FEATURES, 5, 0, &[(10, 0x81), (11, 1)]);
        assert_eq!(data_of(c.admin(&get_host, &[], &view, now)), vec![0xAB; 16]);
    }

    #[test]
    fn reset_starts_features_and_events_over() {
        let now = Instant::now();
        let mut c = enabled(SubsystemKind::Nvme, now);
        let view = nvm_view();
        let aec = sqe(ADMIN_SET_FEATURES, 2, 0, &[(10, 0x0B), (11, 1 << 8)]);
        assert_eq!(status_of(&c.admin(&aec, &[], &view, now)), Status::SUCCESS);
        assert_eq!(c.admin(&sqe(ADMIN_ASYNC_EVENT_REQUEST, 3, 0, &[]), &[], &view, now), AdminResult::Parked);
        assert_eq!(status_of(&c.admin(&property_set(4, 0x14, 0), &[], &view, now)), Status::SUCCESS);
        assert!(!c.ready());
        assert_eq!(c.parked(), 1, "kept: it holds an engine slot until answered");
        assert_eq!(c.namespace_changed(1), None, "configuration back to default");
        assert_eq!(c.take_parked().iter().map(|q| q.cid).collect::<Vec<_>>(), vec![3]);
    }
}
