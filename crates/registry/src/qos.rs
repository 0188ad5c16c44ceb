//! The registry's QoS groups: named [`QosGroup`]s that bdevs join. A group's members are not
//! listed here but read from the bdevs' disks (each knows its group), so a deleted bdev leaves
//! its group with nothing to update. Per-disk limits live on the disk itself
//! ([`fp_bdev::Disk::set_qos_limits`]). docs/qos.md has the story.

use std::sync::Arc;

use fp_bdev::clock::ticks;
use fp_bdev::disk::DiskQosError;
use fp_bdev::qos::{FairOn, QosError, QosGroup, QosLimits, ThrottleConfig};
use fp_bdev::Disk;

use crate::{Registry, RegistryError};

/// A group as `bdev_qos_get_groups` reports it.
#[derive(Debug, Clone)]
pub struct QosGroupSummary {
    pub name: String,
    pub config: ThrottleConfig,
    pub fair_on: Option<FairOn>,
    /// Each member's bdev name, weight and fair rate in force (units of `fair_on` per second).
    pub members: Vec<QosMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosMember {
    pub bdev_name: String,
    pub weight: u64,
    pub rate: u64,
}

/// A QoS setting refused: the field named is the caller's parameter.
fn invalid(e: QosError) -> RegistryError {
    let field = match &e {
        QosError::BelowMinimum { field, .. }
        | QosError::AboveMaximum { field, .. }
        | QosError::Invalid { field, .. } => field,
        QosError::BadWeight(_) => "weight",
        QosError::GroupFull(_) => "name",
        QosError::NoMember(_) => "bdev_name",
    };
    // The field leads the message already; the registry's prefix names it again.
    let message = e.to_string();
    let reason = message.strip_prefix(&format!("{field}: ")).unwrap_or(&message).to_string();
    RegistryError::Invalid { field, reason }
}

fn disk_error(bdev: &str, e: DiskQosError) -> RegistryError {
    match e {
        DiskQosError::Qos(e) => invalid(e),
        DiskQosError::AccountingOff => {
            RegistryError::NotAllowed { field: "name", reason: format!("bdev '{bdev}': {e}") }
        }
        DiskQosError::InGroup(_) | DiskQosError::NotInGroup(_) => {
            RegistryError::Invalid { field: "bdev_name", reason: format!("bdev '{bdev}' {e}") }
        }
    }
}

impl Registry {
    /// `bdev_set_qos_limit`: changes the limits `change` picks (from the ones in force).
    pub fn set_qos_limits(
        &self,
        bdev: &str,
        change: impl FnOnce(QosLimits) -> QosLimits,
    ) -> Result<(), RegistryError> {
        let disk = self.disk(bdev)?;
        let limits = change(disk.qos_limits());
        disk.set_qos_limits(limits).map_err(|e| disk_error(bdev, e))?;
        log::info!("bdev '{bdev}': QoS limits {limits:?}");
        Ok(())
    }

    fn group(&self, name: &str) -> Result<Arc<QosGroup>, RegistryError> {
        self.lock()
            .qos_groups
            .get(name)
            .cloned()
            .ok_or_else(|| RegistryError::NotFound { kind: "QoS group", name: name.into() })
    }

    /// Creates a group with `config`.
    pub fn qos_group_create(&self, name: &str, config: ThrottleConfig) -> Result<(), RegistryError> {
        if name.is_empty() {
            return Err(RegistryError::Invalid { field: "name", reason: "must not be empty".into() });
        }
        let mut st = self.lock();
        if st.qos_groups.contains_key(name) {
            return Err(RegistryError::AlreadyExists { kind: "QoS group", name: name.into() });
        }
        let g = QosGroup::new(name, ticks::tick_rate());
        g.set(config, ticks::now()).map_err(invalid)?;
        st.qos_groups.insert(name.to_string(), Arc::new(g));
        log::info!("QoS group '{name}' created: {config:?}");
        Ok(())
    }

    /// Changes a group's limits to what `change` makes of the ones in force.
    pub fn qos_group_set(
        &self,
        name: &str,
        change: impl FnOnce(ThrottleConfig) -> ThrottleConfig,
    ) -> Result<(), RegistryError> {
        let g = self.group(name)?;
        let config = change(g.config());
        g.set(config, ticks::now()).map_err(invalid)?;
        // What fair sharing divides may have changed: members' channels look again.
        for (_, disk) in self.members_of(&g) {
            disk.qos_group_changed();
        }
        log::info!("QoS group '{name}' set: {config:?}");
        Ok(())
    }

    /// Deletes a group; refused while bdevs are in it.
    pub fn qos_group_delete(&self, name: &str) -> Result<(), RegistryError> {
        let g = self.group(name)?;
        let members: Vec<String> = self.members_of(&g).into_iter().map(|(n, _)| n).collect();
        if !members.is_empty() {
            let members = members.join(",");
            return Err(RegistryError::HasMembers { kind: "QoS group", name: name.into(), members });
        }
        self.lock().qos_groups.remove(name);
        log::info!("QoS group '{name}' deleted");
        Ok(())
    }

    /// Puts bdev `bdev` in group `name` with `weight`.
    pub fn qos_group_add(&self, name: &str, bdev: &str, weight: u64) -> Result<(), RegistryError> {
        let g = self.group(name)?;
        let disk = self.disk(bdev)?;
        disk.join_qos_group(&g, weight).map_err(|e| disk_error(bdev, e))?;
        log::info!("QoS group '{name}': bdev '{bdev}' added, weight {weight}");
        Ok(())
    }

    pub fn qos_group_remove(&self, name: &str, bdev: &str) -> Result<(), RegistryError> {
        self.group(name)?;
        self.disk(bdev)?.leave_qos_group(name).map_err(|e| disk_error(bdev, e))?;
        log::info!("QoS group '{name}': bdev '{bdev}' removed");
        Ok(())
    }

    pub fn qos_group_set_weight(&self, name: &str, bdev: &str, weight: u64) -> Result<(), RegistryError> {
        self.group(name)?;
        self.disk(bdev)?.set_qos_weight(name, weight).map_err(|e| disk_error(bdev, e))?;
        log::info!("QoS group '{name}': bdev '{bdev}' weight {weight}");
        Ok(())
    }

    /// Every group, or the one named.
    pub fn qos_groups(&self, name: Option<&str>) -> Result<Vec<QosGroupSummary>, RegistryError> {
        let groups: Vec<Arc<QosGroup>> = match name {
            Some(n) => vec![self.group(n)?],
            None => self.lock().qos_groups.values().cloned().collect(),
        };
        Ok(groups
            .iter()
            .map(|g| QosGroupSummary {
                name: g.name().to_string(),
                config: g.config(),
                fair_on: g.fair_on(),
                members: self
                    .members_of(g)
                    .into_iter()
                    .filter_map(|(bdev_name, disk)| {
                        let (_, weight, rate) = disk.qos_group()?;
                        Some(QosMember { bdev_name, weight, rate })
                    })
                    .collect(),
            })
            .collect())
    }

    /// The bdevs in `g`, by name.
    fn members_of(&self, g: &Arc<QosGroup>) -> Vec<(String, Disk)> {
        self.disks()
            .into_iter()
            .filter(|(_, d)| d.qos_group().is_some_and(|(mine, _, _)| Arc::ptr_eq(&mine, g)))
            .collect()
    }
}
