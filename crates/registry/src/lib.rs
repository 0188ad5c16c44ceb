//! The registry: the control plane's record of block devices, their claims and exports, and
//! the JSON-RPC methods that act on them.
//!
//! Everything here runs on control-plane threads (RPC, config loading, metrics scrapes) and is
//! serialised by one mutex; the data path never touches it. Bdevs are made by the bdev modules
//! listed in [`modules`], whose methods act through the registry's [`fp_bdev::ModuleHost`]
//! (`host.rs`); exports are made by the export kinds listed in [`exports::EXPORT_KINDS`], each a
//! folder in `exports/`. [`Registry::call`] answers every method by name (`methods/`), so the
//! daemon's RPC server, configuration file and metrics endpoint only need the registry.
//! docs/architecture.md, "Adding a bdev module" and "Adding an export", shows how both grow.

#![forbid(unsafe_code)]

mod backup;
mod bdevs;
mod bitmaps;
mod disks;
mod error;
mod examine;
mod export_dirs;
pub mod exports;
mod fleece;
mod host;
mod limits;
pub mod methods;
pub mod metrics;
mod mirror;
pub mod modules;
mod qos;
mod registry;
mod shutdown;
mod state;

pub use backup::{store_disk_name, BackupSpec, BackupState, BackupStatus, BACKUP_WAIT};
pub use bdevs::BdevSummary;
pub use error::RegistryError;
pub use export_dirs::{ExportDirError, ExportDirs};
pub use exports::nbd::{NbdDiskInfo, NbdSpec};
pub use exports::vhost_blk::VhostBlkSpec;
pub use exports::{Export, ExportKind, EXPORT_KINDS};
pub use fleece::{FleeceSpec, FLEECE_ATTACH_WAIT};
/// The QoS group limits' parameter names, for clients that print them (the CLI).
pub use fp_bdev::qos::THROTTLE_FIELDS;
pub use limits::{total_ram, Limits, DEFAULT_MAX_BDEVS, DEFAULT_MAX_EXPORTS};
pub use methods::MethodError;
pub use mirror::{MirrorSpec, MIRROR_WAIT};
pub use qos::{QosGroupSummary, QosMember};
pub use registry::{ReactorSummary, DEFAULT_STOP_BOUND};
pub use state::{Claim, Registry, RegistryOptions, DEFAULT_SOCKET_MODE};

#[cfg(test)]
mod bitmap_tests;
#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests;
