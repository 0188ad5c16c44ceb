//! The backup module: the store table's methods and configuration table.

use std::any::Any;

use fp_backup::StoreConfig;
use fp_bdev::module::{BdevModule, ConfigTable, ModuleError, ModuleHost, ModuleMethodFn};
use fp_bdev::BdevInfo;
use fp_rpc::Params;
use serde_json::{json, Map, Value};

use crate::catalogue;
use crate::restore_rpc::{self, MODULE};
use crate::stores::stores;

/// The backup module: named backup stores, the catalogue, live restores.
pub struct BackupModule;

/// `[[backup_store]]` holds S3 credentials: the file must be owner-only.
/// `[[backup_restore]]` builds on a base bdev the file declares: after the bdevs.
const CONFIG_TABLES: &[ConfigTable] = &[
    ConfigTable::array("backup_store", "backup_store_add").secret(),
    ConfigTable::array("backup_restore", "bdev_backup_restore_create").after_bdevs(),
];

impl BdevModule for BackupModule {
    fn name(&self) -> &'static str {
        MODULE
    }

    /// Each `[[backup_store]]` (`backup_store_add`), before the bdevs; each
    /// `[[backup_restore]]` (`bdev_backup_restore_create`) after them.
    fn config_tables(&self) -> &'static [ConfigTable] {
        CONFIG_TABLES
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("backup_store_add", store_add),
            ("backup_store_remove", store_remove),
            ("backup_store_list", store_list),
            ("backup_list", catalogue::list),
            ("backup_get", catalogue::get),
            ("backup_verify", catalogue::verify),
            ("backup_delete", catalogue::delete),
            ("backup_gc", catalogue::gc),
            ("bdev_backup_restore_create", restore_rpc::create),
            ("bdev_backup_restore_delete", restore_rpc::delete),
        ]
    }

    /// Its bdevs are made by their own methods and tables, not by a `[[bdev]]` table.
    fn configurable(&self) -> bool {
        false
    }

    /// A live restore's store, backup, progress and state.
    fn driver_specific(&self, info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let _ = info;
        restore_rpc::driver_specific(device)
    }
}

/// `backup_store_add {name, url, endpoint?, region?, access_key_id?, secret_access_key?,
/// allow_http?, path_style?}`: opens the store, asks it one bounded question, keeps it.
fn store_add(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let url = p.required_str("url")?;
    let endpoint = p.optional_str("endpoint")?.unwrap_or_default();
    let region = p.optional_str("region")?.unwrap_or_default();
    let access_key = p.optional_str("access_key_id")?.unwrap_or_default();
    let secret_key = p.optional_str("secret_access_key")?.unwrap_or_default();
    let allow_http = p.optional_bool("allow_http")?.unwrap_or(false);
    let path_style = p.optional_bool("path_style")?.unwrap_or(false);
    p.finish()?;
    let config = StoreConfig { url, endpoint, region, access_key, secret_key, allow_http, path_style };
    stores(host).add(&name, &config)?;
    log::info!("backup store '{name}' added: {}", config.describe());
    Ok(Value::Bool(true))
}

/// `backup_store_remove {name}`.
fn store_remove(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    stores(host).remove(&name)?;
    log::info!("backup store '{name}' removed");
    Ok(Value::Bool(true))
}

/// `backup_store_list` -> `[{name, url, endpoint}]`; never a credential.
fn store_list(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    p.finish()?;
    let list: Vec<Value> = stores(host)
        .list()
        .into_iter()
        .map(|(name, e)| json!({"name": name, "url": e.url, "endpoint": e.endpoint}))
        .collect();
    Ok(Value::Array(list))
}
