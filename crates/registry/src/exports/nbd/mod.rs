//! NBD exports (`nbd_start_disk` and friends, in `rpc.rs`): a bdev served over the NBD
//! protocol on a Unix socket or a TCP address (crates/nbd). The registry knows an export by its
//! `nbd_device` string, as SPDK's `nbd_stop_disk` does.

use std::any::Any;
use std::sync::Arc;

use fp_bdev::disk::BitmapUse;
use fp_bdev::BlockDevice;
use fp_bdev::ClaimType;
use fp_nbd::{ExportBitmap, ExportHandle, ExportSpec, NbdServer, NbdStats};

use super::{ConfigTable, Export, ExportKind, KindInit, KindOption, NewExport, OptionType};
use crate::methods::MethodFn;
use crate::metrics::{array, str_at, u64_at, Family, MetricsCall};
use crate::{Registry, RegistryError};

mod rpc;
mod spec;
#[cfg(test)]
mod tests;

pub use spec::{BitmapRef, NbdSpec};

/// The kind ([`ExportKind::name`]) of an NBD export.
pub const KIND: &str = "nbd";

/// What errors call one.
const LABEL: &str = "NBD export";

/// What `nbd_get_disks` reports of one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NbdDiskInfo {
    pub nbd_device: String,
    pub bdev_name: String,
    pub export_name: String,
    pub readonly: bool,
    pub tls: bool,
    /// flashpath's: the dirty bitmaps served as `qemu:dirty-bitmap:NAME`, by name.
    pub bitmaps: Vec<String>,
    pub connections: usize,
    /// flashpath's: what its connections counted (requests by command, bytes, errors).
    #[serde(serialize_with = "stats_map")]
    pub stats: NbdStats,
}

/// `stats` as an object of named counters.
fn stats_map<S: serde::Serializer>(stats: &NbdStats, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(stats.named())
}

struct NbdExport {
    handle: ExportHandle,
    nbd_device: String,
    bdev_name: String,
    readonly: bool,
    tls: bool,
    bitmaps: Vec<String>,
}

impl NbdExport {
    fn info(&self) -> NbdDiskInfo {
        NbdDiskInfo {
            nbd_device: self.nbd_device.clone(),
            bdev_name: self.bdev_name.clone(),
            export_name: self.handle.name().to_string(),
            readonly: self.readonly,
            tls: self.tls,
            bitmaps: self.bitmaps.clone(),
            connections: self.handle.connections(),
            stats: self.handle.stats(),
        }
    }
}

impl Export for NbdExport {
    /// Connected clients see the new size in their range checks at once; new ones are told it
    /// in the handshake. The protocol has no message to tell a connected client.
    fn resized(&self, size_bytes: u64) {
        log::info!(
            "nbd export '{}': size now {size_bytes} bytes (for clients connecting from now)",
            self.nbd_device
        );
    }

    fn stop(self: Box<Self>) {
        self.handle.stop();
    }

