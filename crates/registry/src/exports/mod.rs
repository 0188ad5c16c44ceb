//! Exports: what serves a bdev to the outside (a vhost-user-blk controller, an NBD export, an
//! NVMe-oF namespace).
//!
//! An export claims its bdev for as long as it lives, with the claim type it needs (a writable
//! export excludes every other claim, read-only ones share the bdev). Each kind is a folder
//! here: `mod.rs` has its [`Export`], its creation on top of [`Registry::add_export`] and its
//! [`ExportKind`]; `rpc.rs` has its JSON-RPC methods. [`EXPORT_KINDS`] lists the kinds, one line
//! each, and the daemon finds everything else there: methods, configuration tables, metrics.
//! docs/architecture.md, "Adding an export", walks through one.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::{Bdev, ClaimType};

use crate::methods::MethodFn;
use crate::metrics::{Family, MetricsCall};
use crate::{Claim, Registry, RegistryError};

pub mod nbd;
pub mod nvmf;
pub mod options;
pub mod vhost_blk;

pub use options::{KindOption, KindOptions, OptionError, OptionType, OptionValue, OptionValues};

/// Every export kind, in the order the configuration file applies their tables.
pub static EXPORT_KINDS: &[&dyn ExportKind] = &[&vhost_blk::VhostBlkKind, &nbd::NbdKind, &nvmf::NvmfKind];

/// A kind of export, as the daemon sees it beside its running exports: a bdev module's
/// counterpart ([`fp_bdev::BdevModule`]).
pub trait ExportKind: Sync {
    /// "vhost-blk", "nbd": the kind of its exports, the claim holder's kind in
    /// `bdev_get_bdevs`.
    fn name(&self) -> &'static str;

    /// Its JSON-RPC methods.
    fn methods(&self) -> &'static [(&'static str, MethodFn)];

    /// The configuration file's arrays of tables for it (`vhost_blk` for `[[vhost_blk]]`) and
    /// the method whose parameters each table holds, in the order the file applies them (the
    /// NVMe-oF kind has one per object: transport, subsystem, listener, host, namespace).
    fn config_tables(&self) -> &'static [ConfigTable];

    /// Its daemon-wide options (bounds, switches), each a key of a configuration table and
    /// most a flag of `flashpath serve`, which builds and reads them from this list; its
    /// [`ExportKind::init`] gets their values by key ([`KindInit::options`]).
    fn options(&self) -> &'static [KindOption] {
        &[]
    }

    /// Its metric families for one scrape, read through `call` (a method and its parameters),
    /// the same methods the RPC answers, so the endpoint and the RPC cannot disagree.
    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family>;

    /// Makes the kind's daemon-wide state (a server with its listeners, a target with its
    /// subsystems) as the registry is made, from its options; its methods find it
    /// again with [`Registry::kind_state`]. `None` (the default) for a kind with no state
    /// beyond its exports.
    fn init(&self, init: &KindInit<'_>) -> Option<Arc<dyn Any + Send + Sync>> {
        let _ = init;
        None
    }

    /// The daemon is stopping, before its exports stop: close what would let new clients in
    /// (listeners) and disconnect the ones the kind holds beside its exports.
    fn shutdown(&self, registry: &Registry) {
        let _ = registry;
    }

    /// The longest the stop of one of its exports may take at shutdown (a vhost-user queue's
    /// default stop bound, an NVMe-oF namespace's drain): the exports' shutdown deadline,
    /// [`Registry::export_stop_bound`], is the longest of the kinds', the daemon's stop bound,
    /// [`Registry::daemon_stop_bound`], the shortest.
    fn stop_bound(&self, registry: &Registry) -> Option<Duration> {
        let _ = registry;
        None
    }
}

/// What an export kind's [`ExportKind::init`] builds its state from.
pub struct KindInit<'a> {
    /// The daemon's reactors, where its connections run.
    pub reactors: &'a [fp_reactor::ReactorHandle],
    /// The kind's own options ([`ExportKind::options`]), by key.
    pub options: OptionValues<'a>,
}

pub use fp_bdev::ConfigTable;

/// Every kind's configuration tables, in the order the configuration file applies them.
pub fn config_tables() -> impl Iterator<Item = ConfigTable> {
    EXPORT_KINDS.iter().flat_map(|k| k.config_tables().iter().copied())
}

/// Every kind's options, in the order of [`EXPORT_KINDS`].
pub fn all_options() -> impl Iterator<Item = &'static KindOption> {
    EXPORT_KINDS.iter().flat_map(|k| k.options().iter())
}

/// The export kind called `name`.
pub fn find_kind(name: &str) -> Option<&'static dyn ExportKind> {
    EXPORT_KINDS.iter().copied().find(|k| k.name() == name)
}

/// A running export: only what differs between kinds. Its name, kind, bdev and claim are the
/// registry's, given once to [`Registry::add_export`].
pub trait Export: Send + Sync {
    /// Its bdev changed size (now `size_bytes`): offer the new size to its clients and tell
    /// them if the protocol can.
    fn resized(&self, size_bytes: u64);

    /// Disconnects its clients and releases what it holds; waits for in-flight requests.
    fn stop(self: Box<Self>);

    /// [`Export::stop`] as the daemon shuts down, every export at once ([`Registry::shutdown`]):
    /// what it waits for ends by `bound`, the daemon's stop bound, and what is left then is
    /// logged, naming the export. By default `stop`, for kinds whose stop has its own bound (a
    /// vhost-user queue's `stop_timeout_ms`, the NVMe-oF target's drain timeout).
    fn stop_at_shutdown(self: Box<Self>, bound: std::time::Duration) {
        let _ = bound;
        self.stop();
    }

