//! `bdev_raid_add_base_bdev` and `bdev_raid_remove_base_bdev` (raid1 only: raid0 and concat
//! have no redundancy to lose or rebuild).
//!
//! A removed base leaves its slot Failed with the base's identity kept (the superblock keeps
//! it too): when the same replica comes back, `bdev_raid_add_base_bdev` finds its slot by the
//! identity in the replica's own superblock and rebuilds only the chunks written meanwhile.
//! Any other base takes a free slot and is rebuilt in full.

use fp_bdev::module::{ClaimType, ModuleError, ModuleHost};
use fp_rpc::Params;
use serde_json::Value;

use super::{module_error, owner_link, with_raids, MODULE};
use crate::meta_io::{self, ChannelIo};
use crate::shared::SlotView;
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
    let placed = (|| {
        let info = bdev.info();
        if info.block_size != shared.info.block_size {
            return Err(invalid(
                "base_bdev",
                format!("block size {} differs from the raid's {}", info.block_size, shared.info.block_size),
            ));
        }
        let need = layout.data_offset + shared.info.size_bytes();
        if info.size_bytes() < need {
            return Err(invalid(
                "base_bdev",
                format!(
                    "'{base}' has {} bytes; the raid needs {need} (data offset included)",
                    info.size_bytes()
                ),
            ));
        }
        // The replica's own superblock says whether it was here before.
        let known = if dev.superblock() {
            let sb = ChannelIo::open(bdev.clone()).and_then(|mut io| meta_io::read_superblock(&mut io));
            match sb {
                Ok(Some(sb)) if sb.raid_uuid == dev.uuid() => sb.slots.get(sb.slot as usize).map(|r| r.uuid),
                Ok(_) => None,
                Err(e) => {
                    log::warn!(
                        "raid '{raid}': the superblock of '{base}' cannot be read ({e}): full rebuild"
                    );
                    None
                }
            }
        } else {
            None
        };
        let free = |s: &SlotView| s.bdev.is_none();
        let (slot, partial) = match known
            .and_then(|u| layout.slots.iter().position(|s| free(s) && !u.is_nil() && s.uuid == u))
        {
            Some(i) => (i, layout.slots[i].state == SlotState::Failed),
            None => {
                let i = layout.slots.iter().position(free).expect("checked above");
                (i, false)
            }
        };
        let uuid =
            if partial || !dev.superblock() { layout.slots[slot].uuid } else { crate::device::new_uuid() };
        let view = SlotView {
            state: SlotState::Rebuilding,
            name: Some(base.clone()),
            bdev: Some(bdev.clone()),
            uuid,
        };
        owner_link::add_base(&owner, slot, view, partial).map_err(module_error)?;
        Ok((slot, partial))
    })();
    match placed {
        Ok((slot, partial)) => {
            log::info!(
                "raid '{raid}': '{base}' joins slot {slot}, {} rebuild",
                if partial { "partial" } else { "full" }
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
            l.iter_mut()
                .find_map(|r| r.configuring.as_mut().and_then(|c| c.forget(&name)).map(|()| r.name.clone()))
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
    let layout = shared.layout();
    let others_active =
        layout.slots.iter().enumerate().filter(|&(i, s)| i != slot && s.state == SlotState::Active).count();
    if layout.slots[slot].state == SlotState::Active && others_active == 0 {
        return Err(invalid("name", format!("'{name}' is the last active base of '{raid}'")));
    }
    owner_link::remove_base(&owner, slot).map_err(module_error)?;
    host.release_claim(&name, MODULE, &raid);
    log::info!("raid '{raid}': '{name}' removed from slot {slot}");
    Ok(Value::Bool(true))
}
