//! The raid module's state in a registry: the raids it knows, assembled or still configuring
//! (found by examine, waiting for bases), and the options every raid's process follows. Below
//! both the RPC methods and examine, which look raids up and add them here.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fp_bdev::copy_share::{CopyShare, DEFAULT_COPY_WEIGHT};
use fp_bdev::module::{BackgroundStart, ModuleError, ModuleHost};
use fp_bdev::Bdev;
use fp_rpc::ParamError;
use serde_json::{json, Map, Value};

use crate::device::RaidDevice;
use crate::format::Superblock;
use crate::owner::{OwnerHandle, OwnerOptions, Reactors, StopWait};
use crate::{RaidError, SlotState};

/// The module's name: its bdevs' driver, its claims' holder kind.
pub const MODULE: &str = "raid";

/// SPDK's default rebuild window (`process_window_size_kb`).
pub const DEFAULT_WINDOW_KB: u64 = 1024;

/// `bdev_raid_set_options`: the background process's window and speed limit, for every raid.
pub struct ProcessOptions {
    pub window_kb: AtomicU64,
    /// MiB/s; 0: no limit.
    pub max_bandwidth_mb_sec: AtomicU64,
    /// `process_weight`: percent (`fp_bdev::copy_share`).
    pub weight: AtomicU64,
    /// Where rebuilds copy: the host's reactors (none from a host without them).
    pub reactors: Option<Reactors>,
}

/// One raid the module knows.
pub struct RaidEntry {
    pub name: String,
    /// The bdev, once assembled.
    pub device: Option<Arc<RaidDevice>>,
    /// Its owner thread, once assembled (shared with control calls in progress).
    pub owner: Option<Arc<OwnerHandle>>,
    /// A raid found by examine and not assembled yet.
    pub configuring: Option<Configuring>,
}

/// The module's state in a registry.
pub struct RaidState {
    pub raids: Mutex<Vec<RaidEntry>>,
    pub options: Arc<ProcessOptions>,
}

impl ProcessOptions {
    /// The share `process_weight` gives (checked when set).
    pub fn share(&self) -> CopyShare {
        CopyShare::new(self.weight.load(Ordering::Relaxed)).unwrap_or_default()
    }

    /// The owner's options now.
    pub fn owner_options(&self) -> OwnerOptions {
        OwnerOptions {
            process_window_bytes: self.window_kb.load(Ordering::Relaxed) << 10,
            process_max_bandwidth_mb_sec: self.max_bandwidth_mb_sec.load(Ordering::Relaxed),
            process_share: self.share(),
            reactors: self.reactors.clone(),
            ..OwnerOptions::default()
        }
    }
}

impl RaidState {
    fn new(host: Option<Weak<dyn ModuleHost + Send + Sync>>) -> RaidState {
        let reactors = host.map(|weak| {
            Reactors(Arc::new(move |start: BackgroundStart| {
                weak.upgrade().is_some_and(|h| h.start_background(start))
            }))
        });
        RaidState {
            raids: Mutex::new(Vec::new()),
            options: Arc::new(ProcessOptions {
                window_kb: AtomicU64::new(DEFAULT_WINDOW_KB),
                max_bandwidth_mb_sec: AtomicU64::new(0),
                weight: AtomicU64::new(u64::from(DEFAULT_COPY_WEIGHT)),
                reactors,
            }),
        }
    }
}

/// The raid module.
pub struct RaidModule;

impl RaidModule {
    /// The module's state in `host`, made on first use.
    pub fn state(host: &dyn ModuleHost) -> Arc<RaidState> {
        let any = host.module_state(MODULE, &|| {
            Arc::new(RaidState::new(host.weak_handle())) as Arc<dyn Any + Send + Sync>
        });
        any.downcast::<RaidState>().unwrap_or_else(|_| unreachable!("the raid module's state is a RaidState"))
    }
}

/// Runs `f` on the module's list of raids (a control-plane lock, never taken by I/O).
pub(crate) fn with_raids<R>(host: &dyn ModuleHost, f: impl FnOnce(&mut Vec<RaidEntry>) -> R) -> R {
    let state = RaidModule::state(host);
    let mut list = state.raids.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut list)
}

/// A raid error as a module error: refusals name their field (invalid params), the rest keep
/// their errno ([`RaidError::errno`]).
pub fn module_error(e: RaidError) -> ModuleError {
    match e {
        RaidError::InvalidParam { field, reason } => ParamError::new(field, reason).into(),
        RaidError::Bdev(b) => ModuleError::Bdev(b),
        other => ModuleError::module(other.errno(), other),
    }
}

