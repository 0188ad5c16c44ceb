//! The registry itself: its state under one mutex, its options, and what it answers of the
//! daemon as a whole (reactors, shutdown).

use std::any::Any;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fp_reactor::ReactorHandle;

use crate::bdevs::BdevEntry;
use crate::examine::ExamineGate;
use crate::exports::{ExportEntry, KindInit, OptionValues, EXPORT_KINDS};
use crate::{modules, ExportDirs, Limits, RegistryError};

/// A reactor as `framework_get_reactors` reports it.
#[derive(Debug, Clone)]
pub struct ReactorSummary {
    pub id: usize,
    pub core: Option<usize>,
    pub stats: fp_reactor::ReactorStatsSnapshot,
}

pub(crate) struct State {
    pub(crate) bdevs: BTreeMap<String, BdevEntry>,
    /// Alias to bdev name.
    pub(crate) aliases: BTreeMap<String, String>,
    pub(crate) exports: BTreeMap<String, ExportEntry>,
    /// QoS groups by name (their members are the bdevs whose disks joined them).
    pub(crate) qos_groups: BTreeMap<String, Arc<fp_bdev::qos::QosGroup>>,
    /// Mirror jobs by id (`mirror.rs`).
    pub(crate) mirrors: BTreeMap<String, crate::mirror::MirrorEntry>,
}

impl State {
    /// The name of the bdev called `name` (its name or one of its aliases).
    pub(crate) fn canonical<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        if self.bdevs.contains_key(name) {
            return Some(name);
        }
        self.aliases.get(name).map(String::as_str)
    }

    pub(crate) fn entry(&self, name: &str) -> Option<&BdevEntry> {
        self.canonical(name).and_then(|n| self.bdevs.get(n))
    }

    pub(crate) fn entry_mut(&mut self, name: &str) -> Option<&mut BdevEntry> {
        let n = self.canonical(name)?.to_string();
        self.bdevs.get_mut(&n)
    }

    /// Whether `name` is taken, as a bdev's name or an alias.
    pub(crate) fn name_taken(&self, name: &str) -> bool {
        self.canonical(name).is_some()
    }

    /// Releases the claim `holder` has on `bdev`.
    pub(crate) fn release(&mut self, bdev: &str, holder_kind: &str, holder: &str) {
        if let Some(b) = self.entry_mut(bdev) {
            b.claims.retain(|c| !(c.holder == holder && c.holder_kind == holder_kind));
        }
    }

    pub(crate) fn room_for_bdev(&self, name: &str, limits: &Limits) -> Result<(), RegistryError> {
        if self.bdevs.len() >= limits.max_bdevs {
            return Err(RegistryError::LimitReached {
                kind: "bdev",
                name: name.into(),
                limit: limits.max_bdevs,
                setting: "limits.max_bdevs",
            });
        }
        Ok(())
    }
}

/// How a [`Registry`] is bounded. The default is what `serve` uses without `[limits]` and
/// `[security]` tables.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    pub limits: Limits,
    /// The permission bits of each vhost-user socket, set as soon as it is bound.
    pub socket_mode: u32,
    /// When set, file-backed bdevs may only open files inside these directories.
    pub export_dirs: Option<ExportDirs>,
    /// Count I/O statistics (`bdev_get_iostat`, histograms) in the disk layer; off hands the
    /// exports the backends' channels directly.
    pub iostat: bool,
    /// The export kinds' own options ([`crate::ExportKind::options`]): their bounds, whether
    /// NVMe-oF listeners may leave loopback. Those not given keep the kind's default.
    pub kind_options: crate::exports::KindOptions,
}

/// Default for [`RegistryOptions::socket_mode`]: only the daemon's user may connect.
///
/// Whoever can connect to a vhost-user socket is the disk's guest: it reads and writes the disk
/// and shares memory with the daemon. QEMU usually runs as the same user as the storage daemon;
/// a deployment that runs it as another user of a shared group widens this to 0o660.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

