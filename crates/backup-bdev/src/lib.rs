//! The backup bdev module ("backup"): what the daemon does with fp-backup's stores.
//!
//! * The store table ([`stores`]): named backup stores (`backup_store_add/remove/list`,
//!   `[[backup_store]]`), which the backup jobs (fp-registry) and this module's methods open
//!   by name; [`backup_key`] turns a keyring key into a backup key.
//! * The catalogue methods: `backup_list`, `backup_get`, `backup_verify`, `backup_delete`,
//!   `backup_gc`.
//!
//! See docs/backup.md, "Stores and the catalogue".

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod catalogue;
mod error;
mod rpc;
mod stores;

pub use error::backup_error;
pub use rpc::BackupModule;
pub use stores::{backup_key, stores, StoreEntry, Stores};