/// Stops an owner: an orderly stop (clean superblocks), `clear_sb` also erasing them, within
/// `bound` in all ([`crate::owner::OWNER_WAIT`], or less at the daemon's shutdown). The raid is marked stopping first, so its owner gives a busy base's
/// metadata writes up (after a short grace) and control calls in progress end. A handle
/// still shared by a call in progress is dropped instead (a stop without the clean mark: the
/// next assembly resyncs, which is safe); with `clear_sb` it is first waited for, since
/// erasing needs the owner. The error of a `clear_sb` names the bases whose superblock was not
/// erased; without `clear_sb` nothing fails. [`StopWait::UnderWay`]: the owner was still
/// waiting for a base to answer a request at the bound; it ends alone.
pub(crate) fn stop_owner(raid: &str, owner: Arc<OwnerHandle>, clear_sb: bool, bound: Duration) -> StopWait {
    owner.shared().set_stopping();
    let deadline = Instant::now() + bound;
    let mut owner = owner;
    let handle = loop {
        match Arc::try_unwrap(owner) {
            Ok(h) => break Some(h),
            Err(shared) if clear_sb && Instant::now() < deadline => {
                owner = shared;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => break None,
        }
    };
    let Some(h) = handle else {
        log::warn!("raid '{raid}': its owner is busy; stopped without marking it clean");
        if clear_sb {
            return StopWait::Stopped(Err(RaidError::NotErased(format!(
                "raid '{raid}': its owner stayed busy with another call for {:?}; no superblock was erased",
                bound
            ))));
        }
        return StopWait::Stopped(Ok(()));
    };
    let wait = deadline.saturating_duration_since(Instant::now());
    let stopped = if clear_sb { h.delete(wait) } else { h.shutdown(wait) };
    match stopped {
        Ok(StopWait::Stopped(Err(e))) if !clear_sb => {
            log::warn!("raid '{raid}': its owner did not stop cleanly: {e}");
            StopWait::Stopped(Ok(()))
        }
        Ok(w) => w,
        Err(e) if clear_sb => StopWait::Stopped(Err(e)),
        Err(e) => {
            log::warn!("raid '{raid}': {e}");
            StopWait::Stopped(Ok(()))
        }
    }
}

/// A base examine found and claimed for a raid not assembled yet.
pub struct Found {
    pub name: String,
    pub bdev: Bdev,
    pub sb: Superblock,
}

/// What examine has found of a raid not assembled yet.
pub struct Configuring {
    pub found: Vec<Found>,
}

impl Configuring {
    /// The newest superblock among the bases found.
    pub fn newest(&self) -> &Superblock {
        &self.found.iter().max_by_key(|f| f.sb.seq).expect("a configuring raid has a base").sb
    }

    /// The names of the bases claimed so far.
    pub fn claimed_names(&self) -> Vec<String> {
        self.found.iter().map(|f| f.name.clone()).collect()
    }

    /// Forgets base `name` (removed before assembly); `None` when it is not one of these.
    pub fn forget(&mut self, name: &str) -> Option<()> {
        let i = self.found.iter().position(|f| f.name == name)?;
        self.found.remove(i);
        Some(())
    }

    /// The `bdev_raid_get_bdevs` entry of the raid `name` while configuring.
    pub fn json(&self, name: &str) -> Map<String, Value> {
        let sb = self.newest();
        let bs = u64::from(sb.block_size.max(1));
        let bases: Vec<Value> = sb
            .slots
            .iter()
            .enumerate()
            .map(|(i, rec)| {
                let f = self.found.iter().find(|f| usize::from(f.sb.slot) == i);
                json!({
                    "name": f.map(|f| f.name.clone()),
                    "uuid": rec.uuid.to_string(),
                    "is_configured": f.is_some(),
                    "data_offset": sb.data_offset / bs,
                    "data_size": rec.data_bytes / bs,
                })
            })
            .collect();
        let mut m = Map::new();
        m.insert("name".into(), json!(name));
        m.insert("uuid".into(), json!(sb.raid_uuid.to_string()));
        m.insert("strip_size_kb".into(), json!(sb.strip_size_kb));
        m.insert("state".into(), json!("configuring"));
        m.insert("raid_level".into(), json!(sb.level.name()));
        m.insert("superblock".into(), json!(true));
        m.insert("num_base_bdevs".into(), json!(sb.slots.len()));
        m.insert("num_base_bdevs_discovered".into(), json!(self.found.len()));
        m.insert(
            "num_base_bdevs_operational".into(),
            json!(sb.slots.iter().filter(|r| r.state == SlotState::Active).count()),
        );
        m.insert("base_bdevs_list".into(), Value::Array(bases));
        m
    }

    /// Whether every slot the newest superblock lists Active has its base, current.
    pub(crate) fn complete(&self) -> bool {
        let sb = self.newest();
        sb.slots.iter().enumerate().filter(|(_, r)| r.state == SlotState::Active).all(|(i, r)| {
            self.found.iter().any(|f| {
                usize::from(f.sb.slot) == i
                    && f.sb.seq == sb.seq
                    && f.sb.slots.get(i).is_some_and(|o| o.uuid == r.uuid)
            })
        })
    }
}