impl Default for RegistryOptions {
    fn default() -> RegistryOptions {
        RegistryOptions {
            limits: Limits::default(),
            socket_mode: DEFAULT_SOCKET_MODE,
            export_dirs: None,
            iostat: true,
            kind_options: crate::exports::KindOptions::default(),
        }
    }
}

/// The daemon's stop bound ([`Registry::export_stop_bound`]) when no export kind declares one.
pub const DEFAULT_STOP_BOUND: Duration = Duration::from_secs(5);

/// The registry. Cheap to share: wrap it in an `Arc`.
pub struct Registry {
    pub(crate) reactors: Vec<ReactorHandle>,
    pub(crate) vhost_dir: PathBuf,
    pub(crate) options: RegistryOptions,
    pub(crate) state: Mutex<State>,
    /// Each module's own state ([`fp_bdev::ModuleHost::module_state`]: the lvstores, ...).
    pub(crate) module_states: Mutex<BTreeMap<&'static str, Arc<dyn Any + Send + Sync>>>,
    /// Each export kind's daemon-wide state ([`crate::ExportKind::init`]: the NBD listeners,
    /// the NVMe-oF target), made with the registry and never replaced.
    pub(crate) kind_states: BTreeMap<&'static str, Arc<dyn Any + Send + Sync>>,
    /// When it was made: the daemon's uptime (`flashpath_get_stats`).
    started: Instant,
    /// Set when [`Registry::shutdown`] starts: when the whole shutdown is to end
    /// ([`fp_bdev::ModuleHost::shutdown_deadline`]).
    pub(crate) shutdown_deadline: Mutex<Option<Instant>>,
    /// Itself, for modules whose threads report back later ([`fp_bdev::ModuleHost::weak_handle`]).
    pub(crate) me: Weak<Registry>,
    /// Which new bdevs the modules examine (`bdev_set_options`' `bdev_auto_examine`).
    pub(crate) examine: Mutex<ExamineGate>,
}

impl Registry {
    /// A registry with the default [`RegistryOptions`].
    pub fn new(reactors: Vec<ReactorHandle>, vhost_dir: &Path) -> Arc<Registry> {
        Registry::with_options(reactors, vhost_dir, RegistryOptions::default())
    }

    pub fn with_options(
        reactors: Vec<ReactorHandle>,
        vhost_dir: &Path,
        options: RegistryOptions,
    ) -> Arc<Registry> {
        let kind_states = EXPORT_KINDS
            .iter()
            .filter_map(|&kind| {
                let options = OptionValues {
                    kind: kind.name(),
                    declared: kind.options(),
                    given: &options.kind_options,
                };
                Some((kind.name(), kind.init(&KindInit { reactors: &reactors, options })?))
            })
            .collect();
        Arc::new_cyclic(|me| Registry {
            me: me.clone(),
            reactors,
            vhost_dir: vhost_dir.to_path_buf(),
            options,
            state: Mutex::new(State {
                bdevs: BTreeMap::new(),
                aliases: BTreeMap::new(),
                exports: BTreeMap::new(),
                qos_groups: BTreeMap::new(),
                mirrors: BTreeMap::new(),
            }),
            module_states: Mutex::new(BTreeMap::new()),
            kind_states,
            started: Instant::now(),
            shutdown_deadline: Mutex::new(None),
            examine: Mutex::new(ExamineGate::default()),
        })
    }

    /// The examine policy (`bdev_set_options`, `bdev_examine`).
    pub(crate) fn examine_gate(&self) -> std::sync::MutexGuard<'_, ExamineGate> {
        self.examine.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn limits(&self) -> &Limits {
        &self.options.limits
    }

    pub fn vhost_dir(&self) -> &Path {
        &self.vhost_dir
    }

    pub fn reactor_handles(&self) -> &[ReactorHandle] {
        &self.reactors
    }

