//! The raid module's metric families ([`fp_bdev::BdevModule::metrics`]), from
//! `bdev_raid_get_bdevs` (docs/raid.md, "Metrics").

use fp_bdev::metrics::{array, str_at, u64_at, Family};
use serde_json::Value;

/// `bdev_raid_get_bdevs`: each raid's state, its replicas, the rebuild in progress and the
/// counters of its `flashpath` object (docs/raid.md, "Metrics").
pub(crate) fn raids(r: &Value) -> [Family; 12] {
    let mut online = Family::gauge(
        "flashpath_raid_online",
        "Whether a raid bdev is online (0 while configuring or offline)",
    );
    let mut bases = Family::gauge("flashpath_raid_base_bdevs", "Slots (base bdevs) a raid has");
    let mut operational = Family::gauge(
        "flashpath_raid_base_bdevs_operational",
        "Bases of a raid that are in sync (a raid1 with fewer than its slots is degraded)",
    );
    let mut slot = Family::gauge(
        "flashpath_raid_slot_state",
        "A raid slot's state: 1 on the series of its current state (active, rebuilding, failed, empty)",
    );
    let mut progress = Family::gauge(
        "flashpath_raid_process_progress_ratio",
        "How far a raid's rebuild or resync got, from 0 to 1 (no series when none runs)",
    );
    let mut counters = [
        (
            "flashpath_raid_rebuild_bytes_copied_total",
            "Bytes a raid's rebuilds and resyncs copied",
            "rebuild_bytes_copied",
        ),
        (
            "flashpath_raid_degraded_bytes_written_total",
            "Bytes of writes a raid acknowledged while a slot was not in sync",
            "degraded_bytes_written",
        ),
        ("flashpath_raid_rebuilds_completed_total", "Rebuilds a raid completed", "rebuilds_completed"),
        ("flashpath_raid_base_failures_total", "Bases a raid took out after an I/O error", "base_failures"),
        ("flashpath_raid_bitmap_writes_total", "Write-intent bitmap pages a raid wrote", "bitmap_writes"),
        (
            "flashpath_raid_bitmap_pages_corrupt_total",
            "Bitmap pages found corrupt at assembly (their chunks are treated as dirty)",
            "bitmap_pages_corrupt",
        ),
        ("flashpath_raid_superblock_writes_total", "Superblock writes of a raid", "superblock_writes"),
    ]
    .map(|(name, help, key)| (Family::counter(name, help), key));
    for raid in array(r) {
        let name = str_at(raid, "name");
        let labels = vec![("raid", name.clone()), ("level", str_at(raid, "raid_level"))];
        online.push(labels.clone(), u64::from(raid["state"] == "online"));
        bases.push(labels.clone(), u64_at(raid, "num_base_bdevs"));
        operational.push(labels.clone(), u64_at(raid, "num_base_bdevs_operational"));
        let extra = &raid["flashpath"];
        // `slots` holds each slot's state, `base_bdevs_list` its base, in slot order.
        for (i, s) in array(&extra["slots"]).iter().enumerate() {
            let base = raid["base_bdevs_list"][i]["name"].as_str().unwrap_or("").to_string();
            let now = s.as_str().unwrap_or("");
            for state in ["active", "rebuilding", "failed", "empty"] {
                let l = vec![
                    ("raid", name.clone()),
                    ("slot", i.to_string()),
                    ("base", base.clone()),
                    ("state", state.to_string()),
                ];
                slot.push(l, u64::from(now == state));
            }
        }
        let p = &raid["process"];
        if let Some(kind) = p["type"].as_str() {
            let l = vec![("raid", name.clone()), ("type", kind.to_string()), ("target", str_at(p, "target"))];
            let percent = p["progress"]["percent"].as_f64().unwrap_or(0.0);
            progress.push(l, (percent / 100.0).clamp(0.0, 1.0));
        }
        for (family, key) in &mut counters {
            family.push(labels.clone(), u64_at(extra, key));
        }
    }
    let [a, b, c, d, e, f, g] = counters.map(|(f, _)| f);
    [online, bases, operational, slot, progress, a, b, c, d, e, f, g]
}
