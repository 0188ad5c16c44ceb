//! Assembly from superblocks (SPDK's examine): every new bdev is read for a raid superblock;
//! a base that has one is claimed for its raid, which is listed as `configuring` until every
//! slot the newest superblock (highest `seq` among the bases found) lists Active is present,
//! then assembled (docs/raid.md, "Slot states and trust").
//!
//! * a base whose raid uuid differs from the raid of that name already known is refused
//!   ("superblock from another raid") and left unclaimed;
//! * a base with an older `seq` than the newest is never trusted as a source: it joins as a
//!   rebuild target once the raid is assembled (full, unless its slot is Failed or
//!   Rebuilding in the newest superblock with its identity: partial, or a full rebuild
//!   resumed from its checkpoint);
//! * a base that appears for a raid already assembled, in a free slot that names it, joins
//!   the same way (a replica coming back).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::module::{ClaimType, ModuleHost, NewBdev};
use fp_bdev::Bdev;

use crate::device::{RaidDevice, RaidSpec};
use crate::format::Superblock;
use crate::meta_io::{self, ChannelIo};
use crate::owner::{BaseSpec, OwnerHandle};
use crate::rpc::Added;
use crate::shared::SlotView;
use crate::table::{with_raids, RaidEntry, RaidModule, MODULE};
pub use crate::table::{Configuring, Found};
use crate::{RaidError, SlotState};

/// The module's examine of the new bdev `name`.
pub fn examine(host: &dyn ModuleHost, name: &str, driver: &'static str) {
    if driver == "null" {
        return;
    }
    let Some((bdev, _)) = host.bdev(name) else { return };
    // Probed through the device under the bdev's statistics layer: examine reads every new
    // bdev, and those reads are nobody's I/O (as the lvstore's probe).
    let raw = bdev.as_disk().map_or_else(|| bdev.clone(), |d| d.bdev().clone());
    let sb = match ChannelIo::open(raw.clone()).and_then(|mut io| meta_io::read_superblock(&mut io)) {
        Ok(Some(sb)) => sb,
        Ok(None) => return,
        Err(e) => {
            log::debug!("bdev '{name}': no raid superblock read: {e}");
            return;
        }
    };
    // A base shrunk since the superblock was written, or a crafted superblock, would send the
    // raid's I/O past the base's end: refused before anything is claimed.
    if let Err(e) = sb.check_base_size(usize::from(sb.slot), raw.info().size_bytes()) {
        log::warn!("bdev '{name}': not taken for raid '{}': {e}", sb.name);
        return;
    }
    if let Err(e) = take(host, name, sb) {
        log::warn!("bdev '{name}': {e}");
    }
}

/// How long examine waits for another examine that is assembling the same raid (owner thread
/// started, metadata read, bdev registered) before it gives up on the base it found.
pub const ASSEMBLY_WAIT: Duration = Duration::from_secs(10);

/// What the module knows of a raid, seen by one examine.
enum Known {
    /// Not known: the base starts a configuring raid.
    None,
    /// A raid of that name but another uuid (or not one examine can join).
    Other,
    Assembled(Arc<RaidDevice>, Arc<OwnerHandle>),
    Configuring,
    /// Another examine took the raid's configuring list and is assembling it.
    Assembling,
}

fn known(entry: Option<&RaidEntry>, sb: &Superblock) -> Known {
    let Some(r) = entry else { return Known::None };
    match (&r.device, &r.owner, &r.configuring) {
        (Some(d), Some(o), _) if d.uuid() == sb.raid_uuid => Known::Assembled(d.clone(), o.clone()),
        (None, _, Some(c)) if c.newest().raid_uuid == sb.raid_uuid => Known::Configuring,
        (None, None, None) => Known::Assembling,
        _ => Known::Other,
    }
}

fn another_raid(raid: &str, sb: &Superblock) -> RaidError {
    RaidError::Metadata(format!(
        "superblock from another raid: '{raid}' ({}) is not the raid of that name here; not taken",
        sb.raid_uuid
    ))
}

