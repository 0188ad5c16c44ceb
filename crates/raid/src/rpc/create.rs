//! `bdev_raid_create` and `bdev_raid_delete`, and the module's shutdown.

use std::sync::Arc;

use fp_bdev::module::{ClaimType, ModuleError, ModuleHost, NewBdev};
use fp_bdev::Bdev;
use fp_bdev::Uuid;
use fp_rpc::{ParamError, Params};
use serde_json::Value;

use crate::device::{new_uuid, RaidDevice, RaidSpec};
use crate::format::{self, SlotRecord, Superblock};
use crate::meta_io::{self, ChannelIo};
use crate::owner::{BaseSpec, OwnerHandle, StopWait, OWNER_WAIT};
use crate::shared::SlotView;
use crate::table::{module_error, stop_owner, with_raids, RaidEntry, RaidModule, MODULE};
use crate::{RaidError, RaidLevel, SlotState};

/// `bdev_raid_create`'s parameters, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaidConfig {
    pub name: String,
    pub level: RaidLevel,
    /// KiB; 0 for raid1.
    pub strip_size_kb: u32,
    /// Base bdev names, in slot order.
    pub base_bdevs: Vec<String>,
    pub superblock: bool,
    pub uuid: Option<Uuid>,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> RaidError {
    RaidError::InvalidParam { field, reason: reason.into() }
}

impl RaidConfig {
    /// Decodes SPDK's parameters: `name`, `raid_level`, `base_bdevs` (a list, or one string of
    /// names separated by spaces), `strip_size_kb` (or its old name `strip_size`),
    /// `superblock`, `uuid`.
    pub fn from_params(p: &mut Params) -> Result<RaidConfig, ModuleError> {
        let name = p.required_str("name")?;
        let level_name = p.required_str("raid_level")?;
        let bases = p.optional_names("base_bdevs")?;
        let strip = p.optional_uint("strip_size_kb", u64::from(u32::MAX))?;
        let strip_old = p.optional_uint("strip_size", u64::from(u32::MAX))?;
        let superblock = p.optional_bool("superblock")?.unwrap_or(false);
        let uuid = p.optional_str("uuid")?;
        let level = RaidLevel::parse(&level_name).ok_or_else(|| {
            ParamError::new(
                "raid_level",
                format!("'{}' is not one of raid0, raid1, concat", level_name.escape_debug()),
            )
        })?;
        let base_bdevs = bases.ok_or_else(|| ParamError::new("base_bdevs", "required parameter missing"))?;
        let strip_size_kb = match (strip, strip_old) {
            (Some(_), Some(_)) => {
                return Err(ParamError::new("strip_size", "give strip_size_kb or strip_size, not both").into())
            }
            (Some(s), None) | (None, Some(s)) => s as u32,
            (None, None) => 0,
        };
        let uuid =
            match uuid {
                None => None,
                Some(u) => Some(Uuid::parse(&u).ok_or_else(|| {
                    ParamError::new("uuid", format!("'{}' is not a UUID", u.escape_debug()))
                })?),
            };
        let cfg = RaidConfig { name, level, strip_size_kb, base_bdevs, superblock, uuid };
        cfg.check().map_err(module_error)?;
        Ok(cfg)
    }

