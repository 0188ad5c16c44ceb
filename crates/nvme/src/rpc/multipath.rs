//! The multipath side of the module: a second path under a taken name (SPDK's checks, then
//! the namespaces' path lists), detaching some paths of a name, and the policy and I/O path
//! methods (`bdev_nvme_set_multipath_policy`, `bdev_nvme_get_io_paths`). docs/nvme.md,
//! "Multipath".

use std::collections::BTreeMap;
use std::sync::Arc;

use fp_bdev::module::{ModuleError, ModuleHost, NewBdev};
use fp_rpc::{ParamError, Params};
use serde_json::{json, Value};

use crate::bdev::paths::{Policy, MAX_PATHS};
use crate::bdev::NvmeNamespace;
use crate::rpc::params::{parse_policy, Address, AttachParams, MultipathMode};
use crate::rpc::state::{lock, state, trid_fields, Attached, Path, Slot, State, MODULE};

/// SPDK's checks of a second path before connecting it: `multipath` asks for one, over TCP,
/// to the same subsystem as the same host, through another address.
pub(super) fn check_new_path(existing: &Attached, a: &AttachParams) -> Result<(), ModuleError> {
    let name = &a.name;
    if !matches!(a.multipath, Some(MultipathMode::Multipath | MultipathMode::Failover)) {
        return Err(ParamError::new(
            "name",
            format!(
                "NVMe controller '{name}' already exists and multipath is disabled (multipath \
                 \"multipath\" or \"failover\" adds a path to it)"
            ),
        )
        .into());
    }
    let Address::Tcp { traddr, trsvcid, subnqn, hostnqn, .. } = &a.address else {
        return Err(ParamError::new("trtype", "multipath: a second path is for trtype TCP only").into());
    };
    if existing.paths.len() >= MAX_PATHS {
        return Err(ParamError::new(
            "name",
            format!("NVMe controller '{name}' has {MAX_PATHS} paths already"),
        )
        .into());
    }
    for path in &existing.paths {
        let Address::Tcp { traddr: t, trsvcid: s, subnqn: n, .. } = &path.address else {
            return Err(
                ParamError::new("trtype", format!("NVMe controller '{name}' is a PCIe controller")).into()
            );
        };
        if n != subnqn {
            return Err(ParamError::new(
                "subnqn",
                format!("NVMe controller '{name}' already exists, but uses a different subnqn ({n})"),
            )
            .into());
        }
        if let (Some(given), Some(ours)) = (hostnqn, &path.hostnqn) {
            if given != ours {
                return Err(ParamError::new(
                    "hostnqn",
                    format!("NVMe controller '{name}' already exists, but uses a different hostnqn ({ours})"),
                )
                .into());
            }
        }
        if t == traddr && s == trsvcid {
            return Err(ParamError::new(
                "traddr",
                format!("NVMe controller '{name}' already has the path {traddr}:{trsvcid}"),
            )
            .into());
        }
    }
    Ok(())
}

/// Connects another path of `existing` (whose name is reserved), checks that it reaches the
/// same subsystem and namespaces (SPDK's rules: the subsystem NQN Identify Controller reports,
/// another controller ID, and each namespace both have the same NGUID, EUI-64, block size and
/// size), and adds it to the namespaces' paths (`connect` connects it); a namespace only this path has becomes a
/// bdev of its own. Puts `existing` back in any case.
pub(super) fn add_path(
    host: &dyn ModuleHost,
    st: &State,
    mut existing: Attached,
    a: &AttachParams,
    connect: impl FnOnce() -> Result<Path, ModuleError>,
) -> Result<Value, ModuleError> {
    let r = connect().and_then(|path| {
        if let Err(e) = check_same_subsystem(st, &existing, &path) {
            path.ctrlr.detach();
            return Err(e);
        }
        Ok(path)
    });
    let path = match r {
        Ok(path) => path,
        Err(e) => {
            lock(&st.controllers).insert(a.name.clone(), Slot::Attached(existing));
            return Err(e);
        }
    };
    let mut names = Vec::new();
    for ns in path.ctrlr.namespaces() {
        let head = lock(&st.heads).get(ns.name()).cloned();
        match (head, ns.own_path()) {
            (Some(head), Some(own)) => {
                // Channels opened from now on follow every path (set on the first attach
                // too when it asked for multipath, so channels opened before follow as well).
                head.paths().set_multipath();
                if let Err(why) = head.paths().add(own) {
                    log::warn!("nvme {}: {}: path not added: {why}", a.name, ns.name());
                    continue;
                }
                if a.multipath == Some(MultipathMode::Failover) {
                    head.paths().set_policy(Policy::ActivePassive);
                }
                if let Some(policy) = a.policy {
                    head.paths().set_policy(policy);
                }
                names.push(ns.name().to_string());
            }
            _ => {
                ns.paths().set_multipath();
                match host.add_bdev(MODULE, NewBdev::new(ns.clone())) {
                    Ok(name) => {
                        st.note_bdev(&a.name, &name, true);
                        lock(&st.heads).insert(name.clone(), ns);
                        names.push(name);
                    }
                    Err(e) => log::warn!("nvme {}: namespace bdev {} not added: {e}", a.name, ns.name()),
                }
            }
        }
    }
    log::info!("nvme {}: path {} added ({} paths)", a.name, a.address.traddr(), existing.paths.len() + 1);
    existing.paths.push(path);
    lock(&st.controllers).insert(a.name.clone(), Slot::Attached(existing));
    Ok(json!(names))
}

