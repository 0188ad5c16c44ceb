//! Fuzz the NVMe-oF controller model (`fp_nvmf::Controller`): a sequence of arbitrary admin
//! commands (64-byte submission queue entries with in-capsule data) into one controller, an NVM
//! controller over a fixed two-namespace subsystem (with or without ANA reporting) or a discovery
//! controller over a fixed three-entry discovery log, interleaved with namespace, ANA state and
//! discovery log changes and with time passing for the keep-alive timer.
//!
//! Input encoding (missing bytes read as 0):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | setup: `b & 1` a discovery controller; `b >> 1 & 7` × 1000 ms is Connect's KATO; `b >> 4 & 1` ANA reporting (NVM), `b >> 5` the ANA state code of group 1 |
//!
//! then records until the input ends:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | control `c`: `c & 3` = 0: an admin command: 64 bytes of SQE, 1 byte data length L, L bytes of data; 1: the namespace `c >> 2 & 3` changed; 2: the discovery log changed (discovery) or the ANA states (NVM); 3: `c >> 2` × 100 ms pass |
//!
//! Checked: no panic; a completion answers the command's CID; only an Asynchronous Event
//! Request parks, at most AERL + 1 at once, and event completions and `take_parked` answer
//! exactly the parked CIDs, oldest first, each once (a reset keeps them), and `parked` counts
//! them; only Disconnect tears down; a failed command returns no data; Identify returns 4096
//! bytes at most, Get Log Page at most NUMD dwords and at most the transfer limit, Get Features
//! at most the 16-byte host identifier, anything else nothing; `io_queues_allowed` stays within
//! the configured maximum (0 for discovery); a controller that just heard a command has not
//! timed out; `ready` implies CSTS.RDY.
//!
//! `FP_FUZZ_TRACE=1` prints each command and its outcome.
#![no_main]

use std::time::{Duration, Instant};

use fp_nvmf::identify::AERL;
use fp_nvme_spec::fabrics::DISCOVERY_NQN;
use fp_nvme_spec::log_page::LogRequest;
use fp_nvme_spec::log_page::AnaState;
use fp_nvmf::model::{AnaStates, DiscoveryEntry, NamespaceInfo, SubsystemKind, SubsystemView};
use fp_nvme_spec::*;
use fp_nvmf::{AdminResult, Controller, ControllerConfig};
use libfuzzer_sys::fuzz_target;

const MAX_TRANSFER: u32 = 131072;
const MAX_IO_QUEUES: u16 = 8;

fn config(kind: SubsystemKind, kato_ms: u32) -> ControllerConfig {
    ControllerConfig {
        cntlid: 1,
        kind,
        subnqn: "nqn.2024-01.io.flashpath:fuzz".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:fuzz".into(),
        hostid: [0x5A; 16],
        max_queue_entries: 128,
        max_admin_queue_entries: 32,
        max_io_queues: MAX_IO_QUEUES,
        in_capsule_data_size: 4096,
        max_transfer_bytes: MAX_TRANSFER,
        kato_ms,
    }
}

fn namespace(nsid: u32, block_size: u32, shift: u8) -> NamespaceInfo {
    NamespaceInfo {
        nsid,
        block_size,
        num_blocks: 1 << shift,
        uuid: [nsid as u8; 16],
        nguid: if nsid == 1 { [0x22; 16] } else { [0; 16] },
        eui64: if nsid == 1 { [0; 8] } else { [0x33; 8] },
        read_only: nsid != 1,
        volatile_cache: nsid != 1,
        deallocate: nsid == 1,
        write_zeroes: true,
        anagrpid: nsid,
    }
}

/// `ana_state`: group 1's state code (reporting ANA), `None`: no ANA reporting.
fn nvm_view(ana_state: Option<u8>) -> SubsystemView {
    let mut ana = AnaStates::new(32, AnaState::Optimized);
    if let Some(state) = ana_state.and_then(AnaState::from_code) {
        ana.states[0] = state;
    }
    SubsystemView {
        kind: SubsystemKind::Nvme,
        nqn: "nqn.2024-01.io.flashpath:fuzz".into(),
        serial: "FUZZ0001".into(),
        model: "flashpath fuzz".into(),
        max_namespaces: 32,
        namespaces: vec![namespace(1, 512, 20), namespace(2, 4096, 10)],
        discovery_log: Vec::new(),
        generation: 0,
        ana_reporting: ana_state.is_some(),
        ana,
    }
}

/// Three entries: the NVM subsystem on an IPv4 and an IPv6 listener, and the discovery
/// subsystem itself.
fn discovery_view() -> SubsystemView {
    let listeners = [(1, 1, "127.0.0.1", "4420"), (2, 2, "::1", "4421"), (1, 1, "127.0.0.1", "4420")];
    let nqns =
        [("nqn.2024-01.io.flashpath:fuzz", 2), ("nqn.2024-01.io.flashpath:fuzz", 2), (DISCOVERY_NQN, 3)];
    let discovery_log = listeners
        .iter()
        .zip(nqns)
        .map(|(&(adrfam, port_id, traddr, trsvcid), (subnqn, subtype))| DiscoveryEntry {
            adrfam,
            subtype,
            port_id,
            traddr: traddr.into(),
            trsvcid: trsvcid.into(),
            subnqn: subnqn.into(),
        })
        .collect();
    SubsystemView {
        kind: SubsystemKind::Discovery,
        nqn: DISCOVERY_NQN.into(),
        serial: "FUZZDISC".into(),
        model: "flashpath discovery".into(),
        max_namespaces: 0,
        namespaces: Vec::new(),
        discovery_log,
        generation: 3,
        ana_reporting: false,
        ana: AnaStates::default(),
    }
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.0[..n.min(self.0.len())].to_vec();
        self.0 = &self.0[v.len()..];
        v.resize(n, 0);
        v
    }
}

