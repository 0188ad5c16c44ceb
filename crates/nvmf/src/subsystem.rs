//! A subsystem's shared state: what the control plane sets (hosts, listeners, namespaces), the
//! controllers connected to it and where their queue pairs run, and the [`SubsystemView`] its
//! controllers answer from. The control plane and the handshake threads take its lock; a queue
//! pair on a reactor reads only an atomic generation per round and takes the lock when it
//! moved (a namespace came or went), so the I/O path never locks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fp_bdev::Bdev;
use fp_reactor::{PollerId, ReactorHandle};

use crate::model::{AnaStates, NamespaceInfo, SubsystemKind, SubsystemView};
use crate::options::ListenAddress;

/// Locks, ignoring poison: every critical section leaves the state consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One namespace's I/O counters kept by one queue pair (written only by it).
#[derive(Debug, Default)]
pub(crate) struct NsCounters {
    pub read_ops: AtomicU64,
    pub write_ops: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub other_ops: AtomicU64,
    pub errors: AtomicU64,
}

impl NsCounters {
    fn add_to(&self, t: &mut [u64; 6]) {
        let all = [
            &self.read_ops,
            &self.write_ops,
            &self.bytes_read,
            &self.bytes_written,
            &self.other_ops,
            &self.errors,
        ];
        for (sum, c) in t.iter_mut().zip(all) {
            *sum += c.load(Ordering::Relaxed);
        }
    }

    pub(crate) fn bump(c: &AtomicU64, by: u64) {
        // Written by one thread only: a load and a store, no locked instruction.
        c.store(c.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
    }
}

/// A namespace: its bdev and identifiers, and the counters of every queue pair that used it.
pub(crate) struct Namespace {
    pub nsid: u32,
    pub bdev: Bdev,
    pub bdev_name: String,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub read_only: bool,
    /// Its ANA group, 1 to the subsystem's max_namespaces; changed under the subsystem's lock
    /// (`nvmf_subsystem_set_ns_ana_group`), read by queue pairs when they reload.
    anagrpid: AtomicU32,
    /// Counters of live queue pairs, and the sums of those gone.
    counters: Mutex<(Vec<Arc<NsCounters>>, [u64; 6])>,
}

impl Namespace {
    pub(crate) fn new(
        nsid: u32,
        bdev: Bdev,
        bdev_name: String,
        (uuid, nguid, eui64): ([u8; 16], [u8; 16], [u8; 8]),
        read_only: bool,
        anagrpid: u32,
    ) -> Namespace {
        Namespace {
            nsid,
            bdev,
            bdev_name,
            uuid,
            nguid,
            eui64,
            read_only,
            anagrpid: AtomicU32::new(anagrpid),
            counters: Mutex::new((Vec::new(), [0; 6])),
        }
    }

    /// Its ANA group.
    pub(crate) fn anagrpid(&self) -> u32 {
        self.anagrpid.load(Ordering::Relaxed)
    }

    /// Moves it to ANA group `anagrpid` (the caller holds the subsystem's lock and tells the
    /// queue pairs).
    pub(crate) fn set_anagrpid(&self, anagrpid: u32) {
        self.anagrpid.store(anagrpid, Ordering::Relaxed);
    }

    /// Counters for a queue pair that starts using the namespace. Those of queue pairs gone
    /// are folded into the sums, so the list does not grow with reconnections.
    pub(crate) fn counters(&self) -> Arc<NsCounters> {
        let mut g = lock(&self.counters);
        let (live, gone) = &mut *g;
        live.retain(|c| {
            if Arc::strong_count(c) == 1 {
                c.add_to(gone);
                false
            } else {
                true
            }
        });
        let c = Arc::new(NsCounters::default());
        live.push(c.clone());
        c
    }

    /// read_ops, write_ops, bytes_read, bytes_written, other_ops, errors.
    pub(crate) fn totals(&self) -> [u64; 6] {
        let g = lock(&self.counters);
        let mut t = g.1;
        for c in &g.0 {
            c.add_to(&mut t);
        }
        t
    }

