//! The target's state the control plane shares with the listeners' handshake threads: the
//! reactors, the transport, the subsystems and the bounds queue pairs take.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fp_conn::uring::SocketImpl;
use fp_nvme_spec::fabrics::DISCOVERY_NQN;
use fp_reactor::ReactorHandle;

use crate::options::{TargetOptions, TransportOptions};
use crate::subsystem::{lock, Subsystem};

/// The target's state, shared with the listener and handshake threads.
pub(crate) struct TargetInner {
    pub reactors: Vec<ReactorHandle>,
    pub options: TargetOptions,
    pub transport: Mutex<Option<TransportOptions>>,
    pub subsystems: Mutex<BTreeMap<String, Arc<Subsystem>>>,
    pub discovery: Arc<Subsystem>,
    /// [`crate::DRAIN_TIMEOUT`] or what [`crate::NvmfTarget::set_drain_timeout`] set, in milliseconds.
    pub drain_timeout_ms: AtomicU64,
    /// [`crate::CLOSE_TIMEOUT`] or what [`crate::NvmfTarget::set_close_timeout`] set, in
    /// milliseconds: taken by each queue pair when it connects.
    pub close_timeout_ms: AtomicU64,
    /// Set by [`crate::NvmfTarget::stop`]: every drain after it ends by then, so a daemon going down
    /// with several namespaces whose I/O is stuck waits one drain bound, not one each.
    pub stop_deadline: Mutex<Option<Instant>>,
    /// The socket implementation of listeners that name none
    /// ([`crate::NvmfTarget::set_sock_impl`]).
    pub sock_impl: Mutex<SocketImpl>,
    /// The hashes and DH groups DH-HMAC-CHAP may use ([`crate::NvmfTarget::set_dhchap_config`]).
    pub dhchap: Arc<Mutex<crate::DhchapConfig>>,
}

impl TargetInner {
    pub(crate) fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        lock(&self.subsystems).get(nqn).cloned()
    }
}