/// Takes base `name` carrying `sb` for its raid.
///
/// Examines run concurrently (each bdev's on the thread that created it), and so do deletes:
/// what the module knows is read again, and acted on, in the one lock section that adds the
/// base to a configuring raid, after the claim (which cannot be taken under that lock).
fn take(host: &dyn ModuleHost, name: &str, sb: Superblock) -> Result<(), RaidError> {
    let raid = sb.name.clone();
    match with_raids(host, |l| known(l.iter().find(|r| r.name == raid), &sb)) {
        Known::Other => return Err(another_raid(&raid, &sb)),
        Known::None if host.bdev_exists(&raid) => {
            return Err(RaidError::Busy(format!(
                "its raid '{raid}' is named like another bdev; not assembled"
            )))
        }
        _ => {}
    }
    let bdev = host
        .claim(name, MODULE, &raid, ClaimType::ExclusiveWrite)
        .map_err(|e| RaidError::Busy(format!("raid '{raid}' cannot claim it: {e}")))?;
    let release = || host.release_claim(name, MODULE, &raid);
    let deadline = Instant::now() + ASSEMBLY_WAIT;
    let mut found = Some(Found { name: name.to_string(), bdev, sb: sb.clone() });
    loop {
        enum Step {
            Added { ready: bool },
            Join(Arc<RaidDevice>, Arc<OwnerHandle>),
            Wait,
            Refused,
        }
        let step = with_raids(host, |l| {
            let entry = l.iter_mut().find(|r| r.name == raid);
            match known(entry.as_deref(), &sb) {
                Known::None => {
                    let c = Configuring { found: found.take().into_iter().collect() };
                    let ready = c.complete();
                    l.push(RaidEntry { name: raid.clone(), device: None, owner: None, configuring: Some(c) });
                    Step::Added { ready }
                }
                Known::Configuring => {
                    let c = entry.and_then(|r| r.configuring.as_mut()).expect("known() saw it configuring");
                    c.found.extend(found.take());
                    Step::Added { ready: c.complete() }
                }
                Known::Assembled(dev, owner) => Step::Join(dev, owner),
                Known::Assembling => Step::Wait,
                Known::Other => Step::Refused,
            }
        });
        match step {
            Step::Added { ready } => {
                log::info!("bdev '{name}': a base of raid '{raid}'");
                if ready {
                    assemble(host, &raid)?;
                }
                return Ok(());
            }
            Step::Join(dev, owner) => {
                let bdev = found.take().expect("not added").bdev;
                return rejoin(host, &dev, &owner, name, bdev, &sb).inspect_err(|_| release());
            }
            Step::Wait if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Step::Wait => {
                release();
                return Err(RaidError::Busy(format!(
                    "raid '{raid}' stayed in assembly for {} s; not taken (recreate the bdev to examine it again)",
                    ASSEMBLY_WAIT.as_secs()
                )));
            }
            Step::Refused => {
                release();
                return Err(another_raid(&raid, &sb));
            }
        }
    }
}

/// A base of the assembled raid `dev` appeared: it joins the free slot that names it; the
/// owner decides partial or full from its superblock.
fn rejoin(
    host: &dyn ModuleHost,
    dev: &RaidDevice,
    owner: &OwnerHandle,
    name: &str,
    bdev: Bdev,
    sb: &Superblock,
) -> Result<(), RaidError> {
    let layout = dev.shared().layout();
    let slot = usize::from(sb.slot);
    let mine = sb.slots.get(slot).map(|r| r.uuid);
    if !layout.slots.get(slot).is_some_and(|v| v.bdev.is_none() && Some(v.uuid) == mine) {
        return Err(RaidError::Busy(format!(
            "raid '{}' is assembled and has no free slot for it",
            dev.shared().info.name
        )));
    }
    let raid = &dev.shared().info.name;
    match crate::rpc::add_to_owner(host, owner, raid, name, bdev) {
        Added::Slot(slot) => {
            log::info!("raid '{raid}': '{name}' is back, in slot {slot}");
            Ok(())
        }
        Added::Refused(e) => Err(e),
        // Stays claimed until the owner answers.
        Added::UnderWay(e) => {
            log::warn!("{e}");
            Ok(())
        }
    }
}