/// The checks of [`add_path`] once the new path is connected.
fn check_same_subsystem(st: &State, existing: &Attached, path: &Path) -> Result<(), ModuleError> {
    let new = path.ctrlr.controller_data();
    for old in existing.paths.iter().map(|p| p.ctrlr.controller_data()) {
        if old.subnqn != new.subnqn {
            return Err(ParamError::new(
                "subnqn",
                format!(
                    "the controller reports subsystem {} where the existing path reports {}",
                    new.subnqn, old.subnqn
                ),
            )
            .into());
        }
        if old.cntlid == new.cntlid {
            return Err(ParamError::new(
                "traddr",
                format!("controller ID {} is already a path of this name (the same controller)", new.cntlid),
            )
            .into());
        }
    }
    for ns in path.ctrlr.namespaces() {
        let Some(head) = lock(&st.heads).get(ns.name()).cloned() else { continue };
        let (a, b) = (head.data(), ns.data());
        let same =
            a.nguid == b.nguid && a.eui64 == b.eui64 && a.block_size == b.block_size && a.nsze == b.nsze;
        if !same {
            return Err(ParamError::new(
                "traddr",
                format!(
                    "namespace {} differs between the paths (NGUID, EUI-64, block size or size): not the same namespace",
                    ns.nsid()
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// The indexes of `a`'s paths every selector matches (all without selectors); refused,
/// naming the first selector, when none does.
pub(super) fn pick_paths(
    a: &Attached,
    name: &str,
    selectors: &[(&'static str, String)],
) -> Result<Vec<usize>, ModuleError> {
    let picked: Vec<usize> = (0..a.paths.len())
        .filter(|&i| {
            let trid = trid_fields(&a.paths[i].address);
            selectors.iter().all(|(field, given)| {
                trid.iter().find(|(f, _)| f == field).is_some_and(|(_, v)| v.eq_ignore_ascii_case(given))
            })
        })
        .collect();
    if picked.is_empty() {
        let (field, given) = &selectors[0];
        return Err(ParamError::new(
            *field,
            format!("'{given}' is not a path of NVMe controller '{name}' ({} paths)", a.paths.len()),
        )
        .into());
    }
    Ok(picked)
}

/// The bdevs only the paths `picked` serve: detaching those paths deletes them.
pub(super) fn orphans(st: &State, a: &Attached, picked: &[usize]) -> Vec<String> {
    let going: Vec<u64> = picked.iter().map(|&i| a.paths[i].ctrlr.path_id()).collect();
    lock(&st.heads)
        .iter()
        .filter(|(_, head)| {
            let ids = head.paths().ids();
            ids.iter().any(|id| going.contains(id)) && ids.iter().all(|id| going.contains(id))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Detaches the paths `picked` of `taken` (not all of them): each namespace loses them, a
/// bdev no other path serves is deleted, the controllers are detached.
pub(super) fn detach_paths(
    host: &dyn ModuleHost,
    st: &State,
    name: &str,
    mut taken: Attached,
    picked: &[usize],
) -> Result<Value, ModuleError> {
    for bdev in orphans(st, &taken, picked) {
        if let Err(e) = host.delete_bdev(&bdev, MODULE) {
            lock(&st.controllers).insert(name.to_string(), Slot::Attached(taken));
            return Err(e);
        }
        st.note_bdev(name, &bdev, false);
    }
    let mut gone = Vec::new();
    for &i in picked.iter().rev() {
        gone.push(taken.paths.remove(i));
    }
    let heads: Vec<Arc<NvmeNamespace>> = lock(&st.heads).values().cloned().collect();
    for path in gone {
        // First out of every namespace's path list (new I/O avoids it), then detached: its
        // held requests move to another path under the quiesce rule.
        for head in &heads {
            head.paths().remove(path.ctrlr.path_id());
        }
        path.ctrlr.detach();
        log::info!("nvme {name}: path {} detached", path.address.traddr());
    }
    lock(&st.controllers).insert(name.to_string(), Slot::Attached(taken));
    Ok(Value::Bool(true))
}

/// `bdev_nvme_set_multipath_policy`: SPDK's `name` (the bdev), `policy` (`active_passive`,
/// `active_active`), `selector` (`round_robin`, `queue_depth`; active_active only) and
/// `rr_min_io` (round_robin only). Channels follow at their next request.
pub(super) fn set_multipath_policy(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let policy = p.required_str("policy")?;
    let selector = p.optional_str("selector")?;
    let rr_min_io = p.optional_uint("rr_min_io", u64::from(u32::MAX))?;
    p.finish()?;
    let policy = parse_policy(&policy, selector.as_deref(), rr_min_io, ["policy", "selector", "rr_min_io"])?;
    let st = state(host);
    let head = lock(&st.heads).get(&name).cloned().ok_or_else(|| no_nvme_bdev(&name))?;
    head.paths().set_policy(policy);
    log::info!("nvme {name}: multipath policy {:?}", policy);
    Ok(Value::Bool(true))
}

fn no_nvme_bdev(name: &str) -> ModuleError {
    ParamError::new("name", format!("no NVMe bdev '{name}'")).into()
}

/// `bdev_nvme_get_io_paths`: SPDK's shape, one `poll_groups` entry per channel (its reactor
/// thread) with an `io_paths` entry per path of each multipath bdev it has open; `name`
/// picks one bdev.
pub(super) fn get_io_paths(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.optional_str("name")?;
    p.finish()?;
    let st = state(host);
    let heads: Vec<(String, Arc<NvmeNamespace>)> = match &name {
        Some(n) => vec![(n.clone(), lock(&st.heads).get(n).cloned().ok_or_else(|| no_nvme_bdev(n))?)],
        None => lock(&st.heads).iter().map(|(n, h)| (n.clone(), h.clone())).collect(),
    };
    let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (bdev, head) in heads {
        let paths = head.paths().list();
        for view in head.paths().channel_views() {
            let thread = lock(&view.thread).clone();
            let current = view.current.load(std::sync::atomic::Ordering::Relaxed);
            let connected: Vec<u64> =
                view.connected.iter().map(|c| c.load(std::sync::atomic::Ordering::Relaxed)).collect();
            let entry = groups.entry(thread).or_default();
            let infos: Vec<_> = paths.iter().map(|p| (p.id, head.path_info(p))).collect();
            // Active-active (SPDK's rule) as this channel sees the states: every connected
            // accessible optimized path is current, or every connected accessible one when none
            // is optimized.
            let active_active = head.paths().policy() != Policy::ActivePassive;
            let seen = |id: &u64| view.ana_of(*id).filter(|_| connected.contains(id));
            let any_optimized = infos.iter().any(|(id, _)| seen(id).is_some_and(|w| w.optimized()));
            for (id, info) in &infos {
                let current = if active_active {
                    seen(id).is_some_and(|w| w.optimized() || (w.accessible() && !any_optimized))
                } else {
                    current == *id
                };
                entry.push(json!({
                    "bdev_name": bdev,
                    "cntlid": info.cntlid,
                    "current": current,
                    "connected": connected.contains(id),
                    "accessible": info.accessible,
                    "ana_state": info.ana_state.name(),
                    "transport": info.trid,
                }));
            }
        }
    }
    let poll_groups: Vec<Value> = groups
        .into_iter()
        .map(|(thread, io_paths)| json!({"thread": thread, "io_paths": io_paths}))
        .collect();
    Ok(json!({"poll_groups": poll_groups}))
}
