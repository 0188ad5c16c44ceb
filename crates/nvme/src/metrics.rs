//! The NVMe module's metric families ([`fp_bdev::BdevModule::metrics`]), from
//! `bdev_nvme_get_controllers` (docs/nvme.md, "Metrics").

use fp_bdev::metrics::{array, str_at, u64_at, Family};
use serde_json::Value;

/// `bdev_nvme_get_controllers`: each NVMe controller's state, its recovery counters and its I/O
/// queues' counters (docs/nvme.md, "Metrics").
pub(crate) fn nvme_controllers(c: &Value) -> [Family; 8] {
    let mut up = Family::gauge(
        "flashpath_nvme_controller_up",
        "Whether an NVMe controller is enabled (0 while resetting, reconnecting or failed)",
    );
    let mut counters = [
        ("flashpath_nvme_resets_total", "Resets of an NVMe controller (and reconnect attempts)", "resets"),
        (
            "flashpath_nvme_reconnect_attempts_total",
            "Reconnect attempts after an NVMe controller was lost",
            "reconnect_attempts",
        ),
        ("flashpath_nvme_aborts_total", "Abort commands sent for timed-out I/O", "aborts"),
        (
            "flashpath_nvme_async_events_total",
            "Asynchronous events an NVMe controller reported",
            "async_events",
        ),
    ]
    .map(|(name, help, key)| (Family::counter(name, help), key));
    let mut queues = [
        (
            "flashpath_nvme_commands_submitted_total",
            "I/O commands submitted to an NVMe controller",
            "submitted",
        ),
        (
            "flashpath_nvme_doorbells_total",
            "Doorbell writes (PCIe) or sends (TCP) of an NVMe controller's I/O queues",
            "doorbells",
        ),
        (
            "flashpath_nvme_bounced_total",
            "I/O requests copied through DMA memory because their buffer was not registered",
            "bounced",
        ),
    ]
    .map(|(name, help, key)| (Family::counter(name, help), key));
    for ctrlr in array(c) {
        let name = str_at(ctrlr, "name");
        for path in array(&ctrlr["ctrlrs"]) {
            let labels = vec![
                ("controller", name.clone()),
                ("trtype", str_at(&path["trid"], "trtype")),
                ("traddr", str_at(&path["trid"], "traddr")),
                // Two paths of one multipath controller may share an address.
                ("trsvcid", str_at(&path["trid"], "trsvcid")),
            ];
            up.push(labels.clone(), u64::from(path["state"] == "enabled"));
            for (family, key) in &mut counters {
                family.push(labels.clone(), u64_at(path, key));
            }
            for (family, key) in &mut queues {
                family.push(labels.clone(), u64_at(&path["stats"], key));
            }
        }
    }
    let [a, b, c, d] = counters.map(|(f, _)| f);
    let [e, f, g] = queues.map(|(f, _)| f);
    [up, a, b, c, d, e, f, g]
}

#[cfg(test)]
mod tests {
    use fp_bdev::metrics::Labels;
    use serde_json::json;

    use super::*;

    /// Each NVMe controller path is one sample per family, labelled with its transport ID.
    #[test]
    fn nvme_controllers_become_per_controller_families() {
        let c = json!([{"name": "Nvme0", "ctrlrs": [{
            "state": "resetting", "trid": {"trtype": "TCP", "traddr": "127.0.0.1"}, "cntlid": 1,
            "resets": 3, "reconnect_attempts": 1, "aborts": 2, "async_events": 4,
            "stats": {"submitted": 100, "completed": 99, "doorbells": 20, "bounced": 5},
        }]}]);
        let families = nvme_controllers(&c);
        let labels: Labels = vec![
            ("controller", "Nvme0".into()),
            ("trtype", "TCP".into()),
            ("traddr", "127.0.0.1".into()),
            ("trsvcid", String::new()),
        ];
        let got: Vec<(&str, f64)> = families.iter().map(|f| (f.name, f.samples[0].1)).collect();
        assert_eq!(
            got,
            [
                ("flashpath_nvme_controller_up", 0.0),
                ("flashpath_nvme_resets_total", 3.0),
                ("flashpath_nvme_reconnect_attempts_total", 1.0),
                ("flashpath_nvme_aborts_total", 2.0),
                ("flashpath_nvme_async_events_total", 4.0),
                ("flashpath_nvme_commands_submitted_total", 100.0),
                ("flashpath_nvme_doorbells_total", 20.0),
                ("flashpath_nvme_bounced_total", 5.0),
            ]
        );
        assert!(families.iter().all(|f| f.samples.len() == 1 && f.samples[0].0 == labels));
        assert!(nvme_controllers(&json!([])).iter().all(|f| f.samples.is_empty()));
    }

    /// Two paths of a multipath controller on one address are two series (by port).
    #[test]
    fn paths_on_one_address_are_told_apart_by_port() {
        let path = |port: &str| json!({"state": "enabled", "trid": {"trtype": "TCP", "traddr": "10.0.0.1", "trsvcid": port}});
        let families = nvme_controllers(&json!([{"name": "Nvme0", "ctrlrs": [path("4420"), path("4421")]}]));
        let up = &families[0];
        assert_eq!(up.samples.len(), 2);
        assert_ne!(up.samples[0].0, up.samples[1].0);
        assert_eq!(up.samples[1].0[3], ("trsvcid", "4421".to_string()));
    }
}
