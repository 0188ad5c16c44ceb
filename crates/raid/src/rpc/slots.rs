//! `bdev_raid_add_base_bdev` and `bdev_raid_remove_base_bdev` (raid1 only: raid0 and concat
//! have no redundancy to lose or rebuild).
//!
//! Both are control calls to the raid's owner (owner.rs). A removed base leaves its slot
//! Failed with the base's identity kept in the superblock: when the same replica comes back,
//! `bdev_raid_add_base_bdev` returns it to its slot by the identity in its own superblock and
//! rebuilds only the chunks written meanwhile. Any other base takes a free slot and is
//! rebuilt in full.

use fp_bdev::module::{ClaimType, ModuleError, ModuleHost};
use fp_rpc::Params;
use serde_json::Value;

use super::{module_error, with_raids, MODULE};
use crate::{RaidError, RaidLevel, SlotState};

fn invalid(field: &'static str, reason: impl Into<String>) -> ModuleError {
    module_error(RaidError::InvalidParam { field, reason: reason.into() })
}

/// `bdev_raid_add_base_bdev {raid_bdev, base_bdev}`.
pub(crate) fn add_base_bdev(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let raid = p.required_str("raid_bdev")?;
    let base = p.required_str("base_bdev")?;
    p.finish()?;
    let base = host.bdev_name(&base).unwrap_or(base);
    let found =
        with_raids(host, |l| l.iter().find(|r| r.name == raid).map(|r| (r.device.clone(), r.owner.clone())));
    let (dev, owner) = match found {
        None => return Err(module_error(RaidError::NotFound(format!("no raid bdev '{raid}'")))),
        Some((Some(d), Some(o))) => (d, o),
        Some(_) => {
            return Err(module_error(RaidError::Busy(format!(
                "raid '{raid}' is configuring: its bases join when they appear (examine)"
            ))))
        }
    };
    let shared = dev.shared();
    if shared.level != RaidLevel::Raid1 {
        return Err(invalid("raid_bdev", format!("a {} takes no base once created", shared.level.name())));
    }
    let layout = shared.layout();
    if layout.slots.iter().any(|s| s.name.as_deref() == Some(base.as_str())) {
        return Err(invalid("base_bdev", format!("'{base}' is already a base of '{raid}'")));
    }
    if !layout.slots.iter().any(|s| s.bdev.is_none()) {
        return Err(module_error(RaidError::Busy(format!(
            "raid '{raid}' has no free slot: remove a base first (bdev_raid_remove_base_bdev)"
        ))));
    }
    let bdev = host.claim(&base, MODULE, &raid, ClaimType::ExclusiveWrite)?;
    let info = bdev.info();
    let placed = if info.block_size != shared.info.block_size {
        Err(invalid(
            "base_bdev",
            format!("block size {} differs from the raid's {}", info.block_size, shared.info.block_size),
        ))
    } else {
        // The owner reads the base's own superblock: the replica that left comes back to its
        // slot (partial rebuild; a full rebuild's target resumes), any other base takes a free
        // one (full).
        owner.add_base(base.clone(), bdev.clone()).map_err(module_error)
    };
    match placed {
        Ok(slot) => {
            let partial = shared.layout().slots[slot].state == SlotState::Rebuilding
                && shared.process.kind.load(std::sync::atomic::Ordering::Relaxed) == 1;
            log::info!(
                "raid '{raid}': '{base}' joins slot {slot}{}",
                if partial { " (partial rebuild)" } else { "" }
            );
            Ok(Value::Bool(true))
        }
        Err(e) => {
            host.release_claim(&base, MODULE, &raid);
            Err(e)
        }
    }
}

/// `bdev_raid_remove_base_bdev {name}`: the base `name` leaves its raid (raid1; never its
/// last Active base) and is released.
pub(crate) fn remove_base_bdev(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let name = host.bdev_name(&name).unwrap_or(name);
    let found = with_raids(host, |l| {
        l.iter().find_map(|r| {
            let dev = r.device.as_ref()?;
            let slot =
                dev.shared().layout().slots.iter().position(|s| s.name.as_deref() == Some(name.as_str()))?;
            Some((r.name.clone(), dev.clone(), r.owner.clone()?, slot))
        })
    });
    let Some((raid, dev, owner, slot)) = found else {
        // A base found by examine for a raid still configuring.
        let released = with_raids(host, |l| {
            let raid = l.iter_mut().find_map(|r| {
                r.configuring.as_mut().and_then(|c| c.forget(&name)).map(|()| r.name.clone())
            })?;
            // Its last base gone, a configuring raid is forgotten: nothing of it is left here.
            l.retain(|r| r.configuring.as_ref().is_none_or(|c| !c.found.is_empty()));
            Some(raid)
        });
        return match released {
            Some(raid) => {
                host.release_claim(&name, MODULE, &raid);
                Ok(Value::Bool(true))
            }
            None => Err(module_error(RaidError::NotFound(format!("'{name}' is not a base of any raid")))),
        };
    };
    let shared = dev.shared();
    if shared.level != RaidLevel::Raid1 {
        return Err(invalid(
            "name",
            format!("'{raid}' is a {}: without redundancy its bases cannot be removed", shared.level.name()),
        ));
    }
    // The owner refuses the last in-sync base, and takes the base out durably first.
    owner.remove_base(&name).map_err(module_error)?;
    host.release_claim(&name, MODULE, &raid);
    log::info!("raid '{raid}': '{name}' removed from slot {slot}");
    Ok(Value::Bool(true))
}
