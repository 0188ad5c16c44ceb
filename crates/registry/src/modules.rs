//! The bdev modules this daemon has, one line each. A module in another crate (Ceph RBD, say)
//! is added here too, and its crate to this one's dependencies; see docs/architecture.md,
//! "Adding a bdev module".

use fp_backup_bdev::BackupModule;
use fp_bdev::fleece::FleeceModule;
use fp_bdev::modules::{
    delay::DelayModule, error::ErrorModule, malloc::MallocModule, null::NullModule, uring::UringModule,
};
use fp_bdev::BdevModule;
use fp_crypto::CryptoModule;
use fp_lvol::bdev::LvolModule;
use fp_nbd::client::NbdClientModule;
use fp_nvme::rpc::NvmeModule;
use fp_raid::RaidModule;
use fp_rbd::RbdModule;

/// Every module, in the order `rpc_get_methods` and configuration errors list them, the
/// configuration file applies their tables ([`fp_bdev::BdevModule::config_tables`]) and the
/// daemon's shutdown stops them.
pub static MODULES: &[&dyn BdevModule] = &[
    &NullModule,
    &MallocModule,
    &UringModule,
    &DelayModule,
    &ErrorModule,
    &CryptoModule,
    &BackupModule,
    &LvolModule,
    // Before the remote bases' modules: at shutdown a raid writes its clean superblocks
    // while its bases (NVMe/TCP, Ceph, NBD) are still connected; and the configuration file
    // sets `[raid_options]` before a controller's namespaces appear (and examine may assemble
    // a raid from them).
    &RaidModule,
    &NvmeModule,
    &RbdModule,
    &NbdClientModule,
    // Its methods are the registry's (they wait for the base's channels); the module reports
    // each fleece's `driver_specific`.
    &FleeceModule,
];

/// The module named `name` ("null", "malloc", ...).
pub fn find(name: &str) -> Option<&'static dyn BdevModule> {
    MODULES.iter().copied().find(|m| m.name() == name)
}

/// Every module's configuration tables, in the order the configuration file applies them (the
/// module list's).
pub fn config_tables() -> impl Iterator<Item = fp_bdev::ConfigTable> {
    MODULES.iter().flat_map(|m| m.config_tables().iter().copied())
}
