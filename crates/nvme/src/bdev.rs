//! Namespaces as block devices: [`NvmeNamespace`] (bdev `<controller>n<nsid>`, driver
//! "nvme") and its channel, one I/O queue pair per channel. docs/nvme.md, "Namespaces".
//!
//! * `namespace`: the device;
//! * `channel`: the channel (splitting, batching, resubmission across resets, timeouts);
//! * [`multipath`]: several controllers of one subsystem as one namespace's paths (policy,
//!   failover under the Command Quiesce Time rule, failback);
//! * `status`: NVMe status to errno.

mod channel;
pub mod multipath;
mod namespace;
pub mod paths;
mod status;

pub use namespace::{NvmeNamespace, PathInfo};
pub(crate) use paths::NamespaceBackend;
