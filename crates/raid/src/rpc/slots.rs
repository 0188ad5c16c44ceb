//! `bdev_raid_add_base_bdev` and `bdev_raid_remove_base_bdev` (raid1 only: raid0 and concat
//! have no redundancy to lose or rebuild).
//!
//! Both are control calls to the raid's owner (owner.rs). A removed base leaves its slot
//! Failed with the base's identity kept in the superblock: when the same replica comes back,
//! `bdev_raid_add_base_bdev` returns it to its slot by the identity in its own superblock and
//! rebuilds only the chunks written meanwhile. Any other base takes a free slot and is
//! rebuilt in full.
//!
//! A removal answers once the base is out of reach: every channel of the raid has taken up the
//! layout without it and none has a request to it in flight ([`REMOVE_DRAIN_WAIT`] at most;
//! past it the base stays claimed until they end).

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::module::{ClaimType, ModuleError, ModuleHost};
use fp_bdev::Bdev;
use fp_rpc::Params;
use serde_json::Value;

use crate::owner::{CallWait, OwnerHandle, RemoveWait, OWNER_WAIT};
use crate::shared::RaidShared;
use crate::table::{module_error, with_raids, MODULE};
use crate::{RaidError, RaidLevel, SlotState};

/// How long `bdev_raid_remove_base_bdev` waits for the raid's channels to be done with the
/// base (every channel on the layout without it, no request to it left in flight) before it
/// answers an error and leaves the base claimed until they are.
pub const REMOVE_DRAIN_WAIT: Duration = Duration::from_secs(5);

/// How often the removal looks at the channels meanwhile.
const DRAIN_POLL: Duration = Duration::from_millis(1);

/// How often a base left claimed past [`REMOVE_DRAIN_WAIT`] is looked at.
const RELEASE_POLL: Duration = Duration::from_millis(10);

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
        match add_to_owner(host, &owner, &raid, &base, bdev.clone()) {
            Added::Slot(slot) => Ok(slot),
            Added::Refused(e) => Err(module_error(e)),
            // Claimed until the owner answers: released then if it refused the base.
            Added::UnderWay(e) => return Err(module_error(e)),
        }
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

/// How an addition the owner was asked for ([`add_to_owner`]) stands when the call answers.
pub(crate) enum Added {
    /// Added, in this slot.
    Slot(usize),
    /// Refused, or not taken up within [`OWNER_WAIT`] (nothing changed): the caller releases
    /// the base's claim.
    Refused(RaidError),
    /// Still under way past [`OWNER_WAIT`]: the base stays claimed, and is released if the
    /// owner refuses it in the end.
    UnderWay(RaidError),
}

