//! vhost-user-blk controllers as exports (`vhost_create_blk_controller` and friends, in
//! `rpc.rs`): a bdev served to a VMM on a Unix socket in the vhost directory (crates/vhost-blk).

use std::any::Any;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::ClaimType;
use fp_reactor::ReactorHandle;
use fp_vhost_blk::{BlkController, ControllerConfig, ControllerInfo};
use serde_json::Value;

use super::{ConfigTable, Export, ExportKind, KindInit, KindOption, NewExport, OptionType};
use crate::methods::MethodFn;
use crate::metrics::{array, str_at, u64_at, Family, MetricsCall};
use crate::{Registry, RegistryError};

pub(crate) mod rpc;
mod spec;

pub use spec::{VhostBlkSpec, MAX_STOP_TIMEOUT_MS};

/// The kind ([`ExportKind::name`]) of a vhost-user-blk controller.
pub const KIND: &str = "vhost-blk";

/// What errors call one.
const LABEL: &str = "controller";

/// The kind's daemon-wide state: its options' values.
struct VhostDefaults {
    /// The stop bound of controllers created without `stop_timeout_ms`.
    stop_timeout: Duration,
}

/// Its options: the default stop bound of its queues, which is also the daemon's stop bound
/// unless the NVMe-oF drain is shorter ([`Registry::daemon_stop_bound`]; docs/architecture.md,
/// "Shutdown").
const OPTIONS: &[KindOption] = &[KindOption {
    table: "vhost",
    key: "stop_timeout_ms",
    flag: Some("vhost-stop-timeout-ms"),
    value: OptionType::Millis {
        default: fp_vhost_blk::DEFAULT_STOP_TIMEOUT.as_millis() as u64,
        min: 1,
        max: MAX_STOP_TIMEOUT_MS,
    },
    help: "How long stopping a vhost-user queue may take for controllers created without \
           stop_timeout_ms, 1 to 600000; also how long shutdown waits for requests a disk still \
           holds (replaces the config file's vhost.stop_timeout_ms)",
}];

/// A running controller.
struct VhostBlk {
    ctrl: BlkController,
    name: String,
}

impl Export for VhostBlk {
    /// The guest hears of it through VHOST_USER_BACKEND_CONFIG_CHANGE_MSG when its VMM gave a
    /// backend channel (QEMU does).
    fn resized(&self, size_bytes: u64) {
        let told = self.ctrl.resize(size_bytes);
        log::info!(
            "vhost-blk controller '{}': capacity now {size_bytes} bytes (frontend told: {told})",
            self.name
        );
    }