/// Assembles the configuring raid `raid`: the device from the newest superblock, the owner
/// over the bases found current (and the returning ones: Failed or Rebuilding in the newest
/// superblock, which it rebuilds), then the bdev; bases with an older superblock that the
/// newest lists Active join afterwards as full rebuild targets, never as sources.
fn assemble(host: &dyn ModuleHost, raid: &str) -> Result<(), RaidError> {
    let Some(c) =
        with_raids(host, |l| l.iter_mut().find(|r| r.name == raid).and_then(|r| r.configuring.take()))
    else {
        return Ok(());
    };
    let sb = c.newest().clone();
    let mut members: Vec<Option<BaseSpec>> = vec![None; sb.slots.len()];
    let mut later = Vec::new();
    let mut strays = Vec::new();
    for f in c.found {
        let i = usize::from(f.sb.slot);
        // A slot the newest superblock does not have, or that names another base: a stray.
        let Some(rec) = sb.slots.get(i) else {
            strays.push(f.name);
            continue;
        };
        if f.sb.slots.get(i).map(|r| r.uuid) != Some(rec.uuid) || members[i].is_some() {
            strays.push(f.name);
        } else if let Err(e) = sb.check_base_size(i, f.bdev.info().size_bytes()) {
            // Its own superblock fit it (examine checked); the newest one's record must too.
            log::warn!("raid '{raid}': base '{}' refused: {e}", f.name);
            strays.push(f.name);
        } else if rec.state == SlotState::Active && f.sb.seq != sb.seq {
            // Stale: never a member as it is; it joins afterwards as a rebuild target. (A full
            // copy cut short keeps its Rebuilding record, or was given a new identity when it
            // failed: the owner tells which from the newest superblock.)
            later.push(f);
        } else {
            members[i] = Some(BaseSpec { name: f.name, bdev: f.bdev });
        }
    }
    for n in strays {
        log::warn!("raid '{raid}': a base claims a slot that names another; '{n}' released");
        host.release_claim(&n, MODULE, raid);
    }
    let mut claimed: Vec<String> = members.iter().flatten().map(|m| m.name.clone()).collect();
    claimed.extend(later.iter().map(|f| f.name.clone()));
    let release = |names: &[String]| {
        for n in names {
            host.release_claim(n, MODULE, raid);
        }
    };
    let spec = RaidSpec {
        name: sb.name.clone(),
        uuid: sb.raid_uuid,
        level: sb.level,
        strip_bytes: u64::from(sb.strip_size_kb) * 1024,
        superblock: true,
        block_size: sb.block_size,
        data_offset: sb.data_offset,
        slots: members
            .iter()
            .zip(&sb.slots)
            .map(|(m, r)| SlotView {
                state: if m.is_some() { r.state } else { SlotState::Failed },
                name: m.as_ref().map(|m| m.name.clone()),
                bdev: m.as_ref().map(|m| m.bdev.clone()),
                uuid: r.uuid,
            })
            .collect(),
        base_data_bytes: sb.slots.iter().map(|r| r.data_bytes).collect(),
        chunk_bytes: sb.bitmap_chunk_bytes,
    };
    let options = RaidModule::state(host).options.owner_options();
    let built = RaidDevice::new(spec).and_then(|dev| {
        let blocks = fp_bdev::BlockDevice::info(&dev).num_blocks();
        if blocks != sb.raid_blocks {
            return Err(RaidError::Metadata(format!(
                "the superblock says {} blocks, its slots make {blocks}",
                sb.raid_blocks
            )));
        }
        let dev = Arc::new(dev);
        let owner = OwnerHandle::spawn(dev.shared().clone(), members, Some(sb.clone()), options)?;
        Ok((dev, owner))
    });
    let (dev, owner) = match built {
        Ok(x) => x,
        Err(e) => {
            release(&claimed);
            with_raids(host, |l| l.retain(|r| r.name != raid));
            return Err(e);
        }
    };
    let new = NewBdev { bdev: dev.clone(), device: dev.clone(), claims: vec![], aliases: vec![] };
    if let Err(e) = host.add_bdev(MODULE, new) {
        // Stopped without the clean mark: nothing was written through it.
        drop(owner);
        release(&claimed);
        with_raids(host, |l| l.retain(|r| r.name != raid));
        return Err(RaidError::Busy(format!("raid '{raid}' not added: {e}")));
    }
    let owner = Arc::new(owner);
    with_raids(host, |l| {
        if let Some(r) = l.iter_mut().find(|r| r.name == raid) {
            r.device = Some(dev.clone());
            r.owner = Some(owner.clone());
        }
    });
    log::info!("raid '{raid}' assembled from its superblocks");
    for f in later {
        match crate::rpc::add_to_owner(host, &owner, raid, &f.name, f.bdev.clone()) {
            Added::Slot(_) => {}
            Added::Refused(e) => {
                log::warn!("raid '{raid}': stale base '{}' cannot join: {e}", f.name);
                host.release_claim(&f.name, MODULE, raid);
            }
            Added::UnderWay(e) => log::warn!("{e}"),
        }
    }
    Ok(())
}
