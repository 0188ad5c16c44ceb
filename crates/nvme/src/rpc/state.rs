//! The module's state in one registry: its controllers by name (each with its paths, one
//! controller each), the bdevs they made, and the namespace registered as each bdev.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::{Arc, Mutex, MutexGuard};

use fp_bdev::module::ModuleHost;

use crate::bdev::NvmeNamespace;
use crate::ctrlr::Controller;
use crate::rpc::params::{family_of, Address, Options};

/// The module's name: its bdevs' `driver`.
pub const MODULE: &str = "nvme";

/// One controller in the module's list.
pub(super) enum Slot {
    /// Being attached or detached by an RPC thread now: the name is taken, nothing else may
    /// act on it.
    Busy,
    /// Attached.
    Attached(Attached),
}

/// The controllers attached under one name: one path, or several with `multipath` (the
/// first is preferred).
pub(super) struct Attached {
    pub(super) paths: Vec<Path>,
}

/// One controller and how it was reached.
pub(super) struct Path {
    pub(super) ctrlr: Arc<dyn Controller>,
    pub(super) address: Address,
    /// The host NQN it was connected with (TCP).
    pub(super) hostnqn: Option<String>,
    /// The keyring key of its TLS PSK (`psk`): every queue of the path runs TLS.
    pub(super) psk: Option<String>,
}

impl Attached {
    /// Every path's namespaces.
    pub(super) fn namespaces(&self) -> Vec<Arc<NvmeNamespace>> {
        self.paths.iter().flat_map(|p| p.ctrlr.namespaces()).collect()
    }
}

/// The module's state in one registry.
pub(super) struct State {
    pub(super) options: Mutex<Options>,
    pub(super) controllers: Mutex<BTreeMap<String, Slot>>,
    /// This daemon's host identifier (NVMe-oF Connect's HOSTID), and the default host NQN's
    /// UUID: made once, as SPDK makes one per process.
    pub(super) hostid: [u8; 16],
    /// Each controller's bdevs in the registry, by controller name: those of its namespaces
    /// now, and those of namespaces gone while their bdev was in use, which stay until the
    /// controller is detached.
    pub(super) bdevs: Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// The namespace registered as each bdev, by bdev name: the one whose paths a multipath
    /// attach extends.
    pub(super) heads: Mutex<BTreeMap<String, Arc<NvmeNamespace>>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn state(host: &dyn ModuleHost) -> Arc<State> {
    let any = host.module_state(MODULE, &|| {
        Arc::new(State {
            options: Mutex::new(Options::default()),
            controllers: Mutex::new(BTreeMap::new()),
            hostid: random_uuid(),
            bdevs: Mutex::new(BTreeMap::new()),
            heads: Mutex::new(BTreeMap::new()),
        })
    });
    any.downcast::<State>().unwrap_or_else(|_| panic!("the {MODULE} module's state"))
}

/// A random (version 4) UUID from the kernel's generator; without /dev/urandom, one from the
/// clock and the process ID, which still differs between daemons.
pub(super) fn random_uuid() -> [u8; 16] {
    let mut id = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut id));
    if read.is_err() {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        id[..12].copy_from_slice(&nanos.to_le_bytes()[..12]);
        id[12..].copy_from_slice(&std::process::id().to_le_bytes());
    }
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

impl State {
    /// Notes (or, with `present` false, forgets) bdev `bdev` of controller `ctrlr`.
    pub(super) fn note_bdev(&self, ctrlr: &str, bdev: &str, present: bool) {
        if !present {
            lock(&self.heads).remove(bdev);
        }
        let mut map = lock(&self.bdevs);
        let set = map.entry(ctrlr.to_string()).or_default();
        if present {
            set.insert(bdev.to_string());
        } else {
            set.remove(bdev);
        }
    }

    /// Controller `ctrlr`'s bdevs that exist now: those noted and those of its namespaces.
    pub(super) fn bdevs_of(
        &self,
        host: &dyn ModuleHost,
        ctrlr: &str,
        namespaces: &[Arc<NvmeNamespace>],
    ) -> Vec<String> {
        let mut names = lock(&self.bdevs).get(ctrlr).cloned().unwrap_or_default();
        names.extend(namespaces.iter().map(|ns| ns.name().to_string()));
        names.into_iter().filter(|n| host.bdev(n).is_some_and(|(_, driver)| driver == MODULE)).collect()
    }
}

/// SPDK's transport ID fields of an address.
pub(super) fn trid_fields(address: &Address) -> Vec<(&'static str, String)> {
    let mut f = vec![("trtype", address.trtype().as_str().to_string()), ("traddr", address.traddr())];
    if let Address::Tcp { traddr, trsvcid, subnqn, .. } = address {
        f.push(("adrfam", family_of(traddr).as_str().to_string()));
        f.push(("trsvcid", trsvcid.to_string()));
        f.push(("subnqn", subnqn.clone()));
    }
    f
}