    fn stop(self: Box<Self>) {
        self.ctrl.stop();
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Registry {
    /// Creates a vhost-user-blk controller: a listening socket in the vhost directory.
    pub fn create_vhost_blk(&self, spec: VhostBlkSpec) -> Result<(), RegistryError> {
        fp_vhost_blk::validate_name(&spec.ctrlr)
            .map_err(|reason| RegistryError::Invalid { field: "ctrlr", reason })?;
        let reactors: Vec<ReactorHandle> = match &spec.cpus {
            None => self.reactors.clone(),
            Some(cpus) => {
                let picked: Vec<ReactorHandle> = self
                    .reactors
                    .iter()
                    .filter(|h| h.core().is_some_and(|c| cpus.contains(&c)))
                    .cloned()
                    .collect();
                if picked.is_empty() {
                    let have: Vec<String> =
                        self.reactors.iter().filter_map(|h| h.core()).map(|c| c.to_string()).collect();
                    return Err(RegistryError::Invalid {
                        field: "cpumask",
                        reason: format!("selects no reactor core; reactors run on cores {}", have.join(",")),
                    });
                }
                picked
            }
        };
        // By default the controller offers every queue a frontend may ask for: QEMU asks for one
        // per vCPU unless its device line says otherwise, and refuses to start when offered
        // fewer. Queue i runs on reactor i % n, so any count is spread over the mask; a queue
        // the frontend never starts costs a few hundred bytes (docs/architecture.md, "Queues").
        let stop_timeout =
            spec.stop_timeout.unwrap_or_else(|| self.kind_state::<VhostDefaults>(KIND).stop_timeout);
        if stop_timeout.is_zero() || stop_timeout.as_millis() > u128::from(MAX_STOP_TIMEOUT_MS) {
            return Err(RegistryError::Invalid {
                field: "stop_timeout_ms",
                reason: format!("{} is not between 1 and {MAX_STOP_TIMEOUT_MS}", stop_timeout.as_millis()),
            });
        }
        let num_queues = spec.num_queues.unwrap_or(fp_vhost_blk::MAX_QUEUES);
        if num_queues == 0 || num_queues > fp_vhost_blk::MAX_QUEUES {
            return Err(RegistryError::Invalid {
                field: "num_queues",
                reason: format!("{num_queues} is not between 1 and {}", fp_vhost_blk::MAX_QUEUES),
            });
        }
        let claim_type = if spec.readonly { ClaimType::ReadManyWriteNone } else { ClaimType::ExclusiveWrite };
        if spec.readonly && spec.migrate_from.is_some() {
            return Err(RegistryError::Invalid {
                field: "migrate_from",
                reason: "a read-only controller takes nothing over; create it without migrate_from".into(),
            });
        }
        // A controller taking another's disk over shares its hand-off gate; an NBD export has no
        // rings to stop, so the gate is the new controller's own.
        let handoff = spec
            .migrate_from
            .as_deref()
            .and_then(|from| self.with_export(from, LABEL, |c: &VhostBlk| c.ctrl.handoff()).ok())
            .unwrap_or_default();
        let new = NewExport {
            name: &spec.ctrlr,
            kind: KIND,
            label: LABEL,
            bdev_name: &spec.dev_name,
            claim_type,
            migrate_from: spec.migrate_from.as_deref(),
        };
        self.add_export(new, |bdev| {
            let config = ControllerConfig {
                name: spec.ctrlr.clone(),
                socket_path: self.vhost_dir.join(&spec.ctrlr),
                bdev,
                reactors,
                read_only: spec.readonly,
                num_queues,
                handoff,
                stop_timeout,
            };
            let socket_path = config.socket_path.clone();
            let ctrl = BlkController::start(config)?;
            // The socket is bound with the umask's mode (`serve` sets 077, so nobody else can
            // reach it meanwhile); now it gets the configured one.
            let mode = std::fs::Permissions::from_mode(self.options.socket_mode);
            if let Err(source) = std::fs::set_permissions(&socket_path, mode) {
                ctrl.stop();
                return Err(RegistryError::SocketMode { path: socket_path, source });
            }
            Ok(Box::new(VhostBlk { ctrl, name: spec.ctrlr.clone() }))
        })
    }

    /// Stops a controller: disconnects its client, removes its socket, releases its bdev.
    pub fn delete_vhost(&self, ctrlr: &str) -> Result<(), RegistryError> {
        self.delete_export(ctrlr, Some((KIND, LABEL)))
    }

    /// `vhost_controller_set_coalescing`: guest notification coalescing for one controller's
    /// queues, running ones included (fp_vhost_blk::coalesce). `delay_base_us` 0 turns it off.
    pub fn set_coalescing(
        &self,
        ctrlr: &str,
        delay_base_us: u32,
        iops_threshold: u32,
    ) -> Result<(), RegistryError> {
        let max = fp_vhost_blk::coalesce::MAX_DELAY_BASE_US;
        if delay_base_us > max {
            return Err(RegistryError::Invalid {
                field: "delay_base_us",
                reason: format!("{delay_base_us} is above the limit of {max} us"),
            });
        }
        self.with_export(ctrlr, LABEL, |c: &VhostBlk| c.ctrl.set_coalescing(delay_base_us, iops_threshold))?;
        log::info!(
            "vhost-blk controller '{ctrlr}': coalescing delay {delay_base_us} us above {iops_threshold} IOPS"
        );
        Ok(())
    }

    /// All controllers, or the one named (`vhost_get_controllers`).
    pub fn controllers(&self, name: Option<&str>) -> Result<Vec<ControllerInfo>, RegistryError> {
        match name {
            Some(n) => Ok(vec![self.with_export(n, LABEL, |c: &VhostBlk| c.ctrl.info())?]),
            None => Ok(self.map_exports(|c: &VhostBlk| c.ctrl.info())),
        }
    }
}

/// The vhost-user-blk export kind ([`super::EXPORT_KINDS`]).
pub struct VhostBlkKind;

impl ExportKind for VhostBlkKind {
    fn name(&self) -> &'static str {
        KIND
    }

    fn methods(&self) -> &'static [(&'static str, MethodFn)] {
        rpc::METHODS
    }

    fn config_tables(&self) -> &'static [ConfigTable] {
        const TABLES: &[ConfigTable] = &[ConfigTable::array("vhost_blk", "vhost_create_blk_controller")];
        TABLES
    }

    fn options(&self) -> &'static [KindOption] {
        OPTIONS
    }

    /// Its options' values, which its controllers are created with.
    fn init(&self, init: &KindInit<'_>) -> Option<Arc<dyn Any + Send + Sync>> {
        Some(Arc::new(VhostDefaults { stop_timeout: init.options.millis("stop_timeout_ms") }))
    }

    /// A queue's default stop bound: the daemon's stop bound unless another kind's is longer.
    fn stop_bound(&self, registry: &Registry) -> Option<Duration> {
        Some(registry.kind_state::<VhostDefaults>(KIND).stop_timeout)
    }

    /// From `vhost_get_controllers`: what each guest-facing controller did, and holds now.
    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family> {
        call("vhost_get_controllers", None).map(|c| controller_families(&c).into()).unwrap_or_default()
    }
}