    pub(crate) fn info(&self) -> NamespaceInfo {
        let bi = self.bdev.info();
        NamespaceInfo {
            nsid: self.nsid,
            block_size: bi.block_size,
            num_blocks: bi.num_blocks(),
            uuid: self.uuid,
            nguid: self.nguid,
            eui64: self.eui64,
            read_only: self.read_only || self.bdev.read_only() || !bi.io_types.write,
            volatile_cache: bi.io_types.flush,
            deallocate: bi.io_types.unmap,
            write_zeroes: bi.io_types.write_zeroes,
            anagrpid: self.anagrpid(),
        }
    }
}

/// Where a queue pair's poller runs.
#[derive(Clone)]
pub(crate) struct QpairRef {
    pub reactor: ReactorHandle,
    pub id: PollerId,
    pub listen: ListenAddress,
    /// The hash and DH group of the queue's last DH-HMAC-CHAP transaction, if it has one.
    pub auth: Option<(fp_nvme_spec::auth::HashId, fp_nvme_spec::auth::DhGroupId)>,
}

/// What a controller's queue pairs and the handshake threads share about it.
#[derive(Debug)]
pub(crate) struct CtrlShared {
    pub cntlid: u16,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// CC.EN and CSTS.RDY: I/O queues may connect (set by the admin queue pair).
    pub ready: AtomicBool,
    /// I/O queues the host may create (set by the admin queue pair).
    pub io_queues_allowed: AtomicU16,
    /// The controller is going away: no new I/O queue joins it.
    pub gone: AtomicBool,
}

/// A controller's entry: its queue pairs once they run.
pub(crate) struct CtrlEntry {
    pub shared: Arc<CtrlShared>,
    pub admin: Option<QpairRef>,
    pub io: BTreeMap<u16, QpairRef>,
    /// I/O queue IDs connected and on their way to a reactor.
    pub reserved: BTreeSet<u16>,
}

/// What the control plane sets and the connections read, under the subsystem's lock.
pub(crate) struct SubState {
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: BTreeSet<String>,
    /// The DH-HMAC-CHAP keys of the listed hosts that must authenticate.
    pub host_keys: BTreeMap<String, crate::DhchapKeys>,
    /// Every host must authenticate: a host without keys is not allowed.
    pub require_dhchap: bool,
    /// The TLS PSKs of the listed hosts that may connect through a secure listener.
    pub host_psks: BTreeMap<String, crate::HostPsk>,
    pub max_namespaces: u32,
    pub min_cntlid: u16,
    pub max_cntlid: u16,
    pub listeners: Vec<ListenAddress>,
    /// Those of `listeners` that accept TLS only (`secure_channel`).
    pub secure_listeners: BTreeSet<ListenAddress>,
    /// The controllers report ANA (SPDK's `ana_reporting`).
    pub ana_reporting: bool,
    /// Each listener's ANA states (one entry per listener in `listeners`).
    pub ana: BTreeMap<ListenAddress, AnaStates>,
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
    pub controllers: BTreeMap<u16, CtrlEntry>,
    pub next_cntlid: u16,
    /// Deleted: Connects are refused, its queue pairs are closing.
    pub deleted: bool,
    /// I/O queues whose controller went away (its admin queue closed) while they close:
    /// they may still hold commands on a namespace's device, so drains wait for them too.
    /// Each leaves the list when it finishes (by controller ID, queue ID and poller).
    pub orphans: Vec<(u16, u16, QpairRef)>,
}

impl SubState {
    pub(crate) fn host_allowed(&self, hostnqn: &str) -> bool {
        if self.require_dhchap {
            // The settings keep such a host off the list; this holds whatever they let through.
            return self.host_keys.contains_key(hostnqn);
        }
        self.allow_any_host || self.hosts.contains(hostnqn)
    }

    /// A controller ID in `[min_cntlid, max_cntlid]` not in use, round robin.
    pub(crate) fn allocate_cntlid(&mut self) -> Option<u16> {
        let span = u32::from(self.max_cntlid - self.min_cntlid) + 1;
        for _ in 0..span {
            let c = self.next_cntlid.clamp(self.min_cntlid, self.max_cntlid);
            self.next_cntlid = if c >= self.max_cntlid { self.min_cntlid } else { c + 1 };
            if !self.controllers.contains_key(&c) {
                return Some(c);
            }
        }
        None
    }

