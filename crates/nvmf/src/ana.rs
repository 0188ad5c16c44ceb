//! Asymmetric Namespace Access on the target (Base 8.1.3): each listener of a subsystem with
//! ANA reporting holds a state per ANA group; the controllers whose queues came in on it report
//! those states (Identify, the ANA log page) and fail I/O to a namespace whose group is not
//! accessible there with the matching path status. A change reaches the queue pairs on their
//! reactors: the I/O queues reload their namespace table (and each namespace's state with it)
//! before the change returns, the admin queues send the ANA change notice. A namespace may
//! move to another group.

use std::sync::atomic::Ordering;

use crate::error::{invalid, NvmfError};
use crate::model::{AnaState, AnaStates, SubsystemKind};
use crate::options::ListenAddress;
use crate::subsystem::{lock, QpairRef};
use crate::NvmfTarget;

impl NvmfTarget {
    /// Sets ANA group `anagrpid`'s state (every group's with `None`) on the listener at `addr`
    /// of subsystem `nqn`, as SPDK's `nvmf_subsystem_listener_set_ana_state`. When it returns,
    /// no queue pair that came in on the listener starts new I/O against the old state, and
    /// every controller on it that enabled ANA change notices has one on its way.
    pub fn set_ana_state(
        &self,
        nqn: &str,
        addr: &ListenAddress,
        state: AnaState,
        anagrpid: Option<u32>,
    ) -> Result<(), NvmfError> {
        let sub = self
            .inner
            .subsystem(nqn)
            .filter(|s| s.kind == SubsystemKind::Nvme)
            .ok_or_else(|| NvmfError::NotFound { what: "subsystem", name: nqn.into() })?;
        let addr = addr.normalized();
        let (admins, ios) = {
            let mut st = lock(&sub.state);
            if !st.ana_reporting {
                return Err(invalid("ana_reporting", format!("{nqn} was created without ana_reporting")));
            }
            let max = st.max_namespaces;
            if anagrpid.is_some_and(|g| g == 0 || g > max) {
                return Err(invalid("anagrpid", format!("must be 1 to {max} (max_namespaces)")));
            }
            let Some(ana) = st.ana.get_mut(&addr) else {
                return Err(NvmfError::NotFound {
                    what: "listener",
                    name: format!("{}:{}", addr.traddr, addr.trsvcid),
                });
            };
            let mut changed = false;
            for (i, s) in ana.states.iter_mut().enumerate() {
                if anagrpid.is_none_or(|g| g as usize == i + 1) && *s != state {
                    *s = state;
                    changed = true;
                }
            }
            if !changed {
                return Ok(());
            }
            ana.change_count += 1;
            let on = |q: &&QpairRef| q.listen == addr;
            let admins: Vec<QpairRef> =
                st.controllers.values().filter_map(|c| c.admin.as_ref()).filter(on).cloned().collect();
            let ios: Vec<QpairRef> =
                st.controllers.values().flat_map(|c| c.io.values()).filter(on).cloned().collect();
            (admins, ios)
        };
        // Queues not listed yet (still connecting) reload on their first round.
        sub.ns_generation.fetch_add(1, Ordering::Release);
        sub.refresh_view(None);
        crate::tcp::qpair::reload_ana(&ios);
        crate::tcp::qpair::notify_ana(&admins);
        let group = anagrpid.map_or("every ANA group".to_string(), |g| format!("ANA group {g}"));
        log::info!("nvmf: {nqn}: {group} {} on {}:{}", state.name(), addr.traddr, addr.trsvcid);
        Ok(())
    }

    /// Moves namespace `nsid` of `nqn` to ANA group `anagrpid` (1 to max_namespaces), as
    /// SPDK's `nvmf_subsystem_set_ns_ana_group`. When it returns, the I/O queues serve the
    /// namespace with its new group's state on their listener, and every controller has the
    /// Namespace Attribute Changed notice on its way (as SPDK sends) and, with ANA reporting,
    /// the ANA change notice (the ANA log page lists the namespace under its new group; each
    /// listener's change count moves).
    pub fn set_ns_ana_group(&self, nqn: &str, nsid: u32, anagrpid: u32) -> Result<(), NvmfError> {
        let sub = self
            .inner
            .subsystem(nqn)
            .filter(|s| s.kind == SubsystemKind::Nvme)
            .ok_or_else(|| NvmfError::NotFound { what: "subsystem", name: nqn.into() })?;
        let (admins, ios, ana_reporting) = {
            let mut st = lock(&sub.state);
            let max = st.max_namespaces;
            if anagrpid == 0 || anagrpid > max {
                return Err(invalid("anagrpid", format!("must be 1 to {max} (max_namespaces)")));
            }
            let ns = st
                .namespaces
                .get(&nsid)
                .ok_or_else(|| NvmfError::NotFound { what: "namespace", name: nsid.to_string() })?;
            if ns.anagrpid() == anagrpid {
                return Ok(());
            }
            ns.set_anagrpid(anagrpid);
            for ana in st.ana.values_mut() {
                ana.change_count += 1;
            }
            let admins: Vec<QpairRef> = st.controllers.values().filter_map(|c| c.admin.clone()).collect();
            let ios: Vec<QpairRef> = st.controllers.values().flat_map(|c| c.io.values()).cloned().collect();
            (admins, ios, st.ana_reporting)
        };
        sub.ns_generation.fetch_add(1, Ordering::Release);
        sub.refresh_view(None);
        crate::tcp::qpair::reload_ana(&ios);
        crate::tcp::qpair::notify_namespace(&admins, nsid);
        if ana_reporting {
            crate::tcp::qpair::notify_ana(&admins);
        }
        log::info!("nvmf: {nqn}: namespace {nsid} in ANA group {anagrpid}");
        Ok(())
    }

    /// Each listener of `nqn` with its ANA states, in the order they were added; `None` when
    /// the subsystem does not report ANA.
    pub fn listener_ana_states(
        &self,
        nqn: &str,
    ) -> Result<Option<Vec<(ListenAddress, AnaStates)>>, NvmfError> {
        let sub = self
            .inner
            .subsystem(nqn)
            .ok_or_else(|| NvmfError::NotFound { what: "subsystem", name: nqn.into() })?;
        let st = lock(&sub.state);
        if !st.ana_reporting {
            return Ok(None);
        }
        Ok(Some(
            st.listeners.iter().map(|a| (a.clone(), st.ana.get(a).cloned().unwrap_or_default())).collect(),
        ))
    }
}