    /// For the kind's own methods ([`Registry::with_export`]).
    fn as_any(&self) -> &dyn Any;
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

/// What [`Registry::add_export`] checks before starting an export.
pub struct NewExport<'a> {
    pub name: &'a str,
    /// [`ExportKind::name`].
    pub kind: &'static str,
    /// What errors call it ("controller").
    pub label: &'static str,
    pub bdev_name: &'a str,
    pub claim_type: ClaimType,
    /// The export of the same bdev this one takes over in a live migration (docs/migration.md):
    /// the two may share the bdev, which no third export may then join.
    pub migrate_from: Option<&'a str>,
}

/// A migration destination may share its bdev with the one writable export it names, and only
/// while that export is the bdev's only holder: one source, one destination.
fn check_takeover(claims: &[Claim], bdev_name: &str, source: &str) -> Result<(), RegistryError> {
    let invalid = |reason: String| Err(RegistryError::Invalid { field: "migrate_from", reason });
    match claims {
        [only] if only.holder == source && only.claim_type == ClaimType::ExclusiveWrite => Ok(()),
        [only] if only.holder == source => {
            invalid(format!("export '{source}' of bdev '{bdev_name}' is read-only: nothing to take over"))
        }
        [] => invalid(format!("bdev '{bdev_name}' has no export '{source}' to take over")),
        held if held.iter().any(|c| c.holder == source) && held.len() == 2 => invalid(format!(
            "bdev '{bdev_name}' already has a migration destination ('{}'): one per disk",
            held.iter().find(|c| c.holder != source).map_or("", |c| c.holder.as_str())
        )),
        held => invalid(format!(
            "'{source}' is not the only holder of bdev '{bdev_name}' (held by {})",
            crate::bdevs::holders(held).unwrap_or_default()
        )),
    }
}

impl Registry {
    /// Adds an export: `start` builds it from its bdev once the name, the limit and the claim
    /// are checked, all under the registry's lock so a concurrent call cannot take the bdev
    /// meanwhile.
    pub fn add_export(
        &self,
        new: NewExport<'_>,
        start: impl FnOnce(Bdev) -> Result<Box<dyn Export>, RegistryError>,
    ) -> Result<(), RegistryError> {
        let NewExport { name, kind, label, bdev_name, claim_type, migrate_from } = new;
        let mut st = self.lock();
        if st.exports.contains_key(name) {
            return Err(RegistryError::AlreadyExists { kind: label, name: name.into() });
        }
        // One limit per kind: `limits.max_exports` vhost-blk controllers, and as many NBD exports.
        let max = self.options.limits.max_exports;
        if st.exports.values().filter(|e| e.kind == kind).count() >= max {
            return Err(RegistryError::LimitReached {
                kind: label,
                name: name.into(),
                limit: max,
                setting: "limits.max_exports",
            });
        }
        let entry = st
            .entry_mut(bdev_name)
            .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: bdev_name.into() })?;
        match migrate_from {
            None => entry.check_claim(bdev_name, claim_type)?,
            Some(source) => check_takeover(&entry.claims, bdev_name, source)?,
        }
        // The export opens its channels through the bdev's disk (statistics, histograms).
        let export = start(Arc::new(entry.disk.clone()))?;
        entry.claims.push(Claim { holder: name.into(), holder_kind: kind, claim_type });
        log::info!("{kind} export '{name}' serving bdev '{bdev_name}' ({})", claim_type.name());
        st.exports
            .insert(name.into(), ExportEntry { name: name.into(), kind, bdev: bdev_name.into(), export });
        Ok(())
    }

    /// Stops the export `name` (of `kind`, when given; `label` names it in errors) and releases
    /// its bdev.
    pub fn delete_export(&self, name: &str, kind: Option<(&str, &'static str)>) -> Result<(), RegistryError> {
        let export = {
            let mut st = self.lock();
            let label = kind.map_or("export", |(_, label)| label);
            match st.exports.get(name) {
                Some(e) if kind.is_none_or(|(k, _)| e.kind == k) => {}
                _ => return Err(RegistryError::NotFound { kind: label, name: name.into() }),
            }
            let export = st.exports.remove(name).expect("looked up under the same lock");
            st.release(&export.bdev, export.kind, name);
            export
        };
        // Stopping waits for the queues to drain: do it without holding the registry lock.
        let kind = export.kind;
        export.export.stop();
        log::info!("{kind} export '{name}' deleted");
        Ok(())
    }

    /// Runs `f` on the export `name` of type `T`; `label` names the kind in the "does not
    /// exist" error.
    pub fn with_export<T: 'static, R>(
        &self,
        name: &str,
        label: &'static str,
        f: impl FnOnce(&T) -> R,
    ) -> Result<R, RegistryError> {
        let st = self.lock();
        st.exports
            .get(name)
            .and_then(|e| e.export.as_any().downcast_ref::<T>())
            .map(f)
            .ok_or_else(|| RegistryError::NotFound { kind: label, name: name.into() })
    }

    /// `f` of every export of type `T`, in name order.
    pub fn map_exports<T: 'static, R>(&self, f: impl Fn(&T) -> R) -> Vec<R> {
        let st = self.lock();
        st.exports.values().filter_map(|e| e.export.as_any().downcast_ref::<T>()).map(f).collect()
    }
}