    /// The checks that need no bdev: counts, strip size, names.
    pub fn check(&self) -> Result<(), RaidError> {
        let n = self.base_bdevs.len();
        let min = if self.level == RaidLevel::Raid1 { 2 } else { 1 };
        if n < min || n > format::MAX_SLOTS {
            return Err(invalid(
                "base_bdevs",
                format!("{n} bases: {} takes {min} to {}", self.level.name(), format::MAX_SLOTS),
            ));
        }
        for (i, b) in self.base_bdevs.iter().enumerate() {
            if self.base_bdevs[..i].contains(b) {
                return Err(invalid("base_bdevs", format!("'{b}' is listed twice")));
            }
        }
        match self.level {
            RaidLevel::Raid1 if self.strip_size_kb != 0 => {
                return Err(invalid("strip_size_kb", "raid1 has no strip size (give 0 or leave it out)"))
            }
            RaidLevel::Raid1 => {}
            _ if !self.strip_size_kb.is_power_of_two() => {
                return Err(invalid(
                    "strip_size_kb",
                    format!(
                        "{} is not a power of two (KiB); {} needs one",
                        self.strip_size_kb,
                        self.level.name()
                    ),
                ))
            }
            _ => {}
        }
        if self.superblock && self.name.len() > format::NAME_MAX {
            return Err(invalid(
                "name",
                format!("longer than {} bytes, the superblock's limit", format::NAME_MAX),
            ));
        }
        Ok(())
    }
}

/// Takes the raid's claims on `names`, all or none.
fn claim_all(host: &dyn ModuleHost, raid: &str, names: &[String]) -> Result<Vec<Bdev>, ModuleError> {
    let mut got = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        match host.claim(name, MODULE, raid, ClaimType::ExclusiveWrite) {
            Ok(b) => got.push(b),
            Err(e) => {
                for n in &names[..i] {
                    host.release_claim(n, MODULE, raid);
                }
                return Err(e);
            }
        }
    }
    Ok(got)
}

/// Releases the raid's claims on `names`.
pub(crate) fn release_all(host: &dyn ModuleHost, raid: &str, names: impl IntoIterator<Item = String>) {
    for n in names {
        host.release_claim(&n, MODULE, raid);
    }
}

/// The superblock of a new raid (`seq` 0: the owner formats the bases with it).
pub(crate) fn new_superblock(cfg: &RaidConfig, dev: &RaidDevice) -> Superblock {
    let shared = dev.shared();
    let layout = shared.layout();
    // raid0 and concat have no bitmap: no chunk, no pages, no first page.
    let (chunk, first, pages) = match shared.intent.as_ref() {
        Some(m) => (
            m.chunk_bytes(),
            format::BITMAP_FIRST_PAGE,
            format::bitmap_pages(shared.info.size_bytes(), m.chunk_bytes()),
        ),
        None => (0, 0, 0),
    };
    Superblock {
        // 0: a new raid, which the owner formats.
        seq: 0,
        raid_uuid: dev.uuid(),
        name: cfg.name.clone(),
        level: cfg.level,
        strip_size_kb: cfg.strip_size_kb,
        block_size: shared.info.block_size,
        raid_blocks: shared.info.num_blocks(),
        data_offset: layout.data_offset,
        bitmap_chunk_bytes: chunk,
        bitmap_first_page: first,
        bitmap_pages: pages,
        clean: true,
        slot: 0,
        slots: layout
            .slots
            .iter()
            .zip(&shared.base_data_bytes)
            .map(|(s, &data_bytes)| SlotRecord {
                state: s.state,
                uuid: s.uuid,
                data_bytes,
                rebuild_offset: 0,
                rebuild_partial: false,
            })
            .collect(),
    }
}