/// `vhost_get_controllers`: what each guest-facing controller did, and holds now.
fn controller_families(c: &Value) -> [Family; 10] {
    let mut ops =
        Family::counter("flashpath_vhost_requests_total", "Requests a controller completed, by type");
    let mut bytes = Family::counter("flashpath_vhost_bytes_total", "Bytes a controller moved, by direction");
    let mut errors =
        Family::counter("flashpath_vhost_io_errors_total", "Requests completed with VIRTIO_BLK_S_IOERR");
    let mut unsupported =
        Family::counter("flashpath_vhost_unsupported_total", "Requests completed with VIRTIO_BLK_S_UNSUPP");
    let mut notifications =
        Family::counter("flashpath_vhost_notifications_total", "Guest notifications sent");
    let mut kicks = Family::counter("flashpath_vhost_kicks_total", "Guest kicks received");
    let mut in_flight =
        Family::gauge("flashpath_vhost_in_flight", "Requests taken from the rings and not yet completed");
    let mut connected = Family::gauge("flashpath_vhost_connected", "1 while a guest is connected");
    let mut logged = Family::counter(
        "flashpath_vhost_logged_pages_total",
        "4 KiB pages marked in a migration's dirty log, by what was written",
    );
    let mut queue_in_flight = Family::gauge(
        "flashpath_vhost_queue_in_flight",
        "Requests taken from one virtqueue and not yet completed",
    );
    for ctrl in array(c) {
        let st = &ctrl["stats"];
        let base = vec![
            ("ctrlr", str_at(ctrl, "ctrlr")),
            ("bdev", str_at(&ctrl["backend_specific"]["block"], "bdev")),
        ];
        let with = |k: &'static str, v: &str| {
            let mut l = base.clone();
            l.push((k, v.to_string()));
            l
        };
        for (op, key) in [
            ("read", "read_ops"),
            ("write", "write_ops"),
            ("flush", "flush_ops"),
            ("discard", "discard_ops"),
            ("write_zeroes", "write_zeroes_ops"),
            ("get_id", "get_id_ops"),
        ] {
            ops.push(with("type", op), u64_at(st, key));
        }
        bytes.push(with("direction", "read"), u64_at(st, "bytes_read"));
        bytes.push(with("direction", "write"), u64_at(st, "bytes_written"));
        errors.push(base.clone(), u64_at(st, "io_errors"));
        unsupported.push(base.clone(), u64_at(st, "unsupported"));
        notifications.push(base.clone(), u64_at(st, "notifications"));
        kicks.push(base.clone(), u64_at(st, "kicks"));
        // `logged_pages` counts every mark, `logged_data_pages` those of read data.
        let (all, data) = (u64_at(st, "logged_pages"), u64_at(st, "logged_data_pages"));
        logged.push(with("what", "data"), data);
        logged.push(with("what", "status_and_ring"), all.saturating_sub(data));
        in_flight.push(base.clone(), u64_at(st, "in_flight"));
        for q in array(&ctrl["queues"]) {
            queue_in_flight.push(with("queue", &u64_at(q, "id").to_string()), u64_at(q, "in_flight"));
        }
        connected.push(base, u64::from(ctrl.get("connected").and_then(Value::as_bool) == Some(true)));
    }
    [ops, bytes, errors, unsupported, notifications, kicks, logged, in_flight, connected, queue_in_flight]
}
