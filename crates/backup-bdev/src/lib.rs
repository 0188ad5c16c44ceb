//! The backup bdev module ("backup"): what the daemon does with fp-backup's stores.
//!
//! * The store table ([`stores`]): named backup stores (`backup_store_add/remove/list`,
//!   `[[backup_store]]`), which the backup jobs (fp-registry) and this module's methods open
//!   by name; [`backup_key`] turns a keyring key into a backup key.
//! * The catalogue methods: `backup_list`, `backup_get`, `backup_verify`, `backup_delete`,
//!   `backup_gc`.
//! * The live-restore bdev ([`restore`]): `bdev_backup_restore_create/delete`,
//!   `[[backup_restore]]`; a bdev that serves a backup at once while it is copied onto a local
//!   base, and survives a restart.
//!
//! See docs/backup.md, "Stores and the catalogue" and "Live restore".

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod catalogue;
mod error;
pub mod restore;
mod restore_rpc;
mod rpc;
mod stores;

pub use error::backup_error;
pub use rpc::BackupModule;
pub use stores::{backup_key, stores, StoreEntry, Stores};