/// Builds the device of `cfg` over the claimed `bases` (checks sizes and block sizes) and, with
/// a superblock, writes it (and an empty bitmap) to every base.
fn build(cfg: &RaidConfig, bases: &[Bdev]) -> Result<(Arc<RaidDevice>, Option<Superblock>), RaidError> {
    let block_size = bases[0].info().block_size;
    if let Some(b) = bases.iter().find(|b| b.info().block_size != block_size) {
        return Err(invalid(
            "base_bdevs",
            format!(
                "block sizes differ: '{}' has {}, '{}' has {}",
                cfg.base_bdevs[0],
                block_size,
                b.info().name,
                b.info().block_size
            ),
        ));
    }
    let strip_bytes = u64::from(cfg.strip_size_kb) * 1024;
    if cfg.level != RaidLevel::Raid1 && strip_bytes < u64::from(block_size) {
        return Err(invalid(
            "strip_size_kb",
            format!("{strip_bytes} bytes is below the block size {block_size}"),
        ));
    }
    let sizes: Vec<u64> = bases.iter().map(|b| b.info().size_bytes()).collect();
    let data_offset =
        if cfg.superblock { sizes.iter().map(|&s| format::data_offset(s)).max().unwrap_or(0) } else { 0 };
    for (name, &size) in cfg.base_bdevs.iter().zip(&sizes) {
        if size <= data_offset {
            return Err(invalid(
                "base_bdevs",
                format!("'{name}' ({size} bytes) has no room for data after the {data_offset}-byte superblock area"),
            ));
        }
    }
    let slots = bases
        .iter()
        .zip(&cfg.base_bdevs)
        .map(|(b, name)| SlotView {
            state: SlotState::Active,
            name: Some(name.clone()),
            bdev: Some(b.clone()),
            uuid: if cfg.superblock { new_uuid() } else { Uuid::NIL },
        })
        .collect();
    let spec = RaidSpec {
        name: cfg.name.clone(),
        uuid: cfg.uuid.unwrap_or_else(new_uuid),
        level: cfg.level,
        strip_bytes,
        superblock: cfg.superblock,
        block_size,
        data_offset,
        slots,
        base_data_bytes: sizes.iter().map(|s| s - data_offset).collect(),
        chunk_bytes: 0,
    };
    let dev = Arc::new(RaidDevice::new(spec)?);
    let sb = cfg.superblock.then(|| new_superblock(cfg, &dev));
    Ok((dev, sb))
}

/// Whether the assembled raid `dev` is what `cfg` asks for (level, strip, bases in order):
/// then `bdev_raid_create` of it succeeds without change, so a configuration file that
/// creates a raid examine already assembled from its superblocks starts cleanly.
fn same_raid(cfg: &RaidConfig, dev: &RaidDevice) -> bool {
    let layout = dev.shared().layout();
    let names: Vec<&str> = layout.slots.iter().filter_map(|s| s.name.as_deref()).collect();
    dev.shared().level == cfg.level
        && dev.shared().strip_bytes == u64::from(cfg.strip_size_kb) * 1024
        && dev.superblock() == cfg.superblock
        && names == cfg.base_bdevs.iter().map(String::as_str).collect::<Vec<_>>()
}

/// Whether the raid examine is assembling is what `cfg` asks for: level, strip, a
/// superblock, and every base found so far listed by `cfg` in its slot.
fn same_configuring(cfg: &RaidConfig, c: &crate::table::Configuring) -> bool {
    let sb = c.newest();
    cfg.superblock
        && sb.level == cfg.level
        && sb.strip_size_kb == cfg.strip_size_kb
        && sb.slots.len() == cfg.base_bdevs.len()
        && c.found.iter().all(|f| cfg.base_bdevs.get(usize::from(f.sb.slot)) == Some(&f.name))
}