    /// How long since the registry was made.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The daemon-wide state of the export kind `kind`, as its [`crate::ExportKind::init`]
    /// made it.
    ///
    /// # Panics
    /// When the kind made no state of type `T`: a kind asks only for its own.
    pub fn kind_state<T: 'static>(&self, kind: &str) -> &T {
        self.kind_states
            .get(kind)
            .and_then(|s| s.downcast_ref::<T>())
            .unwrap_or_else(|| panic!("export kind '{kind}' has no state of this type"))
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain maps behind; keep serving.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Mirror jobs end on their reactor: their target claims go at the next look.
        if !st.mirrors.is_empty() {
            st.reap_mirrors();
        }
        st
    }

    pub fn reactors(&self) -> Vec<ReactorSummary> {
        self.reactors
            .iter()
            .map(|h| ReactorSummary { id: h.id(), core: h.core(), stats: h.stats().snapshot() })
            .collect()
    }

    /// The daemon's stop bound, the longest an export's stop may take at shutdown: the longest
    /// of the kinds' [`crate::ExportKind::stop_bound`]s (a vhost-user queue's default stop bound,
    /// `[vhost] stop_timeout_ms`, and the NVMe-oF drain timeout), or [`DEFAULT_STOP_BOUND`]
    /// when no kind has one. The daemon's whole shutdown is bounded by this plus the margin
    /// [`Registry::shutdown`] allows the stops to report back ([`Registry::shutdown_bound`]).
    pub fn export_stop_bound(&self) -> Duration {
        EXPORT_KINDS.iter().filter_map(|k| k.stop_bound(self)).max().unwrap_or(DEFAULT_STOP_BOUND)
    }

    /// The daemon's stop bound: what each export's stop at shutdown is given
    /// ([`crate::Export::stop_at_shutdown`]), and how long the reactors then wait for requests
    /// a disk still holds (a queue that did not stop in time keeps the guest memory they point
    /// into until then). The shortest of the kinds' [`crate::ExportKind::stop_bound`]s, or
    /// [`DEFAULT_STOP_BOUND`]: `[vhost] stop_timeout_ms` unless the NVMe-oF drain is shorter. A
    /// longer drain lengthens the exports' deadline ([`Registry::export_stop_bound`]), not this.
    pub fn daemon_stop_bound(&self) -> Duration {
        EXPORT_KINDS.iter().filter_map(|k| k.stop_bound(self)).min().unwrap_or(DEFAULT_STOP_BOUND)
    }

    /// How long the daemon's shutdown may take in all: [`Registry::export_stop_bound`] and the
    /// margin for the stops to report. The reactors' wait for requests a disk still holds gets
    /// what is left of it, so a stuck disk is waited for once, not once per layer.
    pub fn shutdown_bound(&self) -> Duration {
        self.export_stop_bound() + crate::shutdown::REPORT_MARGIN
    }

    /// Stops every export, then lets every module close what it holds open (an lvstore's
    /// metadata owner commits and stops). Bdevs are dropped with the registry.
    ///
    /// The exports stop all at once, against one deadline: the daemon's stop bound
    /// ([`Registry::export_stop_bound`]) from
    /// now (and a margin for the stops to report). An NBD export waits the daemon's bound for its
    /// connections, a vhost-user queue its controller's, a namespace the target's drain; what
    /// still holds requests then is logged by each, and an export whose stop has not ended by
    /// the deadline by this. So the daemon stops in about one bound, however many exports are
    /// stuck. Returns the exports whose stop had not ended by the deadline.
    pub fn shutdown(&self) -> Vec<String> {
        *self.shutdown_deadline.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + self.shutdown_bound());
        // The kinds first: listeners close and the NVMe-oF target's hosts are disconnected,
        // so no new connection races the exports' stops below.
        for kind in EXPORT_KINDS {
            kind.shutdown(self);
        }
        let exports: Vec<ExportEntry> = {
            let mut st = self.lock();
            let all = std::mem::take(&mut st.exports);
            for (name, export) in &all {
                st.release(&export.bdev, export.kind, name);
            }
            all.into_values().collect()
        };
        let left = crate::shutdown::stop_all(exports, self.daemon_stop_bound(), self.export_stop_bound());
        for m in modules::MODULES {
            m.shutdown(self);
        }
        left
    }
}
