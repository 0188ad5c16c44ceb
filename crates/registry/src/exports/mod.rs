//! Exports: what serves a bdev to the outside (a vhost-user-blk controller, an NBD export, an
//! NVMe-oF namespace).
//!
//! An export claims its bdev for as long as it lives, with the claim type it needs (a writable
//! export excludes every other claim, read-only ones share the bdev). Each kind is a folder
//! here: `mod.rs` has its [`Export`], its creation on top of
//! [`Registry::add_export`](crate::Registry::add_export) and its [`ExportKind`]; `rpc.rs` has
//! its JSON-RPC methods and `spec.rs` what their parameters become, below both.
//! [`EXPORT_KINDS`] lists the kinds, one line each, and the daemon finds everything else there:
//! methods, configuration tables, metrics. What the kinds share sits below them: the contract
//! (`kind.rs`), a running export (`export.rs`), adding and deleting one (`running.rs`).
//! docs/architecture.md, "Adding an export", walks through one.

mod export;
mod kind;
pub mod nbd;
pub mod nvmf;
pub mod options;
mod running;
pub mod ublk;
pub mod vhost_blk;

pub use export::Export;
pub use kind::{ConfigTable, ExportKind, KindInit};
pub use running::NewExport;

pub use options::{KindOption, KindOptions, OptionError, OptionType, OptionValue, OptionValues};

/// Every export kind, in the order the configuration file applies their tables.
pub static EXPORT_KINDS: &[&dyn ExportKind] =
    &[&vhost_blk::VhostBlkKind, &nbd::NbdKind, &nvmf::NvmfKind, &ublk::UblkKind];

/// Every kind's configuration tables, in the order the configuration file applies them.
pub fn config_tables() -> impl Iterator<Item = ConfigTable> {
    EXPORT_KINDS.iter().flat_map(|k| k.config_tables().iter().copied())
}

/// Every kind's options, in the order of [`EXPORT_KINDS`].
pub fn all_options() -> impl Iterator<Item = &'static KindOption> {
    EXPORT_KINDS.iter().flat_map(|k| k.options().iter())
}

/// The export kind called `name`.
pub fn find_kind(name: &str) -> Option<&'static dyn ExportKind> {
    EXPORT_KINDS.iter().copied().find(|k| k.name() == name)
}