/// `bdev_raid_create`: returns `true` as SPDK does.
pub(crate) fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let mut cfg = RaidConfig::from_params(&mut p)?;
    p.finish()?;
    let known = with_raids(host, |l| {
        l.iter().find(|r| r.name == cfg.name).map(|r| match (&r.device, &r.configuring) {
            (Some(dev), _) => same_raid(&cfg, dev),
            (None, Some(c)) => same_configuring(&cfg, c),
            (None, None) => false,
        })
    });
    if known == Some(true) {
        // Examine found it first (a restart with a configuration file): nothing to do. A
        // raid still configuring stays so until its bases appear; it is never assembled from
        // fewer bases than its newest superblock lists in sync.
        log::info!("raid '{}' is already known from its superblocks as asked; unchanged", cfg.name);
        return Ok(Value::Bool(true));
    }
    host.check_new_bdev(&cfg.name)?;
    // Aliases name the same bdev: resolve them so "listed twice" sees through them.
    for b in cfg.base_bdevs.iter_mut() {
        if let Some(n) = host.bdev_name(b) {
            *b = n;
        }
    }
    cfg.check().map_err(module_error)?;
    let bases = claim_all(host, &cfg.name, &cfg.base_bdevs)?;
    let options = RaidModule::state(host).options.owner_options();
    let specs: Vec<Option<BaseSpec>> = cfg
        .base_bdevs
        .iter()
        .zip(&bases)
        .map(|(name, bdev)| Some(BaseSpec { name: name.clone(), bdev: bdev.clone() }))
        .collect();
    // The owner formats the bases (with a superblock) and publishes the first layout before
    // the bdev is added: nothing reaches the raid before it is whole.
    let added = build(&cfg, &bases)
        .and_then(|(dev, sb)| {
            Ok((dev.clone(), OwnerHandle::spawn(dev.shared().clone(), specs, sb, options)?))
        })
        .map_err(module_error)
        .and_then(|(dev, owner)| {
            let new =
                NewBdev { bdev: dev.clone(), device: dev.clone(), claims: Vec::new(), aliases: Vec::new() };
            match host.add_bdev(MODULE, new) {
                Ok(_) => Ok((dev, Arc::new(owner))),
                Err(e) => {
                    // Never used: the superblocks just written go with it.
                    let _ = owner.delete(OWNER_WAIT);
                    Err(e)
                }
            }
        });
    let (dev, owner) = match added {
        Ok(x) => x,
        Err(e) => {
            release_all(host, &cfg.name, cfg.base_bdevs.clone());
            return Err(e);
        }
    };
    log::info!(
        "bdev '{}' is a {} over {} (superblock {})",
        cfg.name,
        cfg.level.name(),
        cfg.base_bdevs.join(", "),
        cfg.superblock
    );
    with_raids(host, |l| {
        l.push(RaidEntry { name: cfg.name.clone(), device: Some(dev), owner: Some(owner), configuring: None })
    });
    Ok(Value::Bool(true))
}

/// `bdev_raid_delete {name, clear_sb}`: deletes the bdev (refused while something holds it),
/// stops its owner (which marks the superblocks clean), releases the bases. `clear_sb` also
/// erases the superblocks, so examine will not assemble the raid again.
pub(crate) fn delete(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let clear_sb = p.optional_bool("clear_sb")?.unwrap_or(false);
    p.finish()?;
    let entry = with_raids(host, |l| l.iter().position(|r| r.name == name).map(|i| (i, l[i].device.clone())));
    let Some((_, device)) = entry else {
        return Err(module_error(RaidError::NotFound(format!("no raid bdev '{name}'"))));
    };
    if device.is_some() {
        host.delete_bdev(&name, MODULE)?;
    }
    let entry = with_raids(host, |l| l.iter().position(|r| r.name == name).map(|i| l.remove(i)));
    let Some(entry) = entry else { return Ok(Value::Bool(true)) };
    let mut names = Vec::new();
    if let Some(dev) = &entry.device {
        names.extend(dev.shared().layout().slots.iter().filter_map(|s| s.name.clone()));
    }
    let mut erased = Ok(());
    let mut still_stopping = None;
    if let Some(owner) = entry.owner {
        match stop_owner(&name, owner, clear_sb, OWNER_WAIT) {
            StopWait::Stopped(r) => erased = r,
            StopWait::UnderWay(rx) => still_stopping = Some(rx),
        }
    }
    if let Some(c) = &entry.configuring {
        names.extend(c.claimed_names());
        if clear_sb {
            erased = erase_found(&name, c);
        }
    }
    if let Some(stopping) = still_stopping {
        // Its owner may still have a request on a base: the bases stay claimed until it ends.
        erased = Err(RaidError::Busy(format!(
            "raid '{name}' is deleted, but after {} s its owner was still waiting for a base to \
             answer its metadata I/O; its bases ({}) stay claimed until it ends{}",
            OWNER_WAIT.as_secs(),
            names.join(", "),
            if clear_sb { ", and their superblocks may not be erased" } else { "" }
        )));
        release_when_stopped(host, name.clone(), names, stopping);
    } else {
        release_all(host, &name, names);
    }
    log::info!("raid '{name}' deleted");
    // The raid is gone either way; the answer says whether examine can find it again.
    erased.map_err(module_error)?;
    Ok(Value::Bool(true))
}

