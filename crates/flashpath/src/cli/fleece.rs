//! `fleece create|delete|status`: point-in-time views of a live disk for backups
//! (`bdev_fleece_*`, docs/backup.md).

use std::path::Path;

use crate::size::{self, format_size};
use clap::Subcommand;
use serde_json::{json, Value};

use super::session::{cell, one_call, out, print_json, set_given, table, u64_field, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum FleeceCommand {
    /// Make NAME, a read-only disk showing BASE as it is now; BASE's old data is copied to
    /// TARGET (at least as large, not in use) before each first change
    Create {
        name: String,
        base: String,
        target: String,
        /// Bytes copied at a time, a power of two, e.g. 64KiB [default: 64KiB]
        #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
        granularity: Option<u64>,
    },
    /// End a view: BASE's writes stop copying, TARGET is free again
    Delete { name: String },
    /// Views: base, target, chunks copied, broken (or one view)
    Status { name: Option<String> },
}

/// The fleece methods' parameters and the arguments that set them.
const FLEECE_FLAGS: &[(&str, &str)] =
    &[("name", "NAME"), ("base_bdev", "BASE"), ("target_bdev", "TARGET"), ("granularity", "--granularity")];

/// `fleece create|delete|status`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: FleeceCommand) -> Result<(), CliError> {
    match cmd {
        FleeceCommand::Create { name, base, target, granularity } => {
            let mut params = json!({ "name": name, "base_bdev": base, "target_bdev": target });
            set_given(&mut params, "granularity", granularity);
            one_call(rpc, json, FLEECE_FLAGS, "bdev_fleece_create", params)
        }
        FleeceCommand::Delete { name } => {
            one_call(rpc, json, FLEECE_FLAGS, "bdev_fleece_delete", json!({ "name": name }))
        }
        FleeceCommand::Status { name } => status(rpc, json, name),
    }
}

fn status(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let params = name.map(|n| json!({ "name": n }));
    let list = Session::connect(rpc, FLEECE_FLAGS)?.call("bdev_get_bdevs", params)?;
    let Some(bdevs) = list.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_get_bdevs", result: list });
    };
    let views: Vec<&Value> = bdevs.iter().filter(|b| b["driver_specific"].get("fleece").is_some()).collect();
    if json {
        print_json(&Value::from(views.into_iter().cloned().collect::<Vec<_>>()));
        return Ok(());
    }
    let rows = views
        .iter()
        .map(|b| {
            let f = &b["driver_specific"]["fleece"];
            let copied = u64_field(f, "copied_chunks") * u64_field(f, "granularity");
            vec![
                cell(b, "name"),
                cell(f, "base_bdev"),
                cell(f, "target_bdev"),
                format_size(u64_field(f, "granularity")),
                format_size(copied),
                if f["broken"] == true { "yes".into() } else { "no".into() },
                f["error"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect::<Vec<_>>();
    out(&table(&["NAME", "BASE", "TARGET", "CHUNK", "COPIED", "BROKEN", "ERROR"], &rows));
    Ok(())
}
