//! `bdev_raid_get_bdevs` and the raid's JSON (also `driver_specific.raid`): SPDK's fields, and
//! flashpath's own under `flashpath`.

use std::sync::atomic::Ordering;

use fp_bdev::module::{ModuleError, ModuleHost};
use fp_rpc::{ParamError, Params};
use serde_json::{json, Map, Value};

use crate::device::RaidDevice;
use crate::table::with_raids;
use crate::SlotState;

/// SPDK's categories.
const CATEGORIES: [&str; 4] = ["all", "online", "configuring", "offline"];

fn state_name(s: SlotState) -> &'static str {
    match s {
        SlotState::Empty => "empty",
        SlotState::Active => "active",
        SlotState::Failed => "failed",
        SlotState::Rebuilding => "rebuilding",
    }
}

/// The raid's state as SPDK names it: "online" while it serves (degraded included),
/// "offline" when no slot holds the data any more.
pub(crate) fn raid_state(dev: &RaidDevice) -> &'static str {
    let layout = dev.shared().layout();
    let active = layout.slots.iter().filter(|s| s.state == SlotState::Active).count();
    let whole = match dev.shared().level {
        crate::RaidLevel::Raid1 => active > 0,
        _ => active == layout.slots.len(),
    };
    if whole {
        "online"
    } else {
        "offline"
    }
}

/// One raid's `bdev_raid_get_bdevs` entry.
pub fn raid_json(dev: &RaidDevice) -> Map<String, Value> {
    let shared = dev.shared();
    let layout = shared.layout();
    let bs = u64::from(shared.info.block_size);
    let data_blocks = |slot: usize| -> u64 {
        match shared.level {
            crate::RaidLevel::Raid1 => shared.info.num_blocks(),
            _ => shared.base_data_bytes.get(slot).copied().unwrap_or(0) / bs,
        }
    };
    let bases: Vec<Value> = layout
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({
                "name": s.name,
                "uuid": s.uuid.to_string(),
                "is_configured": s.bdev.is_some() && s.state.takes_writes(),
                "data_offset": layout.data_offset / bs,
                "data_size": data_blocks(i),
            })
        })
        .collect();
    let mut m = Map::new();
    m.insert("name".into(), json!(shared.info.name));
    m.insert("uuid".into(), json!(dev.uuid().to_string()));
    m.insert("strip_size_kb".into(), json!(shared.strip_bytes / 1024));
    m.insert("state".into(), json!(raid_state(dev)));
    m.insert("raid_level".into(), json!(shared.level.name()));
    m.insert("superblock".into(), json!(dev.superblock()));
    m.insert("num_base_bdevs".into(), json!(layout.slots.len()));
    m.insert(
        "num_base_bdevs_discovered".into(),
        json!(layout.slots.iter().filter(|s| s.bdev.is_some()).count()),
    );
    m.insert(
        "num_base_bdevs_operational".into(),
        json!(layout.slots.iter().filter(|s| s.state.takes_writes()).count()),
    );
    m.insert("base_bdevs_list".into(), Value::Array(bases));
    let p = &shared.process;
    let target = p.target_slot.load(Ordering::Relaxed);
    if target != 0 {
        let done = p.blocks_done.load(Ordering::Relaxed);
        let total = p.blocks_total.load(Ordering::Relaxed).max(1);
        let kind = p.kind.load(Ordering::Relaxed);
        let target_name = layout.slots.get(target as usize - 1).and_then(|s| s.name.clone());
        m.insert(
            "process".into(),
            json!({
                "type": if kind == 3 { "resync" } else { "rebuild" },
                "target": target_name,
                // SPDK's percent is a whole number.
                "progress": { "blocks": done, "percent": done.min(total) * 100 / total },
            }),
        );
    }
    let c = &shared.counters;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    m.insert(
        "flashpath".into(),
        json!({
            "slots": layout.slots.iter().map(|s| state_name(s.state)).collect::<Vec<_>>(),
            "bitmap_chunk_bytes": shared.intent.as_ref().map_or(0, |i| i.chunk_bytes()),
            // A popcount of the map's words when asked: nothing on the I/O path.
            "intent_bits_set": shared.intent.as_ref().map_or(0, |i| i.set_count()),
            "rebuild_kind": match p.kind.load(Ordering::Relaxed) { 1 => "partial", 2 => "full", 3 => "resync", _ => "none" },
            "rebuild_bytes_copied": load(&c.rebuild_bytes_copied),
            "rebuild_bytes_on_reactor": load(&c.rebuild_bytes_on_reactor),
            "rebuild_bytes_unshared": load(&c.rebuild_bytes_unshared),
            "degraded_bytes_written": load(&c.degraded_bytes_written),
            "rebuilds_completed": load(&c.rebuilds_completed),
            "base_failures": load(&c.base_failures),
            "bitmap_writes": load(&c.bitmap_writes),
            "bitmap_pages_corrupt": load(&c.bitmap_pages_corrupt),
            "superblock_writes": load(&c.superblock_writes),
        }),
    );
    m
}

/// `bdev_raid_get_bdevs {category}`: every raid of the category (default "all"), assembled
/// ones in SPDK's shape, configuring ones with what examine has found.
pub(crate) fn get_bdevs(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let category = p.optional_str("category")?.unwrap_or_else(|| "all".into());
    p.finish()?;
    if !CATEGORIES.contains(&category.as_str()) {
        return Err(ParamError::new(
            "category",
            format!("'{}' is not one of {}", category.escape_debug(), CATEGORIES.join(", ")),
        )
        .into());
    }
    let out = with_raids(host, |l| {
        l.iter()
            .filter_map(|r| {
                let (state, m) = match (&r.device, &r.configuring) {
                    (Some(dev), _) => (raid_state(dev), raid_json(dev)),
                    (None, Some(c)) => ("configuring", c.json(&r.name)),
                    (None, None) => return None,
                };
                (category == "all" || category == state).then_some(Value::Object(m))
            })
            .collect::<Vec<_>>()
    });
    Ok(Value::Array(out))
}
