//! The registry made (each export kind's state with it), and what it answers of the daemon as a
//! whole (reactors, stop bounds, shutdown). Its state's types are in `state.rs`, below this file.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fp_reactor::ReactorHandle;

use crate::examine::ExamineGate;
use crate::exports::{KindInit, OptionValues, EXPORT_KINDS};
use crate::state::{ExportEntry, Registry, RegistryOptions, State};
use crate::{modules, Limits};

/// A reactor as `framework_get_reactors` reports it.
#[derive(Debug, Clone)]
pub struct ReactorSummary {
    pub id: usize,
    pub core: Option<usize>,
    pub stats: fp_reactor::ReactorStatsSnapshot,
}

/// The daemon's stop bound ([`Registry::export_stop_bound`]) when no export kind declares one.
pub const DEFAULT_STOP_BOUND: Duration = Duration::from_secs(5);

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
                backups: BTreeMap::new(),
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
        // Backup jobs first, while the reactors run (their fleeces detach from the bases'
        // channels): each merges its frozen bits back into its bitmap before the bitmaps are
        // saved below, and keeps its record so that the next start resumes it.
        let backups_left = self.stop_backups(crate::backup::BACKUP_WAIT.min(self.shutdown_bound()));
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
        // The exports are stopped and the modules let go of their bases: nothing marks any more.
        self.save_all_dirty_bitmaps(left.is_empty(), &backups_left);
        left
    }
}