/// Asks the owner of raid `raid` to add the claimed base `base` ([`OwnerHandle::add_base`]),
/// waited for [`OWNER_WAIT`] at most: a base that answers the owner's metadata writes Busy
/// holds it up for as long as it does.
pub(crate) fn add_to_owner(
    host: &dyn ModuleHost,
    owner: &OwnerHandle,
    raid: &str,
    base: &str,
    bdev: Bdev,
) -> Added {
    let answer = match owner.add_base(base.to_string(), bdev, OWNER_WAIT) {
        Err(e) => return Added::Refused(e),
        Ok(CallWait::Answered(Ok(slot))) => return Added::Slot(slot),
        Ok(CallWait::Answered(Err(e))) => return Added::Refused(e),
        Ok(CallWait::Withdrawn) => {
            return Added::Refused(owner.not_taken_up(&format!("the addition of '{base}'"), OWNER_WAIT))
        }
        Ok(CallWait::UnderWay(answer)) => answer,
    };
    let (raid, base) = (raid.to_string(), base.to_string());
    let weak = host.weak_handle();
    let spawned = std::thread::Builder::new().name(format!("raid-add-{base}")).spawn({
        let (raid, base) = (raid.clone(), base.clone());
        move || match answer.recv() {
            Ok(Ok(slot)) => log::info!("raid '{raid}': '{base}' joins slot {slot} (late)"),
            Ok(Err(e)) => {
                log::warn!("raid '{raid}': '{base}' was refused after all: {e}; released");
                if let Some(h) = weak.and_then(|w| w.upgrade()) {
                    h.release_claim(&base, MODULE, &raid);
                }
            }
            Err(_) => {
                log::warn!("raid '{raid}': its owner ended before it answered the addition of '{base}'")
            }
        }
    });
    if let Err(e) = spawned {
        log::warn!(
            "raid '{raid}': '{base}' stays claimed whatever the owner answers: no thread to wait for it: {e}"
        );
    }
    Added::UnderWay(RaidError::Busy(format!(
        "'{base}' is joining raid '{raid}', but after {} s its owner was still writing metadata to a base \
         that answers Busy; it stays claimed, and is released if the owner refuses it \
         (bdev_raid_get_bdevs shows its slot once it joined)",
        OWNER_WAIT.as_secs()
    )))
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
    // The owner refuses the last in-sync base. Any other is marked leaving first: the owner's
    // metadata I/O to it then gives a Busy up instead of retrying it, so a base that stays
    // busy cannot keep the owner from taking the removal up (the owner clears the mark).
    let layout = shared.layout();
    let active = |i: usize| layout.slots[i].state == SlotState::Active;
    let last_in_sync = active(slot) && !(0..layout.slots.len()).any(|i| i != slot && active(i));
    if !last_in_sync {
        shared.set_leaving(&name, true);
    }
    // The owner takes the base out durably (the other bases' superblocks) and publishes.
    match owner.remove_base(&name, REMOVE_DRAIN_WAIT) {
        Err(e) => {
            shared.set_leaving(&name, false);
            return Err(module_error(e));
        }
        Ok(RemoveWait::Answered(r)) => {
            r.map_err(module_error)?;
        }
        Ok(RemoveWait::Withdrawn) => {
            return Err(module_error(RaidError::Busy(format!(
                "raid '{raid}' did not take up the removal of '{name}' within {} s: its owner is \
                 still writing metadata to a base that answers Busy; nothing changed",
                REMOVE_DRAIN_WAIT.as_secs()
            ))));
        }
        Ok(RemoveWait::UnderWay(answer)) => {
            release_when_drained(host, shared.clone(), raid.clone(), name.clone(), slot, Some(answer));
            return Err(module_error(RaidError::Busy(format!(
                "'{name}' is leaving raid '{raid}' (slot {slot}), but after {} s its owner was still \
                 writing the other bases' superblocks; it stays claimed until that and its \
                 requests end",
                REMOVE_DRAIN_WAIT.as_secs()
            ))));
        }
    }
    // Published: from here on no channel that acknowledges this epoch sends the base anything.
    let epoch = shared.epoch();
    let deadline = Instant::now() + REMOVE_DRAIN_WAIT;
    let state = loop {
        let state = shared.drain_state(slot, epoch);
        if state.drained() || Instant::now() >= deadline {
            break state;
        }
        std::thread::sleep(DRAIN_POLL);
    };
    if state.drained() {
        host.release_claim(&name, MODULE, &raid);
        log::info!("raid '{raid}': '{name}' removed from slot {slot}");
        return Ok(Value::Bool(true));
    }
    // Never released under I/O: a thread of its own releases the base once it drained.
    release_when_drained(host, shared.clone(), raid.clone(), name.clone(), slot, None);
    let what = match (state.in_flight, state.unacknowledged) {
        (n, 0) => format!("{n} request{} to it still in flight", plural(n)),
        (n, c) => format!(
            "{n} request{} to it still in flight and {c} channel{} that had not taken up the new \
             layout (their requests to it unknown)",
            plural(n),
            plural(c as u64)
        ),
    };
    Err(module_error(RaidError::Busy(format!(
        "'{name}' left raid '{raid}' (slot {slot}), but after waiting {} s there were {what}; it stays \
         claimed until they end",
        REMOVE_DRAIN_WAIT.as_secs()
    ))))
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Releases the removed base `name` once nothing can reach it any more (see
/// [`RaidShared::drain_state`]): a thread that looks every [`RELEASE_POLL`]. `removal`: the
/// owner's answer still to come (a removal under way past the bound); the base is released
/// only if the owner took it out. It has no bound: the base's requests end when the base
/// answers them, or fail when it is deleted (which its claim prevents meanwhile), and the
/// raid's channels close with the raid. It ends without releasing when the registry is gone.
fn release_when_drained(
    host: &dyn ModuleHost,
    shared: Arc<RaidShared>,
    raid: String,
    name: String,
    slot: usize,
    removal: Option<Receiver<Result<Option<Bdev>, RaidError>>>,
) {
    // Published before the owner answered: the layout without the base is this epoch's or
    // an older one's.
    let epoch = shared.epoch();
    let Some(weak) = host.weak_handle() else {
        log::warn!("raid '{raid}': '{name}' stays claimed: nothing here can release it once it drains");
        return;
    };
    let thread_name = format!("raid-release-{name}");
    let spawned = std::thread::Builder::new().name(thread_name).spawn(move || {
        let epoch = match removal {
            None => epoch,
            Some(answer) => match answer.recv() {
                Ok(Ok(_)) => shared.epoch(),
                Ok(Err(e)) => {
                    log::warn!("raid '{raid}': the removal of '{name}' was refused after all: {e}");
                    return;
                }
                Err(_) => return,
            },
        };
        release_drained(&shared, &weak, &raid, &name, slot, epoch);
    });
    if let Err(e) = spawned {
        log::warn!("raid: a removed base stays claimed: cannot start the thread that releases it: {e}");
    }
}

fn release_drained(
    shared: &RaidShared,
    weak: &std::sync::Weak<dyn ModuleHost + Send + Sync>,
    raid: &str,
    name: &str,
    slot: usize,
    epoch: u64,
) {
    loop {
        if shared.drain_state(slot, epoch).drained() {
            if let Some(h) = weak.upgrade() {
                h.release_claim(name, MODULE, raid);
                log::info!("raid '{raid}': '{name}' released: its last request ended");
            }
            return;
        }
        if weak.strong_count() == 0 {
            return;
        }
        std::thread::sleep(RELEASE_POLL);
    }
}