    /// Its connections close once their requests are answered, waited for up to `bound`
    /// rather than [`fp_nbd::STOP_TIMEOUT`]: the daemon's stop bound covers every export.
    fn stop_at_shutdown(self: Box<Self>, bound: std::time::Duration) {
        if let Err(n) = self.handle.close(bound) {
            log::warn!(
                "nbd export '{}' (bdev '{}'): {n} connection(s) still wait for requests the disk has \
                 not completed at the shutdown bound of {bound:?}; they are abandoned",
                self.nbd_device,
                self.bdev_name
            );
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Registry {
    /// The NBD server (the kind's state, [`NbdKind`]).
    fn nbd_server(&self) -> &NbdServer {
        self.kind_state(KIND)
    }

    /// Starts an NBD export of a bdev.
    pub fn start_nbd(&self, spec: NbdSpec) -> Result<(), RegistryError> {
        let device = fp_nbd::parse_device(&spec.nbd_device)
            .map_err(|reason| RegistryError::Invalid { field: "nbd_device", reason })?;
        let bitmaps = self.export_bitmaps(&spec)?;
        let names = spec.bitmaps.iter().map(|b| b.name.clone()).collect();
        let claim_type = if spec.readonly { ClaimType::ReadManyWriteNone } else { ClaimType::ExclusiveWrite };
        let new = NewExport {
            name: &spec.nbd_device,
            kind: KIND,
            label: LABEL,
            bdev_name: &spec.bdev_name,
            claim_type,
            migrate_from: None,
        };
        self.add_export(new, |bdev| {
            let export = ExportSpec {
                name: device.name.clone().unwrap_or_else(|| spec.bdev_name.clone()),
                bdev,
                readonly: spec.readonly,
                reactors: self.reactors.clone(),
                address: device.address.clone(),
                tls: spec.tls.clone(),
                socket_mode: self.options.socket_mode,
                bitmaps,
            };
            let handle = self
                .nbd_server()
                .start(export)
                .map_err(|e| RegistryError::Invalid { field: e.field, reason: e.reason })?;
            Ok(Box::new(NbdExport {
                handle,
                nbd_device: spec.nbd_device.clone(),
                bdev_name: spec.bdev_name.clone(),
                readonly: spec.readonly,
                tls: spec.tls.is_some(),
                bitmaps: names,
            }))
        })
    }

    /// Holds the bitmaps `spec` offers, each checked: it exists, is consistent, covers the
    /// exported bdev's size, and its name is not given twice (the context is named after it).
    /// The holds make them refuse removal while the export lives.
    fn export_bitmaps(&self, spec: &NbdSpec) -> Result<Vec<ExportBitmap>, RegistryError> {
        let invalid = |reason: String| RegistryError::Invalid { field: "bitmaps", reason };
        if spec.bitmaps.is_empty() {
            return Ok(Vec::new());
        }
        let size = self.disk(&spec.bdev_name)?.info().size_bytes();
        let mut held: Vec<ExportBitmap> = Vec::with_capacity(spec.bitmaps.len());
        let holder = format!("NBD export {}", spec.nbd_device);
        for r in &spec.bitmaps {
            let owner = r.bdev.as_deref().unwrap_or(&spec.bdev_name);
            let disk = self.disk(owner).map_err(|_| invalid(format!("no bdev '{owner}'")))?;
            let b = disk.dirty_bitmap(&r.name).map_err(|e| invalid(e.to_string()))?;
            if b.len() != size {
                return Err(invalid(format!(
                    "dirty bitmap '{}' of bdev '{owner}' covers {} bytes, bdev '{}' has {size}",
                    r.name,
                    b.len(),
                    spec.bdev_name
                )));
            }
            if held.iter().any(|h| h.name == r.name) {
                return Err(invalid(format!("'{}' is given twice (its context is named after it)", r.name)));
            }
            held.push(ExportBitmap { name: r.name.clone(), bitmap: BitmapUse::new(b, &holder) });
        }
        Ok(held)
    }

    /// The `nbd_device` for an `nbd_start_disk` that names none. SPDK picks the first free
    /// `/dev/nbdN`; flashpath serves the protocol itself, so it picks the first socket
    /// `<vhost_dir>/nbdN` that no export uses and no file occupies.
    pub fn free_nbd_device(&self) -> Result<String, RegistryError> {
        let st = self.lock();
        let max = self.options.limits.max_exports;
        for n in 0..max {
            let path = self.vhost_dir.join(format!("nbd{n}"));
            let Some(device) = path.to_str() else {
                return Err(RegistryError::Invalid {
                    field: "nbd_device",
                    reason: format!("{} is not UTF-8: give nbd_device", self.vhost_dir.display()),
                });
            };
            if !st.exports.contains_key(device) && std::fs::symlink_metadata(&path).is_err() {
                return Ok(device.to_string());
            }
        }
        Err(RegistryError::LimitReached {
            kind: LABEL,
            name: "nbd_device".into(),
            limit: max,
            setting: "limits.max_exports",
        })
    }

    /// Stops an NBD export: it leaves its listener, its clients are disconnected once their
    /// requests are answered, then the bdev is released. When requests the disk took are
    /// still unanswered after the stop bound (`[nbd] stop_timeout_ms`), the export stays (no longer reachable,
    /// its bdev still claimed) and the error says how many connections wait; calling again
    /// waits for them again.
    pub fn stop_nbd(&self, nbd_device: &str) -> Result<(), RegistryError> {
        let (handle, bdev) =
            self.with_export(nbd_device, LABEL, |e: &NbdExport| (e.handle.clone(), e.bdev_name.clone()))?;
        let bound = self.nbd_server().stop_timeout();
        if let Err(n) = handle.close(bound) {
            return Err(RegistryError::NotNow(format!(
                "nbd export '{nbd_device}' is closed to new clients, but {n} connection(s) still \
                 wait for requests bdev '{}' has not completed after {}.{:03} s; the bdev stays claimed \
                 until they finish (stop the export again to wait for them)",
                bdev,
                bound.as_secs(),
                bound.subsec_millis()
            )));
        }
        self.delete_export(nbd_device, Some((KIND, LABEL)))
    }

    /// All NBD exports, or the one named (`nbd_get_disks`).
    pub fn nbd_disks(&self, nbd_device: Option<&str>) -> Result<Vec<NbdDiskInfo>, RegistryError> {
        match nbd_device {
            Some(n) => Ok(vec![self.with_export(n, LABEL, |e: &NbdExport| e.info())?]),
            None => Ok(self.map_exports(|e: &NbdExport| e.info())),
        }
    }
}

/// The NBD export kind ([`super::EXPORT_KINDS`]).
pub struct NbdKind;

/// Its options: the server's bounds (flashpath's own; SPDK has none).
const OPTIONS: &[KindOption] = &[
    KindOption {
        table: "nbd",
        key: "stop_timeout_ms",
        flag: Some("nbd-stop-timeout-ms"),
        value: OptionType::Millis {
            default: fp_nbd::STOP_TIMEOUT.as_millis() as u64,
            min: 1,
            max: super::vhost_blk::MAX_STOP_TIMEOUT_MS,
        },
        help: "How long nbd_stop_disk (and shutdown, per export) waits for the export's connections \
               before answering EBUSY, 1 to 600000 (replaces nbd.stop_timeout_ms)",
    },
    KindOption {
        table: "nbd",
        key: "close_timeout_ms",
        flag: Some("nbd-close-timeout-ms"),
        value: OptionType::Millis {
            default: fp_nbd::CLOSE_TIMEOUT.as_millis() as u64,
            min: 1,
            max: super::vhost_blk::MAX_STOP_TIMEOUT_MS,
        },
        help: "How long a closing NBD connection retries requests its disk refuses as busy before \
               answering them EIO, 1 to 600000 (replaces nbd.close_timeout_ms)",
    },
];

impl ExportKind for NbdKind {
    fn name(&self) -> &'static str {
        KIND
    }

    /// The server: its listeners, shared by the exports on one address, with the daemon's
    /// bounds.
    fn init(&self, init: &KindInit<'_>) -> Option<Arc<dyn Any + Send + Sync>> {
        let server = NbdServer::new();
        server.set_stop_timeout(init.options.millis("stop_timeout_ms"));
        server.set_close_timeout(init.options.millis("close_timeout_ms"));
        Some(Arc::new(server))
    }

    fn options(&self) -> &'static [KindOption] {
        OPTIONS
    }

    fn methods(&self) -> &'static [(&'static str, MethodFn)] {
        rpc::METHODS
    }

    fn config_tables(&self) -> &'static [ConfigTable] {
        const TABLES: &[ConfigTable] = &[ConfigTable::array("nbd_disk", "nbd_start_disk")];
        TABLES
    }

    /// From `nbd_get_disks`: what each export's clients asked, and how many are connected.
    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family> {
        let Some(disks) = call("nbd_get_disks", None) else { return Vec::new() };
        let mut requests =
            Family::counter("flashpath_nbd_requests_total", "Requests an NBD export answered, by command");
        let mut bytes =
            Family::counter("flashpath_nbd_bytes_total", "Bytes an NBD export moved, by direction");
        let mut errors =
            Family::counter("flashpath_nbd_errors_total", "Requests an NBD export answered with an error");
        let mut connections =
            Family::gauge("flashpath_nbd_connections", "Clients connected to an NBD export now");
        for d in array(&disks) {
            let base = vec![("nbd_device", str_at(d, "nbd_device")), ("bdev", str_at(d, "bdev_name"))];
            let with = |k: &'static str, v: &str| {
                let mut l = base.clone();
                l.push((k, v.to_string()));
                l
            };
            let st = &d["stats"];
            for (command, key) in [
                ("read", "read_ops"),
                ("write", "write_ops"),
                ("flush", "flush_ops"),
                ("trim", "trim_ops"),
                ("write_zeroes", "write_zeroes_ops"),
                ("cache", "cache_ops"),
                ("block_status", "block_status_ops"),
            ] {
                requests.push(with("command", command), u64_at(st, key));
            }
            bytes.push(with("direction", "read"), u64_at(st, "bytes_read"));
            bytes.push(with("direction", "write"), u64_at(st, "bytes_written"));
            errors.push(base.clone(), u64_at(st, "errors"));
            connections.push(base, u64_at(d, "connections"));
        }
        vec![requests, bytes, errors, connections]
    }
}
