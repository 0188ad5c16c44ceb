//! The registry's bdevs: their entries (device, disk, claims, aliases), what
//! `bdev_get_bdevs` reports of them, and their deletion.

use fp_bdev::{BdevInfo, ClaimType};

use crate::state::{BdevEntry, Claim};
use crate::{modules, Limits, Registry, RegistryError};

/// Refuses a RAM bdev larger than [`Limits::max_malloc_bytes`]. The geometry is validated first
/// so that a size that does not even fit 64 bits gets the usual geometry error.
pub(crate) fn check_malloc_size(
    name: &str,
    block_size: u32,
    num_blocks: u64,
    limits: &Limits,
) -> Result<(), RegistryError> {
    fp_bdev::validate_geometry(name, block_size, num_blocks)?;
    let size = num_blocks.saturating_mul(u64::from(block_size));
    if size > limits.max_malloc_bytes {
        return Err(RegistryError::Invalid {
            field: "num_blocks",
            reason: format!(
                "{num_blocks} blocks of {block_size} bytes are {size} bytes, more than the {} allowed \
                 for a RAM bdev (limits.max_malloc_bytes, by default the machine's RAM)",
                limits.max_malloc_bytes
            ),
        });
    }
    Ok(())
}

/// A bdev as `bdev_get_bdevs` reports it.
#[derive(Debug, Clone)]
pub struct BdevSummary {
    pub info: BdevInfo,
    /// Other names it answers to (a logical volume's `lvs/lvol`).
    pub aliases: Vec<String>,
    /// Who builds on it (SPDK's `claimed`, `claim_type`): exports and stacked bdevs.
    pub claims: Vec<Claim>,
    /// `driver_specific.<driver>`, as its module reports it.
    pub driver_specific: serde_json::Map<String, serde_json::Value>,
    /// `assigned_rate_limits`.
    pub qos_limits: fp_bdev::qos::QosLimits,
    /// The QoS group it is in and its weight there.
    pub qos_group: Option<(String, u64)>,
    /// It refuses writes now (a snapshot, a volume set read-only): `supported_io_types` then
    /// says so, as SPDK's does.
    pub read_only: bool,
}

impl BdevSummary {
    /// The holders' names, for messages and `claimed_by`; `None` when unclaimed.
    pub fn claimed_by(&self) -> Option<String> {
        holders(&self.claims)
    }
}

/// The holders of `claims`, comma-separated; `None` when there are none.
pub(crate) fn holders(claims: &[Claim]) -> Option<String> {
    (!claims.is_empty()).then(|| claims.iter().map(|c| c.holder.as_str()).collect::<Vec<_>>().join(","))
}

impl BdevEntry {
    /// Refuses a `claim_type` claim that the claims held exclude.
    pub(crate) fn check_claim(&self, name: &str, claim_type: ClaimType) -> Result<(), RegistryError> {
        let held: Vec<ClaimType> = self.claims.iter().map(|c| c.claim_type).collect();
        match holders(&self.claims) {
            Some(by) if !claim_type.compatible_with(&held) => {
                Err(RegistryError::InUse { name: name.into(), by })
            }
            _ => Ok(()),
        }
    }
}

impl Registry {
    /// Deletes a bdev. `driver`, when given, must match (SPDK's `bdev_null_delete` does not delete
    /// a malloc bdev). Refused while it is claimed; releases the bdevs it claims.
    pub fn delete_bdev(&self, name: &str, driver: Option<&str>) -> Result<(), RegistryError> {
        let mut st = self.lock();
        let name = &st
            .canonical(name)
            .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: name.into() })?
            .to_string();
        let entry = &st.bdevs[name];
        if let Some(d) = driver {
            if entry.module != d {
                return Err(RegistryError::NotFound { kind: "bdev", name: format!("{name}' of type '{d}") });
            }
        }
        if let Some(by) = holders(&entry.claims) {
            return Err(RegistryError::InUse { name: name.into(), by });
        }
        if let Some(job) = Registry::mirror_on(&st, name) {
            return Err(RegistryError::InUse { name: name.into(), by: format!("mirror {job}") });
        }
        if let Some(job) = Registry::backup_on(&st, name) {
            return Err(RegistryError::InUse { name: name.into(), by: format!("backup {job}") });
        }
        if let Some(fleece) = Registry::fleece_on(&st, name) {
            return Err(RegistryError::InUse { name: name.into(), by: format!("fleece {fleece}") });
        }
        if let Some(removed) = st.bdevs.remove(name) {
            for alias in &removed.aliases {
                st.aliases.remove(alias);
            }
            removed.disk.notify(&fp_bdev::DiskEvent::Removed);
            // The bitmaps go with the bdev; the persistent ones wait, closed cleanly, for a bdev
            // of this name and size to come back.
            self.save_dirty_bitmaps(name, &removed.disk);
            for base in &removed.bases {
                st.release(base, "bdev", name);
            }
        }
        log::info!("bdev '{name}' deleted");
        Ok(())
    }

    /// All bdevs, or the one named.
    pub fn bdevs(&self, name: Option<&str>) -> Result<Vec<BdevSummary>, RegistryError> {
        let st = self.lock();
        let summary = |e: &BdevEntry| {
            let info = e.bdev.info().clone();
            let driver_specific = match modules::find(e.module) {
                Some(m) => m.driver_specific(&info, e.device.as_ref()),
                None => serde_json::Map::new(),
            };
            BdevSummary {
                info,
                aliases: e.aliases.clone(),
                claims: e.claims.clone(),
                driver_specific,
                qos_limits: e.disk.qos_limits(),
                qos_group: e.disk.qos_group().map(|(g, weight, _)| (g.name().to_string(), weight)),
                read_only: e.bdev.read_only(),
            }
        };
        match name {
            Some(n) => st
                .entry(n)
                .map(|e| vec![summary(e)])
                .ok_or_else(|| RegistryError::NotFound { kind: "bdev", name: n.into() }),
            None => Ok(st.bdevs.values().map(summary).collect()),
        }
    }
}
