//! `restore create|delete|status`: live restores, disks that serve a backup at once while it
//! is copied onto a local disk (`bdev_backup_restore_*`, docs/backup.md "Live restore").

use std::path::Path;

use crate::size::{self, format_size};
use clap::Subcommand;
use serde_json::{json, Value};

use super::session::{cell, one_call, out, print_json, set_given, table, u64_field, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum RestoreCommand {
    /// Make NAME, a disk serving backup BACKUP_ID of DISK from STORE at once, while the backup
    /// is copied onto BASE (a local disk at least as large, not in use)
    Create {
        name: String,
        base: String,
        store: String,
        disk: String,
        backup_id: String,
        /// The keyring key an encrypted backup was made with
        #[arg(long)]
        key: Option<String>,
        /// The copier's limit in bytes per second, e.g. 100MiB [default: none]
        #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
        speed: Option<u64>,
        /// Chunks the copier fetches at once [default: 4]
        #[arg(long)]
        parallel: Option<u64>,
        /// Chunks fetched after one a request needs [default: 4]
        #[arg(long)]
        read_ahead: Option<u64>,
    },
    /// Delete a restore disk (refused while it is in use); a complete one leaves BASE an
    /// ordinary disk with the backup and every write made since
    Delete { name: String },
    /// Restores: base, backup, chunks restored, state (or one restore)
    Status { name: Option<String> },
}

/// The restore methods' parameters and the arguments that set them.
const RESTORE_FLAGS: &[(&str, &str)] = &[
    ("name", "NAME"),
    ("base_bdev", "BASE"),
    ("store", "STORE"),
    ("bdev", "DISK"),
    ("backup_id", "BACKUP_ID"),
    ("key", "--key"),
    ("speed", "--speed"),
    ("parallel", "--parallel"),
    ("read_ahead", "--read-ahead"),
];

/// `restore create|delete|status`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: RestoreCommand) -> Result<(), CliError> {
    match cmd {
        RestoreCommand::Create { name, base, store, disk, backup_id, key, speed, parallel, read_ahead } => {
            let mut params = json!({ "name": name, "base_bdev": base, "store": store, "bdev": disk, "backup_id": backup_id });
            set_given(&mut params, "key", key);
            set_given(&mut params, "speed", speed);
            set_given(&mut params, "parallel", parallel);
            set_given(&mut params, "read_ahead", read_ahead);
            one_call(rpc, json, RESTORE_FLAGS, "bdev_backup_restore_create", params)
        }
        RestoreCommand::Delete { name } => {
            one_call(rpc, json, RESTORE_FLAGS, "bdev_backup_restore_delete", json!({ "name": name }))
        }
        RestoreCommand::Status { name } => status(rpc, json, name),
    }
}

fn status(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let params = name.map(|n| json!({ "name": n }));
    let list = Session::connect(rpc, RESTORE_FLAGS)?.call("bdev_get_bdevs", params)?;
    let Some(bdevs) = list.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_get_bdevs", result: list });
    };
    let restores: Vec<&Value> =
        bdevs.iter().filter(|b| b["driver_specific"].get("backup_restore").is_some()).collect();
    if json {
        print_json(&Value::from(restores.into_iter().cloned().collect::<Vec<_>>()));
        return Ok(());
    }
    let rows = restores
        .iter()
        .map(|b| {
            let r = &b["driver_specific"]["backup_restore"];
            vec![
                cell(b, "name"),
                cell(r, "base_bdev"),
                cell(r, "store"),
                format!("{}/{}", r["bdev"].as_str().unwrap_or(""), r["backup_id"].as_str().unwrap_or("")),
                format!("{}/{}", u64_field(r, "restored"), u64_field(r, "chunks")),
                format_size(u64_field(b, "num_blocks") * u64_field(b, "block_size")),
                cell(r, "state"),
                r["error"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect::<Vec<_>>();
    out(&table(&["NAME", "BASE", "STORE", "BACKUP", "CHUNKS", "SIZE", "STATE", "ERROR"], &rows));
    Ok(())
}