/// `clear_sb` on a raid still configuring: the bases examine found (and claimed) are
/// erased here, as the owner erases an assembled raid's. The error names those not erased.
fn erase_found(raid: &str, c: &crate::table::Configuring) -> Result<(), RaidError> {
    let mut not_erased = Vec::new();
    for f in &c.found {
        let wiped = ChannelIo::open(f.bdev.clone()).map_err(|e| e.to_string()).and_then(|mut io| {
            meta_io::wipe_superblock(&mut io).map_err(|e| std::io::Error::from_raw_os_error(e).to_string())
        });
        if let Err(e) = wiped {
            not_erased.push(format!("'{}' ({e})", f.name));
        }
    }
    if not_erased.is_empty() {
        return Ok(());
    }
    Err(RaidError::NotErased(format!(
        "raid '{raid}': the superblock of {} was not erased",
        not_erased.join(", ")
    )))
}

/// Releases the bases `names` of the deleted raid `raid` once its owner, still at its
/// metadata I/O when the deletion answered, has stopped: a thread of its own.
fn release_when_stopped(
    host: &dyn ModuleHost,
    raid: String,
    names: Vec<String>,
    stopping: std::sync::mpsc::Receiver<Result<(), RaidError>>,
) {
    let Some(weak) = host.weak_handle() else {
        log::warn!(
            "raid '{raid}': its bases stay claimed: nothing here can release them once its owner stops"
        );
        return;
    };
    let spawned = std::thread::Builder::new().name(format!("raid-stop-{raid}")).spawn(move || {
        match stopping.recv() {
            Ok(Err(e)) => log::warn!("raid '{raid}': its owner stopped late: {e}"),
            Ok(Ok(())) | Err(_) => log::info!("raid '{raid}': its owner stopped late"),
        }
        if let Some(h) = weak.upgrade() {
            release_all(&*h, &raid, names);
        }
    });
    if let Err(e) = spawned {
        log::warn!(
            "raid: a deleted raid's bases stay claimed: cannot start the thread that releases them: {e}"
        );
    }
}

/// The daemon stops: every raid's owner stops (marking its superblocks clean), each within
/// [`OWNER_WAIT`] and none past the daemon's shutdown deadline
/// ([`ModuleHost::shutdown_deadline`]; at least [`SHUTDOWN_STOP_FLOOR`] each); one still
/// waiting for a base then is left to end alone.
pub(crate) fn shutdown(host: &dyn ModuleHost) {
    for r in with_raids(host, std::mem::take) {
        if let Some(owner) = r.owner {
            let bound = host
                .shutdown_deadline()
                .map_or(OWNER_WAIT, |d| {
                    d.saturating_duration_since(std::time::Instant::now()).min(OWNER_WAIT)
                })
                .max(SHUTDOWN_STOP_FLOOR);
            // Without `clear_sb` a stop answers no error (it logs what went wrong).
            if let StopWait::UnderWay(_) = stop_owner(&r.name, owner, false, bound) {
                log::warn!(
                    "raid '{}': its owner was still waiting for a base to answer its metadata I/O after {bound:?}; \
                     left to end alone",
                    r.name,
                );
            }
        }
    }
}

/// The least a raid's owner is given to stop at the daemon's shutdown, when the shutdown's
/// deadline has passed: enough to mark its superblocks clean when its bases answer.
const SHUTDOWN_STOP_FLOOR: std::time::Duration = std::time::Duration::from_millis(200);
