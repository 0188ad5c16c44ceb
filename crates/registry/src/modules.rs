//! The bdev modules this daemon has, one line each. A module in another crate (Ceph RBD, say)
//! is added here too, and its crate to this one's dependencies; see docs/architecture.md,
//! "Adding a bdev module".

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

/// Every module, in the order `rpc_get_methods` and configuration errors list them.
pub static MODULES: &[&dyn BdevModule] = &[
    &NullModule,
    &MallocModule,
    &UringModule,
    &DelayModule,
    &ErrorModule,
    &CryptoModule,
    &LvolModule,
    // Before the remote bases' modules: at shutdown a raid writes its clean superblocks
    // while its bases (Ceph, NBD, NVMe/TCP) are still connected.
    &RaidModule,
    &RbdModule,
    &NbdClientModule,
    &NvmeModule,
];

/// The module named `name` ("null", "malloc", ...).
pub fn find(name: &str) -> Option<&'static dyn BdevModule> {
    MODULES.iter().copied().find(|m| m.name() == name)
}