/// The most data a successful command may return.
fn data_limit(sqe: &Sqe) -> usize {
    match sqe.opcode() {
        ADMIN_IDENTIFY => 4096,
        ADMIN_GET_LOG_PAGE => {
            let req = LogRequest::from_sqe(sqe);
            (req.numd.saturating_mul(4)).min(u64::from(MAX_TRANSFER)) as usize
        }
        ADMIN_GET_FEATURES => 16,
        _ => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let setup = input.byte();
    let kind = if setup & 1 != 0 { SubsystemKind::Discovery } else { SubsystemKind::Nvme };
    let kato_ms = u32::from((setup >> 1) & 7) * 1000;
    let ana_state = (setup & 0x10 != 0).then_some(setup >> 5);
    let view = if kind == SubsystemKind::Discovery { discovery_view() } else { nvm_view(ana_state) };
    let mut now = Instant::now();
    let mut c = Controller::new(config(kind, kato_ms), now);
    assert_eq!(c.cntlid(), 1);
    // CIDs of parked requests, oldest first (a host may reuse a CID: it is listed twice).
    let mut parked: Vec<u16> = Vec::new();

    while !input.0.is_empty() {
        let ctl = input.byte();
        match ctl & 3 {
            0 => {
                let raw: [u8; SQE_LEN] = input.bytes(SQE_LEN).try_into().unwrap();
                let sqe = Sqe::from_bytes(&raw);
                let len = usize::from(input.byte());
                let data_in = input.bytes(len);
                let result = c.admin(&sqe, &data_in, &view, now);
                if std::env::var_os("FP_FUZZ_TRACE").is_some() {
                    match &result {
                        AdminResult::Complete { cqe, data } => eprintln!(
                            "{sqe:?} fctype {:#x} cdw10 {:#x}: {:?} dw0 {:#x} dw1 {:#x}, {} bytes",
                            sqe.fctype(),
                            sqe.cdw(10),
                            cqe.status,
                            cqe.dw0,
                            cqe.dw1,
                            data.len()
                        ),
                        other => eprintln!("{sqe:?}: {other:?}"),
                    }
                }
                assert!(!c.keep_alive_expired(now), "a command was just heard");
                match result {
                    AdminResult::Complete { cqe, data } => {
                        assert_eq!(cqe.cid, sqe.cid());
                        if !cqe.status.is_success() {
                            assert!(data.is_empty(), "failed {sqe:?} returned {} bytes", data.len());
                        }
                        // An AER answered at once reports a pending event: its dword 0 is a
                        // notice for the namespace list, the ANA states or the discovery log.
                        if sqe.opcode() == ADMIN_ASYNC_EVENT_REQUEST && cqe.status.is_success() {
                            assert!(matches!(cqe.dw0, 0x0004_0002 | 0x000C_0302 | 0x0070_F002), "{:#x}", cqe.dw0);
                        }
                        assert!(data.len() <= data_limit(&sqe), "{sqe:?} returned {} bytes", data.len());
                        if sqe.opcode() == OPC_FABRICS
                            && sqe.fctype() == FCTYPE_PROPERTY_GET
                            && cqe.status.is_success()
                            && sqe.0[44..48] == [0x1C, 0, 0, 0]
                            && c.ready()
                        {
                            assert_eq!(cqe.dw0 & 1, 1, "ready but CSTS.RDY clear");
                        }
                    }
                    AdminResult::Parked => {
                        assert_eq!(sqe.opcode(), ADMIN_ASYNC_EVENT_REQUEST);
                        parked.push(sqe.cid());
                        assert!(parked.len() <= usize::from(AERL) + 1);
                    }
                    AdminResult::Complete2 { cqe, teardown } => {
                        assert_eq!((sqe.opcode(), sqe.fctype()), (OPC_FABRICS, FCTYPE_DISCONNECT));
                        assert_eq!(cqe.cid, sqe.cid());
                        if teardown {
                            break;
                        }
                    }
                }
            }
            1 | 2 => {
                let cqe = if ctl & 3 == 1 {
                    c.namespace_changed(u32::from((ctl >> 2) & 3))
                } else if kind == SubsystemKind::Discovery {
                    c.discovery_changed()
                } else {
                    c.ana_changed()
                };
                if let Some(cqe) = cqe {
                    let at = parked.iter().position(|&p| p == cqe.cid).expect("completes a parked request");
                    assert_eq!(at, 0, "the oldest parked request answers first");
                    parked.remove(at);
                    assert!(cqe.status.is_success());
                }
            }
            _ => now += Duration::from_millis(u64::from(ctl >> 2) * 100),
        }
        assert_eq!(c.parked(), parked.len());
        assert!(c.io_queues_allowed() <= if kind == SubsystemKind::Discovery { 0 } else { MAX_IO_QUEUES });
    }
    let aborted: Vec<u16> = c.take_parked().iter().map(|q| q.cid).collect();
    assert_eq!(aborted, parked, "every parked request aborted once, in order");
    assert!(c.take_parked().is_empty());
});