    /// The ANA state queues that came in on `listen` give I/O to `ns`: `None` when I/O is
    /// served (always, without ANA reporting), else the path status it fails with.
    pub(crate) fn ana_status(&self, listen: &ListenAddress, ns: &Namespace) -> Option<fp_nvme_spec::Status> {
        if !self.ana_reporting {
            return None;
        }
        self.ana.get(listen).and_then(|a| a.get(ns.anagrpid()).io_status())
    }

    /// Every queue pair of every controller.
    pub(crate) fn qpairs(&self) -> Vec<QpairRef> {
        let mut v = Vec::new();
        for c in self.controllers.values() {
            v.extend(c.admin.iter().cloned());
            v.extend(c.io.values().cloned());
        }
        v.extend(self.orphans.iter().map(|(_, _, q)| q.clone()));
        v
    }
}

/// A subsystem.
pub(crate) struct Subsystem {
    pub nqn: String,
    pub kind: SubsystemKind,
    pub state: Mutex<SubState>,
    /// Bumped whenever the namespaces change: queue pairs reload their table.
    pub ns_generation: AtomicU64,
    /// The view controllers answer from, rebuilt on every change; `view_generation` says when.
    view: Mutex<Arc<SubsystemView>>,
    pub view_generation: AtomicU64,
    /// The discovery subsystem: for each log entry, the hosts its subsystem admits (`None`:
    /// any), so a host's log lists only what it may connect to.
    pub discovery_hosts: Mutex<Vec<Option<BTreeSet<String>>>>,
}

impl Subsystem {
    pub(crate) fn new(nqn: String, kind: SubsystemKind, state: SubState) -> Subsystem {
        let view = SubsystemView {
            kind,
            nqn: nqn.clone(),
            serial: state.serial.clone(),
            model: state.model.clone(),
            max_namespaces: state.max_namespaces,
            namespaces: Vec::new(),
            discovery_log: Vec::new(),
            generation: 0,
            ana_reporting: state.ana_reporting,
            ana: AnaStates::default(),
        };
        Subsystem {
            nqn,
            kind,
            state: Mutex::new(state),
            ns_generation: AtomicU64::new(0),
            view: Mutex::new(Arc::new(view)),
            view_generation: AtomicU64::new(0),
            discovery_hosts: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn view(&self) -> Arc<SubsystemView> {
        lock(&self.view).clone()
    }

    /// The view `hostnqn` gets through `listen`: for the discovery subsystem, the log without
    /// the subsystems that do not admit it (as SPDK's discovery service filters it); with ANA
    /// reporting, the listener's ANA states.
    pub(crate) fn view_for(&self, hostnqn: &str, listen: &ListenAddress) -> Arc<SubsystemView> {
        let view = self.view();
        if self.kind != SubsystemKind::Discovery {
            if !view.ana_reporting {
                return view;
            }
            let mut v = (*view).clone();
            v.ana = lock(&self.state).ana.get(listen).cloned().unwrap_or_default();
            return Arc::new(v);
        }
        let hosts = lock(&self.discovery_hosts);
        let admits = |i: usize| hosts.get(i).is_none_or(|h| h.as_ref().is_none_or(|h| h.contains(hostnqn)));
        if (0..view.discovery_log.len()).all(admits) {
            return view;
        }
        let mut v = (*view).clone();
        v.discovery_log = view
            .discovery_log
            .iter()
            .enumerate()
            .filter(|(i, _)| admits(*i))
            .map(|(_, e)| e.clone())
            .collect();
        Arc::new(v)
    }

    /// Rebuilds the view from the state (namespaces, their sizes now); the discovery log is
    /// the caller's (the target's) for the discovery subsystem.
    pub(crate) fn refresh_view(&self, discovery_log: Option<Vec<crate::model::DiscoveryEntry>>) {
        let st = lock(&self.state);
        let mut v = lock(&self.view);
        let generation = v.generation + u64::from(discovery_log.is_some());
        let view = SubsystemView {
            kind: self.kind,
            nqn: self.nqn.clone(),
            serial: st.serial.clone(),
            model: st.model.clone(),
            max_namespaces: st.max_namespaces,
            namespaces: st.namespaces.values().map(|n| n.info()).collect(),
            discovery_log: discovery_log.unwrap_or_else(|| v.discovery_log.clone()),
            generation,
            ana_reporting: st.ana_reporting,
            ana: AnaStates::default(),
        };
        *v = Arc::new(view);
        self.view_generation.fetch_add(1, Ordering::Release);
    }
}
