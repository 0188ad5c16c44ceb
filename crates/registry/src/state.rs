//! The registry's state: the [`Registry`] and what it holds (bdevs, exports, QoS groups, mirror
//! jobs under one mutex) as plain types, below the files that act on it, each of which adds its
//! own `impl Registry`.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use fp_bdev::mirror::MirrorJob;
use fp_bdev::{Bdev, ClaimType, Disk};
use fp_reactor::ReactorHandle;

use crate::examine::ExamineGate;
use crate::exports::Export;
use crate::{ExportDirs, Limits, RegistryError};

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
    pub(crate) started: Instant,
    /// Set when [`Registry::shutdown`] starts: when the whole shutdown is to end
    /// ([`fp_bdev::ModuleHost::shutdown_deadline`]).
    pub(crate) shutdown_deadline: Mutex<Option<Instant>>,
    /// Itself, for modules whose threads report back later ([`fp_bdev::ModuleHost::weak_handle`]).
    pub(crate) me: Weak<Registry>,
    /// Which new bdevs the modules examine (`bdev_set_options`' `bdev_auto_examine`).
    pub(crate) examine: Mutex<ExamineGate>,
}

pub(crate) struct State {
    pub(crate) bdevs: BTreeMap<String, BdevEntry>,
    /// Alias to bdev name.
    pub(crate) aliases: BTreeMap<String, String>,
    pub(crate) exports: BTreeMap<String, ExportEntry>,
    /// QoS groups by name (their members are the bdevs whose disks joined them).
    pub(crate) qos_groups: BTreeMap<String, Arc<fp_bdev::qos::QosGroup>>,
    /// Mirror jobs by id (`mirror.rs`).
    pub(crate) mirrors: BTreeMap<String, MirrorEntry>,
    /// Backup jobs by id (`backup.rs`), those that ended too until dismissed.
    pub(crate) backups: crate::backup::Backups,
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

/// A bdev as the registry keeps it.
pub(crate) struct BdevEntry {
    pub(crate) bdev: Bdev,
    /// The bdev with its statistics and events (`fp_bdev::disk`): what exports and stacked
    /// bdevs open channels through. Kept while the bdev exists, so statistics survive an
    /// export's delete and re-create.
    pub(crate) disk: Disk,
    /// The module that built it (its `driver`).
    pub(crate) module: &'static str,
    /// The same device, for its module's methods and `driver_specific`.
    pub(crate) device: Arc<dyn Any + Send + Sync>,
    pub(crate) claims: Vec<Claim>,
    /// The bdevs it claims, released when it is deleted.
    pub(crate) bases: Vec<String>,
    /// Other names it answers to (SPDK's aliases: a logical volume's `lvs/lvol`).
    pub(crate) aliases: Vec<String>,
}

/// A claim on a bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The export or bdev holding it.
    pub holder: String,
    /// "bdev", or the export's kind ("vhost-blk"): a bdev and an export may share a name.
    pub holder_kind: &'static str,
    pub claim_type: ClaimType,
}

/// A running export as the registry keeps it: what every kind has, beside the kind's own part.
pub(crate) struct ExportEntry {
    pub(crate) name: String,
    /// [`ExportKind::name`], also the claim holder's kind in `bdev_get_bdevs`.
    pub(crate) kind: &'static str,
    /// The bdev it serves, as the creating call named it (a name or an alias).
    pub(crate) bdev: String,
    pub(crate) export: Box<dyn Export>,
}

/// A job as the registry keeps it: the handle, and whether its target's claim was released.
pub(crate) struct MirrorEntry {
    pub(crate) job: MirrorJob,
    pub(crate) released: bool,
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
    /// Where persistent dirty bitmaps are kept (`serve --state-dir`); none: none can be made.
    pub state_dir: Option<PathBuf>,
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
            state_dir: None,
        }
    }
}
