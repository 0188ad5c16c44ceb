//! The registry's running exports: adding one (its name, limit and claim checked under the
//! registry's lock), deleting one, reaching a kind's own.

use std::sync::Arc;

use fp_bdev::{Bdev, ClaimType};

use super::export::Export;
use crate::state::ExportEntry;
use crate::{Claim, Registry, RegistryError};

/// What [`Registry::add_export`] checks before starting an export.
pub struct NewExport<'a> {
    pub name: &'a str,
    /// [`ExportKind::name`](super::ExportKind::name).
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
